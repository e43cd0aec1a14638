"""What a collective over a group of devices costs: NCCL's baseline, or the best planned algorithm.

The details (formats, conventions, rules) are in docs/training.md.

Examples
--------
>>> from collsynth.topology import get_topology
>>> dgx = get_topology("dgx-a100")
>>> nccl = NcclComm(dgx)
>>> nccl.choice("allreduce", (0, 1), 10**6)   # 12 rings x 25 GB/s; LL: 7.8 us + 1e6 B / 150e3 B/us
CommChoice(name='nccl ring/LL', time_us=14.466666666666667)
>>> round(nccl.time_us("send", (0, 1), 3 * 10**6), 3)      # 0.7 + 3e6 B / (12 x 25e3 B/us)
10.7
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass
from numbers import Real
from typing import TYPE_CHECKING, Iterable, Mapping, Protocol, Sequence, runtime_checkable

from collsynth.errors import (InvalidInstanceError, InvalidTopologyError, NoRingError,
                              UnknownNameError)
from collsynth.synthesis.result import SYNTHESIS_FAILURES
from collsynth.collective.kinds import canonical_name

if TYPE_CHECKING:  # pragma: no cover - imported for annotations only
    from collsynth.algorithm.model import Algorithm
    from collsynth.timing.model import CostModel
    from collsynth.timing.tuning_model import NcclSetup
    from collsynth.topology.model import Topology

__all__ = [
    "COLLECTIVES",
    "CommModel",
    "CommChoice",
    "NcclComm",
    "PlannedComm",
    "induced_topology",
    "p2p_time_us",
    "topology_signature",
]

_log = logging.getLogger(__name__)

#: The operations a :class:`CommModel` prices.
COLLECTIVES = ("allreduce", "allgather", "reduce_scatter", "send")

def _collective_key(name: str) -> str:
    key = canonical_name(str(name))
    if key not in COLLECTIVES:
        raise UnknownNameError(f"collective {name!r}: the training simulator prices "
                               f"{', '.join(COLLECTIVES)}")
    return key


@runtime_checkable
class CommModel(Protocol):
    """Prices communication for the simulator (docs/training.md)."""

    def time_us(self, collective: str, group: tuple[int, ...], size_bytes: Real) -> float:
        """Microseconds ``collective`` takes over ``group`` on a ``size_bytes`` buffer."""
        ...  # pragma: no cover - protocol


@dataclass(frozen=True)
class CommChoice:
    """What a comm model picked for one call: a label and its time (us)."""

    name: str
    time_us: float


# --------------------------------------------------------------------------------------------
# Topology helpers


def induced_topology(topology: "Topology", ranks: Sequence[int]) -> "Topology":
    """The sub-topology on ``ranks``: sub-rank ``i`` is ``ranks[i]``.

    Links among the ranks are kept with their bandwidths; each bandwidth group is restricted to
    the ranks (sources and destinations intersected with them) and dropped when either side is
    left empty; ``unit_gbps`` and ``alpha_us`` are kept. On a composed topology
    (``metadata["network"]``), when the ranks are listed node by node (in any node order) with
    the same count ``c`` on each of ``k >= 2`` nodes, the result describes ``k`` nodes of ``c``
    ranks (sub-ranks ``c i .. c i + c - 1`` share a node; NIC figures kept); otherwise it has no
    network description.

    Raises
    ------
    InvalidInstanceError
        For an empty list, a repeated rank, or a rank outside the topology.

    >>> from collsynth.topology import get_topology
    >>> sub = induced_topology(get_topology("dgx1"), (0, 1, 2, 3))
    >>> sub.num_ranks, sub.links[0]
    (4, (0, 2, 1, 1))
    """
    from collsynth.topology.model import BandwidthGroup, Topology

    chosen = _check_group(topology, ranks, "ranks")
    index = {r: i for i, r in enumerate(chosen)}
    links = tuple(tuple(topology.links[a][b] for b in chosen) for a in chosen)
    groups = []
    for g in topology.groups:
        sources = frozenset(index[r] for r in g.sources if r in index)
        destinations = frozenset(index[r] for r in g.destinations if r in index)
        if sources and destinations:
            groups.append(BandwidthGroup(sources, destinations, g.limit, g.name))
    metadata: dict[str, object] = {}
    network = _network(topology)
    if network is not None:
        per_node = int(network["ranks_per_node"])
        nodes = [r // per_node for r in chosen]
        distinct = list(dict.fromkeys(nodes))
        size = len(nodes) // len(distinct)
        blocks = [nodes[i:i + size] for i in range(0, len(nodes), size)]
        # sub-ranks in blocks of `size`, each block one node (the numbering compose_nodes uses)
        regular = len(blocks) == len(distinct) and all(len(set(b)) == 1 for b in blocks)
        if len(distinct) >= 2 and regular:
            sub = {key: network[key] for key in ("nic_units", "nic_gbps_declared", "alpha_us")
                   if key in network}
            sub.update(nodes=len(distinct), ranks_per_node=size,
                       composed_from=f"{topology.name} ranks {list(chosen)}")
            metadata["network"] = sub
        elif len(distinct) >= 2:
            _log.debug("group %s of %s spans nodes unevenly; timed as one node", chosen,
                       topology.name)
    label = ",".join(map(str, chosen)) if len(chosen) <= 8 else \
        f"{chosen[0]},...,{chosen[-1]} ({len(chosen)} ranks)"
    return Topology(f"{topology.name}[{label}]", links, tuple(groups), topology.unit_gbps,
                    topology.alpha_us, f"sub-topology of {topology.name}", metadata)


def topology_signature(topology: "Topology") -> tuple:
    """What a collective's cost depends on: links, bandwidth groups (limits, not names), figures
    and the network description. Topologies with equal signatures share synthesized fronts."""
    groups = tuple(sorted((tuple(sorted(g.sources)), tuple(sorted(g.destinations)), g.limit)
                          for g in topology.groups))
    network = _network(topology)
    net = None if network is None else tuple(
        (key, repr(network.get(key))) for key in ("nodes", "ranks_per_node", "nic_units",
                                                  "nic_gbps_declared", "alpha_us"))
    return topology.links, groups, topology.unit_gbps, topology.alpha_us, net


def _network(topology: "Topology") -> Mapping | None:
    """The raw ``metadata["network"]`` of a multi-node topology (copied into sub-topologies)."""
    if topology.layout is not None and topology.layout.multi_node:
        return topology.metadata["network"]
    return None


def _check_group(topology: "Topology", group: Iterable[int], what: str = "group"
                 ) -> tuple[int, ...]:
    ranks = tuple(group)
    if not ranks:
        raise InvalidInstanceError(f"{what}: empty")
    n = topology.num_ranks
    for r in ranks:
        if isinstance(r, bool) or not isinstance(r, int) or not 0 <= r < n:
            raise InvalidInstanceError(f"{what} {ranks}: rank {r!r} is not a rank of "
                                       f"{topology.name!r} (0..{n - 1})")
    if len(set(ranks)) != len(ranks):
        raise InvalidInstanceError(f"{what} {ranks}: a rank is repeated")
    return ranks


def _link_units(topology: "Topology", src: int, dst: int) -> int:
    """The link's units, capped by every bandwidth group the link is in."""
    units = topology.links[src][dst]
    for g in topology.groups:
        if src in g.sources and dst in g.destinations:
            units = min(units, g.limit)
    return units


