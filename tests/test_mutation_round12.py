"""Mutation round 12: NCCL's per-call channel scheduler by version
(collsynth.timing.tuning_model: cell_channels, _cbd_channels, scheduled_channels, call_shape, the
NVLS graph's two-channel rule), the composed topology's sparse readers
(collsynth.topology.model: binding_groups, covered_units, Topology.bandwidth, link_block;
collsynth.topology.compose.Composition), the fabric, ring search and switch ports built on them
(collsynth.timing.paths, rings, switch_graphs), and the NVLS channel floor of tune-runtime and
time (collsynth.export.tuner.machine.ProgramModelPrice, collsynth.cli.time).

Each test kills a mutant the earlier suites let live. Every expected figure is worked out by
hand in the comment next to it from NCCL's source at the tag named (``git -C
/work/.mirror/NVIDIA+nccl/repo show v2.22.3-1:src/enqueue.cc``), or comes from another
formulation of the same thing (the dense link matrix against the composition), never from the
output of the code under test.
"""

from __future__ import annotations

import dataclasses

import pytest

from collsynth.timing.tuning_model import (
    GraphFigures,
    _cbd_channels,
    bandwidth_gbps,
    call_shape,
    cell_channels,
    scheduled_channels,
)
from tests.timing.test_tuning_model import H100_NVLS, nccl, rccl

KiB = 1024

# -- cell_channels: NCCL 2.22's scheduler (16 B cells, 512 B of traffic a channel) -----------------


def test_nccl_2_22_cells_are_16_bytes():
    # v2.22.3-1 enqueue.cc scheduleCollTasksToPlan: cellSize = 16; trafficPerChannel =
    # max(MinTrafficPerChannel = 512, trafficBytes / nChannels). Allreduce (trafficPerByte 2) of
    # 4112 B on 16 channels: traffic 8224, 8224 / 16 = 514 a channel; cells = 4112 / 16 = 257,
    # trafficPerCell 32; cellsPerChannel = min(257, divUp(514, 32) = 17) = 17; cellsLo =
    # min(257, 514 / 32 = 16) = 16; nMidChannels = 241 / 17 = 14, cellsHi = 241 % 17 = 3:
    # 1 + 14 + 1 = 16 channels, within 16 (cells of 32 B would fill 15).
    assert cell_channels("allreduce", 4112, 2, "Simple", 16, version=(2, 22)) == 16


def test_nccl_2_22_rounds_the_first_channels_cells_down():
    # v2.22.3-1:668 cellsLo = min(cells, (trafficPerChannel - currentTraffic) / trafficPerCell),
    # a floor (2.23 on: divUp). Allgather of 1584 B on 3 ranks (528 B a rank, trafficPerByte 3),
    # 4 channels: traffic 1584, 1584 / 4 = 396 < 512, so 512 a channel; cells = 528 / 16 = 33,
    # trafficPerCell 48; cellsPerChannel = min(33, divUp(512, 48) = 11) = 11; cellsLo =
    # 512 / 48 = 10; nMid = 23 / 11 = 2, cellsHi = 1: 1 + 2 + 1 = 4 (divUp would give 11 + 2 x 11:
    # 3).
    assert cell_channels("allgather", 1584, 3, "Simple", 4, version=(2, 22)) == 4


def test_nccl_2_22_skips_a_first_channel_of_no_cells():
    # v2.22.3-1:668-685: allgather of 1024 B on 64 ranks: 16 B a rank, one cell, trafficPerCell
    # 16 x 64 = 1024 above the 512 B a channel: cellsLo = 512 / 1024 = 0; cellsPerChannel =
    # min(1, divUp(512, 1024)) = 1; nMid = 1, cellsHi = 0; "if (cellsHi == 0 && nMidChannels !=
    # 0)" makes it cellsHi = 1, nMid 0; "if (cellsLo == 0)" skips the least channel: cellsLo = 1:
    # one channel, of 2 offered.
    assert cell_channels("allgather", 1024, 64, "Simple", 2, version=(2, 22)) == 1


# -- cell_channels: 2.23-2.28 (cells of divUp(16 KiB, trafficPerByte) rounded up to 16 B) ----------


