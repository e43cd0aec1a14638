"""The trace file format: one JSON-lines file per rank, and its validating reader.

Every field of the header and of a call record, and the reader's checks, are in docs/trace.md.
Files are untrusted input: errors name the file, the line and the field.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Iterator, Mapping

from collsynth._files import check_input_file, list_inputs, open_input
from collsynth._parse import (
    MAX_INT64,
    MAX_SIZE_BYTES,
    MAX_TIME_US,
    clean_name,
    clean_text,
    free_form,
    parse_json,
    shown,
)
from collsynth.errors import FileFormatError, InputTooLargeError, expect_path

__all__ = [
    "FORMAT",
    "VERSION",
    "KINDS",
    "ROOTED_KINDS",
    "P2P_KINDS",
    "REDUCING_KINDS",
    "DTYPE_BYTES",
    "dtype_bytes",
    "BYTE_CONVENTIONS",
    "HEADER_KEYS",
    "CALL_KEYS",
    "MAX_TRACE_BYTES",
    "MAX_LINE_BYTES",
    "MAX_WORLD_SIZE",
    "TraceHeader",
    "CallRecord",
    "RankTrace",
    "Trace",
    "rank_file_name",
    "read_trace",
    "read_rank_file",
]

#: The ``format`` of a trace header.
FORMAT = "collsynth-trace"
#: The ``version`` of the format this module writes and reads.
VERSION = 1
#: Normalised collective names, in the order summaries list them.
KINDS = ("barrier", "broadcast", "broadcast_object_list", "allreduce", "reduce", "allgather",
         "reduce_scatter", "alltoall", "gather", "scatter", "send", "recv", "isend", "irecv")
#: Kinds with a root (``root`` is set).
ROOTED_KINDS = frozenset({"broadcast", "broadcast_object_list", "reduce", "gather", "scatter"})
#: Point-to-point kinds (``peer`` is set, except for a receive from an unknown source).
P2P_KINDS = frozenset({"send", "recv", "isend", "irecv"})
#: Kinds with a reduction (``op`` is set).
REDUCING_KINDS = frozenset({"allreduce", "reduce", "reduce_scatter"})
#: Bytes per element of the dtypes torch traces name (``float32``; ``torch.float32`` too).
DTYPE_BYTES: Mapping[str, int] = MappingProxyType({
    "float64": 8, "double": 8, "float32": 4, "float": 4, "float16": 2, "half": 2, "bfloat16": 2,
    "int64": 8, "long": 8, "int32": 4, "int": 4, "int16": 2, "short": 2, "int8": 1, "uint8": 1,
    "bool": 1, "complex64": 8, "complex128": 16, "float8_e4m3fn": 1, "float8_e5m2": 1,
    "uint16": 2, "uint32": 4, "uint64": 8,
})


def dtype_bytes(dtype: str | None) -> int | None:
    """Bytes per element of a traced dtype name, or ``None`` when unknown.

    >>> dtype_bytes("bfloat16"), dtype_bytes("torch.float32"), dtype_bytes("mystery")
    (2, 4, None)
    """
    if not isinstance(dtype, str):
        return None
    return DTYPE_BYTES.get(dtype.strip().lower().removeprefix("torch."))


#: Byte conventions a trace may use (see ``bytes`` in docs/trace.md).
BYTE_CONVENTIONS = ("nccl-tests",)
#: Keys of a header line, in the order they are written.
HEADER_KEYS = ("type", "format", "version", "rank", "world_size", "backend", "byte_convention",
               "hostname", "pid", "torch_version", "started_unix", "record_durations",
               "cross_node_only", "ranks_per_node")
#: Keys of a call line, in the order they are written.
#: The reductions a trace names: torch.distributed's ReduceOp types, as the tracer writes them.
REDUCE_OPS = ("sum", "avg", "prod", "min", "max", "band", "bor", "bxor", "premul_sum")
CALL_KEYS = ("type", "seq", "kind", "function", "bytes", "dtype", "op", "group", "group_size",
             "root", "peer", "async_op", "site", "duration_us", "cross_node", "batch", "error",
             "raw")
#: Most bytes :func:`read_trace` reads from a directory's rank files together (1 GiB).
MAX_TRACE_BYTES = 1 << 30
#: Longest line :func:`read_trace` accepts (1 MiB).
MAX_LINE_BYTES = 1 << 20
#: Largest ``world_size`` a header may give.
MAX_WORLD_SIZE = 1 << 20
#: Longest text field (function, site, error, hostname...).
_MAX_TEXT = 4096

_RANK_FILE = re.compile(r"^rank-([0-9]{5,})\.jsonl$")


def rank_file_name(rank: int) -> str:
    """The file name of global rank ``rank``'s trace.

    >>> rank_file_name(3)
    'rank-00003.jsonl'
    """
    return f"rank-{rank:05d}.jsonl"


@dataclass(frozen=True)
class TraceHeader:
    """The first line of a rank's file (docs/trace.md describes each field)."""

    rank: int
    world_size: int
    backend: str
    byte_convention: str
    hostname: str
    pid: int
    torch_version: str
    started_unix: float
    record_durations: bool
    cross_node_only: bool
    ranks_per_node: int | None
    version: int = VERSION


