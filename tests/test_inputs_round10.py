"""Hostile input, round 10: what the twelfth session's hunt found, fixed there.

Each case failed on the code before its fix (a value read as something it does not say, a
warning repeated per entry, or a user's path echoed raw to the terminal).
"""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import pytest

from collsynth import cli
from collsynth.errors import FileFormatError, printable, shown_path
from collsynth.runtimes import parse_given_version, parse_version
from collsynth.timing.calibration import RuntimeCalibration, load_calibration, save_calibration

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT / "tests" / "fixtures" / "traces" / "fc4-mixed"
FC4 = "fully-connected:4,unit_gbps=50,alpha_us=1"
LOG = ROOT / "data" / "nccl-tests" / "A100-8gpu_all_gather_superbench.txt"


# -- a runtime version a user names ------------------------------------------------------------


@pytest.mark.parametrize("text", ["2.18.3.4", "2.18.", "2.18.x", "2.18.-1", "2..18", "2.18-HEAD",
                                  "2.18.5.", "-2.18", "", "1234567.1"])
def test_a_runtime_version_option_is_major_minor_patch(capsys, text):
    """``--runtime-version 2.18.3.4`` (or ``2.18.x``, ``2.18.-1``) was read as 2.18: the
    option took the lenient reading of log banners."""
    assert cli.main(["time", "--collective", "allreduce", "--topology", "dgx-a100", "--sizes",
                     "1MB", f"--runtime-version={text}"]) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert "argument --runtime-version" in err and "MAJOR.MINOR or MAJOR.MINOR.PATCH" in err
    with pytest.raises(ValueError, match="not a runtime version"):
        parse_given_version(text)


@pytest.mark.parametrize("text, version", [("2.18", (2, 18)), ("2.18.5", (2, 18)),
                                           ("v2.27", (2, 27)), ("2.18.5+cuda12.2", (2, 18))])
def test_a_runtime_version_as_users_write_it(text, version):
    assert parse_given_version(text) == version
    assert parse_version(text) == version  # the log reader agrees where both read


def test_calibrate_runtime_option_refuses_a_four_part_version(tmp_path, capsys):
    out = tmp_path / "c.json"
    assert cli.main(["calibrate", str(LOG), "--model", "program", "--topology", "dgx-a100",
                     "--runtime", "nccl-2.18.3.4", "-o", str(out)]) == cli.EXIT_USAGE
    assert "--runtime: '2.18.3.4' is not a runtime version" in capsys.readouterr().err
    assert not out.exists()


def test_a_calibration_files_runtime_version_is_major_minor_patch(tmp_path):
    from collsynth.runtimes import get_runtime

    path = tmp_path / "rt.json"
    save_calibration(RuntimeCalibration(get_runtime("nccl").defaults, runtime_version=(2, 18)),
                     path)
    obj = json.loads(path.read_text())
    obj["runtime_version"] = "2.18.3.4"
    path.write_text(json.dumps(obj))
    with pytest.raises(FileFormatError, match=r"runtime_version: '2\.18\.3\.4'; expected"):
        load_calibration(path)


# -- plan --cache naming a file ----------------------------------------------------------------


def test_plan_cache_that_is_a_file_is_one_error(tmp_path, capsys):
    """``--cache FILE`` planned on and warned once per synthesized entry ("could not write the
    cache entry FILE/fronts/...: Not a directory"); now refused before any planning."""
    cache = tmp_path / "cache"
    cache.write_text("x")
    for given in (cache, cache / "sub"):
        assert cli.main(["plan", str(TRACE), "--topology", FC4, "-o", str(tmp_path / "plan"),
                         "--cache", str(given), "-q"]) == cli.EXIT_ERROR
        err = capsys.readouterr().err
        assert err.count("\n") == 1, err
        assert f"--cache {given}" in err and f"{cache} is a file, expected a folder" in err
        assert not (tmp_path / "plan").exists()


def test_plan_default_cache_that_is_a_file_is_one_warning(tmp_path, capsys, monkeypatch):
    base = tmp_path / "xdg"
    base.write_text("x")
    monkeypatch.setenv("XDG_CACHE_HOME", str(base))
    monkeypatch.setenv("MPLCONFIGDIR", str(tmp_path / "mpl"))
    assert cli.main(["plan", str(TRACE), "--topology", FC4, "-o", str(tmp_path / "plan"),
                     "-q"]) == cli.EXIT_OK
    err = capsys.readouterr().err
    assert err.count("collsynth: warning:") == 1, err
    assert "planning without a cache" in err and "could not write" not in err
    assert (tmp_path / "plan" / "plan.json").is_file()


