"""The small interface every solver backend implements, and the outcome it returns.

A backend takes a :class:`~collsynth.encoding.problem.SchedulingProblem` (plain data) and returns
an :class:`Outcome`: a status and, when satisfiable, the chosen sends and rounds per step. It does
not build algorithms or verify them; the strategies do that, so a new solver needs only this.
"""

from __future__ import annotations

import enum
import signal
import threading
from dataclasses import dataclass, field
from typing import Callable, Protocol, TypeVar

from collsynth import interrupts
from collsynth.encoding.problem import SchedulingProblem

__all__ = ["Status", "Outcome", "Backend", "SolveInterrupted", "run_interruptibly"]

T = TypeVar("T")


class Status(enum.Enum):
    """What a search concluded. Never merged: a timeout is not a proof of unsatisfiability."""

    SAT = "sat"
    UNSAT = "unsat"
    TIMEOUT = "timeout"
    UNKNOWN = "unknown"
    #: Stopped by Ctrl-C before anything was found; like ``TIMEOUT``, it proves nothing.
    INTERRUPTED = "interrupted"


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


class SolveInterrupted(KeyboardInterrupt):
    """Ctrl-C stopped a solve; the solver was told to stop and has returned.

    ``partial`` is what it had when stopped: an :class:`Outcome` from a backend (``SAT`` when it
    already held a schedule, e.g. while minimising), a
    :class:`~collsynth.synthesis.SynthesisResult` once the instance layer has decoded and
    verified it, or ``None``. A :class:`KeyboardInterrupt`, so code that does not look for it
    stops as on any Ctrl-C; the search strategies catch it and return what they found.
    """

    def __init__(self, partial: object = None) -> None:
        super().__init__()
        self.partial = partial


def run_interruptibly(work: Callable[[], T], stop: Callable[[], None]) -> T:
    """Run ``work`` on a helper thread; on Ctrl-C in the caller, call ``stop`` (which must make the
    solver return soon), wait for it, and raise :class:`SolveInterrupted` with what ``work``
    returned (``None`` if it raised).

    Native solvers do not return to Python while they run, so the Python signal handler (which
    only runs between bytecodes of the main thread) would wait for the whole solve; the main
    thread waits here instead and stays responsive. Backends must not install their own SIGINT
    handler (CP-SAT's resets SIGINT to the default action when the solve ends, and aborts with
    ``std::bad_function_call`` when the signal reaches another thread).
    """
    result: list[T] = []
    error: list[BaseException] = []
    # An Event, not Thread.join: a join that Ctrl-C interrupts can leave the thread marked as
    # stopped, and the next join then returns while the solver still runs (it then aborted the
    # process at exit).
    done = threading.Event()

    def target() -> None:
        try:
            # Threads the solver starts inherit this mask: Ctrl-C then always reaches the main
            # thread, whose handler raises KeyboardInterrupt here.
            if hasattr(signal, "pthread_sigmask"):
                signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
            result.append(work())
        except BaseException as exc:  # re-raised in the caller's thread
            error.append(exc)
        finally:
            done.set()

    thread = threading.Thread(target=target, name="collsynth-solver", daemon=True)
    try:
        thread.start()
        while not done.wait(0.05):
            # A Ctrl-C whose KeyboardInterrupt was dropped (raised in a callback) still stops it.
            interrupts.raise_if_pending()
    except KeyboardInterrupt:
        interrupts.take()  # carried from here on by the SolveInterrupted below
        # Asked again while waiting, in case the first request came before the solver started
        # (a second Ctrl-C here ends the wait with a plain KeyboardInterrupt).
        stop()
        while not done.wait(0.5):
            stop()
        raise SolveInterrupted(result[0] if result else None) from None
    if error:
        raise error[0]
    return result[0]
