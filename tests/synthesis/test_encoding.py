"""The encoding's pruning and the automorphism finder."""

from __future__ import annotations

from collsynth.algorithm import Instance
from collsynth.collective import standard_collective
from collsynth.encoding import build_problem
from collsynth.graph.symmetry import find_automorphism, is_automorphism
from collsynth.topology import get_topology


def test_no_candidate_send_into_a_rank_that_already_holds_the_chunk():
    topology = get_topology("dgx1")
    collective = standard_collective("allgather", 8)
    problem = build_problem(topology, collective, Instance(steps=3))
    assert all(s.dst not in collective.precondition[s.chunk] for s in problem.sends)


def test_no_send_before_the_sender_can_hold_the_chunk():
    topology = get_topology("ring:8")
    problem = build_problem(topology, standard_collective("broadcast", 8, root=0),
                            Instance(steps=4))
    # rank 3 is three hops from the root: it can send only from step 4 on
    assert all(s.step >= 4 for s in problem.sends if s.src == 3)


def test_distance_makes_too_few_steps_trivially_infeasible():
    problem = build_problem(get_topology("ring:8"), standard_collective("allgather", 8),
                            Instance(steps=3))
    assert problem.trivially_infeasible and "4 hops" in problem.trivially_infeasible


def test_capacity_makes_too_few_rounds_trivially_infeasible():
    problem = build_problem(get_topology("hub:16"), standard_collective("allgather", 16),
                            Instance(steps=14))
    assert "can receive at most 1 per round x 14 rounds" in problem.trivially_infeasible


def test_automorphisms():
    hub = get_topology("hub:16")
    perm = find_automorphism(hub, standard_collective("allgather", 16))
    assert perm is not None and is_automorphism(perm, hub, standard_collective("allgather", 16))
    dgx1 = get_topology("dgx1")
    perm = find_automorphism(dgx1, standard_collective("allgather", 8))
    assert perm is not None and perm != tuple(range(8))
    # A rooted collective is not invariant under moving the root.
    assert find_automorphism(get_topology("ring:4"), standard_collective("broadcast", 4)) is None
