"""How fast the MSCCL XML checker proves ring allgathers of growing size correct.

    python benchmarks/check_speed.py [--ranks 16,64,256] [--repeat 5]

Prints the median and the fastest of ``repeat`` runs of ``check_program`` per rank count (64 ranks
took 0.06 s on the 2-core development machine).
"""

from __future__ import annotations

import argparse
import statistics
import time

from collsynth.export.check import check_program
from collsynth.export.program import GpuProgram, Program, ThreadBlock, XmlStep


def ring_allgather(n: int) -> Program:
    """An n-rank out-of-place ring allgather: cpy own chunk, then receive-copy-send n-1 times."""
    gpus = []
    for r in range(n):
        local = ThreadBlock(1, -1, -1, 0, (XmlStep(0, "cpy", "i", 0, "o", r, 1, hasdep=1),))
        steps = [XmlStep(0, "s", "o", r, "o", r, 1, depid=1, deps=0)]
        for k in range(1, n - 1):
            steps.append(XmlStep(k, "rcs", "o", 0, "o", (r - k) % n, 1))
        steps.append(XmlStep(n - 1, "r", "o", 0, "o", (r - n + 1) % n, 1))
        ring = ThreadBlock(0, (r + 1) % n, (r - 1) % n, 0, tuple(steps))
        gpus.append(GpuProgram(r, 1, n, 0, (ring, local)))
    return Program(f"ring{n}", "Simple", 1, n, n, "allgather", 0, tuple(gpus))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", default="16,64,256")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    print("| ranks | sends | median s | min s |\n|---|---|---|---|")
    for n in (int(x) for x in args.ranks.split(",")):
        program = ring_allgather(n)
        seconds = []
        for _ in range(args.repeat):
            started = time.perf_counter()
            report = check_program(program, runtime="msccl")
            seconds.append(time.perf_counter() - started)
            if not report.ok:
                raise SystemExit(f"{n} ranks: the checker refused a correct ring: {report.problems[:2]}")
        print(f"| {n} | {n * (n - 1)} | {statistics.median(seconds):.3f} | {min(seconds):.3f} |")


if __name__ == "__main__":
    main()
