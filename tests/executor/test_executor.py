"""The executor and the XML interpreter, run for real on gloo and compared with torch.

For each group size (2, 4, 8) one process group is started and a whole table of cases runs in
it (:func:`collsynth.executor.run_cases`): every collective family (allgather, reduce_scatter,
allreduce, alltoall, broadcast, reduce, gather, scatter and custom collectives, combining and
not), each with a multi-step, multi-chunk algorithm from the synthesizer, in and out of place,
float32 / bfloat16 / float16 / int32, odd sizes and sizes smaller than the chunk count, and the
MSCCL programs collsynth exports for msccl and rccl. Each case is one test that looks up its
result, so a failure names the case.
"""

from __future__ import annotations

import dataclasses
import functools

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():  # pragma: no cover
    pytest.skip("torch.distributed with gloo is needed", allow_module_level=True)

from collsynth.algorithm.model import Algorithm  # noqa: E402
from collsynth.collective import multiroot_broadcast, standard_collective  # noqa: E402
from collsynth.collective.model import Collective, from_conditions  # noqa: E402
from collsynth.export import lower  # noqa: E402
from collsynth.export.program import GpuProgram, Program, ThreadBlock, XmlStep  # noqa: E402
from collsynth.executor import (  # noqa: E402
    Case,
    InvalidBufferError,
    UnrunnableProgramError,
    launch,
    run_cases,
    schedule,
)
from collsynth.executor.executor import block_counts, collective_kind, piece_range  # noqa: E402
from collsynth.synthesis import SolveOptions, solve_least_steps  # noqa: E402
from collsynth.topology import get_topology  # noqa: E402

TOPOLOGIES = {2: "ring:2", 4: "ring:4", 8: "dgx1"}
ROOTED = {"broadcast": 1, "reduce": -1, "gather": 1, "scatter": 0}
FAMILIES = ("allgather", "reduce_scatter", "allreduce", "alltoall", "broadcast", "reduce",
            "gather", "scatter", "shift2", "pairsum", "multiroot_broadcast")
COMBINING = {"reduce_scatter", "allreduce", "reduce", "pairsum"}
CASE_TIMEOUT_S = 20.0


def _collective(family: str, n: int) -> Collective:
    if family in ROOTED:
        return standard_collective(family, n, root=ROOTED[family] % n)
    if family == "shift2":   # custom: chunk c from rank c to the next two ranks
        return from_conditions("shift2", n, n, [(c, c) for c in range(n)],
                               [((c + 1) % n, c) for c in range(n)]
                               + [((c + 2) % n, c) for c in range(n)])
    if family == "pairsum":  # custom, combining: ranks c and c+1 contribute, c and c+2 need it
        return from_conditions("pairsum", n, n,
                               [(c, c) for c in range(n)] + [((c + 1) % n, c) for c in range(n)],
                               [(c, c) for c in range(n)] + [((c + 2) % n, c) for c in range(n)],
                               combining=True)
    if family == "multiroot_broadcast":
        return multiroot_broadcast(n, [0, n - 1])
    return standard_collective(family, n)


@functools.lru_cache(maxsize=None)
def _algorithm(family: str, n: int) -> Algorithm:
    result = solve_least_steps(get_topology(TOPOLOGIES[n]), _collective(family, n), chunks=2,
                               options=SolveOptions(time_limit=60))
    assert result.algorithm is not None, result.summary()
    return result.algorithm


def _variants(family: str) -> list[tuple[str, int, bool, str]]:
    """(dtype, elements per block, in place, op) for the algorithm cases of a family."""
    rows = [("float32", 37, False, "sum"),      # odd: uneven pieces
            ("bfloat16", 10, True, "sum"),
            ("int32", 1, False, "sum"),         # fewer elements than pieces: an empty piece
            ("int32", 64, True, "max")]
    if family in COMBINING:
        rows += [("int32", 5, False, "prod"), ("float16", 33, False, "avg"),
                 ("float32", 16, True, "min")]
    return rows


def _programs(family: str) -> list[tuple[str, bool, int]]:
    """(runtime, in place, elements per block) for the XML cases of a family."""
    # msccl writes these as coll="custom": sizes must divide into its chunks (no padding).
    custom = family in ("shift2", "pairsum", "multiroot_broadcast", "gather", "scatter")
    rows = [("msccl", False, 32 if custom else 33)]          # 33: padded chunks
    if family not in ("shift2", "pairsum", "multiroot_broadcast"):
        rows.append(("rccl", True, 34))
        if family != "alltoall":
            rows.append(("msccl", True, 32))
        rows.append(("msccl-executor", False, 31))
    return rows


def case_names(n: int) -> list[str]:
    names = []
    for family in FAMILIES:
        for dtype, m, inplace, op in _variants(family):
            names.append(f"{family}-{dtype}-m{m}-{'inplace' if inplace else 'outofplace'}-{op}")
        for runtime, inplace, m in _programs(family):
            names.append(f"{family}-xml-{runtime}-{'inplace' if inplace else 'outofplace'}-m{m}")
    return names + ["expected-wrong-xml", "expected-error-op"]


