"""Steps and rounds-per-chunk lower bounds for any topology (see docs/bounds.md).

Bounds are exact (``int`` or :class:`~fractions.Fraction`) and sound for the class of algorithms
each function states; a rounds bound is per base chunk, so splitting does not change it.

>>> from collsynth.topology import get_topology
>>> from collsynth.collective import standard_collective
>>> compute_bounds(get_topology("ring:4"), standard_collective("allgather", 4))
Bounds(steps=2, rounds_per_chunk=Fraction(3, 2), composed_rounds_per_chunk=None, composed_steps=None)
"""

from __future__ import annotations

import heapq
import logging
import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Callable, Iterable, Literal, Sequence

import numpy as np
import scipy.sparse as sp
from scipy.optimize import linprog
from scipy.sparse.csgraph import connected_components, dijkstra, maximum_flow

from collsynth.collective.duality import has_non_combining_dual, non_combining_dual
from collsynth.collective.model import Collective
from collsynth.errors import (
    InputTooLargeError,
    InvalidCollectiveError,
    SolverError,
    UnimplementableError,
    UnknownNameError,
    expect_type,
)
from collsynth.bounds.throughput import small_max_flow, broadcast_shape, fabric_rounds
from collsynth.graph.fabric import (INFINITE, UnsupportedFabricError, build_fabric,
                                    composed_quotient)
from collsynth.graph.arborescence import min_arborescence_cost
from collsynth.graph.symmetry import candidate_permutations, node_shift, rank_orbits
from collsynth.topology.capacity import link_capacity
from collsynth.topology.model import SparseLinks, Topology

__all__ = [
    "Bounds",
    "check_implementable",
    "steps_lower_bound",
    "rounds_per_chunk_lower_bound",
    "compute_bounds",
    "MAX_LP_VARIABLES",
]

logger = logging.getLogger(__name__)

#: Largest rounds linear program (number of variables) collsynth builds; larger ones are refused.
MAX_LP_VARIABLES = 500_000
#: Sources per batch in all-pairs hop counts (bounds the memory of one batch).
_BATCH = 256

Method = Literal["auto", "highs", "z3"]


@dataclass(frozen=True)
class Bounds:
    """Lower bounds for one (topology, collective) pair.

    Attributes
    ----------
    steps:
        No algorithm has fewer steps.
    rounds_per_chunk:
        No algorithm in collsynth's model has fewer total rounds per base chunk (``rounds /
        chunk_factor``).
    composed_rounds_per_chunk:
        Allreduce only (else ``None``): no reduce-scatter-then-allgather algorithm has fewer rounds
        per base chunk of the allreduce (base chunk = the whole buffer).
    composed_steps:
        Allreduce only (else ``None``): no reduce-scatter-then-allgather algorithm has fewer steps.
    """

    steps: int
    rounds_per_chunk: Fraction
    composed_rounds_per_chunk: Fraction | None = None
    composed_steps: int | None = None


# -- shapes -------------------------------------------------------------------------------------


def _check_sizes(topology: Topology, collective: Collective) -> None:
    if collective.num_ranks != topology.num_ranks:
        raise InvalidCollectiveError(
            f"{collective.describe()} has {collective.num_ranks} ranks but topology "
            f"{topology.name!r} has {topology.num_ranks}"
        )


def _is_multi_destination_combining(collective: Collective) -> bool:
    """Combining, and not every chunk has exactly one destination (allreduce and the like)."""
    return collective.combining and not has_non_combining_dual(collective)


def _copy_problem(topology: Topology, collective: Collective) -> tuple[Topology, Collective]:
    """The non-combining problem whose bounds are the collective's: itself, or for a combining
    collective with one destination per chunk, its dual on the reversed topology."""
    if collective.combining:
        return topology.reversed(), non_combining_dual(collective)
    return topology, collective


def _allreduce_ranks(collective: Collective) -> frozenset[int] | None:
    """The rank set P when every chunk has precondition == postcondition == P (|P| >= 2): an
    allreduce over P, which a reduce-scatter then an allgather over P implements."""
    if not collective.combining:
        return None
    first = collective.precondition[0]
    if len(first) < 2:
        return None
    for pre, post in zip(collective.precondition, collective.postcondition):
        if pre != first or post != first:
            return None
    return first


def _composition(collective: Collective, ranks: frozenset[int]) -> tuple[Collective, Collective]:
    """Reduce-scatter and allgather over ``ranks`` (one base chunk per rank of ``ranks``)."""
    order = sorted(ranks)
    n = collective.num_ranks
    reduce_scatter = Collective("reduce_scatter", n, (ranks,) * len(order),
                                tuple(frozenset({r}) for r in order), combining=True)
    allgather = Collective("allgather", n, tuple(frozenset({r}) for r in order),
                           (ranks,) * len(order))
    return reduce_scatter, allgather


# -- hop distances ------------------------------------------------------------------------------


def _edge_arrays(topology: Topology) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Sources, destinations and bandwidths of the links (in :attr:`Topology.edges` order)."""
    if not isinstance(topology.links, SparseLinks):
        # Row-major, as edges: read off the matrix without a Python tuple per link (16.7M
        # links of fully-connected:4096 took a minute as tuples).
        src, dst = np.nonzero(topology.link_array)
        return src.astype(np.int64), dst.astype(np.int64), topology.link_array[src, dst]
    edges = topology.edges
    count = len(edges)
    return (np.fromiter((s for s, _, _ in edges), dtype=np.int64, count=count),
            np.fromiter((d for _, d, _ in edges), dtype=np.int64, count=count),
            np.fromiter((b for _, _, b in edges), dtype=np.int64, count=count))


def _hop_graph(topology: Topology) -> sp.csr_matrix:
    n = topology.num_ranks
    src, dst, _ = _edge_arrays(topology)
    return sp.csr_matrix((np.ones(len(src)), (src, dst)), shape=(n, n))


#: Above this share of the ``n**2`` possible links (and 256 ranks) hop distances are found by
#: breadth-first search on the dense matrix, a matrix product per level: ``n`` searches over
#: ``n**2`` links cost ``n**3`` either way, and the product does it at BLAS speed (dijkstra from
#: every rank of fully-connected:1024 took 8.5 s; the products take well under one).
_DENSE_HOPS = 1 / 16


def _hop_rows(graph: sp.csr_matrix, starts: Sequence[Sequence[int]]) -> Iterable[np.ndarray]:
    """Per batch of ``starts`` (rank lists), the hop distance from each (its nearest member) to
    every rank, as rows of an array; ``inf``: unreachable. Batches follow ``starts``' order."""
    n = graph.shape[0]
    if n >= 256 and graph.nnz >= _DENSE_HOPS * n * n:
        adjacency = (graph.toarray() != 0).astype(np.float32)
        for first in range(0, len(starts), _BATCH):
            batch = starts[first:first + _BATCH]
            frontier = np.zeros((len(batch), n), dtype=np.float32)
            for row, ranks in enumerate(batch):
                frontier[row, list(ranks)] = 1
            seen = frontier > 0
            dist = np.where(seen, 0.0, np.inf)
            level = 0
            while frontier.any() and not seen.all():
                level += 1
                reached = ((frontier @ adjacency) > 0) & ~seen
                dist[reached] = level
                seen |= reached
                frontier = reached.astype(np.float32)
            yield dist
        return
    singles = all(len(ranks) == 1 for ranks in starts)
    for first in range(0, len(starts), _BATCH):
        batch = starts[first:first + _BATCH]
        if singles:
            yield np.atleast_2d(dijkstra(graph, indices=[r[0] for r in batch], unweighted=True))
        else:
            yield np.array([dijkstra(graph, indices=sorted(ranks), unweighted=True,
                                     min_only=True) for ranks in batch])


def _hops_from_sets(graph: sp.csr_matrix, sets: Sequence[frozenset[int]]) -> dict[frozenset[int], np.ndarray]:
    """Hop distance from each rank set (its nearest member) to every rank; ``inf``: unreachable."""
    result: dict[frozenset[int], np.ndarray] = {}
    singles = sorted({next(iter(s)) for s in sets if len(s) == 1})
    groups = sorted({s for s in sets if len(s) > 1}, key=sorted)
    for starts in ([[r] for r in singles], [sorted(s) for s in groups]):
        rows = (row for dist in _hop_rows(graph, starts) for row in dist)
        for ranks, row in zip(starts, rows):
            result[frozenset(ranks)] = row
    return result


def _composed_distances(topology: Topology) -> np.ndarray | None:
    """On a topology stored sparsely over several nodes, the hops between two ranks of one node
    (by local rank, ``[src, dst]``); ranks of two nodes are one hop apart. ``None`` otherwise.

    Every rank has a link to every rank of the other nodes, so between nodes it is one hop, and
    within a node the node's own distance or two hops through another node, whichever is less.
    """
    composition = topology.composition
    if composition is None or composition.nodes < 2:
        return None
    local = composition.local_links()
    graph = sp.csr_matrix((local > 0).astype(np.float64))
    hops = np.minimum(dijkstra(graph, unweighted=True), 2)
    np.fill_diagonal(hops, 0)
    return hops.astype(np.int64)


#: A chunk whose sets name more rank pairs than this is not measured on the composed distances
#: (the dense hop graph is used instead).
_COMPOSED_PAIRS = 1 << 22


