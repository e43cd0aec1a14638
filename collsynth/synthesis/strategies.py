"""Search strategies over instances: least steps, and the Pareto front of steps vs rounds/chunk.

Facts the searches rely on (each follows from the model in :mod:`collsynth.algorithm.model`):

* **More rounds never hurt.** A schedule with ``R`` rounds is one with ``R + 1`` (add a round to
  any step). So UNSAT at ``(S, R, C)`` implies UNSAT at ``(S, R', C)`` for every ``R' <= R``.
* **Splitting never hurts.** A schedule at ``(S, R, C)`` gives one at ``(S, kR, kC)``
  (:func:`collsynth.algorithm.refine`). So UNSAT at ``(S, kR, kC)`` implies UNSAT at ``(S, R, C)``.
  The converse does not hold, which is why the sweep tries every ``(R, C)`` of a fraction that is
  not known to be unsatisfiable, instead of skipping reducible fractions (the hole in msccl-tools'
  sweep: it skipped ``R/C`` whenever the reduced fraction had been "tried", even when the reduced
  rounds were fewer than the steps and so never tried at all).
"""

from __future__ import annotations

import heapq
import math
from collections import defaultdict
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Iterator

from collsynth import interrupts
from collsynth.algorithm.model import Instance
from collsynth.algorithm.transform import refine, sequence
from collsynth.bounds import compute_bounds
from collsynth.collective.model import MAX_CHUNKS, Collective
from collsynth.collective.standard import allgather, is_standard_allreduce, reduce_scatter
from collsynth.encoding.backend import SolveInterrupted, Status
from collsynth.errors import InputTooLargeError, InvalidInstanceError, expect_type
from collsynth.encoding import get_backend
from collsynth.encoding.problem import MAX_EXACT_STEPS
from collsynth.synthesis.instance import check_inputs, solve_checked, supports_minimize
from collsynth.limits import Deadline
from collsynth.synthesis.result import SolveOptions, SynthesisResult
from collsynth.topology.model import Topology

__all__ = ["solve_least_steps", "pareto_front", "prune_dominated", "SweepLog", "ParetoFront",
           "default_max_chunks", "composed_allreduce_front"]


