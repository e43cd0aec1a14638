"""``collsynth time`` and ``collsynth plot``: predicted times of algorithms against NCCL's.

``time`` prices algorithm files with the closed form (:mod:`collsynth.timing.compare`) or, for XML
programs, ``--topology`` or a runtime calibration, with the program model
(:mod:`collsynth.cli.time_program`); ``plot`` draws the closed form on log-log axes. Sizes and
calibrations: docs/cli.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from fractions import Fraction
from pathlib import Path
from typing import Any, Sequence

from collsynth.cli.common import (EXIT_OK, UsageError, add_figure_arguments, format_size, out,
                                  parse_size_range, parse_sizes, table)
from collsynth.cli.time_program import (add_time_program_arguments, run_program_time,
                                        wants_program_model)
from collsynth.errors import CollsynthError
from collsynth.exact import fraction_text
from collsynth.timing.compare import Comparison, compare

__all__ = ["register", "run_time", "run_plot"]


def _load(paths: Sequence[str], calibration_path: str | None, *, unit_gbps: float | None = None,
          alpha_us: float | None = None) -> tuple[list[Any], Any]:
    from collsynth.algorithm.fileformat import load_algorithm
    from collsynth.topology.builtins import with_figures

    # --unit-gbps / --alpha-us replace the figures each algorithm's topology was saved with.
    algorithms = [dataclasses.replace(a, topology=with_figures(a.topology, unit_gbps=unit_gbps,
                                                               alpha_us=alpha_us))
                  for a in map(load_algorithm, paths)]
    calibration = None
    if calibration_path is not None:
        try:
            from collsynth.timing.calibration import load_calibration
        except ImportError as exc:
            raise CollsynthError("--calibration: calibration support "
                                 "(collsynth.timing.calibration) is not installed") from exc
        calibration = load_calibration(calibration_path)
    return algorithms, calibration


def _envelope(comparison: Comparison, lo: int, hi: int):
    from collsynth.timing.model import lower_envelope

    return lower_envelope(comparison.lines, lo, hi)


def run_time(args: argparse.Namespace) -> int:
    """Run ``collsynth time``; return 0 (errors raise :class:`CollsynthError` or ``OSError``)."""
    from collsynth._files import check_input_file
    from collsynth.timing.metrics import algbw_gbps, busbw_gbps

    for path in args.files:  # every input a regular file, before the first is priced
        check_input_file(path)
    if wants_program_model(args):
        return run_program_time(args)
    if getattr(args, "nodes", None) is not None:
        raise CollsynthError("--nodes goes with --topology (the program model)")
    for path in args.files:
        if path.lower().endswith(".xml"):
            raise CollsynthError(f"{path}: the closed form prices algorithm files; an MSCCL XML "
                                 "program needs the program model (--topology T)")
    algorithms, calibration = _load(args.files, args.calibration, unit_gbps=args.unit_gbps,
                                    alpha_us=args.alpha_us)
    comparison = compare(algorithms, calibration=calibration, device=args.device)
    sizes = args.sizes
    coll, n = comparison.collective, comparison.num_ranks
    envelope = _envelope(comparison, sizes[0], sizes[-1])
    changes = [(a.name, b.name, b.from_bytes) for a, b in zip(envelope, envelope[1:])]
    per_size = []
    for size in sizes:
        rows = []
        for shown, line in comparison.rows(size):
            t = comparison.time_us(line, size)
            kind = ("nccl" if line.startswith("nccl ") else
                    "measured" if line in comparison.measured else "algorithm")
            rows.append({"name": shown, "kind": kind,
                         "time_us": t, "algbw_gbps": algbw_gbps(size, t),
                         "busbw_gbps": busbw_gbps(coll, n, size, t)})
        best = comparison.best_of(list(comparison.lines), size)
        per_size.append((size, rows, best))
    if args.json:
        out(json.dumps({
            "collective": coll, "num_ranks": n, "topology": comparison.topology,
            "notes": list(comparison.notes),
            "sizes": [{"size_bytes": size, "candidates": rows, "best": best,
                       "best_time_us": comparison.time_us(best, size)}
                      for size, rows, best in per_size],
            "envelope": [{"name": s.name, "from_bytes": fraction_text(s.from_bytes),
                          "to_bytes": fraction_text(s.to_bytes)} for s in envelope],
            "crossovers": [{"from": a, "to": b, "size_bytes": fraction_text(x),
                            "size_bytes_float": float(x)} for a, b, x in changes],
        }, indent=1))
        return EXIT_OK
    out(f"{coll} on {comparison.topology} ({n} ranks): closed-form model; NCCL's own tuning model")
    for note in comparison.notes:
        out(f"  {note}")
    cells = []
    for size, rows, best in per_size:
        for index, row in enumerate(rows):
            cells.append((format_size(size) if index == 0 else "", row["name"],
                          f"{row['time_us']:.3f}", f"{row['algbw_gbps']:.3f}",
                          f"{row['busbw_gbps']:.3f}", "*" if row["name"] == best else ""))
    for line in table(("size", "candidate", "time (us)", "algbw (GB/s)", "busbw (GB/s)",
                       "best"), cells, left=(0, 1, 5)):
        out(line)
    out("best: " + "; ".join(f"{format_size(size)} {best}" for size, _, best in per_size))
    if changes:
        out(f"crossovers between consecutive winners ({format_size(sizes[0])} to "
             f"{format_size(sizes[-1])}):")
        for a, b, x in changes:
            out(f"  {a} -> {b} at {fraction_text(x)} bytes ({format_size(x)})")
    else:
        out(f"no crossover: {envelope[0].name} is fastest from {format_size(sizes[0])} to "
             f"{format_size(sizes[-1])}")
    return EXIT_OK


def run_plot(args: argparse.Namespace) -> int:
    """Run ``collsynth plot``; return 0 (errors raise :class:`CollsynthError` or ``OSError``)."""
    from collsynth._output import check_output_file, open_atomic

    output = Path(args.output)
    if output.suffix.lower() not in (".png", ".svg"):
        raise UsageError.of("plot", f"-o {args.output}: expected a .png or .svg file")
    check_output_file(output, label=f"-o {args.output}")  # before any work
    algorithms, calibration = _load(args.files, args.calibration, unit_gbps=args.unit_gbps,
                                    alpha_us=args.alpha_us)
    comparison = compare(algorithms, calibration=calibration, device=args.device)
    lo, hi = args.sizes
    try:
        import matplotlib
    except ImportError as exc:
        raise CollsynthError("plot needs matplotlib (pip install matplotlib)") from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from collsynth.timing.metrics import busbw_gbps

    points = 121
    sizes = [lo * (hi / lo) ** (i / (points - 1)) for i in range(points)]
    coll, n = comparison.collective, comparison.num_ranks

    def metric(name: str, size: float) -> float:
        t = comparison.time_us(name, Fraction(repr(size)))
        return t if args.metric == "time" else busbw_gbps(coll, n, size, t)

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for name in comparison.algorithms:
        ax.loglog(sizes, [metric(name, s) for s in sizes], label=name)
    for family, names in comparison.families.items():
        values = [metric(comparison.best_of(names, Fraction(repr(s))), s) for s in sizes]
        ax.loglog(sizes, values, linestyle="--", label=f"{family} (best protocol)")
    for name in comparison.measured:
        ax.loglog(sizes, [metric(name, s) for s in sizes], linestyle="-.", label=name)
    for index, segment in enumerate(_envelope(comparison, lo, hi)[1:]):  # the fastest changes
        ax.axvline(float(segment.from_bytes), color="grey", linestyle=":", linewidth=0.8,
                   label="crossover: the fastest changes" if index == 0 else None)
    ax.set_xlabel(f"{coll} buffer size (bytes, nccl-tests convention)")
    ax.set_ylabel("predicted time (us)" if args.metric == "time" else "bus bandwidth (GB/s)")
    ax.set_title(f"{coll} on {comparison.topology} ({n} ranks)")
    ax.legend(fontsize=9)
    fig.tight_layout()
    try:
        with open_atomic(output, binary=True, label=f"-o {args.output}") as handle:
            fig.savefig(handle, format=output.suffix.lower().lstrip("."))
    finally:
        plt.close(fig)
    out(f"wrote {output}")
    return EXIT_OK


# -- parsers ------------------------------------------------------------------------------------


def _sizes_type(text: str) -> list[int]:
    return parse_sizes(text)


def _range_type(text: str) -> tuple[int, int]:
    return parse_size_range(text)


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("files", nargs="+", metavar="FILE",
                        help="algorithm files (ALGO.json; same collective and topology), or, "
                             "for time, MSCCL XML programs (FILE.xml, with --topology)")
    parser.add_argument("--calibration", metavar="FILE",
                        help="calibration file (collsynth calibrate): measured figures per step "
                             "and per unit, and the measured line of the collective")
    parser.add_argument("--device", metavar="NAME",
                        help="GPU whose reduction cost (gamma) is charged to combining "
                             "collectives: v100, a100-40gb, a100-80gb, h100, mi250, mi300x "
                             "(default: reductions are free)")
    add_figure_arguments(parser)


def register(subparsers: Any) -> None:
    """Add ``time`` and ``plot`` to ``subparsers`` (from ``add_subparsers``)."""
    parser = subparsers.add_parser(
        "time", help="predicted times of algorithms and NCCL's ring/tree",
        description="Predict the time, algbw and busbw of algorithm files and of NCCL's ring "
                    "and tree (its own tuning model, on the same topology) at given sizes, and "
                    "the exact sizes where the fastest changes. Sizes: B, KB/MB/GB (decimal), "
                    "KiB/MiB/GiB (binary).")
    _common(parser)
    parser.add_argument("--sizes", type=_sizes_type, default=parse_sizes("1KB,1MB,1GB"),
                        metavar="S1,S2,...", help="buffer sizes (default 1KB,1MB,1GB)")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    add_time_program_arguments(parser)
    parser.set_defaults(handler=run_time)

    parser = subparsers.add_parser(
        "plot", help="log-log plot of algorithms against NCCL's ring/tree",
        description="Plot predicted time or bus bandwidth against buffer size for algorithm "
                    "files and NCCL's ring and tree (best protocol per size).")
    _common(parser)
    parser.add_argument("--sizes", type=_range_type, default=(10**3, 10**9), metavar="FROM:TO",
                        help="size range (default 1KB:1GB)")
    parser.add_argument("--metric", choices=("time", "busbw"), default="time",
                        help="what to plot (default time)")
    parser.add_argument("-o", "--output", required=True, metavar="PATH",
                        help="image file: .png or .svg")
    parser.set_defaults(handler=run_plot)
