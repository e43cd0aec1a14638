"""``collsynth bench``: measure an MSCCL program against the runtime's own algorithms on GPUs.

::

    collsynth bench FILE.xml|ALGO.json --ranks N --runtime msccl|msccl-executor|rccl
                    [--dry-run | --from-logs] [--sizes A:B] [-o DIR]
                    [--launcher 'mpirun -np {ranks}']
                    [--iters N] [--warmup N] [--root R] [--channels N|auto]
                    [--topology NAME] [--nodes K] [--json]

Writes into ``DIR`` (default ``bench-NAME``) the program (``xml/``; an algorithm file is exported
first), ``run_default.sh`` (the runtime's own algorithms) and ``run_xml.sh`` (the program, with
the environment the runtime reads it from), a ``README.md`` and ``bench.json``
(:mod:`collsynth.plan.bench`). Unless ``--dry-run``, it then runs both when the nccl-tests
(rccl-tests) binary is on PATH, reads their logs and writes ``calibration.json`` (the default
run fitted), ``report.md`` (measured against predicted, per size) and ``plot.png``.

It never reports a figure it did not measure: ``--dry-run`` writes the scripts only and says
so; without the binary nothing is run and the exit status is 1. ``--from-logs`` reads the logs
the scripts left in ``DIR/logs`` (run on another machine) instead of running them.

Exit status: 0 written (and, without ``--dry-run``, measured); 1 an error (unreadable or
unexportable program, a binary not on PATH, a failed run); 2 usage.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from collsynth.cli.common import non_negative_int, positive_int

__all__ = ["add_bench_parser", "run_bench_command"]


def _size_range(text: str) -> tuple[int, int]:
    from collsynth.cli.common import parse_size

    parts = text.split(":")
    if len(parts) != 2:
        raise argparse.ArgumentTypeError(f"size range {text!r}: expected FROM:TO, like 1KiB:1GiB")
    low, high = parse_size(parts[0]), parse_size(parts[1])
    if low > high:
        raise argparse.ArgumentTypeError(f"size range {text!r}: FROM is above TO")
    return low, high


def _channels(text: str) -> int | str:
    return "auto" if text == "auto" else positive_int(text)


def add_bench_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``bench`` subcommand; its handler is :func:`run_bench_command`."""
    from collsynth.plan.bench import BENCH_RUNTIMES

    parser = subparsers.add_parser(
        "bench", help="measure an MSCCL program against the runtime's own algorithms",
        description="Write the nccl-tests/rccl-tests runs that measure an MSCCL program (or an "
                    "algorithm file, exported first) against the runtime's own algorithms; run "
                    "them when the binaries are on PATH, and report measured against predicted.")
    parser.add_argument("program", metavar="FILE.xml|ALGO.json", help="the program to measure")
    parser.add_argument("--ranks", type=positive_int, required=True, metavar="N",
                        help="the GPUs (ranks) it runs on")
    parser.add_argument("--runtime", choices=BENCH_RUNTIMES, required=True,
                        help="the runtime that loads it")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--dry-run", action="store_true",
                      help="write the scripts only: nothing is run or measured")
    mode.add_argument("--from-logs", action="store_true",
                      help="read the logs the scripts left in DIR/logs instead of running them")
    parser.add_argument("--sizes", type=_size_range, default=(1024, 1 << 30), metavar="A:B",
                        help="sizes to measure (nccl-tests convention; default 1KiB:1GiB)")
    parser.add_argument("-o", "--output", metavar="DIR", help="folder to write (default "
                                                              "bench-NAME)")
    parser.add_argument("--launcher", metavar="CMD",
                        help="start one process per rank, {ranks} replaced: 'mpirun -np {ranks}'"
                             " (default: one process drives every GPU)")
    parser.add_argument("--iters", type=positive_int, default=20, metavar="N",
                        help="nccl-tests -n (default 20)")
    parser.add_argument("--warmup", type=non_negative_int, default=5, metavar="N",
                        help="nccl-tests -w (default 5)")
    parser.add_argument("--root", type=non_negative_int, default=0, metavar="R",
                        help="root rank of a rooted collective (default 0)")
    parser.add_argument("--channels", type=_channels, default="auto", metavar="N|auto",
                        help="channels of an algorithm file's export (default auto)")
    parser.add_argument("--topology", metavar="NAME",
                        help="the machine's name, recorded in the calibration")
    parser.add_argument("--nodes", type=positive_int, default=1, metavar="K",
                        help="the machine's node count, recorded in the calibration")
    parser.add_argument("--json", action="store_true", help="print bench.json")
    parser.set_defaults(handler=run_bench_command)
    return parser


def run_bench_command(args: argparse.Namespace) -> int:
    """Handle ``collsynth bench``; errors reach ``main``, which prints them (exit 1)."""
    from collsynth.plan.bench import (
        BenchError,
        BenchOptions,
        missing_binaries,
        prepare_bench,
        read_results,
        run_bench,
        write_results,
        write_scripts,
    )

    from collsynth._output import check_output_dir

    if args.output:  # a refused folder is found before any work
        check_output_dir(args.output, label=f"-o {args.output}", create=False)
    options = BenchOptions(runtime=args.runtime, ranks=args.ranks, min_bytes=args.sizes[0],
                           max_bytes=args.sizes[1], iters=args.iters, warmup=args.warmup,
                           launcher=args.launcher, root=args.root, channels=args.channels,
                           topology=args.topology, nodes=args.nodes)
    setup = prepare_bench(args.program, options)
    out = Path(args.output or f"bench-{Path(setup.program.file_name).stem}")
    missing = [] if args.dry_run or args.from_logs else missing_binaries(setup)
    written = write_scripts(setup, out, dry_run=args.dry_run or bool(missing))
    scripts = " and ".join(str(out / run.script) for run in setup.runs)
    if args.dry_run:
        _print(args, out, f"dry run: wrote {scripts} ({len(setup.sizes)} sizes, "
                          f"{setup.sizes[0]} to {setup.sizes[-1]} bytes); nothing was run, "
                          "nothing measured")
        return 0
    if missing:
        raise BenchError(f"{', '.join(missing)} not on PATH: wrote {scripts} but ran nothing "
                         "and measured nothing; run them where nccl-tests (rccl-tests) is "
                         "built, or pass --dry-run")
    result = read_results(setup, out) if args.from_logs else run_bench(setup, out)
    written = write_results(setup, result, out)
    if not args.json:
        print(f"{'size (B)':>12}  {'default us':>11}  {'xml us':>11}  program", file=sys.stdout)
        for row in result.sizes:
            cells = [f"{row.size_bytes:>12}",
                     f"{row.default_us:>11.4g}" if row.default_us else f"{'-':>11}",
                     f"{row.xml_us:>11.4g}" if row.xml_us else f"{'-':>11}",
                     "yes" if row.runs_program else "no (runtime's own)"]
            print("  ".join(cells), file=sys.stdout)
    _print(args, out, "measured: wrote " + ", ".join(str(p) for p in written[:3]))
    return 0


def _print(args: argparse.Namespace, out: Path, line: str) -> None:
    if args.json:
        print(json.dumps(json.loads((out / "bench.json").read_text()), indent=1),
              file=sys.stdout, flush=True)
    else:
        print(line, file=sys.stdout, flush=True)
