"""Fit cost models to benchmark logs: an alpha-beta line and a piecewise bus-bandwidth curve.

Both fits work on the *sweep* of a :class:`~collsynth.timing.logs.BenchmarkLog`: one point per
distinct size, whose time is the geometric mean of the rows of that size (nccl-tests measures
every size twice, out of place and in place; a repeated run adds more rows). Each fit reports
three errors (:func:`collsynth.timing.metrics.gmae`): ``gmae`` over the sweep's points, the figure the fits are judged by;
``gmae_rows`` over every row, which also counts the scatter between the halves (an outlier half,
like a 22 us out-of-place call between two 13 us ones, weighs there in full); and
``gmae_heldout``, the error of the same model fitted to every other size of the sweep (the
smallest, the third, ...) on the sizes it did not see, which says how well the model predicts
between measured sizes rather than how closely it follows them (``None`` below three sizes).

The details: ``docs/timing.md``, section "Fitting logs (collsynth.timing.fit)".
"""

from __future__ import annotations

import io
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence, Union

import numpy as np

from collsynth.errors import FileFormatError, UnknownNameError
from collsynth.timing.logs import BenchmarkLog
from collsynth.timing.metrics import gmae

if TYPE_CHECKING:  # pragma: no cover - imported for annotations only
    from matplotlib.figure import Figure

__all__ = [
    "FitOptions",
    "AlphaBetaFit",
    "PiecewiseFit",
    "LogFits",
    "check_plausible",
    "MAX_BUSBW_GBPS",
    "BUSBW_PER_LINK_GBPS",
    "MODELS",
    "STEEPNESS_BOUNDS",
    "LATENCY_EXPONENT_MAX",
    "CENTER_MARGIN_DOUBLINGS",
    "FIGURE_FORMATS",
    "fit_alpha_beta",
    "fit_piecewise",
    "fit_log",
    "plot_fits",
    "save_figure",
]

#: The model names, as they appear in calibration files and ``collsynth calibrate --json``.
MODELS = ("alpha-beta", "piecewise")
#: Figure formats :func:`save_figure` writes, by file suffix.
FIGURE_FORMATS = (".png", ".svg")

#: The steepness of the piecewise curve's sigmoid, per doubling of the size: the fit's bounds,
#: and so the range a calibration file's ``steepness`` is read in.
STEEPNESS_BOUNDS = (0.05, 12.0)
#: The largest exponent of the latency piece: its time grows at most 2 ** 0.25 (19%) per doubling
#: (a calibration file's ``latency_exponent`` is read from 0 to this).
LATENCY_EXPONENT_MAX = 0.25
#: How far the sigmoid's centre may lie outside the sweep, in doublings: with sizes from 1 byte to
#: :data:`~collsynth._parse.MAX_SIZE_BYTES` (2^50), a ``center_bytes`` from 2^-8 to 2^58.
CENTER_MARGIN_DOUBLINGS = 8
#: The most the sigmoid may rise, as a fraction of the rise at which the bus bandwidth would grow
#: as fast as the size at its steepest point: below 1, the time strictly increases between the
#: knees (by at least 1% per doubling at the steepest point, far above rounding).
_RISE_MAX = 0.99
_REFINED = 12  # knee pairs refined by least squares
_POLISHED = 4  # of which the best are refined closer to the least absolute error
_KNEE_CANDIDATES = 48  # sizes tried as knees (all of them in sweeps of up to 48 sizes)
#: Most points the piecewise fit works on: sweeps with more distinct sizes are averaged in
#: equal log-size bins first (the grid search holds 1152 x points floats several times: a log of
#: 65536 distinct sizes took 3.9 GB and a minute; nccl-tests sweeps have about 30).
_MAX_FIT_POINTS = 1024


#: Sizes a fit is evaluated at: one number, a sequence, or an array (bytes).
Sizes = Union[float, Sequence[float], np.ndarray]