# -- a user's path echoed to the terminal ------------------------------------------------------


def test_shown_path_and_printable():
    assert shown_path("out/a b.json") == "out/a b.json"
    assert shown_path("a\nb\x1b[2J.json") == "'a\\nb\\x1b[2J.json'"
    assert shown_path(Path("x\u202ey")) == "'x\\u202ey'"
    assert printable("wrote \x1b]0;owned\x07 x\ny\tz") == "wrote \\x1b]0;owned\\x07 x\ny\tz"


def test_output_names_with_newlines_and_escapes_are_echoed_escaped(tmp_path, capsys,
                                                                   monkeypatch):
    """``-o $'a\\nb\\x1b[31m.json'`` printed ``wrote a`` and ``b<ESC>[31m.json`` on two lines,
    the escape sequence raw; a missing folder's name reached stderr raw too."""
    monkeypatch.chdir(tmp_path)
    name = "a\nb\x1b[31m.json"
    assert cli.main(["solve", "least-steps", "ring:4", "allgather", "-o", name]) == cli.EXIT_OK
    captured = capsys.readouterr()
    assert "wrote 'a\\nb\\x1b[31m.json'\n" in captured.out
    assert "\x1b" not in captured.out + captured.err
    assert cli.main(["verify", name]) == cli.EXIT_OK
    captured = capsys.readouterr()
    assert captured.out.startswith("'a\\nb\\x1b[31m.json': correct allgather")
    assert cli.main(["solve", "least-steps", "ring:4", "allgather", "-o",
                     "no\x1b[31mdir/x.json"]) == cli.EXIT_ERROR
    err = capsys.readouterr().err
    assert "\x1b" not in err and "folder 'no\\x1b[31mdir' does not exist" in err
    assert cli.main(["verify", "zz\x1b]0;t\x07.json"]) == cli.EXIT_ERROR
    err = capsys.readouterr().err
    assert err == "collsynth: error: 'zz\\x1b]0;t\\x07.json': no such file\n"


# -- a topology file's unknown field -----------------------------------------------------------


@pytest.mark.parametrize("fields, message", [
    ({"unit_gpbs": 50}, "unknown field 'unit_gpbs'; expected fields: alpha_us, description"),
    ({"num_ranks": 1000000000}, "unknown field 'num_ranks'"),
    ({"groups": [{"name": "g", "sources": [0], "destinations": [1], "limit": 1, "limt": 9}]},
     r"groups\[0\]: unknown field 'limt'; expected destinations, limit, name, sources"),
])
def test_a_topology_files_unknown_field_is_refused(tmp_path, capsys, fields, message):
    """A misspelt ``unit_gpbs`` was ignored: the machine silently had no figures (collective,
    algorithm and calibration files already refuse unknown fields)."""
    from collsynth.topology.fileformat import load_topology

    obj = {"format": "collsynth-topology", "version": 1, "name": "pair",
           "links": [[0, 1], [1, 0]], **fields}
    path = tmp_path / "pair.json"
    path.write_text(json.dumps(obj))
    with pytest.raises(FileFormatError, match=message):
        load_topology(path)
    assert cli.main(["bounds", str(path), "allgather"]) == cli.EXIT_ERROR
    assert "pair.json: " in capsys.readouterr().err


# -- an oversubscription beyond any fabric -----------------------------------------------------


@pytest.mark.parametrize("text, message", [
    ("1e10000000", "oversubscription above 1e300 is more than 1000:1"),
    ("1e300", "is more than 1000:1; expected a ratio from 1 to 1000"),
    ("1001", "oversubscription 1001 is more than 1000:1"),
    ("-1e400", "'-1e400' is below 1"),
])
def test_an_oversubscription_beyond_any_fabric_is_refused(capsys, text, message):
    """``--oversubscription 1e10000000`` spent seconds building 10^10^7 exactly, then failed as
    an internal error (int-to-text digit limit); ``1e300`` was taken as a 10^300:1 fabric."""
    assert cli.main(["bounds", "dgx1", "allgather", "--nodes", "2",
                     f"--oversubscription={text}"]) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert "argument --oversubscription" in err and message in err
    assert "internal error" not in err


