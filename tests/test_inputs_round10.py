"""Hostile input, round 10 (the eleventh session): each test fails on the code before its fix."""

from __future__ import annotations

from collsynth.cli import main


def test_tune_runtime_refuses_a_collective_named_twice(tmp_path, capsys):
    # Before: 'allreduce,all_reduce' tuned allreduce twice and wrote each of its rules twice
    # (12 allreduce rows for 6), exit 0.
    out = tmp_path / "tuner.conf"
    code = main(["tune-runtime", "--topology", "dgx-h100", "--runtime", "nccl",
                 "--collectives", "allreduce,all_reduce", "-o", str(out)])
    assert code == 2
    err = capsys.readouterr().err
    assert "names allreduce twice" in err and "'all_reduce'" in err
    assert not out.exists()
