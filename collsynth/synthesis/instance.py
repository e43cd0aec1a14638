"""Solve one instance: encode, hand to a backend, decode, verify.

Combining collectives whose chunks each have one destination (reduce, reduce-scatter) are solved
through their non-combining dual on the reversed topology and inverted. Allreduce instances are
solved with the direct combining encoding (:mod:`collsynth.encoding.combining`).
"""

from __future__ import annotations

import logging
import time
from typing import Callable

from collsynth.algorithm.model import Algorithm, Instance, Step
from collsynth.algorithm.transform import invert_dual
from collsynth.algorithm.verify import find_problems
from collsynth.bounds import check_implementable
from collsynth.collective.duality import has_non_combining_dual, non_combining_dual
from collsynth.collective.model import Collective
from collsynth.encoding import get_backend
from collsynth.encoding.backend import Outcome, SolveInterrupted, Status
from collsynth.encoding.problem import build_problem, check_encoding_size, decode
from collsynth.graph.symmetry import find_automorphism
from collsynth.errors import InvalidCollectiveError, SolverError, expect_type
from collsynth.limits import Deadline
from collsynth.progress import heartbeat
from collsynth.synthesis.result import SolveOptions, SynthesisResult
from collsynth.topology.model import Topology

__all__ = ["solve_instance", "check_inputs"]

_log = logging.getLogger(__name__)

#: Share of an instance's time given to the symmetric-first attempt.
_SYMMETRIC_SHARE = 0.25


def check_inputs(topology: Topology, collective: Collective, caller: str = "solve",
                 options: SolveOptions | None = None) -> None:
    """Refuse arguments of the wrong type (naming ``caller``), mismatched sizes and
    unimplementable collectives before any solver work."""
    expect_type(topology, Topology, f"{caller}: topology")
    expect_type(collective, Collective, f"{caller}: collective")
    if options is not None:
        expect_type(options, SolveOptions, f"{caller}: options")
    if collective.num_ranks != topology.num_ranks:
        raise InvalidCollectiveError(
            f"{collective.describe()} is for {collective.num_ranks} ranks but topology "
            f"{topology.name} has {topology.num_ranks}")
    check_implementable(topology, collective)


def solve_instance(topology: Topology, collective: Collective, instance: Instance, *,
                   options: SolveOptions = SolveOptions()) -> SynthesisResult:
    """Synthesize an algorithm for ``collective`` on ``topology`` with exactly ``instance.steps``
    steps, ``instance.total_rounds`` rounds and ``instance.chunks`` chunks per base chunk.

    The returned algorithm, if any, has been replayed and verified. Ctrl-C stops the solver: the
    result is then ``INTERRUPTED`` (or ``SAT`` if it already held a schedule).

    Examples
    --------
    >>> from collsynth.topology import get_topology
    >>> from collsynth.collective import allgather
    >>> result = solve_instance(get_topology("ring:4"), allgather(4), Instance(steps=2, rounds=3, chunks=2))
    >>> result.status.value, result.algorithm.rounds_per_chunk
    ('sat', Fraction(3, 2))

    Raises
    ------
    UnimplementableError
        When some rank can never receive a chunk it needs (before any solver work).
    SolverError
        When the backend crashes or returns a schedule that fails verification.
    """
    check_inputs(topology, collective, "solve_instance", options)
    expect_type(instance, Instance, "solve_instance: instance")
    try:
        return solve_checked(topology, collective, instance, options,
                             Deadline(options.time_limit))
    except SolveInterrupted as exc:  # Ctrl-C: a schedule the solver held, else INTERRUPTED
        return exc.partial


def solve_checked(topology: Topology, collective: Collective, instance: Instance,
                  options: SolveOptions, deadline: Deadline,
                  limit: float | None = None, *, minimize_rounds: bool = False,
                  record: Callable[[SynthesisResult], None] | None = None) -> SynthesisResult:
    """:func:`solve_instance` for inputs already checked, within ``deadline`` (and ``limit``).

    ``record`` is called with the result before ``options.on_result`` reports it, so that a
    strategy holds every result the user has seen when Ctrl-C comes.

    With ``minimize_rounds`` (backends that support it), ``instance.rounds`` is an upper bound
    and the result's instance has the fewest rounds found; ``detail`` starts with ``optimal``
    when the backend proved no fewer rounds work.
    """
    started = time.perf_counter()
    budget = deadline.remaining() if limit is None else min(limit, deadline.remaining())
    with heartbeat(options.on_progress, options.progress_interval_s,
                   f"{instance.label()}: solving", f"time limit {max(budget, 0.0):.0f} s"):
        return _solve_checked(topology, collective, instance, options, budget, started,
                              minimize_rounds, record)


