"""The node shift of a composed topology: ``rank -> rank + ranks_per_node (mod n)``.

:func:`collsynth.topology.compose_nodes` builds ``K`` identical nodes joined by a non-blocking
network, so moving every rank to the same place in the next node maps links to links and groups
to groups. The tree engine designs trees for the roots of node 0 only and moves them to the other
nodes with this shift; the shift is checked on the topology itself (links and groups), never
assumed from metadata alone.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from collsynth.topology.model import Topology

__all__ = ["NodeShift", "node_shift"]


@dataclass(frozen=True)
class NodeShift:
    """``K = nodes`` copies of ``ranks_per_node`` ranks; rank ``r`` of node ``k`` is
    ``k * ranks_per_node + r``."""

    nodes: int
    ranks_per_node: int

    @property
    def num_ranks(self) -> int:
        return self.nodes * self.ranks_per_node

    def shift(self, ranks: np.ndarray, by_nodes: int | np.ndarray) -> np.ndarray:
        """``ranks`` moved ``by_nodes`` nodes forward (modulo the node count)."""
        return (np.asarray(ranks) + np.asarray(by_nodes) * self.ranks_per_node) % self.num_ranks


def node_shift(topology: Topology) -> NodeShift | None:
    """The node shift of ``topology`` if it is a symmetry, else ``None`` (also for one node).

    >>> from collsynth.topology import compose_nodes, get_topology
    >>> node_shift(compose_nodes(get_topology("ring:4"), 3, nic_units=1))
    NodeShift(nodes=3, ranks_per_node=4)
    >>> node_shift(get_topology("ring:4")) is None
    True
    """
    network = topology.metadata.get("network") if hasattr(topology.metadata, "get") else None
    if not isinstance(network, dict):
        return None
    per_node, nodes = network.get("ranks_per_node"), network.get("nodes")
    n = topology.num_ranks
    if not (isinstance(per_node, int) and isinstance(nodes, int) and nodes > 1
            and per_node * nodes == n):
        return None
    links = np.array(topology.links, dtype=np.int64)
    if not np.array_equal(np.roll(links, (per_node, per_node), axis=(0, 1)), links):
        return None
    keys = {_group_key(g.sources, g.destinations, g.limit) for g in topology.groups}
    for group in topology.groups:
        moved = _group_key(((s + per_node) % n for s in group.sources),
                           ((d + per_node) % n for d in group.destinations), group.limit)
        if moved not in keys:
            return None
    return NodeShift(nodes, per_node)


def _group_key(sources, destinations, limit) -> tuple:
    return frozenset(sources), frozenset(destinations), limit
