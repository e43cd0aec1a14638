"""The tracer: wraps torch.distributed's collectives and writes one record per call.

The details (formats, conventions, rules) are in docs/trace.md.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import itertools
import json
import logging
import os
import socket
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

from collsynth._parse import NumberTextError, number_text
from collsynth.errors import CollsynthError, UnknownNameError
from collsynth.trace.records import (
    BYTE_CONVENTIONS,
    FORMAT,
    MAX_WORLD_SIZE,
    VERSION,
    rank_file_name,
)

__all__ = ["TraceOptions", "Tracer", "tracing", "trace_ddp", "average_allreduce_hook",
           "TRACED_FUNCTIONS", "TracingError"]

_log = logging.getLogger(__name__)

#: The torch.distributed functions the tracer wraps (those the installed torch has), with the
#: kind their records get.
TRACED_FUNCTIONS: dict[str, str] = {
    "barrier": "barrier",
    "broadcast": "broadcast",
    "broadcast_object_list": "broadcast_object_list",
    "all_reduce": "allreduce",
    "reduce": "reduce",
    "all_gather": "allgather",
    "all_gather_into_tensor": "allgather",
    "all_gather_single": "allgather",
    "_all_gather_base": "allgather",
    "reduce_scatter": "reduce_scatter",
    "reduce_scatter_tensor": "reduce_scatter",
    "reduce_scatter_single": "reduce_scatter",
    "_reduce_scatter_base": "reduce_scatter",
    "all_to_all": "alltoall",
    "all_to_all_single": "alltoall",
    "gather": "gather",
    "scatter": "scatter",
    "send": "send",
    "recv": "recv",
    "isend": "isend",
    "irecv": "irecv",
    "batch_isend_irecv": "send/recv",  # one send or recv record per operation
    "_broadcast_coalesced": "broadcast",
}
#: Wrapped on ``torch.distributed`` only (see docs/trace.md).
_TOP_LEVEL_ONLY = frozenset({"isend", "irecv", "_broadcast_coalesced"})
#: Records buffered before they are written to the rank file.
_FLUSH_EVERY = 512
#: Longest ``error`` text written.
_MAX_ERROR = 1000

_ENCODER = json.JSONEncoder(separators=(",", ":"))
_OP_NAMES = {"SUM": "sum", "AVG": "avg", "PRODUCT": "prod", "MIN": "min", "MAX": "max",
             "BAND": "band", "BOR": "bor", "BXOR": "bxor", "PREMUL_SUM": "premul_sum"}


class TracingError(CollsynthError):
    """Tracing cannot start: another tracer is active in this process, or torch.distributed
    is missing."""


@dataclass(frozen=True)
class TraceOptions:
    """What the tracer records.

    Parameters
    ----------
    record_durations:
        Time each call (``duration_us``; for asynchronous calls, the time to issue them).
    cross_node_only:
        Write only the calls that cross nodes (see ``cross_node`` in
        :mod:`collsynth.trace.records`), and calls whose peer is not known.
    ranks_per_node:
        Consecutive global ranks per node; default ``LOCAL_WORLD_SIZE`` from the environment
        (torchrun sets it). Needed by ``cross_node_only``; without it ``cross_node`` is null.
    byte_convention:
        How ``bytes`` is counted; ``"nccl-tests"`` (the only one, and collsynth's everywhere).
    ddp:
        Register :func:`trace_ddp`'s communication hook on every DistributedDataParallel model
        at its first forward while tracing (unless it already has a hook), and tag the buckets
        of hooks registered while tracing.
    """

    record_durations: bool = False
    cross_node_only: bool = False
    ranks_per_node: int | None = None
    byte_convention: str = "nccl-tests"
    ddp: bool = False

    def __post_init__(self) -> None:
        if self.byte_convention not in BYTE_CONVENTIONS:
            raise UnknownNameError(f"unknown byte convention {self.byte_convention!r}; valid: "
                                   f"{', '.join(BYTE_CONVENTIONS)}")
        # At most what a trace file may say (records.MAX_WORLD_SIZE): the reader refuses more,
        # so a larger figure would cost a whole traced run.
        if self.ranks_per_node is not None and (
                isinstance(self.ranks_per_node, bool) or not isinstance(self.ranks_per_node, int)
                or not 1 <= self.ranks_per_node <= MAX_WORLD_SIZE):
            raise ValueError(f"ranks_per_node = {self.ranks_per_node!r}; expected an integer "
                             f"from 1 to {MAX_WORLD_SIZE} or None")


def ranks_per_node_from_env(name: str, env: Mapping[str, str]) -> int | None:
    """Ranks per node as the environment variable ``name`` of ``env`` says (``None`` when it
    is unset or blank): ASCII digits as collsynth reads numbers everywhere
    (:func:`collsynth._parse.number_text`; ``int()`` alone reads ``'٨'`` as 8 and ``'1_0'`` as
    10), from 1 to :data:`~collsynth.trace.records.MAX_WORLD_SIZE`, the most a trace file may
    say (its reader refuses more, so a larger figure would cost a whole traced run).

    >>> ranks_per_node_from_env("LOCAL_WORLD_SIZE", {"LOCAL_WORLD_SIZE": " 8 "})
    8

    Raises
    ------
    ValueError
        Naming the variable, its value and what was expected.
    """
    text = env.get(name, "")
    if not text.strip():
        return None
    expected = f"{name} = {text!r} in the environment: expected a whole number from 1 to " \
               f"{MAX_WORLD_SIZE}"
    try:
        value = int(number_text(text))
    except NumberTextError as exc:
        raise ValueError(f"{expected} ({exc})") from None
    except ValueError:
        raise ValueError(expected) from None
    if not 1 <= value <= MAX_WORLD_SIZE:
        raise ValueError(expected)
    return value


def _ranks_per_node_from_env() -> int | None:
    return ranks_per_node_from_env("LOCAL_WORLD_SIZE", os.environ)


class _ThreadState(threading.local):
    depth = 0            # > 0 inside a traced call
    inner: list | None = None   # collects nested calls (broadcast_object_list)
    ddp_bucket: int | None = None


_ACTIVE: list["Tracer"] = []      # the one active tracer, mirroring the process-wide patches
_ACTIVE_LOCK = threading.Lock()


def _active_tracer() -> "Tracer | None":
    return _ACTIVE[0] if _ACTIVE else None


# -- the rank file --------------------------------------------------------------------------------


class _RankFile:
    """Writes one rank's JSON lines to a temporary file, renamed to its name on close, so a
    reader never sees a half-written trace (a process that dies leaves only the ``.tmp``)."""

    def __init__(self, directory: Path, header: dict[str, Any]) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / rank_file_name(header["rank"])
        fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".tmp", dir=directory)
        self._fd, self._tmp, self._pid = fd, tmp, os.getpid()
        self._pending: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._closed = False
        self.records = 0
        self._write(_ENCODER.encode(header) + "\n")

    def _write(self, text: str) -> None:
        data = text.encode("utf-8")
        while data:
            data = data[os.write(self._fd, data):]

    def add(self, record: dict[str, Any]) -> None:
        if os.getpid() != self._pid:   # a forked child: not this rank's file
            return
        with self._lock:
            if self._closed:     # a call still running in another thread when tracing ended
                return
            self._pending.append(record)
            self.records += 1
            if len(self._pending) >= _FLUSH_EVERY:
                self._flush_locked()

    def _flush_locked(self) -> None:
        pending, self._pending = self._pending, []
        if pending:
            encode = _ENCODER.encode
            self._write("".join([encode(r) + "\n" for r in pending]))

    def close(self) -> None:
        if os.getpid() != self._pid:
            return
        with self._lock:
            if self._closed:
                return
            self._closed = True
            try:
                self._flush_locked()
            finally:
                os.close(self._fd)
            os.replace(self._tmp, self.path)


# -- the tracer -----------------------------------------------------------------------------------


class Tracer:
    """Patches torch.distributed and writes this rank's trace; use :func:`tracing`.

    Attributes
    ----------
    directory:
        Where the rank file goes.
    options:
        The :class:`TraceOptions`.
    path:
        This rank's file once the process group is known (``None`` before).
    """

    def __init__(self, directory: str | os.PathLike[str], options: TraceOptions) -> None:
        self.directory = Path(directory)
        self.options = options
        self._ranks_per_node = options.ranks_per_node
        self._local = _ThreadState()
        self._seq = itertools.count()
        self._batches = itertools.count()
        self._file: _RankFile | None = None
        self._file_lock = threading.Lock()
        self._patches: list[tuple[Any, str, Any]] = []
        self._groups: dict[int, tuple[Any, tuple[int, ...], bool | None]] = {}
        self._site_skip: dict[str, bool] = {}
        self._skip_prefixes: tuple[str, ...] = ()
        self._started = 0.0
        self._rank = -1
        self._torch: Any = None
        self._dist: Any = None
        self._originals: dict[str, Callable[..., Any]] = {}
        self._dtype_names: dict[Any, str] = {}
        self._op_names: dict[Any, str] = {}

    # -- lifecycle --

    @property
    def path(self) -> Path | None:
        return self._file.path if self._file is not None else None

    @property
    def records(self) -> int:
        """Records written so far (this rank)."""
        return self._file.records if self._file is not None else 0

    def start(self) -> None:
        """Patch torch.distributed; open the rank file if the process group exists."""
        try:
            import torch
            import torch.distributed as dist
        except ImportError as exc:  # pragma: no cover - torch is there in the tests
            raise TracingError(f"tracing needs PyTorch: {exc}") from exc
        if not dist.is_available():  # pragma: no cover
            raise TracingError("this PyTorch has no torch.distributed")
        if self.options.cross_node_only and self._ranks_per_node is None:
            self._ranks_per_node = _ranks_per_node_from_env()
            if self._ranks_per_node is None:
                raise ValueError("cross_node_only needs ranks_per_node (or LOCAL_WORLD_SIZE in "
                                 "the environment) to tell nodes apart")
        elif self._ranks_per_node is None:
            try:
                self._ranks_per_node = _ranks_per_node_from_env()
            except ValueError as exc:   # only needed for the cross_node field: leave it null
                _log.warning("%s; cross_node will be null", exc)
        import collsynth

        self._torch, self._dist = torch, dist
        self._skip_prefixes = (os.path.dirname(torch.__file__) + os.sep,
                               os.path.dirname(collsynth.__file__) + os.sep)
        with _ACTIVE_LOCK:
            if _ACTIVE:
                raise TracingError("a tracer is already active in this process; tracing blocks "
                                   "do not nest")
            _ACTIVE.append(self)
        self._started = time.time()
        try:
            self._install()
            if dist.is_initialized():
                self._open()
        except BaseException:
            self._uninstall()
            with _ACTIVE_LOCK:
                _ACTIVE.remove(self)
            raise

    def stop(self) -> None:
        """Put the original functions back and finish the rank file."""
        try:
            self._uninstall()
        finally:
            with _ACTIVE_LOCK:
                if self in _ACTIVE:
                    _ACTIVE.remove(self)
            if self._file is None and self._dist is not None and self._dist.is_initialized():
                self._open()
            if self._file is not None:
                self._file.close()

    def _patch(self, owner: Any, name: str, value: Any) -> None:
        self._patches.append((owner, name, getattr(owner, name)))
        setattr(owner, name, value)

    def _install(self) -> None:
        dist = self._dist
        c10d = dist.distributed_c10d
        for name, kind in TRACED_FUNCTIONS.items():
            original = getattr(dist, name, None)
            if original is None:     # not in this torch version
                continue
            self._originals[name] = original
            wrapper = self._wrapper(name, kind, original)
            self._patch(dist, name, wrapper)
            if name not in _TOP_LEVEL_ONLY and getattr(c10d, name, None) is original:
                self._patch(c10d, name, wrapper)
        for owner in (dist, c10d):
            self._patch(owner, "init_process_group", self._init_wrapper(owner.init_process_group))
            self._patch(owner, "destroy_process_group",
                        self._destroy_wrapper(owner.destroy_process_group))
        self._patch(c10d.P2POp, "__init__", self._p2pop_init(c10d.P2POp.__init__))
        if self.options.ddp:
            from torch.nn.parallel import DistributedDataParallel as DDP

            self._patch(DDP, "forward", _ddp_forward(DDP.forward))
            self._patch(DDP, "register_comm_hook",
                        _ddp_register_comm_hook(DDP.register_comm_hook))

    def _uninstall(self) -> None:
        while self._patches:
            owner, name, original = self._patches.pop()
            setattr(owner, name, original)

    def _init_wrapper(self, original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def init_process_group(*args: Any, **kwargs: Any) -> Any:
            result = original(*args, **kwargs)
            if self._file is None and self._dist.is_initialized():
                self._open()
            return result
        return init_process_group

    def _destroy_wrapper(self, original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def destroy_process_group(*args: Any, **kwargs: Any) -> Any:
            if self._file is None and self._dist.is_initialized():
                self._open()     # the header needs the group: a rank that issued no call
            self._groups.clear()
            return original(*args, **kwargs)
        return destroy_process_group

    @staticmethod
    def _p2pop_init(original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def __init__(p2p: Any, op: Any, *args: Any, **kwargs: Any) -> None:
            # Keep torch's own isend / irecv in the op: batch_isend_irecv compares by identity.
            if isinstance(op, _P2PWrapper):
                op = op.__wrapped__
            original(p2p, op, *args, **kwargs)
        return __init__

    def _open(self) -> None:
        with self._file_lock:
            if self._file is not None:
                return
            dist = self._dist
            self._rank = dist.get_rank()
            header = {
                "type": "header", "format": FORMAT, "version": VERSION, "rank": self._rank,
                "world_size": dist.get_world_size(), "backend": str(dist.get_backend()),
                "byte_convention": self.options.byte_convention,
                "hostname": socket.gethostname(), "pid": os.getpid(),
                "torch_version": str(self._torch.__version__), "started_unix": self._started,
                "record_durations": self.options.record_durations,
                "cross_node_only": self.options.cross_node_only,
                "ranks_per_node": self._ranks_per_node,
            }
            self._file = _RankFile(self.directory, header)

    # -- wrappers --

    def _wrapper(self, name: str, kind: str, original: Callable[..., Any]) -> Callable[..., Any]:
        if name == "batch_isend_irecv":
            describe = None
        elif name == "_broadcast_coalesced":
            describe = _describe_broadcast_coalesced
        else:
            describe = _DESCRIBERS[name]
        binder = _binder(original, name)
        local = self._local

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if local.depth:
                if local.inner is not None and describe is not None:
                    self._note_inner(name, describe, binder, args, kwargs)
                return original(*args, **kwargs)
            local.depth = 1
            try:
                if describe is None:
                    return self._batch(original, args, kwargs)
                return self._call(name, kind, original, describe, binder, args, kwargs)
            finally:
                local.depth = 0

        if name in ("isend", "irecv"):
            return _P2PWrapper(wrapper, original)
        functools.update_wrapper(wrapper, original)
        return wrapper

    def _call(self, name: str, kind: str, original: Callable[..., Any], describe: Any,
              binder: Callable[..., dict[str, Any]], args: tuple, kwargs: dict) -> Any:
        try:
            record = describe(self, binder(args, kwargs))
        except Exception as exc:  # arguments torch will refuse, or a group we cannot read
            _log.debug("not traced: %s(...) could not be described: %s", name, exc)
            record = None
        if record is None:
            return original(*args, **kwargs)
        record["kind"] = kind
        record["function"] = name
        record["seq"] = next(self._seq)
        if self.options.cross_node_only and record["cross_node"] is False:
            return original(*args, **kwargs)
        record["site"] = self._site()
        if self._local.ddp_bucket is not None:
            record["raw"]["ddp_bucket"] = self._local.ddp_bucket
        inner = None
        if name == "broadcast_object_list":
            inner = self._local.inner = []
        timed = self.options.record_durations
        started = time.perf_counter_ns() if timed else 0
        try:
            result = original(*args, **kwargs)
        except BaseException as exc:
            if timed:
                record["duration_us"] = (time.perf_counter_ns() - started) / 1000.0
            record["error"] = _error_text(exc)
            self._finish(name, record, None, inner)
            raise
        finally:
            self._local.inner = None
        if timed:
            record["duration_us"] = (time.perf_counter_ns() - started) / 1000.0
        self._finish(name, record, result, inner)
        return result

    def _finish(self, name: str, record: dict[str, Any], result: Any, inner: list | None) -> None:
        if name == "recv" and record["peer"] is None and isinstance(result, int) and result >= 0:
            record["peer"] = result
            record["cross_node"] = self._p2p_cross(result)
            if self.options.cross_node_only and record["cross_node"] is False:
                return
        if inner is not None:
            record["raw"]["inner"] = inner
            record["bytes"] = sum(i["bytes"] for i in inner)
        self._emit(record)

    def _note_inner(self, name: str, describe: Any, binder: Callable[..., dict[str, Any]],
                    args: tuple, kwargs: dict) -> None:
        try:
            record = describe(self, binder(args, kwargs))
        except Exception:  # noqa: BLE001 - torch will report it
            return
        if record is not None:
            self._local.inner.append({"function": name, "bytes": record["bytes"],
                                      "dtype": record["dtype"]})

    def _batch(self, original: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        ops = args[0] if args else kwargs.get("p2p_op_list")
        records: list[dict[str, Any]] = []
        try:
            if isinstance(ops, list) and ops:
                batch = next(self._batches)
                site = self._site()
                for op in ops:
                    fn = getattr(op, "op", None)
                    sending = fn is self._originals["isend"] or (
                        isinstance(fn, _P2PWrapper) and fn.__wrapped__ is self._originals["isend"])
                    tensor = op.tensor
                    group, cross = self._group(op.group)
                    if self._rank not in group:
                        continue
                    peer = int(op.peer)
                    record = _record(tensor, _nbytes(tensor), self, group,
                                     {"tensor": tensor}, async_op=True, peer=peer,
                                     cross_node=self._p2p_cross(peer))
                    record["raw"]["tag"] = int(op.tag)
                    record.update(kind="send" if sending else "recv",
                                  function="batch_isend_irecv", seq=next(self._seq),
                                  batch=batch, site=site)
                    if self._local.ddp_bucket is not None:
                        record["raw"]["ddp_bucket"] = self._local.ddp_bucket
                    records.append(record)
        except Exception as exc:
            _log.debug("not traced: batch_isend_irecv(...) could not be described: %s", exc)
            records = []
        timed = self.options.record_durations
        started = time.perf_counter_ns() if timed else 0
        try:
            result = original(*args, **kwargs)
        except BaseException as exc:
            for record in records:
                record["error"] = _error_text(exc)
            raise
        finally:
            if timed and records:
                records[0]["duration_us"] = (time.perf_counter_ns() - started) / 1000.0
            for record in records:
                if not (self.options.cross_node_only and record["cross_node"] is False):
                    self._emit(record)
        return result

    def _emit(self, record: dict[str, Any]) -> None:
        if self._file is None:
            self._open()
        self._file.add(record)

    # -- helpers the describers use --

    def _group(self, group: Any) -> tuple[tuple[int, ...], bool | None]:
        """(global ranks of ``group`` in group-rank order, whether it spans nodes).

        Cached per group object (``None``: the default group, until it is destroyed)."""
        entry = self._groups.get(id(group))
        if entry is None or entry[0] is not group:
            dist = self._dist
            if group is dist.GroupMember.NON_GROUP_MEMBER:
                return (), None
            ranks = tuple(dist.get_process_group_ranks(
                group if group is not None else dist.GroupMember.WORLD))
            cross = None
            if self._ranks_per_node:
                cross = len({r // self._ranks_per_node for r in ranks}) > 1
            entry = (group, ranks, cross)
            self._groups[id(group)] = entry
            if self._rank < 0:
                self._rank = dist.get_rank()
        return entry[1], entry[2]

    def _p2p_cross(self, peer: int | None) -> bool | None:
        if peer is None or not self._ranks_per_node:
            return None
        return peer // self._ranks_per_node != self._rank // self._ranks_per_node

    def _global(self, group: Any, ranks: tuple[int, ...], global_rank: int | None,
                group_rank: int | None, default_group_rank: int | None = None) -> int | None:
        if global_rank is not None:
            return int(global_rank)
        if group_rank is None:
            group_rank = default_group_rank
        if group_rank is None:
            return None
        return ranks[int(group_rank)]

    def _dtype(self, dtype: Any) -> str:
        name = self._dtype_names.get(dtype)
        if name is None:
            name = str(dtype).removeprefix("torch.")
            self._dtype_names[dtype] = name
        return name

    def _op(self, op: Any) -> str:
        try:
            name = self._op_names.get(op)
        except TypeError:    # an unhashable ReduceOp object
            return _op_name(op)
        if name is None:
            name = self._op_names[op] = _op_name(op)
        return name

    def _site(self) -> str | None:
        frame = sys._getframe(2)
        skip = self._site_skip
        while frame is not None:
            filename = frame.f_code.co_filename
            skipped = skip.get(filename)
            if skipped is None:
                skipped = skip[filename] = filename.startswith(self._skip_prefixes)
            if not skipped:
                return f"{filename}:{frame.f_lineno} {frame.f_code.co_name}"
            frame = frame.f_back
        return None


class _P2PWrapper:
    """The wrapper of ``isend`` / ``irecv``: compares equal to torch's function, so that
    ``P2POp``'s check (``op in [isend, irecv]``) accepts it."""

    def __init__(self, wrapper: Callable[..., Any], original: Callable[..., Any]) -> None:
        self._wrapper = wrapper
        functools.update_wrapper(self, original)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._wrapper(*args, **kwargs)

    def __eq__(self, other: object) -> bool:
        return other is self or other is self.__wrapped__

    def __hash__(self) -> int:
        return hash(self.__wrapped__)


def _error_text(exc: BaseException) -> str:
    lines = [line for line in str(exc).strip().splitlines() if line.strip()]
    text = f"{type(exc).__name__}: {lines[0].strip() if lines else ''}".rstrip(": ")
    return text[:_MAX_ERROR]


def _binder(original: Callable[..., Any], name: str) -> Callable[..., dict[str, Any]]:
    """A fast ``(args, kwargs) -> {parameter: value}`` for ``original``'s signature."""
    if name == "_broadcast_coalesced":   # a C++ binding without a signature
        names: tuple[str, ...] = ("process_group", "tensors", "buffer_size", "src")
        defaults: dict[str, Any] = {"src": 0}
    else:
        try:
            params = inspect.signature(original).parameters.values()
        except (TypeError, ValueError):  # pragma: no cover - torch functions have signatures
            params = ()
        names = tuple(p.name for p in params
                      if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD))
        defaults = {p.name: p.default for p in params if p.default is not p.empty}

    def bind(args: tuple, kwargs: dict) -> dict[str, Any]:
        bound = dict(defaults)
        bound.update(zip(names, args))
        bound.update(kwargs)
        return bound
    return bind


