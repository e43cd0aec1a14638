"""``collsynth draw``: a picture of a schedule, one panel per step (:mod:`collsynth.draw`).

An algorithm file carries its topology; an MSCCL XML program needs ``--topology``. The output path
is checked before any work and written atomically.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from collsynth.cli.common import (EXIT_OK, UsageError, node_count, out, path_argument,
                                  positive_int)
from collsynth.draw import (FIGURE_SUFFIXES, DrawError, DrawOptions, StepRangeError,
                            check_output_path, draw_file, file_kind, parse_step_range,
                            save_drawing)
from collsynth.errors import shown_path
from collsynth.resolve import resolve_topology

__all__ = ["register", "run_draw"]

#: The resolution of a PNG, and of the heat maps in an SVG, without ``--dpi``.
DEFAULT_DPI = 100


def _steps(text: str) -> tuple[int, int]:
    try:
        return parse_step_range(text)
    except DrawError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _dpi(text: str) -> int:
    value = positive_int(text)
    if not 20 <= value <= 600:
        raise argparse.ArgumentTypeError(f"expected a resolution from 20 to 600, got {text!r}")
    return value


def register(subparsers: Any) -> None:
    """Add ``draw`` to ``subparsers`` (from ``add_subparsers``)."""
    parser = subparsers.add_parser(
        "draw", help="draw a schedule step by step (PNG or SVG)",
        description="Draw an algorithm file or an MSCCL XML program, one panel per step on the "
                    "topology's layout: arrows coloured by chunk, wider for more chunks, solid "
                    "where the link is used at its capacity. Large schedules (more than 32 "
                    "ranks or 2000 sends) are drawn as link-load heat maps.")
    parser.add_argument("file", metavar="FILE", help="algorithm file (JSON) or MSCCL XML program")
    parser.add_argument("-o", "--output", type=path_argument, required=True, metavar="OUT",
                        help="the picture: a .png or .svg file (its folder must exist)")
    parser.add_argument("--steps", type=_steps, metavar="A-B",
                        help="draw steps A to B (from 0, as 'collsynth show' numbers them)")
    parser.add_argument("--topology", metavar="T",
                        help="for an XML program: the topology, its ranks in the program's order")
    parser.add_argument("--nodes", type=node_count, metavar="K",
                        help="with --topology: K copies of it joined by their NICs")
    parser.add_argument("--style", choices=("auto", "arrows", "heatmap"), default="auto",
                        help="arrows, heat maps, or auto (heat maps for large schedules)")
    parser.add_argument("--aggregate", action="store_true",
                        help="heat maps: one matrix summed over the steps drawn")
    parser.add_argument("--dpi", type=_dpi, metavar="N",
                        help="resolution of a PNG, or of the heat maps in an SVG (default "
                             f"{DEFAULT_DPI})")
    parser.set_defaults(handler=run_draw)


def run_draw(args: argparse.Namespace) -> int:
    """Run ``collsynth draw``; return 0 (errors raise :class:`CollsynthError` or ``OSError``)."""
    # The suffix as pathlib reads it: '.png' alone is a hidden file with none, not a PNG.
    if Path(args.output).suffix.lower() not in FIGURE_SUFFIXES:
        raise UsageError.of("draw", f"-o {shown_path(args.output)}: expected a .png or .svg file")
    if args.nodes is not None and args.topology is None:
        raise UsageError.of("draw", "--nodes goes with --topology")
    if args.aggregate and args.style == "arrows":
        raise UsageError.of("draw", "--aggregate sums heat maps; it does not go with --style "
                                    "arrows")
    output = check_output_path(args.output)  # before any work
    kind = file_kind(args.file)
    if kind == "xml" and args.topology is None:
        raise UsageError.of("draw", f"{shown_path(args.file)}"
                                    " is an MSCCL XML program, which does not say "
                                    "its topology: give --topology (its ranks in the program's "
                                    "order)")
    if kind == "json" and args.topology is not None:
        # Not every JSON file is an algorithm file: its reader says what one is not (an MSCCL++
        # plan, a calibration) and what draw takes instead.
        from collsynth.algorithm.fileformat import load_algorithm

        load_algorithm(args.file)
        raise UsageError.of("draw", f"{shown_path(args.file)}"
                                    " is an algorithm file, which carries its "
                                    "topology: --topology is for XML programs")
    topology = None if args.topology is None else resolve_topology(args.topology,
                                                                    nodes=args.nodes)
    # --aggregate asks for the summed heat map, whatever size 'auto' would draw arrows for.
    style = "heatmap" if args.aggregate and args.style == "auto" else args.style
    options = DrawOptions(steps=args.steps, style=style,
                          aggregate=True if args.aggregate else None)
    try:
        figure = draw_file(args.file, topology=topology, options=options)
    except StepRangeError as exc:  # what --steps asks of this file: as --root 9 of 8 ranks
        raise UsageError.of("draw", f"--steps: {exc}") from None
    if args.dpi is not None and output.suffix.lower() == ".svg" and \
            not any(axes.images for axes in figure.axes):
        # an SVG of arrows is all vectors: the resolution would change nothing in it
        raise UsageError.of("draw", f"--dpi {args.dpi}: an SVG of arrows has no resolution "
                                    "(--dpi sets a PNG's, or the heat maps' in an SVG); leave "
                                    "--dpi out or write a .png")
    save_drawing(figure, output, dpi=DEFAULT_DPI if args.dpi is None else args.dpi)
    out(f"wrote {shown_path(output)}")
    return EXIT_OK
