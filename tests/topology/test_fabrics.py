"""Fabrics between nodes: the leaf and rail groups compose_nodes adds, and how they are read back.

Expected groups are written out by hand from the fabric's definition (which ranks sit under which
leaf or rail switch, and the share of its uplinks a ratio leaves).
"""

from __future__ import annotations

import json
from fractions import Fraction

import numpy as np
import pytest

from collsynth.errors import FileFormatError, InvalidTopologyError
from collsynth.graph.symmetry import NodeShift, node_shift
from collsynth.resolve import resolve_topology
from collsynth.topology import Topology, compose_nodes, get_topology
from collsynth.topology.fileformat import topology_from_json, topology_to_json
from collsynth.topology.tiers import parse_oversubscription


def _named(topology: Topology, word: str):
    return [g for g in topology.groups if word in g.name]


def _leafy(ratio=4, nodes=6) -> Topology:
    """``nodes`` 4-GPU nodes (every pair linked), one 1-unit NIC per GPU, 2 nodes per leaf."""
    return compose_nodes(get_topology("fully-connected:4"), nodes, nic_units=1,
                         fabric="leaf-spine", nodes_per_leaf=2, oversubscription=ratio)


def test_switch_is_the_default_and_adds_nothing():
    node = get_topology("ring:4")
    plain = compose_nodes(node, 3, nic_units=1, oversubscription=2)
    switch = compose_nodes(node, 3, nic_units=1, oversubscription=2, fabric="switch")
    assert plain.groups == switch.groups and plain.links == switch.links
    assert switch.layout.fabric == "switch"
    assert switch.layout.oversubscription == 2
    assert len(_named(switch, "uplink")) == len(_named(switch, "downlink")) == 3


def test_leaf_spine_has_one_group_per_leaf_per_direction():
    system = _leafy(ratio=4, nodes=6)
    # leaf m holds nodes 2m, 2m+1: ranks 8m..8m+7; 8 NICs of 1 unit, 4:1 -> 2 units each way
    ups, downs = _named(system, "uplink"), _named(system, "downlink")
    assert len(ups) == len(downs) == 3
    for m in range(3):
        leaf = frozenset(range(8 * m, 8 * m + 8))
        rest = frozenset(range(24)) - leaf
        assert (ups[m].sources, ups[m].destinations, ups[m].limit) == (leaf, rest, 2)
        assert (downs[m].sources, downs[m].destinations, downs[m].limit) == (rest, leaf, 2)
    # nothing else beyond the NICs: 6 nodes x 4 NICs x 2 directions
    assert len(system.groups) == 6 + 6 * 4 * 2


def test_leaf_spine_without_oversubscription_adds_no_group():
    system = _leafy(ratio=1, nodes=4)
    assert not _named(system, "leaf")
    assert system.layout.nodes_per_leaf == 2


def test_rail_has_one_cross_rail_group_per_nic_per_direction():
    system = compose_nodes(get_topology("ring:4"), 3, nic_units=2, fabric="rail",
                           oversubscription=2)
    cross = _named(system, "cross-rail")
    assert len(cross) == 4 * 3 * 2  # 4 NICs (rails) x 3 nodes x 2 directions
    egress = {g.name: g for g in cross if "egress" in g.name}
    g = egress["node 1 NIC 2 cross-rail egress (oversubscription 2)"]
    # NIC 2 of node 1 is rank 6; the other rails of nodes 0 and 2: local ranks 0, 1, 3
    assert g.sources == {6}
    assert g.destinations == {0, 1, 3, 8, 9, 11}
    assert g.limit == 1  # a 2-unit NIC, 2:1 above the rails
    ingress = [h for h in cross if h.name.startswith("node 1 NIC 2") and "ingress" in h.name]
    assert [(h.sources, h.destinations, h.limit) for h in ingress] == [({0, 1, 3, 8, 9, 11},
                                                                        {6}, 1)]
    # the NVLinks (ring links) of node 1 are in no cross-rail group
    assert not any(5 in h.sources and 6 in h.destinations for h in cross)


