"""Hostile input, round 21: what this round's hunt found.

Each case failed on the code before its fix.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from collsynth import cli
from collsynth.errors import FileFormatError
from collsynth.runtimes import get_runtime
from collsynth.timing.calibration import RuntimeCalibration, save_calibration
from collsynth.timing.logs import load_log

ROOT = Path(__file__).resolve().parents[1]
#: An older nccl-tests log: its command line names the binary, no "Collective test starting".
OLD_LOG = ROOT / "data" / "nccl-tests" / "V100-8gpu-dgx1topo_all_reduce_konnase.txt"


def one_error_line(capsys, code: int, expected: int = cli.EXIT_ERROR) -> str:
    """The one error line of a refused command, nothing on stdout."""
    captured = capsys.readouterr()
    assert code == expected, captured.err
    [line] = captured.err.splitlines()
    assert captured.out == ""
    return line


# -- an older nccl-tests log with a second collective's run appended ----------------------------


def test_an_old_log_of_two_collectives_is_refused(tmp_path, capsys):
    """``all_reduce_perf > log; all_gather_perf >> log`` with an nccl-tests that prints no
    "Collective test starting" line: the binary was read from the first line naming one, and
    the allgather rows were fitted into the allreduce curve without a word."""
    text = OLD_LOG.read_text()
    path = tmp_path / "both.txt"
    path.write_text(text + text.replace("all_reduce_perf", "all_gather_perf"))
    second = len(text.splitlines()) + 2  # the appended run's '## hardware' comment names it
    with pytest.raises(FileFormatError, match=rf"line {second}: 'all_gather_perf' after results "
                                              r"of 'all_reduce_perf' \(named at line 2\); a log "
                                              "measures one collective: split the file"):
        load_log(path)
    out = tmp_path / "c.json"
    line = one_error_line(capsys, cli.main(["calibrate", "--topology", "dgx1", str(path),
                                            "-o", str(out), "-q"]))
    assert "both.txt" in line and "split the file" in line
    assert not out.exists()
    # the same binary named again after results is a repeat, not a second collective; a note
    # naming two binaries before any result is no run: its first name is kept
    path.write_text(text * 2)
    assert load_log(path).collective == "allreduce"
    path.write_text("# compared all_reduce_perf with all_gather_perf\n" + text)
    assert load_log(path).collective == "allreduce"


# -- export --inplace --outofplace for a runtime that reads one layout per file ------------------


@pytest.mark.parametrize("extra", [[], ["--runtime", "msccl"], ["--runtime", "all"]])
def test_both_layouts_for_msccl_is_a_usage_error(ring_allgather_path, tmp_path, capsys, extra):
    """The combination of two options was reported as a bad input (exit 1, no pointer to the
    help), where the same request for an MSCCL++ plan is a usage error (exit 2)."""
    out = tmp_path / "out.xml"
    code = cli.main(["export", str(ring_allgather_path), "--inplace", "--outofplace",
                     "-o", str(out), *extra])
    line = one_error_line(capsys, code, cli.EXIT_USAGE)
    assert "--inplace with --outofplace: msccl selects an algorithm for one layout only" in line
    assert not list(tmp_path.glob("out*"))


def test_both_layouts_for_msccl_tune_is_a_usage_error(tmp_path, capsys):
    algorithm = tmp_path / "ag.json"
    assert cli.main(["solve", "least-steps", "ring:4,unit_gbps=25,alpha_us=1", "allgather",
                     "-o", str(algorithm), "-q"]) == cli.EXIT_OK
    capsys.readouterr()
    code = cli.main(["export", str(algorithm), "--tune", "--sizes", "1KB", "--inplace",
                     "--outofplace", "-o", str(tmp_path / "tuned")])
    assert "msccl selects an algorithm for one layout only" in \
        one_error_line(capsys, code, cli.EXIT_USAGE)
    assert not (tmp_path / "tuned").exists()
    # a runtime whose file carries both layouts still takes the pair
    code = cli.main(["export", str(algorithm), "--runtime", "rccl", "--inplace", "--outofplace",
                     "-o", str(tmp_path / "both.xml")])
    assert code == cli.EXIT_OK, capsys.readouterr().err


# -- time --calibration: one runtime's constants on a machine that runs the other ---------------


def _constants_of(runtime: str, path: Path) -> Path:
    save_calibration(RuntimeCalibration(get_runtime(runtime).defaults), path)
    return path


@pytest.mark.parametrize("runtime, topology, runs", [("rccl", "DGX-A100", "nccl"),
                                                     ("nccl", "mi300x", "rccl")])
def test_time_refuses_constants_of_the_other_runtime(tmp_path, capsys, runtime, topology, runs):
    """RCCL's constants (an MI300X's calibration) on a DGX priced RCCL's ring and tree there,
    a runtime its GPUs cannot run, and NCCL's on an MI300X priced NCCL's, both without a word:
    the calibration's runtime silently replaced the machine's."""
    calibration = _constants_of(runtime, tmp_path / "other.json")
    argv = ["time", "--collective", "allreduce", "--topology", topology, "--model", "program",
            "--calibration", str(calibration), "--sizes", "1MB", "-q"]
    line = one_error_line(capsys, cli.main(argv))
    assert f"--calibration {calibration}: constants of {runtime}, but" in line
    assert f"GPUs, which run {runs}" in line and f"--runtime {runtime}" in line
    # asked for by name, the other runtime is still priced; the machine's own constants are too
    assert cli.main([*argv, "--runtime", runtime]) == cli.EXIT_OK, capsys.readouterr().err
    own = _constants_of(runs, tmp_path / "own.json")
    argv[argv.index(str(calibration))] = str(own)
    assert cli.main(argv) == cli.EXIT_OK, capsys.readouterr().err


# -- plan --calibration: constants of another family than the runtime priced -------------------


def test_plan_refuses_constants_of_another_family_before_planning(tmp_path, capsys):
    """RCCL's constants priced msccl-executor's programs (NCCL's kernels) without a word, and
    with a tuner in --runtime the mismatch was found only after the whole synthesis."""
    calibration = _constants_of("rccl", tmp_path / "rccl.json")
    trace = ROOT / "tests" / "fixtures" / "traces" / "dgx1-dp"
    for runtime in ("msccl-executor", "msccl,nccl-tuner"):
        out = tmp_path / "plan"
        code = cli.main(["plan", str(trace), "--topology", "dgx1",
                         "--calibration", str(calibration), "--runtime", runtime,
                         "-o", str(out), "--no-cache", "-q"])
        line = one_error_line(capsys, code, cli.EXIT_USAGE)
        assert f"--calibration {calibration}: its constants are rccl's, but --runtime " \
               f"{runtime.split(',')[0]} runs nccl's kernels" in line, line
        assert not out.exists()


# -- calibrate: one log given twice ---------------------------------------------------------------


def test_calibrate_one_log_given_twice_is_a_usage_error(tmp_path, capsys, monkeypatch):
    """``calibrate log ./log`` fitted the log twice and wrote a calibration of two entries of
    the one measurement ('2 logs'), as ``time ag.json ag.json`` priced one file twice (round
    17)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "log.txt").write_text(OLD_LOG.read_text())
    out = tmp_path / "c.json"
    code = cli.main(["calibrate", "--topology", "dgx1", "log.txt",
                     f".{'/'}log.txt", "-o", str(out), "-q"])
    line = one_error_line(capsys, code, cli.EXIT_USAGE)
    assert "log.txt and ./log.txt name one file; give each file once" in line, line
    assert not out.exists()
