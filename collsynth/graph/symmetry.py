"""Rank permutations that preserve a topology: node shifts, candidate symmetries, automorphisms.

One home for symmetry detection: the tree engine's node shift, the candidate permutations the
bounds' linear program ties variables with, and the automorphisms of a (topology, collective)
pair that the SMT search tries first. Every symmetry is checked on the topology itself.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Iterator

import numpy as np
import scipy.sparse as sp
from scipy.sparse.csgraph import connected_components

from collsynth.collective.model import Collective
from collsynth.topology.model import Topology

__all__ = ["NodeShift", "node_shift", "candidate_permutations", "iter_candidate_permutations",
           "is_automorphism", "find_automorphism", "rank_orbits"]


@dataclass(frozen=True)
class NodeShift:
    """``K = nodes`` copies of ``ranks_per_node`` ranks; rank ``r`` of node ``k`` is
    ``k * ranks_per_node + r``.

    Shifting by ``k`` nodes maps node 0 to node ``k``. With ``nodes_per_leaf = P`` (a leaf-spine
    fabric, ``1 < P < K``) the nodes are ``(leaf, slot)`` pairs, ``node = leaf * P + slot``, and
    shifting by ``k = (a, b)`` moves every node ``a`` leaves and ``b`` slots on, both cyclically:
    the shift by one node alone would carry a node across a leaf boundary, which the leaves'
    groups do not allow. Shifting by ``-k`` undoes shifting by ``k``; the ``K`` shifts form a
    group that takes node 0 to every node exactly once.
    """

    nodes: int
    ranks_per_node: int
    nodes_per_leaf: int | None = None

    @property
    def num_ranks(self) -> int:
        return self.nodes * self.ranks_per_node

    def shift(self, ranks: np.ndarray, by_nodes: int | np.ndarray) -> np.ndarray:
        """``ranks`` moved ``by_nodes`` nodes forward (see the class docstring)."""
        per, leaf = self.ranks_per_node, self.nodes_per_leaf
        if leaf is None or leaf in (1, self.nodes):
            return (np.asarray(ranks) + np.asarray(by_nodes) * per) % self.num_ranks
        ranks, by_nodes = np.asarray(ranks), np.asarray(by_nodes)
        sign = np.where(by_nodes < 0, -1, 1)
        by_leaf, by_slot = np.divmod(np.abs(by_nodes) % self.nodes, leaf)
        node, local = np.divmod(ranks, per)
        at_leaf, at_slot = np.divmod(node, leaf)
        moved = ((at_leaf + sign * by_leaf) % (self.nodes // leaf)) * leaf \
            + (at_slot + sign * by_slot) % leaf
        return moved * per + local

    def permutation(self, by_nodes: int) -> np.ndarray:
        """The rank permutation of one shift: ``perm[r]`` is where rank ``r`` goes."""
        return self.shift(np.arange(self.num_ranks, dtype=np.int64), by_nodes)

    @property
    def generators(self) -> tuple[int, ...]:
        """Shifts whose combinations make every shift: one node (and one leaf with leaves)."""
        leaf = self.nodes_per_leaf
        return (1,) if leaf is None or leaf in (1, self.nodes) else (1, leaf)


def node_shift(topology: Topology) -> NodeShift | None:
    """The node shift ``rank -> rank + ranks_per_node (mod n)`` of ``topology`` if it is a
    symmetry, else ``None`` (also for one node). On a leaf-spine fabric, the shifts by one node
    within the leaves and by one leaf (:class:`NodeShift`).

    :func:`collsynth.topology.compose_nodes` builds identical nodes on a non-blocking network, so
    the shift maps links to links and groups to groups; the tree engine designs trees for node
    0's roots only and shifts them. It is checked on the links and groups, never assumed, except
    for a topology stored sparsely (:attr:`Topology.composition`), which is made of those rules.

    >>> from collsynth.topology import compose_nodes, get_topology
    >>> node_shift(compose_nodes(get_topology("ring:4"), 3, nic_units=1))
    NodeShift(nodes=3, ranks_per_node=4, nodes_per_leaf=None)
    >>> node_shift(get_topology("ring:4")) is None
    True
    >>> node_shift(compose_nodes(get_topology("ring:4"), 4, nic_units=1, fabric="leaf-spine",
    ...                          nodes_per_leaf=2, oversubscription=2))
    NodeShift(nodes=4, ranks_per_node=4, nodes_per_leaf=2)
    """
    layout = topology.layout
    if layout is None or not layout.multi_node:
        return None
    per_node, nodes = layout.ranks_per_node, layout.nodes
    candidate = NodeShift(nodes, per_node, layout.nodes_per_leaf
                          if layout.fabric == "leaf-spine" else None)
    composition = topology.composition
    if composition is not None and composition.nodes == nodes \
            and composition.ranks_per_node == per_node:
        # Stored sparsely, its links and groups are generated from one node and per-node,
        # per-leaf and per-NIC rules, so every node shift (within leaves) maps them to themselves.
        return NodeShift(nodes, per_node) if candidate.nodes_per_leaf in (1, nodes) else candidate
    links = topology.link_array
    keys = {_group_key(g.sources, g.destinations, g.limit) for g in topology.groups}
    for by in candidate.generators:
        perm = candidate.permutation(by)
        if by == 1 and candidate.generators == (1,):
            same = np.array_equal(np.roll(links, (per_node, per_node), axis=(0, 1)), links)
        else:
            inverse = np.argsort(perm)
            same = np.array_equal(links[np.ix_(inverse, inverse)], links)
        if not same:
            return None
        for group in topology.groups:
            moved = _group_key((int(perm[s]) for s in group.sources),
                               (int(perm[d]) for d in group.destinations), group.limit)
            if moved not in keys:
                return None
    if candidate.nodes_per_leaf in (1, nodes):
        candidate = NodeShift(nodes, per_node)
    return candidate


def _group_key(sources, destinations, limit) -> tuple:
    return frozenset(sources), frozenset(destinations), limit


def candidate_permutations(n: int) -> list[np.ndarray]:
    """Rank permutations worth testing as symmetries: rotations, reflections, the transpositions
    (0 i) and (i i+1), and, for a power of two, the bit flips. Cheap to test; together they
    generate the symmetries of rings, fully connected graphs, hubs and hypercube-like boxes."""
    return list(iter_candidate_permutations(n))


def iter_candidate_permutations(n: int) -> Iterator[np.ndarray]:
    """:func:`candidate_permutations` one at a time, in the same order (a caller that stops
    early never builds the ``2n`` permutations of ``n`` ranks: 268 MB at 4096 ranks)."""
    ident = np.arange(n, dtype=np.int64)

    def generated() -> Iterator[np.ndarray]:
        yield (ident + 1) % n
        yield (-ident) % n
        yield n - 1 - ident
        for p in range(2, min(n, 16) + 1):
            if n % p == 0:
                yield (ident + n // p) % n
        if n & (n - 1) == 0:
            for j in range(n.bit_length() - 1):
                yield ident ^ (1 << j)
        for a, b in [(0, i) for i in range(1, n)] + [(i, i + 1) for i in range(1, n - 1)]:
            swap = ident.copy()
            swap[a], swap[b] = b, a
            yield swap

    seen = {ident.tobytes()}
    for perm in generated():
        key = perm.tobytes()
        if key not in seen:
            seen.add(key)
            yield perm


# -- automorphisms of a (topology, collective) pair, for symmetric-first search -------------------


def is_automorphism(perm: tuple[int, ...], topology: Topology, collective: Collective) -> bool:
    """True when ``perm`` preserves the links, the groups and the collective."""
    n = topology.num_ranks
    links = topology.links
    for a in range(n):
        row, image_row = links[a], links[perm[a]]
        for b in range(n):
            if row[b] != image_row[perm[b]]:
                return False
    groups = {(g.sources, g.destinations, g.limit) for g in topology.groups}
    for g in topology.groups:
        image = (frozenset(perm[r] for r in g.sources), frozenset(perm[r] for r in g.destinations),
                 g.limit)
        if image not in groups:
            return False
    conditions = {(pre, post) for pre, post in zip(collective.precondition, collective.postcondition)}
    for pre, post in zip(collective.precondition, collective.postcondition):
        if (frozenset(perm[r] for r in pre), frozenset(perm[r] for r in post)) not in conditions:
            return False
    return True


def _order(perm: tuple[int, ...]) -> int:
    seen, order = set(), 1
    from math import lcm

    for start in range(len(perm)):
        if start in seen:
            continue
        length, r = 0, start
        while r not in seen:
            seen.add(r)
            r = perm[r]
            length += 1
        order = lcm(order, length)
    return order


def find_automorphism(topology: Topology, collective: Collective) -> tuple[int, ...] | None:
    """A non-trivial automorphism generating as large a cyclic group as found, or ``None``.

    Tries rotations ``r -> r + k mod n`` and reflections ``r -> r xor k`` (the symmetries of
    rings, switches, hypercubes and the DGX-1 cube-mesh); the largest group wins.
    """
    n = topology.num_ranks
    candidates = [tuple((r + k) % n for r in range(n)) for k in range(1, n)]
    candidates += [tuple(r ^ k for r in range(n)) for k in range(1, n)
                   if all((r ^ k) < n for r in range(n))]
    best, best_order = None, 1
    for perm in candidates:
        order = _order(perm)
        if order > best_order and is_automorphism(perm, topology, collective):
            best, best_order = perm, order
    return best


def rank_orbits(topology: Topology, weights: np.ndarray | None = None, *,
                groups: bool = False) -> np.ndarray:
    """An orbit label per rank under the candidate permutations that preserve every link (and
    ``weights``, one integer per rank, when given; and with ``groups`` every bandwidth group
    that can bind, mapped onto one with the same limit and links); ranks with one label are
    interchangeable.

    Only :func:`candidate_permutations` are tried, so two ranks may share an orbit yet get
    different labels (never the reverse): a caller that checks one rank per label stays exact.

    >>> from collsynth.topology import get_topology
    >>> rank_orbits(get_topology("ring:6")).tolist()
    [0, 0, 0, 0, 0, 0]
    """
    n = topology.num_ranks
    links = topology.link_array
    ident = np.arange(n)

    def preserves_links(perm: np.ndarray) -> bool:
        moved = np.flatnonzero(perm != ident)
        if len(moved) <= 2:
            # A transposition changes only the rows and columns of the ranks it moves: O(n)
            # (the (0 i) and (i i+1) candidates, 2n of them, each a full n x n test before).
            image = perm[moved]
            return bool(np.array_equal(links[np.ix_(image, perm)], links[moved])
                        and np.array_equal(links[np.ix_(perm, image)], links[:, moved]))
        return bool(np.array_equal(links[np.ix_(perm, perm)], links))

    group_links = [(g.limit, np.array(sorted(s * n + d for s, d in covered), dtype=np.int64))
                   for g, covered in topology.effective_groups] if groups else []
    group_keys = {(limit, k.tobytes()) for limit, k in group_links}

    def preserves_groups(perm: np.ndarray) -> bool:
        for limit, k in group_links:
            image = np.sort(perm[k // n] * n + perm[k % n])
            if (limit, image.tobytes()) not in group_keys:
                return False
        return True

    labels = np.arange(n, dtype=np.int64)   # the smallest rank of each rank's orbit
    orbits = n
    first: list[np.ndarray] = []
    if weights is not None:
        # One rotation of the ranks of each weight, the others fixed (a broadcast's root and
        # the rest): on a switch it joins every non-root rank at once, where the transpositions
        # of the candidates would each need a test of every link and group.
        for value in np.unique(weights):
            same = np.flatnonzero(weights == value)
            if 1 < len(same) < n:
                perm = ident.copy()
                perm[same] = np.roll(same, -1)
                first.append(perm)
    for perm in itertools.chain(first, iter_candidate_permutations(n)):
        if orbits == 1:
            break   # every rank in one orbit: no permutation can merge more
        if np.array_equal(labels[perm], labels):
            continue   # it maps every rank into its own orbit: nothing to merge, no test
        if weights is not None and not np.array_equal(weights[perm], weights):
            continue
        if not preserves_links(perm) or not preserves_groups(perm):
            continue
        # Join the orbit of every rank with its image's (components of label -> label arcs).
        joined = sp.coo_matrix((np.ones(n, dtype=np.int8), (labels, labels[perm])),
                               shape=(n, n))
        orbits_here, component = connected_components(joined, directed=False)
        smallest = np.full(orbits_here, n, dtype=np.int64)
        np.minimum.at(smallest, component[labels], ident)
        labels = smallest[component[labels]]
        orbits = len(np.unique(labels))
    return labels
