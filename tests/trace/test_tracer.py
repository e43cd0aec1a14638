"""The tracer on every wrapped function (2 gloo ranks), its options, and its clean-up."""

from __future__ import annotations

import os
import pickle
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():  # pragma: no cover
    pytest.skip("torch.distributed with gloo is needed", allow_module_level=True)

import torch._dynamo  # noqa: E402,F401 - DDP imports it on first use; once, before forking
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

from collsynth.errors import UnknownNameError  # noqa: E402
from collsynth.executor import launch  # noqa: E402
from collsynth.trace import TRACED_FUNCTIONS, TracingError, read_trace, tracing  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
c10d = dist.distributed_c10d


def _patched_names() -> dict[str, object]:
    """Everything the tracer may replace, by name."""
    from torch.nn.parallel import DistributedDataParallel

    names = {}
    for owner, label in ((dist, "dist"), (c10d, "c10d")):
        for name in (*TRACED_FUNCTIONS, "init_process_group", "destroy_process_group"):
            if hasattr(owner, name):
                names[f"{label}.{name}"] = getattr(owner, name)
    names["P2POp.__init__"] = c10d.P2POp.__init__
    names["DDP.forward"] = DistributedDataParallel.forward
    names["DDP.register_comm_hook"] = DistributedDataParallel.register_comm_hook
    return names


# -- without a process group ---------------------------------------------------------------------


def test_the_originals_come_back_after_an_exception(tmp_path):
    before = _patched_names()
    with pytest.raises(KeyError, match="boom"):
        with tracing(tmp_path, ddp=True):
            changed = {k for k, v in _patched_names().items() if v is not before[k]}
            assert {"dist.all_reduce", "c10d.all_reduce", "dist.isend", "P2POp.__init__",
                    "DDP.forward", "dist.batch_isend_irecv"} <= changed
            assert "c10d.isend" not in changed   # batch_isend_irecv compares it by identity
            raise KeyError("boom")
    after = _patched_names()
    assert all(after[k] is before[k] for k in before)
    assert list(tmp_path.iterdir()) == []   # no process group: nothing to write


def test_a_call_that_fails_before_init_is_torch_s_own_error(tmp_path):
    with tracing(tmp_path):
        with pytest.raises(ValueError, match="[Dd]efault process group"):
            dist.all_reduce(torch.ones(2))
    assert list(tmp_path.iterdir()) == []


def test_tracing_blocks_do_not_nest(tmp_path):
    original = dist.all_reduce
    with tracing(tmp_path / "a"):
        traced = dist.all_reduce
        with pytest.raises(TracingError, match="already active"):
            with tracing(tmp_path / "b"):
                pass  # pragma: no cover
        assert dist.all_reduce is traced is not original   # the outer block still traces
    assert dist.all_reduce is original


def test_options_are_checked(tmp_path, monkeypatch):
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    before = _patched_names()
    with pytest.raises(ValueError, match="cross_node_only needs ranks_per_node"):
        with tracing(tmp_path, cross_node_only=True):
            pass  # pragma: no cover
    with pytest.raises(UnknownNameError, match="unknown byte convention 'bytes'.*nccl-tests"):
        with tracing(tmp_path, byte_convention="bytes"):
            pass  # pragma: no cover
    with pytest.raises(ValueError, match="ranks_per_node = 0"):
        with tracing(tmp_path, ranks_per_node=0):
            pass  # pragma: no cover
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "eight")
    with pytest.raises(ValueError, match="LOCAL_WORLD_SIZE = 'eight'"):
        with tracing(tmp_path, cross_node_only=True):
            pass  # pragma: no cover
    assert all(v is before[k] for k, v in _patched_names().items())


def test_the_isend_wrapper_passes_p2pop_s_check_and_is_not_stored(tmp_path):
    original = dist.isend
    with tracing(tmp_path):
        assert dist.isend is not original and dist.isend == original
        assert dist.isend in [c10d.isend, c10d.irecv] and hash(dist.isend) == hash(original)
        c10d._check_op(dist.isend)          # what P2POp does; raises if the op is refused
        with pytest.raises(ValueError, match="Invalid ``op``"):
            c10d._check_op(dist.all_reduce)


# -- every function on two ranks -----------------------------------------------------------------


