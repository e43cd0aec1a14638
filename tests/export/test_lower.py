"""Lowering algorithms to MSCCL programs: every case x runtime x layout x instances is checked
by the symbolic checker (static rules, races, deadlocks, the postcondition)."""

from __future__ import annotations

from collections import Counter

import pytest

from collsynth.algorithm import Algorithm, Send, Step, verify
from collsynth.collective import Collective, allgather, alltoall, from_conditions, scatter
from collsynth.errors import ExportError, VerificationError
from collsynth.export.check import check_program
from collsynth.export.layout import collective_layout
from collsynth.export.lower import lower, max_bytes_attribute
from collsynth.export.stats import program_stats
from collsynth.topology import get_topology


RUNTIMES = ["msccl", "rccl", "msccl-executor"]
LAYOUTS = {"oop": (False, True), "inplace": (True, False), "both": (True, True)}


def _unsupported(algorithm: Algorithm, runtime: str, layout: str) -> str | None:
    """The ExportError message expected for a combination the runtime cannot express."""
    name = algorithm.collective.name
    custom = name not in ("allgather", "alltoall", "allreduce", "reduce_scatter", "broadcast",
                          "reduce", "gather", "scatter")
    if custom and runtime != "msccl":
        return f"{runtime} has no custom collective"
    if runtime == "msccl" and layout == "both":
        return "one layout only"
    if runtime == "msccl" and name == "alltoall" and layout != "oop":
        return "alltoall out of place only"
    return None


def _check(program, runtime: str, algorithm: Algorithm, inplace_only: bool, instances: int,
           execute):
    """check_program with the algorithm's collective; custom collectives executed here."""
    layout = collective_layout(algorithm.collective, runtime, inplace=inplace_only)
    kind = layout.kind.removeprefix("custom_")
    if kind != "custom":
        root = algorithm.collective.roots[0] if algorithm.collective.roots else None
        return check_program(program, runtime=runtime, collective=kind, root=root, strict=True).problems
    problems = [p for p in check_program(program, runtime=runtime, strict=True).problems
                if not p.message.startswith("postcondition not checked")]
    memory = execute(program)
    collective = algorithm.collective
    for c, post in enumerate(collective.postcondition):
        for r in post:
            for k in range(instances):  # slot x of the algorithm is slot x*K + k of instance k
                buf, index = layout.target(r, c)
                value = memory[r].get((buf, index * instances + k))
                inputs = [Counter({(q, layout.source(q, c)[1] * instances + k): 1})
                          for q in sorted(collective.precondition[c])]
                ok = value == sum(inputs, Counter()) if collective.combining else value in inputs
                if not ok:
                    problems += (f"rank {r} {buf}[{index * instances + k}] = {value} for "
                                 f"chunk {c}",)
    return problems


@pytest.mark.parametrize("instances", [1, 2])
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("runtime", RUNTIMES)
def test_exported_program_passes_the_checker(algorithms, execute, case, runtime, layout,
                                             instances):
    """``case`` runs over every algorithm of ``CASES`` in conftest.py."""
    algorithm = algorithms[case]
    inplace, outofplace = LAYOUTS[layout]
    expected_error = _unsupported(algorithm, runtime, layout)
    if expected_error is not None:
        with pytest.raises(ExportError, match=expected_error):
            lower(algorithm, runtime=runtime, inplace=inplace, outofplace=outofplace,
                  instances=instances)
        return
    program = lower(algorithm, runtime=runtime, inplace=inplace, outofplace=outofplace,
                    instances=instances)
    problems = _check(program, runtime, algorithm, inplace and not outofplace, instances,
                      execute)
    assert not problems, "\n".join(map(str, problems))
    stats = program_stats(program)
    assert program.ngpus == algorithm.topology.num_ranks
    assert program.nchunksperloop % instances == 0
    assert program.nchannels == instances
    # Instances replicate everything: K times the threadblocks and scratch of one instance.
    assert all(t % instances == 0 for t in stats.threadblocks)
    assert all(s % instances == 0 for s in stats.scratch_chunks)
    if runtime == "rccl":
        assert not any(step.type in ("rcs", "rrs", "rrc", "rrcs") for g in program.gpus
                       for tb in g.threadblocks for step in tb.steps)
    if runtime != "msccl":
        assert program.inplace == int(inplace) and program.outofplace == int(outofplace)


def test_stats_of_a_ring_allgather(ring_allgather):
    program = lower(ring_allgather(4), runtime="msccl")
    stats = program_stats(program)
    # One threadblock per rank pairs send-to-next with receive-from-previous, one local copy.
    assert stats.threadblocks == (2, 2, 2, 2)
    assert stats.max_steps_per_threadblock == 6
    assert stats.scratch_chunks == (0, 0, 0, 0)
    assert "steps/threadblock <= 6" in stats.summary()


