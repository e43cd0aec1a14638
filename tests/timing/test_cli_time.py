"""``collsynth time`` and ``collsynth plot`` in process, on hand-built ring algorithms.

Topology: a bidirectional 4-ring, 10 GB/s per link (beta = 1e-4 us/byte), 2 us per step.
* ``two_step``: 2 steps of 1 round, 1 chunk: 4 + 2 x (size/4) x 1e-4 = 4 + size/20000 us;
* ``three_step``: 3 steps of 1 round, 2 chunks (3/2 rounds per chunk): 6 + 3 size/80000 us;
  they cost the same at size = 2 / (1/20000 - 3/80000) = 160000 bytes.
* NCCL: 2 rings of 10 GB/s (20 GB/s bus); allgather ring/LL: 6.6 + 3 x 0.6 = 8.4 us latency,
  algbw 20 x 0.5 x 4/3 = 40/3 GB/s.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

import pytest

from collsynth import cli
from collsynth.algorithm import Algorithm, Send, Step, verify
from collsynth.algorithm.fileformat import save_algorithm
from collsynth.cli.common import format_size, parse_size
from collsynth.cli.common import parse_size_range, parse_sizes
from collsynth.collective import allgather, broadcast
from collsynth.topology.families import ring


def main(argv: list[str]) -> int:
    return cli.main(argv)


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def ring4():
    return dataclasses.replace(ring(4), unit_gbps=10.0, alpha_us=2.0)


def two_step() -> Algorithm:
    s1 = tuple(Send(r, r, d) for r in range(4) for d in ((r + 1) % 4, (r - 1) % 4))
    s2 = tuple(Send((r - 1) % 4, r, (r + 1) % 4) for r in range(4))
    return verify(Algorithm("two_step", ring4(), allgather(4), (Step(1, s1), Step(1, s2))))


def three_step() -> Algorithm:
    steps = tuple(Step(1, tuple(Send(((r - t) % 4) * 2, r, (r + 1) % 4) for r in range(4))
                       + tuple(Send(((r + t) % 4) * 2 + 1, r, (r - 1) % 4) for r in range(4)))
                  for t in range(3))
    return verify(Algorithm("three_step", ring4(), allgather(4).split(2), steps))


@pytest.fixture
def files(tmp_path):
    paths = []
    for algorithm in (two_step(), three_step()):
        path = tmp_path / f"{algorithm.name}.json"
        save_algorithm(algorithm, path)
        paths.append(path)
    return paths


# -- sizes ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("text, expected", [
    ("1KB", 1000), ("1kB", 1000), ("1KiB", 1024), ("1 MB", 10**6), ("1MiB", 2**20),
    ("1GB", 10**9), ("2GiB", 2 * 2**30), ("512", 512), ("512B", 512), ("1.5MB", 1_500_000),
    ("0.5KiB", 512),
])
def test_parse_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text, message", [
    ("1K", "ambiguous unit 'K'"), ("1m", "ambiguous unit 'm'"), ("1 mb", "ambiguous unit 'mb'"),
    ("1Gb", "ambiguous unit 'Gb'"), ("1kib", "ambiguous"), ("1XB", "unknown unit"),
    ("1.5B", "whole number"), ("0", "at least 1 byte"), ("-1KB", "expected a number"),
    ("KB", "expected a number"), ("", "expected a number"),
])
def test_parse_size_refuses(text, message):
    with pytest.raises(argparse.ArgumentTypeError, match=message):
        parse_size(text)


def test_parse_sizes_and_ranges():
    assert parse_sizes("1GB,1KB,1MB,1KB") == [10**3, 10**6, 10**9]
    assert parse_size_range("1KiB:1GiB") == (1024, 2**30)
    with pytest.raises(argparse.ArgumentTypeError, match="below"):
        parse_size_range("1GB:1KB")
    with pytest.raises(argparse.ArgumentTypeError, match="FROM:TO"):
        parse_size_range("1KB")


def test_format_size():
    assert [format_size(s) for s in (1000, 1024, 160000, 1500, 999, 10**9, 2**30)] == [
        "1 KB", "1 KiB", "160 KB", "1.5 KB", "999 B", "1 GB", "1 GiB"]


# -- time -----------------------------------------------------------------------------------------


def test_time_table(capsys, files):
    code, out, err = run(capsys, "time", *files, "--sizes", "1KB,1MB,1GB")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].startswith("allgather on ring:4 (4 ranks)")
    row = next(line for line in lines if line.startswith("1 KB"))
    cells = [c.strip() for c in row.split("|")]
    # two_step at 1 KB: 4 + 1000/20000 = 4.05 us; algbw = 1000 B / 4.05 us = 0.247 GB/s;
    # busbw = x 3/4.
    assert cells[1] == "two_step" and cells[2] == "4.050" and cells[3] == "0.247"
    assert cells[4] == "0.185" and cells[5] == "*"
    assert any("nccl-ring/LL" in line and "8.475" in line for line in lines)  # 8.4 + 1000/(40000/3)
    assert "best: 1 KB two_step; 1 MB three_step; 1 GB three_step" in out
    assert "two_step -> three_step at 160000 bytes (160 KB)" in out
    assert "NCCL has no tree for allgather" in out


def test_time_json(capsys, files):
    code, out, _ = run(capsys, "time", *files, "--sizes", "1KB,1GB", "--json")
    assert code == 0
    data = json.loads(out)
    assert data["collective"] == "allgather" and data["num_ranks"] == 4
    first = data["sizes"][0]
    assert first["size_bytes"] == 1000 and first["best"] == "two_step"
    names = [c["name"] for c in first["candidates"]]
    assert names == ["two_step", "three_step", "nccl-ring/LL"]
    assert first["candidates"][0]["time_us"] == pytest.approx(4.05)
    assert data["crossovers"] == [{"from": "two_step", "to": "three_step",
                                   "size_bytes": "160000", "size_bytes_float": 160000.0}]
    # At 1 GB: three_step 6 + 37500 us; NCCL ring/Simple 8.4 + 3 x 3.4 + 10**9 / (1000 x 80/3).
    last = {c["name"]: c for c in data["sizes"][1]["candidates"]}
    assert last["three_step"]["time_us"] == pytest.approx(37506)
    assert last["nccl-ring/Simple"]["time_us"] == pytest.approx(18.6 + 37500)


def test_time_usage_errors(capsys, files):
    code, _, err = run(capsys, "time", files[0], "--sizes", "1K")
    assert code == cli.EXIT_USAGE and "ambiguous unit 'K'" in err
    code, _, err = run(capsys, "time", "--sizes", "1KB")
    assert code == cli.EXIT_USAGE


def test_time_errors(capsys, files, tmp_path):
    code, _, err = run(capsys, "time", tmp_path / "missing.json")
    assert code == cli.EXIT_ERROR and "missing.json" in err
    other = tmp_path / "bcast.json"
    steps = (Step(1, (Send(0, 0, 1), Send(0, 0, 3))), Step(1, (Send(0, 1, 2),)))
    save_algorithm(verify(Algorithm("bcast", ring4(), broadcast(4), steps)), other)
    code, _, err = run(capsys, "time", files[0], other)
    assert code == cli.EXIT_ERROR and "different collectives" in err


def test_time_calibration_without_module(capsys, files, monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "collsynth.timing.calibration", None)  # import fails
    code, _, err = run(capsys, "time", files[0], "--calibration", tmp_path / "cal.json")
    assert code == cli.EXIT_ERROR and "calibration" in err


def test_time_with_a_calibration_file(capsys, files, tmp_path):
    from collsynth.timing import calibration
    # An allgather fit on 4 ranks: busbw 16 GB/s over ring:4's 2 egress units = 8 GB/s per unit;
    # alpha 30 us over NCCL's 3 ring steps = 10 us per step. The measured line itself is
    # 30 us + size x 1e-4 us/byte.
    entry = calibration.CalibrationEntry(
        "ag.txt", "allgather", 4, "alpha-beta",
        {"alpha_us": 30.0, "beta_us_per_byte": 1e-4, "busbw_gbps": 16.0}, gmae=0.1)
    path = tmp_path / "cal.json"
    calibration.save_calibration(calibration.CurveCalibration("ring:4", (entry,)), path)
    code, out, err = run(capsys, "time", files[0], "--sizes", "1KB", "--calibration", path,
                         "--json")
    assert code == 0, err
    rows = {c["name"]: c for c in json.loads(out)["sizes"][0]["candidates"]}
    # two_step: 2 x 10 + 2 x (1000/4) / 8000 = 20.0625 us.
    assert rows["two_step"]["time_us"] == pytest.approx(20.0625)
    assert rows["nccl-measured"]["time_us"] == pytest.approx(30.1)
    assert rows["nccl-measured"]["kind"] == "measured"
    code, _, err = run(capsys, "time", files[0], "--calibration", tmp_path / "missing-cal.json")
    assert code == cli.EXIT_ERROR and "missing-cal.json" in err


def test_the_closed_form_with_a_calibration_and_the_measured_model():
    from collsynth.runtimes import get_runtime
    from collsynth.timing import calibration
    from collsynth.timing.closed_form import ClosedForm, Measured
    from collsynth.timing.pricing import MEASURED, RuntimeAlgorithm, runtime_algorithms

    # An allgather fit on 4 ranks: busbw 10 GB/s over ring:4's 2 egress units = 5 GB/s per
    # unit; alpha 3 us over NCCL's 3 ring steps = 1 us per step; the line 7 us + 2e-4 us/byte.
    entry = calibration.CalibrationEntry(
        "ag.txt", "allgather", 4, "alpha-beta",
        {"alpha_us": 3.0, "beta_us_per_byte": 2e-4, "busbw_gbps": 10.0}, gmae=0.1)
    cal = calibration.CurveCalibration("ring:4", (entry,))
    model = ClosedForm(calibration=cal)
    (price,) = model.price(two_step(), [1000])
    # 2 x 1 + 2 x (1000/4) / 5000 = 2.1 us
    assert price.time_us == pytest.approx(2.1)
    nccl = get_runtime("nccl")
    (ring,) = runtime_algorithms(nccl, "allgather", ring4())
    assert model.nccl_setup(ring4()).bus_gbps == 10.0  # 2 channels of one 5 GB/s unit
    measured = RuntimeAlgorithm(nccl, MEASURED, "allgather", ring4())
    assert Measured(cal).price(measured, [1000])[0].time_us == pytest.approx(3.2)
    assert model.why_not(measured) is not None and Measured(cal).why_not(ring) is not None


def test_closed_form_device_gamma_for_combining():
    from collsynth.collective import reduce_scatter
    from collsynth.timing.closed_form import ClosedForm
    from collsynth.timing.kernels import reduce_gamma_us_per_byte
    from collsynth.topology import Topology

    pair = Topology("pair", ((0, 1), (1, 0)), unit_gbps=10.0, alpha_us=1.0)
    step = Step(1, (Send(0, 1, 0, reduce=True), Send(1, 0, 1, reduce=True)))
    algorithm = verify(Algorithm("rs", pair, reduce_scatter(2), (step,)))
    plain = ClosedForm().price(algorithm, [2 * 10**6])[0].time_us
    gamma = reduce_gamma_us_per_byte("v100")
    charged = ClosedForm(gamma_us_per_byte=gamma).price(algorithm, [2 * 10**6])[0].time_us
    # 10**6 reduced bytes at 3 / 9e5 us each.
    assert charged - plain == pytest.approx(10**6 * 3 / 9e5)


# -- plot -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("suffix, magic", [(".png", b"\x89PNG"), (".svg", b"<?xml")])
def test_plot(capsys, files, tmp_path, suffix, magic):
    output = tmp_path / f"plot{suffix}"
    code, out, err = run(capsys, "plot", *files, "--sizes", "1KB:1GB", "--metric", "busbw",
                         "-o", output)
    assert code == 0, err
    assert output.read_bytes().startswith(magic)
    assert f"wrote {output}" in out


def test_plot_usage_errors(capsys, files, tmp_path):
    code, _, err = run(capsys, "plot", *files, "-o", tmp_path / "plot.jpg")
    assert code == cli.EXIT_USAGE and ".png or .svg" in err
    code, _, err = run(capsys, "plot", *files, "--sizes", "1GB:1KB", "-o", tmp_path / "p.png")
    assert code == cli.EXIT_USAGE


def test_time_reads_every_calibration_collsynth_writes(capsys, files, tmp_path):
    """One file format with a kind: a curve calibration feeds the closed form, runtime
    constants the program model; without --model the kind picks it, and a file of an earlier
    version reads as well."""
    import json as json_module

    from collsynth.runtimes import get_runtime
    from collsynth.timing import calibration

    entry = calibration.CalibrationEntry(
        "ag.txt", "allgather", 4, "alpha-beta",
        {"alpha_us": 30.0, "beta_us_per_byte": 1e-4, "busbw_gbps": 16.0}, gmae=0.1)
    curve = tmp_path / "curve.json"
    calibration.save_calibration(calibration.CurveCalibration("ring:4", (entry,)), curve)
    constants = get_runtime("nccl").defaults.replace(source="slow", base_latency_us={
        "LL": 100.0, "LL128": 100.0, "Simple": 100.0})
    rt = tmp_path / "rt.json"
    calibration.save_calibration(calibration.RuntimeCalibration(constants), rt)
    legacy = tmp_path / "legacy-rt.json"
    obj = json_module.loads(rt.read_text())
    legacy.write_text(json_module.dumps({**{k: v for k, v in obj.items() if k != "kind"},
                                         "format": "collsynth-runtime-constants",
                                         "version": 1}))
    code, out, err = run(capsys, "time", files[0], "--sizes", "1KB", "--calibration", curve,
                         "--json")
    assert code == 0, err
    assert json.loads(out)["model"] == "closed-form"
    for path in (rt, legacy):   # the program model, its constants: every row pays base 100 us
        code, out, err = run(capsys, "time", files[0], "--sizes", "1KB", "--calibration", path,
                             "--json")
        assert code == 0, err
        rows = json.loads(out)
        assert {r["model"] for r in rows} == {"program-model"}
        assert all(r["time_us"] >= 100.0 for r in rows)
    code, _, err = run(capsys, "time", files[0], "--model", "closed-form", "--calibration", rt)
    assert code == cli.EXIT_ERROR and "runtime constants go with the program model" in err
    code, _, err = run(capsys, "time", files[0], "--model", "program", "--calibration", curve)
    assert code == cli.EXIT_ERROR and "a curve calibration gives the closed form" in err


def test_time_prices_msccl_programs_with_a_calibration_of_nccl(capsys, tmp_path):
    """msccl-executor runs NCCL's kernels, so constants measured on NCCL price its programs (as
    plan and tune-runtime take a calibration of the runtime's family); RCCL's kernels are
    another runtime's, and its programs are refused such constants."""
    from pathlib import Path

    from collsynth.runtimes import get_runtime
    from collsynth.timing import calibration

    xml = Path(__file__).resolve().parents[2] / "data" / "msccl-xml" / "msccl-scheduler" / \
        "ap-1pass.xml"
    # a base latency of 100 us shows the calibration's constants are the ones priced with
    constants = get_runtime("nccl").defaults.replace(base_latency_us={
        "LL": 100.0, "LL128": 100.0, "Simple": 100.0})
    rt = tmp_path / "nccl.json"
    calibration.save_calibration(calibration.RuntimeCalibration(constants), rt)
    code, out, err = run(capsys, "time", xml, "--topology", "dgx-h100", "--runtime",
                         "msccl-executor", "--calibration", rt, "--sizes", "1KiB", "--json")
    assert code == 0, err
    rows = json.loads(out)
    assert any(r["name"] == "ap-1pass.xml" for r in rows)
    assert all(r["time_us"] >= 100.0 for r in rows)
    code, _, err = run(capsys, "time", xml, "--topology", "dgx-h100", "--runtime", "rccl",
                       "--calibration", rt, "--sizes", "1KiB")
    # two options that cannot go together: a usage error, as tune-runtime's and plan's
    assert code == cli.EXIT_USAGE
    assert f"--runtime rccl: the calibration {rt} is for nccl, whose kernels rccl" in err


