"""The :class:`Topology` value: who can send to whom, how much per round, and at what physical cost.

Conventions (stated here once, used everywhere in collsynth):

* ``links[src][dst]`` is the bandwidth of the directed link from rank ``src`` to rank ``dst``, in
  *bandwidth units*: the number of chunks the link carries in one round. ``links[src][dst] == 0``
  means there is no link. The diagonal is always 0.
* A :class:`BandwidthGroup` models a shared resource (a switch port, a NIC, a PCIe root): the sends
  from any rank in ``sources`` to any rank in ``destinations`` share ``limit`` units per round.
* ``unit_gbps`` is what one bandwidth unit is worth in gigabytes per second (10**9 bytes/s), and
  ``alpha_us`` the latency of one step (one message over a link) in microseconds. Both are optional:
  synthesis only needs the integer units; the timing model needs the physical figures.
* A composed topology keeps ``links`` and ``groups`` sparse (:class:`SparseLinks`,
  :class:`SparseGroups`): built from the node and the fabric on first use, refused above
  :data:`MAX_DENSE_RANKS` (docs/bounds.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Iterable, Iterator, Mapping, Sequence

import numpy as np

from collsynth._parse import MAX_GBPS, MAX_TIME_US, MIN_GBPS, MIN_LATENCY_US
from collsynth.errors import InputTooLargeError, InvalidTopologyError
from collsynth.topology.layout import NodeLayout, node_layout

__all__ = ["BandwidthGroup", "Topology", "MAX_RANKS", "MAX_DENSE_RANKS", "SparseLinks",
           "SparseGroups", "covered_units"]

#: The largest number of ranks collsynth accepts in a topology (a composed one, stored sparsely).
#: Refused before any work is done.
MAX_RANKS = 65536
#: The largest number of ranks whose link matrix and bandwidth groups are held densely: a topology
#: given as a matrix, or a composed one whose ``links`` or ``groups`` an engine reads in full.
MAX_DENSE_RANKS = 8192


@dataclass(frozen=True)
class BandwidthGroup:
    """A shared limit: all sends from ``sources`` to ``destinations`` together carry at most
    ``limit`` chunks per round.

    >>> BandwidthGroup(frozenset({0}), frozenset({1, 2, 3}), 1, "rank 0 egress").limit
    1
    """

    sources: frozenset[int]
    destinations: frozenset[int]
    limit: int
    name: str = ""

    def reversed(self) -> "BandwidthGroup":
        """The same limit with sources and destinations swapped (for the reversed topology)."""
        return BandwidthGroup(self.destinations, self.sources, self.limit, self.name)


@dataclass(frozen=True)
class Topology:
    """A network of ``num_ranks`` GPUs (ranks ``0..num_ranks-1``).

    Parameters
    ----------
    name:
        Short identifier, e.g. ``"DGX1"`` or ``"ring:8"``.
    links:
        Square matrix, ``links[src][dst]`` = chunks per round from ``src`` to ``dst`` (0: no link).
    groups:
        Shared limits (switch ports, NICs) on top of the per-link bandwidths.
    unit_gbps:
        GB/s (10**9 bytes per second) of one bandwidth unit, or ``None`` if unknown.
    alpha_us:
        Latency of one step in microseconds, or ``None`` if unknown.
    description:
        One line for listings.

    Raises
    ------
    InvalidTopologyError
        On a non-square or negative matrix, a self-link, a group naming a missing rank, or a
        non-positive group limit.
    InputTooLargeError
        When the matrix has more than :data:`MAX_RANKS` ranks.

    Examples
    --------
    A 4-GPU unidirectional ring:

    >>> ring = Topology("ring4", ((0, 1, 0, 0), (0, 0, 1, 0), (0, 0, 0, 1), (1, 0, 0, 0)))
    >>> ring.num_ranks, ring.bandwidth(0, 1), ring.bandwidth(1, 0)
    (4, 1, 0)
    >>> ring.reversed().bandwidth(1, 0)
    1
    """

    name: str
    links: tuple[tuple[int, ...], ...]
    groups: tuple[BandwidthGroup, ...] = ()
    unit_gbps: float | None = None
    alpha_us: float | None = None
    description: str = ""
    metadata: Mapping[str, object] = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        links = self.links
        sparse = isinstance(links, SparseLinks)
        if not sparse and (not isinstance(links, tuple)
                           or not all(isinstance(row, tuple) for row in links)):
            object.__setattr__(self, "links", _as_matrix(links, self.name))
            links = self.links
        n = len(links)
        if n == 0:
            raise InvalidTopologyError(f"topology {self.name!r}: the link matrix is empty")
        if sparse and n > MAX_RANKS:
            raise InputTooLargeError(
                f"topology {self.name!r}: {n} ranks is more than the {MAX_RANKS} collsynth accepts"
            )
        if not sparse and n > MAX_DENSE_RANKS:
            raise InputTooLargeError(
                f"topology {self.name!r}: {n} ranks is more than the {MAX_DENSE_RANKS} collsynth "
                "accepts as a link matrix (a composed topology, stored sparsely, may have up to "
                f"{MAX_RANKS})"
            )
        if not sparse:
            _check_matrix(links, self.name)
        if isinstance(self.groups, SparseGroups):
            # Made by the composition itself, whose ranks are the links' (checked once here).
            if self.groups.composition.num_ranks != n:
                raise InvalidTopologyError(
                    f"topology {self.name!r}: its sparse groups have "
                    f"{self.groups.composition.num_ranks} ranks, its links {n}")
        else:
            if not isinstance(self.groups, tuple):
                object.__setattr__(self, "groups", tuple(self.groups))
            _check_groups(self.groups, self.name, n)
        # The file reader's ranges: a topology built here must save to a file that reads back
        # (inf was written as 'Infinity', which no JSON reader takes).
        for attr, low, high, unit in (("unit_gbps", MIN_GBPS, MAX_GBPS, "GB/s"),
                                      ("alpha_us", MIN_LATENCY_US, MAX_TIME_US, "us")):
            value = getattr(self, attr)
            if value is not None and not (isinstance(value, (int, float))
                                          and not isinstance(value, bool) and value > 0
                                          and low <= value <= high):
                raise InvalidTopologyError(
                    f"topology {self.name!r}: {attr} = {value!r}; expected a positive number"
                    + (f" from {low:g}" if low else "") + f" up to {high:g} {unit}")

    # -- structure ----------------------------------------------------------------------------

    @property
    def num_ranks(self) -> int:
        """Number of ranks (GPUs)."""
        return len(self.links)

    @property
    def composition(self) -> Any:
        """How a composed topology is made (its node, NICs and fabric:
        :class:`~collsynth.topology.compose.Composition`) when its links and groups are stored
        sparsely, else ``None``. Engines that can work from it never build the dense matrix."""
        links, groups = self.links, self.groups
        if isinstance(links, SparseLinks) and isinstance(groups, SparseGroups) \
                and links.composition == groups.composition:
            return links.composition
        return None

    def bandwidth(self, src: int, dst: int) -> int:
        """Chunks per round from ``src`` to ``dst`` (0 when there is no link); on a composed
        topology read from its composition, without building the matrix."""
        links = self.links
        if isinstance(links, SparseLinks):
            return links.link(src, dst)
        return links[src][dst]

    @cached_property
    def layout(self) -> "NodeLayout | None":
        """The node layout of a multi-node topology (``None`` for one node), read once from
        ``metadata["network"]`` (:mod:`collsynth.topology.layout`)."""
        return node_layout(self.metadata, name=self.name, num_ranks=self.num_ranks)

    @cached_property
    def link_array(self) -> np.ndarray:
        """``links`` as a read-only ``n x n`` int64 array (``[src, dst]``), built once."""
        if isinstance(self.links, SparseLinks):
            array = self.links.array()
        else:
            array = np.array(self.links, dtype=np.int64).reshape(self.num_ranks, self.num_ranks)
        array.flags.writeable = False
        return array

    def link_block(self, start: int, stop: int) -> np.ndarray:
        """The links among ranks ``start..stop-1`` (a node's, say) as a ``[src, dst]`` int64
        array; on a composed topology from its composition, without building the matrix.

        >>> get = Topology("line3", ((0, 1, 0), (1, 0, 1), (0, 1, 0))).link_block
        >>> get(1, 3).tolist()
        [[0, 1], [1, 0]]
        """
        if not 0 <= start <= stop <= self.num_ranks:
            raise IndexError(f"ranks {start}..{stop - 1}: the topology has 0..{self.num_ranks - 1}")
        if isinstance(self.links, SparseLinks):
            return self.links.composition.block(start, stop)
        return self.link_array[start:stop, start:stop]

    @cached_property
    def edges(self) -> tuple[tuple[int, int, int], ...]:
        """Every link as ``(src, dst, bandwidth)``, in row-major order, bandwidth > 0."""
        return tuple(
            (src, dst, bw) for src, row in enumerate(self.links) for dst, bw in enumerate(row) if bw
        )

    @cached_property
    def destinations(self) -> tuple[tuple[int, ...], ...]:
        """``destinations[src]``: the ranks ``src`` has a link to."""
        return tuple(tuple(d for d, bw in enumerate(row) if bw) for row in self.links)

    @cached_property
    def sources(self) -> tuple[tuple[int, ...], ...]:
        """``sources[dst]``: the ranks that have a link to ``dst``."""
        result: list[list[int]] = [[] for _ in range(self.num_ranks)]
        for src, dst, _ in self.edges:
            result[dst].append(src)
        return tuple(tuple(r) for r in result)

    @cached_property
    def binding_groups(self) -> tuple[BandwidthGroup, ...]:
        """The bandwidth groups that can bind, in :attr:`effective_groups`' order (index ``i``
        here is index ``i`` there): those whose limit is less than the units of the links they
        cover. Found from link sums (on a composed topology by node blocks, from its
        composition) without listing the covered links: 29,376 groups of 7,344 GB200 GPUs in
        about a second, where :attr:`effective_groups` lists 53 million links.

        >>> from collsynth.topology import get_topology
        >>> [g.name for g in get_topology("dgx-h100").binding_groups][:2]
        ['rank 0 egress (18 NVLinks)', 'rank 0 ingress (18 NVLinks)']
        """
        units = covered_units(self, self.groups)
        return tuple(group for group, total in zip(self.groups, units)
                     if total > 0 and total > group.limit)

    @cached_property
    def effective_groups(self) -> tuple[tuple[BandwidthGroup, tuple[tuple[int, int], ...]], ...]:
        """Each bandwidth group with the links it actually constrains, dropping groups that can
        never bind (their limit is at least the total bandwidth of their links): the
        :attr:`binding_groups`, each with its covered links ``(src, dst)`` in row-major order."""
        links = self.links
        result = []
        for group in self.binding_groups:
            destinations = sorted(group.destinations)
            covered: list[tuple[int, int]] = []
            for s in sorted(group.sources):
                row = links[s]
                covered.extend((s, d) for d in destinations if row[d])
            result.append((group, tuple(covered)))
        return tuple(result)

    def reversed(self) -> "Topology":
        """The topology with every link and group pointing the other way (``links`` transposed).

        Used to solve a combining collective through its non-combining dual.
        """
        composition = self.composition
        if composition is not None:
            flipped = composition.reversed()
            return Topology(
                name=f"reversed({self.name})",
                links=SparseLinks(flipped),
                groups=SparseGroups(flipped),
                unit_gbps=self.unit_gbps,
                alpha_us=self.alpha_us,
                description=f"{self.description} (links reversed)".strip(),
                metadata=self.metadata,
            )
        n = self.num_ranks
        transposed = tuple(tuple(self.links[src][dst] for src in range(n)) for dst in range(n))
        return Topology(
            name=f"reversed({self.name})",
            links=transposed,
            groups=tuple(g.reversed() for g in self.groups),
            unit_gbps=self.unit_gbps,
            alpha_us=self.alpha_us,
            description=f"{self.description} (links reversed)".strip(),
            metadata=self.metadata,
        )

    def is_symmetric(self) -> bool:
        """True when ``links[a][b] == links[b][a]`` for every pair."""
        n = self.num_ranks
        return all(self.links[a][b] == self.links[b][a] for a in range(n) for b in range(a))

    def __repr__(self) -> str:
        count = self.links.composition.num_links if isinstance(self.links, SparseLinks) \
            else len(self.edges)
        return (
            f"Topology(name={self.name!r}, num_ranks={self.num_ranks}, links={count}, "
            f"groups={len(self.groups)})"
        )


def covered_units(topology: Topology, groups: Sequence[BandwidthGroup]) -> list[int]:
    """Per group, the units of the links it covers: ``links[s][d]`` summed over its sources
    ``s`` and destinations ``d``. A composed topology's sums come from its composition by node
    blocks (:meth:`~collsynth.topology.compose.Composition.covered_units`); a matrix's from the
    rows of each group's smaller side.

    >>> from collsynth.topology.families import ring
    >>> covered_units(ring(4), [BandwidthGroup(frozenset({0}), frozenset({1, 2, 3}), 1)])
    [2]
    """
    if isinstance(topology.links, SparseLinks):
        return topology.links.composition.covered_units(groups)
    array = topology.link_array
    result = []
    for group in groups:
        sources = np.fromiter(group.sources, np.int64, len(group.sources))
        destinations = np.fromiter(group.destinations, np.int64, len(group.destinations))
        matrix = array
        if len(sources) > len(destinations):  # read the smaller side's rows (columns)
            matrix, sources, destinations = array.T, destinations, sources
        total = 0
        step = max(1, _SUM_CELLS // max(1, len(destinations)))
        for start in range(0, len(sources), step):
            total += int(matrix[sources[start:start + step]][:, destinations].sum())
        result.append(total)
    return result


#: Cells of the link matrix :func:`covered_units` reads at once (32 MB of int64).
_SUM_CELLS = 1 << 22


def _dense_refusal(composition: Any, what: str) -> InputTooLargeError:
    n = composition.num_ranks
    gigabytes = n * n * 8 / 1e9
    return InputTooLargeError(
        f"topology {composition.name!r}: {n} ranks: {what} would be dense ({n} x {n} entries, "
        f"about {gigabytes:.1f} GB), and collsynth holds at most {MAX_DENSE_RANKS} ranks densely; "
        "this engine needs it (the bounds work from the sparse form at any size)")


class _SparseForm(Sequence):
    """What :class:`SparseLinks` and :class:`SparseGroups` share: built from a composition,
    read as the tuple a dense topology holds (iteration, equality, hashing, concatenation);
    ``dense()`` builds that tuple once.

    A sparse form equals the tuple it reads as, so it hashes as that tuple (built for the
    purpose, once); above :data:`MAX_DENSE_RANKS` ranks, where no tuple can be compared with
    it, it hashes as its composition.
    """

    __slots__ = ("composition", "_dense", "_hash")

    def __init__(self, composition: Any) -> None:
        self.composition = composition
        self._dense: tuple | None = None
        self._hash: int | None = None

    def dense(self) -> tuple:
        raise NotImplementedError

    def _as_dense(self, other: Any) -> tuple:
        """``other`` (a tuple or list) in the form of ``dense()``."""
        return tuple(other)

    def __iter__(self) -> Iterator:
        return iter(self.dense())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, type(self)) and other.composition == self.composition:
            return True
        if isinstance(other, (type(self), tuple, list)):
            return len(other) == len(self) and tuple(self) == self._as_dense(other)
        return NotImplemented

    def __hash__(self) -> int:
        if self._hash is None:
            try:
                self._hash = hash(self.dense())
            except InputTooLargeError:  # equal only to a form of the same composition
                self._hash = hash(self.composition)
        return self._hash

    # ``topology.groups + (extra,)`` works as on the tuple a dense topology holds.
    def __add__(self, other: Any) -> tuple:
        return tuple(self) + tuple(other)

    def __radd__(self, other: Any) -> tuple:
        return tuple(other) + tuple(self)


class SparseLinks(_SparseForm):
    """``links`` of a composed topology, computed from its composition when read.

    ``links[src]`` is one row (a tuple, as for a dense matrix). Up to :data:`MAX_DENSE_RANKS`
    ranks the whole matrix is built on first use and kept; above, single rows are computed on
    demand and reading the whole matrix (iterating, :attr:`Topology.link_array`) raises
    :class:`~collsynth.errors.InputTooLargeError` with its size.
    """

    __slots__ = ()

    def dense(self) -> tuple[tuple[int, ...], ...]:
        """The whole matrix (refused above :data:`MAX_DENSE_RANKS` ranks)."""
        if self._dense is None:
            if self.composition.num_ranks > MAX_DENSE_RANKS:
                raise _dense_refusal(self.composition, "its link matrix")
            self._dense = tuple(map(tuple, self.array().tolist()))
        return self._dense

    def link(self, src: int, dst: int) -> int:
        """``links[src][dst]`` alone, without building the matrix (``O(1)``)."""
        if self._dense is not None:
            return self._dense[src][dst]
        return self.composition.link(src, dst)

    def array(self) -> np.ndarray:
        """The matrix as an ``n x n`` int64 array (refused above :data:`MAX_DENSE_RANKS`)."""
        if self.composition.num_ranks > MAX_DENSE_RANKS:
            raise _dense_refusal(self.composition, "its link matrix")
        return self.composition.link_array()

    def __len__(self) -> int:
        return self.composition.num_ranks

    def __getitem__(self, index: Any) -> Any:
        if self._dense is None and isinstance(index, int) \
                and self.composition.num_ranks > MAX_DENSE_RANKS:
            if not -len(self) <= index < len(self):
                raise IndexError(index)
            return self.composition.row(index % len(self))
        return self.dense()[index]

    def _as_dense(self, other: Any) -> tuple:
        return tuple(map(tuple, other))

    def __repr__(self) -> str:
        return f"SparseLinks({self.composition.name!r}, ranks={len(self)})"


class SparseGroups(_SparseForm):
    """``groups`` of a composed topology, built from its composition when read (refused above
    :data:`MAX_DENSE_RANKS` ranks: every NIC's group names every rank of the other nodes)."""

    __slots__ = ()

    def dense(self) -> tuple[BandwidthGroup, ...]:
        if self._dense is None:
            if self.composition.num_ranks > MAX_DENSE_RANKS:
                raise _dense_refusal(self.composition, "its bandwidth groups")
            self._dense = self.composition.groups()
        return self._dense

    def __len__(self) -> int:
        return self.composition.num_groups

    def __getitem__(self, index: Any) -> Any:
        return self.dense()[index]

    def __repr__(self) -> str:
        return f"SparseGroups({self.composition.name!r}, groups={len(self)})"


def _as_matrix(links: Iterable[Sequence[int]], name: str) -> tuple[tuple[int, ...], ...]:
    """Copy any nested sequence (lists, numpy arrays) into a tuple of tuples of ints."""
    try:
        rows = [list(row) for row in links]
    except TypeError as exc:
        raise InvalidTopologyError(f"topology {name!r}: links must be a matrix (rows of numbers)") from exc
    matrix = []
    for src, row in enumerate(rows):
        converted = []
        for dst, value in enumerate(row):
            if hasattr(value, "item"):  # numpy scalar
                value = value.item()
            if isinstance(value, float) and value.is_integer():
                value = int(value)
            converted.append(value)
        matrix.append(tuple(converted))
    return tuple(matrix)


def _check_matrix(links: tuple[tuple[int, ...], ...], name: str) -> None:
    """A square matrix of non-negative integers with a zero diagonal."""
    n = len(links)
    for src, row in enumerate(links):
        if len(row) != n:
            raise InvalidTopologyError(
                f"topology {name!r}: the link matrix is not square: row {src} has "
                f"{len(row)} entries, expected {n}"
            )
        for dst, bw in enumerate(row):
            if not isinstance(bw, int) or isinstance(bw, bool):
                raise InvalidTopologyError(
                    f"topology {name!r}: links[{src}][{dst}] = {bw!r} is not an integer "
                    "number of bandwidth units"
                )
            if bw < 0:
                raise InvalidTopologyError(
                    f"topology {name!r}: links[{src}][{dst}] = {bw} is negative"
                )
        if row[src] != 0:
            raise InvalidTopologyError(
                f"topology {name!r}: self-link links[{src}][{src}] = {row[src]}; "
                "a rank cannot send to itself"
            )


def _check_groups(groups: tuple[BandwidthGroup, ...], name: str, n: int) -> None:
    """Every group names ranks ``0..n-1`` on both sides and has a positive whole limit."""
    for index, group in enumerate(groups):
        label = group.name or f"#{index}"
        for role, ranks in (("sources", group.sources), ("destinations", group.destinations)):
            if not ranks:
                raise InvalidTopologyError(
                    f"topology {name!r}: bandwidth group {label} has no {role}"
                )
            bad = sorted(r for r in ranks if not isinstance(r, int) or not 0 <= r < n)
            if bad:
                raise InvalidTopologyError(
                    f"topology {name!r}: bandwidth group {label} names missing rank(s) "
                    f"{bad} in its {role}; ranks are 0..{n - 1}"
                )
        if not isinstance(group.limit, int) or group.limit < 1:
            raise InvalidTopologyError(
                f"topology {name!r}: bandwidth group {label} has limit {group.limit!r}; "
                "expected a positive integer"
            )
