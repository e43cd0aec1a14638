"""Soundness of collsynth.bounds against formulations written here, and against every engine.

* Verified algorithms from every backend and engine never beat the bounds, on random tiny
  topologies (asymmetric links included) and collectives whose chunks several ranks hold.
  The searches below choose their step and round ranges without reading the bounds, so an
  unsound (too high) bound shows up as an algorithm below it.
* The rounds bound equals a plain linear program written here (one variable per chunk, link and
  destination; no symmetry, no aggregation of chunks, no shortcut), and is at least the best cut
  found by brute force over every set of ranks (equal where a theorem says the cut is exact).
* The steps bound equals hop distances found by breadth-first search here.
"""

from __future__ import annotations

import itertools
from collections import deque
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st
from scipy.optimize import linprog

from collsynth.algorithm import Algorithm, Send, Step, find_problems, verify
from collsynth.algorithm.model import Instance
from collsynth.bounds import compute_bounds, rounds_per_chunk_lower_bound, steps_lower_bound
from collsynth.collective import Collective, standard_collective
from collsynth.encoding.backend import Status
from collsynth.errors import UnimplementableError
from collsynth.synthesis import SolveOptions
from collsynth.synthesis.instance import check_inputs, solve_checked
from collsynth.limits import Deadline
from collsynth.topology import BandwidthGroup, Topology

F = Fraction

#: Seconds any one solver call may take (a hang guard, far above what these tiny cases need).
_SOLVER_LIMIT_S = 60.0

# -- the hand-made case ----------------------------------------------------------------------------

#: Three ranks: 0 -> 1 with bandwidth 1, 1 -> 2 with bandwidth 3, nothing else. Three chunks are
#: held by both 0 and 1 and needed by 2. Rank 1 sends all three to rank 2 in one round, so the
#: bound is 1; supplying the chunks from their lowest holder (rank 0) only would squeeze all three
#: through 0 -> 1 and claim 3.
ASYMMETRIC = Topology("asym3", ((0, 1, 0), (0, 0, 3), (0, 0, 0)))
DUPLICATED = Collective("dup", 3, (frozenset({0, 1}),) * 3, (frozenset({2}),) * 3)

#: Four ranks, the same idea for chunks with several destinations: chunks 0 and 1 are held by 0
#: and 1 and needed by 2 and 3; 0 reaches the others only through 1 (bandwidth 1), while 1 sends
#: to 2 and 3 with bandwidth 2 each. Rank 1 sends both chunks to both in one round.
FOUR = Topology("asym4", ((0, 1, 0, 0), (0, 0, 2, 2), (0, 0, 0, 0), (0, 0, 0, 0)))
SPREAD = Collective("spread", 4, (frozenset({0, 1}),) * 2, (frozenset({2, 3}),) * 2)


def test_multi_holder_chunks_are_supplied_by_every_holder():
    one_round = Algorithm("from-rank-1", ASYMMETRIC, DUPLICATED,
                          (Step(1, tuple(Send(c, 1, 2) for c in range(3))),))
    verify(one_round)
    assert one_round.rounds_per_chunk == 1
    for method in ("auto", "highs", "z3"):
        assert rounds_per_chunk_lower_bound(ASYMMETRIC, DUPLICATED, method=method) == 1
    assert steps_lower_bound(ASYMMETRIC, DUPLICATED) == 1

    both = Algorithm("from-rank-1", FOUR, SPREAD,
                     (Step(1, tuple(Send(c, 1, d) for c in range(2) for d in (2, 3))),))
    verify(both)
    assert both.rounds_per_chunk == 1
    for method in ("auto", "highs", "z3"):
        assert rounds_per_chunk_lower_bound(FOUR, SPREAD, method=method) == 1


# -- independent formulations ----------------------------------------------------------------------


def _hops(links, sources) -> list[float]:
    """Breadth-first hop distance from the nearest of ``sources`` to every rank."""
    n = len(links)
    dist = [float("inf")] * n
    queue = deque()
    for s in sources:
        dist[s] = 0
        queue.append(s)
    while queue:
        u = queue.popleft()
        for v in range(n):
            if links[u][v] and dist[v] == float("inf"):
                dist[v] = dist[u] + 1
                queue.append(v)
    return dist


