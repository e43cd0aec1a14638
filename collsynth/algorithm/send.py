"""The :class:`Send` value: one chunk over one link in one step of an algorithm."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Send"]


@dataclass(frozen=True, order=True)
class Send:
    """One chunk over one link in one step.

    ``reduce=False``: ``dst`` replaces its value of ``chunk`` with ``src``'s.
    ``reduce=True``: ``dst`` adds ``src``'s value of ``chunk`` into its own.
    """

    chunk: int
    src: int
    dst: int
    reduce: bool = False
