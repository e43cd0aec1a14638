"""``collsynth plan``: plan a traced training job's collectives and write the runtime's files.

For each (collective, process group, size) of the trace the fastest of the synthesized
algorithms and the runtime's own is chosen on one yardstick (the program model where it applies,
else the closed form: docs/plan.md, "Pricing"); the plan directory is written all or nothing. What it holds, and Ctrl-C: docs/cli.md.
"""

from __future__ import annotations

import argparse
import json
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

from collsynth.cli.common import (EXIT_OK, PROGRESS_INTERVAL_S, Interrupted, UsageError,
                                  add_fabric_arguments, add_figure_arguments,
                                  add_settings_argument, comma_entries, check_fabric_arguments,
                                  job_settings, node_count, out, path_argument, positive_int,
                                  progress_line, runtime_settings, seconds)
from collsynth.errors import shown_path
from collsynth.progress import heartbeat

if TYPE_CHECKING:  # pragma: no cover - for annotations only
    from collsynth.runtimes.settings import RuntimeSettings

__all__ = ["register", "run_plan", "DEFAULT_SYNTH_TIME_LIMIT"]

#: Seconds of synthesis per (collective, group) problem by default.
DEFAULT_SYNTH_TIME_LIMIT = 30.0


def register(subparsers: Any) -> None:
    """Add ``plan`` to ``subparsers`` (from ``add_subparsers``)."""
    from collsynth.runtimes import MSCCL_XML, runtime_names

    parser = subparsers.add_parser(
        "plan", help="choose an algorithm per traced collective and write the runtime's files",
        description="Plan a trace: for each (collective, group, size) pick the fastest of the "
                    "synthesized algorithms and the runtime's own, both priced by the program "
                    "model where it applies (else the closed form), and write the "
                    "XML files (checked), plan.json, report.md and plots into PLAN_DIR.")
    parser.add_argument("trace_dir", type=path_argument, metavar="TRACE_DIR",
                        help="trace directory (rank-00000.jsonl, rank-00001.jsonl, ...)")
    parser.add_argument("--topology", required=True, metavar="NAME",
                        help="the machine: a built-in name (dgx1, ...), a family member "
                             "(ring:8) or a topology file")
    parser.add_argument("--nodes", type=node_count, metavar="K",
                        help="K copies of the topology joined by their NICs")
    parser.add_argument("--nic-units", type=positive_int, metavar="U",
                        help="with --nodes: NIC bandwidth in the topology's units (for "
                             "topologies whose file does not describe their NICs)")
    add_fabric_arguments(parser)
    add_figure_arguments(parser)
    parser.add_argument("--calibration", type=path_argument, metavar="FILE",
                        help="calibration file: a runtime-constants one (collsynth calibrate "
                             "--model program) prices both sides with the program model; a "
                             "collsynth calibrate file gives measured per-step alpha and GB/s")
    parser.add_argument("--model", choices=("auto", "closed-form"), default="auto",
                        help="auto (default): the program model (simulated runtime) where it "
                             "applies, else the closed form; closed-form: always the closed form")
    parser.add_argument("--device", metavar="NAME",
                        help="charge synthesized combining algorithms this GPU's reduction cost")
    parser.add_argument("-o", "--output", type=path_argument, required=True,
                        metavar="PLAN_DIR",
                        help="directory to write (replaced if it holds an older plan)")
    parser.add_argument("--runtime", default="msccl-executor", metavar="LIST",
                        help="the runtimes to deploy for, comma-separated: at most one of "
                             f"{', '.join(runtime_names(MSCCL_XML))} (the XML files are for it; "
                             "default msccl-executor); nccl and rccl-tuner: a tuner config for "
                             "the traced sizes; mscclpp: MSCCL++ plans of the chosen algorithms "
                             "(docs/plan.md)")
    add_settings_argument(parser, "the runtime's own algorithms a program is compared with, "
                                  "and a tuner config, are narrowed by them")
    parser.add_argument("--synth-time-limit", type=seconds, default=DEFAULT_SYNTH_TIME_LIMIT,
                        metavar="SECONDS",
                        help="synthesis time per (collective, group) problem "
                             f"(default {DEFAULT_SYNTH_TIME_LIMIT:g})")
    parser.add_argument("--max-group-ranks", type=positive_int, default=16, metavar="N",
                        help="largest group synthesized with the Pareto sweep (default 16); "
                             "larger ones use the bandwidth-optimal engine when installed")
    parser.add_argument("--backend", choices=("auto", "cpsat", "z3"), default="auto",
                        help="solver backend (default auto)")
    cache = parser.add_mutually_exclusive_group()
    cache.add_argument("--cache", type=path_argument, metavar="DIR",
                       help="where synthesized fronts are kept (default ~/.cache/collsynth)")
    cache.add_argument("--no-cache", action="store_true", help="keep nothing between runs")
    parser.add_argument("--all-ranges", action="store_true",
                        help="also export ranges no traced call falls into")
    parser.add_argument("--json", action="store_true",
                        help="print plan.json's totals and files as JSON on stdout")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    parser.set_defaults(handler=run_plan)


