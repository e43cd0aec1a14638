"""Prove a run against PyTorch's own collective, and time both.

The details: ``docs/executor.md``, section "Comparing with the runtime's own collectives".
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Sequence

from collsynth.algorithm.model import Algorithm
from collsynth.collective.model import Collective
from collsynth.export.mscclpp.model import Plan
from collsynth.export.program import Program
from collsynth.executor._common import (
    DEFAULT_TIMEOUT_S,
    ExecutionError,
    InvalidBufferError,
    UnrunnableProgramError,
    check_op,
    torch_modules,
)
from collsynth.executor.executor import block_counts, collective_kind, prepare
from collsynth.executor.mscclpp_plan import plan_kind, prepare_plan
from collsynth.executor.program import prepare_program, program_kind

if TYPE_CHECKING:  # pragma: no cover - typing only
    import torch

__all__ = ["Case", "CaseResult", "Timing", "run_case", "run_cases", "tolerance",
           "size_bytes", "DTYPES", "parse_dtype", "TORCH_CALLS"]

#: dtype names accepted by :func:`parse_dtype` (also ``torch.float32`` spellings).
DTYPES = ("float32", "float64", "float16", "bfloat16", "int8", "uint8", "int16", "int32",
          "int64")
#: The torch call each collective is checked against.
TORCH_CALLS = {
    "allgather": "all_gather_into_tensor", "reduce_scatter": "reduce_scatter_tensor",
    "allreduce": "all_reduce", "alltoall": "all_to_all_single", "broadcast": "broadcast",
    "reduce": "reduce", "gather": "gather", "scatter": "scatter",
    "custom": "all_gather_into_tensor + local computation",
    "custom_gather": "gather", "custom_scatter": "scatter",
}


def parse_dtype(name: str) -> "torch.dtype":
    """``"bfloat16"`` (or ``"torch.bfloat16"``, ``"bf16"``, ``"fp32"``...) -> ``torch.bfloat16``."""
    torch, _ = torch_modules()
    key = str(name).strip().lower().removeprefix("torch.")
    key = {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "fp32": "float32",
           "float": "float32", "fp64": "float64", "double": "float64", "int": "int32",
           "long": "int64"}.get(key, key)
    if key not in DTYPES:
        raise InvalidBufferError(f"unknown dtype {name!r}; valid: {', '.join(DTYPES)}")
    return getattr(torch, key)


def tolerance(dtype: "torch.dtype", num_ranks: int, op: str) -> float:
    """The accepted absolute and relative difference from torch (0: exact) for a combining
    collective: 0 for integers and ``min``/``max``, else ``4 * num_ranks * eps(dtype)`` (bf16
    on 8 ranks: 0.25; fp32 on 8 ranks: 3.8e-6)."""
    torch, _ = torch_modules()
    if not dtype.is_floating_point or op in ("min", "max"):
        return 0.0
    return 4 * num_ranks * torch.finfo(dtype).eps



def size_bytes(kind: str, num_ranks: int, block_elems: int, element_size: int,
               base_chunks: int = 1) -> int:
    """nccl-tests' ``size`` of a call: the larger buffer of one rank, in bytes.

    >>> size_bytes("allgather", 4, 256, 4), size_bytes("allreduce", 4, 256, 4)
    (4096, 1024)
    """
    if kind in ("allgather", "reduce_scatter", "alltoall", "gather", "scatter",
                "custom_gather", "custom_scatter"):
        blocks = num_ranks
    elif kind == "custom":
        blocks = base_chunks
    else:
        blocks = 1
    return blocks * block_elems * element_size


@dataclass(frozen=True)
class Case:
    """One run to check (and time).

    Give ``algorithm``, or ``program`` with ``collective`` (the collective it implements, split
    as in the algorithm it came from; only ``program``'s root and custom conditions are read
    from it, and it may be ``None`` for a standard, unrooted ``coll``), or an MSCCL++ ``plan``.
    ``block_elems`` is ``m``, the elements of one base chunk (see
    :mod:`collsynth.executor.executor`).
    """

    name: str
    block_elems: int
    algorithm: Algorithm | None = None
    program: Program | None = None
    collective: Collective | None = None
    dtype: str = "float32"
    op: str = "sum"
    inplace: bool = False
    seed: int = 0
    iters: int = 0
    warmup: int = 1
    timeout_s: float | None = DEFAULT_TIMEOUT_S
    root: int | None = None
    plan: Plan | None = None     # an MSCCL++ execution plan


@dataclass(frozen=True)
class Timing:
    """Per-iteration seconds (the slowest rank's) and their summary."""

    seconds: tuple[float, ...]

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)

    @property
    def min(self) -> float:
        return min(self.seconds)

    @property
    def max(self) -> float:
        return max(self.seconds)


