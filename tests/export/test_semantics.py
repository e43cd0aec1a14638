"""The shared execution model of an MSCCL program (collsynth.export.semantics).

Expected values come from the rules of docs/msccl-xml.md §9.2 (nop folding), §9.3 (the step
counter), §10 (re fusion) and §11.1 (FIFO pairing), counted by hand on small thread blocks.
"""

from __future__ import annotations

import ast
from pathlib import Path

from collsynth.export.program import ThreadBlock, XmlStep
from collsynth.export.semantics import Scheduler, load_threadblock

ROOT = Path(__file__).resolve().parents[2]


def _tb(tid: int, send: int, recv: int, *steps: XmlStep) -> ThreadBlock:
    return ThreadBlock(tid, send, recv, 0, steps)


def _nop(pos: int, depid: int = -1, deps: int = -1) -> XmlStep:
    return XmlStep(pos, "nop", "i", -1, "o", -1, 0, depid, deps)


def test_nops_hand_their_dependencies_to_the_next_real_step():
    tb = _tb(0, -1, -1,
             _nop(0, 1, 4),
             XmlStep(1, "cpy", "i", 0, "o", 0, 1, depid=2, deps=7),   # waits for both
             _nop(2),                                                 # no dependency: dropped
             XmlStep(3, "cpy", "i", 1, "o", 1, 1, hasdep=1),
             _nop(4, 1, 0),
             XmlStep(5, "cpy", "i", 2, "o", 2, 1),                    # nop deps, no own depid
             _nop(6, 2, 3))                                           # trailing: ignored
    loaded = load_threadblock(tb)
    assert [t.positions for t in loaded.transfers] == [[1], [3], [5]]
    assert loaded.transfers[0].deps == [(1, 4, 0), (2, 7, 1)]
    assert loaded.transfers[1].deps == []
    assert loaded.transfers[2].deps == [(1, 0, 4)]
    assert loaded.chain_errors == [5]
    assert loaded.ignored == [(2, 3, 6)]
    # Counter (§9.3): 0 + (2 deps - 1) = 1 for the first; the dependency-less nop is not
    # counted, so position 3 publishes 2; position 5 gets 3 + (1 - 1) = 3.
    assert [t.counter for t in loaded.transfers] == [1, 2, 3]


def test_re_runs_fuse_with_the_last_cnt_and_hasdep():
    tb = _tb(0, -1, -1,
             XmlStep(0, "re", "s", 0, "o", 0, 1, depid=1, deps=0),
             _nop(1, 2, 0),                                    # inside the run: waited for later
             XmlStep(2, "re", "s", 2, "o", 0, 2, hasdep=1),    # same dst and srcbuf: fused
             XmlStep(3, "re", "s", 4, "o", 0, 2),              # the run ended at hasdep=1
             XmlStep(4, "re", "i", 0, "o", 0, 2),              # another srcbuf: not fused
             XmlStep(5, "re", "i", 1, "o", 0, 2, depid=1, deps=1),  # own depid: not fused
             XmlStep(6, "cpy", "i", 0, "o", 3, 1, depid=1, deps=2))
    loaded = load_threadblock(tb)
    fused = loaded.transfers[0]
    assert fused.positions == [0, 2] and fused.srcoffs == [0, 2]
    assert (fused.cnt, fused.hasdep) == (2, 1)
    assert fused.deps == [(1, 0, 0)]
    assert [t.positions for t in loaded.transfers] == [[0, 2], [3], [4], [5], [6]]
    # The nop's dependency goes to the next transfer that is not merged, after the reduction.
    assert loaded.transfers[1].deps == [(2, 0, 1)]
    # ... which has no depid of its own: the nop rule of §9.2 is broken there.
    assert loaded.chain_errors == [3]
    # Counters: the fused pair publishes 0 + (2 - 1) = 1, the position of its last step; the
    # nop's dependency is counted as dependencies minus one = 0, so from position 3 on every
    # counter is one below its position.
    assert [t.counter for t in loaded.transfers] == [1, 2, 3, 4, 5]


def test_sixteen_reductions_close_a_run():
    steps = [XmlStep(k, "re", "s", k, "o", 0, 1) for k in range(20)]
    loaded = load_threadblock(_tb(0, -1, -1, *steps))
    assert [len(t.srcoffs) for t in loaded.transfers] == [16, 4]


