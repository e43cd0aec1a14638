"""Packing spanning trees per root: a linear program over trees, then integer multiplicities.

The details: ``docs/large-systems.md``, section "Packing trees".
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Callable

import numpy as np
import scipy.sparse as sp
from scipy.optimize import Bounds as LpBounds
from scipy.optimize import LinearConstraint, linprog, milp
from scipy.sparse.csgraph import breadth_first_order, shortest_path

from collsynth import interrupts
from collsynth.errors import SolverError
from collsynth.graph.arborescence import depths, min_arborescence
from collsynth.graph.symmetry import NodeShift, node_shift
from collsynth.graph.translations import GridTranslations, grid_translations, point_symmetries
from collsynth.limits import TimeLimitReached
from collsynth.synthesis.hierarchical import network_layout
from collsynth.topology.model import Topology

__all__ = ["TreePacking", "PackingOptions", "pack_trees", "RowClasses", "row_classes"]

_log = logging.getLogger(__name__)

#: Seconds the integer multiplicity search may spend once it has one answer.
_INTEGER_SECONDS = 15.0
#: Trees of the program (the heaviest) whose images under a grid's point symmetries are added.
_MOST_IMAGED_TREES = 16
#: Pieces per root, in multiples of the optimum's denominator, tried before the program's own
#: weights when those need more.
_FEW = 4


@dataclass(frozen=True)
class PackingOptions:
    """Knobs of :func:`pack_trees` (keyword-only).

    ``time_limit`` bounds the column generation (the best packing so far is kept);
    ``max_trees_per_root`` bounds ``k``, the pieces per root per pipeline stage (default: as
    many as keep one stage within about four million sends, between 16 and 4096).
    """

    time_limit: float = 300.0
    max_iterations: int = 500
    max_trees_per_root: int | None = None
    progress: Callable[[str], None] | None = None
    #: A symmetry to use instead of the one found (the caller has checked it on the topology).
    symmetry: NodeShift | None = None


@dataclass(frozen=True)
class TreePacking:
    """Trees per root with integer multiplicities.

    ``trees[r]`` lists ``(parent, multiplicity)`` for each representative root ``r`` (``parent``
    as returned by :func:`~.arborescence.min_arborescence`); multiplicities sum to
    ``pieces_per_root``. A stage takes ``rounds_per_stage`` rounds, so the steady state costs
    ``rounds_per_stage / pieces_per_root`` rounds per chunk of each root. ``shift`` (or ``None``)
    moves the trees of node 0's roots to the other nodes. ``stats["stopped_by"]`` says what
    ended the column generation before its program was solved (``"time_limit"``,
    ``"interrupt"``, ``"iteration_limit"``), ``None`` when nothing did.
    """

    trees: dict[int, list[tuple[np.ndarray, int]]]
    pieces_per_root: int
    rounds_per_stage: int
    shift: NodeShift | None
    lp_rounds_per_chunk: float
    iterations: int
    stats: dict = field(default_factory=dict)

    @property
    def steady_state_rounds_per_chunk(self) -> Fraction:
        return Fraction(self.rounds_per_stage, self.pieces_per_root)

    @property
    def depth(self) -> int:
        return max(int(depths(parent).max()) for trees in self.trees.values() for parent, _ in trees)


@dataclass(frozen=True)
class RowClasses:
    """The capacity rows of the tree program.

    ``incidence`` (rows x ``n*n`` flat links ``src * n + dst``, CSC) says how much of each row's
    capacity one use of a link takes, already summed over the symmetry's images; ``capacity`` is
    each row's bandwidth or limit; ``names`` describe the rows.
    """

    incidence: sp.csc_matrix
    capacity: np.ndarray
    names: tuple[str, ...]


def row_classes(topology: Topology, links: np.ndarray, shift: NodeShift | None, *,
                deadline: float | None = None) -> RowClasses:
    """The link and group rows of the program (see docs/large-systems.md); past ``deadline``
    (``time.perf_counter``) :class:`~collsynth.limits.TimeLimitReached`."""
    n = topology.num_ranks
    group_rows, group_cols, group_mult, group_caps, group_names = [], [], [], [], []
    min_limit = np.full(n * n, np.iinfo(np.int64).max, dtype=np.int64)
    canonical: dict[tuple, int] = {}
    orbit_sizes: list[int] = []
    pending = []
    for index, group in enumerate(topology.groups):
        if index % 64 == 0:
            _check_deadline(deadline, "reading the bandwidth groups")
        sources = np.fromiter(sorted(group.sources), np.int64)
        targets = np.fromiter(sorted(group.destinations), np.int64)
        flat = (sources[:, None] * n + targets[None, :]).ravel()
        flat = flat[links.ravel()[flat] > 0]
        if len(flat) == 0:
            continue
        np.minimum.at(min_limit, flat, group.limit)
        if int(links.ravel()[flat].sum()) <= group.limit:
            continue  # can never bind
        if shift is None:
            key = (index,)
        else:
            # Move the group's narrow side (a rank, a NIC) into node 0.
            side = sources if len(sources) <= len(targets) else targets
            back = int(side.min()) // shift.ranks_per_node
            key = (frozenset(shift.shift(sources, -back).tolist()),
                   frozenset(shift.shift(targets, -back).tolist()), group.limit)
        row = canonical.get(key)
        if row is None:
            row = canonical[key] = len(orbit_sizes)
            orbit_sizes.append(0)
            group_caps.append(group.limit)
            group_names.append(group.name or f"group {index}")
        orbit_sizes[row] += 1
        pending.append((row, flat))
    for row, flat in pending:
        group_rows.append(np.full(len(flat), row, np.int64))
        group_cols.append(flat)
    num_group_rows = len(orbit_sizes)
    copies = 1 if shift is None else shift.nodes
    mult = [copies / size for size in orbit_sizes]
    for row, flat in pending:
        group_mult.append(np.full(len(flat), mult[row]))

    # Links no group at least as narrow covers.
    flat_links = np.flatnonzero(links.ravel())
    binding = flat_links[links.ravel()[flat_links] < min_limit[flat_links]]
    src, dst = binding // n, binding % n
    if shift is None:
        link_class = binding
    else:
        node = src // shift.ranks_per_node
        link_class = (src % shift.ranks_per_node) * n + shift.shift(dst, -node)
    classes, link_row = np.unique(link_class, return_inverse=True)
    link_caps = links.ravel()[classes]
    rows = np.concatenate(group_rows + [num_group_rows + link_row]) if (group_rows or len(binding)) \
        else np.zeros(0, np.int64)
    cols = np.concatenate(group_cols + [binding]) if (group_cols or len(binding)) \
        else np.zeros(0, np.int64)
    data = np.concatenate(group_mult + [np.ones(len(binding))]) if (group_mult or len(binding)) \
        else np.zeros(0)
    total_rows = num_group_rows + len(classes)
    incidence = sp.csc_matrix((data, (rows, cols)), shape=(total_rows, n * n))
    names = tuple(group_names) + tuple(f"link {c // n}->{c % n}" for c in classes)
    capacity = np.concatenate([np.asarray(group_caps, np.float64), link_caps.astype(np.float64)])
    return RowClasses(incidence, capacity, names)


def _check_deadline(deadline: float | None, doing: str) -> None:
    """Before any packing exists there is nothing to return: past ``deadline`` the search
    stops with :class:`~collsynth.limits.TimeLimitReached` (the CLI's exit 4)."""
    if deadline is not None and time.perf_counter() > deadline:
        raise TimeLimitReached(f"time limit reached while {doing}, before any tree packing "
                               "was found")


def _tree_column(rows: RowClasses, parent: np.ndarray, n: int) -> np.ndarray:
    children = np.flatnonzero(parent >= 0)
    flat = parent[children] * n + children
    return np.asarray(rows.incidence[:, flat].sum(axis=1)).ravel()


def pack_trees(topology: Topology, roots: list[int], *, target: Fraction | None = None,
               options: PackingOptions | None = None) -> TreePacking:
    """Trees for every root in ``roots`` (each root's chunk must reach every rank).

    With a node shift symmetry and ``roots`` = every rank, only node 0's roots are solved.
    ``target`` (the cut bound of :mod:`.throughput`) stops the column generation as soon as the
    program reaches it.

    Raises
    ------
    SolverError
        When HiGHS fails.
    """
    options = options or PackingOptions()
    started = time.perf_counter()
    n = topology.num_ranks
    links = topology.link_array
    shift = None
    if len(roots) == n:
        shift = options.symmetry or node_shift(topology) or grid_translations(topology)
    reps = list(range(shift.ranks_per_node)) if shift is not None else list(roots)
    deadline = started + options.time_limit
    _check_deadline(deadline, "finding the symmetries")
    rows = row_classes(topology, links, shift, deadline=deadline)
    _check_deadline(deadline, "building the rows of the program")
    finite = links > 0
    hops = shortest_path(sp.csr_matrix(finite.astype(np.int8)), unweighted=True, indices=reps)
    _check_deadline(deadline, "counting hops")

    columns: list[np.ndarray] = []
    owners: list[int] = []
    parents: list[np.ndarray] = []
    seen: set[bytes] = set()

    def add(root_index: int, parent: np.ndarray) -> bool:
        children = np.flatnonzero(parent >= 0)
        if (links[parent[children], children] == 0).any():
            raise SolverError(f"internal error: a tree for root {reps[root_index]} uses a link "
                              f"{topology.name!r} does not have")
        key = root_index.to_bytes(4, "little") + parent.astype(np.int32).tobytes()
        if key in seen:
            return False
        seen.add(key)
        columns.append(_tree_column(rows, parent, n))
        owners.append(root_index)
        parents.append(parent)
        return True

    if isinstance(shift, GridTranslations) and topology.layout is not None:
        nodes = topology.layout.nodes
        for parent in _entry_trees(topology, [nodes - 1]):  # across the network once per node
            add(0, parent)
    elif shift is not None and topology.layout is not None:
        for i, parent in _hierarchical_trees(topology, shift, options):
            add(i, parent)
    elif len(roots) == 1 and (nodes := node_shift(topology)) is not None:
        for parent in _chain_trees(topology, nodes, roots[0]):
            add(0, parent)
    graph = sp.csr_matrix(finite.astype(np.int8))
    for i, root in enumerate(reps):
        _check_deadline(deadline, "building the first trees")
        _, predecessors = breadth_first_order(graph, root, directed=True, return_predecessors=True)
        parent = predecessors.astype(np.int64)
        parent[root] = -1
        if (parent < 0).sum() != 1:
            raise SolverError(f"rank {int(np.flatnonzero(parent < 0)[1])} cannot be reached from "
                              f"root {root}")
        add(i, parent)

    value, weights, iterations = float("inf"), None, 0
    goal = None if target is None else float(target) + 1e-9
    # Dual stabilisation (Wentges smoothing): price with a mix of the best duals so far (the
    # centre, whose Lagrangian bound is highest) and the current ones; degenerate programs
    # otherwise add trees for hundreds of iterations without moving R.
    centre, best_bound, smoothing = None, -np.inf, 0.5
    stopped = None   # what ended the column generation before the program was solved
    while True:
        iterations += 1
        if weights is None:
            _check_deadline(deadline, "solving the first master program")
        try:
            value, weights, y, u = _solve_master(rows, columns, owners, len(reps))
        except KeyboardInterrupt:
            if weights is None:
                raise  # nothing solved yet: nothing to keep
            interrupts.take()
            _interrupted(options, iterations, value)
            stopped = "interrupt"
            break
        if options.progress is not None:
            options.progress(f"iteration {iterations}: {len(columns)} trees, "
                             f"rounds per chunk {value:.6f} (lower bound {best_bound:.6f})")
        if goal is not None and value <= goal:
            break
        if best_bound >= value - 1e-9 * max(1.0, value):
            break  # the program is solved: no tree can lower R
        if iterations >= options.max_iterations or \
                time.perf_counter() - started > options.time_limit:
            _log.info("column generation stopped after %d iterations at %.6f", iterations, value)
            stopped = "iteration_limit" if iterations >= options.max_iterations else "time_limit"
            break
        trial = y if centre is None else smoothing * centre + (1 - smoothing) * y
        prices = np.asarray(rows.incidence.T @ y).ravel().reshape(n, n)
        trial_prices = np.asarray(rows.incidence.T @ trial).ravel().reshape(n, n)
        scale = max(float(trial.max()), 1e-12)
        try:
            interrupts.raise_if_pending()  # one Python dropped in a callback (collsynth.interrupts)
            added, bound = _price_trees(reps, hops, scale, trial_prices, prices, finite, u, add)
        except KeyboardInterrupt:
            interrupts.take()
            _interrupted(options, iterations, value)
            stopped = "interrupt"
            break
        if bound > best_bound:
            best_bound, centre = bound, trial
        if not added:
            if centre is not None and smoothing > 0:
                smoothing = 0.0  # mispriced: the next round prices with the current duals
                continue
            break
        smoothing = 0.5
    lp_time = time.perf_counter() - started
    max_k = options.max_trees_per_root or min(4096, max(16, (1 << 22) // (len(roots) * n)))

    if isinstance(shift, GridTranslations):
        # Images of the trees used under the symmetries fixing the root: together they spread
        # the load evenly over the link classes, which lets a few pieces per root be optimal.
        used = np.flatnonzero(weights > 1e-12)
        used = used[np.argsort(-weights[used], kind="stable")][:_MOST_IMAGED_TREES]
        for perm in point_symmetries(topology, shift)[1:]:
            for j in used:
                add(owners[j], _moved_tree(parents[j], perm))
        if topology.layout is not None:
            # Trees crossing the network about as often as the program's mix does, so that
            # whole numbers of them can match its average (see _entry_trees).
            crossing = [_network_arcs(parents[j], topology.layout.ranks_per_node) for j in used]
            mean = float(np.dot(weights[used], crossing) / max(weights[used].sum(), 1e-12))
            reach = topology.layout.nodes - 1
            window = range(max(0, int(mean) - reach), int(mean) + reach + 2)
            for parent in _entry_trees(topology, window):
                add(0, parent)
        weights = np.concatenate([weights, np.zeros(len(columns) - len(weights))])
        # every tree, the program's unused ones included: with one root and a few rows the
        # integer program stays small, and the starting trees' mixes are what make it exact
        keep = np.arange(len(columns))
    else:
        keep = np.flatnonzero(weights > 1e-12)
    trees, k, rho = _integer_multiplicities(rows, [columns[j] for j in keep],
                                            [owners[j] for j in keep], len(reps), value,
                                            target, max_k, weights[keep])
    packing = {reps[i]: [] for i in range(len(reps))}
    for j, m in zip(keep, trees):
        if m:
            packing[reps[owners[j]]].append((parents[j], int(m)))
    return TreePacking(packing, int(k), int(rho), shift, value, iterations,
                       {"lp_seconds": lp_time, "trees_generated": len(columns),
                        "rows": len(rows.capacity), "stopped_by": stopped,
                        "seconds": time.perf_counter() - started})


def _network_arcs(parent: np.ndarray, per: int) -> int:
    """Arcs of a tree between ranks of different nodes (``per`` ranks per node)."""
    children = np.flatnonzero(parent >= 0)
    return int((parent[children] // per != children // per).sum())


def _moved_tree(parent: np.ndarray, perm: np.ndarray) -> np.ndarray:
    """The tree ``parent`` with every rank ``r`` moved to ``perm[r]``."""
    moved = np.full(len(parent), -1, dtype=np.int64)
    children = np.flatnonzero(parent >= 0)
    moved[perm[children]] = perm[parent[children]]
    return moved


def _hierarchical_trees(topology: Topology, shift: NodeShift, options: PackingOptions):
    """Starting trees on ``K`` nodes: the root's chunk crosses the network once per node, to the
    rank at the root's place there, and each node spreads it along the node's own best trees
    (packed for the node alone). Optimal whenever the NICs are the bottleneck. Under leaf
    switches, also trees that cross into each other leaf once (to the node at the root's slot
    there, which passes it on to the rest of its leaf): the leaves' uplinks then carry the
    fewest copies."""
    per, nodes = shift.ranks_per_node, shift.nodes
    node = network_layout(topology).node
    if per == 1:
        local = {0: [(np.array([-1]), 1)]}
    else:
        try:
            local = pack_trees(node, list(range(per)), options=options).trees
        except SolverError:  # a node whose ranks only meet through the network: no local trees
            return
    offsets = np.arange(nodes)[:, None] * per
    # Which node each node hears the root's chunk from (node 0 holds the root).
    feeders = [np.zeros(nodes, dtype=np.int64)]
    leaf = shift.nodes_per_leaf
    if leaf is not None and leaf not in (1, nodes):
        at_leaf, at_slot = np.divmod(np.arange(nodes), leaf)
        feeders.append(np.where(at_leaf == 0, 0, at_leaf * leaf))  # slot 0 of each leaf
        feeders[-1][at_slot == 0] = 0
    for i, trees in local.items():
        for parent, _ in trees:
            for feeder in feeders:
                full = (offsets + np.where(parent < 0, 0, parent)[None, :]).ravel()
                full = full.astype(np.int64)
                # the rank at the root's place in node k hears from its feeder's
                full[np.arange(nodes) * per + i] = feeder * per + i
                full[i] = -1
                yield i, full


def _entry_trees(topology: Topology, counts):
    """Trees for rank 0 of ``K`` nodes of ``n`` ranks, one per count ``x`` in ``counts`` of arcs
    between nodes (``K - 1 <= x <= (K - 1) n``): the root sends over the network straight to
    ``p + 1`` ranks of the first ``r`` other nodes and ``p`` of the rest (``x = (K - 1) p + r``),
    which hand it on inside their node; the root's node hears it from the root. Under the
    translations every rank's network and node loads are these counts' average, so mixing
    counts reaches the optimum with few pieces."""
    layout = network_layout(topology)
    per, nodes = layout.ranks_per_node, layout.nodes
    local = np.array(layout.node.links, dtype=np.int64)
    home = _bfs_parent(local, 0, np.ones(per, dtype=bool))
    if home is None or nodes < 2:
        return
    others = np.arange(1, nodes, dtype=np.int64)
    v = np.arange(per, dtype=np.int64)
    for x in counts:
        if not nodes - 1 <= x <= (nodes - 1) * per:
            continue
        p, r = divmod(int(x), nodes - 1)
        entries = np.where(np.arange(nodes - 1) < r, p + 1, p)  # per other node
        # rank v of a node hears from entry v mod entries (itself an entry when v < entries)
        feeder = v[None, :] % entries[:, None]
        if not (local[feeder, v[None, :]] > 0)[v[None, :] >= entries[:, None]].all():
            continue  # some rank has no link from its entry
        parent = np.where(v[None, :] < entries[:, None], 0,
                          others[:, None] * per + feeder)
        yield np.concatenate([home, parent.ravel()])


def _bfs_parent(links: np.ndarray, root: int, allowed: np.ndarray) -> np.ndarray | None:
    """Parents of a breadth-first tree from ``root`` over the ``allowed`` vertices of the link
    matrix ``links``, or ``None`` when some allowed vertex is unreachable."""
    sub = np.flatnonzero(allowed)
    index = {int(v): i for i, v in enumerate(sub)}
    graph = sp.csr_matrix((links[np.ix_(sub, sub)] > 0).astype(np.int8))
    order, predecessors = breadth_first_order(graph, index[root], directed=True,
                                              return_predecessors=True)
    if len(order) != len(sub):
        return None
    parent = np.full(len(links), -1, dtype=np.int64)
    for i, v in enumerate(sub):
        if predecessors[i] >= 0:
            parent[v] = sub[predecessors[i]]
    return parent


def _chain_trees(topology: Topology, shift: NodeShift, root: int):
    """Starting trees for one root on ``K`` nodes: for each local rank ``j``, the root hands the
    chunk to its node's rank ``j``, which spreads it over the rest of the node and passes it down a
    chain of NICs through rank ``j`` of every other node (each spreading it in its node). The
    chains use every NIC of the root's node once per ``n`` pieces: the node-cut optimum when the
    nodes' links keep up."""
    per, nodes = shift.ranks_per_node, shift.nodes
    local_links = np.array(network_layout(topology).node.links, dtype=np.int64)
    home, i = divmod(root, per)
    everyone = np.ones(per, dtype=bool)
    for j in range(per):
        if j == i:
            inside = _bfs_parent(local_links, i, everyone)
        elif local_links[i, j] == 0:
            continue  # the root cannot hand piece j to rank j directly: no seed for it
        else:
            others = everyone.copy()
            others[i] = False
            inside = _bfs_parent(local_links, j, others)
            if inside is not None:
                inside[j] = i
        spread = _bfs_parent(local_links, j, everyone)
        if inside is None or spread is None:
            continue
        parent = np.full(topology.num_ranks, -1, dtype=np.int64)
        order = [(home + step) % nodes for step in range(nodes)]
        for position, node in enumerate(order):
            local = inside if position == 0 else spread
            base = node * per
            for v in range(per):
                if local[v] >= 0:
                    parent[base + v] = base + local[v]
            if position > 0:
                parent[base + j] = order[position - 1] * per + j
        parent[root] = -1
        yield parent


def _solve_master(rows: RowClasses, columns, owners, num_roots):
    m = len(columns)
    a = np.column_stack(columns) if m else np.zeros((len(rows.capacity), 0))
    # Variables: [R, w_1..w_m]; minimise R.
    a_ub = np.hstack([-rows.capacity[:, None], a])
    b_ub = np.zeros(len(rows.capacity))
    a_eq = np.zeros((num_roots, m + 1))
    a_eq[np.asarray(owners), 1 + np.arange(m)] = 1.0
    b_eq = np.ones(num_roots)
    c = np.zeros(m + 1)
    c[0] = 1.0
    result = linprog(c, A_ub=a_ub, b_ub=b_ub, A_eq=a_eq, b_eq=b_eq, bounds=(0, None),
                     method="highs")
    if result.status != 0:
        raise SolverError(f"HiGHS failed on the tree program: {result.message}")
    y = -np.asarray(result.ineqlin.marginals)
    u = np.asarray(result.eqlin.marginals)
    return float(result.x[0]), np.asarray(result.x[1:]), np.maximum(y, 0.0), u


def _rational_weights(a, capacity, owners, num_roots, weights, optimum, max_k):
    """The program's own weights read as fractions (denominators up to ``max_k``), if they give
    an exact packing at ``optimum`` with at most ``max_k`` pieces per root."""
    fractions = [Fraction(float(w)).limit_denominator(max_k) for w in weights]
    if any(abs(float(f) - float(w)) > 1e-7 for f, w in zip(fractions, weights)):
        return None
    for r in range(num_roots):  # rounding may leave a root's weights off 1: fix its largest
        mine = [j for j, o in enumerate(owners) if o == r]
        if not mine:
            return None
        largest = max(mine, key=lambda j: fractions[j])
        fractions[largest] += 1 - sum(fractions[j] for j in mine)
        if fractions[largest] < 0:
            return None
    k = 1
    for f in fractions:
        k = k * f.denominator // math.gcd(k, f.denominator)
        if k > max_k:
            return None
    multiplicities = np.array([int(f * k) for f in fractions], dtype=np.int64)
    rho = optimum * k
    if rho.denominator != 1:
        k *= rho.denominator
        multiplicities *= rho.denominator
        rho *= rho.denominator
        if k > max_k:
            return None
    loads = a @ multiplicities
    if (loads > capacity * int(rho) + 1e-9).any():
        return None
    return multiplicities, k, int(rho)


def _integer_multiplicities(rows: RowClasses, columns, owners, num_roots, value, target, max_k,
                            weights):
    """``(multiplicities, k, rho)`` with the least ``rho / k`` found."""
    optimum = Fraction(target) if target is not None and value <= float(target) + 1e-9 else \
        Fraction(value).limit_denominator(1000)
    a = np.column_stack(columns)
    owners = np.asarray(owners)
    best = _rational_weights(a, rows.capacity, owners, num_roots, weights, optimum, max_k)
    base = optimum.denominator
    if best is not None and best[1] <= _FEW * base:
        return best
    # The program's weights may have a large common denominator where a few pieces per root do
    # as well (a torus: 224 against 4): fewer pieces make fewer sends, so try those first.
    for k in range(base, min(_FEW * base, max_k) + 1, base):
        if best is not None and k >= best[1]:
            break
        solved = _min_rho(a, rows.capacity, owners, num_roots, k)
        if solved is not None and Fraction(solved[1], k) <= optimum:
            return solved[0], k, solved[1]
    if best is not None:
        return best
    # Small multiples of the optimum's denominator first, then doublings up to 1024 pieces
    # (more pieces make schedules of many millions of sends for a fraction of a percent).
    candidates = sorted({base * j for j in range(1, 17)} | set(range(1, 9))
                        | {base << j for j in range(5, 13) if base << j <= 1024})
    deadline = time.perf_counter() + _INTEGER_SECONDS
    for k in candidates:
        if k > max_k:
            continue
        if best is not None and time.perf_counter() > deadline:
            break
        solved = _min_rho(a, rows.capacity, owners, num_roots, k)
        if solved is None:
            continue
        multiplicities, rho = solved
        if best is None or Fraction(rho, k) < Fraction(best[2], best[1]):
            best = (multiplicities, k, rho)
        if Fraction(rho, k) <= optimum:
            break
    if best is None:
        raise SolverError("no integer tree multiplicities found")
    return best


def _min_rho(a, capacity, owners, num_roots, k):
    m = a.shape[1]
    # Variables: [rho, m_1..m_m], integers; minimise rho.
    c = np.zeros(m + 1)
    c[0] = 1.0
    a_ub = np.hstack([-capacity[:, None], a])
    a_eq = np.zeros((num_roots, m + 1))
    a_eq[owners, 1 + np.arange(m)] = 1.0
    constraints = [LinearConstraint(a_ub, -np.inf, 0.0), LinearConstraint(a_eq, k, k)]
    result = milp(c, constraints=constraints, integrality=np.ones(m + 1),
                  bounds=LpBounds(0, np.inf), options={"time_limit": 2.0})
    if result.x is None:
        return None
    x = np.round(result.x).astype(np.int64)
    loads = a @ x[1:]
    rho = int(np.ceil(np.max(loads / capacity) - 1e-9)) if len(capacity) else 1
    return x[1:], max(rho, 1)


def _interrupted(options: PackingOptions, iterations: int, value: float) -> None:
    """Ctrl-C ends the search, not the run: the packing of the last solved program is used, as
    after a time limit (a second Ctrl-C, later, stops everything)."""
    _log.warning("interrupted: column generation stopped after %d iterations at %.6f rounds per "
                 "chunk; the packing found so far is used", iterations, value)
    if options.progress is not None:
        options.progress("interrupted: the packing found so far is used (Ctrl-C again to stop)")


def _price_trees(reps, hops, scale, trial_prices, prices, finite, u, add) -> tuple[int, float]:
    """One pricing round of the column generation: the cheapest tree per root under the trial
    prices, added when its reduced cost is negative; returns (trees added, Lagrangian bound)."""
    added, bound = 0, 0.0
    for i, root in enumerate(reps):
        nudge = scale * 1e-7 * (1 + hops[i])[:, None]
        cost = trial_prices + nudge
        cost[~finite] = np.inf
        parent = min_arborescence(cost, root)
        children = np.flatnonzero(parent >= 0)
        arcs = (parent[children], children)
        # For every tree T: trial(T*) + nudge(T*) <= trial(T) + nudge(T) <= trial(T) + most,
        # so trial(T*) + nudge(T*) - most bounds the cheapest tree under trial prices.
        most = scale * 1e-7 * (1 + float(hops[i].max())) * len(children)
        bound += float(trial_prices[arcs].sum() + nudge[arcs[0], 0].sum()) - most
        reduced = float(prices[arcs].sum()) - u[i]
        if reduced < -1e-9 * max(1.0, abs(u[i])) and add(i, parent):
            added += 1
    return added, bound
