"""``collsynth export``: write an algorithm file as MSCCL XML, checked before it is written.

The runtimes' limits are checked first (every exceeded one reported, one line each), then the
program is lowered, checked (:func:`collsynth.export.check.check_program`) and only then written
(:mod:`collsynth.export.pipeline`). Options and their runtime attributes: docs/cli.md.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
from pathlib import Path
from typing import Sequence

from collsynth._output import (check_output_dir, check_output_file, path_in, staged_folder,
                               write_all_atomic)
from collsynth._parse import number_text
from collsynth.algorithm.fileformat import load_algorithm
from collsynth.cli.common import (EXIT_OK, DetailedError, UsageError, channels_or_auto, err,
                                  format_size, out, parse_sizes, path_argument, positive_int,
                                  table, why_not)
from collsynth.cli.plan_files import MSCCLPP_RUNTIME, export_plan
from collsynth.errors import ExportError, InvalidTopologyError, shown_path
from collsynth.export.limits import CHANNEL_POLICIES, LimitViolation
from collsynth.export.pipeline import check_instances, export_programs
from collsynth.runtimes import MSCCL_XML, PROTOCOLS, runtime_names, xml_dialect
from collsynth.export.stats import program_stats
from collsynth.timing.tune import other_tuned_files, tune_export, tune_sizes, write_tuned

__all__ = ["register", "run_export", "EXPORT_RUNTIMES"]

_log = logging.getLogger(__name__)

#: Values of ``--runtime`` (``all``: every MSCCL XML runtime; ``mscclpp``: an execution plan).
EXPORT_RUNTIMES = (*runtime_names(MSCCL_XML), "all", MSCCLPP_RUNTIME)



def _bytes(text: str) -> int:
    try:
        value = int(number_text(text))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected a number of bytes >= 0, got {text!r}"
                                         f"{why_not(exc)}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a number of bytes >= 0, got {text!r}")
    return value


def _stages(text: str) -> int | str:
    if text in ("auto", "keep"):
        return text
    try:
        return positive_int(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"expected a number of stages >= 1, 'auto' or 'keep', "
                                         f"got {text!r}") from None


def register(subparsers) -> None:
    """Add ``export`` to ``subparsers`` (from ``add_subparsers``)."""
    export = subparsers.add_parser(
        "export", help="write an algorithm as MSCCL XML (checked first)",
        description="Lower an algorithm file to MSCCL XML for msccl, rccl or msccl-executor, "
                    "check it (static rules and symbolic execution) and write it. A program "
                    "that fails the check is never written.")
    export.add_argument("file", metavar="ALGO.json", help="algorithm file")
    export.add_argument("-o", "--output", type=path_argument, metavar="PATH", required=True,
                        help="XML file; with --runtime all a directory or a name stem (one "
                             "file per runtime: STEM.msccl.xml, STEM.rccl.xml, ...)")
    export.add_argument("--runtime", choices=EXPORT_RUNTIMES, default="msccl",
                        help="target runtime (default msccl); mscclpp writes an MSCCL++ "
                             "execution plan (JSON, docs/mscclpp.md)")
    export.add_argument("--proto", choices=PROTOCOLS, default=None,
                        help="NCCL protocol (default Simple)")
    export.add_argument("--channel-by", choices=CHANNEL_POLICIES, default=None,
                        help="spread over channels by chunk, by block (of 71 chunks: merged "
                             "messages stay whole) or by peer (for ranks with more than 32 "
                             "peers); default: each in turn with --channels auto, else chunk")
    export.add_argument("--channels", type=channels_or_auto, default=None, metavar="N",
                        help="channels to spread connections over; 'auto' (the default): the "
                             "fewest of 1, 2, 4, ..., 32 (by block, chunk, then peer) that meets "
                             "the runtime's limits")
    export.add_argument("--stages", type=_stages, default=None, metavar="S",
                        help="pipeline stages to lower the schedule in: S merges its waves into "
                             "S groups (fewer, larger steps); 'keep' lowers it as it is; 'auto' "
                             "(the default): as it is if that fits one channel, else the most "
                             "stages that fit (docs/export.md, 'Restaging')")
    export.add_argument("--instances", type=positive_int, default=None, metavar="K",
                        help="parallel copies of the schedule, each on 1/K of every chunk "
                             "(default 1)")
    export.add_argument("--min-bytes", type=_bytes, metavar="B",
                        help="smallest message size (bytes) to use the algorithm for")
    export.add_argument("--max-bytes", type=_bytes, metavar="B",
                        help="largest message size (bytes, inclusive) to use the algorithm "
                             "for; written as maxBytes=B (rccl, msccl-executor) or B+1 (msccl, "
                             "where it is exclusive). Default: unlimited (rccl maxBytes=0; "
                             "msccl: attribute left out, 128 MiB)")
    export.add_argument("--inplace", action="store_true",
                        help="export for in-place calls")
    export.add_argument("--outofplace", action="store_true",
                        help="export for out-of-place calls (the default); with --inplace, "
                             "for both (rccl, msccl-executor)")
    export.add_argument("--name", metavar="NAME", type=_program_name,
                        help="the algorithm's name attribute (default: the algorithm's name)")
    tune = export.add_argument_group(
        "tuning", "--tune searches channels, channel policy, instances and protocol within the "
                  "runtime's limits, prices every layout with the program model (predictions) "
                  "and writes, per size range, the fastest as its own program with "
                  "minBytes/maxBytes; -o is then a folder (docs/runtime-model.md, 'Tuning')")
    tune.add_argument("--tune", action="store_true",
                      help="tune the layout per size range (one runtime at a time)")
    tune.add_argument("--sizes", type=parse_sizes, metavar="S1,S2,...",
                      help="sizes the search prices (nccl-tests convention; default 1KiB to "
                           "1GiB, x4 steps)")
    tune.add_argument("--runtime-constants", type=path_argument, metavar="FILE",
                      help="runtime constants to price with (a runtime-constants calibration, "
                           "from collsynth calibrate --model program; default the runtime's "
                           "documented defaults)")
    tune.add_argument("--json", action="store_true", help="with --tune: the table as JSON")
    export.set_defaults(handler=run_export)


def _program_name(text: str) -> str:
    """``--name``: any text but blank (each format would fill a blank name its own way)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("a blank name; give one, or leave --name out for the "
                                         "algorithm's own")
    return text


