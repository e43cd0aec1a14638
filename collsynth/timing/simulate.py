"""Step-by-step simulation of an algorithm on its topology: per-link latency, bandwidth, contention.

The details (formats, conventions, rules) are in docs/timing.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from numbers import Real
from typing import TYPE_CHECKING

from collsynth.collective.kinds import base_chunk_bytes
from collsynth.exact import exact_fraction
from collsynth.timing.alphabeta import AlphaBeta
from collsynth.timing.model import CostModel, _as_model, reduced_pieces

if TYPE_CHECKING:  # pragma: no cover - imported for annotations only
    from collsynth.algorithm.model import Algorithm
    from collsynth.topology.model import Topology

__all__ = ["StepTiming", "Simulation", "simulate", "step_load_rounds", "is_tight"]


@dataclass(frozen=True)
class StepTiming:
    """The simulated cost of one step, in microseconds.

    ``bottleneck`` names what bounds the transfer (``"link 0->1"`` or ``"group 'name'"``; empty
    for a step without sends).
    """

    index: int
    alpha_us: float
    transfer_us: float
    reduce_us: float
    bottleneck: str

    @property
    def total_us(self) -> float:
        return self.alpha_us + self.transfer_us + self.reduce_us


@dataclass(frozen=True)
class Simulation:
    """Every step's timing for one buffer size."""

    size_bytes: float
    steps: tuple[StepTiming, ...]

    @property
    def total_us(self) -> float:
        """Microseconds of the whole algorithm: the sum of its steps."""
        return sum(step.total_us for step in self.steps)


def simulate(algorithm: "Algorithm", size_bytes: Real, *,
             model: "CostModel | AlphaBeta | Topology | None" = None) -> Simulation:
    """Simulate ``algorithm`` on its topology for a ``size_bytes`` buffer (docs/timing.md).

    Parameters
    ----------
    algorithm:
        A verified algorithm; its topology gives the links and bandwidth groups.
    size_bytes:
        The buffer size, nccl-tests convention.
    model:
        The figures (default: :func:`~collsynth.timing.model.cost_model` of the topology).

    Raises
    ------
    InvalidTopologyError
        When the topology lacks ``alpha_us`` or ``unit_gbps`` and no model is given.

    Examples
    --------
    The 3-step allgather on a 4-GPU unidirectional ring (2 us per step, 10 GB/s per link) is
    tight, so the simulation gives the closed form's 306 us for 4 MB:

    >>> from collsynth.algorithm import Algorithm, Send, Step, verify
    >>> from collsynth.collective import allgather
    >>> from collsynth.topology import Topology
    >>> ring = Topology("ring4", ((0, 1, 0, 0), (0, 0, 1, 0), (0, 0, 0, 1), (1, 0, 0, 0)),
    ...                 unit_gbps=10.0, alpha_us=2.0)
    >>> steps = tuple(Step(1, tuple(Send((r - t) % 4, r, (r + 1) % 4) for r in range(4)))
    ...               for t in range(3))
    >>> run = simulate(verify(Algorithm("ring", ring, allgather(4), steps)), 4_000_000)
    >>> round(run.total_us, 6), run.steps[0].bottleneck
    (306.0, 'link 0->1')
    """
    cm = _as_model(model, algorithm)
    topology = algorithm.topology
    coll = algorithm.collective
    size = exact_fraction(size_bytes, "size_bytes")
    piece = float(base_chunk_bytes(coll.name, coll.num_ranks, size)
                  / algorithm.chunks)
    gamma = float(cm.gamma_us_per_byte)
    groups = topology.effective_groups
    result = []
    for index, (step, reduced) in enumerate(zip(algorithm.steps, reduced_pieces(algorithm))):
        load: dict[tuple[int, int], int] = {}
        for send in step.sends:
            load[send.src, send.dst] = load.get((send.src, send.dst), 0) + 1
        if not load:
            result.append(StepTiming(index, float(cm.links.alpha_us), 0.0, 0.0, ""))
            continue
        alpha = max(float(cm.figures(s, d).alpha_us) for s, d in load)
        transfer, bottleneck = 0.0, ""
        for (s, d), count in sorted(load.items()):
            cost = count * piece * float(cm.figures(s, d).beta_us_per_byte) / topology.links[s][d]
            if cost > transfer:
                transfer, bottleneck = cost, f"link {s}->{d}"
        for group, covered in groups:
            count = sum(load.get(link, 0) for link in covered)
            if not count:
                continue
            beta = max(float(cm.figures(s, d).beta_us_per_byte) for s, d in covered)
            cost = count * piece * beta / group.limit
            if cost > transfer:
                transfer, bottleneck = cost, f"group {group.name!r}"
        result.append(StepTiming(index, alpha, transfer, gamma * reduced * piece, bottleneck))
    return Simulation(float(size_bytes), tuple(result))


def step_load_rounds(algorithm: "Algorithm") -> tuple[Fraction, ...]:
    """Per step, its heaviest load in rounds: ``max(pieces / units)`` over links and groups.

    A verified step's ``rounds`` is at least this; equal means the step is *tight*.
    """
    topology = algorithm.topology
    result = []
    for step in algorithm.steps:
        load: dict[tuple[int, int], int] = {}
        for send in step.sends:
            load[send.src, send.dst] = load.get((send.src, send.dst), 0) + 1
        heaviest = max((Fraction(c, topology.links[s][d]) for (s, d), c in load.items()),
                       default=Fraction(0))
        for group, covered in topology.effective_groups:
            count = sum(load.get(link, 0) for link in covered)
            heaviest = max(heaviest, Fraction(count, group.limit))
        result.append(heaviest)
    return tuple(result)


def is_tight(algorithm: "Algorithm") -> bool:
    """True when every step's rounds equal its heaviest load (:func:`step_load_rounds`): then
    the simulation and the closed form agree (with one link class and no reductions, exactly)."""
    return all(step.rounds == load
               for step, load in zip(algorithm.steps, step_load_rounds(algorithm)))
