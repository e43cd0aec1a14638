"""Hostile input, round 8: what the tenth session's hunt found, fixed in the tenth.

Each case failed on the code before its fix (a wrong result written without a word, or an
internal error).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from collsynth import cli
from collsynth.errors import FileFormatError
from collsynth.timing.logs import load_log

ROOT = Path(__file__).resolve().parents[1]
ALLGATHER_LOG = ROOT / "tests" / "fixtures" / "logs" / "nccl_tests_srun_allgather.txt"


# -- one log, two nccl-tests runs --------------------------------------------------------------


def test_a_log_of_two_collectives_is_refused(tmp_path, capsys):
    """Two runs appended to one file (``all_gather_perf ... > log; all_reduce_perf ... >> log``)
    were read as one curve of the last header's collective, the allgather rows included."""
    text = ALLGATHER_LOG.read_text()
    path = tmp_path / "both.txt"
    path.write_text(text + text.replace("all_gather_perf", "all_reduce_perf"))
    second = len(text.splitlines()) + 3  # the second run's "Collective test starting" line
    with pytest.raises(FileFormatError, match=rf"line {second}: a test of 'all_reduce_perf' "
                                              r"after one of 'all_gather_perf' \(line 3\); a "
                                              "log measures one collective"):
        load_log(path)
    assert cli.main(["calibrate", str(path), "--topology", "ring:4,unit_gbps=25,alpha_us=1",
                     "-o", str(tmp_path / "c.json")]) == cli.EXIT_ERROR
    assert "split the file" in capsys.readouterr().err
    assert not (tmp_path / "c.json").exists()


def test_a_log_of_two_rank_counts_is_refused(tmp_path):
    """A 4-rank run of small sizes and an 8-rank run of large ones in one file were read as
    one 8-rank curve."""
    text = ALLGATHER_LOG.read_text()
    eight = text.replace("0: #  Rank  3 Group  0 Pid  41024 on   node-a01 device  3 [0000:13:00] "
                         "NVIDIA A10",
                         "\n".join(f"0: #  Rank  {r} Group  0 Pid  4102{r} on   node-a01 device  "
                                   f"{r} [0000:13:00] NVIDIA A10" for r in range(3, 8)))
    assert eight != text
    path = tmp_path / "two_counts_all_gather.txt"
    path.write_text(text + eight)
    second = len(text.splitlines()) + 3
    with pytest.raises(FileFormatError, match=rf"line {second}: a run on 8 ranks after one on 4 "
                                              r"\(line 3\); a log measures one rank count"):
        load_log(path)
    path.write_text(text + text)  # the same run twice is one curve, its repeats agreeing
    log = load_log(path)
    assert (log.collective, log.ranks) == ("allgather", 4)
