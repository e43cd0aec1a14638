"""Lower a verified :class:`~collsynth.algorithm.Algorithm` to an MSCCL++ execution plan.

Each algorithm step becomes, on every rank: the sends (``put`` over memory channels within a
node, ``pwsf`` over port channels across nodes; ``ppkt``/``rppkt`` into the peer's packet
scratch with ``protocol="LL"``), then the waits for what arrives, then the reductions. A value
lands in a fresh scratch slot of the receiver (or directly in its output slot when nothing else
touches that slot), so no rank ever overwrites memory a peer may still read. A rank's
operations run in one chain of threadblocks handed on by semaphores, each within the
executor's 64 operations. Every plan is checked before it is returned. Details:
``docs/mscclpp.md``, section "Exporting algorithms".
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from collsynth._parse import printable_name
from collsynth.algorithm.model import Algorithm
from collsynth.algorithm.verify import verify
from collsynth.errors import ExportError
from collsynth.export.layout import Layout, collective_layout, standard_kind
from collsynth.export.mscclpp.checker import LAYOUT_DIALECT, check_plan, refuse_unless_correct
from collsynth.export.mscclpp.limits import MSCCLPP, PLAN_PROTOCOLS
from collsynth.export.mscclpp.model import (
    BufferRef,
    Channel,
    ChannelGroup,
    GpuPlan,
    Operation,
    Plan,
    RemoteBuffer,
    RemoteBufferRefs,
    Threadblock,
)

__all__ = ["lower_to_plan", "COLLECTIVE_NAMES", "MAX_EXPORT_THREADBLOCKS"]

#: collsynth's standard collectives MSCCL++'s executor runs, and its spelling of each.
COLLECTIVE_NAMES = {"allgather": "allgather", "allreduce": "allreduce",
                    "reduce_scatter": "reducescatter", "alltoall": "alltoall"}
#: Most threadblocks an exported rank may use: every one must be resident at once (the chain
#: waits on semaphores), and an H100 has 132 SMs.
MAX_EXPORT_THREADBLOCKS = 128
# Operations a threadblock spends on the hand-over: sem_acquire + nop, nop + sem_release.
_HANDOVER = 4

_Slot = tuple[str, int]     # ("i" | "o" | "s" | "p", index); "p": an LL packet slot


@dataclass
class _Ref:
    """An operand before threadblocks exist: a slot of this rank, or of ``peer``'s buffer
    reached through ``channel_type``."""

    slot: _Slot
    size: int = 1
    peer: int | None = None


@dataclass
class _Op:
    name: str
    src: list[_Ref] = field(default_factory=list)
    dst: list[_Ref] = field(default_factory=list)
    channel_type: str | None = None
    channels: list[int] = field(default_factory=list)   # the rank's channel indices
    semaphores: list[int] = field(default_factory=list)
    reduce: bool = False


class _Rank:
    """What is lowered for one rank: its peers, scratch and operations."""

    def __init__(self, rank: int, packets: bool) -> None:
        self.rank = rank
        self.packets = packets
        self.ops: list[_Op] = []
        self.plain = 0       # plain scratch slots handed out
        self.packet = 0      # packet scratch slots handed out
        self.memory: list[int] = []
        self.port: list[int] = []
        self.remote: dict[tuple[int, str], int] = {}   # (peer, buffer) -> remote buffer id
        self.remote_types: list[str] = []

    def scratch(self) -> _Slot:
        self.plain += 1
        return ("s", self.plain - 1)

    def packet_slot(self) -> _Slot:
        self.packet += 1
        return ("p", self.packet - 1)

    def channel(self, peer: int) -> tuple[str, int]:
        if peer in self.memory:
            return "memory", self.memory.index(peer)
        return "port", self.port.index(peer)

    def remote_id(self, peer: int, buffer: str, kind: str) -> int:
        key = (peer, buffer)
        if key not in self.remote:
            self.remote[key] = len(self.remote)
            self.remote_types.append(kind)
        return self.remote[key]


def _runs(pairs: list[tuple[_Slot, _Slot]]) -> list[tuple[_Slot, _Slot, int]]:
    """Consecutive (source, destination) slot pairs merged: (first source, first
    destination, count)."""
    runs: list[tuple[_Slot, _Slot, int]] = []
    for s, d in pairs:
        if runs:
            s0, d0, k = runs[-1]
            if s0[0] == s[0] and d0[0] == d[0] and s0[1] + k == s[1] and d0[1] + k == d[1]:
                runs[-1] = (s0, d0, k + 1)
                continue
        runs.append((s, d, 1))
    return runs


def _memory_puts(plan: _Rank, memory: dict[int, list[tuple[_Slot, _Slot]]], kind: str) -> None:
    """Append ``kind`` operations (``put``, or ``ppkt`` in packets) for the sends to each memory
    peer: contiguous runs, grouped by source buffer (an operation reads one buffer type), at
    most ``max_buffers_per_operation`` per operation."""
    by_type: dict[str, list] = defaultdict(list)
    for d, pairs in sorted(memory.items()):
        for s, t, k in _runs(pairs):
            by_type[s[0]].append((d, s, t, k))
    limit = MSCCLPP.max_buffers_per_operation
    for _, group in sorted(by_type.items()):
        for first in range(0, len(group), limit):
            op = _Op(kind, channel_type="memory")
            for d, s, t, k in group[first:first + limit]:
                op.src.append(_Ref(s, k))
                op.dst.append(_Ref(t, k, peer=d))
            plan.ops.append(op)


def _reduce_runs(reduces: list[tuple[_Slot, list[_Slot], _Slot]]
                 ) -> list[tuple[_Slot, list[_Slot], _Slot, int]]:
    """Reductions of consecutive chunks merged when every operand is consecutive too:
    (own value, received values, accumulator, count)."""
    runs: list[tuple[_Slot, list[_Slot], _Slot, int]] = []

    def follows(a: _Slot, b: _Slot, k: int) -> bool:
        return a[0] == b[0] and a[1] + k == b[1]

    for mine, reduced, acc in reduces:
        if runs:
            m0, r0, a0, k = runs[-1]
            if len(r0) == len(reduced) and follows(m0, mine, k) and follows(a0, acc, k) and \
                    all(follows(x, y, k) for x, y in zip(r0, reduced)):
                runs[-1] = (m0, r0, a0, k + 1)
                continue
        runs.append((mine, list(reduced), acc, 1))
    return runs


class _Lowering:
    def __init__(self, algorithm: Algorithm, layout: Layout, protocol: str, inplace: bool,
                 ranks_per_node: int) -> None:
        self.algorithm = algorithm
        self.collective = algorithm.collective
        self.layout = layout
        self.packets = protocol == "LL"
        self.inplace = inplace
        n = self.n = self.collective.num_ranks
        self.rpn = ranks_per_node
        self.ranks = [_Rank(r, self.packets) for r in range(n)]
        self.rows = [[(x.chunk, x.src, x.dst, x.reduce) for x in step.sends]
                     for step in algorithm.steps]
        self.current: dict[tuple[int, int], _Slot] = {}
        for r in range(n):
            for c, loc in layout.sources[r].items():
                self.current[(r, c)] = loc
        receives: dict[tuple[int, int], list[bool]] = defaultdict(list)
        for rows in self.rows:
            for c, _, d, red in rows:
                receives[(d, c)].append(red)
        self.receives = receives
        # In place, a slot that starts as another chunk's input is not free for this one.
        self.sources_at = [{loc: c for c, loc in layout.sources[r].items()} for r in range(n)]

    # -- slots ---------------------------------------------------------------------------------

    def home_free(self, d: int, c: int) -> bool:
        """``d``'s output slot of ``c`` holds nothing else (another chunk's input, in place)."""
        home = self.layout.targets[d].get(c)
        if home is None:
            return False
        other = self.sources_at[d].get(home)
        return other is None or other == c

    def writable(self, d: int, c: int, slot: _Slot) -> bool:
        """Whether ``d`` may overwrite ``slot``, which holds its value of ``c``."""
        if slot[0] in ("s", "p"):
            return slot[0] == "s"
        if not self.inplace:
            return slot[0] == "o"
        home = self.layout.targets[d].get(c)
        own = self.layout.sources[d].get(c)
        return slot in (home, own) and self.sources_at[d].get(slot, c) == c

    def direct(self, d: int, c: int) -> bool:
        """A copy of ``c`` may land straight in ``d``'s output slot: out of place, received
        once, never reduced there."""
        return (not self.inplace and self.layout.targets[d].get(c) is not None
                and self.receives[(d, c)] == [False])

    # -- channels ------------------------------------------------------------------------------

    def connect(self) -> None:
        peers: list[set[int]] = [set() for _ in range(self.n)]
        for rows in self.rows:
            for _, s, d, _ in rows:
                peers[s].add(d)
                peers[d].add(s)
        for r, plan in enumerate(self.ranks):
            for p in sorted(peers[r]):
                (plan.memory if p // self.rpn == r // self.rpn else plan.port).append(p)

    # -- the steps -----------------------------------------------------------------------------

    def run(self) -> None:
        self.connect()
        if not self.packets:
            self.start_barrier()
        for rows in self.rows:
            self.step(rows)
        self.finish()

    def start_barrier(self) -> None:
        """Every rank tells its peers it has started, and waits for theirs: a peer's writes
        into its buffers cannot overtake its previous call."""
        for plan in self.ranks:
            for kind, peers in (("memory", plan.memory), ("port", plan.port)):
                for first in range(0, len(peers), MSCCLPP.max_channels_per_operation):
                    ids = list(range(first, min(len(peers),
                                                first + MSCCLPP.max_channels_per_operation)))
                    plan.ops.append(_Op("rlxsignal", channel_type=kind, channels=ids))
            for kind, peers in (("memory", plan.memory), ("port", plan.port)):
                for first in range(0, len(peers), MSCCLPP.max_channels_per_operation):
                    ids = list(range(first, min(len(peers),
                                                first + MSCCLPP.max_channels_per_operation)))
                    plan.ops.append(_Op("rlxwait", channel_type=kind, channels=ids))
            if plan.memory or plan.port:
                plan.ops.append(_Op("nop"))

    def step(self, rows: list[tuple[int, int, int, bool]]) -> None:
        landing: dict[tuple[int, int, int], _Slot] = {}
        messages: dict[tuple[int, int], list[tuple[_Slot, _Slot]]] = defaultdict(list)
        incoming: dict[tuple[int, int], list[tuple[_Slot, bool]]] = defaultdict(list)
        for c, s, d, red in sorted(rows, key=lambda x: (x[1], x[2], x[0])):
            src_slot = self.current.get((s, c))
            if src_slot is None:
                raise ExportError(f"rank {s} sends chunk {c} before it holds it")
            plan = self.ranks[d]
            if self.packets:
                slot = plan.packet_slot()
            elif not red and self.direct(d, c):
                slot = self.layout.targets[d][c]
            else:
                slot = plan.scratch()
            landing[(c, s, d)] = slot
            messages[(s, d)].append((src_slot, slot))
            incoming[(d, c)].append((slot, red))
        # Sends, on every sender.
        for plan in self.ranks:
            s = plan.rank
            mine = {d: pairs for (ss, d), pairs in messages.items() if ss == s}
            if mine:
                self.sends(plan, mine)
        # Waits, then what each received value does, on every receiver.
        for plan in self.ranks:
            d = plan.rank
            senders = sorted({s for (s, dd) in messages if dd == d})
            if not senders:
                continue
            if not self.packets:
                self.waits(plan, {s: len(_runs(messages[(s, d)])) for s in senders})
            self.updates(plan, {c: got for (dd, c), got in incoming.items() if dd == d})

    def sends(self, plan: _Rank, mine: dict[int, list[tuple[_Slot, _Slot]]]) -> None:
        memory = {d: p for d, p in mine.items() if d in plan.memory}
        port = {d: p for d, p in mine.items() if d in plan.port}
        if self.packets:
            self.packet_sends(plan, memory, port)
            return
        _memory_puts(plan, memory, "put")
        if memory:
            plan.ops.append(_Op("nop"))
            ids = [plan.channel(d)[1] for d in sorted(memory)]
            for first in range(0, len(ids), MSCCLPP.max_channels_per_operation):
                plan.ops.append(_Op("signal", channel_type="memory",
                                    channels=ids[first:first + MSCCLPP.max_channels_per_operation]))
        entries = [(d, s, t, k) for d, pairs in sorted(port.items()) for s, t, k in _runs(pairs)]
        limit = MSCCLPP.max_channels_per_operation
        for first in range(0, len(entries), limit):
            op = _Op("pwsf", channel_type="port")
            for d, s, t, k in entries[first:first + limit]:
                op.src.append(_Ref(s, k))
                op.dst.append(_Ref(t, k, peer=d))
                op.channels.append(plan.channel(d)[1])
            plan.ops.append(op)

    def packet_sends(self, plan: _Rank, memory: dict, port: dict) -> None:
        _memory_puts(plan, memory, "ppkt")
        if not port:
            return
        # Across nodes: pack into local packets, then the proxy copies them as they are.
        staged = []
        for d, pairs in sorted(port.items()):
            for s, t, k in _runs(pairs):
                local = plan.packet_slot()
                for _ in range(k - 1):
                    plan.packet_slot()
                plan.ops.append(_Op("cpkt", src=[_Ref(s, k)], dst=[_Ref(local, k)]))
                staged.append((d, local, t, k))
        plan.ops.append(_Op("nop"))
        for d, local, t, k in staged:
            plan.ops.append(_Op("rppkt", src=[_Ref(local, k)], dst=[_Ref(t, k, peer=d)],
                                channel_type="port", channels=[plan.channel(d)[1]]))

    def waits(self, plan: _Rank, counts: dict[int, int]) -> None:
        """Wait for every signal the senders send this step: one per memory peer, one per
        port transfer; one channel at most once per operation."""
        left = {}
        for s, runs in counts.items():
            kind, ch = plan.channel(s)
            left[(kind, ch)] = 1 if kind == "memory" else runs
        while left:
            for kind in ("memory", "port"):
                ids = sorted(ch for (k, ch) in left if k == kind)
                for first in range(0, len(ids), MSCCLPP.max_channels_per_operation):
                    part = ids[first:first + MSCCLPP.max_channels_per_operation]
                    plan.ops.append(_Op("wait", channel_type=kind, channels=part))
                    for ch in part:
                        left[(kind, ch)] -= 1
            left = {key: v for key, v in left.items() if v > 0}
        plan.ops.append(_Op("nop"))

    def updates(self, plan: _Rank, got: dict[int, list[tuple[_Slot, bool]]]) -> None:
        d = plan.rank
        copies: list[tuple[_Slot, _Slot]] = []
        reduces: list[tuple[_Slot, list[_Slot], _Slot]] = []
        for c, arrivals in sorted(got.items()):
            reduced = [slot for slot, red in arrivals if red]
            kept = [slot for slot, red in arrivals if not red]
            if kept and (reduced or len(kept) > 1):
                raise ExportError(f"rank {d} receives chunk {c} as a copy together with other "
                                  "values in one step; the result would depend on their order")
            if kept:
                if self.packets:
                    home = self.layout.targets[d].get(c)
                    dst = home if home is not None and self.home_free(d, c) else plan.scratch()
                    copies.append((kept[0], dst))
                    self.current[(d, c)] = dst
                else:
                    self.current[(d, c)] = kept[0]
                continue
            mine = self.current.get((d, c))
            if mine is None:
                raise ExportError(f"rank {d} reduces chunk {c} into a value it does not hold")
            if self.writable(d, c, mine):
                acc = mine
            elif self.home_free(d, c) and self.layout.targets[d].get(c) != mine:
                acc = self.layout.targets[d][c]
            else:
                acc = plan.scratch()
            reduces.append((mine, reduced, acc))
            self.current[(d, c)] = acc
        for s, t, k in _runs(copies):
            plan.ops.append(_Op("upkt", src=[_Ref(s, k)], dst=[_Ref(t, k)]))
        name = "repkt" if self.packets else "re"
        per_op = MSCCLPP.max_buffers_per_operation - 1
        for mine, reduced, acc, k in _reduce_runs(reduces):
            # At most 10 sources per operation: fold the rest into the accumulator (the same
            # range, so the same threads: no nop needed between).
            for first in range(0, len(reduced), per_op):
                base = mine if first == 0 else acc
                plan.ops.append(_Op(name, src=[_Ref(base, k)] + [
                    _Ref(x, k) for x in reduced[first:first + per_op]], dst=[_Ref(acc, k)],
                    reduce=True))
        if copies or reduces:
            plan.ops.append(_Op("nop"))

    def finish(self) -> None:
        """Copy every value that is not in its output slot there, in waves that never
        overwrite a slot a later copy still reads."""
        for plan in self.ranks:
            d = plan.rank
            pending = {}
            for c, home in self.layout.targets[d].items():
                now = self.current.get((d, c))
                if now is None:
                    raise ExportError(f"rank {d} never receives chunk {c}")
                if now != home:
                    pending[home] = now
            while pending:
                read = set(pending.values())
                wave = sorted((s, t) for t, s in pending.items() if t not in read)
                if not wave:   # a cycle (in place): move one value aside first
                    t, s = next(iter(sorted(pending.items())))
                    aside = plan.scratch()
                    plan.ops.append(_Op("copy", src=[_Ref(s)], dst=[_Ref(aside)]))
                    plan.ops.append(_Op("nop"))
                    pending[t] = aside
                    continue
                for s, t, k in _runs(wave):
                    plan.ops.append(_Op("copy", src=[_Ref(s, k)], dst=[_Ref(t, k)]))
                plan.ops.append(_Op("nop"))
                for s, t in wave:
                    del pending[t]


# -- assembling threadblocks ---------------------------------------------------------------------


def _scratch_index(plan: _Rank, slot: _Slot, packets: bool) -> int:
    """The scratch chunk index of a slot: packet slots first, plain slots after them (a
    packet takes two chunks' bytes)."""
    if slot[0] == "p":
        return slot[1]
    return (2 * plan.packet + slot[1]) if packets else slot[1]


class _Assembler:
    """Cut a rank's operations into a chain of threadblocks within the executor's limits."""

    def __init__(self, plan: _Rank, packets: bool) -> None:
        self.plan = plan
        self.packets = packets

    def ref(self, ref: _Ref, op: _Op, remote_ids: list[int]) -> BufferRef:
        kind, index = ref.slot
        if kind in ("s", "p"):
            kind, index = "s", _scratch_index(self.plan, ref.slot, self.packets)
        if ref.peer is None:
            return BufferRef(index, ref.size, type=kind)
        bid = self.plan.remote_id(ref.peer, kind, op.channel_type)
        return BufferRef(index, ref.size, buffer_id=remote_ids.index(bid))

    def usage(self, op: _Op) -> tuple[set, set]:
        chans = {(op.channel_type, c) for c in op.channels}
        remote = {(op.channel_type, self.plan.remote_id(r.peer, "s" if r.slot[0] in ("s", "p")
                                                         else r.slot[0], op.channel_type))
                  for r in op.src + op.dst if r.peer is not None}
        return chans, remote

    def threadblocks(self) -> list[Threadblock]:
        ops = self.plan.ops
        budget = MSCCLPP.max_operations_per_threadblock - _HANDOVER
        groups: list[tuple[list[_Op], set, set]] = []
        cur: list[_Op] = []
        chans: set = set()
        remote: set = set()
        for op in ops:
            c, r = self.usage(op)
            new_c, new_r = chans | c, remote | r
            over = any(sum(1 for t, _ in new_c if t == kind) > MSCCLPP.max_channels_per_threadblock
                       or sum(1 for t, _ in new_r if t == kind)
                       > MSCCLPP.max_remote_buffers_per_threadblock
                       for kind in ("memory", "port"))
            if cur and (len(cur) >= budget or over):
                groups.append((cur, chans, remote))
                cur, chans, remote = [], set(), set()
                new_c, new_r = c, r
            cur.append(op)
            chans, remote = new_c, new_r
        if cur or not groups:
            groups.append((cur, chans, remote))
        if len(groups) > MAX_EXPORT_THREADBLOCKS:
            raise ExportError(f"rank {self.plan.rank} needs {len(groups)} threadblocks of "
                              f"{MSCCLPP.max_operations_per_threadblock} operations; an exported "
                              f"plan uses at most {MAX_EXPORT_THREADBLOCKS}")
        tbs = []
        for t, (group, chans, remote) in enumerate(groups):
            tbs.append(self.threadblock(t, len(groups), group, chans, remote))
        return tbs

    def threadblock(self, t: int, count: int, ops: list[_Op], chans: set, remote: set
                    ) -> Threadblock:
        tables = {kind: sorted(c for k, c in chans if k == kind) for kind in ("memory", "port")}
        remote_ids = {kind: sorted(b for k, b in remote if k == kind)
                      for kind in ("memory", "port")}
        body: list[Operation] = []
        if t > 0:
            body += [Operation("sem_acquire", semaphore_ids=(t - 1,)), Operation("nop")]
        for op in ops:
            ids = tuple(tables[op.channel_type].index(c) for c in op.channels) \
                if op.channel_type in tables else ()
            ids_remote = remote_ids.get(op.channel_type or "", [])
            body.append(Operation(
                op.name, src=tuple(self.ref(r, op, ids_remote) for r in op.src),
                dst=tuple(self.ref(r, op, ids_remote) for r in op.dst),
                channel_type=op.channel_type if (op.channels or any(
                    r.peer is not None for r in op.src + op.dst)) else None,
                channel_ids=ids if op.name not in ("put", "ppkt") or
                op.channel_type == "port" else (),
                reduce_op="sum" if op.reduce else None))
        if t < count - 1:
            body += [Operation("nop"), Operation("sem_release", semaphore_ids=(t,))]
        groups = tuple(ChannelGroup(kind, tuple(ids)) for kind, ids in tables.items() if ids)
        refs = tuple(RemoteBufferRefs(kind, tuple(ids)) for kind, ids in remote_ids.items()
                     if ids)
        return Threadblock(t, tuple(body), groups, refs)


def _buffer_chunks(kind: str, n: int, C: int) -> tuple[int, int]:
    return {"allgather": (C, n * C), "allreduce": (C, C), "reduce_scatter": (n * C, C),
            "alltoall": (n * C, n * C)}[kind]


def lower_to_plan(algorithm: Algorithm, *, protocol: str = "Simple", inplace: bool = False,
                  min_message_size: int = 0, max_message_size: int | None = None,
                  name: str | None = None, ranks_per_node: int | None = None,
                  num_threads_per_block: int = MSCCLPP.default_threads_per_block) -> Plan:
    """The MSCCL++ execution plan of ``algorithm``, checked (``docs/mscclpp.md``).

    Parameters
    ----------
    algorithm:
        A verified algorithm (verified again here) of an allgather, allreduce,
        reduce-scatter or alltoall.
    protocol:
        ``"Simple"`` (puts and signals) or ``"LL"`` (packets with flags, no signals).
    inplace:
        For in-place calls (the input inside the output as the collective lays it out).
    min_message_size, max_message_size:
        Message sizes (bytes, inclusive) the plan is selected for; ``None``: unbounded.
    ranks_per_node:
        Ranks per node (default: the topology's node layout, else all ranks in one node):
        memory channels inside a node, port channels between nodes.

    Raises
    ------
    ExportError
        A collective MSCCL++ has no plan for, an unknown protocol, a plan beyond the
        executor's limits, or (a bug) a plan that fails the check.
    VerificationError
        When ``algorithm`` is not correct.

    Examples
    --------
    >>> from collsynth.algorithm import Algorithm, Send, Step
    >>> from collsynth.collective import allgather
    >>> from collsynth.topology import get_topology
    >>> ring = Algorithm("ag", get_topology("ring:3"), allgather(3),
    ...                  (Step(1, tuple(Send(r, r, (r + 1) % 3) for r in range(3))),
    ...                   Step(1, tuple(Send(r, (r + 1) % 3, (r + 2) % 3) for r in range(3)))))
    >>> plan = lower_to_plan(ring)
    >>> plan.collective, [g.output_chunks for g in plan.gpus]
    ('allgather', [3, 3, 3])
    """
    if protocol not in PLAN_PROTOCOLS:
        raise ExportError(f"protocol {protocol!r}; MSCCL++ plans use {', '.join(PLAN_PROTOCOLS)}")
    top = MSCCLPP.max_message_bytes if max_message_size is None else max_message_size
    if not 0 <= min_message_size <= top <= MSCCLPP.max_message_bytes:
        raise ExportError(f"message sizes {min_message_size}..{top}: expected 0 <= min <= max "
                          f"<= {MSCCLPP.max_message_bytes}")
    kind = standard_kind(algorithm.collective)
    if kind not in COLLECTIVE_NAMES:
        raise ExportError(f"MSCCL++'s executor runs {', '.join(COLLECTIVE_NAMES)} plans; "
                          f"{algorithm.collective.describe()} has none")
    verify(algorithm)
    collective = algorithm.collective
    n = collective.num_ranks
    if ranks_per_node is None:
        layout_nodes = algorithm.topology.layout
        ranks_per_node = layout_nodes.ranks_per_node if layout_nodes is not None else n
    layout = collective_layout(collective, LAYOUT_DIALECT, inplace=inplace)
    lowering = _Lowering(algorithm, layout, protocol, inplace, ranks_per_node)
    lowering.run()
    packets = protocol == "LL"
    ins, outs = _buffer_chunks(kind, n, collective.chunk_factor)
    gpus = []
    for plan in lowering.ranks:
        tbs = _Assembler(plan, packets).threadblocks()
        channels = tuple(Channel(kind_, tuple(peers))
                         for kind_, peers in (("memory", plan.memory), ("port", plan.port))
                         if peers)
        remote = tuple(RemoteBuffer(peer, buf, (plan.remote_types[bid],))
                       for (peer, buf), bid in sorted(plan.remote.items(), key=lambda x: x[1]))
        scratch = (plan.packet + -(-plan.plain // 2)) if packets else plan.plain
        gpus.append(GpuPlan(plan.rank, ins, outs, scratch, tuple(tbs), channels, remote,
                            tuple(0 for _ in range(len(tbs) - 1))))
    # a name the plan reader (and MSCCL++'s JSON loader) takes as it is: printable, <= 255
    result = Plan(name=printable_name(name or algorithm.name), collective=COLLECTIVE_NAMES[kind],
                  protocol=protocol, inplace=inplace, gpus=tuple(gpus),
                  num_threads_per_block=num_threads_per_block,
                  use_double_scratch_buffer=packets, min_message_size=min_message_size,
                  max_message_size=top)
    report = check_plan(result, collective=collective, ranks_per_node=ranks_per_node,
                        strict=True)
    refuse_unless_correct(report, f"the plan of {algorithm.name!r}")
    return result
