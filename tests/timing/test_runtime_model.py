"""The program model: hand-computed times of small programs, the runtime's ring as a program,
the constants file, and the MI250 calibration.

Every expected time below is worked out by hand from the model's definition
(docs/runtime-model.md): base latency once per call, a hop latency per transfer on the path,
bytes over the connection's rate (its ceiling, its FIFO window, its share of each link).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from collsynth.cli import main
from collsynth.errors import CollsynthError, FileFormatError, InvalidInstanceError
from collsynth.export.check import check_program
from collsynth.export.program import GpuProgram, Program, ThreadBlock, XmlStep
from collsynth.timing.runtime_baselines import ring_program
from collsynth.runtimes import PROTOCOLS, get_runtime
from collsynth.timing.calibration import (RuntimeCalibration, calibration_from_json,
                                          calibration_to_json, load_calibration,
                                          save_calibration)
from collsynth.timing.runtime_model import (SimulationOptions, indirect_note, prepare_program,
                                            simulate_program)
from collsynth.topology.model import Topology

ROOT = Path(__file__).resolve().parents[2]
MI250_CSV = ROOT / "data" / "measurements" / "mi250-16gcd-x2" / "rccl_all_gather_outofplace.csv"



def runtime_prices(collective, topology, sizes, constants, algorithm="ring"):
    """The runtime's own ``algorithm`` priced by the program model with ``constants``."""
    from collsynth.timing.pricing import RuntimeAlgorithm
    from collsynth.timing.program_model import ProgramModel

    subject = RuntimeAlgorithm(get_runtime(constants.runtime), algorithm, collective, topology)
    return ProgramModel(constants).price(subject, sizes)

def constants(*, base=4.0, hop=2.0, ceiling=None, slot=None, fifo=8, chunk_slots=4,
              slice_slots=2, gamma=0.0):
    """NCCL's defaults with the figures a test needs, the same for every protocol and class."""
    c = get_runtime("nccl").defaults
    return c.replace(
        base_latency_us={p: base for p in PROTOCOLS},
        hop_latency_us={k: {p: hop for p in PROTOCOLS} for k in ("intra", "network")},
        ceiling_gbps={k: {p: ceiling for p in PROTOCOLS} for k in ("intra", "network")},
        slot_bytes=dict(c.slot_bytes) if slot is None else {p: slot for p in PROTOCOLS},
        chunk_slots={p: chunk_slots for p in PROTOCOLS},
        slice_slots={p: slice_slots for p in PROTOCOLS}, fifo_slots=fifo,
        gamma_us_per_byte=gamma)


def line(n: int, gbps: float, units: int = 1) -> Topology:
    """Ranks 0 -> 1 -> ... -> n-1, ``units`` links per hop of ``gbps`` each."""
    links = [[units if b == a + 1 else 0 for b in range(n)] for a in range(n)]
    return Topology(f"line{n}", tuple(map(tuple, links)), unit_gbps=gbps, alpha_us=1.0)


def program(ngpus: int, tbs: dict[int, list[tuple[int, int, int, list[str]]]],
            nchannels: int = 1, proto: str = "Simple") -> Program:
    """A custom program of one chunk: ``tbs[rank] = [(send, recv, chan, ops), ...]``."""
    gpus = []
    for rank in range(ngpus):
        blocks = []
        for tid, (send, recv, chan, ops) in enumerate(tbs.get(rank, [])):
            steps = tuple(XmlStep(s, op, "i", 0, "o", 0, 1) for s, op in enumerate(ops))
            blocks.append(ThreadBlock(tid, send, recv, chan, steps))
        gpus.append(GpuProgram(rank, 1, 1, 0, tuple(blocks)))
    return Program("test", proto, nchannels, 1, ngpus, "custom", 0, tuple(gpus))


# -- hand-computed cases ------------------------------------------------------------------------


def test_ring_reduces_to_the_alpha_beta_closed_form():
    # ring:5 of 10 GB/s links (10_000 bytes/us), alpha 2 us, base 7 us; a 50_000-byte
    # allgather moves 10_000-byte chunks, under Simple's slice floor (1/32 of the 1 MiB slice,
    # 32_768 bytes): each moves as one slice, g = 10_000, no pipelining benefit.
    # Closed form: base + (n - 1) * (alpha + chunk * beta) = 7 + 4 * (2 + 1) = 19 us, plus
    # the last receiver's pass over its last slice once it is in its FIFO, g / r = 1 us (the
    # alpha-beta form does not count that copy): 20 us.
    n = 5
    links = [[1 if b == (a + 1) % n else 0 for b in range(n)] for a in range(n)]
    ring5 = Topology("ring5", tuple(map(tuple, links)), unit_gbps=10.0, alpha_us=2.0)
    p = ring_program("allgather", [tuple(range(n))], protocol="Simple")
    t = simulate_program(p, ring5, 50_000, constants(base=7.0, hop=2.0))
    assert t.time_us == pytest.approx(20.0, rel=1e-12)
    assert t.algbw_gbps == pytest.approx(50_000 / 20.0 / 1e3)
    assert t.busbw_gbps == pytest.approx(t.algbw_gbps * 4 / 5)


def test_a_send_costs_base_plus_hop_plus_bytes_over_the_ceiling():
    # 50_000 bytes through a 5 GB/s connection ceiling (the 100 GB/s link is not the limit):
    # 4 + 1.5 + 50_000 / 5_000 = 15.5 us, then the receive's pass over its last slice. Simple
    # cuts the 50_000-byte call in 2 but no finer than 1/32 of the 1 MiB slice:
    # g = min(50_000, max(25_000, 32_768)) = 32_768 bytes, 6.5536 us at 5_000 bytes/us:
    # 22.0536 us.
    p = program(2, {0: [(1, -1, 0, ["s"])], 1: [(-1, 0, 0, ["r"])]})
    t = simulate_program(p, line(2, 100.0), 50_000, constants(base=4.0, hop=1.5, ceiling=5.0))
    assert t.time_us == pytest.approx(4.0 + 1.5 + 10.0 + 32_768 / 5_000, rel=1e-12)


