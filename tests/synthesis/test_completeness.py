"""A search says in its result whether it is complete: ``complete`` and ``stopped_by`` on the
Pareto front, on each instance's result and on the large engines' results."""

from __future__ import annotations

import dataclasses
from fractions import Fraction

import pytest

from collsynth.algorithm.model import Instance
from collsynth.collective import standard_collective
from collsynth.synthesis import (STOP_CAUSES, ParetoFront, SolveOptions, Status, SweepLog,
                                 pareto_front, solve_instance, solve_least_steps)
from collsynth.topology import get_topology


def test_a_complete_front_says_so():
    # ring:4 allgather: 3/2 rounds per chunk at 2 steps meets the rounds bound (each rank
    # receives 3 chunks over 2 links), so the sweep ends there, complete.
    front = pareto_front(get_topology("ring:4"), standard_collective("allgather", 4))
    assert isinstance(front, ParetoFront)
    assert (front.complete, front.stopped_by) == (False, "unfinished")  # nothing iterated yet
    points = list(front)
    assert [(r.instance.steps, r.rounds_per_chunk) for r in points] == [(2, Fraction(3, 2))]
    assert front.points == points
    assert (front.complete, front.stopped_by) == (True, None)
    assert front.reason == "reached the rounds-per-chunk lower bound"
    assert all(r.complete and r.stopped_by is None for r in points)


def test_a_front_cut_short_by_its_time_limit_says_so():
    # One nanosecond cannot decide the first DGX-1 instance: the front is cut short by the time
    # limit, and the result says so without a SweepLog.
    front = pareto_front(get_topology("dgx1"), standard_collective("allgather", 8),
                         options=SolveOptions(time_limit=1e-9))
    points = list(front)
    assert points == [] and front.done
    assert (front.complete, front.stopped_by) == (False, "time_limit")
    assert front.reason == "time limit"
    # A SweepLog passed in receives the same verdict.
    log = SweepLog()
    list(pareto_front(get_topology("dgx1"), standard_collective("allgather", 8),
                      options=SolveOptions(time_limit=1e-9), log=log))
    assert (log.complete, log.cause) == (False, "time_limit")


def test_a_timeout_at_one_instance_makes_the_front_incomplete(monkeypatch):
    # ring:4 allgather with every 2-step instance of 2 chunks timing out: 2/1 at 2 steps might
    # not be the best there (3/2 is), so the front is incomplete because of a time limit.
    from collsynth.synthesis import strategies

    real = strategies.solve_checked

    def solve(topology, collective, instance, options, deadline, limit=None, **keywords):
        if instance.steps == 2 and instance.chunks == 2:
            return strategies.SynthesisResult(instance, Status.TIMEOUT, None, 0.0, "test")
        return real(topology, collective, instance, options, deadline, limit, **keywords)

    monkeypatch.setattr(strategies, "solve_checked", solve)
    front = pareto_front(get_topology("ring:4"), standard_collective("allgather", 4),
                         max_chunks=2)
    points = list(front)
    assert points and points[0].rounds_per_chunk > Fraction(3, 2)
    assert (front.complete, front.stopped_by) == (False, "time_limit")


def test_one_instance_says_whether_it_was_decided():
    ring = get_topology("ring:4")
    allgather = standard_collective("allgather", 4)
    sat = solve_instance(ring, allgather, Instance(steps=2, rounds=3, chunks=2))
    # One step cannot reach the rank two hops away: unsatisfiable, a proof, so complete.
    unsat = solve_instance(ring, allgather, Instance(steps=1, rounds=3, chunks=1))
    late = solve_instance(get_topology("dgx1"), standard_collective("allgather", 8),
                          Instance(steps=3, rounds=7, chunks=6),
                          options=SolveOptions(time_limit=1e-9))
    assert (sat.status, sat.complete, sat.stopped_by) == (Status.SAT, True, None)
    assert (unsat.status, unsat.complete, unsat.stopped_by) == (Status.UNSAT, True, None)
    assert (late.status, late.complete, late.stopped_by) == (Status.TIMEOUT, False, "time_limit")
    least = solve_least_steps(ring, allgather, options=SolveOptions(time_limit=1e-9))
    assert (least.complete, least.stopped_by) == (False, "time_limit")
    assert set(STOP_CAUSES) >= {"time_limit", "interrupt", "solver"}


