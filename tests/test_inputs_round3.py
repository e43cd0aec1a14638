"""Hostile input, round 3 (issue 19): inputs that are not regular files, internal errors of
hostile values, values accepted silently, and output left behind by a failed command.

Each case was found failing on the code before its fix: a FIFO given as an input blocked
forever (every reader opened it and waited for a writer); a NIC of 1e30 GB/s raised
``OverflowError``; a 200 KB CSV field raised the csv module's own error; a CSV with a UTF-8
byte-order mark "had no size_bytes column"; ``--collective frobnicate``, a figure given twice
and ``COLLSYNTH_MEMORY_LIMIT=garbage`` were accepted; ``bench --from-logs`` and
``export --tune`` left folders behind on failure; ``check`` called a correct tuned msccl file
wrong. A call that blocks is failed after a few seconds (the FIFO is then opened for writing,
which releases the reader), so a regression fails instead of hanging the suite.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import stat
import threading
from pathlib import Path
from typing import Any, Callable

import pytest

from collsynth import cli
from collsynth.algorithm import Algorithm, Send, Step, verify
from collsynth.algorithm.fileformat import algorithm_to_json, load_algorithm, save_algorithm
from collsynth.collective import allgather
from collsynth.errors import (
    CollsynthError,
    FileFormatError,
    InvalidTopologyError,
    OutputPathError,
    UnknownNameError,
)
from collsynth.topology import get_topology
from collsynth.topology.families import ring

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT / "tests" / "fixtures" / "traces" / "fc4-mixed"
BENCH_LOGS = ROOT / "tests" / "fixtures" / "bench"

needs_fifo = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")


def _quickly(call: Callable[[], Any], release: tuple[Path, ...] = (),
             seconds: float = 20) -> Any:
    """``call()``'s value (or the exception it raised, returned), failing the test when it
    runs more than ``seconds``; the FIFOs in ``release`` are then opened for writing, which
    ends a reader blocked on them."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = call()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            box["value"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        for fifo in release:
            with contextlib.suppress(OSError):
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        thread.join(5)
        pytest.fail(f"blocked for more than {seconds:g} s (an input that is not a regular file "
                    "was opened and waited on)")
    return box["value"]


def _cli(capsys: pytest.CaptureFixture[str], *argv: object,
         release: tuple[Path, ...] = ()) -> tuple[int, str, str]:
    code = _quickly(lambda: cli.main([str(a) for a in argv]), release)
    if isinstance(code, BaseException):
        raise code
    out, err = capsys.readouterr()
    return code, out, err


def _one_line_error(err: str, *needles: str) -> None:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("collsynth") and "Traceback" not in err, err
    for needle in needles:
        assert needle in lines[0], lines[0]


def _tree(folder: Path) -> list[tuple[str, bytes | None]]:
    """Every entry under ``folder`` with its content (``None`` for folders): a snapshot."""
    return sorted((str(p.relative_to(folder)), None if p.is_dir() else p.read_bytes())
                  for p in folder.rglob("*"))


def _algorithm(unit_gbps: float | None = 10.0) -> Algorithm:
    """A 2-step allgather on a 4-ring (tests/plan/test_bench.py's), with figures or none."""
    topology = dataclasses.replace(ring(4), unit_gbps=unit_gbps,
                                   alpha_us=None if unit_gbps is None else 2.0)
    s1 = tuple(Send(r, r, d) for r in range(4) for d in ((r + 1) % 4, (r - 1) % 4))
    s2 = tuple(Send((r - 1) % 4, r, (r + 1) % 4) for r in range(4))
    return verify(Algorithm("two_step", topology, allgather(4), (Step(1, s1), Step(1, s2))))


@pytest.fixture
def algo(tmp_path: Path) -> Path:
    path = tmp_path / "two_step.json"
    save_algorithm(_algorithm(), path)
    return path


# -- inputs that are not regular files ------------------------------------------------------------


def _readers() -> dict[str, Callable[[Path], Any]]:
    from collsynth.collective.fileformat import load_collective
    from collsynth.draw import file_kind
    from collsynth.export.xml_reader import read_text
    from collsynth.plan.calls import load_calls
    from collsynth.resolve import resolve_topology
    from collsynth.timing.calibration import load_calibration
    from collsynth.timing.logs import load_log
    from collsynth.timing.runtime_fit import read_curve
    from collsynth.topology.fileformat import load_topology
    from collsynth.topology.importers import import_topology_file

    return {
        "load_algorithm": load_algorithm, "load_collective": load_collective,
        "load_topology": load_topology, "import_topology_file": import_topology_file,
        "resolve_topology": lambda p: resolve_topology(str(p)),
        "read_text (XML)": read_text, "file_kind": file_kind,
        "load_log": lambda p: load_log(p, collective="allreduce", ranks=4),
        "read_curve": read_curve, "load_calibration": load_calibration,
        "load_calls (a trace folder)": lambda p: load_calls(p.parent),
    }


