"""The checker against programs collsynth lowers itself, correct and corrupted.

Small algorithms (built by hand on ring:4 and fully-connected:4, or synthesized on the DGX-1)
are lowered for every runtime and must pass :func:`check_program`. Each corruption then edits
one program (its :class:`Program` value, or its XML text) and must be refused with the right
problem kind and a message naming what is wrong. The expected messages come from the edit and
from the algorithm's meaning (which rank holds which contributions when), not from the checker.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Callable, Iterator

import pytest

from collsynth.algorithm import Algorithm, Instance, Send, Step, verify
from collsynth.collective import allgather, allreduce, alltoall, broadcast, reduce_scatter
from collsynth.errors import VerificationError
from collsynth.export.check import PROBLEM_KINDS, CheckReport, Problem, check_program
from collsynth.export.lower import lower
from collsynth.export.program import RECV_OPS, SEND_OPS, Program, XmlStep
from collsynth.runtimes import MSCCL_XML, runtime_names, xml_dialect
from collsynth.export.xml_reader import read_checked
from collsynth.export.xml_writer import write_program
from collsynth.synthesis import solve_instance, solve_least_steps
from collsynth.topology import get_topology

RUNTIMES = tuple(runtime_names(MSCCL_XML))
N = 4


# -- algorithms ------------------------------------------------------------------------------------


def ring_allgather() -> Algorithm:
    """Rank r forwards chunk r - t to r + 1 in step t (one direction of ring:4)."""
    steps = tuple(Step(1, tuple(Send((r - t) % N, r, (r + 1) % N) for r in range(N)))
                  for t in range(N - 1))
    return verify(Algorithm("ring4-ag", get_topology("ring:4"), allgather(N), steps))


def _ring_reduce_steps() -> list[Step]:
    # Chunk c starts at rank c + 1 and is summed along c + 1 -> c + 2 -> ... -> c.
    return [Step(1, tuple(Send((r - 1 - t) % N, r, (r + 1) % N, reduce=True) for r in range(N)))
            for t in range(N - 1)]


def ring_reduce_scatter() -> Algorithm:
    return verify(Algorithm("ring4-rs", get_topology("ring:4"), reduce_scatter(N),
                            tuple(_ring_reduce_steps())))


def ring_allreduce() -> Algorithm:
    """The ring reduce-scatter, then the ring allgather of the sums (chunk c is complete on c)."""
    gather = [Step(1, tuple(Send((r - t) % N, r, (r + 1) % N) for r in range(N)))
              for t in range(N - 1)]
    return verify(Algorithm("ring4-ar", get_topology("ring:4"), allreduce(N).split(N),
                            tuple(_ring_reduce_steps() + gather)))


def direct_allreduce() -> Algorithm:
    """Every rank sends its part c to rank c, which sums and sends the sum to everyone."""
    rs = Step(1, tuple(Send(c, q, c, reduce=True) for c in range(N) for q in range(N) if q != c))
    ag = Step(1, tuple(Send(c, c, q) for c in range(N) for q in range(N) if q != c))
    return verify(Algorithm("fc4-ar", get_topology("fully-connected:4"), allreduce(N).split(N),
                            (rs, ag)))


def direct_alltoall() -> Algorithm:
    sends = tuple(Send(p * N + q, p, q) for p in range(N) for q in range(N) if p != q)
    return verify(Algorithm("fc4-a2a", get_topology("fully-connected:4"), alltoall(N),
                            (Step(1, sends),)))


def ring_broadcast() -> Algorithm:
    """Root 1 sends to 0 and 2, then 2 forwards to 3."""
    steps = (Step(1, (Send(0, 1, 0), Send(0, 1, 2))), Step(1, (Send(0, 2, 3),)))
    return verify(Algorithm("ring4-bc", get_topology("ring:4"), broadcast(N, 1), steps))


def _synthesized(result) -> Algorithm:
    assert result.found, result.summary()
    return result.algorithm


OOP, IP, BOTH = "out-of-place", "in-place", "both"
#: name -> (how to make it, the layouts to lower it for; "both": one program declared for
#: in-place and out-of-place calls, which msccl cannot declare).
ALGORITHMS: dict[str, tuple[Callable[[], Algorithm], tuple[str, ...]]] = {
    "ring4-allgather": (ring_allgather, (OOP, IP, BOTH)),
    "ring4-reduce_scatter": (ring_reduce_scatter, (OOP, IP)),
    "ring4-allreduce": (ring_allreduce, (OOP, IP, BOTH)),
    "fc4-allreduce": (direct_allreduce, (OOP, IP, BOTH)),
    "fc4-alltoall": (direct_alltoall, (OOP,)),
    "ring4-broadcast-root1": (ring_broadcast, (OOP, IP)),
    "dgx1-allgather-synth": (lambda: _synthesized(solve_instance(
        get_topology("dgx1"), allgather(8), Instance(2))), (OOP,)),
    "dgx1-broadcast-synth": (lambda: _synthesized(solve_least_steps(
        get_topology("dgx1"), broadcast(8, 0), chunks=2)), (OOP, IP)),
}


@pytest.fixture(scope="module")
def algorithms() -> dict[str, Algorithm]:
    return {name: make() for name, (make, _) in ALGORITHMS.items()}


def program_of(algorithms, name: str, runtime: str, *, inplace: bool = False,
               outofplace: bool | None = None) -> Program:
    return lower(algorithms[name], runtime=runtime, inplace=inplace,
                 outofplace=not inplace if outofplace is None else outofplace)


def check(program: Program, runtime: str) -> CheckReport:
    """The exporter's check: strict, the postcondition of the program's own collective."""
    return check_program(program, runtime=runtime, strict=True)


def _cases() -> Iterator[tuple[str, str, str]]:
    for name, (_, layouts) in ALGORITHMS.items():
        for runtime in RUNTIMES:
            for layout in layouts:
                if not (layout == BOTH and runtime == "msccl"):
                    yield name, runtime, layout


# -- editing programs ------------------------------------------------------------------------------


def steps(program: Program) -> Iterator[tuple[int, int, int, XmlStep]]:
    """Every step as (rank, tb id, position, step)."""
    for gpu in program.gpus:
        for tb in gpu.threadblocks:
            for pos, st in enumerate(tb.steps):
                yield gpu.id, tb.id, pos, st


def tb_of(program: Program, rank: int, tid: int):
    gpu = next(g for g in program.gpus if g.id == rank)
    return next(tb for tb in gpu.threadblocks if tb.id == tid)


def _with_gpu(program: Program, rank: int, change) -> Program:
    gpus = tuple(change(g) if g.id == rank else g for g in program.gpus)
    return dataclasses.replace(program, gpus=gpus)


def set_tb(program: Program, rank: int, tid: int, **changes) -> Program:
    return _with_gpu(program, rank, lambda g: dataclasses.replace(g, threadblocks=tuple(
        dataclasses.replace(tb, **changes) if tb.id == tid else tb for tb in g.threadblocks)))


def set_step(program: Program, rank: int, tid: int, pos: int, **changes) -> Program:
    old = tb_of(program, rank, tid).steps
    new = old[:pos] + (dataclasses.replace(old[pos], **changes),) + old[pos + 1:]
    return set_tb(program, rank, tid, steps=new)


def replace_step(program: Program, rank: int, tid: int, pos: int,
                 new: list[XmlStep]) -> Program:
    """Replace step ``pos`` of a tb by ``new`` (empty: remove it), keeping every dependency.

    Positions after it shift, so the other tbs' ``deps`` naming this tb shift too; what waited
    for the replaced step waits for the last new step (for the step before, when removed).
    The first new step keeps the replaced step's own wait; the last publishes what it did.
    """
    old = tb_of(program, rank, tid).steps
    replaced = old[pos]
    new = list(new)
    delta = len(new) - 1
    if new:
        if new[0].depid < 0:
            new[0] = dataclasses.replace(new[0], depid=replaced.depid, deps=replaced.deps)
        new[-1] = dataclasses.replace(new[-1], hasdep=max(new[-1].hasdep, replaced.hasdep))
    mine = list(old[:pos]) + new + list(old[pos + 1:])
    if not new and replaced.hasdep and pos > 0:
        mine[pos - 1] = dataclasses.replace(mine[pos - 1], hasdep=1)
    if not new and replaced.depid >= 0 and pos < len(mine) and mine[pos].depid < 0:
        mine[pos] = dataclasses.replace(mine[pos], depid=replaced.depid, deps=replaced.deps)

    def shifted(st: XmlStep) -> XmlStep:
        if st.depid != tid or st.deps < pos:
            return st
        deps = st.deps + delta
        return dataclasses.replace(st, deps=deps) if deps >= 0 else \
            dataclasses.replace(st, depid=-1, deps=-1)

    def change(gpu):
        tbs = []
        for tb in gpu.threadblocks:
            seq = mine if tb.id == tid else [shifted(st) for st in tb.steps]
            tbs.append(dataclasses.replace(tb, steps=tuple(
                dataclasses.replace(st, s=i) for i, st in enumerate(seq))))
        return dataclasses.replace(gpu, threadblocks=tuple(tbs))

    return _with_gpu(program, rank, change)


def add_scratch(program: Program, rank: int) -> tuple[Program, int]:
    """One more scratch chunk on ``rank``; returns the program and the new chunk's index."""
    gpu = next(g for g in program.gpus if g.id == rank)
    return _with_gpu(program, rank, lambda g: dataclasses.replace(
        g, s_chunks=g.s_chunks + 1)), gpu.s_chunks


