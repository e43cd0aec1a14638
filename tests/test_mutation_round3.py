"""Blind spots found by hand mutation testing (round 3: the program model, the runtime's own
choices, topology composition and import, collectives, calibration, the executor's schedule,
buckets): each test pins one rule that a small, plausible bug could break without any other
test noticing. Expected values are worked out by hand in the comments, from the rules in docs/
and the docstrings, not from the code's output.
"""

from __future__ import annotations

import pytest

from collsynth.export.program import GpuProgram, Program, ThreadBlock, XmlStep
from collsynth.timing.runtime_model import (FORWARD, LOCAL, RECEIVE, SEND, prepare_program,
                                            simulate_program)
from collsynth.topology.compose import compose_nodes
from collsynth.topology.model import Topology
from tests.timing.test_runtime_model import constants, line


def _custom(name: str, ngpus: int, chunks: int, blocks: list[ThreadBlock | None]) -> Program:
    """A custom program of ``chunks`` chunks per loop, one thread block (or none) per rank."""
    gpus = tuple(GpuProgram(r, chunks, chunks, 0, () if tb is None else (tb,))
                 for r, tb in enumerate(blocks))
    return Program(name, "Simple", 1, chunks, ngpus, "custom", 0, gpus)


# -- the program model: a fused re reduces once per source (docs/runtime-model.md, step 3) ---------


def test_a_fused_re_pays_gamma_once_per_source():
    # Two re steps with the same destination and source buffer, the first without hasdep, fuse
    # into one transfer of two sources (docs/msccl-xml.md §10). A custom program of 2 chunks:
    # a 2000-byte buffer is 2 chunks of 1000 bytes. "cpy and re cost gamma per byte (a fused re
    # per source)": 2 sources x 1000 bytes x 0.01 us = 20 us, after the base of 4 us.
    steps = (XmlStep(0, "re", "i", 0, "o", 0, 1), XmlStep(1, "re", "i", 1, "o", 0, 1))
    prep = prepare_program(_custom("fused", 1, 2, [ThreadBlock(0, -1, -1, 0, steps)]),
                           line(1, 10.0))
    assert prep.num_transfers == 1
    t = simulate_program(prep, None, 2000, constants(base=4.0, gamma=0.01))
    assert t.time_us == pytest.approx(4.0 + 20.0)


def test_prepared_transfer_kinds_follow_what_each_step_does():
    # PreparedProgram.kind: s sends; r receives; rcs receives and sends on; cpy works on local
    # data (it neither sends nor receives).
    def tb(send, recv, ops):
        return ThreadBlock(0, send, recv, 0,
                           tuple(XmlStep(i, op, "i", 0, "o", 0, 1) for i, op in enumerate(ops)))
    p = _custom("kinds", 3, 1, [tb(1, -1, ["s", "cpy"]), tb(2, 0, ["rcs"]), tb(-1, 1, ["r"])])
    prep = prepare_program(p, line(3, 10.0))
    # one of each: s (SEND), cpy (LOCAL), rcs (FORWARD), r (RECEIVE)
    assert sorted(prep.kind) == sorted([SEND, LOCAL, FORWARD, RECEIVE])


# -- the program model: a transfer's slice is its whole data when that is under one slice -------


def test_a_forwarded_transfer_smaller_than_a_slice_is_stored_and_forwarded_whole():
    # 0 -s-> 1 -rcs-> 2 -r, each step cnt=2, over 10 GB/s links (10_000 bytes/us), hop 2 us.
    # Slots of 32_000 bytes, 8 per iteration (256_000 bytes), 4 per slice: a slice holds
    # 128_000 data bytes and Simple cuts a call in 8 / 4 = 2 slices, none smaller than 1/32 of
    # a slice (4000 bytes): g = min(call, max(call / 2, 4000), 128_000).
    # A 2000-byte buffer of 2 chunks: 1000-byte chunks, each transfer (and call) 2000 bytes,
    # under the 4000-byte floor, so it travels as one slice of 2000 bytes (g = 2000): the
    # forward can pass nothing on before all of it has arrived, and the last receive copies
    # all of it out of its FIFO once it is in. With k = 1 slice of g / r = 0.2 us:
    # 2 alpha + (k + 1) g / r for the chain, + g / r for that copy = 4 + 3 x 0.2 = 4.6 us after
    # the base of 4 us. (Cut in 2 slices of 1000 it would be 4 + 4 x 0.1 = 4.4; moving one
    # 4000-byte floor slice, 4 + 0.4 + 0.2 + 0.4 = 5.0.)
    def tb(send, recv, op):
        return ThreadBlock(0, send, recv, 0, (XmlStep(0, op, "i", 0, "o", 0, 2),))
    p = _custom("fwd", 3, 2, [tb(1, -1, "s"), tb(2, 0, "rcs"), tb(-1, 1, "r")])
    c = constants(base=4.0, hop=2.0, slot=32_000, chunk_slots=8, slice_slots=4, fifo=64)
    assert simulate_program(p, line(3, 10.0), 2000, c).time_us == pytest.approx(4.0 + 4.6)
    # 20_000 bytes: each transfer (and call) 20_000 bytes, above the floor: 2 slices of
    # 10_000 (k = 2, 1 us each): 2 alpha + (k + 1) g / r + g / r = 4 + 4 x 1 = 8 us.
    assert simulate_program(p, line(3, 10.0), 20_000, c).time_us == pytest.approx(4.0 + 8.0)
    # 512_000 bytes: each transfer and call 512_000 bytes, half of it above a slice: slices of
    # 128_000 (k = 4, 12.8 us each): 4 + (4 + 1 + 1) x 12.8 = 80.8 us.
    assert simulate_program(p, line(3, 10.0), 512_000, c).time_us == pytest.approx(4.0 + 80.8)


