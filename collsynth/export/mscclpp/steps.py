"""What each operation does, resolved to byte ranges of whose buffers: the kernel's semantics.

:func:`expand` turns every threadblock's operations (pipelines unrolled into their iterations)
into :class:`Step` values: the data the threadblock itself moves (:class:`Transfer`), what it
hands to a port channel's proxy, the packets it must wait for, and its synchronisation. Each
rule follows MSCCL++'s ``execution_kernel.hpp`` (``docs/mscclpp.md``, section "What each
operation does"), including its quirks: a memory-channel ``pws`` does not signal, a ``flush``
without ``dst_buff`` flushes nothing, ``get`` swaps its two offsets.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from collsynth.export.check import Problem
from collsynth.export.mscclpp.geometry import Geometry
from collsynth.export.mscclpp.loader import LoadedPlan, LoadedThreadblock, op_name
from collsynth.export.mscclpp.model import BufferRef, Operation

__all__ = ["Access", "Transfer", "Post", "Step", "expand", "count_steps"]


@dataclass(frozen=True, slots=True)
class Access:
    """Bytes ``offset .. offset + length`` of ``rank``'s buffer; ``packet``: the range holds
    LL packets, which take twice the bytes (``2 * offset .. 2 * (offset + length)``)."""

    rank: int
    buffer: str
    offset: int
    length: int
    packet: bool = False
    unit: int = 0    # bytes each thread takes in turn from ``offset`` (0: not known)


@dataclass(frozen=True, slots=True)
class Transfer:
    """Read ``srcs``, combine them (``copy``: the one source; ``sum``: their reduction;
    ``raw``: packet bytes as they are, flags included), write every one of ``dsts``."""

    mode: str
    srcs: tuple[Access, ...]
    dsts: tuple[Access, ...]
    synced: bool = False    # a raw read of packets the poster waited for (their flags)


@dataclass(frozen=True, slots=True)
class Post:
    """A request to the proxy of port channel ``channel`` of the rank: a transfer (or none),
    then a signal to the peer, then (``flush``) the poster waits until it is done."""

    channel: int
    transfer: Transfer | None
    signal: bool = False
    flush: bool = False


@dataclass(frozen=True, slots=True)
class Step:
    """One operation (or one pipeline iteration of one) of one threadblock.

    ``kind``: ``sync`` (``nop``), ``barrier`` (``ids = (barrier id, threadblocks)``),
    ``signal`` / ``wait`` (``channels``: (type, the rank's channel index) pairs; ``relaxed``),
    ``sem_acquire`` / ``sem_release`` (``ids``), ``flush`` (``channels``), or ``data``: the
    threadblock waits for the packets in ``needs``, runs ``transfers`` itself and hands
    ``posts`` to proxies. ``where`` names the operation in messages.
    """

    kind: str
    where: str
    op: str
    transfers: tuple[Transfer, ...] = ()
    posts: tuple[Post, ...] = ()
    needs: tuple[Access, ...] = ()
    channels: tuple[tuple[str, int], ...] = ()
    relaxed: bool = False
    ids: tuple[int, ...] = ()


class _Expander:
    def __init__(self, loaded: LoadedPlan, geo: Geometry) -> None:
        self.loaded, self.geo = loaded, geo
        self.plan = loaded.plan
        self.problems: list[Problem] = []
        self._reported: set[str] = set()

    def problem(self, kind: str, message: str) -> None:
        if message not in self._reported:
            self._reported.add(message)
            self.problems.append(Problem(kind, message))

    # -- resolving a buffer reference ------------------------------------------------------

    def base(self, ref: BufferRef, buffer: str | None, tbg) -> tuple[int, int]:
        return self.geo.range(ref.index, ref.size, buffer, tbg)

    def remote(self, lt: LoadedThreadblock, op: Operation, ref: BufferRef) -> tuple[int, str]:
        """(rank, buffer type) of a remote reference."""
        bid = lt.remote[op.channel_type][ref.buffer_id]
        rb = self.plan.gpus[lt.rank].remote_buffers[bid]
        return rb.rank, rb.type

    def switch(self, lt: LoadedThreadblock, ref: BufferRef):
        return self.loaded.switch[lt.rank][lt.channels["switch"][ref.switch_channel_id]]

    def port(self, lt: LoadedThreadblock, op: Operation, k: int, rank: int, where: str) -> int:
        """The rank's port channel that entry ``k`` uses; names a peer mismatch."""
        channel = lt.channels["port"][op.channel_ids[k]]
        peer = self.loaded.peers[(lt.rank, "port")][channel]
        if peer != rank:
            self.problem("connection", f"{where}: entry {k} writes rank {rank}'s buffer through "
                                       f"port channel {channel}, which connects to rank {peer}")
        return channel

    # -- one threadblock ---------------------------------------------------------------------

    def threadblock(self, lt: LoadedThreadblock) -> list[Step]:
        steps: list[Step] = []
        for pos, op in enumerate(lt.tb.ops):
            if op.name != "pipeline":
                steps.append(self.step(lt, op, str(pos), None))
                continue
            count = self.geo.iterations(op.num_chunks, op.unit_size)
            for i in range(count):
                for k, inner in enumerate(op.ops):
                    steps.append(self.step(lt, inner, f"{pos}.{k}",
                                           (i * op.unit_size, op.unit_size, i)))
        return steps

    def step(self, lt: LoadedThreadblock, op: Operation, path: str, it) -> Step:
        r = lt.rank
        where = op_name(r, lt.id, path) + (f" iteration {it[2]}" if it else "") + \
            f" ({op.name})"
        name = op.name
        if name == "nop":
            return Step("sync", where, name)
        if name == "barrier":
            return Step("barrier", where, name, ids=(op.barrier_id, op.num_threadblocks))
        if name in ("signal", "rlxsignal", "wait", "rlxwait"):
            kind = "signal" if name.endswith("signal") else "wait"
            channels = tuple((op.channel_type, lt.channels[op.channel_type][c])
                             for c in op.channel_ids)
            if op.channel_type == "port" and kind == "signal":
                return Step("data", where, name,
                            posts=tuple(Post(ch, None, signal=True) for _, ch in channels))
            # Port channels have no relaxed variant: rlx* on them are the ordered ones.
            relaxed = name.startswith("rlx") and op.channel_type == "memory"
            return Step(kind, where, name, channels=channels, relaxed=relaxed)
        if name == "flush":
            count = min(len(op.dst), len(op.channel_ids))   # the kernel counts nOutputs
            return Step("flush", where, name, channels=tuple(
                ("port", lt.channels["port"][c]) for c in op.channel_ids[:count]))
        if name in ("sem_acquire", "sem_release"):
            return Step(name, where, name, ids=op.semaphore_ids)
        return _with_units(self.data(lt, op, where, it))

    # -- data operations ---------------------------------------------------------------------

    def data(self, lt: LoadedThreadblock, op: Operation, where: str, it) -> Step:
        r, geo, name, tbg = lt.rank, self.geo, op.name, op.tbg
        offset, unit = (it[0], it[1]) if it else (0, None)

        def base(ref: BufferRef, buffer: str | None) -> tuple[int, int]:
            return self.base(ref, buffer, tbg)

        def start(ref: BufferRef, buffer: str | None, shift: str | None = None) -> int:
            """Byte offset of ``ref`` in this iteration (``shift``: the buffer type the kernel
            uses for the iteration's offset, when it is another one)."""
            at = base(ref, buffer)[0]
            return at + geo.iteration(shift or buffer, offset) if unit else at

        def length(base_length: int) -> int:
            return geo.step_length(base_length, offset, unit) if unit else base_length

        def group(ref: BufferRef, first: BufferRef, size: int, packet: bool = False
                  ) -> tuple[Access, ...]:
            sw = self.switch(lt, ref)
            at = base(first, sw.buffer_type)[0]
            if unit and not packet:
                at += geo.iteration(sw.buffer_type, offset)
            return tuple(Access(q, sw.buffer_type, at, size, packet) for q in sw.ranks)

        src, dst = op.src, op.dst
        if name in ("put", "pws", "pwsf"):
            transfers, posts = [], []
            for k, d in enumerate(dst):
                rank, rbuf = self.remote(lt, op, d)
                size = length(base(d, rbuf)[1])
                target = Access(rank, rbuf, start(d, rbuf), size)
                # Memory channels read every source from src_buff[0]'s buffer.
                sbuf = src[0].type if op.channel_type == "memory" else src[k].type
                source = Access(r, sbuf, start(src[k], sbuf, src[k].type), size)
                if op.channel_type == "memory":
                    transfers.append(Transfer("copy", (source,), (target,)))
                else:
                    posts.append(Post(self.port(lt, op, k, rank, where),
                                      Transfer("copy", (source,), (target,)),
                                      signal=name != "put", flush=name == "pwsf"))
            return Step("data", where, name, transfers=tuple(transfers), posts=tuple(posts))
        if name == "get":
            transfers = []
            for s_ref, d_ref in zip(src, dst):
                rank, rbuf = self.remote(lt, op, s_ref)
                size = length(base(s_ref, rbuf)[1])
                # The kernel writes the local buffer at the source's offset and reads the
                # remote one at the destination's offset.
                transfers.append(Transfer(
                    "copy", (Access(rank, rbuf, start(d_ref, d_ref.type), size),),
                    (Access(r, d_ref.type, start(s_ref, rbuf), size),)))
            return Step("data", where, name, transfers=tuple(transfers))
        if name == "copy":
            size = length(base(src[0], src[0].type)[1])
            return Step("data", where, name, transfers=(Transfer(
                "copy", (Access(r, src[0].type, start(src[0], src[0].type), size),),
                (Access(r, dst[0].type, start(dst[0], dst[0].type), size),)),))
        if name in ("re", "res", "rre", "rres"):
            size = length(base(src[0], src[0].type)[1])
            accesses = []
            for refs in (src, dst):
                found = []
                for ref in refs:
                    if ref.kind == "remote":
                        rank, rbuf = self.remote(lt, op, ref)
                        found.append(Access(rank, rbuf, start(ref, rbuf), size))
                    else:
                        found.append(Access(r, ref.type, start(ref, ref.type), size))
                accesses.append(tuple(found))
            if name in ("re", "rre"):
                accesses[1] = accesses[1][:1]
            return Step("data", where, name, transfers=(Transfer("sum", *accesses),))
        if name == "glres":
            first = self.switch(lt, src[0])
            size = length(base(src[0], first.buffer_type)[1])
            # The parser keeps the first entry's offset and the last entry's switch channel.
            return Step("data", where, name, transfers=(Transfer(
                "sum", group(src[-1], src[0], size), group(dst[-1], dst[0], size)),))
        if name == "gstore":
            size = length(base(src[0], src[0].type)[1])
            return Step("data", where, name, transfers=(Transfer(
                "copy", (Access(r, src[0].type, start(src[0], src[0].type), size),),
                group(dst[-1], dst[0], size)),))
        # -- packets: the kernel ignores pipeline offsets for these --------------------------
        def packets(ref: BufferRef, size: int) -> Access:
            """A remote packet range of ``size`` data bytes."""
            rank, rbuf = self.remote(lt, op, ref)
            return Access(rank, rbuf, base(ref, rbuf)[0], size, True)

        if name == "ppkt":
            transfers, posts = [], []
            for k, d in enumerate(dst):
                if op.channel_type == "memory":   # from src_buff[0]'s buffer, as put
                    s_start, size = base(src[k], src[0].type)
                    transfers.append(Transfer("copy", (Access(r, src[0].type, s_start, size),),
                                              (packets(d, size),)))
                else:   # a raw copy of packets already in the source
                    s_start, size = base(src[k], src[k].type)
                    target = packets(d, size)
                    posts.append(Post(self.port(lt, op, k, target.rank, where), Transfer(
                        "raw", (Access(r, src[k].type, s_start, size, True),), (target,))))
            return Step("data", where, name, transfers=tuple(transfers), posts=tuple(posts))
        if name == "rppkt":
            s_start, size = base(src[0], "s")
            mine = Access(r, "s", s_start, size, True)
            if op.channel_type == "memory":
                return Step("data", where, name, needs=(mine,), transfers=tuple(
                    Transfer("copy", (mine,), (packets(d, size),)) for d in dst))
            posts = []
            for k, d in enumerate(dst):
                target = packets(d, size)
                posts.append(Post(self.port(lt, op, k, target.rank, where),
                                  Transfer("raw", (mine,), (target,), synced=True)))
            return Step("data", where, name, needs=(mine,), posts=tuple(posts))
        if name in ("respkt", "repkt", "recpkt", "recspkt"):
            s_start, size = base(src[0], src[0].type)
            srcs = [Access(r, src[0].type, s_start, size)]
            srcs += [Access(r, "s", base(ref, "s")[0], size, True) for ref in src[1:]]
            dsts = [Access(r, dst[0].type, base(dst[0], dst[0].type)[0], size)]
            rest = dst[1:]
            if name in ("recpkt", "recspkt"):
                dsts.append(Access(r, dst[1].type, base(dst[1], dst[1].type)[0], size, True))
                rest = dst[2:]
            dsts += [packets(ref, size) for ref in rest]
            return Step("data", where, name, needs=tuple(srcs[1:]), transfers=(
                Transfer("sum", tuple(srcs), tuple(dsts)),))
        if name == "upkt":
            s_start, size = base(src[0], "s")
            mine = Access(r, "s", s_start, size, True)
            return Step("data", where, name, needs=(mine,), transfers=(Transfer(
                "copy", (mine,), (Access(r, dst[0].type, base(dst[0], dst[0].type)[0], size),)),))
        if name == "cpkt":
            s_start, size = base(src[0], src[0].type)
            return Step("data", where, name, transfers=(Transfer(
                "copy", (Access(r, src[0].type, s_start, size),),
                (Access(r, dst[0].type, base(dst[0], dst[0].type)[0], size, True),)),))
        if name == "gstorepkt":
            s_start, size = base(src[0], src[0].type)
            mine = Access(r, src[0].type, s_start, size, True)
            return Step("data", where, name, needs=(mine,), transfers=(Transfer(
                "copy", (mine,), group(dst[-1], dst[0], size, packet=True)),))
        raise AssertionError(f"no semantics for {name}")  # pragma: no cover - loader refuses


#: Bytes a thread handles in turn (its next ones are ``threads x unit`` further): int4 for
#: copies and reductions, an LL16 packet's 8 data bytes for packet operations.
_UNIT = {"put": 16, "pws": 16, "pwsf": 16, "get": 16, "copy": 16, "re": 16, "res": 16,
         "rre": 16, "rres": 16, "glres": 16, "gstore": 16, "ppkt": 8, "rppkt": 8, "respkt": 8,
         "repkt": 8, "recpkt": 8, "recspkt": 8, "upkt": 8, "cpkt": 8, "gstorepkt": 8}


def _with_units(step: Step) -> Step:
    """The step with its own transfers' accesses marked with their thread unit (the
    proxies' transfers keep none: another actor moves them)."""
    unit = _UNIT.get(step.op, 0)
    if not unit or not step.transfers:
        return step
    marked = tuple(replace(t, srcs=tuple(replace(a, unit=unit) for a in t.srcs),
                           dsts=tuple(replace(a, unit=unit) for a in t.dsts))
                   for t in step.transfers)
    return replace(step, transfers=marked, needs=tuple(replace(a, unit=unit)
                                                       for a in step.needs))


def count_steps(loaded: LoadedPlan, geo: Geometry) -> int:
    """How many steps :func:`expand` would make (pipelines unrolled), without making them."""
    total = 0
    for tbs in loaded.threadblocks.values():
        for lt in tbs:
            for op in lt.tb.ops:
                total += (geo.iterations(op.num_chunks, op.unit_size) * len(op.ops)
                          if op.name == "pipeline" else 1)
    return total


def expand(loaded: LoadedPlan, geo: Geometry) -> tuple[dict[int, list[list[Step]]],
                                                       list[Problem]]:
    """rank -> threadblock -> its steps, and the problems found resolving them."""
    expander = _Expander(loaded, geo)
    steps = {r: [expander.threadblock(lt) for lt in tbs]
             for r, tbs in loaded.threadblocks.items()}
    return steps, expander.problems
