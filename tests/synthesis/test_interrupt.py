"""Ctrl-C during a search: the solver is stopped and what was found is kept.

Ctrl-C is simulated in process with ``_thread.interrupt_main`` from inside a backend's solve (the
same Python-level interrupt a SIGINT raises), so the tests are deterministic; one test sends a
real SIGINT to a ``collsynth`` subprocess once its progress shows a point was found.
"""

from __future__ import annotations

import _thread
import json
import os
import signal
import subprocess
import sys
import threading
from fractions import Fraction
from pathlib import Path

import pytest

from collsynth import cli, interrupts
from collsynth.algorithm.fileformat import load_algorithm
from collsynth.algorithm.model import Instance
from collsynth.collective import standard_collective
from collsynth.encoding import BACKENDS, CpSatBackend
from collsynth.encoding.backend import Outcome, SolveInterrupted, Status, run_interruptibly
from collsynth.synthesis import (
    SolveOptions,
    SweepLog,
    pareto_front,
    solve_instance,
    solve_least_steps,
)
from collsynth.topology import get_topology

ROOT = Path(__file__).resolve().parents[2]
# Every test here presses Ctrl-C (conftest.py: ctrl_c_reaches_python).
pytestmark = pytest.mark.usefixtures("ctrl_c_reaches_python")


def _press_ctrl_c_and_wait(stopped: threading.Event) -> None:
    """What a user's Ctrl-C does to a solve in progress: interrupt the main thread, then the
    solver runs until it is told to stop."""
    _thread.interrupt_main()
    assert stopped.wait(30), "the solver was never told to stop"


class _CtrlCBackend(CpSatBackend):
    """CP-SAT, except that Ctrl-C is pressed during the solves ``press(problem)`` selects.

    With ``held=True`` the interrupted solver holds a schedule (as CP-SAT does while
    minimising): the real answer, returned after the stop.
    """

    def __init__(self, press, *, held: bool = False) -> None:
        super().__init__()
        self.press, self.held, self.stops = press, held, 0

    def solve(self, problem, *, time_limit, minimize_rounds=False):
        if not self.press(problem):
            return super().solve(problem, time_limit=time_limit, minimize_rounds=minimize_rounds)
        answer = (super().solve(problem, time_limit=time_limit, minimize_rounds=minimize_rounds)
                  if self.held else Outcome(Status.UNKNOWN))
        stopped = threading.Event()

        def stop() -> None:
            self.stops += 1
            stopped.set()

        def work() -> Outcome:
            _press_ctrl_c_and_wait(stopped)
            return answer

        return run_interruptibly(work, stop)


def test_run_interruptibly_stops_the_solver_and_hands_over_what_it_held():
    stopped = threading.Event()

    def work() -> str:
        _press_ctrl_c_and_wait(stopped)
        return "held"

    with pytest.raises(SolveInterrupted) as caught:
        run_interruptibly(work, stopped.set)
    assert stopped.is_set()
    assert caught.value.partial == "held"
    assert isinstance(caught.value, KeyboardInterrupt)  # code that does not look for it stops


def test_run_interruptibly_passes_answers_and_errors_through():
    assert run_interruptibly(lambda: 7, lambda: None) == 7

    def broken() -> None:
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        run_interruptibly(broken, lambda: None)


def test_sweep_interrupted_keeps_the_point_found_at_the_step_count_being_searched():
    # DGX-1 allgather: 3/2 rounds per chunk at 2 steps with 2 chunks (the README's 2/3/2); the
    # sweep minimises per chunk count, so Ctrl-C while it tries 3 chunks must keep that point.
    dgx1 = get_topology("dgx1")
    backend = _CtrlCBackend(lambda problem: problem.collective.chunk_factor >= 3)
    log = SweepLog()
    sweep = pareto_front(dgx1, standard_collective("allgather", 8), max_chunks=8,
                         options=SolveOptions(backend=backend, symmetry=False), log=log)
    front = list(sweep)
    assert (sweep.complete, sweep.stopped_by) == (False, "interrupt")  # the result says so
    assert [(r.instance.steps, r.rounds_per_chunk) for r in front] == [(2, Fraction(3, 2))]
    assert front[0].algorithm is not None and front[0].algorithm.rounds_per_chunk == Fraction(3, 2)
    assert log.interrupted and not log.complete and log.stopped_by == "interrupted"
    assert log.attempts[-1].status is Status.INTERRUPTED
    assert backend.stops == 1


def test_a_ctrl_c_dropped_in_a_callback_is_lost_under_the_default_handler(monkeypatch,
                                                                          drop_ctrl_c):
    # The failure the reliable handler exists for (stderr of CI stop 28): nothing is raised.
    dropped = []
    monkeypatch.setattr(sys, "unraisablehook", dropped.append)  # Python's "Exception ignored"
    drop_ctrl_c()
    assert [type(d.exc_value) for d in dropped] == [KeyboardInterrupt]


def test_a_ctrl_c_dropped_in_a_callback_is_recorded_and_raised_later(monkeypatch, drop_ctrl_c):
    dropped = []
    monkeypatch.setattr(sys, "unraisablehook", dropped.append)
    with interrupts.reliable_sigint():
        drop_ctrl_c()
        assert interrupts.pending()
        with pytest.raises(KeyboardInterrupt):
            interrupts.raise_if_pending()
        assert not interrupts.pending()  # taken once
        interrupts.raise_if_pending()
    assert dropped == []  # no alarming "Exception ignored" traceback
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # put back
    assert sys.unraisablehook == dropped.append


