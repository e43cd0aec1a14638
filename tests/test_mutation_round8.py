"""Mutation round 8: NCCL's own cost model (collsynth.timing.tuning_model).

Each test kills a mutant the earlier suites let live. Every expected figure is worked out by
hand in the comment next to it from NCCL's source text (src/graph/tuning.cc and src/enqueue.cc
of the tags named), never from the code's output.
"""

from __future__ import annotations

import pytest

from collsynth.timing.tuning_model import (
    _PER_CH_NVLS_TREE,
    _PER_CH_RING_LL128,
    GraphFigures,
    TuningSetup,
    _cap,
    algo_time_us,
    bandwidth_correction,
    bandwidth_gbps,
    latency_us,
    max_channels,
)
from collsynth.timing.p2p_tuning import p2p_shape
from tests.timing.test_tuning_model import H100, H100_2N, nccl

# -- per-channel caps of Blackwell, by version ---------------------------------------------------


def test_blackwell_ring_ll128_cap_is_twice_hoppers_through_nccl_2_28():
    # perChMaxRingLL128Bws, Blackwell row: {2*36.7, 2*36.7, 2*36.7} in v2.27.7 and v2.28.3
    # (one node: 73.4), {40.0, 40.0, 40.0} in v2.29.7 and v2.30.7.
    assert _cap(_PER_CH_RING_LL128, nccl(cc=100, version=(2, 28))) == pytest.approx(73.4)
    assert _cap(_PER_CH_RING_LL128, nccl(cc=100, version=(2, 30))) == pytest.approx(40.0)


def test_blackwell_nvls_tree_cap_on_three_nodes_is_43_8_in_nccl_2_29():
    # perChMaxNVLSTreeBws, Blackwell, >= 3 nodes: 43.1 in v2.28.3, 43.8 in v2.29.2 and v2.29.7,
    # 80.0 in v2.30.7.
    def on(version):
        return _cap(_PER_CH_NVLS_TREE, nccl(cc=100, ranks=32, nodes=4, version=version))

    assert on((2, 28)) == pytest.approx(43.1)
    assert on((2, 29)) == pytest.approx(43.8)
    assert on((2, 30)) == pytest.approx(80.0)


# -- latency -------------------------------------------------------------------------------------


def _with_net_latency(setup: TuningSetup, extra_us: float) -> TuningSetup:
    import dataclasses

    graph = dataclasses.replace(setup.tree, latency_inter_us=extra_us)
    return dataclasses.replace(setup, ring=graph, tree=graph)


def test_simple_pays_the_network_devices_latency_twice_for_the_flush():
    # interLat += latencyInter, and once more for Simple ("Also add the flush extra latency").
    # Tree allreduce on 2 nodes of 8: 2 x (7 x intra + log2(2) x interLat), so a device latency
    # of 5 us adds 2 x 5 = 10 us to LL and 2 x (5 + 5) = 20 us to Simple.
    slow = _with_net_latency(H100_2N, 5.0)
    for protocol, added in (("LL", 10.0), ("Simple", 20.0)):
        assert latency_us(slow, "allreduce", "tree", protocol) == pytest.approx(
            latency_us(H100_2N, "allreduce", "tree", protocol) + added)


def test_a_ring_allgather_on_two_nodes_crosses_the_network_once():
    # nsteps = 15 for 16 ranks; nInterSteps = nNodes - 1 = 1 (2 x (nNodes - 1) only for
    # allreduce). LL: baseLat 6.6 + 14 x max(0.6 NVLink hop, 1.0 us net overhead) + 1 x 2.7
    # (the network's ring LL hop) = 23.3 us.
    assert latency_us(H100_2N, "allgather", "ring", "LL") == pytest.approx(23.3)


def test_collnet_latencies_on_two_nodes_of_eight():
    # CollNet Direct: baseLat 0 + 2 x (min(1, 7) x 3.7 + 7 x 0.4 arity latency) + 31 (network
    # hop) = 2 x 6.5 + 31 = 44.0 us. CollNet Chain: 0 + 2 x 7 x 2.8 + 30 = 69.2 us.
    setup = nccl(ranks=16, nodes=2, channels=8, bw=45.0, comm=16,
                 collnet=GraphFigures(8, 45.0, 45.0))
    assert latency_us(setup, "allreduce", "collnet_direct", "Simple") == pytest.approx(44.0)
    assert latency_us(setup, "allreduce", "collnet_chain", "Simple") == pytest.approx(69.2)


def test_the_ring_plateau_factor_is_for_allreduce_only():
    # ncclTopoGetAlgoTime multiplies lat by 1.4 for ring/Simple on several nodes only when
    # coll == ncclFuncAllReduce: a 1 GiB allgather keeps its latency.
    estimate = algo_time_us(H100_2N, "allgather", "ring", "Simple", 1 << 30)
    assert estimate.latency_us == pytest.approx(
        latency_us(H100_2N, "allgather", "ring", "Simple"))


# -- the tree correction factor ------------------------------------------------------------------


