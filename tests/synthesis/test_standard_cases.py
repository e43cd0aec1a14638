"""A table of standard cases run against every backend and every strategy.

Each row: topology, collective, root, the least number of steps (one round per step, one
chunk), and the Pareto front (steps, rounds per chunk) under the default chunk limit. Every
algorithm any strategy returns is replayed by the verifier here again, independently of the
verification the library already did.
"""

from __future__ import annotations

from fractions import Fraction

import pytest

from collsynth.algorithm import Instance, find_problems
from collsynth.collective import standard_collective
from collsynth.encoding import Outcome, Status
from collsynth.errors import SolverError
from collsynth.synthesis import SolveOptions, SweepLog, pareto_front, solve_instance, solve_least_steps
from collsynth.topology import get_topology

# topology, collective, root, least steps, front, max_chunks (None: default)
CASES = [
    ("ring:4", "allgather", None, 2, [(2, "3/2")], None),
    ("ring:8", "allgather", None, 4, [(4, "7/2")], None),
    ("fully-connected:4", "allgather", None, 1, [(1, "1")], None),
    ("hub:4", "allgather", None, 3, [(1, "3")], None),
    ("line:4", "broadcast", 0, 3, [(3, "3"), (4, "2")], None),
    ("star:5", "gather", 0, 1, [(1, "1")], None),
    ("dgx1", "gather", 0, 2, [(2, "7/6")], None),
    ("dgx1", "scatter", 0, 2, [(2, "7/6")], None),
    ("dgx1", "broadcast", 0, 2, [(2, "1"), (3, "1/2")], 6),
    ("ring:4", "reduce_scatter", None, 2, [(2, "3/2")], None),
    ("ring:4", "alltoall", None, 2, [(2, "2")], None),
    ("line:4", "reduce", 1, 2, [(2, "2"), (3, "3/2")], None),
]
SLOW_FOR_Z3 = {("dgx1", "broadcast")}
BACKENDS = ["cpsat", "z3", "z3-path"]


def _collective(name, topology, root):
    return standard_collective(name, topology.num_ranks, root=root)


def _ids(case):
    return f"{case[0]}-{case[1]}"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_least_steps_is_sat_at_k_and_unsat_below(case, backend):
    topo_name, coll_name, root, least, _front, _ = case
    topology = get_topology(topo_name)
    collective = _collective(coll_name, topology, root)
    options = SolveOptions(backend=backend, time_limit=60)
    result = solve_least_steps(topology, collective, options=options)
    assert result.status is Status.SAT
    assert result.instance.steps == least
    assert find_problems(result.algorithm) == []
    if least > 1:
        below = solve_instance(topology, collective, Instance(steps=least - 1), options=options)
        assert below.status is Status.UNSAT
        assert below.algorithm is None


# z3 needs minutes for the SLOW_FOR_Z3 sweeps; cpsat covers them.
PARETO_CASES = [pytest.param(case, backend, id=f"{_ids(case)}-{backend}")
                for case in CASES for backend in BACKENDS
                if not (backend.startswith("z3") and (case[0], case[1]) in SLOW_FOR_Z3)]


@pytest.mark.parametrize("case, backend", PARETO_CASES)
def test_pareto_front_matches_table(case, backend):
    topo_name, coll_name, root, _least, front, max_chunks = case
    topology = get_topology(topo_name)
    collective = _collective(coll_name, topology, root)
    log = SweepLog()
    results = list(pareto_front(topology, collective, max_chunks=max_chunks,
                                options=SolveOptions(backend=backend, time_limit=120), log=log))
    assert [(r.instance.steps, str(r.rounds_per_chunk)) for r in results] == front
    assert log.complete
    for r in results:
        assert find_problems(r.algorithm) == []
        assert r.algorithm.rounds_per_chunk == r.rounds_per_chunk
    # Strictly improving: each point beats every point with fewer steps.
    values = [r.rounds_per_chunk for r in results]
    assert values == sorted(values, reverse=True) and len(set(values)) == len(values)


def test_dgx1_allgather_front_matches_msccl_tools():
    results = list(pareto_front(get_topology("dgx1"), standard_collective("allgather", 8)))
    assert [(r.instance.steps, r.rounds_per_chunk) for r in results] == \
        [(2, Fraction(3, 2)), (3, Fraction(7, 6))]


@pytest.mark.parametrize("topo_name, max_chunks, expected", [
    ("fully-connected:4", 6, [(1, "1"), (2, "1/2")]),   # msccl-tools: (1, 1), (2, 2/3)
    ("dgx1", 4, [(2, "1"), (3, "3/4")]),                # msccl-tools: (2, 1)
])
def test_allreduce_fronts_dominate_msccl_tools(topo_name, max_chunks, expected):
    topology = get_topology(topo_name)
    results = list(pareto_front(topology, standard_collective("allreduce", topology.num_ranks),
                                max_chunks=max_chunks))
    assert [(r.instance.steps, str(r.rounds_per_chunk)) for r in results] == expected
    for r in results:
        assert find_problems(r.algorithm) == []


