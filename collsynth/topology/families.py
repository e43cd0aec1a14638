"""Parametric topology families: ``ring:N``, ``line:N``, ``star:N``, ``fully-connected:N``, ``hub:N``.

Every link has bandwidth 1 (one chunk per round) and links are bidirectional, as in msccl-tools,
so fronts and bounds compare directly.
"""

from __future__ import annotations

from typing import Callable

from collsynth.errors import InputTooLargeError, InvalidTopologyError
from collsynth.topology.model import MAX_RANKS, BandwidthGroup, Topology

__all__ = ["ring", "line", "star", "fully_connected", "hub", "FAMILIES"]


def _check(n: int, family: str, minimum: int = 2) -> None:
    if not isinstance(n, int) or isinstance(n, bool) or n < minimum:
        raise InvalidTopologyError(f"{family}:N needs N >= {minimum}, got {n!r}")
    if n > MAX_RANKS:
        raise InputTooLargeError(f"{family}:{n}: more than the {MAX_RANKS} ranks collsynth accepts")


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
    _check(n, "fully-connected")
    return Topology(f"fully-connected:{n}", _matrix(n, lambda a, b: True),
                    description=f"{n} ranks, a dedicated link between every pair")


def hub(n: int) -> Topology:
    """Hub-and-spoke switch (msccl-tools' DGX2 model): any rank may send to any other, but each rank
    sends at most one chunk and receives at most one chunk per round."""
    _check(n, "hub")
    everyone = frozenset(range(n))
    groups = []
    for r in range(n):
        others = everyone - {r}
        groups.append(BandwidthGroup(frozenset({r}), others, 1, f"rank {r} egress"))
        groups.append(BandwidthGroup(others, frozenset({r}), 1, f"rank {r} ingress"))
    return Topology(f"hub:{n}", _matrix(n, lambda a, b: True), tuple(groups),
                    description=f"{n} ranks on one switch, 1 unit in and out per rank")


FAMILIES: dict[str, Callable[[int], Topology]] = {
    "ring": ring,
    "line": line,
    "star": star,
    "fully-connected": fully_connected,
    "hub": hub,
}
