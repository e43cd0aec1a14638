"""``collsynth run``: execute an algorithm (or MSCCL XML program) on local processes, prove it
against torch.distributed's own collective on the same inputs, and time both.

Exit 0 when the result matches torch, 1 when it does not (the report says where). Sizes,
tolerances and bandwidths: docs/cli.md. (Not ``run.py``: that name would hide the console entry
point :func:`collsynth.cli.run`.)
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from collsynth.cli.common import (EXIT_ERROR, EXIT_OK, DetailedError, UsageError, err,
                                  non_negative_int, out, parse_size, positive_int, seconds)
from collsynth.errors import CollsynthError, shown_path
from collsynth.limits import check_memory

__all__ = ["register", "run_run", "parse_run_size", "MAX_RUN_BYTES", "launch_timeout_s",
           "MAX_ITERATIONS"]

#: Largest buffer a local run allocates per rank (bytes).
MAX_RUN_BYTES = 16 * 2**30


def parse_run_size(text: str) -> int:
    """Bytes in ``text``, by the shared rules of :func:`collsynth.cli.common.parse_size`, at most
    :data:`MAX_RUN_BYTES` (a local run allocates buffers of that size on every rank).

    >>> parse_run_size("4MiB"), parse_run_size("1KB"), parse_run_size("1.5 KiB")
    (4194304, 1000, 1536)
    """
    value = parse_size(text)
    if value > MAX_RUN_BYTES:
        raise argparse.ArgumentTypeError(
            f"size {text!r}: more than the {MAX_RUN_BYTES} bytes (16 GiB) a local run allocates")
    return value


#: Most timed or warm-up iterations a run takes: a million calls of a 1 us collective is a
#: second; more is a typo that would run for days.
MAX_ITERATIONS = 10**6
#: Longest a whole run may take before its processes are stopped, seconds (30 days).
MAX_LAUNCH_SECONDS = 30 * 24 * 3600.0


def launch_timeout_s(per_call_s: float, iters: int, warmup: int) -> float:
    """Seconds the whole run may take: a minute to start, then each call's timeout for every
    call and as many again (a call and its check), at most :data:`MAX_LAUNCH_SECONDS`: far
    below what gloo's deadline holds (nanoseconds in 64 bits, 292 years; 10^4 iterations of a
    week's timeout overflowed it, and every rank timed out at once).

    >>> launch_timeout_s(60.0, 10, 2)
    1740.0
    >>> launch_timeout_s(604800.0, 10**6, 10**6) == MAX_LAUNCH_SECONDS
    True
    """
    return min(60.0 + per_call_s * (2 * (iters + warmup) + 4), MAX_LAUNCH_SECONDS)


def _iterations(text: str) -> int:
    value = non_negative_int(text)
    if value > MAX_ITERATIONS:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a whole number from 0 to "
                                         f"{MAX_ITERATIONS}")
    return value


def register(subparsers: Any) -> None:
    """Add ``run`` to ``subparsers`` (from ``add_subparsers``)."""
    from collsynth.executor.compare import DTYPES
    from collsynth.executor._common import REDUCE_OPS

    parser = subparsers.add_parser(
        "run", help="run an algorithm on local processes and check it against torch",
        description="Run an algorithm file (or MSCCL XML program) on N local processes with "
                    "torch.distributed, check the result against torch's own collective on "
                    "the same inputs, and time both. Exit status 0 only when the result "
                    "matches.")
    parser.add_argument("file", metavar="ALGO.json|ALGO.xml",
                        help="algorithm file, or an MSCCL XML program")
    parser.add_argument("--ranks", type=positive_int, metavar="N",
                        help="processes to start (default: the file's number of ranks)")
    parser.add_argument("--backend", choices=("gloo", "nccl"), default="gloo",
                        help="gloo (CPU, default) or nccl (one GPU per rank)")
    parser.add_argument("--size", type=parse_run_size, default=4 * 2**20, metavar="SIZE",
                        help="bytes of the larger buffer of one rank, with a unit: B, KB, "
                             "KiB, MB, MiB, GB, GiB (default 4MiB)")
    parser.add_argument("--iters", type=_iterations, default=10, metavar="K",
                        help="timed iterations (default 10; 0: check only; at most 10^6)")
    parser.add_argument("--warmup", type=_iterations, default=2, metavar="W",
                        help="untimed iterations before timing (default 2; at most 10^6)")
    parser.add_argument("--dtype", choices=DTYPES, default="float32",
                        help="element type (default float32)")
    parser.add_argument("--op", choices=REDUCE_OPS, default="sum",
                        help="reduction of combining collectives (default sum)")
    parser.add_argument("--inplace", action="store_true",
                        help="call in place (torch's in-place layout)")
    parser.add_argument("--root", type=non_negative_int, metavar="R",
                        help="root of a rooted XML program (default: inferred by the checker)")
    parser.add_argument("--timeout", type=seconds, default=60.0, metavar="S",
                        help="seconds one call may take on a rank before it fails "
                             "(default 60)")
    parser.add_argument("--seed", type=non_negative_int, default=0, help="input seed (default 0)")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.set_defaults(handler=run_run)


def _load(path: str, root: int | None):
    """(algorithm or None, program or None, collective or None, root, ranks, label)."""
    from collsynth.algorithm.fileformat import load_algorithm
    from collsynth.export.xml_reader import load_program

    if path.lower().endswith(".xml"):
        # The reader's and the checker's static rules; a wrong result is run's own answer.
        program = load_program(path, execute=False)
        label = f"{program.coll} program {program.name!r}"
        return None, program, None, root, program.ngpus, label
    algorithm = load_algorithm(path)
    label = f"{algorithm.collective.describe()} on {algorithm.topology.name}"
    return algorithm, None, None, None, algorithm.topology.num_ranks, label


def _infer_root(program, root: int | None) -> int | None:
    from collsynth.export.check import ROOTED_COLLECTIVES, check_program
    from collsynth.executor.program import program_kind

    kind = program_kind(program)
    if root is not None or kind not in ROOTED_COLLECTIVES:
        return root
    runtime = "msccl" if program.outofplace is None else "rccl"
    report = check_program(program, runtime=runtime, collective=kind)
    return report.root


def run_run(args: argparse.Namespace) -> int:
    """Run ``collsynth run``; return 0 when the result matches torch, 1 when it does not (the
    report says where). Errors raise, a rank's failure too (after the report)."""
    from collsynth.executor import compare
    from collsynth.executor._common import check_op, torch_modules
    from collsynth.executor.executor import collective_kind
    from collsynth.executor.launch import launch
    from collsynth.executor.program import program_kind

    algorithm, program, collective, root, file_ranks, label = _load(args.file, args.root)
    ranks = args.ranks if args.ranks is not None else file_ranks
    if ranks != file_ranks:
        raise UsageError.of("run", f"--ranks {ranks}, but {shown_path(args.file)} is for "
                                   f"{file_ranks} ranks")
    if args.root is not None and args.root >= ranks:
        raise UsageError.of("run", f"--root {args.root} is not a rank of {ranks}")
    if algorithm is not None and args.root is not None:
        raise UsageError.of("run", "--root is for XML programs; an algorithm file names its root")
    if program is not None:
        from collsynth.executor.program import program_layouts

        layouts = program_layouts(program)
        call = "in-place" if args.inplace else "out-of-place"
        if call not in layouts:
            raise UsageError.of("run", f"{shown_path(args.file)}"
                                       f" is for {' and '.join(layouts) or 'no'} "
                                       "calls; "
                                       + ("drop --inplace" if args.inplace else "add --inplace"))
    # The file's collective, not the command line, is wrong if these raise: exit 1.
    if program is not None:
        kind = program_kind(program)
        combining = kind in ("allreduce", "reduce_scatter", "reduce", "custom")
    else:
        kind = collective_kind(algorithm.collective)
        combining = algorithm.collective.combining
    try:
        dtype = compare.parse_dtype(args.dtype)
        check_op(args.op, dtype, allow_avg=program is None, combining=combining)
    except CollsynthError as exc:  # --dtype and --op that do not go together
        raise UsageError.of("run", str(exc)) from exc
    if program is not None:
        root = _infer_root(program, root)
    if kind == "custom" and algorithm is None:
        raise CollsynthError("a coll=\"custom\" program's result cannot be checked without "
                             "its collective: run the algorithm file it came from")
    if program is not None and kind in ("broadcast", "reduce", "gather", "scatter") and \
            root is None:
        raise CollsynthError(f"cannot tell the root of this {kind} program (the checker "
                             "finds none or several): pass --root")
    torch, _ = torch_modules()
    element = torch.empty((), dtype=dtype).element_size()
    check_memory(ranks * _rank_bytes(args.size, element),
                 f"a run of {ranks} ranks with --size {args.size} bytes of {args.dtype}")
    blocks = _size_blocks(kind, ranks, algorithm)
    block_elems = max(1, args.size // element // blocks)
    case = compare.Case(name=Path(args.file).name, block_elems=block_elems,
                        algorithm=algorithm, program=program, collective=collective,
                        dtype=args.dtype, op=args.op, inplace=args.inplace, seed=args.seed,
                        iters=args.iters, warmup=args.warmup if args.iters else 0,
                        timeout_s=args.timeout, root=root)
    launch_timeout = launch_timeout_s(args.timeout, args.iters, args.warmup)
    progress = None if args.json else (lambda line: err(f"  running: {line}"))
    if progress is not None:
        progress(f"{label}: {ranks} local process(es), {args.backend}")
    results = launch(compare.run_cases, ranks, args=([case],), backend=args.backend,
                     timeout_s=launch_timeout, progress=progress)  # a line every 5 s
    per_rank = [r[0] for r in results]
    report = _report(args, case, per_rank, label, kind, ranks, element)
    out(json.dumps(report, indent=2) if args.json else _text(report))
    if report["errors"]:  # a rank failed: an error, one line per distinct failure
        raise DetailedError(report["errors"][0], report["errors"][1:])
    return EXIT_OK if report["correct"] else EXIT_ERROR


#: Memory of one rank's process before any buffer (Python, torch, gloo), rounded up.
_RANK_BASE_BYTES = 300 * 10**6


def _rank_bytes(size_bytes: int, element_bytes: int) -> int:
    """Peak memory of one rank for ``--size``: its buffers, their copies, torch's result and
    the float64 reference. Measured on 4 ranks at 64 MiB: 8.5 (float64), 15.6 (float32) and
    25.8 (float16) x the size for allreduce, 9.3 (float32) for allgather; this rounds up."""
    return _RANK_BASE_BYTES + size_bytes * (6 + 48 // element_bytes)


def _size_blocks(kind: str, ranks: int, algorithm) -> int:
    if kind in ("allgather", "reduce_scatter", "alltoall", "gather", "scatter"):
        return ranks
    if kind == "custom" and algorithm is not None:
        coll = algorithm.collective
        return coll.num_chunks // coll.chunk_factor
    return 1


def _figures(timing, size: int, factor: float) -> dict[str, float] | None:
    if timing is None:
        return None
    median = timing.median
    algbw = size / median / 1e9 if median > 0 else float("inf")
    return {"median_s": median, "min_s": timing.min, "max_s": timing.max,
            "algbw_GBps": algbw, "busbw_GBps": algbw * factor}


def _report(args, case, per_rank, label: str, kind: str, ranks: int, element: int
            ) -> dict[str, Any]:
    from collsynth.collective.kinds import busbw_factor
    from collsynth.errors import UnknownNameError
    from collsynth.executor.compare import TORCH_CALLS

    first = per_rank[0]
    # The size the ranks ran; one that failed before it set up its buffers (a call that timed
    # out, a broken group) reports none: the size the run was set up for, not "0 bytes".
    size = next((r.size_bytes for r in per_rank if r.size_bytes), 0) or \
        _size_blocks(kind, ranks, case.algorithm) * case.block_elems * element
    try:  # a custom gather or scatter has the standard one's buffers
        factor = float(busbw_factor(kind.removeprefix("custom_"), ranks))
    except UnknownNameError:  # a custom collective: no nccl-tests convention, busbw = algbw
        factor = 1.0
    # An executor's error may name its rank already ("rank 0: step 0: ..."): not twice.
    errors = [r.error if r.error.startswith(f"rank {r.rank}:") else f"rank {r.rank}: {r.error}"
              for r in per_rank if r.error]
    # One message when every rank says the same thing.
    if errors and len({r.error for r in per_rank if r.error}) == 1 and \
            len(errors) == len(per_rank):
        errors = [per_rank[0].error]
    wrong = [r.rank for r in per_rank if not r.ok and not r.error]
    return {
        "file": args.file,
        "collective": label,
        "kind": kind,
        "ranks": ranks,
        "backend": args.backend,
        "dtype": args.dtype,
        "op": args.op,
        "inplace": bool(args.inplace),
        "size_bytes": size,
        "block_elems": case.block_elems,
        "iters": case.iters,
        "warmup": case.warmup,
        "correct": all(r.ok for r in per_rank),
        "wrong_ranks": wrong,
        "max_error": max(r.max_error for r in per_rank),
        "tolerance": first.tolerance,
        "torch_call": f"torch.distributed.{TORCH_CALLS.get(kind, kind)}",
        "busbw_factor": factor,
        "collsynth": _figures(first.collsynth, size, factor),
        "torch": _figures(first.torch, size, factor),
        "errors": errors,
    }


def _format_time(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.3f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.3f} ms"
    return f"{seconds * 1e6:.1f} us"


def _text(report: dict[str, Any]) -> str:
    place = "in place" if report["inplace"] else "out of place"
    lines = [
        f"{report['file']}: {report['collective']}",
        f"{report['ranks']} ranks, {report['backend']}, {report['dtype']}, op {report['op']}, "
        f"{place}, {report['size_bytes']} bytes per call ({report['block_elems']} elements "
        f"per block)",
    ]
    if report["errors"]:
        lines.append("correct: no (" + "; ".join(report["errors"]) + ")")
    elif report["correct"]:
        how = "exactly" if report["tolerance"] == 0 else \
            f"within {report['tolerance']:.3g} (max error {report['max_error']:.3g})"
        lines.append(f"correct: yes, matches {report['torch_call']} {how}")
    else:
        lines.append(f"correct: NO: differs from {report['torch_call']} on rank(s) "
                     f"{', '.join(map(str, report['wrong_ranks']))} (max error "
                     f"{report['max_error']:.3g}, tolerance {report['tolerance']:.3g})")
    if report["collsynth"] is not None:
        lines.append(f"timing: {report['iters']} iterations after {report['warmup']} warm-up; "
                     f"busbw = algbw x {report['busbw_factor']:.3g}")
        header = f"{'':<10} {'median':>11} {'min':>11} {'max':>11} {'algbw GB/s':>11} " \
                 f"{'busbw GB/s':>11}"
        lines.append(header)
        for name in ("collsynth", "torch"):
            f = report[name]
            if f is None:
                continue
            lines.append(f"{name:<10} {_format_time(f['median_s']):>11} "
                         f"{_format_time(f['min_s']):>11} {_format_time(f['max_s']):>11} "
                         f"{f['algbw_GBps']:>11.4g} {f['busbw_GBps']:>11.4g}")
    return "\n".join(lines)
