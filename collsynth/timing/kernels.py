"""Kernel predictors from device figures: reductions and copies (gamma), GEMMs, embedding bags.

The details (formats, conventions, rules) are in docs/timing.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from numbers import Real
from types import MappingProxyType
from typing import Mapping

from collsynth.errors import InvalidInstanceError, UnknownNameError

__all__ = [
    "Device",
    "DEVICES",
    "get_device",
    "KernelEstimate",
    "memory_time_us",
    "reduce_time_us",
    "copy_time_us",
    "reduce_gamma_us_per_byte",
    "gemm",
    "gemm_time_us",
    "hit_rate",
    "embedding_bag_forward",
    "embedding_bag_backward",
    "embedding_bag_forward_time_us",
    "embedding_bag_backward_time_us",
    "DTYPE_BYTES",
]

#: Bytes per element of the dtypes the device table knows.
DTYPE_BYTES: Mapping[str, int] = MappingProxyType({
    "fp64": 8, "fp32": 4, "tf32": 4, "fp16": 2, "bf16": 2, "fp8": 1, "int8": 1})


@dataclass(frozen=True)
class Device:
    """The figures of one GPU (or one GCD) the predictors need.

    Parameters
    ----------
    name:
        Display name.
    dram_gbps:
        Peak DRAM (HBM) bandwidth, GB/s.
    l2_bytes:
        L2 cache size, bytes.
    cache_bytes, cache_gbps:
        The last-level on-chip cache the hit-rate model uses (the L2, or AMD's Infinity Cache
        on MI300X) and its bandwidth in GB/s.
    launch_us:
        Kernel launch overhead, microseconds.
    peak_tflops:
        Peak dense TFLOP/s per dtype (``"fp16"``, ``"bf16"``, ``"tf32"``, ``"fp32"``,
        ``"fp64"``, ``"fp8"``): matrix units where the device has them.
    sources:
        Where each figure comes from.
    """

    name: str
    dram_gbps: float
    l2_bytes: int
    cache_bytes: int
    cache_gbps: float
    launch_us: float
    peak_tflops: Mapping[str, float]
    sources: Mapping[str, str] = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        for attr in ("dram_gbps", "cache_gbps"):
            if not getattr(self, attr) > 0:
                raise InvalidInstanceError(f"device {self.name!r}: {attr} must be > 0")
        if self.launch_us < 0 or self.cache_bytes < 0 or self.l2_bytes < 0:
            raise InvalidInstanceError(f"device {self.name!r}: negative figure")

    def tflops(self, dtype: str) -> float:
        """Peak dense TFLOP/s for ``dtype``.

        Raises
        ------
        UnknownNameError
            When the device has no figure for ``dtype``.
        """
        if dtype not in self.peak_tflops:
            raise UnknownNameError(f"device {self.name!r} has no peak TFLOP/s for {dtype!r}; it "
                                   f"has {', '.join(sorted(self.peak_tflops))}")
        return self.peak_tflops[dtype]


_MB = 1 << 20
_LAUNCH_NOTE = ("order of magnitude, not a datasheet figure: a host launch of a short kernel "
                "costs a few microseconds (NVIDIA technical blog 'Getting Started with CUDA "
                "Graphs', developer.nvidia.com/blog/cuda-graphs/); 4 us assumed on every device "
                "-- calibrate for precision")

#: The built-in devices. Peak TFLOP/s are dense (without 2:4 sparsity).
DEVICES: Mapping[str, Device] = MappingProxyType({
    "v100": Device(
        "NVIDIA V100 SXM2", dram_gbps=900.0, l2_bytes=6 * _MB, cache_bytes=6 * _MB,
        cache_gbps=2155.0, launch_us=4.0,
        peak_tflops=MappingProxyType({"fp16": 125.0, "fp32": 15.7, "fp64": 7.8}),
        sources=MappingProxyType({
            "dram_gbps": "NVIDIA Tesla V100 datasheet: HBM2 900 GB/s",
            "l2_bytes": "NVIDIA Tesla V100 GPU Architecture whitepaper (2017): 6144 KB L2",
            "cache_gbps": "measured L2 throughput 2155 GB/s: Jia et al., 'Dissecting the NVIDIA "
                          "Volta GPU Architecture via Microbenchmarking', arXiv:1804.06826",
            "peak_tflops": "V100 SXM2 datasheet: 125 (tensor fp16), 15.7 fp32, 7.8 fp64",
            "launch_us": _LAUNCH_NOTE,
        })),
    "a100-40gb": Device(
        "NVIDIA A100 SXM4 40GB", dram_gbps=1555.0, l2_bytes=40 * _MB, cache_bytes=40 * _MB,
        cache_gbps=7219.0, launch_us=4.0,
        peak_tflops=MappingProxyType({"fp16": 312.0, "bf16": 312.0, "tf32": 156.0,
                                      "fp32": 19.5, "fp64": 19.5}),
        sources=MappingProxyType({
            "dram_gbps": "NVIDIA A100 datasheet: 40GB HBM2 1555 GB/s",
            "l2_bytes": "NVIDIA A100 Tensor Core GPU Architecture whitepaper (2020): 40 MB L2",
            "cache_gbps": "A100 whitepaper: L2 read bandwidth 5120 bytes/clock x 1410 MHz boost "
                          "(a theoretical peak)",
            "peak_tflops": "A100 datasheet: 312 fp16/bf16, 156 tf32, 19.5 fp32, 19.5 fp64 tensor",
            "launch_us": _LAUNCH_NOTE,
        })),
    "a100-80gb": Device(
        "NVIDIA A100 SXM4 80GB", dram_gbps=2039.0, l2_bytes=40 * _MB, cache_bytes=40 * _MB,
        cache_gbps=7219.0, launch_us=4.0,
        peak_tflops=MappingProxyType({"fp16": 312.0, "bf16": 312.0, "tf32": 156.0,
                                      "fp32": 19.5, "fp64": 19.5}),
        sources=MappingProxyType({
            "dram_gbps": "NVIDIA A100 datasheet: 80GB HBM2e 2039 GB/s (SXM)",
            "l2_bytes": "NVIDIA A100 Tensor Core GPU Architecture whitepaper (2020): 40 MB L2",
            "cache_gbps": "A100 whitepaper: L2 read bandwidth 5120 bytes/clock x 1410 MHz boost "
                          "(a theoretical peak)",
            "peak_tflops": "A100 datasheet: 312 fp16/bf16, 156 tf32, 19.5 fp32, 19.5 fp64 tensor",
            "launch_us": _LAUNCH_NOTE,
        })),
    "h100": Device(
        "NVIDIA H100 SXM5 80GB", dram_gbps=3350.0, l2_bytes=50 * _MB, cache_bytes=50 * _MB,
        cache_gbps=5500.0, launch_us=4.0,
        peak_tflops=MappingProxyType({"fp8": 1978.9, "fp16": 989.4, "bf16": 989.4,
                                      "tf32": 494.7, "fp32": 66.9, "fp64": 66.9}),
        sources=MappingProxyType({
            "dram_gbps": "NVIDIA H100 datasheet: H100 SXM HBM3 3.35 TB/s",
            "l2_bytes": "NVIDIA H100 Tensor Core GPU Architecture whitepaper (2022): 50 MB L2",
            "cache_gbps": "not published by NVIDIA; about 5.5 TB/s measured (Chips and Cheese, "
                          "'Nvidia's H100: Funny L2, and Tons of Bandwidth', 2023)",
            "peak_tflops": "H100 SXM datasheet, half of its with-sparsity figures: 1979 fp8, "
                           "989 fp16/bf16, 495 tf32; 67 fp32, 67 fp64 tensor",
            "launch_us": _LAUNCH_NOTE,
        })),
    "mi250": Device(
        "AMD Instinct MI250 (one GCD)", dram_gbps=1638.4, l2_bytes=8 * _MB, cache_bytes=8 * _MB,
        cache_gbps=6963.2, launch_us=4.0,
        peak_tflops=MappingProxyType({"fp16": 181.05, "bf16": 181.05, "fp32": 45.25,
                                      "fp64": 45.25}),
        sources=MappingProxyType({
            "dram_gbps": "AMD Instinct MI250 datasheet: 3276.8 GB/s HBM2e per package, half per "
                         "GCD",
            "l2_bytes": "AMD CDNA 2 architecture whitepaper: 8 MB L2 per GCD",
            "cache_gbps": "32 L2 channels (ROCm Compute Profiler docs, 'L2 cache (TCC)') x 128 "
                          "bytes/clock x 1.7 GHz (a theoretical peak)",
            "peak_tflops": "MI250 datasheet, halved per GCD: 362.1 fp16/bf16, 90.5 fp32 and fp64 "
                           "matrix",
            "launch_us": _LAUNCH_NOTE,
        })),
    "mi300x": Device(
        "AMD Instinct MI300X", dram_gbps=5300.0, l2_bytes=32 * _MB, cache_bytes=256 * _MB,
        cache_gbps=17200.0, launch_us=4.0,
        peak_tflops=MappingProxyType({"fp8": 2614.9, "fp16": 1307.4, "bf16": 1307.4,
                                      "tf32": 653.7, "fp32": 163.4, "fp64": 163.4}),
        sources=MappingProxyType({
            "dram_gbps": "AMD Instinct MI300X datasheet: HBM3 5.3 TB/s",
            "l2_bytes": "AMD CDNA 3 architecture whitepaper: 4 MB L2 per XCD, 8 XCDs",
            "cache_bytes": "AMD CDNA 3 whitepaper: 256 MB AMD Infinity Cache (the last level)",
            "cache_gbps": "AMD CDNA 3 whitepaper: Infinity Cache peak bandwidth 17.2 TB/s",
            "peak_tflops": "MI300X datasheet (dense): 2614.9 fp8, 1307.4 fp16/bf16, 653.7 tf32, "
                           "163.4 fp32 and fp64 matrix",
            "launch_us": _LAUNCH_NOTE,
        })),
})


def get_device(name: "str | Device") -> Device:
    """A device by name (case-insensitive; ``"a100"`` is the 80 GB part), or ``name`` itself.

    >>> get_device("H100").dram_gbps
    3350.0
    """
    if isinstance(name, Device):
        return name
    key = name.strip().lower().replace("_", "-")
    key = {"a100": "a100-80gb", "h100-sxm": "h100", "mi250x": "mi250"}.get(key, key)
    if key not in DEVICES:
        raise UnknownNameError(f"unknown device {name!r}; known: {', '.join(DEVICES)}")
    return DEVICES[key]


@dataclass(frozen=True)
class KernelEstimate:
    """A predicted kernel: its time and what it moves and computes.

    ``dram_bytes`` and ``cache_bytes`` are the bytes moved from DRAM and from the last-level cache;
    ``bound`` is ``"compute"`` or ``"memory"``.
    """

    time_us: float
    flops: float
    dram_bytes: float
    cache_bytes: float
    bound: str


def _check(value: Real, name: str, *, positive: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, Real) or not value >= 0 or (
            positive and not value > 0) or value != value or value == float("inf"):
        raise InvalidInstanceError(f"{name} = {value!r}; expected a finite number "
                                   f"{'> 0' if positive else '>= 0'}")
    return float(value)


def memory_time_us(read_bytes: Real, write_bytes: Real, device: "str | Device", *,
                   where: str = "auto", launch: bool = True) -> float:
    """Microseconds of a memory-bound kernel reading and writing the given bytes.

    ``where``: ``"dram"``, ``"cache"``, or ``"auto"`` (the cache when reads + writes fit in the
    last-level cache, else DRAM). ``launch=False`` leaves out the launch overhead.

    >>> memory_time_us(10**6, 10**6, "v100", where="dram", launch=False)   # 2 MB at 900 GB/s
    2.2222222222222223
    """
    d = get_device(device)
    total = _check(read_bytes, "read_bytes") + _check(write_bytes, "write_bytes")
    if where not in ("auto", "dram", "cache"):
        raise InvalidInstanceError(f"where = {where!r}; expected 'auto', 'dram' or 'cache'")
    cached = where == "cache" or (where == "auto" and total <= d.cache_bytes)
    bandwidth = d.cache_gbps if cached else d.dram_gbps
    return (d.launch_us if launch else 0.0) + total / (bandwidth * 1e3)


def reduce_time_us(nbytes: Real, device: "str | Device", *, inputs: int = 2,
                   where: str = "auto") -> float:
    """Reduce ``inputs`` buffers of ``nbytes`` into one: read ``inputs * nbytes``, write ``nbytes``.

    >>> round(reduce_time_us(9 * 10**8, "v100", where="dram"), 6)   # 4 + 2.7e9 B / 9e5 B/us
    3004.0
    >>> d = DEVICES["a100-80gb"]
    >>> round(reduce_time_us(2 * 10**9, d, where="dram") - d.launch_us, 3)   # 6 GB at 2039 GB/s
    2942.619
    """
    if not isinstance(inputs, int) or inputs < 1:
        raise InvalidInstanceError(f"inputs = {inputs!r}; expected an integer >= 1")
    size = _check(nbytes, "nbytes")
    return memory_time_us(inputs * size, size, device, where=where)


def copy_time_us(nbytes: Real, device: "str | Device", *, where: str = "auto") -> float:
    """Copy ``nbytes``: reads ``nbytes``, writes ``nbytes``.

    >>> round(copy_time_us(9 * 10**8, "v100", where="dram"), 6)   # 4 + 1.8e9 B / 9e5 B/us
    2004.0
    """
    size = _check(nbytes, "nbytes")
    return memory_time_us(size, size, device, where=where)


def reduce_gamma_us_per_byte(device: "str | Device", *, inputs: int = 2,
                             where: str = "dram") -> float:
    """The cost model's ``gamma``: microseconds per reduced (output) byte, no launch.

    ``(inputs + 1) / (bandwidth_gbps * 1e3)``: DRAM bandwidth by default (large buffers).

    >>> reduce_gamma_us_per_byte("v100")   # 3 bytes at 900 GB/s per reduced byte
    3.3333333333333333e-06
    """
    if where not in ("dram", "cache"):
        raise InvalidInstanceError(f"where = {where!r}; expected 'dram' or 'cache'")
    d = get_device(device)
    return (inputs + 1) / ((d.cache_gbps if where == "cache" else d.dram_gbps) * 1e3)


def gemm(m: int, n: int, k: int, device: "str | Device", *, dtype: str = "fp16") -> KernelEstimate:
    """The roofline of ``C[m, n] = A[m, k] @ B[k, n]`` (see docs/timing.md).

    >>> e = gemm(8192, 8192, 8192, "a100", dtype="fp16")   # 1.1e12 flop at 312 TFLOP/s
    >>> e.bound, round(e.time_us, 1)
    ('compute', 3528.1)
    """
    d = get_device(device)
    for name, value in (("m", m), ("n", n), ("k", k)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InvalidInstanceError(f"{name} = {value!r}; expected an integer >= 1")
    if dtype not in DTYPE_BYTES:
        raise UnknownNameError(f"unknown dtype {dtype!r}; known: {', '.join(DTYPE_BYTES)}")
    flops = 2.0 * m * n * k
    nbytes = float(m * k + k * n + m * n) * DTYPE_BYTES[dtype]
    compute_us = flops / (d.tflops(dtype) * 1e6)
    memory_us = nbytes / (d.dram_gbps * 1e3)
    bound = "compute" if compute_us >= memory_us else "memory"
    return KernelEstimate(d.launch_us + max(compute_us, memory_us), flops, nbytes, 0.0, bound)


def gemm_time_us(m: int, n: int, k: int, device: "str | Device", *, dtype: str = "fp16") -> float:
    """Microseconds of :func:`gemm`."""
    return gemm(m, n, k, device, dtype=dtype).time_us


def hit_rate(table_bytes: Real, device: "str | Device") -> float:
    """Chance a uniformly drawn row is in the last-level cache: ``min(1, cache / table)``.

    >>> hit_rate(400 * 2**20, "a100")   # a 400 MiB table, 40 MiB of L2
    0.1
    """
    table = _check(table_bytes, "table_bytes")
    d = get_device(device)
    return 1.0 if table <= d.cache_bytes else d.cache_bytes / table


def _embedding(lookups: int, bags: int, dim: int, rows: int, device: "str | Device",
               dtype_bytes: int, index_bytes: int, passes: int) -> KernelEstimate:
    d = get_device(device)
    for name, value in (("lookups", lookups), ("bags", bags), ("dim", dim), ("rows", rows),
                        ("dtype_bytes", dtype_bytes), ("index_bytes", index_bytes)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InvalidInstanceError(f"{name} = {value!r}; expected an integer >= 1")
    h = hit_rate(rows * dim * dtype_bytes, d)
    row_bytes = float(lookups) * dim * dtype_bytes * passes
    dram = row_bytes * (1 - h) + float(lookups) * index_bytes + float(bags) * dim * dtype_bytes
    cache = row_bytes * h
    time = d.launch_us + dram / (d.dram_gbps * 1e3) + cache / (d.cache_gbps * 1e3)
    return KernelEstimate(time, 0.0, dram, cache, "memory")


def embedding_bag_forward(lookups: int, bags: int, dim: int, rows: int, device: "str | Device", *,
                          dtype_bytes: int = 4, index_bytes: int = 8) -> KernelEstimate:
    """Gather ``lookups`` rows of ``dim`` elements and pool them into ``bags`` output rows.

    See docs/timing.md for the traffic. A table that fits in the cache is all hits:

    >>> e = embedding_bag_forward(1000, 10, 64, 1000, "v100")
    >>> e.dram_bytes, e.cache_bytes        # 8000 B of indices + 2560 B out; 256000 B of rows
    (10560.0, 256000.0)
    """
    return _embedding(lookups, bags, dim, rows, device, dtype_bytes, index_bytes, 1)


def embedding_bag_backward(lookups: int, bags: int, dim: int, rows: int, device: "str | Device", *,
                           dtype_bytes: int = 4, index_bytes: int = 8) -> KernelEstimate:
    """Backward with a fused SGD update: read each bag's gradient, read-modify-write each row."""
    return _embedding(lookups, bags, dim, rows, device, dtype_bytes, index_bytes, 2)


def embedding_bag_forward_time_us(lookups: int, bags: int, dim: int, rows: int,
                                  device: "str | Device", *, dtype_bytes: int = 4,
                                  index_bytes: int = 8) -> float:
    """Microseconds of :func:`embedding_bag_forward`."""
    return embedding_bag_forward(lookups, bags, dim, rows, device, dtype_bytes=dtype_bytes,
                                 index_bytes=index_bytes).time_us


def embedding_bag_backward_time_us(lookups: int, bags: int, dim: int, rows: int,
                                   device: "str | Device", *, dtype_bytes: int = 4,
                                   index_bytes: int = 8) -> float:
    """Microseconds of :func:`embedding_bag_backward`."""
    return embedding_bag_backward(lookups, bags, dim, rows, device, dtype_bytes=dtype_bytes,
                                  index_bytes=index_bytes).time_us
