"""The *fabric*: a sparse graph with switch-port vertices that carries exactly a topology's limits.

The details: ``docs/large-systems.md``, section "The switch fabric".
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from collsynth.errors import InvalidTopologyError
from collsynth.topology.model import BandwidthGroup, Topology

__all__ = ["Fabric", "UnsupportedFabricError", "build_fabric", "link_matrix", "INFINITE",
           "Quotient", "composed_quotient"]

#: Capacity of an arc that is not a limit (between regions). Larger than any cut of interest,
#: small enough that scaled capacities stay within the 32-bit maximum-flow solver.
INFINITE = 1 << 20


class UnsupportedFabricError(InvalidTopologyError):
    """The topology's bandwidth groups do not describe switch ports this module can express."""


@dataclass(frozen=True)
class Fabric:
    """A directed graph on ranks (vertices ``0..num_ranks-1``) and port vertices.

    ``src[i] -> dst[i]`` carries at most ``cap[i]`` chunks per round (bandwidth units).
    ``labels[v - num_ranks]`` names each port vertex. ``regions[r]`` is the region (node) of rank
    ``r``, or ``-1`` for all ranks when the topology has no regions.
    """

    num_ranks: int
    num_vertices: int
    src: np.ndarray
    dst: np.ndarray
    cap: np.ndarray
    labels: tuple[str, ...]
    regions: np.ndarray

    @property
    def num_arcs(self) -> int:
        return len(self.src)


def link_matrix(topology: Topology) -> np.ndarray:
    """``links[src][dst]`` as an ``int64`` numpy matrix."""
    return topology.link_array


class _Vertices:
    def __init__(self, num_ranks: int) -> None:
        self.num_ranks = num_ranks
        self.labels: list[str] = []

    def add(self, label: str) -> int:
        self.labels.append(label)
        return self.num_ranks + len(self.labels) - 1


