"""Mutation round 10: NCCL's and RCCL's tuning model (collsynth.timing.tuning_model).

Each test kills a mutant the earlier suites let live. Every expected figure is worked out by
hand in the comment next to it from the runtime's source text (NCCL's src/graph/tuning.cc,
src/graph/search.cc, src/graph/connect.cc, src/enqueue.cc and src/transport/nvls.cc at the tags
named; RCCL's projects/rccl/src/graph/tuning.cc of ROCm/rocm-systems, commit a4cd444, and its
rcclUpdateCollectiveProtocol / rcclOverrideChannels / rcclUpdateThreadThreshold), never from the
code's output.
"""

from __future__ import annotations

import dataclasses

import pytest

from collsynth.timing.tuning_model import (
    GraphFigures,
    _dup,
    bandwidth_gbps,
    call_cap_gbps,
    call_shape,
    choose,
    connection_gbps,
    enabled,
    latency_us,
    max_channels,
    setup_from_facts,
)
from collsynth.topology.machine import MachineFacts
from tests.timing.test_tuning_model import H100, H100_NVLS, nccl, rccl

# -- NVLS bandwidth before 2.28 (a bug this round found) ------------------------------------------


def test_nvls_allgather_takes_the_plain_min_before_nccl_2_27():
    # v2.19.4 .. v2.26.6 tuning.cc: "if (a == NCCL_ALGO_NVLS) bw = std::min(graphs[a]->bwIntra,
    # graphs[a]->bwInter)" for every collective; v2.27.3 adds, for allgather / reduce-scatter,
    # "bw = std::min(bwIntra * (ppn - 1.0f) / ppn, bwInter * 0.9f)". One node, NVLS graph of 8
    # channels at 40 / 80 GB/s: 2.26: 8 x min(40, 80) = 320; 2.27: 8 x min(40 x 7/8 = 35,
    # 80 x 0.9 = 72) = 280. Allgather's bus bandwidth is not converted (only the ring's is).
    def bw(version):
        return bandwidth_gbps(dataclasses.replace(H100_NVLS, version=version), "allgather",
                              "nvls", "Simple")

    assert bw((2, 23)) == pytest.approx(320.0)
    assert bw((2, 26)) == pytest.approx(320.0)
    assert bw((2, 27)) == pytest.approx(280.0)
    # 2.27 with a network figure of 36: min(35, 0.9 x 36 = 32.4) = 32.4 a channel, 259.2.
    low = dataclasses.replace(H100_NVLS, version=(2, 27), nvls=GraphFigures(8, 40.0, 36.0))
    assert bandwidth_gbps(low, "allgather", "nvls", "Simple") == pytest.approx(259.2)


@pytest.mark.parametrize("version", [(2, 19), (2, 22), (2, 23), (2, 27)])
def test_nvls_tree_halves_the_network_figure_beyond_two_nodes_from_nccl_2_19(version):
    # v2.19.4 .. v2.27.7 tuning.cc: "if (a == NCCL_ALGO_NVLS_TREE) bw = std::min(bwIntra,
    # nNodes <= 2 ? bwInter : bwInter/2)". Four nodes, NVLS graph 8 x (40 intra, 48 inter):
    # min(40, 24) = 24, bus 8 x 24 = 192, and "ratio *= 5.0/6.0" for NVLS tree: 160.
    setup = nccl(ranks=32, nodes=4, channels=8, bw=45.0, comm=16, version=version,
                 nvls=GraphFigures(8, 40.0, 48.0))
    assert bandwidth_gbps(setup, "allreduce", "nvls_tree", "Simple") == pytest.approx(160.0)
    # Two nodes keep the whole network figure: min(40, 48) = 40, 8 x 40 x 5/6.
    two = dataclasses.replace(setup, ranks=16, nodes=2)
    assert bandwidth_gbps(two, "allreduce", "nvls_tree", "Simple") == pytest.approx(320 * 5 / 6)


# -- version gates ---------------------------------------------------------------------------------


