"""NCCL's allreduce tree as a program: the checker proves it an allreduce, its trees are NCCL's,
and a tiny case's simulated time is worked out by hand from the model (docs/runtime-model.md).
"""

from __future__ import annotations

import dataclasses

import pytest

from collsynth.errors import InvalidInstanceError, UnknownNameError
from collsynth.export.check import check_program
from collsynth.timing.runtime_baselines import (double_binary_tree,
                                                runtime_tree, tree_program)
from collsynth.runtimes import PROTOCOLS, get_runtime
from collsynth.timing.runtime_model import prepare_program, simulate_program
from collsynth.topology.model import Topology



def runtime_prices(collective, topology, sizes, constants, algorithm="ring"):
    """The runtime's own ``algorithm`` priced by the program model with ``constants``."""
    from collsynth.timing.pricing import RuntimeAlgorithm
    from collsynth.timing.program_model import ProgramModel

    subject = RuntimeAlgorithm(get_runtime(constants.runtime), algorithm, collective, topology)
    return ProgramModel(constants).price(subject, sizes)

def constants(*, base: float, hop: float):
    """NCCL's defaults with one base and one hop latency for every protocol and link class."""
    c = get_runtime("nccl").defaults
    return c.replace(base_latency_us={p: base for p in PROTOCOLS},
                     hop_latency_us={k: {p: hop for p in PROTOCOLS} for k in ("intra", "network")},
                     ceiling_gbps={k: {p: None for p in PROTOCOLS} for k in ("intra", "network")})


def pair(gbps: float) -> Topology:
    """Two ranks, one link each way."""
    return Topology("pair", ((0, 1), (1, 0)), unit_gbps=gbps, alpha_us=1.0)


@pytest.mark.parametrize("nodes, chain", [(1, (0, 1, 2)), (2, (0,)), (2, (1, 0)),
                                          (3, (0, 2, 1)), (4, (0, 1)), (5, (0,))])
def test_the_checker_proves_the_tree_an_allreduce(nodes, chain):
    # The checker's symbolic execution: every rank ends with every chunk summed over all ranks
    # exactly once; no deadlock, race, or broken connection. With a second chain (reversed),
    # four trees share the buffer.
    for chains in ([chain], [chain, chain[::-1]]):
        p = tree_program(nodes, chains)
        report = check_program(p, runtime="msccl", collective="allreduce")
        assert report.ok, [str(x) for x in report.problems]
        assert p.nchannels == 2 * len(chains)
        assert p.nchunksperloop % (nodes * len(chain)) == 0
        assert p.nchunksperloop // p.nchannels >= 4   # at least 4 pipeline chunks per tree


def test_the_trees_are_nccls_double_binary_tree():
    # NCCL's src/graph/trees.cc illustration for 12 ranks (even: the second tree mirrors the
    # first): 0 -> 8 -> {4, 10}, 4 -> {2, 6}, 10 -> {9, 11}; mirrored, 11 -> 3 -> {7, 1}.
    first, second = double_binary_tree(12)
    assert first[0] == (-1, (8,)) and first[8] == (0, (4, 10)) and first[4] == (8, (2, 6))
    assert first[10] == (8, (9, 11)) and first[2] == (4, (1, 3)) and first[1] == (2, ())
    assert second[11] == (-1, (3,)) and second[3] == (11, (7, 1)) and second[7] == (3, (9, 5))
    # Odd: the second tree is the first shifted by one rank (13 ranks: root 1, then 9).
    first, second = double_binary_tree(13)
    assert first[12] == (8, (10,)) and second[1] == (-1, (9,)) and second[0] == (9, (11,))
    # Every node has a parent in each tree but its root, and the two roots differ.
    for nodes in (2, 3, 4, 7):
        for tree in double_binary_tree(nodes):
            assert sum(1 for up, _ in tree if up == -1) == 1
            assert all(k in tree[up][1] for k, (up, _) in enumerate(tree) if up != -1)
        assert [u for u, _ in double_binary_tree(nodes)[0]].index(-1) != \
            [u for u, _ in double_binary_tree(nodes)[1]].index(-1)


