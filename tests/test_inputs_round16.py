"""Hostile input, round 16: what this session's hunt found, fixed here.

Each case failed on the code before its fix.
"""

from __future__ import annotations

import pytest

from collsynth import cli


# -- time: the closed form ignores the program model's options ----------------------------------


@pytest.mark.parametrize("option", [["--runtime", "rccl"], ["--gpus-per-thread", "2"],
                                    ["--layout", "in-place"], ["--nodes", "2"],
                                    ["--model", "closed-form", "--channels", "2"]])
def test_the_closed_form_refuses_the_program_models_options(ring_allgather_path, capsys, option):
    """``time ALGO.json --runtime rccl`` priced the closed form against NCCL's own lines, its
    header saying "NCCL's own tuning model": --runtime, --gpus-per-thread and --layout were
    dropped without a word (--nodes and --channels were refused, with exit status 1)."""
    code = cli.main(["time", str(ring_allgather_path), "--sizes", "1MB", "--unit-gbps", "10",
                     "--alpha-us", "1", *option])
    err = capsys.readouterr().err
    assert code == cli.EXIT_USAGE, err
    [line] = err.splitlines()
    assert line.startswith("collsynth time: error: " + option[-2]), line
    assert "program model" in line, line


def test_the_program_model_takes_them(ring_allgather_path, capsys):
    assert cli.main(["time", str(ring_allgather_path), "--sizes", "1MB", "--unit-gbps", "10",
                     "--alpha-us", "1", "--runtime", "rccl", "--model", "program"]) == cli.EXIT_OK
    assert "rccl-ring" in capsys.readouterr().out
