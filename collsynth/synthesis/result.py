"""What synthesis returns, and its options.

:class:`SynthesisResult`: one per instance the exact engine tries. :class:`ScheduleResult`: the one
verified schedule of a large-system engine (trees, alltoall, hierarchical; the exact engine's
bandwidth-best point through :func:`~collsynth.synthesis.large.solve_large`).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from fractions import Fraction
from types import MappingProxyType
from typing import Any, Callable, Mapping

from collsynth.algorithm.model import Algorithm, Instance
from collsynth.encoding.backend import Backend, Status
from collsynth.errors import (InputTooLargeError, InvalidCollectiveError, InvalidInstanceError,
                              SolverError, UnimplementableError)
from collsynth.limits import TimeLimitReached

__all__ = ["Status", "SynthesisResult", "ScheduleResult", "SolveOptions", "SYNTHESIS_FAILURES",
           "STOP_CAUSES"]

#: Why a search ended before it was complete (the ``stopped_by`` of a result): its time limit
#: (or one instance's), Ctrl-C, a solver that answered "unknown", a backend that cannot search
#: the whole space, the iteration limit of the tree packing, and, for a Pareto front not yet
#: iterated to its end, ``"unfinished"``. ``None`` when it is complete (docs/synthesis.md).
STOP_CAUSES = ("time_limit", "interrupt", "solver", "backend", "iteration_limit", "unfinished")
_STATUS_CAUSE = {Status.TIMEOUT: "time_limit", Status.INTERRUPTED: "interrupt",
                 Status.UNKNOWN: "solver"}


#: What a synthesis call may fail with when nothing is wrong with the caller's input: a solver
#: that crashed or is missing, an instance the engine cannot take, a memory budget, an engine
#: without partial results out of time, a collective it does not handle, links that cannot
#: implement it. A caller with a fallback (keep the runtime's own algorithm) catches exactly
#: these; anything else is a bug and surfaces.
SYNTHESIS_FAILURES = (SolverError, InvalidInstanceError, InputTooLargeError, TimeLimitReached,
                      InvalidCollectiveError, UnimplementableError)


@dataclass(frozen=True)
class SynthesisResult:
    """The outcome of one instance.

    ``algorithm`` is set (and verified) exactly when ``status`` is ``SAT``. ``seconds`` is the wall
    time spent on this instance, encoding and verification included. ``complete`` says whether
    the instance was decided (``SAT`` or ``UNSAT``); ``stopped_by`` why not (one of
    :data:`STOP_CAUSES`: ``"time_limit"``, ``"interrupt"``, ``"solver"``), else ``None``.
    """

    instance: Instance
    status: Status
    algorithm: Algorithm | None
    seconds: float
    backend: str
    detail: str = ""

    @property
    def found(self) -> bool:
        return self.status is Status.SAT

    @property
    def complete(self) -> bool:
        """The question was answered: ``SAT`` (with a verified algorithm) or ``UNSAT`` (a proof)."""
        return self.status in (Status.SAT, Status.UNSAT)

    @property
    def stopped_by(self) -> str | None:
        """Why the instance was left undecided (:data:`STOP_CAUSES`), ``None`` when decided."""
        return _STATUS_CAUSE.get(self.status)

    @property
    def rounds_per_chunk(self) -> Fraction:
        return self.instance.rounds_per_chunk

    def summary(self) -> str:
        """``steps=3 rounds=7 chunks=6: sat (0.4 s, cpsat)``."""
        text = f"{self.instance.label()}: {self.status.value} ({self.seconds:.2f} s, {self.backend})"
        return f"{text} {self.detail}".rstrip()


@dataclass(frozen=True)
class ScheduleResult:
    """A verified schedule from a large-system engine and how close it is to a lower bound.

    Attributes
    ----------
    algorithm:
        The verified schedule; ``None`` for a compact result (``compact`` set), whose sends are
        built only by :meth:`expanded`.
    engine:
        ``"trees"``, ``"alltoall"``, ``"hierarchical"`` or ``"exact"``.
    rounds_per_chunk:
        Its rounds per base chunk (exact), pipeline filling and draining included.
    steady_state_rounds_per_chunk:
        Rounds per base chunk once the pipeline is full: the limit of ``rounds_per_chunk`` as the
        number of stages grows (trees); ``rounds_per_chunk`` for the other engines.
    lower_bound:
        No algorithm has fewer rounds per base chunk (tree allreduce: no reduce-scatter +
        allgather algorithm); ``None`` when the engine computes none
        (:func:`~collsynth.synthesis.hierarchical.hierarchical_algorithm` called on its own).
    seconds:
        Wall time of the whole call.
    timings:
        Seconds per phase (read-only; empty when the engine does not split its time).
    details:
        The engine's own figures (read-only):

        * trees: ``stages`` (pipeline stages), ``pieces_per_root`` (pieces of each root's chunk
          per stage), ``depth`` (deepest tree);
        * alltoall: ``schedule`` (``"direct"``, ``"rail"``, ``"hierarchical"`` or
          ``"routed"``), ``cut_bound`` (the best
          :class:`~collsynth.synthesis.alltoall_scale.CutBound`), ``exact_bound`` (the LP bound,
          or ``None`` when not computed), ``candidates`` (every schedule priced:
          ``(schedule, rounds per chunk, steps, chunks)``);
        * hierarchical: ``node_algorithms`` (on the node topology; allreduce: reduce-scatter,
          allgather), ``pipeline`` (one ``(batches, parts)`` pair per hierarchical phase: each
          rank's data, or for broadcast and reduce the buffer, cut into ``parts`` parts whose
          (part, node) transfers over the NICs go in ``batches`` batches one step apart; empty
          for alltoall);
        * exact: ``pareto_points`` (size of the Pareto front the point was taken from).
    compact:
        A :class:`~collsynth.synthesis.bandwidth_optimal.symmetric.SymmetricSchedule` (node 0's
        template and the node shift, verified through the symmetry) when the tree engine kept
        the schedule compact (thousands of ranks); else ``None``.
    complete:
        The engine's search ran to its end, or what it found meets ``lower_bound`` anyway;
        false when a limit cut it short first (the schedule is then the best found, verified).
    stopped_by:
        Why it was cut short (one of :data:`STOP_CAUSES`), ``None`` when complete.
    """

    algorithm: Algorithm | None
    engine: str
    rounds_per_chunk: Fraction
    steady_state_rounds_per_chunk: Fraction
    lower_bound: Fraction | None
    seconds: float
    timings: Mapping[str, float] = field(default_factory=dict)
    details: Mapping[str, Any] = field(default_factory=dict)
    compact: Any = None
    complete: bool = True
    stopped_by: str | None = None

    def __post_init__(self) -> None:
        # Copies behind read-only views: the result stays a value.
        object.__setattr__(self, "timings", MappingProxyType(dict(self.timings)))
        object.__setattr__(self, "details", MappingProxyType(dict(self.details)))

    @property
    def optimal(self) -> bool:
        """``steady_state_rounds_per_chunk == lower_bound``: the throughput is proven optimal."""
        return self.lower_bound is not None and \
            self.steady_state_rounds_per_chunk == self.lower_bound

    @property
    def ratio(self) -> Fraction | None:
        """``steady_state_rounds_per_chunk / lower_bound`` (1: optimal); ``None`` without a
        bound."""
        if self.lower_bound is None:
            return None
        if self.lower_bound == 0:  # one rank: nothing to move
            return Fraction(1)
        return self.steady_state_rounds_per_chunk / self.lower_bound

    @property
    def schedule(self) -> Any:
        """What holds the steps: the algorithm, or the compact schedule (both have
        ``topology``, ``collective`` (unsplit for the compact one), ``num_steps``,
        ``num_rounds``, ``rounds_per_chunk`` and ``num_sends``)."""
        return self.compact if self.algorithm is None else self.algorithm

    @property
    def steps(self) -> int:
        return self.schedule.num_steps

    @property
    def chunks(self) -> int:
        """Pieces per base chunk of the algorithm's collective."""
        return self.compact.pieces if self.algorithm is None else self.algorithm.chunks

    def expanded(self) -> Algorithm:
        """The algorithm with every send: ``algorithm``, or the compact schedule expanded
        (every image of the template; as verified as the template, through the symmetry)."""
        if self.algorithm is not None:
            return self.algorithm
        return self.compact.expanded()

    def with_lower_bound(self, bound: Fraction, seconds: float) -> ScheduleResult:
        """This result measured against ``bound``, computed in ``seconds`` (added to the time)."""
        return dataclasses.replace(self, lower_bound=bound, seconds=self.seconds + seconds,
                                   timings=dict(self.timings, bound=seconds))

    def to_json(self) -> dict:
        """Plain JSON-able figures (fractions as strings, algorithms by name), ``details``
        included at the top level."""
        bound = None if self.lower_bound is None else str(self.lower_bound)
        ratio = self.ratio
        held = self.schedule
        figures = {
            "engine": self.engine,
            "algorithm": None if self.algorithm is None else self.algorithm.name,
            "collective": held.collective.describe(),
            "topology": held.topology.name,
            "ranks": held.topology.num_ranks,
            "steps": held.num_steps,
            "rounds": held.num_rounds,
            "chunks": self.chunks,
            "sends": held.num_sends,
            "compact": None if self.compact is None else {
                "template_sends": self.compact.template_sends,
                "images": self.compact.shift.nodes},
            "rounds_per_chunk": str(self.rounds_per_chunk),
            "steady_state_rounds_per_chunk": str(self.steady_state_rounds_per_chunk),
            "lower_bound": bound,
            "optimal": self.optimal,
            "ratio": None if ratio is None else str(ratio),
            "seconds": round(self.seconds, 3),
            "timings": {k: round(v, 3) for k, v in self.timings.items()},
            "complete": self.complete,
            "stopped_by": self.stopped_by,
        }
        figures.update({key: _plain(value) for key, value in self.details.items()})
        return figures


