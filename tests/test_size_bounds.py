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
from fractions import Fraction
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


#: CI's 2 cores run two test workers and more: a limit stated for an idle machine is stretched
#: this many times. The hangs these limits guard took 100 s or forever, so they still fail.
LOAD_FACTOR = 3


@contextlib.contextmanager
def within(seconds: float):
    """Raise TimeoutError in the block after ``seconds`` x :data:`LOAD_FACTOR` (POSIX; no limit
    elsewhere)."""
    if not hasattr(signal, "setitimer"):
        yield
        return
    seconds *= LOAD_FACTOR

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
    ("nvls_efficiency", 0.1, "nvls_efficiency = 0.1; expected a number from 0.3 to 1"),
    ("nvls_efficiency", 1.5, "nvls_efficiency = 1.5"),
    ("nvls_channel_gbps", 1e-300, "nvls_channel_gbps = 1e-300"),
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
    ("nvls_efficiency", 0.3), ("nvls_efficiency", 1.0),
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


# -- XML: one bounded reader and the checker's rules for every consumer ------------------------


def _ring_allgather_xml() -> str:
    """The runtime's ring as an msccl program (without rccl's range attributes)."""
    import dataclasses

    from collsynth.export.xml_writer import write_program
    from collsynth.timing.runtime_baselines import ring_program

    ring = ring_program("allgather", [(0, 1, 2, 3)])
    return write_program(dataclasses.replace(ring, outofplace=None, min_bytes=None), "msccl")


def _hostile_xml(kind: str) -> bytes:
    """A 4-rank ring allgather that `collsynth check` accepts, spoilt one way."""
    text = _ring_allgather_xml()
    if kind == "cnt-1e9":       # reads i[0..1e9) of a 1-chunk buffer
        first = text.index('cnt="1"')
        return (text[:first] + 'cnt="1000000000"' + text[first + len('cnt="1"'):]).encode()
    if kind == "wrong-coll":    # an allgather program that says alltoall
        return text.replace('coll="allgather"', 'coll="alltoall"').encode()
    if kind == "nchannels-1e5":
        return text.replace('nchannels="1"', 'nchannels="100000"').encode()
    if kind == "utf-16":
        return text.encode("utf-16")
    if kind == "ngpus-1e5":
        return text.replace('ngpus="4"', 'ngpus="100000"').encode()
    if kind == "2000-gpus":     # 2000 <gpu> elements for ngpus=4
        gpu = '  <gpu id="0" i_chunks="1" o_chunks="4" s_chunks="0"/>\n'
        return text.replace("</algo>", gpu * 2000 + "</algo>").encode()
    raise AssertionError(kind)


HOSTILE_XML = {
    "cnt-1e9": "cnt=1000000000 is outside 0..71",
    "wrong-coll": "alltoall",
    "nchannels-1e5": "nchannels=100000 is outside 1..32",
    "utf-16": "UTF-16 text (it starts with a UTF-16 byte-order mark); collsynth reads UTF-8",
    "ngpus-1e5": "ngpus=100000: more than the 1024 ranks",
    "2000-gpus": "2004 <gpu> elements; the reader keeps at most 1024",   # 4 + 2000
}


def test_the_programs_spoilt_here_are_correct_before_they_are_spoilt(tmp_path, capsys):
    path = tmp_path / "ring.xml"
    path.write_text(_ring_allgather_xml())
    code, out, _ = run_cli(["check", str(path)], capsys)
    assert code == 0 and "correct allgather" in out


@pytest.mark.parametrize("kind", sorted(HOSTILE_XML))
@pytest.mark.parametrize("command", ["time", "draw", "bench", "check"])
def test_every_xml_consumer_refuses_what_check_refuses(tmp_path, capsys, kind, command):
    """`time FILE.xml` priced programs `check` refuses (a cnt of 10^9, a wrong coll, 100000
    channels, UTF-16...): every consumer now reads XML through one function, load_program."""
    path = tmp_path / "p.xml"
    path.write_bytes(_hostile_xml(kind))
    out_path = tmp_path / "out"
    argv = {"time": ["time", str(path), "--topology", "ring:4,unit_gbps=50"],
            "draw": ["draw", str(path), "--topology", "ring:4", "-o", f"{out_path}.svg"],
            "bench": ["bench", str(path), "--ranks", "4", "--runtime", "msccl", "--dry-run",
                      "-o", str(out_path)],
            "check": ["check", str(path)]}[command]
    code, out, err = run_cli(argv, capsys)
    assert code == EXIT_ERROR
    assert not list(tmp_path.glob("out*"))
    if command == "check":   # the checker lists every problem, one per line
        assert HOSTILE_XML[kind] in out + err and "Traceback" not in err
    else:
        assert HOSTILE_XML[kind] in one_error_line(err) and out == ""


