"""The optimal throughput of broadcast-like collectives, exactly, from cuts of the fabric.

The details: ``docs/bounds.md``, section "The optimal throughput on a switch fabric".
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import scipy.sparse as sp
from scipy.sparse.csgraph import breadth_first_order, maximum_flow

from collsynth.collective.duality import has_non_combining_dual, non_combining_dual
from collsynth.collective.model import Collective
from collsynth.collective.standard import allgather, is_standard_allreduce, reduce_scatter
from collsynth.errors import InvalidCollectiveError, SolverError, UnimplementableError, expect_type
from collsynth.graph.fabric import INFINITE, Fabric, build_fabric, composed_quotient
from collsynth.graph.symmetry import node_shift, rank_orbits
from collsynth.topology.model import Topology

__all__ = ["Throughput", "optimal_throughput", "tree_rounds", "fabric_rounds", "roots_of",
           "broadcast_shape"]

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Throughput:
    """The optimal rounds per base chunk and a set of ranks whose cut attains it.

    ``rounds_per_chunk`` is per base chunk of the collective as given (for allreduce, the whole
    buffer: ``(reduce-scatter + allgather) / n``, the optimum of algorithms made of a
    reduce-scatter then an allgather). ``bottleneck`` lists the ranks inside the tightest cut (for
    allreduce, the allgather's).
    """

    rounds_per_chunk: Fraction
    bottleneck: tuple[int, ...]
    method: str


def broadcast_shape(collective: Collective) -> dict[int, int] | None:
    """``{root: chunks}`` when every chunk starts on one rank and must reach every other rank
    (allgather, broadcast, multi-root broadcast), else ``None``."""
    if collective.combining:
        return None
    n = collective.num_ranks
    roots: dict[int, int] = {}
    for pre, post in zip(collective.precondition, collective.postcondition):
        # len(post) == n (every rank) spares a union of n ranks per chunk.
        if len(pre) != 1 or (len(post) != n and len(pre | post) != n):
            return None
        root = next(iter(pre))
        roots[root] = roots.get(root, 0) + 1
    return roots


def roots_of(collective: Collective) -> dict[int, int]:
    """Like :func:`broadcast_shape` but raising a clear error for other collectives."""
    roots = broadcast_shape(collective)
    if roots is None:
        raise InvalidCollectiveError(
            f"{collective.describe()}: the tree engine needs every chunk to start on one rank and "
            "reach every other rank (allgather, broadcast) or the dual of that (reduce-scatter, "
            "reduce); allreduce is handled as reduce-scatter + allgather")
    return roots


def tree_rounds(fabric: Fabric, roots: dict[int, int], *,
                representatives: np.ndarray | None = None) -> tuple[Fraction, tuple[int, ...]]:
    """``R*`` (see docs/bounds.md) on ``fabric`` for chunks ``{root: count}``.

    ``representatives`` are the ranks whose cuts are tested (default: every rank); pass one rank
    per orbit of a symmetry of the fabric that maps the roots' chunk counts to themselves.
    """
    n, total_vertices = fabric.num_ranks, fabric.num_vertices
    chunks = np.zeros(total_vertices, dtype=np.int64)
    for root, count in roots.items():
        chunks[root] = count
    total = int(chunks.sum())
    candidates = np.arange(n) if representatives is None else np.asarray(representatives)
    _check_reachable(fabric, roots)
    incoming = np.bincount(fabric.dst, weights=fabric.cap, minlength=total_vertices).astype(np.int64)
    best, best_cut = Fraction(0), ()
    for v in candidates:
        if total > chunks[v]:
            ratio = Fraction(total - int(chunks[v]), int(incoming[v]))
            if ratio > best:
                best, best_cut = ratio, (int(v),)
    root_list = np.flatnonzero(chunks)
    rows = np.concatenate([fabric.src, np.full(len(root_list), total_vertices)])
    cols = np.concatenate([fabric.dst, root_list])
    small = fabric.num_arcs + len(root_list) <= _SMALL_ARCS and total_vertices < _SMALL_VERTICES
    while True:
        p, q = best.numerator, best.denominator
        if small:
            # Exact integers of any size (a quotient's capacities are sums over many nodes).
            huge = q * total + 1  # more than any cut that matters
            arc_caps = [huge if c >= INFINITE else p * c for c in fabric.cap.tolist()]
            capacities = arc_caps + [q * int(c) for c in chunks[root_list]]

            def min_cut(v: int) -> tuple[int, np.ndarray]:
                return small_max_flow(total_vertices + 1, rows, cols, capacities,
                                       total_vertices, v)
        else:
            # Arcs that are not limits (between regions) stay effectively infinite when clamped;
            # any real capacity or chunk count must fit the 32-bit solver exactly.
            arc_caps = np.where(fabric.cap >= INFINITE, 2 ** 31 - 1, p * fabric.cap)
            if q * total >= 2 ** 31 or (p * fabric.cap[fabric.cap < INFINITE]).max(initial=0) \
                    >= 2 ** 31:
                raise SolverError("the throughput ratio is too large for the 32-bit maximum-flow "
                                  "solver")
            graph = sp.csr_matrix(
                (np.concatenate([arc_caps, q * chunks[root_list]]).astype(np.int32),
                 (rows, cols)), shape=(total_vertices + 1, total_vertices + 1))

            def min_cut(v: int) -> tuple[int, np.ndarray]:
                result = maximum_flow(graph, total_vertices, v)
                return result.flow_value, _reached(graph, result.flow, total_vertices)
        improved, improved_cut = None, ()
        for v in candidates:
            value, reached = min_cut(int(v))
            if value >= q * total:
                continue
            inside = ~reached[:total_vertices]
            needed = total - int(chunks[inside].sum())
            crossing = inside[fabric.dst] & ~inside[fabric.src]
            capacity = int(fabric.cap[crossing].sum())
            if capacity <= 0:
                raise SolverError("a cut with ranks that need chunks has no incoming capacity")
            ratio = Fraction(needed, capacity)
            if improved is None or ratio > improved:
                improved = ratio
                improved_cut = tuple(int(r) for r in np.flatnonzero(inside[:n]))
        if improved is None:
            return best, best_cut
        if improved <= best:
            raise SolverError("the throughput iteration failed to improve; maximum flow is "
                              "inconsistent")
        best, best_cut = improved, improved_cut


#: Up to this many arcs and vertices (a quotient, a small system) maximum flows run in exact
#: Python integers; the vertices bound the depth of its recursive search.
_SMALL_ARCS = 4096
_SMALL_VERTICES = 512


def small_max_flow(num_vertices: int, src: np.ndarray, dst: np.ndarray, cap: list[int],
                    source: int, sink: int) -> tuple[int, np.ndarray]:
    """Dinic's maximum flow on a small graph, in Python integers (no 32-bit limit): the flow's
    value and the vertices reachable from ``source`` in the residual graph (a minimum cut)."""
    head: list[list[int]] = [[] for _ in range(num_vertices)]
    to: list[int] = []
    residual: list[int] = []
    for a, b, c in zip(src.tolist(), dst.tolist(), cap):
        head[a].append(len(to))
        to.append(b)
        residual.append(c)
        head[b].append(len(to))
        to.append(a)
        residual.append(0)

    def levels() -> list[int]:
        level = [-1] * num_vertices
        level[source] = 0
        queue = deque([source])
        while queue:
            u = queue.popleft()
            for e in head[u]:
                if residual[e] > 0 and level[to[e]] < 0:
                    level[to[e]] = level[u] + 1
                    queue.append(to[e])
        return level

    def push(u: int, limit: int, level: list[int], cursor: list[int]) -> int:
        if u == sink:
            return limit
        while cursor[u] < len(head[u]):
            e = head[u][cursor[u]]
            v = to[e]
            if residual[e] > 0 and level[v] == level[u] + 1:
                sent = push(v, min(limit, residual[e]), level, cursor)
                if sent:
                    residual[e] -= sent
                    residual[e ^ 1] += sent
                    return sent
            cursor[u] += 1
        return 0

    value = 0
    while True:
        level = levels()
        if level[sink] < 0:
            return value, np.asarray(level) >= 0
        cursor = [0] * num_vertices
        while True:
            sent = push(source, sum(residual[e] for e in head[source]), level, cursor)
            if not sent:
                break
            value += sent


def _reached(graph: sp.csr_matrix, flow: sp.csr_matrix, source: int) -> np.ndarray:
    """Vertices reachable from ``source`` in the residual graph."""
    residual = (graph.astype(np.int64) - flow.astype(np.int64)).tocsr()
    residual.data = (residual.data > 0).astype(np.int8)
    residual.eliminate_zeros()
    order = breadth_first_order(residual, source, directed=True, return_predecessors=False)
    reached = np.zeros(graph.shape[0], dtype=bool)
    reached[order] = True
    return reached


def _check_reachable(fabric: Fabric, roots: dict[int, int]) -> None:
    graph = sp.csr_matrix((np.ones(fabric.num_arcs, np.int8), (fabric.src, fabric.dst)),
                          shape=(fabric.num_vertices, fabric.num_vertices))
    # One root reaching every rank and reached by every rank covers all the roots (through it):
    # two searches instead of one per root. Otherwise find the pair that fails, root by root.
    first = next(iter(roots))
    forward = breadth_first_order(graph, first, directed=True, return_predecessors=False)
    backward = breadth_first_order(graph.T.tocsr(), first, directed=True,
                                   return_predecessors=False)
    if (np.count_nonzero(forward < fabric.num_ranks) == fabric.num_ranks
            and np.count_nonzero(backward < fabric.num_ranks) == fabric.num_ranks):
        return
    for root in roots:
        order = breadth_first_order(graph, root, directed=True, return_predecessors=False)
        reached = np.zeros(fabric.num_vertices, bool)
        reached[order] = True
        if not reached[:fabric.num_ranks].all():
            missing = int(np.flatnonzero(~reached[:fabric.num_ranks])[0])
            raise UnimplementableError(f"rank {missing} cannot be reached from rank {root}",
                                       rank=missing, chunk=root)


def node_representatives(topology: Topology) -> np.ndarray | None:
    """The ranks of node 0 when ``topology`` is ``K`` copies of a node whose shift by one node is
    a symmetry (checked on links and groups), else ``None``."""
    shift = node_shift(topology)
    return None if shift is None else np.arange(shift.ranks_per_node)


def fabric_rounds(topology: Topology, roots: dict[int, int]) -> tuple[Fraction, tuple[int, ...]]:
    """:func:`tree_rounds` on the fabric of ``topology``, testing only node 0's ranks when every
    rank roots the same number of chunks and the node shift is a symmetry; for a topology stored
    sparsely, on its :func:`~collsynth.graph.fabric.composed_quotient` (a few nodes' size).

    Raises
    ------
    UnsupportedFabricError
        As :func:`~collsynth.graph.fabric.build_fabric`.
    """
    uniform = len(roots) == topology.num_ranks and len(set(roots.values())) == 1
    quotient = composed_quotient(topology) if uniform else None
    if quotient is not None:
        # The node permutations fixing node 0 fix its ranks and every rank's chunk count, so
        # the cuts to node 0's ranks are those of the quotient (composed_quotient).
        count = next(iter(roots.values()))
        folded = {r: int(m) * count for r, m in enumerate(quotient.multiplicity)}
        rounds, cut = tree_rounds(quotient.fabric, folded,
                                  representatives=np.arange(quotient.ranks_per_node))
        return rounds, tuple(quotient.unfold(np.asarray(cut, np.int64)).tolist())
    fabric = build_fabric(topology)
    representatives = node_representatives(topology) if uniform else None
    if uniform and representatives is None and _rotation_is_symmetry(topology):
        representatives = np.arange(1)  # every rank is rank 0 rotated: one cut family to test
    if representatives is None and topology.num_ranks >= 64:
        # One rank per orbit of the symmetries of the links, the groups and the chunk counts:
        # a broadcast on hub:1024 tested 1024 cuts of a million arcs each (minutes); the
        # root's and one other rank's suffice.
        counts = np.zeros(topology.num_ranks, dtype=np.int64)
        for root, count in roots.items():
            counts[root] = count
        labels = rank_orbits(topology, counts, groups=True)
        representatives = np.unique(labels, return_index=True)[1]
    return tree_rounds(fabric, roots, representatives=representatives)


def _rotation_is_symmetry(topology: Topology) -> bool:
    """Whether ``r -> r + 1 mod n`` maps the links and the groups to themselves (rings, hubs,
    fully connected graphs): then, with one chunk count per rank, one rank's cuts are all of
    them (the n rotations act transitively). A cheap test, worth it where every cut costs a
    maximum flow over n**2 arcs."""
    n = topology.num_ranks
    if n < 64:
        return False  # testing every rank is cheap
    links = topology.link_array
    if not np.array_equal(np.roll(links, (1, 1), axis=(0, 1)), links):
        return False
    groups = {(g.sources, g.destinations, g.limit) for g in topology.groups}
    for sources, destinations, limit in groups:
        image = (frozenset((r + 1) % n for r in sources),
                 frozenset((r + 1) % n for r in destinations), limit)
        if image not in groups:
            return False
    return True


def optimal_throughput(topology: Topology, collective: Collective) -> Throughput:
    """The optimal rounds per base chunk of ``collective`` on ``topology`` (exact).

    Allgather, broadcast and multi-root broadcast directly; reduce-scatter and reduce as those on
    the reversed topology; allreduce as reduce-scatter + allgather. The collective may be split
    (``chunk_factor``): the result is per base chunk either way.

    Raises
    ------
    UnsupportedFabricError
        When the topology's bandwidth groups have a shape the fabric cannot express (use
        :func:`collsynth.bounds.rounds_per_chunk_lower_bound`).
    InvalidCollectiveError
        For other collectives.

    Examples
    --------
    On a 4-GPU bidirectional ring, allgather needs 3/2 rounds per chunk (3 chunks over 2 links):

    >>> from collsynth.topology import get_topology
    >>> from collsynth.collective import standard_collective
    >>> optimal_throughput(get_topology("ring:4"), standard_collective("allgather", 4)).rounds_per_chunk
    Fraction(3, 2)
    >>> optimal_throughput(get_topology("ring:4"), standard_collective("allreduce", 4)).rounds_per_chunk
    Fraction(3, 4)
    """
    expect_type(topology, Topology, "optimal_throughput: topology")
    expect_type(collective, Collective, "optimal_throughput: collective")

    if collective.num_ranks != topology.num_ranks:
        raise InvalidCollectiveError(f"{collective.describe()} has {collective.num_ranks} ranks but "
                                     f"{topology.name!r} has {topology.num_ranks}")
    factor = collective.chunk_factor
    if is_standard_allreduce(collective):
        n = topology.num_ranks
        rs = optimal_throughput(topology, reduce_scatter(n))
        ag = optimal_throughput(topology, allgather(n))
        return Throughput((rs.rounds_per_chunk + ag.rounds_per_chunk) / n, ag.bottleneck,
                          "reduce-scatter + allgather")
    if collective.combining:
        if not has_non_combining_dual(collective):
            raise InvalidCollectiveError(f"{collective.describe()}: no non-combining dual")
        dual = optimal_throughput(topology.reversed(), non_combining_dual(collective))
        return Throughput(dual.rounds_per_chunk, dual.bottleneck, dual.method + " (dual)")
    rounds, cut = fabric_rounds(topology, roots_of(collective))
    return Throughput(rounds / factor, cut, "fabric maximum flow")
