"""Timing models: what an algorithm costs in microseconds on real hardware.

Synthesis works in exact, unitless quantities (steps, rounds per chunk). This package turns them
into time with the physical figures of a topology (``alpha_us``, ``unit_gbps``). For now it holds
the alpha-beta model (:mod:`collsynth.timing.alphabeta`); fuller models extend it with the same
pure functions over plain values.
"""

from collsynth.timing.alphabeta import (
    AlphaBeta,
    algorithm_time_us,
    base_chunk_bytes,
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