def solve_least_steps(topology: Topology, collective: Collective, *, chunks: int = 1,
                      max_steps: int | None = None,
                      options: SolveOptions = SolveOptions()) -> SynthesisResult:
    """The algorithm with the fewest steps, at one round per step and ``chunks`` chunks.

    Starts at the larger of the steps bound and the rounds bound (with one round per step, ``S``
    steps carry ``S / chunks`` rounds per chunk), so steps below it are ruled out by proof, not by
    solving; then tries ``S, S + 1, ...`` until one is satisfiable.

    Returns the satisfiable result, or the last result (``TIMEOUT``/``UNKNOWN``/``UNSAT`` when
    ``max_steps`` was reached, ``INTERRUPTED`` on Ctrl-C). ``detail`` says why fewer steps are
    impossible.

    >>> from collsynth.topology import get_topology
    >>> from collsynth.collective import allgather
    >>> solve_least_steps(get_topology("ring:8"), allgather(8)).instance.steps
    4
    """
    check_inputs(topology, collective, "solve_least_steps", options)
    deadline = Deadline(options.time_limit)
    if max_steps is not None:
        expect_type(max_steps, int, "solve_least_steps: max_steps")
        if isinstance(max_steps, bool) or max_steps < 1:
            raise InvalidInstanceError(f"max_steps = {max_steps!r}; expected a whole number "
                                       ">= 1 (or None: no limit but the bounds')")
    bounds = compute_bounds(topology, collective)
    _check_something_to_send(topology, collective, bounds.steps)
    rounds_bound = bounds.rounds_per_chunk
    start = max(bounds.steps, math.ceil(rounds_bound * chunks))
    reason = (f"optimal: {start} is the steps bound" if start == 1 else
              f"optimal: fewer than {start} steps are impossible (steps bound {bounds.steps}, "
              f"rounds-per-chunk bound {rounds_bound} at {chunks} chunk(s))")
    if start > MAX_EXACT_STEPS and (max_steps is None or max_steps >= start):
        # Not unsatisfiable: an algorithm exists, with more steps than the solver takes.
        raise InputTooLargeError(
            f"{chunks} chunks at one round per step need at least {start} steps (rounds-per-chunk "
            f"bound {rounds_bound} x {chunks} chunks), more than the {MAX_EXACT_STEPS} the exact "
            "encoding takes; ask for fewer chunks, or several rounds per step (solve instance "
            "--rounds)")
    limit = max_steps if max_steps is not None else start + 4 * topology.num_ranks * chunks
    limit = min(limit, MAX_EXACT_STEPS)  # the exact encoding's most (encoding.problem)
    result: SynthesisResult | None = None
    steps = start
    while steps <= limit:
        try:
            result = solve_checked(topology, collective, Instance(steps=steps, chunks=chunks),
                                   options, deadline, options.instance_time_limit)
        except SolveInterrupted as exc:  # Ctrl-C: what this instance had (SAT is the answer)
            result = exc.partial
        if result.status is Status.SAT:
            return _with_detail(result, reason)
        if result.status is not Status.UNSAT:
            return result
        reason = f"optimal: {steps} steps are unsatisfiable (proved by the solver)"
        steps += 1
    if result is not None and limit == MAX_EXACT_STEPS:
        return _with_detail(result, f"no algorithm up to {MAX_EXACT_STEPS} steps, the exact "
                                    "engine's most")
    if result is None:  # max_steps below what the bounds allow: nothing to try
        return SynthesisResult(Instance(steps=max(1, limit), chunks=chunks), Status.UNSAT, None,
                               0.0, get_backend(options.backend).name,
                               f"max_steps={limit} is below the lower bound of {start} steps")
    return result


def _check_something_to_send(topology: Topology, collective: Collective, steps_bound: int) -> None:
    """Refuse a collective every rank already satisfies (a steps bound of 0): there is no
    algorithm to search for, and no instance has 0 steps."""
    if steps_bound == 0:
        why = "a 1-rank topology" if topology.num_ranks == 1 else \
            "every rank already holds every chunk it needs"
        raise InvalidInstanceError(f"{collective.describe()} on {topology.name}: nothing to "
                                   f"communicate ({why}), so there is no algorithm to search for")


@dataclass
class SweepLog:
    """Every instance a sweep tried, in order, and whether the front it gave is complete
    (``interrupted``: Ctrl-C ended it). ``stopped_by`` says in words why the sweep ended;
    ``cause``, when it is incomplete, why, as one of
    :data:`~collsynth.synthesis.result.STOP_CAUSES` (what :attr:`ParetoFront.stopped_by` gives).
    """

    attempts: list[SynthesisResult] = field(default_factory=list)
    complete: bool = True
    stopped_by: str = ""
    interrupted: bool = False
    cause: str | None = None

    def cut_short(self, cause: str) -> None:
        """Mark the front incomplete because of ``cause`` (Ctrl-C outranks a time limit, which
        outranks the other causes: the cause kept is the one that ended the search)."""
        self.complete = False
        rank = ("interrupt", "time_limit")
        if self.cause is None or (cause in rank and (self.cause not in rank
                                                     or rank.index(cause) < rank.index(self.cause))):
            self.cause = cause