@dataclass(frozen=True)
class CallRecord:
    """One traced call of one rank (docs/trace.md describes each field).

    ``rank`` is the global rank whose file holds the record; ``group`` is a tuple of global
    ranks; ``raw`` is the record's ``raw`` object as read (do not modify it).
    """

    rank: int
    seq: int
    kind: str
    function: str
    bytes: int
    dtype: str | None
    op: str | None
    group: tuple[int, ...]
    group_size: int
    root: int | None
    peer: int | None
    async_op: bool
    site: str | None
    duration_us: float | None
    cross_node: bool | None
    batch: int | None
    error: str | None
    raw: Mapping[str, Any]

    @property
    def split_sizes(self) -> tuple[list[int] | None, list[int] | None]:
        """``(input_split_sizes, output_split_sizes)`` of an ``all_to_all_single`` call (each
        ``None`` when not given: equal splits)."""
        return self.raw.get("input_split_sizes"), self.raw.get("output_split_sizes")


@dataclass(frozen=True)
class RankTrace:
    """The header and calls of one rank's file."""

    path: str
    header: TraceHeader
    calls: tuple[CallRecord, ...]

    @property
    def rank(self) -> int:
        return self.header.rank


@dataclass(frozen=True)
class Trace:
    """Every rank file of a trace directory, in rank order.

    The files agree on ``world_size``, ``byte_convention``, ``backend`` and ``ranks_per_node``
    (checked when read). Ranks whose
    file is missing are listed by :attr:`missing_ranks`.
    """

    directory: str
    ranks: tuple[RankTrace, ...]

    @property
    def world_size(self) -> int:
        return self.ranks[0].header.world_size

    @property
    def byte_convention(self) -> str:
        return self.ranks[0].header.byte_convention

    @property
    def rank_numbers(self) -> tuple[int, ...]:
        """The global ranks that have a file."""
        return tuple(r.rank for r in self.ranks)

    @property
    def missing_ranks(self) -> tuple[int, ...]:
        """Global ranks below ``world_size`` without a file."""
        present = set(self.rank_numbers)
        return tuple(r for r in range(self.world_size) if r not in present)

    def rank(self, rank: int) -> RankTrace:
        """The file of global rank ``rank``; :class:`KeyError` if there is none."""
        for entry in self.ranks:
            if entry.rank == rank:
                return entry
        raise KeyError(f"no trace file for rank {rank} in {self.directory}")

    def calls(self) -> Iterator[CallRecord]:
        """Every call of every rank: rank 0's in order, then rank 1's, ..."""
        for entry in self.ranks:
            yield from entry.calls


# -- reading ------------------------------------------------------------------------------------


