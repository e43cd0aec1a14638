"""``collsynth verify``: replay an algorithm file and check it implements its collective."""

from __future__ import annotations

import argparse

from collsynth.algorithm.fileformat import load_algorithm
from collsynth.cli.common import EXIT_OK, out
from collsynth.errors import shown_path

__all__ = ["register"]


def register(commands) -> None:
    """Add ``verify`` to ``commands`` (from ``add_subparsers``)."""
    parser = commands.add_parser("verify", help="check an algorithm file",
                                 description="Replay an algorithm file and check it implements "
                                             "its collective on its topology.")
    parser.add_argument("file", metavar="FILE")
    parser.set_defaults(handler=run_verify)


def run_verify(args: argparse.Namespace) -> int:
    """A wrong algorithm fails to load (:class:`~collsynth.errors.VerificationError`, exit 1)."""
    a = load_algorithm(args.file)
    out(f"{shown_path(args.file)}: correct {a.collective.describe()} on {a.topology.name} "
        f"(steps={a.num_steps}, rounds={a.num_rounds}, chunks={a.chunks}, "
        f"rounds/chunk={a.rounds_per_chunk})")
    return EXIT_OK
