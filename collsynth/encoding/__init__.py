"""Encodings of synthesis problems and the solver backends behind one small interface.

``get_backend("cpsat" | "z3" | "z3-path" | "auto")``: ``auto`` is CP-SAT when OR-Tools is
installed (it was fastest on every case of our benchmark suite) and z3 otherwise. ``z3`` runs the
time-expanded Boolean encoding, ``z3-path`` SCCL's path encoding with arrival times.
"""

from __future__ import annotations

from collsynth.encoding.backend import Backend, Outcome, Status
from collsynth.encoding.cpsat import CpSatBackend
from collsynth.encoding.problem import SchedulingProblem, build_problem, decode
from collsynth.encoding.z3 import Z3Backend
from collsynth.encoding.z3_path import Z3PathBackend
from collsynth.errors import SolverError, UnknownNameError

__all__ = ["Backend", "Outcome", "Status", "SchedulingProblem", "build_problem", "decode",
           "CpSatBackend", "Z3Backend", "Z3PathBackend", "BACKENDS", "get_backend"]

BACKENDS = {"cpsat": CpSatBackend, "z3": Z3Backend, "z3-path": Z3PathBackend}


def get_backend(name: str | Backend = "auto") -> Backend:
    """A backend by name (``auto``, ``cpsat``, ``z3``) or the backend object itself."""
    if not isinstance(name, str):
        return name
    key = name.strip().lower()
    if key == "auto":
        cpsat = CpSatBackend()
        return cpsat if cpsat.available() else Z3Backend()
    if key not in BACKENDS:
        raise UnknownNameError(f"unknown backend {name!r}; valid: auto, {', '.join(BACKENDS)}")
    backend = BACKENDS[key]()
    if not backend.available():
        raise SolverError(f"backend {key!r} is not installed")
    return backend
