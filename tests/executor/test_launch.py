"""Launching local process groups: results, failures that name their rank, no hangs."""

from __future__ import annotations

import os
import re
import time

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():  # pragma: no cover
    pytest.skip("torch.distributed with gloo is needed", allow_module_level=True)

from collsynth.collective import standard_collective  # noqa: E402
from collsynth.executor import (  # noqa: E402
    BackendUnavailableError,
    ExecutionTimeoutError,
    LaunchError,
    launch,
    run,
    run_cases,
)
from collsynth.executor.launch import free_port  # noqa: E402
from collsynth.synthesis import solve_least_steps  # noqa: E402
from collsynth.topology import get_topology  # noqa: E402

RING4 = solve_least_steps(get_topology("ring:4"), standard_collective("allgather", 4),
                          chunks=2).algorithm


def _sum_of_ranks(rank, world_size, extra):
    x = torch.tensor([rank + extra])
    dist.all_reduce(x)
    return {"rank": rank, "sum": int(x)}


def test_results_come_back_in_rank_order():
    assert launch(_sum_of_ranks, 3, args=(10,)) == [{"rank": r, "sum": 33} for r in range(3)]


def test_a_tcp_store_on_localhost_works():
    assert 0 < free_port() < 65536
    assert [r["sum"] for r in launch(_sum_of_ranks, 2, args=(0,), init="tcp")] == [1, 1]


def test_spawned_processes_run_a_library_function():
    # spawn re-imports everything in the children: the function must be importable.
    assert launch(run_cases, 2, args=([],), start_method="spawn", timeout_s=120) == [[], []]


def _threads(rank, world_size):
    big = torch.randn(256, 256)
    return [torch.get_num_threads(), float((big @ big).sum()) * 0]


def test_forked_ranks_use_one_thread_even_after_the_parent_used_many():
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        big = torch.randn(512, 512)
        (big @ big).sum()   # the parent's OpenMP pool is now started
        assert launch(_threads, 2, timeout_s=60) == [[1, 0.0], [1, 0.0]]
    finally:
        torch.set_num_threads(before)
    with pytest.raises(ValueError, match="forkserver"):
        launch(_threads, 2, threads_per_rank=2, start_method="fork")


def _allgather_with_a_bad_rank(rank, world_size, bad, mode):
    x = torch.arange(5, dtype=torch.float32) + rank
    out = torch.empty(20)
    if rank == bad:
        if mode == "raise":
            raise RuntimeError("boom on purpose")
        if mode == "hang":
            time.sleep(120)
        if mode == "die":
            os._exit(3)
    run(RING4, x, out, timeout_s=2.0)
    return out.tolist()


def test_the_allgather_itself_works():
    outs = launch(_allgather_with_a_bad_rank, 4, args=(-1, ""))
    expected = torch.cat([torch.arange(5, dtype=torch.float32) + r for r in range(4)]).tolist()
    assert outs == [expected] * 4


def test_a_rank_that_raises_is_named_first():
    start = time.monotonic()
    with pytest.raises(LaunchError) as info:
        launch(_allgather_with_a_bad_rank, 4, args=(2, "raise"), grace_s=5, timeout_s=60)
    assert time.monotonic() - start < 50   # well under timeout_s: the failure ends the launch
    error = info.value
    assert error.failures[0].rank == 2 and error.failures[0].kind == "error"
    assert str(error).startswith("rank 2 failed: RuntimeError: boom on purpose")
    assert "boom on purpose" in error.failures[0].traceback


def test_a_rank_that_hangs_makes_its_peers_time_out_naming_rank_and_step():
    start = time.monotonic()
    with pytest.raises(LaunchError) as info:
        launch(_allgather_with_a_bad_rank, 4, args=(2, "hang"), grace_s=3, timeout_s=60)
    assert time.monotonic() - start < 50   # well under timeout_s: peers time out first
    error = info.value
    by_rank = {f.rank: f for f in error.failures}
    assert by_rank[2].kind in ("stopped", "timeout")
    timeouts = [f for f in error.failures
                if re.search(r"ExecutionTimeoutError: rank \d: step \d+: waiting for chunk \d+ "
                             r"from rank 2 failed \(the call's timeout is 2 s\)", f.message)]
    assert timeouts, str(error)
    assert {f.rank for f in timeouts} <= {1, 3}


def test_a_rank_that_dies_is_reported():
    with pytest.raises(LaunchError) as info:
        launch(_allgather_with_a_bad_rank, 4, args=(1, "die"), grace_s=3, timeout_s=60)
    died = [f for f in info.value.failures if f.kind == "exit"]
    assert [f.rank for f in died] == [1]
    assert "exited with code 3" in died[0].message