def test_allreduce_composition_is_used_when_chunks_allow_it():
    # With z3 there is no direct combining search: the front comes from reduce-scatter + allgather.
    topology = get_topology("fully-connected:4")
    log = SweepLog()
    results = list(pareto_front(topology, standard_collective("allreduce", 4), max_chunks=4,
                                options=SolveOptions(backend="z3"), log=log))
    assert [(r.instance.steps, str(r.rounds_per_chunk)) for r in results] == [(2, "1/2")]
    assert "reduce-scatter + allgather" in results[0].detail
    assert not log.complete  # the direct search was not run


def test_timeout_is_a_status_not_unsat():
    result = solve_instance(get_topology("hub:16"), standard_collective("allgather", 16),
                            Instance(steps=15), options=SolveOptions(time_limit=0.05))
    assert result.status in (Status.TIMEOUT, Status.UNKNOWN)
    assert result.algorithm is None


class _LyingBackend:
    """Claims every instance is satisfiable with no sends at all."""

    name = "liar"

    def available(self):
        return True

    def solve(self, problem, *, time_limit):
        return Outcome(Status.SAT, chosen=(), rounds=tuple([1] * problem.num_steps))


def test_a_wrong_solver_answer_cannot_leave_the_library():
    with pytest.raises(SolverError, match="fails verification"):
        solve_instance(get_topology("ring:4"), standard_collective("allgather", 4),
                       Instance(steps=2), options=SolveOptions(backend=_LyingBackend(),
                                                               symmetry=False))


def test_symmetric_search_and_full_search_agree_on_satisfiability():
    topology, collective = get_topology("hub:8"), standard_collective("allgather", 8)
    for symmetry in (True, False):
        result = solve_instance(topology, collective, Instance(steps=7),
                                options=SolveOptions(symmetry=symmetry))
        assert result.status is Status.SAT
        assert find_problems(result.algorithm) == []


def test_prune_dominated_keeps_one_of_equal_points_and_drops_dominated_ones():
    from collsynth.synthesis import prune_dominated
    from collsynth.synthesis.result import SynthesisResult

    def point(steps, rounds, chunks):
        return SynthesisResult(Instance(steps=steps, rounds=rounds, chunks=chunks), Status.SAT,
                               None, 0.0, "test")

    results = [point(3, 7, 6), point(2, 3, 2), point(2, 6, 4), point(3, 9, 6), point(4, 7, 6),
               SynthesisResult(Instance(steps=1), Status.UNSAT, None, 0.0, "test")]
    kept = prune_dominated(results)
    assert [(r.instance.steps, r.instance.total_rounds, r.instance.chunks) for r in kept] == \
        [(2, 3, 2), (3, 7, 6)]


def _timing_out(real, undecided):
    """``solve_checked`` that answers TIMEOUT for the instances in ``undecided`` (steps, rounds,
    chunks, minimize) and solves every other one."""
    from collsynth.synthesis.result import SynthesisResult

    def solve(topology, collective, instance, options, deadline, limit=None, *,
              minimize_rounds=False, record=None):
        key = (instance.steps, instance.rounds, instance.chunks, minimize_rounds)
        if key in undecided:
            result = SynthesisResult(instance, Status.TIMEOUT, None, 0.0, "test", "forced timeout")
            if record is not None:
                record(result)
            return result
        return real(topology, collective, instance, options, deadline, limit,
                    minimize_rounds=minimize_rounds, record=record)
    return solve


def test_a_timeout_at_a_step_count_whose_point_meets_the_bound_leaves_the_front_complete(
        monkeypatch):
    """DGX-1 allgather: the bound is 7/6, met at 3 steps. If the 3-step instance (7, 6) times out
    while enumerating but minimising then finds 7/6, nothing at 3 steps could beat it."""
    from collsynth.synthesis import strategies

    monkeypatch.setattr(strategies, "solve_checked",
                        _timing_out(strategies.solve_checked, {(3, 7, 6, False)}))
    log = SweepLog()
    front = list(pareto_front(get_topology("dgx1"), standard_collective("allgather", 8), log=log))
    assert [(r.instance.steps, str(r.rounds_per_chunk)) for r in front] == [(2, "3/2"), (3, "7/6")]
    assert any(a.status is Status.TIMEOUT for a in log.attempts)
    assert log.complete


def test_a_timeout_that_may_hide_a_better_point_makes_the_front_incomplete(monkeypatch):
    """Ring:4 allgather (bound 3/2): if every 2-step instance with 2 chunks times out, the front
    stops at 2/1 for 2 steps, which might not be the best there: incomplete."""
    from collsynth.synthesis import strategies

    undecided = {(2, r, 2, m) for r in range(2, 9) for m in (False, True)}
    monkeypatch.setattr(strategies, "solve_checked",
                        _timing_out(strategies.solve_checked, undecided))
    log = SweepLog()
    front = list(pareto_front(get_topology("ring:4"), standard_collective("allgather", 4),
                              max_chunks=2, log=log))
    assert front and front[0].rounds_per_chunk > Fraction(3, 2)
    assert not log.complete
