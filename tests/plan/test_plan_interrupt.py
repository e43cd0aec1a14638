"""Ctrl-C during ``collsynth plan``: exit 130 with one line saying what was kept, no plan
written, and only complete fronts in the cache."""

from __future__ import annotations

import _thread
import json
import threading

import pytest

from collsynth import cli
from collsynth.encoding import BACKENDS, CpSatBackend
from collsynth.encoding.backend import Outcome, Status, run_interruptibly

from .conftest import DATA, TRACES


class _CtrlCOnSecondCollective(CpSatBackend):
    """CP-SAT until the plan synthesizes a second collective; Ctrl-C is pressed in its solve.
    (The plan asks for a new backend per instance: ``seen`` is shared.)"""

    seen: list[str] = []

    def solve(self, problem, *, time_limit, minimize_rounds=False):
        name = problem.collective.name
        self.seen.append(name)
        if name == self.seen[0]:
            return super().solve(problem, time_limit=time_limit, minimize_rounds=minimize_rounds)
        stopped = threading.Event()

        def work() -> Outcome:
            _thread.interrupt_main()
            stopped.wait(30)
            return Outcome(Status.UNKNOWN)

        return run_interruptibly(work, stopped.set)


@pytest.mark.usefixtures("ctrl_c_reaches_python")
def test_ctrl_c_in_plan_writes_nothing_and_caches_only_complete_fronts(capsys, monkeypatch,
                                                                        tmp_path):
    monkeypatch.setattr(_CtrlCOnSecondCollective, "seen", [])
    monkeypatch.setitem(BACKENDS, "cpsat", _CtrlCOnSecondCollective)
    cache, target = tmp_path / "cache", tmp_path / "plan"
    code = cli.main(["plan", str(TRACES / "fc4-mixed"), "--topology", str(DATA / "fc4-fast.json"),
                     "--backend", "cpsat", "--cache", str(cache), "-o", str(target), "-q"])
    out, err = capsys.readouterr()
    assert code == cli.EXIT_INTERRUPTED == 130
    assert out == ""
    [line] = err.splitlines()
    assert line.startswith("collsynth: interrupted: no plan written") and str(cache) in line
    assert not target.exists()
    manifests = [json.loads(p.read_text()) for p in cache.rglob("manifest.json")]
    assert len(manifests) == 1 and manifests[0]["complete"] is True  # the first collective's
    assert _CtrlCOnSecondCollective.seen[-1] != _CtrlCOnSecondCollective.seen[0]