@needs_fifo
@pytest.mark.parametrize("reader", sorted(_readers()))
def test_a_fifo_is_refused_by_every_reader_without_blocking(tmp_path: Path, reader: str):
    fifo = tmp_path / "rank-00000.jsonl"  # named like a trace file, for the folder reader
    os.mkfifo(fifo)
    error = _quickly(lambda: _readers()[reader](fifo), (fifo,))
    assert isinstance(error, FileFormatError), repr(error)
    assert "is a FIFO, expected a regular file" in str(error) and str(fifo) in str(error)


@pytest.mark.parametrize("reader", ["read_text (XML)", "load_log", "load_algorithm"])
def test_devices_and_folders_are_refused_before_reading(tmp_path: Path, reader: str):
    # /dev/zero never ends: before, a reader read up to its size limit (64 MiB to 1 GiB; not
    # tried with the algorithm reader, whose limit is 1 GiB).
    cases = [(tmp_path, "a directory")]
    if Path("/dev/zero").exists() and reader != "load_algorithm":
        cases.append((Path("/dev/zero"), "a character device"))
    for path, kind in cases:
        if path.exists():
            error = _quickly(lambda: _readers()[reader](path))
            assert isinstance(error, FileFormatError), repr(error)
            assert f"is {kind}, expected a regular file" in str(error)


def test_a_link_to_a_regular_file_is_read(tmp_path: Path, algo: Path):
    link = tmp_path / "link.json"
    link.symlink_to(algo)
    assert load_algorithm(link).name == "two_step"