def _destinations(output: str, runtimes: list[str],
                  algorithm_file: str) -> tuple[dict[str, Path], Path | None]:
    """Where each runtime's file goes, and the folder ``-o`` names (``None``: files named by
    a stem), checked by the output policy (:mod:`collsynth._output`) before any work; the
    folder is not created here."""
    target = Path(output)
    if len(runtimes) == 1:
        return {runtimes[0]: check_output_file(output, label=f"-o {shown_path(output)}",
                                               inputs=[algorithm_file])}, None
    folder = None
    if target.is_dir() or output.endswith(("/", os.sep)):
        folder = check_output_dir(output, label=f"-o {shown_path(output)}", create=False)
        stem = Path(algorithm_file).name
        stem = stem[:-5] if stem.endswith(".json") else stem
        paths = {rt: path_in(folder, stem, suffix=f".{rt}.xml") for rt in runtimes}
    else:
        stem = target.name[:-4] if target.name.endswith(".xml") else target.name
        paths = {rt: target.with_name(f"{stem}.{rt}.xml") for rt in runtimes}
    if folder is None or folder.is_dir():
        for path in paths.values():
            check_output_file(path, label=f"-o {shown_path(output)}: {shown_path(path)}",
                              inputs=[algorithm_file])
    return paths, folder


def _check_layouts(runtimes: Sequence[str], inplace: bool, outofplace: bool) -> None:
    """``--inplace --outofplace`` (one file for both layouts) where a runtime reads one layout
    per file: a usage error, as it is for MSCCL++ plans, before any file is read."""
    one = [rt for rt in runtimes if not xml_dialect(rt).requires_range_attributes]
    if inplace and outofplace and one:
        raise UsageError.of("export", f"--inplace with --outofplace: {', '.join(one)} "
                                      "selects an algorithm for one layout only (its 'inplace' "
                                      "attribute); export an in-place and an out-of-place file")


