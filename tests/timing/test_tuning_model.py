"""The port of NCCL's and RCCL's tuning model (collsynth.timing.tuning_model).

Every expected figure is worked out by hand in the comment next to it, from the formulas and
constants of NCCL 2.30 / RCCL (docs/runtime-tuning.md), on setups built by hand (GraphFigures
given explicitly), so a test does not lean on the graph-figure approximation it is not about.
"""

from __future__ import annotations

import dataclasses

import pytest

from collsynth.errors import InvalidInstanceError, UnknownNameError
from collsynth.topology import compose_nodes, get_topology
from collsynth.topology.machine import MachineFacts
from collsynth.timing.tuning_model import (
    PROTOCOLS,
    Estimate,
    GraphFigures,
    TuningSetup,
    algo_time_us,
    bandwidth_gbps,
    call_shape,
    cell_channels,
    choose,
    enabled,
    estimates,
    fastest,
    gpu_bandwidth_gbps,
    latency_us,
    max_channels,
    setup_from_facts,
    tuning_setup,
)

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30


def nccl(*, ranks: int = 8, nodes: int = 1, cc: int = 90, channels: int = 12, bw: float = 30.0,
         bw_inter: float | None = None, comm: int = 24, nvls: GraphFigures | None = None,
         nvls_channels: int = 16, pat: bool = False, version: tuple[int, int] = (2, 30),
         cpu: str | None = "intel", collnet: GraphFigures | None = None, ll128: bool = True,
         nvlink: bool = True) -> TuningSetup:
    graph = GraphFigures(channels, bw, bw if bw_inter is None else bw_inter, nvlink)
    return TuningSetup("nccl", version, ranks, nodes, cc, f"sm{cc}", cpu, graph, graph, comm,
                       nvls=nvls, collnet=collnet, nvls_channels=nvls_channels, pat=pat,
                       ll128=ll128)


def rccl(arch: str, *, ranks: int = 8, nodes: int = 1, channels: int = 16, bw: float = 20.0,
         version: tuple[int, int] = (2, 28)) -> TuningSetup:
    graph = GraphFigures(channels, bw, bw)
    return TuningSetup("rccl", version, ranks, nodes, None, arch, "amd", graph, graph,
                       2 * channels, ll128=arch in ("gfx90a", "gfx942", "gfx950"))


H100 = nccl()  # one DGX H100 node: 12 ring channels of 30 GB/s (the search's 6 x 60, doubled)
H100_NVLS = nccl(nvls=GraphFigures(8, 40.0, 80.0))
H100_2N = nccl(ranks=16, nodes=2, channels=8, bw=45.0, comm=16)


# -- latency --------------------------------------------------------------------------------------


def test_ring_allreduce_latency_one_h100_node():
    # n = 8, nsteps = 2(n-1) = 14 NVLink hops: LL 6.6 + 14 x 0.6 = 15.0; LL128 14 + 14 x 1.9 =
    # 40.6; Simple 8.4 + 14 x 3.4 = 56.0 (the memo's worked example).
    assert [latency_us(H100, "allreduce", "ring", p) for p in PROTOCOLS] == pytest.approx(
        [15.0, 40.6, 56.0])


def test_ring_allreduce_latency_two_nodes_and_the_simple_plateau():
    # n = 16, nsteps = 30, 2 network steps; Simple: intra hop max(3.4, 3 x 1.0 us overhead) = 3.4,
    # network hop 14.0: 8.4 + 28 x 3.4 + 2 x 14.0 = 131.6 us.
    assert latency_us(H100_2N, "allreduce", "ring", "Simple") == pytest.approx(131.6)
    # LL: intra max(0.6, 1.0 x 1) = 1.0, network 2.7: 6.6 + 28 x 1.0 + 2 x 2.7 = 40.0.
    assert latency_us(H100_2N, "allreduce", "ring", "LL") == pytest.approx(40.0)
    # x 1.4 once size / (16 comm channels x 16 ranks) >= 64, i.e. from 16384 B.
    below = algo_time_us(H100_2N, "allreduce", "ring", "Simple", 16383)
    at = algo_time_us(H100_2N, "allreduce", "ring", "Simple", 16384)
    assert below.latency_us == pytest.approx(131.6)
    assert at.latency_us == pytest.approx(131.6 * 1.4)
    # Before sm80 the plateau is x 1.9.
    volta = dataclasses.replace(H100_2N, compute_capability=70)
    assert algo_time_us(volta, "allreduce", "ring", "Simple", 1 << 20).latency_us == \
        pytest.approx(131.6 * 1.9)
    # An AMD host: 2 us overhead, x 3 for Simple = 6.0 per intra step: 8.4 + 28 x 6 + 28 = 204.4.
    amd = dataclasses.replace(H100_2N, net_overhead_us=2.0)
    assert latency_us(amd, "allreduce", "ring", "Simple") == pytest.approx(204.4)


