"""Export at scale: mid-size algorithms (32-64 ranks, thousands of sends) export, pass the
checker and re-read; a 64-rank direct allgather is refused at once with the limits it exceeds."""

from __future__ import annotations

import importlib

import pytest

from collsynth.algorithm import Algorithm, Send, Step, verify
from collsynth.export.pipeline import export_algorithm
from collsynth.collective import allgather
from collsynth.errors import ExportError, VerificationError
from collsynth.export import check_program, lower, read_program, write_program
from collsynth.export.limits import PER_CHANNEL, estimate_limits, find_limit_violations
from collsynth.export.stats import program_stats
from collsynth.runtimes import MSCCL_XML, runtime_names
from collsynth.resolve import resolve_topology
from collsynth.topology import get_topology

GPUS_PER_NODE = 8


def _with_rounds(name: str, topology, collective, steps: list[list[Send]]) -> Algorithm:
    """The algorithm with the fewest rounds per step (doubling) that verifies."""
    rounds = 1
    while True:
        algorithm = Algorithm(name, topology, collective,
                              tuple(Step(rounds, tuple(sends)) for sends in steps))
        try:
            return verify(algorithm)
        except VerificationError:
            if rounds > 4096:
                raise
            rounds *= 2


def direct_allgather(nodes: int, chunks: int = 1) -> Algorithm:
    """Every rank sends each piece of its chunk straight to every other rank, in one step."""
    topology = resolve_topology("dgx-a100", nodes=nodes)
    n = topology.num_ranks
    sends = [Send(r * chunks + i, r, d) for r in range(n) for d in range(n) if d != r
             for i in range(chunks)]
    return _with_rounds(f"direct-ag{n}", topology, allgather(n).split(chunks), [sends])


def hierarchical_allgather(nodes: int) -> Algorithm:
    """Within nodes, then between same-index GPUs of all nodes (forwarding the node's chunks),
    then within nodes again (forwarding what came from other nodes): relays, dependencies."""
    g = GPUS_PER_NODE
    topology = resolve_topology("dgx-a100", nodes=nodes)
    n = topology.num_ranks

    def peers(r: int) -> list[int]:
        return [r // g * g + i for i in range(g) if r // g * g + i != r]

    inside = [Send(r, r, p) for r in range(n) for p in peers(r)]
    across = [Send(q, r, k * g + r % g) for r in range(n) for k in range(nodes) if k != r // g
              for q in range(r // g * g, r // g * g + g)]
    forward = [Send(k * g + r % g, r, p) for r in range(n) for p in peers(r)
               for k in range(nodes) if k != r // g]
    return _with_rounds(f"hier-ag{n}", topology, allgather(n), [inside, across, forward])


@pytest.fixture(scope="module")
def mid_size() -> dict[str, Algorithm]:
    return {"direct32x4": direct_allgather(4, chunks=4), "hier64": hierarchical_allgather(8)}


@pytest.mark.parametrize("name, runtime", [
    *(("direct32x4", runtime) for runtime in runtime_names(MSCCL_XML)),
    ("hier64", "msccl"), ("hier64", "rccl")])   # with and without fused ops
def test_a_mid_size_algorithm_exports_checks_and_rereads(mid_size, name, runtime, tmp_path):
    algorithm = mid_size[name]
    assert algorithm.num_sends > 3000
    path = tmp_path / f"{name}.{runtime}.xml"
    program = export_algorithm(algorithm, path, runtime=runtime)
    assert program.ngpus == algorithm.topology.num_ranks
    assert find_limit_violations(program, runtime) == []
    text = path.read_text()
    again = read_program(text, runtime=runtime)
    assert again == program
    assert write_program(again, runtime) == text
    report = check_program(again, runtime=runtime, collective="allgather", strict=True)
    assert report.ok, report.problems[:3]


def test_a_64_rank_direct_allgather_is_refused_with_amounts(monkeypatch):
    algorithm = direct_allgather(8)
    assert algorithm.num_sends == 64 * 63
    for runtime in runtime_names(MSCCL_XML):
        violations = estimate_limits(algorithm, runtime, channels=4)
        # Rank r's chunk travels on channel r % 4 to its 63 peers: one threadblock each.
        sending = [v for v in violations if v.what.startswith("sending")]
        assert [(v.limit, v.allowed, v.actual, v.excess, v.places) for v in sending] == \
            [(PER_CHANNEL, 32, 63, 31, 64)]
        with pytest.raises(ExportError, match="rank 0 on channel 0 needs 63 "):
            lower(algorithm, runtime=runtime, channels=4)
    # The exact check of the lowered program finds the same.
    monkeypatch.setattr(importlib.import_module("collsynth.export.lower"), "estimate_limits",
                        lambda *args, **options: [])
    with pytest.raises(ExportError) as info:
        lower(algorithm, runtime="msccl-executor", channels=4)
    (exact,) = [v for v in info.value.violations if v.what.startswith("sending")]
    assert (exact.actual, exact.where, exact.lower_bound) == (63, "rank 0 on channel 0", False)


def test_long_runs_of_messages_are_split_at_the_cnt_limit():
    # 100 consecutive pieces from rank 0 to rank 1 in one step: cnt 71 + 29 (cnt < 72).
    pieces = 100
    steps = (Step(pieces, tuple(Send(i, 0, 1) for i in range(pieces))),
             Step(pieces, tuple(Send(pieces + i, 1, 0) for i in range(pieces))))
    algorithm = verify(Algorithm("pairs", get_topology("fully-connected:2"),
                                 allgather(2).split(pieces), steps))
    for runtime in runtime_names(MSCCL_XML):
        # In place: no local copies of the own 100 pieces (rccl allows 64 steps).
        program = lower(algorithm, runtime=runtime, inplace=True, outofplace=False)
        counts = sorted(s.cnt for g in program.gpus for tb in g.threadblocks for s in tb.steps
                        if s.type == "s")
        assert counts == [29, 29, 71, 71]
        assert check_program(program, runtime=runtime, collective="allgather").ok
        assert program_stats(program).figures is not None
        assert find_limit_violations(program, runtime) == []