# -- composition: the reversed topology transposes the links inside each node ----------------------


def test_a_reversed_composition_transposes_each_nodes_links():
    # A directed 3-ring node (0 -> 1 -> 2 -> 0), two copies. Reversing a topology reverses
    # every link: the reversed copy has 1 -> 0 and no 0 -> 1, inside each node.
    node = Topology("dir3", ((0, 1, 0), (0, 0, 1), (1, 0, 0)))
    composed = compose_nodes(node, 2, nic_units=1)
    back = composed.reversed()
    for a in range(6):
        for b in range(6):
            assert back.bandwidth(a, b) == composed.bandwidth(b, a), (a, b)
    assert (back.bandwidth(1, 0), back.bandwidth(0, 1)) == (1, 0)
    assert (back.bandwidth(4, 3), back.bandwidth(3, 4)) == (1, 0)


# -- composition: a NIC down to 1/8 of a unit is expressed by rescaling (MAX_RESCALE = 8) ----------


def test_a_nic_of_one_eighth_of_a_unit_rescales_by_eight():
    # unit 100 GB/s, NIC 12.5 GB/s = 1/8 unit exactly: "rounded to the nearest fraction of a
    # unit with denominator MAX_RESCALE (8) or less", so 1/8 itself: every bandwidth x 8, the
    # NIC 1 unit of 12.5 GB/s.
    node = Topology("two", ((0, 1), (1, 0)), unit_gbps=100.0,
                    metadata={"nic": {"per_gpu": True, "gbps": 12.5}})
    composed = compose_nodes(node, 2)
    assert composed.metadata["network"]["rescale"] == 8
    assert composed.unit_gbps == pytest.approx(12.5)
    assert composed.bandwidth(0, 1) == 8 and composed.bandwidth(0, 2) == 1


# -- collectives: nccl-tests' bus-bandwidth factors of the rooted kinds -----------------------------


def test_gather_and_scatter_count_bus_bandwidth_as_allgather_does():
    from fractions import Fraction

    from collsynth.collective.kinds import busbw_factor

    # busbw_factor's documented table: gather and scatter (n-1)/n like allgather (the root's
    # buffer holds one part per rank, n-1 of which cross a link); broadcast and reduce 1.
    for name in ("gather", "scatter", "allgather"):
        assert busbw_factor(name, 4) == Fraction(3, 4), name
    for name in ("broadcast", "reduce"):
        assert busbw_factor(name, 4) == 1, name


def test_the_rooted_kinds_hold_as_many_base_chunks_as_their_collective_has():
    from collsynth.collective import standard_collective
    from collsynth.collective.kinds import base_chunk_bytes, buffer_chunks

    # nccl-tests' size of a rooted call is the root's buffer: for broadcast and reduce the one
    # buffer every rank sends or sums (the collective has 1 chunk), for gather and scatter one
    # part per rank (n chunks). Another formulation: the standard collective's own chunk count.
    for kind in ("broadcast", "reduce", "gather", "scatter"):
        assert buffer_chunks(kind, 4) == standard_collective(kind, 4).num_chunks, kind
    assert [buffer_chunks(k, 4) for k in ("broadcast", "reduce", "gather", "scatter")] == \
        [1, 1, 4, 4]
    assert base_chunk_bytes("reduce", 4, 4096) == 4096
    assert base_chunk_bytes("gather", 4, 4096) == 1024


# -- collectives: duals and rooted layouts ---------------------------------------------------------


def test_the_dual_of_a_rooted_reduce_is_the_broadcast_from_that_root():
    from collsynth.collective import broadcast, reduce
    from collsynth.collective.duality import non_combining_dual

    # Reversing a reduction tree to rank 2 gives a broadcast tree from rank 2: same chunk,
    # starting on the root, needed by every rank, and the same root.
    dual = non_combining_dual(reduce(4, root=2))
    bcast = broadcast(4, root=2)
    assert (dual.precondition, dual.postcondition, dual.roots) == \
        (bcast.precondition, bcast.postcondition, bcast.roots) == \
        ((frozenset({2}),), (frozenset(range(4)),), (2,))