def partner(program: Program, rank: int, tid: int, pos: int) -> tuple[int, int, int]:
    """The step at the other end of a send or receive: the k-th send on a connection meets the
    k-th receive of it (the FIFO rule of the runtimes)."""
    tb = tb_of(program, rank, tid)
    receives = tb.steps[pos].type in RECV_OPS
    mine, theirs = (RECV_OPS, SEND_OPS) if receives else (SEND_OPS, RECV_OPS)
    peer, their_side = (tb.recv, "send") if receives else (tb.send, "recv")
    k = sum(1 for st in tb.steps[:pos] if st.type in mine)
    peer_tb = next(t for t in next(g for g in program.gpus if g.id == peer).threadblocks
                   if getattr(t, their_side) == rank and t.chan == tb.chan)
    found = [p for p, st in enumerate(peer_tb.steps) if st.type in theirs]
    return peer, peer_tb.id, found[k]


def accumulate(program: Program, runtime: str, rank: int, tid: int, pos: int,
               local: tuple[str, int] | None = None) -> Program:
    """Make a receive add the message to ``local`` (default: the slot it overwrote) instead of
    replacing it: ``rrc`` where the runtime has fused ops, ``r`` + ``re`` on rccl."""
    st = tb_of(program, rank, tid).steps[pos]
    assert st.type == "r"
    buf, off = local if local is not None else (st.dstbuf, st.dstoff)
    if xml_dialect(runtime).fused_ops:
        return set_step(program, rank, tid, pos, type="rrc", srcbuf=buf, srcoff=off)
    if (buf, off) == (st.dstbuf, st.dstoff):
        program, slot = add_scratch(program, rank)
        receive = dataclasses.replace(st, dstbuf="s", dstoff=slot, srcbuf="s", srcoff=slot,
                                      hasdep=0)
        add = XmlStep(0, "re", "s", slot, st.dstbuf, st.dstoff, st.cnt)
    else:
        receive = dataclasses.replace(st, hasdep=0)
        add = XmlStep(0, "re", buf, off, st.dstbuf, st.dstoff, st.cnt)
    return replace_step(program, rank, tid, pos, [receive, add])


