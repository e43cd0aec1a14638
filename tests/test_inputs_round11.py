"""Hostile input, round 12: what the thirteenth session's hunt found, fixed there.

Each case failed on the code before its fix.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from collsynth import cli
from collsynth.errors import FileFormatError
from collsynth.trace import read_trace

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT / "tests" / "fixtures" / "traces" / "fc4-mixed"


# -- a trace folder with two files of one rank ---------------------------------------------------


@pytest.mark.parametrize("twin", ["rank-000000.jsonl", "rank-\u0660\u0660\u0660\u0660\u0660.jsonl"])
def test_two_trace_files_of_one_rank_are_refused(tmp_path, capsys, twin):
    """``rank-00000.jsonl`` and ``rank-000000.jsonl`` both name rank 0: both were read, and
    the summary said '5 of 4 ranks' and counted rank 0's calls twice. A name in another
    script's digits (Arabic-Indic zeros) was read as rank 0 too."""
    folder = tmp_path / "trace"
    shutil.copytree(TRACE, folder)
    shutil.copy(folder / "rank-00000.jsonl", folder / twin)
    if twin.isascii():
        with pytest.raises(FileFormatError, match="two trace files of rank 0: "
                                                  "rank-00000.jsonl and rank-000000.jsonl"):
            read_trace(folder)
        assert cli.main(["trace", "summarize", str(folder)]) == cli.EXIT_ERROR
        assert "two trace files of rank 0" in capsys.readouterr().err
    else:  # not a rank file's name: ignored, as notes are
        assert read_trace(folder).rank_numbers == (0, 1, 2, 3)


# -- a log that says its collective and rank count ------------------------------------------------

GH200 = ROOT / "data" / "public-logs" / "GH200-8gpu-2node-alps-slingshot_all_reduce_boeschf.txt"
ALLGATHER = ROOT / "data" / "nccl-tests" / "A100-8gpu_all_gather_superbench.txt"


@pytest.mark.parametrize("option, said", [(["--collective", "allgather"], "'all_reduce'"),
                                          (["--ranks", "16"], "8 ranks, not 16")])
def test_calibrate_refuses_an_option_the_log_contradicts(tmp_path, capsys, option, said):
    """``--collective`` and ``--ranks`` are for logs that do not say: given for one that runs
    all_reduce_perf on 8 ranks, they were taken over what it said, and an allgather (or a
    16-rank) calibration of an 8-rank allreduce was written."""
    log = tmp_path / "run.txt"  # a name that says nothing
    shutil.copy(GH200, log)
    out = tmp_path / "c.json"
    assert cli.main(["calibrate", str(log), "--topology", "gh200x4", "--nodes", "2",
                     "-o", str(out), *option]) == cli.EXIT_ERROR
    err = capsys.readouterr().err
    assert f"run.txt: the log measures {said}" in err and not out.exists()


def test_bench_from_logs_refuses_a_log_of_another_collective(tmp_path, capsys):
    """``bench --from-logs`` read an all_gather_perf log left as the allreduce program's
    measurement, and compared allgather times with allreduce ones."""
    algo = tmp_path / "ar8.json"
    assert cli.main(["solve", "least-steps", "ring:8", "allreduce", "-o", str(algo),
                     "-q"]) == cli.EXIT_OK
    folder = tmp_path / "bench"
    assert cli.main(["bench", str(algo), "--ranks", "8", "--runtime", "msccl", "--dry-run",
                     "-o", str(folder)]) == cli.EXIT_OK
    (folder / "logs").mkdir()
    shutil.copy(ALLGATHER, folder / "logs" / "default.txt")
    shutil.copy(ALLGATHER, folder / "logs" / "xml.txt")
    capsys.readouterr()
    assert cli.main(["bench", str(algo), "--ranks", "8", "--runtime", "msccl", "--from-logs",
                     "-o", str(folder)]) == cli.EXIT_ERROR
    assert "default.txt: the log measures 'all_gather', not 'allreduce'" in \
        capsys.readouterr().err
    assert not (folder / "report.md").exists()


# -- an option a command does not have -----------------------------------------------------------


@pytest.mark.parametrize("argv, prog", [
    (["bench", "x.xml", "--ranks", "2", "--runtime", "msccl", "-q"], "collsynth bench"),
    (["solve", "pareto", "ring:4", "allgather", "--bogus"], "collsynth solve pareto"),
    (["trace", "summarize", "DIR", "--bogus"], "collsynth trace summarize"),
])
def test_an_unknown_option_points_at_the_commands_own_help(capsys, argv, prog):
    """``collsynth bench ... -q`` said 'collsynth: error: unrecognized arguments: -q (see
    'collsynth --help')': the top-level help, which does not list bench's options."""
    assert cli.main(argv) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith(f"{prog}: error: unrecognized arguments: {argv[-1]} ")
    assert f"(see '{prog} --help')" in err
