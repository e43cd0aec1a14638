"""Time limits of the alltoall and hierarchical engines, driven by deadlines that need no clock:
one already expired, one that expires after a given number of looks, one with almost no time
left (no wall-clock assertion anywhere)."""

from __future__ import annotations

import pytest

from collsynth.algorithm import find_problems
from collsynth.collective import standard_collective
from collsynth.limits import ResourceLimitError, TimeLimitReached
from collsynth.synthesis.alltoall_scale import solve_alltoall_at_scale
from collsynth.synthesis.hierarchical import hierarchical_algorithm
from collsynth.synthesis.large import solve_large
from collsynth.limits import Deadline
from collsynth.topology import Topology, compose_nodes, get_topology
from collsynth.topology.families import fully_connected, ring

NODE_TIME_S = 20.0


def _detail(result, name: str):
    """One of an engine's own figures: an attribute of its result, or an entry of the result's
    ``details`` where the engines share one result type."""
    details = getattr(result, "details", None)
    return details[name] if details is not None and name in details else getattr(result, name)


class _ExpiresAfter(Deadline):
    """A deadline that has not passed for its first ``looks`` calls of ``expired()`` and has
    after; ``remaining()`` stays ``left`` seconds (the time a build estimate is checked
    against)."""

    def __init__(self, looks: int, left: float = 1e9) -> None:
        super().__init__(seconds=1.0)
        self.looks, self.left = looks, left

    def expired(self) -> bool:
        self.looks -= 1
        return self.looks < 0

    def remaining(self) -> float:
        return self.left


class _ExpiresAfterFirstPricing(Deadline):
    """A deadline that passes as soon as the hierarchical engine has priced one pipeline."""

    def __init__(self, monkeypatch) -> None:
        from collsynth.synthesis import hierarchical

        super().__init__(seconds=1.0)
        self.priced = 0
        price = hierarchical._Plan.price

        def counted(plan, capacity, budget=None):
            found = price(plan, capacity, budget)
            self.priced += 1
            return found

        monkeypatch.setattr(hierarchical._Plan, "price", counted)

    def expired(self) -> bool:
        return self.priced > 0

    def remaining(self) -> float:
        return 1e9


def test_hierarchical_stops_building_or_pricing_the_first_pipeline_at_the_deadline(
        monkeypatch):
    """The first candidate used to be built and priced whatever the time: at 8192 ranks that
    took 15 s past a 10 s limit. Past the deadline during its pricing, nothing is found."""
    from collsynth.synthesis import hierarchical

    topology = compose_nodes(fully_connected(4), 3, nic_units=1)
    node = _detail(hierarchical_algorithm(topology, "allgather", time_limit=NODE_TIME_S),
                   "node_algorithms")[0]
    at = hierarchical._Plan.at
    deadline = _ExpiresAfter(1 << 30)

    def slow(plan, step):   # the deadline passes while the first step is priced
        deadline.looks = 0
        return at(plan, step)

    monkeypatch.setattr(hierarchical._Plan, "at", slow)
    with pytest.raises(TimeLimitReached, match="pricing the first pipeline"):
        hierarchical_algorithm(topology, "allgather", node_algorithm=node, deadline=deadline)


@pytest.fixture(scope="module")
def two_rings():
    return compose_nodes(ring(4), 2, nic_units=1)


@pytest.fixture(scope="module")
def node_allgather(two_rings):
    result = hierarchical_algorithm(two_rings, "allgather", time_limit=NODE_TIME_S,
                                    batches=1, parts=1)
    return _detail(result, "node_algorithms")[0]


def test_hierarchical_with_an_expired_deadline_raises_time_limit_reached(two_rings):
    with pytest.raises(TimeLimitReached, match="time limit of 0 s reached while synthesising"):
        hierarchical_algorithm(two_rings, "allreduce", time_limit=NODE_TIME_S,
                               deadline=Deadline(0.0))


def test_hierarchical_with_a_given_node_algorithm_stops_before_pricing(two_rings,
                                                                       node_allgather):
    with pytest.raises(TimeLimitReached, match="pipelining"):
        hierarchical_algorithm(two_rings, "allgather", node_algorithm=node_allgather,
                               deadline=Deadline(0.0))


