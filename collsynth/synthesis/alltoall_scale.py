"""Alltoall on large multi-node topologies (hundreds to a thousand GPUs), with a cut lower bound.

Four schedules (direct, hierarchical, rail, routed) are priced exactly; the best (fewest rounds
per chunk, then fewest steps, then fewest chunks) is built as arrays, verified, and returned with
its ratio to a lower bound. The schedules and the cut bound: ``docs/large-systems.md``, section
"Alltoall at scale (collsynth.synthesis.alltoall_scale)".
"""

from __future__ import annotations

import itertools
import logging
import time
from dataclasses import dataclass
from fractions import Fraction
from typing import Sequence

import numpy as np

from collsynth.algorithm.model import Algorithm
from collsynth.collective.model import MAX_CHUNKS
from collsynth.collective.standard import alltoall
from collsynth.errors import InvalidInstanceError, InvalidTopologyError
from collsynth.synthesis.hierarchical import (
    DEFAULT_NODE_TIME_S,
    Capacity,
    best_alltoall,
    build_schedule,
    check_build_fits,
    check_node_algorithm,
    check_time,
    network_layout,
    node_time_limit,
    scaled_rounds,
    solve_node,
)
from collsynth.limits import Deadline
from collsynth.synthesis.result import ScheduleResult
from collsynth.topology.model import Topology

__all__ = ["CutBound", "alltoall_cut_bound", "solve_alltoall_at_scale",
           "EXHAUSTIVE_NODE_RANKS", "EXACT_BOUND_RANKS", "ROUTED_MAX_RANKS"]

_log = logging.getLogger(__name__)

#: Nodes with at most this many ranks have every subset of their ranks tried as a cut.
EXHAUSTIVE_NODE_RANKS = 10
#: Topologies with at most this many ranks also get the exact LP bound (by default).
EXACT_BOUND_RANKS = 16
#: Default most pieces per block the direct schedule tries.
DEFAULT_MAX_CHUNKS = 16
#: Largest topology the routed schedule is built for (it prices ``N**2`` blocks times pieces).
ROUTED_MAX_RANKS = 256


@dataclass(frozen=True)
class CutBound:
    """A lower bound on alltoall rounds per chunk from one cut.

    Attributes
    ----------
    rounds_per_chunk:
        ``blocks / capacity``, exact.
    blocks:
        Blocks that must cross the cut.
    capacity:
        Most chunks that can cross it in one round (an upper bound).
    cut:
        Which cut, in words.
    """

    rounds_per_chunk: Fraction
    blocks: int
    capacity: int
    cut: str


# -- the cut bound -------------------------------------------------------------------------------


def _greedy_capacity(unit_bw: np.ndarray, members: np.ndarray, limits: np.ndarray) -> int:
    """An upper bound on the flow over links of bandwidths ``unit_bw`` when group ``g`` (a row
    of the boolean ``members`` matrix) carries at most ``limits[g]``: groups whose uncovered
    bandwidth exceeds their limit are charged their limit, tightest first; the remaining links
    their bandwidth."""
    unit_bw = np.asarray(unit_bw, dtype=np.int64)
    free = np.ones(len(unit_bw), dtype=bool)
    capacity = 0
    if len(limits) and len(unit_bw):
        weights = members.astype(np.int64)
        while True:
            covered = weights @ (unit_bw * free)
            binding = covered > limits
            if not binding.any():
                break
            candidates = np.flatnonzero(binding)
            # tightest first: the smallest limit / covered (compared exactly by cross-multiplying)
            best = candidates[0]
            for g in candidates[1:]:
                if limits[g] * covered[best] < limits[best] * covered[g]:
                    best = g
            capacity += int(limits[best])
            free &= ~members[best]
    return capacity + int(unit_bw[free].sum())


@dataclass(frozen=True)
class _Composed:
    """The structure :func:`compose_nodes` builds, checked on an actual topology."""

    nodes: int
    n: int
    nic_units: int  # bandwidth of every link between nodes
    node_links: np.ndarray  # n x n
    intra: tuple[tuple[frozenset[int], frozenset[int], int], ...]  # local (sources, dests, limit)
    egress: tuple[tuple[frozenset[int], int], ...]  # local sources -> every other node
    ingress: tuple[tuple[frozenset[int], int], ...]  # every other node -> local destinations


