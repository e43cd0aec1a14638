"""A real training loop on a 4-rank gloo group under the tracer, checked record by record.

Every rank trains a ``Linear(16, 8)`` under DistributedDataParallel for 3 iterations with the
tracing communication hook (:func:`collsynth.trace.trace_ddp`), then issues an
``all_to_all_single`` with uneven splits, an ``all_gather_into_tensor``, a broadcast and a
barrier; a second tracing block records only the calls that cross nodes (2 ranks per node).
The expected records are computed here from the tensors the loop used, independently of the
tracer; the traced model is compared bit for bit with an untraced DDP model trained alike.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():  # pragma: no cover
    pytest.skip("torch.distributed with gloo is needed", allow_module_level=True)

# DDP imports torch._dynamo on first use: import it once here, not in each forked rank.
import torch._dynamo  # noqa: E402,F401
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

from collsynth.executor import launch  # noqa: E402
from collsynth.trace import read_trace, trace_ddp, tracing  # noqa: E402

WORLD = 4
ITERATIONS = 3
RANKS_PER_NODE = 2


def _in_splits(rank: int) -> list[int]:
    """Elements rank ``rank`` sends to each destination (uneven, and different per rank)."""
    return [(rank + d) % 3 + 1 for d in range(WORLD)]


def _out_splits(rank: int) -> list[int]:
    return [_in_splits(src)[rank] for src in range(WORLD)]


def _batch(rank: int, iteration: int) -> "torch.Tensor":
    return torch.randn(4, 16, generator=torch.Generator().manual_seed(100 * rank + iteration))


def _train(model: "torch.nn.Module", rank: int) -> None:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for iteration in range(ITERATIONS):
        loss = model(_batch(rank, iteration)).pow(2).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def _loop(rank: int, world_size: int, traced_dir: str, cross_dir: str) -> dict:
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 8)
    reference = copy.deepcopy(model)
    send = torch.arange(sum(_in_splits(rank)), dtype=torch.float32) + 100 * rank
    received = torch.empty(sum(_out_splits(rank)))
    gathered = torch.empty(3 * world_size, dtype=torch.int64)
    broadcast = torch.full((5,), float(rank), dtype=torch.float64)
    with tracing(traced_dir):
        ddp = trace_ddp(DDP(model))
        _train(ddp, rank)
        dist.all_to_all_single(received, send, _out_splits(rank), _in_splits(rank))
        dist.all_gather_into_tensor(gathered, torch.full((3,), rank, dtype=torch.int64))
        dist.broadcast(broadcast, src=1)
        dist.barrier()

    _train(DDP(reference), rank)   # the same training, untraced, with DDP's own reduction

    # Nodes {0, 1} and {2, 3}: only the world allreduce, the [1, 2] allreduce and 1 -> 2 cross.
    node_group = {}
    for ranks in ([0, 1], [2, 3], [1, 2]):
        node_group[tuple(ranks)] = dist.new_group(ranks)
    mine = (0, 1) if rank < 2 else (2, 3)
    with tracing(cross_dir, cross_node_only=True, ranks_per_node=RANKS_PER_NODE):
        dist.all_reduce(torch.ones(3))
        dist.all_reduce(torch.ones(4), group=node_group[mine])
        if rank in (1, 2):
            dist.all_reduce(torch.ones(5), group=node_group[(1, 2)])
        if rank == 0:
            dist.send(torch.ones(6), dst=1)
        elif rank == 1:
            dist.recv(torch.empty(6), src=0)
            dist.send(torch.ones(7), dst=2)
        elif rank == 2:
            dist.recv(torch.empty(7), src=1)
            dist.send(torch.ones(8), dst=3)
        else:
            dist.recv(torch.empty(8))   # any source: known to be rank 2 only after the call

    return {"same_parameters": [torch.equal(a.detach(), b.detach()) for a, b in
                                zip(model.parameters(), reference.parameters())],
            "parameter_elements": sum(p.numel() for p in model.parameters()),
            "received": received.tolist(), "gathered": gathered.tolist(),
            "broadcast": broadcast.tolist()}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    base = tmp_path_factory.mktemp("trace")
    traced, cross = base / "traced", base / "cross"
    results = launch(_loop, WORLD, args=(str(traced), str(cross)), timeout_s=120)
    return results, read_trace(traced), read_trace(cross)


def test_tracing_does_not_change_results(run):
    results, _, _ = run
    for rank, result in enumerate(results):
        assert result["same_parameters"] == [True, True]
        expected = [float(100 * src + sum(_in_splits(src)[:rank]) + i)
                    for src in range(WORLD) for i in range(_in_splits(src)[rank])]
        assert result["received"] == expected
        assert result["gathered"] == [r for r in range(WORLD) for _ in range(3)]
        assert result["broadcast"] == [1.0] * 5


def test_every_rank_wrote_a_header(run):
    _, trace, _ = run
    assert trace.rank_numbers == (0, 1, 2, 3) and trace.missing_ranks == ()
    for rank in range(WORLD):
        header = trace.rank(rank).header
        assert (header.rank, header.world_size, header.backend, header.byte_convention) == \
            (rank, WORLD, "gloo", "nccl-tests")
        assert header.version == 1 and not header.record_durations


def test_the_records_are_exactly_what_the_loop_issued(run):
    results, trace, _ = run
    world = tuple(range(WORLD))
    for rank in range(WORLD):
        parameter_bytes = results[rank]["parameter_elements"] * 4   # float32
        calls = trace.rank(rank).calls
        expected = (
            # DDP's constructor broadcasts the parameters from rank 0 (_broadcast_coalesced)
            [("broadcast", "_broadcast_coalesced", parameter_bytes, "float32", None, 0, False)]
            # one gradient bucket per iteration, through the tracing hook
            + [("allreduce", "all_reduce", parameter_bytes, "float32", "sum", None, True)]
            * ITERATIONS
            + [("alltoall", "all_to_all_single", 4 * sum(_in_splits(rank)), "float32", None,
                None, False),
               ("allgather", "all_gather_into_tensor", 8 * 3 * WORLD, "int64", None, None,
                False),
               ("broadcast", "broadcast", 8 * 5, "float64", None, 1, False),
               ("barrier", "barrier", 0, None, None, None, False)])
        assert [(c.kind, c.function, c.bytes, c.dtype, c.op, c.root, c.async_op)
                for c in calls] == expected
        assert [c.seq for c in calls] == list(range(len(expected)))
        assert all(c.group == world and c.group_size == WORLD and c.peer is None
                   and c.error is None and c.duration_us is None and c.batch is None
                   for c in calls)
        assert [c.raw.get("ddp_bucket") for c in calls] == [None] + [0] * ITERATIONS + [None] * 4
        coalesced, alltoall, allgather = calls[0], calls[4], calls[5]
        assert coalesced.raw["tensors"] == 2
        assert coalesced.raw["shapes"] == {"tensors": [[8, 16], [8]]}
        assert alltoall.split_sizes == (_in_splits(rank), _out_splits(rank))
        assert alltoall.raw["shapes"] == {"output": [sum(_out_splits(rank))],
                                          "input": [sum(_in_splits(rank))]}
        assert alltoall.raw["element_size"] == 4
        assert allgather.raw["numel"] == {"output_tensor": 3 * WORLD, "input_tensor": 3}


def test_call_sites_name_the_users_lines(run):
    _, trace, _ = run
    here = str(Path(__file__).resolve())
    for call in trace.rank(2).calls:
        path, _, rest = call.site.rpartition(":")
        line, function = rest.split(" ")
        assert Path(path).resolve() == Path(here) and line.isdigit()
        # the DDP buckets are reduced during backward(), called from _train
        assert function == ("_train" if call.kind == "allreduce" else "_loop")


def test_only_cross_node_calls_are_kept(run):
    _, _, trace = run
    world = (0, 1, 2, 3)
    kept = {rank: [(c.seq, c.kind, c.group, c.peer, c.bytes, c.cross_node)
                   for c in trace.rank(rank).calls] for rank in range(WORLD)}
    assert kept == {
        0: [(0, "allreduce", world, None, 12, True)],                # 2: send to 1, same node
        1: [(0, "allreduce", world, None, 12, True),
            (2, "allreduce", (1, 2), None, 20, True),
            (4, "send", world, 2, 28, True)],
        2: [(0, "allreduce", world, None, 12, True),
            (2, "allreduce", (1, 2), None, 20, True),
            (3, "recv", world, 1, 28, True)],
        3: [(0, "allreduce", world, None, 12, True)],                # 2: recv from 2, same node
    }
    header = trace.rank(0).header
    assert header.cross_node_only and header.ranks_per_node == RANKS_PER_NODE


@pytest.mark.parametrize("runtime", ["msccl-executor", "rccl"])
def test_the_traced_loop_plans_and_every_xml_passes_the_check(run, tmp_path, runtime):
    """Trace -> plan -> deploy: the DDP loop's trace planned on a 4-GPU machine, every XML of the
    plan checked again here as `collsynth check --strict` does."""
    import json

    from collsynth.plan import PlanOptions, make_plan, write_plan
    from collsynth.plan.choose import SynthOptions
    from collsynth.plan.writer import check_xml_file
    from collsynth.resolve import resolve_topology

    _, trace, _ = run
    # 4 fully connected GPUs with physical figures (the planner's timing model needs them).
    topology = resolve_topology(str(Path(__file__).parents[1] / "plan" / "data" / "fc4-fast.json"))
    options = PlanOptions(runtime=runtime, synth=SynthOptions(time_limit=20))
    plan = make_plan(trace.directory, topology, options=options)
    out = write_plan(plan, tmp_path / "plan", plots=False)
    written = json.loads((out / "plan.json").read_text())
    files = sorted((out / "xml").glob("*.xml"))
    assert files, "the DDP allreduce should get at least one synthesized algorithm"
    kinds = {entry["collective"] for entry in written["entries"]}
    assert "allreduce" in kinds
    for xml_file in plan.xml_files:
        check_xml_file(out / "xml" / xml_file.name, runtime=runtime,
                       collective=xml_file.collective, root=xml_file.root)
    assert len(plan.xml_files) == len(files)
