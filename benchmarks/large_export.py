"""Issue 22's large schedules: the bandwidth-optimal allgather, reduce-scatter and allreduce of
DGX A100 x2 and x4, exported at default settings for every runtime, each file checked again.

Run from the repository root::

    .venv/bin/python benchmarks/large_export.py [--nodes 2 4] [--runtime all] [--json OUT]

Each export runs in a fresh process through the CLI, as a user would run it; a row is
``correct`` only when ``export`` wrote the file (it checks before writing) and ``check`` of the
file on disk agrees. Seconds are wall time of one run on whatever machine runs this (no
repeats: a case takes a minute).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

COLLECTIVES = ("allgather", "reduce-scatter", "allreduce")
RUNTIMES = ("msccl", "msccl-executor", "rccl", "mscclpp")


def _cli(*args: str) -> tuple[int, float, str]:
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "collsynth", *args], capture_output=True,
                          text=True)
    return done.returncode, time.perf_counter() - started, (done.stderr or done.stdout).strip()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--runtime", nargs="+", default=list(RUNTIMES), choices=RUNTIMES)
    parser.add_argument("--json", help="also write the rows here")
    args = parser.parse_args()
    rows = []
    print("| nodes | collective | runtime | solve s | export s | check s | result |")
    print("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as work:
        for nodes in args.nodes:
            for collective in COLLECTIVES:
                schedule = Path(work, f"{collective}-{nodes}.json")
                code, solve_s, why = _cli("solve", "bandwidth-optimal", "dgx-a100", collective,
                                          "--nodes", str(nodes), "-o", str(schedule), "-q")
                for runtime in args.runtime:
                    suffix = "json" if runtime == "mscclpp" else "xml"
                    target = Path(work, f"{collective}-{nodes}.{runtime}.{suffix}")
                    row = {"nodes": nodes, "collective": collective, "runtime": runtime,
                           "solve_s": round(solve_s, 2), "export_s": None, "check_s": None}
                    if code != 0:
                        row["result"] = f"solve failed: {why.splitlines()[-1:]}"
                    else:
                        code_e, row["export_s"], why_e = _cli("export", str(schedule), "-o",
                                                              str(target), "--runtime", runtime)
                        if code_e != 0:
                            row["result"] = f"not exported: {why_e.splitlines()[-1]}"
                        else:
                            code_c, row["check_s"], why_c = _cli("check", str(target),
                                                                 "--runtime", runtime)
                            row["result"] = "correct" if code_c == 0 else \
                                f"check failed: {why_c.splitlines()[-1]}"
                        row["export_s"] = round(row["export_s"], 1)
                        row["check_s"] = row["check_s"] and round(row["check_s"], 1)
                    rows.append(row)
                    print(f"| {nodes} | {collective} | {runtime} | {row['solve_s']} | "
                          f"{row['export_s']} | {row['check_s']} | {row['result']} |", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")
    return 0 if all(r["result"] == "correct" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
