"""The path a runtime takes between two ranks that share no direct link.

A program written for another machine (a "foreign" program) may send between ranks the topology
does not link: the runtime still moves the data, over a path it picks by itself. The program
model prices such a send over that path (:func:`runtime_path`) and names it in a warning;
docs/runtime-model.md, "Foreign programs", states the path per topology.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Hashable

if TYPE_CHECKING:  # pragma: no cover - imported for annotations only
    from collsynth.topology.model import Topology

__all__ = ["Path", "runtime_path", "Fabric", "Route", "INTRA", "NETWORK"]

#: Link classes of the program model: inside a node, between nodes.
INTRA, NETWORK = 0, 1


@dataclass(frozen=True)
class Path:
    """How the runtime carries a send from a rank to one it has no link to.

    ``via`` names the way (``"PCIe through the host"``, ``"the NVSwitch"``, ``"the NICs"``);
    ``link_class`` is :data:`INTRA` or :data:`NETWORK` (its hop latency and ceiling);
    ``groups`` are indices into the topology's ``binding_groups`` the path crosses (a NIC's or
    a switch port's egress and ingress, shared with the program's other sends); ``own`` are
    further resources ``(key, name, GB/s)`` only such paths cross (a GPU's PCIe link).
    """

    via: str
    link_class: int
    groups: tuple[int, ...] = ()
    own: tuple[tuple[Hashable, str, float], ...] = ()

    @property
    def gbps(self) -> float | None:
        """The narrowest of its own resources (GB/s), ``None`` when it has none."""
        return min((g for _, _, g in self.own), default=None)


def runtime_path(topology: "Topology", a: int, b: int) -> Path:
    """The path the runtime uses from rank ``a`` to rank ``b`` of ``topology`` (no link
    ``a -> b``):

    * ranks of different nodes: through their NICs (the NIC egress and ingress groups of the
      composition; without groups, each NIC at the machine's NIC GB/s);
    * ranks of one node on an NVSwitch (:attr:`MachineFacts.nvswitch`): through the switch, on
      the two GPUs' switch ports (their egress and ingress groups; without groups, the sum of
      their links);
    * ranks of one node otherwise: PCIe through the host (NCCL's and RCCL's P2P or SHM
      transport), out of ``a``'s PCIe link and into ``b``'s, each at
      :attr:`MachineFacts.pcie_gbps` per direction.

    >>> from collsynth.topology import get_topology
    >>> path = runtime_path(get_topology("mi250-16gcd"), 7, 8)
    >>> path.via, path.gbps, [name for _, name, _ in path.own]
    ('PCIe through the host', 24.0, ['PCIe of rank 7 (out)', 'PCIe of rank 8 (in)'])
    """
    from collsynth.topology.machine import machine_facts

    facts = machine_facts(topology)
    layout = topology.layout
    per_node = layout.ranks_per_node if layout is not None and layout.multi_node else None
    crossing = tuple(index for index, group in enumerate(topology.binding_groups)
                     if a in group.sources and b in group.destinations)
    if per_node is not None and a // per_node != b // per_node:
        if crossing:
            return Path("the NICs", NETWORK, crossing)
        nic = facts.nic_gbps or float(topology.unit_gbps or 0.0) or facts.pcie_gbps
        return Path("the NICs", NETWORK, (), (
            (("nic", a, "out"), f"NIC of rank {a} (out)", nic),
            (("nic", b, "in"), f"NIC of rank {b} (in)", nic)))
    if facts.nvswitch:
        if crossing:
            return Path("the NVSwitch", INTRA, crossing)
        unit = float(topology.unit_gbps or 0.0)
        start = (a // per_node) * per_node if per_node is not None else 0
        stop = start + per_node if per_node is not None else topology.num_ranks
        out = sum(topology.bandwidth(a, x) for x in range(start, stop)) * unit
        into = sum(topology.bandwidth(x, b) for x in range(start, stop)) * unit
        if out > 0 and into > 0:
            return Path("the NVSwitch", INTRA, (), (
                (("port", a, "out"), f"switch port of rank {a} (out)", out),
                (("port", b, "in"), f"switch port of rank {b} (in)", into)))
    pcie = facts.pcie_gbps
    return Path("PCIe through the host", INTRA, (), (
        (("pcie", a, "out"), f"PCIe of rank {a} (out)", pcie),
        (("pcie", b, "in"), f"PCIe of rank {b} (in)", pcie)))


@dataclass(frozen=True)
class Route:
    """What a send from one rank to another crosses: ``link_class`` (:data:`INTRA`,
    :data:`NETWORK`), ``resources`` (indices into :attr:`Fabric.names`) and ``via`` (``None``
    over a direct link, else the runtime's path, :attr:`Path.via` with its GB/s)."""

    link_class: int
    resources: tuple[int, ...]
    via: str | None = None


def sustained_unit_gbps(topology: "Topology") -> float | None:
    """GB/s one bandwidth unit of ``topology``'s links inside a node sustains under the
    runtime: NCCL's per-NVLink figure where the machine's facts say its GPUs are linked by
    NVLink and a unit is one NVLink (``unit_gbps`` at most 1.5x that figure), else ``None``
    (the nominal ``unit_gbps``)."""
    from collsynth.errors import InvalidTopologyError
    from collsynth.timing.tuning_model import nvlink_gbps
    from collsynth.topology.machine import machine_facts

    if not topology.unit_gbps:
        return None
    try:
        per_link = nvlink_gbps(machine_facts(topology))
    except InvalidTopologyError:
        return None
    if per_link is None or not per_link <= topology.unit_gbps <= 1.5 * per_link:
        return None
    return per_link


class Fabric:
    """The resources sends on ``topology`` share, registered as routes are asked for: a direct
    link ``a -> b`` (``links[a][b]`` units) and the bandwidth groups covering it, or, with no
    link, the runtime's own path (:func:`runtime_path`). Other resources (a switch's ports:
    :mod:`collsynth.timing.switch_graphs`) are added with :meth:`resource`.

    >>> from collsynth.topology import get_topology
    >>> fabric = Fabric(get_topology("dgx-h100"))
    >>> route = fabric.route(0, 1)
    >>> [(fabric.names[r], fabric.capacity_gbps[r]) for r in route.resources]
    [('link 0->1', 370.8), ("group 'rank 0 egress (18 NVLinks)'", 370.8), \
("group 'rank 1 ingress (18 NVLinks)'", 370.8)]
    """

    def __init__(self, topology: "Topology") -> None:
        self.topology = topology
        layout = topology.layout
        self.per_node = layout.ranks_per_node if layout is not None and layout.multi_node \
            else None
        self.unit = float(topology.unit_gbps or 0.0)
        # Links inside a node carry what the runtime sustains over them, for every program alike:
        # on NVLink, NCCL's per-link figure (20.6 GB/s on H100) rather than the nominal rate
        # (25 GB/s), as NCCL's own ring is priced (docs/runtime-model.md, "Sustained NVLink").
        self.intra_unit = min(self.unit, sustained_unit_gbps(topology) or self.unit)
        self.names: list[str] = []
        self.capacity_gbps: list[float] = []
        self._index: dict[Any, int] = {}
        self._routes: dict[tuple[int, int], Route] = {}
        self._groups = topology.binding_groups
        # A group covers the link a -> b when a is one of its sources and b one of its
        # destinations. Each group is filed under the ranks of its smaller side (a NIC's egress
        # under its one source, its ingress under its one destination) rather than under every
        # link it covers: on thousands of ranks that is millions of (link, group) pairs (25 s on
        # 2160 GPUs) where a graph asks for the routes of a few hundred ranks.
        self._groups_from: dict[int, list[tuple[int, frozenset[int]]]] = {}
        self._groups_into: dict[int, list[tuple[int, frozenset[int]]]] = {}
        for index, group in enumerate(self._groups):
            if len(group.sources) <= len(group.destinations):
                for source in group.sources:
                    self._groups_from.setdefault(source, []).append((index, group.destinations))
            else:
                for destination in group.destinations:
                    self._groups_into.setdefault(destination, []).append((index, group.sources))

    def resource(self, key: Hashable, name: str, gbps: float) -> int:
        """The index of resource ``key`` (registered with ``name`` and ``gbps`` the first
        time)."""
        found = self._index.get(key)
        if found is None:
            found = self._index[key] = len(self.names)
            self.names.append(name)
            self.capacity_gbps.append(float(gbps))
        return found

    def node_of(self, rank: int) -> int:
        return rank // self.per_node if self.per_node is not None else 0

    def route(self, a: int, b: int) -> Route:
        """The route of a send from rank ``a`` to rank ``b`` (both ranks of the topology)."""
        found = self._routes.get((a, b))
        if found is not None:
            return found
        links = self.topology.bandwidth(a, b)
        unit = self.unit
        if links:
            link_class = NETWORK if self.node_of(a) != self.node_of(b) else INTRA
            unit = self.intra_unit if link_class == INTRA else self.unit
            own = [self.resource(("link", a, b), f"link {a}->{b}", links * unit)]
            covering: tuple[int, ...] = tuple(sorted(
                [index for index, into in self._groups_from.get(a, ()) if b in into]
                + [index for index, out in self._groups_into.get(b, ()) if a in out]))
            via = None
        else:
            path = runtime_path(self.topology, a, b)
            own = [self.resource(key, name, gbps) for key, name, gbps in path.own]
            covering, link_class = path.groups, path.link_class
            via = path.via + (f", {path.gbps:g} GB/s" if path.gbps else "")
        for g in covering:
            group = self._groups[g]
            own.append(self.resource(("group", g), f"group {group.name or g!r}",
                                     group.limit * unit))
        found = self._routes[(a, b)] = Route(link_class, tuple(own), via)
        return found
