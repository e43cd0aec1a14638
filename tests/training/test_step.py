"""The training-step simulator against small cases computed by hand.

Every expected time is built in the test from :func:`collsynth.timing.kernels.gemm_time_us` and
a communication model's answers, following the formulas of :mod:`collsynth.training.simulate`.
"""

from __future__ import annotations

import pytest

from collsynth.errors import InvalidInstanceError, UnknownNameError
from collsynth.timing.kernels import gemm_time_us
from collsynth.topology import get_topology
from collsynth.training import (
    Linear,
    NcclComm,
    ParallelStrategy,
    TransformerBlock,
    candidate_strategies,
    grid_search,
    mlp,
    simulate,
    single_device_time_us,
)

DGX = get_topology("dgx-a100")


class FixedComm:
    """A comm model with fixed answers per collective; records every call."""

    def __init__(self, **times):
        self.times = times
        self.calls = []

    def time_us(self, collective, group, size_bytes):
        self.calls.append((collective, tuple(group), size_bytes))
        return self.times[collective]


def g(m, n, k):
    return gemm_time_us(m, n, k, "a100", dtype="fp16")


def linear_step(m, k, n):
    """Forward + backward GEMMs of an unsplit k -> n Linear layer on m samples."""
    return g(m, n, k) + g(m, k, n) + g(k, n, m)


def test_one_device_is_the_sum_of_gemms():
    layers = [Linear(512, 256), Linear(256, 128)]
    result = simulate(layers, 64, ParallelStrategy(), DGX)
    expected = linear_step(64, 512, 256) + linear_step(64, 256, 128)
    assert result.step_time_us == pytest.approx(expected, rel=1e-12)
    assert result.single_device_us == pytest.approx(expected, rel=1e-12)
    assert result.speedup == pytest.approx(1.0)
    assert result.throughput == pytest.approx(64 / (expected * 1e-6))
    assert result.devices == (0,)
    events = result.timeline(0)
    assert len(events) == 6 and {e.category for e in events} == {"compute"}
    # back to back, forward then backward (last layer first)
    assert [e.name for e in events][:3] == ["F0 linear forward", "F0 linear forward",
                                            "B0 linear input grad"]
    assert all(a.end_us == pytest.approx(b.start_us) for a, b in zip(events, events[1:]))


def test_data_parallel_halves_compute_and_allreduces_the_gradients():
    layers = mlp(2, 1024)
    comm = NcclComm(DGX)
    result = simulate(layers, 128, ParallelStrategy(data=2), DGX, comm)
    grad_bytes = 2 * 1024 * 1024 * 2  # two layers of 1024 x 1024 fp16 weights
    compute = 2 * linear_step(64, 1024, 1024)
    allreduce = comm.time_us("allreduce", (0, 1), grad_bytes)
    assert result.step_time_us == pytest.approx(compute + allreduce, rel=1e-12)
    assert result.single_device_us == pytest.approx(2 * linear_step(128, 1024, 1024))
    for device in (0, 1):
        assert result.compute_time_us[device] == pytest.approx(compute)
        assert result.comm_time_us[device] == pytest.approx(allreduce)
        last = result.timeline(device)[-1]
        assert last.name == "allreduce gradients stage 0" and last.category == "comm"


def test_data_parallel_calls_the_comm_model_with_the_data_group():
    comm = FixedComm(allreduce=100.0)
    layers = mlp(3, 256)
    result = simulate(layers, 32, ParallelStrategy(data=4), DGX, comm)
    assert comm.calls == [("allreduce", (0, 1, 2, 3), 3 * 256 * 256 * 2)]
    assert result.step_time_us == pytest.approx(3 * linear_step(8, 256, 256) + 100.0)