def build_fabric(topology: Topology) -> Fabric:
    """The fabric of ``topology`` (see docs/large-systems.md).

    Raises
    ------
    UnsupportedFabricError
        When a bandwidth group is neither a star (one source or one destination) inside a region
        nor a NIC or uplink group of a region, when a link is covered by two groups of the same
        kind, or when the links between regions are not complete and at least as wide as the
        NICs that carry them.

    Examples
    --------
    Two 2-rank nodes, each rank with a one-unit NIC: 4 rank-to-rank links inside the nodes, and
    the 8 links between nodes become 4 NIC-out, 4 NIC-in and 2 region arcs.

    >>> from collsynth.topology import compose_nodes, get_topology
    >>> fabric = build_fabric(compose_nodes(get_topology("fully-connected:2"), 2, nic_units=1))
    >>> fabric.num_ranks, fabric.num_vertices, fabric.num_arcs
    (4, 16, 22)
    """
    composition = topology.composition
    if composition is not None and composition.nodes > 1:
        return _composed_fabric(topology.name, composition)
    n = topology.num_ranks
    links = link_matrix(topology)
    vertices = _Vertices(n)
    arcs_src: list[np.ndarray] = []
    arcs_dst: list[np.ndarray] = []
    arcs_cap: list[np.ndarray] = []

    def arcs(src, dst, cap) -> None:
        src, dst, cap = np.broadcast_arrays(np.atleast_1d(np.asarray(src, np.int64)),
                                            np.atleast_1d(np.asarray(dst, np.int64)),
                                            np.asarray(cap, np.int64))
        arcs_src.append(src.copy())
        arcs_dst.append(dst.copy())
        arcs_cap.append(cap.copy())

    stars_out: dict[int, list] = {}
    stars_in: dict[int, list] = {}
    network: dict[str, list] = {}
    regions = _regions(topology)
    for index, group in enumerate(topology.groups):
        label = group.name or f"group {index}"
        sources = np.fromiter(sorted(group.sources), np.int64)
        targets = np.fromiter(sorted(group.destinations), np.int64)
        kind = _classify(group, sources, targets, regions, n)
        if kind is None:
            raise UnsupportedFabricError(
                f"topology {topology.name!r}: bandwidth group {label!r} is neither a port of one rank "
                "(one source or one destination) nor a NIC, uplink, leaf or rail group of a node")
        if kind == "star-out":
            stars_out.setdefault(int(sources[0]), []).append((group, targets, label))
        elif kind == "star-in":
            stars_in.setdefault(int(targets[0]), []).append((group, sources, label))
        else:  # the narrow side: the ranks of a NIC, a node or a leaf
            narrow = sources if kind in ("outbound", "cross-out", "leaf-out") else targets
            network.setdefault(kind, []).append((group, narrow, label))

    # Which port vertex each intra-region link leaves from and arrives at.
    leave = np.tile(np.arange(n, dtype=np.int64)[:, None], (1, n))
    arrive = np.tile(np.arange(n, dtype=np.int64)[None, :], (n, 1))
    for s, entries in stars_out.items():
        if len(entries) > 1 and _overlap([t for _, t, _ in entries]):
            raise UnsupportedFabricError(f"topology {topology.name!r}: rank {s} has two egress "
                                         "groups over the same link")
        for group, targets, label in entries:
            port = vertices.add(label)
            arcs(s, port, group.limit)
            leave[s, targets] = port
    for d, entries in stars_in.items():
        if len(entries) > 1 and _overlap([s for _, s, _ in entries]):
            raise UnsupportedFabricError(f"topology {topology.name!r}: rank {d} has two ingress "
                                         "groups over the same link")
        for group, sources, label in entries:
            port = vertices.add(label)
            arcs(port, d, group.limit)
            arrive[sources, d] = port

    src_idx, dst_idx = np.nonzero(links)
    inside = regions[src_idx] == regions[dst_idx]
    if (~inside).any() and not network.get("outbound"):
        raise UnsupportedFabricError(f"topology {topology.name!r}: links between nodes without NIC "
                                     "groups")
    s_in, d_in = src_idx[inside], dst_idx[inside]
    arcs(leave[s_in, d_in], arrive[s_in, d_in], links[s_in, d_in])
    if (~inside).any():
        _check_between(topology.name, links, regions, src_idx[~inside], dst_idx[~inside], network)
        _network(topology.name, n, regions, network, vertices, arcs)

    src = np.concatenate(arcs_src) if arcs_src else np.zeros(0, np.int64)
    dst = np.concatenate(arcs_dst) if arcs_dst else np.zeros(0, np.int64)
    cap = np.concatenate(arcs_cap) if arcs_cap else np.zeros(0, np.int64)
    return Fabric(n, n + len(vertices.labels), src, dst, cap, tuple(vertices.labels), regions)


@dataclass(frozen=True)
class _Limit:
    """A network group of a composition, as :func:`_network` reads one: its limit."""

    limit: int


