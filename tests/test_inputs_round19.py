"""Hostile input, round 19: what this round's hunt found.

Each case failed on the code before its fix.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from collsynth import cli

FIXTURES = Path(__file__).resolve().parent / "fixtures"
TRACES = FIXTURES / "traces"
SRUN_LOG = FIXTURES / "logs" / "nccl_tests_srun_allgather.txt"  # 4 ranks, all_gather_perf
RING4 = "ring:4,unit_gbps=25"


def one_error_line(capsys, code: int) -> str:
    """The one error line of a failed command, nothing on stdout."""
    captured = capsys.readouterr()
    assert code == cli.EXIT_ERROR, captured.err
    [line] = captured.err.splitlines()
    assert line.startswith("collsynth: error: "), line
    assert captured.out == ""
    return line


def _curve(tmp_path: Path, extra: str = "", values: tuple[str, ...] = (), *,
           name: str = "curve.csv") -> Path:
    """A measured curve of six sizes; ``extra`` names one more column, ``values`` its cells."""
    sizes = (1024, 4096, 16384, 65536, 262144, 1048576)
    times = (18, 19, 20, 22, 31, 61)
    values = values or ("",) * len(sizes)
    head = "size_bytes,time_us" + (f",{extra}" if extra else "")
    body = [f"{s},{t}" + (f",{v}" if extra else "") for s, t, v in zip(sizes, times, values)]
    path = tmp_path / name
    path.write_text("\n".join([head, *body]) + "\n")
    return path


def _calibrate(path: Path, out: Path, *more: str, topology: str = RING4) -> int:
    return cli.main(["calibrate", "--model", "program", "--topology", topology, "-o", str(out),
                     "-q", *more, str(path)])


# -- calibrate --model program: what the measured file says of itself ----------------------------


def test_a_curve_of_another_collective_is_refused(tmp_path, capsys):
    """A CSV whose ``collective`` column says allreduce was fitted as an allgather (the
    default) or as the ``--collective`` given: the program reader ignored every column but
    size and time, so the constants came out wrong by the traffic's factor, with exit 0."""
    curve = _curve(tmp_path, "collective", ("allreduce",) * 6)
    out = tmp_path / "c.json"
    line = one_error_line(capsys, _calibrate(curve, out, "--collective", "allgather"))
    assert "curve.csv: its collective column says allreduce, not allgather (--collective)" \
        in line, line
    assert not out.exists()


def test_a_curve_names_its_collective_when_none_is_given(tmp_path, capsys):
    curve = _curve(tmp_path, "collective", ("all_reduce",) * 6)
    out = tmp_path / "c.json"
    assert _calibrate(curve, out) == cli.EXIT_OK, capsys.readouterr().err
    assert "allreduce on ring:4" in capsys.readouterr().out


def test_a_curve_whose_rows_name_two_collectives_is_refused(tmp_path, capsys):
    curve = _curve(tmp_path, "collective", ("allgather", "allreduce", "allgather",
                                            "allgather", "allgather", "allgather"))
    line = one_error_line(capsys, _calibrate(curve, tmp_path / "c.json"))
    assert "curve.csv: line 3: collective 'allreduce', but line 2 says 'allgather': one " \
           "curve, one collective" in line, line


def test_a_curve_of_another_rank_count_is_refused(tmp_path, capsys):
    """A CSV whose ``ranks`` column says 8 was fitted on a 4-rank ring without a word."""
    curve = _curve(tmp_path, "ranks", ("8",) * 6)
    out = tmp_path / "c.json"
    line = one_error_line(capsys, _calibrate(curve, out))
    assert "curve.csv: measured on 8 ranks, but ring:4 has 4; fit it on the machine it was " \
           "measured on (--topology, --nodes)" in line, line
    assert not out.exists()


def test_a_log_of_another_rank_count_is_refused(tmp_path, capsys):
    """An nccl-tests log of 4 ranks ('# Rank 0' ... '# Rank 3') was fitted on DGX-A100's 8:
    a fit at 16% GMAE, written with exit 0."""
    out = tmp_path / "c.json"
    line = one_error_line(capsys, _calibrate(SRUN_LOG, out, topology="dgx-a100"))
    assert "nccl_tests_srun_allgather.txt: measured on 4 ranks, but DGX-A100 has 8" in line, line
    assert not out.exists()