def test_the_cell_scheduler_starts_at_nccl_2_22():
    # v2.21.5 enqueue.cc has no cell scheduler: getChannnelThreadInfo sets NVLS's nChannels to
    # comm->nvlsChannels and a ring / tree call's by its thread loop, and the CBD scheduler
    # spreads one call over them (maxBytesPerChannel = the call / usableChannels, each share
    # rounded up to NCCL_SIMPLE_ALIGNMENT = 4096 B). Tree / Simple 1 MiB on one H100 node: 1 MiB
    # is not below 24 x 512 x 64 = 786432, so 24 channels; shares of 43696 B round up to
    # 45056 B, and 23 x 45056 = 1036288 leaves 12288 B for the 24th: 24 channels.
    assert call_shape(dataclasses.replace(H100, version=(2, 21)), "allreduce", "tree", "Simple",
                      1 << 20).channels == 24
    # v2.22.3 scheduleCollTasksToPlan: trafficPerChannel = max(MinTrafficPerChannel = 512,
    # traffic / nChannels), cells of 16 B. An NVLS allreduce of 256 B (traffic 2 x 256 = 512 over
    # 16 NVLS channels): trafficPerChannel 512, 16 cells of 32 B of traffic each fit the first
    # channel (cellsLo = 512 / 32 = 16 = all cells): 1 channel, not the 16 NVLS channels.
    assert call_shape(dataclasses.replace(H100_NVLS, version=(2, 22)), "allreduce", "nvls",
                      "Simple", 256).channels == 1


B200 = MachineFacts("sm100", 100, "nvlink", True, "ib", 1, 8, 8, 50.0, "intel", nvswitch=True)


def _b200(version):
    return setup_from_facts(B200, gpu_gbps=18 * 40.1, path_gbps=18 * 40.1, version=version)


def test_one_blackwell_node_runs_24_nvls_channels_from_nccl_2_27():
    # src/transport/nvls.cc: v2.24.3 NCCL_NVLS_NCHANNELS 16 for every GPU; v2.25.1 and v2.26.6
    # NVLS_NCHANNELS_SM100 = 32 for compCap >= 100; v2.27.3 NVLS_NCHANNELS_SM100_NVL = 24 when
    # the communicator is one node (multiNode false), 32 across nodes.
    assert [_b200(v).nvls_channels for v in ((2, 24), (2, 25), (2, 26), (2, 27))] == [
        16, 32, 32, 24]


def test_ll128_on_blackwell_from_nccl_2_25():
    # tuning.cc LL128 default: v2.24.3 "switch (minCompCap) case 70, 80, 90 ... default:
    # pEnable &= 0"; v2.25.1 adds "case 100: pEnable &= 1; case 120: pEnable &= 1".
    assert not _b200((2, 24)).ll128
    assert _b200((2, 25)).ll128


def test_nvls_bus_to_algorithm_ratio_is_ranks_over_steps_from_nccl_2_28():
    # v2.28.3 tuning.cc: "if (a == RING || a == NVLS || a == NVLS_TREE) ratio *= nRanks /
    # nsteps"; NVLS bw = min(bwIntra x nvlsEfficiency 0.85 x 7/8 x 2 (allreduce) = 59.5, 80):
    # bus 8 x 59.5 = 476, algbw 476 x 8/14 = 272 at 2.28 itself (v2.27.7: x 5/6).
    setup = dataclasses.replace(H100_NVLS, version=(2, 28))
    assert bandwidth_gbps(setup, "allreduce", "nvls", "Simple") == pytest.approx(272.0)


def test_an_nvls_graph_of_one_channel_has_bandwidth_before_nccl_2_28():
    # v2.28.3 tuning.cc: intraBw = bwIntra x nvlsEfficiency x (nChannels - 1) / nChannels, 0 on
    # one channel; v2.27.3: bw = min(bwIntra, bwInter) = 40, bus = nChannels x bw = 40, algbw
    # x 5/6 (NVLS's ratio before 2.28).
    one = dataclasses.replace(H100_NVLS, nvls=GraphFigures(1, 40.0, 80.0))
    assert bandwidth_gbps(dataclasses.replace(one, version=(2, 28)), "allreduce", "nvls",
                          "Simple") == 0.0
    assert bandwidth_gbps(dataclasses.replace(one, version=(2, 27)), "allreduce", "nvls",
                          "Simple") == pytest.approx(40 * 5 / 6)


def test_pat_is_offered_from_nccl_2_23():
    # v2.22.3 tuning.cc has no NCCL_ALGO_PAT; v2.23.4 has it ("if (a == NCCL_ALGO_PAT) busBw *=
    # .85"). One GPU on each of 4 nodes, tree graph 2 x 24: bus 48 x 0.85 = 40.8, allgather
    # not converted.
    pat = nccl(ranks=4, nodes=4, channels=2, bw=24.0, comm=4, pat=True, version=(2, 23))
    assert enabled(pat, "allgather", "pat", "Simple")
    assert bandwidth_gbps(pat, "allgather", "pat", "Simple") == pytest.approx(40.8)


