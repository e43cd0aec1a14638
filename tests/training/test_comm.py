"""Communication models: induced sub-topologies, point-to-point, NCCL and planned collectives."""

from __future__ import annotations

import dataclasses

import pytest

from collsynth.algorithm import Algorithm, Send, Step, verify
from collsynth.collective import allgather
from collsynth.errors import InvalidInstanceError, UnknownNameError
from collsynth.timing.model import NETWORK_ALPHA_US
from collsynth.timing.tuning_model import best_choice, nccl_choices, nccl_setup
from collsynth.topology import Topology, compose_nodes, get_topology
from collsynth.topology.families import fully_connected
from collsynth.training import CommModel, NcclComm, PlannedComm, induced_topology, p2p_time_us

DGX = get_topology("dgx-a100")


def with_figures(topology, unit_gbps=10.0, alpha_us=2.0):
    return dataclasses.replace(topology, unit_gbps=unit_gbps, alpha_us=alpha_us)


def test_induced_topology_keeps_links_and_restricts_groups():
    sub = induced_topology(DGX, (2, 5, 7))
    assert sub.num_ranks == 3 and sub.links[0] == (0, 12, 12)
    assert sub.unit_gbps == DGX.unit_gbps and sub.alpha_us == DGX.alpha_us
    egress = [g for g in sub.groups if g.name == "rank 2 egress (12 NVLinks)"]
    assert len(egress) == 1 and egress[0].sources == {0} and egress[0].destinations == {1, 2}
    assert "network" not in sub.metadata
    dgx1 = get_topology("dgx1")
    order = (3, 0, 1)  # sub-rank i is ranks[i]
    sub = induced_topology(dgx1, order)
    assert sub.links == tuple(tuple(dgx1.links[a][b] for b in order) for a in order)


def test_induced_topology_of_a_composed_topology():
    two = compose_nodes(DGX, 2)
    sub = induced_topology(two, (0, 1, 8, 9))
    network = sub.metadata["network"]
    assert (network["nodes"], network["ranks_per_node"]) == (2, 2)
    assert network["nic_units"] == two.metadata["network"]["nic_units"]
    nic = [g for g in sub.groups if g.name == "node 0 NIC 0 egress"]
    assert len(nic) == 1 and nic[0].sources == {0} and nic[0].destinations == {2, 3}
    swapped = induced_topology(two, (9, 8, 1, 0)).metadata["network"]     # nodes in any order
    assert (swapped["nodes"], swapped["ranks_per_node"]) == (2, 2)
    assert "network" not in induced_topology(two, (0, 8, 1, 9)).metadata   # interleaved
    assert "network" not in induced_topology(two, (0, 1, 8)).metadata      # uneven
    assert "network" not in induced_topology(two, (0, 1, 2)).metadata      # one node


@pytest.mark.parametrize("ranks, match", [
    ((), "empty"), ((0, 0), "repeated"), ((0, 8), "not a rank")])
def test_induced_topology_bad_ranks(ranks, match):
    with pytest.raises(InvalidInstanceError, match=match):
        induced_topology(DGX, ranks)


def test_p2p_over_one_link():
    size = 3_000_000
    assert p2p_time_us(DGX, 0, 5, size) == pytest.approx(0.7 + size / (12 * 25e3))
    two = compose_nodes(DGX, 2)
    # between nodes: the network class (NCCL's 2.7 us hop) and one 25 GB/s NIC
    assert p2p_time_us(two, 0, 9, size) == pytest.approx(NETWORK_ALPHA_US + size / 25e3)


def test_p2p_forwards_along_the_widest_shortest_path():
    # 0 -> 1 -> 3 (2 then 1 units) or 0 -> 2 -> 3 (1 then 3 units): both bottleneck at 1 unit;
    # 0 -> 4 -> 3 has 2 units all along and wins.
    links = [[0] * 5 for _ in range(5)]
    for a, b, units in [(0, 1, 2), (1, 3, 1), (0, 2, 1), (2, 3, 3), (0, 4, 2), (4, 3, 2)]:
        links[a][b] = links[b][a] = units
    top = Topology("kite", tuple(map(tuple, links)), unit_gbps=10.0, alpha_us=2.0)
    assert p2p_time_us(top, 0, 3, 10**6) == pytest.approx(2 * 2.0 + 10**6 / (2 * 10e3))
    line = Topology("line", ((0, 1, 0), (1, 0, 1), (0, 1, 0)), unit_gbps=10.0, alpha_us=2.0)
    assert p2p_time_us(line, 0, 2, 10**6) == pytest.approx(2 * 2.0 + 10**6 / 10e3)
    cut = Topology("cut", ((0, 1, 0), (1, 0, 0), (0, 0, 0)), unit_gbps=10.0, alpha_us=2.0)
    with pytest.raises(InvalidInstanceError, match="no path"):
        p2p_time_us(cut, 0, 2, 10)
    with pytest.raises(InvalidInstanceError, match="itself"):
        p2p_time_us(line, 1, 1, 10)


