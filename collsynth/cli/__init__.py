"""The ``collsynth`` command line.

Each subcommand turns its arguments into values, makes one library call and writes the result;
:func:`main` is the one place where exceptions become exit codes (see :data:`EXIT_CODES`)::

    collsynth topologies [--json]
    collsynth bounds TOPOLOGY COLLECTIVE [--root R] [--nodes K] [--json]
    collsynth solve instance TOPOLOGY COLLECTIVE --steps S [--rounds R] [--chunks C]
                                                 [--extra-memory M]
    collsynth solve least-steps TOPOLOGY COLLECTIVE [--chunks C] [--max-steps N]
    collsynth solve pareto TOPOLOGY COLLECTIVE [--max-chunks N] [--max-steps N]
    collsynth solve bandwidth-optimal TOPOLOGY COLLECTIVE [--nodes K] [--oversubscription X]
                                                 [--engine E] [--stages P] [--json]
    collsynth plan TRACE_DIR --topology NAME [--nodes K] [--calibration FILE] -o PLAN_DIR
    collsynth bench FILE.xml|ALGO.json --ranks N --runtime R [--dry-run] [--sizes A:B] [-o DIR]
    collsynth trace summarize DIR [--json] [--merged]
    collsynth show FILE [--max-sends N]
    collsynth draw FILE -o OUT.png|OUT.svg [--steps A-B] [--topology T]
    collsynth verify FILE

``TOPOLOGY`` is a built-in name (``collsynth topologies``), a family member (``ring:8``,
``torus:4x4``) or a file (topology JSON, NCCL topology XML, ``nvidia-smi topo -m`` output...);
``--unit-gbps`` / ``--alpha-us`` (or ``NAME,unit_gbps=GBPS,alpha_us=US``) give it physical figures. ``COLLECTIVE`` is a standard
name (``allgather``, ``reduce_scatter``, ``broadcast``...) or a custom collective JSON file.

Results go to stdout (``--json`` for machine-readable output); progress, one line per instance
tried, and errors, one line each, go to stderr.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from fractions import Fraction
from pathlib import Path
from typing import Any

from collsynth.cli.common import (  # noqa: F401 (re-exported: the exit codes are cli's API)
    EXIT_CODES,
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_TIMEOUT,
    EXIT_UNSATISFIABLE,
    EXIT_USAGE,
    PROG,
    Parser as _Parser,
    UsageError as _UsageError,
    problem_from_args as _problem,
    table as _table,
)
from collsynth.cli.common import (add_fabric_arguments, add_figure_arguments, non_negative_int,
                                parse_size, positive_int, seconds)
from collsynth.algorithm.fileformat import load_algorithm, save_algorithm
from collsynth.algorithm.model import Algorithm, Instance
from collsynth.algorithm.show import format_algorithm
from collsynth.bounds import Bounds, compute_bounds
from collsynth.collective.model import Collective
from collsynth.errors import CollsynthError, UnimplementableError
from collsynth.synthesis import (
    SolveOptions,
    Status,
    SweepLog,
    SynthesisResult,
    pareto_front,
    solve_instance,
    solve_least_steps,
)
from collsynth.topology.builtins import list_topologies
from collsynth.topology.model import Topology

__all__ = ["main", "run", "EXIT_OK", "EXIT_ERROR", "EXIT_USAGE", "EXIT_UNSATISFIABLE",
           "EXIT_TIMEOUT", "EXIT_INTERRUPTED", "EXIT_CODES"]

DEFAULT_TIME_LIMIT = 300.0


# -- argument types ---------------------------------------------------------------------------


def _ranks(text: str) -> list[int]:
    try:
        ranks = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a rank or ranks separated by commas (0 or 0,4), got {text!r}") from None
    if any(r < 0 for r in ranks):
        raise argparse.ArgumentTypeError(f"ranks are >= 0, got {text!r}")
    return ranks


# -- the parser ---------------------------------------------------------------------------------


def _build_parser() -> _Parser:
    from collsynth import __version__

    parser = _Parser(
        prog=PROG,
        description="Synthesize, bound and verify collective communication algorithms for GPU "
                    "topologies.",
        epilog="exit codes: " + "; ".join(f"{code} {text}" for code, text in EXIT_CODES.items()),
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    parser.add_argument("--memory-limit", type=parse_size, metavar="BYTES",
                        help="most memory a command may use (e.g. 8GiB; default: the "
                             "COLLSYNTH_MEMORY_LIMIT variable, else what the machine has): "
                             "larger requests are refused up front")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    topologies = commands.add_parser("topologies", help="list the built-in topologies",
                                     description="List the built-in topologies and families.")
    topologies.add_argument("--json", action="store_true", help="machine-readable output")
    topologies.set_defaults(handler=_cmd_topologies)

    problem = _Parser(add_help=False)
    problem.add_argument("topology", metavar="TOPOLOGY",
                         help="built-in name (dgx1, ring:8, ...) or topology file (JSON, NCCL XML, "
                              "nvidia-smi/rocm-smi output)")
    problem.add_argument("collective", metavar="COLLECTIVE",
                         help="standard collective (allgather, reduce_scatter, broadcast, ...) "
                              "or a custom collective JSON file")
    problem.add_argument("--root", type=_ranks, metavar="R",
                         help="root rank of a rooted collective; several (0,4) for multiroot_*")
    problem.add_argument("--nodes", type=positive_int, metavar="K",
                         help="K copies of the topology joined by their NICs")
    problem.add_argument("--nic-units", type=positive_int, metavar="U",
                         help="with --nodes: NIC bandwidth in the topology's units (for topologies "
                              "whose file does not describe their NICs)")
    add_fabric_arguments(problem)
    add_figure_arguments(problem)

    bounds = commands.add_parser("bounds", parents=[problem],
                                 help="lower bounds on steps and rounds per chunk",
                                 description="Print lower bounds on the steps and the rounds per "
                                             "chunk of any algorithm.")
    bounds.add_argument("--json", action="store_true", help="machine-readable output")
    bounds.set_defaults(handler=_cmd_bounds)

    solving = _Parser(add_help=False, parents=[problem])
    solving.add_argument("--backend", choices=("auto", "cpsat", "z3", "z3-path"), default="auto",
                         help="solver backend (default: auto = cpsat if installed)")
    solving.add_argument("--time-limit", type=seconds, default=DEFAULT_TIME_LIMIT,
                         metavar="SECONDS",
                         help="wall-clock limit for the whole search "
                              f"(default {DEFAULT_TIME_LIMIT:g})")
    solving.add_argument("-o", "--output", metavar="PATH",
                         help="write algorithms here: a .json file for one algorithm, a directory "
                              "(created if needed) for one file per algorithm")
    solving.add_argument("--json", action="store_true",
                         help="machine-readable output on stdout (no progress lines)")
    solving.add_argument("-q", "--quiet", action="store_true",
                         help="no progress lines on stderr")
    solving.add_argument("--xml", metavar="DIR",
                         help="also export every algorithm found as MSCCL XML into DIR "
                              "(checked before it is written)")
    solving.add_argument("--xml-runtime", choices=("msccl", "rccl", "msccl-executor", "all"),
                         default="msccl", help="runtime for --xml (default msccl)")

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
    instance.set_defaults(handler=_cmd_solve)

    least = modes.add_parser("least-steps", parents=[solving],
                             help="the algorithm with the fewest steps",
                             description="Find the algorithm with the fewest steps (one round per "
                                         "step).")
    least.add_argument("--chunks", type=positive_int, default=1, metavar="C",
                       help="pieces per base chunk (default 1)")
    least.add_argument("--max-steps", type=positive_int, metavar="N",
                       help="give up after N steps")
    least.set_defaults(handler=_cmd_solve)

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
    pareto.set_defaults(handler=_cmd_solve)

    from collsynth.cli.solve_bandwidth import add_bandwidth_optimal_parser

    add_bandwidth_optimal_parser(modes, problem)

    show = commands.add_parser("show", help="print an algorithm file step by step",
                               description="Print an algorithm file (verified first) step by step.")
    show.add_argument("file", metavar="FILE")
    show.add_argument("--max-sends", type=non_negative_int, metavar="N",
                      help="show at most N links per step")
    show.set_defaults(handler=_cmd_show)

    verify = commands.add_parser("verify", help="check an algorithm file",
                                 description="Replay an algorithm file and check it implements its "
                                             "collective on its topology.")
    verify.add_argument("file", metavar="FILE")
    verify.set_defaults(handler=_cmd_verify)

    from collsynth.cli.check import add_check_parser
    from collsynth.cli.export import add_export_parser

    add_export_parser(commands)
    add_check_parser(commands)

    from collsynth.cli.time import add_plot_parser, add_time_parser

    add_time_parser(commands)
    add_plot_parser(commands)

    from collsynth.cli.calibrate import add_calibrate_parser

    add_calibrate_parser(commands)

    from collsynth.cli.time_program import add_calibrate_runtime_parser

    add_calibrate_runtime_parser(commands)

    from collsynth.cli.bench import add_bench_parser

    add_bench_parser(commands)

    from collsynth.cli.execute import add_run_parser

    add_run_parser(commands)

    from collsynth.cli.plan import add_plan_parser
    from collsynth.cli.trace import add_trace_parser

    add_trace_parser(commands)
    add_plan_parser(commands)

    from collsynth.cli.draw import add_draw_parser

    add_draw_parser(commands)
    return parser


# -- output helpers -----------------------------------------------------------------------------


def _out(text: str = "") -> None:
    print(text, file=sys.stdout, flush=True)


def _err(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _describe_problem(topology: Topology, collective: Collective) -> str:
    return f"{collective.describe()} on {topology.name} ({topology.num_ranks} ranks)"


def _bounds_line(bounds: Bounds) -> str:
    text = f"lower bounds: steps >= {bounds.steps}, rounds/chunk >= {bounds.rounds_per_chunk}"
    if bounds.composed_rounds_per_chunk is not None:
        text += (f"; as reduce-scatter + allgather: steps >= {bounds.composed_steps}, "
                 f"rounds/chunk >= {bounds.composed_rounds_per_chunk}")
    return text


def _fraction(value: Fraction | None) -> str | None:
    return None if value is None else str(value)


# -- commands -----------------------------------------------------------------------------------


def _cmd_topologies(args: argparse.Namespace) -> int:
    rows = list_topologies()
    if args.json:
        _out(json.dumps([{"name": name, "ranks": ranks, "description": description}
                         for name, ranks, description in rows], indent=1))
        return EXIT_OK
    table = [(name, "N" if ranks is None else str(ranks), description)
             for name, ranks, description in rows]
    for line in _table(("name", "ranks", "description"), table, left=(0, 2)):
        _out(line)
    return EXIT_OK


def _cmd_bounds(args: argparse.Namespace) -> int:
    topology, collective = _problem(args)
    bounds = compute_bounds(topology, collective)
    if args.json:
        _out(json.dumps({
            "topology": topology.name,
            "num_ranks": topology.num_ranks,
            "collective": collective.describe(),
            "steps_lower_bound": bounds.steps,
            "rounds_per_chunk_lower_bound": str(bounds.rounds_per_chunk),
            "composed_steps_lower_bound": bounds.composed_steps,
            "composed_rounds_per_chunk_lower_bound": _fraction(bounds.composed_rounds_per_chunk),
        }, indent=1))
        return EXIT_OK
    _out(_describe_problem(topology, collective))
    _out(f"steps >= {bounds.steps}")
    _out(f"rounds/chunk >= {bounds.rounds_per_chunk}")
    if bounds.composed_rounds_per_chunk is not None:
        _out(f"as reduce-scatter then allgather: steps >= {bounds.composed_steps}, "
             f"rounds/chunk >= {bounds.composed_rounds_per_chunk}")
    return EXIT_OK


def _cmd_show(args: argparse.Namespace) -> int:
    _out(format_algorithm(load_algorithm(args.file), max_sends_per_step=args.max_sends))
    return EXIT_OK


def _cmd_verify(args: argparse.Namespace) -> int:
    a = load_algorithm(args.file)
    _out(f"{args.file}: correct {a.collective.describe()} on {a.topology.name} "
         f"(steps={a.num_steps}, rounds={a.num_rounds}, chunks={a.chunks}, "
         f"rounds/chunk={a.rounds_per_chunk})")
    return EXIT_OK


# -- solve ----------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Destination:
    """Where ``solve`` writes algorithms: nowhere, one file, or a directory of files; and the
    folder of ``--xml`` files."""

    file: Path | None = None
    directory: Path | None = None
    xml_directory: Path | None = None

    @staticmethod
    def plan(path: str | None, *, several: bool, xml: str | None = None) -> "_Destination":
        """Check ``-o PATH`` and ``--xml DIR`` before any solving (and create the folders),
        by the output policy of :mod:`collsynth._output`."""
        from collsynth._output import check_output_dir, check_output_file

        xml_directory = None if xml is None else check_output_dir(xml, label=f"--xml {xml}")
        if path is None:
            return _Destination(xml_directory=xml_directory)
        p = Path(path)
        as_directory = p.is_dir() or path.endswith(("/", os.sep)) or p.suffix == ""
        if not as_directory:
            if p.suffix.lower() != ".json":
                raise _UsageError(f"-o {path}: expected a .json file or a directory")
            if several:
                raise _UsageError(f"-o {path}: pareto writes one file per algorithm; give a "
                                  "directory")
            return _Destination(file=check_output_file(path, label=f"-o {path}"),
                                xml_directory=xml_directory)
        return _Destination(directory=check_output_dir(path, label=f"-o {path}"),
                            xml_directory=xml_directory)

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
    path = destination.path_for(algorithm)
    if path is not None:
        save_algorithm(algorithm, path, extra_memory=result.instance.extra_memory)
    if destination.xml_directory is not None:
        from collsynth._output import path_in
        from collsynth.export.pipeline import export_algorithm
        from collsynth.export.runtimes import runtime_names

        runtimes = runtime_names() if args.xml_runtime == "all" else [args.xml_runtime]
        for runtime in runtimes:  # the name holds the collective's: kept inside the folder
            export_algorithm(algorithm, path_in(destination.xml_directory, name,
                                                suffix=f".{runtime}.xml"), runtime=runtime)
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
    _err(f"  {result.instance.label()}: {result.status.value} ({result.seconds:.2f} s)")


def _cmd_solve(args: argparse.Namespace) -> int:
    several = args.mode == "pareto"
    topology, collective = _problem(args)
    destination = _Destination.plan(args.output, several=several, xml=args.xml)
    options = SolveOptions(
        backend=args.backend,
        time_limit=args.time_limit,
        instance_time_limit=getattr(args, "instance_time_limit", None),
        on_result=None if args.quiet or args.json else _progress,
    )
    if several:
        return _solve_pareto(args, topology, collective, options, destination)

    if args.mode == "instance":
        instance = Instance(steps=args.steps, rounds=args.rounds, chunks=args.chunks,
                            extra_memory=args.extra_memory)
    if not args.json:
        _out(_describe_problem(topology, collective))
    try:
        if args.mode == "instance":
            result = solve_instance(topology, collective, instance, options=options)
        else:
            result = solve_least_steps(topology, collective, chunks=args.chunks,
                                       max_steps=args.max_steps, options=options)
    except KeyboardInterrupt:  # outside the solver (the strategies return INTERRUPTED in it)
        if args.json:
            _out("[]")
        else:
            _out("interrupted: no algorithm found")
        return EXIT_TIMEOUT
    path = _save(result, destination, args, topology, collective)
    if args.json:
        _out(json.dumps([_result_json(result, path)], indent=1))
    else:
        _print_single(result, path, args)
    if result.found:
        return EXIT_OK
    return EXIT_UNSATISFIABLE if result.status is Status.UNSAT else EXIT_TIMEOUT


def _print_single(result: SynthesisResult, path: Path | None, args: argparse.Namespace) -> None:
    instance = result.instance
    timing = f"({result.seconds:.2f} s, {result.backend})"
    if result.found:
        _out(f"found: {instance.label()} rounds/chunk={instance.rounds_per_chunk} {timing}")
        if args.mode == "least-steps" and result.detail:
            _out(f"fewer steps: {result.detail}")
        if path is not None:
            _out(f"wrote {path}")
        elif not args.quiet:
            _err("(not saved: pass -o FILE.json to write the algorithm)")
    elif result.status is Status.UNSAT:
        what = ("no algorithm with at most {} steps".format(instance.steps)
                if args.mode == "least-steps" else "no algorithm exists for this instance")
        _out(f"unsat: {instance.label()} {timing}: {what}")
    elif result.status is Status.INTERRUPTED:
        _out(f"interrupted: {instance.label()} {timing}: no algorithm found before Ctrl-C")
    else:
        detail = f"; {result.detail}" if result.status is Status.UNKNOWN and result.detail else ""
        _out(f"{result.status.value}: {instance.label()} {timing}: no algorithm found within the "
             f"time limit ({args.time_limit:g} s){detail}")


def _solve_pareto(args: argparse.Namespace, topology: Topology, collective: Collective,
                  options: SolveOptions, destination: _Destination) -> int:
    if not args.json:
        _out(_describe_problem(topology, collective))
        _out(_bounds_line(compute_bounds(topology, collective)))
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
        _out(json.dumps([_result_json(r, p) for r, p in front], indent=1))
    else:
        if front:
            rows = [(str(r.instance.steps), str(r.instance.total_rounds), str(r.instance.chunks),
                     str(r.rounds_per_chunk), f"{r.seconds:.2f}", "-" if p is None else str(p))
                    for r, p in front]
            for line in _table(("steps", "rounds", "chunks", "rounds/chunk", "seconds", "file"),
                               rows, left=(5,)):
                _out(line)
        else:
            _out("no algorithm found")
        _out(_completeness(log, interrupted, args.time_limit))
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


# -- entry points ---------------------------------------------------------------------------------


def _exit_code(exc: BaseException) -> int:
    """The exit code of an exception that ended a command (the one place that decides)."""
    if isinstance(exc, _UsageError):
        return EXIT_USAGE
    if isinstance(exc, UnimplementableError):
        return EXIT_UNSATISFIABLE
    from collsynth.limits import TimeLimitReached

    if isinstance(exc, TimeLimitReached):
        return EXIT_TIMEOUT
    return EXIT_ERROR


def _error_message(exc: BaseException) -> str:
    if isinstance(exc, UnimplementableError):
        return f"not implementable on this topology: {exc}"
    if isinstance(exc, OSError) and exc.strerror:
        where = f": {exc.filename}" if exc.filename else ""
        return f"{exc.strerror}{where}"
    return str(exc)


def _out_of_memory() -> int:
    """One line for a :class:`MemoryError` (the budget named is the one in force)."""
    from collsynth.limits import format_bytes, memory_budget_bytes

    budget, source = memory_budget_bytes()
    where = f": {source} is {format_bytes(budget)}" if budget is not None else ""
    _err(f"{PROG}: error: out of memory{where} (raise --memory-limit or ask for less)")
    return EXIT_ERROR


def main(argv: list[str] | None = None) -> int:
    """Run the command line ``argv`` (default ``sys.argv[1:]``); return the exit code.

    Never raises for bad input: errors are reported in one line on stderr. Exceptions that are
    not collsynth's (bugs) propagate.
    """
    parser = _build_parser()
    try:
        try:
            args = parser.parse_args(sys.argv[1:] if argv is None else argv)
        except SystemExit as exc:  # --help, --version
            return exc.code if isinstance(exc.code, int) else (EXIT_OK if exc.code is None
                                                                else EXIT_USAGE)
        from collsynth.limits import memory_ceiling

        with memory_ceiling(args.memory_limit):
            try:
                return args.handler(args)
            except MemoryError:  # beyond what the up-front estimates foresaw
                return _out_of_memory()
    except _UsageError as exc:
        _err(f"{exc.prog}: error: {_one_line(str(exc))}")
        return EXIT_USAGE
    except BrokenPipeError:  # stdout closed early (`| head`): nothing left to tell; see run()
        raise
    except (CollsynthError, OSError) as exc:
        _err(f"{PROG}: error: {_one_line(_error_message(exc))}")
        return _exit_code(exc)
    except KeyboardInterrupt:
        _err(f"{PROG}: interrupted")
        return EXIT_INTERRUPTED


def run() -> None:
    """Console entry point: ``sys.exit(main())``, turning a bug into one line and exit 1."""
    try:
        code = main()
    except BrokenPipeError:  # e.g. `collsynth topologies | head -1`
        try:
            sys.stdout = open(os.devnull, "w")
        except OSError:
            pass
        code = EXIT_ERROR
    except Exception as exc:  # a bug: say so in one line, not a traceback
        _err(f"{PROG}: internal error: {type(exc).__name__}: {_one_line(str(exc))} "
             "(this is a bug; please report it)")
        code = EXIT_ERROR
    sys.exit(code)
