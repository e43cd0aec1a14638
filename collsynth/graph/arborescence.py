"""Minimum-cost spanning arborescences on dense cost matrices (Chu-Liu/Edmonds, in numpy).

The tree engine prices candidate trees with this: given a cost per link, the cheapest tree that
carries a chunk from its root to every rank. Costs are a dense ``n x n`` matrix ``cost[src][dst]``
(``inf`` where there is no link), so one contraction level is a few vectorised passes over the
matrix: about ``O(n**2)`` per level, a few milliseconds for 1024 ranks.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from collsynth.errors import InvalidInstanceError, UnimplementableError

__all__ = ["min_arborescence", "min_arborescence_cost", "tree_cost", "depths"]


def min_arborescence(cost: np.ndarray, root: int) -> np.ndarray:
    """The parent of every vertex in a minimum-cost spanning arborescence rooted at ``root``.

    Parameters
    ----------
    cost:
        ``cost[u][v]`` is the cost of arc ``u -> v`` (``numpy.inf``: no arc); the diagonal and the
        arcs into ``root`` are ignored. Not modified.
    root:
        The root vertex.

    Returns
    -------
    numpy.ndarray
        ``parent[v]`` for every vertex ``v``; ``parent[root] == -1``.

    Raises
    ------
    UnimplementableError
        When some vertex cannot be reached from ``root`` (its ``rank``; ``chunk`` is the root).

    Examples
    --------
    Going around the 3-cycle ``0 -> 1 -> 2`` (cost 2) beats two direct arcs from 0 (cost 5):

    >>> inf = np.inf
    >>> cost = np.array([[inf, 1, 4], [inf, inf, 1], [inf, 3, inf]])
    >>> min_arborescence(cost, 0).tolist()
    [-1, 0, 1]
    """
    cost = np.array(cost, dtype=np.float64)
    n = len(cost)
    if not 0 <= root < n:
        raise InvalidInstanceError(f"root {root} is not a vertex 0..{n - 1}")
    return _solve(cost, root)


def _solve(cost: np.ndarray, root: int) -> np.ndarray:
    n = len(cost)
    cost[np.arange(n), np.arange(n)] = np.inf
    cost[:, root] = np.inf
    parent = np.argmin(cost, axis=0)
    weight = cost[parent, np.arange(n)]
    parent[root] = -1
    weight[root] = 0.0
    if np.isinf(weight).any():
        missing = int(np.flatnonzero(np.isinf(weight))[0])
        raise UnimplementableError(f"vertex {missing} cannot be reached from the root {root}",
                                   rank=missing, chunk=root)
    cycles = _cycles(parent, root)
    if not cycles:
        return parent

    # Contract every cycle into one vertex; arcs into a cycle vertex v cost cost[u, v] - weight[v].
    in_cycle = np.full(n, -1, dtype=np.int64)
    for index, members in enumerate(cycles):
        in_cycle[members] = index
    singles = np.flatnonzero(in_cycle < 0)
    m = len(singles) + len(cycles)
    new_of = np.empty(n, dtype=np.int64)
    new_of[singles] = np.arange(len(singles))
    cycle_ids = len(singles) + np.arange(len(cycles))
    for index, members in enumerate(cycles):
        new_of[members] = cycle_ids[index]

    adjusted = cost.copy()
    cyclic = np.flatnonzero(in_cycle >= 0)
    adjusted[:, cyclic] -= weight[cyclic][None, :]
    # Columns: the best vertex of each new column for every original row.
    col_val = np.empty((n, m))
    col_arg = np.empty((n, m), dtype=np.int64)
    col_val[:, :len(singles)] = adjusted[:, singles]
    col_arg[:, :len(singles)] = singles[None, :]
    rows = np.arange(n)
    for index, members in enumerate(cycles):
        block = adjusted[:, members]
        best = np.argmin(block, axis=1)
        col_val[:, cycle_ids[index]] = block[rows, best]
        col_arg[:, cycle_ids[index]] = members[best]
    # Rows: the best original row of each new row.
    new_cost = np.empty((m, m))
    row_arg = np.empty((m, m), dtype=np.int64)
    new_cost[:len(singles)] = col_val[singles]
    row_arg[:len(singles)] = singles[:, None]
    cols = np.arange(m)
    for index, members in enumerate(cycles):
        block = col_val[members]
        best = np.argmin(block, axis=0)
        new_cost[cycle_ids[index]] = block[best, cols]
        row_arg[cycle_ids[index]] = members[best]
    new_parent = _solve(new_cost, int(new_of[root]))

    result = parent.copy()
    for b in range(m):
        a = new_parent[b]
        if a < 0:
            continue
        u = row_arg[a, b]
        v = col_arg[u, b]
        result[v] = u
    return result


def _cycles(parent: np.ndarray, root: int) -> list[np.ndarray]:
    """The cycles of the functional graph ``v -> parent[v]`` (the root points nowhere)."""
    n = len(parent)
    state = np.zeros(n, dtype=np.int8)  # 0 new, 1 on the current walk, 2 finished
    state[root] = 2
    cycles = []
    for start in range(n):
        if state[start]:
            continue
        walk = []
        v = start
        while state[v] == 0:
            state[v] = 1
            walk.append(v)
            v = parent[v]
        if state[v] == 1:  # closed a cycle: v is on the current walk
            cycles.append(np.asarray(walk[walk.index(v):], dtype=np.int64))
        for u in walk:
            state[u] = 2
    return cycles


def tree_cost(cost: np.ndarray, parent: np.ndarray) -> float:
    """Sum of ``cost[parent[v], v]`` over the tree's arcs."""
    children = np.flatnonzero(parent >= 0)
    return float(cost[parent[children], children].sum())


