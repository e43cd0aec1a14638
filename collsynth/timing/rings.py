"""The rings the runtime would find on a topology: NCCL's channels, packed into its links.

Each channel of NCCL's ring algorithm is a directed Hamiltonian ring; :func:`ring_channels`
packs as many as the topology's link units and bandwidth groups hold, the way NCCL's own search
does (docs/timing.md, "NCCL's cost model").
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:  # pragma: no cover - imported for annotations only
    from collsynth.topology.model import Topology

__all__ = ["ring_channels"]


def ring_channels(topology: "Topology", *, max_channels: int = 64, budget: int = 200_000
                  ) -> tuple[tuple[int, ...], ...]:
    """Directed Hamiltonian rings packed into the topology's link units and group limits.

    Greedy, as NCCL's own search: find a ring through every rank using links with a unit left,
    take one unit from each of its links and from every bandwidth group each of its links is in,
    and repeat until no ring is left, ``max_channels`` rings are found, or ``budget`` search
    nodes were expanded. Returns ``()`` when there is no ring (a star).

    * One node: depth-first from rank 0, preferring the links with the most units left; a few
      packings with different tie-breaks are tried and the largest kept (it stops early when it
      reaches an upper bound: the fewest units out of or into a rank, or a rank's group limit).
    * A composed topology (``metadata["network"]``,
      :func:`~collsynth.topology.compose.compose_nodes`): as NCCL builds inter-node rings,
      each ring crosses every node once: it enters node ``k`` at local rank ``e``, runs a
      Hamiltonian path inside the node to local rank ``x``, and leaves through ``x``'s NIC to
      local rank ``e`` of node ``k + 1`` (the same path in every node).

    >>> from collsynth.topology.families import ring, fully_connected
    >>> ring_channels(ring(4))
    ((0, 1, 2, 3), (0, 3, 2, 1))
    >>> len(ring_channels(fully_connected(5)))
    4
    """
    n = topology.num_ranks
    if n < 2:
        return ()
    layout = topology.layout
    if layout is not None and layout.multi_node:
        per_node = layout.ranks_per_node
        return _composed_rings(topology, per_node, n // per_node, max_channels, budget)
    bound = _ring_bound(topology, max_channels)
    best: tuple[tuple[int, ...], ...] = ()
    spent = 0
    for attempt in range(_ATTEMPTS):
        rings, used = _greedy_rings(topology, attempt, max_channels, budget - spent)
        spent += used
        if len(rings) > len(best):
            best = rings
        if len(best) >= bound or spent >= budget:
            break
    return best


#: Greedy packings tried by :func:`ring_channels` (tie-breaks differ) before keeping the best.
_ATTEMPTS = 12


class _Residual:
    """Units left on every link and in every bandwidth group, and a search budget.

    Built lazily, link by link, as the search reaches them: a composed machine of thousands of
    ranks has millions of links and NIC groups that cover millions of them (4096 ranks: 6 GB as
    dense tables), of which a ring search touches a few per node. A group whose limit can never
    bind (at least the units of the links it covers) is tracked like the others: using at most
    each link's units, it never runs out."""

    def __init__(self, topology: "Topology", budget: int) -> None:
        # A matrix's rows, or a composed machine's links one at a time (no matrix built).
        links = topology.links
        composed = getattr(links, "composition", None) is not None
        self._rows = None if composed else links
        self._bandwidth = links.link if composed else topology.bandwidth
        # units left on each link read so far (its units until the search takes some)
        self._left: dict[tuple[int, int], int] = {}
        self._groups = tuple(topology.groups)  # (a sparse form read as its tuple once)
        self.group_left = [g.limit for g in self._groups]
        # each group indexed by its smaller side (a NIC's egress group by its node's ranks, its
        # ingress group by the same ranks as destinations), so a link's groups are found among
        # the few groups of its source or of its destination
        self._by_source: dict[int, list[int]] = {}
        self._by_destination: dict[int, list[int]] = {}
        for index, group in enumerate(self._groups):
            if len(group.sources) <= len(group.destinations):
                for rank in group.sources:
                    self._by_source.setdefault(rank, []).append(index)
            else:
                for rank in group.destinations:
                    self._by_destination.setdefault(rank, []).append(index)
        self._member: dict[tuple[int, int], tuple[int, ...]] = {}
        self.budget = budget
        self.expansions = 0

    def units(self, u: int, v: int) -> int:
        """Units left on link ``u -> v``."""
        found = self._left.get((u, v))
        if found is None:
            rows = self._rows
            found = self._left[(u, v)] = rows[u][v] if rows is not None \
                else self._bandwidth(u, v)
        return found

    def member(self, u: int, v: int) -> tuple[int, ...]:
        """The groups link ``u -> v`` is in (none for a missing link)."""
        found = self._member.get((u, v))
        if found is None:
            found = () if not self._bandwidth(u, v) else tuple(
                [g for g in self._by_source.get(u, ()) if v in self._groups[g].destinations]
                + [g for g in self._by_destination.get(v, ()) if u in self._groups[g].sources])
            self._member[(u, v)] = found
        return found

    def usable(self, u: int, v: int) -> bool:
        if self.units(u, v) <= 0:
            return False
        groups = self._member.get((u, v))
        if groups is None:
            groups = self.member(u, v)
        left = self.group_left
        for g in groups:  # (a loop: called millions of times on a large machine)
            if left[g] <= 0:
                return False
        return True

    def take(self, links: Sequence[tuple[int, int]], amount: int = 1) -> bool:
        """Take ``amount`` units on every link (all or nothing); False if one runs out."""
        for u, v in links:
            self._left[(u, v)] = self.units(u, v) - amount
            for g in self.member(u, v):
                self.group_left[g] -= amount
        if amount > 0 and (any(self.units(u, v) < 0 for u, v in links) or any(
                self.group_left[g] < 0 for u, v in links for g in self.member(u, v))):
            self.take(links, -amount)
            return False
        return True

    def spend(self) -> bool:
        self.expansions += 1
        return self.expansions <= self.budget


def _ring_bound(topology: "Topology", max_channels: int) -> int:
    """No more rings than units out of or into any rank, nor than any group's limit."""
    n = topology.num_ranks
    links = topology.link_array
    bound = min(int(links.sum(axis=1).min()), int(links.sum(axis=0).min()), max_channels)
    everyone = frozenset(range(n))
    for group in topology.binding_groups:
        # Every ring leaves the sources for the rest (or enters the destinations from the rest)
        # at least once: if the group covers all those links, each ring uses one of its units.
        if (group.destinations >= everyone - group.sources
                or group.sources >= everyone - group.destinations):
            bound = min(bound, group.limit)
    return bound


def _greedy_rings(topology: "Topology", attempt: int, max_channels: int, budget: int
                  ) -> tuple[tuple[tuple[int, ...], ...], int]:
    """One greedy packing; ``attempt`` picks the tie-break among links with equal units left."""
    import random

    n = topology.num_ranks
    left = _Residual(topology, budget)
    shuffle = random.Random(attempt)
    tiebreak = [[shuffle.random() if attempt else ((v - u) % n) for v in range(n)]
                for u in range(n)]

    def search(path: list[int], seen: list[bool]) -> bool:
        if not left.spend():
            return False
        u = path[-1]
        if len(path) == n:
            return left.usable(u, path[0])
        candidates = [v for v in range(n) if not seen[v] and left.usable(u, v)]
        candidates.sort(key=lambda v: (-left.units(u, v), tiebreak[u][v]))
        for v in candidates:
            left.take([(u, v)])
            seen[v] = True
            path.append(v)
            if search(path, seen):
                return True
            path.pop()
            seen[v] = False
            left.take([(u, v)], -1)
        return False

    rings: list[tuple[int, ...]] = []
    while len(rings) < max_channels and left.expansions <= budget:
        path, seen = [0], [True] + [False] * (n - 1)
        if not search(path, seen):
            break
        left.take([(path[-1], path[0])])
        rings.append(tuple(path))
    return tuple(rings), left.expansions


def _composed_rings(topology: "Topology", per_node: int, nodes: int, max_channels: int,
                    budget: int, *, alike: bool | None = None) -> tuple[tuple[int, ...], ...]:
    """Rings that cross every node once, the same local path in every node (see ring_channels).

    ``alike`` (default: whether :func:`~collsynth.topology.compose.compose_nodes` made the
    topology): every node has the same links and groups inside it, so node 0's units left
    inside it stand for every node's (each local path takes the same links in all of them, and
    a path between nodes takes none inside one); the search then tracks node 0 alone inside the
    nodes (7344 GPUs: 102 times fewer checks), and the links between nodes in full."""
    left = _Residual(topology, budget)
    p = per_node
    if alike is None:
        alike = getattr(topology.links, "composition", None) is not None
    tracked = range(1) if alike else range(nodes)

    def local_path(path: list[int], seen: list[bool], exit_rank: int) -> bool:
        if not left.spend():
            return False
        u = path[-1]
        if len(path) == p:
            return u == exit_rank
        candidates = [v for v in range(p) if not seen[v] and (v != exit_rank or len(path) == p - 1)
                      and all(left.usable(k * p + u, k * p + v) for k in tracked)]
        candidates.sort(key=lambda v: (-left.units(u, v), (v - u) % p))
        for v in candidates:
            links = [(k * p + u, k * p + v) for k in tracked]
            if not left.take(links):
                continue
            seen[v] = True
            path.append(v)
            if local_path(path, seen, exit_rank):
                return True
            path.pop()
            seen[v] = False
            left.take(links, -1)
        return False

    rings: list[tuple[int, ...]] = []
    while len(rings) < max_channels and left.expansions <= budget:
        found = None
        pairs = [(e, x) for e in range(p) for x in range(p) if e != x or p == 1]
        for e, x in pairs:
            cross = [(k * p + x, ((k + 1) % nodes) * p + e) for k in range(nodes)]
            if not all(left.usable(u, v) for u, v in cross) or not left.take(cross):
                continue
            path, seen = [e], [False] * p
            seen[e] = True
            if local_path(path, seen, x):
                found = path
                break
            left.take(cross, -1)
            if left.expansions > budget:
                break
        if found is None:
            break
        rings.append(tuple(k * p + r for k in range(nodes) for r in found))
    return tuple(rings)
