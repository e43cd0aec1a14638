"""Lower a verified :class:`~collsynth.algorithm.Algorithm` to an MSCCL :class:`Program`.

The details (formats, conventions, rules) are in docs/export.md; section numbers (§) refer to
docs/msccl-xml.md.
"""

from __future__ import annotations

import gc
import heapq
import re
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator, Sequence

import numpy as np

from collsynth.algorithm.model import Algorithm
from collsynth.algorithm.verify import verify
from collsynth.errors import ExportError
from collsynth.export.layout import Layout, Loc, collective_layout
from collsynth.export.limits import (CHANNEL_POLICIES, channel_of, estimate_limits,
                                     find_limit_violations, limit_error)
from collsynth.export.program import GpuProgram, Program, ThreadBlock, XmlStep
from collsynth.runtimes import PROTOCOLS, Runtime, XmlDialect, xml_dialect

__all__ = ["lower", "check_limits", "MAX_NODES", "max_bytes_attribute"]

#: Reader limit: nodes kept for the loading rank (§2.5).
MAX_NODES = 4096
_NAME_CHARS = re.compile(r"[^A-Za-z0-9_.,:;=+()\[\]-]")


#: The largest minBytes / maxBytes attribute the runtimes read (strtol: a signed 64-bit number).
_MAX_XML_BYTES = (1 << 63) - 1

# A threadblock of one rank before numbering: (send peer, recv peer, channel).
_TbKey = tuple[int, int, int]
_LOCAL_TB: _TbKey = (-1, -1, 0)


def max_bytes_attribute(runtime: Runtime | str, max_bytes: int | None) -> int | None:
    """The ``maxBytes`` attribute for an *inclusive* upper bound ``max_bytes`` (``None``:
    unlimited).

    msccl compares ``nBytes < maxBytes`` (exclusive), so ``B`` is written as ``B + 1``, and
    "unlimited" is not expressible: the attribute is omitted (msccl's default, 128 MiB, applies).
    rccl and msccl-executor compare ``nBytes <= maxBytes`` and read 0 as unlimited.
    """
    rt = xml_dialect(runtime)
    if rt.max_bytes_zero_is_unlimited:
        return 0 if max_bytes is None else max_bytes
    return None if max_bytes is None else max_bytes + 1


