"""The fits against the real logs in data/ (nccl-tests and the MI250 CSV): GMAE thresholds, held-out
errors, a continuous curve whose time never drops, bounds and plots."""

from __future__ import annotations

import dataclasses
import io
import math
from pathlib import Path

import numpy as np
import pytest

from collsynth.errors import FileFormatError, UnknownNameError
from collsynth.timing.fit import (
    AlphaBetaFit,
    FitOptions,
    LogFits,
    PiecewiseFit,
    fit_alpha_beta,
    fit_log,
    fit_piecewise,
    gmae,
    plot_fits,
    save_figure,
)
from collsynth.timing.logs import BenchmarkLog, BenchmarkRow, load_log

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT / "data" / "nccl-tests"
MI250 = ROOT / "data" / "measurements" / "mi250-16gcd-x2" / "rccl_all_gather_outofplace.csv"
FIXTURES = ROOT / "tests" / "fixtures" / "logs"

#: The target: the piecewise model within 5% (GMAE over the sweep) on every log in data/.
PIECEWISE_MAX = 0.05
#: Ceiling on the held-out error (fit on every other size, scored on the others; measured value
#: + a margin): between measured sizes the curve is off by at most 7.5% on every log.
HELDOUT_MAX = 0.075
#: log -> ceiling on the alpha-beta line's GMAE (measured value + a margin). The line is fitted
#: by regime, so it misses near the knee: by 35% on the 2-node log, whose network bandwidth
#: ramps up over five decades of sizes, by 2% on alltoall, whose latency regime lasts to 2 MiB.
ALPHA_BETA_MAX = {
    "A100-16gpu-2node-p4d_all_reduce_awsdocs.txt": 0.37,
    "A100-8gpu_all_gather_superbench.txt": 0.21,
    "A100-8gpu_all_reduce_superbench.txt": 0.16,
    "A100-8gpu_alltoall_superbench.txt": 0.03,
    "A100-8gpu_reduce_scatter_superbench.txt": 0.21,
    "H100-8gpu-p5_all_reduce_awsome.txt": 0.28,
    "V100-8gpu-dgx1topo_all_reduce_konnase.txt": 0.10,
    # RCCL's own ring allgather on 2 x 16 MI250 GCDs: flat at 100 us up to 128 KiB.
    "rccl_all_gather_outofplace.csv": 0.13,
}


@pytest.fixture(scope="module")
def fitted() -> dict[str, LogFits]:
    if not SHARED.is_dir() or not MI250.is_file():
        pytest.fail(f"{SHARED} or {MI250} is missing: the tests read the repository's data/")
    logs = [load_log(p) for p in sorted(SHARED.glob("*.txt"))]
    logs.append(load_log(MI250, ranks=32))  # the CSV does not say; its README does
    return {Path(log.path).name: fit_log(log) for log in logs}


def _synthetic(alpha_us: float, busbw_gbps: float, *, collective: str = "allreduce",
               ranks: int = 8, sizes: list[int] | None = None) -> BenchmarkLog:
    factor = 2 * (ranks - 1) / ranks if collective == "allreduce" else (ranks - 1) / ranks
    sizes = sizes or [2 ** k for k in range(3, 31)]
    rows = tuple(BenchmarkRow(s, s // 4, "float", "sum", -1,
                              alpha_us + factor * s / (busbw_gbps * 1e3), None, None, half == 1,
                              None, i + 1)
                 for i, s in enumerate(sizes) for half in range(2))
    return BenchmarkLog("synthetic", collective, ranks, rows, "nccl-tests")


def test_every_shared_log_has_a_threshold(fitted: dict[str, LogFits]):
    assert set(fitted) == set(ALPHA_BETA_MAX)


