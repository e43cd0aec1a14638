"""Hostile input, round 22: what this round's hunt found.

Each case failed on the code before its fix.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from collsynth import cli
from tests.test_inputs_round21 import one_error_line  # one error line, nothing on stdout

ROOT = Path(__file__).resolve().parents[1]


# -- plan: rank files that disagree on a call's op, dtype, group order, or the header --------


def _trace(folder: Path, per_call=lambda rank, seq: {}, per_header=lambda rank: {}) -> Path:
    """A 4-rank trace of an allreduce then an allgather on the whole group; ``per_call`` and
    ``per_header`` give a rank's changes to a call and to its header."""
    header = {"type": "header", "format": "collsynth-trace", "version": 1, "world_size": 4,
              "backend": "nccl", "byte_convention": "nccl-tests", "hostname": "n", "pid": 1,
              "torch_version": "2.13.0", "started_unix": 0.0, "record_durations": False,
              "cross_node_only": False, "ranks_per_node": None}
    calls = [("allreduce", "all_reduce", "sum"), ("allgather", "all_gather_into_tensor", None)]
    folder.mkdir()
    for rank in range(4):
        lines = [dict(header, rank=rank, **per_header(rank))]
        for seq, (kind, function, op) in enumerate(calls):
            lines.append(dict(
                {"type": "call", "seq": seq, "kind": kind, "function": function,
                 "bytes": 65536, "dtype": "float32", "op": op, "group": [0, 1, 2, 3],
                 "group_size": 4, "root": None, "peer": None, "async_op": False, "site": None,
                 "duration_us": None, "cross_node": None, "batch": None, "error": None,
                 "raw": {"element_size": 4}}, **per_call(rank, seq)))
        (folder / f"rank-{rank:05d}.jsonl").write_text(
            "".join(json.dumps(line) + "\n" for line in lines))
    return folder


def _plan(trace: Path, tmp_path: Path) -> int:
    return cli.main(["plan", str(trace), "--topology", "dgx1", "-o", str(tmp_path / "plan"),
                     "-q", "--no-cache"])


@pytest.mark.parametrize("per_call, message", [
    # an allreduce summed on three ranks and maxed on one: the plan deployed a sum
    (lambda r, s: {"op": "max"} if (r, s) == (1, 0) else {},
     "rank-00001.jsonl: call seq 0 on group [0, 1, 2, 3]: field 'op' is 'max', but rank 0's "
     "matching call (seq 0, rank-00000.jsonl) has 'sum'"),
    # the same 64 KiB as bfloat16 on one rank: another element count, another reduction
    (lambda r, s: {"dtype": "bfloat16", "raw": {"element_size": 2}} if (r, s) == (2, 1) else {},
     "rank-00002.jsonl: call seq 1 on group [0, 1, 2, 3]: field 'dtype' is 'bfloat16', but "
     "rank 0's matching call (seq 1, rank-00000.jsonl) has 'float32'"),
    # one rank lists the group the other way round: the error blamed seq 1's 'kind' (the
    # allgather matched against the others' allreduce)
    (lambda r, s: {"group": [3, 2, 1, 0]} if (r, s) == (1, 0) else {},
     "rank-00001.jsonl: call seq 0 on group [0, 1, 2, 3]: field 'group' is [3, 2, 1, 0], but "
     "rank 0's matching call (seq 0, rank-00000.jsonl) has [0, 1, 2, 3]"),
])
def test_plan_refuses_ranks_that_disagree_on_a_calls_field(tmp_path, capsys, per_call, message):
    trace = _trace(tmp_path / "trace", per_call=per_call)
    line = one_error_line(capsys, _plan(trace, tmp_path))
    assert message in line, line
    assert not (tmp_path / "plan").exists()


