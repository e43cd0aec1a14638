"""MSCCL++ execution plans: read, check, write, and lower collsynth algorithms to them.

``read_plan`` parses a plan file safely; ``check_plan`` runs it symbolically and proves (or
refutes) the collective; ``lower_to_plan`` turns a verified algorithm into a checked plan;
``write_plan`` writes one atomically, checked first. The format and its semantics:
``docs/mscclpp.md``.
"""

from collsynth.export.mscclpp.checker import (PROBLEM_KINDS, WARNING_KINDS, PlanReport,
                                              check_plan)
from collsynth.export.mscclpp.limits import MSCCLPP, MscclppLimits
from collsynth.export.mscclpp.model import Plan
from collsynth.export.mscclpp.reader import looks_like_plan, parse_plan, read_plan
from collsynth.export.mscclpp.writer import plan_to_json, write_plan

__all__ = ["Plan", "read_plan", "parse_plan", "looks_like_plan", "check_plan", "PlanReport",
           "PROBLEM_KINDS", "WARNING_KINDS", "plan_to_json", "write_plan", "MSCCLPP",
           "MscclppLimits"]
