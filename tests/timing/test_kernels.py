"""Kernel predictors against worked examples (every expected number derived in the comments)."""

from __future__ import annotations

import pytest

from collsynth.errors import InvalidInstanceError, UnknownNameError
from collsynth.timing.kernels import (
    DEVICES,
    copy_time_us,
    embedding_bag_backward,
    embedding_bag_forward,
    gemm,
    get_device,
    hit_rate,
    memory_time_us,
    reduce_gamma_us_per_byte,
    reduce_time_us,
)

MIB = 1 << 20


def test_device_table():
    expected_hbm = {"v100": 900, "a100-40gb": 1555, "a100-80gb": 2039, "h100": 3350,
                    "mi250": 3276.8 / 2, "mi300x": 5300}
    for name, gbps in expected_hbm.items():
        assert DEVICES[name].dram_gbps == pytest.approx(gbps)
    assert DEVICES["v100"].l2_bytes == 6 * MIB and DEVICES["a100-80gb"].l2_bytes == 40 * MIB
    assert DEVICES["h100"].l2_bytes == 50 * MIB and DEVICES["mi250"].l2_bytes == 8 * MIB
    assert DEVICES["mi300x"].cache_bytes == 256 * MIB   # Infinity Cache is its last level
    for device in DEVICES.values():
        for figure in ("dram_gbps", "l2_bytes", "cache_gbps", "peak_tflops", "launch_us"):
            assert device.sources.get(figure), (device.name, figure)
        assert 1 <= device.launch_us <= 10


def test_get_device():
    assert get_device("A100") is DEVICES["a100-80gb"]
    assert get_device(DEVICES["v100"]) is DEVICES["v100"]
    with pytest.raises(UnknownNameError, match="known"):
        get_device("tpu")
    with pytest.raises(UnknownNameError, match="fp8"):
        DEVICES["v100"].tflops("fp8")


# -- reductions and copies ------------------------------------------------------------------------


def test_reduce_from_dram():
    # 1 GB of output on a V100: read 2 GB, write 1 GB = 3e9 bytes at 9e5 bytes/us = 3333.3 us,
    # plus a 4 us launch.
    assert reduce_time_us(10**9, "v100", where="dram") == pytest.approx(4 + 3e9 / 9e5)
    # Auto: 3 GB does not fit in 6 MiB of L2, so it is the same.
    assert reduce_time_us(10**9, "v100") == reduce_time_us(10**9, "v100", where="dram")


def test_reduce_in_cache():
    # 1 MB on an A100: 3 MB fits in its 40 MiB L2; 3e6 bytes at 7219 GB/s = 0.41557 us.
    assert reduce_time_us(10**6, "a100") == pytest.approx(4 + 3e6 / 7.219e6)


def test_copy_and_inputs():
    # Copy 1 GB on an H100: 2e9 bytes at 3.35e6 bytes/us = 597.01 us + 4.
    assert copy_time_us(10**9, "h100", where="dram") == pytest.approx(4 + 2e9 / 3.35e6)
    # Reducing 4 inputs: 5 x 1 GB of traffic.
    assert reduce_time_us(10**9, "h100", inputs=4, where="dram") == pytest.approx(4 + 5e9 / 3.35e6)
    assert memory_time_us(10**6, 0, "mi300x", where="dram", launch=False) == pytest.approx(
        1e6 / 5.3e6)


def test_gamma():
    # 3 bytes of DRAM traffic per reduced byte.
    assert reduce_gamma_us_per_byte("v100") == pytest.approx(3 / 9e5)
    assert reduce_gamma_us_per_byte("mi250") == pytest.approx(3 / 1.6384e6)
    assert reduce_gamma_us_per_byte("h100", where="cache") == pytest.approx(3 / 5.5e6)


# -- GEMM ---------------------------------------------------------------------------------------


