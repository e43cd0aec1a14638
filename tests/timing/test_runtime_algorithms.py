"""NCCL's other algorithms in the yardstick (NVLS, NVLS-tree, PAT), foreign programs priced over
the runtime's own path, and ``collsynth time`` without files.

Every expected time is derived by hand in the comments from the program model's definition
(docs/runtime-model.md): base latency once per call; per transfer a hop latency of its link
class and its bytes over its rate; a receive ends when the last slice of each input has
arrived and, in Simple, a plain receive (``r``, ``rrc``: not a forward) then takes that slice
out of the connection's FIFO at the rate the matched send moved it (prims_simple.h: a slice is
taken only once all of it is in); transfers crossing a port at the same time share it equally.
A Simple call is cut into 2 slices (SlicePerChunk) of at least 1/32 of the 1 MiB slice
(32 KiB), at most 1 MiB: the chunks here are mostly under 32 KiB, so a transfer's slice is all
of it and there is no pipelining within a chunk; where a case pipelines, its comment says so.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from collsynth.cli import main
from collsynth.errors import InvalidInstanceError, InvalidTopologyError, UnknownNameError
from collsynth.export.check import check_program
from collsynth.export.program import GpuProgram, Program, ThreadBlock, XmlStep
from collsynth.runtimes import PROTOCOLS, get_runtime
from collsynth.timing.closed_form import ClosedForm
from collsynth.timing.pricing import (RuntimeAlgorithm, fastest_runtime_algorithm,
                                      runtime_algorithms)
from collsynth.timing.program_model import ProgramModel
from collsynth.timing.runtime_baselines import pat_program, pat_steps, ring_program
from collsynth.timing.runtime_model import prepare_program, simulate_program
from collsynth.timing.tuning_model import nvls_chunk_bytes
from collsynth.timing.runtime_programs import RUNTIME_PROGRAMS, runtime_program
from collsynth.timing.switch_graphs import (collnet_chunk_bytes, nvls_graph,
                                            nvls_tree_graph, sharp_graph, switch_ports)
from collsynth.topology import get_topology
from collsynth.topology.compose import compose_nodes
from collsynth.topology.machine import with_machine
from collsynth.topology.model import Topology

HOPPER = {"arch": "sm90", "intra_class": "nvlink", "nvswitch": True, "nvls": True,
          "network_class": "ib", "cpu_vendor": "intel"}


def constants(*, base=4.0, intra=1.0, network=3.0, gamma=0.0):
    """NCCL's defaults with one base latency, one hop latency per link class, no ceiling."""
    c = get_runtime("nccl").defaults
    return c.replace(base_latency_us={p: base for p in PROTOCOLS},
                     hop_latency_us={"intra": {p: intra for p in PROTOCOLS},
                                     "network": {p: network for p in PROTOCOLS}},
                     ceiling_gbps={k: {p: None for p in PROTOCOLS}
                                   for k in ("intra", "network")},
                     gamma_us_per_byte=gamma)


def nvls_pair(unit_gbps: float = 25.0) -> Topology:
    """Two Hopper GPUs on an NVSwitch with multicast, 4 NVLinks each; a 10 GB/s NIC per GPU."""
    return Topology("nvls-pair", ((0, 4), (4, 0)), unit_gbps=unit_gbps, alpha_us=1.0,
                    metadata={"machine": HOPPER,
                              "nic": {"count": 2, "gbps": 10.0, "per_gpu": True}})


def one_gpu_nodes(nodes: int) -> Topology:
    """``nodes`` nodes of one Hopper GPU each, a 10 GB/s NIC per node."""
    gpu = Topology("gpu", ((0,),), unit_gbps=10.0, alpha_us=1.0,
                   metadata={"machine": {**HOPPER, "nvswitch": False, "nvls": False},
                             "nic": {"count": 1, "gbps": 10.0, "per_gpu": True}})
    return compose_nodes(gpu, nodes)


def port_bytes(prepared, size: int) -> dict[str, float]:
    """Data bytes each resource carries at ``size``: every transfer's chunks on each resource
    it crosses (counted from the graph, not simulated)."""
    chunk = size / prepared.buffer_chunks
    found: dict[str, float] = {}
    weights = prepared.weights if prepared.weights is not None else [1.0] * len(prepared.members)
    for (t, r), w in zip(prepared.members, weights):
        name = prepared.resource_names[r]
        found[name] = found.get(name, 0.0) + prepared.cnt[t] * chunk * w
    return found


# -- NVLS ----------------------------------------------------------------------------------------


def test_nvls_allreduce_on_two_gpus_by_hand():
    # Ports: 4 NVLinks x 25 GB/s x 0.67 (Hopper's NVLS port efficiency) = 67 GB/s = P = 67_000 B/us
    # each way. 20_000 bytes, one channel: 2 shards of D = 10_000 bytes. Hops 1 us, base 4 us.
    #   scatter: each GPU sends both shards to the switch at once, sharing its port: 2D/P;
    #   the switch's sum of shard k reaches GPU k after a hop, then D/P down the port;
    #   GPU k stores it back into the switch: a hop, D/P up;
    #   the switch writes both shards into each GPU at once: a hop, 2D/P down; a last hop;
    #   each GPU's receive takes a copy's last slice (all of it, D: under the 16 KiB NVLS
    #   chunk) out of the FIFO at the rate the copy came, P/2: 2D/P more.
    # 4 hops + 8D/P: 4 + 4 + 80_000 / 67_000 = 9.19403 us.
    t = simulate_program(nvls_graph("allreduce", nvls_pair(), 1), None, 20_000, constants())
    assert t.time_us == pytest.approx(8.0 + 80_000 / 67_000, rel=1e-9)


