"""Hostile input, round 9: what the eleventh session's hunt found, fixed there.

Each case failed on the code before its fix (a file read as something it does not say, or an
error that does not name the file).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from collsynth import cli
from collsynth._parse import parse_json
from collsynth.errors import FileFormatError
from collsynth.timing.logs import load_log
from collsynth.timing.runtime_fit import read_curve
from collsynth.topology.fileformat import load_topology

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT / "tests" / "fixtures" / "traces" / "fc4-mixed"
NCCL_JSON_LOG = ROOT / "tests" / "fixtures" / "logs" / "nccl_tests_all_reduce.json"


def _topology(**fields) -> dict:
    obj = {"format": "collsynth-topology", "version": 1, "name": "pair",
           "links": [[0, 1], [1, 0]]}
    obj.update(fields)
    return obj


# -- a JSON key given twice --------------------------------------------------------------------


def test_a_json_key_given_twice_is_refused(tmp_path, capsys):
    """``{"name": "x", "name": "y"}`` was read as ``y`` (Python keeps the last; other readers
    the first); in a trace line, ``"seq": 0, "seq": 5`` made the next line the one blamed."""
    with pytest.raises(FileFormatError, match="x.json: the key 'name' appears twice in one "
                                              "object"):
        parse_json('{"name": "x", "links": [], "name": "y"}', "x.json")
    with pytest.raises(FileFormatError, match="line 3: the key 'b' appears twice"):
        parse_json('{"a": {"b": 1, "b": 2}}', "t.jsonl", line=3)
    assert parse_json('[{"a": 1}, {"a": 2}]', "x.json") == [{"a": 1}, {"a": 2}]

    path = tmp_path / "pair.json"
    path.write_text(json.dumps(_topology())[:-1] + ', "name": "other"}')
    assert cli.main(["bounds", str(path), "allgather"]) == cli.EXIT_ERROR
    assert "the key 'name' appears twice" in capsys.readouterr().err

    trace = tmp_path / "trace"
    trace.mkdir()
    for file in TRACE.iterdir():
        (trace / file.name).write_text(file.read_text())
    first = trace / "rank-00000.jsonl"
    lines = first.read_text().splitlines()
    lines[1] = lines[1].replace('"seq": 0,', '"seq": 0, "seq": 5,', 1)
    first.write_text("\n".join(lines) + "\n")
    assert cli.main(["trace", "summarize", str(trace)]) == cli.EXIT_ERROR
    assert "rank-00000.jsonl: line 2: the key 'seq' appears twice" in capsys.readouterr().err


# -- a version of true -------------------------------------------------------------------------


def test_a_version_of_true_is_not_version_1(tmp_path):
    """``"version": true`` equals 1 in Python: a topology file and an nccl-tests JSON log
    took it for version 1 (the collective, algorithm and calibration readers refuse it)."""
    path = tmp_path / "pair.json"
    path.write_text(json.dumps(_topology(version=True)))
    with pytest.raises(FileFormatError, match="unknown version True"):
        load_topology(path)
    log = json.loads(NCCL_JSON_LOG.read_text())
    log["version"] = True
    path = tmp_path / "all_reduce.json"
    path.write_text(json.dumps(log))
    with pytest.raises(FileFormatError, match="nccl-tests JSON version True"):
        load_log(path)


# -- a CSV column named twice ------------------------------------------------------------------


def test_a_csv_column_named_twice_is_refused(tmp_path, capsys):
    """``size_bytes,time_us,size_bytes``: the curve reader took the sizes of the last column,
    the program calibration's reader those of the first; a calibration was written either
    way."""
    path = tmp_path / "curve.csv"
    path.write_text("size_bytes,time_us,size_bytes\n1024,10,3\n2048,11,4\n4096,12,5\n")
    message = "curve.csv: line 1: the column 'size_bytes' twice in the header"
    with pytest.raises(FileFormatError, match=message):
        load_log(path, collective="allreduce", ranks=8)
    with pytest.raises(FileFormatError, match=message):
        read_curve(path)
    out = tmp_path / "c.json"
    for model in ("curve", "program"):
        args = ["calibrate", "--model", model, "--topology", "dgx1", "--collective",
                "allreduce", "-o", str(out), str(path)]
        assert cli.main(args) == cli.EXIT_ERROR
        assert message in capsys.readouterr().err
        assert not out.exists()


# -- a program calibration of one size ---------------------------------------------------------


def test_a_program_calibration_of_one_size_names_the_file(tmp_path, capsys):
    """A one-row curve gave 'a runtime calibration needs at least 2 distinct measured
    sizes', without saying of which file."""
    path = tmp_path / "one.csv"
    path.write_text("size_bytes,time_us\n1024,10\n")
    out = tmp_path / "c.json"
    assert cli.main(["calibrate", "--model", "program", "--topology", "dgx1", "-o", str(out),
                     str(path)]) == cli.EXIT_ERROR
    assert "one.csv: 1 measured size(s); a runtime calibration needs at least 2" in \
        capsys.readouterr().err
    assert not out.exists()


# -- a path that is not a path -----------------------------------------------------------------


