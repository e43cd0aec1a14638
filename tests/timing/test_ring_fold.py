"""The runtime's ring folded by node (collsynth/timing/ring_fold.py): node 0's ring positions
standing for every node's must give the times of the whole ring, and the fold must refuse a
ring or a machine that does not repeat from node to node.

The reference is the whole ring program prepared by the scheduler (``prepare_program`` over
``ring_program``): an independent formulation of the same algorithm, not the code under test."""

from __future__ import annotations

import dataclasses

import pytest

from collsynth.errors import InputTooLargeError, UnknownNameError
from collsynth.runtimes import get_runtime
from collsynth.timing.ring_fold import folded_ring, node_periodic
from collsynth.timing.runtime_baselines import ring_program, ring_step_types, runtime_rings
from collsynth.timing.runtime_model import prepare_program, simulate_program
from collsynth.timing.runtime_programs import runtime_program
from collsynth.timing.symmetry import folded_members, rotate_nodes
from collsynth.topology import get_topology
from collsynth.topology.compose import compose_nodes

SIZES = (1024, 3 << 20, 256 << 20)
COLLECTIVES = ("allgather", "reduce_scatter", "allreduce")


def times(prepared, protocol, c=None):
    # a reduction and copy cost (NCCL's documented gamma is 0), so the passes count
    c = c or get_runtime("nccl").defaults.replace(gamma_us_per_byte=2e-6)
    return [simulate_program(prepared, None, s, c, protocol=protocol).time_us for s in SIZES]


@pytest.mark.parametrize("node,nodes", [("dgx-h100", 2), ("dgx-a100", 3), ("gh200x4", 5)])
@pytest.mark.parametrize("collective", COLLECTIVES)
@pytest.mark.parametrize("protocol", ["LL", "LL128", "Simple"])
def test_folded_rings_time_as_the_whole_ring(node, nodes, collective, protocol):
    machine = compose_nodes(get_topology(node), nodes)
    rings = runtime_rings(machine, 3)
    whole = prepare_program(ring_program(collective, rings, protocol=protocol), machine)
    folded = folded_ring(collective, rings, machine, protocol=protocol)
    assert folded is not None
    assert folded.num_transfers * nodes == whole.num_transfers
    assert times(folded, protocol) == pytest.approx(times(whole, protocol), rel=1e-9)


def test_a_ceiling_that_shares_the_network_times_as_the_whole_ring():
    # An oversubscribed network (each node's uplink at half its NICs) and a per-connection
    # ceiling: the fixed point shares the uplinks and caps the connections at once.
    machine = compose_nodes(get_topology("dgx-h100"), 3, oversubscription=2)
    rings = runtime_rings(machine, 4)
    c = get_runtime("nccl").defaults.replace(gamma_us_per_byte=2e-6)
    c = c.replace(ceiling_gbps={"intra": {"LL": 5.0, "LL128": 10.0, "Simple": 15.0},
                                "network": {"LL": 3.0, "LL128": 6.0, "Simple": 9.0}})
    whole = prepare_program(ring_program("allreduce", rings), machine)
    folded = folded_ring("allreduce", rings, machine)
    assert times(folded, "Simple", c) == pytest.approx(times(whole, "Simple", c), rel=1e-9)


def test_transfers_by_hand():
    # Two DGX-H100 (8 GPUs each), 2 channels: node 0's 8 positions x 2 channels x the
    # allreduce's 2 x 16 - 1 steps; the whole ring has twice as many.
    machine = compose_nodes(get_topology("dgx-h100"), 2)
    folded = folded_ring("allreduce", runtime_rings(machine, 2), machine)
    assert folded.num_transfers == 8 * 2 * 31
    # Position 0 (step 1) receives from position 7 of node 0, standing for the last position
    # of node 1; every send crosses one resource orbit per resource, each of weight 1 on a
    # machine with no resource shared by all nodes.
    m, channels = 8, 2
    first_receive = (1 * channels + 0) * m + 0
    assert folded.match[first_receive] == (0 * channels + 0) * m + 7
    assert set(folded.weights.tolist()) == {1.0}


