"""The step-by-step simulation against the closed form: equal on tight uniform cases, never
slower, and slower-to-faster orderings on heterogeneous links and shared groups."""

from __future__ import annotations

import dataclasses

import pytest

from collsynth.algorithm import Algorithm, Send, Step, verify
from collsynth.collective import allgather, broadcast
from collsynth.timing.model import cost_model, time_us
from collsynth.timing.simulate import is_tight, simulate, step_load_rounds
from collsynth.topology import Topology, get_topology
from collsynth.topology.compose import compose_nodes
from collsynth.topology.families import fully_connected, hub

RING4 = ((0, 1, 0, 0), (0, 0, 1, 0), (0, 0, 0, 1), (1, 0, 0, 0))
SIZES = [1, 1000, 4_000_000, 10**9]


def with_figures(topology: Topology, unit_gbps: float = 10.0, alpha_us: float = 2.0) -> Topology:
    return dataclasses.replace(topology, unit_gbps=unit_gbps, alpha_us=alpha_us)


def ring_allgather(rounds: int = 1) -> Algorithm:
    ring = Topology("ring4", RING4, unit_gbps=10.0, alpha_us=2.0)
    steps = tuple(Step(rounds, tuple(Send((r - t) % 4, r, (r + 1) % 4) for r in range(4)))
                  for t in range(3))
    return verify(Algorithm("ring", ring, allgather(4), steps))


def one_step_allgather(topology: Topology, rounds: int) -> Algorithm:
    """Every rank sends its chunk straight to every other rank in one step."""
    n = topology.num_ranks
    sends = tuple(Send(r, r, d) for r in range(n) for d in range(n) if d != r)
    return verify(Algorithm("direct", topology, allgather(n), (Step(rounds, sends),)))


# -- uniform topologies: equal to the closed form ------------------------------------------------


@pytest.mark.parametrize("size", SIZES)
def test_ring_agrees_with_closed_form(size):
    algorithm = ring_allgather()
    run = simulate(algorithm, size)
    # By hand: 3 x (2 us + (size/4) bytes / 10**4 bytes per us).
    assert run.total_us == pytest.approx(3 * (2 + size / 4 / 1e4))
    assert run.total_us == pytest.approx(time_us(algorithm, size))
    assert is_tight(algorithm)
    assert all(step.bottleneck.startswith("link ") for step in run.steps)


@pytest.mark.parametrize("size", SIZES)
def test_fully_connected_agrees_with_closed_form(size):
    algorithm = one_step_allgather(with_figures(fully_connected(4)), rounds=1)
    run = simulate(algorithm, size)
    assert run.total_us == pytest.approx(2 + size / 4 / 1e4)
    assert run.total_us == pytest.approx(time_us(algorithm, size))


def test_slack_rounds_make_the_closed_form_slower():
    # Each step declares 2 rounds but loads every link with 1 piece: the closed form charges
    # 3 x 2 rounds, the simulation 3 x 1.
    algorithm = ring_allgather(rounds=2)
    assert not is_tight(algorithm) and step_load_rounds(algorithm) == (1, 1, 1)
    size = 4_000_000
    assert time_us(algorithm, size) - simulate(algorithm, size).total_us == pytest.approx(
        3 * (size / 4) / 1e4)


# -- heterogeneous links: DGX-1 (1- and 2-unit NVLinks) --------------------------------------------


def dgx1_broadcast() -> Algorithm:
    """Broadcast from 0 in 2 pieces (a, b), 3 steps of 1 round on the DGX-1.

    Step 1: 0->1 a,b (2 units), 0->4 a,b (2 units), 0->2 a, 0->3 b (1 unit each).
    Step 2: 1->3 a (2 units), 1->2 b, 4->5 a,b (2 units), 4->6 a, 4->7 b (1 unit each).
    Step 3: 6->7 a, 7->6 b: one piece each over 2-unit links, half a round.
    """
    dgx1 = get_topology("dgx1")
    s1 = (Send(0, 0, 1), Send(1, 0, 1), Send(0, 0, 4), Send(1, 0, 4), Send(0, 0, 2), Send(1, 0, 3))
    s2 = (Send(0, 1, 3), Send(1, 1, 2), Send(0, 4, 5), Send(1, 4, 5), Send(0, 4, 6), Send(1, 4, 7))
    s3 = (Send(0, 6, 7), Send(1, 7, 6))
    steps = (Step(1, s1), Step(1, s2), Step(1, s3))
    return verify(Algorithm("bcast", dgx1, broadcast(8).split(2), steps))


