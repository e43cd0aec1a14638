"""``collsynth run``: exit codes, output, sizes; run in-process (``collsynth.cli.main``)."""

from __future__ import annotations

import argparse
import json
import re

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():  # pragma: no cover
    pytest.skip("torch.distributed with gloo is needed", allow_module_level=True)

from collsynth.algorithm import save_algorithm  # noqa: E402
from collsynth.export.pipeline import export_algorithm  # noqa: E402
from collsynth import cli  # noqa: E402
from collsynth.cli.execute import parse_run_size as parse_size  # noqa: E402
from collsynth.collective import standard_collective  # noqa: E402
from collsynth.export import lower, write_program  # noqa: E402
from collsynth.export.program import Program, ThreadBlock, XmlStep  # noqa: E402
from collsynth.synthesis import solve_least_steps  # noqa: E402
from collsynth.topology import get_topology  # noqa: E402


def main(argv: list[str]) -> int:
    """``collsynth run ARGV``."""
    return cli.main(["run", *argv])


def _algorithm(name: str, n: int = 4, root: int | None = None):
    return solve_least_steps(get_topology(f"ring:{n}"), standard_collective(name, n, root=root),
                             chunks=2).algorithm


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("algorithms")
    paths = {}
    for name, root in (("allreduce", None), ("allgather", None), ("broadcast", 2)):
        algorithm = _algorithm(name, root=root)
        paths[name] = folder / f"{name}.json"
        save_algorithm(algorithm, paths[name])
        paths[f"{name}.xml"] = folder / f"{name}.xml"
        export_algorithm(algorithm, paths[f"{name}.xml"], runtime="rccl")
    # A wrong program: one receive lands in the wrong output slot.
    program = lower(_algorithm("allgather"), runtime="msccl")
    gpu = program.gpus[1]
    tb = next(t for t in gpu.threadblocks if any(s.type == "r" for s in t.steps))
    steps = tuple(XmlStep(s.s, s.type, s.srcbuf, s.srcoff, s.dstbuf,
                          (s.dstoff + 1) % gpu.o_chunks if s.type == "r" else s.dstoff, s.cnt,
                          s.depid, s.deps, s.hasdep) for s in tb.steps)
    tbs = tuple(ThreadBlock(t.id, t.send, t.recv, t.chan, steps) if t is tb else t
                for t in gpu.threadblocks)
    gpus = list(program.gpus)
    gpus[1] = type(gpu)(gpu.id, gpu.i_chunks, gpu.o_chunks, gpu.s_chunks, tbs)
    wrong = Program(program.name, program.proto, program.nchannels, program.nchunksperloop,
                    program.ngpus, program.coll, program.inplace, tuple(gpus))
    paths["wrong.xml"] = folder / "wrong.xml"
    paths["wrong.xml"].write_text(write_program(wrong, "msccl"))
    return paths


@pytest.mark.parametrize("text,expected", [
    ("4MiB", 4 * 2**20), ("4 MiB", 4 * 2**20), ("1KB", 1000), ("1KiB", 1024),
    ("2GB", 2 * 10**9), ("1GiB", 2**30), ("17", 17), ("17B", 17), ("1.5MB", 1_500_000),
    ("0.5KiB", 512),
])
def test_sizes_take_units(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "MiB", "4TB", "-1", "0", "0.1B", "four", "1kib", "1K"])
def test_bad_sizes_are_refused(text):
    with pytest.raises(argparse.ArgumentTypeError):
        parse_size(text)


def test_an_allreduce_matches_torch_and_is_timed(files, capsys):
    code = main([str(files["allreduce"]), "--ranks", "4", "--size", "1001B", "--iters", "2",
                 "--warmup", "1", "--dtype", "bfloat16"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "correct: yes, matches torch.distributed.all_reduce within" in out
    assert "1000 bytes per call (500 elements per block)" in out
    assert "collsynth " in out and "torch " in out and "busbw = algbw x 1.5" in out


def test_json_output(files, capsys):
    code = main([str(files["allgather"]), "--size", "4KiB", "--iters", "3", "--dtype", "int32",
                 "--inplace", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0
    assert report["correct"] and report["tolerance"] == 0 and report["inplace"]
    assert report["size_bytes"] == 4096 and report["block_elems"] == 256
    assert report["torch_call"] == "torch.distributed.all_gather_into_tensor"
    for name in ("collsynth", "torch"):
        figures = report[name]
        assert figures["min_s"] <= figures["median_s"] <= figures["max_s"]
        assert figures["busbw_GBps"] == pytest.approx(figures["algbw_GBps"] * 0.75)


def test_an_xml_program_with_an_inferred_root(files, capsys):
    code = main([str(files["broadcast.xml"]), "--size", "999", "--iters", "0", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0 and report["correct"] and report["collsynth"] is None
    assert report["kind"] == "broadcast" and report["size_bytes"] == 996


def test_a_wrong_program_exits_1(files, capsys):
    code = main([str(files["wrong.xml"]), "--size", "64", "--iters", "0", "--dtype", "int32"])
    out = capsys.readouterr().out
    assert code == 1
    assert "correct: NO: differs from torch.distributed.all_gather_into_tensor" in out


@pytest.mark.parametrize("argv,message", [
    (["--ranks", "8"], "is for 4 ranks"),
    (["--op", "avg", "--dtype", "int32"], "avg"),
    (["--size", "12XB"], "unknown unit"),
    (["--size", "1K"], "ambiguous unit"),
    (["--iters", "-1"], "whole number"),
    (["--timeout", "0"], "seconds > 0"),
])
def test_usage_errors_exit_2(files, capsys, argv, message):
    assert main([str(files["allreduce"]), *argv]) == 2
    assert message in capsys.readouterr().err


def test_a_program_for_the_other_layout_is_a_usage_error(files, capsys):
    assert main([str(files["allreduce.xml"]), "--inplace"]) == 2
    assert "drop --inplace" in capsys.readouterr().err


def test_a_missing_file_exits_1(tmp_path, capsys):
    assert main([str(tmp_path / "nope.json")]) == 1
    assert "collsynth: error:" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.device_count() >= 4,
                    reason="GPUs are present")
def test_nccl_without_gpus_exits_1(files, capsys):
    assert main([str(files["allreduce"]), "--backend", "nccl", "--size", "1KiB"]) == 1
    assert "nccl backend needs 4 GPUs" in capsys.readouterr().err


def test_a_run_says_what_it_is_doing_on_stderr(files, capsys, monkeypatch):
    # The launch's heartbeat (every 5 s) goes to stderr, after a first line; --json keeps
    # stderr quiet. Here the heartbeat comes every 0.01 s, so even a quick run shows it.
    import importlib

    launching = importlib.import_module("collsynth.executor.launch")  # not the function
    real = launching.launch

    def slower(*args, **keywords):
        assert keywords["progress"] is not None or "--json" in used
        keywords["progress_interval_s"] = 0.01
        return real(*args, **keywords)

    monkeypatch.setattr(launching, "launch", slower)
    used = ["--size", "64B", "--iters", "1", "--warmup", "0"]
    assert main([str(files["allgather"]), *used]) == 0
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert lines[0] == "  running: allgather(n=4, chunks=2) on ring:4: 4 local process(es), gloo"
    assert len(lines) >= 2 and all(
        re.fullmatch(r"  running: [0-4] of 4 rank\(s\) done, \d+ s so far \(timeout \d+ s\)",
                     line) for line in lines[1:]), lines
    used.append("--json")
    assert main([str(files["allgather"]), *used]) == 0
    assert capsys.readouterr().err == ""
