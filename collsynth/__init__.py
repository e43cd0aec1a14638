"""collsynth: synthesize, bound, verify and export collective communication algorithms.

The public API is re-exported here; submodules whose names start with ``_`` are private.
"""

from collsynth.algorithm import Algorithm, Instance, Send, Step, find_problems, format_algorithm, verify
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
from collsynth.topology import BandwidthGroup, Topology, get_topology, list_topologies

__version__ = "0.1.0"

__all__ = [
    "Algorithm",
    "Instance",
    "Send",
    "Step",
    "verify",
    "find_problems",
    "format_algorithm",
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
