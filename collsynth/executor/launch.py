"""Start ``N`` local processes in one torch.distributed group and run a function on each.

The details (formats, conventions, rules) are in docs/executor.md.
"""

from __future__ import annotations

import datetime
import logging
import multiprocessing
import os
import pickle
import queue as queue_module
import shutil
import signal
import socket
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from collsynth.errors import CollsynthError
from collsynth.executor._common import BackendUnavailableError, torch_modules

__all__ = ["launch", "LaunchError", "RankFailure", "free_port", "BACKENDS",
           "DEFAULT_LAUNCH_TIMEOUT_S"]

_log = logging.getLogger(__name__)

#: Backends :func:`launch` can start.
BACKENDS = ("gloo", "nccl")
#: Seconds a whole launch may take by default.
DEFAULT_LAUNCH_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class RankFailure:
    """One rank that did not return a result.

    ``kind``: ``"error"`` (``fn`` or the group setup raised), ``"exit"`` (the process died
    without reporting), ``"timeout"`` (still running at the deadline), ``"stopped"`` (still
    running when another rank's failure ended the launch).
    """

    rank: int
    kind: str
    message: str
    traceback: str = ""

    def __str__(self) -> str:
        return f"rank {self.rank} {_KIND_TEXT[self.kind]}: {self.message}"


_KIND_TEXT = {"error": "failed", "exit": "died", "timeout": "timed out",
              "stopped": "was stopped"}


class LaunchError(CollsynthError):
    """Some ranks of a launch failed; ``failures`` lists them, the first failure first, and
    ``results`` holds what the other ranks returned (rank -> value)."""

    def __init__(self, failures: Sequence[RankFailure], results: dict[int, Any]) -> None:
        self.failures = tuple(failures)
        self.results = dict(results)
        primary = [f for f in self.failures if f.kind in ("error", "exit")] or list(self.failures)
        others = [f for f in self.failures if f not in primary]
        text = "; ".join(str(f) for f in primary)
        if others:
            by_kind: dict[str, list[int]] = {}
            for f in others:
                by_kind.setdefault(f.kind, []).append(f.rank)
            text += "; " + "; ".join(
                f"rank(s) {', '.join(map(str, ranks))} {_KIND_TEXT[kind]}"
                f" ({next(f.message for f in others if f.kind == kind)})"
                for kind, ranks in by_kind.items())
        super().__init__(text)

    @property
    def failed_ranks(self) -> tuple[int, ...]:
        return tuple(f.rank for f in self.failures)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (bound to port 0, then closed)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _first_line(text: str) -> str:
    lines = [line for line in str(text).strip().splitlines() if line.strip()]
    return lines[0] if lines else ""


def _child(rank: int, world_size: int, fn: Callable[..., Any], args: tuple, backend: str,
           init_method: str, pg_timeout_s: float, threads: int, results: Any) -> None:
    """Body of one rank's process."""
    # A forked rank inherits the command's SIGTERM handler (collsynth.interrupts), which
    # raises KeyboardInterrupt: the launcher's terminate() must end a rank, even one stuck in
    # gloo's C++ code, at once.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    initialised = False
    try:
        import torch
        import torch.distributed as dist

        torch.set_num_threads(threads)
        if backend == "nccl":
            torch.cuda.set_device(rank)
        dist.init_process_group(backend, init_method=init_method, rank=rank,
                                world_size=world_size,
                                timeout=datetime.timedelta(seconds=pg_timeout_s))
        initialised = True
        value = fn(rank, world_size, *args)
        try:
            payload = pickle.dumps(value)
        except Exception as exc:
            raise TypeError(f"the result of rank {rank} cannot be sent back: {exc}") from exc
        results.put((rank, True, payload, ""))
    except BaseException as exc:  # report everything, KeyboardInterrupt included
        message = f"{type(exc).__name__}: {_first_line(str(exc)) or type(exc).__name__}"
        results.put((rank, False, message, traceback.format_exc()))
        results.close()
        results.join_thread()
        os._exit(1)   # skip destroy_process_group: peers may be gone
    if initialised:
        try:
            import torch.distributed as dist

            dist.destroy_process_group()
        except Exception:  # pragma: no cover - best effort at exit
            pass
    results.close()
    results.join_thread()


