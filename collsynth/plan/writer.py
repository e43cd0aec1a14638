"""Write a plan directory, all or nothing.

The details: ``docs/plan.md``, section "The plan directory".
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import stat
import uuid
from pathlib import Path, PurePosixPath
from typing import Any, Mapping, Sequence

from collsynth._output import (check_folder_writable, check_output_dir, shown_as,
                              write_text_atomic)
from collsynth.errors import CollsynthError, ExportError, FileFormatError, InputTooLargeError
from collsynth.plan.choose import NCCL
from collsynth.runtimes import get_runtime
from collsynth.plan.environment import runtime_environment
from collsynth.plan.planner import Plan, PlanEntry
from collsynth.plan.report import draw_plot, plot_name, render_report

__all__ = ["write_plan", "check_plan_directory", "plan_to_json", "check_xml_file", "PLAN_FORMAT",
           "PLAN_VERSION", "MANIFEST_NAME"]

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


#: The plan directory's list of what its run wrote (docs/plan.md, "The plan directory").
MANIFEST_NAME = "manifest.json"
MANIFEST_FORMAT = "collsynth-plan-manifest"
_MAX_MANIFEST_BYTES = 4 << 20


def _relative(name: Any) -> PurePosixPath | None:
    """``name`` as a plain relative path inside the plan (``None``: not one)."""
    if not isinstance(name, str) or not name or "\\" in name or "\0" in name:
        return None
    path = PurePosixPath(name)
    if path.is_absolute() or any(part in ("", ".", "..") for part in name.split("/")):
        return None
    return path


def _listed(target: Path) -> tuple[set[PurePosixPath], set[PurePosixPath]] | None:
    """The files and folders an earlier plan in ``target`` listed as its own: from its
    manifest, or (a plan written before manifests) from a ``plan.json`` of our format, which
    names its XML files and plots. ``None``: neither, so nothing in ``target`` is ours."""
    from collsynth._parse import read_json

    try:
        manifest = read_json(target / MANIFEST_NAME, max_bytes=_MAX_MANIFEST_BYTES)
    except (FileFormatError, InputTooLargeError):  # no manifest, or not one of ours
        manifest = None
    if isinstance(manifest, dict) and manifest.get("format") == MANIFEST_FORMAT and \
            manifest.get("version") == 1:
        files = [_relative(n) for n in manifest.get("files", ())]
        folders = [_relative(n) for n in manifest.get("folders", ())]
        if None in files or None in folders or not isinstance(manifest.get("files"), list) \
                or not isinstance(manifest.get("folders"), list):
            return None
        return set(files) | {PurePosixPath(MANIFEST_NAME)}, set(folders)
    try:
        old = read_json(target / "plan.json", max_bytes=_MAX_MANIFEST_BYTES << 4)
    except (FileFormatError, InputTooLargeError):  # no plan.json, or not one of ours
        return None
    if not isinstance(old, dict) or old.get("format") != PLAN_FORMAT:
        return None
    names = ["plan.json", "report.md"]
    names += [f.get("file") for f in old.get("files") or () if isinstance(f, dict)]
    names += [e.get("plot") for e in old.get("entries") or ()
              if isinstance(e, dict) and e.get("plot") is not None]
    files = {_relative(n) for n in names}
    if None in files:
        return None
    return files, {PurePosixPath("xml"), PurePosixPath("plots")}


def _foreign(target: Path, files: set[PurePosixPath],
             folders: set[PurePosixPath]) -> list[str]:
    """What ``target`` holds that is neither a listed regular file nor a listed folder."""
    found = []
    for root, dirs, names in os.walk(target):
        here = Path(root)
        rel = here.relative_to(target)
        kept = []
        for name in sorted(dirs):
            path = PurePosixPath((rel / name).as_posix())
            if path in folders and not (here / name).is_symlink():
                kept.append(name)
            else:
                found.append(f"{path}/")
        dirs[:] = kept
        for name in sorted(names):
            path = PurePosixPath((rel / name).as_posix())
            if path not in files or not stat.S_ISREG(os.lstat(here / name).st_mode):
                found.append(str(path))
    return found


def check_plan_directory(plan_dir: str | os.PathLike[str]) -> Path:
    """Check that :func:`write_plan` may write ``plan_dir``; return it as an absolute path.
    Cheap: the command line calls it before planning, so a refused path costs nothing.

    ``plan_dir`` must be a new name in a writable folder (that exists: it is not created), an
    empty folder, or a folder holding an earlier plan and nothing else: only the files that
    plan's manifest lists (``manifest.json``) are replaced. A folder holding anything else
    (a ``plan.json`` that is not ours, a file the manifest does not list) is refused, and
    nothing in it is touched.

    Raises
    ------
    OutputPathError
        A link, file or other non-folder at ``plan_dir``; a missing or unwritable parent.
    ExportError
        A folder that is neither empty nor only an earlier plan (naming what is foreign).
    """
    label = os.fspath(plan_dir)
    target = Path(plan_dir).absolute()
    # A folder, or nothing yet; no link (the swap would replace the link, not its folder).
    check_output_dir(plan_dir, create=False)
    # The new plan is built next to it and renamed into place.
    check_folder_writable(target.parent, label)
    _owned(target)
    return target


def _owned(target: Path) -> tuple[set[PurePosixPath], set[PurePosixPath]]:
    """What of ``target`` an earlier plan owns (empty for a missing or empty folder).

    Raises
    ------
    ExportError
        ``target`` holds anything no earlier plan listed.
    """
    if not target.is_dir() or not any(target.iterdir()):
        return set(), set()
    listed = _listed(target)
    if listed is None:
        raise ExportError(f"{target}: exists, is not empty and holds no plan manifest "
                          f"({MANIFEST_NAME}) of an earlier collsynth plan; refusing to replace "
                          "it (give -o a new or empty folder)")
    foreign = _foreign(target, *listed)
    if foreign:
        more = f" and {len(foreign) - 3} more" if len(foreign) > 3 else ""
        raise ExportError(f"{target}: holds {', '.join(foreign[:3])}{more}, which the earlier "
                          f"plan there did not write ({MANIFEST_NAME}); refusing to replace it "
                          "(move them, or give -o a new or empty folder)")
    return listed


def write_plan(plan: Plan, plan_dir: str | os.PathLike[str], *, plots: bool = True,
               deployments: Sequence[Any] = ()) -> Path:
    """Write ``plan`` to ``plan_dir`` (docs/plan.md); return the directory.

    ``plots=False`` leaves ``plots/`` empty (drawing is the slow part of writing).
    ``deployments`` (:class:`collsynth.plan.deploy.Deployment`) are written too, each at its
    path, and named in ``plan.json`` and ``report.md`` with the versions that load them.

    Raises
    ------
    ExportError
        An XML file that fails the check, or a ``plan_dir`` that exists and is neither empty
        nor only an earlier plan (nothing is written then).
    OutputPathError
        A ``plan_dir`` refused by :func:`check_plan_directory`.
    OSError
        The directory cannot be written.
    """
    target = check_plan_directory(plan_dir)
    staging = _fresh_directory(target, "tmp")
    try:
        with shown_as(staging, target):   # a full disk names target/..., not the hidden folder
            _write_into(plan, staging, target, plots, tuple(deployments))
            _write_manifest(staging)
        _swap(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target


def _write_manifest(staging: Path) -> None:
    """List every file and folder written into ``staging`` in its manifest (written last)."""
    files, folders = [], []
    for root, dirs, names in os.walk(staging):
        rel = Path(root).relative_to(staging)
        folders += [(rel / d).as_posix() for d in dirs]
        files += [(rel / n).as_posix() for n in names]
    manifest = {"format": MANIFEST_FORMAT, "version": 1,
                "note": "the files collsynth plan wrote here; a later plan replaces these and "
                        "refuses to touch anything else",
                "files": sorted(files), "folders": sorted(folders)}
    write_text_atomic(staging / MANIFEST_NAME, json.dumps(manifest, indent=1) + "\n")


def _deployment_json(d: Any, target: Path) -> dict[str, Any]:
    path = str(target / d.path)
    return {"runtime": d.runtime, "file": d.path, "kind": d.kind, "versions": d.versions,
            "how": d.how, "environment": [{"name": n, "value": v.format(path=path), "why": w}
                                          for n, v, w in d.variables],
            "summary": [line.replace("{path}", path) for line in d.summary]}


def _write_into(plan: Plan, staging: Path, target: Path, plots: bool,
                deployments: tuple[Any, ...] = ()) -> None:
    xml_dir = staging / "xml"
    xml_dir.mkdir()
    for d in deployments:
        rel = _relative(d.path)
        if rel is None or rel.parts[0] in ("xml", "plots") or len(rel.parts) < 2:
            raise ExportError(f"internal: deployment path {d.path!r}")
        (staging / rel).parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(staging / rel, d.text)
    for xml in plan.xml_files:
        path = xml_dir / xml.name
        write_text_atomic(path, xml.text)
        try:
            check_xml_file(path, runtime=plan.runtime, collective=xml.collective, root=xml.root)
        except CollsynthError as exc:
            raise ExportError(f"xml/{xml.name}: {exc}") from exc
    final_xml = target / "xml"
    environment, notes = runtime_environment(
        get_runtime(plan.runtime), xml_dir=str(final_xml),
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
    obj["deployments"] = [_deployment_json(d, target) for d in deployments]
    write_text_atomic(staging / "plan.json", json.dumps(obj, indent=1) + "\n")
    write_text_atomic(staging / "report.md", render_report(
        plan, environment=environment, environment_notes=notes, plots=drawn,
        deployments=obj["deployments"]))
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
    """Put ``staging`` at ``target``, replacing an earlier plan there (renames only). The old
    plan is moved aside and checked again (nothing foreign came meanwhile); then only the
    files and folders its manifest lists are removed, so nothing else can be lost."""
    old = None
    if target.exists():
        old = _fresh_directory(target, "old")
        old.rmdir()
        os.replace(target, old)
        try:
            files, folders = _owned(old)
        except BaseException:
            os.replace(old, target)
            raise
    try:
        os.replace(staging, target)
    except BaseException:
        if old is not None:
            os.replace(old, target)
        raise
    if old is not None:
        for rel in sorted(files):
            with contextlib.suppress(OSError):
                (old / rel).unlink()
        for rel in sorted(folders, key=lambda p: -len(p.parts)):
            with contextlib.suppress(OSError):
                (old / rel).rmdir()
        try:
            old.rmdir()
        except OSError:  # something appeared meanwhile: kept, never deleted
            _log.warning("kept %s: it holds files the earlier plan did not write", old)