class ParetoFront(Iterator[SynthesisResult]):
    """What :func:`pareto_front` returns: an iterator over the front's points (each a verified
    :class:`SynthesisResult`), fewest steps first, that says once it is exhausted whether the
    front is complete.

    ``points`` holds the points yielded so far. ``complete`` is true when the iteration ended and
    the search was not cut short; ``stopped_by`` is then ``None``, else why not: one of
    :data:`~collsynth.synthesis.result.STOP_CAUSES` (``"time_limit"``, ``"interrupt"``,
    ``"solver"``, ``"backend"``; ``"unfinished"`` while points remain to be iterated).
    ``reason`` says in words why the search ended; ``log`` is its :class:`SweepLog`.

    >>> from collsynth.topology import get_topology
    >>> from collsynth.collective import allgather
    >>> front = pareto_front(get_topology("ring:4"), allgather(4))
    >>> [r.instance.steps for r in front], front.complete, front.stopped_by
    ([2], True, None)
    """

    def __init__(self, points: Iterator[SynthesisResult], log: SweepLog) -> None:
        self._points = points
        self.log = log
        self.points: list[SynthesisResult] = []
        self.done = False

    def __iter__(self) -> "ParetoFront":
        return self

    def __next__(self) -> SynthesisResult:
        try:
            point = next(self._points)
        except StopIteration:
            self.done = True
            raise
        self.points.append(point)
        return point

    def close(self) -> None:
        """Stop the search (as leaving a ``for`` loop over a generator does)."""
        close = getattr(self._points, "close", None)
        if close is not None:
            close()

    @property
    def complete(self) -> bool:
        return self.done and self.log.complete

    @property
    def stopped_by(self) -> str | None:
        if not self.done:
            return "unfinished"
        if self.log.complete:
            return None
        return self.log.cause or "time_limit"

    @property
    def reason(self) -> str:
        return self.log.stopped_by


def default_max_chunks(bounds_rounds: Fraction) -> int:
    """The chunk limit a sweep uses when none is given: enough to reach the rounds bound
    (its denominator), doubled, and at most 8."""
    return max(1, min(8, 2 * bounds_rounds.denominator))


def pareto_front(topology: Topology, collective: Collective, *, max_chunks: int | None = None,
                 max_steps: int | None = None, options: SolveOptions = SolveOptions(),
                 log: SweepLog | None = None) -> ParetoFront:
    """The Pareto-optimal algorithms (steps vs rounds per chunk), fewest steps first, as a
    :class:`ParetoFront`: iterate over it (the search runs as it is iterated), then its
    ``complete`` and ``stopped_by`` say whether the front is the whole front.

    For ``S`` = the steps bound, ``S + 1``, ...: try every ``(R, C)`` with ``C <= max_chunks``,
    ``R >= S`` and bound ``<= R / C < best`` (the best rounds per chunk found with fewer steps),
    in increasing ``R / C``; the first satisfiable one is the best at ``S`` and is yielded.
    Stops when an algorithm meets the rounds bound (nothing can beat it), when no ``R / C``
    below the best remains, at ``max_steps``, or when the time limit is reached.

    Every yielded algorithm is verified, and dominated ones are never yielded. Instances that
    time out make the front incomplete (``stopped_by`` ``"time_limit"``): a point found after
    them is then the best found, not a proven optimum; so does the time limit ending the sweep.
    Ctrl-C (:class:`KeyboardInterrupt`) during the search ends it normally: the best point
    found at the step count being searched, if it improves on the last one, is yielded, and
    ``stopped_by`` is ``"interrupt"``. ``log`` (optional) receives every instance tried and the
    same verdict (:class:`SweepLog`).

    >>> from collsynth.topology import get_topology
    >>> from collsynth.collective import allgather
    >>> [(r.instance.steps, str(r.rounds_per_chunk)) for r in pareto_front(get_topology("ring:4"), allgather(4))]
    [(2, '3/2')]
    """
    check_inputs(topology, collective, "pareto_front", options)
    log = log if log is not None else SweepLog()
    return ParetoFront(_sweep(topology, collective, max_chunks, max_steps, options, log), log)


