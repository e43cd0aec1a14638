"""MSCCL++ plans run on gloo and match torch's collectives: three of MSCCL++'s own DSL plans
(memory channels, thread block groups with barriers, a pipeline with semaphores and an NVLS
reduction) and plans collsynth exports (Simple and LL, in and out of place). A plan with one
wrong index must come out wrong: the comparison is real.
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():  # pragma: no cover
    pytest.skip("torch.distributed with gloo is needed", allow_module_level=True)

from collsynth.export.mscclpp import read_plan  # noqa: E402
from collsynth.export.mscclpp.lower import lower_to_plan  # noqa: E402
from collsynth.export.mscclpp.model import BufferRef  # noqa: E402
from collsynth.executor import Case, launch, run_cases  # noqa: E402
from collsynth.collective import alltoall, reduce_scatter  # noqa: E402
from collsynth.synthesis import solve_least_steps  # noqa: E402
from collsynth.topology import get_topology  # noqa: E402

DATA = Path(__file__).resolve().parents[2] / "data" / "mscclpp-plans"
TIMEOUT_S = 30.0


def _dsl_cases() -> list[Case]:
    plan = functools.partial(read_plan)
    return [
        Case("dsl-allgather", 64, plan=plan(DATA / "sn_allgather_2gpu.json"), inplace=True,
             timeout_s=TIMEOUT_S),
        Case("dsl-allgather-tbg", 64, plan=plan(DATA / "sn_allgather_tbg.json"), inplace=True,
             timeout_s=TIMEOUT_S),
        # 1 MiB pipeline units: two iterations need 2 x 2 MiB chunks of floats.
        Case("dsl-allreduce-pipeline-nvls", 2 * (2 << 20) // 4,
             plan=plan(DATA / "sn_allreduce_pipeline.json"), inplace=True, timeout_s=TIMEOUT_S),
    ]


def _wrong(plan):
    """The plan with rank 0's first put landing one chunk off."""
    gpu = plan.gpus[0]
    for t, tb in enumerate(gpu.threadblocks):
        for k, op in enumerate(tb.ops):
            if op.name in ("put", "ppkt"):
                d = op.dst[0]
                bad = dataclasses.replace(op, dst=(BufferRef(d.index + 1, d.size,
                                                             buffer_id=d.buffer_id),)
                                          + op.dst[1:])
                tbs = list(gpu.threadblocks)
                tbs[t] = dataclasses.replace(tb, ops=tb.ops[:k] + (bad,) + tb.ops[k + 1:])
                gpus = (dataclasses.replace(gpu, threadblocks=tuple(tbs)),) + plan.gpus[1:]
                return dataclasses.replace(plan, gpus=gpus, name="wrong")
    raise AssertionError("no put")


def _exported_cases() -> list[Case]:
    rs = solve_least_steps(get_topology("ring:4"), reduce_scatter(4)).algorithm
    a2a = solve_least_steps(get_topology("fully-connected:4"), alltoall(4)).algorithm
    simple = lower_to_plan(rs)
    return [
        Case("exported-reduce_scatter", 64, plan=simple, timeout_s=TIMEOUT_S),
        Case("exported-reduce_scatter-LL-inplace", 64, plan=lower_to_plan(rs, protocol="LL",
                                                                          inplace=True),
             inplace=True, timeout_s=TIMEOUT_S),
        Case("exported-alltoall", 16, plan=lower_to_plan(a2a), timeout_s=TIMEOUT_S),
        Case("expected-wrong", 64, plan=_wrong(simple), timeout_s=TIMEOUT_S),
    ]


@pytest.fixture(scope="module")
def results() -> dict[str, list]:
    found: dict[str, list] = {}
    for n, cases in ((2, _dsl_cases()), (4, _exported_cases())):
        per_rank = launch(run_cases, n, args=(cases,), timeout_s=240)
        for case in cases:
            found[case.name] = [next(r for r in rank if r.name == case.name) for rank in per_rank]
    return found


@pytest.mark.parametrize("name", ["dsl-allgather", "dsl-allgather-tbg",
                                  "dsl-allreduce-pipeline-nvls", "exported-reduce_scatter",
                                  "exported-reduce_scatter-LL-inplace", "exported-alltoall"])
def test_a_plan_on_gloo_equals_torch(results, name):
    for r in results[name]:
        assert r.ok, (r.rank, r.error, r.max_error)
        assert r.checked_elements > 0


def test_a_wrong_plan_is_caught(results):
    ranks = results["expected-wrong"]
    assert all(r.error is None for r in ranks)
    assert not all(r.ok for r in ranks)