def _runtimes(text: str) -> tuple[str, tuple[str, ...], bool]:
    """``--runtime LIST``: the XML runtime (default msccl-executor) and the runtimes that get a
    tuner config, and whether MSCCL++ plans are asked for, by the registry's names and
    artifacts: a name deploys the runtime's first artifact (rccl: XML, nccl: its tuner config,
    mscclpp: execution plans), ``NAME-tuner`` its tuner config."""
    from collsynth.errors import CollsynthError
    from collsynth.runtimes import (MSCCL_XML, MSCCLPP_PLAN, TUNER_CONFIG, get_runtime,
                                    runtime_names)

    mscclpp = False
    try:
        names = [n.lower() for n in comma_entries(text, "runtime names")]
    except argparse.ArgumentTypeError as exc:
        raise UsageError.of("plan", f"--runtime: {exc}") from None
    xml, tuners = [], []
    for name in names:
        base = name[:-len("-tuner")] if name.endswith("-tuner") else name
        try:
            runtime = get_runtime(base)
        except CollsynthError as exc:  # the registry's names, and the NAME-tuner spellings
            tuned = [f"{n}-tuner" for n in runtime_names(TUNER_CONFIG)]
            raise UsageError.of("plan", f"--runtime: {exc} (or {', '.join(tuned)}: a tuner "
                                        "config only)") from None
        kind = TUNER_CONFIG if name != base else \
            (runtime.artifacts[0].kind if runtime.artifacts else None)
        if kind == MSCCL_XML and runtime.loads(MSCCL_XML):
            xml.append(runtime.name)
        elif kind == TUNER_CONFIG and runtime.loads(TUNER_CONFIG):
            tuners.append(runtime.name)
        elif kind == MSCCLPP_PLAN:
            mscclpp = True
        elif name != base:
            raise UsageError.of("plan", f"--runtime {name}: {runtime.name} loads no tuner config")
        else:
            raise UsageError.of("plan", f"--runtime {name}: not deployed by plan yet (export "
                                        f"--runtime {name} writes its files; docs/plan.md)")
    if len(set(xml)) > 1:
        raise UsageError.of("plan", f"--runtime {text}: at most one runtime that loads MSCCL XML "
                                    f"(got {', '.join(sorted(set(xml)))}): the XML files are "
                                    "lowered for it")
    return (xml[0] if xml else "msccl-executor"), tuple(dict.fromkeys(tuners)), mscclpp


def _cache_folder(args: argparse.Namespace) -> "Path | None":
    """The cache's folder, checked once before planning: ``--cache DIR`` that cannot hold it
    is refused; the default one that cannot is one warning and no cache (a cache is an
    optimisation; each entry's write would otherwise warn on its own)."""
    from collsynth.errors import InputWarning, OutputPathError
    from collsynth.plan.cache import check_cache_directory, default_cache_directory

    if args.cache:
        return check_cache_directory(args.cache, f"--cache {shown_path(args.cache)}")
    folder = default_cache_directory()
    try:
        return check_cache_directory(folder, f"the cache {folder}")
    except OutputPathError as exc:
        warnings.warn(f"{exc}; planning without a cache (give --cache DIR, or --no-cache)",
                      InputWarning, stacklevel=2)
        return None


