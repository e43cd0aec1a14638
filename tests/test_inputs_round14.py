"""Hostile input, round 14: what the previous session's hunt left, fixed here.

Each case failed on the code before its fix.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from collsynth import cli

ROOT = Path(__file__).resolve().parents[1]
ARABIC_TWO, ARABIC_THREE, ARABIC_FOUR = "\u0662", "\u0663", "\u0664"
NOT_ASCII = "is not ASCII; numbers are written with the digits 0-9"
NO_SEPARATORS = "numbers take no '_' separators (write 1000, not 1_000)"


# -- numbers in other scripts' digits, with '_' ----------------------------------------------


@pytest.mark.parametrize("argv, option, text, why", [
    (["bounds", "ring:4", "allgather", "--nodes", ARABIC_TWO], "--nodes", ARABIC_TWO,
     NOT_ASCII),
    (["bounds", "ring:4", "broadcast", "--root", ARABIC_THREE], "--root", ARABIC_THREE,
     NOT_ASCII),
    (["bounds", "ring:4", "allgather", "--nodes", "1_0"], "--nodes", "1_0", NO_SEPARATORS),
    (["time", "--topology", "ring:4", "--collective", "allgather", "--sizes",
      ARABIC_THREE + "KB"], "--sizes", ARABIC_THREE + "KB", NOT_ASCII),
    (["time", "--topology", "ring:4", "--collective", "allgather", "--sizes", "1_000"],
     "--sizes", "1_000", NO_SEPARATORS),
    (["time", "--topology", "ring:4", "--collective", "allgather", "--unit-gbps",
      ARABIC_TWO], "--unit-gbps", ARABIC_TWO, NOT_ASCII),
    (["draw", "ALGO", "--steps", "\u0661", "-o", "x.png"], "--steps", "\u0661", NOT_ASCII),
    (["export", "ALGO", "-o", "x.xml", "--min-bytes", "1_024"], "--min-bytes", "1_024",
     NO_SEPARATORS),
    (["check", "X.xml", "--root", ARABIC_TWO], "--root", ARABIC_TWO, NOT_ASCII),
    (["tune-runtime", "--topology", "dgx1", "-o", "t.conf", "--threshold", "\u0663%"],
     "--threshold", "\u0663%", NOT_ASCII),
])
def test_a_number_option_takes_ascii_digits_only(ring_allgather_path, tmp_path, monkeypatch, capsys,
                                                 argv, option, text, why):
    """``--nodes ٢`` ran two nodes, ``--root ٣`` rooted at rank 3, ``--sizes ٣KB`` priced
    3 KB, ``draw --steps ١`` drew step 1 (Python's int() and float() read any script's
    digits), and ``--nodes 1_0`` ran ten nodes: now each is a usage error saying why."""
    monkeypatch.chdir(tmp_path)
    argv = [str(ring_allgather_path) if a == "ALGO" else a for a in argv]
    capsys.readouterr()
    assert cli.main(argv) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert f"argument {option}" in err and repr(text) in err and why in err
    assert "Traceback" not in err


@pytest.mark.parametrize("value, why", [
    (ARABIC_TWO, NOT_ASCII), ("1_5", NO_SEPARATORS), ("leaf=" + ARABIC_TWO, NOT_ASCII),
])
def test_oversubscription_takes_ascii_digits_only(capsys, value, why):
    """``--oversubscription 1_5`` was read as 15:1 and ``--oversubscription ٢`` as 2:1
    (``Fraction`` reads both)."""
    assert cli.main(["bounds", "ring:4", "allgather", "--nodes", "2", "--nic-units", "1",
                     "--oversubscription", value]) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert "argument --oversubscription: " in err and "is not a number" in err and why in err


@pytest.mark.parametrize("name, why", [
    ("ring:" + ARABIC_FOUR, NOT_ASCII),
    ("ring:1_0", NO_SEPARATORS),
    ("torus:" + ARABIC_FOUR + "x4", NOT_ASCII),
    ("torus:\u00b2x4", NOT_ASCII),   # '²' is a digit to str.isdigit, not to int(): a traceback
    ("hypercube:" + ARABIC_THREE, NOT_ASCII),
    ("hypercube:\u00b2", NOT_ASCII),
    ("ring:4,unit_gbps=" + ARABIC_TWO, NOT_ASCII),
    ("ring:4,alpha_us=1_0", NO_SEPARATORS),
])
def test_a_topology_family_size_takes_ascii_digits_only(capsys, name, why):
    """``ring:٤`` was read as ring:4 and ``torus:²x4`` ended in an internal error (a
    ValueError from int()); now either is refused naming the name and why (exit 1)."""
    assert cli.main(["bounds", name, "allgather"]) == cli.EXIT_ERROR
    err = capsys.readouterr().err
    assert err.startswith("collsynth: error: topology ") and why in err, err
    assert "internal error" not in err


def test_the_memory_limit_variable_takes_ascii_digits_only(monkeypatch):
    """``COLLSYNTH_MEMORY_LIMIT=٨GiB`` was read as 8 GiB (``\\d`` matches any script's
    digits)."""
    from collsynth.errors import InputTooLargeError
    from collsynth.limits import MEMORY_LIMIT_ENV, memory_limit_bytes

    monkeypatch.setenv(MEMORY_LIMIT_ENV, "\u0668GiB")
    with pytest.raises(InputTooLargeError, match="expected bytes, like 8589934592 or 8GiB"):
        memory_limit_bytes()
    monkeypatch.setenv(MEMORY_LIMIT_ENV, "8GiB")
    assert memory_limit_bytes() == 8 * 2**30


def test_the_one_rule_keeps_ascii_numbers_and_blanks():
    from collsynth._parse import number_text
    from collsynth.cli.common import parse_sizes, positive_int
    from collsynth.topology import get_topology

    assert number_text(" 12 ") == "12"
    assert positive_int("4") == 4 and parse_sizes("1KB, 1 MiB") == [1000, 2**20]
    assert get_topology("ring: 4").num_ranks == 4
    assert get_topology("torus:2x3").num_ranks == 6


def test_a_file_field_takes_ascii_digits_only():
    """The one rule reads file fields too (``int_from_text``: the benchmark logs' headers)."""
    from collsynth._parse import int_from_text
    from collsynth.errors import FileFormatError

    for text, why in ((ARABIC_THREE, NOT_ASCII), ("1_000", NO_SEPARATORS)):
        with pytest.raises(FileFormatError, match="log.txt: line 2: ranks = .*" + re.escape(why)):
            int_from_text(text, "line 2: ranks", source="log.txt")


# -- curve calibrations: figures outside what a fit writes ------------------------------------


def _curve(**changes) -> dict:
    entry = {"file": "logs/all_reduce.txt", "collective": "allreduce", "ranks": 8,
             "model": "piecewise", "alpha_us": 34.9, "busbw_gbps": 234.6, "min_bytes": 4,
             "latency_exponent": 0.004, "knee_bytes": 131072, "saturation_bytes": 2147483648,
             "center_bytes": 1055642.7, "steepness": 0.46, "gmae": 0.023, "gmae_rows": 0.024,
             "gmae_heldout": 0.040}
    entry.update(changes)
    return {"format": "collsynth-calibration", "version": 2, "kind": "curve",
            "topology": "dgx1", "nodes": 1, "entries": [entry]}


@pytest.mark.parametrize("field, value, expected", [
    ("latency_exponent", 1e308, "expected 0 to 0.25"),
    ("latency_exponent", "-0.0", "a negative zero"),
    ("steepness", 1e308, "expected 0.05 to 12 per doubling"),
    ("steepness", 5e-324, "expected 0.05 to 12 per doubling"),
    ("center_bytes", 5e-324, "expected 0.00390625 to 2.8823e+17 bytes"),
    ("center_bytes", 1e308, "expected 0.00390625 to 2.8823e+17 bytes"),
    ("gmae", 1e308, "expected 0 to 3.6e+12"),
    ("gmae", "-0.0", "a negative zero"),
    ("gmae_rows", 1e308, "expected 0 to 3.6e+12"),
    ("gmae_heldout", "-0.0", "a negative zero"),
])
def test_a_curve_calibration_figure_outside_the_fits_range_is_refused(tmp_path, capsys, field,
                                                                     value, expected):
    """A hand-edited ``steepness`` of 1e308 or 5e-324, ``latency_exponent`` 1e308 or a
    ``gmae`` of -0.0 (printed as -0.0%) was read as given; each is now refused naming the
    file and the field, with the range the fit writes."""
    path = tmp_path / "cal.json"
    text = json.dumps(_curve(**{field: "VALUE"})).replace('"VALUE"', str(value))
    path.write_text(text)
    assert cli.main(["time", "--calibration", str(path), "--topology", "dgx1",
                     "--collective", "allreduce", "--sizes", "1MB"]) == cli.EXIT_ERROR
    err = capsys.readouterr().err
    assert f"{path}: entries[0].{field}: " in err and expected in err, err


def test_a_fitted_curve_calibration_reads_back(tmp_path):
    """The ranges hold what ``calibrate`` writes (the fit's own bounds)."""
    from collsynth.timing.calibration import load_calibration

    out = tmp_path / "c.json"
    log = ROOT / "data" / "nccl-tests" / "A100-8gpu_all_gather_superbench.txt"
    assert cli.main(["calibrate", str(log), "--topology", "dgx-a100", "-o", str(out)]) == \
        cli.EXIT_OK
    assert any(e.model == "piecewise" for e in load_calibration(out).entries)
    path = tmp_path / "edge.json"
    path.write_text(json.dumps(_curve(latency_exponent=0.25, steepness=12.0, gmae=0.0,
                                      center_bytes=2.0 ** 58)))
    assert load_calibration(path).entries[0].params["steepness"] == 12.0


# -- draw of an MSCCL++ plan with --topology ----------------------------------------------------


def test_draw_of_a_plan_with_a_topology_says_it_is_a_plan(ring_allgather_path, tmp_path, capsys):
    """``draw PLAN.json --topology ring:2`` said the plan "is an algorithm file, which carries
    its topology" (exit 2); it now says what the file is and what draw takes (exit 1, as
    without --topology)."""
    plan = tmp_path / "plan.json"
    assert cli.main(["export", str(ring_allgather_path), "--runtime", "mscclpp", "-o",
                     str(plan)]) == cli.EXIT_OK
    capsys.readouterr()
    assert cli.main(["draw", str(plan), "--topology", "ring:2", "-o",
                     str(tmp_path / "p.png")]) == cli.EXIT_ERROR
    err = capsys.readouterr().err
    assert f"{plan}: an MSCCL++ execution plan" in err and "not an algorithm file" in err
    assert "takes the algorithm file the plan was exported from" in err
    assert "carries its topology" not in err and not (tmp_path / "p.png").exists()
    # an algorithm file with --topology is still the usage error it was
    assert cli.main(["draw", str(ring_allgather_path), "--topology", "ring:4", "-o",
                     str(tmp_path / "p.png")]) == cli.EXIT_USAGE
    assert "is an algorithm file, which carries its topology" in capsys.readouterr().err


# -- run: the size of a call that failed ------------------------------------------------------


def test_run_that_fails_reports_the_requested_size(ring_allgather_path, monkeypatch, capsys):
    """``run --size 1MB --timeout 0.001``: every rank timed out before it set up its
    buffers, and the summary said "0 bytes per call" (and "rank 0: rank 0: ...")."""
    pytest.importorskip("torch")
    import importlib

    from collsynth.executor.compare import CaseResult

    launch_module = importlib.import_module("collsynth.executor.launch")  # not the function

    def timed_out(fn, ranks, *, args, **kwargs):
        return [[CaseResult(c.name, r, False, error=f"rank {r}: step 0: timed out")
                 for c in args[0]] for r in range(ranks)]

    monkeypatch.setattr(launch_module, "launch", timed_out)
    capsys.readouterr()
    assert cli.main(["run", str(ring_allgather_path), "--size", "1MB", "--timeout",
                     "0.001"]) == cli.EXIT_ERROR
    captured = capsys.readouterr()
    assert "1000000 bytes per call" in captured.out, captured.out
    assert "rank 0: rank 0" not in captured.out + captured.err
    assert "collsynth: error: rank 0: step 0: timed out" in captured.err


def test_a_log_header_in_other_scripts_digits_is_not_read_as_a_count():
    """``# nThread ١ nGpus ٨`` was read as one thread driving 8 GPUs (``\\d`` matched any
    script's digits in the log's header patterns); now only ASCII headers are read."""
    from collsynth.timing.logs import parse_log

    rows = ("#       size   count  type  redop  root   time  algbw  busbw #wrong   time  algbw  "
            "busbw #wrong\n"
            "        1024     256 float    sum    -1  12.00   0.09   0.13      0  11.00   0.09   "
            "0.14      0\n")
    ascii_header = "# nThread 1 nGpus 8 minBytes 8 maxBytes 1024 step: 2(factor)\n"
    other = "# nThread \u0661 nGpus \u0668 minBytes 8 maxBytes 1024 step: 2(factor)\n"
    assert parse_log(ascii_header + rows, name="all_reduce_perf.txt",
                     ranks=8).gpus_per_thread == 8
    assert parse_log(other + rows, name="all_reduce_perf.txt", ranks=8).gpus_per_thread is None