# -- describing calls ----------------------------------------------------------------------------


def _nbytes(tensor: Any) -> int:
    return tensor.numel() * tensor.element_size()


def _record(first: Any, nbytes: int, tracer: Tracer, group: tuple[int, ...],
            tensors: dict[str, Any], *, async_op: Any = False, op: Any = None,
            root: int | None = None, peer: int | None = None,
            cross_node: bool | None = None) -> dict[str, Any]:
    """A record (keys in :data:`~collsynth.trace.records.CALL_KEYS` order) with everything
    but kind, function, seq and site."""
    raw: dict[str, Any] = {}
    dtype = None
    if first is not None:
        raw["element_size"] = first.element_size()
        dtype = tracer._dtype(first.dtype)
    if tensors:
        shapes: dict[str, Any] = {}
        numel: dict[str, int] = {}
        for arg, value in tensors.items():
            if value is None:
                shapes[arg] = None
            elif isinstance(value, (list, tuple)):
                shapes[arg] = [list(t.shape) for t in value]
                numel[arg] = sum(t.numel() for t in value)
            else:
                shapes[arg] = list(value.shape)
                numel[arg] = value.numel()
        raw["shapes"] = shapes
        raw["numel"] = numel
    return {"type": "call", "seq": None, "kind": None, "function": None, "bytes": int(nbytes),
            "dtype": dtype, "op": None if op is None else tracer._op(op), "group": list(group),
            "group_size": len(group), "root": root, "peer": peer, "async_op": bool(async_op),
            "site": None, "duration_us": None, "cross_node": cross_node, "batch": None,
            "error": None, "raw": raw}


