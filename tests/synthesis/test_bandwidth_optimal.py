"""The large-system tree engine: exact throughput, tree packing, pipelined schedules."""

from __future__ import annotations

import itertools
import json
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from collsynth.algorithm import find_problems
from collsynth.bounds import rounds_per_chunk_lower_bound
from collsynth.cli import main
from collsynth.collective import standard_collective
from collsynth.errors import InvalidCollectiveError, InvalidInstanceError, UnimplementableError
from collsynth.resolve import resolve_topology
from collsynth.synthesis import pareto_front
from collsynth.graph.arborescence import depths, min_arborescence, tree_cost
from collsynth.synthesis.bandwidth_optimal.engine import solve_bandwidth_optimal
from collsynth.graph.fabric import UnsupportedFabricError, build_fabric
from collsynth.graph.symmetry import node_shift
from collsynth.bounds.throughput import optimal_throughput
from collsynth.synthesis.large import choose_engine, solve_large
from collsynth.topology import BandwidthGroup, Topology, compose_nodes, get_topology

SMALL_SYSTEMS = [
    ("ring:4", None, None),
    ("dgx1", None, None),
    ("dgx-a100", None, None),
    ("hub:8", None, None),
    ("fully-connected:4", 2, 1),
    ("ring:4", 2, 1),
    ("ring:4", 3, 1),
    ("dgx-a100", 2, None),
    ("mi300x", 2, None),
    ("dgx1", 2, None),
]


def algorithm_time_us(algorithm, size_bytes, model):
    """An algorithm's (steps, rounds per chunk) on one alpha and beta (``model``)."""
    from collsynth.timing.model import time_us

    coll = algorithm.collective
    return time_us((algorithm.num_steps, algorithm.rounds_per_chunk), size_bytes, coll.name,
                   coll.num_ranks, model=model)


def _system(spec, nodes, nic_units):
    return resolve_topology(spec, nodes=nodes, nic_units=nic_units)


# -- minimum arborescences ---------------------------------------------------------------------


def _brute_force(cost: np.ndarray, root: int) -> float | None:
    n = len(cost)
    others = [v for v in range(n) if v != root]
    best = None
    for choice in itertools.product(range(n), repeat=len(others)):
        parent = np.full(n, -1)
        parent[others] = choice
        if any(parent[v] == v or not np.isfinite(cost[parent[v], v]) for v in others):
            continue
        try:
            depths(parent)
        except InvalidInstanceError:
            continue
        total = tree_cost(cost, parent)
        best = total if best is None else min(best, total)
    return best


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 5).flatmap(lambda n: st.tuples(
    st.just(n), st.lists(st.one_of(st.none(), st.integers(0, 9)), min_size=n * n, max_size=n * n))))
def test_min_arborescence_matches_brute_force(case):
    n, values = case
    cost = np.array([np.inf if v is None else float(v) for v in values]).reshape(n, n)
    expected = _brute_force(cost, 0)
    if expected is None:
        with pytest.raises(UnimplementableError):
            min_arborescence(cost, 0)
        return
    parent = min_arborescence(cost, 0)
    assert parent[0] == -1
    depths(parent)  # a tree
    assert tree_cost(cost, parent) == expected


# -- fabric and exact throughput -----------------------------------------------------------------


@pytest.mark.parametrize("spec,nodes,nic", SMALL_SYSTEMS)
@pytest.mark.parametrize("name", ["allgather", "broadcast", "reduce_scatter"])
def test_throughput_agrees_with_the_core_bound(spec, nodes, nic, name):
    topology = _system(spec, nodes, nic)
    collective = standard_collective(name, topology.num_ranks)
    assert optimal_throughput(topology, collective).rounds_per_chunk == \
        rounds_per_chunk_lower_bound(topology, collective)


def test_throughput_is_per_base_chunk_and_composes_allreduce():
    ring = get_topology("ring:4")
    ag = standard_collective("allgather", 4)
    assert optimal_throughput(ring, ag.split(3)).rounds_per_chunk == Fraction(3, 2)
    allreduce = optimal_throughput(ring, standard_collective("allreduce", 4)).rounds_per_chunk
    assert allreduce == Fraction(3, 4)  # (3/2 + 3/2) / 4


def test_fabric_refuses_groups_it_cannot_express():
    links = ((0, 1, 1), (1, 0, 1), (1, 1, 0))
    odd = Topology("odd", links, (BandwidthGroup(frozenset({0, 1}), frozenset({0, 1, 2}), 1),))
    with pytest.raises(UnsupportedFabricError, match="neither a port"):
        build_fabric(odd)


