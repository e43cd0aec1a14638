"""What each runtime that loads MSCCL XML accepts: limits, required attributes, spellings.

Figures from ``docs/msccl-xml.md`` §4, §6, §7, §13 and §14.1. ``msccl-executor`` is Azure's
msccl-executor-nccl, whose parser is RCCL's (§1, §13.3) with its own defaults (64 steps per tb;
``32 x MAXCHANNELS`` thread blocks) and, being NCCL-based, the full op set.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping

__all__ = ["XmlDialect", "MSCCL", "RCCL", "MSCCL_EXECUTOR", "DIALECTS"]


@dataclass(frozen=True, kw_only=True)
class XmlDialect:
    """One runtime's XML reader and interpreter rules (keyword-only).

    Parameters
    ----------
    name:
        The runtime's name (``msccl``, ``rccl``, ``msccl-executor``).
    max_steps_per_tb:
        ``MSCCL_MAX_NUM_STEPS``: a step's ``s`` is below it, and a tb holds at most that many.
    max_threadblocks:
        ``MSCCL_MAX_NUM_THREAD_BLOCKS`` per rank.
    max_tbs_per_channel:
        Thread blocks with a send (recv) peer per channel per rank.
    max_channels:
        ``MAXCHANNELS``.
    max_count:
        A step's ``cnt`` is below it (``MSCCL_MAX_COUNT``).
    max_algorithms:
        ``MSCCL_MAX_NUM_ALGOS``: algorithm files loaded at once.
    requires_range_attributes:
        ``outofplace``, ``minBytes``, ``maxBytes`` are required.
    fused_ops:
        The interpreter executes ``rcs``, ``rrs``, ``rrc`` and ``rrcs``.
    max_bytes_zero_is_unlimited:
        ``maxBytes="0"`` means no upper limit.
    collectives:
        collsynth collective name -> the runtime's ``coll`` spelling.
    """

    name: str
    max_steps_per_tb: int
    max_threadblocks: int
    max_tbs_per_channel: int
    max_channels: int
    max_count: int
    max_algorithms: int
    requires_range_attributes: bool
    fused_ops: bool
    max_bytes_zero_is_unlimited: bool
    collectives: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "collectives", MappingProxyType(dict(self.collectives)))

    def coll_name(self, collective: str) -> str | None:
        """The ``coll`` attribute for a collsynth collective name, or ``None`` if unsupported."""
        return self.collectives.get(collective)


_COMMON = {"allreduce": "allreduce", "allgather": "allgather", "alltoall": "alltoall",
           "broadcast": "broadcast", "reduce": "reduce"}

#: microsoft/msccl (NCCL 2.12 fork).
MSCCL = XmlDialect(
    name="msccl", max_steps_per_tb=256, max_threadblocks=216, max_tbs_per_channel=32,
    max_channels=32, max_count=72, max_algorithms=4, requires_range_attributes=False,
    fused_ops=True, max_bytes_zero_is_unlimited=False,
    collectives={**_COMMON, "reduce_scatter": "reduce_scatter", "custom": "custom"})
#: RCCL up to 2.27.7 (ROCm 7.2).
RCCL = XmlDialect(
    name="rccl", max_steps_per_tb=64, max_threadblocks=64, max_tbs_per_channel=32,
    max_channels=128, max_count=72, max_algorithms=1024, requires_range_attributes=True,
    fused_ops=False, max_bytes_zero_is_unlimited=True,
    collectives={**_COMMON, "reduce_scatter": "reducescatter", "gather": "gather",
                 "scatter": "scatter"})
#: Azure/msccl-executor-nccl (NCCL 2.23 fork, RCCL's parser).
MSCCL_EXECUTOR = XmlDialect(
    name="msccl-executor", max_steps_per_tb=64, max_threadblocks=32 * 32, max_tbs_per_channel=32,
    max_channels=32, max_count=72, max_algorithms=1024, requires_range_attributes=True,
    fused_ops=True, max_bytes_zero_is_unlimited=True,
    collectives={**_COMMON, "reduce_scatter": "reducescatter", "gather": "gather",
                 "scatter": "scatter"})
#: Every dialect by its runtime's name.
DIALECTS: Mapping[str, XmlDialect] = MappingProxyType(
    {d.name: d for d in (MSCCL, RCCL, MSCCL_EXECUTOR)})
