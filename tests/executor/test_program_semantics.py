"""The checker and the executor give an MSCCL program one meaning (docs/msccl-xml.md §9-§11).

Each program here turns on a rule where the executor used to differ from the checker: a wait
ends only when a ``hasdep=1`` step publishes (§9.1), the counter a step publishes skips
dependency-less ``nop``\\ s (§9.3), and a run of ``re`` steps fuses into one reduction with the
last step's ``cnt`` (§10). The expected outcome of each is derived from those rules by hand; the
checker (symbolic) and the executor (torch on gloo) must both reach it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest

from collsynth.export.check import _static, check_program
from collsynth.export.program import GpuProgram, Program, ThreadBlock, XmlStep
from collsynth.runtimes import xml_dialect
from collsynth.export.semantics import Scheduler
from collsynth.export.xml_reader import read_program
from collsynth.executor import UnrunnableProgramError, schedule

DATA = Path(__file__).resolve().parents[2] / "data" / "msccl-xml"


def _allgather2(first: Callable[[int], tuple[XmlStep, ...]], send_deps: int) -> Program:
    """2 ranks: tb 0 copies its own chunk (steps ``first(rank)``), then receives the other's;
    tb 1 sends the own chunk once tb 0 has published ``send_deps``."""
    gpus = []
    for r in (0, 1):
        p = 1 - r
        copy = first(r)
        local = ThreadBlock(0, -1, p, 0, copy + (
            XmlStep(len(copy), "r", "i", 0, "o", p, 1, hasdep=1),))
        sender = ThreadBlock(1, p, -1, 0, (XmlStep(0, "s", "o", r, "o", r, 1, depid=0,
                                                   deps=send_deps),))
        gpus.append(GpuProgram(r, 1, 2, 0, (local, sender)))
    return Program("ag2", "Simple", 1, 2, 2, "allgather", 0, tuple(gpus))


# The send waits for tb 0's flag >= 0. With hasdep=0 on the copy, only the receive publishes,
# and the receive waits for the other rank's send: a cycle on both ranks. Read by positions
# (the copy is step 0), it would run.
UNPUBLISHED = _allgather2(lambda r: (XmlStep(0, "cpy", "i", 0, "o", r, 1, hasdep=0),), 0)
# The send waits for flag >= 1, the copy's position. A nop without dependency before the copy
# is not counted, so the copy publishes 0 and only the receive (counter 1) releases the send.
SHIFTED = _allgather2(lambda r: (XmlStep(0, "nop", "i", -1, "o", -1, 0),
                                 XmlStep(1, "cpy", "i", 0, "o", r, 1, hasdep=1)), 1)


@pytest.mark.parametrize("program", [UNPUBLISHED, SHIFTED], ids=["hasdep", "counter"])
def test_both_refuse_a_program_that_only_runs_when_read_by_positions(program):
    report = check_program(program, runtime="msccl")
    deadlocks = [p.message for p in report.problems if p.kind == "deadlock"]
    assert len(deadlocks) == 1 and deadlocks[0].startswith("a cycle of waits: rank 0 tb 0 step")
    deps = program.gpus[0].threadblocks[1].steps[0].deps
    assert f"rank 0 tb 1 step 0 waits for tb 0 to publish step {deps}" in deadlocks[0]
    with pytest.raises(UnrunnableProgramError, match="the program deadlocks: rank 0 tb 0 step "
                                                     r"\d waits for a message from rank 1"):
        schedule(program)
    # The same program with the copy published runs (the rule above is the only obstacle).
    fixed = _allgather2(lambda r: (XmlStep(0, "cpy", "i", 0, "o", r, 1, hasdep=1),), 0)
    assert check_program(fixed, runtime="msccl").ok
    schedule(fixed)


def _allreduce3(chunks: int, local: tuple[XmlStep, ...]) -> Program:
    """3 ranks: tb 0 sends i to rank r+1 and receives rank r-1's into s[0..chunks); tb 1 sends
    to r-1 and receives r+1's into s[chunks..2 chunks); tb 2 (``local``) makes o."""
    gpus = []
    for r in range(3):
        a, b = (r + 1) % 3, (r + 2) % 3
        tbs = (ThreadBlock(0, a, b, 0, (XmlStep(0, "s", "i", 0, "o", 0, chunks),
                                        XmlStep(1, "r", "i", 0, "s", 0, chunks, hasdep=1))),
               ThreadBlock(1, b, a, 0, (XmlStep(0, "s", "i", 0, "o", 0, chunks),
                                        XmlStep(1, "r", "i", 0, "s", chunks, chunks,
                                                hasdep=1))),
               ThreadBlock(2, -1, -1, 0, local))
        gpus.append(GpuProgram(r, chunks, chunks, 2 * chunks, tbs))
    return Program("ar3", "Simple", 1, chunks, 3, "allreduce", 0, tuple(gpus))