def test_nccl_2_26_cell_size_rounds_the_per_byte_share_up():
    # v2.26.2-1:569 cellSize = divUp(divUp(MinTrafficPerChannel, trafficPerByte), 16) x 16.
    # Allgather on 1000 ranks (trafficPerByte 1000) of 100 B a rank (100000 B), 3 channels:
    # divUp(16384, 1000) = 17 -> cell 32 B (a floor, 16, would give 16 B); trafficPerChannel =
    # max(16384, 100000 / 3 = 33333) = 33333; cells = divUp(100, 32) = 4, trafficPerCell 32000;
    # cellsPerChannel = min(4, divUp(33333, 32000) = 2) = 2; cellsLo = min(4, 2) = 2; nMid =
    # 2 / 2 = 1, cellsHi 0: 2 channels (16 B cells: 7 cells, 3 a channel, 3 channels).
    assert cell_channels("allgather", 100000, 1000, "Simple", 3, version=(2, 26)) == 2


def test_reduce_scatter_cells_count_one_ranks_share():
    # v2.29.2-1 enqueue.cc: a reduce-scatter's task->count is recvcount (the buffer / nRanks)
    # and ncclFuncTrafficPerByte(ReduceScatter) = nRanks. 128 KiB on 8 ranks: 16 KiB a rank,
    # traffic 128 KiB; 16 channels: trafficPerChannel = divUp(max(32 KiB, 128 KiB) / 16, 16) x 16
    # = 8192; cellSize = divUp(divUp(32768, 8), 16) x 16 = 4096; cells = 4, trafficPerCell 32768;
    # cellsPerChannel = min(4, 1) = 1; cellsLo 1, nMid 3: 4 channels. (The whole buffer as the
    # count: 32 cells, 2 a channel, all 16.)
    assert cell_channels("reduce_scatter", 128 * KiB, 8, "Simple", 16, version=(2, 29)) == 4


# -- _cbd_channels: NCCL 2.20-2.21's channel-by-data scheduler -------------------------------------


def test_cbd_share_is_the_call_over_the_channels_rounded_up():
    # v2.21.5-1 enqueue.cc :834 maxBytesPerChannel = DIVUP(DIVUP(totalCBDBytes, usableChannels),
    # NCCL_BYTES_ALIGNMENT = 16) x 16; addCBDCollToPlan :467 workCount = DIVUP(DIVUP(enqBytes,
    # typeSize), alignCount) x alignCount, Simple alignCount = 4096 B / typeSize. Allreduce of
    # 98320 B (24 x 4096 + 16) on 24 channels: divUp(98320, 24) = 4097 -> 4112 -> 8192 B a
    # channel: divUp(98320, 8192) = 13 channels (a floor, 4096, would give 4096 B shares: 24).
    assert _cbd_channels(98320, "allreduce", 8, "Simple", 24, 512) == 13


def test_cbd_allgather_spreads_one_ranks_share():
    # addCBDCollToPlan: workBytesTotal = collInfo->count x typeSize, an allgather's count being
    # sendcount (the buffer / nRanks). 256 KiB on 8 ranks: 32 KiB; 16 channels: divUp(32768, 16) =
    # 2048 -> 4096 B a channel: 8 channels (the whole buffer would take all 16).
    assert _cbd_channels(256 * KiB, "allgather", 8, "Simple", 16, 512) == 8


# -- scheduled_channels / call_shape --------------------------------------------------------------


@pytest.mark.parametrize("algorithm", ["collnet_direct", "collnet_chain"])
def test_collnet_direct_and_chain_take_all_their_channels(algorithm):
    # v2.26.2-1 enqueue.cc :378-380 "case NCCL_ALGO_COLLNET_CHAIN: case
    # NCCL_ALGO_COLLNET_DIRECT: isCollnet = 1", and a CollNet task runs on "int nChannels =
    # task->nMaxChannels": no cells. A 64 KiB allreduce offered 16 channels keeps 16 (cells
    # would give divUp(131072 / 16, ...): 16 KiB a channel, 8 channels).
    setup = nccl(ranks=16, nodes=2, version=(2, 26))
    assert scheduled_channels(setup, "allreduce", algorithm, "Simple", 64 * KiB, 16,
                              threads=512) == 16


