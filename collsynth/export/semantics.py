"""How the runtimes execute an MSCCL program: load, connect, schedule, explain deadlocks.

The one meaning of a :class:`~collsynth.export.program.Program` shared by the checker
(:mod:`collsynth.export.check`, symbolic values) and the executor
(:mod:`collsynth.executor.program`, tensors); ``docs/msccl-xml.md`` §9-§11. A :class:`Scheduler`
runs the loaded thread blocks and calls back once per executed transfer with an :class:`Event`
naming what it waited for, so each caller adds only its values (or, later, times).
"""

from __future__ import annotations

import bisect
from collections import defaultdict, deque
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, NamedTuple, Sequence

from collsynth.export.program import RECV_OPS, SEND_OPS, ThreadBlock

__all__ = ["EXECUTABLE", "OPERANDS", "MAX_REDUCE_FUSION", "Transfer", "LoadedThreadblock",
           "load_threadblock", "Event", "Scheduler", "step_name", "cnt_mismatch"]

#: Step types the interpreters run (``ra`` is parsed by msccl but halts its block).
EXECUTABLE = frozenset({"s", "r", "rcs", "rrs", "rrc", "rrcs", "cpy", "re"})
#: Which operands each step type uses (§7.2).
OPERANDS = {"s": ("src",), "r": ("dst",), "rcs": ("dst",), "rrs": ("src",),
            "rrc": ("src", "dst"), "rrcs": ("src", "dst"), "cpy": ("src", "dst"),
            "re": ("src", "dst"), "ra": ("src", "dst"), "nop": ()}
#: Sources one fused ``re`` may hold (``MSCCL_MAX_REDUCE_FUSION``, §10).
MAX_REDUCE_FUSION = 16


def step_name(rank: int, tb: int, pos: int, line: int | None = None) -> str:
    """``rank R tb T step P`` and `` (line L)`` when the line is known."""
    return f"rank {rank} tb {tb} step {pos}" + (f" (line {line})" if line is not None else "")


# -- the loader (§9.2, §9.3, §10) ------------------------------------------------------------------


@dataclass
class Transfer:
    """One step as the runtime loads it: ``nop``\\ s folded in, a fused ``re`` chain merged."""

    type: str
    srcbuf: str
    srcoffs: list[int]              # several for a fused re
    dstbuf: str
    dstoff: int
    cnt: int
    hasdep: int
    deps: list[tuple[int, int, int]]  # (depid, deps, position of the step that named it)
    positions: list[int]            # document positions merged into this transfer
    lines: list[int | None]         # their source lines
    counter: int = 0                # the device step counter; published when hasdep


@dataclass
class LoadedThreadblock:
    """One tb as loaded, and what broke the loader's rules (§9.2)."""

    transfers: list[Transfer]
    chain_errors: list[int] = field(default_factory=list)   # positions breaking the nop rule
    ignored: list[tuple[int, int, int]] = field(default_factory=list)  # deps of trailing nops


def load_threadblock(tb: ThreadBlock) -> LoadedThreadblock:
    """Load one tb as the runtimes do: fold nops, fuse re chains, count steps (§9.2-§10)."""
    transfers: list[Transfer] = []
    chain_errors: list[int] = []
    pending: list[tuple[int, int, int]] = []
    fusible: tuple[str, int, str] | None = None   # (dstbuf, dstoff, srcbuf) of an open re chain
    reductions = 0
    for pos, st in enumerate(tb.steps):
        if st.depid >= 0:
            # A negative deps still waits: the flag test is "flag >= (work, iteration, deps)",
            # which only a publish of this iteration passes, as with deps=0 (§9.1).
            pending.append((st.depid, max(st.deps, 0), pos))
        if st.type == "nop":
            continue
        continuation = False
        if st.type == "re":
            if fusible == (st.dstbuf, st.dstoff, st.srcbuf) and st.depid == -1:
                continuation = True
            else:
                fusible = None
        if continuation:
            t = transfers[-1]
            t.srcoffs.append(st.srcoff)
            t.cnt, t.hasdep = st.cnt, st.hasdep
            t.positions.append(pos)
            t.lines.append(st.line)
        else:
            transfers.append(Transfer(st.type, st.srcbuf, [st.srcoff], st.dstbuf, st.dstoff,
                                      st.cnt, st.hasdep, pending, [pos], [st.line]))
            if pending and st.depid < 0:
                chain_errors.append(pos)
            pending = []
        if st.type != "re":
            fusible = None
        else:
            reductions += 1
            if st.hasdep or reductions == MAX_REDUCE_FUSION:
                fusible = None
            else:
                fusible = (st.dstbuf, st.dstoff, st.srcbuf)
    counter = 0
    for t in transfers:
        if t.deps:
            counter += len(t.deps) - 1
        if t.type == "re" and t.cnt > 0:
            counter += len(t.srcoffs) - 1
        t.counter = counter
        counter += 1
    return LoadedThreadblock(transfers, chain_errors, pending)