def p2p_time_us(topology: "Topology", src: int, dst: int, size_bytes: Real, *,
                model: "CostModel | None" = None) -> float:
    """Microseconds to send ``size_bytes`` from rank ``src`` to rank ``dst`` (docs/training.md).

    Raises
    ------
    InvalidInstanceError
        For a bad rank, ``src == dst``, a negative size, or no path.
    InvalidTopologyError
        When the topology lacks ``alpha_us`` or ``unit_gbps``.

    >>> from collsynth.topology import get_topology
    >>> round(p2p_time_us(get_topology("dgx1"), 0, 1, 10**6), 3)   # 2 NVLinks: 0.7 + 1e6 / 5e4
    20.7
    """
    alpha, per_byte = _p2p_line(topology, src, dst, model)
    return alpha + _check_size(size_bytes) * per_byte


def _check_size(size_bytes: Real) -> float:
    size = float(size_bytes)
    if not size >= 0 or size == float("inf"):
        raise InvalidInstanceError(f"size_bytes = {size_bytes!r}; expected a finite number >= 0")
    return size


def _p2p_line(topology: "Topology", src: int, dst: int, model: "CostModel | None"
              ) -> tuple[float, float]:
    """``(alpha_us, us per byte)`` of a message from ``src`` to ``dst``."""
    from collsynth.timing.model import cost_model

    if src == dst:
        raise InvalidInstanceError(f"send from rank {src} to itself")
    _check_group(topology, (src, dst), "send")
    cm = model if model is not None else cost_model(topology)
    path = _widest_shortest_path(topology, src, dst)
    alpha = sum(cm.figures(a, b).alpha_us for a, b in path)
    per_byte = max(cm.figures(a, b).beta_us_per_byte / _link_units(topology, a, b)
                   for a, b in path)
    return float(alpha), float(per_byte)


