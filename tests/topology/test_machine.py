"""Machine facts (collsynth.topology.machine): the built-ins, composition, overrides, imports and
malformed metadata.

The expected facts of the built-ins are written from the vendors' documents (the GPU's compute
capability or LLVM target, the fabric, the NICs, the host CPU), not read back from the files.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from collsynth.errors import FileFormatError, InvalidTopologyError
from collsynth.topology import compose_nodes, get_topology, load_topology, save_topology
from collsynth.topology.builtins import data_directory
from collsynth.topology.importers import import_topology_file
from collsynth.topology.machine import (
    MACHINE_FIELDS,
    MachineFacts,
    machine_facts,
    with_machine,
)

ROOT = Path(__file__).resolve().parents[2]
TOPOLOGIES = ROOT / "data" / "machine-topologies"

#: built-in -> (arch, cc, intra, nvswitch, nvls, network, cpu, ranks/node, NICs/node, GB/s per NIC)
BUILTINS = {
    # V100 = sm70; DGX-1: cube-mesh, 4x EDR (100 Gb/s = 12.5 GB/s), 2x Xeon E5-2698 v4
    "dgx1": ("sm70", 70, "nvlink", False, False, "ib", "intel", 8, 4, 12.5),
    # DGX-2: 16 V100 on NVSwitch gen 1 (no SHARP), 8x EDR, 2x Xeon Platinum 8168
    "dgx2": ("sm70", 70, "nvlink", True, False, "ib", "intel", 16, 8, 12.5),
    # A100 = sm80: NVSwitch but no NVLS; 8x HDR 200 Gb/s; 2x EPYC 7742
    "dgx-a100": ("sm80", 80, "nvlink", True, False, "ib", "amd", 8, 8, 25.0),
    # H100/H200 = sm90 on NVSwitch gen 3 (NVLS); 8x NDR 400 Gb/s; Xeon 8480C
    "dgx-h100": ("sm90", 90, "nvlink", True, True, "ib", "intel", 8, 8, 50.0),
    "dgx-h200": ("sm90", 90, "nvlink", True, True, "ib", "intel", 8, 8, 50.0),
    # B200 = sm100, NVLink5 switches (NVLS); 8x 400 Gb/s; Xeon 8570
    "dgx-b200": ("sm100", 100, "nvlink", True, True, "ib", "intel", 8, 8, 50.0),
    # one NVL72 rack = one NVLink domain of 72 (MNNVL); Grace = Arm
    "gb200-nvl72": ("sm100", 100, "nvlink", True, True, "ib", "arm", 72, 72, 50.0),
    # NDv2: the DGX-1 mesh, one EDR NIC per VM, Xeon 8168
    "ndv2": ("sm70", 70, "nvlink", False, False, "ib", "intel", 8, 1, 12.5),
    # NDv4: HGX A100, 8x HDR, EPYC 7V12
    "ndv4": ("sm80", 80, "nvlink", True, False, "ib", "amd", 8, 8, 25.0),
    # MI250X (Frontier node): gfx90a, 4 Slingshot NICs of 200 Gb/s, EPYC 7A53
    "mi250": ("gfx90a", None, "xgmi", False, False, "slingshot", "amd", 8, 4, 25.0),
    "mi250-16gcd": ("gfx90a", None, "xgmi", False, False, "ib", None, 16, 8, 25.0),
    # MI300X / MI325X = gfx942, MI355X = gfx950; 8x 400 Gb/s
    "mi300x": ("gfx942", None, "xgmi", False, False, "ib", "intel", 8, 8, 50.0),
    "mi325x": ("gfx942", None, "xgmi", False, False, "roce", None, 8, 8, 50.0),
    "mi355x": ("gfx950", None, "xgmi", False, False, "roce", "amd", 8, 8, 50.0),
    # Trainium2: not an NCCL machine; EFA 3200 Gb/s shared by 16 chips = 25 GB/s each
    "trn2": ("trn2", None, "neuronlink", False, False, "efa", None, 16, 16, 25.0),
    # GH200 quad node (Alps): H100 GPU = sm90, NVLink without NVSwitch (no NVLS), 4
    # Slingshot-11 NICs of 200 Gb/s, Grace = Arm
    "gh200x4": ("sm90", 90, "nvlink", False, False, "slingshot", "arm", 4, 4, 25.0),
}


def test_every_builtin_file_has_expected_facts():
    assert {p.stem for p in data_directory().glob("*.json")} == set(BUILTINS)


@pytest.mark.parametrize("name", sorted(BUILTINS))
def test_builtin_facts(name: str):
    arch, cc, intra, nvswitch, nvls, network, cpu, per_node, nics, gbps = BUILTINS[name]
    facts = machine_facts(get_topology(name))
    assert facts == MachineFacts(arch=arch, compute_capability=cc, intra_class=intra, nvls=nvls,
                                 network_class=network, nodes=1, ranks_per_node=per_node,
                                 nics_per_node=nics, nic_gbps=gbps, cpu_vendor=cpu,
                                 nvswitch=nvswitch,
                                 # the Grace superchip's NIC is reached through its CPU
                                 nic_path="c2c" if name == "gh200x4" else None)
    assert facts.runtime == {"sm": "nccl", "gf": "rccl", "tr": None}[arch[:2]]


@pytest.mark.parametrize("name", sorted(BUILTINS))
def test_every_builtin_fact_names_its_source(name: str):
    machine = json.loads((data_directory() / f"{name}.json").read_text())["metadata"]["machine"]
    # every fact but nic_path (stated where a NIC is not under the GPU's PCIe switch)
    required = set(MACHINE_FIELDS) - {"nic_path"}
    assert required | {"source", "doc"} <= set(machine) <= set(MACHINE_FIELDS) | {"source", "doc"}
    assert set(machine["source"]) == set(machine) - {"source", "doc"}
    assert all(len(text) > 10 for text in machine["source"].values())


def test_composition_carries_the_facts():
    two = compose_nodes(get_topology("dgx-h100"), 2)
    facts = machine_facts(two)
    assert (facts.nodes, facts.ranks_per_node, facts.num_ranks) == (2, 8, 16)
    assert (facts.arch, facts.nvls, facts.network_class, facts.cpu_vendor) == (
        "sm90", True, "ib", "intel")
    assert (facts.nics_per_node, facts.nic_gbps) == (8, 50.0)
    # DGX-1: 4 NICs shared by GPU pairs; 3 nodes.
    three = machine_facts(compose_nodes(get_topology("dgx1"), 3))
    assert (three.nodes, three.ranks_per_node, three.nics_per_node, three.nic_gbps) == (
        3, 8, 4, 12.5)
    # A NIC given in units: 2 units of the ring's 1 GB/s.
    ring = machine_facts(compose_nodes(get_topology("ring:4,unit_gbps=1"), 2, nic_units=2))
    assert (ring.nodes, ring.nics_per_node, ring.nic_gbps, ring.arch) == (2, 4, 2.0, None)


def test_with_machine_overrides_and_clears():
    two = compose_nodes(get_topology("dgx-h100"), 2)
    roce = with_machine(two, network_class="roce", cpu_vendor="amd")
    assert (machine_facts(roce).network_class, machine_facts(roce).cpu_vendor) == ("roce", "amd")
    assert machine_facts(two).network_class == "ib"  # the original is unchanged
    assert machine_facts(roce).arch == "sm90"  # the node's other facts stay
    cleared = with_machine(get_topology("dgx-a100"), cpu_vendor=None)
    assert machine_facts(cleared).cpu_vendor is None
    ring = with_machine(get_topology("ring:8"), arch="sm90", intra_class="nvlink", nvswitch=True,
                        nvls=True)
    assert machine_facts(ring).compute_capability == 90 and machine_facts(ring).nvls


@pytest.mark.parametrize("changes, message", [
    ({"network": "ib"}, r"unknown machine fact\(s\) network"),
    ({"network_class": "myrinet"}, r"metadata\.machine\.network_class = 'myrinet': expected one "
                                   r"of ib, roce"),
    ({"arch": "sm80"}, r"metadata\.machine\.nvls = true: NVLink SHARP needs nvswitch = true and "
                       r"an arch of sm90 or later"),
    ({"nvls": "yes"}, r"metadata\.machine\.nvls = 'yes': expected true or false"),
    ({"arch": "volta"}, r"metadata\.machine\.arch = 'volta': expected an architecture"),
])
def test_with_machine_refuses(changes: dict, message: str):
    with pytest.raises(InvalidTopologyError, match=message):
        with_machine(get_topology("dgx-h100"), **changes)


def test_families_know_nothing_but_their_size():
    assert machine_facts(get_topology("torus:4x4")) == MachineFacts(
        arch=None, compute_capability=None, intra_class=None, nvls=False, network_class=None,
        nodes=1, ranks_per_node=16, nics_per_node=None, nic_gbps=None, cpu_vendor=None)


@pytest.mark.parametrize("path, arch, intra, nvswitch, nvls", [
    # NCCL dump of an 8x H100 VM: <gpu sm="90">, NVSwitch links
    ("nccl_xml/ibmcloud_gx3d_8xH100_vsi.xml", "sm90", "nvlink", True, True),
    # 8x A100 on NVSwitch: sm80, so no NVLS
    ("nccl_xml/alibaba_hgx_8xA100_80G_cx6.xml", "sm80", "nvlink", True, False),
    # RCCL's MI300X model: gcn="gfx942", xGMI
    ("nccl_xml/rccl_8xMI300X_topo_8p_940.xml", "gfx942", "xgmi", False, False),
    # nvidia-smi shows no GPU architecture
    ("nvidia_smi/princeton_pli_hgx_8xH100_NV18.txt", None, "nvlink", True, False),
    ("rocm_smi/amd_8xMI308X_showtopo_ms_swift.txt", None, "xgmi", False, False),
])
def test_imported_topologies(path: str, arch, intra, nvswitch, nvls):
    facts = machine_facts(import_topology_file(TOPOLOGIES / path))
    assert (facts.arch, facts.intra_class, facts.nvswitch, facts.nvls) == (
        arch, intra, nvswitch, nvls)
    assert (facts.network_class, facts.cpu_vendor, facts.nodes) == (None, None, 1)


def _topology_file(tmp_path: Path, machine: object) -> Path:
    obj = json.loads((data_directory() / "dgx-a100.json").read_text())
    obj["metadata"]["machine"] = machine
    path = tmp_path / "t.json"
    path.write_text(json.dumps(obj))
    return path


@pytest.mark.parametrize("machine, message", [
    ({"arch": "sm80", "nvls": True, "nvswitch": True}, r"metadata\.machine\.nvls = true: NVLink "
                                                        r"SHARP needs"),
    ({"arch": 80}, r"metadata\.machine\.arch = 80: expected a name"),
    ({"intra_class": "infiniband"}, r"metadata\.machine\.intra_class = 'infiniband': expected "
                                    r"one of nvlink, xgmi, pcie, neuronlink"),
    ({"cpu": "intel"}, r"metadata\.machine\.cpu: unknown field"),
    ({"source": "the datasheet"}, r"metadata\.machine\.source: expected an object"),
    ({"source": {"arch": 1}}, r"metadata\.machine\.source: expected an object"),
    ("sm80", r"metadata\.machine: expected an object, got str"),
    ({"nvswitch": 1}, r"metadata\.machine\.nvswitch = 1: expected true or false"),
])
def test_bad_machine_metadata_in_a_file(tmp_path: Path, machine: object, message: str):
    path = _topology_file(tmp_path, machine)
    with pytest.raises(FileFormatError, match=message) as info:
        load_topology(path)
    assert str(info.value).startswith(str(path)) and "\n" not in str(info.value)


def test_machine_facts_survive_a_file_round_trip(tmp_path: Path):
    topology = with_machine(get_topology("mi300x"), network_class="roce")
    save_topology(topology, tmp_path / "m.json")
    assert machine_facts(load_topology(tmp_path / "m.json")) == machine_facts(topology)


def test_a_nic_behind_the_cpu_turns_ll128_off_across_nodes_before_2_27():
    """NCCL enables LL128 across nodes only over a GPU-NIC path of PXB or better (PXN on
    sm90+): v2.23.4 tuning.cc. A GH200's NIC hangs off its Grace CPU, reached over NVLink-C2C,
    which NCCL classes PHB until 2.27 added P2C (and LL128 over it: NCCL_LL128_C2C=1)."""
    from collsynth.timing.tuning_model import tuning_setup
    from collsynth.topology.machine import with_machine

    gh200 = get_topology("gh200x4")
    assert machine_facts(gh200).nic_path == "c2c"
    two = compose_nodes(gh200, 2)
    assert not tuning_setup(two, version=(2, 23)).ll128
    assert not tuning_setup(two, version=(2, 26)).ll128
    assert tuning_setup(two, version=(2, 27)).ll128
    assert tuning_setup(gh200, version=(2, 23)).ll128  # one node: no NIC on the path
    h100 = compose_nodes(get_topology("dgx-h100"), 2)  # NICs under the GPUs' PCIe switches
    assert machine_facts(h100).nic_path is None and tuning_setup(h100, version=(2, 23)).ll128
    assert not tuning_setup(with_machine(h100, nic_path="cpu")).ll128
    with pytest.raises(InvalidTopologyError, match="nic_path"):
        with_machine(h100, nic_path="nvlink")