def test_a_simple_call_moves_in_two_slices_and_its_receive_copies_the_last_one_out():
    # prims_simple.h: a call is cut into SlicePerChunk = chunk_slots / slice_slots = 4 / 2 = 2
    # slices (none smaller than 1/32 of a full slice of 2 x 512 KiB = 1 MiB, 32_768 bytes),
    # and a plain receive takes a slice out of its FIFO only once the whole slice is in, at
    # the rate the connection moved it. One step, rank 0 -> rank 1 over a 10 GB/s link
    # (10_000 bytes/us, the FIFO window 8 x 512 KiB / (2 x 2 us) far above it), hop 2 us,
    # base 4 us. A 256 KiB call (C = 262_144 bytes): g = min(C, max(C / 2, 32_768), 1 MiB)
    # = 131_072; the send takes C / r = 26.2144 us, its last slice lands 2 us later and is
    # copied out in g / r = 13.1072 us: 4 + 2 + 26.2144 + 13.1072 = 45.3216 us. (In one slice
    # of the whole call it would be 4 + 2 + 2 x 26.2144 = 58.4288; with no copy out of the
    # FIFO 4 + 2 + 26.2144 = 32.2144.)
    p = program(2, {0: [(1, -1, 0, ["s"])], 1: [(-1, 0, 0, ["r"])]})
    c = constants(base=4.0, hop=2.0)
    assert c.slice_bytes("Simple") == 1 << 20 and c.slices_per_chunk("Simple") == 2
    t = simulate_program(p, line(2, 10.0), 256 * 1024, c)
    assert t.time_us == pytest.approx(4.0 + 2.0 + 262_144 / 10_000 + 131_072 / 10_000,
                                      rel=1e-12)


def test_a_simple_call_below_the_slice_floor_moves_as_one_slice():
    # The same send and receive with a 16 KiB call (C = 16_384 bytes): half of it (8_192) is
    # under the floor of 1/32 of the 1 MiB slice (32_768), so g = min(C, max(C / 2, 32_768))
    # = C, one slice: the send takes C / r = 1.6384 us and the receive copies the whole of it
    # out of its FIFO after it lands, C / r again: 4 + 2 + 2 x 1.6384 = 9.2768 us. (In two
    # slices of 8_192 bytes it would be 4 + 2 + 1.6384 + 0.8192.)
    p = program(2, {0: [(1, -1, 0, ["s"])], 1: [(-1, 0, 0, ["r"])]})
    t = simulate_program(p, line(2, 10.0), 16 * 1024, constants(base=4.0, hop=2.0))
    assert t.time_us == pytest.approx(4.0 + 2.0 + 2 * 16_384 / 10_000, rel=1e-12)
    # A 48 KiB call: half of it (24_576) is under the floor, so its slice is the floor itself,
    # 32_768 bytes (not the whole call): 4 + 2 + 4.9152 + 3.2768. The model charges every slice
    # of a call the same size (NCCL's second slice here is the remaining 16 KiB).
    t = simulate_program(p, line(2, 10.0), 48 * 1024, constants(base=4.0, hop=2.0))
    assert t.time_us == pytest.approx(4.0 + 2.0 + 49_152 / 10_000 + 32_768 / 10_000, rel=1e-12)


def test_a_receive_across_nodes_copies_its_last_slice_at_a_connections_rate_inside_a_node():
    # The 256 KiB call of the test above with its one hop on the network: the NIC's share
    # (here the 10 GB/s link) sets the send's rate, but the copy out of the FIFO is the
    # receiving thread block's own work, which the constants rate at 20 GB/s per connection
    # inside a node: g / 20_000 = 6.5536 us, not g / r = 13.1072. 4 + 2 + 26.2144 + 6.5536 =
    # 38.768 us. Inside a node the same constants copy at the rate the writer moved it (the
    # link's 10 GB/s under the 20 GB/s ceiling): 45.3216; with no ceiling inside a node
    # nothing says a thread block's rate, and across nodes the copy runs at the connection's.
    import dataclasses

    import numpy as np

    p = program(2, {0: [(1, -1, 0, ["s"])], 1: [(-1, 0, 0, ["r"])]})
    c = constants(base=4.0, hop=2.0)
    c20 = c.replace(ceiling_gbps={"intra": {q: 20.0 for q in PROTOCOLS},
                                  "network": {q: None for q in PROTOCOLS}})
    prep = prepare_program(p, line(2, 10.0))
    network = dataclasses.replace(prep, link_class=np.where(prep.link_class >= 0, 1, -1))
    size = 256 * 1024
    assert simulate_program(network, None, size, c20).time_us == pytest.approx(
        4.0 + 2.0 + 262_144 / 10_000 + 131_072 / 20_000, rel=1e-12)
    assert simulate_program(prep, None, size, c20).time_us == pytest.approx(
        4.0 + 2.0 + 262_144 / 10_000 + 131_072 / 10_000, rel=1e-12)
    assert simulate_program(network, None, size, c).time_us == pytest.approx(
        4.0 + 2.0 + 262_144 / 10_000 + 131_072 / 10_000, rel=1e-12)


def two_channel_send() -> Program:
    return program(2, {0: [(1, -1, 0, ["s"]), (1, -1, 1, ["s"])],
                       1: [(-1, 0, 0, ["r"]), (-1, 0, 1, ["r"])]}, nchannels=2)