def test_a_log_of_a_collective_without_a_ring_names_the_file(tmp_path, capsys):
    """An alltoall_perf log ended in "no ring program for 'alltoall'", naming neither the
    file nor that --model program fits ring collectives only."""
    log = tmp_path / "a2a.txt"
    log.write_text(SRUN_LOG.read_text().replace("all_gather_perf", "alltoall_perf"))
    line = one_error_line(capsys, _calibrate(log, tmp_path / "c.json"))
    assert "a2a.txt: measures alltoall; --model program fits the runtime's ring of allgather, " \
           "reduce_scatter, allreduce, broadcast, reduce" in line, line


@pytest.mark.parametrize("size, time, expected", [
    ("1024.5", "18", "line 2: size_bytes = '1024.5': expected a whole number of bytes"),
    ("1e300", "18", "line 2: size_bytes = '1e300': expected a whole number of bytes"),
    ("1024", "fast", "line 2: time_us = 'fast': expected a number of microseconds")])
def test_a_curve_cell_that_is_not_its_number_says_which(tmp_path, capsys, size, time,
                                                         expected):
    """Each said 'size_bytes and time_us must be numbers', of a size that is a number."""
    curve = _curve(tmp_path)
    lines = curve.read_text().splitlines()
    lines[1] = f"{size},{time}"
    curve.write_text("\n".join(lines) + "\n")
    line = one_error_line(capsys, _calibrate(curve, tmp_path / "c.json"))
    assert f"curve.csv: {expected}" in line, line


def test_a_curve_row_short_of_a_cell_says_how_many(tmp_path, capsys):
    curve = _curve(tmp_path)
    curve.write_text(curve.read_text().replace("4096,19\n", "4096\n"))
    line = one_error_line(capsys, _calibrate(curve, tmp_path / "c.json"))
    assert "curve.csv: line 3: 1 cell(s); the header has 2 (size_bytes, time_us)" in line, line


# -- plan: a rank file cut short -------------------------------------------------------------


def test_a_rank_file_cut_short_is_refused(tmp_path, capsys):
    """A rank whose file stops after half its calls (its process killed) was planned from: the
    agreement check zipped the ranks' calls, so the shorter list passed, and the plan priced
    what the other ranks issued as if the trace were whole."""
    trace = tmp_path / "trace"
    shutil.copytree(TRACES / "fc4-mixed", trace)
    rank2 = trace / "rank-00002.jsonl"
    rank2.write_text("".join(rank2.read_text().splitlines(keepends=True)[:10]))
    out = tmp_path / "plan"
    code = cli.main(["plan", str(trace), "--topology", "fc:4,unit_gbps=25,alpha_us=1",
                     "-o", str(out)])
    captured = capsys.readouterr()
    assert code == cli.EXIT_ERROR, captured.err
    [line] = [x for x in captured.err.splitlines() if "error" in x]
    assert "rank-00002.jsonl: 8 call(s) on group [0, 1, 2, 3], but rank 0 (rank-00000.jsonl) " \
           "issued 16; the ranks of a group issue the same collectives" in line, line
    assert not out.exists()


def test_a_whole_trace_still_plans(tmp_path):
    from collsynth.plan.calls import load_calls

    run = load_calls(TRACES / "fc4-mixed")
    assert run.ranks == (0, 1, 2, 3)


# -- '-' for a path: stdout by the Unix habit, a file named '-' here -------------------------


@pytest.mark.parametrize("argv", [
    ["tune-runtime", "--topology", "dgx-a100", "--runtime", "nccl", "-o", "-"],
    ["export", "ALGO", "-o", "-"],
    ["export", "ALGO", "--runtime", "mscclpp", "-o", "-"],
    ["draw", "ALGO", "-o", "-"],
    ["calibrate", "--topology", "ring:4", "-o", "-", str(SRUN_LOG)],
    ["time", "ALGO", "--calibration", "-"]])