def test_run_reads_xml_through_the_same_reader(tmp_path, monkeypatch):
    from collsynth.cli import execute

    path = tmp_path / "p.xml"
    path.write_bytes(_hostile_xml("cnt-1e9"))
    with pytest.raises(FileFormatError, match="cnt=1000000000 is outside 0..71"):
        execute._load(str(path), None)


def test_no_module_parses_msccl_xml_but_the_reader():
    """One way in: outside collsynth/export/xml_reader.py, no library module calls the IR
    builder (read_program) or lxml; consumers call load_program, the checker read_checked."""
    import re

    root = Path(__file__).resolve().parents[1] / "collsynth"
    allowed = {root / "export" / "xml_reader.py", root / "export" / "__init__.py",
               root / "topology" / "importers" / "nccl_xml.py"}   # NCCL's topology XML
    offenders = []
    for path in root.rglob("*.py"):
        if path in allowed:
            continue
        text = path.read_text(encoding="utf-8")
        if re.search(r"\bread_program\(|\betree\b|xml\.etree|minidom", text):
            offenders.append(str(path.relative_to(root)))
    assert offenders == []


def test_xml_files_of_too_many_elements_are_refused_before_parsing(tmp_path):
    from collsynth.export.xml_reader import MAX_XML_ELEMENTS, load_program

    path = tmp_path / "many.xml"
    text = _ring_allgather_xml()
    path.write_text(text.replace("</algo>", "<x/>" * MAX_XML_ELEMENTS + "</algo>"))
    with within(3), pytest.raises(InputTooLargeError, match=f"elements is more than the "
                                                            f"{MAX_XML_ELEMENTS}"):
        load_program(path)


def test_the_checker_bounds_its_work_before_executing():
    """1024 ranks of an allreduce with 1024 chunks each and no steps: the postcondition alone
    compares 1024 x 1024 outputs of 1024 contributions (10^9); refused at once."""
    from collsynth.export.check import MAX_CHECKED_CONTRIBUTIONS, check_program
    from collsynth.export.program import GpuProgram, Program

    n = 1024
    gpus = tuple(GpuProgram(r, n, n, 0, ()) for r in range(n))
    program = Program("idle", "Simple", 1, n, n, "allreduce", 0, gpus)
    with within(5), pytest.raises(InputTooLargeError) as caught:
        check_program(program, runtime="msccl")
    assert f"{n * n * n} contributions" in str(caught.value)
    assert str(MAX_CHECKED_CONTRIBUTIONS) in str(caught.value)


# -- family sizes and the bounds on all-pairs topologies ------------------------------------------


@pytest.mark.parametrize("name", ["fully-connected:1025", "hub:1025", "fully-connected:4096"])
def test_all_pairs_families_are_refused_above_the_size_whose_bounds_answer(name):
    from collsynth.topology import get_topology

    with within(2), pytest.raises(InputTooLargeError) as caught:
        get_topology(name)
    assert "every pair of ranks is linked" in str(caught.value)
    assert "up to 1024 ranks" in str(caught.value)


@pytest.mark.parametrize("name, collective, steps, composed", [
    # Hand counts: on a switch every rank receives at most 1 chunk a round, so an allgather
    # needs n - 1 rounds for n - 1 chunks (1 per chunk) and an allreduce, as reduce-scatter
    # then allgather, 2 (n - 1) / n; one hop joins any two ranks (a step, or one per half).
    ("fully-connected:512", "allgather", 1, None),
    ("hub:192", "allreduce", 1, Fraction(2 * 191, 192)),
    ("hub:512", "broadcast", 1, None),
])
def test_bounds_on_large_all_pairs_topologies_answer_quickly(name, collective, steps, composed):
    """fully-connected:512 allgather took 41 s (rank orbits tested 2n permutations against n**2
    links each, hop counts ran dijkstra from every rank); hub:192 allreduce and hub:512
    broadcast measured one maximum flow per rank in pure Python (minutes)."""
    from collsynth.bounds import compute_bounds
    from collsynth.collective import standard_collective
    from collsynth.topology import get_topology

    topology = get_topology(name)
    with bounded(8, 2 << 30):
        bounds = compute_bounds(topology, standard_collective(collective, topology.num_ranks))
    assert bounds.steps == steps
    if composed is not None:
        assert bounds.composed_rounds_per_chunk == composed and bounds.composed_steps == 2
    else:
        assert bounds.rounds_per_chunk == 1   # (n - 1) chunks over n - 1 (or 1 of n - 1) links


# -- time limits at 8192 ranks ---------------------------------------------------------------------


def test_the_node_symmetry_check_stops_at_its_deadline():
    import time

    from collsynth.graph.translations import node_translations
    from collsynth.limits import TimeLimitReached
    from collsynth.resolve import resolve_topology

    topology = resolve_topology("dgx-a100", nodes=4)
    assert node_translations(topology) is not None
    with pytest.raises(TimeLimitReached, match="checking the symmetries of"):
        node_translations(topology, deadline=time.perf_counter() - 1)


