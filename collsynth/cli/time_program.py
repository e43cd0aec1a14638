"""The program model on the command line: ``collsynth time`` of XML programs, and
``collsynth calibrate-runtime``.

::

    collsynth time FILE.xml|ALGO.json ... [--topology T] [--nodes K] [--calibration RT.json]
                   [--runtime nccl|rccl|msccl|msccl-executor] [--model program|closed-form]
                   [--sizes ...] [--json]
    collsynth calibrate-runtime LOG.csv --topology T [--nodes K] [--runtime rccl]
                   [--collective allgather] [--channels N] -o RT.json [--json]

``time`` with the program model (:mod:`collsynth.timing.runtime_model`) simulates each program
and the runtime's own ring (``nccl-ring`` / ``rccl-ring``,
:mod:`collsynth.timing.runtime_baselines`) with the same constants. An XML file needs
``--topology`` (its ranks are the topology's ranks in order); an algorithm file carries its
topology and is priced after lowering exactly as ``collsynth export --runtime R`` writes it by
default (one channel, ``Simple``; R is rccl or msccl-executor for those runtimes, else msccl).
The program model is used when a file is XML, when ``--topology`` or a runtime-constants
``--calibration`` is given, or with ``--model program``; otherwise ``time`` keeps the closed
form (:mod:`collsynth.cli.time`). Constants: the ``--calibration`` file
(``collsynth calibrate-runtime``), else the runtime's documented defaults.

``calibrate-runtime`` fits the runtime's constants on a CSV of its own measured curve
(``size_bytes,time_us`` columns, others ignored) by simulating its ring on the topology
(:func:`collsynth.timing.runtime_fit.fit_runtime`), prints the in-sample and held-out GMAE and
writes the constants.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from collsynth.errors import CollsynthError

__all__ = ["add_time_program_arguments", "wants_program_model", "run_program_time",
           "add_calibrate_runtime_parser", "run_calibrate_runtime"]

_RUNTIMES = ("nccl", "rccl", "msccl", "msccl-executor")


def _out(text: str = "") -> None:
    print(text, file=sys.stdout, flush=True)


def add_time_program_arguments(parser: argparse.ArgumentParser) -> None:
    """The program-model options of ``collsynth time``."""
    parser.add_argument("--topology", metavar="T",
                        help="topology the programs run on (needed for XML files; ranks map to "
                             "its ranks in order); selects the program model")
    parser.add_argument("--nodes", type=int, metavar="K",
                        help="with --topology: K copies of it joined by their NICs")
    parser.add_argument("--runtime", choices=_RUNTIMES,
                        help="runtime whose default constants the program model uses (default: "
                             "the calibration's, else nccl)")
    parser.add_argument("--model", choices=("program", "closed-form"),
                        help="program: simulate the runtime executing the program; closed-form: "
                             "the alpha-beta formula of the algorithm (default: program for XML "
                             "files, --topology or a runtime calibration, else closed-form)")


def _is_xml(path: str) -> bool:
    return Path(path).suffix.lower() == ".xml"


def _runtime_calibration(path: str | None) -> bool:
    from collsynth.timing.runtime_constants import is_runtime_constants_file

    return path is not None and is_runtime_constants_file(path)


def wants_program_model(args: argparse.Namespace) -> bool:
    """True when ``collsynth time`` should use the program model (see the module docstring)."""
    model = getattr(args, "model", None)
    if model is not None:
        return model == "program"
    return (any(_is_xml(f) for f in args.files) or getattr(args, "topology", None) is not None
            or _runtime_calibration(args.calibration))


def _constants(args: argparse.Namespace):
    from collsynth.timing.runtime_constants import default_constants, load_runtime_constants

    if args.calibration is not None:
        if not _runtime_calibration(args.calibration):
            raise CollsynthError(
                f"--calibration {args.calibration}: not a runtime-constants file; the program "
                "model reads the output of 'collsynth calibrate-runtime' (a 'collsynth "
                "calibrate' file goes with --model closed-form)")
        constants = load_runtime_constants(args.calibration)
        if args.runtime is not None and args.runtime != constants.runtime:
            raise CollsynthError(f"--runtime {args.runtime}: the calibration {args.calibration} "
                                 f"is for {constants.runtime}")
        return constants
    return default_constants(args.runtime or "nccl")


def _topology(args: argparse.Namespace):
    from collsynth.resolve import resolve_topology

    if args.topology is None:
        if args.nodes is not None:
            raise CollsynthError("--nodes needs --topology")
        return None
    if args.nodes is not None and args.nodes < 1:
        raise CollsynthError(f"--nodes {args.nodes}: expected a whole number >= 1")
    return resolve_topology(args.topology, nodes=args.nodes, unit_gbps=args.unit_gbps,
                            alpha_us=args.alpha_us)


def _export_runtime(runtime: str) -> str:
    return runtime if runtime in ("rccl", "msccl-executor") else "msccl"


def _programs(args: argparse.Namespace, topology: Any, constants: Any
              ) -> list[tuple[str, Any, Any]]:
    """(name, program, topology) per file."""
    from collsynth.export.pipeline import export_programs
    from collsynth.export.xml_reader import read_program

    found = []
    for path in args.files:
        name = Path(path).name
        if _is_xml(path):
            if topology is None:
                raise CollsynthError(f"{path}: an MSCCL XML program needs --topology (its ranks "
                                     "map to the topology's ranks in order)")
            program = read_program(path)
            if program.ngpus != topology.num_ranks:
                raise CollsynthError(f"{path}: the program has {program.ngpus} ranks but "
                                     f"topology {topology.name!r} has {topology.num_ranks}")
            found.append((name, program, topology))
            continue
        import dataclasses

        from collsynth.algorithm.fileformat import load_algorithm
        from collsynth.topology.builtins import with_figures

        algorithm = load_algorithm(path)
        algorithm = dataclasses.replace(algorithm, topology=with_figures(
            algorithm.topology, unit_gbps=args.unit_gbps, alpha_us=args.alpha_us))
        where = algorithm.topology
        if topology is not None:
            if topology.num_ranks != where.num_ranks:
                raise CollsynthError(f"{path}: the algorithm has {where.num_ranks} ranks but "
                                     f"topology {topology.name!r} has {topology.num_ranks}")
            where = topology
        runtime = _export_runtime(constants.runtime)
        exported = export_programs(algorithm, [runtime], subject=path)[runtime]
        found.append((name, exported.program, where))
    return found


def run_program_time(args: argparse.Namespace) -> int:
    """``collsynth time`` with the program model; return 0."""
    from collsynth.collective.kinds import canonical_name
    from collsynth.timing.runtime_baselines import (RING_COLLECTIVES, baseline_rows,
                                                    program_rows)

    constants = _constants(args)
    topology = _topology(args)
    programs = _programs(args, topology, constants)
    collectives = {canonical_name(p.coll) for _, p, _ in programs}
    ranks = {p.ngpus for _, p, _ in programs}
    if len(collectives) > 1 or len(ranks) > 1:
        listed = ", ".join(f"{n} ({p.coll}, {p.ngpus} ranks)" for n, p, _ in programs)
        raise CollsynthError(f"the programs are of different collectives or rank counts: {listed}")
    sizes = args.sizes
    rows = []
    for name, program, where in programs:
        rows += program_rows(name, program, where, sizes, constants)
    collective = collectives.pop()
    notes = []
    if collective in RING_COLLECTIVES:
        rows += baseline_rows(collective, programs[0][2], sizes, constants)
    else:
        notes.append(f"no {constants.runtime} ring for {collective}: no baseline row")
    rows.sort(key=lambda r: (r.size_bytes, r.kind != "program"))
    if args.json:
        _out(json.dumps([r.as_dict() for r in rows], indent=1))
        return 0
    from collsynth.cli.common import format_size, table as _table

    _out(f"{collective} on {programs[0][2].name} ({programs[0][1].ngpus} ranks): program model, "
         f"{constants.runtime} constants" + (f" ({args.calibration})" if args.calibration else
                                             " (documented defaults)"))
    for note in notes:
        _out(f"  {note}")
    table = []
    for size in sizes:
        here = [r for r in rows if r.size_bytes == size]
        best = min(here, key=lambda r: r.time_us).name
        for index, r in enumerate(here):
            table.append((format_size(size) if index == 0 else "", r.name, r.protocol,
                          f"{r.time_us:.3f}", f"{r.algbw_gbps:.3f}", f"{r.busbw_gbps:.3f}",
                          "*" if r.name == best else ""))
    for line in _table(("size", "program", "proto", "time (us)", "algbw (GB/s)",
                        "busbw (GB/s)", "best"), table, left=(0, 1, 2, 6)):
        _out(line)
    return 0


# -- calibrate-runtime -----------------------------------------------------------------------------


def add_calibrate_runtime_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``calibrate-runtime``; its handler is :func:`run_calibrate_runtime`."""
    from collsynth.cli.common import add_figure_arguments, positive_int

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
    parser.add_argument("--runtime", choices=_RUNTIMES, default="rccl",
                        help="the runtime measured (default rccl)")
    parser.add_argument("--collective", default="allgather",
                        choices=("allgather", "reduce_scatter", "allreduce"),
                        help="the collective measured (default allgather)")
    parser.add_argument("--channels", type=positive_int, metavar="N",
                        help="the runtime's channel count in the log (default: every ring found)")
    parser.add_argument("-o", "--output", required=True, metavar="RT.json",
                        help="where to write the constants")
    parser.add_argument("--json", action="store_true", help="machine-readable summary")
    add_figure_arguments(parser)
    parser.set_defaults(handler=run_calibrate_runtime)
    return parser


def run_calibrate_runtime(args: argparse.Namespace) -> int:
    """Run ``collsynth calibrate-runtime``; return 0."""
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
        _out(json.dumps(summary, indent=1))
        return 0
    held = "n/a" if fit.held_out_gmae is None else f"{fit.held_out_gmae:.1%}"
    _out(f"{args.runtime} {args.collective} on {topology.name}, {len(fit.rings)} channel(s): "
         f"GMAE {fit.gmae:.1%} in-sample, {held} held out (fit on every other size)")
    _out("  " + ", ".join(f"{k} = {v:.4g}" for k, v in fit.parameters.items()))
    _out(f"wrote {args.output}")
    return 0
