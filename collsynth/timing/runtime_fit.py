"""Calibrate a runtime's constants on its own measured curve, by simulating its own ring.

The details: ``docs/runtime-model.md``, section "Fitting the runtime constants".
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Sequence

import numpy as np

from collsynth.errors import (FileFormatError, InputTooLargeError, InvalidInstanceError,
                              InvalidTopologyError, expect_path)
from collsynth.interrupts import take as take_interrupt
from collsynth.limits import Deadline
from collsynth.timing.runtime_baselines import runtime_rings
from collsynth.timing.runtime_programs import prepared_ring
from collsynth._parse import MAX_GBPS, MIN_GBPS
from collsynth.runtimes import PROTOCOLS, RuntimeConstants, get_runtime
from collsynth.runtimes.settings import RuntimeSettings
from collsynth.runtimes.constants import LINK_CLASSES, MAX_LATENCY_US, MIN_LATENCY_US
from collsynth.timing.metrics import gmae
from collsynth.timing.runtime_model import (PreparedProgram, SimulationOptions, host_work_us,
                                            simulate_program)

if TYPE_CHECKING:  # pragma: no cover
    from collsynth.topology.model import Topology

__all__ = ["RuntimeFit", "fit_runtime", "read_curve", "read_curve_columns", "apply_parameters",
           "predict_ring", "protocol_split", "CURVE_FIT_ERRORS", "FittedConstant", "WARN_GMAE",
           "fit_runtime_choice", "MAX_BASE_US"]

#: A calibration whose in-sample or held-out GMAE is above this is reported with a warning
#: (and ``collsynth calibrate --model program --strict`` exits non-zero).
WARN_GMAE = 0.10
#: The largest base latency per call a calibration may return, us: 1 ms, about 4 times the
#: slowest small-size call of any public two-node run in data/ (RCCL over RoCE: 220 us).
MAX_BASE_US = 1000.0

#: What :func:`fit_runtime` raises on a curve or topology it cannot fit (too few sizes, no ring,
#: no figures, a ring too large to simulate); a caller with a fallback catches exactly these.
CURVE_FIT_ERRORS = (InvalidInstanceError, InvalidTopologyError, InputTooLargeError)

_MAX_CSV_BYTES = 16 * 1024 * 1024
#: Most rows of a measured curve: every fit evaluation simulates the ring at each size, about 60
#: evaluations per fit and two fits. An nccl-tests sweep from 1 B to 16 GiB has 35 sizes;
#: 1024 allow repeated runs of each, and bound the fit to minutes at worst.
MAX_CURVE_ROWS = 1024
#: Fewest distinct measured sizes a runtime calibration fits.
MIN_CURVE_SIZES = 2


@dataclass(frozen=True)
class FittedConstant:
    """One fitted constant of a calibration report: its ``value``, the plausible range it was
    bounded to (``low``, ``high``, and ``why``), and whether it ended at a bound."""

    name: str
    value: float
    low: float
    high: float
    why: str
    #: The low end is a natural value ("none"), not a limit a fit can press against.
    open_low: bool = False

    @property
    def at_bound(self) -> bool:
        span = max(abs(self.high), abs(self.low), 1e-12)
        at_low = abs(self.value - self.low) <= 1e-3 * max(abs(self.low), 1e-9 * span)
        at_high = abs(self.value - self.high) <= 1e-3 * abs(self.high)
        return (at_low and not self.open_low) or at_high

    @property
    def within(self) -> bool:
        return self.low * (1 - 1e-6) <= self.value <= self.high * (1 + 1e-6)

    def as_dict(self) -> dict[str, object]:
        return {"name": self.name, "value": self.value, "low": self.low, "high": self.high,
                "at_bound": self.at_bound, "why": self.why}


@dataclass(frozen=True)
class RuntimeFit:
    """A calibration: the fitted ``constants``, the ``parameters`` fitted (name -> value), the
    ring's ``predicted_us`` at the measured ``sizes`` against ``measured_us``, the ``protocols``
    used per size, the in-sample ``gmae`` and the ``held_out_gmae`` (fit on the even-indexed
    sizes, scored on the odd ones; ``None`` with fewer than 4 sizes)."""

    constants: RuntimeConstants
    parameters: dict[str, float]
    sizes: tuple[int, ...]
    measured_us: tuple[float, ...]
    predicted_us: tuple[float, ...]
    protocols: tuple[str, ...]
    gmae: float
    held_out_gmae: float | None
    rings: tuple[tuple[int, ...], ...] = field(default=())
    report: tuple[FittedConstant, ...] = ()
    algorithms: tuple[str, ...] = ()
    #: Why the search stopped before it converged (its time limit, Ctrl-C), or ``""``.
    stopped: str = ""

    @property
    def interrupted(self) -> bool:
        """Ctrl-C stopped the search (what it had found is kept)."""
        return self.stopped.startswith("interrupted")

    @property
    def warnings(self) -> tuple[str, ...]:
        """What a user must be told: a search cut short, a GMAE above :data:`WARN_GMAE`, a
        constant at a bound."""
        found = [self.stopped] if self.stopped else []
        if self.gmae > WARN_GMAE:
            found.append(f"in-sample GMAE {self.gmae:.1%} is above {WARN_GMAE:.0%}")
        if self.held_out_gmae is not None and self.held_out_gmae > WARN_GMAE:
            found.append(f"held-out GMAE {self.held_out_gmae:.1%} is above {WARN_GMAE:.0%}")
        for c in self.report:
            if c.at_bound:
                found.append(f"{c.name} = {c.value:.4g} sits at a bound of its plausible range "
                             f"[{c.low:.4g}, {c.high:.4g}] ({c.why})")
        return tuple(found)



#: The residual (a log ratio) where the fits' soft_l1 loss turns from squares to absolute
#: values: 5%, so that one outlying size does not pull the whole fit.
_F_SCALE = 0.05


def _soft_l1_cost(residuals: np.ndarray) -> float:
    """``scipy.optimize.least_squares``' own cost of ``residuals`` with ``loss="soft_l1"`` and
    ``f_scale=_F_SCALE``: comparable with its ``result.cost``."""
    return float(_F_SCALE ** 2 * np.sum(np.sqrt(1 + (residuals / _F_SCALE) ** 2) - 1))


class _OutOfTime(Exception):
    """A fit's residuals asked for after its time limit: the search stops there."""


