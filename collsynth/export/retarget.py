"""A program written by hand made loadable by one runtime: spelling, byte range and ops.

Lowering (:mod:`collsynth.export.lower`) writes an algorithm for one runtime from the start.
Programs written by hand, such as the runtime's own ring and tree
(:mod:`collsynth.timing.runtime_baselines`), use fused ops and no byte range;
:func:`retarget` gives one the runtime's ``coll`` spelling, ``outofplace``,
``minBytes``/``maxBytes`` (written as lowering writes them, docs/msccl-xml.md §4.4) and, for a
runtime that refuses fused ops (rccl), each fused step as the plain steps it stands for.
"""

from __future__ import annotations

from dataclasses import replace

from collsynth.collective.kinds import canonical_name
from collsynth.errors import CollsynthError, ExportError
from collsynth.export.lower import max_bytes_attribute
from collsynth.export.program import GpuProgram, Program, ThreadBlock, XmlStep
from collsynth.runtimes import xml_dialect

__all__ = ["retarget", "unfused"]

_FUSED = ("rcs", "rrs", "rrc", "rrcs")


def retarget(program: Program, runtime: str, *, min_bytes: int | None = None,
             max_bytes: int | None = None) -> Program:
    """``program`` as ``runtime`` loads it, for calls of ``min_bytes..max_bytes`` bytes
    (inclusive; ``None``: from 0, no upper bound).

    Raises
    ------
    ExportError
        A collective the runtime does not run, or a byte range that selects no call.

    >>> from collsynth.timing.runtime_baselines import ring_program
    >>> ring = retarget(ring_program("reduce_scatter", [(0, 1, 2)]), "rccl")
    >>> ring.coll, ring.outofplace, ring.min_bytes, ring.max_bytes
    ('reducescatter', 1, 0, 0)
    >>> sorted({st.type for g in ring.gpus for tb in g.threadblocks for st in tb.steps})
    ['r', 're', 's']
    """
    rt = xml_dialect(runtime)
    try:
        key = canonical_name(program.coll)
    except CollsynthError as exc:
        raise ExportError(f"program {program.name!r}: {exc}") from exc
    coll = rt.coll_name(key)
    if coll is None:
        raise ExportError(f"{rt.name} does not run {key} (program {program.name!r})")
    for label, value in (("min_bytes", min_bytes), ("max_bytes", max_bytes)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                                  or value < 0):
            raise ExportError(f"{label} = {value!r}; expected bytes >= 0")
    if max_bytes is not None and (max_bytes == 0 or max_bytes < (min_bytes or 0)):
        raise ExportError(f"max_bytes = {max_bytes} selects no call (min_bytes = "
                          f"{min_bytes or 0}); leave it out for no upper bound")
    max_attr = max_bytes_attribute(rt, max_bytes)
    if rt.requires_range_attributes:   # rccl, msccl-executor: all three required
        outofplace: int | None = (program.outofplace if program.outofplace is not None
                                  else int(not program.inplace))
        min_attr: int | None = min_bytes or 0
    else:   # msccl: no outofplace; a byte range only when one is asked for
        outofplace = None
        min_attr = (min_bytes or 0) if max_attr is not None else min_bytes
    result = replace(program, coll=coll, outofplace=outofplace, min_bytes=min_attr,
                     max_bytes=max_attr)
    return result if rt.fused_ops else unfused(result)


def unfused(program: Program) -> Program:
    """``program`` with every fused step written as plain ``r``, ``re`` and ``s`` steps in the
    same thread block (a received operand that would overwrite the local one goes to new
    scratch chunks first); dependencies name the last step of what they waited for.

    Raises
    ------
    ExportError
        A fused step whose local operand partly overlaps its destination.
    """
    return replace(program, gpus=tuple(_unfused_gpu(g) for g in program.gpus))


def _unfused_gpu(gpu: GpuProgram) -> GpuProgram:
    scratch = gpu.s_chunks
    plans: dict[int, list[list[tuple]]] = {}   # tb id -> per original step, its new steps
    for tb in gpu.threadblocks:
        plan = []
        for st in tb.steps:
            if st.type not in _FUSED:
                plan.append([(st.type, st.srcbuf, st.srcoff, st.dstbuf, st.dstoff)])
                continue
            src, dst, cnt = (st.srcbuf, st.srcoff), (st.dstbuf, st.dstoff), st.cnt
            if st.type == "rcs":   # receive into dst, send it on
                plan.append([("r", *dst, *dst), ("s", *dst, *dst)])
                continue
            if st.type == "rrs":   # receive, add the local operand, send (nothing stored)
                temp = ("s", scratch)
                scratch += cnt
                plan.append([("r", *temp, *temp), ("re", *src, *temp), ("s", *temp, *temp)])
                continue
            # rrc, rrcs: dst <- received + src (then send dst)
            if src == dst:
                temp = ("s", scratch)
                scratch += cnt
                steps = [("r", *temp, *temp), ("re", *temp, *dst)]
            elif src[0] == dst[0] and abs(src[1] - dst[1]) < cnt:
                raise ExportError(f"rank {gpu.id} tb {tb.id} step {st.s}: {st.type} reads "
                                  f"{src[0]}[{src[1]}..] and writes {dst[0]}[{dst[1]}..], "
                                  "which partly overlap; it cannot be written unfused")
            else:
                steps = [("r", *dst, *dst), ("re", *src, *dst)]
            if st.type == "rrcs":
                steps.append(("s", *dst, *dst))
            plan.append(steps)
        plans[tb.id] = plan
    last = {tid: [sum(len(p) for p in plan[:j + 1]) - 1 for j in range(len(plan))]
            for tid, plan in plans.items()}
    blocks = []
    for tb in gpu.threadblocks:
        steps: list[XmlStep] = []
        for st, parts in zip(tb.steps, plans[tb.id]):
            for k, (op, sb, so, db, do) in enumerate(parts):
                depid, deps = (st.depid, st.deps) if k == 0 else (-1, -1)
                if depid >= 0 and depid in last and 0 <= deps < len(last[depid]):
                    deps = last[depid][deps]
                steps.append(XmlStep(len(steps), op, sb, so, db, do, st.cnt, depid, deps,
                                     st.hasdep if k == len(parts) - 1 else 0))
        blocks.append(replace(tb, steps=tuple(steps)))
    return replace(gpu, s_chunks=scratch, threadblocks=tuple(blocks))