def _check_constants_family(path: str, runtime: str, deployed: tuple[str, ...]) -> None:
    """Refuse a runtime-constants calibration of another family than a runtime the plan is
    priced for (RCCL's constants for msccl-executor, which runs NCCL's kernels), before any
    planning: the tuner's check came after the synthesis, the XML runtime's came nowhere."""
    from collsynth.runtimes import runtime_family

    family = runtime_family(runtime)
    for name in deployed:
        if family is not None and runtime_family(name) not in (None, family):
            raise UsageError.of("plan", f"--calibration {path}: its constants are {runtime}'s, "
                                        f"but --runtime {name} runs {runtime_family(name)}'s "
                                        "kernels; calibrate with logs of that runtime")


def _check_plan_settings(settings: "RuntimeSettings", where: str, xml_runtime: str) -> None:
    """Refuse the job's settings (from ``where``: ``--env`` or a calibration) where the plan's
    own files could not run under them: its XML programs run Simple, and msccl needs NCCL_ALGO
    to list MSCCL, which the plan's environment sets (replacing the job's list)."""
    if settings.protocols is not None and "Simple" not in settings.protocols:
        raise UsageError.of("plan", f"{where}: {settings.describe()}: the plan's programs run "
                                    "the Simple protocol, which it disables")
    if settings.algorithms is not None and xml_runtime == "msccl":
        raise UsageError.of("plan", f"{where}: NCCL_ALGO with msccl: msccl runs the plan's "
                                    "programs only where NCCL_ALGO lists MSCCL, and the plan's "
                                    "environment sets it (MSCCL,RING,TREE), replacing the "
                                    "job's list; plan without it, or for msccl-executor")