def test_a_bandwidth_factor_scales_every_rate_and_no_latency():
    # The runtime reaching half of every rate (NCCL's tree correction at some sizes): the
    # 100_000 bytes of a send over a 10 GB/s link take 20 us instead of 10, and the receive's
    # pass over its last slice (g = min(100_000, max(50_000, 32_768)) = 50_000 bytes) 10 us
    # instead of 5: 4 + 1 + 20 + 10 = 35. Through a 5 GB/s ceiling 40 + 20 instead of 20 + 10:
    # 4 + 1 + 40 + 20 = 65. Base (4) and hop (1) stay.
    one = program(2, {0: [(1, -1, 0, ["s"])], 1: [(-1, 0, 0, ["r"])]})
    c = constants(base=4.0, hop=1.0)
    assert simulate_program(one, line(2, 10.0), 100_000, c,
                            bandwidth_factor=0.5).time_us == pytest.approx(35.0, rel=1e-9)
    capped = constants(base=4.0, hop=1.0, ceiling=5.0)
    assert simulate_program(one, line(2, 100.0), 100_000, capped,
                            bandwidth_factor=0.5).time_us == pytest.approx(65.0, rel=1e-9)
    for bad in (0.0, -1.0, 1.5, math.nan):
        with pytest.raises(InvalidInstanceError, match="bandwidth_factor"):
            simulate_program(one, line(2, 10.0), 100_000, c, bandwidth_factor=bad)


def test_two_connections_sharing_one_link_take_twice_as_long():
    # One 10 GB/s link, no ceiling: one connection moves 100_000 bytes in 10 us and its
    # receive passes over its last slice (g = min(100_000, max(50_000, 32_768)) = 50_000
    # bytes) in 5 us: 15 us after base 4 + hop 1. Two at the same time share the link, each at
    # 5_000 bytes/us, and need 20 + 10 = 30 us.
    topo, c = line(2, 10.0), constants(base=4.0, hop=1.0)
    one = simulate_program(program(2, {0: [(1, -1, 0, ["s"])], 1: [(-1, 0, 0, ["r"])]}), topo,
                           100_000, c)
    two = simulate_program(two_channel_send(), topo, 100_000, c)
    assert one.time_us - 5.0 == pytest.approx(10.0 + 5.0, rel=1e-9)
    assert two.time_us - 5.0 == pytest.approx(20.0 + 10.0, rel=1e-6)


def test_connections_under_their_ceiling_do_not_slow_each_other():
    # Two connections of at most 4 GB/s each fit a 10 GB/s link together: 100_000 / 4_000 = 25,
    # and each receive's pass over its last 50_000-byte slice (min(100_000, max(50_000,
    # 32_768))) at 4_000 bytes/us, 12.5: 4 + 1 + 25 + 12.5 = 42.5 us.
    t = simulate_program(two_channel_send(), line(2, 10.0), 100_000,
                         constants(base=4.0, hop=1.0, ceiling=4.0))
    assert t.time_us == pytest.approx(4.0 + 1.0 + 25.0 + 12.5, rel=1e-6)


def test_a_group_shared_by_two_links_halves_each():
    # Ranks 0 and 1 both send 100_000 bytes to rank 2 over their own 10 GB/s links, through a
    # group (a switch port) of 10 GB/s: 20 us of transfer at 5_000 bytes/us each, as one link
    # carrying both, then each receive's pass over its last 50_000-byte slice
    # (min(100_000, max(50_000, 32_768))) at that rate, 10 us: 4 + 1 + 20 + 10 = 35 us.
    from collsynth.topology.model import BandwidthGroup

    links = ((0, 0, 1), (0, 0, 1), (0, 0, 0))
    port = BandwidthGroup(frozenset({0, 1}), frozenset({2}), 1, "port")
    topo = Topology("fan-in", links, groups=(port,), unit_gbps=10.0, alpha_us=1.0)
    p = program(3, {0: [(2, -1, 0, ["s"])], 1: [(2, -1, 0, ["s"])],
                    2: [(-1, 0, 0, ["r"]), (-1, 1, 0, ["r"])]})
    t = simulate_program(p, topo, 100_000, constants(base=4.0, hop=1.0))
    assert t.time_us == pytest.approx(4.0 + 1.0 + 20.0 + 10.0, rel=1e-6)


def test_a_forwarding_rank_pipelines_slices():
    # 0 -> 1 -> 2 with rank 1 forwarding (rcs). Slices of 1000 bytes (slot 1000 B, one slot per
    # slice; 8 slices per chunk: g = min(8000, max(8000 / 8, 1000 / 32), 1000) = 1000), an
    # 8000-byte chunk, 10 GB/s links (0.1 us a slice), alpha 2 us, a FIFO deep enough not to
    # bind. The last slice leaves rank 0 at 0.8 us, reaches rank 1 at 2.8, is forwarded in
    # 0.1 us, reaches rank 2 2 us later (4.9) and is copied out of its FIFO in 0.1 us: 5.0 us,
    # against 2 * (2 + 0.8) + 0.8 = 6.4 for store and forward.
    p = program(3, {0: [(1, -1, 0, ["s"])], 1: [(2, 0, 0, ["rcs"])], 2: [(-1, 1, 0, ["r"])]})
    c = constants(base=4.0, hop=2.0, slot=1000, chunk_slots=8, slice_slots=1, fifo=64)
    t = simulate_program(p, line(3, 10.0), 8000, c)
    assert t.time_us == pytest.approx(4.0 + 5.0, rel=1e-9)
    # One slice as large as the chunk (8 slots a slice, 1 slice per chunk: g = 8000): store
    # and forward, then the receive's pass over that one slice: 2 * (2 + 0.8) + 0.8 = 6.4.
    whole = c.replace(slice_slots={p_: 8 for p_ in PROTOCOLS})
    assert simulate_program(p, line(3, 10.0), 8000, whole).time_us == pytest.approx(4.0 + 6.4)