@needs_fifo
def test_a_fifo_swapped_in_after_the_check_is_refused_on_the_open_descriptor(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The race: stat saw a regular file, a FIFO is there by the time of the open. The open
    does not block (O_NONBLOCK) and fstat refuses it."""
    import collsynth._files as files

    fifo = tmp_path / "a.json"
    os.mkfifo(fifo)
    monkeypatch.setattr(files, "check_input_file", lambda path, label=None: os.stat(__file__))
    error = _quickly(lambda: files.read_bytes_bounded(fifo, 1000), (fifo,))
    assert isinstance(error, FileFormatError) and "is a FIFO" in str(error)


@needs_fifo
def test_cli_fifo_inputs(tmp_path: Path, algo: Path, capsys: pytest.CaptureFixture[str]):
    fifo = tmp_path / "p.xml"
    os.mkfifo(fifo)
    for argv in (["time", fifo, "--topology", "ring:4,unit_gbps=50,alpha_us=1"],
                 ["calibrate", fifo, "--topology", "ring:4", "-o", tmp_path / "cal.json"],
                 ["calibrate", fifo, "--model", "program", "--topology",
                  "ring:4,unit_gbps=50,alpha_us=1", "-o", tmp_path / "rt.json"],
                 ["check", fifo], ["show", fifo], ["verify", fifo],
                 ["time", algo, "--calibration", fifo],
                 # The calibration is read once, whatever its kind: a file it cannot read is
                 # said as such.
                 ["time", algo, "--topology", "ring:4,unit_gbps=50,alpha_us=1",
                  "--calibration", fifo],
                 ["export", algo, "--tune", "-o", tmp_path / "x", "--runtime-constants", fifo],
                 ["bounds", fifo, "allgather"]):
        code, out, err = _cli(capsys, *argv, release=(fifo,))
        assert code == cli.EXIT_ERROR, (argv, err)
        _one_line_error(err, str(fifo), "is a FIFO")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.xml", "two_step.json"]


@needs_fifo
def test_every_input_is_checked_before_the_first_is_used(tmp_path: Path, algo: Path,
                                                         monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]):
    import collsynth.cli.calibrate as calibrate
    import collsynth.cli.time as time_command

    good = tmp_path / "curve.csv"
    good.write_text("size_bytes,time_us\n" + _ROWS)
    fifo = tmp_path / "late.txt"
    os.mkfifo(fifo)
    used = []
    monkeypatch.setattr(calibrate, "fit_log", lambda log: used.append(log))

    def load(*args, **kwargs):
        used.append(args)
        raise CollsynthError("loaded before every input was checked")

    monkeypatch.setattr(time_command, "_algorithms", load)
    code, _, err = _cli(capsys, "calibrate", good, fifo, "--topology", "ring:4",
                        "--collective", "allgather", "--ranks", "4", "-o", tmp_path / "c.json",
                        release=(fifo,))
    assert code == cli.EXIT_ERROR and "late.txt: is a FIFO" in err
    code, _, err = _cli(capsys, "time", algo, fifo, release=(fifo,))
    assert code == cli.EXIT_ERROR and "late.txt: is a FIFO" in err
    assert used == []


@needs_fifo
@pytest.mark.parametrize("command", ["trace", "plan"])
def test_a_fifo_in_a_trace_folder(tmp_path: Path, command: str,
                                  capsys: pytest.CaptureFixture[str]):
    trace = tmp_path / "trace"
    trace.mkdir()
    for path in TRACE.iterdir():
        if path.name != "rank-00003.jsonl":
            (trace / path.name).write_bytes(path.read_bytes())
    fifo = trace / "rank-00003.jsonl"
    os.mkfifo(fifo)
    argv = (["trace", "summarize", trace] if command == "trace" else
            ["plan", trace, "--topology", "fully-connected:4,unit_gbps=50,alpha_us=1", "-o",
             tmp_path / "plan", "--no-cache", "-q"])
    code, _, err = _cli(capsys, *argv, release=(fifo,))
    assert code == cli.EXIT_ERROR
    _one_line_error(err, "rank-00003.jsonl", "is a FIFO")
    assert not (tmp_path / "plan").exists()


# -- internal errors of hostile values ----------------------------------------------------------


def test_nic_of_1e30_gbps_names_the_file_and_field(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]):
    from collsynth.topology.fileformat import load_topology, topology_to_json

    obj = topology_to_json(get_topology("dgx-a100"))
    obj["metadata"]["nic"]["gbps"] = 1e30
    assert get_topology("dgx-a100").metadata["nic"]["gbps"] == 25.0  # a copy was edited
    path = tmp_path / "nic.json"
    path.write_text(json.dumps(obj))
    with pytest.raises(FileFormatError, match=r"nic.json: metadata.nic.gbps = 1e\+30"):
        load_topology(path)
    code, _, err = _cli(capsys, "bounds", path, "allgather", "--nodes", "2")
    assert code == cli.EXIT_ERROR
    _one_line_error(err, "nic.json", "metadata.nic.gbps")


def test_composing_refuses_nic_figures_beyond_a_links_units():
    from collsynth.topology.compose import compose_nodes

    node = get_topology("dgx-a100")
    huge = dataclasses.replace(node, metadata={**node.metadata,
                                               "nic": {**node.metadata["nic"], "gbps": 1e30}})
    with pytest.raises(InvalidTopologyError, match="'gbps' = 1e\\+30"):
        compose_nodes(huge, 2)
    # 1e6 GB/s NICs on 1e-6 GB/s units would be 10^12 units per link (OverflowError before).
    tiny_units = dataclasses.replace(huge, unit_gbps=1e-6, metadata={
        **node.metadata, "nic": {**node.metadata["nic"], "gbps": 1e6}})
    with pytest.raises(InvalidTopologyError, match="more than the 1048576 a link may have"):
        compose_nodes(tiny_units, 2)
    with pytest.raises(InvalidTopologyError, match="nic_units must be a whole number"):
        compose_nodes(node, 2, nic_units=10 ** 30)


_ROWS = "".join(f"{1 << k},{10 + (1 << k) / 1e4}\n" for k in range(10, 22))


@pytest.mark.parametrize("reader", ["read_curve", "load_log"])
def test_a_200_kb_csv_field_is_a_file_format_error(tmp_path: Path, reader: str):
    for quote in ("", '"'):
        path = tmp_path / "big.csv"
        path.write_text(f"size_bytes,time_us,note\n512,9,{quote}{'x' * 200_000}{quote}\n"
                        + _ROWS.replace("\n", ",\n"))
        with pytest.raises(FileFormatError, match=r"big.csv: line 2: 200\d{3} characters, more "
                                                  r"than the 65536 a CSV line may have"):
            _readers()[reader](path)


def test_csv_errors_on_the_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    path = tmp_path / "big.csv"
    path.write_text(f"size_bytes,time_us\n512,9{'0' * 200_000}\n" + _ROWS)
    for argv in (["calibrate", path, "--topology", "ring:4", "--collective", "allgather",
                  "--ranks", "4", "-o", tmp_path / "cal.json"],
                 ["calibrate", path, "--model", "program", "--topology",
                  "ring:4,unit_gbps=50,alpha_us=1", "-o", tmp_path / "rt.json"]):
        code, _, err = _cli(capsys, *argv)
        assert code == cli.EXIT_ERROR
        _one_line_error(err, "big.csv: line 2")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big.csv"]


# -- encodings ------------------------------------------------------------------------------------


@pytest.mark.parametrize("reader", ["read_curve", "load_log"])
def test_a_utf8_bom_is_skipped_and_utf16_refused(tmp_path: Path, reader: str):
    plain = tmp_path / "plain.csv"
    plain.write_text("size_bytes,time_us\n" + _ROWS)
    bom = tmp_path / "bom.csv"
    bom.write_bytes(b"\xef\xbb\xbf" + plain.read_bytes())
    read = _readers()[reader]
    first, second = read(plain), read(bom)
    rows = (lambda log: log) if reader == "read_curve" else \
        (lambda log: [(r.size_bytes, r.time_us) for r in log.rows])
    assert rows(second) == rows(first)
    assert rows(first)[0] == (1024, 10 + 1024 / 1e4)  # the file's first row, as written
    for encoding, name in (("utf-16", "UTF-16"), ("utf-32", "UTF-32")):
        wide = tmp_path / f"{encoding}.csv"
        wide.write_bytes(plain.read_text().encode(encoding))
        with pytest.raises(FileFormatError, match=rf"{name} text .*iconv -f {name} -t UTF-8"):
            read(wide)


def test_a_json_file_with_a_utf8_bom_is_read(tmp_path: Path, algo: Path):
    bom = tmp_path / "bom.json"
    bom.write_bytes(b"\xef\xbb\xbf" + algo.read_bytes())
    assert load_algorithm(bom).num_steps == 2
    bad = tmp_path / "bad.json"
    bad.write_bytes(b"\xef\xbb\xbf{\"a\": \xff}")
    with pytest.raises(FileFormatError, match="not UTF-8 text .* at byte 9"):
        load_algorithm(bad)  # the byte counted in the file, byte-order mark included


# -- values accepted silently ---------------------------------------------------------------------


def test_calibrate_refuses_an_unknown_collective(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]):
    from collsynth.timing.logs import load_log

    path = tmp_path / "curve.csv"
    path.write_text("size_bytes,time_us\n" + _ROWS)
    code, _, err = _cli(capsys, "calibrate", path, "--topology", "ring:4", "--collective",
                        "frobnicate", "--ranks", "4", "-o", tmp_path / "cal.json")
    assert code == cli.EXIT_USAGE
    _one_line_error(err, "unknown collective 'frobnicate'", "allgather", "reduce_scatter")
    assert not (tmp_path / "cal.json").exists()
    code, _, err = _cli(capsys, "calibrate", path, "--topology", "ring:4", "--collective",
                        "All-Gather", "--ranks", "4", "-o", tmp_path / "cal.json")
    assert code == cli.EXIT_OK, err  # any spelling of a measured collective
    with pytest.raises(UnknownNameError, match="unknown collective 'frobnicate'"):
        load_log(path, collective="frobnicate", ranks=4)
    named = tmp_path / "named.csv"
    named.write_text("size_bytes,time_us,collective\n1024,10,frob\n2048,11,frob\n")
    with pytest.raises(FileFormatError, match="named.csv: collective 'frob': not one a "
                                              "benchmark log measures"):
        load_log(named, ranks=4)


@pytest.mark.parametrize("name", ["ring:8,unit_gbps=50,unit_gbps=60",
                                  "ring:8,alpha_us=1,alpha_us=1",
                                  "torus:3x3,unit_gbps=1,alpha_us=1,Unit-Gbps=2",
                                  "dgx1,alpha_us=1,alpha_us=2"])
def test_a_figure_given_twice_is_refused(name: str):
    from collsynth.resolve import resolve_topology

    with pytest.raises(InvalidTopologyError, match="given twice"):
        resolve_topology(name)


def test_a_figure_in_the_name_and_as_an_option_is_refused(capsys: pytest.CaptureFixture[str]):
    code, _, err = _cli(capsys, "bounds", "ring:8,unit_gbps=50", "allgather", "--unit-gbps",
                        "60")
    assert code == cli.EXIT_ERROR
    _one_line_error(err, "unit_gbps given twice")
    code, _, err = _cli(capsys, "bounds", "ring:8,unit_gbps=50", "allgather", "--alpha-us", "1")
    assert code == cli.EXIT_OK, err  # different figures


@pytest.mark.parametrize("figure", ["unit_gbps=1e300", "unit_gbps=1e-9", "alpha_us=1e30"])
def test_figures_out_of_range_are_refused(figure: str):
    from collsynth.resolve import resolve_topology

    with pytest.raises(InvalidTopologyError, match="expected a finite positive number from"):
        resolve_topology(f"ring:8,{figure}")


@pytest.mark.parametrize("value", ["garbage", "1K", "0", "-5", "99999999TB"])
def test_a_memory_limit_variable_that_cannot_be_read_is_a_usage_error(
        value: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]):
    monkeypatch.setenv("COLLSYNTH_MEMORY_LIMIT", value)
    code, out, err = _cli(capsys, "bounds", "ring:4", "allgather")
    assert code == cli.EXIT_USAGE and out == ""
    _one_line_error(err, f"COLLSYNTH_MEMORY_LIMIT={value!r}")
    code, _, err = _cli(capsys, "--memory-limit", "4GiB", "bounds", "ring:4", "allgather")
    assert code == cli.EXIT_OK, err  # the flag is given: the variable is not read


def test_the_memory_limit_variable_is_applied_as_the_flag_is(monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]):
    import collsynth.limits as limits

    applied = []
    real = limits.memory_ceiling

    def spy(limit_bytes):
        applied.append(limit_bytes)
        return real(limit_bytes)

    monkeypatch.setattr(limits, "memory_ceiling", spy)
    monkeypatch.setenv("COLLSYNTH_MEMORY_LIMIT", "3GiB")
    assert _cli(capsys, "bounds", "ring:4", "allgather")[0] == cli.EXIT_OK
    monkeypatch.delenv("COLLSYNTH_MEMORY_LIMIT")
    assert _cli(capsys, "bounds", "ring:4", "allgather")[0] == cli.EXIT_OK
    assert applied == [3 << 30, None]


# -- output left behind by a failed command -------------------------------------------------------


def test_export_tune_failures_leave_no_folder(tmp_path: Path, algo: Path,
                                             capsys: pytest.CaptureFixture[str]):
    nan = tmp_path / "nan.json"
    nan.write_text('{"format": "collsynth-runtime-constants", "channels": NaN}')
    bare = tmp_path / "bare.json"
    save_algorithm(_algorithm(unit_gbps=None), bare)
    out = tmp_path / "x"
    code, _, err = _cli(capsys, "export", algo, "--tune", "-o", out, "--runtime-constants", nan)
    assert code == cli.EXIT_ERROR and not out.exists()
    _one_line_error(err, "nan.json")
    code, _, err = _cli(capsys, "export", bare, "--tune", "-o", out)
    assert code == cli.EXIT_ERROR and not out.exists()
    # The message names what works for export (which has no --unit-gbps option).
    _one_line_error(err, "bare.json", "has no unit_gbps", "unit_gbps=GBPS")
    assert "--unit-gbps" not in err


def test_a_failure_while_writing_a_folder_leaves_none(tmp_path: Path, algo: Path,
                                                      monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]):
    import collsynth._output as output

    real, calls = output.write_text_atomic, []

    def second_fails(path, text, **kwargs):
        calls.append(path)
        if len(calls) == 2:
            raise OutputPathError(f"{path}: refused by the test")
        return real(path, text, **kwargs)

    monkeypatch.setattr(output, "write_text_atomic", second_fails)
    code, _, err = _cli(capsys, "export", algo, "--tune", "-o", tmp_path / "x", "--sizes",
                        "1KiB,64MiB")
    assert code == cli.EXIT_ERROR and "refused by the test" in err and len(calls) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["two_step.json"]  # no x, no staging


def test_export_all_runtimes_into_a_folder_is_all_or_nothing(tmp_path: Path, algo: Path,
                                                             monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]):
    import collsynth._output as output

    out = tmp_path / "xml"
    out.mkdir()
    (out / "mine.txt").write_text("kept")
    before = _tree(out)
    real, renamed = os.replace, []

    def third_fails(src, dst):
        renamed.append(dst)
        if len(renamed) == 3:
            raise OSError(28, "No space left on device")
        return real(src, dst)

    monkeypatch.setattr(output.os, "replace", third_fails)
    try:
        code, _, err = _cli(capsys, "export", algo, "--runtime", "all", "-o", f"{out}/")
    finally:
        monkeypatch.setattr(output.os, "replace", real)
    assert code == cli.EXIT_ERROR and "No space left" in err and len(renamed) == 3
    assert _tree(out) == before  # two files were written (staged), none appeared
    new = tmp_path / "new"
    code, _, err = _cli(capsys, "export", algo, "--runtime", "all", "-o", f"{new}/")
    assert code == cli.EXIT_OK, err
    assert sorted(p.name for p in new.iterdir()) == [
        "two_step.msccl-executor.xml", "two_step.msccl.xml", "two_step.rccl.xml"]


def test_solve_that_finds_nothing_creates_no_folder(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]):
    code, _, _ = _cli(capsys, "solve", "instance", "ring:4", "allgather", "--steps", "1",
                      "-o", f"{tmp_path / 'algos'}/", "--xml", tmp_path / "xml", "-q")
    assert code == cli.EXIT_UNSATISFIABLE
    assert list(tmp_path.iterdir()) == []
    code, _, err = _cli(capsys, "solve", "instance", "ring:4", "allgather", "--steps", "3",
                        "-o", f"{tmp_path / 'algos'}/", "--xml", tmp_path / "xml", "-q")
    assert code == cli.EXIT_OK, err
    assert [p.suffix for p in (tmp_path / "algos").iterdir()] == [".json"]
    assert len(list((tmp_path / "xml").iterdir())) == 1


def _bench(capsys, algo: Path, out: Path, *extra: object) -> tuple[int, str, str]:
    return _cli(capsys, "bench", algo, "--ranks", 4, "--runtime", "rccl", "--sizes",
                "1KiB:8KiB", "-o", out, *extra)


def test_bench_from_logs_that_fail_writes_nothing(tmp_path: Path, algo: Path,
                                                  capsys: pytest.CaptureFixture[str]):
    out = tmp_path / "b"
    code, _, err = _bench(capsys, algo, out, "--from-logs")
    assert code == cli.EXIT_ERROR and "no such file" in err
    assert not out.exists()  # before: the whole folder was written, then the logs were missing
    (out / "logs").mkdir(parents=True)
    (out / "logs" / "default.txt").write_text("not a log\n")
    (out / "notes.md").write_text("mine")
    before = _tree(out)
    code, _, err = _bench(capsys, algo, out, "--from-logs")
    assert code == cli.EXIT_ERROR
    assert _tree(out) == before


def test_bench_from_logs_writes_the_folder_on_success(tmp_path: Path, algo: Path,
                                                      capsys: pytest.CaptureFixture[str]):
    out = tmp_path / "b"
    (out / "logs").mkdir(parents=True)
    for label in ("default", "xml"):
        (out / "logs" / f"{label}.txt").write_bytes(
            (BENCH_LOGS / f"rccl_all_gather_{label}.txt").read_bytes())
    (out / "notes.md").write_text("mine")
    code, text, err = _bench(capsys, algo, out, "--from-logs")
    assert code == cli.EXIT_OK, err
    assert (out / "notes.md").read_text() == "mine"  # files bench does not write are kept
    assert {"report.md", "bench.json", "run_xml.sh", "calibration.json"} <= {
        p.name for p in out.iterdir()}
    assert not [p for p in out.iterdir() if p.name.startswith(".")]
    assert os.access(out / "run_xml.sh", os.X_OK)
    assert json.loads((out / "bench.json").read_text())["measured"] is True


# -- the output helpers themselves ----------------------------------------------------------------


def test_staged_folder_into_an_existing_folder(tmp_path: Path):
    from collsynth._output import staged_folder, write_text_atomic

    out = tmp_path / "out"
    (out / "sub").mkdir(parents=True)
    (out / "old.txt").write_text("old")
    (out / "old.txt").chmod(0o640)
    (out / "keep.txt").write_text("keep")
    with staged_folder(out) as staging:
        assert staging.parent == out and staging.name.startswith(".")
        write_text_atomic(staging / "old.txt", "new")
        (staging / "sub").mkdir()
        write_text_atomic(staging / "sub" / "a.txt", "a")
        assert not (out / "sub" / "a.txt").exists()  # nothing visible before the end
    assert (out / "old.txt").read_text() == "new"
    assert stat.S_IMODE((out / "old.txt").stat().st_mode) == 0o640  # the old file's mode
    assert (out / "keep.txt").read_text() == "keep" and (out / "sub" / "a.txt").exists()
    assert sorted(p.name for p in out.iterdir()) == ["keep.txt", "old.txt", "sub"]


@needs_fifo
def test_staged_folder_refuses_before_moving_anything(tmp_path: Path):
    from collsynth._output import staged_folder, write_text_atomic

    out = tmp_path / "out"
    out.mkdir()
    os.mkfifo(out / "b.txt")
    with pytest.raises(OutputPathError, match="b.txt: is a FIFO"):
        with staged_folder(out) as staging:
            write_text_atomic(staging / "a.txt", "a")
            write_text_atomic(staging / "b.txt", "b")
    assert sorted(p.name for p in out.iterdir()) == ["b.txt"]  # a.txt not moved either


def test_staged_folder_new_and_failed(tmp_path: Path):
    from collsynth._output import staged_folder, write_text_atomic

    out = tmp_path / "new"
    with pytest.raises(RuntimeError):
        with staged_folder(out) as staging:
            write_text_atomic(staging / "a.txt", "a")
            raise RuntimeError("failed")
    assert list(tmp_path.iterdir()) == []
    with staged_folder(out) as staging:
        write_text_atomic(staging / "a.txt", "a")
    assert [p.name for p in tmp_path.iterdir()] == ["new"]
    assert stat.S_IMODE(out.stat().st_mode) == 0o777 & ~_umask()  # mkdir's, not mkdtemp's
    with pytest.raises(OutputPathError, match="does not exist"):
        with staged_folder(tmp_path / "missing" / "deeper"):
            pass


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def test_write_all_atomic_writes_none_when_one_target_is_refused(tmp_path: Path):
    from collsynth._output import write_all_atomic

    (tmp_path / "folder.xml").mkdir()
    with pytest.raises(OutputPathError, match="folder.xml: is a folder"):
        write_all_atomic({tmp_path / "a.xml": "a", tmp_path / "folder.xml": "b"})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["folder.xml"]


# -- check without --runtime ----------------------------------------------------------------------


def test_check_takes_a_tuned_msccl_file_for_msccl(tmp_path: Path, algo: Path,
                                                  capsys: pytest.CaptureFixture[str]):
    out = tmp_path / "tuned"
    code, _, err = _cli(capsys, "export", algo, "--tune", "--runtime", "msccl", "-o", out,
                        "--sizes", "1KiB,64MiB")
    assert code == cli.EXIT_OK, err
    files = sorted(out.iterdir())
    assert files and all('maxBytes="' in p.read_text() for p in files)
    for path in files:
        code, text, err = _cli(capsys, "check", path)
        assert code == cli.EXIT_OK, text + err
        assert "correct allgather for msccl" in text


def test_check_tries_the_other_runtimes_when_the_guess_fails(
        tmp_path: Path, algo: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]):
    import collsynth.cli.check as check

    path = tmp_path / "a.xml"
    assert _cli(capsys, "export", algo, "--runtime", "msccl", "-o", path)[0] == cli.EXIT_OK
    monkeypatch.setattr(check, "infer_runtime", lambda text: ("rccl", "a wrong guess"))
    code, text, err = _cli(capsys, "check", path)
    assert code == cli.EXIT_OK, text + err
    assert "correct allgather for msccl" in text and "fails rccl's rules" in text
    # A program correct for no runtime is reported with the guess's problems, exit 1.
    path.write_text(path.read_text().replace('coll="allgather"', 'coll="allreduce"'))
    code, text, err = _cli(capsys, "check", path)
    assert code == cli.EXIT_ERROR and "problems for rccl" in err
    assert "not correct for msccl" in err


# -- a held-out corpus of the same classes ---------------------------------------------------------
# Built after the fixes, from other commands, options, devices, parameters, variables and folder
# outputs than the cases above; 32 of these 41 failed on the code before the fixes (16 hung).

_T4, _F4 = "ring:4,unit_gbps=50,alpha_us=1", "fully-connected:4,unit_gbps=50,alpha_us=1"
_HELD_OUT = [
    (["run", "fifo.json", "--ranks", "4"], {}, 1),
    (["draw", "fifo.xml", "--topology", "ring:4", "-o", "x.png"], {}, 1),
    (["draw", "adir", "-o", "x.png"], {}, 1),
    (["plot", "fifo.json", "-o", "p.png"], {}, 1),
    (["time", "ag.json", "fifo.json"], {}, 1),
    (["time", "ag.json", "--topology", _T4, "--calibration", "/dev/zero"], {}, 1),
    (["time", "ag.json", "--topology", "./fifo"], {}, 1),
    (["plan", "tr2", "--topology", _F4, "-o", "pl", "--no-cache"], {}, 1),
    (["plan", "trfifo", "--topology", _F4, "-o", "pl", "--no-cache"], {}, 1),
    (["plan", str(TRACE), "--topology", "fifo.json", "-o", "pl", "--no-cache"], {}, 1),
    (["plan", str(TRACE), "--topology", _F4, "--calibration", "fifo.json", "-o", "pl",
      "--no-cache"], {}, 1),
    (["trace", "summarize", "tr2"], {}, 1),
    (["solve", "instance", "fifo.json", "allgather", "--steps", "2"], {}, 1),
    (["solve", "instance", "ring:4", "./fifo.json", "--steps", "2"], {}, 1),
    (["bounds", "ring:4", "link.json"], {}, 1),
    (["bounds", "./fifo", "allgather"], {}, 1),
    (["check", "/dev/null"], {}, 1),
    (["verify", "link.json"], {}, 1),
    (["calibrate", "curve.csv", "fifo.txt", "--topology", "ring:4", "--collective",
      "allgather", "--ranks", "4", "-o", "cal.json"], {}, 1),
    (["calibrate", "curve.csv", "--model", "program", "--topology", "fifo.xml", "-o", "rt.json"],
     {}, 1),
    (["calibrate", "adir", "--model", "program", "--topology", _T4, "-o", "rt.json"], {}, 1),
    (["bench", "ag.json", "--ranks", "4", "--runtime", "rccl", "-o", "b", "--from-logs"], {},
     1),
    (["bench", "fifo.json", "--ranks", "4", "--runtime", "rccl", "--dry-run"], {}, 1),
    (["bounds", "hub:8,alpha_us=1,ALPHA_US=2", "allgather"], {}, 1),
    (["bounds", "mesh:2x3,unit_gbps=1,unit-gbps=2", "allgather"], {}, 1),
    (["bounds", "dgx-a100,unit_gbps=25,unit_gbps=25", "allgather"], {}, 1),
    (["bounds", "hypercube:3,alpha_us=1", "allgather", "--alpha-us", "2"], {}, 1),
    (["plan", str(TRACE), "--topology", _F4, "--alpha-us", "2", "-o", "pl", "--no-cache"], {},
     1),
    (["time", "ag.json", "--topology", "ring:4,unit_gbps=1e7,alpha_us=1"], {}, 1),
    (["bounds", "ring:4", "allgather"], {"COLLSYNTH_MEMORY_LIMIT": "8 gigs"}, 2),
    (["bounds", "ring:4", "allgather"], {"COLLSYNTH_MEMORY_LIMIT": "1.5GiB,2"}, 2),
    (["calibrate", "curve.csv", "--topology", "ring:4", "--collective", "pairs", "--ranks",
      "4", "-o", "cal.json"], {}, 2),
    (["calibrate", "curve.csv", "--topology", "ring:4", "--collective", "", "--ranks", "4",
      "-o", "cal.json"], {}, 2),
    (["export", "nofig.json", "--tune", "-o", "t1"], {}, 1),
    (["export", "ag.json", "--tune", "-o", "t2", "--runtime-constants", "adir"], {}, 1),
    (["export", "ag.json", "--runtime", "all", "-o", "outfifo/"], {}, 1),
    (["solve", "instance", "ring:4", "allgather", "--steps", "1", "-o", "s1/", "--xml", "s2"],
     {}, 3),
    (["solve", "least-steps", "ring:4", "allgather", "--max-steps", "1", "-o", "s3/"], {}, 3),
    (["bench", "ag.json", "--ranks", "4", "--runtime", "rccl", "-o", "stray", "--dry-run"], {},
     1),
    (["bench", "ag.json", "--ranks", "4", "--runtime", "rccl", "-o", "nb"], {"PATH": ""}, 1),
    (["calibrate", "curve.csv", "--topology", "ring:4", "--collective", "allgather",
      "--ranks", "4", "-o", "cal.json", "--plot", "missing/x.png"], {}, 1),
]


def _held_out_folder(d: Path) -> None:
    save_algorithm(_algorithm(), d / "ag.json")
    save_algorithm(_algorithm(unit_gbps=None), d / "nofig.json")
    (d / "curve.csv").write_text("size_bytes,time_us\n" + _ROWS)
    for name in ("fifo.json", "fifo.xml", "fifo", "fifo.txt", "trfifo"):
        os.mkfifo(d / name)
    (d / "link.json").symlink_to(d / "fifo.json")
    (d / "adir").mkdir()
    (d / "tr2").mkdir()
    for path in TRACE.iterdir():
        if path.name == "rank-00001.jsonl":
            (d / "tr2" / path.name).mkdir()
        else:
            (d / "tr2" / path.name).write_bytes(path.read_bytes())
    (d / "b" / "logs").mkdir(parents=True)
    os.mkfifo(d / "b" / "logs" / "default.txt")
    (d / "stray" / "xml").mkdir(parents=True)
    (d / "stray" / "xml" / "other.xml").write_text("<algo/>")
    (d / "outfifo").mkdir()
    os.mkfifo(d / "outfifo" / "ag.rccl.xml")


@needs_fifo
@pytest.mark.parametrize("argv, env, code", _HELD_OUT,
                         ids=[" ".join(a)[:60] + (f" {e}" if e else "") for a, e, _ in _HELD_OUT])
def test_held_out(argv, env, code, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                  capsys: pytest.CaptureFixture[str]):
    _held_out_folder(tmp_path)
    monkeypatch.chdir(tmp_path)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    before = sorted((str(p.relative_to(tmp_path)), p.is_dir()) for p in tmp_path.rglob("*"))
    fifos = tuple(p for p in tmp_path.rglob("*") if p.is_fifo())
    got, out, err = _cli(capsys, *argv, release=fifos)
    assert got == code, out + err
    if code in (cli.EXIT_ERROR, cli.EXIT_USAGE):
        _one_line_error(err)
        assert "internal error" not in err
    after = sorted((str(p.relative_to(tmp_path)), p.is_dir()) for p in tmp_path.rglob("*"))
    assert after == before  # nothing written, nothing deleted
