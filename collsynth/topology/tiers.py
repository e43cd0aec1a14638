"""Fabrics between nodes: one switch, leaf-spine or rail-optimised, with a ratio per tier.

:func:`~collsynth.topology.compose.compose_nodes` joins ``K`` nodes through their NICs; the
*fabric* says which of the traffic between nodes shares which switch uplinks, tier by tier, each
tier with its oversubscription ratio. The fabrics, their tiers and the bandwidth groups they add
are in docs/topologies.md.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Mapping, Sequence

from collsynth._parse import NumberTextError, shown
from collsynth.errors import InvalidTopologyError
from collsynth.topology.layout import (MAX_OVERSUBSCRIPTION, oversubscription_from_text,
                                       oversubscription_refusal)
from collsynth.topology.model import BandwidthGroup

__all__ = ["FABRICS", "FABRIC_TIERS", "FabricSpec", "fabric_spec", "parse_oversubscription",
           "oversubscription_ratio", "tier_scale", "tier_limits", "tier_groups",
           "MAX_TIER_RESCALE", "MAX_OVERSUBSCRIPTION"]

_log = logging.getLogger(__name__)

#: The fabrics :func:`fabric_spec` accepts.
FABRICS = ("switch", "leaf-spine", "rail")
#: Each fabric's tiers; the last is the one a bare ``oversubscription`` number sets.
FABRIC_TIERS = {"switch": ("node",), "leaf-spine": ("node", "leaf"), "rail": ("rail",)}
#: Largest factor by which a tier's share is made whole (as ``compose.MAX_RESCALE``).
MAX_TIER_RESCALE = 8


@dataclass(frozen=True)
class FabricSpec:
    """A checked fabric: its kind, nodes per leaf (``leaf-spine`` only) and every tier's ratio.

    ``ratios`` lists ``(tier, X)`` for every tier of the fabric, in :data:`FABRIC_TIERS` order.
    """

    kind: str = "switch"
    nodes_per_leaf: int | None = None
    ratios: tuple[tuple[str, Fraction], ...] = (("node", Fraction(1)),)

    def ratio(self, tier: str) -> Fraction:
        """The oversubscription of ``tier`` (1 for a tier this fabric does not have)."""
        return dict(self.ratios).get(tier, Fraction(1))

    def describe(self) -> str:
        """A few words: ``'leaf-spine (2 nodes per leaf), leaf 2:1'``."""
        text = self.kind
        if self.nodes_per_leaf is not None:
            text += f" ({self.nodes_per_leaf} nodes per leaf)"
        over = [f"{tier} {x}:1" for tier, x in self.ratios if x > 1]
        return ", ".join([text] + over)

    def to_json(self) -> dict[str, Any]:
        """What ``metadata["network"]["fabric"]`` records (ratios as strings)."""
        out: dict[str, Any] = {"kind": self.kind}
        if self.nodes_per_leaf is not None:
            out["nodes_per_leaf"] = self.nodes_per_leaf
        out["oversubscription"] = {tier: str(x) for tier, x in self.ratios}
        return out


def oversubscription_ratio(value: object, where: str) -> Fraction:
    """``value`` (a number from Python or JSON) as an exact fraction, by the one bound of
    :func:`~collsynth.topology.layout.oversubscription_refusal`; floats are rounded to 6 decimal
    places' worth.

    Raises
    ------
    InvalidTopologyError
        For a non-number, an infinite number, one below 1 or above
        :data:`~collsynth.topology.layout.MAX_OVERSUBSCRIPTION`; ``where`` starts the message.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float, Fraction)):
        raise InvalidTopologyError(f"{where}: oversubscription must be a number, got {value!r}")
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidTopologyError(f"{where}: oversubscription must be finite, got {value!r}")
        ratio = Fraction(value).limit_denominator(10**6)
    else:
        ratio = Fraction(value)
    refusal = oversubscription_refusal(ratio, shown(value))
    if refusal is not None:
        raise InvalidTopologyError(f"{where}: oversubscription {refusal}")
    return ratio


