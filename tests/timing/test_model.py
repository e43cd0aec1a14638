"""The closed-form model: symbolic times, exact crossovers, link classes, gamma; hand-computed."""

from __future__ import annotations

from fractions import Fraction

import pytest
import sympy

from collsynth.algorithm import Algorithm, Send, Step, verify
from collsynth.collective import allgather, reduce_scatter
from collsynth.errors import InvalidInstanceError, InvalidTopologyError
from collsynth.timing import AlphaBeta, from_topology
from collsynth.timing.model import (
    NETWORK_ALPHA_US,
    SIZE,
    CostModel,
    cost_model,
    crossover,
    lower_envelope,
    reduced_pieces,
    step_figures,
    symbolic_time,
    time_us,
)
from collsynth.timing.tuning_model import NcclChoice
from collsynth.topology import Topology, get_topology
from collsynth.topology.compose import compose_nodes

RING4 = ((0, 1, 0, 0), (0, 0, 1, 0), (0, 0, 0, 1), (1, 0, 0, 0))
DGX1 = AlphaBeta(alpha_us=0.7, beta_us_per_byte=1 / 25e3)


def ring_allgather() -> Algorithm:
    """3 steps of 1 round on a unidirectional 4-ring, 10 GB/s links, 2 us per step."""
    ring = Topology("ring4", RING4, unit_gbps=10.0, alpha_us=2.0)
    steps = tuple(Step(1, tuple(Send((r - t) % 4, r, (r + 1) % 4) for r in range(4)))
                  for t in range(3))
    return verify(Algorithm("ring", ring, allgather(4), steps))


def two_pairs_allgather(network_alpha_us: float | None = None) -> Algorithm:
    """Two nodes of two ranks (node links 1 unit of 10 GB/s, 1 us; NIC 1 unit): allgather in
    3 steps: exchange inside each node, across the network (0<->2, 1<->3), inside again."""
    pair = Topology("pair", ((0, 1), (1, 0)), unit_gbps=10.0, alpha_us=1.0)
    topology = compose_nodes(pair, 2, nic_units=1)
    steps = (
        Step(1, (Send(0, 0, 1), Send(1, 1, 0), Send(2, 2, 3), Send(3, 3, 2))),
        Step(1, (Send(0, 0, 2), Send(1, 1, 3), Send(2, 2, 0), Send(3, 3, 1))),
        Step(1, (Send(2, 0, 1), Send(3, 1, 0), Send(0, 2, 3), Send(1, 3, 2))),
    )
    return verify(Algorithm("pairs", topology, allgather(4), steps))


# -- symbolic time --------------------------------------------------------------------------------


def test_symbolic_time_of_a_ring_by_hand():
    # 3 steps x 2 us + 3 rounds x (size / 4) bytes x 1e-4 us/byte = 6 + 3 size / 40000.
    expr = symbolic_time(ring_allgather())
    assert sympy.simplify(expr - (6 + sympy.Rational(3, 40000) * SIZE)) == 0
    assert expr.free_symbols == {SIZE}


@pytest.mark.parametrize("size", [1, 1000, 4_000_000, 10**9])
def test_symbolic_time_agrees_with_alphabeta(size):
    # Step by step (the algorithm) and as one (steps, rounds per chunk) point: the same time on
    # a topology of one link class.
    algorithm = ring_allgather()
    model = from_topology(algorithm.topology)
    point = (algorithm.num_steps, algorithm.rounds_per_chunk)
    assert time_us(algorithm, size) == pytest.approx(
        time_us(point, size, "allgather", 4, model=model))


def test_point_dgx1_by_hand():
    # (2 steps, 3/2): 2 x 0.7 + 3/2 x size/8 / 25000 = 7/5 + 3 size / 400000.
    expr = symbolic_time((2, Fraction(3, 2)), "allgather", 8, model=DGX1)
    assert expr == sympy.Rational(7, 5) + sympy.Rational(3, 400000) * SIZE
    assert time_us((2, Fraction(3, 2)), 10**6, "allgather", 8, model=DGX1) == pytest.approx(8.9)