def read_curve(path: str | os.PathLike[str]) -> list[tuple[int, float]]:
    """``(size_bytes, time_us)`` rows of a CSV with those two columns (others ignored; split
    by :func:`collsynth.timing.logs.csv_rows`, so blank and ``#`` lines are skipped): the rows
    of :func:`read_curve_columns`.

    Raises
    ------
    FileFormatError
        As :func:`read_curve_columns`.
    """
    return read_curve_columns(path)[0]


def read_curve_columns(path: str | os.PathLike[str]
                       ) -> tuple[list[tuple[int, float]], str | None, int | None]:
    """The ``(size_bytes, time_us)`` rows of a measured-curve CSV, ascending, and what its
    optional ``collective`` and ``ranks`` columns say (``None`` without the column, or where it
    is blank); a fit of another collective or rank count than the file's would be wrong by a
    factor, so the caller compares them with what it fits.

    Raises
    ------
    FileFormatError
        Unreadable, not UTF-8, a missing column or one named twice, a line too long, a
        value that is not a positive number (sizes up to 1 PiB, times up to an hour), a
        size given twice, or rows that name different collectives or rank counts.
    """
    from collsynth._files import read_bytes_bounded
    from collsynth._parse import (MAX_SIZE_BYTES, MAX_TIME_US, MIN_TIME_US, bounded_float,
                                  bounded_int, decode_text, number_text)
    from collsynth.timing.logs import canonical_collective, csv_header, csv_rows

    name = expect_path(path)
    raw = read_bytes_bounded(path, _MAX_CSV_BYTES, what="a measurement CSV may have")
    lines = csv_rows(decode_text(raw, name), name)
    fields = csv_header(lines, name)
    for column in ("size_bytes", "time_us"):
        if column not in fields:
            raise FileFormatError(name, f"no {column!r} column (found: {', '.join(fields)})")
    at_size, at_time = fields.index("size_bytes"), fields.index("time_us")
    said: dict[str, tuple[str, int]] = {}  # column -> (its value, the line first saying it)
    rows = []
    first_line: dict[int, int] = {}
    for line, cells in lines[1:]:
        if len(cells) <= max(at_size, at_time):
            raise FileFormatError(name, f"line {line}: {len(cells)} cell(s); the header has "
                                        f"{len(fields)} ({', '.join(fields)})")
        # as written by a benchmark: ASCII digits, no '1_024' (Python's int and float read
        # underscores and any script's digits)
        try:
            size = int(number_text(cells[at_size]))
        except ValueError as exc:
            raise FileFormatError(name, f"line {line}: size_bytes = {cells[at_size]!r}: "
                                        "expected a whole number of bytes") from exc
        try:
            time = float(number_text(cells[at_time]))
        except ValueError as exc:
            raise FileFormatError(name, f"line {line}: time_us = {cells[at_time]!r}: "
                                        "expected a number of microseconds") from exc
        for column in ("collective", "ranks"):
            at = fields.index(column) if column in fields else None
            value = cells[at].strip() if at is not None and at < len(cells) else ""
            if value and said.setdefault(column, (value, line))[0] != value:
                raise FileFormatError(name, f"line {line}: {column} {value!r}, but line "
                                            f"{said[column][1]} says {said[column][0]!r}: one "
                                            f"curve, one {column}")
        if size <= 0:
            raise FileFormatError(name, f"line {line}: size_bytes = {size}: expected > 0")
        if size in first_line:
            raise FileFormatError(name, f"line {line}: size_bytes = {size} again (first at line "
                                        f"{first_line[size]}); a curve has one row per size")
        first_line[size] = line
        if len(rows) == MAX_CURVE_ROWS:
            raise FileFormatError(name, f"line {line}: more than {MAX_CURVE_ROWS} measured rows; "
                                        "a curve has one row per size (nccl-tests: about 35)")
        rows.append((bounded_int(size, f"line {line}: size_bytes", source=name,
                                 hi=MAX_SIZE_BYTES),
                     bounded_float(time, f"line {line}: time_us", source=name, lo=MIN_TIME_US,
                                   hi=MAX_TIME_US, why="microseconds: a call takes from 1 ns to "
                                                       "an hour")))
    if not rows:
        raise FileFormatError(path, "no measurement rows")
    collective = canonical_collective(said["collective"][0]) if "collective" in said else None
    ranks = None
    if "ranks" in said:
        text, line = said["ranks"]
        try:
            ranks = int(number_text(text))
        except ValueError:
            ranks = 0
        if ranks < 1:
            raise FileFormatError(name, f"line {line}: ranks = {text!r}: expected a whole number "
                                        ">= 1")
    return sorted(rows), collective, ranks


