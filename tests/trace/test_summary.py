"""Summaries of traces, and ``collsynth trace summarize``."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from collsynth.cli import main
from collsynth.trace import format_summary, read_trace, summarize
from collsynth.trace.summary import SummaryRow, bucket_label, format_bytes, size_bucket

ROOT = Path(__file__).resolve().parents[2]
BAD = ROOT / "tests" / "fixtures" / "bad"


def _header(rank: int, world_size: int, durations: bool) -> dict:
    return {"type": "header", "format": "collsynth-trace", "version": 1, "rank": rank,
            "world_size": world_size, "backend": "gloo", "byte_convention": "nccl-tests",
            "hostname": "h", "pid": 1, "torch_version": "2.13.0", "started_unix": 0.0,
            "record_durations": durations, "cross_node_only": False, "ranks_per_node": None}


def _call(seq: int, kind: str, nbytes: int, group: list[int], *, us: float | None = None,
          peer: int | None = None, error: str | None = None) -> dict:
    return {"type": "call", "seq": seq, "kind": kind, "function": kind, "bytes": nbytes,
            "dtype": "float32", "op": "sum" if kind == "allreduce" else None, "group": group,
            "group_size": len(group), "root": None, "peer": peer, "async_op": False,
            "site": None, "duration_us": us, "cross_node": None, "batch": None,
            "error": error, "raw": {}}


def _trace_dir(folder: Path) -> Path:
    """Rank 0 and 1: the same allreduces (SPMD); rank 0 also sends to 1, which receives."""
    world = [0, 1]
    calls = {
        0: [_call(0, "allreduce", 65536, world, us=10.0),
            _call(1, "allreduce", 100000, world, us=30.0),
            _call(2, "allreduce", 4096, world, us=1.0),
            _call(3, "send", 1000, world, peer=1, us=5.0),
            _call(4, "send", 1000, world, peer=1, us=5.0),
            _call(5, "barrier", 0, world, us=2.0),
            _call(6, "allreduce", 70000, world, error="RuntimeError: peer died")],
        1: [_call(0, "allreduce", 65536, world, us=12.0),
            _call(1, "allreduce", 100000, world, us=20.0),
            _call(2, "allreduce", 4096, world, us=4.0),
            _call(3, "recv", 1000, world, peer=0),
            _call(4, "recv", 1000, world, peer=0),
            _call(5, "barrier", 0, world, us=9.0)],
    }
    folder.mkdir()
    for rank, lines in calls.items():
        text = "".join(json.dumps(o) + "\n" for o in [_header(rank, 2, True), *lines])
        (folder / f"rank-{rank:05d}.jsonl").write_text(text)
    return folder


def test_buckets_are_powers_of_two():
    assert [size_bucket(n) for n in (0, 1, 2, 3, 1023, 1024, 1025, 100_000)] == [
        (0, 0), (1, 2), (2, 4), (2, 4), (512, 1024), (1024, 2048), (1024, 2048),
        (65536, 131072)]
    assert bucket_label(65536, 131072) == "64 KiB-128 KiB"
    assert bucket_label(512, 1024) == "512 B-1 KiB"
    assert bucket_label(1 << 30, 1 << 31) == "1 GiB-2 GiB"
    assert format_bytes(1536) == "1.5 KiB"


def test_rows_per_rank_and_merged(tmp_path):
    rows = summarize(read_trace(_trace_dir(tmp_path / "t")))
    assert rows == [
        SummaryRow(0, "barrier", 2, 0, 0, 1, 0, 2.0),
        SummaryRow(0, "allreduce", 2, 4096, 8192, 1, 4096, 1.0),
        SummaryRow(0, "allreduce", 2, 65536, 131072, 2, 165536, 40.0),   # the failed one: out
        SummaryRow(0, "send", 2, 512, 1024, 2, 2000, 10.0),
        SummaryRow(1, "barrier", 2, 0, 0, 1, 0, 9.0),
        SummaryRow(1, "allreduce", 2, 4096, 8192, 1, 4096, 4.0),
        SummaryRow(1, "allreduce", 2, 65536, 131072, 2, 165536, 32.0),
        SummaryRow(1, "recv", 2, 512, 1024, 2, 2000, None),          # no durations
        # merged: each figure the maximum over the ranks that have the key
        SummaryRow(None, "barrier", 2, 0, 0, 1, 0, 9.0, ranks=2),
        SummaryRow(None, "allreduce", 2, 4096, 8192, 1, 4096, 4.0, ranks=2),
        SummaryRow(None, "allreduce", 2, 65536, 131072, 2, 165536, 40.0, ranks=2),
        SummaryRow(None, "send", 2, 512, 1024, 2, 2000, 10.0, ranks=1),
        SummaryRow(None, "recv", 2, 512, 1024, 2, 2000, None, ranks=1),
    ]


def test_the_table_has_one_line_per_row(tmp_path):
    rows = summarize(read_trace(_trace_dir(tmp_path / "t")))
    lines = format_summary(rows).splitlines()
    assert lines[0].split() == ["rank", "kind", "group", "size", "calls", "bytes", "time_ms",
                                "ranks"]
    assert len(lines) == 1 + len(rows)
    assert lines[3].split() == ["0", "allreduce", "2", "64", "KiB-128", "KiB", "2", "161.7",
                                "KiB", "0.040", "1"]
    assert lines[8].split()[:2] == ["1", "recv"] and lines[8].split()[-2] == "-"
    assert lines[-1].split()[0] == "all"


def _cli(argv: list[str], capsys) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_summarize_command(tmp_path, capsys):
    folder = _trace_dir(tmp_path / "t")
    code, out, err = _cli(["trace", "summarize", str(folder)], capsys)
    assert code == 0 and err == ""
    first, *table = out.splitlines()
    assert first == (f"{folder}: 2 of 2 ranks, 13 calls; bytes in the nccl-tests convention; "
                     "rank 'all': maximum over ranks of each figure")
    assert "\n".join(table) == format_summary(summarize(read_trace(folder)))

    code, out, _ = _cli(["trace", "summarize", str(folder), "--json", "--merged"], capsys)
    report = json.loads(out)
    assert code == 0 and (report["world_size"], report["ranks"], report["missing_ranks"]) == \
        (2, [0, 1], [])
    assert [(r["rank"], r["kind"], r["bucket"], r["calls"], r["total_bytes"], r["ranks"])
            for r in report["rows"]] == [
        (None, "barrier", "0 B", 1, 0, 2), (None, "allreduce", "4 KiB-8 KiB", 1, 4096, 2),
        (None, "allreduce", "64 KiB-128 KiB", 2, 165536, 2), (None, "send", "512 B-1 KiB", 2,
                                                              2000, 1),
        (None, "recv", "512 B-1 KiB", 2, 2000, 1)]


def test_summarize_a_bad_trace_is_exit_1_naming_the_file_and_line(tmp_path, capsys):
    folder = tmp_path / "t"
    folder.mkdir()
    shutil.copy(BAD / "trace_negative_bytes.jsonl", folder / "rank-00000.jsonl")
    code, out, err = _cli(["trace", "summarize", str(folder)], capsys)
    assert code == 1 and out == ""
    assert err == (f"collsynth: error: {folder / 'rank-00000.jsonl'}: line 3: field 'bytes': "
                   "expected an integer >= 0, got -4\n")
    code, _, err = _cli(["trace", "summarize", str(tmp_path / "nothing")], capsys)
    assert code == 1 and err.endswith("nothing: no such directory\n")


def test_summarize_needs_a_directory(capsys):
    code, _, err = _cli(["trace", "summarize"], capsys)
    assert code == 2
    assert "DIR" in err
