"""The log reader on the public runs of other machines in data/public-logs.

Every file there has a row in :data:`PUBLIC_LOGS` (a test fails when one is added without it).
Row counts were counted by hand from the files (table lines with a size above 0, two rows each:
out-of-place and in-place; one row per table line for the busbw tables), and one line of each
file was read by eye: its size, time, algbw and busbw are written below as printed.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from collsynth.errors import CollsynthError, FileFormatError
from collsynth.timing.logs import BenchmarkLog, load_log, parse_log

ROOT = Path(__file__).resolve().parents[2]
PUBLIC = ROOT / "data" / "public-logs"

GiB = 1 << 30

#: file -> (collective, ranks, rows, size-0 lines, first size, last size, source format)
PUBLIC_LOGS = {
    # "0: " prefixes, no rank lines (16 from busbw/algbw = 1.875); 8 B .. 2 GiB: 29 lines
    "A100-16gpu-2node-p4de_all_reduce_awsome.txt": ("allreduce", 16, 58, 0, 8, 2 * GiB, "nccl-tests"),
    # 1 KiB .. 8 GiB: 24 lines, 16 "# Rank" lines
    "B200-16gpu-2node-gcp-a4_all_gather_dranet.txt": ("allgather", 16, 48, 0, 1024, 8 * GiB, "nccl-tests"),
    # 8 B .. 1 GiB asked: 28 lines, the first two (8 and 16 B) printed as size 0
    "B200-2gpu-2node-1ppn-gcp-a4_all_gather_dranet.txt": ("allgather", 2, 52, 2, 32, GiB, "nccl-tests"),
    # last rank line "Rank 1439"; 512 MiB .. 16 GiB: 6 lines
    "GB200-NVL72-1440gpu-20rack_all_reduce_largesizes_coreweave.txt": ("allreduce", 1440, 12, 0, 512 << 20, 16 * GiB, "nccl-tests"),
    "GB200-NVL72-144gpu-2rack_all_reduce_largesizes_coreweave.txt": ("allreduce", 144, 12, 0, 512 << 20, 16 * GiB, "nccl-tests"),
    # 512 MiB .. 8 GiB: 5 lines
    "GB200-NVL72-72gpu-1rack_all_reduce_largesizes_coreweave.txt": ("allreduce", 72, 10, 0, 512 << 20, 8 * GiB, "nccl-tests"),
    # srun " 0: " labels, 8 B .. 4 GiB: 30 lines
    "GH200-4gpu-1node-alps-slingshot_all_reduce_boeschf.txt": ("allreduce", 4, 60, 0, 8, 4 * GiB, "nccl-tests"),
    "GH200-8gpu-2node-alps-slingshot_all_reduce_boeschf.txt": ("allreduce", 8, 60, 0, 8, 4 * GiB, "nccl-tests"),
    "GH200-16gpu-4node-alps-slingshot_all_reduce_boeschf.txt": ("allreduce", 16, 60, 0, 8, 4 * GiB, "nccl-tests"),
    "GH200-64gpu-16node-alps-slingshot_all_reduce_boeschf.txt": ("allreduce", 64, 60, 0, 8, 4 * GiB, "nccl-tests"),
    # Markdown page: "#" missing on the first rank line, a ``` fence; 8 B .. 8 GiB: 31 lines
    "H100-16gpu-2node-gcp-a3mega_all_reduce_lessizzmore.txt": ("allreduce", 16, 62, 0, 8, 8 * GiB, "nccl-tests"),
    # 8 B .. 16 GiB: 32 lines
    "H100-16gpu-2node-p5_all_reduce_awsome.txt": ("allreduce", 16, 64, 0, 8, 16 * GiB, "nccl-tests"),
    # 96 ranks from busbw/algbw = 1.9792 (see the README); 512 MiB .. 8 GiB: 5 lines
    "H100-96gpu-ib-sharp_all_reduce_largesizes_coreweave.txt": ("allreduce", 96, 10, 0, 512 << 20, 8 * GiB, "nccl-tests"),
    # one process, -g 8, two nodes: rank lines 0..15; 8 B .. 16 GiB
    "H200-16gpu-2node-1nic-tcp_all_reduce_ring_schmaustech.txt": ("allreduce", 16, 64, 0, 8, 16 * GiB, "nccl-tests"),
    # 1 KiB .. 8 GiB: 24 lines
    "H200-2gpu-2node-1ppn-gcp-a3ultra_all_gather_dranet.txt": ("allgather", 2, 48, 0, 1024, 8 * GiB, "nccl-tests"),
    "MI300X-16gpu-2node_all_reduce_hisohara-aac10.txt": ("allreduce", 16, 64, 0, 8, 16 * GiB, "nccl-tests"),
    "MI300X-8gpu_all_reduce_hisohara-aac8.txt": ("allreduce", 8, 62, 0, 8, 8 * GiB, "nccl-tests"),
    # 4, 8, 16 GiB: 3 lines; no rank lines, ranks from busbw/algbw
    "MI325X-8gpu-1node_all_reduce_largesizes_hisohara-aac11.txt": ("allreduce", 8, 6, 0, 4 * GiB, 16 * GiB, "nccl-tests"),
    "MI325X-16gpu-2node_all_reduce_largesizes_hisohara-aac11.txt": ("allreduce", 16, 6, 0, 4 * GiB, 16 * GiB, "nccl-tests"),
    "MI325X-32gpu-4node_all_reduce_largesizes_hisohara-aac11.txt": ("allreduce", 32, 6, 0, 4 * GiB, 16 * GiB, "nccl-tests"),
    "MI325X-64gpu-8node_all_reduce_largesizes_hisohara-aac11.txt": ("allreduce", 64, 6, 0, 4 * GiB, 16 * GiB, "nccl-tests"),
    "MI355X-16gpu-2node-pollara_all_reduce_hisohara-aac14.txt": ("allreduce", 16, 62, 0, 8, 8 * GiB, "nccl-tests"),
    # busbw tables: 24 rows 1K .. 8G, one (in-place) row each; ranks from "## ranks: N"
    "A100-8gpu-azure-nda100v4_all_reduce_busbw-table_azure-guide.txt": ("allreduce", 8, 24, 0, 1024, 8 * GiB, "busbw-table"),
    "GB200-azure-ndgb200v6_all_reduce_busbw-table_azure-guide.txt": ("allreduce", 4, 24, 0, 1024, 8 * GiB, "busbw-table"),
    "H100-8gpu-azure-ndh100v5_all_reduce_busbw-table_azure-guide.txt": ("allreduce", 8, 24, 0, 1024, 8 * GiB, "busbw-table"),
    "H200-8gpu-azure-ndh200v5_all_reduce_busbw-table_azure-guide.txt": ("allreduce", 8, 24, 0, 1024, 8 * GiB, "busbw-table"),
    "MI300X-8gpu-azure-ndmi300xv5_all_reduce_busbw-table_azure-guide.txt": ("allreduce", 8, 24, 0, 1024, 8 * GiB, "busbw-table"),
    # the msccl performance page's table as CSV: 21 in-place rows 1 KiB .. 1 GiB, ranks column
    "H100-8gpu-azure-ndh100v5_all_reduce_nccl_msccl-perf.csv": ("allreduce", 8, 21, 0, 1024, GiB, "csv"),
    "H100-8gpu-azure-ndh100v5_all_reduce_msccl_msccl-perf.csv": ("allreduce", 8, 21, 0, 1024, GiB, "csv"),
    "H100-8gpu-azure-ndh100v5_all_gather_nccl_msccl-perf.csv": ("allgather", 8, 21, 0, 1024, GiB, "csv"),
    "H100-8gpu-azure-ndh100v5_all_gather_msccl_msccl-perf.csv": ("allgather", 8, 21, 0, 1024, GiB, "csv"),
}

MiB = 1 << 20
#: file -> (line, size, out-of-place time, algbw, busbw) read by eye from that line of the file.
HAND_READ = {
    "A100-16gpu-2node-p4de_all_reduce_awsome.txt": (29, MiB, 309.4, 3.39, 6.35),
    "B200-16gpu-2node-gcp-a4_all_gather_dranet.txt": (50, MiB, 998.2, 1.05, 0.98),
    "B200-2gpu-2node-1ppn-gcp-a4_all_gather_dranet.txt": (46, MiB, 46.45, 22.58, 11.29),
    "GB200-NVL72-1440gpu-20rack_all_reduce_largesizes_coreweave.txt": (22, 4 * GiB, 24782, 173.31, 346.38),
    "GB200-NVL72-144gpu-2rack_all_reduce_largesizes_coreweave.txt": (23, 4 * GiB, 11469, 374.47, 743.09),
    "GB200-NVL72-72gpu-1rack_all_reduce_largesizes_coreweave.txt": (23, 4 * GiB, 10094, 425.49, 839.16),
    "GH200-4gpu-1node-alps-slingshot_all_reduce_boeschf.txt": (81, MiB, 18.53, 56.60, 84.90),
    "GH200-8gpu-2node-alps-slingshot_all_reduce_boeschf.txt": (89, MiB, 353.2, 2.97, 5.20),
    "GH200-16gpu-4node-alps-slingshot_all_reduce_boeschf.txt": (105, MiB, 431.0, 2.43, 4.56),
    "GH200-64gpu-16node-alps-slingshot_all_reduce_boeschf.txt": (201, MiB, 298.0, 3.52, 6.93),
    "H100-16gpu-2node-gcp-a3mega_all_reduce_lessizzmore.txt": (55, MiB, 203.2, 5.16, 9.68),
    "H100-16gpu-2node-p5_all_reduce_awsome.txt": (29, MiB, 123.2, 8.51, 15.95),
    "H100-96gpu-ib-sharp_all_reduce_largesizes_coreweave.txt": (23, 512 * MiB, 2984.6, 179.88, 356.01),
    "H200-16gpu-2node-1nic-tcp_all_reduce_ring_schmaustech.txt": (53, MiB, 100.5, 10.43, 19.56),
    "H200-2gpu-2node-1ppn-gcp-a3ultra_all_gather_dranet.txt": (38, MiB, 61.30, 17.11, 8.55),
    "MI300X-16gpu-2node_all_reduce_hisohara-aac10.txt": (80, MiB, 414.8, 2.53, 4.74),
    "MI300X-8gpu_all_reduce_hisohara-aac8.txt": (56, MiB, 28.39, 36.94, 64.64),
    "MI325X-8gpu-1node_all_reduce_largesizes_hisohara-aac11.txt": (22, 4 * GiB, 23719, 181.07, 316.88),
    "MI325X-16gpu-2node_all_reduce_largesizes_hisohara-aac11.txt": (22, 4 * GiB, 23192, 185.19, 347.23),
    "MI325X-32gpu-4node_all_reduce_largesizes_hisohara-aac11.txt": (22, 4 * GiB, 23904, 179.68, 348.12),
    "MI325X-64gpu-8node_all_reduce_largesizes_hisohara-aac11.txt": (22, 4 * GiB, 24572, 174.79, 344.13),
    "MI355X-16gpu-2node-pollara_all_reduce_hisohara-aac14.txt": (134, MiB, 81.37, 12.89, 24.16),
}

#: busbw table -> (line of the "| 1M | ... |" row, its busbw): the time is derived by hand below.
BUSBW_1M = {
    "A100-8gpu-azure-nda100v4_all_reduce_busbw-table_azure-guide.txt": (38, 36.22),
    "GB200-azure-ndgb200v6_all_reduce_busbw-table_azure-guide.txt": (38, 80.48),
    "H100-8gpu-azure-ndh100v5_all_reduce_busbw-table_azure-guide.txt": (38, 43.70),
    "H200-8gpu-azure-ndh200v5_all_reduce_busbw-table_azure-guide.txt": (38, 57.15),
    "MI300X-8gpu-azure-ndmi300xv5_all_reduce_busbw-table_azure-guide.txt": (37, 22.41),
}

#: CSV transcription -> (line, time at 1 MiB) as the source page's table prints it (its "1MB" row).
TABLE_1M = {
    "H100-8gpu-azure-ndh100v5_all_reduce_nccl_msccl-perf.csv": (19, 31.94),
    "H100-8gpu-azure-ndh100v5_all_reduce_msccl_msccl-perf.csv": (19, 22.31),
    "H100-8gpu-azure-ndh100v5_all_gather_nccl_msccl-perf.csv": (19, 18.33),
    "H100-8gpu-azure-ndh100v5_all_gather_msccl_msccl-perf.csv": (19, 12.3),
}


def public(name: str) -> Path:
    path = PUBLIC / name
    if not path.is_file():
        pytest.fail(f"{path} is missing: the tests read data/public-logs in the repository")
    return path


def test_every_public_log_has_a_row():
    assert PUBLIC.is_dir(), f"{PUBLIC} is missing"
    files = {p.name for p in PUBLIC.iterdir() if p.name != "README.md"}
    assert files == set(PUBLIC_LOGS)
    assert set(HAND_READ) | set(BUSBW_1M) | set(TABLE_1M) == set(PUBLIC_LOGS)


def test_the_readme_names_every_file():
    readme = (PUBLIC / "README.md").read_text(encoding="utf-8")
    for name in PUBLIC_LOGS:
        assert f"`{name}`" in readme, name


@pytest.mark.parametrize("name", sorted(PUBLIC_LOGS))
def test_public_log(name: str):
    collective, ranks, count, zero, first, last, source = PUBLIC_LOGS[name]
    log = load_log(public(name))
    assert (log.collective, log.ranks, len(log.rows), log.zero_size_lines, log.source) == (
        collective, ranks, count, zero, source)
    assert (log.sizes[0], log.sizes[-1]) == (first, last)
    assert all(r.time_us > 0 for r in log.rows)
    if source == "nccl-tests":
        assert [r.in_place for r in log.rows] == [False, True] * (count // 2)
    else:
        assert all(r.in_place for r in log.rows) and len(set(log.sizes)) == count


@pytest.mark.parametrize("name", sorted(HAND_READ))
def test_one_row_read_by_hand(name: str):
    line, size, time_us, algbw, busbw = HAND_READ[name]
    rows = [r for r in load_log(public(name)).rows if r.line == line]
    assert len(rows) == 2, f"line {line} should give an out-of-place and an in-place row"
    out = rows[0]
    assert (out.size_bytes, out.time_us, out.algbw_gbps, out.busbw_gbps, out.in_place) == (
        size, time_us, algbw, busbw, False)
    # algbw = size / time, as nccl-tests prints it: two decimals, a time of 4 or 5 digits.
    assert size / (time_us * 1e3) == pytest.approx(algbw, rel=6e-4, abs=0.006)


@pytest.mark.parametrize("name", sorted(BUSBW_1M))
def test_busbw_table_row_by_hand(name: str):
    line, busbw = BUSBW_1M[name]
    log = load_log(public(name))
    (row,) = [r for r in log.rows if r.line == line]
    n = log.ranks
    # allreduce busbw = algbw * 2(n-1)/n and algbw = size / time, so time = size * 2(n-1)/n / busbw:
    # e.g. H100: 1048576 B * 14/8 / 43.70 GB/s = 41.99 us.
    assert row.size_bytes == 1048576 and row.busbw_gbps == busbw and row.algbw_gbps is None
    assert row.time_us == pytest.approx(1048576 * 2 * (n - 1) / n / (busbw * 1e3), rel=1e-12)


@pytest.mark.parametrize("name", sorted(TABLE_1M))
def test_transcribed_table_row_by_hand(name: str):
    line, time_us = TABLE_1M[name]
    log = load_log(public(name))
    (row,) = [r for r in log.rows if r.line == line]
    assert (row.size_bytes, row.time_us, row.in_place) == (MiB, time_us, True)
    # The page's own header: msccl-executor on NCCL 2.18.3.
    assert (log.runtime, log.runtime_version) == ("nccl", "2.18.3")


def test_busbw_table_size_labels_are_the_powers_of_two():
    # The labels 65K, 132K, 524K, 33M, 67M, 134M, 268M, 536M stand for 2^16, 2^17, 2^19, 2^25..2^29.
    log = load_log(public("H100-8gpu-azure-ndh100v5_all_reduce_busbw-table_azure-guide.txt"))
    assert log.sizes == tuple(1 << k for k in range(10, 34))
    assert (log.runtime, log.runtime_version) == ("nccl", "2.18.5")  # its specification row


def test_busbw_table_needs_a_rank_count():
    text = public("GB200-azure-ndgb200v6_all_reduce_busbw-table_azure-guide.txt").read_text()
    without = "\n".join(l for l in text.splitlines() if not l.startswith("## ranks:"))
    with pytest.raises(FileFormatError, match=r": cannot tell the number of ranks: a busbw "
                                              r"table does not say it"):
        parse_log(without, name="gb200_all_reduce.txt")
    assert parse_log(without, name="gb200_all_reduce.txt", ranks=4).ranks == 4


_TABLE = "## ranks: 8\n| Message Size (Bytes) | X (GB/s) |\n| --- | --- |\n{rows}\n"


@pytest.mark.parametrize("rows, message", [
    ("| 1K | 0.04 |\n| 100K | 2.0 |", r": line 5: size '100K' is not a power of two within 5%"),
    ("| 1K | 0.04 | 3 |", r": line 4: a table row with 3 cells; expected 2"),
    ("| 1K | 0.00 |", r": line 4: busbw '0.00' for size '1K': a time is derived from a busbw > 0"),
    ("| 1K | fast |", r": line 4: busbw 'fast' is not a number"),
    ("| one | 1.0 |", r": line 4: size 'one': expected bytes"),
    ("| 1K | 1e400 |", r": line 4: busbw 'inf' is not a finite number|line 4: busbw '1e400'"),
    ("", r": no busbw table rows"),
])
def test_bad_busbw_tables(rows: str, message: str):
    with pytest.raises(FileFormatError, match=message):
        parse_log(_TABLE.format(rows=rows), name="t_all_reduce.md")


def test_a_raw_table_wins_over_a_busbw_table():
    raw = public("MI300X-8gpu_all_reduce_hisohara-aac8.txt").read_text()
    table = "| Message Size (Bytes) | X (GB/s) |\n| --- | --- |\n| 1K | 0.04 |\n"
    log = parse_log(table + raw, name="both_all_reduce.md")
    assert (log.source, len(log.rows)) == ("nccl-tests", 62)


def test_bad_declared_ranks():
    with pytest.raises(FileFormatError, match=r": line 1: ranks 'eight': expected a whole number"):
        parse_log("## ranks: eight\n| size | GB/s |\n| 1K | 1.0 |\n", name="t_all_reduce.md")


def test_a_declared_rank_count_below_the_table_is_not_read():
    text = "| size | GB/s |\n| 1K | 1.0 |\n\n## ranks: 8\n"
    with pytest.raises(FileFormatError, match="cannot tell the number of ranks"):
        parse_log(text, name="t_all_reduce.md")


def test_damaged_public_logs_never_raise_anything_else():
    """Cut or scrambled public logs give a BenchmarkLog or a CollsynthError, nothing else."""
    rng = random.Random(21)
    names = sorted(PUBLIC_LOGS)[::3] + sorted(BUSBW_1M)
    cases = 0
    for name in names:
        text = public(name).read_text()
        for _ in range(12):
            chars = list(text)
            for _ in range(rng.randint(1, 6)):
                chars[rng.randrange(len(chars))] = rng.choice("0.9 -#\n|KMG:NA/x\t")
            cut = rng.randint(0, len(chars))
            for candidate in ("".join(chars), text[:cut]):
                cases += 1
                try:
                    result = parse_log(candidate, name=name)
                except CollsynthError as exc:
                    assert "\n" not in str(exc)
                    continue
                assert isinstance(result, BenchmarkLog) and result.rows
    assert cases == 2 * 12 * len(names)