def test_an_ll_forwarding_rank_passes_each_line_on_as_it_arrives():
    # 0 -> 1 -> 2 with rank 1 forwarding (rcs), in LL with NCCL's own LL slot (64 KiB on the
    # wire, 32 KiB of data: one slot per slice). A 16 KiB chunk fits in one slot, yet LL does not
    # wait for it: each of 512 threads polls its own 16-byte line (8 data bytes) and writes it
    # on, so rank 1 forwards in grains of 512 x 8 = 4096 data bytes, 4 of them here. Links of
    # 10 GB/s carry LL at 5 GB/s of data (half of each line is flags): 0.8192 us a grain. By
    # hand, as the Simple case above: the last grain leaves rank 0 at 4 x 0.8192, reaches rank 1
    # 2 us later, is forwarded in 0.8192 us and reaches rank 2 2 us later:
    # 2 x 2 + 5 x 0.8192 = 8.096 us; storing the whole chunk first would take
    # 2 x (2 + 16384 / 5000) = 10.5536 us.
    p = program(3, {0: [(1, -1, 0, ["s"])], 1: [(2, 0, 0, ["rcs"])], 2: [(-1, 1, 0, ["r"])]},
                proto="LL")
    c = constants(base=4.0, hop=2.0, chunk_slots=1, slice_slots=1, fifo=8)
    t = simulate_program(p, line(3, 10.0), 16384, c)
    assert t.time_us == pytest.approx(4.0 + 4.0 + 5 * 4096 / 5000, rel=1e-9)
    # Across nodes the network proxy sends an LL step once all its lines are in: the same
    # chain with both hops on the network stores and forwards the chunk, 2 x (2 + 16384 / 5000).
    import dataclasses

    import numpy as np

    prep = prepare_program(p, line(3, 10.0))
    network = dataclasses.replace(prep, link_class=np.where(prep.link_class >= 0, 1, -1))
    assert simulate_program(network, None, 16384, c).time_us == pytest.approx(
        4.0 + 2 * (2.0 + 16384 / 5000), rel=1e-9)
    # RCCL's LL runs 256 threads: grains of 2048 data bytes, 8 of them, 0.4096 us each.
    rccl = c.replace(runtime="rccl")
    assert simulate_program(p, line(3, 10.0), 16384, rccl).time_us == pytest.approx(
        4.0 + 4.0 + 9 * 2048 / 5000, rel=1e-9)
    # LL128 waits for its slice (one slot of 76800 bytes: more than the chunk): store and
    # forward, at 120/128 of 10 GB/s.
    ll128 = program(3, {0: [(1, -1, 0, ["s"])], 1: [(2, 0, 0, ["rcs"])],
                        2: [(-1, 1, 0, ["r"])]}, proto="LL128")
    rate = 10_000 * 120 / 128
    assert simulate_program(ll128, line(3, 10.0), 16384, c).time_us == pytest.approx(
        4.0 + 2 * (2.0 + 16384 / rate), rel=1e-9)


def test_a_pipelined_receive_reduce_pays_for_reducing_its_last_slice():
    # The runtime's ring reduce-scatter on 3 ranks (0 -> 1 -> 2 -> 0): every rank sends one
    # chunk (s), receives, reduces and forwards the next (rrs), and receives and reduces its
    # own (rrc). A 24_000-byte buffer is 3 chunks of 8000 bytes: 8 slices of 1000 bytes
    # (slot 1000 B, one slot per slice), 0.1 us each over a 10 GB/s link; hop 2 us; reducing
    # costs 0.00005 us per byte, 0.05 us per slice and 0.4 us per chunk, so it keeps up with
    # the slices and only the last slice's reduction shows. By hand, on every rank alike:
    #   s    0 .. 0.8 us on the wire; its last slice reaches the next rank at 2.8 us.
    #   rrs  reduces that slice by 2.85, sends it by 2.95; it reaches the next rank at 4.95.
    #   rrc  takes that last slice out of its FIFO: the longer of the copy at the link's rate
    #        (0.1 us) and its reduction (0.05 us), so by 5.05 us.
    # So base + 5.05. Without the reduction of rrs's last slice it would be base + 5.0.
    n = 3
    links = [[1 if b == (a + 1) % n else 0 for b in range(n)] for a in range(n)]
    ring3 = Topology("ring3", tuple(map(tuple, links)), unit_gbps=10.0, alpha_us=2.0)
    p = ring_program("reduce_scatter", [(0, 1, 2)], protocol="Simple")
    assert [st.type for st in p.gpus[0].threadblocks[0].steps] == ["s", "rrs", "rrc"]
    c = constants(base=4.0, hop=2.0, slot=1000, chunk_slots=8, slice_slots=1, fifo=64,
                  gamma=0.00005)
    t = simulate_program(p, ring3, 24_000, c)
    assert t.time_us == pytest.approx(4.0 + 5.05, rel=1e-9)
    # With no reduction cost the same hand count gives 0.8 + 2 + 0.1 + 2 + 0.1 = 5.0 us.
    free = simulate_program(p, ring3, 24_000, c.replace(gamma_us_per_byte=0.0))
    assert free.time_us == pytest.approx(4.0 + 5.0, rel=1e-9)
    # Reducing slower than the wire (0.0002 us per byte: 0.2 us a slice, 1.6 us a chunk), the
    # reduction sets each step's pace and rrc's last pass is its reduction, not the copy:
    #   s    0 .. 0.8; its first slice reaches the next rank at 0.1 + 2 = 2.1, its last at 2.8.
    #   rrs  starts at 2.1, reduces the chunk by 2.1 + 1.6 = 3.7 (its last slice's deadline,
    #        2.8 + 0.1 + 0.2 = 3.1, is earlier); its first slice reaches the next rank at
    #        2.1 + 0.1 + 2 = 4.2, its last lands at 3.7 + 2 = 5.7.
    #   rrc  starts at 4.2, reduces the chunk by 5.8, and its last slice by 5.7 + max(0.1, 0.2)
    #        = 5.9 us.
    slow = simulate_program(p, ring3, 24_000, c.replace(gamma_us_per_byte=0.0002))
    assert slow.time_us == pytest.approx(4.0 + 5.9, rel=1e-9)