def test_gemm_compute_bound():
    # 8192^3 fp16 on an A100: 2 x 8192^3 = 1.0995e12 flop at 312e6 flop/us = 3524.1 us; it moves
    # 3 x 8192^2 x 2 bytes = 402.7 MB, 197.5 us at 2039 GB/s: compute bound.
    e = gemm(8192, 8192, 8192, "a100", dtype="fp16")
    assert e.bound == "compute"
    assert e.flops == 2 * 8192**3
    assert e.dram_bytes == 3 * 8192**2 * 2
    assert e.time_us == pytest.approx(4 + 2 * 8192**3 / 312e6)


def test_gemm_memory_bound():
    # A matrix-vector product, 8192 x 8192 by 8192 x 1, bf16 on an H100: 1.34e8 flop (0.136 us at
    # 989.4 TFLOP/s) but (8192^2 + 2 x 8192) x 2 = 134,250,496 bytes: 40.07 us at 3350 GB/s.
    e = gemm(8192, 1, 8192, "h100", dtype="bf16")
    assert e.bound == "memory"
    assert e.time_us == pytest.approx(4 + (8192**2 + 2 * 8192) * 2 / 3.35e6)


def test_gemm_rejects_bad_input():
    with pytest.raises(InvalidInstanceError):
        gemm(0, 1, 1, "v100")
    with pytest.raises(UnknownNameError):
        gemm(1, 1, 1, "v100", dtype="int4")


# -- embedding bags -----------------------------------------------------------------------------


def test_hit_rate():
    assert hit_rate(400 * MIB, "a100") == pytest.approx(0.1)     # 40 MiB of 400 MiB
    assert hit_rate(MIB, "v100") == 1.0                          # fits in 6 MiB
    assert hit_rate(2560 * MIB, "mi300x") == pytest.approx(0.1)  # 256 MiB Infinity Cache


def test_embedding_forward_worked_example():
    # DLRM-like table on an A100 80GB: 10**6 rows x 128 fp32 = 512,000,000 bytes;
    # hit rate = 41,943,040 / 512,000,000 = 0.08192.
    # batch 2048, pooling 20: 40,960 lookups; row bytes R = 40960 x 128 x 4 = 20,971,520.
    # DRAM: R x (1 - 0.08192) + 40960 x 8 (indices) + 2048 x 128 x 4 (output)
    #     = 19,253,533.08 + 327,680 + 1,048,576 = 20,629,789.08 bytes -> 10.1176 us at 2039 GB/s
    # cache: R x 0.08192 = 1,717,986.92 bytes -> 0.23798 us at 7219 GB/s; plus 4 us launch.
    e = embedding_bag_forward(40960, 2048, 128, 10**6, "a100-80gb")
    h = 41_943_040 / 512_000_000
    assert h == pytest.approx(0.08192)
    assert e.dram_bytes == pytest.approx(20_971_520 * (1 - h) + 327_680 + 1_048_576)
    assert e.cache_bytes == pytest.approx(20_971_520 * h)
    assert e.time_us == pytest.approx(4 + 20_629_789.08 / 2.039e6 + 1_717_986.92 / 7.219e6,
                                      rel=1e-6)
    assert e.time_us == pytest.approx(14.3556, abs=1e-3)


def test_embedding_backward_doubles_the_rows():
    # Read-modify-write of every looked-up row: 2R split by the same hit rate.
    f = embedding_bag_forward(40960, 2048, 128, 10**6, "a100-80gb")
    b = embedding_bag_backward(40960, 2048, 128, 10**6, "a100-80gb")
    h = 41_943_040 / 512_000_000
    assert b.dram_bytes - f.dram_bytes == pytest.approx(20_971_520 * (1 - h))
    assert b.cache_bytes == pytest.approx(2 * f.cache_bytes)


def test_embedding_small_table_all_hits():
    # 1000 rows x 64 fp32 = 256 kB, in the V100's 6 MiB L2: only indices and output from DRAM.
    e = embedding_bag_forward(1000, 10, 64, 1000, "v100")
    assert (e.dram_bytes, e.cache_bytes) == (8000 + 2560, 256_000)
    assert e.time_us == pytest.approx(4 + 10_560 / 9e5 + 256_000 / 2.155e6)
