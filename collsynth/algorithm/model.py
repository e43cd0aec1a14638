"""The :class:`Algorithm` value: a k-synchronous schedule of chunk sends.

An algorithm runs in *steps*. Step ``t`` lasts ``rounds`` rounds; in it, every send reads the
sender's value as it was at the end of step ``t - 1`` and the receiver has the value at the end of
step ``t``. A link ``src -> dst`` of bandwidth ``b`` carries at most ``b * rounds`` sends in a step,
and a bandwidth group of limit ``L`` at most ``L * rounds`` over its links.

A :class:`Send` either *copies* (the receiver's value for that chunk becomes the sender's) or
*reduces* (the sender's value is added into the receiver's; combining collectives only).

The cost of an algorithm in the alpha-beta model is ``steps * alpha + rounds_per_chunk * size *
beta``, where ``size`` is the size of one base chunk (see :class:`~collsynth.collective.Collective`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from typing import Mapping

from collsynth.algorithm.arrays import SendBlock
from collsynth.algorithm.send import Send
from collsynth.collective.model import Collective
from collsynth.errors import InvalidInstanceError
from collsynth.topology.model import Topology

__all__ = ["Send", "Step", "Instance", "Algorithm"]


@dataclass(frozen=True)
class Step:
    """The sends of one step and the number of rounds (bandwidth multiplier) it lasts.

    ``sends`` is either a tuple of :class:`Send` or a
    :class:`~collsynth.algorithm.arrays.SendBlock` (the same sends stored as numpy arrays, for
    steps with millions of sends). Both are sequences of :class:`Send`; code that only iterates
    works with either, and the verifier and the transforms read a block's arrays directly. Two
    steps are equal when their rounds are and their sends are the same sends in the same order,
    whatever the representation (a step with a block hashes by the block's array contents).

    >>> Step(1, (Send(0, 0, 1),)).sends[0].dst
    1
    """

    rounds: int
    sends: "tuple[Send, ...] | SendBlock"


@dataclass(frozen=True)
class Instance:
    """What a synthesis call asks for.

    Parameters
    ----------
    steps:
        Number of synchronous steps (latency cost: one alpha per step).
    rounds:
        Total rounds over all steps (bandwidth cost); ``None`` means one round per step.
    chunks:
        How many pieces each base chunk is split into.
    extra_memory:
        Most scratch chunks a rank may hold at once (chunks neither in its pre- nor its
        postcondition), or ``None`` for no limit.

    >>> Instance(steps=3, rounds=7, chunks=6).rounds_per_chunk
    Fraction(7, 6)
    """

    steps: int
    rounds: int | None = None
    chunks: int = 1
    extra_memory: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.steps, int) or self.steps < 1:
            raise InvalidInstanceError(f"steps = {self.steps!r}; expected a positive integer")
        if self.rounds is not None and (not isinstance(self.rounds, int) or self.rounds < self.steps):
            raise InvalidInstanceError(
                f"rounds = {self.rounds!r}; expected an integer >= steps ({self.steps}): "
                "every step lasts at least one round"
            )
        if not isinstance(self.chunks, int) or self.chunks < 1:
            raise InvalidInstanceError(f"chunks = {self.chunks!r}; expected a positive integer")
        if self.extra_memory is not None and (
            not isinstance(self.extra_memory, int) or self.extra_memory < 0
        ):
            raise InvalidInstanceError(
                f"extra_memory = {self.extra_memory!r}; expected a non-negative integer"
            )

    @property
    def total_rounds(self) -> int:
        """Total rounds (``steps`` when ``rounds`` is ``None``)."""
        return self.steps if self.rounds is None else self.rounds

    @property
    def rounds_per_chunk(self) -> Fraction:
        """Bandwidth cost in units of one base chunk's transfer time."""
        return Fraction(self.total_rounds, self.chunks)

    def label(self) -> str:
        """``steps=3 rounds=7 chunks=6``."""
        text = f"steps={self.steps} rounds={self.total_rounds} chunks={self.chunks}"
        if self.extra_memory is not None:
            text += f" extra_memory={self.extra_memory}"
        return text


@dataclass(frozen=True)
class Algorithm:
    """A schedule of sends implementing ``collective`` on ``topology``.

    ``collective`` is the split collective the sends refer to (its ``chunk_factor`` is the
    instance's chunk count). Build algorithms through synthesis or
    :func:`collsynth.algorithm.load_algorithm`,
    which verify them; construct one by hand and call :func:`collsynth.algorithm.verify` yourself.
    """

    name: str
    topology: Topology
    collective: Collective
    steps: tuple[Step, ...]
    provenance: Mapping[str, object] = field(default_factory=dict, compare=False, hash=False)

    @property
    def num_steps(self) -> int:
        return len(self.steps)

    @property
    def num_rounds(self) -> int:
        return sum(step.rounds for step in self.steps)

    @property
    def chunks(self) -> int:
        """Pieces per base chunk (the instance's ``chunks``)."""
        return self.collective.chunk_factor

    @property
    def rounds_per_chunk(self) -> Fraction:
        """Total rounds divided by the chunk factor: the bandwidth cost per base chunk."""
        return Fraction(self.num_rounds, self.chunks)

    @property
    def num_sends(self) -> int:
        """Total number of sends (``len`` of each step's sends: O(steps) for send blocks)."""
        return sum(len(step.sends) for step in self.steps)

    @property
    def instance(self) -> Instance:
        return Instance(steps=self.num_steps, rounds=self.num_rounds, chunks=self.chunks)

    def __repr__(self) -> str:
        return (
            f"Algorithm({self.name!r}, {self.collective.describe()} on {self.topology.name}, "
            f"steps={self.num_steps}, rounds={self.num_rounds}, chunks={self.chunks})"
        )