def test_rccl_call_runs_on_at_most_the_communicators_channels():
    # RCCL tuning model 6 (gfx950) sets an allgather's nMaxChannels from bytes per rank
    # (rcclOverrideChannels, AllGather {4 MiB, 256 MiB, 64}), but the scheduler spreads a call
    # over min(nMaxChannels, comm->nChannels): enqueue.cc "nChannels[kind] =
    # std::min(nChannels[kind], nMaxChannels[kind])" with nMaxChannels[kind] = comm->nChannels
    # (v2.26.2-1:492-510, RCCL's enqueue.cc the same). 2 nodes of 8, 16 channels: 128 MiB (8 MiB
    # a rank) asks 64 and runs on 16.
    setup = rccl("gfx950", ranks=16, nodes=2, channels=8)
    assert setup.comm_channels == 16
    shape = call_shape(setup, "allgather", "ring", "Simple", 128 << 20)
    assert (shape.max_channels, shape.channels) == (64, 16)


# -- the NVLS graph's channel rule from 2.28 -------------------------------------------------------


def test_an_nvls_graph_of_two_channels_has_bandwidth_at_nccl_2_28():
    # v2.28.3-1 tuning.cc: "NVLS/NVLStree needs at least 2 channels: if (graphs[a]->nChannels <
    # 2) continue"; two channels: intraBw = 40 x nvlsEfficiency[Hopper] 0.85 x (2 - 1) / 2 = 17,
    # x 2 for allreduce = 34; interBw = 80 (NVLS, one node): bw 34, bus 2 x 34 = 68, and from
    # 2.28 NVLS's ratio is nRanks / nsteps = 8 / 14.
    two = dataclasses.replace(H100_NVLS, version=(2, 28), nvls=GraphFigures(2, 40.0, 80.0))
    assert bandwidth_gbps(two, "allreduce", "nvls", "Simple") == pytest.approx(68 * 8 / 14)


# -- a composed machine's links read without the matrix (topology.model, topology.compose) --------

# One node of 4 ranks whose links differ each way (links[src][dst]), composed 3 times with one NIC
# of 1 unit per rank: by compose_nodes' rule (docs/topologies.md), links[s][d] is the node's
# SKEW[s % 4][d % 4] within a node and 1 between nodes. Its groups: rank 0's egress (units 3 + 1
# + 0 = 4 over a limit of 2: binds) and ranks 1, 2 into 3 (units 1 + 3 = 4, limit 4: never binds).
SKEW = ((0, 3, 1, 0),
        (0, 0, 2, 1),
        (1, 0, 0, 3),
        (2, 0, 0, 0))


def _skew():
    from collsynth.topology import Topology, compose_nodes
    from collsynth.topology.model import BandwidthGroup

    node = Topology("skew4", SKEW, (
        BandwidthGroup(frozenset({0}), frozenset({1, 2, 3}), 2, "p0"),
        BandwidthGroup(frozenset({1, 2}), frozenset({3}), 4, "in3")))
    return compose_nodes(node, 3, nic_units=1)


def _skew_link(src, dst):
    return SKEW[src % 4][dst % 4] if src // 4 == dst // 4 else 1


def _skew_dense():
    from collsynth.topology import Topology

    return Topology("skew4x3-dense",
                    tuple(tuple(_skew_link(s, d) for d in range(12)) for s in range(12)))


def _groups():
    from collsynth.topology.model import BandwidthGroup

    sides = [({1}, {0, 2, 3, 5, 9}),        # one source: its own node's ranks and others
             ({0}, {3, 4}),                 # its node's last rank (0 -> 3 is 0 units) and a peer
             ({1}, {2, 6}),                 # exactly one rank of its own node
             ({4, 5, 7, 0, 11}, {6}),       # one destination
             ({0, 1, 4, 6}, {1, 2, 5, 7, 8, 9}),  # many to many, pairs inside nodes 0 and 1
             ({5, 6}, {4, 7}),              # many to many inside node 1
             ({0, 1, 2}, {3})]              # more sources than destinations inside a node
    return [BandwidthGroup(frozenset(s), frozenset(d), 1) for s, d in sides]


def _sum(link, group):
    return sum(link(s, d) for s in group.sources for d in group.destinations)


