"""``collsynth calibrate-runtime``: fit the program model's constants to a runtime's measured
ring (a CSV with ``size_bytes,time_us`` columns; :func:`collsynth.timing.runtime_fit.fit_runtime`),
print the in-sample and held-out GMAE and write the constants for ``collsynth time --calibration``.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from collsynth.cli.common import (EXIT_OK, add_figure_arguments, channel_count, out,
                                  positive_int)
from collsynth.cli.time import PRICED_RUNTIMES as RUNTIMES

__all__ = ["register", "run_calibrate_runtime"]


def register(subparsers: Any) -> None:
    """Add ``calibrate-runtime`` to ``subparsers`` (from ``add_subparsers``)."""
    parser = subparsers.add_parser(
        "calibrate-runtime", help="fit a runtime's constants on its measured ring",
        description="Fit the program model's constants (base latency, hop latency scale, "
                    "per-connection throughput per protocol) so that the runtime's own ring on "
                    "the topology reproduces a measured curve (CSV with size_bytes and time_us "
                    "columns); print the in-sample and held-out GMAE; write the constants.")
    parser.add_argument("log", metavar="LOG.csv", help="measured curve of the runtime's own "
                                                       "collective")
    parser.add_argument("--topology", required=True, metavar="T", help="the machine measured")
    parser.add_argument("--nodes", type=positive_int, metavar="K", help="K nodes of it")
    parser.add_argument("--runtime", choices=RUNTIMES, default="rccl",
                        help="the runtime measured (default rccl)")
    parser.add_argument("--collective", default="allgather",
                        choices=("allgather", "reduce_scatter", "allreduce"),
                        help="the collective measured (default allgather)")
    parser.add_argument("--channels", type=channel_count, metavar="N",
                        help="the runtime's channel count in the log (default: every ring found)")
    parser.add_argument("-o", "--output", required=True, metavar="RT.json",
                        help="where to write the constants")
    parser.add_argument("--json", action="store_true", help="machine-readable summary")
    add_figure_arguments(parser)
    parser.set_defaults(handler=run_calibrate_runtime)


def run_calibrate_runtime(args: argparse.Namespace) -> int:
    """Run ``collsynth calibrate-runtime``; return 0 (errors raise)."""
    from collsynth._output import check_output_file
    from collsynth.resolve import resolve_topology
    from collsynth.timing.runtime_constants import save_runtime_constants
    from collsynth.timing.runtime_fit import fit_runtime, read_curve

    check_output_file(args.output, label=f"-o {args.output}")
    rows = read_curve(args.log)
    topology = resolve_topology(args.topology, nodes=args.nodes, unit_gbps=args.unit_gbps,
                                alpha_us=args.alpha_us)
    fit = fit_runtime(rows, topology, args.collective, runtime=args.runtime,
                      channels=args.channels)
    save_runtime_constants(fit.constants, args.output)
    summary = {"output": args.output, "runtime": args.runtime, "topology": topology.name,
               "channels": len(fit.rings), "parameters": fit.parameters, "gmae": fit.gmae,
               "held_out_gmae": fit.held_out_gmae,
               "rows": [{"size_bytes": s, "time_us": m, "predicted_us": p, "protocol": q}
                        for s, m, p, q in zip(fit.sizes, fit.measured_us, fit.predicted_us,
                                              fit.protocols)]}
    if args.json:
        out(json.dumps(summary, indent=1))
        return EXIT_OK
    held = "n/a" if fit.held_out_gmae is None else f"{fit.held_out_gmae:.1%}"
    out(f"{args.runtime} {args.collective} on {topology.name}, {len(fit.rings)} channel(s): "
        f"GMAE {fit.gmae:.1%} in-sample, {held} held out (fit on every other size)")
    out("  " + ", ".join(f"{k} = {v:.4g}" for k, v in fit.parameters.items()))
    out(f"wrote {args.output}")
    return EXIT_OK