def test_two_ranks_one_chunk_per_tree_by_hand():
    # Two nodes of one rank on 10 GB/s links (10_000 B/us), hop 2 us, base 4 us. 20_000 bytes
    # in 2 chunks of 10_000, one per tree: one slice each (a Simple call of 10_000 bytes is
    # under the 32 KiB floor of its 2 slices). Tree 0: rank 1 sends its chunk (1 us, arrives
    # at 3), rank 0 reduces and sends the sum back (rrcs, 3..4, arrives at 6), rank 1's
    # receive (r) takes the slice out of the FIFO at the rate it came (6..7). Tree 1 is the
    # mirror on the other channel; the two never share a link at the same time.
    # base + 2 hops + 3 x 10_000 / 10_000 = 4 + 4 + 3 = 11 us.
    p = tree_program(2, [[0]], pipeline=1)
    assert p.nchunksperloop == 2
    t = simulate_program(p, pair(10.0), 20_000, constants(base=4.0, hop=2.0))
    assert t.time_us == pytest.approx(11.0, rel=1e-12)


def test_pipeline_chunks_overlap_the_way_up_and_down_by_hand():
    # As above with 2 chunks per tree (40_000 bytes, 10_000 a chunk): rank 1 sends chunk 0 at
    # 0..1 and chunk 1 at 1..2; rank 0 turns them round at 3..4 and 4..5; they arrive back at
    # 6 and 7 and rank 1 takes them out at 6..7 and 7..8. base + 2 hops + (2 + 1 + 1) chunk
    # times = 4 + 4 + 4 = 12 us; were the way down to wait for the whole way up (2 chunk times
    # up, 2 down, the last one taken out), 4 + 4 + 5 = 13 us.
    p = tree_program(2, [[0]], pipeline=2)
    assert p.nchunksperloop == 4
    t = simulate_program(p, pair(10.0), 40_000, constants(base=4.0, hop=2.0))
    assert t.time_us == pytest.approx(12.0, rel=1e-12)


def test_baseline_rows_price_the_tree_on_a_composed_system():
    from collsynth.resolve import resolve_topology

    system = resolve_topology("dgx-a100", nodes=2)
    nodes, chains = runtime_tree(system)
    assert nodes == 2 and all(sorted(chain) == list(range(8)) for chain in chains)
    # One pair of trees per ring, each headed where its ring enters the node: other NICs.
    assert len({chain[0] for chain in chains}) > 1
    report = check_program(tree_program(nodes, chains), runtime="msccl", collective="allreduce")
    assert report.ok, [str(x) for x in report.problems]
    c = get_runtime("nccl").defaults
    (row,) = runtime_prices("allreduce", system, [1 << 20], c, algorithm="tree")
    assert row.subject == "nccl-tree" and row.time_us > c.base_latency(row.protocol)
    # The plan's NCCL time is the faster of the ring and the tree at each size (NCCL picks),
    # and on two nodes the tree's log depth wins at 1 KiB, so that is not the ring's time.
    from collsynth.plan.choose import NCCL
    from collsynth.plan.yardstick import runtime_candidates, sampled_price
    from collsynth.timing.program_model import ProgramModel

    model = ProgramModel(c)
    nccl = get_runtime("nccl")
    ring, tree = runtime_candidates(model, nccl, "allreduce", system, [1024])[0]
    assert (ring.name, tree.name) == ("nccl-ring", "nccl-tree")
    ring_us, tree_us = float(ring.time_at(1024)), float(tree.time_at(1024))
    assert tree_us < ring_us
    assert sampled_price(model, nccl, "allreduce", system, {})(NCCL, 1024) == \
        min(ring_us, tree_us)
    (rccl,) = runtime_prices("allreduce", system, [1 << 20], get_runtime("rccl").defaults,
                             algorithm="tree")
    assert rccl.subject == "rccl-tree"


