"""The built-in topology files: they load, have the documented shape, and cite their NICs."""

from __future__ import annotations

import pytest

from collsynth.errors import UnknownNameError
from collsynth.topology.builtins import builtin_names, get_topology, list_topologies

# name, ranks, unit_gbps, per-rank egress/ingress limit (None: point-to-point, no groups)
BUILTINS = [
    ("dgx1", "DGX1", 8, 25.0, None),
    ("dgx2", "DGX2", 16, 25.0, 6),
    ("dgx-a100", "DGX-A100", 8, 25.0, 12),
    ("dgx-h100", "DGX-H100", 8, 25.0, 18),
    ("ndv2", "NDv2", 8, 25.0, None),
    ("ndv4", "NDv4", 8, 25.0, 12),
    ("mi250", "MI250", 8, 50.0, None),
    ("mi300x", "MI300X", 8, 64.0, None),
    ("dgx-h200", "DGX-H200", 8, 25.0, 18),
    ("dgx-b200", "DGX-B200", 8, 50.0, 18),
    ("gb200-nvl72", "GB200-NVL72", 72, 50.0, 18),
    ("mi325x", "MI325X", 8, 64.0, None),
    ("mi355x", "MI355X", 8, 76.8, None),
    ("mi250-16gcd", "MI250-16GCD", 16, 50.0, None),
    ("trn2", "Trn2", 16, 128.0, None),
    ("gh200x4", "GH200x4", 4, 25.0, None),
]
SWITCHED = [row for row in BUILTINS if row[4] is not None]
NODES_WITH_NICS = [row for row in BUILTINS if row[0] != "dgx1"]


@pytest.mark.parametrize("key, name, ranks, unit, limit", BUILTINS)
def test_builtin_loads_with_documented_shape(key, name, ranks, unit, limit):
    topo = get_topology(key)
    assert topo.name == name
    assert topo.num_ranks == ranks
    assert topo.unit_gbps == unit
    assert topo.alpha_us is not None and topo.alpha_us > 0
    assert topo.is_symmetric()
    assert topo.description
    for attr in ("unit", "alpha", "layout"):
        assert isinstance(topo.metadata.get(attr), str) and topo.metadata[attr]


@pytest.mark.parametrize("key", [row[0] for row in BUILTINS])
def test_lookup_is_case_insensitive(key):
    assert get_topology(key.upper()) is get_topology(key)


@pytest.mark.parametrize("key, name, ranks, unit, limit", SWITCHED)
def test_switched_nodes_link_every_pair_and_limit_each_rank(key, name, ranks, unit, limit):
    topo = get_topology(key)
    for src in range(ranks):
        for dst in range(ranks):
            assert topo.bandwidth(src, dst) == (0 if src == dst else limit)
    everyone = frozenset(range(ranks))
    egress = {next(iter(g.sources)): g for g in topo.groups if len(g.sources) == 1}
    ingress = {next(iter(g.destinations)): g for g in topo.groups if len(g.destinations) == 1}
    assert len(topo.groups) == 2 * ranks
    for r in range(ranks):
        assert egress[r].destinations == everyone - {r} and egress[r].limit == limit
        assert ingress[r].sources == everyone - {r} and ingress[r].limit == limit
    # every group binds: a rank's links add up to more than its limit
    assert len(topo.effective_groups) == 2 * ranks


def test_ndv2_has_the_dgx1_nvlink_matrix():
    assert get_topology("ndv2").links == get_topology("dgx1").links
    assert get_topology("ndv2").groups == ()


def test_ndv4_matches_dgx_a100_inside_the_node():
    assert get_topology("ndv4").links == get_topology("dgx-a100").links
    assert get_topology("ndv4").groups == get_topology("dgx-a100").groups


@pytest.mark.parametrize("key", ["dgx1", "ndv2"])
def test_cube_mesh_has_six_nvlinks_per_gpu(key):
    topo = get_topology(key)
    assert all(sum(row) == 6 for row in topo.links)


def test_mi250_xgmi_matrix():
    topo = get_topology("mi250")
    # 4 links inside each OAM, 2 for 0-6 and 2-4, 1 for the other inter-package pairs
    for a, b in [(0, 1), (2, 3), (4, 5), (6, 7)]:
        assert topo.bandwidth(a, b) == 4
    for a, b in [(0, 6), (2, 4)]:
        assert topo.bandwidth(a, b) == 2
    for a, b in [(0, 2), (1, 3), (1, 5), (3, 7), (4, 6), (5, 7)]:
        assert topo.bandwidth(a, b) == 1
    assert len(topo.edges) == 2 * 12  # 12 linked pairs, 3 peers per GCD
    assert all(len(peers) == 3 for peers in topo.destinations)


def test_mi300x_is_fully_connected_by_single_links():
    topo = get_topology("mi300x")
    assert all(topo.bandwidth(a, b) == (a != b) for a in range(8) for b in range(8))
    assert topo.groups == ()


# key, NIC count, GB/s per NIC, GPUs per NIC
NICS = [
    ("dgx2", 8, 12.5, 2),
    ("dgx-a100", 8, 25.0, 1),
    ("dgx-h100", 8, 50.0, 1),
    ("ndv2", 1, 12.5, 8),
    ("ndv4", 8, 25.0, 1),
    ("mi250", 4, 25.0, 2),
    ("mi300x", 8, 50.0, 1),
    ("dgx-h200", 8, 50.0, 1),
    ("dgx-b200", 8, 50.0, 1),
    ("gb200-nvl72", 72, 50.0, 1),
    ("mi325x", 8, 50.0, 1),
    ("mi355x", 8, 50.0, 1),
    ("mi250-16gcd", 8, 25.0, 2),
    ("trn2", 16, 25.0, 1),
    ("gh200x4", 4, 25.0, 1),
]


@pytest.mark.parametrize("key, count, gbps, share", NICS)
def test_nic_metadata(key, count, gbps, share):
    nic = get_topology(key).metadata["nic"]
    assert nic["count"] == count
    assert nic["gbps"] == gbps
    assert nic["source"]
    if share == 1:
        assert nic["per_gpu"] is True
    else:
        assert nic["per_gpu"] is False
        assert [len(m) for m in nic["gpus"]] == [share] * count


def test_every_node_file_describes_its_nics():
    assert {key for key, *_ in NICS} == {row[0] for row in NODES_WITH_NICS}


def test_list_topologies_includes_every_file():
    rows = {name: (ranks, description) for name, ranks, description in list_topologies()}
    for key, name, ranks, _, _ in BUILTINS:
        assert rows[name][0] == ranks
        assert key in builtin_names()


def test_unknown_name_lists_the_new_files():
    with pytest.raises(UnknownNameError, match="dgx-h100"):
        get_topology("dgx-x100")
