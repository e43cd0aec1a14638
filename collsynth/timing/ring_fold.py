"""The runtime's ring on identical nodes, folded: node 0's transfers stand for every node's.

NCCL's rings on a machine of ``k`` identical nodes repeat from node to node (ring position
``p + m`` holds rank ``ring[p] + m``, ``m`` ranks a node), and the ring's allgather,
reduce-scatter and allreduce run the same steps at every position, so position ``p``'s
transfers and position ``p + m``'s run at the same times wherever renumbering ``r -> r + m``
maps the machine's resources onto resources of the same capacity. The timing graph then holds
positions ``0 .. m - 1`` only; position 0 receives from position ``m - 1``, which stands for the
last position of the last node (:func:`collsynth.timing.symmetry.folded_members` weights the
resources). docs/runtime-model.md, "Folded graphs".
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import numpy as np

from collsynth.collective.kinds import canonical_name
from collsynth.export.program import Program
from collsynth.timing.paths import Fabric
from collsynth.timing.runtime_baselines import ring_step_types
from collsynth.timing.runtime_model import (FORWARD, REDUCING_STEPS, SEND, STEP_KIND,
                                           PreparedProgram, check_simulated_steps,
                                           program_buffer_chunks, program_busbw_factor)
from collsynth.timing.symmetry import Spec, folded_members, rotate_nodes

if TYPE_CHECKING:  # pragma: no cover - imported for annotations only
    from collsynth.topology.model import Topology

__all__ = ["FOLDED_RING_COLLECTIVES", "folded_ring", "node_periodic"]

#: The ring collectives whose every rank runs the same steps (broadcast and reduce start at a
#: root, which no renumbering of the nodes keeps).
FOLDED_RING_COLLECTIVES = ("allgather", "reduce_scatter", "allreduce")


def node_periodic(ring: Sequence[int], per_node: int) -> bool:
    """Whether ``ring[(p + per_node) mod n] = (ring[p] + per_node) mod n`` at every position:
    the ring goes through the nodes in turn, in the same order inside each.

    >>> node_periodic((0, 2, 1, 3, 5, 4), 3), node_periodic((0, 1, 2, 3, 5, 4), 3)
    (True, False)
    """
    n = len(ring)
    return n % per_node == 0 and all(
        ring[(p + per_node) % n] == (ring[p] + per_node) % n for p in range(n))


def folded_ring(collective: str, rings: Sequence[Sequence[int]], topology: "Topology", *,
                protocol: str = "Simple", name: str | None = None) -> PreparedProgram | None:
    """The timing graph of :func:`~collsynth.timing.runtime_baselines.ring_program`'s
    ``collective`` over ``rings`` (one per channel) on ``topology``, folded by its nodes: the
    transfers of ring positions ``0 .. m - 1`` of every channel (``m`` ranks a node), each
    standing for its images on the other nodes.

    Under leaf switches (``fabric="leaf-spine"``) moving every node one on is not a symmetry
    (a leaf's nodes would land under two leaves); moving them a leaf on is, and the graph then
    holds the first leaf's positions.

    ``None`` where the fold does not hold: one node, a collective with a root, a ring that
    does not repeat from node to node (:func:`node_periodic`), a send with no direct link, or
    no renumbering of the nodes that is a symmetry of the resources the ring crosses. The
    caller then prepares the whole ring.

    Raises
    ------
    InputTooLargeError
        More folded steps than the program model simulates.
    """
    key = canonical_name(collective)
    layout = topology.layout
    if key not in FOLDED_RING_COLLECTIVES or layout is None or not layout.multi_node or \
            not rings:
        return None
    m, nodes, n = layout.ranks_per_node, layout.nodes, topology.num_ranks
    rings = [tuple(int(r) for r in ring) for ring in rings]
    if any(len(ring) != n or sorted(ring) != list(range(n)) or not node_periodic(ring, m)
           for ring in rings):
        return None
    # the nodes moved at once: one, else a leaf switch's nodes (under leaves the shift by one
    # node is not a symmetry, the shift by a leaf is)
    for period in sorted({1, layout.nodes_per_leaf or 1}):
        if period < nodes and nodes % period == 0:
            folded = _folded(key, rings, topology, period * m, nodes // period,
                             protocol=protocol, name=name,
                             by="node" if period == 1 else f"leaf ({period} nodes)")
            if folded is not None:
                return folded
    return None


def _folded(key: str, rings: Sequence[tuple[int, ...]], topology: "Topology", m: int,
            copies: int, *, protocol: str, name: str | None, by: str
            ) -> PreparedProgram | None:
    """:func:`folded_ring` of ``copies`` blocks of ``m`` consecutive ranks (one node, or a
    leaf's nodes), positions ``0 .. m - 1`` standing for the others."""
    n = topology.num_ranks
    types = ring_step_types(key, n)
    channels, steps = len(rings), len(types)
    check_simulated_steps(m * channels * steps,
                          f"the {key} ring of {n} ranks on {channels} channel(s), folded by {by}")
    fabric = Fabric(topology)
    # transfer index of (step, channel, position): steps outermost, a topological order
    def index(step: int, channel: int, position: int) -> int:
        return (step * channels + channel) * m + position

    total = steps * channels * m
    kind = [0] * total
    prev = [-1] * total
    match = [-1] * total
    link_class = np.full(total, -1, dtype=np.int8)
    work = np.zeros(total)
    specs: list[list[Spec]] = [[] for _ in range(total)]
    for step, op in enumerate(types):
        for c, ring in enumerate(rings):
            for p in range(m):
                i = index(step, c, p)
                kind[i] = STEP_KIND[op]
                if step:
                    prev[i] = index(step - 1, c, p)
                    if op != "cpy":   # position p - 1 of block 0 stands for the last position
                        match[i] = index(step - 1, c, (p - 1) % m)
                if op in REDUCING_STEPS or op == "cpy":
                    work[i] = 1.0
                if kind[i] in (SEND, FORWARD):
                    route = fabric.route(ring[p], ring[(p + 1) % n])
                    if route.via is not None:
                        return None
                    link_class[i] = route.link_class
                    specs[i].append(("route", ring[p], ring[(p + 1) % n]))

    def resolve(spec: Spec) -> tuple[int, ...]:
        return tuple(fabric.route(spec[1], spec[2]).resources)

    found = folded_members(specs, [1] * total, resolve, fabric.capacity_gbps, m, copies,
                           rotate=lambda spec, i: rotate_nodes(spec, i, m, copies))
    if found is None:
        return None
    members, weights = found
    program = Program(name=name or f"ring-{key}", proto=protocol, nchannels=channels,
                      nchunksperloop=n * channels, ngpus=n, coll=key, inplace=0, gpus=(),
                      outofplace=1, min_bytes=0)
    kinds = np.array(kind)
    return PreparedProgram(
        program=program, topology=topology, kind=kind, cnt=[1] * total, prev=prev,
        deps=[()] * total, match=match, sends=(kinds == SEND) | (kinds == FORWARD),
        link_class=link_class, work=work, members=members,
        capacity_gbps=np.array(fabric.capacity_gbps, dtype=float),
        resource_names=fabric.names, buffer_chunks=program_buffer_chunks(program),
        busbw_factor=program_busbw_factor(key, n), weights=weights)
