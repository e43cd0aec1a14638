"""The 2024-2026 built-in systems: their link tables against their sources, and their bounds
(one node and ``--nodes 2``) against hand counts written in the comments.

Counting rules used below (a chunk is one rank's share of the buffer, a unit one link's worth):
* allgather, one rank: it must receive ``n - 1`` chunks; at most ``ingress`` units arrive per
  round, so ``(n - 1) / ingress`` rounds per chunk;
* allgather, a set ``S`` of ranks: the ``n - |S|`` chunks from outside must cross into ``S``
  over the links into it: ``(n - |S|) / capacity``;
* alltoall, a cut into ``S`` and the rest: ``|S| * (n - |S|)`` blocks cross it each way.
"""

from __future__ import annotations

from fractions import Fraction

import pytest

from collsynth.bounds import compute_bounds
from collsynth.collective import standard_collective
from collsynth.resolve import resolve_topology
from collsynth.topology import get_topology

# name, nodes, collective, steps bound, rounds-per-chunk bound
CASES = [
    # NVSwitch nodes: a GPU's ingress group is 18 NVLinks; 7 chunks in -> 7/18, one step.
    ("dgx-b200", None, "allgather", 1, Fraction(7, 18)),
    ("dgx-h200", None, "allgather", 1, Fraction(7, 18)),
    # 72 GPUs, 18 NVLinks each: 71/18.
    ("gb200-nvl72", None, "allgather", 1, Fraction(71, 18)),
    # xGMI fully connected, 1 link per pair: 7 chunks over 7 links -> 1; alltoall: 7 blocks in
    # over the same 7 links -> 1.
    ("mi325x", None, "allgather", 1, Fraction(1)),
    ("mi355x", None, "allgather", 1, Fraction(1)),
    ("mi355x", None, "alltoall", 1, Fraction(1)),
    # MI250, 16 GCDs: a GCD has 7 links (ingress bound 15/7), but an OAM's two GCDs have only
    # 3 + 3 links to the rest (0: 4 (2), 8 (1); 1: 5, 9, 10) and need 14 chunks: 14/6 = 7/3.
    # Farthest pair: 5 hops (see test_mi250_16gcd_matches_its_table for the distances).
    ("mi250-16gcd", None, "allgather", 5, Fraction(7, 3)),
    # Halves OAM 0-3 / 4-7 are joined by 6 links (0-8, 1-9, 1-10, 2-9, 2-10, 3-11): 8 * 8 / 6.
    ("mi250-16gcd", None, "alltoall", 5, Fraction(64, 6)),
    # trn2 = 4x4 torus: 15 chunks over 4 links; diameter 2 + 2; bisection 64 blocks / 8 links.
    ("trn2", None, "allgather", 4, Fraction(15, 4)),
    ("trn2", None, "alltoall", 4, Fraction(8)),
    # Two nodes. DGX B200: NIC 50 GB/s = 1 unit of 50 GB/s; node 1's 8 chunks reach node 0 over
    # its 8 NICs: 8/8 = 1 (a rank's ingress, 15 over 18 + 1, is smaller).
    ("dgx-b200", 2, "allgather", 1, Fraction(1)),
    # DGX H200: NIC = 2 units of 25 GB/s; a rank's ingress 18 + 2 = 20 units for 15 chunks: 3/4
    # (the node cut, 8 chunks over 8 * 2 units, is 1/2).
    ("dgx-h200", 2, "allgather", 1, Fraction(15, 20)),
    # GB200 NVL72 x 2 racks: a rank's ingress 18 + 1 units, 143 chunks: 143/19.
    ("gb200-nvl72", 2, "allgather", 1, Fraction(143, 19)),
    # MI355X: NIC 50 GB/s is 2/3 of a 76.8 GB/s unit (nearest fraction with denominator <= 8),
    # so units are split in 3: a link is 3 units, a NIC 2; ingress 7 * 3 + 2 = 23, 15 chunks.
    ("mi355x", 2, "allgather", 1, Fraction(15, 23)),
]


@pytest.mark.parametrize("name, nodes, collective, steps, rounds", CASES)
def test_bounds_match_hand_counts(name, nodes, collective, steps, rounds):
    topology = resolve_topology(name, nodes=nodes)
    bounds = compute_bounds(topology, standard_collective(collective, topology.num_ranks))
    assert bounds.steps == steps
    assert bounds.rounds_per_chunk == rounds


