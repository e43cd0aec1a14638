"""``collsynth bench``: measure an MSCCL program against the runtime's own algorithms on GPUs.

Writes the nccl-tests (rccl-tests) scripts, runs them unless ``--dry-run``, and reports measured
against predicted (:mod:`collsynth.plan.bench`); it never reports a figure it did not measure.
Files written and exit status: docs/cli.md.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from collsynth.cli.common import (EXIT_OK, channels_or_auto, non_negative_int, out, parse_size,
                                  node_count, path_argument, positive_int)
from collsynth.errors import shown_path

__all__ = ["register", "run_bench_command"]


def _size_range(text: str) -> tuple[int, int]:
    parts = text.split(":")
    if len(parts) != 2:
        raise argparse.ArgumentTypeError(f"size range {text!r}: expected FROM:TO, like 1KiB:1GiB")
    low, high = parse_size(parts[0]), parse_size(parts[1])
    if low > high:
        raise argparse.ArgumentTypeError(f"size range {text!r}: FROM is above TO")
    return low, high


def _launcher(text: str) -> str:
    """A ``--launcher`` command: one that splits into words as a shell would, with no
    placeholder but ``{ranks}``. A blank one was taken as a launcher and wrote scripts that ran
    one process on one GPU; ``{rank}`` went into the script as it was, for the shell to fail on.
    """
    import re
    import shlex

    try:
        words = shlex.split(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r}: {exc}; expected a command like "
                                         "'mpirun -np {ranks}'") from None
    if not words:
        raise argparse.ArgumentTypeError("an empty command; expected one like "
                                         "'mpirun -np {ranks}', or leave --launcher out")
    # A placeholder is {name}; ${NAME} is the shell's, not ours.
    unknown = sorted(set(re.findall(r"(?<!\$)\{[A-Za-z_][A-Za-z0-9_]*\}", text)) - {"{ranks}"})
    if unknown:
        raise argparse.ArgumentTypeError(f"{text!r}: unknown placeholder {unknown[0]}; the only "
                                         "one is {ranks}, the rank count")
    return text


def _iterations(low: int) -> Any:
    def parse(text: str) -> int:
        from collsynth.plan.bench import MAX_ITERATIONS

        value = positive_int(text) if low else non_negative_int(text)
        if value > MAX_ITERATIONS:
            raise argparse.ArgumentTypeError(f"{text!r}: expected a whole number from {low} to "
                                             f"{MAX_ITERATIONS}")
        return value
    return parse


def register(subparsers: Any) -> None:
    """Add ``bench`` to ``subparsers`` (from ``add_subparsers``)."""
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
    parser.add_argument("-o", "--output", type=path_argument, metavar="DIR",
                        help="folder to write (default bench-NAME)")
    parser.add_argument("--launcher", type=_launcher, metavar="CMD",
                        help="start one process per rank, {ranks} replaced: 'mpirun -np {ranks}'"
                             " (default: one process drives every GPU)")
    parser.add_argument("--iters", type=_iterations(1), default=20, metavar="N",
                        help="nccl-tests -n (default 20; at most 10^6)")
    parser.add_argument("--warmup", type=_iterations(0), default=5, metavar="N",
                        help="nccl-tests -w (default 5; at most 10^6)")
    parser.add_argument("--root", type=non_negative_int, default=0, metavar="R",
                        help="root rank of a rooted collective (default 0)")
    parser.add_argument("--channels", type=channels_or_auto, default="auto", metavar="N|auto",
                        help="channels of an algorithm file's export (default auto)")
    parser.add_argument("--topology", metavar="NAME",
                        help="the machine's name, recorded in the calibration")
    parser.add_argument("--nodes", type=node_count, default=1, metavar="K",
                        help="the machine's node count, recorded in the calibration")
    parser.add_argument("--json", action="store_true", help="print bench.json")
    parser.set_defaults(handler=run_bench_command)


def run_bench_command(args: argparse.Namespace) -> int:
    """Handle ``collsynth bench``; errors reach ``main`` (exit 1)."""
    from collsynth._output import check_output_dir, staged_folder
    from collsynth.plan.bench import (
        BenchError,
        BenchOptions,
        check_bench_folder,
        missing_binaries,
        prepare_bench,
        read_results,
        run_bench,
        write_results,
        write_scripts,
    )

    if args.output:  # a refused folder is found before any work
        check_output_dir(args.output, label=f"-o {shown_path(args.output)}", create=False)
    options = BenchOptions(runtime=args.runtime, ranks=args.ranks, min_bytes=args.sizes[0],
                           max_bytes=args.sizes[1], iters=args.iters, warmup=args.warmup,
                           launcher=args.launcher, root=args.root, channels=args.channels,
                           topology=args.topology, nodes=args.nodes)
    setup = prepare_bench(args.program, options)
    out_dir = Path(args.output or f"bench-{Path(setup.program.file_name).stem}")
    label = f"-o {shown_path(out_dir)}"
    check_output_dir(out_dir, label=label, create=False)
    check_bench_folder(setup, out_dir)
    missing = [] if args.dry_run or args.from_logs else missing_binaries(setup)
    if missing:
        raise BenchError(f"{', '.join(missing)} not on PATH: ran nothing, measured nothing and "
                         "wrote nothing; run where nccl-tests (rccl-tests) is built, or pass "
                         "--dry-run to write the scripts")
    # The logs of a run elsewhere are read before anything is written.
    result = read_results(setup, out_dir) if args.from_logs else None
    # Everything is written (and run) in a staging folder that becomes DIR only on success.
    with staged_folder(out_dir, label=label) as staging:
        write_scripts(setup, staging, dry_run=args.dry_run)
        written = []
        if not args.dry_run:
            if result is None:
                result = run_bench(setup, staging)
            written = [out_dir / p.relative_to(staging)
                       for p in write_results(setup, result, staging)]
        summary = json.loads((staging / "bench.json").read_text(encoding="utf-8"))
    scripts = " and ".join(shown_path(out_dir / run.script) for run in setup.runs)
    if args.dry_run:
        _print(args, summary, f"dry run: wrote {scripts} ({len(setup.sizes)} sizes, "
                              f"{setup.sizes[0]} to {setup.sizes[-1]} bytes); nothing was run, "
                              "nothing measured")
        return EXIT_OK
    if not args.json:
        out(f"{'size (B)':>12}  {'default us':>11}  {'xml us':>11}  program")
        for row in result.sizes:
            cells = [f"{row.size_bytes:>12}",
                     f"{row.default_us:>11.4g}" if row.default_us else f"{'-':>11}",
                     f"{row.xml_us:>11.4g}" if row.xml_us else f"{'-':>11}",
                     "yes" if row.runs_program else "no (runtime's own)"]
            out("  ".join(cells))
    _print(args, summary, "measured: wrote " + ", ".join(shown_path(p) for p in written[:3]))
    return EXIT_OK


def _print(args: argparse.Namespace, summary: dict[str, Any], line: str) -> None:
    out(json.dumps(summary, indent=1) if args.json else line)