@pytest.mark.parametrize("per_header, message", [
    (lambda r: {"backend": "gloo"} if r == 3 else {},
     "rank-00003.jsonl: line 1: field 'backend': 'gloo', but {trace}/rank-00000.jsonl has "
     "'nccl'"),
    (lambda r: {"ranks_per_node": 2 if r == 1 else 4},
     "rank-00001.jsonl: line 1: field 'ranks_per_node': 2, but {trace}/rank-00000.jsonl has 4"),
])
def test_plan_refuses_rank_files_whose_headers_disagree(tmp_path, capsys, per_header, message):
    """Files of two runs (another backend, nodes of another size) were planned as one."""
    trace = _trace(tmp_path / "trace", per_header=per_header)
    line = one_error_line(capsys, _plan(trace, tmp_path))
    assert message.format(trace=trace) in line, line
    assert not (tmp_path / "plan").exists()


def test_plan_reads_a_trace_whose_ranks_agree(tmp_path):
    from collsynth.plan.calls import load_calls

    run = load_calls(_trace(tmp_path / "trace", per_header=lambda r: {"ranks_per_node": 4}))
    assert [[c.op for c in run.calls[r]] for r in run.ranks] == [["sum", None]] * 4


# -- check --chunk-bytes: no upper bound ------------------------------------------------------


@pytest.mark.parametrize("value", ["99999999999999999999999", str(2**50 + 1)])
def test_check_chunk_bytes_beyond_a_pebibyte_is_a_usage_error(tmp_path, capsys, value):
    """A 23-digit chunk was taken, and the only complaint was the plan's: not a multiple of
    its 16-byte alignment (exit 1, as if the plan were wrong)."""
    plan = tmp_path / "plan.json"
    plan.write_text("{}")  # never read: the option is refused first
    line = one_error_line(capsys, cli.main(["check", str(plan), "--chunk-bytes", value]),
                          cli.EXIT_USAGE)
    assert f"argument --chunk-bytes: {value!r}: a chunk of more than 1 PiB (1125899906842624 " \
           "bytes); expected a whole number of bytes from 1 to 1125899906842624" in line, line


def test_check_chunk_bytes_of_a_pebibyte_is_taken():
    from collsynth.cli.check import _chunk_bytes

    assert _chunk_bytes(str(2**50)) == 2**50


# -- draw: an XML program on a topology of another size --------------------------------------


@pytest.mark.parametrize("topology, message", [
    ("ring:8", "prog.xml: program 'allgather-ring:4-s2-r2-c1' has ngpus=4 but topology 'ring:8' "
               "has 8 ranks"),
    ("line:4", "prog.xml: program 'allgather-ring:4-s2-r2-c1' sends from rank 0 to rank 3, but "
               "topology 'line:4' has no such link"),
])
def test_draw_names_the_file_of_a_program_on_the_wrong_topology(ring_allgather_path, tmp_path,
                                                                capsys, topology, message):
    """The error named the program (its name attribute) and not the file it came from."""
    program = tmp_path / "prog.xml"
    assert cli.main(["export", str(ring_allgather_path), "-o", str(program)]) == cli.EXIT_OK
    capsys.readouterr()
    line = one_error_line(capsys, cli.main(["draw", str(program), "--topology", topology,
                                            "-o", str(tmp_path / "d.svg")]))
    assert f"collsynth: error: {program}: " in line and message in line, line
    assert not (tmp_path / "d.svg").exists()


# -- nccl-tests logs: what the runtime and the run were (timing/logs.py) ---------------------

HEADER = ("#       size   count  type  redop  root   time  algbw  busbw #wrong   time  algbw  "
          "busbw #wrong")
ROW = ("        1024     256 float    sum    -1  12.00   0.09   0.13      0  11.00   0.09   0.14"
       "      0")


def _rank_line(rank: int) -> str:
    return f"#  Rank {rank:2d} Group  0 Pid 1 on host device {rank:2d} [0x01] GPU"


