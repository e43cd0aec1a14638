"""Mutation round 9: the benchmark log readers (collsynth.timing.logs) and the timing models.

Each test kills a mutant the earlier suites let live. Every expected figure is worked out by
hand in the comment next to it (the nccl-tests table layout, two-decimal printing, NCCL's source
text), never from the code's output.
"""

from __future__ import annotations

import json
import math

import pytest

from collsynth.errors import FileFormatError
from collsynth.timing.logs import parse_log

HEADER = ("#       size   count  type  redop  root   time  algbw  busbw #wrong   time  algbw  "
          "busbw #wrong")


def _row(size: int, time_us: float, algbw: str = "0.00", busbw: str = "0.00") -> str:
    half = f"{time_us:.2f}  {algbw}  {busbw}  0"
    return f"{size}  {size // 4}  float  sum  -1  {half}  {half}"


def _ranks(count: int) -> list[str]:
    return [f"#  Rank {r:2d} Group  0 Pid 1 on host device {r:2d} [0x01] GPU" for r in range(count)]


# -- nccl-tests text: the table's layout ----------------------------------------------------------


def test_a_table_without_an_error_column_reads_both_halves():
    # A header of 3 cells per half (time algbw busbw, no #wrong): the reader admits it (a half
    # of at least 3 cells), so the second half's time is 11.00 (cell 9 of 11), not the first
    # half's error, and there is no error figure to read (it used to crash with IndexError on
    # the in-place half reading a 12th cell).
    text = "\n".join([
        "# nThread 1 nGpus 4 minBytes 8 maxBytes 1024 step: 2(factor)", *_ranks(4),
        "#       size   count  type  redop  root   time  algbw  busbw   time  algbw  busbw",
        "        1024     256 float    sum    -1  12.00   0.09   0.13  11.00   0.09   0.14", ""])
    log = parse_log(text, name="all_reduce_perf.txt")
    assert [(r.in_place, r.time_us, r.busbw_gbps, r.errors) for r in log.rows] == [
        (False, 12.0, 0.13, None), (True, 11.0, 0.14, None)]


# -- nccl-tests text: the rank count ---------------------------------------------------------------


def test_an_allreduce_whose_busbw_equals_its_algbw_ran_on_two_ranks():
    # No '#  Rank' lines, no nThread header: busbw / algbw says. nccl-tests' allreduce factor
    # 2 (n - 1) / n is 1 only at n = 2 (4/3 at 3, 0 at 1).
    text = "\n".join(["#  all_reduce_perf", HEADER, _row(1 << 20, 100.0, "10.49", "10.49"), ""])
    assert parse_log(text).ranks == 2


def test_rows_that_disagree_beyond_two_decimal_printing_do_not_tell_the_ranks():
    # The best row (10.00, 17.50) says 1.75 = 2 * 7 / 8: eight ranks. The other row's algbw
    # 9.00 is 8.995..9.005, so its busbw is 15.741..15.759 before printing and 15.74..15.76 as
    # printed; 15.77 (0.02 from 9.00 * 1.75, more than 0.005 * 1.75 + 0.005 = 0.01375) cannot
    # come from eight ranks, and no other count explains both rows: the count is unknown.
    text = "\n".join(["#  all_reduce_perf", HEADER, _row(1 << 20, 100.0, "10.00", "17.50"),
                      _row(1 << 19, 55.0, "9.00", "15.77"), ""])
    with pytest.raises(FileFormatError, match="cannot tell the number of ranks"):
        parse_log(text)


def test_appended_runs_of_old_nccl_tests_on_other_rank_counts_are_refused():
    # Old nccl-tests print no '# Collective test starting' line: each run starts at its
    # '# nThread' header. A run on 4 ranks followed by one on 8 is two rank counts.
    text = "\n".join([
        "# nThread 1 nGpus 1 minBytes 8 maxBytes 1024 step: 2(factor)", *_ranks(4), HEADER,
        _row(1024, 10.0),
        "# nThread 1 nGpus 1 minBytes 8 maxBytes 1024 step: 2(factor)", *_ranks(8), HEADER,
        _row(1024, 12.0), ""])
    with pytest.raises(FileFormatError, match="a run on 8 ranks after one on 4"):
        parse_log(text, name="all_reduce_perf.txt")


# -- repeats ---------------------------------------------------------------------------------------


