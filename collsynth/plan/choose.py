"""Candidates and size ranges: which algorithm runs a collective on a group, size by size.

The details: ``docs/plan.md``, section "Choosing the candidates".
"""

from __future__ import annotations

import bisect
import dataclasses
import logging
import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Callable, Sequence

import sympy

from collsynth.algorithm.model import Algorithm
from collsynth.collective.model import Collective
from collsynth.errors import (
    InvalidCollectiveError,
    InvalidInstanceError,
    UnimplementableError,
)
from collsynth.plan.cache import FrontCache
from collsynth.synthesis.result import SYNTHESIS_FAILURES
from collsynth.exact import as_fraction
from collsynth.timing.closed_form import ClosedForm
from collsynth.timing.model import SIZE, lower_envelope
from collsynth.topology.model import Topology

__all__ = ["Line", "Sample", "Candidate", "SizeRange", "SynthOptions", "FrontOutcome",
           "synthesize_front", "choose_ranges", "choose_sampled_ranges", "ENVELOPE_LIMIT_BYTES",
           "NCCL"]

_log = logging.getLogger(__name__)

#: The label of every NCCL range.
NCCL = "nccl"
#: Sizes are compared up to this many bytes (1 PiB); a range reaching it is unbounded.
ENVELOPE_LIMIT_BYTES = 1 << 50
#: Relative difference below which two sampled times tie (floating-point rounding): NCCL keeps
#: a tied size.
_TIE = 1e-9


@dataclass(frozen=True)
class Line:
    """``time_us = intercept_us + slope_us_per_byte * size_bytes``, exact.

    >>> Line(Fraction(2), Fraction(1, 1000)).at(4000)
    Fraction(6, 1)
    """

    intercept_us: Fraction
    slope_us_per_byte: Fraction

    def at(self, size_bytes: int | Fraction) -> Fraction:
        """Microseconds at ``size_bytes``."""
        return self.intercept_us + self.slope_us_per_byte * Fraction(size_bytes)

    def expr(self) -> sympy.Expr:
        """The line as a sympy expression in :data:`collsynth.timing.model.SIZE`."""
        i, s = self.intercept_us, self.slope_us_per_byte
        return sympy.Rational(i.numerator, i.denominator) + \
            sympy.Rational(s.numerator, s.denominator) * SIZE

    @classmethod
    def from_expr(cls, expr: sympy.Expr) -> "Line":
        """The line of a sympy expression linear in ``SIZE``."""
        poly = sympy.Poly(sympy.expand(expr), SIZE)
        if poly.degree() > 1:
            raise InvalidInstanceError(f"time {expr} is not linear in size_bytes")
        return cls(as_fraction(poly.coeff_monomial(1)), as_fraction(poly.coeff_monomial(SIZE)))


@dataclass(frozen=True)
class Sample:
    """A candidate's predicted ``time_us`` at ``size_bytes`` (program model), with the
    ``protocol`` it ran and, for a synthesized program, its tuned layout (``variant``)."""

    size_bytes: int
    time_us: float
    protocol: str = ""
    variant: str = ""


@dataclass(frozen=True)
class Candidate:
    """One way to run the collective: ``source`` is ``"collsynth"`` (with its ``algorithm``) or
    ``"nccl"`` (``name`` like ``"nccl-ring/LL"``, ``"nccl-measured"`` or ``"nccl-ring"``).

    Its time is either a ``line`` (a linear model's: exact at every size) or ``samples`` (the
    program model at the plan's sizes, ascending; ``line`` is ``None``). ``yardstick`` is the
    name of the model that priced it (:class:`~collsynth.timing.pricing.PricingModel`:
    ``"closed-form"``, ``"measured"``, ``"program-model"``).
    """

    name: str
    source: str
    line: Line | None
    algorithm: Algorithm | None = dataclasses.field(default=None, compare=False)
    detail: str = ""
    samples: tuple[Sample, ...] = ()
    yardstick: str = ClosedForm.name

    def time_at(self, size_bytes: int) -> Fraction | float:
        """Predicted microseconds at ``size_bytes``: the line's (exact), or the sample at that
        size. Between samples (plots only: a plan samples every traced size) the time is
        interpolated linearly; below the first it is the first's, above the last the last
        segment is extended.

        >>> c = Candidate("r", NCCL, None, samples=(Sample(1000, 10.0), Sample(3000, 20.0)))
        >>> c.time_at(1000), c.time_at(2000), c.time_at(10), c.time_at(5000)
        (10.0, 15.0, 10.0, 30.0)
        """
        if self.line is not None:
            return self.line.at(size_bytes)
        samples = self.samples
        if not samples:
            raise InvalidInstanceError(f"candidate {self.name!r} has neither a line nor samples")
        sizes = [s.size_bytes for s in samples]
        index = bisect.bisect_left(sizes, size_bytes)
        if index < len(sizes) and sizes[index] == size_bytes:
            return samples[index].time_us
        if index == 0 or len(samples) == 1:
            return samples[0].time_us if index == 0 else samples[-1].time_us
        a, b = (samples[index - 1], samples[index]) if index < len(samples) else \
            (samples[-2], samples[-1])
        slope = (b.time_us - a.time_us) / (b.size_bytes - a.size_bytes)
        return a.time_us + slope * (size_bytes - a.size_bytes)


