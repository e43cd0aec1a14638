"""NCCL's alltoall as it runs it, grouped send/recv: the program, its shape per call (NCCL's
and RCCL's p2p rules, read from src/graph/paths.cc and src/enqueue.cc), and its price."""

from __future__ import annotations

import dataclasses

import pytest

from collsynth.cli import main
from collsynth.export.check import check_program
from collsynth.runtimes import get_runtime
from collsynth.timing.p2p_tuning import p2p_shape, peer_channels
from collsynth.timing.pricing import RuntimeAlgorithm
from collsynth.timing.program_model import ProgramModel
from collsynth.timing.runtime_baselines import p2p_channel, p2p_program
from collsynth.timing.tuning_model import tuning_setup
from collsynth.topology import compose_nodes, get_topology


@pytest.mark.parametrize("ranks, parts, channels", [(2, 1, None), (3, 1, None), (8, 4, 32),
                                                    (8, 8, 32), (16, 2, 32)])
def test_the_program_is_an_alltoall(ranks, parts, channels):
    program = p2p_program("alltoall", ranks, parts, channels=channels)
    assert check_program(program, runtime="msccl", collective="alltoall").ok
    # one copy, then a send and a receive thread block per peer and part
    assert all(len(g.threadblocks) == 1 + 2 * (ranks - 1) * parts for g in program.gpus)


def test_rounds_and_parts_fall_on_distinct_channels_when_they_fit():
    # NCCL 2.28+: the round's base bit-reversed, parts contiguous; 8 rounds x 4 parts on 32
    # channels use each channel once.
    used = [p2p_channel(d, k, 32) for d in range(8) for k in range(4)]
    assert sorted(used) == list(range(32))
    assert [p2p_channel(d, 0, 8) for d in range(8)] == [0, 4, 2, 6, 1, 5, 3, 7]


def test_channels_to_a_peer_are_twice_its_links():
    # ncclTopoGetNchannels: 2 x NVLinks to an NVLink peer, 2 through PCIe (DGX-1's unlinked
    # pairs), the fewest over the node's pairs
    assert peer_channels(get_topology("dgx-a100")) == 24
    assert peer_channels(get_topology("dgx-h100")) == 36
    assert peer_channels(get_topology("dgx1")) == 2
    assert peer_channels(compose_nodes(get_topology("dgx-h100"), 2)) == 36


def test_the_shape_of_a_call_follows_nccls_rules():
    """DGX-A100, by hand: 24 communicator channels -> 32 p2p channels; 24 per peer -> 32;
    the fewest per operation halve while x 8 ranks exceeds 32: 4. A part is at least 64 KiB
    (the 512 KiB NVLink chunk / 8) and at most 16 MiB (x 32); LL up to 16 KiB per channel."""
    s = tuning_setup(get_topology("dgx-a100"))
    shape = lambda size, setup=s: p2p_shape(setup, size, intra_peer_channels=24)  # noqa: E731
    assert (shape(8 << 10).protocol, shape(8 << 10).parts) == ("LL", 1)      # 1 KiB a peer
    assert (shape(8 << 20).protocol, shape(8 << 20).parts) == ("Simple", 4)  # 1 MiB a peer
    assert shape(8 << 30).parts == 32                                        # 1 GiB: 32 MiB parts
    assert (shape(8 << 20).channels, shape(8 << 20).per_peer) == (32, 32)
    # 2 MiB (256 KiB a peer, one 64 KiB part... four): LL at 2.23, whose limit is 32 channels
    # per peer x 16 KiB = 512 KiB; 2.29+ counts the parts it uses: 4 x 16 KiB = 64 KiB.
    old = dataclasses.replace(s, version=(2, 23))
    assert shape(2 << 20, old).protocol == "LL" and shape(2 << 20).protocol == "Simple"


def test_across_nodes_the_network_sets_the_channels_per_peer():
    """Two DGX-H100 nodes (16 ranks, 16 communicator channels -> 16 p2p channels), 50 GB/s
    NICs. 2.29+: ceil(50 / 14) = 4 per network peer, and NVLink peers take the fewest; 2.23: 2.
    Parts of 64 KiB to 128 KiB (the 128 KiB network chunk); always Simple."""
    two = compose_nodes(get_topology("dgx-h100"), 2)
    s = tuning_setup(two)
    assert s.comm_channels == 16
    now = p2p_shape(s, 1 << 30, intra_peer_channels=36, nic_gbps=50.0)
    assert (now.protocol, now.per_peer, now.parts) == ("Simple", 4, 4)
    before = p2p_shape(dataclasses.replace(s, version=(2, 23)), 1 << 30,
                       intra_peer_channels=36, nic_gbps=50.0)
    assert (before.per_peer, before.parts) == (2, 2)
    assert p2p_shape(s, 1024, intra_peer_channels=36, nic_gbps=50.0).protocol == "Simple"