def read_trace(directory: str | os.PathLike[str], *,
               max_total_bytes: int = MAX_TRACE_BYTES) -> Trace:
    """Read and check every ``rank-NNNNN.jsonl`` file of ``directory``.

    Other files (an unfinished ``.rank-00000.jsonl.*.tmp`` of a process that died, notes) are
    ignored; a ``rank-NNNNN.jsonl`` that is not a regular file (a FIFO) is refused unopened.

    Parameters
    ----------
    directory:
        The directory the tracer wrote.
    max_total_bytes:
        Refuse rank files larger than this in all (bytes; default :data:`MAX_TRACE_BYTES`).

    Returns
    -------
    Trace
        The files in rank order.

    Raises
    ------
    FileFormatError
        No such directory, no rank file in it, a rank file that is not a regular file, a
        file that breaks the format (names the file, the line and the field), or files that
        disagree (world size, byte convention, backend, ranks per node, a header rank that is
        not the file name's), or
        two files of one rank (rank-00003.jsonl and rank-000003.jsonl).
    InputTooLargeError
        More than ``max_total_bytes`` of rank files, or a line longer than
        :data:`MAX_LINE_BYTES`.

    Examples
    --------
    >>> import json, tempfile, pathlib
    >>> header = {"type": "header", "format": "collsynth-trace", "version": 1, "rank": 0,
    ...           "world_size": 1, "backend": "gloo", "byte_convention": "nccl-tests",
    ...           "hostname": "h", "pid": 1, "torch_version": "2.13.0", "started_unix": 0.0,
    ...           "record_durations": False, "cross_node_only": False, "ranks_per_node": None}
    >>> call = {"type": "call", "seq": 0, "kind": "allreduce", "function": "all_reduce",
    ...         "bytes": 64, "dtype": "float32", "op": "sum", "group": [0], "group_size": 1,
    ...         "root": None, "peer": None, "async_op": False, "site": "train.py:3 main",
    ...         "duration_us": None, "cross_node": None, "batch": None, "error": None,
    ...         "raw": {"element_size": 4, "shapes": {"tensor": [16]}, "numel": {"tensor": 16}}}
    >>> with tempfile.TemporaryDirectory() as folder:
    ...     path = pathlib.Path(folder) / rank_file_name(0)
    ...     _ = path.write_text(json.dumps(header) + "\\n" + json.dumps(call) + "\\n")
    ...     trace = read_trace(folder)
    >>> trace.world_size, [(c.kind, c.bytes, c.group) for c in trace.rank(0).calls]
    (1, [('allreduce', 64, (0,))])
    """
    folder = Path(expect_path(directory, "directory"))
    if not folder.exists() and not folder.is_symlink():  # a link's loop: list_inputs says
        raise FileFormatError(folder, "no such directory")
    if folder.exists() and not folder.is_dir():
        raise FileFormatError(folder, "is not a directory; expected the trace directory "
                                      "(holding rank-NNNNN.jsonl files)")
    # Only regular files: a FIFO named rank-00004.jsonl is refused, never opened.
    paths = list_inputs(folder, _RANK_FILE, what="a trace file")
    if not paths:
        raise FileFormatError(folder, "no trace files (rank-NNNNN.jsonl) in this directory")
    total = sum(check_input_file(path).st_size for path in paths)
    if total > max_total_bytes:
        raise InputTooLargeError(f"{folder}: the trace files hold {total} bytes, more than the "
                                 f"{max_total_bytes} a trace may have")
    # rank-00003.jsonl and rank-000003.jsonl both name rank 3: reading both would count its
    # calls twice, so two files of one rank are refused, naming both.
    named: dict[int, Path] = {}
    for path in paths:
        rank = int(_RANK_FILE.match(path.name).group(1))
        if rank in named:
            raise FileFormatError(folder, f"two trace files of rank {rank}: {named[rank].name} "
                                          f"and {path.name}; keep one ({rank_file_name(rank)})")
        named[rank] = path
    ranks = sorted((read_rank_file(path) for path in paths), key=lambda r: r.rank)
    first = ranks[0]
    for entry in ranks:
        expected = int(_RANK_FILE.match(Path(entry.path).name).group(1))
        if entry.rank != expected:
            raise FileFormatError(entry.path, f"line 1: field 'rank': the header says rank "
                                              f"{entry.rank}, the file name rank {expected}")
        for key in ("world_size", "byte_convention", "backend", "ranks_per_node"):
            mine, theirs = getattr(entry.header, key), getattr(first.header, key)
            if mine != theirs:
                raise FileFormatError(entry.path, f"line 1: field {key!r}: {mine!r}, but "
                                                  f"{first.path} has {theirs!r}")
    return Trace(str(folder), tuple(ranks))