@dataclass(frozen=True)
class SizeRange:
    """Sizes ``min_bytes..max_bytes`` (inclusive; ``max_bytes`` ``None``: unbounded) where
    ``choice`` (a candidate's name, or :data:`NCCL`) is fastest."""

    min_bytes: int
    max_bytes: int | None
    choice: str

    def contains(self, size_bytes: int) -> bool:
        return self.min_bytes <= size_bytes and (self.max_bytes is None
                                                 or size_bytes <= self.max_bytes)


@dataclass(frozen=True, kw_only=True)
class SynthOptions:
    """How candidates are synthesized (keyword-only).

    Parameters
    ----------
    time_limit:
        Seconds for one synthesis problem (one collective on one group).
    max_group_ranks:
        Largest group synthesized with the Pareto sweep; larger ones use the bandwidth-optimal
        engine when it is installed, and stay on NCCL otherwise.
    backend:
        Solver backend (``"auto"``, ``"cpsat"``, ``"z3"``).
    max_chunks, max_steps:
        Limits of the Pareto sweep (``None``: its defaults).
    """

    time_limit: float = 30.0
    max_group_ranks: int = 16
    backend: str = "auto"
    max_chunks: int | None = None
    max_steps: int | None = None

    def __post_init__(self) -> None:
        if not (isinstance(self.time_limit, (int, float)) and self.time_limit > 0
                and math.isfinite(self.time_limit)):
            raise InvalidInstanceError(f"time_limit = {self.time_limit!r}; expected > 0")
        if not isinstance(self.max_group_ranks, int) or self.max_group_ranks < 2:
            raise InvalidInstanceError(f"max_group_ranks = {self.max_group_ranks!r}; expected "
                                       "an integer >= 2")


@dataclass(frozen=True)
class FrontOutcome:
    """The algorithms synthesized for one problem and how: ``engine`` (``"pareto"``,
    ``"bandwidth-optimal"`` or ``"none"``), ``complete`` (the search finished), ``cached``
    (read from the cache), ``note`` (one line for the report)."""

    algorithms: tuple[Algorithm, ...]
    engine: str
    complete: bool
    cached: bool
    note: str


