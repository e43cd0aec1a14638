"""The lowering's merge pass on small hand-built algorithms: the expected programs are written out
step by step from the layout rules of docs/export.md (not from the code), and every one also
passes the checker."""

from __future__ import annotations

import pytest

from collsynth.algorithm import Algorithm, Send, Step, verify
from collsynth.collective import allgather, broadcast, reduce
from collsynth.export.check import check_program
from collsynth.export.coarsen import coarsen
from collsynth.export.limits import estimate_figures
from collsynth.export.lower import lower
from collsynth.export.program import GpuProgram, ThreadBlock, XmlStep
from collsynth.export.stats import program_stats
from collsynth.topology import get_topology


def _chain_broadcast(pieces: int) -> Algorithm:
    """Broadcast from rank 0 down line:3, ``pieces`` pieces pipelined: piece p crosses 0 -> 1 in
    step p and 1 -> 2 in step p + 1."""
    steps = tuple(Step(1, tuple(Send(p, h, h + 1) for h in (0, 1) for p in range(pieces)
                                if p + h == t))
                  for t in range(pieces + 1))
    return verify(Algorithm("bcast", get_topology("line:3"), broadcast(3, 0).split(pieces),
                            steps))


def _steps(program, rank: int) -> list[tuple]:
    """Every threadblock of ``rank`` as (send, recv, chan, [steps])."""
    return [(tb.send, tb.recv, tb.chan, list(tb.steps)) for tb in program.gpus[rank].threadblocks]


def _ok(program, runtime: str, collective: str, root: int | None = None) -> None:
    report = check_program(program, runtime=runtime, collective=collective, root=root,
                           strict=True)
    assert not report.problems, [str(p) for p in report.problems]


def test_a_coarsened_pipeline_merges_into_one_step_per_hop():
    """Four pieces pipelined down a chain, coarsened to one stage: each hop carries the four
    pieces in one step (cnt 4) on both sides, and the root's four local copies are one."""
    program = lower(coarsen(_chain_broadcast(4), 1), runtime="msccl")
    assert program.nchunksperloop == 4 and program.nchannels == 1
    # Rank 0: local copies i[0..3] -> o[0..3] (threadblock 0), send i[0..3] to rank 1.
    assert program.gpus[0] == GpuProgram(0, 4, 4, 0, (
        ThreadBlock(0, -1, -1, 0, (XmlStep(0, "cpy", "i", 0, "o", 0, 4),)),
        ThreadBlock(1, 1, -1, 0, (XmlStep(0, "s", "i", 0, "i", 0, 4),))))
    # Rank 1: one threadblock (send to 2, receive from 0): receive o[0..3], then send them on.
    assert program.gpus[1] == GpuProgram(1, 0, 4, 0, (
        ThreadBlock(0, 2, 0, 0, (XmlStep(0, "r", "o", 0, "o", 0, 4),
                                 XmlStep(1, "s", "o", 0, "o", 0, 4))),))
    assert program.gpus[2] == GpuProgram(2, 0, 4, 0, (
        ThreadBlock(0, -1, 1, 0, (XmlStep(0, "r", "o", 0, "o", 0, 4),)),))
    _ok(program, "msccl", "broadcast", 0)


def test_uncoarsened_pipeline_keeps_one_step_per_piece():
    """Without coarsening the pieces cross in different steps: nothing merges but the root's
    local copies (one step of the algorithm's start)."""
    program = lower(_chain_broadcast(4), runtime="msccl")
    assert [len(tb.steps) for tb in program.gpus[1].threadblocks] == [8]
    assert [s.cnt for s in program.gpus[1].threadblocks[0].steps] == [1] * 8
    assert program.gpus[0].threadblocks[0].steps == (XmlStep(0, "cpy", "i", 0, "o", 0, 4),)
    _ok(program, "msccl", "broadcast", 0)


