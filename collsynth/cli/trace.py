"""``collsynth trace``: look at the traces :mod:`collsynth.trace` writes.

::

    collsynth trace summarize DIR [--json] [--merged]

``summarize`` reads every ``DIR/rank-NNNNN.jsonl`` (checked: a bad file is an error naming the
file, the line and the field; exit 1) and prints one row per rank, kind, group size and size
bucket (powers of two of the nccl-tests bytes), with the number of calls, their total bytes and,
when the trace has durations, their total time; then the same rows merged over the ranks (each
figure the maximum over ranks, see :mod:`collsynth.trace.summary`). ``--merged`` prints only the
merged rows; ``--json`` prints a JSON object instead of the table.

To record a trace, see :mod:`collsynth.trace` (``python -m collsynth.trace.run SCRIPT.py``).
"""

from __future__ import annotations

import argparse
import json
import sys

from collsynth.errors import CollsynthError
from collsynth.trace.records import read_trace
from collsynth.trace.summary import MERGE_RULE, format_summary, summarize

__all__ = ["add_trace_parser", "run_summarize"]


def add_trace_parser(subparsers) -> argparse.ArgumentParser:
    """Add the ``trace`` subcommand (with ``summarize``) to ``subparsers``; return it."""
    trace = subparsers.add_parser(
        "trace", help="summarize traces of a PyTorch program's collectives",
        description="Work with the traces collsynth.trace records (one JSON-lines file per "
                    "rank; record one with 'COLLSYNTH_TRACE_DIR=DIR python -m "
                    "collsynth.trace.run SCRIPT.py').")
    actions = trace.add_subparsers(dest="trace_command", metavar="ACTION", required=True)
    summarize_parser = actions.add_parser(
        "summarize", help="calls and bytes by kind, group size and size bucket",
        description="Tabulate a trace directory: calls, total bytes (nccl-tests convention) and "
                    "total measured time by rank, kind, group size and power-of-two size "
                    f"bucket, then merged over ranks ({MERGE_RULE}).")
    summarize_parser.add_argument("directory", metavar="DIR", help="the trace directory")
    summarize_parser.add_argument("--json", action="store_true",
                                  help="machine-readable output")
    summarize_parser.add_argument("--merged", action="store_true",
                                  help="only the rows merged over ranks")
    summarize_parser.set_defaults(handler=run_summarize)
    return trace


def run_summarize(args: argparse.Namespace) -> int:
    """Run ``collsynth trace summarize``; return the exit code (0 ok, 1 bad trace)."""
    try:
        trace = read_trace(args.directory)
    except (CollsynthError, OSError) as exc:
        detail = exc.strerror + (f": {exc.filename}" if exc.filename else "") \
            if isinstance(exc, OSError) and exc.strerror else str(exc)
        print(f"collsynth: error: {' '.join(detail.split())}", file=sys.stderr, flush=True)
        return 1
    rows = summarize(trace)
    if args.merged:
        rows = [row for row in rows if row.rank is None]
    if args.json:
        print(json.dumps({"directory": trace.directory, "world_size": trace.world_size,
                          "ranks": list(trace.rank_numbers),
                          "missing_ranks": list(trace.missing_ranks),
                          "byte_convention": trace.byte_convention, "merged": MERGE_RULE,
                          "rows": [row.to_json() for row in rows]}, indent=2), flush=True)
        return 0
    calls = sum(len(r.calls) for r in trace.ranks)
    missing = f"; missing ranks: {', '.join(map(str, trace.missing_ranks))}" \
        if trace.missing_ranks else ""
    print(f"{trace.directory}: {len(trace.ranks)} of {trace.world_size} ranks, {calls} calls; "
          f"bytes in the {trace.byte_convention} convention; rank 'all': {MERGE_RULE}"
          f"{missing}", flush=True)
    print(format_summary(rows) if rows else "(no calls)", flush=True)
    return 0