def test_the_fifo_window_bounds_a_connection_over_a_long_hop():
    # 8 slots of 1000 bytes in flight per round trip of 2 x 2 us: at most 2000 bytes/us, so
    # 8000 bytes take 4 us although the link carries 10_000 bytes/us; the receive's pass over
    # its last 1000-byte slice (one slot) goes at the connection's rate too: 0.5 us.
    p = program(2, {0: [(1, -1, 0, ["s"])], 1: [(-1, 0, 0, ["r"])]})
    c = constants(base=4.0, hop=2.0, slot=1000, chunk_slots=8, slice_slots=1, fifo=8)
    assert simulate_program(p, line(2, 10.0), 8000, c).time_us == pytest.approx(
        4.0 + 2.0 + 4.0 + 0.5)


def test_reductions_cost_gamma_per_byte():
    # A local re of 1000 bytes at 0.01 us/byte: 10 us after the base.
    p = program(1, {0: [(-1, -1, 0, ["re"])]})
    t = simulate_program(p, line(1, 10.0), 1000, constants(base=4.0, gamma=0.01))
    assert t.time_us == pytest.approx(14.0)


def test_no_time_below_the_base_latency():
    p = program(2, {0: [(1, -1, 0, ["s"])], 1: [(-1, 0, 0, ["r"])]})
    c = constants(base=30.0, hop=0.0)
    assert simulate_program(p, line(2, 10.0), 0, c).time_us == pytest.approx(30.0)
    for size in (1, 10**3, 10**6):
        assert simulate_program(p, line(2, 10.0), size, c).time_us > 30.0


# -- the runtime's ring as a program ------------------------------------------------------------


@pytest.mark.parametrize("coll", ["allgather", "reduce_scatter", "allreduce"])
def test_ring_programs_compute_their_collective(coll):
    # Checked by the checker's symbolic execution (its postcondition), not by the simulator.
    p = ring_program(coll, [(0, 1, 2, 3, 4), (0, 4, 3, 2, 1)])
    report = check_program(p, runtime="msccl", collective=coll)
    assert [x for x in report.problems if x.kind == "postcondition"] == []
    # Written for each runtime (rccl: without fused steps), the file passes every check.
    from collsynth.export.xml_reader import read_checked
    from collsynth.export.xml_writer import write_program

    for runtime in ("msccl", "msccl-executor", "rccl"):
        text = write_program(ring_program(coll, [(0, 1, 2, 3, 4), (0, 4, 3, 2, 1)],
                                          runtime=runtime), runtime)
        read, problems = read_checked(text, runtime)
        assert problems == []
        report = check_program(read, runtime=runtime, collective=coll)
        assert report.ok and not report.warnings, [str(x) for x in report.problems[:3]]


def test_a_fused_step_over_a_partly_overlapping_operand_is_refused():
    from collsynth.errors import ExportError
    from collsynth.export.retarget import unfused

    import dataclasses

    p = program(2, {0: [(1, -1, 0, ["s"])], 1: [(-1, 0, 0, ["r"])]})
    step = XmlStep(0, "rrc", "o", 0, "o", 1, 2)   # o[0..2) + received -> o[1..3)
    receive = ThreadBlock(0, -1, 0, 0, (step,))
    broken = dataclasses.replace(p, gpus=(p.gpus[0], GpuProgram(1, 1, 3, 0, (receive,))))
    with pytest.raises(ExportError, match="rank 1 tb 0 step 0: rrc .* partly overlap"):
        unfused(broken)


def test_baseline_picks_the_recorded_protocol_by_size():
    n = 4
    links = [[1 if b == (a + 1) % n else 0 for b in range(n)] for a in range(n)]
    ring4 = Topology("ring4", tuple(map(tuple, links)), unit_gbps=10.0, alpha_us=2.0)
    c = constants().replace(default_protocols=((1000, "LL"), (None, "Simple")), channels=1)
    rows = runtime_prices("allgather", ring4, [1000, 10**6], c)
    assert [r.protocol for r in rows] == ["LL", "Simple"]
    assert rows[0].subject == "nccl-ring"


# -- bad input ----------------------------------------------------------------------------------


def test_rank_count_mismatch_is_refused():
    p = program(3, {})
    with pytest.raises(InvalidInstanceError, match="3 ranks but topology 'line2' has 2"):
        prepare_program(p, line(2, 10.0))


def test_a_send_without_a_link_goes_through_the_host_and_is_named():
    # line2 has no link 1 -> 0 and no machine facts: the runtime's path is PCIe through the
    # host at NCCL's PCI_BW, 12 GB/s (12_000 bytes/us) out of rank 1 and into rank 0. By hand:
    # base 4 + hop 1.5 + 60_000 / 12_000 = 10.5 us, then the receive's pass over its last
    # slice, g = min(60_000, max(30_000, 32_768)) = 32_768 bytes at 12_000 bytes/us:
    # 10.5 + 2.730667 = 13.230667 us. The send is listed, not refused.
    p = program(2, {1: [(0, -1, 0, ["s"])], 0: [(-1, 1, 0, ["r"])]})
    prepared = prepare_program(p, line(2, 10.0))
    assert prepared.indirect == ((1, 0, "PCIe through the host, 12 GB/s", 1),)
    t = simulate_program(prepared, None, 60_000, constants(base=4.0, hop=1.5))
    assert t.time_us == pytest.approx(10.5 + 32_768 / 12_000, rel=1e-12)
    assert indirect_note(prepared).startswith("1 send between ranks with no direct link")
    # A rank outside the topology is still refused.
    outside = program(2, {1: [(5, -1, 0, ["s"])]})
    with pytest.raises(InvalidInstanceError, match="sends to rank 5, but topology 'line2' has "
                                                   "ranks 0..1"):
        prepare_program(outside, line(2, 10.0))


def test_a_deadlock_is_refused():
    p = program(2, {0: [(1, 1, 0, ["r", "s"])], 1: [(0, 0, 0, ["r", "s"])]})
    topo = Topology("pair", ((0, 1), (1, 0)), unit_gbps=10.0, alpha_us=1.0)
    with pytest.raises(InvalidInstanceError, match="deadlocks"):
        prepare_program(p, topo)