def _solve_checked(topology: Topology, collective: Collective, instance: Instance,
                   options: SolveOptions, budget: float, started: float, minimize_rounds: bool,
                   record: Callable[[SynthesisResult], None] | None) -> SynthesisResult:
    backend = get_backend(options.backend)
    # the size of the encoding to come, before the split (a million pieces take seconds)
    check_encoding_size(topology, collective, instance.steps, split_into=instance.chunks)
    split = collective.split(instance.chunks)
    dual_of = None
    try:
        if budget <= 0:
            result = SynthesisResult(instance, Status.TIMEOUT, None, 0.0, backend.name,
                                     "no time left")
        elif not collective.combining:
            result = _solve_noncombining(topology, split, instance, backend, options, budget,
                                         started, minimize_rounds)
        elif has_non_combining_dual(collective):
            dual_of = split
            result = _from_dual(_solve_noncombining(
                topology.reversed(), non_combining_dual(split), instance, backend, options,
                budget, started, minimize_rounds), topology, split, started)
        else:
            from collsynth.synthesis.combining import solve_combining

            result = solve_combining(topology, split, instance, backend, options, budget,
                                     started, minimize_rounds)
    except KeyboardInterrupt as exc:
        # Ctrl-C: report what this instance had (a verified schedule the solver held, else
        # INTERRUPTED) and let the strategy above decide what to keep.
        result = getattr(exc, "partial", None)
        if not isinstance(result, SynthesisResult):
            result = SynthesisResult(instance, Status.INTERRUPTED, None,
                                     time.perf_counter() - started, backend.name, "interrupted")
        elif dual_of is not None:
            result = _from_dual(result, topology, dual_of, started)
        if record is not None:
            record(result)
        if options.on_result is not None:
            options.on_result(result)
        raise SolveInterrupted(result) from None
    if record is not None:
        record(result)
    if options.on_result is not None:
        options.on_result(result)
    return result


def _without_dead_ends(dual: Algorithm) -> Algorithm:
    """``dual`` without the sends its time-reversal cannot use: a copy to a rank that already
    holds the chunk, or to one that neither needs it nor passes it on to a rank that does.

    Solvers may return such sends (they fit in a step's rounds at no cost). Read backwards, the
    first makes a rank add a contribution twice and the second makes a rank that is no
    contributor send a value it never had, so the inverse would fail verification although the
    instance is satisfiable. Steps and rounds are kept.
    """
    collective = dual.collective
    held = {(c, r) for c, pre in enumerate(collective.precondition) for r in pre}
    firsts = []
    for step in dual.steps:
        first = [s for s in step.sends if (s.chunk, s.dst) not in held]
        held.update((s.chunk, s.dst) for s in first)
        firsts.append(first)
    useful = {(c, r) for c, post in enumerate(collective.postcondition) for r in post}
    kept = []
    for step, first in zip(reversed(dual.steps), reversed(firsts)):
        sends = tuple(s for s in first if (s.chunk, s.dst) in useful)
        useful.update((s.chunk, s.src) for s in sends)
        kept.append(Step(step.rounds, sends))
    return Algorithm(dual.name, dual.topology, collective, tuple(reversed(kept)),
                     dual.provenance)


def _from_dual(dual: SynthesisResult, topology: Topology, split: Collective,
               started: float) -> SynthesisResult:
    """The result of a combining instance from that of its dual on the reversed topology."""
    algorithm = None
    if dual.algorithm is not None:
        algorithm = invert_dual(_without_dead_ends(dual.algorithm), topology, split)
    return SynthesisResult(dual.instance, dual.status, algorithm, time.perf_counter() - started,
                           dual.backend, dual.detail)


def supports_minimize(backend) -> bool:
    """True when the backend can minimise total rounds in one call."""
    return getattr(backend, "name", "") == "cpsat"