def test_a_dash_for_a_path_is_a_usage_error(ring_allgather_path, tmp_path, monkeypatch, capsys,
                                            argv):
    """``-o -`` wrote a file named '-' in the working folder (tune-runtime, export, calibrate)
    where a user of Unix tools expects stdout, and ``--calibration -`` read one."""
    from tests.test_inputs_round17 import one_usage_line

    monkeypatch.chdir(tmp_path)
    argv = [str(ring_allgather_path) if a == "ALGO" else a for a in argv]
    code = cli.main(argv)
    line = one_usage_line(capsys, code, f"collsynth {argv[0]}")
    assert "'-': collsynth does not write to stdout or read from stdin here; expected a file " \
           "or folder name (./- for one named '-')" in line, line
    assert not (tmp_path / "-").exists()


def test_a_file_named_dash_is_still_written_as_dot_slash_dash(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code = cli.main(["tune-runtime", "--topology", "dgx-a100", "--runtime", "nccl",
                     "--collectives", "allreduce", "--sizes", "1MB:2MB", "-o", "./-"])
    assert code == cli.EXIT_OK, capsys.readouterr().err
    assert (tmp_path / "-").is_file()


# -- tune-runtime: minutes of pricing without a word -----------------------------------------


def _slow_tuning(monkeypatch):
    import time as time_module

    from collsynth.cli import tune_runtime as tune_cli
    from collsynth.export.tuner import machine

    real = machine.tune_machine
    monkeypatch.setattr(tune_cli, "PROGRESS_INTERVAL_S", 0.05)
    monkeypatch.setattr(machine, "tune_machine",
                        lambda *a, **k: time_module.sleep(0.3) or real(*a, **k))


TUNE = ["tune-runtime", "--topology", "dgx-a100", "--runtime", "nccl", "--collectives",
        "allreduce", "--sizes", "1MB:2MB"]


def test_tune_runtime_says_what_it_prices_while_it_runs_long(tmp_path, monkeypatch, capsys):
    """tune-runtime on GB200 NVL72 printed nothing for over 5 minutes (time, calibrate and plan
    give a heartbeat every 5 s): a run that looked hung."""
    _slow_tuning(monkeypatch)
    assert cli.main([*TUNE, "-o", str(tmp_path / "t.csv")]) == cli.EXIT_OK
    err = capsys.readouterr().err
    assert "  tune-runtime: pricing allreduce on DGX-A100 (8 ranks, 2 sizes), 0 s so far" \
        in err, err


@pytest.mark.parametrize("flag", ["-q", "--quiet", "--json"])
def test_tune_runtime_quiet_has_no_heartbeat(tmp_path, monkeypatch, capsys, flag):
    _slow_tuning(monkeypatch)
    assert cli.main([*TUNE, "-o", str(tmp_path / "t.csv"), flag]) == cli.EXIT_OK
    assert "so far" not in capsys.readouterr().err


# -- time --channels beyond the runtime's MAXCHANNELS ----------------------------------------


@pytest.mark.parametrize("runtime, channels, most", [("nccl", "65", 64), ("nccl", "128", 64),
                                                     ("msccl", "100", 64)])
def test_time_channels_beyond_the_runtime_is_a_usage_error(capsys, runtime, channels, most):
    """``time --channels 100`` on DGX-H100 printed rows 'nccl-ring/100ch' (and NVLS on 100),
    a count stock NCCL (MAXCHANNELS 64) cannot run, priced as if it could."""
    from tests.test_inputs_round17 import one_usage_line

    code = cli.main(["time", "--collective", "allreduce", "--topology", "dgx-h100", "--runtime",
                     runtime, "--channels", channels, "--sizes", "1MB"])
    line = one_usage_line(capsys, code, "collsynth time")
    assert f"--channels {channels}: more than the {most} channels {runtime} has (its " \
           "MAXCHANNELS)" in line, line


def test_time_channels_up_to_the_runtime_are_priced(capsys):
    code = cli.main(["time", "--collective", "allreduce", "--topology", "dgx-h100", "--runtime",
                     "rccl", "--channels", "100", "--sizes", "1MB"])
    assert code == cli.EXIT_OK, capsys.readouterr().err
    assert "rccl-ring/100ch" in capsys.readouterr().out