def test_point_needs_a_collective_and_figures():
    with pytest.raises(InvalidInstanceError, match="collective"):
        symbolic_time((2, 2), model=DGX1)
    with pytest.raises(InvalidInstanceError, match="model="):
        symbolic_time((2, 2), "allgather", 8)
    with pytest.raises(InvalidTopologyError, match="no alpha_us"):
        symbolic_time((2, 2), "allgather", 4, model=get_topology("ring:4"))


# -- crossovers ---------------------------------------------------------------------------------


def test_crossover_dgx1_front_is_420000_bytes():
    # Extra step 0.7 us = saved (3/2 - 7/6) x size/8 / 25000 us  ->  size = 0.7 x 3 x 8 x 25000.
    size = crossover((2, Fraction(3, 2)), (3, Fraction(7, 6)), "allgather", 8, model=DGX1)
    assert size == Fraction(420000) and isinstance(size, Fraction)


def test_crossover_is_exact_for_a_non_integer_size():
    # allgather of 7 ranks, alpha 1/10 us, beta 1/3 us per byte: (1, 1) vs (2, 2/3) meet where
    # 1/10 = (1/3) x (size / 7) x (1/3), i.e. size = 63/10 bytes.
    model = AlphaBeta(alpha_us=Fraction(1, 10), beta_us_per_byte=Fraction(1, 3))
    assert crossover((1, 1), (2, Fraction(2, 3)), "allgather", 7, model=model) == Fraction(63, 10)


@pytest.mark.parametrize("a, b", [
    ((2, 2), (3, 2)),                            # parallel (equal rounds per chunk)
    ((2, 2), (2, 2)),                            # identical
    ((2, 1), (3, 2)),                            # (2, 1) dominates: root is negative
])
def test_crossover_none(a, b):
    assert crossover(a, b, "allgather", 8, model=DGX1) is None


def test_crossover_against_an_nccl_line():
    # NCCL line: 10 us + size / (1000 x 1000 GB/s); point: 7/5 + 3 size / 400000.
    # 10 - 7/5 = size x (3/400000 - 1/1000000) = size x 13/2000000  ->  size = 17200000/13.
    nccl = NcclChoice("ring", "LL", "allgather", 8, Fraction(10), Fraction(1000))
    size = crossover((2, Fraction(3, 2)), nccl, "allgather", 8, model=DGX1)
    assert size == Fraction(17_200_000, 13)
    assert time_us((2, Fraction(3, 2)), size, "allgather", 8, model=DGX1) == pytest.approx(
        nccl.time_us(size))


def test_crossover_of_an_algorithm_with_a_point():
    # ring: 6 + 3 size/40000; (2 steps, 4 rounds/chunk): 4 + size/10000 -> size = 80000.
    algorithm = ring_allgather()
    assert crossover((2, 4), algorithm, "allgather", 4,
                     model=cost_model(algorithm.topology)) == 80000


def test_lower_envelope():
    lines = {"latency": 1 + SIZE, "middle": 2 + SIZE / 2, "bandwidth": 10 + SIZE / 10,
             "never": 100 + SIZE}
    # latency/middle meet at 2; middle/bandwidth at 20.
    segments = lower_envelope(lines, 1, 1000)
    assert [(s.name, s.from_bytes, s.to_bytes) for s in segments] == [
        ("latency", 1, 2), ("middle", 2, 20), ("bandwidth", 20, 1000)]
    assert [s.name for s in lower_envelope(lines, 30, 40)] == ["bandwidth"]
    # A tie at the start goes to the smaller slope.
    assert [s.name for s in lower_envelope(lines, 2, 3)] == ["middle"]


# -- link classes ---------------------------------------------------------------------------------