def test_channels_spread_chunks(ring_allgather):
    algorithm = ring_allgather(4, chunks=2)
    program = lower(algorithm, runtime="msccl", channels=2)
    assert program.nchannels == 2
    assert check_program(program, runtime="msccl", collective="allgather").ok
    assert {tb.chan for tb in program.gpus[0].threadblocks if tb.send >= 0} == {0, 1}
    both = lower(algorithm, runtime="msccl", channels=2, instances=3)
    assert both.nchannels == 6
    assert check_program(both, runtime="msccl", collective="allgather").ok


def test_step_limit_names_the_limit(ring_allgather):
    # 31 steps x 2 chunks each way: 124 steps per threadblock (two instances: nothing merges).
    algorithm = ring_allgather(32, chunks=2)
    with pytest.raises(ExportError, match=r"rccl allows 64 steps per threadblock; threadblock "
                                          r"\d+ of rank \d+ needs 124"):
        lower(algorithm, runtime="rccl", instances=2)
    program = lower(algorithm, runtime="msccl", instances=2)  # msccl allows 256
    assert program_stats(program).max_steps_per_threadblock == 124
    # One instance: the two pieces of a chunk are neighbours on both sides, one cnt=2 step.
    merged = lower(algorithm, runtime="rccl")
    assert program_stats(merged).max_steps_per_threadblock == 62
    assert {s.cnt for g in merged.gpus for tb in g.threadblocks for s in tb.steps
            if s.type in ("s", "r")} == {2}
    assert check_program(merged, runtime="rccl", collective="allgather").ok


def test_threadblock_and_channel_limits_name_the_limit(algorithms):
    algorithm = algorithms["fc4-alltoall"]
    with pytest.raises(ExportError, match="rccl allows 64 threadblocks per rank; rank 0 needs"):
        lower(algorithm, runtime="rccl", instances=17)
    with pytest.raises(ExportError, match="msccl allows 32 channels; the program needs 40"):
        lower(algorithm, runtime="msccl", instances=40)


def test_rccl_refuses_a_custom_collective(algorithms):
    with pytest.raises(ExportError, match="rccl has no custom collective"):
        lower(algorithms["ring4-custom-shift2"], runtime="rccl")
    assert lower(algorithms["ring4-custom-shift2"], runtime="msccl").coll == "custom"


def test_gather_and_scatter_are_custom_on_msccl(algorithms):
    program = lower(algorithms["ring4-gather-root2"], runtime="msccl")
    assert program.coll == "custom" and program.nchunksperloop == 4 * 2
    assert all(g.i_chunks in (0, 8) and g.o_chunks in (0, 8) for g in program.gpus)
    program = lower(algorithms["ring4-gather-root2"], runtime="rccl")
    assert program.coll == "gather" and program.nchunksperloop == 2


def test_scratch_slots_are_reused():
    # Rank 1 relays chunk 3 (steps 0-1) and later chunk 2 (steps 2-3): one scratch slot.
    line = get_topology("line:4")
    steps = [[(3, 0, 1)], [(3, 1, 2)], [(2, 0, 1)], [(3, 2, 3), (2, 1, 2)], [(1, 0, 1)]]
    algorithm = verify(Algorithm("relay", line, scatter(4, 0),
                                 tuple(Step(1, tuple(Send(*x) for x in s)) for s in steps)))
    program = lower(algorithm, runtime="rccl")
    assert program.gpus[1].s_chunks == 1
    assert check_program(program, runtime="rccl", collective="scatter", root=0).ok


def test_byte_range_attributes(ring_allgather):
    algorithm = ring_allgather(4)
    msccl = lower(algorithm, runtime="msccl")
    assert msccl.min_bytes is None and msccl.max_bytes is None
    msccl = lower(algorithm, runtime="msccl", min_bytes=1024, max_bytes=1 << 20)
    assert (msccl.min_bytes, msccl.max_bytes) == (1024, (1 << 20) + 1)  # exclusive in msccl
    rccl = lower(algorithm, runtime="rccl")
    assert (rccl.min_bytes, rccl.max_bytes) == (0, 0)  # 0 = unlimited in rccl
    rccl = lower(algorithm, runtime="rccl", max_bytes=4096)
    assert rccl.max_bytes == 4096  # inclusive in rccl
    assert max_bytes_attribute("msccl-executor", None) == 0
    with pytest.raises(ExportError, match="below min_bytes"):
        lower(algorithm, runtime="rccl", min_bytes=10, max_bytes=5)
    with pytest.raises(ExportError, match="max_bytes = 0"):
        lower(algorithm, runtime="rccl", max_bytes=0)


