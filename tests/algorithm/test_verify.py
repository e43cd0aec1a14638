"""The verifier: one test per way an algorithm can be wrong, plus correct schedules it accepts."""

from __future__ import annotations

import pytest

from collsynth.algorithm import Algorithm, Send, Step, find_problems, verify
from collsynth.collective import allgather, allreduce, broadcast, reduce, reduce_scatter
from collsynth.errors import VerificationError
from collsynth.topology import BandwidthGroup, Topology, get_topology

RING3 = get_topology("ring:3")
FC3 = get_topology("fully-connected:3")


def algo(topology, collective, *steps):
    return Algorithm("t", topology, collective, tuple(Step(r, tuple(s)) for r, s in steps))


def test_correct_broadcast_passes():
    a = algo(RING3, broadcast(3, 0), (1, [Send(0, 0, 1), Send(0, 0, 2)]))
    assert verify(a) is a
    assert find_problems(a) == []


def test_missing_receive_is_reported_with_rank_and_chunk():
    a = algo(RING3, broadcast(3, 0), (1, [Send(0, 0, 1)]))
    with pytest.raises(VerificationError, match="rank 2 never receives chunk 0"):
        verify(a)


def test_send_over_missing_link():
    line = get_topology("line:3")
    a = algo(line, broadcast(3, 0), (1, [Send(0, 0, 1), Send(0, 0, 2)]))
    assert any("no link 0->2" in p for p in find_problems(a))


def test_link_bandwidth_exceeded_and_rounds_fix_it():
    two_chunks = broadcast(3, 0).split(2)
    sends = [Send(0, 0, 1), Send(1, 0, 1), Send(0, 0, 2), Send(1, 0, 2)]
    assert any("link 0->1 carries 2 chunks" in p
               for p in find_problems(algo(RING3, two_chunks, (1, sends))))
    assert find_problems(algo(RING3, two_chunks, (2, sends))) == []


def test_bandwidth_group_exceeded():
    hub = get_topology("hub:3")
    a = algo(hub, broadcast(3, 0), (1, [Send(0, 0, 1), Send(0, 0, 2)]))
    assert any("rank 0 egress carries 2 chunks" in p for p in find_problems(a))


def test_send_of_chunk_not_held():
    a = algo(get_topology("line:3"), broadcast(3, 0), (1, [Send(0, 0, 1), Send(0, 1, 2)]))
    assert any("rank 1 sends chunk 0 it does not hold" in p for p in find_problems(a))


def test_reduce_on_non_combining_collective():
    a = algo(RING3, broadcast(3, 0), (1, [Send(0, 0, 1, True), Send(0, 0, 2)]))
    assert any("not a combining collective" in p for p in find_problems(a))


def test_double_counted_contribution_is_caught():
    # Rank 1 reduces into 0 and 2; then 2 reduces into 0 again: rank 1's value counted twice.
    a = algo(FC3, reduce(3, 0),
             (1, [Send(0, 1, 2, True), Send(0, 1, 0, True)]),
             (1, [Send(0, 2, 0, True)]))
    assert any("count the contribution(s) of rank(s) [1] twice" in p for p in find_problems(a))


def test_two_reduces_in_one_step_must_be_disjoint():
    a = algo(FC3, reduce(3, 0), (1, [Send(0, 1, 2, True)]),
             (1, [Send(0, 2, 0, True), Send(0, 1, 0, True)]))
    assert any("twice" in p for p in find_problems(a))


def test_copy_conflicting_with_another_send():
    a = algo(FC3, broadcast(3, 0), (1, [Send(0, 0, 1)]), (1, [Send(0, 0, 2), Send(0, 1, 2)]))
    assert any("at least one is a copy" in p for p in find_problems(a))


def test_incomplete_reduction_names_missing_contributors():
    a = algo(FC3, reduce(3, 0), (1, [Send(0, 1, 0, True)]))
    assert any("missing the contribution(s) of rank(s) [2]" in p for p in find_problems(a))


def test_allreduce_reduce_then_copy_is_correct():
    a = algo(FC3, allreduce(3),
             (1, [Send(0, 1, 0, True), Send(0, 2, 1, True)]),  # 0: {0,1}; 1: {1,2}
             (1, [Send(0, 2, 0, True)]),                       # 0: {0,1,2}
             (1, [Send(0, 0, 1), Send(0, 0, 2)]))              # copies of the full sum
    assert find_problems(a) == []


def test_reduce_scatter_composed_with_allgather_counts_each_contribution_once():
    # reduce-scatter on fully-connected:3 in one step, then allgather in one step.
    sends_rs = [Send(c, r, c, True) for c in range(3) for r in range(3) if r != c]
    sends_ag = [Send(c, c, r) for c in range(3) for r in range(3) if r != c]
    ar = allreduce(3).split(3)
    assert find_problems(algo(FC3, ar, (1, sends_rs), (1, sends_ag))) == []
    assert find_problems(algo(FC3, reduce_scatter(3), (1, sends_rs))) == []


def test_rounds_must_be_positive():
    a = algo(RING3, broadcast(3, 0), (0, [Send(0, 0, 1), Send(0, 0, 2)]))
    assert any("at least one round" in p for p in find_problems(a))


def test_extra_memory_limit():
    # On line:3, rank 1 relays chunk 0 to rank 2 for a gather at 2: a scratch chunk on rank 1.
    line = get_topology("line:3")
    from collsynth.collective import gather

    a = algo(line, gather(3, 2), (1, [Send(0, 0, 1), Send(1, 1, 2)]), (1, [Send(0, 1, 2)]))
    assert find_problems(a) == []
    assert find_problems(a, extra_memory=1) == []
    assert any("scratch" in p for p in find_problems(a, extra_memory=0))


def test_mismatched_rank_counts():
    a = algo(RING3, allgather(4))
    assert "topology 'ring:3' has 3" in find_problems(a)[0]


def test_group_limit_uses_effective_groups_only():
    t = Topology("g", ((0, 1, 1), (0, 0, 0), (0, 0, 0)),
                 (BandwidthGroup(frozenset({0}), frozenset({1, 2}), 1, "nic"),))
    a = algo(t, broadcast(3, 0), (1, [Send(0, 0, 1), Send(0, 0, 2)]))
    assert any("nic carries 2 chunks" in p for p in find_problems(a))