def test_repeats_exactly_twice_apart_are_kept():
    # docs/timing.md: times of one size and half are refused when *more than* 2x apart;
    # 10 us and 20 us are exactly 2x apart.
    text = "\n".join(["# nThread 1 nGpus 4", *_ranks(4), HEADER, _row(1024, 10.0),
                      _row(1024, 20.0), ""])
    log = parse_log(text, name="all_reduce_perf.txt")
    assert sorted(r.time_us for r in log.rows) == [10.0, 10.0, 20.0, 20.0]


# -- what the log was measured with ----------------------------------------------------------------


def test_a_json_nccl_version_code_has_two_digits_for_the_minor():
    # NCCL_VERSION(X, Y, Z) = X * 10000 + Y * 100 + Z from 2.9 (src/nccl.h.in): 22703 is 2.27.3
    # and 21903 is 2.19.3, the minor taken from the hundreds (two digits).
    doc = {"version": 2, "args": ["./all_reduce_perf"], "nccl_version": 21903,
           "config": {"nthreads": 1, "ngpus": 8},
           "results": [{"size": 1024, "count": 256, "type": "float", "redop": "sum",
                        "root": "-1", "out_of_place": {"time": 10.0}, "in_place": None}]}
    log = parse_log(json.dumps(doc), name="a.json")
    assert (log.runtime, log.runtime_version) == ("nccl", "2.19.3")


def test_ring_lines_say_the_channels_before_the_coll_channels_line():
    # docs/timing.md: the channel count comes from the ring lines 'Channel 00/02 : 0 1 2 3' (the
    # number after the slash), *else* from 'N coll channels'.
    text = "\n".join([
        "# nThread 1 nGpus 4", *_ranks(4),
        "host:1:1 [0] NCCL INFO Channel 00/02 :    0   1   2   3",
        "host:1:1 [0] NCCL INFO Channel 01/02 :    0   1   2   3",
        "host:1:1 [0] NCCL INFO 32 coll channels, 32 collnet channels, 0 nvls channels",
        HEADER, _row(1024, 10.0), ""])
    assert parse_log(text, name="all_reduce_perf.txt").channels == 2


# -- bus-bandwidth tables --------------------------------------------------------------------------


def test_a_size_label_just_below_a_power_of_two_is_that_power():
    # '1000K' is 1,024,000 bytes (or 1,000,000): the nearest power of two is 2**20 = 1,048,576
    # (2.4% above), not 2**19 (49% below). Broadcast's bus-bandwidth factor is 1, so the time is
    # 1,048,576 B / (10 GB/s * 1e3 B/us per GB/s) = 104.8576 us.
    text = "\n".join(["| Message Size (Bytes) | busbw (GB/s) |", "|---|---|",
                      "| 1000K | 10.00 |", ""])
    log = parse_log(text, name="broadcast_perf.md")
    (row,) = log.rows
    assert (row.size_bytes, row.time_us) == (1 << 20, pytest.approx(104.8576))


# -- PARAM comms: headerless rows and tags ---------------------------------------------------------


def test_param_headerless_six_cells_are_size_count_p50_p75_p95_algbw():
    # docs/timing.md: without a header, 6 cells are size count p50 p75 p95 algBW (no busBW).
    log = parse_log("\tCOMMS-RES\t1024\t256\t30.1\t31.0\t33.2\t0.034\n", name="all_reduce.txt",
                    ranks=8)
    (row,) = log.rows
    assert (row.time_us, row.algbw_gbps, row.busbw_gbps) == (30.1, 0.034, None)


def test_param_headerless_nine_cells_end_with_algbw_then_busbw():
    # docs/timing.md: 9 cells are size count p50 p75 p95 min max algBW busBW.
    row9 = ("\tCOMMS-RES-all_reduce  4096  1024  31.0  32.0  33.0  30.0  35.0  0.132  0.231\n")
    (row,) = parse_log(row9, name="p.txt", ranks=8).rows
    assert (row.time_us, row.algbw_gbps, row.busbw_gbps) == (31.0, 0.132, 0.231)


def test_param_row_tag_names_the_collective_then_the_dtype():
    # docs/timing.md: 'COMMS-RES-<collective>' rows, the collective may be followed by '-<dtype>'.
    row9 = ("\tCOMMS-RES-all_reduce-float  4096  1024  31.0  32.0  33.0  30.0  35.0  0.132  "
            "0.231\n")
    log = parse_log(row9, name="p.txt", ranks=8)
    assert (log.collective, log.rows[0].dtype) == ("allreduce", "float")


# -- nccl-tests JSON -------------------------------------------------------------------------------


def _json_doc(config: dict) -> dict:
    return {"version": 2, "args": ["./all_gather_perf"], "config": config,
            "results": [{"size": 1024, "count": 256, "type": "float", "redop": "none",
                         "root": "-1", "out_of_place": {"time": 10.0}, "in_place": None}]}


