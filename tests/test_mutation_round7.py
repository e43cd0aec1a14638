"""Blind spots found by hand mutation testing (round 7: the export — retargeting hand-written
programs, lowering, the checker, limits, coarsening, the pipeline, MSCCL++ plans — the planner,
the tracer and the executor's program): each test pins one rule that a small, plausible bug could
break without any other test noticing. Expected values come from a hand count or the documented
format (docs/msccl-xml.md and the docstrings), never from the code's own output.
"""

from __future__ import annotations

import pytest

from collsynth.errors import ExportError
from collsynth.export.program import GpuProgram, Program, ThreadBlock, XmlStep


# -- retarget: the byte range and flags a hand-written program is given (docs/msccl-xml.md §4.4) --


def _two_rank_copy(*, inplace: int = 0, outofplace: int | None = None) -> Program:
    """An allgather-shaped hand-written program of 2 ranks, no byte range, no outofplace."""
    send = ThreadBlock(0, 1, -1, 0, (XmlStep(0, "s", "i", 0, "o", 0, 1),))
    recv = ThreadBlock(1, -1, 1, 0, (XmlStep(0, "r", "i", 0, "o", 0, 1),))
    gpus = (GpuProgram(0, 1, 1, 0, (send, recv)),
            GpuProgram(1, 1, 1, 0, (ThreadBlock(0, 0, -1, 0, send.steps),
                                    ThreadBlock(1, -1, 0, 0, recv.steps))))
    return Program("hand", "Simple", 1, 1, 2, "allgather", inplace, gpus, outofplace=outofplace)


def test_a_maximum_of_zero_bytes_is_refused_for_every_runtime():
    # §4.4: "max_bytes = 0 and a maximum below the minimum are refused" — rccl reads maxBytes 0
    # as "no limit", so a bound of 0 bytes would silently select every call.
    from collsynth.export.retarget import retarget

    for runtime in ("msccl", "rccl", "msccl-executor"):
        with pytest.raises(ExportError, match="selects no call"):
            retarget(_two_rank_copy(), runtime, max_bytes=0)


def test_a_minimum_of_zero_bytes_is_a_valid_range_start():
    # 0 is the smallest size a call can have: min_bytes=0 is the default range start, accepted.
    from collsynth.export.retarget import retarget

    rccl = retarget(_two_rank_copy(), "rccl", min_bytes=0, max_bytes=4096)
    assert (rccl.min_bytes, rccl.max_bytes) == (0, 4096)


def test_msccl_writes_min_bytes_zero_when_only_a_maximum_is_given():
    # §4.4, msccl: "maxBytes is written as the bound plus one, and minBytes as given (0 when
    # only a maximum is given)"; with neither, both are left out.
    from collsynth.export.retarget import retarget

    only_max = retarget(_two_rank_copy(), "msccl", max_bytes=4096)
    assert (only_max.min_bytes, only_max.max_bytes, only_max.outofplace) == (0, 4097, None)
    neither = retarget(_two_rank_copy(), "msccl")
    assert (neither.min_bytes, neither.max_bytes) == (None, None)


def test_a_program_without_outofplace_gets_the_opposite_of_inplace():
    # rccl requires outofplace; a program that has none says its layout by inplace alone: an
    # in-place program (inplace=1) is not out of place (0), and the other way round.
    from collsynth.export.retarget import retarget

    assert retarget(_two_rank_copy(inplace=1), "rccl").outofplace == 0
    assert retarget(_two_rank_copy(inplace=0), "rccl").outofplace == 1
    # An explicit outofplace is kept.
    assert retarget(_two_rank_copy(inplace=0, outofplace=0), "rccl").outofplace == 0


# -- unfused: fused steps as plain r / re / s (what rccl loads) ----------------------------------


