"""Alltoall at scale: the schedules verify, meet the cut bound on non-blocking fabrics, and the
cut bound never exceeds the exact LP bound."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from collsynth.algorithm import find_problems
from collsynth.bounds import rounds_per_chunk_lower_bound
from collsynth.collective import alltoall
from collsynth.errors import InvalidInstanceError, InvalidTopologyError
from collsynth.synthesis.alltoall_scale import (
    _composed_structure,
    alltoall_cut_bound,
    solve_alltoall_at_scale,
)
from collsynth.topology import BandwidthGroup, Topology, compose_nodes, get_topology
from collsynth.topology.families import fully_connected, hub, ring

NODE_TIME_S = 20.0

SMALL = {
    "fc4x2": lambda: compose_nodes(fully_connected(4), 2, nic_units=1),
    "fc4x2-nic3": lambda: compose_nodes(fully_connected(4), 2, nic_units=3),
    "hub4x2": lambda: compose_nodes(hub(4), 2, nic_units=1),
    "ring4x2": lambda: compose_nodes(ring(4), 2, nic_units=1),
    "dgx-a100x2": lambda: compose_nodes(get_topology("dgx-a100"), 2),
    "dgx-a100x2-oversubscribed": lambda: compose_nodes(get_topology("dgx-a100"), 2,
                                                       oversubscription=4),
    "dgx1x2": lambda: compose_nodes(get_topology("dgx1"), 2),
    "dgx2": lambda: get_topology("dgx2"),
    "dgx1": lambda: get_topology("dgx1"),
    "ring:4": lambda: get_topology("ring:4"),
    "hub:5": lambda: get_topology("hub:5"),
    "star:5": lambda: get_topology("star:5"),
    "line:4": lambda: get_topology("line:4"),
}
#: Non-blocking fabrics with a link between every pair of ranks: direct meets the cut bound.
FABRICS = ["fc4x2", "fc4x2-nic3", "hub4x2", "dgx-a100x2", "dgx-a100x2-oversubscribed", "dgx2",
           "hub:5"]
_CACHE: dict[str, Topology] = {}


def _topology(name: str) -> Topology:
    if name not in _CACHE:
        _CACHE[name] = SMALL[name]()
    return _CACHE[name]


def _lp(topology: Topology) -> Fraction:
    return rounds_per_chunk_lower_bound(topology, alltoall(topology.num_ranks))


@pytest.mark.parametrize("name", sorted(SMALL))
def test_cut_bound_never_exceeds_the_lp_bound(name):
    topology = _topology(name)
    cut = alltoall_cut_bound(topology)
    assert 0 < cut.rounds_per_chunk <= _lp(topology)
    assert cut.rounds_per_chunk == Fraction(cut.blocks, cut.capacity)


@pytest.mark.parametrize("name", FABRICS)
def test_direct_meets_the_cut_bound_on_non_blocking_fabrics(name):
    topology = _topology(name)
    result = solve_alltoall_at_scale(topology)
    details = result.details
    assert details["schedule"] == "direct"
    assert find_problems(result.algorithm) == []
    assert result.steps == 1
    assert result.rounds_per_chunk == details["cut_bound"].rounds_per_chunk == result.lower_bound
    assert result.ratio == 1
    assert details["exact_bound"] == _lp(topology)


def test_splitting_blocks_reaches_a_fractional_bound():
    # Each rank sends 4 blocks to the other node through a 3-unit NIC: 4/3 rounds per block,
    # reached only with blocks split in 3; whole blocks need ceil(4/3) = 2 rounds.
    topology = _topology("fc4x2-nic3")
    split = solve_alltoall_at_scale(topology)
    assert (split.chunks, split.rounds_per_chunk) == (3, Fraction(4, 3))
    whole = solve_alltoall_at_scale(topology, max_chunks=1)
    assert (whole.chunks, whole.rounds_per_chunk, whole.ratio) == (1, 2, Fraction(3, 2))
    assert find_problems(whole.algorithm) == []


@pytest.mark.parametrize("name", ["ring4x2", "dgx1x2"])
def test_hierarchical_when_nodes_are_not_fully_connected(name):
    topology = _topology(name)
    result = solve_alltoall_at_scale(topology, time_limit=NODE_TIME_S)
    details = result.details
    assert details["schedule"] == "hierarchical"
    assert [c[0] for c in details["candidates"]] == ["hierarchical"]  # no direct links everywhere
    assert find_problems(result.algorithm) == []
    cut = details["cut_bound"].rounds_per_chunk
    assert result.rounds_per_chunk >= details["exact_bound"] >= cut
    assert result.lower_bound == details["exact_bound"]
    assert result.ratio == result.rounds_per_chunk / result.lower_bound


def test_hierarchical_beats_direct_around_a_thin_link():
    # Ranks 0 and 1 share a 1-unit link but both have 4 units to rank 2: relaying through rank 2
    # beats sending direct, which the node's exact alltoall finds.
    node = Topology("thin", ((0, 1, 4), (1, 0, 4), (4, 4, 0)))
    topology = compose_nodes(node, 2, nic_units=4)
    result = solve_alltoall_at_scale(topology, time_limit=NODE_TIME_S)
    by_name = {c[0]: c[1] for c in result.details["candidates"]}
    assert set(by_name) == {"direct", "hierarchical"}
    assert result.details["schedule"] == "hierarchical"
    assert by_name["hierarchical"] < by_name["direct"]
    assert result.rounds_per_chunk == by_name["hierarchical"] >= result.details["exact_bound"]
    assert find_problems(result.algorithm) == []


def test_sixty_four_gpus_meet_the_nic_bound():
    # 8 DGX A100: a node's 8 x 56 blocks for the other nodes leave through 8 one-unit NICs.
    topology = compose_nodes(get_topology("dgx-a100"), 8)
    result = solve_alltoall_at_scale(topology)
    assert result.details["schedule"] == "direct" and result.details["exact_bound"] is None
    assert result.rounds_per_chunk == result.lower_bound == 56
    assert "node 0" in result.details["cut_bound"].cut
    assert find_problems(result.algorithm) == []


def test_the_cut_bound_is_cheap_at_1024_ranks():
    # 128 DGX H100 (NICs of 2 units): 8 x 1016 blocks leave each node through 8 x 2 units.
    topology = compose_nodes(get_topology("dgx-h100"), 128)
    bound = alltoall_cut_bound(topology)
    assert (bound.blocks, bound.capacity) == (8 * 1016, 16)
    assert bound.rounds_per_chunk == Fraction(8 * 1016, 16)


def test_the_composed_structure_is_recognised_only_when_exact():
    topology = _topology("dgx-a100x2")
    structure = _composed_structure(topology)
    assert structure is not None
    assert (structure.nodes, structure.n, structure.nic_units) == (2, 8, 1)
    assert len(structure.egress) == len(structure.ingress) == 8
    # A group that is neither node-local nor a NIC's: the generic single-rank cuts are used.
    odd = Topology(topology.name, topology.links,
                   topology.groups + (BandwidthGroup(frozenset({0, 8}), frozenset({1}), 5),),
                   metadata=topology.metadata)
    assert _composed_structure(odd) is None
    assert alltoall_cut_bound(odd).rounds_per_chunk <= _lp(odd)


def test_inputs_are_checked():
    # a ring has neither all-pairs links nor nodes: routed up to ROUTED_MAX_RANKS, refused above
    assert solve_alltoall_at_scale(get_topology("ring:4")).details["schedule"] == "routed"
    with pytest.raises(InvalidTopologyError, match="every pair"):
        solve_alltoall_at_scale(get_topology("ring:300"))
    with pytest.raises(InvalidInstanceError, match="max_chunks"):
        solve_alltoall_at_scale(_topology("fc4x2"), max_chunks=0)


@st.composite
def _composed(draw):
    """A random connected node of 2-4 ranks (bandwidths 1-3), composed 1-3 times (<= 12 ranks)."""
    n = draw(st.integers(2, 4))
    order = draw(st.permutations(list(range(n))))
    links = [[0] * n for _ in range(n)]
    for a, b in zip(order, order[1:]):
        links[a][b] = links[b][a] = draw(st.integers(1, 3))
    for a in range(n):
        for b in range(n):
            if a != b and not links[a][b] and draw(st.booleans()):
                links[a][b] = draw(st.integers(1, 3))
    node = Topology("random", tuple(map(tuple, links)))
    return compose_nodes(node, draw(st.integers(1, 3)), nic_units=draw(st.integers(1, 3)))


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(topology=_composed())
def test_random_composed_topologies_verify_and_never_beat_the_lp_bound(topology):
    result = solve_alltoall_at_scale(topology, time_limit=NODE_TIME_S)
    assert find_problems(result.algorithm) == []
    details = result.details
    assert details["exact_bound"] is not None
    cut = details["cut_bound"].rounds_per_chunk
    assert cut <= details["exact_bound"] <= result.rounds_per_chunk
