"""Shared fixtures of the plan tests: fixture traces, test topologies, plans made once per
session (synthesis on 4-rank topologies, or on the DGX-1 with at most 2 chunks: fast), and a
builder of in-memory traces."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest

from collsynth.plan import FrontCache, PlanOptions, SynthOptions, make_plan, write_plan
from collsynth.plan.calls import TracedCall, TracedRun
from collsynth.resolve import resolve_topology

ROOT = Path(__file__).resolve().parents[2]
TRACES = ROOT / "tests" / "fixtures" / "traces"
DATA = Path(__file__).resolve().parent / "data"


@pytest.fixture(scope="session")
def front_cache(tmp_path_factory) -> FrontCache:
    """One cache for the session, so each front is synthesized once."""
    return FrontCache(tmp_path_factory.mktemp("front-cache"))


@pytest.fixture(scope="session")
def fast():
    """4 ranks fully connected, 1 us per step: synthesized algorithms beat NCCL's latency."""
    return resolve_topology(str(DATA / "fc4-fast.json"))


@pytest.fixture(scope="session")
def slow():
    """The same links at 100 us per step: NCCL's latency constants beat any synthesized step."""
    return resolve_topology(str(DATA / "fc4-slow.json"))


@pytest.fixture(scope="session")
def options(front_cache) -> Callable[..., PlanOptions]:
    """PlanOptions with the session cache and quick synthesis, overridable by keyword."""
    def make(**changes) -> PlanOptions:
        synth = changes.pop("synth", SynthOptions(time_limit=20, max_chunks=2))
        return PlanOptions(synth=synth, cache=front_cache, **changes)
    return make


@pytest.fixture(scope="session")
def fc4_plan(tmp_path_factory, fast, options):
    """The fc4-mixed trace planned on the fast topology and written with plots."""
    plan = make_plan(TRACES / "fc4-mixed", fast, options=options())
    target = write_plan(plan, tmp_path_factory.mktemp("plans") / "fc4")
    return plan, target


@pytest.fixture(scope="session")
def dgx1_plan(tmp_path_factory, options):
    """The dgx1-dp trace (8 ranks, two 4-rank tensor-parallel groups) planned on the DGX-1."""
    plan = make_plan(TRACES / "dgx1-dp", resolve_topology("dgx1"), options=options())
    target = write_plan(plan, tmp_path_factory.mktemp("plans") / "dgx1", plots=False)
    return plan, target


def _traced(kind: str, size: int, group, *, rank: int | None = None, seq: int = 0,
            root: int | None = None, op: str | None = None, element_size: int | None = 4
            ) -> TracedCall:
    """One call as :func:`collsynth.plan.calls.load_calls` would give it."""
    group = tuple(group)
    if op is None and kind in ("allreduce", "reduce", "reduce_scatter"):
        op = "sum"
    return TracedCall(rank=group[0] if rank is None else rank, seq=seq, kind=kind,
                      size_bytes=size, group=group, function=kind, dtype="float32",
                      element_size=element_size, op=op, root=root)


@pytest.fixture(scope="session")
def traced() -> Callable[..., TracedCall]:
    """``traced(kind, size, group, root=..., op=..., element_size=...)``: one call."""
    return _traced


@pytest.fixture(scope="session")
def run_of() -> Callable[..., TracedRun]:
    """``run_of(world, [calls...])``: an in-memory trace where every rank of each call's group
    makes the call, in the order given."""
    def make(world: int, calls) -> TracedRun:
        per_rank: dict[int, list[TracedCall]] = {r: [] for r in range(world)}
        for call in calls:
            for rank in call.group:
                seq = len(per_rank[rank])
                per_rank[rank].append(TracedCall(**{**call.__dict__, "rank": rank, "seq": seq}))
        return TracedRun("<memory>", world, {r: tuple(c) for r, c in per_rank.items()}, "nccl")
    return make
