"""The program model's speed, and its MI250 prediction against the measurement.

    python benchmarks/runtime_model.py [--repeat 3] [--xml FILE --topology T --nodes K]
    python benchmarks/runtime_model.py --skip-speed     # the MI250 and folding figures

Speed: a 64-rank program with about 80k sends (by default RCCL's own ring allgather on
``dgx-a100 --nodes 8`` written as a 20-channel program: 64 x 20 x 63 = 80,640 sends; ``--xml``
times a file instead, e.g. ``collsynth solve bandwidth-optimal dgx-a100 allgather --nodes 8``
exported with ``--channels auto``), prepared once and simulated at 1 GiB; median of ``repeat``.

Folding: NVLS on a GB200 NVL72 rack and the ring on 16 DGX-H100, whole graph against folded
(same time, fewer transfers).

MI250: RCCL's two-channel ring allgather on ``mi250-16gcd --nodes 2`` is calibrated on
``data/measurements/mi250-16gcd-x2/rccl_all_gather_outofplace.csv`` (every size: in-sample
GMAE) and again on every other size, scored on the others (held-out GMAE); the table lists the
measured and predicted times.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CSV = ROOT / "data" / "measurements" / "mi250-16gcd-x2" / "rccl_all_gather_outofplace.csv"


def speed(args: argparse.Namespace) -> None:
    from collsynth.resolve import resolve_topology
    from collsynth.timing.runtime_baselines import ring_program, runtime_rings
    from collsynth.runtimes import get_runtime
    from collsynth.timing.runtime_model import prepare_program, simulate_program

    if args.xml:
        from collsynth.export.xml_reader import read_program

        topology = resolve_topology(args.topology, nodes=args.nodes)
        program = read_program(args.xml)
        label = Path(args.xml).name
    else:
        topology = resolve_topology("dgx-a100", nodes=8)
        program = ring_program("allgather", runtime_rings(topology, 20))
        label = "ring allgather, 20 channels"
    sends = sum(1 for g in program.gpus for tb in g.threadblocks for st in tb.steps
                if st.type in ("s", "rcs", "rrs", "rrcs"))
    c = get_runtime("nccl").defaults
    prepare_s, simulate_s = [], []
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        prepared = prepare_program(program, topology)
        t1 = time.perf_counter()
        result = simulate_program(prepared, None, 2**30, c)
        t2 = time.perf_counter()
        prepare_s.append(t1 - t0)
        simulate_s.append(t2 - t1)
    total = [a + b for a, b in zip(prepare_s, simulate_s)]
    print(f"speed: {label} on {topology.name}: {program.ngpus} ranks, {sends} sends, "
          f"{prepared.num_transfers} transfers")
    print(f"  median of {args.repeat}: prepare {statistics.median(prepare_s):.2f} s, simulate "
          f"1 GiB {statistics.median(simulate_s):.2f} s, total {statistics.median(total):.2f} s "
          f"(predicted {result.time_us:.1f} us, {result.algbw_gbps:.1f} GB/s algbw, "
          f"{result.breakdown['passes']} passes)")


def folded(args: argparse.Namespace) -> None:
    """NCCL's NVLS allreduce on one GB200 NVL72 rack (72 GPUs, 32 channels), and its ring
    allreduce on 16 DGX-H100 (128 GPUs, 16 channels), built and simulated at 1 GiB whole and
    folded (docs/runtime-model.md, "Folded graphs"); both give the same time."""
    from collsynth.timing.ring_fold import folded_ring
    from collsynth.timing.runtime_baselines import ring_program, runtime_rings
    from collsynth.timing.runtime_model import prepare_program
    from collsynth.timing.switch_graphs import nvls_graph
    from collsynth.topology import get_topology
    from collsynth.topology.compose import compose_nodes

    rack = get_topology("gb200-nvl72")
    compare(args, "NVLS allreduce, GB200 NVL72 rack, 32 channels",
            lambda: nvls_graph("allreduce", rack, 32, fold=False),
            lambda: nvls_graph("allreduce", rack, 32))
    cluster = compose_nodes(get_topology("dgx-h100"), 16)
    rings = runtime_rings(cluster, 16)
    compare(args, "ring allreduce, 16 DGX-H100, 16 channels",
            lambda: prepare_program(ring_program("allreduce", rings), cluster),
            lambda: folded_ring("allreduce", rings, cluster))


def compare(args: argparse.Namespace, label: str, whole, folded) -> None:
    """Build each graph ``args.repeat`` times and simulate it at 1 GiB; print the medians."""
    from collsynth.runtimes import get_runtime
    from collsynth.timing.runtime_model import simulate_program

    c = get_runtime("nccl").defaults
    found = {}
    for name, build in (("whole", whole), ("folded", folded)):
        build_s, simulate_s = [], []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            graph = build()
            t1 = time.perf_counter()
            result = simulate_program(graph, None, 2**30, c)
            t2 = time.perf_counter()
            build_s.append(t1 - t0)
            simulate_s.append(t2 - t1)
        found[name] = (graph.num_transfers, statistics.median(build_s),
                       statistics.median(simulate_s), result.time_us)
        transfers, build_median, simulate_median, time_us = found[name]
        print(f"{label}, {name}: {transfers} transfers, build {build_median:.3f} s, simulate "
              f"1 GiB {simulate_median:.3f} s (median of {args.repeat}; {time_us:.1f} us)")
    print(f"  same time: {abs(found['folded'][3] / found['whole'][3] - 1) < 1e-9}")


def mi250() -> None:
    from collsynth.topology import get_topology
    from collsynth.topology.compose import compose_nodes
    from collsynth.timing.runtime_fit import fit_runtime, read_curve

    rows = read_curve(CSV)
    topology = compose_nodes(get_topology("mi250-16gcd"), 2)
    t0 = time.perf_counter()
    fit = fit_runtime(rows, topology, "allgather", runtime="rccl", channels=2)
    elapsed = time.perf_counter() - t0
    print(f"MI250 x 2, RCCL 2-channel ring allgather: in-sample GMAE {fit.gmae:.2%}, held-out "
          f"GMAE {fit.held_out_gmae:.2%} ({elapsed:.1f} s for both fits)")
    print("  fitted: " + ", ".join(f"{k} = {v:.4g}" for k, v in fit.parameters.items()))
    print(f"  rings: {fit.rings}")
    print("| size (bytes) | protocol | measured (us) | predicted (us) | error |")
    print("|---:|---|---:|---:|---:|")
    for s, m, p, q in zip(fit.sizes, fit.measured_us, fit.predicted_us, fit.protocols):
        print(f"| {s} | {q} | {m:g} | {p:.1f} | {p / m - 1:+.1%} |")
    base = fit.constants.base_latency("LL")
    print(f"  lowest prediction {min(fit.predicted_us):.1f} us >= calibrated base {base:.1f} us: "
          f"{min(fit.predicted_us) >= base}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--xml", help="an MSCCL XML program to time instead of the ring")
    parser.add_argument("--topology", default="dgx-a100")
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--skip-speed", action="store_true")
    parser.add_argument("--skip-mi250", action="store_true")
    parser.add_argument("--skip-fold", action="store_true")
    args = parser.parse_args()
    if not args.skip_speed:
        speed(args)
    if not args.skip_fold:
        folded(args)
    if not args.skip_mi250:
        mi250()


if __name__ == "__main__":
    main()