def test_a_json_config_without_devices_is_one_process():
    # ranks = nthreads * ngpus * len(devices), one process when the devices are not listed:
    # 2 threads of 4 GPUs are 8 ranks.
    log = parse_log(json.dumps(_json_doc({"nthreads": 2, "ngpus": 4})), name="a.json")
    assert log.ranks == 8


def test_json_rows_carry_the_line_of_their_results_entry():
    # Written by hand: the two entries of "results" open on lines 4 and 6.
    entry = ('{"size": %d, "count": 256, "type": "float", "redop": "none", "root": "-1",'
             ' "out_of_place": {"time": 10.0}, "in_place": null}')
    text = "\n".join([
        '{"version": 2, "args": ["./all_gather_perf"],',              # 1
        ' "config": {"nthreads": 1, "ngpus": 2},',                     # 2
        ' "results": [',                                               # 3
        "  " + entry % 1024 + ",",                                     # 4
        "",                                                            # 5
        "  " + entry % 2048,                                           # 6
        ']}', ""])
    log = parse_log(text, name="a.json")
    assert [row.line for row in log.rows] == [4, 6]


# -- plain CSV ------------------------------------------------------------------------------------


def test_a_csv_with_two_empty_trailing_header_cells_is_read():
    # An empty header cell names no column, so two of them name none twice (a spreadsheet's
    # trailing commas).
    text = "size_bytes,time_us,,\n1024,10.5,,\n"
    (row,) = parse_log(text, name="all_reduce.csv", ranks=8).rows
    assert (row.size_bytes, row.time_us) == (1024, 10.5)


def test_a_csv_of_zero_ranks_is_refused_as_a_ranks_cell():
    text = "size_bytes,time_us,ranks\n1024,10.5,0\n"
    with pytest.raises(FileFormatError, match=r"ranks '0': expected a whole number >= 1"):
        parse_log(text, name="all_reduce.csv")


# -- the closed form: NCCL's ring on DGX-1 ---------------------------------------------------------


def _dgx1_allgather_ring():
    from collsynth.runtimes import get_runtime
    from collsynth.timing.pricing import runtime_algorithms
    from collsynth.topology import get_topology

    (ring,) = runtime_algorithms(get_runtime("nccl"), "allgather", get_topology("dgx1"))
    return ring


def test_the_closed_form_prices_a_runtime_algorithm_at_the_size_asked():
    # NCCL's ring allgather on DGX-1, Simple: 8.4 us base + 7 hops x 3.4 us = 32.2 us, and 6
    # rings of 25 GB/s = 150 GB/s of bus bandwidth, algbw 150 x 8/7: at 1.2 MB,
    # 1.2e6 B x 7/8 / 150e3 B/us = 7 us: 39.2 us.
    from collsynth.timing.closed_form import ClosedForm

    (price,) = ClosedForm().price(_dgx1_allgather_ring().pinned("Simple"), [1_200_000])
    assert price.time_us == pytest.approx(39.2, rel=1e-12)


def test_the_closed_form_prices_pinned_channels_with_that_many_rings():
    # One channel instead of six: 25 GB/s of bus bandwidth, so the size term is six times
    # 7/1,200,000 us per byte: 7/200,000; the latency (32.2 us = 161/5) does not change.
    import dataclasses

    import sympy

    from collsynth.timing.closed_form import ClosedForm
    from collsynth.timing.model import SIZE

    one = dataclasses.replace(_dgx1_allgather_ring(), channels=1).pinned("Simple")
    assert sympy.simplify(ClosedForm().line(one) - (sympy.Rational(7, 200_000) * SIZE
                                                    + sympy.Rational(161, 5))) == 0


def test_the_fastest_of_tied_runtime_algorithms_is_the_first():
    # Prediction.fastest: "ties: the first" (in the order the runtime's algorithms are listed).
    from collsynth.timing.closed_form import Prediction

    row = Prediction(1024, 10.0, {"nccl-tree": 5.0, "nccl-ring": 5.0, "nccl-nvls": None})
    assert row.fastest == ("nccl-tree", 5.0)


# -- NCCL's rings (collsynth.timing.rings) ---------------------------------------------------------


