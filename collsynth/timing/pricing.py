"""One pricing interface: what a subject costs at some sizes, by a model given as a parameter.

A *subject* is a synthesized :class:`~collsynth.algorithm.Algorithm`, an MSCCL
:class:`~collsynth.export.program.Program`, or one of a runtime's own algorithms
(:class:`RuntimeAlgorithm`). A *model* (:class:`PricingModel`) says whether it can price a
subject and prices it: the closed form (:class:`collsynth.timing.closed_form.ClosedForm`), the
program model (:class:`collsynth.timing.program_model.ProgramModel`), a measured curve
(:class:`collsynth.timing.closed_form.Measured`). Callers never branch on a model's name, as
networkx's flow functions take ``flow_func``; docs/timing.md, "One pricing interface".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Callable, Mapping, Protocol, Sequence, Union, runtime_checkable

from collsynth.algorithm.model import Algorithm
from collsynth.collective.kinds import canonical_name
from collsynth.errors import (ExportError, InputTooLargeError, InvalidInstanceError,
                              InvalidTopologyError, UnimplementableError, UnknownNameError,
                              VerificationError)
from collsynth.export.program import Program
from collsynth.runtimes import Runtime, check_protocol
from collsynth.timing.runtime_baselines import P2P_COLLECTIVES, TREE_COLLECTIVES

if TYPE_CHECKING:  # pragma: no cover - imported for annotations only
    import sympy

    from collsynth.topology.model import Topology

__all__ = ["Subject", "RuntimeAlgorithm", "MEASURED", "runtime_algorithms", "subject_name",
           "Price", "PricingModel", "LinearPricingModel", "PriceTable", "price_table",
           "fastest_runtime_algorithm", "RUNS_ON_RING", "pinned_protocols", "PRICING_FAILURES",
           "require_communication"]

#: What a model raises for a subject it cannot price, beyond :meth:`PricingModel.why_not`: a
#: lowering the runtime cannot express (ExportError, a thread block over its limits), a program
#: that deadlocks or names a rank outside the topology, one too large to simulate, a topology
#: without figures, an algorithm that fails its verification. A caller that lists several
#: subjects reports these per subject and prices the others.
PRICING_FAILURES = (ExportError, InvalidInstanceError, InputTooLargeError, InvalidTopologyError,
                    UnknownNameError, VerificationError, UnimplementableError)
#: Collectives the NCCL-family runtimes run on their ring (their tree: TREE_COLLECTIVES); the
#: others (alltoall, gather, scatter) run as grouped send/recv (alltoall: their ``p2p``).
RUNS_ON_RING = ("allreduce", "allgather", "reduce_scatter", "broadcast", "reduce")
#: The algorithm of a :class:`RuntimeAlgorithm` that stands for whatever the runtime ran, as one
#: measured curve (:class:`collsynth.timing.closed_form.Measured` prices it).
MEASURED = "measured"


def require_communication(topology: "Topology", what: str) -> None:
    """Refuse a topology of one rank by name: a collective there moves nothing, and NCCL's and
    RCCL's cost models divide by the ranks less one (the one home of this refusal)."""
    if topology.num_ranks < 2:
        raise InvalidTopologyError(f"topology {topology.name!r} has {topology.num_ranks} rank: "
                                   f"{what} needs at least 2 ranks (a collective on one rank "
                                   "has nothing to communicate)")


