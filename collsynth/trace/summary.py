"""Summaries of a trace: calls and bytes by kind, group size and size bucket.

One row per rank and key, and one merged row per key (the maximum over ranks of each figure);
docs/trace.md says what a row counts and what the merged row means.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

from collsynth.trace.records import KINDS, CallRecord, Trace

__all__ = ["SummaryRow", "summarize", "summarize_calls", "format_summary", "size_bucket",
           "bucket_label", "format_bytes", "MERGE_RULE"]

#: How merged rows are made (also printed by ``collsynth trace summarize``).
MERGE_RULE = "maximum over ranks of each figure"

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB")
_KIND_ORDER = {kind: i for i, kind in enumerate(KINDS)}


def size_bucket(nbytes: int) -> tuple[int, int]:
    """The power-of-two bucket ``(low, high)`` holding ``nbytes``: ``low <= nbytes < high``;
    ``(0, 0)`` for 0.

    >>> size_bucket(100_000)
    (65536, 131072)
    >>> size_bucket(0)
    (0, 0)
    """
    if nbytes <= 0:
        return 0, 0
    low = 1 << (int(nbytes).bit_length() - 1)
    return low, 2 * low


def format_bytes(nbytes: float) -> str:
    """``nbytes`` in binary units, exact for powers of two (``'64 KiB'``, ``'1.5 MiB'``)."""
    value = float(nbytes)
    unit = 0
    while abs(value) >= 1024 and unit < len(_UNITS) - 1:
        value /= 1024
        unit += 1
    text = f"{value:.0f}" if value == int(value) else f"{value:.1f}"
    return f"{text} {_UNITS[unit]}"


def bucket_label(low: int, high: int) -> str:
    """``'64 KiB-128 KiB'`` for ``[low, high)``, ``'0 B'`` for the empty bucket.

    >>> bucket_label(65536, 131072)
    '64 KiB-128 KiB'
    """
    if high == 0:
        return "0 B"
    return f"{format_bytes(low)}-{format_bytes(high)}"


@dataclass(frozen=True)
class SummaryRow:
    """Calls of one kind, group size and size bucket, on one rank (or merged: ``rank`` None).

    ``bucket_low_bytes <= bytes < bucket_high_bytes`` for every call counted (both 0 for 0-byte
    calls); ``total_us`` is the sum of the measured durations, ``None`` when no call of the row
    has one; ``ranks`` is 1 for a rank's row, the number of ranks with the key for a merged row.
    """

    rank: int | None
    kind: str
    group_size: int
    bucket_low_bytes: int
    bucket_high_bytes: int
    calls: int
    total_bytes: int
    total_us: float | None
    ranks: int = 1

    @property
    def bucket(self) -> str:
        return bucket_label(self.bucket_low_bytes, self.bucket_high_bytes)

    def to_json(self) -> dict[str, Any]:
        """The row as a JSON object (with the bucket's label as ``bucket``)."""
        return {"rank": self.rank, "kind": self.kind, "group_size": self.group_size,
                "bucket": self.bucket, "bucket_low_bytes": self.bucket_low_bytes,
                "bucket_high_bytes": self.bucket_high_bytes, "calls": self.calls,
                "total_bytes": self.total_bytes, "total_us": self.total_us,
                "ranks": self.ranks}


def _key(kind: str, group_size: int, low: int) -> tuple[int, str, int, int]:
    return _KIND_ORDER.get(kind, len(KINDS)), kind, group_size, low


def summarize_calls(calls: Iterable[CallRecord]) -> list[SummaryRow]:
    """Per-rank rows for ``calls`` (any ranks), then the merged rows; see docs/trace.md.

    Rows are ordered by rank (merged last), then kind (as in :data:`KINDS`), group size and
    bucket.
    """
    per_rank: dict[tuple[int, tuple[int, str, int, int]], list[Any]] = {}
    for call in calls:
        if call.error is not None:
            continue
        low, _ = size_bucket(call.bytes)
        slot = per_rank.setdefault((call.rank, _key(call.kind, call.group_size, low)),
                                   [0, 0, None])
        slot[0] += 1
        slot[1] += call.bytes
        if call.duration_us is not None:
            slot[2] = (slot[2] or 0.0) + call.duration_us
    rows: list[SummaryRow] = []
    merged: dict[tuple[int, str, int, int], list[Any]] = {}
    for (rank, key), (count, total, us) in sorted(per_rank.items()):
        _, kind, group_size, low = key
        rows.append(SummaryRow(rank, kind, group_size, low, 2 * low, count, total, us))
        slot = merged.setdefault(key, [0, 0, None, 0])
        slot[0] = max(slot[0], count)
        slot[1] = max(slot[1], total)
        if us is not None:
            slot[2] = us if slot[2] is None else max(slot[2], us)
        slot[3] += 1
    for key, (count, total, us, ranks) in sorted(merged.items()):
        _, kind, group_size, low = key
        rows.append(SummaryRow(None, kind, group_size, low, 2 * low, count, total, us, ranks))
    return rows


def summarize(trace: Trace) -> list[SummaryRow]:
    """The summary rows of ``trace``: one per rank and key, then the merged ones.

    >>> from collsynth.trace.records import CallRecord, RankTrace, Trace, TraceHeader
    >>> def call(rank, seq, nbytes):
    ...     return CallRecord(rank, seq, "allreduce", "all_reduce", nbytes, "float32", "sum",
    ...                       (0, 1), 2, None, None, False, None, None, None, None, None, {})
    >>> def rank_trace(rank, sizes):
    ...     header = TraceHeader(rank, 2, "gloo", "nccl-tests", "h", 1, "2.13", 0.0,
    ...                          False, False, None)
    ...     return RankTrace(f"rank-{rank}", header, tuple(call(rank, i, n)
    ...                                                    for i, n in enumerate(sizes)))
    >>> rows = summarize(Trace("t", (rank_trace(0, [4096, 5000]), rank_trace(1, [4096]))))
    >>> for r in rows:
    ...     print(r.rank, r.bucket, r.calls, r.total_bytes, r.ranks)
    0 4 KiB-8 KiB 2 9096 1
    1 4 KiB-8 KiB 1 4096 1
    None 4 KiB-8 KiB 2 9096 2
    """
    return summarize_calls(trace.calls())


def format_summary(rows: Iterable[SummaryRow]) -> str:
    """``rows`` as an aligned text table (``rank`` ``all`` for merged rows; ``time`` in
    milliseconds, ``-`` without measurements)."""
    header = ("rank", "kind", "group", "size", "calls", "bytes", "time_ms", "ranks")
    table = [header]
    for row in rows:
        table.append((
            "all" if row.rank is None else str(row.rank), row.kind, str(row.group_size),
            row.bucket, str(row.calls), format_bytes(row.total_bytes),
            "-" if row.total_us is None else f"{row.total_us / 1000:.3f}", str(row.ranks)))
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    left = {1, 3}
    lines = ["  ".join(cell.ljust(widths[i]) if i in left else cell.rjust(widths[i])
                       for i, cell in enumerate(r)).rstrip() for r in table]
    return "\n".join(lines)