def _exchange() -> dict[int, dict[int, ThreadBlock]]:
    """Two ranks; rank r sends i[0] and i[1] to the other, receives them into o[0], o[1]; a
    local tb of each rank waits for the second receive, whose step alone publishes."""
    def rank(r: int) -> dict[int, ThreadBlock]:
        p = 1 - r
        return {0: _tb(0, p, p,
                       XmlStep(0, "s", "i", 0, "o", 0, 1),
                       XmlStep(1, "s", "i", 1, "o", 0, 1),
                       XmlStep(2, "r", "i", 0, "o", 0, 1),                # hasdep=0
                       XmlStep(3, "r", "i", 0, "o", 1, 1, hasdep=1)),
                1: _tb(1, -1, -1, XmlStep(0, "cpy", "o", 0, "s", 0, 2, depid=0, deps=2))}
    return {0: rank(0), 1: rank(1)}


def _edges(events) -> set[tuple]:
    by_index = {e.index: (e.rank, e.tb, e.position) for e in events}
    edges = set()
    for e in events:
        me = (e.rank, e.tb, e.position)
        edges |= {("dep", by_index[i], me) for i in e.after_deps}
        if e.received is not None:
            edges.add(("msg", by_index[e.received.index], me))
    return edges


def test_events_name_the_publish_and_the_send_they_waited_for():
    events = []
    Scheduler(_exchange()).run(lambda e, _: events.append(e))
    assert len(events) == 10
    named = {(e.rank, e.tb, e.position): e for e in events}
    # The wait for position 2 ends with the first publish >= 2: position 3's (§9.1).
    expected = {("dep", (r, 0, 3), (r, 1, 0)) for r in (0, 1)}
    # The k-th send of a connection meets its k-th receive (§11.1).
    expected |= {("msg", (r, 0, k), (1 - r, 0, 2 + k)) for r in (0, 1) for k in (0, 1)}
    assert _edges(events) == expected
    assert named[(0, 0, 2)].received.index != named[(0, 0, 3)].received.index
    assert named[(0, 0, 0)].send == 1 and named[(0, 0, 0)].channel == 0


def test_a_chosen_order_keeps_the_same_constraints():
    # A timing simulator picks the next ready tb; the happens-before edges cannot change.
    default, chosen = [], []
    Scheduler(_exchange()).run(lambda e, _: default.append(e))
    sched = Scheduler(_exchange())
    sched.run(lambda e, _: chosen.append(e), choose=lambda ready: ready[-1])
    assert [(e.rank, e.tb) for e in chosen] != [(e.rank, e.tb) for e in default]
    assert _edges(chosen) == _edges(default)
    assert not sched.blocked()
    for e in chosen:   # a topological order: what it waited for ran before it
        assert all(i < e.index for i in e.after_deps)
        assert e.received is None or e.received.index < e.index


def test_a_deadlock_is_explained_as_a_cycle():
    tbs = {r: {0: _tb(0, 1 - r, 1 - r, XmlStep(0, "r", "i", 0, "o", 0, 1),
                      XmlStep(1, "s", "i", 0, "o", 0, 1))} for r in (0, 1)}
    sched = Scheduler(tbs)
    sched.run(lambda event, payload: None)
    assert sched.blocked() == [0, 1]
    assert sched.explain_deadlock() == [(
        "a cycle of waits: rank 0 tb 0 step 0 waits for a message from rank 1 on channel 0; "
        "rank 1 tb 0 step 0 waits for a message from rank 0 on channel 0 (back to the first)",
        None)]


def test_checker_and_executor_have_no_loader_or_queue_of_their_own():
    """Both run the shared Scheduler; neither folds nops, keeps FIFOs or finds flags itself."""
    for name in ("collsynth/export/check.py", "collsynth/executor/program.py"):
        tree = ast.parse((ROOT / name).read_text(encoding="utf-8"))
        imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                    and node.module == "collsynth.export.semantics" for alias in node.names}
        assert "Scheduler" in imported, name
        names = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
        attributes = {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
        functions = {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)}
        assert not names & {"deque", "bisect", "pending"}, name
        assert not attributes & {"popleft", "appendleft", "bisect_left"}, name
        assert not {f for f in functions if "load" in f or "blocker" in f or "deadlock" in f}, \
            name