def test_run_interruptibly_stops_on_a_ctrl_c_that_was_dropped(drop_ctrl_c):
    stopped = threading.Event()

    def work() -> str:
        assert stopped.wait(30), "the solver was never told to stop"
        return "held"

    with interrupts.reliable_sigint():
        drop_ctrl_c()
        with pytest.raises(SolveInterrupted) as caught:
            run_interruptibly(work, stopped.set)
        assert not interrupts.pending()  # the exception carries it now
    assert caught.value.partial == "held"


def test_sweep_stops_on_a_ctrl_c_dropped_while_it_reports_a_point(drop_ctrl_c):
    # The CI failure: SIGINT arrived while the main thread handled a found point, landed in a
    # weakref callback, and the sweep ran on towards --max-chunks 1000.
    seen = []

    def on_result(result) -> None:
        if result.found and not seen:
            seen.append(result)
            drop_ctrl_c()

    log = SweepLog()
    with interrupts.reliable_sigint():
        sweep = pareto_front(get_topology("dgx1"), standard_collective("allgather", 8),
                             max_chunks=8, options=SolveOptions(on_result=on_result), log=log)
        front = list(sweep)
    assert (sweep.complete, sweep.stopped_by) == (False, "interrupt")
    assert [(r.instance.steps, r.rounds_per_chunk) for r in front] == \
        [(2, seen[0].rounds_per_chunk)]  # the point it was reporting, and nothing after it
    assert log.interrupted


def test_least_steps_interrupted_before_anything_is_found_says_interrupted():
    backend = _CtrlCBackend(lambda problem: True)
    result = solve_least_steps(get_topology("ring:8"), standard_collective("allgather", 8),
                               options=SolveOptions(backend=backend))
    assert result.status is Status.INTERRUPTED and result.algorithm is None
    assert backend.stops == 1  # stopped at the first instance, no further one tried


def test_a_schedule_the_solver_held_when_interrupted_is_verified_and_returned():
    # On a ring of 8 the farthest rank is 4 hops away either way, and 4 steps suffice (each
    # chunk goes both ways round): least steps 4.
    backend = _CtrlCBackend(lambda problem: True, held=True)
    result = solve_least_steps(get_topology("ring:8"), standard_collective("allgather", 8),
                               options=SolveOptions(backend=backend))
    assert result.status is Status.SAT and result.instance.steps == 4
    assert result.algorithm is not None and result.algorithm.num_steps == 4


def test_solve_instance_interrupted():
    backend = _CtrlCBackend(lambda problem: True)
    seen = []
    result = solve_instance(get_topology("ring:4"), standard_collective("allgather", 4),
                            Instance(steps=2, rounds=3, chunks=2),
                            options=SolveOptions(backend=backend, on_result=seen.append))
    assert result.status is Status.INTERRUPTED
    assert seen == [result]  # progress reports the interrupted instance


def test_cli_least_steps_interrupted_exit_4_json(capsys, monkeypatch, tmp_path):
    monkeypatch.setitem(BACKENDS, "cpsat", lambda: _CtrlCBackend(lambda problem: True))
    code = cli.main(["solve", "least-steps", "ring:4", "allgather", "--backend", "cpsat",
                     "--json", "-o", str(tmp_path / "a.json")])
    out = capsys.readouterr().out
    assert code == cli.EXIT_TIMEOUT
    [row] = json.loads(out)
    assert row["status"] == "interrupted" and row["file"] is None
    assert list(tmp_path.iterdir()) == []


def test_cli_instance_whose_held_schedule_is_complete_exit_0(capsys, monkeypatch, tmp_path):
    monkeypatch.setitem(BACKENDS, "cpsat",
                        lambda: _CtrlCBackend(lambda problem: True, held=True))
    target = tmp_path / "a.json"
    code = cli.main(["solve", "instance", "ring:4", "allgather", "--steps", "2", "--rounds", "3",
                     "--chunks", "2", "--backend", "cpsat", "-o", str(target), "-q"])
    assert code == cli.EXIT_OK
    assert load_algorithm(target).rounds_per_chunk == Fraction(3, 2)


def test_sigint_to_the_cli_during_a_cpsat_sweep_writes_what_was_found(tmp_path):
    """The reported case: a real SIGINT once a point is found; CP-SAT used to abort the
    process (exit 134) with nothing printed or written."""
    out_dir = tmp_path / "front"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    child = subprocess.Popen(
        [sys.executable, "-m", "collsynth", "solve", "pareto", "dgx1", "allgather",
         "--max-chunks", "1000", "-o", f"{out_dir}/"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path,
        # SIGINT back to its default in the child: an ignored one (a runner started with
        # `cmd &`) is inherited across exec, and then Python never installs its handler.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        progress = []
        for line in child.stderr:  # one line per instance tried
            progress.append(line)
            if ": sat (" in line:
                break
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=120)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert any(": sat (" in line for line in progress), "".join(progress) + err
    assert child.returncode == cli.EXIT_TIMEOUT, out + err
    assert "Traceback" not in err and "terminate" not in err
    lines = out.splitlines()
    assert lines[-1].startswith("interrupted:")
    rows = [line.split("|") for line in lines if line.lstrip().startswith("2 |")]
    assert len(rows) == 1, out  # one point, at 2 steps
    written = sorted(out_dir.iterdir())
    assert [str(p) for p in written] == [rows[0][-1].strip()]
    algorithm = load_algorithm(written[0])  # verified on load
    assert algorithm.num_steps == 2
    assert str(algorithm.rounds_per_chunk) == rows[0][3].strip()