# -- ncclTopoDupChannels and the communicator's channels -------------------------------------------


@pytest.mark.parametrize("channels, bw, cc, expected", [
    (8, 25.0, 70, (16, 12.5)),   # "if (graph->bwIntra < 25.0) return": 25 is duplicated
    (8, 24.9, 70, (8, 24.9)),
    (8, 40.0, 80, (16, 20.0)),   # "ccMin > 80 && bwIntra < 50.0 && nChannels > 4": not sm80
    (8, 40.0, 90, (8, 40.0)),
    (8, 50.0, 90, (16, 25.0)),   # 50 is not below 50
    (4, 40.0, 90, (8, 20.0)),    # 4 channels are not more than 4
    (5, 40.0, 90, (5, 40.0)),
    (20, 30.0, 70, (32, 15.0)),  # min(2 x 20, maxChannels 32); bw / DIVUP(32, 20) = / 2
    (32, 30.0, 70, (32, 30.0)),  # already at maxChannels: DIVUP(32, 32) = 1, bw kept
])
def test_dup_channels_thresholds(channels, bw, cc, expected):
    # v2.30.7 src/graph/search.cc ncclTopoDupChannels; the ring's maxChannels is MAXCHANNELS / 2
    # = 32 (src/init.cc).
    assert _dup(channels, bw, cc) == expected


def _two_h100_nodes(nics: int, nic_gbps: float, gpu_gbps: float = 370.8):
    facts = MachineFacts("sm90", 90, "nvlink", True, "ib", 2, 8, nics, nic_gbps, "intel",
                         nvswitch=True)
    return setup_from_facts(facts, gpu_gbps=gpu_gbps, path_gbps=gpu_gbps)


def test_hopper_across_nodes_doubles_fewer_than_16_channels_above_45_gbps():
    # v2.30.7 src/graph/connect.cc: "if (minCompCap >= 90 && nNodes > 1 && ring bwIntra > 45.0
    # && nChannels < 16)" double, after ncclTopoPostset's x 2.
    # 6 NICs of 50 GB/s: speeds (sm90 inter) 48 -> min(floor(370.8 / 48) = 7, 6 x 1) = 6
    # channels (288; 45 x 6 = 270, 24 x 12 and 12 x 24 only tie); not duplicated (sm90, < 50,
    # 6 > 4); comm 2 x 6 = 12 < 16 and 48 > 45: 24.
    six = _two_h100_nodes(6, 50.0)
    assert (six.ring.channels, six.ring.bw_intra_gbps, six.comm_channels) == (6, 48.0, 24)
    # NICs of 47 GB/s: 48 does not fit, 45 x 6 = 270 wins; 45 is not above 45: comm stays 12.
    at_45 = _two_h100_nodes(6, 47.0)
    assert (at_45.ring.channels, at_45.ring.bw_intra_gbps, at_45.comm_channels) == (6, 45.0, 12)
    # 8 NICs, GPUs of 400 GB/s: 48 x min(8, 8) = 384 > 45 x 8; comm 16 is not below 16.
    eight = _two_h100_nodes(8, 50.0, gpu_gbps=400.0)
    assert (eight.ring.channels, eight.ring.bw_intra_gbps, eight.comm_channels) == (8, 48.0, 16)


# -- per-connection and per-call caps --------------------------------------------------------------


def test_an_ll128_connection_is_capped_by_the_per_channel_ring_ll128_figure():
    # tuning.cc: ring LL128 busBw = min(0.92 x nChannels x bw, nChannels x perChMaxRingLL128Bw
    # (Hopper 36.7)), spread over the communicator's 12 channels: 6 channels of 60 GB/s:
    # min(0.92 x 360 = 331.2, 6 x 36.7 = 220.2) / 12 = 18.35 GB/s a connection.
    setup = nccl(channels=6, bw=60.0, comm=12)
    assert connection_gbps(setup, "ring", "LL128") == pytest.approx(18.35)


