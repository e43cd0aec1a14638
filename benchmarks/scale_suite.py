"""Benchmark of the bounds at scale (issue 15), and of pricing NCCL's own algorithms on the largest
machines: ``collsynth bounds`` and ``collsynth time`` end to end, one fresh process per run.

Run from the repository root::

    .venv/bin/python benchmarks/scale_suite.py [--repeat 3] [--only NAME]

Each case runs ``python -m collsynth bounds ...`` (or ``time ...``) ``--repeat`` times under an
8 GB address-space limit; the table shows the median [min-max] wall seconds, the peak resident
memory of the child (``ru_maxrss`` from ``os.wait4``), the target, and the output's last line.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time

CASES = {
    # name: (arguments of `collsynth`, target seconds)
    "h100x4096-ag": (["bounds", "dgx-h100", "allgather", "--nodes", "4096"], 60),
    "h100x4096-ar": (["bounds", "dgx-h100", "allreduce", "--nodes", "4096"], 60),
    "h100x512-ag": (["bounds", "dgx-h100", "allgather", "--nodes", "512"], 60),
    "h100x128-ag": (["bounds", "dgx-h100", "allgather", "--nodes", "128"], 60),
    "h100x128-ar": (["bounds", "dgx-h100", "allreduce", "--nodes", "128"], 60),
    "ring2048-ag": (["bounds", "ring:2048", "allgather"], 10),
    "torus32x32-ag": (["bounds", "torus:32x32", "allgather"], 10),
    # NCCL's own algorithms priced by the program model on 7344 GPUs, one size
    "gb200x102-time-ar": (["time", "-q", "--collective", "allreduce", "--topology", "gb200-nvl72",
                           "--nodes", "102", "--sizes", "1GB"], 60),
    "gb200x102-time-ag": (["time", "-q", "--collective", "allgather", "--topology", "gb200-nvl72",
                           "--nodes", "102", "--sizes", "1GB"], 60),
}

_LIMIT = 8_000_000_000


def _run(args: list[str]) -> tuple[float, float, str]:
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (_LIMIT, _LIMIT))

    started = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "collsynth", *args], text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=limit,
                            env=dict(os.environ))
    stdout, stderr = proc.stdout.read(), proc.stderr.read()  # a few lines each
    _, status, usage = os.wait4(proc.pid, 0)  # this child's own peak memory
    seconds = time.perf_counter() - started
    peak_mb = usage.ru_maxrss / 1024
    code = os.waitstatus_to_exitcode(status)
    lines = (stdout or stderr).strip().splitlines()
    return seconds, peak_mb, (lines[-1] if lines else f"exit {code}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--only", action="append")
    options = parser.parse_args()
    print(f"{'case':16} {'seconds (median [min-max])':28} {'peak MB':>8} {'target s':>8}  result")
    for name, (args, target) in CASES.items():
        if options.only and name not in options.only:
            continue
        runs = [_run(args) for _ in range(options.repeat)]
        times = [t for t, _, _ in runs]
        peak = max(m for _, m, _ in runs)
        print(f"{name:16} {statistics.median(times):8.2f} [{min(times):.2f}-{max(times):.2f}]"
              f"{'':10} {peak:8.0f} {target:8}  {runs[-1][2]}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
