"""Trace the collectives a PyTorch program issues: kind, size, group, dtype, call site.

In a script, around the part to trace (every rank runs it)::

    import collsynth.trace
    with collsynth.trace.tracing("trace/", record_durations=True):
        train()

For an unmodified script, run it through :mod:`collsynth.trace.run`, which reads the options
from the environment (``COLLSYNTH_TRACE_DIR`` is required)::

    COLLSYNTH_TRACE_DIR=trace/ torchrun --nproc-per-node 8 -m collsynth.trace.run train.py --lr 3e-4

Each rank writes ``trace/rank-NNNNN.jsonl`` (its global rank): a header line, then one line per
call of :data:`~collsynth.trace.tracer.TRACED_FUNCTIONS` (barrier, broadcast,
broadcast_object_list, all_reduce, reduce, all_gather, all_gather_into_tensor,
all_gather_single, reduce_scatter, reduce_scatter_tensor, reduce_scatter_single, all_to_all,
all_to_all_single, gather, scatter, send, recv, isend, irecv, batch_isend_irecv, and DDP's
_broadcast_coalesced). The exact schema, and the size convention of ``bytes`` (nccl-tests': an
allgather counts its output buffer, a reduce_scatter its input buffer...), is in
:mod:`collsynth.trace.records`; :func:`read_trace` reads it back, checked, and :func:`summarize`
/ ``collsynth trace summarize DIR`` tabulate it.

Tracing never changes what the calls do: each wrapper describes the call, calls torch's function
with the same arguments and returns its result (or re-raises its exception). The original
functions are restored when the block ends, however it ends.

DistributedDataParallel reduces gradients in C++, where no Python wrapper sees them: wrap the
model with :func:`trace_ddp` (a communication hook doing DDP's own averaging allreduce through
the Python collectives), or pass ``ddp=True`` to :func:`tracing` to have it registered on each
DDP model's first forward. :mod:`collsynth.trace.tracer` lists what stays invisible.

Overhead
--------
Measured on this 2-core machine with ``benchmarks/trace_overhead.py`` (a one-process gloo group,
``all_reduce`` of 16 float32 elements, 20000 calls per run, median over 7 interleaved runs): the
tracer adds about **15-20 us per call** (CPU time of the process; wall-clock 17 us when the
machine was otherwise idle, up to 40 us while other jobs kept both cores busy), to an all_reduce
that takes about 16 us alone. ``record_durations`` adds no measurable cost. The cost is a fixed
amount of Python per call (describing the tensors, finding the call site, one JSON line,
written in batches of 512), independent of the message size: negligible for the large
collectives of a training step, noticeable for thousands of tiny calls per second.
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