@pytest.mark.parametrize("name", sorted(ALPHA_BETA_MAX))
def test_gmae_thresholds(fitted: dict[str, LogFits], name: str):
    line, curve = fitted[name].fits
    assert curve.gmae <= PIECEWISE_MAX, f"{name}: piecewise GMAE {curve.gmae:.4f}"
    assert line.gmae <= ALPHA_BETA_MAX[name], f"{name}: alpha-beta GMAE {line.gmae:.4f}"
    assert curve.gmae < line.gmae
    # Over every row (both halves, outliers in full) the piecewise curve stays within 6%.
    assert curve.gmae_rows <= 0.06 and line.gmae_rows <= ALPHA_BETA_MAX[name] + 0.01
    # Between measured sizes (a fit to every other size, scored on the rest).
    assert curve.gmae_heldout <= HELDOUT_MAX, f"{name}: held out {curve.gmae_heldout:.4f}"
    assert line.gmae_heldout <= ALPHA_BETA_MAX[name] + 0.02


def _never_drops_and_has_no_jump(curve: PiecewiseFit, largest: float) -> None:
    """The predicted time on a dense grid from 1 B to 16x the largest size: it never decreases,
    and it is continuous: refining the grid 8-fold shrinks the largest step between neighbours
    about 8-fold (a jump would stay the same size however fine the grid)."""
    top = math.log2(largest) + 4
    coarse = np.asarray(curve.time_us(2.0 ** np.arange(0.0, top, 1 / 32)), dtype=float)
    fine = np.asarray(curve.time_us(2.0 ** np.arange(0.0, top, 1 / 256)), dtype=float)
    assert np.all(np.isfinite(fine)) and np.all(fine > 0)
    steps = np.diff(np.log(fine))
    assert steps.min() >= 0, f"the time drops by {-steps.min():.2e} (log) at some size"
    assert steps.max() <= np.diff(np.log(coarse)).max() / 4, "a jump in the predicted time"
    # Never below the base latency: the least time predicted is alpha_us, at the smallest sizes.
    assert fine.min() == pytest.approx(curve.alpha_us, rel=1e-9)


@pytest.mark.parametrize("name", sorted(ALPHA_BETA_MAX))
def test_piecewise_is_continuous_and_never_drops(fitted: dict[str, LogFits], name: str):
    item = fitted[name]
    _never_drops_and_has_no_jump(item.piecewise, max(item.log.sizes))


