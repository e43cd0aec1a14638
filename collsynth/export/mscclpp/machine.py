"""Run a plan's steps on every rank at once, with symbolic data and vector clocks.

Threadblocks run their steps in order, blocking where the GPU would (a wait without a signal,
a semaphore at zero, a barrier not yet full, a packet not yet written); port channels' proxies
run their requests in order. Memory is tracked per cell (:class:`Cells`); every access is
checked against the last write and the reads since (races), the buffer's size (bounds) and
what was written (uninitialised, packet format). Happens-before follows the kernel: inside a
threadblock only a ``nop`` (``__syncthreads``) orders operations; signals, semaphores and
barriers carry clocks; relaxed signals order execution only. The rules:
``docs/mscclpp.md``, section "How the checker executes a plan".
"""

from __future__ import annotations

from collections import Counter, defaultdict, deque
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from collsynth.export.check import Problem
from collsynth.export.mscclpp.geometry import Geometry
from collsynth.export.mscclpp.loader import LoadedPlan
from collsynth.export.mscclpp.steps import Access, Post, Step, Transfer

__all__ = ["Cells", "Machine", "GARBAGE", "Action", "SHOWN_PER_KIND"]

#: A value read from outside a buffer or in the wrong format.
GARBAGE = "garbage"
#: How many problems of one kind one run reports before counting the rest.
SHOWN_PER_KIND = 12
_UINT32 = 1 << 32


class _Packet:
    """A packet cell written in this launch (its flag is current) holding ``value``."""

    __slots__ = ("value",)

    def __init__(self, value) -> None:
        self.value = value


_TAIL = "packet-tail"   # the second cell of a packet (flag bytes)


def _add(a, b):
    if a is None or b is None or a is GARBAGE or b is GARBAGE:
        return GARBAGE
    return tuple(sorted(a + b))


@dataclass(frozen=True)
class Cells:
    """How accesses map to cells: ``cell_bytes`` per cell, ``alias(rank, buffer)`` the
    physical buffer a logical one lives in and its byte shift there (in place, the input and
    output overlap), ``capacity(rank, buffer)`` its size in bytes."""

    cell_bytes: int
    alias: Callable[[int, str], tuple[str, int]]
    capacity: Callable[[int, str], int]


@dataclass(frozen=True)
class Action:
    """One executed transfer, for replaying a run on real tensors: ``actor_rank`` computes
    ``mode`` over ``srcs`` and writes ``dsts`` (accesses clipped to their buffers)."""

    actor_rank: int
    mode: str
    srcs: tuple[Access, ...]
    dsts: tuple[Access, ...]


@dataclass
class _Tb:
    gid: int
    rank: int
    tb: int
    steps: list[Step]
    pc: int = 0
    arrived: bool = False
    released: np.ndarray | None = None
    released_x: np.ndarray | None = None
    pend: np.ndarray | None = None
    pend_x: np.ndarray | None = None


@dataclass
class _Barrier:
    waiting: list[tuple[int, np.ndarray, np.ndarray]] = field(default_factory=list)
    target: int = 0