def test_covered_units_of_a_composition_are_the_link_sums_each_way():
    # covered_units: links[s][d] summed over a group's sources and destinations; the expected
    # sums come from compose_nodes' rule above (the node's links inside a node, 1 unit between
    # nodes), the reversed machine's from links[d][s].
    from collsynth.topology.model import covered_units

    skew = _skew()
    for topology, link in ((skew, _skew_link), (skew.reversed(), lambda s, d: _skew_link(d, s))):
        groups = _groups() + list(topology.groups)
        assert covered_units(topology, groups) == [_sum(link, g) for g in groups]
        assert topology.links._dense is None  # read from the composition
    # by hand, two of them: rank 1 -> 0, 2, 3 (0 + 2 + 1) and -> 5, 9 (1 + 1): 5; ranks 5, 6 ->
    # 4, 7 (node 1's 1 -> 0, 1 -> 3, 2 -> 0, 2 -> 3: 0 + 1 + 1 + 3): 5
    assert covered_units(skew, [_groups()[0], _groups()[5]]) == [5, 5]


def test_covered_units_of_a_matrix_read_each_groups_links_the_right_way_round(monkeypatch):
    # The matrix form reads the smaller side's rows (columns, the matrix transposed) in blocks of
    # _SUM_CELLS cells: the same sums at any block size (2 cells: one row at a time).
    import collsynth.topology.model as model

    dense = _skew_dense()
    groups = _groups()
    expected = [_sum(_skew_link, g) for g in groups]
    assert model.covered_units(dense, groups) == expected
    monkeypatch.setattr(model, "_SUM_CELLS", 2)
    assert model.covered_units(dense, groups) == expected


def test_binding_groups_leave_out_a_group_whose_limit_equals_its_links():
    # rank k's egress p0 covers 4 units over a limit of 2 (binds); in3 covers 1 + 3 = 4 at a limit
    # of 4 (cannot bind); each NIC group covers the 8 ranks of the other nodes at 1 unit over a
    # limit of 1 (binds): 3 x 1 + 12 x 2 = 27 of the 30 groups.
    skew = _skew()
    names = [g.name for g in skew.binding_groups]
    assert len(skew.groups) == 30 and len(names) == 27
    assert not [name for name in names if "in3" in name]


def test_links_and_blocks_of_a_composition_read_src_to_dst():
    # Topology.bandwidth and link_block against compose_nodes' rule, on the composition, its
    # reversal and the same links as a matrix; a block may be empty (start == stop) or span nodes
    # (3..4: rank 3 of node 0 and rank 4 of node 1, 1 unit each way).
    skew = _skew()
    spans = ((0, 4), (4, 8), (1, 3), (3, 5), (3, 9), (7, 9), (5, 6), (0, 12), (2, 2))
    for topology, link in ((skew, _skew_link), (skew.reversed(), lambda s, d: _skew_link(d, s)),
                           (_skew_dense(), _skew_link)):
        assert [[topology.bandwidth(s, d) for d in range(12)] for s in range(12)] == \
            [[link(s, d) for d in range(12)] for s in range(12)]
        for start, stop in spans:
            block = topology.link_block(start, stop)
            assert block.shape == (stop - start, stop - start)
            assert block.tolist() == [[link(s, d) for d in range(start, stop)]
                                      for s in range(start, stop)]
    assert skew.link_block(3, 5).tolist() == [[0, 1], [1, 0]]


@pytest.mark.parametrize("src, dst", [(12, 0), (0, 12), (-1, 0)])
def test_a_link_outside_the_composition_is_refused(src, dst):
    with pytest.raises(IndexError):
        _skew().bandwidth(src, dst)


# -- the runtime's path through an NVSwitch (timing.paths.runtime_path) ---------------------------


def _switch3(links, groups=()):
    from collsynth.topology import Topology

    return Topology("sw3", links, groups, unit_gbps=10.0,
                    metadata={"machine": {"nvswitch": True, "arch": "sm80"}})


def test_an_nvswitch_path_without_groups_reads_the_senders_links_out():
    from collsynth.timing.paths import runtime_path

    # docs/runtime-model.md, "Foreign programs": without groups, a GPU's switch port is the sum
    # of its links. Rank 0 has no link to 1: its port out is 0 -> 2 = 2 units (20 GB/s), not its
    # links in (1 -> 0 + 2 -> 0 = 0 + 1 = 1 unit); rank 1's port in is 0 + 2 -> 1 = 2 units.
    path = runtime_path(_switch3(((0, 0, 2), (0, 0, 3), (1, 2, 0))), 0, 1)
    assert path.via == "the NVSwitch"
    assert [gbps for _, _, gbps in path.own] == [20.0, 20.0]


