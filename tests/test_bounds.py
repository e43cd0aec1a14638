"""Tests of collsynth.bounds: a table of known bounds, the cross-checks between solving methods,
the error cases, and checks that verified algorithms never beat a bound."""

from __future__ import annotations

import itertools
import random
from fractions import Fraction

import pytest

import collsynth.bounds.core as bounds_module
from collsynth.graph.arborescence import min_arborescence_cost
from collsynth.algorithm import Algorithm, Send, Step, verify
from collsynth.bounds import (
    Bounds,
    check_implementable,
    compute_bounds,
    rounds_per_chunk_lower_bound,
    steps_lower_bound,
)
from collsynth.collective import Collective, allgather, allreduce, reduce, standard_collective
from collsynth.errors import (
    InputTooLargeError,
    InvalidCollectiveError,
    UnimplementableError,
    UnknownNameError,
)
from collsynth.topology import BandwidthGroup, Topology, get_topology

F = Fraction

# (topology, collective, root, steps bound, rounds-per-chunk bound)
STANDARD_CASES = [
    ("dgx1", "allgather", None, 2, F(7, 6)),
    # msccl-tools reports 5/3; 16 chunks cross 6 units between the sockets, so 8/3 holds.
    ("dgx1", "alltoall", None, 2, F(8, 3)),
    ("dgx1", "reduce_scatter", None, 2, F(7, 6)),
    ("dgx1", "gather", 0, 2, F(7, 6)),
    # msccl-tools reports a weaker 7/24 (its relaxation lets a rank forward more than it gets).
    ("dgx1", "scatter", 0, 2, F(7, 6)),
    ("dgx1", "broadcast", 0, 2, F(1, 6)),
    ("dgx1", "reduce", 0, 2, F(1, 6)),
    ("ring:8", "allgather", None, 4, F(7, 2)),
    ("ring:8", "alltoall", None, 4, F(8)),
    ("fully-connected:4", "allgather", None, 1, F(1)),
    ("fully-connected:16", "allgather", None, 1, F(1)),
    ("fully-connected:16", "alltoall", None, 1, F(1)),
    ("hub:16", "allgather", None, 1, F(15)),
    ("hub:16", "alltoall", None, 1, F(15)),
    ("line:4", "broadcast", 0, 3, F(1)),
    ("line:4", "reduce", 3, 3, F(1)),
    ("star:5", "gather", 0, 1, F(1)),
    ("star:5", "allgather", None, 2, F(4)),
]

# (topology, steps, rounds per chunk (any algorithm), composed steps, composed rounds per chunk)
ALLREDUCE_CASES = [
    ("fully-connected:4", 1, F(1, 3), 2, F(1, 2)),
    ("dgx1", 2, F(1, 6), 4, F(7, 24)),
    ("ring:8", 4, F(1, 2), 8, F(7, 8)),
    ("hub:16", 1, F(1), 2, F(15, 8)),
]


def _collective(name: str, n: int, root: int | None) -> Collective:
    return standard_collective(name, n, root=root)


@pytest.mark.parametrize("topology_name, name, root, steps, rounds", STANDARD_CASES)
def test_standard_bounds(topology_name, name, root, steps, rounds):
    topology = get_topology(topology_name)
    collective = _collective(name, topology.num_ranks, root)
    result = compute_bounds(topology, collective)
    assert result == Bounds(steps=steps, rounds_per_chunk=rounds)
    assert isinstance(result.steps, int) and isinstance(result.rounds_per_chunk, Fraction)
    assert steps_lower_bound(topology, collective) == steps
    assert rounds_per_chunk_lower_bound(topology, collective) == rounds


@pytest.mark.parametrize("topology_name, steps, rounds, composed_steps, composed_rounds", ALLREDUCE_CASES)
def test_allreduce_bounds(topology_name, steps, rounds, composed_steps, composed_rounds):
    topology = get_topology(topology_name)
    result = compute_bounds(topology, allreduce(topology.num_ranks))
    assert result == Bounds(steps=steps, rounds_per_chunk=rounds,
                            composed_rounds_per_chunk=composed_rounds, composed_steps=composed_steps)
    # The composed class is a subset of all algorithms: its bounds can only be larger.
    assert result.composed_rounds_per_chunk >= result.rounds_per_chunk
    assert result.composed_steps >= result.steps


def test_allreduce_composed_is_reduce_scatter_plus_allgather():
    topology = get_topology("dgx1")
    n = topology.num_ranks
    rs = compute_bounds(topology, standard_collective("reduce_scatter", n))
    ag = compute_bounds(topology, standard_collective("allgather", n))
    result = compute_bounds(topology, allreduce(n))
    assert result.composed_rounds_per_chunk == (rs.rounds_per_chunk + ag.rounds_per_chunk) / n
    assert result.composed_steps == rs.steps + ag.steps


