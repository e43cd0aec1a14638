"""The fits against the real nccl-tests logs in data/nccl-tests: GMAE thresholds, bounds and plots."""

from __future__ import annotations

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
FIXTURES = ROOT / "tests" / "fixtures" / "logs"

#: The target: the piecewise model within 5% (GMAE over the sweep) on every shared log.
PIECEWISE_MAX = 0.05
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
}


@pytest.fixture(scope="module")
def fitted() -> dict[str, LogFits]:
    if not SHARED.is_dir():
        pytest.fail(f"{SHARED} is missing: the tests read the repository's data/nccl-tests")
    return {p.name: fit_log(load_log(p)) for p in sorted(SHARED.glob("*.txt"))}


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
    assert math.isclose(line.busbw_gbps, line.algbw_gbps * log.busbw_factor)
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
    below = curve.knee_bytes // 4
    assert float(curve.time_us(below)) == pytest.approx(curve.alpha_us)
    assert float(curve.busbw_at(curve.saturation_bytes * 2)) == pytest.approx(curve.busbw_gbps)
    middle = math.sqrt(curve.knee_bytes * curve.saturation_bytes)
    assert curve.sigmoid_low_gbps < float(curve.busbw_at(middle)) < curve.sigmoid_high_gbps


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
    assert set(curve.params()) == {"alpha_us", "busbw_gbps", "knee_bytes", "saturation_bytes",
                                   "sigmoid_low_gbps", "sigmoid_high_gbps", "center_bytes",
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
    curve = fit_piecewise(log)
    assert curve.gmae < 0.01
    assert curve.knee_bytes in sizes and curve.saturation_bytes in sizes
