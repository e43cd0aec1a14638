"""Composed topologies stored sparsely: no dense matrix at scale, the same bounds as the dense form."""

from fractions import Fraction

import pytest

from collsynth.bounds import compute_bounds
from collsynth.bounds.throughput import fabric_rounds, tree_rounds
from collsynth.collective import standard_collective
from collsynth.errors import InputTooLargeError
from collsynth.graph.fabric import build_fabric
from collsynth.topology import MAX_DENSE_RANKS, Topology, compose_nodes, get_topology
from collsynth.topology.model import SparseGroups, SparseLinks, covered_units


def _dense(t: Topology) -> Topology:
    """The same topology given as a matrix and a tuple of groups (the pre-sparse form)."""
    return Topology(t.name, tuple(t.links), tuple(t.groups), t.unit_gbps, t.alpha_us,
                    t.description, t.metadata)


def test_32768_gpus_are_held_sparsely_and_bounded_exactly():
    big = compose_nodes(get_topology("dgx-h100"), 4096)
    assert big.num_ranks == 32768
    assert isinstance(big.links, SparseLinks) and isinstance(big.groups, SparseGroups)
    bounds = compute_bounds(big, standard_collective("allgather", big.num_ranks))
    # Node 0 needs the 32760 chunks of the other nodes through its 8 NICs of 2 units (50 GB/s
    # against a 25 GB/s unit): 32760 / 16 rounds; a rank alone: 32767 / (18 NVLink + 2) less.
    assert bounds.rounds_per_chunk == Fraction(32760, 16)
    assert bounds.steps == 1  # every rank has a link to every rank of another node
    assert big.links._dense is None and big.groups._dense is None  # nothing dense was built
    with pytest.raises(InputTooLargeError, match="32768 ranks"):
        big.link_array
    with pytest.raises(InputTooLargeError, match=str(MAX_DENSE_RANKS)):
        list(big.groups)
    assert big.links[9][1:3] == (2, 2)  # one row alone is still readable
    assert big.links[9][8:10] == (18, 0)


def test_allreduce_at_32768_gpus():
    big = compose_nodes(get_topology("dgx-h100"), 4096)
    bounds = compute_bounds(big, standard_collective("allreduce", big.num_ranks))
    # reduce-scatter and allgather each 32760/16 rounds per chunk (the node cut, both ways),
    # over 32768 base chunks of the buffer.
    assert bounds.composed_rounds_per_chunk == Fraction(2 * 32760, 16 * 32768)
    assert bounds.composed_steps == 2


def test_sparse_reads_as_the_dense_matrix():
    small = compose_nodes(get_topology("ring:4"), 3, nic_units=1, fabric="rail",
                          oversubscription=2)
    dense = _dense(small)
    assert small.links == dense.links and tuple(small.groups) == tuple(dense.groups)
    assert small.reversed().links == dense.reversed().links
    assert tuple(small.reversed().groups) == tuple(dense.reversed().groups)
    assert repr(small) == repr(dense)


SYSTEMS = [
    ("switch", dict(nic_units=1)),
    ("oversubscribed", dict(nic_units=2, oversubscription=3)),
    ("leaf-spine", dict(nic_units=1, fabric="leaf-spine", nodes_per_leaf=11, oversubscription=2)),
    ("rail", dict(nic_units=1, fabric="rail", oversubscription=4)),
]


@pytest.mark.parametrize("label, options", SYSTEMS, ids=[s[0] for s in SYSTEMS])
def test_sparse_bounds_equal_dense_bounds(label, options):
    # 33 nodes of 4: 132 ranks, above the size where the bounds switch to the fabric's cuts.
    sparse = compose_nodes(get_topology("ring:4"), 33, **options)
    dense = _dense(sparse)
    for name in ("allgather", "reduce_scatter", "allreduce"):
        collective = standard_collective(name, sparse.num_ranks)
        assert compute_bounds(sparse, collective) == compute_bounds(dense, collective)


def test_allreduce_cut_is_measured_exactly_however_the_system_is_stored():
    # DGX H100 x 24 under 3:1 leaves of 4 nodes: a leaf's uplinks bind. Measured by a maximum
    # flow on the composition's folded fabric and on the dense matrix's own fabric, the same cut
    # has the same capacity (the greedy group lowering once gave 1/60 on the dense form).
    sparse = compose_nodes(get_topology("dgx-h100"), 24, fabric="leaf-spine", nodes_per_leaf=4,
                           oversubscription=3)
    collective = standard_collective("allreduce", sparse.num_ranks)
    assert compute_bounds(sparse, collective) == compute_bounds(_dense(sparse), collective)


@pytest.mark.parametrize("label, options", SYSTEMS, ids=[s[0] for s in SYSTEMS])
def test_quotient_equals_every_rank_on_the_full_fabric(label, options):
    sparse = compose_nodes(get_topology("ring:4"), 6,
                           **dict(options, **({"nodes_per_leaf": 2} if label == "leaf-spine"
                                              else {})))
    roots = {r: 1 for r in range(sparse.num_ranks)}
    for topology in (sparse, sparse.reversed()):
        every_rank = tree_rounds(build_fabric(_dense(topology)), roots)[0]
        assert fabric_rounds(topology, roots)[0] == every_rank


