"""What the algorithm executor and the program interpreter share: errors, reduction operators,
torch access and monitored waits.

PyTorch is an optional dependency of collsynth, so it is imported lazily (:func:`torch_modules`)
and a missing installation is one clear :class:`BackendUnavailableError`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from collsynth.errors import CollsynthError
from collsynth.limits import Deadline

if TYPE_CHECKING:  # pragma: no cover - typing only
    import torch

__all__ = [
    "ExecutionError",
    "ExecutionTimeoutError",
    "InvalidBufferError",
    "BackendUnavailableError",
    "UnrunnableProgramError",
    "REDUCE_OPS",
    "DEFAULT_TIMEOUT_S",
    "torch_modules",
    "check_op",
    "reducer",
    "global_rank",
    "is_nccl",
    "wait_all",
]

#: Reduction operators the executors accept (``avg``: sum, then divide by the number of
#: contributions; floating-point and complex dtypes only).
REDUCE_OPS = ("sum", "prod", "min", "max", "avg")
#: Seconds one call may take before every wait still pending gives up (per call, not per wait).
DEFAULT_TIMEOUT_S = 300.0


class ExecutionError(CollsynthError):
    """A run that failed on one rank: a peer died, a message never came, torch raised.

    ``rank`` is the rank (in the group) that raised, ``step`` the algorithm step (or program
    level) it was in, ``None`` when not in one.
    """

    def __init__(self, message: str, *, rank: int | None = None, step: int | None = None) -> None:
        self.rank = rank
        self.step = step
        super().__init__(message)


class ExecutionTimeoutError(ExecutionError):
    """A wait that did not complete before the call's deadline (a peer hangs or is too slow)."""


class InvalidBufferError(CollsynthError, ValueError):
    """Tensors, operator or dtype that do not fit the collective: wrong sizes, devices, a
    missing tensor, an operator the dtype cannot take."""


class BackendUnavailableError(CollsynthError):
    """PyTorch (or its distributed package, or the GPUs a backend needs) is not there."""


class UnrunnableProgramError(CollsynthError, ValueError):
    """An MSCCL program that cannot be executed: it deadlocks, leaves messages unreceived, pairs
    sends and receives of different sizes, or uses an operation that has no meaning."""


def torch_modules() -> tuple[Any, Any]:
    """``(torch, torch.distributed)``, or :class:`BackendUnavailableError`."""
    try:
        import torch
        import torch.distributed as dist
    except ImportError as exc:  # pragma: no cover - torch is installed where tests run
        raise BackendUnavailableError(
            "collsynth.executor needs PyTorch: pip install torch (see the README)") from exc
    if not dist.is_available():  # pragma: no cover - builds without distributed
        raise BackendUnavailableError("this PyTorch build has no torch.distributed")
    return torch, dist


def check_op(op: str, dtype: "torch.dtype", *, allow_avg: bool = True,
             combining: bool = True) -> str:
    """Normalise ``op`` (case-insensitive) and refuse what ``dtype`` cannot take.

    For a collective that only moves data (``combining=False``) the operator is never applied:
    only its name is checked.
    """
    torch, _ = torch_modules()
    key = str(op).strip().lower()
    if key not in REDUCE_OPS:
        raise InvalidBufferError(f"unknown reduction op {op!r}; valid: {', '.join(REDUCE_OPS)}")
    if not combining:
        return key
    if key == "avg":
        if not allow_avg:
            raise InvalidBufferError("op 'avg' is not supported here: MSCCL programs have no "
                                     "average (the runtimes never use MSCCL for ncclAvg); use "
                                     "sum and divide")
        if not (dtype.is_floating_point or dtype.is_complex):
            raise InvalidBufferError(f"op 'avg' needs a floating-point dtype, not {dtype}: "
                                     "an integer average would round")
    if key in ("min", "max") and dtype.is_complex:
        raise InvalidBufferError(f"op {key!r} has no meaning for complex dtype {dtype}")
    if dtype == torch.bool and key != "max" and key != "min":
        raise InvalidBufferError(f"op {key!r} on torch.bool: use min (and) or max (or)")
    return key


def reducer(op: str) -> Callable[["torch.Tensor", "torch.Tensor"], None]:
    """``f(acc, x)``: ``acc <- acc (op) x`` in place (``avg`` reduces as ``sum``)."""
    torch, _ = torch_modules()
    if op in ("sum", "avg"):
        return lambda acc, x: acc.add_(x)
    if op == "prod":
        return lambda acc, x: acc.mul_(x)
    if op == "min":
        return lambda acc, x: torch.minimum(acc, x, out=acc)
    if op == "max":
        return lambda acc, x: torch.maximum(acc, x, out=acc)
    raise InvalidBufferError(f"unknown reduction op {op!r}")  # pragma: no cover - checked


def global_rank(dist: Any, group: Any, rank: int) -> int:
    """The global rank of group rank ``rank`` (what ``P2POp`` takes as ``peer``)."""
    if group is None or group is dist.group.WORLD:
        return rank
    return dist.get_global_rank(group, rank)


def is_nccl(dist: Any, group: Any) -> bool:
    """True when ``group`` (or the default group) runs on NCCL."""
    return str(dist.get_backend(group)).lower() == "nccl"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def wait_all(works: list[Any], descriptions: list[str], *, deadline: Deadline, nccl: bool,
             rank: int, step: int, where: str) -> None:
    """Wait for every work of one batch; a failure becomes an :class:`ExecutionError` that
    names ``rank``, ``step`` and what was being waited for.

    gloo works are waited with the time left before ``deadline``. NCCL works only order the
    current CUDA stream behind the communication (``wait()`` does not block the host); their
    time limit is the process group's own timeout, enforced by its watchdog.
    """
    for index, work in enumerate(works):
        what = descriptions[index] if len(descriptions) == len(works) else \
            f"{len(descriptions)} message(s)"
        try:
            if nccl:
                work.wait()
            else:
                left = deadline.remaining_timedelta()
                done = work.wait() if left is None else work.wait(timeout=left)
                if done is False:
                    raise RuntimeError("the wait returned without completing")
        except RuntimeError as exc:
            text = _first_line(exc)
            timed_out = "timed out" in text.lower() or "timeout" in text.lower()
            kind = ExecutionTimeoutError if timed_out else ExecutionError
            limit = f" (the call's timeout is {deadline.seconds:g} s)" if timed_out and \
                deadline.seconds is not None else ""
            raise kind(f"rank {rank}: {where} {step}: {what} failed{limit}: {text}",
                       rank=rank, step=step) from exc