def test_a_share_that_is_not_whole_rescales_the_topology():
    pair = Topology("pair", ((0, 3), (3, 0)), unit_gbps=10.0)
    system = compose_nodes(pair, 2, nic_units=1, fabric="rail", oversubscription=2)
    # 1 unit / 2 is half a unit: every bandwidth doubles, the unit halves
    assert system.metadata["network"]["rescale"] == 2
    assert system.unit_gbps == 5.0
    assert system.bandwidth(0, 1) == 6 and system.bandwidth(0, 2) == 2
    assert {g.limit for g in _named(system, "cross-rail")} == {1}


def test_layout_reads_the_fabric_back():
    layout = _leafy(ratio=4, nodes=6).layout
    assert (layout.fabric, layout.nodes_per_leaf) == ("leaf-spine", 2)
    assert layout.tier_oversubscription("leaf") == 4
    assert layout.tier_oversubscription("node") == 1
    assert [layout.leaf_of(k) for k in range(6)] == [0, 0, 1, 1, 2, 2]
    assert layout.oversubscribed
    rail = compose_nodes(get_topology("ring:4"), 2, nic_units=2, fabric="rail",
                         oversubscription={"rail": 3}).layout
    assert rail.fabric == "rail" and rail.tier_oversubscription("rail") == 3
    assert rail.nodes_per_leaf is None


def test_fabric_survives_the_file_format():
    system = _leafy(ratio=4, nodes=4)
    again = topology_from_json(json.loads(json.dumps(topology_to_json(system))))
    assert again == system
    assert again.layout == system.layout


def test_a_bad_fabric_record_is_refused():
    system = _leafy(ratio=4, nodes=4)
    data = topology_to_json(system)
    data["metadata"]["network"]["fabric"]["nodes_per_leaf"] = 3
    # the reader reads metadata['network'] with the file, so the refusal is the reader's
    with pytest.raises(FileFormatError, match=r"\['fabric'\].*nodes_per_leaf"):
        topology_from_json(data)


@pytest.mark.parametrize("kwargs, match", [
    ({"fabric": "torus"}, "unknown fabric 'torus'"),
    ({"fabric": "leaf-spine"}, "needs nodes_per_leaf"),
    ({"fabric": "leaf-spine", "nodes_per_leaf": 3}, "4 nodes cannot fill leaves of 3"),
    ({"fabric": "leaf-spine", "nodes_per_leaf": 0}, "nodes_per_leaf must be"),
    ({"fabric": "rail", "nodes_per_leaf": 2}, "leaf-spine fabric only"),
    ({"fabric": "rail", "oversubscription": {"leaf": 2}}, "'leaf' is not a tier of the 'rail'"),
    ({"fabric": "rail", "oversubscription": {"node": 2}}, "'node' is not a tier of the 'rail'"),
    ({"oversubscription": {"leaf": 2}}, "'leaf' is not a tier of the 'switch'"),
    ({"fabric": "leaf-spine", "nodes_per_leaf": 2, "oversubscription": {"leaf": 0.5}},
     "oversubscription 0.5 is below 1; expected a ratio from 1 to 1000"),
])
def test_bad_fabrics(kwargs, match):
    with pytest.raises(InvalidTopologyError, match=match):
        compose_nodes(get_topology("ring:4"), 4, nic_units=1, **kwargs)


@pytest.mark.parametrize("text, expected", [
    ("2", Fraction(2)),
    ("3/2", Fraction(3, 2)),
    ("1.5", Fraction(3, 2)),
    ("leaf=2", {"leaf": Fraction(2)}),
    (" Leaf = 2 , node=1 ", {"leaf": Fraction(2), "node": Fraction(1)}),
])
def test_parse_oversubscription(text, expected):
    assert parse_oversubscription(text) == expected


@pytest.mark.parametrize("text, match", [
    ("", "is not a number"),
    ("x", "is not a number"),
    ("0.5", "below 1"),
    ("leaf=", "is not a number"),
    ("=2", "is not TIER=X"),
    ("leaf=2,leaf=3", "given twice"),
    ("leaf=1/0", "is not a number"),
])
def test_parse_oversubscription_refuses(text, match):
    with pytest.raises(InvalidTopologyError, match=match):
        parse_oversubscription(text)


