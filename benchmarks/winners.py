"""Who wins, predicted against measured: NCCL's own algorithms and MSCCL's programs on one machine.

    python benchmarks/winners.py [--json FILE]

The msccl performance page measured, on one ND H100 v5 VM, NCCL 2.18.3's allreduce and
allgather and the MSCCL programs Azure ships for that VM (data/public-logs/README.md, the
``*_msccl-perf.csv`` files; the programs in data/msccl-xml/msccl-scheduler/). Each case
calibrates the program model on ONE curve (:func:`collsynth.timing.runtime_fit.fit_runtime`)
and predicts all four: NCCL's curve as the runtime's own pick per size
(:func:`~collsynth.timing.program_model.chosen_algorithms`) and MSCCL's as the program the
executor selects per size (:func:`collsynth.export.selection.selected_program`; NCCL's pick
where none applies), both priced by :class:`~collsynth.timing.program_model.ProgramModel` with
the same constants. Reported: mean |predicted / measured - 1| per size band, and at every size
where the two measured times differ by more than 20%, whether the predicted winner is the
measured one (the issue's "right winner" target). Cases: the run's own NCCL allreduce (the
product's use: calibrate on the runtime, price programs against it) and an H100 allreduce
measured on another cloud (AWS p5, data/nccl-tests), which knows nothing of this VM.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PUBLIC = ROOT / "data" / "public-logs"
PROGRAMS = ROOT / "data" / "msccl-xml" / "msccl-scheduler"
P5 = ROOT / "data" / "nccl-tests" / "H100-8gpu-p5_all_reduce_awsome.txt"

KiB, MiB = 1 << 10, 1 << 20
BANDS = (("<=64K", 0, 64 * KiB), ("128K-32M", 128 * KiB, 32 * MiB), (">=64M", 64 * MiB, 1 << 62))
#: Measured times further apart than this factor name a winner the prediction must match.
CLEAR_WIN = 1.2
#: The page's runs: fp16 elements (the executor's count rule), in-place calls, NCCL 2.18.
ELEMENT_BYTES = 2
VERSION = (2, 18)
COLLECTIVES = {"allreduce": "all_reduce", "allgather": "all_gather"}


def curve(collective: str, who: str) -> list[tuple[int, float]]:
    from collsynth.timing.logs import load_log

    log = load_log(PUBLIC / f"H100-8gpu-azure-ndh100v5_{COLLECTIVES[collective]}_{who}"
                            "_msccl-perf.csv")
    return [(r.size_bytes, r.time_us) for r in log.rows]


def programs(collective: str) -> list:
    from collsynth.export.xml_reader import load_program

    return [p for p in (load_program(f, runtime="msccl-executor")
                        for f in sorted(PROGRAMS.glob("*.xml")))
            if p.coll == collective]


def calibrate(name: str):
    from collsynth.timing.logs import load_log
    from collsynth.timing.runtime_fit import fit_runtime
    from collsynth.topology import get_topology

    topology = get_topology("DGX-H100")
    if name == "own":
        rows, version = curve("allreduce", "nccl"), VERSION
    else:
        log = load_log(P5)
        rows = sorted({r.size_bytes: r.time_us for r in log.rows if not r.in_place}.items())
        version = None
    return fit_runtime(rows, topology, "allreduce", runtime="nccl", version=version)


def predict(constants, collective: str) -> list[dict]:
    """Per measured size: both measured times, both predicted, and what ran."""
    from collsynth.export.selection import selected_program
    from collsynth.runtimes import get_runtime
    from collsynth.timing.program_model import ProgramModel, chosen_algorithms
    from collsynth.topology import get_topology

    topology = get_topology("DGX-H100")
    runtime = get_runtime("msccl-executor").at_version(VERSION)
    model = ProgramModel(constants, runtime=runtime, topology=topology)
    nccl, msccl = curve(collective, "nccl"), curve(collective, "msccl")
    sizes = [s for s, _ in nccl]
    if sizes != [s for s, _ in msccl]:
        raise SystemExit(f"{collective}: the NCCL and MSCCL curves have different sizes")
    own = chosen_algorithms(model, runtime, collective, topology, sizes)
    loaded = programs(collective)
    rows = []
    for (size, nccl_us), (_, msccl_us), algorithm in zip(nccl, msccl, own):
        ours = model.price(algorithm, [size])[0]
        program = selected_program(loaded, size, runtime="msccl-executor",
                                   collective=collective, in_place=True,
                                   element_size=ELEMENT_BYTES)
        theirs = ours if program is None else model.price(program, [size])[0]
        rows.append({"size_bytes": size, "nccl_measured_us": nccl_us,
                     "nccl_predicted_us": ours.time_us,
                     "nccl_ran": f"{ours.subject}/{ours.protocol}/{ours.channels}ch",
                     "msccl_measured_us": msccl_us, "msccl_predicted_us": theirs.time_us,
                     "msccl_ran": "nccl" if program is None else
                     f"{program.name}/{program.proto}/{program.nchannels}ch"})
    return rows


def band_errors(rows: list[dict], who: str) -> list[float | None]:
    found = []
    for _, low, high in BANDS:
        errors = [abs(r[f"{who}_predicted_us"] / r[f"{who}_measured_us"] - 1) for r in rows
                  if low <= r["size_bytes"] <= high]
        found.append(sum(errors) / len(errors) if errors else None)
    return found


def winners(rows: list[dict]) -> tuple[int, list[int], list[int]]:
    """Sizes where the measured times differ by more than :data:`CLEAR_WIN`, those of them
    where the predicted winner is not the measured one, and the sizes where the prediction
    claims such a clear win that the measurement does not show (an overclaim: the user would
    deploy for a gain that is not there)."""
    clear, wrong, overclaimed = 0, [], []
    for r in rows:
        measured = r["nccl_measured_us"] / r["msccl_measured_us"]
        predicted = r["nccl_predicted_us"] / r["msccl_predicted_us"]
        if max(measured, 1 / measured) <= CLEAR_WIN:
            if max(predicted, 1 / predicted) > CLEAR_WIN:
                overclaimed.append(r["size_bytes"])
            continue
        clear += 1
        if (measured > 1) != (predicted > 1):
            wrong.append(r["size_bytes"])
    return clear, wrong, overclaimed


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.0f}%"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", metavar="FILE", help="also write every figure as JSON")
    args = parser.parse_args(argv)
    results = []
    for case, label in (("own", "the run's own NCCL allreduce (ND H100 v5, NCCL 2.18.3)"),
                        ("p5", "an H100 allreduce of another cloud (AWS p5)")):
        t0 = time.perf_counter()
        fit = calibrate(case)
        print(f"calibrated on {label}: in-sample GMAE {100 * fit.gmae:.1f}%, "
              f"{time.perf_counter() - t0:.1f} s")
        for collective in COLLECTIVES:
            rows = predict(fit.constants, collective)
            clear, wrong, overclaimed = winners(rows)
            bands = {who: band_errors(rows, who) for who in ("nccl", "msccl")}
            print(f"  {collective}: NCCL " + " ".join(_pct(e) for e in bands["nccl"])
                  + "  MSCCL " + " ".join(_pct(e) for e in bands["msccl"])
                  + f"  (bands {', '.join(b[0] for b in BANDS)});"
                  + f" right winner at {clear - len(wrong)} of {clear} sizes with a clear one"
                  + (f", wrong at {', '.join(str(s) for s in wrong)} B" if wrong else "")
                  + (f"; a clear win predicted but not measured at "
                     f"{', '.join(str(s) for s in overclaimed)} B" if overclaimed else ""))
            for r in rows:
                m = r["nccl_measured_us"] / r["msccl_measured_us"]
                p = r["nccl_predicted_us"] / r["msccl_predicted_us"]
                print(f"    {r['size_bytes']:>11} B  NCCL {r['nccl_measured_us']:8.2f} -> "
                      f"{r['nccl_predicted_us']:8.2f} us ({r['nccl_ran']})  MSCCL "
                      f"{r['msccl_measured_us']:8.2f} -> {r['msccl_predicted_us']:8.2f} us "
                      f"({r['msccl_ran']})  speedup {m:.2f} -> {p:.2f}")
            results.append({"case": case, "collective": collective, "rows": rows,
                            "bands": bands, "clear": clear, "wrong": wrong,
                            "overclaimed": overclaimed,
                            "gmae": fit.gmae})
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    if any(not math.isfinite(r["nccl_predicted_us"]) for c in results for r in c["rows"]):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
