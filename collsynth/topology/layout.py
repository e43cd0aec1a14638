"""The node layout of a multi-node topology: which ranks share a node and its NICs.

:func:`~collsynth.topology.compose.compose_nodes` records it in ``metadata["network"]``;
:attr:`Topology.layout <collsynth.topology.model.Topology.layout>` reads it once into a
:class:`NodeLayout`, which every engine and model asks instead of the raw metadata.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Mapping

from collsynth._parse import NumberTextError, number_text, shown
from collsynth.errors import InvalidTopologyError

__all__ = ["NodeLayout", "node_layout", "MAX_OVERSUBSCRIPTION", "oversubscription_refusal",
           "oversubscription_from_text"]

#: Largest oversubscription a tier may have: built fabrics are 1:1 to 8:1; 10^300:1 (or a
#: text like "1e10000000", whose exact value alone takes seconds to compute) is a typo.
MAX_OVERSUBSCRIPTION = 1000
#: What every refused oversubscription is told, from the command line or a file.
_EXPECTED_RATIO = (f"expected a ratio from 1 to {MAX_OVERSUBSCRIPTION}, where 1 is non-blocking "
                   "and 2 is 2:1")


def oversubscription_refusal(ratio: Fraction, written: str) -> str | None:
    """Why ``ratio`` (shown in the message as ``written``) is no tier's oversubscription, or
    ``None`` when it is one: the one bound for ratios typed, read from files or given from
    Python.

    >>> oversubscription_refusal(Fraction(3, 2), "3/2") is None
    True
    >>> oversubscription_refusal(Fraction(1, 2), "0.5")
    '0.5 is below 1; expected a ratio from 1 to 1000, where 1 is non-blocking and 2 is 2:1'
    """
    if ratio < 1:
        return f"{written} is below 1; {_EXPECTED_RATIO}"
    if ratio > MAX_OVERSUBSCRIPTION:
        figure = f"{float(ratio):g}" if ratio < 10**300 else "above 1e300"
        return f"{figure} is more than {MAX_OVERSUBSCRIPTION}:1; {_EXPECTED_RATIO}"
    return None


def oversubscription_from_text(text: str) -> Fraction:
    """The oversubscription written as ``text`` (``"2"``, ``"1.5"``, ``"3/2"``, ``"2e0"``), by
    the rule of :func:`oversubscription_refusal`. An exponent is read as a float first:
    ``Fraction("1e10000000")`` computes 10^(10^7) digit by digit, seconds of CPU.

    Raises
    ------
    NumberTextError
        Saying why, starting with the value: not a number (other scripts' digits, ``1_5``,
        ``1/0``, ``x``), below 1 or more than :data:`MAX_OVERSUBSCRIPTION`.

    >>> oversubscription_from_text(" 3/2 "), oversubscription_from_text("2e0")
    (Fraction(3, 2), Fraction(2, 1))
    """
    try:
        written = number_text(text)
        if "e" in written.lower():
            given = float(written)
            ratio = Fraction(given).limit_denominator(10**6) if math.isfinite(given) \
                else Fraction(10**301 if given > 0 else 0)
        else:
            ratio = Fraction(written)
    except NumberTextError as exc:
        raise NumberTextError(f"{text.strip()!r} is not a number: {exc}") from None
    except (ValueError, ZeroDivisionError):
        raise NumberTextError(f"{text.strip()!r} is not a number; {_EXPECTED_RATIO}") from None
    refusal = oversubscription_refusal(ratio, repr(text.strip()))
    if refusal is not None:
        raise NumberTextError(refusal)
    return ratio


@dataclass(frozen=True)
class NodeLayout:
    """``nodes`` identical nodes of ``ranks_per_node`` ranks; rank = node * ranks_per_node + local.

    ``nic_gpus[i]`` are the local ranks NIC ``i`` serves; ``nic_units`` its bandwidth units per
    direction; ``nic_gbps`` those units in GB/s (``None`` without physical figures);
    ``nic_gbps_declared`` the NIC's own figure before rounding to units; ``network_alpha_us`` a
    per-step latency between nodes when one was given; ``oversubscription`` >= 1 of the network
    (the node tier). ``fabric`` is ``"switch"``, ``"leaf-spine"`` (``nodes_per_leaf`` nodes per
    leaf switch) or ``"rail"``; ``tiers`` gives every tier's ratio
    (:mod:`collsynth.topology.tiers`).
    """

    nodes: int
    ranks_per_node: int
    nic_gpus: tuple[tuple[int, ...], ...] = ()
    nic_units: int | None = None
    nic_gbps: float | None = None
    nic_gbps_declared: float | None = None
    network_alpha_us: float | None = None
    oversubscription: Fraction = Fraction(1)
    composed_from: str = ""
    fabric: str = "switch"
    nodes_per_leaf: int | None = None
    tiers: tuple[tuple[str, Fraction], ...] = ()

    @property
    def num_ranks(self) -> int:
        return self.nodes * self.ranks_per_node

    @property
    def multi_node(self) -> bool:
        return self.nodes > 1

    def node_of(self, rank: int) -> int:
        return rank // self.ranks_per_node

    def local_rank(self, rank: int) -> int:
        return rank % self.ranks_per_node

    def tier_oversubscription(self, tier: str) -> Fraction:
        """The ratio of ``tier`` (``"node"``, ``"leaf"``, ``"rail"``); 1 when it has none."""
        if tier == "node":
            return self.oversubscription
        return dict(self.tiers).get(tier, Fraction(1))

    def leaf_of(self, node: int) -> int:
        """The leaf switch of ``node`` (0 for every node unless the fabric is leaf-spine)."""
        return node // self.nodes_per_leaf if self.nodes_per_leaf else 0

    @property
    def oversubscribed(self) -> bool:
        """True when some tier above the NICs is narrower than the NICs."""
        return self.oversubscription > 1 or any(x > 1 for _, x in self.tiers)


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) \
        else None


def node_layout(metadata: Mapping | Any, *, name: str, num_ranks: int) -> NodeLayout | None:
    """The layout ``metadata["network"]`` describes, or ``None`` when there is none.

    Raises
    ------
    InvalidTopologyError
        A ``network`` entry whose ``nodes`` or ``ranks_per_node`` is not a positive whole number,
        or whose product is not ``num_ranks``.

    >>> node_layout({"network": {"nodes": 2, "ranks_per_node": 4}}, name="t", num_ranks=8).nodes
    2
    >>> node_layout({}, name="t", num_ranks=8) is None
    True
    """
    network = metadata.get("network") if isinstance(metadata, Mapping) else None
    if not isinstance(network, Mapping) or ("nodes" not in network
                                            and "ranks_per_node" not in network):
        return None
    nodes, per_node = network.get("nodes"), network.get("ranks_per_node")
    for key, value in (("nodes", nodes), ("ranks_per_node", per_node)):
        if not _whole(value) or value < 1:
            raise InvalidTopologyError(f"topology {name!r}: metadata['network'][{key!r}] = "
                                       f"{value!r}; expected a positive whole number")
    if nodes * per_node != num_ranks:
        raise InvalidTopologyError(
            f"topology {name!r}: metadata['network'] describes {nodes} nodes of {per_node} ranks "
            f"but the topology has {num_ranks} ranks")
    gpus = network.get("nic_gpus")
    nic_gpus = tuple(tuple(int(r) for r in members) for members in gpus) \
        if isinstance(gpus, (list, tuple)) else ()
    units = network.get("nic_units")
    oversub = _ratio(network.get("oversubscription", 1),
                     f"topology {name!r}: metadata['network']['oversubscription']")
    fabric, per_leaf, tiers = _fabric(network.get("fabric"), name, nodes)
    return NodeLayout(
        nodes=nodes, ranks_per_node=per_node, nic_gpus=nic_gpus,
        nic_units=units if _whole(units) else None,
        nic_gbps=_number(network.get("nic_gbps")),
        nic_gbps_declared=_number(network.get("nic_gbps_declared")),
        network_alpha_us=_number(network.get("alpha_us")),
        oversubscription=oversub,
        composed_from=str(network.get("composed_from", "")),
        fabric=fabric, nodes_per_leaf=per_leaf, tiers=tiers)


_FABRICS = ("switch", "leaf-spine", "rail")


def _fabric(raw: Any, name: str, nodes: int
            ) -> tuple[str, int | None, tuple[tuple[str, Fraction], ...]]:
    """``metadata["network"]["fabric"]`` read as (kind, nodes per leaf, tier ratios); a
    topology without one is on one switch."""
    if raw is None:
        return "switch", None, ()

    def bad(message: str) -> InvalidTopologyError:
        return InvalidTopologyError(f"topology {name!r}: metadata['network']['fabric']: {message}")

    if not isinstance(raw, Mapping):
        raise bad(f"expected an object, got {type(raw).__name__}")
    kind = raw.get("kind", "switch")
    if kind not in _FABRICS:
        raise bad(f"'kind' = {kind!r}; expected one of {', '.join(_FABRICS)}")
    per_leaf = raw.get("nodes_per_leaf")
    if kind == "leaf-spine":
        if not _whole(per_leaf) or per_leaf < 1 or nodes % per_leaf:
            raise bad(f"'nodes_per_leaf' = {per_leaf!r}; expected a whole number >= 1 dividing "
                      f"the {nodes} nodes")
    else:
        per_leaf = None
    ratios = raw.get("oversubscription", {})
    if not isinstance(ratios, Mapping):
        raise bad(f"'oversubscription' = {ratios!r}; expected an object of tier: ratio")
    tiers = []
    for tier, value in ratios.items():
        tiers.append((str(tier), _ratio(value, f"topology {name!r}: metadata['network']"
                                               f"['fabric']['oversubscription'][{tier!r}]")))
    return kind, per_leaf, tuple(tiers)


def _ratio(value: Any, field: str) -> Fraction:
    """A file's oversubscription (written as text, ``"3/2"``, or a JSON number) by the one rule
    of :func:`oversubscription_from_text`; ``field`` starts the refusal."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise InvalidTopologyError(f"{field}: {shown(value)} is not a number; {_EXPECTED_RATIO}")
    try:
        return oversubscription_from_text(str(value))
    except NumberTextError as exc:
        raise InvalidTopologyError(f"{field}: {exc}") from None