@dataclass(frozen=True)
class RuntimeAlgorithm:
    """One of a runtime's own algorithms for a collective on a topology: what NCCL or RCCL run
    without any custom program.

    ``channels`` and ``protocol`` pin them (``None``: the runtime's own choice, per size).

    >>> from collsynth.runtimes import get_runtime
    >>> from collsynth.topology import get_topology
    >>> RuntimeAlgorithm(get_runtime("rccl"), "ring", "allgather", get_topology("ring:4")).name
    'rccl-ring'
    >>> RuntimeAlgorithm(get_runtime("msccl"), "tree", "allreduce", get_topology("ring:4"),
    ...                  protocol="LL").name
    'nccl-tree/LL'
    """

    runtime: Runtime
    algorithm: str
    collective: str
    topology: "Topology" = field(compare=False)
    channels: int | None = None
    protocol: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.runtime, Runtime):
            raise InvalidInstanceError(f"RuntimeAlgorithm: runtime = {self.runtime!r}; expected "
                                       "a Runtime (collsynth.runtimes.get_runtime)")
        object.__setattr__(self, "collective", canonical_name(self.collective))
        require_communication(self.topology, f"a runtime's {self.algorithm}")
        if self.protocol is not None:
            check_protocol(self.protocol)
        if self.channels is not None and (isinstance(self.channels, bool) or
                                          not isinstance(self.channels, int) or self.channels < 1):
            raise InvalidInstanceError(f"RuntimeAlgorithm: channels = {self.channels!r}; "
                                       "expected a whole number >= 1")

    @property
    def name(self) -> str:
        """``"nccl-ring"``, ``"rccl-tree"``; ``"nccl-ring/LL"`` with a pinned protocol,
        ``"nccl-ring/LL/2ch"`` with pinned channels too (msccl and msccl-executor run NCCL's)."""
        text = f"{self.runtime.family}-{self.algorithm}"
        if self.protocol is not None:
            text += f"/{self.protocol}"
        if self.channels is not None:
            text += f"/{self.channels}ch"
        return text

    def pinned(self, protocol: str) -> "RuntimeAlgorithm":
        """The same algorithm with its protocol fixed."""
        return RuntimeAlgorithm(self.runtime, self.algorithm, self.collective, self.topology,
                                self.channels, protocol)


#: What a model prices.
Subject = Union[Algorithm, Program, RuntimeAlgorithm]


def subject_name(subject: Subject) -> str:
    """The name a price carries: the algorithm's or program's name, the runtime algorithm's."""
    if isinstance(subject, RuntimeAlgorithm):
        return subject.name
    return subject.name or ("algorithm" if isinstance(subject, Algorithm) else "program")


def runtime_algorithms(runtime: Runtime, collective: str, topology: "Topology"
                       ) -> tuple[RuntimeAlgorithm, ...]:
    """Every own algorithm ``runtime`` would consider for ``collective`` on ``topology``: its
    ring for the collectives it runs on rings, its tree for allreduce, and NVLS, NVLS-tree and
    PAT where the runtime's own rules offer them on the machine (its facts: NVLink SHARP, one
    GPU per node...; :func:`collsynth.timing.tuning_model.offered_protocols`, the one home of
    those rules), and CollNet (direct, chain) where the network's facts say ``sharp``. A model
    may still be unable to price one here
    (:meth:`PricingModel.why_not` says why: no ring through every rank, a link the tree
    needs). Callers never list the algorithms themselves.

    >>> from collsynth.runtimes import get_runtime
    >>> from collsynth.topology import get_topology
    >>> [a.name for a in runtime_algorithms(get_runtime("nccl"), "allreduce",
    ...                                     get_topology("dgx1"))]
    ['nccl-ring', 'nccl-tree']
    >>> [a.name for a in runtime_algorithms(get_runtime("nccl"), "allreduce",
    ...                                     get_topology("dgx-h100"))]
    ['nccl-ring', 'nccl-tree', 'nccl-nvls']
    >>> [a.name for a in runtime_algorithms(get_runtime("nccl"), "alltoall",
    ...                                     get_topology("dgx1"))]
    ['nccl-p2p']
    """
    key = canonical_name(collective)
    found = []
    # the tuning's offer (one setup: a ring search), asked for once and only where needed
    offered: list[frozenset[str] | None] = []

    def offer() -> frozenset[str] | None:
        if not offered:
            offered.append(_offered(runtime, key, topology))
        return offered[0]
    for algorithm in runtime.own_algorithms:
        if algorithm in ("ring", "tree"):
            runs = key in (RUNS_ON_RING if algorithm == "ring" else TREE_COLLECTIVES)
        elif algorithm == "p2p":
            runs = key in P2P_COLLECTIVES
        else:
            runs = algorithm in (offer() or ())
        if runs:
            found.append(RuntimeAlgorithm(runtime, algorithm, key, topology))
    if not runtime.settings.default:
        found = _narrowed(runtime, key, topology, found, offer())
    return tuple(found)