def run_plan(args: argparse.Namespace) -> int:
    """Handle ``collsynth plan``: return 0 when the plan was written (errors raise)."""
    from collsynth.plan import (
        FrontCache,
        PlanOptions,
        SynthOptions,
        default_cache_directory,
        make_plan,
        plan_to_json,
        write_plan,
    )
    from collsynth.resolve import resolve_topology

    xml_runtime, tuners, mscclpp = _runtimes(args.runtime)
    settings = runtime_settings(args.env, "plan")
    _check_plan_settings(settings, "--env", xml_runtime)
    if args.max_group_ranks < 2:
        raise UsageError.of("plan", f"--max-group-ranks {args.max_group_ranks}: expected at "
                                    "least 2")
    progress = None if args.quiet or args.json else progress_line
    cache = None
    try:
        from collsynth.plan.writer import check_plan_directory

        target = check_plan_directory(args.output)  # before any planning
        if not args.no_cache:
            folder = Path(args.cache) if args.cache else default_cache_directory()
            if folder.resolve().is_relative_to(target.resolve()):
                label = f"--cache {shown_path(args.cache)}" if args.cache else f"the cache {folder}"
                raise UsageError.of("plan", f"{label} is in -o {args.output}, which the plan "
                                            "replaces; keep the cache elsewhere")
        check_fabric_arguments(args)
        topology = resolve_topology(args.topology, nodes=args.nodes, nic_units=args.nic_units,
                                    oversubscription=args.oversubscription, fabric=args.fabric,
                                    nodes_per_leaf=args.nodes_per_leaf,
                                    unit_gbps=args.unit_gbps, alpha_us=args.alpha_us)
        if tuners:  # the machine must run each tuned runtime: refused before any planning
            from collsynth.plan.deploy import check_tuner_machine

            for name in tuners:
                check_tuner_machine(topology, name)
        calibration = constants = version = None
        if args.calibration is not None:
            from collsynth.timing.calibration import RuntimeCalibration, load_calibration

            loaded = load_calibration(args.calibration)   # its kind says which model it feeds
            if isinstance(loaded, RuntimeCalibration):
                constants, version = loaded.constants, loaded.runtime_version
                _check_constants_family(args.calibration, constants.runtime,
                                        (xml_runtime, *tuners))
                settings, settings_from = job_settings(settings, loaded, args.calibration)
                _check_plan_settings(settings, settings_from or "--env", xml_runtime)
            else:
                calibration = loaded
        if calibration is None:
            from collsynth.timing.alphabeta import from_topology

            from_topology(topology)  # no figures (a family): fail now, naming the options
        if args.device is not None:
            from collsynth.timing.kernels import get_device

            get_device(args.device)  # an unknown name fails before any synthesis
        cache = FrontCache(None if args.no_cache else _cache_folder(args))
        options = PlanOptions(
            runtime=xml_runtime,
            synth=SynthOptions(time_limit=args.synth_time_limit,
                               max_group_ranks=args.max_group_ranks, backend=args.backend),
            calibration=calibration,
            calibration_file=args.calibration if calibration is not None else None,
            runtime_constants=constants,
            runtime_constants_file=args.calibration if constants is not None else None,
            runtime_version=version, runtime_settings=settings, model=args.model,
            device=args.device, cache=cache, all_ranges=args.all_ranges)
        # A heartbeat while a step runs long (pricing thousands of traced sizes is silent):
        # what the last progress line said, and for how long.
        doing = ["plan: reading the trace"]

        def said(line: str) -> None:
            doing[0] = f"plan: {line}"
            progress(line)
        with heartbeat(progress, PROGRESS_INTERVAL_S, lambda: doing[0]):
            plan = make_plan(args.trace_dir, topology, options=options, nodes=args.nodes,
                             progress=None if progress is None else said)
        deployments = []
        for name in tuners:
            from collsynth.plan.deploy import tuner_deployment
            from collsynth.runtimes import get_runtime, runtime_family

            if constants is not None and runtime_family(constants.runtime) != name:
                raise UsageError.of("plan", f"--calibration {args.calibration}: its constants "
                                            f"are {constants.runtime!r}'s, not {name}'s, which "
                                            "the tuner config is priced for")
            deployments.append(tuner_deployment(plan, topology,
                                                get_runtime(name).with_settings(settings),
                                                constants=constants,
                                                source=args.calibration or ""))
        if mscclpp:
            from collsynth.plan.deploy import mscclpp_deployments

            deployments.extend(mscclpp_deployments(plan))
        target = write_plan(plan, args.output, deployments=deployments)
    except KeyboardInterrupt as exc:  # main says so; here: what is kept for the next run
        kept = ("nothing was synthesized yet" if cache is None else
                "nothing is kept (no cache)" if cache.directory is None else
                f"the fronts synthesized so far are kept in the cache {cache.directory} for the "
                "next run")
        raise Interrupted(f"no plan written ({args.output} left as it was); {kept}") from exc
    totals = plan.totals()
    if args.json:
        obj = plan_to_json(plan)
        out(json.dumps({"plan_dir": str(target), "totals": obj["totals"],
                        "files": obj["files"]}, indent=1))
        return EXIT_OK
    saving = totals["saving_us"]
    share = f" ({100 * saving / totals['nccl_us']:.1f}%)" if totals["nccl_us"] else ""
    tuned = "".join(f", {d.path} for {d.runtime}" for d in deployments if d.runtime != "mscclpp")
    plans = sum(d.runtime == "mscclpp" for d in deployments)
    tuned += f", {plans} MSCCL++ plan(s)" if mscclpp else ""
    out(f"wrote {shown_path(target)}: {len(plan.xml_files)} XML file(s) for {plan.runtime}{tuned}; "
        "predicted "
        f"{totals['nccl_us']:.1f} us under NCCL, {totals['plan_us']:.1f} us with the plan, "
        f"saving {saving:.1f} us{share} over {totals['calls']} call(s); see "
        f"{shown_path(target / 'report.md')}")
    return EXIT_OK