def test_gpipe_formula_for_equal_stages():
    # p = 2 stages of 2 layers, m = 4 microbatches of 8 samples, sends of c us (c < f, b):
    # step = (m + p - 1) (f + b) + 2 (p - 1) c
    c, m, p = 0.5, 4, 2
    comm = FixedComm(send=c)
    result = simulate(mlp(4, 512), 32, ParallelStrategy(pipeline=p, microbatches=m), DGX, comm)
    f = 2 * g(8, 512, 512)
    b = 2 * (g(8, 512, 512) + g(512, 512, 8))
    assert c < min(f, b)
    assert result.stages == ((0, 2), (2, 4))
    assert result.step_time_us == pytest.approx((m + p - 1) * (f + b) + 2 * (p - 1) * c)
    # one activation and one gradient per microbatch, 8 samples x 512 fp16 values each
    assert sorted(set(comm.calls)) == [("send", (0, 1), 8 * 512 * 2), ("send", (1, 0), 8 * 512 * 2)]
    sends = [e for e in result.events if e.stream == "send"]
    assert sorted((e.device, e.name) for e in sends) == sorted(
        [(0, f"send activation F{i} to stage 1") for i in range(m)]
        + [(1, f"send gradient B{i} to stage 0") for i in range(m)])
    # the bubble: stage 1 waits f + c before its first forward
    first = result.timeline(1)[0]
    assert first.category == "idle" and first.duration_us == pytest.approx(f + c)


def test_gpipe_formula_with_more_stages_and_real_links():
    comm = NcclComm(DGX)
    m, p = 3, 4
    result = simulate(mlp(4, 1024), 48, ParallelStrategy(pipeline=p, microbatches=m), DGX, comm)
    f, b = g(16, 1024, 1024), g(16, 1024, 1024) + g(1024, 1024, 16)
    c = comm.time_us("send", (0, 1), 16 * 1024 * 2)   # every neighbour pair: 12 NVLinks
    assert c == pytest.approx(0.7 + 16 * 1024 * 2 / (12 * 25e3))
    assert result.step_time_us == pytest.approx((m + p - 1) * (f + b) + 2 * (p - 1) * c)


def test_tensor_parallel_pair():
    # A column layer then a row layer on t = 2 (Megatron): one allreduce of the output forward,
    # one of the input gradient backward.
    comm = FixedComm(allreduce=7.0)
    layers = [Linear(1024, 2048), Linear(2048, 512)]
    result = simulate(layers, 64, ParallelStrategy(tensor=2), DGX, comm)
    forward = g(64, 1024, 1024) + g(64, 512, 1024) + 7.0
    backward = (g(64, 1024, 512) + g(1024, 512, 64)           # row layer: dX_j, dW_j
                + g(64, 1024, 1024) + g(1024, 1024, 64) + 7.0)  # column layer: dX, dW_j, allreduce
    assert result.step_time_us == pytest.approx(forward + backward)
    assert comm.calls == [("allreduce", (0, 1), 64 * 512 * 2), ("allreduce", (0, 1), 64 * 1024 * 2)]
    assert result.comm_time_us == {0: 14.0, 1: 14.0}


def test_tensor_parallel_with_nccl():
    comm = NcclComm(DGX)
    result = simulate(mlp(2, 1024), 64, ParallelStrategy(tensor=2), DGX, comm)
    ar = comm.time_us("allreduce", (0, 1), 64 * 1024 * 2)
    compute = (g(64, 512, 1024) + g(64, 1024, 512) + g(64, 1024, 512) + g(512, 1024, 64)
               + g(64, 1024, 512) + g(1024, 512, 64))
    assert result.step_time_us == pytest.approx(compute + 2 * ar)


def test_overlapped_gradients():
    # Per-layer allreduces of A us start when the layer's last backward is done, one at a time.
    a = 50.0
    comm = FixedComm(allreduce=a)
    result = simulate(mlp(2, 512), 32, ParallelStrategy(data=2, overlap_gradients=True), DGX, comm)
    fwd, bwd = g(16, 512, 512), g(16, 512, 512) + g(512, 512, 16)
    layer1_done = 2 * fwd + bwd
    layer0_done = layer1_done + bwd
    expected = max(layer0_done, layer1_done + a) + a
    assert result.step_time_us == pytest.approx(expected)
    assert comm.calls == [("allreduce", (0, 1), 512 * 512 * 2)]   # same size: asked once
    gradients = [e for e in result.events if e.category == "comm"]
    assert {e.stream for e in gradients} == {"gradients"}
    assert sorted((e.device, e.name) for e in gradients) == [
        (dev, f"allreduce gradients linear{i}") for dev in (0, 1) for i in (0, 1)]