def test_a_chunk_nobody_needs_has_no_non_combining_dual():
    from collsynth.collective.duality import has_non_combining_dual, non_combining_dual
    from collsynth.collective.model import Collective
    from collsynth.errors import InvalidCollectiveError

    # "each chunk has exactly one destination": a chunk with none has no dual (its dual chunk
    # would start on no rank), so the predicate and the construction agree on refusing it.
    c = Collective("half", 2, (frozenset({0, 1}), frozenset({0, 1})),
                   (frozenset({0}), frozenset()), combining=True)
    assert not has_non_combining_dual(c)
    with pytest.raises(InvalidCollectiveError):
        non_combining_dual(c)


def test_multiroot_scatter_takes_chunk_r_k_plus_i_from_root_i():
    from collsynth.collective.standard import multiroot_scatter

    # Its docstring: chunk r*k + i goes from roots[i] to rank r (k = len(roots)). 4 ranks,
    # roots (1, 3): chunk 0 from 1 to 0, chunk 1 from 3 to 0, chunk 2 from 1 to 1, ...
    c = multiroot_scatter(4, (1, 3))
    assert c.precondition == tuple(frozenset({(1, 3)[i]}) for r in range(4) for i in range(2))
    assert c.postcondition == tuple(frozenset({r}) for r in range(4) for i in range(2))
    assert c.precondition[:3] == (frozenset({1}), frozenset({3}), frozenset({1}))


# -- grouped send/recv: NCCL's p2p rules (docs/runtime-model.md, "Grouped send/recv") -------------


def _a100_setup(nodes: int = 1, **changes):
    import dataclasses

    from collsynth.timing.tuning_model import tuning_setup
    from collsynth.topology import get_topology

    topology = get_topology("dgx-a100")
    if nodes > 1:
        topology = compose_nodes(topology, nodes)
    setup = tuning_setup(topology, version=changes.pop("version", None))
    return dataclasses.replace(setup, **changes) if changes else setup


def test_p2p_runs_ll_up_to_and_including_16_kib_per_channel():
    from collsynth.timing.p2p_tuning import p2p_shape

    # "LL up to 16 KiB per channel": one DGX-A100 (8 ranks), an operation of 16384 bytes per
    # peer (a 131072-byte alltoall) runs on one part (at least 512 KiB / 8 = 64 KiB per part),
    # so 16384 bytes on its channel: LL. 8 bytes more per peer: Simple.
    s = _a100_setup()
    assert p2p_shape(s, 8 * 16384, intra_peer_channels=24).protocol == "LL"
    assert p2p_shape(s, 8 * 16384 + 64, intra_peer_channels=24).protocol == "Simple"


def test_p2p_across_nodes_runs_a_part_per_64_kib():
    from collsynth.timing.p2p_tuning import p2p_shape

    # Across nodes "a part is at least the 128 KiB network chunk / 2" = 64 KiB. Two DGX-A100
    # (16 ranks) with 64 p2p channels (NCCL 2.28: at most 64): a network peer gets 2 channels
    # (2 x 16 ranks <= 4 x 64), the fewest per operation 2 (2 x 16 <= 64). 40_000 bytes per
    # peer: one part; 65_536: still one; 65_537: two.
    s = _a100_setup(2, version=(2, 28), comm_channels=64)
    parts = [p2p_shape(s, 16 * per_op, intra_peer_channels=24).parts
             for per_op in (40_000, 65_536, 65_537)]
    assert parts == [1, 1, 2]


def test_p2p_channels_reach_64_from_nccl_2_25():
    from collsynth.timing.p2p_tuning import p2p_channel_count

    # "p2pnChannels is the communicator's channels rounded up to a power of two (at most 32,
    # 64 from 2.25)": 64 communicator channels give 64 on 2.25, 32 on 2.24.
    assert p2p_channel_count(_a100_setup(version=(2, 25), comm_channels=64)) == 64
    assert p2p_channel_count(_a100_setup(version=(2, 24), comm_channels=64)) == 32


# -- foreign programs: the runtime's path through an NVSwitch without groups ----------------------


def test_an_nvswitch_path_without_groups_uses_the_senders_out_and_the_receivers_in_links():
    from collsynth.timing.paths import runtime_path

    # docs/runtime-model.md, "Foreign programs": through the switch on the two GPUs' ports,
    # "without groups, the sum of their links". Rank 0 has no link to 1. Rank 0's port out is
    # its links out: 0->2 = 1 unit (10 GB/s); rank 1's port in is its links in: 0->1 + 2->1 =
    # 0 + 2 = 2 units (20 GB/s), not its 3 units out (1->2).
    links = ((0, 0, 1), (0, 0, 3), (1, 2, 0))
    sw = Topology("sw3", links, unit_gbps=10.0,
                  metadata={"machine": {"nvswitch": True, "arch": "sm80"}})
    path = runtime_path(sw, 0, 1)
    assert path.via == "the NVSwitch"
    assert [gbps for _, _, gbps in path.own] == [10.0, 20.0]