def _sweep(topology: Topology, collective: Collective, max_chunks: int | None,
           max_steps: int | None, options: SolveOptions, log: SweepLog
           ) -> Iterator[SynthesisResult]:
    """:func:`pareto_front`'s points, with Ctrl-C during the search handed over as documented
    there."""
    state = _SweepState()
    try:
        for found in _pareto_front(topology, collective, max_chunks, max_steps, options, log,
                                   state):
            yield found
    except KeyboardInterrupt as exc:
        # Raised inside the search (never at our yield: Ctrl-C there reaches the consumer).
        interrupts.take()
        log.interrupted, log.stopped_by = True, "interrupted"
        log.cut_short("interrupt")
        held = getattr(exc, "partial", None)
        candidates = [r for r in (held, state.pending) if isinstance(r, SynthesisResult)
                      and r.found]
        candidates += [p for s, p in state.known.items() if s >= state.steps]
        best = state.best
        for point in sorted(candidates, key=lambda r: (r.instance.steps, r.rounds_per_chunk)):
            if best is None or point.rounds_per_chunk < best:
                best = point.rounds_per_chunk
                yield point


@dataclass
class _SweepState:
    """Where a sweep is, so that Ctrl-C can hand over what it found: the step count searched,
    the best rounds per chunk yielded, a point found at this step count not yet yielded, and the
    points known before the search."""

    steps: int = 0
    best: Fraction | None = None
    pending: SynthesisResult | None = None
    known: dict[int, SynthesisResult] = field(default_factory=dict)