def problems_of(report: CheckReport, kind: str) -> list[Problem]:
    return [p for p in report.problems if p.kind == kind]


def assert_rejected(report: CheckReport, kind: str, *fragments: str) -> None:
    """Some problem of ``kind`` contains every fragment."""
    assert kind in PROBLEM_KINDS
    assert not report.ok
    matching = [p for p in problems_of(report, kind) if all(f in p.message for f in fragments)]
    assert matching, (f"no {kind} problem with {fragments!r} among:\n"
                      + "\n".join(str(p) for p in report.problems[:20]))


# -- correct programs are accepted -----------------------------------------------------------------


@pytest.mark.parametrize("name, runtime, layout", list(_cases()))
def test_lowered_programs_are_accepted(algorithms, name, runtime, layout):
    program = program_of(algorithms, name, runtime, inplace=layout != OOP,
                         outofplace=layout != IP)
    report = check(program, runtime)
    assert report.ok, "\n".join(map(str, report.problems[:10]))
    assert not report.warnings
    assert report.layouts_checked == ((IP, OOP) if layout == BOTH else (layout,))
    assert report.collective == algorithms[name].collective.name
    # The same through the XML text, as `collsynth check` reads it.
    read, reader_problems = read_checked(write_program(program, runtime), runtime)
    assert read is not None and not reader_problems
    assert check(read, runtime).ok


