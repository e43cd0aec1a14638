"""Multi-node topologies: ``K`` copies of one node joined by the GPUs' network interfaces.

How ranks are numbered, the NIC links and bandwidth groups, the fabrics, the NIC description and
the rescaling of units: ``docs/topologies.md``, section "Composing nodes
(collsynth.topology.compose)".
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, replace
from functools import cached_property
from fractions import Fraction

import numpy as np
from typing import Any, Mapping, Sequence

from collsynth._parse import MAX_GBPS, MAX_LINK_UNITS, MIN_GBPS, shown
from collsynth.errors import InputTooLargeError, InvalidTopologyError, expect_type
from collsynth.topology.model import MAX_RANKS, BandwidthGroup, SparseGroups, SparseLinks, Topology
from collsynth.topology.tiers import FabricSpec, fabric_spec, tier_groups, tier_limits, tier_scale

__all__ = ["compose_nodes", "check_nic_layout", "Composition", "MAX_RESCALE"]

_log = logging.getLogger(__name__)

#: Largest factor by which :func:`compose_nodes` rescales link bandwidths to express a NIC slower
#: than one unit (the NIC is rounded to the nearest fraction of a unit with this denominator or less).
MAX_RESCALE = 8


def compose_nodes(
    node: Topology,
    nodes: int,
    *,
    nic_units: int | None = None,
    oversubscription: Fraction | float | Mapping[str, Fraction | float] = 1,
    fabric: str = "switch",
    nodes_per_leaf: int | None = None,
    name: str | None = None,
) -> Topology:
    """``nodes`` copies of ``node`` joined by their NICs through a non-blocking network.

    Parameters
    ----------
    node:
        One node (e.g. ``get_topology("dgx-a100")``). Its NICs come from ``node.metadata["nic"]``
        (see docs/topologies.md) unless ``nic_units`` is given.
    nodes:
        Number of copies, at least 1. Rank ``r`` of copy ``k`` is rank ``k * node.num_ranks + r``.
    nic_units:
        Bandwidth of one NIC in the node's units (a positive integer). Overrides the NIC's
        ``gbps``; the NIC layout (which ranks share a NIC) still comes from the metadata, and a node
        without NIC metadata gets one NIC per rank.
    oversubscription:
        Ratio of a node's NIC bandwidth to its share of the network core, at least 1. Above 1, each
        node gets an uplink and a downlink group limited to ``floor(total NIC units /
        oversubscription)`` (at least 1). With another ``fabric``: the ratio of its main tier (leaf, rail), or a mapping
        ``{tier: ratio}`` (:func:`~collsynth.topology.tiers.fabric_spec`).
    fabric, nodes_per_leaf:
        ``"switch"`` (default), ``"leaf-spine"`` (with ``nodes_per_leaf``) or ``"rail"``; see
        :mod:`collsynth.topology.tiers`.
    name:
        Name of the result; default ``f"{node.name}x{nodes}"``.

    Returns
    -------
    Topology
        ``nodes * node.num_ranks`` ranks; ``metadata["network"]`` records the NIC model used
        (units per NIC, NIC layout, rescale factor, oversubscription) and the fabric (``fabric``:
        kind, ``nodes_per_leaf``, every tier's ratio), read back by :attr:`Topology.layout`.

    Raises
    ------
    InvalidTopologyError
        When the node has no NIC metadata and ``nic_units`` is not given, when the metadata is
        malformed, when a NIC is too slow to express (less than ``1/MAX_RESCALE`` of a unit), or when
        ``nodes``, ``nic_units``, ``oversubscription`` or the fabric is out of range.
    InputTooLargeError
        When the result would have more than :data:`~collsynth.topology.model.MAX_RANKS` ranks
        (refused before anything is built).

    Examples
    --------
    Two 4-GPU rings, each GPU with a NIC of one unit:

    >>> from collsynth.topology.families import ring
    >>> two = compose_nodes(ring(4), 2, nic_units=1)
    >>> two.name, two.num_ranks
    ('ring:4x2', 8)
    >>> two.bandwidth(0, 1), two.bandwidth(0, 2), two.bandwidth(0, 4), two.bandwidth(0, 6)
    (1, 0, 1, 1)
    >>> [g.name for g in two.groups][:2]
    ['node 0 NIC 0 egress', 'node 0 NIC 0 ingress']

    A NIC at half a unit doubles every bandwidth (DGX-2: 25 GB/s NVLink unit, 12.5 GB/s NICs):

    >>> from collsynth.topology.builtins import get_topology
    >>> dgx2 = compose_nodes(get_topology("dgx2"), 2)
    >>> dgx2.bandwidth(0, 1), dgx2.bandwidth(0, 16), dgx2.unit_gbps
    (12, 1, 12.5)
    """
    expect_type(node, Topology, "compose_nodes: node")
    if not isinstance(nodes, int) or isinstance(nodes, bool) or nodes < 1:
        raise InvalidTopologyError(f"composing {node.name!r}: nodes must be a whole number >= 1, "
                                   f"got {nodes!r}")
    n = node.num_ranks
    total = n * nodes
    if total > MAX_RANKS:
        raise InputTooLargeError(f"composing {nodes} x {node.name!r}: {total} ranks is more than the "
                                 f"{MAX_RANKS} collsynth accepts")
    spec = fabric_spec(fabric, nodes=nodes, nodes_per_leaf=nodes_per_leaf,
                       oversubscription=oversubscription, name=node.name)
    oversub = spec.ratio("node")
    nic_ranks, nic_gbps = _nic_layout(node, nic_units)
    units, scale = _nic_units(node, nic_units, nic_gbps)
    extra = tier_scale(spec, len(nic_ranks), units)  # a leaf or rail share must be whole units
    units, scale = units * extra, scale * extra

    oversub_uplink = None
    if nodes > 1 and oversub > 1:
        oversub_uplink = max(1, math.floor(units * len(nic_ranks) / oversub))
    composition = Composition(
        name=name if name is not None else f"{node.name}x{nodes}", node=node, nodes=nodes,
        units=units, scale=scale, nic_ranks=nic_ranks, oversubscription=oversub,
        uplink=oversub_uplink, spec=spec)

    unit_gbps = None if node.unit_gbps is None else node.unit_gbps / scale
    network: dict[str, Any] = {
        "composed_from": node.name,
        "nodes": nodes,
        "ranks_per_node": n,
        "rank_order": "rank = node * ranks_per_node + local_rank",
        "nic_count": len(nic_ranks),
        "nic_gpus": [list(m) for m in nic_ranks],
        "nic_units": units,
        "nic_gbps": None if unit_gbps is None else units * unit_gbps,
        "nic_gbps_declared": nic_gbps,
        "rescale": scale,
        "oversubscription": str(oversub),
        "fabric": spec.to_json(),
    }
    over = f", oversubscription {oversub}" if oversub > 1 else ""
    if spec.kind != "switch":
        over = f", fabric {spec.describe()}"
    description = (f"{nodes} x {node.name}: {n} ranks per node, {len(nic_ranks)} NIC(s) per node of "
                   f"{units} unit(s) each{over}")
    return Topology(
        name=name if name is not None else f"{node.name}x{nodes}",
        links=SparseLinks(composition),
        groups=SparseGroups(composition),
        unit_gbps=unit_gbps,
        alpha_us=node.alpha_us,
        description=description,
        metadata={"network": network, "node_metadata": dict(node.metadata)},
    )


@dataclass(frozen=True)
class Composition:
    """How :func:`compose_nodes` made a topology: the sparse form of its links and groups.

    ``nodes`` copies of ``node`` (its bandwidths multiplied by ``scale``); between nodes every
    rank has a link of ``units`` to every rank of every other node, NIC ``j`` (local ranks
    ``nic_ranks[j]``) an egress and an ingress group of ``units``, each node an uplink and a
    downlink group of ``uplink`` when the node tier is oversubscribed, and the fabric ``spec``
    its leaf or rail groups (:func:`~collsynth.topology.tiers.tier_groups`). ``flipped``: the
    reversed topology (links transposed, every group's sides swapped). Memory is the node's;
    :meth:`link_array` and :meth:`groups` build the dense forms (``O(ranks**2)``) on request.
    """

    name: str
    node: Topology
    nodes: int
    units: int
    scale: int
    nic_ranks: tuple[tuple[int, ...], ...]
    oversubscription: Fraction
    uplink: int | None
    spec: FabricSpec
    flipped: bool = False

    @property
    def ranks_per_node(self) -> int:
        return self.node.num_ranks

    @property
    def num_ranks(self) -> int:
        return self.nodes * self.node.num_ranks

    def local_links(self) -> np.ndarray:
        """The node's links in the composed units, ``[src, dst]`` (transposed when flipped)."""
        local = self.node.link_array * self.scale
        return local.T if self.flipped else local

    @property
    def num_links(self) -> int:
        n, per = self.num_ranks, self.ranks_per_node
        return self.nodes * int(np.count_nonzero(self.node.link_array)) + n * (n - per)

    def tier_limits(self) -> dict[str, int]:
        """The limit of each leaf or rail group (:func:`~collsynth.topology.tiers.tier_limits`)."""
        return tier_limits(self.spec, len(self.nic_ranks), self.units)

    @property
    def num_groups(self) -> int:
        count = self.nodes * len(self.node.groups)
        if self.nodes > 1:
            count += self.nodes * 2 * (len(self.nic_ranks) + (self.uplink is not None))
            limits = self.tier_limits()
            if "leaf" in limits and self.nodes > self.spec.nodes_per_leaf:
                count += 2 * (self.nodes // self.spec.nodes_per_leaf)
            if "rail" in limits:
                count += 2 * len(self.nic_ranks) * self.nodes
        return count

    def row(self, src: int) -> tuple[int, ...]:
        """``links[src]`` alone (``O(ranks)``)."""
        per, n = self.ranks_per_node, self.num_ranks
        row = np.full(n, self.units if self.nodes > 1 else 0, np.int64)
        base = src - src % per
        row[base:base + per] = self.local_links()[src % per]
        return tuple(row.tolist())

    def link(self, src: int, dst: int) -> int:
        """``links[src][dst]`` alone (``O(1)``)."""
        per, n, units, rows = self._reader
        if not (0 <= src < n and 0 <= dst < n):
            raise IndexError(f"link {src} -> {dst}: ranks are 0..{n - 1}")
        if src // per != dst // per:
            return units
        return rows[src % per][dst % per]

    @cached_property
    def _reader(self) -> tuple[int, int, int, tuple[tuple[int, ...], ...]]:
        """What :meth:`link` reads (a ring search reads millions of links): ranks per node,
        ranks, units between nodes, :meth:`local_links` as rows of ints."""
        return (self.ranks_per_node, self.num_ranks, self.units,
                tuple(map(tuple, self.local_links().tolist())))

    def block(self, start: int, stop: int) -> np.ndarray:
        """``links[start:stop, start:stop]`` (``0 <= start <= stop <= num_ranks``): the node's
        links when the ranks are in one node, else read row by row."""
        per = self.ranks_per_node
        base = start - start % per
        if stop <= base + per:
            return self.local_links()[start - base:stop - base, start - base:stop - base]
        rows = [self.row(r)[start:stop] for r in range(start, stop)]
        return np.array(rows, dtype=np.int64).reshape(stop - start, stop - start)

    def covered_units(self, groups: Sequence[BandwidthGroup]) -> list[int]:
        """Per group, the units of the links it covers (``links[s][d]`` summed over its
        sources ``s`` and destinations ``d``), without the matrix: ``units`` for each pair of
        different nodes, the node's links for the pairs inside one. ``O(ranks)`` per distinct
        set of ranks (the groups of a node's NICs share one set of every other node's ranks)
        and ``O(nodes)`` per group."""
        per, nodes, units = self.ranks_per_node, self.nodes, self.units
        local = self.local_links()
        starts = np.arange(nodes + 1) * per
        # Each set of ranks, by identity (kept alive here): sorted, and where each node starts.
        sides: dict[int, tuple[frozenset[int], np.ndarray]] = {}
        bounds: dict[int, np.ndarray] = {}

        def ranks_of(ranks: frozenset[int]) -> np.ndarray:
            found = sides.get(id(ranks))
            if found is None:
                found = sides[id(ranks)] = (ranks, np.sort(np.fromiter(ranks, np.int64,
                                                                       len(ranks))))
            return found[1]

        def node_starts(ranks: frozenset[int]) -> np.ndarray:
            found = bounds.get(id(ranks))
            if found is None:
                found = bounds[id(ranks)] = np.searchsorted(ranks_of(ranks), starts)
            return found

        def from_one(rank: int, others: frozenset[int], matrix: np.ndarray) -> int:
            """One rank to (or from, ``matrix`` transposed) the ranks ``others``."""
            array, base = ranks_of(others), rank - rank % per
            low, high = np.searchsorted(array, (base, base + per)).tolist()
            mine = int(matrix[rank - base, array[low:high] - base].sum()) if high > low else 0
            return units * (len(array) - (high - low)) + mine

        result = []
        for group in groups:
            if len(group.sources) == 1:  # a port's or a NIC's group: one rank's row
                (rank,) = group.sources
                result.append(from_one(rank, group.destinations, local))
                continue
            if len(group.destinations) == 1:
                (rank,) = group.destinations
                result.append(from_one(rank, group.sources, local.T))
                continue
            sources, destinations = ranks_of(group.sources), ranks_of(group.destinations)
            source_at, destination_at = node_starts(group.sources), node_starts(group.destinations)
            inside = np.diff(source_at) * np.diff(destination_at)  # pairs within each node
            total = units * (len(sources) * len(destinations) - int(inside.sum()))
            for k in np.flatnonzero(inside).tolist():
                mine = sources[source_at[k]:source_at[k + 1]] - k * per
                theirs = destinations[destination_at[k]:destination_at[k + 1]] - k * per
                total += int(local[np.ix_(mine, theirs)].sum())
            result.append(total)
        return result

    def link_array(self) -> np.ndarray:
        """The whole ``n x n`` link matrix."""
        per, k = self.ranks_per_node, self.nodes
        array = np.full((k, per, k, per), self.units if k > 1 else 0, np.int64)
        diagonal = np.arange(k)
        array[diagonal, :, diagonal, :] = self.local_links()
        return array.reshape(k * per, k * per)

    def groups(self) -> tuple[BandwidthGroup, ...]:
        """Every bandwidth group, in the order :func:`compose_nodes` always listed them."""
        n, nodes, total = self.ranks_per_node, self.nodes, self.num_ranks
        groups: list[BandwidthGroup] = []
        for k in range(nodes):
            base = k * n
            for index, g in enumerate(self.node.groups):
                groups.append(BandwidthGroup(
                    frozenset(base + s for s in g.sources),
                    frozenset(base + d for d in g.destinations),
                    g.limit * self.scale,
                    f"node {k}: {g.name or f'group {index}'}"))
        if nodes > 1:
            oversub, units = self.oversubscription, self.units
            for k in range(nodes):
                base = k * n
                # One frozenset per node, shared by all of that node's NIC groups.
                others = frozenset(range(base)) | frozenset(range(base + n, total))
                for j, members in enumerate(self.nic_ranks):
                    mine = frozenset(base + m for m in members)
                    groups.append(BandwidthGroup(mine, others, units, f"node {k} NIC {j} egress"))
                    groups.append(BandwidthGroup(others, mine, units, f"node {k} NIC {j} ingress"))
                if self.uplink is not None:
                    mine = frozenset(range(base, base + n))
                    groups.append(BandwidthGroup(mine, others, self.uplink,
                                                 f"node {k} uplink (oversubscription {oversub})"))
                    groups.append(BandwidthGroup(others, mine, self.uplink,
                                                 f"node {k} downlink (oversubscription {oversub})"))
            groups.extend(tier_groups(self.spec, nodes=nodes, ranks_per_node=n,
                                      nic_ranks=self.nic_ranks, units=units))
        if self.flipped:
            return tuple(g.reversed() for g in groups)
        return tuple(groups)

    def reversed(self) -> "Composition":
        """The composition of the reversed topology."""
        return replace(self, name=f"reversed({self.name})", flipped=not self.flipped)


def check_nic_layout(node: Topology) -> None:
    """Refuse a ``metadata.nic`` whose layout no composition can use (a rank served twice or
    never, a count that disagrees with ``gpus``, NICs that cannot be shared evenly), as
    composing would, so a topology file is refused when it is read, naming itself. A node
    with no ``nic`` passes: ``--nic-units`` gives it one NIC per rank.

    Raises
    ------
    InvalidTopologyError
        What composing ``node`` would raise about its NIC layout.
    """
    if isinstance(node.metadata, Mapping) and node.metadata.get("nic") is not None:
        _nic_layout(node, nic_units=1)  # units stand in for a missing 'gbps': --nic-units


def _nic_layout(
    node: Topology, nic_units: int | None
) -> tuple[tuple[tuple[int, ...], ...], float | None]:
    """The local ranks served by each NIC, and the NIC's GB/s (``None`` when not given)."""
    n = node.num_ranks
    raw = node.metadata.get("nic") if isinstance(node.metadata, Mapping) else None
    if raw is None:
        if nic_units is None:
            raise InvalidTopologyError(
                f"cannot compose {node.name!r}: it has no NIC description (metadata 'nic'); pass "
                "nic_units=<NIC bandwidth in the node's units> (--nic-units U) to give each "
                "rank its own NIC")
        return tuple((r,) for r in range(n)), None

    def bad(message: str) -> InvalidTopologyError:
        return InvalidTopologyError(f"topology {node.name!r}: metadata 'nic': {message}")

    if not isinstance(raw, Mapping):
        raise bad(f"expected an object, got {type(raw).__name__}")
    count = raw.get("count")
    if count is not None and (not isinstance(count, int) or isinstance(count, bool) or count < 1):
        raise bad(f"'count' = {count!r}; expected a positive whole number")
    gbps = raw.get("gbps")
    if gbps is not None and (isinstance(gbps, bool) or not isinstance(gbps, (int, float))
                             or not math.isfinite(gbps) or not MIN_GBPS <= gbps <= MAX_GBPS):
        raise bad(f"'gbps' = {shown(gbps)}; expected a number of GB/s per direction from "
                  f"{MIN_GBPS:g} to {MAX_GBPS:g}")
    if gbps is None and nic_units is None:
        raise bad("no 'gbps' (GB/s per NIC per direction); add it or pass nic_units")
    per_gpu = raw.get("per_gpu", False)
    if not isinstance(per_gpu, bool):
        raise bad(f"'per_gpu' = {per_gpu!r}; expected true or false")
    gpus = raw.get("gpus")

    if gpus is not None:
        if not isinstance(gpus, (list, tuple)) or not gpus:
            raise bad("'gpus' must be a non-empty list of lists of local ranks, one list per NIC")
        layout = []
        for j, members in enumerate(gpus):
            if (not isinstance(members, (list, tuple)) or not members
                    or not all(isinstance(m, int) and not isinstance(m, bool) for m in members)):
                raise bad(f"'gpus'[{j}] must be a non-empty list of local ranks")
            layout.append(tuple(members))
        seen = sorted(m for members in layout for m in members)
        if seen != list(range(n)):
            raise bad(f"'gpus' must name every local rank 0..{n - 1} exactly once, got {seen}")
        if count is not None and count != len(layout):
            raise bad(f"'count' = {count} but 'gpus' lists {len(layout)} NICs")
    elif per_gpu:
        if count is not None and count != n:
            raise bad(f"'per_gpu' is true but 'count' = {count} differs from the {n} ranks")
        layout = [(r,) for r in range(n)]
    else:
        if count is None:
            raise bad("give 'count' (NICs per node), 'per_gpu': true, or 'gpus'")
        if n % count:
            raise bad(f"{count} NICs cannot be shared evenly by {n} ranks; list them in 'gpus'")
        size = n // count
        layout = [tuple(range(j * size, (j + 1) * size)) for j in range(count)]
    return tuple(layout), None if gbps is None else float(gbps)


def _nic_units(node: Topology, nic_units: int | None, nic_gbps: float | None) -> tuple[int, int]:
    """``(units per NIC, rescale factor)`` in the composed topology's units."""
    if nic_units is not None:
        if not isinstance(nic_units, int) or isinstance(nic_units, bool) or \
                not 1 <= nic_units <= MAX_LINK_UNITS:
            raise InvalidTopologyError(f"composing {node.name!r}: nic_units must be a whole "
                                       f"number of bandwidth units from 1 to {MAX_LINK_UNITS}, "
                                       f"got {shown(nic_units)}")
        return nic_units, 1
    if node.unit_gbps is None or nic_gbps is None:
        raise InvalidTopologyError(
            f"cannot compose {node.name!r}: its unit_gbps is unknown, so its NIC bandwidth cannot be "
            "expressed in its units; pass nic_units")
    exact = Fraction(nic_gbps) / Fraction(node.unit_gbps)
    ratio = exact.limit_denominator(MAX_RESCALE)
    if ratio == 0:
        raise InvalidTopologyError(
            f"cannot compose {node.name!r}: its NIC ({nic_gbps} GB/s) is less than 1/{MAX_RESCALE} "
            f"of a bandwidth unit ({node.unit_gbps} GB/s); pass nic_units or use a smaller unit")
    if ratio.numerator > MAX_LINK_UNITS:
        raise InvalidTopologyError(
            f"cannot compose {node.name!r}: its NIC ({nic_gbps} GB/s) is {float(exact):.3g} "
            f"bandwidth units of {node.unit_gbps} GB/s, more than the {MAX_LINK_UNITS} a link "
            "may have; pass nic_units or use a larger unit")
    if ratio != exact:
        _log.info("composing %s: NIC of %s GB/s is %.4f units of %s GB/s, rounded to %s",
                  node.name, nic_gbps, float(exact), node.unit_gbps, ratio)
    return ratio.numerator, ratio.denominator
