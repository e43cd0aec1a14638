"""Import the topology XML that NCCL (or RCCL) writes with ``NCCL_TOPO_DUMP_FILE``.

The file is untrusted input. It is refused above 16 MiB, when it is not UTF-8, and when it holds a
``<!DOCTYPE`` or ``<!ENTITY`` declaration (NCCL never writes one; an entity bomb is refused before
the parser sees it, never expanded). It is parsed by lxml with entity resolution, DTD loading,
network access and huge trees all off.

The details: ``docs/topologies.md``, section "NCCL's topology dump".
"""

from __future__ import annotations

import re
from collections import defaultdict
from typing import Iterable

from lxml import etree

from collsynth._parse import MAX_NUMBER_CHARS, shown
from collsynth.errors import FileFormatError
from collsynth.topology.importers._common import (
    MAX_LINKS_PER_GPU,
    check_gpu_count,
    check_input_size,
    components,
    nvlink_gbps_for_sm,
    pcie_gbps,
    pcie_topology,
    switch_groups,
    xgmi_gbps_for_gcn,
)
from collsynth.topology.model import Topology

__all__ = ["import_nccl_xml", "NVSWITCH_CLASS"]

#: PCI class of an NVSwitch ("bridge, other") in NCCL dumps.
NVSWITCH_CLASS = "0x068000"
_DECLARATION = re.compile(rb"<!\s*(DOCTYPE|ENTITY)", re.IGNORECASE)
_LINK_TAGS = ("nvlink", "xgmi")
_POSITION_SUFFIX = re.compile(r",\s*line \d+, column \d+\s*$")
_GPU_CLASS_PREFIXES = ("0x03", "0x12")


def _refuse_unsafe(raw: bytes, source: str) -> None:
    if raw.startswith((b"\xff\xfe", b"\xfe\xff")) or b"\x00" in raw:
        raise FileFormatError(source, "not UTF-8 text (UTF-16/32 or NUL bytes); NCCL writes "
                                      "topology XML in ASCII")
    match = _DECLARATION.search(raw)
    if match:
        line = raw.count(b"\n", 0, match.start()) + 1
        kind = match.group(1).decode("ascii").upper()
        raise FileFormatError(
            source, f"line {line}: a <!{kind} declaration; topology XML with a DTD or entity "
                    "declarations is refused without expanding it (NCCL never writes one)")


def _parse(raw: bytes, source: str) -> etree._Element:
    parser = etree.XMLParser(resolve_entities=False, no_network=True, load_dtd=False,
                             huge_tree=False, dtd_validation=False, remove_pis=True)
    try:
        root = etree.fromstring(raw, parser)
    except etree.XMLSyntaxError as exc:
        line, column = exc.position if exc.position else (exc.lineno, 0)
        reason = _POSITION_SUFFIX.sub("", str(exc.msg or exc))
        raise FileFormatError(source, f"malformed XML at line {line}, column {column}: "
                                      f"{reason}") from exc
    except (ValueError, etree.LxmlError) as exc:
        raise FileFormatError(source, f"unreadable XML: {exc}") from exc
    if root is None:
        raise FileFormatError(source, "empty XML document")
    if root.getroottree().docinfo.doctype:
        raise FileFormatError(source, "a DOCTYPE declaration; refused (NCCL never writes one)")
    return root


def _tag(element: etree._Element) -> str:
    return etree.QName(element).localname if isinstance(element.tag, str) else ""


#: Largest value of a whole-number attribute: NCCL holds them (dev, rank, sm) in a C int.
_MAX_ATTRIBUTE = (1 << 31) - 1


def _int(element: etree._Element, attribute: str, source: str, *, minimum: int = 0,
         maximum: int = _MAX_ATTRIBUTE, what: str = "") -> int | None:
    """The whole-number ``attribute`` of ``element`` from ``minimum`` to ``maximum``, or ``None``
    when absent. ``what`` says why ``maximum`` (for the message)."""
    value = element.get(attribute)
    if value is None:
        return None
    text = value.strip()
    if len(text) > MAX_NUMBER_CHARS:  # int() of thousands of digits raises, or takes long
        raise FileFormatError(
            source, f"line {element.sourceline}: <{_tag(element)} {attribute}={shown(value)}>: "
                    f"a number of {len(text)} characters; numbers have at most "
                    f"{MAX_NUMBER_CHARS}")
    try:
        if not text.isascii():  # int() reads any script's digits; NCCL's strtol does not
            raise ValueError(text)
        number = int(text, 0) if text.lower().startswith("0x") else int(text)
    except ValueError:
        number = None
    if number is None or number < minimum:
        raise FileFormatError(
            source, f"line {element.sourceline}: <{_tag(element)} {attribute}={shown(value)}>: "
                    f"expected a whole number >= {minimum}")
    if number > maximum:
        raise FileFormatError(
            source, f"line {element.sourceline}: <{_tag(element)} {attribute}={shown(value)}>: "
                    f"more than {maximum}{what}")
    return number


