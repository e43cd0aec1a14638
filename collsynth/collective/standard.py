"""The standard collectives, as pre/postconditions over (rank, chunk).

The details: ``docs/collectives.md``, section "The standard collectives".
"""

from __future__ import annotations

from typing import Callable, Sequence

from collsynth.collective.kinds import canonical_name
from collsynth.collective.model import Collective, check_size
from collsynth.errors import InvalidCollectiveError, UnknownNameError

__all__ = [
    "allgather",
    "alltoall",
    "broadcast",
    "scatter",
    "gather",
    "reduce",
    "reduce_scatter",
    "allreduce",
    "is_standard_allreduce",
    "multiroot_broadcast",
    "multiroot_scatter",
    "multiroot_gather",
    "STANDARD_COLLECTIVES",
    "ROOTED_COLLECTIVES",
    "MULTIROOT_COLLECTIVES",
    "standard_collective",
    "standard_name",
    "check_standard_conditions",
]


def _everyone(n: int) -> frozenset[int]:
    return frozenset(range(n))


def _check_root(n: int, root: int, name: str) -> None:
    if not isinstance(root, int) or isinstance(root, bool) or not 0 <= root < n:
        raise InvalidCollectiveError(f"{name}: root {root!r} is not a rank 0..{n - 1}")


def _check_roots(n: int, roots: Sequence[int], name: str) -> tuple[int, ...]:
    roots = tuple(roots)
    if not roots:
        raise InvalidCollectiveError(f"{name}: needs at least one root")
    for root in roots:
        _check_root(n, root, name)
    if len(set(roots)) != len(roots):
        raise InvalidCollectiveError(f"{name}: roots {list(roots)} repeat a rank")
    return roots


def allgather(n: int) -> Collective:
    """Every rank's chunk to every rank."""
    check_size("allgather", n)
    return Collective("allgather", n, tuple(frozenset({r}) for r in range(n)), (_everyone(n),) * n)


