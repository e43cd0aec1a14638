"""``collsynth calibrate``: fit a model to measurements and save a calibration file.

``--model curve`` (default): each log (:mod:`collsynth.timing.logs`) is fitted with the
alpha-beta line and the piecewise bus-bandwidth curve (:mod:`collsynth.timing.fit`), for the
closed form. ``--model program``: the program model's constants are fitted so that the runtime's
own ring reproduces one measured curve (:func:`collsynth.timing.runtime_fit.fit_runtime`). Both
write one calibration file format (:mod:`collsynth.timing.calibration`, its ``kind`` says which)
that ``collsynth time --calibration`` and ``collsynth plan --calibration`` read. The output
fields: docs/cli.md.
"""

from __future__ import annotations

import argparse
import io
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from collsynth._parse import clean_name
from collsynth.cli.common import (EXIT_ERROR, EXIT_OK, EXIT_TIMEOUT, PROGRESS_INTERVAL_S,
                                  UsageError, add_figure_arguments, add_settings_argument,
                                  channel_count, check_gpus_per_thread, each_file_once,
                                  gpus_per_thread,
                                  node_count, out, path_argument, positive_int, progress_line,
                                  runtime_settings, seconds, table)
from collsynth.timing.calibration import (
    calibration_from_fits,
    calibration_to_json,
    save_calibration,
)
from collsynth.errors import FileFormatError, UnknownNameError, shown_path
from collsynth.progress import heartbeat
from collsynth.timing.fit import (BUSBW_PER_LINK_GBPS, FIGURE_FORMATS, MAX_BUSBW_GBPS, LogFits,
                                  check_plausible, fit_log, plot_fits, save_figure)
from collsynth.timing.logs import LOGGED_COLLECTIVES, canonical_collective, load_log

if TYPE_CHECKING:
    from collsynth.topology.model import Topology

__all__ = ["register", "run_calibrate", "MODELS"]

#: Values of ``--model``: what the calibration is for.
MODELS = ("curve", "program")


def _plot_path(text: str) -> str:
    if Path(text).suffix.lower() not in FIGURE_FORMATS:
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected a file ending in {' or '.join(FIGURE_FORMATS)}")
    return text


def _log_ranks(text: str) -> int:
    """A rank count a log was measured on: a whole number from 2 (a collective on one rank
    moves nothing, and a calibration's fit is applied to topologies of its rank count) to the
    most ranks a topology has (:data:`~collsynth.topology.model.MAX_RANKS`)."""
    from collsynth.topology.model import MAX_RANKS

    value = positive_int(text)
    if value == 1:
        raise argparse.ArgumentTypeError("1 rank: a collective on one rank moves nothing, and a "
                                         "fit applies to topologies of its rank count; expected "
                                         "2 or more")
    if value > MAX_RANKS:
        raise argparse.ArgumentTypeError(f"{value} ranks: more than the {MAX_RANKS} "
                                         "collsynth accepts")
    return value


def _collective(text: str) -> str:
    """A collective a benchmark log measures, in collsynth's name (``all_reduce`` is
    ``allreduce``); others are usage errors listing the valid names."""
    name = canonical_collective(text)
    if name not in LOGGED_COLLECTIVES:
        raise argparse.ArgumentTypeError(f"unknown collective {text!r}; expected one of "
                                         f"{', '.join(LOGGED_COLLECTIVES)}")
    return name


