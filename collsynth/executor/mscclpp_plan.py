"""Run an MSCCL++ execution plan with torch.distributed (gloo or NCCL point-to-point).

The plan's symbolic run (:func:`collsynth.export.mscclpp.checker.run_plan`, at this call's
chunk size) orders every transfer consistently with happens-before; each rank replays that
order on its tensors: a transfer's remote sources are sent to the rank that runs it, the result
is sent to its remote destinations. A plan whose run deadlocks or addresses outside its
buffers is refused. Details: ``docs/mscclpp.md``, section "Running plans with PyTorch".
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from collsynth.export.mscclpp.checker import run_plan
from collsynth.export.mscclpp.model import Plan
from collsynth.export.mscclpp.steps import Access
from collsynth.limits import Deadline
from collsynth.executor._common import (
    DEFAULT_TIMEOUT_S,
    ExecutionError,
    InvalidBufferError,
    UnrunnableProgramError,
    global_rank,
    torch_modules,
    wait_all,
)

if TYPE_CHECKING:  # pragma: no cover - typing only
    import torch

__all__ = ["PreparedPlan", "prepare_plan", "execute_plan", "plan_kind", "REFUSED_KINDS"]

#: Problems of the symbolic run that make a plan impossible to replay.
REFUSED_KINDS = frozenset({"structure", "limit", "connection", "bounds", "deadlock", "format"})
_KINDS = {"reducescatter": "reduce_scatter"}


def plan_kind(plan: Plan) -> str:
    """The collective a plan implements, in collsynth's spelling."""
    return _KINDS.get(plan.collective, plan.collective)


