"""Execute a collsynth :class:`~collsynth.algorithm.Algorithm` with torch.distributed messages.

The details (formats, conventions, rules) are in docs/executor.md.

Example
-------
Inside every rank of a 4-rank group (see :mod:`collsynth.executor.launch`)::

    algorithm = load_algorithm("allgather_ring4.json")
    x = torch.randn(1000)
    out = torch.empty(4000)
    run(algorithm, x, out)            # out == torch.cat of every rank's x
"""

from __future__ import annotations

import bisect
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

from collsynth.algorithm.model import Algorithm
from collsynth.algorithm.verify import verify
from collsynth.collective.model import Collective
from collsynth.errors import ExportError
from collsynth.export.layout import standard_kind
from collsynth.limits import Deadline
from collsynth.executor._common import (
    DEFAULT_TIMEOUT_S,
    REDUCE_OPS,
    BackendUnavailableError,
    ExecutionError,
    ExecutionTimeoutError,
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

__all__ = [
    "run",
    "prepare",
    "PreparedRun",
    "run_program",
    "prepare_program",
    "PreparedProgram",
    "collective_kind",
    "block_counts",
    "piece_range",
    "REDUCE_OPS",
    "DEFAULT_TIMEOUT_S",
    "ExecutionError",
    "ExecutionTimeoutError",
    "InvalidBufferError",
    "BackendUnavailableError",
    "UnrunnableProgramError",
]

_log = logging.getLogger(__name__)


# -- where chunks live ---------------------------------------------------------------------------


def collective_kind(collective: Collective) -> str:
    """The torch layout a collective runs with: its standard name, or ``"custom"``.

    >>> from collsynth.collective import allgather, multiroot_broadcast
    >>> collective_kind(allgather(4).split(2)), collective_kind(multiroot_broadcast(4, [0, 1]))
    ('allgather', 'custom')
    """
    try:
        kind = standard_kind(collective)
    except ExportError as exc:
        raise InvalidBufferError(str(exc)) from exc
    return "custom" if kind is None else kind


def block_counts(kind: str, num_ranks: int, rank: int, root: int | None,
                 base_chunks: int) -> tuple[int, int]:
    """Blocks (of ``m`` elements) of this rank's ``(input, output)`` tensors; 0: not used.

    >>> block_counts("allgather", 4, 1, None, 4), block_counts("gather", 4, 1, 0, 4)
    ((1, 4), (1, 0))
    """
    n = num_ranks
    is_root = rank == root
    table = {
        "allgather": (1, n),
        "reduce_scatter": (n, 1),
        "allreduce": (1, 1),
        "alltoall": (n, n),
        "broadcast": (1 if is_root else 0, 1),
        "reduce": (1, 1 if is_root else 0),
        "gather": (1, n if is_root else 0),
        "scatter": (n if is_root else 0, 1),
    }
    return table.get(kind, (base_chunks, base_chunks))


def _blocks_of(kind: str, collective: Collective, rank: int, base: int
               ) -> tuple[int | None, int | None]:
    """The input and output block of base chunk ``base`` on ``rank`` (``None``: not there)."""
    n = collective.num_ranks
    root = collective.roots[0] if collective.roots else None
    if kind == "allgather":
        return (0 if base == rank else None), base
    if kind == "alltoall":
        src, dst = divmod(base, n)
        return (dst if src == rank else None), (src if dst == rank else None)
    if kind == "allreduce":
        return 0, 0
    if kind == "reduce_scatter":
        return base, (0 if base == rank else None)
    if kind == "broadcast":
        return (0 if rank == root else None), 0
    if kind == "reduce":
        return 0, (0 if rank == root else None)
    if kind == "gather":
        return (0 if base == rank else None), (base if rank == root else None)
    if kind == "scatter":
        return (base if rank == root else None), (0 if base == rank else None)
    C = collective.chunk_factor
    pre = rank in collective.precondition[base * C]
    post = rank in collective.postcondition[base * C]
    return (base if pre else None), (base if post else None)


def piece_range(block_elems: int, pieces: int, piece: int) -> tuple[int, int]:
    """Element range ``[start, stop)`` of piece ``piece`` of a block split ``pieces`` ways.

    >>> [piece_range(10, 4, p) for p in range(4)]
    [(0, 2), (2, 5), (5, 7), (7, 10)]
    >>> [piece_range(2, 3, p) for p in range(3)]
    [(0, 0), (0, 1), (1, 2)]
    """
    return piece * block_elems // pieces, (piece + 1) * block_elems // pieces


def _flat(tensor: "torch.Tensor | None", name: str) -> "torch.Tensor | None":
    if tensor is None:
        return None
    if not tensor.is_contiguous():
        raise InvalidBufferError(f"{name} must be contiguous (call .contiguous() first)")
    return tensor.view(-1)


def _span(tensor: "torch.Tensor") -> tuple[int, int]:
    start = tensor.data_ptr()
    return start, start + tensor.numel() * tensor.element_size()


# -- the plan of one rank ------------------------------------------------------------------------


@dataclass
class _StepPlan:
    """This rank's part of one algorithm step."""

    ops: list[tuple[bool, "torch.Tensor", int, int]]   # (is_send, tensor, global peer, tag)
    descriptions: list[str]
    applies: list[tuple[bool, "torch.Tensor", "torch.Tensor"]]   # (reduce?, dst, received)


class PreparedRun:
    """One rank's executable plan for an algorithm on fixed tensors; :meth:`run` executes it.

    Build it with :func:`prepare` (collectively, on every rank). Running it again reuses the
    views, the scratch and the receive buffers, so only the messages and reductions are paid
    for: what a benchmark loop wants. The tensors' contents may change between runs; the
    tensors themselves may not.
    """

    def __init__(self, algorithm: Algorithm, input: "torch.Tensor | None",
                 output: "torch.Tensor | None", *, group: Any, op: str,
                 timeout_s: float | None) -> None:
        torch, dist = torch_modules()
        if not dist.is_initialized():
            raise ExecutionError("torch.distributed is not initialised: call "
                                 "init_process_group first (or use collsynth.executor.launch)")
        self.algorithm = algorithm
        self.group = group
        self.timeout_s = timeout_s
        self.rank = me = dist.get_rank(group)
        n = dist.get_world_size(group)
        collective = algorithm.collective
        if n != algorithm.topology.num_ranks:
            raise InvalidBufferError(
                f"algorithm {algorithm.name!r} is for {algorithm.topology.num_ranks} ranks but "
                f"the process group has {n}")
        verify(algorithm)
        self.kind = kind = collective_kind(collective)
        C = collective.chunk_factor
        base_chunks = collective.num_chunks // C
        root = collective.roots[0] if collective.roots else None
        in_blocks, out_blocks = block_counts(kind, n, me, root, base_chunks)
        self._input_given, self._output_given = input, output
        inp = _flat(input, "input")
        out = _flat(output, "output")
        if out is None and inp is not None and in_blocks == out_blocks:
            out = inp   # output=None: in place
        m = self._block_elems(inp, out, in_blocks, out_blocks)
        self.block_elems = m
        ref = out if out is not None else inp
        self.nccl = is_nccl(dist, group)
        self._check_device(ref, inp, out)
        dtype, device = ref.dtype, ref.device
        self.op = check_op(op, dtype, combining=collective.combining)
        self._reduce = reducer(self.op)
        self.input, self.output = inp, out

        def view(buf: "torch.Tensor", block: int, piece: int) -> "torch.Tensor":
            start, stop = piece_range(m, C, piece)
            return buf[block * m + start: block * m + stop]

        num_chunks = collective.num_chunks
        in_view: dict[int, "torch.Tensor"] = {}
        out_view: dict[int, "torch.Tensor"] = {}
        for c in range(num_chunks):
            b, p = divmod(c, C)
            ib, ob = _blocks_of(kind, collective, me, b)
            if me in collective.precondition[c]:
                if inp is None:
                    raise InvalidBufferError(f"rank {me} starts with chunk {c} of "
                                             f"{collective.describe()}: it needs an input tensor")
                in_view[c] = view(inp, ib, p)
            if me in collective.postcondition[c]:
                if out is None:
                    raise InvalidBufferError(f"rank {me} must end with chunk {c} of "
                                             f"{collective.describe()}: it needs an output tensor")
                out_view[c] = view(out, ob, p)

        received = {s.chunk for step in algorithm.steps for s in step.sends if s.dst == me}
        # Scratch: chunks this rank receives but does not keep.
        scratch_chunks = sorted(c for c in received if c not in out_view)
        sizes = {c: len(range(*piece_range(m, C, c % C))) for c in scratch_chunks}
        self._scratch = torch.empty(sum(sizes.values()), dtype=dtype, device=device)
        loc: dict[int, "torch.Tensor"] = {}
        offset = 0
        for c in scratch_chunks:
            loc[c] = self._scratch[offset: offset + sizes[c]]
            offset += sizes[c]
        loc.update(out_view)
        for c, v in in_view.items():
            loc.setdefault(c, v)

        # In place: snapshot the input unless every overlap is a chunk's own slot.
        self._snapshot: "torch.Tensor | None" = None
        if inp is not None and out is not None and self._overlaps(inp, out) and \
                not self._aliasing_is_harmless(in_view, out_view):
            self._snapshot = torch.empty_like(inp)
            snap = self._snapshot
            base_ptr = inp.data_ptr()
            for c, v in in_view.items():
                start = (v.data_ptr() - base_ptr) // v.element_size()
                in_view[c] = snap[start: start + v.numel()]
                if c not in out_view and c not in scratch_chunks:
                    loc[c] = in_view[c]
        self._init_copies = [(loc[c], v) for c, v in in_view.items()
                             if not _same(loc[c], v)]
        # avg: divide final reductions by their number of contributions.
        self._divide: list[tuple["torch.Tensor", int]] = []
        if self.op == "avg" and collective.combining:
            self._divide = [(v, len(collective.precondition[c])) for c, v in out_view.items()]
        self._steps = self._plan_steps(algorithm, loc, in_view, torch, dist, dtype, device)
        self._p2p = [[dist.P2POp(dist.isend if is_send else dist.irecv, tensor, peer, group, tag)
                      for is_send, tensor, peer, tag in plan.ops] for plan in self._steps]
        if self.nccl:
            # NCCL: the group's first batched p2p call must involve every rank.
            dist.barrier(group=group)

    # -- construction helpers --------------------------------------------------------------------

    def _block_elems(self, inp, out, in_blocks: int, out_blocks: int) -> int:
        kind, me = self.kind, self.rank
        sizes = []
        for name, tensor, blocks in (("input", inp, in_blocks), ("output", out, out_blocks)):
            if tensor is None or blocks == 0:
                continue
            if tensor.numel() % blocks:
                raise InvalidBufferError(
                    f"rank {me}: {kind} {name} has {tensor.numel()} elements, not a multiple "
                    f"of its {blocks} blocks")
            sizes.append((name, tensor.numel() // blocks, blocks))
        if not sizes:
            raise InvalidBufferError(f"rank {me}: {kind} needs an input or an output tensor to "
                                     "size the chunks from")
        if len({s for _, s, _ in sizes}) > 1:
            (a, ma, ba), (b, mb, bb) = sizes
            raise InvalidBufferError(
                f"rank {me}: {kind} {a} ({ma * ba} elements = {ba} x {ma}) and {b} "
                f"({mb * bb} elements = {bb} x {mb}) disagree on the block size; torch's layout "
                f"needs {a} = {ba} x m and {b} = {bb} x m")
        return sizes[0][1]

    def _check_device(self, ref, inp, out) -> None:
        for name, tensor in (("input", inp), ("output", out)):
            if tensor is None:
                continue
            if tensor.dtype != ref.dtype or tensor.device != ref.device:
                raise InvalidBufferError(f"input and output must share dtype and device; got "
                                         f"{inp.dtype}/{inp.device} and {out.dtype}/{out.device}")
            if self.nccl and tensor.device.type != "cuda":
                raise InvalidBufferError(f"the nccl backend needs CUDA tensors; {name} is on "
                                         f"{tensor.device}")

    @staticmethod
    def _overlaps(a, b) -> bool:
        (a0, a1), (b0, b1) = _span(a), _span(b)
        return a0 < b1 and b0 < a1 and a.numel() > 0 and b.numel() > 0

    @staticmethod
    def _aliasing_is_harmless(in_view, out_view) -> bool:
        """True when every input slot is its own chunk's output slot or overlaps no output."""
        spans = sorted(_span(v) for v in out_view.values() if v.numel())
        starts = [s for s, _ in spans]
        for c, v in in_view.items():
            if not v.numel():
                continue
            own = out_view.get(c)
            if own is not None and _same(own, v):
                continue
            lo, hi = _span(v)
            i = bisect.bisect_right(starts, lo) - 1
            for s, e in spans[max(i, 0): i + 2]:
                if s < hi and lo < e:
                    return False
        return True

    def _plan_steps(self, algorithm, loc, in_view, torch, dist, dtype, device) -> list[_StepPlan]:
        me, group, collective = self.rank, self.group, algorithm.collective
        held = {c for c in range(collective.num_chunks) if me in collective.precondition[c]}
        plans: list[_StepPlan] = []
        # One receive buffer, as large as the largest step's receives that need one.
        layouts: list[list[tuple[int, int, bool, int]]] = []
        biggest = 0
        for step in algorithm.steps:
            sent_now = {s.chunk for s in step.sends if s.src == me}
            incoming = sorted((s for s in step.sends if s.dst == me and loc[s.chunk].numel()),
                              key=lambda s: (s.src, s.chunk))
            by_chunk: dict[int, int] = {}
            entries = []
            offset = 0
            for s in incoming:
                first = by_chunk.get(s.chunk, 0) == 0
                by_chunk[s.chunk] = by_chunk.get(s.chunk, 0) + 1
                # A reduce into a chunk the rank does not hold yet is a copy (verify's rule).
                reduce = s.reduce and (s.chunk in held or not first)
                direct = not reduce and s.chunk not in sent_now
                size = loc[s.chunk].numel()
                entries.append((s.src, s.chunk, reduce, -1 if direct else offset))
                if not direct:
                    offset += size
            biggest = max(biggest, offset)
            layouts.append(entries)
            held |= {s.chunk for s in step.sends if s.dst == me}
        self._recv_buffer = torch.empty(biggest, dtype=dtype, device=device)
        for step, entries in zip(algorithm.steps, layouts):
            ops: list[tuple[bool, Any, int, int]] = []
            descriptions: list[str] = []
            applies = []
            outgoing = sorted((s for s in step.sends if s.src == me and loc[s.chunk].numel()),
                              key=lambda s: (s.dst, s.chunk))
            # Receives first: a peer that hangs is then reported as the one waited for.
            for src, chunk, reduce, offset in entries:
                target = loc[chunk]
                if offset < 0:
                    buffer = target
                else:
                    buffer = self._recv_buffer[offset: offset + target.numel()]
                    applies.append((reduce, target, buffer))
                ops.append((False, buffer, global_rank(dist, group, src), chunk))
                descriptions.append(f"waiting for chunk {chunk} from rank {src}")
            for s in outgoing:
                ops.append((True, loc[s.chunk], global_rank(dist, group, s.dst), s.chunk))
                descriptions.append(f"sending chunk {s.chunk} to rank {s.dst}")
            plans.append(_StepPlan(ops, descriptions, applies))
        return plans

    # -- execution -------------------------------------------------------------------------------

    def run(self) -> "torch.Tensor | None":
        """Execute the algorithm once; returns the output tensor (as given, or ``None``).

        Raises
        ------
        ExecutionError
            A peer failed or a wait timed out (:class:`ExecutionTimeoutError`); the message
            names this rank, the step and the peers waited for.
        """
        torch, dist = torch_modules()
        deadline = Deadline(self.timeout_s)
        if self._snapshot is not None:
            self._snapshot.copy_(self.input)
        for dst, src in self._init_copies:
            dst.copy_(src)
        for t, (plan, p2p) in enumerate(zip(self._steps, self._p2p)):
            if p2p:
                try:
                    works = dist.batch_isend_irecv(p2p)
                except RuntimeError as exc:
                    raise ExecutionError(f"rank {self.rank}: step {t}: posting "
                                         f"{len(p2p)} message(s) failed: {exc}",
                                         rank=self.rank, step=t) from exc
                wait_all(works or [], plan.descriptions, deadline=deadline, nccl=self.nccl,
                         rank=self.rank, step=t, where="step")
            for reduce, dst, received in plan.applies:
                if reduce:
                    self._reduce(dst, received)
                else:
                    dst.copy_(received)
        for tensor, count in self._divide:
            tensor.div_(count)
        return self._output_given if self._output_given is not None else self._input_given


def _same(a, b) -> bool:
    return a.data_ptr() == b.data_ptr() and a.numel() == b.numel()


def prepare(algorithm: Algorithm, input: "torch.Tensor | None",
            output: "torch.Tensor | None" = None, *, group: Any = None, op: str = "sum",
            timeout_s: float | None = DEFAULT_TIMEOUT_S) -> PreparedRun:
    """Plan :func:`run` once for fixed tensors; call ``.run()`` on the result as often as wanted.

    Collective in the sense that every rank of ``group`` must call it (it does no communication
    itself on gloo). Parameters as for :func:`run` (flat tensors only).
    """
    return PreparedRun(algorithm, input, output, group=group, op=op, timeout_s=timeout_s)


def run(algorithm: Algorithm, input: "torch.Tensor | Sequence[torch.Tensor] | None",
        output: "torch.Tensor | Sequence[torch.Tensor] | None" = None, *, group: Any = None,
        op: str = "sum", timeout_s: float | None = DEFAULT_TIMEOUT_S
        ) -> "torch.Tensor | Sequence[torch.Tensor] | None":
    """Execute ``algorithm`` on this rank's tensors, as torch's collective of the same name.

    Call it on every rank of ``group`` (default: the default process group); this rank is
    ``dist.get_rank(group)`` and plays that rank of the algorithm.

    Parameters
    ----------
    algorithm:
        A verified algorithm for ``dist.get_world_size(group)`` ranks (verified again here).
    input, output:
        This rank's tensors in torch's layout (docs/executor.md); ``output=None``: in place.
        For gather (scatter), ``output`` (``input``) may be the list of ``n`` tensors torch's
        ``gather_list`` (``scatter_list``) takes.
    group:
        The process group (gloo: CPU tensors; nccl: CUDA tensors).
    op:
        ``sum``, ``prod``, ``min``, ``max`` or ``avg`` (combining collectives only).
    timeout_s:
        Seconds the whole call may take; ``None``: the process group's timeout.

    Returns
    -------
    The output (the input for an in-place call).

    Raises
    ------
    InvalidBufferError
        Tensors that do not fit the collective's layout, an unknown op, ``avg`` on integers.
    ExecutionError
        A peer failed or a wait timed out; names this rank and the step.
    """
    torch, dist = torch_modules()
    out_list = in_list = None
    if isinstance(output, (list, tuple)):
        out_list = list(output)
        output = torch.cat([t.reshape(-1) for t in out_list]) if out_list else None
    if isinstance(input, (list, tuple)):
        in_list = list(input)
        input = torch.cat([t.reshape(-1) for t in in_list]) if in_list else None
    prepare(algorithm, input, output, group=group, op=op, timeout_s=timeout_s).run()
    if out_list is not None and output is not None:
        offset = 0
        for t in out_list:
            t.view(-1).copy_(output[offset: offset + t.numel()])
            offset += t.numel()
        return out_list
    if output is None:
        return in_list if in_list is not None else input
    return output


from collsynth.executor.program import PreparedProgram, prepare_program, run_program  # noqa: E402