def synthesize_front(topology: Topology, collective: Collective, *, options: SynthOptions,
                     cache: FrontCache | None = None) -> FrontOutcome:
    """The synthesized candidates of ``collective`` on ``topology`` (docs/plan.md).

    Never raises for a problem synthesis cannot solve: an unimplementable collective (a group
    whose links do not connect it), a search that finds nothing in time, or a missing engine
    give an outcome without algorithms and a note saying why.

    >>> from collsynth.topology import get_topology
    >>> from collsynth.collective import allgather
    >>> out = synthesize_front(get_topology("ring:4"), allgather(4), options=SynthOptions())
    >>> [(a.num_steps, str(a.rounds_per_chunk)) for a in out.algorithms], out.engine
    ([(2, '3/2')], 'pareto')
    """
    n = topology.num_ranks
    cache = cache if cache is not None else FrontCache(None)
    if n <= options.max_group_ranks:
        engine = "pareto"
        keyed = {"backend": options.backend, "max_chunks": options.max_chunks,
                 "max_steps": options.max_steps}
    else:
        engine = "bandwidth-optimal"
        keyed = {}
        if _bandwidth_optimal_solver() is None:
            return FrontOutcome((), "none", True, False,
                                f"not synthesized: {n} ranks is more than the "
                                f"{options.max_group_ranks} the Pareto sweep is run for, and the "
                                "bandwidth-optimal engine is not installed")
    hit = cache.get(topology, collective, engine=engine, options=keyed,
                    time_limit=options.time_limit)
    if hit is not None:
        state = "complete" if hit.complete else "incomplete"
        return FrontOutcome(hit.algorithms, engine, hit.complete, True,
                            f"{engine}: {len(hit.algorithms)} algorithm(s) from the cache "
                            f"({state} search){'; ' + hit.detail if hit.detail else ''}")
    try:
        if engine == "pareto":
            algorithms, complete, detail = _pareto(topology, collective, options)
        else:
            algorithms, complete, detail = _bandwidth_optimal(topology, collective, options)
    except UnimplementableError as exc:
        cache.put(topology, collective, (), engine=engine, options=keyed, complete=True,
                  time_limit=options.time_limit, detail=f"unimplementable: {exc}")
        return FrontOutcome((), engine, True, False, f"not synthesized: unimplementable on the "
                                                     f"group's links: {exc}")
    except InvalidCollectiveError as exc:  # a collective the engine does not handle
        return FrontOutcome((), engine, True, False, f"not synthesized: {exc}")
    except SYNTHESIS_FAILURES as exc:  # a solver that crashed or is missing: NCCL keeps them
        _log.warning("synthesis of %s on %s failed: %s", collective.describe(), topology.name,
                     exc)
        return FrontOutcome((), engine, False, False, f"synthesis failed: {exc}")
    cache.put(topology, collective, algorithms, engine=engine, options=keyed, complete=complete,
              time_limit=options.time_limit, detail=detail)
    state = "complete" if complete else "incomplete"
    return FrontOutcome(algorithms, engine, complete, False,
                        f"{engine}: {len(algorithms)} algorithm(s) synthesized ({state} search"
                        f"{', ' + detail if detail else ''})")


def _bandwidth_optimal_solver() -> Any:
    """``solve_bandwidth_optimal`` of the bandwidth-optimal engine, or ``None`` when it is not
    installed."""
    try:
        from collsynth.synthesis.bandwidth_optimal import solve_bandwidth_optimal
    except ImportError:
        try:
            from collsynth.synthesis.bandwidth_optimal.engine import solve_bandwidth_optimal
        except ImportError:
            return None
    return solve_bandwidth_optimal


def _named(algorithm: Algorithm, collective: Collective, engine: str) -> Algorithm:
    name = (f"{collective.name}-n{collective.num_ranks}-s{algorithm.num_steps}"
            f"-r{algorithm.num_rounds}-c{algorithm.chunks}")
    return dataclasses.replace(algorithm, name=name,
                               provenance={**dict(algorithm.provenance), "engine": engine})


def _pareto(topology: Topology, collective: Collective, options: SynthOptions
            ) -> tuple[tuple[Algorithm, ...], bool, str]:
    from collsynth.synthesis import SolveOptions, SweepLog, pareto_front

    log = SweepLog()
    solve = SolveOptions(backend=options.backend, time_limit=options.time_limit)
    found = tuple(_named(r.algorithm, collective, "pareto")
                  for r in pareto_front(topology, collective, max_chunks=options.max_chunks,
                                        max_steps=options.max_steps, options=solve, log=log)
                  if r.algorithm is not None)
    if log.interrupted:  # Ctrl-C: stop the whole plan, and never cache a front cut short
        raise KeyboardInterrupt
    return found, log.complete, log.stopped_by