def _op_name(op: Any) -> str:
    inner = getattr(op, "op", op)     # a ReduceOp object holds its RedOpType in .op
    name = getattr(inner, "name", None) or str(inner).rsplit(".", 1)[-1]
    return _OP_NAMES.get(name, name.lower())


def _first(tensors: Any) -> Any:
    return tensors[0] if tensors else None


def _member(tracer: Tracer, group: Any) -> tuple[tuple[int, ...], bool | None] | None:
    ranks, cross = tracer._group(group)
    if tracer._rank not in ranks:      # torch skips the call on a rank outside the group
        return None
    return ranks, cross


def _d_barrier(t: Tracer, a: dict[str, Any]) -> dict[str, Any] | None:
    g = _member(t, a["group"])
    return g and _record(None, 0, t, g[0], {}, async_op=a["async_op"], cross_node=g[1])


def _d_broadcast(t: Tracer, a: dict[str, Any]) -> dict[str, Any] | None:
    g = _member(t, a["group"])
    tensor = a["tensor"]
    return g and _record(tensor, _nbytes(tensor), t, g[0], {"tensor": tensor},
                         async_op=a["async_op"], cross_node=g[1],
                         root=t._global(a["group"], g[0], a["src"], a.get("group_src")))


def _d_broadcast_object_list(t: Tracer, a: dict[str, Any]) -> dict[str, Any] | None:
    g = _member(t, a["group"])
    if not g:
        return None
    record = _record(None, 0, t, g[0], {}, cross_node=g[1],
                     root=t._global(a["group"], g[0], a["src"], a.get("group_src")))
    record["raw"]["objects"] = len(a["object_list"])
    return record


