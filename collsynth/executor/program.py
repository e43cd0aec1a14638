"""Interpret an MSCCL XML program (:class:`~collsynth.export.Program`) with torch.distributed.

The details (formats, conventions, rules) are in docs/executor.md; section numbers (§) refer to
docs/msccl-xml.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from collsynth.export.check import layouts
from collsynth.export.program import RECV_OPS, SEND_OPS, Program, ThreadBlock
from collsynth.export.semantics import EXECUTABLE, OPERANDS, Event, Scheduler, cnt_mismatch
from collsynth.limits import Deadline
from collsynth.executor._common import (
    DEFAULT_TIMEOUT_S,
    ExecutionError,
    InvalidBufferError,
    UnrunnableProgramError,
    check_op,
    global_rank,
    is_nccl,
    reducer,
    torch_modules,
    wait_all,
)

if TYPE_CHECKING:  # pragma: no cover - typing only
    import torch

__all__ = ["run_program", "prepare_program", "PreparedProgram", "program_kind",
           "program_layouts", "schedule", "Schedule"]

_FORWARDING = frozenset({"rcs", "rrs", "rrcs"})
_WRITES_NOTHING = frozenset({"s", "rrs"})
_KINDS = {"reducescatter": "reduce_scatter"}
#: Collectives whose programs only move data (no operator is ever applied).
_MOVING = frozenset({"allgather", "alltoall", "broadcast", "gather", "scatter"})


def program_kind(program: Program) -> str:
    """The collective a program implements, in collsynth's spelling (``custom`` included)."""
    return _KINDS.get(program.coll, program.coll)


@dataclass(slots=True)
class _Op:
    """One executed transfer (``step``, from the shared scheduler) and the level it runs in."""

    step: Event
    type: str
    level: int = 0
    delay: int = 0           # forwarding ops: extra levels before the forward is sent
    min_level: int = 0       # alignment's lower bound on level
    min_delay: int = 0       # alignment's lower bound on delay

    @property
    def send_level(self) -> int:
        return self.level + (0 if self.type == "s" else 1 + self.delay)


@dataclass
class Schedule:
    """The global schedule of a program: every transfer in a happens-before order, with levels.

    ``aligned`` is true when every message is sent and received in the same level.
    """

    ops: list[_Op]                            # event index -> op
    levels: int = 0
    aligned: bool = True


def _threadblocks(program: Program) -> dict[int, dict[int, ThreadBlock]]:
    """rank -> tb id -> tb, refusing what cannot be executed at all."""
    n = program.ngpus
    tbs: dict[int, dict[int, ThreadBlock]] = {}
    for gpu in program.gpus:
        r = gpu.id
        if not 0 <= r < n or r in tbs:
            raise UnrunnableProgramError(f"<gpu id={r}> is not a distinct rank of ngpus={n}")
        tbs[r] = {}
        for tb in gpu.threadblocks:
            if tb.id in tbs[r]:
                raise UnrunnableProgramError(f"rank {r} has two threadblocks with id {tb.id}")
            for role, peer in (("send", tb.send), ("recv", tb.recv)):
                if peer != -1 and not (0 <= peer < n and peer != r):
                    raise UnrunnableProgramError(f"rank {r} tb {tb.id}: {role} peer {peer} is "
                                                 f"not another rank of ngpus={n}")
            tbs[r][tb.id] = tb
            for pos, st in enumerate(tb.steps):
                why = ("" if st.type == "nop" else
                       f"step type {st.type!r} cannot be executed" if st.type not in EXECUTABLE
                       else f"{st.type!r} sends but the tb has no send peer"
                       if st.type in SEND_OPS and tb.send < 0
                       else f"{st.type!r} receives but the tb has no recv peer"
                       if st.type in RECV_OPS and tb.recv < 0
                       else f"cnt={st.cnt}; a step moves >= 1 chunk" if st.cnt < 1 else "")
                if why:
                    raise UnrunnableProgramError(f"rank {r} tb {tb.id} step {pos}: {why}")
    return tbs


