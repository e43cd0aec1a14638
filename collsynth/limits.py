"""Resource limits: a memory ceiling that can be set, and checks made before allocating.

Commands that know their size up front (a schedule's sends, a run's buffers, a log's rows)
estimate the memory they need and call :func:`check_memory` first, so a request that cannot fit
is refused with the figure instead of running out of memory later. The budget is the smaller
of the memory available on the machine and the limit set by :func:`memory_ceiling` (the CLI's
``--memory-limit``) or the ``COLLSYNTH_MEMORY_LIMIT`` environment variable (bytes, or a number
with a unit: ``8GiB``, ``500MB``).
"""

from __future__ import annotations

import contextlib
import contextvars
import datetime
import math
import os
import time
from dataclasses import dataclass, field
from typing import Iterator

from collsynth._parse import NumberTextError, size_from_text
from collsynth.errors import CollsynthError, InputTooLargeError

__all__ = ["MEMORY_LIMIT_ENV", "address_space_limit_bytes", "ResourceLimitError",
           "TimeLimitReached", "Deadline", "memory_limit_bytes", "available_memory_bytes",
           "memory_budget_bytes", "check_memory", "memory_ceiling", "format_bytes", "parse_bytes"]

#: Environment variable holding a memory ceiling for collsynth (bytes or ``8GiB``).
MEMORY_LIMIT_ENV = "COLLSYNTH_MEMORY_LIMIT"

#: The ceiling set by memory_ceiling() for the code running inside it (None: not set).
_CEILING: contextvars.ContextVar[int | None] = contextvars.ContextVar("collsynth_memory_ceiling",
                                                                      default=None)


class ResourceLimitError(InputTooLargeError):
    """A request refused up front: it needs more memory (or time) than it may use."""


class TimeLimitReached(CollsynthError):
    """An engine without partial results ran out of its time limit (the CLI's exit 4)."""


@dataclass
class Deadline:
    """A wall-clock budget shared by the calls of one search or one run: ``seconds`` from
    ``started`` (``time.perf_counter()``), or no limit when ``seconds`` is ``None``.

    >>> Deadline(None).remaining(), Deadline(None).expired()
    (inf, False)
    >>> Deadline(0.0).expired()
    True
    """

    seconds: float | None
    started: float = field(default_factory=time.perf_counter)

    def remaining(self) -> float:
        """Seconds left (negative once passed; ``math.inf`` without a limit)."""
        if self.seconds is None:
            return math.inf
        return self.seconds - (time.perf_counter() - self.started)

    def expired(self) -> bool:
        return self.remaining() <= 0

    def remaining_timedelta(self) -> datetime.timedelta | None:
        """The time left as a ``timedelta`` of at least 1 ms (what torch's waits take), or
        ``None`` without a limit."""
        if self.seconds is None:
            return None
        return datetime.timedelta(seconds=max(0.001, self.remaining()))


def parse_bytes(text: str, *, what: str = MEMORY_LIMIT_ENV) -> int:
    """Bytes in ``text`` (the variable ``what``'s value), by the one rule for sizes,
    :func:`collsynth._parse.size_from_text`: a whole number, or a number and a unit (``KB`` =
    1000, ``KiB`` = 1024).

    Raises
    ------
    InputTooLargeError
        ``WHAT='TEXT': why; expected bytes, like 8589934592 or 8GiB``.

    >>> parse_bytes("8GiB"), parse_bytes("1500000"), parse_bytes("1.5 GB")
    (8589934592, 1500000, 1500000000)
    """
    try:
        return size_from_text(text)
    except NumberTextError as exc:
        raise InputTooLargeError(f"{what}={text[:40]!r}: {exc}; expected bytes, like 8589934592 "
                                 "or 8GiB") from None


def format_bytes(size_bytes: float) -> str:
    """``1.5 GB``, ``320 MB``, ``12 kB``: decimal units, 2 significant digits or more."""
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if size_bytes >= scale:
            value = size_bytes / scale
            return f"{value:.1f} {unit}" if value < 100 else f"{value:.0f} {unit}"
    return f"{int(size_bytes)} B"