def test_tree_pat_nvls_latencies():
    # Tree, one node of 8: LL 6.8 + 2 x (7 x 0.6) = 15.2; Simple 8.4 + 2 x 7 x 4.0 = 64.4.
    assert latency_us(H100, "allreduce", "tree", "LL") == pytest.approx(15.2)
    assert latency_us(H100, "allreduce", "tree", "Simple") == pytest.approx(64.4)
    # Two nodes: Simple 8.4 + 2 x (7 x 4.0 + log2(2) x 14) = 92.4.
    assert latency_us(H100_2N, "allreduce", "tree", "Simple") == pytest.approx(92.4)
    # PAT, 4 nodes of one GPU: 8.0 + log2(4) x 14 / 3.5 + 4 x 2.8 = 27.2 (the NET Tree row:
    # one GPU per node); before 2.28 PAT's own base latency is 0, but the network hop still
    # comes from the Tree row: 0 + 2 x 14 / 3.5 + 11.2 = 19.2.
    pat = nccl(ranks=4, nodes=4, channels=2, bw=24.0, comm=4, pat=True)
    assert latency_us(pat, "allgather", "pat", "Simple") == pytest.approx(27.2)
    old = dataclasses.replace(pat, version=(2, 25))
    assert latency_us(old, "allgather", "pat", "Simple") == pytest.approx(19.2)
    # NVLS on one node: the NVLink hop alone, 25 us (base latency not added); two nodes: + 18.
    assert latency_us(H100_NVLS, "allreduce", "nvls", "Simple") == pytest.approx(25.0)
    two = dataclasses.replace(H100_2N, nvls=GraphFigures(8, 40.0, 48.0))
    assert latency_us(two, "allreduce", "nvls", "Simple") == pytest.approx(43.0)
    # NVLS tree on 2 nodes: 0 + 25 + 2 x log2(2) x 20.9 = 66.8; before 2.29 the hop was 14: 53.
    assert latency_us(two, "allreduce", "nvls_tree", "Simple") == pytest.approx(66.8)
    assert latency_us(dataclasses.replace(two, version=(2, 28)), "allreduce", "nvls_tree",
                      "Simple") == pytest.approx(53.0)


def test_broadcast_latency_one_hop_or_every_hop():
    # Same channels: one ring hop, LL 6.6 + 0.6 = 7.2; otherwise nsteps = n = 8 hops and, for
    # Simple, the tree's Simple hop: 8.4 + 8 x 4.0 = 40.4.
    assert latency_us(H100, "broadcast", "ring", "LL") == pytest.approx(7.2)
    split = dataclasses.replace(H100, ring=dataclasses.replace(H100.ring, same_channels=False))
    assert latency_us(split, "broadcast", "ring", "Simple") == pytest.approx(40.4)


def test_tree_simple_latency_before_2_23():
    # <= 2.22: Tree Simple base 0 and 28 us per hop: 2 x 7 x 28 = 392.
    old = dataclasses.replace(H100, version=(2, 22))
    assert latency_us(old, "allreduce", "tree", "Simple") == pytest.approx(392.0)


# -- bandwidth ------------------------------------------------------------------------------------


def test_ring_and_tree_bandwidths_one_h100_node():
    # bus = 12 channels x 30 GB/s = 360; ring allreduce algbw = bus x 8/14.
    ring = {p: bandwidth_gbps(H100, "allreduce", "ring", p) for p in PROTOCOLS}
    assert ring["Simple"] == pytest.approx(360 * 8 / 14)
    # LL: min(llMaxBw Hopper 1 node 141.0, 0.5 x 360) = 141.
    assert ring["LL"] == pytest.approx(141 * 8 / 14)
    # LL128: min(0.92 x 360 = 331.2, 12 x 36.7 = 440.4) = 331.2.
    assert ring["LL128"] == pytest.approx(331.2 * 8 / 14)
    tree = {p: bandwidth_gbps(H100, "allreduce", "tree", p) for p in PROTOCOLS}
    # Simple: min(0.92 x 360, 12 x 38.7 = 464.4) = 331.2; tree algbw = bus / 2.
    assert tree["Simple"] == pytest.approx(331.2 / 2)
    # LL: min(331.2 / 3.8, 141) / 2; LL128: min(331.2 x 7/9, 440.4) / 2.
    assert tree["LL"] == pytest.approx(331.2 / 3.8 / 2)
    assert tree["LL128"] == pytest.approx(331.2 * 7 / 9 / 2)
    # allgather ring Simple: bus x n/(n-1) = 360 x 8/7.
    assert bandwidth_gbps(H100, "allgather", "ring", "Simple") == pytest.approx(360 * 8 / 7)


