"""Progress lines for long work: a heartbeat that reports from a background thread while the
calling thread computes (a solve, a simulation of many ranks)."""

from __future__ import annotations

import logging
import threading
import time
from contextlib import contextmanager
from typing import Callable, Iterator

__all__ = ["heartbeat"]

_log = logging.getLogger(__name__)


@contextmanager
def heartbeat(on_progress: Callable[[str], None] | None, interval_s: float,
              doing: str | Callable[[], str], note: str = "") -> Iterator[None]:
    """While the ``with`` body runs, call ``on_progress`` from a background thread every
    ``interval_s`` seconds with ``"{doing}, {N} s so far ({note})"``; ``doing`` may be a
    function, asked at each beat (what the work is on now). A callback that raises ends the
    heartbeat (logged), never the work.

    >>> lines = []
    >>> with heartbeat(lines.append, 0.01, lambda: "pricing nccl-tree"):
    ...     time.sleep(0.3)
    >>> lines[0].startswith("pricing nccl-tree, 0 s so far")
    True
    """
    if on_progress is None:
        yield
        return
    stop = threading.Event()
    started = time.perf_counter()
    tail = f" ({note})" if note else ""

    def beat() -> None:
        while not stop.wait(interval_s):
            try:
                now = doing() if callable(doing) else doing
                on_progress(f"{now}, {time.perf_counter() - started:.0f} s so far{tail}")
            except Exception:  # noqa: BLE001 - a broken progress display must not stop a solve
                _log.exception("the progress callback failed; no more heartbeats")
                return

    thread = threading.Thread(target=beat, name="collsynth-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
