"""Reading trace files: what a good trace gives, and one precise error per bad file."""

from __future__ import annotations

import copy
import json
import re
import shutil
from pathlib import Path

import pytest

from collsynth.errors import FileFormatError, InputTooLargeError
from collsynth.trace import records
from collsynth.trace.records import CALL_KEYS, HEADER_KEYS, read_rank_file, read_trace

ROOT = Path(__file__).resolve().parents[2]
BAD = ROOT / "tests" / "fixtures" / "bad"

HEADER = {"type": "header", "format": "collsynth-trace", "version": 1, "rank": 0,
          "world_size": 2, "backend": "gloo", "byte_convention": "nccl-tests",
          "hostname": "node0", "pid": 7, "torch_version": "2.13.0", "started_unix": 1.5,
          "record_durations": False, "cross_node_only": False, "ranks_per_node": 1}
CALL = {"type": "call", "seq": 0, "kind": "alltoall", "function": "all_to_all_single",
        "bytes": 40, "dtype": "float32", "op": None, "group": [0, 1], "group_size": 2,
        "root": None, "peer": None, "async_op": False, "site": "/src/a.py:3 f",
        "duration_us": None, "cross_node": True, "batch": None, "error": None,
        "raw": {"element_size": 4, "shapes": {"output": [12], "input": [10]},
                "numel": {"output": 12, "input": 10},
                "input_split_sizes": [4, 6], "output_split_sizes": [3, 9], "future": "kept"}}


def _write(folder: Path, rank: int, lines: list[dict], **header) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"rank-{rank:05d}.jsonl"
    head = dict(HEADER, rank=rank, **header)
    path.write_text("".join(json.dumps(o) + "\n" for o in [head, *lines]))
    return path


def _call(**changes) -> dict:
    call = copy.deepcopy(CALL)
    call.update(changes)
    return call


def test_a_good_trace_reads_back_field_for_field(tmp_path):
    send = _call(seq=3, kind="send", function="batch_isend_irecv", bytes=8, peer=0,
                 async_op=True, batch=0, raw={"tag": -1}, duration_us=2.5)
    _write(tmp_path, 0, [_call()])
    _write(tmp_path, 1, [_call(), send])
    (tmp_path / ".rank-00001.jsonl.x.tmp").write_text("half a line")   # ignored
    (tmp_path / "notes.txt").write_text("ignored")
    trace = read_trace(tmp_path)
    assert (trace.world_size, trace.byte_convention, trace.rank_numbers, trace.missing_ranks) \
        == (2, "nccl-tests", (0, 1), ())
    assert trace.rank(1).header == records.TraceHeader(1, 2, "gloo", "nccl-tests", "node0", 7,
                                                       "2.13.0", 1.5, False, False, 1)
    first, second = trace.rank(1).calls
    assert (first.rank, first.seq, first.kind, first.function, first.bytes, first.dtype,
            first.group, first.group_size, first.cross_node) == \
        (1, 0, "alltoall", "all_to_all_single", 40, "float32", (0, 1), 2, True)
    assert first.split_sizes == ([4, 6], [3, 9]) and first.raw["future"] == "kept"
    assert (second.kind, second.peer, second.batch, second.async_op, second.duration_us,
            second.raw) == ("send", 0, 0, True, 2.5, {"tag": -1})
    assert [c.rank for c in trace.calls()] == [0, 1, 1]
    with pytest.raises(KeyError, match="no trace file for rank 5"):
        trace.rank(5)


def test_missing_ranks_are_listed(tmp_path):
    _write(tmp_path, 1, [], world_size=4)
    assert read_trace(tmp_path).missing_ranks == (0, 2, 3)


def test_the_documented_keys_are_the_ones_checked():
    assert set(HEADER) == set(HEADER_KEYS) and set(CALL) == set(CALL_KEYS)
    # The module docstring points to docs/trace.md for the fields; the document shows them all.
    doc = (Path(__file__).resolve().parents[2] / "docs" / "trace.md").read_text(encoding="utf-8")
    assert "docs/trace.md" in records.__doc__
    assert all(f'"{key}"' in doc for key in HEADER_KEYS + CALL_KEYS)


