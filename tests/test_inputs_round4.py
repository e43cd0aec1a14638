"""Hostile input, round 4: what a hunt through the newest options found.

Each case failed on the code before its fix: measured times of 1e-310 us raised
``OverflowError`` / ``ZeroDivisionError`` (an internal error), and 1e-300 us gave a calibration
of 10^305 GB/s; ``calibrate -o LOG`` replaced the log it read; an MSCCL++ plan written with
``--name 'a<newline>b'`` was refused by ``check``; wrong-shaped runtime-constants fields gave
Python's own words ("'int' object is not iterable") and an unknown runtime passed as NCCL's;
``time`` with nothing priced exited 0; Arabic-Indic digits passed as a runtime version; a
runtime tree of 2048 ranks was built for a minute before the step limit refused it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from collsynth import cli
from collsynth.algorithm.fileformat import save_algorithm
from collsynth.runtimes import get_runtime, parse_version
from collsynth.synthesis import solve_instance
from collsynth.algorithm.model import Instance
from collsynth.collective import allgather
from collsynth.timing.calibration import RuntimeCalibration, save_calibration
from collsynth.topology import get_topology

ROOT = Path(__file__).resolve().parents[1]
LOG = ROOT / "data" / "nccl-tests" / "A100-8gpu_all_gather_superbench.txt"


def _csv(path: Path, time_us: str) -> Path:
    rows = "".join(f"{1 << k},{time_us}\n" for k in range(10, 20))
    path.write_text("size_bytes,time_us\n" + rows)
    return path


@pytest.mark.parametrize("time_us", ["1e-310", "1e-320", "1e-300", "1e-7"])
@pytest.mark.parametrize("model", ["curve", "program"])
def test_times_below_a_nanosecond_are_refused_with_the_line(tmp_path, capsys, time_us, model):
    log = _csv(tmp_path / "log.csv", time_us)
    argv = ["calibrate", str(log), "--topology", "dgx1", "-o", str(tmp_path / "c.json")]
    argv += (["--collective", "allgather", "--ranks", "8"] if model == "curve"
             else ["--model", "program", "--runtime", "nccl"])
    assert cli.main(argv) == cli.EXIT_ERROR
    err = capsys.readouterr().err
    assert "line 2" in err and repr(float(time_us)) in err and ">= 0.001" in err
    assert "internal error" not in err and "Warning" not in err
    assert not (tmp_path / "c.json").exists()


def test_calibrate_never_writes_over_the_log_it_reads(tmp_path, capsys):
    log = tmp_path / "ag.txt"
    log.write_bytes(LOG.read_bytes())
    for argv in (["calibrate", str(log), "--topology", "dgx-a100", "-o", str(log)],
                 ["calibrate", str(log), "--model", "program", "--topology", "dgx-a100",
                  "-o", f"{tmp_path}/./ag.txt"]):
        assert cli.main(argv) == cli.EXIT_ERROR
        assert "is the input" in capsys.readouterr().err
    assert log.read_bytes() == LOG.read_bytes()


@pytest.fixture(scope="module")
def algorithm_file(tmp_path_factory) -> Path:
    result = solve_instance(get_topology("dgx1"), allgather(8),
                            Instance(steps=2, rounds=3, chunks=2))
    path = tmp_path_factory.mktemp("alg") / "ag.json"
    save_algorithm(result.algorithm, path)
    return path


def test_export_never_writes_over_its_algorithm(algorithm_file, tmp_path, capsys):
    copy = tmp_path / "ag.json"
    copy.write_bytes(algorithm_file.read_bytes())
    assert cli.main(["export", str(copy), "--runtime", "msccl", "-o", str(copy)]) == \
        cli.EXIT_ERROR
    assert "is the input" in capsys.readouterr().err
    assert copy.read_bytes() == algorithm_file.read_bytes()


@pytest.mark.parametrize("name, kept", [("a\nb", "a_b"), ("x" * 5000, "x" * 255)])
def test_an_mscclpp_plan_takes_a_name_its_reader_accepts(algorithm_file, tmp_path, capsys,
                                                         name, kept):
    plan = tmp_path / "p.json"
    assert cli.main(["export", str(algorithm_file), "--runtime", "mscclpp", "-o", str(plan),
                     "--name", name]) == 0
    assert json.loads(plan.read_text())["name"] == kept
    assert cli.main(["check", str(plan)]) == 0  # what the writer says is checked, is
    capsys.readouterr()


def _constants_file(tmp_path: Path, **changes) -> Path:
    path = tmp_path / "rc.json"
    save_calibration(RuntimeCalibration(get_runtime("nccl").defaults), path)
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize("field, value, expected", [
    ("base_latency_us", [1, 2, 3], "base_latency_us = a list of 3: expected an object"),
    ("base_latency_us", 5, "base_latency_us = 5: expected an object {LL, LL128, Simple"),
    ("ceiling_gbps", "abc", "ceiling_gbps = 'abc': expected an object {link class:"),
    ("hop_latency_us", [], "hop_latency_us = a list of 0: expected an object"),
    ("hop_latency_us", {"nvlink": 3}, "hop_latency_us.nvlink = 3: expected an object"),
    ("runtime", "foo", "runtime = 'foo': expected one of nccl, msccl"),
])
def test_runtime_constants_of_the_wrong_shape_name_the_field(tmp_path, capsys, field, value,
                                                             expected):
    path = _constants_file(tmp_path, **{field: value})
    assert cli.main(["time", "--collective", "allgather", "--topology", "dgx-a100", "--sizes",
                     "1MB", "--calibration", str(path)]) == cli.EXIT_ERROR
    err = capsys.readouterr().err
    assert f"{path}: {expected}" in err


@pytest.mark.parametrize("field, value", [("alpha_us", 5e-324), ("alpha_us", 1e-300),
                                          ("busbw_gbps", 5e-324), ("busbw_gbps", 1.7e308)])
def test_curve_figures_that_would_round_to_nothing_are_refused(algorithm_file, tmp_path, capsys,
                                                               field, value):
    log = tmp_path / "ag.txt"
    log.write_bytes(LOG.read_bytes())
    path = tmp_path / "curve.json"
    assert cli.main(["calibrate", str(log), "--topology", "dgx-a100", "-o", str(path)]) == 0
    data = json.loads(path.read_text())
    data["entries"][0][field] = value
    path.write_text(json.dumps(data))
    capsys.readouterr()
    assert cli.main(["time", str(algorithm_file), "--sizes", "1MB", "--calibration",
                     str(path)]) == cli.EXIT_ERROR
    assert f"{path}: entries[0].{field}" in capsys.readouterr().err


def test_export_tune_refuses_another_vendors_constants(algorithm_file, tmp_path, capsys):
    path = tmp_path / "rccl.json"
    save_calibration(RuntimeCalibration(get_runtime("rccl").defaults), path)
    out = tmp_path / "tuned"
    assert cli.main(["export", str(algorithm_file), "--tune", "-o", str(out), "--runtime",
                     "msccl", "--runtime-constants", str(path), "--sizes", "1MB"]) == \
        cli.EXIT_USAGE
    assert "figures for rccl, but --runtime is msccl" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize("argv", [
    ["--collective", "gather", "--topology", "dgx1", "--json"],  # no runtime algorithm
    ["--collective", "alltoall", "--topology", "ring:3"],            # no physical figures
])
def test_time_with_nothing_priced_is_an_error(capsys, argv):
    assert cli.main(["time", *argv, "--sizes", "1MB"]) == cli.EXIT_ERROR
    assert "nothing priced" in capsys.readouterr().err


@pytest.mark.parametrize("text", ["٢.١٨", "2", " ", "2.x"])
def test_runtime_versions_are_ascii_major_minor(text):
    with pytest.raises(ValueError):
        parse_version(text)


def test_calibrate_runtime_errors_blame_the_option(tmp_path, capsys):
    for runtime, expected in (("nccl-2", "--runtime: '2' is not a runtime version"),
                              ("", "--runtime: runtime = ''")):
        assert cli.main(["calibrate", str(LOG), "--model", "program", "--topology", "dgx-a100",
                         "--runtime", runtime, "-o", str(tmp_path / "c.json")]) == \
            cli.EXIT_USAGE
        assert expected in capsys.readouterr().err


def test_calibrate_without_a_runtime_takes_the_gpus_maker(tmp_path, capsys):
    """The superbench log names no runtime; a DGX-A100 runs NCCL (before: RCCL's figures)."""
    assert cli.main(["calibrate", str(LOG), "--model", "program", "--topology", "dgx-a100",
                     "-o", str(tmp_path / "c.json"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["runtime"] == "nccl"


def test_runtime_programs_too_large_are_refused_before_they_are_built():
    """Too many ranks for the simulator: the ring and the tree are refused before their rings
    are searched (a minute and 5 GB on 2048 ranks, when they were searched first). Since the
    ring is folded by node (ring_fold.py) the ring's count is a node's share: 102 GB200 NVL72
    racks (7344 GPUs) are 72 x (2 x 7344 - 1) steps on one channel, above 2^20; the tree is
    at least 2 x 1024 chunks x (2 x 7344 - 1) steps whatever its channels."""
    from collsynth.errors import InputTooLargeError
    from collsynth.timing.runtime_programs import runtime_program
    from collsynth.topology import get_topology
    from collsynth.topology.compose import compose_nodes

    racks = compose_nodes(get_topology("gb200-nvl72"), 102)
    with pytest.raises(InputTooLargeError,
                       match="the allreduce ring of 7344 ranks on 1 channel or more, folded by "
                             "node has 1057464 steps"):
        runtime_program("ring", "allreduce", racks, 1)
    with pytest.raises(InputTooLargeError,
                       match="the allreduce tree of 7344 ranks on 2 channels or more"):
        runtime_program("tree", "allreduce", racks, 2)


def test_a_trace_names_torchs_reductions_only(tmp_path):
    from collsynth.errors import FileFormatError
    from collsynth.trace.records import read_trace

    header = {"type": "header", "format": "collsynth-trace", "version": 1, "rank": 0,
              "world_size": 1, "backend": "gloo", "byte_convention": "nccl-tests",
              "hostname": "h", "pid": 1, "torch_version": "2.13.0", "started_unix": 0.0,
              "record_durations": False, "cross_node_only": False, "ranks_per_node": 1}
    call = {"type": "call", "seq": 0, "kind": "allreduce", "function": "all_reduce",
            "bytes": 64, "dtype": "float32", "op": "xor", "group": [0], "group_size": 1,
            "root": None, "peer": None, "async_op": False, "site": None, "duration_us": None,
            "cross_node": None, "batch": None, "error": None, "raw": {}}
    folder = tmp_path / "trace"
    folder.mkdir()
    (folder / "rank-00000.jsonl").write_text(json.dumps(header) + "\n" + json.dumps(call) + "\n")
    with pytest.raises(FileFormatError, match="field 'op': 'xor': not a torch.distributed"):
        read_trace(folder)
    call["op"] = "bxor"  # one of torch's
    (folder / "rank-00000.jsonl").write_text(json.dumps(header) + "\n" + json.dumps(call) + "\n")
    assert read_trace(folder).rank(0).calls[0].op == "bxor"


@pytest.mark.parametrize("size, time_us", [("1_024", "5.0"), ("١٠٢٤", "5.0"), ("1024", "5_0")])
def test_a_measurement_csv_takes_ascii_numbers_only(tmp_path, size, time_us):
    from collsynth.errors import FileFormatError
    from collsynth.timing.logs import load_log
    from collsynth.timing.runtime_fit import read_curve

    path = tmp_path / "c.csv"
    path.write_text(f"size_bytes,time_us\n{size},{time_us}\n2048,6.0\n")
    with pytest.raises(FileFormatError, match="line 2"):
        read_curve(path)
    with pytest.raises(FileFormatError, match="line 2"):
        load_log(path, collective="allgather", ranks=8)


def test_a_thread_drives_the_gpus_of_one_node_at_most(capsys):
    assert cli.main(["time", "--collective", "allreduce", "--topology", "dgx-a100",
                     "--gpus-per-thread", "9", "--sizes", "1MB"]) == cli.EXIT_USAGE
    assert "--gpus-per-thread 9: a thread drives the GPUs of one node" in capsys.readouterr().err
    assert cli.main(["time", "--collective", "allreduce", "--topology", "dgx-a100",
                     "--gpus-per-thread", "8", "--sizes", "1MB"]) == 0


@pytest.mark.parametrize("extra", [["--stages", "2"], ["--json"]])
def test_an_mscclpp_export_refuses_the_xml_options(algorithm_file, tmp_path, capsys, extra):
    plan = tmp_path / "p.json"
    assert cli.main(["export", str(algorithm_file), "--runtime", "mscclpp", "-o", str(plan),
                     *extra]) == cli.EXIT_USAGE
    assert "not an option of MSCCL++ plans" in capsys.readouterr().err
    assert not plan.exists()


def test_an_mscclpp_export_never_writes_over_its_algorithm(algorithm_file, tmp_path, capsys):
    copy = tmp_path / "ag.json"
    copy.write_bytes(algorithm_file.read_bytes())
    assert cli.main(["export", str(copy), "--runtime", "mscclpp", "-o", str(copy)]) == \
        cli.EXIT_ERROR
    assert copy.read_bytes() == algorithm_file.read_bytes()
    capsys.readouterr()


def test_plan_names_the_tuner_spellings_of_runtime():
    from collsynth.cli.plan import _runtimes

    with pytest.raises(cli.UsageError, match="or nccl-tuner, rccl-tuner: a tuner config only"):
        _runtimes("foo")
    assert _runtimes("rccl-tuner")[1] == ("rccl",)


def test_export_tune_warns_of_an_earlier_tunings_programs(algorithm_file, tmp_path, capsys):
    # Two protocols, two ranges: LL wins at 1 KB and loses at 16 MB (to LL128 or Simple: the
    # program model's Simple no longer beats LL128 below 64 MB on this DGX-1 allgather, so at
    # 1 MB both sizes ran LL, one range, and the second tuning named the same file).
    folder = tmp_path / "tuned"
    argv = ["export", str(algorithm_file), "--tune", "-o", str(folder)]
    assert cli.main([*argv, "--sizes", "1KB,16MB"]) == 0
    first = {p.name for p in folder.iterdir()}
    assert len(first) == 2
    assert "warning" not in capsys.readouterr().err
    assert cli.main([*argv, "--sizes", "16MB"]) == 0  # one range now: other file names
    captured = capsys.readouterr()
    written = {Path(line.split()[1]).name for line in captured.out.splitlines()
               if line.startswith("wrote ")}
    earlier = first - written
    assert earlier  # the precondition: the two tunings' ranges differ
    assert "earlier tuning" in captured.err
    assert all(name in captured.err for name in earlier)
    assert not any(name in captured.err for name in written)


def test_the_tree_programs_step_bound_is_a_lower_bound():
    """tree_program_min_steps never exceeds the steps of the program it bounds (counted), and
    the bound at two channels never exceeds the bound at more (what the pre-check relies on)."""
    from collsynth.timing.runtime_baselines import tree_program, tree_program_min_steps

    for nodes, chains, pipeline in ((2, [[0]], 1), (3, [[0, 1]], 4), (2, [[0, 1, 2], [1, 2, 0]],
                                                                     2)):
        program = tree_program(nodes, chains, pipeline=pipeline)
        steps = sum(len(tb.steps) for g in program.gpus for tb in g.threadblocks)
        n = nodes * len(chains[0])
        assert tree_program_min_steps(n, 2 * len(chains), pipeline) <= steps
    assert all(tree_program_min_steps(n, 2, p) <= tree_program_min_steps(n, c, p)
               for n in range(2, 64) for c in range(2, 34, 2) for p in range(1, 9))