def _one_fused_step(step: XmlStep, o_chunks: int = 4) -> Program:
    """Rank 0 sends one chunk to rank 1, whose only thread block runs ``step`` (a fused op
    receiving from rank 0 and, for the sending kinds, sending back to rank 0)."""
    sends = step.type in ("rcs", "rrs", "rrcs")
    gpu0 = GpuProgram(0, 1, o_chunks, 0, (ThreadBlock(0, 1, 1 if sends else -1, 0, (
        XmlStep(0, "s", "i", 0, "o", 0, step.cnt),)),))
    gpu1 = GpuProgram(1, 1, o_chunks, 0, (ThreadBlock(0, 0 if sends else -1, 0, 0, (step,)),))
    return Program("hand", "Simple", 1, 1, 2, "custom", 0, (gpu0, gpu1))


def test_an_rrc_whose_operand_ends_where_its_destination_starts_is_unfused():
    # o[0..2) + received -> o[2..4): the two ranges touch but do not overlap (0 + 2 = 2), so the
    # receive can go straight into o[2..4) and the local operand be added to it: r, then re.
    from collsynth.export.retarget import unfused

    out = unfused(_one_fused_step(XmlStep(0, "rrc", "o", 0, "o", 2, 2)))
    steps = out.gpus[1].threadblocks[0].steps
    assert [(st.type, st.srcbuf, st.srcoff, st.dstbuf, st.dstoff, st.cnt) for st in steps] == [
        ("r", "o", 2, "o", 2, 2), ("re", "o", 0, "o", 2, 2)]
    assert out.gpus[1].s_chunks == 0   # no scratch needed


def test_only_the_last_part_of_an_unfused_step_publishes_its_flag():
    # docs/msccl-xml.md §9.1: hasdep is 1 on the step another block waits for, and unfused()
    # points every wait at the last part of what it waited for; the parts before it publish
    # nothing (a flag nobody reads only costs a publish).
    from collsynth.export.retarget import unfused

    step = XmlStep(0, "rrcs", "o", 0, "o", 0, 1, hasdep=1)
    steps = unfused(_one_fused_step(step)).gpus[1].threadblocks[0].steps
    # src == dst: receive into a new scratch chunk, add it into o[0], send o[0] on.
    assert [st.type for st in steps] == ["r", "re", "s"]
    assert [st.hasdep for st in steps] == [0, 0, 1]


# -- the export pipeline ---------------------------------------------------------------------------


def test_as_many_instances_as_the_runtime_has_channels_fit():
    # Each instance takes at least one channel of its own: msccl's MAXCHANNELS (32) instances
    # fit exactly, one more does not.
    from collsynth.export.pipeline import check_instances
    from collsynth.runtimes import xml_dialect

    limit = xml_dialect("msccl").max_channels
    check_instances(limit, ["msccl"])   # no error
    with pytest.raises(ExportError, match="MAXCHANNELS: msccl 32"):
        check_instances(limit + 1, ["msccl"])


def _piped_broadcast():
    """Two pieces down the chain 0 -> 1 -> 2: piece 1 leaves rank 0 one step after it could
    (step 2, not 1), so the schedule has two waves."""
    from collsynth.algorithm import Algorithm, Send, Step
    from collsynth.collective import broadcast
    from collsynth.topology import get_topology

    return Algorithm("b", get_topology("line:3"), broadcast(3, 0).split(2),
                     (Step(1, (Send(0, 0, 1),)), Step(1, (Send(1, 0, 1), Send(0, 1, 2))),
                      Step(1, (Send(1, 1, 2),))))


def test_more_stages_than_waves_are_reported_as_the_waves_there_are():
    # Asking a 2-wave schedule for 100 stages leaves it as it is: 2 stages, not 100.
    from collsynth.export.pipeline import export_programs

    exported = export_programs(_piped_broadcast(), ["msccl"], subject="b", stages=100)
    assert exported["msccl"].stages == 2