def _d_all_reduce(t: Tracer, a: dict[str, Any]) -> dict[str, Any] | None:
    g = _member(t, a["group"])
    tensor = a["tensor"]
    return g and _record(tensor, _nbytes(tensor), t, g[0], {"tensor": tensor},
                         async_op=a["async_op"], op=a["op"], cross_node=g[1])


def _d_reduce(t: Tracer, a: dict[str, Any]) -> dict[str, Any] | None:
    g = _member(t, a["group"])
    tensor = a["tensor"]
    return g and _record(tensor, _nbytes(tensor), t, g[0], {"tensor": tensor},
                         async_op=a["async_op"], op=a["op"], cross_node=g[1],
                         root=t._global(a["group"], g[0], a["dst"], a.get("group_dst")))


def _d_all_gather(t: Tracer, a: dict[str, Any]) -> dict[str, Any] | None:
    g = _member(t, a["group"])
    outputs, tensor = a["tensor_list"], a["tensor"]
    return g and _record(tensor, sum(_nbytes(x) for x in outputs), t, g[0],
                         {"tensor_list": outputs, "tensor": tensor}, async_op=a["async_op"],
                         cross_node=g[1])


def _d_all_gather_into_tensor(t: Tracer, a: dict[str, Any]) -> dict[str, Any] | None:
    g = _member(t, a["group"])
    output, source = a["output_tensor"], a["input_tensor"]
    return g and _record(source, _nbytes(output), t, g[0],
                         {"output_tensor": output, "input_tensor": source},
                         async_op=a["async_op"], cross_node=g[1])


