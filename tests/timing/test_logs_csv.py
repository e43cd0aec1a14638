"""Plain CSV logs and what a log says it was measured with (runtime, version, channels)."""

from __future__ import annotations

from pathlib import Path

import pytest

from collsynth.errors import FileFormatError
from collsynth.timing.logs import load_log, parse_log

ROOT = Path(__file__).resolve().parents[2]
MI250 = ROOT / "data" / "measurements" / "mi250-16gcd-x2" / "rccl_all_gather_outofplace.csv"
FIXTURES = ROOT / "tests" / "fixtures" / "logs"

# -- CSV ------------------------------------------------------------------------------------------


def test_mi250_csv():
    # 23 lines: the header and 22 sizes, 512 B .. 1 GiB; the file name says all_gather; the
    # ratio busbw / algbw (8.14 / 8.40 at two decimals) fits 31/32 and its neighbours alike, so
    # the rank count must be given.
    with pytest.raises(FileFormatError, match="cannot tell the number of ranks.*--ranks"):
        load_log(MI250)
    log = load_log(MI250, ranks=32)
    assert (log.source, log.collective, log.ranks) == ("csv", "allgather", 32)
    assert len(log.rows) == 22 and log.sizes[0] == 512 and log.sizes[-1] == 1 << 30
    first, last = log.rows[0], log.rows[-1]
    assert (first.size_bytes, first.count, first.time_us, first.line) == (512, 4, 122.1, 2)
    assert (last.time_us, last.algbw_gbps, last.busbw_gbps, last.line) == (127776.0, 8.40,
                                                                          8.14, 23)
    assert not any(r.in_place for r in log.rows)
    # The CSV names neither the runtime nor its channels (its README does): the caller says.
    assert (log.runtime, log.runtime_version, log.channels) == (None, None, None)
    told = load_log(MI250, ranks=32, runtime="rccl-2.18.3", channels=2)
    assert (told.runtime, told.runtime_version, told.channels) == ("rccl", "2.18.3", 2)


def test_csv_columns_say_what_the_file_measured():
    text = ("# measured by hand\n"
            "Size_Bytes , time_us,ranks,collective,in_place,note\n"
            "0,3.0,8,all_reduce,false,skipped\n"
            "1024,10.5,8,all_reduce,false,\"a, quoted note\"\n"
            "\n"
            "1024,10.7,8,all_reduce,true,\n"
            "1048576,40.0,8,all_reduce,0,\n")
    log = parse_log(text, name="run.txt")  # the header says CSV, whatever the file name
    assert (log.source, log.collective, log.ranks, log.zero_size_lines) == (
        "csv", "allreduce", 8, 1)
    assert [(r.size_bytes, r.time_us, r.in_place, r.line) for r in log.rows] == [
        (1024, 10.5, False, 4), (1024, 10.7, True, 6), (1048576, 40.0, False, 7)]
    # what the caller gives is for files that do not say: one that says otherwise is refused
    assert parse_log(text, name="x.csv", collective="allreduce", ranks=8).ranks == 8
    with pytest.raises(FileFormatError, match="the log measures 8 ranks, not 4"):
        parse_log(text, name="x.csv", ranks=4)
    with pytest.raises(FileFormatError, match="measures 'all_reduce', not 'allgather'"):
        parse_log(text, name="x.csv", collective="allgather")


BAD_CSV = [
    ("size_bytes,latency\n8,1.0\n", r"line 1: a CSV without the column\(s\) time_us"),
    ("size,time\n8,1.0\n", r"line 1: a CSV without the column\(s\) size_bytes, time_us"),
    ("size_bytes,time_us\n8,1.0\n16\n", r"line 3: 1 cells; the header has 2"),
    ("size_bytes,time_us\n8,fast\n", r"line 2: time 'fast' is not a number"),
    ("size_bytes,time_us\n8,-1\n", r"line 2: time '-1': expected microseconds > 0"),
    ("size_bytes,time_us\n8.5,1\n", r"line 2: size '8.5': expected a whole number"),
    ("size_bytes,time_us,ranks\n8,1,8\n16,2,4\n", r"line 3: ranks '4', but earlier rows say '8'"),
    ("size_bytes,time_us,in_place\n8,1,maybe\n", r"line 2: in_place 'maybe': expected true"),
    ("size_bytes,time_us\n0,1\n", r"no CSV rows .* \(1 of size 0, skipped\)"),
]