BAD_FILES = {
    "trace_truncated.jsonl": r": line 3: malformed JSON at column \d+",
    "trace_no_header.jsonl": r": line 1: field 'type': the first line must be the header",
    "trace_unknown_version.jsonl": r": line 1: field 'version': unsupported version 2; this "
                                   r"collsynth reads version 1",
    "trace_wrong_format.jsonl": r": line 1: field 'format': expected 'collsynth-trace', got "
                                r"\"chrome-trace\"",
    "trace_negative_bytes.jsonl": r": line 3: field 'bytes': expected an integer >= 0, got -4",
    "trace_unknown_kind.jsonl": r": line 2: field 'kind': expected one of barrier, broadcast, .*"
                                r"got \"allreduce_coalesced\"",
    "trace_missing_field.jsonl": r": line 2: field 'group': missing from the call line",
    "trace_unknown_field.jsonl": r": line 2: field 'bites': unknown field in a call line",
    "trace_rank_not_in_group.jsonl": r": line 3: field 'group': rank 0 \(this file's\) is not "
                                     r"in the group \[1, 2\]",
    "trace_seq_not_increasing.jsonl": r": line 4: field 'seq': 1 does not follow 1",
    "trace_broadcast_without_root.jsonl": r": line 2: field 'root': a broadcast has a root; "
                                          r"got null",
    "trace_group_size_mismatch.jsonl": r": line 2: field 'group_size': 8, but the group has 4 "
                                       r"ranks",
    "trace_bad_split_sizes.jsonl": r": line 2: field 'raw.input_split_sizes': expected a list "
                                   r"of integers >= 0 or null",
    "trace_send_without_peer.jsonl": r": line 2: field 'peer': a send has a peer; got null",
    "trace_rank_beyond_world.jsonl": r": line 1: field 'rank': expected an integer >= 0 and "
                                     r"<= 3, got 4",
    "trace_nan_duration.jsonl": r": line 2: column 228: NaN is not a number JSON allows",
    "trace_not_utf8.jsonl": r": line 2: not UTF-8 text",
    "trace_empty.jsonl": r": empty file; expected a header line first",
    "trace_not_an_object.jsonl": r": line 2: expected a JSON object, got list",
    "trace_bytes_1e30.jsonl": r": line 3: field 'bytes': 1000000000000000000000000000000 is more "
                              r"than 1125899906842624 \(1 PiB",
    "trace_duration_1e308.jsonl": r": line 3: field 'duration_us': 1e\+308 is more than "
                                  r"3\.6e\+09",
    "trace_nul_in_function.jsonl": r": line 2: field 'function' = 'all_re\\x00duce': a control "
                                   r"character \(NUL\)",
    "trace_5000_digit_seq.jsonl": r": line 3: column 22: a number of more than 100 digits",
}


def test_every_bad_trace_fixture_has_a_case():
    assert {p.name for p in BAD.glob("trace_*")} == set(BAD_FILES)


@pytest.mark.parametrize("name", sorted(BAD_FILES))
def test_a_bad_file_is_refused_naming_file_line_and_field(name, tmp_path):
    with pytest.raises(FileFormatError, match="^" + re.escape(str(BAD / name)) + BAD_FILES[name]):
        read_rank_file(BAD / name)
    # the same through read_trace, as a rank file of a directory
    target = tmp_path / "rank-00000.jsonl"
    shutil.copy(BAD / name, target)
    with pytest.raises(FileFormatError) as caught:
        read_trace(tmp_path)
    assert caught.value.path == str(target)


def test_files_that_disagree_are_refused(tmp_path):
    _write(tmp_path / "a", 0, [])
    _write(tmp_path / "a", 1, [], world_size=3)
    with pytest.raises(FileFormatError, match=r"rank-00001.jsonl: line 1: field 'world_size': "
                                              r"3, but .*rank-00000.jsonl has 2"):
        read_trace(tmp_path / "a")
    path = _write(tmp_path / "b", 1, [])
    path.rename(tmp_path / "b" / "rank-00000.jsonl")
    with pytest.raises(FileFormatError, match="the header says rank 1, the file name rank 0"):
        read_trace(tmp_path / "b")


def test_a_directory_without_traces_is_refused(tmp_path):
    with pytest.raises(FileFormatError, match="no trace files"):
        read_trace(tmp_path)
    with pytest.raises(FileFormatError, match="no such directory"):
        read_trace(tmp_path / "missing")
    _write(tmp_path, 0, [])
    with pytest.raises(FileFormatError, match="is not a directory"):
        read_trace(tmp_path / "rank-00000.jsonl")


def test_size_limits(tmp_path, monkeypatch):
    path = _write(tmp_path, 0, [_call(), _call(seq=1)])
    with pytest.raises(InputTooLargeError, match=r"the trace files hold \d+ bytes, more than "
                                                 r"the 100 a trace may have"):
        read_trace(tmp_path, max_total_bytes=100)
    monkeypatch.setattr(records, "MAX_LINE_BYTES", 400)
    with pytest.raises(InputTooLargeError, match=re.escape(str(path)) + ": line 2 is longer "
                                                 "than the 400 bytes a trace line may have"):
        read_trace(tmp_path)


def test_a_failed_call_may_have_any_root(tmp_path):
    bad_root = _call(kind="broadcast", function="broadcast", root=7, error="ValueError: no")
    _write(tmp_path, 0, [bad_root])
    [call] = read_trace(tmp_path).rank(0).calls
    assert (call.root, call.error) == (7, "ValueError: no")
    _write(tmp_path, 0, [dict(bad_root, error=None)])
    with pytest.raises(FileFormatError, match=r"field 'root': rank 7 is not in the group "
                                              r"\[0, 1\]"):
        read_trace(tmp_path)
