"""Hostile input, round 7: what the eighth session left open and the ninth session's hunt
found, fixed in the ninth.

Each case failed on the code before its fix.
"""

from __future__ import annotations

import re
import warnings

import pytest

from collsynth.cli.time import _warn_other_machine
from collsynth.errors import InputWarning
from tests.test_inputs_round4 import _constants_file  # a copy of NCCL's defaults, edited


@pytest.mark.parametrize("measured_on, timed, warns", [
    ("a100", "DGX-A100", True),          # a part of a name is another machine
    ("dgx", "DGX-A100", True),
    ("dgx-a100", "DGX-A100", False),     # case, '-' and '_' do not count
    ("DGX_A100", "dgx-a100", False),
    ("dgx-a100", "DGX-A100x2", False),   # the node of a composed machine
    ("dgx-a100", "DGX-A100x16", False),
    ("dgx-a100x2", "DGX-A100", True),    # two nodes' figures on one
    ("mi300x", "MI300Xx4", False),
    ("mi300x", "DGX-A100", True),
])
def test_another_machine_is_told_by_the_whole_name(measured_on, timed, warns):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _warn_other_machine(measured_on, timed, "c.json")
    assert any(issubclass(w.category, InputWarning) for w in caught) == warns


@pytest.mark.parametrize("changes, message", [
    # NCCL's Simple chunk is 4 of the 8 FIFO slots; 16 never fits a connection's buffer.
    ({"chunk_slots": {"Simple": 16}},
     "chunk_slots['Simple'] = 16 is above fifo_slots = 8"),
    ({"fifo_slots": 2}, "chunk_slots['Simple'] = 4 is above fifo_slots = 2"),
    # A slice of 4 slots in a chunk of 2 runs no slice (NCCL: ChunkSteps / SliceSteps = 0).
    ({"slice_slots": {"Simple": 4}, "chunk_slots": {"Simple": 2}},
     "slice_slots['Simple'] = 4 does not divide chunk_slots['Simple'] = 2"),
    ({"slice_slots": {"Simple": 3}}, "slice_slots['Simple'] = 3 does not divide"),
])
def test_runtime_constants_whose_slots_cannot_nest_are_refused(tmp_path, changes, message):
    from collsynth.errors import FileFormatError
    from collsynth.timing.calibration import load_calibration

    path = _constants_file(tmp_path, **changes)
    with pytest.raises(FileFormatError, match=re.escape(message)) as raised:
        load_calibration(path)
    assert str(path) in str(raised.value)


def test_runtime_constants_with_nested_slots_load(tmp_path):
    from collsynth.timing.calibration import load_calibration

    path = _constants_file(tmp_path, chunk_slots={"Simple": 8}, slice_slots={"Simple": 4})
    assert load_calibration(path).constants.chunk_slots["Simple"] == 8


def _slow_fit(monkeypatch):
    import time as time_module

    from collsynth.cli import calibrate as calibrate_cli
    from collsynth.timing import runtime_fit

    real = runtime_fit.fit_runtime
    monkeypatch.setattr(calibrate_cli, "PROGRESS_INTERVAL_S", 0.05)
    monkeypatch.setattr(runtime_fit, "fit_runtime",
                        lambda *a, **k: time_module.sleep(0.3) or real(*a, **k))


def _ring_curve(tmp_path):
    csv = tmp_path / "curve.csv"
    csv.write_text("size_bytes,time_us\n" + "".join(
        f"{1 << k},{10 + (1 << k) / 2e4:.3f}\n" for k in range(10, 24, 2)))
    return csv


@pytest.mark.parametrize("quiet", [[], ["-q"], ["--json"]])
def test_a_program_calibration_says_what_it_fits_while_it_runs_long(tmp_path, monkeypatch,
                                                                   capsys, quiet):
    # A GB200 NVL72 curve (72 ranks) fitted for about 5 minutes without a word.
    from collsynth import cli

    _slow_fit(monkeypatch)
    csv = _ring_curve(tmp_path)
    args = ["calibrate", "--model", "program", str(csv), "--topology", "ring:4,unit_gbps=25",
            "--runtime", "nccl", "--collective", "allgather", "-o", str(tmp_path / "c.json")]
    assert cli.main(args + quiet) == 0
    captured = capsys.readouterr()
    beat = re.search(r"  calibrate: fitting nccl's constants to .*curve.csv on ring:4 "
                     r"\(7 sizes\), 0 s so far", captured.err)
    assert (beat is None) == bool(quiet), captured.err  # --json and -q: a quiet stderr
    assert "so far" not in captured.out