def test_tree_packing_stops_before_any_packing_at_its_deadline():
    from collsynth.limits import TimeLimitReached
    from collsynth.resolve import resolve_topology
    from collsynth.synthesis.bandwidth_optimal.packing import PackingOptions, pack_trees

    topology = resolve_topology("dgx-a100", nodes=2)
    with pytest.raises(TimeLimitReached, match="before any tree packing was found"):
        pack_trees(topology, list(range(16)), options=PackingOptions(time_limit=0.0))


def test_the_exact_engine_refuses_8192_ranks_before_looking_for_symmetries():
    """It looked for an automorphism of 8192 ranks (2n candidates of n**2 links each) for
    minutes before the encoding's size check refused it."""
    from collsynth.collective import standard_collective
    from collsynth.resolve import resolve_topology
    from collsynth.synthesis.large import solve_large

    topology = resolve_topology("dgx-a100", nodes=1024)
    with bounded(5, 2 << 30), pytest.raises(InputTooLargeError) as caught:
        solve_large(topology, standard_collective("allgather", 8192), engine="exact",
                    time_limit=10)
    # 8192 chunks x 8192 ranks x 1 step (every rank has a link in), counted by hand.
    assert f"at least {8192 * 8192} send variables" in str(caught.value)


def test_solve_bandwidth_optimal_at_8192_ranks_stops_at_its_time_limit(capsys):
    """No answer in 100 s with --time-limit 10 (the node symmetry check and the packing's rows
    ignored the deadline); now exit 4 at the limit."""
    import time

    started = time.perf_counter()
    code, out, err = run_cli(["solve", "bandwidth-optimal", "dgx-a100", "allgather", "--nodes",
                              "1024", "--time-limit", "2"], capsys, seconds=30)
    assert code == 4 and "time limit" in err.splitlines()[-1]
    # 10% over, and building the system; stretched like every wall-clock bound here
    assert time.perf_counter() - started < (2 * 1.1 + 3) * LOAD_FACTOR


# -- a held-out corpus: other counts in other files and flags -------------------------------------


def test_a_pareto_sweep_refuses_more_chunks_than_a_collective_may_have():
    """--max-chunks 1000000000 never answered (its --time-limit 5 unheard): every chunk count
    was walked, and each look at earlier refutations walked every multiple up to the limit."""
    from collsynth.collective import allgather
    from collsynth.synthesis import SolveOptions, pareto_front
    from collsynth.topology import get_topology

    ring4 = get_topology("ring:4")
    with bounded(3), pytest.raises(InputTooLargeError, match="max_chunks = 1000000000: "
                                                              "allgather.n=4. split"):
        list(pareto_front(ring4, allgather(4), max_chunks=10**9))
    with bounded(10):   # the most it allows answers as the default does: (2 steps, 3/2)
        front = list(pareto_front(ring4, allgather(4), max_chunks=(1 << 22) // 4,
                                  options=SolveOptions(time_limit=5)))
    assert [(p.instance.steps, p.rounds_per_chunk) for p in front] == [(2, Fraction(3, 2))]


def test_the_sizes_of_one_command_are_bounded(tmp_path, capsys):
    program = tmp_path / "ring.xml"
    program.write_text(_ring_allgather_xml())
    sizes = ",".join(str(s) for s in range(1, 20001))   # 20000 took 38 s to price
    code, out, err = run_cli(["time", str(program), "--topology", "ring:4,unit_gbps=50",
                              "--sizes", sizes], capsys)
    assert code == EXIT_USAGE and out == "" and "20000 sizes: at most 256" in err


def test_a_trace_claiming_a_million_ranks_gives_a_short_summary(tmp_path, capsys):
    """The summary line listed every missing rank: 8 MB for a header claiming 2^20 ranks."""
    source = Path(__file__).resolve().parent / "fixtures" / "traces" / "fc4-mixed"
    lines = (source / "rank-00000.jsonl").read_text().splitlines()
    header = json.loads(lines[0])
    header["world_size"] = 1 << 20
    (tmp_path / "rank-00000.jsonl").write_text("\n".join([json.dumps(header)] + lines[1:]) + "\n")
    code, out, _ = run_cli(["trace", "summarize", str(tmp_path)], capsys)
    first = out.splitlines()[0]
    assert code == 0 and len(first) < 400
    assert first.endswith(f"missing ranks: {', '.join(map(str, range(1, 17)))} and "
                          f"{(1 << 20) - 1 - 16} more")


def test_a_program_too_large_to_check_is_refused_by_name(tmp_path, capsys):
    text = _ring_allgather_xml().replace('s_chunks="0"', 's_chunks="1000000000"', 1)
    path = tmp_path / "big.xml"
    path.write_text(text)
    code, out, err = run_cli(["time", str(path), "--topology", "ring:4,unit_gbps=50"], capsys)
    line = one_error_line(err)
    assert code == EXIT_ERROR and f"{path}: " in line and "the checker executes at most" in line
