"""``collsynth time`` with the program model: each MSCCL program (an algorithm file is lowered as
``collsynth export`` writes it) simulated as the runtime executes it
(:mod:`collsynth.timing.runtime_model`), against the runtime's own ring with the same constants.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from collsynth.cli.common import EXIT_OK, format_size, out, table
from collsynth.errors import CollsynthError

__all__ = ["add_time_program_arguments", "wants_program_model", "run_program_time", "RUNTIMES"]

#: The runtimes whose constants the program model has.
RUNTIMES = ("nccl", "rccl", "msccl", "msccl-executor")


def add_time_program_arguments(parser: argparse.ArgumentParser) -> None:
    """The program-model options of ``collsynth time``."""
    parser.add_argument("--topology", metavar="T",
                        help="topology the programs run on (needed for XML files; ranks map to "
                             "its ranks in order); selects the program model")
    parser.add_argument("--nodes", type=int, metavar="K",
                        help="with --topology: K copies of it joined by their NICs")
    parser.add_argument("--runtime", choices=RUNTIMES,
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
    """True when ``collsynth time`` should use the program model: ``--model program``, or
    without ``--model`` an XML file, ``--topology`` or a runtime-constants calibration."""
    model = getattr(args, "model", None)
    if model is not None:
        return model == "program"
    return (any(_is_xml(f) for f in args.files) or getattr(args, "topology", None) is not None
            or _runtime_calibration(args.calibration))


def _constants(args: argparse.Namespace):
    from collsynth.runtimes import get_runtime
    from collsynth.timing.runtime_constants import load_runtime_constants

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
    return get_runtime(args.runtime or "nccl").defaults


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
    """``collsynth time`` with the program model; return 0 (errors raise)."""
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
        if collective == "allreduce":  # the runtime's other algorithm for it: its tree
            try:
                rows += baseline_rows(collective, programs[0][2], sizes, constants,
                                      algorithm="tree")
            except CollsynthError as exc:
                notes.append(f"no {constants.runtime} tree: {exc}")
    else:
        notes.append(f"no {constants.runtime} ring for {collective}: no baseline row")
    rows.sort(key=lambda r: (r.size_bytes, r.kind != "program"))
    if args.json:
        out(json.dumps([r.as_dict() for r in rows], indent=1))
        return EXIT_OK
    out(f"{collective} on {programs[0][2].name} ({programs[0][1].ngpus} ranks): program model, "
        f"{constants.runtime} constants" + (f" ({args.calibration})" if args.calibration else
                                            " (documented defaults)"))
    for note in notes:
        out(f"  {note}")
    cells = []
    for size in sizes:
        here = [r for r in rows if r.size_bytes == size]
        best = min(here, key=lambda r: r.time_us).name
        for index, r in enumerate(here):
            cells.append((format_size(size) if index == 0 else "", r.name, r.protocol,
                          f"{r.time_us:.3f}", f"{r.algbw_gbps:.3f}", f"{r.busbw_gbps:.3f}",
                          "*" if r.name == best else ""))
    for line in table(("size", "program", "proto", "time (us)", "algbw (GB/s)",
                       "busbw (GB/s)", "best"), cells, left=(0, 1, 2, 6)):
        out(line)
    return EXIT_OK
