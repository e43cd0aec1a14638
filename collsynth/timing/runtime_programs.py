"""The runtime's own algorithms as what the program model simulates: one table.

:data:`RUNTIME_PROGRAMS` maps each algorithm (NCCL's names: ``ring``, ``tree``, ``nvls``,
``nvls_tree``, ``pat``, ``collnet_direct``, ``collnet_chain``; ``p2p`` for the collectives it
runs as grouped send/recv) to its builder,
``build(collective, topology, channels, protocol)``, which returns an MSCCL
:class:`~collsynth.export.program.Program` the checker proves (ring, tree, PAT:
:mod:`collsynth.timing.runtime_baselines`) or a timing graph through a switch vertex (NVLS,
NVLS-tree, and CollNet and NVLS across nodes with SHARP: :mod:`collsynth.timing.switch_graphs`).
Which of them a runtime considers on a machine is the tuning model's rule
(:func:`collsynth.timing.pricing.runtime_algorithms`); which protocol and how many channels at a
size is the caller's. docs/runtime-model.md.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Callable, Mapping, Sequence, Union

from collsynth.collective.kinds import canonical_name
from collsynth.export.program import Program
from collsynth.runtimes.protocols import PROTOCOLS, STEP_BYTES
from collsynth.timing.runtime_baselines import (P2P_COLLECTIVES, PAT_COLLECTIVES,
                                                RING_COLLECTIVES, TREE_COLLECTIVES,
                                                TREE_PIPELINE, p2p_program, pat_program,
                                                ring_program, ring_program_steps,
                                                runtime_rings, runtime_tree, tree_program,
                                                tree_program_min_steps)
from collsynth.timing.p2p_tuning import P2P_CHUNK_BYTES
from collsynth.timing.ring_fold import FOLDED_RING_COLLECTIVES, folded_ring
from collsynth.timing.runtime_model import (PreparedProgram, check_simulated_steps,
                                           prepare_program)
from collsynth.timing.switch_graphs import (NVLS_COLLECTIVES, NVLS_TREE_COLLECTIVES,
                                            SHARP_COLLECTIVES, nvls_graph, nvls_tree_graph,
                                            sharp_graph)
from collsynth.timing.tuning_model import pat_chunk_bytes

if TYPE_CHECKING:  # pragma: no cover - imported for annotations only
    from collsynth.topology.model import Topology

__all__ = ["RuntimeProgram", "RUNTIME_PROGRAMS", "Built", "runtime_program", "prepare_ring",
           "prepared_ring"]

#: What a builder returns: a program (to prepare on the topology) or a prepared timing graph.
Built = Union[Program, PreparedProgram]


@dataclass(frozen=True)
class RuntimeProgram:
    """How the program model writes one of the runtime's own algorithms.

    ``collectives`` it is written for; ``protocols`` the runtime runs it with (NVLS, NVLS-tree
    and PAT: Simple only, ``ncclTopoTuneModel``); ``build(collective, topology, channels,
    protocol)``; ``channels(topology)`` its channel count when none is given (``None``: the
    builder's own default); ``checkable``: it is an MSCCL program the checker proves;
    ``pipelined``: ``build`` also takes ``pipeline=``, the chunks per channel
    (:func:`~collsynth.timing.runtime_baselines.tree_pipeline`), which depend on the size;
    ``spread``: ``build`` also takes ``spread=``, the channels grouped send/recv shares
    (:func:`~collsynth.timing.p2p_tuning.p2p_channel_count`).
    """

    algorithm: str
    collectives: tuple[str, ...]
    protocols: tuple[str, ...]
    build: Callable[..., Built]
    channels: Callable[["Topology"], "int | None"]
    checkable: bool
    pipelined: bool = False
    spread: bool = False


def _ring(collective: str, topology: "Topology", channels: int | None, protocol: str) -> Built:
    # refused before the rings are searched (their search grows with the ranks squared), at
    # one ring: whatever the search finds has at least as many steps (a node's share of them
    # where the ring folds by node: _built_ring)
    n = topology.num_ranks
    layout = topology.layout
    nodes = layout.nodes if layout is not None else 1
    folds = nodes > 1 and canonical_name(collective) in FOLDED_RING_COLLECTIVES
    check_simulated_steps(ring_program_steps(collective, n, 1) // (nodes if folds else 1),
                          f"the {collective} ring of {n} ranks on 1 channel or more"
                          + (", folded by node" if folds else ""))
    return _built_ring(collective, runtime_rings(topology, channels), topology, protocol)


def _built_ring(collective: str, rings: Sequence[Sequence[int]], topology: "Topology",
                protocol: str) -> Built:
    """The ring folded by node where its nodes allow it (prepared), else the whole
    :func:`~collsynth.timing.runtime_baselines.ring_program`: a program the checker proves,
    prepared only where the runtime moves one step per slice (broadcast, reduce)."""
    folded = folded_ring(collective, rings, topology, protocol=protocol)
    if folded is not None:
        return folded
    program = ring_program(collective, rings, protocol=protocol)
    return prepare_ring(program, topology) if _one_step_slices(program) else program


def prepared_ring(collective: str, rings: Sequence[Sequence[int]], topology: "Topology",
                  protocol: str = "Simple") -> PreparedProgram:
    """The runtime's ring of ``collective`` over ``rings`` (one per channel) on ``topology``,
    prepared as the runtime pipelines it: folded by node where its nodes allow it
    (:func:`~collsynth.timing.ring_fold.folded_ring`: the same times, a node's share of the
    transfers), else the whole ring (:func:`prepare_ring`). The one way the program model and
    the ring fit prepare a ring."""
    built = _built_ring(collective, rings, topology, protocol)
    return built if isinstance(built, PreparedProgram) else prepare_ring(built, topology)


#: NCCL's default Simple step, ``NCCL_BUFFSIZE / NCCL_STEPS`` = 512 KiB of data.
_SIMPLE_STEP_BYTES = STEP_BYTES["Simple"]


def _one_step_slices(program: Program) -> bool:
    # NCCL's broadcast and reduce chains move one step (a FIFO slot) per slice in Simple
    # (BROADCAST_SLICESTEPS and REDUCE_SLICESTEPS are 1), the other rings two.
    return program.proto == "Simple" and program.coll in ("broadcast", "reduce")


def prepare_ring(program: Program, topology: "Topology") -> PreparedProgram:
    """A :func:`~collsynth.timing.runtime_baselines.ring_program` prepared on ``topology`` as
    the runtime pipelines it: broadcast and reduce in Simple with slices of one step (NCCL's
    default step, ``NCCL_BUFFSIZE / NCCL_STEPS`` = 512 KiB of data), the others with the
    constants' slices (whole: :func:`prepared_ring` folds it where it can)."""
    if _one_step_slices(program):
        return _one_slice_per_call(program, topology, _SIMPLE_STEP_BYTES)
    return prepare_program(program, topology)


def _tree(collective: str, topology: "Topology", channels: int | None, protocol: str, *,
          pipeline: int = TREE_PIPELINE) -> Built:
    # as for the ring, at one chain (two channels): more never take fewer steps (checked for
    # 2..199 ranks, 2..64 channels, pipelines of 1..8)
    n = topology.num_ranks
    check_simulated_steps(tree_program_min_steps(n, 2, pipeline),
                          f"the allreduce tree of {n} ranks on 2 channels or more")
    nodes, chains = runtime_tree(topology, channels)
    program = tree_program(nodes, chains, protocol=protocol, pipeline=pipeline)
    return _one_slice_per_call(program, topology, _SIMPLE_STEP_BYTES)


def _pat(collective: str, topology: "Topology", channels: int | None, protocol: str) -> Built:
    program = pat_program(collective, topology.num_ranks, channels or 1, protocol=protocol)
    # PAT's chunk (its one slice) shrinks with the call's size
    return _one_slice_per_call(program, topology,
                               lambda size: pat_chunk_bytes(size, program.nchannels, collective))


def _one_slice_per_call(program: Program, topology: "Topology",
                        step_bytes: "float | Callable[[float], float]") -> Built:
    """``program`` prepared with slices of one step (``step_bytes`` of data, or a function of
    the call's size giving them) in Simple: NCCL runs its tree, PAT, send/recv, broadcast and
    reduce with one slice per call of at most one step, where its other rings cut a call in two
    (``prims_simple.h``); other protocols unchanged."""
    if program.proto != "Simple":
        return program
    return dataclasses.replace(prepare_program(program, topology), slice_bytes=step_bytes)


def _p2p(collective: str, topology: "Topology", channels: int | None, protocol: str, *,
         spread: int | None = None) -> Built:
    # ``channels`` is the parts each peer's operation is split over; ``spread`` the runtime's
    # p2p channels they and the rounds share (without one: as many as they need)
    n, parts = topology.num_ranks, channels or 1
    needed = 1 << max(0, (n * parts - 1).bit_length())
    program = p2p_program(collective, n, parts, channels=min(needed, spread or needed),
                          protocol=protocol)
    # a p2p connection's step is its chunk: NCCL_P2P_NET_CHUNKSIZE across nodes
    multi_node = topology.layout is not None and topology.layout.multi_node
    return _one_slice_per_call(program, topology, P2P_CHUNK_BYTES["net" if multi_node else "nvl"])


def _nvls(collective: str, topology: "Topology", channels: int | None, protocol: str) -> Built:
    layout = topology.layout
    if layout is not None and layout.multi_node:  # across nodes: NVLS with SHARP
        return sharp_graph("nvls", collective, topology, channels or 1, protocol)
    return nvls_graph(collective, topology, channels or 1, protocol)


def _collnet(algorithm: str) -> Callable[[str, "Topology", "int | None", str], Built]:
    def build(collective: str, topology: "Topology", channels: int | None, protocol: str
              ) -> Built:
        return sharp_graph(algorithm, collective, topology, channels or 1, protocol)
    return build


def _nvls_tree(collective: str, topology: "Topology", channels: int | None, protocol: str
               ) -> Built:
    return nvls_tree_graph(collective, topology, channels or 1, protocol)


def _found_rings(topology: "Topology") -> int | None:
    """As many channels as the runtime's rings (its communicator's channels), at least 1."""
    from collsynth.timing.rings import ring_channels

    return max(1, len(ring_channels(topology)))


def _runtime_channels(algorithm: str) -> Callable[["Topology"], "int | None"]:
    """NCCL's own channels for ``algorithm`` on the machine
    (:func:`collsynth.timing.tuning_model.kind_channels`: NVLS 16 on Hopper, 24 or 32 on
    Blackwell; CollNet the communicator's); ``None`` without a tuning (the builder's default)."""
    def channels(topology: "Topology") -> int | None:
        from collsynth.timing.tuning_model import SETUP_FAILURES, kind_channels, tuning_setup

        try:
            return kind_channels(tuning_setup(topology, runtime="nccl"), algorithm) or None
        except SETUP_FAILURES:
            return None
    return channels


#: Every algorithm the program model writes, by NCCL's name for it.
RUNTIME_PROGRAMS: Mapping[str, RuntimeProgram] = MappingProxyType({
    "ring": RuntimeProgram("ring", RING_COLLECTIVES, PROTOCOLS, _ring, lambda t: None, True),
    "tree": RuntimeProgram("tree", TREE_COLLECTIVES, PROTOCOLS, _tree, lambda t: None, True,
                           pipelined=True),
    "nvls": RuntimeProgram("nvls", NVLS_COLLECTIVES, ("Simple",), _nvls,
                           _runtime_channels("nvls"), False),
    "nvls_tree": RuntimeProgram("nvls_tree", NVLS_TREE_COLLECTIVES, ("Simple",), _nvls_tree,
                                _runtime_channels("nvls_tree"), False),
    "pat": RuntimeProgram("pat", PAT_COLLECTIVES, ("Simple",), _pat, _found_rings, True),
    # grouped send/recv: ``channels`` is the parts per peer (p2p_tuning.p2p_shape)
    "p2p": RuntimeProgram("p2p", P2P_COLLECTIVES, ("LL", "Simple"), _p2p, lambda t: None, True,
                          spread=True),
    "collnet_direct": RuntimeProgram("collnet_direct", SHARP_COLLECTIVES, ("Simple",),
                                     _collnet("collnet_direct"),
                                     _runtime_channels("collnet_direct"), False),
    "collnet_chain": RuntimeProgram("collnet_chain", SHARP_COLLECTIVES, ("Simple",),
                                    _collnet("collnet_chain"),
                                    _runtime_channels("collnet_chain"), False),
})


def runtime_program(algorithm: str, collective: str, topology: "Topology",
                    channels: int | None = None, protocol: str = "Simple") -> Built:
    """:data:`RUNTIME_PROGRAMS`'s ``algorithm`` built for ``collective`` on ``topology`` with
    ``channels`` (``None``: the entry's default) and ``protocol``.

    Raises
    ------
    UnknownNameError
        An algorithm the table does not have, or a collective it is not written for.
    CollsynthError
        What the builder raises (no ring, no NVLink SHARP, ...).

    >>> from collsynth.topology import get_topology
    >>> runtime_program("nvls", "allgather", get_topology("dgx-h100")).program.nchannels
    16
    """
    from collsynth.collective.kinds import canonical_name
    from collsynth.errors import UnknownNameError

    entry = RUNTIME_PROGRAMS.get(algorithm)
    if entry is None:
        raise UnknownNameError(f"no program of the runtime's {algorithm!r}; there is one of "
                               f"{', '.join(RUNTIME_PROGRAMS)}")
    key = canonical_name(collective)
    if key not in entry.collectives:
        raise UnknownNameError(f"the runtime's {algorithm} is written for "
                               f"{', '.join(entry.collectives)}, not {collective!r}")
    if channels is None:
        channels = entry.channels(topology)
    return entry.build(key, topology, channels, protocol)