def parse_oversubscription(text: str) -> Fraction | dict[str, Fraction]:
    """A ratio (``"2"``, ``"1.5"``, ``"3/2"``) or ratios per tier (``"leaf=2,node=1"``), each
    read by :func:`~collsynth.topology.layout.oversubscription_from_text`.

    Raises
    ------
    InvalidTopologyError
        For text that is neither, a ratio below 1 or above 1000, or a tier named twice (tier
        names are checked against the fabric by :func:`fabric_spec`).

    >>> parse_oversubscription("2")
    Fraction(2, 1)
    >>> parse_oversubscription("rail=1.5")
    {'rail': Fraction(3, 2)}

    >>> parse_oversubscription("leaf=2,node=3/2")
    {'leaf': Fraction(2, 1), 'node': Fraction(3, 2)}
    """
    if "=" not in text:
        try:
            return oversubscription_from_text(text)
        except NumberTextError as exc:
            raise InvalidTopologyError(f"oversubscription {exc}") from None
    ratios: dict[str, Fraction] = {}
    for item in text.split(","):
        tier, equals, value = item.partition("=")
        tier = tier.strip().lower()
        if not equals or not tier:
            raise InvalidTopologyError(f"oversubscription {text!r}: {item.strip()!r} is not "
                                       "TIER=X, like leaf=2")
        if tier in ratios:
            raise InvalidTopologyError(f"oversubscription {text!r}: tier {tier!r} given twice")
        try:
            ratios[tier] = oversubscription_from_text(value)
        except NumberTextError as exc:
            raise InvalidTopologyError(f"oversubscription {text!r}, tier {tier}: {exc}") from None
    return ratios


def fabric_spec(kind: str = "switch", *, nodes: int, nodes_per_leaf: int | None = None,
                oversubscription: object = 1, name: str = "") -> FabricSpec:
    """Check a fabric description and return it as a :class:`FabricSpec`.

    Parameters
    ----------
    kind:
        ``"switch"``, ``"leaf-spine"`` or ``"rail"`` (see docs/topologies.md).
    nodes:
        ``K``, the number of nodes joined.
    nodes_per_leaf:
        Nodes under each leaf switch; required by ``leaf-spine`` (a divisor of ``nodes``) and
        refused by the others.
    oversubscription:
        A number >= 1 for the fabric's main tier (``switch``: node, ``leaf-spine``: leaf,
        ``rail``: rail), or a mapping ``{tier: number}``.
    name:
        The node's name, for messages.

    Raises
    ------
    InvalidTopologyError
        On an unknown fabric or tier, a missing or misfit ``nodes_per_leaf``, or a bad ratio.

    Examples
    --------
    Four 4-GPU rings, one 1-unit NIC per GPU, two nodes (8 NIC units) under each leaf, 2:1:

    >>> from collsynth.topology import compose_nodes, get_topology
    >>> system = compose_nodes(get_topology("ring:4"), 4, nic_units=1, fabric="leaf-spine",
    ...                        nodes_per_leaf=2, oversubscription=2)
    >>> [(g.name, len(g.sources), len(g.destinations), g.limit) for g in system.groups
    ...  if g.name.startswith("leaf 0")]
    [('leaf 0 uplink (oversubscription 2)', 8, 8, 4), ('leaf 0 downlink (oversubscription 2)', 8, 8, 4)]
    >>> spec = fabric_spec("leaf-spine", nodes=4, nodes_per_leaf=2, oversubscription=2)
    >>> spec.ratio("leaf"), spec.ratio("node")
    (Fraction(2, 1), Fraction(1, 1))
    """
    where = f"composing {name!r}" if name else "fabric"
    if not isinstance(kind, str) or kind.lower() not in FABRICS:
        raise InvalidTopologyError(f"{where}: unknown fabric {kind!r}; valid: {', '.join(FABRICS)}")
    kind = kind.lower()
    tiers = FABRIC_TIERS[kind]
    if kind == "leaf-spine":
        if nodes_per_leaf is None:
            raise InvalidTopologyError(f"{where}: the leaf-spine fabric needs nodes_per_leaf "
                                       "(--nodes-per-leaf P: nodes under each leaf switch)")
        if not isinstance(nodes_per_leaf, int) or isinstance(nodes_per_leaf, bool) \
                or nodes_per_leaf < 1:
            raise InvalidTopologyError(f"{where}: nodes_per_leaf must be a whole number >= 1, "
                                       f"got {nodes_per_leaf!r}")
        if nodes % nodes_per_leaf:
            raise InvalidTopologyError(f"{where}: {nodes} nodes cannot fill leaves of "
                                       f"{nodes_per_leaf}; make the node count a multiple of "
                                       "nodes_per_leaf")
    elif nodes_per_leaf is not None:
        raise InvalidTopologyError(f"{where}: nodes_per_leaf applies to the leaf-spine fabric "
                                   f"only, not {kind!r}")
    if isinstance(oversubscription, Mapping):
        given = {}
        for tier, value in oversubscription.items():
            key = str(tier).lower()
            if key not in tiers:
                raise InvalidTopologyError(
                    f"{where}: {tier!r} is not a tier of the {kind!r} fabric; its tiers: "
                    f"{', '.join(tiers)}")
            given[key] = oversubscription_ratio(value, f"{where}: tier {key!r}")
    else:
        given = {tiers[-1]: oversubscription_ratio(oversubscription, where)}
    ratios = tuple((tier, given.get(tier, Fraction(1))) for tier in tiers)
    return FabricSpec(kind, nodes_per_leaf, ratios)


