"""Automorphisms of a (topology, collective) pair, for symmetric-first search.

An automorphism is a rank permutation ``pi`` with ``links[pi(a)][pi(b)] == links[a][b]`` for every
pair, that maps every bandwidth group onto a bandwidth group with the same limit and every chunk
onto a chunk (same pre/postcondition images). Schedules invariant under ``pi`` are a small,
often easy, subset of all schedules.
"""

from __future__ import annotations

from collsynth.collective.model import Collective
from collsynth.topology.model import Topology

__all__ = ["is_automorphism", "find_automorphism"]


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