def _lenient_int(value: str | None) -> int | None:
    """A whole number for metadata only: ``None`` when absent, malformed or beyond 64 bits."""
    text = (value or "").strip()
    try:
        number = int(text) if len(text) <= 20 and text.isascii() else None
    except ValueError:
        return None
    return number if number is not None and abs(number) < 1 << 63 else None


def _busid(value: str | None) -> str:
    return (value or "").strip().lower()


def _check_root(root: etree._Element, source: str) -> None:
    tag = _tag(root)
    if tag == "graphs":
        raise FileFormatError(
            source, "root element is <graphs>: this is an NCCL graph file (NCCL_GRAPH_DUMP_FILE / "
                    "NCCL_GRAPH_FILE: channels of rings and trees), not a topology dump (root "
                    "<system>, from NCCL_TOPO_DUMP_FILE)")
    if tag != "system":
        raise FileFormatError(
            source, f"root element is <{tag}>, expected <system> (an NCCL/RCCL topology dump from "
                    "NCCL_TOPO_DUMP_FILE)")


def _refuse_skeleton(root: etree._Element, source: str) -> None:
    pcis = [e for e in root.iter() if _tag(e) == "pci"]
    gpu_class = sum(1 for e in pcis if (e.get("class") or "").lower().startswith(_GPU_CLASS_PREFIXES))
    raise FileFormatError(
        source, f"contains no GPUs with links: no <gpu> elements, only {len(pcis)} <pci> "
                f"elements ({gpu_class} of GPU class 0x03xxxx/0x12xxxx). This is a static skeleton "
                "(a file for NCCL_TOPO_FILE that NCCL completes at run time), not a topology dump "
                "from NCCL_TOPO_DUMP_FILE; it does not say how the GPUs are linked")


def _rank_order(gpus: list[etree._Element], source: str) -> tuple[list[etree._Element], str]:
    for attribute in ("rank", "dev"):
        values = [_int(g, attribute, source) for g in gpus]
        if all(v is not None for v in values) and len(set(values)) == len(values):
            ordered = sorted(zip(values, range(len(gpus)), gpus))
            return [g for _, _, g in ordered], f"{attribute} attribute"
    return gpus, "document order"


def _ancestors(element: etree._Element) -> Iterable[etree._Element]:
    parent = element.getparent()
    while parent is not None:
        yield parent
        parent = parent.getparent()


def _nics(root: etree._Element, gpu_elements: list[etree._Element]) -> list[dict[str, object]]:
    """Each ``<net>`` with the ranks below its top PCIe switch and below its CPU socket."""
    below: dict[etree._Element, set[int]] = defaultdict(set)
    for rank, gpu in enumerate(gpu_elements):
        for ancestor in _ancestors(gpu):
            below[ancestor].add(rank)
    nics = []
    for nic in (e for e in root.iter() if _tag(e) == "nic"):
        chain = list(_ancestors(nic))
        pcis = [a for a in chain if _tag(a) == "pci"]
        cpu = next((a for a in chain if _tag(a) == "cpu"), None)
        near = sorted(below.get(pcis[-1], ())) if pcis else []
        numa = sorted(below.get(cpu, ())) if cpu is not None else []
        for net in (c for c in nic if _tag(c) == "net"):
            nics.append({
                "name": net.get("name"),
                "busid": pcis[0].get("busid") if pcis else None,
                "numaid": cpu.get("numaid") if cpu is not None else None,
                "speed_mbps": _lenient_int(net.get("speed")),
                "near_ranks": near,
                "numa_ranks": numa,
            })
    return nics