def test_a_resource_shared_by_every_node_is_weighted_by_the_nodes():
    # Three nodes of 2 GPUs; NICs n0..n2 (one per node) and one core link K shared by all.
    # Node 0's send crosses its NIC (an orbit of 3, one per node: weight 1) and K (an orbit of
    # 1: the images on the three nodes all cross it, weight 3).
    def resolve(spec):
        name, *ranks = spec
        return (ranks[0] // 2,) if name == "nic" else (3,)

    members, weights = folded_members([[("nic", 1), ("core",)]], [1], resolve, [10.0] * 4, 2,
                                      3, rotate=lambda spec, i: rotate_nodes(spec, i, 2, 3))
    assert members.tolist() == [[0, 0], [0, 3]]
    assert weights.tolist() == [1.0, 3.0]


def test_node_rotation_wraps_around_the_last_node():
    assert rotate_nodes(("route", 7, 8), 1, 8, 2) == ("route", 15, 0)
    assert [rotate_nodes(("nic", 3), i, 4, 3)[1] for i in range(4)] == [3, 7, 11, 3]


def test_step_types_are_the_ring_programs():
    for collective in COLLECTIVES:
        for n in (2, 3, 6):
            program = ring_program(collective, [tuple(range(n))])
            assert all(tuple(s.type for s in tb.steps) == ring_step_types(collective, n)
                       for g in program.gpus for tb in g.threadblocks)
    with pytest.raises(UnknownNameError):
        ring_step_types("broadcast", 4)


def test_what_is_not_folded():
    two = compose_nodes(get_topology("dgx-h100"), 2)
    rings = runtime_rings(two, 2)
    # a rooted collective, one node, a ring that does not repeat from node to node
    assert folded_ring("broadcast", rings, two) is None
    one = get_topology("dgx-h100")
    assert folded_ring("allreduce", runtime_rings(one, 2), one) is None
    shuffled = [tuple(range(8)) + (9, 8) + tuple(range(10, 16))]
    assert not node_periodic(shuffled[0], 8)
    assert folded_ring("allreduce", shuffled, two) is None
    # two DGX-A100 of which the second has one NVLink pair at half its links: moving the nodes
    # one on maps a link onto one of another capacity, so it is not a symmetry
    machine = compose_nodes(get_topology("dgx-a100"), 2)
    rings = runtime_rings(machine, 2)
    a, b = rings[0][8], rings[0][9]
    links = [list(row) for row in machine.links]
    links[a][b] //= 2
    uneven = dataclasses.replace(machine, links=tuple(tuple(row) for row in links))
    assert folded_ring("allreduce", rings, uneven) is None
    # ... and the runtime's ring there is the whole one, as before
    built = runtime_program("ring", "allreduce", uneven, 2)
    assert prepare_program(built, uneven).num_transfers == 16 * 2 * 31


@pytest.mark.parametrize("collective", COLLECTIVES)
def test_under_leaf_switches_the_ring_folds_by_leaf(collective):
    # four nodes, two a leaf switch at 2:1: moving every node one on would put a leaf's two
    # nodes under two leaves (the route from node 1 to node 2 crosses the spine, from node 0 to
    # node 1 does not); moving them a leaf on is a symmetry, so the graph holds the first
    # leaf's 16 positions, half the ring
    leaves = compose_nodes(get_topology("dgx-h100"), 4, fabric="leaf-spine", nodes_per_leaf=2,
                           oversubscription=2)
    rings = runtime_rings(leaves, 3)
    whole = prepare_program(ring_program(collective, rings), leaves)
    folded = folded_ring(collective, rings, leaves)
    assert folded.num_transfers * 2 == whole.num_transfers
    assert times(folded, "Simple") == pytest.approx(times(whole, "Simple"), rel=1e-9)


def test_a_cluster_above_the_whole_rings_limit_is_priced():
    # 32 DGX-H100 (256 GPUs), 16 channels: the whole allgather ring has 256 x 16 x 257 =
    # 1,052,672 steps, above the simulator's 2^20; folded, 8 x 16 x 257.
    cluster = compose_nodes(get_topology("dgx-h100"), 32)
    built = runtime_program("ring", "allgather", cluster, 16)
    assert built.num_transfers == 8 * 16 * 257
    # 1440 GPUs on 18 channels stay above it even folded: refused with the folded count
    racks = compose_nodes(get_topology("gb200-nvl72"), 20)
    with pytest.raises(InputTooLargeError, match="folded by node"):
        runtime_program("ring", "allgather", racks, 18)


def test_the_ring_fit_prepares_the_folded_ring():
    # prepared_ring is what calibrate's ring fit prepares: folded on two nodes (half the
    # transfers), whole for a rooted collective, the same times as the whole ring either way
    from collsynth.timing.runtime_programs import prepared_ring

    two = compose_nodes(get_topology("dgx-h100"), 2)
    rings = runtime_rings(two, 2)
    whole = prepare_program(ring_program("allgather", rings, protocol="LL"), two)
    fitted = prepared_ring("allgather", rings, two, "LL")
    assert fitted.num_transfers * 2 == whole.num_transfers
    assert times(fitted, "LL") == pytest.approx(times(whole, "LL"), rel=1e-9)
    rooted = prepared_ring("broadcast", rings, two, "LL")
    assert rooted.num_transfers == prepare_program(
        ring_program("broadcast", rings, protocol="LL"), two).num_transfers
