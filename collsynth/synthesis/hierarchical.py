"""Hierarchical algorithms on multi-node topologies: one node algorithm, copied, plus NIC sends.

A baseline for the multi-node synthesis engines: whatever they return must match or beat it.

How each collective is put together from a node algorithm and NIC sends, and how it is
pipelined: ``docs/large-systems.md``, section "The hierarchical baseline
(collsynth.synthesis.hierarchical)".
"""

from __future__ import annotations

import logging
import math
import time
from collections import defaultdict
from dataclasses import dataclass
from fractions import Fraction
from typing import Mapping, Sequence

import numpy as np

from collsynth.algorithm.model import Algorithm, Send, Step
from collsynth.algorithm.transform import refine
from collsynth.algorithm.verify import verify
from collsynth.collective.model import MAX_CHUNKS, Collective
from collsynth.collective.standard import (
    allgather,
    allreduce,
    alltoall,
    broadcast,
    reduce,
    reduce_scatter,
)
from collsynth.errors import (
    InputTooLargeError,
    InvalidCollectiveError,
    InvalidInstanceError,
    InvalidTopologyError,
    SolverError,
    UnknownNameError,
    VerificationError,
)
from collsynth.collective.kinds import canonical_name
from collsynth.limits import Deadline, ResourceLimitError, TimeLimitReached, check_memory
from collsynth.synthesis.result import ScheduleResult
from collsynth.topology.capacity import link_capacity
from collsynth.topology.model import BandwidthGroup, Topology

__all__ = [
    "HIERARCHICAL_COLLECTIVES",
    "NetworkLayout",
    "network_layout",
    "hierarchical_algorithm",
]

_log = logging.getLogger(__name__)

#: The collectives :func:`hierarchical_algorithm` builds.
HIERARCHICAL_COLLECTIVES = ("allgather", "reduce_scatter", "allreduce", "broadcast", "reduce",
                            "alltoall")
#: Default seconds for synthesising one node algorithm.
DEFAULT_NODE_TIME_S = 30.0
#: Most pieces per base chunk the alltoall search tries (beyond the node algorithm's own).
_MAX_ALLTOALL_REFINE = 4
#: Seconds of building and verifying the final algorithm, per chunk, per (chunk, rank) pair of
#: its pre- and postconditions, and per send, measured on a 2-core machine: alltoall on 512
#: ranks (262144 chunks and sends) took 9.1 s, allgather on 768 ranks (3840 chunks of 768
#: ranks, 2.9M sends) 3.1 s. A deadline that cannot cover the estimate stops the call before.
_SECONDS_PER_CHUNK = 30e-6
_SECONDS_PER_CONDITION_RANK = 0.6e-6
_SECONDS_PER_SEND = 0.5e-6
#: Seconds of reading the bandwidth groups per (source, destination) pair they name: about
#: 90 ns measured (DGX A100 x 1024: 32768 groups, 134M pairs, 11 s, most of it in one sparse
#: matrix build that no deadline can stop). A deadline that cannot cover it stops the call.
_SECONDS_PER_GROUP_PAIR = 100e-9
#: Bytes per send of a pipeline while it is planned, priced and built: 100 to 140 measured
#: (DGX A100 x 128 allgather: 5.2M sends, 517 MB). The first candidate that cannot fit is
#: refused (DGX A100 x 1024: 335M sends, an out-of-memory kill at 24 GB before); a later one
#: stops the search with the best so far.
_BYTES_PER_PLANNED_SEND = 128

#: One step's sends as arrays: chunk, src, dst (int64), reduce (bool).
_Arrays = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


# -- the network layout --------------------------------------------------------------------------


@dataclass(frozen=True)
class NetworkLayout:
    """How a composed topology is laid out: ``nodes`` copies of ``node``.

    Attributes
    ----------
    nodes:
        Number of nodes ``K``.
    ranks_per_node:
        Ranks per node ``n``; rank ``k * n + l`` is local rank ``l`` of node ``k``.
    node:
        Node 0 as it appears in the composed topology: its links and the bandwidth groups
        within it, in the composed topology's units.
    """

    nodes: int
    ranks_per_node: int
    node: Topology

    @property
    def num_ranks(self) -> int:
        return self.nodes * self.ranks_per_node


def network_layout(topology: Topology) -> NetworkLayout:
    """The node layout of a topology built by :func:`~collsynth.topology.compose_nodes`.

    Raises
    ------
    InvalidTopologyError
        When the topology has no ``metadata["network"]`` (it was not composed from nodes), when
        that record does not match the topology, or when the nodes' links differ (a hierarchical
        algorithm copies one node algorithm to every node).

    Examples
    --------
    >>> from collsynth.topology import compose_nodes, get_topology
    >>> layout = network_layout(compose_nodes(get_topology("ring:4"), 2, nic_units=1))
    >>> layout.nodes, layout.ranks_per_node, layout.node.bandwidth(0, 1), layout.node.num_ranks
    (2, 4, 1, 4)
    >>> network_layout(get_topology("ring:4"))
    Traceback (most recent call last):
    ...
    collsynth.errors.InvalidTopologyError: topology 'ring:4' is not a multi-node topology: ...
    """
    layout = topology.layout
    if layout is None:
        raise InvalidTopologyError(
            f"topology {topology.name!r} is not a multi-node topology: it has no "
            "metadata['network']; build one with compose_nodes(node, K) or "
            "resolve_topology(spec, nodes=K)")
    nodes, n = layout.nodes, layout.ranks_per_node
    links = topology.link_array
    first = links[:n, :n]
    for k in range(1, nodes):
        block = links[k * n:(k + 1) * n, k * n:(k + 1) * n]
        if not np.array_equal(block, first):
            raise InvalidTopologyError(
                f"topology {topology.name!r}: the links inside node {k} differ from node 0's; a "
                "hierarchical algorithm copies one node algorithm to every node")
    inside = range(n)
    groups = tuple(BandwidthGroup(g.sources, g.destinations, g.limit, g.name)
                   for g in topology.groups
                   if all(r in inside for r in g.sources)
                   and all(r in inside for r in g.destinations))
    node = Topology(
        name=f"{topology.name}/node",
        links=tuple(tuple(int(x) for x in row) for row in first),
        groups=groups,
        unit_gbps=topology.unit_gbps,
        alpha_us=topology.alpha_us,
        description=f"one node of {topology.name}",
    )
    return NetworkLayout(nodes=nodes, ranks_per_node=n, node=node)