def _d_reduce_scatter(t: Tracer, a: dict[str, Any]) -> dict[str, Any] | None:
    g = _member(t, a["group"])
    output, inputs = a["output"], a["input_list"]
    return g and _record(output, sum(_nbytes(x) for x in inputs), t, g[0],
                         {"output": output, "input_list": inputs}, async_op=a["async_op"],
                         op=a["op"], cross_node=g[1])


def _d_reduce_scatter_tensor(t: Tracer, a: dict[str, Any]) -> dict[str, Any] | None:
    g = _member(t, a["group"])
    output, source = a["output"], a["input"]
    return g and _record(source, _nbytes(source), t, g[0], {"output": output, "input": source},
                         async_op=a["async_op"], op=a["op"], cross_node=g[1])


def _d_all_to_all(t: Tracer, a: dict[str, Any]) -> dict[str, Any] | None:
    g = _member(t, a["group"])
    outputs, inputs = a["output_tensor_list"], a["input_tensor_list"]
    return g and _record(_first(inputs), sum(_nbytes(x) for x in inputs), t, g[0],
                         {"output_tensor_list": outputs, "input_tensor_list": inputs},
                         async_op=a["async_op"], cross_node=g[1])


def _splits(value: Any) -> list[int] | None:
    return None if value is None else [int(v) for v in value]