def test_dgx1_half_round_step():
    algorithm = dgx1_broadcast()
    assert step_load_rounds(algorithm) == (1, 1, 0.5)
    size = 10**6  # a broadcast's base chunk is the buffer; a piece is size/2 = 500000 bytes
    # Closed form: 3 x 0.7 + 3 rounds x 500000 / 25000 = 2.1 + 60 us.
    assert time_us(algorithm, size) == pytest.approx(62.1)
    # Simulation: the last step carries 500000 bytes over 50000 bytes per us: 10 us, not 20.
    run = simulate(algorithm, size)
    assert [round(s.transfer_us, 9) for s in run.steps] == [20, 20, 10]
    assert run.total_us == pytest.approx(52.1)
    assert run.total_us < time_us(algorithm, size)


def test_dgx1_front_never_slower_equal_when_tight():
    from collsynth.collective import standard_collective
    from collsynth.synthesis import SolveOptions, pareto_front

    dgx1 = get_topology("dgx1")
    front = list(pareto_front(dgx1, standard_collective("allgather", 8),
                              options=SolveOptions(time_limit=60)))
    assert front
    for result in front:
        algorithm = result.algorithm
        for size in SIZES:
            closed, simulated = time_us(algorithm, size), simulate(algorithm, size).total_us
            assert simulated <= closed * (1 + 1e-12)
            if is_tight(algorithm):
                assert simulated == pytest.approx(closed)


# -- contention in bandwidth groups ---------------------------------------------------------------


def test_hub_groups_bound_the_step():
    # One step, every rank to both others: each link carries 1 piece, but a rank's egress group
    # (limit 1) carries 2, so the step lasts 2 rounds; without the groups (fully connected) 1.
    size = 3_000_000  # a piece is size / 3 = 10**6 bytes, 100 us at 10 GB/s
    on_hub = simulate(one_step_allgather(with_figures(hub(3)), rounds=2), size)
    on_fc = simulate(one_step_allgather(with_figures(fully_connected(3)), rounds=2), size)
    assert on_hub.steps[0].transfer_us == pytest.approx(200.0)
    assert on_hub.steps[0].bottleneck == "group 'rank 0 egress'"
    assert on_fc.steps[0].transfer_us == pytest.approx(100.0)
    assert on_hub.total_us == pytest.approx(time_us(one_step_allgather(with_figures(hub(3)), 2),
                                                    size))
    assert on_fc.total_us < on_hub.total_us


# -- link classes ---------------------------------------------------------------------------------


def test_composed_topology_per_link_alpha():
    pair = Topology("pair", ((0, 1), (1, 0)), unit_gbps=10.0, alpha_us=1.0)
    topology = compose_nodes(pair, 2, nic_units=1)
    steps = (
        Step(1, (Send(0, 0, 1), Send(1, 1, 0), Send(2, 2, 3), Send(3, 3, 2))),
        Step(1, (Send(0, 0, 2), Send(1, 1, 3), Send(2, 2, 0), Send(3, 3, 1))),
        Step(1, (Send(2, 0, 1), Send(3, 1, 0), Send(0, 2, 3), Send(1, 3, 2))),
    )
    algorithm = verify(Algorithm("pairs", topology, allgather(4), steps))
    model = cost_model(topology, network_alpha_us=5.0)
    run = simulate(algorithm, 40_000, model=model)
    assert [s.alpha_us for s in run.steps] == [1.0, 5.0, 1.0]
    # 7 us of latency + 3 steps of 10000 bytes at 10**4 bytes/us.
    assert run.total_us == pytest.approx(10.0)
    assert run.total_us == pytest.approx(time_us(algorithm, 40_000, model=model))


def test_reductions_add_gamma():
    from collsynth.collective import reduce_scatter

    pair = Topology("pair", ((0, 1), (1, 0)), unit_gbps=10.0, alpha_us=1.0)
    step = Step(1, (Send(0, 1, 0, reduce=True), Send(1, 0, 1, reduce=True)))
    algorithm = verify(Algorithm("rs", pair, reduce_scatter(2), (step,)))
    model = cost_model(pair, gamma_us_per_byte=1e-6)
    run = simulate(algorithm, 2_000_000, model=model)
    # 1 us + 10**6 bytes / 10**4 + 10**6 x 1e-6.
    assert run.steps[0].reduce_us == pytest.approx(1.0)
    assert run.total_us == pytest.approx(102.0)
    assert run.total_us == pytest.approx(time_us(algorithm, 2_000_000, model=model))
