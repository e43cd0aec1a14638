"""Whether a runtime runs an MSCCL XML program on a call: its layout, size range and count.

The rules are docs/msccl-xml.md §4.2 (``inplace``/``outofplace``, ``minBytes``/``maxBytes``) and
§13 (the call's element count must be a multiple of ``nchunksperloop``). Sizes are the bytes
nccl-tests counts (§8.1: the allgather's output, the reduce-scatter's input).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable

from collsynth.runtimes.dialect import DIALECTS

if TYPE_CHECKING:
    from collsynth.export.program import Program

__all__ = ["MSCCL_DEFAULT_MAX_BYTES", "count_fits", "in_size_range", "runs_on_call",
           "selected_program"]

#: msccl's ``maxBytes`` when a file gives none (§4.2).
MSCCL_DEFAULT_MAX_BYTES = 128 * 1024 * 1024

#: Collectives whose runtime byte count is the API count times the rank count.
_COUNT_TIMES_RANKS = ("allgather", "reduce_scatter", "alltoall")


def count_fits(size_bytes: int, element_size: int | None, nchunksperloop: int | None, *,
               runtime: str = "msccl", collective: str = "allreduce", ranks: int = 1) -> bool:
    """Whether a call of ``size_bytes`` has an element count the runtime runs a program with
    ``nchunksperloop`` on.

    msccl and rccl require ``count x mult`` (the elements of the larger buffer,
    ``size_bytes / element_size``) to be a multiple of ``nchunksperloop`` (§13.1, §13.2);
    msccl-executor requires the API's ``count`` itself to be one
    (``mscclInternalSchedulerSelectAlgo``): for allgather, reduce-scatter and alltoall that is
    the elements divided by the rank count. An unknown element size is assumed to fit.

    >>> count_fits(4096, 4, 8), count_fits(4100, 4, 8)
    (True, False)
    >>> count_fits(4 * 8 * 3, 4, 8, runtime="msccl-executor", collective="allgather", ranks=8)
    False
    """
    if size_bytes < 1:
        return False
    if nchunksperloop is None or element_size is None:
        return True
    if size_bytes % element_size:
        return False
    count = size_bytes // element_size
    if runtime == "msccl-executor" and collective in _COUNT_TIMES_RANKS:
        if count % ranks:
            return False
        count //= ranks
    return count % nchunksperloop == 0


def in_size_range(program: "Program", size_bytes: int, runtime: str) -> bool:
    """Whether ``size_bytes`` lies in the program's ``minBytes``-``maxBytes`` range as
    ``runtime`` reads it: msccl's bound is exclusive (``size < maxBytes``, 128 MiB when absent),
    rccl's and msccl-executor's inclusive, with 0 for no limit (§4.2)."""
    low = program.min_bytes or 0
    if size_bytes < low:
        return False
    if not DIALECTS[runtime].max_bytes_zero_is_unlimited:  # msccl: exclusive, 0 is never
        high = MSCCL_DEFAULT_MAX_BYTES if program.max_bytes is None else program.max_bytes
        return size_bytes < high
    return not program.max_bytes or size_bytes <= program.max_bytes


def runs_on_call(program: "Program", size_bytes: int, *, runtime: str, collective: str,
                 in_place: bool, element_size: int | None = None) -> bool:
    """Whether ``runtime`` runs ``program`` for a ``collective`` call of ``size_bytes`` on as
    many ranks as the program has: its collective, its layout (msccl: ``inplace`` 1 only for
    in-place calls, 0 only for out-of-place ones, either for an alltoall; rccl and
    msccl-executor: the flag of the call's layout), its size range and its chunk count (:func:`count_fits`). ``collective`` is
    collsynth's name (``reduce_scatter``), compared with the runtime's spelling of ``coll``."""
    if program.coll != DIALECTS[runtime].coll_name(collective):
        return False
    if runtime == "msccl" and collective == "alltoall":
        layout_ok = True  # msccl does not compare the layout of an alltoall (§13.1)
    elif runtime == "msccl":
        layout_ok = bool(program.inplace) == in_place
    else:
        layout_ok = bool(program.inplace if in_place else program.outofplace)
    return layout_ok and in_size_range(program, size_bytes, runtime) and count_fits(
        size_bytes, element_size, program.nchunksperloop, runtime=runtime,
        collective=collective, ranks=program.ngpus)


def selected_program(programs: Iterable["Program"], size_bytes: int, *, runtime: str,
                     collective: str, in_place: bool, element_size: int | None = None
                     ) -> "Program | None":
    """The first of ``programs`` (in the order the runtime loaded them) it runs for the call
    (:func:`runs_on_call`), ``None`` when it runs its own algorithms. A set a scheduler ships
    (one program per size range) has ranges that do not overlap, so the order does not matter
    there."""
    for program in programs:
        if runs_on_call(program, size_bytes, runtime=runtime, collective=collective,
                        in_place=in_place, element_size=element_size):
            return program
    return None
