"""The closed form and the measured curve as pricing models: exact lines in the size.

:class:`ClosedForm` prices a synthesized algorithm step by step from the topology's figures
(:func:`collsynth.timing.model.symbolic_time`) and the runtime's ring and tree with NCCL's own
tuning formula as exact lines (:func:`collsynth.timing.tuning_model.nccl_choices`), optionally on
a calibration's measured figures. :class:`Measured` prices the runtime as a calibration measured
it. Both are :class:`~collsynth.timing.pricing.LinearPricingModel`: docs/timing.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import TYPE_CHECKING, Mapping, Protocol, Sequence, runtime_checkable

import sympy

from collsynth.algorithm.model import Algorithm
from collsynth.collective.kinds import base_chunk_bytes
from collsynth.errors import (InvalidInstanceError, InvalidTopologyError, NoRingError,
                              UnknownNameError)
from collsynth.exact import exact_fraction, sympy_rational
from collsynth.export.program import Program
from collsynth.timing.alphabeta import from_topology
from collsynth.timing.metrics import bandwidths
from collsynth.timing.model import SIZE, CostModel, cost_model, symbolic_time
from collsynth.timing.pricing import (MEASURED, RUNS_ON_RING, Price, RuntimeAlgorithm, Subject,
                                      subject_name)
from collsynth.timing.runtime_baselines import TREE_COLLECTIVES
from collsynth.timing.tuning_model import (LINEAR_ALGORITHMS, SETUP_FAILURES, NcclChoice,
                                           NcclSetup, TuningSetup, bandwidth_gbps, best_choice,
                                           kind_channels, latency_us,
                                           nccl_choices, nccl_setup, offered_protocols,
                                           tuning_setup)

if TYPE_CHECKING:  # pragma: no cover - imported for annotations only
    from collsynth.collective.model import Collective
    from collsynth.runtimes import Runtime
    from collsynth.timing.calibration import CurveCalibration
    from collsynth.topology.model import Topology

__all__ = ["ClosedForm", "Measured", "StepsAndRounds", "Prediction", "predicted_against_runtime",
           "PREDICTION_SIZES", "TUNING_LINE_ALGORITHMS"]

#: The runtime's algorithms the closed form prices with the runtime's own estimate
#: (:func:`collsynth.timing.tuning_model.latency_us` + size / :func:`bandwidth_gbps`, on the graph
#: figures approximated from the machine's facts) rather than with the topology's rings.
TUNING_LINE_ALGORITHMS = ("nvls", "nvls_tree", "pat", "collnet_direct", "collnet_chain")


class ClosedForm:
    """The alpha-beta(-gamma) closed form (a :class:`~collsynth.timing.pricing.LinearPricingModel`).

    Parameters
    ----------
    calibration:
        A curve calibration (:func:`collsynth.timing.calibration.load_calibration`): its measured
        per-step alpha and per-unit GB/s replace the topology's
        (:meth:`~collsynth.timing.calibration.CurveCalibration.apply`), for the algorithms and
        NCCL's channels alike.
    gamma_us_per_byte:
        Reduction cost charged to synthesized combining algorithms (NCCL's own model charges
        none); see :func:`collsynth.timing.kernels.reduce_gamma_us_per_byte`.
    network_alpha_us:
        Latency of a step between nodes (composed topologies), as for
        :func:`~collsynth.timing.model.cost_model`.
    source:
        Where the calibration was read from, for :attr:`provenance`.

    >>> from collsynth.runtimes import get_runtime
    >>> from collsynth.timing.pricing import runtime_algorithms
    >>> from collsynth.topology import get_topology
    >>> ring, = runtime_algorithms(get_runtime("nccl"), "allgather", get_topology("dgx1"))
    >>> ClosedForm().line(ring.pinned("Simple"))  # 8.4 + 7 x 3.4 us; 150 GB/s x 8/7
    7*size_bytes/1200000 + 161/5
    """

    name = "closed-form"

    def __init__(self, *, calibration: "CurveCalibration | None" = None,
                 gamma_us_per_byte: float = 0.0, network_alpha_us: float | None = None,
                 source: str = "") -> None:
        self.calibration = calibration
        self.gamma_us_per_byte = float(gamma_us_per_byte)
        self.network_alpha_us = network_alpha_us
        self.source = source
        self._setups: dict[int, tuple["Topology", NcclSetup | Exception]] = {}
        self._tunings: dict[tuple[str, int], tuple["Topology", TuningSetup]] = {}
        self._topologies: dict[int, tuple["Topology", "Topology"]] = {}

    @property
    def provenance(self) -> str:
        if self.calibration is None:
            return "the topology's alpha_us and unit_gbps; NCCL's documented tuning constants"
        return (f"calibration {self.source or self.calibration.topology!r}: measured alpha per "
                "step and GB/s per unit; NCCL's documented tuning constants")

    # -- figures ---------------------------------------------------------------------------------

    def machine(self, topology: "Topology") -> "Topology":
        """``topology`` with the calibration's measured figures (itself without one).

        Raises
        ------
        InvalidTopologyError
            The calibration has no fit for the topology's rank count.
        """
        if self.calibration is None:
            return topology
        found = self._topologies.get(id(topology))
        if found is None or found[0] is not topology:
            found = self._topologies[id(topology)] = (topology, self.calibration.apply(topology))
        return found[1]

    def cost_model(self, topology: "Topology") -> CostModel:
        """The figures algorithms on ``topology`` are priced with."""
        return cost_model(self.machine(topology), gamma_us_per_byte=self.gamma_us_per_byte,
                          network_alpha_us=self.network_alpha_us)

    def nccl_setup(self, topology: "Topology") -> NcclSetup:
        """NCCL's channels on ``topology`` (found once per topology).

        Raises
        ------
        NoRingError
            No directed ring through every rank.
        InvalidTopologyError
            No physical figures.
        """
        found = self._setups.get(id(topology))
        if found is None or found[0] is not topology:
            try:
                machine = self.machine(topology)
                setup: NcclSetup | Exception = nccl_setup(
                    machine, model=cost_model(machine, network_alpha_us=self.network_alpha_us))
            except (NoRingError, InvalidTopologyError) as exc:
                setup = exc
            found = self._setups[id(topology)] = (topology, setup)
        if isinstance(found[1], Exception):
            raise found[1]
        return found[1]

    # -- the interface --------------------------------------------------------------------------

    def why_not(self, subject: Subject) -> str | None:
        if isinstance(subject, Program):
            return ("the closed form prices algorithms; an MSCCL program needs the program "
                    "model (--topology T)")
        if isinstance(subject, Algorithm):
            coll = subject.collective
            try:
                base_chunk_bytes(coll.name, coll.num_ranks, 1)
                from_topology(self.machine(subject.topology))
            except (UnknownNameError, InvalidTopologyError) as exc:
                return str(exc)
            return None
        if subject.algorithm == MEASURED:
            return "the closed form models the runtime's algorithms; a measured curve is Measured's"
        if subject.algorithm in TUNING_LINE_ALGORITHMS:
            try:
                found = self._choices(subject)
            except SETUP_FAILURES as exc:
                return str(exc)
            if not found:
                return (f"{subject.runtime.family}'s tuning does not offer "
                        f"{subject.algorithm}" + (f"/{subject.protocol}" if subject.protocol
                                                  else "") + f" for {subject.collective} on "
                        f"{subject.topology.name}")
            return None
        if subject.algorithm == "tree" and subject.collective in RUNS_ON_RING and \
                subject.collective not in TREE_COLLECTIVES:
            return f"NCCL has no tree for {subject.collective} (tree is allreduce only)"
        if subject.algorithm == "p2p":
            return (f"NCCL runs {subject.collective} as grouped send/recv, outside its ring/tree "
                    "tuning model; the program model prices it (--model program)")
        if subject.algorithm not in LINEAR_ALGORITHMS or \
                subject.collective not in RUNS_ON_RING:
            return (f"NCCL runs {subject.collective} as grouped send/recv, outside its ring/tree "
                    "tuning model")
        try:
            self.nccl_setup(subject.topology)
        except (NoRingError, InvalidTopologyError) as exc:
            return str(exc)
        return None

    def line(self, subject: Subject) -> sympy.Expr:
        """Microseconds as an exact line in :data:`~collsynth.timing.model.SIZE`.

        Raises
        ------
        InvalidInstanceError
            A runtime algorithm whose protocol is not pinned (the runtime switches protocols by
            size: the fastest of several lines, :meth:`RuntimeAlgorithm.pinned`), or a subject
            :meth:`why_not` refuses.
        """
        if isinstance(subject, Algorithm):
            return symbolic_time(subject, model=self.cost_model(subject.topology))
        if isinstance(subject, RuntimeAlgorithm):
            if subject.protocol is None:
                raise InvalidInstanceError(
                    f"{subject.name}: the runtime picks its protocol by size, so its time is "
                    "the fastest of several lines; pin one (subject.pinned('LL'))")
            (choice,) = self._choices(subject)
            return choice.symbolic_time()
        raise InvalidInstanceError(self.why_not(subject) or "not priced by the closed form")

    def price(self, subject: Subject, sizes: Sequence[int]) -> tuple[Price, ...]:
        if isinstance(subject, RuntimeAlgorithm):
            choices = self._choices(subject)
            if not choices:
                raise InvalidInstanceError(self.why_not(subject) or subject.name)
            channels = self._channels(subject)
            found = []
            for size in sizes:
                choice = best_choice(choices, size)
                found.append(self._price(subject.name, subject.collective,
                                         choice.num_ranks, size, choice.time_us(size),
                                         protocol=choice.protocol,
                                         channels=subject.channels or channels))
            return tuple(found)
        expr = self.line(subject)
        coll = subject.collective
        return tuple(self._price(subject_name(subject), coll.name, coll.num_ranks, size,
                                 float(expr.subs(SIZE, size))) for size in sizes)

    # -- helpers --------------------------------------------------------------------------------

    def _tuning(self, subject: RuntimeAlgorithm) -> TuningSetup:
        """The runtime's own tuning on the subject's machine (once per topology)."""
        key = (subject.runtime.family, subject.runtime.version, subject.runtime.settings,
               id(subject.topology))
        found = self._tunings.get(key)
        if found is None or found[0] is not subject.topology:
            found = self._tunings[key] = (subject.topology, tuning_setup(
                subject.topology, runtime=subject.runtime.family,
                version=subject.runtime.version, settings=subject.runtime.settings))
        return found[1]

    def _channels(self, subject: RuntimeAlgorithm) -> int:
        if subject.algorithm in TUNING_LINE_ALGORITHMS:
            return kind_channels(self._tuning(subject), subject.algorithm)
        return subject.channels or len(self.nccl_setup(subject.topology).rings)

    def _choices(self, subject: RuntimeAlgorithm) -> tuple[NcclChoice, ...]:
        if subject.algorithm in TUNING_LINE_ALGORITHMS:
            # NCCL's own estimate, latency + size / bandwidth: a line (docs/timing.md).
            setup = self._tuning(subject)
            n = subject.topology.num_ranks
            return tuple(
                NcclChoice(subject.algorithm, p, subject.collective, n,
                           exact_fraction(latency_us(setup, subject.collective,
                                                     subject.algorithm, p)),
                           exact_fraction(bandwidth_gbps(setup, subject.collective,
                                                         subject.algorithm, p)))
                for p in offered_protocols(setup, subject.collective, subject.algorithm)
                if subject.protocol in (None, p))
        if subject.algorithm not in LINEAR_ALGORITHMS:
            return ()
        protocols = (subject.protocol,) if subject.protocol is not None else \
            subject.runtime.protocols
        setup = self.nccl_setup(subject.topology)
        if subject.channels is not None:
            setup = nccl_setup(self.machine(subject.topology), channels=subject.channels,
                               model=cost_model(self.machine(subject.topology),
                                                network_alpha_us=self.network_alpha_us))
        return nccl_choices(setup, subject.collective, protocols=protocols,
                            algorithms=(subject.algorithm,))

    def _price(self, name: str, collective: str, n: int, size: int, time_us: float, *,
               protocol: str | None = None, channels: int | None = None) -> Price:
        algbw, busbw = bandwidths(collective, n, size, time_us)
        return Price(name, int(size), time_us, algbw, busbw, self.name, protocol, channels)


class Measured:
    """A runtime as a calibration measured it: the fitted line of one collective on one rank
    count (a :class:`~collsynth.timing.pricing.LinearPricingModel`). It prices only
    ``RuntimeAlgorithm(runtime, "measured", collective, topology)`` (:data:`MEASURED`): the runtime's
    whole answer, whichever algorithm it ran.

    >>> from collsynth.runtimes import get_runtime
    >>> from collsynth.timing.calibration import CurveCalibration, CalibrationEntry
    >>> from collsynth.timing.pricing import RuntimeAlgorithm
    >>> from collsynth.topology import get_topology
    >>> entry = CalibrationEntry("ag.txt", "allgather", 8, "alpha-beta",
    ...                          {"alpha_us": 30.0, "beta_us_per_byte": 1e-05, "busbw_gbps": 87.5})
    >>> nccl = RuntimeAlgorithm(get_runtime("nccl"), "measured", "allgather", get_topology("dgx1"))
    >>> Measured(CurveCalibration("dgx1", (entry,))).line(nccl)
    size_bytes/100000 + 30
    """

    name = "measured"

    def __init__(self, calibration: "CurveCalibration", *, source: str = "") -> None:
        self.calibration = calibration
        self.source = source

    @property
    def provenance(self) -> str:
        return f"the fitted line of calibration {self.source or self.calibration.topology!r}"

    def why_not(self, subject: Subject) -> str | None:
        if not isinstance(subject, RuntimeAlgorithm) or subject.algorithm != MEASURED:
            return "a measured curve prices the runtime as measured (its 'measured' algorithm)"
        n = subject.topology.num_ranks
        if not self.calibration.entries_for(subject.collective, ranks=n):
            return (f"the calibration has no fit of {subject.collective} on {n} ranks; it has: "
                    + (", ".join(f"{e.collective} ({e.ranks} ranks)"
                                 for e in self.calibration.entries) or "no entries"))
        return None

    def line(self, subject: Subject) -> sympy.Expr:
        why = self.why_not(subject)
        if why is not None:
            raise InvalidInstanceError(why)
        assert isinstance(subject, RuntimeAlgorithm)
        line = self.calibration.alpha_beta_for(subject.collective,
                                               ranks=subject.topology.num_ranks)
        return sympy_rational(line.alpha_us) + sympy_rational(line.beta_us_per_byte) * SIZE

    def price(self, subject: Subject, sizes: Sequence[int]) -> tuple[Price, ...]:
        expr = self.line(subject)
        assert isinstance(subject, RuntimeAlgorithm)
        n = subject.topology.num_ranks
        found = []
        for size in sizes:
            t = float(expr.subs(SIZE, size))
            algbw, busbw = bandwidths(subject.collective, n, size, t)
            found.append(Price(subject.name, int(size), t, algbw, busbw, self.name))
        return tuple(found)


# -- a schedule's prediction against the runtime's own algorithms -------------------------------

#: Buffer sizes (bytes, nccl-tests convention) :func:`predicted_against_runtime` reports by default.
PREDICTION_SIZES = (1 << 20, 64 << 20, 1 << 30)


@runtime_checkable
class StepsAndRounds(Protocol):
    """What a schedule's closed form needs (an algorithm, or a compact schedule whose sends are
    never all built)."""

    @property
    def topology(self) -> "Topology": ...  # pragma: no cover - protocol

    @property
    def collective(self) -> "Collective": ...  # pragma: no cover - protocol

    @property
    def num_steps(self) -> int: ...  # pragma: no cover - protocol

    @property
    def rounds_per_chunk(self) -> Fraction: ...  # pragma: no cover - protocol


@dataclass(frozen=True)
class Prediction:
    """One size: the schedule's predicted ``collsynth_us`` and the runtime's algorithms'
    (``runtime_us``: name -> us, ``None`` for one the closed form has no line of here)."""

    size_bytes: int
    collsynth_us: float
    runtime_us: Mapping[str, float | None]

    @property
    def fastest(self) -> tuple[str, float] | None:
        """``(name, us)`` of the fastest runtime algorithm priced here (ties: the first), what
        the schedule is compared with; ``None`` when none is."""
        priced = [(t, index, name) for index, (name, t) in enumerate(self.runtime_us.items())
                  if t is not None]
        if not priced:
            return None
        t, _, name = min(priced)
        return name, t

    def as_dict(self) -> dict[str, float | int | str | None]:
        """``{"bytes", "collsynth", "nccl_ring", "nccl_tree", ..., "runtime_fastest",
        "runtime_fastest_us"}`` (names with ``_`` for ``-``)."""
        fastest = self.fastest
        return {"bytes": self.size_bytes, "collsynth": self.collsynth_us,
                **{name.replace("-", "_"): t for name, t in self.runtime_us.items()},
                "runtime_fastest": fastest[0] if fastest else None,
                "runtime_fastest_us": fastest[1] if fastest else None}


def predicted_against_runtime(schedule: StepsAndRounds, sizes: Sequence[int] = PREDICTION_SIZES,
                              *, runtime: "Runtime | None" = None) -> tuple[Prediction, ...]:
    """The closed form of ``schedule`` (its steps and rounds per chunk, one alpha and beta: the
    topology's) against each of the runtime's own algorithms (:func:`runtime_algorithms`, by
    :class:`ClosedForm`, best protocol per size; :attr:`Prediction.fastest` names the fastest)
    at each size; ``()`` when the topology has no physical figures or the runtime has no
    algorithm the closed form prices there. The schedule pays the runtime's base latency (``Simple``) besides its steps:
    an MSCCL program runs inside the same kernel launch and proxy machinery as the runtime's own
    algorithms, whose lines include it.

    >>> from collsynth.algorithm import Algorithm, Send, Step, verify
    >>> from collsynth.collective import allgather
    >>> from collsynth.topology import Topology
    >>> ring = Topology("ring4", ((0, 1, 0, 0), (0, 0, 1, 0), (0, 0, 0, 1), (1, 0, 0, 0)),
    ...                 unit_gbps=10.0, alpha_us=2.0)
    >>> steps = tuple(Step(1, tuple(Send((r - t) % 4, r, (r + 1) % 4) for r in range(4)))
    ...               for t in range(3))
    >>> row, = predicted_against_runtime(verify(Algorithm("ring", ring, allgather(4), steps)),
    ...                                  [4_000_000])
    >>> round(row.collsynth_us, 6), row.runtime_us["nccl-tree"]  # 8.4 + 3 x 2 + 300 us
    (314.4, None)
    >>> row.fastest[0]
    'nccl-ring'
    """
    from collsynth.runtimes import get_runtime
    from collsynth.timing.pricing import runtime_algorithms

    runtime = runtime if runtime is not None else get_runtime("nccl")
    coll = schedule.collective
    try:
        figures = from_topology(schedule.topology)
        point = symbolic_time((schedule.num_steps, schedule.rounds_per_chunk), coll.name,
                              coll.num_ranks, model=figures)
    except (InvalidTopologyError, UnknownNameError):
        return ()
    model = ClosedForm()
    ours = [r for r in runtime_algorithms(runtime, coll.name, schedule.topology)
            if model.why_not(r) is None]
    if not ours:
        return ()
    base = runtime.defaults.base_latency("Simple")
    names = list(dict.fromkeys(
        [r.name for r in runtime_algorithms(runtime, "allreduce", schedule.topology)]
        + [r.name for r in ours]))
    prices = {r.name: model.price(r, sizes) for r in ours}
    return tuple(Prediction(int(size), base + float(point.subs(SIZE, size)),
                            {name: (prices[name][i].time_us if name in prices else None)
                             for name in names})
                 for i, size in enumerate(sizes))
