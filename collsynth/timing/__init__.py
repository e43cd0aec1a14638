"""Timing models: what an algorithm costs in microseconds on real hardware.

Synthesis works in exact, unitless quantities (steps, rounds per chunk). This package turns them
into time with the physical figures of a topology (``alpha_us``, ``unit_gbps``):

* :mod:`~collsynth.timing.alphabeta`: the alpha-beta value and nccl-tests size conventions;
* :mod:`~collsynth.timing.model`: the closed form as a sympy expression, exact crossovers;
* :mod:`~collsynth.timing.simulate`: step-by-step simulation with link and group contention;
* :mod:`~collsynth.timing.nccl`: NCCL's own ring/tree cost model, algbw and busbw;
* :mod:`~collsynth.timing.kernels`: memory-bound kernel predictors (gamma), GEMM, embedding bags;
* :mod:`~collsynth.timing.logs`, :mod:`~collsynth.timing.fit`, :mod:`~collsynth.timing.calibration`:
  nccl-tests and PARAM log readers, alpha-beta and piecewise fits, calibration files.
"""

from collsynth.collective.kinds import base_chunk_bytes
from collsynth.timing.alphabeta import (
    AlphaBeta,
    algorithm_time_us,
    crossover_bytes,
    from_topology,
    instance_time_us,
)

__all__ = [
    "AlphaBeta",
    "from_topology",
    "base_chunk_bytes",
    "instance_time_us",
    "algorithm_time_us",
    "crossover_bytes",
]

# Benchmark logs, their fits and calibration files (see those modules).
from collsynth.timing.calibration import (  # noqa: E402
    Calibration,
    CalibrationEntry,
    calibration_from_fits,
    load_calibration,
    save_calibration,
)
from collsynth.timing.fit import (  # noqa: E402
    AlphaBetaFit,
    FitOptions,
    LogFits,
    PiecewiseFit,
    fit_alpha_beta,
    fit_log,
    fit_piecewise,
    plot_fits,
    save_figure,
)
from collsynth.timing.logs import BenchmarkLog, BenchmarkRow, load_log, parse_log  # noqa: E402
from collsynth.timing.metrics import algbw_gbps, busbw_gbps, gmae  # noqa: E402

__all__ += [
    "BenchmarkLog",
    "BenchmarkRow",
    "load_log",
    "parse_log",
    "AlphaBetaFit",
    "PiecewiseFit",
    "LogFits",
    "FitOptions",
    "fit_alpha_beta",
    "fit_piecewise",
    "fit_log",
    "gmae",
    "algbw_gbps",
    "busbw_gbps",
    "plot_fits",
    "save_figure",
    "Calibration",
    "CalibrationEntry",
    "calibration_from_fits",
    "load_calibration",
    "save_calibration",
]
