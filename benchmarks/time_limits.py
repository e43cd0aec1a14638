"""Does every engine honour its time limit? Elapsed / limit per engine, median of 3.

Run from the repository root::

    .venv/bin/python benchmarks/time_limits.py [--limit 5] [--repeat 3] [--only NAME] [--json OUT]

Each case is a search that cannot finish within ``--limit`` seconds (or, for the engines whose
work is one schedule, a system large enough that it may not; the ``-8192`` cases, DGX A100 x 1024,
for every engine), run in process so that start-up is not counted: the library call's wall time over the limit, and how it ended (``timeout`` /
``interrupted`` statuses, a point found, ``refused`` up front, ``time limit`` raised, or ``done``
when it finished early). The target is a ratio of at most 1.1.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Callable


def _cases(limit: float) -> dict[str, Callable[[], str]]:
    from collsynth.algorithm.model import Instance
    from collsynth.collective import standard_collective
    from collsynth.errors import InputTooLargeError
    from collsynth.limits import TimeLimitReached
    from collsynth.resolve import resolve_topology
    from collsynth.synthesis import (
        SolveOptions,
        SweepLog,
        pareto_front,
        solve_instance,
        solve_least_steps,
    )
    from collsynth.synthesis.large import solve_large

    dgx1 = resolve_topology("dgx1")
    hub16 = resolve_topology("hub:16")
    a100x64 = resolve_topology("dgx-a100", nodes=64)
    a100x72 = resolve_topology("dgx-a100", nodes=72)
    a100x96 = resolve_topology("dgx-a100", nodes=96)
    torus16 = resolve_topology("torus:16x16")
    rail = resolve_topology("dgx-h100", nodes=32, fabric="rail", oversubscription="2")
    a100x1024 = resolve_topology("dgx-a100", nodes=1024)   # 8192 ranks

    def pareto(backend: str) -> Callable[[], str]:
        def run() -> str:
            log = SweepLog()
            front = list(pareto_front(dgx1, standard_collective("allgather", 8), max_chunks=1000,
                                      options=SolveOptions(backend=backend, time_limit=limit),
                                      log=log))
            return f"{len(front)} point(s), {log.stopped_by or 'complete'}"
        return run

    def least_steps() -> str:
        return solve_least_steps(hub16, standard_collective("allgather", 16),
                                 options=SolveOptions(time_limit=limit)).status.value

    def instance() -> str:  # 88/60 < 3/2 at 2 steps: unsatisfiable, and hard to prove
        return solve_instance(dgx1, standard_collective("allgather", 8),
                              Instance(steps=2, rounds=88, chunks=60),
                              options=SolveOptions(time_limit=limit)).status.value

    def large(topology, collective: str, engine: str) -> Callable[[], str]:
        # built here, not timed: the limit is the engine's
        try:
            built = standard_collective(collective, topology.num_ranks)
        except InputTooLargeError:   # alltoall of 8192 ranks: 67M chunks
            return lambda: "refused (collective)"

        def run() -> str:
            try:
                result = solve_large(topology, built, engine=engine, time_limit=limit)
            except TimeLimitReached:
                return "time limit"
            except InputTooLargeError:
                return "refused"
            return f"done ({'optimal' if result.optimal else 'not proven optimal'})"
        return run

    return {
        "pareto-cpsat": pareto("cpsat"),
        "pareto-z3": pareto("z3"),
        "least-steps-cpsat": least_steps,
        "instance-cpsat": instance,
        "exact": large(dgx1, "allgather", "exact"),
        "trees-576": large(a100x72, "allgather", "trees"),
        "alltoall-512": large(a100x64, "alltoall", "alltoall"),
        "hierarchical-768": large(a100x96, "allgather", "hierarchical"),
        "hierarchical-ar-512": large(a100x64, "allreduce", "hierarchical"),
        "alltoall-routed-256": large(torus16, "alltoall", "alltoall"),
        "alltoall-rail-256": large(rail, "alltoall", "alltoall"),
        "trees-torus-256": large(torus16, "allgather", "trees"),
        # 8192 ranks (DGX A100 x 1024): every engine stops at its limit, or refuses up front.
        "trees-8192": large(a100x1024, "allgather", "trees"),
        "trees-ar-8192": large(a100x1024, "allreduce", "trees"),
        "hierarchical-8192": large(a100x1024, "allgather", "hierarchical"),
        "alltoall-8192": large(a100x1024, "alltoall", "alltoall"),
        "exact-8192": large(a100x1024, "allgather", "exact"),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=float, default=5.0, help="seconds (default 5)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--only", action="append", help="run only this case (repeatable)")
    parser.add_argument("--json", metavar="OUT", help="also write the figures as JSON")
    args = parser.parse_args()
    cases = _cases(args.limit)
    rows = []
    print(f"{'case':<20} {'limit s':>7} {'median s':>9} {'ratio':>6}  how it ended", flush=True)
    for name, run in cases.items():
        if args.only and name not in args.only:
            continue
        seconds, endings = [], []
        for _ in range(args.repeat):
            started = time.perf_counter()
            endings.append(run())
            seconds.append(time.perf_counter() - started)
        median = statistics.median(seconds)
        rows.append({"case": name, "limit_s": args.limit, "seconds": seconds,
                     "median_s": median, "ratio": median / args.limit, "endings": endings})
        print(f"{name:<20} {args.limit:>7g} {median:>9.2f} {median / args.limit:>6.2f}  "
              f"{'; '.join(sorted(set(endings)))}", flush=True)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump(rows, out, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
