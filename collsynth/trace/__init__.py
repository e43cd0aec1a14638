"""Trace the collectives a PyTorch program issues: kind, size, group, dtype, call site.

The details (formats, conventions, rules) are in docs/trace.md.
"""

from collsynth.trace.records import (
    BYTE_CONVENTIONS,
    KINDS,
    CallRecord,
    RankTrace,
    Trace,
    TraceHeader,
    read_rank_file,
    read_trace,
)
from collsynth.trace.summary import SummaryRow, format_summary, summarize, summarize_calls
from collsynth.trace.tracer import (
    TRACED_FUNCTIONS,
    TraceOptions,
    Tracer,
    TracingError,
    average_allreduce_hook,
    trace_ddp,
    tracing,
)

__all__ = [
    "tracing",
    "Tracer",
    "TraceOptions",
    "TracingError",
    "trace_ddp",
    "average_allreduce_hook",
    "TRACED_FUNCTIONS",
    "read_trace",
    "read_rank_file",
    "Trace",
    "RankTrace",
    "TraceHeader",
    "CallRecord",
    "KINDS",
    "BYTE_CONVENTIONS",
    "summarize",
    "summarize_calls",
    "format_summary",
    "SummaryRow",
]