def _shares(spec: FabricSpec, nic_count: int, units: int) -> dict[str, Fraction]:
    """The exact share (units per direction) of each leaf or rail group, before rescaling."""
    shares = {}
    if spec.kind == "leaf-spine" and spec.ratio("leaf") > 1:
        shares["leaf"] = Fraction(spec.nodes_per_leaf * nic_count * units) / spec.ratio("leaf")
    if spec.kind == "rail" and spec.ratio("rail") > 1 and nic_count > 1:
        shares["rail"] = Fraction(units) / spec.ratio("rail")
    return shares


def tier_scale(spec: FabricSpec, nic_count: int, units: int) -> int:
    """The least factor (up to :data:`MAX_TIER_RESCALE`) making every leaf or rail share a
    whole number of units; 1 when none does (the shares are then rounded, at least 1)."""
    shares = _shares(spec, nic_count, units)
    for factor in range(1, MAX_TIER_RESCALE + 1):
        if all((share * factor).denominator == 1 for share in shares.values()):
            return factor
    _log.info("fabric %s: tier shares %s are not whole within a rescale of %d; rounded",
              spec.describe(), {k: str(v) for k, v in shares.items()}, MAX_TIER_RESCALE)
    return 1


def tier_limits(spec: FabricSpec, nic_count: int, units: int) -> dict[str, int]:
    """The limit of each ``"leaf"`` or ``"rail"`` group of ``spec`` (rounded, at least 1), for
    the tiers that have groups at all (oversubscribed, and for rails more than one NIC)."""
    return {tier: max(1, round(share)) for tier, share in _shares(spec, nic_count, units).items()}


def tier_groups(spec: FabricSpec, *, nodes: int, ranks_per_node: int,
                nic_ranks: Sequence[Sequence[int]], units: int) -> list[BandwidthGroup]:
    """The leaf or rail groups of ``spec`` (none for ``switch``; the node tier is
    :func:`~collsynth.topology.compose.compose_nodes`'s), in units after rescaling."""
    n, total = ranks_per_node, nodes * ranks_per_node
    groups: list[BandwidthGroup] = []
    shares = tier_limits(spec, len(nic_ranks), units)
    if "leaf" in shares and nodes > spec.nodes_per_leaf:
        width = spec.nodes_per_leaf * n
        limit, ratio = shares["leaf"], spec.ratio("leaf")
        for leaf in range(nodes // spec.nodes_per_leaf):
            mine = frozenset(range(leaf * width, (leaf + 1) * width))
            others = frozenset(range(leaf * width)) | frozenset(range((leaf + 1) * width, total))
            groups.append(BandwidthGroup(mine, others, limit,
                                         f"leaf {leaf} uplink (oversubscription {ratio})"))
            groups.append(BandwidthGroup(others, mine, limit,
                                         f"leaf {leaf} downlink (oversubscription {ratio})"))
    if "rail" in shares and nodes > 1:
        limit, ratio = shares["rail"], spec.ratio("rail")
        for j, members in enumerate(nic_ranks):
            off_rail = [r for r in range(n) if r not in set(members)]
            for k in range(nodes):
                mine = frozenset(k * n + m for m in members)
                across = frozenset(other * n + r for other in range(nodes) if other != k
                                   for r in off_rail)
                label = f"node {k} NIC {j} cross-rail"
                groups.append(BandwidthGroup(mine, across, limit,
                                             f"{label} egress (oversubscription {ratio})"))
                groups.append(BandwidthGroup(across, mine, limit,
                                             f"{label} ingress (oversubscription {ratio})"))
    return groups
