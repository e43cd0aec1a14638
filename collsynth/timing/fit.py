"""Fit cost models to benchmark logs: an alpha-beta line and a piecewise bus-bandwidth curve.

Both fits work on the *sweep* of a :class:`~collsynth.timing.logs.BenchmarkLog`: one point per
distinct size, whose time is the geometric mean of the rows of that size (nccl-tests measures
every size twice, out of place and in place; a repeated run adds more rows). Each fit reports two
errors (:func:`gmae`): ``gmae`` over the sweep's points, the figure the fits are judged by, and
``gmae_rows`` over every row, which also counts the scatter between the halves (an outlier half,
like a 22 us out-of-place call between two 13 us ones, weighs there in full).

**The alpha-beta line** ``time_us = alpha_us + size_bytes * beta_us_per_byte`` (of the whole
collective, sizes in the nccl-tests convention), fitted by regime rather than by one global
least-squares line, which the large sizes would dominate:

* ``alpha_us``: the median time of the ``latency_sizes`` smallest sizes (the latency regime);
* ``beta_us_per_byte``: the median of ``(time - alpha) / size`` over the ``bandwidth_sizes``
  largest sizes (the bandwidth regime); ``algbw_gbps = 1 / (beta * 1e3)`` and
  ``busbw_gbps = busbw_factor * algbw_gbps`` (nccl-tests' bus-bandwidth factor,
  :func:`~collsynth.timing.logs.busbw_factor`).

The line is close at both ends and misses near the knee, where NCCL changes protocol and the
pipeline fills; its GMAE says by how much.

**The piecewise bus-bandwidth model** of DLRM performance-model work (Lin et al., "Building a
Performance Model for Deep Learning Recommendation Model Training on GPUs", 2022), with
``x = log2(size)`` and ``busbw(size) = busbw_factor * size / (time * 1e3)``:

* up to the linearity knee ``K`` (``knee_bytes``) the time is a constant overhead,
  ``time = alpha_us`` (the bus bandwidth grows linearly with the size);
* from the saturation size ``S`` (``saturation_bytes``) on, the bus bandwidth is its peak,
  ``busbw = busbw_gbps``;
* in between, ``log10(busbw)`` is a sigmoid of ``x``: from ``log10(sigmoid_low_gbps)`` to
  ``log10(sigmoid_high_gbps)``, centred at ``log2(center_bytes)`` with ``steepness`` per doubling.
  As in that work the three pieces are fitted as pieces; they need not meet exactly at ``K`` and
  ``S``.

``K`` and ``S`` are found from the data. With them fixed the pieces share no parameter, so every
pair of measured sizes is scored at once: the overhead is the mean log time below ``K``, the peak
the mean log bandwidth from ``S``, and on a grid of centres and steepnesses the sigmoid is linear
in its two ends (linear least squares over prefix sums). Sweeps of more than 48 sizes try 48 of
them, evenly spread, as knees. The best pairs are then refined by
bounded least squares in log space (``scipy.optimize.least_squares`` with a soft-L1 loss, at a
scale of 5%, then of 0.5%, close to the least absolute error that GMAE measures) and the one with
the smallest GMAE is kept. Every figure is bounded (times and bandwidths within a factor of 4
of the data, the centre within 8 doublings of the sweep, the steepness in ``[0.05, 12]`` per
doubling), so a fit cannot run off to infinity or collapse to a step.

**GMAE**, the geometric-mean absolute error ``exp(mean(|log(predicted / measured)|)) - 1``, is a
fraction: 0.05 means the predictions are off by 5% on (geometric) average. It is the same whether
times or bandwidths are compared.

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
>>> 95 < curve.busbw_gbps <= 100, curve.gmae < 0.05
(True, True)
"""

from __future__ import annotations

import io
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from collsynth.errors import FileFormatError, UnknownNameError
from collsynth.timing.logs import BenchmarkLog

if TYPE_CHECKING:  # pragma: no cover - imported for annotations only
    from matplotlib.figure import Figure