def _pareto_front(topology: Topology, collective: Collective, max_chunks: int | None,
                  max_steps: int | None, options: SolveOptions, log: SweepLog,
                  state: _SweepState) -> Iterator[SynthesisResult]:
    deadline = Deadline(options.time_limit)
    bounds = compute_bounds(topology, collective)
    _check_something_to_send(topology, collective, bounds.steps)
    bound = bounds.rounds_per_chunk
    if max_chunks is None:
        max_chunks = default_max_chunks(bound)
    if max_chunks < 1:
        raise InvalidInstanceError(f"max_chunks = {max_chunks}; expected >= 1")
    most = max(1, MAX_CHUNKS // collective.num_chunks)
    if max_chunks > most:
        # Every chunk count up to max_chunks is tried (max_chunks = 10^9 never answered, its
        # time limit unheard): beyond this the split collective would exceed MAX_CHUNKS.
        raise InputTooLargeError(
            f"max_chunks = {max_chunks}: {collective.describe()} split that many ways has more "
            f"than the {MAX_CHUNKS} chunks a collective may have; at most {most}")
    # Points known before the search (allreduce: the reduce-scatter + allgather front); the search
    # at S then only looks for something better than the known point at S.
    known = state.known
    if _is_allreduce_like(collective):
        from collsynth.synthesis.combining import supports_direct_combining

        if is_standard_allreduce(collective):
            for point in composed_allreduce_front(topology, collective, max_chunks=max_chunks,
                                                  max_steps=max_steps, options=options, log=log):
                known[point.instance.steps] = point
            if log.interrupted:
                raise KeyboardInterrupt  # the composed sweep was stopped: hand over its points
        if not supports_direct_combining(get_backend(options.backend)):
            log.cut_short("backend")
            log.stopped_by = "direct allreduce search needs the cpsat backend; composed front only"
            yield from sorted(known.values(), key=lambda r: r.instance.steps)
            return
    search = _StepSearch(topology, collective, bound, max_chunks, options, deadline, log, state)
    best: Fraction | None = None
    steps = bounds.steps
    while (max_steps is None or steps <= max_steps) and steps <= MAX_EXACT_STEPS:
        state.steps, state.best, state.pending = steps, best, None
        if best is not None and best <= bound:
            log.stopped_by = "reached the rounds-per-chunk lower bound"
            return
        if best is not None and Fraction(steps, max_chunks) >= best and \
                not any(s >= steps and p.rounds_per_chunk < best for s, p in known.items()):
            log.stopped_by = f"no rounds per chunk below {best} is possible with {max_chunks} chunks"
            return
        target = best
        if steps in known and (target is None or known[steps].rounds_per_chunk < target):
            target = known[steps].rounds_per_chunk
        found = search.best_at(steps, target)
        if found is None and steps in known and target == known[steps].rounds_per_chunk:
            found = known[steps]
        # An undecided instance leaves the front open at this step count unless the point found
        # there meets the bound anyway (then nothing it could have answered would beat it).
        if steps in search.undecided_steps and (found is None or found.rounds_per_chunk > bound):
            log.cut_short(search.undecided_steps[steps])
        if found is not None:
            best = found.rounds_per_chunk
            state.best, state.pending = best, None
            yield found
        if deadline.expired():
            log.cut_short("time_limit")
            log.stopped_by = "time limit"
            return
        steps += 1
    log.stopped_by = f"reached max_steps={max_steps}" if max_steps is not None and \
        max_steps < MAX_EXACT_STEPS else f"reached {MAX_EXACT_STEPS} steps, the exact engine's most"


#: Seconds an instance gets while enumerating R/C upwards before the search switches to
#: minimising per chunk count (when the backend can).
_ENUMERATION_SLICE = 3.0


class _StepSearch:
    """The search for the fewest rounds per chunk at one step count, below a target, with what
    earlier attempts proved (largest unsatisfiable rounds per (steps, chunks)) kept across calls."""

    def __init__(self, topology: Topology, collective: Collective, bound: Fraction,
                 max_chunks: int, options: SolveOptions, deadline: Deadline, log: SweepLog,
                 state: _SweepState):
        self.state = state
        self.topology, self.collective, self.bound = topology, collective, bound
        self.max_chunks, self.options, self.deadline, self.log = max_chunks, options, deadline, log
        self.unsat_rounds: dict[tuple[int, int], int] = defaultdict(lambda: -1)
        self.per_instance = options.instance_time_limit
        if self.per_instance is None:
            self.per_instance = max(10.0, options.time_limit / 5)
        self.minimize = supports_minimize(get_backend(options.backend))
        #: Step counts where an instance ended undecided (timeout) or a minimum was not proven,
        #: and why (a :data:`~collsynth.synthesis.result.STOP_CAUSES` entry).
        self.undecided_steps: dict[int, str] = {}

    def best_at(self, steps: int, target: Fraction | None) -> SynthesisResult | None:
        """The best algorithm with ``steps`` steps and rounds per chunk below ``target`` (any,
        when ``None``), or ``None``."""
        if target is None and self.minimize:
            return self._by_minimizing(steps, None)
        found, stalled = self._by_enumerating(steps, target)
        if stalled and self.minimize and not self.deadline.expired():
            # An instance near the bound could not be decided quickly: let the solver minimise
            # per chunk count instead (it returns its best schedule even on a timeout).
            return self._by_minimizing(steps, target)
        return found

    def _solve(self, steps: int, rounds: int, chunks: int, *, minimize: bool,
               limit: float | None = None) -> SynthesisResult:
        interrupts.raise_if_pending()  # one dropped between instances (see collsynth.interrupts)
        try:
            result = solve_checked(self.topology, self.collective,
                                   Instance(steps=steps, rounds=rounds, chunks=chunks),
                                   self.options, self.deadline, limit or self.per_instance,
                                   minimize_rounds=minimize, record=self._keep)
        except SolveInterrupted as exc:
            self.log.attempts.append(exc.partial)
            raise
        self.log.attempts.append(result)
        if result.status is Status.UNSAT:
            self._record_unsat(steps, rounds, chunks)
        elif result.status is not Status.SAT:
            self._undecided(steps, result.stopped_by or "solver")
        return result

    def _undecided(self, steps: int, cause: str) -> None:
        if self.undecided_steps.get(steps) != "time_limit":  # a time limit is the usual cause
            self.undecided_steps[steps] = cause

    def _keep(self, result: SynthesisResult) -> None:
        """Hold the best point found at the step count being searched until it is yielded (Ctrl-C
        then hands it over); called before progress shows the result."""
        pending = self.state.pending
        if result.found and (pending is None or result.rounds_per_chunk < pending.rounds_per_chunk):
            self.state.pending = result

    def _record_unsat(self, steps: int, rounds: int, chunks: int) -> None:
        self.unsat_rounds[(steps, chunks)] = max(self.unsat_rounds[(steps, chunks)], rounds)

    def _by_minimizing(self, steps: int, target: Fraction | None) -> SynthesisResult | None:
        """One call per chunk count finds its fewest rounds below the target (the best so far).

        On a timeout the solver still returns its best schedule, so a hard instance near the
        bound costs one time slice and still yields a point, where enumerating R/C upwards would
        spend a slice on every unprovable value below it."""
        found: SynthesisResult | None = None
        for chunks in range(1, self.max_chunks + 1):
            if self.deadline.expired():
                break
            lo = max(steps, math.ceil(self.bound * chunks))
            # Strictly below the best so far, or enough rounds for any schedule (every step long
            # enough to carry every chunk).
            best = found.rounds_per_chunk if found is not None else target
            hi = (steps * max(1, self.collective.num_chunks * chunks) if best is None
                  else math.ceil(best * chunks) - 1)
            if lo > hi or _known_unsat(self.unsat_rounds, steps, hi, chunks, self.max_chunks):
                continue
            if self.deadline.expired():
                break
            result = self._solve(steps, hi, chunks, minimize=True)
            if result.status is not Status.SAT:
                continue
            if result.detail.startswith("optimal"):  # fewer rounds proven impossible
                self._record_unsat(steps, result.instance.total_rounds - 1, chunks)
            else:  # the minimisation ran out of its time slice
                self._undecided(steps, "time_limit")
            if found is None or result.rounds_per_chunk < found.rounds_per_chunk:
                found = result
            if found.rounds_per_chunk <= self.bound:
                break
        return found

    def _by_enumerating(self, steps: int,
                        target: Fraction | None) -> tuple[SynthesisResult | None, bool]:
        """Try (R, C) in increasing R/C below ``target``; the first satisfiable one is the best.

        With the minimising fallback available, each instance gets a short slice and the search
        stops at the first one left undecided; returns ``(found, stalled)``."""
        limit = min(self.per_instance, _ENUMERATION_SLICE) if self.minimize else None
        for rounds, chunks in _candidates(steps, self.bound, target, self.max_chunks):
            if _known_unsat(self.unsat_rounds, steps, rounds, chunks, self.max_chunks):
                continue
            if self.deadline.expired():
                return None, False
            result = self._solve(steps, rounds, chunks, minimize=False, limit=limit)
            if result.status is Status.SAT:
                return result, False
            if result.status is not Status.UNSAT and limit is not None:
                return None, True
        return None, False


def _candidates(steps: int, bound: Fraction, best: Fraction | None,
                max_chunks: int) -> Iterator[tuple[int, int]]:
    """Every (R, C) to try at ``steps``, in increasing R/C (then fewer chunks first), generated
    lazily: with a large ``max_chunks`` and no best yet the list would hold billions of pairs
    (``--max-chunks 1000`` on the z3 backend never reached its first solve)."""
    # Without a best yet, rounds per chunk up to one step per chunk "per rank" suffices for
    # every collective collsynth synthesizes; cap the sequence so it stays finite.
    ceiling = best if best is not None else Fraction(steps + 64 * max_chunks, 1)
    heap = []
    for chunks in range(1, max_chunks + 1):
        rounds = max(steps, math.ceil(bound * chunks))
        if Fraction(rounds, chunks) < ceiling:
            heap.append((Fraction(rounds, chunks), chunks, rounds))
    heapq.heapify(heap)
    while heap:
        ratio, chunks, rounds = heapq.heappop(heap)
        yield rounds, chunks
        if Fraction(rounds + 1, chunks) < ceiling:
            heapq.heappush(heap, (Fraction(rounds + 1, chunks), chunks, rounds + 1))


def _known_unsat(unsat_rounds: dict[tuple[int, int], int], steps: int, rounds: int, chunks: int,
                 max_chunks: int) -> bool:
    """UNSAT follows from an UNSAT (S, R', C) with R' >= R, or from an UNSAT (S, kR', kC).

    Only the recorded results are looked at (``max_chunks / chunks`` multiples were, a billion
    per call with ``max_chunks`` = 10^9)."""
    return any(s == steps and c % chunks == 0 and c <= max_chunks and r >= rounds * (c // chunks)
               for (s, c), r in unsat_rounds.items())


def prune_dominated(results: list[SynthesisResult]) -> list[SynthesisResult]:
    """Keep the results no other result beats (fewer-or-equal steps and rounds per chunk, one
    strictly); among equal points keep the one with fewer chunks."""
    found = sorted((r for r in results if r.found),
                   key=lambda r: (r.instance.steps, r.rounds_per_chunk, r.instance.chunks))
    keep: list[SynthesisResult] = []
    for r in found:  # in this order, r is dominated iff a kept point is at least as good
        if not any(k.rounds_per_chunk <= r.rounds_per_chunk for k in keep):
            keep.append(r)
    return keep


def _is_allreduce_like(collective: Collective) -> bool:
    return collective.combining and any(len(p) > 1 for p in collective.postcondition)


def _with_detail(result: SynthesisResult, detail: str) -> SynthesisResult:
    return SynthesisResult(result.instance, result.status, result.algorithm, result.seconds,
                           result.backend, detail)


# -- allreduce as reduce-scatter + allgather --------------------------------------------------


def composed_allreduce_front(topology: Topology, collective: Collective, *, max_chunks: int,
                             max_steps: int | None, options: SolveOptions,
                             log) -> list[SynthesisResult]:
    """The Pareto front of reduce-scatter + allgather compositions with at most ``max_chunks``
    allreduce chunks (verified algorithms).

    A reduce-scatter at ``(S1, R1, C1)`` and an allgather at ``(S2, R2, C2)`` on ``n`` ranks,
    both refined to ``L = lcm(C1, C2)`` chunks per part and run one after the other, form an
    allreduce with ``n * L`` chunks, ``S1 + S2`` steps and ``(R1/C1 + R2/C2) / n`` rounds per
    chunk (one allreduce chunk is a whole buffer; one part chunk is ``1/n`` of it).
    """
    n = topology.num_ranks
    part_chunks = max_chunks // n
    if part_chunks < 1:
        return []
    part_steps = None if max_steps is None else max_steps - 1
    rs_log, ag_log = SweepLog(), SweepLog()
    rs = list(pareto_front(topology, reduce_scatter(n), max_chunks=part_chunks,
                           max_steps=part_steps, options=options, log=rs_log))
    ag = [] if rs_log.interrupted else list(pareto_front(
        topology, allgather(n), max_chunks=part_chunks, max_steps=part_steps, options=options,
        log=ag_log))
    log.attempts.extend(rs_log.attempts + ag_log.attempts)
    for part in (rs_log, ag_log):
        if not part.complete:
            log.cut_short(part.cause or "time_limit")
    if rs_log.interrupted or ag_log.interrupted:  # Ctrl-C: the caller stops too
        log.interrupted, log.stopped_by = True, "interrupted"
        log.cut_short("interrupt")
    combined: list[SynthesisResult] = []
    for first in rs:
        for second in ag:
            a, b = first.algorithm, second.algorithm
            common = math.lcm(a.chunks, b.chunks)
            if n * common > max_chunks:
                continue
            steps = a.num_steps + b.num_steps
            if max_steps is not None and steps > max_steps:
                continue
            whole = collective.split(n * common)
            algorithm = sequence(refine(a, common // a.chunks), refine(b, common // b.chunks), whole,
                                 name=f"allreduce-{topology.name}-rs{a.num_steps}+ag{b.num_steps}"
                                      f"-c{n * common}")
            instance = Instance(steps=algorithm.num_steps, rounds=algorithm.num_rounds,
                                chunks=algorithm.chunks)
            combined.append(SynthesisResult(instance, Status.SAT, algorithm,
                                            first.seconds + second.seconds, first.backend,
                                            "reduce-scatter + allgather"))
    return prune_dominated(combined)
