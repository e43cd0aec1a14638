"""Hostile input, round 8: what the tenth session's hunt found, fixed in the tenth.

Each case failed on the code before its fix (a wrong result written without a word, or an
internal error).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from collsynth import cli
from collsynth.errors import FileFormatError
from collsynth.timing.logs import load_log

ROOT = Path(__file__).resolve().parents[1]
ALLGATHER_LOG = ROOT / "tests" / "fixtures" / "logs" / "nccl_tests_srun_allgather.txt"


# -- one log, two nccl-tests runs --------------------------------------------------------------


def test_a_log_of_two_collectives_is_refused(tmp_path, capsys):
    """Two runs appended to one file (``all_gather_perf ... > log; all_reduce_perf ... >> log``)
    were read as one curve of the last header's collective, the allgather rows included."""
    text = ALLGATHER_LOG.read_text()
    path = tmp_path / "both.txt"
    path.write_text(text + text.replace("all_gather_perf", "all_reduce_perf"))
    second = len(text.splitlines()) + 3  # the second run's "Collective test starting" line
    with pytest.raises(FileFormatError, match=rf"line {second}: a test of 'all_reduce_perf' "
                                              r"after one of 'all_gather_perf' \(line 3\); a "
                                              "log measures one collective"):
        load_log(path)
    assert cli.main(["calibrate", str(path), "--topology", "ring:4,unit_gbps=25,alpha_us=1",
                     "-o", str(tmp_path / "c.json")]) == cli.EXIT_ERROR
    assert "split the file" in capsys.readouterr().err
    assert not (tmp_path / "c.json").exists()


def test_a_log_of_two_rank_counts_is_refused(tmp_path):
    """A 4-rank run of small sizes and an 8-rank run of large ones in one file were read as
    one 8-rank curve."""
    text = ALLGATHER_LOG.read_text()
    eight = text.replace("0: #  Rank  3 Group  0 Pid  41024 on   node-a01 device  3 [0000:13:00] "
                         "NVIDIA A10",
                         "\n".join(f"0: #  Rank  {r} Group  0 Pid  4102{r} on   node-a01 device  "
                                   f"{r} [0000:13:00] NVIDIA A10" for r in range(3, 8)))
    assert eight != text
    path = tmp_path / "two_counts_all_gather.txt"
    path.write_text(text + eight)
    second = len(text.splitlines()) + 3
    with pytest.raises(FileFormatError, match=rf"line {second}: a run on 8 ranks after one on 4 "
                                              r"\(line 3\); a log measures one rank count"):
        load_log(path)
    path.write_text(text + text)  # the same run twice is one curve, its repeats agreeing
    log = load_log(path)
    assert (log.collective, log.ranks) == ("allgather", 4)
    # Older nccl-tests print no "Collective test starting" line: each run's "# nThread" header
    # begins it (line 3 of the second run once the starting lines are gone).
    old_style = [line for line in (text + eight).splitlines()
                 if "Collective test starting" not in line]
    path.write_text("\n".join(old_style) + "\n")
    with pytest.raises(FileFormatError, match=rf"line {second - 1}: a run on 8 ranks after one "
                                              r"on 4 \(line 1\); a log measures one rank count"):
        load_log(path)


# -- export --min-bytes / --max-bytes beyond what the runtimes read -----------------------------


