"""Predictions of public measured runs by the program model (issue 21's targets).

    python benchmarks/predictions.py [--targets-only] [--only TEXT] [--json FILE]

Each case calibrates the program model on ONE measured curve (``collsynth calibrate --model
program``: :func:`collsynth.timing.runtime_fit.fit_runtime`) and predicts OTHER curves: other
collectives, other node counts, other runs of the same machine. A prediction is the fastest of
the runtime's own algorithms (:func:`collsynth.timing.pricing.fastest_runtime_algorithm`, NVLS
and PAT where the machine has them) priced by :class:`~collsynth.timing.program_model.ProgramModel`
with the calibrated constants on the predicted run's machine. Reported per predicted curve: mean
|predicted / measured - 1| in three size bands (<= 64 KiB, 128 KiB - 32 MiB, >= 64 MiB) and, for
the issue's named targets, PASS or MISS against its limits. The held-out cases never fit on the
run they predict; the last cases fit nothing (the runtime's documented defaults). Machines: data/nccl-tests/README.md and data/public-logs/README.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NCCL_TESTS = ROOT / "data" / "nccl-tests"
PUBLIC = ROOT / "data" / "public-logs"

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
#: The size bands of every figure: (name, low, high) inclusive.
BANDS = (("<=64K", 0, 64 * KiB), ("128K-32M", 128 * KiB, 32 * MiB), (">=64M", 64 * MiB, 1 << 62))


@dataclasses.dataclass(frozen=True)
class Machine:
    """A machine a run was measured on: a built-in node, its node count, and what the public
    run's header says of its network where it differs from the built-in (NICs per node, GB/s
    per NIC, network class)."""

    node: str
    nodes: int = 1
    nics: int | None = None
    nic_gbps: float | None = None
    network: str | None = None
    sharp: bool = False

    def topology(self):
        from collsynth.topology import get_topology
        from collsynth.topology.compose import compose_nodes
        from collsynth.topology.machine import with_machine

        node = get_topology(self.node)
        if self.nics is not None or self.nic_gbps is not None:
            nic = dict(node.metadata.get("nic") or {})
            if self.nics is not None:
                nic["count"] = self.nics
                nic["per_gpu"] = self.nics == node.num_ranks
            if self.nic_gbps is not None:
                nic["gbps"] = self.nic_gbps
            node = dataclasses.replace(node, metadata={**node.metadata, "nic": nic})
        topology = node if self.nodes == 1 else compose_nodes(node, self.nodes)
        if self.network is not None:
            topology = with_machine(topology, network_class=self.network)
        if self.sharp:
            topology = with_machine(topology, sharp=True)
        return topology

    def label(self) -> str:
        text = self.node + (f" x{self.nodes}" if self.nodes > 1 else "")
        parts = []
        if self.nics is not None or self.nic_gbps is not None:
            parts.append(f"{self.nics or 'built-in'} NICs x {self.nic_gbps or 'built-in'} GB/s")
        if self.network:
            parts.append(self.network)
        if self.sharp:
            parts.append("SHARP")
        if parts:
            text += " (" + ", ".join(parts) + ")"
        return text


@dataclasses.dataclass(frozen=True)
class Run:
    """One measured public run: its file, runtime, machine and (for busbw tables) collective."""

    path: Path
    runtime: str
    machine: Machine
    algorithms: tuple[str, ...] | None = None  # the run forced these (NCCL_ALGO)
    threads_drove: int | None = None  # GPUs per thread where the header says, not the log
    stated_version: str | None = None  # the runtime's version where the header says, not the log
    settings: tuple[str, ...] = ()  # the job's NCCL_ALGO / NCCL_PROTO / NCCL_NVLS_ENABLE

    @property
    def name(self) -> str:
        return self.path.stem


@dataclasses.dataclass(frozen=True)
class Case:
    """Calibrate on ``fit``, predict each of ``predict``; ``limits`` per band (None: no target).
    ``fit=None``: no calibration, the runtime's documented defaults (a machine met for the
    first time)."""

    name: str
    fit: Run | None
    predict: tuple[Run, ...]
    limits: tuple[float | None, float | None, float | None] | None = None


def _nt(name: str, runtime: str, machine: Machine, forced: tuple[str, ...] | None = None
        ) -> Run:
    return Run(NCCL_TESTS / name, runtime, machine, forced)


def _pl(name: str, runtime: str, machine: Machine, forced: tuple[str, ...] | None = None
        ) -> Run:
    # The Azure guide's tables come from one process driving every GPU of the VM
    # ('all_reduce_perf -g <GPUs>': data/public-logs/README.md).
    drove = 8 if "azure-guide" in name else None
    # Alps: NCCL 2.23.4 by the uenv its companion script loads (the log's own header).
    version = "2.23.4" if "alps" in name else None
    return Run(PUBLIC / name, runtime, machine, forced, drove, version)


A100 = Machine("DGX-A100")
# p4d/p4de: 4 x 100 Gb/s EFA per node (the logs' headers)
A100_P4D_X2 = Machine("DGX-A100", 2, nics=4, nic_gbps=12.5, network="efa")
H100 = Machine("DGX-H100")
# p5: 32 x 100 Gb/s EFA per node (3200 Gb/s), 4 per GPU; as 8 NICs of 50 GB/s
H100_P5_X2 = Machine("DGX-H100", 2, nics=8, nic_gbps=50.0, network="efa")
# a3-mega: 8 x 200 Gb/s GPUDirect-TCPXO
H100_A3MEGA_X2 = Machine("DGX-H100", 2, nics=8, nic_gbps=25.0, network="tcp")
# The a3-mega run's job: its repository's README sources the TCPXO plugin's
# nccl-env-profile.sh and lists NCCL 2.21.5 beside it; the profile sets these three (and a tuner
# plugin, not modelled): data/public-logs/README.md.
A3MEGA_X2_RUN = Run(PUBLIC / "H100-16gpu-2node-gcp-a3mega_all_reduce_lessizzmore.txt", "nccl",
                    H100_A3MEGA_X2, stated_version="2.21.5",
                    settings=("NCCL_ALGO=Ring,Tree", "NCCL_PROTO=Simple", "NCCL_NVLS_ENABLE=0"))
MI300X = Machine("MI300X")
MI300X_X2 = Machine("MI300X", 2, network="roce")
MI325X = Machine("MI325X")

TARGETS = (
    Case("T1 A100 allreduce -> allgather, reduce-scatter",
         _nt("A100-8gpu_all_reduce_superbench.txt", "nccl", A100),
         (_nt("A100-8gpu_all_gather_superbench.txt", "nccl", A100),
          _nt("A100-8gpu_reduce_scatter_superbench.txt", "nccl", A100)),
         (0.10, 0.15, 0.10)),
    Case("T2 H100 allreduce in-sample (NVLS in the model)",
         _nt("H100-8gpu-p5_all_reduce_awsome.txt", "nccl", H100),
         (_nt("H100-8gpu-p5_all_reduce_awsome.txt", "nccl", H100),),
         (0.10, 0.10, 0.10)),
    Case("T3 A100 1 node -> 2 nodes (p4d, EFA)",
         _nt("A100-8gpu_all_reduce_superbench.txt", "nccl", A100),
         (_nt("A100-16gpu-2node-p4d_all_reduce_awsdocs.txt", "nccl", A100_P4D_X2,
              ("ring",)),),  # NCCL_ALGO=ring (the log's header)
         (0.25, 0.25, 0.25)),
)

HELD_OUT = (
    # alltoall: NCCL's grouped send/recv, another collective than the one fitted
    Case("A100 one node -> alltoall, azure, p4de x2",
         _nt("A100-8gpu_all_reduce_superbench.txt", "nccl", A100),
         (_nt("A100-8gpu_alltoall_superbench.txt", "nccl", A100),
          _pl("A100-8gpu-azure-nda100v4_all_reduce_busbw-table_azure-guide.txt", "nccl", A100),
          _pl("A100-16gpu-2node-p4de_all_reduce_awsome.txt", "nccl", A100_P4D_X2))),
    Case("H100 p5 one node -> azure, p5 x2, a3-mega x2",
         _nt("H100-8gpu-p5_all_reduce_awsome.txt", "nccl", H100),
         (_pl("H100-8gpu-azure-ndh100v5_all_reduce_busbw-table_azure-guide.txt", "nccl", H100,
              ("nvls",)),  # the guide's NCCL_ALGO=NVLS
          _pl("H100-16gpu-2node-p5_all_reduce_awsome.txt", "nccl", H100_P5_X2),
          A3MEGA_X2_RUN)),
    Case("MI300X one node -> azure, two nodes",
         _pl("MI300X-8gpu_all_reduce_hisohara-aac8.txt", "rccl", MI300X),
         (_pl("MI300X-8gpu-azure-ndmi300xv5_all_reduce_busbw-table_azure-guide.txt", "rccl",
              MI300X),
          _pl("MI300X-16gpu-2node_all_reduce_hisohara-aac10.txt", "rccl", MI300X_X2))),
    Case("MI325X one node -> 2, 4 and 8 nodes (NCCL_ALGO=Ring, RoCE)",
         _pl("MI325X-8gpu-1node_all_reduce_largesizes_hisohara-aac11.txt", "rccl", MI325X),
         tuple(_pl(f"MI325X-{8 * k}gpu-{k}node_all_reduce_largesizes_hisohara-aac11.txt",
                   "rccl", Machine("MI325X", k, network="roce"), ("ring",))
               for k in (2, 4, 8))),
    # 12 nodes with SHARP: the run's algorithm is not stated; the manifest of its repository
    # today sets NCCL_ALGO=COLLNETCHAIN (data/public-logs/README.md).
    Case("H100 p5 one node -> 96 H100 with SHARP (CoreWeave, 512 MiB-8 GiB)",
         _nt("H100-8gpu-p5_all_reduce_awsome.txt", "nccl", H100),
         (_pl("H100-96gpu-ib-sharp_all_reduce_largesizes_coreweave.txt", "nccl",
              Machine("DGX-H100", 12, network="ib", sharp=True), ("collnet_chain",)),)),
    # Other machines than the one fitted: H200 (same NVLink, faster memory) and MI355X.
    Case("H100 p5 one node -> H200 azure (NVLS forced): another GPU",
         _nt("H100-8gpu-p5_all_reduce_awsome.txt", "nccl", H100),
         (_pl("H200-8gpu-azure-ndh200v5_all_reduce_busbw-table_azure-guide.txt", "nccl",
              Machine("DGX-H200"), ("nvls",)),)),
    # Alps: 1, 2, 4 and 16 nodes of 4 GH200 over Slingshot-11, the same software (1 -> 2 and
    # 2 -> 8-style node-count transfer; the Slingshot class's base per call came from the
    # 2-node run, so its small sizes are not held out there: docs/runtime-model.md).
    Case("GH200 one node -> 2, 4 and 16 nodes (Alps, Slingshot-11)",
         _pl("GH200-4gpu-1node-alps-slingshot_all_reduce_boeschf.txt", "nccl",
             Machine("GH200x4")),
         tuple(_pl(f"GH200-{4 * k}gpu-{k}node-alps-slingshot_all_reduce_boeschf.txt", "nccl",
                   Machine("GH200x4", k, network="slingshot"))
               for k in (2, 4, 16))),
    Case("GH200 two nodes -> 4 and 16 nodes (Alps, Slingshot-11): a multi-node calibration",
         _pl("GH200-8gpu-2node-alps-slingshot_all_reduce_boeschf.txt", "nccl",
             Machine("GH200x4", 2, network="slingshot")),
         tuple(_pl(f"GH200-{4 * k}gpu-{k}node-alps-slingshot_all_reduce_boeschf.txt", "nccl",
                   Machine("GH200x4", k, network="slingshot"))
               for k in (4, 16))),
    # GB200 NVL72: one rack (72 GPUs, one NVLink domain) -> two and twenty racks over
    # InfiniBand, large sizes only (the only rows published). NVLS and NVLS-tree are simulated
    # folded (shard 0 of one channel: collsynth/timing/symmetry.py), so the fit takes seconds.
    Case("GB200 NVL72 one rack -> two and twenty racks (CoreWeave, 512 MiB-16 GiB)",
         _pl("GB200-NVL72-72gpu-1rack_all_reduce_largesizes_coreweave.txt", "nccl",
             Machine("GB200-NVL72")),
         tuple(_pl(f"GB200-NVL72-{72 * k}gpu-{k}rack_all_reduce_largesizes_coreweave.txt",
                   "nccl", Machine("GB200-NVL72", k, network="ib")) for k in (2, 20))),
    Case("MI300X one node -> MI355X x2 (Pollara 400, RoCE): another GPU and two nodes",
         _pl("MI300X-8gpu_all_reduce_hisohara-aac8.txt", "rccl", MI300X),
         (_pl("MI355X-16gpu-2node-pollara_all_reduce_hisohara-aac14.txt", "rccl",
              Machine("MI355X", 2, network="roce")),)),
)
# No calibration at all: the runtime's documented defaults, as a user meeting a machine for the
# first time prices it. The B200 a4 run is the only public curve of its machine and node
# count (RoCE's per-hop extra in CLASS_LATENCY_US came from the same cluster's one-GPU-per-node
# run, so its small sizes are not independent); the H100 p5 and A100 runs are the ones the
# cases above calibrate on, to show what a calibration buys.
DEFAULTS = (
    Case("no calibration: B200 a4 x2 (GKE, 8 RoCE NICs per node) allgather; H100 p5; A100",
         None,
         (_pl("B200-16gpu-2node-gcp-a4_all_gather_dranet.txt", "nccl",
              Machine("DGX-B200", 2, network="roce")),
          _nt("H100-8gpu-p5_all_reduce_awsome.txt", "nccl", H100),
          _pl("H100-16gpu-2node-p5_all_reduce_awsome.txt", "nccl", H100_P5_X2),
          _nt("A100-8gpu_all_gather_superbench.txt", "nccl", A100))),
)
#: Public runs not predicted here, and why (reported with the table).
NOT_PREDICTED = {
    "B200 a4 and H200 a3-ultra allgather, one GPU per node": "no built-in node of one GPU "
                                                             "with its NIC",
    "H200 x2 over one TCP interface": "the interface's speed is not stated",
}


def measured(run: Run) -> tuple[str, int, list[tuple[int, float]]]:
    """The run's collective, ranks and (size, time) pairs: out-of-place rows where printed
    (in-place for the busbw tables), sizes of at least 1 KiB... every size printed."""
    from collsynth.timing.logs import load_log

    log = load_log(run.path)
    rows = [r for r in log.rows if not r.in_place] or list(log.rows)
    by_size: dict[int, list[float]] = {}
    for r in rows:
        by_size.setdefault(r.size_bytes, []).append(r.time_us)
    return log.collective, log.ranks, sorted((s, sum(t) / len(t)) for s, t in by_size.items())


def gpus_per_thread(run: Run) -> int:
    """GPUs each thread of the run drove (the log's nGpus, or its source's command; 1 where
    neither says)."""
    from collsynth.timing.logs import load_log

    return run.threads_drove or load_log(run.path).gpus_per_thread or 1


def band_errors(pairs: list[tuple[int, float, float]]) -> list[float | None]:
    """Mean |predicted / measured - 1| per band (``None``: no size in the band)."""
    found = []
    for _, low, high in BANDS:
        errors = [abs(p / m - 1) for s, m, p in pairs if low <= s <= high and math.isfinite(p)]
        found.append(sum(errors) / len(errors) if errors else None)
    return found


#: The sizes the bandwidth-regime line is fitted over (bytes, inclusive lower bound).
LINE_FROM = 256 * MiB


def large_size_lines(pairs: list[tuple[int, float, float]]
                     ) -> tuple[tuple[float, float], tuple[float, float]] | None:
    """Least-squares lines ``time = intercept + slope * size`` (us, us per GiB) through the
    measured and the predicted times from :data:`LINE_FROM` up, or ``None`` with fewer than 3
    such sizes: where a curve reaches its bandwidth, the intercept is what a call costs beyond
    moving its bytes (pipeline fill, per-call work), apart from the slope's error."""
    big = [(s / GiB, m, p) for s, m, p in pairs if s >= LINE_FROM]
    if len(big) < 3:
        return None

    def line(points: list[tuple[float, float]]) -> tuple[float, float]:
        n = len(points)
        mx = sum(x for x, _ in points) / n
        my = sum(y for _, y in points) / n
        slope = (sum((x - mx) * (y - my) for x, y in points)
                 / sum((x - mx) ** 2 for x, _ in points))
        return my - slope * mx, slope

    return line([(x, m) for x, m, _ in big]), line([(x, p) for x, _, p in big])


