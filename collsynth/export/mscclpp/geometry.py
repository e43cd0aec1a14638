"""Bytes of a plan at one message size: chunk size, buffer capacities, offsets as the runtime
computes them, and the cell (the largest unit every access is made of) the checker tracks.

Offsets follow MSCCL++'s ``ExecutionPlan::Impl::getOffset``/``calcOffset`` (slices of
``buffer_alignment`` bytes for thread block groups), the kernel's pipeline iterations
(``min(size - offset, unit)`` in 32-bit unsigned arithmetic) and the reused scratch buffer
(``offset % scratch chunk``); ``docs/mscclpp.md``, section "Chunks, bytes and packets".
"""

from __future__ import annotations

from dataclasses import dataclass
from math import gcd

from collsynth.export.mscclpp.limits import MSCCLPP
from collsynth.export.mscclpp.model import Plan

__all__ = ["Geometry", "geometry", "default_chunk_bytes", "calc_offset", "message_bytes"]

_UINT32 = 1 << 32


def calc_offset(size: int, index: int, slices: int, alignment: int) -> int:
    """Byte offset of slice ``index`` of ``slices`` of a ``size``-byte range (the runtime's
    ``calcOffset``: whole ``alignment`` units, the remainder spread over the first slices).

    >>> [calc_offset(48, i, 2, 16) for i in range(3)]
    [0, 32, 48]
    """
    nelems = size // alignment
    least, extra = divmod(nelems, slices)
    return (index * least + min(index, extra)) * alignment


def message_bytes(plan: Plan, chunk_bytes: int) -> int:
    """The message size the executor compares with min/max_message_size: the input size, or
    the output size for an allgather (``checkMessageSize``)."""
    gpu = plan.gpus[0]
    chunks = gpu.output_chunks if plan.collective == "allgather" else gpu.input_chunks
    return chunks * chunk_bytes


def _lcm(a: int, b: int) -> int:
    return a * b // gcd(a, b)


def _tbg_sizes(plan: Plan) -> set[int]:
    sizes = set()
    for gpu in plan.gpus:
        for tb in gpu.threadblocks:
            for op in tb.ops:
                for inner in (op, *op.ops):
                    if inner.tbg is not None:
                        sizes.add(inner.tbg[1])
    return sizes


def _pipelines(plan: Plan) -> list[tuple[int, int]]:
    found = set()
    for gpu in plan.gpus:
        for tb in gpu.threadblocks:
            for op in tb.ops:
                if op.name == "pipeline" and op.unit_size and op.num_chunks:
                    found.add((op.unit_size, op.num_chunks))
    return sorted(found)


def default_chunk_bytes(plan: Plan) -> int | None:
    """The chunk size the checker runs ``plan`` at: the smallest multiple of
    ``buffer_alignment`` x (every thread block group size) at which every pipeline runs at least
    two iterations, moved into [min_message_size, max_message_size]; ``None`` when no chunk
    size gives a message in that range."""
    base = plan.buffer_alignment
    for size in _tbg_sizes(plan):
        base = _lcm(base, size * plan.buffer_alignment) if size > 1 else base
    want = base
    for unit, chunks in _pipelines(plan):
        want = max(want, -(-2 * unit // chunks))
    cs = -(-want // base) * base
    per = message_bytes(plan, 1) or 1
    if per * cs < plan.min_message_size:
        cs = -(-plan.min_message_size // (per * base)) * base
    if per * cs > plan.max_message_size:
        cs = plan.max_message_size // (per * base) * base
        if cs < base or per * cs < plan.min_message_size:
            return None
    return cs


@dataclass(frozen=True)
class Geometry:
    """Byte sizes of one run. ``scratch_chunk_bytes`` is the reused scratch's chunk (0 when
    resources are not reused)."""

    chunk_bytes: int
    alignment: int
    packets: bool
    reuse_scratch: bool
    scratch_chunk_bytes: int
    double_scratch: bool

    def capacity(self, plan: Plan, rank: int, buffer: str) -> int:
        """Bytes the executor gives ``rank``'s buffer (scratch: doubled for LL packets)."""
        gpu = plan.gpus[rank]
        if buffer == "i":
            return gpu.input_chunks * self.chunk_bytes
        if buffer == "o":
            return gpu.output_chunks * self.chunk_bytes
        if self.reuse_scratch and gpu.scratch_chunks > 0:
            size = MSCCLPP.default_scratch_bytes
            return size // 2 if self.double_scratch else size
        return gpu.scratch_chunks * self.chunk_bytes * (2 if self.packets else 1)

    def range(self, index: int, size: int, buffer: str | None,
              tbg: tuple[int, int] | None) -> tuple[int, int]:
        """(offset, length) in bytes of chunks ``index .. index + size`` for one thread block
        of a group (``tbg = (tb_id, tbg_size)``)."""
        cs = self.chunk_bytes
        if buffer == "s" and self.reuse_scratch and 0 < self.scratch_chunk_bytes < cs:
            offset = index * self.scratch_chunk_bytes
            length = size * self.scratch_chunk_bytes
        else:
            offset, length = index * cs, size * cs
        if tbg is not None:
            t, g = tbg
            start = calc_offset(length, t, g, self.alignment)
            offset, length = offset + start, calc_offset(length, t + 1, g, self.alignment) - start
        return offset, length

    def iteration(self, buffer: str | None, offset: int) -> int:
        """The kernel's offset of a pipeline iteration into ``buffer``."""
        if self.reuse_scratch and buffer == "s" and self.scratch_chunk_bytes:
            return offset % self.scratch_chunk_bytes
        return offset

    @staticmethod
    def step_length(length: int, offset: int, unit: int) -> int:
        """``min(size - offset, unit)`` in 32-bit unsigned arithmetic (a range shorter than
        the iteration's offset wraps to a huge size, so the whole unit is moved)."""
        return min((length - offset) % _UINT32, unit)

    def iterations(self, num_chunks: int, unit: int) -> int:
        """Pipeline iterations: ``ceil(num_chunks * chunk / unit)``."""
        return -(-num_chunks * self.chunk_bytes // unit)


def geometry(plan: Plan, chunk_bytes: int) -> Geometry:
    """The geometry of ``plan`` with chunks of ``chunk_bytes`` bytes."""
    reuse = plan.reuse_resources
    scs = 0
    scratch = max((g.scratch_chunks for g in plan.gpus), default=0)
    if reuse and scratch:
        size = MSCCLPP.predefined_scratch_bytes
        if plan.use_double_scratch_buffer:
            size //= 2
        per = -(-size // scratch)
        scs = -(-per // plan.buffer_alignment) * plan.buffer_alignment
    return Geometry(chunk_bytes, plan.buffer_alignment, plan.protocol == "LL", reuse, scs,
                    plan.use_double_scratch_buffer)