def test_per_channel_caps_and_ll_rows():
    # A100, 12 channels of 20: ring LL min(87.7, 120) = 87.7; tree Simple min(0.92 x 240 = 220.8,
    # 12 x 24.0 = 288) = 220.8.
    a100 = nccl(cc=80, bw=20.0)
    assert bandwidth_gbps(a100, "allreduce", "ring", "LL") == pytest.approx(87.7 * 8 / 14)
    assert bandwidth_gbps(a100, "allreduce", "tree", "Simple") == pytest.approx(220.8 / 2)
    # A cap that binds: 12 channels of 60 on Hopper: tree min(0.92 x 720 = 662.4, 464.4).
    fast = nccl(bw=60.0)
    assert bandwidth_gbps(fast, "allreduce", "tree", "Simple") == pytest.approx(464.4 / 2)
    # Several nodes pick the llMaxBws row by CPU: Intel 39.0 (2 nodes), 20.4 (>= 3); AMD 22.5,
    # 19.0. Ring LL bus = min(row, 0.5 x 8 x 45 = 180).
    for cpu, nodes, cap in (("intel", 2, 39.0), ("intel", 3, 20.4), ("amd", 2, 22.5),
                            ("amd", 4, 19.0), ("arm", 2, 39.0)):
        s = nccl(ranks=8 * nodes, nodes=nodes, channels=8, bw=45.0, comm=16, cpu=cpu)
        assert bandwidth_gbps(s, "allreduce", "ring", "LL") == pytest.approx(
            cap * 8 * nodes / (2 * (8 * nodes - 1))), (cpu, nodes)


def test_nvls_bandwidth_and_its_older_formula():
    # 2.30: intra = 40 x 0.85 x 7/8 x 2 = 59.5 per channel, inter 80: bus 8 x 59.5 = 476,
    # algbw x 8/14 = 272.
    assert bandwidth_gbps(H100_NVLS, "allreduce", "nvls", "Simple") == pytest.approx(272.0)
    # allgather: x (ppn-1)/ppn instead of x 2: 40 x 0.85 x 7/8 x 7/8 = 26.03; no conversion.
    assert bandwidth_gbps(H100_NVLS, "allgather", "nvls", "Simple") == pytest.approx(
        8 * 40 * 0.85 * 7 / 8 * 7 / 8)
    # 2.23-2.27: allreduce min(bwIntra, bwInter) = 40, bus 320, and bus -> algbw x 5/6 (not
    # ranks / steps: tuning.cc of v2.27.3, 'ratio *= 5.0/6.0' for NVLS and NVLS tree).
    old = dataclasses.replace(H100_NVLS, version=(2, 27))
    assert bandwidth_gbps(old, "allreduce", "nvls", "Simple") == pytest.approx(320 * 5 / 6)
    # 2.18 (v2.18.5): NVLS takes bwIntra on <= 2 nodes, no min; NVLS tree x 0.7 n / (2 (n-1)),
    # 0.7 on two nodes; no NVLS allgather (2.19 added it).
    older = dataclasses.replace(H100_NVLS, version=(2, 18))
    assert bandwidth_gbps(older, "allreduce", "nvls", "Simple") == pytest.approx(320 * 5 / 6)
    assert not enabled(older, "allgather", "nvls", "Simple")
    two_2_18 = dataclasses.replace(H100_2N, version=(2, 18), nvls=GraphFigures(8, 40.0, 48.0))
    assert bandwidth_gbps(two_2_18, "allreduce", "nvls_tree", "Simple") == pytest.approx(
        8 * 40.0 * 0.7)
    # and its latency: baseLat 23 plus 2 (nodes - 1) x 19 us of network hops
    assert latency_us(two_2_18, "allreduce", "nvls_tree", "Simple") == pytest.approx(23 + 2 * 19)
    # NVLS tree on 2 nodes: min(59.5 x 2 ... no: intra 59.5, inter 48 x 2 = 96, cap 57.7) = 57.7.
    two = dataclasses.replace(H100_2N, nvls=GraphFigures(8, 40.0, 48.0))
    assert bandwidth_gbps(two, "allreduce", "nvls_tree", "Simple") == pytest.approx(
        8 * 57.7 * 16 / 30)
    # An NVLS graph of one channel has no bandwidth.
    one = dataclasses.replace(H100_NVLS, nvls=GraphFigures(1, 40.0, 80.0))
    assert bandwidth_gbps(one, "allreduce", "nvls", "Simple") == 0.0


def test_pat_bandwidth():
    # PAT: tree graph 2 x 24 = 48 x 0.75 = 36, no bus->alg conversion; 2.23-2.24: x 0.85.
    pat = nccl(ranks=4, nodes=4, channels=2, bw=24.0, comm=4, pat=True)
    assert bandwidth_gbps(pat, "allgather", "pat", "Simple") == pytest.approx(36.0)
    assert bandwidth_gbps(dataclasses.replace(pat, version=(2, 24)), "allgather", "pat",
                          "Simple") == pytest.approx(48 * 0.85)