def runtime_version(run: Run) -> tuple[int, int] | None:
    """The runtime's version the run states (its banner, else its header), ``None`` where
    neither says: its own choices are priced at that version."""
    from collsynth.runtimes import parse_version
    from collsynth.timing.logs import load_log

    text = run.stated_version or load_log(run.path).runtime_version
    return None if text is None else parse_version(text)


def calibrate(run: Run):
    from collsynth.timing.runtime_fit import fit_runtime

    collective, ranks, rows = measured(run)
    topology = run.machine.topology()
    return fit_runtime(rows, topology, collective, runtime=run.runtime,
                       gpus_per_thread=gpus_per_thread(run), version=runtime_version(run))


def predict(constants, run: Run) -> tuple[list[tuple[int, float, float]], list[str]]:
    """(size, measured, predicted) and the algorithm named at each size."""
    from collsynth.runtimes import get_runtime
    from collsynth.runtimes.settings import settings_from_text
    from collsynth.timing.pricing import price_table, runtime_algorithms
    from collsynth.timing.program_model import ProgramModel
    from collsynth.timing.runtime_model import SimulationOptions

    collective, ranks, rows = measured(run)
    topology = run.machine.topology()
    if topology.num_ranks != ranks:
        raise SystemExit(f"{run.name}: {ranks} ranks measured, machine has {topology.num_ranks}")
    runtime = get_runtime(run.runtime).at_version(runtime_version(run)) \
        .with_settings(settings_from_text(run.settings))
    model = ProgramModel(constants, runtime=runtime,
                         options=SimulationOptions(gpus_per_thread=gpus_per_thread(run)))
    subjects = [a for a in runtime_algorithms(runtime, collective, topology)
                if run.algorithms is None or a.algorithm in run.algorithms]
    sizes = [s for s, _ in rows]
    if run.algorithms is None and CHOICE:
        from collsynth.timing.program_model import chosen_algorithms

        chosen = chosen_algorithms(model, runtime, collective, topology, sizes)
        prices = [model.price(a, [s])[0] for a, s in zip(chosen, sizes)]
    else:
        table = price_table(subjects, sizes, model)
        prices = [table.best(s) for s in sizes]
    return ([(s, m, p.time_us) for (s, m), p in zip(rows, prices)],
            [f"{p.subject}/{p.protocol}/{p.channels}ch" for p in prices])


