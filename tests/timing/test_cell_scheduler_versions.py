"""How NCCL spreads one call over its channels, by version, and RCCL's multi-node thread threshold.

Every expected figure is worked out by hand in the comment next to it from the runtime's source
text, never from the code under test:

* NCCL ``src/enqueue.cc`` of the bare mirror (``git -C /work/.mirror/NVIDIA+nccl/repo show
  TAG:src/enqueue.cc``): ``scheduleCollTasksToPlan`` at v2.22.3-1 (lines 614-690), v2.23.4-1
  (723-820), v2.26.2-1 (497-600, LL x 4 at 388 and 568), v2.28.3-1 (512-615) and v2.29.2-1
  (576-680); the channel-by-data (CBD) scheduler of v2.20.3-1 / v2.21.5-1
  (``scheduleCollTasksToPlan`` 747-868, ``addCBDCollToPlan`` 431-500, ``computeCollAlignCount``
  214-223; ``NCCL_SIMPLE_ALIGNMENT`` = WARP_SIZE x 8 x 16 = 4096 B in src/include/enqueue.h:17);
  v2.19.4-1 (``scheduleCollTasksToPlan`` 470-580: one call runs on ``info.nChannels``).
* RCCL: ``scheduleCollTasksToPlan`` in projects/rccl/src/enqueue.cc of ROCm/rocm-systems
  (commit 005e1bb); ``rcclUpdateThreadThreshold`` in projects/rccl/src/rccl_wrap.cc and the tuning models'
  ``llProtoRanges`` in projects/rccl/src/graph/tuning.cc of ROCm/rocm-systems (commit 03a8914);
  ``RCCL_LL_LIMITS_UNDEFINED 0``, ``RCCL_PROTOCOL_ENTRY_SIZE 4``,
  ``RCCL_PROTOCOL_THREAD_THRESHOLD_IDX 3`` and the tunable order RS, AG, AR, Reduce, Broadcast
  in projects/rccl/src/include/rccl_common.h.
"""

from __future__ import annotations

import dataclasses

import pytest

from collsynth.timing.tuning_model import (
    GraphFigures,
    call_shape,
    cell_channels,
    max_channels,
    scheduled_channels,
)
from tests.timing.test_tuning_model import nccl, rccl

KiB = 1024

# -- the cell scheduler's minimum traffic per channel, by version ---------------------------------


@pytest.mark.parametrize(("version", "channels"), [((2, 22), 16), ((2, 23), 8), ((2, 26), 8),
                                                   ((2, 28), 8), ((2, 29), 4), ((2, 30), 4)])
def test_nvls_allreduce_64k_spreads_by_the_versions_minimum_traffic(version, channels):
    # One 64 KiB allreduce on 16 NVLS channels (trafficPerByte 2: 128 KiB of traffic).
    # v2.22.3-1:614 MinTrafficPerChannel = 512, :626 trafficPerChannel = max(512, 131072 / 16)
    #   = 8192; :657 cellSize = 16: 4096 cells of 32 B traffic, :663 cellsPerChannel =
    #   min(4096, divUp(8192, 32)) = 256, :668 cellsLo = min(4096, 8192 / 32) = 256: 1 + 15
    #   channels -> 16.
    # v2.23.4-1:723 (and v2.26.2-1:497, v2.28.3-1:512) MinTrafficPerChannel = 16 << 10:
    #   trafficPerChannel = max(16384, 131072 / 16) = 16384; :790 cellSize = roundup16(16384 / 2)
    #   = 8192: 8 cells of 16384 B traffic, one a channel -> 8.
    # v2.29.2-1:576 MinTrafficPerChannel = 32 << 10, :609 trafficPerChannel = divUp(131072 / 16,
    #   16) x 16 = 8192; :648 cellSize = 16384: 4 cells of 32768 B, one a channel -> 4.
    assert cell_channels("allreduce", 64 * KiB, 8, "Simple", 16, version=version) == channels


@pytest.mark.parametrize(("version", "channels"), [((2, 23), 8), ((2, 25), 8), ((2, 26), 16),
                                                   ((2, 30), 16)])
