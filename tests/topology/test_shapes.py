"""The direct-connect families (``torus:AxB``, ``mesh:AxB``, ``hypercube:D``), physical figures
given in a name or on the command line, and their bounds against hand counts.

Ranks are row-major (``torus:AxB``: ``(x, y)`` is ``x * B + y``); every link is 1 unit per
direction. The expected values below are worked out by hand in the comments, not by the code.
"""

from __future__ import annotations

import json
from fractions import Fraction

import pytest

from collsynth.bounds import compute_bounds
from collsynth.cli import EXIT_ERROR, EXIT_OK, main
from collsynth.collective import standard_collective
from collsynth.errors import InputTooLargeError, InvalidTopologyError
from collsynth.resolve import resolve_topology
from collsynth.topology import get_topology, hypercube, mesh, torus


def neighbours(topology, rank):
    return {dst for dst in range(topology.num_ranks) if topology.bandwidth(rank, dst)}


# -- structure ------------------------------------------------------------------------------------


def test_torus_4x4_links_by_hand():
    t = get_topology("torus:4x4")
    assert t.num_ranks == 16 and t.is_symmetric()
    # (0, 0): (1, 0) = 4, (3, 0) = 12 (wrap), (0, 1) = 1, (0, 3) = 3 (wrap)
    assert neighbours(t, 0) == {4, 12, 1, 3}
    # (1, 1) = 5: (0, 1) = 1, (2, 1) = 9, (1, 0) = 4, (1, 2) = 6
    assert neighbours(t, 5) == {1, 9, 4, 6}
    assert all(bw in (0, 1) for row in t.links for bw in row)
    assert len(t.edges) == 16 * 4


def test_a_torus_dimension_of_size_2_is_one_link():
    # (0, 0) of torus:2x3 = rank 0: along the size-2 dimension only (1, 0) = 3, once; along the
    # size-3 dimension (0, 1) = 1 and (0, 2) = 2.
    t = get_topology("torus:2x3")
    assert neighbours(t, 0) == {1, 2, 3} and t.bandwidth(0, 3) == 1
    # So torus:2x2x2 is the 3-cube, rank for rank (x*4 + y*2 + z = the bits of the rank).
    assert get_topology("torus:2x2x2").links == get_topology("hypercube:3").links
    # and torus:2x2 the 4-cycle 0-1-3-2-0
    assert get_topology("torus:2x2").links == tuple(
        tuple(int(frozenset({a, b}) in ({0, 1}, {1, 3}, {3, 2}, {2, 0})) for b in range(4))
        for a in range(4))


def test_mesh_has_no_wrap_around():
    m = get_topology("mesh:3x3")
    assert neighbours(m, 0) == {1, 3}          # a corner
    assert neighbours(m, 4) == {1, 3, 5, 7}    # the centre
    assert neighbours(m, 2) == {1, 5}          # (0, 2): no link to (0, 0)
    # mesh:2x3 has 1 * 3 + 2 * 2 = 7 links, 14 directions
    assert len(get_topology("mesh:2x3").edges) == 14
    # one dimension: the line
    assert get_topology("mesh:5").links == get_topology("line:5").links
    assert get_topology("torus:5").links == get_topology("ring:5").links


def test_hypercube_links_differ_in_one_bit():
    h = get_topology("hypercube:4")
    assert h.num_ranks == 16
    assert neighbours(h, 0b0101) == {0b0100, 0b0111, 0b0001, 0b1101}
    assert neighbours(get_topology("hypercube:1"), 0) == {1}


def test_builders_match_names():
    assert torus((3, 4)).links == get_topology("Torus:3X4").links
    assert mesh([2, 2, 2]).links == get_topology("mesh:2x2x2").links
    assert hypercube(2).links == get_topology("hypercube:2").links


