"""Hostile input for every reader, generated with hypothesis.

Each reader gets a small valid file and hypothesis mutates it the way a careless or hostile user
would: a number of 5000 digits, integers beyond 64 bits, ``NaN``/``Infinity``/``1e999``, NUL and
escape characters in names, lone surrogates, wrong types, nesting thousands deep, lists of 10^5
items, truncation. Whatever the mutation, reading either succeeds or raises a
:class:`~collsynth.errors.CollsynthError` whose one short message names the file; and when reading
fails, the command line reading the same file exits 1 with one line on stderr and writes nothing.
Each example has a 5 s deadline, so a hang or a quadratic blow-up fails too.

The fixed cases (one fixture per case) are in the readers' own tables: tests/test_fileformats.py,
tests/topology/test_importers.py, tests/timing/test_logs.py, tests/trace/test_records.py.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import os
import re
import signal
import tempfile
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable

import pytest
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

from collsynth.algorithm import Algorithm, Send, Step
from collsynth.algorithm.fileformat import algorithm_to_json, load_algorithm
from collsynth.cli import EXIT_ERROR, main
from collsynth.collective import allgather, broadcast
from collsynth.collective.fileformat import collective_to_json, load_collective
from collsynth.errors import CollsynthError
from collsynth.export import lower, write_program
from collsynth.export.xml_reader import read_checked, read_program
from collsynth.resolve import resolve_topology
from collsynth.timing.calibration import load_calibration
from collsynth.timing.logs import load_log
from collsynth.topology import get_topology
from collsynth.topology.fileformat import topology_to_json
from collsynth.trace.records import read_trace

# No shrinking: an example is already one hostile value at one place, and shrinking megabyte
# inputs takes minutes. COLLSYNTH_HOSTILE_EXAMPLES=500 explores further (locally).
SETTINGS = settings(max_examples=int(os.environ.get("COLLSYNTH_HOSTILE_EXAMPLES", "25")), deadline=timedelta(seconds=5), database=None,
                    phases=(Phase.explicit, Phase.generate),
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

#: Longest error message accepted after the file name: one line a person reads, not a dump of
#: the input.
MAX_MESSAGE_CHARS = 600

# -- valid samples, one per reader ------------------------------------------------------------


def _topology() -> dict:
    obj = topology_to_json(get_topology("dgx1"))
    obj["metadata"] = {"source": "hand", "nic": {"count": 8, "gbps": 25.0, "per_gpu": True}}
    return obj


def _bcast() -> Algorithm:
    return Algorithm("bcast", get_topology("ring:3"), broadcast(3, 0),
                     (Step(1, (Send(0, 0, 1), Send(0, 0, 2))),))


def _calibration() -> dict:
    return {"format": "collsynth-calibration", "version": 1, "topology": "dgx1", "entries": [
        {"file": "ar.txt", "collective": "allreduce", "ranks": 8, "model": "alpha-beta",
         "alpha_us": 48.5, "beta_us_per_byte": 1.45e-05, "busbw_gbps": 120.3, "gmae": 0.08},
        {"file": "ar.txt", "collective": "allreduce", "ranks": 8, "model": "piecewise",
         "alpha_us": 48.7, "busbw_gbps": 129.0, "knee_bytes": 16384,
         "saturation_bytes": 134217728, "sigmoid_low_gbps": 0.0175, "sigmoid_high_gbps": 209.1,
         "center_bytes": 57577.0, "steepness": 0.278, "gmae": 0.022, "gmae_rows": 0.023}]}


def _nccl_tests_json() -> dict:
    half = {"time": 16.4, "alg_bw": 0.06, "bus_bw": 0.11, "nwrong": 0}
    return {"version": 2, "args": ["./build/all_reduce_perf", "-b", "8"], "nccl_version": 22703,
            "config": {"nthreads": 1, "ngpus": 4, "devices": [{"rank": 0}]},
            "results": [{"size": size, "count": size // 4, "type": "float", "redop": "sum",
                         "root": "    -1", "out_of_place": dict(half), "in_place": dict(half)}
                        for size in (1024, 2048, 4096)]}


_HEADER = {"type": "header", "format": "collsynth-trace", "version": 1, "rank": 0,
           "world_size": 2, "backend": "gloo", "byte_convention": "nccl-tests",
           "hostname": "node0", "pid": 41, "torch_version": "2.13.0+cpu",
           "started_unix": 1767225600.5, "record_durations": True, "cross_node_only": False,
           "ranks_per_node": None}
_CALL = {"type": "call", "seq": 0, "kind": "allreduce", "function": "all_reduce", "bytes": 4096,
         "dtype": "float32", "op": "sum", "group": [0, 1], "group_size": 2, "root": None,
         "peer": None, "async_op": False, "site": "train.py:42 step", "duration_us": 12.5,
         "cross_node": None, "batch": None, "error": None,
         "raw": {"element_size": 4, "shapes": {"tensor": [1024]}, "numel": {"tensor": 1024},
                 "input_split_sizes": [1, 2]}}

NVIDIA_SMI = """\
\tGPU0\tGPU1\tGPU2\tGPU3\tNIC0\tCPU Affinity\tNUMA Affinity
GPU0\t X \tNV1\tNV1\tNV2\tPXB\t0-19\t0
GPU1\tNV1\t X \tNV2\tNV1\tPXB\t0-19\t0
GPU2\tNV1\tNV2\t X \tNV1\tSYS\t20-39\t1
GPU3\tNV2\tNV1\tNV1\t X \tSYS\t20-39\t1
NIC0\tPXB\tPXB\tSYS\tSYS\t X \t\t

