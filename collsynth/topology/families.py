"""Parametric topology families: ``ring:N``, ``line:N``, ``star:N``, ``fully-connected:N``, ``hub:N``,
and the direct-connect shapes ``torus:AxB[xC...]``, ``mesh:AxB[xC...]`` and ``hypercube:D``.

Every link has bandwidth 1 (one chunk per round) and links are bidirectional, as in msccl-tools,
so fronts and bounds compare directly. Families carry no physical figures (``unit_gbps``,
``alpha_us``); give them in the name (``torus:4x4,unit_gbps=50,alpha_us=1``, see
:mod:`collsynth.topology.builtins`) when timing needs them.

Shapes number their ranks row-major, the last coordinate fastest: in ``torus:AxB`` the rank at
``(x, y)`` is ``x * B + y``. A torus dimension of size 2 gives each rank *one* neighbour along it,
joined by one link of 1 unit per direction, not two parallel links (the wrap-around link would join
the same pair): ``torus:2x2`` is a 4-cycle and ``torus:2x2x2`` is ``hypercube:3``, rank for rank.
A dimension of size 1 is refused (drop it: ``torus:4x1`` is ``torus:4``).
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

from collsynth._parse import NumberTextError, number_text
from collsynth.errors import InputTooLargeError, InvalidTopologyError
from collsynth.topology.model import MAX_DENSE_RANKS, BandwidthGroup, Topology

__all__ = ["ring", "line", "star", "fully_connected", "hub", "torus", "mesh", "hypercube",
           "FAMILIES", "SHAPED_FAMILIES", "parse_dimensions"]


def _check(n: int, family: str, minimum: int = 2) -> None:
    if not isinstance(n, int) or isinstance(n, bool) or n < minimum:
        raise InvalidTopologyError(f"{family}:N needs N >= {minimum}, got {n!r}")
    if n > MAX_DENSE_RANKS:
        raise InputTooLargeError(f"{family}:{n}: more than the {MAX_DENSE_RANKS} ranks collsynth accepts")


#: Hubs and fully connected graphs link every pair: their dense form is n**2 entries, and a
#: hub's 2n groups name n - 1 ranks each (hub:8192: 134 million set entries, several GB, before
#: any bound is computed), and the bounds cost n**2 to n**3 of it. Above this size they are
#: refused up front. Measured on a busy 2-core machine (docs/large-systems.md): at 1024 ranks
#: every standard collective's bounds answer in under 30 s and 1.5 GB (alltoall, a million
#: chunks, is the slowest on any 1024-rank topology; the others under 17 s); at 2048 a hub's
#: allreduce takes 55 s and 3 GB, and fully-connected:4096 allgather took more than 120 s
#: before this limit (31 s and 3.3 GB after the bounds were made faster).
MAX_ALL_PAIRS_RANKS = 1024


def _check_all_pairs(n: int, family: str) -> None:
    _check(n, family)
    if n > MAX_ALL_PAIRS_RANKS:
        entries = 2 * n * (n - 1) if family == "hub" else n * (n - 1)
        raise InputTooLargeError(
            f"{family}:{n}: every pair of ranks is linked, {entries:,} link and group entries "
            f"held densely; collsynth builds {family} topologies up to {MAX_ALL_PAIRS_RANKS} "
            "ranks (a switch of that size is a composed topology: compose_nodes, --nodes)")


def _matrix(n: int, linked: Callable[[int, int], bool]) -> tuple[tuple[int, ...], ...]:
    return tuple(tuple(1 if a != b and linked(a, b) else 0 for b in range(n)) for a in range(n))


def ring(n: int) -> Topology:
    """Bidirectional ring: rank ``i`` linked to ``i +- 1 mod n``."""
    _check(n, "ring")
    return Topology(f"ring:{n}", _matrix(n, lambda a, b: (a - b) % n in (1, n - 1)),
                    description=f"bidirectional ring of {n} ranks, 1 unit per direction")


def line(n: int) -> Topology:
    """Bidirectional line: rank ``i`` linked to ``i +- 1``."""
    _check(n, "line")
    return Topology(f"line:{n}", _matrix(n, lambda a, b: abs(a - b) == 1),
                    description=f"bidirectional line (chain) of {n} ranks")


def star(n: int) -> Topology:
    """Rank 0 linked both ways to every other rank."""
    _check(n, "star")
    return Topology(f"star:{n}", _matrix(n, lambda a, b: a == 0 or b == 0),
                    description=f"star of {n} ranks around rank 0")


def fully_connected(n: int) -> Topology:
    """A link of bandwidth 1 between every ordered pair."""
    _check_all_pairs(n, "fully-connected")
    return Topology(f"fully-connected:{n}", _matrix(n, lambda a, b: True),
                    description=f"{n} ranks, a dedicated link between every pair")


def hub(n: int) -> Topology:
    """Hub-and-spoke switch (msccl-tools' DGX2 model): any rank may send to any other, but each rank
    sends at most one chunk and receives at most one chunk per round."""
    _check_all_pairs(n, "hub")
    everyone = frozenset(range(n))
    groups = []
    for r in range(n):
        others = everyone - {r}
        groups.append(BandwidthGroup(frozenset({r}), others, 1, f"rank {r} egress"))
        groups.append(BandwidthGroup(others, frozenset({r}), 1, f"rank {r} ingress"))
    return Topology(f"hub:{n}", _matrix(n, lambda a, b: True), tuple(groups),
                    description=f"{n} ranks on one switch, 1 unit in and out per rank")


def _check_dimensions(dims: Sequence[int], family: str) -> tuple[int, ...]:
    """The dimensions as a tuple, each at least 2, their product within :data:`MAX_DENSE_RANKS`."""
    label = f"{family}:{'x'.join(str(d) for d in dims)}"
    if not dims:
        raise InvalidTopologyError(f"{family}: give at least one dimension, e.g. {family}:4x4")
    for index, size in enumerate(dims, start=1):
        if not isinstance(size, int) or isinstance(size, bool):
            raise InvalidTopologyError(f"{label}: dimension {index} is {size!r}, expected a whole "
                                       "number")
        if size < 2:
            raise InvalidTopologyError(
                f"{label}: dimension {index} has size {size}; every dimension needs at least 2 "
                "ranks (a dimension of size 1 adds nothing: leave it out)")
    if math.prod(dims) > MAX_DENSE_RANKS:
        raise InputTooLargeError(f"{label}: {math.prod(dims)} ranks is more than the {MAX_DENSE_RANKS} "
                                 "collsynth accepts")
    return tuple(dims)


def _grid(dims: tuple[int, ...], name: str, wrap: bool, description: str) -> Topology:
    """Ranks on a grid, each linked to the next and previous rank along every dimension
    (modulo the size with ``wrap``)."""
    n = math.prod(dims)
    strides = [math.prod(dims[i + 1:]) for i in range(len(dims))]
    rows = []
    for rank in range(n):
        row = [0] * n
        for size, stride in zip(dims, strides):
            x = rank // stride % size
            for step in (-1, 1):
                y = x + step
                if wrap:
                    y %= size
                elif not 0 <= y < size:
                    continue
                if y != x:
                    row[rank + (y - x) * stride] = 1  # set, not add: size 2 has one neighbour
        rows.append(tuple(row))
    return Topology(name, tuple(rows), description=description)


def torus(dims: Sequence[int]) -> Topology:
    """A torus: ranks on an ``A x B x ...`` grid, each linked to its neighbours along every
    dimension, with wrap-around (a ring per row, column...). 1 unit per link direction.

    >>> t = torus((4, 4))
    >>> t.num_ranks, len(t.destinations[0]), t.bandwidth(0, 3), t.bandwidth(0, 12)
    (16, 4, 1, 1)
    >>> len(torus((2, 4)).destinations[0])  # one neighbour along the dimension of size 2
    3
    """
    dims = _check_dimensions(list(dims), "torus")
    shape = "x".join(map(str, dims))
    return _grid(dims, f"torus:{shape}", True,
                 f"{shape} torus ({math.prod(dims)} ranks): neighbours along each dimension with "
                 "wrap-around, 1 unit per direction")


def mesh(dims: Sequence[int]) -> Topology:
    """A mesh: ranks on an ``A x B x ...`` grid, each linked to its neighbours along every
    dimension, without wrap-around. 1 unit per link direction.

    >>> m = mesh((3, 3))
    >>> len(m.destinations[0]), len(m.destinations[4])  # a corner, the centre
    (2, 4)
    """
    dims = _check_dimensions(list(dims), "mesh")
    shape = "x".join(map(str, dims))
    return _grid(dims, f"mesh:{shape}", False,
                 f"{shape} mesh ({math.prod(dims)} ranks): neighbours along each dimension, no "
                 "wrap-around, 1 unit per direction")


def hypercube(d: int) -> Topology:
    """A ``d``-dimensional hypercube: ``2**d`` ranks, ``a`` linked to ``a ^ (1 << i)`` for every
    bit ``i``. 1 unit per link direction.

    >>> h = hypercube(3)
    >>> h.num_ranks, h.destinations[0]
    (8, (1, 2, 4))
    """
    if not isinstance(d, int) or isinstance(d, bool) or d < 1:
        raise InvalidTopologyError(f"hypercube:D needs a dimension D >= 1, got {d!r}")
    if d > MAX_DENSE_RANKS.bit_length() - 1:
        raise InputTooLargeError(f"hypercube:{d}: 2**{d} ranks is more than the {MAX_DENSE_RANKS} "
                                 "collsynth accepts")
    n = 1 << d
    rows = []
    for rank in range(n):
        row = [0] * n
        for bit in range(d):
            row[rank ^ (1 << bit)] = 1
        rows.append(tuple(row))
    return Topology(f"hypercube:{d}", tuple(rows),
                    description=f"{d}-dimensional hypercube ({n} ranks), 1 unit per direction")


def parse_dimensions(text: str, family: str) -> tuple[int, ...]:
    """``"4x4x2"`` as ``(4, 4, 2)``; sizes are checked by the family builder.

    >>> parse_dimensions("4X4x2", "torus")
    (4, 4, 2)
    """
    parts = text.strip().lower().split("x")
    try:
        digits = [number_text(p) for p in parts]
        why = ""
    except NumberTextError as exc:
        digits, why = [], f": {exc}"
    if not digits or not all(p.isdigit() for p in digits):  # ASCII digits now: '²' is a digit
        raise InvalidTopologyError(f"topology {family}:{text}: expected {family}:AxB[xC...] with "
                                   f"whole-number sizes, e.g. {family}:4x4{why}")
    # Bound the digits before int() so a huge size fails as too large, not as a slow parse.
    if any(len(p.strip()) > 9 for p in parts):
        raise InputTooLargeError(f"{family}:{text}: more than the {MAX_DENSE_RANKS} ranks collsynth "
                                 "accepts")
    return tuple(int(p) for p in parts)


def _parse_hypercube(text: str) -> Topology:
    try:
        size, why = number_text(text), ""
    except NumberTextError as exc:
        size, why = "", f": {exc}"
    if not size.isdigit():  # ASCII digits only, after number_text ('²' is a digit to isdigit)
        raise InvalidTopologyError(f"topology hypercube:{text}: expected hypercube:D with D a whole "
                                   f"number of dimensions, e.g. hypercube:3{why}")
    if len(size) > 9:
        raise InputTooLargeError(f"hypercube:{size}: more than the {MAX_DENSE_RANKS} ranks collsynth "
                                 "accepts")
    return hypercube(int(size))


#: Families named by a shape rather than a rank count: name -> (syntax, builder from the text after
#: the colon, one-line description).
SHAPED_FAMILIES: dict[str, tuple[str, Callable[[str], Topology], str]] = {
    "torus": ("torus:AxB[xC...]", lambda text: torus(parse_dimensions(text, "torus")),
              "torus: neighbours along each dimension with wrap-around, 1 unit per direction"),
    "mesh": ("mesh:AxB[xC...]", lambda text: mesh(parse_dimensions(text, "mesh")),
             "mesh: neighbours along each dimension, no wrap-around, 1 unit per direction"),
    "hypercube": ("hypercube:D", _parse_hypercube,
                  "2**D ranks, each linked to the D ranks that differ in one bit, 1 unit per "
                  "direction"),
}


FAMILIES: dict[str, Callable[[int], Topology]] = {
    "ring": ring,
    "line": line,
    "star": star,
    "fully-connected": fully_connected,
    "hub": hub,
}
