"""Shared pytest configuration for the collsynth test suite."""

from __future__ import annotations

import pytest

#: Tests that take seconds each on the 2-core CI machine (found with ``--durations``), skipped
#: by the quick subset ``pytest -m "not slow and not notebook"``; the whole suite runs them. An
#: entry is a test's node id, or a prefix of its parametrized ids ending in ``[`` or ``-``.
#: Kept here, not as decorators, so that one list says what the quick subset leaves out.
SLOW = (
    "collsynth/__init__.py::collsynth",  # the DGX-1 allgather front (tests/test_cli.py has it)
    "tests/export/test_check.py::test_rccl_rings_on_msccl_executor[",
    "tests/export/test_limits.py::test_channels_auto_spreads_a_large_tree_schedule_until_it_fits",
    "tests/export/test_scale.py::test_a_mid_size_algorithm_exports_checks_and_rereads[hier64-",
    "tests/export/test_xml_reader.py::test_shared_files_have_no_lexical_problems",
    "tests/plan/test_plan.py::test_a_multi_node_trace_is_planned_with_the_tree_engine",
    "tests/executor/test_executor.py::test_matches_torch[n4-",  # 2 ranks stay quick
    "tests/executor/test_executor.py::test_matches_torch[n8-",
    "tests/executor/test_executor.py::test_a_wrong_program_is_caught[4]",
    "tests/executor/test_executor.py::test_the_algorithms_are_multi_step_and_multi_chunk[8]",
    "tests/executor/test_executor.py::test_a_wrong_program_is_caught[8]",
    "tests/executor/test_executor.py::test_avg_on_integers_is_refused_by_every_rank[8]",
    "tests/executor/test_launch.py::test_a_rank_that_hangs_makes_its_peers_time_out_naming_rank_and_step",
    "tests/executor/test_launch.py::test_spawned_processes_run_a_library_function",
    "tests/executor/test_launch.py::test_the_whole_launch_has_a_deadline",
    "tests/synthesis/test_bandwidth_optimal.py::test_engines_agree_where_the_exact_engine_runs",
    "tests/synthesis/test_bandwidth_optimal.py::test_random_systems_always_verify_and_never_beat_the_bound",
    "tests/synthesis/test_bandwidth_optimal.py::test_rooted_collectives_verify_and_respect_the_bound[",
    "tests/synthesis/test_interrupt.py::test_sigint_to_the_cli_during_a_cpsat_sweep_writes_what_was_found",
    "tests/synthesis/test_standard_cases.py::test_a_timeout_at_a_step_count_whose_point_meets_the_bound_leaves_the_front_complete",
    "tests/synthesis/test_standard_cases.py::test_dgx1_allgather_front_matches_msccl_tools",
    "tests/test_cli.py::test_python_dash_m_help",
    "tests/test_hostile_inputs.py::test_topology_json",
    "tests/test_notebook_execute.py::test_execute_saves_outputs_and_keeps_failing_notebooks",
    "tests/test_packaging.py::test_a_non_editable_install_finds_the_builtin_topologies",
    "tests/timing/test_fit.py::test_plot_png_and_svg",
    # issue 21's targets and the plausible-range property: each fit simulates the runtime's
    # own algorithm at every measured size some hundred times (10-40 s a log)
    "tests/timing/test_calibration_targets.py::test_a100_allreduce_predicts_allgather_and_reduce_scatter[",
    "tests/timing/test_calibration_targets.py::test_a100_one_node_predicts_two_nodes",
    "tests/timing/test_calibration_targets.py::test_a100_one_node_predicts_p4de_two_nodes_at_large_sizes",
    "tests/timing/test_calibration_targets.py::test_h100_allreduce_in_sample_with_nvls",
    "tests/timing/test_calibration_targets.py::test_no_calibration_returns_an_implausible_constant[",
    "tests/timing/test_calibration_targets.py::test_the_hopper_nvls_port_default_is_within_3_percent_of_each_public_fit[",
    "tests/timing/test_calibration_targets.py::test_hopper_nvls_without_a_calibration_is_priced_within_5_percent_at_large_sizes",
    "tests/timing/test_host_work.py::test_a_fit_finds_the_planted_host_work_again",
    "tests/timing/test_runtime_model.py::test_cli_time_allreduce_lists_the_runtime_ring_and_tree",
    "tests/timing/test_runtime_model.py::test_mi250_rccl_ring_held_out_error",
    "tests/timing/test_runtime_tree.py::test_baseline_rows_price_the_tree_on_a_composed_system",
    "tests/topology/test_sparse.py::test_allreduce_at_32768_gpus",
    "tests/topology/test_sparse.py::test_allreduce_cut_is_measured_exactly_however_the_system_is_stored",
    "tests/topology/test_sparse.py::test_sparse_bounds_equal_dense_bounds[",
    "tests/topology/test_sparse.py::test_steps_through_another_node",
    "tests/topology/test_systems.py::test_bounds_match_hand_counts[gb200-nvl72-None-allgather-1-rounds2]",
)


