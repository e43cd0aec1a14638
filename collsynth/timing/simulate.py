"""Step-by-step simulation of an algorithm on its topology: per-link latency, bandwidth, contention.

Where the closed form (:mod:`collsynth.timing.model`) charges each step the *rounds* the schedule
declares, the simulation charges what the step's sends actually load onto the links::

    step_us = alpha_step + max( max over links   bytes(link)  * beta(link)  / units(link),
                                max over groups  bytes(group) * beta(group) / limit(group) )
              + gamma * reduced_bytes_of_the_busiest_reducer
    time_us = sum of step_us

* ``bytes(link)``: the pieces the step sends over ``src -> dst``, each ``base chunk / chunks``
  bytes (the nccl-tests buffer convention, :func:`~collsynth.timing.alphabeta.base_chunk_bytes`).
* ``beta(link)``: microseconds per byte of one bandwidth unit of the link's class
  (:class:`~collsynth.timing.model.CostModel`), so ``units(link) / beta(link)`` is the link's
  bandwidth in bytes per microsecond.
* A bandwidth group (a NIC, a switch port) carries the bytes of every send it covers at
  ``limit / beta`` bytes per microsecond, ``beta`` the slowest among the classes of its links:
  this is the contention between links that share a resource.
* ``alpha_step``: the largest latency among the links the step uses (each link has its class's
  alpha); a step without sends costs the default class's alpha.
* The reduction term is the closed form's (``m_t`` pieces on the busiest reducer).

**Agreement with the closed form.** A verified step of ``r`` rounds never loads a link with more
than ``r * units`` pieces or a group with more than ``r * limit``, so the simulation is never
slower than the closed form, step by step. The two are equal exactly when every step is *tight*:
its rounds equal its heaviest load measured in rounds (``max(pieces / units)`` over links and
groups, see :func:`step_load_rounds`) -- as on a topology whose links all have one unit (ring,
fully connected) with one round per piece sent on the busiest link. With 1- and 2-unit links
(DGX-1) a step that sends one piece over only 2-unit links is charged a whole round by the
closed form (rounds are integers) but half a round here.

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

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from numbers import Real
from typing import TYPE_CHECKING

from collsynth.timing.alphabeta import AlphaBeta, base_chunk_bytes
from collsynth.timing.alphabeta import exact_fraction
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
    """Simulate ``algorithm`` on its topology for a ``size_bytes`` buffer (module docstring).

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