def _d_all_to_all_single(t: Tracer, a: dict[str, Any]) -> dict[str, Any] | None:
    g = _member(t, a["group"])
    if not g:
        return None
    output, source = a["output"], a["input"]
    record = _record(source, _nbytes(source), t, g[0], {"output": output, "input": source},
                     async_op=a["async_op"], cross_node=g[1])
    record["raw"]["output_split_sizes"] = _splits(a["output_split_sizes"])
    record["raw"]["input_split_sizes"] = _splits(a["input_split_sizes"])
    return record


def _d_gather(t: Tracer, a: dict[str, Any]) -> dict[str, Any] | None:
    g = _member(t, a["group"])
    tensor = a["tensor"]
    return g and _record(tensor, len(g[0]) * _nbytes(tensor), t, g[0],
                         {"tensor": tensor, "gather_list": a["gather_list"]},
                         async_op=a["async_op"], cross_node=g[1],
                         root=t._global(a["group"], g[0], a["dst"], a.get("group_dst"), 0))


def _d_scatter(t: Tracer, a: dict[str, Any]) -> dict[str, Any] | None:
    g = _member(t, a["group"])
    tensor = a["tensor"]
    return g and _record(tensor, len(g[0]) * _nbytes(tensor), t, g[0],
                         {"tensor": tensor, "scatter_list": a["scatter_list"]},
                         async_op=a["async_op"], cross_node=g[1],
                         root=t._global(a["group"], g[0], a["src"], a.get("group_src"), 0))