def test_fabric_of_a_composed_system_is_sparse():
    topology = resolve_topology("dgx-a100", nodes=16)
    fabric = build_fabric(topology)
    assert fabric.num_arcs < len(topology.edges) / 8


def test_node_shift_is_checked_on_the_topology():
    system = compose_nodes(get_topology("ring:4"), 3, nic_units=1)
    assert node_shift(system).nodes == 3
    broken = Topology(system.name, system.links, system.groups[1:], metadata=system.metadata)
    assert node_shift(broken) is None


# -- the engine ----------------------------------------------------------------------------------


@pytest.mark.parametrize("spec,nodes,nic", SMALL_SYSTEMS)
@pytest.mark.parametrize("name", ["allgather", "reduce_scatter", "allreduce"])
def test_engine_reaches_the_bound(spec, nodes, nic, name):
    topology = _system(spec, nodes, nic)
    collective = standard_collective(name, topology.num_ranks)
    result = solve_bandwidth_optimal(topology, collective, stages=2)
    assert find_problems(result.algorithm) == []
    assert result.optimal, (result.steady_state_rounds_per_chunk, result.lower_bound)
    assert result.steady_state_rounds_per_chunk == result.lower_bound
    # Filling and draining the pipeline: never better than the steady state, and at most
    # (depth - 1) extra stages' worth of rounds.
    assert result.lower_bound <= result.rounds_per_chunk
    assert result.rounds_per_chunk <= result.steady_state_rounds_per_chunk * \
        Fraction(result.details["stages"] + result.details["depth"] - 1, result.details["stages"])


@pytest.mark.parametrize("name", ["broadcast", "reduce"])
def test_rooted_collectives_verify_and_respect_the_bound(name):
    topology = resolve_topology("fully-connected:4", nodes=2, nic_units=1)
    for root in (0, 5):
        collective = standard_collective(name, 8, root=root)
        result = solve_bandwidth_optimal(topology, collective, time_limit=20)
        assert find_problems(result.algorithm) == []
        assert result.steady_state_rounds_per_chunk >= result.lower_bound == Fraction(1, 4)


def test_engines_agree_where_the_exact_engine_runs():
    dgx1 = get_topology("dgx1")
    allgather = standard_collective("allgather", 8)
    exact = list(pareto_front(dgx1, allgather))[-1]
    trees = solve_bandwidth_optimal(dgx1, allgather, stages=3)
    assert exact.rounds_per_chunk == trees.lower_bound == trees.steady_state_rounds_per_chunk


def test_more_stages_approach_the_steady_state():
    topology = resolve_topology("dgx-a100", nodes=2)
    collective = standard_collective("allgather", 16)
    short = solve_bandwidth_optimal(topology, collective, stages=1)
    long = solve_bandwidth_optimal(topology, collective, stages=6)
    assert long.rounds_per_chunk < short.rounds_per_chunk
    assert long.steady_state_rounds_per_chunk == short.steady_state_rounds_per_chunk


def test_engine_refuses_other_collectives():
    with pytest.raises(InvalidCollectiveError):
        solve_bandwidth_optimal(get_topology("ring:4"), standard_collective("alltoall", 4))


def _random_node(draw, n):
    links = [[0] * n for _ in range(n)]
    for a in range(n):  # a ring keeps it strongly connected
        links[a][(a + 1) % n] = draw(st.integers(1, 3))
    for a in range(n):
        for b in range(n):
            if a != b and not links[a][b] and draw(st.booleans()):
                links[a][b] = draw(st.integers(1, 3))
    return Topology(f"random{n}", tuple(tuple(row) for row in links))


@st.composite
def random_systems(draw):
    n = draw(st.integers(2, 4))
    node = _random_node(draw, n)
    nodes = draw(st.integers(1, 2))
    if nodes == 1:
        return node
    return compose_nodes(node, nodes, nic_units=draw(st.integers(1, 2)))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_systems(), st.sampled_from(["allgather", "reduce_scatter", "broadcast"]))
def test_random_systems_always_verify_and_never_beat_the_bound(topology, name):
    collective = standard_collective(name, topology.num_ranks)
    result = solve_bandwidth_optimal(topology, collective, stages=2, time_limit=20)
    assert find_problems(result.algorithm) == []
    exact = rounds_per_chunk_lower_bound(topology, collective)
    assert result.lower_bound == exact
    assert result.rounds_per_chunk >= result.steady_state_rounds_per_chunk >= exact


