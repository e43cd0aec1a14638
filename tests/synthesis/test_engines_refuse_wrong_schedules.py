"""Every synthesis engine verifies its schedule before returning it.

Each test replaces the engine's schedule builder by one that returns the real schedule with a
send dropped, or with a send moved onto a link that does not exist, and checks that the engine
raises the project's error instead of returning the schedule.
"""

from __future__ import annotations

import pytest

import collsynth.synthesis.alltoall_scale as alltoall_scale
import collsynth.synthesis.bandwidth_optimal.engine as tree_engine
import collsynth.synthesis.combining as combining
import collsynth.synthesis.hierarchical as hierarchical
import collsynth.synthesis.instance as instance
from collsynth.algorithm import Algorithm, Send, Step
from collsynth.algorithm.model import Instance
from collsynth.collective import Collective, standard_collective
from collsynth.errors import SolverError, VerificationError
from collsynth.synthesis import SolveOptions, solve_instance
from collsynth.synthesis.alltoall_scale import solve_alltoall_at_scale
from collsynth.synthesis.bandwidth_optimal import solve_bandwidth_optimal
from collsynth.synthesis.hierarchical import hierarchical_algorithm
from collsynth.synthesis.large import solve_large
from collsynth.topology import Topology, compose_nodes, get_topology

#: Seconds for the node algorithms of the hierarchical engines (a hang guard).
NODE_TIME_S = 30.0
FAULTS = ("drop", "missing-link")


def _missing_link(topology: Topology, src: int) -> int | None:
    """A rank that ``src`` has no link to, or ``None``."""
    return next((r for r in range(topology.num_ranks)
                 if r != src and topology.links[src][r] == 0), None)


def _victim(topology: Topology, steps: list, fault: str) -> tuple[int, int]:
    """(step, send) to corrupt, given each step's senders: the last send of the last step with
    sends, or for ``missing-link`` the last send whose sender lacks a link to some rank."""
    return max((t, i) for t, srcs in enumerate(steps) for i, s in enumerate(srcs)
               if fault == "drop" or _missing_link(topology, int(s)) is not None)


def _corrupt_arrays(topology: Topology, steps: list, fault: str) -> list:
    """Steps of sends as arrays (chunk, src, dst, reduce), with a send dropped or moved onto a
    missing link."""
    t, i = _victim(topology, [arrays[1] for arrays in steps], fault)
    chunk, src, dst, flags = steps[t]
    if fault == "drop":
        keep = [j for j in range(len(chunk)) if j != i]
        chunk, src, dst, flags = chunk[keep], src[keep], dst[keep], flags[keep]
    else:
        dst = dst.copy()
        dst[i] = _missing_link(topology, int(src[i]))
    return steps[:t] + [(chunk, src, dst, flags)] + steps[t + 1:]


def _corrupt(algorithm: Algorithm, fault: str) -> Algorithm:
    """``algorithm`` with a send dropped, or moved onto a link that does not exist (from the
    same sender)."""
    steps = list(algorithm.steps)
    t, i = _victim(algorithm.topology, [[s.src for s in step.sends] for step in steps], fault)
    sends = list(steps[t].sends)
    victim = sends.pop(i)
    if fault == "missing-link":
        sends.insert(i, Send(victim.chunk, victim.src,
                             _missing_link(algorithm.topology, victim.src), victim.reduce))
    steps[t] = Step(steps[t].rounds, tuple(sends))
    return Algorithm(algorithm.name, algorithm.topology, algorithm.collective, tuple(steps),
                     algorithm.provenance)


# -- the tree engine -------------------------------------------------------------------------------


@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize("name", ["allgather", "broadcast", "reduce_scatter", "reduce",
                                  "allreduce"])
def test_tree_engine_refuses_a_wrong_pipeline(monkeypatch, name, fault):
    """Allgather and broadcast directly; reduce-scatter and reduce through the dual on the
    reversed topology; allreduce as both halves."""
    real = tree_engine.pipelined_algorithm
    monkeypatch.setattr(tree_engine, "pipelined_algorithm",
                        lambda *args, **kwargs: _corrupt(real(*args, **kwargs), fault))
    collective = standard_collective(name, 4, root=0 if name in ("broadcast", "reduce") else None)
    with pytest.raises(VerificationError):
        solve_bandwidth_optimal(get_topology("ring:4"), collective, stages=2)


def test_tree_engine_refuses_a_wrong_pipeline_through_solve_large(monkeypatch):
    real = tree_engine.pipelined_algorithm
    monkeypatch.setattr(tree_engine, "pipelined_algorithm",
                        lambda *args, **kwargs: _corrupt(real(*args, **kwargs), "drop"))
    with pytest.raises(VerificationError):
        solve_large(get_topology("ring:4"), standard_collective("allgather", 4), engine="trees",
                    stages=2)


# -- the hierarchical and alltoall engines ---------------------------------------------------------

#: Two nodes of a 3-rank line (0 - 1 - 2, so 0 and 2 are not linked): the direct alltoall does
#: not apply and the missing link is there to be misused.
TWO_LINES = compose_nodes(get_topology("line:3"), 2, nic_units=1)


