"""Tests of the command line, in process: ``main([...])`` with stdout and stderr captured.

Every subcommand's happy path, and every exit code (see :data:`collsynth.cli.EXIT_CODES`).
Cases are small (ring:4, fully-connected:4); DGX1's allgather front is solved once.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from collsynth import cli
from collsynth.algorithm.fileformat import load_algorithm
from collsynth.algorithm.model import Instance
from collsynth.cli import (
    EXIT_ERROR,
    EXIT_OK,
    EXIT_TIMEOUT,
    EXIT_UNSATISFIABLE,
    EXIT_USAGE,
    main,
)
from collsynth.collective import standard_collective
from collsynth.synthesis import SolveOptions, Status, SynthesisResult, solve_instance
from collsynth.topology import get_topology

ROOT = Path(__file__).resolve().parents[1]
BAD = ROOT / "tests" / "fixtures" / "bad"
EXAMPLE = ROOT / "examples" / "custom_collective_pairs.json"


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """``main(argv)`` -> (exit code, stdout, stderr)."""
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(err: str, fragment: str) -> None:
    """stderr is exactly one line, a ``collsynth...: error:`` line containing ``fragment``."""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("collsynth") and ": error: " in lines[0], err
    assert fragment in lines[0], err
    assert "Traceback" not in err


# -- topologies -----------------------------------------------------------------------------------


def test_topologies_table(capsys):
    code, out, err = run_cli(capsys, "topologies")
    assert code == EXIT_OK
    header = out.splitlines()[0]
    assert header.split(" | ")[0].strip() == "name" and "description" in header
    assert any(line.startswith("DGX1 ") and "| " in line for line in out.splitlines())
    assert "ring:N" in out and err == ""


def test_topologies_json(capsys):
    code, out, _ = run_cli(capsys, "topologies", "--json")
    assert code == EXIT_OK
    rows = {row["name"]: row for row in json.loads(out)}
    assert rows["DGX1"]["ranks"] == 8
    assert rows["ring:N"]["ranks"] is None
    assert all(set(row) == {"name", "ranks", "description"} for row in rows.values())


# -- bounds ---------------------------------------------------------------------------------------


def test_bounds_json_dgx1_allgather(capsys):
    code, out, _ = run_cli(capsys, "bounds", "dgx1", "allgather", "--json")
    assert code == EXIT_OK
    data = json.loads(out)
    assert data["steps_lower_bound"] == 2
    assert data["rounds_per_chunk_lower_bound"] == "7/6"
    assert data["topology"] == "DGX1" and data["collective"] == "allgather(n=8)"
    assert data["composed_rounds_per_chunk_lower_bound"] is None


def test_bounds_allreduce_has_composed_bounds(capsys):
    code, out, _ = run_cli(capsys, "bounds", "ring:4", "allreduce", "--json")
    assert code == EXIT_OK
    data = json.loads(out)
    assert data["steps_lower_bound"] == 2
    assert data["rounds_per_chunk_lower_bound"] == "1/2"
    assert data["composed_steps_lower_bound"] == 4
    assert data["composed_rounds_per_chunk_lower_bound"] == "3/4"


def test_bounds_text_with_root(capsys):
    code, out, err = run_cli(capsys, "bounds", "ring:4", "broadcast", "--root", "2")
    assert code == EXIT_OK and err == ""
    assert "broadcast(n=4, root=2) on ring:4" in out
    assert "steps >= 2" in out and "rounds/chunk >= " in out


def test_bounds_multiroot(capsys):
    code, out, _ = run_cli(capsys, "bounds", "ring:4", "multiroot_broadcast", "--root", "0,2",
                           "--json")
    assert code == EXIT_OK
    assert json.loads(out)["collective"] == "multiroot_broadcast(n=4, roots=0,2)"


def test_bounds_nodes(capsys):
    code, out, _ = run_cli(capsys, "bounds", "ring:4", "allgather", "--nodes", "2",
                           "--nic-units", "1", "--json")
    assert code == EXIT_OK
    assert json.loads(out)["num_ranks"] == 8


def test_bounds_custom_collective(capsys):
    code, out, _ = run_cli(capsys, "bounds", "dgx1", EXAMPLE, "--json")
    assert code == EXIT_OK
    assert json.loads(out)["collective"] == "pairs(n=8)"


# -- solve ----------------------------------------------------------------------------------------


def test_solve_instance_json_to_file(capsys, tmp_path):
    target = tmp_path / "ag.json"
    code, out, err = run_cli(capsys, "solve", "instance", "ring:4", "allgather", "--steps", "2",
                             "--rounds", "3", "--chunks", "2", "-o", target, "--json")
    assert code == EXIT_OK
    assert err == ""  # --json: no progress lines
    [row] = json.loads(out)
    assert row == {**row, "steps": 2, "rounds": 3, "chunks": 2, "rounds_per_chunk": "3/2",
                   "status": "sat", "file": str(target)}
    assert isinstance(row["seconds"], float)
    algorithm = load_algorithm(target)
    assert (algorithm.num_steps, algorithm.num_rounds, algorithm.chunks) == (2, 3, 2)
    assert algorithm.provenance["command"] == "solve instance"


def test_solve_instance_text_and_progress(capsys):
    code, out, err = run_cli(capsys, "solve", "instance", "fully-connected:4", "allgather",
                             "--steps", "1", "--extra-memory", "0")
    assert code == EXIT_OK
    assert "found: steps=1 rounds=1 chunks=1" in out
    assert "  steps=1 rounds=1 chunks=1 extra_memory=0: sat (" in err  # progress line


def test_solve_instance_quiet_has_no_progress(capsys):
    code, _, err = run_cli(capsys, "solve", "instance", "ring:4", "allgather", "--steps", "2",
                           "--rounds", "2", "-q")
    assert code == EXIT_OK and err == ""


def test_solve_least_steps_to_directory(capsys, tmp_path):
    outdir = tmp_path / "out" / "nested"
    outdir.parent.mkdir()  # the folder named by -o is created, its parent must exist
    code, out, _ = run_cli(capsys, "solve", "least-steps", "ring:4", "reduce", "--root", "1",
                           "-o", outdir, "-q")
    assert code == EXIT_OK
    files = sorted(outdir.iterdir())
    assert [f.name for f in files] == ["reduce-ring_4-s2-r2-c1.json"]
    assert f"wrote {files[0]}" in out
    algorithm = load_algorithm(files[0])
    assert algorithm.collective.roots == (1,)
    assert any(send.reduce for step in algorithm.steps for send in step.sends)


def test_solve_pareto_dgx1_allgather(capsys, tmp_path):
    code, out, err = run_cli(capsys, "solve", "pareto", "dgx1", "allgather", "-o", tmp_path,
                             "--json")
    assert code == EXIT_OK and err == ""
    rows = json.loads(out)
    assert [(r["steps"], r["rounds_per_chunk"]) for r in rows] == [(2, "3/2"), (3, "7/6")]
    assert all(r["status"] == "sat" for r in rows)
    for row in rows:
        path = Path(row["file"])
        assert path.parent == tmp_path
        assert path.name == f"allgather-DGX1-s{row['steps']}-r{row['rounds']}-c{row['chunks']}.json"
        assert load_algorithm(path).rounds_per_chunk == Instance(
            steps=row["steps"], rounds=row["rounds"], chunks=row["chunks"]).rounds_per_chunk


def test_solve_pareto_text_table(capsys):
    code, out, err = run_cli(capsys, "solve", "pareto", "ring:4", "allgather")
    assert code == EXIT_OK
    lines = out.splitlines()
    assert lines[0] == "allgather(n=4) on ring:4 (4 ranks)"
    assert lines[1] == "lower bounds: steps >= 2, rounds/chunk >= 3/2"
    assert [c.strip() for c in lines[2].split("|")] == [
        "steps", "rounds", "chunks", "rounds/chunk", "seconds", "file"]
    cells = [c.strip() for c in lines[4].split("|")]
    assert cells[0] == "2" and cells[3] == "3/2" and cells[5] == "-"
    assert lines[-1].startswith("complete")
    assert "steps=2 rounds=" in err and ": sat (" in err


# -- show and verify ------------------------------------------------------------------------------


@pytest.fixture()
def algorithm_file(capsys, tmp_path) -> Path:
    target = tmp_path / "ring4.json"
    code, _, _ = run_cli(capsys, "solve", "instance", "ring:4", "allgather", "--steps", "2",
                         "--rounds", "2", "-o", target, "-q")
    assert code == EXIT_OK
    return target


def test_show(capsys, algorithm_file):
    code, out, _ = run_cli(capsys, "show", algorithm_file)
    assert code == EXIT_OK
    assert out.startswith("allgather-ring:4-s2-r2-c1: allgather(n=4) on ring:4 (4 ranks)")
    assert "step 0 (rounds=1" in out and "step 1 (rounds=1" in out
    code, out, _ = run_cli(capsys, "show", algorithm_file, "--max-sends", "1")
    assert code == EXIT_OK and "more links" in out


def test_verify(capsys, algorithm_file):
    code, out, err = run_cli(capsys, "verify", algorithm_file)
    assert code == EXIT_OK and err == ""
    assert out.strip() == (f"{algorithm_file}: correct allgather(n=4) on ring:4 (steps=2, "
                           "rounds=2, chunks=1, rounds/chunk=2)")


def test_verify_incorrect_algorithm(capsys):
    code, out, err = run_cli(capsys, "verify", BAD / "algorithm_send_removed.json")
    assert code == EXIT_ERROR and out == ""
    assert_one_line_error(err, "rank 1 never receives chunk 3")


# -- exit codes -----------------------------------------------------------------------------------


@pytest.mark.parametrize("argv, fragment", [
    (["solve", "pareto", "ring:4", "allgather", "--bogus"], "unrecognized arguments: --bogus"),
    (["solve", "instance", "ring:4", "allgather"], "--steps"),
    (["solve", "instance", "ring:4", "allgather", "--steps", "0"], "--steps"),
    (["solve", "pareto", "ring:4", "allgather", "--time-limit", "-1"], "seconds > 0"),
    (["solve", "pareto", "ring:4", "allgather", "--backend", "gurobi"], "invalid choice"),
    (["bounds", "ring:4", "broadcast", "--root", "zero"], "--root"),
    # Out of range either way is the same usage error (check and run say so too).
    (["bounds", "ring:4", "broadcast", "--root", "9"], "--root 9 is not a rank 0..3"),
    (["bounds", "ring:4", "broadcast", "--root", "-1"], "--root"),
    (["solve", "least-steps", "ring:4", "multiroot_broadcast", "--root", "0,4"],
     "--root 4 is not a rank 0..3"),
    (["frobnicate"], "invalid choice"),
    ([], "required"),
])
def test_usage_errors_exit_2(capsys, argv, fragment):
    code, out, err = run_cli(capsys, *argv)
    assert code == EXIT_USAGE
    assert_one_line_error(err, fragment)


def test_pareto_refuses_a_json_file_output(capsys, tmp_path):
    code, _, err = run_cli(capsys, "solve", "pareto", "ring:4", "allgather",
                           "-o", tmp_path / "front.json")
    assert code == EXIT_USAGE
    assert_one_line_error(err, "give a directory")
    assert not (tmp_path / "front.json").exists()


def test_help_returns_0(capsys):
    assert main(["--help"]) == EXIT_OK
    assert "solve" in capsys.readouterr().out
    assert main(["solve", "pareto", "--help"]) == EXIT_OK
    assert "--max-chunks" in capsys.readouterr().out


def test_instance_unsat_exit_3(capsys, tmp_path):
    target = tmp_path / "none.json"
    code, out, _ = run_cli(capsys, "solve", "instance", "dgx1", "allgather", "--steps", "1",
                           "-o", target)
    assert code == EXIT_UNSATISFIABLE
    assert out.splitlines()[-1].startswith("unsat: steps=1 rounds=1 chunks=1")
    assert not target.exists()


def test_least_steps_unsat_exit_3(capsys, monkeypatch):
    def unsat(topology, collective, **kwargs):
        return SynthesisResult(Instance(steps=3), Status.UNSAT, None, 0.1, "cpsat")

    monkeypatch.setattr(cli.solve, "solve_least_steps", unsat)
    code, out, _ = run_cli(capsys, "solve", "least-steps", "ring:4", "allgather",
                           "--max-steps", "3", "--json")
    assert code == EXIT_UNSATISFIABLE
    assert json.loads(out)[0]["status"] == "unsat"


def test_unimplementable_exit_3(capsys):
    code, out, err = run_cli(capsys, "solve", "pareto", BAD / "topology_one_way_chain.json",
                             "allgather")
    assert code == EXIT_UNSATISFIABLE
    assert_one_line_error(err, "rank 0 can never receive chunk 1")


def test_time_limit_exit_4(capsys):
    code, out, err = run_cli(capsys, "solve", "instance", "hub:16", "allgather", "--steps", "15",
                             "--time-limit", "0.05", "--json")
    assert code == EXIT_TIMEOUT
    [row] = json.loads(out)
    assert row["status"] in ("timeout", "unknown") and row["file"] is None


@pytest.mark.parametrize("argv, fragment", [
    (["bounds", "dgx7", "allgather"], "valid names: dgx-a100"),
    (["bounds", "dgx1", "allgathr"], "valid names: allgather, allreduce"),
    (["bounds", "ring:4", "allgather", "--root", "1"], "allgather takes no root"),
    (["solve", "pareto", "ring:4", "allgather", "--nodes", "2"], "no NIC description"),
    (["show", "no/such/file.json"], "no such file"),
])
def test_errors_exit_1(capsys, argv, fragment):
    code, out, err = run_cli(capsys, *argv)
    assert code == EXIT_ERROR
    assert_one_line_error(err, fragment)


def test_unwritable_output_exit_1(capsys, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    code, _, err = run_cli(capsys, "solve", "instance", "ring:4", "allgather", "--steps", "2",
                           "--rounds", "2", "-o", blocker / "sub" / "a.json", "-q")
    assert code == EXIT_ERROR
    assert_one_line_error(err, str(blocker))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


# -- Ctrl-C ---------------------------------------------------------------------------------------


def _ring4_result() -> SynthesisResult:
    return solve_instance(get_topology("ring:4"), standard_collective("allgather", 4),
                          Instance(steps=2, rounds=3, chunks=2), options=SolveOptions())


def test_interrupted_sweep_keeps_what_was_found(capsys, monkeypatch, tmp_path):
    found = _ring4_result()

    def sweep(*args, **kwargs):
        yield found
        raise KeyboardInterrupt

    monkeypatch.setattr(cli.solve, "pareto_front", sweep)
    code, out, _ = run_cli(capsys, "solve", "pareto", "ring:4", "allgather", "-o", tmp_path)
    assert code == EXIT_TIMEOUT  # interrupted: the front may be incomplete
    assert "interrupted" in out.splitlines()[-1]
    [written] = list(tmp_path.iterdir())
    assert written.name == "allgather-ring_4-s2-r3-c2.json"
    assert load_algorithm(written).rounds_per_chunk == found.rounds_per_chunk


def test_interrupted_sweep_with_nothing_found_exit_4(capsys, monkeypatch, tmp_path):
    def sweep(*args, **kwargs):
        raise KeyboardInterrupt
        yield  # a generator

    monkeypatch.setattr(cli.solve, "pareto_front", sweep)
    code, out, _ = run_cli(capsys, "solve", "pareto", "ring:4", "allgather", "--json",
                           "-o", tmp_path)
    assert code == EXIT_TIMEOUT
    assert json.loads(out) == []
    assert list(tmp_path.iterdir()) == []


# -- entry points ---------------------------------------------------------------------------------


def test_run_reports_a_bug_in_one_line(capsys, monkeypatch):
    def broken(argv=None):
        raise RuntimeError("boom")

    monkeypatch.setattr(cli, "main", broken)
    with pytest.raises(SystemExit) as stop:
        cli.run()
    assert stop.value.code == EXIT_ERROR
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "RuntimeError: boom" in err and "this is a bug" in err


def test_python_dash_m_help():
    done = subprocess.run([sys.executable, "-m", "collsynth", "--help"], capture_output=True,
                          text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: collsynth")
    assert "exit codes:" in done.stdout
