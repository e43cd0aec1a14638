"""The runtime's version reaches its own choices: parsed from logs and users, kept in program
calibrations, and followed by the tuning model, the program model and ``collsynth time``."""

from __future__ import annotations

import json

import pytest

from collsynth.cli import main
from collsynth.errors import FileFormatError
from collsynth.runtimes import get_runtime, parse_version
from collsynth.timing.calibration import (RuntimeCalibration, calibration_from_json,
                                          calibration_to_json)
from collsynth.timing.pricing import runtime_algorithms
from collsynth.timing.program_model import ProgramModel
from collsynth.timing.tuning_model import version_note
from collsynth.topology import get_topology


@pytest.mark.parametrize("text, version", [("2.18.5", (2, 18)), ("2.18.5+cuda12.2", (2, 18)),
                                           ("2.22.3-HEAD", (2, 22)), ("v2.27", (2, 27)),
                                           (" 2.7.8+cuda11.0 ", (2, 7))])
def test_versions_as_logs_and_users_write_them(text, version):
    assert parse_version(text) == version
    assert get_runtime("rccl").at_version(text).version == version


@pytest.mark.parametrize("text", ["", "two", "2", "2.x", "nccl 2.18"])
def test_a_text_that_is_no_version_is_refused(text):
    with pytest.raises(ValueError, match="not a runtime version"):
        parse_version(text)


def test_nvls_allgather_exists_from_nccl_2_19():
    # NCCL 2.18's tuning.cc skips every algorithm but the ring for allgather and reduce-scatter;
    # 2.19 lets NVLS through (v2.19.1 'a != NCCL_ALGO_RING && a != NCCL_ALGO_NVLS').
    h100 = get_topology("dgx-h100")
    names = {v: {a.algorithm for a in runtime_algorithms(get_runtime("nccl").at_version(v),
                                                         "allgather", h100)}
             for v in ((2, 18), (2, 19), None)}
    assert "nvls" not in names[(2, 18)]
    assert "nvls" in names[(2, 19)] and "nvls" in names[None]


def test_the_program_model_prices_its_runtimes_version():
    h100 = get_topology("dgx-h100")
    old = get_runtime("nccl").at_version((2, 18))
    assert ProgramModel(old.defaults, runtime=old).tuning(h100, "nccl").version == (2, 18)
    new = get_runtime("nccl")
    assert ProgramModel(new.defaults, runtime=new).tuning(h100, "nccl").version == (2, 30)


def test_versions_outside_the_modelled_range_are_said():
    assert version_note("nccl", (2, 18)) is None and version_note("nccl", None) is None
    assert "priced by 2.18's rules" in version_note("nccl", (2, 7))
    assert "priced by 2.28's rules" in version_note("rccl", (2, 31))


def test_a_program_calibration_keeps_its_runtimes_version():
    nccl = get_runtime("nccl")
    obj = calibration_to_json(RuntimeCalibration(nccl.defaults, runtime_version=(2, 18)))
    assert obj["runtime_version"] == "2.18"
    assert calibration_from_json(json.loads(json.dumps(obj))).runtime_version == (2, 18)
    # none given, none written
    assert "runtime_version" not in calibration_to_json(RuntimeCalibration(nccl.defaults))
    for bad in ("newest", 2.18, "2" * 100):
        with pytest.raises(FileFormatError, match="runtime_version"):
            calibration_from_json({**obj, "runtime_version": bad}, source="cal.json")


