"""Layers as GEMMs and tensor-parallel collectives, against shapes worked out by hand."""

from __future__ import annotations

import pytest

from collsynth.errors import InvalidInstanceError
from collsynth.timing.kernels import gemm_time_us, get_device
from collsynth.training.model import Gemm, Linear, TensorComm, TransformerBlock, mlp, transformer


def shapes(ops):
    return [(op.m, op.n, op.k, op.count) if isinstance(op, Gemm) else (op.collective, op.elements)
            for op in ops]


def test_linear_unsplit_is_three_gemms():
    layer = Linear(300, 200)
    assert shapes(layer.forward_ops(16, 1)) == [(16, 200, 300, 1)]
    # dX = dY @ W^T: (16, 300, 200); dW = X^T @ dY: (300, 200, 16).
    assert shapes(layer.backward_ops(16, 1)) == [(16, 300, 200, 1), (300, 200, 16, 1)]
    for role in ("row", "column+gather"):  # no communication without a tensor group
        assert all(isinstance(op, Gemm) for op in layer.forward_ops(16, 1, role)
                   + layer.backward_ops(16, 1, role))
    assert layer.weight_elements() == 60_000
    assert layer.input_elements(16) == 16 * 300 and layer.output_elements(16) == 16 * 200


@pytest.mark.parametrize("role, forward, backward", [
    # column: the output is split; dX is a partial sum, allreduced over the tensor group.
    ("column", [(8, 50, 400, 1)], [(8, 400, 50, 1), (400, 50, 8, 1), ("allreduce", 8 * 400)]),
    # row: the input is split; the output is a partial sum, allreduced.
    ("row", [(8, 100, 200, 1), ("allreduce", 8 * 100)], [(8, 200, 100, 1), (200, 100, 8, 1)]),
    # a lone column layer gathers its output (the allgather's output buffer is the whole Y).
    ("column+gather", [(8, 50, 400, 1), ("allgather", 8 * 100)],
     [(8, 400, 50, 1), (400, 50, 8, 1), ("allreduce", 8 * 400)]),
])
def test_linear_tensor_roles(role, forward, backward):
    layer = Linear(400, 100)
    assert shapes(layer.forward_ops(8, 2, role)) == forward
    assert shapes(layer.backward_ops(8, 2, role)) == backward
    assert layer.weight_elements(2) == 20_000


def test_gemm_batched_time_is_one_launch():
    device = get_device("a100")
    one = gemm_time_us(128, 128, 64, "a100")
    assert Gemm("x", 128, 128, 64, count=10).time_us("a100") == pytest.approx(
        device.launch_us + 10 * (one - device.launch_us))
    assert Gemm("x", 128, 128, 64).time_us("a100", dtype="fp32") == gemm_time_us(
        128, 128, 64, "a100", dtype="fp32")


def test_transformer_block_gemms_by_hand():
    block = TransformerBlock(hidden=256, heads=4, seq_len=32, ffn_mult=4)
    b, s, h, d, f = 2, 32, 256, 64, 1024
    tokens = b * s
    forward = [op for op in block.forward_ops(b, 1) if isinstance(op, Gemm)]
    assert shapes(forward) == [(tokens, 3 * h, h, 1), (s, s, d, b * 4), (s, d, s, b * 4),
                               (tokens, h, h, 1), (tokens, f, h, 1), (tokens, h, f, 1)]
    backward = [op for op in block.backward_ops(b, 1) if isinstance(op, Gemm)]
    assert len(backward) == 12
    expected_backward = []
    for m, n, k, c in reversed(shapes(forward)):
        expected_backward += [(m, k, n, c), (k, n, m, c)]
    assert sorted(shapes(backward)) == sorted(expected_backward)
    assert block.weight_elements() == 4 * h * h + 2 * f * h
    total = sum(op.time_us("a100") for op in forward + backward)
    assert block.compute_time_us(b, 1, "a100") == pytest.approx(total)


def test_transformer_block_tensor_parallel():
    block = TransformerBlock(hidden=256, heads=4, seq_len=32)
    forward = block.forward_ops(2, 2)
    assert shapes([op for op in forward if isinstance(op, Gemm)])[:2] == [
        (64, 384, 256, 1), (32, 32, 64, 4)]
    comms = [op for op in forward + block.backward_ops(2, 2) if isinstance(op, TensorComm)]
    assert [(c.collective, c.elements) for c in comms] == [("allreduce", 64 * 256)] * 4
    assert block.weight_elements(2) == block.weight_elements() // 2


def test_helpers_and_bad_sizes():
    assert [layer.in_features for layer in mlp(3, 64)] == [64, 64, 64]
    assert [b.name for b in transformer(2, 64, 4, 8)] == ["block0", "block1"]
    with pytest.raises(InvalidInstanceError, match="in_features"):
        Linear(0, 3)
    with pytest.raises(InvalidInstanceError, match="heads"):
        TransformerBlock(hidden=100, heads=3, seq_len=4)
    with pytest.raises(InvalidInstanceError, match="tensor degree 3"):
        Linear(64, 64).check_tensor(3)
    with pytest.raises(InvalidInstanceError, match="tensor degree 8"):
        TransformerBlock(hidden=64, heads=4, seq_len=4).check_tensor(8)
    with pytest.raises(InvalidInstanceError, match="role"):
        Linear(4, 4).forward_ops(2, 1, "diagonal")
    with pytest.raises(InvalidInstanceError, match="num_layers"):
        mlp(0, 4)
