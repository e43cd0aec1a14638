"""Read an MSCCL++ execution plan (JSON) into :class:`~collsynth.export.mscclpp.model.Plan`.

Parsed safely (:mod:`collsynth._parse`: bounded size, numbers and nesting), then every field is
checked for its JSON type and range as MSCCL++'s parser reads it; anything else is a one-line
:class:`~collsynth.errors.FileFormatError` naming the file and the field
(``gpus[0].threadblocks[2].ops[5].src_buff[0].index = -1: ...``). Rules that need the whole
plan (bounds, channels, races, the result) are the checker's. Unknown keys are ignored, as the
runtime ignores them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from collsynth._files import read_bytes_bounded, read_head
from collsynth._parse import bounded_int, clean_name, parse_json, shown
from collsynth.errors import FileFormatError
from collsynth.export.mscclpp.limits import BUFFER_TYPES, CHANNEL_TYPES, OPERATIONS
from collsynth.export.mscclpp.model import (
    BufferRef,
    Channel,
    ChannelGroup,
    GpuPlan,
    Operation,
    Plan,
    RankGroup,
    RemoteBuffer,
    RemoteBufferRefs,
    Threadblock,
)

__all__ = ["MAX_PLAN_BYTES", "MAX_RANKS", "MAX_INDEX", "read_plan", "parse_plan", "looks_like_plan"]

#: Largest plan file read (bytes). The DSL's largest example plan is under 1 MB.
MAX_PLAN_BYTES = 256 * 1024 * 1024
#: Most GPUs a plan may describe (a plan is loaded by every rank; 16384 GPUs is beyond any
#: machine MSCCL++ has run on).
MAX_RANKS = 16384
#: Largest chunk index, size or count, channel or buffer id: the runtime keeps offsets and
#: sizes in 32-bit unsigned bytes, so larger chunk numbers cannot address anything.
MAX_INDEX = (1 << 31) - 1
_UINT64_MAX = (1 << 64) - 1
_INT32 = (-(1 << 31), (1 << 31) - 1)


class _Reader:
    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, field: str, message: str) -> FileFormatError:
        return FileFormatError(self.source, f"{field}{message}" if field else
                               message.lstrip(": "))

    def obj(self, value: Any, field: str) -> dict:
        if not isinstance(value, dict):
            raise self.fail(field, f" = {shown(value)}: expected a JSON object")
        return value

    def need(self, obj: dict, key: str, field: str) -> Any:
        if key not in obj:
            raise self.fail(field, f": the key {key!r} is missing (MSCCL++'s parser requires it)")
        return obj[key]

    def array(self, obj: dict, key: str, field: str, *, required: bool = False) -> list:
        if key not in obj:
            if required:
                self.need(obj, key, field)
            return []
        value = obj[key]
        if not isinstance(value, list):
            raise self.fail(f"{field}.{key}", f" = {shown(value)}: expected a JSON array")
        return value

    def int(self, obj: dict, key: str, field: str, *, lo: int | None = 0, hi: int = MAX_INDEX,
            default: int | None = None, why: str = "") -> int:
        if key not in obj and default is not None:
            return default
        return bounded_int(self.need(obj, key, field), f"{field}.{key}".lstrip("."),
                           source=self.source, lo=lo, hi=hi, why=why)

    def ints(self, obj: dict, key: str, field: str, *, hi: int = MAX_INDEX,
             required: bool = False) -> tuple[int, ...]:
        values = self.array(obj, key, field, required=required)
        if not values:  # most operations have none: no field names to build
            return ()
        where = f"{field}.{key}".lstrip(".")
        return tuple(bounded_int(v, f"{where}[{i}]", source=self.source, lo=0, hi=hi)
                     for i, v in enumerate(values))

    def bool(self, obj: dict, key: str, field: str, default: bool | None = None) -> bool:
        if key not in obj and default is not None:
            return default
        value = self.need(obj, key, field)
        if not isinstance(value, bool):
            raise self.fail(f"{field}.{key}".lstrip("."), f" = {shown(value)}: expected true or "
                                                          "false")
        return value

    def choice(self, value: Any, field: str, allowed: tuple[str, ...], what: str) -> str:
        if not isinstance(value, str) or value not in allowed:
            raise self.fail(field, f" = {shown(value)}: not {what} MSCCL++ knows (expected one "
                                   f"of {', '.join(allowed)})")
        return value

    # -- the plan ----------------------------------------------------------------------------

    def plan(self, data: Any) -> Plan:
        top = self.obj(data, "the plan")
        name = clean_name(self.need(top, "name", ""), "name", source=self.source)
        collective = clean_name(self.need(top, "collective", ""), "collective",
                                source=self.source)
        protocol = clean_name(self.need(top, "protocol", ""), "protocol", source=self.source)
        gpus_raw = self.array(top, "gpus", "", required=True)
        if len(gpus_raw) > MAX_RANKS:
            raise self.fail("gpus", f": {len(gpus_raw)} GPUs; a plan may describe at most "
                                    f"{MAX_RANKS}")
        if not gpus_raw:
            raise self.fail("gpus", ": empty; a plan describes at least one GPU")
        gpus = tuple(self.gpu(g, f"gpus[{i}]", len(gpus_raw)) for i, g in enumerate(gpus_raw))
        return Plan(
            name=name, collective=collective, protocol=protocol,
            inplace=self.bool(top, "inplace", ""), gpus=gpus,
            reuse_resources=self.bool(top, "reuse_resources", "", default=False),
            num_threads_per_block=self.int(top, "num_threads_per_block", "", lo=1,
                                           default=1024),
            use_double_scratch_buffer=self.bool(top, "use_double_scratch_buffer", "",
                                                default=False),
            buffer_alignment=self.int(top, "buffer_alignment", "", lo=1, hi=1 << 20,
                                      default=16),
            min_message_size=self.int(top, "min_message_size", "", hi=_UINT64_MAX, default=0),
            max_message_size=self.int(top, "max_message_size", "", hi=_UINT64_MAX,
                                      default=_UINT64_MAX))

    def gpu(self, raw: Any, field: str, n: int) -> GpuPlan:
        gpu = self.obj(raw, field)
        rank_hi = n - 1
        channels = tuple(self.channel(c, f"{field}.channels[{i}]", rank_hi)
                         for i, c in enumerate(self.array(gpu, "channels", field)))
        remote = []
        for i, rb in enumerate(self.array(gpu, "remote_buffers", field)):
            where = f"{field}.remote_buffers[{i}]"
            rb = self.obj(rb, where)
            types = tuple(self.choice(t, f"{where}.access_channel_types[{k}]", CHANNEL_TYPES,
                                      "a channel type")
                          for k, t in enumerate(self.array(rb, "access_channel_types", where)))
            remote.append(RemoteBuffer(
                rank=self.int(rb, "rank", where, hi=rank_hi, why=f"the plan has {n} GPUs"),
                type=self.choice(self.need(rb, "type", where), f"{where}.type", BUFFER_TYPES,
                                 "a buffer type"),
                access_channel_types=types))
        semaphores = []
        for i, sem in enumerate(self.array(gpu, "semaphores", field)):
            where = f"{field}.semaphores[{i}]"
            semaphores.append(self.int(self.obj(sem, where), "init_value", where,
                                       lo=_INT32[0], hi=_INT32[1]))
        tbs = tuple(self.threadblock(tb, f"{field}.threadblocks[{i}]")
                    for i, tb in enumerate(self.array(gpu, "threadblocks", field,
                                                      required=True)))
        return GpuPlan(
            id=self.int(gpu, "id", field, hi=rank_hi, why=f"the plan has {n} GPUs"),
            input_chunks=self.int(gpu, "input_chunks", field),
            output_chunks=self.int(gpu, "output_chunks", field),
            scratch_chunks=self.int(gpu, "scratch_chunks", field),
            threadblocks=tbs, channels=channels, remote_buffers=tuple(remote),
            semaphores=tuple(semaphores))

    def channel(self, raw: Any, field: str, rank_hi: int) -> Channel:
        ch = self.obj(raw, field)
        kind = self.choice(self.need(ch, "channel_type", field), f"{field}.channel_type",
                           CHANNEL_TYPES, "a channel type")
        if kind != "switch":
            return Channel(kind, connected_to=self.ints(ch, "connected_to", field, hi=rank_hi))
        groups = []
        for i, g in enumerate(self.array(ch, "rank_groups", field)):
            where = f"{field}.rank_groups[{i}]"
            g = self.obj(g, where)
            groups.append(RankGroup(self.int(g, "size", where),
                                    self.ints(g, "ranks", where, hi=rank_hi, required=True)))
        return Channel(kind, buffer_type=self.choice(self.need(ch, "buffer_type", field),
                                                     f"{field}.buffer_type", BUFFER_TYPES,
                                                     "a buffer type"),
                       rank_groups=tuple(groups))

    def threadblock(self, raw: Any, field: str) -> Threadblock:
        tb = self.obj(raw, field)
        groups = []
        for i, c in enumerate(self.array(tb, "channels", field)):
            where = f"{field}.channels[{i}]"
            c = self.obj(c, where)
            groups.append(ChannelGroup(
                self.choice(self.need(c, "channel_type", where), f"{where}.channel_type",
                            CHANNEL_TYPES, "a channel type"),
                self.ints(c, "channel_ids", where, required=True)))
        refs = []
        for i, r in enumerate(self.array(tb, "remote_buffer_refs", field)):
            where = f"{field}.remote_buffer_refs[{i}]"
            r = self.obj(r, where)
            refs.append(RemoteBufferRefs(
                self.choice(self.need(r, "access_channel_type", where),
                            f"{where}.access_channel_type", CHANNEL_TYPES, "a channel type"),
                self.ints(r, "remote_buffer_ids", where, required=True)))
        ops = tuple(self.operation(op, f"{field}.ops[{i}]", nested=False)
                    for i, op in enumerate(self.array(tb, "ops", field, required=True)))
        return Threadblock(self.int(tb, "id", field), ops, tuple(groups), tuple(refs))

    def operation(self, raw: Any, field: str, *, nested: bool) -> Operation:
        op = self.obj(raw, field)
        name = op.get("name")
        if not isinstance(name, str) or name not in OPERATIONS:  # the field's name only then
            name = self.choice(self.need(op, "name", field), f"{field}.name", OPERATIONS,
                               "an operation")
        channel_type = None
        if "channel_type" in op:
            channel_type = self.choice(op["channel_type"], f"{field}.channel_type",
                                       CHANNEL_TYPES, "a channel type")
        tbg = None
        if "tbg_info" in op:
            info = self.obj(op["tbg_info"], f"{field}.tbg_info")
            size = self.int(info, "tbg_size", f"{field}.tbg_info", lo=1, hi=1 << 16)
            tbg = (self.int(info, "tb_id", f"{field}.tbg_info", hi=size - 1,
                            why=f"tb_id is a position in a group of tbg_size={size}"), size)
        reduce_op = None
        if "reduce_op" in op:
            reduce_op = clean_name(op["reduce_op"], f"{field}.reduce_op", source=self.source)
        unit_size = num_chunks = None
        body: tuple[Operation, ...] = ()
        if name == "pipeline":
            if nested:
                raise self.fail(field, ": a pipeline inside a pipeline (the runtime runs one "
                                       "level only)")
            ctx = self.obj(self.need(op, "iter_context", field), f"{field}.iter_context")
            unit_size = self.int(ctx, "unit_size", f"{field}.iter_context", lo=1,
                                 hi=(1 << 32) - 1)
            num_chunks = self.int(ctx, "num_chunks", f"{field}.iter_context", lo=1)
            body = tuple(self.operation(inner, f"{field}.ops[{i}]", nested=True)
                         for i, inner in enumerate(self.array(op, "ops", field, required=True)))
        return Operation(
            name=name,
            src=tuple(self.buffer(b, f"{field}.src_buff[{i}]")
                      for i, b in enumerate(self.array(op, "src_buff", field))),
            dst=tuple(self.buffer(b, f"{field}.dst_buff[{i}]")
                      for i, b in enumerate(self.array(op, "dst_buff", field))),
            channel_type=channel_type,
            channel_ids=self.ints(op, "channel_ids", field),
            tbg=tbg,
            barrier_id=self.int(op, "barrier_id", field) if "barrier_id" in op else None,
            num_threadblocks=(self.int(op, "num_threadblocks", field, lo=1)
                              if "num_threadblocks" in op else None),
            semaphore_ids=self.ints(op, "semaphore_ids", field),
            reduce_op=reduce_op, unit_size=unit_size, num_chunks=num_chunks, ops=body)

    def buffer(self, raw: Any, field: str) -> BufferRef:
        b = self.obj(raw, field)
        btype = None
        if "type" in b:
            btype = self.choice(b["type"], f"{field}.type", BUFFER_TYPES, "a buffer type")
        ref = BufferRef(
            index=self.int(b, "index", field), size=self.int(b, "size", field), type=btype,
            buffer_id=self.int(b, "buffer_id", field) if "buffer_id" in b else None,
            switch_channel_id=(self.int(b, "switch_channel_id", field)
                               if "switch_channel_id" in b else None),
            rank=self.int(b, "rank", field) if "rank" in b else None)
        if btype is None and ref.buffer_id is None and ref.switch_channel_id is None:
            raise self.fail(field, ": names no buffer (expected 'type', 'buffer_id' or "
                                   "'switch_channel_id')")
        return ref


def parse_plan(text: str | bytes, *, source: str = "<plan>") -> Plan:
    """The plan in JSON ``text``; ``source`` names it in messages.

    Raises
    ------
    FileFormatError
        Malformed JSON, or a field of the wrong type, out of range or missing.
    """
    return _Reader(source).plan(parse_json(text, source))


def read_plan(path: str | os.PathLike[str]) -> Plan:
    """Read the plan file ``path`` (refused above :data:`MAX_PLAN_BYTES`).

    Raises
    ------
    FileFormatError
        A missing or unreadable file, or what :func:`parse_plan` refuses.
    InputTooLargeError
        A file above :data:`MAX_PLAN_BYTES`.
    """
    data = read_bytes_bounded(path, MAX_PLAN_BYTES, what="an MSCCL++ plan may have")
    return parse_plan(data, source=str(path))


def looks_like_plan(path: str | os.PathLike[str]) -> bool:
    """True when ``path`` is a JSON file rather than XML: its first non-blank byte is ``{`` or
    ``[``, or it is not ``<`` and the name ends in ``.json`` (an empty or ``null`` plan is
    refused by the JSON reader, not misread as XML).

    Raises
    ------
    FileFormatError
        ``path`` is missing or not a regular file (as :func:`collsynth._files.read_head`).
    """
    # Through the one opening layer: a FIFO or device is refused there, never waited on.
    head = read_head(path, 4096).lstrip(b"\xef\xbb\xbf \t\r\n")
    if head[:1] in (b"{", b"["):
        return True
    return head[:1] != b"<" and os.fspath(path).lower().endswith(".json")