# -- pricing steps exactly -----------------------------------------------------------------------


class Capacity:
    """A topology's link bandwidths and binding bandwidth groups as arrays, to price a step: the
    fewest whole rounds in which its sends fit (:class:`~collsynth.topology.capacity.LinkCapacity`,
    the rule :func:`~collsynth.algorithm.verify` checks), with ``links`` as an ``n x n`` matrix."""

    def __init__(self, topology: Topology, deadline: "Deadline | None" = None) -> None:
        self.topology = topology
        self.num_ranks = topology.num_ranks
        if deadline is not None:
            pairs = sum(len(g.sources) * len(g.destinations) for g in topology.groups)
            needed = pairs * _SECONDS_PER_GROUP_PAIR
            if needed >= 1.0 and needed > deadline.remaining():   # below a second: not worth it
                raise TimeLimitReached(
                    f"time limit of {deadline.seconds:g} s: reading the bandwidth groups of "
                    f"{topology.name} ({pairs} link pairs) takes about {needed:.0f} s, "
                    f"{max(deadline.remaining(), 0):.1f} s are left; nothing found (raise "
                    "--time-limit)")
        self._shared = link_capacity(
            topology, check=lambda: check_time(deadline, "reading the bandwidth groups"))
        self.links = self._shared.links.reshape(self.num_ranks, self.num_ranks)
        self.groups = self._shared.groups
        self.limits = self._shared.limits

    def demand(self, src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(loads, capacities)``: sends per used link and per binding group, with the link
        bandwidth or group limit each is divided by. Raises on a send over a missing link."""
        try:
            return self._shared.demand(src, dst)
        except InvalidInstanceError as exc:
            raise VerificationError(f"internal error: a hierarchical schedule on "
                                    f"{self.topology.name}: {exc}") from exc

    def rounds(self, src: np.ndarray, dst: np.ndarray) -> int:
        """The fewest whole rounds (at least 1) in which sends ``src[i] -> dst[i]`` fit."""
        if len(src) == 0:
            return 1
        loads, caps = self.demand(src, dst)
        return max(1, int((-(-loads // caps)).max()))


def scaled_rounds(loads: np.ndarray, caps: np.ndarray, pieces: int) -> int:
    """Rounds for ``pieces`` times the demand ``loads`` (0 when there is none)."""
    if pieces == 0 or len(loads) == 0:
        return 0
    return int((-(-(loads * pieces) // caps)).max())


# -- schedules as arrays -------------------------------------------------------------------------


class _Plan:
    """Sends collected per step as arrays, before they are priced and turned into steps."""

    def __init__(self) -> None:
        self._parts: dict[int, list[_Arrays]] = defaultdict(list)

    def add(self, step: int, chunk, src, dst, reduce_: bool | np.ndarray) -> None:
        chunk = np.asarray(chunk, dtype=np.int64)
        shape = np.broadcast_shapes(chunk.shape, np.shape(src), np.shape(dst))
        chunk = np.broadcast_to(chunk, shape).ravel()
        src = np.broadcast_to(np.asarray(src, dtype=np.int64), shape).ravel()
        dst = np.broadcast_to(np.asarray(dst, dtype=np.int64), shape).ravel()
        flags = np.broadcast_to(np.asarray(reduce_, dtype=bool), shape).ravel()
        if chunk.size:
            if step < 0:
                raise VerificationError(f"internal error: a hierarchical schedule uses step {step}")
            self._parts[step].append((chunk, src, dst, flags))

    def extend(self, other: "_Plan", offset: int) -> None:
        for step, parts in other._parts.items():
            self._parts[step + offset].extend(parts)

    @property
    def num_steps(self) -> int:
        return max(self._parts, default=-1) + 1

    def at(self, step: int) -> _Arrays | None:
        """The sends of one step as one set of arrays, or ``None`` when it has none."""
        parts = self._parts.get(step)
        if not parts:
            return None
        return tuple(np.concatenate([p[i] for p in parts]) for i in range(4))

    def steps(self) -> list[_Arrays]:
        """The non-empty steps in order, each as one set of arrays."""
        return [self.at(step) for step in sorted(self._parts)]

    def price(self, capacity: Capacity, budget: "_Budget | None" = None
              ) -> tuple[list[_Arrays], list[int]]:
        """The steps and their rounds, ``budget`` checked between steps (a step of 8192 ranks
        takes a second)."""
        steps, rounds = [], []
        for step in sorted(self._parts):
            if budget is not None:
                budget.check()
            arrays = self.at(step)
            steps.append(arrays)
            rounds.append(capacity.rounds(arrays[1], arrays[2]))
        return steps, rounds


class _Stop(Exception):
    """The deadline passed while a later candidate was built or priced: keep the best."""


class _Budget:
    """The deadline of one choice among candidate pipelines: past it, building or pricing the
    first candidate raises :class:`~collsynth.limits.TimeLimitReached` (nothing was priced),
    a later one stops the choice (:class:`_Stop`) and the best priced so far is kept.
    ``have_best``: the caller already holds a priced pipeline."""

    def __init__(self, deadline: Deadline | None, have_best: bool = False) -> None:
        self.deadline, self.have_best = deadline, have_best

    def expired(self) -> bool:
        return self.deadline is not None and self.deadline.expired()

    def check(self) -> None:
        if self.expired():
            if self.have_best:
                raise _Stop
            check_time(self.deadline, "pricing the first pipeline")

    def fits(self, sends: int, what: str) -> None:
        """Refuse (or, with a best, stop at) a pipeline of ``sends`` sends that cannot fit in
        memory (:func:`~collsynth.limits.check_memory`)."""
        try:
            check_memory(sends * _BYTES_PER_PLANNED_SEND, what)
        except ResourceLimitError:
            if self.have_best:
                raise _Stop from None
            raise


def _make_sends(chunk: np.ndarray, src: np.ndarray, dst: np.ndarray,
                reduce_: np.ndarray) -> Sequence[Send]:
    """One step's sends from arrays: a :class:`~collsynth.algorithm.arrays.SendBlock` when that
    module is available, else a tuple of :class:`Send` (sorted by chunk, source, destination
    either way, so the result does not depend on how the plan was assembled)."""
    order = np.lexsort((dst, src, chunk))
    chunk, src, dst, reduce_ = chunk[order], src[order], dst[order], reduce_[order]
    try:
        from collsynth.algorithm.arrays import SendBlock
    except ImportError:  # pragma: no cover - the array representation is not installed
        return tuple(map(Send, chunk.tolist(), src.tolist(), dst.tolist(), reduce_.tolist()))
    return SendBlock(chunk, src, dst, reduce_)


def _send_arrays(sends: Sequence[Send]) -> _Arrays:
    """The arrays of one step's sends, whatever their representation."""
    try:
        from collsynth.algorithm.arrays import sends_as_arrays
    except ImportError:  # pragma: no cover - the array representation is not installed
        count = len(sends)
        return (np.fromiter((s.chunk for s in sends), dtype=np.int64, count=count),
                np.fromiter((s.src for s in sends), dtype=np.int64, count=count),
                np.fromiter((s.dst for s in sends), dtype=np.int64, count=count),
                np.fromiter((bool(s.reduce) for s in sends), dtype=bool, count=count))
    chunk, src, dst, flags = sends_as_arrays(sends)
    return (chunk.astype(np.int64), src.astype(np.int64), dst.astype(np.int64),
            np.asarray(flags, dtype=bool))


def check_time(deadline: Deadline | None, doing: str) -> None:
    """Raise :class:`~collsynth.limits.TimeLimitReached` when ``deadline`` has passed."""
    if deadline is not None and deadline.expired():
        raise TimeLimitReached(f"time limit of {deadline.seconds:g} s reached while {doing}; "
                               "nothing found (raise --time-limit)")


def check_build_fits(deadline: Deadline | None, *, chunks: int, ranks_per_chunk: int,
                      sends: int, what: str) -> None:
    """Refuse to build and verify an algorithm of ``chunks`` chunks (each chunk's conditions
    naming about ``ranks_per_chunk`` ranks) and ``sends`` sends when the time left before
    ``deadline`` cannot cover it (estimated with :data:`_SECONDS_PER_CHUNK` and the others).

    Raises
    ------
    ResourceLimitError
        With the estimate and the time left.
    """
    if deadline is None:
        return
    needed = (chunks * (_SECONDS_PER_CHUNK + ranks_per_chunk * _SECONDS_PER_CONDITION_RANK)
              + sends * _SECONDS_PER_SEND)
    left = deadline.remaining()
    if needed > left:
        raise ResourceLimitError(
            f"{what}: building and verifying {chunks} chunks and {sends} sends takes about "
            f"{needed:.3g} s; the time limit of {deadline.seconds:g} s leaves "
            f"{max(left, 0.0):.3g} s")


def node_time_limit(time_limit: float, deadline: Deadline | None, doing: str) -> float:
    """Seconds for a node synthesis: ``time_limit``, or less when the deadline is nearer."""
    check_time(deadline, doing)
    return time_limit if deadline is None else min(time_limit, deadline.remaining())


def build_schedule(name: str, topology: Topology, collective: Collective, steps: list[_Arrays],
           rounds: list[int], provenance: Mapping[str, object]) -> Algorithm:
    """The verified algorithm made of priced steps."""
    algorithm = Algorithm(
        name=name, topology=topology, collective=collective,
        steps=tuple(Step(r, _make_sends(*arrays)) for arrays, r in zip(steps, rounds)),
        provenance=dict(provenance))
    return verify(algorithm)


# -- node algorithms -----------------------------------------------------------------------------


def _node_steps(algorithm: Algorithm) -> list[_Arrays]:
    return [_send_arrays(step.sends) for step in algorithm.steps]


def solve_node(node: Topology, collective: Collective, time_limit: float) -> Algorithm:
    """The bandwidth-best point of the node's Pareto front (fewest rounds per chunk, then
    fewest steps)."""
    if node.num_ranks == 1:  # nothing moves inside a one-rank node
        return verify(Algorithm(f"{collective.name}-{node.name}-empty", node, collective, ()))
    from collsynth.synthesis.result import SolveOptions
    from collsynth.synthesis.strategies import pareto_front

    options = SolveOptions(time_limit=time_limit)
    front = [r for r in pareto_front(node, collective, options=options) if r.found]
    if not front:
        raise SolverError(
            f"no {collective.describe()} algorithm was found for one node ({node.name}) within "
            f"{time_limit} s; raise time_limit or pass node_algorithm")
    best = min(front, key=lambda r: (r.rounds_per_chunk, r.instance.steps))
    _log.info("node %s: %s at %s", node.name, collective.describe(), best.instance.label())
    return best.algorithm


def check_node_algorithm(given: Algorithm, node: Topology, expected: Collective,
                          family: str) -> Algorithm:
    """``given`` re-verified on ``node``, each step re-priced to the fewest rounds its sends need
    there (so an algorithm for the node in its own units works on a rescaled copy)."""
    if not isinstance(given, Algorithm):
        raise InvalidCollectiveError(f"node_algorithm must be an Algorithm, got "
                                     f"{type(given).__name__}")
    coll = given.collective
    base = expected.split(coll.chunk_factor)
    if (coll.num_ranks != node.num_ranks or coll.combining != base.combining
            or coll.precondition != base.precondition
            or coll.postcondition != base.postcondition):
        raise InvalidCollectiveError(
            f"node_algorithm {given.name!r} implements {coll.describe()}, but a hierarchical "
            f"{family} needs {expected.describe()} on the {node.num_ranks} ranks of one node")
    capacity = Capacity(node)
    steps = []
    for step in given.steps:
        chunk, src, dst, _ = _send_arrays(step.sends)
        if len(src) and ((src < 0) | (src >= node.num_ranks) | (dst < 0)
                         | (dst >= node.num_ranks)).any():
            raise VerificationError(f"node_algorithm {given.name!r} names a rank outside the "
                                    f"{node.num_ranks} ranks of one node")
        if len(src) and (capacity.links[src, dst] == 0).any():
            raise VerificationError(f"node_algorithm {given.name!r} sends over a link that one "
                                    f"node of the topology ({node.name}) does not have")
        steps.append(Step(capacity.rounds(src, dst), step.sends))
    return verify(Algorithm(given.name, node, base, tuple(steps),
                            provenance={**dict(given.provenance), "repriced_on": node.name}))


# -- the constructions ---------------------------------------------------------------------------


def _replicate(plan: _Plan, start: int, node_steps: list[_Arrays], nodes, bases, n: int,
               local_map: np.ndarray | None = None, budget: "_Budget | None" = None) -> None:
    """Copies of a node algorithm: copy ``i`` runs on node ``nodes[i]``, its local chunk ``c``
    standing for global chunk ``bases[i] + local_map[c]``; its step ``t`` goes in plan step
    ``start + t``."""
    nodes = np.asarray(nodes, dtype=np.int64)
    bases = np.asarray(bases, dtype=np.int64)
    if nodes.size == 0:
        return
    offset = (nodes * n)[:, None]
    for t, (chunk, src, dst, flags) in enumerate(node_steps):
        if budget is not None:
            budget.check()
        local = chunk if local_map is None else local_map[chunk]
        plan.add(start + t, bases[:, None] + local[None, :], offset + src[None, :],
                 offset + dst[None, :], flags[None, :])


def _batch_choices(items: int, requested: int | None) -> list[int]:
    """Pipeline depths to try: 1, 2, 4, ... and ``items`` (or just ``requested``)."""
    if items == 0:
        return [1]
    if requested is not None:
        return [max(1, min(requested, items))]
    choices = {items}
    b = 1
    while b < items:
        choices.add(b)
        b *= 2
    return sorted(choices)


def _parts_choices(nodes: int, num_ranks: int, pieces: int, requested: int | None) -> list[int]:
    """How many parts each rank's data may be cut into for pipelining (see
    :func:`_gather_layout`): 1, 2, 4, 8 while there are at most 64 (node, part) items and the
    chunk count stays within :data:`MAX_CHUNKS`; just ``requested`` when given."""
    if requested is not None:
        return [requested]
    if nodes == 1:
        return [1]
    return [p for p in (1, 2, 4, 8)
            if p == 1 or ((nodes - 1) * p <= max(64, nodes - 1)
                          and num_ranks * pieces * p <= MAX_CHUNKS)]


@dataclass(frozen=True)
class _GatherLayout:
    """When each piece of an allgather crosses the network and is spread inside the nodes.

    Each rank's data is cut into ``parts`` parts; the items ``(part q, node offset o)`` for
    ``o = 1 .. K-1`` (rank ``k * n + l`` sends part ``q`` to rank ``((k + o) % K) * n + l``) are
    split, in order, into ``batches`` contiguous batches. Batch ``b`` crosses the network in step
    ``b``; the node allgathers of what it delivered run from step ``b + 1``. A node spreads its
    own part ``q`` from the step of the first batch holding part ``q``.
    """

    #: (step, part, offsets) of the network sends
    inter: tuple[tuple[int, int, np.ndarray], ...]
    #: (first step, part) of each node's copy of its own data
    own: tuple[tuple[int, int], ...]
    #: steps taken, not counting the node algorithm's tail
    batches: int


def _gather_layout(nodes: int, parts: int, batches: int) -> _GatherLayout:
    items = [(q, o) for q in range(parts) for o in range(1, nodes)]
    if not items:
        return _GatherLayout((), tuple((0, q) for q in range(parts)), 0)
    inter, first = [], {}
    groups = [g for g in np.array_split(np.arange(len(items)), min(batches, len(items))) if g.size]
    for b, group in enumerate(groups):
        for q in sorted({items[i][0] for i in group}):
            offsets = np.array([items[i][1] for i in group if items[i][0] == q], dtype=np.int64)
            inter.append((b, q, offsets))
            first.setdefault(q, b)
    return _GatherLayout(tuple(inter), tuple((first[q], q) for q in range(parts)), len(groups))


def _gather_local_map(n: int, pieces: int, parts: int) -> np.ndarray:
    """Local piece ``l * pieces + j`` -> offset ``l * pieces * parts + j`` of global rank data."""
    p = np.arange(n * pieces, dtype=np.int64)
    return (p // pieces) * pieces * parts + p % pieces


def _allgather_plan(nodes: int, n: int, pieces: int, node_steps: list[_Arrays],
                    layout: _GatherLayout, parts: int, budget: _Budget | None = None) -> _Plan:
    """Direct NIC allgather among same-local ranks, pipelined with the node allgathers.

    Global chunk ``g`` is split ``pieces * parts`` ways: part ``q`` is pieces
    ``g * pieces * parts + q * pieces + j``; the node algorithm's local chunk ``l`` stands for
    rank ``k' * n + l``'s part ``q`` in the copy that spreads node ``k'``'s part ``q``."""
    plan = _Plan()
    stride = pieces * parts
    ranks = np.arange(nodes * n, dtype=np.int64)
    home, local = ranks // n, ranks % n
    j = np.arange(pieces, dtype=np.int64)
    local_map = _gather_local_map(n, pieces, parts)
    everyone = np.arange(nodes, dtype=np.int64)
    for start, q in layout.own:
        if budget is not None:
            budget.check()
        _replicate(plan, start, node_steps, everyone, everyone * n * stride + q * pieces, n,
                   local_map, budget)
    for b, q, offsets in layout.inter:
        if budget is not None:
            budget.check()
        dst = ((home[:, None] + offsets[None, :]) % nodes) * n + local[:, None]
        plan.add(b, (ranks * stride + q * pieces)[:, None, None] + j, ranks[:, None, None],
                 dst[:, :, None], False)
        receivers = np.repeat(everyone, len(offsets))
        sources = (receivers - np.tile(offsets, nodes)) % nodes
        _replicate(plan, b + 1, node_steps, receivers, sources * n * stride + q * pieces, n,
                   local_map, budget)
    return plan


def _reduce_scatter_plan(nodes: int, n: int, pieces: int, node_steps: list[_Arrays],
                         layout: _GatherLayout, parts: int, budget: _Budget | None = None) -> _Plan:
    """The time-reversal of :func:`_allgather_plan` (step ``s`` becomes ``T - 1 - s``): node
    reduce-scatters of the partial sums meant for each node, then reduces over the NICs into the
    rank that owns them."""
    plan = _Plan()
    m = len(node_steps)
    total = layout.batches + m
    stride = pieces * parts
    ranks = np.arange(nodes * n, dtype=np.int64)
    home, local = ranks // n, ranks % n
    j = np.arange(pieces, dtype=np.int64)
    local_map = _gather_local_map(n, pieces, parts)
    everyone = np.arange(nodes, dtype=np.int64)
    for start, q in layout.own:
        if budget is not None:
            budget.check()
        _replicate(plan, total - start - m, node_steps, everyone,
                   everyone * n * stride + q * pieces, n, local_map, budget)
    for b, q, offsets in layout.inter:
        if budget is not None:
            budget.check()
        step = total - 1 - b
        dst = ((home[:, None] + offsets[None, :]) % nodes) * n + local[:, None]
        plan.add(step, (dst * stride + q * pieces)[:, :, None] + j, ranks[:, None, None],
                 dst[:, :, None], True)
        owners = np.repeat(everyone, len(offsets))
        targets = (owners + np.tile(offsets, nodes)) % nodes
        _replicate(plan, step - m, node_steps, owners, targets * n * stride + q * pieces, n,
                   local_map, budget)
    return plan


def _gather_candidates(make, nodes: int, n: int, pieces: int, node_steps: list[_Arrays],
                       parts: int, batches: int | None, budget: _Budget | None = None):
    """``(label, chunks, plan)`` for every pipeline depth tried at ``parts`` parts."""
    for b in _batch_choices((nodes - 1) * parts, batches):
        if budget is not None:   # every piece of every chunk goes to every other rank once
            total = nodes * n
            budget.fits(total * pieces * parts * (total - 1),
                        f"a hierarchical pipeline of {total} ranks ({pieces * parts} pieces per "
                        "chunk)")
        layout = _gather_layout(nodes, parts, b)
        yield (layout.batches, parts), pieces * parts, make(nodes, n, pieces, node_steps, layout,
                                                             parts, budget)


def _broadcast_plan(nodes: int, n: int, pieces: int, node_steps: list[_Arrays], root: int,
                    batches: int) -> _Plan:
    """The root's NIC sends to its same-local rank on every node, pipelined over ``batches``
    parts of the buffer with the node broadcasts."""
    plan = _Plan()
    home, local = divmod(root, n)
    others = np.array([k for k in range(nodes) if k != home], dtype=np.int64)
    j = np.arange(pieces, dtype=np.int64)
    for b in range(batches):
        plan.add(b, (b * pieces + j)[None, :], root, (others * n + local)[:, None], False)
        _replicate(plan, b, node_steps, [home], [b * pieces], n)
        _replicate(plan, b + 1, node_steps, others, np.full(len(others), b * pieces), n)
    return plan


def _reduce_plan(nodes: int, n: int, pieces: int, node_steps: list[_Arrays], root: int,
                 batches: int) -> _Plan:
    """The time-reversal of :func:`_broadcast_plan`: node reduces to the root's local index,
    then reduces over the NICs into the root."""
    plan = _Plan()
    m = len(node_steps)
    home, local = divmod(root, n)
    others = np.array([k for k in range(nodes) if k != home], dtype=np.int64)
    total = batches + m if len(others) else batches + m - 1
    j = np.arange(pieces, dtype=np.int64)
    for b in range(batches):
        step = total - 1 - b
        plan.add(step, (b * pieces + j)[None, :], (others * n + local)[:, None], root, True)
        _replicate(plan, total - b - m, node_steps, [home], [b * pieces], n)
        _replicate(plan, step - m, node_steps, others, np.full(len(others), b * pieces), n)
    return plan


def _alltoall_node_map(n: int, total: int, pieces: int) -> np.ndarray:
    """Local alltoall piece ``(ls * n + ld) * pieces + j`` -> ``(ls * N + ld) * pieces + j``."""
    p = np.arange(n * n * pieces, dtype=np.int64)
    ls, ld, j = p // (n * pieces), (p // pieces) % n, p % pieces
    return (ls * total + ld) * pieces + j


def _inter_pairs(nodes: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Every (src, dst) with src and dst on different nodes."""
    total = nodes * n
    src = np.repeat(np.arange(total, dtype=np.int64), total)
    dst = np.tile(np.arange(total, dtype=np.int64), total)
    keep = (src // n) != (dst // n)
    return src[keep], dst[keep]


def _alltoall_plan(capacity: Capacity, nodes: int, n: int, pieces: int,
                   node_steps: list[_Arrays]) -> _Plan:
    """The node alltoall in every node, with the ``pieces`` pieces of every block between nodes
    sent direct and spread over its steps: each step first takes what fits in the rounds the
    node alltoall needs anyway, and what is left goes where it costs the fewest extra rounds."""
    total = nodes * n
    plan = _Plan()
    local_map = _alltoall_node_map(n, total, pieces)
    # on node k, local piece p stands for global piece k * stride + local_map[p]
    stride = n * total * pieces + n * pieces
    intra = _Plan()
    _replicate(intra, 0, node_steps, np.arange(nodes), np.arange(nodes) * stride, n, local_map)
    plan.extend(intra, 0)
    if nodes == 1:
        return plan
    src, dst = _inter_pairs(nodes, n)
    loads, caps = capacity.demand(src, dst)
    slots = max(1, len(node_steps))
    budget = []
    for t in range(slots):
        arrays = intra.at(t)
        budget.append(0 if arrays is None else capacity.rounds(arrays[1], arrays[2]))
    share = [0] * slots
    left = pieces
    for t in range(slots):  # what fits for free
        while left and scaled_rounds(loads, caps, share[t] + 1) <= budget[t]:
            share[t] += 1
            left -= 1
    while left:  # one piece at a time where it costs least
        cost = [max(budget[t], scaled_rounds(loads, caps, share[t] + 1))
                - max(budget[t], scaled_rounds(loads, caps, share[t])) for t in range(slots)]
        t = int(np.argmin(cost))
        share[t] += 1
        left -= 1
    first = 0
    base = (src * total + dst) * pieces
    for t, count in enumerate(share):
        if count:
            j = np.arange(first, first + count, dtype=np.int64)
            plan.add(t, base[:, None] + j[None, :], src[:, None], dst[:, None], False)
            first += count
    return plan


# -- the entry point -----------------------------------------------------------------------------


def _family(name: str) -> str:
    key = canonical_name(str(name))
    if key not in HIERARCHICAL_COLLECTIVES:
        raise UnknownNameError(f"no hierarchical algorithm for collective {name!r}; valid: "
                               f"{', '.join(HIERARCHICAL_COLLECTIVES)}")
    return key


def _check_network(topology: Topology, layout: NetworkLayout, family: str) -> None:
    """Refuse a layout missing the NIC links the construction sends over."""
    if layout.nodes == 1:
        return
    links = topology.link_array
    n, total = layout.ranks_per_node, layout.num_ranks
    ranks = np.arange(total)
    if family == "alltoall":
        src, dst = _inter_pairs(layout.nodes, n)
    else:
        # Each rank to the rank of its local index on every other node: ranks x nodes pairs
        # (all ranks x all ranks, then filtered, took 6 s at 8192 ranks).
        nodes = np.arange(layout.nodes)
        src = np.repeat(ranks, layout.nodes)
        dst = np.tile(nodes, total) * n + src % n
        keep = (dst // n) != (src // n)
        src, dst = src[keep], dst[keep]
    missing = links[src, dst] == 0
    if missing.any():
        s, d = int(src[missing][0]), int(dst[missing][0])
        raise InvalidTopologyError(
            f"topology {topology.name!r}: no link {s}->{d} between nodes; the hierarchical "
            f"{family} sends direct over the NICs")


def _node_algorithm(layout: NetworkLayout, expected: Collective, family: str, given,
                    time_limit: float, deadline: Deadline | None = None) -> Algorithm:
    if given is None:
        return solve_node(layout.node, expected, node_time_limit(
            time_limit, deadline, f"synthesising the node {expected.describe()}"))
    return check_node_algorithm(given, layout.node, expected, family)


def _best(candidates, capacity: Capacity, budget: _Budget):
    """Price each ``(label, chunks, plan)``; return ``(steps, rounds, label)`` with the fewest
    rounds per chunk, then the fewest steps, then the fewest chunks. Once ``budget``'s deadline
    has passed, the best priced so far; when none was, :class:`TimeLimitReached` (or ``None``
    when the caller holds a best of its own, ``budget.have_best``). The candidates' plans are
    built with the same ``budget``, so a deadline stops a build or a pricing midway."""
    best = None
    candidates = iter(candidates)
    while True:
        if best is not None and budget.expired():
            _log.info("time limit reached: the best of the pipelines priced so far is kept")
            break
        try:
            label, chunks, plan = next(candidates)
            steps, rounds = plan.price(capacity, budget)
        except StopIteration:
            break
        except _Stop:
            break
        key = (Fraction(sum(rounds), chunks), len(steps), chunks)
        if best is None or key < best[0]:
            best = (key, steps, rounds, label)
        budget.have_best = True
    return None if best is None else (best[1], best[2], best[3])


def hierarchical_algorithm(topology: Topology, collective_name: str, *, root: int | None = None,
                           node_algorithm: Algorithm | Mapping[str, Algorithm] | None = None,
                           time_limit: float = DEFAULT_NODE_TIME_S,
                           batches: int | None = None,
                           parts: int | None = None,
                           deadline: Deadline | None = None) -> ScheduleResult:
    """A verified hierarchical algorithm for ``collective_name`` on a composed topology.

    See docs/large-systems.md for how each collective is built.

    Parameters
    ----------
    topology:
        A multi-node topology from :func:`~collsynth.topology.compose_nodes` (or
        ``resolve_topology(spec, nodes=K)``).
    collective_name:
        ``allgather``, ``reduce_scatter``, ``allreduce``, ``broadcast``, ``reduce`` or
        ``alltoall`` (case-insensitive; ``-`` and ``_`` alike).
    root:
        Broadcast and reduce only: the root rank of the whole topology (default 0).
    node_algorithm:
        The algorithm to run inside each node, on the node's ``n`` ranks, for the node-level
        collective (allgather, reduce_scatter, alltoall; broadcast / reduce from local rank
        ``root % n``), any chunk count. For allreduce a mapping with keys ``"reduce_scatter"``
        and/or ``"allgather"``. Re-verified on one node of ``topology`` with each step re-priced
        to the fewest rounds it needs there. Default: synthesised (bandwidth-best Pareto point).
    time_limit:
        Seconds for synthesising each node algorithm.
    batches, parts:
        Pipelining (see ``details["pipeline"]`` below); default: the best of 1, 2, 4, ...
        batches and (allgather, reduce-scatter, allreduce) 1, 2, 4 or 8 parts. Broadcast and
        reduce cut the buffer into as many parts as batches.
    deadline:
        A wall-clock budget for the whole call (:class:`~collsynth.synthesis.result.Deadline`):
        node synthesis gets at most what is left of it, and once it has passed the pipelines
        priced so far compete and the best is built; ``None``: no budget beyond ``time_limit``.

    Returns
    -------
    ScheduleResult
        Of engine ``"hierarchical"``, without a lower bound; ``details`` hold
        ``node_algorithms`` and ``pipeline`` (see
        :class:`~collsynth.synthesis.result.ScheduleResult`).

    Raises
    ------
    InvalidTopologyError
        When the topology is not a composed multi-node topology (see :func:`network_layout`),
        or lacks the links between nodes the construction uses.
    UnknownNameError
        For another collective.
    InvalidCollectiveError
        For a root out of range, a root given to an unrooted collective, or a node algorithm
        for the wrong collective.
    SolverError
        When no node algorithm is found within ``time_limit``.
    InputTooLargeError
        When the algorithm would have more than :data:`~collsynth.collective.model.MAX_CHUNKS`
        chunks.
    TimeLimitReached
        When ``deadline`` passes before any pipeline is priced.
    ResourceLimitError
        When what is left of ``deadline`` cannot cover building and verifying the algorithm.

    Examples
    --------
    Two 4-GPU rings joined by one-unit NICs: the allgather sends each rank's chunk to its peer,
    then both rings spread both nodes' chunks:

    >>> from collsynth.topology import compose_nodes, get_topology
    >>> two_rings = compose_nodes(get_topology("ring:4"), 2, nic_units=1)
    >>> result = hierarchical_algorithm(two_rings, "allgather")
    >>> result.algorithm.collective.describe(), result.rounds_per_chunk, result.steps
    ('allgather(n=8, chunks=2)', Fraction(3, 1), 3)
    >>> hierarchical_algorithm(two_rings, "broadcast", root=5).algorithm.collective.roots
    (5,)
    """
    started = time.perf_counter()
    family = _family(collective_name)
    layout = network_layout(topology)
    K, n, total = layout.nodes, layout.ranks_per_node, layout.num_ranks
    if family in ("broadcast", "reduce"):
        root = 0 if root is None else root
        if not isinstance(root, int) or isinstance(root, bool) or not 0 <= root < total:
            raise InvalidCollectiveError(f"{family}: root {root!r} is not a rank 0..{total - 1}")
    elif root is not None:
        raise InvalidCollectiveError(f"{family} takes no root")
    for key, value in (("batches", batches), ("parts", parts)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                                  or value < 1):
            raise InvalidCollectiveError(f"{key} = {value!r}; expected a positive whole number")
    _check_network(topology, layout, family)
    capacity = Capacity(topology, deadline)
    others = K - 1

    if family == "allreduce":
        given = node_algorithm if node_algorithm is not None else {}
        if not isinstance(given, Mapping):
            raise InvalidCollectiveError("node_algorithm for allreduce must be a mapping with keys "
                                         "'reduce_scatter' and/or 'allgather'")
        unknown = sorted(set(given) - {"reduce_scatter", "allgather"})
        if unknown:
            raise InvalidCollectiveError(f"node_algorithm for allreduce: unknown key(s) {unknown}; "
                                         "expected 'reduce_scatter' and/or 'allgather'")
        rs_node = _node_algorithm(layout, reduce_scatter(n), "reduce_scatter",
                                  given.get("reduce_scatter"), time_limit, deadline)
        ag_node = _node_algorithm(layout, allgather(n), "allgather", given.get("allgather"),
                                  time_limit, deadline)
        pieces = math.lcm(rs_node.chunks, ag_node.chunks)
        _check_size(total * pieces, family)
        rs_node = refine(rs_node, pieces // rs_node.chunks)
        ag_node = refine(ag_node, pieces // ag_node.chunks)
        rs_steps, ag_steps = _node_steps(rs_node), _node_steps(ag_node)
        best = None
        for p in _parts_choices(K, total, pieces, parts):
            if best is None:
                check_time(deadline, f"pipelining the hierarchical {family}")
            elif deadline is not None and deadline.expired():
                break  # keep the best pipeline priced so far
            _check_size(total * pieces * p, family)
            budget = _Budget(deadline, have_best=best is not None)
            rs = _best(_gather_candidates(_reduce_scatter_plan, K, n, pieces, rs_steps, p,
                                          batches, budget), capacity, budget)
            budget = _Budget(deadline, have_best=best is not None)
            ag = None if rs is None else _best(
                _gather_candidates(_allgather_plan, K, n, pieces, ag_steps, p, batches, budget),
                capacity, budget)
            if ag is None:
                break   # the deadline passed: keep the best pipeline priced so far
            (steps_rs, rounds_rs, label_rs), (steps_ag, rounds_ag, label_ag) = rs, ag
            key = (Fraction(sum(rounds_rs) + sum(rounds_ag), p),
                   len(steps_rs) + len(steps_ag), p)
            if best is None or key < best[0]:
                best = (key, steps_rs + steps_ag, rounds_rs + rounds_ag, (label_rs, label_ag), p)
        _, steps, rounds, labels, p = best
        pieces *= p
        chunks = total * pieces
        nodes_used, pipeline = (rs_node, ag_node), labels
    else:
        if family == "alltoall":
            expected = alltoall(n)
        elif family in ("broadcast", "reduce"):
            expected = (broadcast if family == "broadcast" else reduce)(n, root % n)
        else:
            expected = {"allgather": allgather, "reduce_scatter": reduce_scatter}[family](n)
        node = _node_algorithm(layout, expected, family, node_algorithm, time_limit, deadline)
        pieces = node.chunks
        node_steps = _node_steps(node)
        nodes_used = (node,)
        if family in ("allgather", "reduce_scatter"):
            make = _allgather_plan if family == "allgather" else _reduce_scatter_plan
            check_time(deadline, f"pipelining the hierarchical {family}")
            for p in _parts_choices(K, total, pieces, parts):
                _check_size(total * pieces * p, family)
            # lazily, so that a deadline stops the pricing between candidates
            budget = _Budget(deadline)
            candidates = (candidate for p in _parts_choices(K, total, pieces, parts)
                          for candidate in _gather_candidates(make, K, n, pieces, node_steps, p,
                                                              batches, budget))
            steps, rounds, label = _best(candidates, capacity, budget)
            pieces *= label[1]
            chunks = total * pieces
            pipeline = (label,)
        elif family in ("broadcast", "reduce"):
            make = _broadcast_plan if family == "broadcast" else _reduce_plan
            choices = [batches] if batches is not None else ([1, 2, 4, 8] if others else [1])
            plans = (((b, b), b, make(K, n, pieces, node_steps, root, b)) for b in choices)
            check_time(deadline, f"pipelining the hierarchical {family}")
            steps, rounds, label = _best(plans, capacity, _Budget(deadline))
            chunks = label[1] * pieces
            pipeline = (label,)
        else:
            check_time(deadline, "pricing the hierarchical alltoall")
            steps, rounds, pieces, node = best_alltoall(capacity, K, n, node, deadline=deadline)
            nodes_used = (node,)
            chunks = total * total * pieces
            pipeline = ()
    # Refuse what the time left cannot build and verify before building its conditions.
    check_build_fits(deadline, chunks=chunks,
                      ranks_per_chunk=1 if family == "alltoall" else total,
                      sends=sum(len(s[0]) for s in steps),
                      what=f"the hierarchical {family} on {topology.name}")
    algorithm = build_schedule(
        f"hierarchical-{family}-{topology.name}", topology,
        _whole_collective(family, total, root, chunks), steps, rounds,
        {"strategy": "hierarchical", "node_algorithms": [a.name for a in nodes_used],
         "pipeline": [list(x) for x in pipeline], "inter_node": "direct over the NICs"})
    return ScheduleResult(algorithm=algorithm, engine="hierarchical",
                          rounds_per_chunk=algorithm.rounds_per_chunk,
                          steady_state_rounds_per_chunk=algorithm.rounds_per_chunk,
                          lower_bound=None, seconds=time.perf_counter() - started,
                          details={"node_algorithms": nodes_used, "pipeline": pipeline})


def _whole_collective(family: str, total: int, root: int | None, chunks: int) -> Collective:
    """The collective of a hierarchical ``family`` algorithm on ``total`` ranks, split into
    ``chunks`` chunks in all."""
    if family == "allreduce":
        return allreduce(total).split(chunks)
    if family in ("broadcast", "reduce"):
        return (broadcast if family == "broadcast" else reduce)(total, root).split(chunks)
    if family == "alltoall":
        return alltoall(total).split(chunks // (total * total))
    whole = allgather if family == "allgather" else reduce_scatter
    return whole(total).split(chunks // total)


def _check_size(chunks: int, family: str) -> None:
    if chunks > MAX_CHUNKS:
        raise InputTooLargeError(f"the hierarchical {family} would have {chunks} chunks, more "
                                 f"than {MAX_CHUNKS}")


def best_alltoall(capacity: Capacity, nodes: int, n: int, node: Algorithm,
                   max_refine: int = _MAX_ALLTOALL_REFINE, *, deadline: Deadline | None = None):
    """The hierarchical alltoall with the fewest rounds per chunk over refinements of the node
    algorithm by 1 .. ``max_refine`` (then fewest steps, then fewest chunks):
    ``(steps, rounds, pieces, node algorithm)``. Once ``deadline`` has passed, the best of the
    refinements priced so far."""
    total = nodes * n
    best = None
    for factor in range(1, max_refine + 1):
        if best is not None and deadline is not None and deadline.expired():
            break
        pieces = node.chunks * factor
        if total * total * pieces > MAX_CHUNKS:
            if best is None:
                _check_size(total * total * pieces, "alltoall")
            break
        refined = refine(node, factor)
        plan = _alltoall_plan(capacity, nodes, n, pieces, _node_steps(refined))
        steps, rounds = plan.price(capacity)
        key = (Fraction(sum(rounds), pieces), len(steps), pieces)
        if best is None or key < best[0]:
            best = (key, steps, rounds, pieces, refined)
    return best[1], best[2], best[3], best[4]
