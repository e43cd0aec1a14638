"""Mutation round 9: the benchmark log readers (collsynth.timing.logs) and the timing models.

Each test kills a mutant the earlier suites let live. Every expected figure is worked out by
hand in the comment next to it (the nccl-tests table layout, two-decimal printing, NCCL's source
text), never from the code's output.
"""

from __future__ import annotations

import pytest

from collsynth.errors import FileFormatError
from collsynth.timing.logs import parse_log

HEADER = ("#       size   count  type  redop  root   time  algbw  busbw #wrong   time  algbw  busbw "
          "#wrong")


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


# -- repeats ----------------------------------------------------------------------------------------


def test_repeats_exactly_twice_apart_are_kept():
    # docs/timing.md: times of one size and half are refused when *more than* 2x apart;
    # 10 us and 20 us are exactly 2x apart.
    text = "\n".join(["# nThread 1 nGpus 4", *_ranks(4), HEADER, _row(1024, 10.0),
                      _row(1024, 20.0), ""])
    log = parse_log(text, name="all_reduce_perf.txt")
    assert sorted(r.time_us for r in log.rows) == [10.0, 10.0, 20.0, 20.0]