def read_rank_file(path: str | os.PathLike[str]) -> RankTrace:
    """Read and check one rank's file (see :func:`read_trace` for the errors)."""
    p = Path(expect_path(path))
    header: TraceHeader | None = None
    calls: list[CallRecord] = []
    last_seq = -1
    with open_input(p) as handle:
        number = 0
        while True:
            try:
                line = handle.readline(MAX_LINE_BYTES + 1)
            except OSError as exc:
                raise FileFormatError(p, f"cannot read: {exc.strerror or exc}") from exc
            if not line:
                break
            number += 1
            if len(line) > MAX_LINE_BYTES:
                raise InputTooLargeError(f"{p}: line {number} is longer than the "
                                         f"{MAX_LINE_BYTES} bytes a trace line may have")
            if not line.strip():
                continue
            obj = _parse_line(line, p, number)
            if header is None:
                header = _header(obj, p, number)
                continue
            call = _call(obj, header, p, number)
            if call.seq <= last_seq:
                raise FileFormatError(p, f"line {number}: field 'seq': {call.seq} does not "
                                         f"follow {last_seq} (sequence numbers increase)")
            last_seq = call.seq
            calls.append(call)
    if header is None:
        raise FileFormatError(p, "empty file; expected a header line first")
    return RankTrace(str(p), header, tuple(calls))


#: Latest ``started_unix`` a header may give: the year 5138 (10^11 s); later is not a clock.
_MAX_UNIX_SECONDS = 1e11


def _parse_line(line: bytes, path: Path, number: int) -> dict[str, Any]:
    obj = parse_json(line, str(path), line=number)
    if not isinstance(obj, dict):
        raise FileFormatError(path, f"line {number}: expected a JSON object, got "
                                    f"{type(obj).__name__}")
    return obj


class _Fields:
    """Typed access to the fields of one line, with errors naming the file, line and field."""

    def __init__(self, obj: dict[str, Any], keys: tuple[str, ...], path: Path, number: int,
                 what: str) -> None:
        self.obj, self.path, self.number = obj, path, number
        missing = [k for k in keys if k not in obj]
        if missing:
            self.fail(missing[0], f"missing from the {what} line")
        extra = sorted(k for k in obj if k not in keys)
        if extra:
            self.fail(extra[0], f"unknown field in a {what} line (version {VERSION} has "
                                f"{', '.join(keys)})")

    def fail(self, key: str, message: str) -> None:
        raise FileFormatError(self.path, f"line {self.number}: field {key!r}: {message}")

    def _bad(self, key: str, expected: str) -> None:
        try:
            value = json.dumps(self.obj[key])
        except (ValueError, RecursionError):  # an integer of thousands of digits, deep lists
            value = shown(self.obj[key])
        written = value if len(value) <= 60 else value[:57] + "..."
        self.fail(key, f"expected {expected}, got {written}")

    def get_int(self, key: str, *, minimum: int = 0, maximum: int | None = None,
            null: bool = False, cap: int = MAX_INT64, why: str = "") -> int | None:
        """An integer from ``minimum`` to ``maximum``; above ``cap`` (a plausibility bound, not
        part of the format) it is refused saying ``why``."""
        value = self.obj[key]
        if value is None and null:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum or \
                (maximum is not None and value > maximum):
            upper = f" and <= {maximum}" if maximum is not None else ""
            self._bad(key, f"an integer >= {minimum}{upper}" + (" or null" if null else ""))
        if value > cap:
            self.fail(key, f"{shown(value)} is more than {cap}" + (f" ({why})" if why else ""))
        return value

    def get_str(self, key: str, *, null: bool = False, choices: tuple[str, ...] | None = None,
            text: bool = False) -> str | None:
        """A string of at most 4096 characters: a name (no control characters), or free
        ``text`` (TAB and newlines allowed)."""
        value = self.obj[key]
        if value is None and null:
            return None
        if not isinstance(value, str) or len(value) > _MAX_TEXT or \
                (choices is not None and value not in choices):
            expected = f"one of {', '.join(choices)}" if choices else \
                f"a string of at most {_MAX_TEXT} characters"
            self._bad(key, expected + (" or null" if null else ""))
        where = f"line {self.number}: field {key!r}"
        if text:
            return clean_text(value, where, source=str(self.path), max_chars=_MAX_TEXT)
        return clean_name(value, where, source=str(self.path), max_chars=_MAX_TEXT, empty=True)

    def get_bool(self, key: str, *, null: bool = False) -> bool | None:
        value = self.obj[key]
        if value is None and null:
            return None
        if not isinstance(value, bool):
            self._bad(key, "true or false" + (" or null" if null else ""))
        return value

    def get_number(self, key: str, *, null: bool = False, cap: float,
                   why: str = "") -> float | None:
        """A finite number >= 0; above ``cap`` (a plausibility bound) refused saying ``why``."""
        value = self.obj[key]
        if value is None and null:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or \
                (isinstance(value, float) and not math.isfinite(value)) or value < 0:
            self._bad(key, "a number >= 0" + (" or null" if null else ""))
        if value > cap:
            self.fail(key, f"{shown(value)} is more than {cap:g}" + (f" ({why})" if why else ""))
        return float(value)


