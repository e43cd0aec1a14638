"""``collsynth export``: write an algorithm file as MSCCL XML, checked before it is written.

The runtimes' limits are checked first (every exceeded one reported, one line each), then the
program is lowered, checked (:func:`collsynth.export.check.check_program`) and only then written
(:mod:`collsynth.export.pipeline`). Options and their runtime attributes: docs/cli.md.
"""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path
from typing import Sequence

from collsynth._output import check_output_dir, check_output_file, path_in, write_text_atomic
from collsynth.algorithm.fileformat import load_algorithm
from collsynth.cli.common import (EXIT_OK, DetailedError, UsageError, channels_or_auto, out,
                                  positive_int)
from collsynth.errors import ExportError
from collsynth.export.limits import LimitViolation
from collsynth.export.lower import PROTOCOLS
from collsynth.export.pipeline import check_instances, export_programs
from collsynth.export.runtimes import runtime_names
from collsynth.export.stats import program_stats

__all__ = ["register", "run_export", "EXPORT_RUNTIMES"]

_log = logging.getLogger(__name__)

#: Values of ``--runtime``.
EXPORT_RUNTIMES = (*runtime_names(), "all")



def _bytes(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of bytes >= 0, got {text!r}") \
            from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a number of bytes >= 0, got {text!r}")
    return value


def register(subparsers) -> None:
    """Add ``export`` to ``subparsers`` (from ``add_subparsers``)."""
    export = subparsers.add_parser(
        "export", help="write an algorithm as MSCCL XML (checked first)",
        description="Lower an algorithm file to MSCCL XML for msccl, rccl or msccl-executor, "
                    "check it (static rules and symbolic execution) and write it. A program "
                    "that fails the check is never written.")
    export.add_argument("file", metavar="ALGO.json", help="algorithm file")
    export.add_argument("-o", "--output", metavar="PATH", required=True,
                        help="XML file; with --runtime all a directory or a name stem (one "
                             "file per runtime: STEM.msccl.xml, STEM.rccl.xml, ...)")
    export.add_argument("--runtime", choices=EXPORT_RUNTIMES, default="msccl",
                        help="target runtime (default msccl)")
    export.add_argument("--proto", choices=PROTOCOLS, default="Simple",
                        help="NCCL protocol (default Simple)")
    export.add_argument("--channel-by", choices=("chunk", "peer"), default="chunk",
                        help="spread over channels by chunk (default) or by peer (for ranks "
                             "with more than 32 peers)")
    export.add_argument("--channels", type=channels_or_auto, default=1, metavar="N",
                        help="channels to spread connections over (default 1); 'auto': the "
                             "fewest of 1, 2, 4, ..., 32 (by chunk, then by peer) that meets "
                             "the runtime's limits")
    export.add_argument("--instances", type=positive_int, default=1, metavar="K",
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
    export.add_argument("--name", metavar="NAME",
                        help="the algorithm's name attribute (default: the algorithm's name)")
    export.set_defaults(handler=run_export)


def _destinations(output: str, runtimes: list[str], algorithm_file: str) -> dict[str, Path]:
    """Where each runtime's file goes, checked by the output policy (:mod:`collsynth._output`)
    before any work."""
    target = Path(output)
    if len(runtimes) == 1:
        return {runtimes[0]: check_output_file(output, label=f"-o {output}")}
    if target.is_dir() or output.endswith(("/", os.sep)):
        folder = check_output_dir(output, label=f"-o {output}")
        stem = Path(algorithm_file).name
        stem = stem[:-5] if stem.endswith(".json") else stem
        paths = {rt: path_in(folder, stem, suffix=f".{rt}.xml") for rt in runtimes}
    else:
        stem = target.name[:-4] if target.name.endswith(".xml") else target.name
        paths = {rt: target.with_name(f"{stem}.{rt}.xml") for rt in runtimes}
    for path in paths.values():
        check_output_file(path, label=f"-o {output}: {path}")
    return paths


def run_export(args: argparse.Namespace) -> int:
    """Run ``collsynth export`` from parsed arguments; return 0 (every file written)."""
    if args.min_bytes is not None and args.max_bytes is not None and \
            args.max_bytes < args.min_bytes:
        raise UsageError.of("export", f"--max-bytes {args.max_bytes} is below --min-bytes "
                                      f"{args.min_bytes}")
    inplace = bool(args.inplace)
    outofplace = bool(args.outofplace) or not inplace
    runtimes = runtime_names() if args.runtime == "all" else [args.runtime]
    try:
        check_instances(args.instances, runtimes)
        destinations = _destinations(args.output, runtimes, args.file)
        algorithm = load_algorithm(args.file)
        exported = export_programs(
            algorithm, runtimes, subject=args.file, channels=args.channels,
            channel_by=args.channel_by, proto=args.proto, instances=args.instances,
            inplace=inplace, outofplace=outofplace, min_bytes=args.min_bytes,
            max_bytes=args.max_bytes, name=args.name)
    except ExportError as exc:
        if exc.violations:
            raise _limits_exceeded(args.file, exc.violations) from exc
        raise
    for runtime, path in destinations.items():
        done = exported[runtime]
        write_text_atomic(path, done.text)
        stats = program_stats(done.program)
        spread = (f"{done.channels} channel(s) by {done.channel_by}, "
                  if args.channels == "auto" else "")
        out(f"wrote {path} ({runtime}, {len(done.text.splitlines())} lines; "
            f"{spread}{stats.summary()})")
    return EXIT_OK


def _limits_exceeded(algorithm_file: str, violations: Sequence[LimitViolation]
                     ) -> DetailedError:
    """One line saying what cannot be exported, then one line per exceeded limit."""
    runtimes = list(dict.fromkeys(v.runtime for v in violations))
    count = len(violations)
    return DetailedError(f"{algorithm_file}: not exported: {count} limit"
                         f"{'s' if count > 1 else ''} of {', '.join(runtimes)} exceeded; "
                         "nothing written", [f"{v.runtime}: {v}" for v in violations])
