"""``collsynth calibrate``: fit cost models to benchmark logs and save a calibration file.

::

    collsynth calibrate LOG... --topology NAME [--nodes K] -o FILE [--plot PATH] [--json]
                               [--collective NAME] [--ranks N] [--runtime NAME] [--channels N]

Each ``LOG`` (nccl-tests text or JSON output, PARAM comms output, or a plain CSV with
``size_bytes,time_us`` columns; see :mod:`collsynth.timing.logs`) is read and fitted with both
models of :mod:`collsynth.timing.fit` (the alpha-beta line and the piecewise bus-bandwidth curve);
the figures go to ``FILE`` as a calibration for the machine ``NAME`` (``--nodes K``: K of them;
:mod:`collsynth.timing.calibration`), which ``collsynth time --calibration FILE`` reads. ``--plot``
draws measured against fitted (PNG or SVG, by suffix). ``--collective``, ``--ranks``,
``--runtime`` (``rccl``, ``rccl-2.18.3``) and ``--channels`` say what a log does not (and
override what it says); a log's own ``NCCL version`` / ``RCCL version`` banner and channel lines
are recorded otherwise.

Output: a table, one line per log and model (``gmae`` and ``heldout`` as percentages); with
``--json``, a JSON list with one object per log and model: ``file``, ``collective``, ``ranks``,
``model`` (``"alpha-beta"`` or ``"piecewise"``), ``runtime``, ``runtime_version`` and
``channels`` when known, the fitted figures (``alpha_us``, ``busbw_gbps``; for the alpha-beta line
also ``beta_us_per_byte``, ``algbw_gbps``, ``latency_max_bytes``, ``bandwidth_min_bytes``; for the
piecewise curve ``min_bytes``, ``latency_exponent``, ``knee_bytes``, ``saturation_bytes``,
``center_bytes``, ``steepness``), ``gmae``, ``gmae_rows`` and ``gmae_heldout`` (fractions; the
last is the error on the sizes a fit to every other size did not see, absent below three sizes).
Exit status 0 when the file was written, 1 for an unreadable log or an unwritable file (nothing
is written then), 2 for usage errors.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
from pathlib import Path
from typing import Any

from collsynth.cli.common import positive_int
from collsynth.timing.calibration import (
    calibration_from_fits,
    calibration_to_json,
    save_calibration,
)
from collsynth.timing.fit import FIGURE_FORMATS, LogFits, fit_log, plot_fits, save_figure
from collsynth.timing.logs import load_log

__all__ = ["add_calibrate_parser", "run_calibrate"]

_EXIT_OK = 0


def _plot_path(text: str) -> str:
    if Path(text).suffix.lower() not in FIGURE_FORMATS:
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected a file ending in {' or '.join(FIGURE_FORMATS)}")
    return text


def add_calibrate_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``calibrate`` subcommand to ``subparsers``; its handler is :func:`run_calibrate`."""
    parser = subparsers.add_parser(
        "calibrate", help="fit cost models to nccl-tests / PARAM logs",
        description="Fit an alpha-beta line and a piecewise bus-bandwidth curve to each "
                    "benchmark log (nccl-tests text or JSON output, PARAM comms output, a CSV "
                    "with size_bytes,time_us columns) and save the figures as a calibration "
                    "file.")
    parser.add_argument("logs", nargs="+", metavar="LOG", help="benchmark log files")
    parser.add_argument("--topology", required=True, metavar="NAME",
                        help="the machine the logs were measured on (recorded in the file)")
    parser.add_argument("--nodes", type=positive_int, default=1, metavar="K",
                        help="the logs were measured on K such machines (recorded; default 1)")
    parser.add_argument("-o", "--output", required=True, metavar="FILE",
                        help="calibration file to write (JSON)")
    parser.add_argument("--plot", type=_plot_path, metavar="PATH",
                        help="also draw measured vs fitted, one row per log (.png or .svg)")
    parser.add_argument("--collective", metavar="NAME",
                        help="the collective of logs that do not say (e.g. allreduce)")
    parser.add_argument("--ranks", type=positive_int, metavar="N",
                        help="the rank count of logs that do not say")
    parser.add_argument("--runtime", metavar="NAME",
                        help="the runtime the logs were measured with, and its version if known "
                             "(rccl, nccl-2.18.3), for logs that do not say")
    parser.add_argument("--channels", type=positive_int, metavar="N",
                        help="the runtime's channel count in the logs, for logs that do not say")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.set_defaults(handler=run_calibrate)
    return parser


def run_calibrate(args: argparse.Namespace) -> int:
    """Handle ``collsynth calibrate``: read and fit every log, then write the file(s).

    Errors (:class:`~collsynth.errors.CollsynthError`, :class:`OSError`) propagate to the
    command line's ``main``, which prints them and maps them to exit codes; nothing is written
    unless every log was read and fitted.
    """
    from collsynth._output import check_output_file, write_bytes_atomic

    check_output_file(args.output, label=f"-o {args.output}")  # before reading any log
    if args.plot:
        check_output_file(args.plot, label=f"--plot {args.plot}")
    results: list[LogFits] = []
    for path in args.logs:
        log = load_log(path, collective=args.collective, ranks=args.ranks,
                       runtime=args.runtime, channels=args.channels)
        results.append(fit_log(log))
    calibration = calibration_from_fits(args.topology, results, nodes=args.nodes)
    figure_bytes = None
    if args.plot:
        buffer = io.BytesIO()
        save_figure(plot_fits(results), buffer, format=Path(args.plot).suffix.lstrip("."))
        figure_bytes = buffer.getvalue()
    save_calibration(calibration, args.output)
    if figure_bytes is not None:
        write_bytes_atomic(args.plot, figure_bytes, label=f"--plot {args.plot}")
    entries = calibration_to_json(calibration)["entries"]
    out = sys.stdout
    if args.json:
        print(json.dumps(entries, indent=1), file=out, flush=True)
        return _EXIT_OK
    for line in _table(entries):
        print(line, file=out)
    written = f"wrote {args.output}" + (f" and {args.plot}" if args.plot else "")
    machine = args.topology + (f" x {args.nodes} nodes" if args.nodes > 1 else "")
    print(f"{written} (calibration for {machine!r}, {len(results)} log"
          f"{'s' if len(results) != 1 else ''})", file=out, flush=True)
    return _EXIT_OK


def _table(entries: list[dict[str, Any]]) -> list[str]:
    headers = ("file", "collective", "ranks", "runtime", "channels", "model", "alpha_us",
               "busbw_gbps", "knee_bytes", "saturation_bytes", "gmae", "heldout")
    rows = []
    for e in entries:
        runtime = " ".join(e[k] for k in ("runtime", "runtime_version") if k in e) or "-"
        heldout = f"{100 * e['gmae_heldout']:.1f}%" if "gmae_heldout" in e else "-"
        rows.append((
            Path(e["file"]).name, e["collective"], str(e["ranks"]), runtime,
            str(e.get("channels", "-")), e["model"],
            f"{e['alpha_us']:.2f}", f"{e['busbw_gbps']:.1f}",
            str(e.get("knee_bytes", "-")), str(e.get("saturation_bytes", "-")),
            f"{100 * e['gmae']:.1f}%", heldout,
        ))
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(headers)]
    left = (0, 1, 3, 5)

    def line(cells: tuple[str, ...]) -> str:
        return "  ".join(c.ljust(w) if i in left else c.rjust(w)
                         for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    return [line(headers)] + [line(r) for r in rows]
