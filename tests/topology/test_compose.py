"""compose_nodes: copies of a node joined by their NICs."""

from __future__ import annotations

import json
from fractions import Fraction

import pytest

from collsynth.errors import InputTooLargeError, InvalidTopologyError
from collsynth.topology.builtins import get_topology
from collsynth.topology.compose import compose_nodes
from collsynth.topology.families import ring
from collsynth.topology.fileformat import topology_from_json, topology_to_json
from collsynth.topology.model import MAX_RANKS, Topology


def _groups(topo: Topology, suffix: str):
    return [g for g in topo.groups if g.name.endswith(suffix)]


@pytest.fixture(scope="module")
def a100x2() -> Topology:
    return compose_nodes(get_topology("dgx-a100"), 2)


def test_two_dgx_a100_have_16_ranks(a100x2):
    assert a100x2.name == "DGX-A100x2"
    assert a100x2.num_ranks == 16
    assert a100x2.unit_gbps == 25.0
    assert a100x2.alpha_us == get_topology("dgx-a100").alpha_us
    assert a100x2.is_symmetric()


def test_intra_node_links_are_copied(a100x2):
    node = get_topology("dgx-a100")
    for k in range(2):
        for a in range(8):
            for b in range(8):
                assert a100x2.bandwidth(8 * k + a, 8 * k + b) == node.bandwidth(a, b)


def test_inter_node_links_only_between_different_nodes(a100x2):
    for a in range(16):
        for b in range(16):
            if a // 8 != b // 8:
                assert a100x2.bandwidth(a, b) == 1  # one 200 Gb/s NIC = 25 GB/s = 1 unit


def test_intra_node_groups_are_copied_per_node(a100x2):
    node_groups = get_topology("dgx-a100").groups
    copies = [g for g in a100x2.groups if "NIC" not in g.name]
    assert len(copies) == 2 * len(node_groups)
    for k in range(2):
        mine = [g for g in copies if g.name.startswith(f"node {k}:")]
        assert [(set(g.sources), set(g.destinations), g.limit) for g in mine] == [
            ({8 * k + s for s in g.sources}, {8 * k + d for d in g.destinations}, g.limit)
            for g in node_groups]


def test_nic_groups_per_gpu(a100x2):
    egress, ingress = _groups(a100x2, "egress"), _groups(a100x2, "ingress")
    nic_egress = [g for g in egress if "NIC" in g.name]
    nic_ingress = [g for g in ingress if "NIC" in g.name]
    assert len(nic_egress) == len(nic_ingress) == 16
    for g in nic_egress:
        (rank,) = g.sources
        other = set(range(8, 16)) if rank < 8 else set(range(8))
        assert g.destinations == other and g.limit == 1
    for g in nic_ingress:
        (rank,) = g.destinations
        assert g.sources == (set(range(8, 16)) if rank < 8 else set(range(8)))
        assert g.limit == 1
    assert not [g for g in a100x2.groups if "uplink" in g.name]


def test_shared_nic_groups_and_rescale():
    dgx2 = compose_nodes(get_topology("dgx2"), 2)
    # 12.5 GB/s NIC against a 25 GB/s unit: everything doubles, the unit halves
    assert dgx2.unit_gbps == 12.5
    assert dgx2.bandwidth(0, 1) == 12 and dgx2.bandwidth(0, 16) == 1
    assert dgx2.metadata["network"]["rescale"] == 2
    assert {g.limit for g in dgx2.groups if "NVLinks" in g.name} == {12}
    nic_egress = [g for g in dgx2.groups if "NIC" in g.name and g.name.endswith("egress")]
    assert len(nic_egress) == 16  # 8 NICs per node
    assert sorted(sorted(g.sources) for g in nic_egress if min(g.sources) < 16) == [
        [2 * j, 2 * j + 1] for j in range(8)]


def test_ndv2_single_nic_shared_by_the_node():
    ndv2 = compose_nodes(get_topology("ndv2"), 3)
    assert ndv2.num_ranks == 24
    nic_egress = [g for g in ndv2.groups if g.name.endswith("egress")]
    assert len(nic_egress) == 3
    assert nic_egress[0].sources == frozenset(range(8))
    assert nic_egress[0].destinations == frozenset(range(8, 24))
    assert nic_egress[0].limit == 1
    assert ndv2.bandwidth(0, 1) == 4  # a double NVLink, rescaled by 2


def test_nic_faster_than_one_unit():
    h100 = compose_nodes(get_topology("dgx-h100"), 2)
    assert h100.bandwidth(0, 8) == 2  # 400 Gb/s = 50 GB/s = 2 NVLink units
    assert h100.metadata["network"]["rescale"] == 1


def test_nic_rounded_to_a_small_fraction():
    mi300x = compose_nodes(get_topology("mi300x"), 2)
    # 50 GB/s NIC / 64 GB/s xGMI = 0.78, rounded to 4/5: xGMI 5 units, NIC 4 units of 12.8 GB/s
    assert mi300x.metadata["network"]["rescale"] == 5
    assert mi300x.bandwidth(0, 1) == 5 and mi300x.bandwidth(0, 8) == 4
    assert mi300x.unit_gbps == pytest.approx(12.8)


