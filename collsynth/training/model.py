"""Models as lists of layers, each layer as the GEMMs and tensor-parallel collectives it runs.

The details (formats, conventions, rules) are in docs/training.md.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Union

from collsynth.errors import InvalidInstanceError
from collsynth.timing.kernels import Device, get_device, gemm_time_us

__all__ = [
    "Gemm",
    "TensorComm",
    "Op",
    "Layer",
    "Linear",
    "TransformerBlock",
    "mlp",
    "transformer",
    "LINEAR_ROLES",
]

#: The tensor-parallel roles of a :class:`Linear` layer (docs/training.md).
LINEAR_ROLES = ("column", "row", "column+gather")


def _positive_int(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidInstanceError(f"{name} = {value!r}; expected an integer >= 1")
    return value


@dataclass(frozen=True)
class Gemm:
    """``count`` independent GEMMs ``C[m, n] = A[m, k] @ B[k, n]`` run as one kernel.

    Parameters
    ----------
    name:
        What it computes, e.g. ``"forward"`` or ``"weight grad"``.
    m, n, k:
        The shape (see above); ``2 m n k`` flops each.
    count:
        Products in the kernel (a batched GEMM, e.g. one per attention head).

    >>> g = Gemm("scores", 128, 128, 64, count=16)
    >>> g.flops
    33554432
    >>> one = gemm_time_us(128, 128, 64, "a100")   # 4 us launch, then 16 times the rest
    >>> abs(g.time_us("a100") - (4.0 + 16 * (one - 4.0))) < 1e-9
    True
    """

    name: str
    m: int
    n: int
    k: int
    count: int = 1

    def __post_init__(self) -> None:
        for attr in ("m", "n", "k", "count"):
            _positive_int(getattr(self, attr), f"GEMM {self.name!r}: {attr}")

    @property
    def flops(self) -> int:
        """Floating-point operations: ``2 m n k count``."""
        return 2 * self.m * self.n * self.k * self.count

    def time_us(self, device: "str | Device", *, dtype: str = "fp16") -> float:
        """Microseconds on ``device``: one launch plus ``count`` products (docs/training.md)."""
        one = gemm_time_us(self.m, self.n, self.k, device, dtype=dtype)
        if self.count == 1:
            return one
        launch = get_device(device).launch_us
        return launch + self.count * (one - launch)

    def gradients(self, a_name: str = "input grad", b_name: str = "weight grad"
                  ) -> tuple["Gemm", "Gemm"]:
        """The backward GEMMs: ``dA = dC @ B^T`` ``(m, k, n)`` and ``dB = A^T @ dC`` ``(k, n, m)``.

        >>> [(g.name, g.m, g.n, g.k) for g in Gemm("fwd", 8, 4, 2).gradients()]
        [('input grad', 8, 2, 4), ('weight grad', 2, 4, 8)]
        """
        return (Gemm(a_name, self.m, self.k, self.n, self.count),
                Gemm(b_name, self.k, self.n, self.m, self.count))


@dataclass(frozen=True)
class TensorComm:
    """A collective over the tensor-parallel group.

    ``elements`` is the buffer in the nccl-tests convention (allreduce: the buffer; allgather:
    the output buffer); bytes = ``elements * dtype bytes``.
    """

    name: str
    collective: str
    elements: int


#: One operation of a layer.
Op = Union[Gemm, TensorComm]


class Layer(ABC):
    """A layer: its GEMMs and tensor-parallel collectives for a local batch.

    Subclasses are frozen dataclasses with a ``name``.
    """

    name: str

    @abstractmethod
    def forward_ops(self, batch: int, tensor: int, role: str = "column") -> tuple[Op, ...]:
        """The forward operations of one device of a ``tensor``-way group, for ``batch`` samples.

        ``role`` is the tensor-parallel role of a :class:`Linear` layer (ignored by others).
        """

    @abstractmethod
    def backward_ops(self, batch: int, tensor: int, role: str = "column") -> tuple[Op, ...]:
        """The backward operations, in the order they run."""

    @abstractmethod
    def weight_elements(self, tensor: int = 1) -> int:
        """Weight elements one device of a ``tensor``-way group holds (its gradient size)."""

    @abstractmethod
    def input_elements(self, batch: int) -> int:
        """Elements of the layer's input for ``batch`` samples (whole, not sharded)."""

    @abstractmethod
    def output_elements(self, batch: int) -> int:
        """Elements of the layer's output for ``batch`` samples (whole, not sharded)."""

    @abstractmethod
    def check_tensor(self, tensor: int) -> None:
        """Raise :class:`~collsynth.errors.InvalidInstanceError` unless ``tensor`` divides the
        dimensions the layer splits."""

    def compute_time_us(self, batch: int, tensor: int, device: "str | Device", *,
                        dtype: str = "fp16", role: str = "column") -> float:
        """Forward plus backward GEMM time of one device (no communication)."""
        ops = self.forward_ops(batch, tensor, role) + self.backward_ops(batch, tensor, role)
        return sum(op.time_us(device, dtype=dtype) for op in ops if isinstance(op, Gemm))


