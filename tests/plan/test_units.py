"""The plan's building blocks: trace adapter, steps, groups, size ranges, cache, environment."""

from __future__ import annotations

import dataclasses
import json
from fractions import Fraction
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collsynth.collective import allgather, broadcast
from collsynth.errors import FileFormatError
from collsynth.runtimes import get_runtime
from collsynth.plan import (
    NCCL,
    Candidate,
    FrontCache,
    Line,
    SynthOptions,
    choose_ranges,
    find_steps,
    induced_topology,
    load_calls,
    runtime_environment,
    size_bucket,
    synthesize_front,
    topology_fingerprint,
    topology_for_group,
)
from collsynth.export.selection import count_fits as _selectable
from collsynth.topology import get_topology

TRACES = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "traces"


# -- the trace adapter ------------------------------------------------------------------------


def test_load_calls_reads_the_fixture():
    run = load_calls(TRACES / "dgx1-dp")
    assert run.world_size == 8 and run.ranks == tuple(range(8))
    first = run.calls[0][0]
    assert (first.kind, first.root, first.size_bytes, first.group) == \
        ("broadcast", 0, 16 << 20, tuple(range(8)))
    allgather_call = next(c for c in run.calls[3] if c.kind == "allgather")
    assert allgather_call.element_size == 2 and allgather_call.rank == 3
    tp = next(c for c in run.calls[5] if c.kind == "allreduce" and len(c.group) == 4)
    assert tp.group == (4, 5, 6, 7)


def test_load_calls_marks_uneven_alltoall():
    run = load_calls(TRACES / "fc4-mixed")
    alltoall = [c for c in run.calls[0] if c.kind == "alltoall"]
    assert alltoall and all(c.uneven for c in alltoall)
    even = [c for c in load_calls(TRACES / "dgx1-dp").calls[0] if c.kind == "alltoall"]
    assert even and not any(c.uneven for c in even)


def test_bad_trace_directories(tmp_path):
    with pytest.raises(FileFormatError, match="no such directory"):
        load_calls(tmp_path / "missing")
    with pytest.raises(FileFormatError, match="no trace files"):
        load_calls(tmp_path)
    lines = (TRACES / "fc4-mixed" / "rank-00000.jsonl").read_text().splitlines()
    record = json.loads(lines[1])
    record["bytes"] = -4
    (tmp_path / "rank-00000.jsonl").write_text("\n".join([lines[0], json.dumps(record)]) + "\n")
    with pytest.raises(FileFormatError, match=r"rank-00000.jsonl: line 2: field 'bytes'"):
        load_calls(tmp_path)


# -- buckets and steps ------------------------------------------------------------------------


@given(st.integers(min_value=1, max_value=1 << 50))
def test_size_bucket_holds_the_size(size):
    lo, hi = size_bucket(size)
    assert lo <= size < hi and hi == 2 * lo and lo & (lo - 1) == 0


@settings(max_examples=60, deadline=None)
@given(setup=st.lists(st.sampled_from("xyz"), max_size=5),
       step=st.lists(st.sampled_from("ABCD"), min_size=1, max_size=6),
       repeats=st.integers(min_value=2, max_value=5))
def test_find_steps_recovers_a_repeated_step(setup, step, repeats):
    calls = setup + step * repeats
    found = find_steps(calls)
    assert found.found
    body = calls[found.setup:]
    # What it found repeats exactly, and is no longer than the step that was repeated.
    assert all(body[i] == body[i + found.period] for i in range(len(body) - found.period))
    assert found.period <= len(step) and found.setup <= len(setup)
    assert found.setup + found.steps * found.period + found.tail == len(calls)


def test_find_steps_on_the_fixture_trace():
    run = load_calls(TRACES / "dgx1-dp")
    found = find_steps([c.signature for c in run.calls[0]])
    assert (found.setup, found.period, found.steps, found.tail) == (2, 9, 3, 0)
    assert not find_steps(["a", "b", "c"]).found


# -- groups -----------------------------------------------------------------------------------


def test_group_topologies():
    dgx1 = get_topology("dgx1")
    assert topology_for_group(dgx1, range(8)) is dgx1
    sub = topology_for_group(dgx1, [6, 2, 3])
    assert sub.num_ranks == 3
    assert [[sub.bandwidth(a, b) for b in range(3)] for a in range(3)] == \
        [[dgx1.bandwidth(x, y) if x != y else 0 for y in (6, 2, 3)] for x in (6, 2, 3)]
    assert (sub.unit_gbps, sub.alpha_us) == (dgx1.unit_gbps, dgx1.alpha_us)