Legend:

  X    = Self
  PXB  = Connection traversing multiple PCIe bridges
  SYS  = Connection traversing PCIe as well as the SMP interconnect
  NV#  = Connection traversing a bonded set of # NVLinks

NIC Legend:

  NIC0: mlx5_0
"""

ROCM_SMI = """\
============================ ROCm System Management Interface ============================
================================ Weight between two GPUs =================================
       GPU0         GPU1         GPU2
GPU0   0            15           15
GPU1   15           0            15
GPU2   15           15           0

================================= Hops between two GPUs ==================================
       GPU0         GPU1         GPU2
GPU0   0            1            1
GPU1   1            0            1
GPU2   1            1            0

=============================== Link Type between two GPUs ===============================
       GPU0         GPU1         GPU2
GPU0   0            XGMI         XGMI
GPU1   XGMI         0            XGMI
GPU2   XGMI         XGMI         0

======================================= Numa Nodes =======================================
GPU[0]          : (Topology) Numa Node: 0
GPU[0]          : (Topology) Numa Affinity: 0
GPU[1]          : (Topology) Numa Node: 0
GPU[1]          : (Topology) Numa Affinity: 0
=================================== End of ROCm SMI Log ===================================
"""

NCCL_XML = """\
<system version="1">
  <cpu numaid="0" affinity="ffff" arch="x86_64" vendor="GenuineIntel" familyid="6" modelid="85">
    <pci busid="0000:01:00.0" class="0x030200" link_speed="16.0 GT/s PCIe" link_width="16">
      <gpu dev="0" sm="80" rank="0" gdr="1">
        <nvlink target="0000:02:00.0" count="12" tclass="0x030200"/>
      </gpu>
    </pci>
    <pci busid="0000:02:00.0" class="0x030200" link_speed="16.0 GT/s PCIe" link_width="16">
      <gpu dev="1" sm="80" rank="1" gdr="1">
        <nvlink target="0000:01:00.0" count="12" tclass="0x030200"/>
      </gpu>
    </pci>
    <nic><net name="mlx5_0" dev="0" speed="200000" port="1" gdr="1"/></nic>
  </cpu>
</system>
"""

NCCL_TESTS_TEXT = """\
# nThread 1 nGpus 4 minBytes 8 maxBytes 1024 step: 2(factor) warmup iters: 5 iters: 20
#  Rank  0 Group  0 Pid 1 on host device  0 [0x01] GPU
#  Rank  3 Group  0 Pid 1 on host device  3 [0x04] GPU
#       size   count  type  redop  root   time  algbw  busbw #wrong   time  algbw  busbw #wrong
           8       2 float    sum    -1  10.00   0.00   0.00      0  10.00   0.00   0.00      0
        1024     256 float    sum    -1  12.00   0.09   0.13      0  11.00   0.09   0.14      0
     1048576  262144 float    sum    -1  89.27  11.75  17.62      0  88.45  11.85  17.78      0