def _through_scratch(program: Program, rank: int, tid: int, pos: int) -> Program:
    """The same step computed in a new scratch chunk and copied to its destination."""
    st = tb_of(program, rank, tid).steps[pos]
    program, slot = add_scratch(program, rank)
    quiet = {"depid": -1, "deps": -1, "hasdep": 0}
    home = XmlStep(0, "cpy", "s", slot, st.dstbuf, st.dstoff, st.cnt)
    if st.type == "re":
        new = [XmlStep(0, "cpy", st.dstbuf, st.dstoff, "s", slot, st.cnt),
               dataclasses.replace(st, dstbuf="s", dstoff=slot, **quiet), home]
    else:
        new = [dataclasses.replace(st, dstbuf="s", dstoff=slot, hasdep=0), home]
    return replace_step(program, rank, tid, pos, new)


def test_editing_helpers_keep_a_program_correct(algorithms):
    """The editing helpers move steps without changing what a program does: a step replaced
    by itself is the same program; a step that other tbs wait for, computed in scratch and
    copied home (the tb's later positions shift), still passes the check."""
    for runtime in RUNTIMES:
        program = program_of(algorithms, "fc4-allreduce", runtime)
        for rank, tid, pos, st in list(steps(program)):
            assert replace_step(program, rank, tid, pos, [st]) == program
        waited = [(rank, tid, pos) for rank, tid, pos, st in steps(program)
                  if st.hasdep and st.depid >= 0 and st.type in ("r", "rrc", "re")]
        assert waited
        for rank, tid, pos in waited:
            moved = _through_scratch(program, rank, tid, pos)
            assert moved != program
            report = check(moved, runtime)
            assert report.ok, "\n".join(map(str, report.problems))


# -- a contribution counted twice ------------------------------------------------------------------


def _final_receives(program: Program, rank: int) -> list[tuple[int, int, int, XmlStep]]:
    """The receives of ``rank`` that bring a finished sum into its buffer (not into scratch)."""
    return [x for x in steps(program) if x[0] == rank and x[3].type == "r" and x[3].dstbuf != "s"]