# -- execution (§9.1, §11.1) -----------------------------------------------------------------------


class Event(NamedTuple):
    """One executed transfer: ``index`` in the executed order, thread block ``tb`` of ``rank``
    (``gid`` its global number), ``position`` among the tb's transfers, the tb's ``send`` and
    ``recv`` peers and ``channel``. It ran after ``previous`` (the index of the tb's last
    event), the events in ``after_deps`` (the publishes that released each dependency) and,
    for a receive, the send event ``received`` (the k-th send of a connection for its k-th
    receive)."""

    index: int
    gid: int
    rank: int
    tb: int
    position: int
    transfer: Transfer
    send: int
    recv: int
    channel: int
    previous: int | None
    after_deps: tuple[int, ...]
    received: Event | None

    @property
    def op(self) -> str:
        return self.transfer.type

    def name(self) -> str:
        return step_name(self.rank, self.tb, self.transfer.positions[0], self.transfer.lines[0])


def cnt_mismatch(event: Event) -> str | None:
    """The problem of a receive whose ``cnt`` differs from its matching send's (§8.4)."""
    m = event.received
    if m is None or m.transfer.cnt == event.transfer.cnt:
        return None
    return (f"{event.name()} receives cnt={event.transfer.cnt} but the matching send, "
            f"{m.name()}, has cnt={m.transfer.cnt}; paired sends and receives need equal cnt")