def _widest_shortest_path(topology: "Topology", src: int, dst: int) -> list[tuple[int, int]]:
    """Links of a path of fewest hops from ``src`` to ``dst`` with the widest bottleneck."""
    n = topology.num_ranks
    hops = [-1] * n
    hops[src] = 0
    queue = deque([src])
    order = []
    while queue:
        u = queue.popleft()
        order.append(u)
        for v in topology.destinations[u]:
            if hops[v] < 0 and _link_units(topology, u, v) > 0:
                hops[v] = hops[u] + 1
                queue.append(v)
    if hops[dst] < 0:
        raise InvalidInstanceError(f"topology {topology.name!r} has no path from rank {src} to "
                                   f"rank {dst}")
    width = [0] * n
    width[src] = 1 << 60
    parent = [-1] * n
    for u in order:  # breadth-first order: every predecessor on a shortest path comes first
        for v in topology.destinations[u]:
            if hops[v] == hops[u] + 1:
                w = min(width[u], _link_units(topology, u, v))
                if w > width[v]:
                    width[v], parent[v] = w, u
    path, v = [], dst
    while v != src:
        path.append((parent[v], v))
        v = parent[v]
    return path[::-1]


# --------------------------------------------------------------------------------------------
# NCCL


class NcclComm:
    """NCCL's ring/tree baseline on each group's induced topology (docs/training.md).

    Parameters
    ----------
    topology:
        Needs ``alpha_us`` and ``unit_gbps``.
    protocols:
        NCCL protocols to consider (default all three).

    Raises
    ------
    InvalidTopologyError
        (When used) if the topology lacks its physical figures.
    """

    def __init__(self, topology: "Topology", *, protocols: Sequence[str] | None = None) -> None:
        from collsynth.runtimes import PROTOCOLS

        self.topology = topology
        self.protocols = tuple(protocols) if protocols is not None else PROTOCOLS
        self._subs: dict[tuple[int, ...], "Topology"] = {}
        self._setups: dict[tuple, "NcclSetup"] = {}
        self._choices: dict[tuple, CommChoice] = {}
        self._model: "CostModel | None" = None
        self._lines: dict[tuple[int, int], tuple[float, float]] = {}

    def __repr__(self) -> str:
        return f"NcclComm({self.topology.name!r})"

    def sub_topology(self, group: Sequence[int]) -> "Topology":
        """The topology a collective over ``group`` runs on (ranks sorted; cached)."""
        key = tuple(sorted(_check_group(self.topology, group)))
        if key not in self._subs:
            whole = len(key) == self.topology.num_ranks
            self._subs[key] = self.topology if whole else induced_topology(self.topology, key)
        return self._subs[key]

    def _setup(self, sub: "Topology") -> "NcclSetup":
        from collsynth.timing.tuning_model import nccl_setup

        signature = topology_signature(sub)
        if signature not in self._setups:
            try:
                self._setups[signature] = nccl_setup(sub)
            except (NoRingError, InvalidTopologyError) as exc:
                raise InvalidInstanceError(
                    f"NCCL baseline on {sub.name}: {exc}; place the group on ranks that form a "
                    "ring (another strategy order or ranks=)") from exc
        return self._setups[signature]

    def choice(self, collective: str, group: Sequence[int], size_bytes: Real) -> CommChoice:
        """NCCL's pick for this call and its time."""
        key = _collective_key(collective)
        ranks = tuple(sorted(_check_group(self.topology, group)))
        if key == "send" and len(ranks) != 2:
            raise InvalidInstanceError(f"send: group {tuple(group)} must be (src, dst)")
        cache_key = (key, tuple(group) if key == "send" else ranks, float(size_bytes))
        if cache_key in self._choices:
            return self._choices[cache_key]
        if len(ranks) == 1:
            result = CommChoice("none (one rank)", 0.0)
        elif key == "send":
            result = CommChoice("p2p", self.send_time_us(group[0], group[1], size_bytes))
        else:
            from collsynth.timing.tuning_model import best_choice, nccl_choices

            setup = self._setup(self.sub_topology(ranks))
            best = best_choice(nccl_choices(setup, key, protocols=self.protocols), size_bytes)
            result = CommChoice(f"nccl {best.name}", best.time_us(size_bytes))
        self._choices[cache_key] = result
        return result

    def send_time_us(self, src: int, dst: int, size_bytes: Real) -> float:
        """:func:`p2p_time_us` on the whole topology."""
        from collsynth.timing.model import cost_model

        if (src, dst) not in self._lines:
            if self._model is None:
                self._model = cost_model(self.topology)
            self._lines[src, dst] = _p2p_line(self.topology, src, dst, self._model)
        alpha, per_byte = self._lines[src, dst]
        return alpha + _check_size(size_bytes) * per_byte

    def time_us(self, collective: str, group: tuple[int, ...], size_bytes: Real) -> float:
        """Microseconds (see :class:`CommModel`)."""
        return self.choice(collective, group, size_bytes).time_us