def _solve_noncombining(topology: Topology, split: Collective, instance: Instance, backend,
                        options: SolveOptions, budget: float, started: float,
                        minimize_rounds: bool = False) -> SynthesisResult:
    """Symmetric-first, then full search. A symmetric answer is used as is when only satisfiability
    is asked; when minimising, it bounds the full search, which may improve on it."""
    minimize = minimize_rounds and supports_minimize(backend)
    fallback: tuple[object, object, str] | None = None  # (problem, outcome, kind) already SAT
    current = instance
    solving: tuple[object, str] | None = None  # (problem, kind) in the solver now
    check_encoding_size(topology, split, instance.steps)   # before the symmetry search
    try:
        if options.symmetry:
            automorphism = find_automorphism(topology, split)
            if automorphism is not None:
                problem = build_problem(topology, split, current, automorphism=automorphism)
                solving = (problem, "symmetric")
                outcome = _call(backend, problem, minimize,
                                (budget - (time.perf_counter() - started)) * _SYMMETRIC_SHARE)
                solving = None
                if outcome.status is Status.SAT:
                    if not minimize:
                        return _decoded(problem, outcome, "symmetric", instance, backend, started)
                    fallback = (problem, outcome, "symmetric")
                    current = Instance(steps=instance.steps, rounds=sum(outcome.rounds),
                                       chunks=instance.chunks, extra_memory=instance.extra_memory)
        remaining = budget - (time.perf_counter() - started)
        if remaining <= 0:
            outcome = Outcome(Status.TIMEOUT, detail="time limit reached")
        else:
            problem = build_problem(topology, split, current)
            solving = (problem, "full")
            outcome = _call(backend, problem, minimize,
                            budget - (time.perf_counter() - started))  # encoding counts
            solving = None
            if outcome.status is Status.SAT:
                return _decoded(problem, outcome, "full", instance, backend, started)
    except KeyboardInterrupt as exc:  # in the solver (SolveInterrupted) or while encoding
        held = getattr(exc, "partial", None)
        if solving is not None and isinstance(held, Outcome) and held.status is Status.SAT:
            # A minimising search stopped early still holds a schedule, at most the fallback's
            # rounds (the search was bounded by them).
            result = _decoded(solving[0], held, solving[1], instance, backend, started)
        elif fallback is not None:
            result = _decoded(*fallback, instance, backend, started)
        else:
            result = SynthesisResult(instance, Status.INTERRUPTED, None,
                                     time.perf_counter() - started, backend.name, "interrupted")
        raise SolveInterrupted(result) from None
    if fallback is not None:
        return _decoded(*fallback, instance, backend, started)
    return SynthesisResult(instance, outcome.status, None, time.perf_counter() - started,
                           backend.name, outcome.detail)


def _call(backend, problem, minimize: bool, time_limit: float) -> Outcome:
    if time_limit <= 0:
        return Outcome(Status.TIMEOUT, detail="time limit reached")
    if minimize:
        return backend.solve(problem, time_limit=time_limit, minimize_rounds=True)
    return backend.solve(problem, time_limit=time_limit)


def _decoded(problem, outcome: Outcome, kind: str, instance: Instance, backend,
             started: float) -> SynthesisResult:
    """Decode and verify a satisfying outcome (a failed verification is a solver bug)."""
    split, topology = problem.collective, problem.topology
    rounds = sum(outcome.rounds)
    algorithm = decode(problem, outcome.chosen, list(outcome.rounds),
                       name=f"{split.name}-{topology.name}-s{instance.steps}-r{rounds}"
                            f"-c{instance.chunks}",
                       provenance={"backend": backend.name, "search": kind})
    problems = find_problems(algorithm, extra_memory=instance.extra_memory)
    if problems:
        raise SolverError(f"backend {backend.name} returned a schedule that fails verification "
                          f"({kind} search, {instance.label()}): {'; '.join(problems[:3])}")
    optimal = bool(outcome.stats.get("optimal")) and kind == "full"
    found = Instance(steps=instance.steps, rounds=rounds, chunks=instance.chunks,
                     extra_memory=instance.extra_memory)
    return SynthesisResult(found, Status.SAT, algorithm, time.perf_counter() - started,
                           backend.name, ("optimal " if optimal else "") + kind)


def _tag(instance: Instance) -> str:
    return f"s{instance.steps}-r{instance.total_rounds}-c{instance.chunks}"