def register(subparsers: Any) -> None:
    """Add ``calibrate`` to ``subparsers`` (from ``add_subparsers``)."""
    parser = subparsers.add_parser(
        "calibrate", help="fit a model to nccl-tests / PARAM logs or a measured curve",
        description="--model curve (default): fit an alpha-beta line and a piecewise "
                    "bus-bandwidth curve to each benchmark log (nccl-tests text or JSON output, "
                    "PARAM comms output, a CSV with size_bytes,time_us columns). --model "
                    "program: fit the program model's constants (base latency, hop latency "
                    "scale, per-connection throughput per protocol) so that the runtime's own "
                    "ring on --topology reproduces one measured curve (CSV with size_bytes and "
                    "time_us columns), printing the in-sample and held-out GMAE. Either way the "
                    "result is saved as a calibration file.")
    parser.add_argument("logs", nargs="+", metavar="LOG",
                        help="benchmark log files (--model program: one measured curve)")
    parser.add_argument("--model", choices=MODELS, default="curve",
                        help="curve: the closed form's measured figures and lines (default); "
                             "program: the program model's runtime constants")
    parser.add_argument("--topology", required=True, metavar="NAME",
                        help="the machine the logs were measured on (recorded in the file; "
                             "--model program: a topology the runtime's ring is simulated on)")
    parser.add_argument("--nodes", type=node_count, default=1, metavar="K",
                        help="the logs were measured on K such machines (recorded; default 1)")
    parser.add_argument("-o", "--output", type=path_argument, required=True, metavar="FILE",
                        help="calibration file to write (JSON)")
    parser.add_argument("--plot", type=_plot_path, metavar="PATH",
                        help="also draw measured vs fitted, one row per log (.png or .svg)")
    parser.add_argument("--collective", type=_collective, metavar="NAME",
                        help="the collective of logs that do not say (e.g. allreduce; any "
                             "spelling of: " + ", ".join(LOGGED_COLLECTIVES) + "; --model "
                             "program: allgather, reduce_scatter, allreduce, broadcast or "
                             "reduce, default allgather)")
    parser.add_argument("--ranks", type=_log_ranks, metavar="N",
                        help="the rank count of logs that do not say")
    parser.add_argument("--runtime", metavar="NAME",
                        help="the runtime the logs were measured with, and its version if known "
                             "(rccl, nccl-2.18.3), for logs that do not say (--model program: "
                             "one of " + ", ".join(_program_runtimes()) + "; default: the one "
                             "the log's banner names, else nccl on NVIDIA GPUs and rccl "
                             "otherwise)")
    parser.add_argument("--channels", type=channel_count, metavar="N",
                        help="the runtime's channel count in the logs, for logs that do not say "
                             "(--model program: default every ring found)")
    parser.add_argument("--gpus-per-thread", type=gpus_per_thread, metavar="G",
                        help="--model program: GPUs each thread of the measured run drove "
                             "(nccl-tests' -g; default: the log's nGpus, else 1)")
    add_settings_argument(parser, "--model program: the measured runtime's own choices are "
                                  "narrowed by them while fitting")
    parser.add_argument("--strict", action="store_true",
                        help="--model program: exit 1 when the calibration warns (in-sample or "
                             "held-out GMAE above 10%%, a constant at a bound of its plausible "
                             "range); the file is still written")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument("--time-limit", type=seconds, metavar="SECONDS",
                        help="--model program: seconds the fit may search (default: none); at "
                             "the limit it keeps the best constants found so far, without a "
                             "held-out GMAE, and warns")
    parser.add_argument("-q", "--quiet", action="store_true",
                        help="no progress lines on stderr (a --model program fit that runs "
                             "over 5 s says what it fits every 5 s)")
    add_figure_arguments(parser)
    parser.set_defaults(handler=run_calibrate)


def _program_runtimes() -> tuple[str, ...]:
    from collsynth.cli.time import PRICED_RUNTIMES

    return PRICED_RUNTIMES


