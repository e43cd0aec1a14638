"""Compact symmetric schedules: the template expands to exactly the pipelined schedule, the
expanded schedule passes the ordinary verifier, and verification through the symmetry catches
every kind of broken template (a missing send, a step too short for its images, a shift that is
no symmetry, a chunk of another node)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from collsynth.algorithm import find_problems
from collsynth.algorithm.arrays import SendBlock
from collsynth.algorithm.model import Step
from collsynth.bounds.throughput import optimal_throughput
from collsynth.collective import standard_collective
from collsynth.errors import VerificationError
from collsynth.graph.symmetry import NodeShift
from collsynth.synthesis.bandwidth_optimal.packing import pack_trees
from collsynth.synthesis.bandwidth_optimal.pipeline import pipelined_algorithm
from collsynth.synthesis.bandwidth_optimal.symmetric import (
    expand,
    solve_symmetric,
    symmetric_pipelined_schedule,
    symmetric_problems,
    verify_symmetric,
)
from collsynth.topology import compose_nodes, get_topology
from collsynth.topology.families import fully_connected, ring

SYSTEMS = {
    "torus:4x4": lambda: get_topology("torus:4x4"),
    "hypercube:3": lambda: get_topology("hypercube:3"),
    "ring4x3": lambda: compose_nodes(ring(4), 3, nic_units=1),
    "fc4x4-leaf": lambda: compose_nodes(fully_connected(4), 4, nic_units=1, fabric="leaf-spine",
                                        nodes_per_leaf=2, oversubscription=2),
}
_MADE: dict = {}


def _made(name: str, stages: int = 2):
    if (name, stages) not in _MADE:
        topology = SYSTEMS[name]()
        collective = standard_collective("allgather", topology.num_ranks)
        bound = optimal_throughput(topology, collective).rounds_per_chunk
        packing = pack_trees(topology, list(range(topology.num_ranks)), target=bound)
        assert packing.shift is not None
        schedule = symmetric_pipelined_schedule(topology, collective, packing, stages)
        _MADE[name, stages] = (topology, collective, packing, schedule)
    return _MADE[name, stages]


def _send_set(step) -> set:
    return {(s.chunk, s.src, s.dst, s.reduce) for s in step.sends}


@pytest.mark.parametrize("name", sorted(SYSTEMS))
def test_the_template_expands_to_the_pipelined_schedule_and_verifies(name):
    topology, collective, packing, schedule = _made(name)
    assert symmetric_problems(schedule) == []
    full = pipelined_algorithm(topology, collective, packing, 2)  # built independently
    expanded = expand(schedule)
    assert expanded.collective == full.collective
    assert [s.rounds for s in expanded.steps] == [s.rounds for s in full.steps]
    assert [_send_set(a) for a in expanded.steps] == [_send_set(b) for b in full.steps]
    assert find_problems(expanded) == []
    assert schedule.num_sends == expanded.num_sends
    nodes = schedule.shift.nodes
    assert schedule.template_sends * nodes == expanded.num_sends


def _with_step(schedule, t, step):
    steps = list(schedule.steps)
    steps[t] = step
    return replace(schedule, steps=tuple(steps))


def test_a_missing_template_send_is_caught():
    schedule = _made("ring4x3")[3]
    last = schedule.steps[-1]
    broken = _with_step(schedule, len(schedule.steps) - 1, Step(last.rounds, last.sends[1:]))
    problems = symmetric_problems(broken)
    assert problems and all(p.startswith("template:") for p in problems)
    with pytest.raises(VerificationError, match="never receives"):
        verify_symmetric(broken)


def test_a_step_too_short_for_all_its_images_is_caught():
    # The template alone fits fewer rounds than its images together: shortening the busiest
    # step is only caught by counting the images' loads.
    schedule = _made("torus:4x4")[3]
    t = max(range(schedule.num_steps), key=lambda i: schedule.steps[i].rounds)
    step = schedule.steps[t]
    assert step.rounds > 1
    problems = symmetric_problems(_with_step(schedule, t, Step(step.rounds - 1, step.sends)))
    assert any("images together need" in p for p in problems)


def test_a_shift_that_is_no_symmetry_is_caught():
    schedule = _made("torus:4x4")[3]
    # r -> r + 1 (mod 16) takes rank 3 = (0, 3) to 4 = (1, 0) and its neighbour 0 = (0, 0) to
    # 1 = (0, 1), which is no neighbour of 4: not a symmetry of the torus. The template (root
    # 0's sends) is the same, so only the check of the shift can tell.
    wrong = replace(schedule, shift=NodeShift(nodes=16, ranks_per_node=1))
    assert any("does not map the links" in p for p in symmetric_problems(wrong))
    too_small = replace(schedule, shift=NodeShift(nodes=8, ranks_per_node=1))
    assert any("moves 8 ranks" in p for p in symmetric_problems(too_small))


def test_a_chunk_of_a_root_outside_node_zero_is_caught():
    schedule = _made("ring4x3")[3]
    step = schedule.steps[0]
    chunk = np.array(step.sends.chunk, dtype=np.int64)
    chunk[0] = (schedule.topology.num_ranks - 1) * schedule.pieces  # the last rank's piece 0
    moved = Step(step.rounds, SendBlock(chunk, step.sends.src, step.sends.dst))
    assert any("not a piece of a root in node 0" in p
               for p in symmetric_problems(_with_step(schedule, 0, moved)))


def test_only_allgather_shaped_collectives_are_taken():
    topology, _, packing, schedule = _made("ring4x3")
    broadcast = standard_collective("broadcast", topology.num_ranks, root=0)
    assert symmetric_problems(replace(schedule, collective=broadcast))
    with pytest.raises(VerificationError):
        symmetric_pipelined_schedule(topology, broadcast, packing, 2)


@pytest.mark.parametrize("topology", [compose_nodes(ring(4), 3, nic_units=1),
                                      get_topology("torus:4x4")], ids=["ring4x3", "torus:4x4"])
def test_solve_symmetric_end_to_end(topology):
    from fractions import Fraction

    schedule = solve_symmetric(topology, standard_collective("allgather", topology.num_ranks))
    assert symmetric_problems(schedule) == []
    assert find_problems(expand(schedule)) == []
    bound = Fraction(schedule.provenance["lower_bound"])
    assert schedule.provenance["optimal"] is True
    # 16 (depth - 1) stages: filling and draining cost at most (depth - 1) / stages = 1/16
    assert bound <= schedule.rounds_per_chunk <= bound * Fraction(17, 16)


def test_solve_symmetric_needs_a_symmetry():
    with pytest.raises(VerificationError, match="no node shift"):
        solve_symmetric(get_topology("mesh:3x3"), standard_collective("allgather", 9))


def test_one_root_stands_for_all_when_ranks_are_alike_within_their_nodes():
    # 5 hubs of 6 ranks, 1 unit into each rank from its hub and 1 from its NIC: 29 chunks in
    # over 2 units, 29/2 rounds per chunk at best (hand count). Moving nodes and turning the
    # ranks of every node are both symmetries, so one rank's trees are the template, and
    # trees crossing the network a chosen number of times mix to the bound with 2 pieces.
    from collsynth.graph.translations import node_translations
    from collsynth.topology.families import hub

    topology = compose_nodes(hub(6), 5, nic_units=1)
    assert node_translations(topology).dims == (5, 6)
    schedule = solve_symmetric(topology, standard_collective("allgather", 30))
    assert schedule.provenance["lower_bound"] == "29/2"
    assert schedule.provenance["optimal"] is True
    assert schedule.provenance["pieces_per_root_per_stage"] <= 2
    assert schedule.template_sends * 30 == schedule.num_sends
    assert symmetric_problems(schedule) == []
    assert find_problems(expand(schedule)) == []
    assert node_translations(compose_nodes(get_topology("line:4"), 3, nic_units=1)) is None


@pytest.mark.parametrize("name, bound", [("reduce_scatter", "29/2"), ("allreduce", "29/30")])
def test_reduce_scatter_and_allreduce_are_compact_too(name, bound):
    # Reduce-scatter: the allgather's hand count (29 chunks over 2 units per rank) read
    # backwards; allreduce: both halves, 29/2 + 29/2 over the 30 parts.
    from collsynth.topology.families import hub

    topology = compose_nodes(hub(6), 5, nic_units=1)
    schedule = solve_symmetric(topology, standard_collective(name, 30))
    assert schedule.provenance["lower_bound"] == bound
    assert schedule.provenance["optimal"] is True
    assert symmetric_problems(schedule) == []
    expanded = expand(schedule)
    whole = standard_collective(name, 30).split(expanded.chunks)
    assert expanded.collective.precondition == whole.precondition
    assert expanded.collective.postcondition == whole.postcondition
    assert find_problems(expanded) == []


def test_a_reduce_counted_twice_is_caught():
    from collsynth.topology.families import hub

    topology = compose_nodes(hub(6), 5, nic_units=1)
    schedule = solve_symmetric(topology, standard_collective("reduce_scatter", 30))
    first = schedule.steps[0]
    doubled = Step(first.rounds * 2, SendBlock(
        np.concatenate([first.sends.chunk, first.sends.chunk[:1]]),
        np.concatenate([first.sends.src, first.sends.src[:1]]),
        np.concatenate([first.sends.dst, first.sends.dst[:1]]),
        np.ones(len(first.sends) + 1, dtype=bool)))
    problems = symmetric_problems(_with_step(schedule, 0, doubled))
    assert any("twice" in p for p in problems)


def test_cutting_every_piece_in_three_keeps_a_correct_schedule():
    # How the allreduce brings its halves to one piece count: each send becomes three, and
    # each step is re-priced for the tripled loads of all its images.
    from collsynth.synthesis.bandwidth_optimal.symmetric import _refined

    schedule = _made("torus:4x4")[3]
    finer = replace(schedule, steps=_refined(schedule, 3), pieces=schedule.pieces * 3)
    assert symmetric_problems(finer) == []
    assert finer.num_rounds == 3 * schedule.num_rounds  # every load tripled (1 unit links)
    assert find_problems(expand(finer)) == []


def _forward_ring(units: int, group_limit: int | None = None):
    """3 ranks, rank r -> r + 1 (mod 3) only, ``units`` per link; with ``group_limit``, each
    rank's output also passes a group (a port) of that many units."""
    from collsynth.topology.model import BandwidthGroup, Topology

    links = tuple(tuple(units if b == (a + 1) % 3 else 0 for b in range(3)) for a in range(3))
    groups = () if group_limit is None else tuple(
        BandwidthGroup(frozenset({r}), frozenset({(r + 1) % 3}), group_limit, f"port{r}")
        for r in range(3))
    return Topology(f"forward3x{units}", links, groups)