def test_oversubscription_group(a100x2):
    over = compose_nodes(get_topology("dgx-a100"), 2, oversubscription=Fraction(3))
    uplinks = [g for g in over.groups if "uplink" in g.name]
    assert len(uplinks) == 2
    assert uplinks[0].sources == frozenset(range(8))
    assert uplinks[0].destinations == frozenset(range(8, 16))
    assert uplinks[0].limit == 2  # floor(8 NIC units / 3)
    downlinks = [g for g in over.groups if "downlink" in g.name]
    assert [(g.sources, g.destinations, g.limit) for g in downlinks] == [
        (frozenset(range(8, 16)), frozenset(range(8)), 2),
        (frozenset(range(8)), frozenset(range(8, 16)), 2)]
    assert len(over.groups) == len(a100x2.groups) + 4
    # never below 1
    tight = compose_nodes(get_topology("ndv2"), 2, oversubscription=4.0)
    assert {g.limit for g in tight.groups if "uplink" in g.name} == {1}


def test_composed_topology_is_a_valid_topology(a100x2):
    rebuilt = Topology(a100x2.name, a100x2.links, a100x2.groups, a100x2.unit_gbps, a100x2.alpha_us,
                       a100x2.description)
    assert rebuilt == a100x2
    assert a100x2.effective_groups  # NIC groups bind


def test_composed_topology_round_trips_through_the_file_format(a100x2):
    over = compose_nodes(get_topology("mi250"), 2, oversubscription=1.5)
    for topo in (a100x2, over):
        again = topology_from_json(json.loads(json.dumps(topology_to_json(topo))))
        assert again == topo
        assert again.metadata["network"] == topo.metadata["network"]


def test_one_node_is_the_node_itself():
    one = compose_nodes(get_topology("dgx-a100"), 1)
    assert one.links == get_topology("dgx-a100").links
    assert len(one.groups) == len(get_topology("dgx-a100").groups)


def test_ring_without_nic_description_is_refused():
    with pytest.raises(InvalidTopologyError, match="no NIC description.*nic_units"):
        compose_nodes(ring(4), 2)


def test_ring_with_nic_units():
    two = compose_nodes(ring(4), 2, nic_units=1)
    assert two.num_ranks == 8
    assert two.bandwidth(0, 1) == 1 and two.bandwidth(0, 2) == 0
    assert two.bandwidth(0, 4) == two.bandwidth(7, 3) == 1
    assert len([g for g in two.groups if "NIC" in g.name]) == 16
    assert two.unit_gbps is None


def test_nic_units_override_keeps_the_nic_layout():
    two = compose_nodes(get_topology("ndv2"), 2, nic_units=3)
    assert two.bandwidth(0, 8) == 3 and two.bandwidth(0, 1) == 2  # no rescale
    assert len([g for g in two.groups if "NIC" in g.name]) == 4


def test_name_override():
    assert compose_nodes(ring(4), 2, nic_units=1, name="pod").name == "pod"


@pytest.mark.parametrize("nodes", [0, -1, 1.5, True, "2"])
def test_bad_node_counts(nodes):
    with pytest.raises(InvalidTopologyError, match="nodes"):
        compose_nodes(ring(4), nodes, nic_units=1)


def test_too_many_ranks_refused_before_building():
    with pytest.raises(InputTooLargeError, match=str(MAX_RANKS)):
        compose_nodes(get_topology("dgx-a100"), 10**9)


@pytest.mark.parametrize("kwargs, match", [
    ({"nic_units": 0}, "nic_units"),
    ({"nic_units": 1, "oversubscription": 0.5}, "oversubscription"),
    ({"nic_units": 1, "oversubscription": float("inf")}, "oversubscription"),
    ({"nic_units": 1, "oversubscription": "2"}, "oversubscription"),
])
def test_bad_options(kwargs, match):
    with pytest.raises(InvalidTopologyError, match=match):
        compose_nodes(ring(4), 2, **kwargs)


def _with_nic(nic, unit_gbps=25.0) -> Topology:
    base = ring(4)
    return Topology("r", base.links, unit_gbps=unit_gbps, metadata={"nic": nic})


@pytest.mark.parametrize("nic, match", [
    ("fast", "expected an object"),
    ({"count": 4}, "gbps"),
    ({"count": 0, "gbps": 25.0}, "count"),
    ({"count": 3, "gbps": 25.0}, "evenly"),
    ({"gbps": 25.0}, "count"),
    ({"count": 2, "gbps": -1}, "gbps"),
    ({"per_gpu": True, "count": 2, "gbps": 25.0}, "per_gpu"),
    ({"gpus": [[0, 1], [1, 2, 3]], "gbps": 25.0}, "exactly once"),
    ({"gpus": [[0, 1], [2, 3]], "count": 3, "gbps": 25.0}, "count"),
    ({"count": 4, "gbps": 1.0}, "less than 1/8"),
])
def test_bad_nic_metadata(nic, match):
    with pytest.raises(InvalidTopologyError, match=match):
        compose_nodes(_with_nic(nic), 2)


def test_nic_metadata_without_unit_needs_nic_units():
    with pytest.raises(InvalidTopologyError, match="unit_gbps"):
        compose_nodes(_with_nic({"count": 4, "gbps": 25.0}, unit_gbps=None), 2)


def test_even_split_of_shared_nics():
    two = compose_nodes(_with_nic({"count": 2, "gbps": 50.0}), 2)
    egress = [sorted(g.sources) for g in two.groups if g.name.endswith("egress")]
    assert egress == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert two.bandwidth(0, 4) == 2


def test_large_composition_shape():
    # 16 nodes x 8 GPUs; the 128-node case is measured outside the test suite
    big = compose_nodes(get_topology("dgx-h100"), 16)
    assert big.num_ranks == 128
    assert len(big.groups) == 16 * 16 + 16 * 16
    assert big.bandwidth(0, 127) == 2 and big.bandwidth(120, 127) == 18