def import_nccl_xml(data: str | bytes, *, name: str | None = None,
                    source: str = "<NCCL topology XML>", assume_pcie: bool = False) -> Topology:
    """Build a :class:`Topology` from an NCCL/RCCL topology dump (``NCCL_TOPO_DUMP_FILE``).

    Parameters
    ----------
    data:
        The XML, as text or bytes.
    name:
        The topology name (default ``"nccl-topology"``).
    source:
        Where it came from (a path), for error messages and ``metadata["source"]``.
    assume_pcie:
        Import a file whose GPUs have no NVLink/XGMI link as a PCIe-only machine instead of
        refusing it.

    Returns
    -------
    Topology
        One rank per ``<gpu>``; see docs/topologies.md for ordering and the link models.

    Raises
    ------
    FileFormatError
        Malformed or unsafe XML, a root other than ``<system>``, no GPUs, GPUs without links,
        one GPU only, or a malformed attribute.
    InputTooLargeError
        More than 16 MiB, or more than 1024 GPUs.

    Examples
    --------
    >>> xml = '''<system version="1"><cpu numaid="0">
    ...   <pci busid="0000:01:00.0" class="0x030200"><gpu dev="0" sm="80" rank="0">
    ...     <nvlink target="0000:02:00.0" count="12" tclass="0x030200"/></gpu></pci>
    ...   <pci busid="0000:02:00.0" class="0x030200"><gpu dev="1" sm="80" rank="1">
    ...     <nvlink target="0000:01:00.0" count="12" tclass="0x030200"/></gpu></pci>
    ... </cpu></system>'''
    >>> t = import_nccl_xml(xml)
    >>> t.links, t.unit_gbps, t.metadata["interconnect"]
    (((0, 12), (12, 0)), 25.0, 'nvlink')
    """
    raw = data.encode("utf-8") if isinstance(data, str) else bytes(data)
    check_input_size(len(raw), source)
    _refuse_unsafe(raw, source)
    root = _parse(raw, source)
    _check_root(root, source)

    found = [e for e in root.iter() if _tag(e) == "gpu"]
    if not found:
        _refuse_skeleton(root, source)
    for gpu in found:
        parent = gpu.getparent()
        if parent is None or _tag(parent) != "pci" or not _busid(parent.get("busid")):
            raise FileFormatError(
                source, f"line {gpu.sourceline}: <gpu> is not inside a <pci busid=...> element")
    gpus, rank_order = _rank_order(found, source)
    n = len(gpus)
    busids = [_busid(g.getparent().get("busid")) for g in gpus]
    rank_of = {b: r for r, b in enumerate(busids)}
    if len(rank_of) != n:
        raise FileFormatError(source, "two <gpu> elements share a <pci> busid")
    check_gpu_count(n, source, f"busid {busids[0]}" if busids else "")
    pci_class = {_busid(e.get("busid")): (e.get("class") or "").lower()
                 for e in root.iter() if _tag(e) == "pci" and e.get("busid")}

    warnings: list[str] = []
    p2p = [[0] * n for _ in range(n)]
    to_switch: list[dict[str, int]] = [defaultdict(int) for _ in range(n)]
    kinds: set[str] = set()
    ignored_self = 0
    for a, gpu in enumerate(gpus):
        for link in (c for c in gpu if _tag(c) in _LINK_TAGS):
            kind = _tag(link)
            target = _busid(link.get("target"))
            if not target:
                raise FileFormatError(source, f"line {link.sourceline}: <{kind}> has no target")
            count = _int(link, "count", source, minimum=1, maximum=MAX_LINKS_PER_GPU,
                         what=" links, the most an import accepts (a GPU has at most 18)")
            if count is None:
                raise FileFormatError(source, f"line {link.sourceline}: <{kind}> has no count")
            tclass = (link.get("tclass") or "").lower()
            if target == busids[a]:
                ignored_self += 1
                warnings.append(f"rank {a} ({busids[a]}): <{kind} count={count}> targets the GPU's "
                                "own busid; ignored (the peer is not named)")
            elif target in rank_of:
                p2p[a][rank_of[target]] += count
                kinds.add(kind)
            elif tclass == NVSWITCH_CLASS or pci_class.get(target) == NVSWITCH_CLASS:
                to_switch[a][target] += count
                kinds.add("nvswitch")
            else:
                warnings.append(f"rank {a} ({busids[a]}): <{kind} target={target} count={count} "
                                f"tclass={tclass or '?'}> goes to neither a GPU in this file nor an "
                                "NVSwitch (a CPU on POWER9?); ignored")

    gpu_info = [{"busid": busids[r], "dev": _int(g, "dev", source),
                 "nccl_rank": _int(g, "rank", source), "sm": _int(g, "sm", source),
                 "gcn": g.get("gcn"),
                 "numaid": next((c.get("numaid") for c in _ancestors(g) if _tag(c) == "cpu"), None)}
                for r, g in enumerate(gpus)]
    topo_name = name or "nccl-topology"
    metadata: dict[str, object] = {
        "source": source,
        "format": "NCCL topology XML" if (root.get("version") or "1") == "1" else "RCCL topology XML",
        "system_version": root.get("version"),
        "rank_order": rank_order,
        "gpus": gpu_info,
        "nics": _nics(root, gpus),
        "warnings": warnings,
    }

    if not kinds:
        note = (f"; its {ignored_self} link element(s) target their own GPU's busid and were "
                "ignored" if ignored_self else "")
        if not assume_pcie:
            raise FileFormatError(
                source, f"contains no GPUs with links: none of its {n} <gpu> elements has an "
                        f"<nvlink> or <xgmi> link to another GPU or to an NVSwitch{note}. Either "
                        "the GPUs share only PCIe or the file leaves the links out (hand-written "
                        "files do), and the file cannot tell which; pass assume_pcie=True to "
                        "import it as a PCIe-only machine")
        speeds = {pcie_gbps(g.getparent().get("link_speed"), g.getparent().get("link_width"))
                  for g in gpus}
        unit = speeds.pop() if len(speeds) == 1 else None
        metadata.update(interconnect="pcie",
                        unit="one GPU's PCIe port in one direction (from its link_speed and "
                             "link_width); the PCIe tree is not modelled",
                        link_model="no GPU link: PCIe only (assume_pcie=True), every pair 1 unit, "
                                   "per-GPU egress/ingress limit 1")
        return pcie_topology(topo_name, n, metadata=metadata, unit_gbps=unit,
                             description=f"{n} GPUs, PCIe only (from an NCCL topology dump)")

    for a in range(n):
        for b in range(a):
            if p2p[a][b] != p2p[b][a]:
                warnings.append(f"ranks {b} and {a} disagree on their link count (rank {b} says "
                                f"{p2p[b][a]}, rank {a} says {p2p[a][b]}); using "
                                f"{max(p2p[a][b], p2p[b][a])} both ways")
                p2p[a][b] = p2p[b][a] = max(p2p[a][b], p2p[b][a])
    via_switch = [[0 if a == b else sum(min(c, to_switch[b].get(s, 0)) for s, c in to_switch[a].items())
                   for b in range(n)] for a in range(n)]
    links = tuple(tuple(p2p[a][b] + via_switch[a][b] for b in range(n)) for a in range(n))
    switch_totals = [sum(to_switch[a].values()) for a in range(n)]
    peers = [[b for b in range(n) if via_switch[a][b]] for a in range(n)]
    groups = switch_groups(
        peers,
        [switch_totals[a] + sum(p2p[a][b] for b in peers[a]) for a in range(n)],
        [switch_totals[a] + sum(p2p[b][a] for b in peers[a]) for a in range(n)],
    )
    parts = components(links)
    if len(parts) > 1:
        warnings.append(f"the GPU link graph is disconnected (components {parts}); pairs without a "
                        "link talk over PCIe, which this model leaves out")

    sms = {info["sm"] for info in gpu_info}
    gcns = {info["gcn"] for info in gpu_info}
    if kinds == {"xgmi"}:
        unit_gbps = xgmi_gbps_for_gcn(gcns.pop()) if len(gcns) == 1 else None
        interconnect, unit = "xgmi", "one XGMI link in one direction"
    else:
        unit_gbps = nvlink_gbps_for_sm(sms.pop()) if len(sms) == 1 else None
        interconnect = "nvswitch" if "nvswitch" in kinds else "nvlink"
        unit = "one NVLink in one direction"
        if "xgmi" in kinds:
            interconnect, unit_gbps = "mixed", None
    per_gpu = [sum(p2p[a]) + switch_totals[a] for a in range(n)]
    for a in range(n):
        if per_gpu[a] > MAX_LINKS_PER_GPU:
            raise FileFormatError(
                source, f"rank {a} ({busids[a]}): its <nvlink>/<xgmi> counts add up to "
                        f"{per_gpu[a]} links, more than the {MAX_LINKS_PER_GPU} an import accepts "
                        "(a GPU has at most 18); not a real machine's dump")
    metadata.update(
        interconnect=interconnect, unit=unit, links_per_gpu=per_gpu,
        switches=sorted({s for counts in to_switch for s in counts}),
        link_model="point-to-point links add their counts; GPUs sharing NVSwitches get the sum "
                   "over shared switches of min(count) units, with per-GPU egress/ingress groups "
                   "limited to the GPU's switch link count")
    if interconnect == "nvswitch":
        low, high = min(switch_totals), max(switch_totals)
        shape = f"on NVSwitch, {low if low == high else f'{low}-{high}'} links per GPU"
    else:
        label = {"xgmi": "XGMI", "nvlink": "NVLink"}.get(interconnect, "NVLink and XGMI")
        shape = f"{label} point-to-point, up to {max(per_gpu)} links per GPU"
    return Topology(topo_name, links, groups, unit_gbps=unit_gbps, metadata=metadata,
                    description=f"{n} GPUs {shape} (from an NCCL topology dump)")