def _steps_by_bfs(topology: Topology, collective: Collective) -> int:
    """Non-combining: the farthest needing rank from its chunk's nearest holder. Combining: the
    farthest destination from a contributor it needs."""
    links = topology.links
    worst = 0
    for pre, post in zip(collective.precondition, collective.postcondition):
        if collective.combining:
            for u in pre:
                dist = _hops(links, [u])
                worst = max([worst] + [dist[d] for d in post if d != u])
        else:
            dist = _hops(links, sorted(pre))
            worst = max([worst] + [dist[d] for d in post - pre])
    return int(worst)


def _as_copies(topology: Topology, collective: Collective) -> tuple[list[list[int]], list]:
    """The links matrix and the (holders, needing ranks) of every chunk of the copy problem: the
    collective itself, or for a combining one with one destination per chunk, every contributor
    needing the destination's value on the reversed links (the sends of a reduction, read
    backwards, carry the destination's chunk to every contributor)."""
    n = topology.num_ranks
    links = [list(row) for row in topology.links]
    pairs = list(zip(collective.precondition, collective.postcondition))
    if not collective.combining:
        return links, [(pre, post - pre) for pre, post in pairs if post - pre]
    reversed_links = [[links[v][u] for v in range(n)] for u in range(n)]
    copies = []
    for pre, post in pairs:
        (d,) = post
        if pre - {d}:
            copies.append((frozenset({d}), pre - {d}))
    return reversed_links, copies


def _groups(topology: Topology, reverse: bool) -> list[tuple[int, list[tuple[int, int]]]]:
    """(limit, links it covers) of every bandwidth group, on the reversed links if asked."""
    result = []
    for g in topology.groups:
        sources, destinations = g.sources, g.destinations
        if reverse:
            sources, destinations = destinations, sources
        result.append((g.limit, [(s, d) for s in sorted(sources) for d in sorted(destinations)
                                 if s != d]))
    return result


def _plain_lp(links, copies, groups) -> float:
    """The rounds linear program in its plainest form: ``x[c][e]`` (share of chunk c on link e,
    at most 1), for each rank d needing c a unit flow ``f[c][d]`` with ``f <= x`` from a
    super-source feeding c's holders, ``sum_c x[c][e] <= b_e R`` and ``sum over a group's links
    <= limit R``. Minimises R (total rounds); one set of variables per chunk, nothing shared."""
    n = len(links)
    edges = [(u, v, links[u][v]) for u in range(n) for v in range(n) if links[u][v]]
    index = {(u, v): i for i, (u, v, _) in enumerate(edges)}
    num_e = len(edges)
    columns = 1  # column 0 is R
    upper = [None]
    x_of, f_of, s_of = {}, {}, {}
    for c, (pre, missing) in enumerate(copies):
        x_of[c] = list(range(columns, columns + num_e))
        columns += num_e
        upper += [1] * num_e
        for d in sorted(missing):
            f_of[(c, d)] = list(range(columns, columns + num_e))
            columns += num_e
            s_of[(c, d)] = {h: columns + i for i, h in enumerate(sorted(pre))}
            columns += len(pre)
            upper += [1] * (num_e + len(pre))
    a_ub, b_ub, a_eq, b_eq = [], [], [], []

    def row(entries) -> np.ndarray:
        r = np.zeros(columns)
        for j, value in entries:
            r[j] += value
        return r

    for e, (_, _, b) in enumerate(edges):  # link capacity
        a_ub.append(row([(x_of[c][e], 1) for c in x_of] + [(0, -b)]))
        b_ub.append(0)
    for limit, covered in groups:  # bandwidth groups
        used = [index[link] for link in covered if link in index]
        a_ub.append(row([(x_of[c][e], 1) for c in x_of for e in used] + [(0, -limit)]))
        b_ub.append(0)
    for (c, d), f in f_of.items():
        for e in range(num_e):  # one copy on a link serves every destination behind it
            a_ub.append(row([(f[e], 1), (x_of[c][e], -1)]))
            b_ub.append(0)
        source = s_of[(c, d)]
        a_eq.append(row([(j, 1) for j in source.values()]))  # the super-source emits one chunk
        b_eq.append(1)
        for v in range(n):  # in(v) - out(v) + from the super-source = [v == d]
            entries = [(f[e], 1) for e, (_, w, _) in enumerate(edges) if w == v]
            entries += [(f[e], -1) for e, (u, _, _) in enumerate(edges) if u == v]
            if v in source:
                entries.append((source[v], 1))
            a_eq.append(row(entries))
            b_eq.append(1 if v == d else 0)
    cost = np.zeros(columns)
    cost[0] = 1
    result = linprog(cost, A_ub=np.array(a_ub), b_ub=b_ub, A_eq=np.array(a_eq) if a_eq else None,
                     b_eq=b_eq if b_eq else None, bounds=[(0, u) for u in upper], method="highs")
    assert result.status == 0, result.message
    return float(result.fun)