def _plain(value: Any) -> Any:
    """``value`` as JSON: fractions as strings, algorithms by name, dataclasses as objects."""
    if isinstance(value, Fraction):
        return str(value)
    if isinstance(value, Algorithm):
        return value.name
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    return value


@dataclass(frozen=True)
class SolveOptions:
    """Options shared by every synthesis entry point (keyword-only).

    Parameters
    ----------
    backend:
        ``"auto"`` (CP-SAT if installed, else z3), ``"cpsat"``, ``"z3"``, or a backend object.
    time_limit:
        Wall-clock seconds for the whole call (an instance, a least-steps search or a sweep).
    instance_time_limit:
        Most seconds for any one instance inside a search; ``None``: the remaining time.
    symmetry:
        First search schedules invariant under a topology automorphism (fast when it works,
        never used to conclude unsatisfiability).
    on_result:
        Called with every :class:`SynthesisResult` as soon as it is known (progress reporting).
    on_progress:
        Called with one line (``"steps=3 rounds=7 chunks=6: solving, 10 s so far (time limit
        300 s)"``) every ``progress_interval_s`` seconds while an instance is being solved, from
        a background thread (the solver runs in the calling one); ``None``: no heartbeat.
    progress_interval_s:
        Seconds between two heartbeats (default 5).
    """

    backend: str | Backend = "auto"
    time_limit: float = 300.0
    instance_time_limit: float | None = None
    symmetry: bool = True
    on_result: Callable[[SynthesisResult], None] | None = None
    on_progress: Callable[[str], None] | None = None
    progress_interval_s: float = 5.0

    def __post_init__(self) -> None:
        if not (isinstance(self.time_limit, (int, float)) and self.time_limit > 0
                and math.isfinite(self.time_limit)):
            raise InvalidInstanceError(f"time_limit = {self.time_limit!r}; expected seconds > 0")
        interval = self.progress_interval_s
        if isinstance(interval, bool) or not isinstance(interval, (int, float)) \
                or not (interval > 0 and math.isfinite(interval)):
            raise InvalidInstanceError(f"progress_interval_s = {interval!r}; expected seconds "
                                       "> 0")

