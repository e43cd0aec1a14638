"""The tree engine on tori and hypercubes: their translations and point symmetries are real
automorphisms, and the engine reaches the ingress bound with few pieces per root.

Every expected bound is a hand count: on a grid with one unit per link direction where every
rank has ``d`` neighbours, each rank must receive ``n - 1`` chunks over ``d`` incoming links,
so no allgather takes fewer than ``(n - 1) / d`` rounds per chunk.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from collsynth.algorithm import find_problems
from collsynth.collective import standard_collective
from collsynth.graph.translations import grid_translations, point_symmetries
from collsynth.synthesis.bandwidth_optimal import solve_bandwidth_optimal
from collsynth.topology import Topology, get_topology


def _detail(result, name: str):
    """One of an engine's own figures: an attribute of its result, or an entry of the result's
    ``details`` where the engines share one result type."""
    details = getattr(result, "details", None)
    return details[name] if details is not None and name in details else getattr(result, name)


def _is_automorphism(perm: np.ndarray, topology: Topology) -> bool:
    """Checked pair by pair, independently of the library's own check."""
    n = topology.num_ranks
    return all(topology.bandwidth(a, b) == topology.bandwidth(int(perm[a]), int(perm[b]))
               for a in range(n) for b in range(n) if a != b)


@pytest.mark.parametrize("name, dims", [("torus:4x4", (4, 4)), ("torus:3x4", (3, 4)),
                                        ("torus:2x3x2", (2, 3, 2)), ("hypercube:3", (2, 2, 2))])
def test_every_translation_is_an_automorphism_taking_rank_zero_to_its_rank(name, dims):
    topology = get_topology(name)
    translations = grid_translations(topology)
    assert translations.dims == dims
    for g in range(topology.num_ranks):
        perm = translations.permutation(g)
        assert perm[0] == g
        assert _is_automorphism(perm, topology)
        back = translations.shift(perm, -g)
        assert back.tolist() == list(range(topology.num_ranks))


def test_hypercube_translation_is_exclusive_or():
    translations = grid_translations(get_topology("hypercube:4"))
    ranks = np.arange(16)
    for g in range(16):
        assert translations.permutation(g).tolist() == (ranks ^ g).tolist()


def test_a_name_is_never_trusted_and_meshes_have_no_translations():
    mesh = get_topology("mesh:4x4")
    assert grid_translations(mesh) is None
    impostor = Topology("torus:4x4", mesh.links)
    assert grid_translations(impostor) is None


@pytest.mark.parametrize("name, count", [("torus:4x4", 4), ("torus:3x3x3", 6),
                                         ("hypercube:4", 4), ("torus:3x4", 2)])
def test_point_symmetries_fix_rank_zero_and_preserve_the_links(name, count):
    # Square torus: turning x <-> y and reversing both make a group of 4; a 3-cube of 3s: 3
    # turns times 2; a hypercube: 4 turns of its bits (reversing a size-2 dimension is no
    # change); 3x4: only reversing.
    topology = get_topology(name)
    found = point_symmetries(topology, grid_translations(topology))
    assert len(found) == count
    assert found[0].tolist() == list(range(topology.num_ranks))
    for perm in found:
        assert perm[0] == 0
        assert sorted(perm.tolist()) == list(range(topology.num_ranks))
        assert _is_automorphism(perm, topology)


@pytest.mark.parametrize("name, bound, most_pieces", [("torus:4x4", Fraction(15, 4), 8),
                                                      ("hypercube:4", Fraction(15, 4), 8),
                                                      ("torus:3x3", Fraction(8, 4), 8),
                                                      ("torus:4x4x2", Fraction(31, 5), None)])
def test_tree_engine_reaches_the_ingress_bound_on_grids(name, bound, most_pieces):
    topology = get_topology(name)
    result = solve_bandwidth_optimal(topology, standard_collective("allgather",
                                                                   topology.num_ranks), stages=2)
    assert result.lower_bound == bound
    assert result.steady_state_rounds_per_chunk == bound and result.optimal
    if most_pieces is not None:  # all link directions alike: a handful of pieces per root,
        assert _detail(result, "pieces_per_root") <= most_pieces  # not 1024 as without them
    assert find_problems(result.algorithm) == []


def test_reduce_scatter_on_a_torus_is_optimal_too():
    topology = get_topology("torus:4x4")
    result = solve_bandwidth_optimal(topology, standard_collective("reduce_scatter", 16),
                                     stages=2)
    assert result.optimal and result.steady_state_rounds_per_chunk == Fraction(15, 4)
    assert find_problems(result.algorithm) == []
