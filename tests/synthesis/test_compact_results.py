"""Compact tree schedules as results: kept as node 0's template and the node shift, expanded only
when asked, and then an ordinary algorithm the verifier accepts."""

from __future__ import annotations

import json

import pytest

from collsynth.algorithm import find_problems
from collsynth.cli import main
from collsynth.collective import standard_collective
from collsynth.synthesis.bandwidth_optimal import engine, solve_bandwidth_optimal
from collsynth.topology import compose_nodes, get_topology


@pytest.fixture(scope="module")
def system():
    return compose_nodes(get_topology("hub:4"), 3, nic_units=1)


@pytest.mark.parametrize("name", ["allgather", "reduce_scatter", "allreduce"])
def test_a_compact_result_expands_to_a_verified_algorithm(system, name):
    result = solve_bandwidth_optimal(system, standard_collective(name, 12), compact=True)
    assert result.algorithm is None and result.compact is not None
    full = result.expanded()
    assert find_problems(full) == []          # the ordinary verifier, on every send
    assert full.num_sends == result.schedule.num_sends
    assert full.rounds_per_chunk == result.rounds_per_chunk
    assert result.steps == full.num_steps and result.chunks == full.chunks
    assert result.optimal                      # steady state at the bound
    figures = result.to_json()
    assert figures["compact"]["template_sends"] * figures["compact"]["images"] \
        == figures["sends"] == full.num_sends


def test_auto_keeps_composed_systems_above_the_threshold_compact(system, monkeypatch):
    monkeypatch.setattr(engine, "COMPACT_ABOVE_RANKS", 8)
    assert solve_bandwidth_optimal(system, standard_collective("allgather", 12)).compact \
        is not None
    ring = get_topology("ring:12")  # not composed: built in full
    assert solve_bandwidth_optimal(ring, standard_collective("allgather", 12)).compact is None
    assert solve_bandwidth_optimal(system, standard_collective("allgather", 12),
                                   compact=False).compact is None


def test_cli_compact_and_expand(capsys, tmp_path):
    argv = ["solve", "bandwidth-optimal", "hub:4", "allgather", "--nodes", "3", "--nic-units",
            "1", "-q"]
    assert main([*argv, "--compact"]) == 0
    assert "compact schedule:" in capsys.readouterr().out
    assert main([*argv, "--compact", "-o", str(tmp_path / "a.json")]) == 2
    assert "leave out --compact" in capsys.readouterr().err
    assert main([*argv, "--compact", "--expand"]) == 2
    capsys.readouterr()
    assert main([*argv, "--expand", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["compact"] is None


def test_ctrl_c_in_the_column_generation_keeps_the_packing_found(monkeypatch):
    """Ctrl-C while trees are priced ends the search, not the run: the schedule is built from
    the trees found so far (the initial ones here), verified, and no better than the bound."""
    from collsynth.synthesis.bandwidth_optimal import packing

    def interrupted(cost, root):
        raise KeyboardInterrupt

    monkeypatch.setattr(packing, "min_arborescence", interrupted)
    lines = []
    system = compose_nodes(get_topology("ring:4"), 2, nic_units=1)
    result = solve_bandwidth_optimal(system, standard_collective("allgather", 8), stages=2,
                                     progress=lines.append, compact=False)
    assert find_problems(result.algorithm) == []
    assert result.steady_state_rounds_per_chunk >= result.lower_bound
    assert any("interrupted" in line for line in lines)


def test_a_ctrl_c_dropped_in_the_column_generation_still_ends_it(drop_ctrl_c):
    """A Ctrl-C Python dropped in a callback (collsynth.interrupts) ends the column generation
    at its next iteration, as a delivered one does."""
    from collsynth import interrupts

    lines = []

    def progress(line: str) -> None:
        lines.append(line)
        if line.startswith("iteration 1:"):
            drop_ctrl_c()

    system = compose_nodes(get_topology("ring:4"), 2, nic_units=1)
    with interrupts.reliable_sigint():
        result = solve_bandwidth_optimal(system, standard_collective("allgather", 8),
                                         progress=progress, compact=False)
    assert result.stopped_by == "interrupt"
    assert any(line.startswith("interrupted:") for line in lines)
    assert find_problems(result.algorithm) == []
