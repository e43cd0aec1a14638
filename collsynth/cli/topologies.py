"""``collsynth topologies``: the built-in topologies and families."""

from __future__ import annotations

import argparse
import json

from collsynth.cli.common import EXIT_OK, out, table
from collsynth.topology.builtins import list_topologies

__all__ = ["register"]


def register(commands) -> None:
    """Add ``topologies`` to ``commands`` (from ``add_subparsers``)."""
    parser = commands.add_parser("topologies", help="list the built-in topologies",
                                 description="List the built-in topologies and families.")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.set_defaults(handler=run_topologies)


def run_topologies(args: argparse.Namespace) -> int:
    rows = list_topologies()
    if args.json:
        out(json.dumps([{"name": name, "ranks": ranks, "description": description}
                        for name, ranks, description in rows], indent=1))
        return EXIT_OK
    cells = [(name, "N" if ranks is None else str(ranks), description)
             for name, ranks, description in rows]
    for line in table(("name", "ranks", "description"), cells, left=(0, 2)):
        out(line)
    return EXIT_OK
