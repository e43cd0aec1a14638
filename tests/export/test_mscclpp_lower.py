"""Lowering algorithms to MSCCL++ plans: every plan is proved by the plan checker, in and out of
place, Simple and LL, on one node and on two; the command line writes only checked plans.

The plan checker is the independent judge of the lowering (it is tested on its own against
MSCCL++'s plans and corruptions); the node rule and the threadblock chain are checked against
figures derived by hand below.
"""

from __future__ import annotations

import json

import pytest

from collsynth.algorithm import Algorithm, Send, Step, verify
from collsynth.algorithm.fileformat import save_algorithm
from collsynth.cli import EXIT_OK, EXIT_USAGE, main
from collsynth.collective import allgather, allreduce, broadcast
from collsynth.errors import ExportError
from collsynth.export.check import Problem
from collsynth.export.mscclpp import check_plan, parse_plan, plan_to_json, read_plan
from collsynth.export.mscclpp.checker import PlanReport
from collsynth.export.mscclpp.limits import MSCCLPP
from collsynth.export.mscclpp.lower import lower_to_plan
from collsynth.synthesis import solve_least_steps
from collsynth.topology import get_topology
from collsynth.topology.compose import compose_nodes

#: Algorithms of the export suite (tests/export/conftest.py) the executor has plans for.
SUITE = ("ring4-allgather", "ring4-reduce_scatter", "fc4-alltoall", "dgx1-allgather-3-7-6",
         "fc4-allreduce-direct", "fc4-allreduce-composed")


def ring_allreduce(n: int, topology: str | None = None) -> Algorithm:
    """The textbook ring allreduce: n - 1 reducing steps, then n - 1 copying steps."""
    rs = [Step(1, tuple(Send((r - t) % n, r, (r + 1) % n, True) for r in range(n)))
          for t in range(n - 1)]
    ag = [Step(1, tuple(Send((r + 1 - t) % n, r, (r + 1) % n) for r in range(n)))
          for t in range(n - 1)]
    topo = get_topology(topology or f"ring:{n}")
    return verify(Algorithm(f"ring{n}-allreduce", topo, allreduce(n).split(n), tuple(rs + ag)))


@pytest.fixture(scope="module")
def two_nodes() -> dict[str, Algorithm]:
    topo = compose_nodes(get_topology("ring:4"), 2, nic_units=1)
    result = solve_least_steps(topo, allgather(8))
    assert result.found
    # The ring allreduce over both nodes: ranks 3 -> 4 and 7 -> 0 cross the network.
    rs = ring_allreduce(8)
    return {"allgather": result.algorithm,
            "allreduce": verify(Algorithm("ring8x2", topo, rs.collective, rs.steps))}


def _cases(algorithms, two_nodes):
    found = {name: algorithms[name] for name in SUITE}
    found["ring8-allreduce"] = ring_allreduce(8)
    found.update({f"2nodes-{k}": v for k, v in two_nodes.items()})
    return found


@pytest.mark.parametrize("protocol", ["Simple", "LL"])
@pytest.mark.parametrize("inplace", [False, True], ids=["out-of-place", "in-place"])
def test_every_exported_plan_is_proved(algorithms, two_nodes, protocol, inplace):
    for name, algorithm in _cases(algorithms, two_nodes).items():
        plan = lower_to_plan(algorithm, protocol=protocol, inplace=inplace)
        rpn = 4 if name.startswith("2nodes") else None
        report = check_plan(plan, collective=algorithm.collective, ranks_per_node=rpn,
                            strict=True)
        assert report.ok, (name, [str(p) for p in report.problems][:3])
        assert plan.inplace is inplace and plan.protocol == protocol
        # The file reads back to the same plan.
        assert parse_plan(plan_to_json(plan), source=name) == plan
        # LL plans synchronise through packet flags only; Simple plans never use packets.
        names = {op.name for g in plan.gpus for tb in g.threadblocks for op in tb.ops}
        if protocol == "LL":
            assert not names & {"signal", "wait", "put", "pwsf"} and plan.use_double_scratch_buffer
        else:
            assert not names & {"ppkt", "rppkt", "upkt", "repkt", "cpkt"}


def test_ranks_of_one_node_use_memory_channels_and_the_others_port_channels(two_nodes):
    for algorithm in two_nodes.values():
        for protocol in ("Simple", "LL"):
            plan = lower_to_plan(algorithm, protocol=protocol)
            for gpu in plan.gpus:
                for ch in gpu.channels:
                    for peer in ch.connected_to:
                        same = peer // 4 == gpu.id // 4
                        assert ch.channel_type == ("memory" if same else "port")
            # Some rank has a port channel: the algorithms cross the network.
            assert any(ch.channel_type == "port" for g in plan.gpus for ch in g.channels)


