"""Blind spots found by hand mutation testing (round 2): each test pins one rule that a small,
plausible bug could break without any other test noticing. Expected values are worked out by
hand in the comments, from the rules in docs/ and the docstrings, not from the code's output.
"""

from __future__ import annotations

import copy
import json
from fractions import Fraction

import numpy as np
import pytest
import sympy

from collsynth.algorithm import Algorithm, Send, Step, verify
from collsynth.collective import allgather, reduce
from collsynth.errors import FileFormatError
from collsynth.export.check import check_program
from collsynth.export.program import GpuProgram, Program, ThreadBlock, XmlStep
from collsynth.export.semantics import load_threadblock
from collsynth.plan.buckets import find_steps
from collsynth.plan.choose import NCCL, Candidate, Line, SizeRange, choose_ranges
from collsynth.timing import AlphaBeta
from collsynth.timing.model import SIZE, CostModel, step_figures, symbolic_time
from collsynth.timing.tuning_model import GraphFigures, TuningSetup, bandwidth_correction
from collsynth.topology import Topology
from collsynth.topology.model import BandwidthGroup
from collsynth.trace.records import read_rank_file
from tests.trace.test_records import HEADER


# -- the XML checker: rrs sends the reduction but writes nothing locally (§7.2) ------------------


def _two_rank_allreduce(rank1_op: str) -> Program:
    """A 1-chunk allreduce on 2 ranks: rank 0 sends x0 to rank 1; rank 1 receives it, adds its
    own x1 and sends the sum back with ``rank1_op``; rank 0 receives the sum into o[0]."""
    gpu0 = GpuProgram(0, 1, 1, 0, (ThreadBlock(0, 1, 1, 0, (
        XmlStep(0, "s", "i", 0, "o", 0, 1),
        XmlStep(1, "r", "i", 0, "o", 0, 1))),))
    gpu1 = GpuProgram(1, 1, 1, 0, (ThreadBlock(0, 0, 0, 0, (
        XmlStep(0, rank1_op, "i", 0, "o", 0, 1),)),))
    return Program("ar2", "Simple", 1, 1, 2, "allreduce", 0, (gpu0, gpu1))


def test_rrcs_writes_the_sum_locally_and_rrs_does_not():
    # rrcs: rank 1's o[0] = x(0,0) + x(1,0), and rank 0 receives the same: a correct allreduce.
    good = check_program(_two_rank_allreduce("rrcs"), runtime="msccl")
    assert good.ok, [str(p) for p in good.problems]
    # rrs only sends the sum on: rank 1's o[0] is never written, so its postcondition fails
    # (rank 0's o[0] is still right).
    bad = check_program(_two_rank_allreduce("rrs"), runtime="msccl")
    assert not bad.ok
    messages = [str(p) for p in bad.problems]
    assert any("rank 1 o[0]" in m for m in messages), messages
    assert not any("rank 0 o[0]" in m for m in messages), messages


# -- the step counter: the fused-chain term only for a chain whose final cnt is positive (§9.3) ---


def test_a_fused_re_chain_ending_with_cnt_zero_adds_no_counter_term():
    steps = (XmlStep(0, "re", "s", 0, "o", 0, 1),
             XmlStep(1, "re", "s", 1, "o", 0, 0),             # fused: same dst and srcbuf
             XmlStep(2, "cpy", "i", 0, "o", 1, 1, hasdep=1))
    loaded = load_threadblock(ThreadBlock(0, -1, -1, 0, steps))
    assert [t.positions for t in loaded.transfers] == [[0, 1], [2]]
    # The chain's final cnt is 0: no "fused steps minus one" term, so the chain counts 0 and
    # the copy publishes 0 + 1 = 1 (with the term it would be 1 and 2).
    assert [t.counter for t in loaded.transfers] == [0, 1]


# -- the sweep: what an UNSAT instance proves about others -----------------------------------------


def test_known_unsat_only_follows_from_a_multiple_of_the_instance():
    from collsynth.synthesis.strategies import _known_unsat

    # (S, R, C) SAT implies (S, kR, kC) SAT (refine each chunk k ways). So UNSAT at (4, R', 2)
    # proves (4, 3, 1) UNSAT only when R' >= 2 x 3 = 6.
    assert _known_unsat({(4, 2): 6}, 4, 3, 1, 8)
    assert not _known_unsat({(4, 2): 5}, 4, 3, 1, 8)
    assert not _known_unsat({(4, 2): 3}, 4, 3, 1, 8)
    # Same chunk count: fewer or equal rounds follow directly.
    assert _known_unsat({(4, 1): 3}, 4, 3, 1, 8) and _known_unsat({(4, 1): 3}, 4, 2, 1, 8)
    assert not _known_unsat({(4, 1): 3}, 4, 4, 1, 8)