def _composed_farthest(topology: Topology, collective: Collective
                       ) -> tuple[int, int, int, int | frozenset[int]] | None:
    """:func:`_farthest_copy` (non-combining) or :func:`_farthest_contribution` (combining) from
    :func:`_composed_distances`, in ``O(ranks)`` per chunk for the standard collectives; the
    last element is the chunk's precondition, or the contributor. ``None`` when it does not
    apply. Every pair is reachable (one or two hops), so ``hops`` is never ``-1``."""
    hops = _composed_distances(topology)
    if hops is None:
        return None
    n, per = topology.num_ranks, len(hops)
    off = hops + np.where(np.eye(per, dtype=bool), -1, 0)  # -1 on the diagonal: a rank itself
    # Farthest rank from local rank a (any other rank) and to local rank b (from any other).
    out_far = np.maximum(off.max(axis=1), 1)
    in_far = np.maximum(off.max(axis=0), 1)
    best = (0, -1, -1, frozenset() if not collective.combining else -1)
    for chunk, (pre, post) in enumerate(zip(collective.precondition, collective.postcondition)):
        if collective.combining:
            if len(pre) == n:  # every contributor: the farthest one from each destination
                targets = np.fromiter(post, np.int64, len(post))
                far = in_far[targets % per]
                worst = int(np.argmax(far))
                pair = (int(far[worst]), chunk, int(targets[worst]), -1)
            elif len(pre) * len(post) <= _COMPOSED_PAIRS:
                pair = _pair_farthest(hops, per, sorted(pre), sorted(post), chunk, any_source=False)
            else:
                return None
        else:
            if len(pre) == 1 and len(post) == n:  # one root, every rank
                root = next(iter(pre))
                pair = (int(out_far[root % per]), chunk, -1, pre)
            elif len(pre) == 1 and len(post) == 1:  # one rank to one rank
                (a,), (b,) = pre, post
                far = 0 if a == b else 1 if a // per != b // per else int(hops[a % per, b % per])
                pair = (far, chunk, b, pre)
            elif len(pre) * len(post) <= _COMPOSED_PAIRS:
                pair = _pair_farthest(hops, per, sorted(pre), sorted(post - pre), chunk,
                                      any_source=True)
                pair = pair[:3] + (pre,)
            else:
                return None
        if pair[0] > best[0]:
            best = pair
    return best