def _two_reductions() -> Algorithm:
    """reduce to rank 1 on line:3, two pieces: rank 0's pieces in step 0, rank 2's in step 1."""
    steps = (Step(2, (Send(0, 0, 1, True), Send(1, 0, 1, True))),
             Step(2, (Send(0, 2, 1, True), Send(1, 2, 1, True))))
    return verify(Algorithm("red", get_topology("line:3"), reduce(3, 1).split(2), steps))


def test_reductions_without_fused_ops_merge_r_and_re():
    """rccl has no fused ops: the first reduction is r into the accumulator o[0..1] then re
    adding the own input i[0..1]; the second is r into a receive buffer s[0..1] (consecutive
    scratch) then re from it, after the first re (a dependency). Each pair merges (cnt 2)."""
    program = lower(_two_reductions(), runtime="rccl")
    sender = GpuProgram(0, 2, 0, 0, (ThreadBlock(0, 1, -1, 0,
                                                 (XmlStep(0, "s", "i", 0, "i", 0, 2),)),))
    assert program.gpus[0] == sender
    assert program.gpus[2] == GpuProgram(2, 2, 0, 0, sender.threadblocks)
    assert program.gpus[1] == GpuProgram(1, 2, 2, 2, (
        ThreadBlock(0, -1, 0, 0, (XmlStep(0, "r", "o", 0, "o", 0, 2),
                                  XmlStep(1, "re", "i", 0, "o", 0, 2, hasdep=1))),
        ThreadBlock(1, -1, 2, 0, (XmlStep(0, "r", "s", 0, "s", 0, 2),
                                  XmlStep(1, "re", "s", 0, "o", 0, 2, depid=0, deps=1)))))
    _ok(program, "rccl", "reduce", 1)


def test_reductions_with_fused_ops_merge_rrc():
    """msccl fuses receive-and-reduce: one rrc of cnt 2 per message, the second after the
    first."""
    program = lower(_two_reductions(), runtime="msccl")
    assert program.gpus[1] == GpuProgram(1, 2, 2, 0, (
        ThreadBlock(0, -1, 0, 0, (XmlStep(0, "rrc", "i", 0, "o", 0, 2, hasdep=1),)),
        ThreadBlock(1, -1, 2, 0, (XmlStep(0, "rrc", "o", 0, "o", 0, 2, depid=0, deps=0),))))
    _ok(program, "msccl", "reduce", 1)


def _exchange(pieces: int) -> Algorithm:
    """allgather on line:2, every piece of both ranks in one step."""
    sends = tuple(Send(b * pieces + p, b, 1 - b) for b in (0, 1) for p in range(pieces))
    return verify(Algorithm("ag", get_topology("line:2"), allgather(2).split(pieces),
                            (Step(pieces, sends),)))


def test_merged_messages_stop_at_the_cnt_limit():
    """142 pieces each way: two steps of 71 (cnt < 72) on each side, and two local copies."""
    program = lower(_exchange(142), runtime="msccl")
    assert _steps(program, 0) == [
        (-1, -1, 0, [XmlStep(0, "cpy", "i", 0, "o", 0, 71),
                     XmlStep(1, "cpy", "i", 71, "o", 71, 71)]),
        (1, 1, 0, [XmlStep(0, "s", "i", 0, "i", 0, 71), XmlStep(1, "r", "o", 142, "o", 142, 71),
                   XmlStep(2, "s", "i", 71, "i", 71, 71), XmlStep(3, "r", "o", 213, "o", 213, 71)]),
    ]
    _ok(program, "msccl", "allgather")