# --------------------------------------------------------------------------------------------
# Planned


@dataclass(frozen=True)
class _Priced:
    """An algorithm's time as a line ``constant + slope * size_bytes``."""

    name: str
    constant_us: float
    slope_us_per_byte: float

    def time_us(self, size_bytes: float) -> float:
        return self.constant_us + self.slope_us_per_byte * size_bytes


class PlannedComm:
    """The fastest of NCCL, supplied and synthesized collsynth algorithms (docs/training.md).

    Parameters
    ----------
    topology:
        Needs ``alpha_us`` and ``unit_gbps``.
    algorithms:
        :class:`~collsynth.algorithm.Algorithm` objects to consider (each is verified first);
        each is used for the groups whose induced topology has its topology's signature
        (:func:`topology_signature`), for its collective (allreduce, allgather or
        reduce-scatter).
    synthesize:
        Synthesize fronts for small groups (``False``: only NCCL and ``algorithms``).
    max_synthesis_ranks:
        Largest group synthesized for (default 8).
    synthesis_time_s:
        Seconds each front search may take.
    max_part_chunks:
        Largest chunk count of a synthesized allgather / reduce-scatter (the parts of a composed
        allreduce); the direct allreduce search uses ``pareto_front``'s default.
    direct_allreduce:
        Also search allreduce directly (combining schedules), not only as a composition.
    hierarchical:
        Consider the node / cross composition on multi-node groups.
    nccl:
        The NCCL baseline (default ``NcclComm(topology)``).

    Raises
    ------
    VerificationError
        When a supplied algorithm does not implement its collective.
    UnknownNameError
        When a supplied algorithm's collective is not one the simulator prices.
    InvalidInstanceError
        For an option out of range.
    """

    def __init__(self, topology: "Topology", *, algorithms: Iterable["Algorithm"] = (),
                 synthesize: bool = True, max_synthesis_ranks: int = 8,
                 synthesis_time_s: float = 5.0, max_part_chunks: int = 12,
                 direct_allreduce: bool = True, hierarchical: bool = True,
                 nccl: NcclComm | None = None) -> None:
        for name, value in (("max_synthesis_ranks", max_synthesis_ranks),
                            ("max_part_chunks", max_part_chunks)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidInstanceError(f"{name} = {value!r}; expected an integer >= 1")
        if not (isinstance(synthesis_time_s, (int, float)) and synthesis_time_s > 0):
            raise InvalidInstanceError(f"synthesis_time_s = {synthesis_time_s!r}; expected "
                                       "seconds > 0")
        self.topology = topology
        self.nccl = nccl if nccl is not None else NcclComm(topology)
        self.synthesize = synthesize
        self.max_synthesis_ranks = max_synthesis_ranks
        self.synthesis_time_s = float(synthesis_time_s)
        self.max_part_chunks = max_part_chunks
        self.direct_allreduce = direct_allreduce
        self.hierarchical = hierarchical
        from collsynth.algorithm.verify import verify

        self._supplied: dict[tuple, list["Algorithm"]] = {}
        for algorithm in algorithms:
            verify(algorithm)  # trust nothing: replay it before pricing it
            key = (_collective_key(algorithm.collective.name),
                   topology_signature(algorithm.topology))
            self._supplied.setdefault(key, []).append(algorithm)
        self._fronts: dict[tuple, tuple[_Priced, ...]] = {}
        self._choices: dict[tuple, CommChoice] = {}

    def __repr__(self) -> str:
        return f"PlannedComm({self.topology.name!r})"

    def time_us(self, collective: str, group: tuple[int, ...], size_bytes: Real) -> float:
        """Microseconds (see :class:`CommModel`)."""
        return self.choice(collective, group, size_bytes).time_us

    def choice(self, collective: str, group: Sequence[int], size_bytes: Real) -> CommChoice:
        """The fastest option for this call, with a label saying which it is."""
        key = _collective_key(collective)
        ranks = tuple(sorted(_check_group(self.topology, group)))
        if key == "send" or len(ranks) == 1:
            return self.nccl.choice(key, tuple(group), size_bytes)
        cache_key = (key, ranks, float(size_bytes))
        if cache_key in self._choices:
            return self._choices[cache_key]
        size = float(size_bytes)
        options: list[CommChoice] = []
        failure: InvalidInstanceError | None = None
        try:
            options.append(self.nccl.choice(key, ranks, size))
        except InvalidInstanceError as exc:
            _log.debug("no NCCL baseline for %s over %s: %s", key, ranks, exc)
            failure = exc
        for priced in self.front(key, ranks):
            options.append(CommChoice(f"collsynth {priced.name}", priced.time_us(size)))
        hierarchical = self._hierarchical(key, ranks, size)
        if hierarchical is not None:
            options.append(hierarchical)
        if not options:
            raise failure or InvalidInstanceError(f"no way to run {key} over {ranks}")
        result = min(options, key=lambda c: c.time_us)
        self._choices[cache_key] = result
        return result

    def front(self, collective: str, group: Sequence[int]) -> tuple[_Priced, ...]:
        """The collsynth algorithms usable for ``collective`` over ``group``, priced as lines."""
        key = _collective_key(collective)
        sub = self.nccl.sub_topology(group)
        signature = topology_signature(sub)
        cache_key = (key, signature)
        if cache_key not in self._fronts:
            algorithms = list(self._supplied.get(cache_key, ()))
            if self.synthesize and self._synthesizable(group):
                algorithms += self._synthesized(key, sub)
            algorithms = [a for a in algorithms if a.collective.num_ranks == sub.num_ranks]
            self._fronts[cache_key] = tuple(_price(a, sub) for a in algorithms)
        return self._fronts[cache_key]

    def _synthesizable(self, group: Sequence[int]) -> bool:
        if len(group) > self.max_synthesis_ranks:
            return False
        network = _network(self.topology)
        if network is None:
            return True
        per_node = int(network["ranks_per_node"])
        nodes = [r // per_node for r in group]
        return len(set(nodes)) in (1, len(nodes))  # one node, or one rank per node

    def _synthesized(self, key: str, sub: "Topology") -> list["Algorithm"]:
        from collsynth.collective import standard_collective
        from collsynth.synthesis import SolveOptions, SweepLog, pareto_front
        from collsynth.synthesis.strategies import composed_allreduce_front

        n = sub.num_ranks
        options = SolveOptions(time_limit=self.synthesis_time_s)
        collective = standard_collective(key, n)
        found = []
        try:
            if key == "allreduce":
                found += composed_allreduce_front(
                    sub, collective, max_chunks=n * self.max_part_chunks, max_steps=None,
                    options=options, log=SweepLog())
                if self.direct_allreduce:
                    found += pareto_front(sub, collective, options=options)
            else:
                found += pareto_front(sub, collective, max_chunks=self.max_part_chunks,
                                      options=options)
        except SYNTHESIS_FAILURES as exc:
            _log.warning("synthesis of %s on %s failed (%s); using NCCL there", key, sub.name, exc)
        _log.debug("synthesized %d %s algorithm(s) on %s", len(found), key, sub.name)
        return [r.algorithm for r in found if r.algorithm is not None]

    def _hierarchical(self, key: str, ranks: tuple[int, ...], size: float) -> CommChoice | None:
        network = _network(self.topology)
        if not self.hierarchical or network is None:
            return None
        per_node = int(network["ranks_per_node"])
        by_node: dict[int, list[int]] = {}
        for r in ranks:
            by_node.setdefault(r // per_node, []).append(r)
        parts = list(by_node.values())
        c = len(parts[0])
        if len(parts) < 2 or c < 2 or any(len(p) != c for p in parts):
            return None
        cross = [tuple(p[i] for p in parts) for i in range(c)]

        def phase(name: str, groups: Sequence[Sequence[int]], nbytes: float) -> CommChoice:
            return max((self.choice(name, g, nbytes) for g in groups), key=lambda x: x.time_us)

        if key == "allreduce":
            phases = [phase("reduce_scatter", parts, size), phase("allreduce", cross, size / c),
                      phase("allgather", parts, size)]
        elif key == "allgather":
            phases = [phase("allgather", cross, size / c), phase("allgather", parts, size)]
        else:
            phases = [phase("reduce_scatter", parts, size),
                      phase("reduce_scatter", cross, size / c)]
        label = " + ".join(p.name for p in phases)
        return CommChoice(f"hierarchical ({label})", sum(p.time_us for p in phases))


def _price(algorithm: "Algorithm", sub: "Topology") -> _Priced:
    """The algorithm's time on ``sub``'s cost model as ``constant + slope * size``."""
    from collsynth.timing.model import SIZE, cost_model, symbolic_time

    expr = symbolic_time(algorithm, model=cost_model(sub))
    slope = float(expr.coeff(SIZE, 1))
    constant = float(expr.subs(SIZE, 0))
    steps = algorithm.num_steps
    label = f"{steps} step{'s' if steps != 1 else ''}, {algorithm.rounds_per_chunk} rounds/chunk"
    return _Priced(label, constant, slope)
