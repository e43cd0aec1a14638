"""Run synthesized algorithms for real with torch.distributed, and prove them against torch.

* :func:`run` executes an :class:`~collsynth.algorithm.Algorithm` on this rank's tensors, laid
  out as torch's collective of the same name lays them out (:mod:`collsynth.executor.executor`);
  :func:`prepare` plans it once for repeated calls.
* :func:`run_program` interprets an MSCCL XML program (:mod:`collsynth.executor.program`);
  :func:`execute_plan` replays an MSCCL++ plan (:mod:`collsynth.executor.mscclpp_plan`).
* :func:`launch` starts ``N`` local processes in one process group and collects their results
  (:mod:`collsynth.executor.launch`).
* :func:`run_case` / :func:`run_cases` check a run against torch's own collective and time both
  (:mod:`collsynth.executor.compare`).

PyTorch is optional for collsynth; it is imported when these functions are called.
"""

from collsynth.executor._common import (
    DEFAULT_TIMEOUT_S,
    REDUCE_OPS,
    BackendUnavailableError,
    ExecutionError,
    ExecutionTimeoutError,
    InvalidBufferError,
    UnrunnableProgramError,
)
from collsynth.executor.compare import Case, CaseResult, Timing, run_case, run_cases
from collsynth.executor.executor import PreparedRun, prepare, run
from collsynth.executor.launch import LaunchError, RankFailure, launch
from collsynth.executor.mscclpp_plan import PreparedPlan, execute_plan, prepare_plan
from collsynth.executor.program import PreparedProgram, prepare_program, run_program, schedule

__all__ = [
    "run",
    "prepare",
    "PreparedRun",
    "run_program",
    "prepare_program",
    "PreparedProgram",
    "schedule",
    "execute_plan",
    "prepare_plan",
    "PreparedPlan",
    "launch",
    "LaunchError",
    "RankFailure",
    "Case",
    "CaseResult",
    "Timing",
    "run_case",
    "run_cases",
    "REDUCE_OPS",
    "DEFAULT_TIMEOUT_S",
    "ExecutionError",
    "ExecutionTimeoutError",
    "InvalidBufferError",
    "BackendUnavailableError",
    "UnrunnableProgramError",
]
