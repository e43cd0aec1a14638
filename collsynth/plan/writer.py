"""Write a plan directory, all or nothing.

The details: ``docs/plan.md``, section "The plan directory".
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import uuid
from pathlib import Path
from typing import Any, Mapping

from collsynth._output import check_folder_writable, check_output_dir, write_text_atomic
from collsynth.errors import CollsynthError, ExportError
from collsynth.plan.choose import NCCL
from collsynth.plan.environment import runtime_environment
from collsynth.plan.planner import Plan, PlanEntry
from collsynth.plan.report import draw_plot, plot_name, render_report

__all__ = ["write_plan", "check_plan_directory", "plan_to_json", "check_xml_file", "PLAN_FORMAT",
           "PLAN_VERSION"]

_log = logging.getLogger(__name__)

PLAN_FORMAT = "collsynth-plan"
PLAN_VERSION = 1


def check_xml_file(path: str | os.PathLike[str], *, runtime: str, collective: str,
                   root: int | None) -> None:
    """Check a written XML file as ``collsynth check --runtime RUNTIME --strict`` would.

    Raises
    ------
    ExportError
        Naming the file and its first problems.
    """
    from collsynth.export.check import check_program
    from collsynth.export.xml_reader import read_checked, read_text

    text = read_text(path)
    program, problems = read_checked(text, runtime)
    if program is not None:
        report = check_program(program, runtime=runtime, collective=collective, root=root,
                               strict=True)
        problems = list(problems) + list(report.problems)
    if program is None or problems:
        shown = "; ".join(str(p) for p in problems[:5]) or "unreadable"
        raise ExportError(f"{path}: fails the check for {runtime}: {shown}")


def _range_json(r: Any) -> dict[str, Any]:
    return {"min_bytes": r.min_bytes, "max_bytes": r.max_bytes, "fastest": r.winner,
            "choice": r.choice, "file": None if r.xml is None else f"xml/{r.xml}",
            "note": r.note or None, "variant": r.variant or None,
            "nchunksperloop": r.nchunksperloop}


def _entry_json(entry: PlanEntry, plots: Mapping[str, str]) -> dict[str, Any]:
    candidates = []
    for c in entry.candidates:
        line = c.line
        item: dict[str, Any] = {
            "name": c.name, "source": c.source, "detail": c.detail, "yardstick": c.yardstick,
            "intercept_us": None if line is None else float(line.intercept_us),
            "slope_us_per_byte": None if line is None else float(line.slope_us_per_byte),
            "intercept_us_exact": None if line is None else str(line.intercept_us),
            "slope_us_per_byte_exact": None if line is None else str(line.slope_us_per_byte),
            "samples": [{"size_bytes": s.size_bytes, "time_us": s.time_us,
                         "protocol": s.protocol, "variant": s.variant or None}
                        for s in c.samples],
            "excluded": entry.excluded.get(c.name),
        }
        if c.algorithm is not None:
            a = c.algorithm
            item["algorithm"] = {"steps": a.num_steps, "rounds": a.num_rounds,
                                 "chunks": a.chunks, "rounds_per_chunk": str(a.rounds_per_chunk),
                                 "nchunksperloop": entry.nchunks.get(c.name)}
        candidates.append(item)
    buckets = [{"from_bytes": b.bucket[0], "to_bytes": b.bucket[1], "calls": b.calls,
                "bytes": b.bytes, "nccl_us": b.nccl_us, "plan_us": b.plan_us,
                "saving_us": b.saving_us, "runs": list(b.choices), "fallback_calls": b.fallback,
                "measured_us": b.measured_us} for b in entry.buckets]
    modelled = [b for b in entry.buckets if b.saving_us is not None]
    return {
        "collective": entry.collective, "group": list(entry.group), "root": entry.root,
        "group_root": entry.local_root, "topology": entry.topology, "status": entry.status,
        "yardstick": entry.yardstick, "yardstick_note": entry.yardstick_note or None,
        "reason": entry.reason or None, "synthesis": entry.synthesis, "nccl": entry.nccl_note,
        "candidates": candidates, "ranges": [_range_json(r) for r in entry.ranges],
        "buckets": buckets,
        "totals": {"calls": sum(b.calls for b in entry.buckets),
                   "bytes": sum(b.bytes for b in entry.buckets),
                   "nccl_us": sum(b.nccl_us for b in modelled),  # type: ignore[misc]
                   "plan_us": sum(b.plan_us for b in modelled),  # type: ignore[misc]
                   "saving_us": sum(b.saving_us for b in modelled)},  # type: ignore[misc]
        "plot": plots.get(plot_name(entry)),
    }


def plan_to_json(plan: Plan, *, environment: Any = (), environment_notes: Any = (),
                 plots: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The machine-readable plan (the content of ``plan.json``).

    Sizes are bytes in the nccl-tests convention (what the runtimes compare ``minBytes`` and
    ``maxBytes`` with), ranges inclusive, ``max_bytes`` ``null`` for unbounded; times are
    microseconds. ``entries[].ranges`` cover every size once; a range whose ``choice`` is
    ``"nccl"`` has no file. ``plots`` maps :func:`~collsynth.plan.report.plot_name` to the
    PNG written (``entries[].plot``; ``null`` when none).
    """
    totals = plan.totals()
    return {
        "format": PLAN_FORMAT,
        "version": PLAN_VERSION,
        "trace": plan.trace_dir,
        "world_size": plan.world_size,
        "topology": plan.topology,
        "nodes": plan.nodes,
        "runtime": plan.runtime,
        "calibration": plan.calibration_file,
        "device": plan.device,
        "synth_time_limit_s": plan.synth_time_limit,
        "model": plan.model,
        "runtime_constants": plan.runtime_constants_file,
        "environment": [{"name": v.name, "value": v.value, "why": v.why, "source": v.source}
                        for v in environment],
        "environment_notes": list(environment_notes),
        "files": [{"file": f"xml/{x.name}", "collective": x.collective, "ngpus": x.ngpus,
                   "root": x.root, "nchunksperloop": x.nchunksperloop, "inplace": x.inplace,
                   "outofplace": x.outofplace} for x in plan.xml_files],
        "entries": [_entry_json(e, plots or {}) for e in plan.entries],
        "not_planned": [{"kind": n.kind, "group": list(n.group), "calls": n.calls,
                         "bytes": n.bytes, "reason": n.reason} for n in plan.not_planned],
        "steps": [{"rank": r.rank, "setup_calls": r.structure.setup,
                   "calls_per_step": r.calls_per_step, "steps": r.structure.steps,
                   "found": r.structure.found, "description": r.structure.describe(),
                   "nccl_us_per_step": r.nccl_us_per_step,
                   "plan_us_per_step": r.plan_us_per_step,
                   "saving_us_per_step": r.saving_us_per_step,
                   "measured_us_per_step": r.measured_us_per_step,
                   "unmodelled_calls_per_step": r.unmodelled_per_step} for r in plan.ranks],
        "totals": totals,
        "notes": list(plan.notes),
    }


