"""Size buckets and training steps: how the calls of a trace are grouped in a plan's report.

* A **size bucket** is a power-of-two range of bytes, ``[2**k, 2**(k+1))`` (and ``[0, 1)`` for
  empty calls): :func:`size_bucket`.
* A **step** is one training iteration: :func:`find_steps` looks for the smallest period of a
  rank's call sequence (each call by its kind, size, group and root), after a short prefix of
  setup calls (a model's initial broadcasts, say). When no period repeats at least twice, the
  whole trace is one step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Hashable, Sequence

__all__ = ["size_bucket", "bucket_label", "StepStructure", "find_steps", "MAX_SETUP_CALLS"]

#: Longest prefix of setup calls :func:`find_steps` skips before the repeating part.
MAX_SETUP_CALLS = 64


def size_bucket(size_bytes: int) -> tuple[int, int]:
    """The power-of-two bucket ``[lo, hi)`` holding ``size_bytes``.

    >>> size_bucket(0), size_bucket(1), size_bucket(1000), size_bucket(1024)
    ((0, 1), (1, 2), (512, 1024), (1024, 2048))
    """
    if size_bytes < 1:
        return (0, 1)
    lo = 1 << (int(size_bytes).bit_length() - 1)
    return (lo, 2 * lo)


def _format_bytes(value: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if value >= scale and value % scale == 0:
            return f"{value // scale} {unit}"
    return f"{value} B"


def bucket_label(bucket: tuple[int, int]) -> str:
    """``"[1 MiB, 2 MiB)"``.

    >>> bucket_label((512, 1024))
    '[512 B, 1 KiB)'
    """
    return f"[{_format_bytes(bucket[0])}, {_format_bytes(bucket[1])})"


@dataclass(frozen=True)
class StepStructure:
    """How a rank's calls split into setup calls and repeated steps.

    ``setup`` calls come first; then ``steps`` repetitions of ``period`` calls each (the last
    repetition may be cut short: ``tail`` calls of an unfinished step). ``found`` is false when no
    repetition was found: the whole trace is then one step (``period`` = every call).
    """

    setup: int
    period: int
    steps: int
    tail: int
    found: bool

    def describe(self) -> str:
        """One line for a report."""
        if not self.found:
            return "no repeating pattern of calls was found: the whole trace is one step"
        text = f"{self.steps} steps of {self.period} calls"
        if self.setup:
            text += f" after {self.setup} setup call(s)"
        if self.tail:
            text += f", then {self.tail} call(s) of an unfinished step"
        return text


def find_steps(signatures: Sequence[Hashable], *, max_setup: int = MAX_SETUP_CALLS
               ) -> StepStructure:
    """The step structure of one rank's calls (docs/plan.md).

    Tries setup prefixes of 0, 1, ... ``max_setup`` calls and, for each, the smallest period of
    the rest (with the prefix function: linear time); keeps the first that repeats at least
    twice, preferring fewer setup calls.

    >>> find_steps(list("xABCABCABC"))
    StepStructure(setup=1, period=3, steps=3, tail=0, found=True)
    >>> find_steps(list("ABCABCAB")).describe()
    '2 steps of 3 calls, then 2 call(s) of an unfinished step'
    >>> find_steps(list("ABCD")).found
    False
    """
    n = len(signatures)
    for setup in range(0, min(max_setup, n) + 1):
        rest = signatures[setup:]
        m = len(rest)
        if m < 2:
            break
        period = _smallest_period(rest)
        if period is not None and m // period >= 2:
            return StepStructure(setup, period, m // period, m % period, True)
    return StepStructure(0, n, 1, 0, False)


def _smallest_period(seq: Sequence[Hashable]) -> int | None:
    """The smallest ``p < len(seq)`` with ``seq[i] == seq[i + p]`` for every ``i``, or None."""
    m = len(seq)
    pi = [0] * m
    for i in range(1, m):
        k = pi[i - 1]
        while k and seq[i] != seq[k]:
            k = pi[k - 1]
        if seq[i] == seq[k]:
            k += 1
        pi[i] = k
    p = m - pi[-1]
    return p if p < m else None
