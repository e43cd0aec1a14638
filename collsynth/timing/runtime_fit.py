"""Calibrate a runtime's constants on its own measured curve, by simulating its own ring.

The details: ``docs/runtime-model.md``, section "Fitting the runtime constants".
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Sequence

import numpy as np

from collsynth.errors import (FileFormatError, InputTooLargeError, InvalidInstanceError,
                              InvalidTopologyError)
from collsynth.timing.runtime_baselines import ring_program, runtime_rings
from collsynth._parse import MAX_GBPS, MIN_GBPS
from collsynth.runtimes import PROTOCOLS, RuntimeConstants, get_runtime
from collsynth.runtimes.constants import LINK_CLASSES, MAX_LATENCY_US, MIN_LATENCY_US
from collsynth.timing.metrics import gmae
from collsynth.timing.runtime_model import PreparedProgram, prepare_program, simulate_program

if TYPE_CHECKING:  # pragma: no cover
    from collsynth.topology.model import Topology

__all__ = ["RuntimeFit", "fit_runtime", "read_curve", "apply_parameters", "predict_ring",
           "protocol_split", "CURVE_FIT_ERRORS"]

#: What :func:`fit_runtime` raises on a curve or topology it cannot fit (too few sizes, no ring,
#: no figures, a ring too large to simulate); a caller with a fallback catches exactly these.
CURVE_FIT_ERRORS = (InvalidInstanceError, InvalidTopologyError, InputTooLargeError)

_MAX_CSV_BYTES = 16 * 1024 * 1024
#: Most rows of a measured curve: every fit evaluation simulates the ring at each size, about 60
#: evaluations per fit and two fits. An nccl-tests sweep from 1 B to 16 GiB has 35 sizes;
#: 1024 allow repeated runs of each, and bound the fit to minutes at worst.
MAX_CURVE_ROWS = 1024


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



def read_curve(path: str | os.PathLike[str]) -> list[tuple[int, float]]:
    """``(size_bytes, time_us)`` rows of a CSV with those two columns (others ignored; split
    by :func:`collsynth.timing.logs.csv_rows`, so blank and ``#`` lines are skipped).

    Raises
    ------
    FileFormatError
        Unreadable, not UTF-8, a missing column, a line too long, or a value that is not a
        positive number (sizes up to 1 PiB, times up to an hour).
    """
    from collsynth._files import read_bytes_bounded
    from collsynth._parse import (MAX_SIZE_BYTES, MAX_TIME_US, bounded_float, bounded_int,
                                  decode_text)
    from collsynth.timing.logs import csv_rows

    name = os.fspath(path)
    raw = read_bytes_bounded(path, _MAX_CSV_BYTES, what="a measurement CSV may have")
    lines = csv_rows(decode_text(raw, name), name)
    fields = [cell.lower() for cell in lines[0][1]] if lines else []
    for column in ("size_bytes", "time_us"):
        if column not in fields:
            raise FileFormatError(name, f"no {column!r} column (found: {', '.join(fields)})")
    at_size, at_time = fields.index("size_bytes"), fields.index("time_us")
    rows = []
    for line, cells in lines[1:]:
        try:
            size, time = int(cells[at_size]), float(cells[at_time])
        except (IndexError, ValueError) as exc:
            raise FileFormatError(name, f"line {line}: size_bytes and time_us must be "
                                  "numbers") from exc
        if size <= 0 or not time > 0 or not math.isfinite(time):
            raise FileFormatError(name, f"line {line}: expected size_bytes > 0 and time_us > 0")
        if len(rows) == MAX_CURVE_ROWS:
            raise FileFormatError(name, f"line {line}: more than {MAX_CURVE_ROWS} measured rows; "
                                        "a curve has one row per size (nccl-tests: about 35)")
        rows.append((bounded_int(size, f"line {line}: size_bytes", source=name,
                                 hi=MAX_SIZE_BYTES),
                     bounded_float(time, f"line {line}: time_us", source=name, hi=MAX_TIME_US)))
    if not rows:
        raise FileFormatError(path, "no measurement rows")
    return sorted(rows)


def protocol_split(times: Sequence[float], protocols: Sequence[str] = ("LL", "Simple")
                   ) -> list[str]:
    """The protocol of each size (ascending sizes): the first up to the largest drop of the time
    (a size whose time is below the previous size's by more than 5%), the second from there on;
    one protocol (the last) when the time never drops.

    >>> protocol_split([100, 100, 300, 200, 400])
    ['LL', 'LL', 'LL', 'Simple', 'Simple']
    """
    drops = [(times[i - 1] / times[i], i) for i in range(1, len(times))
             if times[i] < times[i - 1] / 1.05]
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
                held_out: bool = True) -> RuntimeFit:
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

    Raises
    ------
    InvalidInstanceError
        Fewer than 2 measurements, or a protocol list of the wrong length.
    """
    rows = sorted((int(s), float(t)) for s, t in measurements)
    if len(rows) < 2:
        raise InvalidInstanceError("a runtime calibration needs at least 2 measured sizes")
    sizes = [s for s, _ in rows]
    times = [t for _, t in rows]
    used = list(protocols) if protocols is not None else protocol_split(times)
    if len(used) != len(rows):
        raise InvalidInstanceError(f"{len(used)} protocols for {len(rows)} sizes")
    base = constants if constants is not None else get_runtime(runtime).defaults
    ring_set = tuple(tuple(r) for r in rings) if rings is not None else \
        runtime_rings(topology, channels)
    prepared = {p: prepare_program(ring_program(collective, ring_set, protocol=p), topology)
                for p in sorted(set(used))}
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
            return float(np.sum(2 * 0.05 ** 2 * (np.sqrt(1 + (r / 0.05) ** 2) - 1)))
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
                           f_scale=0.05, diff_step=1e-2, xtol=1e-4, ftol=1e-4, max_nfev=60)
    base_us = best_base(makespans(result.x))
    parameters = {"base_latency_us": base_us}
    parameters.update(zip(names, (float(v) for v in np.exp(result.x))))
    return parameters, constants_for(result.x, base_us)
