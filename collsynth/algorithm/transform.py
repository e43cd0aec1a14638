"""Algorithms built from other algorithms: the inverse of the dual reduction, and sequencing.

All return verified algorithms: a transform that produced a wrong schedule would be a bug, and a
bug must not leave the library silently.

Each keeps the representation of every step: a step whose sends are a tuple of
:class:`~collsynth.algorithm.model.Send` gives a tuple, a step stored as a
:class:`~collsynth.algorithm.arrays.SendBlock` gives a block, computed on its arrays without
building a ``Send`` per send.
"""

from __future__ import annotations

import numpy as np

from collsynth.algorithm.arrays import SendBlock
from collsynth.algorithm.model import Algorithm, Send, Step
from collsynth.algorithm.verify import verify
from collsynth.collective.model import Collective
from collsynth.errors import InvalidCollectiveError
from collsynth.topology.model import Topology

__all__ = ["invert_dual", "sequence", "refine"]


def invert_dual(dual: Algorithm, topology: Topology, collective: Collective) -> Algorithm:
    """Turn an algorithm for the non-combining dual (on the reversed topology) into one for the
    combining ``collective`` on ``topology``: steps in reverse order, every send reversed and
    made a reduce.

    Raises
    ------
    VerificationError
        If the dual algorithm is not a tree schedule (a rank received a chunk twice), which would
        count contributions twice once reversed.
    """
    steps = tuple(Step(step.rounds, _reversed_reduces(step.sends)) for step in reversed(dual.steps))
    rounds = sum(step.rounds for step in steps)
    algorithm = Algorithm(
        name=f"{collective.name}-{topology.name}-s{len(steps)}-r{rounds}-c{collective.chunk_factor}",
        topology=topology,
        collective=collective,
        steps=steps,
        provenance={**dict(dual.provenance), "via": "non-combining dual on the reversed topology"},
    )
    return verify(algorithm)


def sequence(first: Algorithm, second: Algorithm, collective: Collective, *, name: str) -> Algorithm:
    """Run ``first`` then ``second`` as one algorithm for ``collective``.

    The chunk numbers of both must be the chunk numbers of ``collective`` (as for reduce-scatter
    followed by allgather with the same chunk factor, giving allreduce).
    """
    if first.topology != second.topology:
        raise InvalidCollectiveError("cannot sequence algorithms on different topologies")
    if first.collective.num_chunks != collective.num_chunks or \
            second.collective.num_chunks != collective.num_chunks:
        raise InvalidCollectiveError(
            f"cannot sequence {first.collective.describe()} and {second.collective.describe()} "
            f"into {collective.describe()}: chunk counts differ"
        )
    algorithm = Algorithm(
        name=name,
        topology=first.topology,
        collective=collective,
        steps=first.steps + second.steps,
        provenance={"composed_of": [first.name, second.name],
                    "parts": [dict(first.provenance), dict(second.provenance)]},
    )
    return verify(algorithm)


def refine(algorithm: Algorithm, factor: int) -> Algorithm:
    """Split every chunk into ``factor`` pieces and every step into ``factor`` times its rounds.

    The result moves the same data in the same time: an instance (S, R, C) becomes
    (S, R * factor, C * factor), so rounds per chunk are unchanged. Used to give two algorithms
    a common chunk count before sequencing them.
    """
    if factor == 1:
        return algorithm
    collective = algorithm.collective.split(factor)
    steps = tuple(Step(step.rounds * factor, _refined(step.sends, factor))
                  for step in algorithm.steps)
    return verify(Algorithm(algorithm.name, algorithm.topology, collective, steps,
                            provenance={**dict(algorithm.provenance), "refined_by": factor}))


def _reversed_reduces(sends):
    """Every send reversed and made a reduce, sorted as ``Send`` objects sort (chunk, src, dst)."""
    if not isinstance(sends, SendBlock):
        return tuple(sorted(Send(s.chunk, s.dst, s.src, reduce=True) for s in sends))
    order = np.lexsort((sends.src, sends.dst, sends.chunk))  # new src = old dst
    return SendBlock(sends.chunk[order], sends.dst[order], sends.src[order],
                     np.ones(len(sends), dtype=bool))


def _refined(sends, factor: int):
    """Each send of chunk ``c`` becomes ``factor`` sends of chunks ``c * factor + i``."""
    if not isinstance(sends, SendBlock):
        return tuple(Send(s.chunk * factor + i, s.src, s.dst, s.reduce)
                     for s in sends for i in range(factor))
    pieces = np.arange(factor, dtype=np.int64)
    chunk = (sends.chunk.astype(np.int64)[:, None] * factor + pieces[None, :]).reshape(-1)
    return SendBlock(chunk, np.repeat(sends.src, factor), np.repeat(sends.dst, factor),
                     np.repeat(sends.reduce, factor))
