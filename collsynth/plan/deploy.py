"""What a plan deploys besides its MSCCL XML: a tuner config per stock runtime asked for.

:func:`tuner_deployment` tunes NCCL's or RCCL's own choices for the traced sizes of the plan's
whole-communicator allreduce, allgather and reduce-scatter calls
(:func:`collsynth.export.tuner.machine.tune_machine`, priced by the program model) and renders
the CSV, read back with the runtime's own parse rules before it is kept. Which runtimes load
what, and how under PyTorch: the runtime registry (:mod:`collsynth.runtimes`), docs/plan.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from collsynth.errors import ExportError, InvalidTopologyError
from collsynth.runtimes import TUNER_CONFIG, Runtime

if TYPE_CHECKING:  # pragma: no cover - for annotations only
    from collsynth.plan.planner import Plan
    from collsynth.runtimes import RuntimeConstants
    from collsynth.topology.model import Topology

__all__ = ["Deployment", "tuner_deployment", "mscclpp_deployments", "check_tuner_machine", "TUNED_COLLECTIVES",
           "TUNER_FILES"]

#: The collectives a plan's tuner config tunes (those the program model has programs of).
TUNED_COLLECTIVES = ("allreduce", "allgather", "reduce_scatter")
#: Where in the plan directory each runtime's tuner config goes.
TUNER_FILES = {"nccl": "tuner/nccl_tuner.conf", "rccl": "tuner/rccl_tuner.csv"}


@dataclass(frozen=True)
class Deployment:
    """One file a plan writes for ``runtime``: ``path`` (relative to the plan directory),
    ``text``, the artifact ``kind`` (:data:`collsynth.runtimes.TUNER_CONFIG`...), ``versions``
    that load it and ``how`` PyTorch reaches it (from the registry), the environment
    ``variables`` (name, value with ``{path}`` for the file's absolute path, why) and ``summary``
    lines for the report."""

    runtime: str
    path: str
    text: str
    kind: str
    versions: str
    how: str
    variables: tuple[tuple[str, str, str], ...]
    summary: tuple[str, ...]


def _traced_sizes(plan: "Plan") -> dict[str, list[int]]:
    """Per tuned collective, the traced sizes of the calls over the whole communicator: each
    bucket's ends (a tuner row matches the communicator's node and rank counts only)."""
    found: dict[str, set[int]] = {}
    for entry in plan.entries:
        if entry.collective not in TUNED_COLLECTIVES or len(entry.group) != plan.world_size:
            continue
        for b in entry.buckets:
            if b.calls:
                found.setdefault(entry.collective, set()).update(
                    s for s in b.bucket if isinstance(s, int) and s >= 1)
    return {c: sorted(s) for c, s in found.items() if s}


def check_tuner_machine(topology: "Topology", runtime: str) -> None:
    """Refuse a topology whose machine does not run ``runtime`` (``nccl`` or ``rccl``).

    Raises
    ------
    InvalidTopologyError
        No known GPU architecture, or the other vendor's.
    """
    from collsynth.topology.machine import machine_facts

    facts = machine_facts(topology)
    if facts.runtime != runtime:
        what = f"{facts.arch} GPUs, which run {facts.runtime}" if facts.runtime else \
            "no known GPU architecture (metadata.machine.arch)"
        raise InvalidTopologyError(f"topology {topology.name!r}: a {runtime} tuner config "
                                   f"needs a machine that runs {runtime}; it has {what}")


def tuner_deployment(plan: "Plan", topology: "Topology", runtime: Runtime, *,
                     constants: "RuntimeConstants | None" = None,
                     source: str = "") -> Deployment:
    """The tuner config for ``runtime`` (``nccl`` or ``rccl``) of the plan's traced calls.

    Raises
    ------
    InvalidTopologyError
        The topology's machine does not run ``runtime`` (no GPU architecture, or the other
        vendor's).
    ExportError
        No traced allreduce, allgather or reduce-scatter over the whole communicator, or a
        config that does not read back to its rules.
    """
    from collsynth.export.tuner.config import parse_tuner_config, render_tuner_config
    from collsynth.export.tuner.machine import ProgramModelPrice, tune_machine
    from collsynth.timing.tuning_model import tuning_setup

    artifact = next((a for a in runtime.artifacts if a.kind == TUNER_CONFIG), None)
    if artifact is None or runtime.name not in TUNER_FILES:
        raise ExportError(f"runtime {runtime.name!r} loads no tuner config")
    check_tuner_machine(topology, runtime.name)
    sizes = _traced_sizes(plan)
    if not sizes:
        raise ExportError(f"--runtime {runtime.name}: the trace has no allreduce, allgather or "
                          f"reduce-scatter over all {plan.world_size} ranks to tune")
    setup = tuning_setup(topology, runtime=runtime.name, settings=runtime.settings)
    price = ProgramModelPrice(topology, constants=constants, source=source)
    every = sorted({s for found in sizes.values() for s in found})
    tuned = tune_machine(setup, list(sizes), every, price=price)
    header = tuned.summary_lines(topology.name)
    text = render_tuner_config(tuned.rules, runtime=runtime.name, header=header)
    parsed = parse_tuner_config(text.encode("ascii"), runtime=runtime.name)
    if parsed.rules != tuned.rules or parsed.notes:
        raise ExportError(f"{TUNER_FILES[runtime.name]}: does not read back to its rules "
                          f"under {runtime.name}'s parse rules")
    variables = [("NCCL_TUNER_CONFIG_FILE", "{path}", "the tuner config to read")]
    if runtime.name == "nccl":
        variables.insert(0, ("NCCL_TUNER_PLUGIN", "/path/to/libnccl-tuner-example.so",
                             "NCCL's example tuner plugin (plugins/tuner/example, built from "
                             "NCCL 2.30.3 or newer), which reads the file"))
    gains = sum(len(c.tuning.gains) for c in tuned.collectives)
    summary = (f"{len(tuned.rules)} rule(s) for nNodes={setup.nodes} nRanks={setup.ranks}; "
               f"{gains} size range(s) forced where {tuned.prices} predicts more than "
               f"{tuned.threshold:.0%} over {runtime.name}'s own choice",) + \
        tuple(line.strip() for line in header[3:3 + gains])
    return Deployment(runtime.name, TUNER_FILES[runtime.name], text, TUNER_CONFIG,
                      artifact.versions, artifact.how, tuple(variables), summary)


def mscclpp_deployments(plan: "Plan") -> tuple[Deployment, ...]:
    """MSCCL++ execution plans of the plan's chosen algorithms: one per XML file the plan
    writes (the same algorithm and size range), lowered by the MSCCL++ exporter, read back and
    proved by the plan checker before it is kept; at ``mscclpp/<name>.json``.

    Raises
    ------
    ExportError
        A chosen algorithm MSCCL++ has no plan for, or a plan that fails the checker.
    """
    from collsynth.export.mscclpp.checker import check_plan
    from collsynth.export.mscclpp.lower import lower_to_plan
    from collsynth.export.mscclpp.reader import parse_plan
    from collsynth.export.mscclpp.writer import plan_to_json
    from collsynth.runtimes import MSCCLPP_PLAN, get_runtime

    artifact = next(a for a in get_runtime("mscclpp").artifacts if a.kind == MSCCLPP_PLAN)
    found: dict[str, Deployment] = {}
    for entry in plan.entries:
        for r in entry.ranges:
            if r.xml is None:
                continue
            name = "mscclpp/" + r.xml.rsplit(".", 1)[0] + ".json"
            candidate = entry.candidate(r.choice)
            if name in found or candidate is None or candidate.algorithm is None:
                continue
            lowered = lower_to_plan(candidate.algorithm, min_message_size=r.min_bytes,
                                    max_message_size=r.max_bytes, name=r.choice)
            text = plan_to_json(lowered, indent=1) + "\n"
            report = check_plan(parse_plan(text, source=name), strict=True)
            if not report.ok:
                shown = "; ".join(str(p) for p in report.problems[:3])
                raise ExportError(f"{name}: fails the plan checker: {shown}")
            top = "max" if r.max_bytes is None else str(r.max_bytes)
            found[name] = Deployment(
                "mscclpp", name, text, MSCCLPP_PLAN, artifact.versions, artifact.how,
                (("LD_PRELOAD", "/path/to/mscclpp/build/lib/libmscclpp_nccl.so",
                  "MSCCL++'s NCCL shim: registered plans first, then its kernels, then NCCL"),
                 ("MSCCLPP_NCCL_LIB_PATH", "/path/to/libnccl.so.2",
                  "the real NCCL or RCCL the shim falls back to")),
                (f"{entry.collective} over ranks {list(entry.group)}, {r.min_bytes}..{top} B: "
                 f"{r.choice} (checked); register it with mscclpp.Algorithm(execution_plan="
                 f"ExecutionPlan('{{path}}', rank)) before the process group is created "
                 "(docs/mscclpp.md)",))
    return tuple(found.values())