def test_ll_counts_four_times_the_traffic_only_from_2_26(version, channels):
    # 64 KiB allreduce by LL on 24 channels. v2.23.4-1 / v2.25.1-1: no LL factor: traffic
    # 131072, trafficPerChannel = max(16384, 131072 / 24) = 16384, cellSize = 8192: 8 cells of
    # 16384 B, one a channel -> 8. v2.26.2-1:388 "if (aggBeg->protocol == NCCL_PROTO_LL)
    # aggBeg->trafficBytes *= 4" and :568 "trafficPerByte *= 4": traffic 524288,
    # trafficPerChannel = max(16384, 524288 / 24 = 21845) = 21845, cellSize = roundup16(16384 / 8)
    # = 2048: 32 cells of 16384 B, cellsPerChannel = divUp(21845, 16384) = 2 -> 16 channels.
    # v2.30: trafficPerChannel = divUp(524288 / 24, 16) x 16 = 21856, cellSize 4096: 16 cells of
    # 32768 B, one a channel -> 16.
    assert cell_channels("allreduce", 64 * KiB, 8, "LL", 24, version=version) == channels


def test_2_22_takes_16_byte_cells_and_a_floored_first_channel():
    # v2.22.3-1, 64 KiB allreduce by LL on 24 channels (no LL factor yet): trafficPerChannel =
    # max(512, 131072 / 24) = 5461; 4096 cells of 32 B; cellsPerChannel = divUp(5461, 32) = 171;
    # :668 cellsLo = min(4096, 5461 / 32) = 170 (floored); nMid = 3926 / 171 = 22, cellsHi =
    # 3926 % 171 = 164: 1 + 22 + 1 = 24 channels, not more than 24 -> 24.
    assert cell_channels("allreduce", 64 * KiB, 8, "LL", 24, version=(2, 22)) == 24
    # 4 KiB allgather on 8 ranks (trafficPerByte 8, 512 B a rank): traffic 4096,
    # trafficPerChannel = max(512, 4096 / 24 = 170) = 512; 32 cells of 16 B = 128 B traffic;
    # cellsPerChannel = divUp(512, 128) = 4, cellsLo = 512 / 128 = 4: 32 / 4 = 8 channels.
    assert cell_channels("allgather", 4 * KiB, 8, "Simple", 24, version=(2, 22)) == 8


def test_the_newest_rule_without_a_version():
    # Backward compatible: no version means the newest NCCL (2.29+): the 64 KiB case above -> 4.
    assert cell_channels("allreduce", 64 * KiB, 8, "Simple", 16) == 4


def test_call_shape_reads_the_setups_version_for_nvls():
    # The brief's case: an NVLS allreduce of 64 KiB on one H100 node (16 NVLS channels, NVLS
    # takes comm->nvlsChannels whatever the size): 16 channels at 2.22, 8 at 2.23, 4 at 2.30.
    setup = nccl(nvls=GraphFigures(8, 40.0, 80.0))
    used = {v: call_shape(dataclasses.replace(setup, version=v), "allreduce", "nvls", "Simple",
                          64 * KiB).channels for v in ((2, 22), (2, 23), (2, 30))}
    assert used == {(2, 22): 16, (2, 23): 8, (2, 30): 4}


# -- the channel-by-data scheduler of 2.20 and 2.21 -----------------------------------------------


def test_cbd_rounds_each_channels_share_up_to_4096_bytes_for_simple():
    # v2.21.5-1 scheduleCollTasksToPlan: one call: usableChannels = min(nvlsChannels, its
    # nChannels) = 16; :834 maxBytesPerChannel = divUp(divUp(32768, 16), 16) x 16 = 2048;
    # addCBDCollToPlan :469 workCount = divUp(2048 B, alignCount) x alignCount with alignCount =
    # NCCL_SIMPLE_ALIGNMENT / typeSize = 4096 B: 4096 B a channel, so 32 KiB fills 8 channels.
    # v2.19.4-1 runs one call on info.nChannels: 16.
    setup = nccl(nvls=GraphFigures(8, 40.0, 80.0))
    used = {v: call_shape(dataclasses.replace(setup, version=v), "allreduce", "nvls", "Simple",
                          32 * KiB).channels for v in ((2, 19), (2, 20), (2, 21))}
    assert used == {(2, 19): 16, (2, 20): 8, (2, 21): 8}


def test_cbd_can_drop_a_ring_channel_at_large_per_channel_shares():
    # Ring Simple allreduce of 800 KiB on 24 channels: 819200 >= 24 x 512 x 64, so nc stays 24.
    # maxBytesPerChannel = roundup16(divUp(819200, 24) = 34134) = 34144, rounded up to 4096:
    # 36864 B a channel; divUp(819200, 36864) = 23 channels (2.19: all 24).
    setup = nccl(version=(2, 21))
    shape = call_shape(setup, "allreduce", "ring", "Simple", 800 * KiB)
    assert (shape.max_channels, shape.channels) == (24, 23)
    assert call_shape(dataclasses.replace(setup, version=(2, 19)), "allreduce", "ring", "Simple",
                      800 * KiB).channels == 24