_CHOSEN_BY_TUNING = (("channels", "--channels"), ("channel_by", "--channel-by"),
                     ("instances", "--instances"), ("proto", "--proto"),
                     ("min_bytes", "--min-bytes"), ("max_bytes", "--max-bytes"))


def run_export(args: argparse.Namespace) -> int:
    """Run ``collsynth export`` from parsed arguments; return 0 (every file written)."""
    if args.runtime == MSCCLPP_RUNTIME:
        return export_plan(args)
    if args.tune:
        return _run_tuned(args)
    for flag in ("sizes", "runtime_constants", "json"):
        if getattr(args, flag):
            raise UsageError.of("export", f"--{flag.replace('_', '-')} goes with --tune")
    args.channels = "auto" if args.channels is None else args.channels
    stages = args.stages or "auto"
    args.instances = args.instances or 1
    args.proto = args.proto or "Simple"
    if args.min_bytes is not None and args.max_bytes is not None and \
            args.max_bytes < args.min_bytes:
        raise UsageError.of("export", f"--max-bytes {args.max_bytes} is below --min-bytes "
                                      f"{args.min_bytes}")
    inplace = bool(args.inplace)
    outofplace = bool(args.outofplace) or not inplace
    runtimes = runtime_names(MSCCL_XML) if args.runtime == "all" else [args.runtime]
    _check_layouts(runtimes, inplace, outofplace)
    try:
        check_instances(args.instances, runtimes)
        destinations, folder = _destinations(args.output, runtimes, args.file)
        algorithm = load_algorithm(args.file)
        exported = export_programs(
            algorithm, runtimes, subject=args.file, channels=args.channels,
            channel_by=args.channel_by, stages=None if stages == "keep" else stages,
            proto=args.proto, instances=args.instances,
            inplace=inplace, outofplace=outofplace, min_bytes=args.min_bytes,
            max_bytes=args.max_bytes, name=args.name)
    except ExportError as exc:
        if exc.violations:
            raise _limits_exceeded(args.file, exc.violations) from exc
        raise
    # Every file or none: the folder, when -o names one, appears only with its files in it.
    if folder is not None:
        with staged_folder(folder, label=f"-o {shown_path(args.output)}") as staging:
            write_all_atomic({staging / path.name: exported[runtime].text
                              for runtime, path in destinations.items()})
    else:
        write_all_atomic({path: exported[runtime].text
                          for runtime, path in destinations.items()})
    for runtime, path in destinations.items():
        done = exported[runtime]
        stats = program_stats(done.program)
        spread = (f"{done.channels} channel(s) by {done.channel_by}, "
                  if args.channels == "auto" else "")
        staged = "" if done.stages is None else f"{done.stages} stage(s), "
        out(f"wrote {shown_path(path)} ({runtime}, {len(done.text.splitlines())} lines; "
            f"{staged}{spread}{stats.summary()})")
    return EXIT_OK