_ONE_RANK = {"format": "collsynth-topology", "version": 1, "name": "one", "links": [[0]],
             "unit_gbps": 25.0, "alpha_us": 0.7,
             "metadata": {"machine": {"arch": "sm90", "intra_class": "nvlink"}}}


@pytest.mark.parametrize("command", [
    ["time", "--topology", "{topo}", "--collective", "allreduce"],
    ["tune-runtime", "--topology", "{topo}", "--runtime", "nccl", "-o", "{out}"],
    ["calibrate", "--model", "program", "{csv}", "--topology", "{topo}", "-o", "{out}",
     "--runtime", "nccl", "--collective", "allreduce"],
])
def test_a_one_rank_machine_is_refused_by_the_runtime_commands(tmp_path, capsys, command):
    # 'internal error: ZeroDivisionError' (NCCL's bus-to-algorithm ratio divides by n - 1).
    import json

    from collsynth import cli

    topo = tmp_path / "one.json"
    topo.write_text(json.dumps(_ONE_RANK))
    csv = _ring_curve(tmp_path)
    out = tmp_path / "out.conf"
    args = [a.format(topo=topo, csv=csv, out=out) for a in command]
    assert cli.main(args) == 1
    err = capsys.readouterr().err
    assert "topology 'one' has 1 rank" in err and "internal error" not in err
    assert not out.exists()


@pytest.mark.parametrize("option", ["--iters", "--warmup"])
def test_run_iterations_beyond_a_million_are_a_usage_error(tmp_path, capsys, option):
    # --iters 10^9 with --timeout 1 ran for days; with a week's timeout gloo's deadline
    # overflowed and every rank failed at once with a bogus 'Timed out waiting 1.2e13 ms'.
    from collsynth import cli

    assert cli.main(["run", str(tmp_path / "a.json"), option, "1000001"]) == 2
    assert f"argument {option}: '1000001': expected a whole number from 0 to 1000000" in \
        capsys.readouterr().err


def test_a_run_never_waits_longer_than_gloo_can_count():
    from collsynth.cli.execute import MAX_ITERATIONS, launch_timeout_s
    from collsynth.cli.common import MAX_SECONDS

    # gloo keeps its deadline in int64 nanoseconds: 9.2e9 s. The longest run allowed, every
    # option at its limit, must stay below it; a default run keeps its own figure:
    # 60 + 60 x (2 x (10 + 2) + 4) = 1740 s.
    longest = launch_timeout_s(MAX_SECONDS, MAX_ITERATIONS, MAX_ITERATIONS)
    assert longest * 1e9 < 2 ** 63 and longest >= MAX_SECONDS
    assert launch_timeout_s(60.0, 10, 2) == 1740.0


@pytest.fixture(scope="module")
def superbench_calibration(tmp_path_factory):
    import json
    from pathlib import Path

    from collsynth import cli

    root = Path(__file__).resolve().parents[1]
    path = tmp_path_factory.mktemp("cal") / "cal.json"
    assert cli.main(["calibrate", str(root / "data/nccl-tests/A100-8gpu_all_reduce_superbench.txt"),
                     "--topology", "dgx-a100", "-o", str(path)]) == 0
    return json.loads(path.read_text())


@pytest.mark.parametrize("field, value, message", [
    # 0 priced a 1 GiB allreduce at 35 us (53,444 GB/s of bus bandwidth), 1e300 printed a
    # 300-digit time, 1e-300 a crossover of hundreds of digits.
    ("beta_us_per_byte", 0, "entries[0].beta_us_per_byte: 0; expected 1e-09 to 1000 us per byte"),
    ("beta_us_per_byte", 1e300, "expected 1e-09 to 1000 us per byte"),
    ("beta_us_per_byte", 1e-300, "expected 1e-09 to 1000 us per byte"),
    ("alpha_us", 0, "entries[0].alpha_us: 0; expected 1e-06 to 3.6e+09 us"),
    ("busbw_gbps", 1e9, "entries[0].busbw_gbps: 1000000000.0; expected 1e-06 to 1e+06 GB/s"),
    # the same figure as beta, said twice: 1.0 GB/s against 133 GB/s
    ("algbw_gbps", 1.0, "entries[0].algbw_gbps: 1.0; expected 1 / beta_us_per_byte = "),
])
def test_curve_figures_outside_what_a_calibration_writes_are_refused(
        tmp_path, superbench_calibration, field, value, message):
    import json

    from collsynth.errors import FileFormatError
    from collsynth.timing.calibration import load_calibration

    data = json.loads(json.dumps(superbench_calibration))
    assert data["entries"][0]["model"] == "alpha-beta"
    data["entries"][0][field] = value
    path = tmp_path / "c.json"
    path.write_text(json.dumps(data))
    with pytest.raises(FileFormatError, match=re.escape(message)) as raised:
        load_calibration(path)
    assert str(path) in str(raised.value)
    path.write_text(json.dumps(superbench_calibration))  # as written: it loads
    assert load_calibration(path).entries[0].alpha_us > 0


