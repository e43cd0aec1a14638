"""Every large-system engine returns one ScheduleResult, its figures measured by hand.

Bounds by hand (rounds per base chunk, one-unit links): on ``ring:4`` an allgather rank receives
3 chunks over 2 incoming links (3/2); on two fully connected 4-GPU nodes with one-unit NICs a rank
receives 7 chunks over 3 + 1 links (7/4), on two 4-GPU rings 7 chunks over 2 + 1 links (7/3); on
``hub:4`` each rank sends its 3 alltoall blocks through one unit (3).
"""

from __future__ import annotations

import json
from fractions import Fraction

import pytest

from collsynth.algorithm import find_problems
from collsynth.collective import standard_collective
from collsynth.synthesis import ScheduleResult
from collsynth.synthesis.hierarchical import hierarchical_algorithm
from collsynth.synthesis.large import solve_large
from collsynth.topology import compose_nodes, get_topology

_TWO_RINGS = compose_nodes(get_topology("ring:4"), 2, nic_units=1)

# engine, topology, collective, the bound by hand, the engine's own details
CASES = [
    ("exact", get_topology("ring:4"), "allgather", Fraction(3, 2), {"pareto_points"}),
    ("trees", compose_nodes(get_topology("fully-connected:4"), 2, nic_units=1), "allgather",
     Fraction(7, 4), {"stages", "pieces_per_root", "depth"}),
    ("alltoall", get_topology("hub:4"), "alltoall", Fraction(3),
     {"schedule", "cut_bound", "exact_bound", "candidates"}),
    ("hierarchical", _TWO_RINGS, "allgather", Fraction(7, 3), {"node_algorithms", "pipeline"}),
]


@pytest.mark.parametrize("engine, topology, name, bound, details", CASES,
                         ids=[case[0] for case in CASES])
def test_every_engine_returns_one_schedule_result(engine, topology, name, bound, details):
    result = solve_large(topology, standard_collective(name, topology.num_ranks), engine=engine,
                         time_limit=60)
    assert type(result) is ScheduleResult and result.engine == engine
    assert find_problems(result.algorithm) == []
    assert result.rounds_per_chunk == result.algorithm.rounds_per_chunk
    assert result.lower_bound == bound
    assert result.ratio == result.steady_state_rounds_per_chunk / bound
    assert result.optimal == (result.steady_state_rounds_per_chunk == bound)
    assert (result.steps, result.chunks) == (result.algorithm.num_steps, result.algorithm.chunks)
    assert set(result.details) == details
    with pytest.raises(TypeError):
        result.details["stages"] = 1  # read-only
    figures = json.loads(json.dumps(result.to_json()))
    assert figures["engine"] == engine and figures["lower_bound"] == str(bound)
    assert figures["optimal"] is result.optimal and figures["ratio"] == str(result.ratio)
    assert details <= set(figures)


def test_the_hierarchical_engine_alone_has_no_bound():
    # Two rings: the node allgather (2 steps, 3 rounds per chunk, 2 chunks) after one NIC step;
    # nothing proves it optimal (the bound, 7/3, is below its 3).
    result = hierarchical_algorithm(_TWO_RINGS, "allgather", batches=1, parts=1)
    assert result.lower_bound is None and result.ratio is None and not result.optimal
    assert result.rounds_per_chunk == result.steady_state_rounds_per_chunk == 3
    assert result.to_json()["lower_bound"] is None
    assert result.details["pipeline"] == ((1, 1),)
    measured = solve_large(_TWO_RINGS, standard_collective("allgather", 8),
                           engine="hierarchical")
    assert measured.lower_bound == Fraction(7, 3) and not measured.optimal
    assert measured.ratio == Fraction(9, 7) and "bound" in measured.timings


def test_details_are_a_copy():
    details = {"stages": 2}
    result = ScheduleResult(solve_large(get_topology("hub:4"), standard_collective("alltoall", 4),
                                        engine="alltoall").algorithm,
                            "trees", Fraction(3), Fraction(3), Fraction(3), 0.0, {}, details)
    details["stages"] = 5
    assert result.details["stages"] == 2