def test_the_priced_tree_pipelines_in_the_runtimes_chunks():
    # NCCL moves a tree's share one chunk at a time (Simple: one 512 KiB step). Two DGX A100
    # run the tree on 8 chains, 16 trees: at 256 MiB each tree has 16 MiB = 32 chunks, so the
    # program model prices the tree written with 32 chunks per tree; at 1 MiB (64 KiB a tree,
    # under one chunk) it keeps the floor of 4. More chunks overlap the way up and down more.
    # Both are priced at NCCL's tree correction for Simple (treeCorrectionFactor, index
    # log2(size / 64)): .9 at 256 MiB (index 22), .5 at 1 MiB (index 14).
    from collsynth.resolve import resolve_topology
    from collsynth.timing.pricing import RuntimeAlgorithm
    from collsynth.timing.program_model import ProgramModel

    system = resolve_topology("dgx-a100", nodes=2)
    nccl = get_runtime("nccl")
    model = ProgramModel(nccl.defaults)
    subject = RuntimeAlgorithm(nccl, "tree", "allreduce", system, protocol="Simple")
    nodes, chains = runtime_tree(system, 8)
    on = model.constants_on(system, subject)

    def written(size: int, pipeline: int, factor: float) -> float:
        # NCCL's tree runs Simple as ProtoSimple<1, 1>: one slice per call of at most one step
        graph = dataclasses.replace(prepare_program(tree_program(nodes, chains,
                                                                 pipeline=pipeline), system),
                                    slice_bytes=512 * 1024)
        return simulate_program(graph, None, size, on, protocol="Simple",
                                bandwidth_factor=factor).time_us

    assert model.runtime_choice(subject, 1 << 28) == [("Simple", 8)]
    (large,) = model.price(subject, [1 << 28])
    assert large.time_us == pytest.approx(written(1 << 28, 32, 0.9), rel=1e-9)
    assert large.time_us < 0.9 * written(1 << 28, 4, 0.9)
    (small,) = model.price(subject, [1 << 20])
    assert small.time_us == pytest.approx(written(1 << 20, 4, 0.5), rel=1e-9)


def test_bad_input_is_refused():
    with pytest.raises(InvalidInstanceError, match="not a permutation"):
        tree_program(2, [[0, 2]])
    with pytest.raises(InvalidInstanceError, match="nodes"):
        tree_program(0, [[0]])
    with pytest.raises(InvalidInstanceError, match="no nccl tree for allgather"):
        runtime_prices("allgather", pair(10.0), [1000], get_runtime("nccl").defaults,
                       algorithm="tree")
    with pytest.raises(InvalidInstanceError, match="no program of nccl's star"):
        runtime_prices("allreduce", pair(10.0), [1000], get_runtime("nccl").defaults,
                       algorithm="star")
    one_way = Topology("ring3", ((0, 1, 0), (0, 0, 1), (1, 0, 0)), unit_gbps=10.0, alpha_us=1.0)
    with pytest.raises(InvalidInstanceError, match="no link both ways"):
        runtime_tree(one_way)


@pytest.mark.parametrize("runtime", ["msccl", "msccl-executor", "rccl"])
def test_the_tree_exports_for_every_runtime_and_passes_the_checker(tmp_path, runtime):
    # Written by save_xml, read back through the reader's rules and checked for that runtime:
    # rccl's file has no fused steps (its interpreter refuses them), rccl and msccl-executor
    # carry outofplace, minBytes and maxBytes="0" (no upper bound), msccl none of them.
    from collsynth.export.xml_reader import read_checked, read_text
    from collsynth.export.xml_writer import save_xml

    for nodes, chains in [(2, [(0,)]), (3, [(0, 2, 1), (1, 2, 0)]), (5, [(0,)])]:
        program = tree_program(nodes, chains, runtime=runtime)
        path = tmp_path / f"tree-{nodes}.xml"
        save_xml(program, path, runtime)
        read, problems = read_checked(read_text(path), runtime)
        assert read is not None and problems == []
        report = check_program(read, runtime=runtime, collective="allreduce")
        assert report.ok and not report.warnings, [str(x) for x in report.problems]
        types = {st.type for g in read.gpus for tb in g.threadblocks for st in tb.steps}
        attributes = (read.outofplace, read.min_bytes, read.max_bytes)
        if runtime == "rccl":
            assert types <= {"s", "r", "re", "cpy"} and "re" in types
        else:
            assert "rrcs" in types
        assert attributes == ((None, None, None) if runtime == "msccl" else (1, 0, 0))
    # The schedule the runtime's own kernels run (what the program model prices) is unchanged.
    assert tree_program(2, [(0,)]) == tree_program(2, [(0,)], runtime=None)