def lower(algorithm: Algorithm, *, runtime: str, proto: str = "Simple", channels: int = 1,
          instances: int = 1, inplace: bool = False, outofplace: bool = True,
          min_bytes: int | None = None, max_bytes: int | None = None,
          name: str | None = None, channel_by: str = "chunk") -> Program:
    """The MSCCL program of ``algorithm`` for ``runtime`` (``msccl``, ``rccl``, ``msccl-executor``).

    Parameters
    ----------
    algorithm:
        A verified algorithm (it is verified again here).
    runtime:
        Target runtime; decides the ``coll`` spelling, required attributes, fused ops, limits.
    proto:
        ``Simple``, ``LL`` or ``LL128``.
    channels:
        Channels to spread connections over.
    channel_by:
        ``"chunk"`` (chunk ``c`` uses channel ``c % channels``), ``"block"`` (chunk ``c`` uses
        channel ``(c // 71) % channels``, keeping merged messages whole) or ``"peer"`` (the pair
        ``s -> d`` uses channel ``((d - s) mod n) % channels``, spreading a rank's peers), see
        :func:`~collsynth.export.limits.channel_of`.
    instances:
        Parallel copies of the schedule, each on a ``1/instances`` slice of every chunk.
    inplace, outofplace:
        The layouts the program must be correct for. Default out of place. Both at once only
        for rccl/msccl-executor (which can declare both); the program is then built so that it
        is correct in both layouts.
    min_bytes, max_bytes:
        Message sizes (bytes, both *inclusive*) the algorithm is selected for; ``None``: from
        0 / unlimited. See :func:`max_bytes_attribute` for how ``max_bytes`` is written.
    name:
        The ``name`` attribute (default: the algorithm's name), made safe for the reader.

    Raises
    ------
    ExportError
        When the runtime cannot express the collective or the program exceeds some of its
        limits: the message names every exceeded limit, the worst place and by how much, and
        the error's ``violations`` attribute lists them
        (:class:`~collsynth.export.limits.LimitViolation`). Limits the program would certainly
        exceed are found from the sends before anything is lowered
        (:func:`~collsynth.export.limits.estimate_limits`).
    VerificationError
        When ``algorithm`` is not correct.

    Examples
    --------
    An allgather on a 3-rank ring, lowered for rccl:

    >>> from collsynth.algorithm import Algorithm, Send, Step
    >>> from collsynth.collective import allgather
    >>> from collsynth.topology import get_topology
    >>> ring = Algorithm("ag", get_topology("ring:3"), allgather(3),
    ...                  (Step(1, tuple(Send(r, r, (r + 1) % 3) for r in range(3))),
    ...                   Step(1, tuple(Send(r, (r + 1) % 3, (r + 2) % 3) for r in range(3)))))
    >>> program = lower(ring, runtime="rccl")
    >>> program.coll, program.nchunksperloop, program.min_bytes, program.max_bytes
    ('allgather', 3, 0, 0)
    >>> from collsynth.export.stats import program_stats
    >>> stats = program_stats(program)
    >>> stats.threadblocks, stats.max_steps_per_threadblock, stats.scratch_chunks
    ((2, 2, 2), 4, (0, 0, 0))
    """
    rt = xml_dialect(runtime)
    _check_options(rt, proto, channels, instances, inplace, outofplace, min_bytes, max_bytes)
    # Limits the program will certainly exceed, from the sends alone: refuse before the work.
    if channel_by not in CHANNEL_POLICIES:
        raise ExportError(f"channel_by = {channel_by!r}; expected one of "
                          f"{', '.join(CHANNEL_POLICIES)}")
    violations = estimate_limits(algorithm, rt.name, channels=channels, instances=instances,
                                 inplace=inplace, outofplace=outofplace, channel_by=channel_by)
    if violations:
        raise limit_error(violations, f"the {rt.name} program of {algorithm.name!r}",
                          before_lowering=True)
    verify(algorithm)
    dual = inplace and outofplace
    layout = collective_layout(algorithm.collective, rt.name, inplace=inplace and not outofplace)
    if dual:
        # The in-place reading of the same program: check the runtime can express it.
        collective_layout(algorithm.collective, rt.name, inplace=True)
    ranks = [_RankPlan(q) for q in range(algorithm.topology.num_ranks)]
    with _collector_paused():
        _Lowering(algorithm, rt, layout, dual, channels, ranks, merge=instances == 1,
                  channel_by=channel_by).run()
        # Channels are numbered compactly; instance k uses the block after instance k - 1's.
        chan_index = {ch: i for i, ch in enumerate(sorted({tb[2] for plan in ranks
                                                           for tb in plan.placed
                                                           if tb != _LOCAL_TB}))} or {0: 0}
        gpus = tuple(_assemble_gpu(plan, layout, instances, chan_index) for plan in ranks)
        used = sorted({tb.chan for g in gpus for tb in g.threadblocks})
        nchannels = max(used, default=0) + 1
        title = _safe_name(algorithm.name if name is None else name, rt, layout.kind)
        max_attr = max_bytes_attribute(rt, max_bytes)
        if rt.requires_range_attributes:  # rccl, msccl-executor: all three required
            out_flag: int | None = int(outofplace)
            min_attr = 0 if min_bytes is None else min_bytes
        else:  # msccl: outofplace ignored; byte range optional (written when asked for)
            out_flag = None
            min_attr = 0 if min_bytes is None and max_attr is not None else min_bytes
        program = Program(
            name=title, proto=proto, nchannels=nchannels,
            nchunksperloop=layout.nchunksperloop * instances, ngpus=len(gpus), coll=layout.coll,
            inplace=int(inplace), gpus=gpus, outofplace=out_flag, min_bytes=min_attr,
            max_bytes=max_attr)
        check_limits(program, rt)
        return program


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector. Lowering allocates millions of small objects
    that live until it ends and form no cycles; the collector would traverse them again and
    again (40% of the time at 500,000 steps). It is re-enabled afterwards if it was on."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def check_limits(program: Program, runtime: Runtime | str) -> None:
    """Raise :class:`ExportError` naming every runtime limit ``program`` exceeds, with the
    worst place and by how much (:func:`collsynth.export.limits.find_limit_violations`)."""
    rt = xml_dialect(runtime)
    violations = find_limit_violations(program, rt.name)
    if violations:
        raise limit_error(violations, f"the {rt.name} program")


# -- options ----------------------------------------------------------------------------------