# o = i + s[0..2) + s[2..4) only because the two re steps fuse (same dst o[0], same srcbuf s,
# the second without depid) and the fused reduction runs with the last cnt, 2. Unfused, the
# first would add only s[0] and o[1] would lack rank r-1's contribution.
FUSED = _allreduce3(2, (XmlStep(0, "cpy", "i", 0, "o", 0, 2),
                        XmlStep(1, "nop", "i", -1, "o", -1, 0, depid=0, deps=1),
                        XmlStep(2, "re", "s", 0, "o", 0, 1, depid=1, deps=1),
                        XmlStep(3, "re", "s", 2, "o", 0, 2)))
# The re steps wait for step 0 of tbs 0 and 1, the sends, which publish nothing: the waits end
# with the receives (hasdep=1 at step 1), after s is written. Read by positions, the
# reductions would run before the data arrives.
LATE_FLAG = _allreduce3(1, (XmlStep(0, "cpy", "i", 0, "o", 0, 1),
                            XmlStep(1, "re", "s", 0, "o", 0, 1, depid=0, deps=0),
                            XmlStep(2, "re", "s", 1, "o", 0, 1, depid=1, deps=0)))


@pytest.mark.parametrize("program", [FUSED, LATE_FLAG], ids=["re-fusion", "hasdep"])
def test_the_checker_proves_the_programs_the_executor_runs(program):
    report = check_program(program, runtime="msccl")
    assert report.ok, report.problems
    schedule(program)


def _run_both(rank: int, world_size: int) -> list[list[float]]:
    import torch

    from collsynth.executor import run_program

    found = []
    for program in (FUSED, LATE_FLAG):
        k = program.nchunksperloop
        x = torch.tensor([float(10 ** rank * (j + 1)) for j in range(2 * k)])  # 2 per chunk
        out = torch.full((2 * k,), -1.0)
        run_program(program, x, out, timeout_s=30)
        found.append(out.tolist())
    return found


def test_the_executor_computes_what_the_checker_proved():
    torch = pytest.importorskip("torch")
    dist = pytest.importorskip("torch.distributed")
    if not dist.is_available() or not dist.is_gloo_available():  # pragma: no cover
        pytest.skip("torch.distributed with gloo is needed")
    from collsynth.executor import launch

    assert torch is not None
    outs = launch(_run_both, 3, timeout_s=120)
    # Rank q's element e holds 10**q * (e+1): the allreduce is 111 * (e+1) everywhere.
    for rank_out in outs:
        assert rank_out == [[111.0 * (e + 1) for e in range(4)], [111.0, 222.0]]


def _graph(events) -> list[tuple]:
    return [(e.rank, e.tb, e.transfer.positions, tuple(e.after_deps), e.previous,
             None if e.received is None else e.received.index) for e in events]


@pytest.mark.parametrize("path", sorted((DATA / "generated").glob("*.xml")), ids=lambda p: p.name)
def test_checker_and_executor_derive_one_graph_for_msccl_tools_programs(path):
    """The executor's schedule and the checker's execution see the same transfers, waits and
    message pairs, for every msccl-tools program (rccl/ holds bigger ones of the same making;
    tests/export/test_check.py proves all of them correct)."""
    program = read_program(path)
    runtime = "msccl" if program.outofplace is None else "msccl-executor"
    static = _static(program, xml_dialect(runtime))
    seen = []
    Scheduler(static.tbs, static.loaded).run(lambda e, _: seen.append(e))
    assert _graph(op.step for op in schedule(program).ops) == _graph(seen)
