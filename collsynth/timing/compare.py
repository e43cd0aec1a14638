"""Algorithms against NCCL's own ring and tree on one topology, as exact lines in the size.

A :class:`Comparison` holds each candidate's time (a sympy expression in ``size_bytes``, from
:mod:`collsynth.timing.model` and :mod:`collsynth.timing.nccl`) so that ``collsynth time``,
``collsynth plot`` and the planner read the winner at any size exactly.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Mapping, Sequence

from collsynth.errors import CollsynthError, UnknownNameError
from collsynth.timing.alphabeta import algorithm_time_us, from_topology
from collsynth.timing.kernels import reduce_gamma_us_per_byte
from collsynth.exact import as_fraction, sympy_rational
from collsynth.timing.model import SIZE, cost_model, symbolic_time
from collsynth.timing.nccl import best_choice, nccl_choices, nccl_setup
from collsynth.runtimes import get_runtime

__all__ = ["Comparison", "compare", "predicted_against_nccl", "PREDICTION_SIZES"]

#: Buffer sizes (bytes, nccl-tests convention) :func:`predicted_against_nccl` reports by default.
PREDICTION_SIZES = (1 << 20, 64 << 20, 1 << 30)


@dataclass(frozen=True)
class Comparison:
    """Algorithms and NCCL baselines on one topology and collective, as sympy lines.

    ``lines`` maps each candidate's name to its time (a sympy expression in ``size_bytes``):
    first the algorithms, then every NCCL (algorithm, protocol) as ``"nccl ring/LL"``..., then
    the ``measured`` lines (a calibration's fitted line of the collective, NCCL as measured).
    ``families`` maps ``"nccl ring"`` / ``"nccl tree"`` to the names of its protocol lines.
    """

    collective: str
    num_ranks: int
    topology: str
    algorithms: tuple[str, ...]
    lines: dict[str, Any]
    families: dict[str, tuple[str, ...]]
    notes: tuple[str, ...]
    measured: tuple[str, ...] = ()

    def time_us(self, name: str, size_bytes: int | Fraction) -> float:
        return float(self.lines[name].subs(SIZE, Fraction(size_bytes)))

    def best_of(self, names: Sequence[str], size_bytes: int | Fraction) -> str:
        """The fastest of ``names`` at ``size_bytes`` (exact comparison; ties: the first)."""
        size = Fraction(size_bytes)
        return min(names, key=lambda nm: as_fraction(self.lines[nm].subs(SIZE, size)))

    def rows(self, size_bytes: int) -> list[tuple[str, str]]:
        """``(shown name, line name)`` per candidate: each algorithm, then NCCL's best ring and
        best tree at this size (``"nccl ring/LL"``)."""
        result = [(name, name) for name in self.algorithms]
        for family, names in self.families.items():
            best = self.best_of(names, size_bytes)
            result.append((best, best))
        result.extend((name, name) for name in self.measured)
        return result


def compare(algorithms: Sequence[Any], *, calibration: Any = None,
            device: str | None = None) -> Comparison:
    """Build the :class:`Comparison` of ``algorithms`` (same collective, ranks and topology).

    With a ``calibration`` (:mod:`collsynth.timing.calibration`), ``calibration.apply`` gives the
    measured per-step alpha and per-unit GB/s used for the algorithms and NCCL's channels, and
    ``calibration.alpha_beta_for`` the measured line of the collective itself (added as
    ``"measured <collective>"`` when the calibration has one for this rank count).
    ``device`` names the GPU whose reduction cost (gamma) combining collectives pay.

    Raises
    ------
    CollsynthError
        When the algorithms differ in collective, rank count or topology, or figures are missing.
    """
    if not algorithms:
        raise CollsynthError("no algorithm to time")
    first = algorithms[0]
    for other in algorithms[1:]:
        if (other.collective.name, other.collective.num_ranks) != (
                first.collective.name, first.collective.num_ranks):
            raise CollsynthError(
                f"algorithms of different collectives: {first.collective.describe()} and "
                f"{other.collective.describe()}; time them separately")
        if other.topology.links != first.topology.links:
            raise CollsynthError(
                f"algorithms on different topologies: {first.topology.name} and "
                f"{other.topology.name}; time them separately")
    coll = first.collective.name
    gamma = reduce_gamma_us_per_byte(device) if device is not None else 0.0
    topology = calibration.apply(first.topology) if calibration is not None else first.topology
    model = cost_model(first.topology, gamma_us_per_byte=gamma, calibration=calibration)
    lines: dict[str, Any] = {}
    names = []
    for algorithm in algorithms:
        name = algorithm.name or "algorithm"
        while name in lines:
            name += "'"
        lines[name] = symbolic_time(algorithm, model=model)
        names.append(name)
    notes = []
    families: dict[str, tuple[str, ...]] = {}
    try:
        setup = nccl_setup(topology, model=model)
    except CollsynthError as exc:
        notes.append(f"no NCCL baseline: {exc}")
        setup = None
    if setup is not None:
        choices = nccl_choices(setup, coll)
        if not choices:
            notes.append(f"no NCCL baseline: NCCL runs {coll} as grouped send/recv, outside "
                         "its ring/tree tuning model")
        for choice in choices:
            family = f"nccl {choice.algorithm}"
            line = f"nccl {choice.name}"
            lines[line] = choice.symbolic_time()
            families[family] = families.get(family, ()) + (line,)
        if choices and "nccl tree" not in families:
            notes.append(f"NCCL has no tree for {coll} (tree is allreduce only)")
        notes.append(f"NCCL: {len(setup.rings)} ring channel(s), {setup.bus_gbps:g} GB/s bus "
                     f"bandwidth, {setup.hardware} hops, {setup.nodes} node(s)")
    measured: tuple[str, ...] = ()
    if calibration is not None:
        try:
            line = calibration.alpha_beta_for(coll, ranks=first.collective.num_ranks)
        except UnknownNameError as exc:
            notes.append(f"no measured line: {exc}")
        else:
            name = f"measured {coll}"
            lines[name] = sympy_rational(line.alpha_us) + sympy_rational(line.beta_us_per_byte) * SIZE
            measured = (name,)
        used = topology.metadata.get("calibration") if isinstance(topology.metadata, Mapping) \
            else None
        notes.append(f"calibrated: alpha {topology.alpha_us:.4g} us per step, "
                     f"{topology.unit_gbps:.4g} GB/s per unit"
                     + (f" (from {used.get('file')})" if isinstance(used, Mapping) else ""))
    if first.collective.combining:
        notes.append(f"reductions: gamma = {gamma:.3g} us/byte" + (
            f" ({device})" if device else " (pass --device to charge them)"))
    return Comparison(coll, first.collective.num_ranks, first.topology.name, tuple(names),
                      lines, families, tuple(notes), measured)


#: What every call pays before its first byte moves (NCCL's ``baseLat`` of its Simple ring,
#: :mod:`collsynth.timing.runtime_constants`), charged to synthesized algorithms alike.
BASE_LATENCY_US = get_runtime("nccl").defaults.base_latency("Simple")


def predicted_against_nccl(algorithm: Any, sizes_bytes: Sequence[int] = PREDICTION_SIZES
                           ) -> list[dict[str, Any]]:
    """Predicted microseconds of ``algorithm`` and of NCCL's best ring and best tree protocol
    (alpha-beta model of its topology) at each size: ``{"bytes", "collsynth", "nccl_ring",
    "nccl_tree"}`` per size (``None`` where NCCL has no such algorithm); ``[]`` when the topology
    has no physical figures or NCCL has no model of the collective.

    ``algorithm`` pays NCCL's base latency (``Simple``, :data:`BASE_LATENCY_US`) besides its
    steps: an MSCCL program runs inside the same kernel launch and proxy machinery as NCCL's own
    algorithms, whose lines include it. (The program model, ``collsynth time FILE.xml``, prices
    both sides in full.)"""
    try:
        model = from_topology(algorithm.topology)
        setup = nccl_setup(algorithm.topology)
        choices = nccl_choices(setup, algorithm.collective.name)
    except CollsynthError:
        return []
    rows = []
    for size in sizes_bytes:
        row = {"bytes": size,
               "collsynth": BASE_LATENCY_US + algorithm_time_us(algorithm, size, model)}
        for kind in ("ring", "tree"):
            mine = [c for c in choices if c.algorithm == kind]
            row[f"nccl_{kind}"] = best_choice(mine, size).time_us(size) if mine else None
        rows.append(row)
    return rows