def test_an_nvswitch_path_crosses_the_senders_egress_and_the_receivers_ingress_only():
    from collsynth.timing.paths import runtime_path
    from collsynth.topology.model import BandwidthGroup

    # runtime_path: the groups "the path crosses" are those with a among their sources and b
    # among their destinations. Each rank's port out and in, every one binding (limit under its
    # links' units: out0 2 < 4, in1 1 < 0 + 2, out1 1 < 3, out2 1 < 3, in2 2 < 7) but in0
    # (1 = 0 + 1: never binds). 0 -> 1 (no link) crosses out0 and in1; out2 ({2} -> {0, 1}) and
    # in2 ({0, 1} -> {2}) hold one of the two ranks on the wrong side.
    def group(sources, destinations, limit, name):
        return BandwidthGroup(frozenset(sources), frozenset(destinations), limit, name)

    sw = _switch3(((0, 0, 4), (0, 0, 3), (1, 2, 0)), (
        group({0}, {1, 2}, 2, "out0"), group({1, 2}, {0}, 1, "in0"),
        group({1}, {0, 2}, 1, "out1"), group({0, 2}, {1}, 1, "in1"),
        group({2}, {0, 1}, 1, "out2"), group({0, 1}, {2}, 2, "in2")))
    assert [g.name for g in sw.binding_groups] == ["out0", "out1", "in1", "out2", "in2"]
    path = runtime_path(sw, 0, 1)
    assert (path.via, [sw.binding_groups[g].name for g in path.groups]) == \
        ("the NVSwitch", ["out0", "in1"])


# -- switch ports and NIC ports (timing.switch_graphs) ---------------------------------------------

HOPPER = {"arch": "sm90", "intra_class": "nvlink", "nvswitch": True, "nvls": True,
          "network_class": "ib", "cpu_vendor": "intel"}
NODE3 = ((0, 4, 2),   # out 6 units; rank 0's links in: 0 + 1 = 1
         (1, 0, 1),   # out 2; in 4 + 3 = 7
         (0, 3, 0))   # out 3; in 2 + 1 = 3


def _group(sources, destinations, limit, name=""):
    from collsynth.topology.model import BandwidthGroup

    return BandwidthGroup(frozenset(sources), frozenset(destinations), limit, name)


def test_switch_ports_take_each_ranks_links_out_and_in_capped_by_every_port_group():
    from collsynth.timing.switch_graphs import switch_ports
    from collsynth.topology import Topology

    # switch_ports: a rank's links out (in) inside its node, capped by each of its egress
    # (ingress) groups, x unit_gbps 10 x Hopper's port share 0.67 = 6.7 GB/s a unit. Rank 0 has
    # two egress groups over its 6 units, of limits 3 and 5: out min(6, 3, 5) = 3; rank 1 in:
    # min(7, 6 ({0, 2} -> {1}: 7 units)) = 6; the rest their links' sums.
    node = Topology("h3", NODE3, (_group({0}, {1, 2}, 3), _group({0}, {1, 2}, 5),
                                  _group({0, 2}, {1}, 6)),
                    unit_gbps=10.0, alpha_us=1.0, metadata={"machine": HOPPER})
    expected = ((3, 1), (2, 6), (3, 3))
    ports = [gbps for port in switch_ports(node) for gbps in port]
    assert ports == pytest.approx([6.7 * units for port in expected for units in port])


def test_a_port_group_may_name_a_rank_of_another_node_it_has_no_link_to():
    from collsynth.timing.switch_graphs import switch_ports
    from collsynth.topology import Topology, compose_nodes

    # A port's group is one whose every covered link is inside the rank's node; a rank of
    # another node it names without a link (0 -> 3 removed; 3 -> 1 removed, 1 -> 3 kept) covers
    # nothing there. Rank 0's egress {0} -> {1, 2, 3}: 4 + 2 = 6 units over a limit of 5: out 5;
    # rank 1's ingress {0, 2, 3} -> {1}: 4 + 3 = 7 over 6: in 6 (x 6.7 GB/s a unit).
    node = Topology("h3", NODE3, unit_gbps=10.0, alpha_us=1.0, metadata={"machine": HOPPER})
    two = compose_nodes(node, 2, nic_units=1)
    links = [list(row) for row in two.links]
    links[0][3] = links[3][1] = 0
    dense = Topology("h3x2-cut", tuple(map(tuple, links)),
                     (_group({0}, {1, 2, 3}, 5), _group({0, 2, 3}, {1}, 6)),
                     unit_gbps=10.0, alpha_us=1.0, metadata=two.metadata)
    ports = switch_ports(dense)
    assert ports[0][0] == pytest.approx(5 * 6.7) and ports[1][1] == pytest.approx(6 * 6.7)


