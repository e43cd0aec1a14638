"""``collsynth solve``: synthesize one instance, the fewest steps, or the Pareto front of steps vs
rounds per chunk (``bandwidth-optimal``, for systems of any size, is in
:mod:`collsynth.cli.solve_bandwidth`). Found algorithms are written as soon as found.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from pathlib import Path
from typing import Any

from collsynth.algorithm.fileformat import algorithm_text
from collsynth.algorithm.model import Algorithm, Instance
from collsynth.bounds import Bounds, compute_bounds
from collsynth.cli import solve_bandwidth
from collsynth.errors import shown_path
from collsynth.runtimes import MSCCL_XML, runtime_names
from collsynth.cli.common import (
    EXIT_OK,
    EXIT_TIMEOUT,
    EXIT_UNSATISFIABLE,
    Parser,
    UsageError,
    check_unsplit,
    err,
    input_files,
    non_negative_int,
    out,
    path_argument,
    positive_int,
    problem_from_args,
    problem_parser,
    seconds,
    table,
)
from collsynth.collective.model import Collective
from collsynth.synthesis import (
    SolveOptions,
    Status,
    SweepLog,
    SynthesisResult,
    pareto_front,
    solve_instance,
    solve_least_steps,
)
from collsynth.topology.model import Topology

__all__ = ["register", "DEFAULT_TIME_LIMIT"]

DEFAULT_TIME_LIMIT = 300.0


def register(commands) -> None:
    """Add ``solve`` and its modes to ``commands`` (from ``add_subparsers``)."""
    problem = problem_parser()
    solving = Parser(add_help=False, parents=[problem])
    solving.add_argument("--backend", choices=("auto", "cpsat", "z3", "z3-path"), default="auto",
                         help="solver backend (default: auto = cpsat if installed)")
    solving.add_argument("--time-limit", type=seconds, default=DEFAULT_TIME_LIMIT,
                         metavar="SECONDS",
                         help="wall-clock limit for the whole search "
                              f"(default {DEFAULT_TIME_LIMIT:g})")
    solving.add_argument("-o", "--output", type=path_argument, metavar="PATH",
                         help="write algorithms here: a .json file for one algorithm, a directory "
                              "(created if needed) for one file per algorithm")
    solving.add_argument("--json", action="store_true",
                         help="machine-readable output on stdout (no progress lines)")
    solving.add_argument("-q", "--quiet", action="store_true",
                         help="no progress lines on stderr")
    solving.add_argument("--xml", type=path_argument, metavar="DIR",
                         help="also export every algorithm found as MSCCL XML into DIR "
                              "(checked before it is written)")
    solving.add_argument("--xml-runtime", choices=(*runtime_names(MSCCL_XML), "all"),
                         help="runtime for --xml (default msccl)")

    solve = commands.add_parser("solve", help="synthesize algorithms",
                                description="Synthesize algorithms: one instance, the fewest "
                                            "steps, or the Pareto front of steps vs rounds/chunk.")
    modes = solve.add_subparsers(dest="mode", metavar="MODE", required=True)

    instance = modes.add_parser("instance", parents=[solving],
                                help="an algorithm with exactly the given steps, rounds, chunks",
                                description="Find an algorithm with exactly --steps steps, "
                                            "--rounds rounds and --chunks chunks per base chunk.")
    instance.add_argument("--steps", type=positive_int, required=True, metavar="S")
    instance.add_argument("--rounds", type=positive_int, metavar="R",
                          help="total rounds (default: one per step)")
    instance.add_argument("--chunks", type=positive_int, default=1, metavar="C",
                          help="pieces per base chunk (default 1)")
    instance.add_argument("--extra-memory", type=non_negative_int, metavar="M",
                          help="most scratch chunks a rank may hold at once")
    instance.set_defaults(handler=run_solve)

    least = modes.add_parser("least-steps", parents=[solving],
                             help="the algorithm with the fewest steps",
                             description="Find the algorithm with the fewest steps (one round per "
                                         "step).")
    least.add_argument("--chunks", type=positive_int, default=1, metavar="C",
                       help="pieces per base chunk (default 1)")
    least.add_argument("--max-steps", type=positive_int, metavar="N",
                       help="give up after N steps")
    least.set_defaults(handler=run_solve)

    pareto = modes.add_parser("pareto", parents=[solving],
                              help="the Pareto front of steps vs rounds per chunk",
                              description="Find the Pareto-optimal algorithms (steps vs rounds per "
                                          "chunk), fewest steps first.")
    pareto.add_argument("--max-chunks", type=positive_int, metavar="N",
                        help="most pieces per base chunk to try (default: from the bounds, <= 8)")
    pareto.add_argument("--max-steps", type=positive_int, metavar="N",
                        help="most steps to try")
    pareto.add_argument("--instance-time-limit", type=seconds, metavar="SECONDS",
                        help="most seconds for any one instance (default: max(10, time limit / 5))")
    pareto.set_defaults(handler=run_solve)

    solve_bandwidth.add_mode(modes, problem)


def _describe_problem(topology: Topology, collective: Collective) -> str:
    return f"{collective.describe()} on {topology.name} ({topology.num_ranks} ranks)"


def _bounds_line(bounds: Bounds) -> str:
    text = f"lower bounds: steps >= {bounds.steps}, rounds/chunk >= {bounds.rounds_per_chunk}"
    if bounds.composed_rounds_per_chunk is not None:
        text += (f"; as reduce-scatter + allgather: steps >= {bounds.composed_steps}, "
                 f"rounds/chunk >= {bounds.composed_rounds_per_chunk}")
    return text


@dataclasses.dataclass(frozen=True)
class _Destination:
    """Where ``solve`` writes algorithms: nowhere, one file, or a directory of files; and the
    folder of ``--xml`` files."""

    file: Path | None = None
    directory: Path | None = None
    xml_directory: Path | None = None

    @staticmethod
    def plan(path: str | None, *, several: bool, xml: str | None = None,
             inputs: list[str] = ()) -> "_Destination":
        """Check ``-o PATH`` and ``--xml DIR`` before any solving, by the output policy of
        :mod:`collsynth._output`; the folders are created with their first file
        (:meth:`make_folders`), so a solve that finds nothing leaves nothing."""
        from collsynth._output import check_output_dir, check_output_file

        xml_directory = None if xml is None else check_output_dir(
            xml, label=f"--xml {shown_path(xml)}", create=False)
        if path is None:
            return _Destination(xml_directory=xml_directory)
        p = Path(path)
        as_directory = p.is_dir() or path.endswith(("/", os.sep)) or p.suffix == ""
        if not as_directory:
            if p.suffix.lower() != ".json":
                raise UsageError(f"-o {shown_path(path)}: expected a .json file or a directory")
            if several:
                raise UsageError(f"-o {shown_path(path)}: pareto writes one file per algorithm; "
                                 "give a directory")
            if xml is not None and os.path.abspath(xml) == os.path.abspath(path):
                # the --xml folder was made first, and -o then refused as a folder, left behind
                raise UsageError(f"-o {shown_path(path)} and --xml {shown_path(xml)} name one "
                                 "path; --xml is a folder of its own for the XML files")
            return _Destination(file=check_output_file(path, label=f"-o {shown_path(path)}",
                                                       inputs=inputs),
                                xml_directory=xml_directory)
        return _Destination(directory=check_output_dir(path, label=f"-o {shown_path(path)}",
                                                       create=False),
                            xml_directory=xml_directory)

    def make_folders(self) -> None:
        """Create the folders (one level) when missing, just before a file goes in them."""
        from collsynth._output import check_output_dir

        for folder, flag in ((self.directory, "-o"), (self.xml_directory, "--xml")):
            if folder is not None:
                check_output_dir(folder, label=f"{flag} {folder}")

    def path_for(self, algorithm: Algorithm) -> Path | None:
        from collsynth._output import path_in

        if self.file is not None:
            return self.file
        if self.directory is not None:
            return path_in(self.directory, algorithm.name, suffix=".json", default="algorithm")
        return None


def _save(result: SynthesisResult, destination: _Destination, args: argparse.Namespace,
          topology: Topology, collective: Collective) -> Path | None:
    """Name, stamp and write a found algorithm; return the path written (``None``: not asked)."""
    algorithm = result.algorithm
    if algorithm is None:
        return None
    from collsynth import __version__

    name = (f"{collective.name}-{topology.name}-s{algorithm.num_steps}-r{algorithm.num_rounds}"
            f"-c{algorithm.chunks}")
    algorithm = dataclasses.replace(algorithm, name=name, provenance={
        **dict(algorithm.provenance),
        "collsynth": __version__,
        "command": f"solve {args.mode}",
        "topology": args.topology,
        "collective": args.collective,
        "backend": result.backend,
        "detail": result.detail,
        "seconds": round(result.seconds, 3),
    })
    from collsynth._output import path_in, write_all_atomic

    # Every file of this algorithm (its JSON, its XML for each runtime) made first, then
    # written together: a failed export leaves none of them.
    files: dict[Path, str] = {}
    path = destination.path_for(algorithm)
    if path is not None:
        files[path] = algorithm_text(algorithm, extra_memory=result.instance.extra_memory)
    if destination.xml_directory is not None:
        from collsynth.export.pipeline import export_programs

        xml_runtime = args.xml_runtime or "msccl"
        runtimes = runtime_names(MSCCL_XML) if xml_runtime == "all" else [xml_runtime]
        exported = export_programs(algorithm, runtimes, subject=name)
        for runtime in runtimes:  # the name holds the collective's: kept inside the folder
            files[path_in(destination.xml_directory, name, suffix=f".{runtime}.xml")] = \
                exported[runtime].text
    if files:
        destination.make_folders()
        write_all_atomic(files)
    return path


def _result_json(result: SynthesisResult, path: Path | None) -> dict[str, Any]:
    instance = result.instance
    return {
        "steps": instance.steps,
        "rounds": instance.total_rounds,
        "chunks": instance.chunks,
        "rounds_per_chunk": str(instance.rounds_per_chunk),
        "status": result.status.value,
        "seconds": round(result.seconds, 4),
        "file": None if path is None else str(path),
        "backend": result.backend,
        "detail": result.detail,
    }


def _progress(result: SynthesisResult) -> None:
    err(f"  {result.instance.label()}: {result.status.value} ({result.seconds:.2f} s)")


def _heartbeat(line: str) -> None:
    err(f"  {line}")


def run_solve(args: argparse.Namespace) -> int:
    several = args.mode == "pareto"
    if args.mode == "instance" and args.rounds is not None and args.rounds < args.steps:
        # the options disagree, before any work: the instance's own rule, said in their names
        raise UsageError.of("solve instance", f"--rounds {args.rounds}: expected --rounds >= "
                                              f"--steps ({args.steps}): every step lasts at "
                                              "least one round")
    topology, collective = problem_from_args(args)
    check_unsplit(collective, args.collective)
    if args.xml_runtime is not None and args.xml is None:  # it would be ignored
        raise UsageError(f"--xml-runtime {args.xml_runtime} goes with --xml DIR")
    destination = _Destination.plan(args.output, several=several, xml=args.xml,
                                    inputs=input_files(args.topology, args.collective))
    quiet = args.quiet or args.json
    options = SolveOptions(
        backend=args.backend,
        time_limit=args.time_limit,
        instance_time_limit=getattr(args, "instance_time_limit", None),
        on_result=None if quiet else _progress,
        on_progress=None if quiet else _heartbeat,   # a line at least every 5 s while solving
    )
    if several:
        return _solve_pareto(args, topology, collective, options, destination)

    if args.mode == "instance":
        instance = Instance(steps=args.steps, rounds=args.rounds, chunks=args.chunks,
                            extra_memory=args.extra_memory)
    if not args.json:
        out(_describe_problem(topology, collective))
    try:
        if args.mode == "instance":
            result = solve_instance(topology, collective, instance, options=options)
        else:
            result = solve_least_steps(topology, collective, chunks=args.chunks,
                                       max_steps=args.max_steps, options=options)
    except KeyboardInterrupt:  # outside the solver (the strategies return INTERRUPTED in it)
        if args.json:
            out("[]")
        else:
            out("interrupted: no algorithm found")
        return EXIT_TIMEOUT
    path = _save(result, destination, args, topology, collective)
    if args.json:
        out(json.dumps([_result_json(result, path)], indent=1))
    else:
        _print_single(result, path, args)
    if result.found:
        return EXIT_OK
    return EXIT_UNSATISFIABLE if result.status is Status.UNSAT else EXIT_TIMEOUT


def _print_single(result: SynthesisResult, path: Path | None, args: argparse.Namespace) -> None:
    instance = result.instance
    timing = f"({result.seconds:.2f} s, {result.backend})"
    if result.found:
        out(f"found: {instance.label()} rounds/chunk={instance.rounds_per_chunk} {timing}")
        if args.mode == "least-steps" and result.detail:
            out(f"fewer steps: {result.detail}")
        if path is not None:
            out(f"wrote {shown_path(path)}")
        elif not args.quiet:
            err("(not saved: pass -o FILE.json to write the algorithm)")
    elif result.status is Status.UNSAT:
        what = ("no algorithm with at most {} steps".format(instance.steps)
                if args.mode == "least-steps" else "no algorithm exists for this instance")
        out(f"unsat: {instance.label()} {timing}: {what}")
    elif result.status is Status.INTERRUPTED:
        out(f"interrupted: {instance.label()} {timing}: no algorithm found before Ctrl-C")
    else:
        detail = f"; {result.detail}" if result.status is Status.UNKNOWN and result.detail else ""
        out(f"{result.status.value}: {instance.label()} {timing}: no algorithm found within the "
             f"time limit ({args.time_limit:g} s){detail}")


def _solve_pareto(args: argparse.Namespace, topology: Topology, collective: Collective,
                  options: SolveOptions, destination: _Destination) -> int:
    if not args.json:
        out(_describe_problem(topology, collective))
        out(_bounds_line(compute_bounds(topology, collective)))
    log = SweepLog()
    front: list[tuple[SynthesisResult, Path | None]] = []
    interrupted = False
    try:
        for result in pareto_front(topology, collective, max_chunks=args.max_chunks,
                                   max_steps=args.max_steps, options=options, log=log):
            front.append((result, None))
            # Written as soon as found, so a later Ctrl-C or crash keeps it.
            front[-1] = (result, _save(result, destination, args, topology, collective))
    except KeyboardInterrupt:  # while writing; in the search, pareto_front ends and logs it
        interrupted = True
    interrupted = interrupted or log.interrupted
    if args.json:
        out(json.dumps([_result_json(r, p) for r, p in front], indent=1))
    else:
        if front:
            rows = [(str(r.instance.steps), str(r.instance.total_rounds), str(r.instance.chunks),
                     str(r.rounds_per_chunk), f"{r.seconds:.2f}", "-" if p is None else str(p))
                    for r, p in front]
            for line in table(("steps", "rounds", "chunks", "rounds/chunk", "seconds", "file"),
                               rows, left=(5,)):
                out(line)
        else:
            out("no algorithm found")
        out(_completeness(log, interrupted, args.time_limit))
    if interrupted:  # what was found is printed and written, but the front may be incomplete
        return EXIT_TIMEOUT
    if front:
        return EXIT_OK
    if not log.complete:
        return EXIT_TIMEOUT
    return EXIT_UNSATISFIABLE


def _completeness(log: SweepLog, interrupted: bool, time_limit: float) -> str:
    """One line on whether the front printed is the whole front."""
    if interrupted:
        return "interrupted: the front above is what was found before Ctrl-C; it may be incomplete"
    if log.complete:
        return f"complete: {log.stopped_by}" if log.stopped_by else "complete"
    if log.stopped_by == "time limit":
        return (f"incomplete: stopped by the time limit ({time_limit:g} s); raise --time-limit to "
                "search further")
    timeouts = sum(1 for a in log.attempts if a.status in (Status.TIMEOUT, Status.UNKNOWN))
    reason = f"{timeouts} instance(s) timed out, so points after them are the best found, " \
             "not proven optimal" if timeouts else "the search was cut short"
    return f"incomplete: {reason}" + (f" ({log.stopped_by})" if log.stopped_by else "")