def test_placement_order_and_ranks():
    comm = FixedComm(allreduce=1.0)
    strategy = ParallelStrategy(data=2, tensor=2, order=("data", "tensor", "pipeline"))
    simulate(mlp(2, 64), 8, strategy, DGX, comm)
    groups = {group for _, group, _ in comm.calls}
    # data innermost: replicas on consecutive ranks, tensor groups strided
    assert groups == {(0, 2), (1, 3), (0, 1), (2, 3)}
    comm.calls.clear()
    result = simulate(mlp(2, 64), 8, ParallelStrategy(data=2), DGX, comm, ranks=(5, 3))
    assert result.devices == (5, 3)
    assert comm.calls[0][1] == (3, 5)


def test_transformer_on_one_device():
    block = TransformerBlock(hidden=256, heads=4, seq_len=32)
    result = simulate([block, block], 4, ParallelStrategy(), DGX)
    assert result.step_time_us == pytest.approx(2 * block.compute_time_us(4, 1, "a100"))
    assert result.step_time_us == pytest.approx(single_device_time_us([block, block], 4))


def test_transformer_tensor_parallel_comm_count():
    comm = FixedComm(allreduce=3.0)
    block = TransformerBlock(hidden=256, heads=4, seq_len=32)
    result = simulate([block], 4, ParallelStrategy(tensor=4), DGX, comm)
    assert comm.calls == [("allreduce", (0, 1, 2, 3), 4 * 32 * 256 * 2)]
    allreduces = [e for e in result.timeline(2) if e.category == "comm"]
    assert len(allreduces) == 4 and all(e.duration_us == 3.0 for e in allreduces)
    assert result.step_time_us == pytest.approx(block.compute_time_us(4, 4, "a100") + 12.0)


def test_uneven_layers_are_balanced_by_compute():
    layers = [Linear(2048, 2048), Linear(256, 256), Linear(256, 256), Linear(256, 256)]
    result = simulate(layers, 64, ParallelStrategy(pipeline=2), DGX, FixedComm(send=0.1))
    assert result.stages == ((0, 1), (1, 4))


@pytest.mark.parametrize("kwargs, match", [
    ({"strategy": ParallelStrategy(data=16)}, "16 devices"),
    ({"strategy": ParallelStrategy(pipeline=5)}, "pipeline degree 5"),
    ({"strategy": ParallelStrategy(data=2, microbatches=4)}, "not divisible"),
    ({"strategy": ParallelStrategy(tensor=5)}, "tensor degree 5"),
    ({"batch_size": 0}, "batch_size"),
    ({"layers": []}, "no layers"),
    ({"layers": ["linear"]}, "not a collsynth.training Layer"),
    ({"ranks": (0, 0)}, "repeated"),
    ({"ranks": (0, 9)}, "not a rank"),
    ({"strategy": ParallelStrategy(data=2), "ranks": (1,)}, "needs 2 devices"),
    ({"dtype": "fp7"}, "dtype"),
])
def test_bad_inputs(kwargs, match):
    args = {"layers": mlp(4, 96), "batch_size": 12, "strategy": ParallelStrategy()}
    args.update(kwargs)
    with pytest.raises(InvalidInstanceError, match=match):
        simulate(args["layers"], args["batch_size"], args["strategy"], DGX,
                 ranks=args.get("ranks"), dtype=args.get("dtype", "fp16"))


def test_unknown_device():
    with pytest.raises(UnknownNameError, match="unknown device"):
        simulate(mlp(1, 8), 8, ParallelStrategy(), DGX, device="tpu")


def test_grid_search_ranks_by_throughput():
    results = grid_search(mlp(4, 512), 64, DGX, NcclComm(DGX),
                          strategies=candidate_strategies(4, microbatches=(1, 2, 128)))
    throughputs = [r.throughput for r in results]
    assert throughputs == sorted(throughputs, reverse=True)
    labels = {r.strategy.label() for r in results}
    assert "d1 t1 p1 m1" in labels and not any(lab.endswith("m128") for lab in labels)
    assert all(r.events == () for r in results)
    again = simulate(mlp(4, 512), 64, results[0].strategy, DGX, NcclComm(DGX))
    assert again.step_time_us == pytest.approx(results[0].step_time_us)