def _bandwidth_optimal(topology: Topology, collective: Collective, options: SynthOptions
                       ) -> tuple[tuple[Algorithm, ...], bool, str]:
    """The engine's pipelined schedule and, when it has several stages, the one-stage schedule
    of the same trees (fewest steps): the envelope gives small sizes to the second."""
    solve_bandwidth_optimal = _bandwidth_optimal_solver()
    result = solve_bandwidth_optimal(topology, collective, time_limit=options.time_limit)
    if result.stopped_by == "interrupt":  # Ctrl-C during the packing: as for _pareto
        raise KeyboardInterrupt
    algorithm = getattr(result, "algorithm", None)
    if algorithm is None:
        return (), False, "the bandwidth-optimal engine found nothing"
    found = [_named(algorithm, collective, "bandwidth-optimal")]
    if result.details.get("stages", 1) > 1:
        short = solve_bandwidth_optimal(topology, collective, stages=1,
                                        time_limit=options.time_limit)
        found.append(_named(short.algorithm, collective, "bandwidth-optimal"))
    rpc = getattr(result, "rounds_per_chunk", None)
    optimal = bool(getattr(result, "optimal", True))  # a packing cut short is searched again
    return (tuple(found), optimal,
            f"rounds/chunk {rpc}" if rpc is not None else "")


def algorithm_detail(algorithm: Algorithm) -> str:
    """``steps=.. rounds=.. chunks=.. rounds/chunk=..``: the report's description of it."""
    return (f"steps={algorithm.num_steps} rounds={algorithm.num_rounds} "
            f"chunks={algorithm.chunks} rounds/chunk={algorithm.rounds_per_chunk}")


def choose_ranges(candidates: Sequence[Candidate], *,
                  limit_bytes: int = ENVELOPE_LIMIT_BYTES) -> tuple[SizeRange, ...]:
    """Whole-byte ranges covering ``0..`` (unbounded), each with its fastest candidate.

    NCCL's candidates are one choice, :data:`NCCL` (NCCL picks among them itself); on an exact
    tie NCCL keeps the size. Consecutive ranges have different choices, and each starts one byte
    after the previous one ends. A segment of the envelope holding no whole byte is dropped.

    >>> nccl = Candidate("nccl ring/LL", NCCL, Line(Fraction(10), Fraction(1, 100)))
    >>> fast = Candidate("a", "collsynth", Line(Fraction(1), Fraction(1, 50)))
    >>> choose_ranges([nccl, fast])
    (SizeRange(min_bytes=0, max_bytes=899, choice='a'), SizeRange(min_bytes=900, max_bytes=None, choice='nccl'))
    """
    if not candidates:
        return (SizeRange(0, None, NCCL),)
    ordered = sorted(candidates, key=lambda c: c.source != NCCL)  # NCCL first: it wins ties
    names = {}
    for c in ordered:
        names.setdefault(c.name, c)
    segments = lower_envelope({name: c.line.expr() for name, c in names.items()}, 0,
                              limit_bytes)
    ranges: list[SizeRange] = []
    for segment in segments:
        label = NCCL if names[segment.name].source == NCCL else segment.name
        lo = math.ceil(segment.from_bytes) if ranges else 0
        last = segment.to_bytes >= limit_bytes
        hi = None if last else math.ceil(segment.to_bytes) - 1
        if hi is not None and hi < lo:
            continue
        if ranges and ranges[-1].choice == label:
            ranges[-1] = SizeRange(ranges[-1].min_bytes, hi, label)
        else:
            if ranges:  # contiguous by construction; keep it so if a segment was dropped
                lo = ranges[-1].max_bytes + 1  # type: ignore[operator]
            ranges.append(SizeRange(lo, hi, label))
    return _nccl_keeps_ties(ranges, names)