"""

PARAM_TEXT = """\
world_size: 8
\tCOMMS-RES\tsize (B)\t num-elements\t Latency(us):p50\tp75\t\tp95\t algBW(GB/s)\t busBW(GB/s)
\tCOMMS-RES\t    1024\t          256\t          21.3\t24.1\t\t30.2\t        0.05\t        0.08
\tCOMMS-RES\t 1048576\t       262144\t          98.0\t99.5\t\t101.0\t       10.70\t       18.72
"""


def _msccl_xml() -> str:
    return write_program(lower(_bcast(), runtime="msccl"), "msccl")


# -- hostile values ----------------------------------------------------------------------------

#: JSON text put where a value was: numbers JSON allows but Python mishandles, constants JSON
#: does not allow, strings no name should hold, wrong types, deep and giant structures.
JSON_LITERALS = [
    "9" * 5000, "-" + "9" * 5000, "0." + "0" * 4999 + "1", "1" + "0" * 400 + ".5", "1e999",
    "-1e999", "1e308", "-1e308", "4.9e-324", "NaN", "Infinity", "-Infinity",
    str(2 ** 63), str(2 ** 64), str(-2 ** 63 - 1), str(10 ** 30), str(10 ** 99), "-1", "0", "0.5",
    '"a\\u0000b"', '"\\u001b[2Jred"', '"\\ud800"', '"\\u202eevil"', '"' + "x" * 100_000 + '"',
    '"../../ESCAPED"', '""', "true", "null", "[]", "{}", '"text"',
    "[" * 5000 + "]" * 5000, "[" * 100 + "]" * 100, '{"a": ' * 100 + "1" + "}" * 100,
    "[" + ",".join(["7"] * 100_000) + "]", '{"' + "k" * 10_000 + '": 1}',
]

#: Tokens put in place of a token of a text format (tables, logs). The long runs of one character
#: catch regexes that backtrack: quadratic time on 200000 characters exceeds the deadline.
TEXT_TOKENS = [
    "9" * 5000, "1e308", "-1e308", "1e999", "nan", "inf", "-inf", str(10 ** 30), str(2 ** 63),
    "-1", "0", "N/A", "X", "NV1000000000000", "NV" + "9" * 5000, "GPU" + "9" * 5000,
    "COMMS-RES", "\x00", "a\x00b", "\x1b[2J", "\u202e", "\ud800", "x" * 200_000,
    "=" * 200_000 + "x", "COMMS-RES-a" * 20_000, "_perf" * 40_000, "GPU[" + "\t" * 200_000,
    "world_size" + "=" * 200_000,
]

#: Attribute values put in place of one in an XML file.
XML_VALUES = [
    "9" * 5000, "1e20", str(10 ** 12), str(2 ** 63), str(-2 ** 63 - 1), "-1", "", "0x" + "f" * 5000,
    "0" + "7" * 40, "NaN", "&amp;", "&#x1;", "x" * 100_000, "0000:01:00.0",
]

_SENTINEL = "@@HOSTILE@@"


def _paths(obj: Any, prefix: tuple = ()) -> list[tuple]:
    """Every position in a JSON value (the root included), as a tuple of keys and indices."""
    found = [prefix]
    if isinstance(obj, dict):
        for key, value in obj.items():
            found += _paths(value, prefix + (key,))
    elif isinstance(obj, list):
        for index, value in enumerate(obj):
            found += _paths(value, prefix + (index,))
    return found


@st.composite
def hostile_json(draw, good: dict) -> str:
    """``good`` as JSON text with one value replaced by a hostile literal, or cut short."""
    text = json.dumps(good, indent=1)
    if draw(st.integers(0, 9)) == 0:
        return text[:draw(st.integers(0, len(text) - 1))]
    path = draw(st.sampled_from(_paths(good)))
    literal = draw(st.one_of(
        st.sampled_from(JSON_LITERALS),
        st.integers(-(2 ** 80), 2 ** 80).map(str),
        st.floats(allow_nan=False, allow_infinity=False).map(repr),
        st.text(max_size=20).map(json.dumps),
    ))
    if not path:
        return literal
    obj = copy.deepcopy(good)
    target = obj
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = _SENTINEL
    return json.dumps(obj, indent=1).replace(json.dumps(_SENTINEL), literal, 1)


@st.composite
def hostile_text(draw, good: str) -> str:
    """``good`` with one whitespace-separated token replaced, a line repeated 5000 times, or the
    text cut short."""
    choice = draw(st.integers(0, 9))
    if choice == 0:
        return good[:draw(st.integers(0, len(good) - 1))]
    lines = good.splitlines(keepends=True)
    if choice == 1:
        index = draw(st.integers(0, len(lines) - 1))
        return "".join(lines[:index] + [lines[index]] * 5000 + lines[index:])
    tokens = list(re.finditer(r"\S+", good))
    token = draw(st.sampled_from(tokens))
    new = draw(st.one_of(st.sampled_from(TEXT_TOKENS), st.integers(-(2 ** 80), 2 ** 80).map(str),
                         st.text(max_size=10)))
    return good[:token.start()] + new + good[token.end():]


@st.composite
def hostile_xml(draw, good: str) -> str:
    """``good`` with one attribute value replaced, elements nested 1000 deep or a DOCTYPE
    inserted after the root's start tag, a NUL byte, or the text cut short."""
    choice = draw(st.integers(0, 11))
    if choice == 0:
        return good[:draw(st.integers(0, len(good) - 1))]
    root_end = good.index(">") + 1
    if choice == 1:
        return good[:root_end] + "<deep>" * 1000 + "</deep>" * 1000 + good[root_end:]
    if choice == 2:
        return ('<!DOCTYPE x [<!ENTITY a "aaaaaaaaaa"><!ENTITY b "&a;&a;&a;&a;&a;">]>\n'
                + good.replace('"1"', '"&b;"', 1))
    if choice == 3:
        at = draw(st.integers(0, len(good)))
        return good[:at] + "\x00" + good[at:]
    values = list(re.finditer(r'="([^"]*)"', good))
    value = draw(st.sampled_from(values))
    new = draw(st.one_of(st.sampled_from(XML_VALUES), st.integers(-(2 ** 80), 2 ** 80).map(str)))
    return good[:value.start(1)] + new.replace('"', "&quot;") + good[value.end(1):]


