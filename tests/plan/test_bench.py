"""``collsynth bench`` on CPU: dry runs, and runs of a fake ``all_gather_perf`` on a temporary PATH
that prints recorded rccl-tests logs (tests/fixtures/bench) and records how it was started.

The algorithm is a 2-step allgather on a 4-ring, exported for rccl: one chunk per rank, so
nchunksperloop is 4 and every size must be a multiple of 4 elements x 4 bytes (and of 4 ranks x 4
bytes, for nccl-tests to split it): 1KiB:8KiB gives 1024, 2048, 4096 and 8192 bytes.

Recorded logs (by hand, out-of-place / in-place microseconds):

* default run: 20/22, 21/23, 23/25, 27/29 at 1, 2, 4, 8 KiB; RCCL 2.18.3+hip6.0, 2 ring channels;
* xml run: 10/22, 12/23, 16/25 (2 wrong at 4 KiB), no 8 KiB row. The program is declared for
  out-of-place calls only, so only the first half is compared: speed-ups 2.00x, 1.75x, 1.44x.
"""

from __future__ import annotations

import dataclasses
import json
import os
import stat
from pathlib import Path

import pytest

from collsynth import cli
from collsynth.algorithm import Algorithm, Send, Step, verify
from collsynth.algorithm.fileformat import save_algorithm
from collsynth.collective import allgather
from collsynth.export.xml_reader import read_program
from collsynth.plan.bench import BenchError, BenchOptions, prepare_bench
from collsynth.timing.calibration import load_calibration
from collsynth.topology.families import ring

ROOT = Path(__file__).resolve().parents[2]
RECORDED = ROOT / "tests" / "fixtures" / "bench"
XML_8 = ROOT / "data" / "msccl-xml" / "generated" / "allgather_ring_8g_1ch_1i.xml"

FAKE = """#!/bin/sh
label=default
if [ "${RCCL_MSCCL_ENABLE:-}" = "1" ] && [ -n "${MSCCL_ALGO_DIR:-}" ]; then label=xml; fi
echo "$@" > "$FAKE_RECORD/$label.args"
env | sort > "$FAKE_RECORD/$label.env"
ls "${MSCCL_ALGO_DIR:-/nonexistent}" > "$FAKE_RECORD/$label.dir" 2>/dev/null || true
cat "$FAKE_LOGS/rccl_all_gather_$label.txt"
exit "${FAKE_EXIT:-0}"
"""


def two_step() -> Algorithm:
    topology = dataclasses.replace(ring(4), unit_gbps=10.0, alpha_us=2.0)
    s1 = tuple(Send(r, r, d) for r in range(4) for d in ((r + 1) % 4, (r - 1) % 4))
    s2 = tuple(Send((r - 1) % 4, r, (r + 1) % 4) for r in range(4))
    return verify(Algorithm("two_step", topology, allgather(4), (Step(1, s1), Step(1, s2))))


