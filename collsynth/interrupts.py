"""Ctrl-C that is never lost: a SIGINT (and SIGTERM) handler that records the request as well as
raising :class:`KeyboardInterrupt`, so a search can notice a request that Python swallowed and
files being written are cleaned up.

Python raises ``KeyboardInterrupt`` between any two bytecodes of the main thread; one raised
inside a weakref callback or ``__del__`` (a garbage collection can run them anywhere) is printed
as "Exception ignored" and dropped, and the search went on to its end. docs/cli.md (Limits).
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_requested = threading.Event()


def pending() -> bool:
    """True when Ctrl-C was pressed (under :func:`reliable_sigint`) and no code has taken it
    yet."""
    return _requested.is_set()


def take() -> None:
    """Mark a pending Ctrl-C as handled: the caller raised or reported it."""
    _requested.clear()


def raise_if_pending() -> None:
    """Raise :class:`KeyboardInterrupt` (and take the request) when Ctrl-C is pending: called
    where a long computation moves to its next piece of work."""
    if _requested.is_set():
        _requested.clear()
        raise KeyboardInterrupt


def _on_sigint(signum: int, frame: object) -> None:
    _requested.set()
    raise KeyboardInterrupt


def _term_is_default() -> bool:
    return hasattr(signal, "SIGTERM") and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


def _unraisable(default):  # a hook for sys.unraisablehook
    def hook(unraisable) -> None:
        # A KeyboardInterrupt dropped in a callback: the request is recorded, not lost, so the
        # "Exception ignored" traceback would only alarm the user.
        if isinstance(unraisable.exc_value, KeyboardInterrupt):
            return
        default(unraisable)
    return hook


@contextmanager
def reliable_sigint() -> Iterator[None]:
    """Within the block (main thread only), Ctrl-C raises :class:`KeyboardInterrupt` as usual
    and is also recorded for :func:`pending`, and so does SIGTERM where its handler is the
    default; the handlers and the hook are put back after. A signal whose handler is not the
    default (ignored, or an embedding's own) is left alone; in another thread nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    # Each signal is taken over only from its default: a background job of a shell script
    # ignores SIGINT, and must still clean up on SIGTERM (kill, a job scheduler's stop), which
    # by default ends the process where it stands, leaving half-written temporary files.
    sigint = signal.getsignal(signal.SIGINT) is signal.default_int_handler
    term = _term_is_default()
    previous_hook = sys.unraisablehook
    _requested.clear()
    if sigint:
        signal.signal(signal.SIGINT, _on_sigint)
    if term:
        signal.signal(signal.SIGTERM, _on_sigint)
    sys.unraisablehook = _unraisable(previous_hook)
    try:
        yield
    finally:
        if sigint:
            signal.signal(signal.SIGINT, signal.default_int_handler)
        if term:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        sys.unraisablehook = previous_hook
        _requested.clear()