def test_calibrate_and_time_carry_the_version(tmp_path, capsys):
    curve = tmp_path / "curve.csv"
    curve.write_text("size_bytes,time_us\n1024,20\n2048,21\n4096,22\n8192,24\n")
    cal = tmp_path / "cal.json"
    assert main(["calibrate", "--model", "program", str(curve), "--topology", "DGX-A100",
                 "--runtime", "nccl-2.18.5", "--collective", "allreduce", "-o", str(cal),
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["runtime_version"] == "2.18"
    assert json.loads(cal.read_text())["runtime_version"] == "2.18"
    # time follows the calibration's version: no NVLS allgather at 2.18 on a DGX-H100 ...
    assert main(["time", "--calibration", str(cal), "--collective", "allgather",
                 "--topology", "dgx-h100", "--sizes", "1GiB"]) == 0
    text = capsys.readouterr().out
    assert "nccl 2.18 (the calibration" in text and "nccl-nvls " not in text
    # ... unless told another one
    assert main(["time", "--calibration", str(cal), "--collective", "allgather",
                 "--topology", "dgx-h100", "--sizes", "1GiB", "--runtime-version", "2.30"]) == 0
    assert "nccl-nvls " in capsys.readouterr().out


def test_time_says_when_a_version_is_older_than_modelled(capsys):
    assert main(["time", "--collective", "allreduce", "--topology", "dgx-a100", "--sizes",
                 "1MiB", "--runtime-version", "2.7.8"]) == 0
    assert "older than the oldest version modelled (2.18)" in capsys.readouterr().out
    assert main(["time", "--collective", "allreduce", "--topology", "dgx-a100",
                 "--runtime-version", "latest"]) == 2
    assert "'latest' is not a runtime version" in capsys.readouterr().err


def _tree_chunk_by_hand(per_channel: int, depth: int) -> int:
    """The tree's Simple chunk by the source's loops (computeColl / calcCollChunking): 512 KiB
    halved while a channel has fewer chunks than depth x 8 (down to 128 KiB), x 4 (64 KiB),
    x 1 (32 KiB)."""
    chunk = 512 << 10
    for times, floor in ((8, 128 << 10), (4, 64 << 10), (1, 32 << 10)):
        while per_channel // chunk < depth * times and chunk > floor:
            chunk //= 2
    return chunk


def test_the_old_tree_simple_chunk_rule_follows_the_version():
    """NCCL <= 2.19 (computeColl in enqueue.cc of v2.19.4) halves the tree's 512 KiB Simple
    chunk while a channel has fewer chunks than the tree's depth x 8 (down to 128 KiB), x 4
    (64 KiB), x 1 (32 KiB); 2.20 dropped it. Two DGX-H100 nodes: depth 8 - 1 + log2 2 = 8."""
    from collsynth.timing.tuning_model import call_shape, tuning_setup
    from collsynth.topology import compose_nodes

    two = compose_nodes(get_topology("dgx-h100"), 2)
    old = tuning_setup(two, runtime="nccl", version=(2, 19))
    new = tuning_setup(two, runtime="nccl", version=(2, 20))
    for size in (64 << 20, 1 << 30, 1 << 20):
        shape = call_shape(old, "allreduce", "tree", "Simple", size)
        assert shape.chunk_bytes == _tree_chunk_by_hand(size // shape.channels, 8), size
        assert call_shape(new, "allreduce", "tree", "Simple", size).chunk_bytes == 512 << 10
    # 1 GiB over at most 32 channels: >= 32 MiB a channel, 64 chunks of 512 KiB: kept
    assert call_shape(old, "allreduce", "tree", "Simple", 1 << 30).chunk_bytes == 512 << 10
    assert call_shape(old, "allreduce", "tree", "Simple", 1 << 20).chunk_bytes == 32 << 10


def test_rccl_keeps_the_tree_simple_chunk_rule_at_every_version():
    """RCCL never dropped the rule NCCL 2.20 did: calcCollChunking of RCCL 2.21 and of the rccl
    in ROCm/rocm-systems (2026) both halve the tree's 512 KiB Simple chunk while a channel has
    fewer chunks than depth x 8 (down to 128 KiB), x 4 (64 KiB), x 1 (32 KiB). Two MI300X
    nodes: depth 8 - 1 + log2 2 = 8."""
    from collsynth.timing.tuning_model import call_shape, tuning_setup
    from collsynth.topology import compose_nodes

    two = compose_nodes(get_topology("mi300x"), 2)
    for version in ((2, 21), (2, 26)):
        setup = tuning_setup(two, runtime="rccl", version=version)
        for size in (1 << 20, 16 << 20, 256 << 20):
            shape = call_shape(setup, "allreduce", "tree", "Simple", size)
            assert shape.chunk_bytes == _tree_chunk_by_hand(size // shape.channels, 8), \
                (version, size)
        # 1 MiB over any channel count: under one chunk a channel, so the floor of 32 KiB
        assert call_shape(setup, "allreduce", "tree", "Simple", 1 << 20).chunk_bytes == 32 << 10


def test_a_subjects_own_version_is_priced():
    """The version travels with the runtime value: a subject of NCCL 2.19 is priced at 2.19's
    rules by a model built for the newest (its tree's Simple chunk halves at mid sizes, so the
    pipeline fills sooner: two DGX-H100 nodes, 16 MiB)."""
    from collsynth.timing.pricing import RuntimeAlgorithm
    from collsynth.topology import compose_nodes

    two = compose_nodes(get_topology("dgx-h100"), 2)
    nccl = get_runtime("nccl")
    model = ProgramModel(nccl.defaults, runtime=nccl)
    assert model.tuning(two, nccl.at_version((2, 19))).version == (2, 19)
    assert model.tuning(two, "nccl").version == (2, 30)
    old = RuntimeAlgorithm(nccl.at_version((2, 19)), "tree", "allreduce", two, protocol="Simple")
    new = RuntimeAlgorithm(nccl, "tree", "allreduce", two, protocol="Simple")
    assert model.price(old, [16 << 20])[0].time_us < model.price(new, [16 << 20])[0].time_us
