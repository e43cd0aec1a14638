"""Benchmarks on GPUs: the nccl-tests (rccl-tests) runs that measure an MSCCL program against the
runtime's own algorithms, run when the binaries are there, and a report of what was measured.

The details: ``docs/plan.md``, section "Benchmarks".
"""

from __future__ import annotations

import dataclasses
import io
import json
import math
import os
import shlex
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from collsynth._files import read_head
from collsynth.errors import (CollsynthError, FileFormatError, InputTooLargeError,
                              InvalidInstanceError, InvalidTopologyError, UnknownNameError)
from collsynth.export.selection import byte_range, layouts
from collsynth.plan.environment import EnvVar, runtime_environment
from collsynth.runtimes import get_runtime

if TYPE_CHECKING:  # pragma: no cover - for annotations only
    from collsynth.algorithm.model import Algorithm
    from collsynth.timing.calibration import CurveCalibration
    from collsynth.timing.logs import BenchmarkLog
    from collsynth.timing.pricing import Price, PricingModel
    from collsynth.topology.model import Topology

__all__ = [
    "BENCH_RUNTIMES",
    "MAX_ITERATIONS",
    "PERF_BINARIES",
    "BenchError",
    "BenchOptions",
    "BenchProgram",
    "BenchRun",
    "BenchSetup",
    "SizeResult",
    "BenchResult",
    "prepare_bench",
    "write_scripts",
    "missing_binaries",
    "run_bench",
    "read_results",
    "write_results",
    "bench_report",
    "plot_bench",
    "BenchPrediction",
    "bench_model",
    "predict",
]

#: Runtimes ``collsynth bench`` writes runs for.
BENCH_RUNTIMES = ("msccl", "msccl-executor", "rccl")
#: Most timed (``-n``) or warm-up (``-w``) iterations a bench run takes, as ``collsynth run``.
MAX_ITERATIONS = 10**6
#: The nccl-tests (rccl-tests) binary that measures each collective.
PERF_BINARIES = {
    "allreduce": "all_reduce_perf", "allgather": "all_gather_perf",
    "reduce_scatter": "reduce_scatter_perf", "alltoall": "alltoall_perf",
    "broadcast": "broadcast_perf", "reduce": "reduce_perf", "gather": "gather_perf",
    "scatter": "scatter_perf",
}
_ROOTED = ("broadcast", "reduce", "gather", "scatter")
# Collectives whose runtime byte count is the API count times the rank count (§4.4).
_COUNT_TIMES_RANKS = ("allgather", "reduce_scatter", "alltoall")
_ELEMENT_BYTES = 4  # nccl-tests' -d float
_DEBUG = (EnvVar("NCCL_DEBUG", "INFO", "the log then names the runtime's version and channels, "
                 "which the calibration records", "NCCL's documented debug variable"),
          EnvVar("NCCL_DEBUG_SUBSYS", "INIT,GRAPH,ENV", "version banner, ring channels, "
                 "environment settings", "NCCL's documented debug variable"))
_SPEC = "docs/msccl-xml.md"
_MSCCL_OFF = {
    "rccl": (EnvVar("RCCL_MSCCL_ENABLE", "0", "MSCCL off: RCCL's own algorithms",
                    f"{_SPEC} §13.2"),),
    "msccl-executor": (EnvVar("NCCL_MSCCL_ENABLE", "0", "MSCCL off: NCCL's own algorithms",
                              f"{_SPEC} §13.3"),),
    "msccl": (),
}
# Variables that would load programs into the default run (unset there).
_UNSET = {"msccl": ("MSCCL_XML_FILES", "MSCCL_CONFIG"), "rccl": ("MSCCL_ALGO_DIR",),
          "msccl-executor": ("MSCCL_ALGO_DIR",)}


class BenchError(CollsynthError):
    """A benchmark that cannot be run, or whose run failed (the message says which and why)."""


#: What a prediction may fail with; it is then left out of the report, with a note: no
#: topology to price on or a subject the model refuses (BenchError), a program the simulator
#: refuses (a deadlock, a rank count, too many steps), a topology without figures.
PREDICTION_ERRORS = (BenchError, InvalidInstanceError, InvalidTopologyError, InputTooLargeError)


