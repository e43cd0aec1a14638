"""Bounds and schedules on leaf-spine and rail fabrics, against cuts counted by hand.

Each expected value is a cut: the chunks that must cross into a set of ranks divided by what can
cross into it per round. The exact bounds (the fabric's maximum flows and the rounds linear
program) must find that cut, and every engine's schedule must verify and never beat it.
"""

from __future__ import annotations

from fractions import Fraction

import pytest

from collsynth.algorithm import find_problems
from collsynth.bounds import compute_bounds, rounds_per_chunk_lower_bound
from collsynth.bounds.throughput import optimal_throughput, tree_rounds
from collsynth.cli import main
from collsynth.collective import standard_collective
from collsynth.collective.model import Collective
from collsynth.graph.fabric import build_fabric
from collsynth.synthesis.alltoall_scale import alltoall_cut_bound, solve_alltoall_at_scale
from collsynth.synthesis.bandwidth_optimal.engine import solve_bandwidth_optimal
from collsynth.synthesis.hierarchical import hierarchical_algorithm
from collsynth.topology import Topology, compose_nodes, get_topology


def _leafy(ratio, nodes=6, node="fully-connected:4") -> Topology:
    """4-GPU nodes, one 1-unit NIC per GPU, 2 nodes (8 NICs) under each leaf switch."""
    return compose_nodes(get_topology(node), nodes, nic_units=1, fabric="leaf-spine",
                         nodes_per_leaf=2, oversubscription=ratio)


def _pairs(ratio, nodes=2) -> Topology:
    """Nodes of 2 GPUs with no link between them, each GPU on its own 4-unit NIC (rail 0 and
    rail 1), ``ratio``:1 above the rails (a cross-rail share of 4 / ratio units)."""
    return compose_nodes(Topology("pair", ((0, 0), (0, 0))), nodes, nic_units=4, fabric="rail",
                         oversubscription=ratio)


def _bounds(topology, name):
    collective = standard_collective(name, topology.num_ranks)
    fabric = optimal_throughput(topology, collective).rounds_per_chunk
    lp = rounds_per_chunk_lower_bound(topology, collective, method="highs")
    return fabric, lp


# -- leaf-spine ----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["allgather", "reduce_scatter"])
def test_an_oversubscribed_leaf_is_the_cut(name):
    # 6 nodes of 4 ranks, 3 leaves of 8 ranks. 4:1 above the leaves: 8 NIC units / 4 = 2 units
    # into (and out of) each leaf. The 16 chunks of the other leaves must enter a leaf: 16 / 2.
    leaf_cut = Fraction(16, 2)
    # Without oversubscription the tightest cut is one rank: 23 chunks over 3 links + 1 NIC.
    rank_cut = Fraction(23, 4)
    assert _bounds(_leafy(4), name) == (leaf_cut, leaf_cut)
    assert _bounds(_leafy(1), name) == (rank_cut, rank_cut)
    assert leaf_cut > rank_cut
    # 2:1 leaves 4 units per leaf: 16 / 4 = 4 < 23 / 4, so allgather does not feel it
    assert _bounds(_leafy(2), name) == (rank_cut, rank_cut)


def test_an_oversubscribed_leaf_of_rings():
    # 4 rings of 4 under 2 leaves, 8:1: 8 NIC units / 8 = 1 unit into each leaf, 8 chunks to
    # bring in; a rank alone needs 15 chunks over 2 ring links + 1 NIC = 5.
    assert _bounds(_leafy(8, nodes=4, node="ring:4"), "allgather") == (8, 8)
    assert _bounds(_leafy(1, nodes=4, node="ring:4"), "allgather") == (5, 5)


def test_the_node_tier_is_capped_both_ways():
    # One switch, 2:1 for each node: floor(4 NIC units / 2) = 2 units into each node, which
    # needs the 20 chunks of the other nodes: 20 / 2. (Capped on the way out only, a node could
    # take them in at its NICs' 4 units; the cut bound would then miss the limit.)
    over = compose_nodes(get_topology("fully-connected:4"), 6, nic_units=1, oversubscription=2)
    assert _bounds(over, "allgather") == (10, 10)
    assert _bounds(over, "reduce_scatter") == (10, 10)


def test_testing_one_node_is_enough_under_leaves():
    topology = _leafy(4)
    roots = {r: 1 for r in range(topology.num_ranks)}
    everyone = tree_rounds(build_fabric(topology), roots)[0]
    assert everyone == optimal_throughput(topology, standard_collective("allgather", 24)
                                          ).rounds_per_chunk == 8