def test_a_topology_file_of_thousands_of_groups_is_refused(tmp_path):
    # DGX H100's 16 groups repeated 5000 times (8.6 MB): solve ran past 150 s and 2.8 GB in
    # its bounds' LP, time used over 6 GB. A composed machine has 4 groups per rank.
    import json
    from pathlib import Path

    from collsynth.errors import FileFormatError
    from collsynth.resolve import resolve_topology
    from collsynth.topology.fileformat import load_topology, save_topology

    root = Path(__file__).resolve().parents[1]
    data = json.loads((root / "topologies" / "dgx-h100.json").read_text())
    data["groups"] *= 5000
    path = tmp_path / "many.json"
    path.write_text(json.dumps(data))
    with pytest.raises(FileFormatError, match=r"groups: 80000 bandwidth groups on 8 ranks; "
                                              r"expected at most 128"):
        load_topology(path)
    # the largest built from nodes still reads back: 1024 ranks, 4224 groups
    big = resolve_topology("dgx-h100", nodes=128, fabric="leaf-spine", nodes_per_leaf=2,
                           oversubscription=2)
    save_topology(big, tmp_path / "big.json")
    assert len(load_topology(tmp_path / "big.json").groups) == len(big.groups) == 4224


def test_sigterm_interrupts_like_ctrl_c_and_is_put_back():
    # SIGTERM during 'export -o' left a 1 MB '.one.xml.XXXX.tmp' and printed nothing: the
    # default handler ends the process where it stands, before any cleanup runs. In a child
    # process: on the code before the fix, the signal kills whoever receives it.
    import subprocess
    import sys

    code = """
import os, signal, sys
from collsynth.interrupts import reliable_sigint
if sys.argv[1] == "background":  # a shell script's background job ignores SIGINT
    signal.signal(signal.SIGINT, signal.SIG_IGN)
assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
try:
    with reliable_sigint():
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(10**6):  # the handler runs between two bytecodes
            pass
except KeyboardInterrupt:
    print("interrupted, cleaned up")
assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
"""
    for how in ("foreground", "background"):
        done = subprocess.run([sys.executable, "-c", code, how], capture_output=True,
                              text=True, timeout=60)
        assert (done.returncode, done.stdout.strip()) == (0, "interrupted, cleaned up"), \
            (how, done.stderr)


def test_the_writability_probe_is_removed_when_interrupted(tmp_path, monkeypatch):
    import os

    from collsynth import _output

    real_close = os.close

    def interrupted_close(fd):  # Ctrl-C right after the probe was made
        real_close(fd)
        raise KeyboardInterrupt
    monkeypatch.setattr(_output.os, "close", interrupted_close)
    with pytest.raises(KeyboardInterrupt):
        _output.check_output_file(tmp_path / "out.xml")
    monkeypatch.undo()
    assert [p.name for p in tmp_path.iterdir()] == []


def test_export_reports_the_stages_a_schedule_has_not_the_ones_asked(tmp_path, capsys):
    # --stages 100000 on a schedule of one wave wrote the unchanged program and said
    # "100000 stage(s)".
    from collsynth import cli
    from collsynth.algorithm.fileformat import load_algorithm
    from collsynth.export.coarsen import waves

    algorithm = tmp_path / "ag.json"
    assert cli.main(["solve", "least-steps", "dgx1", "allgather", "-o", str(algorithm),
                     "-q"]) == 0
    have = waves(load_algorithm(algorithm))
    capsys.readouterr()
    assert cli.main(["export", str(algorithm), "-o", str(tmp_path / "a.xml"),
                     "--stages", "100000"]) == 0
    said = capsys.readouterr().out
    assert f"; {have} stage(s)," in said and "100000" not in said
    assert cli.main(["export", str(algorithm), "-o", str(tmp_path / "b.xml")]) == 0
    assert (tmp_path / "a.xml").read_text() == (tmp_path / "b.xml").read_text()


