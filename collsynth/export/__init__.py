"""Export to and check MSCCL XML: the program IR, lowering, writer, reader, checker.

``lower(algorithm, runtime=...)`` builds a :class:`Program`; ``write_program`` renders it in the
runtime's exact dialect; ``read_program`` parses any MSCCL XML safely; ``check_program`` executes a
program symbolically and reports every problem (deadlocks, races, uninitialised reads, send-buffer
writes, wrong results); ``find_limit_violations`` / ``estimate_limits`` say which runtime limit an
algorithm breaks and by how much. Each runtime's XML rules are in :mod:`collsynth.runtimes`.
"""

from collsynth.export.check import WARNING_KINDS, CheckReport, Problem, check_program
from collsynth.export.limits import LIMITS, LimitViolation, estimate_limits, find_limit_violations
from collsynth.export.lower import lower
from collsynth.export.program import GpuProgram, Program, ThreadBlock, XmlStep
from collsynth.export.xml_reader import read_program
from collsynth.export.xml_writer import write_program

__all__ = ["Program", "GpuProgram", "ThreadBlock", "XmlStep", "lower", "write_program",
           "read_program", "check_program", "CheckReport", "Problem", "WARNING_KINDS", "LIMITS", "LimitViolation", "estimate_limits", "find_limit_violations"]