def _program(rank: int) -> list:
    """Calls of every traced function; returns what each produced (the same with tracing)."""
    out = []
    b = torch.arange(4, dtype=torch.float32) * (rank + 1)
    dist.broadcast(b, src=1)
    out.append(b)
    objects = [{"rank": rank}, "x" * (10 + rank)]
    dist.broadcast_object_list(objects, src=0)
    out.append(objects)
    m = torch.tensor([rank, 5 - rank], dtype=torch.int32)
    dist.all_reduce(m, op=dist.ReduceOp.MAX)
    out.append(m)
    p = torch.full((3,), 2.0 + rank, dtype=torch.float64)
    dist.reduce(p, dst=1, op=dist.ReduceOp.PRODUCT)
    out.append(p)
    gl = [torch.empty(2, 3) for _ in range(2)]
    dist.all_gather(gl, torch.full((2, 3), float(rank)))
    out.append(gl)
    gt = torch.empty(8, dtype=torch.bfloat16)
    dist.all_gather_into_tensor(gt, torch.full((4,), rank + 0.5, dtype=torch.bfloat16))
    out.append(gt)
    rs = torch.empty(3)
    dist.reduce_scatter(rs, [torch.full((3,), 1.0 + rank), torch.full((3,), 10.0 + rank)])
    out.append(rs)
    rt = torch.empty(2, dtype=torch.int64)
    dist.reduce_scatter_tensor(rt, torch.arange(4) + rank)
    out.append(rt)
    al = [torch.empty(2), torch.empty(2)]
    dist.all_to_all(al, [torch.full((2,), 10.0 * rank + d) for d in range(2)])
    out.append(al)
    single = torch.empty(3 if rank == 0 else 5)
    dist.all_to_all_single(single, torch.arange(4.0) + 10 * rank,
                           output_split_sizes=[1, 2] if rank == 0 else [3, 2],
                           input_split_sizes=[1, 3] if rank == 0 else [2, 2])
    out.append(single)
    gathered = [torch.empty(2) for _ in range(2)] if rank == 1 else None
    dist.gather(torch.full((2,), float(rank)), gathered, dst=1)
    out.append(gathered)
    part = torch.empty(3)
    dist.scatter(part, [torch.full((3,), 7.0), torch.full((3,), 8.0)] if rank == 0 else None,
                 src=0)
    out.append(part)
    if rank == 0:
        dist.send(torch.arange(5.0), dst=1)
        r = torch.empty(6, dtype=torch.int16)
        dist.irecv(r, src=1).wait()
        out.append(r)
    else:
        r = torch.empty(5)
        source = dist.recv(r)           # any source
        dist.isend(torch.arange(6, dtype=torch.int16), dst=0).wait()
        out.append((r, source))
    inbox = torch.empty(2)
    ops = [dist.P2POp(dist.isend, torch.full((2,), float(rank)), 1 - rank),
           dist.P2POp(dist.irecv, inbox, 1 - rank)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    out.append(inbox)
    dist.barrier()
    try:
        dist.broadcast(torch.ones(2), src=7)
    except (ValueError, RuntimeError) as exc:
        out.append(type(exc).__name__)
    return out


def _flatten(value) -> list:
    if isinstance(value, torch.Tensor):
        return [str(value.dtype), value.tolist()]
    if isinstance(value, (list, tuple)):
        return [_flatten(v) for v in value]
    return value


def _every_call(rank: int, world_size: int, directory: str) -> dict:
    plain = _flatten(_program(rank))
    with tracing(Path(directory) / "calls", record_durations=True, ranks_per_node=2) as tracer:
        traced = _flatten(_program(rank))
    assert tracer.path.name == f"rank-{rank:05d}.jsonl"
    # DDP with ddp=True: the hook is registered at the first forward, or a user's hook tagged
    torch.manual_seed(0)
    with tracing(Path(directory) / "ddp", ddp=True, ranks_per_node=1):
        auto = DDP(torch.nn.Linear(4, 2))
        auto(torch.ones(1, 4)).sum().backward()
        own = DDP(torch.nn.Linear(3, 1, bias=False))
        own.register_comm_hook(None, default_hooks.allreduce_hook)
        own(torch.ones(1, 3)).sum().backward()
        auto(torch.ones(1, 4)).sum().backward()
    return {"plain": pickle.dumps(plain), "traced": pickle.dumps(traced)}


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    base = tmp_path_factory.mktemp("calls")
    results = launch(_every_call, 2, args=(str(base),), timeout_s=120)
    return results, read_trace(base / "calls"), read_trace(base / "ddp")


def test_results_are_the_same_with_and_without_tracing(two_ranks):
    results, _, _ = two_ranks
    for result in results:
        assert pickle.loads(result["traced"]) == pickle.loads(result["plain"])
    rank1 = pickle.loads(results[1]["plain"])
    assert rank1[-3] == [["torch.float32", [0.0, 1.0, 2.0, 3.0, 4.0]], 0]  # recv, any source
    assert rank1[-1] in ("ValueError", "RuntimeError")     # broadcast from rank 7 failed


def _row(call) -> tuple:
    return (call.kind, call.function, call.bytes, call.dtype, call.op, call.root, call.peer,
            call.async_op, call.batch)


def test_every_function_is_recorded_with_its_nccl_tests_size(two_ranks):
    _, trace, _ = two_ranks
    expected = {r: [
        ("broadcast", "broadcast", 16, "float32", None, 1, None, False, None),
        ("broadcast_object_list", "broadcast_object_list", None, None, None, 0, None, False,
         None),
        ("allreduce", "all_reduce", 8, "int32", "max", None, None, False, None),
        ("reduce", "reduce", 24, "float64", "prod", 1, None, False, None),
        ("allgather", "all_gather", 48, "float32", None, None, None, False, None),
        ("allgather", "all_gather_into_tensor", 16, "bfloat16", None, None, None, False, None),
        ("reduce_scatter", "reduce_scatter", 24, "float32", "sum", None, None, False, None),
        ("reduce_scatter", "reduce_scatter_tensor", 32, "int64", "sum", None, None, False,
         None),
        ("alltoall", "all_to_all", 16, "float32", None, None, None, False, None),
        ("alltoall", "all_to_all_single", 16, "float32", None, None, None, False, None),
        ("gather", "gather", 16, "float32", None, 1, None, False, None),
        ("scatter", "scatter", 24, "float32", None, 0, None, False, None),
        *([("send", "send", 20, "float32", None, None, 1, False, None),
           ("irecv", "irecv", 12, "int16", None, None, 1, True, None)] if r == 0 else
          [("recv", "recv", 20, "float32", None, None, 0, False, None),
           ("isend", "isend", 12, "int16", None, None, 0, True, None)]),
        ("send", "batch_isend_irecv", 8, "float32", None, None, 1 - r, True, 0),
        ("recv", "batch_isend_irecv", 8, "float32", None, None, 1 - r, True, 0),
        ("barrier", "barrier", 0, None, None, None, None, False, None),
        ("broadcast", "broadcast", 8, "float32", None, 7, None, False, None),
    ] for r in (0, 1)}
    for rank in (0, 1):
        calls = trace.rank(rank).calls
        rows = [_row(c) for c in calls]
        # the pickled objects' size is what broadcast_object_list sent: checked below
        rows[1] = rows[1][:2] + (None,) + rows[1][3:]
        assert rows == expected[rank]
        assert [c.seq for c in calls] == list(range(len(calls)))
        assert all(c.group == (0, 1) and c.group_size == 2 for c in calls)
        assert all(c.cross_node is False for c in calls)      # both ranks on one node
        assert [c.error is not None for c in calls] == [False] * (len(calls) - 1) + [True]
        objects = calls[1]
        sizes = [i["bytes"] for i in objects.raw["inner"]]
        assert [i["function"] for i in objects.raw["inner"]] == ["broadcast", "broadcast"]
        assert sizes[0] == 2 * 8 and objects.bytes == sum(sizes) > 16   # int64 sizes, payload
        assert objects.raw["objects"] == 2
        single = calls[9]
        assert single.split_sizes == (([1, 3], [1, 2]) if rank == 0 else ([2, 2], [3, 2]))
        assert calls[4].raw["shapes"] == {"tensor_list": [[2, 3], [2, 3]], "tensor": [2, 3]}
        assert calls[10].raw["shapes"]["gather_list"] == ([[2], [2]] if rank == 1 else None)
        batch = [c for c in calls if c.batch is not None]
        assert batch[0].duration_us is not None and batch[1].duration_us is None
        assert all(c.duration_us is not None and c.duration_us >= 0
                   for c in calls if c.batch is None)
        assert calls[12].raw["tag"] == 0


def test_ddp_models_are_traced_with_ddp_true(two_ranks):
    _, _, trace = two_ranks
    for rank in (0, 1):
        rows = [(c.kind, c.function, c.bytes, c.raw.get("ddp_bucket"))
                for c in trace.rank(rank).calls]
        assert all(c.cross_node for c in trace.rank(rank).calls)   # one rank per node
        assert rows == [
            ("broadcast", "_broadcast_coalesced", 40, None),  # Linear(4, 2): 10 float32
            ("allreduce", "all_reduce", 40, 0),               # its hook, registered at forward
            ("broadcast", "_broadcast_coalesced", 12, None),  # Linear(3, 1, bias=False)
            ("allreduce", "all_reduce", 12, 0),               # the user's own hook, tagged
            ("allreduce", "all_reduce", 40, 0),
        ]


# -- the command-line entry for unmodified scripts -----------------------------------------------


SCRIPT = """
import sys, torch, torch.distributed as dist
dist.init_process_group("gloo", init_method="file://" + sys.argv[3], rank=0, world_size=1)
dist.all_reduce(torch.ones(int(sys.argv[1])))
dist.destroy_process_group()
sys.exit(int(sys.argv[2]))
"""


def test_run_traces_an_unmodified_script_and_keeps_its_exit_status(tmp_path):
    # In this process (a subprocess would import torch again): the script makes and destroys
    # its own one-rank group, as ``python -m collsynth.trace.run train.py 6 3 STORE`` would.
    from collsynth.trace.run import main

    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(SCRIPT))
    env = {"COLLSYNTH_TRACE_DIR": str(tmp_path / "trace"), "COLLSYNTH_TRACE_DURATIONS": "1"}
    argv, path = sys.argv[:], sys.path[:]
    assert main([str(script), "6", "3", str(tmp_path / "store")], env=env) == 3
    assert (sys.argv, sys.path) == (argv, path) and not dist.is_initialized()
    trace = read_trace(tmp_path / "trace")
    [call] = trace.rank(0).calls
    assert (call.kind, call.bytes, call.site.split(" ")[0]) == ("allreduce", 24, f"{script}:4")
    assert call.duration_us is not None and trace.rank(0).header.record_durations