def test_cbd_aligns_ll_and_ll128_by_their_threads():
    # computeCollAlignCount (v2.21.5-1:214-223): LL alignCount = NCCL_LL_ALIGNMENT_PER_THREAD
    # (8 B) / typeSize x nThreads; LL128 = NCCL_LL128_ALIGNMENT_PER_WARP (480 B) / typeSize x
    # nThreads / 32. Ring allreduce of 800 KiB on 8 ranks, 24 channels:
    # LL: threshold 8 x 8 = 64 B a thread, 819200 >= 24 x 512 x 64: nc 24, nt 512, align
    #   4096 B; maxBytesPerChannel = roundup16(divUp(819200, 24)) = 34144 -> 36864: 23 channels.
    # LL128: threshold 8, 819200 >= 24 x 640 x 8: nc 24, nt 640, align 480 x 20 = 9600 B;
    #   34144 -> 38400 B a channel: divUp(819200, 38400) = 22 channels.
    setup = nccl(version=(2, 21))
    ll = call_shape(setup, "allreduce", "ring", "LL", 800 * KiB)
    ll128 = call_shape(setup, "allreduce", "ring", "LL128", 800 * KiB)
    assert (ll.max_channels, ll.threads, ll.channels) == (24, 512, 23)
    assert (ll128.max_channels, ll128.threads, ll128.channels) == (24, 640, 22)


def test_collnet_kinds_run_on_all_their_channels():
    # NVLS across nodes is a CollNet kind: v2.30.7-1 enqueue.cc:448-449 "isCollnet =
    # agg.algorithm == NCCL_ALGO_NVLS && comm->nNodes > 1", and :624-625 "if (task->isCollnet)
    # { int nChannels = task->nMaxChannels;": no cells. (v2.21.5-1:811-815 sends it to the
    # collnetQueue, addCollnetCollToPlan :271 nChannels = min(nChannels, usableChannels).)
    # 64 KiB allreduce, 2 nodes, 16 NVLS channels within 24: all 16 (cells would give 4).
    setup = nccl(ranks=16, nodes=2, nvls=GraphFigures(8, 40.0, 80.0))
    for version in ((2, 21), (2, 22), (2, 30)):
        shape = call_shape(dataclasses.replace(setup, version=version), "allreduce", "nvls",
                           "Simple", 64 * KiB)
        assert (shape.max_channels, shape.channels) == (16, 16)


def test_rccl_spreads_by_its_16_kib_rule():
    # projects/rccl/src/enqueue.cc of ROCm/rocm-systems (commit 005e1bb) scheduleCollTasksToPlan:
    # "constexpr size_t MinTrafficPerChannel = 16 << 10", trafficPerChannel = max(16384,
    # trafficBytes / nChannels), "if (task->protocol == NCCL_PROTO_LL) trafficPerByte *= 4".
    # 64 KiB allreduce on 16 channels: max(16384, 131072 / 16) = 16384, cellSize 8192: 8 cells
    # of 16384 B, one a channel -> 8 (NCCL 2.29's 32 KiB rule would give 4), at 2.28 and 2.31.
    for version in ((2, 28), (2, 31)):
        setup = rccl("gfx942", version=version)
        assert scheduled_channels(setup, "allreduce", "ring", "Simple", 64 * KiB, 16,
                                  threads=256) == 8


# -- RCCL: the Simple thread threshold across nodes ------------------------------------------------


def test_rccl_allgather_simple_keeps_the_default_thread_threshold_across_nodes():
    # rcclUpdateThreadThreshold: tunedThreshold = comm->minMaxLLRange[AG=1][SIMPLE=2][3]; the
    # array is [5][2][4] (llProtoRanges memcpy'd in ncclTopoTuneModel), so [1][2][3] is flat
    # 1 x 8 + 2 x 4 + 3 = 19 = [2][0][3]: allreduce's LL thread_threshold, 0 in tuning_model_5
    # ({0, 524288, 1, 0}) = RCCL_LL_LIMITS_UNDEFINED, so threadThreshold keeps its default.
    # gfx942 on 2 nodes of 8, 32 channels x 256 threads: 1 MiB >= 32 x 256 x 64, all 32 stay
    # (16 x 16 = 256 B a thread would cut them to 16).
    setup = rccl("gfx942", ranks=16, nodes=2)
    assert max_channels(setup, "allgather", "ring", "Simple", 1 << 20) == (32, 256)
    # Reduce-scatter's [0][2][3] = [1][0][3]: allgather's LL thread_threshold 16 -> 16 x 16 = 256.
    assert max_channels(setup, "reduce_scatter", "ring", "Simple", 1 << 20) == (16, 256)