def run_calibrate(args: argparse.Namespace) -> int:
    """Handle ``collsynth calibrate``: read and fit every log, then write the file(s).

    Errors propagate to ``main``; nothing is written unless every log was read and fitted.
    """
    from collsynth._files import check_input_file
    from collsynth._output import check_output_file, write_bytes_atomic

    each_file_once(args.logs, "calibrate")  # one log read twice is two entries of one fit
    if args.model == "program":
        return _calibrate_program(args)
    if args.strict or args.time_limit is not None or args.env:
        flag = "--strict" if args.strict else "--time-limit" if args.time_limit is not None \
            else "--env"
        raise UsageError.of("calibrate", f"{flag} goes with --model program")
    for flag, value in (("--unit-gbps", args.unit_gbps), ("--alpha-us", args.alpha_us)):
        if value is not None:
            raise UsageError.of("calibrate", f"{flag} goes with --model program (the topology "
                                             "the runtime's ring is simulated on)")
    try:  # curve mode records the name as given: one its own reader takes
        clean_name(args.topology, "--topology", source="")
    except FileFormatError as exc:
        raise UsageError.of("calibrate", exc.detail) from None
    check_output_file(args.output, label=f"-o {shown_path(args.output)}",
                      inputs=args.logs)  # before reading any log
    if args.plot:
        check_output_file(args.plot, label=f"--plot {shown_path(args.plot)}", inputs=args.logs,
                          outputs=[(f"-o {shown_path(args.output)}", args.output)])
    for path in args.logs:  # every log a regular file, before fitting the first
        check_input_file(path)
    ceiling, machine = _busbw_ceiling(args.topology, args.nodes)
    results: list[LogFits] = []
    for path in args.logs:
        log = load_log(path, collective=args.collective, ranks=args.ranks,
                       runtime=args.runtime, channels=args.channels)
        if log.ranks < 2:  # its entry would be refused by the calibration's own reader
            raise FileFormatError(path, f"{log.collective} on 1 rank (as the log says, or as "
                                        "read where it does not say): a fit applies to "
                                        "topologies of its rank count, 2 or more; give a log of "
                                        "several ranks, or --ranks N where it does not say")
        results.append(fit_log(log))
        check_plausible(results[-1], ceiling, machine)
    calibration = calibration_from_fits(args.topology, results, nodes=args.nodes)
    figure_bytes = None
    if args.plot:
        buffer = io.BytesIO()
        save_figure(plot_fits(results), buffer, format=Path(args.plot).suffix.lstrip("."))
        figure_bytes = buffer.getvalue()
    save_calibration(calibration, args.output)
    if figure_bytes is not None:
        write_bytes_atomic(args.plot, figure_bytes, label=f"--plot {shown_path(args.plot)}")
    entries = calibration_to_json(calibration)["entries"]
    if args.json:
        out(json.dumps(entries, indent=1))
        return EXIT_OK
    for line in _summary_lines(entries):
        out(line)
    for item in results:  # the piecewise curve is what pricing uses; a line may miss more
        if item.piecewise.gmae > CURVE_WARN_GMAE:
            out(f"warning: {item.log.path}: the piecewise fit misses the log by "
                f"{item.piecewise.gmae:.0%} (GMAE): are runs of different machines or settings "
                "mixed in it?")
    written = f"wrote {shown_path(args.output)}" + (f" and {shown_path(args.plot)}" if args.plot
                                                      else "")
    machine = args.topology + (f" x {args.nodes} nodes" if args.nodes > 1 else "")
    out(f"{written} (calibration for {machine!r}, {len(results)} log"
        f"{'s' if len(results) != 1 else ''})")
    return EXIT_OK


#: The piecewise fit's in-sample GMAE above which ``calibrate`` warns (public logs: 2-4%).
CURVE_WARN_GMAE = 0.10


def _busbw_ceiling(topology: str, nodes: int) -> tuple[float, str]:
    """The most bus bandwidth (GB/s) a GPU of ``topology`` can carry, and why; a
    name collsynth does not know (curve mode only records it) gets :data:`MAX_BUSBW_GBPS`."""
    from collsynth.resolve import resolve_topology
    from collsynth.timing.tuning_model import gpu_bandwidth_gbps
    from collsynth.topology.machine import machine_facts

    try:
        resolved = resolve_topology(topology, nodes=nodes if nodes > 1 else None)
    except (UnknownNameError, FileFormatError):
        return MAX_BUSBW_GBPS, "any GPU of 2026 can carry: NVLink 5 with in-switch reduction"
    total, _ = gpu_bandwidth_gbps(resolved, machine_facts(resolved))
    ceiling = min(MAX_BUSBW_GBPS, BUSBW_PER_LINK_GBPS * total) if total > 0 else MAX_BUSBW_GBPS
    return ceiling, (f"a GPU of {topology!r} can carry: {total:.4g} GB/s of links "
                     f"x{BUSBW_PER_LINK_GBPS:g}")