def _p2p(t: Tracer, a: dict[str, Any], peer_key: str, async_op: bool) -> dict[str, Any] | None:
    g = _member(t, a["group"])
    if not g:
        return None
    tensor = a["tensor"]
    peer = t._global(a["group"], g[0], a[peer_key], a.get(f"group_{peer_key}"))
    record = _record(tensor, _nbytes(tensor), t, g[0], {"tensor": tensor}, async_op=async_op,
                     peer=peer, cross_node=t._p2p_cross(peer))
    record["raw"]["tag"] = int(a["tag"])
    return record


def _d_send(t: Tracer, a: dict[str, Any]) -> dict[str, Any] | None:
    return _p2p(t, a, "dst", False)


def _d_recv(t: Tracer, a: dict[str, Any]) -> dict[str, Any] | None:
    return _p2p(t, a, "src", False)


def _d_isend(t: Tracer, a: dict[str, Any]) -> dict[str, Any] | None:
    return _p2p(t, a, "dst", True)


def _d_irecv(t: Tracer, a: dict[str, Any]) -> dict[str, Any] | None:
    return _p2p(t, a, "src", True)


def _describe_broadcast_coalesced(t: Tracer, a: dict[str, Any]) -> dict[str, Any] | None:
    group = a["process_group"]
    g = _member(t, group)
    tensors = list(a["tensors"])
    if not g:
        return None
    record = _record(_first(tensors), sum(_nbytes(x) for x in tensors), t, g[0],
                     {"tensors": tensors}, cross_node=g[1],
                     root=t._global(group, g[0], None, a["src"]))
    record["raw"]["buffer_size"] = int(a["buffer_size"])
    record["raw"]["tensors"] = len(tensors)
    return record


_DESCRIBERS: dict[str, Callable[[Tracer, dict[str, Any]], dict[str, Any] | None]] = {
    "barrier": _d_barrier,
    "broadcast": _d_broadcast,
    "broadcast_object_list": _d_broadcast_object_list,
    "all_reduce": _d_all_reduce,
    "reduce": _d_reduce,
    "all_gather": _d_all_gather,
    "all_gather_into_tensor": _d_all_gather_into_tensor,
    "all_gather_single": _d_all_gather_into_tensor,
    "_all_gather_base": _d_all_gather_into_tensor,
    "reduce_scatter": _d_reduce_scatter,
    "reduce_scatter_tensor": _d_reduce_scatter_tensor,
    "reduce_scatter_single": _d_reduce_scatter_tensor,
    "_reduce_scatter_base": _d_reduce_scatter_tensor,
    "all_to_all": _d_all_to_all,
    "all_to_all_single": _d_all_to_all_single,
    "gather": _d_gather,
    "scatter": _d_scatter,
    "send": _d_send,
    "recv": _d_recv,
    "isend": _d_isend,
    "irecv": _d_irecv,
}


# -- the context manager ------------------------------------------------------------------------