def test_tree_correction_factor():
    # 64 KiB: log2(65536 >> 6) = 10: factors LL .6, LL128 .6, Simple .6.
    for protocol in PROTOCOLS:
        plain = bandwidth_gbps(H100, "allreduce", "tree", protocol)
        assert algo_time_us(H100, "allreduce", "tree", protocol, 65536).algbw_gbps == \
            pytest.approx(0.6 * plain)
    # 8 B (< 64): no factor; 512 MiB and up (index 23 is never used for Tree): no factor.
    for size in (8, 512 * MiB):
        assert algo_time_us(H100, "allreduce", "tree", "LL", size).algbw_gbps == \
            pytest.approx(bandwidth_gbps(H100, "allreduce", "tree", "LL"))


def test_time_is_latency_plus_size_over_bandwidth():
    # Ring LL, 1 MiB: 15.0 + 1048576 / (1000 x 141 x 8/14) us.
    estimate = algo_time_us(H100, "allreduce", "ring", "LL", MiB)
    assert estimate.time_us == pytest.approx(15.0 + MiB / (1000 * 141 * 8 / 14))
    # Four aggregated calls: the ring pays the latency 4 times, other algorithms once per 8.
    assert algo_time_us(H100, "allreduce", "ring", "LL", MiB, num_pipe_ops=4).time_us == \
        pytest.approx(4 * 15.0 + MiB / (1000 * 141 * 8 / 14))
    tree = algo_time_us(H100, "allreduce", "tree", "LL", MiB, num_pipe_ops=4)
    assert tree.time_us == pytest.approx(tree.latency_us + MiB / (1000 * tree.algbw_gbps))


# -- enable rules -----------------------------------------------------------------------------------


def test_tree_only_for_allreduce():
    for collective in ("allgather", "reduce_scatter", "broadcast", "reduce"):
        assert not any(enabled(H100, collective, "tree", p) for p in PROTOCOLS)
    assert all(enabled(H100, "allreduce", "tree", p) for p in PROTOCOLS)


def test_pat_only_one_gpu_per_node_allgather_reduce_scatter_simple():
    pat = nccl(ranks=4, nodes=4, channels=2, bw=24.0, comm=4, pat=True)
    assert enabled(pat, "allgather", "pat", "Simple") and enabled(pat, "reduce_scatter", "pat",
                                                                  "Simple")
    assert not enabled(pat, "allgather", "pat", "LL") and not enabled(pat, "allreduce", "pat",
                                                                      "Simple")
    assert not enabled(dataclasses.replace(pat, version=(2, 22)), "allgather", "pat", "Simple")
    # The auto rule: PAT only when nodes == ranks.
    facts = MachineFacts("sm90", 90, "nvlink", False, "ib", 4, 1, 1, 50.0, "intel")
    assert setup_from_facts(facts, gpu_gbps=0, path_gbps=0).pat
    eight = dataclasses.replace(facts, ranks_per_node=8, nics_per_node=8)
    assert not setup_from_facts(eight, gpu_gbps=370.8, path_gbps=370.8).pat


def test_nvls_only_sm90_with_nvls_and_nvls_tree_not_on_one_node():
    assert enabled(H100_NVLS, "allreduce", "nvls", "Simple")
    assert not enabled(H100_NVLS, "allreduce", "nvls", "LL")
    assert not enabled(H100_NVLS, "allreduce", "nvls_tree", "Simple")  # one node
    assert not enabled(H100, "allreduce", "nvls", "Simple")  # no NVLS graph
    # Multi-node NVLS needs CollNet (SHARP); NVLS tree does not.
    two = dataclasses.replace(H100_2N, nvls=GraphFigures(8, 40.0, 48.0))
    assert enabled(two, "allreduce", "nvls_tree", "Simple")
    assert not enabled(two, "allreduce", "nvls", "Simple")
    assert enabled(dataclasses.replace(two, collnet=two.ring), "allreduce", "nvls", "Simple")
    # From the facts: an A100 (sm80) gets no NVLS graph even on NVSwitch; an H100 without
    # multicast neither.
    a100 = MachineFacts("sm80", 80, "nvlink", False, "ib", 1, 8, 8, 25.0, "amd", nvswitch=True)
    assert setup_from_facts(a100, gpu_gbps=240, path_gbps=240).nvls is None
    h100 = MachineFacts("sm90", 90, "nvlink", True, "ib", 1, 8, 8, 50.0, "intel", nvswitch=True)
    assert setup_from_facts(h100, gpu_gbps=370.8, path_gbps=370.8).nvls is not None
    assert setup_from_facts(dataclasses.replace(h100, nvls=False), gpu_gbps=370.8,
                            path_gbps=370.8).nvls is None