#: The runtime a log that does not name one was measured with, by the GPUs' maker.
_VENDOR_RUNTIME = {"nvidia": "nccl", "amd": "rccl"}


def _calibrate_program(args: argparse.Namespace) -> int:
    """``--model program``: fit a runtime's constants to its measured ring, print the in-sample
    and held-out GMAE and write them as a runtime-constants calibration."""
    from collsynth._files import check_input_file
    from collsynth._output import check_output_file
    from collsynth.resolve import resolve_topology
    from collsynth.timing.calibration import RuntimeCalibration
    from collsynth.timing.runtime_baselines import RING_COLLECTIVES
    from collsynth.timing.runtime_fit import fit_runtime, read_curve
    from collsynth.timing.runtime_model import MAX_GPUS_PER_THREAD
    from collsynth.topology.machine import machine_facts

    from collsynth.runtimes import parse_given_version, parse_version
    from collsynth.timing.logs import split_runtime

    try:
        runtime, given_version = (split_runtime(args.runtime) if args.runtime is not None
                                  else (None, None))
    except ValueError as exc:
        raise UsageError.of("calibrate", f"--runtime: {exc}") from None
    if runtime is not None and runtime not in _program_runtimes():
        raise UsageError.of("calibrate", f"--runtime {runtime}: --model program fits one of "
                                         f"{', '.join(_program_runtimes())}")
    collective = args.collective or "allgather"
    if collective not in RING_COLLECTIVES:
        raise UsageError.of("calibrate", f"--collective {collective}: --model program fits the "
                                         f"runtime's ring of {', '.join(RING_COLLECTIVES)}")
    for flag, value in (("--plot", args.plot), ("--ranks", args.ranks)):
        if value is not None:
            raise UsageError.of("calibrate", f"{flag} goes with --model curve")
    if args.time_limit is not None and args.channels is not None:
        raise UsageError.of("calibrate", "--time-limit bounds the fit of the runtime's own "
                                         "choices; --channels fits a ring of its own, in seconds")
    if len(args.logs) != 1:
        raise UsageError.of("calibrate", f"--model program fits one measured curve; "
                                         f"{len(args.logs)} files given")
    settings = runtime_settings(args.env, "calibrate")
    check_output_file(args.output, label=f"-o {shown_path(args.output)}", inputs=args.logs)
    check_input_file(args.logs[0])
    topology = resolve_topology(args.topology, nodes=args.nodes if args.nodes > 1 else None,
                                unit_gbps=args.unit_gbps, alpha_us=args.alpha_us)
    from collsynth.timing.pricing import require_communication
    require_communication(topology, "calibrate --model program")
    rows, logged, drove, logged_runtime, logged_version = _curve_rows(
        args.logs[0], args.collective, on=topology)
    from collsynth.timing.runtime_fit import MIN_CURVE_SIZES

    if len(rows) < MIN_CURVE_SIZES:  # the fit's own refusal would not name the file
        raise FileFormatError(args.logs[0], f"{len(rows)} measured size(s); a runtime "
                                            f"calibration needs at least {MIN_CURVE_SIZES}")
    if args.collective is None and logged is not None and logged not in RING_COLLECTIVES:
        raise FileFormatError(args.logs[0], f"measures {logged}; --model program fits the "
                                            f"runtime's ring of {', '.join(RING_COLLECTIVES)}")
    if runtime is None:  # the log's banner ("NCCL version 2.18.5"), else the GPUs' maker's
        runtime = logged_runtime if logged_runtime in _program_runtimes() else \
            _VENDOR_RUNTIME.get(machine_facts(topology).vendor or "", "rccl")
    if runtime != logged_runtime:
        logged_version = None  # another runtime's version says nothing of this one
    version_text = given_version or logged_version
    try:  # the measured runtime's version: its own choices at that version are fitted
        version = None if not version_text else \
            parse_given_version(version_text) if given_version else parse_version(version_text)
    except ValueError as exc:
        where = "--runtime" if given_version else f"{args.logs[0]}: the runtime's banner"
        raise UsageError.of("calibrate", f"{where}: {exc}") from None
    if args.collective is None and logged is not None:
        collective = logged
    gpus = args.gpus_per_thread or drove or 1
    if gpus > MAX_GPUS_PER_THREAD:
        raise UsageError.of("calibrate", f"{args.logs[0]}: {gpus} GPUs per thread; expected at "
                                         f"most {MAX_GPUS_PER_THREAD}")
    check_gpus_per_thread(gpus, topology, "calibrate")
    # A machine of many ranks simulates for minutes (GB200 NVL72, 72 ranks: about 5 min).
    doing = (f"calibrate: fitting {runtime}'s constants to {args.logs[0]} on {topology.name} "
             f"({len(rows)} sizes)")
    with heartbeat(None if args.quiet or args.json else progress_line, PROGRESS_INTERVAL_S,
                   doing):
        fit = fit_runtime(rows, topology, collective, runtime=runtime, channels=args.channels,
                          gpus_per_thread=gpus, version=version, time_limit_s=args.time_limit,
                          settings=settings)
    save_calibration(RuntimeCalibration(fit.constants, runtime_version=version,
                                        settings=settings.text), args.output)
    summary = {"output": args.output, "runtime": runtime,
               "runtime_version": None if version is None else "%d.%d" % version,
               "topology": topology.name,
               "channels": len(fit.rings), "parameters": fit.parameters, "gmae": fit.gmae,
               "held_out_gmae": fit.held_out_gmae, "gpus_per_thread": gpus,
               "settings": list(settings.text),
               "rows": [{"size_bytes": s, "time_us": m, "predicted_us": p, "protocol": q}
                        for s, m, p, q in zip(fit.sizes, fit.measured_us, fit.predicted_us,
                                              fit.protocols)]}
    summary["report"] = [c.as_dict() for c in fit.report]
    summary["warnings"] = list(fit.warnings)
    if fit.algorithms:
        summary["channels"] = None
        for row, ran in zip(summary["rows"], fit.algorithms):
            row["ran"] = ran
    # Ctrl-C during the fit: the best constants found are written, and the exit says the
    # search was interrupted (as solve's does).
    code = EXIT_TIMEOUT if fit.interrupted else \
        EXIT_ERROR if args.strict and fit.warnings else EXIT_OK
    if args.json:
        out(json.dumps(summary, indent=1))
        return code
    held = "n/a" if fit.held_out_gmae is None else f"{fit.held_out_gmae:.1%}"
    how = ("each size as the runtime runs it (its own algorithm, protocol and channels)"
           if fit.algorithms else f"{len(fit.rings)} channel(s)")
    at = "" if version is None else f" {version[0]}.{version[1]}"
    out(f"{runtime}{at} {collective} on {topology.name}, {how}: "
        f"GMAE {fit.gmae:.1%} in-sample, {held} held out (fit on every other size)")
    if settings.text:
        out(f"fitted under {settings.describe()}: the runtime's own choices narrowed as those "
            "variables narrow them; the calibration records them, and time, plan and "
            "tune-runtime price under them unless --env says otherwise")
    if gpus > 1:
        out(f"one thread drove {gpus} GPUs in the measured run: the host's work per call and "
            "per channel is fitted per GPU (price a process per GPU with 'collsynth time', "
            f"or this run's launch with --gpus-per-thread {gpus})")
    if fit.report:
        for line in table(("constant", "value", "plausible from", "to", "at bound"),
                          [(c.name, f"{c.value:.4g}", f"{c.low:.4g}", f"{c.high:.4g}",
                            "yes" if c.at_bound else "") for c in fit.report],
                          left=(0,), separator="  ", rule=False):
            out(line)
    else:
        out("  " + ", ".join(f"{k} = {v:.4g}" for k, v in fit.parameters.items()))
    for warning in fit.warnings:
        out(f"warning: {warning}")
    out(f"wrote {shown_path(args.output)}")
    return code