def _packing_with(monkeypatch, **changes):
    """Run the tree engine's packing with ``changes`` to its options."""
    import collsynth.synthesis.bandwidth_optimal.engine as engine

    import collsynth.synthesis.bandwidth_optimal.packing as packing

    real = engine.pack_trees
    if changes.get("time_limit") == 0.0:
        # A zero limit stops the packing before its first trees (its set-up checks the deadline
        # too); these tests are about the column generation cut short after them, so only that
        # check sees the limit.
        monkeypatch.setattr(packing, "_check_deadline", lambda deadline, doing: None)

    def packed(topology, roots, *, target=None, options=None):
        return real(topology, roots, target=target,
                    options=dataclasses.replace(options, **changes))

    monkeypatch.setattr(engine, "pack_trees", packed)
    return engine.solve_bandwidth_optimal


@pytest.mark.parametrize("name", ["allgather", "reduce_scatter", "allreduce"])
def test_a_tree_packing_cut_short_says_so(monkeypatch, name):
    # DGX-1: the first trees of the column generation give 4 rounds per chunk for allgather,
    # far from the 7/6 bound; with no time to improve them the schedule is the best found.
    solve = _packing_with(monkeypatch, time_limit=0.0)
    dgx1 = get_topology("dgx1")
    result = solve(dgx1, standard_collective(name, 8))
    assert not result.optimal
    assert (result.complete, result.stopped_by) == (False, "time_limit")
    assert result.to_json()["stopped_by"] == "time_limit"
    monkeypatch.undo()
    from collsynth.synthesis.bandwidth_optimal.engine import solve_bandwidth_optimal

    full = solve_bandwidth_optimal(dgx1, standard_collective(name, 8))
    assert full.optimal and (full.complete, full.stopped_by) == (True, None)


def test_an_iteration_limit_is_a_cause_too(monkeypatch):
    solve = _packing_with(monkeypatch, max_iterations=1)
    result = solve(get_topology("dgx1"), standard_collective("allgather", 8))
    assert (result.complete, result.stopped_by) == (False, "iteration_limit")


@pytest.mark.parametrize("name", ["allgather", "reduce_scatter", "allreduce"])
def test_a_compact_schedule_cut_short_says_so(monkeypatch, name):
    # Compact (symmetric) schedules on 3 rings of 4: the first trees give 8 rounds per chunk,
    # the bound is 11/3; with no time for the column generation the result says it stopped.
    import collsynth.synthesis.bandwidth_optimal.packing as packing
    from collsynth.synthesis.bandwidth_optimal.engine import solve_bandwidth_optimal
    from collsynth.topology import compose_nodes
    from collsynth.topology.families import ring

    real = packing.pack_trees

    def packed(topology, roots, *, target=None, options=None):
        return real(topology, roots, target=target,
                    options=dataclasses.replace(options, time_limit=0.0))

    system = compose_nodes(ring(4), 3, nic_units=1)
    monkeypatch.setattr(packing, "pack_trees", packed)
    # Only the column generation sees the zero limit (see _packing_with).
    monkeypatch.setattr(packing, "_check_deadline", lambda deadline, doing: None)
    cut = solve_bandwidth_optimal(system, standard_collective(name, 12), compact=True)
    assert cut.compact is not None and not cut.optimal
    assert (cut.complete, cut.stopped_by) == (False, "time_limit")
    monkeypatch.undo()
    full = solve_bandwidth_optimal(system, standard_collective(name, 12), compact=True)
    assert full.optimal and (full.complete, full.stopped_by) == (True, None)


class _SlowBackend:
    """A backend that thinks for ``seconds`` and then gives up (as a solver at its limit)."""

    name = "slow"

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def available(self) -> bool:
        return True

    def solve(self, problem, *, time_limit, minimize_rounds=False):
        import time

        from collsynth.encoding.backend import Outcome

        time.sleep(self.seconds)
        return Outcome(Status.UNKNOWN, seconds=self.seconds, detail="gave up")


