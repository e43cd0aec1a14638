"""The :class:`Collective` value: which ranks hold which chunks before, and must hold after.

A collective is a list of *chunks*. Chunk ``c`` is one buffer-sized piece of data (for a
combining collective: one buffer address whose final value is a reduction).

* ``precondition[c]``: the ranks that hold chunk ``c`` at the start. For a *non-combining*
  collective each of them holds the whole chunk. For a *combining* collective each of them holds
  its own *contribution*, and the chunk's final value is the reduction (sum) of all of them.
* ``postcondition[c]``: the ranks that must hold the final value of chunk ``c`` at the end.

``chunk_factor`` records how many pieces each chunk of the base collective was split into
(``chunks=C`` in the CLI); the *rounds per chunk* of an algorithm is ``rounds / chunk_factor``, so
that it measures time in units of one base chunk's transfer time. After ``split(C)`` base chunk
``b`` becomes chunks ``b*C .. b*C + C - 1``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping

from collsynth.errors import InputTooLargeError, InvalidCollectiveError
from collsynth.topology.model import MAX_RANKS

__all__ = ["Collective", "MAX_CHUNKS", "MAX_RANKS", "check_size"]

#: Largest number of chunks a collective may have; refused before any work.
MAX_CHUNKS = 1 << 22


def check_size(name: str, num_ranks: object, chunks_per_rank: int = 1) -> int:
    """``num_ranks`` when it is a whole number from 1 to :data:`MAX_RANKS` (the largest
    topology) and ``num_ranks * chunks_per_rank`` chunks are at most :data:`MAX_CHUNKS`;
    called by every constructor before it builds a condition per chunk.

    Raises
    ------
    InvalidCollectiveError
        Not a whole number >= 1.
    InputTooLargeError
        Above either bound, with the figure (``allgather(10**9)`` used to build a billion sets).

    >>> check_size("alltoall", 4096, 4096)
    Traceback (most recent call last):
    ...
    collsynth.errors.InputTooLargeError: alltoall of 4096 ranks has 16777216 chunks, more than \
