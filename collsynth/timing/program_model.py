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
    from collsynth.timing.tuning_model import TuningSetup
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
        self._on: dict[tuple, tuple[RuntimeConstants, "Topology", RuntimeConstants]] = {}

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
        # Built, not prepared: a builder refuses what it cannot write (a ring above the
        # simulated steps' bound); preparing (10 s on 512 ranks) at channels the sizes may not
        # use finds nothing more about the runtime's own programs. The verdict is kept. The
        # builders refuse alike at every protocol; the first is built without being prepared
        # (in Simple the tree's, PAT's and send/recv's graphs are prepared at once: 4.8 s for
        # NCCL's tree on 256 ranks).
        protocol = subject.protocol or entry.protocols[0]
        try:  # the channels a key resolves may be refused too
            built_key = self._runtime_key(subject, protocol)
        except PRICING_FAILURES as exc:
            return str(exc)
        key = ("verdict",) + built_key
        found = self._prepared.get(key)
        if found is None or found[0] is not subject.topology:
            try:
                # kept for the first price at the same key (an NVLS graph of 7344 GPUs takes
                # seconds to build and fold); taken, not copied, when priced
                self._prepared[("built",) + built_key] = (
                    subject.topology, self._runtime_built(subject, built_key))
                verdict = None
            except PRICING_FAILURES as exc:
                verdict = str(exc)
            found = self._prepared[key] = (subject.topology, verdict)  # type: ignore[assignment]
        return found[1]  # type: ignore[return-value]

    def _channels(self, subject: RuntimeAlgorithm) -> int | None:
        """The builder's count of the subject's channels when no size says otherwise: pinned,
        else the table's default (:data:`~collsynth.timing.runtime_programs.RUNTIME_PROGRAMS`).
        A calibration's channel count (the measured log's) only on a machine without facts,
        where the runtime's own channels cannot be derived; with facts, channels are the
        machine's and the size's (:meth:`runtime_choice`), never carried over. A pinned count
        and a calibration's are the runtime's channels, which the tree builds as
        :func:`_builder_channels` chains; the table's default is the builder's already."""
        if subject.channels is not None:
            return _builder_channels(subject, subject.channels)
        entry = RUNTIME_PROGRAMS[subject.algorithm]
        if self.constants.channels is not None and entry.algorithm in ("ring", "tree", "pat") \
                and self.tuning(subject.topology, subject.runtime) is None:
            return _builder_channels(subject, self.constants.channels)
        key = ("channels", subject.algorithm, id(subject.topology))
        found = self._prepared.get(key)
        if found is None or found[0] is not subject.topology:
            found = self._prepared[key] = (subject.topology,  # type: ignore[assignment]
                                           entry.channels(subject.topology))
        return found[1]  # type: ignore[return-value]

    def tuning(self, topology: "Topology", runtime: "Runtime | str") -> "TuningSetup | None":
        """The runtime's tuning setup on ``topology`` (:func:`~collsynth.timing.tuning_model.
        tuning_setup`; NCCL's for the MSCCL runtimes) at the runtime's version (a family name:
        this model's runtime's version when it is of that family), ``None`` when the machine's
        facts cannot set one up or name no GPU architecture (a ``ring:8``). Once per topology."""
        from collsynth.timing.tuning_model import SETUP_FAILURES, tuning_setup
        from collsynth.topology.machine import machine_facts

        if isinstance(runtime, Runtime):
            family, version, settings = runtime.family, runtime.version, runtime.settings
        else:
            family = runtime
            version, settings = (self.runtime.version, self.runtime.settings) \
                if family == self.runtime.family else (None, RuntimeSettings())
        family = family if family in ("nccl", "rccl") else "nccl"
        key = ("setup", family, version, settings, id(topology))
        found = self._prepared.get(key)
        if found is None or found[0] is not topology:
            try:
                setup = tuning_setup(topology, runtime=family, version=version,
                                     settings=settings) \
                    if machine_facts(topology).arch is not None else None
            except SETUP_FAILURES:  # no facts: no tuning
                setup = None
            found = self._prepared[key] = (topology, setup)  # type: ignore[assignment]
        return found[1]  # type: ignore[return-value]

    def constants_on(self, topology: "Topology | None", subject: Subject | None = None
                     ) -> RuntimeConstants:
        """:attr:`constants` as they apply on ``topology``: across nodes, the network's own
        hop latencies and base latency per call (the constants' when they were fitted on that
        network class, else its documented ones: ``CLASS_LATENCY_US``); for the runtime's own
        algorithms, each per-connection ceiling left open filled from the runtime's own tables
        (:func:`~collsynth.timing.tuning_model.connection_gbps`). docs/runtime-model.md."""
        c = self.constants
        if topology is None:
            return c
        runtime = subject.runtime if isinstance(subject, RuntimeAlgorithm) else None
        algorithm = subject.algorithm if isinstance(subject, RuntimeAlgorithm) else None
        key = (id(c), id(topology), runtime and (runtime.family, runtime.version, runtime.settings),
               algorithm)
        found = self._on.get(key)
        if found is not None and found[0] is c and found[1] is topology:
            return found[2]
        if len(self._on) > 64:
            self._on.clear()
        adjusted = _on_machine(c, topology, self.tuning(topology, runtime) if runtime else None,
                               algorithm)
        self._on[key] = (c, topology, adjusted)
        return adjusted

    def _runtime_prepared(self, subject: RuntimeAlgorithm, protocol: str,
                          channels: int | None = None, pipeline: int | None = None
                          ) -> PreparedProgram:
        """The subject's program (or graph) with ``protocol`` on ``channels`` (default:
        :meth:`_channels`) and, for a pipelined one, ``pipeline`` chunks per channel (default:
        the builder's), prepared once (raises what the builder or :func:`prepare_program`
        raises)."""
        key = self._runtime_key(subject, protocol, channels, pipeline)
        found = self._prepared.get(key)
        if found is None or found[0] is not subject.topology:
            kept = self._prepared.pop(("built",) + key, None)
            built = kept[1] if kept is not None and kept[0] is subject.topology else \
                self._runtime_built(subject, key)
            name = subject.runtime.family + "-" + subject.algorithm
            if isinstance(built, Program):
                prepared = prepare_program(dataclasses.replace(built, name=name),
                                           subject.topology)
            else:  # keep the runtime's name on a graph prepared by its builder
                prepared = dataclasses.replace(
                    built, program=dataclasses.replace(built.program, name=name))
            found = self._prepared[key] = (subject.topology, prepared)
        return found[1]

    def _runtime_key(self, subject: RuntimeAlgorithm, protocol: str,
                     channels: int | None = None, pipeline: int | None = None) -> tuple:
        """What the table's builder is given for the subject, as a cache key (the arguments as
        :meth:`_runtime_prepared`'s; defaults resolved)."""
        if channels is None:
            channels = self._channels(subject)
        entry = RUNTIME_PROGRAMS[subject.algorithm]
        if not entry.pipelined:
            pipeline = None
        spread = self._p2p_channels(subject) if entry.spread else None
        return ("program", subject.algorithm, subject.collective, id(subject.topology),
                channels, protocol, pipeline, spread)

    def _runtime_built(self, subject: RuntimeAlgorithm, key: tuple):
        """What the table's builder writes for the subject with :meth:`_runtime_key`'s
        ``key``: a program, or a prepared switch graph (raises what the builder raises)."""
        *_, channels, protocol, pipeline, spread = key
        extra: dict[str, int] = {} if pipeline is None else {"pipeline": pipeline}
        if spread is not None:
            extra["spread"] = spread
        return RUNTIME_PROGRAMS[subject.algorithm].build(subject.collective, subject.topology,
                                                         channels, protocol, **extra)

    def runtime_choice(self, subject: RuntimeAlgorithm, size: int
                       ) -> list[tuple[str, int | None]]:
        """The (protocol, channels) the runtime would run ``subject`` with at ``size``: pinned
        ones kept; the protocol a calibration measured, else the runtime's own choice for that
        algorithm (:func:`~collsynth.timing.tuning_model.algorithm_choice`) and its channels
        for the call; without a tuning setup, every protocol the algorithm runs with (the
        fastest is priced) on the table's channels."""
        # Asked at every price (a calibration asks thousands of times per size): kept per
        # subject, size and the two constants it reads (recorded protocols, channels).
        key = ("choice", subject.runtime.family, subject.runtime.version,
               subject.runtime.settings, subject.algorithm, subject.collective,
               id(subject.topology), subject.protocol, subject.channels,
               self.constants.default_protocols, self.constants.channels, int(size))
        found = self._prepared.get(key)
        if found is None or found[0] is not subject.topology:
            found = self._prepared[key] = (subject.topology,  # type: ignore[assignment]
                                           self._runtime_choice(subject, size))
        return list(found[1])  # type: ignore[arg-type]

    def _runtime_choice(self, subject: RuntimeAlgorithm, size: int
                        ) -> list[tuple[str, int | None]]:
        from collsynth.timing.tuning_model import algorithm_choice

        runs = RUNTIME_PROGRAMS[subject.algorithm].protocols
        if subject.protocol is not None:
            options: tuple[str, ...] = (subject.protocol,)
        else:
            chosen = self.constants.default_protocol(size)
            options = (chosen,) if chosen in runs else \
                tuple(p for p in subject.runtime.protocols if p in runs) or runs
        setup = self.tuning(subject.topology, subject.runtime)
        if subject.algorithm == "p2p":
            return self._p2p_choice(subject, size, options, setup)
        if setup is not None:
            choice = algorithm_choice(setup, subject.collective, subject.algorithm, int(size),
                                      options)
            if choice is not None:
                protocol, shape = choice
                channels = subject.channels if subject.channels is not None else \
                    max(1, shape.channels)
                return [(protocol, _builder_channels(subject, channels))]
        return [(p, self._channels(subject)) for p in options]

    def _p2p_channels(self, subject: RuntimeAlgorithm) -> int | None:
        """The channels grouped send/recv spreads its rounds and parts over (``p2pnChannels``:
        :func:`~collsynth.timing.p2p_tuning.p2p_channel_count`); ``None`` without a tuning."""
        from collsynth.timing.p2p_tuning import p2p_channel_count

        setup = self.tuning(subject.topology, subject.runtime)
        return None if setup is None else p2p_channel_count(setup)

    def _p2p_choice(self, subject: RuntimeAlgorithm, size: int, options: tuple[str, ...],
                    setup: "TuningSetup | None") -> list[tuple[str, int | None]]:
        """Grouped send/recv: the runtime's protocol and parts per peer for the call
        (:func:`~collsynth.timing.p2p_tuning.p2p_shape`), pins kept; without a tuning setup,
        every protocol offered on one part per peer."""
        from collsynth.timing.p2p_tuning import p2p_shape, peer_channels
        from collsynth.topology.machine import machine_facts

        if setup is None:
            return [(p, subject.channels or 1) for p in options]
        shape = p2p_shape(setup, int(size),
                          intra_peer_channels=peer_channels(subject.topology, setup),
                          nic_gbps=machine_facts(subject.topology).nic_gbps)
        protocol = subject.protocol or shape.protocol
        return [(protocol, subject.channels or shape.parts)]

    def _pipeline(self, subject: RuntimeAlgorithm, protocol: str, channels: int | None,
                  size: int) -> int | None:
        """Chunks per channel of a pipelined program (NCCL's tree) at ``size``: the runtime's
        own chunk for the call (:func:`~collsynth.timing.tuning_model.call_shape`) over the
        program's trees, two per chain (:func:`~collsynth.timing.runtime_baselines.
        tree_pipeline`); ``None`` (the builder's default) without a tuning setup."""
        from collsynth.timing.runtime_baselines import tree_pipeline
        from collsynth.timing.tuning_model import call_shape

        if not RUNTIME_PROGRAMS[subject.algorithm].pipelined or channels is None:
            return None
        setup = self.tuning(subject.topology, subject.runtime)
        if setup is None:
            return None
        shape = call_shape(setup, subject.collective, subject.algorithm, protocol, int(size))
        return tree_pipeline(size, 2 * channels, shape.chunk_bytes)

    def _price_runtime(self, subject: RuntimeAlgorithm, sizes: Sequence[int]
                       ) -> tuple[Price, ...]:
        found = []
        for size in sizes:
            best = min((self._price(subject.name, self._runtime_prepared(
                            subject, p, ch, self._pipeline(subject, p, ch, size)), size,
                                    protocol=p, subject=subject, channels=ch)
                        for p, ch in self.runtime_choice(subject, size)),
                       key=lambda t: t.time_us)
            found.append(best)
        return tuple(found)

    def _call_constants(self, c: RuntimeConstants, subject: RuntimeAlgorithm, protocol: str,
                        channels: int) -> RuntimeConstants:
        """``c`` with the runtime's cap on a whole call (LL's ``llMaxBws``:
        :func:`~collsynth.timing.tuning_model.call_cap_gbps`) spread over the call's
        ``channels``: each of a rank's connections carries at most its share."""
        from collsynth.runtimes.constants import LINK_CLASSES
        from collsynth.timing.tuning_model import call_cap_gbps

        setup = self.tuning(subject.topology, subject.runtime)
        if setup is None:
            return c
        cap = call_cap_gbps(setup, subject.algorithm, protocol)
        if not math.isfinite(cap):
            return c
        key = (id(c), protocol, channels, subject.algorithm)
        found = self._on.get(key)
        if found is not None and found[0] is c:
            return found[2]
        share = cap / max(1, channels)
        ceilings = {k: dict(c.ceiling_gbps[k]) for k in LINK_CLASSES}
        for k in LINK_CLASSES:
            now = ceilings[k][protocol]
            ceilings[k][protocol] = share if now is None else min(now, share)
        capped = c.replace(ceiling_gbps=ceilings)
        self._on[key] = (c, subject.topology, capped)
        return capped

    def bandwidth_factor(self, subject: Subject | None, protocol: str | None, size: int
                         ) -> float:
        """The share of every rate ``subject`` is priced at with ``protocol`` at ``size``: the
        runtime's own per-size correction of one of its algorithms (NCCL's tree:
        :func:`~collsynth.timing.tuning_model.bandwidth_correction`); 1 for programs, and
        without a tuning setup."""
        from collsynth.timing.tuning_model import COLLECTIVES, bandwidth_correction

        if not isinstance(subject, RuntimeAlgorithm) or protocol is None \
                or subject.collective not in COLLECTIVES:  # outside the cost model: alltoall
            return 1.0
        setup = self.tuning(subject.topology, subject.runtime)
        if setup is None:
            return 1.0
        return bandwidth_correction(setup, subject.collective, RUNTIME_PROGRAMS[
            subject.algorithm].algorithm, protocol, int(size))

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
               protocol: str | None = None, note: str = "",
               subject: Subject | None = None, channels: int | None = None) -> Price:
        constants = self.constants_on(prepared.topology, subject)
        if isinstance(subject, RuntimeAlgorithm) and protocol is not None and channels:
            constants = self._call_constants(constants, subject, protocol, channels)
        factor = self.bandwidth_factor(subject, protocol, size)
        t = simulate_program(prepared, None, size, constants, protocol=protocol,
                             options=self.options, bandwidth_factor=factor)
        program = prepared.program
        algbw, busbw = bandwidths(program.coll, program.ngpus, size, t.time_us)
        if factor < 1:
            note = f"{note}; {TREE_CORRECTION_NOTE} x{factor:g}" if note else \
                f"{TREE_CORRECTION_NOTE} x{factor:g}"
        warning = indirect_note(prepared)
        if warning:
            note = f"{note}; {warning}" if note else warning
        return Price(name, int(size), t.time_us, algbw, busbw, self.name,
                     str(t.breakdown["protocol"]), program.nchannels, note)