def _start_method(backend: str, requested: str | None) -> str:
    if requested is not None:
        if requested not in multiprocessing.get_all_start_methods():
            raise BackendUnavailableError(f"start method {requested!r} is not available here "
                                          f"({', '.join(multiprocessing.get_all_start_methods())})")
        return requested
    if backend == "gloo" and sys.platform.startswith("linux") and \
            "fork" in multiprocessing.get_all_start_methods():
        torch, _ = torch_modules()
        if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
            return "fork"
    return "spawn"


#: Times a launch whose process group could not even connect (gloo's connectFullMesh failing
#: under heavy load, before any rank ran ``fn``) is started again.
SETUP_RETRIES = 1


def _setup_failed(error: "LaunchError") -> bool:
    """True when the group never formed: some rank failed in gloo's mesh setup, so no rank has
    run ``fn`` yet and starting again is safe."""
    return any("connectFullMesh" in f.message for f in error.failures)


def launch(fn: Callable[..., Any], world_size: int, *, args: Sequence[Any] = (),
           backend: str = "gloo", timeout_s: float = DEFAULT_LAUNCH_TIMEOUT_S,
           grace_s: float = 5.0, init: str = "file", start_method: str | None = None,
           threads_per_rank: int | None = None,
           progress: Callable[[str], None] | None = None,
           progress_interval_s: float = 5.0) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` in ``world_size`` processes of one process group.

    See :func:`_launch_once` for the parameters. A launch whose group could not connect (gloo's
    mesh setup failing, which happens on overloaded machines before any rank runs ``fn``) is
    started again :data:`SETUP_RETRIES` time(s), with a fresh store.
    """
    attempt = 0
    while True:
        try:
            return _launch_once(fn, world_size, args=args, backend=backend, timeout_s=timeout_s,
                                grace_s=grace_s, init=init, start_method=start_method,
                                threads_per_rank=threads_per_rank, progress=progress,
                                progress_interval_s=progress_interval_s)
        except LaunchError as exc:
            if attempt >= SETUP_RETRIES or not _setup_failed(exc):
                raise
            attempt += 1
            _log.warning("process group setup failed (%s); starting the launch again", exc)


def _launch_once(fn: Callable[..., Any], world_size: int, *, args: Sequence[Any] = (),
           backend: str = "gloo", timeout_s: float = DEFAULT_LAUNCH_TIMEOUT_S,
           grace_s: float = 5.0, init: str = "file", start_method: str | None = None,
           threads_per_rank: int | None = None,
           progress: Callable[[str], None] | None = None,
           progress_interval_s: float = 5.0) -> list[Any]:
    """One attempt of :func:`launch`: ``fn(rank, world_size, *args)`` in ``world_size``
    processes of one process group.

    Parameters
    ----------
    fn:
        The function every rank runs after ``init_process_group``; its return value (picklable)
        is that rank's result.
    world_size:
        Number of processes (ranks), >= 1.
    backend:
        ``"gloo"`` (CPU) or ``"nccl"`` (one GPU per rank).
    timeout_s:
        Seconds the whole launch may take (also the process group's timeout).
    grace_s:
        Seconds the other ranks get to report after a first failure, before they are stopped.
    init:
        ``"file"`` (a FileStore in a temporary directory) or ``"tcp"`` (127.0.0.1, free port).
    start_method:
        ``"fork"``, ``"spawn"`` or ``"forkserver"``; default: fork for gloo on Linux, else spawn.
    threads_per_rank:
        torch intra-op threads per process; default 1 when forked, else
        ``cpu_count // world_size`` (>= 1). More than 1 needs forkserver or spawn.
    progress, progress_interval_s:
        Called every ``progress_interval_s`` seconds (default 5) while ranks are still
        running, with one line: how many ranks reported and how long the launch has taken.

    Returns
    -------
    list
        Every rank's result, in rank order.

    Raises
    ------
    LaunchError
        Some rank raised, died or did not finish; names them (the first failure first).
    BackendUnavailableError
        torch is missing, or NCCL without enough GPUs.
    """
    torch, dist = torch_modules()
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size = {world_size!r}; expected an integer >= 1")
    if backend not in BACKENDS:
        raise BackendUnavailableError(f"unknown backend {backend!r}; valid: {', '.join(BACKENDS)}")
    if backend == "nccl":
        found = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if not dist.is_nccl_available() or found < world_size:
            why = "this PyTorch has no NCCL" if not dist.is_nccl_available() else \
                f"found {found} CUDA device(s)"
            raise BackendUnavailableError(f"the nccl backend needs {world_size} GPUs (one per "
                                          f"rank); {why}")
    elif not dist.is_gloo_available():
        raise BackendUnavailableError("this PyTorch has no gloo backend")
    if init not in ("file", "tcp"):
        raise ValueError(f"init = {init!r}; expected 'file' or 'tcp'")
    if isinstance(progress_interval_s, bool) or not isinstance(progress_interval_s, (int, float)) \
            or not progress_interval_s > 0:
        raise ValueError(f"progress_interval_s = {progress_interval_s!r}; expected seconds > 0")
    method = _start_method(backend, start_method)
    if method == "fork":
        if threads_per_rank is not None and threads_per_rank > 1:
            raise ValueError("threads_per_rank > 1 needs start_method='forkserver' or 'spawn': "
                             "OpenMP threads in a forked child can hang")
        threads = 1
    else:
        threads = threads_per_rank or max(1, (os.cpu_count() or 1) // world_size)
    ctx = multiprocessing.get_context(method)
    if method == "forkserver":
        # Import torch once in the server; effective only before the server first starts.
        ctx.set_forkserver_preload(["torch", "torch.distributed", "collsynth.executor"])
    workdir = tempfile.mkdtemp(prefix="collsynth-launch-")
    init_method = (f"file://{os.path.join(workdir, 'store')}" if init == "file"
                   else f"tcp://127.0.0.1:{free_port()}")
    results = ctx.Queue()
    processes = [ctx.Process(target=_child, name=f"collsynth-rank-{rank}", daemon=True,
                             args=(rank, world_size, fn, tuple(args), backend, init_method,
                                   timeout_s, threads, results))
                 for rank in range(world_size)]
    values: dict[int, Any] = {}
    failures: list[RankFailure] = []
    try:
        for p in processes:
            p.start()
        began = time.monotonic()
        deadline = began + timeout_s
        stop_at = deadline
        next_beat = began + progress_interval_s
        dead_since: dict[int, float] = {}
        while len(values) + len(failures) < world_size:
            now = time.monotonic()
            if now >= stop_at:
                break
            if progress is not None and now >= next_beat:
                next_beat = now + progress_interval_s
                progress(f"{len(values)} of {world_size} rank(s) done, {now - began:.0f} s so "
                         f"far (timeout {timeout_s:g} s)")
            try:
                rank, ok, payload, trace = results.get(timeout=min(0.05, stop_at - now))
            except queue_module.Empty:
                reported = set(values) | {f.rank for f in failures}
                for rank, p in enumerate(processes):
                    if rank in reported or p.is_alive():
                        continue
                    # Its report may still be in the pipe: give it a moment.
                    first = dead_since.setdefault(rank, now)
                    if now - first > 1.0:
                        text = _exit_text(p.exitcode)
                        if method != "fork" and p.exitcode == 1:
                            text += (f" (with start method {method!r}, fn and args must be "
                                     "importable by the child: module-level, not __main__ or "
                                     "a closure; its stderr says more)")
                        failures.append(RankFailure(rank, "exit", text))
                        stop_at = min(stop_at, now + grace_s)
                continue
            if ok:
                values[rank] = pickle.loads(payload)
            else:
                failures.append(RankFailure(rank, "error", payload, trace))
                stop_at = min(stop_at, time.monotonic() + grace_s)
        reported = set(values) | {f.rank for f in failures}
        timed_out = time.monotonic() >= deadline
        first_failed = bool(failures)
        for rank in range(world_size):
            if rank not in reported:
                if first_failed and not timed_out:
                    failures.append(RankFailure(rank, "stopped", f"still running {grace_s:g} s "
                                                                 "after the first failure"))
                else:
                    failures.append(RankFailure(rank, "timeout", f"did not finish within "
                                                                 f"{timeout_s:g} s"))
    finally:
        _stop(processes)
        results.close()
        shutil.rmtree(workdir, ignore_errors=True)
    if failures:
        for f in failures:
            if f.traceback:
                _log.debug("rank %d traceback:\n%s", f.rank, f.traceback)
        raise LaunchError(failures, values)
    return [values[rank] for rank in range(world_size)]


def _exit_text(code: int | None) -> str:
    if code is None:
        return "no exit code"
    if code < 0:
        return f"killed by signal {-code} without reporting a result"
    return f"exited with code {code} without reporting a result"


def _stop(processes: list[Any]) -> None:
    """Terminate (then kill) every process still alive; reap them all."""
    for p in processes:
        if p.pid is not None and p.is_alive():
            p.terminate()
    end = time.monotonic() + 3.0
    for p in processes:
        if p.pid is None:
            continue
        p.join(max(0.0, end - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join(1.0)