def _header(obj: dict[str, Any], path: Path, number: int) -> TraceHeader:
    if obj.get("type") != "header":
        raise FileFormatError(path, f"line {number}: field 'type': the first line must be the "
                                    f"header (type \"header\"), got {json.dumps(obj.get('type'))}")
    f = _Fields(obj, HEADER_KEYS, path, number, "header")
    if obj["format"] != FORMAT:
        f._bad("format", f"{FORMAT!r}")
    if obj["version"] != VERSION or isinstance(obj["version"], bool):
        f.fail("version", f"unsupported version {json.dumps(obj['version'])}; this collsynth "
                          f"reads version {VERSION}")
    world_size = f.get_int("world_size", minimum=1, maximum=MAX_WORLD_SIZE)
    rank = f.get_int("rank", maximum=world_size - 1)
    return TraceHeader(
        rank=rank, world_size=world_size, backend=f.get_str("backend"),
        byte_convention=f.get_str("byte_convention", choices=BYTE_CONVENTIONS),
        hostname=f.get_str("hostname"), pid=f.get_int("pid"),
        torch_version=f.get_str("torch_version"),
        started_unix=f.get_number("started_unix", cap=_MAX_UNIX_SECONDS,
                                  why="seconds since 1970: the year 5138"),
        record_durations=f.get_bool("record_durations"),
        cross_node_only=f.get_bool("cross_node_only"),
        ranks_per_node=f.get_int("ranks_per_node", minimum=1, null=True, cap=MAX_WORLD_SIZE,
                                 why="the most ranks a trace may have"))


def _call(obj: dict[str, Any], header: TraceHeader, path: Path, number: int) -> CallRecord:
    if obj.get("type") != "call":
        raise FileFormatError(path, f"line {number}: field 'type': expected \"call\", got "
                                    f"{json.dumps(obj.get('type'))}")
    f = _Fields(obj, CALL_KEYS, path, number, "call")
    kind = f.get_str("kind", choices=KINDS)
    function = f.get_str("function")
    if not function:
        f._bad("function", "a torch function name")
    group_value = obj["group"]
    if not isinstance(group_value, list) or not group_value or \
            any(isinstance(r, bool) or not isinstance(r, int) or not 0 <= r < header.world_size
                for r in group_value):
        f._bad("group", f"a non-empty list of global ranks below world_size "
                        f"{header.world_size}")
    group = tuple(group_value)
    if len(set(group)) != len(group):
        f.fail("group", "a rank appears twice")
    if header.rank not in group:
        f.fail("group", f"rank {header.rank} (this file's) is not in the group {list(group)}")
    group_size = f.get_int("group_size", minimum=1, cap=MAX_WORLD_SIZE,
                           why="the most ranks a trace may have")
    if group_size != len(group):
        f.fail("group_size", f"{group_size}, but the group has {len(group)} ranks")
    root = f.get_int("root", null=True)
    peer = f.get_int("peer", null=True)
    error = f.get_str("error", null=True, text=True)
    if error is None:     # a call that raised may have had any arguments
        _check_ends(f, kind, header.rank, group, root, peer)
    op = f.get_str("op", null=True)
    if op is not None and op not in REDUCE_OPS:
        f.fail("op", f"{shown(op)}: not a torch.distributed ReduceOp; expected one of "
                     f"{', '.join(REDUCE_OPS)}")
    if (kind in REDUCING_KINDS) != (op is not None):
        f.fail("op", f"a {kind} " + ("has a reduction; got null" if kind in REDUCING_KINDS
                                      else "has no reduction; expected null"))
    raw = obj["raw"]
    if not isinstance(raw, dict):
        f._bad("raw", "an object")
    free_form(raw, f"line {number}: field 'raw'", source=str(path))
    _check_raw(raw, f)
    size = f.get_int("bytes", cap=MAX_SIZE_BYTES, why="1 PiB: more than any GPU holds")
    dtype = f.get_str("dtype", null=True)
    _check_elements(f, size, dtype, raw)
    return CallRecord(
        rank=header.rank, seq=f.get_int("seq"), kind=kind, function=function,
        bytes=size, dtype=dtype, op=op, group=group,
        group_size=group_size, root=root, peer=peer, async_op=f.get_bool("async_op"),
        site=f.get_str("site", null=True, text=True),
        duration_us=f.get_number("duration_us", null=True, cap=MAX_TIME_US,
                                 why="microseconds: a call of more than an hour is a hang"),
        cross_node=f.get_bool("cross_node", null=True), batch=f.get_int("batch", null=True),
        error=error, raw=raw)