@pytest.mark.parametrize("index", range(N - 1))
@pytest.mark.parametrize("rank", range(N))
@pytest.mark.parametrize("runtime", RUNTIMES)
@pytest.mark.parametrize("name", ["ring4-allreduce", "fc4-allreduce"])
def test_in_place_allreduce_counting_a_contribution_twice_is_refused(algorithms, name, runtime,
                                                                     rank, index):
    """In these allreduces a rank receives each sum it does not compute itself, n - 1 of them,
    into its own slot of that chunk. Until then the slot holds the rank's own input or a
    partial sum that includes it (ring: the rank added its part on the way). A receive that
    adds the message to the slot instead of overwriting it counts the rank's own contribution
    twice: 4 ranks x 3 receives = 12 programs per algorithm and runtime, each refused."""
    program = program_of(algorithms, name, runtime, inplace=True)
    finals = _final_receives(program, rank)
    assert len(finals) == N - 1
    _, tid, pos, st = finals[index]
    assert st.cnt == 1 and st.dstbuf == "i"  # in place, i[k] is o[k] for an allreduce
    k = st.dstoff
    report = check(accumulate(program, runtime, rank, tid, pos), runtime)
    assert {p.kind for p in report.problems} == {"postcondition"}, report.problems
    assert_rejected(report, "postcondition",
                    f"contribution x({rank},{k}) counted twice at rank {rank} o[{k}]")


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_out_of_place_receive_that_adds_the_own_part_again(algorithms, runtime):
    """Out of place the input is never written. A receive of rank q into o[k] that also adds
    i[k] = x(q,k) adds q's part of chunk k a second time: to the final value (a receive of
    the sum) or to a partial sum that becomes the sum every rank receives. Either way rank q
    ends with x(q,k) counted twice."""
    program = program_of(algorithms, "ring4-allreduce", runtime)
    tried = 0
    for rank in range(N):
        for _, tid, pos, st in _final_receives(program, rank):
            assert st.dstbuf == "o" and st.cnt == 1
            k = st.dstoff
            report = check(accumulate(program, runtime, rank, tid, pos, ("i", k)), runtime)
            assert {p.kind for p in report.problems} == {"postcondition"}, report.problems
            assert_rejected(report, "postcondition",
                            f"contribution x({rank},{k}) counted twice at rank {rank} o[{k}]")
            tried += 1
    assert tried >= N * (N - 1)


# -- one corruption each ---------------------------------------------------------------------------


def _first_own_reduce(program: Program, rank: int) -> tuple[int, int, XmlStep]:
    """The first reduction of ``rank`` whose local operand is its own input (``rrc`` or, on
    rccl, the ``re`` after the receive): (tb, position, step)."""
    for r, tid, pos, st in steps(program):
        if r == rank and st.type in ("rrc", "re") and st.srcbuf == "i":
            return tid, pos, st
    raise AssertionError(f"rank {rank} has no reduction of its own input")


def dropped_reduce(algorithms, runtime):
    """Ring reduce-scatter: rank 1 first adds its part of chunk 3 to the partial sum from rank
    0 (chunk 3 starts on rank 0 and ends on rank 3). Without the addition, x(1,3) is missing
    from rank 3's result."""
    program = program_of(algorithms, "ring4-reduce_scatter", runtime)
    tid, pos, st = _first_own_reduce(program, 1)
    assert st.srcoff == 3
    if st.type == "rrc":
        program = set_step(program, 1, tid, pos, type="r", srcbuf=st.dstbuf, srcoff=st.dstoff)
    else:
        program = replace_step(program, 1, tid, pos, [])
    return program, "postcondition", ["rank 3 o[0] lacks x(1,3)"], {"postcondition"}


def reduced_wrong_offset(algorithms, runtime):
    """The same reduction adds rank 1's part of chunk 0 instead of chunk 3."""
    program = program_of(algorithms, "ring4-reduce_scatter", runtime)
    tid, pos, st = _first_own_reduce(program, 1)
    program = set_step(program, 1, tid, pos, srcoff=0)
    return program, "postcondition", ["rank 3 o[0] lacks x(1,3); rank 3 o[0] has unexpected "
                                      "x(1,0)"], {"postcondition"}


def _last_hop(program: Program, rank: int) -> tuple[int, int, XmlStep]:
    """Ring allgather: the last receive of ``rank`` (chunk rank + 1, which it does not
    forward)."""
    found = [(tid, pos, st) for r, tid, pos, st in steps(program) if r == rank and st.type == "r"]
    return found[-1]


def dropped_pair(algorithms, runtime):
    """Ring allgather: chunk 3 reaches rank 2 last (3 -> 0 -> 1 -> 2). Without that send and
    its receive, rank 2's o[3] is never written."""
    program = program_of(algorithms, "ring4-allgather", runtime)
    tid, pos, st = _last_hop(program, 2)
    assert st.dstoff == 3
    sender = partner(program, 2, tid, pos)
    assert sender[0] == 1
    program = replace_step(program, *sender, [])
    program = replace_step(program, 2, tid, pos, [])
    return program, "postcondition", ["rank 2 o[3] holds garbage", "expected x(3,0)"], \
        {"postcondition"}