@dataclass(frozen=True)
class FitOptions:
    """How the fits read a log.

    Parameters
    ----------
    latency_sizes:
        How many of the smallest sizes make the alpha-beta line's latency regime (>= 1).
    bandwidth_sizes:
        How many of the largest sizes make its bandwidth regime (>= 1).
    """

    latency_sizes: int = 4
    bandwidth_sizes: int = 4

    def __post_init__(self) -> None:
        for name in ("latency_sizes", "bandwidth_sizes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"FitOptions.{name} = {value!r}: expected a whole number >= 1")


@dataclass(frozen=True)
class AlphaBetaFit:
    """``time_us = alpha_us + size_bytes * beta_us_per_byte``, fitted by regime (module docs).

    ``latency_max_bytes`` is the largest size of the latency regime, ``bandwidth_min_bytes`` the
    smallest of the bandwidth regime. ``gmae``, ``gmae_rows`` and ``gmae_heldout`` are the
    errors of docs/timing.md (fractions; ``gmae_heldout`` is ``None`` below three sizes).
    """

    file: str
    collective: str
    ranks: int
    alpha_us: float
    beta_us_per_byte: float
    algbw_gbps: float
    busbw_gbps: float
    latency_max_bytes: int
    bandwidth_min_bytes: int
    gmae: float
    gmae_rows: float
    gmae_heldout: float | None = None
    model: str = field(default="alpha-beta", init=False)

    def time_us(self, size_bytes: "Sizes") -> np.ndarray:
        """Predicted microseconds at ``size_bytes`` (a number or an array)."""
        return self.alpha_us + np.asarray(size_bytes, dtype=float) * self.beta_us_per_byte

    def params(self) -> dict[str, float | int]:
        """The fitted figures, as a calibration file stores them."""
        return {"alpha_us": self.alpha_us, "beta_us_per_byte": self.beta_us_per_byte,
                "algbw_gbps": self.algbw_gbps, "busbw_gbps": self.busbw_gbps,
                "latency_max_bytes": self.latency_max_bytes,
                "bandwidth_min_bytes": self.bandwidth_min_bytes}


@dataclass(frozen=True)
class PiecewiseFit:
    """The continuous, monotone piecewise bus-bandwidth curve (docs/timing.md).

    ``alpha_us`` is the time up to ``min_bytes`` (the least the curve predicts: its base
    latency); up to ``knee_bytes`` the time grows as ``(size / min_bytes) ** latency_exponent``;
    ``busbw_gbps`` is the peak bus bandwidth from ``saturation_bytes`` up. Between the knees
    ``log(busbw)`` follows a sigmoid centred at ``center_bytes`` with ``steepness`` per doubling,
    from the latency piece's value at the knee to the peak at saturation. ``factor`` is
    nccl-tests' ``busbw / algbw``. ``gmae``, ``gmae_rows`` and ``gmae_heldout`` are the errors of
    docs/timing.md.
    """

    file: str
    collective: str
    ranks: int
    alpha_us: float
    busbw_gbps: float
    knee_bytes: int
    saturation_bytes: int
    center_bytes: float
    steepness: float
    factor: float
    gmae: float
    gmae_rows: float
    min_bytes: int = 1
    latency_exponent: float = 0.0
    gmae_heldout: float | None = None
    model: str = field(default="piecewise", init=False)

    def busbw_at(self, size_bytes: "Sizes") -> np.ndarray:
        """Predicted bus bandwidth (GB/s) at ``size_bytes`` (a number or an array)."""
        sizes = np.asarray(size_bytes, dtype=float)
        return self.factor * sizes / (self.time_us(sizes) * 1e3)

    def time_us(self, size_bytes: "Sizes") -> np.ndarray:
        """Predicted microseconds at ``size_bytes`` (a number or an array)."""
        sizes = np.asarray(size_bytes, dtype=float)
        return np.exp(_piecewise_log_time(np.log2(sizes), _Curve.of(self),
                                          math.log(self.factor)))

    def params(self) -> dict[str, float | int]:
        """The fitted figures, as a calibration file stores them."""
        return {"alpha_us": self.alpha_us, "busbw_gbps": self.busbw_gbps,
                "min_bytes": self.min_bytes, "latency_exponent": self.latency_exponent,
                "knee_bytes": self.knee_bytes, "saturation_bytes": self.saturation_bytes,
                "center_bytes": self.center_bytes, "steepness": self.steepness}


@dataclass(frozen=True)
class LogFits:
    """A log and both of its fits."""

    log: BenchmarkLog
    alpha_beta: AlphaBetaFit
    piecewise: PiecewiseFit

    @property
    def fits(self) -> tuple[AlphaBetaFit, PiecewiseFit]:
        """Both fits, in :data:`MODELS` order."""
        return self.alpha_beta, self.piecewise



# -- the data -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Sweep:
    """One point per distinct size: the geometric mean of the times of its rows (both halves)."""

    sizes: np.ndarray  # bytes, ascending
    log_times: np.ndarray  # natural log of microseconds
    row_sizes: np.ndarray
    row_times: np.ndarray

    @property
    def times(self) -> np.ndarray:
        return np.exp(self.log_times)

    def every_other(self, first: int) -> "_Sweep":
        """The sizes ``first``, ``first + 2``, ... with their rows."""
        sizes = self.sizes[first::2]
        keep = np.isin(self.row_sizes, sizes)
        return _Sweep(sizes, self.log_times[first::2], self.row_sizes[keep], self.row_times[keep])


def _sweep(log: BenchmarkLog) -> _Sweep:
    """The sweep of ``log``; at least two distinct sizes."""
    row_sizes = np.array([r.size_bytes for r in log.rows], dtype=float)
    row_times = np.array([r.time_us for r in log.rows], dtype=float)
    sizes, inverse = np.unique(row_sizes, return_inverse=True)
    if len(sizes) < 2:
        raise FileFormatError(log.path, f"{len(sizes)} distinct message size(s); a fit needs at "
                                        "least two")
    log_times = np.bincount(inverse, weights=np.log(row_times)) / np.bincount(inverse)
    return _Sweep(sizes, log_times, row_sizes, row_times)


def _with_errors(fit: Any, sweep: _Sweep, heldout: Any) -> Any:
    """``fit`` with its errors on ``sweep``; ``heldout`` is the same model fitted to every other
    size (``None`` below three sizes), scored on the sizes it did not see."""
    values = {k: getattr(fit, k) for k in fit.__dataclass_fields__ if k != "model"}
    values["gmae"] = gmae(fit.time_us(sweep.sizes), sweep.times)
    values["gmae_rows"] = gmae(fit.time_us(sweep.row_sizes), sweep.row_times)
    if heldout is not None:
        unseen = sweep.every_other(1)
        values["gmae_heldout"] = gmae(heldout.time_us(unseen.sizes), unseen.times)
    return type(fit)(**values)


def _heldout(sweep: _Sweep, fit: Any) -> Any:
    """``fit`` (a function of a sweep) run on every other size, or ``None`` below three."""
    return fit(sweep.every_other(0)) if len(sweep.sizes) >= 3 else None


# -- alpha-beta -----------------------------------------------------------------------------------


def fit_alpha_beta(log: BenchmarkLog, *, options: FitOptions | None = None,
                   heldout: bool = True) -> AlphaBetaFit:
    """Fit the alpha-beta line to ``log`` by regime (see docs/timing.md); with
    ``heldout``, also fit every other size to score ``gmae_heldout``.

    Raises
    ------
    FileFormatError
        When the log has fewer than two distinct sizes.
    """
    options = options or FitOptions()
    sweep = _sweep(log)

    def fit(part: _Sweep) -> AlphaBetaFit:
        return _fit_alpha_beta(log, part, options)

    return _with_errors(fit(sweep), sweep, _heldout(sweep, fit) if heldout else None)


def _fit_alpha_beta(log: BenchmarkLog, sweep: _Sweep, options: FitOptions) -> AlphaBetaFit:
    sizes, times = sweep.sizes, sweep.times
    small = min(options.latency_sizes, max(1, len(sizes) // 2))
    large = min(options.bandwidth_sizes, max(1, len(sizes) - small))
    alpha = float(np.median(times[:small]))
    beta = float(np.median((times[-large:] - alpha) / sizes[-large:]))
    if beta <= 0:  # the sweep never leaves the latency regime: the time per byte at its end
        beta = float(np.median(times[-large:] / sizes[-large:]))
    algbw = 1.0 / (beta * 1e3)
    return AlphaBetaFit(log.path, log.collective, log.ranks, alpha, beta, algbw,
                        algbw * log.busbw_per_algbw, int(sizes[small - 1]), int(sizes[-large]),
                        0.0, 0.0)


# -- piecewise ------------------------------------------------------------------------------------

_LN2, _LN1E3 = math.log(2.0), math.log(1e3)


def _sigmoid(z: Any) -> Any:
    return 0.5 * (1.0 + np.tanh(0.5 * z))


def _log_sigmoid(z: Any) -> Any:
    """``log(sigmoid(z))`` without overflow or underflow."""
    return -np.logaddexp(0.0, -z)


@dataclass(frozen=True)
class _Curve:
    """The piecewise curve in the fit's coordinates: ``x = log2(size)``, natural logs."""

    x_min: float  # log2(min_bytes)
    log_alpha: float
    exponent: float  # latency_exponent
    x_knee: float
    x_saturation: float
    log_peak: float
    center: float  # log2(center_bytes)
    steepness: float

    @staticmethod
    def of(fit: PiecewiseFit) -> "_Curve":
        return _Curve(math.log2(fit.min_bytes), math.log(fit.alpha_us), fit.latency_exponent,
                      math.log2(fit.knee_bytes), math.log2(fit.saturation_bytes),
                      math.log(fit.busbw_gbps), math.log2(fit.center_bytes), fit.steepness)


def _latency_log_time(x: Any, x_min: float, log_alpha: float, exponent: float) -> Any:
    """Natural log of the latency piece's time: flat below ``x_min``, then a power law."""
    return log_alpha + exponent * _LN2 * np.maximum(np.asarray(x, dtype=float) - x_min, 0.0)


def _shape(x: Any, x_knee: float, x_sat: float, center: float, steepness: float) -> Any:
    """The sigmoid ``steepness * (x - center)`` rescaled to 0 at ``x_knee`` and 1 at ``x_sat``.

    Differences of sigmoids far in a tail are taken as ratios of logs, so that a steep curve or
    a centre far from the knees neither underflows nor divides 0 by 0."""
    z = steepness * (np.asarray(x, dtype=float) - center)
    zk, zs = steepness * (x_knee - center), steepness * (x_sat - center)
    if zk + zs <= 0:  # mostly in the lower tail: sigmoid(z) / sigmoid(zs) is well conditioned
        lk, ls, lz = _log_sigmoid(zk), _log_sigmoid(zs), _log_sigmoid(z)
        return (np.exp(lz - ls) - np.exp(lk - ls)) / -np.expm1(lk - ls)
    # Mostly in the upper tail: the same with 1 - sigmoid(z) = sigmoid(-z).
    lk, ls, lz = _log_sigmoid(-zk), _log_sigmoid(-zs), _log_sigmoid(-z)
    return (1.0 - np.exp(lz - lk)) / -np.expm1(ls - lk)


def _max_shape_slope(x_knee: float, x_sat: float, center: float, steepness: float) -> float:
    """The largest derivative of :func:`_shape` over ``[x_knee, x_sat]`` (where the sigmoid is
    steepest: at the centre, or at the knee nearest to it)."""
    zk, zs = steepness * (x_knee - center), steepness * (x_sat - center)
    z = min(max(0.0, zk), zs)
    log_top = float(_log_sigmoid(z) + _log_sigmoid(-z))  # log(sigmoid(z) * (1 - sigmoid(z)))
    if zk + zs <= 0:
        lk, ls = float(_log_sigmoid(zk)), float(_log_sigmoid(zs))
        return steepness * math.exp(log_top - ls) / -math.expm1(lk - ls)
    lk, ls = float(_log_sigmoid(-zk)), float(_log_sigmoid(-zs))
    return steepness * math.exp(log_top - lk) / -math.expm1(ls - lk)


def _piecewise_log_time(x: np.ndarray, curve: _Curve, log_factor: float) -> np.ndarray:
    """Natural log of the time (us) at ``x = log2(size)`` (see docs/timing.md; a sigmoid
    of ``log10(busbw)`` is one of ``ln(busbw)`` with the same centre and steepness). The middle
    runs from the latency piece's bus bandwidth at the knee to the peak, so the pieces meet; the
    latency piece is computed as a time, so that it is exactly flat where it is flat."""
    x = np.asarray(x, dtype=float)
    bandwidth_time = log_factor + x * _LN2 - _LN1E3  # ln(time) = this - ln(busbw)
    at_knee = float(log_factor + curve.x_knee * _LN2 - _LN1E3 - _latency_log_time(
        curve.x_knee, curve.x_min, curve.log_alpha, curve.exponent))
    between = np.clip(x, curve.x_knee, curve.x_saturation)
    middle = at_knee + (curve.log_peak - at_knee) * _shape(
        between, curve.x_knee, curve.x_saturation, curve.center, curve.steepness)
    return np.where(x <= curve.x_knee,
                    _latency_log_time(x, curve.x_min, curve.log_alpha, curve.exponent),
                    bandwidth_time - np.where(x >= curve.x_saturation, curve.log_peak, middle))


def _best_pairs(x: np.ndarray, y_t: np.ndarray, y_b: np.ndarray, bounds: tuple[float, float],
                centers: tuple[float, float], count: int
                ) -> list[tuple[int, int, np.ndarray, float]]:
    """The ``count`` (knee, saturation) index pairs with the least squared log error when the
    pieces are fitted independently, each with a start for the sigmoid (low, high, centre,
    steepness) and the latency piece's slope in ``(x, ln time)``.

    With the knees fixed independent pieces share no parameter, so the error splits: the
    latency piece is a least-squares line in ``(x, ln time)`` whose slope is clipped to
    ``[0, ln 2 * LATENCY_EXPONENT_MAX]``, the peak the mean log bandwidth above the saturation,
    and for a fixed centre and steepness the sigmoid is linear in its low and high ends (linear
    least squares). A grid of centres and steepnesses, prefix sums over the sizes, and every
    pair of knees are scored at once; the continuous curve is refined from the best.
    """
    n = len(x)
    lo_b, hi_b = bounds

    def prefix(values: np.ndarray) -> np.ndarray:
        return np.concatenate([np.zeros(values.shape[:-1] + (1,)), np.cumsum(values, axis=-1)],
                              axis=-1)

    # Latency piece over points 0..i: a line with a clipped slope (sum of squared deviations).
    p1, pt, ptt = prefix(np.ones(n)), prefix(y_t), prefix(y_t ** 2)
    px, pxx, pxt = prefix(x), prefix(x * x), prefix(x * y_t)
    cnt = p1[1:]
    var_x = pxx[1:] - px[1:] ** 2 / cnt
    cov = pxt[1:] - px[1:] * pt[1:] / cnt
    var_t = ptt[1:] - pt[1:] ** 2 / cnt
    with np.errstate(divide="ignore", invalid="ignore"):
        slope = np.where(var_x > 1e-12, cov / var_x, 0.0)
    slope = np.clip(slope, 0.0, _LN2 * LATENCY_EXPONENT_MAX)
    flat = np.maximum(var_t - 2 * slope * cov + slope ** 2 * var_x, 0.0)  # flat[i]: points 0..i
    pb, pbb = prefix(y_b), prefix(y_b ** 2)
    tail_n = n - np.arange(n)
    peak = (pbb[n] - pbb[:n]) - (pb[n] - pb[:n]) ** 2 / tail_n  # peak[j]: points j..n-1

    # Sigmoid piece over points i+1..j-1 for every (centre, steepness) on the grid.
    c_grid = np.linspace(centers[0], centers[1], 48)
    k_grid = np.geomspace(STEEPNESS_BOUNDS[0], STEEPNESS_BOUNDS[1], 24)
    g = _sigmoid(k_grid[None, :, None] * (x[None, None, :] - c_grid[:, None, None]))
    g = g.reshape(-1, n)  # (grid, n)
    sg, sgg, sgy = prefix(g), prefix(g * g), prefix(g * y_b[None, :])
    # Knee i < saturation j, both among at most _KNEE_CANDIDATES sizes spread over the sweep.
    candidates = np.unique(np.round(np.linspace(0, n - 1, min(n, _KNEE_CANDIDATES))).astype(int))
    first, second = np.triu_indices(len(candidates), k=1)
    i_idx, j_idx = candidates[first], candidates[second]
    a, b = i_idx + 1, j_idx  # the middle is points a..b-1
    m = (b - a).astype(float)
    s_g, s_gg, s_gy = sg[:, b] - sg[:, a], sgg[:, b] - sgg[:, a], sgy[:, b] - sgy[:, a]
    s_y, s_yy = pb[b] - pb[a], pbb[b] - pbb[a]
    # Fit y = low + (high - low) * g = low + span * g: normal equations in (low, span).
    det = m * s_gg - s_g ** 2
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        span = (m * s_gy - s_g * s_y) / det
        low = (s_y - span * s_g) / m
        sse = s_yy - low * s_y - span * s_gy
        high = low + span
        ok = (np.abs(det) > 1e-9 * np.maximum(m * s_gg, 1e-300)) & np.isfinite(sse)
        ok &= (low >= lo_b) & (low <= hi_b) & (high >= lo_b) & (high <= hi_b)
    sse = np.where(ok, np.maximum(sse, 0.0), np.inf)
    few = m <= 2  # 0, 1 or 2 middle points: any sigmoid through them fits exactly
    sse[:, few] = 0.0
    best_grid = np.argmin(sse, axis=0)
    middle = sse[best_grid, np.arange(len(a))]
    total = flat[i_idx] + peak[j_idx] + middle
    order = np.argsort(total, kind="stable")[:count]
    result = []
    for index in order:
        i, j = int(i_idx[index]), int(j_idx[index])
        c = c_grid[best_grid[index] // len(k_grid)]
        k = k_grid[best_grid[index] % len(k_grid)]
        if few[index] or not np.isfinite(middle[index]):  # a neutral sigmoid between the ends
            start = np.array([y_b[i], y_b[j], 0.5 * (x[i] + x[j]), 1.0])
        else:
            g_best = best_grid[index]
            lo_v, span_v = low[g_best, index], span[g_best, index]
            start = np.array([lo_v, lo_v + span_v, c, k])
        result.append((i, j, start, float(slope[i])))
    return result


def _binned(x: np.ndarray, y: np.ndarray, most: int) -> tuple[np.ndarray, np.ndarray]:
    """``(x, y)`` (``x`` increasing) as is when at most ``most`` points, else the means of ``x``
    and ``y`` over ``most`` equal-width bins of ``x`` (empty bins dropped)."""
    if len(x) <= most:
        return x, y
    edges = np.linspace(x[0], x[-1], most + 1)
    which = np.clip(np.searchsorted(edges, x, side="right") - 1, 0, most - 1)
    counts = np.bincount(which, minlength=most)
    keep = counts > 0
    return ((np.bincount(which, weights=x, minlength=most)[keep] / counts[keep]),
            (np.bincount(which, weights=y, minlength=most)[keep] / counts[keep]))


def fit_piecewise(log: BenchmarkLog, *, heldout: bool = True) -> PiecewiseFit:
    """Fit the continuous, monotone piecewise bus-bandwidth curve to ``log`` (see
    docs/timing.md); with ``heldout``, also fit every other size to score ``gmae_heldout`` (which
    doubles the work).

    Raises
    ------
    FileFormatError
        When the log has fewer than two distinct sizes.

    Examples
    --------
    A synthetic allreduce on 8 ranks: 20 us of overhead and 100 GB/s of bus bandwidth.

    >>> from collsynth.timing.logs import BenchmarkLog, BenchmarkRow
    >>> sizes = [2 ** k for k in range(3, 31)]
    >>> rows = tuple(BenchmarkRow(s, s // 4, "float", "sum", -1, 20.0 + 1.75 * s / 100e3, None,
    ...                           None, False, None, i + 1) for i, s in enumerate(sizes))
    >>> log = BenchmarkLog("synthetic", "allreduce", 8, rows, "nccl-tests")
    >>> line = fit_alpha_beta(log)
    >>> round(line.alpha_us, 3), round(line.busbw_gbps, 1), line.gmae < 0.01
    (20.0, 100.0, True)
    >>> curve = fit_piecewise(log)
    >>> 95 < curve.busbw_gbps <= 100, curve.gmae < 0.05, curve.gmae_heldout < 0.05
    (True, True, True)
    >>> bool(np.all(np.diff(curve.time_us(np.geomspace(1, 2 ** 34, 1000))) >= 0))
    True
    """
    sweep = _sweep(log)

    def fit(part: _Sweep) -> PiecewiseFit:
        return _fit_piecewise(log, part)

    return _with_errors(fit(sweep), sweep, _heldout(sweep, fit) if heldout else None)


def _fit_piecewise(log: BenchmarkLog, sweep: _Sweep) -> PiecewiseFit:
    factor = log.busbw_per_algbw
    log_factor = math.log(factor)
    x, y_t = _binned(np.log2(sweep.sizes), sweep.log_times, _MAX_FIT_POINTS)
    x_min = float(x[0])
    y_b = log_factor + x * _LN2 - y_t - _LN1E3
    margin = math.log(4.0)
    t_bounds = (float(y_t.min()) - margin, float(y_t.max()) + margin)
    b_bounds = (float(y_b.min()) - margin, float(y_b.max()) + margin)
    c_bounds = (float(x[0]) - CENTER_MARGIN_DOUBLINGS, float(x[-1]) + CENTER_MARGIN_DOUBLINGS)
    # The refined figures: log alpha, latency exponent, u (the rise of the sigmoid as a fraction
    # of the most that keeps the time from decreasing), centre, steepness.
    lower = np.array([t_bounds[0], 0.0, -1.0, c_bounds[0], STEEPNESS_BOUNDS[0]])
    upper = np.array([t_bounds[1], LATENCY_EXPONENT_MAX, _RISE_MAX, c_bounds[1],
                      STEEPNESS_BOUNDS[1]])

    def curve(params: np.ndarray, xk: float, xs: float) -> _Curve:
        log_alpha, exponent, u, center, steepness = (float(v) for v in params)
        at_knee = (log_factor + xk * _LN2 - _LN1E3
                   - _latency_log_time(xk, x_min, log_alpha, exponent))
        # The middle's slope is (peak - at_knee) * shape'; the time does not decrease while that
        # stays <= ln 2, so the rise is u * ln 2 / max(shape') with u <= _RISE_MAX < 1.
        rise = u * _LN2 / _max_shape_slope(xk, xs, center, steepness)
        return _Curve(x_min, log_alpha, exponent, xk, xs, float(at_knee) + rise, center,
                      steepness)

    def residuals_for(xk: float, xs: float) -> Any:
        """The log errors of the curve with knees ``xk``, ``xs`` (what
        :func:`_piecewise_log_time` computes, in bus bandwidth, with the pieces' points found
        once per pair)."""
        low, high = x <= xk, x >= xs
        middle = ~(low | high)
        x_mid, y_low, y_mid, y_high = x[middle], y_b[low], y_b[middle], y_b[high]
        base_low = log_factor + x[low] * _LN2 - _LN1E3
        rise_low = np.maximum(x[low] - x_min, 0.0) * _LN2
        base_knee, rise_knee = log_factor + xk * _LN2 - _LN1E3, max(xk - x_min, 0.0) * _LN2
        out = np.empty_like(x)

        def residuals(params: np.ndarray) -> np.ndarray:
            log_alpha, exponent, u, center, steepness = (float(v) for v in params)
            at_knee = base_knee - log_alpha - exponent * rise_knee
            peak = at_knee + u * _LN2 / _max_shape_slope(xk, xs, center, steepness)
            out[low] = y_low - (base_low - log_alpha - exponent * rise_low)
            out[high] = y_high - peak
            if len(x_mid):
                out[middle] = y_mid - (at_knee + (peak - at_knee)
                                       * _shape(x_mid, xk, xs, center, steepness))
            return out.copy()

        return residuals

    # Every pair is refined by least squares, then the best few closer to the least absolute
    # (log) error, which is what GMAE measures.
    refined: list[tuple[float, float, float, np.ndarray]] = []
    for i, j, sigmoid, slope in _best_pairs(x, y_t, y_b, b_bounds, c_bounds, _REFINED):
        xk, xs = float(x[i]), float(x[j])
        log_alpha = float(np.mean(y_t[:i + 1]) - slope * (np.mean(x[:i + 1]) - x_min))
        exponent = slope / _LN2
        center, steepness = float(sigmoid[2]), float(sigmoid[3])
        at_knee = float(log_factor + xk * _LN2 - _LN1E3
                        - _latency_log_time(xk, x_min, log_alpha, exponent))
        u = ((float(np.mean(y_b[j:])) - at_knee)
             * _max_shape_slope(xk, xs, center, steepness) / _LN2)
        params = np.clip([log_alpha, exponent, u, center, steepness], lower, upper)
        residuals = residuals_for(xk, xs)
        params = _least_squares(residuals, params, lower, upper, 0.05)
        refined.append((float(np.mean(np.abs(residuals(params)))), xk, xs, params))
    refined.sort(key=lambda item: item[0])
    winner: tuple[float, _Curve] | None = None
    for _, xk, xs, params in refined[:_POLISHED]:
        residuals = residuals_for(xk, xs)
        params = _least_squares(residuals, params, lower, upper, 0.005)
        error = float(np.mean(np.abs(residuals(params))))
        if winner is None or error < winner[0]:
            winner = (error, curve(params, xk, xs))
    if winner is None:  # pragma: no cover - there is always a pair when there are two sizes
        raise FileFormatError(log.path, "no knee and saturation sizes to fit")
    best = winner[1]
    return PiecewiseFit(log.path, log.collective, log.ranks, math.exp(best.log_alpha),
                        math.exp(best.log_peak), int(round(2 ** best.x_knee)),
                        int(round(2 ** best.x_saturation)), float(2 ** best.center),
                        best.steepness, factor, 0.0, 0.0, min_bytes=int(sweep.sizes[0]),
                        latency_exponent=best.exponent)


def _least_squares(residuals: Any, params: np.ndarray, lower: np.ndarray, upper: np.ndarray,
                   f_scale: float) -> np.ndarray:
    """Bounded soft-L1 least squares from ``params``; ``params`` again if scipy gives up."""
    from scipy.optimize import least_squares

    try:
        return least_squares(residuals, params, bounds=(lower, upper),
                             loss="soft_l1", f_scale=f_scale, max_nfev=50, ftol=1e-6,
                             xtol=1e-6).x
    except (ValueError, np.linalg.LinAlgError):  # pragma: no cover - keep what we have
        return params


def fit_log(log: BenchmarkLog, *, options: FitOptions | None = None,
            heldout: bool = True) -> LogFits:
    """Both fits of ``log`` (with their held-out errors unless ``heldout`` is false)."""
    return LogFits(log, fit_alpha_beta(log, options=options, heldout=heldout),
                   fit_piecewise(log, heldout=heldout))


#: Bus bandwidth no GPU of 2026 reaches, in GB/s: NVLink 5 carries 900 GB/s each way per GPU,
#: and in-switch reduction (NVLS, SHARP) at most doubles a bus bandwidth over the links.
MAX_BUSBW_GBPS = 1800.0
#: A GPU's bus bandwidth is at most this multiple of its links' total in the runtime's terms:
#: 2 for in-switch reduction, times 1.25 because the runtimes' per-link figures are 80% of the
#: link's rate (NCCL: 20 of 25 GB/s per NVLink 3, 40.1 of 50 per NVLink 5).
BUSBW_PER_LINK_GBPS = 2.5


def check_plausible(result: LogFits, ceiling_gbps: float, why: str) -> None:
    """Refuse fits whose bus bandwidth is not positive or above ``ceiling_gbps`` (GB/s;
    ``why`` completes "what ...": "a GPU of 'dgx-a100' can carry: ..."). A log whose times fall
    as the size grows, or whose repeats disagree, is fitted by a line no machine follows.

    Raises
    ------
    FileFormatError
        Naming the log, the fit, its bus bandwidth, the ceiling, and where the log's times fall.
    """
    log = result.log
    for fit in result.fits:
        busbw = fit.busbw_gbps
        if 0 < busbw <= ceiling_gbps:
            continue
        sweep = _sweep(log)
        drops = [(int(a), int(b), ta, tb) for a, b, ta, tb in
                 zip(sweep.sizes, sweep.sizes[1:], sweep.times, sweep.times[1:]) if tb < ta]
        hint = ""
        if drops:
            a, b, ta, tb = max(drops, key=lambda d: d[2] / d[3])
            hint = (f"; its times fall as sizes grow ({a} bytes: {ta:.4g} us, {b} bytes: "
                    f"{tb:.4g} us)")
        raise FileFormatError(log.path, f"the {fit.model} fit's bus bandwidth is "
                                        f"{busbw:.4g} GB/s, outside 0 to {ceiling_gbps:.4g} GB/s "
                                        f"(what {why}){hint}: not a curve of that machine; "
                                        "nothing written")


# -- plots ----------------------------------------------------------------------------------------


def plot_fits(results: LogFits | Sequence[LogFits]) -> "Figure":
    """Measured against fitted, one row per log: time (left) and bus bandwidth (right) against
    the size, log-log, with both fits and their GMAE.

    Returns a :class:`matplotlib.figure.Figure` that no pyplot state holds (it is drawn with the
    Agg canvas); show it in a notebook through :func:`save_figure` into a buffer, or save it.
    """
    from matplotlib.figure import Figure

    items = [results] if isinstance(results, LogFits) else list(results)
    if not items:
        raise ValueError("plot_fits: no logs to plot")
    fig = Figure(figsize=(11, 3.4 * len(items)), layout="constrained")
    axes = fig.subplots(len(items), 2, squeeze=False)
    for (time_ax, bw_ax), item in zip(axes, items):
        log = item.log
        sizes = np.array([r.size_bytes for r in log.rows], dtype=float)
        times = np.array([r.time_us for r in log.rows], dtype=float)
        factor = log.busbw_per_algbw
        grid = np.geomspace(sizes.min(), sizes.max(), 200)
        time_ax.scatter(sizes, times, s=12, color="black", label="measured", zorder=3)
        bw_ax.scatter(sizes, factor * sizes / (times * 1e3), s=12, color="black",
                      label="measured", zorder=3)
        for fit, style in zip(item.fits, ("--", "-")):
            label = f"{fit.model} (GMAE {fit.gmae:.1%})"
            predicted = np.asarray(fit.time_us(grid), dtype=float)
            time_ax.plot(grid, predicted, style, label=label)
            bw_ax.plot(grid, factor * grid / (predicted * 1e3), style, label=label)
        knees = (item.piecewise.knee_bytes, item.piecewise.saturation_bytes)
        for ax in (time_ax, bw_ax):
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("size (bytes)")
            for index, knee in enumerate(knees):
                ax.axvline(knee, color="grey", linewidth=0.6, linestyle=":",
                           label="piecewise: knee, saturation" if index == 0 else None)
        time_ax.set_ylabel("time (us)")
        bw_ax.set_ylabel("bus bandwidth (GB/s)")
        title = f"{Path(log.path).name}: {log.collective}, {log.ranks} ranks"
        time_ax.set_title(title, fontsize=10)
        time_ax.legend(fontsize=9)
        bw_ax.legend(fontsize=9)
    return fig


def save_figure(fig: "Figure", path: str | os.PathLike[str] | io.IOBase, *,
                format: str | None = None) -> None:
    """Save ``fig`` as PNG or SVG, chosen by the file suffix (or ``format``, for a buffer).

    Raises
    ------
    UnknownNameError
        For another suffix or format.
    """
    if format is None:
        if isinstance(path, io.IOBase):
            raise UnknownNameError("save_figure: give format='png' or 'svg' for a buffer")
        format = Path(path).suffix.lower().lstrip(".")
    format = format.lower()
    if f".{format}" not in FIGURE_FORMATS:
        raise UnknownNameError(f"figure format {format!r}: expected one of "
                               f"{', '.join(f.lstrip('.') for f in FIGURE_FORMATS)}")
    if isinstance(path, io.IOBase):
        fig.savefig(path, format=format, dpi=110)
        return
    from collsynth._output import open_atomic

    with open_atomic(path, binary=True) as handle:  # never half a file, never over a FIFO
        fig.savefig(handle, format=format, dpi=110)