@dataclass(frozen=True)
class CaseResult:
    """What one rank found for one case. ``ok`` is false on a wrong result or an error."""

    name: str
    rank: int
    ok: bool
    max_error: float = 0.0
    tolerance: float = 0.0
    checked_elements: int = 0
    error: str | None = None
    kind: str = ""
    size_bytes: int = 0
    collsynth: Timing | None = None
    torch: Timing | None = None
    details: dict[str, Any] = field(default_factory=dict)


# -- inputs ---------------------------------------------------------------------------------------


def _random(torch, numel: int, dtype, op: str, seed: int, device) -> "torch.Tensor":
    gen = torch.Generator().manual_seed(seed & 0x7FFF_FFFF_FFFF_FFFF)
    if dtype.is_floating_point:
        low, high = (0.5, 1.5) if op == "prod" else (-1.0, 1.0)
        values = torch.rand(numel, generator=gen, dtype=torch.float64) * (high - low) + low
    else:
        low, high = (1, 3) if op == "prod" else (-8, 8)
        if dtype == torch.uint8:
            low, high = max(low, 0), max(high, 1)
        values = torch.randint(low, high, (numel,), generator=gen, dtype=torch.int64)
    return values.to(dtype=dtype, device=device)


def _seed(*parts: int) -> int:
    value = 1469598103934665603
    for part in parts:
        value = ((value ^ (part & 0xFFFF_FFFF)) * 1099511628211) & 0xFFFF_FFFF_FFFF_FFFF
    return value


@dataclass
class _Setup:
    kind: str
    root: int | None
    collective: Collective | None
    base_chunks: int
    n: int


def _setup(case: Case, n: int) -> _Setup:
    if case.algorithm is not None:
        coll = case.algorithm.collective
        kind = collective_kind(coll)
        root = coll.roots[0] if coll.roots else None
    elif case.plan is not None:
        kind, coll, root = plan_kind(case.plan), None, None
        if kind not in ("allgather", "allreduce", "reduce_scatter", "alltoall"):
            raise InvalidBufferError(f"plan collective {case.plan.collective!r} has no torch "
                                     "reference here")
    elif case.program is not None:
        kind = program_kind(case.program)
        coll = case.collective
        root = case.root
        if coll is not None:
            ckind = collective_kind(coll)
            root = coll.roots[0] if coll.roots else root
            if kind == "custom" and ckind in ("gather", "scatter"):
                kind = f"custom_{ckind}"     # msccl writes gather/scatter as custom
            elif kind != ckind and kind != "custom":
                raise InvalidBufferError(f"program coll={case.program.coll!r} but the "
                                         f"collective is {coll.describe()}")
        elif kind == "custom":
            raise InvalidBufferError("a coll=\"custom\" program's result cannot be checked "
                                     "without its collective (run the algorithm file instead)")
        if kind in ("broadcast", "reduce", "gather", "scatter", "custom_gather",
                    "custom_scatter") and root is None:
            raise InvalidBufferError(f"a {kind} program hard-codes its root, which the XML does "
                                     "not name: give the root")
    else:
        raise InvalidBufferError(f"case {case.name!r} has neither an algorithm nor a program")
    base = 1
    if kind == "custom" and coll is not None:
        base = coll.num_chunks // coll.chunk_factor
    return _Setup(kind, root, coll, base, n)


def _blocks(setup: _Setup, rank: int) -> tuple[int, int]:
    if setup.kind == "custom_gather":
        return setup.n, (setup.n if rank == setup.root else 0)
    if setup.kind == "custom_scatter":
        return (setup.n if rank == setup.root else 0), setup.n
    return block_counts(setup.kind, setup.n, rank, setup.root, setup.base_chunks)