def _curve_rows(path: str, collective: str | None, *, on: "Topology | None" = None
                ) -> tuple[list[tuple[int, float]], str | None, int | None, str | None,
                           str | None]:
    """The measured ``(size_bytes, time_us)`` of a CSV with those columns, or of a benchmark
    log (its out-of-place rows, in-place where it has none; times of one size averaged), the
    collective the file names (a CSV: its ``collective`` column), the GPUs each of its threads
    drove, and the runtime and its version its banner states (``None`` for a CSV or a log that
    does not say). A file that names another collective than ``collective`` (``--collective``)
    or measures another rank count than the machine ``on`` has is refused: its constants would
    be fitted to the wrong traffic."""
    from collsynth.timing.runtime_fit import read_curve_columns

    try:
        rows, said, ranks = read_curve_columns(path)
    except FileFormatError as csv_error:
        try:
            log = load_log(path, collective=collective)
        except FileFormatError as log_error:
            # the reader of what the file is says what is wrong with it (a log's bad row,
            # not that it has no size_bytes column)
            raise (csv_error if str(path).lower().endswith(".csv") else log_error) from None
    else:
        if collective is not None and said is not None and \
                said != canonical_collective(collective):
            raise FileFormatError(path, f"its collective column says {said}, not "
                                        f"{canonical_collective(collective)} (--collective)")
        _check_ranks(path, ranks, on)
        return rows, said, None, None, None
    _check_ranks(path, log.ranks, on)
    rows = [r for r in log.rows if not r.in_place] or list(log.rows)
    by_size: dict[int, list[float]] = {}
    for r in rows:
        by_size.setdefault(r.size_bytes, []).append(r.time_us)
    return (sorted((s, sum(t) / len(t)) for s, t in by_size.items()), log.collective,
            log.gpus_per_thread, log.runtime, log.runtime_version)