def choose_sampled_ranges(candidates: Sequence[Candidate], *,
                          price: Callable[[str, int], float] | None = None,
                          steps: int = 8) -> tuple[SizeRange, ...]:
    """Whole-byte ranges covering ``0..`` (unbounded) from candidates priced at sampled sizes.

    At each sampled size the fastest candidate wins, NCCL's (one choice, :data:`NCCL`) on a tie
    within rounding, so no size is given to a program predicted slower than NCCL there.
    Consecutive sizes with the same winner form one range; the first range starts at 0, the
    last is unbounded. The boundary between two ranges is where their winners cross, found by
    ``steps`` bisection steps on log size with ``price(name, size_bytes)`` (the name of a
    candidate; :data:`NCCL` for NCCL's fastest), or the geometric midpoint without ``price``.

    >>> nccl = Candidate("ring", NCCL, None, samples=(Sample(1000, 9.0), Sample(4000, 12.0)))
    >>> fast = Candidate("a", "collsynth", None, samples=(Sample(1000, 7.0), Sample(4000, 13.0)))
    >>> choose_sampled_ranges([nccl, fast])
    (SizeRange(min_bytes=0, max_bytes=1999, choice='a'), SizeRange(min_bytes=2000, max_bytes=None, choice='nccl'))
    """
    if not candidates:
        return (SizeRange(0, None, NCCL),)
    sizes = sorted({s.size_bytes for c in candidates for s in c.samples})
    if not sizes:
        raise InvalidInstanceError("choose_sampled_ranges: the candidates have no samples")
    nccl = [c for c in candidates if c.source == NCCL]
    ours = [c for c in candidates if c.source != NCCL]

    def winner(size: int) -> str:
        best_nccl = min((float(c.time_at(size)) for c in nccl), default=math.inf)
        best, name = math.inf, NCCL
        for c in ours:  # the first of equal times keeps the size (the candidates' order)
            t = float(c.time_at(size))
            if t < best:
                best, name = t, c.name
        return name if best < best_nccl * (1 - _TIE) else NCCL

    labels = [winner(size) for size in sizes]
    runs: list[tuple[str, int, int]] = []   # (label, first size, last size)
    for size, label in zip(sizes, labels):
        if runs and runs[-1][0] == label:
            runs[-1] = (label, runs[-1][1], size)
        else:
            runs.append((label, size, size))

    def second_wins(first: str, second: str, size: int) -> bool:
        assert price is not None
        a, b = price(first, size), price(second, size)
        return b <= a * (1 + _TIE) if second == NCCL else b < a * (1 - _TIE)

    ranges: list[SizeRange] = []
    start = 0
    for index, (label, _, last) in enumerate(runs):
        if index + 1 == len(runs):
            ranges.append(SizeRange(start, None, label))
            break
        nxt, hi = runs[index + 1][0], runs[index + 1][1]
        lo = last
        if price is None:
            boundary = max(lo + 1, math.isqrt(lo * hi))
        else:
            for _ in range(steps):
                if hi - lo <= 1:
                    break
                mid = min(hi - 1, max(lo + 1, math.isqrt(lo * hi)))
                if second_wins(label, nxt, mid):
                    hi = mid
                else:
                    lo = mid
            boundary = hi
        ranges.append(SizeRange(start, boundary - 1, label))
        start = boundary
    return tuple(ranges)


def _nccl_keeps_ties(ranges: Sequence[SizeRange], candidates: dict[str, Candidate]
                     ) -> tuple[SizeRange, ...]:
    """Give NCCL the sizes at the ends of a range where the range's algorithm only ties it (the
    envelope gives a crossover to the line winning after it), then re-cover every size."""
    nccl = [c.line for c in candidates.values() if c.source == NCCL]
    if not nccl:
        return tuple(ranges)

    def ties(name: str, size: int) -> bool:
        return candidates[name].line.at(size) >= min(line.at(size) for line in nccl)

    trimmed = []
    for r in ranges:
        lo, hi = r.min_bytes, r.max_bytes
        if r.choice != NCCL:
            if ties(r.choice, lo):
                lo += 1
            if hi is not None and hi >= lo and ties(r.choice, hi):
                hi -= 1
            if hi is not None and hi < lo:
                continue
        trimmed.append(SizeRange(lo, hi, r.choice))
    covered: list[SizeRange] = []

    def push(hi: int | None, choice: str) -> None:
        if covered and covered[-1].choice == choice:
            covered[-1] = SizeRange(covered[-1].min_bytes, hi, choice)
        else:
            start = covered[-1].max_bytes + 1 if covered else 0  # type: ignore[operator]
            covered.append(SizeRange(start, hi, choice))

    for r in trimmed:
        start = covered[-1].max_bytes + 1 if covered else 0  # type: ignore[operator]
        if r.min_bytes > start:  # a gap left by trimming: NCCL's
            push(r.min_bytes - 1, NCCL)
        push(r.max_bytes, r.choice)
    if covered and covered[-1].max_bytes is not None:
        push(None, NCCL)
    return tuple(covered)