def test_a_long_solve_sends_heartbeats():
    # One instance solved for 0.6 s with a heartbeat every 0.1 s: about 5 lines, each naming
    # the instance; none once the solve has returned.
    import time

    lines: list[str] = []
    options = SolveOptions(backend=_SlowBackend(0.6), symmetry=False, on_progress=lines.append,
                           progress_interval_s=0.1)
    result = solve_instance(get_topology("ring:4"), standard_collective("allgather", 4),
                            Instance(steps=2, rounds=3, chunks=2), options=options)
    assert (result.status, result.stopped_by) == (Status.UNKNOWN, "solver")
    count = len(lines)
    assert count >= 3, lines
    assert all(line.startswith("steps=2 rounds=3 chunks=2: solving, ") and
               line.endswith(" s so far (time limit 300 s)") for line in lines), lines
    time.sleep(0.3)
    assert len(lines) == count  # the heartbeat stopped with the solve
    # least-steps: the same heartbeat for each instance it tries.
    lines.clear()
    solve_least_steps(get_topology("ring:4"), standard_collective("allgather", 4),
                      max_steps=2, options=options)
    assert len(lines) >= 3 and lines[0].startswith("steps=2 rounds=2 chunks=1: solving")


def test_a_failing_progress_callback_does_not_stop_the_solve():
    def broken(line: str) -> None:
        raise RuntimeError("display gone")

    options = SolveOptions(backend=_SlowBackend(0.3), symmetry=False, on_progress=broken,
                           progress_interval_s=0.05)
    result = solve_instance(get_topology("ring:4"), standard_collective("allgather", 4),
                            Instance(steps=2, rounds=3, chunks=2), options=options)
    assert result.status is Status.UNKNOWN
    with pytest.raises(Exception, match="progress_interval_s"):
        SolveOptions(progress_interval_s=0)


@pytest.mark.parametrize("mode", ["instance", "least-steps"])
def test_the_cli_prints_heartbeats_on_stderr(monkeypatch, capsys, mode):
    # The CLI hands the solver a heartbeat that writes to stderr (every 5 s; here the test
    # makes it beat every 0.05 s during a 0.3 s solve); --json leaves stderr quiet.
    from collsynth import cli
    from collsynth.cli import solve as solve_cli

    def slow(options):
        return dataclasses.replace(options, backend=_SlowBackend(0.3), symmetry=False,
                                   progress_interval_s=0.05)

    for name in ("solve_instance", "solve_least_steps"):
        real = getattr(solve_cli, name)
        monkeypatch.setattr(solve_cli, name, lambda *a, _real=real, options, **k: _real(
            *a, options=slow(options), **k))
    argv = ["solve", mode, "ring:4", "allgather"]
    argv += ["--steps", "2", "--rounds", "3", "--chunks", "2"] if mode == "instance" \
        else ["--max-steps", "2"]
    code = cli.main(argv)
    err = capsys.readouterr().err
    assert code == 4  # as before: nothing found within the limit (the solver gave up)
    beats = [line for line in err.splitlines() if "so far" in line]
    assert len(beats) >= 2 and all(line.startswith("  steps=2 ") for line in beats), err
    assert cli.main(argv + ["--json"]) == 4
    assert "so far" not in capsys.readouterr().err


def test_the_exact_engine_says_when_its_front_was_cut_short(monkeypatch):
    # Every ring:4 instance of 2 chunks or more times out: the exact engine's point has whole
    # rounds per chunk where the bound is 3/2, not proven the best.
    from collsynth.synthesis import strategies
    from collsynth.synthesis.large import solve_large

    real = strategies.solve_checked

    def solve(topology, collective, instance, options, deadline, limit=None, **keywords):
        if instance.chunks >= 2:
            return strategies.SynthesisResult(instance, Status.TIMEOUT, None, 0.0, "test")
        return real(topology, collective, instance, options, deadline, limit, **keywords)

    ring, allgather = get_topology("ring:4"), standard_collective("allgather", 4)
    full = solve_large(ring, allgather, engine="exact")
    assert full.optimal and (full.complete, full.stopped_by) == (True, None)
    monkeypatch.setattr(strategies, "solve_checked", solve)
    cut = solve_large(ring, allgather, engine="exact")
    assert cut.rounds_per_chunk > cut.lower_bound
    assert (cut.complete, cut.stopped_by) == (False, "time_limit")