def test_the_ring_search_prefers_the_link_with_the_most_units_left():
    # Three ranks, every link one unit except 0 -> 1 with two. From rank 0 the search takes the
    # link with the most units left, 0 -> 1: the first ring is 0 1 2; then 0 -> 1 and 0 -> 2 have
    # one unit each (the tie-break (v - u) mod n tries 1 first, but 1 -> 2 is spent), so the
    # second is 0 2 1. No rank sends more than 2 units but rank 0: two rings in all.
    from collsynth.timing.rings import ring_channels
    from collsynth.topology.model import Topology

    topology = Topology("t3", ((0, 2, 1), (1, 0, 1), (1, 1, 0)))
    assert ring_channels(topology) == ((0, 1, 2), (0, 2, 1))


def test_nodes_of_one_rank_form_a_ring_through_their_nics():
    # Three nodes of one GPU each, one NIC unit: the ring enters and leaves each node at its
    # only rank (entry = exit), node 0 -> 1 -> 2 -> 0.
    from collsynth.timing.rings import ring_channels
    from collsynth.topology.compose import compose_nodes
    from collsynth.topology.model import Topology

    assert ring_channels(compose_nodes(Topology("one", ((0,),)), 3, nic_units=1)) == ((0, 1, 2),)


# -- fitting logs (collsynth.timing.fit) -----------------------------------------------------------


def _log(points) -> "BenchmarkLog":
    """An allreduce log on 8 ranks of (size, out-of-place us, in-place us) rows."""
    from collsynth.timing.logs import BenchmarkLog, BenchmarkRow

    rows = tuple(BenchmarkRow(size, size // 4, "float", "sum", -1, t, None, None, in_place,
                              None, line)
                 for line, (size, *times) in enumerate(points, start=1)
                 for in_place, t in zip((False, True), times))
    return BenchmarkLog("ar.txt", "allreduce", 8, rows, "nccl-tests")


def test_a_sizes_time_is_the_geometric_mean_of_its_rows_and_gmae_rows_scores_each_row():
    # Two sizes: the latency regime is the first, the bandwidth regime the second. 1024 bytes:
    # rows of 10 and 40 us, geometric mean 20 (not the arithmetic 25): alpha = 20, and
    # beta = (30 - 20) / 2048, so the line says 25 us at 1024 bytes and 30 at 2048.
    # Per size: gmae = exp((ln(25/20) + 0) / 2) - 1 = sqrt(1.25) - 1. Per row: 10 and 40 are
    # 2.5x and 1.6x from 25, so gmae_rows = exp((ln 2.5 + ln 1.6 + 0 + 0) / 4) - 1
    # = exp(ln 4 / 4) - 1 = sqrt(2) - 1.
    from collsynth.timing.fit import fit_alpha_beta

    fit = fit_alpha_beta(_log([(1024, 10.0, 40.0), (2048, 30.0, 30.0)]), heldout=False)
    assert fit.alpha_us == pytest.approx(20.0)
    assert fit.gmae == pytest.approx(math.sqrt(1.25) - 1)
    assert fit.gmae_rows == pytest.approx(math.sqrt(2) - 1)


def test_beta_is_the_median_over_the_four_largest_sizes():
    # docs/timing.md: alpha the median time of the 4 smallest sizes, beta the median of
    # (time - alpha) / size over the 4 largest. 8 sizes 1 KiB .. 128 KiB; the 4 smallest take
    # 10 us; the 4 largest take 10 + v * size with v = 1, 2, 3, 10 ns per byte: the median of
    # four is (2 + 3) / 2 = 2.5e-3 us per byte (of the three largest it would be 3e-3).
    from collsynth.timing.fit import fit_alpha_beta

    per_byte = {1 << 14: 1e-3, 1 << 15: 2e-3, 1 << 16: 3e-3, 1 << 17: 10e-3}
    points = [(1 << k, 10.0 + per_byte.get(1 << k, 0.0) * (1 << k),
               10.0 + per_byte.get(1 << k, 0.0) * (1 << k)) for k in range(10, 18)]
    fit = fit_alpha_beta(_log(points), heldout=False)
    assert (fit.alpha_us, fit.beta_us_per_byte) == (pytest.approx(10.0), pytest.approx(2.5e-3))


def test_a_flat_sweep_takes_the_time_per_byte_at_its_end():
    # Every size 10 us: (time - alpha) / size is 0, no bandwidth regime; beta is then the median
    # of time / size over the 4 largest sizes (16, 32, 64, 128 KiB): (10/32768 + 10/65536) / 2,
    # a finite bandwidth rather than an infinite one.
    from collsynth.timing.fit import fit_alpha_beta

    fit = fit_alpha_beta(_log([(1 << k, 10.0, 10.0) for k in range(10, 18)]), heldout=False)
    assert fit.beta_us_per_byte == pytest.approx((10 / 32768 + 10 / 65536) / 2)


