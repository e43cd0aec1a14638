"""The alpha-beta model against numbers computed by hand."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest

from collsynth.algorithm import Algorithm, Send, Step, verify
from collsynth.collective import allgather, broadcast
from collsynth.errors import CollsynthError, InvalidInstanceError, InvalidTopologyError, UnknownNameError
from collsynth.topology import Topology, get_topology
from collsynth.timing import AlphaBeta, ClosedForm, base_chunk_bytes, from_topology
from collsynth.timing.model import crossover, time_us


def instance_time_us(steps, rounds_per_chunk, chunk_bytes, model):
    """A (steps, rounds per chunk) point on one base chunk of ``chunk_bytes`` (an allreduce's
    buffer is its base chunk)."""
    return time_us((steps, rounds_per_chunk), chunk_bytes, "allreduce", 2, model=model)


def algorithm_time_us(algorithm, size_bytes, model):
    """The closed form's price of ``algorithm`` (its topology has the figures of ``model``)."""
    assert from_topology(algorithm.topology) == model
    return ClosedForm().price(algorithm, [size_bytes])[0].time_us


def crossover_bytes(a, b, collective, n, model):
    return crossover(a, b, collective, n, model=model)

RING4 = ((0, 1, 0, 0), (0, 0, 1, 0), (0, 0, 0, 1), (1, 0, 0, 0))


def ring_allgather(unit_gbps: float | None = 10.0, alpha_us: float | None = 2.0) -> Algorithm:
    """The 3-step allgather on a 4-GPU unidirectional ring (1 chunk, 3 rounds)."""
    ring = Topology("ring4", RING4, unit_gbps=unit_gbps, alpha_us=alpha_us)
    steps = tuple(Step(1, tuple(Send((r - t) % 4, r, (r + 1) % 4) for r in range(4)))
                  for t in range(3))
    return verify(Algorithm("ring", ring, allgather(4), steps))


# -- the model's figures -------------------------------------------------------------------------


def test_from_topology_dgx1():
    # 25 GB/s per unit = 25_000 bytes per microsecond: beta = 1 / 25_000 us per byte.
    model = from_topology(get_topology("dgx1"))
    assert model.alpha_us == 0.7
    assert model.beta_us_per_byte == pytest.approx(1 / 25_000, rel=1e-15)


def test_from_topology_units():
    # 1 GB/s = 1000 bytes per microsecond: 1 MB takes 1000 us.
    ring = Topology("ring4", RING4, unit_gbps=1.0, alpha_us=5.0)
    model = from_topology(ring)
    assert model == AlphaBeta(alpha_us=5.0, beta_us_per_byte=1e-3)
    assert instance_time_us(0, 1, 1_000_000, model) == pytest.approx(1000.0)


@pytest.mark.parametrize("alpha_us, unit_gbps, missing", [
    (None, 10.0, "alpha_us"),
    (2.0, None, "unit_gbps"),
    (None, None, "alpha_us and no unit_gbps"),
])
def test_from_topology_missing_figures(alpha_us, unit_gbps, missing):
    ring = Topology("ring4", RING4, unit_gbps=unit_gbps, alpha_us=alpha_us)
    with pytest.raises(InvalidTopologyError, match=f"'ring4' has no {missing}"):
        from_topology(ring)


@pytest.mark.parametrize("alpha, beta", [(-1.0, 1e-4), (1.0, -1e-4), (math.inf, 1e-4),
                                         (1.0, math.nan), ("1", 1e-4), (True, 1e-4)])
def test_alphabeta_refuses_bad_figures(alpha, beta):
    with pytest.raises(CollsynthError):
        AlphaBeta(alpha_us=alpha, beta_us_per_byte=beta)


def test_alphabeta_is_frozen():
    model = AlphaBeta(1.0, 1e-4)
    with pytest.raises(AttributeError):
        model.alpha_us = 2.0  # type: ignore[misc]


# -- size_bytes -> base chunk (nccl-tests convention) -------------------------------------------


@pytest.mark.parametrize("name, n, size, chunk", [
    ("allgather", 8, 8000, 1000),           # output buffer = 8 ranks x 1000 bytes
    ("reduce_scatter", 8, 8000, 1000),      # input buffer = 8 x the 1000-byte output
    ("reduce-scatter", 4, 10, Fraction(5, 2)),
    ("allreduce", 8, 8000, 8000),           # one base chunk = the whole buffer
    ("alltoall", 8, 8000, 1000),            # a rank's buffer = 8 per-pair blocks
    ("broadcast", 8, 8000, 8000),
    ("reduce", 8, 8000, 8000),
    ("gather", 8, 8000, 1000),              # the root's buffer = 8 parts
    ("scatter", 8, 8000, 1000),
    ("AllGather", 4, 1.5, Fraction(3, 8)),  # case-insensitive; floats read as decimals
])
def test_base_chunk_bytes(name, n, size, chunk):
    assert base_chunk_bytes(name, n, size) == chunk


def test_base_chunk_bytes_refuses():
    with pytest.raises(UnknownNameError, match="no buffer-size convention"):
        base_chunk_bytes("multiroot_broadcast", 4, 100)
    with pytest.raises(InvalidInstanceError):
        base_chunk_bytes("allgather", 0, 100)
    with pytest.raises(InvalidInstanceError):
        base_chunk_bytes("allgather", 4, -1)
    with pytest.raises(InvalidInstanceError):
        base_chunk_bytes("allgather", 4, math.inf)


# -- times ---------------------------------------------------------------------------------------