def test_ll128_rules():
    facts = MachineFacts("sm86", 86, "nvlink", False, None, 1, 4, None, None, None)
    # <= 2.26: only sm70/80/90 (+100/120 from 2.25) have LL128; 2.27+: every sm >= 70 on NVLink.
    assert not setup_from_facts(facts, gpu_gbps=56, path_gbps=56, version=(2, 26)).ll128
    assert setup_from_facts(facts, gpu_gbps=56, path_gbps=56, version=(2, 27)).ll128
    assert not enabled(nccl(ll128=False), "allreduce", "ring", "LL128")
    # RCCL: gfx90a only before 2.28, gfx90a / gfx942 / gfx950 from 2.28.
    mi300 = MachineFacts("gfx942", None, "xgmi", False, "ib", 1, 8, 8, 50.0, "intel")
    assert not setup_from_facts(mi300, gpu_gbps=448, path_gbps=64, version=(2, 22)).ll128
    assert setup_from_facts(mi300, gpu_gbps=448, path_gbps=64, version=(2, 28)).ll128
    mi250 = dataclasses.replace(mi300, arch="gfx90a")
    assert setup_from_facts(mi250, gpu_gbps=350, path_gbps=200, version=(2, 22)).ll128


# -- the choice -------------------------------------------------------------------------------------


def test_fastest_keeps_the_first_of_equal_times():
    a, b, c = (Estimate("tree", "LL", 1, 1, 5.0), Estimate("ring", "LL", 1, 1, 5.0),
               Estimate("ring", "Simple", 1, 1, 4.0))
    assert fastest([a, b]) is a and fastest([b, a]) is b and fastest([a, b, c]) is c


def test_choice_is_the_fastest_estimate():
    for size in (8, 64 * KiB, MiB, 64 * MiB, 4 * GiB):
        choice = choose(H100_NVLS, "allreduce", size)
        times = {(e.algorithm, e.protocol): e.time_us for e in choice.estimates}
        assert choice.time_us == min(times.values())
        assert times[(choice.algorithm, choice.protocol)] == choice.time_us
    # At 8 B ring LL (15.0 us) beats tree LL (15.2) and everything else; at 4 GiB NVLS (272
    # GB/s) beats ring Simple (205.7).
    assert (choose(H100_NVLS, "allreduce", 8).algorithm, choose(H100_NVLS, "allreduce", 8)
            .protocol) == ("ring", "LL")
    assert choose(H100_NVLS, "allreduce", 4 * GiB).algorithm == "nvls"
    assert {(e.algorithm, e.protocol) for e in estimates(H100_NVLS, "allgather", MiB)} == {
        ("ring", "LL"), ("ring", "LL128"), ("ring", "Simple"), ("nvls", "Simple")}


def test_bad_names_and_sizes():
    with pytest.raises(UnknownNameError, match="collective 'alltoall'"):
        choose(H100, "alltoall", 8)
    with pytest.raises(UnknownNameError, match="algorithm 'star'"):
        latency_us(H100, "allreduce", "star", "LL")
    with pytest.raises(InvalidInstanceError, match="size_bytes = -1"):
        choose(H100, "allreduce", -1)
    with pytest.raises(InvalidInstanceError, match="12 ranks on 8 nodes"):
        nccl(ranks=12, nodes=8)


# -- channels, threads, chunks ------------------------------------------------------------------------


def test_max_channels_and_threads():
    # Ring Simple: drop a channel while size < nc x 512 threads x 64 B = nc x 32 KiB: 64 KiB keeps
    # 2 of 24; 64 KiB < 2 x 512 x 64 is false, so 512 threads + 32 (sync warp) = 544.
    assert max_channels(H100, "allreduce", "ring", "Simple", 64 * KiB) == (2, 544)
    # Ring LL: threshold 8 B x 8 ranks = 64: the same 2 channels, 512 threads.
    assert max_channels(H100, "allreduce", "ring", "LL", 64 * KiB) == (2, 512)
    # 768 KiB = 24 x 32 KiB keeps all 24.
    assert max_channels(H100, "allreduce", "ring", "Simple", 768 * KiB) == (24, 544)
    # 8 B: 1 channel; threads halve 512 -> 256 -> 128 -> 64 (not a multiple of 128: stop); 64
    # threads are 2 warps < 3, so 96.
    assert max_channels(H100, "allreduce", "ring", "LL", 8) == (1, 96)
    # Tree always runs 640 threads; NVLS takes the NVLS channel count (16) and 640 threads.
    assert max_channels(H100, "allreduce", "tree", "LL", 8)[1] == 640
    assert max_channels(H100_NVLS, "allreduce", "nvls", "Simple", 8) == (16, 640)