def test_a_byte_range_is_written_the_way_each_runtime_reads_it():
    import dataclasses

    from collsynth.errors import ExportError
    from collsynth.export.retarget import retarget

    program = tree_program(2, [(0,)])
    msccl = retarget(program, "msccl", min_bytes=1024, max_bytes=4096)
    rccl = retarget(program, "rccl", min_bytes=1024, max_bytes=4096)
    # msccl's bound is exclusive (size < maxBytes), rccl's inclusive (docs/msccl-xml.md §4.4).
    assert (msccl.min_bytes, msccl.max_bytes) == (1024, 4097)
    assert (rccl.min_bytes, rccl.max_bytes) == (1024, 4096)
    with pytest.raises(ExportError, match="selects no call"):
        retarget(program, "rccl", min_bytes=4096, max_bytes=1024)
    with pytest.raises(ExportError, match="rccl does not run custom"):
        retarget(dataclasses.replace(program, coll="custom"), "rccl")


@pytest.mark.parametrize("channels", [2, 4, 16, 32])
def test_a_pinned_tree_runs_on_the_channels_asked_for(channels):
    # NCCL's channels each run one of the tree's two trees, so a tree pinned to N channels
    # (`time --channels N`, a tuner rule's count) is N / 2 chains of two trees: N channels.
    # It used to take N as the chain count: NCCL's tree on 2 channels was priced on 4.
    from collsynth.resolve import resolve_topology
    from collsynth.timing.pricing import RuntimeAlgorithm
    from collsynth.timing.program_model import ProgramModel

    nccl = get_runtime("nccl")
    two = resolve_topology("dgx-h100", nodes=2)
    tree = RuntimeAlgorithm(nccl, "tree", "allreduce", two, channels=channels)
    (price,) = ProgramModel(nccl.defaults, runtime=nccl).price(tree, [1 << 20])
    assert price.channels == channels


def test_a_calibrations_channel_count_is_the_trees_channels_not_its_chains():
    # On a machine without facts the calibration's channel count (the measured log's) is
    # NCCL's comm->nChannels, which its tree shares with its ring: 4 channels are 2 chains (each
    # builds both trees), priced as 4 channels like the ring's, not 8 (mutation round 13's PM7)
    from collsynth.runtimes import get_runtime
    from collsynth.timing.pricing import RuntimeAlgorithm
    from collsynth.timing.program_model import ProgramModel
    from collsynth.topology.model import Topology

    links = [[0 if i == j else 2 for j in range(4)] for i in range(4)]
    bare = Topology("bare4", links, unit_gbps=10.0, alpha_us=1.0)
    nccl = get_runtime("nccl")
    model = ProgramModel(nccl.defaults.replace(channels=4), runtime=nccl)
    ring = RuntimeAlgorithm(nccl, "ring", "allreduce", bare)
    tree = RuntimeAlgorithm(nccl, "tree", "allreduce", bare)
    assert {ch for _, ch in model.runtime_choice(tree, 1 << 20)} == {2}
    assert model.price(tree, [1 << 20])[0].channels == 4
    assert model.price(ring, [1 << 20])[0].channels == 4