@pytest.mark.parametrize("text,message", BAD_CSV)
def test_bad_csv(text: str, message: str):
    with pytest.raises(FileFormatError, match=message):
        parse_log(text, name="all_reduce.csv", ranks=8)


# -- runtime and channels -------------------------------------------------------------------------


def test_runtime_from_the_logs():
    srun = load_log(FIXTURES / "nccl_tests_srun_allgather.txt")
    # "NCCL INFO NCCL version 2.19.3+cuda12.2" and the ring line "Channel 00/02 : 0 1 2 3";
    # the "# nccl-tests version 2.13.9" banner is the benchmark's, not the runtime's.
    assert (srun.runtime, srun.runtime_version, srun.channels) == ("nccl", "2.19.3+cuda12.2", 2)
    # JSON: "nccl_version": 22703 is NCCL_VERSION_CODE 2 * 10000 + 27 * 100 + 3.
    js = load_log(FIXTURES / "nccl_tests_all_reduce.json")
    assert (js.runtime, js.runtime_version, js.channels) == ("nccl", "2.27.3", None)
    param = load_log(FIXTURES / "param_comms_tabs.txt")
    assert (param.runtime, param.runtime_version, param.channels) == (None, None, None)


ROWS = ("#       size   count  type  redop  root   time  algbw  busbw #wrong   time  algbw  busbw "
        "#wrong\n"
        "        1024     256 float    sum    -1  12.00   0.09   0.13      0  11.00   0.09   0.14"
        "      0\n")


@pytest.mark.parametrize("lines,expected", [
    # RCCL's banner; NCCL_MAX_NCHANNELS as an environment setting is the cap the run had.
    (["RCCL version 2.18.3+hip6.0 develop:7e1cbb4", "NCCL_MAX_NCHANNELS=2"],
     ("rccl", "2.18.3+hip6.0", 2)),
    (["host:1:1 [0] NCCL INFO NCCL_MAX_NCHANNELS set by environment to 4"], (None, None, 4)),
    # The ring lines' count beats the cap; point-to-point lines ("-> ... via") are not rings.
    (["NCCL version 2.21.5+cuda12.4", "x [0] NCCL INFO NCCL_MAX_NCHANNELS set by environment "
      "to 32", "x [0] NCCL INFO Channel 00/24 :    0   1   2   3",
      "x [0] NCCL INFO Channel 00/1 : 0[0] -> 1[1] via P2P/CUMEM/read"],
     ("nccl", "2.21.5+cuda12.4", 24)),
    (["x [0] NCCL INFO Channel 03/1 : 0[0] -> 1[1] via P2P/IPC"], (None, None, None)),
    (["x [0] NCCL INFO 16 coll channels, 0 nvls channels, 16 p2p channels, 2 p2p channels per "
      "peer"], (None, None, 16)),
    (["x [0] NCCL INFO Pattern 4, crossNic 0, nChannels 12, bw 20.0/20.0, type NVL/PIX",
      "x [0] NCCL INFO Pattern 3, crossNic 0, nChannels 8, bw 20.0/20.0, type NVL/PIX"],
     (None, None, 12)),
])
def test_runtime_lines(lines: list[str], expected: tuple):
    log = parse_log("\n".join(lines) + "\n" + ROWS, name="all_reduce_perf.txt", ranks=4)
    assert (log.runtime, log.runtime_version, log.channels) == expected


def test_runtime_options_override_the_log():
    text = "NCCL version 2.19.3+cuda12.2\nx [0] NCCL INFO Channel 00/02 :    0   1\n" + ROWS
    log = parse_log(text, name="all_reduce_perf.txt", ranks=4, runtime="MSCCL", channels=8)
    assert (log.runtime, log.runtime_version, log.channels) == ("msccl", None, 8)
    for spelling, expected in (("rccl 2.18.3", ("rccl", "2.18.3")),
                               ("msccl-executor", ("msccl-executor", None)),
                               ("nccl@2.21.5+cuda12.4", ("nccl", "2.21.5+cuda12.4"))):
        log = parse_log(ROWS, name="all_reduce_perf.txt", ranks=4, runtime=spelling)
        assert (log.runtime, log.runtime_version) == expected
    with pytest.raises(FileFormatError, match=r"runtime = '2\.18': expected a name"):
        parse_log(ROWS, name="all_reduce_perf.txt", ranks=4, runtime="2.18")
    with pytest.raises(FileFormatError, match=r"channels = 0: expected a whole number from 1"):
        parse_log(ROWS, name="all_reduce_perf.txt", ranks=4, channels=0)