def _measured_rows(measurements: Sequence[tuple[int, float]]) -> list[tuple[int, float]]:
    """``(size_bytes, time_us)`` ascending; at least 2 sizes, each once.

    Raises
    ------
    InvalidInstanceError
        Fewer than 2 distinct sizes, or a size measured twice.
    """
    rows = sorted((int(s), float(t)) for s, t in measurements)
    distinct = len({s for s, _ in rows})
    if distinct < MIN_CURVE_SIZES:
        raise InvalidInstanceError(f"a runtime calibration needs at least {MIN_CURVE_SIZES} "
                                   "distinct measured sizes")
    if distinct < len(rows):
        raise InvalidInstanceError("a runtime calibration takes one time per size; "
                                   "a size is measured twice")
    return rows


def protocol_split(times: Sequence[float], protocols: Sequence[str] = ("LL", "Simple"),
                   sizes: Sequence[int] | None = None, *, min_bytes: int = 4096) -> list[str]:
    """The protocol of each size (ascending sizes): the first up to the largest drop of the
    time (a size whose time is below the previous size's by more than 5%), the second from
    there on; one protocol (the last) when the time never drops. A drop back to within 10% of
    the time two sizes before is a one-off spike, not a switch; with ``sizes``, a drop below
    ``min_bytes`` (another algorithm taking over at tiny sizes) is not one either.

    >>> protocol_split([100, 120, 300, 200, 400])
    ['LL', 'LL', 'LL', 'Simple', 'Simple']
    >>> protocol_split([13, 13, 22, 14, 15])  # the spike at the third size is not a switch
    ['Simple', 'Simple', 'Simple', 'Simple', 'Simple']
    """
    drops = []
    for i in range(1, len(times)):
        if not times[i] < times[i - 1] / 1.05:
            continue
        if sizes is not None and sizes[i] < min_bytes:
            continue
        if i >= 2 and times[i] <= 1.1 * times[i - 2]:
            continue
        drops.append((times[i - 1] / times[i], i))
    if not drops:
        return [protocols[-1]] * len(times)
    i = max(drops)[1]
    return [protocols[0]] * i + [protocols[-1]] * (len(times) - i)


def apply_parameters(base: RuntimeConstants, parameters: dict[str, float],
                     bound_class: str) -> RuntimeConstants:
    """``base`` with fitted ``base_latency_us``, ``hop_scale`` and ``ceiling_<protocol>``
    (data GB/s per connection on ``bound_class`` links) in place."""
    scale = parameters.get("hop_scale", 1.0)
    hops = {k: {p: base.hop_latency_us[k][p] * scale for p in PROTOCOLS} for k in LINK_CLASSES}
    ceilings = {k: dict(base.ceiling_gbps[k]) for k in LINK_CLASSES}
    for p in PROTOCOLS:
        if f"ceiling_{p}" in parameters:
            ceilings[bound_class][p] = parameters[f"ceiling_{p}"]
    changes: dict = {"hop_latency_us": hops, "ceiling_gbps": ceilings}
    if "base_latency_us" in parameters:
        changes["base_latency_us"] = {p: parameters["base_latency_us"] for p in PROTOCOLS}
    return base.replace(**changes)


def predict_ring(prepared: dict[str, PreparedProgram], sizes: Sequence[int],
                 protocols: Sequence[str], constants: RuntimeConstants) -> list[float]:
    """The simulated ring's time at each size with its protocol."""
    return [simulate_program(prepared[p], None, s, constants).time_us
            for s, p in zip(sizes, protocols)]


