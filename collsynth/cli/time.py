"""``collsynth time`` and ``collsynth plot``: predicted times of algorithms and programs against
the runtime's own algorithms, by one pricing model (:mod:`collsynth.timing.pricing`).

``time`` prices algorithm files with the closed form (exact lines, crossovers) and MSCCL XML
programs, ``--topology`` or a runtime-constants calibration with the program model; ``--model``
picks. ``plot`` draws the closed form on log-log axes. Sizes and calibrations: docs/cli.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

from collsynth.cli.common import (EXIT_ERROR, EXIT_OK, PROGRESS_INTERVAL_S, UsageError,
                                  add_figure_arguments, add_settings_argument,
                                  check_gpus_per_thread, each_file_once, err, format_size,
                                  gpus_per_thread, job_settings, node_count, out,
                                  parse_size_range, parse_sizes, path_argument, positive_int,
                                  progress_line, runtime_settings, table)
from collsynth.errors import CollsynthError, FileFormatError, shown_path
from collsynth.exact import fraction_text
from collsynth.progress import heartbeat
from collsynth.runtimes import get_runtime, runtime_family, runtime_names

if TYPE_CHECKING:  # pragma: no cover - imported for annotations only
    import sympy

    from collsynth.algorithm.model import Algorithm
    from collsynth.export.program import Program
    from collsynth.runtimes import Runtime, RuntimeConstants
    from collsynth.timing.calibration import Calibration, CurveCalibration
    from collsynth.timing.closed_form import ClosedForm
    from collsynth.timing.pricing import Price, RuntimeAlgorithm
    from collsynth.timing.program_model import ProgramModel
    from collsynth.topology.model import Topology

__all__ = ["register", "run_time", "run_plot", "MODELS", "PRICED_RUNTIMES"]

#: Values of ``--model``.
MODELS = ("closed-form", "program")
#: Runtimes whose own algorithms and constants the models have (``--runtime``).
PRICED_RUNTIMES = tuple(name for name in runtime_names() if get_runtime(name).own_algorithms)

def _is_xml(path: str) -> bool:
    return Path(path).suffix.lower() == ".xml"


# -- inputs -------------------------------------------------------------------------------------


def _calibration(path: str | None) -> "Calibration | None":
    """The ``--calibration`` file, read once (its ``kind`` says which model it feeds)."""
    if path is None:
        return None
    try:
        from collsynth.timing.calibration import load_calibration
    except ImportError as exc:
        raise CollsynthError("--calibration: calibration support "
                             "(collsynth.timing.calibration) is not installed") from exc
    return load_calibration(path)


def _curve_calibration(args: argparse.Namespace, calibration: "Calibration | None"
                       ) -> "CurveCalibration | None":
    if calibration is not None and calibration.kind != "curve":
        raise CollsynthError(f"--calibration {args.calibration}: runtime constants go with the "
                             "program model (--model program); the closed form reads a curve "
                             "calibration ('collsynth calibrate')")
    return calibration


def _algorithms(paths: Sequence[str], args: argparse.Namespace) -> list["Algorithm"]:
    """The algorithm files, each on its topology with ``--unit-gbps`` / ``--alpha-us``, named
    uniquely (a repeated name gets primes)."""
    from collsynth.algorithm.fileformat import load_algorithm
    from collsynth.topology.builtins import with_figures

    found: list["Algorithm"] = []
    names: set[str] = set()
    for algorithm in map(load_algorithm, paths):
        name = algorithm.name or "algorithm"
        while name in names:
            name += "'"
        names.add(name)
        found.append(dataclasses.replace(
            algorithm, name=name, topology=with_figures(algorithm.topology,
                                                        unit_gbps=args.unit_gbps,
                                                        alpha_us=args.alpha_us)))
    return found


def _same_problem(algorithms: Sequence["Algorithm"]) -> None:
    first = algorithms[0]
    for other in algorithms[1:]:
        if (other.collective.name, other.collective.num_ranks) != (
                first.collective.name, first.collective.num_ranks):
            raise CollsynthError(
                f"algorithms of different collectives: {first.collective.describe()} and "
                f"{other.collective.describe()}; time them separately")
        if other.topology.links != first.topology.links:
            raise CollsynthError(
                f"algorithms on different topologies: {first.topology.name} and "
                f"{other.topology.name}; time them separately")


def wants_program_model(args: argparse.Namespace, calibration: "Calibration | None") -> bool:
    """``--model program``, or without ``--model`` no file, an XML file, ``--topology``,
    ``--channels`` or a runtime-constants calibration."""
    if args.model is not None:
        return args.model == "program"
    if not args.files or any(_is_xml(f) for f in args.files) or args.topology is not None \
            or args.channels is not None:
        return True
    return calibration is not None and calibration.kind == "runtime-constants"


# -- the closed form ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _ClosedFormView:
    """What ``time`` and ``plot`` show of the closed form: the algorithms' lines, the runtime's
    algorithms (each protocol's line), the measured line, and notes."""

    collective: str
    num_ranks: int
    topology: str
    algorithms: tuple["Algorithm", ...]
    runtime_algorithms: tuple["RuntimeAlgorithm", ...]
    measured: "RuntimeAlgorithm | None"
    lines: dict[str, "sympy.Expr"]
    notes: tuple[str, ...]
    model: "ClosedForm"
    measured_model: object

    def prices(self, size: int) -> list[tuple["Price", str]]:
        """``(price, kind)`` per row at ``size``: each algorithm, the runtime's algorithms at
        their best protocol there, the measured line."""
        rows = [(p, "algorithm") for a in self.algorithms for p in self.model.price(a, [size])]
        rows += [(p, "nccl") for r in self.runtime_algorithms
                 for p in self.model.price(r, [size])]
        if self.measured is not None:
            rows += [(p, "measured") for p in self.measured_model.price(self.measured, [size])]
        return rows


def _shown(price: "Price") -> str:
    return price.subject if price.protocol is None else f"{price.subject}/{price.protocol}"


def _closed_form(args: argparse.Namespace, loaded: "Calibration | None") -> _ClosedFormView:
    from collsynth.timing.closed_form import ClosedForm, Measured
    from collsynth.timing.kernels import reduce_gamma_us_per_byte
    from collsynth.timing.pricing import (MEASURED, RuntimeAlgorithm, pinned_protocols,
                                          runtime_algorithms)

    for path in args.files:
        if _is_xml(path):
            raise CollsynthError(f"{path}: the closed form prices algorithm files; an MSCCL XML "
                                 "program needs the program model (--topology T)")
    algorithms = _algorithms(args.files, args)
    calibration = _curve_calibration(args, loaded)
    _same_problem(algorithms)
    first = algorithms[0]
    coll, n, topology = first.collective.name, first.collective.num_ranks, first.topology
    gamma = reduce_gamma_us_per_byte(args.device) if args.device is not None else 0.0
    model = ClosedForm(calibration=calibration, gamma_us_per_byte=gamma,
                       source=args.calibration or "")
    for algorithm in algorithms:
        why = model.why_not(algorithm)
        if why is not None:
            raise CollsynthError(f"{algorithm.name}: {why}")
    lines = {a.name: model.line(a) for a in algorithms}
    runtime = get_runtime("nccl").at_version(getattr(args, "runtime_version", None))  # plot: none
    notes: list[str] = _version_notes(runtime, "--runtime-version")
    ours = runtime_algorithms(runtime, coll, topology)
    priced = []
    for subject in ours:
        why = model.why_not(subject)
        if why is not None:
            notes.append(f"no NCCL baseline: {why}")
            continue
        priced.append(subject)
        lines.update({p.name: model.line(p) for p in pinned_protocols(subject, model)})
    if not ours:
        notes.append(f"no NCCL baseline: NCCL runs {coll} as grouped send/recv, outside its "
                     "ring/tree tuning model")
    elif priced:
        missing = [a for a in runtime.own_algorithms if a not in {r.algorithm for r in ours}]
        notes += [f"NCCL has no {a} for {coll} ({a} is "
                  f"{' and '.join(_collectives_of(runtime, a, topology))} only)"
                  for a in missing if a in ("ring", "tree")]
        others = [a for a in missing if a not in ("ring", "tree")]
        if others:
            notes.append(f"NCCL does not offer {', '.join(others)} for {coll} on "
                         f"{topology.name} (its rules and the machine's facts)")
        setup = model.nccl_setup(topology)
        notes.append(f"NCCL: {len(setup.rings)} ring channel(s), {setup.bus_gbps:g} GB/s bus "
                     f"bandwidth, {setup.hardware} hops, {setup.nodes} node(s)")
    measured = measured_model = None
    if calibration is not None:
        _warn_other_machine(calibration.topology, topology.name, args.calibration)
        subject = RuntimeAlgorithm(runtime, MEASURED, coll, topology)
        measured_model = Measured(calibration, source=args.calibration or "")
        why = measured_model.why_not(subject)
        if why is not None:
            notes.append(f"no measured line: {why}")
        else:
            measured = subject
            lines[subject.name] = measured_model.line(subject)
        machine = model.machine(topology)
        notes.append(f"calibrated: alpha {machine.alpha_us:.4g} us per step, "
                     f"{machine.unit_gbps:.4g} GB/s per unit (from {args.calibration})")
    if first.collective.combining:
        notes.append(f"reductions: gamma = {gamma:.3g} us/byte" + (
            f" ({args.device})" if args.device else " (pass --device to charge them)"))
    return _ClosedFormView(coll, n, topology.name, tuple(algorithms), tuple(priced), measured,
                           lines, tuple(notes), model, measured_model)


def _collectives_of(runtime: "Runtime", algorithm: str, topology: "Topology") -> list[str]:
    from collsynth.timing.pricing import RUNS_ON_RING, runtime_algorithms

    return [c for c in RUNS_ON_RING
            if any(r.algorithm == algorithm for r in runtime_algorithms(runtime, c, topology))]


def _time_closed_form(args: argparse.Namespace, calibration: "Calibration | None") -> int:
    from collsynth.timing.model import lower_envelope

    # The closed form prices NCCL's own lines whatever the runtime options say: an option of the
    # program model here would be ignored, silently (--runtime rccl printed NCCL's lines).
    if args.nodes is not None:
        raise UsageError.of("time", "--nodes goes with --topology (the program model)")
    for given, option in ((args.channels is not None, "--channels"),
                          (args.runtime is not None, f"--runtime {args.runtime}"),
                          (args.gpus_per_thread != 1, "--gpus-per-thread"),
                          (args.layout is not None, "--layout"),
                          (bool(args.env.text), "--env")):
        if given:
            raise UsageError.of("time", f"{option} goes with the program model (--model "
                                        "program, or --topology T); the closed form prices "
                                        "NCCL's own algorithms")
    view = _closed_form(args, calibration)
    if args.collective is not None and args.collective.strip().lower().replace("-", "_") != \
            view.collective:
        raise CollsynthError(f"--collective {args.collective}: the files are {view.collective}")
    sizes = args.sizes
    envelope = lower_envelope(view.lines, sizes[0], sizes[-1])
    changes = [(a.name, b.name, b.from_bytes) for a, b in zip(envelope, envelope[1:])]
    per_size = []
    for size in sizes:
        rows = [{"name": _shown(p), "kind": kind, "time_us": p.time_us,
                 "algbw_gbps": p.algbw_gbps, "busbw_gbps": p.busbw_gbps}
                for p, kind in view.prices(size)]
        best = min(rows, key=lambda r: r["time_us"])
        per_size.append((size, rows, best))
    if args.json:
        out(json.dumps({
            "collective": view.collective, "num_ranks": view.num_ranks,
            "topology": view.topology, "model": view.model.name,
            "provenance": view.model.provenance, "notes": list(view.notes),
            "sizes": [{"size_bytes": size, "candidates": rows, "best": best["name"],
                       "best_time_us": best["time_us"]} for size, rows, best in per_size],
            "envelope": [{"name": s.name, "from_bytes": fraction_text(s.from_bytes),
                          "to_bytes": fraction_text(s.to_bytes)} for s in envelope],
            "crossovers": [{"from": a, "to": b, "size_bytes": fraction_text(x),
                            "size_bytes_float": float(x)} for a, b, x in changes],
        }, indent=1))
        return EXIT_OK
    out(f"{view.collective} on {view.topology} ({view.num_ranks} ranks): closed-form model; "
        "NCCL's own tuning model")
    for note in view.notes:
        out(f"  {note}")
    cells = []
    for size, rows, best in per_size:
        for index, row in enumerate(rows):
            cells.append((format_size(size) if index == 0 else "", row["name"],
                          f"{row['time_us']:.3f}", f"{row['algbw_gbps']:.3f}",
                          f"{row['busbw_gbps']:.3f}", "*" if row is best else ""))
    for line in table(("size", "candidate", "time (us)", "algbw (GB/s)", "busbw (GB/s)",
                       "best"), cells, left=(0, 1, 5)):
        out(line)
    out("best: " + "; ".join(f"{format_size(size)} {best['name']}" for size, _, best in per_size))
    if changes:
        out(f"crossovers between consecutive winners ({format_size(sizes[0])} to "
            f"{format_size(sizes[-1])}):")
        for a, b, x in changes:
            out(f"  {a} -> {b} at {fraction_text(x)} bytes ({format_size(x)})")
    else:
        out(f"no crossover: {envelope[0].name} is fastest from {format_size(sizes[0])} to "
            f"{format_size(sizes[-1])}")
    return EXIT_OK


# -- the program model --------------------------------------------------------------------------


def _constants(args: argparse.Namespace, calibration: "Calibration | None",
               topology: "Topology | None") -> tuple["RuntimeConstants", str]:
    """The program model's constants and where they come from (``topology``: whose GPUs say
    which runtime's defaults, without ``--runtime`` or a calibration)."""
    if calibration is not None:
        if calibration.kind != "runtime-constants":
            raise CollsynthError(
                f"--calibration {args.calibration}: a curve calibration gives the closed form "
                "its measured figures (--model closed-form); the program model reads runtime "
                "constants ('collsynth calibrate --model program')")
        constants = calibration.constants
        # msccl and msccl-executor run NCCL's kernels, so NCCL's measured constants price
        # them (as plan and tune-runtime take a calibration of the runtime's family); RCCL's
        # kernels are another runtime's.
        if args.runtime is not None and args.runtime != constants.runtime \
                and runtime_family(args.runtime) != runtime_family(constants.runtime):
            # two options that cannot go together: a usage error, as in tune-runtime and plan
            raise UsageError.of("time", f"--runtime {args.runtime}: the calibration "
                                        f"{args.calibration} is for {constants.runtime}, whose "
                                        f"kernels {args.runtime} does not run")
        return constants, args.calibration
    return get_runtime(args.runtime or _machine_runtime(topology)).defaults, \
        "documented defaults"


def _check_constants_machine(path: str, constants: "RuntimeConstants",
                             where: "Topology") -> None:
    """Refuse a runtime-constants calibration of one runtime family on a machine whose GPUs
    run the other (RCCL's constants on a DGX): without ``--runtime`` the calibration's runtime
    would be priced there, a runtime the machine cannot run, without a word."""
    from collsynth.topology.machine import machine_facts

    facts = machine_facts(where)
    family = runtime_family(constants.runtime)
    if facts.runtime is not None and family is not None and family != facts.runtime:
        raise CollsynthError(f"--calibration {path}: constants of {constants.runtime}, but "
                             f"{where.name} has {facts.arch} GPUs, which run {facts.runtime}: "
                             "calibrate with logs of this machine (or give --runtime "
                             f"{constants.runtime} to price that runtime here anyway)")


def _machine_runtime(topology: "Topology | None") -> str:
    """The runtime the machine's GPUs run (rccl on AMD GPUs, its facts say), else nccl: what
    ``time`` prices without ``--runtime`` or a calibration, as ``calibrate`` assumes."""
    from collsynth.topology.machine import machine_facts

    found = machine_facts(topology).runtime if topology is not None else None
    return found or "nccl"


def _topology(args: argparse.Namespace) -> "Topology | None":
    from collsynth.resolve import resolve_topology

    if args.topology is None:
        if args.nodes is not None:
            raise CollsynthError("--nodes needs --topology")
        return None
    if args.nodes is not None and args.nodes < 1:
        raise CollsynthError(f"--nodes {args.nodes}: expected a whole number >= 1")
    topology = resolve_topology(args.topology, nodes=args.nodes, unit_gbps=args.unit_gbps,
                                alpha_us=args.alpha_us)
    from collsynth.timing.pricing import require_communication
    require_communication(topology, "time")
    return topology


def _subjects(args: argparse.Namespace, topology: "Topology | None", runtime: str
              ) -> tuple[list["Program | Algorithm"], list[tuple[str, str]]]:
    """Each file as what the program model prices, named by the file, and ``(name, why)`` for
    each XML file the reader refuses: it is read as ``collsynth check --runtime RUNTIME`` reads
    it (the one bounded reader), so a program the checker refuses is never priced."""
    from collsynth.export.xml_reader import load_program

    found: list["Program | Algorithm"] = []
    refused: list[tuple[str, str]] = []
    for path in args.files:
        name = Path(path).name
        if _is_xml(path):
            if topology is None:
                raise CollsynthError(f"{path}: an MSCCL XML program needs --topology (its ranks "
                                     "map to the topology's ranks in order)")
            try:
                found.append(dataclasses.replace(load_program(path, runtime=runtime), name=name))
            except FileFormatError as exc:
                hint = "" if args.runtime is not None else \
                    (f" (read as {runtime}'s; give --runtime for the runtime it is written for, "
                     "e.g. --runtime msccl-executor)")
                refused.append((name, str(exc) + hint))
        else:
            (algorithm,) = _algorithms([path], args)
            found.append(dataclasses.replace(algorithm, name=name))
    if refused and not found:   # nothing left to price: the first refusal is the error
        raise CollsynthError(refused[0][1])
    return found, refused


def _shape(subject: "Program | Algorithm") -> tuple[str, int]:
    """``(collective, ranks)`` of a program or an algorithm."""
    from collsynth.collective.kinds import canonical_name
    from collsynth.export.program import Program

    if isinstance(subject, Program):
        return canonical_name(subject.coll), subject.ngpus
    return subject.collective.name, subject.collective.num_ranks


def _version_type(text: str) -> tuple[int, int]:
    """argparse type of ``--runtime-version``."""
    from collsynth.runtimes import parse_given_version

    try:
        return parse_given_version(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _runtime_pick(model: "ProgramModel", runtime: "Runtime", collective: str,
                  topology: "Topology", sizes: Sequence[int]) -> tuple[dict[int, str], str | None]:
    """The runtime's own default pick per size (its cost model at its version, on the tuning
    setup ``model`` prices with: :func:`collsynth.timing.tuning_model.choose`):
    ``{size: "algorithm/protocol"}``, or why it cannot be told."""
    from collsynth.timing.tuning_model import COLLECTIVES, SETUP_FAILURES, choose

    if collective not in COLLECTIVES:
        return {}, None
    setup = model.tuning(topology, runtime)
    if setup is None:
        return {}, (f"{runtime.family}'s own pick unknown: no tuning setup on "
                    f"{topology.name!r} (its machine facts name no GPU architecture)")
    try:
        return {size: f"{c.algorithm}/{c.protocol}" for size in sizes
                for c in (choose(setup, collective, size),)}, None
    except SETUP_FAILURES as exc:
        return {}, f"{runtime.family}'s own pick unknown: {exc}"


def _runtime_version(args: argparse.Namespace, calibration: "Calibration | None"
                     ) -> tuple[tuple[int, int] | None, str]:
    """The runtime version whose own choices are priced, and where it comes from:
    ``--runtime-version``, else the program calibration's (its log's banner), else none (the
    newest modelled)."""
    if args.runtime_version is not None:
        return args.runtime_version, "--runtime-version"
    found = getattr(calibration, "runtime_version", None)
    if found is not None:
        return found, f"the calibration {args.calibration}"
    return None, ""


def _version_notes(runtime: "Runtime", where: str) -> list[str]:
    """The lines saying which version's choices were priced (none without a version)."""
    from collsynth.timing.tuning_model import version_note

    if runtime.version is None:
        return []
    major, minor = runtime.version
    notes = [f"{runtime.family} {major}.{minor} ({where}): its own algorithm, protocol and "
             "channel choices at that version (docs/runtime-tuning.md, \"Versions\")"]
    beyond = version_note(runtime.family, runtime.version)
    return notes + ([beyond] if beyond else [])


def _nvls_channel_notes(channels: int | None, ours: Sequence["RuntimeAlgorithm"],
                        model: "ProgramModel", where: "Topology") -> list[str]:
    """A note for NVLS on fewer ``--channels`` than the runtime's own where the constants bound
    no NVLS channel: the time is then the ports' alone (docs/tuner-config.md, "NVLS
    channels")."""
    from collsynth.timing.tuning_model import NVLS_ALGORITHMS

    nvls = [r for r in ours if r.algorithm in NVLS_ALGORITHMS]
    if channels is None or not nvls or model.constants.nvls_channel_gbps is not None:
        return []
    setup = model.tuning(where, nvls[0].runtime)  # the one the pricing set up (a ring search)
    own = setup.nvls_channels if setup is not None else 0
    if not own or channels >= own:
        return []
    return [f"{name}: on {channels} of the runtime's {own} NVLS channels: the constants bound no "
            "NVLS channel (no nvls_channel_gbps), so only the switch's ports limit it and this "
            "time is a lower bound (NCCL's maintainers: NVLS needs 16 SMs for its peak; "
            "docs/tuner-config.md)" for name in (r.name for r in nvls)]


def _time_program(args: argparse.Namespace, calibration: "Calibration | None") -> int:
    """The program model: each file (a program that cannot be lowered or priced is an error
    row), then the runtime's own algorithms, the fastest and the runtime's own pick marked."""
    from collsynth.collective.kinds import collective_kind
    from collsynth.timing.program_model import ProgramModel
    from collsynth.runtimes.constants import FAMILY_MAX_CHANNELS
    from collsynth.timing.runtime_model import SimulationOptions

    topology = _topology(args)
    constants, source = _constants(args, calibration, topology)
    name = args.runtime or constants.runtime
    version, version_from = _runtime_version(args, calibration)
    settings, settings_from = job_settings(args.env, calibration, args.calibration)
    runtime = get_runtime(name if name in runtime_names() else "nccl").at_version(version) \
        .with_settings(settings)
    most = FAMILY_MAX_CHANNELS[runtime.family]
    if args.channels is not None and args.channels > most:
        # it would be priced and labelled 'nccl-ring/100ch', a count the runtime cannot run
        raise UsageError.of("time", f"--channels {args.channels}: more than the {most} channels "
                                    f"{runtime.name} has (its MAXCHANNELS)")
    model = ProgramModel(constants, runtime=runtime, topology=topology, source=source,
                         options=SimulationOptions(gpus_per_thread=args.gpus_per_thread))
    subjects, refused = _subjects(args, topology, model.export_runtime)
    shapes = [(subject.name, *_shape(subject)) for subject in subjects]
    if len({(c, n) for _, c, n in shapes}) > 1:
        listed = ", ".join(f"{name} ({c}, {n} ranks)" for name, c, n in shapes)
        raise CollsynthError(f"the programs are of different collectives or rank counts: {listed}")
    collective = collective_kind(args.collective).name if args.collective is not None else \
        shapes[0][1]  # '' is a name no collective has, not 'none given'
    if shapes and shapes[0][1] != collective:
        raise CollsynthError(f"--collective {args.collective}: the files are {shapes[0][1]}")
    where = topology if topology is not None else model.where(subjects[0])
    check_gpus_per_thread(args.gpus_per_thread, where, "time")
    if calibration is not None and args.runtime is None:
        _check_constants_machine(args.calibration, constants, where)
    # A heartbeat on stderr every 5 s while pricing runs long (hundreds of ranks take minutes).
    doing = ["pricing"]
    ranks = where.num_ranks

    def now_on(name: str) -> None:
        doing[0] = f"time: pricing {name} on {ranks} ranks"

    with heartbeat(None if args.quiet else progress_line, PROGRESS_INTERVAL_S,
                   lambda: doing[0]):
        return _price_and_print(args, constants, runtime, (version_from, settings_from), model,
                                where, subjects, refused, collective, now_on)


def _warn_other_machine(measured_on: str, timed: str, path: str | None) -> None:
    """Warn when a curve calibration was measured on another machine than the one timed:
    its figures are applied as they are. The names are compared without case, '-' or '_';
    a machine composed into K nodes (``DGX-A100x2``) counts as its node's machine, but a
    name is not matched by a part of it (``a100`` is not ``DGX-A100``)."""
    import re
    import warnings

    from collsynth.errors import InputWarning

    def key(name: str) -> str:
        return re.sub(r"[-_\s]", "", name.lower())
    if not re.fullmatch(re.escape(key(measured_on)) + r"(x\d+)?", key(timed)):
        warnings.warn(f"--calibration {path}: measured on {measured_on!r}, not on {timed!r}; "
                      "its figures are applied as they are", InputWarning, stacklevel=2)


def _price_and_print(args: argparse.Namespace, constants: "RuntimeConstants",
                     runtime: "Runtime", sources: tuple[str, str], model: "ProgramModel",
                     where: "Topology", subjects: list,
                     refused: list[tuple[str, str]], collective: str,
                     now_on: Callable[[str], None]) -> int:
    """:func:`_time_program`'s pricing and table; ``sources``: where the runtime's version and
    its settings come from; ``now_on`` is told what is being priced."""
    from collsynth.export.program import Program
    from collsynth.export.selection import selected_program
    from collsynth.timing.pricing import (PRICING_FAILURES, RuntimeAlgorithm, price_table,
                                          runtime_algorithms)
    from collsynth.timing.program_model import TREE_CORRECTION_NOTE

    version_from, settings_from = sources
    sizes = args.sizes
    prices: list["Price"] = []
    errors: list[tuple[str, str]] = [(name, " ".join(why.split())) for name, why in refused]
    # A program that cannot be lowered or priced is an error row. Not price_table: files may
    # share a name (two XML files of one program), and each gets its own row.
    priced: dict[int, dict[int, "Price"]] = {}  # id(subject) -> size -> its price
    for subject in subjects:
        now_on(subject.name)
        why = model.why_not(subject)
        if why is None:
            try:
                found = model.price(subject, sizes)
            except PRICING_FAILURES as exc:
                why = str(exc)
            else:
                prices.extend(found)
                priced[id(subject)] = {p.size_bytes: p for p in found}
        if why is not None:
            errors.append((subject.name, " ".join(why.split())))
    ours = [RuntimeAlgorithm(r.runtime, r.algorithm, r.collective, r.topology,
                             channels=args.channels)
            for r in runtime_algorithms(runtime, collective, where)]
    baselines = price_table(ours, sizes, model, on_subject=now_on)
    by_name = {r.name: r for r in ours}
    notes = _version_notes(runtime, version_from)
    settings = runtime.settings
    if settings.text:
        notes.append(f"{runtime.family} under {settings.describe()} ({settings_from}): its own "
                     "choices narrowed as the variables narrow them "
                     "(docs/runtime-tuning.md, \"Settings\")")
    # why each of the runtime's algorithms has no row: the reason an empty table ends with
    unpriced = list(baselines.errors.items())
    notes += [f"{name}: {why}: no row" for name, why in unpriced]
    if not ours and not settings.default and \
            runtime_algorithms(get_runtime(runtime.name).at_version(runtime.version),
                               collective, where):
        notes.append(f"{settings.describe()} leaves {runtime.family} no algorithm for "
                     f"{collective}: no runtime row (from 2.24 it fails such a call; "
                     "docs/runtime-tuning.md, \"Settings\")")
    elif not ours:
        notes.append(f"{runtime.family} runs {collective} outside its own algorithms (ring, "
                     "tree, NVLS, PAT): no runtime row")
    corrected: dict[str, dict[str, None]] = {}
    for p in baselines.prices:
        factor = model.bandwidth_factor(by_name[p.subject], p.protocol, p.size_bytes)
        if factor < 1:
            corrected.setdefault(p.subject, {})[f"x{factor:g}"] = None
    for subject, factors in corrected.items():
        notes.append(f"{subject}: bandwidth at {TREE_CORRECTION_NOTE} for each size "
                     f"({', '.join(factors)} here; docs/runtime-model.md)")
    notes += _nvls_channel_notes(args.channels, ours, model, where)
    now_on(f"{runtime.family}'s own pick")
    picks, unknown = _runtime_pick(model, runtime, collective, where, sizes)
    if unknown:
        notes.append(unknown)
    # A program's send over no direct link is a warning (its author may not have meant it);
    # the runtime's own sends take that path by design (NCCL's p2p through PCIe): a note.
    for warning in dict.fromkeys(f"{p.subject}: {p.note}" for p in prices
                                 if "no direct link" in p.note):
        err(f"warning: {warning}")
    notes += list(dict.fromkeys(f"{p.subject}: {p.note}" for p in baselines.prices
                                if "no direct link" in p.note))
    layout = _layout(args, collective)
    # every file the runtime would load, priced or not: it selects among all of them
    loads = [s for s in subjects if isinstance(s, Program)] if runtime.dialect is not None \
        else []
    if loads:
        notes.append(f"{runtime.name} as loaded: at each size the program {runtime.name} "
                     f"selects for an {layout} call (its minBytes-maxBytes and layout; the "
                     "first file given wins; the call's count assumed to fit nchunksperloop), "
                     f"else {runtime.family}'s own pick (its fastest algorithm where the pick "
                     "is unknown); 'vs fastest' there is against that (docs/cli.md)")
    elif args.layout is not None:
        notes.append(f"--layout {args.layout}: no effect here (it selects among XML programs "
                     "on a runtime that loads them: msccl, msccl-executor, rccl)")
    rows = []
    unpriced_picks: dict[str, list[int]] = {}
    for size in sizes:
        runtime_here = baselines.at(size)
        fastest = min(runtime_here, key=lambda p: p.time_us) if runtime_here else None
        pick = picks.get(size)
        # the runtime's own row of its pick (its algorithm; the model prices its protocol)
        picked_row = next((p for p in runtime_here if pick is not None
                           and by_name[p.subject].algorithm == pick.split("/")[0]), None)
        if pick is not None and picked_row is None and runtime_here:
            unpriced_picks.setdefault(pick, []).append(size)
        for p in (p for p in prices if p.size_bytes == size):
            rows.append({**p.as_dict(), "kind": "program", "vs_runtime": _versus(fastest, p)})
        if loads:
            own = picked_row or fastest
            chosen = selected_program(loads, size, runtime=runtime.name,
                                      collective=collective, in_place=layout == "in-place")
            # a selected file that could not be priced has its error row: no guess here
            runs = own if chosen is None else priced.get(id(chosen), {}).get(size)
            if runs is not None:
                rows.append({**runs.as_dict(), "name": f"{runtime.name} as loaded",
                             "note": f"runs {runs.subject}", "kind": "loaded",
                             "vs_runtime": _versus(own, runs)})
        for p in runtime_here:
            rows.append({**p.as_dict(), "kind": "baseline", "fastest_runtime": p is fastest,
                         "runtime_pick": pick if p is picked_row else None})
    # The fastest row is the yardstick; where the runtime's own pick has no row, say that
    # the pick was not priced, so that the fastest is not read as what the runtime runs.
    notes += [f"{runtime.family}'s own pick at {', '.join(format_size(s) for s in at)} is "
              f"{pick}, which has no row here: 'vs fastest' is against the fastest priced, "
              "not against what it runs" for pick, at in unpriced_picks.items()]
    rows += [{"name": name, "kind": "error", "error": why} for name, why in errors]
    # A file the reader refused is bad input: the rest is printed, the exit status says so;
    # so is a table with nothing priced in it (a script must not read [] as an answer).
    nothing = not any(r.get("time_us") is not None for r in rows)
    status = EXIT_ERROR if refused else EXIT_OK
    if args.json:
        out(json.dumps(rows, indent=1))
        return _unless_nothing(nothing, errors or unpriced, status)
    ranks = where.num_ranks
    what = "the runtime's own algorithms" if not subjects else "program model"
    out(f"{collective} on {where.name} ({ranks} ranks): {what}, {constants.runtime} constants"
        + (f" ({args.calibration})" if args.calibration else " (documented defaults)"))
    for note in notes:
        out(f"  {note}")
    out(f"  marks: * fastest; 'pick' is {runtime.family}'s own choice (its cost model) where it "
        "differs" + ("; 'vs fastest' is the fastest runtime algorithm's time over the "
                     "program's" if subjects else ""))
    cells = []
    for size in sizes:
        here = [r for r in rows if r.get("size_bytes") == size]
        best = min(here, key=lambda r: r["time_us"]) if here else None
        for index, r in enumerate(here):
            marks = ["*"] if r is best else []
            if r.get("runtime_pick") and not r.get("fastest_runtime"):
                marks.append(f"pick ({r['runtime_pick']})")
            versus = r.get("vs_runtime")
            vs = "" if not versus or versus["speedup"] is None else \
                f"{versus['speedup']:.2f}x {versus['name']}"
            cells.append((format_size(size) if index == 0 else "", r["name"],
                          r["protocol"] or "", str(r["channels"] or ""), f"{r['time_us']:.3f}",
                          f"{r['algbw_gbps']:.3f}", f"{r['busbw_gbps']:.3f}")
                         + ((vs,) if subjects else ()) + (" ".join(marks),))
    headers = ("size", "program" if subjects else "algorithm", "proto", "ch", "time (us)",
               "algbw (GB/s)", "busbw (GB/s)") + (("vs fastest",) if subjects else ()) + \
        ("mark",)
    if cells:
        for line in table(headers, cells, left=(0, 1, 2) + ((7, 8) if subjects else (7,))):
            out(line)
    else:
        out("  nothing priced")
    for name, why in errors:
        out(f"not priced: {name}: {why}")
    return _unless_nothing(nothing, errors or unpriced, status)


def _versus(reference: "Price | None", price: "Price") -> dict | None:
    """A row's ``vs_runtime``: ``reference``'s name and time, and its time over ``price``'s."""
    if reference is None:
        return None
    return {"name": reference.subject, "time_us": reference.time_us,
            "speedup": reference.time_us / price.time_us if price.time_us > 0 else None}


def _layout(args: argparse.Namespace, collective: str) -> str:
    """The calls' layout: ``--layout``, else torch's for the collective (allreduce, broadcast
    and reduce in place; allgather, reduce-scatter and alltoall out of place)."""
    from collsynth.plan.planner import TORCH_IN_PLACE

    if args.layout is not None:
        return args.layout
    return "in-place" if collective in TORCH_IN_PLACE else "out-of-place"


def _unless_nothing(nothing: bool, errors: list[tuple[str, str]], status: int) -> int:
    """``status``, or the error that nothing was priced, with the first reason in ``errors``
    (``main`` reports it, exit 1)."""
    if nothing:
        raise CollsynthError("time: nothing priced" + (f" ({errors[0][0]}: {errors[0][1]})"
                                                       if errors else ""))
    return status


def run_time(args: argparse.Namespace) -> int:
    """Run ``collsynth time``; return 0 (errors raise :class:`CollsynthError` or ``OSError``;
    a program that cannot be lowered or priced is an error row, not an error)."""
    from collsynth._files import check_input_file
    from collsynth.runtimes import check_channels

    if not args.files:
        if args.collective is None or args.topology is None:
            raise UsageError.of("time", "give algorithm or program files, or --collective C "
                                        "and --topology T for the runtime's own algorithms")
        if args.model == "closed-form":
            raise UsageError.of("time", "without files, time prices the runtime's own "
                                        "algorithms with the program model (--model program)")
    if args.channels is not None:
        try:  # a bad option, like --channels 0 (argparse's): a usage error
            check_channels(args.channels, "--channels")
        except CollsynthError as exc:
            raise UsageError.of("time", str(exc)) from None
    args.env = runtime_settings(args.env, "time")
    each_file_once(args.files, "time")
    for path in args.files:  # every input a regular file, before the first is priced
        check_input_file(path)
    calibration = _calibration(args.calibration)
    if wants_program_model(args, calibration):
        return _time_program(args, calibration)
    return _time_closed_form(args, calibration)


# -- plot ---------------------------------------------------------------------------------------


def run_plot(args: argparse.Namespace) -> int:
    """Run ``collsynth plot``; return 0 (errors raise :class:`CollsynthError` or ``OSError``)."""
    from collsynth._output import check_output_file, open_atomic
    from collsynth.timing.metrics import busbw_gbps
    from collsynth.timing.model import SIZE, lower_envelope
    from collsynth.timing.pricing import pinned_protocols

    output = Path(args.output)
    if output.suffix.lower() not in (".png", ".svg"):
        raise UsageError.of("plot", f"-o {shown_path(args.output)}: expected a .png or .svg file")
    each_file_once(args.files, "plot")
    check_output_file(output, label=f"-o {shown_path(args.output)}")  # before any work
    # plot has neither --topology nor --model: what the closed form cannot take is said here
    # with the command that takes it
    for path in args.files:
        if _is_xml(path):
            raise CollsynthError(f"{path}: plot draws the closed form of algorithm files; an "
                                 "MSCCL XML program is priced by 'collsynth time FILE.xml "
                                 "--topology T'")
    calibration = _calibration(args.calibration)
    if calibration is not None and calibration.kind != "curve":
        raise CollsynthError(f"--calibration {args.calibration}: runtime constants; plot draws "
                             "the closed form, which reads a curve calibration ('collsynth "
                             "calibrate'); 'collsynth time --topology T' prices with runtime "
                             "constants")
    view = _closed_form(args, calibration)
    lo, hi = args.sizes
    try:
        import matplotlib
    except ImportError as exc:
        raise CollsynthError("plot needs matplotlib (pip install matplotlib)") from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = 121
    sizes = [lo * (hi / lo) ** (i / (points - 1)) for i in range(points)]
    coll, n = view.collective, view.num_ranks

    def metric(name: str, size: float) -> float:
        t = float(view.lines[name].subs(SIZE, Fraction(repr(size))))
        return t if args.metric == "time" else busbw_gbps(coll, n, size, t)

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for algorithm in view.algorithms:
        ax.loglog(sizes, [metric(algorithm.name, s) for s in sizes], label=algorithm.name)
    for subject in view.runtime_algorithms:
        names = [p.name for p in pinned_protocols(subject, view.model)]
        values = [min((metric(nm, s) for nm in names), key=lambda v: v if args.metric == "time"
                      else -v) for s in sizes]
        ax.loglog(sizes, values, linestyle="--", label=f"{subject.name} (best protocol)")
    if view.measured is not None:
        ax.loglog(sizes, [metric(view.measured.name, s) for s in sizes], linestyle="-.",
                  label=f"{view.measured.name} (calibration)")
    for index, segment in enumerate(lower_envelope(view.lines, lo, hi)[1:]):  # the fastest changes
        ax.axvline(float(segment.from_bytes), color="grey", linestyle=":", linewidth=0.8,
                   label="crossover: the fastest changes" if index == 0 else None)
    ax.set_xlabel(f"{coll} buffer size (bytes, nccl-tests convention)")
    ax.set_ylabel("predicted time (us)" if args.metric == "time" else "bus bandwidth (GB/s)")
    ax.set_title(f"{coll} on {view.topology} ({n} ranks)")
    ax.legend(fontsize=9)
    fig.tight_layout()
    try:
        with open_atomic(output, binary=True, label=f"-o {shown_path(args.output)}") as handle:
            fig.savefig(handle, format=output.suffix.lower().lstrip("."))
    finally:
        plt.close(fig)
    out(f"wrote {shown_path(output)}")
    return EXIT_OK


# -- parsers ------------------------------------------------------------------------------------


def _sizes_type(text: str) -> list[int]:
    return parse_sizes(text)


def _range_type(text: str) -> tuple[int, int]:
    return parse_size_range(text)


def _common(parser: argparse.ArgumentParser, *, program: bool) -> None:
    parser.add_argument("files", nargs="*" if program else "+", metavar="FILE",
                        help="algorithm files (ALGO.json; same collective and topology)"
                             + (", or MSCCL XML programs (FILE.xml, with --topology)"
                                if program else ""))
    parser.add_argument("--calibration", type=path_argument, metavar="FILE",
                        help="calibration file: a curve calibration ('collsynth calibrate') "
                             "gives the closed form measured figures per step and per unit and "
                             "the measured line of the collective"
                             + ("; a runtime-constants one ('collsynth calibrate --model "
                                "program') gives the program model its constants"
                                if program else ""))
    parser.add_argument("--device", metavar="NAME",
                        help="GPU whose reduction cost (gamma) is charged to combining "
                             "collectives: v100, a100-40gb, a100-80gb, h100, mi250, mi300x "
                             "(default: reductions are free)")
    add_figure_arguments(parser)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``time`` and ``plot`` to ``subparsers`` (from ``add_subparsers``)."""
    parser = subparsers.add_parser(
        "time", help="predicted times of algorithms and the runtime's own algorithms",
        description="Predict the time, algbw and busbw of algorithm files (closed form) or "
                    "MSCCL XML programs (program model) and of the runtime's own algorithms "
                    "(ring, tree, NVLS, NVLS-tree, PAT where the machine has them) on the same "
                    "topology at given sizes, and with the closed form the exact sizes where "
                    "the fastest changes. Without files, --collective C --topology T prints "
                    "the runtime's own algorithms alone. Sizes: B, KB/MB/GB (decimal), "
                    "KiB/MiB/GiB (binary).")
    _common(parser, program=True)
    parser.add_argument("--sizes", type=_sizes_type, default=parse_sizes("1KB,1MB,1GB"),
                        metavar="S1,S2,...", help="buffer sizes (default 1KB,1MB,1GB)")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument("-q", "--quiet", action="store_true",
                        help="no progress lines on stderr (pricing that runs over 5 s shows "
                             "what it is on)")
    parser.add_argument("--topology", metavar="T",
                        help="topology the programs run on (needed for XML files; ranks map to "
                             "its ranks in order); selects the program model")
    parser.add_argument("--nodes", type=node_count, metavar="K",
                        help="with --topology: K copies of it joined by their NICs")
    parser.add_argument("--collective", metavar="C",
                        help="the collective (allreduce, allgather, ...): without files, with "
                             "--topology, time prices the runtime's own algorithms for it")
    parser.add_argument("--channels", type=positive_int, metavar="N",
                        help="the runtime's own algorithms on N channels (default: as the "
                             "runtime would, per algorithm)")
    parser.add_argument("--runtime", choices=PRICED_RUNTIMES,
                        help="runtime whose default constants the program model uses (default: "
                             "the calibration's, else rccl on AMD GPUs and nccl otherwise)")
    parser.add_argument("--runtime-version", type=_version_type, metavar="V",
                        help="price the runtime's own choices as its version V makes them "
                             "(2.18, 2.22.3; default: a program calibration's, else the newest "
                             "modelled)")
    add_settings_argument(parser, "the runtime's own choices are narrowed")
    parser.add_argument("--gpus-per-thread", type=gpus_per_thread, default=1, metavar="G",
                        help="program model: each calling thread drives G GPUs, as nccl-tests' "
                             "-g G (default 1: a process per GPU); a calibration's host work "
                             "per call and channel is paid G times")
    parser.add_argument("--layout", choices=("in-place", "out-of-place"),
                        help="XML programs on msccl, msccl-executor or rccl: the calls the "
                             "'as loaded' row prices (the program the runtime selects by size "
                             "and layout); default: torch's (allreduce in place, allgather and "
                             "reduce-scatter out of place)")
    parser.add_argument("--model", choices=MODELS,
                        help="program: simulate the runtime executing the program; closed-form: "
                             "the alpha-beta formula of the algorithm (default: program for XML "
                             "files, --topology or a runtime calibration, else closed-form)")
    parser.set_defaults(handler=run_time)

    parser = subparsers.add_parser(
        "plot", help="log-log plot of algorithms against NCCL's ring/tree",
        description="Plot predicted time or bus bandwidth against buffer size for algorithm "
                    "files and NCCL's ring and tree (best protocol per size), closed form.")
    _common(parser, program=False)
    parser.add_argument("--sizes", type=_range_type, default=(10**3, 10**9), metavar="FROM:TO",
                        help="size range (default 1KB:1GB)")
    parser.add_argument("--metric", choices=("time", "busbw"), default="time",
                        help="what to plot (default time)")
    parser.add_argument("-o", "--output", type=path_argument, required=True, metavar="PATH",
                        help="image file: .png or .svg")
    parser.set_defaults(handler=run_plot)