def wrong_peer(algorithms, runtime):
    """Ring allgather (one direction): rank 0's tb sends to rank 2 instead of rank 1."""
    program = program_of(algorithms, "ring4-allgather", runtime)
    tb = next(tb for tb in next(g for g in program.gpus if g.id == 0).threadblocks
              if tb.send == 1)
    program = set_tb(program, 0, tb.id, send=2)
    c = tb.chan
    return program, "connection", [
        f"rank 0 tb {tb.id} sends to rank 2 on channel {c}, but rank 2 has no tb receiving "
        f"from rank 0 on channel {c}",
    ], None


def wrong_peer_receiver(algorithms, runtime):
    """The other end of the same connection: rank 1's tb receives from rank 3 instead of 0."""
    program = program_of(algorithms, "ring4-allgather", runtime)
    tb = next(t for t in next(g for g in program.gpus if g.id == 1).threadblocks if t.recv == 0)
    program = set_tb(program, 1, tb.id, recv=3)
    c = tb.chan
    return program, "connection", [
        f"rank 1 tb {tb.id} receives from rank 3 on channel {c}, but rank 3 has no tb sending "
        f"to rank 1 on channel {c}"], None


def alltoall_wrong_source(algorithms, runtime):
    """Alltoall: rank 1 sends its i[2] (meant for rank 2) where i[0] (meant for rank 0) should
    go: rank 0's o[1] holds x(1,2) instead of x(1,0)."""
    program = program_of(algorithms, "fc4-alltoall", runtime)
    tid, pos = next((tid, pos) for r, tid, pos, st in steps(program)
                    if r == 1 and st.type == "s" and tb_of(program, 1, tid).send == 0)
    assert tb_of(program, 1, tid).steps[pos].srcoff == 0
    program = set_step(program, 1, tid, pos, srcoff=2)
    return program, "postcondition", ["rank 0 o[1] holds x(1,2), expected x(1,0)"], \
        {"postcondition"}


def alltoall_wrong_buffer(algorithms, runtime):
    """Alltoall: rank 0 receives rank 1's chunk into i[1] instead of o[1]: the caller's input is
    written, and o[1] never is."""
    program = program_of(algorithms, "fc4-alltoall", runtime)
    tid, pos = next((tid, pos) for r, tid, pos, st in steps(program)
                    if r == 0 and st.type == "r" and tb_of(program, 0, tid).recv == 1)
    program = set_step(program, 0, tid, pos, dstbuf="i")
    return program, "send-buffer-write", [
        f"rank 0 tb {tid} step {pos} writes i[1]: an out-of-place call must not change the "
        "caller's input buffer"], {"send-buffer-write", "postcondition"}


def _first_wait(program: Program) -> tuple[int, int, int, XmlStep]:
    """The first step that waits for a step of another tb which itself waits for nothing (so
    that wait is the only thing ordering the two tbs)."""
    for rank, tid, pos, st in steps(program):
        if st.depid < 0 or st.type == "nop" or (pos and tb_of(program, rank, tid).steps[
                pos - 1].type == "nop"):
            continue
        target = tb_of(program, rank, st.depid).steps
        if all(s_.depid < 0 for s_ in target[:st.deps + 1]):
            return rank, tid, pos, st
    raise AssertionError("no such dependency")


def removed_dependency(algorithms, runtime):
    """fc4 allreduce: rank 0 sums chunk 0 in three tbs, into one slot; the second waits for
    the first, which waits for nothing. Without that wait the two write the slot unordered."""
    program = program_of(algorithms, "fc4-allreduce", runtime)
    rank, tid, pos, st = _first_wait(program)
    program = set_step(program, rank, tid, pos, depid=-1, deps=-1)
    return program, "race", [f"rank {rank}: tb ", f"tb {tid} step {pos}", f"tb {st.depid} step ",
                             "with no dependency or message ordering them"], None