def _implausible(points) -> str:
    from collsynth.timing.fit import check_plausible, fit_log

    with pytest.raises(FileFormatError) as info:
        check_plausible(fit_log(_log(points), heldout=False), 1e-9, "a test allows")
    return str(info.value)


def test_an_implausible_fit_names_the_largest_fall_of_the_times():
    # 10 -> 9 us falls by 1.11x, 20 -> 10 us by 2x: the message names the second.
    message = _implausible([(1024, 10.0, 10.0), (2048, 9.0, 9.0), (4096, 20.0, 20.0),
                            (8192, 10.0, 10.0)])
    assert "(4096 bytes: 20 us, 8192 bytes: 10 us)" in message


def test_equal_times_are_not_a_fall():
    message = _implausible([(1024, 10.0, 10.0), (2048, 10.0, 10.0), (4096, 20.0, 20.0),
                            (8192, 30.0, 30.0)])
    assert "fall" not in message


# -- the runtimes' latency tables, as NCCL's and RCCL's source writes them -------------------------


def test_nccl_latency_tables_are_those_of_nccl_2_30_7():
    # ncclTunerConstantsDefaults in NVIDIA/nccl v2.30.7-1 src/graph/tuning.cc, transcribed:
    # baseLatencies {6.8, 14.0, 8.4} Tree, {6.6, 14.0, 8.4} Ring, zeros for CollNet Direct and
    # Chain, NVLS and NVLS Tree, {8.0, 8.0, 8.0} PAT; hwLatencies per NVLINK / PCI / NET rows.
    from collsynth.runtimes.constants import NCCL_BASE_LATENCY_US, NCCL_HOP_LATENCY_US

    order = ("tree", "ring", "collnet_direct", "collnet_chain", "nvls", "nvls_tree", "pat")
    assert [tuple(NCCL_BASE_LATENCY_US[a]) for a in order] == [
        (6.8, 14.0, 8.4), (6.6, 14.0, 8.4), (0, 0, 0), (0, 0, 0), (0, 0, 0), (0, 0, 0),
        (8.0, 8.0, 8.0)]
    expected = {
        "nvlink": [(0.6, 1.25, 4.0), (0.6, 1.9, 3.4), (0, 0, 3.7), (0, 0, 2.8), (0, 0, 25),
                   (0, 0, 25), (0, 0, 4.0)],
        "pci": [(1.0, 1.9, 4.0), (1.0, 2.5, 5.7), (0, 0, 3.7), (0, 0, 2.8), (0, 0, 0), (0, 0, 0),
                (0, 0, 4.0)],
        "net": [(5.0, 8.5, 14), (2.7, 4.0, 14.0), (0, 0, 31), (0, 0, 30), (0, 0, 18),
                (0, 0, 20.9), (0, 0, 14)],
    }
    for hardware, rows in expected.items():
        assert [tuple(NCCL_HOP_LATENCY_US[hardware][a]) for a in order] == rows, hardware


def test_rccl_tuning_model_5_network_ring_simple_hop_is_320_us():
    # ROCm/rccl src/graph/tuning.cc, tuning_model_5, NET row: Ring (LL/LL128/Simple)
    # { 9.5, ..., 320.0 }, Tree { 10.5, ..., 25.0 } (LL128 not compared: the mirrored RCCL
    # writes 0.0 there, the later release collsynth cites is not mirrored).
    from collsynth.runtimes.constants import RCCL_HOP_LATENCY_US

    net = RCCL_HOP_LATENCY_US[5]["net"]
    assert (net["ring"][0], net["ring"][2], net["tree"][0], net["tree"][2]) == (
        9.5, 320.0, 10.5, 25.0)


def test_128_channels_are_rccls_maxchannels_and_accepted():
    # ROCm/rccl src/include/device.h: #define MAXCHANNELS 128; one more is no runtime's.
    from collsynth.errors import InputTooLargeError
    from collsynth.runtimes.constants import check_channels

    assert check_channels(128) == 128
    with pytest.raises(InputTooLargeError):
        check_channels(129)


# -- runtime versions ------------------------------------------------------------------------------


def test_a_version_a_user_gives_has_at_most_three_parts():
    # parse_given_version's contract: MAJOR.MINOR or MAJOR.MINOR.PATCH; a fourth part is refused
    # rather than read as its first two.
    from collsynth.runtimes.registry import parse_given_version

    assert parse_given_version("v2.27.3+cuda12.4") == (2, 27)
    with pytest.raises(ValueError):
        parse_given_version("2.18.5.1")
