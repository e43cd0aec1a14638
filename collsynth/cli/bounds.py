"""``collsynth bounds``: lower bounds on the steps and rounds per chunk of any algorithm."""

from __future__ import annotations

import argparse
import json

from collsynth.bounds import compute_bounds
from collsynth.cli.common import EXIT_OK, out, problem_from_args, problem_parser

__all__ = ["register"]


def register(commands) -> None:
    """Add ``bounds`` to ``commands`` (from ``add_subparsers``)."""
    parser = commands.add_parser("bounds", parents=[problem_parser()],
                                 help="lower bounds on steps and rounds per chunk",
                                 description="Print lower bounds on the steps and the rounds per "
                                             "chunk of any algorithm.")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.set_defaults(handler=run_bounds)


def run_bounds(args: argparse.Namespace) -> int:
    topology, collective = problem_from_args(args)
    bounds = compute_bounds(topology, collective)
    if args.json:
        composed = bounds.composed_rounds_per_chunk
        out(json.dumps({
            "topology": topology.name,
            "num_ranks": topology.num_ranks,
            "collective": collective.describe(),
            "steps_lower_bound": bounds.steps,
            "rounds_per_chunk_lower_bound": str(bounds.rounds_per_chunk),
            "composed_steps_lower_bound": bounds.composed_steps,
            "composed_rounds_per_chunk_lower_bound": None if composed is None else str(composed),
        }, indent=1))
        return EXIT_OK
    out(f"{collective.describe()} on {topology.name} ({topology.num_ranks} ranks)")
    out(f"steps >= {bounds.steps}")
    out(f"rounds/chunk >= {bounds.rounds_per_chunk}")
    if bounds.composed_rounds_per_chunk is not None:
        out(f"as reduce-scatter then allgather: steps >= {bounds.composed_steps}, "
            f"rounds/chunk >= {bounds.composed_rounds_per_chunk}")
    return EXIT_OK