class Scheduler:
    """Runs loaded thread blocks: flag dependencies (§9.1) and one FIFO per connection (§11.1).

    A transfer may run when every dependency's flag is published (a ``hasdep=1`` transfer of
    that tb with a counter >= ``deps`` has run) and, for a receive, its connection holds a
    message; sends never block. ``execute(event, payload)`` is called once per transfer run, in
    a topological order of happens-before, with the payload of the message a receive takes; for
    a send-type op its return value is the payload of the message it sends. ``tbs`` maps
    rank -> tb id -> tb (``loaded``: the same, loaded, to reuse).

    Two ranks that send, then receive: each receive names the event of the send it got.

    >>> from collsynth.export.program import XmlStep
    >>> steps = (XmlStep(0, "s", "i", 0, "o", 0, 1), XmlStep(1, "r", "i", 0, "o", 0, 1))
    >>> tbs = {r: {0: ThreadBlock(0, 1 - r, 1 - r, 0, steps)} for r in (0, 1)}
    >>> seen = []
    >>> Scheduler(tbs).run(lambda e, _: seen.append((e.index, e.rank, e.op, e.received and
    ...                                               e.received.index)))
    >>> seen
    [(0, 0, 's', None), (1, 1, 's', None), (2, 1, 'r', 0), (3, 0, 'r', 1)]
    """

    def __init__(self, tbs: Mapping[int, Mapping[int, ThreadBlock]],
                 loaded: Mapping[int, Mapping[int, LoadedThreadblock]] | None = None) -> None:
        self.tbs = tbs
        self.where = [(r, tid) for r in sorted(tbs) for tid in sorted(tbs[r])]
        self.gid = {key: g for g, key in enumerate(self.where)}
        self.transfers: list[list[Transfer]] = [
            (loaded[r][tid] if loaded is not None else load_threadblock(tbs[r][tid])).transfers
            for r, tid in self.where]
        blocks = [tbs[r][tid] for r, tid in self.where]
        self._peers = [(tb.send, tb.recv, tb.chan) for tb in blocks]
        # The FIFO each tb receives from and sends into: (sender, receiver, channel).
        self.recv_key = [(tb.recv, r, tb.chan) for (r, _), tb in zip(self.where, blocks)]
        self.send_key = [(r, tb.send, tb.chan) for (r, _), tb in zip(self.where, blocks)]
        total = self.total = len(self.where)
        self.pc = [0] * total
        self.halted: list[str | None] = [None] * total
        self.published = [-1] * total
        # Each FIFO holds (send event, payload) per message in flight.
        self.fifos: dict[tuple[int, int, int], deque[tuple[Event, Any]]] = defaultdict(deque)
        self.events = 0
        self._pub_counters: list[list[int]] = [[] for _ in range(total)]
        self._pub_events: list[list[int]] = [[] for _ in range(total)]
        self._last: list[int | None] = [None] * total
        self._waiting_dep: dict[int, set[int]] = defaultdict(set)
        self._waiting_msg: dict[tuple[int, int, int], set[int]] = defaultdict(set)
        self._candidates = set(range(total))

    # -- readiness ---------------------------------------------------------------------------------

    def blocker(self, g: int):
        """Why tb ``g``'s next transfer cannot run yet: ``("dep", depid, deps, tb waited
        for or None)`` or ``("msg", connection)``; ``None`` when it can."""
        t = self.transfers[g][self.pc[g]]
        r = self.where[g][0]
        for depid, deps, _ in t.deps:
            h = self.gid.get((r, depid))
            if h is None or self.published[h] < deps:
                return ("dep", depid, deps, h)
        if t.type in RECV_OPS and not self.fifos[self.recv_key[g]]:
            return ("msg", self.recv_key[g])
        return None

    def _parked(self, g: int) -> bool:
        """True when ``g`` must wait; it is then woken by what it waits for."""
        blocker = self.blocker(g)
        if blocker is not None and blocker[0] == "msg":
            self._waiting_msg[blocker[1]].add(g)
        elif blocker is not None and blocker[3] is not None:
            self._waiting_dep[blocker[3]].add(g)
        return blocker is not None

    def ready(self) -> list[int]:
        """The tbs whose next transfer can run now (ascending ``gid``)."""
        found = [g for g in sorted(self._candidates) if self.pc[g] < len(self.transfers[g])
                 and self.halted[g] is None and not self._parked(g)]
        self._candidates = set(found)
        return found

    # -- running -----------------------------------------------------------------------------------

    def fire(self, g: int, execute: Callable[[Event, Any], Any]) -> tuple[Event | None, list[int]]:
        """Run tb ``g``'s next transfer (it must be ready): its event (``None`` when the step
        halts the tb) and the tbs that were waiting for its flag or its message."""
        pc = self.pc[g]
        t = self.transfers[g][pc]
        self.pc[g] = pc + 1
        kind = t.type
        if kind not in EXECUTABLE:
            self.halted[g] = f"stopped at its {kind!r} step {t.positions[0]}"
            return None, []
        r, tid = self.where[g]
        after: tuple[int, ...] = ()
        for depid, deps, _ in t.deps:
            # The first publish that released the wait orders it (§9.1: flag >= deps).
            h = self.gid[(r, depid)]
            after += (self._pub_events[h][bisect.bisect_left(self._pub_counters[h], deps)],)
        received, payload = self.fifos[self.recv_key[g]].popleft() if kind in RECV_OPS \
            else (None, None)
        index = self.events
        self.events = index + 1
        event = Event(index, g, r, tid, pc, t, *self._peers[g], self._last[g], after, received)
        self._last[g] = index
        payload = execute(event, payload)
        woken: list[int] = []
        if t.hasdep == 1:
            self._pub_counters[g].append(t.counter)
            self._pub_events[g].append(index)
            self.published[g] = t.counter   # counters only grow along a tb
            woken += self._waiting_dep.pop(g, ())
        if kind in SEND_OPS:
            key = self.send_key[g]
            self.fifos[key].append((event, payload))
            woken += self._waiting_msg.pop(key, ())
        if woken:
            self._candidates.update(woken)
        return event, woken

    def run(self, execute: Callable[[Event, Any], Any],
            choose: Callable[[Sequence[int]], int] | None = None) -> None:
        """Run until nothing can run. Without ``choose``, each tb runs as far as it can, then
        waits until what it waits for happens; ``choose(ready gids) -> gid`` picks instead."""
        if choose is not None:
            while now := self.ready():
                self.fire(choose(now), execute)
            return
        ready = deque(range(self.total))
        queued = [True] * self.total
        pc, halted, fire, parked = self.pc, self.halted, self.fire, self._parked
        while ready:
            g = ready.popleft()
            queued[g] = False
            steps = len(self.transfers[g])
            while pc[g] < steps and halted[g] is None and not parked(g):
                for w in fire(g, execute)[1]:
                    if not queued[w]:
                        queued[w] = True
                        ready.append(w)

    # -- the end (§9.1, §11.1, §12.5) --------------------------------------------------------------

    def blocked(self) -> list[int]:
        """The tbs that did not finish (after :meth:`run`: a deadlock)."""
        return [g for g in range(self.total)
                if self.pc[g] < len(self.transfers[g]) or self.halted[g] is not None]

    def label(self, g: int) -> tuple[str, int | None]:
        """A blocked tb's name (its waiting step with its line) and that line."""
        if self.halted[g] is not None:
            return f"rank {self.where[g][0]} tb {self.where[g][1]}", None
        t = self.transfers[g][self.pc[g]]
        return step_name(*self.where[g], t.positions[0], t.lines[0]), t.lines[0]

    def reason(self, g: int) -> tuple[str, int | None]:
        """Why blocked tb ``g`` waits, and the tb it waits for (None: nobody can help)."""
        if self.halted[g] is not None:
            return self.halted[g], None
        r = self.where[g][0]
        blocker = self.blocker(g)
        if blocker is None:   # cannot happen after run(); be safe
            return "is ready", None
        if blocker[0] == "dep":
            _, depid, deps, h = blocker
            if h is None:
                return f"waits for tb {depid}, which does not exist", None
            got = self.published[h]
            state = f"it has published {got}" if got >= 0 else "it has published nothing"
            return f"waits for tb {depid} to publish step {deps} ({state})", h
        a, _, c = blocker[1]
        sender = next((self.gid[(a, tid)] for tid, tb in self.tbs.get(a, {}).items()
                       if tb.send == r and tb.chan == c), None)
        if sender is None:
            return (f"waits for a message from rank {a} on channel {c}, but no tb of rank {a} "
                    "sends there"), None
        return f"waits for a message from rank {a} on channel {c}", sender

    def explain_deadlock(self) -> list[tuple[str, int | None]]:
        """(message, line) for each deadlock: a cycle of waits first, halted tbs, then the
        remaining waits, root causes first."""
        blocked = self.blocked()
        found: list[tuple[str, int | None]] = []
        blocked_set = set(blocked)
        cycle: list[int] = []
        for start in blocked:
            path: dict[int, int] = {}   # tb -> its place on the path of waits
            g: int | None = start
            while g in blocked_set and g not in path:
                path[g] = len(path)
                g = self.reason(g)[1]
            if g in path:
                cycle = list(path)[path[g]:]
                break
        if cycle:
            parts = [f"{self.label(g)[0]} {self.reason(g)[0]}" for g in cycle]
            found.append(("a cycle of waits: " + "; ".join(parts) + " (back to the first)",
                          self.label(cycle[0])[1]))
        others = [g for g in blocked if g not in cycle and self.halted[g] is None]
        for g in blocked:
            if self.halted[g] is not None:
                found.append((f"{self.label(g)[0]} {self.halted[g]}; its later steps never run",
                              None))
        if others:
            # Root causes first: waits that nothing still running can satisfy.
            others.sort(key=lambda g: self.reason(g)[1] in blocked_set)
            shown = others[:4]
            parts = [f"{self.label(g)[0]} {self.reason(g)[0]}" for g in shown]
            more = f" (and {len(others) - len(shown)} more)" if len(others) > len(shown) else ""
            found.append((f"{len(others)} thread block(s) wait forever: " + "; ".join(parts)
                          + more, self.label(shown[0])[1]))
        return found

    def unreceived(self) -> list[tuple[str, int | None]]:
        """(message, line) for each connection left holding messages nobody received."""
        found = []
        for (a, b, c), fifo in sorted(self.fifos.items()):
            if fifo:
                e = fifo[0][0]
                first = step_name(e.rank, e.tb, e.transfer.positions[0])
                found.append((f"{len(fifo)} message(s) from rank {a} to rank {b} on channel {c} "
                              f"are never received (first: {first}); extra sends leave data in "
                              "the FIFO and break the next collective", e.transfer.lines[0]))
        return found