def test_allreduce_cut_sees_the_leaf():
    # One allreduce chunk, contributed and needed everywhere: it crosses out of a leaf over its
    # 2-unit uplink at best; the composed bound is (8 + 8) / 24 rounds per base chunk.
    bounds = compute_bounds(_leafy(4), standard_collective("allreduce", 24))
    assert bounds.rounds_per_chunk == Fraction(1, 2)
    assert bounds.composed_rounds_per_chunk == Fraction(16, 24)


@pytest.mark.parametrize("name, bound", [("allgather", 8), ("reduce_scatter", 8),
                                         ("allreduce", Fraction(16, 24))])
def test_the_tree_engine_reaches_the_leaf_cut(name, bound):
    result = solve_bandwidth_optimal(_leafy(4), standard_collective(name, 24), stages=2)
    assert find_problems(result.algorithm) == []
    assert result.lower_bound == bound
    assert result.steady_state_rounds_per_chunk == bound and result.optimal


def test_hierarchical_schedules_pay_the_leaf_but_verify():
    topology = _leafy(4)
    result = hierarchical_algorithm(topology, "allgather")
    assert find_problems(result.algorithm) == []
    # direct NIC sends to every other node cross a leaf's uplink once per node, not per leaf:
    # priced against the leaf groups, never below the cut
    assert result.rounds_per_chunk >= 8


def test_alltoall_bound_and_schedule_under_leaves():
    # 8 rings of 4, 4 leaves of 8 ranks, 8:1: each leaf's 8 ranks send 8 x 24 blocks out over
    # 1 unit.
    topology = _leafy(8, nodes=8, node="ring:4")
    bound = alltoall_cut_bound(topology)
    assert bound.rounds_per_chunk == 192 and "leaf" in bound.cut
    result = solve_alltoall_at_scale(topology, time_limit=20)
    assert find_problems(result.algorithm) == []
    assert result.rounds_per_chunk == 192 and result.ratio == 1


# -- the fabric's paths ---------------------------------------------------------------------------


def _quads(ratio) -> Topology:
    """Nodes of 4 GPUs with no links, two NICs each shared by two GPUs, on two rails."""
    quad = Topology("quad", ((0,) * 4,) * 4, metadata={"nic": {"count": 2,
                                                              "gpus": [[0, 1], [2, 3]]}})
    return compose_nodes(quad, 3, nic_units=2, fabric="rail", oversubscription=ratio)


@pytest.mark.parametrize("topology", [
    _leafy(4), _leafy(4, node="ring:4"), _pairs(4, nodes=3), _quads(2),
    compose_nodes(get_topology("ring:4"), 3, nic_units=1, oversubscription=2),
], ids=["leaf-spine", "leaf-spine-rings", "rail", "rail-shared-nics", "switch"])
def test_every_path_of_the_fabric_is_a_link(topology):
    # Walking from rank s over switch vertices only (never through another rank) must reach
    # exactly the ranks s has a link to: no route the topology does not have (a node's NIC back
    # into the same node, a leaf's spine back into the same leaf), none missing.
    fabric = build_fabric(topology)
    n = fabric.num_ranks
    out: dict[int, list[int]] = {}
    for a, b in zip(fabric.src.tolist(), fabric.dst.tolist()):
        out.setdefault(a, []).append(b)
    for s in range(n):
        reached, stack, seen = set(), [s], {s}
        while stack:
            for w in out.get(stack.pop(), ()):
                if w in seen:
                    continue
                seen.add(w)
                if w < n:
                    reached.add(w)
                else:
                    stack.append(w)
        assert reached == {d for d in range(n) if topology.bandwidth(s, d)}, s


# -- rail ----------------------------------------------------------------------------------------


