"""The alpha-beta cost model: one latency per step plus one transfer time per byte.

The details (formats, conventions, rules) are in docs/timing.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from numbers import Real
from typing import TYPE_CHECKING, Sequence, Union

from collsynth.collective.kinds import base_chunk_bytes
from collsynth.errors import InvalidInstanceError, InvalidTopologyError
from collsynth.exact import exact_fraction

if TYPE_CHECKING:  # pragma: no cover - imported for annotations only
    from collsynth.algorithm.model import Algorithm
    from collsynth.topology.model import Topology

__all__ = [
    "AlphaBeta",
    "from_topology",
    "base_chunk_bytes",
    "instance_time_us",
    "algorithm_time_us",
    "crossover_bytes",
]

#: A (steps, rounds per chunk) point, e.g. ``(3, Fraction(7, 6))``.
Point = Sequence[Union[int, Fraction]]

@dataclass(frozen=True)
class AlphaBeta:
    """The two figures of the alpha-beta model.

    Parameters
    ----------
    alpha_us:
        Latency of one step, in microseconds (>= 0).
    beta_us_per_byte:
        Microseconds one bandwidth unit takes per byte (>= 0): ``1 / (unit_gbps * 1e3)``.

    Both accept any real number (``int``, ``float`` or ``Fraction``); give Fractions to keep
    :func:`crossover_bytes` exact for figures without a short decimal form.

    Raises
    ------
    InvalidTopologyError
        When a figure is negative, not finite, or not a number.

    >>> AlphaBeta(alpha_us=0.7, beta_us_per_byte=1 / 25e3)
    AlphaBeta(alpha_us=0.7, beta_us_per_byte=4e-05)
    """

    alpha_us: float
    beta_us_per_byte: float

    def __post_init__(self) -> None:
        for name in ("alpha_us", "beta_us_per_byte"):
            value = getattr(self, name)
            if (isinstance(value, bool) or not isinstance(value, Real)
                    or not math.isfinite(value) or value < 0):
                raise InvalidTopologyError(
                    f"alpha-beta model: {name} = {value!r}; expected a finite number >= 0")


def from_topology(topology: "Topology") -> AlphaBeta:
    """The alpha-beta model of a topology's physical figures.

    ``alpha_us = topology.alpha_us`` and ``beta_us_per_byte = 1 / (topology.unit_gbps * 1e3)``:
    one bandwidth unit moves ``unit_gbps * 10**9`` bytes per second, ``unit_gbps * 10**3`` bytes
    per microsecond.

    Raises
    ------
    InvalidTopologyError
        When the topology lacks ``alpha_us`` or ``unit_gbps`` (synthesis does not need them, so
        many topologies leave them out).

    >>> from collsynth.topology import get_topology
    >>> from_topology(get_topology("dgx1"))
    AlphaBeta(alpha_us=0.7, beta_us_per_byte=4e-05)
    >>> from_topology(get_topology("ring:4"))
    Traceback (most recent call last):
    ...
    collsynth.errors.InvalidTopologyError: topology 'ring:4' has no alpha_us and no unit_gbps; ...
    """
    missing = [name for name in ("alpha_us", "unit_gbps") if getattr(topology, name) is None]
    if missing:
        raise InvalidTopologyError(
            f"topology {topology.name!r} has no {' and no '.join(missing)}; the timing model needs "
            "them: give them after the name (ring:8,unit_gbps=25,alpha_us=1), on the command line "
            "(--unit-gbps GBPS --alpha-us US), or in the topology file; or build "
            "AlphaBeta(alpha_us=..., beta_us_per_byte=...) yourself")
    return AlphaBeta(alpha_us=topology.alpha_us, beta_us_per_byte=1 / (topology.unit_gbps * 1e3))


def instance_time_us(steps: int, rounds_per_chunk: Real, chunk_bytes: Real,
                     model: AlphaBeta) -> float:
    """Microseconds of ``steps`` steps and ``rounds_per_chunk`` rounds per base chunk of
    ``chunk_bytes`` bytes: ``steps * alpha + rounds_per_chunk * chunk_bytes * beta``.

    Raises
    ------
    InvalidInstanceError
        For a negative or non-finite figure.

    On the 4-ring of the module example (2 us per step, 10**4 bytes per us per unit), 2 steps at
    3/2 rounds per chunk of 1000 bytes cost 4 us of latency and 0.15 us of transfer:

    >>> round(instance_time_us(2, Fraction(3, 2), 1000, AlphaBeta(2.0, 1e-4)), 6)
    4.15
    """
    volume = (exact_fraction(rounds_per_chunk, "rounds_per_chunk")
              * exact_fraction(chunk_bytes, "chunk_bytes"))
    steps_value = float(exact_fraction(steps, "steps"))
    return steps_value * model.alpha_us + float(volume) * model.beta_us_per_byte


def algorithm_time_us(algorithm: "Algorithm", size_bytes: Real, model: AlphaBeta) -> float:
    """Microseconds ``algorithm`` takes on a ``size_bytes`` buffer in the alpha-beta model.

    ``size_bytes`` is mapped to the base chunk by :func:`base_chunk_bytes` (nccl-tests
    convention, using the collective's name and rank count); the time is
    ``num_steps * alpha + rounds_per_chunk * base_chunk_bytes * beta``.

    Raises
    ------
    UnknownNameError
        For a collective without a buffer convention (use :func:`instance_time_us`).

    Examples
    --------
    A 4-GPU unidirectional ring with 10 GB/s links and 2 us per step, and its 3-step allgather (in
    step ``t`` every rank ``r`` forwards chunk ``r - t`` to ``r + 1``):

    >>> from collsynth.algorithm import Algorithm, Send, Step, verify
    >>> from collsynth.collective import allgather
    >>> from collsynth.topology import Topology
    >>> ring = Topology("ring4", ((0, 1, 0, 0), (0, 0, 1, 0), (0, 0, 0, 1), (1, 0, 0, 0)),
    ...                 unit_gbps=10.0, alpha_us=2.0)
    >>> steps = tuple(Step(1, tuple(Send((r - t) % 4, r, (r + 1) % 4) for r in range(4)))
    ...               for t in range(3))
    >>> ring_allgather = verify(Algorithm("ring", ring, allgather(4), steps))
    >>> model = from_topology(ring)
    >>> model
    AlphaBeta(alpha_us=2.0, beta_us_per_byte=0.0001)

    A 4 MB allgather (output buffer) moves base chunks of 1 MB: 3 steps of 2 us plus 3 rounds per
    chunk of 10**6 bytes at 10**4 bytes per us:

    >>> round(algorithm_time_us(ring_allgather, 4_000_000, model), 6)
    306.0
    """
    collective = algorithm.collective
    chunk = base_chunk_bytes(collective.name, collective.num_ranks, size_bytes)
    return instance_time_us(algorithm.num_steps, algorithm.rounds_per_chunk, chunk, model)


def crossover_bytes(a: Point, b: Point, collective_name: str, num_ranks: int,
                    model: AlphaBeta) -> Fraction | None:
    """The buffer size at which two (steps, rounds per chunk) points cost the same, or ``None``.

    With ``k`` base chunks per buffer (:func:`base_chunk_bytes`) the costs are equal when
    ``(S_a - S_b) * alpha = (r_b - r_a) * (size / k) * beta``, that is at
    ``size = k * (S_a - S_b) * alpha / ((r_b - r_a) * beta)``. Below that size the point with
    fewer steps is faster, above it the one with fewer rounds per chunk.

    The answer is exact: model figures given as floats are read as the shortest decimal that
    rounds to them (``0.7`` is ``7/10``), ints and Fractions as they are.

    Returns ``None`` when the costs never cross at a positive size: equal rounds per chunk, a
    point no worse in both figures, or a zero ``alpha`` or ``beta``.

    >>> model = AlphaBeta(alpha_us=2.0, beta_us_per_byte=1e-4)
    >>> crossover_bytes((2, 2), (3, Fraction(3, 2)), "allgather", 4, model)
    Fraction(160000, 1)
    >>> crossover_bytes((2, 2), (3, 2), "allgather", 4, model) is None
    True
    """
    steps_a, rounds_a = _point(a)
    steps_b, rounds_b = _point(b)
    per_buffer = 1 / base_chunk_bytes(collective_name, num_ranks, 1)
    alpha = exact_fraction(model.alpha_us, "alpha_us")
    beta = exact_fraction(model.beta_us_per_byte, "beta")
    if rounds_a == rounds_b or beta == 0:
        return None
    size = per_buffer * (steps_a - steps_b) * alpha / ((rounds_b - rounds_a) * beta)
    return size if size > 0 else None


def _point(point: Point) -> tuple[Fraction, Fraction]:
    """``(steps, rounds per chunk)`` as two Fractions."""
    if len(point) != 2:
        raise InvalidInstanceError(f"point {point!r}: expected (steps, rounds_per_chunk)")
    return exact_fraction(point[0], "steps"), exact_fraction(point[1], "rounds_per_chunk")