def _best_cut(links, copies) -> Fraction:
    """Brute force over every set S of ranks: the chunks some rank of S needs and no rank of S
    holds must cross into S, over links of total bandwidth cap_in(S); the largest ratio."""
    n = len(links)
    best = F(0)
    for size in range(1, n):
        for inside in itertools.combinations(range(n), size):
            s = set(inside)
            needed = sum(1 for pre, missing in copies if not pre & s and missing & s)
            if needed:
                capacity = sum(links[u][v] for u in range(n) for v in s if u not in s)
                assert capacity > 0  # an implementable collective always has one
                best = max(best, F(needed, capacity))
    return best


def _cut_is_exact(n: int, copies) -> bool:
    """Without bandwidth groups the cut bound is the LP optimum when every chunk is needed by
    every rank that lacks it (arc-disjoint arborescences from root sets: Kamiyama, Katoh and
    Takizawa 2009, the multi-holder form of Edmonds' branching theorem), or when every chunk has
    the same single destination (one commodity: maximum flow, minimum cut)."""
    if all(len(pre) + len(missing) == n for pre, missing in copies):
        return True
    return len({missing for _, missing in copies}) == 1 and all(len(m) == 1 for _, m in copies)


def _combining_cut(topology: Topology, collective: Collective) -> Fraction:
    """Brute force over every set S: each chunk with a contributor in S and a destination outside
    S crosses out of S at least once."""
    n = topology.num_ranks
    links = topology.links
    best = F(0)
    for size in range(1, n):
        for inside in itertools.combinations(range(n), size):
            s = set(inside)
            needed = sum(1 for pre, post in zip(collective.precondition, collective.postcondition)
                         if pre & s and post - s)
            if needed:
                capacity = sum(links[u][v] for u in s for v in range(n) if v not in s)
                best = max(best, F(needed, capacity))
    return best


# -- random tiny instances -------------------------------------------------------------------------


def _subset(draw, n: int, *, min_size: int) -> frozenset[int]:
    return frozenset(draw(st.lists(st.integers(0, n - 1), min_size=min_size, max_size=n,
                                   unique=True)))


@st.composite
def topologies(draw, *, max_ranks: int = 4, groups: bool = False,
               connected: bool = False) -> Topology:
    """2 to ``max_ranks`` ranks; each direction of each pair independently absent or of
    bandwidth 1 to 3 (so links are often one-way or asymmetric); optionally a bandwidth group.
    ``connected``: a one-way cycle through every rank first, so that every rank reaches every
    other."""
    n = draw(st.integers(2, max_ranks))
    links = [[0 if a == b else draw(st.sampled_from((0, 0, 1, 1, 2, 3))) for b in range(n)]
             for a in range(n)]
    if connected:
        order = draw(st.permutations(list(range(n))))
        for a, b in zip(order, order[1:] + order[:1]):
            links[a][b] = max(links[a][b], 1)
    group_list = ()
    if groups and draw(st.booleans()):
        group_list = (BandwidthGroup(_subset(draw, n, min_size=1), _subset(draw, n, min_size=1),
                                     draw(st.integers(1, 2))),)
    return Topology(f"random{n}", tuple(map(tuple, links)), group_list)