def test_links_between_nodes_keep_their_nominal_rate_on_an_nvlink_machine():
    from collsynth.timing.paths import Fabric
    from collsynth.topology import get_topology

    # docs/runtime-model.md, "Sustained NVLink": inside a node an NVLink unit carries NCCL's
    # 20.6 GB/s on sm90; "links between nodes keep their nominal rate". Two DGX-H100 (unit
    # 25 GB/s; a 400 Gb/s NIC per GPU = 50 GB/s = 2 units): the link 0 -> 8 and its NIC groups
    # carry 2 x 25 = 50 GB/s, while 0 -> 1 (18 NVLinks) carries 18 x 20.6 = 370.8.
    fabric = Fabric(compose_nodes(get_topology("dgx-h100"), 2))
    across = fabric.route(0, 8)
    assert [fabric.capacity_gbps[r] for r in across.resources] == [50.0, 50.0, 50.0]
    inside = fabric.route(0, 1)
    assert fabric.capacity_gbps[inside.resources[0]] == pytest.approx(370.8)


def test_a_path_between_nodes_without_groups_runs_at_the_machines_nic_rate():
    import copy

    from collsynth.timing.paths import runtime_path
    from collsynth.topology.families import ring

    # "ranks of different nodes: through their NICs (...; without groups, each NIC at the
    # machine's NIC GB/s)": two 2-rank nodes whose links between nodes (and groups) are gone,
    # NICs of 25 GB/s on a 10 GB/s unit: the NICs run at 25, not at one unit's 10.
    two = compose_nodes(ring(2), 2, nic_units=1)
    meta = copy.deepcopy(dict(two.metadata))
    meta["network"]["nic_gbps"] = 25.0
    links = tuple(tuple(two.links[a][b] if a // 2 == b // 2 else 0 for b in range(4))
                  for a in range(4))
    cut = Topology("cut", links, unit_gbps=10.0, metadata=meta)
    path = runtime_path(cut, 0, 2)
    assert path.via == "the NICs"
    assert [gbps for _, _, gbps in path.own] == [25.0, 25.0]


# -- constants: the FIFO window counts data bytes, not wire bytes ----------------------------------


def test_the_fifo_window_holds_data_bytes_of_each_protocol():
    from collsynth.runtimes import get_runtime
    from collsynth.runtimes.protocols import BUFFER_BYTES

    # "Data bytes a sender may have in flight on one connection": the whole FIFO (8 slots of
    # NCCL_BUFFSIZE / 8, LL's 512 KiB, LL128's 4.6875 MiB of wire) times the protocol's data
    # share: LL 8 of 16 bytes, LL128 120 of 128, Simple all.
    c = get_runtime("nccl").defaults
    assert c.window_bytes("LL") == 512 * 1024 // 2 == BUFFER_BYTES["LL"] // 2
    assert c.window_bytes("LL128") == BUFFER_BYTES["LL128"] * 120 / 128
    assert c.window_bytes("Simple") == 4 * 1024 * 1024


def test_class_hop_latencies_are_the_runtimes_own_ring_rows():
    from collsynth.runtimes.constants import (CLASS_LATENCY_US, NCCL_HOP_LATENCY_US,
                                              RCCL_HOP_LATENCY_US)

    # Their documented sources: NCCL's hwLat ring rows for NVLink, PCI and the network (IB),
    # RCCL's tuning model 5 NVLINK ring row for xGMI (gfx942); the other networks add a
    # per-hop figure to IB's: EFA 25, RoCE 5, Slingshot 2.8, TCP 7.5 us.
    assert CLASS_LATENCY_US["nvlink"] == NCCL_HOP_LATENCY_US["nvlink"]["ring"]
    assert CLASS_LATENCY_US["pcie"] == NCCL_HOP_LATENCY_US["pci"]["ring"]
    assert CLASS_LATENCY_US["ib"] == NCCL_HOP_LATENCY_US["net"]["ring"]
    assert CLASS_LATENCY_US["xgmi"] == RCCL_HOP_LATENCY_US[5]["nvlink"]["ring"] == (0.8, 0.8, 2.1)
    ib = CLASS_LATENCY_US["ib"]
    for network, extra in (("efa", 25.0), ("roce", 5.0), ("slingshot", 2.8), ("tcp", 7.5)):
        assert CLASS_LATENCY_US[network] == pytest.approx(tuple(h + extra for h in ib)), network


def test_the_documented_defaults_come_from_each_runtimes_ring_rows():
    from collsynth.runtimes import get_runtime

    # NCCL: ring baseLat (6.6, 14, 8.4); hwLat ring NVLink (0.6, 1.9, 3.4) inside a node and
    # NET (2.7, 4, 14) between nodes. RCCL: baseLat (12, 12, 17); tuning model 0's ring rows,
    # NVLINK (0.8, 2.2, 3.6) for xGMI and NET (9.5, 19.8, 15.1) (src/graph/tuning.cc).
    def rows(c):
        order = ("LL", "LL128", "Simple")
        return (tuple(c.base_latency_us[p] for p in order),
                tuple(c.hop_latency_us["intra"][p] for p in order),
                tuple(c.hop_latency_us["network"][p] for p in order))
    assert rows(get_runtime("nccl").defaults) == \
        ((6.6, 14.0, 8.4), (0.6, 1.9, 3.4), (2.7, 4.0, 14.0))
    assert rows(get_runtime("rccl").defaults) == \
        ((12.0, 12.0, 17.0), (0.8, 2.2, 3.6), (9.5, 19.8, 15.1))


def test_an_iteration_is_chunksteps_slots_and_a_slice_slicesteps_slots():
    from collsynth.runtimes import get_runtime

    # docs/runtime-model.md: the interpreter loops in iterations of MSCCL_CHUNKSTEPS slots
    # (Simple: 4 slots of NCCL_BUFFSIZE / 8 = 512 KiB, so 2 MiB; LL: one slot, 64 KiB of wire
    # = 32 KiB of data), each transfer moving slices of MSCCL_SLICESTEPS slots (Simple: 2,
    # 1 MiB).
    c = get_runtime("nccl").defaults
    assert c.iteration_bytes("Simple") == 2 * 1024 * 1024
    assert c.slice_bytes("Simple") == 1024 * 1024
    assert c.iteration_bytes("LL") == 32 * 1024


def test_ll128_carries_120_data_bytes_of_every_128_on_the_wire():
    from tests.timing.test_runtime_model import program

    # docs/runtime-model.md, step 4: links carry wire bytes; LL's lines are half flags, LL128's
    # 120 of 128 bytes are data. 120_000 data bytes over a 10 GB/s link: LL128 sends 128_000
    # wire bytes, 12.8 us; LL 240_000, 24 us; plus hop 2 and base 4.
    p = program(2, {0: [(1, -1, 0, ["s"])], 1: [(-1, 0, 0, ["r"])]}, proto="LL128")
    c = constants(base=4.0, hop=2.0)
    assert simulate_program(p, line(2, 10.0), 120_000, c).time_us == pytest.approx(18.8)
    assert simulate_program(p, line(2, 10.0), 120_000, c, protocol="LL").time_us == \
        pytest.approx(30.0)


# -- calibration: where the measured curve switches protocol ---------------------------------------


def test_a_drop_at_exactly_min_bytes_is_a_protocol_switch():
    from collsynth.timing.runtime_fit import protocol_split

    # "a drop below min_bytes (another algorithm taking over at tiny sizes) is not one": the
    # drop 300 -> 200 at 4096 bytes is not below 4096, so LL runs up to 2048 and Simple from
    # 4096; at 2048 (the same drop one size earlier) it is ignored.
    times = [100, 120, 300, 200, 400]
    assert protocol_split(times, sizes=[512, 1024, 2048, 4096, 8192]) == \
        ["LL", "LL", "LL", "Simple", "Simple"]
    assert protocol_split(times, sizes=[256, 512, 1024, 2048, 4096]) == ["Simple"] * 5


def test_ring_traffic_per_rank_is_nccl_tests_bus_factor():
    from collsynth.collective.kinds import busbw_factor
    from collsynth.timing.runtime_fit import _traffic_per_rank

    # Bytes one rank sends per byte of the size on its ring: allreduce 2(n-1)/n, allgather and
    # reduce-scatter (n-1)/n; the same figures as nccl-tests' bus-bandwidth factors, which are
    # defined as that traffic. Broadcast and reduce: 1.
    for collective in ("allreduce", "allgather", "reduce_scatter"):
        assert _traffic_per_rank(collective, 8) == pytest.approx(
            float(busbw_factor(collective, 8))), collective
    assert _traffic_per_rank("reduce_scatter", 8) == pytest.approx(7 / 8)
    assert _traffic_per_rank("broadcast", 8) == 1.0


def test_a_ring_fit_records_each_protocol_up_to_its_last_measured_size():
    from collsynth.timing.runtime_fit import fit_runtime
    from collsynth.topology import get_topology
    from collsynth.topology.builtins import with_figures

    # default_protocols are ((max_bytes, protocol), ...): LL measured at 1024 and 4096, Simple
    # from 65536, so LL up to 4096 (its last size) and Simple above; the fitted constants give
    # back the measured protocol at every measured size.
    ring4 = with_figures(get_topology("ring:4"), unit_gbps=10.0, alpha_us=2.0)
    rows = [(1024, 20.0), (4096, 22.0), (65536, 30.0), (1 << 20, 150.0)]
    used = ["LL", "LL", "Simple", "Simple"]
    fit = fit_runtime(rows, ring4, "allgather", runtime="nccl", channels=1, protocols=used,
                      held_out=False)
    assert fit.constants.default_protocols == ((4096, "LL"), (None, "Simple"))
    assert [fit.constants.default_protocol(s) for s, _ in rows] == used


def test_the_held_out_error_scores_the_odd_sizes_on_a_fit_of_the_even_ones():
    from collsynth.timing.runtime_fit import fit_runtime
    from collsynth.topology import get_topology
    from collsynth.topology.builtins import with_figures

    # RuntimeFit: "held_out_gmae (fit on the even-indexed sizes, scored on the odd ones)". The
    # even sizes lie on an exact line the fit reproduces; the odd ones are 3 times that line,
    # so the held-out score is that of a 3x miss (an error of at least 2/3 however it is
    # normalised), though a score of the even sizes themselves would be about 0.
    ring4 = with_figures(get_topology("ring:4"), unit_gbps=10.0, alpha_us=2.0)
    sizes = [1 << k for k in range(14, 22)]
    rows = [(s, (20.0 + s / 4000) * (3 if i % 2 else 1)) for i, s in enumerate(sizes)]
    fit = fit_runtime(rows, ring4, "allgather", runtime="nccl", channels=1,
                      protocols=["Simple"] * len(rows))
    assert fit.held_out_gmae is not None and fit.held_out_gmae > 0.6


def test_a_constant_at_an_open_low_end_is_not_at_a_bound():
    from collsynth.timing.runtime_fit import FittedConstant

    # open_low: "the low end is a natural value ("none"), not a limit a fit can press
    # against": 0 host work at a range [0, 100] is no warning; the high end still is.
    assert not FittedConstant("host_us", 0.0, 0.0, 100.0, "why", open_low=True).at_bound
    assert FittedConstant("host_us", 0.0, 0.0, 100.0, "why").at_bound
    assert FittedConstant("host_us", 100.0, 0.0, 100.0, "why", open_low=True).at_bound


def test_a_host_term_at_the_fits_floor_is_none():
    from collsynth.timing.runtime_fit import _HOST_FLOOR_US, _host_us

    # "The host terms' lower end in the fit: at or below it, none."
    assert _host_us(_HOST_FLOOR_US) == 0.0
    assert _host_us(_HOST_FLOOR_US / 2) == 0.0
    assert _host_us(0.5) == 0.5


# -- the runtime's own algorithms: RCCL's rules (docs/runtime-tuning.md) ---------------------------


def test_rccl_runs_no_tree_simple_on_one_gfx942_or_gfx950_node():
    from collsynth.timing.tuning_model import enabled, tuning_setup
    from collsynth.topology import get_topology

    # docs/runtime-tuning.md, RCCL: "no Tree Simple on one gfx942/gfx950 node"; gfx90a keeps it.
    on = {name: enabled(tuning_setup(get_topology(name), runtime="rccl"), "allreduce", "tree",
                        "Simple")
          for name in ("mi300x", "mi355x", "mi250")}
    assert on == {"mi300x": False, "mi355x": False, "mi250": True}


def test_blackwell_caps_before_nccl_2_28_are_twice_the_hopper_rows():
    from collsynth.timing.tuning_model import _PER_CH_TREE, _cap, tuning_setup
    from collsynth.topology import get_topology

    # docs/runtime-tuning.md, "Versions", its row for NCCL < 2.28: Blackwell caps twice the
    # Hopper rows (2.25-2.27).
    # The per-channel tree cap on one node: Hopper's 38.7, so 77.4 on 2.26; 2.28 has
    # Blackwell's own row, 70.0.
    b200 = get_topology("dgx-b200")
    assert _PER_CH_TREE[2][0] == 38.7 and _PER_CH_TREE[3][0] == 70.0
    assert _cap(_PER_CH_TREE, tuning_setup(b200, version=(2, 26))) == pytest.approx(77.4)
    assert _cap(_PER_CH_TREE, tuning_setup(b200, version=(2, 28))) == 70.0


# -- topology import: PCIe generations ---------------------------------------------------------


def test_pcie_gen2_still_uses_8b_10b_encoding():
    from collsynth.topology.importers._common import pcie_gbps

    # "Gen1/2 (2.5, 5 GT/s) use 8b/10b encoding, Gen3 and later 128b/130b": x16 Gen2 moves
    # 5 x 16 x 0.8 / 8 = 8 GB/s; Gen1 4; Gen3 8 x 16 x 128/130 / 8 = 15.75.
    assert pcie_gbps("5.0 GT/s PCIe", "16") == pytest.approx(8.0)
    assert pcie_gbps("2.5 GT/s PCIe", "16") == pytest.approx(4.0)
    assert pcie_gbps("8.0 GT/s PCIe", "16") == pytest.approx(8 * 16 * 128 / 130 / 8)


def test_components_ignore_the_direction_of_links():
    from collsynth.topology.importers._common import components

    # "connected components of the link graph, ignoring direction": a link 1 -> 0 alone joins
    # 0 and 1, whichever rank the search starts from.
    assert components([[0, 0, 0], [1, 0, 0], [0, 0, 0]]) == [[0, 1], [2]]
    assert components([[0, 0, 0], [0, 0, 0], [0, 1, 0]]) == [[0], [1, 2]]


def test_switch_groups_judge_egress_and_ingress_limits_separately():
    from collsynth.topology.importers._common import switch_groups

    # "Ranks with no peers or a limit below 1 get no group", each direction on its own limit:
    # rank 0 sends nothing through the switch (egress 0) but receives 12; rank 1 the reverse.
    groups = switch_groups([[1], [0]], [0, 12], ingress_limits=[12, 0])
    assert [(g.name, g.limit) for g in groups] == [("rank 0 switch ingress", 12),
                                                   ("rank 1 switch egress", 12)]


def test_numeric_gcn_names_give_the_same_xgmi_rate():
    from collsynth.topology.importers._common import xgmi_gbps_for_gcn

    # RCCL writes the gcn as "gfx942" or as its number "942" (MI300: 64 GB/s per link), and
    # "910" for gfx90a (MI200: 50).
    assert xgmi_gbps_for_gcn("942") == xgmi_gbps_for_gcn("gfx942") == 64.0
    assert xgmi_gbps_for_gcn("910") == xgmi_gbps_for_gcn("gfx90a") == 50.0


# -- the executor's schedule: a forward sends in the level after its receive (docs/executor.md) ----


def test_a_forwarding_step_sends_in_the_next_level():
    from collsynth.executor.program import schedule

    # 0 -s-> 1 -rcs-> 2 -r. "sends of s steps read memory now; rcs/rrs/rrcs forward in the next
    # level what they received", and every message is sent and received in the same level:
    # s sends in level 0, rcs receives in 0 and forwards in 1, r receives in 1.
    def tb(send, recv, op):
        return ThreadBlock(0, send, recv, 0, (XmlStep(0, op, "i", 0, "o", 0, 1),))
    p = _custom("fwd", 3, 1, [tb(1, -1, "s"), tb(2, 0, "rcs"), tb(-1, 1, "r")])
    sched = schedule(p)
    assert sched.aligned
    assert [(op.type, op.level) for op in sched.ops] == [("s", 0), ("rcs", 0), ("r", 1)]
    assert [op.send_level for op in sched.ops[:2]] == [0, 1]


def test_alignment_delays_a_forward_whose_receiver_is_late():
    from collsynth.executor.program import schedule

    # Rank 2's tb 1 receives from rank 1 only after its tb 0 received from the chain
    # 5 -s-> 4 -rcs-> 3 -rcs-> 2 (levels: 4 forwards in 1, 3 in 2, so tb 0 receives in 2).
    # Rank 1's rcs receives from rank 0 in level 0 and would forward in 1, a level before its
    # receiver can take it; aligning ("every message sent and received in the same level")
    # delays the forward by one level, to 2.
    def st(op, **kw):
        return XmlStep(0, op, "i", 0, "o", 0, 1, **kw)

    def one(rank, send, recv, op):
        return GpuProgram(rank, 1, 1, 0, (ThreadBlock(0, send, recv, 0, (st(op),)),))
    g2 = GpuProgram(2, 1, 1, 0, (ThreadBlock(0, -1, 3, 0, (st("r", hasdep=1),)),
                                 ThreadBlock(1, -1, 1, 0, (st("r", depid=0, deps=0),))))
    p = Program("late", "Simple", 1, 1, 6, "custom", 0,
                (one(0, 1, -1, "s"), one(1, 2, 0, "rcs"), g2, one(3, 2, 4, "rcs"),
                 one(4, 3, 5, "rcs"), one(5, 4, -1, "s")))
    sched = schedule(p)
    assert sched.aligned
    forward = next(op for op in sched.ops if op.step.rank == 1)
    assert (forward.level, forward.delay, forward.send_level) == (0, 1, 2)
    assert [op.level for op in sched.ops if op.step.rank == 2] == [2, 2]


# -- plan buckets: the longest setup prefix tried is max_setup itself ------------------------------


def test_find_steps_tries_a_setup_prefix_of_exactly_max_setup_calls():
    from collsynth.plan.buckets import StepStructure, find_steps

    # "Tries setup prefixes of 0, 1, ... max_setup calls": with max_setup = 2, "xy" then two
    # repetitions of "AB"; with max_setup = 1 no prefix makes the rest repeat.
    assert find_steps(list("xyABAB"), max_setup=2) == StepStructure(2, 2, 2, 0, True)
    assert not find_steps(list("xyABAB"), max_setup=1).found


# -- large-system engines: the exact engine reports the composed allreduce bound -------------------


def test_the_exact_engine_bounds_an_allreduce_by_its_composition():
    from fractions import Fraction

    from collsynth.collective import standard_collective
    from collsynth.synthesis.large import solve_large
    from collsynth.topology import get_topology

    # collsynth's allreduce is a reduce-scatter then an allgather, so its bound is the composed
    # one, (R_rs + R_ag) / |P| (bounds.core): on the bidirectional ring:4 each rank receives 3
    # of the 4 parts over its 2 incoming links in each half, 3/2 rounds each, so
    # (3/2 + 3/2) / 4 = 3/4 rounds per chunk; the exact engine's schedule reaches it.
    result = solve_large(get_topology("ring:4"), standard_collective("allreduce", 4),
                         engine="exact", time_limit=60)
    assert result.lower_bound == Fraction(3, 4)
    assert result.rounds_per_chunk == Fraction(3, 4)


# -- MSCCL++ plans: the message size an allgather is checked against is its output --------------


def test_an_allgathers_message_size_is_its_output_buffer():
    from pathlib import Path

    from collsynth.export.mscclpp import read_plan
    from collsynth.export.mscclpp.geometry import message_bytes

    # docs/mscclpp.md: the executor compares min/max_message_size with "the input size, or the
    # output size for an allgather" (checkMessageSize). The 2-GPU DSL allgather: 1 input chunk,
    # 2 output chunks per rank; at 1024-byte chunks its message is 2048 bytes, not 1024.
    plan = read_plan(Path(__file__).resolve().parents[1] / "data" / "mscclpp-plans"
                     / "sn_allgather_2gpu.json")
    assert (plan.collective, plan.gpus[0].input_chunks, plan.gpus[0].output_chunks) == \
        ("allgather", 1, 2)
    assert message_bytes(plan, 1024) == 2048


def test_a_reused_double_scratch_gives_each_call_half_of_the_shared_scratch():
    import dataclasses
    from pathlib import Path

    from collsynth.export.mscclpp import read_plan
    from collsynth.export.mscclpp.geometry import geometry

    # docs/mscclpp.md: reuse_resources gives "a shared 128 MiB scratch", use_double_scratch_buffer
    # "two scratch halves used by alternate calls": a call's scratch is 64 MiB with both, the
    # whole 128 MiB without the halves.
    plan = read_plan(Path(__file__).resolve().parents[1] / "data" / "mscclpp-plans"
                     / "sn_allreduce_pipeline.json")
    assert plan.reuse_resources and plan.gpus[0].scratch_chunks > 0
    for double, mib in ((False, 128), (True, 64)):
        p = dataclasses.replace(plan, use_double_scratch_buffer=double)
        assert geometry(p, 1024).capacity(p, 0, "s") == mib << 20, double


# -- curve calibration: the egress units a bus bandwidth is spread over --------------------------


def test_egress_units_cap_a_rank_by_its_own_groups_plus_links_outside_them():
    from collsynth.timing.calibration import egress_units
    from collsynth.topology.model import BandwidthGroup

    # "its outgoing link units, capped by every bandwidth group whose only source is that rank
    # (the cap covers the group's destinations; links to other ranks add to it); the least over
    # the ranks". Every rank but 0 sends 2 units to each other rank (6 in all).
    links = ((0, 1, 1, 1), (2, 0, 2, 2), (2, 2, 0, 2), (2, 2, 2, 0))
    # Rank 0's own group caps its links to 1 and 2 at 1 unit; its link to 3 adds 1: 2 units.
    own = Topology("own", links, groups=(BandwidthGroup(frozenset({0}), frozenset({1, 2}), 1),))
    assert egress_units(own) == 2
    # A group of two sources (0 and 1) is not one rank's cap: rank 0 keeps its 3 units.
    shared = Topology("shared", links,
                      groups=(BandwidthGroup(frozenset({0, 1}), frozenset({2, 3}), 1),))
    assert egress_units(shared) == 3


# -- runtimes: the protocols each runs --------------------------------------------------------------


def test_mscclpp_and_rccl_run_no_ll128_by_default():
    from collsynth.runtimes import get_runtime

    # docs/mscclpp.md: a plan's protocol is "Simple or LL"; RCCL leaves LL128 off on most AMD
    # GPUs (Runtime.protocols). NCCL runs all three, in its own order.
    assert get_runtime("mscclpp").protocols == ("LL", "Simple")
    assert get_runtime("rccl").protocols == ("LL", "Simple")
    assert get_runtime("nccl").protocols == ("LL", "LL128", "Simple")


def test_msccl_executor_runs_nccl_2_23s_own_algorithms():
    from collsynth.runtimes import get_runtime

    # msccl-executor is an NCCL 2.23.4 fork: NCCL 2.23's own algorithms, NVLS, NVLS-tree, PAT
    # and CollNet included; msccl (an NCCL 2.12 fork) and RCCL run rings and trees only.
    newer = {"nvls", "nvls_tree", "pat", "collnet_direct", "collnet_chain"}
    assert newer <= set(get_runtime("msccl-executor").own_algorithms)
    assert newer <= set(get_runtime("nccl").own_algorithms)
    assert not newer & set(get_runtime("msccl").own_algorithms)