def test_time_prices_a_set_of_programs_as_the_runtime_loads_it(capsys):
    """With several XML files on a runtime that loads them, a row per size prices what it runs:
    the program whose minBytes-maxBytes and layout take the call (ap-1pass.xml: 0-32768 B;
    r48ll.xml: 266240-2078719 B; both in-place only), else the runtime's own pick."""
    from pathlib import Path

    folder = Path(__file__).resolve().parents[2] / "data" / "msccl-xml" / "msccl-scheduler"
    files = [folder / "ap-1pass.xml", folder / "r48ll.xml"]

    def rows(*extra):
        code, out, err = run(capsys, "time", *files, "--topology", "dgx-h100", "--runtime",
                             "msccl-executor", "--sizes", "1KiB,1MiB,64MiB", "--json", *extra)
        assert code == 0, err
        return json.loads(out)

    found = rows()
    for size, runs in ((1024, "ap-1pass.xml"), (1 << 20, "r48ll.xml")):
        (loaded,) = [r for r in found if r["kind"] == "loaded" and r["size_bytes"] == size]
        (program,) = [r for r in found if r["name"] == runs and r["size_bytes"] == size]
        assert loaded["note"] == f"runs {runs}" and loaded["time_us"] == program["time_us"]
    # 64 MiB is above both ranges: the runtime's own pick runs, and the row says which.
    (big,) = [r for r in found if r["kind"] == "loaded" and r["size_bytes"] == 64 << 20]
    (pick,) = [r for r in found if r.get("runtime_pick") and r["size_bytes"] == 64 << 20]
    assert big["note"] == f"runs {pick['name']}" and big["time_us"] == pick["time_us"]
    # Out-of-place calls never run these in-place-only files.
    assert all(r["note"].startswith("runs nccl-") for r in rows("--layout", "out-of-place")
               if r["kind"] == "loaded")
    # nccl loads no XML: no such row.
    code, out, err = run(capsys, "time", *files, "--topology", "dgx-h100", "--sizes", "1KiB",
                         "--json")
    assert code == 0, err
    assert not [r for r in json.loads(out) if r["kind"] == "loaded"]
    code, out, err = run(capsys, "time", *files, "--topology", "dgx-h100", "--sizes", "1KiB",
                         "--layout", "in-place")
    assert code == 0, err
    assert "--layout in-place: no effect here" in out