@pytest.mark.parametrize("mode", ["least-steps", "pareto", "bandwidth-optimal"])
def test_a_custom_collective_already_split_is_refused_by_solve(tmp_path, capsys, mode):
    # It was split again: "collective has chunk factor 2 but the instance asks for 1 chunks"
    # (with --chunks 2: "chunk factor 4 ... 2 chunks"), naming neither the file nor the field.
    import json
    from pathlib import Path

    from collsynth import cli

    root = Path(__file__).resolve().parents[1]
    data = json.loads((root / "examples" / "custom_collective_pairs.json").read_text())
    data["chunk_factor"] = 2
    path = tmp_path / "cf2.json"
    path.write_text(json.dumps(data))
    assert cli.main(["solve", mode, "dgx1", str(path)]) == 1
    assert f"{path}: chunk_factor = 2: solve splits a collective into pieces itself" in \
        capsys.readouterr().err


@pytest.mark.parametrize("figures, message", [
    ({"unit_gbps": float("inf")}, "unit_gbps = inf; expected a positive number from 1e-06 up to "
                                  "1e+06 GB/s"),
    ({"unit_gbps": 1e308}, "unit_gbps = 1e+308"),
    ({"alpha_us": float("nan")}, "alpha_us = nan; expected a positive number from 1e-06 up to "
                                 "3.6e+09 us"),
    ({"alpha_us": 1e12}, "alpha_us = 1000000000000.0"),
])
def test_a_topology_built_in_python_keeps_the_file_readers_ranges(figures, message):
    # unit_gbps=inf was accepted, and save_algorithm wrote '"unit_gbps": Infinity', a file
    # load_algorithm and 'collsynth verify' then refused.
    from collsynth.errors import InvalidTopologyError
    from collsynth.topology import Topology

    with pytest.raises(InvalidTopologyError, match=re.escape(message)):
        Topology("x", [[0, 1], [1, 0]], **figures)
    assert Topology("x", [[0, 1], [1, 0]], unit_gbps=1e6, alpha_us=3.6e9).unit_gbps == 1e6


