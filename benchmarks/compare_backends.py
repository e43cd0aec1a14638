"""Compare the solver backends (encodings) on fixed instances: median seconds over repeats.

    python benchmarks/compare_backends.py [--repeat 3] [--time-limit 120]

Each (instance, backend) runs in a fresh process; results print as a markdown table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

INSTANCES = [
    # topology, collective, steps, rounds, chunks, expected status
    ("dgx1", "allgather", 3, 7, 6, "sat"),
    ("dgx1", "allgather", 2, 7, 6, "unsat"),
    ("dgx1", "alltoall", 3, 3, 1, "sat"),
    ("dgx1", "alltoall", 2, 2, 1, "unsat"),
    ("dgx1", "alltoall", 3, 5, 3, "unsat"),
    ("hub:16", "allgather", 15, 15, 1, "sat"),
    ("fully-connected:16", "allgather", 1, 1, 1, "sat"),
]
BACKENDS = ["cpsat", "z3", "z3-path"]

_WORKER = """
import json, sys, time
from collsynth.algorithm import Instance
from collsynth.collective import standard_collective
from collsynth.synthesis import SolveOptions, solve_instance
from collsynth.topology import get_topology
topo, coll, steps, rounds, chunks, backend, limit = json.loads(sys.argv[1])
t = get_topology(topo)
started = time.perf_counter()
r = solve_instance(t, standard_collective(coll, t.num_ranks), Instance(steps, rounds, chunks),
                   options=SolveOptions(backend=backend, time_limit=limit, symmetry=False))
print(json.dumps({"status": r.status.value, "seconds": time.perf_counter() - started}))
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--time-limit", type=float, default=120.0)
    args = parser.parse_args()
    print("| instance | " + " | ".join(BACKENDS) + " |")
    print("|---|" + "---:|" * len(BACKENDS))
    for topo, coll, s, r, c, expected in INSTANCES:
        cells = []
        for backend in BACKENDS:
            runs = []
            for _ in range(args.repeat):
                payload = json.dumps([topo, coll, s, r, c, backend, args.time_limit])
                out = subprocess.run([sys.executable, "-c", _WORKER, payload], capture_output=True,
                                     text=True, check=True).stdout
                runs.append(json.loads(out.strip().splitlines()[-1]))
            statuses = {x["status"] for x in runs}
            median = statistics.median(x["seconds"] for x in runs)
            label = "/".join(sorted(statuses))
            cells.append(f"{median:.2f} ({label})" if label == expected else f"{median:.2f} ({label}!)")
        print(f"| {topo} {coll} {s}/{r}/{c} ({expected}) | " + " | ".join(cells) + " |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
