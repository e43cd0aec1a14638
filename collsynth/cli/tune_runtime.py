"""``collsynth tune-runtime``: a tuner config for stock NCCL or RCCL on a machine.

Per collective and size range it forces the runtime's own (algorithm, protocol, channels) where
the program model (with ``--calibration``'s constants, else the runtime's documented ones) predicts
it faster than the runtime's own choice priced the same way
(:func:`collsynth.export.tuner.machine.tune_machine`), writes the CSV that NCCL's example tuner
plugin or RCCL's built-in tuner reads and prints the predicted-vs-default table. The file, its
quirks and how to load it: docs/tuner-config.md.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from collsynth._parse import number_text
from collsynth.cli.common import (EXIT_OK, PROGRESS_INTERVAL_S, UsageError,
                                  add_settings_argument, comma_entries, input_files, job_settings,
                                  node_count, out, parse_size_range, path_argument,
                                  progress_line, runtime_settings, table, why_not)
from collsynth.errors import shown_path
from collsynth.progress import heartbeat

__all__ = ["register", "run_tune_runtime", "DEFAULT_COLLECTIVES", "DEFAULT_SIZES"]

COMMAND = "tune-runtime"
DEFAULT_COLLECTIVES = "allreduce,allgather,reducescatter"
#: Sampled sizes: 64 B to 4 GiB in x2 steps (boundaries are then bisected to the byte).
DEFAULT_SIZES = "64B:4GiB"


def _fraction(text: str) -> float:
    """A threshold: ``0.03`` or ``3%``, from 0 to 10."""
    raw = text.strip()
    try:
        value = float(number_text(raw[:-1])) / 100 if raw.endswith("%") else \
            float(number_text(raw))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected a fraction like 0.03 or 3%, got "
                                         f"{text!r}{why_not(exc)}") from None
    if not 0 <= value <= 10:
        raise argparse.ArgumentTypeError(f"expected a fraction from 0 to 10, got {text!r}")
    return value


def register(subparsers: Any) -> None:
    """Add ``tune-runtime`` to ``subparsers`` (from ``add_subparsers``)."""
    parser = subparsers.add_parser(
        COMMAND, help="write a tuner config for stock NCCL or RCCL",
        description="Pick, per collective and size range, the runtime's own algorithm, "
                    "protocol and channel count predicted fastest on the machine, and write "
                    "the CSV that NCCL's example tuner plugin (NCCL_TUNER_PLUGIN, "
                    "NCCL_TUNER_CONFIG_FILE) or RCCL's built-in CSV tuner "
                    "(NCCL_TUNER_CONFIG_FILE) reads. Predictions, not measurements: see "
                    "docs/tuner-config.md.")
    parser.add_argument("--topology", required=True, metavar="T",
                        help="the machine (a built-in, a family member or a topology file)")
    parser.add_argument("--nodes", type=node_count, metavar="K", help="K nodes of it")
    parser.add_argument("--runtime", required=True, choices=("nccl", "rccl"),
                        help="nccl: NCCL's example tuner plugin; rccl: RCCL's built-in tuner")
    parser.add_argument("--collectives", default=DEFAULT_COLLECTIVES, metavar="LIST",
                        help=f"comma-separated (default {DEFAULT_COLLECTIVES}; also broadcast, "
                             "reduce)")
    parser.add_argument("--sizes", type=parse_size_range, default=DEFAULT_SIZES,
                        metavar="A:B", help=f"sampled sizes, x2 steps (default {DEFAULT_SIZES})")
    parser.add_argument("--threshold", type=_fraction, default=0.03, metavar="F",
                        help="write a rule only where it is predicted more than F faster than "
                             "the runtime's own choice (default 0.03, i.e. 3%%)")
    parser.add_argument("--calibration", type=path_argument, metavar="FILE",
                        help="runtime constants the program model prices with (collsynth "
                             "calibrate --model program); default: the runtime's documented "
                             "ones")
    add_settings_argument(parser, "the job's runtime never runs a pair they disable, so no "
                                  "rule names one, and its own choice is narrowed as well")
    parser.add_argument("-o", "--output", type=path_argument, required=True, metavar="FILE",
                        help="the tuner config to write (e.g. nccl_tuner.conf)")
    parser.add_argument("--json", action="store_true", help="machine-readable summary")
    parser.add_argument("-q", "--quiet", action="store_true",
                        help="no progress lines on stderr (pricing that runs over "
                             f"{PROGRESS_INTERVAL_S:.0f} s, minutes on a rack of 72 GPUs, says "
                             "what it is on)")
    parser.set_defaults(handler=run_tune_runtime)


def _sizes(bounds: tuple[int, int]) -> list[int]:
    """``A``, ``2A``, ``4A``, ... and ``B`` itself."""
    from collsynth.timing.tune import tune_sizes

    lo, hi = bounds
    return sorted(set(tune_sizes(lo, hi, 2)) | {hi})


def _span(values: list[float]) -> str:
    """``low-high`` of ``values`` to 3 significant digits (one figure when they round alike)."""
    if not values:
        return "-"
    low, high = min(values), max(values)
    return f"{low:.3g}" if f"{low:.3g}" == f"{high:.3g}" else f"{low:.3g}-{high:.3g}"


def _bytes_text(value: int) -> str:
    from collsynth.export.tuner.config import SIZE_MAX

    return "max" if value == SIZE_MAX else str(value)


def _range_rows(tuned: Any, runtime: str) -> list[list[str]]:
    """One table row per size range. Its figures cover every size priced in the range, the
    sampled ones and the ends the bisection placed, as the file's header does
    (``TunedRange.speedups``): a rule is written for the whole range, ends included."""
    rows = []
    for r in tuned.tuning.ranges:
        if r.keep:
            written = f"{r.choice.label} (own, pinned)" if runtime == "nccl" else "- (own)"
        else:
            written = r.choice.label
        owns = sorted({row.default.label for row in r.rows}) or [r.choice.label]
        rows.append([f"{_bytes_text(r.min_bytes)}..{_bytes_text(r.max_bytes)}", written,
                     str(sum(row.sampled for row in r.rows)),
                     "-" if r.keep else _span([row.time_us for row in r.rows]),
                     ",".join(owns), _span([row.default_time_us for row in r.rows]),
                     "-" if r.keep else r.gain])
    return rows


def run_tune_runtime(args: argparse.Namespace) -> int:
    """Run ``collsynth tune-runtime``; return 0 (errors raise)."""
    from collsynth._output import check_output_file
    from collsynth.errors import InvalidTopologyError, UnknownNameError
    from collsynth.export.tuner.config import COLLECTIVES, format_rule, write_tuner_config
    from collsynth.export.tuner.machine import (ProgramModelPrice, config_collective,
                                                tune_machine)
    from collsynth.resolve import resolve_topology
    from collsynth.timing.tuning_model import tuning_setup
    from collsynth.topology.machine import machine_facts

    check_output_file(args.output, label=f"-o {shown_path(args.output)}",
                      inputs=input_files(args.topology, args.calibration))
    constants = loaded = None
    if args.calibration is not None:
        from collsynth.runtimes import runtime_family
        from collsynth.timing.calibration import load_calibration, runtime_constants

        loaded = load_calibration(args.calibration)
        constants = runtime_constants(loaded, args.calibration)
        if runtime_family(constants.runtime) != args.runtime:
            raise UsageError.of(COMMAND, f"--calibration {args.calibration}: its constants are "
                                         f"{constants.runtime!r}'s; --runtime {args.runtime} "
                                         f"needs a calibration of {args.runtime}")
    try:
        collectives = comma_entries(args.collectives, "collective names")
    except argparse.ArgumentTypeError as exc:
        raise UsageError.of(COMMAND, f"--collectives: {exc}") from None
    seen: dict[str, str] = {}
    for name in collectives:  # an option's value: a usage error, before any work
        try:
            key = config_collective(name)
        except UnknownNameError as exc:
            raise UsageError.of(COMMAND, f"--collectives: {exc}") from None
        if key in seen:  # it would be tuned, and its rules written, twice
            raise UsageError.of(COMMAND, f"--collectives: {name!r} names the same collective as "
                                         f"{seen[key]!r}; give each once")
        seen[key] = name
    topology = resolve_topology(args.topology, nodes=args.nodes)
    from collsynth.timing.pricing import require_communication
    require_communication(topology, "tune-runtime")
    facts = machine_facts(topology)
    if facts.runtime is None:
        raise InvalidTopologyError(f"topology {topology.name!r}: no NVIDIA or AMD GPU "
                                   "architecture is known for it (metadata.machine.arch); "
                                   "tune-runtime needs the machine NCCL or RCCL runs on")
    if facts.runtime != args.runtime:
        raise UsageError.of(COMMAND, f"--runtime {args.runtime}: {topology.name} has "
                                     f"{facts.arch} GPUs, which run {facts.runtime}")
    settings, settings_from = job_settings(runtime_settings(args.env, COMMAND), loaded,
                                           args.calibration)
    setup = tuning_setup(topology, runtime=args.runtime, settings=settings)
    sizes = _sizes(args.sizes)
    price = ProgramModelPrice(topology, constants=constants,
                              source=args.calibration or "")
    # A rack of many ranks prices for minutes (GB200 NVL72: over 5): a heartbeat on stderr,
    # as time and calibrate give, so that the run does not look hung.
    doing = (f"tune-runtime: pricing {', '.join(collectives)} on {topology.name} "
             f"({topology.num_ranks} ranks, {len(sizes)} sizes)")
    with heartbeat(None if args.quiet or args.json else progress_line, PROGRESS_INTERVAL_S,
                   doing):
        tuned = tune_machine(setup, collectives, sizes, price=price, threshold=args.threshold)
    write_tuner_config(tuned.rules, args.output, runtime=args.runtime,
                       header=tuned.summary_lines(topology.name))
    name = {"nccl": "NCCL", "rccl": "RCCL"}[args.runtime]
    version = ".".join(map(str, setup.version))
    if args.json:
        out(json.dumps({
            "output": args.output, "runtime": args.runtime, "model_version": version,
            "settings": list(settings.text),
            "prices": tuned.prices,
            "topology": topology.name, "nodes": setup.nodes, "ranks": setup.ranks,
            "threshold": tuned.threshold, "sizes": sizes,
            "rules": [format_rule(rule) for rule in tuned.rules],
            "collectives": [{"collective": c.collective, "requested": c.requested,
                             "exact": c.tuning.exact,
                             "ranges": [r.as_dict() for r in c.tuning.ranges],
                             "rules": [format_rule(rule) for rule in c.rules]}
                            for c in tuned.collectives]}, indent=1))
        return EXIT_OK
    out(f"{topology.name} ({setup.nodes} node(s), {setup.ranks} ranks), {name} {version}: "
        f"{tuned.prices}; predicted times in us, not measurements; a rule where the gain is "
        f"over {tuned.threshold:.0%}")
    if settings.text:
        out(f"under {settings.describe()} ({settings_from}): no rule names a pair they disable "
            "(the runtime ignores a tuner's pick of one), and its own choice is narrowed the "
            "same way")
    headers = ("bytes", "written", "samples", "predicted us", f"{name}'s own", "its us", "gain")
    for c in tuned.collectives:
        if not c.requested:
            continue
        out("")
        out(f"{c.collective}:")
        for line in table(headers, _range_rows(c, args.runtime), left=(0, 1, 4)):
            out("  " + line)
    gains = sum(len(c.tuning.gains) for c in tuned.collectives)
    out("")
    if not gains:
        out(f"no range is predicted more than {tuned.threshold:.0%} faster than {name}'s own "
            "choice" + (": the file holds no rule" if args.runtime == "rccl" else ""))
    if args.runtime == "nccl":
        others = [c.collective for c in tuned.collectives if not c.requested]
        skipped = [c for c in COLLECTIVES if c not in {t.collective for t in tuned.collectives}]
        out(f"note: NCCL's example plugin runs any call that no row matches on ONE channel, so "
            f"the file pins NCCL's own choice (as predicted) everywhere else, for "
            f"{', '.join(others) + ' too' if others else 'every collective it covers'}; rows "
            f"match nNodes={setup.nodes} nRanks={setup.ranks} only: a communicator of another size "
            "(a process subgroup) gets one channel")
        if skipped:
            out(f"note: no row for {', '.join(skipped)}: {settings.describe()} leaves "
                f"{'it' if len(skipped) == 1 else 'them'} no algorithm, and NCCL fails such "
                "calls")
    out(f"wrote {shown_path(args.output)} ({len(tuned.rules)} rule(s))")
    return EXIT_OK
