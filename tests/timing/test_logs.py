"""The benchmark-log readers against the real logs in data/nccl-tests, fixtures, and bad input.

Every file under ``data/nccl-tests`` has a row in :data:`SHARED` (a test fails when a
log is added without one). The row counts were counted by hand from the files: table lines with a
size above 0, two rows each (out-of-place and in-place).
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest

from collsynth.errors import CollsynthError, FileFormatError, InputTooLargeError
from collsynth.timing.logs import (
    BenchmarkLog,
    canonical_collective,
    load_log,
    parse_log,
)

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT / "data" / "nccl-tests"
FIXTURES = ROOT / "tests" / "fixtures" / "logs"
BAD = ROOT / "tests" / "fixtures" / "bad"

#: file -> (collective, ranks, rows, size-0 lines skipped, first size, last size)
SHARED_LOGS = {
    # sizes 8 B .. 1 GiB: 28 table lines; ranks from the 16 "#   Rank N" lines (2 nodes)
    "A100-16gpu-2node-p4d_all_reduce_awsdocs.txt": ("allreduce", 16, 56, 0, 8, 1 << 30),
    # 34 table lines, 5 of size 0; 32 B .. 8 GiB: 29 lines
    "A100-8gpu_all_gather_superbench.txt": ("allgather", 8, 58, 5, 32, 1 << 33),
    # 34 table lines, 2 of size 0; 4 B .. 8 GiB: 32 lines
    "A100-8gpu_all_reduce_superbench.txt": ("allreduce", 8, 64, 2, 4, 1 << 33),
    # 34 table lines, 5 of size 0 (empty redop cell); 32 B .. 8 GiB: 29 lines
    "A100-8gpu_alltoall_superbench.txt": ("alltoall", 8, 58, 5, 32, 1 << 33),
    "A100-8gpu_reduce_scatter_superbench.txt": ("reduce_scatter", 8, 58, 5, 32, 1 << 33),
    # [1,0]<stdout>: tags, redop+root columns, no "# Rank" lines: 8 ranks from busbw/algbw = 1.75;
    # 8 B .. 16 GiB: 32 lines
    "H100-8gpu-p5_all_reduce_awsome.txt": ("allreduce", 8, 64, 0, 8, 1 << 34),
    # old layout with an error column of 1e-07-like values; 8 B .. 128 MiB: 25 lines
    "V100-8gpu-dgx1topo_all_reduce_konnase.txt": ("allreduce", 8, 50, 0, 8, 1 << 27),
}

#: fixture -> (collective, ranks, rows, size-0 lines, source)
FIXTURE_LOGS = {
    "nccl_tests_srun_allgather.txt": ("allgather", 4, 18, 1, "nccl-tests"),
    "nccl_tests_all_reduce.json": ("allreduce", 8, 26, 0, "nccl-tests-json"),
    "param_comms_tabs.txt": ("allreduce", 8, 26, 0, "param-comms"),
    "param_comms_right_aligned.txt": ("alltoall", 16, 10, 0, "param-comms"),
    "param_comms_no_busbw.txt": ("allgather", 4, 10, 0, "param-comms"),
}

#: bad fixture -> the error message (regex), which names the line where there is one
BAD_LOGS = {
    "log_truncated_row_all_reduce.txt": r": line 34: a result row with 6 cells; expected 12 "
                                        r"\(size count type redop",
    "log_bad_time_all_reduce.txt": r": line 30: time '52\.7\.8' is not a number",
    "log_negative_time_all_reduce.txt": r": line 26: time '-9\.13': expected microseconds > 0",
    "log_not_utf8_all_reduce.txt": r": line 21: not UTF-8 text",
    "log_no_rows_all_reduce.txt": r": no nccl-tests result rows .* found",
    "log_no_collective.txt": r": cannot tell which collective was measured",
    "log_no_ranks_all_reduce.txt": r": cannot tell the number of ranks",
    "log_param_missing_cell.txt": r": line 8: a COMMS-RES row with 8 cells; the header has 9",
    "log_json_truncated.json": r": malformed JSON at line \d+ column \d+",
    "log_json_bad_time.json": r": line \d+: results\[3\]\.in_place\.time: 'fast': expected a "
                              r"finite number",
    "log_json_infinity_time.json": r": Infinity is not a number JSON allows",
    "log_time_1e308_all_reduce.txt": r": line 27: time = 1e\+308: expected a finite number >= "
                                     r"0\.001 and <= 3\.6e\+09 \(microseconds: a call takes "
                                     r"from 1 ns to an hour",
    "log_size_1e29_all_reduce.txt": r": line 27: size = 100000000000000000000000000000: expected "
                                    r"a whole number from 0 to 1125899906842624",
    "log_5000_digit_rank_all_reduce.txt": r": line 12: Rank: a number of 5000 characters; "
                                          r"numbers have at most 100",
}


def shared(name: str) -> Path:
    path = SHARED / name
    if not path.is_file():
        pytest.fail(f"{path} is missing: the tests read the nccl-tests logs from "
                    "data/nccl-tests in the repository")
    return path


# -- the shared logs ----------------------------------------------------------------------------


def test_every_shared_log_has_a_row():
    assert SHARED.is_dir(), f"{SHARED} is missing"
    assert {p.name for p in SHARED.iterdir() if p.name != "README.md"} == set(SHARED_LOGS)


@pytest.mark.parametrize("name", sorted(SHARED_LOGS))
def test_shared_log(name: str):
    collective, ranks, count, zero, first, last = SHARED_LOGS[name]
    log = load_log(shared(name))
    assert (log.collective, log.ranks, len(log.rows), log.zero_size_lines) == (
        collective, ranks, count, zero)
    assert log.source == "nccl-tests"
    assert log.sizes[0] == first and log.sizes[-1] == last
    # Out-of-place then in-place, one pair per table line, sizes ascending.
    assert [r.in_place for r in log.rows] == [False, True] * (count // 2)
    assert all(a.line == b.line and a.size_bytes == b.size_bytes
               for a, b in zip(log.rows[::2], log.rows[1::2]))
    assert list(log.sizes) == sorted({r.size_bytes for r in log.rows})
    assert all(r.time_us > 0 for r in log.rows)


@pytest.mark.parametrize("name", sorted(SHARED_LOGS))
def test_rows_name_their_line(name: str):
    path = shared(name)
    lines = path.read_text().splitlines()
    for row in load_log(path).rows:
        cells = lines[row.line - 1].split()
        assert str(row.size_bytes) in cells
        assert f"{row.time_us:g}" in {f"{float(c):g}" for c in cells
                                      if re.fullmatch(r"[\d.]+", c)}


def test_old_layout_values():
    log = load_log(shared("V100-8gpu-dgx1topo_all_reduce_konnase.txt"))
    first, second = log.rows[0], log.rows[1]
    assert (first.size_bytes, first.count, first.dtype, first.op, first.root) == (
        8, 2, "float", "sum", None)
    assert (first.time_us, first.algbw_gbps, first.busbw_gbps, first.errors) == (
        48.46, 0.0, 0.0, 1e-07)
    assert (second.time_us, second.in_place) == (48.17, True)
    assert log.rows[-1].busbw_gbps == 128.92


def test_new_layout_with_mpi_tags():
    log = load_log(shared("H100-8gpu-p5_all_reduce_awsome.txt"))
    row = log.rows[-2]
    assert (row.size_bytes, row.count, row.op, row.root, row.time_us, row.errors) == (
        17179869184, 4294967296, "sum", -1, 62239.0, 0.0)


def test_empty_redop_cell_and_na():
    log = load_log(shared("A100-8gpu_alltoall_superbench.txt"))
    assert {r.op for r in log.rows} == {None}
    assert {r.errors for r in log.rows} == {None}  # N/A: run with -c 0
    assert log.rows[0].time_us == 89.00


def test_interleaved_info_lines_and_indentation():
    log = load_log(shared("A100-16gpu-2node-p4d_all_reduce_awsdocs.txt"))
    assert log.rows[0].time_us == 158.9
    assert log.rows[-1].time_us == 70110.0


# -- fixtures in the other formats ----------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(FIXTURE_LOGS))
def test_fixture_log(name: str):
    collective, ranks, count, zero, source = FIXTURE_LOGS[name]
    log = load_log(FIXTURES / name)
    assert (log.collective, log.ranks, len(log.rows), log.zero_size_lines, log.source) == (
        collective, ranks, count, zero, source)


def test_every_fixture_has_a_row():
    assert {p.name for p in FIXTURES.iterdir()} == set(FIXTURE_LOGS)


def test_srun_labels_and_new_header():
    log = load_log(FIXTURES / "nccl_tests_srun_allgather.txt")
    row = log.rows[0]
    assert (row.size_bytes, row.count, row.op, row.root, row.errors, row.line) == (
        1024, 64, None, -1, None, 20)  # "none" redop reads as no reduction


def test_json_fields():
    log = load_log(FIXTURES / "nccl_tests_all_reduce.json")
    doc = json.loads((FIXTURES / "nccl_tests_all_reduce.json").read_text())
    entry = doc["results"][5]
    out, inp = log.rows[10], log.rows[11]
    assert (out.size_bytes, out.count, out.op, out.root) == (entry["size"], entry["count"],
                                                            "sum", -1)
    assert (out.time_us, out.in_place, inp.time_us, inp.in_place) == (
        entry["out_of_place"]["time"], False, entry["in_place"]["time"], True)
    assert out.busbw_gbps == entry["out_of_place"]["bus_bw"]


def test_param_columns():
    tabs = load_log(FIXTURES / "param_comms_tabs.txt")
    assert tabs.rows[-1].size_bytes == 268435456 and tabs.rows[-1].busbw_gbps is not None
    aligned = load_log(FIXTURES / "param_comms_right_aligned.txt")
    # The time is the p50 column, not min or max.
    assert aligned.rows[0].time_us == 60.1
    no_busbw = load_log(FIXTURES / "param_comms_no_busbw.txt")
    assert {r.busbw_gbps for r in no_busbw.rows} == {None}


# -- layouts written inline -----------------------------------------------------------------------

_ROW = "{size:>12} {count:>12}  float  sum  -1  {t:>7}  1.00  1.75  0  {t:>7}  1.00  1.75  0"


def _rows(*sizes: int) -> str:
    return "\n".join(_ROW.format(size=s, count=s // 4, t=f"{10 + s / 1e6:.2f}") for s in sizes)


def test_no_header_with_redop_and_root():
    log = parse_log(_rows(1024, 4096), name="x_all_reduce_perf.log", ranks=8)
    assert (log.collective, len(log.rows), log.rows[0].root) == ("allreduce", 4, -1)


def test_per_iteration_layout_and_timestamps():
    header = ("#       size         count      type   redop    root     time   algbw   busbw "
              "#wrong    i_min    i_max    i_p99    i_cv%     time   algbw   busbw #wrong    "
              "i_min    i_max    i_p99    i_cv%     timestamp")
    row = ("        1024           256     float     sum      -1    16.43    0.06    0.11      0"
           "    15.00    18.00    17.90     2.10    15.61    0.07    0.11      0    15.00    16.00"
           "    15.90     1.20  2025-06-03 14:02:11")
    log = parse_log(f"{header}\n{row}\n", name="all_reduce.txt", ranks=8)
    assert [(r.time_us, r.algbw_gbps, r.in_place) for r in log.rows] == [
        (16.43, 0.06, False), (15.61, 0.07, True)]


def test_overrides_and_spellings():
    log = parse_log(_rows(1024, 4096), name="bench.log", collective="All-Gather", ranks=4)
    assert (log.collective, log.ranks) == ("allgather", 4)
    assert canonical_collective("reduce_scatter_perf") == "reduce_scatter"
    assert log.busbw_per_algbw == 0.75   # nccl-tests: (n - 1) / n


def test_collective_from_command_line_beats_file_name():
    text = "$ mpirun -np 8 ./build/reduce_scatter_perf -b 8 -e 1M\n" + _rows(1024, 4096)
    assert parse_log(text, name="all_gather.txt", ranks=8).collective == "reduce_scatter"


def test_ranks_from_ratio_need_agreement():
    # busbw / algbw = 1.75 on every row: 8 ranks of an allreduce.
    assert parse_log(_rows(1 << 20, 1 << 22), name="all_reduce.txt").ranks == 8


def test_json_variants():
    doc = {"version": 1, "args": ["./alltoall_perf"],
           "config": {"nthreads": 2, "ngpus": 2, "devices": [{"rank": 0}, {"rank": 4}]},
           "results": [{"size": 0, "count": 0, "type": "float", "redop": "none", "root": "-1",
                        "out_of_place": None, "in_place": {"time": 1.0, "alg_bw": 0,
                                                           "bus_bw": 0, "nwrong": None}},
                       {"size": 4096, "count": 128, "type": "float", "redop": "none",
                        "root": "    -1", "out_of_place": None,
                        "in_place": {"cpu_time": 20.5, "alg_bw": 0.2, "bus_bw": 0.175,
                                     "nwrong": "nan"}}]}
    log = parse_log(json.dumps(doc, indent=1), name="a.json")
    assert (log.collective, log.ranks, log.zero_size_lines) == ("alltoall", 8, 1)
    (row,) = log.rows
    assert (row.time_us, row.in_place, row.op, row.root, row.errors) == (
        20.5, True, None, -1, None)
    doc["version"] = 3
    with pytest.raises(FileFormatError, match="nccl-tests JSON version 3"):
        parse_log(json.dumps(doc), name="a.json")


def test_param_headerless_rows():
    row7 = "\tCOMMS-RES\t1024\t256\t30.1\t31.0\t33.2\t0.034\t0.060"
    row9 = "\tCOMMS-RES-all_reduce      4096      1024      31.0      32.0      33.0      30.0" \
           "      35.0      0.132      0.231"
    log = parse_log(f"collective=all_reduce\n{row7}\n{row9}\n", name="p.txt", ranks=8)
    assert [r.time_us for r in log.rows] == [30.1, 31.0]
    with pytest.raises(FileFormatError, match=r"line 1: a COMMS-RES row with 5 cells and no "
                                              r"COMMS-RES header"):
        parse_log("\tCOMMS-RES\t1024\t256\t30.1\t31.0\t33.2\n", name="all_reduce.txt", ranks=8)


def test_param_skips_quantized_and_pt2pt_rows():
    text = ("\tCOMMS-RES-QUANT-all_reduce\t1024\t256\t1.0\t30.0\t1.0\t32.0\n"
            "\tCOMMS-RES\t1024\t256\t30.1\t31.0\t33.2\t0.034\t0.060\n")
    assert len(parse_log(text, name="all_reduce.txt", ranks=8).rows) == 1


# -- bad input ------------------------------------------------------------------------------------


def test_every_bad_log_fixture_has_a_case():
    assert {p.name for p in BAD.glob("log_*")} == set(BAD_LOGS)


@pytest.mark.parametrize("name", sorted(BAD_LOGS))
def test_bad_log(name: str):
    path = BAD / name
    with pytest.raises(FileFormatError, match=BAD_LOGS[name]) as info:
        load_log(path)
    assert info.value.path == str(path)
    assert str(info.value).startswith(str(path))


def test_empty_missing_and_too_large(tmp_path: Path):
    with pytest.raises(FileFormatError, match="the file is empty"):
        load_log(BAD / "empty.txt")
    with pytest.raises(FileFormatError, match="no such file"):
        load_log(tmp_path / "nothing.txt")
    with pytest.raises(InputTooLargeError, match="more than the 100 a benchmark log may have"):
        load_log(shared("V100-8gpu-dgx1topo_all_reduce_konnase.txt"), max_bytes=100)
    with pytest.raises(FileFormatError, match="ranks = 0"):
        parse_log(_rows(1024), name="all_reduce.txt", ranks=0)


def test_damaged_logs_never_raise_anything_else():
    """Cut or scrambled logs give a BenchmarkLog or a CollsynthError, never another exception."""
    rng = random.Random(5)
    texts = [shared(n).read_text() for n in sorted(SHARED_LOGS)]
    texts += [(FIXTURES / n).read_text() for n in sorted(FIXTURE_LOGS)]
    cases = 0
    for text in texts:
        for _ in range(25):
            chars = list(text)
            for _ in range(rng.randint(1, 6)):
                chars[rng.randrange(len(chars))] = rng.choice("0.9 -#\n{}[]:NA/x\t\"")
            cut = rng.randint(0, len(chars))
            for candidate in ("".join(chars), text[:cut]):
                cases += 1
                try:
                    result = parse_log(candidate, name="all_reduce.txt")
                except CollsynthError:
                    continue
                assert isinstance(result, BenchmarkLog) and result.rows
    assert cases == 2 * 25 * len(texts)
