"""NCCL's own cost model on a collsynth topology: the ring and tree baselines to beat.

NCCL picks an algorithm (ring, tree) and a protocol (LL, LL128, Simple) per call by evaluating,
for each enabled pair, its tuning model (``ncclTopoTuneModel`` / ``ncclTopoGetAlgoTime`` in NCCL's
``src/graph/tuning.cc``; the constants are summarised in docs/baselines.md) and taking the
fastest::

    time_us = latency_us + size_bytes / (1000 * algbw_gbps)

The details: ``docs/timing.md``, section "NCCL's cost model (collsynth.timing.nccl)".
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from numbers import Real
from types import MappingProxyType
from typing import TYPE_CHECKING, Iterable, Mapping, Sequence

import sympy

from collsynth.collective.kinds import canonical_name
from collsynth.errors import CollsynthError, InvalidInstanceError, UnknownNameError
from collsynth.exact import exact_fraction
from collsynth.runtimes.constants import NCCL_BASE_LATENCY_US, NCCL_HOP_LATENCY_US
from collsynth.runtimes.protocols import PROTOCOLS
from collsynth.timing.model import SIZE, CostModel, _as_model
from collsynth.timing.tuning_model import ring_steps

if TYPE_CHECKING:  # pragma: no cover - imported for annotations only
    from collsynth.topology.model import Topology

__all__ = [
    "ALGORITHMS",
    "BASE_LATENCY_US",
    "HOP_LATENCY_US",
    "BANDWIDTH_FACTOR",
    "NcclSetup",
    "NcclChoice",
    "ring_channels",
    "nccl_setup",
    "nccl_choices",
    "best_choice",
]

ALGORITHMS = ("ring", "tree")


def _per_protocol(**rows: tuple) -> Mapping[str, Mapping[str, Fraction]]:
    """``{row: {protocol: Fraction}}`` from one (LL, LL128, Simple) tuple per row, read-only."""
    return MappingProxyType({name: MappingProxyType(dict(zip(PROTOCOLS, map(_exact, values))))
                             for name, values in rows.items()})


def _exact(value: object) -> Fraction:
    return Fraction(value) if isinstance(value, (Fraction, str)) else exact_fraction(value)


#: ``BASE_LATENCY_US[algorithm][protocol]``: NCCL's ``baseLat`` (us), exact
#: (:data:`collsynth.runtimes.constants.NCCL_BASE_LATENCY_US`).
BASE_LATENCY_US = _per_protocol(**{a: NCCL_BASE_LATENCY_US[a] for a in ALGORITHMS})

#: ``HOP_LATENCY_US[hardware][algorithm][protocol]``: NCCL's ``hwLat`` (us per hop), exact
#: (:data:`collsynth.runtimes.constants.NCCL_HOP_LATENCY_US`).
HOP_LATENCY_US: Mapping[str, Mapping[str, Mapping[str, Fraction]]] = MappingProxyType({
    hw: _per_protocol(**{a: table[a] for a in ALGORITHMS})
    for hw, table in NCCL_HOP_LATENCY_US.items()})

#: ``BANDWIDTH_FACTOR[algorithm][protocol]`` on the bus bandwidth, one node (the tree's LL128
#: factor on several nodes is :data:`TREE_LL128_MULTINODE`).
BANDWIDTH_FACTOR = _per_protocol(
    ring=(Fraction(1, 2), "0.92", 1),
    tree=(Fraction("0.92") / Fraction("3.8"), Fraction("0.92") * Fraction(7, 9), "0.92"),
)

#: Tree LL128 factor on several nodes: 0.92 x 120/128.
TREE_LL128_MULTINODE = Fraction("0.92") * Fraction(120, 128)

#: Collectives NCCL runs with its ring (and, for allreduce, tree) algorithms.
_RING_COLLECTIVES = ("allreduce", "allgather", "reduce_scatter", "broadcast", "reduce")

def _key(name: str) -> str:
    return canonical_name(name)


@dataclass(frozen=True)
class NcclSetup:
    """What NCCL's graph search finds on a topology, as far as its cost model needs.

    Parameters
    ----------
    num_ranks, nodes:
        Ranks and nodes (ranks per node = ``num_ranks // nodes``).
    rings:
        The channels: each a directed ring, ranks in order.
    channel_gbps:
        GB/s of each channel (one unit of its slowest hop).
    hardware:
        ``"nvlink"`` or ``"pci"``: which per-hop latencies apply inside a node.
    """

    num_ranks: int
    nodes: int
    rings: tuple[tuple[int, ...], ...]
    channel_gbps: tuple[Fraction, ...]
    hardware: str = "nvlink"

    def __post_init__(self) -> None:
        if self.hardware not in ("nvlink", "pci"):
            raise UnknownNameError(f"hardware {self.hardware!r}; expected 'nvlink' or 'pci'")
        if len(self.rings) != len(self.channel_gbps):
            raise InvalidInstanceError("NcclSetup: one channel_gbps per ring")
        if self.nodes < 1 or self.num_ranks % self.nodes:
            raise InvalidInstanceError(f"NcclSetup: {self.num_ranks} ranks on {self.nodes} nodes")

    @property
    def bus_gbps(self) -> float:
        """The bus bandwidth of all channels together (GB/s)."""
        return float(self.bus_gbps_exact)

    @property
    def bus_gbps_exact(self) -> Fraction:
        return sum(self.channel_gbps, Fraction(0))


@dataclass(frozen=True)
class NcclChoice:
    """One (algorithm, protocol) of NCCL for one collective: ``latency_us + size / (1000 algbw)``.

    ``latency_us`` and ``algbw_gbps`` are exact (NCCL's decimal constants as Fractions), so
    crossovers with synthesized algorithms are exact (:func:`collsynth.timing.model.crossover`).
    """

    algorithm: str
    protocol: str
    collective: str
    num_ranks: int
    latency_us: Fraction
    algbw_gbps: Fraction

    @property
    def name(self) -> str:
        """``"ring/LL"``, ``"tree/Simple"``..."""
        return f"{self.algorithm}/{self.protocol}"

    def time_us(self, size_bytes: Real) -> float:
        """Microseconds for a ``size_bytes`` buffer (nccl-tests convention)."""
        return float(self.latency_us) + float(size_bytes) / (1000 * float(self.algbw_gbps))

    def symbolic_time(self) -> sympy.Expr:
        """The time as a sympy expression in ``size_bytes`` with exact coefficients."""
        lat = sympy.Rational(self.latency_us.numerator, self.latency_us.denominator)
        bw = sympy.Rational(self.algbw_gbps.numerator, self.algbw_gbps.denominator)
        return lat + SIZE / (1000 * bw)


def ring_channels(topology: "Topology", *, max_channels: int = 64, budget: int = 200_000
                  ) -> tuple[tuple[int, ...], ...]:
    """Directed Hamiltonian rings packed into the topology's link units and group limits.

    Greedy, as NCCL's own search: find a ring through every rank using links with a unit left,
    take one unit from each of its links and from every bandwidth group each of its links is in,
    and repeat until no ring is left, ``max_channels`` rings are found, or ``budget`` search
    nodes were expanded. Returns ``()`` when there is no ring (a star).

    * One node: depth-first from rank 0, preferring the links with the most units left; a few
      packings with different tie-breaks are tried and the largest kept (it stops early when it
      reaches an upper bound: the fewest units out of or into a rank, or a rank's group limit).
    * A composed topology (``metadata["network"]``,
      :func:`~collsynth.topology.compose.compose_nodes`): as NCCL builds inter-node rings,
      each ring crosses every node once: it enters node ``k`` at local rank ``e``, runs a
      Hamiltonian path inside the node to local rank ``x``, and leaves through ``x``'s NIC to
      local rank ``e`` of node ``k + 1`` (the same path in every node).

    >>> from collsynth.topology.families import ring, fully_connected
    >>> ring_channels(ring(4))
    ((0, 1, 2, 3), (0, 3, 2, 1))
    >>> len(ring_channels(fully_connected(5)))
    4
    """
    n = topology.num_ranks
    if n < 2:
        return ()
    layout = topology.layout
    if layout is not None and layout.multi_node:
        per_node = layout.ranks_per_node
        return _composed_rings(topology, per_node, n // per_node, max_channels, budget)
    bound = _ring_bound(topology, max_channels)
    best: tuple[tuple[int, ...], ...] = ()
    spent = 0
    for attempt in range(_ATTEMPTS):
        rings, used = _greedy_rings(topology, attempt, max_channels, budget - spent)
        spent += used
        if len(rings) > len(best):
            best = rings
        if len(best) >= bound or spent >= budget:
            break
    return best


#: Greedy packings tried by :func:`ring_channels` (tie-breaks differ) before keeping the best.
_ATTEMPTS = 12


class _Residual:
    """Units left on every link and in every bandwidth group, and a search budget."""

    def __init__(self, topology: "Topology", budget: int) -> None:
        self.units = [list(row) for row in topology.links]
        groups = topology.effective_groups
        self.group_left = [g.limit for g, _ in groups]
        self.member: dict[tuple[int, int], list[int]] = {}
        for index, (_, covered) in enumerate(groups):
            for link in covered:
                self.member.setdefault(link, []).append(index)
        self.budget = budget
        self.expansions = 0

    def usable(self, u: int, v: int) -> bool:
        return self.units[u][v] > 0 and all(self.group_left[g] > 0
                                            for g in self.member.get((u, v), ()))

    def take(self, links: Sequence[tuple[int, int]], amount: int = 1) -> bool:
        """Take ``amount`` units on every link (all or nothing); False if one runs out."""
        for u, v in links:
            self.units[u][v] -= amount
            for g in self.member.get((u, v), ()):
                self.group_left[g] -= amount
        if amount > 0 and (any(self.units[u][v] < 0 for u, v in links) or any(
                self.group_left[g] < 0 for u, v in links for g in self.member.get((u, v), ()))):
            self.take(links, -amount)
            return False
        return True

    def spend(self) -> bool:
        self.expansions += 1
        return self.expansions <= self.budget


def _ring_bound(topology: "Topology", max_channels: int) -> int:
    """No more rings than units out of or into any rank, nor than any group's limit."""
    n = topology.num_ranks
    bound = min(min(sum(row) for row in topology.links),
                min(sum(topology.links[s][d] for s in range(n)) for d in range(n)), max_channels)
    everyone = frozenset(range(n))
    for group, _ in topology.effective_groups:
        # Every ring leaves the sources for the rest (or enters the destinations from the rest)
        # at least once: if the group covers all those links, each ring uses one of its units.
        if (group.destinations >= everyone - group.sources
                or group.sources >= everyone - group.destinations):
            bound = min(bound, group.limit)
    return bound


def _greedy_rings(topology: "Topology", attempt: int, max_channels: int, budget: int
                  ) -> tuple[tuple[tuple[int, ...], ...], int]:
    """One greedy packing; ``attempt`` picks the tie-break among links with equal units left."""
    import random

    n = topology.num_ranks
    left = _Residual(topology, budget)
    shuffle = random.Random(attempt)
    tiebreak = [[shuffle.random() if attempt else ((v - u) % n) for v in range(n)]
                for u in range(n)]

    def search(path: list[int], seen: list[bool]) -> bool:
        if not left.spend():
            return False
        u = path[-1]
        if len(path) == n:
            return left.usable(u, path[0])
        candidates = [v for v in range(n) if not seen[v] and left.usable(u, v)]
        candidates.sort(key=lambda v: (-left.units[u][v], tiebreak[u][v]))
        for v in candidates:
            left.take([(u, v)])
            seen[v] = True
            path.append(v)
            if search(path, seen):
                return True
            path.pop()
            seen[v] = False
            left.take([(u, v)], -1)
        return False

    rings: list[tuple[int, ...]] = []
    while len(rings) < max_channels and left.expansions <= budget:
        path, seen = [0], [True] + [False] * (n - 1)
        if not search(path, seen):
            break
        left.take([(path[-1], path[0])])
        rings.append(tuple(path))
    return tuple(rings), left.expansions


def _composed_rings(topology: "Topology", per_node: int, nodes: int, max_channels: int,
                    budget: int) -> tuple[tuple[int, ...], ...]:
    """Rings that cross every node once, the same local path in every node (see ring_channels)."""
    left = _Residual(topology, budget)
    p = per_node

    def local_path(path: list[int], seen: list[bool], exit_rank: int) -> bool:
        if not left.spend():
            return False
        u = path[-1]
        if len(path) == p:
            return u == exit_rank
        candidates = [v for v in range(p) if not seen[v] and (v != exit_rank or len(path) == p - 1)
                      and all(left.usable(k * p + u, k * p + v) for k in range(nodes))]
        candidates.sort(key=lambda v: (-left.units[u][v], (v - u) % p))
        for v in candidates:
            links = [(k * p + u, k * p + v) for k in range(nodes)]
            if not left.take(links):
                continue
            seen[v] = True
            path.append(v)
            if local_path(path, seen, exit_rank):
                return True
            path.pop()
            seen[v] = False
            left.take(links, -1)
        return False

    rings: list[tuple[int, ...]] = []
    while len(rings) < max_channels and left.expansions <= budget:
        found = None
        pairs = [(e, x) for e in range(p) for x in range(p) if e != x or p == 1]
        for e, x in pairs:
            cross = [(k * p + x, ((k + 1) % nodes) * p + e) for k in range(nodes)]
            if not all(left.usable(u, v) for u, v in cross) or not left.take(cross):
                continue
            path, seen = [e], [False] * p
            seen[e] = True
            if local_path(path, seen, x):
                found = path
                break
            left.take(cross, -1)
            if left.expansions > budget:
                break
        if found is None:
            break
        rings.append(tuple(k * p + r for k in range(nodes) for r in found))
    return tuple(rings)


def nccl_setup(topology: "Topology", *, model: "CostModel | None" = None,
               hardware: str = "nvlink", channels: int | None = None,
               channel_gbps: Real | None = None) -> NcclSetup:
    """The channels NCCL would use on ``topology`` and their bandwidth.

    Parameters
    ----------
    topology:
        Needs ``unit_gbps`` (unless ``channel_gbps`` is given). A composed topology
        (``metadata["network"]``) counts its nodes.
    model:
        The link figures (default: :func:`~collsynth.timing.model.cost_model` of the topology);
        a channel's GB/s is one unit of its slowest hop: ``1 / (1000 * beta)``.
    hardware:
        ``"nvlink"`` (default) or ``"pci"``: NCCL's per-hop latency class inside a node.
    channels, channel_gbps:
        Override what the search finds: ``channels`` rings (the rings found are reused, cycling
        if needed, for their names only) each of ``channel_gbps`` GB/s.

    Raises
    ------
    CollsynthError
        When the topology has no directed ring through every rank and ``channels`` is not given.
    """
    n = topology.num_ranks
    nodes = topology.layout.nodes if topology.layout is not None else 1
    rings = ring_channels(topology)
    if channels is not None:
        if not isinstance(channels, int) or channels < 1:
            raise InvalidInstanceError(f"channels = {channels!r}; expected an integer >= 1")
        base = rings or (tuple(range(n)),)
        rings = tuple(base[i % len(base)] for i in range(channels))
    if not rings:
        raise CollsynthError(
            f"topology {topology.name!r} has no directed ring through all {n} ranks, so NCCL's "
            "ring and tree have no channel here; pass channels= and channel_gbps=")
    if channel_gbps is not None:
        per = exact_fraction(channel_gbps, "channel_gbps")
        gbps = tuple(per for _ in rings)
    else:
        cm = _as_model(model if model is not None else topology, None)
        gbps = tuple(min(1 / (1000 * exact_fraction(cm.figures(a, b).beta_us_per_byte, "beta"))
                         for a, b in zip(ring, ring[1:] + ring[:1]))
                     for ring in rings)
    return NcclSetup(n, nodes, rings, gbps, hardware)



def nccl_choices(setup: "NcclSetup | Topology", collective: str, *,
                 protocols: Sequence[str] = PROTOCOLS,
                 algorithms: Sequence[str] = ALGORITHMS) -> tuple[NcclChoice, ...]:
    """Every (algorithm, protocol) NCCL would consider for ``collective`` (docs/timing.md).

    Ring for allreduce, allgather, reduce-scatter, broadcast and reduce; tree for allreduce only.
    Other collectives (alltoall, gather, scatter: grouped point-to-point in NCCL, outside its
    tuning model) get ``()``.

    >>> from collsynth.topology import get_topology
    >>> [c.name for c in nccl_choices(get_topology("dgx1"), "allreduce")]
    ['ring/LL', 'ring/LL128', 'ring/Simple', 'tree/LL', 'tree/LL128', 'tree/Simple']

    Examples
    --------
    On the DGX-1 (6 directed NVLink rings of 25 GB/s = 150 GB/s bus bandwidth), an 8-rank allgather
    with ring/Simple: latency ``8.4 + 7 * 3.4 = 32.2`` us, ``algbw = 150 * 8 / 7`` GB/s:

    >>> from collsynth.topology import get_topology
    >>> setup = nccl_setup(get_topology("dgx1"))
    >>> len(setup.rings), setup.bus_gbps
    (6, 150.0)
    >>> simple = [c for c in nccl_choices(setup, "allgather") if c.name == "ring/Simple"][0]
    >>> float(simple.latency_us), round(float(simple.algbw_gbps), 3)
    (32.2, 171.429)
    >>> best_choice(nccl_choices(setup, "allgather"), 1000).name
    'ring/LL'
    """
    if not isinstance(setup, NcclSetup):
        setup = nccl_setup(setup)
    for p in protocols:
        if p not in PROTOCOLS:
            raise UnknownNameError(f"protocol {p!r}; expected one of {', '.join(PROTOCOLS)}")
    for a in algorithms:
        if a not in ALGORITHMS:
            raise UnknownNameError(f"algorithm {a!r}; expected one of {', '.join(ALGORITHMS)}")
    key = _key(collective)
    if key not in _RING_COLLECTIVES:
        return ()
    n, nodes = setup.num_ranks, setup.nodes
    intra = HOP_LATENCY_US[setup.hardware]
    net = HOP_LATENCY_US["net"]
    bus = setup.bus_gbps_exact
    choices = []
    if "ring" in algorithms:
        nsteps = ring_steps(key, n)
        inter_steps = ring_steps(key, nodes) if nodes > 1 else 0
        for p in protocols:
            latency = BASE_LATENCY_US["ring"][p]
            if key in ("broadcast", "reduce"):
                hop_table = intra if nodes == 1 else net
                hop = hop_table["tree" if p == "Simple" else "ring"][p]
                latency += nsteps * hop
            else:
                latency += (nsteps - inter_steps) * intra["ring"][p] + inter_steps * net["ring"][p]
            algbw = bus * BANDWIDTH_FACTOR["ring"][p] * Fraction(n, nsteps)
            choices.append(NcclChoice("ring", p, key, n, latency, algbw))
    if "tree" in algorithms and key == "allreduce":
        for p in protocols:
            latency = BASE_LATENCY_US["tree"][p] + 2 * (
                (n // nodes - 1) * intra["tree"][p] + _log2i(nodes) * net["tree"][p])
            factor = BANDWIDTH_FACTOR["tree"][p]
            if p == "LL128" and nodes > 1:
                factor = TREE_LL128_MULTINODE
            choices.append(NcclChoice("tree", p, key, n, latency, bus * factor / 2))
    return tuple(choices)


def best_choice(choices: Iterable[NcclChoice], size_bytes: Real) -> NcclChoice:
    """The fastest choice at ``size_bytes``, as NCCL picks (ties: the first given).

    Raises
    ------
    InvalidInstanceError
        When ``choices`` is empty.
    """
    choices = tuple(choices)
    if not choices:
        raise InvalidInstanceError("no NCCL choice to pick from")
    size = exact_fraction(size_bytes, "size_bytes")
    return min(choices, key=lambda c: c.latency_us + size / (1000 * c.algbw_gbps))


def _log2i(value: int) -> int:
    """NCCL's ``log2i``: floor of log2 (0 for 1)."""
    return int(math.floor(math.log2(value))) if value > 1 else 0
