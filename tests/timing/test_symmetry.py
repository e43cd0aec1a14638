"""Folded switch graphs (collsynth/timing/symmetry.py): shard 0 of one channel standing for all
of them must give the times of the whole graph, and the fold must refuse a machine the
rotation of every node's GPUs does not map onto itself.

The reference is the unfolded graph (``fold=False``), simulated transfer by transfer: an
independent formulation of the same algorithm, not the code under test."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from collsynth.runtimes import PROTOCOLS, get_runtime
from collsynth.timing.runtime_model import simulate_program
from collsynth.timing.switch_graphs import nvls_graph, nvls_tree_graph
from collsynth.timing.symmetry import folded_members, rotate_spec
from collsynth.topology import get_topology
from collsynth.topology.compose import compose_nodes
from tests.timing.test_runtime_algorithms import port_bytes

SIZES = (4096, 3 << 20, 256 << 20)


def constants(channel_gbps: float | None = None):
    """NCCL's documented constants; with ``channel_gbps``, a channel's SM slower than a port,
    so that the fixed point shares the ports and caps the channels at once."""
    c = get_runtime("nccl").defaults
    return c if channel_gbps is None else c.replace(nvls_channel_gbps=channel_gbps)


def times(graph, c):
    return [simulate_program(graph, None, s, c).time_us for s in SIZES]


@pytest.mark.parametrize("collective", ["allreduce", "allgather", "reduce_scatter"])
@pytest.mark.parametrize("channels", [1, 3, 16])
@pytest.mark.parametrize("channel_gbps", [None, 20.0])
def test_folded_nvls_times_are_the_whole_graphs(collective, channels, channel_gbps):
    h100 = get_topology("dgx-h100")
    whole = nvls_graph(collective, h100, channels, fold=False)
    folded = nvls_graph(collective, h100, channels)
    assert folded.num_transfers < whole.num_transfers
    c = constants(channel_gbps)
    assert times(folded, c) == pytest.approx(times(whole, c), rel=1e-9)


@pytest.mark.parametrize("nodes", [2, 3, 5])
@pytest.mark.parametrize("channels", [1, 2, 5])
def test_folded_nvls_tree_times_are_the_whole_graphs(nodes, channels):
    # Odd channel counts leave the two trees different weights (3 even, 2 odd channels of 5);
    # 3 and 5 nodes make trees whose heads have one or two children.
    machine = compose_nodes(get_topology("dgx-h100"), nodes)
    whole = nvls_tree_graph("allreduce", machine, channels, fold=False)
    folded = nvls_tree_graph("allreduce", machine, channels)
    assert folded.num_transfers < whole.num_transfers
    for c in (constants(), constants(20.0)):
        assert times(folded, c) == pytest.approx(times(whole, c), rel=1e-9)


def test_the_busiest_resource_is_named_with_the_whole_graphs_utilization():
    machine = compose_nodes(get_topology("dgx-h100"), 2)
    whole = simulate_program(nvls_tree_graph("allreduce", machine, 4, fold=False), None,
                             64 << 20, constants())
    folded = simulate_program(nvls_tree_graph("allreduce", machine, 4), None, 64 << 20,
                              constants())
    assert folded.breakdown["busiest_utilization"] == \
        pytest.approx(whole.breakdown["busiest_utilization"], rel=1e-9)


def test_a_node_whose_gpus_share_nics_unevenly_is_not_folded():
    # 4 NICs for 8 GPUs: GPUs 0 and 1 share NIC 0, so turning the GPUs by one maps NIC 0's
    # traffic onto NIC 0 and NIC 1's; not a symmetry, so the whole graph is built.
    node = get_topology("dgx-h100")
    nic = {**node.metadata["nic"], "count": 4, "per_gpu": False}
    shared = compose_nodes(dataclasses.replace(node, metadata={**node.metadata, "nic": nic}), 2)
    whole = nvls_tree_graph("allreduce", shared, 2, fold=False)
    asked = nvls_tree_graph("allreduce", shared, 2)
    assert asked.num_transfers == whole.num_transfers
    assert asked.weights is None


def test_ports_of_unequal_speed_are_not_folded():
    # GPU 0 with one NVLink to each peer (7 in all, under its 18-link group): its port is
    # slower, so no rotation of the node's GPUs maps the ports onto ports of the same capacity.
    h100 = get_topology("dgx-h100")
    links = [list(row) for row in h100.links]
    for b in range(1, 8):
        links[0][b] = links[b][0] = 1
    uneven = dataclasses.replace(h100, links=tuple(tuple(r) for r in links))
    assert nvls_graph("allreduce", uneven, 2).num_transfers == \
        nvls_graph("allreduce", uneven, 2, fold=False).num_transfers


def test_weights_by_hand():
    # Two nodes of 2 GPUs: per-GPU ports p0..p3 (ranks 0-3), and one network link N shared by
    # both GPUs of node 0 to node 1. Shard 0 holds: a send of rank 0 on its port and N, and a
    # send of rank 1 on its port. Turning the GPUs maps p0 <-> p1, p2 <-> p3 and N onto itself.
    # Per unit of rate: p0's orbit {p0, p1} gets 2/2 x 1 from the first transfer, N (an orbit
    # of 1) 2/1 x 1 = 2 (both shards cross it), p1 (least index p0) 1 from the second; 3
    # channels multiply each.
    ports = {0: 0, 1: 1, 2: 2, 3: 3}

    def resolve(spec):
        name, *ranks = spec
        return (ports[ranks[0]], 4) if name == "net" else (ports[ranks[0]],)

    members, weights = folded_members([[("net", 0)], [("port", 1)]], [3, 3], resolve,
                                      [10.0] * 5, 2)
    assert members.tolist() == [[0, 0], [0, 4], [1, 0]]
    assert weights.tolist() == [3.0, 6.0, 3.0]
    # A capacity that changes along an orbit is refused.
    assert folded_members([[("net", 0)]], [1], resolve, [10.0, 20.0, 10.0, 10.0, 10.0], 2) \
        is None


def test_rotation_stays_inside_each_node():
    assert rotate_spec(("route", 0, 7), 1, 4) == ("route", 1, 4)
    assert rotate_spec(("up", 5), 3, 4) == ("up", 4)
    assert [rotate_spec(("up", 2), i, 4)[1] for i in range(5)] == [2, 3, 0, 1, 2]


def test_the_large_rack_folds_to_a_graph_the_model_can_simulate():
    # GB200 NVL72 x 20 (1440 GPUs): the whole NVLS-tree graph of 32 channels has 10,137,600
    # transfers, above the simulator's limit; folded, 2 channels x 20 nodes x (3 x 72 + 4) at
    # most.
    racks = compose_nodes(get_topology("gb200-nvl72"), 20)
    graph = nvls_tree_graph("allreduce", racks, 32)
    assert graph.num_transfers <= 2 * 20 * (3 * 72 + 4)
    assert np.all(graph.weights >= 1)


def test_a_rack_of_72_gpus_has_32_nvls_heads_by_hand():
    # NCCL_MAX_NVLS_ARITY = 32: the allreduce's shards are 32 per channel, reduced on GPUs
    # 0-31. Per port, in units of the buffer S: every GPU sends all 32 shards up (S) and gets
    # a copy of each (S); a head also gets its shard's sum (S/32 down) and stores it (S/32 up).
    size = 64 << 20
    rack = get_topology("gb200-nvl72")
    carried = port_bytes(nvls_graph("allreduce", rack, 2, fold=False), size)
    for rank in (0, 31, 32, 71):
        extra = size / 32 if rank < 32 else 0.0
        assert carried[f"NVLS port of rank {rank} to switch 0"] == pytest.approx(size + extra)
        assert carried[f"NVLS port of rank {rank} from switch 0"] == pytest.approx(size + extra)


@pytest.mark.parametrize("channels", [1, 3])
def test_folded_graphs_with_fewer_heads_than_gpus_time_as_the_whole(channels):
    # The first 32 of 72 GPUs turn, the other 40 stay: NVLS on one rack and NVLS-tree on two.
    rack = get_topology("gb200-nvl72")
    for build, machine in ((nvls_graph, rack), (nvls_tree_graph, compose_nodes(rack, 2))):
        whole = build("allreduce", machine, channels, fold=False)
        folded = build("allreduce", machine, channels)
        assert folded.num_transfers < whole.num_transfers
        for c in (constants(), constants(20.0)):
            assert [simulate_program(folded, None, s, c).time_us for s in (1 << 20, 1 << 30)] \
                == pytest.approx([simulate_program(whole, None, s, c).time_us
                                  for s in (1 << 20, 1 << 30)], rel=1e-9)
