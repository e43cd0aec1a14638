"""Folding a timing graph by a rotation of the ranks, and by identical channels.

NCCL's switch algorithms (NVLS, NVLS-tree) cut a channel's share into one shard per local GPU,
and shard ``k`` is shard ``0`` with every node's GPUs renumbered ``g -> g + k``. Its rings on
identical nodes repeat from node to node: renumbering ``r -> r + ranks per node`` maps each
ring onto itself. Where such a renumbering maps the machine's resources onto resources of the
same capacity, all the images of a transfer run at the same times, so the simulator needs one
of them alone, each of its resources standing for its orbit under the rotation, counted with
the weight the other images add. Likewise for channels that repeat one another. Why this is
exact: docs/runtime-model.md, "Folded graphs".
"""

from __future__ import annotations

from collections import Counter
from typing import Callable, Hashable, Sequence

import numpy as np

__all__ = ["Spec", "rotate_spec", "rotate_nodes", "folded_members"]

#: Where a transfer's resources come from: a name and the ranks it depends on, e.g.
#: ``("up", a)`` (rank ``a``'s port to its switch) or ``("route", a, b)`` (the route a -> b).
Spec = tuple[Hashable, ...]


def rotate_spec(spec: Spec, steps: int, per_node: int, turned: int | None = None) -> Spec:
    """``spec`` with each rank ``v * per_node + g`` renumbered ``v * per_node + (g + steps) mod
    turned`` for ``g < turned`` (default ``per_node``: every node's GPUs turned by ``steps``);
    the other GPUs of a node keep their numbers.

    >>> rotate_spec(("route", 3, 5), 1, 4)
    ('route', 0, 6)
    >>> rotate_spec(("route", 1, 3), 1, 4, turned=2)  # GPUs 0 and 1 of a node turn, 2-3 stay
    ('route', 0, 3)
    """
    turned = per_node if turned is None else turned
    name, *ranks = spec
    return (name, *(r if r % per_node >= turned else
                    r - r % per_node + (r % per_node + steps) % turned for r in ranks))


def rotate_nodes(spec: Spec, steps: int, per_node: int, nodes: int) -> Spec:
    """``spec`` with each rank ``r`` renumbered ``(r + steps x per_node) mod (nodes x
    per_node)``: every node's GPUs moved ``steps`` nodes on.

    >>> rotate_nodes(("route", 7, 8), 1, 8, 3)
    ('route', 15, 16)
    >>> rotate_nodes(("route", 23, 0), 1, 8, 3)
    ('route', 7, 8)
    """
    name, *ranks = spec
    n = per_node * nodes
    return (name, *((r + steps * per_node) % n for r in ranks))


def folded_members(specs: Sequence[Sequence[Spec]], copies: Sequence[int],
                   resolve: Callable[[Spec], Sequence[int]], capacity: Sequence[float],
                   per_node: int, turned: int | None = None, *,
                   rotate: Callable[[Spec, int], Spec] | None = None
                   ) -> tuple[np.ndarray, np.ndarray] | None:
    """The memberships ``(transfer, resource)`` and their weights of a graph that holds shard 0
    of ``turned`` (default ``per_node``) rotated shards (:func:`rotate_spec`: the first
    ``turned`` GPUs of every node turn, the others stay), each transfer standing for
    ``copies[t]`` identical channels.

    ``rotate(spec, i)``: another rotation of order ``turned`` instead (:func:`rotate_nodes`:
    the graph holds node 0's transfers of ``turned`` nodes).

    ``specs[t]`` lists where transfer ``t``'s resources come from; ``resolve`` turns a spec into
    resource indices (the same number, in the same roles, for every rotation of it). Each
    resource is replaced by the least index of its orbit under the rotation, weighted
    ``copies x (turned / orbit size) x`` the transfer's resources in that orbit: the load the
    whole graph puts on any one resource of the orbit, per unit of the transfer's rate (a
    resource no rotation moves, as a GPU that is no head's port, is crossed by every shard).

    ``None`` when the rotation is not a symmetry of the resources the graph touches: a resource
    mapped to two different ones, two mapped to one, a capacity that changes along an orbit, or
    a spec whose rotations cross a different number of resources.
    """
    turned = per_node if turned is None else turned
    if rotate is None:
        def rotate(spec: Spec, steps: int) -> Spec:
            return rotate_spec(spec, steps, per_node, turned)
    image: dict[int, int] = {}
    seen: set[Spec] = set()
    for transfer in specs:
        for spec in transfer:
            if spec in seen:
                continue
            seen.add(spec)
            chain = [tuple(resolve(rotate(spec, i))) for i in range(turned + 1)]
            if any(len(c) != len(chain[0]) for c in chain):
                return None
            for here, there in zip(chain, chain[1:]):
                for r, s in zip(here, there):
                    if image.setdefault(r, s) != s or capacity[r] != capacity[s]:
                        return None
    if len(set(image.values())) != len(image):
        return None
    orbit: dict[int, tuple[int, int]] = {}   # resource -> (least index, orbit size)
    for r in image:
        if r in orbit:
            continue
        cycle = [r]
        x = image[r]
        while x != r:
            if x not in image or len(cycle) >= turned:
                return None
            cycle.append(x)
            x = image[x]
        for x in cycle:
            orbit[x] = (min(cycle), len(cycle))
    rows: list[tuple[int, int]] = []
    weights: list[float] = []
    for t, transfer in enumerate(specs):
        found = Counter(orbit[r] for spec in transfer for r in resolve(spec))
        for (least, size), count in sorted(found.items()):
            rows.append((t, least))
            weights.append(copies[t] * (turned // size) * count)
    return (np.array(rows, dtype=np.int64).reshape(-1, 2), np.array(weights, dtype=float))