def test_nccl_comm_is_nccl_on_the_induced_topology():
    comm = NcclComm(DGX)
    assert isinstance(comm, CommModel)
    group = (6, 1, 3, 4)
    setup = nccl_setup(induced_topology(DGX, sorted(group)))
    for size in (1024, 10**6, 10**9):
        best = best_choice(nccl_choices(setup, "allreduce"), size)
        assert comm.time_us("allreduce", group, size) == pytest.approx(best.time_us(size))
        assert comm.choice("allreduce", group, size).name == f"nccl {best.name}"
    whole = tuple(range(8))
    assert comm.sub_topology(whole) is DGX
    assert comm.time_us("allgather", whole, 10**6) == pytest.approx(
        best_choice(nccl_choices(nccl_setup(DGX), "allgather"), 10**6).time_us(10**6))
    assert comm.time_us("allreduce", (3,), 10**9) == 0.0
    assert comm.time_us("send", (0, 1), 10**6) == pytest.approx(p2p_time_us(DGX, 0, 1, 10**6))
    with pytest.raises(InvalidInstanceError, match="src, dst"):
        comm.time_us("send", (0, 1, 2), 10)
    with pytest.raises(UnknownNameError, match="prices"):
        comm.time_us("alltoall", (0, 1), 10)


def test_planned_without_algorithms_is_nccl():
    comm = PlannedComm(DGX, synthesize=False)
    nccl = NcclComm(DGX)
    for size in (10**3, 10**7):
        assert comm.time_us("allreduce", (0, 1, 2, 3), size) == nccl.time_us(
            "allreduce", (0, 1, 2, 3), size)


def ring4():
    top = Topology("ring4", ((0, 1, 0, 0), (0, 0, 1, 0), (0, 0, 0, 1), (1, 0, 0, 0)),
                   unit_gbps=10.0, alpha_us=2.0)
    steps = tuple(Step(1, tuple(Send((r - t) % 4, r, (r + 1) % 4) for r in range(4)))
                  for t in range(3))
    return top, verify(Algorithm("ring", top, allgather(4), steps))


def test_planned_uses_a_supplied_algorithm():
    top, ring = ring4()
    comm = PlannedComm(top, algorithms=[ring], synthesize=False)
    nccl = NcclComm(top)
    size = 4000
    # 3 steps of 2 us, 3 rounds of a 1000-byte base chunk at 1e4 bytes/us
    expected = 3 * 2.0 + 3 * 1000 / 1e4
    assert expected < nccl.time_us("allgather", (0, 1, 2, 3), size)
    choice = comm.choice("allgather", (0, 1, 2, 3), size)
    assert choice.time_us == pytest.approx(expected) and choice.name.startswith("collsynth 3 steps")
    big = 10**9
    assert comm.time_us("allgather", (0, 1, 2, 3), big) == pytest.approx(
        min(nccl.time_us("allgather", (0, 1, 2, 3), big), 6.0 + 3 * big / 4 / 1e4))


def test_planned_synthesizes_small_groups_and_caches_fronts():
    comm = PlannedComm(DGX, synthesis_time_s=10)
    nccl = NcclComm(DGX)
    front = comm.front("allgather", (0, 1))
    assert front and comm.front("allgather", (4, 6)) is front  # same signature, same front
    for size in (10**3, 10**6, 10**9):
        lines = [p.time_us(size) for p in front]
        assert comm.time_us("allgather", (4, 6), size) == pytest.approx(
            min(lines + [nccl.time_us("allgather", (4, 6), size)]))
    # latency-bound: one synthesized step of 0.7 us beats NCCL's 6.6 us base latency
    assert comm.choice("allgather", (0, 1), 1000).name.startswith("collsynth")


def test_planned_hierarchical_on_two_nodes():
    node = with_figures(fully_connected(2), unit_gbps=25.0, alpha_us=0.7)
    two = compose_nodes(node, 2, nic_units=1)
    comm = PlannedComm(two, synthesize=False)
    nccl = NcclComm(two)
    for size in (10**3, 10**8):
        rs = max(nccl.time_us("reduce_scatter", p, size) for p in [(0, 1), (2, 3)])
        ar = max(nccl.time_us("allreduce", x, size / 2) for x in [(0, 2), (1, 3)])
        ag = max(nccl.time_us("allgather", p, size) for p in [(0, 1), (2, 3)])
        expected = min(nccl.time_us("allreduce", (0, 1, 2, 3), size), rs + ar + ag)
        assert comm.time_us("allreduce", (0, 1, 2, 3), size) == pytest.approx(expected)
    off = PlannedComm(two, synthesize=False, hierarchical=False)
    assert off.time_us("allreduce", (0, 1, 2, 3), 10**8) == nccl.time_us(
        "allreduce", (0, 1, 2, 3), 10**8)


def test_planned_bad_options():
    with pytest.raises(InvalidInstanceError, match="max_synthesis_ranks"):
        PlannedComm(DGX, max_synthesis_ranks=0)
    with pytest.raises(InvalidInstanceError, match="synthesis_time_s"):
        PlannedComm(DGX, synthesis_time_s=-1)


def test_planned_verifies_supplied_algorithms():
    from collsynth.errors import VerificationError

    top, ring = ring4()
    broken = dataclasses.replace(ring, steps=ring.steps[:2])  # one step short
    with pytest.raises(VerificationError):
        PlannedComm(top, algorithms=[broken])
    with pytest.raises(InvalidInstanceError, match="src, dst"):
        PlannedComm(top, synthesize=False).time_us("send", (0, 1, 2), 10)