def test_rccl_follows_its_own_p2p_rules():
    """MI300X (gfx942, one xGMI link per pair, RCCL's 44 communicator channels), by hand from
    RCCL's ncclTopoGetNchannels / ncclTopoComputeP2pChannels: 4 channels per xGMI link -> 4 per
    peer, doubled on one node -> 8; p2pnChannels = pow2Up(44) = 64, at most 4 x CHANNEL_LIMIT =
    64. NCCL's rules on the same machine: 2 per link -> 2 per peer. A part is LL while its own
    bytes are at most 16 KiB (RCCL's addP2pToPlan), so 256 KiB (32 KiB a peer, one part) is
    Simple, where NCCL's rule before 2.29 (2 channels per peer x 16 KiB) says LL."""
    mi300x = get_topology("mi300x")
    s = tuning_setup(mi300x, runtime="rccl")
    assert s.comm_channels == 44  # the precondition of the hand count
    assert (peer_channels(mi300x), peer_channels(mi300x, s)) == (2, 4)
    shape = lambda size: p2p_shape(s, size, intra_peer_channels=4)  # noqa: E731
    assert (shape(8 << 10).protocol, shape(8 << 10).parts) == ("LL", 1)        # 1 KiB a peer
    assert (shape(256 << 10).protocol, shape(256 << 10).parts) == ("Simple", 1)
    assert (shape(8 << 20).channels, shape(8 << 20).per_peer, shape(8 << 20).parts) == (64, 8, 8)
    # two nodes: a network peer gets 2 (2 x 16 ranks is not above 4 x p2pnChannels), no doubling
    two = compose_nodes(mi300x, 2)
    s2 = tuning_setup(two, runtime="rccl")
    far = p2p_shape(s2, 8 << 30, intra_peer_channels=peer_channels(two, s2))
    assert (far.protocol, far.per_peer, far.parts) == ("Simple", 2, 2)


def test_rccls_alltoall_is_priced_at_rccls_shape():
    rccl = get_runtime("rccl")
    subject = RuntimeAlgorithm(rccl, "p2p", "alltoall", get_topology("mi300x"))
    small, large = ProgramModel(rccl.defaults, runtime=rccl).price(subject, [256 << 10, 8 << 20])
    assert small.protocol == "Simple"  # NCCL's rules (2 per peer x 16 KiB a channel) say LL
    assert large.protocol == "Simple"


def test_a_large_alltoall_is_bound_by_each_gpus_port():
    """8 GiB on a DGX-A100 with NCCL's documented constants: each GPU sends 7/8 of its buffer
    through its NVSwitch port, 12 NVLinks at NCCL's 20 GB/s each (hand count: 7.516 GB over
    240 GB/s = 31.3 ms); its 224 connections (7 peers x 32 parts) are not the bound. Then each
    receive takes its last slice out of the FIFO at the rate its connection moved it: NCCL
    runs send/recv as ProtoSimple<1, 1>, one slice per call of at most one p2p step
    (NCCL_P2P_NVL_CHUNKSIZE, 512 KiB), at 240 / 224 GB/s: 0.49 ms more (31.8 ms; base and hop
    latency, 12 us, are within the tolerance, the last pass is not)."""
    a100 = get_topology("dgx-a100")
    nccl = get_runtime("nccl")
    subject = RuntimeAlgorithm(nccl, "p2p", "alltoall", a100)
    (price,) = ProgramModel(nccl.defaults, runtime=nccl).price(subject, [8 << 30])
    assert price.protocol == "Simple"
    assert price.time_us == pytest.approx(7 / 8 * (8 << 30) / 240e3 + (1 << 19) / (240e3 / 224),
                                          rel=0.01)
    # 32 parts x 8 rounds share NCCL's 32 p2p channels (24 communicator channels, rounded up)
    assert price.channels == 32


def test_time_prices_the_runtimes_alltoall(capsys):
    assert main(["time", "--collective", "alltoall", "--topology", "dgx-a100", "--sizes",
                 "8KiB,8GiB", "--json"]) == 0
    import json

    rows = json.loads(capsys.readouterr().out)
    assert [(r["name"], r["protocol"]) for r in rows] == [("nccl-p2p", "LL"),
                                                         ("nccl-p2p", "Simple")]


def test_nccls_sends_through_pcie_are_a_note_not_a_warning(capsys):
    # DGX-1: 3 of each GPU's 7 peers have no NVLink; NCCL's p2p reaches them over PCIe by
    # design, so time says so among its notes, and warns only about programs' sends
    assert main(["time", "--collective", "alltoall", "--topology", "dgx1", "--sizes",
                 "1GB"]) == 0
    captured = capsys.readouterr()
    assert "nccl-p2p: " in captured.out and "via PCIe" in captured.out
    assert "warning" not in captured.err


def test_what_the_runtime_runs_for_an_alltoall_is_its_p2p():
    # alltoall is outside NCCL's cost model: at every size the runtime runs its one way
    from collsynth.timing.program_model import chosen_algorithms

    nccl = get_runtime("nccl")
    model = ProgramModel(nccl.defaults, runtime=nccl)
    found = chosen_algorithms(model, nccl, "all_to_all", get_topology("dgx-a100"),
                              [1024, 1 << 30])
    assert [a.name for a in found] == ["nccl-p2p", "nccl-p2p"]