def mismatched_cnt(algorithms, runtime):
    """Alltoall: rank 1 sends 2 chunks (i[0..2)) where rank 0 receives 1."""
    program = program_of(algorithms, "fc4-alltoall", runtime)
    tid, pos = next((tid, pos) for r, tid, pos, st in steps(program)
                    if r == 1 and st.type == "s" and tb_of(program, 1, tid).send == 0)
    receiver = partner(program, 1, tid, pos)
    program = set_step(program, 1, tid, pos, cnt=2)
    return program, "message", [
        f"rank 0 tb {receiver[1]} step {receiver[2]} receives cnt=1 but the matching send, "
        f"rank 1 tb {tid} step {pos}, has cnt=2"], None


def dropped_receive(algorithms, runtime):
    """Ring allgather: rank 2 misses its last receive; rank 1's last send stays in the FIFO."""
    program = program_of(algorithms, "ring4-allgather", runtime)
    tid, pos, _ = _last_hop(program, 2)
    sender = partner(program, 2, tid, pos)
    c = tb_of(program, 2, tid).chan
    program = replace_step(program, 2, tid, pos, [])
    return program, "message", [
        f"1 message(s) from rank 1 to rank 2 on channel {c} are never received (first: rank 1 "
        f"tb {sender[1]} step {sender[2]})"], None


def dropped_send(algorithms, runtime):
    """Ring allgather: rank 1 never sends chunk 3 to rank 2, which waits for it forever."""
    program = program_of(algorithms, "ring4-allgather", runtime)
    tid, pos, _ = _last_hop(program, 2)
    sender = partner(program, 2, tid, pos)
    c = tb_of(program, 2, tid).chan
    program = replace_step(program, *sender, [])
    return program, "deadlock", [f"rank 2 tb {tid} step {pos}",
                                 f"waits for a message from rank 1 on channel {c}"], None


CORRUPTIONS: dict[str, Callable] = {
    "missing contribution: dropped reduce": dropped_reduce,
    "missing contribution: dropped send/recv pair": dropped_pair,
    "misplaced contribution: wrong offset": reduced_wrong_offset,
    "misplaced contribution: wrong source offset": alltoall_wrong_source,
    "misplaced contribution: wrong buffer": alltoall_wrong_buffer,
    "wrong peer (sender)": wrong_peer,
    "wrong peer (receiver)": wrong_peer_receiver,
    "race: removed dependency": removed_dependency,
    "mismatched send/recv: cnt": mismatched_cnt,
    "mismatched send/recv: dropped receive": dropped_receive,
    "mismatched send/recv: dropped send": dropped_send,
}


@pytest.mark.parametrize("runtime", RUNTIMES)
@pytest.mark.parametrize("name", sorted(CORRUPTIONS))
def test_corruption_is_refused(algorithms, name, runtime):
    program, kind, fragments, kinds = CORRUPTIONS[name](algorithms, runtime)
    report = check(program, runtime)
    assert_rejected(report, kind, *fragments)
    if kinds is not None:  # nothing else is wrong with it
        assert {p.kind for p in report.problems} == kinds, report.problems


# -- wrong algorithms, lowered as they are ---------------------------------------------------------


def _direct_allreduce_variant(rs_sends, extra: tuple[Send, ...] = ()) -> Algorithm:
    ag = Step(1, tuple(Send(c, c, q) for c in range(N) for q in range(N) if q != c))
    middle = (Step(1, extra),) if extra else ()
    return Algorithm("fc4-ar-wrong", get_topology("fully-connected:4"), allreduce(N).split(N),
                     (Step(1, tuple(rs_sends)), *middle, ag))


def _rs_sends() -> list[Send]:
    return [Send(c, q, c, reduce=True) for c in range(N) for q in range(N) if q != c]


#: name -> (algorithm, problem message fragment at rank q)
WRONG_ALGORITHMS = {
    # Rank 2 never sends its part of chunk 0 to rank 0, which sums chunk 0 for everyone.
    "send/recv pair missing": (
        lambda: _direct_allreduce_variant([s for s in _rs_sends() if (s.chunk, s.src) != (0, 2)]),
        "rank {q} o[0] lacks x(2,0)"),
    # Rank 2 sends its part of chunk 0 to rank 0 twice; rank 0 adds it twice.
    "chunk reduced twice": (
        lambda: _direct_allreduce_variant(_rs_sends(), (Send(0, 2, 0, reduce=True),)),
        "contribution x(2,0) counted twice at rank {q} o[0]"),
}