@pytest.mark.parametrize("name, error, fragment", [
    ("torus:4x1", InvalidTopologyError, "dimension 2 has size 1"),
    ("mesh:1x4", InvalidTopologyError, "dimension 1 has size 1"),
    ("torus:4xa", InvalidTopologyError, "torus:AxB"),
    ("torus:", InvalidTopologyError, "torus:AxB"),
    ("mesh:4x-2", InvalidTopologyError, "mesh:AxB"),
    ("hypercube:0", InvalidTopologyError, "D >= 1"),
    ("hypercube:x", InvalidTopologyError, "hypercube:D"),
    ("hypercube:14", InputTooLargeError, "8192"),              # 16384 ranks
    ("torus:100x100", InputTooLargeError, "10000 ranks"),
    ("torus:99999999999x2", InputTooLargeError, "8192"),      # refused before anything is built
    ("ring:4,unit_gbps=0", InvalidTopologyError, "positive"),
    ("ring:4,unit_gbps=nan", InvalidTopologyError, "positive"),
    ("ring:4,alpha_us=", InvalidTopologyError, "positive"),
    ("ring:4,gbps=3", InvalidTopologyError, "unit_gbps=NUMBER"),
    ("ring:4,fast", InvalidTopologyError, "not understood"),
])
def test_bad_names_are_refused_clearly(name, error, fragment):
    with pytest.raises(error, match=fragment):
        get_topology(name)


# -- physical figures -----------------------------------------------------------------------------


def test_figures_in_the_name():
    t = get_topology("torus:4x4, unit_gbps=12.5 ,alpha-us=1")
    assert (t.unit_gbps, t.alpha_us) == (12.5, 1.0)
    assert t.links == get_topology("torus:4x4").links
    assert get_topology("torus:4x4").unit_gbps is None
    # a figure replaces a built-in's own; the other stays
    dgx = get_topology("dgx1,alpha_us=2")
    assert (dgx.unit_gbps, dgx.alpha_us) == (25.0, 2.0)
    # "12.5" is not read as a file extension
    assert resolve_topology("ring:4,unit_gbps=12.5").unit_gbps == 12.5


def test_resolve_applies_figures_to_the_node_before_composing():
    # a 4-ring node of 10 GB/s units, NIC of 1 unit: the composed unit stays 10 GB/s
    t = resolve_topology("ring:4", nodes=2, nic_units=1, unit_gbps=10, alpha_us=3)
    assert (t.unit_gbps, t.alpha_us) == (10.0, 3.0)
    with pytest.raises(InvalidTopologyError, match="unit_gbps"):
        resolve_topology("ring:4", unit_gbps=-1)


def test_time_needs_figures_and_takes_them_from_the_command_line(tmp_path, capsys):
    algo = tmp_path / "ag.json"
    assert main(["solve", "least-steps", "ring:4", "allgather", "-q", "-o", str(algo)]) == EXIT_OK
    capsys.readouterr()
    assert main(["time", str(algo), "--sizes", "1MB"]) == EXIT_ERROR
    err = capsys.readouterr().err
    assert "--unit-gbps" in err and "unit_gbps=" in err and len(err.strip().splitlines()) == 1
    assert main(["time", str(algo), "--sizes", "1MB", "--unit-gbps", "25", "--alpha-us", "1",
                 "--json"]) == EXIT_OK
    assert json.loads(capsys.readouterr().out)


def test_plan_without_figures_names_the_options(tmp_path, capsys):
    from pathlib import Path

    trace = Path(__file__).resolve().parents[1] / "fixtures" / "traces" / "fc4-mixed"
    code = main(["plan", str(trace), "--topology", "ring:4", "--no-cache", "-q",
                 "-o", str(tmp_path / "plan")])
    assert code == EXIT_ERROR
    err = capsys.readouterr().err
    assert "--unit-gbps" in err and "--alpha-us" in err
    assert not (tmp_path / "plan").exists()


# -- bounds against hand counts -------------------------------------------------------------------

