"""The small interface every solver backend implements, and the outcome it returns.

A backend takes a :class:`~collsynth.encoding.problem.SchedulingProblem` (plain data) and returns
an :class:`Outcome`: a status and, when satisfiable, the chosen sends and rounds per step. It does
not build algorithms or verify them; the strategies do that, so a new solver needs only this.
"""

from __future__ import annotations

import enum
import threading
from dataclasses import dataclass, field
from typing import Callable, Protocol

from collsynth.encoding.problem import SchedulingProblem

__all__ = ["Status", "Outcome", "Backend", "run_interruptibly"]


class Status(enum.Enum):
    """What a search concluded. Never merged: a timeout is not a proof of unsatisfiability."""

    SAT = "sat"
    UNSAT = "unsat"
    TIMEOUT = "timeout"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class Outcome:
    """A backend's answer: ``chosen`` send indices and ``rounds`` per step when ``SAT``."""

    status: Status
    chosen: tuple[int, ...] = ()
    rounds: tuple[int, ...] = ()
    seconds: float = 0.0
    detail: str = ""
    stats: dict[str, object] = field(default_factory=dict)


class Backend(Protocol):
    """A solver backend."""

    name: str

    def available(self) -> bool:
        """True when the solver can be imported and run here."""

    def solve(self, problem: SchedulingProblem, *, time_limit: float) -> Outcome:
        """Solve ``problem`` within ``time_limit`` seconds (wall clock)."""


def run_interruptibly(work: Callable[[], Outcome], stop: Callable[[], None]) -> Outcome:
    """Run ``work`` on a helper thread; on Ctrl-C in the caller, call ``stop`` (which must make the
    solver return soon), wait for it, and re-raise :class:`KeyboardInterrupt`.

    Native solvers block signals while they run; this keeps Ctrl-C responsive.
    """
    result: list[Outcome] = []
    error: list[BaseException] = []

    def target() -> None:
        try:
            result.append(work())
        except BaseException as exc:  # re-raised in the caller's thread
            error.append(exc)

    thread = threading.Thread(target=target, name="collsynth-solver", daemon=True)
    thread.start()
    try:
        while thread.is_alive():
            thread.join(0.05)
    except KeyboardInterrupt:
        stop()
        thread.join()
        raise
    if error:
        raise error[0]
    return result[0]