@pytest.fixture
def algo(tmp_path: Path) -> Path:
    path = tmp_path / "two_step.json"
    save_algorithm(two_step(), path)
    return path


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A bin folder with the fake all_gather_perf first on PATH; returns the record folder."""
    bin_dir, record = tmp_path / "bin", tmp_path / "record"
    bin_dir.mkdir()
    record.mkdir()
    binary = bin_dir / "all_gather_perf"
    binary.write_text(FAKE)
    binary.chmod(binary.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    monkeypatch.setenv("FAKE_RECORD", str(record))
    monkeypatch.setenv("FAKE_LOGS", str(RECORDED))
    return record


def run(capsys: pytest.CaptureFixture[str], *argv: object) -> tuple[int, str, str]:
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def _env(path: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)


def test_measured_against_the_runtime(algo: Path, fake: Path, tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]):
    out = tmp_path / "bench"
    code, text, err = run(capsys, "bench", algo, "--ranks", 4, "--runtime", "rccl", "--sizes",
                          "1KiB:8KiB", "-o", out, "--topology", "ring:4")
    assert code == 0, err
    # The runs: the same command, MSCCL off for the default, the program's folder for the xml.
    for label in ("default", "xml"):
        assert (fake / f"{label}.args").read_text().split() == [
            "-b", "1024", "-e", "8192", "-f", "2", "-g", "4", "-c", "1", "-n", "20", "-w", "5",
            "-d", "float"]
    default_env, xml_env = _env(fake / "default.env"), _env(fake / "xml.env")
    assert default_env["RCCL_MSCCL_ENABLE"] == "0" and "MSCCL_ALGO_DIR" not in default_env
    # The runs happen in a staging folder that becomes DIR only when everything succeeded
    # (the scripts find their files by $PWD): the runtime scanned its xml/ folder.
    assert Path(xml_env["MSCCL_ALGO_DIR"]).is_absolute()
    assert Path(xml_env["MSCCL_ALGO_DIR"]).name == "xml"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging left
    assert (xml_env["RCCL_MSCCL_ENABLE"], xml_env["RCCL_MSCCL_FORCE_ENABLE"]) == ("1", "1")
    assert xml_env["NCCL_DEBUG"] == default_env["NCCL_DEBUG"] == "INFO"
    # The folder the runtime scans holds the program only: a 4-rank rccl allgather.
    assert (fake / "xml.dir").read_text().split() == ["two_step.xml"]
    program = read_program(out / "xml" / "two_step.xml", runtime="rccl")
    assert (program.coll, program.ngpus, program.nchunksperloop) == ("allgather", 4, 4)
    # What was measured: out-of-place halves only; the 8 KiB xml row does not exist.
    obj = json.loads((out / "bench.json").read_text())
    assert obj["measured"] is True and obj["dry_run"] is False
    rows = [(r["size_bytes"], r["default_us"], r["xml_us"], r["xml_wrong"])
            for r in obj["results"]]
    assert rows == [(1024, 20.0, 10.0, 0.0), (2048, 21.0, 12.0, 0.0), (4096, 23.0, 16.0, 2.0),
                    (8192, 27.0, None, None)]
    assert all(r["runs_program"] for r in obj["results"])
    assert obj["runtime_measured"] == {"runtime": "rccl", "runtime_version": "2.18.3+hip6.0",
                                       "channels": 2}
    report = (out / "report.md").read_text()
    assert "| 1024 | 20 | 10 | yes | 2.00x |" in report
    assert "| 2048 | 21 | 12 | yes | 1.75x |" in report
    assert "| 4096 | 23 | 16 | yes, 2 wrong | 1.44x |" in report
    assert "| 8192 | 27 | — | yes | — |" in report
    assert "wrong results with the program at 1 size(s)" in report
    assert "the logs hold 4 sizes" not in report  # the default log holds every size asked
    # Predictions are labelled as such, one per measured size: the program as benchmarked and
    # the runtime's ring, both by the program model with constants fitted on the default run.
    program_key = "two_step (program-model, rccl constants (fitted on the default run))"
    ring_key = ("runtime fastest (rccl-ring, program-model, rccl constants (fitted on the "
                "default run))")
    assert f"predicted: {program_key}" in report and f"predicted: {ring_key}" in report
    predicted = obj["predicted"]
    assert predicted["model"] == "program-model"
    assert [p["size_bytes"] for p in predicted["program"]] == [1024, 2048, 4096, 8192]
    # The ring's prediction reproduces the default run it was fitted on (same yardstick), and
    # the program is priced from its XML, as benchmarked.
    for price, measured in zip(predicted["runtime"], (20.0, 21.0, 23.0, 27.0)):
        assert price["name"] == "rccl-ring"
        assert price["time_us"] == pytest.approx(measured, rel=0.15)
    from collsynth.timing.runtime_fit import fit_runtime
    from collsynth.timing.runtime_model import simulate_program

    fitted = fit_runtime([(1024, 20.0), (2048, 21.0), (4096, 23.0), (8192, 27.0)],
                         two_step().topology, "allgather", runtime="rccl", channels=2,
                         held_out=False).constants
    bench_program = read_program(out / "xml" / "two_step.xml", runtime="rccl")
    for size, price in zip((1024, 2048, 4096, 8192), predicted["program"]):
        assert price["time_us"] == pytest.approx(simulate_program(
            bench_program, two_step().topology, size, fitted).time_us, rel=1e-9)
        assert price["time_us"] >= 12.0   # never below RCCL's documented base latency
    # The calibration of the default run: its runtime and channels as the log says.
    calibration = load_calibration(out / "calibration.json")
    assert calibration.topology == "ring:4"
    entry = calibration.entries[0]
    assert (entry.collective, entry.ranks, entry.runtime, entry.runtime_version,
            entry.channels) == ("allgather", 4, "rccl", "2.18.3+hip6.0", 2)
    assert (out / "plot.png").read_bytes().startswith(b"\x89PNG")
    assert "1024" in text and "measured: wrote" in text
    # The same logs read again without running anything (e.g. after a run elsewhere).
    for path in fake.iterdir():
        path.unlink()
    code, _, err = run(capsys, "bench", algo, "--ranks", 4, "--runtime", "rccl", "--sizes",
                       "1KiB:8KiB", "-o", out, "--from-logs")
    assert code == 0, err
    assert not list(fake.iterdir())  # the fake binary was not started
    assert "| 2048 | 21 | 12 | yes | 1.75x |" in (out / "report.md").read_text()


def test_dry_run_measures_nothing(algo: Path, fake: Path, tmp_path: Path,
                                  capsys: pytest.CaptureFixture[str]):
    out = tmp_path / "dry"
    code, text, err = run(capsys, "bench", algo, "--ranks", 4, "--runtime", "rccl", "--sizes",
                          "1000:5000", "-o", out, "--dry-run")
    assert code == 0, err
    assert "dry run" in text and "nothing was run, nothing measured" in text
    assert not list(fake.iterdir())  # the binary is on PATH, and was not started
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "bench.json", "run_default.sh",
                                                     "run_xml.sh", "xml"]
    assert "Dry run: these commands were written, not run. Nothing was measured." in (
        out / "README.md").read_text()
    obj = json.loads((out / "bench.json").read_text())
    assert (obj["dry_run"], obj["measured"]) == (True, False) and "results" not in obj
    # Sizes: multiples of 16 bytes from 1000 up, doubling: 1008, 2016, 4032.
    assert obj["sizes"] == [1008, 2016, 4032]
    script = (out / "run_xml.sh").read_text()
    assert 'export MSCCL_ALGO_DIR="$PWD/xml"' in script
    assert "all_gather_perf -b 1008 -e 4032 -f 2 -g 4" in script
    assert "unset MSCCL_ALGO_DIR" in (out / "run_default.sh").read_text()


def test_without_the_binary_nothing_is_measured(algo: Path, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]):
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    out = tmp_path / "b"
    code, text, err = run(capsys, "bench", algo, "--ranks", 4, "--runtime", "rccl", "-o", out)
    assert code == 1
    assert "all_gather_perf not on PATH" in err and "measured nothing" in err
    assert "wrote nothing" in err and "--dry-run" in err
    assert text == ""
    # A failed command leaves no output (--dry-run writes the scripts to run elsewhere).
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == [
        "empty-bin", "two_step.json"]


def test_a_failed_run_reports_no_figure(algo: Path, fake: Path, tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture[str]):
    monkeypatch.setenv("FAKE_EXIT", "3")
    out = tmp_path / "b"
    code, text, err = run(capsys, "bench", algo, "--ranks", 4, "--runtime", "rccl", "--sizes",
                          "1KiB:8KiB", "-o", out)
    assert code == 1 and "the default run (run_default.sh) failed with exit status 3" in err
    assert "default us" not in text
    assert not out.exists()  # the scripts ran in a staging folder, removed with the failure
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_refusals(algo: Path, tmp_path: Path):
    with pytest.raises(BenchError, match=r"for 8 ranks \(ngpus\), not --ranks 4"):
        prepare_bench(XML_8, BenchOptions(runtime="msccl", ranks=4))
    with pytest.raises(BenchError, match="for 4 ranks"):
        prepare_bench(algo, BenchOptions(runtime="rccl", ranks=8))
    with pytest.raises(BenchError, match="one GPU per process.*--launcher"):
        prepare_bench(algo, BenchOptions(runtime="msccl-executor", ranks=4))
    with pytest.raises(BenchError, match="no size from 1 to 8 bytes is a multiple of 16"):
        prepare_bench(algo, BenchOptions(runtime="rccl", ranks=4, min_bytes=1, max_bytes=8))


def test_xml_input_and_launcher(tmp_path: Path):
    """An 8-rank msccl ring allgather from data/: in place, nchunksperloop 8, LL128; a launcher
    starts one process per GPU (-g 1). msccl's maxBytes is exclusive, 128 MiB when absent."""
    setup = prepare_bench(XML_8, BenchOptions(runtime="msccl", ranks=8, min_bytes=1 << 26,
                                              max_bytes=1 << 28,
                                              launcher="mpirun -np {ranks} --bind-to numa"))
    program = setup.program
    assert (program.collective, program.nchunksperloop, program.halves) == (
        "allgather", 8, ("in-place",))
    assert setup.sizes == (1 << 26, 1 << 27, 1 << 28)
    assert [setup.runs_program(s) for s in setup.sizes] == [True, False, False]
    assert setup.runs[1].command[:5] == ("mpirun", "-np", "8", "--bind-to", "numa")
    assert setup.runs[1].command[5:10] == ("all_gather_perf", "-b", str(1 << 26), "-e",
                                           str(1 << 28))
    assert setup.runs[1].command[setup.runs[1].command.index("-g") + 1] == "1"
    env = {v.name: v.value for v in setup.runs[1].env}
    assert env["MSCCL_XML_FILES"] == f"$PWD/xml/{program.file_name}"
    assert "2 of the 3 sizes are outside the program's byte range" in " ".join(setup.notes)