@dataclass(frozen=True)
class BenchOptions:
    """What to run.

    Parameters
    ----------
    runtime:
        ``"msccl"``, ``"msccl-executor"`` or ``"rccl"`` (:data:`BENCH_RUNTIMES`).
    ranks:
        GPUs (ranks) the collective runs on.
    min_bytes, max_bytes:
        The sizes to measure (nccl-tests convention): they double from the first size the
        program can run that is at least ``min_bytes``, up to ``max_bytes``.
    iters, warmup:
        nccl-tests' ``-n`` and ``-w``.
    launcher:
        A command prefix that starts one process per rank, ``{ranks}`` replaced by the rank
        count (``"mpirun -np {ranks}"``, ``"srun -n {ranks}"``); nccl-tests then drives one GPU
        per process (``-g 1``). ``None``: one process drives every GPU (``-g N``), which
        msccl-executor does not run MSCCL in (docs/msccl-xml.md §13.3), so it needs a launcher.
    root:
        The root rank of a rooted collective (nccl-tests' ``-r``).
    channels:
        ``--channels`` of the export of an algorithm file (``"auto"``: the fewest that fit).
    topology, nodes:
        The machine's name and node count, recorded in the calibration (an algorithm file's own
        topology name when ``topology`` is ``None``).
    timeout_s:
        The longest one run may take.
    """

    runtime: str
    ranks: int
    min_bytes: int = 1024
    max_bytes: int = 1 << 30
    iters: int = 20
    warmup: int = 5
    launcher: str | None = None
    root: int = 0
    channels: int | str = "auto"
    topology: str | None = None
    nodes: int = 1
    timeout_s: float = 3600.0

    def __post_init__(self) -> None:
        if self.runtime not in BENCH_RUNTIMES:
            raise UnknownNameError(f"bench runtime {self.runtime!r}: expected one of "
                                   f"{', '.join(BENCH_RUNTIMES)}")
        for name in ("ranks", "min_bytes", "max_bytes", "iters", "nodes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise BenchError(f"bench {name} = {value!r}: expected a whole number >= 1")
        for name, low in (("iters", 1), ("warmup", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or \
                    not low <= value <= MAX_ITERATIONS:
                raise BenchError(f"bench {name} = {value!r}: expected a whole number from {low} "
                                 f"to {MAX_ITERATIONS} (nccl-tests counts them in an int; a "
                                 "million calls of each size already take hours)")
        if self.min_bytes > self.max_bytes:
            raise BenchError(f"bench sizes {self.min_bytes}:{self.max_bytes}: the smallest "
                             "is above the largest")
        if not 0 <= self.root < self.ranks:
            raise BenchError(f"bench root {self.root}: expected a rank from 0 to "
                             f"{self.ranks - 1}")


@dataclass(frozen=True)
class BenchProgram:
    """The program measured: its XML text and what the runtime selects it for."""

    name: str
    source: str
    collective: str
    ranks: int
    nchunksperloop: int
    nchannels: int
    proto: str
    halves: tuple[str, ...]  # "out-of-place" and/or "in-place": the calls it is declared for
    min_bytes: int
    max_bytes: int | None  # None: no upper bound
    max_inclusive: bool
    text: str
    file_name: str
    algorithm: "Algorithm | None" = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class BenchRun:
    """One nccl-tests run: its label (``default`` or ``xml``), the command and environment."""

    label: str
    command: tuple[str, ...]
    env: tuple[EnvVar, ...]
    unset: tuple[str, ...]
    script: str
    log: str


@dataclass(frozen=True)
class BenchSetup:
    """Everything a benchmark writes and runs; see :func:`prepare_bench`."""

    program: BenchProgram
    options: BenchOptions
    binary: str
    sizes: tuple[int, ...]
    granule_bytes: int
    runs: tuple[BenchRun, BenchRun]
    notes: tuple[str, ...]

    def runs_program(self, size_bytes: int) -> bool:
        """Whether the runtime selects the program for a call of ``size_bytes``."""
        return _selected(self.program, self.options, size_bytes)


@dataclass(frozen=True)
class SizeResult:
    """One size: the measured times (us) of both runs over the halves the program is declared
    for (geometric mean), whether the runtime ran the program, and nccl-tests' ``#wrong``."""

    size_bytes: int
    default_us: float | None
    xml_us: float | None
    runs_program: bool
    xml_wrong: float | None
    default_busbw_gbps: float | None
    xml_busbw_gbps: float | None


@dataclass(frozen=True)
class BenchPrediction:
    """What a model predicts at the measured sizes: ``program`` (the program as benchmarked)
    and ``runtime`` (the runtime's own fastest algorithm at each size, named), one
    :class:`~collsynth.timing.pricing.Price` per size each."""

    model: str
    provenance: str
    program: tuple["Price", ...]
    runtime: tuple["Price", ...]

    def columns(self) -> list[tuple[str, tuple[float, ...]]]:
        """``(label, us per size)`` of each predicted column."""
        found = [(f"{self.program[0].subject} ({self.model}, {self.provenance})" if self.program
                  else self.model, tuple(p.time_us for p in self.program))]
        if self.runtime:
            used = "/".join(dict.fromkeys(p.subject for p in self.runtime))
            found.append((f"runtime fastest ({used}, {self.model}, {self.provenance})",
                          tuple(p.time_us for p in self.runtime)))
        return found

    def as_dict(self) -> dict[str, object]:
        return {"model": self.model, "provenance": self.provenance,
                "program": [p.as_dict() for p in self.program],
                "runtime": [p.as_dict() for p in self.runtime]}


@dataclass(frozen=True)
class BenchResult:
    """What the logs hold, and what follows from them."""

    default_log: "BenchmarkLog"
    xml_log: "BenchmarkLog"
    sizes: tuple[SizeResult, ...]
    calibration: "CurveCalibration"
    predicted: "BenchPrediction | None"
    notes: tuple[str, ...]


# -- the program ----------------------------------------------------------------------------------


def _is_xml(path: Path) -> bool:
    if path.suffix.lower() == ".xml":
        return True
    if path.suffix.lower() == ".json":
        return False
    return read_head(path, 256).lstrip().startswith(b"<")


def _program_from_xml(path: Path, options: BenchOptions) -> BenchProgram:
    from collsynth.export.xml_reader import load_program, read_text
    from collsynth.timing.logs import canonical_collective

    text = read_text(path)
    try:
        program = load_program(text, runtime=options.runtime, name=str(path))
    except FileFormatError as exc:
        raise BenchError(str(exc)) from exc
    collective = canonical_collective(program.coll)
    return _bench_program(program, collective, str(path), text, options, None)


def _program_from_algorithm(path: Path, options: BenchOptions) -> BenchProgram:
    from collsynth.algorithm.fileformat import load_algorithm
    from collsynth.export.pipeline import export_programs

    algorithm = load_algorithm(path)
    collective = algorithm.collective.name
    if collective not in PERF_BINARIES:
        raise BenchError(f"{path}: nccl-tests has no benchmark for {collective!r}")
    # msccl's maxBytes is exclusive with a 128 MiB default: cover every size measured.
    max_bytes = options.max_bytes if options.runtime == "msccl" else None
    exported = export_programs(algorithm, [options.runtime], subject=str(path),
                               channels=options.channels, max_bytes=max_bytes)
    result = exported[options.runtime]
    return _bench_program(result.program, collective, str(path), result.text, options, algorithm)


def _bench_program(program: Any, collective: str, source: str, text: str,
                   options: BenchOptions, algorithm: "Algorithm | None") -> BenchProgram:
    from collsynth._output import safe_file_name

    if collective not in PERF_BINARIES:
        raise BenchError(f"{source}: a {program.coll!r} program; nccl-tests measures "
                         f"{', '.join(PERF_BINARIES)}")
    if program.ngpus != options.ranks:
        raise BenchError(f"{source}: the program is for {program.ngpus} ranks (ngpus), not "
                         f"--ranks {options.ranks}; the runtime selects it only on "
                         f"{program.ngpus} ranks")
    halves = layouts(program, options.runtime, collective)
    _, max_bytes, inclusive = byte_range(program, options.runtime)
    if not halves:
        raise BenchError(f"{source}: the program is declared for neither in-place nor "
                         "out-of-place calls")
    name = safe_file_name(program.name or Path(source).stem, default="program")
    return BenchProgram(program.name or Path(source).stem, source, collective, program.ngpus,
                        program.nchunksperloop, program.nchannels, program.proto, halves,
                        program.min_bytes or 0, max_bytes, inclusive, text, f"{name}.xml",
                        algorithm)


# -- the runs -------------------------------------------------------------------------------------


def _granule(program: BenchProgram, runtime: str) -> int:
    """Bytes every size must be a multiple of for the runtime to select the program (its
    element count a multiple of ``nchunksperloop``: msccl and rccl count the larger buffer's
    elements, msccl-executor the API's count, which for allgather, reduce-scatter and alltoall
    is that divided by the rank count; docs/msccl-xml.md §13) and for nccl-tests to run it
    unrounded (allgather, reduce-scatter and alltoall split the size over the ranks)."""
    per_call = _ELEMENT_BYTES * program.nchunksperloop
    if runtime == "msccl-executor" and program.collective in _COUNT_TIMES_RANKS:
        per_call *= program.ranks
    split = _ELEMENT_BYTES * (program.ranks if program.collective in _COUNT_TIMES_RANKS else 1)
    return per_call * split // math.gcd(per_call, split)


def _selected(program: BenchProgram, options: BenchOptions, size_bytes: int) -> bool:
    if size_bytes % _granule(program, options.runtime):
        return False
    if size_bytes < program.min_bytes:
        return False
    if program.max_bytes is None:
        return True
    return size_bytes <= program.max_bytes if program.max_inclusive \
        else size_bytes < program.max_bytes


def prepare_bench(source: str | os.PathLike[str], options: BenchOptions) -> BenchSetup:
    """Read (or export) the program of ``source`` and build both runs; nothing is written.

    Raises
    ------
    BenchError
        A program for another rank count, a collective nccl-tests does not measure, no size in
        the range the program can run, msccl-executor without a launcher, an XML the runtime
        would not read as written.
    FileFormatError, ExportError, VerificationError
        An unreadable file, an algorithm that cannot be exported for the runtime.
    """
    path = Path(source)
    program = (_program_from_xml(path, options) if _is_xml(path)
               else _program_from_algorithm(path, options))
    if options.runtime == "msccl-executor" and options.launcher is None:
        raise BenchError("msccl-executor runs MSCCL only with one GPU per process "
                         "(docs/msccl-xml.md §13.3): give a launcher, e.g. --launcher "
                         "'mpirun -np {ranks}'")
    granule = _granule(program, options.runtime)
    first = -(-options.min_bytes // granule) * granule
    if first > options.max_bytes:
        raise BenchError(f"no size from {options.min_bytes} to {options.max_bytes} bytes is a "
                         f"multiple of {granule} bytes (the program's nchunksperloop "
                         f"{program.nchunksperloop} x 4-byte floats"
                         + (f" x {program.ranks} ranks" if granule % program.ranks == 0 else "")
                         + "): raise the largest size")
    sizes = []
    size = first
    while size <= options.max_bytes:
        sizes.append(size)
        size *= 2
    binary = PERF_BINARIES[program.collective]
    args = [binary, "-b", str(sizes[0]), "-e", str(sizes[-1]), "-f", "2",
            "-g", "1" if options.launcher else str(options.ranks), "-c", "1",
            "-n", str(options.iters), "-w", str(options.warmup), "-d", "float"]
    if program.collective in _ROOTED:
        args += ["-r", str(options.root)]
    prefix: list[str] = []
    if options.launcher:
        try:
            prefix = shlex.split(options.launcher.replace("{ranks}", str(options.ranks)))
        except ValueError as exc:
            raise BenchError(f"launcher {options.launcher!r}: {exc}") from exc
    command = tuple(prefix + args)
    xml_env, notes = runtime_environment(
        get_runtime(options.runtime), xml_dir="$PWD/xml", xml_paths=[f"$PWD/xml/{program.file_name}"],
        collectives=[program.collective])
    runs = (
        BenchRun("default", command, _DEBUG + _MSCCL_OFF[options.runtime],
                 _UNSET[options.runtime], "run_default.sh", "logs/default.txt"),
        BenchRun("xml", command, _DEBUG + tuple(xml_env), (), "run_xml.sh", "logs/xml.txt"),
    )
    falls_back = [s for s in sizes if not _selected(program, options, s)]
    extra = [f"The program is declared for {' and '.join(program.halves)} calls; nccl-tests "
             "measures both halves of every size, and the other half runs the runtime's own "
             "algorithm: only the declared halves are compared."]
    if falls_back:
        extra.append(f"{len(falls_back)} of the {len(sizes)} sizes are outside the program's "
                     "byte range and run the runtime's own algorithm in the xml run too.")
    if options.launcher:
        extra.append("The scripts export the variables; a launcher that starts processes on "
                     "other hosts must pass them on (mpirun -x NAME), and $PWD must be the same "
                     "path there.")
    return BenchSetup(program, options, binary, tuple(sizes), granule, runs,
                      tuple(extra) + tuple(notes))


def _script(setup: BenchSetup, run: BenchRun) -> str:
    program = setup.program
    lines = ["#!/usr/bin/env bash",
             f"# collsynth bench: the {run.label} run of {program.name} "
             f"({program.collective}, {program.ranks} ranks) on {setup.options.runtime}",
             "# " + ("the runtime's own algorithms, MSCCL off" if run.label == "default"
                     else f"the program xml/{program.file_name} loaded by the runtime"),
             "set -euo pipefail", 'cd "$(dirname "$0")"', "mkdir -p logs"]
    if run.unset:
        lines.append("unset " + " ".join(run.unset))
    for var in run.env:
        lines.append(f"# {var.why} ({var.source})")
        value = var.value.replace('"', '\\"')
        lines.append(f'export {var.name}="{value}"')
    command = " ".join(shlex.quote(part) for part in run.command)
    lines.append(f"{command} 2>&1 | tee {run.log}")
    return "\n".join(lines) + "\n"


def _readme(setup: BenchSetup, *, dry_run: bool) -> str:
    program, options = setup.program, setup.options
    head = ("**Dry run: these commands were written, not run. Nothing was measured.**"
            if dry_run else "The runs' logs are in `logs/`; `report.md` holds what they measured.")
    lines = [f"# collsynth bench: {program.name} on {options.runtime}, {program.ranks} ranks",
             "", head, "",
             f"* program: `xml/{program.file_name}` from `{program.source}` "
             f"({program.collective}, nchunksperloop {program.nchunksperloop}, "
             f"{program.nchannels} channel(s), {program.proto})",
             f"* sizes: {len(setup.sizes)}, {setup.sizes[0]} to {setup.sizes[-1]} bytes, "
             f"doubling (multiples of {setup.granule_bytes} bytes, so that the runtime selects "
             "the program)",
             "* `run_default.sh`: the runtime's own algorithms; `run_xml.sh`: the program", "",
             "Run both on the machine (nccl-tests or rccl-tests built against the runtime, "
             f"`{setup.binary}` on PATH; `collsynth bench` there runs them itself), then "
             "`collsynth bench ... --from-logs -o` this folder to read `logs/` into a report.",
             ""]
    lines += [f"* {note}" for note in setup.notes]
    return "\n".join(lines) + "\n"


def check_bench_folder(setup: BenchSetup, out_dir: str | os.PathLike[str]) -> None:
    """Refuse an ``out_dir`` whose ``xml/`` holds files besides the program (the runtime parses
    every file of ``MSCCL_ALGO_DIR``; msccl reads only the files named). Writes nothing.

    Raises
    ------
    BenchError
        Naming the first stray files.
    """
    xml_dir = Path(out_dir) / "xml"
    if setup.options.runtime == "msccl" or not xml_dir.is_dir():
        return
    stray = sorted(p.name for p in xml_dir.iterdir() if p.name != setup.program.file_name)
    if stray:
        raise BenchError(f"{xml_dir}: holds {', '.join(stray[:3])}; the runtime parses every "
                         "file of MSCCL_ALGO_DIR, so it must hold the program only: use a new "
                         "-o folder")


def write_scripts(setup: BenchSetup, out_dir: str | os.PathLike[str], *,
                  dry_run: bool = False) -> list[Path]:
    """Write ``xml/`` (the program), ``run_default.sh``, ``run_xml.sh``, ``README.md`` and
    ``bench.json`` (the setup) into ``out_dir``; return the paths written."""
    from collsynth._output import check_output_dir, write_text_atomic

    check_bench_folder(setup, out_dir)
    folder = check_output_dir(out_dir, label=f"-o {out_dir}")
    xml_dir = check_output_dir(folder / "xml", label=f"{folder / 'xml'}")
    written = [xml_dir / setup.program.file_name]
    write_text_atomic(written[0], setup.program.text)
    for run in setup.runs:
        path = folder / run.script
        write_text_atomic(path, _script(setup, run))
        path.chmod(0o755)
        written.append(path)
    written.append(folder / "README.md")
    write_text_atomic(written[-1], _readme(setup, dry_run=dry_run))
    written.append(folder / "bench.json")
    write_text_atomic(written[-1], json.dumps(_setup_json(setup, dry_run=dry_run), indent=1)
                      + "\n")
    return written


def _setup_json(setup: BenchSetup, *, dry_run: bool) -> dict[str, Any]:
    program, options = setup.program, setup.options
    return {
        "dry_run": dry_run, "measured": False, "runtime": options.runtime,
        "ranks": program.ranks,
        "program": {"name": program.name, "source": program.source, "xml": f"xml/"
                    f"{program.file_name}", "collective": program.collective,
                    "nchunksperloop": program.nchunksperloop, "channels": program.nchannels,
                    "proto": program.proto, "halves": list(program.halves)},
        "sizes": list(setup.sizes),
        "runs": [{"label": r.label, "script": r.script, "log": r.log, "command": list(r.command),
                  "env": {v.name: v.value for v in r.env}, "unset": list(r.unset)}
                 for r in setup.runs],
        "notes": list(setup.notes),
    }


def missing_binaries(setup: BenchSetup, *, path: str | None = None) -> list[str]:
    """The programs the runs need that are not on ``PATH`` (or ``path``): the nccl-tests
    binary and the launcher."""
    needed = [setup.runs[0].command[0], setup.binary]
    return [name for name in dict.fromkeys(needed) if shutil.which(name, path=path) is None]


def run_bench(setup: BenchSetup, out_dir: str | os.PathLike[str], *,
              env: Mapping[str, str] | None = None,
              model: "PricingModel | None" = None) -> BenchResult:
    """Run both scripts written by :func:`write_scripts` in ``out_dir`` and read their logs.

    ``env`` is the environment they start from (default: this process's). ``model`` prices
    the predictions (:func:`predict`); by default :func:`bench_model` (the program model with
    constants fitted on the default run).

    Raises
    ------
    BenchError
        A binary not on PATH (nothing is run then), a run that failed or timed out (with the
        end of its log), or a log without results.
    """
    base = dict(os.environ if env is None else env)
    missing = missing_binaries(setup, path=base.get("PATH"))
    if missing:
        raise BenchError(f"{', '.join(missing)} not on PATH: nothing was run or measured")
    folder = Path(out_dir)
    for run in setup.runs:
        try:
            done = subprocess.run(["bash", str(folder / run.script)], env=base,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  timeout=setup.options.timeout_s, check=False)
        except subprocess.TimeoutExpired as exc:
            raise BenchError(f"the {run.label} run ({run.script}) took more than "
                             f"{setup.options.timeout_s:g} s; stopped") from exc
        if done.returncode != 0:
            tail = done.stdout.decode("utf-8", "replace").strip().splitlines()[-3:]
            raise BenchError(f"the {run.label} run ({run.script}) failed with exit status "
                             f"{done.returncode}: " + (" / ".join(tail) or "no output"))
    return read_results(setup, out_dir, model=model)


def read_results(setup: BenchSetup, out_dir: str | os.PathLike[str], *,
                 model: "PricingModel | None" = None) -> BenchResult:
    """Read the logs the runs left in ``out_dir/logs`` (see :func:`run_bench`)."""
    from collsynth.timing.calibration import calibration_from_fits
    from collsynth.timing.fit import fit_log
    from collsynth.collective.kinds import busbw_factor
    from collsynth.timing.logs import load_log

    folder = Path(out_dir)
    program, options = setup.program, setup.options
    logs = []
    for run in setup.runs:
        log = load_log(folder / run.log, collective=program.collective, ranks=program.ranks)
        if log.runtime is None:  # the log does not say: the runtime the run was written for
            log = dataclasses.replace(log, runtime=options.runtime)
        logs.append(log)
    default_log, xml_log = logs
    wanted = {h == "in-place" for h in program.halves}
    factor = float(busbw_factor(program.collective, program.ranks))

    def per_size(log: "BenchmarkLog") -> dict[int, tuple[float, float | None]]:
        times: dict[int, list[float]] = {}
        wrong: dict[int, float | None] = {}
        for row in log.rows:
            if row.in_place in wanted:
                times.setdefault(row.size_bytes, []).append(row.time_us)
                if row.errors is not None:
                    wrong[row.size_bytes] = (wrong.get(row.size_bytes) or 0.0) + row.errors
                else:
                    wrong.setdefault(row.size_bytes, None)
        return {s: (v[0] if len(v) == 1 else math.exp(sum(map(math.log, v)) / len(v)), wrong[s])
                for s, v in times.items()}

    default, xml = per_size(default_log), per_size(xml_log)
    sizes = sorted(set(default) | set(xml))

    def busbw(size: int, time_us: float | None) -> float | None:
        return None if time_us is None else factor * size / (time_us * 1e3)

    results = tuple(SizeResult(
        s, default.get(s, (None, None))[0], xml.get(s, (None, None))[0], setup.runs_program(s),
        xml.get(s, (None, None))[1], busbw(s, default.get(s, (None, None))[0]),
        busbw(s, xml.get(s, (None, None))[0])) for s in sizes)
    notes = list(setup.notes)
    if set(sizes) != set(setup.sizes):
        notes.append(f"the logs hold {len(sizes)} sizes; the runs asked for {len(setup.sizes)}")
    bad = [r.size_bytes for r in results if r.xml_wrong]
    if bad:
        notes.append(f"nccl-tests found wrong results with the program at {len(bad)} size(s) "
                     f"(#wrong > 0), first {bad[0]} bytes: its times are not a valid benchmark")
    topology = options.topology or (program.algorithm.topology.name if program.algorithm
                                    else f"{program.ranks}-rank machine")
    calibration = calibration_from_fits(topology, [fit_log(default_log)], nodes=options.nodes)
    predicted: BenchPrediction | None = None
    try:
        predicted = predict(setup, sizes, model if model is not None else
                            bench_model(setup, default_log))
    except PREDICTION_ERRORS as exc:
        notes.append(f"no prediction: {exc}")
    return BenchResult(default_log, xml_log, results, calibration, predicted, tuple(notes))


def _bench_topology(setup: BenchSetup) -> "Topology":
    """The machine the program is priced on: an algorithm file's own topology (it carries its
    figures), else the bench's ``topology`` (with ``nodes``)."""
    from collsynth.resolve import resolve_topology

    if setup.program.algorithm is not None:
        return setup.program.algorithm.topology
    if setup.options.topology is None:
        raise BenchError("an XML program is simulated on the bench's topology; give one "
                         "(--topology)")
    return resolve_topology(setup.options.topology,
                            nodes=setup.options.nodes if setup.options.nodes > 1 else None)


def bench_model(setup: BenchSetup, default_log: "BenchmarkLog | None" = None) -> "PricingModel":
    """The default model of the predictions: the program model with constants fitted on the
    default run's measured curve when it has at least 4 sizes
    (:func:`collsynth.timing.runtime_fit.fit_runtime`, the runtime's ring with the channel count
    its log reports), else the runtime's documented constants; its provenance says which.

    Raises
    ------
    BenchError
        No topology to simulate on.
    """
    from collsynth.runtimes import get_runtime
    from collsynth.timing.program_model import ProgramModel
    from collsynth.timing.runtime_baselines import RING_COLLECTIVES
    from collsynth.timing.runtime_fit import CURVE_FIT_ERRORS, fit_runtime

    program, options = setup.program, setup.options
    topology = _bench_topology(setup)
    runtime = get_runtime(options.runtime)
    constants, source = runtime.defaults, "documented"
    rows = sorted({r.size_bytes: r.time_us for r in (default_log.rows if default_log else ())
                   if not r.in_place}.items())
    if program.collective in RING_COLLECTIVES and len(rows) >= 4:
        try:
            constants = fit_runtime(rows, topology, program.collective, runtime=options.runtime,
                                    channels=default_log.channels, held_out=False).constants
            source = "fitted on the default run"
        except CURVE_FIT_ERRORS:
            pass  # the documented constants, as the provenance says
    return ProgramModel(constants, runtime=runtime, topology=topology, source=source)


def predict(setup: BenchSetup, sizes: Sequence[int], model: "PricingModel") -> BenchPrediction:
    """The program *as benchmarked* and the runtime's own fastest algorithm at each size, both
    priced by ``model`` (one yardstick for the measured-vs-predicted report): its XML when the
    model prices programs, else its algorithm (an algorithm file, with the closed form).

    Raises
    ------
    BenchError
        The model can price neither the program nor its algorithm.
    CollsynthError
        What the model raises (a program the simulator refuses...).
    """
    from collsynth.export.xml_reader import load_program
    from collsynth.runtimes import get_runtime
    from collsynth.timing.pricing import fastest_runtime_algorithm

    program, options = setup.program, setup.options
    xml = dataclasses.replace(load_program(program.text, runtime=options.runtime,
                                           name=program.name), name=program.name)
    subject: Any = xml
    why = model.why_not(xml)
    if why is not None and program.algorithm is not None:
        subject = dataclasses.replace(program.algorithm, name=program.name)
        why = model.why_not(subject)
    if why is not None:
        raise BenchError(f"the {model.name} cannot price {program.name}: {why}")
    topology = _bench_topology(setup) if program.algorithm is None else program.algorithm.topology
    runtime = fastest_runtime_algorithm(get_runtime(options.runtime), program.collective,
                                        topology, sizes, model)
    return BenchPrediction(model.name, model.provenance, model.price(subject, sizes), runtime)


# -- the report -----------------------------------------------------------------------------------


def _us(value: float | None) -> str:
    return "—" if value is None else f"{value:.4g}"


def bench_report(setup: BenchSetup, result: BenchResult) -> str:
    """The markdown report: what ran, then per size the measured times (us) of both runs, the
    program's speed-up, and the predictions (labelled as such)."""
    program, options = setup.program, setup.options
    log = result.default_log
    runtime = " ".join(x for x in (log.runtime, log.runtime_version) if x)
    channels = f", {log.channels} channels" if log.channels else ""
    lines = [f"# collsynth bench: {program.name} on {options.runtime}, {program.ranks} ranks", "",
             f"Measured: `{setup.binary}` ({runtime or options.runtime}{channels} in the default "
             f"run's log), {len(result.sizes)} sizes, the {' and '.join(program.halves)} "
             "half of each. Times in microseconds; *predicted* columns are model figures, not "
             "measurements.", "",
             f"* program: `xml/{program.file_name}` from `{program.source}` "
             f"({program.collective}, nchunksperloop {program.nchunksperloop}, "
             f"{program.nchannels} channel(s), {program.proto})",
             "* calibration of the default run: `calibration.json`"]
    pieces = [e for e in result.calibration.entries if e.model == "piecewise"]
    if pieces:
        lines[-1] += (f" (piecewise GMAE {100 * pieces[0].gmae:.1f}%"
                      + (f", held out {100 * pieces[0].gmae_heldout:.1f}%"
                         if pieces[0].gmae_heldout is not None else "") + ")")
    lines.append("")
    columns = result.predicted.columns() if result.predicted is not None else []
    header = ["size (B)", "default", "xml", "runs the program", "speed-up"] + \
             [f"predicted: {n}" for n, _ in columns]
    lines.append("| " + " | ".join(header) + " |")
    lines.append("|" + "---:|" * len(header))
    for index, row in enumerate(result.sizes):
        speedup = ("—" if row.default_us is None or row.xml_us is None
                   else f"{row.default_us / row.xml_us:.2f}x")
        ran = "yes" if row.runs_program else "no (runtime's own)"
        if row.xml_wrong:
            ran += f", {row.xml_wrong:g} wrong"
        cells = [str(row.size_bytes), _us(row.default_us), _us(row.xml_us), ran, speedup]
        cells += [_us(times[index]) for _, times in columns]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    lines += [f"* {note}" for note in result.notes]
    return "\n".join(lines) + "\n"


def plot_bench(setup: BenchSetup, result: BenchResult) -> Any:
    """Measured (points) and predicted (lines) time against size, log-log; a
    :class:`matplotlib.figure.Figure` drawn with the Agg canvas."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7.5, 4.5), layout="constrained")
    ax = fig.subplots()
    for label, attr, marker in (("default (measured)", "default_us", "o"),
                                ("xml (measured)", "xml_us", "s")):
        points = [(r.size_bytes, getattr(r, attr)) for r in result.sizes
                  if getattr(r, attr) is not None]
        if points:
            ax.plot(*zip(*points), marker, label=label, markersize=5, linestyle="none")
    sizes = [r.size_bytes for r in result.sizes]
    for name, times in (result.predicted.columns() if result.predicted is not None else []):
        ax.plot(sizes, times, "-", label=f"{name} (predicted)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("size (bytes)")
    ax.set_ylabel("time (us)")
    ax.set_title(f"{setup.program.name}: {setup.program.collective}, {setup.program.ranks} "
                 f"ranks, {setup.options.runtime}", fontsize=10)
    ax.legend(fontsize=9)
    return fig


def write_results(setup: BenchSetup, result: BenchResult,
                  out_dir: str | os.PathLike[str]) -> list[Path]:
    """Write ``calibration.json``, ``report.md``, ``plot.png`` and ``bench.json`` (with the
    measured figures) into ``out_dir``; return the paths written."""
    from collsynth._output import write_bytes_atomic, write_text_atomic
    from collsynth.timing.calibration import save_calibration
    from collsynth.timing.fit import save_figure

    folder = Path(out_dir)
    written = [folder / "calibration.json", folder / "report.md", folder / "plot.png",
               folder / "bench.json"]
    save_calibration(result.calibration, written[0])
    write_text_atomic(written[1], bench_report(setup, result))
    buffer = io.BytesIO()
    save_figure(plot_bench(setup, result), buffer, format="png")
    write_bytes_atomic(written[2], buffer.getvalue())
    obj = _setup_json(setup, dry_run=False)
    log = result.default_log
    obj.update({
        "measured": True,
        "runtime_measured": {"runtime": log.runtime, "runtime_version": log.runtime_version,
                             "channels": log.channels},
        "results": [dataclasses.asdict(r) for r in result.sizes],
        "predicted": result.predicted.as_dict() if result.predicted is not None else None,
        "notes": list(result.notes),
    })
    write_text_atomic(written[3], json.dumps(obj, indent=1) + "\n")
    return written
