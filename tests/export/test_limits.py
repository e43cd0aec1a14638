"""The runtimes' limits: the table, exact evaluation on programs, estimates from the sends, and
how export refuses an algorithm that exceeds them."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

from collsynth.algorithm import Algorithm, Send, Step, verify
from collsynth.algorithm.fileformat import save_algorithm
from collsynth.cli import main
from collsynth.export.pipeline import export_algorithm
from collsynth.collective import allgather, reduce_scatter
from collsynth.errors import ExportError
from collsynth.export import lower
from collsynth.export.limits import (CHANNELS, COUNT, DEPID, FUSION, LIMITS, NODES, OFFSET,
                                     PER_CHANNEL, STEPS, SUBS, THREADBLOCKS, LimitViolation,
                                     estimate_all, estimate_figures, estimate_limits,
                                     find_limit_violations, get_limit, runtime_limits)
from collsynth.export.lower import check_limits
from collsynth.export.stats import program_stats
from collsynth.export.program import GpuProgram, Program, ThreadBlock, XmlStep
from collsynth.runtimes import MSCCL_XML, runtime_names
from collsynth.runtimes.dialect import DIALECTS
from collsynth.topology import get_topology

# -- the table --------------------------------------------------------------------------------


def test_every_runtime_has_its_limits():
    assert set(LIMITS) == set(runtime_names(MSCCL_XML)) == set(DIALECTS)
    for runtime, limits in LIMITS.items():
        names = [limit.name for limit in limits]
        assert len(names) == len(set(names)), runtime
        assert {STEPS, THREADBLOCKS, PER_CHANNEL, CHANNELS, COUNT, NODES, SUBS, OFFSET, DEPID,
                FUSION} <= {limit.name for limit in limits if limit.checked}
        for limit in limits:
            assert limit.allowed > 0 and limit.what and limit.source, (runtime, limit)
            assert "\n" not in limit.source


def test_the_table_agrees_with_the_runtime_rules():
    # The dialects drive the writer and the checker; the table must say the same.
    for name, rt in DIALECTS.items():
        assert get_limit(name, STEPS).allowed == rt.max_steps_per_tb
        assert get_limit(name, THREADBLOCKS).allowed == rt.max_threadblocks
        assert get_limit(name, PER_CHANNEL).allowed == rt.max_tbs_per_channel
        assert get_limit(name, CHANNELS).allowed == rt.max_channels
        assert get_limit(name, COUNT).allowed == rt.max_count - 1
    # The spec's figures (section 13.3) where the runtimes differ.
    assert [get_limit(r, STEPS).allowed for r in ("msccl", "rccl")] == [256, 64]
    assert [get_limit(r, THREADBLOCKS).allowed for r in ("msccl", "rccl")] == [216, 64]
    assert get_limit("msccl-executor", THREADBLOCKS).allowed == 1024
    assert runtime_limits("RCCL") == LIMITS["rccl"]
    with pytest.raises(KeyError):
        get_limit("msccl", "NO_SUCH_LIMIT")


def test_a_violation_says_by_how_much():
    v = LimitViolation("rccl", STEPS, "steps per threadblock", 64, 200, "threadblock 3 of rank 5",
                       places=2, scopes=8)
    assert (v.excess, v.ratio) == (136, 200 / 64)
    text = str(v)
    assert text.startswith("MSCCL_MAX_NUM_STEPS: rccl allows 64 steps per threadblock; "
                           "threadblock 3 of rank 5 needs 200 (")
    assert "3.1x the limit, 136 over; 2 of 8 ranks" in text
    bound = LimitViolation("msccl", THREADBLOCKS, "threadblocks per rank", 216, 2160, "rank 0",
                           lower_bound=True)
    assert "rank 0 needs 2160 or more (at least 10x the limit, 1944 over)" in str(bound)


# -- exact figures on programs: one synthetic program per limit ------------------------------


def _step(s: int, kind: str = "cpy", **changes) -> XmlStep:
    fields = dict(srcbuf="i", srcoff=0, dstbuf="o", dstoff=0, cnt=1, depid=-1, deps=-1, hasdep=0)
    fields.update(changes)
    return XmlStep(s, kind, **fields)


def _program(tbs_of_rank0: list[ThreadBlock], *, ngpus: int = 2, nchannels: int = 1) -> Program:
    """Rank 0 runs ``tbs_of_rank0``; the other ranks one local copy each."""
    gpus = [GpuProgram(0, 1, 1, 0, tuple(tbs_of_rank0))]
    gpus += [GpuProgram(q, 1, 1, 0, (ThreadBlock(0, -1, -1, 0, (_step(0),)),))
             for q in range(1, ngpus)]
    return Program("synthetic", "Simple", nchannels, 1, ngpus, "allreduce", 0, tuple(gpus))


def _local(i: int, steps: int = 1) -> ThreadBlock:
    return ThreadBlock(i, -1, -1, 0, tuple(_step(s) for s in range(steps)))


# name -> (program, runtime, limit, allowed, actual, place named)
SYNTHETIC = {
    "steps": (lambda: _program([_local(0), _local(1, 65)]), "rccl", STEPS, 64, 65,
              "threadblock 1 of rank 0"),
    "threadblocks": (lambda: _program([_local(i) for i in range(70)]), "rccl", THREADBLOCKS, 64,
                     70, "rank 0"),
    "sending per channel": (
        lambda: _program([ThreadBlock(i, i + 1, -1, 0, (_step(0, "s"),)) for i in range(40)],
                         ngpus=41),
        "msccl", PER_CHANNEL, 32, 40, "rank 0 on channel 0"),
    "receiving per channel": (
        lambda: _program([ThreadBlock(i, -1, i + 1, 1, (_step(0, "r"),)) for i in range(33)],
                         ngpus=34, nchannels=2),
        "msccl-executor", PER_CHANNEL, 32, 33, "rank 0 on channel 1"),
    "channels": (lambda: _program([_local(0)], nchannels=40), "msccl", CHANNELS, 32, 40,
                 "the program"),
    "cnt": (lambda: _program([_local(0), ThreadBlock(1, -1, -1, 0, (_step(0), _step(1, cnt=90)))]),
            "msccl", COUNT, 71, 90, "step 1 of threadblock 1 of rank 0"),
    "elements": (lambda: _program([_local(i, 250) for i in range(20)]), "msccl", NODES, 4096,
                 1 + 2 + 20 + 20 * 250, "rank 0"),
    "ranks": (lambda: _program([_local(0)], ngpus=1030), "rccl", SUBS, 1024, 1030,
              "the <algo> element"),
    "offsets": (lambda: _program([ThreadBlock(0, -1, -1, 0, (_step(0, srcoff=40000),))]), "rccl",
                OFFSET, 32767, 40000, "step 0 of threadblock 0 of rank 0"),
    "depid": (lambda: _program([ThreadBlock(0, -1, -1, 0, (_step(0, "nop", depid=130, deps=0),
                                                           _step(1, depid=5, deps=0)))]),
              "msccl", DEPID, 127, 130, "step 0 of threadblock 0 of rank 0"),
    "fused reductions": (lambda: _program([ThreadBlock(0, -1, -1, 0, tuple(
        _step(s, "re", srcbuf="s", dstoff=3) for s in range(20)))]), "msccl", FUSION, 16, 20,
        "step 19 of threadblock 0 of rank 0"),
}


@pytest.mark.parametrize("kind", list(SYNTHETIC))
def test_each_limit_is_found_with_its_amount(kind):
    make, runtime, limit, allowed, actual, where = SYNTHETIC[kind]
    program = make()
    found = [v for v in find_limit_violations(program, runtime) if v.limit == limit]
    assert len(found) == 1, found
    violation = found[0]
    assert (violation.runtime, violation.allowed, violation.actual) == (runtime, allowed, actual)
    assert violation.excess == actual - allowed and not violation.lower_bound
    assert violation.where.startswith(where)
    assert f"needs {actual} (" in str(violation)
    # Statistics are enough: the same answer without the program.
    assert find_limit_violations(program_stats(program), runtime) == \
        find_limit_violations(program, runtime)
    # lower()'s exact check raises with the same violation.
    with pytest.raises(ExportError) as info:
        check_limits(program, runtime)
    assert violation in info.value.violations


def test_a_program_within_the_limits_has_no_violation(ring_allgather):
    program = lower(ring_allgather(8), runtime="rccl")
    for runtime in runtime_names(MSCCL_XML):
        assert find_limit_violations(program, runtime) == []
    # Fusable 're' runs are broken by anything else: two runs of 10 are fine.
    steps = [_step(s, "re", srcbuf="s") for s in range(10)] + [_step(10)] + \
        [_step(s, "re", srcbuf="s") for s in range(11, 21)]
    assert find_limit_violations(_program([ThreadBlock(0, -1, -1, 0, tuple(steps))]),
                                 "msccl") == []


def test_places_count_every_rank_over_the_limit():
    gpus = tuple(GpuProgram(q, 1, 1, 0, tuple(_local(i) for i in range(60 + q)))
                 for q in range(8))
    program = Program("p", "Simple", 1, 1, 8, "allreduce", 0, gpus)
    (violation,) = find_limit_violations(program, "rccl")
    assert (violation.actual, violation.where, violation.places, violation.scopes) == \
        (67, "rank 7", 3, 8)     # ranks 5, 6, 7 have 65, 66, 67


# -- estimates before lowering ------------------------------------------------------------------


def _direct_allgather(n: int) -> Algorithm:
    """Every rank sends its chunk to every other rank, in one step."""
    sends = tuple(Send(r, r, d) for r in range(n) for d in range(n) if d != r)
    return Algorithm(f"direct{n}", get_topology(f"fully-connected:{n}"), allgather(n),
                     (Step(n - 1, sends),))


def _ring_reduce_scatter(n: int) -> Algorithm:
    steps = tuple(Step(1, tuple(Send((r - t - 1) % n, r, (r + 1) % n, True) for r in range(n)))
                  for t in range(n - 1))
    return verify(Algorithm(f"ring{n}-rs", get_topology(f"ring:{n}"), reduce_scatter(n), steps))


OPTIONS = [dict(), dict(channels=2, instances=2), dict(inplace=True, outofplace=False),
           dict(channels=3), dict(channels=2, channel_by="peer"),
           dict(channels=3, channel_by="peer", instances=2)]


@pytest.mark.parametrize("runtime", runtime_names(MSCCL_XML))
def test_estimates_bound_the_lowered_program(algorithms, runtime):
    compared = 0
    for name, algorithm in algorithms.items():
        for options in OPTIONS:
            try:
                program = lower(algorithm, runtime=runtime, **options)
            except ExportError:
                continue  # not expressible for this runtime / layout
            estimate = estimate_figures(algorithm, runtime, **options)
            exact = program_stats(program).figures
            assert estimate.ngpus == exact.ngpus and estimate.nchannels == exact.nchannels
            for field in ("threadblocks", "steps", "send_tbs_per_channel",
                          "recv_tbs_per_channel", "nodes", "children"):
                for guess, real in zip(getattr(estimate, field), getattr(exact, field)):
                    assert guess.value <= real.value, (name, options, field, guess, real)
                    assert guess.at_least or guess.value == real.value, (name, options, field)
            for guess, real in zip(estimate.send_tbs_per_channel, exact.send_tbs_per_channel):
                assert (guess.value, guess.where) == (real.value, real.where)
            compared += 1
    assert compared >= 20


def test_a_direct_allgather_is_refused_from_its_sends(monkeypatch):
    algorithm = _direct_allgather(70)
    by_runtime = estimate_all(algorithm, channels=2)
    for runtime in runtime_names(MSCCL_XML):
        assert by_runtime[runtime] == estimate_limits(algorithm, runtime, channels=2)
    # A rank's chunk travels on one channel: 69 sending threadblocks there; it receives from
    # 35 odd (or even) ranks on the other channel.
    per_channel = {(v.runtime, v.what): v.actual for vs in by_runtime.values() for v in vs
                   if v.limit == PER_CHANNEL}
    assert per_channel == {(runtime, f"{kind} threadblocks per channel"): count
                           for runtime in runtime_names(MSCCL_XML)
                           for kind, count in (("sending", 69), ("receiving", 35))}
    # rccl also runs out of threadblocks, counted exactly: 69 + 35 + one for local copies.
    (tbs,) = [v for v in by_runtime["rccl"] if v.limit == THREADBLOCKS]
    assert (tbs.actual, tbs.places, tbs.scopes, tbs.lower_bound) == (105, 70, 70, False)
    assert not [v for v in by_runtime["msccl"] if v.limit == THREADBLOCKS]
    # lower() refuses before verifying or building anything.
    lower_module = importlib.import_module("collsynth.export.lower")

    def never(*args, **kwargs):
        raise AssertionError("lowering went past the estimate")

    monkeypatch.setattr(lower_module, "verify", never)
    with pytest.raises(ExportError, match=r"found from the sends, before lowering\): "
                                          r"MSCCL_MAX_NUM_THREAD_BLOCKS: rccl allows 64 "
                                          r"threadblocks per rank; rank 0 needs 105 ") as info:
        lower(algorithm, runtime="rccl", channels=2)
    assert [v.limit for v in info.value.violations] == [THREADBLOCKS, PER_CHANNEL, PER_CHANNEL]


def test_steps_of_reductions_without_fused_ops():
    # rccl receives a reduction as r + re: a ring threadblock needs 39 sends + 2 x 39 receives.
    algorithm = _ring_reduce_scatter(40)
    (rccl,) = estimate_limits(algorithm, "rccl")
    assert (rccl.limit, rccl.actual, rccl.lower_bound) == (STEPS, 117, True)
    assert re.match(r"threadblock \d+ of rank 0$", rccl.where)
    assert estimate_limits(algorithm, "msccl") == []   # rrc: 78 steps of 256
    program = lower(algorithm, runtime="msccl")
    assert program_stats(program).max_steps_per_threadblock >= 78


def test_out_of_range_sends_are_left_to_the_verifier():
    algorithm = Algorithm("bad", get_topology("ring:3"), allgather(3), (Step(1, (Send(0, 0, 7),)),))
    assert estimate_figures(algorithm, "msccl") is None
    assert estimate_limits(algorithm, "msccl") == []
    assert estimate_all(algorithm) == {name: [] for name in runtime_names(MSCCL_XML)}


# -- export refuses -----------------------------------------------------------------------------


def test_export_algorithm_refuses_with_every_limit(tmp_path):
    algorithm = verify(_direct_allgather(40))
    target = tmp_path / "direct.xml"
    with pytest.raises(ExportError) as info:
        export_algorithm(algorithm, target, runtime="msccl")
    assert not target.exists()
    message = str(info.value)
    assert "exceeds 2 msccl limits" in message
    assert "msccl allows 32 sending threadblocks per channel; rank 0 on channel 0 needs 39 " \
           "(1.2x the limit, 7 over; 40 of 40 ranks)" in message
    assert "receiving threadblocks per channel" in message


def test_the_cli_prints_one_line_per_exceeded_limit(tmp_path, capsys):
    path = tmp_path / "direct.json"
    save_algorithm(verify(_direct_allgather(40)), path)
    out = tmp_path / "out"
    out.mkdir()
    # One channel: more channels by peer would fit (the default tries them).
    code = main(["export", str(path), "-o", str(out), "--runtime", "all", "--channels", "1"])
    assert code == 1
    assert list(out.iterdir()) == []
    lines = capsys.readouterr().err.splitlines()
    assert all(line.startswith("collsynth: error: ") for line in lines)
    assert f"{path}: not exported: 6 limits of msccl, msccl-executor, rccl exceeded" in lines[0]
    body = [line.removeprefix("collsynth: error: ") for line in lines[1:]]
    assert len(body) == 6
    for runtime in runtime_names(MSCCL_XML):
        assert sum(line.startswith(f"{runtime}: {PER_CHANNEL}: {runtime} allows 32 ")
                   for line in body) == 2
    # One runtime: only its limits; and channels that fit change nothing for the senders.
    code = main(["export", str(path), "-o", str(out / "x.xml"), "--runtime", "rccl",
                 "--channels", "2"])
    err = capsys.readouterr().err.splitlines()
    assert code == 1 and len(err) == 2 and not (out / "x.xml").exists()
    assert "rccl: MSCCL_MAX_NUM_THREAD_BLOCKS_PER_CHANNEL: rccl allows 32 sending" in err[1]


def test_the_cli_gathers_the_limits_lowering_finds(tmp_path, capsys, monkeypatch):
    # Without the CLI's own estimate, lower() refuses each runtime; all are reported together.
    path = tmp_path / "direct.json"
    save_algorithm(verify(_direct_allgather(40)), path)
    monkeypatch.setattr("collsynth.export.pipeline.estimate_all",
                        lambda algorithm, runtimes, **options: {r: [] for r in runtimes})
    code = main(["export", str(path), "-o", str(tmp_path / "x.xml"), "--runtime", "all",
                 "--channels", "1"])
    err = capsys.readouterr().err.splitlines()
    assert code == 1 and len(err) == 7 and not list(tmp_path.glob("*.xml"))
    assert "6 limits of msccl, msccl-executor, rccl exceeded" in err[0]


def test_the_cli_names_too_many_channels(tmp_path, capsys, ring_allgather):
    path = tmp_path / "ring.json"
    save_algorithm(ring_allgather(8), path)
    code = main(["export", str(path), "-o", str(tmp_path / "r.xml"), "--instances", "40"])
    err = capsys.readouterr().err.splitlines()
    assert code == 1
    # More instances than channels is the option's fault, whatever the algorithm: one line.
    assert err == ["collsynth: error: --instances 40: each instance needs a channel of its own, "
                   "more than the channels the runtime allows (MAXCHANNELS: msccl 32); nothing "
                   "written"]
    assert not Path(tmp_path / "r.xml").exists()
    assert main(["export", str(path), "-o", str(tmp_path / "r.xml"), "--instances", "4"]) == 0


def test_channels_auto_spreads_a_large_tree_schedule_until_it_fits(tmp_path, capsys):
    """A 32-GPU optimal allgather needs more steps per threadblock than msccl-executor allows on
    one channel; --channels auto finds the fewest channels that fit, and the file checks."""
    from collsynth.algorithm import save_algorithm
    from collsynth.cli import main
    from collsynth.collective import standard_collective
    from collsynth.resolve import resolve_topology
    from collsynth.synthesis.bandwidth_optimal import solve_bandwidth_optimal

    system = resolve_topology("dgx-a100", nodes=4)
    result = solve_bandwidth_optimal(system, standard_collective("allgather", 32),
                                     size_bytes=64 << 20)
    path = tmp_path / "ag32.json"
    save_algorithm(result.algorithm, path)
    out = tmp_path / "ag32.xml"
    keep = ["--stages", "keep"]   # lowered as it is (the default may restage it)
    assert main(["export", str(path), "-o", str(out), "--runtime", "msccl-executor",
                 "--channels", "1", *keep]) == 1
    assert "MSCCL_MAX_NUM_STEPS" in capsys.readouterr().err and not out.exists()
    assert main(["export", str(path), "-o", str(out), "--runtime", "msccl-executor",
                 "--channels", "auto", *keep]) == 0
    written = capsys.readouterr().out
    channels = int(written.split(" channel(s)")[0].rsplit(" ", 1)[1])
    assert channels > 1 and "stage(s)" not in written
    assert main(["check", str(out), "--runtime", "msccl-executor", "--strict"]) == 0
    # The default finds a layout too.
    out.unlink()
    assert main(["export", str(path), "-o", str(out), "--runtime", "msccl-executor"]) == 0
    assert main(["check", str(out), "--runtime", "msccl-executor", "--strict"]) == 0


@pytest.mark.parametrize("runtime", runtime_names(MSCCL_XML))
def test_peer_channels_are_correct_programs(algorithms, runtime):
    """Spreading peers over channels changes only which threadblock carries a message: every
    program still passes the strict check, and each rank's peers are spread evenly."""
    from collsynth.export.pipeline import check_exported

    checked = 0
    for name, algorithm in algorithms.items():
        try:
            program = lower(algorithm, runtime=runtime, channels=3, channel_by="peer")
        except ExportError:
            continue
        check_exported(program, runtime, algorithm)  # raises ExportError with the problems
        chans = {tb.chan for gpu in program.gpus for tb in gpu.threadblocks}
        assert len(chans) > 1 or algorithm.topology.num_ranks <= 2, name
        checked += 1
    assert checked >= 5


def test_lower_refuses_an_unknown_channel_policy(ring_allgather):
    with pytest.raises(ExportError, match="channel_by"):
        lower(ring_allgather, runtime="msccl", channel_by="hash")