__all__ = [
    "FitOptions",
    "AlphaBetaFit",
    "PiecewiseFit",
    "LogFits",
    "MODELS",
    "FIGURE_FORMATS",
    "gmae",
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

_STEEPNESS_BOUNDS = (0.05, 12.0)
_REFINED = 20  # knee pairs refined by least squares
_KNEE_CANDIDATES = 48  # sizes tried as knees (all of them in sweeps of up to 48 sizes)
#: Most points the piecewise fit works on: sweeps with more distinct sizes are averaged in
#: equal log-size bins first (the grid search holds 1152 x points floats several times: a log of
#: 65536 distinct sizes took 3.9 GB and a minute; nccl-tests sweeps have about 30).
_MAX_FIT_POINTS = 1024


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
    smallest of the bandwidth regime.
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
    model: str = field(default="alpha-beta", init=False)

    def time_us(self, size_bytes: Any) -> Any:
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
    """The piecewise bus-bandwidth curve (module docstring).

    ``alpha_us`` is the constant time up to ``knee_bytes``, ``busbw_gbps`` the peak bus bandwidth
    from ``saturation_bytes`` up. Between them ``log10(busbw)`` runs along a sigmoid from
    ``log10(sigmoid_low_gbps)`` to ``log10(sigmoid_high_gbps)``, centred at ``center_bytes`` with
    ``steepness`` per doubling of the size. ``factor`` is nccl-tests' ``busbw / algbw``.
    """

    file: str
    collective: str
    ranks: int
    alpha_us: float
    busbw_gbps: float
    knee_bytes: int
    saturation_bytes: int
    sigmoid_low_gbps: float
    sigmoid_high_gbps: float
    center_bytes: float
    steepness: float
    factor: float
    gmae: float
    gmae_rows: float
    model: str = field(default="piecewise", init=False)

    def busbw_at(self, size_bytes: Any) -> Any:
        """Predicted bus bandwidth (GB/s) at ``size_bytes`` (a number or an array)."""
        sizes = np.asarray(size_bytes, dtype=float)
        return np.exp(_piecewise_log_busbw(
            np.log2(sizes), math.log2(self.knee_bytes), math.log2(self.saturation_bytes),
            math.log(self.alpha_us), math.log(self.busbw_gbps), math.log(self.sigmoid_low_gbps),
            math.log(self.sigmoid_high_gbps), math.log2(self.center_bytes), self.steepness,
            math.log(self.factor)))

    def time_us(self, size_bytes: Any) -> Any:
        """Predicted microseconds at ``size_bytes`` (a number or an array)."""
        sizes = np.asarray(size_bytes, dtype=float)
        return self.factor * sizes / (self.busbw_at(sizes) * 1e3)

    def params(self) -> dict[str, float | int]:
        """The fitted figures, as a calibration file stores them."""
        return {"alpha_us": self.alpha_us, "busbw_gbps": self.busbw_gbps,
                "knee_bytes": self.knee_bytes, "saturation_bytes": self.saturation_bytes,
                "sigmoid_low_gbps": self.sigmoid_low_gbps,
                "sigmoid_high_gbps": self.sigmoid_high_gbps, "center_bytes": self.center_bytes,
                "steepness": self.steepness}


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


def gmae(predicted: Any, measured: Any) -> float:
    """The geometric-mean absolute error ``exp(mean(|log(predicted / measured)|)) - 1``.

    >>> round(gmae([110.0, 100.0], [100.0, 110.0]), 4)
    0.1
    """
    p = np.asarray(predicted, dtype=float)
    m = np.asarray(measured, dtype=float)
    return float(np.expm1(np.mean(np.abs(np.log(p / m)))))


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


def _errors(fit: Any, sweep: _Sweep) -> tuple[float, float]:
    """GMAE over the sweep's points and over every row."""
    return (gmae(fit.time_us(sweep.sizes), sweep.times),
            gmae(fit.time_us(sweep.row_sizes), sweep.row_times))


def _with_errors(fit: Any, sweep: _Sweep) -> Any:
    values = {k: getattr(fit, k) for k in fit.__dataclass_fields__ if k != "model"}
    values["gmae"], values["gmae_rows"] = _errors(fit, sweep)
    return type(fit)(**values)


# -- alpha-beta -----------------------------------------------------------------------------------


def fit_alpha_beta(log: BenchmarkLog, *, options: FitOptions | None = None) -> AlphaBetaFit:
    """Fit the alpha-beta line to ``log`` by regime (see the module docstring).

    Raises
    ------
    FileFormatError
        When the log has fewer than two distinct sizes.
    """
    options = options or FitOptions()
    sweep = _sweep(log)
    sizes, times = sweep.sizes, sweep.times
    small = min(options.latency_sizes, max(1, len(sizes) // 2))
    large = min(options.bandwidth_sizes, max(1, len(sizes) - small))
    alpha = float(np.median(times[:small]))
    beta = float(np.median((times[-large:] - alpha) / sizes[-large:]))
    if beta <= 0:  # the sweep never leaves the latency regime: the time per byte at its end
        beta = float(np.median(times[-large:] / sizes[-large:]))
    algbw = 1.0 / (beta * 1e3)
    fit = AlphaBetaFit(log.path, log.collective, log.ranks, alpha, beta, algbw,
                       algbw * log.busbw_factor, int(sizes[small - 1]), int(sizes[-large]),
                       0.0, 0.0)
    return _with_errors(fit, sweep)


# -- piecewise ------------------------------------------------------------------------------------

_LN2, _LN1E3 = math.log(2.0), math.log(1e3)


def _sigmoid(z: Any) -> Any:
    return 0.5 * (1.0 + np.tanh(0.5 * z))


def _piecewise_log_busbw(x: np.ndarray, xk: float, xs: float, log_alpha: float,
                         log_peak: float, log_low: float, log_high: float, center: float,
                         steepness: float, log_factor: float) -> np.ndarray:
    """Natural log of the bus bandwidth (GB/s) at ``x = log2(size)`` (see the module docstring;
    a sigmoid of ``log10(busbw)`` is one of ``ln(busbw)`` with the same centre and steepness)."""
    flat = log_factor + x * _LN2 - log_alpha - _LN1E3  # busbw of a constant time alpha
    middle = log_low + (log_high - log_low) * _sigmoid(steepness * (x - center))
    return np.where(x <= xk, flat, np.where(x >= xs, log_peak, middle))


def _best_pairs(x: np.ndarray, y_t: np.ndarray, y_b: np.ndarray, bounds: tuple[float, float],
                centers: tuple[float, float], count: int) -> list[tuple[int, int, np.ndarray]]:
    """The ``count`` (knee, saturation) index pairs with the least squared log error, each with
    the sigmoid (low, high, centre, steepness) that goes with it.

    With the knees fixed the three pieces share no parameter, so the error splits: the flat
    piece's best overhead is the mean log time below the knee, the peak the mean log bandwidth
    above the saturation, and for a fixed centre and steepness the sigmoid is linear in its low
    and high ends (linear least squares). A grid of centres and steepnesses, prefix sums over
    the sizes, and every pair of knees are scored at once.
    """
    n = len(x)
    lo_b, hi_b = bounds

    def prefix(values: np.ndarray) -> np.ndarray:
        return np.concatenate([np.zeros(values.shape[:-1] + (1,)), np.cumsum(values, axis=-1)],
                              axis=-1)

    # Flat piece over points 0..i and peak over points j..n-1 (sum of squared deviations).
    p1, pt, ptt = prefix(np.ones(n)), prefix(y_t), prefix(y_t ** 2)
    flat = ptt[1:] - pt[1:] ** 2 / p1[1:]  # flat[i]: points 0..i
    pb, pbb = prefix(y_b), prefix(y_b ** 2)
    tail_n = n - np.arange(n)
    peak = (pbb[n] - pbb[:n]) - (pb[n] - pb[:n]) ** 2 / tail_n  # peak[j]: points j..n-1

    # Sigmoid piece over points i+1..j-1 for every (centre, steepness) on the grid.
    c_grid = np.linspace(centers[0], centers[1], 48)
    k_grid = np.geomspace(_STEEPNESS_BOUNDS[0], _STEEPNESS_BOUNDS[1], 24)
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
            knee_bw = y_b[i]
            start = np.array([knee_bw, y_b[j], 0.5 * (x[i] + x[j]), 1.0])
        else:
            g_best = best_grid[index]
            lo_v, span_v = low[g_best, index], span[g_best, index]
            start = np.array([lo_v, lo_v + span_v, c, k])
        result.append((i, j, start))
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


def fit_piecewise(log: BenchmarkLog) -> PiecewiseFit:
    """Fit the piecewise bus-bandwidth curve to ``log`` (see the module docstring).

    Raises
    ------
    FileFormatError
        When the log has fewer than two distinct sizes.
    """
    from scipy.optimize import least_squares

    sweep = _sweep(log)
    factor = log.busbw_factor
    log_factor = math.log(factor)
    x, y_t = _binned(np.log2(sweep.sizes), sweep.log_times, _MAX_FIT_POINTS)
    y_b = log_factor + x * _LN2 - y_t - _LN1E3
    margin = math.log(4.0)
    t_bounds = (float(y_t.min()) - margin, float(y_t.max()) + margin)
    b_bounds = (float(y_b.min()) - margin, float(y_b.max()) + margin)
    c_bounds = (float(x[0]) - 8.0, float(x[-1]) + 8.0)
    lower = np.array([t_bounds[0], b_bounds[0], b_bounds[0], b_bounds[0], c_bounds[0],
                      _STEEPNESS_BOUNDS[0]])
    upper = np.array([t_bounds[1], b_bounds[1], b_bounds[1], b_bounds[1], c_bounds[1],
                      _STEEPNESS_BOUNDS[1]])

    def residuals(params: np.ndarray, xk: float, xs: float) -> np.ndarray:
        return (y_b - _piecewise_log_busbw(x, xk, xs, *params, log_factor))

    winner: tuple[float, float, float, np.ndarray] | None = None
    for i, j, sigmoid in _best_pairs(x, y_t, y_b, b_bounds, c_bounds, _REFINED):
        xk, xs = float(x[i]), float(x[j])
        start = np.concatenate([[np.mean(y_t[:i + 1]), np.mean(y_b[j:])], sigmoid])
        start = np.clip(start, lower, upper)
        params = start
        # Least squares, then closer to least absolute (log) error, which is what GMAE measures.
        for f_scale in (0.05, 0.005):
            try:
                params = least_squares(residuals, params, args=(xk, xs), bounds=(lower, upper),
                                       loss="soft_l1", f_scale=f_scale, max_nfev=200).x
            except (ValueError, np.linalg.LinAlgError):  # pragma: no cover - keep what we have
                break
        error = float(np.mean(np.abs(residuals(params, xk, xs))))
        if winner is None or error < winner[0]:
            winner = (error, xk, xs, params)
    if winner is None:  # pragma: no cover - there is always a pair when there are two sizes
        raise FileFormatError(log.path, "no knee and saturation sizes to fit")
    _, xk, xs, params = winner
    log_alpha, log_peak, log_low, log_high, center, steepness = (float(v) for v in params)
    fit = PiecewiseFit(log.path, log.collective, log.ranks, math.exp(log_alpha),
                       math.exp(log_peak), int(round(2 ** xk)), int(round(2 ** xs)),
                       math.exp(log_low), math.exp(log_high), float(2 ** center), steepness,
                       factor, 0.0, 0.0)
    return _with_errors(fit, sweep)


def fit_log(log: BenchmarkLog, *, options: FitOptions | None = None) -> LogFits:
    """Both fits of ``log``."""
    return LogFits(log, fit_alpha_beta(log, options=options), fit_piecewise(log))


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
        factor = log.busbw_factor
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
            for knee in knees:
                ax.axvline(knee, color="grey", linewidth=0.6, linestyle=":")
        time_ax.set_ylabel("time (us)")
        bw_ax.set_ylabel("bus bandwidth (GB/s)")
        title = f"{Path(log.path).name}: {log.collective}, {log.ranks} ranks"
        time_ax.set_title(title, fontsize=9)
        time_ax.legend(fontsize=8)
        bw_ax.legend(fontsize=8)
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
