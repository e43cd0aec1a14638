#!/usr/bin/env python
"""Run collsynth's fixed benchmark suite and compare it with msccl-tools.

Each case runs in a fresh Python process (so no case warms another: imports, caches, solver
start-up are paid every time), which times the library call itself and prints one JSON line.
This script collects those lines, prints a markdown table and writes every run to a JSON file.

    python benchmarks/run_suite.py                      # the whole suite, once
    python benchmarks/run_suite.py --repeat 3           # median, min and max of 3 runs per case
    python benchmarks/run_suite.py --only dgx1-bounds,ring8-allgather-pareto --backend z3

Columns: ``seconds`` (wall time of the library call; with ``--repeat`` the median and [min-max]),
``outcome`` (the front as ``(steps, rounds per chunk)`` points, or the steps found),
``vs msccl`` (``yes`` when every msccl-tools point is equalled or beaten by one of ours: no more
steps and no more rounds per chunk; for bounds, when each of our lower bounds is at least
msccl-tools'), ``target`` (seconds the issue asks for) and ``met``, ``complete`` (the sweep's
``SweepLog.complete``: false when an instance timed out, so a point may not be optimal).

The msccl-tools figures are from docs/baselines.md (msccl-tools 2.3.0 on this kind of
machine).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "suite.json"
#: Seconds a case process may run beyond its time limit (bounds, start-up) before it is killed.
GRACE_S = 120


@dataclass(frozen=True)
class Case:
    """One benchmark: what to run, and what msccl-tools did on it.

    ``kind`` is ``pareto``, ``least-steps``, ``instance`` or ``bounds``. Points are
    ``(steps, rounds per chunk)``; for a least-steps case, ``msccl_front`` holds the one point
    msccl-tools found (steps, steps at one round per step). ``msccl_front = None`` means msccl-tools
    gave no answer; ``expected`` is the outcome collsynth must give (``None``: not fixed).
    """

    name: str
    kind: str
    topology: str
    collective: str
    root: int | None = None
    max_chunks: int | None = None
    instance: tuple[int, int, int] | None = None
    time_limit: float = 300.0
    target_s: float | None = None
    msccl_s: str = "-"
    msccl_front: tuple[tuple[int, Fraction], ...] | None = None
    expected: tuple[tuple[int, Fraction], ...] | None = None
    bounds_of: tuple[tuple[str, int | None], ...] = ()
    msccl_bounds: dict[str, tuple[int, Fraction]] = field(default_factory=dict)


F = Fraction
CASES = (
    Case("dgx1-allgather-pareto", "pareto", "dgx1", "allgather", target_s=6, msccl_s="44-74",
         msccl_front=((2, F(3, 2)), (3, F(7, 6))), expected=((2, F(3, 2)), (3, F(7, 6)))),
    Case("dgx1-alltoall-least-steps", "least-steps", "dgx1", "alltoall", target_s=2,
         msccl_s="11-23", msccl_front=((3, F(3)),), expected=((3, F(3)),)),
    Case("dgx1-alltoall-pareto", "pareto", "dgx1", "alltoall", time_limit=600, target_s=120,
         msccl_s="> 600", msccl_front=((2, F(3)),)),
    Case("hub16-allgather-least-steps", "least-steps", "hub:16", "allgather", target_s=30,
         msccl_s="> 300", msccl_front=None, expected=((15, F(15)),)),
    Case("fc4-allreduce-pareto-6", "pareto", "fully-connected:4", "allreduce", max_chunks=6,
         target_s=5, msccl_s="65-92", msccl_front=((1, F(1)), (2, F(2, 3)))),
    Case("dgx1-allreduce-pareto-4", "pareto", "dgx1", "allreduce", max_chunks=4, target_s=7,
         msccl_s="51-71", msccl_front=((2, F(1)),)),
    Case("fc16-allgather-least-steps", "least-steps", "fully-connected:16", "allgather",
         target_s=5, msccl_s="215", msccl_front=((1, F(1)),), expected=((1, F(1)),)),
    Case("ring8-allgather-pareto", "pareto", "ring:8", "allgather", msccl_s="0.9",
         msccl_front=((4, F(7, 2)),)),
    Case("dgx1-broadcast-pareto-6", "pareto", "dgx1", "broadcast", root=0, max_chunks=6,
         msccl_s="2.4", msccl_front=((2, F(4, 3)), (3, F(3, 5)))),
    Case("dgx1-bounds", "bounds", "dgx1", "-", msccl_s="0.3-3.8",
         bounds_of=(("allgather", None), ("alltoall", None), ("gather", 0), ("scatter", 0),
                    ("broadcast", 0), ("reduce_scatter", None), ("allreduce", None)),
         msccl_bounds={"allgather": (2, F(7, 6)), "alltoall": (2, F(5, 3)),
                       "reduce_scatter": (2, F(7, 6)), "gather": (2, F(7, 6)),
                       "scatter": (2, F(7, 24)), "broadcast": (2, F(1, 6))}),
    Case("dgx1-allgather-instance-3-7-6", "instance", "dgx1", "allgather", instance=(3, 7, 6),
         msccl_s="36.8", msccl_front=((3, F(7, 6)),), expected=((3, F(7, 6)),)),
)
BY_NAME = {case.name: case for case in CASES}


# -- inside the case process ----------------------------------------------------------------------


def run_case(case: Case, backend: str, time_limit: float) -> dict:
    """Run one case in this process; return a JSON-ready record (seconds around the call)."""
    from collsynth.algorithm import Instance
    from collsynth.bounds import compute_bounds
    from collsynth.collective import standard_collective
    from collsynth.synthesis import (SolveOptions, Status, SweepLog, pareto_front, solve_instance,
                                     solve_least_steps)
    from collsynth.topology import get_topology

    topology = get_topology(case.topology)
    n = topology.num_ranks
    options = SolveOptions(backend=backend, time_limit=time_limit)
    record: dict = {"points": [], "complete": None, "status": None, "detail": ""}

    if case.kind == "bounds":
        values = {}
        started = time.perf_counter()
        for name, root in case.bounds_of:
            one = time.perf_counter()
            bounds = compute_bounds(topology, standard_collective(name, n, root=root))
            values[name] = {"steps": bounds.steps, "rounds_per_chunk": str(bounds.rounds_per_chunk),
                            "seconds": round(time.perf_counter() - one, 3)}
            if bounds.composed_rounds_per_chunk is not None:
                values[name]["composed_rounds_per_chunk"] = str(bounds.composed_rounds_per_chunk)
        record["seconds"] = time.perf_counter() - started
        record["bounds"] = values
        return record

    collective = standard_collective(case.collective, n, root=case.root)
    started = time.perf_counter()
    if case.kind == "pareto":
        log = SweepLog()
        front = list(pareto_front(topology, collective, max_chunks=case.max_chunks,
                                  options=options, log=log))
        record["seconds"] = time.perf_counter() - started
        record["points"] = [[r.instance.steps, str(r.rounds_per_chunk)] for r in front]
        record["instances"] = [[r.instance.steps, r.instance.total_rounds, r.instance.chunks]
                               for r in front]
        record["complete"] = log.complete
        record["detail"] = log.stopped_by
        record["attempts"] = len(log.attempts)
        return record
    if case.kind == "least-steps":
        result = solve_least_steps(topology, collective, options=options)
    elif case.kind == "instance":
        steps, rounds, chunks = case.instance
        result = solve_instance(topology, collective,
                                Instance(steps=steps, rounds=rounds, chunks=chunks), options=options)
    else:
        raise ValueError(f"unknown case kind {case.kind!r}")
    record["seconds"] = time.perf_counter() - started
    record["status"] = result.status.value
    record["detail"] = result.detail
    if result.status is Status.SAT:
        record["points"] = [[result.instance.steps, str(result.rounds_per_chunk)]]
    return record


# -- in the driver --------------------------------------------------------------------------------


def spawn(case: Case, backend: str, time_limit: float) -> dict:
    """Run ``case`` in a fresh interpreter; return its record (or why there is none)."""
    command = [sys.executable, str(Path(__file__).resolve()), "--worker", case.name,
               "--backend", backend, "--time-limit", str(time_limit)]
    started = time.perf_counter()
    try:
        done = subprocess.run(command, capture_output=True, text=True,
                              timeout=time_limit + GRACE_S)
    except subprocess.TimeoutExpired:
        return {"error": f"killed after {time_limit + GRACE_S:.0f} s",
                "process_seconds": time.perf_counter() - started}
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": f"exit {done.returncode}: {tail}",
                "process_seconds": time.perf_counter() - started}
    record = json.loads(lines[-1])
    record["process_seconds"] = time.perf_counter() - started
    return record


def points_of(record: dict) -> tuple[tuple[int, Fraction], ...]:
    return tuple((steps, Fraction(rounds)) for steps, rounds in record.get("points", []))


def show_points(points) -> str:
    return " ".join(f"({s}, {r})" for s, r in points)


def outcome_of(case: Case, record: dict) -> str:
    """One short text: the front, the steps found, or the bounds."""
    if "error" in record:
        return record["error"]
    if case.kind == "bounds":
        return "; ".join(f"{name} {v['steps']}, {v['rounds_per_chunk']}"
                         for name, v in record["bounds"].items())
    points = points_of(record)
    if case.kind == "least-steps":
        if not points:
            return record["status"]
        return f"{points[0][0]} step{'s' if points[0][0] != 1 else ''}"
    if case.kind == "instance":
        return f"{record['status']} {show_points(points)}".strip()
    return show_points(points) or "no point"


def dominates(ours, theirs) -> bool:
    """Every point of ``theirs`` is equalled or beaten by one of ``ours``."""
    return all(any(s <= ts and r <= tr for s, r in ours) for ts, tr in theirs)


def versus_msccl(case: Case, record: dict) -> str:
    if "error" in record:
        return "-"
    if case.kind == "bounds":
        ours = record["bounds"]
        tighter = all(ours[name]["steps"] >= steps
                      and Fraction(ours[name]["rounds_per_chunk"]) >= rounds
                      for name, (steps, rounds) in case.msccl_bounds.items())
        return "yes (bounds >=)" if tighter else "no"
    ours = points_of(record)
    if case.msccl_front is None:
        return "yes (msccl: none)" if ours else "-"
    if case.kind == "least-steps":  # compare steps only (both at one round per step)
        return "yes" if ours and ours[0][0] <= case.msccl_front[0][0] else "no"
    return "yes" if dominates(ours, case.msccl_front) else "no"


def summarize(case: Case, runs: list[dict]) -> dict:
    """The case's row: median/min/max seconds over the runs and the comparisons."""
    good = [r for r in runs if "error" not in r]
    seconds = [r["seconds"] for r in good]
    first = good[0] if good else runs[0]
    outcomes = sorted({outcome_of(case, r) for r in runs})
    row = {
        "case": case.name,
        "kind": case.kind,
        "runs": runs,
        "seconds_median": statistics.median(seconds) if seconds else None,
        "seconds_min": min(seconds) if seconds else None,
        "seconds_max": max(seconds) if seconds else None,
        "outcome": outcome_of(case, first) if len(outcomes) == 1 else "varies: " + " | ".join(outcomes),
        "vs_msccl": versus_msccl(case, first),
        "msccl_seconds": case.msccl_s,
        "msccl_outcome": show_points(case.msccl_front) if case.msccl_front else "no answer",
        "target_s": case.target_s,
        "target_met": (None if case.target_s is None or not seconds
                       else len(seconds) == len(runs) and statistics.median(seconds) <= case.target_s),
        "expected": show_points(case.expected) if case.expected else None,
        "expected_ok": (None if case.expected is None
                        else all(points_of(r) == case.expected for r in runs)),
        "complete": (None if case.kind != "pareto" or not good
                     else all(r["complete"] for r in good)),
    }
    return row


