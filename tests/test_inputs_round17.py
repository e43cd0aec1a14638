"""Hostile input, round 17: the known findings given to this round, and what its hunt found.

Each case failed on the code before its fix.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from collsynth import cli

TRACES = Path(__file__).resolve().parent / "fixtures" / "traces"


def one_usage_line(capsys, code: int, prog: str) -> str:
    """The one error line of a usage error of ``prog``, nothing on stdout."""
    captured = capsys.readouterr()
    assert code == cli.EXIT_USAGE, captured.err
    [line] = captured.err.splitlines()
    assert line.startswith(f"{prog}: error: "), line
    assert captured.out == ""
    return line


# -- a comma-separated list with an empty entry ------------------------------------------------


@pytest.mark.parametrize("sizes, entry", [("1MB,,2MB", "entry 2 of 3"), ("1MB,", "entry 2 of 2"),
                                          (",1MB", "entry 1 of 2"), ("1MB, ,2MB", "entry 2 of 3")])
def test_an_empty_size_in_sizes_is_a_usage_error(ring_allgather_path, capsys, sizes, entry):
    """``--sizes 1MB,,2MB`` priced 1 MB and 2 MB: the entry typed between the commas (or lost
    to an unset shell variable) was skipped without a word."""
    code = cli.main(["time", str(ring_allgather_path), "--sizes", sizes, "--unit-gbps", "10",
                     "--alpha-us", "1"])
    line = one_usage_line(capsys, code, "collsynth time")
    assert f"--sizes: sizes {sizes!r}: {entry} is empty" in line, line


def test_export_tune_sizes_share_the_rule(ring_allgather_path, tmp_path, capsys):
    out = tmp_path / "t.csv"
    code = cli.main(["export", str(ring_allgather_path), "--tune", "--sizes", "1MB,,2MB",
                     "-o", str(out)])
    assert "entry 2 of 3 is empty" in one_usage_line(capsys, code, "collsynth export")
    assert not out.exists()


def test_tune_runtime_collectives_with_an_empty_entry_is_a_usage_error(tmp_path, capsys):
    out = tmp_path / "tuner.csv"
    code = cli.main(["tune-runtime", "--topology", "dgx-a100", "--runtime", "nccl",
                     "--collectives", "allreduce,,allgather", "-o", str(out)])
    line = one_usage_line(capsys, code, "collsynth tune-runtime")
    assert "--collectives: collective names 'allreduce,,allgather': entry 2 of 3 is empty" \
        in line, line
    assert not out.exists()


def test_plan_runtime_with_an_empty_entry_is_a_usage_error(tmp_path, capsys):
    out = tmp_path / "plan.json"
    code = cli.main(["plan", str(TRACES / "fc4-mixed"), "--topology", "fc:4", "--runtime",
                     "rccl,,nccl", "-o", str(out)])
    line = one_usage_line(capsys, code, "collsynth plan")
    assert "--runtime: runtime names 'rccl,,nccl': entry 2 of 3 is empty" in line, line
    assert not out.exists()


def test_a_list_without_empty_entries_is_still_read():
    from collsynth.cli.common import parse_sizes

    assert parse_sizes(" 1KB , 1MB,1KB") == [1000, 1000000]


# -- time and plot: one file given twice ---------------------------------------------------------


@pytest.mark.parametrize("command", ["time", "plot"])
def test_one_algorithm_file_given_twice_is_a_usage_error(ring_allgather_path, tmp_path, capsys,
                                                         command):
    """``time ag.json ag.json`` priced the file twice, as two candidates (the second renamed
    with a prime), as ``--collectives allreduce,all_reduce`` tuned one collective twice."""
    path = str(ring_allgather_path)
    extra = ["-o", str(tmp_path / "p.png")] if command == "plot" else ["--sizes", "1MB"]
    code = cli.main([command, path, path, *extra, "--unit-gbps", "10", "--alpha-us", "1"])
    line = one_usage_line(capsys, code, f"collsynth {command}")
    assert f"{path} is given twice; give each file once" in line, line
    assert not (tmp_path / "p.png").exists()


def test_two_paths_of_one_file_are_a_usage_error(ring_allgather_path, tmp_path, capsys,
                                                 monkeypatch):
    monkeypatch.chdir(ring_allgather_path.parent)
    link = tmp_path / "link.json"
    link.symlink_to(ring_allgather_path)
    code = cli.main(["time", "ag.json", f".{os.sep}ag.json", "--sizes", "1MB",
                     "--unit-gbps", "10", "--alpha-us", "1"])
    assert "ag.json and ./ag.json name one file" in one_usage_line(capsys, code, "collsynth time")
    code = cli.main(["time", "ag.json", str(link), "--sizes", "1MB", "--unit-gbps", "10",
                     "--alpha-us", "1"])
    assert f"ag.json and {link} name one file" in one_usage_line(capsys, code, "collsynth time")


def test_two_files_of_one_algorithm_are_both_priced(ring_allgather_path, tmp_path, capsys):
    copy = tmp_path / "copy.json"
    copy.write_bytes(ring_allgather_path.read_bytes())
    assert cli.main(["time", str(ring_allgather_path), str(copy), "--sizes", "1MB",
                     "--unit-gbps", "10", "--alpha-us", "1"]) == cli.EXIT_OK
    assert "allgather-ring:4-s2-r2-c1'" in capsys.readouterr().out


# -- draw: --dpi where the picture has no resolution ----------------------------------------------


def test_draw_dpi_for_an_svg_of_arrows_is_a_usage_error(ring_allgather_path, tmp_path, capsys):
    """``draw ag.json -o ag.svg --dpi 300`` wrote the same SVG as without --dpi: arrows are
    vectors, and the resolution was dropped without a word."""
    out = tmp_path / "ag.svg"
    code = cli.main(["draw", str(ring_allgather_path), "-o", str(out), "--dpi", "300"])
    line = one_usage_line(capsys, code, "collsynth draw")
    assert "--dpi 300: an SVG of arrows has no resolution" in line, line
    assert not out.exists()


@pytest.mark.parametrize("args", [["-o", "ag.png", "--dpi", "50"],
                                  ["-o", "ag.svg", "--dpi", "50", "--style", "heatmap"],
                                  ["-o", "ag.svg"]])
def test_draw_dpi_where_it_sets_a_resolution(ring_allgather_path, tmp_path, capsys, args):
    """A PNG, and the heat maps of an SVG (embedded images), take --dpi."""
    args = [str(tmp_path / a) if a.startswith("ag.") else a for a in args]
    assert cli.main(["draw", str(ring_allgather_path), *args]) == cli.EXIT_OK
    capsys.readouterr()


# -- solve instance: --rounds below --steps -------------------------------------------------------


def test_solve_instance_rounds_below_steps_is_a_usage_error(capsys):
    """``solve instance ... --rounds 1 --steps 2`` exited 1 after reading the problem, in the
    instance's own words (``rounds = 1``), not the options'."""
    code = cli.main(["solve", "instance", "ring:4", "allgather", "--steps", "2", "--rounds", "1",
                     "-q"])
    line = one_usage_line(capsys, code, "collsynth solve instance")
    assert "--rounds 1: expected --rounds >= --steps (2): every step lasts at least one round" \
        in line, line


# -- a link that leads nowhere ----------------------------------------------------------------


def loop(folder: Path, name: str) -> Path:
    """``name`` in ``folder``: a symbolic link in a loop of two."""
    first, second = folder / name, folder / f"{name}.other"
    first.symlink_to(second.name)
    second.symlink_to(first.name)
    return first


@pytest.mark.parametrize("args", [["bounds", "{}", "allgather"], ["bounds", "ring:4", "{}"]])
def test_a_bare_name_that_is_a_symlink_loop_cannot_be_read(tmp_path, monkeypatch, capsys, args):
    """``bounds myring allgather`` with ``myring`` a loop of links said "unknown topology
    'myring'; valid names: ...": a bare name is read as a file when one is there, and
    ``is_file()`` is False for a loop and for a dangling link."""
    monkeypatch.chdir(tmp_path)
    loop(tmp_path, "myring")
    assert cli.main([a.format("myring") for a in args]) == cli.EXIT_ERROR
    [line] = capsys.readouterr().err.splitlines()
    assert line == "collsynth: error: myring: cannot read: a loop of symbolic links (each " \
                   "points on to the next, never to a file or folder)", line
    (tmp_path / "dangling").symlink_to("nowhere")
    assert cli.main([a.format("dangling") for a in args]) == cli.EXIT_ERROR
    [line] = capsys.readouterr().err.splitlines()
    assert line == "collsynth: error: dangling: cannot read: a symbolic link to a missing file"


@pytest.mark.parametrize("args", [["show", "{}"], ["verify", "{}"], ["time", "{}"],
                                  ["time", "AG", "--calibration", "{}", "--sizes", "1MB"],
                                  ["bounds", "{}", "allgather"], ["bounds", "ring:4", "{}"],
                                  ["plan", "{}", "--topology", "dgx1", "-o", "plan.json"]])
def test_every_reader_says_a_symlink_loop_is_one(ring_allgather_path, tmp_path, monkeypatch,
                                                 capsys, args):
    """The readers said "cannot read: Too many levels of symbolic links", and a trace folder
    that is a loop was "no such directory"."""
    monkeypatch.chdir(tmp_path)
    path = loop(tmp_path, "loop.json")
    args = [str(path) if a == "{}" else str(ring_allgather_path) if a == "AG" else a
            for a in args]
    assert cli.main(args) == cli.EXIT_ERROR
    [line] = capsys.readouterr().err.splitlines()
    assert line == f"collsynth: error: {path}: cannot read: a loop of symbolic links (each " \
                   "points on to the next, never to a file or folder)", line
    assert not (tmp_path / "plan.json").exists()


def test_a_missing_trace_folder_is_still_no_such_directory(tmp_path, capsys):
    assert cli.main(["plan", str(tmp_path / "none"), "--topology", "dgx1", "-o",
                     str(tmp_path / "p.json")]) == cli.EXIT_ERROR
    assert capsys.readouterr().err.strip().endswith("none: no such directory")


# -- calibration entries of one rank ------------------------------------------------------------


def curve_calibration(ranks: int) -> dict:
    return {"format": "collsynth-calibration", "version": 2, "kind": "curve",
            "topology": "ring:4", "nodes": 1,
            "entries": [{"file": "b.csv", "collective": "broadcast", "ranks": ranks,
                         "model": "alpha-beta", "alpha_us": 10.0, "beta_us_per_byte": 5e-05,
                         "algbw_gbps": 20.0, "busbw_gbps": 20.0, "latency_max_bytes": 8192,
                         "bandwidth_min_bytes": 67108864, "gmae": 0.01}]}


def test_a_calibration_entry_of_one_rank_is_refused_naming_the_field(tmp_path):
    """An entry of ``"ranks": 1`` was read and never applied: a fit is applied to topologies of
    its rank count, and no topology of one rank is priced."""
    from collsynth.errors import FileFormatError
    from collsynth.timing.calibration import load_calibration

    path = tmp_path / "cal.json"
    path.write_text(json.dumps(curve_calibration(1)))
    with pytest.raises(FileFormatError, match=r"entries\[0\]\.ranks: 1; a collective on one "
                                              "rank moves nothing") as info:
        load_calibration(path)
    assert info.value.path == str(path)
    path.write_text(json.dumps(curve_calibration(4)))
    assert load_calibration(path).entries[0].ranks == 4


def write_broadcast_log(path: Path) -> None:
    """A CSV broadcast log, which does not say its rank count (broadcast's bus bandwidth does
    not need it, so the log reader takes 1)."""
    rows = [f"{2 ** i},{10 + 2 ** i / 20e3:.3f}" for i in range(10, 30)]
    path.write_text("size_bytes,time_us\n" + "\n".join(rows) + "\n")


def test_calibrate_refuses_a_fit_of_one_rank(tmp_path, capsys):
    """``calibrate b.csv --collective broadcast`` wrote entries of ``"ranks": 1``, which no
    ``time --calibration`` could apply; ``--ranks 1`` did the same."""
    log, out = tmp_path / "b.csv", tmp_path / "cal.json"
    write_broadcast_log(log)
    base = ["calibrate", str(log), "--collective", "broadcast", "--topology", "ring:4", "-o",
            str(out)]
    assert cli.main(base) == cli.EXIT_ERROR
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith(f"collsynth: error: {log}: broadcast on 1 rank"), line
    assert "--ranks N" in line
    code = cli.main([*base, "--ranks", "1"])
    assert "--ranks: 1 rank: a collective on one rank moves nothing" in \
        one_usage_line(capsys, code, "collsynth calibrate")
    assert not out.exists()
    assert cli.main([*base, "--ranks", "4"]) == cli.EXIT_OK
    capsys.readouterr()


# -- draw: --steps the file does not have --------------------------------------------------------


def test_draw_steps_beyond_the_schedule_are_a_usage_error(ring_allgather_path, tmp_path, capsys):
    """``draw ag.json --steps 5-9`` of a 2-step algorithm exited 1, as for a bad file; an
    option asking for what the input does not have is a usage error, as ``--root 9`` of a
    4-rank topology is."""
    out = tmp_path / "ag.png"
    code = cli.main(["draw", str(ring_allgather_path), "-o", str(out), "--steps", "5-9"])
    line = one_usage_line(capsys, code, "collsynth draw")
    assert "--steps: steps 5-9: there are 2 steps, numbered 0-1" in line, line
    assert not out.exists()


# -- draw: an empty file ------------------------------------------------------------------------


@pytest.mark.parametrize("content", [b"", b"  \n\t", b"\xef\xbb\xbf"])
def test_draw_says_an_empty_file_is_empty(tmp_path, capsys, content):
    """``draw empty.json`` said "expected an algorithm file (JSON) or an MSCCL XML program",
    where every other reader of the file says "empty"."""
    path = tmp_path / "empty.json"
    path.write_bytes(content)
    assert cli.main(["draw", str(path), "-o", str(tmp_path / "e.png")]) == cli.EXIT_ERROR
    [line] = capsys.readouterr().err.splitlines()
    assert line == f"collsynth: error: {path}: empty: expected an algorithm file (JSON) or an " \
                   "MSCCL XML program", line