def test_nvls_tree_correction_applies_on_any_x86_host_and_not_on_arm():
    # The NVLS-tree correction needs minCompCap >= 100 and cpuArch == NCCL_TOPO_CPU_ARCH_X86,
    # which covers AMD CPUs as well as Intel ones. 1 MiB >> 6 = 2^14: Simple's entry 14 is 0.5.
    for cpu, factor in (("intel", 0.5), ("amd", 0.5), ("arm", 1.0)):
        setup = nccl(cc=100, ranks=16, nodes=2, cpu=cpu, nvls=GraphFigures(8, 40.0, 80.0))
        assert bandwidth_correction(setup, "allreduce", "nvls_tree", "Simple",
                                    1 << 20) == factor


# -- threads and channels of one call (topoGetAlgoInfo) -------------------------------------------


def test_ll128_threads_halve_only_while_a_multiple_of_128():
    # 1 KiB by ring/LL128 (640 threads, threshold 8): channels drop to 1 (1024 < 1 x 640 x 8);
    # then "if (nt % 128 == 0) nt /= 2; else break": 640 -> 320, and 320 % 128 = 64 stops it.
    assert max_channels(H100, "allreduce", "ring", "LL128", 1024) == (1, 320)


def test_a_ring_on_pci_bandwidth_runs_256_simple_threads():
    # maxThreads[RING][SIMPLE] = bwIntra x nChannels <= PCI_BW (12.0) ? 256 : 512; 2 channels of
    # 6 GB/s are exactly 12: 256, plus the ring's sync warp = 288 at a large size.
    pci = nccl(channels=2, bw=6.0, comm=4, nvlink=False)
    assert max_channels(pci, "allreduce", "ring", "Simple", 1 << 30) == (4, 288)


def test_only_the_ring_multiplies_the_ll_thread_threshold_by_the_ranks():
    # threadThresholds[a][LL] = 8 for every algorithm; only [RING][LL] *= nRanks. Tree/LL
    # (512 threads) at 49152 B = 12 x 512 x 8 keeps 12 of 24 channels; the tree then runs
    # NCCL_MAX_NTHREADS = 640 threads.
    assert max_channels(H100, "allreduce", "tree", "LL", 12 * 512 * 8) == (12, 640)


# -- CollNet Direct's bandwidth on Hopper --------------------------------------------------------


def test_collnet_direct_allreduce_loses_15_percent_from_hopper_on():
    # ncclTopoTuneModel: "if (minCompCap >= 90) busBw *= .85" for CollNet Direct; nothing else in
    # its allreduce bandwidth depends on the compute capability, so sm90 runs at 0.85 x sm80.
    def bw(cc):
        return bandwidth_gbps(nccl(cc=cc, ranks=16, nodes=2, channels=8, bw=45.0, comm=16,
                                   collnet=GraphFigures(8, 45.0, 45.0)),
                              "allreduce", "collnet_direct", "Simple")

    assert bw(80) > 0
    assert bw(90) == pytest.approx(0.85 * bw(80))


# -- send/recv channels per peer across nodes (src/graph/paths.cc) ---------------------------------


def test_before_nccl_2_29_net_peers_keep_two_channels_up_to_four_times_the_channels():
    # v2.28.9: "while (nChannelsMax*comm->nRanks > comm->p2pnChannels*4 && nChannelsMax > 1)
    # nChannelsMax /= 2": 2 x 64 ranks = 128 is not above 32 x 4 = 128, so 2 stay.
    setup = nccl(ranks=64, nodes=8, comm=32, version=(2, 28))
    assert p2p_shape(setup, 64 << 20, intra_peer_channels=4, nic_gbps=50.0).per_peer == 2


@pytest.mark.parametrize("nic_gbps, channels", [(25.0, 2), (56.5, 4)])
def test_from_nccl_2_29_a_nic_gets_a_channel_per_14_gbps_rounded_up(nic_gbps, channels):
    # v2.29.7: nNetChannels = divUp((int)netBw, NCCL_P2P_PER_CHANNEL_NET_BW = 14): 25 GB/s -> 2.
    # The NIC's GB/s is truncated first: 56.5 -> 56 -> 4, a power of two already (ceil(56.5 /
    # 14) = 5 would round up to 8); 4 x divUp(16 ranks, 8) = 8 is not above 32 channels.
    setup = nccl(ranks=16, nodes=2, comm=32, version=(2, 29))
    assert p2p_shape(setup, 16 << 20, intra_peer_channels=8, nic_gbps=nic_gbps).per_peer == \
        channels


def test_from_nccl_2_29_peers_fill_the_channels_exactly_once_per_batch():
    # v2.29.7: "while (p2pnChannelsPerPeer * divUp(nRanks, NCCL_MAX_DEV_WORK_P2P_PER_BATCH = 8)
    # > p2pnChannels ...) /= 2": 16 per peer x divUp(16, 8) = 32 is not above 32 channels.
    # 224 GB/s NIC: divUp(224, 14) = 16 network channels.
    setup = nccl(ranks=16, nodes=2, comm=32, version=(2, 29))
    assert p2p_shape(setup, 16 << 20, intra_peer_channels=16, nic_gbps=224.0).per_peer == 16
