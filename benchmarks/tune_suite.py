"""Tuned export against the untuned one: the chosen layout per size and its predicted algbw.

    python benchmarks/tune_suite.py [--runtime msccl] [--json out.json]

Cases: DGX-1 allgather (the 3-step, 7 rounds / 6 chunks algorithm of the Pareto front), DGX-1
allreduce (the Pareto front's bandwidth end with at most 4 chunks), and DGX A100 x 2 allgather
(the bandwidth-optimal engine's one-stage schedule: its pipelined one has 1456 chunks, over every
runtime's steps-per-threadblock limit). Each is tuned with :func:`collsynth.timing.tune.tune_export`
on the runtime's documented constants at 1 KiB .. 1 GiB in x4 steps. Figures are predictions of
the program model (docs/runtime-model.md), not measurements.
"""

from __future__ import annotations

import argparse
import json
import time

from collsynth.collective import standard_collective
from collsynth.resolve import resolve_topology
from collsynth.synthesis import SolveOptions, pareto_front, solve_instance
from collsynth.synthesis.instance import Instance
from collsynth.timing.tune import tune_export, tune_sizes


def _dgx1_allgather():
    topology = resolve_topology("dgx1")
    result = solve_instance(topology, standard_collective("allgather", 8),
                            Instance(steps=3, rounds=7, chunks=6),
                            options=SolveOptions(time_limit=300))
    return result.algorithm


def _dgx1_allreduce():
    topology = resolve_topology("dgx1")
    front = [r.algorithm for r in pareto_front(topology, standard_collective("allreduce", 8),
                                               max_chunks=4,
                                               options=SolveOptions(time_limit=300))
             if r.algorithm is not None]
    return min(front, key=lambda a: (a.rounds_per_chunk, a.num_steps))


def _a100x2_allgather():
    from collsynth.synthesis.bandwidth_optimal import solve_bandwidth_optimal

    topology = resolve_topology("dgx-a100", nodes=2)
    return solve_bandwidth_optimal(topology, standard_collective("allgather", 16), stages=1,
                                   time_limit=300).algorithm


CASES = (("DGX-1 allgather 3/7/6", _dgx1_allgather),
         ("DGX-1 allreduce", _dgx1_allreduce),
         ("DGX A100 x2 allgather", _a100x2_allgather))


def _size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n // scale} {unit}"
    return f"{n} B"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runtime", default="msccl")
    parser.add_argument("--json")
    args = parser.parse_args()
    out = []
    for label, build in CASES:
        algorithm = build()
        started = time.perf_counter()
        tuned = tune_export(algorithm, args.runtime, sizes=tune_sizes())
        seconds = time.perf_counter() - started
        print(f"\n### {label}: {algorithm.name} ({algorithm.num_steps} steps, "
              f"{algorithm.chunks} chunks), {args.runtime}, {len(tuned.tried)} variants priced, "
              f"{seconds:.1f} s\n")
        print("| size | chosen layout | algbw (GB/s) | untuned algbw (GB/s) | speed-up |")
        print("|---:|---|---:|---:|---:|")
        for row in tuned.rows:
            print(f"| {_size(row.size_bytes)} | {row.variant.label} | {row.algbw_gbps:.2f} | "
                  f"{row.untuned_algbw_gbps:.2f} | {row.speedup:.2f}x |")
        print("\nranges: " + "; ".join(
            f"{r.min_bytes}..{'inf' if r.max_bytes is None else r.max_bytes}: {r.variant.label}"
            for r in tuned.ranges))
        out.append({"case": label, "algorithm": algorithm.name, "seconds": seconds,
                    "rows": [r.as_dict() for r in tuned.rows],
                    "ranges": [{"min_bytes": r.min_bytes, "max_bytes": r.max_bytes,
                                "variant": r.variant.label} for r in tuned.ranges]})
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(out, handle, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