def _tampered(program: Program) -> Program:
    """The program with one receive writing the wrong output slot."""
    gpus = list(program.gpus)
    for g, gpu in enumerate(gpus):
        for t, tb in enumerate(gpu.threadblocks):
            for s, st in enumerate(tb.steps):
                if st.type == "r" and st.dstbuf == "o":
                    wrong = (st.dstoff + 1) % gpu.o_chunks
                    steps = list(tb.steps)
                    steps[s] = dataclasses.replace(st, dstoff=wrong)
                    tbs = list(gpu.threadblocks)
                    tbs[t] = ThreadBlock(tb.id, tb.send, tb.recv, tb.chan, tuple(steps))
                    gpus[g] = GpuProgram(gpu.id, gpu.i_chunks, gpu.o_chunks, gpu.s_chunks,
                                         tuple(tbs))
                    return Program(program.name, program.proto, program.nchannels,
                                   program.nchunksperloop, program.ngpus, program.coll,
                                   program.inplace, tuple(gpus), program.outofplace)
    raise AssertionError("no receive into the output")


def build_cases(n: int) -> list[Case]:
    cases = []
    for family in FAMILIES:
        algorithm = _algorithm(family, n)
        for dtype, m, inplace, op in _variants(family):
            cases.append(Case(f"{family}-{dtype}-m{m}-{'inplace' if inplace else 'outofplace'}"
                              f"-{op}", m, algorithm=algorithm, dtype=dtype, op=op,
                              inplace=inplace, seed=len(cases), timeout_s=CASE_TIMEOUT_S))
        for runtime, inplace, m in _programs(family):
            program = lower(algorithm, runtime=runtime, inplace=inplace,
                            outofplace=not inplace, instances=2 if runtime == "rccl" else 1,
                            channels=2)
            cases.append(Case(f"{family}-xml-{runtime}-"
                              f"{'inplace' if inplace else 'outofplace'}-m{m}", m,
                              program=program, collective=algorithm.collective,
                              dtype="float32" if family in COMBINING else "int32",
                              inplace=inplace, seed=len(cases), timeout_s=CASE_TIMEOUT_S))
    allgather = _algorithm("allgather", n)
    cases.append(Case("expected-wrong-xml", 8, program=_tampered(lower(allgather,
                                                                       runtime="msccl")),
                      collective=allgather.collective, dtype="int32",
                      timeout_s=CASE_TIMEOUT_S))
    cases.append(Case("expected-error-op", 8, algorithm=_algorithm("allreduce", n),
                      dtype="int32", op="avg", timeout_s=CASE_TIMEOUT_S))
    assert [c.name for c in cases] == case_names(n)
    return cases


_RESULTS: dict[int, object] = {}


def results(n: int) -> dict[str, list]:
    """Run the table for ``n`` ranks once; case name -> every rank's CaseResult. A launch that
    fails fails every test of that ``n`` with the same error, without launching again."""
    if n not in _RESULTS:
        try:
            cases = build_cases(n)
            per_rank = launch(run_cases, n, args=(cases,), timeout_s=240)
            _RESULTS[n] = {case.name: [per_rank[r][i] for r in range(n)]
                           for i, case in enumerate(cases)}
        except Exception as exc:  # noqa: BLE001 - remembered and re-raised per test
            _RESULTS[n] = exc
    found = _RESULTS[n]
    if isinstance(found, Exception):
        raise found
    return found


PARAMS = [(n, name) for n in (2, 4, 8) for name in case_names(n)
          if not name.startswith("expected-")]


@pytest.mark.parametrize("n,name", PARAMS, ids=[f"n{n}-{name}" for n, name in PARAMS])
def test_matches_torch(n, name):
    found = results(n)[name]
    bad = [(r.rank, r.error or f"max error {r.max_error} > {r.tolerance}")
           for r in found if not r.ok]
    assert not bad, bad
    assert sum(r.checked_elements for r in found) > 0


@pytest.mark.parametrize("n", (2, 4, 8))
def test_the_algorithms_are_multi_step_and_multi_chunk(n):
    for family in FAMILIES:
        algorithm = _algorithm(family, n)
        assert algorithm.chunks == 2 and algorithm.num_steps >= 2, (family, algorithm)


@pytest.mark.parametrize("n", (2, 4, 8))
def test_a_wrong_program_is_caught(n):
    found = results(n)["expected-wrong-xml"]
    assert not all(r.ok for r in found)
    assert all(r.error is None for r in found)


@pytest.mark.parametrize("n", (2, 8))
def test_avg_on_integers_is_refused_by_every_rank(n):
    found = results(n)["expected-error-op"]
    assert all(not r.ok and "avg" in r.error for r in found)


# -- pure parts: no processes -----------------------------------------------------------------


def test_pieces_cover_a_block_exactly():
    for m in range(0, 12):
        for pieces in range(1, 6):
            ranges = [piece_range(m, pieces, p) for p in range(pieces)]
            assert ranges[0][0] == 0 and ranges[-1][1] == m
            assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
            assert max(b - a for a, b in ranges) - min(b - a for a, b in ranges) <= 1