def test_cell_scheduler_channels():
    # 64 KiB allreduce: traffic 2 x 64 KiB = 128 KiB in cells of 16 KiB (32 KiB of traffic each):
    # 4 channels; with LL the traffic is x 4 (512 KiB, cells of 4 KiB): 16 channels.
    assert cell_channels("allreduce", 64 * KiB, 8, "Simple", 24) == 4
    assert cell_channels("allreduce", 64 * KiB, 8, "LL", 24) == 16
    assert cell_channels("allreduce", 64 * KiB, 8, "LL", 8) == 8  # at most the channels given
    # Allgather of 64 KiB total on 8 ranks: 8 KiB per rank, traffic 8 KiB x 8 = 64 KiB: 2.
    assert cell_channels("allgather", 64 * KiB, 8, "Simple", 24) == 2
    # Tiny: one channel.
    assert cell_channels("allreduce", 8, 8, "LL", 24) == 1
    # A whole call: at most nMaxChannels (2 at 64 KiB, above), at 1 GiB all 24.
    assert call_shape(H100, "allreduce", "ring", "Simple", 64 * KiB).channels == 2
    assert call_shape(H100, "allreduce", "ring", "LL", 512 * KiB).channels == 16
    assert call_shape(H100, "allreduce", "ring", "Simple", GiB).channels == 24
    # Before 2.22 there is no cell scheduler: the call runs on nMaxChannels.
    assert call_shape(dataclasses.replace(H100, version=(2, 21)), "allreduce", "ring", "LL",
                      512 * KiB).channels == 16


def test_chunks_and_slices():
    # Ring Simple allreduce: 4 steps of 512 KiB per chunk, 2 per slice; broadcast 1 and 1.
    big = call_shape(H100, "allreduce", "ring", "Simple", GiB)
    assert (big.chunk_bytes, big.slice_bytes) == (2 * MiB, MiB)
    assert call_shape(H100, "broadcast", "ring", "Simple", GiB).chunk_bytes == 512 * KiB
    # LL: 32 KiB of data per step (half of each 16-B line is flags); LL128: 15/16 of 614400.
    assert call_shape(H100, "allreduce", "ring", "LL", MiB).chunk_bytes == 32768
    assert call_shape(H100, "allreduce", "ring", "LL128", GiB).chunk_bytes == 576000
    # Steps: 1 GiB over 24 channels = 44739243 B each; a ring loop moves 8 chunks of 2 MiB:
    # ceil(44739243 / 16 MiB) = 3 loops x 14 steps x 4 chunk steps = 168.
    assert big.steps == 168
    # NVLS: 128 KiB chunks; 1 GiB over 16 channels is 64 MiB each, not < 64 x 8 heads x 128 KiB
    # = 64 MiB, so 128 KiB stays. 16 MiB: 1 MiB each < 64 MiB -> 64 KiB; < 8 x 8 x 64 KiB = 4 MiB
    # -> 32 KiB; not < 2 x 8 x 32 KiB = 512 KiB, so 32 KiB.
    assert call_shape(H100_NVLS, "allreduce", "nvls", "Simple", GiB).chunk_bytes == 128 * KiB
    assert call_shape(H100_NVLS, "allreduce", "nvls", "Simple", 16 * MiB).chunk_bytes == 32768
    # 2 MiB: 128 KiB each, also < 512 KiB -> 16 KiB.
    assert call_shape(H100_NVLS, "allreduce", "nvls", "Simple", 2 * MiB).chunk_bytes == 16384


# -- RCCL ---------------------------------------------------------------------------------------------


def test_rccl_latencies_and_bandwidths():
    mi300 = rccl("gfx942")
    # Base 12 / 12 / 17 us; gfx942 (model 5) ring hops 0.8 / 0.8 / 2.1: LL 12 + 14 x 0.8 = 23.2,
    # Simple 17 + 14 x 2.1 = 46.4.
    assert latency_us(mi300, "allreduce", "ring", "LL") == pytest.approx(23.2)
    assert latency_us(mi300, "allreduce", "ring", "Simple") == pytest.approx(46.4)
    # gfx90a (model 0): ring Simple hop 3.6: 17 + 14 x 3.6 = 67.4; tree LL128 12 + 2 x 7 x 1.4.
    mi250 = rccl("gfx90a")
    assert latency_us(mi250, "allreduce", "ring", "Simple") == pytest.approx(67.4)
    assert latency_us(mi250, "allreduce", "tree", "LL128") == pytest.approx(12 + 14 * 1.4)
    # Bandwidth = channels x bw x bwRatio, then the usual conversion: gfx942 ring LL
    # 16 x 20 x 0.08 x 8/14; gfx90a tree Simple 16 x 20 x 0.91 / 2.
    assert bandwidth_gbps(mi300, "allreduce", "ring", "LL") == pytest.approx(
        16 * 20 * 0.08 * 8 / 14)
    assert bandwidth_gbps(mi250, "allreduce", "tree", "Simple") == pytest.approx(
        16 * 20 * 0.91 / 2)
    # No NVLS, no tree Simple on one gfx942 node, 256 threads.
    assert not enabled(mi300, "allreduce", "tree", "Simple")
    assert enabled(mi250, "allreduce", "tree", "Simple")
    assert not enabled(dataclasses.replace(mi300, nvls=mi300.ring), "allreduce", "nvls",
                       "Simple")
    assert max_channels(mi300, "allreduce", "ring", "Simple", GiB) == (32, 256)