@dataclass(frozen=True)
class Linear(Layer):
    """A fully connected layer ``Y[batch, out] = X[batch, in] @ W[in, out]`` (no bias).

    Forward: one GEMM ``(batch, out, in)``; backward: ``(batch, in, out)`` (input gradient) and
    ``(in, out, batch)`` (weight gradient); split by ``role`` under tensor parallelism (module
    docstring).

    Raises
    ------
    InvalidInstanceError
        For sizes that are not positive integers.

    >>> Linear(4096, 1024).weight_elements()
    4194304

    A 1024-wide Linear layer on 64 samples, unsplit and as a column layer of a 2-way tensor group:

    >>> layer = Linear(1024, 1024)
    >>> [(op.m, op.n, op.k) for op in layer.forward_ops(64, 1)]
    [(64, 1024, 1024)]
    >>> for op in layer.backward_ops(64, 2, "column"):
    ...     print(op)
    Gemm(name='input grad', m=64, n=1024, k=512, count=1)
    Gemm(name='weight grad', m=1024, n=512, k=64, count=1)
    TensorComm(name='allreduce input grad', collective='allreduce', elements=65536)
    >>> layer.weight_elements(2)
    524288
    """

    in_features: int
    out_features: int
    name: str = "linear"

    def __post_init__(self) -> None:
        _positive_int(self.in_features, f"layer {self.name!r}: in_features")
        _positive_int(self.out_features, f"layer {self.name!r}: out_features")

    def _check_role(self, role: str) -> None:
        if role not in LINEAR_ROLES:
            raise InvalidInstanceError(f"layer {self.name!r}: role {role!r}; expected one of "
                                       f"{', '.join(LINEAR_ROLES)}")

    def forward_ops(self, batch: int, tensor: int, role: str = "column") -> tuple[Op, ...]:
        self._check_role(role)
        self.check_tensor(tensor)
        m, fan_in, fan_out = batch, self.in_features, self.out_features
        split = tensor > 1
        if role == "row":
            return (Gemm("forward", m, fan_out, fan_in // tensor),) + (
                (TensorComm("allreduce output", "allreduce", m * fan_out),) if split else ())
        ops: tuple[Op, ...] = (Gemm("forward", m, fan_out // tensor, fan_in),)
        if role == "column+gather" and split:
            ops += (TensorComm("allgather output", "allgather", m * fan_out),)
        return ops

    def backward_ops(self, batch: int, tensor: int, role: str = "column") -> tuple[Op, ...]:
        self._check_role(role)
        self.check_tensor(tensor)
        m, fan_in, fan_out = batch, self.in_features, self.out_features
        if role == "row":
            return Gemm("forward", m, fan_out, fan_in // tensor).gradients()
        return Gemm("forward", m, fan_out // tensor, fan_in).gradients() + (
            (TensorComm("allreduce input grad", "allreduce", m * fan_in),) if tensor > 1 else ())

    def weight_elements(self, tensor: int = 1) -> int:
        return self.in_features * self.out_features // tensor

    def input_elements(self, batch: int) -> int:
        return batch * self.in_features

    def output_elements(self, batch: int) -> int:
        return batch * self.out_features

    def check_tensor(self, tensor: int) -> None:
        _positive_int(tensor, "tensor degree")
        if self.in_features % tensor or self.out_features % tensor:
            raise InvalidInstanceError(
                f"layer {self.name!r} ({self.in_features} -> {self.out_features}): tensor degree "
                f"{tensor} must divide both in_features and out_features")


@dataclass(frozen=True)
class TransformerBlock(Layer):
    """A transformer block: self-attention then a two-GEMM feed-forward network.

    For ``batch`` sequences of ``seq_len`` tokens (``T = batch * seq_len``), ``hidden`` width,
    ``heads`` heads of ``d = hidden / heads``, FFN width ``F = ffn_mult * hidden``, on one device
    of a ``t``-way tensor group (``t = 1``: unsplit), the forward GEMMs are:

    ==================  =========================  =========
    GEMM                shape ``(m, n, k)``        count
    ==================  =========================  =========
    QKV projection      ``(T, 3 hidden / t, hidden)``  1
    attention scores    ``(seq, seq, d)``          ``batch * heads / t``
    attention values    ``(seq, d, seq)``          ``batch * heads / t``
    output projection   ``(T, hidden, hidden / t)``    1
    FFN up              ``(T, F / t, hidden)``     1
    FFN down            ``(T, hidden, F / t)``     1
    ==================  =========================  =========

    each with its two backward GEMMs (:meth:`Gemm.gradients`). With ``t > 1``: an allreduce of
    ``T * hidden`` elements after the output projection and after FFN down (forward), and of the
    input gradients of the QKV projection and FFN up (backward). Weights:
    ``(4 hidden^2 + 2 F hidden) / t`` elements per device (biases and layer norms left out).

    Raises
    ------
    InvalidInstanceError
        For non-positive sizes or ``heads`` not dividing ``hidden``.

    >>> block = TransformerBlock(hidden=1024, heads=16, seq_len=512)
    >>> [op.name for op in block.forward_ops(2, 1) if isinstance(op, Gemm)]
    ['qkv', 'attention scores', 'attention values', 'output projection', 'ffn up', 'ffn down']
    >>> block.weight_elements()
    12582912
    """

    hidden: int
    heads: int
    seq_len: int
    ffn_mult: int = 4
    name: str = "block"

    def __post_init__(self) -> None:
        for attr in ("hidden", "heads", "seq_len", "ffn_mult"):
            _positive_int(getattr(self, attr), f"layer {self.name!r}: {attr}")
        if self.hidden % self.heads:
            raise InvalidInstanceError(f"layer {self.name!r}: heads = {self.heads} does not "
                                       f"divide hidden = {self.hidden}")

    @property
    def ffn(self) -> int:
        """FFN width ``ffn_mult * hidden``."""
        return self.ffn_mult * self.hidden

    def _gemms(self, batch: int, tensor: int) -> tuple[Gemm, ...]:
        self.check_tensor(tensor)
        h, s, t = self.hidden, self.seq_len, tensor
        tokens, head_dim, local_heads = batch * s, h // self.heads, batch * self.heads // t
        return (Gemm("qkv", tokens, 3 * h // t, h),
                Gemm("attention scores", s, s, head_dim, local_heads),
                Gemm("attention values", s, head_dim, s, local_heads),
                Gemm("output projection", tokens, h, h // t),
                Gemm("ffn up", tokens, self.ffn // t, h),
                Gemm("ffn down", tokens, h, self.ffn // t))

    def forward_ops(self, batch: int, tensor: int, role: str = "column") -> tuple[Op, ...]:
        qkv, scores, values, proj, up, down = self._gemms(batch, tensor)
        activations = batch * self.seq_len * self.hidden
        if tensor == 1:
            return qkv, scores, values, proj, up, down
        return (qkv, scores, values, proj,
                TensorComm("allreduce attention output", "allreduce", activations),
                up, down, TensorComm("allreduce ffn output", "allreduce", activations))

    def backward_ops(self, batch: int, tensor: int, role: str = "column") -> tuple[Op, ...]:
        qkv, scores, values, proj, up, down = self._gemms(batch, tensor)
        activations = batch * self.seq_len * self.hidden
        ops: list[Op] = []
        for gemm in (down, up):
            ops += _named_gradients(gemm)
        if tensor > 1:
            ops.append(TensorComm("allreduce ffn input grad", "allreduce", activations))
        ops += _named_gradients(proj)
        ops += _named_gradients(values, ("probabilities grad", "values grad"))
        ops += _named_gradients(scores, ("queries grad", "keys grad"))
        ops += _named_gradients(qkv)
        if tensor > 1:
            ops.append(TensorComm("allreduce attention input grad", "allreduce", activations))
        return tuple(ops)

    def weight_elements(self, tensor: int = 1) -> int:
        return (4 * self.hidden * self.hidden + 2 * self.ffn * self.hidden) // tensor

    def input_elements(self, batch: int) -> int:
        return batch * self.seq_len * self.hidden

    def output_elements(self, batch: int) -> int:
        return batch * self.seq_len * self.hidden

    def check_tensor(self, tensor: int) -> None:
        _positive_int(tensor, "tensor degree")
        if self.heads % tensor or self.ffn % tensor:
            raise InvalidInstanceError(
                f"layer {self.name!r}: tensor degree {tensor} must divide heads = {self.heads} "
                f"and the FFN width {self.ffn}")


def _named_gradients(gemm: Gemm, names: tuple[str, str] = ("input grad", "weight grad")
                     ) -> tuple[Gemm, Gemm]:
    a, b = gemm.gradients(*names)
    return (Gemm(f"{gemm.name} {a.name}", a.m, a.n, a.k, a.count),
            Gemm(f"{gemm.name} {b.name}", b.m, b.n, b.k, b.count))


def mlp(num_layers: int, width: int) -> tuple[Linear, ...]:
    """``num_layers`` Linear layers of ``width x width``, named ``linear0``, ``linear1``...

    >>> [layer.name for layer in mlp(3, 256)]
    ['linear0', 'linear1', 'linear2']
    """
    _positive_int(num_layers, "num_layers")
    _positive_int(width, "width")
    return tuple(Linear(width, width, name=f"linear{i}") for i in range(num_layers))


def transformer(num_blocks: int, hidden: int, heads: int, seq_len: int, *,
                ffn_mult: int = 4) -> tuple[TransformerBlock, ...]:
    """``num_blocks`` identical :class:`TransformerBlock` layers, named ``block0``...

    >>> len(transformer(4, 1024, 16, 512))
    4
    """
    _positive_int(num_blocks, "num_blocks")
    return tuple(TransformerBlock(hidden, heads, seq_len, ffn_mult, name=f"block{i}")
                 for i in range(num_blocks))