def _sleep(rank, world_size):
    time.sleep(60)


def test_the_whole_launch_has_a_deadline():
    start = time.monotonic()
    with pytest.raises(LaunchError, match="timed out: did not finish within 2 s"):
        launch(_sleep, 2, timeout_s=2)
    assert time.monotonic() - start < 40   # the rank sleeps 60 s; the deadline is 2 s


def _nap(rank, world_size):
    time.sleep(1.0)
    return rank


def test_a_launch_reports_progress_while_ranks_run():
    # Ranks that take 1 s, a heartbeat every 0.1 s: several lines before they report.
    lines = []
    assert launch(_nap, 2, progress=lines.append, progress_interval_s=0.1) == [0, 1]
    assert len(lines) >= 3
    assert all(re.fullmatch(r"[0-2] of 2 rank\(s\) done, \d+ s so far \(timeout 300 s\)", line)
               for line in lines), lines
    with pytest.raises(ValueError, match="progress_interval_s"):
        launch(_nap, 1, progress=lines.append, progress_interval_s=0)


def test_the_timeout_error_type():
    assert issubclass(ExecutionTimeoutError, Exception)


@pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.device_count() >= 2,
                    reason="GPUs are present")
def test_nccl_without_gpus_is_a_clear_error():
    with pytest.raises(BackendUnavailableError, match="nccl backend needs 2 GPUs"):
        launch(_sum_of_ranks, 2, args=(0,), backend="nccl")


def test_bad_arguments():
    with pytest.raises(BackendUnavailableError, match="unknown backend"):
        launch(_sum_of_ranks, 2, backend="mpi")
    with pytest.raises(ValueError):
        launch(_sum_of_ranks, 0)


GATHER4 = solve_least_steps(get_topology("ring:4"), standard_collective("gather", 4, root=2),
                            chunks=2).algorithm
SCATTER4 = solve_least_steps(get_topology("ring:4"), standard_collective("scatter", 4, root=1),
                             chunks=2).algorithm
ALLREDUCE2 = solve_least_steps(get_topology("ring:2"), standard_collective("allreduce", 2),
                               chunks=2).algorithm


def _lists(rank, world_size):
    x = torch.full((3,), float(rank))
    gathered = [torch.empty(3) for _ in range(4)] if rank == 2 else None
    run(GATHER4, x, gathered)
    pieces = [torch.full((2,), 10.0 + q) for q in range(4)] if rank == 1 else None
    mine = torch.empty(2)
    run(SCATTER4, pieces, mine)
    return [t.tolist() for t in gathered] if gathered else None, mine.tolist()


def test_gather_and_scatter_take_torch_lists():
    outs = launch(_lists, 4)
    assert outs[2][0] == [[float(q)] * 3 for q in range(4)]
    assert all(o[0] is None for r, o in enumerate(outs) if r != 2)
    assert [o[1] for o in outs] == [[10.0 + r] * 2 for r in range(4)]


def _subgroup(rank, world_size):
    group = dist.new_group([1, 3])
    if rank not in (1, 3):
        return None
    x = torch.arange(4, dtype=torch.int32) * (rank + 1)
    run(ALLREDUCE2, x, group=group, op="max")   # in place
    return x.tolist()


def test_a_subgroup_maps_group_ranks_to_global_ranks():
    assert launch(_subgroup, 4) == [None, [0, 4, 8, 12], None, [0, 4, 8, 12]]


def test_a_group_that_never_connected_is_launched_again(monkeypatch):
    """gloo's mesh setup can fail on an overloaded machine before any rank runs fn: launch starts
    once more; any other failure is raised at once."""
    import importlib

    from collsynth.executor.launch import LaunchError, RankFailure

    # collsynth.executor re-exports the function launch under the module's name.
    launch_module = importlib.import_module("collsynth.executor.launch")

    calls = []

    def flaky(fn, world_size, **options):
        calls.append(world_size)
        if len(calls) == 1:
            raise LaunchError([RankFailure(0, "error", "RuntimeError: Gloo connectFullMesh "
                                                       "failed with ... Connection closed by peer")],
                              {})
        return ["ok"] * world_size

    monkeypatch.setattr(launch_module, "_launch_once", flaky)
    assert launch_module.launch(_sum_of_ranks, 2) == ["ok", "ok"] and calls == [2, 2]

    def broken(fn, world_size, **options):
        calls.append(world_size)
        raise LaunchError([RankFailure(1, "error", "ValueError: the function failed")], {})

    calls.clear()
    monkeypatch.setattr(launch_module, "_launch_once", broken)
    with pytest.raises(LaunchError, match="the function failed"):
        launch_module.launch(_sum_of_ranks, 2)
    assert calls == [2]