def _composed_fabric(name: str, composition, classes: "_Classes | None" = None) -> Fabric:
    """The fabric of a composed topology, from its node and layout (no ``n x n`` matrix): the
    node's own fabric once per node, then the network of :func:`_network` fed with the groups
    :class:`~collsynth.topology.compose.Composition` describes, classified as
    :func:`_classify` would classify them. With ``classes``, the quotient of
    :func:`composed_quotient`: one region per class of nodes, capacities times its size."""
    per, nodes = composition.ranks_per_node, composition.nodes
    spec = composition.spec
    if classes is None:
        leaf_size = spec.nodes_per_leaf if spec.nodes_per_leaf else nodes
        classes = _Classes(np.ones(nodes, np.int64), np.arange(nodes) // leaf_size,
                           np.ones(nodes // leaf_size, np.int64), None, None)
    mult = classes.mult
    regions_count = len(mult)
    n = per * regions_count
    local_groups = tuple(BandwidthGroup(g.sources, g.destinations, g.limit * composition.scale,
                                        g.name or f"group {index}")
                         for index, g in enumerate(composition.node.groups))
    if composition.flipped:
        local_groups = tuple(g.reversed() for g in local_groups)
    node = Topology(composition.node.name, tuple(map(tuple, composition.local_links().tolist())),
                    local_groups)
    inner = build_fabric(node)
    extra = inner.num_vertices - per
    shift_rank = (np.arange(regions_count, dtype=np.int64) * per)[:, None]
    shift_port = (n + np.arange(regions_count, dtype=np.int64) * extra)[:, None]

    def tile(v: np.ndarray) -> np.ndarray:
        return np.where(v[None, :] < per, v[None, :] + shift_rank, v[None, :] - per + shift_port)

    vertices = _Vertices(n)
    vertices.labels.extend(f"node {k}: {label}" for k in range(regions_count)
                           for label in inner.labels)
    inner_cap = np.where(inner.cap[None, :] >= INFINITE, INFINITE, inner.cap[None, :] * mult[:, None])
    arcs_src = [tile(inner.src).ravel()]
    arcs_dst = [tile(inner.dst).ravel()]
    arcs_cap = [inner_cap.ravel()]

    def arcs(src, dst, cap) -> None:
        src, dst, cap = np.broadcast_arrays(np.atleast_1d(np.asarray(src, np.int64)),
                                            np.atleast_1d(np.asarray(dst, np.int64)),
                                            np.asarray(cap, np.int64))
        arcs_src.append(src.copy())
        arcs_dst.append(dst.copy())
        arcs_cap.append(cap.copy())

    # The groups of the network, each as (limit, narrow side, label) under its kind; egress and
    # ingress swap names in the reversed topology.
    out_word, in_word = ("ingress", "egress") if composition.flipped else ("egress", "ingress")
    up_word, down_word = ("downlink", "uplink") if composition.flipped else ("uplink", "downlink")
    network: dict[str, list] = {"outbound": [], "inbound": []}
    every = np.arange(n, dtype=np.int64)
    units, over = composition.units, composition.oversubscription
    for k in range(regions_count):
        base = k * per
        for j, members in enumerate(composition.nic_ranks):
            mine = base + np.sort(np.asarray(members, np.int64))
            network["outbound"].append((_Limit(units * mult[k]), mine,
                                        f"node {k} NIC {j} {out_word}"))
            network["inbound"].append((_Limit(units * mult[k]), mine,
                                       f"node {k} NIC {j} {in_word}"))
        if composition.uplink is not None:
            whole = every[base:base + per]
            network["outbound"].append((_Limit(composition.uplink * mult[k]), whole,
                                        f"node {k} {up_word} (oversubscription {over})"))
            network["inbound"].append((_Limit(composition.uplink * mult[k]), whole,
                                       f"node {k} {down_word} (oversubscription {over})"))
    limits = composition.tier_limits()
    if "leaf" in limits and nodes > spec.nodes_per_leaf:
        ratio = spec.ratio("leaf")
        up, down = (f"{up_word} (oversubscription {ratio})",
                    f"{down_word} (oversubscription {ratio})")
        if spec.nodes_per_leaf == 1:  # a leaf of one node: that node's uplink
            for k in range(regions_count):
                whole = every[k * per:(k + 1) * per]
                network["outbound"].append((_Limit(limits["leaf"] * mult[k]), whole,
                                            f"leaf {k} {up}"))
                network["inbound"].append((_Limit(limits["leaf"] * mult[k]), whole,
                                           f"leaf {k} {down}"))
        else:
            for m, size in enumerate(classes.leaf_mult):
                mine = every[np.repeat(classes.leaf_of == m, per)]
                network.setdefault("leaf-out", []).append(
                    (_Limit(limits["leaf"] * size), mine, f"leaf {m} {up}"))
                network.setdefault("leaf-in", []).append(
                    (_Limit(limits["leaf"] * size), mine, f"leaf {m} {down}"))
    if "rail" in limits:
        ratio = spec.ratio("rail")
        for j, members in enumerate(composition.nic_ranks):
            for k in range(regions_count):
                mine = k * per + np.sort(np.asarray(members, np.int64))
                label = f"node {k} NIC {j} cross-rail"
                network.setdefault("cross-out", []).append(
                    (_Limit(limits["rail"] * mult[k]), mine,
                     f"{label} {out_word} (oversubscription {ratio})"))
                network.setdefault("cross-in", []).append(
                    (_Limit(limits["rail"] * mult[k]), mine,
                     f"{label} {in_word} (oversubscription {ratio})"))
    regions = every // per
    _network(name, n, regions, network, vertices, arcs, classes.self_ok, classes.leaf_self_ok)
    return Fabric(n, n + len(vertices.labels), np.concatenate(arcs_src),
                  np.concatenate(arcs_dst), np.concatenate(arcs_cap), tuple(vertices.labels),
                  regions)


@dataclass(frozen=True)
class _Classes:
    """Nodes grouped for a quotient: ``mult[c]`` nodes in class ``c``, under leaf class
    ``leaf_of[c]`` of ``leaf_mult`` leaves; ``self_ok``/``leaf_self_ok`` as :func:`_network`."""

    mult: np.ndarray
    leaf_of: np.ndarray
    leaf_mult: np.ndarray
    self_ok: np.ndarray | None
    leaf_self_ok: np.ndarray | None


@dataclass(frozen=True)
class Quotient:
    """The fabric of a composed topology folded by the node permutations that fix node 0.

    ``fabric`` has one region per class of nodes (node 0 alone first); ``class_nodes[c]`` lists
    the nodes of class ``c`` (its rank vertices stand for those nodes' ranks, its capacities are
    their sums). A flow invariant under those permutations folds onto it and unfolds from it, so
    maximum flows and minimum cuts between sets made of whole classes (node 0's ranks, node 0,
    its leaf) are those of :func:`build_fabric`'s fabric, on a graph the size of a few nodes.
    """

    fabric: Fabric
    class_nodes: tuple[np.ndarray, ...]
    ranks_per_node: int

    @property
    def multiplicity(self) -> np.ndarray:
        """Nodes per class, for each rank vertex of the quotient."""
        sizes = np.array([len(c) for c in self.class_nodes], np.int64)
        return np.repeat(sizes, self.ranks_per_node)

    def unfold(self, ranks: np.ndarray) -> np.ndarray:
        """The ranks of the topology that quotient ranks ``ranks`` stand for, sorted."""
        per = self.ranks_per_node
        parts = [self.class_nodes[r // per] * per + r % per for r in np.asarray(ranks).tolist()]
        return np.sort(np.concatenate(parts)) if parts else np.zeros(0, np.int64)


def composed_quotient(topology: Topology) -> Quotient | None:
    """The :class:`Quotient` of a topology stored sparsely on more than one node, else ``None``.

    The classes are the orbits of the nodes under the permutations fixing node 0 that preserve
    the fabric: on one switch or rails, node 0 and the others; under leaves, node 0, the other
    nodes of its leaf and the nodes of the other leaves.

    Raises
    ------
    UnsupportedFabricError
        As :func:`build_fabric`.
    """
    composition = topology.composition
    if composition is None or composition.nodes < 2:
        return None
    nodes, spec = composition.nodes, composition.spec
    per_leaf = spec.nodes_per_leaf if spec.kind == "leaf-spine" else None
    everything = np.arange(nodes, dtype=np.int64)
    # self_ok: the class holds two distinct nodes under one leaf, so its paths may return to it.
    if per_leaf is None or per_leaf in (1, nodes):
        members = (everything[:1], everything[1:])
        leaf_of, leaf_mult, leaf_self = np.zeros(2, np.int64), np.ones(1, np.int64), None
        self_ok = np.array([False, nodes - 1 >= 2])
    else:  # node 0; the rest of its leaf; every node of the other leaves
        members = (everything[:1], everything[1:per_leaf], everything[per_leaf:])
        leaves = nodes // per_leaf
        leaf_of = np.array([0, 0, 1], np.int64)
        leaf_mult = np.array([1, leaves - 1], np.int64)
        leaf_self = np.array([False, leaves - 1 >= 2])
        self_ok = np.array([False, per_leaf - 1 >= 2, True])
    mult = np.array([len(m) for m in members], np.int64)
    classes = _Classes(mult, leaf_of, leaf_mult, self_ok, leaf_self)
    fabric = _composed_fabric(topology.name, composition, classes)
    return Quotient(fabric, members, composition.ranks_per_node)


def _regions(topology: Topology) -> np.ndarray:
    """The node of every rank for a composed topology, else ``-1`` everywhere."""
    layout, n = topology.layout, topology.num_ranks
    if layout is not None:
        return np.arange(n, dtype=np.int64) // layout.ranks_per_node
    return np.full(n, -1, dtype=np.int64)


def _classify(group, sources, targets, regions, n) -> str | None:
    if regions[0] >= 0:
        per = int((regions == 0).sum())
        num_regions = n // per
        src_regions = np.unique(regions[sources])
        dst_regions = np.unique(regions[targets])
        disjoint = not np.isin(dst_regions, src_regions).any()
        if len(src_regions) == 1 and disjoint:
            if len(targets) == n - per:
                return "outbound"
            if _off_rail(sources, targets, per, num_regions):
                return "cross-out"
        if len(dst_regions) == 1 and disjoint:
            if len(sources) == n - per:
                return "inbound"
            if _off_rail(targets, sources, per, num_regions):
                return "cross-in"
        if disjoint and len(sources) == len(src_regions) * per \
                and len(targets) == len(dst_regions) * per and len(sources) + len(targets) == n:
            # Whole regions to all the others: a leaf's uplink (or downlink), the leaf being the
            # smaller side (with two leaves, leaf 0's uplink is leaf 1's downlink).
            return "leaf-out" if len(sources) <= len(targets) else "leaf-in"
        within = len(src_regions) == 1 and len(dst_regions) == 1 and src_regions[0] == dst_regions[0]
        if not within:
            return None
    if len(sources) == 1:
        return "star-out"
    if len(targets) == 1:
        return "star-in"
    return None


def _off_rail(nic: np.ndarray, others: np.ndarray, per: int, num_regions: int) -> bool:
    """True when ``others`` are exactly the ranks of the other regions whose local index is not
    one of ``nic``'s (``nic`` within one region, ``others`` outside it: checked by the caller)."""
    mine = np.unique(nic % per)
    return len(mine) == len(nic) and len(others) == (num_regions - 1) * (per - len(mine)) \
        and not np.isin(others % per, mine).any()


def _overlap(sets: list[np.ndarray]) -> bool:
    joined = np.concatenate(sets)
    return len(np.unique(joined)) < len(joined)


def _check_between(name, links, regions, src_idx, dst_idx, groups) -> None:
    """The links between regions are complete and no narrower than the NICs that carry them."""
    n = len(regions)
    num_regions = int(regions.max()) + 1
    expected = sum(int(c) * (n - int(c)) for c in np.bincount(regions, minlength=num_regions))
    if len(src_idx) != expected:
        raise UnsupportedFabricError(f"topology {name!r}: the links between nodes are not complete "
                                     f"({len(src_idx)} of {expected})")
    per = n // num_regions
    out_limit = np.full(n, INFINITE, np.int64)
    in_limit = np.full(n, INFINITE, np.int64)
    for kind, limit in (("outbound", out_limit), ("inbound", in_limit)):
        for group, members, _ in groups.get(kind, ()):
            if not (len(members) == per and len(members) > 1):
                limit[members] = np.minimum(limit[members], group.limit)
    nic = np.minimum(out_limit[src_idx], in_limit[dst_idx])
    narrow = (links[src_idx, dst_idx] < nic) & (nic < INFINITE)  # a missing NIC: _network says
    if narrow.any():
        i = int(np.flatnonzero(narrow)[0])
        raise UnsupportedFabricError(
            f"topology {name!r}: link {src_idx[i]}->{dst_idx[i]} is narrower than its NICs; the "
            "fabric assumes the NICs are the limit between nodes")


def _network(name, n, regions, groups, vertices, arcs, self_ok=None, leaf_self_ok=None) -> None:
    """Ports and region arcs for the links between regions (see docs/large-systems.md).

    ``self_ok[x]`` (a quotient, :func:`composed_quotient`): region ``x`` stands for several
    nodes of one leaf, so its network paths may return to it; ``leaf_self_ok`` likewise."""
    num_regions = int(regions.max()) + 1
    per = n // num_regions
    out_limit = np.zeros(n, np.int64)
    in_limit = np.zeros(n, np.int64)
    uplink_cap = np.full(num_regions, INFINITE, np.int64)
    downlink_cap = np.full(num_regions, INFINITE, np.int64)
    nic_out: dict[bytes, int] = {}  # a NIC's sorted ranks -> its port vertex
    nic_in: dict[bytes, int] = {}
    # (region, port, rail: the NIC's local ranks, limit)
    ports_out: list[tuple[int, int, bytes, int]] = []
    ports_in: list[tuple[int, int, bytes, int]] = []
    # NIC ports, one direction at a time: outbound groups feed a port from their sources,
    # inbound groups feed their targets from a port; node-wide groups are the node's uplink.
    for kind, limit, node_cap, nics, ports in (
            ("outbound", out_limit, uplink_cap, nic_out, ports_out),
            ("inbound", in_limit, downlink_cap, nic_in, ports_in)):
        for group, members, label in groups.get(kind, ()):
            region = int(regions[members[0]])
            if len(members) == per and len(members) > 1:
                node_cap[region] = min(node_cap[region], group.limit)
                continue
            if (limit[members] > 0).any():
                raise UnsupportedFabricError(f"topology {name!r}: a rank of {label!r} is served "
                                             "by two NICs")
            port = vertices.add(label)
            if kind == "outbound":
                arcs(members, port, group.limit)
            else:
                arcs(port, members, group.limit)
            nics[members.tobytes()] = port
            ports.append((region, port, np.sort(members % per).tobytes(), group.limit))
            limit[members] = group.limit
    if (out_limit == 0).any() or (in_limit == 0).any():
        missing = int(np.flatnonzero((out_limit == 0) | (in_limit == 0))[0])
        raise UnsupportedFabricError(f"topology {name!r}: rank {missing} has links to other nodes "
                                     "but no NIC group in each direction")
    if groups.get("cross-out") or groups.get("cross-in"):
        if (uplink_cap < INFINITE).any() or (downlink_cap < INFINITE).any() \
                or groups.get("leaf-out") or groups.get("leaf-in"):
            raise UnsupportedFabricError(f"topology {name!r}: cross-rail groups together with node "
                                         "or leaf uplinks are not modelled")
        _rails(name, regions, groups, vertices, arcs, nic_out, nic_in, ports_out, ports_in,
               self_ok)
        return
    up = [vertices.add(f"node {x} uplink") for x in range(num_regions)]
    down = [vertices.add(f"node {x} downlink") for x in range(num_regions)]
    for region, port, _, limit in ports_out:
        arcs(port, up[region], limit)
    for region, port, _, limit in ports_in:
        arcs(down[region], port, limit)
    # Node uplink caps: up(X) -> capped(X); node downlink caps: capped(Y) -> down(Y).
    top_up, top_down = list(up), list(down)
    for x in range(num_regions):
        if uplink_cap[x] < INFINITE:
            top_up[x] = vertices.add(f"node {x} uplink (oversubscribed)")
            arcs(up[x], top_up[x], uplink_cap[x])
        if downlink_cap[x] < INFINITE:
            top_down[x] = vertices.add(f"node {x} downlink (oversubscribed)")
            arcs(top_down[x], down[x], downlink_cap[x])
    leaf = _leaves(name, regions, groups, num_regions)
    num_leaves = int(leaf.max()) + 1
    top_up_array, top_down_array = np.asarray(top_up, np.int64), np.asarray(top_down, np.int64)
    for m in range(num_leaves):
        members = np.flatnonzero(leaf == m)
        _all_but_self(vertices, arcs, top_up_array[members], top_down_array[members],
                      f"leaf {m}" if num_leaves > 1 else "network",
                      None if self_ok is None else self_ok[members])
    if num_leaves == 1:
        return
    leaf_up = [vertices.add(f"leaf {m} uplink") for m in range(num_leaves)]
    leaf_down = [vertices.add(f"leaf {m} downlink") for m in range(num_leaves)]
    arcs(np.asarray(top_up, np.int64), np.asarray(leaf_up, np.int64)[leaf], INFINITE)
    arcs(np.asarray(leaf_down, np.int64)[leaf], np.asarray(top_down, np.int64), INFINITE)
    cap_up, cap_down = list(leaf_up), list(leaf_down)
    for kind, caps, base, outward in (("leaf-out", cap_up, leaf_up, True),
                                      ("leaf-in", cap_down, leaf_down, False)):
        limits: dict[int, int] = {}
        for group, ranks, label in groups.get(kind, ()):
            m = int(leaf[regions[ranks[0]]])
            limits[m] = min(limits.get(m, INFINITE), group.limit)
        for m, limit in sorted(limits.items()):
            caps[m] = vertices.add(f"leaf {m} {'uplink' if outward else 'downlink'} "
                                   "(oversubscribed)")
            arcs(*((base[m], caps[m]) if outward else (caps[m], base[m])), limit)
    _all_but_self(vertices, arcs, np.asarray(cap_up, np.int64), np.asarray(cap_down, np.int64),
                  "spine", leaf_self_ok)


#: Up to this many regions, every pair gets its own arc; above, :func:`_all_but_self` chains.
_DIRECT_PAIRS = 8


def _all_but_self(vertices, arcs, outs: np.ndarray, ins: np.ndarray, label: str,
                  self_ok: np.ndarray | None = None) -> None:
    """Infinite paths from ``outs[i]`` to ``ins[j]`` for every ``i != j``, and no others (but
    ``outs[i] -> ins[i]`` where ``self_ok[i]``).

    ``m (m - 1)`` direct arcs for a few; above, ``O(m)``: a prefix chain ``P[i] -> P[i-1]``,
    ``P[i] -> ins[i]`` entered from ``outs[i]`` at ``P[i-1]`` (reaching ``ins[j]``, ``j < i``)
    and a suffix chain entered at ``S[i+1]`` (``j > i``). Every arc is infinite, so the flows
    and cuts between the original vertices are those of the direct arcs.
    """
    m = len(outs)
    if self_ok is not None and np.any(self_ok):
        arcs(outs[self_ok], ins[self_ok], INFINITE)
    if m <= _DIRECT_PAIRS:
        a_idx, b_idx = np.nonzero(~np.eye(m, dtype=bool))
        arcs(outs[a_idx], ins[b_idx], INFINITE)
        return
    first = vertices.num_ranks + len(vertices.labels)
    vertices.labels.extend(f"{label} to regions below {i}" for i in range(m))
    vertices.labels.extend(f"{label} to regions above {i}" for i in range(m))
    prefix = first + np.arange(m, dtype=np.int64)
    suffix = first + m + np.arange(m, dtype=np.int64)
    arcs(prefix, ins, INFINITE)
    arcs(suffix, ins, INFINITE)
    arcs(prefix[1:], prefix[:-1], INFINITE)
    arcs(suffix[:-1], suffix[1:], INFINITE)
    arcs(outs[1:], prefix[:-1], INFINITE)
    arcs(outs[:-1], suffix[1:], INFINITE)


def _leaves(name, regions, groups, num_regions) -> np.ndarray:
    """The leaf of every region: the region sets of the leaf groups, which must not overlap;
    one leaf for all when there are none."""
    leaf = np.full(num_regions, -1, np.int64)
    sets: dict[bytes, int] = {}
    for kind in ("leaf-out", "leaf-in"):
        for group, ranks, label in groups.get(kind, ()):
            members = np.unique(regions[ranks])
            key = members.tobytes()
            if key in sets:
                continue
            if (leaf[members] >= 0).any():
                raise UnsupportedFabricError(f"topology {name!r}: leaf group {label!r} overlaps "
                                             "another leaf")
            sets[key] = len(sets)
            leaf[members] = sets[key]
    if not sets:
        return np.zeros(num_regions, np.int64)
    if (leaf < 0).any():
        raise UnsupportedFabricError(f"topology {name!r}: node {int(np.flatnonzero(leaf < 0)[0])} "
                                     "is under no leaf while others are")
    return leaf


def _rails(name, regions, groups, vertices, arcs, nic_out, nic_in, ports_out, ports_in,
           self_ok=None) -> None:
    """Rail arcs (see docs/large-systems.md): same-rail NICs joined directly, every NIC through
    its cross-rail caps and the spine."""
    num_regions = int(regions.max()) + 1
    cross_out: dict[int, int] = {}
    cross_in: dict[int, int] = {}
    for kind, ports, caps in (("cross-out", nic_out, cross_out), ("cross-in", nic_in, cross_in)):
        for group, ranks, label in groups.get(kind, ()):
            port = ports.get(np.sort(ranks).tobytes())
            if port is None:
                raise UnsupportedFabricError(f"topology {name!r}: cross-rail group {label!r} is "
                                             "not the ranks of one NIC")
            caps[port] = min(caps.get(port, INFINITE), group.limit)
    rails = sorted({rail for _, _, rail, _ in ports_out} | {rail for _, _, rail, _ in ports_in})
    outs_of: dict[bytes, list[tuple[int, int]]] = {rail: [] for rail in rails}
    ins_of: dict[bytes, list[tuple[int, int]]] = {rail: [] for rail in rails}
    for x, p, r, _ in ports_out:
        outs_of[r].append((x, p))
    for y, q, r, _ in ports_in:
        ins_of[r].append((y, q))
    for rail in rails:
        outs, ins = outs_of[rail], ins_of[rail]
        if len(rail) == np.dtype(np.int64).itemsize:
            # One rank per NIC: a rail switch vertex, whose only extra path (a NIC back into
            # its own node) leads a rank to itself.
            switch = vertices.add(f"rail {int(np.frombuffer(rail, np.int64)[0])} switch")
            arcs([p for _, p in outs], switch, INFINITE)
            arcs(switch, [q for _, q in ins], INFINITE)
            continue
        out_regions, in_regions = [x for x, _ in outs], [y for y, _ in ins]
        if out_regions == in_regions and len(set(out_regions)) == len(out_regions):
            # One port each way per region: the pairs of distinct regions, chained.
            _all_but_self(vertices, arcs, np.asarray([p for _, p in outs], np.int64),
                          np.asarray([q for _, q in ins], np.int64), "rail",
                          None if self_ok is None else self_ok[out_regions])
            continue
        pairs = [(p, q) for x, p in outs for y, q in ins if x != y]
        if pairs:
            arcs([p for p, _ in pairs], [q for _, q in pairs], INFINITE)
    # The direct same-rail arcs bypass the cross-rail caps: exact only when every region's NICs
    # serve the same local ranks (identical nodes), so that a rail is the same set everywhere.
    per_region: dict[tuple[int, int], set[bytes]] = {}
    for side, ports in enumerate((ports_out, ports_in)):
        for x, _, r, _ in ports:
            per_region.setdefault((side, x), set()).add(r)
    layouts = {frozenset(per_region.get((side, region), ())) for side in (0, 1)
               for region in range(num_regions)}
    if len(layouts) != 1:
        raise UnsupportedFabricError(f"topology {name!r}: the NICs of different nodes do not "
                                     "serve the same local ranks; rails need identical nodes")
    spine_out = [vertices.add(f"node {x} to spine") for x in range(num_regions)]
    spine_in = [vertices.add(f"node {x} from spine") for x in range(num_regions)]
    for x, port, _, _ in ports_out:
        if port in cross_out:
            capped = vertices.add(f"{vertices.labels[port - vertices.num_ranks]} (cross-rail)")
            arcs(port, capped, cross_out[port])
            arcs(capped, spine_out[x], INFINITE)
        else:
            arcs(port, spine_out[x], INFINITE)
    for y, port, _, _ in ports_in:
        if port in cross_in:
            capped = vertices.add(f"{vertices.labels[port - vertices.num_ranks]} (cross-rail)")
            arcs(spine_in[y], capped, INFINITE)
            arcs(capped, port, cross_in[port])
        else:
            arcs(spine_in[y], port, INFINITE)
    _all_but_self(vertices, arcs, np.asarray(spine_out, np.int64), np.asarray(spine_in, np.int64),
                  "spine", self_ok)
