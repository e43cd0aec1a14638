"""Make a plan: from a trace and a topology to the algorithm each traced collective should run.

The details: ``docs/plan.md``, section "Making a plan".
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
from collections import defaultdict
from dataclasses import dataclass, field
from fractions import Fraction
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from collsynth.collective.standard import standard_collective
from collsynth.export.selection import MSCCL_DEFAULT_MAX_BYTES, count_fits
from collsynth.errors import (
    ExportError,
    InvalidInstanceError,
    InvalidTopologyError,
)
from collsynth.plan.buckets import StepStructure, find_steps, size_bucket
from collsynth.plan.cache import FrontCache
from collsynth.plan.calls import TracedCall, TracedRun, load_calls
from collsynth.plan.choose import (
    NCCL,
    Candidate,
    SizeRange,
    SynthOptions,
    choose_ranges,
    choose_sampled_ranges,
    synthesize_front,
)
from collsynth.plan.groups import plan_signature, topology_for_group
from collsynth.runtimes.settings import RuntimeSettings
from collsynth.timing.closed_form import ClosedForm
from collsynth.topology.model import Topology

if TYPE_CHECKING:  # pragma: no cover - for annotations only
    from collsynth.runtimes import Runtime, RuntimeConstants
    from collsynth.timing.calibration import CurveCalibration
    from collsynth.timing.program_model import ProgramModel

__all__ = ["PLANNED_KINDS", "PlanOptions", "XmlFile", "RangePlan", "BucketRow", "PlanEntry",
           "NotPlanned", "RankSteps", "Plan", "make_plan", "plan_calls", "MSCCL_MAX_ALGORITHMS",
           "PLAN_MODELS"]

_log = logging.getLogger(__name__)

#: Trace kinds a plan may move off NCCL, and the collsynth collective of each.
PLANNED_KINDS = ("allreduce", "allgather", "reduce_scatter", "alltoall", "broadcast", "reduce")
_ROOTED = ("broadcast", "reduce")
#: Collectives torch calls in place (same tensor in and out).
TORCH_IN_PLACE = ("allreduce", "broadcast", "reduce")
_COMBINING = ("allreduce", "reduce", "reduce_scatter")
#: How a plan prices candidates: ``"auto"`` (the program model wherever it applies, else the
#: closed form) or ``"closed-form"`` (the quick path everywhere).
PLAN_MODELS = ("auto", "closed-form")
#: msccl's MSCCL_MAX_NUM_ALGOS (docs/msccl-xml.md §13.1).
MSCCL_MAX_ALGORITHMS = 4

_REASONS = {
    "barrier": "a barrier carries no data (NCCL runs it as a one-element allreduce)",
    "send": "point-to-point: not a collective",
    "recv": "point-to-point: not a collective",
    "isend": "point-to-point: not a collective",
    "irecv": "point-to-point: not a collective",
    "gather": "torch runs gather on NCCL as grouped send/recv, which MSCCL runtimes never "
              "replace",
    "scatter": "torch runs scatter on NCCL as grouped send/recv, which MSCCL runtimes never "
               "replace",
    "broadcast_object_list": "pickled objects: a broadcast of their sizes then one of a payload "
                             "whose size changes from call to call",
}


@dataclass(frozen=True, kw_only=True)
class PlanOptions:
    """Options of :func:`make_plan` (keyword-only).

    Parameters
    ----------
    runtime:
        ``"msccl-executor"`` (default), ``"msccl"`` or ``"rccl"``: the runtime the XML is for.
    synth:
        How candidates are synthesized (:class:`~collsynth.plan.choose.SynthOptions`).
    calibration:
        A :class:`~collsynth.timing.calibration.CurveCalibration` (measured alpha and GB/s, NCCL's
        measured lines), or ``None``; ``calibration_file`` names it in the plan.
    device:
        GPU whose reduction cost combining algorithms pay (:mod:`collsynth.timing.kernels`).
    cache:
        Where synthesized fronts are kept (``None``: nowhere).
    proto:
        NCCL protocol of the XML programs.
    all_ranges:
        Export every range a synthesized algorithm wins, also those no traced call falls into.
    model:
        ``"auto"`` (default): where the topology has physical figures and the runtime's own
        algorithm for the collective is a program (its ring for allgather, reduce-scatter and
        allreduce, its grouped send/recv for alltoall), both sides are priced by the program
        model (synthesized algorithms after tuned lowering, the runtime's own),
        else by the closed form; ``"closed-form"``: the closed form everywhere (docs/plan.md,
        "Pricing").
    runtime_constants:
        The program model's :class:`~collsynth.runtimes.RuntimeConstants` (a runtime-constants
        calibration, ``collsynth calibrate --model program``), or ``None``: the runtime's
        documented defaults;
        ``runtime_constants_file`` names it in the plan.
    runtime_version:
        ``(major, minor)`` whose own choices the runtime's algorithms are priced with (a
        runtime-constants calibration's: the version of the log it was fitted on), or ``None``:
        the newest modelled (docs/runtime-tuning.md, "Versions").
    runtime_settings:
        The job's NCCL_ALGO / NCCL_PROTO / NCCL_NVLS_ENABLE, which narrow the runtime's own
        algorithms a program is compared with (docs/runtime-tuning.md, "Settings").
    """

    runtime: str = "msccl-executor"
    synth: SynthOptions = SynthOptions()
    calibration: "CurveCalibration | None" = None
    calibration_file: str | None = None
    device: str | None = None
    cache: FrontCache | None = None
    proto: str = "Simple"
    all_ranges: bool = False
    model: str = "auto"
    runtime_constants: "RuntimeConstants | None" = None
    runtime_constants_file: str | None = None
    runtime_version: tuple[int, int] | None = None
    runtime_settings: RuntimeSettings = RuntimeSettings()

    def __post_init__(self) -> None:
        if self.model not in PLAN_MODELS:
            raise InvalidInstanceError(f"plan model {self.model!r}; expected one of "
                                       f"{', '.join(PLAN_MODELS)}")


@dataclass(frozen=True)
class XmlFile:
    """One XML file of the plan: ``name`` under ``xml/``, its text, and what the runtime needs
    to know to select it."""

    name: str
    text: str = field(repr=False)
    collective: str
    ngpus: int
    root: int | None
    nchunksperloop: int
    inplace: bool
    outofplace: bool
    channels: int = 1
    channel_by: str = "chunk"


@dataclass(frozen=True)
class RangePlan:
    """One size range of one entry: ``choice`` is an algorithm's name or ``"nccl"``.

    ``winner`` is the fastest candidate in the range; ``choice`` what the plan runs there (NCCL
    when the winner's XML was not exported: ``note`` says why). ``xml`` is the file of the range
    (the same file for every entry that shares it). ``max_bytes`` is inclusive (``None``:
    unbounded). ``variant`` is the tuned layout of the range's program (program model) and
    ``nchunksperloop`` that program's (``None``: no program).
    """

    min_bytes: int
    max_bytes: int | None
    winner: str
    choice: str
    xml: str | None = None
    note: str = ""
    variant: str = ""
    nchunksperloop: int | None = None

    def contains(self, size_bytes: int) -> bool:
        return self.min_bytes <= size_bytes and (self.max_bytes is None
                                                 or size_bytes <= self.max_bytes)


@dataclass(frozen=True)
class BucketRow:
    """The calls of one entry in one size bucket (counted on the group's lowest traced rank).

    Times are totals over the calls (us); ``None`` when not modelled. ``fallback`` counts calls
    that fall in a planned range but that the runtime would give back to NCCL (element count not
    a multiple of ``nchunksperloop``).
    """

    bucket: tuple[int, int]
    calls: int
    bytes: int
    nccl_us: float | None
    plan_us: float | None
    choices: tuple[str, ...]
    fallback: int = 0
    measured_us: float | None = None

    @property
    def saving_us(self) -> float | None:
        if self.nccl_us is None or self.plan_us is None:
            return None
        return self.nccl_us - self.plan_us


@dataclass(frozen=True)
class PlanEntry:
    """The plan of one collective on one group (with one root).

    ``status``: ``"planned"`` (XML files run some of its calls), ``"nccl"`` (NCCL keeps every
    call: ``reason`` says why) or ``"shared"`` (its calls may run another group's XML, see the
    module docstring). ``group`` are global ranks; ``root`` is global (``None``: unrooted).
    ``yardstick`` is the name of the model that priced its candidates (``"program-model"`` or
    ``"closed-form"``, :mod:`collsynth.timing.pricing`) and ``yardstick_note`` why the closed
    form, when it is.
    """

    collective: str
    group: tuple[int, ...]
    root: int | None
    topology: str
    status: str
    reason: str
    candidates: tuple[Candidate, ...]
    ranges: tuple[RangePlan, ...]
    buckets: tuple[BucketRow, ...]
    synthesis: str
    nccl_note: str
    nchunks: Mapping[str, int] = field(default_factory=dict, compare=False)
    runtime: str = "msccl-executor"
    excluded: Mapping[str, str] = field(default_factory=dict, compare=False)
    yardstick: str = ClosedForm.name
    yardstick_note: str = ""

    @property
    def local_root(self) -> int | None:
        return None if self.root is None else self.group.index(self.root)

    def candidate(self, name: str) -> Candidate | None:
        for c in self.candidates:
            if c.name == name:
                return c
        return None

    def nccl_us(self, size_bytes: int) -> Fraction | float | None:
        """NCCL's predicted time at ``size_bytes`` (its fastest choice), or ``None``."""
        times = [c.time_at(size_bytes) for c in self.candidates if c.source == NCCL]
        return min(times) if times else None

    def predict(self, size_bytes: int, element_size: int | None = None
                ) -> tuple[Fraction | float | None, Fraction | float | None, str, bool]:
        """``(nccl_us, plan_us, choice, fallback)`` of one call of ``size_bytes`` bytes.

        ``choice`` is what runs it under the plan (an algorithm's name or ``"nccl"``);
        ``fallback`` is true when a planned range holds the size but the runtime would not
        select the XML (element count not a multiple of ``nchunksperloop``; ``element_size``
        is bytes per element, ``None``: unknown, assumed to fit).
        """
        nccl = self.nccl_us(size_bytes)
        for r in self.ranges:
            if not r.contains(size_bytes):
                continue
            if r.choice == NCCL or self.status == "shared":
                return nccl, nccl, NCCL, False
            candidate = self.candidate(r.choice)
            assert candidate is not None
            nchunks = r.nchunksperloop if r.nchunksperloop is not None else \
                self.nchunks.get(r.choice)
            if not count_fits(size_bytes, element_size, nchunks, runtime=self.runtime,
                               collective=self.collective, ranks=len(self.group)):
                return nccl, nccl, NCCL, True
            return nccl, candidate.time_at(size_bytes), r.choice, False
        return nccl, nccl, NCCL, False


@dataclass(frozen=True)
class NotPlanned:
    """Calls that stay on NCCL whatever the plan: their kind, group, count, bytes and why."""

    kind: str
    group: tuple[int, ...]
    calls: int
    bytes: int
    reason: str


@dataclass(frozen=True)
class RankSteps:
    """One rank's predicted communication time per step (us, modelled calls only), and how many
    of its calls per step are not modelled (not planned kinds, collectives NCCL's model does
    not cover); ``measured_us_per_step`` sums the traced durations when every call has one."""

    rank: int
    structure: StepStructure
    calls_per_step: float
    nccl_us_per_step: float
    plan_us_per_step: float
    unmodelled_per_step: float
    measured_us_per_step: float | None = None

    @property
    def saving_us_per_step(self) -> float:
        return self.nccl_us_per_step - self.plan_us_per_step


@dataclass(frozen=True)
class Plan:
    """A whole plan: what :func:`collsynth.plan.writer.write_plan` writes."""

    trace_dir: str
    world_size: int
    topology: str
    nodes: int | None
    runtime: str
    calibration_file: str | None
    device: str | None
    entries: tuple[PlanEntry, ...]
    not_planned: tuple[NotPlanned, ...]
    ranks: tuple[RankSteps, ...]
    xml_files: tuple[XmlFile, ...]
    notes: tuple[str, ...]
    synth_time_limit: float
    model: str = "auto"
    runtime_constants_file: str | None = None

    def totals(self) -> dict[str, float]:
        """Predicted totals over the modelled calls of every entry (us), counted once per group."""
        nccl = sum(b.nccl_us for e in self.entries for b in e.buckets if b.nccl_us is not None
                   and b.plan_us is not None)
        plan = sum(b.plan_us for e in self.entries for b in e.buckets if b.nccl_us is not None
                   and b.plan_us is not None)
        calls = sum(b.calls for e in self.entries for b in e.buckets)
        return {"calls": calls, "nccl_us": nccl, "plan_us": plan, "saving_us": nccl - plan}


# -- making a plan ---------------------------------------------------------------------------------


def make_plan(trace_dir: str | os.PathLike[str], topology: Topology, *,
              options: PlanOptions = PlanOptions(), nodes: int | None = None,
              progress: Callable[[str], None] | None = None) -> Plan:
    """Plan the trace in ``trace_dir`` on ``topology`` (docs/plan.md).

    Parameters
    ----------
    trace_dir:
        A trace directory (``rank-00000.jsonl``, ...).
    topology:
        The machine: global rank ``r`` is its rank ``r`` (compose nodes beforehand:
        :func:`collsynth.resolve.resolve_topology` with ``nodes=``); ``nodes`` is recorded.
    options:
        :class:`PlanOptions`.
    progress:
        Called with one line per problem synthesized or exported.

    Raises
    ------
    FileFormatError
        A missing or malformed trace.
    InvalidTopologyError
        A trace with more ranks than the topology, or a calibration for another rank count.
    ExportError
        An XML program that fails the check (nothing is written by this function anyway).
    """
    return plan_calls(load_calls(trace_dir), topology, options=options, nodes=nodes,
                      progress=progress)


def plan_calls(run: TracedRun, topology: Topology, *, options: PlanOptions = PlanOptions(),
               nodes: int | None = None, progress: Callable[[str], None] | None = None) -> Plan:
    """:func:`make_plan` on calls already read."""
    from collsynth.runtimes import xml_dialect

    runtime = xml_dialect(options.runtime).name
    say = progress or (lambda line: None)
    n = topology.num_ranks
    if run.world_size > n:
        raise InvalidTopologyError(
            f"the trace in {run.directory} has {run.world_size} ranks but topology "
            f"{topology.name!r} has {n}; pass --nodes to compose several nodes")
    notes: list[str] = []
    missing = sorted(set(range(run.world_size)) - set(run.ranks))
    if missing:
        shown = ", ".join(map(str, missing[:16])) + (" ..." if len(missing) > 16 else "")
        notes.append(f"{len(missing)} rank(s) have no trace file ({shown}): each group's calls "
                     "are counted on its lowest traced rank")
    if run.world_size < n:
        notes.append(f"the trace has {run.world_size} ranks, the topology {n}: global rank r is "
                     f"rank r of {topology.name}")
    machine = options.calibration.apply(topology) if options.calibration is not None \
        else topology
    if options.calibration is not None:
        notes.append(f"calibrated: {machine.alpha_us:.4g} us per step, {machine.unit_gbps:.4g} "
                     f"GB/s per bandwidth unit (from {options.calibration_file or 'a calibration'}"
                     ")")
    gamma = 0.0
    if options.device is not None:
        from collsynth.timing.kernels import reduce_gamma_us_per_byte

        gamma = reduce_gamma_us_per_byte(options.device)
        notes.append(f"reductions charged {gamma:.3g} us/byte ({options.device}): by the "
                     "closed form to synthesized algorithms only (NCCL's model charges none); "
                     "by the program model to both sides")
    constants = _plan_constants(runtime, options, gamma, notes)

    keyed, not_planned = _classify(run)
    entries, xml_files = _plan_entries(keyed, run, machine, runtime, options, gamma, constants,
                                       say)
    ranks = _rank_steps(run, {(_key_of(e)): e for e in entries})
    return Plan(run.directory, run.world_size, topology.name, nodes, runtime,
                options.calibration_file, options.device, tuple(entries), tuple(not_planned),
                tuple(ranks), tuple(xml_files), tuple(notes), options.synth.time_limit,
                options.model, options.runtime_constants_file)


def _plan_constants(runtime: str, options: PlanOptions, gamma: float, notes: list[str]
                    ) -> "RuntimeConstants | None":
    """The program model's constants: the plan's runtime-constants calibration, else the
    runtime's documented defaults; a ``--device`` gamma where they charge no reduction. Notes
    how the runtime's own algorithms are priced (its settings, its version)."""
    from collsynth.runtimes import get_runtime

    if not options.runtime_settings.default:
        notes.append(f"the runtime's own algorithms are narrowed by the job's "
                     f"{options.runtime_settings.describe()} "
                     "(docs/runtime-tuning.md, \"Settings\")")
    if options.model == "closed-form":
        return None
    constants = options.runtime_constants
    if constants is None:
        constants = get_runtime(runtime).defaults
        where = f"{runtime}'s documented defaults"
    else:
        where = f"the runtime constants of {options.runtime_constants_file or 'a calibration'}"
    if gamma and not constants.gamma_us_per_byte:
        constants = constants.replace(gamma_us_per_byte=gamma)
    notes.append(f"program model: {where} (base latency "
                 + ", ".join(f"{p} {constants.base_latency(p):g}" for p in ("LL", "LL128",
                                                                            "Simple"))
                 + " us); both sides of a program-model entry are priced with them")
    if options.runtime_version is not None:
        family = get_runtime(runtime).family
        notes.append(f"the runtime's own algorithms are priced as {family} "
                     f"{options.runtime_version[0]}.{options.runtime_version[1]} runs them (the "
                     "calibration's version; docs/runtime-tuning.md, \"Versions\")")
    return constants


_Key = tuple  # (collective, group, root)


def _key_of(entry: PlanEntry) -> _Key:
    return (entry.collective, entry.group, entry.root)


def _representative(group: Sequence[int], traced: set[int]) -> int | None:
    present = [r for r in group if r in traced]
    return min(present) if present else None


def _not_planned_reason(call: TracedCall) -> str | None:
    if call.error is not None:
        return "the call raised an error"
    if call.kind in _REASONS:
        return _REASONS[call.kind]
    if call.kind not in PLANNED_KINDS:
        return f"kind {call.kind!r} is not planned"
    if len(call.group) < 2:
        return "a one-rank group: nothing to communicate"
    if call.kind == "alltoall" and call.uneven:
        return "uneven split sizes (an alltoallv): a synthesized alltoall moves equal blocks"
    if call.kind in _COMBINING and call.op in ("avg", "premul_sum"):
        return (f"reduction {call.op}: MSCCL runtimes leave ncclAvg and custom operators to NCCL "
                "(docs/msccl-xml.md §4.5)")
    if call.kind in _ROOTED and (call.root is None or call.root not in call.group):
        return f"root {call.root!r} is not a rank of the group"
    return None


def _classify(run: TracedRun) -> tuple[dict[_Key, list[TracedCall]], list[NotPlanned]]:
    """Planned calls by (collective, group, root), counted on each group's lowest traced rank;
    the others summed by (kind, group, reason)."""
    traced = set(run.ranks)
    keyed: dict[_Key, list[TracedCall]] = defaultdict(list)
    skipped: dict[tuple[str, tuple[int, ...], str], list[int]] = {}
    for rank in run.ranks:
        for call in run.calls[rank]:
            if _representative(call.group, traced) != rank:
                continue
            reason = _not_planned_reason(call)
            if reason is None:
                root = call.root if call.kind in _ROOTED else None
                keyed[(call.kind, call.group, root)].append(call)
            else:
                stats = skipped.setdefault((call.kind, call.group, reason), [0, 0])
                stats[0] += 1
                stats[1] += call.size_bytes
    not_planned = [NotPlanned(kind, group, calls, size, reason)
                   for (kind, group, reason), (calls, size) in sorted(skipped.items())]
    return dict(keyed), not_planned


def _signature(topology: Topology) -> tuple[Any, ...]:
    """What makes two groups' plans the same (links, groups, figures, network)."""
    return plan_signature(topology)


def _plan_entries(keyed: dict[_Key, list[TracedCall]], run: TracedRun, machine: Topology,
                  runtime: str, options: PlanOptions, gamma: float,
                  constants: "RuntimeConstants | None",
                  say: Callable[[str], None]) -> tuple[list[PlanEntry], list[XmlFile]]:
    # Group the keys the runtime cannot tell apart: same collective, same number of ranks.
    by_runtime: dict[tuple[str, int], list[_Key]] = defaultdict(list)
    for key in keyed:
        by_runtime[(key[0], len(key[1]))].append(key)
    entries: list[PlanEntry] = []
    xml_files: list[XmlFile] = []
    for (collective, size), keys in sorted(by_runtime.items()):
        keys.sort(key=lambda k: (-sum(c.size_bytes for c in keyed[k]), -len(keyed[k]), k[1]))
        topologies = {k: topology_for_group(machine, k[1]) for k in keys}
        roots = {None if k[2] is None else k[1].index(k[2]) for k in keys}
        blocked = None
        if len(roots) > 1:
            blocked = (f"{collective} is traced with {len(roots)} different roots on groups of "
                       f"{size} ranks; an MSCCL XML has no root, so the runtime would run every "
                       "root's calls with one root's schedule")
        # One plan per distinct group topology; the first (most bytes) owns the XML files.
        owner = keys[0]
        plans: dict[tuple[Any, ...], Any] = {}
        owner_sig = _signature(topologies[owner])
        for key in keys:
            sig = _signature(topologies[key])
            if sig not in plans:
                plans[sig] = _plan_one(key, topologies[key], keyed, keys, topologies, runtime,
                                       options, gamma, constants, blocked, sig == owner_sig,
                                       say, xml_files)
            (candidates, ranges, synthesis, nccl_note, nchunks, excluded, yardstick,
             yardstick_note) = plans[sig]
            owner_exports = any(r.xml is not None for r in plans[owner_sig][1])
            status, reason = _status(owner, sig != owner_sig and owner_exports, ranges,
                                     blocked, candidates, nccl_note, synthesis, excluded)
            entries.append(PlanEntry(collective, key[1], key[2], topologies[key].name, status,
                                     reason, tuple(candidates), ranges, (), synthesis,
                                     nccl_note, nchunks, runtime, excluded, yardstick,
                                     yardstick_note))
    _limit_msccl(entries, xml_files, keyed, runtime)
    entries = [dataclasses.replace(e, buckets=_buckets(e, keyed[_key_of(e)])) for e in entries]
    return entries, xml_files


def _status(owner: _Key, shared: bool, ranges: Sequence[RangePlan], blocked: str | None,
            candidates: Sequence[Candidate], nccl_note: str, synthesis: str,
            excluded: Mapping[str, str]) -> tuple[str, str]:
    if blocked is not None:
        return "nccl", blocked
    exported = [r for r in ranges if r.xml is not None]
    if shared:
        return "shared", (f"the runtime selects by collective and rank count only: calls of "
                          f"this group in the planned ranges run the XML planned for group "
                          f"{list(owner[1])}, whose links differ (time not modelled; counted "
                          "as NCCL's)")
    if exported:
        return "planned", ""
    if not any(c.source == NCCL for c in candidates):
        return "nccl", nccl_note
    if not any(c.source != NCCL for c in candidates):
        return "nccl", synthesis
    if all(c.name in excluded for c in candidates if c.source != NCCL):
        return "nccl", "no synthesized algorithm can run a traced call: " + "; ".join(
            f"{name}: {why}" for name, why in excluded.items())
    winners = [r for r in ranges if r.winner != NCCL]
    if winners:
        return "nccl", "; ".join(sorted({r.note for r in winners if r.note})) or \
            "synthesized algorithms win only at sizes no traced call has"
    return "nccl", "NCCL is predicted fastest at every size"


def _plan_one(key: _Key, topology: Topology, keyed: dict[_Key, list[TracedCall]],
              keys: Sequence[_Key], topologies: Mapping[_Key, Topology], runtime: str,
              options: PlanOptions, gamma: float, constants: "RuntimeConstants | None",
              blocked: str | None, own: bool,
              say: Callable[[str], None], xml_files: list[XmlFile]
              ) -> tuple[list[Candidate], tuple[RangePlan, ...], str, str, dict[str, int],
                         dict[str, str], str, str]:
    from collsynth.plan.yardstick import (PLAN_BOUNDARY_STEPS, TUNE_ERRORS, line_candidates,
                                          measured_candidate, plan_layouts, runtime_candidates,
                                          sample_sizes, sampled_price, tuned_candidate)
    from collsynth.runtimes import get_runtime
    from collsynth.timing.closed_form import ClosedForm, Measured
    from collsynth.timing.pricing import MEASURED, RuntimeAlgorithm
    from collsynth.timing.program_model import ProgramModel

    collective_name, group, root = key
    n = len(group)
    local_root = None if root is None else group.index(root)
    sig = _signature(topology)
    sizes = [(c.size_bytes, c.element_size) for k in keys if _signature(topologies[k]) == sig
             for c in keyed[k]]
    rt = get_runtime(runtime).at_version(options.runtime_version) \
        .with_settings(options.runtime_settings)
    closed = ClosedForm(gamma_us_per_byte=gamma)   # the topology carries the calibration's figures
    program = ProgramModel(constants, runtime=rt, topology=topology) \
        if constants is not None else None
    why_closed = "the closed form was asked for" if program is None else \
        _program_model_reason(program, rt, collective_name, topology)
    model = closed if why_closed is not None else program
    samples: tuple[int, ...] = ()
    if model is program:
        samples = sample_sizes(s for s, _ in sizes)
        nccl, _ = runtime_candidates(program, rt, collective_name, topology, samples)
        nccl_note = ("the runtime: " + " or ".join(f"{c.name} ({c.detail})" for c in nccl) +
                     ", priced by the program model with the plan's runtime constants")
        if options.calibration is not None and \
                options.calibration.entries_for(collective_name, ranks=n):
            nccl_note += ("; the calibration's measured NCCL line is not used (one yardstick: a "
                          "runtime-constants calibration, collsynth calibrate --model program, "
                          "fits the program model to a measured curve)")
    else:
        # the closed form has NCCL's own tuning constants
        nccl_runtime = get_runtime("nccl").at_version(options.runtime_version) \
            .with_settings(options.runtime_settings)
        measured = RuntimeAlgorithm(nccl_runtime, MEASURED, collective_name, topology)
        fitted = Measured(options.calibration, source=options.calibration_file or "") \
            if options.calibration is not None else None
        if fitted is not None and fitted.why_not(measured) is None:
            nccl = [measured_candidate(fitted, measured)]
            nccl_note = f"NCCL: the calibration's measured {collective_name} line on {n} ranks"
        else:
            nccl, why_not = runtime_candidates(closed, nccl_runtime, collective_name, topology,
                                               ())
            if nccl:
                setup = closed.nccl_setup(topology)
                nccl_note = (f"NCCL: {len(setup.rings)} ring channel(s), {setup.bus_gbps:g} GB/s "
                             "bus bandwidth")
            elif why_not:
                nccl_note = f"NCCL not modelled: {why_not[0]}"
            else:
                nccl_note = (f"NCCL not modelled: NCCL runs {collective_name} as grouped "
                             "send/recv, outside its ring/tree tuning model (a calibration "
                             "with a fit of it gives a baseline)")
    synthesis = ""
    found: tuple[Any, ...] = ()
    if blocked is not None:
        synthesis = "not synthesized: " + blocked
    elif not own:
        synthesis = ("not synthesized: the runtime cannot tell this group from the group of "
                     "the same collective and size that is planned")
    elif not nccl:
        synthesis = "not synthesized: no NCCL baseline to compare with"
    else:
        collective = standard_collective(collective_name, n, root=local_root)
        say(f"synthesizing {collective.describe()} on {topology.name}")
        outcome = synthesize_front(topology, collective, options=options.synth,
                                   cache=options.cache)
        synthesis = outcome.note
        found = outcome.algorithms
    # Each algorithm is lowered once first: its nchunksperloop decides which calls the runtime
    # would give it, and one the runtime cannot express is left out rather than failing the plan.
    nchunks: dict[str, int] = {}
    excluded: dict[str, str] = {}
    probes: dict[str, XmlFile] = {}
    for algorithm in found:
        try:
            probe = _export(algorithm, algorithm.name + ".xml", collective_name, n, local_root,
                            runtime, options, 0, None)
        except ExportError as exc:
            excluded[algorithm.name] = f"cannot be exported for {runtime}: {exc}"
            continue
        nchunks[algorithm.name] = probe.nchunksperloop
        probes[algorithm.name] = probe
        if not options.all_ranges and not any(
                count_fits(size, width, probe.nchunksperloop, runtime=runtime,
                            collective=collective_name, ranks=n) for size, width in sizes):
            excluded[algorithm.name] = (f"no traced call's element count is a multiple of its "
                                        f"nchunksperloop ({probe.nchunksperloop}): the runtime "
                                        "would never select it")
    tuned: dict[str, Any] = {}
    if model is closed:
        algorithms = line_candidates(closed, found)
        candidates = nccl + algorithms
        ranges = choose_ranges([c for c in candidates if c.name not in excluded])
    else:
        algorithms = []
        for algorithm in found:
            probe = probes.get(algorithm.name)
            if probe is not None and algorithm.name not in excluded:
                say(f"tuning {algorithm.name} for {runtime} on {topology.name}")
                try:
                    candidate, tuned[algorithm.name] = tuned_candidate(
                        program, algorithm, samples,
                        layouts=plan_layouts(probe.channels, probe.channel_by,
                                             algorithm.num_sends),
                        inplace=probe.inplace, outofplace=probe.outofplace)
                except TUNE_ERRORS as exc:
                    excluded[algorithm.name] = f"the program model cannot price it: {exc}"
                else:
                    algorithms.append(candidate)
                    continue
            # Left out: shown with its closed form (never chosen), labelled as such.
            algorithms += line_candidates(closed, [algorithm])
        candidates = nccl + algorithms
        price = sampled_price(program, rt, collective_name, topology,
                              {a.name: a for a in found if a.name in tuned})
        ranges = choose_sampled_ranges([c for c in candidates if c.name not in excluded],
                                       price=price, steps=PLAN_BOUNDARY_STEPS)
    planned: list[RangePlan] = []
    for r in ranges:
        planned += _export_range(r, candidates, sizes, collective_name, n, local_root, group,
                                 runtime, options, own, xml_files, nchunks, say,
                                 tuned=tuned.get(r.choice), probe=probes.get(r.choice))
    return (candidates, tuple(planned), synthesis, nccl_note, nchunks, excluded, model.name,
            why_closed or "")


def _program_model_reason(model: "ProgramModel", runtime: "Runtime", collective: str,
                          topology: Topology) -> str | None:
    """``None`` when the program model prices at least one of the runtime's own algorithms for
    ``collective`` on ``topology`` (the plan then prices both sides with it); else why not."""
    from collsynth.timing.pricing import runtime_algorithms

    reasons = [model.why_not(s) for s in runtime_algorithms(runtime, collective, topology)]
    if not reasons:
        return (f"{collective}: the runtime runs it outside its own ring/tree algorithms, so "
                "neither is written as a program")
    if any(r is None for r in reasons):
        return None
    return reasons[0]


def _export_range(r: SizeRange, candidates: Sequence[Candidate],
                  sizes: Sequence[tuple[int, int | None]], collective: str, n: int,
                  local_root: int | None, group: Sequence[int], runtime: str,
                  options: PlanOptions, own: bool, xml_files: list[XmlFile],
                  nchunks: dict[str, int], say: Callable[[str], None], *,
                  tuned: Any = None, probe: XmlFile | None = None) -> list[RangePlan]:
    """The plan of one range of the envelope: one :class:`RangePlan` per program (with a
    ``tuned`` export, one per tuned sub-range it overlaps, each run by that sub-range's layout),
    and one more when msccl's ``maxBytes`` cannot reach the end of the range (the rest stays
    NCCL's)."""
    if r.choice == NCCL:
        return [RangePlan(r.min_bytes, r.max_bytes, NCCL, NCCL)]
    if not own:
        return [RangePlan(r.min_bytes, r.max_bytes, r.choice, NCCL,
                          note="another group of this collective and size owns the XML files")]
    if tuned is None:
        return _export_piece(r.min_bytes, r.max_bytes, r.choice, None, candidates, sizes,
                             collective, n, local_root, group, runtime, options, xml_files,
                             nchunks, say)
    result: list[RangePlan] = []
    for t in tuned.ranges:
        lo = max(r.min_bytes, t.min_bytes)
        hi = t.max_bytes if r.max_bytes is None else (
            r.max_bytes if t.max_bytes is None else min(r.max_bytes, t.max_bytes))
        if hi is not None and hi < lo:
            continue
        result += _export_piece(lo, hi, r.choice, (t.variant, probe), candidates, sizes,
                                collective, n, local_root, group, runtime, options, xml_files,
                                nchunks, say)
    end = result[-1].max_bytes if result else r.min_bytes - 1
    if end is not None and (r.max_bytes is None or end < r.max_bytes):
        # msccl: the tuned export stops at its last maxBytes (it cannot say "unlimited").
        result.append(RangePlan(end + 1, r.max_bytes, r.choice, NCCL,
                                note="above the largest size the msccl XML is given (maxBytes)"))
    return result


def _export_piece(lo: int, hi: int | None, choice: str, fixed: Any,
                  candidates: Sequence[Candidate], sizes: Sequence[tuple[int, int | None]],
                  collective: str, n: int, local_root: int | None, group: Sequence[int],
                  runtime: str, options: PlanOptions, xml_files: list[XmlFile],
                  nchunks: dict[str, int], say: Callable[[str], None]) -> list[RangePlan]:
    """Sizes ``lo..hi`` run by ``choice``: its XML file (``fixed``: the tuned (variant, probe)
    to lower with), or NCCL with a note when no traced call could run it."""
    inside = [(s, d) for s, d in sizes if lo <= s and (hi is None or s <= hi)]
    variant = "" if fixed is None else fixed[0].label
    if not inside and not options.all_ranges:
        return [RangePlan(lo, hi, choice, NCCL, variant=variant,
                          note="synthesized algorithms win only at sizes no traced call has")]
    if hi is not None and hi < 1:
        return [RangePlan(lo, hi, choice, NCCL, note="empty calls only", variant=variant)]
    max_bytes = hi
    rest: list[RangePlan] = []
    if runtime == "msccl" and max_bytes is None:
        # msccl cannot say "unlimited" (and sizes its scratch buffer by maxBytes): the XML
        # stops at 128 MiB (msccl's default) or at the largest traced size above it.
        max_bytes = max([MSCCL_DEFAULT_MAX_BYTES - 1] + [s for s, _ in inside])
        rest = [RangePlan(max_bytes + 1, None, choice, NCCL,
                          note="above the largest size the msccl XML is given (maxBytes)")]
    candidate = next(c for c in candidates if c.name == choice)
    algorithm = candidate.algorithm
    assert algorithm is not None
    name = _xml_name(algorithm.name, group, lo, max_bytes)
    xml = _export(algorithm, name, collective, n, local_root, runtime, options, lo, max_bytes,
                  fixed=fixed)
    if inside and not any(count_fits(s, d, xml.nchunksperloop, runtime=runtime,
                                      collective=collective, ranks=n) for s, d in inside):
        return [RangePlan(lo, hi, choice, NCCL, variant=variant,
                          note="no traced call in the range has an element count that is a "
                               "multiple of the program's nchunksperloop (the runtime would "
                               "fall back to NCCL)")]
    xml_files.append(xml)
    nchunks.setdefault(choice, xml.nchunksperloop)
    say(f"exported {name}")
    return [RangePlan(lo, max_bytes, choice, choice, xml=name, variant=variant,
                      nchunksperloop=xml.nchunksperloop)] + rest


def _xml_name(algorithm: str, group: Sequence[int], lo: int, hi: int | None) -> str:
    ordered = list(group)
    if ordered == list(range(ordered[0], ordered[0] + len(ordered))):
        label = f"g{ordered[0]}-{ordered[-1]}"
    else:
        label = "g" + "_".join(map(str, ordered[:8])) + ("_etc" if len(ordered) > 8 else "")
    stem = f"{algorithm}-{label}-{lo}B-{'inf' if hi is None else f'{hi}B'}"
    return re.sub(r"[^A-Za-z0-9._-]", "_", stem) + ".xml"


def _export(algorithm: Any, name: str, collective: str, n: int, local_root: int | None,
            runtime: str, options: PlanOptions, min_bytes: int, max_bytes: int | None, *,
            fixed: Any = None) -> XmlFile:
    """Lower, check and render one range's program (nothing is written here), on the fewest
    channels (1, 2, 4, ..., 32; by chunk, then by peer) that meet the runtime's limits; or, with
    ``fixed`` = (a tuned :class:`~collsynth.timing.tune.Variant`, the probe :class:`XmlFile`
    whose layouts it was tuned with), exactly that variant."""
    from collsynth.export.pipeline import AUTO_CHANNELS, check_exported, check_text
    from collsynth.export.limits import estimate_limits, limit_error
    from collsynth.export.lower import lower
    from collsynth.export.xml_writer import write_program

    torch_inplace = collective in TORCH_IN_PLACE
    layouts = [(torch_inplace, not torch_inplace)]
    if runtime != "msccl":
        layouts.insert(0, (True, True))  # rccl / msccl-executor: declare both when possible
    choices: Sequence[tuple[int, str]] = AUTO_CHANNELS
    proto, instances = options.proto, 1
    if fixed is not None:
        variant, probe = fixed
        layouts = [(probe.inplace, probe.outofplace)]
        choices = [(variant.channels, variant.channel_by)]
        proto, instances = variant.protocol, variant.instances
    error: ExportError | None = None
    for inplace, outofplace in layouts:
        for channels, channel_by in choices:
            over = estimate_limits(algorithm, runtime, channels=channels, instances=instances,
                                   inplace=inplace, outofplace=outofplace,
                                   channel_by=channel_by)
            if over:  # certainly over a limit: more channels may help
                error = limit_error(over, f"the program on {channels} channel(s)",
                                    before_lowering=True)
                continue
            try:
                program = lower(algorithm, runtime=runtime, proto=proto, channels=channels,
                                channel_by=channel_by, instances=instances, inplace=inplace,
                                outofplace=outofplace,
                                min_bytes=min_bytes, max_bytes=max_bytes, name=name[:-4])
                check_exported(program, runtime, algorithm)
                text = write_program(program, runtime)
                check_text(text, runtime)
            except ExportError as exc:
                error = exc
                if getattr(exc, "violations", None):
                    continue  # a limit: try more channels
                break  # anything else: try the next layout
            return XmlFile(name, text, collective, n, local_root, program.nchunksperloop,
                           inplace, outofplace, channels, channel_by)
    assert error is not None
    raise ExportError(f"{name}: {error}") from error


def _limit_msccl(entries: list[PlanEntry], xml_files: list[XmlFile],
                 keyed: dict[_Key, list[TracedCall]], runtime: str) -> None:
    """msccl loads at most 4 algorithms: keep the 4 with the largest predicted saving."""
    if runtime != "msccl" or len(xml_files) <= MSCCL_MAX_ALGORITHMS:
        return
    saving: dict[str, Fraction] = defaultdict(Fraction)
    for entry in entries:
        for call in keyed[_key_of(entry)]:
            nccl, plan, choice, _ = entry.predict(call.size_bytes, call.element_size)
            if choice != NCCL and nccl is not None and plan is not None:
                r = next(r for r in entry.ranges if r.contains(call.size_bytes))
                saving[r.xml or ""] += nccl - plan
    ranked = sorted(xml_files, key=lambda x: (-saving.get(x.name, Fraction(0)), x.name))
    dropped = {x.name for x in ranked[MSCCL_MAX_ALGORITHMS:]}
    _log.info("msccl loads at most %d algorithms; left out: %s", MSCCL_MAX_ALGORITHMS,
              ", ".join(sorted(dropped)))
    xml_files[:] = [x for x in xml_files if x.name not in dropped]
    note = (f"msccl loads at most {MSCCL_MAX_ALGORITHMS} algorithms (MSCCL_MAX_NUM_ALGOS); the "
            f"{MSCCL_MAX_ALGORITHMS} with the largest predicted saving were kept")
    for i, entry in enumerate(entries):
        ranges = tuple(dataclasses.replace(r, choice=NCCL, xml=None, note=note)
                       if r.xml in dropped else r for r in entry.ranges)
        if ranges != entry.ranges:
            status, reason = entry.status, entry.reason
            if not any(r.xml for r in ranges) and status != "nccl":
                status, reason = "nccl", note
            entries[i] = dataclasses.replace(entry, ranges=ranges, status=status, reason=reason)


def _buckets(entry: PlanEntry, calls: Sequence[TracedCall]) -> tuple[BucketRow, ...]:
    rows: dict[tuple[int, int], dict[str, Any]] = {}
    for call in calls:
        bucket = size_bucket(call.size_bytes)
        row = rows.setdefault(bucket, {"calls": 0, "bytes": 0, "nccl": Fraction(0),
                                       "plan": Fraction(0), "modelled": True, "choices": {},
                                       "fallback": 0, "measured": 0.0, "timed": 0})
        nccl, plan, choice, fallback = entry.predict(call.size_bytes, call.element_size)
        row["calls"] += 1
        row["bytes"] += call.size_bytes
        if nccl is None or plan is None:
            row["modelled"] = False
        else:
            row["nccl"] += nccl
            row["plan"] += plan
        row["choices"][choice] = None
        row["fallback"] += int(fallback)
        if call.duration_us is not None:
            row["measured"] += call.duration_us
            row["timed"] += 1
    result = []
    for bucket in sorted(rows):
        row = rows[bucket]
        modelled = row["modelled"]
        result.append(BucketRow(
            bucket, row["calls"], row["bytes"],
            float(row["nccl"]) if modelled else None, float(row["plan"]) if modelled else None,
            tuple(row["choices"]), row["fallback"],
            row["measured"] if row["timed"] == row["calls"] else None))
    return tuple(result)


def _rank_steps(run: TracedRun, entries: Mapping[_Key, PlanEntry]) -> list[RankSteps]:
    result = []
    for rank in run.ranks:
        calls = run.calls[rank]
        structure = find_steps([c.signature for c in calls])
        window = calls[structure.setup:structure.setup + structure.steps * structure.period] \
            if structure.found else calls
        nccl = plan = Fraction(0)
        unmodelled = 0
        measured = 0.0
        timed = 0
        for call in window:
            if call.duration_us is not None:
                measured += call.duration_us
                timed += 1
            root = call.root if call.kind in _ROOTED else None
            entry = entries.get((call.kind, call.group, root))
            if entry is None or _not_planned_reason(call) is not None:
                unmodelled += 1
                continue
            t_nccl, t_plan, _, _ = entry.predict(call.size_bytes, call.element_size)
            if t_nccl is None or t_plan is None:
                unmodelled += 1
                continue
            nccl += t_nccl
            plan += t_plan
        steps = structure.steps
        result.append(RankSteps(rank, structure, len(window) / steps, float(nccl) / steps,
                                float(plan) / steps, unmodelled / steps,
                                measured / steps if window and timed == len(window) else None))
    return result