def depths(parent: np.ndarray) -> np.ndarray:
    """Depth of every vertex (the root has depth 0; ``parent`` must be a tree)."""
    n = len(parent)
    depth = np.full(n, -1, dtype=np.int64)
    depth[parent < 0] = 0
    # Repeated pointer jumping would be faster on deep trees; trees here are shallow.
    while (depth < 0).any():
        unknown = np.flatnonzero(depth < 0)
        known_parent = depth[parent[unknown]] >= 0
        if not known_parent.any():
            raise InvalidInstanceError("parent array is not a tree")
        ready = unknown[known_parent]
        depth[ready] = depth[parent[ready]] + 1
    return depth


def min_arborescence_cost(n: int, root: int, arcs: Sequence[tuple[int, int, int]]) -> int | None:
    """Chu-Liu/Edmonds on an arc list: the least total integer cost of an arborescence rooted
    at ``root`` that spans all ``n`` nodes, or ``None`` if some node cannot be reached.

    Exact in integers of any size (the bounds' certificates need that), where
    :func:`min_arborescence` works on a dense float matrix and returns the tree.

    >>> min_arborescence_cost(3, 0, [(0, 1, 1), (0, 2, 4), (1, 2, 1), (2, 1, 3)])
    2
    """
    total = 0
    while True:
        arcs = [(u, v, c) for u, v, c in arcs if u != v and v != root]
        cheapest: list[int | None] = [None] * n
        parent = [-1] * n
        for u, v, c in arcs:
            if cheapest[v] is None or c < cheapest[v]:
                cheapest[v], parent[v] = c, u
        if any(cheapest[v] is None for v in range(n) if v != root):
            return None
        total += sum(c for c in cheapest if c is not None)
        component = [-1] * n
        mark = [-1] * n
        count = 0
        for v in range(n):
            x = v
            while x != root and mark[x] != v and component[x] == -1:
                mark[x] = v
                x = parent[x]
            if x != root and component[x] == -1:  # the walk from v closed a cycle through x
                component[x] = count
                y = parent[x]
                while y != x:
                    component[y] = count
                    y = parent[y]
                count += 1
        if count == 0:
            return total
        for v in range(n):
            if component[v] == -1:
                component[v] = count
                count += 1
        arcs = [(component[u], component[v], c - cheapest[v]) for u, v, c in arcs  # type: ignore[operator]
                if component[u] != component[v]]
        root, n = component[root], count