def test_torch_layouts():
    assert block_counts("allgather", 4, 2, None, 4) == (1, 4)
    assert block_counts("reduce_scatter", 4, 2, None, 4) == (4, 1)
    assert block_counts("scatter", 4, 2, 0, 4) == (0, 1)
    assert block_counts("scatter", 4, 0, 0, 4) == (4, 1)
    assert block_counts("custom", 4, 0, None, 3) == (3, 3)
    assert collective_kind(standard_collective("reduce", 4, root=2).split(3)) == "reduce"
    assert collective_kind(_collective("pairsum", 4)) == "custom"


def test_a_collective_named_standard_with_other_conditions_is_refused():
    odd = Collective("allgather", 2, (frozenset({0}), frozenset({0})),
                     (frozenset({0, 1}), frozenset({0, 1})))
    with pytest.raises(InvalidBufferError, match="allgather"):
        collective_kind(odd)


def _gpu(rank: int, tbs) -> GpuProgram:
    return GpuProgram(rank, 1, 1, 1, tuple(tbs))


def test_a_deadlocking_program_is_refused_before_any_message():
    # Both ranks receive before they send: the runtimes hang; we refuse.
    tbs = [lambda r: ThreadBlock(0, 1 - r, 1 - r, 0, (XmlStep(0, "r", "i", 0, "o", 0, 1),
                                                         XmlStep(1, "s", "i", 0, "o", 0, 1)))]
    program = Program("dl", "Simple", 1, 1, 2, "allreduce", 0,
                      tuple(_gpu(r, [tbs[0](r)]) for r in range(2)))
    with pytest.raises(UnrunnableProgramError, match="deadlocks: rank 0 tb 0 step 0"):
        schedule(program)


def test_unreceived_messages_and_mismatched_counts_are_refused():
    lonely = Program("x", "Simple", 1, 2, 2, "allreduce", 0, (
        _gpu(0, [ThreadBlock(0, 1, -1, 0, (XmlStep(0, "s", "i", 0, "o", 0, 1),))]),
        _gpu(1, [])))
    with pytest.raises(UnrunnableProgramError, match="never received"):
        schedule(lonely)
    mismatch = Program("x", "Simple", 1, 2, 2, "allreduce", 0, (
        _gpu(0, [ThreadBlock(0, 1, -1, 0, (XmlStep(0, "s", "i", 0, "o", 0, 2),))]),
        _gpu(1, [ThreadBlock(0, -1, 0, 0, (XmlStep(0, "r", "i", 0, "o", 0, 1),))])))
    with pytest.raises(UnrunnableProgramError, match="cnt=1 but the matching send"):
        schedule(mismatch)


def test_exported_programs_are_aligned_for_nccl():
    for family in ("allgather", "allreduce", "alltoall", "scatter"):
        for runtime in ("msccl", "rccl"):
            program = lower(_algorithm(family, 4), runtime=runtime, instances=2, channels=2)
            assert schedule(program).aligned, (family, runtime)


def buffered_program() -> Program:
    """3 ranks; rank 1 takes rank 0's first message only after a message that rank 0 sends
    later (through rank 2): runs with buffered sends (gloo), cannot be aligned (nccl)."""
    i, o, s = "i", "o", "s"
    rank0 = GpuProgram(0, 1, 1, 0, (
        ThreadBlock(0, 1, -1, 0, (XmlStep(0, "s", i, 0, o, 0, 1, hasdep=1),)),
        ThreadBlock(1, 2, -1, 0, (XmlStep(0, "cpy", i, 0, o, 0, 1, depid=0, deps=0),
                                  XmlStep(1, "s", o, 0, o, 0, 1)))))
    rank2 = GpuProgram(2, 1, 1, 1, (
        ThreadBlock(0, 1, 0, 0, (XmlStep(0, "r", i, 0, s, 0, 1),
                                 XmlStep(1, "s", s, 0, s, 0, 1))),))
    rank1 = GpuProgram(1, 1, 1, 1, (
        ThreadBlock(0, -1, 2, 0, (XmlStep(0, "r", i, 0, s, 0, 1, hasdep=1),)),
        ThreadBlock(1, -1, 0, 0, (XmlStep(0, "r", i, 0, o, 0, 1, depid=0, deps=0),))))
    return Program("buffered", "Simple", 1, 1, 3, "custom", 0, (rank0, rank1, rank2))


def _run_buffered(rank: int, world_size: int):
    from collsynth.executor import run_program

    x = torch.arange(7, dtype=torch.float32) + 100 * rank
    out = torch.full((7,), -1.0)
    run_program(buffered_program(), x, out, timeout_s=20)
    return out.tolist()


def test_a_program_that_needs_buffered_sends_runs_on_gloo():
    assert not schedule(buffered_program()).aligned
    outs = launch(_run_buffered, 3, timeout_s=60)
    first = list(range(7))
    assert outs[0] == [float(v) for v in first]
    assert outs[1] == [float(v) for v in first]
    assert outs[2] == [-1.0] * 7