# name, diameter (steps bound), allgather rounds-per-chunk bound, alltoall bound. Worked out:
# * steps: the farthest pair. torus AxB: floor(A/2) + floor(B/2); mesh: (A-1) + (B-1); hypercube
#   D: D (the complement of a rank differs in every bit).
# * allgather: a rank must receive n-1 chunks over its incoming links; the least-linked rank
#   binds: (n-1)/degree (torus: 2 per dimension of size > 2, 1 per dimension of size 2; mesh:
#   a corner has 1 per dimension; hypercube: D).
# * alltoall (None: not checked here): cut the shape in two halves S, S'; |S| * |S'| blocks
#   cross over the links of the cut, per direction.
SHAPES = [
    ("torus:4x4", 2 + 2, Fraction(15, 4), Fraction(8 * 8, 8)),
    # torus:4x4: halves 2x4 and 2x4; the 4 rings of the cut dimension are each cut twice: 8 links
    ("torus:3x5", 1 + 2, Fraction(14, 4), None),
    ("torus:2x3", 1 + 1, Fraction(5, 3), None),   # degree 1 + 2
    ("mesh:3x4", 2 + 3, Fraction(11, 2), Fraction(6 * 6, 3)),
    # mesh:3x4: the cut between columns 1 and 2 crosses 3 links; 6 ranks on each side
    ("mesh:2x3", 1 + 2, Fraction(5, 2), None),
    ("hypercube:3", 3, Fraction(7, 3), Fraction(4 * 4, 4)),
    # hypercube:3: the cut on one bit crosses 4 links; 4 ranks on each side
    ("hypercube:4", 4, Fraction(15, 4), Fraction(8 * 8, 8)),
]


@pytest.mark.parametrize("name, diameter, allgather, alltoall", SHAPES)
def test_bounds_match_hand_counts(name, diameter, allgather, alltoall):
    t = get_topology(name)
    n = t.num_ranks
    bounds = compute_bounds(t, standard_collective("allgather", n))
    assert bounds.steps == diameter
    assert bounds.rounds_per_chunk == allgather
    if alltoall is not None:
        assert compute_bounds(t, standard_collective("alltoall", n)).rounds_per_chunk == alltoall


def test_bounds_cli_on_a_torus(capsys):
    assert main(["bounds", "torus:4x4", "allgather", "--json", "--unit-gbps", "50"]) == EXIT_OK
    out = json.loads(capsys.readouterr().out)
    assert (out["num_ranks"], out["steps_lower_bound"]) == (16, 4)
    assert out["rounds_per_chunk_lower_bound"] == "15/4"


# -- engines --------------------------------------------------------------------------------------


def test_exact_synthesis_on_small_shapes_meets_the_diameter():
    from collsynth.synthesis import SolveOptions, Status, solve_least_steps

    for name, steps in (("torus:2x3", 2), ("hypercube:3", 3)):
        t = get_topology(name)
        result = solve_least_steps(t, standard_collective("allgather", t.num_ranks),
                                   options=SolveOptions(time_limit=60))
        assert result.status is Status.SAT
        assert result.algorithm.num_steps == steps  # the diameter, from the table above


def test_all_pairs_families_are_refused_above_their_dense_limit():
    """hub:8192 once ended in a MemoryError (2 x 8192 groups naming 8191 ranks each)."""
    with pytest.raises(InputTooLargeError, match="hub:8192: every pair of ranks is linked"):
        get_topology("hub:8192")
    with pytest.raises(InputTooLargeError, match="up to 1024 ranks"):
        get_topology("fully-connected:4097")


def test_a_rotation_symmetric_fabric_tests_one_rank():
    """On hub:64 every rank receives its 63 missing chunks at 1 per round: 63 rounds per chunk,
    found from rank 0's cuts alone, as from every rank's; a line is not rotation symmetric."""
    from collsynth.bounds.throughput import _rotation_is_symmetry, fabric_rounds, tree_rounds
    from collsynth.graph.fabric import build_fabric

    hub = get_topology("hub:64")
    roots = {r: 1 for r in range(64)}
    assert _rotation_is_symmetry(hub)
    assert fabric_rounds(hub, roots)[0] == tree_rounds(build_fabric(hub), roots)[0] == 63
    assert not _rotation_is_symmetry(get_topology("line:64"))