def _check_elements(f: _Fields, size: int, dtype: str | None, raw: Mapping[str, Any]) -> None:
    """``raw.element_size`` agrees with a known ``dtype``, and ``bytes`` is a whole number of
    elements: the planner selects programs by element count, so a mismatch would plan a call
    the runtime refuses or splits differently."""
    known = dtype_bytes(dtype)
    given = raw.get("element_size")
    if known is not None and given is not None and given != known:
        f.fail("raw.element_size", f"{given}, but dtype {dtype} has {known} bytes per element")
    width = given if given is not None else known
    if width is not None and size % width:
        f.fail("bytes", f"{size} is not a whole number of {width}-byte elements"
                        + (f" ({dtype})" if dtype is not None else ""))


def _check_ends(f: _Fields, kind: str, rank: int, group: tuple[int, ...], root: int | None,
                peer: int | None) -> None:
    """``root`` and ``peer`` are set where the kind has them, and are ranks of the group."""
    if kind in ROOTED_KINDS and root is None:
        f.fail("root", f"a {kind} has a root; got null")
    if kind not in ROOTED_KINDS and root is not None:
        f.fail("root", f"a {kind} has no root; expected null")
    if root is not None and root not in group:
        f.fail("root", f"rank {root} is not in the group {list(group)}")
    if kind in P2P_KINDS:
        if peer is None and kind in ("send", "isend"):
            f.fail("peer", f"a {kind} has a peer; got null")
        if peer is not None and (peer not in group or peer == rank):
            f.fail("peer", f"rank {peer} is not another rank of the group {list(group)}")
    elif peer is not None:
        f.fail("peer", f"a {kind} has no peer; expected null")


def _is_shape(value: Any) -> bool:
    return isinstance(value, list) and all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in value)


def _check_raw(raw: dict[str, Any], f: _Fields) -> None:
    """The ``raw`` keys this module documents have the documented types."""
    def bad(key: str, expected: str) -> None:
        value = json.dumps(raw[key])
        shown = value if len(value) <= 60 else value[:57] + "..."
        f.fail(f"raw.{key}", f"expected {expected}, got {shown}")

    def count(value: Any) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and value >= 0

    if "element_size" in raw and not (count(raw["element_size"]) and raw["element_size"] > 0):
        bad("element_size", "an integer >= 1")
    for key in ("shapes", "numel"):
        if key not in raw:
            continue
        if not isinstance(raw[key], dict):
            bad(key, "an object (argument name -> value)")
        for name, value in raw[key].items():
            ok = count(value) if key == "numel" else (
                value is None or _is_shape(value)
                or (isinstance(value, list) and all(_is_shape(s) for s in value)))
            if not ok:
                f.fail(f"raw.{key}.{name}", "expected " + (
                    "an integer >= 0" if key == "numel"
                    else "a shape (list of integers >= 0), a list of shapes or null"))
    for key in ("input_split_sizes", "output_split_sizes"):
        if key in raw and raw[key] is not None and not _is_shape(raw[key]):
            bad(key, "a list of integers >= 0 or null")
    for key in ("objects", "ddp_bucket", "buffer_size", "tensors"):
        if key in raw and not count(raw[key]):
            bad(key, "an integer >= 0")
    if "tag" in raw and (isinstance(raw["tag"], bool) or not isinstance(raw["tag"], int)):
        bad("tag", "an integer")
    if "inner" in raw:
        inner = raw["inner"]
        if not isinstance(inner, list) or not all(
                isinstance(i, dict) and isinstance(i.get("function"), str)
                and count(i.get("bytes")) for i in inner):
            bad("inner", 'a list of {"function": str, "bytes": int, "dtype": str} objects')