def test_time_prices_the_runtime_the_machines_gpus_run(capsys):
    """Without --runtime or a calibration, an AMD machine is priced with RCCL (its constants
    and its own algorithms), not NCCL, which does not run there; --runtime still chooses."""
    assert main(["time", "--collective", "allreduce", "--topology", "mi300x", "--sizes",
                 "1MiB", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {r["name"] for r in rows} >= {"rccl-ring", "rccl-tree"}
    assert not any(r["name"].startswith("nccl-") for r in rows)
    assert main(["time", "--collective", "allreduce", "--topology", "mi300x", "--sizes",
                 "1MiB", "--runtime", "nccl", "--json"]) == 0
    assert {r["name"] for r in json.loads(capsys.readouterr().out)} >= {"nccl-ring"}
    assert main(["time", "--collective", "allreduce", "--topology", "dgx-a100", "--sizes",
                 "1MiB", "--json"]) == 0
    assert {r["name"] for r in json.loads(capsys.readouterr().out)} >= {"nccl-ring", "nccl-tree"}


def test_nvls_on_fewer_channels_than_the_runtimes_own_is_named_a_lower_bound(capsys):
    # The documented constants bound no NVLS channel, so NVLS on 2 of NCCL's 16 channels is
    # priced by the switch's ports alone (docs/tuner-config.md, "NVLS channels"): the table
    # says so. On the runtime's own 16 there is nothing to say.
    base = ["time", "--collective", "allreduce", "--topology", "dgx-h100", "--sizes", "128MiB",
            "-q"]
    assert cli.main(base + ["--channels", "2"]) == 0
    out = capsys.readouterr().out
    assert "nccl-nvls/2ch: on 2 of the runtime's 16 NVLS channels" in out
    assert "lower bound" in out
    assert cli.main(base + ["--channels", "16"]) == 0
    assert "NVLS channels" not in capsys.readouterr().out


def test_a_pick_without_a_row_is_said(monkeypatch, capsys):
    # NCCL's own pick for 1 MB on two DGX H100 is tree/LL128 (its cost model); when the model
    # cannot price the tree (as on 64 MI300X nodes, beyond the simulated steps), the fastest
    # row must not pass for what NCCL runs
    from collsynth import cli
    from collsynth.timing.pricing import RuntimeAlgorithm
    from collsynth.timing.program_model import ProgramModel

    original = ProgramModel.why_not

    def refuse_tree(self, subject):
        if isinstance(subject, RuntimeAlgorithm) and subject.algorithm == "tree":
            return "refused for this test"
        return original(self, subject)

    code = cli.main(["time", "--collective", "allreduce", "--topology", "DGX-H100", "--nodes",
                     "2", "--sizes", "1MB", "-q"])
    assert code == cli.EXIT_OK
    assert "own pick" not in capsys.readouterr().out  # priced: its row carries the mark
    monkeypatch.setattr(ProgramModel, "why_not", refuse_tree)
    code = cli.main(["time", "--collective", "allreduce", "--topology", "DGX-H100", "--nodes",
                     "2", "--sizes", "1MB", "-q"])
    out = capsys.readouterr().out
    assert code == cli.EXIT_OK
    assert "nccl's own pick at 1 MB is tree/LL128, which has no row here" in out
