"""The issue's case end to end: the bandwidth-optimal allgather of two DGX A100 nodes exports at
default settings for every runtime, checked before it is written. Slow (about a minute and a
half): deselect with ``-m "not slow"``. All six schedules of x2 and x4 for every runtime,
mscclpp included: ``benchmarks/large_export.py``."""

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
    # As it is, on one channel, it exceeds the runtime's steps per threadblock (rccl's limit is
    # msccl-executor's; one runtime keeps the test's time down).
    assert main(["export", str(schedule), "-o", str(tmp_path / "keep.xml"), "--runtime", "rccl",
                 "--stages", "keep", "--channels", "1"]) == 1
    assert "MSCCL_MAX_NUM_STEPS" in capsys.readouterr().err
    # By default every runtime gets a program, and each passes the checker.
    assert main(["export", str(schedule), "-o", str(tmp_path / "ag.xml"), "--runtime", "all"]) == 0
    written = capsys.readouterr().out.splitlines()
    assert len(written) == 3 and all(line.startswith("wrote ") for line in written)
    # export checked each program before writing it; one file re-read from disk checks the
    # writer and the reader agree (every runtime's: benchmarks/export_suite.py).
    assert {f"ag.{runtime}.xml" for runtime in runtime_names(MSCCL_XML)} <= \
        {p.name for p in tmp_path.iterdir()}
    assert main(["check", str(tmp_path / "ag.msccl-executor.xml"), "--runtime", "msccl-executor",
                 "--strict"]) == 0, capsys.readouterr()