def _corrupt_prices(monkeypatch, fault: str) -> None:
    """Every priced plan of the hierarchical builders comes back corrupted (after pricing, so
    only the final verification can notice)."""
    real = hierarchical._Plan.price

    def price(self, capacity, budget=None):
        steps, rounds = real(self, capacity, budget)
        return _corrupt_arrays(capacity.topology, list(steps), fault), rounds

    monkeypatch.setattr(hierarchical._Plan, "price", price)


@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize("family", ["allgather", "reduce_scatter", "allreduce", "broadcast",
                                    "reduce", "alltoall"])
def test_hierarchical_engine_refuses_a_wrong_plan(monkeypatch, family, fault):
    _corrupt_prices(monkeypatch, fault)
    with pytest.raises(VerificationError):
        hierarchical_algorithm(TWO_LINES, family, time_limit=NODE_TIME_S)


@pytest.mark.parametrize("fault", FAULTS)
def test_alltoall_engine_refuses_a_wrong_hierarchical_schedule(monkeypatch, fault):
    _corrupt_prices(monkeypatch, fault)
    with pytest.raises(VerificationError):
        solve_alltoall_at_scale(TWO_LINES, time_limit=NODE_TIME_S)


def test_alltoall_engine_refuses_a_wrong_direct_schedule(monkeypatch):
    """The direct schedule sends block (s, d) from s to d for every pair the builder lists; a
    pair left out is a block never delivered."""
    real = alltoall_scale._all_pairs
    monkeypatch.setattr(alltoall_scale, "_all_pairs",
                        lambda total: tuple(a[:-1] for a in real(total)))
    with pytest.raises(VerificationError):
        solve_alltoall_at_scale(get_topology("fully-connected:4"))


def test_alltoall_engine_refuses_a_direct_schedule_priced_too_short(monkeypatch):
    """Pieces per block and rounds come from the same pricing; one round fewer overloads a link."""
    real = alltoall_scale._direct_pieces
    monkeypatch.setattr(alltoall_scale, "_direct_pieces",
                        lambda *args: (lambda p, r: (p, r - 1))(*real(*args)))
    with pytest.raises(VerificationError):
        solve_alltoall_at_scale(get_topology("hub:4"))


def test_alltoall_engine_refuses_a_wrong_schedule_through_solve_large(monkeypatch):
    _corrupt_prices(monkeypatch, "drop")
    with pytest.raises(VerificationError):
        solve_large(TWO_LINES, standard_collective("alltoall", 6), engine="alltoall",
                    time_limit=NODE_TIME_S)


# -- the exact (SMT) engine ------------------------------------------------------------------------


@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize("name", ["allgather", "reduce_scatter"])
def test_exact_engine_refuses_a_wrong_decoding(monkeypatch, name, fault):
    """Non-combining directly, reduce-scatter through its dual."""
    real = instance.decode
    monkeypatch.setattr(instance, "decode",
                        lambda *args, **kwargs: _corrupt(real(*args, **kwargs), fault))
    with pytest.raises(SolverError):
        solve_instance(get_topology("ring:4"), standard_collective(name, 4),
                       Instance(steps=3, rounds=3), options=SolveOptions(backend="cpsat"))


@pytest.mark.parametrize("fault", FAULTS)
def test_exact_engine_refuses_a_wrong_combining_schedule(monkeypatch, fault):
    real = combining.solve_combining_cpsat

    def corrupted(*args, **kwargs):
        outcome, algorithm = real(*args, **kwargs)
        return outcome, _corrupt(algorithm, fault)

    monkeypatch.setattr(combining, "solve_combining_cpsat", corrupted)
    with pytest.raises(SolverError):
        solve_instance(get_topology("ring:4"), standard_collective("allreduce", 4),
                       Instance(steps=4, rounds=4, chunks=4), options=SolveOptions(backend="cpsat"))


# -- a satisfiable dual instance whose solver schedule has a dead end ------------------------------


@pytest.mark.parametrize("backend", ["cpsat", "z3", "z3-path"])
def test_reduction_with_a_bystander_is_solved_at_every_step_count(backend):
    """Rank 2 contributes, rank 1 needs the sum, rank 0 does neither. On the reversed topology the
    solver may also copy the chunk to rank 0 (a dead end); read backwards rank 0 would send a
    value it never had. The dead end is dropped and the instance is solved."""
    topology = Topology("bystander", ((0, 1, 0), (0, 0, 0), (1, 1, 0)))
    collective = Collective("custom", 3, (frozenset({2}),), (frozenset({1}),), combining=True)
    for steps in (1, 2):
        result = solve_instance(topology, collective, Instance(steps=steps, rounds=steps),
                                options=SolveOptions(backend=backend))
        assert result.found, result.summary()
        assert result.algorithm.num_steps == steps
        assert [s for step in result.algorithm.steps for s in step.sends] in (
            [Send(0, 2, 1, reduce=True)], [Send(0, 2, 0, reduce=True), Send(0, 0, 1, reduce=True)])