# -- the property --------------------------------------------------------------------------------

#: Hard limit on one example, in seconds: hypothesis' deadline only judges an example once it has
#: finished, and a backtracking regex may take hours.
HARD_LIMIT_S = 20


@contextlib.contextmanager
def _within(seconds: float):
    """Raise TimeoutError in the block after ``seconds`` (POSIX; no limit elsewhere)."""
    if not hasattr(signal, "setitimer"):
        yield
        return

    def expire(signum: int, frame: object) -> None:
        raise TimeoutError(f"an example took more than {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)



def _snapshot(folder: Path) -> set[tuple[str, int]]:
    return {(str(p.relative_to(folder)), p.stat().st_size if p.is_file() else -1)
            for p in folder.rglob("*")}


def _refused_cleanly(data: str | bytes, file_name: str, load: Callable[[Path], object],
                     argv: Callable[[Path, Path], list[str]],
                     use: Callable[[Path], list[str]] | None = None) -> None:
    """Write ``data`` as ``file_name``; reading it succeeds or raises a short CollsynthError
    naming the file; when it fails the CLI ``argv(path, out)`` exits 1 with one line on stderr
    and the folder is unchanged. When it succeeds, the cheap command ``use(path)`` runs to its
    exit code (what was accepted must be usable: no OverflowError downstream)."""
    with _within(HARD_LIMIT_S), tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        path = root / "in" / file_name
        path.parent.mkdir()
        if isinstance(data, str):
            path.write_bytes(data.encode("utf-8", "surrogatepass"))
        else:
            path.write_bytes(data)
        target = path.parent if file_name.startswith("rank-") else path
        try:
            load(target)
        except CollsynthError as exc:
            message = str(exc)
            assert str(target) in message, f"the message does not name the file: {message[:300]}"
            detail = getattr(exc, "detail", message)  # what follows the file name
            assert len(detail) <= MAX_MESSAGE_CHARS, f"a message of {len(detail)} characters"
        else:  # the mutation left a readable file
            if use is not None:
                with contextlib.redirect_stderr(io.StringIO()), \
                        contextlib.redirect_stdout(io.StringIO()):
                    assert isinstance(main(use(target)), int)
            return
        # The output folder exists (the output policy refuses a missing one before reading the
        # input): the error must then be about the input, and nothing may appear in the folder.
        (root / "out").mkdir()
        command = argv(target, root / "out")
        before = _snapshot(root)
        err, out = io.StringIO(), io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            code = main(command)
        lines = err.getvalue().strip().splitlines()
        assert code == EXIT_ERROR, (code, err.getvalue()[-500:])
        assert len(lines) == 1 and lines[0].startswith("collsynth") and "error: " in lines[0], \
            err.getvalue()[-500:]
        assert str(target) in lines[0]
        assert _snapshot(root) == before, "the failed command wrote something"


def _topology_file(path: Path) -> object:
    return resolve_topology(str(path))


def _solve(path: Path, out: Path) -> list[str]:
    return ["solve", "instance", str(path), "allgather", "--steps", "1", "-o", str(out)]


def _bounds(path: Path) -> list[str]:
    return ["bounds", str(path), "allgather"]


# -- one test per reader -------------------------------------------------------------------------


def _with(good: dict, path: tuple, literal: str) -> str:
    """``good`` as JSON text with the value at ``path`` replaced by ``literal`` (an example that
    always runs, whatever hypothesis draws)."""
    obj = copy.deepcopy(good)
    target = obj
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = _SENTINEL
    return json.dumps(obj).replace(json.dumps(_SENTINEL), literal, 1)


@SETTINGS
@given(data=hostile_json(_topology()))
@example(data=_with(_topology(), ("links", 0, 1), str(2 ** 63)))
@example(data=_with(_topology(), ("links", 0, 1), "9" * 5000))
@example(data=_with(_topology(), ("unit_gbps",), "Infinity"))
@example(data=_with(_topology(), ("name",), '"a\\u0000b"'))
@example(data=_with(_topology(), ("links", 0, 1), '"' + "x" * 100_000 + '"'))
def test_topology_json(data: str) -> None:
    _refused_cleanly(data, "topo.json", _topology_file, _solve, _bounds)


@SETTINGS
@given(data=hostile_json(collective_to_json(allgather(4))))
@example(data=json.dumps({**collective_to_json(allgather(4)), "k" * 10_000: 1}))
@example(data=_with(collective_to_json(allgather(4)), ("chunk_factor",), str(10 ** 30)))
def test_collective_json(data: str) -> None:
    _refused_cleanly(data, "coll.json", load_collective,
                     lambda p, out: ["solve", "instance", "ring:4", str(p), "--steps", "1",
                                     "-o", str(out)],
                     lambda p: ["bounds", "ring:4", str(p)])


@SETTINGS
@given(data=hostile_json(algorithm_to_json(_bcast())))
def test_algorithm_json(data: str) -> None:
    _refused_cleanly(data, "algo.json", load_algorithm,
                     lambda p, out: ["export", str(p), "-o", str(out / "algo.xml")],
                     lambda p: ["show", str(p)])


@SETTINGS
@given(data=hostile_json(_calibration()))
def test_calibration_json(data: str) -> None:
    def argv(path: Path, out: Path) -> list[str]:
        algo = out.parent / "in" / "bcast.json"
        algo.write_text(json.dumps(algorithm_to_json(_bcast())))
        return ["time", "--calibration", str(path), str(algo)]

    _refused_cleanly(data, "cal.json", load_calibration, argv)


@SETTINGS
@given(data=hostile_text(NVIDIA_SMI))
def test_nvidia_smi(data: str) -> None:
    _refused_cleanly(data, "topo.txt", _topology_file, _solve, _bounds)


@SETTINGS
@given(data=hostile_text(ROCM_SMI))
@example(data="=" * 200_000 + "x\n" + ROCM_SMI)
def test_rocm_smi(data: str) -> None:
    _refused_cleanly(data, "topo.txt", _topology_file, _solve, _bounds)


@SETTINGS
@given(data=hostile_xml(NCCL_XML))
@example(data=NCCL_XML.replace('count="12"', 'count="1000000000000"'))
@example(data=NCCL_XML.replace('count="12"', 'count="1e20"'))
@pytest.mark.filterwarnings("ignore::collsynth.errors.InputWarning")  # notes on a mangled file
def test_nccl_xml(data: str) -> None:
    _refused_cleanly(data, "topo.xml", _topology_file, _solve, _bounds)


def _calibrate(path: Path, out: Path) -> list[str]:
    return ["calibrate", str(path), "--topology", "dgx1", "-o", str(out / "cal.json")]


@SETTINGS
@given(data=hostile_text(NCCL_TESTS_TEXT))
@example(data=NCCL_TESTS_TEXT.replace("10.00   0.00", "1e308   0.00", 1))
@example(data=NCCL_TESTS_TEXT.replace("    1024     256", "1" + "0" * 29 + " 256", 1))
@example(data=NCCL_TESTS_TEXT.replace("88.45", "x" * 200_000, 1))
def test_nccl_tests_log(data: str) -> None:
    _refused_cleanly(data, "all_reduce_perf.txt", load_log, _calibrate)


@SETTINGS
@given(data=hostile_text(PARAM_TEXT))
def test_param_log(data: str) -> None:
    _refused_cleanly(data, "all_reduce_param.txt", load_log, _calibrate)


@SETTINGS
@given(data=hostile_json(_nccl_tests_json()))
def test_nccl_tests_json_log(data: str) -> None:
    _refused_cleanly(data, "all_reduce.json", load_log, _calibrate)


def _plan(path: Path, out: Path) -> list[str]:
    return ["plan", str(path), "--topology", "dgx1", "-o", str(out)]


@SETTINGS
@given(line=st.sampled_from([0, 1]), data=st.data())
def test_trace(line: int, data: st.DataObject) -> None:
    lines = [json.dumps(_HEADER), json.dumps(_CALL)]
    lines[line] = data.draw(hostile_json([_HEADER, _CALL][line])).replace("\n", " ")
    _refused_cleanly("\n".join(lines) + "\n", "rank-00000.jsonl", read_trace, _plan,
                     lambda p: ["trace", "summarize", str(p)])


def test_trace_bytes_beyond_a_petabyte() -> None:
    lines = [json.dumps(_HEADER), _with(_CALL, ("bytes",), str(10 ** 30))]
    _refused_cleanly("\n".join(lines) + "\n", "rank-00000.jsonl", read_trace, _plan)


@SETTINGS
@given(data=hostile_xml(_msccl_xml()))
def test_msccl_xml(data: str) -> None:
    """The strict reader refuses cleanly; the runtime-mode reader (``collsynth check``'s) reads
    or reports problems, never raising anything but a CollsynthError."""
    _refused_cleanly(data, "algo.xml", read_program, lambda p, out: ["run", str(p)])
    with contextlib.suppress(CollsynthError):
        read_checked(data, "msccl")


_PLANS = Path(__file__).resolve().parents[1] / "data" / "mscclpp-plans"


@SETTINGS
@given(name=st.sampled_from(["sn_allgather_2gpu.json", "sn_allreduce_pipeline.json",
                             "mn_reducescatter_pkt_2x4.json"]), data=st.data())
def test_mscclpp_plan(name: str, data: st.DataObject) -> None:
    """A plan the reader accepts is checked to a verdict (exit 0 or 1), never a crash."""
    from collsynth.export.mscclpp.reader import read_plan

    sample = json.loads((_PLANS / name).read_text())
    check = ["check", "--runtime", "mscclpp"]
    _refused_cleanly(data.draw(hostile_json(sample)), "plan.json", read_plan,
                     lambda p, out: check + [str(p)], lambda p: check + [str(p)])
