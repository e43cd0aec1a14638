"""The closed-form cost model, symbolic in the buffer size, with exact crossovers.

The details (formats, conventions, rules) are in docs/timing.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from numbers import Real
from typing import TYPE_CHECKING, Mapping, Protocol, Sequence, Union, runtime_checkable

import sympy

from collsynth.collective.kinds import base_chunk_bytes
from collsynth.errors import InvalidInstanceError, InvalidTopologyError
from collsynth.exact import as_fraction, exact_fraction, sympy_rational
from collsynth.timing.alphabeta import AlphaBeta, from_topology

from collsynth.algorithm.model import Algorithm

if TYPE_CHECKING:  # pragma: no cover - imported for annotations only
    from collsynth.collective.model import Collective
    from collsynth.topology.model import Topology

__all__ = [
    "SIZE",
    "NETWORK_ALPHA_US",
    "CostModel",
    "cost_model",
    "as_cost_model",
    "Priceable",
    "step_figures",
    "reduced_pieces",
    "symbolic_time",
    "time_us",
    "crossover",
    "Segment",
    "lower_envelope",
]

#: The symbol every symbolic time is written in: the buffer size in bytes (nccl-tests convention).
SIZE = sympy.Symbol("size_bytes", positive=True)

#: Default per-step latency (us) of a link between nodes: NCCL's per-hop network latency for the
#: ring LL protocol (``hwLat[NET][RING][LL] = 2.7``, NCCL ``src/graph/tuning.cc``; see
#: docs/baselines.md), the network analogue of the 0.6 us NVLink figure the built-in
#: DGX-1 rounds to its ``alpha_us = 0.7``.
NETWORK_ALPHA_US = 2.7

#: A (steps, rounds per chunk) point.
Point = Sequence[Union[int, Fraction]]


@runtime_checkable
class SymbolicCost(Protocol):
    """Anything with its own closed form (e.g. one of NCCL's lines,
    :class:`collsynth.timing.tuning_model.NcclChoice`)."""

    def symbolic_time(self) -> sympy.Expr:  # pragma: no cover - protocol
        ...


#: What :func:`symbolic_time` prices: an algorithm, a point, anything with its own closed form,
#: or a sympy expression in :data:`SIZE`.
Priceable = Union[Algorithm, Point, SymbolicCost, sympy.Expr]


@dataclass(frozen=True)
class CostModel:
    """Per-link-class alpha and beta, and the reduction cost gamma.

    Parameters
    ----------
    links:
        Figures of the default class: every link when ``ranks_per_node`` is ``None``, else the
        links inside a node. ``beta_us_per_byte`` is per bandwidth unit.
    network:
        Figures of links between nodes (``None``: no such class).
    ranks_per_node:
        Ranks ``a`` and ``b`` share a node when ``a // ranks_per_node == b // ranks_per_node``
        (the numbering of :func:`~collsynth.topology.compose.compose_nodes`).
    gamma_us_per_byte:
        Microseconds one rank takes to reduce one byte (0: reductions are free).

    >>> CostModel(AlphaBeta(0.7, 1 / 25e3)).figures(0, 1)
    AlphaBeta(alpha_us=0.7, beta_us_per_byte=4e-05)
    """

    links: AlphaBeta
    network: AlphaBeta | None = None
    ranks_per_node: int | None = None
    gamma_us_per_byte: float = 0.0

    def __post_init__(self) -> None:
        if not isinstance(self.links, AlphaBeta) or not (
                self.network is None or isinstance(self.network, AlphaBeta)):
            raise InvalidTopologyError("cost model: links and network must be AlphaBeta values")
        if (self.network is None) != (self.ranks_per_node is None):
            raise InvalidTopologyError("cost model: give network and ranks_per_node together")
        if self.ranks_per_node is not None and (
                not isinstance(self.ranks_per_node, int) or self.ranks_per_node < 1):
            raise InvalidTopologyError(
                f"cost model: ranks_per_node = {self.ranks_per_node!r}; expected an integer >= 1")
        exact_fraction(self.gamma_us_per_byte, "gamma_us_per_byte")

    @property
    def class_names(self) -> tuple[str, ...]:
        """``("link",)`` or ``("intra-node", "network")``."""
        return ("link",) if self.network is None else ("intra-node", "network")

    def class_of(self, src: int, dst: int) -> str:
        """The class of the link ``src -> dst``."""
        if self.network is None:
            return "link"
        same = src // self.ranks_per_node == dst // self.ranks_per_node
        return "intra-node" if same else "network"

    def figures(self, src: int, dst: int) -> AlphaBeta:
        """Alpha and beta (per unit) of the link ``src -> dst``."""
        if self.network is not None and self.class_of(src, dst) == "network":
            return self.network
        return self.links


def cost_model(topology: "Topology", *, gamma_us_per_byte: Real = 0.0,
               network_alpha_us: Real | None = None) -> CostModel:
    """The cost model of a topology's physical figures.

    Parameters
    ----------
    topology:
        Needs ``alpha_us`` and ``unit_gbps`` (:func:`~collsynth.timing.alphabeta.from_topology`);
        a calibration's measured figures are put on it first
        (:meth:`collsynth.timing.calibration.CurveCalibration.apply`,
        :class:`collsynth.timing.closed_form.ClosedForm` does so).
    gamma_us_per_byte:
        Reduction cost per byte (see :mod:`collsynth.timing.kernels`).
    network_alpha_us:
        Latency of a step over a link between nodes (composed topologies only); default
        ``metadata["network"]["alpha_us"]`` when the topology carries one, else
        :data:`NETWORK_ALPHA_US`.

    Raises
    ------
    InvalidTopologyError
        When the topology lacks ``alpha_us`` or ``unit_gbps``.

    >>> from collsynth.topology import get_topology
    >>> cost_model(get_topology("dgx1")).class_names
    ('link',)
    """
    base = from_topology(topology)
    gamma = float(gamma_us_per_byte)
    layout = topology.layout
    if layout is None or not layout.multi_node:
        return CostModel(base, gamma_us_per_byte=gamma)
    per_node = layout.ranks_per_node
    if network_alpha_us is None:
        network_alpha_us = layout.network_alpha_us if layout.network_alpha_us is not None \
            else NETWORK_ALPHA_US
    beta = from_topology(topology).beta_us_per_byte
    declared, units = layout.nic_gbps_declared, layout.nic_units
    if declared is not None and units is not None and declared > 0 and units > 0:
        beta = 1 / (declared / units * 1e3)  # the NIC's own GB/s per unit, before rounding
    return CostModel(base, AlphaBeta(float(network_alpha_us), beta), per_node, gamma)


def as_cost_model(model: "CostModel | AlphaBeta | Topology") -> CostModel:
    """A :class:`CostModel` from the figures given: itself, one class of an
    :class:`~collsynth.timing.alphabeta.AlphaBeta`, or :func:`cost_model` of a topology.

    >>> as_cost_model(AlphaBeta(0.7, 1 / 25e3)).links.alpha_us
    0.7
    """
    if isinstance(model, CostModel):
        return model
    if isinstance(model, AlphaBeta):
        return CostModel(model)
    return cost_model(model)


def _model_for(model: "CostModel | AlphaBeta | Topology | None",
               algorithm: "Algorithm | None") -> CostModel:
    if model is not None:
        return as_cost_model(model)
    if algorithm is None:
        raise InvalidInstanceError(
            "a (steps, rounds per chunk) point needs model= (a CostModel, AlphaBeta or "
            "Topology with alpha_us and unit_gbps)")
    return cost_model(algorithm.topology)


def step_figures(algorithm: "Algorithm", model: CostModel | AlphaBeta | None = None
                 ) -> tuple[AlphaBeta, ...]:
    """The (alpha, beta) charged to each step: the slowest class among the links it uses.

    ``alpha`` is the largest alpha and ``beta`` the largest beta (per unit) among the classes of
    the links that carry a send in the step; a step without sends gets the default class.
    """
    cm = _model_for(model, algorithm)
    result = []
    for step in algorithm.steps:
        used = {cm.class_of(s.src, s.dst): cm.figures(s.src, s.dst) for s in step.sends}
        if not used:
            result.append(cm.links)
            continue
        alpha = max((f.alpha_us for f in used.values()), key=exact_fraction)
        beta = max((f.beta_us_per_byte for f in used.values()), key=exact_fraction)
        result.append(AlphaBeta(alpha, beta))
    return tuple(result)


def reduced_pieces(algorithm: "Algorithm") -> tuple[int, ...]:
    """Per step, the most reducing sends any one rank receives (``m_t`` in docs/timing.md).

    Each is one piece (``1 / chunks`` of a base chunk) the receiver combines into its buffer.
    """
    result = []
    for step in algorithm.steps:
        counts: dict[int, int] = {}
        for send in step.sends:
            if send.reduce:
                counts[send.dst] = counts.get(send.dst, 0) + 1
        result.append(max(counts.values(), default=0))
    return tuple(result)


def symbolic_time(source: Priceable, collective: "str | Collective | None" = None,
                  n: int | None = None, *,
                  model: "CostModel | AlphaBeta | Topology | None" = None,
                  reduced_chunks: Real = 0) -> sympy.Expr:
    """Microseconds as a sympy expression in :data:`SIZE`, with exact rational coefficients.

    Parameters
    ----------
    source:
        An :class:`~collsynth.algorithm.Algorithm` (priced step by step, see
        docs/timing.md); a ``(steps, rounds_per_chunk)`` point, priced with one alpha and beta (the
        default class of ``model``, since a point has no links to classify); anything with a
        ``symbolic_time()`` method (an NCCL baseline); or a sympy expression (returned as is).
    collective, n:
        For a point: the collective's name (or a :class:`~collsynth.collective.Collective`) and
        its rank count, which fix the base chunks per buffer. Ignored for an algorithm.
    model:
        The figures (default for an algorithm: :func:`cost_model` of its topology).
    reduced_chunks:
        For a point only: base chunks reduced on the critical path (an algorithm counts its own).

    Raises
    ------
    InvalidTopologyError
        When the figures are missing.
    UnknownNameError
        For a collective without a buffer convention.

    >>> symbolic_time((2, Fraction(3, 2)), "allgather", 8, model=AlphaBeta(0.7, 1 / 25e3))
    3*size_bytes/400000 + 7/5
    """
    if isinstance(source, sympy.Expr):
        return source
    if isinstance(source, Algorithm):
        algorithm = source
        cm = _model_for(model, algorithm)
        coll = algorithm.collective
        per_chunk = base_chunk_bytes(coll.name, coll.num_ranks, 1)  # 1 / k
        piece = sympy.Rational(per_chunk.numerator, per_chunk.denominator) / algorithm.chunks
        total = sympy.Integer(0)
        gamma = sympy_rational(cm.gamma_us_per_byte)
        for step, figures, reduced in zip(algorithm.steps, step_figures(algorithm, cm),
                                          reduced_pieces(algorithm)):
            total += sympy_rational(figures.alpha_us)
            total += step.rounds * piece * SIZE * sympy_rational(figures.beta_us_per_byte)
            total += gamma * reduced * piece * SIZE
        return sympy.expand(total)
    if isinstance(source, SymbolicCost):
        return source.symbolic_time()
    steps, rpc = _point(source)
    if collective is None or n is None:
        raise InvalidInstanceError(
            "a (steps, rounds per chunk) point needs the collective's name and rank count")
    name = collective if isinstance(collective, str) else collective.name
    cm = _model_for(model, None)
    per_chunk = base_chunk_bytes(name, n, 1)
    chunk = sympy.Rational(per_chunk.numerator, per_chunk.denominator) * SIZE
    alpha, beta = sympy_rational(cm.links.alpha_us), sympy_rational(cm.links.beta_us_per_byte)
    gamma = sympy_rational(cm.gamma_us_per_byte)
    reduced = sympy_rational(reduced_chunks)
    return sympy.expand(sympy_rational(steps) * alpha + sympy_rational(rpc) * chunk * beta
                        + gamma * reduced * chunk)


def time_us(source: Priceable, size_bytes: Real, collective: "str | Collective | None" = None,
            n: int | None = None, *,
            model: "CostModel | AlphaBeta | Topology | None" = None,
            reduced_chunks: Real = 0) -> float:
    """:func:`symbolic_time` evaluated at ``size_bytes`` (a float, in microseconds).

    >>> time_us((2, Fraction(3, 2)), 10**6, "allgather", 8, model=AlphaBeta(0.7, 1 / 25e3))
    8.9
    """
    expr = symbolic_time(source, collective, n, model=model, reduced_chunks=reduced_chunks)
    return float(expr.subs(SIZE, sympy_rational(size_bytes)))


def crossover(a: Priceable, b: Priceable, collective: "str | Collective | None" = None,
              n: int | None = None, *,
              model: "CostModel | AlphaBeta | Topology | None" = None) -> Fraction | None:
    """The buffer size (bytes, exact) at which ``a`` and ``b`` cost the same, or ``None``.

    ``a`` and ``b`` are anything :func:`symbolic_time` accepts (algorithms, points, NCCL baselines,
    expressions). Both times are linear in ``size_bytes``; the equation is solved with sympy and
    the root returned as a :class:`~fractions.Fraction`. Below it the one with the smaller
    constant term (latency) is faster, above it the one with the smaller slope (bandwidth).

    Returns ``None`` when the lines never cross at a positive size: equal slopes (parallel or
    identical lines) or a root at or below zero (one is never slower).

    >>> m = AlphaBeta(0.7, 1 / 25e3)
    >>> crossover((2, Fraction(3, 2)), (3, Fraction(7, 6)), "allgather", 8, model=m)
    Fraction(420000, 1)
    >>> crossover((2, 2), (3, 2), "allgather", 8, model=m) is None
    True

    The 3-step allgather on a 4-GPU unidirectional ring (2 us per step, 10 GB/s per link):

    >>> from collsynth.algorithm import Algorithm, Send, Step, verify
    >>> from collsynth.collective import allgather
    >>> from collsynth.topology import Topology
    >>> ring = Topology("ring4", ((0, 1, 0, 0), (0, 0, 1, 0), (0, 0, 0, 1), (1, 0, 0, 0)),
    ...                 unit_gbps=10.0, alpha_us=2.0)
    >>> steps = tuple(Step(1, tuple(Send((r - t) % 4, r, (r + 1) % 4) for r in range(4)))
    ...               for t in range(3))
    >>> ring_allgather = verify(Algorithm("ring", ring, allgather(4), steps))
    >>> symbolic_time(ring_allgather)
    3*size_bytes/40000 + 6

    A 2-step point at 4 rounds per chunk crosses it where ``4 + size/10000 = 6 + 3 size/40000``:

    >>> crossover((2, 4), ring_allgather, "allgather", 4, model=cost_model(ring))
    Fraction(80000, 1)
    """
    ta = symbolic_time(a, collective, n, model=model)
    tb = symbolic_time(b, collective, n, model=model)
    difference = sympy.expand(ta - tb)
    if difference.free_symbols - {SIZE}:
        raise InvalidInstanceError(f"crossover: times must depend on size_bytes only, got "
                                   f"{difference}")
    poly = sympy.Poly(difference, SIZE)
    if poly.degree() > 1:
        raise InvalidInstanceError(
            f"crossover: times must be linear in size_bytes, got {difference}")
    if poly.degree() < 1:  # parallel or identical lines
        return None
    roots = sympy.solve(sympy.Eq(ta, tb), SIZE)
    if not roots:  # a root <= 0 is excluded by the positive symbol
        return None
    return as_fraction(roots[0])


@dataclass(frozen=True)
class Segment:
    """One piece of a lower envelope: ``name`` is fastest from ``from_bytes`` to ``to_bytes``."""

    name: str
    from_bytes: Fraction
    to_bytes: Fraction


def lower_envelope(times: Mapping[str, sympy.Expr], from_bytes: Real, to_bytes: Real
                   ) -> tuple[Segment, ...]:
    """Which of several linear times is fastest over ``[from_bytes, to_bytes]``, exactly.

    Returns consecutive :class:`Segment` values whose boundaries are the exact crossovers between
    consecutive winners. Ties go to the smaller slope (it wins just after), then to the name
    given first.

    >>> e = lower_envelope({"a": 1 + SIZE, "b": 3 + SIZE / 2}, 1, 10)
    >>> [(s.name, s.from_bytes, s.to_bytes) for s in e]
    [('a', Fraction(1, 1), Fraction(4, 1)), ('b', Fraction(4, 1), Fraction(10, 1))]
    """
    if not times:
        return ()
    lo = exact_fraction(from_bytes, "from_bytes")
    hi = exact_fraction(to_bytes, "to_bytes")
    if hi < lo:
        raise InvalidInstanceError(f"lower_envelope: from {lo} > to {hi}")
    lines = {}
    for order, (name, expr) in enumerate(times.items()):
        poly = sympy.Poly(sympy.expand(expr), SIZE)
        if poly.degree() > 1:
            raise InvalidInstanceError(f"lower_envelope: {name}: not linear in size_bytes")
        slope = as_fraction(poly.coeff_monomial(SIZE))
        const = as_fraction(poly.coeff_monomial(1))
        lines[name] = (const, slope, order)

    def value(name: str, x: Fraction) -> Fraction:
        const, slope, _ = lines[name]
        return const + slope * x

    def best_at(x: Fraction) -> str:
        return min(lines, key=lambda nm: (value(nm, x), lines[nm][1], lines[nm][2]))

    segments: list[Segment] = []
    x, current = lo, best_at(lo)
    while True:
        c0, s0, _ = lines[current]
        nxt: tuple[Fraction, Fraction, int, str] | None = None
        for name, (c, s, order) in lines.items():
            if s >= s0:
                continue
            cross = (c - c0) / (s0 - s)
            if cross <= x:
                cross = x  # already cheaper or equal; only possible at the start on ties
            key = (cross, s, order, name)
            if nxt is None or key < nxt:
                nxt = key
        if nxt is None or nxt[0] >= hi:
            segments.append(Segment(current, x, hi))
            return tuple(segments)
        if nxt[0] > x:
            segments.append(Segment(current, x, nxt[0]))
        x, current = nxt[0], nxt[3]


# -- helpers ------------------------------------------------------------------------------------




def _point(point: object) -> tuple[Fraction, Fraction]:
    if not isinstance(point, (tuple, list)) or len(point) != 2:
        raise InvalidInstanceError(
            f"{point!r}: expected an algorithm, a (steps, rounds_per_chunk) point, an NCCL "
            "baseline or a sympy expression")
    return exact_fraction(point[0], "steps"), exact_fraction(point[1], "rounds_per_chunk")