@st.composite
def collectives(draw, n: int, *, combining: bool | None = False,
                several: bool = True) -> Collective:
    """A custom collective of 1-3 chunks. Non-combining: holders are often several ranks.
    Combining (``None``: either): contributors are any ranks; one destination per chunk
    (reduce-like), or if ``several`` allows, any destinations (allreduce-like)."""
    if combining is None:
        combining = draw(st.booleans())
    several = several and combining and draw(st.booleans())
    count = draw(st.integers(1, 3))
    pre, post = [], []
    for _ in range(count):
        pre.append(_subset(draw, n, min_size=1))
        if several:
            post.append(_subset(draw, n, min_size=1))
        elif combining:
            post.append(frozenset({draw(st.integers(0, n - 1))}))
        else:
            post.append(_subset(draw, n, min_size=0))
    return Collective("custom", n, tuple(pre), tuple(post), combining=combining)


def _implementable(topology: Topology, collective: Collective) -> bool:
    try:
        check_inputs(topology, collective)
    except UnimplementableError:
        return False
    return True


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.filter_too_much])
@given(data=st.data(), topology=topologies(groups=True))
@example(data=None, topology=ASYMMETRIC)
@example(data=None, topology=FOUR)
def test_rounds_bound_equals_an_independent_lp(data, topology):
    """bounds.py's rounds bound (all three methods) equals the plain LP, and is at least the best
    cut (equal to it where the cut is exact)."""
    n = topology.num_ranks
    if data is None:
        collective = DUPLICATED if n == 3 else SPREAD
    else:
        collective = data.draw(collectives(n, combining=None, several=False))
    assume(_implementable(topology, collective))
    links, copies = _as_copies(topology, collective)
    groups = _groups(topology, reverse=collective.combining)
    expected = _plain_lp(links, copies, groups) if copies else 0.0
    for method in ("auto", "highs", "z3"):
        value = rounds_per_chunk_lower_bound(topology, collective, method=method)
        assert float(value) == pytest.approx(expected, abs=1e-7), (method, value, expected)
    cut = _best_cut(links, copies)
    assert cut <= value
    if not topology.groups and _cut_is_exact(n, copies):
        assert cut == value
    assert steps_lower_bound(topology, collective) == _steps_by_bfs(topology, collective)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), topology=topologies(groups=False))
def test_several_destination_combining_bound_is_a_cut(data, topology):
    """Combining chunks with several destinations (allreduce-like): the bound is a cut bound, so at
    most the best cut found by brute force; for allreduce itself it is that best cut."""
    n = topology.num_ranks
    every = frozenset(range(n))
    count = data.draw(st.integers(1, 2))
    pre = tuple(_subset(data.draw, n, min_size=1) for _ in range(count))
    post = tuple(_subset(data.draw, n, min_size=2) for _ in range(count))
    collective = Collective("allreduce-like", n, pre, post, combining=True)
    allreduce = Collective("allreduce", n, (every,), (every,), combining=True)
    for candidate, exact in ((collective, False), (allreduce, True)):
        if not _implementable(topology, candidate):
            continue
        value = rounds_per_chunk_lower_bound(topology, candidate)
        best = _combining_cut(topology, candidate)
        assert value == best if exact else value <= best
        assert steps_lower_bound(topology, candidate) == _steps_by_bfs(topology, candidate)


# -- verified algorithms never beat the bounds -----------------------------------------------------


def _least_rounds(topology, collective, steps: int, chunks: int, backend: str):
    """A verified algorithm with ``steps`` steps, ``chunks`` chunks and the fewest rounds the
    backend finds (CP-SAT minimises; the z3 backends try rounds upwards), or ``None``. The range
    of rounds comes from the instance, never from the bounds: enough rounds that every rank can
    receive every chunk it lacks (each rank takes in a chunk at most once per step)."""
    options = SolveOptions(backend=backend, time_limit=_SOLVER_LIMIT_S,
                           symmetry=backend != "z3-path")
    most = steps * collective.num_chunks * chunks * (topology.num_ranks - 1)
    if backend == "cpsat":
        result = solve_checked(topology, collective, Instance(steps=steps, rounds=most,
                                                              chunks=chunks),
                               options, Deadline(_SOLVER_LIMIT_S), minimize_rounds=True)
        assert result.status in (Status.SAT, Status.UNSAT), result.summary()
        return result.algorithm
    for rounds in range(steps, most + 1):
        result = solve_checked(topology, collective, Instance(steps=steps, rounds=rounds,
                                                              chunks=chunks),
                               options, Deadline(_SOLVER_LIMIT_S))
        if result.status is Status.SAT:
            return result.algorithm
        assert result.status is Status.UNSAT, result.summary()
    return None