def _relay(topology, pieces: int, rounds: tuple[int, int]):
    """Allgather on the forward ring, each chunk cut in ``pieces``: root 0's pieces go
    0 -> 1 in step 0 and 1 -> 2 in step 1 (the template); each image moves its own root's
    pieces one node on, so every link carries ``pieces`` pieces in every step."""
    from collsynth.synthesis.bandwidth_optimal.symmetric import SymmetricSchedule

    chunk = np.arange(pieces, dtype=np.int64)
    steps = tuple(Step(r, SendBlock(chunk, np.full(pieces, src, np.int32),
                                    np.full(pieces, src + 1, np.int32)))
                  for r, src in zip(rounds, (0, 1)))
    return SymmetricSchedule(topology, standard_collective("allgather", 3),
                             NodeShift(nodes=3, ranks_per_node=1), pieces, steps)


@pytest.mark.parametrize("units, group_limit", [(2, None), (3, 2)],
                         ids=["2-unit links", "3-unit links, 2-unit ports"])
def test_rounds_of_a_step_are_its_load_over_the_bandwidth_rounded_up(units, group_limit):
    # Every test system above has 1-unit links, where rounding the rounds a link class needs
    # down or up gives the same answer. Here each link (or its port) carries 3 pieces per step
    # over 2 units: 3 / 2 = 1.5, so a step needs 2 rounds, and a 1-round step is refused.
    topology = _forward_ring(units, group_limit)
    accepted = _relay(topology, 3, (2, 2))
    assert symmetric_problems(accepted) == []
    assert find_problems(expand(accepted)) == []  # the ordinary verifier agrees
    refused = _relay(topology, 3, (1, 2))
    assert symmetric_problems(refused) == [
        "template step 0: its images together need 2 rounds, the step lasts 1"]
    with pytest.raises(VerificationError, match="need 2 rounds, the step lasts 1"):
        verify_symmetric(refused)
    assert any("allows 2" in p for p in find_problems(expand(refused)))
    # 2 pieces over 2 units fit one round: the second unit is used.
    assert symmetric_problems(_relay(topology, 2, (1, 1))) == []