#: Predict what the runtime runs (its own cost model's pick), not the fastest the model finds
#: (main before issue 21 had no such pick: the fastest).
CHOICE = True


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.0f}%"


def run_case(case: Case, results: list[dict]) -> None:
    if case.fit is None:
        return predict_case(case, None, results)
    t0 = time.perf_counter()
    try:
        fit = calibrate(case.fit)
    except Exception as exc:  # a benchmark reports and goes on
        print(f"{case.name}: calibration on {case.fit.name} failed: {exc}")
        results.append({"case": case.name, "error": str(exc)})
        return
    held = "n/a" if fit.held_out_gmae is None else f"{fit.held_out_gmae:.1%}"
    fit_version = runtime_version(case.fit)
    fit_at = "" if fit_version is None else " %d.%d" % fit_version
    print(f"{case.name}\n  calibrated on {case.fit.name} ({case.fit.machine.label()}, "
          f"{case.fit.runtime}{fit_at}): in-sample GMAE {fit.gmae:.1%}, held-out {held}, "
          f"{time.perf_counter() - t0:.1f} s")
    print("    " + ", ".join(f"{k} = {v:.4g}" for k, v in fit.parameters.items()))
    for warning in getattr(fit, "warnings", ()):
        print(f"    warning: {warning}")
    predict_case(case, fit, results)