def test_options_are_checked(ring_allgather):
    algorithm = ring_allgather(4)
    with pytest.raises(ExportError, match="protocol"):
        lower(algorithm, runtime="msccl", proto="simple")
    with pytest.raises(ExportError, match="instances"):
        lower(algorithm, runtime="msccl", instances=0)
    with pytest.raises(ExportError, match="in-place calls, out-of-place calls or both"):
        lower(algorithm, runtime="rccl", inplace=False, outofplace=False)


def test_names_are_made_safe(ring_allgather):
    algorithm = ring_allgather(4)
    program = lower(algorithm, runtime="msccl", name='my "ring" <all> gather ' + "x" * 80)
    assert program.name.startswith("my__ring___all__gather_") and len(program.name) == 63
    assert lower(algorithm, runtime="rccl", name="a" * 300).name == "a" * 254
    with pytest.raises(ExportError, match="2-D alltoall"):
        lower(verify(Algorithm("2D", get_topology("fully-connected:2"), alltoall(2),
                               (Step(1, (Send(1, 0, 1), Send(2, 1, 0))),))), runtime="msccl")


def test_a_collective_with_a_standard_name_must_be_that_collective():
    fake = Collective("allgather", 2, (frozenset({0}), frozenset({1})),
                      (frozenset({0, 1}), frozenset({1})))
    algorithm = verify(Algorithm("fake", get_topology("ring:2"), fake,
                                 (Step(1, (Send(0, 0, 1),)),)))
    with pytest.raises(ExportError, match="does not have allgather's pre/postconditions"):
        lower(algorithm, runtime="msccl")


def test_a_wrong_algorithm_is_refused():
    wrong = Algorithm("wrong", get_topology("ring:2"), allgather(2), (Step(1, (Send(0, 0, 1),)),))
    with pytest.raises(VerificationError):
        lower(wrong, runtime="msccl")


def test_in_place_alltoall_needs_no_scratch_when_slots_free_in_time(algorithms):
    program = lower(algorithms["fc4-alltoall"], runtime="rccl", inplace=True, outofplace=False)
    assert program_stats(program).scratch_chunks == (0, 0, 0, 0)
    # Every rank keeps its own chunk where it is: nothing is copied.
    assert not any(s.type == "cpy" for g in program.gpus for tb in g.threadblocks
                   for s in tb.steps)


def test_in_place_layout_that_needs_parking():
    # Rank 1 receives chunk 0->1 (its home i[0]) before it sends its own chunk 1->0 from i[0]:
    # the received value waits in scratch and is copied home at the end.
    algorithm = verify(Algorithm("late", get_topology("fully-connected:2"), alltoall(2),
                                 (Step(1, (Send(1, 0, 1),)), Step(1, (Send(2, 1, 0),)))))
    program = lower(algorithm, runtime="rccl", inplace=True, outofplace=False)
    assert program.gpus[1].s_chunks == 1
    assert check_program(program, runtime="rccl", collective="alltoall").ok
    both = lower(algorithm, runtime="rccl", inplace=True, outofplace=True)
    assert check_program(both, runtime="rccl", collective="alltoall").ok


def test_custom_collective_layout_is_by_chunk_index():
    collective = from_conditions("pairs", 2, 2, [(0, 0), (1, 1)], [(1, 0), (0, 1)])
    layout = collective_layout(collective, "msccl")
    assert (layout.coll, layout.nchunksperloop) == ("custom", 2)
    assert layout.source(0, 0) == ("i", 0) and layout.target(1, 0) == ("o", 0)
    assert collective_layout(collective, "msccl", inplace=True).target(1, 0) == ("i", 0)


@pytest.mark.parametrize("name, n, chunks, source, target", [
    ("allgather", 4, 2, {(1, 3): ("i", 1)}, {(0, 3): ("o", 3)}),
    # src 1 -> dst 2, piece 1: chunk (1*3 + 2)*2 + 1; input i[dst*C + 1], output o[src*C + 1]
    ("alltoall", 3, 2, {(1, 11): ("i", 5)}, {(2, 11): ("o", 3)}),
    ("reduce_scatter", 4, 1, {(2, 3): ("i", 3)}, {(3, 3): ("o", 0)}),
    ("allreduce", 4, 3, {(1, 2): ("i", 2)}, {(3, 2): ("o", 2)}),
])
def test_standard_layouts_follow_the_spec(name, n, chunks, source, target):
    from collsynth.collective import standard_collective

    layout = collective_layout(standard_collective(name, n).split(chunks), "msccl")
    for (rank, chunk), loc in source.items():
        assert layout.source(rank, chunk) == loc
    for (rank, chunk), loc in target.items():
        assert layout.target(rank, chunk) == loc
