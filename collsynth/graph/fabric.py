"""The *fabric*: a sparse graph with switch-port vertices that carries exactly a topology's limits.

The details: ``docs/large-systems.md``, section "collsynth.graph.fabric".
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from collsynth.errors import InvalidTopologyError
from collsynth.topology.model import Topology

__all__ = ["Fabric", "UnsupportedFabricError", "build_fabric", "link_matrix", "INFINITE"]

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
    """The fabric of ``topology`` (see the module docstring).

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
        _network(topology, links, regions, network, vertices, arcs, src_idx[~inside],
                 dst_idx[~inside])

    src = np.concatenate(arcs_src) if arcs_src else np.zeros(0, np.int64)
    dst = np.concatenate(arcs_dst) if arcs_dst else np.zeros(0, np.int64)
    cap = np.concatenate(arcs_cap) if arcs_cap else np.zeros(0, np.int64)
    return Fabric(n, n + len(vertices.labels), src, dst, cap, tuple(vertices.labels), regions)


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


def _network(topology, links, regions, groups, vertices, arcs, src_idx, dst_idx) -> None:
    """Ports and region arcs for the links between regions (see the module docstring)."""
    name = topology.name
    n = topology.num_ranks
    num_regions = int(regions.max()) + 1
    per = n // num_regions
    expected = sum(int(c) * (n - int(c)) for c in np.bincount(regions, minlength=num_regions))
    if len(src_idx) != expected:
        raise UnsupportedFabricError(f"topology {name!r}: the links between nodes are not complete "
                                     f"({len(src_idx)} of {expected})")
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
    narrow = links[src_idx, dst_idx] < np.minimum(out_limit[src_idx], in_limit[dst_idx])
    if narrow.any():
        i = int(np.flatnonzero(narrow)[0])
        raise UnsupportedFabricError(
            f"topology {name!r}: link {src_idx[i]}->{dst_idx[i]} is narrower than its NICs; the "
            "fabric assumes the NICs are the limit between nodes")
    if groups.get("cross-out") or groups.get("cross-in"):
        if (uplink_cap < INFINITE).any() or (downlink_cap < INFINITE).any() \
                or groups.get("leaf-out") or groups.get("leaf-in"):
            raise UnsupportedFabricError(f"topology {name!r}: cross-rail groups together with node "
                                         "or leaf uplinks are not modelled")
        _rails(name, regions, groups, vertices, arcs, nic_out, nic_in, ports_out, ports_in)
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
    same = leaf[:, None] == leaf[None, :]
    np.fill_diagonal(same, False)
    x_idx, y_idx = np.nonzero(same)
    arcs(np.asarray(top_up, np.int64)[x_idx], np.asarray(top_down, np.int64)[y_idx], INFINITE)
    num_leaves = int(leaf.max()) + 1
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
    a_idx, b_idx = np.nonzero(~np.eye(num_leaves, dtype=bool))
    arcs(np.asarray(cap_up, np.int64)[a_idx], np.asarray(cap_down, np.int64)[b_idx], INFINITE)


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


def _rails(name, regions, groups, vertices, arcs, nic_out, nic_in, ports_out, ports_in) -> None:
    """Rail arcs (see the module docstring): same-rail NICs joined directly, every NIC through
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
    for rail in rails:
        outs = [(x, p) for x, p, r, _ in ports_out if r == rail]
        ins = [(y, p) for y, p, r, _ in ports_in if r == rail]
        if len(rail) == np.dtype(np.int64).itemsize:
            # One rank per NIC: a rail switch vertex, whose only extra path (a NIC back into
            # its own node) leads a rank to itself.
            switch = vertices.add(f"rail {int(np.frombuffer(rail, np.int64)[0])} switch")
            arcs([p for _, p in outs], switch, INFINITE)
            arcs(switch, [q for _, q in ins], INFINITE)
            continue
        pairs = [(p, q) for x, p in outs for y, q in ins if x != y]
        if pairs:
            arcs([p for p, _ in pairs], [q for _, q in pairs], INFINITE)
    # The direct same-rail arcs bypass the cross-rail caps: exact only when every region's NICs
    # serve the same local ranks (identical nodes), so that a rail is the same set everywhere.
    layouts = {frozenset(r for x, _, r, _ in ports if x == region)
               for ports in (ports_out, ports_in) for region in range(num_regions)}
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
    x_idx, y_idx = np.nonzero(~np.eye(num_regions, dtype=bool))
    arcs(np.asarray(spine_out, np.int64)[x_idx], np.asarray(spine_in, np.int64)[y_idx], INFINITE)
