"""What MSCCL++'s executor accepts: operation names, channel and buffer types, fixed limits.

Figures from MSCCL++'s ``src/core/include/execution_common.hpp`` and the parser
``src/core/executor/execution_plan.cc`` (read at commit 1f5f065, VERSION 0.9.0); what each
one means for a plan: ``docs/mscclpp.md``, section "Limits". One value, :data:`MSCCLPP`, so a
runtime registry can hold it beside the XML runtimes.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["MscclppLimits", "MSCCLPP", "OPERATIONS", "BUFFER_TYPES", "CHANNEL_TYPES",
           "PLAN_PROTOCOLS", "COLLECTIVES"]

#: Every operation name the parser knows (``getOpType``); any other refuses the file.
OPERATIONS = ("nop", "barrier", "put", "pws", "pwsf", "get", "copy", "signal", "wait", "flush",
              "re", "res", "rre", "rres", "ppkt", "rppkt", "respkt", "cpkt", "upkt", "repkt",
              "recpkt", "recspkt", "glres", "gstore", "gstorepkt", "rlxsignal", "rlxwait",
              "pipeline", "sem_acquire", "sem_release")
#: Buffer types: input, output, scratch.
BUFFER_TYPES = ("i", "o", "s")
#: Channel types (``none`` is parsed but names no channel).
CHANNEL_TYPES = ("memory", "port", "switch", "none")
#: Protocols: ``LL`` doubles the scratch buffer for packets (data + flag); anything else is
#: read as Simple by the parser, which only tests for ``"LL"``.
PLAN_PROTOCOLS = ("Simple", "LL")
#: Collectives collsynth knows the postcondition of, in MSCCL++'s spelling.
COLLECTIVES = ("allgather", "allreduce", "reducescatter", "alltoall", "sendrecv")


@dataclass(frozen=True)
class MscclppLimits:
    """The executor's fixed sizes (``execution_common.hpp``) and defaults (the parser)."""

    name: str = "mscclpp"
    max_operations_per_threadblock: int = 64    # MAX_OPERATION (pipeline inner ops count)
    max_channels_per_threadblock: int = 16      # MAX_CHANNEL, per channel type
    max_remote_buffers_per_threadblock: int = 16  # MAX_CHANNEL, per access channel type
    max_channels_per_operation: int = 8         # MAX_CHANNEL_PER_OPERATION
    max_buffers_per_operation: int = 10         # MAX_LOCAL_BUFFER_PER_OPERATION + MAX_CHANNEL...
    max_semaphores_per_operation: int = 16      # MAX_DEVICE_SEMAPHORES
    max_barriers: int = 16                      # MAX_DEVICE_SYNCERS
    max_threads_per_block: int = 1024           # __launch_bounds__(1024, 1)
    default_threads_per_block: int = 1024
    default_buffer_alignment: int = 16
    predefined_scratch_bytes: int = 1 << 26     # PREDFINED_SCRATCH_SIZE (reuse_resources)
    default_scratch_bytes: int = 1 << 27        # the executor's shared scratch (reuse)
    max_offset_bytes: int = (1 << 32) - 1       # offsets and sizes are uint32 bytes
    max_message_bytes: int = (1 << 64) - 1      # max_message_size default (uint64 max)


MSCCLPP = MscclppLimits()