the 4194304 a collective may have
    """
    if isinstance(num_ranks, bool) or not isinstance(num_ranks, int) or num_ranks < 1:
        raise InvalidCollectiveError(f"collective {name!r}: num_ranks = {num_ranks!r}; expected "
                                     "a whole number >= 1")
    if num_ranks > MAX_RANKS:
        raise InputTooLargeError(f"{name} of {num_ranks} ranks: more than the {MAX_RANKS} ranks "
                                 "of the largest topology collsynth accepts")
    if num_ranks * chunks_per_rank > MAX_CHUNKS:
        raise InputTooLargeError(f"{name} of {num_ranks} ranks has {num_ranks * chunks_per_rank} "
                                 f"chunks, more than the {MAX_CHUNKS} a collective may have")
    return num_ranks


@dataclass(frozen=True)
class Collective:
    """Pre- and postconditions over (rank, chunk).

    Parameters
    ----------
    name:
        The collective's kind (``"allgather"``, ``"reduce_scatter"``, ...) or a custom name.
    num_ranks:
        Number of ranks it runs on.
    precondition, postcondition:
        One frozenset of ranks per chunk (see the module docstring).
    combining:
        True when a chunk's final value is the reduction of the precondition ranks' contributions.
    chunk_factor:
        How many pieces each base chunk was split into.
    roots:
        Root ranks of rooted collectives (broadcast, reduce, gather, scatter), else ``()``.

    Examples
    --------
    >>> from collsynth.collective import allgather
    >>> ag = allgather(4)
    >>> ag.num_chunks, sorted(ag.precondition[2]), sorted(ag.postcondition[2])
    (4, [2], [0, 1, 2, 3])
    >>> ag.split(2).num_chunks, ag.split(2).chunk_factor
    (8, 2)
    """

    name: str
    num_ranks: int
    precondition: tuple[frozenset[int], ...]
    postcondition: tuple[frozenset[int], ...]
    combining: bool = False
    chunk_factor: int = 1
    roots: tuple[int, ...] = ()
    metadata: Mapping[str, object] = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        for role in ("precondition", "postcondition"):  # said here, not as "not iterable"
            conditions = getattr(self, role)
            if not isinstance(conditions, (str, bytes)) and isinstance(conditions, Iterable):
                conditions = tuple(conditions)
                object.__setattr__(self, role, conditions)
            if isinstance(conditions, (str, bytes)) or not isinstance(conditions, tuple) or any(
                    isinstance(c, (str, bytes)) or not isinstance(c, Iterable)
                    for c in conditions):
                shown = repr(conditions)
                raise InvalidCollectiveError(
                    f"collective {self.name!r}: {role} = {shown[:60]}; expected one set of "
                    "ranks per chunk")
        object.__setattr__(self, "precondition", tuple(frozenset(p) for p in self.precondition))
        object.__setattr__(self, "postcondition", tuple(frozenset(p) for p in self.postcondition))
        object.__setattr__(self, "roots", tuple(self.roots))
        n = self.num_ranks
        check_size(self.name, n, 0)
        if len(self.precondition) != len(self.postcondition):
            raise InvalidCollectiveError(
                f"collective {self.name!r}: {len(self.precondition)} preconditions but "
                f"{len(self.postcondition)} postconditions"
            )
        if not self.precondition:
            raise InvalidCollectiveError(f"collective {self.name!r} has no chunks")
        if len(self.precondition) > MAX_CHUNKS:
            raise InputTooLargeError(
                f"collective {self.name!r}: {len(self.precondition)} chunks is more than "
                f"{MAX_CHUNKS}"
            )
        if not isinstance(self.chunk_factor, int) or self.chunk_factor < 1:
            raise InvalidCollectiveError(
                f"collective {self.name!r}: chunk_factor = {self.chunk_factor!r}; expected >= 1"
            )
        checked: set[int] = set()  # ids of sets already checked: allgather shares one of n ranks
        for chunk, (pre, post) in enumerate(zip(self.precondition, self.postcondition)):
            for role, ranks in (("precondition", pre), ("postcondition", post)):
                if id(ranks) in checked:
                    continue
                checked.add(id(ranks))
                bad = sorted(r for r in ranks if not isinstance(r, int) or not 0 <= r < n)
                if bad:
                    raise InvalidCollectiveError(
                        f"collective {self.name!r}: chunk {chunk} {role} names rank(s) {bad}; "
                        f"ranks are 0..{n - 1}"
                    )
            if not pre:
                raise InvalidCollectiveError(
                    f"collective {self.name!r}: chunk {chunk} has an empty precondition (no rank "
                    "starts with it)"
                )
        for root in self.roots:
            if not isinstance(root, int) or not 0 <= root < n:
                raise InvalidCollectiveError(
                    f"collective {self.name!r}: root {root!r} is not a rank 0..{n - 1}"
                )

    @property
    def num_chunks(self) -> int:
        """Number of chunks (after splitting)."""
        return len(self.precondition)

    def holds_initially(self, rank: int, chunk: int) -> bool:
        """True when ``rank`` starts with ``chunk`` (its contribution, if combining)."""
        return rank in self.precondition[chunk]

    def needs(self, rank: int, chunk: int) -> bool:
        """True when ``rank`` must end with the final value of ``chunk``."""
        return rank in self.postcondition[chunk]

    def base_chunk(self, chunk: int) -> int:
        """The chunk of the unsplit collective that ``chunk`` is a piece of."""
        return chunk // self.chunk_factor

    def split(self, chunks: int) -> "Collective":
        """Split every chunk into ``chunks`` pieces (``chunk_factor`` is multiplied)."""
        if not isinstance(chunks, int) or chunks < 1:
            raise InvalidCollectiveError(f"chunks = {chunks!r}; expected a positive integer")
        if chunks == 1:
            return self
        if self.num_chunks * chunks > MAX_CHUNKS:
            raise InputTooLargeError(
                f"collective {self.name!r} split {chunks} ways has {self.num_chunks * chunks} "
                f"chunks, more than {MAX_CHUNKS}"
            )
        return Collective(
            name=self.name,
            num_ranks=self.num_ranks,
            precondition=tuple(p for p in self.precondition for _ in range(chunks)),
            postcondition=tuple(p for p in self.postcondition for _ in range(chunks)),
            combining=self.combining,
            chunk_factor=self.chunk_factor * chunks,
            roots=self.roots,
            metadata=self.metadata,
        )

    def describe(self) -> str:
        """A short label such as ``allgather(n=8, chunks=2)`` or ``broadcast(n=8, root=0)``."""
        parts = [f"n={self.num_ranks}"]
        if self.roots:
            label = "root" if len(self.roots) == 1 else "roots"
            parts.append(f"{label}={','.join(map(str, self.roots))}")
        if self.chunk_factor > 1:
            parts.append(f"chunks={self.chunk_factor}")
        return f"{self.name}({', '.join(parts)})"

    def __repr__(self) -> str:
        return f"Collective({self.describe()}, num_chunks={self.num_chunks}, combining={self.combining})"


def from_conditions(
    name: str,
    num_ranks: int,
    num_chunks: int,
    precondition: Iterable[tuple[int, int]] | None = None,
    postcondition: Iterable[tuple[int, int]] | None = None,
    *,
    combining: bool = False,
    roots: tuple[int, ...] = (),
) -> Collective:
    """Build a collective from (rank, chunk) pairs."""
    check_size(name, num_ranks, 0)
    if isinstance(num_chunks, bool) or not isinstance(num_chunks, int) or num_chunks < 1:
        raise InvalidCollectiveError(f"collective {name!r}: num_chunks = {num_chunks!r}; "
                                     "expected a whole number >= 1")
    if num_chunks > MAX_CHUNKS:
        raise InputTooLargeError(f"collective {name!r}: {num_chunks} chunks is more than "
                                 f"{MAX_CHUNKS}")
    pre: list[set[int]] = [set() for _ in range(num_chunks)]
    post: list[set[int]] = [set() for _ in range(num_chunks)]
    for target, pairs in ((pre, precondition or ()), (post, postcondition or ())):
        for rank, chunk in pairs:
            if not 0 <= chunk < num_chunks:
                raise InvalidCollectiveError(
                    f"collective {name!r}: chunk {chunk} out of range 0..{num_chunks - 1}"
                )
            target[chunk].add(rank)
    return Collective(name, num_ranks, tuple(map(frozenset, pre)), tuple(map(frozenset, post)),
                      combining=combining, roots=roots)