def predict_case(case: Case, fit, results: list[dict]) -> None:
    """Predict each of the case's runs with ``fit``'s constants (``None``: each run's
    runtime's documented defaults) and report them."""
    from collsynth.runtimes import get_runtime

    if fit is None:
        print(f"{case.name}\n  no calibration: each runtime's documented defaults")
    for run in case.predict:
        constants = get_runtime(run.runtime).defaults if fit is None else fit.constants
        try:
            pairs, names = predict(constants, run)
        except Exception as exc:
            print(f"  {run.name}: prediction failed: {exc}")
            results.append({"case": case.name, "predicted": run.name, "error": str(exc)})
            continue
        errors = band_errors(pairs)
        verdict = ""
        if case.limits is not None:
            ok = all(e is None or lim is None or e <= lim for e, lim in zip(errors, case.limits))
            verdict = "PASS" if ok else "MISS"
        version = runtime_version(run)
        at = "" if version is None else f", {run.runtime} {version[0]}.{version[1]}"
        print(f"  -> {run.name} ({run.machine.label()}{at}): "
              + "  ".join(f"{b[0]} {_pct(e)}" for b, e in zip(BANDS, errors))
              + (f"  {verdict} (limits " + "/".join(_pct(x) for x in case.limits) + ")"
                 if verdict else ""))
        for (s, m, p), n in zip(pairs, names):
            if s in (8, 1 * KiB, 64 * KiB, 1 * MiB, 16 * MiB, 256 * MiB, 4 * GiB):
                print(f"       {s:>11} B  measured {m:10.1f} us  predicted {p:10.1f} us  "
                      f"{100 * (p / m - 1):+6.0f}%  {n}")
        lines = large_size_lines(pairs)
        if lines is not None:
            (mi, ms), (pi, ps) = lines
            print(f"       from {LINE_FROM // MiB} MiB: measured {mi:.0f} us + {ms:.0f} us/GiB, "
                  f"predicted {pi:.0f} us + {ps:.0f} us/GiB (slope {100 * (ps / ms - 1):+.1f}%)")
        results.append({"case": case.name,
                        "calibrated_on": None if case.fit is None else case.fit.name,
                        "predicted": run.name, "bands": dict(zip((b[0] for b in BANDS), errors)),
                        "verdict": verdict or None,
                        "gmae_in_sample": None if fit is None else fit.gmae,
                        "large_size_lines": None if lines is None else {
                            "measured": {"intercept_us": lines[0][0], "us_per_gib": lines[0][1]},
                            "predicted": {"intercept_us": lines[1][0],
                                          "us_per_gib": lines[1][1]}}})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--targets-only", action="store_true")
    parser.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    parser.add_argument("--only", metavar="TEXT", default="",
                        help="run only the cases whose name contains TEXT")
    args = parser.parse_args(argv)
    results: list[dict] = []
    print("== issue 21 targets ==")
    for case in TARGETS:
        if args.only in case.name:
            run_case(case, results)
    if not args.targets_only:
        print("\n== held out: calibrate on one run of a machine, predict its other runs ==")
        for case in HELD_OUT:
            if args.only in case.name:
                run_case(case, results)
        print("\n== new machines: no calibration, the runtime's documented defaults ==")
        for case in DEFAULTS:
            if args.only in case.name:
                run_case(case, results)
        print("\nnot predicted:")
        for what, why in NOT_PREDICTED.items():
            print(f"  {what}: {why}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
