"""``collsynth check``: is an MSCCL XML program correct for a runtime?

Reads the file as the runtime's reader would (:mod:`collsynth.export.xml_reader`) and executes
it symbolically (:func:`collsynth.export.check.check_program`); prints the verdict or every
problem as ``FILE:LINE: kind: message``. Exit 0 only for a correct program, 1 for problems.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
from typing import Any

from collsynth._parse import MAX_SIZE_BYTES, number_text
from collsynth.cli.common import (EXIT_ERROR, EXIT_OK, PROGRESS_INTERVAL_S, UsageError, err,
                                  out, positive_int, problem_lines, progress_line, why_not)
from collsynth.cli.plan_files import MSCCLPP_RUNTIME, check_plan_file
from collsynth.errors import CollsynthError, InvalidCollectiveError, shown_path
from collsynth.export.check import COLLECTIVES, CheckReport, Problem, check_program
from collsynth.export.mscclpp.reader import looks_like_plan
from collsynth.export.xml_reader import infer_runtime, read_checked, read_text
from collsynth.progress import heartbeat
from collsynth.runtimes import MSCCL_XML, runtime_names

__all__ = ["register", "run_check", "infer_runtime"]

_ALGO_TAG = re.compile(r"<algo\b[^>]*>", re.S)


def _chunk_bytes(text: str) -> int:
    """A ``--chunk-bytes``: a whole number of bytes from 1 to 1 PiB (:data:`MAX_SIZE_BYTES`, the
    bound of every size an option takes; a larger chunk was read, and only the plan's alignment
    rule complained)."""
    value = positive_int(text)
    if value > MAX_SIZE_BYTES:
        raise argparse.ArgumentTypeError(f"{text!r}: a chunk of more than 1 PiB "
                                         f"({MAX_SIZE_BYTES} bytes); expected a whole number "
                                         f"of bytes from 1 to {MAX_SIZE_BYTES}")
    return value


def _root(text: str) -> int:
    try:
        value = int(number_text(text))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected a rank >= 0, got {text!r}{why_not(exc)}") \
            from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a rank >= 0, got {text!r}")
    return value


def register(subparsers: Any) -> None:
    """Add ``check`` to ``subparsers`` (from ``add_subparsers``)."""
    parser = subparsers.add_parser(
        "check", help="check an MSCCL XML program for a runtime",
        description="Check an MSCCL XML algorithm as a runtime reads and runs it: its reader "
                    "rules, limits, connections and dependencies, then a symbolic execution "
                    "(deadlocks, races, uninitialised reads, the collective's result). Exit "
                    "status 0 only when correct.")
    parser.add_argument("file", metavar="FILE.xml")
    parser.add_argument("--runtime", choices=(*runtime_names(MSCCL_XML), MSCCLPP_RUNTIME),
                        help="the runtime whose rules apply (default: inferred from the file; "
                             "a JSON file is an MSCCL++ execution plan)")
    parser.add_argument("--coll", choices=COLLECTIVES, metavar="NAME",
                        help="the collective a coll=\"custom\" file implements: "
                             + ", ".join(COLLECTIVES))
    parser.add_argument("--root", type=_root, metavar="R",
                        help="root rank of a rooted collective (default: inferred)")
    parser.add_argument("-q", "--quiet", action="store_true",
                        help="no progress lines on stderr (a check that runs over 5 s says "
                             "which runtime's rules it is on)")
    parser.add_argument("--strict", action="store_true",
                        help="treat warnings (writes into the send buffer of an out-of-place "
                             "call) as problems")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    plans = parser.add_argument_group("MSCCL++ plans")
    plans.add_argument("--ranks-per-node", type=positive_int, metavar="N",
                       help="ranks per node: memory and switch channels must stay in a node")
    plans.add_argument("--chunk-bytes", type=_chunk_bytes, metavar="B",
                       help="the chunk size to run the plan at (default: the smallest that "
                            "runs every pipeline twice)")
    parser.set_defaults(handler=run_check)


def _check_as(text: str, runtime: str, args: argparse.Namespace, doing: list[str] | None = None
              ) -> tuple[CheckReport | None, list[Problem]]:
    """Read and check ``text`` by ``runtime``'s rules: the report (``None``: unreadable) and
    every problem; ``doing[0]`` says so for the progress lines."""
    if doing is not None:
        doing[0] = f"check: checking {shown_path(args.file)} by {runtime}'s rules"
    program, problems = read_checked(text, runtime)
    report = None
    if program is not None:
        try:
            report = check_program(program, runtime=runtime, collective=args.coll,
                                   root=args.root, strict=getattr(args, "strict", False))
        except InvalidCollectiveError as exc:  # --coll or --root does not fit the program
            raise UsageError(str(exc), prog="collsynth check") from exc
        except CollsynthError as exc:  # a program the symbolic execution cannot start on
            raise CollsynthError(f"{shown_path(args.file)}: {exc}") from exc
        problems = list(problems) + list(report.problems)
    return report, list(problems)


def _algo_line(text: str) -> int | None:
    match = _ALGO_TAG.search(text)
    return text.count("\n", 0, match.start()) + 1 if match else None


def _verdict(report: CheckReport) -> str:
    what = report.collective or "program"
    if report.root is not None:
        what += f" (root {report.root})"
    return f"correct {what} for {report.runtime}"


def run_check(args: argparse.Namespace) -> int:
    """Handle ``collsynth check``; return 0 (correct) or 1 (problems, printed)."""
    # A program of millions of chunks executes for tens of seconds per runtime tried.
    doing = [f"check: reading {shown_path(args.file)}"]
    with heartbeat(None if args.quiet else progress_line, PROGRESS_INTERVAL_S,
                   lambda: doing[0]):
        return _run_check(args, doing)


def _run_check(args: argparse.Namespace, doing: list[str]) -> int:
    is_plan = looks_like_plan(args.file)
    if args.runtime == MSCCLPP_RUNTIME or (args.runtime is None and is_plan):
        return check_plan_file(args)
    if is_plan:
        raise UsageError.of("check", f"--runtime {args.runtime} checks MSCCL XML, and "
                                     f"{shown_path(args.file)}"
                                     " is JSON (an MSCCL++ plan?): give --runtime "
                                     f"{MSCCLPP_RUNTIME}, or leave --runtime out")
    if getattr(args, "ranks_per_node", None) or getattr(args, "chunk_bytes", None):
        raise UsageError.of("check", "--ranks-per-node and --chunk-bytes are for MSCCL++ plans")
    text = read_text(args.file)
    inferred = None
    runtime = args.runtime
    if runtime is not None:
        report, problems = _check_as(text, runtime, args, doing)
    else:
        # The inferred runtime first; a program correct for another runtime is not called
        # wrong for a guess (a tuned msccl file has minBytes/maxBytes, as rccl's do).
        guess, reason = infer_runtime(text)
        others = [r for r in runtime_names(MSCCL_XML) if r != guess]
        runtime = guess
        report, problems = _check_as(text, guess, args, doing)
        inferred = f"runtime {guess} inferred: {reason}; pass --runtime to choose"
        if report is None or problems:
            for other in others:
                other_report, other_problems = _check_as(text, other, args, doing)
                if other_report is not None and not other_problems:
                    runtime, report, problems = other, other_report, other_problems
                    inferred = (f"runtime {other}: it fails {guess}'s rules ({guess} was "
                                f"inferred: {reason}) and passes {other}'s; pass --runtime "
                                "to choose")
                    break
            else:
                inferred = (f"runtime {guess} inferred: {reason}; it is not correct for "
                            f"{' or '.join(others)} either; pass --runtime to choose")
    algo_line = _algo_line(text)
    correct = report is not None and not problems
    if args.json:
        out(json.dumps(_as_json(args.file, runtime, inferred, report, problems, algo_line),
                       indent=1))
        return EXIT_OK if correct else EXIT_ERROR
    for w in (report.warnings if report is not None else ()):
        out(_format(args.file, w, algo_line).replace(f": {w.kind}:", f": warning: {w.kind}:", 1))
    if correct:
        notes = [inferred] if inferred else []
        notes.append("layouts: " + ", ".join(report.layouts_checked))
        out(f"{shown_path(args.file)}: {_verdict(report)} ({'; '.join(notes)})")
        return EXIT_OK
    for line in problem_lines([_format(args.file, p, algo_line) for p in problems]):
        out(line)
    # The program was read and checked: a wrong one is an answer (exit 1), not an error.
    err(f"{shown_path(args.file)}: {len(problems)} problem{'s' if len(problems) != 1 else ''} for "
        f"{runtime}" + (f" ({inferred})" if inferred else ""))
    return EXIT_ERROR


def _format(path: str, problem: Problem, algo_line: int | None) -> str:
    line = problem.line if problem.line is not None else algo_line
    where = f"{shown_path(path)}:{line}" if line is not None else shown_path(path)
    return f"{where}: {problem.kind}: {problem.message}"


def _as_json(path: str, runtime: str, inferred: str | None, report: CheckReport | None,
             problems: list[Problem], algo_line: int | None) -> dict[str, Any]:
    return {
        "file": path,
        "runtime": runtime,
        "runtime_inferred": inferred,
        "correct": report is not None and not problems,
        "collective": report.collective if report else None,
        "root": report.root if report else None,
        "layouts_checked": list(report.layouts_checked) if report else [],
        "problems": [{"kind": p.kind, "line": p.line if p.line is not None else algo_line,
                      "message": p.message} for p in problems],
        "ranks": [dataclasses.asdict(s) for s in report.rank_stats] if report else [],
    }
