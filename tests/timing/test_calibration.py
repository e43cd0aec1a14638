"""Calibration files (round trip, bad files), their use on topologies, ``collsynth calibrate``."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from collsynth.errors import (
    FileFormatError,
    InputTooLargeError,
    InvalidInstanceError,
    InvalidTopologyError,
    UnknownNameError,
)
from collsynth.timing import from_topology
from collsynth.timing import calibration as calibration_module
from collsynth.timing.calibration import (
    CurveCalibration,
    CalibrationEntry,
    calibration_from_fits,
    calibration_from_json,
    egress_units,
    load_calibration,
    calibration_steps,
    save_calibration,
)
from collsynth.timing.fit import fit_log
from collsynth.timing.logs import load_log
from collsynth.topology import get_topology

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT / "data" / "nccl-tests"
FIXTURES = ROOT / "tests" / "fixtures" / "logs"
BAD = ROOT / "tests" / "fixtures" / "bad"
V100 = SHARED / "V100-8gpu-dgx1topo_all_reduce_konnase.txt"
A100_AR = SHARED / "A100-8gpu_all_reduce_superbench.txt"
A100_AG = SHARED / "A100-8gpu_all_gather_superbench.txt"
TWO_NODE = SHARED / "A100-16gpu-2node-p4d_all_reduce_awsdocs.txt"


@pytest.fixture(scope="module")
def a100() -> CurveCalibration:
    if not SHARED.is_dir():
        pytest.fail(f"{SHARED} is missing: the tests read the repository's data/nccl-tests")
    return calibration_from_fits("DGX-A100", [fit_log(load_log(p)) for p in (A100_AG, A100_AR)])


# -- the file -------------------------------------------------------------------------------------


def test_round_trip(a100: CurveCalibration, tmp_path: Path):
    path = tmp_path / "sub" / "a100.json"
    path.parent.mkdir()  # writers never create missing folders
    save_calibration(a100, path)
    again = load_calibration(path)
    assert again == a100
    assert [e.params for e in again.entries] == [e.params for e in a100.entries]
    obj = json.loads(path.read_text())
    assert (obj["format"], obj["version"], obj["kind"], obj["topology"]) == (
        "collsynth-calibration", 2, "curve", "DGX-A100")
    assert [(e["collective"], e["model"]) for e in obj["entries"]] == [
        ("allgather", "alpha-beta"), ("allgather", "piecewise"),
        ("allreduce", "alpha-beta"), ("allreduce", "piecewise")]
    for entry in obj["entries"]:
        assert {"file", "collective", "ranks", "model", "alpha_us", "busbw_gbps", "gmae"} <= set(
            entry)
        assert 0 <= entry["gmae"] < 1
    assert {"knee_bytes", "saturation_bytes"} <= set(obj["entries"][1])


def _valid() -> dict:
    return {"format": "collsynth-calibration", "version": 1, "topology": "dgx1", "entries": [
        {"file": "ar.txt", "collective": "all_reduce", "ranks": 8, "model": "alpha-beta",
         "alpha_us": 48.5, "beta_us_per_byte": 1.45e-05, "busbw_gbps": 120.3, "gmae": 0.08},
        {"file": "ar.txt", "collective": "allreduce", "ranks": 8, "model": "piecewise",
         "alpha_us": 48.7, "busbw_gbps": 129.0, "knee_bytes": 16384,
         "saturation_bytes": 134217728, "sigmoid_low_gbps": 0.0175, "sigmoid_high_gbps": 209.1,
         "center_bytes": 57577.0, "steepness": 0.278, "gmae": 0.022, "gmae_rows": 0.023}]}


def test_one_format_of_two_kinds_and_the_files_of_earlier_versions(tmp_path: Path):
    from collsynth.runtimes import get_runtime
    from collsynth.timing.calibration import RuntimeCalibration

    # runtime constants: written as version 2 of the one format, with their kind
    fitted = RuntimeCalibration(get_runtime("rccl").defaults.replace(channels=2,
                                                                     source="fitted"))
    path = tmp_path / "rt.json"
    save_calibration(fitted, path)
    obj = json.loads(path.read_text())
    assert (obj["format"], obj["version"], obj["kind"], obj["runtime"]) == (
        "collsynth-calibration", 2, "runtime-constants", "rccl")
    assert load_calibration(path) == fitted
    # a collsynth-runtime-constants file of version 1 is read as runtime constants
    legacy = {k: v for k, v in obj.items() if k not in ("format", "version", "kind")}
    path.write_text(json.dumps({"format": "collsynth-runtime-constants", "version": 1,
                                **legacy}))
    assert load_calibration(path) == fitted
    # a curve file of version 1 (no kind) is a curve calibration
    assert load_calibration_text(tmp_path, _valid()).kind == "curve"
    # version 2 names its kind
    for kind, message in ((KeyError, "kind: missing"), ("fits", "kind: 'fits'; expected one of "
                                                                "curve, runtime-constants")):
        bad = {**_valid(), "version": 2}
        if kind is not KeyError:
            bad["kind"] = kind
        with pytest.raises(FileFormatError, match=message):
            load_calibration_text(tmp_path, bad)
    with pytest.raises(FileFormatError, match="unknown field 'entries'; the fields are"):
        load_calibration_text(tmp_path, {**_valid(), "version": 2, "kind": "runtime-constants"})


def load_calibration_text(folder: Path, obj: dict):
    path = folder / "c.json"
    path.write_text(json.dumps(obj))
    return load_calibration(path)


def test_minimal_file_reads():
    # _valid() is a file as written before the piecewise curve was made continuous: with the
    # sigmoid's ends, without min_bytes, latency_exponent, nodes, runtime or held-out errors.
    calibration = calibration_from_json(_valid())
    assert [e.collective for e in calibration.entries] == ["allreduce", "allreduce"]
    assert calibration.entries[0].gmae_rows is None
    assert calibration.nodes == 1
    assert all(e.gmae_heldout is None and e.runtime is None and e.channels is None
               for e in calibration.entries)


def _edit(path: list, value: object) -> dict:
    obj = _valid()
    target = obj
    for key in path[:-1]:
        target = target[key]
    if value is KeyError:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return obj


BAD_CALIBRATIONS = [
    (["format"], "collsynth-topology", r"format: 'collsynth-topology'; expected "
                                       r"'collsynth-calibration'"),
    (["version"], 3, r"version: 3; this collsynth reads versions 1 and 2"),
    (["topology"], "", r"topology: ''; expected a name"),
    (["entries"], {}, r"entries: expected a list"),
    (["extra"], 1, r"unknown field\(s\) 'extra'"),
    (["entries", 0], "x", r"entries\[0\]: expected an object"),
    (["entries", 0, "model"], "cubic", r"entries\[0\]\.model: 'cubic'; expected one of"),
    (["entries", 0, "ranks"], 0, r"entries\[0\]\.ranks: 0; expected a whole number from 2 to 1048576"),
    (["entries", 0, "ranks"], True, r"entries\[0\]\.ranks: True"),
    (["entries", 0, "file"], None, r"entries\[0\]\.file: None; expected a non-empty string"),
    (["entries", 0, "busbw_gbps"], KeyError, r"entries\[0\]: missing field\(s\) 'busbw_gbps'"),
    (["entries", 0, "busbw_gbps"], -3, r"entries\[0\]\.busbw_gbps: -3; expected 1e-06 to 1e\+06 GB/s"),
    (["entries", 0, "alpha_us"], "fast", r"entries\[0\]\.alpha_us: 'fast'; expected a finite"),
    (["entries", 0, "knee_bytes"], 64, r"entries\[0\]: unknown field\(s\) 'knee_bytes' for "
                                       r"model 'alpha-beta'"),
    (["entries", 1, "knee_bytes"], 1.5, r"entries\[1\]\.knee_bytes: 1\.5; expected a whole "
                                        r"number of bytes"),
    (["entries", 1, "gmae"], -0.1, r"entries\[1\]\.gmae: -0\.1; expected 0 to 3\.6e\+12"),
    (["entries", 1, "gmae"], KeyError, r"entries\[1\]\.gmae: None; expected a finite number"),
    (["entries", 0, "alpha_us"], 1e300, r"entries\[0\]\.alpha_us: 1e\+300; expected 1e-06 to "
                                        r"3\.6e\+09 us"),
    (["entries", 1, "knee_bytes"], 10 ** 30, r"entries\[1\]\.knee_bytes: 10{30}; expected at "
                                             r"most 1\.1259e\+15"),
    (["entries", 0, "collective"], "all\x00reduce", r"entries\[0\]\.collective = "
                                                    r"'all\\x00reduce': a control character"),
    (["nodes"], 0, r"nodes: 0; expected a whole number from 1 to 1048576"),
    (["nodes"], "2", r"nodes: '2'; expected a whole number from 1 to 1048576"),
    (["entries", 1, "gmae_heldout"], -1, r"entries\[1\]\.gmae_heldout: -1; expected 0 to 3\.6e\+12"),
    (["entries", 1, "channels"], 0, r"entries\[1\]\.channels: 0; expected a whole number from 1"),
    (["entries", 1, "channels"], 2.0, r"entries\[1\]\.channels: 2\.0; expected a whole number"),
    (["entries", 1, "runtime"], "", r"entries\[1\]\.runtime: ''; expected a non-empty string"),
    (["entries", 1, "runtime_version"], 2.18, r"entries\[1\]\.runtime_version: 2\.18; expected"),
    (["entries", 1, "latency_exponent"], -0.1, r"entries\[1\]\.latency_exponent: -0\.1; expected "
                                               r"0 to 0\.25"),
    (["entries", 1, "min_bytes"], 0, r"entries\[1\]\.min_bytes: 0; expected a whole number"),
]


@pytest.mark.parametrize("path,value,message", BAD_CALIBRATIONS,
                         ids=[".".join(map(str, c[0])) + f"={c[1]!r}" for c in BAD_CALIBRATIONS])
def test_bad_calibration(tmp_path: Path, path: list, value: object, message: str):
    file = tmp_path / "bad.json"
    file.write_text(json.dumps(_edit(path, value)))
    with pytest.raises(FileFormatError, match=message) as info:
        load_calibration(file)
    assert info.value.path == str(file)


def test_bad_calibration_text(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    file = tmp_path / "c.json"
    file.write_text('{\n "format": "collsynth-calibration",\n "version": 1,\n "topology": }\n')
    with pytest.raises(FileFormatError, match=r"c\.json: malformed JSON at line 4 column 14"):
        load_calibration(file)
    file.write_bytes(b'{"format": "\xff"}')
    with pytest.raises(FileFormatError, match="not UTF-8"):
        load_calibration(file)
    with pytest.raises(FileFormatError, match="no such file"):
        load_calibration(tmp_path / "missing.json")
    file.write_text(json.dumps(_valid()))
    monkeypatch.setattr(calibration_module, "MAX_CALIBRATION_BYTES", 100)
    with pytest.raises(InputTooLargeError, match="more than the 100"):
        load_calibration(file)


def test_entry_checks_its_figures():
    with pytest.raises(InvalidInstanceError, match="busbw_gbps"):
        CalibrationEntry("f", "allreduce", 8, "alpha-beta",
                         {"alpha_us": 1.0, "beta_us_per_byte": 1e-5, "busbw_gbps": 0.0})


# -- alpha_beta_for -------------------------------------------------------------------------------


def test_alpha_beta_for(a100: CurveCalibration):
    line = a100.entries_for("allreduce", model="alpha-beta")[0]
    for spelling in ("allreduce", "all_reduce", "AllReduce", "all-reduce"):
        model = a100.alpha_beta_for(spelling)
        assert (model.alpha_us, model.beta_us_per_byte) == (line.params["alpha_us"],
                                                           line.params["beta_us_per_byte"])
    # The whole collective as measured: the line reproduces the 8 GiB time within 3%.
    model = a100.alpha_beta_for("allgather")
    assert model.alpha_us + 8589934592 * model.beta_us_per_byte == pytest.approx(
        (33646 + 32669) / 2, rel=0.03)
    with pytest.raises(UnknownNameError, match="no fit for 'broadcast'; it has: allgather "
                                               r"\(8 ranks\), allreduce \(8 ranks\)"):
        a100.alpha_beta_for("broadcast")


def test_alpha_beta_for_piecewise_only_and_several_rank_counts():
    only = CurveCalibration("x", tuple(e for e in calibration_from_json(_valid()).entries
                                  if e.model == "piecewise"))
    model = only.alpha_beta_for("allreduce")
    assert model.alpha_us == 48.7
    assert model.beta_us_per_byte == pytest.approx(1.75 / (129.0 * 1e3))
    mixed = calibration_from_fits("mixed", [fit_log(load_log(p)) for p in (A100_AR, TWO_NODE)])
    with pytest.raises(UnknownNameError, match="allreduce fits for 8, 16 ranks; say which"):
        mixed.alpha_beta_for("allreduce")
    assert mixed.alpha_beta_for("allreduce", ranks=16).alpha_us > 100


# -- apply ----------------------------------------------------------------------------------------


def test_apply_dgx1_from_the_v100_log():
    calibration = calibration_from_fits("dgx1", [fit_log(load_log(V100))])
    line = calibration.entries_for("allreduce", model="alpha-beta")[0]
    dgx1 = calibration.apply(get_topology("dgx1"))
    # busbw over the 6 NVLinks a DGX-1 GPU sends on; alpha over the ring's 2 * 7 steps.
    assert dgx1.unit_gbps == pytest.approx(line.busbw_gbps / 6)
    assert dgx1.alpha_us == pytest.approx(line.alpha_us / 14)
    assert 15 < dgx1.unit_gbps < 25  # V100 NVLink2: 25 GB/s per direction on paper
    assert dgx1.links == get_topology("dgx1").links
    assert calibration.applied_entry(get_topology("dgx1")) is line  # the one applied
    assert "calibration" not in dgx1.metadata   # provenance is the calibration's, not the topology's
    model = from_topology(dgx1)
    assert model.beta_us_per_byte == pytest.approx(1 / (dgx1.unit_gbps * 1e3))


def test_apply_prefers_allreduce_and_checks_ranks(a100: CurveCalibration):
    topology = a100.apply(get_topology("DGX-A100"))
    entry = a100.entries_for("allreduce", model="alpha-beta")[0]
    assert a100.applied_entry(get_topology("DGX-A100")).collective == "allreduce"
    assert topology.unit_gbps == pytest.approx(entry.busbw_gbps / 12)
    assert topology.alpha_us == pytest.approx(entry.alpha_us / 14)
    with pytest.raises(InvalidTopologyError, match="has fits for 8 ranks; topology 'DGX2' has "
                                                   "16"):
        a100.apply(get_topology("dgx2"))


def test_egress_units_and_ring_steps():
    assert egress_units(get_topology("DGX-A100")) == 12  # capped by its switch groups
    assert egress_units(get_topology("hub:4")) == 1
    # NCCL's ring: 2(n-1) steps for allreduce, n for broadcast (ncclTopoTuneModel's nsteps);
    # alltoall runs as n-1 messages per rank.
    assert calibration_steps("allreduce", 8) == 14 and calibration_steps("alltoall", 8) == 7
    assert calibration_steps("broadcast", 8) == 8 and calibration_steps("broadcast", 1) == 1


# -- the command line -----------------------------------------------------------------------------


def _run(argv: list[str]) -> int:
    from collsynth.cli import main

    return main(argv)


def test_cli_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    out = tmp_path / "cal.json"
    logs = [str(V100), str(FIXTURES / "param_comms_tabs.txt")]
    assert _run(["calibrate", *logs, "--topology", "dgx1", "-o", str(out), "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert [(o["file"], o["model"]) for o in printed] == [
        (logs[0], "alpha-beta"), (logs[0], "piecewise"),
        (logs[1], "alpha-beta"), (logs[1], "piecewise")]
    for obj in printed:
        assert (obj["collective"], obj["ranks"]) == ("allreduce", 8)
        assert obj["alpha_us"] > 0 and obj["busbw_gbps"] > 0 and 0 <= obj["gmae"] < 1
    assert {"knee_bytes", "saturation_bytes", "center_bytes", "steepness"} <= set(printed[1])
    assert {"beta_us_per_byte", "algbw_gbps"} <= set(printed[0])
    saved = load_calibration(out)
    assert saved.topology == "dgx1"
    assert [e.to_json() for e in saved.entries] == printed


def test_cli_table_and_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    out, plot = tmp_path / "cal.json", tmp_path / "plots" / "fit.svg"
    plot.parent.mkdir()  # writers never create missing folders
    assert _run(["calibrate", str(A100_AR), "--topology", "DGX-A100", "-o", str(out),
                 "--plot", str(plot)]) == 0
    text = capsys.readouterr().out
    assert "alpha-beta" in text and "piecewise" in text and f"wrote {out} and {plot}" in text
    assert b"<svg" in plot.read_bytes()[:1000]


def test_cli_errors_write_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    out = tmp_path / "cal.json"
    assert _run(["calibrate", str(V100), str(BAD / "log_truncated_row_all_reduce.txt"),
                 "--topology", "dgx1", "-o", str(out)]) == 1
    assert "line 34" in capsys.readouterr().err
    assert not out.exists()
    assert _run(["calibrate", str(V100), "--topology", "dgx1", "-o", str(out), "--plot",
                 "f.jpg"]) == 2  # a usage error


def test_cli_overrides(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    log = BAD / "log_no_ranks_all_reduce.txt"
    assert _run(["calibrate", str(log), "--topology", "x", "-o", str(tmp_path / "c.json"),
                 "--ranks", "8", "--collective", "allreduce", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["ranks"] == 8


def test_main_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    from collsynth.cli import main

    out = tmp_path / "cal.json"
    assert main(["calibrate", str(V100), "--topology", "dgx1", "-o", str(out), "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)) == 2
    assert main(["calibrate", str(BAD / "log_bad_time_all_reduce.txt"), "--topology", "dgx1",
                 "-o", str(out)]) == 1
    assert "line 30" in capsys.readouterr().err
    assert main(["calibrate", str(V100), "--topology", "dgx1", "-o", str(out),
                 "--plot", "x.gif"]) == 2
    assert math.isfinite(load_calibration(out).entries[0].alpha_us)


MI250 = ROOT / "data" / "measurements" / "mi250-16gcd-x2" / "rccl_all_gather_outofplace.csv"


def test_cli_csv_nodes_runtime_and_heldout(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    """The MI250 CSV: its rank count, runtime and channels come from the options (its README
    says RCCL 2.18.3 with NCCL_MAX_NCHANNELS=2 on 2 nodes of 16 GCDs)."""
    out = tmp_path / "mi250.json"
    assert _run(["calibrate", str(MI250), "--topology", "mi250-16gcd", "--nodes", "2",
                 "--ranks", "32", "--runtime", "rccl-2.18.3", "--channels", "2", "-o", str(out),
                 "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert [o["model"] for o in printed] == ["alpha-beta", "piecewise"]
    for obj in printed:
        assert (obj["collective"], obj["ranks"], obj["runtime"], obj["runtime_version"],
                obj["channels"]) == ("allgather", 32, "rccl", "2.18.3", 2)
        assert 0 < obj["gmae"] and 0 < obj["gmae_heldout"] < 1
    assert printed[1]["gmae"] <= 0.05 and printed[1]["min_bytes"] == 512
    saved = load_calibration(out)
    assert (saved.topology, saved.nodes) == ("mi250-16gcd", 2)
    assert [e.to_json() for e in saved.entries] == printed
    assert json.loads(out.read_text())["nodes"] == 2
    # The table: runtime, channels and the held-out error beside the in-sample one.
    assert _run(["calibrate", str(MI250), "--topology", "mi250-16gcd", "--nodes", "2",
                 "--ranks", "32", "-o", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[-2:] == ["gmae", "heldout"] and "runtime" in lines[0]
    piecewise = next(line for line in lines if " piecewise " in line)
    gmae_cell, heldout_cell = piecewise.split()[-2:]
    assert gmae_cell == f"{100 * printed[1]['gmae']:.1f}%"
    assert heldout_cell == f"{100 * printed[1]['gmae_heldout']:.1f}%"
    assert piecewise.split()[3:5] == ["-", "-"]  # no runtime, no channels: the CSV does not say
    assert "calibration for 'mi250-16gcd x 2 nodes'" in lines[-1]
    assert load_calibration(out).entries[0].runtime is None
    assert _run(["calibrate", str(MI250), "--topology", "x", "--nodes", "0", "-o",
                 str(out)]) == 2  # a usage error


@pytest.mark.parametrize("entry,fields,message", [
    # alpha-beta: the fit's latency regime ends below where its bandwidth regime starts
    (0, {"latency_max_bytes": 65536, "bandwidth_min_bytes": 10},
     r"entries\[0\]\.bandwidth_min_bytes: 10; expected above latency_max_bytes = 65536"),
    (0, {"latency_max_bytes": 4096, "bandwidth_min_bytes": 4096},
     r"entries\[0\]\.bandwidth_min_bytes: 4096; expected above latency_max_bytes = 4096"),
    # piecewise: first size <= knee <= saturation
    (1, {"saturation_bytes": 1}, r"entries\[1\]\.saturation_bytes: 1; expected at least "
                                 r"knee_bytes = 16384"),
    (1, {"min_bytes": 32768}, r"entries\[1\]\.knee_bytes: 16384; expected at least "
                              r"min_bytes = 32768"),
])
def test_an_entrys_sizes_in_the_wrong_order_are_refused(tmp_path: Path, entry, fields, message):
    """A hand-edited calibration whose sizes contradict one another (no fit writes them so)
    was read: a bandwidth regime starting below the latency regime's end, a saturation below
    the knee (hostile input, round 16)."""
    data = _valid()
    data["entries"][entry].update(fields)
    file = tmp_path / "bad.json"
    file.write_text(json.dumps(data))
    with pytest.raises(FileFormatError, match=message):
        load_calibration(file)
    # the same figures in order are read
    ordered = _valid()
    ok = tmp_path / "ok.json"
    ordered["entries"][0].update({"latency_max_bytes": 4096, "bandwidth_min_bytes": 65536})
    ordered["entries"][1].update({"min_bytes": 8, "saturation_bytes": 16384})
    ok.write_text(json.dumps(ordered))
    load_calibration(ok)
