"""Hostile input, round 13: what the fourteenth session's hunt found, fixed there.

Each case failed on the code before its fix.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from collsynth import cli
from collsynth.errors import InputTooLargeError

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT / "tests" / "fixtures" / "traces" / "fc4-mixed"
LOG = ROOT / "data" / "nccl-tests" / "A100-8gpu_all_gather_superbench.txt"


# -- an empty --collective -------------------------------------------------------------------


@pytest.mark.parametrize("files", [[], ["ALGO"]])
def test_time_of_an_empty_collective_is_an_unknown_name(ring_allgather_path, capsys, files):
    """``time --collective '' --topology dgx-a100`` read '' as 'no --collective' and ended
    in an IndexError (a traceback: there were no files to take the collective from)."""
    files = [str(ring_allgather_path) if f == "ALGO" else f for f in files]
    capsys.readouterr()
    assert cli.main(["time", *files, "--collective", "", "--topology", "ring:4,unit_gbps=50,"
                     "alpha_us=1", "--sizes", "1MB", "-q"]) == cli.EXIT_ERROR
    assert capsys.readouterr().err.startswith("collsynth: error: unknown collective ''; known: ")


# -- an empty path -----------------------------------------------------------------------------


@pytest.mark.parametrize("argv, option", [
    (["bench", "ALGO", "--ranks", "4", "--runtime", "msccl", "--dry-run", "-o", ""],
     "-o/--output"),
    (["solve", "bandwidth-optimal", "ring:4", "allgather", "-o", ""], "-o/--output"),
    (["export", "ALGO", "--tune", "-o", "tuned", "--runtime-constants", ""],
     "--runtime-constants"),
    (["export", "ALGO", "-o", "x.xml", "--runtime-constants", ""], "--runtime-constants"),
    (["plan", str(TRACE), "--topology", "fully-connected:4,unit_gbps=50,alpha_us=1", "-o",
      "plan", "--cache", "", "-q"], "--cache"),
    (["trace", "summarize", ""], "DIR"),
    (["plan", "", "--topology", "ring:4", "-o", "plan"], "TRACE_DIR"),
    (["time", "ALGO", "--calibration", ""], "--calibration"),
    (["solve", "least-steps", "ring:4", "allgather", "--xml", ""], "--xml"),
])
def test_an_empty_path_is_a_usage_error_naming_the_option(ring_allgather_path, tmp_path, capsys,
                                                         monkeypatch, argv, option):
    """An empty path (``-o "$OUT"`` with OUT unset) was taken for the option left out:
    ``bench -o ''`` wrote its scripts to ./bench-NAME, ``solve bandwidth-optimal -o ''``
    wrote nothing and exited 0, ``export --runtime-constants ''`` priced with the documented
    constants, ``plan --cache ''`` used ~/.cache, and ``trace summarize ''`` read the current
    folder as a trace."""
    monkeypatch.chdir(tmp_path)
    before = sorted(tmp_path.iterdir())
    argv = [str(ring_allgather_path) if a == "ALGO" else a for a in argv]
    capsys.readouterr()
    assert cli.main(argv) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert f"error: argument {option}: an empty path; expected a file or folder name" in err
    assert sorted(tmp_path.iterdir()) == before  # nothing written


# -- calibrate --topology that its own reader refuses -----------------------------------------


@pytest.mark.parametrize("name, message", [
    ("", "--topology is empty; expected a name"),
    ("a\nb", r"--topology = 'a\nb': a control character (U+000A) at position 1"),
    ("x" * 300, "--topology: a name of 300 characters; names have at most 255"),
])
def test_calibrate_refuses_a_topology_name_its_reader_refuses(tmp_path, capsys, name, message):
    """A curve calibration records --topology as given: '' or a name with a newline was
    written, and every command reading the file refused it ("topology: ''; expected a
    name")."""
    out = tmp_path / "c.json"
    assert cli.main(["calibrate", str(LOG), "--topology", name, "-o", str(out)]) == \
        cli.EXIT_USAGE
    assert message in capsys.readouterr().err and not out.exists()


def test_calibrate_still_records_a_name_it_does_not_know(tmp_path, capsys):
    from collsynth.timing.calibration import load_calibration

    out = tmp_path / "c.json"
    assert cli.main(["calibrate", str(LOG), "--topology", "my cluster", "-o", str(out)]) == \
        cli.EXIT_OK
    assert load_calibration(out).topology == "my cluster"


# -- calibrate --ranks beyond any topology ------------------------------------------------------


def test_calibrate_ranks_beyond_any_topology_is_a_usage_error(tmp_path, capsys):
    """``--ranks 1000000000`` was blamed on the log: 'LOG: ranks = 1000000000: expected a
    whole number >= 1' (exit 1), which it is."""
    out = tmp_path / "c.json"
    assert cli.main(["calibrate", str(LOG), "--topology", "dgx-a100", "-o", str(out),
                     "--ranks", "1000000000"]) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert "argument --ranks: 1000000000 ranks: more than the 65536 collsynth accepts" in err
    assert str(LOG) not in err and not out.exists()


# -- least steps beyond the exact engine -------------------------------------------------------


def test_least_steps_beyond_the_exact_engine_is_refused_not_unsatisfiable(capsys):
    """``solve least-steps ring:4 allgather --chunks 1000`` needs 1500 steps: it said 'unsat
    ... no algorithm with at most 1024 steps' (exit 3: no algorithm exists), its detail
    'max_steps=1024 is below the lower bound' naming an option never given."""
    from collsynth.collective import allgather
    from collsynth.synthesis.strategies import solve_least_steps
    from collsynth.topology import get_topology

    with pytest.raises(InputTooLargeError, match="1000 chunks at one round per step need at "
                                                 "least 1500 steps"):
        solve_least_steps(get_topology("ring:4"), allgather(4), chunks=1000)
    assert cli.main(["solve", "least-steps", "ring:4", "allgather", "--chunks", "1000",
                     "--json"]) == cli.EXIT_ERROR
    captured = capsys.readouterr()
    assert "more than the 1024 the exact encoding takes" in captured.err
    assert "unsat" not in captured.out
    # A --max-steps below the bound is a question with an answer: none that short
    assert cli.main(["solve", "least-steps", "ring:4", "allgather", "--chunks", "1000",
                     "--max-steps", "5", "--json"]) == cli.EXIT_UNSATISFIABLE
    assert json.loads(capsys.readouterr().out)[0]["status"] == "unsat"


# -- time of a file written for another runtime ------------------------------------------------


def test_time_of_a_file_for_another_runtime_names_the_option_that_reads_it(tmp_path, capsys):
    """An allgather exported for msccl-executor (maxBytes=0: unlimited there, never selected by
    msccl) was refused by ``time`` as msccl's with a hint to ``collsynth check``; ``time``
    reads files as --runtime's, so the message now says to give --runtime."""
    algo, xml = tmp_path / "ag.json", tmp_path / "ag.xml"
    assert cli.main(["solve", "instance", "dgx1", "allgather", "--steps", "2", "--rounds", "3",
                     "--chunks", "2", "-o", str(algo), "-q"]) == cli.EXIT_OK
    assert cli.main(["export", str(algo), "-o", str(xml), "--runtime",
                     "msccl-executor"]) == cli.EXIT_OK
    capsys.readouterr()
    assert cli.main(["time", str(xml), "--topology", "dgx1", "--sizes", "1MB",
                     "-q"]) == cli.EXIT_ERROR
    err = capsys.readouterr().err
    assert "not a program msccl runs correctly" in err
    assert "give --runtime for the runtime it is written for" in err
    assert cli.main(["time", str(xml), "--topology", "dgx1", "--sizes", "1MB", "--runtime",
                     "msccl-executor", "-q"]) == cli.EXIT_OK


def test_check_refuses_a_root_for_a_collective_without_one(capsys):
    """``check ALLREDUCE.xml --root 0`` was accepted without a word (the root was ignored)."""
    xml = ROOT / "data" / "msccl-xml" / "rccl" / "allreduce-allpairs-8n-simple.xml"
    capsys.readouterr()
    assert cli.main(["check", str(xml), "--root", "0"]) == cli.EXIT_USAGE
    assert "root 0 was given, but allreduce has no root" in capsys.readouterr().err
    assert cli.main(["check", str(xml)]) == cli.EXIT_OK
