"""Choose, per size range, which of a runtime's own (algorithm, protocol, channels) to force.

:func:`tune_runtime` works on three values only: the candidate :class:`Choice` list, a
``price(choice, size_bytes)`` and the runtime's ``default(size_bytes)``. Per sampled size it
keeps the fastest candidate when it beats the default by more than a threshold (else the
runtime keeps its own choice), merges neighbouring sizes with the same decision into ranges and
places every boundary, by bisection on whole bytes, where the decision changes.
:func:`tuning_rules` turns the ranges into tuner-config rules for one runtime. What the ranges
and the gains mean: docs/tuner-config.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

from collsynth.errors import InvalidInstanceError
from collsynth.export.tuner.config import (ALGORITHMS, CONFIG_PROTOCOLS, SIZE_MAX, TunerRule,
                                           keep_channels)

__all__ = ["Choice", "SizeRow", "TunedRange", "RuntimeTuning", "tune_runtime", "tuning_rules",
           "gain_text", "ALWAYS_AVAILABLE", "DEFAULT_THRESHOLD", "MAX_EVALUATIONS"]

#: A rule is written only where it is predicted faster than the runtime's own choice by more
#: than this fraction: elsewhere a rule gains nothing and risks a wrong prediction.
DEFAULT_THRESHOLD = 0.03
#: Sizes priced at most per tuning (samples and bisection together); past it the remaining
#: boundaries stay where the bisection got to (``RuntimeTuning.exact`` is then false).
MAX_EVALUATIONS = 20000
#: Pairs every NCCL communicator can run (ring is always built; LL and Simple need no enable
#: rule): what a fallback rule may force.
ALWAYS_AVAILABLE = frozenset({("ring", "ll"), ("ring", "simple")})


@dataclass(frozen=True)
class Choice:
    """One thing a tuner can make the runtime run: ``algorithm`` and ``protocol`` (spelt as in
    the tuner config) on ``channels`` channels (``None``: the runtime's own per-call count)."""

    algorithm: str
    protocol: str
    channels: int | None = None

    def __post_init__(self) -> None:
        if self.algorithm not in ALGORITHMS:
            raise InvalidInstanceError(f"Choice.algorithm = {self.algorithm!r}: expected one of "
                                       f"{', '.join(ALGORITHMS)}")
        if self.protocol not in CONFIG_PROTOCOLS:
            raise InvalidInstanceError(f"Choice.protocol = {self.protocol!r}: expected one of "
                                       f"{', '.join(CONFIG_PROTOCOLS)}")
        c = self.channels
        if c is not None and (isinstance(c, bool) or not isinstance(c, int) or c < 1):
            raise InvalidInstanceError(f"Choice.channels = {c!r}: expected None (the runtime's "
                                       "own count) or a whole number >= 1")

    @property
    def label(self) -> str:
        """``"ring/ll/16ch"``, or ``"ring/ll"`` with the runtime's own channel count."""
        return f"{self.algorithm}/{self.protocol}" + \
            ("" if self.channels is None else f"/{self.channels}ch")


@dataclass(frozen=True)
class SizeRow:
    """One sampled size: ``choice`` is what the tuned config runs there (the range's) and its
    predicted ``time_us``; ``default`` the runtime's own choice and its predicted time;
    ``fastest`` the fastest candidate, even when it is not ahead by the threshold."""

    size_bytes: int
    choice: Choice
    time_us: float
    default: Choice
    default_time_us: float
    fastest: Choice | None
    fastest_time_us: float
    sampled: bool = True

    @property
    def speedup(self) -> float:
        """Default time over chosen time (1.0 where the runtime keeps its own choice)."""
        return self.default_time_us / self.time_us if self.time_us > 0 else 1.0

    def as_dict(self) -> dict:
        return {"size_bytes": self.size_bytes, "choice": self.choice.label,
                "time_us": self.time_us, "default": self.default.label,
                "default_time_us": self.default_time_us, "speedup": self.speedup,
                "fastest": None if self.fastest is None else self.fastest.label,
                "fastest_time_us": self.fastest_time_us, "sampled": self.sampled}


@dataclass(frozen=True)
class TunedRange:
    """Sizes ``min_bytes..max_bytes`` (both inclusive; ``SIZE_MAX``: no upper end). ``keep``:
    no candidate beats the default by the threshold there, so the runtime keeps ``choice``,
    its own; otherwise ``choice`` is forced. ``rows``: the sizes priced inside, the sampled ones
    and those the bisection priced (``SizeRow.sampled`` false)."""

    min_bytes: int
    max_bytes: int
    choice: Choice
    keep: bool
    rows: tuple[SizeRow, ...]

    def contains(self, size_bytes: int) -> bool:
        return self.min_bytes <= size_bytes <= self.max_bytes

    @property
    def speedups(self) -> tuple[float, ...]:
        return tuple(row.speedup for row in self.rows)

    @property
    def gain(self) -> str:
        """The predicted gain over every size priced in the range, ends included, as the
        file's header and ``tune-runtime``'s table write it (:func:`gain_text`)."""
        return gain_text(self.speedups)

    def as_dict(self) -> dict:
        return {"min_bytes": self.min_bytes, "max_bytes": self.max_bytes,
                "choice": self.choice.label, "algorithm": self.choice.algorithm,
                "protocol": self.choice.protocol, "channels": self.choice.channels,
                "keep": self.keep, "rows": [row.as_dict() for row in self.rows]}


def gain_text(speedups: Sequence[float]) -> str:
    """Speedups as one figure: ``1.05-1.28x``, or ``1.24x`` when the ends round alike
    (``1.00x`` for none).

    >>> gain_text((1.2, 1.05, 1.28)), gain_text((1.241, 1.238)), gain_text(())
    ('1.05-1.28x', '1.24x', '1.00x')
    """
    low, high = min(speedups or (1.0,)), max(speedups or (1.0,))
    return f"{low:.2f}x" if round(low, 2) == round(high, 2) else f"{low:.2f}-{high:.2f}x"


@dataclass(frozen=True)
class RuntimeTuning:
    """What :func:`tune_runtime` found: ``ranges`` cover 0..``SIZE_MAX`` in order; ``rows``
    one per requested size; ``exact`` whether every boundary was placed to the byte;
    ``evaluations`` the sizes priced."""

    ranges: tuple[TunedRange, ...]
    rows: tuple[SizeRow, ...]
    threshold: float
    exact: bool
    evaluations: int

    def range_of(self, size_bytes: int) -> TunedRange:
        return next(r for r in self.ranges if r.contains(size_bytes))

    @property
    def gains(self) -> tuple[TunedRange, ...]:
        """The ranges that force a choice."""
        return tuple(r for r in self.ranges if not r.keep)


@dataclass(frozen=True)
class _Decision:
    key: tuple          # ("rule", choice) or ("keep", default choice)
    fastest: Choice | None
    fastest_time_us: float
    default: Choice
    default_time_us: float


def _check_sizes(sizes: Sequence[int]) -> list[int]:
    if isinstance(sizes, (str, bytes)) or not len(sizes):
        raise InvalidInstanceError("tune_runtime: give at least one size in bytes")
    for size in sizes:
        if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= SIZE_MAX:
            raise InvalidInstanceError(f"tune_runtime: size {size!r}; expected whole bytes in "
                                       f"1..{SIZE_MAX}")
    return sorted(set(sizes))


def _time(value: object, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value) \
            or value < 0 or math.isinf(value):
        raise InvalidInstanceError(f"tune_runtime: {what} = {value!r}; expected a finite time "
                                   "in us >= 0")
    return float(value)


def _mid(lo: int, hi: int) -> int:
    """A size strictly between ``lo`` and ``hi`` (``hi - lo >= 2``): the geometric middle while
    the sizes are far apart, so a boundary between 1 KiB and 1 GiB takes ~log2(30) + 30 steps,
    then the arithmetic middle."""
    if lo > 0 and hi > 2 * lo + 2:
        return min(hi - 1, max(lo + 1, math.isqrt(lo * hi)))
    return (lo + hi) // 2


def tune_runtime(choices: Sequence[Choice], sizes: Sequence[int],
                 price: Callable[[Choice, int], float | None],
                 default: Callable[[int], tuple[Choice, float]], *,
                 threshold: float = DEFAULT_THRESHOLD,
                 max_evaluations: int = MAX_EVALUATIONS,
                 max_depth: int | None = None, tie: float = 0.0,
                 bisect_all: bool = True) -> RuntimeTuning:
    """The fastest candidate per size range, where it beats the runtime's own choice.

    Parameters
    ----------
    choices:
        The candidates the runtime can run (its enabled (algorithm, protocol) pairs times the
        channel counts worth trying); earlier ones win ties.
    sizes:
        Sampled sizes in bytes (NCCL's ``nBytes``: the nccl-tests size).
    price:
        ``price(choice, size_bytes)``: predicted time in us, or ``None`` when it cannot run.
    default:
        ``default(size_bytes)``: the runtime's own ``(choice, predicted time in us)``.
    threshold:
        A candidate is forced only where ``time x (1 + threshold) < default time``.
    max_evaluations:
        Most sizes priced, samples and bisection together.
    max_depth:
        Most bisection steps between two sampled sizes (``None``: to the byte). A price that
        is not smooth in the size (a simulation's steps and chunks) can flip the decision many
        times between two samples; a bounded depth places each boundary to within
        ``gap / 2**max_depth`` bytes and keeps the flips it met, at most ``2**max_depth``
        (``RuntimeTuning.exact`` is then false where a boundary was not placed to the byte).
    tie:
        Candidates within this fraction of the fastest count as tied, and the earliest of them
        is chosen: prices that differ by rounding no longer flip the decision.
    bisect_all:
        Price every candidate at the sizes the bisection tries (the default); ``False``: only
        the fastest candidates of the two sizes the boundary lies between (a third decision in
        between is then met only among those), for prices that are slow to compute.

    Returns
    -------
    RuntimeTuning
        Ranges from 0 to ``SIZE_MAX``. At a sampled size the decision is exact; between two
        sampled sizes with different decisions the boundary is the first byte count at which
        the second decision holds (bisection on whole bytes; a third decision met on the way
        becomes a range of its own). A forced range never reaches past the smallest or the
        largest sampled size: beyond them the runtime keeps its own choice (as at that size).

    >>> ll, simple = Choice("ring", "ll", 8), Choice("ring", "simple", 8)
    >>> price = lambda c, s: 10 + s / 100 if c == ll else 30 + s / 1000
    >>> default = lambda s: (Choice("ring", "simple"), 40 + s / 500)
    >>> t = tune_runtime([ll, simple], [1000, 4000], price, default)
    >>> [(r.min_bytes, r.choice.label, r.keep) for r in t.ranges][:3]
    [(0, 'ring/simple', True), (1000, 'ring/ll/8ch', False), (2223, 'ring/simple/8ch', False)]
    """
    candidates = tuple(choices)
    for c in candidates:
        if not isinstance(c, Choice):
            raise InvalidInstanceError(f"tune_runtime: candidate {c!r} is not a Choice")
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) \
            or not 0 <= threshold < math.inf:
        raise InvalidInstanceError(f"tune_runtime: threshold = {threshold!r}; expected a "
                                   "fraction >= 0")
    requested = _check_sizes(sizes)
    decisions: dict[int, _Decision] = {}

    def decide(size: int, among: frozenset | None = None) -> _Decision:
        own = default(size)
        if not (isinstance(own, tuple) and len(own) == 2 and isinstance(own[0], Choice)):
            raise InvalidInstanceError(f"tune_runtime: default({size}) = {own!r}; expected "
                                       "(Choice, time in us)")
        own_time = _time(own[1], f"default({size}) time")
        timed = []
        for c in candidates:
            if among is not None and c not in among:
                continue
            t = price(c, size)
            if t is not None:
                timed.append((c, _time(t, f"price({c.label}, {size})")))
        best, best_time = None, math.inf
        if timed:
            least = min(t for _, t in timed)
            best, best_time = next((c, t) for c, t in timed if t <= least * (1 + tie))
        key = ("rule", best) if best is not None and best_time * (1 + threshold) < own_time \
            else ("keep", own[0])
        found = _Decision(key, best, best_time, own[0], own_time)
        decisions[size] = found
        return found

    for size in requested:
        decide(size)
    if isinstance(tie, bool) or not isinstance(tie, (int, float)) or not 0 <= tie < 1:
        raise InvalidInstanceError(f"tune_runtime: tie = {tie!r}; expected a fraction in [0, 1)")
    if max_depth is not None and (isinstance(max_depth, bool) or not isinstance(max_depth, int)
                                  or max_depth < 0):
        raise InvalidInstanceError(f"tune_runtime: max_depth = {max_depth!r}; expected None or "
                                   "a whole number >= 0")
    exact = True
    gaps = [(a, b, 0) for a, b in zip(requested, requested[1:])
            if decisions[a].key != decisions[b].key and b - a > 1]
    while gaps:
        if len(decisions) >= max_evaluations:
            exact = False
            break
        lo, hi, depth = gaps.pop()
        if max_depth is not None and depth >= max_depth:
            exact = False
            continue
        mid = _mid(lo, hi)
        decide(mid, None if bisect_all else
               frozenset(d.fastest for d in (decisions[lo], decisions[hi]) if d.fastest))
        for a, b in ((lo, mid), (mid, hi)):
            if decisions[a].key != decisions[b].key and b - a > 1:
                gaps.append((a, b, depth + 1))
    points = sorted(decisions)
    groups: list[list[int]] = []
    for size in points:
        if groups and decisions[groups[-1][0]].key == decisions[size].key:
            groups[-1].append(size)
        else:
            groups.append([size])
    ranges: list[TunedRange] = []

    sampled = set(requested)

    def rows_in(lo: int, hi: int, choice: Choice, keep: bool) -> tuple[SizeRow, ...]:
        rows = []
        for size in points:
            if lo <= size <= hi:
                d = decisions[size]
                time = d.default_time_us if keep else d.fastest_time_us
                rows.append(SizeRow(size, choice, time, d.default, d.default_time_us,
                                    d.fastest, d.fastest_time_us, size in sampled))
        return tuple(rows)

    for index, group in enumerate(groups):
        kind, choice = decisions[group[0]].key
        lo = group[0]
        hi = groups[index + 1][0] - 1 if index + 1 < len(groups) else group[-1]
        keep = kind == "keep"
        if index == 0:
            if keep:
                lo = 0
            else:  # the runtime's own choice below the smallest sampled size
                ranges.append(TunedRange(0, lo - 1, decisions[lo].default, True, ()))
        last = index + 1 == len(groups)
        ranges.append(TunedRange(lo, SIZE_MAX if last and keep else hi, choice, keep,
                                 rows_in(lo, hi, choice, keep)))
        if last and not keep and hi < SIZE_MAX:
            ranges.append(TunedRange(hi + 1, SIZE_MAX, decisions[hi].default, True, ()))
    rows = tuple(row for r in ranges for row in r.rows if row.sampled)
    return RuntimeTuning(tuple(ranges), rows, float(threshold), exact, len(decisions))