@pytest.mark.filterwarnings("ignore:'collsynth.trace.run' found in sys.modules")
def test_run_is_a_module_entry_point(monkeypatch, capsys):
    import runpy

    monkeypatch.setattr(sys, "argv", ["run"])
    with pytest.raises(SystemExit) as exited:
        runpy.run_module("collsynth.trace.run", run_name="__main__")
    assert exited.value.code == 2
    assert "usage: COLLSYNTH_TRACE_DIR=DIR" in capsys.readouterr().err


def test_run_refuses_a_missing_directory_variable_and_script(tmp_path, capsys):
    from collsynth.trace.run import main

    assert main([str(tmp_path / "x.py")], env={}) == 2
    assert "COLLSYNTH_TRACE_DIR is not set" in capsys.readouterr().err
    assert main([str(tmp_path / "x.py")], env={"COLLSYNTH_TRACE_DIR": str(tmp_path)}) == 2
    assert "no such script" in capsys.readouterr().err
    assert main([str(tmp_path / "x.py")], env={"COLLSYNTH_TRACE_DIR": str(tmp_path),
                                               "COLLSYNTH_TRACE_DURATIONS": "maybe"}) == 2
    assert "COLLSYNTH_TRACE_DURATIONS = 'maybe'; expected 1 or 0" in capsys.readouterr().err
    assert main([], env={}) == 2


def test_run_exits_with_the_scripts_status_and_runs_its_exit_handlers(tmp_path):
    """After a run that imported torch.distributed the runner skips the interpreter's teardown
    (where gloo can abort a finished process), but not the script's exit handlers or status."""
    import subprocess

    script = tmp_path / "script.py"
    script.write_text("import atexit, sys\nimport torch.distributed\n"
                      "atexit.register(lambda: print('handler ran', flush=True))\n"
                      "print('done', flush=True)\nsys.exit(3)\n")
    env = {**os.environ, "COLLSYNTH_TRACE_DIR": str(tmp_path / "trace")}
    done = subprocess.run([sys.executable, "-m", "collsynth.trace.run", str(script)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 3, done.stderr[-2000:]
    assert done.stdout.splitlines() == ["done", "handler ran"]
