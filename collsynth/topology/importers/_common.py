"""Helpers shared by the machine-topology importers: size bounds, the switch and PCIe models,
link-speed tables and connectivity checks.

Conventions (as in :mod:`collsynth.topology.model`): ``links[src][dst]`` counts bandwidth units
from ``src`` to ``dst``. For imported machines one unit is ONE physical link (one NVLink, one XGMI
link) in one direction, or one PCIe x16 port per GPU in the PCIe-only model. ``unit_gbps`` is
then the per-direction GB/s of one such link, when the input says which hardware it is.

Every metadata value built here is plain JSON (str, int, float, bool, None, lists, dicts with str
keys), so an imported topology can be saved with :func:`collsynth.topology.save_topology`.
"""

from __future__ import annotations

import re
from typing import Mapping, Sequence

from collsynth._parse import MAX_GBPS
from collsynth.errors import FileFormatError, InputTooLargeError
from collsynth.topology.model import BandwidthGroup, Topology

__all__ = [
    "MAX_INPUT_BYTES",
    "MAX_IMPORTED_GPUS",
    "MAX_NVLINKS_PER_GPU",
    "MAX_LINKS_PER_GPU",
    "check_input_size",
    "check_gpu_count",
    "switch_groups",
    "pcie_topology",
    "components",
    "nvlink_gbps_for_sm",
    "nvlink_gbps_for_model",
    "xgmi_gbps_for_gcn",
    "pcie_gbps",
]

#: Largest input (bytes, or characters for text) an importer reads. Real dumps are < 100 KiB.
MAX_INPUT_BYTES = 16 * 1024 * 1024

#: The most GPUs an imported machine may have. The tools describe one node (8 or 16 GPUs, 72 at
#: most for a rack-scale NVLink domain); the cap keeps an adversarial file from building a huge
#: matrix. Below :data:`~collsynth.topology.model.MAX_RANKS`.
MAX_IMPORTED_GPUS = 1024

#: The most NVLinks any NVIDIA GPU has (H100/H200 and B200: 18). A GPU whose NV# cells add up to
#: more than this cannot be linked point-to-point: it must sit on NVSwitches.
MAX_NVLINKS_PER_GPU = 18

#: The most links an import accepts between two GPUs, or of one GPU in all (NVLink, XGMI, to
#: NVSwitches): twice :data:`MAX_NVLINKS_PER_GPU`, room for one more hardware generation. A file
#: claiming more (10^12 NVLinks) describes no machine.
MAX_LINKS_PER_GPU = 2 * MAX_NVLINKS_PER_GPU


def check_input_size(size: int, source: str, *, max_bytes: int = MAX_INPUT_BYTES) -> None:
    """Refuse an input of ``size`` bytes (or characters) above ``max_bytes``, before any parsing.

    Raises
    ------
    InputTooLargeError
    """
    if size > max_bytes:
        raise InputTooLargeError(
            f"{source}: {size} bytes is more than the {max_bytes} a topology importer reads"
        )


def check_gpu_count(n: int, source: str, what: str) -> None:
    """Refuse fewer than two GPUs (nothing to synthesize) or more than :data:`MAX_IMPORTED_GPUS`.

    ``what`` names the GPUs found, e.g. ``"GPU0"``, for the message.
    """
    if n == 0:
        raise FileFormatError(source, "contains no GPUs")
    if n == 1:
        raise FileFormatError(
            source, f"only one GPU ({what}): a collective needs at least two, nothing to synthesize"
        )
    if n > MAX_IMPORTED_GPUS:
        raise InputTooLargeError(
            f"{source}: {n} GPUs is more than the {MAX_IMPORTED_GPUS} a machine-topology import "
            "accepts"
        )


def switch_groups(peers: Sequence[Sequence[int]], limits: Sequence[int],
                  ingress_limits: Sequence[int] | None = None) -> tuple[BandwidthGroup, ...]:
    """Per-GPU egress and ingress limits of a switch: rank ``r`` sends at most ``limits[r]`` units
    per round in total to ``peers[r]`` and receives at most ``ingress_limits[r]`` (default
    ``limits[r]``) from them. Ranks with no peers or a limit below 1 get no group.

    >>> [g.name for g in switch_groups([[1], [0]], [12, 12])]
    ['rank 0 switch egress', 'rank 0 switch ingress', 'rank 1 switch egress', 'rank 1 switch ingress']
    """
    ingress = limits if ingress_limits is None else ingress_limits
    groups: list[BandwidthGroup] = []
    for rank, (others, out_limit, in_limit) in enumerate(zip(peers, limits, ingress)):
        if not others:
            continue
        dests = frozenset(others)
        if out_limit >= 1:
            groups.append(BandwidthGroup(frozenset({rank}), dests, out_limit,
                                         f"rank {rank} switch egress"))
        if in_limit >= 1:
            groups.append(BandwidthGroup(dests, frozenset({rank}), in_limit,
                                         f"rank {rank} switch ingress"))
    return tuple(groups)