def test_block_channels_keep_merged_messages_whole():
    """On two channels by block (71 chunks) each channel carries one whole message of 71 each
    way; by chunk, the pieces alternate channels and no two consecutive ones share one."""
    block = lower(_exchange(142), runtime="msccl", channels=2, channel_by="block")
    assert _steps(block, 0)[1:] == [
        (1, 1, 0, [XmlStep(0, "s", "i", 0, "i", 0, 71), XmlStep(1, "r", "o", 142, "o", 142, 71)]),
        (1, 1, 1, [XmlStep(0, "s", "i", 71, "i", 71, 71), XmlStep(1, "r", "o", 213, "o", 213, 71)]),
    ]
    _ok(block, "msccl", "allgather")
    by_chunk = lower(_exchange(142), runtime="msccl", channels=2, channel_by="chunk")
    assert [len(tb.steps) for tb in by_chunk.gpus[0].threadblocks[1:]] == [142, 142]
    _ok(by_chunk, "msccl", "allgather")


@pytest.mark.parametrize("runtime", ["msccl", "rccl", "msccl-executor"])
def test_estimates_bound_and_predictions_match_merged_programs(runtime):
    """The estimate stays a lower bound of the merged program's steps, and the prediction
    (runs of consecutive chunks) is exact on these programs."""
    cases = [(coarsen(_chain_broadcast(4), 1), {}), (_chain_broadcast(4), {}),
             (_exchange(142), {}), (_exchange(142), {"channels": 2, "channel_by": "block"}),
             (_exchange(60), {"channels": 2, "channel_by": "chunk"}), (_two_reductions(), {})]
    for algorithm, options in cases:
        real = program_stats(lower(algorithm, runtime=runtime, **options)).figures.steps
        bound = estimate_figures(algorithm, runtime, **options).steps
        predicted = estimate_figures(algorithm, runtime, predict=True, **options).steps
        assert all(b.value <= r.value for b, r in zip(bound, real)), (algorithm.name, options)
        assert [p.value for p in predicted] == [p.value for p in real], (algorithm.name, options)


def test_the_merge_rule_needs_every_step_to_follow_on_both_sides():
    """The rule itself, on hand-made steps: a message merges into a head of cnt k when each of
    its steps has the head's type and its source and destination slots k past the head's (the
    slots of the other side included)."""
    from collsynth.export.lower import _Lowering, _Op

    def message(send_slot, recv_types_slots, war=False):
        tb = (1, 1, 0)
        send = _Op(0, tb, "s", send_slot, send_slot, 0, 0, (1, 1, 0), war=war)
        return send, [_Op(1, tb, kind, src, dst, 0, 1, (0, 1, 0)) for kind, src, dst in
                      recv_types_slots]

    head = message(("i", 0), [("r", ("o", 4), ("o", 4))])
    head[0].cnt = head[1][0].cnt = 2   # the head already holds two chunks
    mergeable = _Lowering._mergeable
    assert mergeable(head, message(("i", 2), [("r", ("o", 6), ("o", 6))]))
    assert not mergeable(head, message(("i", 1), [("r", ("o", 6), ("o", 6))]))  # sender side
    assert not mergeable(head, message(("i", 2), [("r", ("o", 7), ("o", 7))]))  # receiver side
    assert not mergeable(head, message(("i", 2), [("r", ("o", 6), ("o", 7))]))  # receiver dst
    assert not mergeable(head, message(("i", 2), [("r", ("s", 6), ("s", 6))]))  # buffer
    assert not mergeable(head, message(("i", 2), [("rrc", ("o", 6), ("o", 6))]))  # type
    assert not mergeable(head, message(("i", 2), [("r", ("o", 6), ("o", 6))], war=True))
    assert not mergeable(head, message(("i", 2), [("r", ("o", 6), ("o", 6)),
                                                  ("re", ("i", 2), ("o", 6))]))  # shape
    reducing = message(("i", 0), [("rrc", ("i", 4), ("o", 4))])
    assert mergeable(reducing, message(("i", 1), [("rrc", ("i", 5), ("o", 5))]))
    assert not mergeable(reducing, message(("i", 1), [("rrc", ("i", 5), ("s", 5))]))  # dst buffer
    assert not mergeable(reducing, message(("i", 1), [("rrc", ("o", 5), ("o", 5))]))  # src buffer