def schedule(program: Program) -> Schedule:
    """Schedule ``program`` globally (docs/executor.md); the same on every rank.

    Raises
    ------
    UnrunnableProgramError
        The program deadlocks, leaves messages unreceived, pairs a send and a receive of
        different ``cnt``, or uses a step that cannot be executed.
    """
    sched, result = Scheduler(_threadblocks(program)), Schedule([])
    sched.run(lambda event, _: result.ops.append(_Op(event, event.transfer.type)))
    for op in result.ops:
        if (mismatch := cnt_mismatch(op.step)) is not None:
            raise UnrunnableProgramError(mismatch)
    stuck = sched.blocked()
    if stuck:
        shown = "; ".join(f"{sched.label(g)[0]} {sched.reason(g)[0]}" for g in stuck[:3])
        more = f" (and {len(stuck) - 3} more threadblocks)" if len(stuck) > 3 else ""
        raise UnrunnableProgramError(f"the program deadlocks: {shown}{more}")
    unreceived = sched.unreceived()
    if unreceived:
        raise UnrunnableProgramError(unreceived[0][0])
    _assign_levels(result)
    return result


def _compute_levels(sched: Schedule) -> None:
    ops = sched.ops
    last_sender: dict[int, _Op] = {}
    for op in ops:
        ev = op.step
        op.delay = op.min_delay
        preds = [ops[i] for i in ev.after_deps]
        if ev.previous is not None:
            preds.append(ops[ev.previous])
        level = op.min_level
        for pred in preds:
            # A send reads memory when its level starts: after every write before it.
            later = 1 if op.type == "s" and pred.type not in _WRITES_NOTHING else 0
            level = max(level, pred.level + later)
        if ev.received is not None:
            level = max(level, ops[ev.received.index].send_level)
        op.level = level
        if op.type in SEND_OPS and ev.gid in last_sender:
            # Messages of one connection leave in order.
            behind = last_sender[ev.gid].send_level - op.send_level
            if behind > 0:
                if op.type == "s":
                    op.level += behind
                else:
                    op.delay += behind
        if op.type in SEND_OPS:
            last_sender[ev.gid] = op
    sched.levels = 1 + max((max(op.level, op.send_level) for op in ops), default=-1)


def _assign_levels(sched: Schedule) -> None:
    """Levels (docs/executor.md), aligned when the program allows it."""
    _compute_levels(sched)
    for _ in range(len(sched.ops) + 2):
        senders = [(sched.ops[op.step.received.index], op) for op in sched.ops
                   if op.step.received is not None]
        late = [(sender, op) for sender, op in senders if op.level != sender.send_level]
        if not late:
            sched.aligned = True
            return
        for sender, receiver in late:
            gap = receiver.level - sender.send_level
            if gap <= 0:
                continue
            if sender.type == "s":
                sender.min_level = max(sender.min_level, sender.level + gap)
            else:
                sender.min_delay = sender.delay + gap
        _compute_levels(sched)
    # Cannot be aligned: fall back to the plain (valid, unaligned) levels.
    for op in sched.ops:
        op.min_level, op.min_delay = 0, 0
    _compute_levels(sched)
    sched.aligned = False


# -- buffers ---------------------------------------------------------------------------------------


def _blocks(kind: str, n: int, nchunks: int) -> tuple[int, int, int]:
    """(input blocks, output blocks, chunks per block) of a rank (§8.1)."""
    if kind in ("allgather", "reduce_scatter", "alltoall"):
        if nchunks % n:
            raise UnrunnableProgramError(f"{kind}: nchunksperloop={nchunks} is not a multiple "
                                         f"of ngpus={n}")
        per = nchunks // n
        return {"allgather": (1, n, per), "reduce_scatter": (n, 1, per),
                "alltoall": (n, n, per)}[kind]
    if kind == "gather":
        return 1, n, nchunks
    if kind == "scatter":
        return n, 1, nchunks
    return 1, 1, nchunks


@dataclass
class _Level:
    """One rank's part of one level: messages to post, then steps to apply."""

    # (message id = its send's event index, peer, tensor sent, memory to snapshot first or None)
    sends: list[tuple[int, int, Any, Any]] = field(default_factory=list)
    # (message id, peer, receive buffer)
    recvs: list[tuple[int, int, Any]] = field(default_factory=list)
    # (op type, source operand(s), destination operand, receive buffer) in the global order
    steps: list[tuple[str, Any, Any, Any]] = field(default_factory=list)