def test_rccl_protocol_ranges():
    two = rccl("gfx942", ranks=16, nodes=2)
    # Allreduce per rank = the size: LL128 for 524288 < size <= 4415057, LL up to 524288.
    assert choose(two, "allreduce", MiB).protocol == "LL128"
    assert choose(two, "allreduce", 256 * KiB).protocol == "LL"
    assert choose(two, "allreduce", 64 * MiB).protocol == "Simple"
    assert choose(two, "allreduce", MiB).rule.startswith("RCCL llProtoRanges (model 5)")
    # More than 2 nodes: the LL128 limit x 3.8 = 16777216.6, so 16 MiB is still LL128.
    four = rccl("gfx942", ranks=32, nodes=4)
    assert choose(four, "allreduce", 16 * MiB).protocol == "LL128"
    # Before 2.28 the ranges do not apply.
    assert choose(dataclasses.replace(two, version=(2, 22)), "allreduce", MiB).rule is None
    # One gfx942 node: reduce-scatter of at most 352128 B per rank runs LL.
    one = rccl("gfx942")
    assert choose(one, "reduce_scatter", 8 * 352128).protocol == "LL"
    # gfx950, one node, allreduce of 64 B - 256 KiB: tree / LL.
    c = choose(rccl("gfx950"), "allreduce", 128 * KiB)
    assert (c.algorithm, c.protocol) == ("tree", "LL")


# -- graph figures from a machine's facts --------------------------------------------------------------


def test_graph_figures_of_one_h100_node():
    # 18 NVLinks x 20.6 = 370.8 GB/s. Ring search: speeds 60, 50, 40, ...; 60 GB/s fits 6
    # channels (360), no slower speed does better: 6 x 60, doubled to 12 x 30; comm = 2 x 12 = 24
    # (a p5.48xlarge's NCCL log says "24 coll channels"). NVLS: 8 heads, each channel takes 2 x
    # speed on its head and 1 x on the 7 others: 9 x speed <= 370.8 -> 40; NVLS channels 16.
    setup = tuning_setup(get_topology("dgx-h100"))
    assert gpu_bandwidth_gbps(get_topology("dgx-h100"), MachineFacts(
        "sm90", 90, "nvlink", True, "ib", 1, 8, 8, 50.0, "intel")) == pytest.approx((370.8, 370.8))
    assert (setup.ring.channels, setup.ring.bw_intra_gbps, setup.comm_channels) == (12, 30.0, 24)
    assert (setup.nvls.channels, setup.nvls.bw_intra_gbps, setup.nvls_channels) == (8, 40.0, 16)
    assert (setup.runtime, setup.version, setup.ll128, setup.pat) == ("nccl", (2, 30), True, False)


def test_graph_figures_other_machines():
    # DGX A100: 12 x 20 = 240 GB/s: 6 x 40 -> 12 x 20, comm 24.
    a100 = tuning_setup(get_topology("dgx-a100"))
    assert (a100.ring.channels, a100.ring.bw_intra_gbps, a100.comm_channels) == (12, 20.0, 24)
    # DGX B200: 18 x 40.1 = 721.8: 8 x 90 -> 16 x 45, comm 32; NVLS 9 x s <= 721.8 -> 80;
    # 24 NVLS channels on one sm100 node.
    b200 = tuning_setup(get_topology("dgx-b200"))
    assert (b200.ring.channels, b200.ring.bw_intra_gbps, b200.comm_channels) == (16, 45.0, 32)
    assert (b200.nvls.bw_intra_gbps, b200.nvls_channels) == (80.0, 24)
    # Two DGX H100: inter speeds 48, 45, ...; 48 fits min(floor(370.8/48) = 7, 8 NICs x 1) = 7
    # channels (336), 45 fits 8 (360): 8 x 45, not doubled (sm90, < 50 GB/s, > 4 channels);
    # comm 16 (45 is not > 45, so no extra doubling).
    two = tuning_setup(compose_nodes(get_topology("dgx-h100"), 2))
    assert (two.ring.channels, two.ring.bw_intra_gbps, two.comm_channels, two.nodes) == (
        8, 45.0, 16, 2)
    # DGX-1: 6 NVLinks, the fattest pair 2 links (40 GB/s): 3 x 40 (120) -> 6 x 20.
    dgx1 = tuning_setup(get_topology("dgx1"))
    assert (dgx1.ring.channels, dgx1.ring.bw_intra_gbps) == (6, 20.0)
    assert tuning_setup(get_topology("mi300x")).runtime == "rccl"


