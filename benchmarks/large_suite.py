"""Benchmark of the large-system engines (issue 6 targets), one case per process.

Run from the repository root::

    .venv/bin/python benchmarks/large_suite.py [--repeat 3] [--only NAME] [--json OUT]

Each case runs in a fresh subprocess (so its peak memory, ``ru_maxrss``, is its own) ``--repeat``
times; the table shows the median [min-max] seconds of the library call, the peak resident
memory, the rounds per chunk reached, the lower bound, and predicted times at 1 MiB, 64 MiB and
1 GiB next to NCCL's best ring and tree protocols (alpha-beta model of collsynth.timing, with the
topology's own per-step latency for collsynth's steps).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

CASES = {
    # name: (topology, nodes, collective, target seconds, what)
    "ag-a100x2": ("dgx-a100", 2, "allgather", 5, "bandwidth-optimal"),
    "ag-a100x8": ("dgx-a100", 8, "allgather", 30, "bandwidth-optimal"),
    "ag-h100x128": ("dgx-h100", 128, "allgather", 600, "bandwidth-optimal, <= 8 GB"),
    "ar-h100x128": ("dgx-h100", 128, "allreduce", 600, "bandwidth-optimal, <= 8 GB"),
    "a2a-a100x8": ("dgx-a100", 8, "alltoall", 300, "within 10% of the bound"),
    "ag-h100x512-compact": ("dgx-h100", 512, "allgather-compact", 300,
                            "<= 16 GB, within 10% of the bound, template + node shift"),
    "ag-gb200x16-compact": ("gb200-nvl72", 16, "allgather-compact", 60, "optimal"),
    "ar-gb200x16-compact": ("gb200-nvl72", 16, "allreduce-compact", 60, "optimal"),
    "ar-h100x128-compact": ("dgx-h100", 128, "allreduce-compact", 600, "optimal"),
    "ag-torus8x8": ("torus:8x8", 0, "allgather", 60, "bandwidth-optimal"),
    "bound-h100x128-ag": ("dgx-h100", 128, "allgather-bound", 60, "exact optimal throughput"),
    "bound-h100x128-ar": ("dgx-h100", 128, "allreduce-bound", 60, "exact optimal throughput"),
}

_CHILD = r"""
import json, resource, sys, time
from collsynth.resolve import resolve_topology
from collsynth.collective import standard_collective
spec, nodes, name = sys.argv[1], int(sys.argv[2]), sys.argv[3]
topology = resolve_topology(spec, nodes=nodes or None)
started = time.perf_counter()
out = {}
if name.endswith("-bound"):
    from collsynth.bounds.throughput import optimal_throughput
    collective = standard_collective(name[:-len("-bound")], topology.num_ranks)
    bound = optimal_throughput(topology, collective).rounds_per_chunk
    out.update(rounds_per_chunk=str(bound), lower_bound=str(bound), steps=None, sends=None)
elif name.endswith("-compact"):
    from collsynth.synthesis.bandwidth_optimal.symmetric import solve_symmetric
    collective = standard_collective(name[:-len("-compact")], topology.num_ranks)
    schedule = solve_symmetric(topology, collective)
    p = schedule.provenance
    out.update(engine="trees (compact)", steps=schedule.num_steps, sends=schedule.num_sends,
               template_sends=schedule.template_sends,
               rounds_per_chunk=str(schedule.rounds_per_chunk),
               steady_state_rounds_per_chunk=p["steady_state_rounds_per_chunk"],
               lower_bound=p["lower_bound"], optimal=p["optimal"], timings=p["timings"])
else:
    from collsynth.timing.closed_form import predicted_against_runtime
    from collsynth.synthesis.large import solve_large
    collective = standard_collective(name, topology.num_ranks)
    result = solve_large(topology, collective)
    seconds = time.perf_counter() - started
    out.update(result.to_json())
    out["predicted_us"] = [r.as_dict() for r in predicted_against_runtime(result.schedule)]
    out["library_seconds"] = seconds
out.setdefault("library_seconds", time.perf_counter() - started)
out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps(out))
"""


def run_case(name: str) -> dict:
    spec, nodes, collective, _, _ = CASES[name]
    done = subprocess.run([sys.executable, "-c", _CHILD, spec, str(nodes), collective],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{name} failed: {done.stderr.strip()[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _ms(value):
    return "-" if value is None else f"{value / 1000:.2f}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--only", action="append", choices=sorted(CASES))
    parser.add_argument("--json", metavar="OUT")
    args = parser.parse_args(argv)
    names = args.only or list(CASES)
    rows = []
    for name in names:
        runs = []
        for _ in range(args.repeat):
            runs.append(run_case(name))
            print(f"{name}: {runs[-1]['library_seconds']:.2f} s", file=sys.stderr, flush=True)
        seconds = [r["library_seconds"] for r in runs]
        last = runs[-1]
        rows.append({"case": name, "target_s": CASES[name][3], "what": CASES[name][4],
                     "median_s": statistics.median(seconds), "min_s": min(seconds),
                     "max_s": max(seconds), "peak_rss_mb": max(r["peak_rss_mb"] for r in runs),
                     **{k: last.get(k) for k in ("engine", "steps", "sends", "rounds_per_chunk",
                                                 "steady_state_rounds_per_chunk", "lower_bound",
                                                 "optimal", "predicted_us")}})
    print("| case | seconds median [min-max] | target | peak MB | rounds/chunk (steady) | "
          "bound | optimal | 1 MiB ms: ours / ring / tree | 64 MiB | 1 GiB |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        predicted = row.get("predicted_us") or []
        cells = [" / ".join(_ms(p.get(k)) for k in ("collsynth", "nccl_ring", "nccl_tree"))
                 for p in predicted] + ["-"] * (3 - len(predicted))
        steady = row.get("steady_state_rounds_per_chunk") or row.get("rounds_per_chunk")
        print(f"| {row['case']} | {row['median_s']:.2f} [{row['min_s']:.2f}-{row['max_s']:.2f}] | "
              f"<= {row['target_s']} | {row['peak_rss_mb']:.0f} | {row['rounds_per_chunk']} "
              f"({steady}) | {row['lower_bound']} | {row.get('optimal', '-')} | "
              f"{' | '.join(cells)} |")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(rows, handle, indent=2)
    return 0


if __name__ == "__main__":
    started = time.perf_counter()
    code = main()
    print(f"total {time.perf_counter() - started:.0f} s", file=sys.stderr)
    sys.exit(code)
