"""The ``collsynth`` command line: one module per command, and :func:`main`.

Each command module has ``register(commands)``, which adds its parser and sets its handler;
a handler turns arguments into values, makes one library call and writes the result. Handlers
raise; :func:`main` is the one place where exceptions become exit codes (:data:`EXIT_CODES`) and
one-line messages on stderr. Every command and its options: docs/cli.md.
"""

from __future__ import annotations

import contextlib
import os
import sys
import warnings

from collsynth.cli import (
    bench,
    bounds,
    calibrate,
    check,
    draw,
    execute,
    export,
    plan,
    show,
    solve,
    time,
    topologies,
    trace,
    tune_runtime,
    verify,
)
from collsynth.cli.common import (
    EXIT_CODES,
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_TIMEOUT,
    EXIT_UNSATISFIABLE,
    EXIT_USAGE,
    PROG,
    DetailedError,
    Parser,
    UsageError,
    err,
    one_line,
    memory_limit,
)
from collsynth.errors import CollsynthError, UnimplementableError, shown_path
from collsynth.interrupts import reliable_sigint
from collsynth.limits import TimeLimitReached

__all__ = ["main", "run", "build_parser", "COMMANDS", "EXIT_OK", "EXIT_ERROR", "EXIT_USAGE",
           "EXIT_UNSATISFIABLE", "EXIT_TIMEOUT", "EXIT_INTERRUPTED", "EXIT_CODES"]

#: The command modules, in the order ``collsynth --help`` lists their commands.
COMMANDS = (topologies, bounds, solve, show, verify, export, tune_runtime, check, time, calibrate,
            bench, execute, trace, plan, draw)


def build_parser() -> Parser:
    """The parser of the whole command line: global options, then every command's."""
    from collsynth import __version__

    parser = Parser(
        prog=PROG,
        description="Synthesize, bound and verify collective communication algorithms for GPU "
                    "topologies.",
        epilog="exit codes: " + "; ".join(f"{code} {text}" for code, text in EXIT_CODES.items()),
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    parser.add_argument("--memory-limit", type=memory_limit, metavar="BYTES",
                        help="most memory a command may use (e.g. 8GiB; default: the "
                             "COLLSYNTH_MEMORY_LIMIT variable, else what the machine has): "
                             "larger requests are refused up front")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in COMMANDS:
        module.register(commands)
    return parser


# -- from exceptions to exit codes ----------------------------------------------------------------


def _exit_code(exc: BaseException) -> int:
    """The exit code of an exception that ended a command (the one place that decides)."""
    if isinstance(exc, UsageError):
        return EXIT_USAGE
    if isinstance(exc, UnimplementableError):
        return EXIT_UNSATISFIABLE
    if isinstance(exc, TimeLimitReached):
        return EXIT_TIMEOUT
    return EXIT_ERROR


def _error_message(exc: BaseException) -> str:
    if isinstance(exc, UnimplementableError):
        return f"not implementable on this topology: {exc}"
    if isinstance(exc, OSError) and exc.strerror:
        where = f": {shown_path(exc.filename)}" if exc.filename else ""
        return f"{exc.strerror}{where}"
    return str(exc)


def _out_of_memory() -> int:
    """One line for a :class:`MemoryError` (the budget named is the one in force: the
    process's own address-space limit where it is the smaller, which --memory-limit cannot
    raise)."""
    from collsynth.limits import address_space_limit_bytes, format_bytes, memory_budget_bytes

    budget, source = memory_budget_bytes()
    ulimit = address_space_limit_bytes()
    if ulimit is not None and (budget is None or ulimit < budget):
        err(f"{PROG}: error: out of memory: the process's address-space limit (ulimit -v) is "
            f"{format_bytes(ulimit)} (raise it or ask for less)")
        return EXIT_ERROR
    where = f": {source} is {format_bytes(budget)}" if budget is not None else ""
    err(f"{PROG}: error: out of memory{where} (raise --memory-limit or ask for less)")
    return EXIT_ERROR


def _memory_limit(flag: int | None) -> int | None:
    """The ceiling in force: ``--memory-limit``'s, else the ``COLLSYNTH_MEMORY_LIMIT``
    variable's read with the same rules, so a variable that cannot be read is a usage error
    naming it, never a ceiling silently not applied."""
    import argparse

    from collsynth.limits import MEMORY_LIMIT_ENV

    if flag is not None:
        return flag
    text = os.environ.get(MEMORY_LIMIT_ENV, "")
    if not text.strip():
        return None
    try:
        return memory_limit(text)
    except argparse.ArgumentTypeError as exc:
        raise UsageError(f"environment variable {MEMORY_LIMIT_ENV}={text[:40]!r}: {exc} (unset "
                         "it or give --memory-limit)") from None


@contextlib.contextmanager
def _input_warnings_as_lines():
    """Print each :class:`InputWarning` the command issues as one ``collsynth: warning:`` line
    on stderr, as it happens (every one: two files may drop different links)."""
    from collsynth.errors import InputWarning

    with warnings.catch_warnings():
        warnings.simplefilter("always", InputWarning)
        shown = warnings.showwarning

        def show(message, category, *args, **kwargs):
            if issubclass(category, InputWarning):
                err(f"{PROG}: warning: {one_line(str(message))}")
            else:
                shown(message, category, *args, **kwargs)
        warnings.showwarning = show
        yield


def main(argv: list[str] | None = None) -> int:
    """Run the command line ``argv`` (default ``sys.argv[1:]``); return the exit code.

    Never raises for bad input: errors are reported in one line on stderr. Exceptions that are
    not collsynth's (bugs) propagate.
    """
    parser = build_parser()
    try:
        try:
            args = parser.parse_args(sys.argv[1:] if argv is None else argv)
        except SystemExit as exc:  # --help, --version
            return exc.code if isinstance(exc.code, int) else (EXIT_OK if exc.code is None
                                                                else EXIT_USAGE)
        from collsynth.limits import memory_ceiling

        with memory_ceiling(_memory_limit(args.memory_limit)), reliable_sigint(), \
                _input_warnings_as_lines():
            try:
                return args.handler(args)
            except MemoryError:  # beyond what the up-front estimates foresaw
                return _out_of_memory()
    except UsageError as exc:
        err(f"{exc.prog}: error: {one_line(str(exc))}")
        return EXIT_USAGE
    except BrokenPipeError:  # stdout closed early (`| head`): nothing left to tell; see run()
        raise
    except (CollsynthError, OSError) as exc:
        err(f"{PROG}: error: {one_line(_error_message(exc))}")
        for line in exc.details if isinstance(exc, DetailedError) else ():
            err(f"{PROG}: error: {one_line(line)}")
        return _exit_code(exc)
    except KeyboardInterrupt as exc:  # with what the command left behind, if it says
        err(f"{PROG}: interrupted" + (f": {one_line(str(exc))}" if str(exc) else ""))
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
        err(f"{PROG}: internal error: {type(exc).__name__}: {one_line(str(exc))} "
            "(this is a bug; please report it)")
        code = EXIT_ERROR
    sys.exit(code)