# -- plans: an exact tie with NCCL is NCCL's, whatever the candidates' order ----------------------


def test_an_exact_tie_with_nccl_keeps_every_size_for_nccl_in_either_order():
    nccl = Candidate("nccl ring/LL", NCCL, Line(Fraction(10), Fraction(1, 100)))
    same = Candidate("a", "collsynth", Line(Fraction(10), Fraction(1, 100)))
    for order in ([same, nccl], [nccl, same]):
        assert choose_ranges(order) == (SizeRange(0, None, NCCL),)


def test_a_sequence_without_a_repeat_is_one_step():
    # "ABCDA": the only border is "A", period 4, which fits once (5 // 4 = 1): not a repeat.
    # No setup prefix helps ("BCDA", "CDA", "DA" have no border), so the whole trace is one step.
    found = find_steps(list("ABCDA"))
    assert not found.found
    assert (found.setup, found.period, found.steps, found.tail) == (0, 5, 1, 0)
    # Twice is enough: "ABAB" is 2 steps of 2.
    assert find_steps(list("ABAB")).steps == 2


# -- trace records ----------------------------------------------------------------------------------

_CALL = {"type": "call", "seq": 0, "kind": "allgather", "function": "all_gather_into_tensor",
         "bytes": 8, "dtype": "float32", "op": None, "group": [0, 1], "group_size": 2,
         "root": None, "peer": None, "async_op": False, "site": None, "duration_us": None,
         "cross_node": None, "batch": None, "error": None, "raw": {"element_size": 4}}


def _rank0_file(tmp_path, **changes):
    call = copy.deepcopy(_CALL)
    call.update(changes)
    path = tmp_path / "rank-00000.jsonl"
    path.write_text(json.dumps(HEADER) + "\n" + json.dumps(call) + "\n")
    return path


def test_the_good_call_reads(tmp_path):
    assert read_rank_file(_rank0_file(tmp_path)).calls[0].bytes == 8
    send = dict(kind="send", function="send", peer=1)
    assert read_rank_file(_rank0_file(tmp_path, **send)).calls[0].peer == 1


def test_a_send_to_itself_is_refused(tmp_path):
    # Rank 0's file: a send's peer must be another rank of the group.
    with pytest.raises(FileFormatError, match="peer"):
        read_rank_file(_rank0_file(tmp_path, kind="send", function="send", peer=0))


def test_bytes_must_be_whole_elements_of_the_raw_element_size_without_a_dtype(tmp_path):
    # No dtype, but raw.element_size says 4 bytes per element: 6 bytes is 1.5 elements.
    with pytest.raises(FileFormatError, match="whole number of 4-byte elements"):
        read_rank_file(_rank0_file(tmp_path, dtype=None, bytes=6))
    assert read_rank_file(_rank0_file(tmp_path, dtype=None, bytes=12)).calls[0].bytes == 12


# -- NCCL's tuning model: NVLS-tree's correction reaches log2(size / 64) = 23 ----------------------


def test_nvls_tree_correction_covers_one_more_size_than_the_tree():
    graph = GraphFigures(12, 30.0, 30.0, True)
    blackwell = TuningSetup("nccl", (2, 30), 16, 2, 100, "sm100", "intel", graph, graph, 24,
                            nvls=GraphFigures(8, 40.0, 80.0), nvls_channels=16)
    size = 64 << 23   # log2(size / 64) = 23: the last entry (index 23) of the 24-entry table
    # treeCorrectionFactor[Simple][23] = 0.9 applies to NVLS-tree (logSize < 24) ...
    assert bandwidth_correction(blackwell, "allreduce", "nvls_tree", "Simple", size) == 0.9
    # ... while the tree's correction stops at logSize < 23.
    assert bandwidth_correction(blackwell, "allreduce", "tree", "Simple", size) == 1.0


# -- the alpha-beta closed form: a step pays its slowest class, gamma per reduced piece -----------


def _fc(n: int) -> Topology:
    return Topology(f"fc{n}", tuple(tuple(int(a != b) for b in range(n)) for a in range(n)),
                    unit_gbps=10.0, alpha_us=1.0)