def pcie_topology(name: str, n: int, *, description: str, metadata: Mapping[str, object],
                  unit_gbps: float | None = None) -> Topology:
    """The PCIe-only model of ``n`` GPUs: every pair linked with 1 unit, and each GPU sends and
    receives at most 1 unit per round in total (its one PCIe x16 port), like ``hub:N``.

    One unit is one GPU's PCIe port in one direction (``unit_gbps``, when known). The PCIe tree
    (shared switches, the inter-socket link) is not modelled; the path types stay in metadata.

    >>> t = pcie_topology("p", 3, description="", metadata={})
    >>> t.bandwidth(0, 2), len(t.groups)
    (1, 6)
    """
    links = tuple(tuple(0 if a == b else 1 for b in range(n)) for a in range(n))
    peers = [[b for b in range(n) if b != a] for a in range(n)]
    return Topology(name=name, links=links, groups=switch_groups(peers, [1] * n),
                    unit_gbps=unit_gbps, description=description, metadata=dict(metadata))


def components(links: Sequence[Sequence[int]]) -> list[list[int]]:
    """The connected components of the link graph, ignoring direction, each sorted, in order of
    their smallest rank.

    >>> components([[0, 1, 0], [1, 0, 0], [0, 0, 0]])
    [[0, 1], [2]]
    """
    n = len(links)
    seen = [False] * n
    result: list[list[int]] = []
    for start in range(n):
        if seen[start]:
            continue
        seen[start] = True
        stack, comp = [start], []
        while stack:
            a = stack.pop()
            comp.append(a)
            for b in range(n):
                if not seen[b] and (links[a][b] or links[b][a]):
                    seen[b] = True
                    stack.append(b)
        result.append(sorted(comp))
    return result


# Per-direction GB/s of ONE link, from the vendors' datasheets:
# NVLink1 (P100, sm 60): 20; NVLink2 (V100, sm 70): 25; NVLink3 (A100, sm 80): 25;
# NVLink4 (H100/H200/H800, sm 90): 25; NVLink5 (B200, sm 100): 50.
_NVLINK_GBPS_BY_SM = {60: 20.0, 70: 25.0, 80: 25.0, 90: 25.0, 100: 50.0}
_NVLINK_GBPS_BY_MODEL = (
    (re.compile(r"\bP100\b", re.I), 20.0),
    (re.compile(r"\bV100", re.I), 25.0),
    (re.compile(r"\b(A100|A800)\b", re.I), 25.0),
    (re.compile(r"\b(GH200|H100|H200|H800|H20)\b", re.I), 25.0),
    (re.compile(r"\b(GB200|B200|B100)\b", re.I), 50.0),
)
# XGMI per-direction GB/s of one link: MI200 family (gfx90a, RCCL's numeric gcn 910): 50;
# MI300 family (gfx942): 64.
_XGMI_GBPS_BY_GCN = {"gfx90a": 50.0, "910": 50.0, "gfx942": 64.0, "942": 64.0}


def nvlink_gbps_for_sm(sm: int | None) -> float | None:
    """Per-direction GB/s of one NVLink for a data-centre GPU of compute capability ``sm``
    (NCCL's ``sm`` attribute: 70 for V100), or ``None`` when not known.

    >>> nvlink_gbps_for_sm(90), nvlink_gbps_for_sm(86)
    (25.0, None)
    """
    return _NVLINK_GBPS_BY_SM.get(sm) if sm is not None else None


def nvlink_gbps_for_model(model: str | None) -> float | None:
    """Per-direction GB/s of one NVLink for a GPU model name (``"NVIDIA H100 80GB HBM3"``), or
    ``None`` when the name is not recognised.

    >>> nvlink_gbps_for_model("Tesla V100-SXM2-32GB"), nvlink_gbps_for_model("RTX 3090")
    (25.0, None)
    """
    if not model:
        return None
    for pattern, gbps in _NVLINK_GBPS_BY_MODEL:
        if pattern.search(model):
            return gbps
    return None


def xgmi_gbps_for_gcn(gcn: str | None) -> float | None:
    """Per-direction GB/s of one XGMI link for an RCCL ``gcn`` attribute (``"gfx942"``), or
    ``None``.

    >>> xgmi_gbps_for_gcn("gfx942")
    64.0
    """
    return _XGMI_GBPS_BY_GCN.get((gcn or "").strip().lower())


_GTS = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*GT/s", re.I)


def pcie_gbps(link_speed: str | None, link_width: str | None) -> float | None:
    """Per-direction GB/s of a PCIe port from NCCL's ``link_speed`` (``"16.0 GT/s PCIe"``) and
    ``link_width`` (``"16"``) attributes, or ``None`` when either is missing or unusable.

    Gen1/2 (2.5, 5 GT/s) use 8b/10b encoding, Gen3 and later 128b/130b.

    >>> round(pcie_gbps("16.0 GT/s PCIe", "16"), 2)
    31.51
    >>> pcie_gbps("", "0") is None
    True
    """
    match = _GTS.match(link_speed or "")
    width_text = (link_width or "").strip()
    if not match or len(width_text) > 20 or len(match.group(1)) > 20:  # no int() of 5000 digits
        return None
    try:
        width = int(width_text) if width_text.isascii() else 0  # int() reads any script
    except ValueError:
        return None
    if width < 1:
        return None
    gts = float(match.group(1))
    if gts <= 0:
        return None
    efficiency = 0.8 if gts <= 5.0 else 128 / 130
    gbps = gts * width * efficiency / 8
    return gbps if gbps <= MAX_GBPS else None  # not a PCIe port: better unknown than absurd