def test_instance_time_by_hand():
    model = AlphaBeta(alpha_us=2.0, beta_us_per_byte=1e-4)
    # 3 * 2 + (7/6) * 6000 * 1e-4 = 6 + 0.7
    assert instance_time_us(3, Fraction(7, 6), 6000, model) == pytest.approx(6.7)
    # latency only, bandwidth only
    assert instance_time_us(5, Fraction(1, 2), 0, model) == pytest.approx(10.0)
    assert instance_time_us(0, 2, 10_000, model) == pytest.approx(2.0)


def test_algorithm_time_ring_allgather():
    algorithm = ring_allgather()
    model = from_topology(algorithm.topology)  # alpha 2 us, beta 1e-4 us per byte
    assert (algorithm.num_steps, algorithm.rounds_per_chunk) == (3, 3)
    # 4 KB output buffer: 1 KB base chunks: 3 * 2 + 3 * 1000 * 1e-4 = 6.3 us
    assert algorithm_time_us(algorithm, 4000, model) == pytest.approx(6.3)
    # 4 GB: 6 + 3 * 1e9 * 1e-4 = 300_006 us
    assert algorithm_time_us(algorithm, 4 * 10**9, model) == pytest.approx(300_006.0)


def test_algorithm_time_uses_rounds_per_base_chunk():
    # The ring allgather refined into 2 chunks: same 3 steps, 6 rounds, 2 chunks -> 3 rounds per
    # base chunk, so the same time as the unsplit one.
    base = ring_allgather()
    steps = tuple(Step(2, tuple(Send(2 * ((r - t) % 4) + half, r, (r + 1) % 4)
                                for r in range(4) for half in range(2)))
                  for t in range(3))
    split = verify(Algorithm("ring2", base.topology, allgather(4).split(2), steps))
    assert split.rounds_per_chunk == 3
    model = from_topology(base.topology)
    assert algorithm_time_us(split, 4000, model) == pytest.approx(algorithm_time_us(base, 4000, model))


def test_algorithm_time_broadcast_whole_buffer():
    ring = Topology("ring3", ((0, 1, 1), (1, 0, 1), (1, 1, 0)), unit_gbps=1.0, alpha_us=1.0)
    algorithm = verify(Algorithm("b", ring, broadcast(3, 0), (Step(1, (Send(0, 0, 1), Send(0, 0, 2))),)))
    # 1 step + 1 round per chunk of the whole 1000-byte buffer at 1000 bytes/us: 1 + 1 = 2 us
    assert algorithm_time_us(algorithm, 1000, from_topology(ring)) == pytest.approx(2.0)


# -- crossover -----------------------------------------------------------------------------------


def test_crossover_dgx1_allgather():
    # DGX-1 allgather front: (2 steps, 3/2) and (3 steps, 7/6); alpha 0.7 us, beta 1/25000 us/B.
    # size = 8 * (2 - 3) * 0.7 / ((7/6 - 3/2) / 25000) = 8 * 0.7 * 3 * 25000 = 420_000 bytes
    model = from_topology(get_topology("dgx1"))
    fast, wide = (2, Fraction(3, 2)), (3, Fraction(7, 6))
    size = crossover_bytes(fast, wide, "allgather", 8, model)
    assert size == Fraction(420_000)
    assert crossover_bytes(wide, fast, "allgather", 8, model) == size
    chunk = base_chunk_bytes("allgather", 8, size)
    assert instance_time_us(*fast, chunk, model) == pytest.approx(instance_time_us(*wide, chunk, model))
    small, large = size / 2, size * 2
    assert instance_time_us(*fast, small / 8, model) < instance_time_us(*wide, small / 8, model)
    assert instance_time_us(*fast, large / 8, model) > instance_time_us(*wide, large / 8, model)


def test_crossover_scales_with_buffer_convention():
    model = AlphaBeta(alpha_us=2.0, beta_us_per_byte=1e-4)
    a, b = (2, 2), (3, Fraction(3, 2))
    # base chunk: (3 - 2) * 2 / ((2 - 3/2) * 1e-4) = 40_000 bytes
    assert crossover_bytes(a, b, "allreduce", 4, model) == 40_000
    assert crossover_bytes(a, b, "allgather", 4, model) == 160_000


def test_crossover_exact_with_fractions():
    model = AlphaBeta(alpha_us=Fraction(1, 3), beta_us_per_byte=Fraction(1, 3000))
    # 1 * (1/3) / ((1/2) * (1/3000)) = 2000
    assert crossover_bytes((1, 1), (2, Fraction(1, 2)), "broadcast", 8, model) == 2000


@pytest.mark.parametrize("a, b", [
    ((2, 2), (3, 2)),                       # same rounds: parallel lines
    ((2, 1), (3, 2)),                       # a no worse in both: never crosses
    ((2, Fraction(3, 2)), (2, 1)),          # same steps: b always wins
])
def test_no_crossover(a, b):
    model = AlphaBeta(alpha_us=1.0, beta_us_per_byte=1e-4)
    assert crossover_bytes(a, b, "allgather", 4, model) is None


def test_no_crossover_without_latency_or_bandwidth():
    a, b = (2, 2), (3, Fraction(3, 2))
    assert crossover_bytes(a, b, "allgather", 4, AlphaBeta(0.0, 1e-4)) is None
    assert crossover_bytes(a, b, "allgather", 4, AlphaBeta(1.0, 0.0)) is None


def test_crossover_refuses_bad_points():
    model = AlphaBeta(alpha_us=1.0, beta_us_per_byte=1e-4)
    with pytest.raises(InvalidInstanceError):
        crossover_bytes((2, 2, 1), (3, 1), "allgather", 4, model)
    with pytest.raises(InvalidInstanceError):
        crossover_bytes((2, -1), (3, 1), "allgather", 4, model)
