"""Tests of the machine-topology importers: every public sample in data/, and bad input.

Every file under ``data/machine-topologies/{nvidia_smi,rocm_smi,nccl_xml,other}`` has a
row in :data:`SAMPLES` (a test fails when a sample is added without one). A row states either the
expected link matrix (or its properties) or the refusal message.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Callable, Sequence

import pytest

from collsynth.errors import FileFormatError, InputTooLargeError
from collsynth.topology import Topology, topology_from_json, topology_to_json
from collsynth.topology.importers import (
    MAX_IMPORTED_GPUS,
    MAX_INPUT_BYTES,
    detect_format,
    import_nccl_xml,
    import_nvidia_smi,
    import_rocm_smi,
    import_topology_file,
)

ROOT = Path(__file__).resolve().parents[2]
SAMPLES_DIR = ROOT / "data" / "machine-topologies"
BAD = ROOT / "tests" / "fixtures" / "bad"
FOLDERS = ("nvidia_smi", "rocm_smi", "nccl_xml", "other")

#: msccl-tools' DGX1 matrix (collsynth's built-in DGX1), links[src][dst] in NVLinks.
DGX1 = (
    (0, 2, 1, 1, 2, 0, 0, 0),
    (2, 0, 1, 2, 0, 1, 0, 0),
    (1, 1, 0, 2, 0, 0, 2, 0),
    (1, 2, 2, 0, 0, 0, 0, 1),
    (2, 0, 0, 0, 0, 2, 1, 1),
    (0, 1, 0, 0, 2, 0, 1, 2),
    (0, 0, 2, 0, 1, 1, 0, 2),
    (0, 0, 0, 1, 1, 2, 2, 0),
)
#: The DGX-1 as the samples number it (nvidia-smi and NCCL agree): GPU0's NV1 peers are 1 and 2.
DGX1_AS_DUMPED = (
    (0, 1, 1, 2, 2, 0, 0, 0),
    (1, 0, 2, 1, 0, 2, 0, 0),
    (1, 2, 0, 2, 0, 0, 1, 0),
    (2, 1, 2, 0, 0, 0, 0, 1),
    (2, 0, 0, 0, 0, 1, 1, 2),
    (0, 2, 0, 0, 1, 0, 2, 1),
    (0, 0, 1, 0, 1, 2, 0, 2),
    (0, 0, 0, 1, 2, 1, 2, 0),
)


def _isomorphism(a: Sequence[Sequence[int]], b: Sequence[Sequence[int]]) -> list[int] | None:
    """A relabelling ``p`` with ``a[i][j] == b[p[i]][p[j]]`` for all i, j, or ``None``."""
    n = len(a)
    if n != len(b):
        return None
    mapping: list[int] = []
    used = [False] * n

    def extend(i: int) -> bool:
        if i == n:
            return True
        for candidate in range(n):
            if used[candidate] or sorted(a[i]) != sorted(b[candidate]):
                continue
            if all(a[i][j] == b[candidate][mapping[j]] and a[j][i] == b[mapping[j]][candidate]
                   for j in range(i)):
                used[candidate] = True
                mapping.append(candidate)
                if extend(i + 1):
                    return True
                mapping.pop()
                used[candidate] = False
        return False

    return mapping if extend(0) else None


def _all_pairs(n: int, units: int) -> tuple[tuple[int, ...], ...]:
    return tuple(tuple(0 if a == b else units for b in range(n)) for a in range(n))


# -- expectations ------------------------------------------------------------------------------

def dgx1_cube_mesh(t: Topology) -> None:
    assert t.num_ranks == 8
    assert t.links == DGX1_AS_DUMPED
    assert _isomorphism(t.links, DGX1) is not None, "not the msccl-tools DGX1 up to numbering"
    assert t.groups == ()
    assert t.metadata["interconnect"] == "nvlink"
    assert all(sum(row) == 6 for row in t.links)


def nvswitch(n: int, limit: int, unit_gbps: float | None) -> Callable[[Topology], None]:
    def check(t: Topology) -> None:
        assert t.num_ranks == n
        assert t.links == _all_pairs(n, limit)
        assert t.metadata["interconnect"] == "nvswitch"
        assert t.unit_gbps == unit_gbps
        assert len(t.groups) == 2 * n
        for rank in range(n):
            others = frozenset(range(n)) - {rank}
            egress = [g for g in t.groups if g.sources == {rank}]
            ingress = [g for g in t.groups if g.destinations == {rank}]
            assert [(g.destinations, g.limit) for g in egress] == [(others, limit)]
            assert [(g.sources, g.limit) for g in ingress] == [(others, limit)]
        assert len(t.effective_groups) == 2 * n  # NV# to each of n-1 peers exceeds NV# in total
    return check


def point_to_point(links: Sequence[Sequence[int]], interconnect: str, unit_gbps: float | None,
                   *, disconnected: bool = False) -> Callable[[Topology], None]:
    def check(t: Topology) -> None:
        assert t.links == tuple(tuple(row) for row in links)
        assert t.groups == ()
        assert t.metadata["interconnect"] == interconnect
        assert t.unit_gbps == unit_gbps
        assert any("disconnected" in w for w in t.metadata["warnings"]) == disconnected
    return check


def pcie(n: int) -> Callable[[Topology], None]:
    def check(t: Topology) -> None:
        assert t.links == _all_pairs(n, 1)
        assert t.metadata["interconnect"] == "pcie"
        assert sorted(g.limit for g in t.groups) == [1] * (2 * n)
    return check


def refused(pattern: str) -> str:
    return pattern


AC922 = ((0, 3, 0, 0), (3, 0, 0, 0), (0, 0, 0, 3), (0, 0, 3, 0))
NCV4_BRIDGES = ((0, 12, 0, 0), (12, 0, 0, 0), (0, 0, 0, 12), (0, 0, 12, 0))
MI250_GCDS = (  # RCCL topo_8p_90a: every GCD has 3 XGMI peers
    (0, 1, 1, 0, 0, 0, 1, 0),
    (1, 0, 0, 1, 0, 1, 0, 0),
    (1, 0, 0, 1, 1, 0, 0, 0),
    (0, 1, 1, 0, 0, 0, 0, 1),
    (0, 0, 1, 0, 0, 1, 1, 0),
    (0, 1, 0, 0, 1, 0, 0, 1),
    (1, 0, 0, 0, 1, 0, 0, 1),
    (0, 0, 0, 1, 0, 1, 1, 0),
)
SKELETON = r"contains no GPUs with links: no <gpu> elements, only \d+ <pci> elements .* static skeleton"
NO_LINKS = r"contains no GPUs with links: none of its 8 <gpu> elements has an <nvlink> or <xgmi> link"

SAMPLES: dict[str, Callable[[Topology], None] | str] = {
    # nvidia-smi topo -m
    "nvidia_smi/dgx1_v100_msccl_tools.txt": dgx1_cube_mesh,
    "nvidia_smi/v100x8_vm_p3like_likejazz.txt": dgx1_cube_mesh,
    "nvidia_smi/dgx1_topo_mp_gengwg_cheatsheets.txt": refused(
        r"this is nvidia-smi topo -mp output \(its legend has no NV# line\).*hides NVLink"),
    "nvidia_smi/princeton_traverse_ac922_4xV100_NV3.txt": point_to_point(
        AC922, "nvlink", None, disconnected=True),
    "nvidia_smi/dgx_a100_gengwg_cheatsheets.txt": nvswitch(8, 12, None),
    "nvidia_smi/a100x8_NIC10_litgpt_fixture.txt": nvswitch(8, 12, None),
    "nvidia_smi/a100x8_NV12_spaces_stas00.txt": nvswitch(8, 12, None),
    "nvidia_smi/h800_nv8_llm_action_crlf_spaces.txt": nvswitch(8, 8, None),
    "nvidia_smi/princeton_pli_hgx_8xH100_NV18.txt": nvswitch(8, 18, None),
    "nvidia_smi/hgx_8xH200_NV18_distributedai.txt": nvswitch(8, 18, None),
    "nvidia_smi/princeton_della_2xA100_noNVLink.txt": pcie(2),
    # rocm-smi --showtopo
    "rocm_smi/amd_8xMI308X_showtopo_ms_swift.txt": point_to_point(_all_pairs(8, 1), "xgmi", None),
    "rocm_smi/amd_4xMI300A_showtopo_mzank_HIP.txt": point_to_point(_all_pairs(4, 1), "xgmi", None),
    "rocm_smi/amd_4xMI210_showtopo_archer2.txt": point_to_point(_all_pairs(4, 1), "xgmi", None),
    # NCCL / RCCL topology XML
    "nccl_xml/dgx1_v100_nvlink_p2p_ucb_blinkplus.xml": dgx1_cube_mesh,
    "nccl_xml/azure_ncv4_A100_PCIe_nvbridge_2023.xml": point_to_point(
        NCV4_BRIDGES, "nvlink", 25.0, disconnected=True),
    "nccl_xml/azure_ncv4_A100_PCIe.xml": refused(
        r"contains no GPUs with links: none of its 4 <gpu> elements .*its 4 link element\(s\) "
        r"target their own GPU's busid and were ignored"),
    "nccl_xml/alibaba_hgx_8xA100_80G_cx6.xml": nvswitch(8, 12, 25.0),
    "nccl_xml/ibmcloud_gx3d_8xH100_vsi.xml": nvswitch(8, 18, 25.0),
    "nccl_xml/rccl_8xMI300X_topo_8p_940.xml": point_to_point(_all_pairs(8, 1), "xgmi", 64.0),
    "nccl_xml/rccl_8xgfx90a_topo_8p_90a.xml": point_to_point(MI250_GCDS, "xgmi", 50.0),
    "nccl_xml/pcie_8xRTX3090_panlichen.xml": refused(NO_LINKS),
    "nccl_xml/aws_p5.48xlarge_pr1226.xml": refused(NO_LINKS),
    "nccl_xml/aws_p4d.24xlarge_static.xml": refused(SKELETON),
    "nccl_xml/aws_p4de.24xlarge_static.xml": refused(SKELETON),
    "nccl_xml/aws_p5.48xlarge_static.xml": refused(SKELETON),
    "nccl_xml/aws_g5.48xlarge_static.xml": refused(SKELETON),
    "nccl_xml/azure_ndv2_static.xml": refused(SKELETON),
    "nccl_xml/azure_ndv4_static.xml": refused(SKELETON),
    "nccl_xml/azure_ndv5_static.xml": refused(SKELETON),
    # negative sample
    "other/azure_ncv4_nccl_graph_NOT_topology.xml": refused(
        r"root element is <graphs>: this is an NCCL graph file .* not a topology dump"),
}


def _need_samples() -> None:
    if not SAMPLES_DIR.is_dir():
        pytest.fail(f"{SAMPLES_DIR} is missing: the samples ship with the repository (data/)")


def _sample(relative: str) -> Path:
    _need_samples()
    return SAMPLES_DIR / relative


# -- every sample ------------------------------------------------------------------------------

def test_every_sample_has_an_expectation() -> None:
    _need_samples()
    present = {f"{p.parent.name}/{p.name}" for folder in FOLDERS
               for p in (SAMPLES_DIR / folder).iterdir() if p.is_file()}
    assert present == set(SAMPLES)


@pytest.mark.parametrize("relative", sorted(SAMPLES))
def test_sample(relative: str) -> None:
    path = _sample(relative)
    expected = SAMPLES[relative]
    if isinstance(expected, str):
        with pytest.raises(FileFormatError, match=expected) as info:
            import_topology_file(path)
        assert info.value.path == str(path)
        return
    topology = import_topology_file(path)
    expected(topology)
    assert topology.name == path.stem
    assert topology.metadata["source"] == str(path)
    # Metadata is plain JSON, so an imported machine can be saved and read back.
    again = topology_from_json(json.loads(json.dumps(topology_to_json(topology))))
    assert again == topology


# -- details of the samples --------------------------------------------------------------------

def test_nvidia_smi_nics_and_affinity() -> None:
    dgx1 = import_topology_file(_sample("nvidia_smi/dgx1_v100_msccl_tools.txt"))
    nics = {nic["device"]: nic["near_ranks"] for nic in dgx1.metadata["nics"]}
    assert nics == {"mlx5_0": [0, 1], "mlx5_2": [4, 5], "mlx5_1": [2, 3], "mlx5_3": [6, 7]}
    assert dgx1.metadata["gpu_affinity"][4] == {"CPU Affinity": "20-39,60-79"}

    h200 = import_topology_file(_sample("nvidia_smi/hgx_8xH200_NV18_distributedai.txt"))
    nics = h200.metadata["nics"]
    assert [nic["device"] for nic in nics] == [f"mlx5_{i}" for i in range(12)]
    assert nics[0]["column"] == "NIC0" and nics[0]["near_ranks"] == [0]
    assert nics[1]["near_ranks"] == []  # NODE to every GPU
    assert h200.metadata["gpu_affinity"][0] == {
        "CPU Affinity": "0-55,112-167", "NUMA Affinity": "0", "GPU NUMA ID": "N/A"}

    pli = import_topology_file(_sample("nvidia_smi/princeton_pli_hgx_8xH100_NV18.txt"))
    assert pli.metadata["gpu_affinity"][0]["CPU Affinity"] is None  # empty cell kept as unknown
    assert pli.metadata["gpu_affinity"][0]["NUMA Affinity"] == "0"


def test_nvidia_smi_gpu_model_sets_unit_gbps() -> None:
    text = _sample("nvidia_smi/princeton_pli_hgx_8xH100_NV18.txt").read_text()
    assert import_nvidia_smi(text, gpu_model="NVIDIA H100 80GB HBM3").unit_gbps == 25.0
    unknown = import_nvidia_smi(text, gpu_model="Mystery GPU")
    assert unknown.unit_gbps is None
    assert "not recognised" in unknown.metadata["warnings"][0]


def test_nvidia_smi_topo_mp_imported_as_pcie_on_request() -> None:
    t = import_topology_file(_sample("nvidia_smi/dgx1_topo_mp_gengwg_cheatsheets.txt"),
                             assume_pcie=True)
    pcie(8)(t)
    assert t.metadata["format"] == "nvidia-smi topo -mp"
    assert "hides NVLink" in t.metadata["warnings"][0]
    assert t.metadata["paths"][0][:4] == ["X", "PIX", "PHB", "PHB"]


def test_rocm_smi_metadata() -> None:
    t = import_topology_file(_sample("rocm_smi/amd_8xMI308X_showtopo_ms_swift.txt"))
    assert t.metadata["weight"][0] == [0, 15, 15, 15, 15, 15, 15, 15]
    assert t.metadata["link_type"][7][0] == "XGMI"
    assert t.metadata["numa_node"] == ["0"] * 4 + ["1"] * 4
    old = import_topology_file(_sample("rocm_smi/amd_4xMI210_showtopo_archer2.txt"))
    assert old.metadata["numa_node"] == ["0", "1", "2", "3"]  # the older 'GPU 0   :' layout


def test_nccl_xml_metadata() -> None:
    t = import_topology_file(_sample("nccl_xml/alibaba_hgx_8xA100_80G_cx6.xml"))
    assert t.metadata["rank_order"] == "rank attribute"
    assert len(t.metadata["switches"]) == 6
    assert [g["sm"] for g in t.metadata["gpus"]] == [80] * 8
    nics = {nic["name"]: nic for nic in t.metadata["nics"]}
    assert nics["mlx5_bond_1"]["near_ranks"] == [0, 1]
    assert nics["mlx5_bond_0"]["near_ranks"] == []  # its own PCIe root, no GPU below it


def test_nccl_xml_own_busid_quirk_imported_as_pcie_on_request() -> None:
    t = import_topology_file(_sample("nccl_xml/azure_ncv4_A100_PCIe.xml"), assume_pcie=True)
    pcie(4)(t)
    warnings = t.metadata["warnings"]
    assert len(warnings) == 4 and all("targets the GPU's own busid; ignored" in w for w in warnings)
    assert t.unit_gbps is None  # link_speed="" link_width="0"


def test_nccl_xml_pcie_only_on_request() -> None:
    t = import_topology_file(_sample("nccl_xml/pcie_8xRTX3090_panlichen.xml"), assume_pcie=True)
    pcie(8)(t)
    assert t.unit_gbps == pytest.approx(16 * 16 * 128 / 130 / 8)  # PCIe 4.0 x16, per direction


# -- rules shown on small inputs ---------------------------------------------------------------

def _smi(cells: Sequence[Sequence[str]]) -> str:
    n = len(cells)
    header = "\t" + "\t".join(f"GPU{i}" for i in range(n)) + "\tCPU Affinity\tNUMA Affinity\n"
    return header + "".join(f"GPU{i}\t" + "\t".join(row) + "\t0-7\t0\n" for i, row in enumerate(cells))


def _uniform(n: int, cell: str) -> list[list[str]]:
    return [[" X " if a == b else cell for b in range(n)] for a in range(n)]


def test_nvidia_smi_full_mesh_of_four_is_point_to_point() -> None:
    # HGX A100 4-GPU: 12 links per GPU as NV4 to each of 3 peers, no switch.
    t = import_nvidia_smi(_smi(_uniform(4, "NV4")))
    assert t.metadata["interconnect"] == "nvlink" and t.groups == ()
    assert t.links == _all_pairs(4, 4)


def test_nvidia_smi_switch_slices() -> None:
    # Three GPUs of an H800 board: NV8 is the per-GPU total, so a switch, not 16 links each.
    t = import_nvidia_smi(_smi(_uniform(3, "NV8")))
    assert t.metadata["interconnect"] == "nvswitch"
    assert {g.limit for g in t.groups} == {8}
    # Two GPUs: both models agree; it is imported as one 18-link pair.
    pair = import_nvidia_smi(_smi(_uniform(2, "NV18")))
    assert pair.links == ((0, 18), (18, 0)) and pair.metadata["interconnect"] == "nvlink"


def test_nvidia_smi_space_aligned_crlf_and_prompt() -> None:
    text = ("$ nvidia-smi topo -m\r\n      GPU0  GPU1  CPU Affinity  NUMA Affinity\r\n"
            "GPU0   X    NV2   0-7           0\r\nGPU1  NV2    X    0-7           0\r\n")
    t = import_nvidia_smi(text)
    assert t.links == ((0, 2), (2, 0))
    assert t.metadata["gpu_affinity"][1] == {"CPU Affinity": "0-7", "NUMA Affinity": "0"}


def test_nccl_xml_rank_order_and_hidden_switch() -> None:
    def gpu(busid: str, attrs: str) -> str:
        return (f'<pci busid="{busid}" class="0x030200"><gpu {attrs} sm="90">'
                '<nvlink target="fffffff:ff:ff.0" count="18" tclass="0x068000"/></gpu></pci>')

    xml = ('<system version="1"><cpu numaid="0">' + gpu("0000:03:00.0", 'dev="1"')
           + gpu("0000:02:00.0", 'dev="2"') + gpu("0000:01:00.0", 'dev="0"') + "</cpu></system>")
    t = import_nccl_xml(xml)
    assert t.metadata["rank_order"] == "dev attribute"
    assert [g["busid"] for g in t.metadata["gpus"]] == ["0000:01:00.0", "0000:03:00.0", "0000:02:00.0"]
    nvswitch(3, 18, 25.0)(t)
    no_dev = import_nccl_xml(re.sub(r' dev="\d"', "", xml))
    assert no_dev.metadata["rank_order"] == "document order"


def test_nccl_xml_non_gpu_target_is_dropped_with_warning() -> None:
    xml = ('<system version="1"><cpu numaid="0">'
           '<pci busid="0000:01:00.0" class="0x030200"><gpu dev="0" sm="70">'
           '<nvlink target="0000:02:00.0" count="3"/><nvlink target="0000:00:00.0" count="3"/>'
           '</gpu></pci><pci busid="0000:02:00.0" class="0x030200"><gpu dev="1" sm="70">'
           '<nvlink target="0000:01:00.0" count="2"/></gpu></pci></cpu></system>')
    t = import_nccl_xml(xml)
    assert t.links == ((0, 3), (3, 0))
    warnings = " ".join(t.metadata["warnings"])
    assert "goes to neither a GPU in this file nor an NVSwitch" in warnings
    assert ("ranks 0 and 1 disagree on their link count (rank 0 says 3, rank 1 says 2); "
            "using 3") in warnings


# -- bad input ---------------------------------------------------------------------------------

BAD_CASES = {
    "nvidia_smi_truncated.txt":
        r"line 4: row GPU2 has 2 cells, expected 4 \(one per column GPU0\.\.GPU3\); the matrix "
        r"looks truncated",
    "nvidia_smi_missing_rows.txt":
        r"the matrix is incomplete: the header \(line 1\) names 4 GPUs \(GPU0\.\.GPU3\) but no "
        r"row for GPU2, GPU3 follows",
    "nvidia_smi_unknown_cell.txt": r"line 2: row GPU0, column GPU1: unknown cell 'QPI'",
    "nvidia_smi_single_gpu.txt": r"only one GPU \(GPU0\): .* nothing to synthesize",
    "nvidia_smi_asymmetric.txt":
        r"the NVLink counts are not symmetric: row GPU1 says NV1 to GPU0 but row GPU0 says NV2",
    "nvidia_smi_mixed_counts_too_many.txt":
        r"row GPU0 adds up to 30 NVLinks, more than the 18 a GPU has, but its NV# values differ",
    "rocm_smi_truncated.txt":
        r"the 'Weight between two GPUs' table \(line 2\) has 2 rows for 4 columns; the output "
        r"looks truncated",
    "rocm_smi_mismatched_tables.txt":
        r"the 'Weight between two GPUs' table \(line 1\) has columns GPU0 GPU1 GPU2, but the "
        r"'Link Type between two GPUs' table has GPU0 GPU1",
    "rocm_smi_hops_only.txt": r"no 'Link Type between two GPUs' or 'Weight between two GPUs' table",
    "rocm_smi_bad_weight.txt": r"row GPU0, column GPU1 is 'fifteen', expected a whole number",
    "nccl_xml_doctype_entity.xml":
        r"line 2: a <!DOCTYPE declaration; topology XML with a DTD or entity declarations is "
        r"refused without expanding it",
    "nccl_xml_external_entity.xml": r"line 1: a <!DOCTYPE declaration",
    "nccl_xml_malformed.xml": r"malformed XML at line 9, column 1: Premature end of data in tag system",
    "nccl_xml_wrong_root.xml": r"root element is <topology>, expected <system>",
    "nccl_xml_bad_count.xml": r"line 5: <nvlink count='twelve'>: expected a whole number >= 1",
    "nccl_xml_gpu_outside_pci.xml": r"line 3: <gpu> is not inside a <pci busid=\.\.\.> element",
    "nccl_xml_one_gpu.xml": r"only one GPU \(busid 0000:01:00\.0\)",
    "nccl_xml_count_1e20.xml": r"line 5: <nvlink count='100000000000000000000'>: more than 36 "
                               r"links, the most an import accepts",
    "nccl_xml_10e12_nvlinks.xml": r"line 5: <nvlink count='1000000000000'>: more than 36 links",
    "nccl_xml_links_add_up_to_54.xml": r"rank 0 \(0000:01:00\.0\): its <nvlink>/<xgmi> counts add "
                                       r"up to 54 links, more than the 36 an import accepts",
    "nccl_xml_5000_digit_rank.xml": r"line 9: <gpu rank='9{36}\.\.\.>: a number of 5000 "
                                    r"characters; numbers have at most 100",
    "nvidia_smi_nv_1e12.txt": r"row GPU0, column GPU1: 'NV1000000000000' is more than the 36 "
                              r"links an import accepts between two GPUs",
    "nvidia_smi_5000_digit_count.txt": r"row GPU0, column GPU1: 'NV1{34}\.\.\. is more than the "
                                       r"36 links",
    "rocm_smi_5000_digit_weight.txt": r"row GPU0, column GPU1 is '1{36}\.\.\., expected a whole "
                                      r"number",
    "unknown_format.txt": r"not a recognised topology file: expected an NCCL/RCCL topology XML",
    "empty.txt": r"the file is empty",
}


# Fixtures of collsynth's own file formats (algorithm_, collective_, topology_) are tested in
# tests/test_fileformats.py; every other bad fixture is an importer case.
OWN_FORMATS = ("algorithm_", "collective_", "topology_", "log_", "trace_")


def test_every_bad_fixture_has_a_case() -> None:
    importer_fixtures = {p.name for p in BAD.iterdir() if not p.name.startswith(OWN_FORMATS)}
    assert importer_fixtures == set(BAD_CASES)


@pytest.mark.parametrize("filename", sorted(BAD_CASES))
def test_bad_input(filename: str) -> None:
    path = BAD / filename
    with pytest.raises(FileFormatError, match=BAD_CASES[filename]) as info:
        import_topology_file(path)
    assert info.value.path == str(path)


def test_entity_bomb_refused_as_text_and_bytes_without_expansion() -> None:
    data = (BAD / "nccl_xml_doctype_entity.xml").read_bytes()
    for payload in (data, data.decode()):
        with pytest.raises(FileFormatError, match="<!DOCTYPE declaration"):
            import_nccl_xml(payload)
    # The same document in UTF-16 cannot slip past the byte-level check.
    with pytest.raises(FileFormatError, match="not UTF-8"):
        import_nccl_xml(data.decode().encode("utf-16"))


def test_malformed_xml_error_chains_the_parser_error() -> None:
    with pytest.raises(FileFormatError) as info:
        import_topology_file(BAD / "nccl_xml_malformed.xml")
    assert info.value.__cause__ is not None


def test_oversize_file_refused_before_reading(tmp_path: Path) -> None:
    big = tmp_path / "huge.xml"
    with big.open("wb") as handle:
        handle.truncate(MAX_INPUT_BYTES + 1)  # sparse: nothing is written or read
    with pytest.raises(InputTooLargeError, match="more than the"):
        import_topology_file(big)
    with pytest.raises(InputTooLargeError):
        import_nvidia_smi(" " * (MAX_INPUT_BYTES + 1))


def test_too_many_gpus_refused() -> None:
    gpus = "".join(f'<pci busid="0000:{i // 256:02x}:{i % 256:02x}.0"><gpu dev="{i}"/></pci>'
                   for i in range(MAX_IMPORTED_GPUS + 1))
    with pytest.raises(InputTooLargeError, match=f"{MAX_IMPORTED_GPUS + 1} GPUs is more than"):
        import_nccl_xml(f'<system version="1"><cpu>{gpus}</cpu></system>')


def test_missing_file_and_directory(tmp_path: Path) -> None:
    with pytest.raises(FileFormatError, match="no such file"):
        import_topology_file(tmp_path / "absent.txt")
    with pytest.raises(FileFormatError, match="is a directory"):
        import_topology_file(tmp_path)


def test_detect_format() -> None:
    assert detect_format(b"\n  <!-- c --><system/>") == "nccl-xml"
    assert detect_format(b"\tGPU0\tGPU1\nGPU0\t X \tNV1\n") == "nvidia-smi"
    assert detect_format(b"=== Weight between two GPUs ===\n") == "rocm-smi"
    assert detect_format(b"\xff\xfe\x00garbage") is None


def test_direct_importers_name_their_source() -> None:
    with pytest.raises(FileFormatError, match=r"^<nvidia-smi topo -m>: no nvidia-smi topo -m header"):
        import_nvidia_smi("nothing here")
    with pytest.raises(FileFormatError, match=r"^<rocm-smi --showtopo>: no 'Link Type"):
        import_rocm_smi("nothing here")
    with pytest.raises(FileFormatError, match=re.escape("machine.xml: malformed XML")):
        import_nccl_xml("<system>", source="machine.xml")


def test_a_file_name_with_control_characters_gives_a_printable_name(tmp_path) -> None:
    """The topology name comes from the file name when none is given; an escape sequence or a
    bidirectional override in it must not reach tables and XML (each becomes '?')."""
    source = _sample("nvidia_smi/dgx1_v100_msccl_tools.txt")
    hostile = tmp_path / "dgx\x1b[2J\u202eevil.txt"
    hostile.write_bytes(source.read_bytes())
    topology = import_topology_file(hostile)
    assert topology.name == "dgx?[2J?evil"
    assert topology.num_ranks == 8
