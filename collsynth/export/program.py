"""The MSCCL program IR: one value per XML element, exactly what the runtimes read.

``Program`` (``<algo>``) > ``GpuProgram`` (``<gpu>``) > ``ThreadBlock`` (``<tb>``) > ``XmlStep``
(``<step>``). Field names follow the XML attributes (see ``docs/msccl-xml.md`` §4-§7), so the
writer and the reader are one-to-one. Offsets and counts are in *chunks* of the reference buffer
(``nchunksperloop`` chunks); a step's operands are ``srcbuf[srcoff .. srcoff + cnt)`` and
``dstbuf[dstoff .. dstoff + cnt)`` with buffers ``i`` (input), ``o`` (output), ``s`` (scratch).

The exporter builds these values from an algorithm; the reader builds them from XML text; the
checker executes them symbolically. Nothing here knows about XML text.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["OPS", "SEND_OPS", "RECV_OPS", "FUSED_OPS", "BUFFERS", "XmlStep", "ThreadBlock",
           "GpuProgram", "Program"]

#: Every step type the runtimes know.
OPS = ("s", "r", "rcs", "rrs", "rrc", "rrcs", "cpy", "re", "nop")
#: Step types that send one message to the tb's ``send`` peer.
SEND_OPS = frozenset({"s", "rcs", "rrs", "rrcs"})
#: Step types that take one message from the tb's ``recv`` peer.
RECV_OPS = frozenset({"r", "rcs", "rrs", "rrc", "rrcs"})
#: Fused receive-and-something ops (refused at launch by rccl).
FUSED_OPS = frozenset({"rcs", "rrs", "rrc", "rrcs"})
#: Buffer names: input, output, scratch.
BUFFERS = ("i", "o", "s")


@dataclass(frozen=True, slots=True)
class XmlStep:
    """One ``<step>``. ``depid``/``deps`` name a step *position* in another tb of the same rank
    (``-1``: none); ``hasdep`` is 1 when another tb waits for this step. ``line`` is the source
    line when read from a file (for messages), else ``None``."""

    s: int
    type: str
    srcbuf: str
    srcoff: int
    dstbuf: str
    dstoff: int
    cnt: int
    depid: int = -1
    deps: int = -1
    hasdep: int = 0
    line: int | None = field(default=None, compare=False)


@dataclass(frozen=True, slots=True)
class ThreadBlock:
    """One ``<tb>``: a sequential list of steps bound to at most one send peer and one receive
    peer (``-1``: none) on one channel."""

    id: int
    send: int
    recv: int
    chan: int
    steps: tuple[XmlStep, ...]
    line: int | None = field(default=None, compare=False)


@dataclass(frozen=True, slots=True)
class GpuProgram:
    """One ``<gpu>``: the program of rank ``id`` and how many chunks of each buffer it uses."""

    id: int
    i_chunks: int
    o_chunks: int
    s_chunks: int
    threadblocks: tuple[ThreadBlock, ...]
    line: int | None = field(default=None, compare=False)


@dataclass(frozen=True, slots=True)
class Program:
    """One ``<algo>``.

    ``coll`` is the runtime's spelling (``reduce_scatter`` for msccl, ``reducescatter`` for rccl).
    ``outofplace``, ``min_bytes``, ``max_bytes`` and ``nthreads`` are ``None`` when absent (rccl
    requires the first three). ``extra`` keeps attributes the runtimes ignore (name -> value).
    """

    name: str
    proto: str
    nchannels: int
    nchunksperloop: int
    ngpus: int
    coll: str
    inplace: int
    gpus: tuple[GpuProgram, ...]
    outofplace: int | None = None
    min_bytes: int | None = None
    max_bytes: int | None = None
    nthreads: int | None = None
    extra: tuple[tuple[str, str], ...] = ()
