"""What synthesis returns: one :class:`SynthesisResult` per instance tried, and the options."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Callable

from collsynth.algorithm.model import Algorithm, Instance
from collsynth.encoding.backend import Backend, Status
from collsynth.errors import InvalidInstanceError

__all__ = ["Status", "SynthesisResult", "SolveOptions", "Deadline"]


@dataclass(frozen=True)
class SynthesisResult:
    """The outcome of one instance.

    ``algorithm`` is set (and verified) exactly when ``status`` is ``SAT``. ``seconds`` is the wall
    time spent on this instance, encoding and verification included.
    """

    instance: Instance
    status: Status
    algorithm: Algorithm | None
    seconds: float
    backend: str
    detail: str = ""

    @property
    def found(self) -> bool:
        return self.status is Status.SAT

    @property
    def rounds_per_chunk(self) -> Fraction:
        return self.instance.rounds_per_chunk

    def summary(self) -> str:
        """``steps=3 rounds=7 chunks=6: sat (0.4 s, cpsat)``."""
        text = f"{self.instance.label()}: {self.status.value} ({self.seconds:.2f} s, {self.backend})"
        return f"{text} {self.detail}".rstrip()


@dataclass(frozen=True)
class SolveOptions:
    """Options shared by every synthesis entry point (keyword-only).

    Parameters
    ----------
    backend:
        ``"auto"`` (CP-SAT if installed, else z3), ``"cpsat"``, ``"z3"``, or a backend object.
    time_limit:
        Wall-clock seconds for the whole call (an instance, a least-steps search or a sweep).
    instance_time_limit:
        Most seconds for any one instance inside a search; ``None``: the remaining time.
    symmetry:
        First search schedules invariant under a topology automorphism (fast when it works,
        never used to conclude unsatisfiability).
    on_result:
        Called with every :class:`SynthesisResult` as soon as it is known (progress reporting).
    """

    backend: str | Backend = "auto"
    time_limit: float = 300.0
    instance_time_limit: float | None = None
    symmetry: bool = True
    on_result: Callable[[SynthesisResult], None] | None = None

    def __post_init__(self) -> None:
        if not (isinstance(self.time_limit, (int, float)) and self.time_limit > 0
                and math.isfinite(self.time_limit)):
            raise InvalidInstanceError(f"time_limit = {self.time_limit!r}; expected seconds > 0")


@dataclass
class Deadline:
    """A wall-clock budget shared by the calls of one search."""

    seconds: float
    started: float = field(default_factory=time.perf_counter)

    def remaining(self) -> float:
        return self.seconds - (time.perf_counter() - self.started)

    def expired(self) -> bool:
        return self.remaining() <= 0