def tuning_rules(tuning: RuntimeTuning, collective: str, *, runtime: str, n_nodes: int,
                 n_ranks: int, fallback: Callable[[TunedRange], Choice] | None = None
                 ) -> tuple[TunerRule, ...]:
    """The tuner-config rules of one collective's tuning, rows matching ``n_nodes`` and
    ``n_ranks`` exactly.

    For ``rccl`` only the forced ranges become rules (a call no rule matches keeps RCCL's own
    choice and channels). For ``nccl`` every range does, the kept ones forcing the runtime's
    own choice with channels 0 (NCCL's own count), because NCCL's example plugin runs a call
    that no rule matches on ONE channel; and after every rule forcing a pair outside
    :data:`ALWAYS_AVAILABLE` comes a rule for the same range forcing ``fallback(range)``
    (default ring/simple), which NCCL reaches when it cannot run the first pair for a call
    (e.g. NVLS for an op it does not support): again so that no call falls through to one
    channel.
    """
    keep = keep_channels(runtime)
    rules = []

    def rule(r: TunedRange, c: Choice) -> TunerRule:
        return TunerRule(collective, r.min_bytes, r.max_bytes, c.algorithm, c.protocol,
                         keep if c.channels is None else c.channels, n_nodes, n_ranks)

    for r in tuning.ranges:
        if r.keep and runtime == "rccl":
            continue
        rules.append(rule(r, r.choice))
        if runtime == "nccl" and (r.choice.algorithm, r.choice.protocol) not in ALWAYS_AVAILABLE:
            backup = fallback(r) if fallback is not None else Choice("ring", "simple")
            if (backup.algorithm, backup.protocol) not in ALWAYS_AVAILABLE:
                raise InvalidInstanceError(f"tuning_rules: fallback {backup.label} may be "
                                           "unavailable itself; expected ring/ll or ring/simple")
            rules.append(rule(r, backup))
    return tuple(rules)