class Machine:
    """One run of ``steps`` (rank -> threadblock -> steps) of ``loaded``.

    ``initial(rank, buffer, cell)`` gives the value a logical input cell starts with. After
    :meth:`run`, ``problems`` holds what went wrong, :meth:`value` reads the final memory and
    ``actions`` lists the transfers in an order consistent with happens-before.
    """

    def __init__(self, loaded: LoadedPlan, steps: dict[int, list[list[Step]]], geo: Geometry,
                 cells: Cells, initial: Callable[[int, int], object]) -> None:
        self.loaded, self.geo, self.cells = loaded, geo, cells
        self.A = cells.cell_bytes
        self.tbs: list[_Tb] = []
        for r in sorted(steps):
            for t, tb_steps in enumerate(steps[r]):
                self.tbs.append(_Tb(len(self.tbs), r, t, tb_steps))
        self.by_rank: dict[int, list[int]] = defaultdict(list)
        for tb in self.tbs:
            self.by_rank[tb.rank].append(tb.gid)
        # One proxy per port channel: actors after the threadblocks.
        self.proxy: dict[tuple[int, int], int] = {}
        for (r, t), peers in sorted(loaded.peers.items()):
            if t == "port":
                for k in range(len(peers)):
                    self.proxy[(r, k)] = len(self.tbs) + len(self.proxy)
        self.actors = len(self.tbs) + len(self.proxy)
        self.proxy_rank = {a: r for (r, _), a in self.proxy.items()}
        z = lambda: np.zeros(self.actors, dtype=np.int64)  # noqa: E731
        self.clk = [z() for _ in range(self.actors)]
        self.xclk = [z() for _ in range(self.actors)]
        for a in range(self.actors):
            self.clk[a][a] = self.xclk[a][a] = 1
        self.where_of: dict[tuple[int, int], str] = {}
        # Memory: (rank, physical buffer) -> cell -> value / last write / reads since.
        self.mem: dict[tuple[int, str], dict[int, object]] = defaultdict(dict)
        self.writer: dict[tuple[int, str], dict[int, tuple]] = defaultdict(dict)
        self.readers: dict[tuple[int, str], dict[int, dict]] = defaultdict(dict)
        for r in range(loaded.n):
            phys, shift = cells.alias(r, "i")
            size = cells.capacity(r, "i") // self.A
            first = shift // self.A
            store = self.mem[(r, phys)]
            for k in range(size):
                store[first + k] = initial(r, k)
        # Synchronisation state.
        self.tokens: dict[tuple[int, str, int], deque] = defaultdict(deque)
        self.lost: Counter = Counter()
        gpus = loaded.plan.gpus
        self.sem_count = {(r, s): v for r, g in enumerate(gpus) for s, v in enumerate(g.semaphores)}
        self.sem_clocks: dict[tuple[int, int], deque] = defaultdict(deque)
        self.sem_free = dict(self.sem_count)   # init tokens not yet taken (no clock)
        self.barriers: dict[tuple[int, int], _Barrier] = defaultdict(_Barrier)
        self.actions: list[Action] = []
        self.problems: list[Problem] = []
        self._counts: Counter = Counter()
        self._seen: set = set()

    # -- problems ------------------------------------------------------------------------------

    def report(self, kind: str, message: str, once=None) -> None:
        key = once if once is not None else (kind, message)
        if key in self._seen:
            return
        self._seen.add(key)
        self._counts[kind] += 1
        if self._counts[kind] <= SHOWN_PER_KIND:
            self.problems.append(Problem(kind, message))

    def summarise(self) -> None:
        for kind, count in self._counts.items():
            if count > SHOWN_PER_KIND:
                self.problems.append(Problem(kind, f"... and {count - SHOWN_PER_KIND} more {kind} "
                                                   "problems like the ones above"))

    # -- cells ---------------------------------------------------------------------------------

    def _span(self, acc: Access, where: str) -> tuple[tuple[int, str], int, int, int]:
        """((rank, physical buffer), first cell, cells inside the buffer, cells wanted) of
        ``acc``; a packet range takes two cells per cell of data."""
        A = self.A
        factor = 2 if acc.packet else 1
        start, length = acc.offset * factor, acc.length * factor
        cap = self.cells.capacity(acc.rank, acc.buffer)
        if start + length > _UINT32:
            self.report("limit", f"{where}: bytes up to {start + length} of rank {acc.rank}'s "
                                 f"{acc.buffer} buffer do not fit the kernel's 32-bit offsets "
                                 "at this message size", once=("u32", where))
        inside = max(0, min(start + length, cap) - start)
        if inside < length:
            fmt = " (LL packets)" if acc.packet else ""
            self.report("bounds", f"{where}: bytes {start}..{start + length}{fmt} of rank "
                                  f"{acc.rank}'s {acc.buffer} buffer are outside its {cap} "
                                  "bytes", once=("bounds", where, acc.rank, acc.buffer))
        phys, shift = self.cells.alias(acc.rank, acc.buffer)
        return (acc.rank, phys), (shift + start) // A, inside // A, length // A

    def _chunk(self, acc: Access, cell: int) -> str:
        """``o[chunk 3]`` for cell ``cell`` (a cell of data, not of packets) of ``acc``."""
        chunk = (acc.offset + cell * self.A) // self.geo.chunk_bytes
        return f"{acc.buffer}[chunk {chunk}]" + (" (LL packets)" if acc.packet else "")

    def _touch(self, g: int, clk: np.ndarray, key, cell: int, write: bool, where: str,
               acc: Access, k: int, synced=None, value=None) -> None:
        """Record an access of actor ``g``; report the accesses it races with. ``synced`` is
        the write a packet read waited for (its flag), which the read is ordered after;
        ``value`` is what a write stores."""
        epoch = int(clk[g])
        lane = (key, self.cells.alias(acc.rank, acc.buffer)[1] + acc.offset, acc.unit,
                acc.packet) if acc.unit else None
        last = self.writer[key].get(cell)
        if last is not None and last != synced and not self._ordered(g, clk, where, lane, last):
            self._race(last[2], "writes", where, "writes" if write else "reads", acc, k)
        readers = self.readers[key]
        seen = readers.get(cell)
        if write:
            if seen:
                depends = self._depends(key, cell, seen, value)
                for h, (e, w, ln) in seen.items():
                    if not depends and not self._ordered(g, clk, where, lane, (h, e, w, ln)):
                        self._race(w, "reads", where, "writes", acc, k)
                readers[cell] = {}
            self.writer[key][cell] = (g, epoch, where, lane)
        else:
            if seen is None:
                seen = readers[cell] = {}
            seen[g] = (epoch, where, lane)

    def _depends(self, key, cell: int, seen: dict, value) -> bool:
        """A write ordered after the cell's reads by data dependency: the cell still holds
        its input, one threadblock (or proxy) read it, and the value written contains that
        input; it cannot exist before that read (docs/mscclpp.md, "How the checker executes
        a plan")."""
        if len(seen) != 1 or not isinstance(value, tuple) or key not in self.mem:
            return False
        if self.writer[key].get(cell) is not None:
            return False
        old = self.mem[key].get(cell)
        return isinstance(old, tuple) and len(old) == 1 and old[0] in value

    @staticmethod
    def _ordered(g: int, clk: np.ndarray, where: str, lane, other: tuple) -> bool:
        h, e, w, other_lane = other
        if h == g:
            # One threadblock: a nop in between, the same operation, or the same thread (the
            # same start and unit: thread t takes units t, t + threads, ...).
            return e < clk[g] or w == where or (lane is not None and lane == other_lane)
        return clk[h] >= e

    def _race(self, other_where: str, verb: str, where: str, my_verb: str, acc: Access,
              k: int) -> None:
        first, second = sorted((other_where, where))
        self.report("race", f"rank {acc.rank} {self._chunk(acc, k)}: {other_where} {verb} it "
                            f"and {where} {my_verb} it, and nothing orders them (a nop, "
                            "signal/wait, semaphore or barrier between them)",
                    once=("race", first, second))

    def _read(self, g: int, acc: Access, where: str, raw: bool,
              synced_packets: bool = False) -> list:
        key, first, inside, wanted = self._span(acc, where)
        clk = self.clk[g]
        store, writers = self.mem[key], self.writer[key]
        out: list = []
        if raw:
            for k in range(wanted):
                if k < inside:
                    synced = writers.get(first + k) if synced_packets else None
                    self._touch(g, clk, key, first + k, False, where, acc, k // 2, synced)
                    out.append(store.get(first + k))
                else:
                    out.append(None)
            return out
        if acc.packet:
            for k in range(wanted // 2):
                cell = first + 2 * k
                value = store.get(cell) if 2 * k + 2 <= inside else None
                if not isinstance(value, _Packet):
                    out.append(GARBAGE)
                    continue
                synced = writers.get(cell)
                self._touch(g, clk, key, cell, False, where, acc, k, synced)
                self._touch(g, clk, key, cell + 1, False, where, acc, k, synced)
                out.append(value.value)
            return out
        for k in range(wanted):
            if k >= inside:
                out.append(GARBAGE)
                continue
            value = store.get(first + k)
            if isinstance(value, _Packet) or value is _TAIL:
                self.report("format", f"{where} reads rank {acc.rank} {self._chunk(acc, k)} as "
                                      "plain data, but LL packets were written there",
                            once=("format", where))
                value = GARBAGE
            elif value is None:
                self.report("uninitialised", f"{where} reads rank {acc.rank} "
                                             f"{self._chunk(acc, k)} before anything was "
                                             "written there", once=("uninit", where))
                value = GARBAGE
            self._touch(g, clk, key, first + k, False, where, acc, k)
            out.append(value)
        return out

    def _write(self, g: int, acc: Access, values: list, where: str, raw: bool) -> None:
        key, first, inside, _ = self._span(acc, where)
        clk = self.clk[g]
        store = self.mem[key]
        if raw:
            for k, value in enumerate(values[:inside]):
                self._touch(g, clk, key, first + k, True, where, acc, k // 2)
                if value is None:
                    store.pop(first + k, None)   # a stale packet: its flag is old
                else:
                    store[first + k] = value
            return
        if acc.packet:
            for k, value in enumerate(values):
                if 2 * k + 2 > inside:
                    break
                cell = first + 2 * k
                self._touch(g, clk, key, cell, True, where, acc, k, value=value)
                self._touch(g, clk, key, cell + 1, True, where, acc, k, value=value)
                store[cell], store[cell + 1] = _Packet(value), _TAIL
            return
        for k, value in enumerate(values[:inside]):
            self._touch(g, clk, key, first + k, True, where, acc, k, value=value)
            store[first + k] = value

    # -- transfers -----------------------------------------------------------------------------

    def _transfer(self, actor: int, rank: int, t: Transfer, where: str) -> None:
        raw = t.mode == "raw"
        reads = [self._read(actor, s, where, raw, t.synced) for s in t.srcs]
        if t.mode == "sum":
            values = reads[0]
            for more in reads[1:]:
                values = [_add(a, b) for a, b in zip(values, more)]
        else:
            values = reads[0]
        for d in t.dsts:
            self._write(actor, d, values, where, raw)
        self.actions.append(Action(rank, t.mode, t.srcs, t.dsts))

    def _release(self, tb: _Tb) -> tuple[np.ndarray, np.ndarray]:
        """What a thread of ``tb`` publishes now: everything before the last ``nop``."""
        m, x = self.clk[tb.gid].copy(), self.xclk[tb.gid].copy()
        m[tb.gid] -= 1
        x[tb.gid] -= 1
        return m, x

    def _acquire(self, tb: _Tb, m: np.ndarray | None, x: np.ndarray | None) -> None:
        """A thread of ``tb`` learns ``m``/``x``; the block learns it at the next ``nop``."""
        if m is not None:
            tb.pend = m.copy() if tb.pend is None else np.maximum(tb.pend, m)
        if x is not None:
            tb.pend_x = x.copy() if tb.pend_x is None else np.maximum(tb.pend_x, x)

    def _sync(self, tb: _Tb) -> None:
        g = tb.gid
        if tb.pend is not None:
            np.maximum(self.clk[g], tb.pend, out=self.clk[g])
        if tb.pend_x is not None:
            np.maximum(self.xclk[g], tb.pend_x, out=self.xclk[g])
        tb.pend = tb.pend_x = None
        self.clk[g][g] += 1
        self.xclk[g][g] += 1

    def _post(self, tb: _Tb, post: Post, where: str) -> None:
        a = self.proxy[(tb.rank, post.channel)]
        m, x = self._release(tb)
        np.maximum(self.clk[a], m, out=self.clk[a])
        np.maximum(self.xclk[a], x, out=self.xclk[a])
        self.clk[a][a] += 1
        self.xclk[a][a] += 1
        if post.transfer is not None:
            self._transfer(a, tb.rank, post.transfer, where + " (by the proxy)")
        if post.signal:
            self._deliver(tb.rank, "port", post.channel, self.clk[a].copy(), self.xclk[a].copy())
        if post.flush:
            self._acquire(tb, self.clk[a], self.xclk[a])

    def _deliver(self, r: int, kind: str, channel: int, m, x) -> None:
        peer_channel = self.loaded.paired.get((r, kind, channel))
        peer = self.loaded.peers[(r, kind)][channel]
        if peer_channel is None:
            self.lost[(r, kind, channel, peer)] += 1
            return
        self.tokens[(peer, kind, peer_channel)].append((m, x))

    # -- the scheduler -------------------------------------------------------------------------

    def _blocker(self, tb: _Tb) -> str | None:
        step = tb.steps[tb.pc]
        r = tb.rank
        if step.kind == "wait":
            for (kind, ch), count in Counter(step.channels).items():
                if len(self.tokens[(r, kind, ch)]) < count:
                    return (f"waits on {kind} channel {ch} for a signal from rank "
                            f"{self.loaded.peers[(r, kind)][ch]}")
        elif step.kind == "sem_acquire":
            need = Counter(step.ids)
            for sid, count in need.items():
                if self.sem_count[(r, sid)] < count:
                    return f"waits for semaphore {sid} (value {self.sem_count[(r, sid)]})"
        elif step.kind == "barrier":
            if tb.arrived and tb.released is None:
                b = self.barriers[(r, step.ids[0])]
                return (f"waits at barrier {step.ids[0]} for {step.ids[1]} threadblocks "
                        f"({len(b.waiting)} there)")
        elif step.kind == "data":
            for acc in step.needs:
                missing = self._missing_packet(acc, step.where)
                if missing is not None:
                    return (f"waits for LL packets in rank {acc.rank} "
                            f"{self._chunk(acc, missing)}, which nothing has written in this "
                            "launch")
        return None

    def _missing_packet(self, acc: Access, where: str) -> int | None:
        key, first, inside, wanted = self._span(acc, where)
        store = self.mem[key]
        for k in range(wanted // 2):
            if 2 * k + 2 > inside or not isinstance(store.get(first + 2 * k), _Packet):
                return k
        return None

    def _arrive(self, tb: _Tb, step: Step) -> None:
        self._sync(tb)
        barrier_id, target = step.ids
        if target <= 1:
            tb.released, tb.released_x = self.clk[tb.gid], self.xclk[tb.gid]
            return
        b = self.barriers[(tb.rank, barrier_id)]
        if b.waiting and b.target != target:
            self.report("structure", f"{step.where}: barrier {barrier_id} is used with "
                                     f"{b.target} and with {target} threadblocks at once")
        b.target = target
        m, x = self._release(tb)
        b.waiting.append((tb.gid, m, x))
        tb.arrived = True
        if len(b.waiting) >= target:
            m_all = np.maximum.reduce([w[1] for w in b.waiting])
            x_all = np.maximum.reduce([w[2] for w in b.waiting])
            for gid, _, _ in b.waiting:
                self.tbs[gid].released, self.tbs[gid].released_x = m_all, x_all
            b.waiting = []

    def _fire(self, tb: _Tb) -> None:
        step = tb.steps[tb.pc]
        r, kind = tb.rank, step.kind
        if kind == "barrier":
            if not tb.arrived:
                self._arrive(tb, step)
                if tb.released is None:
                    return
            self._acquire(tb, tb.released, tb.released_x)
            self._sync(tb)
            tb.arrived, tb.released, tb.released_x = False, None, None
        elif kind == "sync":
            self._sync(tb)
        elif kind == "signal":
            m, x = self._release(tb)
            for ch_kind, ch in step.channels:
                self._deliver(r, ch_kind, ch, None if step.relaxed else m, x)
        elif kind == "wait":
            for ch_kind, ch in step.channels:
                m, x = self.tokens[(r, ch_kind, ch)].popleft()
                self._acquire(tb, None if step.relaxed else m, x)
        elif kind == "flush":
            for _, ch in step.channels:
                a = self.proxy[(r, ch)]
                self._acquire(tb, self.clk[a], self.xclk[a])
        elif kind == "sem_release":
            m, x = self._release(tb)
            for sid in step.ids:
                self.sem_count[(r, sid)] += 1
                self.sem_clocks[(r, sid)].append((m, x))
        elif kind == "sem_acquire":
            for sid in step.ids:
                self.sem_count[(r, sid)] -= 1
                if self.sem_free[(r, sid)] > 0:
                    self.sem_free[(r, sid)] -= 1
                else:
                    self._acquire(tb, *self.sem_clocks[(r, sid)].popleft())
        else:
            for acc in step.needs:   # the flag wait: this thread saw the packet written
                self._saw_packets(tb, acc, step.where)
            for t in step.transfers:
                self._transfer(tb.gid, r, t, step.where)
            for post in step.posts:
                self._post(tb, post, step.where)
        tb.pc += 1

    def _saw_packets(self, tb: _Tb, acc: Access, where: str) -> None:
        key, first, inside, wanted = self._span(acc, where)
        writers = self.writer[key]
        x = np.zeros(self.actors, dtype=np.int64)
        for k in range(min(wanted, inside) // 2):
            w = writers.get(first + 2 * k)
            if w is not None:
                x[w[0]] = max(x[w[0]], w[1])
        self._acquire(tb, None, x)

    def run(self) -> None:
        """Run every threadblock as far as it can go."""
        progress = True
        while progress:
            progress = False
            for tb in self.tbs:
                while tb.pc < len(tb.steps) and self._blocker(tb) is None:
                    before = tb.pc
                    self._fire(tb)
                    progress = True
                    if tb.pc == before:   # arrived at a barrier that is not full yet
                        break
        self._finish()

    # -- the end -------------------------------------------------------------------------------

    def blocked(self) -> list[_Tb]:
        return [tb for tb in self.tbs if tb.pc < len(tb.steps)]

    def _finish(self) -> None:
        stuck = self.blocked()
        if stuck:
            parts = [f"{tb.steps[tb.pc].where} {self._blocker(tb) or 'waits'}" for tb in stuck[:4]]
            more = f" (and {len(stuck) - 4} more)" if len(stuck) > 4 else ""
            self.report("deadlock", f"{len(stuck)} threadblock(s) wait forever: "
                                    + "; ".join(parts) + more)
        for (r, kind, ch), queue in sorted(self.tokens.items()):
            if queue:
                peer = self.loaded.peers[(r, kind)][ch]
                self.report("signal", f"{len(queue)} signal(s) from rank {peer} on rank {r}'s "
                                      f"{kind} channel {ch} are never waited for: the next "
                                      "call's wait would pass at once")
        for (r, kind, ch, peer), count in sorted(self.lost.items()):
            self.report("signal", f"rank {r} signals {kind} channel {ch} {count} time(s), but "
                                  f"rank {peer} has no matching {kind} channel to wait on")
        gpus = self.loaded.plan.gpus
        for (r, sid), count in sorted(self.sem_count.items()):
            init = gpus[r].semaphores[sid]
            if count != init and not stuck:
                self.report("semaphore", f"rank {r} semaphore {sid} ends at {count}, not its "
                                         f"initial {init}: the next call starts from another "
                                         "value")
        if not stuck:
            self._completion()
        self.summarise()

    def _completion(self) -> None:
        """Every write into a rank's memory by another rank (or a proxy) must be known to be
        done when the rank's kernel ends; port reads of its buffers too."""
        ends = {}
        for r, gids in self.by_rank.items():
            end = np.zeros(self.actors, dtype=np.int64)
            for g in gids:
                tb = self.tbs[g]
                np.maximum(end, self.xclk[g], out=end)
                if tb.pend_x is not None:
                    np.maximum(end, tb.pend_x, out=end)
            ends[r] = end
        mine = {r: set(gids) for r, gids in self.by_rank.items()}
        double = self.loaded.plan.use_double_scratch_buffer
        for (r, phys), cells in self.writer.items():
            end = ends.get(r)
            if end is None:
                continue
            for cell, (h, e, where, _) in cells.items():
                if h not in mine[r] and end[h] < e:
                    self.report("completion", f"{where} writes rank {r}'s {phys} buffer, and "
                                              f"nothing tells rank {r} it is done before its "
                                              "kernel ends (signal after it, and wait)",
                                once=("completion", where, r))
        for (r, phys), cells in self.readers.items():
            end = ends.get(r)
            if end is None or (phys == "s" and double):
                continue
            for cell, seen in cells.items():
                for h, (e, where, _) in seen.items():
                    if h in self.proxy_rank and end[h] < e:
                        self.report("async-read", f"{where} may still read rank {r}'s {phys} "
                                                  "buffer when its kernel ends (use pwsf, or "
                                                  "flush before the end)",
                                    once=("async", where))

    def value(self, rank: int, buffer: str, cell: int):
        """The final value of logical cell ``cell`` of ``rank``'s ``buffer``."""
        phys, shift = self.cells.alias(rank, buffer)
        value = self.mem[(rank, phys)].get(shift // self.A + cell)
        return GARBAGE if isinstance(value, _Packet) or value is _TAIL else value

    def writer_of(self, rank: int, buffer: str, cell: int) -> str | None:
        phys, shift = self.cells.alias(rank, buffer)
        last = self.writer[(rank, phys)].get(shift // self.A + cell)
        return last[2] if last is not None else None