def fit_runtime(measurements: Sequence[tuple[int, float]], topology: "Topology",
                collective: str = "allgather", *, runtime: str = "rccl",
                channels: int | None = None, rings: Sequence[Sequence[int]] | None = None,
                protocols: Sequence[str] | None = None,
                constants: RuntimeConstants | None = None,
                held_out: bool = True, gpus_per_thread: int = 1,
                version: tuple[int, int] | None = None,
                time_limit_s: float | None = None,
                settings: RuntimeSettings = RuntimeSettings()) -> RuntimeFit:
    """Fit ``runtime``'s constants so that its ring on ``topology`` reproduces ``measurements``.

    Parameters
    ----------
    measurements:
        ``(size_bytes, time_us)`` of the runtime's own ``collective`` (nccl-tests sizes).
    channels, rings:
        The runtime's rings: given, or the first ``channels`` of
        :func:`~collsynth.timing.runtime_baselines.runtime_rings` (default: all it finds).
    protocols:
        The protocol per measured size (default: :func:`protocol_split`).
    constants:
        Starting constants (default: the runtime's documented defaults).
    gpus_per_thread:
        How many GPUs each thread of the measured run drove (nccl-tests' ``-g``; the log's
        ``nGpus``): above 1, :func:`fit_runtime_choice` fits the host's work per call and per
        channel, per GPU driven (not the ring path of ``channels``, ``rings``, ``protocols``).
    version:
        The runtime's ``(major, minor)`` on the measured run (its log's banner), whose own
        choices the fit prices (:attr:`~collsynth.runtimes.Runtime.version`); ``None``: the
        newest modelled.
    time_limit_s:
        Seconds the search of the runtime's own choices may take (``None``: no limit); at the
        limit the best constants evaluated so far are kept, without a held-out GMAE, and
        :attr:`RuntimeFit.stopped` says so. The fit of a ring given by ``channels``, ``rings``
        or ``protocols`` takes seconds and has none.
    settings:
        The measured job's NCCL_ALGO / NCCL_PROTO / NCCL_NVLS_ENABLE
        (:func:`~collsynth.runtimes.settings.settings_from_text`): the runtime's own choices
        are narrowed by them; on a ring without a tuning, the curve's protocol switch
        (:func:`protocol_split`) is from the first to the last of the protocols NCCL_PROTO
        allows, in NCCL's order (one allowed: every size's).

    Raises
    ------
    InvalidInstanceError
        Fewer than 2 measurements, or a protocol list of the wrong length.
    """
    rows = _measured_rows(measurements)
    sizes = [s for s, _ in rows]
    times = [t for _, t in rows]
    if channels is None and rings is None and protocols is None:
        choice = fit_runtime_choice(rows, topology, collective, runtime=runtime,
                                    constants=constants, held_out=held_out,
                                    gpus_per_thread=gpus_per_thread, version=version,
                                    time_limit_s=time_limit_s, settings=settings)
        if choice is not None:
            return choice
    # the split's two protocols: the runtime's least-latency and its bulk one, among those the
    # job allows (NCCL_PROTO=^LL splits LL128 -> Simple; one protocol allowed: no split)
    allowed = [p for p in PROTOCOLS if settings.protocols is None or p in settings.protocols]
    ends = ("LL", "Simple") if settings.protocols is None else (allowed[0], allowed[-1])
    used = list(protocols) if protocols is not None else \
        protocol_split(times, ends, sizes=sizes)
    if len(used) != len(rows):
        raise InvalidInstanceError(f"{len(used)} protocols for {len(rows)} sizes")
    base = constants if constants is not None else get_runtime(runtime).defaults
    ring_set = tuple(tuple(r) for r in rings) if rings is not None else \
        runtime_rings(topology, channels)
    prepared = {p: prepared_ring(collective, ring_set, topology, p) for p in sorted(set(used))}
    layout = topology.layout
    bound_class = "network" if layout is not None and layout.multi_node else "intra"

    def fit(indices: Sequence[int]) -> tuple[dict[str, float], RuntimeConstants]:
        return _fit(base, prepared, [sizes[i] for i in indices], [times[i] for i in indices],
                    [used[i] for i in indices], bound_class, topology)

    parameters, fitted = fit(range(len(rows)))
    predicted = predict_ring(prepared, sizes, used, fitted)
    held: float | None = None
    if held_out and len(rows) >= 4:
        train = range(0, len(rows), 2)
        test = list(range(1, len(rows), 2))
        _, partial = fit(train)
        held = gmae(predict_ring(prepared, [sizes[i] for i in test], [used[i] for i in test],
                                  partial), [times[i] for i in test])
    switch = [(sizes[i - 1], used[i - 1]) for i in range(1, len(used)) if used[i] != used[i - 1]]
    fitted = fitted.replace(
        default_protocols=tuple(switch) + ((None, used[-1]),), channels=len(ring_set),
        source=(f"fitted on {len(rows)} measured sizes of {runtime}'s own {collective} ring "
                f"({len(ring_set)} channel(s)) on {topology.name}: "
                + ", ".join(f"{k} = {v:.4g}" for k, v in parameters.items())
                + f"; other figures: {base.source}"))
    return RuntimeFit(fitted, parameters, tuple(sizes), tuple(times), tuple(predicted),
                      tuple(used), gmae(predicted, times), held, ring_set)


def _bandwidth_guess(prepared: PreparedProgram, size: int, time_us: float) -> float:
    """Data GB/s per connection that would carry the ring's busiest connection in ``time_us``."""
    chunk = size / prepared.buffer_chunks
    n = prepared.program.ngpus
    return max((n - 1) * chunk / max(time_us, 1e-9) / 1e3, 1e-3)