class PreparedProgram:
    """One rank's executable plan of an MSCCL program on fixed tensors (see
    :func:`prepare_program`); :meth:`run` executes it, as often as wanted."""

    def __init__(self, program: Program, input: "torch.Tensor | None",
                 output: "torch.Tensor | None", *, group: Any, op: str,
                 timeout_s: float | None, sched: Schedule | None = None) -> None:
        torch, dist = torch_modules()
        if not dist.is_initialized():
            raise ExecutionError("torch.distributed is not initialised: call "
                                 "init_process_group first (or use collsynth.executor.launch)")
        self.program, self.group, self.timeout_s = program, group, timeout_s
        self.rank = me = dist.get_rank(group)
        n = dist.get_world_size(group)
        if n != program.ngpus:
            raise InvalidBufferError(f"program {program.name!r} is for ngpus={program.ngpus} but "
                                     f"the process group has {n} ranks")
        self.kind = kind = program_kind(program)
        self.sched = sched = schedule(program) if sched is None else sched
        self.nccl = is_nccl(dist, group)
        if self.nccl and not sched.aligned:
            raise UnrunnableProgramError(
                f"program {program.name!r} needs buffered sends (some message cannot be sent "
                "and received in the same batch); it runs on gloo but not on nccl")
        self._input_given, self._output_given = input, output
        inp = None if input is None else input.view(-1) if input.is_contiguous() else None
        out = None if output is None else output.view(-1) if output.is_contiguous() else None
        if (input is not None and inp is None) or (output is not None and out is None):
            raise InvalidBufferError("input and output must be contiguous")
        in_blocks, out_blocks, K = _blocks(kind, n, program.nchunksperloop)
        # A rank with one tensor where the program runs only in place (a broadcast's or a
        # gather's non-root): the other buffer is its alias (§8.2), made up if need be.
        self._pre: list[tuple[Any, Any]] = []
        self._post: list[tuple[Any, Any]] = []
        if program_layouts(program) == ("in-place",) and (inp is None) != (out is None):
            if kind not in ("allgather", "reduce_scatter", "gather", "scatter"):
                inp = out = inp if inp is not None else out
            elif kind in ("allgather", "gather") and inp is not None:
                m0 = inp.numel()
                out = torch.empty(out_blocks * m0, dtype=inp.dtype, device=inp.device)
                self._pre.append((out[me * m0: (me + 1) * m0], inp))
                inp = out[me * m0: (me + 1) * m0]
            elif kind in ("reduce_scatter", "scatter") and out is not None:
                m0 = out.numel()
                big = torch.empty(in_blocks * m0, dtype=out.dtype, device=out.device)
                self._post.append((out, big[me * m0: (me + 1) * m0]))
                inp, out = big, big[me * m0: (me + 1) * m0]
        mine = [o for o in sched.ops if o.step.rank == me]
        touches = {o.step.transfer.srcbuf if u == "src" else o.step.transfer.dstbuf
                   for o in mine for u in OPERANDS[o.type]}
        gpu = next((g for g in program.gpus if g.id == me), None)
        s_chunks = max(gpu.s_chunks, 0) if gpu is not None else 0
        m = self._block_elems(inp, out, in_blocks, out_blocks, touches)
        ref = out if out is not None else inp
        if ref is None:
            raise InvalidBufferError(f"rank {me}: pass the input and output tensors")
        if inp is not None and out is not None and (inp.dtype != out.dtype or
                                                    inp.device != out.device):
            raise InvalidBufferError("input and output must share dtype and device")
        if self.nccl and ref.device.type != "cuda":
            raise InvalidBufferError(f"the nccl backend needs CUDA tensors, not {ref.device}")
        dtype, device = ref.dtype, ref.device
        self.op = check_op(op, dtype, allow_avg=False, combining=kind not in _MOVING)
        self._reduce = reducer(self.op)
        in_place = self._in_place(inp, out, m, n)
        self._check_layout(in_place)

        # Chunk size; zero-padded copies when a block is not a multiple of K chunks.
        S = -(-m // K) if m else 0
        self._copy_in: list[tuple[Any, Any]] = []
        self._copy_out: list[tuple[Any, Any]] = []
        if m % K and kind == "custom":
            raise InvalidBufferError(
                f"a coll=\"custom\" program has no block structure to pad: its buffers must "
                f"hold a multiple of nchunksperloop={K} elements, not {m}")
        if m % K == 0:
            bufs = {"i": inp, "o": out}
        else:
            bufs = self._padded(inp, out, in_blocks, out_blocks, K, S, m, in_place, torch)
        bufs["s"] = torch.empty(s_chunks * S, dtype=dtype, device=device)
        real = {"i": in_blocks * K, "o": out_blocks * K, "s": s_chunks}
        self.chunk_elems = S

        def chunks(ev: Event, which: str, name: str, off: int) -> Any:
            cnt = ev.transfer.cnt
            buf = bufs.get(name)
            if buf is None:
                raise InvalidBufferError(f"rank {me}: {ev.name()} uses buffer {name!r} but no "
                                         f"{'input' if name == 'i' else 'output'} tensor was "
                                         "given")
            if off < 0 or off + cnt > real[name]:
                raise UnrunnableProgramError(
                    f"{ev.name()}: {which} {name}[{off}..{off + cnt}) is outside the "
                    f"{real[name]} chunks of buffer {name!r}")
            return buf[off * S: (off + cnt) * S]

        levels = [_Level() for _ in range(sched.levels)]
        for o in mine:
            ev, t = o.step, o.step.transfer
            uses = OPERANDS[t.type]
            # A fused re (§10) reads several sources: a list of them.
            srcs = [chunks(ev, "src", t.srcbuf, off) for off in t.srcoffs] if "src" in uses \
                else [None]
            src = srcs if t.type == "re" else srcs[0]
            dst = chunks(ev, "dst", t.dstbuf, t.dstoff) if "dst" in uses else None
            tmp = None
            if t.type in RECV_OPS:
                tmp = torch.empty(t.cnt * S, dtype=dtype, device=device)
                levels[o.level].recvs.append(
                    (ev.received.index, global_rank(dist, group, ev.recv), tmp))
            if t.type == "s":
                peer = global_rank(dist, group, ev.send)
                if sched.aligned:
                    levels[o.level].sends.append((ev.index, peer, src, None))
                else:   # buffered: snapshot the value, the memory may change before delivery
                    snap = torch.empty(t.cnt * S, dtype=dtype, device=device)
                    levels[o.level].sends.append((ev.index, peer, snap, src))
            elif t.type in _FORWARDING:
                levels[o.send_level].sends.append(
                    (ev.index, global_rank(dist, group, ev.send), tmp, None))
            if t.type != "s":
                levels[o.level].steps.append((t.type, src, dst, tmp))
        for level in levels:
            level.sends.sort(key=lambda x: x[0])
            level.recvs.sort(key=lambda x: x[0])
        self._levels = levels
        if self.nccl:
            # NCCL: the group's first batched p2p call must involve every rank.
            dist.barrier(group=group)

    # -- construction helpers --------------------------------------------------------------------

    def _block_elems(self, inp, out, in_blocks, out_blocks, touches) -> int:
        me, kind = self.rank, self.kind
        sizes = []
        for name, short, tensor, blocks in (("input", "i", inp, in_blocks),
                                            ("output", "o", out, out_blocks)):
            if tensor is None:
                if short in touches:
                    raise InvalidBufferError(f"rank {me}: the program uses the {name} buffer but "
                                             f"no {name} tensor was given")
                continue
            if tensor.numel() % blocks:
                if short in touches:
                    raise InvalidBufferError(
                        f"rank {me}: {kind} {name} has {tensor.numel()} elements, not a "
                        f"multiple of its {blocks} blocks")
                continue
            sizes.append((name, tensor.numel() // blocks, short in touches))
        used = [s for s in sizes if s[2]] or sizes
        if not used:
            raise InvalidBufferError(f"rank {me}: pass the input and output tensors")
        if len({s for _, s, _ in used}) > 1:
            raise InvalidBufferError(
                f"rank {me}: {kind} input and output disagree on the block size "
                f"({', '.join(f'{name}: {s} elements per block' for name, s, _ in used)})")
        return used[0][1]

    def _in_place(self, inp, out, m: int, n: int) -> bool:
        if inp is None or out is None:
            return False
        a0, a1 = inp.data_ptr(), inp.data_ptr() + inp.numel() * inp.element_size()
        b0, b1 = out.data_ptr(), out.data_ptr() + out.numel() * out.element_size()
        if not (a0 < b1 and b0 < a1) or not inp.numel() or not out.numel():
            return False
        size, r = inp.element_size(), self.rank
        if self.kind in ("allgather", "gather"):
            expected = a0 == b0 + r * m * size and inp.numel() == m
            shape = "input = output[rank*m:(rank+1)*m]"
        elif self.kind in ("reduce_scatter", "scatter"):
            expected = b0 == a0 + r * m * size and out.numel() == m
            shape = "output = input[rank*m:(rank+1)*m]"
        else:
            expected = a0 == b0 and inp.numel() == out.numel()
            shape = "input is output"
        if not expected:
            raise InvalidBufferError(f"input and output overlap but not as an in-place "
                                     f"{self.kind} ({shape})")
        return True

    def _check_layout(self, in_place: bool) -> None:
        p = self.program
        call = "in-place" if in_place else "out-of-place"
        allowed = program_layouts(p)
        if call not in allowed:
            declared = " and ".join(allowed) or "no"
            raise InvalidBufferError(f"program {p.name!r} is for {declared} calls; this call is "
                                     f"{call}")

    def _padded(self, inp, out, in_blocks, out_blocks, K, S, m, in_place, torch) -> dict:
        ref = out if out is not None else inp
        dtype, device = ref.dtype, ref.device
        M = K * S

        def pad(tensor, blocks):
            padded = torch.zeros(blocks * M, dtype=dtype, device=device)
            for b in range(blocks):
                self._copy_in.append((padded[b * M: b * M + m], tensor[b * m: (b + 1) * m]))
                self._copy_out.append((tensor[b * m: (b + 1) * m], padded[b * M: b * M + m]))
            return padded

        r = self.rank
        if not in_place:
            bufs = {"i": pad(inp, in_blocks) if inp is not None else None,
                    "o": pad(out, out_blocks) if out is not None else None}
            # The input is never written out of place: no need to copy it back.
            self._copy_out = [(dst, src) for dst, src in self._copy_out
                              if out is not None and _within(dst, out)]
            return bufs
        if self.kind in ("allgather", "gather"):
            big = pad(out, out_blocks)
            return {"o": big, "i": big[r * M: (r + 1) * M]}
        if self.kind in ("reduce_scatter", "scatter"):
            big = pad(inp, in_blocks)
            return {"i": big, "o": big[r * M: (r + 1) * M]}
        big = pad(out, out_blocks)
        return {"i": big, "o": big}

    # -- execution -------------------------------------------------------------------------------

    def run(self) -> "torch.Tensor | None":
        """Execute the program once; returns the output tensor (as given).

        Raises
        ------
        ExecutionError
            A peer failed or a wait timed out; names this rank and the level.
        """
        torch, dist = torch_modules()
        deadline = Deadline(self.timeout_s)
        for dst, src in self._pre + self._copy_in:
            dst.copy_(src)
        pending_sends: list[Any] = []
        pending_descriptions: list[str] = []
        reduce = self._reduce
        aligned = self.sched.aligned
        for t, level in enumerate(self._levels):
            ops, descriptions = [], []
            # Receives first: a peer that hangs is then reported as the one waited for.
            for message, peer, tensor in level.recvs:
                ops.append(dist.P2POp(dist.irecv, tensor, peer, self.group, message))
                descriptions.append(f"waiting for message {message} from rank {peer}")
            receives = len(ops)
            for message, peer, tensor, source in level.sends:
                if source is not None:
                    tensor.copy_(source)
                ops.append(dist.P2POp(dist.isend, tensor, peer, self.group, message))
                descriptions.append(f"sending message {message} to rank {peer}")
            if ops:
                try:
                    works = dist.batch_isend_irecv(ops) or []
                except RuntimeError as exc:
                    raise ExecutionError(f"rank {self.rank}: level {t}: posting {len(ops)} "
                                         f"message(s) failed: {exc}", rank=self.rank,
                                         step=t) from exc
                if aligned or len(works) != len(ops):
                    wait_all(works, descriptions, deadline=deadline, nccl=self.nccl,
                             rank=self.rank, step=t, where="level")
                else:
                    pending_sends += works[receives:]
                    pending_descriptions += descriptions[receives:]
                    wait_all(works[:receives], descriptions[:receives], deadline=deadline,
                             nccl=self.nccl, rank=self.rank, step=t, where="level")
            for kind, src, dst, tmp in level.steps:
                if kind in ("r", "rcs"):
                    dst.copy_(tmp)
                elif kind in ("rrs", "rrc", "rrcs"):
                    reduce(tmp, src)
                    if kind != "rrs":
                        dst.copy_(tmp)
                elif kind == "cpy":
                    if src.data_ptr() != dst.data_ptr():
                        dst.copy_(src.clone() if _overlap(src, dst) else src)
                elif kind == "re":
                    # A fused chain (§10) reads all its sources before DST changes.
                    fused = len(src) > 1
                    src = [x.clone() if _overlap(x, dst) and (
                        fused or x.data_ptr() != dst.data_ptr()) else x for x in src]
                    for x in src:
                        reduce(dst, x)
        if pending_sends:
            wait_all(pending_sends, pending_descriptions, deadline=deadline, nccl=self.nccl,
                     rank=self.rank, step=len(self._levels), where="level")
        for dst, src in self._copy_out + self._post:
            dst.copy_(src)
        return self._output_given if self._output_given is not None else self._input_given


def program_layouts(program: Program) -> tuple[str, ...]:
    """The calls a program may run for: ``"in-place"``, ``"out-of-place"`` (§4.2, §12.8), as
    msccl reads a file without ``outofplace``, as rccl and msccl-executor read one with it."""
    return layouts(program, "msccl" if program.outofplace is None else "rccl")


def _overlap(a, b) -> bool:
    a0, b0 = a.data_ptr(), b.data_ptr()
    return a0 < b0 + b.numel() * b.element_size() and b0 < a0 + a.numel() * a.element_size()


def _within(view, tensor) -> bool:
    return tensor.data_ptr() <= view.data_ptr() < tensor.data_ptr() + \
        max(tensor.numel(), 1) * tensor.element_size()


def prepare_program(program: Program, input: "torch.Tensor | None",
                    output: "torch.Tensor | None" = None, *, group: Any = None,
                    op: str = "sum", timeout_s: float | None = DEFAULT_TIMEOUT_S,
                    sched: Schedule | None = None) -> PreparedProgram:
    """Plan :func:`run_program` once for fixed tensors; ``.run()`` executes it.

    ``sched`` (from :func:`schedule`) may be passed to avoid scheduling the program again.
    """
    return PreparedProgram(program, input, output, group=group, op=op, timeout_s=timeout_s,
                           sched=sched)


def run_program(program: Program, input: "torch.Tensor | None",
                output: "torch.Tensor | None" = None, *, group: Any = None, op: str = "sum",
                timeout_s: float | None = DEFAULT_TIMEOUT_S) -> "torch.Tensor | None":
    """Execute an MSCCL program on this rank's tensors (docs/executor.md).

    Call it on every rank of ``group``; this rank runs ``<gpu id=rank>``.

    Parameters
    ----------
    program:
        From :func:`collsynth.export.read_program` or :func:`collsynth.export.lower`.
    input, output:
        torch's tensors for the program's ``coll`` (see :mod:`collsynth.executor.executor`;
        ``custom``: input and output of ``nchunksperloop`` chunks each). ``output=None``: in
        place where both have the same size.
    op:
        ``sum``, ``prod``, ``min`` or ``max``.
    timeout_s:
        Seconds the whole call may take; ``None``: the process group's timeout.

    Raises
    ------
    UnrunnableProgramError
        The program deadlocks, mismatches messages or addresses outside its buffers.
    InvalidBufferError
        Tensors that do not fit, a layout (in place / out of place) the program is not for.
    ExecutionError
        A peer failed or a wait timed out.
    """
    return prepare_program(program, input, output, group=group, op=op,
                           timeout_s=timeout_s).run()
