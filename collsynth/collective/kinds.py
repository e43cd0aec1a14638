"""The registry of collective kinds: names and spellings, combining or not, roots, and the
nccl-tests size conventions (bus-bandwidth factor, base chunks per buffer), each defined here
once: every log reader, model and runner asks these functions.

Every module that turns a name into a kind asks here: benchmark logs (``all_reduce_perf``),
torch calls (``all_gather_into_tensor`` after the tracer's mapping), runtimes (``reducescatter``)
and users (``Reduce-Scatter``) all spell the same kinds differently.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction
from numbers import Real
from typing import Callable

from collsynth.errors import InvalidInstanceError, UnknownNameError
from collsynth.exact import exact_fraction

__all__ = ["CollectiveKind", "KINDS", "canonical_name", "collective_kind", "busbw_factor",
           "buffer_chunks", "base_chunk_bytes"]


def _whole(n: int) -> Fraction:
    return Fraction(1)


def _ring(n: int) -> Fraction:
    return Fraction(n - 1, n)


def _twice_ring(n: int) -> Fraction:
    return Fraction(2 * (n - 1), n)


@dataclass(frozen=True)
class CollectiveKind:
    """One kind of collective.

    ``busbw``: nccl-tests' ``busbw / algbw`` on ``n`` ranks. ``chunks``: how many base chunks
    (one rank's part) the nccl-tests ``size_bytes`` holds on ``n`` ranks (``None``: no
    convention). ``standard``: collsynth synthesizes it from its name alone.
    """

    name: str
    spellings: tuple[str, ...] = ()
    combining: bool = False
    roots: str = "none"                 # "none", "one" or "many"
    busbw: Callable[[int], Fraction] = _whole
    chunks: Callable[[int], int] | None = None
    standard: bool = True


KINDS: tuple[CollectiveKind, ...] = (
    # size = output buffer = n ranks' inputs.
    CollectiveKind("allgather", ("all_gather", "all_gather_base", "allgather_into_tensor"),
                   busbw=_ring, chunks=lambda n: n),
    # size = input buffer = n ranks' outputs.
    CollectiveKind("reduce_scatter", ("reducescatter", "reduce_scatter_base",
                                      "reduce_scatter_tensor"),
                   combining=True, busbw=_ring, chunks=lambda n: n),
    # size = the buffer, which is the base chunk.
    CollectiveKind("allreduce", ("all_reduce",), combining=True, busbw=_twice_ring,
                   chunks=lambda n: 1),
    # size = per-rank buffer = n per-pair blocks.
    CollectiveKind("alltoall", ("all_to_all", "all_to_all_single"), busbw=_ring,
                   chunks=lambda n: n),
    CollectiveKind("broadcast", ("bcast",), roots="one", chunks=lambda n: 1),
    CollectiveKind("reduce", (), combining=True, roots="one", chunks=lambda n: 1),
    # size = the root's buffer = one part per rank.
    CollectiveKind("gather", (), roots="one", busbw=_ring, chunks=lambda n: n),
    CollectiveKind("scatter", (), roots="one", busbw=_ring, chunks=lambda n: n),
    CollectiveKind("multiroot_broadcast", (), roots="many"),
    CollectiveKind("multiroot_scatter", (), roots="many"),
    CollectiveKind("multiroot_gather", (), roots="many"),
    # Benchmarked but not synthesized from a name.
    CollectiveKind("alltoallv", ("all_to_allv",), busbw=_ring, standard=False),
    CollectiveKind("hypercube", (), busbw=_ring, standard=False),
    CollectiveKind("sendrecv", (), standard=False),
    CollectiveKind("send", ("p2p",), standard=False),
)

_BY_NAME: dict[str, CollectiveKind] = {}
for _kind in KINDS:
    for _spelling in (_kind.name, *_kind.spellings):
        _BY_NAME[_spelling] = _kind


def canonical_name(name: str) -> str:
    """The kind's name for any spelling (any case, ``-`` or ``_``, a ``_perf`` benchmark
    suffix); an unknown name comes back normalised, not refused.

    >>> canonical_name("All-Reduce"), canonical_name("reducescatter"), canonical_name("all_gather_perf")
    ('allreduce', 'reduce_scatter', 'allgather')
    >>> canonical_name("pairs")
    'pairs'
    """
    key = str(name).strip().lower().replace("-", "_")
    key = re.sub(r"_perf(?:_mpi)?$", "", key)
    kind = _BY_NAME.get(key)
    return kind.name if kind is not None else key


def collective_kind(name: str) -> CollectiveKind:
    """The kind ``name`` spells.

    Raises
    ------
    UnknownNameError
        A name no kind has.

    >>> collective_kind("Reduce-Scatter").combining
    True
    """
    kind = _BY_NAME.get(canonical_name(name))
    if kind is None:
        raise UnknownNameError(f"unknown collective {name!r}; known: "
                               f"{', '.join(k.name for k in KINDS)}")
    return kind


def _ranks(num_ranks: int) -> int:
    if isinstance(num_ranks, bool) or not isinstance(num_ranks, int) or num_ranks < 1:
        raise InvalidInstanceError(f"num_ranks = {num_ranks!r}; expected a positive integer")
    return num_ranks


def busbw_factor(name: str, num_ranks: int) -> Fraction:
    """nccl-tests' ``busbw / algbw`` on ``num_ranks`` ranks: allreduce ``2(n-1)/n``; allgather,
    reduce_scatter, alltoall, gather, scatter ``(n-1)/n``; broadcast, reduce, sendrecv ``1``
    (nccl-tests' sendrecv reports busbw = algbw). On one rank the ``(n-1)`` kinds are 0, as
    nccl-tests prints them.

    Raises
    ------
    UnknownNameError
        A name no kind has (a caller that wants a default catches exactly this).
    InvalidInstanceError
        ``num_ranks`` < 1.

    >>> busbw_factor("allreduce", 8), busbw_factor("allgather", 8), busbw_factor("sendrecv", 8)
    (Fraction(7, 4), Fraction(7, 8), Fraction(1, 1))
    """
    return collective_kind(name).busbw(_ranks(num_ranks))


def buffer_chunks(name: str, num_ranks: int) -> int | None:
    """How many base chunks the nccl-tests ``size_bytes`` of ``name`` holds on ``num_ranks``
    ranks, or ``None`` when the kind has no such convention.

    >>> buffer_chunks("allgather", 8), buffer_chunks("allreduce", 8)
    (8, 1)
    """
    chunks = collective_kind(name).chunks
    return None if chunks is None else chunks(_ranks(num_ranks))


def base_chunk_bytes(collective_name: str, num_ranks: int, size_bytes: Real) -> Fraction:
    """The size of one base chunk, in bytes, of a collective called with ``size_bytes``
    (nccl-tests convention): ``size_bytes / buffer_chunks(...)`` (docs/timing.md has the table:
    the allgather's output buffer holds ``n`` base chunks, the allreduce's buffer one...).

    Raises
    ------
    UnknownNameError
        For a collective without a buffer convention.
    InvalidInstanceError
        For ``num_ranks < 1`` or a negative or non-finite size.

    >>> base_chunk_bytes("allgather", 4, 4096), base_chunk_bytes("All-Reduce", 4, 4096)
    (Fraction(1024, 1), Fraction(4096, 1))
    """
    kind = _BY_NAME.get(canonical_name(collective_name))
    if kind is None or kind.chunks is None:
        known = sorted(k.name for k in KINDS if k.chunks is not None)
        raise UnknownNameError(
            f"no buffer-size convention for collective {collective_name!r}; known: "
            f"{', '.join(known)}; price the base chunk size directly")
    return exact_fraction(size_bytes, "size_bytes") / kind.chunks(_ranks(num_ranks))
