"""The alpha-beta cost model: one latency per step plus one transfer time per byte.

The details (formats, conventions, rules) are in docs/timing.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from numbers import Real
from typing import TYPE_CHECKING

from collsynth.errors import InvalidTopologyError

if TYPE_CHECKING:  # pragma: no cover - imported for annotations only
    from collsynth.topology.model import Topology

__all__ = ["AlphaBeta", "from_topology"]

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
    crossovers (:func:`collsynth.timing.model.crossover`) exact for figures without a short
    decimal form.

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
