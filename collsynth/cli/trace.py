"""``collsynth trace summarize``: calls, bytes and time of a trace (:mod:`collsynth.trace`) by
rank, kind, group size and size bucket, then merged over the ranks (:mod:`collsynth.trace.summary`).
"""

from __future__ import annotations

import argparse
import json

from collsynth.cli.common import EXIT_OK, out, path_argument
from collsynth.errors import shown_path
from collsynth.trace.records import read_trace
from collsynth.trace.summary import MERGE_RULE, format_summary, summarize

__all__ = ["register", "run_summarize"]


#: Missing ranks named one by one in the summary line; the rest are counted (--json lists all).
_SHOWN_MISSING = 16

def register(subparsers) -> None:
    """Add ``trace`` and its actions (``summarize``) to ``subparsers`` (from ``add_subparsers``)."""
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
    summarize_parser.add_argument("directory", type=path_argument, metavar="DIR",
                                  help="the trace directory")
    summarize_parser.add_argument("--json", action="store_true",
                                  help="machine-readable output")
    summarize_parser.add_argument("--merged", action="store_true",
                                  help="only the rows merged over ranks")
    summarize_parser.set_defaults(handler=run_summarize)


def run_summarize(args: argparse.Namespace) -> int:
    """Run ``collsynth trace summarize``; return 0 (a bad trace raises, naming the file, the line
    and the field)."""
    trace = read_trace(args.directory)
    rows = summarize(trace)
    if args.merged:
        rows = [row for row in rows if row.rank is None]
    if args.json:
        out(json.dumps({"directory": trace.directory, "world_size": trace.world_size,
                        "ranks": list(trace.rank_numbers),
                        "missing_ranks": list(trace.missing_ranks),
                        "byte_convention": trace.byte_convention, "merged": MERGE_RULE,
                        "rows": [row.to_json() for row in rows]}, indent=2))
        return EXIT_OK
    calls = sum(len(r.calls) for r in trace.ranks)
    absent = trace.missing_ranks
    # The first few by number, the rest counted: a header claiming 2^20 ranks made this one
    # line 8 MB long.
    shown = ", ".join(map(str, absent[:_SHOWN_MISSING])) + (
        f" and {len(absent) - _SHOWN_MISSING} more" if len(absent) > _SHOWN_MISSING else "")
    missing = f"; missing ranks: {shown}" if absent else ""
    out(f"{shown_path(trace.directory)}"
        f": {len(trace.ranks)} of {trace.world_size} ranks, {calls} calls; "
        f"bytes in the {trace.byte_convention} convention; rank 'all': {MERGE_RULE}{missing}")
    out(format_summary(rows) if rows else "(no calls)")
    return EXIT_OK
