"""The planner never plans (or writes) an XML program that fails the check.

The lowering is replaced by one that drops a step of every program it makes (a well-formed
program that computes the wrong thing). The planner lowers each candidate through
``collsynth.export.pipeline.check_exported``; a candidate whose program fails must be left out with
the reason, its calls kept on NCCL, and no XML file written. (``collsynth plan`` is
``make_plan`` and ``write_plan``; it is not run here: its default sweep is slow.)
"""

from __future__ import annotations

import dataclasses
import importlib

import pytest

from collsynth.plan import NCCL, plan_calls, write_plan


def _drop_last_step(program):
    *gpus, gpu = program.gpus
    *tbs, tb = gpu.threadblocks
    tb = dataclasses.replace(tb, steps=tb.steps[:-1])
    return dataclasses.replace(program, gpus=(*gpus, dataclasses.replace(
        gpu, threadblocks=(*tbs, tb))))


@pytest.fixture
def wrong_lowering(monkeypatch):
    lowering = importlib.import_module("collsynth.export.lower")   # the module, not the function
    pipeline = importlib.import_module("collsynth.export.pipeline")
    real = lowering.lower
    calls: list[str] = []

    def lower(algorithm, **options):
        calls.append(options["runtime"])
        return _drop_last_step(real(algorithm, **options))

    monkeypatch.setattr(lowering, "lower", lower)
    monkeypatch.setattr(pipeline, "lower", lower)
    return calls


@pytest.fixture
def run(run_of, traced):
    """Four ranks, an allgather and an allreduce of 1 MiB, ten times each."""
    return run_of(4, [traced(kind, 1 << 20, range(4)) for kind in ("allgather", "allreduce")] * 10)


@pytest.mark.parametrize("runtime", ["msccl", "rccl", "msccl-executor"])
def test_plan_leaves_out_what_fails_the_check(tmp_path, fast, options, run, wrong_lowering,
                                              runtime):
    plan = plan_calls(run, fast, options=options(runtime=runtime))
    assert wrong_lowering  # the planner did lower candidates
    assert plan.xml_files == ()
    synthesized = [(entry, c) for entry in plan.entries for c in entry.candidates
                   if c.source != NCCL]
    assert synthesized
    for entry, candidate in synthesized:
        reason = entry.excluded.get(candidate.name, "")
        assert reason.startswith(f"cannot be exported for {runtime}:"), reason
        assert "fails the check" in reason
    for entry in plan.entries:
        assert all(r.xml is None for r in entry.ranges)
    target = write_plan(plan, tmp_path / "plan", plots=False)
    assert list((target / "xml").iterdir()) == []


def test_plan_exports_the_correct_programs(fast, options, run):
    """The same plan with the real lowering has XML files: the refusal above is the check's."""
    plan = plan_calls(run, fast, options=options(runtime="msccl-executor"))
    assert plan.xml_files