def test_an_oversubscription_ratio_from_python_is_bounded():
    from collsynth.errors import InvalidTopologyError
    from collsynth.topology.tiers import oversubscription_ratio, parse_oversubscription

    with pytest.raises(InvalidTopologyError, match="above 1e300 is more than 1000:1"):
        oversubscription_ratio(10**5000, "fabric")
    assert oversubscription_ratio(1000, "fabric") == 1000
    assert parse_oversubscription("leaf=2e0,node=3/2") == {"leaf": 2, "node": Fraction(3, 2)}


# -- a fraction written with a huge exponent ---------------------------------------------------


def test_a_fraction_with_a_huge_exponent_is_refused_fast(tmp_path, capsys):
    """``"rounds_per_chunk": "1e100000000"`` in an algorithm file, or a fabric ratio of that
    text in a topology's metadata, made Fraction compute 10^(10^8): verify and time ran for
    minutes (killed after 15-20 s)."""
    import time

    from collsynth._parse import fraction_from_text
    from collsynth.resolve import resolve_topology
    from collsynth.topology.fileformat import topology_to_json

    assert fraction_from_text("7/6") == Fraction(7, 6)
    assert fraction_from_text(" 1.5 ") == Fraction(3, 2)
    for text in ("1e100000000", "1/0", "-1", "1" * 41, "7/6/5", 7, None):
        assert fraction_from_text(text) is None

    algorithm = tmp_path / "ag.json"
    assert cli.main(["solve", "least-steps", "ring:4", "allgather", "-o", str(algorithm)]) == 0
    obj = json.loads(algorithm.read_text())
    obj["instance"]["rounds_per_chunk"] = "1e100000000"
    algorithm.write_text(json.dumps(obj))
    capsys.readouterr()
    start = time.monotonic()
    assert cli.main(["verify", str(algorithm)]) == cli.EXIT_ERROR
    assert "instance.rounds_per_chunk: expected a fraction such as" in capsys.readouterr().err

    obj = topology_to_json(resolve_topology("dgx1", nodes=2))
    obj["metadata"]["network"]["fabric"]["oversubscription"] = {"node": "1e100000000"}
    topology = tmp_path / "two.json"
    topology.write_text(json.dumps(obj))
    assert cli.main(["time", "--collective", "allreduce", "--topology", str(topology),
                     "--sizes", "1MB"]) == cli.EXIT_ERROR
    assert "['oversubscription']['node']: above 1e300 is more than 1000:1; expected a ratio " \
        "from 1 to 1000" in capsys.readouterr().err
    assert time.monotonic() - start < 10


def test_a_check_with_thousands_of_problems_prints_fifty_and_counts_the_rest(tmp_path, capsys):
    # A plan naming 120 memory channels that do not exist has 120 problems: the terminal gets
    # the first MAX_PROBLEM_LINES and one line counting the rest; --json lists every one.
    from collsynth.cli.common import MAX_PROBLEM_LINES

    plan = json.loads((Path(__file__).resolve().parent.parent / "data" / "mscclpp-plans"
                       / "sn_allgather_2gpu.json").read_text())
    plan["gpus"][0]["threadblocks"][0]["channels"][0]["channel_ids"] = list(range(3, 123))
    path = tmp_path / "many.json"
    path.write_text(json.dumps(plan))
    assert cli.main(["check", str(path), "--json"]) == 1
    every = json.loads(capsys.readouterr().out)["problems"]
    assert len(every) > MAX_PROBLEM_LINES + 10
    assert cli.main(["check", str(path)]) == 1
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    assert len(lines) == MAX_PROBLEM_LINES + 1
    rest = len(every) - MAX_PROBLEM_LINES
    assert lines[-1] == f"... and {rest} more problems (--json lists every one)"
    assert f"{len(every)} problems for mscclpp" in captured.err


def test_a_topology_files_bad_network_metadata_names_the_file(tmp_path, capsys):
    # metadata['network'] is read when the file is, so its error says which file (it used to
    # surface later as "topology 'DGX1x2': ...", naming no file).
    from collsynth.topology import get_topology
    from collsynth.topology.compose import compose_nodes
    from collsynth.topology.fileformat import topology_to_json

    obj = topology_to_json(compose_nodes(get_topology("dgx1"), 2))
    obj["metadata"]["network"]["nodes"] = 3
    path = tmp_path / "two-nodes.json"
    path.write_text(json.dumps(obj))
    assert cli.main(["time", "--collective", "allreduce", "--topology", str(path),
                     "--sizes", "1MiB"]) == 1
    message = capsys.readouterr().err
    assert f"{path}: " in message and "describes 3 nodes of 8 ranks" in message