@pytest.mark.parametrize("collective, passes", [pytest.param("allgather", 5, id="allgather"),
                                                pytest.param("reduce_scatter", 3,
                                                             id="reduce_scatter")])
def test_nvls_allgather_and_reduce_scatter_on_two_gpus_by_hand(collective, passes):
    # The pair again (P = 67_000 B/us), 20_000 bytes, one channel: D = 10_000 bytes per shard
    # (one slice each). Allgather: GPU k stores its shard (a hop, D/P up its own port); the
    # switch writes both shards into each GPU at once (a hop, 2D/P down each port); each
    # receive takes a copy's slice out at the rate it came, P/2: 2D/P. Base 4 + 2 hops + 5D/P
    # = 6 + 50_000 / 67_000 = 6.7463 us. Reduce-scatter: each GPU sends both shards at once (a
    # hop, 2D/P up); the switch returns the sum of shard k (a hop, D/P down), which the
    # channel's load-reduce writes where it goes (NCCL's multimem load-reduce into the output:
    # no FIFO to copy it out of). 6 + 3D/P = 6 + 30_000 / 67_000 = 6.4478 us.
    t = simulate_program(nvls_graph(collective, nvls_pair(), 1), None, 20_000, constants())
    assert t.time_us == pytest.approx(6.0 + passes * 10_000 / 67_000, rel=1e-9)