def test_steps_through_another_node():
    # Inside a 4-rank line the ends are 3 hops apart, but 2 through any rank of another node.
    sparse = compose_nodes(get_topology("line:4"), 33, nic_units=1)
    for name in ("allgather", "allreduce"):
        collective = standard_collective(name, sparse.num_ranks)
        assert compute_bounds(sparse, collective).steps == 2
        assert compute_bounds(sparse, collective) == compute_bounds(_dense(sparse), collective)


def test_sparse_forms_concatenate_and_compare_like_tuples():
    small = compose_nodes(get_topology("ring:4"), 2, nic_units=1)
    dense = _dense(small)
    assert small.groups + () == dense.groups and () + small.groups == dense.groups
    assert small.links + () == dense.links
    assert small.links == [list(row) for row in dense.links]
    assert small.groups == list(dense.groups)


def test_sparse_forms_concatenate_in_order():
    small = compose_nodes(get_topology("ring:4"), 3, nic_units=1, fabric="rail",
                          oversubscription=2)
    groups = tuple(_dense(small).groups)
    extra = groups[0]
    assert (extra,) + small.groups == (extra,) + groups   # the tuple's items first
    assert small.groups + (extra,) == groups + (extra,)
    assert ((extra,) + small.groups)[0] == extra and (small.groups + (extra,))[-1] == extra
    assert [extra] + list(small.groups) == [extra, *groups]
    row = (0,) * small.num_ranks
    assert (row,) + small.links == (row,) + tuple(_dense(small).links)
    assert small.links + (row,) == tuple(_dense(small).links) + (row,)


def test_equal_sparse_and_dense_forms_hash_alike():
    # Equal objects must hash alike: a sparse form equals the tuple it reads as, so it hashes
    # as that tuple, and a composed topology as its dense twin.
    small = compose_nodes(get_topology("ring:4"), 3, nic_units=1, fabric="rail",
                          oversubscription=2)
    dense = _dense(small)
    assert small.links == dense.links and hash(small.links) == hash(dense.links)
    assert small.groups == dense.groups and hash(small.groups) == hash(dense.groups)
    assert small == dense and hash(small) == hash(dense)
    assert len({small.links, dense.links}) == 1 and len({small, dense}) == 1
    # Another composition of the same matrix (a different fabric name) is equal too.
    again = compose_nodes(get_topology("ring:4"), 3, nic_units=1, fabric="rail",
                          oversubscription=2)
    assert again.links == small.links and hash(again.links) == hash(small.links)


def test_one_copy_of_the_topology_model():
    # The classes sparse topologies are built with are the ones their module exports (pytest
    # once loaded collsynth/topology/model.py twice when it was named for its doctests).
    import sys

    import collsynth.topology.compose as compose
    import collsynth.topology.model as model

    assert sys.modules["collsynth.topology.model"] is model
    assert compose.SparseLinks is model.SparseLinks is SparseLinks
    assert compose.Topology is model.Topology is Topology


def test_doctests_and_tests_of_the_topology_model_run_together():
    """``pytest collsynth/topology/model.py tests/topology/test_sparse.py`` (the module's
    doctests with its tests): the conftest.py at the root imports collsynth first, so pytest's
    importlib mode finds the module in sys.modules instead of loading the file again."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "collsynth/topology/model.py", "tests/topology/test_sparse.py",
         # the doctests and the test above only (a node id alone changes the import order)
         "-k", "model.py or test_one_copy_of_the_topology_model"],
        cwd=root, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]


@pytest.mark.parametrize("label, options", SYSTEMS, ids=[s[0] for s in SYSTEMS])
def test_binding_groups_and_single_links_read_as_the_dense_form(label, options):
    # The link sums by node block (no covered link listed), one link or one node's block from
    # the composition (no matrix built) equal the dense form's, both ways round.
    sparse = compose_nodes(get_topology("mi250"), 4, **dict(
        options, **({"nodes_per_leaf": 2} if label == "leaf-spine" else {})))
    for topology in (sparse, sparse.reversed()):
        n, per = topology.num_ranks, 8
        binding = topology.binding_groups
        units = covered_units(topology, topology.groups)
        links = [[topology.bandwidth(a, b) for b in range(n)] for a in range(n)]
        blocks = [((start, stop), topology.link_block(start, stop))
                            for start, stop in ((0, per), (per, 2 * per), (3, 5), (6, 19), (0, n))]
        assert topology.links._dense is None  # none of it built the matrix
        dense = _dense(topology)
        assert binding == tuple(g for g, _ in dense.effective_groups)
        assert topology.effective_groups == dense.effective_groups
        assert units == covered_units(dense, dense.groups)
        assert links == [list(row) for row in dense.links]
        for (start, stop), block in blocks:
            assert (block == dense.link_array[start:stop, start:stop]).all()


def test_binding_groups_of_7344_gpus_without_their_53_million_links():
    big = compose_nodes(get_topology("gb200-nvl72"), 102)
    assert len(big.binding_groups) == 4 * 7344  # every GPU's NVLink port and NIC, each way
    assert "effective_groups" not in vars(big) and big.links._dense is None
    assert big.bandwidth(0, 1) == 18 * big.links.composition.scale and big.bandwidth(0, 72) == \
        big.links.composition.units
    with pytest.raises(IndexError):
        big.bandwidth(0, 7344)
