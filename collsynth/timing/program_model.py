"""The program model as a pricing model: every subject simulated as the runtime runs it.

:class:`ProgramModel` prices an MSCCL program, a synthesized algorithm after lowering (as
``collsynth export`` writes it, or tuned: :func:`collsynth.timing.tune.tune_export`), and the
runtime's own algorithms written as programs or switch graphs
(:mod:`collsynth.timing.runtime_programs`), all with the same constants
(:mod:`collsynth.timing.runtime_model`; docs/runtime-model.md).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

from collsynth.algorithm.model import Algorithm
from collsynth.errors import InvalidInstanceError, UnknownNameError
from collsynth.export.program import Program
from collsynth.runtimes import MSCCL_XML, Runtime, RuntimeConstants, get_runtime, runtime_names
from collsynth.timing.metrics import bandwidths
from collsynth.timing.pricing import (MEASURED, PRICING_FAILURES, Price, RuntimeAlgorithm,
                                      Subject, subject_name)
from collsynth.timing.runtime_model import (PreparedProgram, SimulationOptions, indirect_note,
                                            prepare_program, simulate_program)
from collsynth.timing.runtime_programs import RUNTIME_PROGRAMS

if TYPE_CHECKING:  # pragma: no cover - imported for annotations only
    from collsynth.timing.tune import TunedExport
    from collsynth.topology.model import Topology

__all__ = ["ProgramModel", "TuneOptions"]


@dataclass(frozen=True, kw_only=True)
class TuneOptions:
    """How :class:`ProgramModel` tunes an algorithm before pricing it (keyword-only; the
    options of :func:`collsynth.timing.tune.tune_export`): ``layouts`` (channels, policy) and
    ``instances`` tried (``None``: tune_export's defaults), buffer ``inplace`` /
    ``outofplace``."""

    layouts: tuple[tuple[int, str], ...] | None = None
    instances: tuple[int, ...] | None = None
    inplace: bool = False
    outofplace: bool = True


class ProgramModel:
    """The runtime executing programs, simulated (a :class:`~collsynth.timing.pricing.PricingModel`).

    Parameters
    ----------
    constants:
        The runtime's constants: its documented ones (``get_runtime(name).defaults``) or a
        calibration's.
    runtime:
        The runtime whose XML an algorithm is lowered for and whose protocols its own algorithms
        choose among (default: the constants' runtime; one that loads no XML lowers as msccl).
    topology:
        The machine programs run on (ranks in order); an algorithm's own topology by default.
        An MSCCL program has none of its own, so it needs this.
    options:
        The simulation's own knobs.
    tune:
        Tune each algorithm (:class:`TuneOptions`) and price each size with the tuned range that
        holds it; ``None``: the untuned export.
    source:
        Where the constants were read from, for :attr:`provenance`.

    >>> from collsynth.runtimes import get_runtime
    >>> from collsynth.timing.pricing import runtime_algorithms
    >>> from collsynth.topology import get_topology
    >>> from collsynth.topology.builtins import with_figures
    >>> ring4 = with_figures(get_topology("ring:4"), unit_gbps=10.0, alpha_us=2.0)
    >>> ring, = runtime_algorithms(get_runtime("nccl"), "allgather", ring4)
    >>> model = ProgramModel(get_runtime("nccl").defaults)
    >>> [(p.subject, p.protocol) for p in model.price(ring, [1024, 1 << 30])]
    [('nccl-ring', 'LL'), ('nccl-ring', 'Simple')]
    """

    name = "program-model"

    def __init__(self, constants: RuntimeConstants, *, runtime: Runtime | None = None,
                 topology: "Topology | None" = None,
                 options: SimulationOptions = SimulationOptions(),
                 tune: TuneOptions | None = None, source: str = "") -> None:
        if not isinstance(constants, RuntimeConstants):
            raise InvalidInstanceError("ProgramModel: constants must be RuntimeConstants")
        if runtime is None:
            try:
                runtime = get_runtime(constants.runtime)
            except UnknownNameError:  # constants of a runtime collsynth does not know
                runtime = get_runtime("nccl")
        self.constants = constants
        self.runtime = runtime
        self.topology = topology
        self.options = options
        self.tune = tune
        self.source = source
        self._prepared: dict[tuple, tuple[object, PreparedProgram]] = {}
        self._tuned: dict[int, tuple[Algorithm, "TunedExport"]] = {}

    @property
    def provenance(self) -> str:
        return f"{self.constants.runtime} constants ({self.source or 'documented'})"

    @property
    def export_runtime(self) -> str:
        """The runtime an algorithm is lowered for: this one when it loads MSCCL XML, else
        msccl (whose interpreter runs NCCL's kernels)."""
        if self.runtime.name in runtime_names(MSCCL_XML):
            return self.runtime.name
        return "msccl"

    def where(self, subject: Subject) -> "Topology | None":
        """The topology ``subject`` is priced on."""
        if isinstance(subject, Algorithm):
            return self.topology if self.topology is not None else subject.topology
        if isinstance(subject, RuntimeAlgorithm):
            return subject.topology
        return self.topology

    # -- the interface --------------------------------------------------------------------------

    def why_not(self, subject: Subject) -> str | None:
        topology = self.where(subject)
        if isinstance(subject, Program) and topology is None:
            return (f"program {subject.name!r}: an MSCCL program needs a topology (its ranks map "
                    "to the topology's ranks in order)")
        if isinstance(subject, RuntimeAlgorithm):
            why = self._runtime_why_not(subject)
            if why is not None:
                return why
        ranks = (subject.ngpus if isinstance(subject, Program) else
                 subject.topology.num_ranks if isinstance(subject, Algorithm) else None)
        if ranks is not None and topology is not None and ranks != topology.num_ranks:
            return (f"{subject_name(subject)} has {ranks} ranks but topology {topology.name!r} "
                    f"has {topology.num_ranks}")
        if topology is not None and topology.unit_gbps is None:
            return f"topology {topology.name!r} has no physical figures (unit_gbps)"
        return None

    def price(self, subject: Subject, sizes: Sequence[int]) -> tuple[Price, ...]:
        why = self.why_not(subject)
        if why is not None:
            raise InvalidInstanceError(why)
        if isinstance(subject, RuntimeAlgorithm):
            return self._price_runtime(subject, sizes)
        if isinstance(subject, Algorithm) and (self.tune is not None or
                                               self._tuned.get(id(subject), (None,))[0] is subject):
            return self._price_tuned(subject, sizes)
        program = subject if isinstance(subject, Program) else self.lower(subject)
        prepared = self.prepare(program, self.where(subject))
        name = subject_name(subject)
        return tuple(self._price(name, prepared, size) for size in sizes)

    # -- what it simulates ----------------------------------------------------------------------

    def lower(self, algorithm: Algorithm) -> Program:
        """``algorithm`` as ``collsynth export`` writes it for :attr:`export_runtime`.

        Raises
        ------
        ExportError
            The runtime cannot express it, or a limit is exceeded.
        """
        from collsynth.export.pipeline import export_programs

        runtime = self.export_runtime
        exported = export_programs(algorithm, [runtime], subject=algorithm.name or "algorithm")
        return dataclasses.replace(exported[runtime].program,
                                   name=algorithm.name or exported[runtime].program.name)

    def prepare(self, program: Program, topology: "Topology") -> PreparedProgram:
        """``program`` prepared on ``topology`` (once: later calls reuse it)."""
        key = (id(program), id(topology))
        found = self._prepared.get(key)
        if found is None or found[0] is not program:
            found = self._prepared[key] = (program, prepare_program(program, topology))
        return found[1]

    def tuned_export(self, algorithm: Algorithm, sizes: Sequence[int],
                     options: TuneOptions | None = None) -> "TunedExport":
        """``algorithm`` tuned for :attr:`export_runtime` at ``sizes`` (``options``, default
        :attr:`tune`'s), once per algorithm: later prices of it, at any size, use the tuned range
        that holds the size.

        Raises
        ------
        ExportError
            No layout meets the runtime's limits.
        """
        from collsynth.timing.tune import tune_export

        found = self._tuned.get(id(algorithm))
        if found is not None and found[0] is algorithm:
            return found[1]
        tune = options or self.tune or TuneOptions()
        extra = {}
        if tune.layouts is not None:
            extra["layouts"] = tune.layouts
        if tune.instances is not None:
            extra["instances"] = tune.instances
        tuned = tune_export(algorithm, self.export_runtime, self.where(algorithm), sorted(sizes),
                            constants=self.constants, inplace=tune.inplace,
                            outofplace=tune.outofplace, name=algorithm.name, render=False,
                            options=self.options, **extra)
        self._tuned[id(algorithm)] = (algorithm, tuned)
        return tuned

    # -- helpers --------------------------------------------------------------------------------

    def _runtime_why_not(self, subject: RuntimeAlgorithm) -> str | None:
        if subject.algorithm == MEASURED:
            return "the program model simulates the runtime's algorithms; a measured curve is Measured's"
        family = subject.runtime.family
        entry = RUNTIME_PROGRAMS.get(subject.algorithm)
        if entry is None:
            return f"the program model has no program of {family}'s {subject.algorithm}"
        if subject.collective not in entry.collectives:
            if subject.algorithm == "tree":
                return f"no {family} tree for {subject.collective} (tree is allreduce only)"
            return (f"no {family} {subject.algorithm} for {subject.collective}: the runtime's own "
                    f"algorithm is written as a program for {', '.join(entry.collectives)} only")
        if subject.protocol is not None and subject.protocol not in entry.protocols:
            return (f"{family}'s {subject.algorithm} runs with {', '.join(entry.protocols)} only, "
                    f"not {subject.protocol}")
        if subject.topology.unit_gbps is None:
            return f"topology {subject.topology.name!r} has no physical figures (unit_gbps)"
        try:
            self._runtime_prepared(subject, subject.protocol or entry.protocols[-1])
        except PRICING_FAILURES as exc:
            return str(exc)
        return None

    def _channels(self, subject: RuntimeAlgorithm) -> int | None:
        """The subject's channels: pinned, else the calibration's ring count (ring, tree, PAT),
        else the table's default (:data:`~collsynth.timing.runtime_programs.RUNTIME_PROGRAMS`)."""
        if subject.channels is not None:
            return subject.channels
        entry = RUNTIME_PROGRAMS[subject.algorithm]
        if self.constants.channels is not None and entry.algorithm in ("ring", "tree", "pat"):
            return self.constants.channels
        key = ("channels", subject.algorithm, id(subject.topology))
        found = self._prepared.get(key)
        if found is None or found[0] is not subject.topology:
            found = self._prepared[key] = (subject.topology,  # type: ignore[assignment]
                                           entry.channels(subject.topology))
        return found[1]  # type: ignore[return-value]

    def _runtime_prepared(self, subject: RuntimeAlgorithm, protocol: str) -> PreparedProgram:
        """The subject's program (or graph) with ``protocol``, prepared once (raises what the
        builder or :func:`prepare_program` raises)."""
        channels = self._channels(subject)
        key = ("program", subject.algorithm, subject.collective, id(subject.topology), channels,
               protocol)
        found = self._prepared.get(key)
        if found is None or found[0] is not subject.topology:
            entry = RUNTIME_PROGRAMS[subject.algorithm]
            built = entry.build(subject.collective, subject.topology, channels, protocol)
            name = subject.runtime.family + "-" + subject.algorithm
            if isinstance(built, Program):
                prepared = prepare_program(dataclasses.replace(built, name=name),
                                           subject.topology)
            else:
                prepared = built
            found = self._prepared[key] = (subject.topology, prepared)
        return found[1]

    def _price_runtime(self, subject: RuntimeAlgorithm, sizes: Sequence[int]
                       ) -> tuple[Price, ...]:
        runs = RUNTIME_PROGRAMS[subject.algorithm].protocols
        found = []
        for size in sizes:
            if subject.protocol is not None:
                options: tuple[str, ...] = (subject.protocol,)
            else:
                chosen = self.constants.default_protocol(size)
                options = (chosen,) if chosen in runs else \
                    tuple(p for p in subject.runtime.protocols if p in runs) or runs
            best = min((self._price(subject.name, self._runtime_prepared(subject, p), size,
                                    protocol=p) for p in options), key=lambda t: t.time_us)
            found.append(best)
        return tuple(found)

    def _price_tuned(self, algorithm: Algorithm, sizes: Sequence[int]) -> tuple[Price, ...]:
        tuned = self.tuned_export(algorithm, sizes)
        name = subject_name(algorithm)
        found = []
        for size in sizes:
            try:
                r = tuned.range_of(size)
            except InvalidInstanceError:  # above an msccl export's last maxBytes: cannot run
                found.append(Price(name, int(size), math.inf, 0.0, 0.0, self.name,
                                   note="not run: above the export's last maxBytes"))
                continue
            prepared = r.prepared if r.prepared is not None else \
                self.prepare(r.program, self.where(algorithm))
            found.append(self._price(name, prepared, size, protocol=r.variant.protocol,
                                     note=f"tuned: {r.variant.label}"))
        return tuple(found)

    def _price(self, name: str, prepared: PreparedProgram, size: int, *,
               protocol: str | None = None, note: str = "") -> Price:
        t = simulate_program(prepared, None, size, self.constants, protocol=protocol,
                             options=self.options)
        program = prepared.program
        algbw, busbw = bandwidths(program.coll, program.ngpus, size, t.time_us)
        warning = indirect_note(prepared)
        if warning:
            note = f"{note}; {warning}" if note else warning
        return Price(name, int(size), t.time_us, algbw, busbw, self.name,
                     str(t.breakdown["protocol"]), program.nchannels, note)