def test_readers_and_writers_given_a_path_of_the_wrong_type_say_so(tmp_path):
    """``load_algorithm(None)``, ``save_algorithm(algorithm, 5)``, ``read_trace(None)``,
    ``load_program(3)``... raised Python's TypeError from inside ``os.fspath`` or ``open``
    ('expected str, bytes or os.PathLike object, not NoneType'), and a bytes path to a writer
    one from ``str.endswith``."""
    from collsynth.algorithm.fileformat import load_algorithm, save_algorithm
    from collsynth.draw import draw_file
    from collsynth.errors import WrongTypeError
    from collsynth.export.pipeline import export_algorithm
    from collsynth.export.xml_reader import load_program
    from collsynth.timing.calibration import load_calibration
    from collsynth.topology import get_topology
    from collsynth.topology.fileformat import save_topology
    from collsynth.trace.records import read_rank_file, read_trace

    path = tmp_path / "ring.json"
    assert cli.main(["solve", "least-steps", "ring:4", "allgather", "-o", str(path),
                     "-q"]) == cli.EXIT_OK
    algorithm = load_algorithm(path)
    for call, message in (
            (lambda: load_algorithm(None), "path: expected str or PathLike, got NoneType None"),
            (lambda: load_topology(5), "path: expected str or PathLike, got int 5"),
            (lambda: load_log(3.5), "path: expected str or PathLike, got float 3.5"),
            (lambda: read_curve(None), "path: expected str or PathLike"),
            (lambda: load_calibration(None), "path: expected str or PathLike"),
            (lambda: load_program(3), "source: expected str or PathLike, got int 3"),
            (lambda: read_trace(None), "directory: expected str or PathLike"),
            (lambda: read_rank_file(None), "path: expected str or PathLike"),
            (lambda: draw_file(None), "path: expected str or PathLike"),
            (lambda: save_algorithm(algorithm, 5), "path: expected str or PathLike, got int 5"),
            (lambda: save_algorithm(algorithm, b"x.json"),
             "path: expected str or PathLike, got bytes b'x.json'"),
            (lambda: save_topology(get_topology("ring:4"), None), "path: expected str"),
            (lambda: export_algorithm(algorithm, None, runtime="msccl"), "path: expected str")):
        with pytest.raises(WrongTypeError, match=re.escape(message)):
            call()


# -- plot told to use options it does not have -------------------------------------------------


def test_plot_refusals_name_a_command_that_takes_the_input(tmp_path, capsys):
    """``plot FILE.xml`` said 'needs the program model (--topology T)' and ``plot --calibration
    RUNTIME-CONSTANTS`` '(--model program)': plot has neither option (argparse refuses both)."""
    algorithm = tmp_path / "ring.json"
    assert cli.main(["solve", "least-steps", "ring:4", "allgather", "-o", str(algorithm),
                     "-q"]) == cli.EXIT_OK
    program = ROOT / "data" / "msccl-xml" / "generated" / "allgather_ring_8g_1ch_1i.xml"
    constants = tmp_path / "rt.json"
    curve = tmp_path / "curve.csv"
    curve.write_text("size_bytes,time_us\n" + "".join(
        f"{1 << k},{10 + (1 << k) / 2e4:.3f}\n" for k in range(10, 28, 2)))
    assert cli.main(["calibrate", "--model", "program", "--topology", "ring:4,unit_gbps=25,"
                     "alpha_us=1", "--collective", "allgather", "--time-limit", "20", "-q",
                     "-o", str(constants), str(curve)]) in (cli.EXIT_OK, cli.EXIT_TIMEOUT)
    assert constants.exists()
    capsys.readouterr()
    output = tmp_path / "p.png"
    for args, says in (
            ([str(program)], "plot draws the closed form of algorithm files; an MSCCL XML "
                             "program is priced by 'collsynth time FILE.xml --topology T'"),
            ([str(algorithm), "--calibration", str(constants), "--unit-gbps", "25",
              "--alpha-us", "1"],
             "runtime constants; plot draws the closed form, which reads a curve calibration")):
        assert cli.main(["plot", *args, "-o", str(output)]) == cli.EXIT_ERROR
        err = capsys.readouterr().err
        assert says in err and "--model" not in err and "(--topology T)" not in err
        assert not output.exists()


# -- a program calibration of a log with a bad row ---------------------------------------------


def test_a_program_calibration_of_a_bad_log_says_what_is_wrong_with_the_log(tmp_path, capsys):
    """A nccl-tests log with a time of 1e308 (or -nan, or a truncated row) was refused by
    ``calibrate --model program`` as a CSV: "no 'size_bytes' column (found: $ srun ...)".
    The log reader's message, naming the line, is the one shown now (as ``--model curve``
    shows it)."""
    text = (ROOT / "tests" / "fixtures" / "logs" / "nccl_tests_srun_allgather.txt").read_text()
    bad = text.replace(" 18.20 ", "  1e308 ", 1)
    assert bad != text
    path = tmp_path / "run_all_gather.txt"
    path.write_text(bad)
    out = tmp_path / "c.json"
    assert cli.main(["calibrate", "--model", "program", "--topology",
                     "ring:4,unit_gbps=25,alpha_us=1", "-o", str(out), str(path)]) == \
        cli.EXIT_ERROR
    err = capsys.readouterr().err
    assert "run_all_gather.txt: line 20: time = 1e+308: expected a finite number" in err
    assert "size_bytes" not in err and not out.exists()
    # a CSV keeps the CSV reader's message
    path = tmp_path / "curve.csv"
    path.write_text("size;time\n1024;10\n")
    assert cli.main(["calibrate", "--model", "program", "--topology",
                     "ring:4,unit_gbps=25,alpha_us=1", "-o", str(out), str(path)]) == \
        cli.EXIT_ERROR
    assert "curve.csv: no 'size_bytes' column" in capsys.readouterr().err