def test_out_of_memory_names_the_address_space_limit_when_it_is_the_smaller():
    # Under 'ulimit -v 4000000' the message said "the memory available on this machine is
    # 20.8 GB (raise --memory-limit ...)": raising it would not have helped. In a child
    # process: the limit stays there.
    import subprocess
    import sys

    code = """
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (3 * 2**30, resource.RLIM_INFINITY))
from collsynth.cli import _out_of_memory
sys.exit(_out_of_memory())
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 1
    assert done.stderr.strip() == ("collsynth: error: out of memory: the process's "
                                   "address-space limit (ulimit -v) is 3.2 GB (raise it or ask "
                                   "for less)")


@pytest.mark.parametrize("name", [None, 5])
def test_get_topology_of_something_not_a_name_says_so(name):
    # AttributeError: 'NoneType' object has no attribute 'strip', deep in builtins.py
    from collsynth.errors import WrongTypeError
    from collsynth.topology import get_topology

    with pytest.raises(WrongTypeError, match=rf"get_topology: name: expected str, got "):
        get_topology(name)


@pytest.mark.parametrize("max_steps", [0, -1, 2.5, True])
def test_least_steps_refuses_a_step_limit_below_one(max_steps):
    # 0 and -1 returned UNSAT 'at Instance(steps=1)', as if a search had run.
    from collsynth.collective import allgather
    from collsynth.errors import InvalidInstanceError
    from collsynth.synthesis import solve_least_steps
    from collsynth.topology import get_topology

    with pytest.raises((InvalidInstanceError, TypeError), match=r"max_steps"):
        solve_least_steps(get_topology("ring:4"), allgather(4), max_steps=max_steps)
    assert solve_least_steps(get_topology("ring:4"), allgather(4), max_steps=3).found


def test_library_entry_points_say_which_argument_has_the_wrong_type():
    # AttributeError deep inside ('str' object has no attribute 'num_ranks'), for each.
    from collsynth.algorithm import verify
    from collsynth.algorithm.fileformat import save_algorithm
    from collsynth.algorithm.show import format_algorithm
    from collsynth.bounds import compute_bounds
    from collsynth.bounds.throughput import optimal_throughput
    from collsynth.collective import allgather
    from collsynth.errors import WrongTypeError
    from collsynth.synthesis.large import solve_large
    from collsynth.topology import get_topology
    from collsynth.topology.compose import compose_nodes

    ring, coll = get_topology("ring:4"), allgather(4)
    for call, message in (
            (lambda: compute_bounds(None, coll), "compute_bounds: topology: expected Topology, "
                                                 "got NoneType None"),
            (lambda: compute_bounds(ring, "allgather"), "compute_bounds: collective: expected "
                                                        "Collective, got str 'allgather'"),
            (lambda: optimal_throughput("dgx1", coll), "optimal_throughput: topology"),
            (lambda: solve_large("dgx1", "allgather"), "solve_large: topology"),
            (lambda: verify("x"), "verify: algorithm: expected Algorithm, got str 'x'"),
            (lambda: save_algorithm("x", "a.json"), "save_algorithm: algorithm"),
            (lambda: format_algorithm(3), "format_algorithm: algorithm: expected Algorithm, "
                                          "got int 3"),
            (lambda: compose_nodes(None, 2), "compose_nodes: node")):
        with pytest.raises(WrongTypeError, match=re.escape(message)):
            call()
    with pytest.raises(TypeError):  # still a TypeError for callers that catch that
        verify(None)


def test_a_program_calibration_keeps_the_best_found_at_its_time_limit(tmp_path, capsys):
    # GB200 NVL72 fitted for about 5 minutes with no way to bound it but Ctrl-C, which lost
    # everything. At the limit the best point evaluated is kept, said, and written.
    import json
    from pathlib import Path

    from collsynth import cli

    log = Path(__file__).resolve().parents[1] / "data/nccl-tests/A100-8gpu_all_reduce_superbench.txt"
    out = tmp_path / "c.json"
    args = ["calibrate", "--model", "program", str(log), "--topology", "dgx-a100", "-o", str(out),
            "--time-limit", "0.5", "-q", "--json"]
    assert cli.main(args) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["held_out_gmae"] is None
    [warning] = [w for w in summary["warnings"] if "time limit" in w]
    assert warning.startswith("time limit of 0.5 s reached: the best constants of ")
    assert json.loads(out.read_text())["kind"] == "runtime-constants"
    assert cli.main(args + ["--strict"]) == 1  # a search cut short is a warning
    capsys.readouterr()
    assert cli.main(["calibrate", str(log), "--topology", "dgx-a100", "-o", str(out),
                     "--time-limit", "1"]) == 2  # the curve model fits in milliseconds


def test_ctrl_c_during_a_program_calibration_keeps_the_best_found(tmp_path, capsys, monkeypatch):
    # Ctrl-C lost a fit of minutes. Now the best point evaluated is written and the exit is 4
    # (a search interrupted), as solve's is. The 150th price of the fit is interrupted.
    import json
    from pathlib import Path

    from collsynth import cli
    from collsynth.timing import program_model

    real = program_model.ProgramModel.price
    calls = [0]

    def price(self, *args, **kwargs):
        calls[0] += 1
        if calls[0] == 150:
            raise KeyboardInterrupt
        return real(self, *args, **kwargs)
    monkeypatch.setattr(program_model.ProgramModel, "price", price)
    log = Path(__file__).resolve().parents[1] / "data/nccl-tests/A100-8gpu_all_reduce_superbench.txt"
    out = tmp_path / "c.json"
    assert cli.main(["calibrate", "--model", "program", str(log), "--topology", "dgx-a100",
                     "-o", str(out), "-q", "--json"]) == 4
    summary = json.loads(capsys.readouterr().out)
    assert any(w.startswith("interrupted (Ctrl-C): the best constants of ")
               for w in summary["warnings"])
    assert summary["held_out_gmae"] is None and out.exists()


@pytest.mark.parametrize("pre, post, role", [([], False, "postcondition = False"),
                                             ("ab", "cd", "precondition = 'ab'"),
                                             ([1, 2], [{0}, {1}], "precondition = (1, 2)")])
def test_a_collective_of_conditions_that_are_not_rank_sets_says_so(pre, post, role):
    # TypeError: 'bool' object is not iterable
    from collsynth.collective.model import Collective
    from collsynth.errors import InvalidCollectiveError

    with pytest.raises(InvalidCollectiveError, match=re.escape(f"collective 'x': {role}; "
                                                               "expected one set of ranks")):
        Collective("x", 2, pre, post)
    # a generator of rank sets is fine (read once)
    assert Collective("x", 2, iter([{0}, {1}]), [{0, 1}, {0, 1}]).num_chunks == 2


@pytest.mark.parametrize("before_end", [30, 2])
def test_ctrl_c_during_the_held_out_fit_keeps_the_full_fit_and_says_so(monkeypatch, before_end):
    # Ctrl-C there was swallowed: a held-out GMAE of a fit cut after one evaluation was
    # written and the command exited 0. The held-out fit (on every other size) comes last:
    # 30 prices before the end is in its search, 2 before in its scoring of the other sizes.
    from collsynth.timing import program_model
    from collsynth.timing.runtime_fit import fit_runtime
    from collsynth.topology import get_topology

    rows = [(1 << k, 10 + (1 << k) / 2e4) for k in range(10, 26, 2)]
    real = program_model.ProgramModel.price
    calls, stop_at = [0], [None]

    def price(self, *args, **kwargs):
        calls[0] += 1
        if calls[0] == stop_at[0]:
            raise KeyboardInterrupt
        return real(self, *args, **kwargs)
    monkeypatch.setattr(program_model.ProgramModel, "price", price)
    whole = fit_runtime(rows, get_topology("dgx-a100"), "allreduce", runtime="nccl")
    stop_at[0], calls[0] = calls[0] - before_end, 0
    cut = fit_runtime(rows, get_topology("dgx-a100"), "allreduce", runtime="nccl")
    assert cut.interrupted and cut.held_out_gmae is None
    assert cut.stopped.startswith("interrupted (Ctrl-C) during the held-out fit")
    assert cut.parameters == whole.parameters and cut.gmae == whole.gmae


def test_a_time_limit_goes_with_the_fit_of_the_runtimes_choices(tmp_path, capsys):
    from collsynth import cli

    csv = _ring_curve(tmp_path)
    assert cli.main(["calibrate", "--model", "program", str(csv), "--topology", "dgx-a100",
                     "--channels", "2", "--time-limit", "5", "-o", str(tmp_path / "c.json")]) == 2
    assert "--time-limit bounds the fit of the runtime's own choices" in capsys.readouterr().err
    assert not (tmp_path / "c.json").exists()


def test_a_library_caller_pricing_one_rank_gets_the_same_refusal(tmp_path):
    # Past the CLI's guard: RuntimeAlgorithm, runtime_algorithms and fit_runtime divided by
    # the ranks less one (ZeroDivisionError in NCCL's bus-to-algorithm ratio).
    import json

    from collsynth.errors import InvalidTopologyError
    from collsynth.runtimes import get_runtime
    from collsynth.timing.pricing import RuntimeAlgorithm, runtime_algorithms
    from collsynth.timing.runtime_fit import fit_runtime
    from collsynth.topology.fileformat import load_topology

    path = tmp_path / "one.json"
    path.write_text(json.dumps(_ONE_RANK))
    one, nccl = load_topology(path), get_runtime("nccl")
    for call in (lambda: RuntimeAlgorithm(nccl, "ring", "allreduce", one),
                 lambda: runtime_algorithms(nccl, "allreduce", one),
                 lambda: fit_runtime([(1024, 10.0), (2048, 11.0)], one, "allreduce",
                                     runtime="nccl")):
        with pytest.raises(InvalidTopologyError, match="topology 'one' has 1 rank"):
            call()


@pytest.mark.parametrize("name", [".png", ".svg", "x.gif"])
def test_draw_to_a_name_without_a_figure_suffix_is_a_usage_error(tmp_path, capsys, name):
    # '-o .png' (a hidden file with no suffix) exited 1 after reading the algorithm, where
    # '-o x.txt' was a usage error (exit 2) before any work.
    from collsynth import cli

    algorithm = tmp_path / "ag.json"
    assert cli.main(["solve", "least-steps", "ring:4", "allgather", "-o", str(algorithm),
                     "-q"]) == 0
    capsys.readouterr()
    assert cli.main(["draw", str(algorithm), "-o", str(tmp_path / name)]) == 2
    assert "expected a .png or .svg file" in capsys.readouterr().err
    assert not (tmp_path / name).exists()