def memory_limit_bytes() -> int | None:
    """The ceiling set for collsynth: :func:`memory_ceiling`'s, else ``COLLSYNTH_MEMORY_LIMIT``'s,
    else ``None``."""
    ceiling = _CEILING.get()
    if ceiling is not None:
        return ceiling
    text = os.environ.get(MEMORY_LIMIT_ENV, "").strip()
    return parse_bytes(text) if text else None


def available_memory_bytes() -> int | None:
    """Memory the machine can still give (``MemAvailable`` of ``/proc/meminfo``), or ``None``
    where that is not known."""
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def address_space_limit_bytes() -> int | None:
    """The process's soft address-space limit (``ulimit -v``, ``RLIMIT_AS``), or ``None`` where
    there is none or the platform has no such limit."""
    try:
        import resource
    except ImportError:  # not on this platform
        return None
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    return None if soft == resource.RLIM_INFINITY else int(soft)


def memory_budget_bytes() -> tuple[int | None, str]:
    """The most memory a request may use and where that figure comes from."""
    limit, available = memory_limit_bytes(), available_memory_bytes()
    if limit is not None and (available is None or limit <= available):
        return limit, f"the memory limit ({MEMORY_LIMIT_ENV} / --memory-limit)"
    if available is not None:
        return available, "the memory available on this machine"
    return None, ""


def check_memory(needed_bytes: float, what: str) -> None:
    """Refuse ``what`` up front when it needs more than :func:`memory_budget_bytes`.

    Raises
    ------
    ResourceLimitError
        ``"<what> needs about 7.9 GB of memory; the memory limit (...) is 4.0 GB"``.

    >>> check_memory(1000, "a small request")  # fits: returns None
    """
    budget, source = memory_budget_bytes()
    if budget is not None and needed_bytes > budget:
        raise ResourceLimitError(f"{what} needs about {format_bytes(needed_bytes)} of memory; "
                                 f"{source} is {format_bytes(budget)}")


@contextlib.contextmanager
def memory_ceiling(limit_bytes: int | None) -> Iterator[None]:
    """Within the block, :func:`check_memory` uses ``limit_bytes`` and, where the platform has
    it, the process's data segment is capped (soft ``RLIMIT_DATA``) at its size on entry plus
    ``limit_bytes``, so an allocation beyond what the estimates foresaw raises
    :class:`MemoryError` rather than exhausting the machine. ``None``: no change.

    ``RLIMIT_DATA``, not ``RLIMIT_AS``: the address space counts what threads reserve but do not
    use (CP-SAT's 4 workers add about 470 MB of it and 64 MB of data; importing torch maps
    another 480 MB), so an address-space cap near the limit fails long before the memory is.
    Processes started inside the block (``collsynth run``'s ranks) inherit the cap each.
    """
    if limit_bytes is None:
        yield
        return
    token = _CEILING.set(limit_bytes)
    restore = _cap_data_segment(limit_bytes)
    try:
        yield
    finally:
        if restore is not None:
            restore()
        _CEILING.reset(token)


def _cap_data_segment(limit_bytes: int):
    """Lower the soft RLIMIT_DATA to (data segment now + ``limit_bytes``); return the undo, or
    ``None`` where it cannot be done (no ``resource`` module, no ``/proc``)."""
    try:
        import resource
    except ImportError:  # not POSIX
        return None
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            data_bytes = next(int(line.split()[1]) * 1024 for line in status
                              if line.startswith("VmData:"))
        soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
        cap = data_bytes + limit_bytes
        if hard != resource.RLIM_INFINITY:
            cap = min(cap, hard)
        if soft != resource.RLIM_INFINITY and soft <= cap:
            return None  # already as tight
        resource.setrlimit(resource.RLIMIT_DATA, (cap, hard))
    except (OSError, ValueError, StopIteration):
        return None
    return lambda: resource.setrlimit(resource.RLIMIT_DATA, (soft, hard))