def test_non_allreduce_has_no_composed_bounds():
    result = compute_bounds(get_topology("ring:4"), allgather(4))
    assert result.composed_rounds_per_chunk is None and result.composed_steps is None


# -- solving methods agree -------------------------------------------------------------------------

CROSS_CHECK_CASES = [
    ("dgx1", "alltoall", None),
    ("dgx1", "scatter", 0),
    ("dgx1", "reduce", 3),
    ("ring:6", "allgather", None),
    ("line:5", "alltoall", None),
    ("star:5", "allgather", None),
    ("hub:4", "allgather", None),
    ("hub:5", "broadcast", 1),
    ("hub:5", "alltoall", None),
]


@pytest.mark.parametrize("topology_name, name, root", CROSS_CHECK_CASES)
def test_methods_agree(topology_name, name, root):
    """auto (max-flow shortcut or symmetry-reduced HiGHS), highs (symmetry-reduced LP) and z3 (the
    full LP, optimum proven by z3) give the same exact value."""
    topology = get_topology(topology_name)
    collective = _collective(name, topology.num_ranks, root)
    values = {method: rounds_per_chunk_lower_bound(topology, collective, method=method)
              for method in ("auto", "highs", "z3")}
    assert len(set(values.values())) == 1, values


def _random_topology(rng: random.Random, n: int, *, groups: bool) -> Topology:
    links = [[rng.randint(1, 3) if a != b and rng.random() < 0.5 else 0 for b in range(n)]
             for a in range(n)]
    group_list = []
    if groups:
        for _ in range(rng.randint(1, 2)):
            sources = frozenset(rng.sample(range(n), rng.randint(1, n)))
            destinations = frozenset(rng.sample(range(n), rng.randint(1, n)))
            group_list.append(BandwidthGroup(sources, destinations, rng.randint(1, 3)))
    return Topology("random", tuple(map(tuple, links)), tuple(group_list))


def test_random_small_problems_methods_agree():
    rng = random.Random(20240601)
    checked = 0
    while checked < 12:
        n = rng.randint(2, 4)
        topology = _random_topology(rng, n, groups=rng.random() < 0.5)
        k = rng.randint(1, 4)
        pre = tuple(frozenset(rng.sample(range(n), rng.randint(1, 2))) for _ in range(k))
        post = tuple(frozenset(rng.sample(range(n), rng.randint(1, n))) for _ in range(k))
        collective = Collective("random", n, pre, post)
        try:
            check_implementable(topology, collective)
        except UnimplementableError:
            continue
        values = {rounds_per_chunk_lower_bound(topology, collective, method=method)
                  for method in ("auto", "highs", "z3")}
        assert len(values) == 1, (topology.links, topology.groups, collective)
        checked += 1


def test_arborescence_shortcut_matches_lp():
    """Allgather-like collectives without bandwidth groups skip the LP (Edmonds' theorem)."""
    rng = random.Random(7)
    checked = 0
    while checked < 25:
        n = rng.randint(2, 6)
        topology = _random_topology(rng, n, groups=False)
        roots = [rng.randrange(n) for _ in range(rng.randint(1, 4))]
        collective = Collective("multi-broadcast", n, tuple(frozenset({r}) for r in roots),
                                (frozenset(range(n)),) * len(roots))
        try:
            auto = rounds_per_chunk_lower_bound(topology, collective)
        except UnimplementableError:
            continue
        assert auto == rounds_per_chunk_lower_bound(topology, collective, method="highs")
        checked += 1


def test_allreduce_cut_bound_is_the_best_cut():
    rng = random.Random(3)
    checked = 0
    while checked < 25:
        n = rng.randint(2, 6)
        topology = _random_topology(rng, n, groups=False)
        try:
            value = rounds_per_chunk_lower_bound(topology, allreduce(n))
        except UnimplementableError:
            continue
        best = max(Fraction(1, sum(topology.links[u][v] for u in side for v in range(n) if v not in side))
                   for size in range(1, n) for side in itertools.combinations(range(n), size))
        assert value == best
        checked += 1


def test_min_arborescence_matches_brute_force():
    rng = random.Random(11)
    for _ in range(40):
        n = rng.randint(2, 5)
        arcs = [(u, v, rng.randint(0, 9)) for u in range(n) for v in range(n)
                if u != v and rng.random() < 0.6]
        cost = {(u, v): c for u, v, c in arcs}
        best = None
        others = [v for v in range(1, n)]
        for parents in itertools.product(range(n), repeat=len(others)):
            if any((p, v) not in cost for p, v in zip(parents, others)):
                continue
            parent = dict(zip(others, parents))
            ok = True
            for v in others:  # every node must lead back to the root 0
                seen, x = set(), v
                while x != 0 and x not in seen:
                    seen.add(x)
                    x = parent[x]
                ok = ok and x == 0
            if ok:
                total = sum(cost[(parent[v], v)] for v in others)
                best = total if best is None else min(best, total)
        assert min_arborescence_cost(n, 0, arcs) == best


