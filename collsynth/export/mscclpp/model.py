"""An MSCCL++ execution plan as plain values: one dataclass per JSON object of the format.

``Plan`` > ``GpuPlan`` > ``Threadblock`` > ``Operation`` > ``BufferRef``. Field names follow the
JSON keys MSCCL++'s parser reads (``docs/mscclpp.md``, section "The format"), so the reader and
the writer are one-to-one. Indices and sizes are in *chunks* of the rank's buffers; the byte
size of a chunk is fixed only when the plan runs (message size / ``input_chunks``).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["BufferRef", "Operation", "ChannelGroup", "RemoteBufferRefs", "Threadblock",
           "RankGroup", "Channel", "RemoteBuffer", "GpuPlan", "Plan"]


@dataclass(frozen=True, slots=True)
class BufferRef:
    """One entry of ``src_buff`` / ``dst_buff``: chunks ``index .. index + size`` of a local
    buffer (``type``), of a remote buffer (``buffer_id``: a position in the threadblock's
    remote buffers of the operation's channel type) or of a switch channel's buffer
    (``switch_channel_id``: a position in the threadblock's switch channels). ``rank`` is
    written by the DSL on some local entries and ignored by the runtime."""

    index: int
    size: int
    type: str | None = None
    buffer_id: int | None = None
    switch_channel_id: int | None = None
    rank: int | None = None

    @property
    def kind(self) -> str:
        """``"switch"``, ``"remote"`` or ``"local"`` (the parser's order of precedence)."""
        if self.switch_channel_id is not None:
            return "switch"
        if self.buffer_id is not None:
            return "remote"
        return "local"


@dataclass(frozen=True, slots=True)
class Operation:
    """One entry of ``ops``. Only the fields of the operation's kind are set: ``tbg`` is
    ``(tb_id, tbg_size)`` of ``tbg_info``; a ``pipeline`` has ``unit_size`` (bytes),
    ``num_chunks`` and its body ``ops``."""

    name: str
    src: tuple[BufferRef, ...] = ()
    dst: tuple[BufferRef, ...] = ()
    channel_type: str | None = None
    channel_ids: tuple[int, ...] = ()
    tbg: tuple[int, int] | None = None
    barrier_id: int | None = None
    num_threadblocks: int | None = None
    semaphore_ids: tuple[int, ...] = ()
    reduce_op: str | None = None
    unit_size: int | None = None
    num_chunks: int | None = None
    ops: tuple["Operation", ...] = ()


@dataclass(frozen=True, slots=True)
class ChannelGroup:
    """One entry of a threadblock's ``channels``: the rank's channels of ``channel_type`` at
    positions ``channel_ids`` become the threadblock's channels 0, 1, ... of that type."""

    channel_type: str
    channel_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class RemoteBufferRefs:
    """One entry of a threadblock's ``remote_buffer_refs``: the rank's remote buffers
    ``remote_buffer_ids`` become the threadblock's remote buffers 0, 1, ... for
    ``access_channel_type``."""

    access_channel_type: str
    remote_buffer_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Threadblock:
    """One entry of ``threadblocks``: a sequence of operations, run by one CUDA block."""

    id: int
    ops: tuple[Operation, ...]
    channels: tuple[ChannelGroup, ...] = ()
    remote_buffer_refs: tuple[RemoteBufferRefs, ...] = ()


@dataclass(frozen=True, slots=True)
class RankGroup:
    """One ``rank_groups`` entry of a switch channel: the ranks of one multicast group."""

    size: int
    ranks: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Channel:
    """One entry of a GPU's ``channels``. Memory and port channels: one channel per entry of
    ``connected_to``, numbered per type in the order written. Switch channels: one per rank
    group, over the ``buffer_type`` buffer of every rank of the group."""

    channel_type: str
    connected_to: tuple[int, ...] = ()
    buffer_type: str | None = None
    rank_groups: tuple[RankGroup, ...] = ()


@dataclass(frozen=True, slots=True)
class RemoteBuffer:
    """One entry of a GPU's ``remote_buffers``: ``rank``'s buffer ``type``, which that rank
    registers and sends, reachable through ``access_channel_types``."""

    rank: int
    type: str
    access_channel_types: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class GpuPlan:
    """One entry of ``gpus``: the program of rank ``id``. ``semaphores`` holds each
    semaphore's ``init_value``."""

    id: int
    input_chunks: int
    output_chunks: int
    scratch_chunks: int
    threadblocks: tuple[Threadblock, ...]
    channels: tuple[Channel, ...] = ()
    remote_buffers: tuple[RemoteBuffer, ...] = ()
    semaphores: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class Plan:
    """A whole execution plan (the JSON object). Message sizes are bytes, both inclusive."""

    name: str
    collective: str
    protocol: str
    inplace: bool
    gpus: tuple[GpuPlan, ...]
    reuse_resources: bool = False
    num_threads_per_block: int = 1024
    use_double_scratch_buffer: bool = False
    buffer_alignment: int = 16
    min_message_size: int = 0
    max_message_size: int = (1 << 64) - 1

    @property
    def num_ranks(self) -> int:
        return len(self.gpus)
