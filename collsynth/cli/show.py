"""``collsynth show``: an algorithm file (verified first), step by step."""

from __future__ import annotations

import argparse

from collsynth.algorithm.fileformat import load_algorithm
from collsynth.algorithm.show import format_algorithm
from collsynth.cli.common import EXIT_OK, non_negative_int, out

__all__ = ["register"]


def register(commands) -> None:
    """Add ``show`` to ``commands`` (from ``add_subparsers``)."""
    parser = commands.add_parser("show", help="print an algorithm file step by step",
                                 description="Print an algorithm file (verified first) step by "
                                             "step.")
    parser.add_argument("file", metavar="FILE")
    parser.add_argument("--max-sends", type=non_negative_int, metavar="N",
                        help="show at most N links per step")
    parser.set_defaults(handler=run_show)


def run_show(args: argparse.Namespace) -> int:
    out(format_algorithm(load_algorithm(args.file), max_sends_per_step=args.max_sends))
    return EXIT_OK