def _check_options(rt: XmlDialect, proto: str, channels: int, instances: int, inplace: bool,
                   outofplace: bool, min_bytes: int | None, max_bytes: int | None) -> None:
    if proto not in PROTOCOLS:
        raise ExportError(f"protocol {proto!r}; the runtimes accept {', '.join(PROTOCOLS)} "
                          "(case sensitive)")
    for label, value in (("channels", channels), ("instances", instances)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ExportError(f"{label} = {value!r}; expected a whole number >= 1")
    if not (inplace or outofplace):
        raise ExportError("an algorithm must be exported for in-place calls, out-of-place calls "
                          "or both")
    if inplace and outofplace and not rt.requires_range_attributes:
        raise ExportError(f"{rt.name} selects an algorithm for one layout only (its 'inplace' "
                          "attribute); export an in-place and an out-of-place file")
    for label, value in (("min_bytes", min_bytes), ("max_bytes", max_bytes)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                                  or value < 0):
            raise ExportError(f"{label} = {value!r}; expected bytes >= 0")
    # The runtimes read minBytes and maxBytes with strtol: a signed 64-bit number.
    for label, value, written in (("min_bytes", min_bytes, min_bytes),
                                  ("max_bytes", max_bytes, max_bytes_attribute(rt, max_bytes))):
        if value is not None and written is not None and written > _MAX_XML_BYTES:
            largest = _MAX_XML_BYTES - (written - value)
            hint = "; leave it out for no upper bound" if label == "max_bytes" else ""
            raise ExportError(f"{label} = {value} is above {largest}, the most {rt.name}'s XML "
                              f"reader takes (a signed 64-bit number){hint}")
    if max_bytes is not None:
        if max_bytes < (min_bytes or 0):
            raise ExportError(f"max_bytes = {max_bytes} is below min_bytes = {min_bytes}")
        if max_bytes == 0:
            raise ExportError("max_bytes = 0 selects no call (and 0 means 'unlimited' to rccl); "
                              "leave it out for no upper bound")


def _safe_name(text: str, rt: XmlDialect, kind: str) -> str:
    """A name the reader keeps intact: no quotes, spaces or markup; at most 63 characters for
    msccl (its limit) and 254 otherwise (the reader's)."""
    safe = _NAME_CHARS.sub("_", text.strip()) or "collsynth"
    safe = safe[:63] if rt.name == "msccl" else safe[:254]
    if rt.name == "msccl" and kind == "alltoall" and safe == "2D":
        raise ExportError("msccl runs a built-in 2-D alltoall for an alltoall named '2D' instead "
                          "of the program; choose another name")
    return safe


# -- the lowering -------------------------------------------------------------------------------

# A virtual slot: an i/o slot ("i", k) / ("o", k), or a scratch value ("v", id) that is given a
# scratch index once all lifetimes are known.
_VSlot = tuple[str, int]


@dataclass(eq=False, slots=True)
class _Op:
    """One step before positions are known."""

    rank: int
    tb: _TbKey
    type: str
    src: _VSlot
    dst: _VSlot
    t: int                      # algorithm step; -1 before the first, T after the last
    phase: int                  # 0: reads of step t (sends), 1: writes of step t
    order: tuple                # order among the ops of the same (t, phase) on the rank
    reads: tuple[_VSlot, ...] = ()
    writes: tuple[_VSlot, ...] = ()
    war: bool = False           # a send whose value is overwritten in the same step
    cnt: int = 1                # consecutive slots from src / dst (merged messages)
    deps: Sequence["_Op"] = ()  # steps of other threadblocks this one waits for
    # placement
    pos: int = -1
    hasdep: int = 0
    depid: _TbKey | None = None
    deps_pos: int = -1


@dataclass
class _RankPlan:
    """Everything lowered for one rank: its ops by threadblock, then the placed steps."""

    rank: int
    ops: list[_Op] = field(default_factory=list)
    tb_of_send: dict[tuple[int, int], _TbKey] = field(default_factory=dict)  # (peer, ch)
    tb_of_recv: dict[tuple[int, int], _TbKey] = field(default_factory=dict)
    scratch: dict[int, int] = field(default_factory=dict)  # virtual id -> scratch index
    s_chunks: int = 0
    placed: dict[_TbKey, list] = field(default_factory=dict)  # tb -> [_Op | nop record]


def _same_slot(rank: int, loc: Loc) -> Loc:
    return loc


def _rows(sends: Sequence) -> list[tuple[int, int, int, bool]]:
    """One step's sends as (chunk, src, dst, reduce) tuples, from the arrays of an
    array-backed sequence (:class:`~collsynth.algorithm.arrays.SendBlock`) when it has them."""
    columns = [getattr(sends, name, None) for name in ("chunk", "src", "dst", "reduce")]
    if all(isinstance(column, np.ndarray) for column in columns):
        return list(zip(*(column.tolist() for column in columns)))
    return [(x.chunk, x.src, x.dst, x.reduce) for x in sends]


class _Lowering:
    """One lowering: threadblocks, ops per rank, scratch, merged messages, dependencies and
    positions, in that order (see docs/export.md).

    Every phase is linear in the number of sends (up to sorting and per-rank dictionaries), so
    that algorithms with hundreds of thousands of sends lower in seconds.
    """

    def __init__(self, algorithm: Algorithm, rt: XmlDialect, layout: Layout, dual: bool,
                 channels: int, ranks: list[_RankPlan], merge: bool,
                 channel_by: str = "chunk") -> None:
        self.algorithm = algorithm
        self.channel_by = channel_by
        self.merge = merge
        # Messages merged into one step: at most cnt < max_count chunks.
        self.max_merge = rt.max_count - 1
        # (send op, receive ops) of every algorithm send, and the local copies, for merging.
        self.messages: list[tuple[_Op, list[_Op]]] = []
        self.local_copies: list[_Op] = []
        self.collective = algorithm.collective
        self.rt = rt
        self.layout = layout
        self.dual = dual
        self.channels = channels
        self.ranks = ranks
        self.T = algorithm.num_steps
        self._next_virtual = 0
        self.lifetime: dict[int, list[int]] = {}   # virtual id -> [first t, last t]
        # The memory a slot is: in dual mode, slots that alias in place are one.
        self.key = self._aliased if dual else _same_slot
        # Every step's sends as (chunk, src, dst, reduce), read once.
        self.rows: list[list[tuple[int, int, int, bool]]] = [
            _rows(step.sends) for step in algorithm.steps]

    # slots ---------------------------------------------------------------------------------
    def _aliased(self, rank: int, loc: Loc) -> Loc:
        return loc if loc[0] == "v" else self.layout.in_place_slot(rank, loc)

    def virtual(self) -> _VSlot:
        self._next_virtual += 1
        return ("v", self._next_virtual)

    def run(self) -> None:
        self.assign_threadblocks()
        self.build_ops()
        self.rows = []
        for plan in self.ranks:
            self.allocate_scratch(plan)
        if self.merge:
            self.merge_messages()
        self.messages, self.local_copies = [], []
        for plan in self.ranks:
            self.add_dependencies(plan)
            self.place(plan)
            plan.ops = []

    # threadblocks ------------------------------------------------------------------------
    def channel(self, chunk: int, src: int, dst: int) -> int:
        return channel_of(chunk, src, dst, len(self.ranks), self.channels, self.channel_by,
                          self.rt.max_count - 1)

    def assign_threadblocks(self) -> None:
        n = len(self.ranks)
        sends: list[set[tuple[int, int]]] = [set() for _ in range(n)]
        recvs: list[set[tuple[int, int]]] = [set() for _ in range(n)]
        for rows in self.rows:
            for c, s, d, _ in rows:
                ch = self.channel(c, s, d)
                sends[s].add((d, ch))
                recvs[d].add((s, ch))
        for plan in self.ranks:
            q = plan.rank
            out_by: dict[int, list[int]] = defaultdict(list)
            in_by: dict[int, list[int]] = defaultdict(list)
            for p, ch in sends[q]:
                out_by[ch].append(p)
            for p, ch in recvs[q]:
                in_by[ch].append(p)
            for ch in sorted(out_by.keys() | in_by.keys()):
                out = sorted(out_by.get(ch, ()))
                inn = sorted(in_by.get(ch, ()))
                out_set, in_set = set(out), set(inn)
                both = [p for p in out if p in in_set]
                out_only = [p for p in out if p not in in_set]
                in_only = [p for p in inn if p not in out_set]
                pairs = [(p, p) for p in both]
                pairs += list(zip(out_only, in_only))
                k = min(len(out_only), len(in_only))
                pairs += [(p, -1) for p in out_only[k:]] + [(-1, p) for p in in_only[k:]]
                for s, r in pairs:
                    if s >= 0:
                        plan.tb_of_send[(s, ch)] = (s, r, ch)
                    if r >= 0:
                        plan.tb_of_recv[(r, ch)] = (s, r, ch)

    # ops ------------------------------------------------------------------------------------
    def build_ops(self) -> None:
        col, layout = self.collective, self.layout
        n = col.num_ranks
        N = col.num_chunks       # (rank q, chunk c) is the key q * N + c below
        fused = self.rt.fused_ops
        T = self.T
        key = self.key
        ranks = self.ranks
        lifetime = self.lifetime
        # Keys of the slots where some chunk starts, per rank: key -> chunk.
        init_keys = [{key(q, loc): c for c, loc in layout.sources[q].items()}
                     for q in range(n)]
        parked: dict[int, bool] = {}
        store: dict[int, _VSlot] = {}
        # current[q * N + c]: the slot holding q's value of c now ("init" slot or store slot).
        current: dict[int, _VSlot] = {}
        stored: set[int] = set()
        # When each (rank, chunk) first receives, and the last step that reads its input.
        first_recv: dict[int, int] = {}
        for t, rows in enumerate(self.rows):
            for c, _, d, _ in rows:
                first_recv.setdefault(d * N + c, t)
        last_input_read: dict[int, int] = {}
        for t, rows in enumerate(self.rows):
            for c, s, d, red in rows:
                if t <= first_recv.get(s * N + c, T):
                    last_input_read[s * N + c] = t
                if red and first_recv[d * N + c] == t:
                    last_input_read[d * N + c] = t
        for q in range(n):
            base = q * N
            for c, loc in layout.sources[q].items():
                current[base + c] = loc
            keys = init_keys[q]
            for c, home in layout.targets[q].items():
                # In place, home may hold another chunk's input: assemble the value in scratch
                # unless that input is read for the last time no later than the first receive.
                other = keys.get(key(q, home))
                parked[base + c] = other is not None and other != c and (
                    base + c not in first_recv
                    or last_input_read.get(base + other, -1) > first_recv[base + c])

        def store_slot(q: int, c: int) -> _VSlot:
            slot = store.get(q * N + c)
            if slot is None:
                home = layout.target(q, c)
                slot = store[q * N + c] = home if home is not None and not parked[q * N + c] \
                    else self.virtual()
            return slot

        def emit(q: int, tb: _TbKey, op_type: str, src: _VSlot, dst: _VSlot, t: int,
                 phase: int, order: tuple, reads=(), writes=(), war=False) -> _Op:
            op = _Op(q, tb, op_type, src, dst, t, phase, order, reads, writes, war)
            ranks[q].ops.append(op)
            if tb is _LOCAL_TB:
                self.local_copies.append(op)
            for slots in (reads, writes):
                for slot in slots:
                    if slot[0] == "v":
                        life = lifetime.get(slot[1])
                        if life is None:
                            lifetime[slot[1]] = [t, t]
                        elif t < life[0]:
                            life[0] = t
                        elif t > life[1]:
                            life[1] = t
            return op

        temps: dict[tuple[int, _TbKey, int], _VSlot] = {}
        for t, rows in enumerate(self.rows):
            # Sends whose slot is overwritten in this step go first (write after read).
            written: dict[int, set] = defaultdict(set)
            for c, _, d, _ in rows:
                written[d].add(key(d, store_slot(d, c)))
            conn: list[tuple] = []
            sent: list[_Op] = []
            arrival: list[tuple] = []    # the order receives are emitted in
            for c, s, d, _ in rows:
                loc = current[s * N + c]
                war = key(s, loc) in written[s]
                order = (0 if war else 1, c)
                conn.append(order)
                arrival.append((d, s, order))
                tb = ranks[s].tb_of_send[(d, self.channel(c, s, d))]
                sent.append(emit(s, tb, "s", loc, loc, t, 0, (d,) + order, reads=(loc,),
                                 war=war))
            for i in sorted(range(len(rows)), key=arrival.__getitem__):
                c, s, q, red = rows[i]
                plan = ranks[q]
                tb = plan.tb_of_recv[(s, self.channel(c, s, q))]
                order = (s,) + conn[i]
                here = q * N + c
                now = current.get(here)
                slot = store_slot(q, c)
                emitted = len(plan.ops)
                if not red or now is None:
                    emit(q, tb, "r", slot, slot, t, 1, order + (0,), writes=(slot,))
                elif fused:
                    # DST <- IN + SRC with SRC the local operand: the own contribution
                    # (still in the input) the first time, the accumulator afterwards.
                    emit(q, tb, "rrc", now, slot, t, 1, order + (1,), reads=(now,),
                         writes=(slot,))
                elif now != slot and key(q, now) != key(q, slot):
                    # Receive into the accumulator, then add the own contribution.
                    emit(q, tb, "r", slot, slot, t, 1, order + (1,), writes=(slot,))
                    emit(q, tb, "re", now, slot, t, 1, order + (2,), reads=(now, slot),
                         writes=(slot,))
                else:
                    if now != slot:  # same memory in place: copy, a no-op in place
                        emit(q, tb, "cpy", now, slot, t, 1, order + (0,), reads=(now,),
                             writes=(slot,))
                    # One receive buffer per message when messages may merge (consecutive
                    # buffers for consecutive messages), else one per threadblock and step.
                    temp = None if self.merge else temps.get((q, tb, t))
                    if temp is None:
                        temp = temps[(q, tb, t)] = self.virtual()
                    emit(q, tb, "r", temp, temp, t, 1, order + (1,), writes=(temp,))
                    emit(q, tb, "re", temp, slot, t, 1, order + (2,), reads=(temp, slot),
                         writes=(slot,))
                current[here] = slot
                stored.add(here)
                self.messages.append((sent[i], plan.ops[emitted:]))
        # Values not yet at home: local copies at the start (when home is free) or the end.
        for q in range(n):
            targets = layout.targets[q]
            for c in sorted(targets):
                home = targets[c]
                here = q * N + c
                if here in stored:
                    slot = store[here]
                    if slot != home:
                        emit(q, _LOCAL_TB, "cpy", slot, home, T, 1, (c,), reads=(slot,),
                             writes=(home,))
                    continue
                init = layout.source(q, c)
                if init is None:  # pragma: no cover - verify() guarantees it
                    raise ExportError(f"rank {q} never holds chunk {c}")
                if init == home:
                    continue
                if parked[here]:
                    temp = self.virtual()
                    emit(q, _LOCAL_TB, "cpy", init, temp, -1, 1, (c,), reads=(init,),
                         writes=(temp,))
                    emit(q, _LOCAL_TB, "cpy", temp, home, T, 1, (c,), reads=(temp,),
                         writes=(home,))
                else:
                    emit(q, _LOCAL_TB, "cpy", init, home, -1, 1, (c,), reads=(init,),
                         writes=(home,))

    # scratch ------------------------------------------------------------------------------
    def allocate_scratch(self, plan: _RankPlan) -> None:
        """Give every virtual slot a scratch index; an index is reused from the step after the
        last step that touched its previous value. The slots a threadblock starts using in one
        step get consecutive indices, in the order of the steps that first touch them, so that
        messages into consecutive slots can merge (see :meth:`merge_messages`): the block of
        free indices starting where the threadblock's last block started, else the first free
        block, else new indices. A single slot takes the index the threadblock used last when
        it is free, else the smallest free one."""
        virtuals: dict[int, tuple[_TbKey, tuple]] = {}
        for op in plan.ops:
            for slot in (*op.reads, *op.writes):
                if slot[0] == "v" and slot[1] not in virtuals:
                    virtuals[slot[1]] = (op.tb, (op.t, op.phase, op.order))
        if not virtuals:
            return
        by_start: dict[int, list[int]] = defaultdict(list)
        for vid in virtuals:
            by_start[self.lifetime[vid][0]].append(vid)
        free: set[int] = set()          # indices whose value is dead
        free_heap: list[int] = []       # the same, lazily: may hold indices taken since
        busy: list[tuple[int, int]] = []   # heap of (last step of its value, index)
        last_of_tb: dict[_TbKey, int] = {}

        def take(index: int, vid: int, tb: _TbKey) -> None:
            free.discard(index)
            heapq.heappush(busy, (self.lifetime[vid][1], index))
            plan.scratch[vid] = index

        for t in sorted(by_start):
            while busy and busy[0][0] < t:
                index = heapq.heappop(busy)[1]
                free.add(index)
                heapq.heappush(free_heap, index)
            batches: dict[_TbKey, list[int]] = defaultdict(list)
            for vid in sorted(by_start[t]):
                batches[virtuals[vid][0]].append(vid)
            for tb, vids in batches.items():
                preferred = last_of_tb.get(tb)
                if len(vids) > 1:
                    vids.sort(key=lambda v: virtuals[v][1])
                    start = _free_block(free, len(vids), preferred, plan.s_chunks)
                    plan.s_chunks = max(plan.s_chunks, start + len(vids))
                    for i, vid in enumerate(vids):
                        take(start + i, vid, tb)
                    last_of_tb[tb] = start
                    continue
                vid = vids[0]
                if preferred is not None and preferred in free:
                    index = preferred
                elif free:
                    while free_heap[0] not in free:
                        heapq.heappop(free_heap)
                    index = free_heap[0]
                else:
                    index = plan.s_chunks
                    plan.s_chunks += 1
                take(index, vid, tb)
                last_of_tb[tb] = index

        scratch = plan.scratch

        def real(slot: _VSlot) -> _VSlot:
            return ("s", scratch[slot[1]]) if slot[0] == "v" else slot

        for op in plan.ops:
            op.src, op.dst = real(op.src), real(op.dst)
            op.reads = tuple(real(s) for s in op.reads)
            op.writes = tuple(real(s) for s in op.writes)

    # merging -------------------------------------------------------------------------------
    def merge_messages(self) -> None:
        """Merge consecutive messages of one connection in one step into one ``cnt > 1`` step
        on both sides when every step of the one follows the same step of the other: same
        type, and its slots right after the head's on both sides (fewer, larger transfers;
        msccl-tools does the same), up to the runtime's ``cnt`` limit. Receives of any shape
        merge (``r``, ``rrc``, and the ``r`` + ``re`` of runtimes without fused ops, whose
        receive buffers are consecutive scratch slots), and so do a rank's local copies of one
        step. Dependencies are computed afterwards from the merged steps' slots, so a merged
        step waits for everything each of its parts waited for and every step that waited for a
        part waits for it."""
        runs: dict[tuple, list[tuple[_Op, list[_Op]]]] = defaultdict(list)
        for send, receive in self.messages:
            runs[(send.rank, send.tb, receive[0].rank, receive[0].tb, send.t)].append(
                (send, receive))
        for op in self.local_copies:
            runs[(op.rank, op.t)].append((op, []))
        removed: dict[int, set[int]] = defaultdict(set)
        cap = self.max_merge
        for messages in runs.values():
            messages.sort(key=lambda m: m[0].order)
            head: tuple[_Op, list[_Op]] | None = None
            for message in messages:
                if head is not None and head[0].cnt < cap and self._mergeable(head, message):
                    for into, part in zip((head[0], *head[1]), (message[0], *message[1])):
                        into.reads += part.reads
                        into.writes += part.writes
                        into.cnt += 1
                        removed[part.rank].add(id(part))
                else:
                    head = message
        for plan in self.ranks:
            if removed[plan.rank]:
                gone = removed[plan.rank]
                plan.ops = [op for op in plan.ops if id(op) not in gone]

    @staticmethod
    def _mergeable(head: tuple[_Op, list[_Op]], message: tuple[_Op, list[_Op]]) -> bool:
        """Every step of ``message`` has the type of the head's and its slots right after the
        head's (``cnt`` slots on)."""
        if message[0].war != head[0].war or len(message[1]) != len(head[1]):
            return False
        cnt = head[0].cnt
        for first, op in zip((head[0], *head[1]), (message[0], *message[1])):
            a, b, c, d = first.src, op.src, first.dst, op.dst
            if (op.type != first.type or a[0] != b[0] or b[1] != a[1] + cnt or c[0] != d[0]
                    or d[1] != c[1] + cnt):
                return False
        return True

    # dependencies --------------------------------------------------------------------------
    def add_dependencies(self, plan: _RankPlan) -> None:
        """Order conflicting accesses from different threadblocks as the algorithm does."""
        q = plan.rank
        key = self.key
        last_write: dict[Loc, _Op] = {}
        reads_since: dict[Loc, list[_Op]] = defaultdict(list)
        for op in sorted(plan.ops, key=lambda o: (o.t, o.phase, o.order)):
            deps: list[_Op] = []
            for slot in op.reads:
                previous = last_write.get(key(q, slot))
                if previous is not None:
                    deps.append(previous)
            for slot in op.writes:
                k = key(q, slot)
                previous = last_write.get(k)
                if previous is not None:
                    deps.append(previous)
                deps.extend(reads_since[k])
            for slot in op.reads:
                reads_since[key(q, slot)].append(op)
            for slot in op.writes:
                k = key(q, slot)
                last_write[k] = op
                reads_since[k] = []
            if deps:
                seen: set[int] = set()
                tb = op.tb
                op.deps = [d for d in deps
                           if d.tb != tb and not (id(d) in seen or seen.add(id(d)))]

    # placement -----------------------------------------------------------------------------
    def program_order(self, ops: list[_Op]) -> list[_Op]:
        """A threadblock's steps: by algorithm step; within one, overwritten sends first, then
        sends and receive groups alternating, receive groups in the rank's write order."""
        by_t: dict[int, list[_Op]] = defaultdict(list)
        for op in ops:
            by_t[op.t].append(op)
        result: list[_Op] = []
        for t in sorted(by_t):
            sends = sorted((o for o in by_t[t] if o.phase == 0), key=lambda o: o.order)
            writes = sorted((o for o in by_t[t] if o.phase == 1), key=lambda o: o.order)
            first = [o for o in sends if o.war]
            rest = [o for o in sends if not o.war]
            groups: list[list[_Op]] = []
            for op in writes:
                if groups and groups[-1][0].order[:-1] == op.order[:-1]:
                    groups[-1].append(op)
                else:
                    groups.append([op])
            result.extend(first)
            for i in range(max(len(rest), len(groups))):
                if i < len(rest):
                    result.append(rest[i])
                if i < len(groups):
                    result.extend(groups[i])
        return result

    def place(self, plan: _RankPlan) -> None:
        """Give steps their positions, turning dependencies into depid/deps and nops.

        Placement goes in rounds: each round places the next step of every threadblock whose
        dependencies were all placed before the round, in (algorithm step, phase,
        threadblock) order. Only threadblocks whose next step may have become ready are
        looked at in the next round, so placement is linear in steps and dependencies.
        """
        by_tb: dict[_TbKey, list[_Op]] = defaultdict(list)
        for op in plan.ops:
            by_tb[op.tb].append(op)
        queues = {tb: self.program_order(ops) for tb, ops in by_tb.items()}
        heads = {tb: 0 for tb in queues}
        pending: dict[int, int] = {}                     # id(op) -> dependencies not placed
        waiting: dict[int, list[_Op]] = defaultdict(list)  # id(dep) -> ops waiting for it
        for op in plan.ops:
            if op.deps:
                pending[id(op)] = len(op.deps)
                for d in op.deps:
                    waiting[id(d)].append(op)
        known: dict[_TbKey, dict[_TbKey, int]] = {tb: {} for tb in queues}
        clock_of: dict[int, dict[_TbKey, int]] = {}   # id(op) -> what is known done after it
        steps: dict[_TbKey, list] = {tb: [] for tb in queues}
        remaining = len(plan.ops)
        ready = [tb for tb, queue in queues.items() if not pending.get(id(queue[0]))]
        while remaining:
            if not ready:
                raise ExportError(f"internal: rank {plan.rank}'s dependencies form a cycle")
            following: set[_TbKey] = set()
            for tb in sorted(ready, key=lambda b: (queues[b][heads[b]].t,
                                                   queues[b][heads[b]].phase, b)):
                queue = queues[tb]
                op = queue[heads[tb]]
                self._place_one(op, steps[tb], known[tb], clock_of, id(op) in waiting)
                heads[tb] += 1
                remaining -= 1
                for w in waiting.get(id(op), ()):
                    pending[id(w)] -= 1
                    if not pending[id(w)] and queues[w.tb][heads[w.tb]] is w:
                        following.add(w.tb)
                if heads[tb] < len(queue) and not pending.get(id(queue[heads[tb]])):
                    following.add(tb)
            ready = list(following)
        plan.placed = steps

    @staticmethod
    def _place_one(op: _Op, tb_steps: list, known: dict[_TbKey, int],
                   clock_of: dict[int, dict[_TbKey, int]], awaited: bool) -> None:
        # The latest step waited for per threadblock, unless already known to be done.
        wanted: dict[_TbKey, _Op] = {}
        for d in op.deps:
            if known.get(d.tb, -1) >= d.pos:
                continue
            if d.tb not in wanted or wanted[d.tb].pos < d.pos:
                wanted[d.tb] = d
        # Drop dependencies implied by another one (through what that one already waited for).
        if len(wanted) > 1:
            needed = [d for d in wanted.values()
                      if not any(e is not d and clock_of[id(e)].get(d.tb, -1) >= d.pos
                                 for e in wanted.values())]
            needed.sort(key=lambda d: (d.tb, d.pos))
        else:
            needed = list(wanted.values())
        for d in needed:
            d.hasdep = 1
            for tb, pos in clock_of[id(d)].items():
                if known.get(tb, -1) < pos:
                    known[tb] = pos
        for d in needed[1:]:
            tb_steps.append(("nop", d.tb, d.pos))
        if needed:
            op.depid, op.deps_pos = needed[0].tb, needed[0].pos
        op.pos = len(tb_steps)
        tb_steps.append(op)
        if awaited:  # only steps some other step waits for need what is known after them
            clock = dict(known)
            clock[op.tb] = op.pos
            clock_of[id(op)] = clock


def _free_block(free: set[int], size: int, preferred: int | None, end: int) -> int:
    """The first index of ``size`` consecutive indices that are free or at or past ``end`` (not
    yet used): from ``preferred`` if possible, else the lowest such block.

    >>> _free_block({0, 2, 3, 5}, 2, None, 6), _free_block({0, 2, 3, 5}, 2, 5, 6)
    (2, 5)
    >>> _free_block({0, 2, 3, 5}, 3, None, 6), _free_block(set(), 3, None, 6)
    (5, 6)
    """
    if preferred is not None and all(i in free or i >= end
                                     for i in range(preferred, preferred + size)):
        return preferred
    run_start = previous = -2
    for index in sorted(free):
        if index != previous + 1:
            run_start = index
        if index - run_start + 1 >= size:
            return run_start
        previous = index
    if previous == end - 1:  # the last free run goes on into new indices
        return run_start
    return end


# -- assembly -----------------------------------------------------------------------------------


def _assemble_gpu(plan: _RankPlan, layout: Layout, instances: int,
                  chan_index: dict[int, int]) -> GpuProgram:
    """Replicate the rank's threadblocks per instance (instance ``k`` on channels
    ``k * len(chan_index) + ...``), number them by (send, recv, chan) and write the steps."""
    K = instances
    stride = len(chan_index)
    keys: list[tuple[int, int, int, _TbKey, int]] = []
    for k in range(K):
        for tb in plan.placed:
            chan = 0 if tb == _LOCAL_TB else chan_index[tb[2]]  # local copies: first channel
            keys.append((tb[0], tb[1], k * stride + chan, tb, k))
    if not keys:  # a rank with nothing to do still needs a block to launch
        keys.append((-1, -1, 0, _LOCAL_TB, 0))
        plan.placed[_LOCAL_TB] = []
    keys.sort(key=lambda x: (x[0], x[1], x[2]))
    ids = {(tb, k): i for i, (_, _, _, tb, k) in enumerate(keys)}

    threadblocks = []
    used: set[str] = set()
    for i, (send, recv, chan, tb, k) in enumerate(keys):
        steps = []
        for s, item in enumerate(plan.placed[tb]):
            if isinstance(item, tuple):  # nop carrying one dependency
                _, dtb, dpos = item
                steps.append(XmlStep(s, "nop", "i", -1, "o", -1, 0, ids[(dtb, k)], dpos, 0))
                continue
            op = item
            srcbuf, dstbuf = op.src[0], op.dst[0]
            used.add(srcbuf)
            used.add(dstbuf)
            if op.depid is not None:
                depid, deps = ids[(op.depid, k)], op.deps_pos
            else:
                depid, deps = -1, -1
            steps.append(XmlStep(s, op.type, srcbuf, op.src[1] * K + k, dstbuf,
                                 op.dst[1] * K + k, op.cnt, depid, deps, op.hasdep))
        threadblocks.append(ThreadBlock(i, send, recv, chan, tuple(steps)))
    i_chunks = layout.buffer_chunks(plan.rank, "i") * K if "i" in used else 0
    o_chunks = layout.buffer_chunks(plan.rank, "o") * K if "o" in used else 0
    return GpuProgram(plan.rank, i_chunks, o_chunks, plan.s_chunks * K, tuple(threadblocks))
