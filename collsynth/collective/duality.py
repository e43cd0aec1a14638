"""Combining collectives through their non-combining duals.

A combining collective whose every chunk has exactly one destination (reduce, reduce-scatter) is
the time-reversal of a non-combining one on the reversed topology: reversing a broadcast tree
gives a reduction tree. :func:`non_combining_dual` is the reduction (the dual problem) and
:func:`collsynth.algorithm.invert_dual` the inverse that turns a dual algorithm back into one for
the original collective.

Precisely: combining chunk ``c`` with contributors ``P`` and single destination ``d`` becomes the
non-combining chunk ``c`` that starts on ``d`` and is needed by every rank in ``P``. An algorithm
that delivers it along a tree (each rank receives each chunk at most once) becomes, read backwards
on the reversed topology, one in which every contributor's value flows to ``d`` and each is added
exactly once.
"""

from __future__ import annotations

from collsynth.collective.model import Collective
from collsynth.errors import InvalidCollectiveError

__all__ = ["non_combining_dual", "has_non_combining_dual"]


def has_non_combining_dual(collective: Collective) -> bool:
    """True when ``collective`` is combining and each chunk has exactly one destination."""
    return collective.combining and all(len(post) == 1 for post in collective.postcondition)


def non_combining_dual(collective: Collective) -> Collective:
    """The non-combining collective whose time-reversal on the reversed topology is ``collective``.

    >>> from collsynth.collective import reduce_scatter
    >>> dual = non_combining_dual(reduce_scatter(4))
    >>> dual.combining, sorted(dual.precondition[1]), sorted(dual.postcondition[1])
    (False, [1], [0, 1, 2, 3])

    Raises
    ------
    InvalidCollectiveError
        When the collective is not combining, or a chunk has more than one destination (as in
        allreduce, which collsynth composes from reduce-scatter and allgather instead).
    """
    if not collective.combining:
        raise InvalidCollectiveError(f"{collective.describe()} is not combining; it has no dual")
    for chunk, post in enumerate(collective.postcondition):
        if len(post) != 1:
            raise InvalidCollectiveError(
                f"{collective.describe()}: chunk {chunk} has {len(post)} destinations; only "
                "collectives whose chunks each have one destination have a non-combining dual"
            )
    return Collective(
        name=f"dual({collective.name})",
        num_ranks=collective.num_ranks,
        precondition=collective.postcondition,
        postcondition=collective.precondition,
        combining=False,
        chunk_factor=collective.chunk_factor,
        roots=collective.roots,
        metadata={"dual_of": collective.name},
    )
