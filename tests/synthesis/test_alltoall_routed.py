"""The routed alltoall schedule, for topologies with neither all-pairs links nor nodes (tori,
meshes, hypercubes): verified, and measured against bisection bounds counted by hand."""

from __future__ import annotations

from fractions import Fraction

import pytest

from collsynth.algorithm.verify import verify
from collsynth.synthesis.alltoall_scale import solve_alltoall_at_scale
from collsynth.topology import get_topology

# name, bisection bound: cut into S and S' (|S| * |S'| blocks cross each way) over the cut links
CASES = [
    # torus:4x4: halves of 8 ranks; the 4 rings of the cut dimension are each cut twice: 8 links
    ("torus:4x4", Fraction(8 * 8, 8)),
    # torus:3x5: cut the size-5 rings into 2 + 3 columns: 6 and 9 ranks, 3 rings cut twice
    ("torus:3x5", Fraction(6 * 9, 6)),
    # mesh:3x4: the cut between columns 1 and 2 crosses 3 links, 6 ranks on each side
    ("mesh:3x4", Fraction(6 * 6, 3)),
    # hypercube:4: the cut on one bit crosses 8 links, 8 ranks on each side
    ("hypercube:4", Fraction(8 * 8, 8)),
]


@pytest.mark.parametrize("name, bisection", CASES)
def test_routed_alltoall_is_valid_and_near_the_bisection(name, bisection):
    result = solve_alltoall_at_scale(get_topology(name))
    assert result.details["schedule"] == "routed"
    verify(result.algorithm)
    assert result.lower_bound == bisection
    assert result.rounds_per_chunk >= bisection
    # not optimal in general; a loose ceiling so a regression to unbalanced routes shows
    assert result.rounds_per_chunk <= Fraction(5, 4) * bisection