def check_plan_directory(plan_dir: str | os.PathLike[str]) -> Path:
    """Check that :func:`write_plan` may write ``plan_dir``; return it as an absolute path.
    Cheap: the command line calls it before planning, so a refused path costs nothing.

    ``plan_dir`` must be a new name in a writable folder (that exists: it is not created), an
    empty folder, or a folder holding a plan; never a link or a file.

    Raises
    ------
    OutputPathError
        A link, file or other non-folder at ``plan_dir``; a missing or unwritable parent.
    ExportError
        A folder that is neither empty nor a plan (it would be replaced).
    """
    label = os.fspath(plan_dir)
    target = Path(plan_dir).absolute()
    # A folder, or nothing yet; no link (the swap would replace the link, not its folder).
    check_output_dir(plan_dir, create=False)
    # The new plan is built next to it and renamed into place.
    check_folder_writable(target.parent, label)
    if target.is_dir() and any(target.iterdir()) and not (target / "plan.json").is_file():
        raise ExportError(f"{target}: exists, is not empty and holds no plan.json; "
                          "refusing to replace it")
    return target


def write_plan(plan: Plan, plan_dir: str | os.PathLike[str], *, plots: bool = True) -> Path:
    """Write ``plan`` to ``plan_dir`` (docs/plan.md); return the directory.

    ``plots=False`` leaves ``plots/`` empty (drawing is the slow part of writing).

    Raises
    ------
    ExportError
        An XML file that fails the check, or a ``plan_dir`` that exists and is neither empty
        nor a plan (nothing is written then).
    OutputPathError
        A ``plan_dir`` refused by :func:`check_plan_directory`.
    OSError
        The directory cannot be written.
    """
    target = check_plan_directory(plan_dir)
    staging = _fresh_directory(target, "tmp")
    try:
        _write_into(plan, staging, target, plots)
        _swap(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target


def _write_into(plan: Plan, staging: Path, target: Path, plots: bool) -> None:
    xml_dir = staging / "xml"
    xml_dir.mkdir()
    for xml in plan.xml_files:
        path = xml_dir / xml.name
        write_text_atomic(path, xml.text)
        try:
            check_xml_file(path, runtime=plan.runtime, collective=xml.collective, root=xml.root)
        except CollsynthError as exc:
            raise ExportError(f"xml/{xml.name}: {exc}") from exc
    final_xml = target / "xml"
    environment, notes = runtime_environment(
        plan.runtime, xml_dir=str(final_xml),
        xml_paths=[str(final_xml / x.name) for x in plan.xml_files],
        collectives={x.collective for x in plan.xml_files})
    drawn: dict[str, str] = {}
    (staging / "plots").mkdir()
    if plots:
        by_file: dict[str, list[PlanEntry]] = {}
        for entry in plan.entries:
            if entry.candidates and entry.buckets:
                by_file.setdefault(plot_name(entry), []).append(entry)
        for name, entries in by_file.items():
            draw_plot(entries, staging / "plots" / name)
            drawn[name] = f"plots/{name}"
    obj = plan_to_json(plan, environment=environment, environment_notes=notes, plots=drawn)
    write_text_atomic(staging / "plan.json", json.dumps(obj, indent=1) + "\n")
    write_text_atomic(staging / "report.md", render_report(
        plan, environment=environment, environment_notes=notes, plots=drawn))
    # A file a plan names but that was not written would make the runtime's scan fail.
    for entry in plan.entries:
        for r in entry.ranges:
            if r.xml is not None and not (xml_dir / r.xml).is_file():
                raise ExportError(f"internal: range {r.min_bytes}..{r.max_bytes} of "
                                  f"{entry.collective} names xml/{r.xml}, which was not written")
            if r.xml is None and r.choice != NCCL:
                raise ExportError(f"internal: range {r.min_bytes}..{r.max_bytes} of "
                                  f"{entry.collective} runs {r.choice} without an XML file")


def _fresh_directory(target: Path, kind: str) -> Path:
    """A new empty directory next to ``target`` (created with the umask's permissions, unlike
    ``tempfile.mkdtemp``'s 0700, since it becomes the plan directory)."""
    while True:
        path = target.parent / f".{target.name}.{os.getpid()}.{uuid.uuid4().hex[:12]}.{kind}"
        try:
            path.mkdir()
        except FileExistsError:
            continue
        return path


def _swap(staging: Path, target: Path) -> None:
    """Put ``staging`` at ``target``, replacing an old plan there (renames only)."""
    old = None
    if target.exists():
        old = _fresh_directory(target, "old")
        old.rmdir()
        os.replace(target, old)
    try:
        os.replace(staging, target)
    except BaseException:
        if old is not None:
            os.replace(old, target)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