def _nics(node: str, count: int, gbps: float):
    topology = get_topology(node)
    nic = {**topology.metadata["nic"], "count": count, "gbps": gbps,
           "per_gpu": count == topology.num_ranks}
    return dataclasses.replace(topology, metadata={**topology.metadata, "nic": nic})


def test_the_tree_graph_of_two_nodes_runs_faster_inside_the_node():
    # NCCL's search raises a tree's bwIntra one speed at a time, same channels, while it is below
    # twice bwInter and the GPUs' links hold it. Two DGX A100 (8 NICs x 25 GB/s): ring 8 x 24
    # (24 fits min(floor(240 / 24), 8 x 1) = 8); the tree goes 24 -> 28 (8 x 28 = 224 <= 240)
    # -> 30 (240) and stops before 48 (384 > 240).
    two = tuning_setup(compose_nodes(get_topology("dgx-a100"), 2))
    assert (two.ring.channels, two.ring.bw_intra_gbps, two.ring.bw_inter_gbps) == (8, 24, 24)
    assert (two.tree.channels, two.tree.bw_intra_gbps, two.tree.bw_inter_gbps) == (8, 30, 24)
    # p4d-like: 4 NICs x 12.5 GB/s: ring 4 x 12; the tree climbs 15, 18, 20, 24 = 2 x 12.
    p4d = tuning_setup(compose_nodes(_nics("dgx-a100", 4, 12.5), 2))
    assert (p4d.ring.channels, p4d.ring.bw_intra_gbps) == (4, 12)
    assert (p4d.tree.bw_intra_gbps, p4d.tree.bw_inter_gbps) == (24, 12)
    # So NCCL's model runs the tree at 2 GiB: tree Simple busBw min(0.92 x 4 x 24, 4 x 23.6)
    # = 88.32, algbw 44.16 GB/s; LL128 min(90, 4 x 20) / 2 = 40; the ring 4 x 12 x 16/30 = 25.6.
    c = choose(p4d, "allreduce", 2 * GiB)
    assert (c.algorithm, c.protocol) == ("tree", "Simple")
    assert bandwidth_gbps(p4d, "allreduce", "tree", "Simple") == pytest.approx(44.16)
    # One node, more than two nodes, and a tree already at the GPUs' links keep the ring's.
    one = tuning_setup(get_topology("dgx-a100"))
    assert one.tree == one.ring
    four = tuning_setup(compose_nodes(get_topology("dgx-a100"), 4))
    assert four.tree == four.ring
    h100 = tuning_setup(compose_nodes(get_topology("dgx-h100"), 2))
    assert h100.tree.bw_intra_gbps == 45  # 8 x 48 = 384 > 370.8


def test_rccl_channels_on_several_nodes():
    # RCCL runs 64 channels across nodes on MI300-class GPUs (the MI300X rome model with NICs
    # lists 64 rings, RCCL's multi-node ceiling), 48 on MI350X/MI355X from RCCL 2.30.4; one node
    # keeps the search's figure (MI300X: 22 x 20 -> comm 44), and NCCL is unaffected.
    def comm(name: str, nodes: int, version: tuple[int, int] | None = None) -> int:
        topology = get_topology(name)
        if nodes > 1:
            topology = compose_nodes(topology, nodes)
        return tuning_setup(topology, version=version).comm_channels

    assert comm("mi300x", 1) == 44
    assert comm("mi300x", 2) == comm("mi300x", 4) == 64
    assert comm("mi355x", 2, (2, 28)) == 64
    assert comm("mi355x", 2, (2, 30)) == 48
    assert comm("dgx-h100", 2) == 16


def test_setups_refused():
    with pytest.raises(InvalidInstanceError, match="no NCCL/RCCL tuning applies"):
        tuning_setup(get_topology("trn2"))
    with pytest.raises(InvalidInstanceError, match="the NICs per node and their GB/s are needed"):
        setup_from_facts(MachineFacts("sm90", 90, "nvlink", True, None, 2, 8, None, None, None),
                         gpu_gbps=370.8, path_gbps=370.8)
    with pytest.raises(UnknownNameError, match="runtime 'mpi'"):
        dataclasses.replace(H100, runtime="mpi")


def test_nccl_step_geometry_matches_the_source_constants():
    # NCCL src/include/device.h: LL 8 lines x 512 threads x 16 B, LL128 120 elements x 640
    # threads x 8 B, Simple NCCL_BUFFSIZE 4 MiB, each over NCCL_STEPS = 8 slots; LL carries 8 data
    # bytes per 16-byte line, LL128 120 of 128.
    from collsynth.timing import tuning_model
    assert dict(tuning_model._NCCL_STEP_BYTES) == {"LL": 65536, "LL128": 614400, "Simple": 524288}
    assert tuning_model._NCCL_STEP_DATA == {"LL": 32768, "LL128": 576000, "Simple": 524288}
