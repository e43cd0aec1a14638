"""Export every front of the benchmark suite for every runtime, check each program, and print a
table (threadblocks per GPU, most steps in one threadblock, scratch chunks per GPU, verdict).

    python benchmarks/export_suite.py [--out benchmarks/results/export.json]

Cases are those of ``run_suite.py`` that produce algorithms. A program that fails the check
(strict: send-buffer writes count as problems) is reported, never silently skipped.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from collsynth.collective import standard_collective
from collsynth.errors import ExportError
from collsynth.export import check_program, lower, read_program, write_program
from collsynth.export.stats import program_stats
from collsynth.runtimes import MSCCL_XML, runtime_names
from collsynth.synthesis import SolveOptions, pareto_front, solve_least_steps
from collsynth.topology import get_topology

# name, topology, collective, root, strategy, max_chunks
CASES = [
    ("dgx1-allgather-pareto", "dgx1", "allgather", None, "pareto", None),
    ("dgx1-alltoall-least-steps", "dgx1", "alltoall", None, "least", None),
    ("dgx1-alltoall-pareto", "dgx1", "alltoall", None, "pareto", None),
    ("hub16-allgather-least-steps", "hub:16", "allgather", None, "least", None),
    ("fc4-allreduce-pareto-6", "fully-connected:4", "allreduce", None, "pareto", 6),
    ("dgx1-allreduce-pareto-4", "dgx1", "allreduce", None, "pareto", 4),
    ("fc16-allgather-least-steps", "fully-connected:16", "allgather", None, "least", None),
    ("ring8-allgather-pareto", "ring:8", "allgather", None, "pareto", None),
    ("dgx1-broadcast-pareto-6", "dgx1", "broadcast", 0, "pareto", 6),
    ("dgx1-reduce_scatter-pareto", "dgx1", "reduce_scatter", None, "pareto", None),
]


def _algorithms(topology_name, collective_name, root, strategy, max_chunks):
    topology = get_topology(topology_name)
    collective = standard_collective(collective_name, topology.num_ranks, root=root)
    options = SolveOptions(time_limit=120)
    if strategy == "least":
        return [solve_least_steps(topology, collective, options=options).algorithm]
    return [r.algorithm for r in pareto_front(topology, collective, max_chunks=max_chunks,
                                              options=options)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results/export.json")
    args = parser.parse_args()
    rows, failures = [], 0
    print("| case | algorithm | runtime | tbs/GPU | max steps/tb | scratch/GPU | check | seconds |")
    print("|---|---|---|---:|---:|---:|---|---:|")
    for name, topo, coll, root, strategy, max_chunks in CASES:
        for algorithm in _algorithms(topo, coll, root, strategy, max_chunks):
            label = f"{algorithm.num_steps}/{algorithm.num_rounds}/{algorithm.chunks}"
            for runtime in runtime_names(MSCCL_XML):
                started = time.perf_counter()
                try:
                    program = lower(algorithm, runtime=runtime)
                    text = write_program(program, runtime)
                    again = read_program(text, runtime=runtime)
                    report = check_program(again, runtime=runtime, collective=coll, root=root,
                                           strict=True)
                    stable = write_program(again, runtime) == text
                    stats = program_stats(program)
                    verdict = "correct" if report.ok and stable else (
                        "NOT STABLE" if report.ok else f"{len(report.problems)} problems")
                    row = {"case": name, "algorithm": label, "runtime": runtime,
                           "threadblocks": [min(stats.threadblocks), max(stats.threadblocks)],
                           "max_steps_per_tb": stats.max_steps_per_threadblock,
                           "scratch": stats.max_scratch_chunks,
                           "check": verdict, "seconds": round(time.perf_counter() - started, 3)}
                except ExportError as exc:
                    row = {"case": name, "algorithm": label, "runtime": runtime,
                           "threadblocks": None, "max_steps_per_tb": None, "scratch": None,
                           "check": f"not exportable: {exc}", "seconds": None}
                failures += row["check"] != "correct"
                rows.append(row)
                tbs = row["threadblocks"]
                print(f"| {name} | {label} | {runtime} | "
                      f"{'-' if tbs is None else (tbs[0] if tbs[0] == tbs[1] else f'{tbs[0]}-{tbs[1]}')} | "
                      f"{row['max_steps_per_tb'] if row['max_steps_per_tb'] is not None else '-'} | "
                      f"{row['scratch'] if row['scratch'] is not None else '-'} | {row['check']} | "
                      f"{row['seconds'] if row['seconds'] is not None else '-'} |", flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(rows, indent=1) + "\n")
    print(f"\n{len(rows) - failures} of {len(rows)} exports correct; wrote {args.out}")
    return 0 if failures == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