# -- splitting, unimplementable and other inputs ----------------------------------------------------

@pytest.mark.parametrize("topology_name, name, root", [
    ("dgx1", "allgather", None),
    ("dgx1", "gather", 0),
    ("hub:4", "allgather", None),
    ("ring:4", "reduce_scatter", None),
    ("dgx1", "allreduce", None),
])
def test_split_collective_has_the_same_bounds(topology_name, name, root):
    topology = get_topology(topology_name)
    collective = _collective(name, topology.num_ranks, root)
    whole = compute_bounds(topology, collective)
    assert compute_bounds(topology, collective.split(3)) == whole
    assert rounds_per_chunk_lower_bound(topology, collective.split(2), method="highs") == \
        whole.rounds_per_chunk


ONEWAY = Topology("oneway", ((0, 1, 0), (0, 0, 1), (0, 0, 0)))


def test_unimplementable_allgather_names_rank_and_chunk():
    with pytest.raises(UnimplementableError) as info:
        check_implementable(ONEWAY, allgather(3))
    error = info.value
    assert (error.rank, error.chunk) in {(0, 1), (0, 2), (1, 2)}
    assert f"rank {error.rank}" in str(error) and f"chunk {error.chunk}" in str(error)
    assert "precondition" in str(error)
    for function in (steps_lower_bound, rounds_per_chunk_lower_bound, compute_bounds):
        with pytest.raises(UnimplementableError):
            function(ONEWAY, allgather(3))


def test_unimplementable_reduce_names_the_contribution():
    with pytest.raises(UnimplementableError) as info:
        compute_bounds(ONEWAY, reduce(3, 0))
    assert info.value.rank == 0 and info.value.chunk == 0
    assert "contribution of rank" in str(info.value)
    with pytest.raises(UnimplementableError):
        compute_bounds(ONEWAY, allreduce(3))


def test_disconnected_topology_is_unimplementable():
    two_pairs = Topology("pairs", ((0, 1, 0, 0), (1, 0, 0, 0), (0, 0, 0, 1), (0, 0, 1, 0)))
    with pytest.raises(UnimplementableError) as info:
        compute_bounds(two_pairs, standard_collective("broadcast", 4, root=0))
    assert info.value.rank in (2, 3) and info.value.chunk == 0


def test_forward_only_reachability_is_enough():
    """oneway can broadcast from rank 0 and reduce to rank 2."""
    assert compute_bounds(ONEWAY, standard_collective("broadcast", 3, root=0)).steps == 2
    assert compute_bounds(ONEWAY, reduce(3, 2)) == Bounds(steps=2, rounds_per_chunk=F(1))


def test_rank_count_mismatch():
    with pytest.raises(InvalidCollectiveError):
        compute_bounds(get_topology("ring:4"), allgather(5))


def test_nothing_to_move():
    collective = Collective("noop", 3, (frozenset({0, 1}),), (frozenset({1}),))
    assert compute_bounds(ONEWAY, collective) == Bounds(steps=0, rounds_per_chunk=F(0))


def test_too_large_lp_is_refused_before_building():
    with pytest.raises(InputTooLargeError, match="linear program"):
        rounds_per_chunk_lower_bound(get_topology("hub:200"), standard_collective("alltoall", 200))


def test_large_broadcast_shaped_bounds_come_from_the_fabric():
    """Above 128 ranks allgather-like bounds come from the fabric's cuts instead of an LP that
    would not fit: on hub:200 every rank takes in one chunk per round, so 199 rounds."""
    assert rounds_per_chunk_lower_bound(get_topology("hub:200"), allgather(200)) == 199
    with pytest.raises(InputTooLargeError):
        rounds_per_chunk_lower_bound(get_topology("hub:200"), allgather(200), method="highs")


def test_size_limit_is_applied(monkeypatch):
    monkeypatch.setattr(bounds_module, "MAX_LP_VARIABLES", 10)
    with pytest.raises(InputTooLargeError, match="more than the 10"):
        rounds_per_chunk_lower_bound(get_topology("dgx1"), standard_collective("alltoall", 8))


def test_unknown_method():
    with pytest.raises(UnknownNameError):
        rounds_per_chunk_lower_bound(get_topology("ring:4"), allgather(4), method="simplex")


# -- bounds never beat a verified algorithm ----------------------------------------------------------

def _check_meets_bound(algorithm: Algorithm) -> None:
    verify(algorithm)
    result = compute_bounds(algorithm.topology, algorithm.collective)
    assert result.steps <= algorithm.num_steps
    assert result.rounds_per_chunk == algorithm.rounds_per_chunk  # these algorithms are optimal


