"""What each runtime accepts: limits, required attributes, collective spellings, fused ops.

Figures from ``docs/msccl-xml.md`` §4, §6, §7 and §14.1. ``msccl-executor`` is
Azure's msccl-executor-nccl, whose parser is RCCL's (§1, §13.3) with its own defaults
(64 steps per tb; ``32 x MAXCHANNELS`` thread blocks) and, being NCCL-based, the full op set.
"""

from __future__ import annotations

from dataclasses import dataclass

from collsynth.errors import UnknownNameError

__all__ = ["Runtime", "RUNTIMES", "get_runtime", "runtime_names"]


@dataclass(frozen=True)
class Runtime:
    """One runtime's reader and executor rules."""

    name: str
    max_steps_per_tb: int          # MSCCL_MAX_NUM_STEPS: s < this, and steps per tb <= this
    max_threadblocks: int          # MSCCL_MAX_NUM_THREAD_BLOCKS per rank
    max_tbs_per_channel: int       # tbs with a send (recv) peer per channel per rank
    max_channels: int              # MAXCHANNELS
    max_count: int                 # cnt < this
    requires_range_attributes: bool  # outofplace, minBytes, maxBytes required
    fused_ops: bool                # executes rcs / rrs / rrc / rrcs
    max_bytes_zero_is_unlimited: bool
    collectives: dict              # collsynth collective name -> the runtime's coll spelling

    def coll_name(self, collective: str) -> str | None:
        """The ``coll`` attribute for a collsynth collective name, or ``None`` if unsupported."""
        return self.collectives.get(collective)


_COMMON = {"allreduce": "allreduce", "allgather": "allgather", "alltoall": "alltoall",
           "broadcast": "broadcast", "reduce": "reduce"}

RUNTIMES: dict[str, Runtime] = {
    "msccl": Runtime("msccl", 256, 216, 32, 32, 72, False, True, False,
                     {**_COMMON, "reduce_scatter": "reduce_scatter", "custom": "custom"}),
    "rccl": Runtime("rccl", 64, 64, 32, 128, 72, True, False, True,
                    {**_COMMON, "reduce_scatter": "reducescatter", "gather": "gather",
                     "scatter": "scatter"}),
    "msccl-executor": Runtime("msccl-executor", 64, 32 * 32, 32, 32, 72, True, True, True,
                              {**_COMMON, "reduce_scatter": "reducescatter", "gather": "gather",
                               "scatter": "scatter"}),
}


def runtime_names() -> list[str]:
    return sorted(RUNTIMES)


def get_runtime(name: str) -> Runtime:
    """A runtime by name (``msccl``, ``rccl``, ``msccl-executor``)."""
    key = name.strip().lower()
    if key not in RUNTIMES:
        raise UnknownNameError(f"unknown runtime {name!r}; valid: {', '.join(runtime_names())}")
    return RUNTIMES[key]
