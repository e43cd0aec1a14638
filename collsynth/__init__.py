"""collsynth: synthesize, bound, verify and export collective communication algorithms.

The public API is re-exported here; submodules whose names start with ``_`` are private.

>>> import collsynth
>>> dgx1 = collsynth.get_topology("dgx1")
>>> ag = collsynth.standard_collective("allgather", dgx1.num_ranks)
>>> [(r.instance.steps, str(r.rounds_per_chunk)) for r in collsynth.pareto_front(dgx1, ag)]
[(2, '3/2'), (3, '7/6')]
"""

from collsynth.algorithm import (
    Algorithm,
    Instance,
    Send,
    Step,
    find_problems,
    format_algorithm,
    load_algorithm,
    save_algorithm,
    verify,
)
from collsynth.bounds import Bounds, compute_bounds
from collsynth.collective import Collective, standard_collective
from collsynth.errors import (
    CollsynthError,
    ExportError,
    FileFormatError,
    InputTooLargeError,
    InvalidCollectiveError,
    InvalidInstanceError,
    InvalidTopologyError,
    SolverError,
    UnimplementableError,
    UnknownNameError,
    VerificationError,
)
from collsynth.synthesis import (
    ScheduleResult,
    SolveOptions,
    Status,
    SweepLog,
    SynthesisResult,
    pareto_front,
    solve_instance,
    solve_least_steps,
)
from collsynth.topology import BandwidthGroup, Topology, compose_nodes, get_topology, list_topologies

__version__ = "0.1.0"

__all__ = [
    "Algorithm",
    "Instance",
    "Send",
    "Step",
    "verify",
    "find_problems",
    "format_algorithm",
    "load_algorithm",
    "save_algorithm",
    "Bounds",
    "compute_bounds",
    "SolveOptions",
    "Status",
    "SweepLog",
    "SynthesisResult",
    "ScheduleResult",
    "pareto_front",
    "solve_instance",
    "solve_least_steps",
    "optimal_throughput",
    "solve_bandwidth_optimal",
    "solve_large",
    "export_algorithm",
    "check_program",
    "draw_file",
    "compose_nodes",
    "Collective",
    "standard_collective",
    "Topology",
    "BandwidthGroup",
    "get_topology",
    "list_topologies",
    "CollsynthError",
    "ExportError",
    "FileFormatError",
    "InputTooLargeError",
    "InvalidCollectiveError",
    "InvalidInstanceError",
    "InvalidTopologyError",
    "SolverError",
    "UnimplementableError",
    "UnknownNameError",
    "VerificationError",
]


#: Imported on first use: the large-system engines pull in scipy's MIP solver, export and
#: drawing lxml and matplotlib; the CLI's other commands should not pay for them at start-up.
_LAZY = {
    "optimal_throughput": "collsynth.bounds.throughput",
    "export_algorithm": "collsynth.export.pipeline",
    "check_program": "collsynth.export.check",
    "draw_file": "collsynth.draw",
    "solve_bandwidth_optimal": "collsynth.synthesis.bandwidth_optimal",
    "solve_large": "collsynth.synthesis.large",
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'collsynth' has no attribute {name!r}")