def _pair_farthest(hops: np.ndarray, per: int, sources: list[int], targets: list[int],
                   chunk: int, *, any_source: bool) -> tuple[int, int, int, int]:
    """The farthest target from ``sources`` (its nearest one if ``any_source``, else every one
    but itself) on the composed distances: ``(hops, chunk, target, source)``."""
    if not sources or not targets:
        return (0, chunk, -1, -1)
    src, dst = np.asarray(sources, np.int64), np.asarray(targets, np.int64)
    same = (src[:, None] // per) == (dst[None, :] // per)
    dist = np.where(same, hops[(src % per)[:, None], (dst % per)[None, :]], 1)
    if any_source:
        nearest = dist.min(axis=0)
        worst = int(np.argmax(nearest))
        return (int(nearest[worst]), chunk, int(dst[worst]), -1)
    dist = np.where(src[:, None] == dst[None, :], 0, dist)
    flat = int(np.argmax(dist))
    i, j = divmod(flat, len(dst))
    return (int(dist[i, j]), chunk, int(dst[j]), int(src[i]))


def _farthest_copy(topology: Topology, collective: Collective) -> tuple[int, int, int, frozenset[int]]:
    """For a non-combining collective: ``(hops, chunk, rank, sources)`` of the (rank, chunk) pair
    farthest from the chunk's precondition; ``hops`` is ``-1`` when a pair is unreachable (then
    the pair is that witness) and ``0`` when nothing has to move."""
    composed = _composed_farthest(topology, collective)
    if composed is not None:
        return composed
    sets = sorted(set(collective.precondition), key=sorted)
    distances = _hops_from_sets(_hop_graph(topology), sets)
    # Every (chunk, rank lacking it) pair at once: the distance from the chunk's precondition,
    # pairs in chunk order then rank order, so the first farthest pair is a loop's (one numpy
    # call per chunk cost 50 us: a minute for the million chunks of alltoall(1024)).
    row = {pre: i for i, pre in enumerate(sets)}
    table = np.array([distances[pre] for pre in sets]) if sets else np.zeros((0, 0))
    chunk_list: list[int] = []
    row_list: list[int] = []
    target_list: list[int] = []
    for chunk, (pre, post) in enumerate(zip(collective.precondition, collective.postcondition)):
        missing = post - pre
        if missing:
            chunk_list += [chunk] * len(missing)
            row_list += [row[pre]] * len(missing)
            target_list += sorted(missing)
    if not chunk_list:
        return (0, -1, -1, frozenset())
    chunk_of, targets = np.array(chunk_list), np.array(target_list)
    dist = table[np.array(row_list), targets]
    worst = int(np.argmax(dist))
    pre = collective.precondition[int(chunk_of[worst])]
    if not np.isfinite(dist[worst]):
        return (-1, int(chunk_of[worst]), int(targets[worst]), pre)
    if dist[worst] <= 0:
        return (0, -1, -1, frozenset())
    return (int(dist[worst]), int(chunk_of[worst]), int(targets[worst]), pre)


def _farthest_contribution(topology: Topology, collective: Collective) -> tuple[int, int, int, int]:
    """For a combining collective: ``(hops, chunk, destination, contributor)`` maximising the hop
    distance from a contributor to a destination that needs its contribution; ``hops == -1`` for
    an unreachable pair."""
    composed = _composed_farthest(topology, collective)
    if composed is not None:
        return composed
    graph = _hop_graph(topology)
    n = topology.num_ranks
    contributors = sorted(set().union(*collective.precondition))
    # Each distinct rank set as a sorted array, once (allgather-like collectives share one set).
    arrays: dict[int, np.ndarray] = {}

    def as_array(ranks: frozenset[int]) -> np.ndarray:
        found = arrays.get(id(ranks))
        if found is None:
            found = arrays[id(ranks)] = np.array(sorted(ranks), dtype=np.int64)
        return found

    chunks = [(as_array(pre), as_array(post))
              for pre, post in zip(collective.precondition, collective.postcondition)]
    row_of = np.full(n, -1, dtype=np.int64)
    best = (0, -1, -1, -1)
    for start, dist in zip(range(0, len(contributors), _BATCH),
                           _hop_rows(graph, [[u] for u in contributors])):
        batch = np.array(contributors[start:start + _BATCH], dtype=np.int64)
        row_of[:] = -1
        row_of[batch] = np.arange(len(batch))
        selected: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        for chunk, (pre, post) in enumerate(chunks):
            # Contributors of this chunk in the batch (ascending) against its destinations
            # (ascending), a contributor not counted as its own destination: the first farthest
            # pair in that order, as a loop over both would find it.
            found = selected.get(id(pre))
            if found is None:
                rows = row_of[pre]
                found = selected[id(pre)] = (pre[rows >= 0], rows[rows >= 0])
            here, rows = found
            if not len(here) or not len(post):
                continue
            d = dist[np.ix_(rows, post)]
            d[here[:, None] == post[None, :]] = -1.0
            flat = int(np.argmax(d))
            u, v = divmod(flat, len(post))
            if d[u, v] < 0:
                continue
            if not np.isfinite(d[u, v]):
                return (-1, chunk, int(post[v]), int(here[u]))
            if d[u, v] > best[0]:
                best = (int(d[u, v]), chunk, int(post[v]), int(here[u]))
    return best


# -- implementability and steps -----------------------------------------------------------------


def check_implementable(topology: Topology, collective: Collective) -> None:
    """Raise unless every rank can, by some algorithm, obtain everything it needs.

    A non-combining chunk must be reachable from its precondition by every rank of its
    postcondition; a combining chunk needs a path from every contributor to every destination.

    Raises
    ------
    UnimplementableError
        Naming a rank (``.rank``) and a chunk (``.chunk``) that can never be served.
    InvalidCollectiveError
        When the collective and the topology have different numbers of ranks.

    Examples
    --------
    >>> from collsynth.topology import Topology
    >>> from collsynth.collective import allgather
    >>> oneway = Topology("oneway", ((0, 1, 0), (0, 0, 1), (0, 0, 0)))
    >>> check_implementable(oneway, allgather(3))
    Traceback (most recent call last):
    ...
    collsynth.errors.UnimplementableError: rank 0 can never receive chunk 1: no path from any of ranks [1] (its precondition)
    """
    _check_sizes(topology, collective)
    if collective.combining:
        hops, chunk, rank, contributor = _farthest_contribution(topology, collective)
        if hops < 0:
            raise UnimplementableError(
                f"rank {rank} can never receive the contribution of rank {contributor} to chunk "
                f"{chunk}: no path from rank {contributor} to rank {rank}",
                rank=rank, chunk=chunk,
            )
        return
    hops, chunk, rank, sources = _farthest_copy(topology, collective)
    if hops < 0:
        raise UnimplementableError(
            f"rank {rank} can never receive chunk {chunk}: no path from any of ranks "
            f"{sorted(sources)} (its precondition)",
            rank=rank, chunk=chunk,
        )


def steps_lower_bound(topology: Topology, collective: Collective) -> int:
    """The fewest steps any algorithm can take: the longest unavoidable chain of hops.

    Non-combining: the largest hop distance from a chunk's precondition (its nearest holder) to a
    rank that needs the chunk. Combining: the largest hop distance from a contributor to a
    destination needing its contribution (for reduce and reduce-scatter this equals the bound of
    the non-combining dual on the reversed topology; for allreduce it is the diameter over the
    participating ranks). Bandwidth is deliberately ignored: a step may last any number of rounds,
    so bandwidth limits never force extra steps.

    Holds for every algorithm (any number of chunks, rounds, and any forwarding of partial sums).

    Raises
    ------
    UnimplementableError
        As :func:`check_implementable`.

    Examples
    --------
    >>> from collsynth.topology import get_topology
    >>> from collsynth.collective import standard_collective
    >>> steps_lower_bound(get_topology("ring:4"), standard_collective("allgather", 4))
    2
    >>> steps_lower_bound(get_topology("line:4"), standard_collective("reduce", 4, root=0))
    3
    """
    check_implementable(topology, collective)
    if collective.combining:
        return _farthest_contribution(topology, collective)[0]
    return _farthest_copy(topology, collective)[0]


# -- the rounds linear program ------------------------------------------------------------------


@dataclass(frozen=True)
class _LinearProgram:
    """``min z[0]`` s.t. ``a_ub @ z <= 0``, ``a_eq @ z == b_eq``, ``0 <= z <= upper``.

    ``z[0]`` is the total number of rounds R; every other variable has a finite integer upper
    bound that some optimal solution respects, so any multipliers give a Lagrangian bound.
    """

    a_ub: sp.csr_matrix
    a_eq: sp.csr_matrix
    b_eq: np.ndarray  # integers
    upper: np.ndarray  # integers; upper[0] unused (R is unbounded)
    r_coefficients: np.ndarray  # -a_ub[:, 0]: bandwidth of each capacity row (integers)
    #: every commodity, and (representative commodity, orbit size) for every commodity orbit
    commodities: tuple["_Commodity", ...]
    orbits: tuple[tuple["_Commodity", int], ...]
    #: the verified symmetries used (rank permutations)
    symmetries: tuple[tuple[int, ...], ...]

    @property
    def num_variables(self) -> int:
        return self.a_ub.shape[1]


_Classes = dict[tuple[frozenset[int], frozenset[int]], int]
#: A commodity of the LP: ``("tree", precondition, missing ranks, multiplicity)`` for chunks with
#: several destinations, ``("sink", destination, frozenset of (precondition, multiplicity))`` for
#: all the chunks with one destination.
_Commodity = tuple


def _chunk_classes(collective: Collective) -> _Classes:
    """Chunks that must move, grouped by (precondition, ranks that lack them), with multiplicity.

    Identical chunks compete for bandwidth but are interchangeable; averaging any LP solution
    over their permutations gives an equally good one in which they all move alike, so one set of
    variables with a multiplicity loses nothing.
    """
    classes: _Classes = {}
    for pre, post in zip(collective.precondition, collective.postcondition):
        missing = post - pre
        if missing:
            classes[(pre, missing)] = classes.get((pre, missing), 0) + 1
    return classes


def _commodities(classes: _Classes) -> list[_Commodity]:
    """Chunks with one destination ``d`` are aggregated into one flow into ``d`` (a flow into one
    sink decomposes into paths from the supplies, so nothing is lost); the others stay apart."""
    result: list[_Commodity] = []
    sinks: dict[int, set[tuple[frozenset[int], int]]] = {}
    for (pre, missing), mult in classes.items():
        if len(missing) == 1:
            sinks.setdefault(next(iter(missing)), set()).add((pre, mult))
        else:
            result.append(("tree", pre, missing, mult))
    result.extend(("sink", d, frozenset(supplies)) for d, supplies in sorted(sinks.items()))
    return result


def _map_commodity(perm: Sequence[int], commodity: _Commodity) -> _Commodity:
    """The commodity with every rank ``r`` renamed ``perm[r]``."""
    if commodity[0] == "tree":
        _, pre, missing, mult = commodity
        return ("tree", frozenset(perm[r] for r in pre), frozenset(perm[r] for r in missing), mult)
    _, d, supplies = commodity
    return ("sink", perm[d], frozenset((frozenset(perm[r] for r in pre), m) for pre, m in supplies))


def _symmetries(topology: Topology, commodities: Sequence[_Commodity]) -> list[list[int]]:
    """Candidate permutations that are verified symmetries of the whole LP: they preserve every
    link's bandwidth, map every bandwidth group that can bind onto one with the same limit and
    links, and map the set of commodities (with multiplicities) onto itself."""
    n = topology.num_ranks
    src, dst, bw = _edge_arrays(topology)
    keys = src * n + dst  # sorted: edges are listed row by row
    groups = [(g.limit, np.array([s * n + d for s, d in covered], dtype=np.int64))
              for g, covered in topology.effective_groups]
    group_set = {(limit, frozenset(k.tolist())) for limit, k in groups}
    commodity_set = set(commodities)
    found = []
    for perm in candidate_permutations(n):
        mapped = perm[src] * n + perm[dst]
        pos = np.minimum(np.searchsorted(keys, mapped), len(keys) - 1)
        if not (np.array_equal(keys[pos], mapped) and np.array_equal(bw[pos], bw)):
            continue
        if any((limit, frozenset((perm[k // n] * n + perm[k % n]).tolist())) not in group_set
               for limit, k in groups):
            continue
        as_list = perm.tolist()
        if all(_map_commodity(as_list, c) in commodity_set for c in commodities):
            found.append(as_list)
    return found


#: Most symmetries fixing a commodity that are used to tie its variables (any subset is sound).
_MAX_STABILIZER = 64
#: Symmetry detection is skipped when testing the candidates would cost more elementary
#: operations than this (candidates x (links + group links + commodity ranks)).
_MAX_SYMMETRY_WORK = 50_000_000

_Orbit = tuple[list[tuple[_Commodity, list[int]]], list[list[int]]]


def _orbits(topology: Topology, commodities: Sequence[_Commodity], symmetric: bool
            ) -> tuple[list[_Orbit], list[list[int]]]:
    """Commodities grouped into orbits under the symmetries found, and the symmetries.

    Each orbit is ``(members, stabilizer)``: ``members`` lists ``(commodity, perm)`` with ``perm``
    a symmetry taking the orbit's first commodity to that one; ``stabilizer`` lists symmetries
    that map the first commodity to itself (Schreier generators: ``perm(g(c))^-1 g perm(c)``).
    """
    identity = list(range(topology.num_ranks))
    if not symmetric:
        return [([(c, identity)], []) for c in commodities], []
    n = topology.num_ranks
    size = len(topology.edges) + sum(len(c) for _, c in topology.effective_groups) + sum(
        len(c[1]) + len(c[2]) if c[0] == "tree" else 1 + sum(len(p) for p, _ in c[2])
        for c in commodities)
    work = 3 * n * size
    generators = _symmetries(topology, commodities) if work <= _MAX_SYMMETRY_WORK else []
    orbits: list[_Orbit] = []
    seen: set[_Commodity] = set()
    for commodity in commodities:
        if commodity in seen:
            continue
        seen.add(commodity)
        members = [(commodity, identity)]
        perm_of = {commodity: identity}
        for member, perm in members:  # grows while iterating: a breadth-first search
            for g in generators:
                image = _map_commodity(g, member)
                if image not in seen:
                    seen.add(image)
                    perm_of[image] = [g[p] for p in perm]
                    members.append((image, perm_of[image]))
        stabilizer: dict[tuple[int, ...], list[int]] = {}
        for member, perm in members:
            for g in generators:
                back = perm_of[_map_commodity(g, member)]
                inverse = [0] * len(back)
                for i, j in enumerate(back):
                    inverse[j] = i
                fixing = [inverse[g[p]] for p in perm]
                if fixing != identity and len(stabilizer) < _MAX_STABILIZER:
                    stabilizer.setdefault(tuple(fixing), fixing)
        orbits.append((members, list(stabilizer.values())))
    return orbits, generators


def _classes_under(perms: Sequence[Sequence[int]], size: int,
                   image: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """Labels of the orbits of ``size`` items under ``perms`` (``image(perm)`` maps every item)."""
    if not perms:
        return np.arange(size, dtype=np.int64)
    items = np.arange(size, dtype=np.int64)
    rows = np.concatenate([items] * len(perms))
    cols = np.concatenate([image(np.asarray(p, dtype=np.int64)) for p in perms])
    graph = sp.csr_matrix((np.ones(len(rows)), (rows, cols)), shape=(size, size))
    return connected_components(graph, directed=False)[1].astype(np.int64)


class _Builder:
    """Accumulates sparse rows and columns of the rounds LP."""

    def __init__(self) -> None:
        self.next_var = 1  # variable 0 is R
        self.upper: list[np.ndarray] = [np.zeros(1, dtype=np.int64)]
        # capacity contributions (edge, variable, coefficient), already mapped by the orbits
        self.cap: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        # coupling rows f - x <= 0: (f variable, x variable)
        self.couple: list[tuple[np.ndarray, np.ndarray]] = []
        # equality entries (row, variable, coefficient) and right-hand sides
        self.eq: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self.b_eq: list[np.ndarray] = []
        self.next_row = 0

    def variables(self, count: int, upper: int) -> np.ndarray:
        first = self.next_var
        self.next_var += count
        self.upper.append(np.full(count, upper, dtype=np.int64))
        return np.arange(first, first + count, dtype=np.int64)

    def rows(self, rhs: np.ndarray) -> int:
        first = self.next_row
        self.next_row += len(rhs)
        self.b_eq.append(np.asarray(rhs, dtype=np.int64))
        return first


def _build_lp(topology: Topology, commodities: Sequence[_Commodity], *, symmetric: bool,
              label: str = "the collective") -> _LinearProgram:
    """The rounds LP of a non-combining collective (see :func:`rounds_per_chunk_lower_bound`).

    With ``symmetric``, only one commodity per orbit under the verified symmetries gets variables;
    each other commodity of the orbit uses the same values moved by its symmetry, so the
    representative's variable on link e also counts on the image of e. Within the representative,
    links that a symmetry fixing it maps onto each other share one variable, and of the
    destinations such symmetries map onto each other only one gets a flow (the others' flows are
    its images). This LP has the same optimum: any solution extends to the full LP, and averaging
    a full optimum over the group the symmetries generate gives a symmetric optimum, which is a
    solution of the reduced LP.

    Raises :class:`InputTooLargeError` (naming ``label``) before building an LP of more than
    :data:`MAX_LP_VARIABLES` variables.
    """
    n = topology.num_ranks
    edges = topology.edges
    num_edges = len(edges)
    src, dst, bw = _edge_arrays(topology)
    keys = src * n + dst
    edge_ids = np.arange(num_edges, dtype=np.int64)
    builder = _Builder()

    def conservation(edge_sel: np.ndarray, flow: np.ndarray, node_row: np.ndarray) -> None:
        """Entries in(v) - out(v) of the flow on edges ``edge_sel`` into rows ``node_row[v]``."""
        for ends, sign in ((dst, 1), (src, -1)):
            rows = node_row[ends[edge_sel]]
            keep = rows >= 0
            builder.eq.append((rows[keep], flow[keep], np.full(int(keep.sum()), sign, dtype=np.int64)))

    def tied(links: np.ndarray, edge_class: np.ndarray, upper: int) -> np.ndarray:
        """One variable per class of ``links``; returns the variable of each link."""
        classes, inverse = np.unique(edge_class[links], return_inverse=True)
        return builder.variables(len(classes), upper)[inverse.ravel()]

    def tree(pre: frozenset[int], missing: frozenset[int], edge_class: np.ndarray,
             rank_class: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """x[e] (one copy of the chunk on a link serves every destination downstream) and a unit
        flow f[d] <= x from the precondition to each destination d. Returns (links, x)."""
        usable = edge_ids[~np.isin(dst, sorted(pre))]  # a send into a holder is useless
        x = tied(usable, edge_class, 1)
        x_of_edge = np.full(num_edges, -1, dtype=np.int64)
        x_of_edge[usable] = x
        is_pre = np.zeros(n, dtype=bool)
        is_pre[sorted(pre)] = True
        outside = np.flatnonzero(~is_pre)
        chosen: dict[int, int] = {}
        for d in sorted(missing):
            chosen.setdefault(int(rank_class[d]), d)
        for d in sorted(chosen.values()):
            sel = usable[src[usable] != d]  # a send out of d does not help deliver to d
            f = builder.variables(len(sel), 1)
            builder.couple.append((f, x_of_edge[sel]))
            node_row = np.full(n, -1, dtype=np.int64)
            first = builder.rows((outside == d).astype(np.int64))  # in - out = [v == d]
            node_row[outside] = np.arange(first, first + len(outside))
            conservation(sel, f, node_row)
        return usable, x

    def sink(d: int, supplies: frozenset[tuple[frozenset[int], int]],
             edge_class: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """One flow into d carrying every chunk whose only destination is d, each supplied at its
        precondition (through a super-source when that has several ranks). Returns (links, flow)."""
        total = sum(m for _, m in supplies)
        sel = edge_ids[src != d]
        flow = tied(sel, edge_class, total)
        supply = np.zeros(n, dtype=np.int64)
        spread = []
        for pre, mult in sorted(supplies, key=lambda item: (sorted(item[0]), item[1])):
            if len(pre) == 1:
                supply[next(iter(pre))] += mult
            else:
                spread.append((pre, mult))
        others = np.array([v for v in range(n) if v != d], dtype=np.int64)
        node_row = np.full(n, -1, dtype=np.int64)
        first = builder.rows(-supply[others])  # in(v) - out(v) + from super-sources = -supply(v)
        node_row[others] = np.arange(first, first + len(others))
        conservation(sel, flow, node_row)
        for pre, mult in spread:
            members = np.array(sorted(pre), dtype=np.int64)
            arcs = builder.variables(len(members), mult)
            row = builder.rows(np.array([mult]))  # the super-source emits the chunks
            ones = np.ones(len(arcs), dtype=np.int64)
            builder.eq.append((np.full(len(arcs), row, dtype=np.int64), arcs, ones))
            builder.eq.append((node_row[members], arcs, ones))
        return sel, flow

    orbits, symmetries = _orbits(topology, commodities, symmetric)
    plans = []
    estimate = 1
    for members, stabilizer in orbits:
        first = members[0][0]
        # The link classes (one array of all links per orbit) are made one orbit at a time
        # below, after the size check: made here, n orbits of n**2 links held 2.7 GB on
        # fully-connected:700 before a 342M-variable LP was refused.
        rank_class = _classes_under(stabilizer, n, lambda p: p)
        plans.append((members, stabilizer, rank_class))
        if first[0] == "tree":
            flows = len({int(rank_class[d]) for d in first[2]})
            estimate += num_edges * (1 + flows)
        else:
            estimate += num_edges + sum(len(pre) for pre, _ in first[2])
    if estimate > MAX_LP_VARIABLES:
        raise InputTooLargeError(
            f"the rounds bound of {label} needs a linear program of about {estimate:,} variables "
            f"(links x chunk destinations{', after symmetry reduction' if symmetries else ''}), "
            f"more than the {MAX_LP_VARIABLES:,} collsynth builds"
        )
    for members, stabilizer, rank_class in plans:
        first = members[0][0]
        edge_class = _classes_under(stabilizer, num_edges,
                                    lambda p: np.searchsorted(keys, p[src] * n + p[dst]))
        if first[0] == "tree":
            links, variables = tree(first[1], first[2], edge_class, rank_class)
            coefficient = first[3]
        else:
            links, variables = sink(first[1], first[2], edge_class)
            coefficient = 1
        coefficients = np.full(len(links), coefficient, dtype=np.int64)
        for _, perm in members:
            p = np.asarray(perm, dtype=np.int64)
            images = np.searchsorted(keys, p[src[links]] * n + p[dst[links]])
            builder.cap.append((images, variables, coefficients))

    num_vars = builder.next_var
    # Capacity of every link and every bandwidth group that can bind, per round of R.
    cap_e = np.concatenate([c[0] for c in builder.cap])
    cap_v = np.concatenate([c[1] for c in builder.cap])
    cap_c = np.concatenate([c[2] for c in builder.cap])
    per_edge = sp.csr_matrix((cap_c, (cap_e, cap_v)), shape=(num_edges, num_vars), dtype=np.int64)
    index = {(s, d): i for i, (s, d, _) in enumerate(edges)}
    group_rows, group_cols, limits = [], [], []
    for g, (group, covered) in enumerate(topology.effective_groups):
        group_rows.extend([g] * len(covered))
        group_cols.extend(index[link] for link in covered)
        limits.append(group.limit)
    membership = sp.csr_matrix((np.ones(len(group_rows), dtype=np.int64), (group_rows, group_cols)),
                               shape=(len(limits), num_edges), dtype=np.int64)
    per_group = (membership @ per_edge).tocsr()
    r_coefficients = np.concatenate([bw, np.array(limits, dtype=np.int64)])
    r_column = sp.csr_matrix(
        (-r_coefficients, (np.arange(len(r_coefficients)), np.zeros(len(r_coefficients), dtype=np.int64))),
        shape=(len(r_coefficients), num_vars), dtype=np.int64)
    blocks = [sp.vstack([per_edge, per_group]) + r_column]
    if builder.couple:
        f = np.concatenate([c[0] for c in builder.couple])
        x = np.concatenate([c[1] for c in builder.couple])
        rows = np.arange(len(f))
        blocks.append(sp.csr_matrix(
            (np.concatenate([np.ones(len(f), dtype=np.int64), -np.ones(len(f), dtype=np.int64)]),
             (np.concatenate([rows, rows]), np.concatenate([f, x]))),
            shape=(len(f), num_vars), dtype=np.int64))
    a_ub = sp.vstack(blocks).tocsr()
    eq_r = np.concatenate([e[0] for e in builder.eq])
    eq_v = np.concatenate([e[1] for e in builder.eq])
    eq_c = np.concatenate([e[2] for e in builder.eq])
    a_eq = sp.csr_matrix((eq_c, (eq_r, eq_v)), shape=(builder.next_row, num_vars), dtype=np.int64)
    return _LinearProgram(a_ub=a_ub, a_eq=a_eq, b_eq=np.concatenate(builder.b_eq),
                          upper=np.concatenate(builder.upper), r_coefficients=r_coefficients,
                          commodities=tuple(commodities),
                          orbits=tuple((members[0][0], len(members)) for members, _ in orbits),
                          symmetries=tuple(tuple(g) for g in symmetries))


# -- exact certificates ---------------------------------------------------------------------------


def _exact_dot(matrix: sp.csr_matrix, vector: np.ndarray) -> np.ndarray:
    """``matrix @ vector`` over integers without overflow (int64 when provably safe, else Python
    integers)."""
    vector = np.asarray(vector)
    if vector.dtype != object and matrix.nnz:
        row_weight = np.asarray(abs(matrix).astype(np.float64).sum(axis=1)).ravel()
        peak = float(row_weight.max()) * float(np.abs(vector).max(initial=0))
        if peak < 2.0 ** 62:
            return matrix.astype(np.int64) @ vector.astype(np.int64)
    coo = matrix.tocoo()
    result = np.zeros(matrix.shape[0], dtype=object)
    products = coo.data.astype(object) * vector.astype(object)[coo.col]
    np.add.at(result, coo.row, products)
    return result


def _common_denominator(values: np.ndarray, max_denominator: int) -> int | None:
    """The least common multiple of the denominators of ``values`` read as simple fractions, or
    ``None`` when there are too many distinct values or the multiple is too large to be useful."""
    distinct = np.unique(np.round(values[values != 0], 9))
    if len(distinct) > 50_000:
        return None
    q = 1
    for value in distinct:
        q = math.lcm(q, Fraction(float(value)).limit_denominator(max_denominator).denominator)
        if q > 2 ** 48:
            return None
    return q


def _dual_bound(lp: _LinearProgram, y_ub: np.ndarray, y_eq: np.ndarray, scale: int) -> Fraction:
    """A lower bound on the LP optimum from any multipliers (``y_ub <= 0`` is enforced), in exact
    arithmetic after scaling by ``scale`` and rounding to integers.

    The Lagrangian of ``min R`` is ``b_eq . y_eq + sum_j min(0, -a_j) * upper_j`` for the non-R
    columns (``a = A^T y``), plus ``(1 - a_R) R`` for R >= 0. It is homogeneous in y, so scaling
    the multipliers by ``1 / a_R`` makes R's reduced cost zero: the bound is ``K / a_R``.
    """
    y_ub_int = np.minimum(np.rint(y_ub * scale), 0).astype(np.int64)
    y_eq_int = np.rint(y_eq * scale).astype(np.int64)
    a = np.zeros(lp.num_variables, dtype=object)
    a += _exact_dot(lp.a_ub.T.tocsr(), y_ub_int).astype(object)
    a += _exact_dot(lp.a_eq.T.tocsr(), y_eq_int).astype(object)
    rows = len(lp.r_coefficients)
    a_r = -sum(int(b) * int(y) for b, y in zip(lp.r_coefficients, y_ub_int[:rows]))
    reduced = -a[1:]
    k = sum(int(b) * int(y) for b, y in zip(lp.b_eq, y_eq_int) if b)
    k += int(np.sum(np.minimum(reduced, 0) * lp.upper[1:].astype(object)))
    if a_r <= 0 or k <= 0:
        return Fraction(0)
    return Fraction(k, a_r)


def _primal_value(lp: _LinearProgram, z: np.ndarray) -> Fraction | None:
    """The exact objective of HiGHS's solution read as simple fractions, if it is exactly feasible
    (an upper bound on the optimum); else ``None``."""
    q = _common_denominator(z, 10 ** 6)
    if q is None:
        return None
    z_int = np.rint(z * q)
    if np.abs(z_int).max(initial=0) >= 2.0 ** 62:
        return None
    z_int = z_int.astype(np.int64)
    if (z_int < 0).any() or (z_int[1:].astype(object) > lp.upper[1:].astype(object) * q).any():
        return None
    if (_exact_dot(lp.a_ub, z_int) > 0).any():
        return None
    if (_exact_dot(lp.a_eq, z_int) != lp.b_eq.astype(object) * q).any():
        return None
    return Fraction(int(z_int[0]), q)


def _shortest_paths(n: int, adjacency: Sequence[Sequence[tuple[int, int]]],
                    sources: Iterable[int]) -> list[int | None]:
    """Least total integer length from the nearest source to every node (``None``: unreachable)."""
    dist: list[int | None] = [None] * n
    heap = [(0, s) for s in sources]
    heapq.heapify(heap)
    while heap:
        d, u = heapq.heappop(heap)
        if dist[u] is not None:
            continue
        dist[u] = d
        for v, length in adjacency[u]:
            if dist[v] is None:
                heapq.heappush(heap, (d + length, v))
    return dist


def _symmetric_average(topology: Topology, lp: _LinearProgram, values: np.ndarray) -> np.ndarray:
    """``values`` (one per link, then one per binding bandwidth group) averaged over the orbits of
    links and groups under the LP's symmetries."""
    edges = topology.edges
    groups = topology.effective_groups
    size = len(edges) + len(groups)
    parent = list(range(size))

    def find(a: int) -> int:
        while parent[a] != a:
            parent[a] = parent[parent[a]]
            a = parent[a]
        return a

    index = {(s, d): i for i, (s, d, _) in enumerate(edges)}
    same: dict[tuple[int, frozenset[tuple[int, int]]], list[int]] = {}
    for j, (g, covered) in enumerate(groups):  # identical groups are merged (the same constraint)
        same.setdefault((g.limit, frozenset(covered)), []).append(len(edges) + j)
    for members in same.values():
        for j in members[1:]:
            parent[find(j)] = find(members[0])
    for perm in lp.symmetries:
        for i, (s, d, _) in enumerate(edges):
            parent[find(i)] = find(index[(perm[s], perm[d])])
        for (limit, covered), members in same.items():
            image = same[(limit, frozenset((perm[s], perm[d]) for s, d in covered))]
            parent[find(members[0])] = find(image[0])
    roots = np.array([find(i) for i in range(size)])
    totals = np.bincount(roots, weights=values, minlength=size)
    counts = np.bincount(roots, minlength=size)
    return totals[roots] / counts[roots]


def _structured_bound(topology: Topology, lp: _LinearProgram, weights: np.ndarray,
                      max_denominator: int) -> Fraction:
    """The bound ``sum_c inner_c / a_R`` from non-negative multipliers of the link and group rows.

    For any multipliers w >= 0 and any solution, ``sum_e w_e load_e + sum_g w_g load_g <= R a_R``
    with ``a_R = sum_e b_e w_e + sum_g limit_g w_g``; the left side is ``sum_c m_c cost_c(x_c)``
    under link lengths ``l_e = w_e + sum of w_g over the groups containing e``, at least the
    least cost ``inner_c`` of serving commodity c. ``inner_c`` is exact: a shortest path for each
    supply of a sink commodity, and a minimum-cost arborescence for a tree commodity whose chunks
    every other rank needs (Edmonds: its flow relaxation has integral optima); for other tree
    commodities the longest shortest path to a destination, a weaker but valid value. The
    multipliers are averaged over the symmetries and read as fractions first, which recovers an
    exact optimal dual in practice; every choice gives a valid bound.
    """
    n = topology.num_ranks
    edges = topology.edges
    averaged = _symmetric_average(topology, lp, np.maximum(weights, 0.0))
    peak = float(averaged.max(initial=0.0))
    if peak <= 0:
        return Fraction(0)
    averaged /= peak
    q = _common_denominator(averaged, max_denominator)
    if q is None:
        return Fraction(0)
    w = [max(0, int(round(v * q))) for v in averaged]
    length = w[:len(edges)]
    index = {(s, d): i for i, (s, d, _) in enumerate(edges)}
    for j, (_, covered) in enumerate(topology.effective_groups):
        for link in covered:
            length[index[link]] += w[len(edges) + j]
    a_r = sum(int(b) * wi for b, wi in zip(lp.r_coefficients, w))
    if a_r <= 0:
        return Fraction(0)
    forward: list[list[tuple[int, int]]] = [[] for _ in range(n)]
    backward: list[list[tuple[int, int]]] = [[] for _ in range(n)]
    for (s, d, _), cost in zip(edges, length):
        forward[s].append((d, cost))
        backward[d].append((s, cost))
    # The orbit shortcut (one commodity per orbit, times its size) needs lengths the symmetries
    # preserve exactly; check rather than assume, and otherwise serve every commodity.
    invariant = all(length[index[(perm[s], perm[d])]] == length[i]
                    for perm in lp.symmetries for i, (s, d, _) in enumerate(edges))
    work = lp.orbits if invariant else tuple((c, 1) for c in lp.commodities)
    inner = 0
    for commodity, size in work:
        if commodity[0] == "sink":
            _, d, supplies = commodity
            dist = _shortest_paths(n, backward, [d])
            value = sum(m * min(dist[u] for u in pre if dist[u] is not None)  # type: ignore[type-var]
                        for pre, m in supplies)
        else:
            _, pre, missing, m = commodity
            if len(pre) + len(missing) == n:
                arcs = [(s, d, cost) for (s, d, _), cost in zip(edges, length) if d not in pre]
                if len(pre) == 1:
                    best = min_arborescence_cost(n, next(iter(pre)), arcs)
                else:  # a super-root reaching the precondition for free
                    best = min_arborescence_cost(n + 1, n, arcs + [(n, u, 0) for u in pre])
            else:
                dist = _shortest_paths(n, forward, pre)
                best = max(dist[d] for d in missing)  # type: ignore[type-var]
            if best is None:  # excluded by check_implementable
                raise SolverError("a commodity of the rounds LP cannot be served")
            value = m * best
        inner += size * value
    return Fraction(inner, a_r)


#: How a certified bound relates to the LP optimum.
_EXACT, _CLOSE, _GAP = "exact", "close", "gap"


def _highs(lp: _LinearProgram):
    """HiGHS's floating-point solution of ``lp`` (minimise variable 0, the rounds)."""
    num = lp.num_variables
    cost = np.zeros(num)
    cost[0] = 1.0
    bounds = np.column_stack([np.zeros(num), lp.upper.astype(np.float64)])
    bounds[0, 1] = np.inf
    result = linprog(cost, A_ub=lp.a_ub.astype(np.float64), b_ub=np.zeros(lp.a_ub.shape[0]),
                     A_eq=lp.a_eq.astype(np.float64), b_eq=lp.b_eq.astype(np.float64),
                     bounds=bounds, method="highs")
    if result.status != 0:
        raise SolverError(f"HiGHS could not solve the rounds linear program: {result.message}")
    return result


def _solve_highs(topology: Topology, lp: _LinearProgram) -> tuple[Fraction, str]:
    """Solve with HiGHS and certify: ``(lower bound, status)``.

    The bound is always a verified lower bound on the LP optimum (weak duality, in exact
    arithmetic). Status ``"exact"``: HiGHS's solution, read as fractions, is exactly feasible with
    the same value, so the bound is the optimum. ``"close"``: no exact solution was recovered but
    the bound is within 1e-9 (relative) of HiGHS's optimum. ``"gap"``: it is further below.
    """
    result = _highs(lp)
    upper = _primal_value(lp, np.asarray(result.x, dtype=np.float64))

    def proven(bound: Fraction) -> bool:
        if upper is not None and bound > upper:
            raise SolverError(f"rounds LP certificates disagree: lower bound {bound} > feasible "
                              f"value {upper}")
        return bound == upper

    y_ub = np.asarray(result.ineqlin.marginals, dtype=np.float64)
    y_eq = np.asarray(result.eqlin.marginals, dtype=np.float64)
    best = Fraction(0)
    for max_denominator in (10 ** 3, 10 ** 6):
        best = max(best, _structured_bound(topology, lp, -y_ub[:len(lp.r_coefficients)],
                                           max_denominator))
        if proven(best):
            return best, _EXACT
    peak = max(np.abs(y_ub).max(initial=0), np.abs(y_eq).max(initial=0))
    if peak <= 0:
        return best, _EXACT if upper == 0 else _GAP
    y_ub, y_eq = y_ub / peak, y_eq / peak
    weight = max(float(np.asarray(abs(lp.a_ub).sum(axis=0)).max(initial=0)),
                 float(np.asarray(abs(lp.a_eq).sum(axis=0)).max(initial=0)), 1.0)
    safe = int(2.0 ** 60 / weight)
    for max_denominator in (10 ** 3, 10 ** 6, None):
        if max_denominator is None:
            scale = min(safe, 2 ** 40)
        else:
            q = _common_denominator(np.concatenate([y_ub, y_eq]), max_denominator)
            if q is None or q > safe:
                continue
            scale = q
        best = max(best, _dual_bound(lp, y_ub, y_eq, scale))
        if proven(best):
            return best, _EXACT
    close = float(best) >= float(result.fun) - 1e-9 * max(1.0, abs(float(result.fun)))
    return best, _CLOSE if close else _GAP


def _solve_z3(lp: _LinearProgram, *, timeout_ms: int | None = None) -> Fraction:
    """The exact optimum, proven by z3's decision procedure for linear real arithmetic.

    HiGHS proposes the value V (its optimum read as a fraction); z3 then shows that ``R <= V`` is
    satisfiable and ``R < V`` is not, in exact rational arithmetic and independently of the
    certificates of :func:`_solve_highs`. (z3's ``Optimize`` is not used: it stalls on some of
    these LPs.) Raises :class:`SolverError` when no proposal can be proven.
    """
    import z3

    num = lp.num_variables
    result = _highs(lp)
    z = [z3.Real(f"z{j}") for j in range(num)]
    constraints = [z[0] >= 0]
    for j in range(1, num):
        constraints += [z[j] >= 0, z[j] <= int(lp.upper[j])]
    for matrix, relation in ((lp.a_ub, "le"), (lp.a_eq, "eq")):
        for row in range(matrix.shape[0]):
            start, stop = matrix.indptr[row], matrix.indptr[row + 1]
            total = z3.Sum([int(c) * z[int(j)]
                            for c, j in zip(matrix.data[start:stop], matrix.indices[start:stop])]
                           + [z3.RealVal(0)])
            constraints.append(total <= 0 if relation == "le" else total == int(lp.b_eq[row]))

    def check(extra: z3.BoolRef) -> z3.CheckSatResult:
        solver = z3.SolverFor("QF_LRA")
        if timeout_ms is not None:
            solver.set("timeout", timeout_ms)
        solver.add(*constraints, extra)
        return solver.check()

    tried = set()
    for max_denominator in (10 ** 3, 10 ** 6, 10 ** 9):
        guess = Fraction(float(result.fun)).limit_denominator(max_denominator)
        if guess in tried:
            continue
        tried.add(guess)
        value = z3.RealVal(f"{guess.numerator}/{guess.denominator}")
        if check(z[0] < value) == z3.unsat and check(z[0] <= value) == z3.sat:
            return guess
    raise SolverError(f"z3 could not prove an optimum of the rounds LP near {result.fun}")


def _copy_rounds(topology: Topology, collective: Collective, method: Method, label: str) -> Fraction:
    """Total rounds bound (not yet per chunk) of a non-combining collective; ``label`` names the
    original problem in messages."""
    classes = _chunk_classes(collective)
    if not classes:
        return Fraction(0)
    if method == "auto":
        roots = _spanning_roots(topology, classes)
        if roots is not None:
            value = _arborescence_rounds(topology, roots)
            if value is not None:
                return value
        if topology.num_ranks > _FABRIC_FIRST_RANKS:
            value = _fabric_rounds(topology, collective)
            if value is not None:
                return value
    try:
        lp = _build_lp(topology, _commodities(classes), symmetric=method != "z3", label=label)
    except InputTooLargeError:
        value = _fabric_rounds(topology, collective) if method == "auto" else None
        if value is None:
            raise
        return value
    if method == "z3":
        return _solve_z3(lp)
    if method == "auto" and lp.a_ub.shape[1] > _LP_AUTO_MAX_VARIABLES:
        value = _fabric_rounds(topology, collective)
        if value is not None:
            logger.warning("rounds bound of %s: the linear program has %d variables (the "
                           "topology's symmetries do not reduce it); the fabric's cut bound %s "
                           "is given instead, which can be below the LP where NICs are shared "
                           "by several GPUs (method='highs' solves the LP)", label,
                           lp.a_ub.shape[1], value)
            return value
    value, status = _solve_highs(topology, lp)
    if status == _EXACT:
        return value
    if status == _CLOSE:
        logger.debug("rounds bound of %s: %s, certified, equal to HiGHS's optimum within 1e-9",
                     label, value)
        return value
    logger.warning("rounds bound of %s: certified %s, which may be below the LP optimum", label, value)
    rounded = value.limit_denominator(10 ** 6)
    return rounded if rounded <= value else Fraction(math.floor(value * 10 ** 6), 10 ** 6)


#: Above this many LP variables (after the symmetry reduction) ``method="auto"`` gives the
#: fabric's cut bound when one exists: HiGHS takes minutes there (MI250 x 2: 150,073 variables,
#: more than 5 minutes; every other built-in composed system below 6,000, under a second).
_LP_AUTO_MAX_VARIABLES = 50_000

#: Above this many ranks, broadcast-shaped collectives are bounded from the fabric's cuts first:
#: their rounds linear program would not fit MAX_LP_VARIABLES anyway.
_FABRIC_FIRST_RANKS = 128


def _fabric_rounds(topology: Topology, collective: Collective) -> Fraction | None:
    """The cut bound of :mod:`collsynth.bounds.throughput` (total rounds,
    like :func:`_copy_rounds`) when every chunk starts on one rank and must reach all the others
    and the topology's groups describe switch ports; else ``None``. A valid lower bound: every
    chunk a cut's ranks need must cross into it. Equal to the linear program wherever both have
    been compared, except with NICs shared by several GPUs, where it can be lower."""

    roots = broadcast_shape(collective)
    if roots is None:
        return None
    try:
        return fabric_rounds(topology, roots)[0]
    except UnsupportedFabricError:
        return None


def _composed_rounds(topology: Topology, collective: Collective) -> Fraction | None:
    """The total rounds bound that :func:`rounds_per_chunk_lower_bound` finds above
    :data:`_FABRIC_FIRST_RANKS` ranks, from the sparse form of a composed topology (no dense
    matrix): the fabric bound for broadcast-shaped collectives and their duals, and for an
    allreduce the cut bound over the same cuts as :func:`_candidate_cuts`, each measured
    exactly on the quotient fabric. ``None`` when it does not apply."""
    if topology.composition is None or topology.composition.nodes < 2 \
            or topology.num_ranks <= _FABRIC_FIRST_RANKS:
        return None
    try:
        if _is_multi_destination_combining(collective):
            return _composed_cut_rounds(topology, collective)
        return _fabric_rounds(*_copy_problem(topology, collective))
    except UnsupportedFabricError:
        return None


def _composed_cut_rounds(topology: Topology, collective: Collective) -> Fraction | None:
    """:func:`_cut_rounds` for an allreduce (every chunk from every rank to every rank) on a
    composed topology: each cut of :func:`_candidate_cuts` is crossed by every chunk, and its
    capacity is the maximum flow across it in the quotient fabric (node permutations fixing
    node 0 keep each of those cuts)."""
    n = topology.num_ranks
    if not all(len(pre) == n and len(post) == n
               for pre, post in zip(collective.precondition, collective.postcondition)):
        return None
    quotient = composed_quotient(topology)
    shift = node_shift(topology)
    per = quotient.ranks_per_node
    q_ranks = quotient.fabric.num_ranks
    cuts = []
    node = np.zeros(q_ranks, dtype=bool)
    node[:per] = True
    cuts += [node, ~node]
    if shift is not None and shift.nodes_per_leaf:
        leaf = np.zeros(q_ranks, dtype=bool)
        leaf[:2 * per] = True  # node 0 and the other nodes of its leaf (classes 0 and 1)
        cuts += [leaf, ~leaf]
    for v in range(per):
        single = np.zeros(q_ranks, dtype=bool)
        single[v] = True
        cuts += [single, ~single]
    needed = collective.num_chunks
    capacity = min(_quotient_cut(quotient.fabric, inside) for inside in cuts)
    if capacity <= 0:
        raise SolverError(f"a cut of {topology.name!r} with {n} ranks has no capacity")
    return Fraction(needed, capacity)


def _quotient_cut(fabric, inside: np.ndarray) -> int:
    """The most chunks per round the ranks ``inside`` can send to the others on ``fabric``."""
    v = fabric.num_vertices
    source, sink = v, v + 1
    huge = int(fabric.cap[fabric.cap < INFINITE].sum()) + 1
    ranks = np.arange(fabric.num_ranks)
    src = np.concatenate([fabric.src, np.full(inside.sum(), source), ranks[~inside]])
    dst = np.concatenate([fabric.dst, ranks[inside], np.full((~inside).sum(), sink)])
    cap = [huge if c >= INFINITE else c for c in fabric.cap.tolist()]
    cap += [huge] * int(inside.sum() + (~inside).sum())
    return small_max_flow(v + 2, src, dst, cap, source, sink)[0]


# -- arborescence packing (every chunk from one rank to all others, no bandwidth groups) ----------


def _source_side(graph: sp.csr_matrix, source: int, sink: int) -> tuple[int, np.ndarray]:
    """The maximum flow from ``source`` to ``sink`` (integer capacities) and the source side of a
    minimum cut: the nodes reachable from ``source`` in the residual graph."""
    result = maximum_flow(graph, source, sink)
    residual = (graph.astype(np.int64) - result.flow.astype(np.int64)).tocsr()
    residual.data = (residual.data > 0).astype(np.float64)
    residual.eliminate_zeros()
    reached = np.isfinite(dijkstra(residual, indices=source, unweighted=True))
    return int(result.flow_value), reached


def _spanning_roots(topology: Topology,
                    classes: dict[tuple[frozenset[int], frozenset[int]], int]) -> dict[int, int] | None:
    """Chunks per root rank when every chunk starts on one rank and is needed by all the others and
    no bandwidth group can bind (allgather, broadcast, and the duals of reduce and
    reduce-scatter); else ``None``."""
    if topology.effective_groups:
        return None
    roots: dict[int, int] = {}
    for (pre, missing), mult in classes.items():
        if len(pre) != 1 or len(pre) + len(missing) != topology.num_ranks:
            return None
        root = next(iter(pre))
        roots[root] = roots.get(root, 0) + mult
    return roots


#: Above this many ranks the arborescence bound checks one rank per orbit of the topology's
#: symmetries (below, all ranks: the search for symmetries would cost more than it saves).
_SYMMETRY_CHECK_RANKS = 64


#: Rank orbits times ranks above which the arborescence bound is not computed: each orbit costs
#: a maximum flow over every rank, and 500 orbits of 1000 ranks (line:1000) take 10 s here.
MAX_ARBORESCENCE_WORK = 10 ** 6


def _arborescence_rounds(topology: Topology, roots: dict[int, int]) -> Fraction | None:
    """The rounds LP's optimum when every chunk must reach every rank from one root and links are
    the only limits, computed exactly with integer maximum flows; ``None`` if the capacities would
    not fit the 32-bit flow solver.

    By Edmonds' branching theorem, chunks with roots ``r_i`` can be sent along arc-disjoint
    spanning arborescences (capacity ``R b`` per link, scaled to integers) iff every set S of
    ranks has ``R cap_in(S) >= N(S)``, the number of chunks whose root is outside S. So the LP
    optimum is ``max_S N(S) / cap_in(S)``, found by Dinkelbach's iteration: for the current ratio
    ``R = p/q``, a minimum cut from a super-source (arcs of capacity ``q * chunks`` to each root,
    links of capacity ``p * b``) to each rank v is ``min over S containing v of q m(S) + p
    cap_in(S)``; if it is below ``q * total`` the minimising S has a larger ratio.
    """
    n = topology.num_ranks
    src, dst, bw = _edge_arrays(topology)
    chunks = np.zeros(n, dtype=np.int64)
    for root, mult in roots.items():
        chunks[root] = mult
    total = int(chunks.sum())
    incoming = np.bincount(dst, weights=bw, minlength=n).astype(np.int64)
    best = max(Fraction(total - int(chunks[v]), int(incoming[v])) for v in range(n)
               if total > chunks[v])
    root_list = np.flatnonzero(chunks)
    representatives = np.unique(rank_orbits(topology, chunks), return_index=True)[1] \
        if n > _SYMMETRY_CHECK_RANKS else np.arange(n)
    if len(representatives) * n > MAX_ARBORESCENCE_WORK:  # minutes (line:3000), no answer
        raise InputTooLargeError(
            f"the rounds bound of {topology.name!r} needs a maximum flow over its {n} ranks for "
            f"each of {len(representatives)} rank orbits (its symmetries); collsynth computes "
            f"at most {MAX_ARBORESCENCE_WORK:,} ranks x orbits (a composed topology, --nodes, "
            "has few orbits)")
    rows = np.concatenate([src, np.full(len(root_list), n)])
    cols = np.concatenate([dst, root_list])
    while True:
        p, q = best.numerator, best.denominator
        capacities = np.concatenate([p * bw, q * chunks[root_list]])
        if q * total >= 2 ** 31 or capacities.max() >= 2 ** 31:
            return None
        graph = sp.csr_matrix((capacities.astype(np.int32), (rows, cols)), shape=(n + 1, n + 1))
        improved = None
        for v in representatives:   # one rank per orbit: a symmetry maps its cuts to the others'
            value, reached = _source_side(graph, n, v)
            if value >= q * total:
                continue
            inside = ~reached[:n]
            needed = total - int(chunks[inside].sum())
            capacity = int(bw[inside[dst] & ~inside[src]].sum())
            if capacity <= 0:  # excluded by check_implementable
                raise SolverError(f"ranks {np.flatnonzero(inside).tolist()} of {topology.name!r} "
                                  "need chunks but have no incoming link")
            ratio = Fraction(needed, capacity)
            if improved is None or ratio > improved:
                improved = ratio
        if improved is None:
            return best
        if improved <= best:
            raise SolverError("the arborescence bound failed to improve; maximum flow is inconsistent")
        best = improved


# -- cuts (combining collectives with several destinations) --------------------------------------


def _cut_capacity(topology: Topology, inside: np.ndarray, capacity=None) -> int:
    """An upper bound on the chunks per round from ``inside`` to the other ranks: the links'
    bandwidth, lowered by bandwidth groups (greedily, largest excess first, over groups whose cut
    links are disjoint). ``capacity`` is the topology's
    :class:`~collsynth.topology.capacity.LinkCapacity` (built here when not given)."""

    capacity = capacity if capacity is not None else link_capacity(topology)
    if capacity.groups is None:
        # The links out of ``inside`` into the rest: O(|inside| x |rest|), O(n) for the single
        # ranks and all-but-one sets that make most candidate cuts (n**2 each before).
        n = capacity.num_ranks
        square = capacity.links.reshape(n, n)
        return int(square[np.ix_(np.flatnonzero(inside), np.flatnonzero(~inside))].sum())
    crossing = (inside[:, None] & ~inside[None, :]).ravel()
    bandwidth = capacity.links * crossing
    total = int(bandwidth.sum())
    if capacity.groups is None:
        return total
    excess = np.asarray(capacity.groups @ bandwidth).astype(np.int64) - capacity.limits
    positive = np.flatnonzero(excess > 0)
    used = np.zeros(len(crossing), dtype=bool)
    indptr, indices = capacity.groups.indptr, capacity.groups.indices
    for g in positive[np.argsort(-excess[positive], kind="stable")]:
        links = indices[indptr[g]:indptr[g + 1]]
        links = links[crossing[links]]
        if not used[links].any():
            used[links] = True
            total -= int(excess[g])
    return total


def _candidate_cuts(topology: Topology) -> list[np.ndarray]:
    """The sending sides of a minimum cut (by link bandwidth) separating rank 0 from each other
    rank in each direction, every single rank and every all-but-one set, and on a composed
    topology node 0 (and under leaf switches leaf 0) and the rest.

    Above :data:`_FABRIC_FIRST_RANKS` ranks the ``2 (n - 1)`` maximum flows are too slow: the cuts
    are then every single rank and all-but-one set (only node 0's ranks on a composed topology,
    whose node shift maps the others to them) and each node with its complement. Any cut gives a
    valid bound; fewer cuts can only make it weaker.
    """
    n = topology.num_ranks
    cuts: dict[bytes, np.ndarray] = {}

    def add(inside: np.ndarray) -> None:
        if inside.any() and not inside.all():
            cuts.setdefault(inside.tobytes(), inside)


    singles = range(n)
    shift = node_shift(topology)
    if shift is not None:  # a whole node: its NICs are often the tightest cut
        node = np.zeros(n, dtype=bool)
        node[:shift.ranks_per_node] = True
        add(node)
        add(~node)
        if shift.nodes_per_leaf:  # a whole leaf: its uplinks, when oversubscribed
            leaf = np.zeros(n, dtype=bool)
            leaf[:shift.nodes_per_leaf * shift.ranks_per_node] = True
            add(leaf)
            add(~leaf)
    if n > _FABRIC_FIRST_RANKS:
        if shift is not None:
            singles = range(shift.ranks_per_node)
    else:
        edges = topology.edges
        graph = sp.csr_matrix(([b for _, _, b in edges], ([s for s, _, _ in edges],
                                                         [d for _, d, _ in edges])),
                              shape=(n, n), dtype=np.int32)
        for v in range(1, n):
            for source, sink in ((0, v), (v, 0)):
                add(_source_side(graph, source, sink)[1])
    for v in singles:
        single = np.zeros(n, dtype=bool)
        single[v] = True
        add(single)
        add(~single)
    return list(cuts.values())


def _cut_rounds(topology: Topology, collective: Collective) -> Fraction:
    """Total rounds bound of a combining collective from cuts: across a cut (S, rest), every chunk
    with a contributor in S and a destination outside S needs one send from S to the rest."""

    best = Fraction(0)
    n = topology.num_ranks
    capacity = link_capacity(topology)
    # With bandwidth groups, the greedy lowering of _cut_capacity may overstate a cut; the
    # maximum flow across it in the fabric (groups as vertices) is its exact capacity, and the
    # same measure the composed path uses, so a system gives one bound however it is stored.
    fabric = None
    if topology.effective_groups:
        try:
            fabric = build_fabric(topology)
        except UnsupportedFabricError:
            fabric = None
    # A single rank's cut (and its complement's) has the capacity of every rank of its orbit
    # under the symmetries of the links and groups: measured once per orbit (hub:512 measured
    # 1024 maximum flows in pure Python, minutes, where one pair suffices).
    orbit = rank_orbits(topology, groups=True) if fabric is not None else None
    measured: dict[tuple[bool, int], int] = {}
    for inside in _candidate_cuts(topology):
        members = frozenset(np.flatnonzero(inside).tolist())
        needed = sum(1 for pre, post in zip(collective.precondition, collective.postcondition)
                     if pre & members and post - members)
        if needed:
            key = None
            if orbit is not None and len(members) in (1, n - 1):
                alone = len(members) == 1
                rank = next(iter(members)) if alone else int(np.flatnonzero(~inside)[0])
                key = (alone, int(orbit[rank]))
            crossing = measured.get(key) if key is not None else None
            if crossing is None:
                crossing = _cut_capacity(topology, inside, capacity) if fabric is None \
                    else _quotient_cut(fabric, inside)
                if key is not None:
                    measured[key] = crossing
            if crossing <= 0:  # excluded by check_implementable
                raise SolverError(f"a cut of {topology.name!r} with {n} ranks has no capacity")
            best = max(best, Fraction(needed, crossing))
    return best


# -- rounds per chunk -----------------------------------------------------------------------------


def rounds_per_chunk_lower_bound(topology: Topology, collective: Collective, *,
                                 method: Method = "auto") -> Fraction:
    """The fewest rounds per base chunk (``rounds / chunk_factor``) of any algorithm.

    Non-combining collectives: the optimum of a linear program that relaxes every algorithm.
    Variables ``x[c][e] >= 0`` (how much of chunk ``c`` crosses link ``e``) and, for each rank
    ``d`` lacking ``c``, a unit flow ``f[c][d] <= x[c]`` from ``c``'s precondition to ``d`` (one
    copy on a link serves every destination downstream of it). Every link of bandwidth ``b``
    carries ``sum_c x[c][e] <= b R``, every bandwidth group that can bind at most ``limit * R``;
    the bound is ``min R`` divided by ``chunk_factor``. An algorithm gives a solution (``x`` = its
    sends, each destination's path of sends a flow), so the bound holds for every algorithm.

    It is tighter than msccl-tools' relaxation, which lets a rank forward more than it receives
    and only counts link usage per hop: on DGX1, scatter from rank 0 gets 7/6 where msccl-tools
    reports 7/24, and alltoall 8/3 where msccl-tools reports 5/3 (the 16 chunks from one socket
    to the other share 6 units of cross-socket bandwidth: 16/6 = 8/3).

    Combining collectives with one destination per chunk (reduce, reduce-scatter): the bound of
    the non-combining dual on the reversed topology. Every contributor's value reaches the
    destination along sends of that chunk, so this holds for every algorithm, including ones that
    send partial sums several times.

    Combining collectives with several destinations per chunk (allreduce): the largest, over a set
    of cuts (S, rest), of ``chunks with a contributor in S and a destination outside S`` divided by
    ``chunks per round that can cross from S``, divided by ``chunk_factor``. Those chunks must each
    cross the cut at least once, whatever is summed on the way, so this holds for every algorithm.
    For allreduce it is ``1 / min cut``: the minimum cut by link bandwidth is found exactly
    (maximum flows); bandwidth groups lower the capacity of the cuts examined (the minimum cuts
    found, and each rank's outgoing and incoming cut), so with groups the value is sound but may
    be below the best cut bound. See :func:`compute_bounds` for the composed bound.

    How the LP is solved (``method="auto"``):

    * when every chunk starts on one rank and is needed by all the others (allgather, broadcast,
      reduce and reduce-scatter through their duals) and no bandwidth group can bind, exactly
      and without an LP, by Edmonds' branching theorem and integer maximum flows;
    * otherwise with HiGHS, on an LP reduced by the symmetries of the topology and collective
      (rotations, reflections, transpositions, bit flips that are verified to preserve links,
      groups and chunks; the reduced LP has the same optimum). Identical chunks share variables,
      and chunks with one destination are aggregated into one flow per destination. HiGHS's
      answer is then certified in exact integer arithmetic: its link and group multipliers,
      averaged over the symmetries and read as fractions, give a Lagrangian lower bound whose
      inner minima (shortest paths, minimum-cost arborescences) are computed exactly; its
      solution, read as fractions and checked exactly feasible, gives an upper bound. When
      they meet, the result is the exact optimum. Whatever happens, the value returned is a
      proven lower bound; if it is further than 1e-9 below HiGHS's optimum (not seen in
      practice) a warning is logged and it is rounded down to a denominator of at most 10**6.

    LPs of more than :data:`MAX_LP_VARIABLES` variables are refused before they are built.

    Parameters
    ----------
    method:
        ``"auto"`` as above; ``"highs"``: always the HiGHS LP (no maximum-flow shortcut);
        ``"z3"``: the full LP (no symmetry reduction), its optimum proven by z3's decision
        procedure for linear real arithmetic (``R < V`` unsatisfiable, ``R <= V`` satisfiable for
        HiGHS's value V read as a fraction). An independent cross-check for small problems:
        z3 can take minutes on LPs of a few thousand variables.

    Raises
    ------
    UnimplementableError
        As :func:`check_implementable`.
    InputTooLargeError
        When the LP would have more than :data:`MAX_LP_VARIABLES` variables.
    SolverError
        When a solver fails or its answers contradict each other.
    UnknownNameError
        For an unknown ``method``.

    Examples
    --------
    >>> from collsynth.topology import get_topology
    >>> from collsynth.collective import standard_collective
    >>> ring = get_topology("ring:4")
    >>> rounds_per_chunk_lower_bound(ring, standard_collective("allgather", 4))
    Fraction(3, 2)
    >>> rounds_per_chunk_lower_bound(ring, standard_collective("allgather", 4).split(3))
    Fraction(3, 2)
    >>> rounds_per_chunk_lower_bound(ring, standard_collective("alltoall", 4), method="highs")
    Fraction(2, 1)
    >>> rounds_per_chunk_lower_bound(ring, standard_collective("allreduce", 4))
    Fraction(1, 2)
    """
    if method not in ("auto", "highs", "z3"):
        raise UnknownNameError(f"unknown bounds method {method!r}; valid: auto, highs, z3")
    check_implementable(topology, collective)
    if method == "auto":
        composed = _composed_rounds(topology, collective)
        if composed is not None:
            return composed / collective.chunk_factor
    if _is_multi_destination_combining(collective):
        total = _cut_rounds(topology, collective)
    else:
        label = f"{collective.describe()} on {topology.name!r}"
        total = _copy_rounds(*_copy_problem(topology, collective), method, label)
    return total / collective.chunk_factor


def compute_bounds(topology: Topology, collective: Collective, *, method: Method = "auto") -> Bounds:
    """Every lower bound for ``collective`` on ``topology``.

    ``steps`` and ``rounds_per_chunk`` hold for every algorithm (see
    :func:`steps_lower_bound`, :func:`rounds_per_chunk_lower_bound`). For an allreduce (every
    chunk's precondition and postcondition are the same set P of at least two ranks), the
    composed bounds hold for algorithms made of a reduce-scatter then an allgather over P:

    * ``composed_steps`` = steps bound of the reduce-scatter + that of the allgather;
    * ``composed_rounds_per_chunk`` = ``(R_rs + R_ag) / |P|``. A reduce-scatter then allgather
      with each of their ``|P|`` base chunks split ``k`` ways is an allreduce with ``|P| k``
      chunks, taking ``R_rs k + R_ag k`` rounds at best, so ``(R_rs + R_ag) / |P|`` rounds per
      base chunk of the allreduce (the whole buffer).

    Parameters
    ----------
    method:
        Passed to :func:`rounds_per_chunk_lower_bound`.

    Examples
    --------
    >>> from collsynth.topology import get_topology
    >>> from collsynth.collective import standard_collective
    >>> compute_bounds(get_topology("fully-connected:4"), standard_collective("allreduce", 4))
    Bounds(steps=1, rounds_per_chunk=Fraction(1, 3), composed_rounds_per_chunk=Fraction(1, 2), composed_steps=2)
    """
    expect_type(topology, Topology, "compute_bounds: topology")
    expect_type(collective, Collective, "compute_bounds: collective")
    steps = steps_lower_bound(topology, collective)
    rounds = rounds_per_chunk_lower_bound(topology, collective, method=method)
    ranks = _allreduce_ranks(collective)
    if ranks is None:
        return Bounds(steps=steps, rounds_per_chunk=rounds)
    reduce_scatter, allgather = _composition(collective, ranks)
    composed_steps = steps_lower_bound(topology, reduce_scatter) + steps_lower_bound(topology, allgather)
    composed_rounds = (rounds_per_chunk_lower_bound(topology, reduce_scatter, method=method)
                       + rounds_per_chunk_lower_bound(topology, allgather, method=method)) / len(ranks)
    return Bounds(steps=steps, rounds_per_chunk=rounds, composed_rounds_per_chunk=composed_rounds,
                  composed_steps=composed_steps)
