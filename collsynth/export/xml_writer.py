"""Write a :class:`Program` as MSCCL XML in exactly the dialect the runtimes' reader accepts.

The runtimes do not use an XML parser but NCCL's small topology-file reader
(docs/msccl-xml.md §2), so the text is written by hand, never through an XML library; the
rules of that dialect are in docs/export.md.
"""

from __future__ import annotations

import os
import re

from collsynth._atomic import write_text_atomic
from collsynth.errors import ExportError
from collsynth.export.program import BUFFERS, OPS, Program
from collsynth.runtimes import xml_dialect

__all__ = ["write_program", "save_xml", "MAX_ATTRIBUTES"]

#: The reader keeps at most this many attributes per element (MAX_ATTR_COUNT).
MAX_ATTRIBUTES = 16
#: The reader's limit on names and values (MAX_STR_LEN = 255 with the terminator).
_MAX_VALUE = 254
#: What a value or an extra attribute name may contain: no quote, markup or whitespace.
_SAFE_VALUE = re.compile(r"[^\"<>&\s]*")
_SAFE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_INDENT = "  "
#: A ``<step>`` line (depth 3) with its ten attributes in msccl-tools' order.
_STEP = (_INDENT * 3 + '<step s="{}" type="{}" srcbuf="{}" srcoff="{}" dstbuf="{}" dstoff="{}" '
         'cnt="{}" depid="{}" deps="{}" hasdep="{}"/>')


def write_program(program: Program, runtime: str) -> str:
    """The XML text of ``program`` for ``runtime`` (ends with a newline).

    Raises
    ------
    ExportError
        When ``program`` cannot be written for ``runtime``: a ``coll`` the runtime does not
        know, a missing attribute the runtime requires (rccl: ``outofplace``, ``minBytes``,
        ``maxBytes``), fused ops for a runtime that refuses them, more than 16 attributes, a
        value the reader would misread (quotes, spaces, over 254 characters), an unknown op or
        buffer.

    Example
    -------
    >>> from collsynth.export.program import GpuProgram, Program, ThreadBlock, XmlStep
    >>> step = XmlStep(0, "cpy", "i", 0, "o", 0, 1)
    >>> gpu = GpuProgram(0, 1, 1, 0, (ThreadBlock(0, -1, -1, 0, (step,)),))
    >>> print(write_program(Program("copy", "Simple", 1, 1, 1, "allreduce", 0, (gpu,)), "msccl"), end="")
    <algo name="copy" proto="Simple" nchannels="1" nchunksperloop="1" ngpus="1" coll="allreduce" inplace="0">
      <gpu id="0" i_chunks="1" o_chunks="1" s_chunks="0">
        <tb id="0" send="-1" recv="-1" chan="0">
          <step s="0" type="cpy" srcbuf="i" srcoff="0" dstbuf="o" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="0"/>
        </tb>
      </gpu>
    </algo>
    """
    rt = xml_dialect(runtime)
    if program.coll not in rt.collectives.values():
        raise ExportError(f"{rt.name} does not know coll={program.coll!r}; it knows "
                          f"{', '.join(sorted(set(rt.collectives.values())))}")
    if rt.requires_range_attributes:
        missing = [label for label, value in (("outofplace", program.outofplace),
                                              ("minBytes", program.min_bytes),
                                              ("maxBytes", program.max_bytes)) if value is None]
        if missing:
            raise ExportError(f"{rt.name} requires the <algo> attribute(s) {', '.join(missing)}")
    algo = [("name", program.name), ("proto", program.proto), ("nchannels", program.nchannels),
            ("nchunksperloop", program.nchunksperloop), ("ngpus", program.ngpus),
            ("coll", program.coll), ("inplace", program.inplace)]
    for label, value in (("outofplace", program.outofplace), ("minBytes", program.min_bytes),
                         ("maxBytes", program.max_bytes), ("nthreads", program.nthreads)):
        if value is not None:
            algo.append((label, value))
    algo.extend(program.extra)
    lines = [_start("algo", algo, 0, ">")]
    for gpu in program.gpus:
        lines.append(_start("gpu", [("id", gpu.id), ("i_chunks", gpu.i_chunks),
                                    ("o_chunks", gpu.o_chunks), ("s_chunks", gpu.s_chunks)],
                            1, ">"))
        for tb in gpu.threadblocks:
            lines.append(_start("tb", [("id", tb.id), ("send", tb.send), ("recv", tb.recv),
                                       ("chan", tb.chan)], 2, ">"))
            for step in tb.steps:
                if step.type not in OPS:
                    raise ExportError(f"rank {gpu.id} threadblock {tb.id} step {step.s}: unknown "
                                      f"op {step.type!r}")
                if step.type in ("rcs", "rrs", "rrc", "rrcs") and not rt.fused_ops:
                    raise ExportError(f"{rt.name} refuses to run {step.type!r} steps (rank "
                                      f"{gpu.id} threadblock {tb.id} step {step.s})")
                for buffer in (step.srcbuf, step.dstbuf):
                    if buffer not in BUFFERS:
                        raise ExportError(f"rank {gpu.id} threadblock {tb.id} step {step.s}: "
                                          f"unknown buffer {buffer!r}")
                numbers = (step.s, step.srcoff, step.dstoff, step.cnt, step.depid, step.deps,
                           step.hasdep)
                if all(type(value) is int for value in numbers):
                    # The common case, written directly: plain ints and names checked above
                    # are always safe (the same text _start writes).
                    lines.append(_STEP.format(step.s, step.type, step.srcbuf, step.srcoff,
                                              step.dstbuf, step.dstoff, step.cnt, step.depid,
                                              step.deps, step.hasdep))
                    continue
                lines.append(_start("step", [
                    ("s", step.s), ("type", step.type), ("srcbuf", step.srcbuf),
                    ("srcoff", step.srcoff), ("dstbuf", step.dstbuf), ("dstoff", step.dstoff),
                    ("cnt", step.cnt), ("depid", step.depid), ("deps", step.deps),
                    ("hasdep", step.hasdep)], 3, "/>"))
            lines.append(f"{_INDENT * 2}</tb>")
        lines.append(f"{_INDENT}</gpu>")
    lines.append("</algo>")
    return "\n".join(lines) + "\n"