def test_traffic_between_rails_pays_and_within_a_rail_does_not():
    def one_chunk(src, dst):
        return Collective("one", 4, (frozenset({src}),), (frozenset({src, dst}),))

    # Ranks 0, 2 are rail 0 and 1, 3 rail 1 (nodes {0, 1}, {2, 3}). Same rail, 0 -> 2: one NIC
    # of 4 units, whatever the ratio.
    for ratio in (1, 4):
        assert rounds_per_chunk_lower_bound(_pairs(ratio), one_chunk(0, 2)) == Fraction(1, 4)
    # Across rails, 0 -> 3: 4:1 leaves a share of 1 unit on each way across: 0 -> 3 directly
    # and 0 -> 2 -> 1 -> 3 (2 -> 1 crosses, from rail 0 to rail 1): 2 units. At 1:1, rank 0's
    # NIC (4 units) is the limit.
    assert rounds_per_chunk_lower_bound(_pairs(4), one_chunk(0, 3)) == Fraction(1, 2)
    assert rounds_per_chunk_lower_bound(_pairs(1), one_chunk(0, 3)) == Fraction(1, 4)


def test_allgather_across_rails_is_the_rail_cut():
    # Rail 0 = {0, 2} must receive rail 1's 2 chunks; only 1 -> 2 and 3 -> 0 enter it (no link
    # inside a node), each over a cross-rail share of 1 unit: 2 / 2. A rank alone: 3 chunks over
    # its 4-unit NIC.
    assert _bounds(_pairs(4), "allgather") == (1, 1)
    assert _bounds(_pairs(1), "allgather") == (Fraction(3, 4), Fraction(3, 4))


def test_rails_cost_nothing_when_the_node_can_change_rails():
    # 4-GPU nodes with links between every pair, 2-unit NICs, 2:1 above the rails: a rank needs
    # 15 chunks over 3 links + 2 NIC units = 3 either way; chunks cross between nodes on their own
    # rail and change rails inside the node.
    node = get_topology("fully-connected:4")
    over = compose_nodes(node, 4, nic_units=2, fabric="rail", oversubscription=2)
    flat = compose_nodes(node, 4, nic_units=2)
    assert _bounds(over, "allgather") == _bounds(flat, "allgather") == (3, 3)
    result = solve_bandwidth_optimal(over, standard_collective("allgather", 16), stages=2)
    assert find_problems(result.algorithm) == []
    assert result.steady_state_rounds_per_chunk == 3 and result.optimal


def test_alltoall_changes_rails_inside_the_node():
    # 3 nodes of 4 ranks, 4-unit links inside a node, 2-unit NICs, 2:1 above the rails (a
    # cross-rail share of 1 unit). A node's 4 x 8 blocks leave over 4 NICs x 2 units: 4 rounds.
    fast = Topology("fast", tuple(tuple(0 if a == b else 4 for b in range(4)) for a in range(4)))
    topology = compose_nodes(fast, 3, nic_units=2, fabric="rail", oversubscription=2)
    result = solve_alltoall_at_scale(topology)
    assert find_problems(result.algorithm) == []
    assert result.lower_bound == 4
    # Direct: each NIC sends 2 nodes x 3 ranks of other rails over its 1-unit share: 6 rounds.
    # Rail: first each rank hands its node's rank on the destination's rail 2 + 1 blocks
    # (4-unit links: 1 round) while same-rail blocks cross (2 over 2 units: 1 round), then every
    # NIC sends the 3 x 2 relayed blocks over its own rail (2 units: 3 rounds): 1 + 3.
    assert dict((name, value) for name, value, _, _ in result.details["candidates"])["direct"] == 6
    assert (result.details["schedule"], result.rounds_per_chunk, result.ratio) == ("rail", 4, 1)


def test_the_cli_takes_fabrics(capsys):
    code = main(["bounds", "fully-connected:4", "allgather", "--nodes", "6", "--nic-units", "1",
                 "--fabric", "leaf-spine", "--nodes-per-leaf", "2", "--oversubscription", "4"])
    assert code == 0
    assert "rounds/chunk >= 8" in capsys.readouterr().out
    code = main(["bounds", "fully-connected:4", "allgather", "--nodes", "6", "--nic-units", "1",
                 "--fabric", "leaf-spine", "--nodes-per-leaf", "2",
                 "--oversubscription", "leaf=4,node=2"])
    assert code == 0  # node uplinks of 4 / 2 = 2 units: a node's 20 chunks over 2 = 10
    assert "rounds/chunk >= 10" in capsys.readouterr().out
    assert main(["bounds", "ring:4", "allgather", "--nodes", "2", "--nic-units", "1",
                 "--fabric", "rail", "--oversubscription", "leaf=2"]) == 1
    assert "not a tier of the 'rail' fabric" in capsys.readouterr().err
    assert main(["bounds", "ring:4", "allgather", "--nodes", "2", "--nic-units", "1",
                 "--oversubscription", "fast"]) == 2
