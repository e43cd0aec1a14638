"""Algorithms the export tests lower, synthesized once per session, and a small executor for
programs whose postcondition the checker cannot know (custom collectives)."""

from __future__ import annotations

from collections import Counter, defaultdict, deque
from typing import Callable

import pytest

from collsynth.algorithm import Algorithm, Instance, Send, Step, sequence, verify
from collsynth.collective import (
    allgather,
    allreduce,
    alltoall,
    broadcast,
    from_conditions,
    gather,
    reduce,
    reduce_scatter,
    scatter,
)
from collsynth.export.program import RECV_OPS, SEND_OPS, Program
from collsynth.synthesis import solve_instance, solve_least_steps
from collsynth.topology import get_topology


def _least(topology: str, collective, chunks: int = 1) -> Algorithm:
    result = solve_least_steps(get_topology(topology), collective, chunks=chunks)
    assert result.found, result.summary()
    return result.algorithm


def _instance(topology: str, collective, instance: Instance) -> Algorithm:
    result = solve_instance(get_topology(topology), collective, instance)
    assert result.found, result.summary()
    return result.algorithm


def _composed_allreduce() -> Algorithm:
    rs = _instance("fully-connected:4", reduce_scatter(4), Instance(1))
    ag = _instance("fully-connected:4", allgather(4), Instance(1))
    return sequence(rs, ag, allreduce(4).split(4), name="allreduce-fc4-rs1+ag1")


def _shift() -> Algorithm:
    """A custom collective: rank r's chunk also goes to rank r+2 on a 4-ring (through a relay)."""
    collective = from_conditions("shift2", 4, 4, [(r, r) for r in range(4)],
                                 [(r, r) for r in range(4)] + [((r + 2) % 4, r) for r in range(4)])
    return _least("ring:4", collective)


#: id -> how to make the algorithm (synthesized on small topologies: fast).
CASES: dict[str, Callable[[], Algorithm]] = {
    "ring4-allgather": lambda: _least("ring:4", allgather(4)),
    "fc4-alltoall": lambda: _least("fully-connected:4", alltoall(4)),
    "dgx1-allgather-3-7-6": lambda: _instance("dgx1", allgather(8), Instance(3, 7, 6)),
    "dgx1-broadcast-root0": lambda: _least("dgx1", broadcast(8, 0), chunks=2),
    "line4-reduce-root1": lambda: _least("line:4", reduce(4, 1)),
    "ring4-reduce_scatter": lambda: _least("ring:4", reduce_scatter(4)),
    "fc4-allreduce-direct": lambda: _instance("fully-connected:4", allreduce(4), Instance(1)),
    "fc4-allreduce-composed": _composed_allreduce,
    "ring4-gather-root2": lambda: _least("ring:4", gather(4, 2), chunks=2),
    "ring4-scatter-root1": lambda: _least("ring:4", scatter(4, 1)),
    "ring4-custom-shift2": _shift,
}


@pytest.fixture(scope="session")
def algorithms() -> dict[str, Algorithm]:
    return {name: make() for name, make in CASES.items()}


def ring_allgather(n: int, chunks: int = 1) -> Algorithm:
    """The textbook one-directional ring allgather on ring:n, ``chunks`` pieces per chunk."""
    steps = tuple(
        Step(chunks, tuple(Send(((r - t) % n) * chunks + i, r, (r + 1) % n)
                           for r in range(n) for i in range(chunks)))
        for t in range(n - 1))
    return verify(Algorithm(f"ring{n}-allgather", get_topology(f"ring:{n}"),
                            allgather(n).split(chunks), steps))


def execute(program: Program) -> dict[int, dict[tuple[str, int], object]]:
    """Run ``program`` on symbolic values (input ``i[k]`` of rank ``r`` is ``Counter({(r, k):
    1})``, reductions add counters) with unbounded FIFOs; return every rank's memory.

    Only for race-free programs (the checker says so): one schedule then tells the result.
    """
    memory: dict[int, dict[tuple[str, int], object]] = {}
    tbs = {}
    for gpu in program.gpus:
        memory[gpu.id] = {("i", k): Counter({(gpu.id, k): 1}) for k in range(gpu.i_chunks)}
        for tb in gpu.threadblocks:
            tbs[(gpu.id, tb.id)] = tb
    pc = {key: 0 for key in tbs}
    published = {key: -1 for key in tbs}
    fifos: dict[tuple[int, int, int], deque] = defaultdict(deque)
    progress = True
    while progress:
        progress = False
        for (rank, tid), tb in tbs.items():
            while pc[(rank, tid)] < len(tb.steps):
                step = tb.steps[pc[(rank, tid)]]
                if step.depid >= 0 and published[(rank, step.depid)] < step.deps:
                    break
                incoming = None
                if step.type in RECV_OPS:
                    fifo = fifos[(tb.recv, rank, tb.chan)]
                    if not fifo:
                        break
                    incoming = fifo.popleft()
                mem = memory[rank]
                src, dst = (step.srcbuf, step.srcoff), (step.dstbuf, step.dstoff)
                out = None
                if step.type == "s":
                    out = mem[src]
                elif step.type == "r":
                    mem[dst] = incoming
                elif step.type == "rrc":
                    mem[dst] = incoming + mem[src]
                elif step.type == "cpy":
                    mem[dst] = mem[src]
                elif step.type == "re":
                    mem[dst] = mem[dst] + mem[src]
                elif step.type != "nop":
                    raise AssertionError(f"executor does not know {step.type}")
                if step.type in SEND_OPS:
                    fifos[(rank, tb.send, tb.chan)].append(out)
                if step.hasdep:
                    published[(rank, tid)] = step.s
                pc[(rank, tid)] += 1
                progress = True
    stuck = [key for key in tbs if pc[key] < len(tbs[key].steps)]
    assert not stuck, f"threadblocks never finish: {stuck}"
    return memory


def pytest_generate_tests(metafunc) -> None:
    """A test with a ``case`` argument runs once per entry of :data:`CASES`."""
    if "case" in metafunc.fixturenames:
        metafunc.parametrize("case", list(CASES))


@pytest.fixture(name="ring_allgather")
def _ring_allgather_fixture() -> Callable[..., Algorithm]:
    return ring_allgather


@pytest.fixture(name="execute")
def _execute_fixture() -> Callable[[Program], dict]:
    return execute