def _fit(base: RuntimeConstants, prepared: dict[str, PreparedProgram], sizes: list[int],
         times: list[float], used: list[str], bound_class: str, topology: "Topology"
         ) -> tuple[dict[str, float], RuntimeConstants]:
    from scipy.optimize import least_squares, minimize_scalar

    ceilings = sorted(set(used))
    names = ["hop_scale"] + [f"ceiling_{p}" for p in ceilings]
    guess = [1.0]
    for p in ceilings:
        largest = max(i for i, q in enumerate(used) if q == p)
        guess.append(_bandwidth_guess(prepared[p], sizes[largest], times[largest]))
    # Every trial stays within the constants' plausible ranges (runtime_constants): hop
    # latencies from MIN_LATENCY_US to MAX_LATENCY_US, ceilings from MIN_GBPS to MAX_GBPS.
    hops = [base.hop_latency(k, p) for k in LINK_CLASSES for p in PROTOCOLS]
    hops = [h for h in hops if h > 0] or [1.0]
    lower = np.log([MIN_LATENCY_US / min(hops)] + [MIN_GBPS] * len(ceilings))
    upper = np.log([MAX_LATENCY_US / max(hops)] + [MAX_GBPS] * len(ceilings))
    start = np.clip(np.log(guess), lower + 1e-9, upper - 1e-9)
    measured = np.asarray(times, float)
    # One ring cannot tell a call's fixed cost from its hops' (both are paid once per call);
    # the base is kept at least the runtime's documented one, so the hops take the rest.
    floor = min(base.base_latency(p) for p in PROTOCOLS)

    def constants_for(x: np.ndarray, base_us: float) -> RuntimeConstants:
        parameters = dict(zip(names, np.exp(x)))
        parameters["base_latency_us"] = base_us
        return apply_parameters(base, parameters, bound_class)

    def best_base(makespans: np.ndarray) -> float:
        # time = base + makespan: the base is fitted exactly for each trial of the others
        # (robust log error, the same loss as the outer fit).
        def loss(b: float) -> float:
            r = np.log((b + makespans) / measured)
            return 2 * _soft_l1_cost(r)
        upper = min(max(float(measured.min()), floor * 1.001), MAX_LATENCY_US)
        return float(minimize_scalar(loss, bounds=(min(floor, upper), upper), method="bounded",
                                     options={"xatol": 1e-3}).x)

    def makespans(x: np.ndarray) -> np.ndarray:
        c = constants_for(x, 0.0)
        return np.array(predict_ring(prepared, sizes, used, c))

    def residuals(x: np.ndarray) -> np.ndarray:
        spans = makespans(x)
        return np.log((best_base(spans) + spans) / measured)

    result = least_squares(residuals, start, bounds=(lower, upper), loss="soft_l1",
                           f_scale=_F_SCALE, diff_step=1e-2, xtol=1e-4, ftol=1e-4, max_nfev=60)
    base_us = best_base(makespans(result.x))
    parameters = {"base_latency_us": base_us}
    parameters.update(zip(names, (float(v) for v in np.exp(result.x))))
    return parameters, constants_for(result.x, base_us)


# -- the runtime's own choices: algorithm, protocol and channels per size ----------------------

#: The host terms' lower end in the fit, us (fitted in log space): at or below it, none.
_HOST_FLOOR_US = 1e-3


def _host_us(value: float) -> float:
    """A fitted host term, 0 where the fit sat at its floor (none seen)."""
    return 0.0 if value <= 1.5 * _HOST_FLOOR_US else float(value)


def _traffic_per_rank(collective: str, n: int) -> float:
    """Bytes one rank sends per byte of the nccl-tests size, on its ring: allreduce 2(n-1)/n,
    allgather and reduce-scatter (n-1)/n, broadcast and reduce 1."""
    if collective == "allreduce":
        return 2 * (n - 1) / n
    if collective in ("allgather", "reduce_scatter"):
        return (n - 1) / n
    return 1.0