def test_a_step_on_two_link_classes_takes_the_larger_alpha_and_the_larger_beta():
    # 4 ranks, 2 per node. Intra-node: alpha 1, beta 3e-4; network: alpha 5, beta 1e-4. One
    # allgather step in which every rank sends its chunk to all others (first to its node
    # peer): the step uses both classes, so it costs alpha max(1, 5) = 5 and beta
    # max(3e-4, 1e-4) = 3e-4, a mix of the two classes.
    sends = tuple(Send(r, r, d) for r in range(4)
                  for d in sorted(range(4), key=lambda d: (d // 2 != r // 2, d)) if d != r)
    algorithm = verify(Algorithm("ag", _fc(4), allgather(4), (Step(1, sends),)))
    model = CostModel(AlphaBeta(1.0, 3e-4), AlphaBeta(5.0, 1e-4), 2)
    assert step_figures(algorithm, model) == (AlphaBeta(5.0, 3e-4),)


def test_gamma_is_charged_per_reduced_piece_and_not_on_plain_steps():
    # reduce to rank 0 on 3 ranks in one step: ranks 1 and 2 both send their chunk to rank 0,
    # which combines 2 pieces. The whole buffer is the one chunk: time = alpha + size x beta +
    # 2 x gamma x size = 1 + size/10^4 + 2 size/10^6.
    ab = AlphaBeta(1.0, Fraction(1, 10**4))
    step = Step(1, (Send(0, 1, 0, reduce=True), Send(0, 2, 0, reduce=True)))
    red = verify(Algorithm("red", _fc(3), reduce(3, 0), (step,)))
    model = CostModel(ab, gamma_us_per_byte=Fraction(1, 10**6))
    assert symbolic_time(red, model=model) == \
        1 + SIZE * (sympy.Rational(1, 10**4) + 2 * sympy.Rational(1, 10**6))
    # An allgather step reduces nothing: no gamma. 2 ranks, size/2 per chunk.
    pair = _fc(2)
    ag = verify(Algorithm("ag", pair, allgather(2), (Step(1, (Send(0, 0, 1), Send(1, 1, 0))),)))
    assert symbolic_time(ag, model=model) == 1 + SIZE / 2 * sympy.Rational(1, 10**4)


# -- the cut bound: overlapping bandwidth groups lower a cut only once ------------------------------


def test_overlapping_groups_lower_a_cut_once():
    from collsynth.bounds.core import _cut_capacity

    # 3 ranks, links of 2 from rank 0 to ranks 1 and 2. Group A: 0 -> {1, 2} at most 3;
    # group B: 0 -> {1} at most 1. Out of {0}: 0->1 carries at most 1 (B) and the two links
    # together at most 3 (A): the true capacity is 3 = 4 - 1. Lowering by both excesses (1 + 1)
    # would claim 2, a cut smaller than the truth, and so an unsound bound.
    links = ((0, 2, 2), (0, 0, 0), (0, 0, 0))
    groups = (BandwidthGroup(frozenset({0}), frozenset({1, 2}), 3, "A"),
              BandwidthGroup(frozenset({0}), frozenset({1}), 1, "B"))
    topology = Topology("groups3", links, groups)
    inside = np.array([True, False, False])
    assert _cut_capacity(topology, inside) == 3


# -- MSCCL++ plans: a port channel is waited on once per run that arrives on it -------------------


def test_two_runs_over_one_port_channel_are_waited_for_twice():
    from collsynth.export.mscclpp import check_plan
    from collsynth.export.mscclpp.lower import lower_to_plan
    from collsynth.topology import get_topology
    from collsynth.topology.compose import compose_nodes

    # Two nodes of two ranks, 2 chunks a rank (rank r holds chunks 2r and 2r + 1). Step 1 swaps
    # inside each node; step 2 sends chunks {0, 2} from rank 0 to rank 2 (and alike): two runs
    # (output positions 0 and 2 are not adjacent) over one port channel, each signalled by the
    # proxy; step 3 swaps inside the nodes again. The receiver must wait for both signals
    # before its next put reads chunk 2: waiting once races with the second run.
    topology = compose_nodes(get_topology("ring:2"), 2, nic_units=1)
    moves = (((0, 1, (0, 1)), (1, 0, (2, 3)), (2, 3, (4, 5)), (3, 2, (6, 7))),
             ((0, 2, (0, 2)), (2, 0, (4, 6)), (1, 3, (1, 3)), (3, 1, (5, 7))),
             ((2, 3, (0, 2)), (3, 2, (1, 3)), (0, 1, (4, 6)), (1, 0, (5, 7))))
    sends = [Step(2, tuple(Send(c, src, dst) for src, dst, chunks in step for c in chunks))
             for step in moves]
    algorithm = verify(Algorithm("ag2x2", topology, allgather(4).split(2), tuple(sends)))
    plan = lower_to_plan(algorithm, protocol="Simple")   # checked: raises on a race
    assert check_plan(plan, collective=algorithm.collective, ranks_per_node=2, strict=True).ok
    for gpu in plan.gpus:
        names = [(op.name, op.channel_type) for tb in gpu.threadblocks for op in tb.ops]
        after = names[names.index(("pwsf", "port")) + 1:]
        assert after[:2] == [("wait", "port"), ("wait", "port")] and after[2][0] == "nop"
