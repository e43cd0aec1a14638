"""The node layout of a multi-node topology: which ranks share a node and its NICs.

:func:`~collsynth.topology.compose.compose_nodes` records it in ``metadata["network"]``;
:attr:`Topology.layout <collsynth.topology.model.Topology.layout>` reads it once into a
:class:`NodeLayout`, which every engine and model asks instead of the raw metadata.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Mapping

from collsynth.errors import InvalidTopologyError

__all__ = ["NodeLayout", "node_layout"]


@dataclass(frozen=True)
class NodeLayout:
    """``nodes`` identical nodes of ``ranks_per_node`` ranks; rank = node * ranks_per_node + local.

    ``nic_gpus[i]`` are the local ranks NIC ``i`` serves; ``nic_units`` its bandwidth units per
    direction; ``nic_gbps`` those units in GB/s (``None`` without physical figures);
    ``nic_gbps_declared`` the NIC's own figure before rounding to units; ``network_alpha_us`` a
    per-step latency between nodes when one was given; ``oversubscription`` >= 1 of the network.
    """

    nodes: int
    ranks_per_node: int
    nic_gpus: tuple[tuple[int, ...], ...] = ()
    nic_units: int | None = None
    nic_gbps: float | None = None
    nic_gbps_declared: float | None = None
    network_alpha_us: float | None = None
    oversubscription: Fraction = Fraction(1)
    composed_from: str = ""

    @property
    def num_ranks(self) -> int:
        return self.nodes * self.ranks_per_node

    @property
    def multi_node(self) -> bool:
        return self.nodes > 1

    def node_of(self, rank: int) -> int:
        return rank // self.ranks_per_node

    def local_rank(self, rank: int) -> int:
        return rank % self.ranks_per_node


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) \
        else None


def node_layout(metadata: Mapping | Any, *, name: str, num_ranks: int) -> NodeLayout | None:
    """The layout ``metadata["network"]`` describes, or ``None`` when there is none.

    Raises
    ------
    InvalidTopologyError
        A ``network`` entry whose ``nodes`` or ``ranks_per_node`` is not a positive whole number,
        or whose product is not ``num_ranks``.

    >>> node_layout({"network": {"nodes": 2, "ranks_per_node": 4}}, name="t", num_ranks=8).nodes
    2
    >>> node_layout({}, name="t", num_ranks=8) is None
    True
    """
    network = metadata.get("network") if isinstance(metadata, Mapping) else None
    if not isinstance(network, Mapping) or ("nodes" not in network
                                            and "ranks_per_node" not in network):
        return None
    nodes, per_node = network.get("nodes"), network.get("ranks_per_node")
    for key, value in (("nodes", nodes), ("ranks_per_node", per_node)):
        if not _whole(value) or value < 1:
            raise InvalidTopologyError(f"topology {name!r}: metadata['network'][{key!r}] = "
                                       f"{value!r}; expected a positive whole number")
    if nodes * per_node != num_ranks:
        raise InvalidTopologyError(
            f"topology {name!r}: metadata['network'] describes {nodes} nodes of {per_node} ranks "
            f"but the topology has {num_ranks} ranks")
    gpus = network.get("nic_gpus")
    nic_gpus = tuple(tuple(int(r) for r in members) for members in gpus) \
        if isinstance(gpus, (list, tuple)) else ()
    units = network.get("nic_units")
    try:
        oversub = Fraction(str(network.get("oversubscription", 1)))
    except (ValueError, ZeroDivisionError):
        oversub = Fraction(1)
    return NodeLayout(
        nodes=nodes, ranks_per_node=per_node, nic_gpus=nic_gpus,
        nic_units=units if _whole(units) else None,
        nic_gbps=_number(network.get("nic_gbps")),
        nic_gbps_declared=_number(network.get("nic_gbps_declared")),
        network_alpha_us=_number(network.get("alpha_us")),
        oversubscription=oversub,
        composed_from=str(network.get("composed_from", "")))