def test_a_long_schedule_runs_in_a_chain_of_threadblocks():
    # The ring allreduce on 8 ranks has 14 steps. A rank's step is at least put, nop, signal,
    # wait, nop (5 operations), plus re and nop in the 7 reducing steps: 84 operations or more,
    # more than one threadblock of 64 holds.
    plan = lower_to_plan(ring_allreduce(8))
    for gpu in plan.gpus:
        assert len(gpu.threadblocks) >= 2
        assert all(len(tb.ops) <= MSCCLPP.max_operations_per_threadblock
                   for tb in gpu.threadblocks)
        assert gpu.semaphores == (0,) * (len(gpu.threadblocks) - 1)
        assert gpu.threadblocks[1].ops[0].name == "sem_acquire"
    assert check_plan(plan).ok


def test_an_algorithm_without_an_executor_plan_is_refused():
    result = solve_least_steps(get_topology("ring:4"), broadcast(4, 0))
    with pytest.raises(ExportError, match="has none"):
        lower_to_plan(result.algorithm)
    with pytest.raises(ExportError, match="protocol 'LL128'"):
        lower_to_plan(ring_allreduce(4), protocol="LL128")


def test_a_plan_failing_the_check_is_never_returned_or_written(monkeypatch, tmp_path, capsys):
    import collsynth.export.mscclpp.lower as lower

    failing = PlanReport(ok=False, problems=(Problem("race", "made up"),),
                         layouts_checked=(), runtime="mscclpp", collective=None, root=None)
    monkeypatch.setattr(lower, "check_plan", lambda *a, **k: failing)
    with pytest.raises(ExportError, match="race: made up"):
        lower.lower_to_plan(ring_allreduce(4))
    algo = tmp_path / "ar.json"
    save_algorithm(ring_allreduce(4), algo)
    out = tmp_path / "ar.plan.json"
    assert main(["export", str(algo), "--runtime", "mscclpp", "-o", str(out)]) != EXIT_OK
    assert not out.exists()


def test_the_command_line_exports_and_checks_a_plan(tmp_path, capsys):
    algo = tmp_path / "ar.json"
    save_algorithm(ring_allreduce(4), algo)
    out = tmp_path / "ar.plan.json"
    assert main(["export", str(algo), "--runtime", "mscclpp", "-o", str(out), "--proto", "LL",
                 "--inplace", "--max-bytes", "65536"]) == EXIT_OK
    plan = read_plan(out)
    assert plan.protocol == "LL" and plan.inplace and plan.max_message_size == 65536
    capsys.readouterr()
    assert main(["check", str(out)]) == EXIT_OK
    assert "correct allreduce for mscclpp" in capsys.readouterr().out
    assert main(["check", str(out), "--json"]) == EXIT_OK
    assert json.loads(capsys.readouterr().out)["correct"] is True
    # A broken plan (an extra wait in a Simple plan): exit 1, one problem per line.
    assert main(["export", str(algo), "--runtime", "mscclpp", "-o", str(out)]) == EXIT_OK
    data = json.loads(out.read_text())
    data["gpus"][0]["threadblocks"][0]["ops"].insert(0, {"name": "wait", "channel_ids": [0],
                                                         "channel_type": "memory"})
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps(data))
    assert main(["check", str(broken)]) == 1
    assert f"{broken}: deadlock:" in capsys.readouterr().out
    # XML-only options are refused for plans.
    assert main(["export", str(algo), "--runtime", "mscclpp", "-o", str(out),
                 "--channels", "2"]) == EXIT_USAGE


def test_a_rank_reducing_more_values_than_an_operation_holds():
    # The direct reduce-scatter on 12 ranks: each rank adds 11 received values to its own in
    # one step; an operation holds 10 sources, so the sum takes two operations (1 + 9, then
    # the accumulator + 2).
    from collsynth.collective import reduce_scatter

    n = 12
    step = Step(1, tuple(Send(d, s, d, True) for s in range(n) for d in range(n) if s != d))
    algorithm = verify(Algorithm("rs12", get_topology(f"fully-connected:{n}"),
                                 reduce_scatter(n), (step,)))
    for protocol in ("Simple", "LL"):
        plan = lower_to_plan(algorithm, protocol=protocol)
        name = "re" if protocol == "Simple" else "repkt"
        sums = [op for op in plan.gpus[0].threadblocks[0].ops if op.name == name]
        assert [len(op.src) for op in sums] == [10, 3]
        assert check_plan(plan, strict=True).ok
