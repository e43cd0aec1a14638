"""Hostile input, round 12: what the thirteenth session's hunt found, fixed there.

Each case failed on the code before its fix.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from collsynth import cli
from collsynth.errors import FileFormatError
from collsynth.trace import read_trace

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT / "tests" / "fixtures" / "traces" / "fc4-mixed"


# -- a trace folder with two files of one rank ---------------------------------------------------


@pytest.mark.parametrize("twin", ["rank-000000.jsonl", "rank-\u0660\u0660\u0660\u0660\u0660.jsonl"])
def test_two_trace_files_of_one_rank_are_refused(tmp_path, capsys, twin):
    """``rank-00000.jsonl`` and ``rank-000000.jsonl`` both name rank 0: both were read, and
    the summary said '5 of 4 ranks' and counted rank 0's calls twice. A name in another
    script's digits (Arabic-Indic zeros) was read as rank 0 too."""
    folder = tmp_path / "trace"
    shutil.copytree(TRACE, folder)
    shutil.copy(folder / "rank-00000.jsonl", folder / twin)
    if twin.isascii():
        with pytest.raises(FileFormatError, match="two trace files of rank 0: "
                                                  "rank-00000.jsonl and rank-000000.jsonl"):
            read_trace(folder)
        assert cli.main(["trace", "summarize", str(folder)]) == cli.EXIT_ERROR
        assert "two trace files of rank 0" in capsys.readouterr().err
    else:  # not a rank file's name: ignored, as notes are
        assert read_trace(folder).rank_numbers == (0, 1, 2, 3)