def test_dgx_h200_has_the_dgx_h100_fabric():
    h100, h200 = get_topology("dgx-h100"), get_topology("dgx-h200")
    assert h200.links == h100.links and h200.groups == h100.groups
    assert h200.unit_gbps == h100.unit_gbps == 25.0


def test_nvlink5_systems_count_18_links_of_50_gbps():
    # 18 links x 50 GB/s x 2 directions = 1.8 TB/s per GPU, the figure NVIDIA quotes
    for name in ("dgx-b200", "gb200-nvl72"):
        t = get_topology(name)
        assert t.bandwidth(0, 1) * t.unit_gbps * 2 == 1800


def test_xgmi_generations():
    # 7 links per GPU; per link both ways: MI325X 128 GB/s, MI355X 153.6 GB/s (1075 GB/s in all)
    for name, both_ways in (("mi325x", 128.0), ("mi355x", 153.6)):
        t = get_topology(name)
        assert all(len(peers) == 7 for peers in t.destinations)
        assert t.unit_gbps * 2 == pytest.approx(both_ways)


def test_mi250_16gcd_matches_its_table():
    t = get_topology("mi250-16gcd")
    # the table of data/measurements/mi250-16gcd-x2/README.md, one row per GCD
    table = {0: {1: 4, 4: 2, 8: 1}, 1: {0: 4, 5: 1, 9: 1, 10: 1}, 2: {3: 4, 6: 1, 9: 1, 10: 1},
             3: {2: 4, 7: 2, 11: 1}, 4: {5: 4, 0: 2, 6: 1}, 5: {4: 4, 1: 1, 6: 1, 7: 1},
             6: {7: 4, 2: 1, 4: 1, 5: 1}, 7: {6: 4, 3: 2, 5: 1}, 8: {9: 4, 12: 2, 0: 1},
             9: {8: 4, 1: 1, 2: 1, 13: 1}, 10: {11: 4, 1: 1, 2: 1, 14: 1},
             11: {10: 4, 15: 2, 3: 1}, 12: {13: 4, 8: 2, 14: 1}, 13: {12: 4, 9: 1, 14: 1, 15: 1},
             14: {15: 4, 10: 1, 12: 1, 13: 1}, 15: {14: 4, 11: 2, 13: 1}}
    for a in range(16):
        assert {b: bw for b, bw in enumerate(t.links[a]) if bw} == table[a]
    assert all(sum(row) == 7 for row in t.links)
    # the diameter by breadth-first search over the table (not over the topology)
    def hops(src):
        seen, frontier, depth = {src: 0}, [src], 0
        while frontier:
            depth += 1
            frontier = [b for a in frontier for b in table[a] if b not in seen]
            seen.update({b: depth for b in frontier})
        return max(seen.values())
    assert max(hops(a) for a in range(16)) == 5


def test_trn2_is_the_4x4_torus():
    assert get_topology("trn2").links == get_topology("torus:4x4").links


def test_nodes_compose_racks_and_shared_nics():
    racks = resolve_topology("gb200-nvl72", nodes=2)
    assert racks.num_ranks == 144 and racks.metadata["network"]["nic_count"] == 72
    mi250 = resolve_topology("mi250-16gcd", nodes=2)
    # NIC j serves GCDs 2j and 2j+1, at half a 50 GB/s unit: units split in 2, NIC = 1 unit
    network = mi250.metadata["network"]
    assert network["nic_gpus"][3] == [6, 7] and network["rescale"] == 2
    assert (mi250.bandwidth(0, 1), mi250.bandwidth(0, 16), mi250.unit_gbps) == (8, 1, 25.0)
    egress = [g for g in mi250.groups if g.name == "node 0 NIC 3 egress"][0]
    assert egress.sources == frozenset({6, 7}) and egress.limit == 1
    # trn2: NIC 25 GB/s is 1/5 of a 128 GB/s unit, so units are split in 5: a NeuronLink is 5
    # units of 25.6 GB/s, a chip's EFA share 1
    trn2 = resolve_topology("trn2", nodes=2)
    assert (trn2.bandwidth(0, 1), trn2.bandwidth(0, 16), trn2.unit_gbps) == (5, 1, 25.6)