def alltoall(n: int) -> Collective:
    """Chunk ``src*n + dst`` from ``src`` to ``dst`` (including ``src == dst``, already in place)."""
    check_size("alltoall", n, n if isinstance(n, int) else 1)
    pre = tuple(frozenset({c // n}) for c in range(n * n))
    post = tuple(frozenset({c % n}) for c in range(n * n))
    return Collective("alltoall", n, pre, post)


def broadcast(n: int, root: int = 0) -> Collective:
    """One chunk from ``root`` to every rank."""
    check_size("broadcast", n)
    _check_root(n, root, "broadcast")
    return Collective("broadcast", n, (frozenset({root}),), (_everyone(n),), roots=(root,))


def scatter(n: int, root: int = 0) -> Collective:
    """Chunk ``r`` from ``root`` to rank ``r``."""
    check_size("scatter", n)
    _check_root(n, root, "scatter")
    return Collective("scatter", n, (frozenset({root}),) * n,
                      tuple(frozenset({r}) for r in range(n)), roots=(root,))


def gather(n: int, root: int = 0) -> Collective:
    """Chunk ``r`` from rank ``r`` to ``root``."""
    check_size("gather", n)
    _check_root(n, root, "gather")
    return Collective("gather", n, tuple(frozenset({r}) for r in range(n)),
                      (frozenset({root}),) * n, roots=(root,))


def reduce(n: int, root: int = 0) -> Collective:
    """The sum of every rank's buffer, to ``root`` (combining)."""
    check_size("reduce", n)
    _check_root(n, root, "reduce")
    return Collective("reduce", n, (_everyone(n),), (frozenset({root}),), combining=True,
                      roots=(root,))


def reduce_scatter(n: int) -> Collective:
    """Chunk ``r`` of the sum of every rank's buffer, to rank ``r`` (combining)."""
    check_size("reduce_scatter", n)
    return Collective("reduce_scatter", n, (_everyone(n),) * n,
                      tuple(frozenset({r}) for r in range(n)), combining=True)


def allreduce(n: int) -> Collective:
    """The sum of every rank's buffer, to every rank (combining; one base chunk)."""
    check_size("allreduce", n)
    return Collective("allreduce", n, (_everyone(n),), (_everyone(n),), combining=True)


def multiroot_broadcast(n: int, roots: Sequence[int]) -> Collective:
    """Chunk ``i`` from ``roots[i]`` to every rank."""
    check_size("multiroot_broadcast", n)
    roots = _check_roots(n, roots, "multiroot_broadcast")
    return Collective("multiroot_broadcast", n, tuple(frozenset({r}) for r in roots),
                      (_everyone(n),) * len(roots), roots=roots)


def multiroot_scatter(n: int, roots: Sequence[int]) -> Collective:
    """Chunk ``r*k + i`` from ``roots[i]`` to rank ``r`` (``k = len(roots)``)."""
    check_size("multiroot_scatter", n)
    roots = _check_roots(n, roots, "multiroot_scatter")
    k = len(roots)
    check_size("multiroot_scatter", n, k)
    return Collective("multiroot_scatter", n, tuple(frozenset({roots[c % k]}) for c in range(n * k)),
                      tuple(frozenset({c // k}) for c in range(n * k)), roots=roots)


def multiroot_gather(n: int, roots: Sequence[int]) -> Collective:
    """Chunk ``r*k + i`` from rank ``r`` to ``roots[i]`` (``k = len(roots)``)."""
    check_size("multiroot_gather", n)
    roots = _check_roots(n, roots, "multiroot_gather")
    k = len(roots)
    check_size("multiroot_gather", n, k)
    return Collective("multiroot_gather", n, tuple(frozenset({c // k}) for c in range(n * k)),
                      tuple(frozenset({roots[c % k]}) for c in range(n * k)), roots=roots)


#: Collectives that take only the number of ranks.
STANDARD_COLLECTIVES: dict[str, Callable[[int], Collective]] = {
    "allgather": allgather,
    "alltoall": alltoall,
    "reduce_scatter": reduce_scatter,
    "allreduce": allreduce,
}
#: Collectives that take one root (default 0).
ROOTED_COLLECTIVES: dict[str, Callable[[int, int], Collective]] = {
    "broadcast": broadcast,
    "scatter": scatter,
    "gather": gather,
    "reduce": reduce,
}
#: Collectives that take a list of roots.
MULTIROOT_COLLECTIVES: dict[str, Callable[[int, Sequence[int]], Collective]] = {
    "multiroot_broadcast": multiroot_broadcast,
    "multiroot_scatter": multiroot_scatter,
    "multiroot_gather": multiroot_gather,
}

def standard_names() -> list[str]:
    """Every standard collective name."""
    return sorted({*STANDARD_COLLECTIVES, *ROOTED_COLLECTIVES, *MULTIROOT_COLLECTIVES})


def standard_collective(
    name: str, num_ranks: int, *, root: int | None = None, roots: Sequence[int] | None = None
) -> Collective:
    """Look up a standard collective by name (case-insensitive; ``-`` and ``_`` both accepted).

    ``root`` is used by rooted collectives (default 0); ``roots`` by multi-root ones (required).

    >>> standard_collective("Reduce-Scatter", 4).combining
    True
    >>> standard_collective("broadcast", 4, root=2).roots
    (2,)
    """
    key = canonical_name(name)
    if key in STANDARD_COLLECTIVES:
        if root is not None or roots:
            raise InvalidCollectiveError(f"{key} takes no root")
        return STANDARD_COLLECTIVES[key](num_ranks)
    if key in ROOTED_COLLECTIVES:
        if roots:
            if len(roots) != 1:
                raise InvalidCollectiveError(
                    f"{key} takes one root; use multiroot_{key} for several")
            root = roots[0]
        return ROOTED_COLLECTIVES[key](num_ranks, 0 if root is None else root)
    if key in MULTIROOT_COLLECTIVES:
        if not roots:
            if root is None:
                raise InvalidCollectiveError(f"{key} needs roots (e.g. --root 0,4)")
            roots = (root,)
        return MULTIROOT_COLLECTIVES[key](num_ranks, roots)
    raise UnknownNameError(
        f"unknown collective {name!r}; valid names: {', '.join(standard_names())} "
        "(or a path to a custom collective JSON file)"
    )


def standard_name(name: str) -> str | None:
    """The standard collective ``name`` spells (any case, ``-`` or ``_``), or ``None``.

    >>> standard_name("All-Gather"), standard_name("reducescatter"), standard_name("pairs")
    ('allgather', 'reduce_scatter', None)
    """
    key = canonical_name(name)
    return key if key in standard_names() else None


def _same_sets(got: tuple[frozenset[int], ...], base: tuple[frozenset[int], ...],
               pieces: int, n: int) -> bool:
    """``got`` equals ``base`` split ``pieces`` ways (chunk ``c`` is a piece of base chunk
    ``c // pieces``), in time linear in the chunks rather than in their ranks: a set of ``n``
    ranks (a Collective holds only ranks ``0..n-1``) is everyone, so only its size is compared.
    (A 1024-rank allgather split 64 ways holds 67M ranks; split and compared in full, 9 s.)"""
    return all(len(a) == len(b) and (len(b) == n or a == b)
               for a, b in zip(got, (b for b in base for _ in range(pieces))))


def _first_difference(collective: Collective, base: Collective) -> str:
    """Where ``collective`` first departs from ``base`` split ``chunk_factor`` ways, in words."""
    pieces = collective.chunk_factor
    if collective.combining != base.combining:
        return (f"combining is {str(collective.combining).lower()}, expected "
                f"{str(base.combining).lower()}")
    if collective.num_chunks != base.num_chunks * pieces:
        return f"{collective.num_chunks} chunks, expected {base.num_chunks * pieces}"
    for c, (pre, post) in enumerate(zip(collective.precondition, collective.postcondition)):
        b = c // pieces
        for role, got, expected in (("pre", pre, base.precondition[b]),
                                    ("post", post, base.postcondition[b])):
            if not _same_sets((got,), (expected,), 1, collective.num_ranks):
                return f"chunk {c} {role} is {sorted(got)}, expected {sorted(expected)}"
    return "they differ"  # unreachable when called on collectives that differ


def check_standard_conditions(collective: Collective, *, source: str | None = None) -> str | None:
    """Check that a collective with a standard name has that collective's conditions; return
    the standard name (``None`` for a name that is not standard, which is not checked).

    A standard name means the standard collective everywhere: the exporters, the runtimes and
    the timing models act on the name, so an ``allgather`` whose postconditions were emptied,
    lost a rank or were renamed from another collective would be "verified" against the wrong
    conditions. The name is matched as :func:`standard_collective` matches it (any case, ``-``
    or ``_``); the conditions are compared with the standard ones split ``chunk_factor`` ways
    (with the collective's own roots for rooted and multi-root ones). ``source`` prefixes the
    message (a file name).

    >>> check_standard_conditions(allgather(4).split(2))
    'allgather'
    >>> check_standard_conditions(Collective("allgather", 2, (frozenset({0}), frozenset({1})),
    ...                                      (frozenset({0}), frozenset({1}))))
    Traceback (most recent call last):
    ...
    collsynth.errors.InvalidCollectiveError: collective 'allgather' does not have allgather's
    pre/postconditions on 2 ranks (chunk 0 post is [0], expected [0, 1]); ...

    Raises
    ------
    InvalidCollectiveError
        When the name is standard and the conditions (or roots) are not.
    """
    key = standard_name(collective.name)
    if key is None:
        return None
    where = f"{source}: " if source else ""
    n = collective.num_ranks
    roots = collective.roots
    try:
        if key in STANDARD_COLLECTIVES:
            if roots:
                raise InvalidCollectiveError(f"{key} has no root, got roots {list(roots)}")
            reference = STANDARD_COLLECTIVES[key](n)
        elif key in ROOTED_COLLECTIVES:
            if len(roots) != 1:
                raise InvalidCollectiveError(f"a {key} has exactly one root, got roots "
                                             f"{list(roots)}")
            reference = ROOTED_COLLECTIVES[key](n, roots[0])
        else:
            reference = MULTIROOT_COLLECTIVES[key](n, roots)
    except InvalidCollectiveError as exc:
        raise InvalidCollectiveError(f"{where}collective {collective.name!r}: {exc}") from exc
    pieces = collective.chunk_factor
    if (reference.combining != collective.combining
            or reference.num_chunks * pieces != collective.num_chunks
            or not _same_sets(collective.precondition, reference.precondition, pieces, n)
            or not _same_sets(collective.postcondition, reference.postcondition, pieces, n)):
        raise InvalidCollectiveError(
            f"{where}collective {collective.name!r} does not have {key}'s pre/postconditions on "
            f"{n} ranks ({_first_difference(collective, reference)}); a standard name means the "
            "standard collective: rename it to use it as a custom collective")
    return key


def is_standard_allreduce(collective: Collective) -> bool:
    """True for ``allreduce(n)`` split any number of ways (every rank contributes to and needs
    every chunk)."""
    everyone = frozenset(range(collective.num_ranks))
    return collective.combining and all(p == everyone for p in collective.precondition) and \
        all(p == everyone for p in collective.postcondition)