def table(rows: list[dict]) -> str:
    def cell(value) -> str:
        return "-" if value is None else ("yes" if value else "no")

    lines = ["| case | seconds | outcome | as expected | vs msccl | msccl s | target s | met | complete |",
             "|---|---:|---|---|---|---:|---:|---|---|"]
    for row in rows:
        if row["seconds_median"] is None:
            secs = "-"
        elif row["seconds_min"] == row["seconds_max"]:
            secs = f"{row['seconds_median']:.2f}"
        else:
            secs = f"{row['seconds_median']:.2f} [{row['seconds_min']:.2f}-{row['seconds_max']:.2f}]"
        target = "-" if row["target_s"] is None else f"<= {row['target_s']:g}"
        lines.append(f"| {row['case']} | {secs} | {row['outcome']} | {cell(row['expected_ok'])} | "
                     f"{row['vs_msccl']} | {row['msccl_seconds']} | {target} | "
                     f"{cell(row['target_met'])} | {cell(row['complete'])} |")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=1, help="runs per case (default 1)")
    parser.add_argument("--only", default="", help="comma-separated case names")
    parser.add_argument("--backend", default="auto", help="auto, cpsat or z3 (default auto)")
    parser.add_argument("--time-limit", type=float, default=None,
                        help="seconds per case (default: the case's own, 300 or 600)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"JSON file (default {DEFAULT_OUT})")
    parser.add_argument("--list", action="store_true", help="list the cases and exit")
    parser.add_argument("--worker", help=argparse.SUPPRESS)  # run one case here, print JSON
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        case = BY_NAME[args.worker]
        limit = args.time_limit if args.time_limit is not None else case.time_limit
        print(json.dumps(run_case(case, args.backend, limit)))
        return 0
    if args.list:
        for case in CASES:
            print(case.name)
        return 0
    names = [n.strip() for n in args.only.split(",") if n.strip()] or list(BY_NAME)
    unknown = [n for n in names if n not in BY_NAME]
    if unknown or args.repeat < 1:
        print(f"unknown case(s) {', '.join(unknown)}; known: {', '.join(BY_NAME)}"
              if unknown else "--repeat must be >= 1", file=sys.stderr)
        return 2
    rows = []
    for name in names:
        case = BY_NAME[name]
        limit = args.time_limit if args.time_limit is not None else case.time_limit
        runs = []
        for i in range(args.repeat):
            print(f"[{name} run {i + 1}/{args.repeat}]", file=sys.stderr, flush=True)
            runs.append(spawn(case, args.backend, limit))
        rows.append(summarize(case, runs))
        median = rows[-1]["seconds_median"]
        print(f"  {rows[-1]['outcome']}" + ("" if median is None else f" ({median:.2f} s)"),
              file=sys.stderr, flush=True)
    print(table(rows))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    report = {
        "machine": {"platform": platform.platform(), "processor": platform.processor(),
                    "python": platform.python_version()},
        "backend": args.backend,
        "repeat": args.repeat,
        "time_limit": args.time_limit,
        "cases": rows,
    }
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"\nwrote {args.out}", file=sys.stderr)
    return 1 if any("error" in run for row in rows for run in row["runs"]) else 0


if __name__ == "__main__":
    sys.exit(main())
