"""Per-call overhead of the collsynth tracer on a small all_reduce.

    python benchmarks/trace_overhead.py [--calls 20000] [--repeat 7] [--elements 16]

One process, a one-rank gloo group: ``all_reduce`` of a small float32 tensor ``--calls`` times
without tracing, with tracing, and with tracing and ``record_durations``, the three runs
interleaved ``--repeat`` times. Prints the median microseconds per call of each and the median
overhead per call (traced minus plain, over the paired runs) as a markdown table, and a JSON
line for scripts, both in wall-clock time and in the process's CPU time (which other processes
on a busy machine disturb less).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _per_call_us(fn, calls: int) -> tuple[float, float]:
    """(wall-clock, process CPU) microseconds per call of ``fn``."""
    cpu, started = time.process_time(), time.perf_counter()
    for _ in range(calls):
        fn()
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu
    return wall / calls * 1e6, cpu / calls * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--elements", type=int, default=16)
    args = parser.parse_args()

    import torch
    import torch.distributed as dist

    from collsynth.executor.launch import free_port
    from collsynth.trace import read_trace, tracing

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0,
                            world_size=1)
    tensor = torch.ones(args.elements)

    def call() -> None:
        dist.all_reduce(tensor)

    _per_call_us(call, 1000)  # warm up
    modes = {"plain": [], "traced": [], "traced+durations": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeat):
            modes["plain"].append(_per_call_us(call, args.calls))
            with tracing(Path(tmp) / f"t{r}"):
                modes["traced"].append(_per_call_us(call, args.calls))
            with tracing(Path(tmp) / f"d{r}", record_durations=True):
                modes["traced+durations"].append(_per_call_us(call, args.calls))
        written = len(read_trace(Path(tmp) / "t0").rank(0).calls)
    dist.destroy_process_group()
    if written != args.calls:
        print(f"expected {args.calls} records, found {written}", file=sys.stderr)
        return 1
    print(f"all_reduce of {args.elements} float32, one-rank gloo group, {args.calls} calls x "
          f"{args.repeat} runs (median)\n")
    print("| mode | wall us/call | wall overhead | CPU us/call | CPU overhead |")
    print("|---|---:|---:|---:|---:|")
    summary = {}
    for mode, values in modes.items():
        cells, figures = [], {}
        for i, clock in enumerate(("wall", "cpu")):
            per_call = statistics.median(v[i] for v in values)
            extra = None if mode == "plain" else statistics.median(
                v[i] - p[i] for v, p in zip(values, modes["plain"]))
            cells += [f"{per_call:.2f}", "-" if extra is None else f"{extra:.2f}"]
            figures[f"{clock}_us"], figures[f"{clock}_overhead_us"] = per_call, extra
        summary[mode] = figures
        print(f"| {mode} | " + " | ".join(cells) + " |")
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
