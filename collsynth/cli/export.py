"""``collsynth export``: write an algorithm file as MSCCL XML, checked before it is written.

::

    collsynth export ALGO.json -o OUT.xml [--runtime msccl|rccl|msccl-executor|all]
                     [--proto Simple|LL|LL128] [--channels N|auto] [--channel-by chunk|peer]
                     [--instances K]
                     [--min-bytes B] [--max-bytes B] [--inplace] [--outofplace] [--name NAME]

The runtimes' limits are checked first, from the algorithm's sends
(:func:`collsynth.export.limits.estimate_all`), then exactly on the lowered program; when some
are exceeded nothing is written and every exceeded limit is reported, one line each, with the
runtime, the limit, the worst place and by how much. The algorithm is verified, lowered
(:func:`collsynth.export.lower.lower`), checked by
:func:`collsynth.export.check.check_program` (static rules and a symbolic execution in every
buffer layout the runtime may select it for) and only then written; a program that fails the
check is never written. With ``--runtime all`` one file per runtime is written: ``-o`` is a
directory (``DIR/ALGO.msccl.xml``, ...) or a name stem (``OUT.xml`` gives ``OUT.msccl.xml``,
``OUT.rccl.xml``, ``OUT.msccl-executor.xml``); nothing is written unless every runtime succeeds.

``--min-bytes``/``--max-bytes`` are the smallest and largest message (bytes, both inclusive) the
runtime should pick the algorithm for. rccl and msccl-executor get ``maxBytes=B`` (inclusive
there; without the option ``0``, which they read as unlimited); msccl gets ``maxBytes=B+1``
(exclusive there; without the option the attribute is left out and msccl's default of 128 MiB
applies, as it has no "unlimited").

``--inplace`` exports for in-place calls, ``--outofplace`` (the default) for out-of-place calls;
both at once (rccl, msccl-executor) declare both, and the program is built to be correct in both.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path
from typing import Sequence

from collsynth.cli.common import positive_int
from collsynth._output import check_output_dir, check_output_file, path_in, write_text_atomic
from collsynth.algorithm.fileformat import load_algorithm
from collsynth.errors import CollsynthError, ExportError
from collsynth.export.limits import LimitViolation
from collsynth.export.lower import PROTOCOLS
from collsynth.export.pipeline import check_instances, export_programs
from collsynth.export.runtimes import runtime_names
from collsynth.export.stats import program_stats

__all__ = ["add_export_parser", "run_export", "EXPORT_RUNTIMES"]

_log = logging.getLogger(__name__)

#: Values of ``--runtime``.
EXPORT_RUNTIMES = (*runtime_names(), "all")
# -- command line -------------------------------------------------------------------------------


def _bytes(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of bytes >= 0, got {text!r}") \
            from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a number of bytes >= 0, got {text!r}")
    return value


def add_export_parser(subparsers) -> argparse.ArgumentParser:
    """Add the ``export`` subcommand to ``subparsers`` (from ``add_subparsers``); return it."""
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
    export.add_argument("--channels", type=_channels, default=1, metavar="N",
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
    export.set_defaults(handler=run_export, export_parser=export)
    return export


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


def _channels(text: str) -> int | str:
    if text == "auto":
        return text
    return positive_int(text)


def run_export(args: argparse.Namespace) -> int:
    """Run ``collsynth export`` from parsed arguments; return the exit code (0 written, 1 error).

    Inconsistent options are usage errors (exit 2, through the parser).
    """
    parser = getattr(args, "export_parser", None)
    if args.min_bytes is not None and args.max_bytes is not None and \
            args.max_bytes < args.min_bytes:
        message = f"--max-bytes {args.max_bytes} is below --min-bytes {args.min_bytes}"
        if parser is not None:
            parser.error(message)
        raise ExportError(message)
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
        for runtime, path in destinations.items():
            done = exported[runtime]
            write_text_atomic(path, done.text)
            stats = program_stats(done.program)
            spread = (f"{done.channels} channel(s) by {done.channel_by}, "
                      if args.channels == "auto" else "")
            print(f"wrote {path} ({runtime}, {len(done.text.splitlines())} lines; "
                  f"{spread}{stats.summary()})", file=sys.stdout, flush=True)
    except (CollsynthError, OSError) as exc:
        violations = getattr(exc, "violations", None)
        if violations:
            _print_violations(args.file, violations)
            return 1
        detail = exc.strerror + (f": {exc.filename}" if exc.filename else "") \
            if isinstance(exc, OSError) and exc.strerror else str(exc)
        print(f"collsynth: error: {' '.join(detail.split())}", file=sys.stderr, flush=True)
        return 1
    return 0


def _print_violations(algorithm_file: str, violations: Sequence[LimitViolation]) -> None:
    """One line saying what cannot be exported, then one line per exceeded limit."""
    runtimes = list(dict.fromkeys(v.runtime for v in violations))
    count = len(violations)
    lines = [f"{algorithm_file}: not exported: {count} limit{'s' if count > 1 else ''} of "
             f"{', '.join(runtimes)} exceeded; nothing written"]
    lines += [f"{v.runtime}: {v}" for v in violations]
    for line in lines:
        print(f"collsynth: error: {' '.join(line.split())}", file=sys.stderr, flush=True)