@pytest.fixture(scope="module")
def ring_allgather(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("alg") / "ag.json"
    assert cli.main(["solve", "instance", "ring:4", "allgather", "--steps", "2", "--rounds", "2",
                     "-o", str(path), "-q"]) == cli.EXIT_OK
    return path


@pytest.mark.parametrize("runtime, option, value, message", [
    # msccl writes maxBytes = B + 1 (it compares nBytes < maxBytes)
    ("msccl", "--max-bytes", str((1 << 63) - 1),
     "max_bytes = 9223372036854775807 is above 9223372036854775806, the most msccl's XML reader "
     "takes (a signed 64-bit number); leave it out for no upper bound"),
    ("rccl", "--max-bytes", str(1 << 64),
     "max_bytes = 18446744073709551616 is above 9223372036854775807, the most rccl's"),
    ("msccl-executor", "--min-bytes", "9" * 23,
     f"min_bytes = {'9' * 23} is above 9223372036854775807, the most msccl-executor's"),
])
def test_export_byte_bounds_beyond_64_bits_name_the_option(ring_allgather, tmp_path, capsys,
                                                           runtime, option, value, message):
    """Before: the XML was built and refused by its own reader check ('the msccl XML text
    fails the reader's rules: line 1: lexical: <algo> maxBytes=...')."""
    out = tmp_path / "ag.xml"
    assert cli.main(["export", str(ring_allgather), "--runtime", runtime, option, value,
                     "-o", str(out)]) == cli.EXIT_ERROR
    err = capsys.readouterr().err
    assert message in err and "lexical" not in err
    assert not out.exists()


def test_export_takes_the_largest_byte_bound_the_runtime_reads(ring_allgather, tmp_path):
    out = tmp_path / "ag.xml"
    assert cli.main(["export", str(ring_allgather), "--runtime", "msccl", "--max-bytes",
                     str((1 << 63) - 2), "-o", str(out)]) == cli.EXIT_OK
    assert 'maxBytes="9223372036854775807"' in out.read_text()


# -- bench --iters / --warmup --------------------------------------------------------------------


@pytest.mark.parametrize("option, value, low", [("--iters", "99999999999999999999", 1),
                                                ("--warmup", "1000001", 0)])
def test_bench_iterations_beyond_a_million_are_a_usage_error(ring_allgather, tmp_path, capsys,
                                                            option, value, low):
    """Before: written into the scripts as nccl-tests' ``-n 99999999999999999999``, which it
    reads into an int (and a million calls of each size up to 1 GiB take hours)."""
    out = tmp_path / "bench"
    assert cli.main(["bench", str(ring_allgather), "--ranks", "4", "--runtime", "msccl",
                     "--dry-run", "-o", str(out), option, value]) == cli.EXIT_USAGE
    assert f"argument {option}: '{value}': expected a whole number from {low} to 1000000" in \
        capsys.readouterr().err
    assert not out.exists()


def test_bench_options_bound_the_iterations_for_library_callers():
    from collsynth.plan.bench import BenchError, BenchOptions

    with pytest.raises(BenchError, match=r"bench warmup = -1: expected a whole number from 0 "
                                         "to 1000000"):
        BenchOptions(runtime="msccl", ranks=4, warmup=-1)
    with pytest.raises(BenchError, match=r"bench iters = 1000001: expected a whole number from 1"):
        BenchOptions(runtime="msccl", ranks=4, iters=10**6 + 1)
    assert BenchOptions(runtime="msccl", ranks=4, iters=10**6, warmup=0).iters == 10**6


# -- the synthesis entry points given the wrong types -------------------------------------------


def test_the_synthesis_entry_points_say_which_argument_has_the_wrong_type():
    """Round 7 did this for compute_bounds, verify and others; the solvers themselves still
    gave AttributeError ('str' object has no attribute 'num_ranks') from deep inside."""
    import math

    from collsynth import (Instance, pareto_front, solve_bandwidth_optimal, solve_instance,
                           solve_least_steps)
    from collsynth.algorithm.verify import find_problems
    from collsynth.collective import allgather
    from collsynth.errors import InvalidInstanceError, WrongTypeError
    from collsynth.topology import get_topology

    ring, coll = get_topology("ring:4"), allgather(4)
    for call, message in (
            (lambda: solve_instance("ring:4", coll, Instance(2, 2, 1)),
             "solve_instance: topology: expected Topology, got str 'ring:4'"),
            (lambda: solve_instance(ring, coll, (2, 2, 1)),
             "solve_instance: instance: expected Instance, got tuple (2, 2, 1)"),
            (lambda: solve_least_steps(ring, "allgather"),
             "solve_least_steps: collective: expected Collective, got str 'allgather'"),
            (lambda: solve_least_steps(ring, coll, options=3),
             "solve_least_steps: options: expected SolveOptions, got int 3"),
            (lambda: pareto_front(ring, None),
             "pareto_front: collective: expected Collective, got NoneType None"),
            (lambda: solve_bandwidth_optimal("ring:4", coll),
             "solve_bandwidth_optimal: topology: expected Topology, got str 'ring:4'"),
            (lambda: find_problems("x"), "find_problems: algorithm: expected Algorithm")):
        with pytest.raises(WrongTypeError, match=re.escape(message)):
            call()
    for limit in ("60", math.nan):  # a TypeError from '+', a nan deadline that ends at once
        with pytest.raises(InvalidInstanceError, match=rf"time_limit = {limit!r}; expected "
                                                       r"a number of seconds"):
            solve_bandwidth_optimal(ring, coll, time_limit=limit)


# -- nvidia-smi topo -m: two matrices in one file -----------------------------------------------


def test_an_nvidia_smi_file_of_two_machines_is_refused(tmp_path, capsys):
    """``for h in a b; do ssh $h nvidia-smi topo -m; done > topo.txt``: the first matrix was read
    and the second ignored without a word (rocm-smi's reader already refuses a second table)."""
    folder = ROOT / "data" / "machine-topologies" / "nvidia_smi"
    dgx1 = (folder / "dgx1_v100_msccl_tools.txt").read_text()
    four = (folder / "princeton_traverse_ac922_4xV100_NV3.txt").read_text()
    path = tmp_path / "two_hosts.txt"
    path.write_text(four + dgx1)
    second = len(four.splitlines()) + 2  # the dgx1 file's header is its line 2
    assert cli.main(["bounds", str(path), "allgather"]) == cli.EXIT_ERROR
    assert f"two_hosts.txt: line {second}: a second matrix (the first's header is line 2); a " \
           "file describes one machine: keep one" in capsys.readouterr().err


@pytest.mark.parametrize("edit, message", [
    (("--collective all_reduce", "--collective all_gather"),
     "line 32: 'all_gather' after 'all_reduce' (line 1); a log measures one collective"),
    (("'world_size': 8", "'world_size': 4"),
     "line 33: world_size 4 after 8 (line 2); a log measures one rank count"),
])
def test_a_param_log_of_two_runs_that_differ_is_refused(tmp_path, edit, message):
    """PARAM's comms.py output, a second run appended: its rows were read as the first run's
    collective (or the first world_size's ranks)."""
    text = (ROOT / "tests" / "fixtures" / "logs" / "param_comms_tabs.txt").read_text()
    assert len(text.splitlines()) == 31 and edit[0] in text
    path = tmp_path / "param_twice.txt"
    path.write_text(text + text.replace(*edit))
    with pytest.raises(FileFormatError, match=re.escape(message)):
        load_log(path)
    path.write_text(text + text)  # the same run twice: one curve
    assert load_log(path).ranks == 8


# -- calibrate -o and --plot naming one file ------------------------------------------------------


@pytest.mark.parametrize("plot", ["same.svg", "./same.svg"])
def test_calibrate_refuses_one_file_for_the_calibration_and_the_plot(tmp_path, capsys,
                                                                      monkeypatch, plot):
    """Before: 'wrote same.svg and same.svg', exit 0: the figure replaced the calibration."""
    monkeypatch.chdir(tmp_path)
    assert cli.main(["calibrate", str(ALLGATHER_LOG), "--topology",
                     "ring:4,unit_gbps=25,alpha_us=1", "-o", "same.svg", "--plot", plot,
                     "-q"]) == cli.EXIT_ERROR
    assert f"--plot {plot}: is also -o same.svg; one would replace the other (choose two " \
           "names)" in capsys.readouterr().err
    assert not (tmp_path / "same.svg").exists()


# -- plan --cache inside -o -------------------------------------------------------------------------


@pytest.mark.parametrize("cache", ["plan", "plan/cache"])
def test_plan_refuses_a_cache_in_the_plan_folder(tmp_path, capsys, cache):
    """Before: the fronts were synthesized and cached into the new plan folder, and then the
    plan refused to write there ('exists, is not empty and holds no plan manifest'), exit 1
    after all the work, the folder left behind."""
    trace = ROOT / "tests" / "fixtures" / "traces" / "dgx1-dp"
    assert cli.main(["plan", str(trace), "--topology", "dgx1", "-o", str(tmp_path / "plan"),
                     "--cache", str(tmp_path / cache), "-q"]) == cli.EXIT_USAGE
    assert f"--cache {tmp_path / cache} is in -o {tmp_path / 'plan'}, which the plan " \
           "replaces; keep the cache elsewhere" in capsys.readouterr().err
    assert not (tmp_path / "plan").exists()


# -- an MSCCL++ plan given where an algorithm file goes ------------------------------------------


@pytest.mark.parametrize("command", [["show"], ["time"], ["draw", "-o", "{tmp}/x.png"],
                                     ["export", "--runtime", "msccl", "-o", "{tmp}/x.xml"]])
def test_an_mscclpp_plan_given_for_an_algorithm_file_is_named(ring_allgather, tmp_path, capsys,
                                                              command):
    """``export --runtime mscclpp`` writes .json plans; given to show, time, draw or export
    they were refused as "missing field 'format'; expected 'collsynth-algorithm'"."""
    plan = tmp_path / "plan.json"
    assert cli.main(["export", str(ring_allgather), "--runtime", "mscclpp", "-o",
                     str(plan)]) == cli.EXIT_OK
    capsys.readouterr()
    argv = [command[0], str(plan)] + [a.replace("{tmp}", str(tmp_path)) for a in command[1:]]
    assert cli.main(argv) == cli.EXIT_ERROR
    assert "plan.json: an MSCCL++ execution plan (it has 'gpus' and no 'format'), not an " \
           "algorithm file; 'collsynth check --runtime mscclpp' reads plans" in \
           capsys.readouterr().err


# -- draw --aggregate -----------------------------------------------------------------------------


def test_draw_aggregate_is_a_heat_map_or_a_usage_error(ring_allgather, tmp_path, capsys,
                                                       monkeypatch):
    """Before: on a small schedule (arrows), --aggregate was ignored without a word, with
    --style arrows too."""
    out = tmp_path / "x.png"
    assert cli.main(["draw", str(ring_allgather), "-o", str(out), "--aggregate", "--style",
                     "arrows"]) == cli.EXIT_USAGE
    assert "--aggregate sums heat maps; it does not go with --style arrows" in \
        capsys.readouterr().err
    assert not out.exists()
    from collsynth import draw as draw_module

    seen = []
    real = draw_module._draw
    monkeypatch.setattr(draw_module, "_draw",
                        lambda topology, traffic, options, *rest: seen.append(options) or
                        real(topology, traffic, options, *rest))
    assert cli.main(["draw", str(ring_allgather), "-o", str(out), "--aggregate"]) == cli.EXIT_OK
    assert (seen[0].style, seen[0].aggregate) == ("heatmap", True)


# -- the exact engine's size, before the solver: steps and split chunks ------------------------


def test_an_exact_instance_of_too_many_steps_is_refused_before_the_solver(tmp_path, capsys,
                                                                          monkeypatch):
    """``solve instance ring:4 allgather --steps 100000 --rounds 100000`` passed the size check
    (1.6M sends of the 12M allowed) and the solver then took over 10 GB; 20000 steps took 77 s
    and 4.3 GB. The exact encoding takes at most 1024 steps, refused before any encoding."""
    from collsynth.algorithm import Instance
    from collsynth.collective import allgather
    from collsynth.errors import InputTooLargeError
    from collsynth.synthesis import instance as exact
    from collsynth.synthesis import solve_instance
    from collsynth.topology import get_topology

    def no_build(*_args, **_kwargs):
        raise AssertionError("the encoding was built")

    monkeypatch.setattr(exact, "build_problem", no_build)
    out = tmp_path / "a.json"
    assert cli.main(["solve", "instance", "ring:4", "allgather", "--steps", "100000",
                     "--rounds", "100000", "-o", str(out)]) == cli.EXIT_ERROR
    assert "100000 steps: the exact encoding takes at most 1024" in capsys.readouterr().err
    assert not out.exists()
    ring4 = get_topology("ring:4")
    with pytest.raises(InputTooLargeError, match="1025 steps"):
        solve_instance(ring4, allgather(4), Instance(steps=1025))


def test_a_split_too_large_is_refused_before_the_split(monkeypatch):
    """``solve instance ... --chunks 1000000`` was refused as too large only after the
    collective had been split into a million pieces per chunk (6 s)."""
    from collsynth.algorithm import Instance
    from collsynth.collective import Collective, allgather
    from collsynth.errors import InputTooLargeError
    from collsynth.synthesis import solve_instance
    from collsynth.topology import get_topology

    def no_split(*_args, **_kwargs):
        raise AssertionError("the collective was split")

    monkeypatch.setattr(Collective, "split", no_split)
    # 4 chunks x 1e6 pieces x 4 ranks x 1 step = 1.6e7 sends, above the 1.2e7 built
    with pytest.raises(InputTooLargeError, match="in 1000000 pieces per chunk"):
        solve_instance(get_topology("ring:4"), allgather(4), Instance(steps=1, chunks=10**6))


def test_the_sweeps_stop_at_the_exact_step_cap(monkeypatch):
    """solve_least_steps stops at the exact engine's most steps with a reason, rather than
    raising mid-sweep when its own limit is above it (review; pareto_front's sweep stops there
    too). The cap is set to 3 here, and every instance the search tries is made UNSAT."""
    from collsynth.collective import allgather
    from collsynth.encoding.backend import Status
    from collsynth.synthesis import strategies
    from collsynth.synthesis.result import SynthesisResult
    from collsynth.synthesis.strategies import solve_least_steps
    from collsynth.topology import get_topology

    ring4 = get_topology("ring:4")
    monkeypatch.setattr(strategies, "MAX_EXACT_STEPS", 3)
    tried = []

    def unsat(topology, collective, instance, *args, **kwargs):
        tried.append(instance.steps)
        return SynthesisResult(instance, Status.UNSAT, None, 0.0, "test", "")

    with monkeypatch.context() as m:
        m.setattr(strategies, "solve_checked", unsat)
        result = solve_least_steps(ring4, allgather(4))
    assert tried == [2, 3] and result.status is Status.UNSAT
    assert result.detail == "no algorithm up to 3 steps, the exact engine's most"
