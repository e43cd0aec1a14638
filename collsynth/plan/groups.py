"""Process groups as topologies: the sub-topology a group of ranks runs on.

A traced call runs on a process group: a list of global ranks, group rank ``i`` being global rank
``group[i]``. Global rank ``r`` is rank ``r`` of the planning topology. A collective on the
whole topology (every rank, in order) runs on the topology itself; any other group runs on its
*induced* sub-topology: the links and bandwidth groups among its ranks, renumbered in group
order (:func:`collsynth.training.comm.induced_topology`, shared with the training simulator).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Sequence

from collsynth.topology.model import Topology

__all__ = ["induced_topology", "topology_for_group", "topology_fingerprint", "plan_signature"]


def induced_topology(topology: Topology, ranks: Sequence[int]) -> Topology:
    """The sub-topology of ``ranks``, renumbered in the order given (rank ``i`` is ``ranks[i]``).

    Links among ``ranks`` keep their bandwidth; each bandwidth group keeps the part of its
    sources and destinations inside ``ranks`` (dropped when either part is empty);
    ``unit_gbps`` and ``alpha_us`` are kept; a group spread evenly over several nodes of a
    composed topology keeps a network description (see
    :func:`collsynth.training.comm.induced_topology`).

    Raises
    ------
    InvalidInstanceError
        An empty list, a repeated rank, or a rank outside the topology.

    >>> from collsynth.topology import get_topology
    >>> dgx1 = get_topology("dgx1")
    >>> half = induced_topology(dgx1, [0, 1, 2, 3])
    >>> half.num_ranks, half.links == tuple(row[:4] for row in dgx1.links[:4])
    (4, True)
    >>> induced_topology(dgx1, [3, 0]).bandwidth(0, 1) == dgx1.bandwidth(3, 0)
    True
    """
    from collsynth.training.comm import induced_topology as _induced

    return _induced(topology, tuple(ranks))


def topology_for_group(topology: Topology, group: Sequence[int]) -> Topology:
    """The topology a collective on ``group`` runs on: ``topology`` itself when ``group`` is
    every rank in order, else :func:`induced_topology`.

    >>> from collsynth.topology import get_topology
    >>> dgx1 = get_topology("dgx1")
    >>> topology_for_group(dgx1, range(8)) is dgx1, topology_for_group(dgx1, [0, 1]).num_ranks
    (True, 2)
    """
    if list(group) == list(range(topology.num_ranks)):
        return topology
    return induced_topology(topology, group)


def topology_fingerprint(topology: Topology) -> str:
    """A hash of what synthesis depends on: the links and the bandwidth-group limits (not the
    name, not the physical figures, not the groups' names).

    >>> from collsynth.topology import get_topology
    >>> dgx1 = get_topology("dgx1")
    >>> topology_fingerprint(induced_topology(dgx1, [0, 1, 2, 3])) == topology_fingerprint(dgx1)
    False
    >>> len(topology_fingerprint(dgx1))
    64
    """
    groups = sorted((sorted(g.sources), sorted(g.destinations), g.limit)
                    for g in topology.groups)
    text = json.dumps({"links": [list(row) for row in topology.links], "groups": groups},
                      separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def plan_signature(topology: Topology) -> tuple[Any, ...]:
    """What makes two groups' plans the same: links, bandwidth groups, the physical figures and
    the network description (:func:`collsynth.training.comm.topology_signature`)."""
    from collsynth.training.comm import topology_signature

    return topology_signature(topology)