def test_the_export_checks_a_rooted_collective_against_the_algorithms_own_root():
    # A broadcast from rank 1 on 2 ranks whose "lowering" is the correct program of the
    # broadcast from rank 0: rank 0's input lands in rank 1's output. Right for root 0, wrong
    # for root 1 (rank 0's output should hold rank 1's input) — the check must use root 1, not
    # guess the root that fits.
    from collsynth.algorithm import Algorithm, Send, Step, verify
    from collsynth.collective import broadcast
    from collsynth.export.lower import lower
    from collsynth.export.pipeline import check_exported
    from collsynth.topology import get_topology

    two = get_topology("fully-connected:2")
    from_0 = verify(Algorithm("b0", two, broadcast(2, 0), (Step(1, (Send(0, 0, 1),)),)))
    from_1 = verify(Algorithm("b1", two, broadcast(2, 1), (Step(1, (Send(0, 1, 0),)),)))
    for runtime in ("msccl", "rccl"):
        program = lower(from_0, runtime=runtime)
        check_exported(program, runtime, from_0)   # the precondition: right for its own root
        with pytest.raises(ExportError, match="postcondition"):
            check_exported(program, runtime, from_1)


# -- limits: the estimate merges at most 71 chunks into one step (cnt < 72, §7.1) -----------------


def test_the_estimate_splits_72_chunks_on_one_connection_into_two_steps():
    # 2 ranks, allgather of 72 pieces each, all sent in one step: each rank sends 72 and
    # receives 72 over the one peer's threadblock. cnt < 72, so 72 chunks take 71 + 1: 2 send
    # steps and 2 receive steps, 4 steps in the shared threadblock (a lower bound that here is
    # exact).
    from collsynth.algorithm import Algorithm, Send, Step, verify
    from collsynth.collective import allgather
    from collsynth.export.limits import estimate_figures
    from collsynth.topology import get_topology

    sends = tuple(Send(c + 72 * r, r, 1 - r) for r in range(2) for c in range(72))
    algorithm = verify(Algorithm("ag72", get_topology("fully-connected:2"),
                                 allgather(2).split(72), (Step(72, sends),)))
    assert [peak.value for peak in estimate_figures(algorithm, "msccl").steps] == [4, 4]


# -- coarsen: which receipts must keep their order -------------------------------------------------


def _two_piece_sum_to_2(first_is_copy: bool):
    """Ranks 0 and 1 contribute, rank 2 needs the sum, in two pieces a (0) and b (1), pipelined:
    step 0: 0 -> 2 a; step 1: 1 -> 2 a (a reduce), 0 -> 2 b; step 2: 1 -> 2 b (a reduce). With
    ``first_is_copy`` rank 2 holds nothing to start with and rank 0's sends are copies; else
    rank 2 holds a contribution too and every send is a reduce."""
    from collsynth.algorithm import Algorithm, Send, Step, verify
    from collsynth.collective import Collective
    from collsynth.topology import get_topology

    givers = frozenset({0, 1}) if first_is_copy else frozenset({0, 1, 2})
    collective = Collective("sum_to_2", 3, (givers,), (frozenset({2}),), combining=True)
    red0 = not first_is_copy
    return verify(Algorithm("sum", get_topology("fully-connected:3"), collective.split(2), (
        Step(1, (Send(0, 0, 2, reduce=red0),)),
        Step(1, (Send(0, 1, 2, reduce=True), Send(1, 0, 2, reduce=red0))),
        Step(1, (Send(1, 1, 2, reduce=True),)))))


def _sends(algorithm):
    return [sorted((s.chunk, s.src, s.dst) for s in step.sends) for step in algorithm.steps]


def test_coarsened_reductions_into_one_rank_may_arrive_together():
    # Reductions commute: nothing is forwarded, and each of 0 and 1 only adds into rank 2, so
    # every send can go at the first step (2 waves: piece b a step behind a). One stage: both
    # pieces of both senders in one step.
    from collsynth.export.coarsen import coarsen, waves

    algorithm = _two_piece_sum_to_2(first_is_copy=False)
    assert waves(algorithm) == 2
    assert _sends(coarsen(algorithm, 1)) == [[(0, 0, 2), (0, 1, 2), (1, 0, 2), (1, 1, 2)]]