def _narrowed(runtime: Runtime, collective: str, topology: "Topology",
              found: list[RuntimeAlgorithm], offered: frozenset[str] | None
              ) -> list[RuntimeAlgorithm]:
    """``found`` under the job's settings (``runtime.settings``): what the runtime's tuning
    still ``offered`` (:func:`collsynth.timing.tuning_model.enabled`, the one home of those
    rules, by version); without a tuning on the machine (``None``), NCCL_ALGO's list as the
    version applies it, the ring kept where that version gives it back. Send/recv is not
    NCCL_ALGO's."""
    from collsynth.runtimes.protocols import PROTOCOLS
    from collsynth.timing.tuning_model import COLLECTIVES, DEFAULT_VERSION, RCCL_DEFAULT_VERSION

    if collective not in COLLECTIVES:
        return found
    if offered is not None:
        keep = offered
    else:  # no tuning: the lists alone
        settings = runtime.settings
        version = runtime.version or (RCCL_DEFAULT_VERSION if runtime.family == "rccl"
                                      else DEFAULT_VERSION)
        layout = topology.layout
        allowed = settings.enabled_algorithms(
            version, collective, nodes=layout.nodes if layout is not None else 1, collnet=False)
        keep = frozenset(a.algorithm for a in found if any(
            settings.allows(a.algorithm, p, algorithms=allowed) for p in PROTOCOLS))
        if not keep and settings.ring_fallback(version):
            keep = frozenset({"ring"})
    return [a for a in found if a.algorithm == "p2p" or a.algorithm in keep]


def pinned_protocols(subject: RuntimeAlgorithm, model: "PricingModel"
                     ) -> tuple[RuntimeAlgorithm, ...]:
    """``subject`` pinned to each protocol of its runtime that ``model`` prices it with (NVLS
    and PAT run Simple only): the lines of a linear model, of which the runtime takes the
    fastest at each size.

    >>> from collsynth.runtimes import get_runtime
    >>> from collsynth.timing.closed_form import ClosedForm
    >>> from collsynth.topology import get_topology
    >>> ring, tree, nvls = runtime_algorithms(get_runtime("nccl"), "allreduce",
    ...                                       get_topology("dgx-h100"))
    >>> [p.name for p in pinned_protocols(nvls, ClosedForm())]
    ['nccl-nvls/Simple']
    """
    return tuple(p for p in map(subject.pinned, subject.runtime.protocols)
                 if model.why_not(p) is None)


def _offered(runtime: Runtime, collective: str, topology: "Topology") -> frozenset[str] | None:
    """The algorithms the runtime's tuning offers for ``collective`` on ``topology``'s machine
    under its settings; ``None`` for a collective outside the tuning or a machine whose facts
    cannot set it up (no architecture, no NICs...)."""
    from collsynth.timing.tuning_model import (ALGORITHMS, COLLECTIVES, SETUP_FAILURES,
                                               offered_protocols, tuning_setup)

    if collective not in COLLECTIVES:
        return None
    try:
        setup = tuning_setup(topology, runtime=runtime.family, version=runtime.version,
                             settings=runtime.settings)
    except SETUP_FAILURES:  # no tuning here: the ring and the tree only
        return None
    return frozenset(a for a in ALGORITHMS if offered_protocols(setup, collective, a))


@dataclass(frozen=True)
class Price:
    """What ``subject`` costs at ``size_bytes`` (nccl-tests convention) by ``model``:
    ``time_us``, nccl-tests ``algbw_gbps`` and ``busbw_gbps``, and how it ran (``protocol``,
    ``channels``, ``note``: e.g. ``"tuned: 2ch/chunk x1 LL128"``)."""

    subject: str
    size_bytes: int
    time_us: float
    algbw_gbps: float
    busbw_gbps: float
    model: str
    protocol: str | None = None
    channels: int | None = None
    note: str = ""

    def as_dict(self) -> dict[str, object]:
        return {"name": self.subject, "size_bytes": self.size_bytes, "time_us": self.time_us,
                "algbw_gbps": self.algbw_gbps, "busbw_gbps": self.busbw_gbps,
                "model": self.model, "protocol": self.protocol, "channels": self.channels,
                "note": self.note}


@runtime_checkable
class PricingModel(Protocol):
    """A model that prices subjects. ``name`` (``"closed-form"``, ``"program-model"``,
    ``"measured"``) and ``provenance`` (where its figures come from) are shown with its
    prices."""

    name: str
    provenance: str

    def why_not(self, subject: Subject) -> str | None:  # pragma: no cover - protocol
        """``None`` when the model can price ``subject``; otherwise why not (one line)."""
        ...

    def price(self, subject: Subject, sizes: Sequence[int]) -> tuple[Price, ...]:
        """One :class:`Price` per size, in the order given (pragma: protocol)."""
        ...  # pragma: no cover - protocol


