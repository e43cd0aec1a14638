"""Hierarchical algorithms on composed multi-node topologies: every one verifies, implements the
collective asked for, and never beats the exact lower bounds."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from collsynth.algorithm import Algorithm, Send, Step, find_problems
from collsynth.bounds import compute_bounds
from collsynth.collective import allgather, standard_collective
from collsynth.errors import (
    InvalidCollectiveError,
    InvalidTopologyError,
    UnknownNameError,
    VerificationError,
)
from collsynth.synthesis.hierarchical import (
    HIERARCHICAL_COLLECTIVES,
    hierarchical_algorithm,
    network_layout,
)
from collsynth.topology import Topology, compose_nodes, get_topology
from collsynth.topology.families import fully_connected, ring

NODE_TIME_S = 20.0

TOPOLOGIES = {
    "fc4x2": lambda: compose_nodes(fully_connected(4), 2, nic_units=1),
    "ring4x2": lambda: compose_nodes(ring(4), 2, nic_units=1),
    "ring4x3": lambda: compose_nodes(ring(4), 3, nic_units=2),
    "dgx-a100x2": lambda: compose_nodes(get_topology("dgx-a100"), 2),
}
_CACHE: dict[str, Topology] = {}


def _topology(name: str) -> Topology:
    if name not in _CACHE:
        _CACHE[name] = TOPOLOGIES[name]()
    return _CACHE[name]


def _cases():
    for name in TOPOLOGIES:
        for family in HIERARCHICAL_COLLECTIVES:
            roots = [None] if family not in ("broadcast", "reduce") else [0, "last"]
            for root in roots:
                yield pytest.param(name, family, root, id=f"{name}-{family}-{root}")


def _check(result, topology: Topology, family: str, root: int | None) -> None:
    """The result is a correct algorithm for ``family`` and respects the exact bounds."""
    algorithm = result.algorithm
    assert find_problems(algorithm) == []  # replayed again, independently of the library
    assert algorithm.topology == topology
    expected = standard_collective(family, topology.num_ranks, root=root).split(algorithm.chunks)
    assert algorithm.collective.precondition == expected.precondition
    assert algorithm.collective.postcondition == expected.postcondition
    assert algorithm.collective.combining == expected.combining
    assert result.rounds_per_chunk == algorithm.rounds_per_chunk
    assert result.steps == algorithm.num_steps
    if topology.num_ranks <= 16:
        collective = standard_collective(family, topology.num_ranks, root=root)
        bounds = compute_bounds(topology, collective)
        assert result.rounds_per_chunk >= bounds.rounds_per_chunk
        assert result.steps >= bounds.steps
        if bounds.composed_rounds_per_chunk is not None:  # allreduce: reduce-scatter + allgather
            assert result.rounds_per_chunk >= bounds.composed_rounds_per_chunk
            assert result.steps >= bounds.composed_steps


@pytest.mark.parametrize("name, family, root", list(_cases()))
def test_every_collective_verifies_and_respects_the_bounds(name, family, root):
    topology = _topology(name)
    if root == "last":
        root = topology.num_ranks - 1
    result = hierarchical_algorithm(topology, family, root=root, time_limit=NODE_TIME_S)
    _check(result, topology, family, root)
    assert result.details["node_algorithms"]
    for node_algorithm in result.details["node_algorithms"]:
        assert node_algorithm.topology.num_ranks == network_layout(topology).ranks_per_node


def test_allgather_follows_the_standard_chunk_numbering():
    # Chunk c (its pieces c*C .. c*C + C - 1) starts on rank c only; the inter-node sends carry
    # rank g's pieces from rank g to its peers, never another rank's.
    topology = _topology("ring4x2")
    algorithm = hierarchical_algorithm(topology, "allgather", time_limit=NODE_TIME_S).algorithm
    pieces = algorithm.chunks
    first = algorithm.steps[0].sends
    between_nodes = [s for s in first if s.src // 4 != s.dst // 4]
    assert between_nodes
    assert all(s.chunk // pieces == s.src and s.dst == (s.src + 4) % 8 for s in between_nodes)


@pytest.mark.parametrize("batches", [1, 2])
def test_every_pipeline_depth_verifies(batches):
    topology = _topology("ring4x3")
    for family in ("allgather", "reduce_scatter", "broadcast", "reduce"):
        root = 5 if family in ("broadcast", "reduce") else None
        result = hierarchical_algorithm(topology, family, root=root, batches=batches,
                                        time_limit=NODE_TIME_S)
        _check(result, topology, family, root)
        assert result.details["pipeline"][0][0] == batches


def test_pipelining_beats_one_batch_on_eight_nodes():
    topology = compose_nodes(get_topology("dgx-a100"), 8)
    one = hierarchical_algorithm(topology, "allgather", batches=1, parts=1,
                                 time_limit=NODE_TIME_S)
    # One NIC step, then the node allgathers.
    assert one.details["pipeline"] == ((1, 1),) and one.steps == 2
    best = hierarchical_algorithm(topology, "allgather", time_limit=NODE_TIME_S)
    assert find_problems(best.algorithm) == []
    assert best.rounds_per_chunk < one.rounds_per_chunk
    assert best.algorithm.chunks == one.algorithm.chunks * best.details["pipeline"][0][1]
    # The NICs cut: a node must receive the 56 chunks of the other nodes through 8 one-unit NICs.
    assert best.rounds_per_chunk >= 7


def test_a_given_node_algorithm_is_used_and_repriced():
    # A pair of GPUs with a 2-unit link and half-unit NICs: composing doubles every bandwidth,
    # so the node allgather written for the pair in its own units is re-priced on the copy.
    pair = Topology("pair", ((0, 2), (2, 0)), unit_gbps=25.0,
                    metadata={"nic": {"count": 2, "gbps": 12.5, "per_gpu": True}})
    topology = compose_nodes(pair, 2)
    assert topology.metadata["network"]["rescale"] == 2
    node = Algorithm("swap", pair, allgather(2), (Step(3, (Send(0, 0, 1), Send(1, 1, 0))),))
    result = hierarchical_algorithm(topology, "allgather", node_algorithm=node)
    _check(result, topology, "allgather", None)
    (used,) = result.details["node_algorithms"]
    assert used.name == "swap" and used.steps[0].rounds == 1  # re-priced: 1 round is enough


def test_a_node_algorithm_for_another_collective_is_refused():
    topology = _topology("fc4x2")
    node = network_layout(topology).node
    sends = tuple(Send(s, s, d) for s in range(4) for d in range(4) if s != d)
    wrong = Algorithm("ag", node, allgather(4), (Step(1, sends),))
    with pytest.raises(InvalidCollectiveError, match="reduce_scatter"):
        hierarchical_algorithm(topology, "reduce_scatter", node_algorithm=wrong)
    with pytest.raises(InvalidCollectiveError, match="mapping"):
        hierarchical_algorithm(topology, "allreduce", node_algorithm=wrong)
    with pytest.raises(InvalidCollectiveError, match="unknown key"):
        hierarchical_algorithm(topology, "allreduce", node_algorithm={"gather": wrong})


def test_a_node_algorithm_over_a_missing_link_is_refused():
    topology = _topology("ring4x2")
    bad = Algorithm("jump", get_topology("fully-connected:4"), allgather(4),
                    (Step(1, tuple(Send(s, s, d) for s in range(4) for d in range(4) if s != d)),))
    with pytest.raises(VerificationError, match="does not have"):
        hierarchical_algorithm(topology, "allgather", node_algorithm=bad)


def test_inputs_are_checked():
    topology = _topology("fc4x2")
    with pytest.raises(InvalidTopologyError, match="not a multi-node topology"):
        hierarchical_algorithm(get_topology("ring:4"), "allgather")
    with pytest.raises(UnknownNameError, match="gather"):
        hierarchical_algorithm(topology, "gather")
    with pytest.raises(InvalidCollectiveError, match="takes no root"):
        hierarchical_algorithm(topology, "allgather", root=1)
    with pytest.raises(InvalidCollectiveError, match="root 8"):
        hierarchical_algorithm(topology, "broadcast", root=8)
    with pytest.raises(InvalidCollectiveError, match="batches"):
        hierarchical_algorithm(topology, "allgather", batches=0)
    with pytest.raises(InvalidCollectiveError, match="parts"):
        hierarchical_algorithm(topology, "allgather", parts=True)


def _by_hand(links, nodes, per_node) -> Topology:
    return Topology("by-hand", links,
                    metadata={"network": {"nodes": nodes, "ranks_per_node": per_node}})


def test_malformed_network_records_are_refused():
    full = tuple(tuple(0 if a == b else 1 for b in range(4)) for a in range(4))
    with pytest.raises(InvalidTopologyError, match="3 nodes of 2 ranks"):
        network_layout(_by_hand(full, 3, 2))
    with pytest.raises(InvalidTopologyError, match="ranks_per_node"):
        network_layout(_by_hand(full, 2, "2"))
    # node 1's internal link is missing: one node algorithm cannot serve both nodes
    uneven = tuple(tuple(0 if (a == b or {a, b} == {2, 3}) else 1 for b in range(4))
                   for a in range(4))
    with pytest.raises(InvalidTopologyError, match="node 1"):
        network_layout(_by_hand(uneven, 2, 2))
    # no link between the nodes' local ranks 0
    cut = tuple(tuple(0 if (a == b or {a, b} == {0, 2}) else 1 for b in range(4))
                for a in range(4))
    with pytest.raises(InvalidTopologyError, match="no link 0->2"):
        hierarchical_algorithm(_by_hand(cut, 2, 2), "allgather")


@st.composite
def _composed(draw):
    """A random connected node of 2-4 ranks (bandwidths 1-2), composed 1-3 times."""
    n = draw(st.integers(2, 4))
    order = draw(st.permutations(list(range(n))))
    links = [[0] * n for _ in range(n)]
    for a, b in zip(order, order[1:]):  # a spanning path keeps the node connected
        links[a][b] = links[b][a] = draw(st.integers(1, 2))
    for a in range(n):
        for b in range(n):
            if a != b and not links[a][b] and draw(st.booleans()):
                links[a][b] = draw(st.integers(1, 2))
    node = Topology("random", tuple(map(tuple, links)))
    nodes = draw(st.integers(1, 3))
    return compose_nodes(node, nodes, nic_units=draw(st.integers(1, 2)))


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(topology=_composed(), family=st.sampled_from(HIERARCHICAL_COLLECTIVES),
       root_seed=st.integers(0, 1000))
def test_random_composed_topologies_always_verify(topology, family, root_seed):
    root = root_seed % topology.num_ranks if family in ("broadcast", "reduce") else None
    result = hierarchical_algorithm(topology, family, root=root, time_limit=NODE_TIME_S)
    _check(result, topology, family, root)
