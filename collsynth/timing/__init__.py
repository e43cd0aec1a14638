"""Timing models: what an algorithm, a program or the runtime's own algorithm costs, in
microseconds, behind one pricing interface (:mod:`~collsynth.timing.pricing`).

* :mod:`~collsynth.timing.pricing`: subjects, :class:`Price`, the :class:`PricingModel`
  protocol, :func:`price_table`, :func:`fastest_runtime_algorithm`;
* models: :class:`ClosedForm` and :class:`Measured` (:mod:`~collsynth.timing.closed_form`, exact
  lines over :mod:`~collsynth.timing.model`), :class:`ProgramModel`
  (:mod:`~collsynth.timing.program_model`, over :mod:`~collsynth.timing.runtime_model`);
* the runtime's own algorithms: :mod:`~collsynth.timing.tuning_model` (NCCL's and RCCL's cost
  model and choices), :mod:`~collsynth.timing.rings`, :mod:`~collsynth.timing.runtime_baselines`;
* :mod:`~collsynth.timing.kernels`: memory-bound kernel predictors (gamma), GEMM, embedding bags;
* :mod:`~collsynth.timing.logs`, :mod:`~collsynth.timing.fit`, :mod:`~collsynth.timing.calibration`,
  :mod:`~collsynth.timing.runtime_fit`: benchmark logs, their fits and calibration files.
"""

from collsynth.collective.kinds import base_chunk_bytes
from collsynth.timing.alphabeta import AlphaBeta, from_topology
from collsynth.timing.calibration import (
    Calibration,
    CalibrationEntry,
    calibration_from_fits,
    load_calibration,
    save_calibration,
)
from collsynth.timing.closed_form import ClosedForm, Measured
from collsynth.timing.fit import (
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
from collsynth.timing.logs import BenchmarkLog, BenchmarkRow, load_log, parse_log
from collsynth.timing.metrics import algbw_gbps, busbw_gbps, gmae
from collsynth.timing.model import SIZE, crossover, lower_envelope, symbolic_time
from collsynth.timing.pricing import (
    MEASURED,
    LinearPricingModel,
    Price,
    PriceTable,
    PricingModel,
    RuntimeAlgorithm,
    fastest_runtime_algorithm,
    price_table,
    runtime_algorithms,
)
from collsynth.timing.program_model import ProgramModel, TuneOptions

__all__ = [
    # pricing
    "PricingModel",
    "LinearPricingModel",
    "Price",
    "PriceTable",
    "RuntimeAlgorithm",
    "MEASURED",
    "runtime_algorithms",
    "price_table",
    "fastest_runtime_algorithm",
    "ClosedForm",
    "Measured",
    "ProgramModel",
    "TuneOptions",
    # the closed form's pieces
    "AlphaBeta",
    "from_topology",
    "base_chunk_bytes",
    "SIZE",
    "symbolic_time",
    "crossover",
    "lower_envelope",
    # logs, fits, calibration
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
