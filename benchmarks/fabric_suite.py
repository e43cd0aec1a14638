"""Benchmark of multi-tier fabrics (issue 15: leaf-spine and rail, oversubscribed), one case per
process.

Run from the repository root::

    .venv/bin/python benchmarks/fabric_suite.py [--repeat 3] [--only NAME] [--json OUT]

Each case composes the system (``compose_nodes`` with its fabric), computes the exact bound
(``optimal_throughput``) and then a verified schedule (``solve_large``, which computes the bound
again as part of its work), in a fresh subprocess, ``--repeat`` times. The table shows the
median [min-max] seconds of bound + schedule (the target) and of each part, the peak resident
memory, the rounds per chunk reached (steady state) and the bound.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

CASES = {
    # name: (node, nodes, fabric, nodes per leaf, oversubscription, collective, target seconds)
    "rail-h100x128-2:1-ag": ("dgx-h100", 128, "rail", None, "2", "allgather", 60),
    "rail-h100x128-2:1-ar": ("dgx-h100", 128, "rail", None, "2", "allreduce", None),
    "leaf-h100x128-16pl-2:1-ag": ("dgx-h100", 128, "leaf-spine", 16, "2", "allgather", None),
    "leaf-h100x128-2pl-4:1-ag": ("dgx-h100", 128, "leaf-spine", 2, "4", "allgather", None),
    "switch-h100x128-ag": ("dgx-h100", 128, "switch", None, "1", "allgather", None),
}

_CHILD = r"""
import json, resource, sys, time
from collsynth.collective import standard_collective
from collsynth.resolve import resolve_topology
node, nodes, fabric, per_leaf, ratio, name = sys.argv[1:7]
tick = time.perf_counter()
topology = resolve_topology(node, nodes=int(nodes), fabric=fabric, oversubscription=ratio,
                            nodes_per_leaf=None if per_leaf == "-" else int(per_leaf))
build = time.perf_counter() - tick
collective = standard_collective(name, topology.num_ranks)
from collsynth.bounds.throughput import optimal_throughput
from collsynth.synthesis.large import solve_large
tick = time.perf_counter()
bound = optimal_throughput(topology, collective).rounds_per_chunk
bound_s = time.perf_counter() - tick
tick = time.perf_counter()
result = solve_large(topology, collective)
solve_s = time.perf_counter() - tick
out = result.to_json()
out.update(build_s=build, bound_s=bound_s, solve_s=solve_s, exact_bound=str(bound),
           peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
print(json.dumps(out))
"""


def run_case(name: str) -> dict:
    node, nodes, fabric, per_leaf, ratio, collective, _ = CASES[name]
    done = subprocess.run([sys.executable, "-c", _CHILD, node, str(nodes), fabric,
                           "-" if per_leaf is None else str(per_leaf), ratio, collective],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{name} failed: {done.stderr.strip()[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _spread(values) -> str:
    return f"{statistics.median(values):.1f} [{min(values):.1f}-{max(values):.1f}]"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--only", action="append", choices=sorted(CASES))
    parser.add_argument("--json", metavar="OUT")
    args = parser.parse_args(argv)
    rows = []
    for name in args.only or list(CASES):
        runs = []
        for _ in range(args.repeat):
            runs.append(run_case(name))
            total = runs[-1]["bound_s"] + runs[-1]["solve_s"]
            print(f"{name}: bound + schedule {total:.1f} s", file=sys.stderr, flush=True)
        last = runs[-1]
        rows.append({"case": name, "target_s": CASES[name][-1],
                     "total_s": [r["bound_s"] + r["solve_s"] for r in runs],
                     "build_s": [r["build_s"] for r in runs],
                     "bound_s": [r["bound_s"] for r in runs],
                     "solve_s": [r["solve_s"] for r in runs],
                     "peak_rss_mb": max(r["peak_rss_mb"] for r in runs),
                     **{k: last.get(k) for k in ("engine", "steps", "sends", "rounds_per_chunk",
                                                 "steady_state_rounds_per_chunk", "lower_bound",
                                                 "exact_bound", "optimal")}})
    print("| case | bound + schedule s | target | build s | bound s | schedule s | peak MB | "
          "rounds/chunk (steady) | bound | optimal |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        target = "-" if row["target_s"] is None else f"<= {row['target_s']}"
        print(f"| {row['case']} | {_spread(row['total_s'])} | {target} | "
              f"{_spread(row['build_s'])} | {_spread(row['bound_s'])} | "
              f"{_spread(row['solve_s'])} | {row['peak_rss_mb']:.0f} | "
              f"{row['rounds_per_chunk']} ({row['steady_state_rounds_per_chunk']}) | "
              f"{row['exact_bound']} | {row['optimal']} |")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(rows, handle, indent=2)
    return 0


if __name__ == "__main__":
    started = time.perf_counter()
    code = main()
    print(f"total {time.perf_counter() - started:.0f} s", file=sys.stderr)
    sys.exit(code)
