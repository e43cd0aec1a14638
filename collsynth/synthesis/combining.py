"""Instances of allreduce-like collectives (combining, several destinations per chunk), solved
with the direct combining encoding and verified."""

from __future__ import annotations

import time

from collsynth.algorithm.model import Instance
from collsynth.algorithm.verify import find_problems
from collsynth.collective.model import Collective
from collsynth.encoding.backend import SolveInterrupted, Status
from collsynth.encoding.combining import solve_combining_cpsat
from collsynth.errors import SolverError
from collsynth.synthesis.result import SolveOptions, SynthesisResult
from collsynth.topology.model import Topology

__all__ = ["solve_combining", "supports_direct_combining"]


def supports_direct_combining(backend) -> bool:
    """The direct combining encoding is written for CP-SAT."""
    return getattr(backend, "name", "") == "cpsat"


def solve_combining(topology: Topology, split: Collective, instance: Instance, backend,
                    options: SolveOptions, budget: float, started: float,
                    minimize_rounds: bool = False) -> SynthesisResult:
    """Solve an allreduce-like instance directly; the backend must be CP-SAT."""
    if not supports_direct_combining(backend):
        return SynthesisResult(instance, Status.UNKNOWN, None, time.perf_counter() - started,
                               backend.name, "the direct combining encoding needs the cpsat backend")
    try:
        outcome, algorithm = solve_combining_cpsat(
            topology, split, instance, time_limit=budget - (time.perf_counter() - started),
            num_workers=getattr(backend, "num_workers", 4), minimize_rounds=minimize_rounds)
    except SolveInterrupted as exc:  # keep a schedule the solver held when Ctrl-C stopped it
        outcome, algorithm = exc.partial if isinstance(exc.partial, tuple) else (None, None)
        if algorithm is None:
            raise SolveInterrupted(SynthesisResult(
                instance, Status.INTERRUPTED, None, time.perf_counter() - started, backend.name,
                "interrupted")) from None
        result = _result(instance, outcome, algorithm, backend, started)
        raise SolveInterrupted(result) from None
    return _result(instance, outcome, algorithm, backend, started)


def _result(instance: Instance, outcome, algorithm, backend, started: float) -> SynthesisResult:
    """Verify the solver's schedule (a failure is a solver bug) and describe the outcome."""
    if algorithm is not None:
        problems = find_problems(algorithm)
        if problems:
            raise SolverError(f"the direct combining encoding returned a schedule that fails "
                              f"verification ({instance.label()}): {'; '.join(problems[:3])}")
    found = instance
    detail = outcome.detail or "direct"
    if algorithm is not None:
        found = Instance(steps=instance.steps, rounds=algorithm.num_rounds, chunks=instance.chunks)
        detail = ("optimal " if outcome.stats.get("optimal") else "") + "direct"
    return SynthesisResult(found, outcome.status, algorithm, time.perf_counter() - started,
                           backend.name, detail)
