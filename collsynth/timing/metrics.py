"""Figures every timing result reports, defined once: nccl-tests' algbw and busbw, and gmae.

``algbw = size_bytes / time`` and ``busbw = algbw x busbw_factor`` (the factor of the
collective's kind, :func:`collsynth.collective.kinds.busbw_factor`); the geometric-mean
absolute error ``gmae`` scores a fit or a prediction against measurements.
"""

from __future__ import annotations

import math
from numbers import Real
from typing import Sequence

import numpy as np

from collsynth.collective.kinds import busbw_factor
from collsynth.errors import InvalidInstanceError, UnknownNameError

__all__ = ["algbw_gbps", "busbw_gbps", "bandwidths", "gmae"]


def algbw_gbps(size_bytes: Real, time_us: Real) -> float:
    """nccl-tests' algorithm bandwidth: ``size_bytes / time``, in GB/s (10**9 bytes/s).

    >>> algbw_gbps(10**9, 10**4)
    100.0
    """
    if not time_us > 0:
        raise InvalidInstanceError(f"time_us = {time_us!r}; expected a positive number")
    return float(size_bytes) / (float(time_us) * 1e3)


def busbw_gbps(collective: str, num_ranks: int, size_bytes: Real, time_us: Real) -> float:
    """nccl-tests' bus bandwidth: ``algbw * busbw_factor`` (GB/s).

    Raises
    ------
    UnknownNameError
        A collective without a bus-bandwidth convention.

    >>> busbw_gbps("allreduce", 8, 10**9, 10**4)
    175.0
    """
    return algbw_gbps(size_bytes, time_us) * float(busbw_factor(collective, num_ranks))


def bandwidths(collective: str, num_ranks: int, size_bytes: Real, time_us: float
               ) -> tuple[float, float]:
    """``(algbw_gbps, busbw_gbps)`` of a priced time: 0 for a time that is not positive and
    finite, busbw = algbw for a collective without a bus-bandwidth convention (a custom one).

    >>> bandwidths("allgather", 8, 10**9, 10**4), bandwidths("custom", 8, 10**9, 10**4)
    ((100.0, 87.5), (100.0, 100.0))
    """
    if not (time_us > 0 and math.isfinite(time_us)):
        return 0.0, 0.0
    algbw = algbw_gbps(size_bytes, time_us)
    try:
        return algbw, algbw * float(busbw_factor(collective, num_ranks))
    except UnknownNameError:
        return algbw, algbw


def gmae(predicted: Sequence[float] | np.ndarray, measured: Sequence[float] | np.ndarray
         ) -> float:
    """The geometric-mean absolute error ``exp(mean(|log(predicted / measured)|)) - 1``.

    >>> round(gmae([110.0, 100.0], [100.0, 110.0]), 4)
    0.1
    """
    p = np.asarray(predicted, dtype=float)
    m = np.asarray(measured, dtype=float)
    return float(np.expm1(np.mean(np.abs(np.log(p / m)))))