class PreparedPlan:
    """One rank's replay of a plan on fixed tensors (see :func:`prepare_plan`)."""

    def __init__(self, plan: Plan, input: "torch.Tensor | None", output: "torch.Tensor | None",
                 *, group: Any, op: str, timeout_s: float | None) -> None:
        torch, dist = torch_modules()
        if not dist.is_initialized():
            raise ExecutionError("torch.distributed is not initialised: call "
                                 "init_process_group first (or use collsynth.executor.launch)")
        if op != "sum":
            raise InvalidBufferError(f"op={op!r}: MSCCL++'s kernel reduces with a sum only")
        self.plan, self.group, self.timeout_s = plan, group, timeout_s
        self.rank = me = dist.get_rank(group)
        n = dist.get_world_size(group)
        if n != plan.num_ranks:
            raise InvalidBufferError(f"plan {plan.name!r} is for {plan.num_ranks} ranks but the "
                                     f"process group has {n}")
        if input is None:
            raise InvalidBufferError(f"rank {me}: pass the input tensor")
        output = input if output is None else output
        for t in (input, output):
            if not t.is_contiguous():
                raise InvalidBufferError("input and output must be contiguous")
        self._input, self._output = input, output
        inp, out = input.view(-1), output.view(-1)
        a0, a1 = inp.data_ptr(), inp.data_ptr() + inp.numel() * inp.element_size()
        b0, b1 = out.data_ptr(), out.data_ptr() + out.numel() * out.element_size()
        in_place = a0 < b1 and b0 < a1
        if in_place != plan.inplace:
            raise InvalidBufferError(f"plan {plan.name!r} is for "
                                     f"{'in-place' if plan.inplace else 'out-of-place'} calls; "
                                     f"this call is {'in-place' if in_place else 'out-of-place'}")
        size = inp.element_size()
        gpu = plan.gpus[me]
        in_bytes = inp.numel() * size
        if gpu.input_chunks == 0 or in_bytes % gpu.input_chunks:
            raise InvalidBufferError(f"rank {me}: the input's {in_bytes} bytes are not "
                                     f"{gpu.input_chunks} equal chunks")
        chunk = in_bytes // gpu.input_chunks
        if out.numel() * size != gpu.output_chunks * chunk:
            raise InvalidBufferError(f"rank {me}: the output has {out.numel() * size} bytes; the "
                                     f"plan's {gpu.output_chunks} chunks of {chunk} need "
                                     f"{gpu.output_chunks * chunk}")
        machine, geo, problems, _, _ = run_plan(plan, chunk_bytes=chunk)
        refused = [p for p in problems if p.kind in REFUSED_KINDS]
        if machine is None or refused:
            first = refused[0] if refused else (problems[0] if problems else None)
            raise UnrunnableProgramError(f"plan {plan.name!r} cannot run at {chunk}-byte chunks: "
                                         + (f"{first.kind}: {first.message}" if first else
                                            "it could not be executed"))
        if machine.A % size:
            raise InvalidBufferError(f"plan {plan.name!r} moves {machine.A}-byte pieces, not "
                                     f"whole {size}-byte elements")
        self.cell, self.size = machine.A, size
        self.actions = machine.actions
        scratch_end = 0
        for action in self.actions:
            for acc in action.srcs + action.dsts:
                if acc.rank == me and acc.buffer == "s":
                    scratch_end = max(scratch_end, (acc.offset + acc.length) *
                                      (2 if acc.packet else 1))
        self.buffers = {"i": inp, "o": out,
                        "s": torch.zeros(-(-scratch_end // size), dtype=inp.dtype,
                                         device=inp.device)}
        self.peers = {r: global_rank(dist, group, r) for r in range(n)}

    def _view(self, acc: Access, raw: bool = False):
        """The tensor view of ``acc`` on this rank: a packet range's payload is the first
        half of each pair of cells (both halves for a raw copy)."""
        buf, size = self.buffers[acc.buffer], self.size
        if not acc.packet:
            return buf[acc.offset // size: (acc.offset + acc.length) // size]
        region = buf[2 * acc.offset // size: 2 * (acc.offset + acc.length) // size]
        if raw:
            return region
        per = self.cell // size
        return region.view(-1, 2, per)[:, 0, :]

    def _read(self, acc: Access, raw: bool):
        return self._view(acc, raw).reshape(-1).clone()

    def _write(self, acc: Access, raw: bool, value) -> None:
        view = self._view(acc, raw)
        view.copy_(value.view(view.shape))

    def _count(self, acc: Access, raw: bool) -> int:
        return (2 * acc.length if raw and acc.packet else acc.length) // self.size

    def run(self) -> "torch.Tensor":
        """Replay the plan once; returns the output tensor.

        Raises
        ------
        ExecutionError
            A peer failed or a wait timed out.
        """
        torch, dist = torch_modules()
        me, deadline = self.rank, Deadline(self.timeout_s)
        ref = self.buffers["i"]
        sends: list[Any] = []

        def receive(count: int, peer: int, k: int, what: str):
            tmp = torch.empty(count, dtype=ref.dtype, device=ref.device)
            work = dist.irecv(tmp, self.peers[peer], group=self.group)
            wait_all([work], [f"action {k}: {what} from rank {peer}"], deadline=deadline,
                     nccl=False, rank=me, step=k, where="action")
            return tmp

        for k, action in enumerate(self.actions):
            raw = action.mode == "raw"
            x = action.actor_rank
            incoming = []
            for acc in action.srcs:
                if acc.rank == me and x != me:
                    sends.append(dist.isend(self._read(acc, raw), self.peers[x],
                                            group=self.group))
                elif x == me:
                    incoming.append(self._read(acc, raw) if acc.rank == me else
                                    receive(self._count(acc, raw), acc.rank, k, "data"))
            value = None
            if x == me:
                value = incoming[0]
                for more in incoming[1:]:
                    value = value + more
            for acc in action.dsts:
                if x == me and acc.rank != me:
                    sends.append(dist.isend(value, self.peers[acc.rank], group=self.group))
                elif acc.rank == me and x != me:
                    self._write(acc, raw, receive(self._count(acc, raw), x, k, "a result"))
                elif x == me:
                    self._write(acc, raw, value)
        wait_all(sends, [f"{len(sends)} send(s)"] * len(sends), deadline=deadline, nccl=False,
                 rank=me, step=len(self.actions), where="action")
        return self._output


def prepare_plan(plan: Plan, input: "torch.Tensor", output: "torch.Tensor | None" = None, *,
                 group: Any = None, op: str = "sum",
                 timeout_s: float | None = DEFAULT_TIMEOUT_S) -> PreparedPlan:
    """Plan the replay of ``plan`` once for fixed tensors; ``.run()`` executes it.

    Call it on every rank of ``group``; tensors are torch's for the plan's collective (in
    place: the input inside the output as torch lays it out).

    Raises
    ------
    InvalidBufferError
        Tensors that do not fit the plan, or a layout it is not for.
    UnrunnableProgramError
        A plan whose symbolic run deadlocks, leaves its buffers or breaks a static rule.
    """
    return PreparedPlan(plan, input, output, group=group, op=op, timeout_s=timeout_s)


def execute_plan(plan: Plan, input: "torch.Tensor", output: "torch.Tensor | None" = None, *,
                 group: Any = None, op: str = "sum",
                 timeout_s: float | None = DEFAULT_TIMEOUT_S) -> "torch.Tensor":
    """Run ``plan`` once on this rank's tensors (see :func:`prepare_plan`)."""
    return prepare_plan(plan, input, output, group=group, op=op, timeout_s=timeout_s).run()