def test_fingerprint_is_about_links_only():
    dgx1 = get_topology("dgx1")
    renamed = dataclasses.replace(dgx1, name="other", unit_gbps=1.0, alpha_us=9.0)
    assert topology_fingerprint(renamed) == topology_fingerprint(dgx1)
    links = [list(row) for row in dgx1.links]
    links[0][1] += 1
    changed = dataclasses.replace(dgx1, links=tuple(tuple(r) for r in links))
    assert topology_fingerprint(changed) != topology_fingerprint(dgx1)
    assert topology_fingerprint(induced_topology(dgx1, [0, 1, 2, 3])) != \
        topology_fingerprint(dgx1)


# -- size ranges ------------------------------------------------------------------------------


def _line(draw_pair) -> Line:
    intercept, slope = draw_pair
    return Line(Fraction(intercept, 10), Fraction(slope, 10**6))


@settings(max_examples=80, deadline=None)
@given(nccl=st.lists(st.tuples(st.integers(1, 500), st.integers(1, 500)), min_size=1,
                     max_size=3),
       algos=st.lists(st.tuples(st.integers(1, 500), st.integers(1, 500)), max_size=4))
def test_ranges_cover_every_size_once_with_its_fastest_choice(nccl, algos):
    candidates = [Candidate(f"nccl {i}", NCCL, _line(p)) for i, p in enumerate(nccl)]
    candidates += [Candidate(f"a{i}", "collsynth", _line(p)) for i, p in enumerate(algos)]
    ranges = choose_ranges(candidates)
    assert ranges[0].min_bytes == 0 and ranges[-1].max_bytes is None
    for before, after in zip(ranges, ranges[1:]):
        assert after.min_bytes == before.max_bytes + 1  # contiguous, never overlapping
        assert after.choice != before.choice
    lines = {c.name: c.line for c in candidates}
    best_nccl = lambda size: min(c.line.at(size) for c in candidates if c.source == NCCL)
    for r in ranges:
        hi = r.max_bytes if r.max_bytes is not None else r.min_bytes + 10**9
        for size in {r.min_bytes, hi, (r.min_bytes + hi) // 2}:
            fastest = min([best_nccl(size)] + [lines[c.name].at(size) for c in candidates
                                                if c.source != NCCL])
            chosen = best_nccl(size) if r.choice == NCCL else lines[r.choice].at(size)
            assert chosen == fastest
            if r.choice != NCCL:
                assert chosen < best_nccl(size)  # NCCL keeps ties


def test_no_candidates_is_all_nccl():
    (only,) = choose_ranges([])
    assert (only.min_bytes, only.max_bytes, only.choice) == (0, None, NCCL)


def _sampled(name, source, line, sizes):
    from collsynth.plan.choose import Sample

    return Candidate(name, source, None, samples=tuple(Sample(s, float(line.at(s)))
                                                        for s in sizes))


def test_sampled_ranges_bisect_to_the_crossing():
    """NCCL 10 + s/100 us, a program 2 + s/50 us: they cross at s = 800 (18 us both, by hand);
    sampled at 100 and 10,000 only, the bisection finds the crossing, and NCCL keeps the tie."""
    from collsynth.plan.choose import choose_sampled_ranges

    nccl_line, ours_line = Line(Fraction(10), Fraction(1, 100)), Line(Fraction(2), Fraction(1, 50))
    lines = {NCCL: nccl_line, "a": ours_line}
    candidates = [_sampled("ring", NCCL, nccl_line, (100, 10_000)),
                  _sampled("a", "collsynth", ours_line, (100, 10_000))]
    exact = choose_sampled_ranges(candidates, price=lambda name, s: float(lines[name].at(s)),
                                  steps=40)
    assert [(r.min_bytes, r.max_bytes, r.choice) for r in exact] == \
        [(0, 799, "a"), (800, None, NCCL)]
    midpoint = choose_sampled_ranges(candidates)  # no price: the geometric midpoint, 1000
    assert [(r.min_bytes, r.max_bytes, r.choice) for r in midpoint] == \
        [(0, 999, "a"), (1000, None, NCCL)]


def test_a_program_must_beat_the_faster_of_the_ring_and_the_tree():
    """NCCL runs the faster of its ring and its tree at each size, so a program is chosen only
    where it beats both. Hand-set sample times (us) at 1000, 10_000 and 100_000 bytes:

    ========  =====  ======  =======
    size      1000   10_000  100_000
    ring      30     40      100
    tree      20     35      150
    program   25     30      120
    ========  =====  ======  =======

    At 1000 the program (25) lies between the tree (20) and the ring (30): NCCL's tree wins.
    At 10_000 it beats both (30 < 35 < 40): the program. At 100_000 the ring wins."""
    from collsynth.plan.choose import Sample, choose_sampled_ranges

    sizes = (1000, 10_000, 100_000)

    def sampled(name, source, times):
        return Candidate(name, source, None,
                         samples=tuple(Sample(s, float(t)) for s, t in zip(sizes, times)))

    ring = sampled("nccl-ring", NCCL, (30, 40, 100))
    tree = sampled("nccl-tree", NCCL, (20, 35, 150))
    ours = sampled("a", "collsynth", (25, 30, 120))
    ranges = choose_sampled_ranges([ring, tree, ours])
    assert [next(r.choice for r in ranges if r.contains(s)) for s in sizes] == [NCCL, "a", NCCL]
    # Against the ring alone the program would also win at 1000 bytes (25 < 30).
    alone = choose_sampled_ranges([ring, ours])
    assert [next(r.choice for r in alone if r.contains(s)) for s in sizes] == ["a", "a", NCCL]
    # The order of NCCL's candidates does not matter.
    again = choose_sampled_ranges([tree, ours, ring])
    assert [(r.min_bytes, r.max_bytes, r.choice) for r in again] == \
        [(r.min_bytes, r.max_bytes, r.choice) for r in ranges]


@settings(max_examples=60, deadline=None)
@given(runtime=st.lists(st.lists(st.integers(1, 10**4), min_size=5, max_size=5), min_size=1,
                        max_size=2),
       algos=st.lists(st.lists(st.integers(1, 10**4), min_size=5, max_size=5), max_size=3))
def test_sampled_ranges_give_each_sample_its_fastest(runtime, algos):
    """Whatever the sampled times, ranges cover every size once and each sampled size runs
    its fastest candidate, NCCL (the faster of its ring and tree) on a tie."""
    from collsynth.plan.choose import Sample, choose_sampled_ranges

    sizes = (1, 10, 100, 1000, 10_000)
    candidates = [Candidate(name, NCCL, None, samples=tuple(
        Sample(s, float(t)) for s, t in zip(sizes, times)))
        for name, times in zip(("ring", "tree"), runtime)]
    nccl = [min(times) for times in zip(*runtime)]
    candidates += [Candidate(f"a{i}", "collsynth", None, samples=tuple(
        Sample(s, float(t)) for s, t in zip(sizes, times))) for i, times in enumerate(algos)]
    ranges = choose_sampled_ranges(candidates)
    assert ranges[0].min_bytes == 0 and ranges[-1].max_bytes is None
    for before, after in zip(ranges, ranges[1:]):
        assert after.min_bytes == before.max_bytes + 1 and after.choice != before.choice
    for j, size in enumerate(sizes):
        (r,) = [r for r in ranges if r.contains(size)]
        best = min([nccl[j]] + [times[j] for times in algos])
        if r.choice == NCCL:
            assert nccl[j] == best
        else:
            assert algos[int(r.choice[1:])][j] == best < nccl[j]


@pytest.mark.parametrize("size, width, nchunks, runtime, collective, ok", [
    (4096, 4, 8, "msccl", "allreduce", True),
    (4100, 4, 8, "msccl", "allreduce", False),
    (4098, 4, 1, "msccl", "allreduce", False),        # not whole elements
    (48, 4, 6, "rccl", "allgather", True),            # 12 elements of the larger buffer
    (48, 4, 6, "msccl-executor", "allgather", False),  # count = 12 / 4 ranks = 3
    (96, 4, 6, "msccl-executor", "allgather", True),   # count = 6
    (48, 4, 6, "msccl-executor", "allreduce", True),   # allreduce: count = 12
    (4096, None, 7, "msccl", "allreduce", True),      # unknown element size: assumed to fit
    (0, 4, 1, "msccl", "allreduce", False),
])
def test_selectable(size, width, nchunks, runtime, collective, ok):
    assert _selectable(size, width, nchunks, runtime=runtime, collective=collective,
                       ranks=4) is ok


# -- cache ------------------------------------------------------------------------------------


def test_cache_round_trip_and_misses(tmp_path):
    ring = get_topology("ring:4")
    cache = FrontCache(tmp_path)
    first = synthesize_front(ring, allgather(4), options=SynthOptions(), cache=cache)
    assert first.algorithms and not first.cached and first.complete
    again = synthesize_front(ring, allgather(4), options=SynthOptions(), cache=cache)
    assert again.cached
    assert [a.steps for a in again.algorithms] == [a.steps for a in first.algorithms]
    assert all(a.topology is ring for a in again.algorithms)
    # Another topology with the same links shares the entry; other links do not.
    renamed = dataclasses.replace(ring, name="my-ring", unit_gbps=5.0)
    assert synthesize_front(renamed, allgather(4), options=SynthOptions(), cache=cache).cached
    line = get_topology("line:4")
    assert not synthesize_front(line, allgather(4), options=SynthOptions(), cache=cache).cached
    # Another root is another key.
    assert cache.get(ring, broadcast(4, 1), engine="pareto", options={}) is None


def test_cache_ignores_broken_and_short_entries(tmp_path):
    ring = get_topology("ring:4")
    cache = FrontCache(tmp_path)
    options = {"backend": "auto"}
    front = tuple(synthesize_front(ring, allgather(4), options=SynthOptions()).algorithms)
    cache.put(ring, allgather(4), front, engine="pareto", options=options, complete=False,
              time_limit=5.0)
    assert cache.get(ring, allgather(4), engine="pareto", options=options,
                     time_limit=5.0) is not None
    # An incomplete search made with less time than asked for is searched again.
    assert cache.get(ring, allgather(4), engine="pareto", options=options,
                     time_limit=50.0) is None
    folder = cache.entry_directory(ring, allgather(4), engine="pareto", options=options)
    (folder / "algorithm-0.json").write_text("{ not json")
    assert cache.get(ring, allgather(4), engine="pareto", options=options) is None
    assert FrontCache(None).get(ring, allgather(4), engine="pareto", options=options) is None


def test_large_groups_use_the_bandwidth_optimal_engine():
    """Above max_group_ranks the tree engine gives its pipelined schedule and the one-stage
    schedule of the same trees (fewest steps), both verified, on the group's topology."""
    from collsynth.resolve import resolve_topology

    system = resolve_topology("dgx-a100", nodes=2)
    out = synthesize_front(system, allgather(16), options=SynthOptions(max_group_ranks=8))
    assert out.engine == "bandwidth-optimal"
    assert len(out.algorithms) == 2 and all(a.topology is system for a in out.algorithms)
    pipelined, short = out.algorithms
    assert short.num_steps < pipelined.num_steps
    assert pipelined.rounds_per_chunk < short.rounds_per_chunk


# -- environment ------------------------------------------------------------------------------


def test_environment_per_runtime():
    files = ["/p/xml/a.xml", "/p/xml/b.xml"]
    msccl, _ = runtime_environment(get_runtime("msccl"), xml_dir="/p/xml", xml_paths=files,
                                   collectives={"allgather"})
    assert [(v.name, v.value) for v in msccl] == [("MSCCL_XML_FILES", ":".join(files))]
    msccl_ar, _ = runtime_environment(get_runtime("msccl"), xml_dir="/p/xml", xml_paths=files,
                                      collectives={"allreduce"})
    assert ("NCCL_ALGO", "MSCCL,RING,TREE") in [(v.name, v.value) for v in msccl_ar]
    rccl, rccl_notes = runtime_environment(get_runtime("rccl"), xml_dir="/p/xml", xml_paths=files,
                                           collectives=())
    assert {v.name: v.value for v in rccl}["MSCCL_ALGO_DIR"] == "/p/xml"
    assert "RCCL_MSCCL_FORCE_ENABLE" in {v.name for v in rccl}
    executor, _ = runtime_environment(get_runtime("msccl-executor"), xml_dir="/p/xml", xml_paths=files,
                                      collectives=())
    assert {v.name: v.value for v in executor} == {"MSCCL_ALGO_DIR": "/p/xml",
                                                   "NCCL_MSCCL_ENABLE": "1"}
    assert all(v.source for v in msccl + rccl + executor) and rccl_notes