def _inputs(setup: _Setup, case: Case, rank: int, dtype, device, torch) -> "torch.Tensor | None":
    """This rank's input data (flat), or ``None`` when the rank has no input."""
    m = case.block_elems
    in_blocks, _ = _blocks(setup, rank)
    if not in_blocks:
        return None
    if setup.kind == "custom":
        coll = setup.collective
        C = coll.chunk_factor
        data = torch.zeros(in_blocks * m, dtype=dtype, device=device)
        for b in range(setup.base_chunks):
            if rank in coll.precondition[b * C]:
                # Non-combining: every holder has the same value of the chunk.
                seed = _seed(case.seed, b, rank if coll.combining else 0x5EED)
                data[b * m: (b + 1) * m] = _random(torch, m, dtype, case.op, seed, device)
        return data
    data = _random(torch, in_blocks * m, dtype, case.op, _seed(case.seed, rank), device)
    if setup.kind == "custom_gather":
        data[m:] = 0   # msccl's custom gather reads only the first block
    return data


def _sentinel(torch, numel: int, dtype, device) -> "torch.Tensor":
    if dtype.is_floating_point:
        return torch.full((numel,), float("nan"), dtype=dtype, device=device)
    return torch.full((numel,), 77 if dtype == torch.uint8 else -77, dtype=dtype, device=device)


def _tensors(setup: _Setup, case: Case, rank: int, data, dtype, device, torch
             ) -> tuple[Any, Any]:
    """The (input, output) tensors of this rank's call, aliased when in place."""
    m = case.block_elems
    in_blocks, out_blocks = _blocks(setup, rank)
    kind = setup.kind
    if not case.inplace:
        inp = data.clone() if data is not None else None
        out = _sentinel(torch, out_blocks * m, dtype, device) if out_blocks else None
        return inp, out
    if kind in ("allgather", "gather") and out_blocks:
        out = _sentinel(torch, out_blocks * m, dtype, device)
        inp = out[rank * m: (rank + 1) * m]
        inp.copy_(data)
        return inp, out
    if kind in ("reduce_scatter", "scatter") and in_blocks:
        inp = data.clone()
        return inp, inp[rank * m: (rank + 1) * m]
    if in_blocks == out_blocks or (in_blocks and out_blocks):
        buf = data.clone()
        return buf, buf
    if data is not None:
        return data.clone(), None
    buf = _sentinel(torch, out_blocks * m, dtype, device)
    if kind in ("scatter", "custom_scatter"):
        return None, buf
    # No input here (a broadcast's non-root): in place, the one tensor is both.
    return buf, buf


# -- the reference ---------------------------------------------------------------------------------


