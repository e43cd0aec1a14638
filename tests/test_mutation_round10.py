"""Mutation round 10: NCCL's and RCCL's tuning model (collsynth.timing.tuning_model).

Each test kills a mutant the earlier suites let live. Every expected figure is worked out by
hand in the comment next to it from the runtime's source text (NCCL's src/graph/tuning.cc,
src/graph/search.cc, src/graph/connect.cc, src/enqueue.cc and src/transport/nvls.cc at the tags
named; RCCL's src/graph/tuning.cc and src/enqueue.cc of ROCm/rocm-systems projects/rccl, commit
a4cd444), never from the code's output.
"""

from __future__ import annotations

import dataclasses

import pytest

from collsynth.timing.tuning_model import GraphFigures, bandwidth_gbps
from tests.timing.test_tuning_model import H100_NVLS, nccl

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


@pytest.mark.parametrize("version", [(2, 19), (2, 22), (2, 23), (2, 27)])
def test_nvls_tree_halves_the_network_figure_beyond_two_nodes_from_nccl_2_19(version):
    # v2.19.4 .. v2.27.7 tuning.cc: "if (a == NCCL_ALGO_NVLS_TREE) bw = std::min(bwIntra,
    # nNodes <= 2 ? bwInter : bwInter/2)". Four nodes, NVLS graph 8 x (40 intra, 48 inter):
    # min(40, 24) = 24, bus 8 x 24 = 192, and "ratio *= 5.0/6.0" for NVLS tree: 160.
    setup = nccl(ranks=32, nodes=4, channels=8, bw=45.0, comm=16, version=version,
                 nvls=GraphFigures(8, 40.0, 48.0))
    assert bandwidth_gbps(setup, "allreduce", "nvls_tree", "Simple") == pytest.approx(160.0)
