"""A wrong lowering never reaches a file: every export entry point checks what it wrote.

The lowering is replaced by one that returns the real program less one step (the last step of
the last rank's last thread block: a receive, in the ring allgather used here). The program is
well formed, so only the check (``collsynth.export.pipeline.check_exported``) can notice. Each entry
point that lowers must then refuse: the Python API raises :class:`ExportError`, the command
line exits non-zero with one line on stderr, and no XML file is left behind. The planner's
entry point is in ``tests/plan/test_plan_refuses_wrong_lowering.py``.
"""

from __future__ import annotations

import dataclasses
import importlib

import pytest

from collsynth.algorithm import Algorithm, Send, Step, save_algorithm, verify
from collsynth.cli import main
from collsynth.collective import allgather
from collsynth.errors import ExportError
from collsynth.export.program import Program
from collsynth.runtimes import MSCCL_XML, runtime_names
from collsynth.topology import get_topology

RUNTIMES = tuple(runtime_names(MSCCL_XML))


def drop_last_step(program: Program) -> Program:
    """``program`` without the last step of its last rank's last thread block."""
    *gpus, gpu = program.gpus
    *tbs, tb = gpu.threadblocks
    tb = dataclasses.replace(tb, steps=tb.steps[:-1])
    gpu = dataclasses.replace(gpu, threadblocks=(*tbs, tb))
    return dataclasses.replace(program, gpus=(*gpus, gpu))


@pytest.fixture
def wrong_lowering(monkeypatch):
    """Every caller of the lowering gets the program less one step; returns the calls made."""
    lowering = importlib.import_module("collsynth.export.lower")   # the module, not the function
    pipeline = importlib.import_module("collsynth.export.pipeline")
    real = lowering.lower
    calls: list[str] = []

    def lower(algorithm, **options):
        calls.append(options["runtime"])
        return drop_last_step(real(algorithm, **options))

    monkeypatch.setattr(lowering, "lower", lower)
    monkeypatch.setattr(pipeline, "lower", lower)
    return calls


def ring_allgather() -> Algorithm:
    n = 4
    steps = tuple(Step(1, tuple(Send((r - t) % n, r, (r + 1) % n) for r in range(n)))
                  for t in range(n - 1))
    return verify(Algorithm("ring4-ag", get_topology("ring:4"), allgather(n), steps))


@pytest.fixture
def algorithm_file(tmp_path):
    path = tmp_path / "ring4-ag.json"
    save_algorithm(ring_allgather(), path)
    return path


def test_the_wrong_lowering_is_wrong():
    """What the check must find: a receive is gone, so a message stays in a FIFO and rank 3's
    o[0] (the chunk that step received) is never written."""
    from collsynth.export.check import check_program
    from collsynth.export.lower import lower

    for runtime in RUNTIMES:
        program = lower(ring_allgather(), runtime=runtime)
        assert check_program(program, runtime=runtime, strict=True).ok
        last = program.gpus[-1].threadblocks[-1].steps[-1]
        assert (last.type, last.dstbuf, last.dstoff) == ("r", "o", 0)
        report = check_program(drop_last_step(program), runtime=runtime, strict=True)
        kinds = {p.kind for p in report.problems}
        assert kinds == {"message", "postcondition"}, report.problems
        assert any("rank 3 o[0] holds garbage" in p.message for p in report.problems)


# -- the Python API ------------------------------------------------------------------------------


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_export_algorithm_raises_and_writes_nothing(tmp_path, wrong_lowering, runtime):
    from collsynth.export.pipeline import export_algorithm

    path = tmp_path / "out.xml"
    with pytest.raises(ExportError, match=f"the {runtime} program fails the check: .*never "
                                          "received.*rank 3 o\\[0\\] holds garbage"):
        export_algorithm(ring_allgather(), path, runtime=runtime)
    assert wrong_lowering == [runtime]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_export_algorithm_writes_the_correct_program(tmp_path, runtime):
    """The same call without the wrong lowering writes the file (the refusal above is the
    check's doing, not the fixture's)."""
    from collsynth.export.pipeline import export_algorithm

    export_algorithm(ring_allgather(), tmp_path / "out.xml", runtime=runtime)
    assert (tmp_path / "out.xml").is_file()


# -- collsynth export ----------------------------------------------------------------------------


def _one_error_line(capsys) -> str:
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith("collsynth: error: ") and "Traceback" not in captured.err
    assert "wrote" not in captured.out
    return lines[0]


@pytest.mark.parametrize("extra", [[], ["--channels", "auto"], ["--inplace"]])
@pytest.mark.parametrize("runtime", RUNTIMES)
def test_cli_export_exits_non_zero_and_writes_nothing(tmp_path, capsys, wrong_lowering,
                                                      algorithm_file, runtime, extra):
    out = tmp_path / "out.xml"
    code = main(["export", str(algorithm_file), "-o", str(out), "--runtime", runtime, *extra])
    line = _one_error_line(capsys)
    assert code == 1
    assert f"the {runtime} program fails the check" in line and "never received" in line
    assert wrong_lowering and set(wrong_lowering) == {runtime}
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == [algorithm_file.name]


def test_cli_export_all_runtimes_writes_none(tmp_path, capsys, wrong_lowering, algorithm_file):
    target = tmp_path / "xml"
    target.mkdir()
    code = main(["export", str(algorithm_file), "-o", f"{target}/", "--runtime", "all"])
    line = _one_error_line(capsys)
    assert code == 1 and "fails the check" in line
    assert list(target.iterdir()) == []


def test_cli_export_writes_the_correct_program(tmp_path, capsys, algorithm_file):
    out = tmp_path / "out.xml"
    assert main(["export", str(algorithm_file), "-o", str(out), "--runtime", "rccl"]) == 0
    assert out.is_file() and capsys.readouterr().err == ""


# -- collsynth solve ... --xml DIR ---------------------------------------------------------------


@pytest.mark.parametrize("mode", [["instance", "--steps", "3"], ["least-steps"]])
def test_cli_solve_xml_exits_non_zero_and_writes_nothing(tmp_path, capsys, wrong_lowering,
                                                         mode):
    target = tmp_path / "xml"
    code = main(["solve", *mode, "ring:4", "allgather", "--xml", str(target),
                 "--xml-runtime", "all", "--quiet"])
    captured = capsys.readouterr()
    errors = captured.err.splitlines()
    assert code == 1, captured
    assert len(errors) == 1 and errors[0].startswith("collsynth: error: "), captured.err
    assert "fails the check" in errors[0] and "Traceback" not in captured.err
    assert wrong_lowering  # the solver found an algorithm and the export tried to lower it
    assert not target.exists() or list(target.iterdir()) == []


def test_cli_solve_xml_writes_the_correct_programs(tmp_path, capsys):
    target = tmp_path / "xml"
    code = main(["solve", "instance", "ring:4", "allgather", "--steps", "3", "--xml",
                 str(target), "--xml-runtime", "all", "--quiet"])
    assert code == 0, capsys.readouterr()
    assert sorted(p.suffix for p in target.iterdir()) == [".xml"] * len(RUNTIMES)