def _torch_op(dist, op: str):
    return {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.SUM, "prod": dist.ReduceOp.PRODUCT,
            "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX}[op]


def _reference_call(setup: _Setup, case: Case, rank: int, data, dtype, device, group,
                    torch, dist) -> Callable[[], Any]:
    """A closure running torch's collective on copies of ``data``; returns the expected
    output (flat) of this rank, or ``None`` where nothing is expected."""
    m, n, kind, root = case.block_elems, setup.n, setup.kind, setup.root
    op = _torch_op(dist, case.op)
    in_blocks, out_blocks = _blocks(setup, rank)
    inp = data.clone() if data is not None else None
    out = torch.empty(out_blocks * m, dtype=dtype, device=device) if out_blocks else None
    root_g = None if root is None else _global(dist, group, root)

    def call():
        if kind == "allgather":
            _all_gather(dist)(out, inp, group=group)
        elif kind == "reduce_scatter":
            _reduce_scatter(dist)(out, inp, op=op, group=group)
        elif kind == "allreduce":
            out.copy_(inp)
            dist.all_reduce(out, op=op, group=group)
        elif kind == "alltoall":
            dist.all_to_all_single(out, inp, group=group)
        elif kind == "broadcast":
            if rank == root:
                out.copy_(inp)
            dist.broadcast(out, src=root_g, group=group)
        elif kind == "reduce":
            scratch = inp.clone()
            dist.reduce(scratch, dst=root_g, op=op, group=group)
            if out is not None:
                out.copy_(scratch)
        elif kind in ("gather", "custom_gather"):
            parts = list(out[: n * m].view(n, m).unbind(0)) if rank == root else None
            dist.gather(inp[:m].contiguous(), gather_list=parts, dst=root_g, group=group)
        elif kind in ("scatter", "custom_scatter"):
            parts = list(inp[: n * m].view(n, m).unbind(0)) if rank == root else None
            target = torch.empty(m, dtype=dtype, device=device)
            dist.scatter(target, scatter_list=parts, src=root_g, group=group)
            out[:m].copy_(target)
        elif kind == "custom":
            _custom_reference(setup, case, rank, inp, out, group, torch, dist)
        return out

    return call


def _all_gather(dist):
    """``all_gather_single`` where torch has it (it deprecates ``all_gather_into_tensor``)."""
    return getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def _reduce_scatter(dist):
    return getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def _custom_reference(setup: _Setup, case: Case, rank: int, inp, out, group, torch, dist):
    coll, m, n = setup.collective, case.block_elems, setup.n
    C, B = coll.chunk_factor, setup.base_chunks
    everyone = torch.empty(n * B * m, dtype=inp.dtype, device=inp.device)
    _all_gather(dist)(everyone, inp.contiguous(), group=group)
    blocks = everyone.view(n, B, m)
    for b in range(B):
        if rank not in coll.postcondition[b * C]:
            continue
        holders = sorted(coll.precondition[b * C])
        value = blocks[holders[0], b].clone()
        if coll.combining:
            for q in holders[1:]:
                _combine(torch, case.op, value, blocks[q, b])
        out[b * m: (b + 1) * m] = value


def _combine(torch, op: str, acc, x) -> None:
    if op in ("sum", "avg"):
        acc.add_(x)
    elif op == "prod":
        acc.mul_(x)
    elif op == "min":
        torch.minimum(acc, x, out=acc)
    else:
        torch.maximum(acc, x, out=acc)


def _global(dist, group, rank: int) -> int:
    if group is None or group is dist.group.WORLD:
        return rank
    return dist.get_global_rank(group, rank)


def _checked_region(setup: _Setup, case: Case, rank: int) -> list[tuple[int, int]]:
    """Element ranges of this rank's output that the collective defines."""
    m, kind = case.block_elems, setup.kind
    _, out_blocks = _blocks(setup, rank)
    if not out_blocks:
        return []
    if kind in ("reduce", "gather", "custom_gather") and rank != setup.root:
        return []
    if kind == "custom_scatter":
        return [(0, m)]
    if kind == "custom":
        coll, C = setup.collective, setup.collective.chunk_factor
        return [(b * m, (b + 1) * m) for b in range(setup.base_chunks)
                if rank in coll.postcondition[b * C]]
    return [(0, out_blocks * m)]


def _combining(setup: _Setup) -> bool:
    if setup.kind == "custom":
        return setup.collective.combining
    return setup.kind in ("allreduce", "reduce_scatter", "reduce")


def _contributions(setup: _Setup, rank: int, start: int, m: int) -> int:
    if setup.kind == "custom":
        coll = setup.collective
        return len(coll.precondition[(start // m) * coll.chunk_factor])
    return setup.n


# -- one case --------------------------------------------------------------------------------------


def _time(fn: Callable[[], Any], iters: int, warmup: int, group, device, torch, dist
          ) -> Timing:
    cuda = device.type == "cuda"
    for _ in range(warmup):
        fn()
    if cuda:
        torch.cuda.synchronize(device)
    times = []
    for _ in range(iters):
        dist.barrier(group=group)
        if cuda:
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        fn()
        if cuda:
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
    slowest = torch.tensor(times, dtype=torch.float64, device=device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX, group=group)
    return Timing(tuple(float(t) for t in slowest.cpu()))


def run_case(case: Case, *, group: Any = None, device: Any = None) -> CaseResult:
    """Run ``case`` on this rank (collectively: every rank of ``group`` calls it).

    Errors that every rank raises alike (bad tensors, an op the dtype cannot take) are
    returned as a failed result; an :class:`~collsynth.executor.ExecutionError` (the group is
    broken) propagates.
    """
    torch, dist = torch_modules()
    rank, n = dist.get_rank(group), dist.get_world_size(group)
    if device is None:
        backend = str(dist.get_backend(group)).lower()
        device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" \
            else torch.device("cpu")
    try:
        dtype = parse_dtype(case.dtype)
        setup = _setup(case, n)
        op = check_op(case.op, dtype, allow_avg=case.program is None and case.plan is None,
                      combining=_combining(setup))
    except InvalidBufferError as exc:
        return CaseResult(case.name, rank, False, error=str(exc))
    m = case.block_elems
    kind = setup.kind
    size = size_bytes(kind, n, m, torch.empty((), dtype=dtype).element_size(),
                      setup.base_chunks)
    data = _inputs(setup, case, rank, dtype, device, torch)
    inp, out = _tensors(setup, case, rank, data, dtype, device, torch)
    problem = None
    try:
        if case.algorithm is not None:
            prepared = prepare(case.algorithm, inp, out, group=group, op=op,
                               timeout_s=case.timeout_s)
        elif case.plan is not None:
            prepared = prepare_plan(case.plan, inp, out, group=group, op=op,
                                    timeout_s=case.timeout_s)
        else:
            prepared = prepare_program(case.program, inp, out, group=group, op=op,
                                       timeout_s=case.timeout_s)
    except (InvalidBufferError, UnrunnableProgramError) as exc:
        problem = str(exc)
    # Every rank must agree to run: one rank refusing would leave the others waiting.
    refused = torch.tensor([0 if problem is None else 1], dtype=torch.int32, device=device)
    dist.all_reduce(refused, op=dist.ReduceOp.MAX, group=group)
    if int(refused.item()):
        return CaseResult(case.name, rank, False, kind=kind, size_bytes=size,
                          error=problem or "another rank refused the case")
    prepared.run()
    got = out if out is not None else inp
    reference = _reference_call(setup, case, rank, data, dtype, device, group, torch, dist)
    want = reference()
    # Data that is only moved must arrive bit for bit.
    tol = tolerance(dtype, n, op) if _combining(setup) else 0.0
    worst, checked, ok = 0.0, 0, True
    for start, stop in _checked_region(setup, case, rank):
        a = got.reshape(-1)[start:stop]
        b = want[start:stop].clone()
        if op == "avg" and _combining(setup):
            b = b / _contributions(setup, rank, start, m)
        checked += stop - start
        if not checked or stop == start:
            continue
        if tol == 0.0:
            equal = torch.equal(a, b)
            diff = (a.double() - b.double()).abs()
            diff = torch.where(torch.isnan(diff), torch.full_like(diff, float("inf")), diff)
            worst = max(worst, float(diff.max()))
            ok = ok and equal
        else:
            a64, b64 = a.double(), b.double()
            diff = (a64 - b64).abs()
            bad = ~(diff <= tol + tol * b64.abs())   # NaN counts as bad
            diff = torch.where(torch.isnan(diff), torch.full_like(diff, float("inf")), diff)
            worst = max(worst, float(diff.max()))
            ok = ok and not bool(bad.any())
    cs_timing = torch_timing = None
    if case.iters > 0:
        cs_timing = _time(prepared.run, case.iters, case.warmup, group, device, torch, dist)
        torch_timing = _time(reference, case.iters, case.warmup, group, device, torch, dist)
    return CaseResult(case.name, rank, ok, worst, tol, checked, None, kind, size, cs_timing,
                      torch_timing)


def run_cases(rank: int, world_size: int, cases: Sequence[Case], *, group: Any = None
              ) -> list[CaseResult]:
    """:func:`run_case` over a table, for :func:`collsynth.executor.launch.launch`
    (``launch(run_cases, n, args=(cases,))``).

    After an :class:`ExecutionError` the group is broken: that case and every later one are
    reported as failed, without running them.
    """
    results: list[CaseResult] = []
    broken: str | None = None
    for case in cases:
        if broken is not None:
            results.append(CaseResult(case.name, rank, False, error=f"not run: {broken}"))
            continue
        try:
            results.append(run_case(case, group=group))
        except ExecutionError as exc:
            broken = f"an earlier case broke the process group ({exc})"
            results.append(CaseResult(case.name, rank, False, error=str(exc)))
    return results
