"""collsynth's executor vs torch's built-in collectives on gloo (CPU, one machine).

    python benchmarks/gloo_timings.py [--sizes 1MiB,64MiB] [--ranks 4,8] [--iters 10]
                                      [--time-limit 60] [--json OUT.json]

For allgather and allreduce on 4 ranks (topologies ring:4 and fully-connected:4) and 8 ranks
(ring:8 and dgx1), the Pareto front of each (topology, collective) is synthesized and, for each
size, the point with the lowest alpha-beta cost is run (alpha = 100 us per step, 1 GB/s per link;
a rough model of gloo over loopback). Each algorithm is run with
:func:`collsynth.executor.run_cases` next to torch's own collective on the same tensors (checked
for correctness first), all cases of one rank count in one process group. The table gives the
median time over the iterations (each iteration timed by its slowest rank) and the nccl-tests
bandwidths: algbw = size / time, busbw = algbw x (allreduce 2(n-1)/n, allgather (n-1)/n), with
size = the larger buffer of one rank (allgather: the output).

The topology is what the algorithm was synthesized for; on one CPU machine every "link" is a
loopback TCP connection, so the figures measure schedule overheads (steps, messages, chunking)
more than topology fit.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from fractions import Fraction

from collsynth.cli.execute import parse_run_size
from collsynth.collective import standard_collective
from collsynth.executor import Case, launch, run_cases
from collsynth.synthesis import SolveOptions, pareto_front
from collsynth.topology import get_topology

TOPOLOGIES = {4: ("ring:4", "fully-connected:4"), 8: ("ring:8", "dgx1")}
COLLECTIVES = ("allgather", "allreduce")
ALPHA_S = 100e-6
BYTES_PER_S = 1e9


def _cost(steps: int, rounds_per_chunk: Fraction, base_chunk_bytes: int) -> float:
    return steps * ALPHA_S + float(rounds_per_chunk) * base_chunk_bytes / BYTES_PER_S


def _front(topology: str, collective: str, time_limit: float):
    topo = get_topology(topology)
    coll = standard_collective(collective, topo.num_ranks)
    return [r.algorithm for r in pareto_front(topo, coll, max_chunks=8,
                                              options=SolveOptions(time_limit=time_limit))]


def _size_label(size: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size % scale == 0:
            return f"{size // scale} {unit}"
    return f"{size} B"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1MiB,64MiB")
    parser.add_argument("--ranks", default="4,8")
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--time-limit", type=float, default=60.0,
                        help="seconds per Pareto front")
    parser.add_argument("--json", metavar="OUT", help="also write the rows as JSON")
    args = parser.parse_args(argv)
    sizes = [parse_run_size(s) for s in args.sizes.split(",")]
    rows = []
    for n in (int(r) for r in args.ranks.split(",")):
        cases, meta = [], []
        for topology in TOPOLOGIES[n]:
            for collective in COLLECTIVES:
                started = time.perf_counter()
                front = _front(topology, collective, args.time_limit)
                print(f"# {topology} {collective}: front "
                      f"{[(a.num_steps, a.num_rounds, a.chunks) for a in front]} "
                      f"({time.perf_counter() - started:.1f} s)", file=sys.stderr, flush=True)
                for size in sizes:
                    elems = size // 4
                    block = elems // n if collective == "allgather" else elems
                    base_bytes = block * 4
                    best = min(front, key=lambda a: _cost(a.num_steps, a.rounds_per_chunk,
                                                          base_bytes))
                    big = size >= 16 * 2**20
                    cases.append(Case(f"{topology}/{collective}/{size}", block, algorithm=best,
                                      dtype="float32", iters=max(3, args.iters // 2) if big
                                      else args.iters, warmup=1 if big else 3,
                                      timeout_s=600))
                    meta.append((n, topology, collective, size, best))
        print(f"# running {len(cases)} cases on {n} ranks", file=sys.stderr, flush=True)
        per_rank = launch(run_cases, n, args=(cases,), timeout_s=3600)
        for i, (n_, topology, collective, size, algorithm) in enumerate(meta):
            results = [per_rank[r][i] for r in range(n)]
            first = results[0]
            factor = 2 * (n - 1) / n if collective == "allreduce" else (n - 1) / n
            row = {"ranks": n_, "topology": topology, "collective": collective,
                   "size_bytes": first.size_bytes, "correct": all(r.ok for r in results),
                   "algorithm": f"{algorithm.num_steps} steps, {algorithm.num_rounds} rounds, "
                                f"{algorithm.chunks} chunks"}
            for name, timing in (("collsynth", first.collsynth), ("torch", first.torch)):
                algbw = first.size_bytes / timing.median / 1e9
                row[name] = {"median_ms": timing.median * 1e3, "algbw_GBps": algbw,
                             "busbw_GBps": algbw * factor}
            rows.append(row)
    print("| ranks | topology | collective | size | algorithm | correct | collsynth median | "
          "torch median | collsynth algbw / busbw (GB/s) | torch algbw / busbw (GB/s) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        c, t = row["collsynth"], row["torch"]
        print(f"| {row['ranks']} | {row['topology']} | {row['collective']} | "
              f"{_size_label(row['size_bytes'])} | {row['algorithm']} | "
              f"{'yes' if row['correct'] else 'NO'} | {c['median_ms']:.2f} ms | "
              f"{t['median_ms']:.2f} ms | {c['algbw_GBps']:.3f} / {c['busbw_GBps']:.3f} | "
              f"{t['algbw_GBps']:.3f} / {t['busbw_GBps']:.3f} |")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=2)
    return 0 if all(r["correct"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