# -- strategy layer and CLI ----------------------------------------------------------------------


def test_choose_engine_by_size_and_collective():
    assert choose_engine(get_topology("dgx1"), standard_collective("allgather", 8)) == "exact"
    big = resolve_topology("dgx-a100", nodes=2)
    assert choose_engine(big, standard_collective("reduce_scatter", 16)) == "trees"
    assert choose_engine(big, standard_collective("alltoall", 16)) == "alltoall"
    assert choose_engine(big, standard_collective("gather", 16)) == "exact"


def test_solve_large_exact_engine_reports_the_bound():
    result = solve_large(get_topology("ring:4"), standard_collective("allgather", 4))
    assert result.engine == "exact"
    assert result.lower_bound == Fraction(3, 2) == result.rounds_per_chunk


def test_cli_bandwidth_optimal_json(capsys, tmp_path):
    out = tmp_path / "ag.json"
    code = main(["solve", "bandwidth-optimal", "dgx-a100", "allgather", "--nodes", "2", "--json",
                 "--stages", "2", "-o", str(out)])
    assert code == 0
    figures = json.loads(capsys.readouterr().out)
    assert figures["engine"] == "trees"
    assert figures["lower_bound"] == "15/13" == figures["steady_state_rounds_per_chunk"]
    assert figures["optimal"] is True
    assert [row["bytes"] for row in figures["predicted_us"]] == [1 << 20, 64 << 20, 1 << 30]
    assert out.exists()


def test_cli_bandwidth_optimal_bad_input(capsys):
    assert main(["solve", "bandwidth-optimal", "dgx-a100", "allgather", "--nodes", "2",
                 "--oversubscription", "0.5"]) == 2
    assert "--oversubscription" in capsys.readouterr().err
    assert main(["solve", "bandwidth-optimal", "dgx-a100", "allgather", "--engine", "magic"]) == 2


def test_stages_follow_the_message_size():
    """Small buffers get one stage (fewest steps), large ones more (closer to the steady state),
    and the chosen schedule is never slower at its size than the other two."""
    from collsynth.timing.alphabeta import from_topology

    topology = resolve_topology("dgx-a100", nodes=4)
    collective = standard_collective("allgather", 32)
    model = from_topology(topology)
    small = solve_bandwidth_optimal(topology, collective, size_bytes=64 << 10)
    large = solve_bandwidth_optimal(topology, collective, size_bytes=1 << 30)
    assert small.details["stages"] == 1 < large.details["stages"]
    for size, mine, other in ((64 << 10, small, large), (1 << 30, large, small)):
        assert algorithm_time_us(mine.algorithm, size, model) <= \
            algorithm_time_us(other.algorithm, size, model)


def test_single_root_seeds_use_only_existing_links():
    """Regression (found by the random test): the chain seeds handed pieces from the root to
    node ranks it has no link to. A ring node: rank 0 reaches only rank 1 directly."""
    system = compose_nodes(get_topology("ring:4"), 2, nic_units=1)
    ring = Topology("one-way-ring:4", ((0, 1, 0, 0), (0, 0, 1, 0), (0, 0, 0, 1), (1, 0, 0, 0)))
    one_way = compose_nodes(ring, 2, nic_units=1)
    for topology in (system, one_way):
        for root in (0, 5):
            result = solve_bandwidth_optimal(topology, standard_collective("broadcast", 8,
                                                                           root=root),
                                             stages=2, time_limit=20)
            assert find_problems(result.algorithm) == []
            assert result.steady_state_rounds_per_chunk >= result.lower_bound


def test_predictions_charge_the_base_latency_to_both_sides():
    """NCCL's lines include its base latency (8.4 us for its Simple ring, NCCL tuning.cc); a
    synthesized algorithm runs in the same launch and pays it too: at any size its predicted
    time is 8.4 us more than its alpha-beta time."""
    from collsynth.timing.alphabeta import from_topology
    from collsynth.timing.closed_form import predicted_against_runtime

    system = compose_nodes(get_topology("dgx-a100"), 2)
    result = solve_bandwidth_optimal(system, standard_collective("allgather", 16), stages=2)
    rows = predicted_against_runtime(result.algorithm, [1 << 20])
    alone = algorithm_time_us(result.algorithm, 1 << 20, from_topology(system))
    assert rows[0].collsynth_us == pytest.approx(alone + 8.4)