def pytest_configure(config) -> None:
    # Registered here because pyproject.toml is not the tests' to edit; deselect with
    # `pytest -m "not notebook"`.
    config.addinivalue_line(
        "markers", "notebook: executes a notebook in notebooks/ in a fresh kernel (slow)")
    config.addinivalue_line(
        "markers", "slow: takes seconds; the quick subset `pytest -m \"not slow and not "
                   "notebook\"` skips it")


def _is_slow(node_id: str) -> str | None:
    for entry in SLOW:
        if node_id == entry or (entry.endswith(("[", "-")) and node_id.startswith(entry)):
            return entry
    return None


@pytest.hookimpl(tryfirst=True)  # before -m and -k deselect anything
def pytest_collection_modifyitems(config, items) -> None:
    used = set()
    for item in items:
        entry = _is_slow(item.nodeid)
        if entry is not None:
            item.add_marker(pytest.mark.slow)
            used.add(entry)
    # A listed test that is gone (renamed, moved) would silently run in the quick subset again:
    # when whole files were collected, every entry of those files must have matched.
    if any("::" in arg for arg in config.args):
        return
    files = {item.nodeid.split("::")[0] for item in items}
    stale = [entry for entry in SLOW if entry not in used and entry.split("::")[0] in files]
    if stale:
        raise pytest.UsageError(f"tests/conftest.py SLOW names tests that do not exist: {stale}")


class _DropsCtrlC:
    """Ctrl-C pressed while a garbage-collection callback runs (here ``__del__``): Python raises
    the KeyboardInterrupt inside it, prints "Exception ignored" and drops it."""

    def __del__(self) -> None:
        import signal

        signal.raise_signal(signal.SIGINT)
        for _ in range(100):  # bytecodes, at which the handler runs: still inside __del__
            pass


@pytest.fixture
def drop_ctrl_c(ctrl_c_reaches_python):
    """A function that presses Ctrl-C where Python drops it (see _DropsCtrlC)."""
    return _DropsCtrlC


@pytest.fixture
def ctrl_c_reaches_python():
    """SIGINT handled by Python (``KeyboardInterrupt``) for the test, as at a terminal, whatever
    the runner inherited: a shell starting a command in the background (``cmd &``) has it
    ignore SIGINT, and then ``_thread.interrupt_main()`` does nothing and a child process
    ignores a real SIGINT too. Restored afterwards."""
    import signal

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)



@pytest.fixture
def ring_allgather_path(tmp_path):
    """A least-steps ring:4 allgather written by ``collsynth solve``: the algorithm file the
    hostile-input tests feed to other commands."""
    from collsynth import cli

    path = tmp_path / "ag.json"
    assert cli.main(["solve", "least-steps", "ring:4", "allgather", "-o", str(path),
                     "-q"]) == cli.EXIT_OK
    return path
