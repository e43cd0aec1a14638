"""Write a :class:`~collsynth.export.mscclpp.model.Plan` as the JSON MSCCL++'s executor loads.

Keys and their order are those MSCCL++'s DSL writes; optional keys are left out when empty, as
the DSL does. :func:`write_plan` checks the plan first and writes atomically
(:mod:`collsynth._output`): a plan that fails the check is never written.
"""

from __future__ import annotations

import json
import os
from typing import Any

from collsynth._output import write_text_atomic
from collsynth.errors import ExportError
from collsynth.export.mscclpp.checker import check_plan, refuse_unless_correct
from collsynth.export.mscclpp.model import BufferRef, GpuPlan, Operation, Plan, Threadblock

__all__ = ["plan_to_dict", "plan_to_json", "write_plan"]


def _buffer(ref: BufferRef) -> dict[str, Any]:
    out: dict[str, Any] = {} if ref.rank is None else {"rank": ref.rank}
    if ref.switch_channel_id is not None:
        out["switch_channel_id"] = ref.switch_channel_id
    elif ref.buffer_id is not None:
        out["buffer_id"] = ref.buffer_id
    else:
        out["type"] = ref.type
    out["index"] = ref.index
    out["size"] = ref.size
    return out


def _operation(op: Operation) -> dict[str, Any]:
    out: dict[str, Any] = {"name": op.name}
    if op.name == "pipeline":
        out["iter_context"] = {"unit_size": op.unit_size, "num_chunks": op.num_chunks}
        out["ops"] = [_operation(inner) for inner in op.ops]
        return out
    if op.src:
        out["src_buff"] = [_buffer(b) for b in op.src]
    if op.dst:
        out["dst_buff"] = [_buffer(b) for b in op.dst]
    if op.channel_ids:
        out["channel_ids"] = list(op.channel_ids)
    if op.channel_type is not None:
        out["channel_type"] = op.channel_type
    if op.barrier_id is not None:
        out["barrier_id"] = op.barrier_id
    if op.num_threadblocks is not None:
        out["num_threadblocks"] = op.num_threadblocks
    if op.semaphore_ids:
        out["semaphore_ids"] = list(op.semaphore_ids)
    if op.reduce_op is not None:
        out["reduce_op"] = op.reduce_op
    if op.tbg is not None:
        out["tbg_info"] = {"tb_id": op.tbg[0], "tbg_size": op.tbg[1]}
    return out


def _threadblock(tb: Threadblock) -> dict[str, Any]:
    return {"id": tb.id, "ops": [_operation(op) for op in tb.ops],
            "channels": [{"channel_type": g.channel_type, "channel_ids": list(g.channel_ids)}
                         for g in tb.channels],
            "remote_buffer_refs": [{"access_channel_type": r.access_channel_type,
                                    "remote_buffer_ids": list(r.remote_buffer_ids)}
                                   for r in tb.remote_buffer_refs]}


def _gpu(gpu: GpuPlan) -> dict[str, Any]:
    channels = []
    for ch in gpu.channels:
        if ch.channel_type == "switch":
            channels.append({"channel_type": "switch", "buffer_type": ch.buffer_type,
                             "rank_groups": [{"size": g.size, "ranks": list(g.ranks)}
                                             for g in ch.rank_groups]})
        else:
            channels.append({"channel_type": ch.channel_type,
                             "connected_to": list(ch.connected_to)})
    return {"id": gpu.id, "input_chunks": gpu.input_chunks, "output_chunks": gpu.output_chunks,
            "scratch_chunks": gpu.scratch_chunks,
            "threadblocks": [_threadblock(tb) for tb in gpu.threadblocks],
            "channels": channels,
            "remote_buffers": [{"rank": b.rank, "type": b.type,
                                "access_channel_types": list(b.access_channel_types)}
                               for b in gpu.remote_buffers],
            "semaphores": [{"init_value": v} for v in gpu.semaphores]}


def plan_to_dict(plan: Plan) -> dict[str, Any]:
    """The JSON object of ``plan``."""
    return {"name": plan.name, "collective": plan.collective, "protocol": plan.protocol,
            "inplace": plan.inplace, "reuse_resources": plan.reuse_resources,
            "gpus": [_gpu(g) for g in plan.gpus],
            "num_threads_per_block": plan.num_threads_per_block,
            "use_double_scratch_buffer": plan.use_double_scratch_buffer,
            "buffer_alignment": plan.buffer_alignment,
            "min_message_size": plan.min_message_size,
            "max_message_size": plan.max_message_size}


def plan_to_json(plan: Plan, *, indent: int | None = None) -> str:
    """The plan's JSON text (compact by default, as MSCCL++'s compiler caches plans)."""
    separators = (",", ":") if indent is None else None
    return json.dumps(plan_to_dict(plan), indent=indent, separators=separators) + "\n"


def write_plan(plan: Plan, path: str | os.PathLike[str], *, indent: int | None = None,
               **check_options: Any) -> str:
    """Check ``plan`` strictly, then write it to ``path`` atomically; return the text.

    ``check_options`` go to :func:`~collsynth.export.mscclpp.checker.check_plan`
    (``collective``, ``ranks_per_node``, ``chunk_bytes``).

    Raises
    ------
    ExportError
        The plan fails the check (the message lists its first problems); nothing is written.
    OutputPathError
        A path the output policy refuses.
    """
    refuse_unless_correct(check_plan(plan, strict=True, **check_options), f"plan {plan.name!r}",
                          error=ExportError)
    text = plan_to_json(plan, indent=indent)
    write_text_atomic(path, text)
    return text
