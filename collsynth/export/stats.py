"""Size figures of an MSCCL program: what the runtimes' limits are evaluated on.

:class:`LimitFigures` holds, per rank, the peak of every limited quantity and where it occurs;
:func:`program_stats` measures them on a lowered :class:`~collsynth.export.program.Program` in one
pass, and :mod:`collsynth.export.limits` compares them with each runtime's limits.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from operator import attrgetter

from collsynth.export.program import Program

__all__ = ["Peak", "LimitFigures", "ProgramStats", "program_stats"]

_TYPE, _CNT, _SRCOFF, _DSTOFF, _DEPID = (attrgetter(name) for name in (
    "type", "cnt", "srcoff", "dstoff", "depid"))


@dataclass(frozen=True)
class Peak:
    """The largest value of one limited quantity in one scope (usually a rank), and where.
    ``at_least``: ``value`` is a lower bound (an estimate made before lowering)."""

    value: int
    where: str
    at_least: bool = False


@dataclass(frozen=True)
class LimitFigures:
    """Everything the limits are evaluated on.

    Per-rank tuples hold one :class:`Peak` per rank (rank order); the ``<algo>`` element's
    children are the ``ngpus`` ``<gpu>`` elements. ``None``: not known (an estimate cannot
    know ``cnt``, offsets or dependencies before lowering).
    """

    ngpus: int
    nchannels: int
    threadblocks: tuple[Peak, ...]
    steps: tuple[Peak, ...]
    send_tbs_per_channel: tuple[Peak, ...]
    recv_tbs_per_channel: tuple[Peak, ...]
    nodes: tuple[Peak, ...]
    children: tuple[Peak, ...]
    cnt: tuple[Peak, ...] | None = None
    offset: tuple[Peak, ...] | None = None
    depid: tuple[Peak, ...] | None = None
    fusion: tuple[Peak, ...] | None = None


@dataclass(frozen=True)
class ProgramStats:
    """Size figures of a :class:`Program`, per GPU in rank order.

    ``figures`` holds, per rank, the largest value of every quantity a runtime limits and
    where it occurs (:mod:`collsynth.export.limits`); :func:`find_limit_violations
    <collsynth.export.limits.find_limit_violations>` evaluates them.
    """

    threadblocks: tuple[int, ...]
    max_steps_per_threadblock: int
    scratch_chunks: tuple[int, ...]
    nops: int
    figures: LimitFigures | None = field(default=None, compare=False, repr=False)

    @property
    def max_threadblocks(self) -> int:
        return max(self.threadblocks, default=0)

    @property
    def max_scratch_chunks(self) -> int:
        return max(self.scratch_chunks, default=0)

    def summary(self) -> str:
        """``tbs/gpu <= 3, steps/tb <= 7, scratch/gpu <= 2``."""
        return (f"threadblocks/GPU <= {self.max_threadblocks}, steps/threadblock <= "
                f"{self.max_steps_per_threadblock}, scratch chunks/GPU <= "
                f"{self.max_scratch_chunks}")


def program_stats(program: Program) -> ProgramStats:
    """Threadblocks per GPU, most steps in a threadblock, scratch chunks per GPU, and the
    figures the runtimes' limits apply to, in one pass over the steps."""
    ngpus = len(program.gpus)
    nops = 0
    most_steps = 0
    figure: dict[str, list[Peak]] = defaultdict(list)
    for gpu in program.gpus:
        q = gpu.id
        longest, longest_tb = -1, -1
        total = 0
        senders: dict[int, int] = defaultdict(int)
        receivers: dict[int, int] = defaultdict(int)
        cnt = offset = depid = fusion = (-1, -1, -1)   # (value, tb, position)
        for tb in gpu.threadblocks:
            steps = tb.steps
            total += len(steps)
            if len(steps) > longest:
                longest, longest_tb = len(steps), tb.id
            if tb.send >= 0:
                senders[tb.chan] += 1
            if tb.recv >= 0:
                receivers[tb.chan] += 1
            if not steps:
                continue
            # Whole-list passes (C speed) for the maxima; a step loop only for 're' runs.
            types = list(map(_TYPE, steps))
            depids = list(map(_DEPID, steps))
            top = max(depids)
            if top > depid[0]:
                depid = (top, tb.id, depids.index(top))
            skipped = types.count("nop")
            nops += skipped
            if skipped == len(steps):
                continue
            if skipped:   # cnt and offsets of nops are not read by the runtimes
                where = [i for i, kind in enumerate(types) if kind != "nop"]
                real = [steps[i] for i in where]
            else:
                where, real = None, steps
            counts = list(map(_CNT, real))
            top = max(counts)
            if top > cnt[0]:
                index = counts.index(top)
                cnt = (top, tb.id, index if where is None else where[index])
            offsets = list(map(max, map(_SRCOFF, real), map(_DSTOFF, real)))
            top = max(offsets)
            if top > offset[0]:
                index = offsets.index(top)
                offset = (top, tb.id, index if where is None else where[index])
            if "re" in types:
                run = 0                      # fusable 're' steps ending at the last real step
                previous = None              # the last non-nop step
                for position, step in enumerate(steps):
                    kind = step.type
                    if kind == "nop":
                        continue
                    if kind == "re":
                        if (previous is not None and previous.type == "re"
                                and not previous.hasdep and step.depid < 0
                                and previous.dstbuf == step.dstbuf
                                and previous.dstoff == step.dstoff
                                and previous.srcbuf == step.srcbuf):
                            run += 1
                        else:
                            run = 1
                        if run > fusion[0]:
                            fusion = (run, tb.id, position)
                    else:
                        run = 0
                    previous = step
        most_steps = max(most_steps, longest)
        tbs = len(gpu.threadblocks)
        figure["threadblocks"].append(Peak(tbs, f"rank {q}"))
        figure["steps"].append(Peak(max(longest, 0), f"threadblock {longest_tb} of rank {q}"))
        figure["nodes"].append(Peak(1 + ngpus + tbs + total, f"rank {q}"))
        figure["children"].append(Peak(tbs, f"the <gpu> of rank {q}") if tbs >= longest
                                  else Peak(longest, f"threadblock {longest_tb} of rank {q}"))
        for name, counts, kind in (("send", senders, "sending"), ("recv", receivers,
                                                                  "receiving")):
            chan = max(counts, key=lambda c: (counts[c], -c), default=0)
            figure[name].append(Peak(counts.get(chan, 0), f"rank {q} on channel {chan}"))
        for name, (value, tb_id, position) in (("cnt", cnt), ("offset", offset),
                                               ("depid", depid), ("fusion", fusion)):
            figure[name].append(Peak(max(value, 0), f"step {position} of threadblock {tb_id} "
                                                    f"of rank {q}"))
    figures = LimitFigures(
        ngpus=ngpus, nchannels=program.nchannels, threadblocks=tuple(figure["threadblocks"]),
        steps=tuple(figure["steps"]), send_tbs_per_channel=tuple(figure["send"]),
        recv_tbs_per_channel=tuple(figure["recv"]), nodes=tuple(figure["nodes"]),
        children=tuple(figure["children"]),
        cnt=tuple(figure["cnt"]), offset=tuple(figure["offset"]), depid=tuple(figure["depid"]),
        fusion=tuple(figure["fusion"]))
    return ProgramStats(
        threadblocks=tuple(p.value for p in figures.threadblocks),
        max_steps_per_threadblock=most_steps,
        scratch_chunks=tuple(g.s_chunks for g in program.gpus),
        nops=nops, figures=figures)
