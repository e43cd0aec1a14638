"""Counts that size work are bounded, and every field of the runtime-constants file is read
within a plausible range (issue 19: "hangs from sizes", "runtime-constants files are trusted").

Each hostile figure below used to hang (a minute or more, or for ever) or be priced into
nonsense; each must now be refused at once with a one-line message naming the figure and the
limit, or answer at once. Every case runs under a few-second alarm, so a hang fails the test
instead of stalling the suite.
"""

from __future__ import annotations

import contextlib
import json
import signal
from pathlib import Path

import pytest

from collsynth.cli import EXIT_ERROR, EXIT_USAGE, main
from collsynth.errors import CollsynthError, FileFormatError, InputTooLargeError
from collsynth.runtimes import get_runtime
from collsynth.timing.calibration import (RuntimeCalibration, calibration_to_json,
                                          load_calibration)


def runtime_constants_to_json(constants):
    """A runtime-constants calibration file's content (version 2 of the one format)."""
    return calibration_to_json(RuntimeCalibration(constants))


def load_runtime_constants(path):
    return load_calibration(path).constants


@contextlib.contextmanager
def within(seconds: float):
    """Raise TimeoutError in the block after ``seconds`` (POSIX; no limit elsewhere)."""
    if not hasattr(signal, "setitimer"):
        yield
        return

    def expire(signum: int, frame: object) -> None:
        raise TimeoutError(f"took more than {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@contextlib.contextmanager
def bounded(seconds: float, memory_bytes: int = 1 << 30):
    """:func:`within` ``seconds``, with the process's data segment capped ``memory_bytes`` above
    its size (a request that once built a billion sets raises MemoryError on old code rather
    than exhausting the machine)."""
    from collsynth.limits import memory_ceiling

    with memory_ceiling(memory_bytes), within(seconds):
        yield


def run_cli(argv: list[str], capsys, seconds: float = 10) -> tuple[int, str, str]:
    with within(seconds):
        code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def one_error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


# -- runtime-constants files ----------------------------------------------------------------------


def _constants_file(tmp_path: Path, **changes) -> Path:
    data = runtime_constants_to_json(get_runtime("nccl").defaults)
    for key, value in changes.items():
        if "." in key:
            table, link_class, protocol = key.split(".")
            data[table][link_class][protocol] = value
        else:
            data[key] = value
    path = tmp_path / "rt.json"
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize("field, value, fragment", [
    ("channels", 1_000_000_000, "channels = 1000000000; expected a whole number from 1 to 128"),
    ("channels", 129, "from 1 to 128"),
    ("fifo_slots", 10**9, "fifo_slots = 1000000000; expected a whole number from 1 to 1024"),
    ("slot_bytes", {"LL": 65536, "LL128": 614400, "Simple": 2**31},
     "slot_bytes['Simple'] = 2147483648; expected a whole number from 1 to 1073741824"),
    ("chunk_slots", {"LL": 1, "LL128": 1, "Simple": 10**6}, "chunk_slots['Simple'] = 1000000"),
    ("slice_slots", {"LL": 1, "LL128": 1, "Simple": 10**6}, "slice_slots['Simple'] = 1000000"),
    ("ceiling_gbps.intra.Simple", 1e-300, "ceiling_gbps['intra']['Simple'] = 1e-300"),
    ("ceiling_gbps.network.LL", 1e7, "ceiling_gbps['network']['LL'] = 10000000.0"),
    ("hop_latency_us.intra.Simple", 1e-320, "hop_latency_us['intra']['Simple'] = 1e-320"),
    ("hop_latency_us.network.LL", 1e7, "hop_latency_us['network']['LL'] = 10000000.0"),
    ("base_latency_us", {"LL": 1e-310, "LL128": 1.0, "Simple": 1.0},
     "base_latency_us['LL'] = 1e-310"),
    ("gamma_us_per_byte", 1e30, "gamma_us_per_byte = 1e+30"),
    ("default_protocols", [[2**60, "LL"], [None, "Simple"]], "default_protocols[0]"),
    ("default_protocols", [[1, "LL"]] * 100, "at most 64"),
    ("version", 3, "version: 3; this collsynth reads versions 1 and 2"),
    ("version", True, "version: True; this collsynth reads"),
    ("kind", "curves", "kind: 'curves'; expected one of curve, runtime-constants"),
    ("chanels", 4, "unknown field 'chanels'"),
    ("hop_latency_us", {"nvswitch": {"LL": 1.0}}, "hop_latency_us has 'nvswitch'"),
    ("slot_bytes", {"LL": 1, "Smple": 5}, "slot_bytes has 'Smple'"),
    ("runtime", "nccl\x00", "control character"),
    ("source", "x" * 5000, "at most 4096"),
])
def test_runtime_constants_outside_their_range_are_refused(tmp_path, capsys, field, value,
                                                          fragment):
    path = _constants_file(tmp_path, **{field: value})
    with within(5), pytest.raises(FileFormatError) as caught:
        load_runtime_constants(path)
    message = str(caught.value)
    assert fragment in message and str(path) in message and "\n" not in message
    # The command reading it says so in one line, exit 1, at once (it used to hang on
    # channels = 10^9 and price 1e-300 GB/s into a 300-digit time).
    program = tmp_path / "ring.xml"
    from collsynth.export.xml_writer import write_program
    from collsynth.timing.runtime_baselines import ring_program

    program.write_text(write_program(ring_program("allgather", [(0, 1, 2, 3)]), "msccl"))
    code, out, err = run_cli(["time", str(program), "--topology", "ring:4,unit_gbps=50",
                              "--calibration", str(path)], capsys)
    assert code == EXIT_ERROR and out == ""
    assert fragment in one_error_line(err)


@pytest.mark.parametrize("field, value", [
    ("channels", 128), ("fifo_slots", 1024), ("hop_latency_us.intra.Simple", 1e-6),
    ("hop_latency_us.intra.LL", 0), ("hop_latency_us.network.Simple", 1e6),
    ("ceiling_gbps.intra.Simple", 1e-6), ("ceiling_gbps.intra.LL", 1e6),
    ("gamma_us_per_byte", 1e3), ("slot_bytes", {"LL": 1, "LL128": 1, "Simple": 2**30}),
])
def test_runtime_constants_at_the_edge_of_their_range_are_read(tmp_path, field, value):
    path = _constants_file(tmp_path, **{field: value})
    loaded = load_runtime_constants(path)
    assert runtime_constants_to_json(loaded) == json.loads(path.read_text())
    legacy = {"format": "collsynth-runtime-constants", "version": 1,
              **{k: v for k, v in json.loads(path.read_text()).items()
                 if k not in ("format", "version", "kind")}}
    path.write_text(json.dumps(legacy))   # the file of earlier versions reads the same
    assert load_runtime_constants(path) == loaded


def test_a_runtime_constants_file_without_a_version_is_refused(tmp_path):
    data = runtime_constants_to_json(get_runtime("rccl").defaults)
    del data["version"]
    path = tmp_path / "rt.json"
    path.write_text(json.dumps(data))
    with pytest.raises(FileFormatError, match="version: None; this collsynth reads"):
        load_runtime_constants(path)
    legacy = {**data, "format": "collsynth-runtime-constants"}
    del legacy["kind"]
    path.write_text(json.dumps(legacy))
    with pytest.raises(FileFormatError, match="missing field 'version'"):
        load_runtime_constants(path)


# -- channels -------------------------------------------------------------------------------------


def test_runtime_rings_refuse_more_channels_than_any_runtime_has_before_searching():
    from collsynth.timing.runtime_baselines import runtime_rings
    from collsynth.topology import get_topology

    with within(2), pytest.raises(InputTooLargeError, match="channels = 100000: more than the "
                                                            "128 channels"):
        runtime_rings(get_topology("ring:8"), 100_000)
    assert len(runtime_rings(get_topology("ring:4"), 128)) == 128


@pytest.mark.parametrize("command", [
    ["calibrate", "{csv}", "--model", "program", "--topology", "ring:4,unit_gbps=25", "-o",
     "{out}"],
    ["calibrate", "{csv}", "--topology", "ring:4", "-o", "{out}"],
    ["export", "{algo}", "-o", "{out}"],
])
def test_channel_flags_are_bounded_as_usage_errors(tmp_path, capsys, command):
    csv = tmp_path / "curve.csv"
    csv.write_text("size_bytes,time_us\n4096,30\n65536,40\n1048576,100\n16777216,900\n")
    algo = tmp_path / "a.json"
    algo.write_text("{}")
    out = tmp_path / "out.json"
    argv = [a.format(csv=csv, out=out, algo=algo) for a in command] + ["--channels", "100000"]
    code, stdout, err = run_cli(argv, capsys)
    assert code == EXIT_USAGE and stdout == "" and not out.exists()
    assert "100000 channels: more than the 128" in err


def test_ring_programs_beyond_the_simulators_bound_are_refused_before_they_are_built():
    from collsynth.timing.runtime_baselines import ring_program
    from collsynth.timing.runtime_model import MAX_SIMULATED_STEPS

    ring = tuple(range(8192))
    with within(2), pytest.raises(InputTooLargeError) as caught:
        ring_program("allreduce", [ring] * 16)
    # 8192 ranks x 16 channels x (2 * 8192 - 1) steps, counted by hand.
    assert f"{8192 * 16 * (2 * 8192 - 1)} steps" in str(caught.value)
    assert str(MAX_SIMULATED_STEPS) in str(caught.value)


def test_a_measured_curve_of_too_many_rows_is_refused(tmp_path):
    from collsynth.timing.runtime_fit import MAX_CURVE_ROWS, read_curve

    path = tmp_path / "curve.csv"
    path.write_text("size_bytes,time_us\n" + "".join(f"{4096 + i},{30 + i}\n"
                                                      for i in range(MAX_CURVE_ROWS + 1)))
    with within(5), pytest.raises(FileFormatError, match=f"more than {MAX_CURVE_ROWS} measured"):
        read_curve(path)
    path.write_text("size_bytes,time_us\n4096,1e12\n")
    with pytest.raises(FileFormatError, match="line 2: time_us = 1000000000000.0: expected"):
        read_curve(path)


def test_the_fit_keeps_every_trial_within_the_constants_ranges(tmp_path):
    """A curve whose times are below any latency pushes the hop scale toward 0; the fitted
    constants stay within their ranges (they used to leave them, or raise, mid-fit)."""
    from collsynth.timing.runtime_fit import fit_runtime
    from collsynth.topology import get_topology
    from collsynth.topology.builtins import with_figures

    ring4 = with_figures(get_topology("ring:4"), unit_gbps=25.0, alpha_us=1.0)
    rows = [(2**k, 1e-3) for k in range(10, 20)]
    with within(60):
        fit = fit_runtime(rows, ring4, "allgather", runtime="nccl", channels=1)
    assert all(h == 0 or h >= 1e-6 for row in fit.constants.hop_latency_us.values()
               for h in row.values())


# -- collective sizes -----------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["allgather", "alltoall", "reduce_scatter", "allreduce",
                                  "broadcast", "scatter", "gather", "reduce",
                                  "multiroot_broadcast", "multiroot_scatter", "multiroot_gather"])
def test_collective_sizes_are_bounded_before_any_condition_is_built(name):
    from collsynth.collective import standard_collective

    roots = {"roots": [0, 1]} if name.startswith("multiroot") else {}
    with bounded(2), pytest.raises(InputTooLargeError) as caught:
        standard_collective(name, 10**9, **roots)
    assert "1000000000 ranks" in str(caught.value) and "65536" in str(caught.value)


def test_collective_chunk_counts_are_bounded_before_they_are_built():
    from collsynth.collective import allgather, alltoall, from_conditions, multiroot_scatter

    with bounded(4):
        with pytest.raises(InputTooLargeError, match="alltoall of 4096 ranks has 16777216 "
                                                     "chunks, more than the 4194304"):
            alltoall(4096)   # 4096^2 chunks
        with pytest.raises(InputTooLargeError, match="65536 ranks has 6553600 chunks"):
            multiroot_scatter(65536, range(100))
        with pytest.raises(InputTooLargeError, match="10000000000 chunks"):
            from_conditions("x", 4, 10**10)
        assert allgather(65536).num_chunks == 65536   # the largest topology's: accepted
        assert alltoall(256).num_chunks == 256 ** 2