def test_a_reduction_stays_after_the_copy_it_adds_to():
    # Rank 2 holds nothing until rank 0's copy arrives, so rank 1's reduce of a piece must come
    # a step after that piece's copy. One stage: both copies, then both reduces.
    from collsynth.export.coarsen import coarsen, waves

    algorithm = _two_piece_sum_to_2(first_is_copy=True)
    assert waves(algorithm) == 2
    assert _sends(coarsen(algorithm, 1)) == [[(0, 0, 2), (1, 0, 2)], [(0, 1, 2), (1, 1, 2)]]


# -- the MSCCL++ plan replay: in place means the buffers overlap, not that they touch -------------


def _allgather_into_the_next_bytes(rank: int, world_size: int, plan) -> list[float]:
    """One rank of an out-of-place allgather whose output starts right where its input ends
    (two views of one tensor): returns the output."""
    import torch

    from collsynth.executor.mscclpp_plan import execute_plan

    whole = torch.zeros(4 + 8)
    inp, out = whole[:4], whole[4:]
    inp.fill_(rank + 1.0)
    return execute_plan(plan, inp, out, timeout_s=30.0).tolist()


def test_an_output_right_after_the_input_is_an_out_of_place_call():
    # The input is bytes [a0, a1), the output [a1, a1 + 32): they share no byte, so the call
    # is out of place (in place: the ranges overlap) and an out-of-place plan runs on it. The
    # allgather of 2 ranks' 4 floats: rank 0's four 1.0s, then rank 1's four 2.0s, everywhere.
    pytest.importorskip("torch")
    from collsynth.algorithm import Algorithm, Send, Step, verify
    from collsynth.collective import allgather
    from collsynth.executor import launch
    from collsynth.export.mscclpp.lower import lower_to_plan
    from collsynth.topology import get_topology

    algorithm = verify(Algorithm("ag2", get_topology("fully-connected:2"), allgather(2), (
        Step(1, (Send(0, 0, 1), Send(1, 1, 0))),)))
    plan = lower_to_plan(algorithm)
    assert not plan.inplace   # the precondition
    outputs = launch(_allgather_into_the_next_bytes, 2, args=(plan,), timeout_s=120)
    assert outputs == [[1.0] * 4 + [2.0] * 4] * 2


# -- the planner's groups: which topology a group runs on, and what its cache key covers ----------


def _line3(groups=()):
    """The directed line 0 -> 1 -> 2 of 2 links a hop."""
    from collsynth.topology.model import Topology

    links = ((0, 2, 0), (0, 0, 2), (0, 0, 0))
    return Topology("line3", links, groups=groups)


def test_a_reordered_group_of_every_rank_runs_on_the_renumbered_topology():
    # Group [2, 1, 0]: its rank 0 is rank 2, so the links 0 -> 1 -> 2 become 2 -> 1 -> 0 in the
    # group's numbering. Only the group [0, 1, 2] in that order is the topology itself.
    from collsynth.plan.groups import topology_for_group

    line = _line3()
    assert topology_for_group(line, [0, 1, 2]) is line
    reversed_line = topology_for_group(line, [2, 1, 0])
    assert reversed_line.links == ((0, 0, 0), (2, 0, 0), (0, 2, 0))


def test_the_fingerprint_covers_the_bandwidth_groups_and_their_limits():
    # "A hash of what synthesis depends on: the links and the bandwidth-group limits": the same
    # links with a group capping rank 1's sends at 1 chunk a round, or at 2, or without it, are
    # three different synthesis problems.
    from collsynth.plan.groups import topology_fingerprint
    from collsynth.topology.model import BandwidthGroup

    def capped(limit):
        return _line3((BandwidthGroup(frozenset({1}), frozenset({2}), limit, "rank 1 out"),))

    prints = {topology_fingerprint(t) for t in (_line3(), capped(1), capped(2))}
    assert len(prints) == 3