def test_fully_connected_allgather_in_one_round():
    topology = get_topology("fully-connected:4")
    sends = tuple(Send(c, c, d) for c in range(4) for d in range(4) if d != c)
    _check_meets_bound(Algorithm("direct", topology, allgather(4), (Step(1, sends),)))


def test_hub_allgather_in_three_rounds():
    topology = get_topology("hub:4")
    sends = tuple(Send(c, c, d) for c in range(4) for d in range(4) if d != c)
    _check_meets_bound(Algorithm("direct", topology, allgather(4), (Step(3, sends),)))


def test_bidirectional_ring_allgather():
    n = 8
    topology = get_topology(f"ring:{n}")
    collective = allgather(n).split(2)  # piece 2c goes clockwise, piece 2c + 1 counterclockwise
    steps = []
    for t in range(n - 1):
        sends = []
        for c in range(n):
            sends.append(Send(2 * c, (c + t) % n, (c + t + 1) % n))
            sends.append(Send(2 * c + 1, (c - t) % n, (c - t - 1) % n))
        steps.append(Step(1, tuple(sends)))
    _check_meets_bound(Algorithm("ring", topology, collective, tuple(steps)))


def test_large_allreduce_cut_bound_uses_node_cuts():
    """Above 128 ranks the allreduce cut bound uses single ranks of node 0 and whole nodes (no
    2(n-1) maximum flows); on DGX A100 nodes the node's 8 NIC units are the tightest cut either
    way, so 16 nodes (exact path) and 17 nodes (fast path) give the same 1/8."""
    from collsynth.resolve import resolve_topology

    exact = rounds_per_chunk_lower_bound(resolve_topology("dgx-a100", nodes=16),
                                         standard_collective("allreduce", 128))
    fast = rounds_per_chunk_lower_bound(resolve_topology("dgx-a100", nodes=17),
                                        standard_collective("allreduce", 136))
    assert exact == fast == Fraction(1, 8)


@pytest.mark.parametrize("name", ["ring:80", "line:70", "mesh:9x9", "torus:8x10", "star:70"])
def test_checking_one_rank_per_orbit_gives_the_full_answer(name, monkeypatch):
    """Above 64 ranks the arborescence bound checks one rank per symmetry orbit; checking every
    rank (the threshold raised) must give the same bound."""
    topology = get_topology(name)
    collective = allgather(topology.num_ranks)
    fast = rounds_per_chunk_lower_bound(topology, collective)
    monkeypatch.setattr(bounds_module, "_SYMMETRY_CHECK_RANKS", 10 ** 6)
    assert rounds_per_chunk_lower_bound(topology, collective) == fast


def test_large_ring_and_torus_bounds_by_hand():
    # ring:N: the farthest rank is N/2 hops away; each rank receives N-1 chunks over 2 links.
    ring = get_topology("ring:1000")
    assert compute_bounds(ring, allgather(1000)) == Bounds(steps=500, rounds_per_chunk=F(999, 2))
    # torus:AxB: diameter A/2 + B/2; 4 incoming links per rank.
    torus = get_topology("torus:16x16")
    assert compute_bounds(torus, allgather(256)) == Bounds(steps=16, rounds_per_chunk=F(255, 4))


def test_one_rank_per_orbit_still_finds_a_cut_away_from_rank_0(monkeypatch):
    """Cliques of 60 and 20 ranks joined by one link: the 20-rank side needs 60 chunks over one
    link (60 rounds per chunk, counted by hand), a cut that only a rank of that side finds."""
    n, a = 80, 60
    links = [[0] * n for _ in range(n)]
    for u in range(n):
        for v in range(n):
            if u != v and (u < a) == (v < a):
                links[u][v] = 1
    links[0][a] = links[a][0] = 1
    topology = Topology("dumbbell", links)
    assert rounds_per_chunk_lower_bound(topology, allgather(n)) == 60


def test_a_huge_rounds_lp_gives_way_to_the_fabric_cut_bound(monkeypatch, caplog):
    """When the LP is beyond the automatic size, the fabric's cut bound stands in for it (with a
    warning); on a system with a NIC per GPU the two agree, and method='highs' still solves
    the LP."""
    import logging

    from collsynth.bounds import core
    from collsynth.resolve import resolve_topology

    system = resolve_topology("dgx-h100", nodes=2)
    gather = standard_collective("allgather", 16)
    exact = rounds_per_chunk_lower_bound(system, gather, method="highs")
    monkeypatch.setattr(core, "_LP_AUTO_MAX_VARIABLES", 10)
    with caplog.at_level(logging.WARNING, logger=core.logger.name):
        assert rounds_per_chunk_lower_bound(system, gather) == exact
    assert "fabric's cut bound" in caplog.text
    assert rounds_per_chunk_lower_bound(system, gather, method="highs") == exact