def test_the_tree_ll_call_is_capped_by_ll_max_bw():
    # tuning.cc: "if (a == NCCL_ALGO_TREE && p == NCCL_PROTO_LL) busBw = std::min(busBw*1.0/3.8,
    # llMaxBw)": llMaxBws Hopper one node 141.0; two nodes on AMD hosts row 1, column 1: 22.5.
    assert call_cap_gbps(H100, "tree", "LL") == 141.0
    amd = nccl(ranks=16, nodes=2, channels=8, bw=45.0, comm=16, cpu="amd")
    assert call_cap_gbps(amd, "tree", "LL") == 22.5


# -- RCCL: the tuning models of projects/rccl/src/graph/tuning.cc (ROCm/rocm-systems a4cd444) and
# RCCL's rcclUpdateCollectiveProtocol, rcclOverrideChannels and rcclUpdateThreadThreshold ---------


def test_rccl_gfx950_uses_tuning_model_6_whose_latencies_and_ratios_are_model_5s():
    # tuning_model_6 has the same hwLat and bwRatio as tuning_model_5: ring NVLink LL hop 0.8
    # (12 + 14 x 0.8 = 23.2 on 8 ranks); tree Simple bwRatio beyond 2 nodes 0.59: 16 channels x
    # 20 GB/s x 0.59 x 0.5 = 94.4 (model 0 has 0.95).
    assert latency_us(rccl("gfx950"), "allreduce", "ring", "LL") == pytest.approx(23.2)
    three = rccl("gfx950", ranks=24, nodes=3)
    assert bandwidth_gbps(three, "allreduce", "tree", "Simple") == pytest.approx(94.4)


@pytest.mark.parametrize("per_rank, protocol", [
    (65536, "LL"), (65552, "LL128"), (8388608, "LL128"), (8388624, "Simple")])
def test_rccl_gfx950_allgather_protocol_ranges_across_nodes(per_rank, protocol):
    # tuning_model_6 llProtoRanges AllGather: LL {0, 65536}, LL128 {65536, 8388608};
    # rcclUpdateCollectiveProtocol: LL when llMin < sizePerRank <= llMax, then LL128 when
    # ll128Min < sizePerRank <= ll128Max (gfx950 has LL128). 16 ranks on 2 nodes.
    setup = rccl("gfx950", ranks=16, nodes=2)
    assert choose(setup, "allgather", 16 * per_rank).protocol == protocol


def test_rccl_gfx950_one_node_allgather_and_reduce_scatter_run_ll():
    # rcclUpdateCollectiveProtocol: gfx950, one node: allgather with sizePerRank <= 88448 and
    # reduce-scatter with sizePerRank <= 1048576 run LL. 8 ranks.
    one = rccl("gfx950")
    assert choose(one, "allgather", 8 * 88448).protocol == "LL"
    assert choose(one, "allgather", 8 * 88464).protocol != "LL"
    assert choose(one, "reduce_scatter", 8 * 1048576).protocol == "LL"
    assert choose(one, "reduce_scatter", 8 * 1048592).protocol != "LL"


def test_rccl_gfx950_allgather_channels_across_nodes_by_bytes_per_rank():
    # rcclOverrideChannels: bytesPerRank = divUp(nBytes, nRanks), the first entry with
    # min < bytesPerRank <= max sets the channels; tuning_model_6 AllGather {2048, 4096, 2},
    # {4096, 8192, 4}. 16 ranks on 2 nodes: 65536 B -> 4096 per rank -> 2 channels;
    # 65537 B -> divUp = 4097 -> 4.
    setup = rccl("gfx950", ranks=16, nodes=2)
    assert max_channels(setup, "allgather", "ring", "Simple", 65536)[0] == 2
    assert max_channels(setup, "allgather", "ring", "Simple", 65537)[0] == 4


def test_rccl_multi_node_reduce_scatter_thread_threshold_scales_with_the_ranks():
    # rcclUpdateThreadThreshold: several nodes, reduce-scatter / allgather: threadThreshold =
    # llProtoRanges[coll][protocol][thread_threshold] x nRanks; for Simple the index runs past
    # the collective's two entries into the next one's LL entry (reduce-scatter -> allgather's
    # LL: 16). gfx942 on 2 nodes of 8, 32 channels x 256 threads: threshold 16 x 16 = 256,
    # 1 MiB < 32 x 256 x 256 = 2 MiB, so RCCL's one step cuts the channels to
    # 1 MiB / (256 x 256) = 16 (NCCL's 64 B a thread would keep all 32).
    setup = rccl("gfx942", ranks=16, nodes=2)
    assert max_channels(setup, "reduce_scatter", "ring", "Simple", 1 << 20) == (16, 256)