def _assert_within_bounds(algorithm: Algorithm, bounds) -> None:
    assert find_problems(algorithm) == []
    assert algorithm.num_steps >= bounds.steps, (algorithm, bounds)
    assert algorithm.rounds_per_chunk >= bounds.rounds_per_chunk, (algorithm, bounds)


def _smt_search(topology: Topology, collective: Collective, backends, chunk_counts) -> int:
    """From 1 step up to the first two step counts at which the backend finds an algorithm, with
    every backend and chunk count; returns how many algorithms were checked. ``n - 1`` steps
    suffice for a copy or a reduction along a tree, ``2 (n - 1)`` for a reduction then a copy."""
    bounds = compute_bounds(topology, collective)
    n = topology.num_ranks
    several = collective.combining and any(len(post) > 1 for post in collective.postcondition)
    most_steps = 2 * (n - 1) if several else n - 1
    found = 0
    for backend in backends:
        for chunks in chunk_counts:
            sat = 0
            for steps in range(1, most_steps + 1):
                algorithm = _least_rounds(topology, collective, steps, chunks, backend)
                if algorithm is not None:
                    _assert_within_bounds(algorithm, bounds)
                    found += 1
                    sat += 1
                    if sat == 2:
                        break
    return found


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.filter_too_much])
@given(data=st.data(), topology=topologies(max_ranks=4, groups=True))
@example(data=None, topology=ASYMMETRIC)
@example(data=None, topology=FOUR)
def test_no_smt_algorithm_beats_the_bounds(data, topology):
    """CP-SAT, z3 and z3's path encoding on custom collectives whose chunks several ranks hold
    (and reduce-like combining ones), at one and two chunks."""
    n = topology.num_ranks
    if data is None:
        collective = DUPLICATED if n == 3 else SPREAD
    else:
        collective = data.draw(collectives(n, combining=None))
    assume(_implementable(topology, collective))
    several = collective.combining and any(len(post) > 1 for post in collective.postcondition)
    backends = ("cpsat", "z3", "z3-path") if n <= 3 and not several else ("cpsat",)
    assert _smt_search(topology, collective, backends, (1, 2)) > 0


STANDARD = ("allgather", "alltoall", "broadcast", "gather", "scatter", "reduce", "reduce_scatter",
            "allreduce")


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(topology=topologies(max_ranks=4, connected=True), name=st.sampled_from(STANDARD),
       root_seed=st.integers(0, 3))
def test_no_engine_beats_the_bounds_on_standard_collectives(topology, name, root_seed):
    """Standard collectives: CP-SAT at one and two chunks (z3 too on 2-3 ranks), and the tree and
    alltoall engines wherever they accept the input."""
    from collsynth.synthesis.alltoall_scale import solve_alltoall_at_scale
    from collsynth.synthesis.bandwidth_optimal import solve_bandwidth_optimal
    from collsynth.synthesis.large import _tree_shaped

    n = topology.num_ranks
    rooted = name in ("broadcast", "gather", "scatter", "reduce")
    collective = standard_collective(name, n, root=root_seed % n if rooted else None)
    assume(_implementable(topology, collective))
    bounds = compute_bounds(topology, collective)
    backends = ("cpsat", "z3") if n <= 3 and name != "allreduce" else ("cpsat",)
    assert _smt_search(topology, collective, backends, (1, 2) if n <= 3 else (1,)) > 0
    if _tree_shaped(collective):
        result = solve_bandwidth_optimal(topology, collective, stages=2,
                                         time_limit=_SOLVER_LIMIT_S)
        _assert_within_bounds(result.algorithm, bounds)
        if bounds.composed_rounds_per_chunk is not None:  # a reduce-scatter then an allgather
            assert result.algorithm.rounds_per_chunk >= bounds.composed_rounds_per_chunk
            assert result.algorithm.num_steps >= bounds.composed_steps
    if name == "alltoall" and all(topology.links[a][b] or a == b
                                  for a in range(n) for b in range(n)):
        _assert_within_bounds(solve_alltoall_at_scale(topology).algorithm, bounds)