def test_random_curves_are_continuous_and_never_drop():
    """Noisy curves with protocol bumps, some whose measured time drops as the size grows."""
    rng = np.random.default_rng(20260514)
    for trial in range(6):
        sizes = [2 ** k for k in range(int(rng.integers(0, 6)), int(rng.integers(24, 34)))]
        alpha, busbw = float(rng.uniform(5, 200)), float(rng.uniform(5, 500))
        log = _synthetic(alpha, busbw, sizes=sizes, ranks=int(rng.integers(2, 64)))
        bump = rng.integers(len(sizes) // 3, len(sizes))  # a protocol switch: 30-60% slower
        times = np.array([r.time_us for r in log.rows])
        times *= np.exp(rng.normal(0, 0.08, len(times)))
        slow = np.array([r.size_bytes for r in log.rows]) == sizes[bump]
        times[slow] *= rng.uniform(1.3, 1.6)
        rows = tuple(dataclasses.replace(r, time_us=float(t)) for r, t in zip(log.rows, times))
        curve = fit_piecewise(dataclasses.replace(log, rows=rows), heldout=False)
        _never_drops_and_has_no_jump(curve, sizes[-1])


def test_heldout_error_scores_the_sizes_left_out():
    """Every other size twice as slow as the line through the others: a fit to the smallest,
    third, fifth... size follows them, so on the sizes left out it is off by a factor of 2
    (GMAE 100%), while over all sizes a curve between the two misses each by about sqrt(2)."""
    sizes = [2 ** k for k in range(3, 31)]
    rows = tuple(BenchmarkRow(s, s // 4, "float", "sum", -1,
                              (20.0 + 1.75 * s / 100e3) * (2.0 if i % 2 else 1.0), None, None,
                              False, None, i + 1) for i, s in enumerate(sizes))
    log = BenchmarkLog("zigzag", "allreduce", 8, rows, "nccl-tests")
    for fit in fit_log(log).fits:
        assert fit.gmae_heldout == pytest.approx(1.0, abs=0.03), fit.model
        assert fit.gmae < 0.6, fit.model
    assert fit_piecewise(log, heldout=False).gmae_heldout is None
    three = _synthetic(10.0, 50.0, sizes=[1024, 1 << 20, 1 << 24])
    assert math.isfinite(fit_piecewise(three).gmae_heldout)  # fitted on two sizes, scored on one
    two = _synthetic(10.0, 50.0, sizes=[1024, 1 << 24])
    assert fit_piecewise(two).gmae_heldout is None and fit_alpha_beta(two).gmae_heldout is None


@pytest.mark.parametrize("name", sorted(ALPHA_BETA_MAX))
def test_fits_are_bounded_and_sensible(fitted: dict[str, LogFits], name: str):
    item = fitted[name]
    log, line, curve = item.log, item.alpha_beta, item.piecewise
    sizes = log.sizes
    times = np.array([r.time_us for r in log.rows])
    busbw = max(r.busbw_gbps or 0.0 for r in log.rows)
    # Alpha-beta: the small-message time and the large-message bus bandwidth of the log.
    assert min(times) <= line.alpha_us <= 1.2 * min(times)
    assert 0.85 * busbw <= line.busbw_gbps <= 1.1 * busbw
    assert math.isclose(line.busbw_gbps, line.algbw_gbps * log.busbw_per_algbw)
    assert line.latency_max_bytes in sizes and line.bandwidth_min_bytes in sizes
    # Piecewise: knees at measured sizes, in order, the figures within the bounds.
    assert curve.knee_bytes in sizes and curve.saturation_bytes in sizes
    assert curve.knee_bytes < curve.saturation_bytes
    assert 0.05 <= curve.steepness <= 12.0
    assert sizes[0] / 2 ** 8 <= curve.center_bytes <= sizes[-1] * 2 ** 8
    assert min(times) / 4 <= curve.alpha_us <= max(times) * 4
    assert 0.85 * busbw <= curve.busbw_gbps <= 1.1 * busbw
    # The prediction at the sizes is positive and finite.
    predicted = np.asarray(curve.time_us(np.array(sizes, dtype=float)))
    assert np.all(np.isfinite(predicted)) and np.all(predicted > 0)


def test_piecewise_pieces(fitted: dict[str, LogFits]):
    curve = fitted["A100-8gpu_all_reduce_superbench.txt"].piecewise
    # The latency piece: alpha at and below the smallest size, then a power law to the knee.
    assert float(curve.time_us(1)) == pytest.approx(curve.alpha_us)
    assert curve.min_bytes == min(fitted["A100-8gpu_all_reduce_superbench.txt"].log.sizes)
    assert 0 <= curve.latency_exponent <= 0.25
    knee_time = curve.alpha_us * (curve.knee_bytes / curve.min_bytes) ** curve.latency_exponent
    assert float(curve.time_us(curve.knee_bytes)) == pytest.approx(knee_time)
    assert float(curve.busbw_at(curve.saturation_bytes * 2)) == pytest.approx(curve.busbw_gbps)
    # The sigmoid meets the peak at saturation and the latency piece at the knee.
    assert float(curve.busbw_at(curve.saturation_bytes)) == pytest.approx(curve.busbw_gbps)
    middle = math.sqrt(curve.knee_bytes * curve.saturation_bytes)
    assert (float(curve.busbw_at(curve.knee_bytes)) < float(curve.busbw_at(middle))
            < curve.busbw_gbps)


def test_gmae_definition():
    assert gmae([1.0, 2.0], [1.0, 2.0]) == 0.0
    # |log(1.1)| and |log(1/1.1)| are equal: 10% either way.
    assert gmae([110.0, 100.0], [100.0, 110.0]) == pytest.approx(0.1)
    assert gmae([2.0], [1.0]) == pytest.approx(1.0)


def test_exact_alpha_beta_log():
    log = _synthetic(20.0, 100.0)
    line = fit_alpha_beta(log)
    assert line.alpha_us == pytest.approx(20.0, rel=1e-3)
    assert line.busbw_gbps == pytest.approx(100.0, rel=1e-3)
    assert line.gmae < 1e-3
    assert fit_piecewise(log).gmae < 0.02


def test_options_choose_the_regimes():
    log = _synthetic(20.0, 100.0, collective="allgather")
    line = fit_alpha_beta(log, options=FitOptions(latency_sizes=2, bandwidth_sizes=1))
    assert (line.latency_max_bytes, line.bandwidth_min_bytes) == (16, 2 ** 30)
    with pytest.raises(ValueError, match="latency_sizes"):
        FitOptions(latency_sizes=0)


def test_two_sizes_fit_and_one_does_not():
    two = _synthetic(10.0, 50.0, sizes=[1024, 1 << 24])
    assert fit_piecewise(two).gmae < 1e-6
    assert fit_alpha_beta(two).gmae < 0.01  # alpha is the time at 1 KiB, not at 0 B
    one = _synthetic(10.0, 50.0, sizes=[1024])
    for fit in (fit_alpha_beta, fit_piecewise):
        with pytest.raises(FileFormatError, match="1 distinct message size"):
            fit(one)


def test_latency_only_sweep_stays_finite():
    log = _synthetic(30.0, 1e6, sizes=[2 ** k for k in range(3, 12)])
    line, curve = fit_log(log).fits
    assert line.beta_us_per_byte > 0 and math.isfinite(line.busbw_gbps)
    assert curve.gmae < 0.01


@pytest.mark.parametrize("name", sorted(p.name for p in FIXTURES.iterdir()))
def test_fixture_logs_fit(name: str):
    line, curve = fit_log(load_log(FIXTURES / name)).fits
    assert curve.gmae <= 0.05 and line.gmae <= 0.10


def test_params_name_the_figures(fitted: dict[str, LogFits]):
    line, curve = fitted["H100-8gpu-p5_all_reduce_awsome.txt"].fits
    assert isinstance(line, AlphaBetaFit) and isinstance(curve, PiecewiseFit)
    assert (line.model, curve.model) == ("alpha-beta", "piecewise")
    assert set(line.params()) == {"alpha_us", "beta_us_per_byte", "algbw_gbps", "busbw_gbps",
                                  "latency_max_bytes", "bandwidth_min_bytes"}
    assert set(curve.params()) == {"alpha_us", "busbw_gbps", "min_bytes", "latency_exponent",
                                   "knee_bytes", "saturation_bytes", "center_bytes",
                                   "steepness"}


def test_plot_png_and_svg(fitted: dict[str, LogFits], tmp_path: Path):
    items = [fitted["V100-8gpu-dgx1topo_all_reduce_konnase.txt"],
             fitted["A100-8gpu_alltoall_superbench.txt"]]
    fig = plot_fits(items)
    assert len(fig.axes) == 4
    save_figure(fig, tmp_path / "fit.png")
    save_figure(fig, tmp_path / "fit.SVG")
    assert (tmp_path / "fit.png").read_bytes().startswith(b"\x89PNG")
    assert b"<svg" in (tmp_path / "fit.SVG").read_bytes()[:1000]
    buffer = io.BytesIO()
    save_figure(plot_fits(items[0]), buffer, format="png")
    assert buffer.getvalue().startswith(b"\x89PNG")
    with pytest.raises(UnknownNameError, match="figure format 'jpg'"):
        save_figure(fig, tmp_path / "fit.jpg")
    with pytest.raises(UnknownNameError, match="give format="):
        save_figure(fig, io.BytesIO())


def test_long_sweeps_stay_fast():
    """A step-bytes sweep of 512 sizes tries 48 of them as knees: quick, and still accurate."""
    sizes = list(range(1 << 20, 1 << 30, 1 << 21))
    log = _synthetic(25.0, 200.0, sizes=sizes)
    curve = fit_piecewise(log, heldout=False)
    assert curve.gmae < 0.01
    assert curve.knee_bytes in sizes and curve.saturation_bytes in sizes