@contextlib.contextmanager
def tracing(directory: str | os.PathLike[str], *, record_durations: bool = False,
            cross_node_only: bool = False, ranks_per_node: int | None = None,
            byte_convention: str = "nccl-tests", ddp: bool = False) -> Iterator[Tracer]:
    """Trace this process's torch.distributed calls into ``directory`` while the block runs.

    The rank file ``directory/rank-NNNNN.jsonl`` (the global rank) is written when the block
    ends; it is opened when the default process group is known (at the block's start, at
    ``init_process_group`` inside the block, or at the first call). Every process of the job
    runs its own block; one block per process at a time. Options: :class:`TraceOptions`.

    Yields
    ------
    Tracer
        ``tracer.path`` (the rank file, once known) and ``tracer.records``.

    Raises
    ------
    TracingError
        Another tracing block is active in this process.
    ValueError
        ``cross_node_only`` without ``ranks_per_node`` or ``LOCAL_WORLD_SIZE``.
    UnknownNameError
        An unknown ``byte_convention``.

    Examples
    --------
    Inside an initialised process group (not run as a doctest: it needs one)::

        with tracing("trace/") as tracer:
            dist.all_reduce(torch.ones(1024))
        tracer.path          # PosixPath('trace/rank-00000.jsonl')
    """
    options = TraceOptions(record_durations=record_durations, cross_node_only=cross_node_only,
                           ranks_per_node=ranks_per_node, byte_convention=byte_convention,
                           ddp=ddp)
    tracer = Tracer(directory, options)
    tracer.start()
    try:
        yield tracer
    finally:
        tracer.stop()


# -- DistributedDataParallel --------------------------------------------------------------------


def average_allreduce_hook(process_group, bucket):  # noqa: ANN001, ANN201
    # No annotations: DDP checks them (with this module's postponed annotations they would
    # be strings, which DDP refuses).
    """DDP's default gradient reduction as a communication hook: divide the bucket by the group
    size, then allreduce (sum) it through ``torch.distributed.all_reduce`` (so a tracer sees it).

    The same arithmetic as DDP without a hook and as torch's ``allreduce_hook``.
    """
    import torch.distributed as dist

    group = process_group if process_group is not None else dist.group.WORLD
    tensor = bucket.buffer()
    tensor.div_(group.size())
    return dist.all_reduce(tensor, group=group, async_op=True).get_future().then(
        lambda fut: fut.value()[0])


def _bucket_tagging(hook: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(hook)
    def traced_hook(state, bucket):  # noqa: ANN001, ANN202 - see average_allreduce_hook
        tracer = _active_tracer()
        if tracer is None:
            return hook(state, bucket)
        local = tracer._local
        previous, local.ddp_bucket = local.ddp_bucket, int(bucket.index())
        try:
            return hook(state, bucket)
        finally:
            local.ddp_bucket = previous
    traced_hook._collsynth_traced_hook = True  # type: ignore[attr-defined]
    return traced_hook


def trace_ddp(model: Any, *, hook: Callable[..., Any] | None = None, state: Any = None) -> Any:
    """Register on ``model`` (a DistributedDataParallel) a communication hook a tracer sees.

    DDP reduces gradient buckets in C++, out of the tracer's sight. With this hook each bucket
    is reduced by ``hook`` (default :func:`average_allreduce_hook` with ``state`` the model's
    process group, ``None`` for the default one: DDP's own arithmetic) through the Python
    collectives, and while a tracer is
    active every call the hook makes is recorded with ``raw.ddp_bucket`` set to the bucket's
    index. Register it once, before training (DDP accepts one hook per model); it costs nothing
    when no tracer is active.

    Returns
    -------
    The model.
    """
    if hook is None:
        hook = average_allreduce_hook
        if state is None:
            import torch.distributed as dist

            group = getattr(model, "process_group", None)
            # The default group is looked up at each call (the hook's None), not held by the
            # hook: a group still referenced after destroy_process_group is torn down at
            # interpreter exit instead, where gloo can abort.
            state = None if group is None or group is dist.group.WORLD else group
    model.register_comm_hook(state, _bucket_tagging(hook))
    model._collsynth_traced = True
    return model


def _ddp_forward(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not getattr(self, "_collsynth_traced", False):
            self._collsynth_traced = True
            if not getattr(self, "_comm_hooks", None):
                try:
                    trace_ddp(self)
                except RuntimeError as exc:   # a built-in (C++) hook is registered
                    _log.warning("cannot trace the gradient buckets of a DDP model: %s", exc)
        return original(self, *args, **kwargs)
    return forward


def _ddp_register_comm_hook(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def register_comm_hook(self: Any, state: Any, hook: Callable[..., Any]) -> None:
        if not getattr(hook, "_collsynth_traced_hook", False):
            hook = _bucket_tagging(hook)
        self._collsynth_traced = True
        return original(self, state, hook)
    return register_comm_hook