def _json_log(nccl_version) -> str:
    return json.dumps({
        "version": 2, "args": ["./build/all_reduce_perf"], "nccl_version": nccl_version,
        "config": {"nthreads": 1, "ngpus": 8},
        "results": [{"size": 1024, "count": 256, "type": "float", "redop": "sum", "root": "-1",
                     "out_of_place": {"time": 10.0}, "in_place": None}]})


@pytest.mark.parametrize("code", [1234, 0, 20899, "2.27.3"])
def test_a_json_nccl_version_that_is_no_version_code_is_refused(tmp_path, capsys, code):
    """nccl-tests writes ncclGetVersion's code (src/util.cu: jsonKey("nccl_version");
    jsonInt(test_ncclVersion)): NCCL_VERSION(X, Y, Z) is X*10000 + Y*100 + Z from 2.9 (20900
    on) and X*1000 + Y*100 + Z for 2.0 to 2.8 (2000 to 2899). 1234, 0 and 20899 are neither
    (a '2.8.99' in the new encoding is never written), nor is a string; they were read as a
    log of no known runtime, without a word."""
    log = tmp_path / "ar.json"
    log.write_text(_json_log(code))
    line = one_error_line(capsys, cli.main(["calibrate", str(log), "--topology", "dgx-a100",
                                            "-o", str(tmp_path / "c.json")]))
    assert f"{log}: nccl_version: {code!r} is not an NCCL version code" in line, line
    assert not (tmp_path / "c.json").exists()


def test_a_json_nccl_version_code_before_2_9_is_read():
    """2804 is NCCL 2.8.4 by the encoding before 2.9 (2 * 1000 + 8 * 100 + 4); it was left
    unread (the reader took codes from 20000 only)."""
    from collsynth.timing.logs import parse_log

    log = parse_log(_json_log(2804), name="ar.json")
    assert (log.runtime, log.runtime_version) == ("nccl", "2.8.4")


def test_the_largest_nchannels_of_a_log_is_its_channel_count():
    """docs/timing.md: "else the largest `nChannels N`". NCCL prints one search result per
    graph pattern; here the tree's 8 comes before the ring's 12: the count is 12, not the
    first one printed."""
    from collsynth.timing.logs import parse_log

    text = "\n".join([
        "x [0] NCCL INFO Pattern 3, crossNic 0, nChannels 8, bw 20.0/20.0, type NVL/PIX",
        "x [0] NCCL INFO Pattern 4, crossNic 0, nChannels 12, bw 20.0/20.0, type NVL/PIX",
        "x [0] NCCL INFO Pattern 1, crossNic 0, nChannels 4, bw 20.0/20.0, type NVL/PIX",
        HEADER, ROW, ""])
    assert parse_log(text, name="all_reduce_perf.txt", ranks=4).channels == 12


def test_rank_lines_with_a_gap_count_up_to_the_highest_rank():
    """'#  Rank 0', '1', '3' (rank 2's line lost from the output): the run had rank 3, so 4
    ranks at least, not the 3 lines seen."""
    from collsynth.timing.logs import parse_log

    text = "\n".join(["# nThread 1 nGpus 1 minBytes 1024 maxBytes 1024 step: 2(factor)",
                      *map(_rank_line, (0, 1, 3)), HEADER, ROW, ""])
    assert parse_log(text, name="all_reduce_perf.txt").ranks == 4


def test_an_appended_run_with_a_gap_in_its_rank_lines_is_on_as_many_ranks():
    """Two runs appended to one log, the second missing rank 2's line: both on 4 ranks (the
    highest rank 3), so one rank count, not 'a run on 3 ranks after one on 4'."""
    from collsynth.timing.logs import parse_log

    head = "# nThread 1 nGpus 1 minBytes 1024 maxBytes 1024 step: 2(factor)"
    text = "\n".join([head, *map(_rank_line, (0, 1, 2, 3)), HEADER, ROW,
                      head, *map(_rank_line, (0, 1, 3)), HEADER, ROW, ""])
    log = parse_log(text, name="all_reduce_perf.txt")
    assert (log.ranks, len(log.rows)) == (4, 4)