def _check_ranks(path: str, ranks: int | None, on: "Topology | None") -> None:
    """Refuse a measurement of ``ranks`` ranks fitted on a machine of another rank count."""
    if on is not None and ranks is not None and ranks != on.num_ranks:
        raise FileFormatError(path, f"measured on {ranks} ranks, but {on.name} has "
                                    f"{on.num_ranks}; fit it on the machine it was measured on "
                                    "(--topology, --nodes)")


def _summary_lines(entries: list[dict[str, Any]]) -> list[str]:
    headers = ("file", "collective", "ranks", "runtime", "channels", "model", "alpha_us",
               "busbw_gbps", "knee_bytes", "saturation_bytes", "gmae", "heldout")
    rows = []
    for e in entries:
        runtime = " ".join(e[k] for k in ("runtime", "runtime_version") if k in e) or "-"
        heldout = f"{100 * e['gmae_heldout']:.1f}%" if "gmae_heldout" in e else "-"
        rows.append((
            Path(e["file"]).name, e["collective"], str(e["ranks"]), runtime,
            str(e.get("channels", "-")), e["model"],
            f"{e['alpha_us']:.2f}", f"{e['busbw_gbps']:.1f}",
            str(e.get("knee_bytes", "-")), str(e.get("saturation_bytes", "-")),
            f"{100 * e['gmae']:.1f}%", heldout,
        ))
    return table(headers, rows, left=(0, 1, 3, 5), separator="  ", rule=False)