def test_resolve_topology_takes_the_fabric_as_text():
    system = resolve_topology("ring:4", nodes=4, nic_units=1, fabric="leaf-spine",
                              nodes_per_leaf=2, oversubscription="leaf=2,node=2")
    assert system.layout.tier_oversubscription("leaf") == 2
    assert len(_named(system, "leaf")) == 4 and len(_named(system, "node 0 uplink")) == 1
    with pytest.raises(InvalidTopologyError, match="joins nodes"):
        resolve_topology("ring:4", fabric="rail")


# -- the node shift under leaves -----------------------------------------------------------------


def test_under_leaves_the_shift_moves_whole_leaves():
    system = _leafy(ratio=4, nodes=6)
    shift = node_shift(system)
    assert shift == NodeShift(6, 4, 2)
    # shifting by one node and wrapping around is not a symmetry: it splits leaf 0's group
    plain = NodeShift(6, 4).permutation(1)
    up = _named(system, "leaf 2 uplink")[0]
    moved = frozenset(int(plain[r]) for r in up.sources)
    assert moved == frozenset(range(20, 24)) | frozenset(range(4))
    assert moved not in {g.sources for g in system.groups}
    ranks = np.arange(24)
    nodes_reached = set()
    for k in range(6):
        there = shift.shift(ranks, k)
        assert sorted(there.tolist()) == list(range(24))  # a permutation
        assert np.array_equal(shift.shift(there, -k), ranks)  # undone by -k
        nodes_reached.add(int(there[0]) // 4)
        leaves = there.reshape(3, 8) // 8  # every leaf lands on one leaf
        assert all(len(set(row.tolist())) == 1 for row in leaves)
    assert nodes_reached == set(range(6))  # node 0 goes to every node once


def test_node_shift_is_checked_on_the_leaf_groups():
    system = _leafy(ratio=4, nodes=6)
    broken = Topology(system.name, system.links,
                      tuple(g for g in system.groups if g.name != "leaf 1 uplink (oversubscription 4)"),
                      metadata=system.metadata)
    assert node_shift(broken) is None


# One table for both places an oversubscription is read: the command line and a topology file's
# metadata. Each row is accepted by both, as the same ratio, or refused by both.
_RATIOS = [("2", Fraction(2)), ("3/2", Fraction(3, 2)), (" 1.5 ", Fraction(3, 2)),
           ("2e0", Fraction(2)), ("1000", Fraction(1000)), ("1", Fraction(1)),
           ("1001", None), ("5000", None), ("1e300", None), ("1e100000000", None),
           ("0.5", None), ("-2", None), ("x", None), ("1/0", None), ("1_5", None),
           ("\u0662", None), ("", None)]


@pytest.mark.parametrize("text, expected", _RATIOS)
def test_the_command_line_and_a_file_read_ratios_alike(text, expected):
    data = topology_to_json(_leafy(ratio=2, nodes=4))
    data["metadata"]["network"]["fabric"]["oversubscription"]["leaf"] = text
    if expected is None:
        with pytest.raises(InvalidTopologyError, match="^oversubscription "):
            parse_oversubscription(text)
        with pytest.raises(FileFormatError, match=r"\['oversubscription'\]\['leaf'\]: "):
            topology_from_json(data)
    else:
        assert parse_oversubscription(text) == expected
        assert topology_from_json(data).layout.tier_oversubscription("leaf") == expected


@pytest.mark.parametrize("text", ["0.5", "x", "1001", "leaf=x"])
def test_an_oversubscription_refusal_reads_without_nested_brackets(capsys, text):
    """``0.5`` read "... is below 1 (1 = non-blocking, 2 = 2:1) (see 'collsynth bounds
    --help')": the usage line's own bracket followed another."""
    from collsynth import cli

    assert cli.main(["bounds", "dgx1", "allgather", "--nodes", "2",
                     f"--oversubscription={text}"]) == cli.EXIT_USAGE
    [line] = capsys.readouterr().err.splitlines()
    assert line.count("(") == 1 and line.endswith("(see 'collsynth bounds --help')"), line


def test_a_files_network_ratio_that_is_not_one_is_refused():
    """``metadata.network.oversubscription = "x"`` was read as 1 (non-blocking), silently."""
    data = topology_to_json(_leafy(ratio=2, nodes=4))
    data["metadata"]["network"]["oversubscription"] = "x"
    with pytest.raises(FileFormatError, match=r"\['network'\]\['oversubscription'\]: 'x' is not"):
        topology_from_json(data)