def _run_tuned(args: argparse.Namespace) -> int:
    """``export --tune``: search, print the table (predictions), write one program per range."""
    given = [flag for attr, flag in _CHOSEN_BY_TUNING if getattr(args, attr) is not None]
    if given:
        raise UsageError.of("export", f"{', '.join(given)}: --tune chooses these itself")
    if args.stages is not None:
        raise UsageError.of("export", "--stages: --tune lowers the schedule as it is")
    if args.runtime == "all":
        raise UsageError.of("export", "--tune: one runtime at a time (--runtime msccl, rccl "
                                      "or msccl-executor)")
    inplace = bool(args.inplace)
    outofplace = bool(args.outofplace) or not inplace
    _check_layouts([args.runtime], inplace, outofplace)
    # Checked before any work; created (with its files) only when everything succeeded.
    folder = check_output_dir(args.output, label=f"-o {shown_path(args.output)}", create=False)
    constants = None
    if args.runtime_constants:
        from collsynth.timing.calibration import load_calibration, runtime_constants

        constants = runtime_constants(load_calibration(args.runtime_constants),
                                      args.runtime_constants)
        # msccl and msccl-executor run NCCL's kernels: NCCL's figures fit them, RCCL's do not
        if (constants.runtime == "rccl") != (args.runtime == "rccl"):
            raise UsageError.of("export", f"--runtime-constants {args.runtime_constants}: "
                                          f"figures for {constants.runtime}, but --runtime is "
                                          f"{args.runtime}")
    algorithm = load_algorithm(args.file)
    if algorithm.topology.unit_gbps is None:  # what works here, not another command's option
        raise InvalidTopologyError(
            f"{shown_path(args.file)}"
            f": its topology {algorithm.topology.name!r} has no unit_gbps (GB/s per "
            "bandwidth unit), which --tune prices layouts with: solve on a topology named with "
            f"it ({algorithm.topology.name},unit_gbps=GBPS,alpha_us=US) or add \"unit_gbps\" "
            "to the file's \"topology\" object")
    try:
        tuned = tune_export(algorithm, args.runtime, sizes=args.sizes or tune_sizes(),
                            constants=constants, inplace=inplace, outofplace=outofplace,
                            name=args.name, progress=_log.info)
    except ExportError as exc:
        if exc.violations:
            raise _limits_exceeded(args.file, exc.violations) from exc
        raise
    earlier = other_tuned_files(tuned, folder)
    paths = write_tuned(tuned, folder)
    if earlier:  # kept (they are not this command's), but the runtime would load them too
        err(f"warning: {folder} also holds {len(earlier)} program(s) of an earlier tuning of "
            f"{tuned.algorithm} for {tuned.runtime} ({', '.join(p.name for p in earlier[:3])}"
            f"{', ...' if len(earlier) > 3 else ''}); {tuned.runtime} loading the folder would "
            "take them with these, whose size ranges may overlap: remove them")
    if args.json:
        out(json.dumps({"algorithm": tuned.algorithm, "runtime": tuned.runtime,
                        "prediction": True, "constants": tuned.constants.source,
                        "rows": [row.as_dict() for row in tuned.rows],
                        "files": [{"path": str(p), "min_bytes": r.min_bytes,
                                   "max_bytes": r.max_bytes, "variant": r.variant.label}
                                  for p, r in zip(paths, tuned.ranges)]}, indent=2))
        return EXIT_OK
    out(f"{shown_path(args.file)}"
        f": {len(tuned.tried)} layouts priced for {args.runtime} with the program "
        f"model (predictions, constants: {tuned.constants.source[:60]}...)")
    headers = ["size", "layout", "time (us)", "algbw (GB/s)", "untuned (GB/s)", "speed-up"]
    rows = [[format_size(r.size_bytes), r.variant.label, f"{r.time_us:.1f}",
             f"{r.algbw_gbps:.2f}", f"{r.untuned_algbw_gbps:.2f}", f"{r.speedup:.2f}x"]
            for r in tuned.rows]
    out("\n".join(table(headers, rows, left=(1,))))
    for path, r in zip(paths, tuned.ranges):
        top = "unbounded" if r.max_bytes is None else f"{r.max_bytes} B"
        out(f"wrote {shown_path(path)} ({r.variant.label}, {r.min_bytes} B .. {top})")
    return EXIT_OK


def _limits_exceeded(algorithm_file: str, violations: Sequence[LimitViolation]
                     ) -> DetailedError:
    """One line saying what cannot be exported, then one line per exceeded limit."""
    runtimes = list(dict.fromkeys(v.runtime for v in violations))
    count = len(violations)
    return DetailedError(f"{algorithm_file}: not exported: {count} limit"
                         f"{'s' if count > 1 else ''} of {', '.join(runtimes)} exceeded; "
                         "nothing written", [f"{v.runtime}: {v}" for v in violations])