def test_hierarchical_keeps_the_first_pipeline_priced_when_time_runs_out(monkeypatch):
    # Three fully connected nodes: given time, sending to the two other nodes in two batches
    # (one step apart, overlapping the node allgathers) beats one batch.
    topology = compose_nodes(fully_connected(4), 3, nic_units=1)
    unhurried = hierarchical_algorithm(topology, "allgather", time_limit=NODE_TIME_S)
    assert _detail(unhurried, "pipeline") == ((2, 1),)
    # The deadline passes once the first candidate in the documented order (1 part, 1 batch)
    # is priced: it is built, verified and returned.
    node = _detail(unhurried, "node_algorithms")[0]
    deadline = _ExpiresAfterFirstPricing(monkeypatch)
    result = hierarchical_algorithm(topology, "allgather", node_algorithm=node,
                                    deadline=deadline)
    assert deadline.priced == 1
    assert _detail(result, "pipeline") == ((1, 1),)
    assert find_problems(result.algorithm) == []
    assert unhurried.rounds_per_chunk <= result.rounds_per_chunk


def test_hierarchical_refuses_a_build_the_time_left_cannot_cover(two_rings, node_allgather):
    with pytest.raises(ResourceLimitError, match="building and verifying"):
        hierarchical_algorithm(two_rings, "allgather", node_algorithm=node_allgather,
                               deadline=_ExpiresAfter(100, left=1e-9))


def test_alltoall_with_an_expired_deadline_raises_time_limit_reached():
    with pytest.raises(TimeLimitReached, match="alltoall"):
        solve_alltoall_at_scale(get_topology("hub:4"), deadline=Deadline(0.0))


def test_alltoall_keeps_the_direct_schedule_when_time_runs_out():
    # Ranks 0 and 1 of a node share a 1-unit link but both have 4 units to rank 2: direct
    # applies but misses the bound, so given time the hierarchical schedule is tried (and
    # wins, tests/synthesis/test_alltoall_scale.py); out of time, direct is kept.
    node = Topology("thin", ((0, 1, 4), (1, 0, 4), (4, 4, 0)))
    topology = compose_nodes(node, 2, nic_units=4)
    result = solve_alltoall_at_scale(topology, deadline=_ExpiresAfter(2))
    assert _detail(result, "schedule") == "direct"
    assert [c[0] for c in _detail(result, "candidates")] == ["direct"]
    assert find_problems(result.algorithm) == []


def test_alltoall_refuses_a_build_the_time_left_cannot_cover():
    with pytest.raises(ResourceLimitError, match="building and verifying"):
        solve_alltoall_at_scale(get_topology("hub:4"), deadline=_ExpiresAfter(100, left=1e-9))


@pytest.mark.parametrize("engine, name", [("alltoall", "alltoall"),
                                          ("hierarchical", "allgather")])
def test_solve_large_passes_its_time_limit_to_every_engine(two_rings, engine, name):
    collective = standard_collective(name, two_rings.num_ranks)
    with pytest.raises((TimeLimitReached, ResourceLimitError)):
        solve_large(two_rings, collective, engine=engine, time_limit=1e-9)


class _Remaining(_ExpiresAfter):
    """Never expired; ``remaining()`` answers from ``answers`` in turn, then a long time."""

    def __init__(self, *answers: float) -> None:
        super().__init__(looks=1 << 30)
        self.answers = list(answers)

    def remaining(self) -> float:
        return self.answers.pop(0) if self.answers else 1e9


def test_routed_alltoall_stops_doubling_the_pieces_when_the_next_would_overrun():
    topology = get_topology("torus:4x4")
    unhurried = solve_alltoall_at_scale(topology)
    assert _detail(unhurried, "schedule") == "routed" and unhurried.chunks > 1
    # After one piece per block, the time left is less than twice what that took.
    hurried = solve_alltoall_at_scale(topology, deadline=_Remaining(0.0))
    assert _detail(hurried, "schedule") == "routed" and hurried.chunks == 1
    assert find_problems(hurried.algorithm) == []