def _builder_channels(subject: RuntimeAlgorithm, channels: int) -> int:
    """The builder's count for ``channels`` of the runtime's (what ``--channels`` and a tuner
    rule say): each of NCCL's channels runs one of the tree's two trees, and the tree program
    builds both per chain, so ``channels`` channels are ``ceil(channels / 2)`` chains (a pinned
    count was taken as chains, and NCCL's tree on 2 channels was priced on 4)."""
    return max(1, (channels + 1) // 2) if subject.algorithm == "tree" else channels


#: How a price's note names NCCL's tree correction (followed by `` x<factor>``).
TREE_CORRECTION_NOTE = "NCCL's tree correction"


def _on_machine(c: RuntimeConstants, topology: "Topology", setup: "TuningSetup | None",
                algorithm: str | None) -> RuntimeConstants:
    """``c`` on ``topology`` (:meth:`ProgramModel.constants_on`)."""
    from collsynth.errors import InvalidTopologyError
    from collsynth.runtimes.constants import CLASS_LATENCY_US, LINK_CLASSES
    from collsynth.runtimes.protocols import PROTOCOLS
    from collsynth.timing.tuning_model import connection_gbps
    from collsynth.topology.machine import machine_facts

    changes: dict = {}
    layout = topology.layout
    if layout is not None and layout.multi_node:
        try:
            network = machine_facts(topology).network_class
        except InvalidTopologyError:  # facts that do not hold together: no network figures
            network = None
        if network is not None:
            if c.network_class != network:  # not fitted on this network: its class's hops
                changes["hop_latency_us"] = {**{k: dict(v) for k, v in c.hop_latency_us.items()},
                                             "network": dict(zip(PROTOCOLS,
                                                                 CLASS_LATENCY_US[network]))}
            elif c.network_base_us:  # a per-call figure a constants file set for its network
                changes["base_latency_us"] = {p: c.base_latency_us[p] + c.network_base_us
                                              for p in PROTOCOLS}
    if setup is not None and algorithm is not None:
        ceilings = {k: dict(c.ceiling_gbps[k]) for k in LINK_CLASSES}
        for k in LINK_CLASSES:
            for p in PROTOCOLS:
                if ceilings[k][p] is None:
                    ceilings[k][p] = connection_gbps(setup, algorithm, p, k == "network")
        changes["ceiling_gbps"] = ceilings
    return c.replace(**changes) if changes else c


def chosen_algorithms(model: ProgramModel, runtime: Runtime, collective: str,
                      topology: "Topology", sizes: Sequence[int]) -> tuple[RuntimeAlgorithm, ...]:
    """Per size, the runtime's own algorithm that it would run (its cost model's pick:
    :func:`~collsynth.timing.tuning_model.choose`), as a :class:`RuntimeAlgorithm` ``model``
    can price; where it cannot price the pick, the next of the runtime's estimates, fastest
    first. Without a tuning setup: the fastest ``model`` prices, per size. What a measured
    curve of the runtime ran (benchmarks/predictions.py, the calibration)."""
    from collsynth.collective.kinds import canonical_name
    from collsynth.timing.pricing import runtime_algorithms
    from collsynth.timing.tuning_model import COLLECTIVES, choose

    own = {a.algorithm: a for a in runtime_algorithms(runtime, collective, topology)
           if model.why_not(a) is None}
    if not own:
        raise InvalidInstanceError(f"the program model prices none of {runtime.family}'s own "
                                   f"algorithms for {collective} on {topology.name!r}")
    setup = model.tuning(topology, runtime)
    found = []
    for size in sizes:
        if canonical_name(collective) not in COLLECTIVES:  # outside the cost model: its one way
            found.append(next(iter(own.values())))
            continue
        if setup is None:
            prices = [(model.price(a, [size])[0].time_us, a) for a in own.values()]
            found.append(min(prices, key=lambda x: x[0])[1])
            continue
        choice = choose(setup, collective, int(size))
        order = [choice.algorithm] + [e.algorithm for e in sorted(choice.estimates,
                                                                  key=lambda e: e.time_us)]
        found.append(next((own[a] for a in order if a in own), next(iter(own.values()))))
    return tuple(found)