@pytest.mark.parametrize("collective, up, down", [
    ("allreduce", 9 / 8, 9 / 8),        # n shards up + the stored sum; the sum + n copies down
    ("allgather", 1 / 8, 1.0),          # its shard up once; every shard down
    ("reduce_scatter", 1.0, 1 / 8),     # every shard up; its sum down
])
def test_nvls_bytes_per_port_on_a_dgx_h100(collective, up, down):
    # Each GPU's port to the switch and from it, in units of the buffer (S = 16 MiB), over the
    # 16 NVLS channels: counted by hand from the steps (docs/runtime-model.md, "NVLS").
    # The folded graph (shard 0 of one channel) carries the same on the ports it keeps.
    size = 16 << 20
    for fold, ports in ((False, 16), (True, 2)):
        prepared = nvls_graph(collective, get_topology("dgx-h100"), 16, fold=fold)
        carried = port_bytes(prepared, size)
        assert len(carried) == ports
        for rank in range(ports // 2):
            assert carried[f"NVLS port of rank {rank} to switch 0"] == pytest.approx(up * size)
            assert carried[f"NVLS port of rank {rank} from switch 0"] == \
                pytest.approx(down * size)


def test_nvls_traffic_is_bounded_by_the_switch_and_the_channels_not_by_connections():
    # The pair of the test above (P = 67_000 B/us, D = 10_000 bytes, 9.194 us). A ceiling of
    # 1 GB/s per connection does not touch NVLS: the switch reads and copies, a channel's SM
    # reduces and stores. A channel rate of 33.5 GB/s (P/2) doubles the sum's leg down and the
    # store up (D/P each -> 2D/P); the scatter, the copies and the receives' last pass (at the
    # copies' rate) keep 2D/P each: 4 + 4 hops + (2D + 2D + 2D + 2D + 2D)/P = 9.4925 us.
    c = constants()
    graph = nvls_graph("allreduce", nvls_pair(), 1)
    slow = c.replace(ceiling_gbps={k: {p: 1.0 for p in PROTOCOLS} for k in ("intra", "network")})
    assert simulate_program(graph, None, 20_000, slow).time_us == pytest.approx(
        8.0 + 80_000 / 67_000, rel=1e-9)
    assert simulate_program(graph, None, 20_000, c.replace(nvls_channel_gbps=33.5)).time_us == \
        pytest.approx(8.0 + 100_000 / 67_000, rel=1e-9)


@pytest.mark.parametrize("efficiency", [None, 0.425])
def test_nvls_pipelines_at_its_own_chunk_size_by_hand(efficiency):
    # NCCL's NVLS kernels move at most 128 KiB per pipeline step (NCCL_NVLS_CHUNKSIZE), not the
    # 1 MiB Simple slice of the proxy-driven algorithms, and less for small calls (enqueue.cc:
    # 64 KiB when size < 32 x channels x heads x 128 KiB; 32 KiB when < 8 x ... x 64 KiB).
    # Allgather on the pair, one channel, 2 MiB: 2 heads, 2 MiB < 32 x 2 x 128 KiB = 8 MiB, not
    # < 8 x 2 x 64 KiB = 1 MiB: 64 KiB steps. Shards of D = 1 MiB. Port P = 4 x 25 GB/s x 0.67
    # = 67_000 B/us (or x 0.425 / 0.67 when the constants carry their own NVLS efficiency).
    # GPU k stores its shard (D/P up); the switch starts writing it on once the first 64 KiB
    # has arrived (a hop + 65536/P), both shards into each GPU at once (2D/P down); a last hop;
    # each receive takes the copy's last 64 KiB out of the FIFO at the copy's rate, P/2
    # (2 x 65536/P). The NVLS chunk is the slice as it is, not cut in two (prep.slice_bytes).
    # Base 4 us, hops 1 us: 4 + 2 + (3 x 65536 + 2 x 1048576) / P. With the 1 MiB slice it
    # would be 4 + 2 + (D + 2D + 2D)/P = 6 + 5D/P.
    c = constants().replace(nvls_efficiency=efficiency)
    port = 67_000 * (efficiency or 0.67) / 0.67
    t = simulate_program(nvls_graph("allgather", nvls_pair(), 1), None, 2 << 20, c)
    assert t.time_us == pytest.approx(6.0 + (3 * 65536 + 2 * 1048576) / port, rel=1e-9)


@pytest.mark.parametrize("size, channels, heads, expected", [
    (1 << 30, 16, 8, 131072),           # large: NCCL_NVLS_CHUNKSIZE (not < 64 x 128 x 128 KiB)
    (768 << 20, 16, 8, 65536),          # < 64 x 128 ops x 128 KiB = 1 GiB (src/enqueue.cc)
    (256 << 20, 16, 8, 65536),
    (32 << 20, 16, 8, 32768),           # < 8 x 128 x 64 KiB = 64 MiB
    (4 << 20, 16, 8, 16384),            # < 2 x 128 x 32 KiB = 8 MiB
])
def test_nvls_chunk_follows_nccls_rule(size, channels, heads, expected):
    assert nvls_chunk_bytes(size, channels, heads) == expected


@pytest.mark.parametrize("algorithm, size, expected", [
    ("collnet_chain", 1 << 30, 131072),     # 1 GiB / (16 x 256 KiB) = 256 < 8 x 64: 128 KiB
    ("collnet_chain", 64 << 20, 65536),     # 16 < 512: 128 KiB; 32 < 8 x 8: 64 KiB (64: stop)
    ("collnet_chain", 1 << 20, 32768),      # 0 chunks: down to the 32 KiB floor
    ("collnet_direct", 1 << 30, 131072),    # 1 GiB / (16 x 8 x 512 KiB) = 16 < 2 x 64: 128 KiB
    ("collnet_direct", 1 << 20, 32768),
])
def test_collnet_chunk_follows_nccls_rule(algorithm, size, expected):
    # 16 channels, 8 heads; depth 8 for the chain (its GPUs), 2 for direct (enqueue.cc rules)
    depth = 8 if algorithm == "collnet_chain" else 2
    assert collnet_chunk_bytes(algorithm, size, 16, 8, depth) == expected


def test_switch_ports_carry_nvlink_times_nvls_efficiency():
    # DGX H100: 18 NVLinks of 25 GB/s, Hopper's port 0.67 (the mean of three public fits);
    # DGX B200: 18 of 50 GB/s, NCCL's Blackwell 0.74.
    assert switch_ports(get_topology("dgx-h100"))[3] == pytest.approx((301.5, 301.5))
    assert switch_ports(get_topology("dgx-b200"))[0] == pytest.approx((18 * 50 * 0.74,) * 2)
    with pytest.raises(InvalidInstanceError, match="no NVLink SHARP"):
        switch_ports(get_topology("dgx-a100"))


# -- SHARP: CollNet and NVLS across nodes ---------------------------------------------------------


def test_collnet_chain_on_two_one_gpu_nodes_by_hand():
    # Two nodes of one GPU, 10 GB/s NICs (B = 10_000 B/us), the network's switch reduces
    # (sharp). 20_000 bytes, one channel: each GPU is its node's whole chain and head. It sends
    # its data up its NIC (S/B = 2 us, a network hop of 3 us); the switch sums both streams as
    # they arrive and returns the total down each NIC (starts when the first slice is in, at
    # 5 us: S/B more, ends at 7), a last hop (in at 10); the GPU's receive takes the slice out
    # of the FIFO at the rate it came, S/B: 12 us, + base 4 = 16 us. (A 20_000-byte chunk
    # fits one slice: NCCL's 32 KiB floor.)
    two = with_machine(one_gpu_nodes(2), sharp=True)
    t = simulate_program(sharp_graph("collnet_chain", "allreduce", two, 1), None, 20_000,
                         constants())
    assert t.time_us == pytest.approx(4 + 2 * 3 + 3 * 20_000 / 10_000, rel=1e-9)


def test_collnet_direct_bytes_per_nic_and_link():
    # Two nodes of nvls-pair (sharp), one channel, S = 1 MiB in 2 shards: GPU k of each node
    # is the head of shard k. Each GPU sends the other's shard over NVLink (S/2), heads send
    # their node's sum up their NIC (S/2) and get the total back (S/2), then send it to the
    # other GPU (S/2): NVLink a -> b carries S, each NIC S/2 each way (counted by hand).
    size = 1 << 20
    four = with_machine(compose_nodes(nvls_pair(), 2), sharp=True)
    carried = port_bytes(sharp_graph("collnet_direct", "allreduce", four, 1), size)
    for a, b in ((0, 1), (1, 0), (2, 3), (3, 2)):
        assert carried[f"link {a}->{b}"] == pytest.approx(size)
    nics = {k: v for k, v in carried.items() if "NIC" in k}
    assert len(nics) == 8 and all(v == pytest.approx(size / 2) for v in nics.values())


def test_sharp_algorithms_are_offered_only_where_the_network_reduces():
    nccl = get_runtime("nccl")
    two = compose_nodes(get_topology("dgx-h100"), 2)
    names = [a.algorithm for a in runtime_algorithms(nccl, "allreduce", two)]
    assert "collnet_direct" not in names and "collnet_chain" not in names
    sharp = with_machine(two, sharp=True)
    names = [a.algorithm for a in runtime_algorithms(nccl, "allreduce", sharp)]
    assert {"collnet_direct", "collnet_chain", "nvls"} <= set(names)
    model = ProgramModel(nccl.defaults, runtime=nccl)
    for a in runtime_algorithms(nccl, "allreduce", sharp):
        assert model.why_not(a) is None and ClosedForm().why_not(a) is None, a.name
    with pytest.raises(InvalidInstanceError, match="SHARP"):
        sharp_graph("collnet_chain", "allreduce", two, 1)
    with pytest.raises(InvalidTopologyError, match="sharp = true"):
        with_machine(two, sharp=True, network_class="roce")


def test_nvls_tree_on_two_nodes_by_hand():
    # Two nodes of nvls-pair (ports 4 x 10 GB/s x 0.67 = P = 26_800 B/us; one 10 GB/s NIC per
    # GPU, B = 10_000 B/us); intra hop 1 us, network hop 3 us, base 4 us; 20_000 bytes, one
    # channel (the first tree: node 0 the root, node 1 its child): shards of D = 10_000 bytes.
    # Node 1, shard k, in order: scatter 2D/P (both shards share a port) + 1; the switch's sum
    # to GPU k D/P + 1; up the tree to node 0 D/B + 3; node 0 adds its own sum and sends it
    # back D/B + 3; store into node 1's switch D/P + 1; copies into both GPUs 2D/P + 1; each
    # GPU's receive takes its copy's slice (all of D) out at the copy's rate P/2: 2D/P.
    # 4 + 4 x 1 + 2 x 3 + 8D/P + 2D/B = 14 + 80_000 / 26_800 + 2 = 18.9851 us.
    two = compose_nodes(nvls_pair(unit_gbps=10.0), 2)
    t = simulate_program(nvls_tree_graph("allreduce", two, 1), None, 20_000, constants())
    assert t.time_us == pytest.approx(16.0 + 80_000 / 26_800, rel=1e-9)
    # Network bytes: per shard one sum up and one back, D each way between the heads.
    carried = port_bytes(nvls_tree_graph("allreduce", two, 1, fold=False), 20_000)
    assert carried["link 2->0"] == carried["link 0->2"] == pytest.approx(10_000)
    assert carried["link 3->1"] == carried["link 1->3"] == pytest.approx(10_000)


def test_nvls_tree_pays_gamma_where_a_head_adds_its_child():
    # The same case with reductions of 1e-4 us per byte: the root's head adds node 1's sum to
    # its own as it arrives, one pass over its last slice (the whole chunk here): its send back
    # to node 1 ends D x gamma = 1 us later, and so does everything after it on node 1's path.
    # One more effect of the model's time-averaged shares: the two copies into each GPU of node
    # 1 now wait for the stored sum rather than for their port, so their mean load leaves the
    # port room and each takes all of it for its last slice: D/P instead of 2D/P; the receives
    # (no reduction: no gamma) take that slice out at the copies' rate, now P: D/P, not 2D/P.
    # 18.9851 + 1 - D/P - D/P = 17 + 6D/P = 17 + 60_000 / 26_800 = 19.2388 us.
    two = compose_nodes(nvls_pair(unit_gbps=10.0), 2)
    t = simulate_program(nvls_tree_graph("allreduce", two, 1), None, 20_000,
                         constants(gamma=1e-4))
    assert t.time_us == pytest.approx(17.0 + 60_000 / 26_800, rel=1e-9)


def test_nvls_refuses_what_nccl_does_not_run():
    with pytest.raises(InvalidInstanceError, match="needs CollNet"):
        nvls_graph("allreduce", compose_nodes(get_topology("dgx-h100"), 2), 16)
    with pytest.raises(InvalidInstanceError, match="Simple protocol only"):
        nvls_graph("allreduce", get_topology("dgx-h100"), 16, "LL")
    with pytest.raises(UnknownNameError, match="no NVLS-tree for 'allgather'"):
        nvls_tree_graph("allgather", get_topology("dgx-h100"), 16)
    with pytest.raises(InvalidInstanceError, match="no NVLink SHARP"):
        nvls_graph("allreduce", get_topology("dgx-a100"), 16)


# -- PAT -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("collective", ["allgather", "reduce_scatter"])
@pytest.mark.parametrize("ranks, channels", [(2, 1), (3, 2), (4, 1), (5, 1), (6, 3), (8, 2),
                                             (13, 1)])
def test_the_checker_proves_pat(collective, ranks, channels):
    report = check_program(pat_program(collective, ranks, channels), runtime="msccl",
                           collective=collective)
    assert report.ok, report


def test_pat_sends_log2_steps_and_each_block_once():
    # 8 ranks: distances 1, 2, 4 sending 1, 2, 4 blocks (7 = n - 1 in all); 6 ranks: 1, 2, 2.
    assert pat_steps(8) == ((1, 1), (2, 2), (4, 4))
    assert pat_steps(6) == ((1, 1), (2, 2), (4, 2))
    p = pat_program("allgather", 8)
    sends = [st for g in p.gpus for tb in g.threadblocks for st in tb.steps if st.type == "s"]
    assert len(sends) == 8 * 7


@pytest.mark.parametrize("collective, expected", [pytest.param("allgather", 16.0, id="allgather"),
                                                  pytest.param("reduce_scatter", 15.0,
                                                               id="reduce_scatter")])
def test_pat_against_the_ring_on_four_one_gpu_nodes_by_hand(collective, expected):
    # 4 nodes of one GPU, NICs of B = 10_000 B/us, network hop 3 us, base 4 us; 40_000 bytes:
    # blocks of D = 10_000 bytes (one slice each). Every receive (r, rrc) takes its slice out
    # of the FIFO once it is in, at the rate its send moved it (gamma 0: no more for rrc).
    # PAT allgather: at 0 a rank sends its block to r - 1 and (the other step's thread block)
    # to r - 2, sharing its NIC: 2D/B = 2 us, in at 2 + 3 = 5; the block from r + 1 came at
    # B/2, so its receive takes 2 us more (5..7); then it goes on to r - 2: D/B = 1 us
    # (7..8), in at 8 + 3 = 11, and that receive takes D/B (11..12). 4 + 12 = 16 us.
    # Reduce-scatter, the steps reversed: two partial sums to r + 2, one after the other in one
    # thread block (D/B each, in at 4 and 5), each reduced in at B as it lands (4..5, 5..6);
    # then the reduced block r + 1 to r + 1 (6..7, in at 10), reduced into the output at B
    # (10..11): 4 + 11 = 15 us.
    # Ring: 3 steps of a hop and D/B, then the last receive's D/B: 4 + 3 x (3 + 1) + 1 = 17 us.
    four = one_gpu_nodes(4)
    pat = simulate_program(pat_program(collective, 4), four, 40_000, constants())
    ring = simulate_program(ring_program(collective, [(0, 1, 2, 3)]), four, 40_000, constants())
    assert pat.time_us == pytest.approx(expected, rel=1e-9)
    assert ring.time_us == pytest.approx(17.0, rel=1e-9)


def test_pat_refuses_one_rank_and_other_collectives():
    with pytest.raises(InvalidInstanceError, match=">= 2"):
        pat_program("allgather", 1)
    with pytest.raises(UnknownNameError, match="no PAT program for 'allreduce'"):
        pat_program("allreduce", 4)


# -- which algorithms the runtime considers ---------------------------------------------------


def _names(runtime, collective, topology):
    return [a.algorithm for a in runtime_algorithms(get_runtime(runtime), collective, topology)]


def test_runtime_algorithms_follow_nccls_rules():
    h100 = get_topology("dgx-h100")
    assert _names("nccl", "allreduce", h100) == ["ring", "tree", "nvls"]
    assert _names("nccl", "allgather", h100) == ["ring", "nvls"]
    assert _names("nccl", "allreduce", compose_nodes(h100, 2)) == ["ring", "tree", "nvls_tree"]
    # NVLS across nodes needs CollNet (SHARP): not for allgather on two nodes.
    assert _names("nccl", "allgather", compose_nodes(h100, 2)) == ["ring"]
    assert _names("nccl", "allgather", one_gpu_nodes(8)) == ["ring", "pat"]
    assert _names("nccl", "allreduce", one_gpu_nodes(8)) == ["ring", "tree"]
    assert _names("nccl", "allreduce", get_topology("dgx-a100")) == ["ring", "tree"]
    # RCCL has no NVLS; msccl (NCCL 2.12) neither.
    assert _names("rccl", "allreduce", get_topology("mi300x")) == ["ring", "tree"]
    assert _names("msccl", "allreduce", h100) == ["ring", "tree"]
    assert _names("msccl-executor", "allreduce", h100) == ["ring", "tree", "nvls"]
    # alltoall: grouped send/recv, the only way either runs it; mscclpp has no own algorithms
    assert _names("nccl", "alltoall", h100) == ["p2p"]
    assert _names("rccl", "alltoall", get_topology("mi300x")) == ["p2p"]
    assert _names("mscclpp", "alltoall", h100) == []


def test_the_rules_have_one_home(monkeypatch):
    # runtime_algorithms asks the tuning model; with its rules offering nothing, no NVLS.
    import collsynth.timing.tuning_model as tuning

    monkeypatch.setattr(tuning, "offered_protocols", lambda *args: ())
    assert _names("nccl", "allreduce", get_topology("dgx-h100")) == ["ring", "tree"]


def test_every_algorithm_has_a_builder_and_the_checkable_ones_are_proved():
    assert set(RUNTIME_PROGRAMS) == {"ring", "tree", "nvls", "nvls_tree", "pat",
                                     "collnet_direct", "collnet_chain", "p2p"}
    h100 = get_topology("dgx-h100")
    for name, collective, topology in (("ring", "allgather", h100), ("pat", "allgather",
                                                                      one_gpu_nodes(4)),
                                       ("p2p", "alltoall", h100)):
        built = runtime_program(name, collective, topology, 2)
        # a builder may return its program prepared (the runtime's own slice in Simple)
        program = built if isinstance(built, Program) else built.program
        assert RUNTIME_PROGRAMS[name].checkable
        assert check_program(program, runtime="msccl", collective=collective).ok
    assert runtime_program("nvls", "allreduce", h100).program.nchannels == 16  # NCCL on sm90


def test_the_tree_pat_and_send_recv_move_one_slice_of_one_step_per_call_in_simple():
    # NCCL runs them as ProtoSimple<1, 1> (all_reduce.h, all_gather.h, sendrecv.h): one slice
    # per call of at most one step, NCCL_BUFFSIZE / NCCL_STEPS = 4 MiB / 8 = 512 KiB (send/recv:
    # NCCL_P2P_NVL_CHUNKSIZE inside a node, 512 KiB; NCCL_P2P_NET_CHUNKSIZE across, 128 KiB),
    # where the rings' Simple cuts a call in two; other protocols keep the constants' slices.
    h100 = get_topology("dgx-h100")
    two = compose_nodes(h100, 2)
    for name, collective, topology, step in (("tree", "allreduce", two, 512 * 1024),
                                             ("p2p", "alltoall", h100, 512 * 1024),
                                             ("p2p", "alltoall", two, 128 * 1024)):
        built = runtime_program(name, collective, topology, 2, protocol="Simple")
        assert built.slice_bytes == step, (name, topology.name)
        assert isinstance(runtime_program(name, collective, topology, 2, protocol="LL"),
                          Program)
    assert isinstance(runtime_program("ring", "allgather", h100, 2, protocol="Simple"), Program)
    # PAT's chunk (its slice) shrinks with the call (calcCollChunking): 512 KiB halved while
    # chunk x channels x 32 (allgather; 16 for reduce-scatter) exceeds the size, down to 64
    # KiB. Two channels: 64 MiB keeps 512 KiB (32 MiB <= 64 MiB); 8 MiB halves twice (32, 16
    # MiB > 8 MiB; 8 MiB is not) to 128 KiB; 1 MiB reaches the floor. Reduce-scatter at 8 MiB
    # halves once (16 MiB > 8 MiB; 8 MiB is not): 256 KiB.
    pat = runtime_program("pat", "allgather", one_gpu_nodes(4), 2, protocol="Simple")
    assert [pat.slice_bytes(s << 20) for s in (64, 8, 1)] == [512 << 10, 128 << 10, 64 << 10]
    pat_rs = runtime_program("pat", "reduce_scatter", one_gpu_nodes(4), 2, protocol="Simple")
    assert pat_rs.slice_bytes(8 << 20) == 256 << 10


# -- the fastest of the runtime's algorithms -------------------------------------------------


def test_the_fastest_runtime_algorithm_on_a_dgx_h100_is_nvls_at_1_gib():
    # 1 GiB allreduce, documented NCCL constants, no ceilings. Lower bounds by hand: a ring
    # moves 2 x 7/8 of the buffer through each GPU's 450 GB/s: >= 4176 us; NVLS moves 9/8 of
    # it through each 301.5 GB/s port: >= 4006 us, and its pipeline of 128 KiB steps comes
    # within 10% of that. At 1 KiB latency decides: the ring with LL pays 6.6 + 14 x 0.6 =
    # 15.0 us, NVLS (Simple only) 8.4 + 4 legs x 3.4 = 22.0 us.
    model = ProgramModel(get_runtime("nccl").defaults)
    small, big = fastest_runtime_algorithm(get_runtime("nccl"), "allreduce",
                                           get_topology("dgx-h100"), [1024, 1 << 30], model)
    assert big.subject == "nccl-nvls" and big.protocol == "Simple" and big.channels == 16
    assert 1.125 * (1 << 30) / 301_500 < big.time_us < 1.1 * 1.125 * (1 << 30) / 301_500
    # The ring with LL on one channel (NCCL's own choice at 1 KiB): baseLat 6.6 + 14 hops of
    # 0.6 us, plus 14 steps of 128 B at LL's per-channel ceiling, half of 12 graph channels x
    # 30 GB/s spread over 24 channels = 7.5 GB/s: 14 x 128 / 7500 = 0.2389 us.
    assert small.subject != "nccl-nvls" and small.channels == 1
    assert small.time_us == pytest.approx(15.0 + 14 * 128 / 7500, abs=0.01)
    nvls = RuntimeAlgorithm(get_runtime("nccl"), "nvls", "allreduce", get_topology("dgx-h100"))
    assert model.price(nvls, [1])[0].time_us == pytest.approx(8.4 + 4 * 3.4, abs=0.01)


def test_the_closed_form_prices_nvls_with_nccls_own_estimate():
    # NCCL 2.30 on a DGX H100 (docs/runtime-tuning.md): NVLS graph of 8 heads at 40 GB/s (the
    # fastest sm90 speed with 9 x speed <= 18 x 20.6 GB/s); per channel min(40 x 0.85 x 7/8 x 2,
    # 2 x 40) = 59.5 GB/s; bus 8 x 59.5 = 476; algbw 476 x 8/14 = 272 GB/s; latency 25 us
    # (hwLat NVLINK NVLS Simple, no base). 1 GiB: 25 + 2^30 / 272_000 us.
    nvls = RuntimeAlgorithm(get_runtime("nccl"), "nvls", "allreduce", get_topology("dgx-h100"))
    (price,) = ClosedForm().price(nvls, [1 << 30])
    assert price.time_us == pytest.approx(25 + (1 << 30) / 272_000, rel=1e-9)
    assert ClosedForm().why_not(nvls.pinned("LL")) is not None  # NVLS runs Simple only


def test_solve_bandwidth_optimal_names_the_fastest_runtime_algorithm(capsys):
    assert main(["solve", "bandwidth-optimal", "dgx-h100", "allreduce", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["predicted_us"]
    last = rows[-1]  # 1 GiB: NVLS (272 GB/s by NCCL's estimate) beats the ring's lines
    assert last["runtime_fastest"] == "nccl-nvls"
    assert last["runtime_fastest_us"] == pytest.approx(min(last["nccl_ring"], last["nccl_tree"],
                                                           last["nccl_nvls"]))


# -- foreign programs ------------------------------------------------------------------------------


def _send(n: int, src: int, dst: int) -> Program:
    """``src`` sends its one chunk to ``dst`` (a custom collective)."""
    gpus = []
    for rank in range(n):
        tbs = ()
        if rank == src:
            tbs = (ThreadBlock(0, dst, -1, 0, (XmlStep(0, "s", "i", 0, "o", 0, 1),)),)
        elif rank == dst:
            tbs = (ThreadBlock(0, -1, src, 0, (XmlStep(0, "r", "i", 0, "o", 0, 1),)),)
        gpus.append(GpuProgram(rank, 1, 1, 0, tbs))
    return Program("send", "Simple", 1, 1, n, "custom", 0, tuple(gpus))


def test_a_foreign_send_on_mi250_goes_through_the_host_by_hand():
    # GCDs 7 and 8 of an MI250 node share no xGMI link: RCCL moves the data over PCIe through
    # the host, Gen4 x16 on MI250: 24 GB/s out of GCD 7 and into GCD 8. 240_000 bytes in one
    # chunk, a Simple call cut in 2 slices of 120_000 (over the 32 KiB floor): base 4 + intra
    # hop 1 + 240_000 / 24_000, then the receive takes the last slice out at the send's rate,
    # 120_000 / 24_000: 4 + 1 + 10 + 5 = 20 us.
    mi250 = get_topology("mi250-16gcd")
    assert mi250.links[7][8] == 0
    prepared = prepare_program(_send(16, 7, 8), mi250)
    assert prepared.indirect == ((7, 8, "PCIe through the host, 24 GB/s", 1),)
    t = simulate_program(prepared, None, 240_000, constants())
    assert t.time_us == pytest.approx(20.0, rel=1e-12)
    # Between nodes the path is the NICs (25 GB/s per OAM here); inside an NVSwitch node the
    # switch ports (a DGX H100 links every pair anyway, so nothing is indirect there).
    two = compose_nodes(get_topology("dgx-h100"), 2)
    assert prepare_program(_send(16, 0, 9), two).indirect == ()


def test_a_foreign_program_is_priced_with_a_warning_on_the_command_line(tmp_path, capsys):
    from collsynth.export.xml_writer import write_program

    # RCCL's ring allgather written for 16 GCDs in rank order: six of its hops (1->2, 3->4,
    # 7->8, 9->10, 11->12, 15->0) have no xGMI link.
    path = tmp_path / "ring16.xml"
    path.write_text(write_program(ring_program("allgather", [tuple(range(16))], runtime="rccl"),
                                  "rccl"))
    assert main(["time", str(path), "--topology", "mi250-16gcd", "--runtime", "rccl",
                 "--sizes", "1MB", "--json"]) == 0
    captured = capsys.readouterr()
    rows = json.loads(captured.out)
    (ours,) = [r for r in rows if r["name"] == "ring16.xml"]
    assert "7->8 via PCIe through the host, 24 GB/s (15 sends)" in ours["note"]
    assert captured.err.startswith("warning: ring16.xml: 90 sends between ranks with no direct")
    assert ours["time_us"] > 0


# -- collsynth time without files -----------------------------------------------------------------


def test_time_without_files_prints_the_runtimes_own_algorithms(capsys):
    assert main(["time", "--collective", "allreduce", "--topology", "dgx-h100", "--sizes",
                 "1KiB,1GiB"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("allreduce on DGX-H100 (8 ranks): the runtime's own algorithms")
    rows = [[c.strip() for c in line.split("|")] for line in out.splitlines()
            if "nccl-" in line and "|" in line]
    assert [r[1] for r in rows] == ["nccl-ring", "nccl-tree", "nccl-nvls"] * 2
    assert rows[0][0] == "1 KiB" and rows[0][-1] == "*"          # the ring with LL at 1 KiB
    # NVLS: Simple; at 1 KiB the cell scheduler puts the call's 2 KiB of traffic on one of
    # its 16 channels (< 32 KiB per channel), at 1 GiB on all 16.
    assert rows[2][2:4] == ["Simple", "1"] and rows[5][2:4] == ["Simple", "16"]
    assert rows[5][-1].startswith("*")                            # NVLS fastest at 1 GiB


def test_time_without_files_json_marks_the_fastest_and_the_runtimes_pick(capsys):
    assert main(["time", "--collective", "allreduce", "--topology", "dgx-h100", "--sizes",
                 "64MiB", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {r["kind"] for r in rows} == {"baseline"}
    fastest = [r for r in rows if r["fastest_runtime"]]
    assert len(fastest) == 1 and fastest[0]["time_us"] == min(r["time_us"] for r in rows)
    # NCCL's own cost model picks NVLS at 64 MiB (its estimate: 25 + 2^26 / 272_000 = 272 us
    # against its ring's 56 + 2^26 / 205_714 = 382 us).
    picked = [r for r in rows if r["runtime_pick"]]
    assert [r["name"] for r in picked] == ["nccl-nvls"] and picked[0]["runtime_pick"] == \
        "nvls/Simple"


def test_time_without_files_channels_and_usage(capsys):
    assert main(["time", "--collective", "allgather", "--topology", "dgx-h100", "--channels",
                 "2", "--sizes", "1MB", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {r["name"]: r["channels"] for r in rows} == {"nccl-ring/2ch": 2, "nccl-nvls/2ch": 2}
    assert main(["time", "--collective", "allgather"]) == 2
    assert "--collective C and --topology T" in capsys.readouterr().err
    assert main(["time", "--topology", "dgx-h100", "--collective", "allreduce", "--model",
                 "closed-form"]) == 2
    capsys.readouterr()
    assert main(["time", "--topology", "dgx-h100", "--collective", "allreduse"]) == 1
    assert "unknown collective 'allreduse'" in capsys.readouterr().err
    assert main(["time", "--topology", "dgx-h100", "--collective", "allreduce", "--channels",
                 "100000"]) == 2  # a bad option, as --channels 0 is
    assert "more than the 128 channels" in capsys.readouterr().err


def test_time_with_files_keeps_going_past_a_program_it_cannot_price(tmp_path, capsys):
    from collsynth.export.xml_writer import write_program

    good = tmp_path / "ag2.xml"
    good.write_text(write_program(ring_program("allgather", [(0, 1)]), "msccl"))

    def tb(send, recv):  # receive, then send: both ranks wait for each other
        return (ThreadBlock(0, send, recv, 0, (XmlStep(0, "r", "o", 0, "o", 0, 1),
                                               XmlStep(1, "s", "o", 0, "o", 0, 1))),)
    dead = Program("dead", "Simple", 1, 2, 2, "allgather", 0,
                   (GpuProgram(0, 1, 2, 0, tb(1, 1)), GpuProgram(1, 1, 2, 0, tb(0, 0))),
                   outofplace=1, min_bytes=0)
    bad = tmp_path / "dead.xml"
    bad.write_text(write_program(dead, "msccl"))
    args = ["time", str(good), str(bad), "--topology", "ring:2,unit_gbps=10,alpha_us=1",
            "--sizes", "1KB"]
    # The checker refuses the deadlock, so it is not priced (issue 19); the rest is still
    # printed (issue 21) and the exit status says an input was refused.
    assert main(args) == 1
    out = capsys.readouterr().out
    assert "not priced: dead.xml:" in out and "deadlock: a cycle of waits" in out
    assert "ag2.xml" in out and "x nccl-ring" in out   # compared with the fastest, named
    assert main(args + ["--json"]) == 1
    rows = json.loads(capsys.readouterr().out)
    assert [r["kind"] for r in rows] == ["program", "baseline", "error"]
    assert rows[0]["vs_runtime"]["name"] == "nccl-ring"
    assert rows[0]["vs_runtime"]["speedup"] == pytest.approx(rows[1]["time_us"] /
                                                             rows[0]["time_us"])


def test_the_simulated_graphs_are_deterministic_arrays():
    g = nvls_graph("allgather", get_topology("dgx-h100"), 2)
    assert isinstance(g.sends, np.ndarray) and g.members.shape[1] == 2
    assert all(i < len(g.kind) for i in g.match) and g.inputs is not None


@pytest.mark.parametrize("nodes, size, expected", [
    (2, 1 << 30, 131072),   # NCCL_NVLS_CHUNKSIZE
    (4, 1 << 30, 65536),    # NCCL_NVLSTREE_MAX_CHUNKSIZE's default from 4 nodes
    (2, 32 << 20, 65536),   # 32 MiB < 4 x 16 channels x 8 heads x 128 KiB = 64 MiB
    (2, 4 << 20, 32768),    # 4 MiB < 1 x 16 x 8 x 64 KiB = 8 MiB
])
def test_nvls_tree_pipelines_at_nccls_nvls_tree_chunk(nodes, size, expected):
    # calcCollChunking's NVLS_TREE branch (src/enqueue.cc, NCCL 2.20-2.30), not the NVLS one
    # (which would give 131072 at 4 nodes and 1 GiB, and 16 KiB at 4 MiB).
    graph = nvls_tree_graph("allreduce", compose_nodes(get_topology("dgx-h100"), nodes), 16)
    assert graph.slice_bytes(size) == expected