def _composed_structure(topology: Topology) -> _Composed | None:
    """The composed structure of ``topology`` when it has one exactly (identical nodes, uniform
    links between nodes, only node-local, NIC-egress/uplink and NIC-ingress groups); else None."""
    try:
        layout = network_layout(topology)
    except InvalidTopologyError:
        return None
    K, n, total = layout.nodes, layout.ranks_per_node, layout.num_ranks
    links = topology.link_array
    node_of = np.arange(total) // n
    between = node_of[:, None] != node_of[None, :]
    values = np.unique(links[between]) if K > 1 else np.array([0])
    if len(values) != 1 or (K > 1 and values[0] <= 0):
        return None
    everyone = frozenset(range(total))
    outside = [everyone - frozenset(range(k * n, (k + 1) * n)) for k in range(K)]
    tiered = topology.layout is not None and topology.layout.fabric != "switch"
    intra: list[set] = [set() for _ in range(K)]
    egress: list[list] = [[] for _ in range(K)]
    ingress: list[list] = [[] for _ in range(K)]
    for g in topology.groups:
        src_nodes = {r // n for r in g.sources}
        dst_nodes = {r // n for r in g.destinations}
        if len(src_nodes) == 1 and src_nodes == dst_nodes:
            k = next(iter(src_nodes))
            intra[k].add((frozenset(r - k * n for r in g.sources),
                          frozenset(r - k * n for r in g.destinations), g.limit))
        elif len(src_nodes) == 1 and g.destinations == outside[next(iter(src_nodes))]:
            k = next(iter(src_nodes))
            egress[k].append((frozenset(r - k * n for r in g.sources), g.limit))
        elif len(dst_nodes) == 1 and g.sources == outside[next(iter(dst_nodes))]:
            k = next(iter(dst_nodes))
            ingress[k].append((frozenset(r - k * n for r in g.destinations), g.limit))
        elif tiered and not (src_nodes & dst_nodes):
            continue  # a leaf's or rail's group: leaving it out only loosens the bound
        else:
            return None

    def key(items):
        return sorted((sorted(s), limit) for s, limit in items)

    for k in range(1, K):
        if intra[k] != intra[0] or key(egress[k]) != key(egress[0]) or \
                key(ingress[k]) != key(ingress[0]):
            return None
    return _Composed(nodes=K, n=n, nic_units=int(values[0]) if K > 1 else 0,
                     node_links=links[:n, :n].copy(), intra=tuple(intra[0]),
                     egress=tuple(egress[0]), ingress=tuple(ingress[0]))


def _subsets(structure: _Composed) -> list[tuple[int, ...]]:
    """The node-local rank sets tried as cuts."""
    n = structure.n
    if n <= EXHAUSTIVE_NODE_RANKS:
        return [c for size in range(1, n + 1) for c in itertools.combinations(range(n), size)]
    sets = {(r,) for r in range(n)} | {tuple(range(n))}
    for members, _ in structure.egress + structure.ingress:
        sets.add(tuple(sorted(members)))
    sets |= {tuple(sorted(s)) for s, _, _ in structure.intra} | \
        {tuple(sorted(d)) for _, d, _ in structure.intra}
    return sorted(sets)


def _unit_greedy(units: Sequence[int], unit_bw: int, groups) -> int:
    """:func:`_greedy_capacity` when the units are ranks, each worth ``unit_bw``, and each group
    covers the units in its rank set."""
    index = {u: i for i, u in enumerate(units)}
    if not index:
        return 0
    members = np.zeros((len(groups), len(units)), dtype=bool)
    for g, (ranks, _) in enumerate(groups):
        for r in ranks:
            if r in index:
                members[g, index[r]] = True
    limits = np.array([limit for _, limit in groups], dtype=np.int64)
    return _greedy_capacity(np.full(len(units), unit_bw, dtype=np.int64), members, limits)


def _composed_bound(structure: _Composed) -> CutBound:
    K, n, u = structure.nodes, structure.n, structure.nic_units
    total = K * n
    remote = total - n  # ranks on other nodes
    L = structure.node_links
    # covers[g, s, d]: intra-node group g covers the link s -> d
    covers = np.zeros((len(structure.intra), n, n), dtype=bool)
    for g, (sources, destinations, _) in enumerate(structure.intra):
        covers[g][np.ix_(sorted(sources), sorted(destinations))] = True
    limits = np.array([limit for _, _, limit in structure.intra], dtype=np.int64)
    best: CutBound | None = None
    for subset in _subsets(structure):
        inside = np.zeros(n, dtype=bool)
        inside[list(subset)] = True
        size = len(subset)
        blocks = size * (total - size)
        for direction in ("out", "in"):
            # links inside the node that cross the cut, and the node's groups over them
            if direction == "out":
                cross = inside[:, None] & ~inside[None, :] & (L > 0)
            else:
                cross = ~inside[:, None] & inside[None, :] & (L > 0)
            srcs, dsts = np.nonzero(cross)
            intra = _greedy_capacity(L[srcs, dsts], covers[:, srcs, dsts], limits)
            inter = 0
            if K > 1:
                mine, theirs = ((structure.egress, structure.ingress) if direction == "out"
                                else (structure.ingress, structure.egress))
                inter = min(
                    size * remote * u,                                       # the links alone
                    _unit_greedy(subset, remote * u, mine),                  # this node's NICs
                    (K - 1) * _unit_greedy(range(n), size * u, theirs),      # the other nodes'
                )
            capacity = intra + inter
            if capacity == 0:
                continue
            value = Fraction(blocks, capacity)
            if best is None or value > best.rounds_per_chunk:
                where = ("node 0" if size == n else
                         f"rank{'s' if size > 1 else ''} {list(subset)} of node 0")
                arrow = "-> the other ranks" if direction == "out" else "<- the other ranks"
                best = CutBound(value, blocks, capacity,
                                f"{where} {arrow}: {blocks} blocks, at most {capacity} chunks "
                                "per round")
    return best


def _generic_bound(topology: Topology) -> CutBound:
    """Every single rank, out and in, on any topology."""
    total = topology.num_ranks
    capacity = Capacity(topology)
    links = capacity.links
    groups = capacity.groups.tocsc() if capacity.groups is not None else None
    blocks = total - 1
    best: CutBound | None = None
    for rank in range(total):
        for direction in ("out", "in"):
            if direction == "out":
                others = np.flatnonzero(links[rank])
                cols = rank * total + others
            else:
                others = np.flatnonzero(links[:, rank])
                cols = others * total + rank
            bw = links.ravel()[cols]
            if groups is not None and len(cols):
                sub = groups[:, cols].tocsr()
                rows = np.flatnonzero(np.diff(sub.indptr))
                members = sub[rows].toarray() > 0
                cap = _greedy_capacity(bw, members, capacity.limits[rows])
            else:
                cap = int(bw.sum())
            if cap == 0 or blocks == 0:
                continue
            value = Fraction(blocks, cap)
            if best is None or value > best.rounds_per_chunk:
                arrow = "->" if direction == "out" else "<-"
                best = CutBound(value, blocks, cap, f"rank {rank} {arrow} the other ranks: "
                                f"{blocks} blocks, at most {cap} chunks per round")
    return best if best is not None else CutBound(Fraction(0), 0, 0, "nothing moves")


def alltoall_cut_bound(topology: Topology) -> CutBound:
    """The best cut lower bound on alltoall rounds per chunk (see docs/large-systems.md).

    Sound for every algorithm in collsynth's model; never above
    :func:`~collsynth.bounds.rounds_per_chunk_lower_bound`.

    Examples
    --------
    Two DGX A100s: each node's 64 blocks for the other node leave through 8 NICs of one unit:

    >>> from collsynth.topology import compose_nodes, get_topology
    >>> bound = alltoall_cut_bound(compose_nodes(get_topology("dgx-a100"), 2))
    >>> bound.rounds_per_chunk, bound.cut
    (Fraction(8, 1), 'node 0 -> the other ranks: 64 blocks, at most 8 chunks per round')
    >>> alltoall_cut_bound(get_topology("ring:4")).rounds_per_chunk
    Fraction(3, 2)
    """
    structure = _composed_structure(topology)
    bound = _composed_bound(structure) if structure is not None else None
    if bound is None:
        bound = _generic_bound(topology)
    leaf = _leaf_bound(topology)
    if leaf is not None and leaf.rounds_per_chunk > bound.rounds_per_chunk:
        return leaf
    return bound


def _leaf_bound(topology: Topology) -> CutBound | None:
    """The cut around each leaf switch of a leaf-spine fabric (only leaf 0 when the leaf shift
    is a symmetry), out and in; ``None`` without leaves. Its capacity is covered by groups that
    hold every link across the cut from some of the leaf's ranks (the leaf's uplink, the NICs),
    the other ranks by their links: an upper bound, so the bound is sound."""
    from collsynth.graph.symmetry import node_shift

    layout = topology.layout
    if layout is None or layout.fabric != "leaf-spine" or not layout.nodes_per_leaf \
            or layout.nodes_per_leaf >= layout.nodes:
        return None
    total, width = topology.num_ranks, layout.nodes_per_leaf * layout.ranks_per_node
    leaves = 1 if node_shift(topology) is not None else layout.nodes // layout.nodes_per_leaf
    links = topology.link_array
    best: CutBound | None = None
    for leaf in range(leaves):
        inside = frozenset(range(leaf * width, (leaf + 1) * width))
        outside = frozenset(range(total)) - inside
        blocks = width * (total - width)
        mask = np.zeros(total, dtype=bool)
        mask[list(inside)] = True
        for direction in ("out", "in"):
            if direction == "out":
                per_rank = links[mask][:, ~mask].sum(axis=1)
                covers = [(g.sources, g.limit) for g in topology.groups
                          if len(g.sources) <= width and len(g.destinations) >= total - width
                          and g.sources <= inside and outside <= g.destinations]
            else:
                per_rank = links[~mask][:, mask].sum(axis=0)
                covers = [(g.destinations, g.limit) for g in topology.groups
                          if len(g.destinations) <= width and len(g.sources) >= total - width
                          and g.destinations <= inside and outside <= g.sources]
            bandwidth = dict(zip(sorted(inside), per_rank.tolist()))
            capacity, free = 0, set(inside)
            # cheapest per rank first; a group whose ranks are partly taken is skipped
            for ranks, limit in sorted(covers, key=lambda c: Fraction(c[1], len(c[0]))):
                if ranks <= free and limit < sum(bandwidth[r] for r in ranks):
                    capacity += limit
                    free -= ranks
            capacity += sum(bandwidth[r] for r in free)
            if capacity <= 0:
                continue
            value = Fraction(blocks, capacity)
            if best is None or value > best.rounds_per_chunk:
                arrow = "-> the other ranks" if direction == "out" else "<- the other ranks"
                best = CutBound(value, blocks, capacity,
                                f"leaf {leaf} ({width} ranks) {arrow}: {blocks} blocks, at most "
                                f"{capacity} chunks per round")
    return best


# -- schedules -----------------------------------------------------------------------------------


def _all_pairs(total: int) -> tuple[np.ndarray, np.ndarray]:
    src = np.repeat(np.arange(total, dtype=np.int64), total)
    dst = np.tile(np.arange(total, dtype=np.int64), total)
    keep = src != dst
    return src[keep], dst[keep]


def _direct_pieces(loads: np.ndarray, caps: np.ndarray, max_chunks: int,
                   target: Fraction) -> tuple[int, int]:
    """``(pieces, rounds)``: the fewest pieces per block up to ``max_chunks`` reaching the fewest
    rounds per chunk of a one-step direct schedule (stopping early at ``target``)."""
    best = None
    for pieces in range(1, max_chunks + 1):
        rounds = max(1, scaled_rounds(loads, caps, pieces))
        value = Fraction(rounds, pieces)
        if best is None or value < best[0]:
            best = (value, pieces, rounds)
        if value <= target:
            break
    return best[1], best[2]


def _routed_paths(links: np.ndarray, pieces: int) -> list[tuple[np.ndarray, ...]]:
    """Hop ``t`` of every piece: ``(chunk, piece, src, dst)`` arrays, one tuple per hop.

    Piece ``j`` of block ``(s, d)`` moves from ``u`` to the ``k``-th neighbour (in rank order)
    that is one hop closer to ``d``, ``k = (j + s + d) mod (how many there are)``: a shortest
    path, and the pieces of a block take different ones where there is a choice."""
    from scipy.sparse import csr_matrix
    from scipy.sparse.csgraph import shortest_path

    n = len(links)
    dist = shortest_path(csr_matrix((links > 0).astype(np.int8)), unweighted=True)
    if not np.isfinite(dist).all():
        raise InvalidTopologyError("alltoall: some rank cannot reach another over the links")
    dist = dist.astype(np.int64)
    width = int((links > 0).sum(axis=1).max())
    neighbours = np.full((n, width), -1, dtype=np.int64)
    for u in range(n):
        peers = np.flatnonzero(links[u])
        neighbours[u, :len(peers)] = peers
    src, dst = _all_pairs(n)
    s, d = np.repeat(src, pieces), np.repeat(dst, pieces)
    j = np.tile(np.arange(pieces, dtype=np.int64), len(src))
    chunk = (s * n + d) * pieces + j
    at, hops = s.copy(), []
    while True:
        live = np.flatnonzero(at != d)
        if not len(live):
            return hops
        u, target = at[live], d[live]
        cand = neighbours[u]
        closer = (cand >= 0) & (dist[np.maximum(cand, 0), target[:, None]]
                                == (dist[u, target] - 1)[:, None])
        k = (j[live] + s[live] + target) % closer.sum(axis=1)
        pick = np.argmax(np.cumsum(closer, axis=1) == (k + 1)[:, None], axis=1)
        nxt = cand[np.arange(len(live)), pick]
        hops.append((chunk[live], j[live], u, nxt))
        at[live] = nxt


def _rail_paths(nodes: int, per_node: int, pieces: int) -> list[tuple[np.ndarray, ...]]:
    """Hops of the rail schedule, as :func:`_routed_paths`: a block from rank ``(X, l)`` to
    rank ``(Y, m)`` of another node first moves inside node ``X`` to ``(X, m)``, on the rail of
    its destination (unless ``l == m``), then crosses between the nodes on that rail. Blocks
    within a node go straight."""
    n = nodes * per_node
    src, dst = _all_pairs(n)
    s, d = np.repeat(src, pieces), np.repeat(dst, pieces)
    j = np.tile(np.arange(pieces, dtype=np.int64), len(src))
    chunk = (s * n + d) * pieces + j
    relay = (s // per_node) * per_node + d % per_node  # (X, m): same node as s, rail of d
    first = np.where((relay == s) | (s // per_node == d // per_node), d, relay)
    hops = [(chunk, j, s, first)]
    later = np.flatnonzero(first != d)
    if len(later):
        hops.append((chunk[later], j[later], first[later], d[later]))
    return hops


def _routed(capacity: Capacity, max_pieces: int, paths=None, deadline: Deadline | None = None):
    """``(key, steps, step rounds, pieces)`` of the best routed schedule tried, ``key`` =
    ``(rounds per chunk, steps, pieces)``; ``paths(pieces)`` gives the hops (default: shortest
    paths, :func:`_routed_paths`). Once ``deadline`` has passed, or when the next piece count
    (twice the sends of the last, so about twice its time) would overrun it, the best tried so
    far."""
    best = None
    pieces = 1
    last_s = 0.0
    while pieces <= max_pieces:
        if best is not None and deadline is not None and \
                (deadline.expired() or 2 * last_s > deadline.remaining()):
            break
        tick = time.perf_counter()
        hops = _routed_paths(capacity.links, pieces) if paths is None else paths(pieces)
        # hop by hop: step t = hop t
        groupings = [[(c, u, v, np.zeros(len(c), dtype=bool)) for c, _, u, v in hops]]
        if pieces > 1:  # pipelined: piece j's hop t in step j + t
            step = np.concatenate([j + t for t, (_, j, _, _) in enumerate(hops)])
            cat = [np.concatenate([h[i] for h in hops]) for i in (0, 2, 3)]
            order = np.argsort(step, kind="stable")
            step, cat = step[order], [a[order] for a in cat]
            cuts = np.flatnonzero(np.diff(step)) + 1
            groupings.append([(c, u, v, np.zeros(len(c), dtype=bool)) for c, u, v in
                              zip(*(np.split(a, cuts) for a in cat))])
        for steps in groupings:
            rounds = [max(1, scaled_rounds(*capacity.demand(u, v), 1)) for _, u, v, _ in steps]
            key = (Fraction(sum(rounds), pieces), len(steps), pieces)
            if best is None or key < best[0]:
                best = (key, steps, rounds, pieces)
        last_s = time.perf_counter() - tick
        pieces *= 2
    return best


def _nodes_complete(links: np.ndarray, per_node: int) -> bool:
    """True when every two ranks of a node have a link (the rail schedule's first hop)."""
    n = len(links)
    same = (np.arange(n)[:, None] // per_node) == (np.arange(n)[None, :] // per_node)
    np.fill_diagonal(same, False)
    return bool((links[same] > 0).all())


def solve_alltoall_at_scale(topology: Topology, *, time_limit: float | None = None,
                            max_chunks: int = DEFAULT_MAX_CHUNKS,
                            exact_bound: bool | None = None,
                            node_algorithm: Algorithm | None = None,
                            deadline: Deadline | None = None) -> ScheduleResult:
    """A verified alltoall for a large topology, the best of the direct and hierarchical
    schedules (see docs/large-systems.md), with its ratio to a lower bound.

    Returns a :class:`~collsynth.synthesis.result.ScheduleResult` of engine ``"alltoall"``
    whose ``details`` hold ``schedule``, ``cut_bound``, ``exact_bound`` and ``candidates``.

    Parameters
    ----------
    topology:
        Any topology; the direct schedule needs a link between every pair of ranks, the
        hierarchical one a composed topology (:func:`~collsynth.topology.compose_nodes`).
    time_limit:
        Seconds for synthesising the node alltoall of the hierarchical schedule (default
        :data:`~collsynth.synthesis.hierarchical.DEFAULT_NODE_TIME_S`). The direct schedule and
        the bound take no solver time.
    max_chunks:
        Most pieces per block the schedules try (the hierarchical one keeps at least the pieces
        of its node algorithm).
    exact_bound:
        Also compute the LP bound (:func:`~collsynth.bounds.rounds_per_chunk_lower_bound`);
        default: for topologies of at most :data:`EXACT_BOUND_RANKS` ranks.
    node_algorithm:
        The alltoall to run inside each node for the hierarchical schedule (default:
        synthesised, the bandwidth-best Pareto point).
    deadline:
        A wall-clock budget for the whole call (:class:`~collsynth.synthesis.result.Deadline`):
        the node synthesis gets at most what is left of it; once it has passed, the schedules
        priced so far compete and the best is built, and a schedule kind not yet tried is
        skipped. ``None``: no budget beyond ``time_limit``.

    Raises
    ------
    InvalidTopologyError
        When neither schedule applies (links missing between ranks of a topology that was not
        composed from nodes).
    InvalidInstanceError
        For ``max_chunks < 1``.
    SolverError
        When the hierarchical schedule is the only one and no node alltoall is found in time.
    TimeLimitReached
        When ``deadline`` passes before any schedule is priced.
    ResourceLimitError
        When what is left of ``deadline`` cannot cover building and verifying the schedule.

    Examples
    --------
    >>> from collsynth.topology import compose_nodes, get_topology
    >>> result = solve_alltoall_at_scale(compose_nodes(get_topology("ring:4"), 2, nic_units=1))
    >>> result.details["schedule"], result.rounds_per_chunk, result.lower_bound, result.ratio
    ('hierarchical', Fraction(4, 1), Fraction(4, 1), Fraction(1, 1))
    >>> solve_alltoall_at_scale(get_topology("hub:4")).rounds_per_chunk
    Fraction(3, 1)
    """
    started = time.perf_counter()
    if not isinstance(max_chunks, int) or isinstance(max_chunks, bool) or max_chunks < 1:
        raise InvalidInstanceError(f"max_chunks = {max_chunks!r}; expected a positive integer")
    total = topology.num_ranks
    node_time = DEFAULT_NODE_TIME_S if time_limit is None else time_limit
    cut = alltoall_cut_bound(topology)
    check_time(deadline, "computing the alltoall cut bound")
    exact = None
    if exact_bound or (exact_bound is None and total <= EXACT_BOUND_RANKS):
        from collsynth.bounds import rounds_per_chunk_lower_bound

        exact = rounds_per_chunk_lower_bound(topology, alltoall(total))
    bound = max(cut.rounds_per_chunk, exact) if exact is not None else cut.rounds_per_chunk
    check_time(deadline, "computing the alltoall bounds")

    def out_of_time() -> bool:  # a schedule is in hand and the deadline has passed
        return best is not None and deadline is not None and deadline.expired()

    capacity = Capacity(topology)
    chunk_cap = max(1, min(max_chunks, MAX_CHUNKS // max(1, total * total)))

    candidates: list[tuple[str, Fraction, int, int]] = []
    best = None  # (key, schedule, steps arrays, rounds, pieces)
    links = capacity.links
    if total == 1 or (links + np.eye(total, dtype=np.int64) > 0).all():
        src, dst = _all_pairs(total)
        if len(src):
            loads, caps = capacity.demand(src, dst)
            pieces, rounds = _direct_pieces(loads, caps, chunk_cap, bound)
            j = np.arange(pieces, dtype=np.int64)
            chunk = ((src * total + dst)[:, None] * pieces + j[None, :]).ravel()
            arrays = (chunk, np.repeat(src, pieces), np.repeat(dst, pieces),
                      np.zeros(len(chunk), dtype=bool))
            steps, step_rounds = [arrays], [rounds]
        else:
            pieces, steps, step_rounds = 1, [], []
        value = Fraction(sum(step_rounds), pieces)
        candidates.append(("direct", value, len(steps), pieces))
        best = ((value, len(steps), pieces), "direct", steps, step_rounds, pieces)

    layout = topology.layout
    if layout is not None and layout.fabric == "rail" and layout.multi_node and \
            (best is None or best[0][0] > bound) and not out_of_time() and \
            _nodes_complete(links, layout.ranks_per_node):
        # Between rails the spines may be oversubscribed: change rails inside the node first.
        key, steps, step_rounds, pieces = _routed(
            capacity, min(chunk_cap, 8),
            lambda p: _rail_paths(layout.nodes, layout.ranks_per_node, p), deadline)
        candidates.append(("rail", key[0], len(steps), pieces))
        if best is None or key < best[0]:
            best = (key, "rail", steps, step_rounds, pieces)

    if (best is None or best[0][0] > bound) and not out_of_time():
        try:
            layout = network_layout(topology)
        except InvalidTopologyError:
            layout = None
        if layout is not None:
            if node_algorithm is None:
                node = solve_node(layout.node, alltoall(layout.ranks_per_node), node_time_limit(
                    node_time, deadline, "synthesising the node alltoall"))
            else:
                node = check_node_algorithm(node_algorithm, layout.node,
                                             alltoall(layout.ranks_per_node), "alltoall")
            check_time(deadline, "pricing the hierarchical alltoall")
            steps, step_rounds, pieces, _ = best_alltoall(
                capacity, layout.nodes, layout.ranks_per_node, node,
                max_refine=max(1, max_chunks // node.chunks), deadline=deadline)
            value = Fraction(sum(step_rounds), pieces)
            candidates.append(("hierarchical", value, len(steps), pieces))
            key = (value, len(steps), pieces)
            if best is None or key < best[0]:
                best = (key, "hierarchical", steps, step_rounds, pieces)
        elif best is None:
            if total > ROUTED_MAX_RANKS:
                raise InvalidTopologyError(
                    f"topology {topology.name!r}: alltoall at scale needs a link between every "
                    "pair of ranks (direct), a topology composed from nodes (hierarchical), or "
                    f"at most {ROUTED_MAX_RANKS} ranks (routed)")
            check_time(deadline, "routing the alltoall")
            key, steps, step_rounds, pieces = _routed(capacity, chunk_cap, deadline=deadline)
            candidates.append(("routed", key[0], len(steps), pieces))
            best = (key, "routed", steps, step_rounds, pieces)

    (value, _, _), schedule, steps, step_rounds, pieces = best
    # A schedule short of the bound when the deadline had passed: some candidate may have been
    # skipped or cut short.
    stopped = "time_limit" if value > bound and deadline is not None and deadline.expired() \
        else None
    check_build_fits(deadline, chunks=total * total * pieces, ranks_per_chunk=1,
                      sends=sum(len(s[0]) for s in steps),
                      what=f"the {schedule} alltoall on {topology.name}")
    algorithm = build_schedule(f"alltoall-{schedule}-{topology.name}", topology,
                       alltoall(total).split(pieces), steps, step_rounds,
                       {"strategy": f"alltoall at scale ({schedule})", "cut_bound": cut.cut})
    value = algorithm.rounds_per_chunk
    _log.info("alltoall on %s: %s, %s rounds per chunk, bound %s (%s)", topology.name, schedule,
              value, bound, cut.cut)
    return ScheduleResult(algorithm=algorithm, engine="alltoall", rounds_per_chunk=value,
                          steady_state_rounds_per_chunk=value, lower_bound=bound,
                          seconds=time.perf_counter() - started,
                          details={"schedule": schedule, "cut_bound": cut, "exact_bound": exact,
                                   "candidates": tuple(candidates)},
                          complete=stopped is None, stopped_by=stopped)
