"""Synthesis: solve one instance, the least-steps algorithm, or the Pareto front.

Every algorithm returned here has been replayed and verified.
"""

from collsynth.encoding.backend import Status
from collsynth.synthesis.instance import solve_instance
from collsynth.synthesis.result import STOP_CAUSES, ScheduleResult, SolveOptions, SynthesisResult
from collsynth.synthesis.strategies import (ParetoFront, SweepLog, pareto_front, prune_dominated,
                                            solve_least_steps)

__all__ = ["Status", "SolveOptions", "SynthesisResult", "ScheduleResult", "SweepLog",
           "ParetoFront", "STOP_CAUSES", "solve_instance", "solve_least_steps", "pareto_front",
           "prune_dominated"]
