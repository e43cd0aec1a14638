"""``collsynth solve bandwidth-optimal``: the large-system engines, for systems of any size.

Prints the verified algorithm, its rounds per chunk (and its pipeline's steady state) against the
lower bound, and, when the topology has physical figures, its predicted time next to the fastest
of NCCL's own algorithms at each size, named (alpha-beta model, :mod:`collsynth.timing`).
"""

from __future__ import annotations

import argparse
import json
import time

from collsynth.cli.common import (EXIT_OK, UsageError, check_unsplit, err, format_size,
                                  input_files, out, parse_size, path_argument, positive_int,
                                  problem_from_args, seconds)
from collsynth.errors import shown_path
from collsynth.timing.closed_form import PREDICTION_SIZES, predicted_against_runtime

__all__ = ["add_mode", "run_bandwidth_optimal"]


def add_mode(modes, problem: argparse.ArgumentParser) -> None:
    """Add ``bandwidth-optimal`` to the ``solve`` modes; ``problem`` is the parent parser of
    ``TOPOLOGY COLLECTIVE``."""
    parser = modes.add_parser(
        "bandwidth-optimal", parents=[problem],
        help="a schedule with the optimal throughput, for systems of any size",
        description="Pick an engine by size (exact SMT up to 8 ranks and for gather, scatter "
                    "and custom collectives; optimal tree packing for allgather, reduce-scatter, "
                    "broadcast, reduce and allreduce; the direct or hierarchical schedule for "
                    "alltoall; --engine hierarchical for the node + NIC baseline) and print the "
                    "verified algorithm with its rounds per chunk and lower bound.")
    parser.add_argument("--engine", choices=("auto", "trees", "hierarchical", "alltoall", "exact"),
                        default="auto", help="engine (default: auto, by size and collective)")
    parser.add_argument("--stages", type=positive_int, metavar="P",
                        help="pipeline stages of the tree schedule (default: 16 x (depth - 1), within 16M sends)")
    parser.add_argument("--size", type=parse_size, metavar="BYTES",
                        help="tune the pipeline for this buffer size (nccl-tests convention, e.g. "
                             "64MiB): stages minimising the alpha-beta time; also predicted")
    parser.add_argument("--time-limit", type=seconds, default=600.0, metavar="SECONDS",
                        help="seconds for the search (default 600)")
    parser.add_argument("-o", "--output", type=path_argument, metavar="FILE",
                        help="write the algorithm as a JSON algorithm file (a compact schedule: "
                             "with --expand)")
    shape = parser.add_mutually_exclusive_group()
    shape.add_argument("--expand", action="store_true",
                       help="build every send even where the schedule is kept compact (by "
                            "default above 1024 ranks: node 0's template and the node shift, "
                            "verified through the symmetry)")
    shape.add_argument("--compact", action="store_true",
                       help="keep a symmetric allgather, reduce-scatter or allreduce compact "
                            "at any size")
    parser.add_argument("--json", action="store_true", help="machine-readable output on stdout")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")
    parser.set_defaults(handler=run_bandwidth_optimal)


def run_bandwidth_optimal(args: argparse.Namespace) -> int:
    from collsynth.limits import TimeLimitReached
    from collsynth.synthesis.large import solve_large

    started = time.perf_counter()
    _refuse_what_cannot_fit(args)
    topology, collective = problem_from_args(args)
    check_unsplit(collective, args.collective)
    compact = True if args.compact else (False if args.expand else None)
    if args.output and args.compact:
        raise UsageError.of("solve", "-o writes every send: leave out --compact")
    if args.output:  # before the search, not after it
        from collsynth._output import check_output_file

        check_output_file(args.output, label=f"-o {shown_path(args.output)}",
                          inputs=input_files(args.topology, args.collective))
    progress = None if (args.quiet or args.json) else (
        lambda line: err(f"  {line}"))
    left = args.time_limit - (time.perf_counter() - started)  # building the topology counts
    if left <= 0:
        raise TimeLimitReached(f"time limit of {args.time_limit:g} s reached while building the "
                               "topology; nothing found (raise --time-limit)")
    result = solve_large(topology, collective, engine=args.engine, stages=args.stages,
                         size_bytes=args.size, time_limit=left, progress=progress,
                         compact=compact)
    if args.output:
        from collsynth.algorithm.fileformat import save_algorithm
        from collsynth.limits import check_memory
        from collsynth.synthesis.bandwidth_optimal.engine import BYTES_PER_SEND

        sends = result.schedule.num_sends
        check_memory(sends * BYTES_PER_SEND,
                     f"-o {shown_path(args.output)}: writing all {sends} sends")
        save_algorithm(result.expanded(), args.output)
    figures = result.to_json()
    sizes = sorted(set(PREDICTION_SIZES) | ({args.size} if args.size else set()))
    figures["predicted_us"] = [row.as_dict()
                               for row in predicted_against_runtime(result.schedule, sizes)]
    if args.json:
        out(json.dumps(figures, indent=2))
        return EXIT_OK
    held = result.schedule
    out(f"{collective.describe()} on {topology.name} ({topology.num_ranks} ranks), engine "
        f"{figures['engine']}")
    if result.compact is not None:
        out(f"compact schedule: {held.num_steps} steps, {held.num_rounds} rounds, "
            f"{result.chunks} chunks, {held.template_sends} template sends x "
            f"{held.shift.nodes} images under the symmetry = {held.num_sends} sends (verified "
            "through the symmetry; --expand builds every send)")
    else:
        out(f"algorithm: {held.num_steps} steps, {held.num_rounds} rounds, "
            f"{held.chunks} chunks, {held.num_sends} sends (verified)")
    out(f"rounds/chunk: {figures['rounds_per_chunk']}; steady state "
        f"{figures['steady_state_rounds_per_chunk']}; lower bound {figures['lower_bound']}"
        f" -> {'optimal' if figures['optimal'] else 'not proven optimal'}")
    out(f"seconds: {figures['seconds']}")
    if figures["predicted_us"]:
        out("predicted time (us)   collsynth   fastest NCCL   (which)")
        for row in figures["predicted_us"]:
            fastest = "-" if row["runtime_fastest_us"] is None else \
                f"{row['runtime_fastest_us']:.1f}"
            out(f"{format_size(row['bytes']):>18}   {row['collsynth']:>9.1f}   {fastest:>12}   "
                f"{row['runtime_fastest'] or '-'}")
    if args.output:
        out(f"wrote {shown_path(args.output)}")
    return EXIT_OK


def _refuse_what_cannot_fit(args: argparse.Namespace) -> None:
    """With ``--nodes``, refuse a standard collective whose fewest sends cannot fit, before
    composing the system (minutes and gigabytes at thousands of ranks)."""
    if not args.nodes or args.engine not in ("auto", "trees"):
        return
    if not args.expand and args.collective.strip().lower() in ("allgather", "reduce_scatter",
                                                               "allreduce"):
        return  # possibly kept compact: the engine refuses what its own path cannot hold
    from collsynth.collective.standard import STANDARD_COLLECTIVES
    from collsynth.resolve import resolve_topology
    from collsynth.synthesis.bandwidth_optimal.engine import check_request_fits

    name = args.collective.strip().lower()
    if name not in STANDARD_COLLECTIVES:
        return
    ranks = resolve_topology(args.topology).num_ranks * args.nodes
    check_request_fits(ranks, name, stages=args.stages, time_limit=args.time_limit)