GPU = {"arch": "sm90", "intra_class": "nvlink", "nvswitch": False, "nvls": False,
       "network_class": "ib", "cpu_vendor": "intel", "sharp": True}


def _one_gpu_nodes(links, groups=()):
    """A machine of one-GPU nodes with the given links and groups (the composition's layout)."""
    from collsynth.topology import Topology, compose_nodes

    gpu = Topology("gpu", ((0,),), unit_gbps=10.0, alpha_us=1.0,
                   metadata={"machine": GPU, "nic": {"count": 1, "gbps": 10.0, "per_gpu": True}})
    layout = compose_nodes(gpu, len(links)).metadata
    return Topology("gpus", links, groups, unit_gbps=10.0, alpha_us=1.0, metadata=layout)


def _nic_names(topology, per):
    from collsynth.timing.paths import Fabric
    from collsynth.timing.switch_graphs import _nic_ports

    fabric = Fabric(topology)
    out, into = _nic_ports(topology, fabric, per)
    return ([[fabric.names[r] for r in rank] for rank in out],
            [[fabric.names[r] for r in rank] for rank in into])


def test_without_nic_groups_a_ranks_nic_is_its_one_link_each_way():
    # _nic_ports: "no group: a rank whose one link to another node is its NIC". A directed ring
    # of three one-GPU nodes (0 -> 1 -> 2 -> 0): rank 0's NIC out is its link to 1, in its link
    # from 2.
    out, into = _nic_names(_one_gpu_nodes(((0, 1, 0), (0, 0, 1), (1, 0, 0))), 1)
    assert (out[0], into[0]) == (["link 0->1"], ["link 2->0"])


def test_without_nic_groups_a_rank_of_several_peers_has_no_nic():
    from collsynth.errors import InvalidTopologyError

    # Three one-GPU nodes, no groups: rank 0 sends to 1 and 2 (two peers out, so neither link is
    # its NIC) and hears from 1 alone; rank 2 sends nowhere. The first rank without a NIC is 0.
    with pytest.raises(InvalidTopologyError, match="rank 0 has no NIC group"):
        _nic_names(_one_gpu_nodes(((0, 1, 1), (1, 0, 0), (0, 0, 0))), 1)


def test_a_nic_group_reaches_every_rank_of_the_other_nodes_and_none_of_its_own():
    # _nic_ports: a rank's NIC groups run from ranks of its node to every rank of the other nodes.
    # Two nodes of two GPUs, all linked 2 units: {0} -> {1, 2} names as many ranks (2) as the
    # other node has but holds rank 0's own node-mate 1: not a NIC group (limit 1 under its 4
    # units, so it binds). Every rank's real NIC groups: {r} -> the other node, limit 1.
    from collsynth.topology import Topology, compose_nodes

    links = tuple(tuple(0 if a == b else 2 for b in range(4)) for a in range(4))
    groups = [_group({0}, {1, 2}, 1, "not a nic")]
    for r in range(4):
        far = {2, 3} if r < 2 else {0, 1}
        groups += [_group({r}, far, 1, f"nic{r} out"), _group(far, {r}, 1, f"nic{r} in")]
    node = Topology("two", ((0, 2), (2, 0)), unit_gbps=10.0, alpha_us=1.0,
                    metadata={"machine": GPU})
    topology = Topology("twox2", links, tuple(groups), unit_gbps=10.0, alpha_us=1.0,
                        metadata=compose_nodes(node, 2, nic_units=1).metadata)
    out, _ = _nic_names(topology, 2)
    assert out[0] == ["group 'nic0 out'"]