def test_plain_topology_has_one_class():
    model = cost_model(get_topology("dgx1"))
    assert model.class_names == ("link",) and model.links == from_topology(get_topology("dgx1"))


def test_composed_topology_classes_and_the_per_step_rule():
    algorithm = two_pairs_allgather()
    model = cost_model(algorithm.topology, network_alpha_us=5.0)
    assert model.class_names == ("intra-node", "network")
    assert model.class_of(0, 1) == "intra-node" and model.class_of(1, 2) == "network"
    # Steps use intra, network, intra: alpha 1 + 5 + 1; each step one round of size/4 bytes at
    # 10 GB/s per unit (beta 1e-4 on both classes): 7 + 3 x size/4 x 1e-4.
    assert [f.alpha_us for f in step_figures(algorithm, model)] == [1.0, 5.0, 1.0]
    expr = symbolic_time(algorithm, model=model)
    assert expr == 7 + sympy.Rational(3, 40000) * SIZE
    # The default network latency is NCCL's ring LL network hop.
    assert cost_model(algorithm.topology).network.alpha_us == NETWORK_ALPHA_US == 2.7


def test_network_beta_uses_the_declared_nic_speed():
    # A 25 GB/s unit and an 11 GB/s NIC: compose rounds 11/25 to 3/7 and rescales by 7, so a NIC
    # link is 3 units of 25/7 GB/s = 10.71 GB/s; the model keeps 11 GB/s: 11/3 GB/s per unit.
    node = Topology("n2", ((0, 1), (1, 0)), unit_gbps=25.0, alpha_us=1.0,
                    metadata={"nic": {"count": 2, "gbps": 11.0, "per_gpu": True}})
    composed = compose_nodes(node, 2)
    assert composed.links[0][2] == 3 and composed.unit_gbps == pytest.approx(25 / 7)
    model = cost_model(composed)
    assert model.links.beta_us_per_byte == pytest.approx(7 / 25e3)
    assert model.network.beta_us_per_byte == pytest.approx(3 / 11e3)


def test_cost_model_validation():
    with pytest.raises(InvalidTopologyError, match="together"):
        CostModel(DGX1, network=DGX1)
    with pytest.raises(InvalidInstanceError, match="gamma"):
        CostModel(DGX1, gamma_us_per_byte=-1.0)


def test_calibration_is_applied_to_the_topology():
    class FakeCalibration:  # the interface of collsynth.timing.calibration.CurveCalibration
        def apply(self, topology):
            from dataclasses import replace
            return replace(topology, alpha_us=3.0, unit_gbps=5.0)

    from collsynth.timing.closed_form import ClosedForm

    ring = ring_allgather().topology
    model = ClosedForm(calibration=FakeCalibration())
    assert model.cost_model(ring).links == AlphaBeta(3.0, 1 / 5e3)


# -- gamma ----------------------------------------------------------------------------------------


def test_gamma_counts_the_busiest_reducer_per_step():
    # reduce_scatter on 2 ranks in one step: each rank receives one reducing send of the other's
    # half (size/2 bytes). time = alpha + (size/2) beta + gamma (size/2).
    pair = Topology("pair", ((0, 1), (1, 0)), unit_gbps=10.0, alpha_us=1.0)
    step = Step(1, (Send(0, 1, 0, reduce=True), Send(1, 0, 1, reduce=True)))
    algorithm = verify(Algorithm("rs", pair, reduce_scatter(2), (step,)))
    assert reduced_pieces(algorithm) == (1,)
    model = cost_model(pair, gamma_us_per_byte=Fraction(1, 10**6))
    expr = symbolic_time(algorithm, model=model)
    assert expr == 1 + SIZE / 2 * (sympy.Rational(1, 10**4) + sympy.Rational(1, 10**6))
    # A point is told its reduced chunks: 1 of size/2.
    point = symbolic_time((1, 1), "reduce_scatter", 2, model=model, reduced_chunks=1)
    assert point == expr
