"""Plans: which algorithm each traced collective should run, and the files to make it so.

``collsynth plan TRACE_DIR --topology NAME -o PLAN_DIR`` in library form::

    plan = make_plan("trace/", resolve_topology("dgx1"), options=PlanOptions(runtime="msccl"))
    write_plan(plan, "plan/")

* :mod:`collsynth.plan.calls` reads the trace (one adapter over :mod:`collsynth.trace`);
* :mod:`collsynth.plan.groups` turns a process group into the topology it runs on;
* :mod:`collsynth.plan.choose` gathers candidates (synthesized, cached by
  :mod:`collsynth.plan.cache`, and NCCL's) and splits the sizes into ranges;
* :mod:`collsynth.plan.planner` makes the plan and predicts every call's time;
* :mod:`collsynth.plan.writer` writes ``xml/``, ``plan.json``, ``report.md`` and ``plots/``
  (:mod:`collsynth.plan.report`), all or nothing, with the environment each runtime needs
  (:mod:`collsynth.plan.environment`).
"""

from collsynth.plan.buckets import StepStructure, find_steps, size_bucket
from collsynth.plan.cache import FrontCache, default_cache_directory
from collsynth.plan.calls import TracedCall, TracedRun, load_calls
from collsynth.plan.choose import (
    NCCL,
    Candidate,
    Line,
    SizeRange,
    SynthOptions,
    choose_ranges,
    synthesize_front,
)
from collsynth.plan.environment import EnvVar, runtime_environment
from collsynth.plan.groups import induced_topology, topology_fingerprint, topology_for_group
from collsynth.plan.yardstick import runtime_candidates
from collsynth.plan.planner import (
    PLANNED_KINDS,
    Plan,
    PlanEntry,
    PlanOptions,
    make_plan,
    plan_calls,
)
from collsynth.plan.writer import check_xml_file, plan_to_json, write_plan

__all__ = [
    "NCCL", "PLANNED_KINDS", "Candidate", "EnvVar", "FrontCache", "Line", "Plan", "PlanEntry",
    "PlanOptions", "SizeRange", "StepStructure", "SynthOptions", "TracedCall", "TracedRun",
    "check_xml_file", "choose_ranges", "default_cache_directory", "find_steps",
    "induced_topology", "load_calls", "make_plan", "plan_calls",
    "plan_to_json", "runtime_candidates", "runtime_environment", "size_bucket", "synthesize_front",
    "topology_fingerprint", "topology_for_group", "write_plan",
]