def test_a_far_side_shared_by_two_nodes_groups_is_judged_for_each_node():
    # One frozenset {1, 2} as the far side of rank 0's group (every rank of the other nodes: its
    # NIC) and of rank 1's (which holds rank 1 itself: not a NIC group). Three one-GPU nodes,
    # all linked 2 units; each group's limit 1 is under its links' 2 or 4 units.
    far = frozenset({1, 2})
    groups = [_group({0}, far, 1, "nic0 out"), _group({1}, far, 1, "not rank 1's nic"),
              _group({1}, {0, 2}, 1, "nic1 out"), _group({2}, {0, 1}, 1, "nic2 out"),
              _group({1, 2}, {0}, 1, "nic0 in"), _group({0, 2}, {1}, 1, "nic1 in"),
              _group({0, 1}, {2}, 1, "nic2 in")]
    topology = _one_gpu_nodes(((0, 2, 2), (2, 0, 2), (2, 2, 0)), groups)
    out, _ = _nic_names(topology, 1)
    assert out[1] == ["group 'nic1 out'"]


# -- NVLS never forced on fewer channels than the runtime's own (export.tuner, cli.time) -----------


def test_nvls_tree_is_never_forced_on_fewer_channels_than_the_runtimes_own():
    from collsynth.export.tuner.choose import Choice
    from collsynth.export.tuner.machine import ProgramModelPrice, forced_channels
    from collsynth.timing import tuning_model as tm
    from collsynth.topology import compose_nodes, get_topology

    # docs/tuner-config.md, "NVLS channels": NVLS and NVLS-tree are never forced on fewer
    # channels than the runtime's own per-call count. Two DGX H100: NVLS-tree runs on the 16
    # NVLS channels (kind_channels), and a 128 MiB allreduce's cells (256 MiB of traffic over
    # 16) fill them all; 2 or 8 forced are not offered, 16 is.
    two = compose_nodes(get_topology("dgx-h100"), 2)
    setup = tm.tuning_setup(two)
    price = ProgramModelPrice(two)
    size = 128 << 20
    assert forced_channels(setup, "allreduce", Choice("nvls_tree", "simple"), size) == 16
    for fewer in (2, 8):
        assert price(setup, "allreduce", Choice("nvls_tree", "simple", fewer), size) is None
    assert price(setup, "allreduce", Choice("nvls_tree", "simple", 16), size) is not None


def _notes(channels, algorithm, **constants):
    from types import SimpleNamespace

    from collsynth.cli.time import _nvls_channel_notes
    from collsynth.runtimes import get_runtime
    from collsynth.timing.program_model import ProgramModel
    from collsynth.topology import get_topology

    nccl = get_runtime("nccl")
    model = ProgramModel(nccl.defaults.replace(**constants), runtime=nccl)
    ours = [SimpleNamespace(name=f"nccl-{algorithm}/{channels}ch", algorithm=algorithm,
                            runtime=nccl)]
    return _nvls_channel_notes(channels, ours, model, get_topology("dgx-h100"))


def test_the_lower_bound_note_names_nvls_tree_too():
    # cli.time: NVLS or NVLS-tree on fewer --channels than the runtime's NVLS count (16 on one
    # DGX H100) where the constants bound no NVLS channel is named a lower bound.
    notes = _notes(2, "nvls_tree")
    assert len(notes) == 1 and notes[0].startswith(
        "nccl-nvls_tree/2ch: on 2 of the runtime's 16 NVLS channels")
    assert _notes(2, "ring") == []


def test_no_lower_bound_note_where_the_constants_bound_an_nvls_channel():
    # The note says "the constants bound no NVLS channel (no nvls_channel_gbps)": with a figure
    # of an NVLS channel's rate there is nothing to note.
    assert _notes(2, "nvls") != []
    assert _notes(2, "nvls", nvls_channel_gbps=20.0) == []


def test_a_single_links_group_caps_that_link_not_the_ports():
    from collsynth.timing.switch_graphs import switch_ports
    from collsynth.topology import Topology

    # A group over the one link 0 -> 1 (limit 3 of its 4 units) bounds that link; rank 0's port
    # out still carries its 6 units (4 to rank 1, 2 to rank 2) and rank 1's port in its 7 (4 +
    # 3). It capped both ports at 3 (the oddity round 12 met): only a group over all of a
    # rank's links inside its node bounds the port.
    node = Topology("h3", NODE3, (_group({0}, {1}, 3),), unit_gbps=10.0, alpha_us=1.0,
                    metadata={"machine": HOPPER})
    expected = ((6, 1), (2, 7), (3, 3))
    ports = [gbps for port in switch_ports(node) for gbps in port]
    assert ports == pytest.approx([6.7 * units for port in expected for units in port])