@runtime_checkable
class LinearPricingModel(PricingModel, Protocol):
    """A model whose times are lines in the size: exact crossovers and envelopes."""

    def line(self, subject: Subject) -> "sympy.Expr":  # pragma: no cover - protocol
        """The time as a sympy expression in :data:`collsynth.timing.model.SIZE`, exact."""
        ...


@dataclass(frozen=True)
class PriceTable:
    """Several subjects priced by one model: ``prices`` (subject by subject, each at every
    size), ``subjects`` (the names priced, in order) and ``errors`` (name -> why the model
    could not price it; the others are still priced)."""

    model: str
    provenance: str
    sizes: tuple[int, ...]
    subjects: tuple[str, ...]
    prices: tuple[Price, ...]
    errors: Mapping[str, str] = field(default_factory=dict)

    def of(self, subject: str) -> tuple[Price, ...]:
        """The prices of one subject, by size."""
        return tuple(p for p in self.prices if p.subject == subject)

    def at(self, size_bytes: int) -> tuple[Price, ...]:
        """Every subject's price at one size, in subject order."""
        return tuple(p for p in self.prices if p.size_bytes == size_bytes)

    def best(self, size_bytes: int) -> Price:
        """The fastest at ``size_bytes`` (ties: the first subject).

        Raises
        ------
        InvalidInstanceError
            No subject was priced at that size.
        """
        here = self.at(size_bytes)
        if not here:
            raise InvalidInstanceError(f"no price at {size_bytes} bytes")
        return min(here, key=lambda p: p.time_us)


def price_table(subjects: Sequence[Subject], sizes: Sequence[int], model: PricingModel, *,
                on_subject: Callable[[str], None] | None = None) -> PriceTable:
    """Price every subject at every size with ``model``; a subject the model cannot price gets
    an entry in ``errors`` (:meth:`PricingModel.why_not`, or what pricing raised of
    :data:`PRICING_FAILURES`: a size can need more channels than the check built) and the
    others are priced.
    ``on_subject`` is told each subject's name before its turn (a progress display).

    >>> from collsynth.runtimes import get_runtime
    >>> from collsynth.timing.closed_form import ClosedForm
    >>> from collsynth.topology import get_topology
    >>> subjects = runtime_algorithms(get_runtime("nccl"), "allgather", get_topology("dgx1"))
    >>> table = price_table(subjects, [1000, 10**9], ClosedForm())
    >>> [(p.subject, p.protocol) for p in table.prices]
    [('nccl-ring', 'LL'), ('nccl-ring', 'Simple')]
    """
    sizes = _check_sizes(sizes)
    prices: list[Price] = []
    names: list[str] = []
    errors: dict[str, str] = {}
    for subject in subjects:
        name = subject_name(subject)
        if on_subject is not None:
            on_subject(name)
        why = model.why_not(subject)
        if why is None:
            try:  # a size can need what the check did not build (more channels, a longer pipeline)
                priced = model.price(subject, sizes)
            except PRICING_FAILURES as exc:
                why = str(exc)
        if why is not None:
            errors[name] = why
            continue
        names.append(name)
        prices.extend(priced)
    return PriceTable(model.name, model.provenance, tuple(sizes), tuple(names), tuple(prices),
                      MappingProxyType(errors))


def fastest_runtime_algorithm(runtime: Runtime, collective: str, topology: "Topology",
                              sizes: Sequence[int], model: PricingModel) -> tuple[Price, ...]:
    """Per size, the fastest of :func:`runtime_algorithms` that ``model`` can price, named
    (``"nccl-tree"``...): the runtime's own answer, what a synthesized algorithm is compared with.
    ``()`` when the model can price none of them.

    >>> from collsynth.runtimes import get_runtime
    >>> from collsynth.timing.closed_form import ClosedForm
    >>> from collsynth.topology import get_topology
    >>> [(p.subject, p.protocol) for p in fastest_runtime_algorithm(
    ...     get_runtime("nccl"), "allreduce", get_topology("dgx1"), [1000, 10**9], ClosedForm())]
    [('nccl-ring', 'LL'), ('nccl-ring', 'Simple')]
    """
    table = price_table(runtime_algorithms(runtime, collective, topology), sizes, model)
    if not table.subjects:
        return ()
    return tuple(table.best(size) for size in table.sizes)


def _check_sizes(sizes: Sequence[int]) -> list[int]:
    result = []
    for size in sizes:
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise InvalidInstanceError(f"size {size!r}; expected whole bytes >= 0")
        result.append(size)
    return result
