"""Lower bounds on the steps and the rounds per chunk of any algorithm for a collective.

:mod:`~collsynth.bounds.core` holds the hop-distance, linear-program, arborescence and cut bounds
for any topology; :mod:`~collsynth.bounds.throughput` the exact optimal throughput from cuts of a
sparse switch fabric, used above 128 ranks. The graph algorithms both rely on live in
:mod:`collsynth.graph`. See docs/bounds.md for what each bound holds for.

>>> from collsynth.topology import get_topology
>>> from collsynth.collective import standard_collective
>>> compute_bounds(get_topology("ring:4"), standard_collective("allgather", 4)).rounds_per_chunk
Fraction(3, 2)
"""

from collsynth.bounds.core import (
    MAX_LP_VARIABLES,
    Bounds,
    check_implementable,
    compute_bounds,
    rounds_per_chunk_lower_bound,
    steps_lower_bound,
)
from collsynth.bounds.throughput import Throughput, optimal_throughput

__all__ = [
    "Bounds",
    "check_implementable",
    "steps_lower_bound",
    "rounds_per_chunk_lower_bound",
    "compute_bounds",
    "MAX_LP_VARIABLES",
    "Throughput",
    "optimal_throughput",
]