def test_constants_file_round_trip_and_bad_file(tmp_path):
    c = get_runtime("rccl").defaults.replace(channels=2, default_protocols=((1024, "LL"),
                                                                         (None, "Simple")))
    calibration = RuntimeCalibration(c)
    assert calibration_from_json(json.loads(json.dumps(calibration_to_json(calibration)))) == \
        calibration
    path = tmp_path / "rt.json"
    save_calibration(calibration, path)
    assert load_calibration(path).constants == c
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"format": "collsynth-runtime-constants", "version": 1,
                               "runtime": "rccl", "hop_latency_us": {"intra": {"LL": -1}}}))
    with pytest.raises(CollsynthError, match=r"hop_latency_us\['intra'\]\['LL'\] = -1"):
        load_calibration(bad)
    with pytest.raises(FileFormatError, match="collsynth-calibration"):
        calibration_from_json({"format": "other"})


def _xml(tmp_path: Path) -> Path:
    from collsynth.export.xml_writer import write_program

    path = tmp_path / "ring4.xml"
    path.write_text(write_program(ring_program("allgather", [(0, 1, 2, 3)]), "msccl"))
    return path


def test_cli_xml_needs_a_topology(tmp_path, capsys):
    assert main(["time", str(_xml(tmp_path))]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "needs --topology" in err


def test_cli_xml_rank_mismatch_is_an_error_row(tmp_path, capsys):
    """A program that cannot be priced gets an error row; the runtime's rows still print."""
    assert main(["time", str(_xml(tmp_path)), "--topology", "dgx1", "--sizes", "1KB"]) == 0
    out = capsys.readouterr().out
    assert "not priced: ring4.xml: ring4.xml has 4 ranks but topology 'DGX1' has 8" in out
    assert "allgather on DGX1 (8 ranks)" in out and "nccl-ring" in out


def test_cli_time_json_rows(tmp_path, capsys):
    args = ["time", str(_xml(tmp_path)), "--topology", "ring:4,unit_gbps=10,alpha_us=1",
            "--sizes", "4KB,4MB", "--json"]
    assert main(args) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {(r["name"], r["size_bytes"]) for r in rows} == {
        ("ring4.xml", 4000), ("ring4.xml", 4000000), ("nccl-ring", 4000), ("nccl-ring", 4000000)}
    for r in rows:
        assert r["algbw_gbps"] == pytest.approx(r["size_bytes"] / r["time_us"] / 1e3)


# -- the MI250 target ---------------------------------------------------------------------------


def test_mi250_rccl_ring_held_out_error():
    # Fit on every other measured size, predict every size: GMAE well under 10% (the benchmark
    # benchmarks/runtime_model.py prints the exact in-sample and held-out figures).
    from collsynth.topology import get_topology
    from collsynth.topology.compose import compose_nodes
    from collsynth.timing.runtime_fit import fit_runtime, predict_ring, protocol_split, read_curve

    rows = read_curve(MI250_CSV)
    topo = compose_nodes(get_topology("mi250-16gcd"), 2)
    protocols = protocol_split([t for _, t in rows])
    train = [i for i in range(len(rows)) if i % 2 == 0]
    fit = fit_runtime([rows[i] for i in train], topo, runtime="rccl", channels=2,
                      protocols=[protocols[i] for i in train], held_out=False)
    prepared = {p: prepare_program(ring_program("allgather", fit.rings, protocol=p), topo)
                for p in set(protocols)}
    predicted = predict_ring(prepared, [s for s, _ in rows], protocols, fit.constants)
    logs = [abs(math.log(p / t)) for p, (_, t) in zip(predicted, rows)]
    gmae = math.exp(sum(logs) / len(logs)) - 1
    assert gmae <= 0.10
    base = fit.constants.base_latency("LL")
    assert min(predicted) >= base


def test_sharing_is_what_makes_two_connections_slower():
    # The same case without sharing (an experiment switch): both take the whole link,
    # 10 us for the 100_000 bytes and 5 us for the receive's pass over its last 50_000-byte
    # slice: 4 + 1 + 10 + 5 = 20 us (35 with sharing).
    t = simulate_program(two_channel_send(), line(2, 10.0), 100_000,
                         constants(base=4.0, hop=1.0),
                         options=SimulationOptions(share_links=False))
    assert t.time_us == pytest.approx(20.0)


def test_calibrate_runtime_recovers_known_constants(tmp_path, capsys):
    # A curve made by the model itself with known figures (base 20 us, hops x 2, a 3 GB/s
    # Simple ceiling) is fitted back: the fitting procedure recovers them.
    n = 4
    links = [[1 if b == (a + 1) % n else 0 for b in range(n)] for a in range(n)]
    ring4 = Topology("ring4", tuple(map(tuple, links)), unit_gbps=25.0, alpha_us=1.0)
    base = get_runtime("nccl").defaults
    truth = base.replace(
        base_latency_us={p: 20.0 for p in PROTOCOLS},
        hop_latency_us={k: {p: 2 * v for p, v in row.items()}
                        for k, row in base.hop_latency_us.items()},
        ceiling_gbps={"intra": {"LL": None, "LL128": None, "Simple": 3.0},
                      "network": dict(base.ceiling_gbps["network"])})
    p = ring_program("allgather", [(0, 1, 2, 3)], protocol="Simple")
    sizes = [4096, 65536, 2**20, 2**24, 2**28]
    csv_path = tmp_path / "curve.csv"
    csv_path.write_text("size_bytes,time_us,algbw_gbps\n" + "".join(
        f"{s},{simulate_program(p, ring4, s, truth).time_us},0\n" for s in sizes))
    out = tmp_path / "rt.json"
    assert main(["calibrate", str(csv_path), "--model", "program", "--topology",
                 "ring:4,unit_gbps=25", "--runtime", "nccl", "--channels", "1", "-o", str(out),
                 "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["gmae"] < 0.01
    fitted = load_calibration(out).constants
    assert fitted.ceiling("intra", "Simple") == pytest.approx(3.0, rel=0.02)
    assert fitted.base_latency("Simple") + 3 * fitted.hop_latency("intra", "Simple") == \
        pytest.approx(20.0 + 3 * 6.8, rel=0.05)
    assert fitted.channels == 1


@pytest.mark.parametrize("text, fragment", [
    ('{"format": "collsynth-runtime-constants", "version": 1, "base": NaN}', "NaN"),
    ("[" * 100000, "nested too deeply"),
])
def test_runtime_constants_files_are_parsed_safely(tmp_path, text, fragment):
    from collsynth.errors import FileFormatError

    path = tmp_path / "rt.json"
    path.write_text(text)
    with pytest.raises(FileFormatError, match=fragment) as caught:
        load_calibration(path)
    assert str(path) in str(caught.value)


def test_cli_time_allreduce_lists_the_runtime_ring_and_tree(tmp_path, capsys):
    """For an allreduce the runtime has two algorithms; both rows are the simulator's, each
    equal to the program model's price of it called here."""
    from collsynth.export.xml_writer import write_program
    from collsynth.resolve import resolve_topology
    from collsynth.timing.runtime_baselines import runtime_rings

    topology = resolve_topology("dgx-a100", nodes=2)
    path = tmp_path / "ar.xml"
    path.write_text(write_program(ring_program("allreduce", runtime_rings(topology)[:1]),
                                  "msccl"))
    assert main(["time", str(path), "--topology", "dgx-a100", "--nodes", "2", "--sizes",
                 "1KB,1GB", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    constants = get_runtime("msccl").defaults
    for algorithm, name in (("ring", "nccl-ring"), ("tree", "nccl-tree")):
        expected = runtime_prices("allreduce", topology, [1000, 10**9], constants,
                                  algorithm=algorithm)
        got = sorted((r["size_bytes"], r["time_us"]) for r in rows if r["name"] == name)
        assert [size for size, _ in got] == [e.size_bytes for e in expected]
        assert [t for _, t in got] == pytest.approx([e.time_us for e in expected])


def pass_in_order(prep, own: list[float], tail: list[float], first: list[float],
                  alpha: list[float]) -> tuple[list[float], list[float]]:
    """The program model's timing pass one transfer at a time in event order (the reference
    the level-at-a-time pass is compared with; the library's pass before it). A transfer
    starts after its thread block's previous transfer and every transfer it waited for and,
    for a receive, after the first slice of each send it takes has arrived; a receive ends no
    earlier than each of those sends' finish, hop and its own tail."""
    kind, prev, deps, match, inputs = prep.kind, prep.prev, prep.deps, prep.match, prep.inputs
    total = len(kind)
    start = [0.0] * total
    finish = [0.0] * total
    arrive = [0.0] * total   # first slice at the receiver
    for i in range(total):
        p = prev[i]
        s = finish[p] if p >= 0 else 0.0
        for d in deps[i]:
            if finish[d] > s:
                s = finish[d]
        m = match[i]
        f = s + own[i]
        if m >= 0:
            more = inputs[i] if inputs is not None else ()
            for x in more:
                if arrive[x] > s:
                    s = arrive[x]
            if arrive[m] > s:
                s = arrive[m]
            f = s + own[i]
            last = finish[m] + alpha[m] + tail[i]
            if last > f:
                f = last
            for x in more:
                last = finish[x] + alpha[x] + tail[i]
                if last > f:
                    f = last
        start[i] = s
        finish[i] = f
        if alpha[i] >= 0.0:
            arrive[i] = s + first[i] + alpha[i]
    return start, finish


def test_the_timing_pass_by_levels_equals_the_pass_in_event_order():
    """The level-at-a-time pass (numpy) against the one-transfer-at-a-time reference, bit for
    bit, on the runtime's own graphs of a two-node NVSwitch machine with SHARP (ring, tree,
    NVLS, NVLS-tree with its in-switch inputs, CollNet direct and chain), under random costs."""
    import numpy as np

    from collsynth.timing.pricing import RuntimeAlgorithm, runtime_algorithms
    from collsynth.timing.program_model import ProgramModel
    from collsynth.timing.runtime_model import _pass
    from collsynth.topology import get_topology
    from collsynth.topology.compose import compose_nodes
    from collsynth.topology.machine import with_machine

    nccl = get_runtime("nccl")
    model = ProgramModel(nccl.defaults, runtime=nccl)
    rng = np.random.default_rng(7)
    system = with_machine(compose_nodes(get_topology("DGX-H100"), 2), network_class="ib",
                          sharp=True)
    seen = set()
    for collective in ("allreduce", "allgather", "reduce_scatter"):
        for subject in runtime_algorithms(nccl, collective, system):
            if model.why_not(subject) is not None:
                continue
            for protocol in (("Simple",) if subject.algorithm not in ("ring", "tree")
                             else PROTOCOLS):
                prep = model._runtime_prepared(subject, protocol, 2,
                                               model._pipeline(subject, protocol, 2, 1 << 24))
                n = prep.num_transfers
                own, tail, first = (rng.random(n) * 10 for _ in range(3))
                alpha = np.where(prep.sends, rng.random(n) * 3, -1.0)
                start, finish = _pass(prep, own, tail, first, alpha)
                ref_start, ref_finish = pass_in_order(prep, own.tolist(), tail.tolist(),
                                                      first.tolist(), alpha.tolist())
                assert np.array_equal(start, np.array(ref_start)), (subject.name, protocol)
                assert np.array_equal(finish, np.array(ref_finish)), (subject.name, protocol)
                seen.add(subject.algorithm)
    assert seen == {"ring", "tree", "nvls", "nvls_tree", "collnet_direct", "collnet_chain"}, seen


def test_a_resources_mean_load_is_the_overlap_weighted_sum_of_its_transfers_rates():
    """_loads against its definition, by brute force: the load a transfer sees on a resource
    is the sum, over every transfer on that resource, of its rate times the length of their
    overlap, over the transfer's own lifetime (ties and zero-length transfers included)."""
    import numpy as np

    from collsynth.timing.runtime_model import _loads

    rng = np.random.default_rng(3)
    n, resources = 60, 5
    starts = rng.integers(0, 20, n).astype(float)           # integers: many equal times
    finishes = starts + rng.integers(0, 6, n)
    rates = rng.random(n)
    members = np.array([(e, r) for e in range(n) for r in range(resources)
                        if rng.random() < 0.4], dtype=np.int64)
    got = _loads(starts, finishes, rates, members, resources)
    for k, (e, r) in enumerate(members):
        span = finishes[e] - starts[e]
        if span <= 0:
            assert got[k] == 0.0
            continue
        on = members[members[:, 1] == r, 0]
        overlap = np.clip(np.minimum(finishes[on], finishes[e])
                          - np.maximum(starts[on], starts[e]), 0, None)
        assert got[k] == pytest.approx(float(np.sum(rates[on] * overlap)) / span, rel=1e-12)


@pytest.mark.parametrize("collective, ops", [
    ("broadcast", [["s", "cpy"], ["rcs"], ["rcs"], ["r"]]),
    ("reduce", [["rrc"], ["s"], ["rrs"], ["rrs"]]),
])
def test_the_runtimes_broadcast_and_reduce_chains_by_hand(collective, ops):
    # NCCL's broadcast leaves root 0 along the ring 0 -> 1 -> 2 -> 3; its reduce runs from the
    # rank after the root (1) round to the root. One channel: one chunk of 8000 bytes, 8 slices
    # of 1000 bytes (0.1 us each at 10 GB/s), three hops of 2 us, each rank passing slices on as
    # they arrive, and the last rank (r, rrc) copying the last slice out of its FIFO:
    # base 4 + 3 x 2 + (8 + 2 + 1) x 0.1 = 11.1 us (reductions free here).
    n = 4
    links = [[1 if b == (a + 1) % n else 0 for b in range(n)] for a in range(n)]
    ring4 = Topology("ring4", tuple(map(tuple, links)), unit_gbps=10.0, alpha_us=2.0)
    p = ring_program(collective, [(0, 1, 2, 3)])
    assert [[st.type for st in g.threadblocks[0].steps] for g in p.gpus] == ops
    c = constants(base=4.0, hop=2.0, slot=1000, chunk_slots=8, slice_slots=1, fifo=64)
    assert simulate_program(p, ring4, 8000, c).time_us == pytest.approx(11.1, rel=1e-9)


def test_the_runtimes_broadcast_moves_one_slot_per_slice_in_simple():
    # NCCL's BROADCAST_SLICESTEPS and REDUCE_SLICESTEPS are 1 (the other rings' 2): with
    # NCCL's 512 KiB slots a 4 MiB broadcast over the ring above crosses its 3 hops in slices
    # of 524288 bytes, 52.4288 us each at 10 GB/s, the last rank copying the last one out of
    # its FIFO: 4 + 3 x 2 + (8 + 2 + 1) x 52.4288 = 586.7168 us (with the 1 MiB slices of the
    # allreduce ring it would be 4 + 6 + (4 + 2 + 1) x 104.8576).
    from collsynth.timing.runtime_programs import RUNTIME_PROGRAMS

    n = 4
    links = [[1 if b == (a + 1) % n else 0 for b in range(n)] for a in range(n)]
    ring4 = Topology("ring4", tuple(map(tuple, links)), unit_gbps=10.0, alpha_us=2.0)
    built = RUNTIME_PROGRAMS["ring"].build("broadcast", ring4, 1, "Simple")
    assert built.slice_bytes == 512 * 1024
    c = constants(base=4.0, hop=2.0, fifo=64).replace(slot_bytes=dict(
        get_runtime("nccl").defaults.slot_bytes))
    assert simulate_program(built, None, 4 << 20, c).time_us == pytest.approx(
        4 + 6 + 11 * 524288 / 10_000, rel=1e-9)
    # LL and LL128 keep their own slices (one slot; LL a line per thread)
    assert isinstance(RUNTIME_PROGRAMS["ring"].build("broadcast", ring4, 1, "LL"), Program)


def test_the_ring_fit_prepares_broadcast_as_the_model_prices_it():
    """The fit of an explicit ring (``calibrate --channels``, ``bench``) and the program model
    prepare a broadcast chain the same way: one-step slices in Simple."""
    from collsynth.timing.program_model import ProgramModel
    from collsynth.timing.runtime_fit import fit_runtime
    from collsynth.timing.pricing import RuntimeAlgorithm

    n = 4
    links = [[1 if b == (a + 1) % n else 0 for b in range(n)] for a in range(n)]
    ring4 = Topology("ring4", tuple(map(tuple, links)), unit_gbps=10.0, alpha_us=2.0)
    c = constants(base=4.0, hop=2.0, fifo=64).replace(slot_bytes=dict(
        get_runtime("nccl").defaults.slot_bytes))
    subject = RuntimeAlgorithm(get_runtime("nccl"), "ring", "broadcast", ring4, channels=1,
                               protocol="Simple")
    sizes = [1 << 20, 4 << 20, 16 << 20]
    measured = [(s, p.time_us) for s, p in zip(sizes, ProgramModel(c).price(subject, sizes))]
    # 4 MiB as by hand in the test above: 4 + 6 + 11 x 52.4288 us
    assert measured[1][1] == pytest.approx(4 + 6 + 11 * 524288 / 10_000, rel=1e-9)
    fit = fit_runtime(measured, ring4, "broadcast", runtime="nccl", channels=1,
                      protocols=["Simple"] * 3, constants=c, held_out=False)
    assert fit.predicted_us == pytest.approx([t for _, t in measured], rel=1e-3)
