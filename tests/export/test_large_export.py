"""The issue's case end to end: the bandwidth-optimal allgather of two DGX A100 nodes exports at
default settings for every runtime, and every file passes `collsynth check`. Slow (about two
minutes): deselect with ``-m "not slow"``."""

from __future__ import annotations

import pytest

from collsynth.cli import main
from collsynth.runtimes import MSCCL_XML, runtime_names


@pytest.mark.slow
def test_two_node_dgx_a100_allgather_exports_for_every_runtime_by_default(tmp_path, capsys):
    schedule = tmp_path / "ag.json"
    assert main(["solve", "bandwidth-optimal", "dgx-a100", "allgather", "--nodes", "2",
                 "-o", str(schedule), "-q"]) == 0
    capsys.readouterr()
    # As it is, on one channel, it exceeds every runtime's steps per threadblock.
    assert main(["export", str(schedule), "-o", str(tmp_path / "keep.xml"), "--runtime", "all",
                 "--stages", "keep", "--channels", "1"]) == 1
    refused = capsys.readouterr().err
    assert all(f"{r}: MSCCL_MAX_NUM_STEPS" in refused for r in ("rccl", "msccl-executor"))
    # By default every runtime gets a program, and each passes the checker.
    assert main(["export", str(schedule), "-o", str(tmp_path / "ag.xml"), "--runtime", "all"]) == 0
    written = capsys.readouterr().out.splitlines()
    assert len(written) == 3 and all(line.startswith("wrote ") for line in written)
    for runtime in runtime_names(MSCCL_XML):
        assert main(["check", str(tmp_path / f"ag.{runtime}.xml"), "--runtime", runtime,
                     "--strict"]) == 0, capsys.readouterr()
