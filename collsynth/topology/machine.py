"""What a runtime's tuning needs to know about a machine: :class:`MachineFacts`.

A topology file states them in ``metadata["machine"]`` (GPU architecture, intra-node link class,
NVSwitch and NVLS, network class, CPU vendor, each with its source); the NICs come from
``metadata["nic"]`` and the node count from the composition (:attr:`Topology.layout`). Families and
imported topologies get what their metadata tells, else ``None``. The fields, their values and the
defaults: ``docs/topologies.md``, section "Machine facts (collsynth.topology.machine)".
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any, Mapping

from collsynth.errors import InvalidTopologyError
from collsynth.topology.model import Topology

__all__ = ["MachineFacts", "machine_facts", "with_machine", "machine_metadata_problem",
           "INTRA_CLASSES", "NETWORK_CLASSES", "CPU_VENDORS", "NIC_PATHS", "MACHINE_FIELDS",
           "PCIE_GBPS", "DEFAULT_PCIE_GBPS"]

#: Links between the GPUs of one node (``neuronlink``: AWS Trainium, not an NCCL class).
INTRA_CLASSES = ("nvlink", "xgmi", "pcie", "neuronlink")
#: Networks between nodes.
NETWORK_CLASSES = ("ib", "roce", "efa", "slingshot", "tcp")
#: Host CPUs, as NCCL tells them apart (x86 Intel / x86 AMD / Arm / POWER).
CPU_VENDORS = ("intel", "amd", "arm", "power")
#: How a GPU reaches its NIC: under the same PCIe switch (``pcie``: NCCL's PIX / PXB paths, the
#: HGX / DGX / OAM platforms), through its own CPU over NVLink-C2C (``c2c``: Grace superchips;
#: NCCL's PHB path before 2.27, P2C from 2.27) or through the CPU's PCIe root (``cpu``: PHB).
NIC_PATHS = ("pcie", "c2c", "cpu")
#: The keys of ``metadata["machine"]`` besides ``source`` (and ``doc``), with their types.
MACHINE_FIELDS = {"arch": str, "intra_class": str, "nvswitch": bool, "nvls": bool,
                  "network_class": str, "cpu_vendor": str, "sharp": bool, "nic_path": str}
#: GB/s per direction of a GPU's PCIe x16 link to its host, by architecture: what a send between
#: two GPUs of a node with no direct link crosses (the runtime's P2P/SHM path through the host,
#: docs/runtime-model.md "Foreign programs"). Gen3 x16 carries about 12 GB/s of data (NCCL's own
#: PCI_BW, src/graph/topo.h), Gen4 twice that, Gen5 four times: V100 (Gen3), A100 and MI250
#: (Gen4), H100, B200, MI300X, MI325X and MI355X (Gen5).
PCIE_GBPS = {"sm70": 12.0, "sm80": 24.0, "sm90": 48.0, "sm100": 48.0,
             "gfx90a": 24.0, "gfx942": 48.0, "gfx950": 48.0}
#: The PCIe figure of an unknown architecture: NCCL's PCI_BW (Gen3 x16).
DEFAULT_PCIE_GBPS = 12.0
_ARCH = re.compile(r"^(?:sm(\d{2,3})|gfx[0-9a-f]{3,4}|trn\d)$")
_CHOICES = {"intra_class": INTRA_CLASSES, "network_class": NETWORK_CLASSES,
            "cpu_vendor": CPU_VENDORS, "nic_path": NIC_PATHS}


@dataclass(frozen=True)
class MachineFacts:
    """The facts about a machine that NCCL's and RCCL's tuning read.

    Parameters
    ----------
    arch:
        GPU architecture: ``"sm70"``, ``"sm80"``, ``"sm90"``, ``"sm100"`` (NVIDIA), ``"gfx90a"``,
        ``"gfx942"``, ``"gfx950"`` (AMD), ``"trn2"``; ``None`` when unknown.
    compute_capability:
        NVIDIA's compute capability as NCCL writes it (70, 80, 90, 100), from ``arch``; ``None``
        for other vendors or an unknown arch.
    intra_class:
        The links between the GPUs of a node: one of :data:`INTRA_CLASSES`, or ``None``.
    nvswitch, nvls:
        Whether the node's GPUs meet on NVSwitches, and whether the switches offer NVLink SHARP
        multicast (NCCL's NVLS algorithms: sm90 or later on NVSwitch).
    network_class:
        The network between nodes: one of :data:`NETWORK_CLASSES`, or ``None``.
    nodes, ranks_per_node:
        The composition (1 and every rank for a single node).
    nics_per_node, nic_gbps:
        NICs per node and GB/s per NIC per direction, ``None`` when not described.
    cpu_vendor:
        One of :data:`CPU_VENDORS` or ``None`` (NCCL picks its ``llMaxBws`` row and network
        overhead by it).
    sharp:
        Whether the network's switches reduce in line (InfiniBand SHARP), so that NCCL offers
        its CollNet algorithms and NVLS across nodes; ``False`` unless declared.
    nic_path:
        How a GPU reaches its NIC: one of :data:`NIC_PATHS`, or ``None`` (unknown: taken as
        ``pcie``). NCCL enables LL128 across nodes only over some of them.
    """

    arch: str | None
    compute_capability: int | None
    intra_class: str | None
    nvls: bool
    network_class: str | None
    nodes: int
    ranks_per_node: int
    nics_per_node: int | None
    nic_gbps: float | None
    cpu_vendor: str | None
    nvswitch: bool = False
    sharp: bool = False
    nic_path: str | None = None

    @property
    def num_ranks(self) -> int:
        return self.nodes * self.ranks_per_node

    @property
    def vendor(self) -> str | None:
        """``"nvidia"``, ``"amd"``, ``"aws"`` (Trainium) or ``None``, from ``arch``."""
        if self.arch is None:
            return None
        return {"sm": "nvidia", "gf": "amd", "tr": "aws"}[self.arch[:2]]

    @property
    def pcie_gbps(self) -> float:
        """GB/s per direction of a GPU's PCIe link to the host: :data:`PCIE_GBPS` by ``arch``,
        :data:`DEFAULT_PCIE_GBPS` for another or an unknown one."""
        return PCIE_GBPS.get(self.arch or "", DEFAULT_PCIE_GBPS)

    @property
    def runtime(self) -> str | None:
        """The collective runtime whose tuning applies: ``"nccl"``, ``"rccl"`` or ``None``."""
        return {"nvidia": "nccl", "amd": "rccl"}.get(self.vendor or "")


def machine_metadata_problem(raw: Any) -> str | None:
    """What is wrong with a ``metadata["machine"]`` value (one line), or ``None`` when it is
    absent or sound. Every key must be known, every value of its type and among its choices, and
    ``nvls`` true only with ``nvswitch`` true on ``sm90`` or later."""
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        return f"metadata.machine: expected an object, got {type(raw).__name__}"
    for key, value in raw.items():
        where = f"metadata.machine.{key}"
        if key in ("source", "doc"):
            if key == "source" and (not isinstance(value, Mapping) or not all(
                    k in MACHINE_FIELDS and isinstance(v, str) for k, v in value.items())):
                return (f"{where}: expected an object naming the source (text) of each of "
                        f"{', '.join(MACHINE_FIELDS)}")
            continue
        kind = MACHINE_FIELDS.get(key)
        if kind is None:
            return f"{where}: unknown field; expected {', '.join(MACHINE_FIELDS)}, source, doc"
        if value is None:
            continue  # unknown (with_machine clears a fact this way)
        if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
            return f"{where} = {value!r}: expected {'true or false' if kind is bool else 'a name'}"
        if key == "arch" and not _ARCH.match(value):
            return (f"{where} = {value!r}: expected an architecture like sm70, sm80, sm90, "
                    "sm100, gfx90a, gfx942, gfx950 or trn2")
        if key in _CHOICES and value not in _CHOICES[key]:
            return f"{where} = {value!r}: expected one of {', '.join(_CHOICES[key])}"
    if raw.get("sharp") and raw.get("network_class") not in (None, "ib"):
        return ("metadata.machine.sharp = true: SHARP is InfiniBand's in-network reduction, "
                f"got network_class = {raw.get('network_class')!r}")
    if raw.get("nvls"):
        capability = _capability(raw.get("arch"))
        if not raw.get("nvswitch") or capability is None or capability < 90:
            return ("metadata.machine.nvls = true: NVLink SHARP needs nvswitch = true and an "
                    f"arch of sm90 or later, got nvswitch = {raw.get('nvswitch')!r}, arch = "
                    f"{raw.get('arch')!r}")
    return None


def _capability(arch: Any) -> int | None:
    match = _ARCH.match(arch) if isinstance(arch, str) else None
    return int(match.group(1)) if match and match.group(1) else None


def _declared(topology: Topology) -> tuple[Mapping[str, Any], Mapping[str, Any]]:
    """``(machine facts declared, the node's metadata)``: a composed topology keeps its node's
    metadata under ``node_metadata``; a ``machine`` entry of its own overrides the node's."""
    meta = topology.metadata if isinstance(topology.metadata, Mapping) else {}
    node = meta.get("node_metadata")
    node = node if isinstance(node, Mapping) else meta
    merged: dict[str, Any] = {}
    for source in (node, meta) if node is not meta else (meta,):
        raw = source.get("machine")
        problem = machine_metadata_problem(raw)
        if problem is not None:
            raise InvalidTopologyError(f"topology {topology.name!r}: {problem}")
        merged.update({k: v for k, v in (raw or {}).items() if k in MACHINE_FIELDS})
    return merged, node


def _imported(node: Mapping[str, Any]) -> dict[str, Any]:
    """Defaults an importer's metadata gives: the GPUs' ``sm``/``gcn`` and the interconnect."""
    found: dict[str, Any] = {}
    gpus = node.get("gpus")
    if isinstance(gpus, list) and gpus and all(isinstance(g, Mapping) for g in gpus):
        sms = {g.get("sm") for g in gpus}
        gcns = {str(g.get("gcn")).split(":")[0] for g in gpus if g.get("gcn")}
        if len(sms) == 1 and isinstance(next(iter(sms)), int) and not gcns:
            found["arch"] = f"sm{next(iter(sms))}"
        elif len(gcns) == 1:
            found["arch"] = next(iter(gcns))
        if "arch" in found and not _ARCH.match(found["arch"]):
            del found["arch"]
    interconnect = node.get("interconnect")
    intra = {"nvswitch": "nvlink", "nvlink": "nvlink", "xgmi": "xgmi", "pcie": "pcie"}
    if interconnect in intra:
        found["intra_class"] = intra[interconnect]
        found["nvswitch"] = interconnect == "nvswitch"
        capability = _capability(found.get("arch"))
        found["nvls"] = bool(found["nvswitch"] and capability is not None and capability >= 90)
    return found


def _nics(topology: Topology, node: Mapping[str, Any]) -> tuple[int | None, float | None]:
    layout = topology.layout
    count: int | None = None
    gbps: float | None = None
    if layout is not None and layout.nic_gpus:
        count = len(layout.nic_gpus)
        gbps = layout.nic_gbps_declared if layout.nic_gbps_declared is not None \
            else layout.nic_gbps
    nic = node.get("nic")
    if isinstance(nic, Mapping):
        if count is None:
            gpus, per_gpu, declared = nic.get("gpus"), nic.get("per_gpu"), nic.get("count")
            if isinstance(gpus, list) and gpus:
                count = len(gpus)
            elif isinstance(declared, int) and not isinstance(declared, bool) and declared > 0:
                count = declared
            elif per_gpu is True:
                count = layout.ranks_per_node if layout else topology.num_ranks
        value = nic.get("gbps")
        if gbps is None and isinstance(value, (int, float)) and not isinstance(value, bool) \
                and value > 0:
            gbps = float(value)
    return count, gbps


def machine_facts(topology: Topology) -> MachineFacts:
    """The :class:`MachineFacts` of ``topology`` (see the module docstring for where each comes
    from).

    >>> from collsynth.topology.builtins import get_topology
    >>> facts = machine_facts(get_topology("dgx-h100"))
    >>> facts.arch, facts.compute_capability, facts.nvls, facts.network_class, facts.nics_per_node
    ('sm90', 90, True, 'ib', 8)
    >>> machine_facts(get_topology("ring:4")).arch is None
    True

    Raises
    ------
    InvalidTopologyError
        A malformed ``metadata["machine"]`` (see :func:`machine_metadata_problem`).
    """
    declared, node = _declared(topology)
    facts = {**_imported(node), **declared}
    layout = topology.layout
    nodes, per_node = (layout.nodes, layout.ranks_per_node) if layout else (1, topology.num_ranks)
    count, gbps = _nics(topology, node)
    arch = facts.get("arch")
    return MachineFacts(
        arch=arch, compute_capability=_capability(arch),
        intra_class=facts.get("intra_class"), nvls=bool(facts.get("nvls", False)),
        network_class=facts.get("network_class"), nodes=nodes, ranks_per_node=per_node,
        nics_per_node=count, nic_gbps=gbps, cpu_vendor=facts.get("cpu_vendor"),
        nvswitch=bool(facts.get("nvswitch", False)), sharp=bool(facts.get("sharp", False)),
        nic_path=facts.get("nic_path"))


def with_machine(topology: Topology, **changes: Any) -> Topology:
    """``topology`` with facts of :data:`MACHINE_FIELDS` set in its ``metadata["machine"]`` (a
    composed topology: in its own entry, which overrides its node's); ``None`` clears a fact.

    >>> from collsynth.topology.builtins import get_topology
    >>> from collsynth.topology.compose import compose_nodes
    >>> two = with_machine(compose_nodes(get_topology("dgx-h100"), 2), network_class="roce")
    >>> machine_facts(two).network_class, machine_facts(two).nodes
    ('roce', 2)

    Raises
    ------
    InvalidTopologyError
        An unknown fact, or a value :func:`machine_metadata_problem` refuses.
    """
    unknown = sorted(set(changes) - set(MACHINE_FIELDS))
    if unknown:
        raise InvalidTopologyError(f"topology {topology.name!r}: unknown machine fact(s) "
                                   f"{', '.join(unknown)}; expected {', '.join(MACHINE_FIELDS)}")
    meta = dict(topology.metadata) if isinstance(topology.metadata, Mapping) else {}
    machine = dict(meta.get("machine") or {})
    machine.update(changes)
    check, _ = _declared(dataclasses.replace(topology, metadata={**meta, "machine": machine}))
    # The combined facts (the node's and the override) must agree, e.g. nvls with the arch.
    problem = machine_metadata_problem(check)
    if problem is not None:
        raise InvalidTopologyError(f"topology {topology.name!r}: {problem}")
    return dataclasses.replace(topology, metadata={**meta, "machine": machine})