def fit_runtime_choice(measurements: Sequence[tuple[int, float]], topology: "Topology",
                       collective: str = "allreduce", *, runtime: str = "nccl",
                       constants: RuntimeConstants | None = None, held_out: bool = True,
                       starts: int = 2, gpus_per_thread: int = 1,
                       version: tuple[int, int] | None = None,
                       time_limit_s: float | None = None,
                       settings: RuntimeSettings = RuntimeSettings()) -> RuntimeFit | None:
    """Fit ``runtime``'s constants so that what it runs at each measured size (its own
    algorithm, protocol and channels: :func:`~collsynth.timing.program_model.chosen_algorithms`,
    :meth:`~collsynth.timing.program_model.ProgramModel.runtime_choice`) reproduces
    ``measurements``; ``None`` when the machine has no tuning setup (no facts). Every constant is
    bounded by physics (the report says which sit at a bound), the starting guesses come from
    the collective's traffic per connection, and the best of ``starts`` starts is kept. Where a
    thread drove several GPUs (``gpus_per_thread``), the host's work per call and per channel
    is fitted too, per GPU driven. ``version``, ``settings``: the measured runtime's and its
    job's, as for :func:`fit_runtime`.
    docs/runtime-model.md, "Fitting the runtime constants"."""
    from scipy.optimize import least_squares, minimize_scalar

    from collsynth.runtimes.constants import (CHANNEL_US_RANGE, HOP_SCALE_RANGE, HOST_US_RANGE,
                                             gamma_range)
    from collsynth.timing.pricing import RuntimeAlgorithm
    from collsynth.timing.program_model import ProgramModel, chosen_algorithms
    from collsynth.timing.tuning_model import (NVLS_ALGORITHMS, connection_gbps,
                                               gpu_bandwidth_gbps)
    from collsynth.topology.machine import machine_facts

    rows = _measured_rows(measurements)
    family = get_runtime(runtime).at_version(version).with_settings(settings)
    base = constants if constants is not None else family.defaults
    probe = ProgramModel(base, runtime=family,
                         options=SimulationOptions(gpus_per_thread=gpus_per_thread))
    setup = probe.tuning(topology, family)
    if setup is None:
        return None
    facts = machine_facts(topology)
    sizes = [s for s, _ in rows]
    times = [t for _, t in rows]
    measured = np.asarray(times, float)
    layout = topology.layout
    multi = layout is not None and layout.multi_node
    bound_class = "network" if multi else "intra"
    network = facts.network_class if multi else None
    subjects = chosen_algorithms(probe, family, collective, topology, sizes)
    shapes = [probe.runtime_choice(a, s)[0] for a, s in zip(subjects, sizes)]
    used = [p for p, _ in shapes]
    # Physics: a connection carries at most its link (the GPU pair's, or one NIC's), at least a
    # tenth of what the runtime's own tables give a channel.
    total, pair = gpu_bandwidth_gbps(topology, facts)
    link = (facts.nic_gbps or pair) if multi else pair
    names: list[str] = ["hop_scale"]
    lows: list[float] = [HOP_SCALE_RANGE[0]]
    highs: list[float] = [HOP_SCALE_RANGE[1]]
    whys: list[str] = ["1/8 to 8 times the runtime's documented hop latencies"]
    guess: list[float] = [1.0]
    n = topology.num_ranks
    # A connection's ceiling is fitted only where a connection-driven algorithm ran with that
    # protocol: NVLS's traffic is the switch's, bounded by its ports (nvls_efficiency), and a
    # ceiling fitted on it would be carried to rings that never constrained it.
    connected = [i for i, a in enumerate(subjects) if a.algorithm not in NVLS_ALGORITHMS]
    for p in sorted({used[i] for i in connected}):
        default = connection_gbps(setup, "ring", p, multi)
        largest = max(i for i in connected if used[i] == p)
        channels = max(1, shapes[largest][1] or 1)
        traffic = _traffic_per_rank(collective, n) * sizes[largest] / channels
        # The time the largest size spends moving bytes: the curve's slope from its smallest
        # size, times the size. A curve of large sizes only (MI325X: 4, 8, 16 GiB) is not
        # latency at its smallest: the largest time less the smallest made the guess 1.3x too
        # fast, in a region where the ceiling no longer binds (the links do), and the search
        # stayed there (in-sample 26%).
        slope = (times[largest] - times[0]) / max(1, sizes[largest] - sizes[0])
        span = max(slope * sizes[largest], 0.05 * times[largest])
        names.append(f"ceiling_{p}")
        lows.append(0.1 * default)
        highs.append(max(link, 0.1 * default * 1.01))
        whys.append(f"a tenth of the runtime's {default:.3g} GB/s per channel to the link's "
                    f"{link:.3g} GB/s")
        guess.append(traffic / span / 1e3)
    if len(connected) < len(subjects):
        # The switch's own rate: the program model's default is where the search starts.
        from collsynth.runtimes.constants import NVLS_EFFICIENCY_RANGE
        from collsynth.timing.switch_graphs import nvls_port_efficiency
        from collsynth.timing.tuning_model import nvls_efficiency

        port = nvls_port_efficiency(facts)
        names.append("nvls_efficiency")
        lows.append(NVLS_EFFICIENCY_RANGE[0])
        highs.append(NVLS_EFFICIENCY_RANGE[1])
        whys.append(f"the share of NVLink bandwidth an NVLS port carries (default {port:g}; "
                    f"NCCL's tuning: {nvls_efficiency(facts.compute_capability):g})")
        guess.append(base.nvls_efficiency or port)
        # One channel's head: from a tenth of NCCL's per-channel figure to the GPU's NVLink.
        default = connection_gbps(setup, "ring", "Simple", False)
        names.append("nvls_channel_gbps")
        lows.append(0.1 * default)
        highs.append(total)
        whys.append(f"one NVLS channel's SM: a tenth of the runtime's {default:.3g} GB/s per "
                    f"channel to the GPU's {total:.4g} GB/s of NVLink")
        guess.append(base.nvls_channel_gbps or default)
    combining = collective in ("allreduce", "reduce_scatter", "reduce")
    g_low, g_high = gamma_range(facts.arch)
    if combining and g_low > 0:
        names.append("gamma_us_per_byte")
        lows.append(g_low)
        highs.append(g_high)
        whys.append(f"3 bytes of device memory traffic per byte reduced, at 100% to 5% of "
                    f"{facts.arch}'s HBM rate")
        guess.append(2 * g_low)
    floor = min(base.base_latency(p) for p in PROTOCOLS)
    top = min(float(measured.min()), MAX_BASE_US)
    # A curve whose smallest size is above 64 KiB (large sizes only) cannot tell the base from
    # the bandwidth: three collinear points are matched by any base (issue 21: 9.2 ms).
    fit_base = sizes[0] <= 64 * 1024
    # The host's work shows where one thread drove several GPUs: it launches them in turn,
    # so small calls take the host's time, not the device's, and the time grows with the
    # channels the runtime adds with the size (NCCL: one per 32 KiB of an LL ring call on 8
    # ranks). With a process per GPU it hides under the device's time: not fitted.
    host_fitted = fit_base and gpus_per_thread > 1
    if host_fitted:
        names.append("host_us")
        lows.append(_HOST_FLOOR_US)
        highs.append(HOST_US_RANGE[1])
        whys.append(f"none to {HOST_US_RANGE[1]:g} us of host work per call and GPU driven "
                    f"({gpus_per_thread} per thread in this run)")
        guess.append(0.9 * min(times) / gpus_per_thread)
        names.append("channel_us")
        lows.append(_HOST_FLOOR_US)
        highs.append(CHANNEL_US_RANGE[1])
        whys.append(f"none to {CHANNEL_US_RANGE[1]:g} us of host work per channel of a call "
                    f"and GPU driven")
        guess.append(0.05)
    lower, upper = np.log(lows), np.log(highs)

    def constants_for(x: np.ndarray, base_us: float) -> RuntimeConstants:
        values = dict(zip(names, np.exp(x)))
        scale = values.pop("hop_scale")
        hops = {k: dict(base.hop_latency_us[k]) for k in LINK_CLASSES}
        if multi and network is not None and base.network_class != network:
            from collsynth.runtimes.constants import CLASS_LATENCY_US

            hops["network"] = dict(zip(PROTOCOLS, CLASS_LATENCY_US[network]))
        hops[bound_class] = {p: v * scale for p, v in hops[bound_class].items()}
        ceilings = {k: dict(base.ceiling_gbps[k]) for k in LINK_CLASSES}
        for p in PROTOCOLS:
            if f"ceiling_{p}" in values:
                ceilings[bound_class][p] = float(values[f"ceiling_{p}"])
        return base.replace(
            base_latency_us={p: base_us for p in PROTOCOLS}, hop_latency_us=hops,
            ceiling_gbps=ceilings, network_class=network, network_base_us=0.0,
            gamma_us_per_byte=float(values.get("gamma_us_per_byte", base.gamma_us_per_byte)),
            nvls_efficiency=(float(values["nvls_efficiency"]) if "nvls_efficiency" in values
                             else base.nvls_efficiency),
            nvls_channel_gbps=(float(values["nvls_channel_gbps"])
                               if "nvls_channel_gbps" in values else base.nvls_channel_gbps),
            host_us=_host_us(values.get("host_us", base.host_us)),
            channel_us=_host_us(values.get("channel_us", base.channel_us)),
            default_protocols=(), channels=None)

    def spans(x: np.ndarray, indices: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """The device's makespan at each size and the host's time (without the base)."""
        probe.constants = constants_for(x, 0.0).replace(host_us=0.0, channel_us=0.0)
        prices = [probe.price(subjects[i], [sizes[i]])[0] for i in indices]
        values = dict(zip(names, np.exp(x)))
        # Host work not fitted is the constants' own (the documented default), as priced later.
        host = [host_work_us(values.get("host_us", base.host_us),
                             values.get("channel_us", base.channel_us),
                             p.channels or 1, gpus_per_thread) for p in prices]
        return np.array([p.time_us for p in prices]), np.array(host)

    def timed(b: float, found: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
        return np.maximum(found[1], b + found[0])

    def best_base(found: tuple[np.ndarray, np.ndarray], target: np.ndarray) -> float:
        def loss(b: float) -> float:
            r = np.log(timed(b, found) / target)
            return 2 * _soft_l1_cost(r)
        # at most the smallest time measured (physics), at least the runtime's documented
        # base where that leaves room
        high = min(float(target.min()), MAX_BASE_US)
        # No size small enough to tell a call's latency, or a host that hides the device's at
        # small sizes (it launches several GPUs in turn): the documented one.
        if not fit_base or host_fitted:
            return min(floor, high)
        return float(minimize_scalar(loss, bounds=(min(floor, 0.999 * high), high),
                                     method="bounded", options={"xatol": 1e-3}).x)

    # The pull of the hop scale toward the documented hops (below). Where the host's time
    # hides the device's at small sizes, the base is the documented one and the hops are
    # told apart at mid sizes, so the pull is weak.
    pull = 0.2 if host_fitted else 0.5

    deadline = Deadline(time_limit_s)
    evaluations = [0]
    interrupted = [False]

    def fit(indices: Sequence[int], tries: int) -> tuple[np.ndarray, float, float]:
        target = measured[list(indices)]
        seen: list[tuple[float, np.ndarray]] = []  # the best point evaluated so far

        def residuals(x: np.ndarray) -> np.ndarray:
            if deadline.expired() and seen:
                raise _OutOfTime
            m = spans(x, indices)
            evaluations[0] += 1
            # A weak pull of the hop scale toward the documented hops: one curve cannot tell
            # a call's fixed cost from its hops', so the base takes what the hops need not.
            r = np.append(np.log(timed(best_base(m, target), m) / target), pull * x[0])
            cost = _soft_l1_cost(r)
            if not seen or cost < seen[0][0]:
                seen[:] = [(cost, np.array(x, dtype=float))]
            return r

        best: tuple[float, np.ndarray] | None = None
        for k in range(max(1, tries)):
            # a second start from the other side: slower links and faster hops
            factor = np.array([1.0] + [0.5 ** k if nm.startswith("ceiling") else 1.0
                                       for nm in names[1:]])
            start = np.clip(np.log(np.asarray(guess) * factor), lower + 1e-9, upper - 1e-9)
            try:
                result = least_squares(residuals, start, bounds=(lower, upper),
                                       loss="soft_l1", f_scale=_F_SCALE, diff_step=1e-2,
                                       xtol=1e-3, ftol=1e-3, max_nfev=30)
                found = (float(result.cost), result.x)
            except _OutOfTime:  # the best point any start evaluated
                found = seen[0]
            except KeyboardInterrupt:  # Ctrl-C keeps what was found, as a search's does
                if not seen and best is None:
                    raise
                take_interrupt()
                interrupted[0] = True
                found = seen[0] if seen else best
            if best is None or found[0] < best[0]:
                best = found
            if deadline.expired() or interrupted[0]:
                break
        x = best[1]
        m = spans(x, indices)
        b = best_base(m, target)
        return x, b, gmae(list(timed(b, m)), list(target))

    x, base_us, in_sample = fit(range(len(rows)), starts)
    predicted = list(timed(base_us, spans(x, range(len(rows)))))
    held: float | None = None
    stopped = ""
    if interrupted[0]:
        stopped = (f"interrupted (Ctrl-C): the best constants of {evaluations[0]} evaluations "
                   "are kept, and no held-out GMAE is computed")
    elif deadline.expired():
        stopped = (f"time limit of {time_limit_s:g} s reached: the best constants of "
                   f"{evaluations[0]} evaluations are kept, and no held-out GMAE is computed")
    elif held_out and len(rows) >= 4:
        train = list(range(0, len(rows), 2))
        test = list(range(1, len(rows), 2))
        try:  # a fit of its own: cut short, its figure would mean nothing
            hx, hb, _ = fit(train, 1)
            if not (interrupted[0] or deadline.expired()):
                held = gmae(list(timed(hb, spans(hx, test))), [times[i] for i in test])
        except KeyboardInterrupt:
            take_interrupt()
            interrupted[0] = True
        if interrupted[0]:
            stopped = ("interrupted (Ctrl-C) during the held-out fit: the constants fitted on "
                       "every size are kept, and no held-out GMAE is computed")
        elif deadline.expired():
            stopped = (f"time limit of {time_limit_s:g} s reached during the held-out fit: the "
                       "constants fitted on every size are kept, and no held-out GMAE is "
                       "computed")
    parameters = {"base_latency_us": base_us}
    parameters.update(zip(names, (float(v) for v in np.exp(x))))
    for name in ("host_us", "channel_us"):
        if name in parameters:
            parameters[name] = _host_us(parameters[name])
    report = [FittedConstant("base_latency_us", base_us, 0.0, top,
                             f"0 to the smallest measured time, at most {MAX_BASE_US:g} us"
                             + ("; not fitted: no size of 64 KiB or less" if not fit_base else
                                "; not fitted: the host's work hides it" if host_fitted
                                else ""))]
    host_terms = ("host_us", "channel_us")  # none (0) is a natural value, not a bound
    report += [FittedConstant(nm, parameters[nm], 0.0 if nm in host_terms else lo, hi, why,
                              open_low=nm in host_terms)
               for nm, lo, hi, why in zip(names, lows, highs, whys)]
    fitted = constants_for(x, base_us)
    algorithms = tuple(f"{a.algorithm}/{p}/{ch}ch" for a, (p, ch) in zip(subjects, shapes))
    switches = sorted({a for a in algorithms})
    fitted = fitted.replace(source=(
        f"fitted on {len(rows)} measured sizes of {runtime}"
        f"{'' if version is None else ' %d.%d' % version}'s {collective} on {topology.name}, "
        f"each priced as the runtime runs it ({', '.join(switches[:6])}"
        f"{'...' if len(switches) > 6 else ''}): "
        + ", ".join(f"{k} = {v:.4g}" for k, v in parameters.items())
        + f"; GMAE {in_sample:.1%} in-sample"
        + (f", {held:.1%} held out" if held is not None else "")
        + f"; other figures: {base.source}")[:4096])
    return RuntimeFit(fitted, parameters, tuple(sizes), tuple(times), tuple(predicted),
                      tuple(used), in_sample, held, (), tuple(report), algorithms, stopped)