@pytest.mark.parametrize("inplace", [False, True])
@pytest.mark.parametrize("runtime", RUNTIMES)
@pytest.mark.parametrize("name", sorted(WRONG_ALGORITHMS))
def test_lowered_wrong_algorithm_is_refused(monkeypatch, name, runtime, inplace):
    """The lowering turns each send into a send/receive pair with the dependencies it needs, so
    these programs are well formed and race free: only the sums are wrong, on every rank."""
    make, fragment = WRONG_ALGORITHMS[name]
    algorithm = make()
    with pytest.raises(VerificationError):
        verify(algorithm)
    # The module (collsynth.export re-exports the function under the same name).
    lowering = importlib.import_module("collsynth.export.lower")
    monkeypatch.setattr(lowering, "verify", lambda algorithm, **_: algorithm)
    program = lower(algorithm, runtime=runtime, inplace=inplace, outofplace=not inplace)
    report = check(program, runtime)
    assert {p.kind for p in report.problems} == {"postcondition"}, report.problems
    for q in range(N):
        assert_rejected(report, "postcondition", fragment.format(q=q))


# -- corruptions of the XML text -------------------------------------------------------------------


def _line_of(text: str, needle: str, occurrence: int) -> int:
    lines = [i for i, line in enumerate(text.splitlines(), 1) if needle in line]
    return lines[occurrence]


@pytest.mark.parametrize("runtime", ["msccl", "msccl-executor"])
def test_text_receive_turned_into_reduction_points_at_its_line(algorithms, runtime):
    """In the XML of the in-place ring allreduce, rank 3's last receive (chunk 0, whose sum
    rank 3 forwarded as a partial with its own part in it) made an rrc: the problem names
    the double count and the line of that step."""
    program = program_of(algorithms, "ring4-allreduce", runtime, inplace=True)
    text = write_program(program, runtime)
    lines = text.splitlines()
    gpu3 = _line_of(text, '<gpu id="3"', 0)
    last = max(i for i, line in enumerate(lines, 1) if i > gpu3 and 'type="r"' in line)
    assert 'dstoff="0"' in lines[last - 1]
    lines[last - 1] = lines[last - 1].replace('type="r" srcbuf="i" srcoff="0"',
                                              'type="rrc" srcbuf="i" srcoff="0"')
    program, reader = read_checked("\n".join(lines) + "\n", runtime)
    assert program is not None and not reader
    report = check(program, runtime)
    post = problems_of(report, "postcondition")
    assert [p.line for p in post] == [last]
    assert "contribution x(3,0) counted twice at rank 3 o[0]" in post[0].message


def test_text_wrong_peer_points_at_the_tb(algorithms):
    program = program_of(algorithms, "ring4-allgather", "rccl")
    text = write_program(program, "rccl")
    gpu0 = _line_of(text, '<gpu id="0"', 0)
    lines = text.splitlines()
    tb = next(i for i, line in enumerate(lines, 1) if i > gpu0 and 'send="1"' in line)
    lines[tb - 1] = lines[tb - 1].replace('send="1"', 'send="2"')
    read, reader = read_checked("\n".join(lines) + "\n", "rccl")
    assert read is not None and not reader
    report = check(read, "rccl")
    assert any(p.kind == "connection" and p.line == tb and "sends to rank 2" in p.message
               for p in report.problems), report.problems


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_wrong_peer_is_reported_at_both_ends(algorithms, runtime):
    """Rank 0 sending to rank 2 leaves rank 1's receiving tb without a sender too."""
    program, _, _, _ = wrong_peer(algorithms, runtime)
    receiver = next(t for t in next(g for g in program.gpus if g.id == 1).threadblocks
                    if t.recv == 0)
    c = receiver.chan
    assert_rejected(check(program, runtime), "connection",
                    f"rank 1 tb {receiver.id} receives from rank 0 on channel {c}, but rank 0 "
                    f"has no tb sending to rank 1 on channel {c}")