def save_xml(program: Program, path: str | os.PathLike[str], runtime: str) -> None:
    """Write ``program`` for ``runtime`` to ``path`` atomically (a reader never sees half a
    file)."""
    write_text_atomic(path, write_program(program, runtime))


def _start(tag: str, attributes: list[tuple[str, object]], depth: int, close: str) -> str:
    """One start tag on one line."""
    if len(attributes) > MAX_ATTRIBUTES:
        raise ExportError(f"<{tag}> would have {len(attributes)} attributes; the runtimes' reader "
                          f"keeps {MAX_ATTRIBUTES} and silently drops the rest")
    parts = [_INDENT * depth + "<" + tag]
    for label, value in attributes:
        parts.append(f'{_name(tag, label)}="{_value(tag, label, value)}"')
    return " ".join(parts) + close


def _name(tag: str, label: str) -> str:
    if not _SAFE_NAME.fullmatch(label) or len(label) > _MAX_VALUE:
        raise ExportError(f"<{tag}> attribute name {label!r} cannot be read by the runtimes")
    return label


def _value(tag: str, label: str, value: object) -> str:
    if isinstance(value, bool):
        raise ExportError(f"<{tag} {label}> is a boolean; expected an integer or text")
    text = str(int(value)) if isinstance(value, int) else str(value)
    if not _SAFE_VALUE.fullmatch(text) or len(text) > _MAX_VALUE:
        raise ExportError(f"<{tag} {label}={text[:40]!r}> would be misread: values may not "
                          f"contain quotes, markup or whitespace, and have at most {_MAX_VALUE} "
                          "characters")
    return text
