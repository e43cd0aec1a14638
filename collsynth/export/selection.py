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

__all__ = ["MSCCL_DEFAULT_MAX_BYTES", "byte_range", "count_fits", "in_size_range", "layouts",
           "runs_on_call", "selected_program"]

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


def byte_range(program: "Program", runtime: str) -> tuple[int, int | None, bool]:
    """``(low, high, inclusive)``: the sizes ``runtime`` runs ``program`` for, as it reads
    ``minBytes`` and ``maxBytes`` (§4.2): msccl's upper bound is exclusive and 128 MiB when
    absent; rccl's and msccl-executor's inclusive, ``high`` ``None`` (no limit) for 0."""
    low = program.min_bytes or 0
    if not DIALECTS[runtime].max_bytes_zero_is_unlimited:  # msccl: exclusive, 0 is never
        return low, MSCCL_DEFAULT_MAX_BYTES if program.max_bytes is None \
            else program.max_bytes, False
    return low, program.max_bytes or None, True


def in_size_range(program: "Program", size_bytes: int, runtime: str) -> bool:
    """Whether ``size_bytes`` lies in the program's range (:func:`byte_range`)."""
    low, high, inclusive = byte_range(program, runtime)
    if size_bytes < low:
        return False
    return high is None or (size_bytes <= high if inclusive else size_bytes < high)


def layouts(program: "Program", runtime: str, collective: str) -> tuple[str, ...]:
    """The call layouts (``"out-of-place"``, ``"in-place"``) ``runtime`` runs ``program`` for
    (§4.2, §13): msccl's ``inplace`` 1 only in place, 0 only out of place, either for an
    alltoall; rccl and msccl-executor: each layout whose flag is set."""
    if runtime == "msccl":
        if collective == "alltoall":  # msccl does not compare an alltoall's layout (§13.1)
            return ("out-of-place", "in-place")
        return ("in-place",) if program.inplace else ("out-of-place",)
    return tuple(h for h, on in (("out-of-place", program.outofplace),
                                 ("in-place", program.inplace)) if on)


def runs_on_call(program: "Program", size_bytes: int, *, runtime: str, collective: str,
                 in_place: bool, element_size: int | None = None) -> bool:
    """Whether ``runtime`` runs ``program`` for a ``collective`` call of ``size_bytes`` on as
    many ranks as the program has: its collective, its layout (msccl: ``inplace`` 1 only for
    in-place calls, 0 only for out-of-place ones, either for an alltoall; rccl and
    msccl-executor: the flag of the call's layout), its size range and its chunk count (:func:`count_fits`). ``collective`` is
    collsynth's name (``reduce_scatter``), compared with the runtime's spelling of ``coll``."""
    if program.coll != DIALECTS[runtime].coll_name(collective):
        return False
    layout_ok = ("in-place" if in_place else "out-of-place") in layouts(program, runtime,
                                                                        collective)
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
