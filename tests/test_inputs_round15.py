"""Hostile input, round 15: what this session's hunt found, fixed here.

Each case failed on the code before its fix.
"""

from __future__ import annotations

import pytest

from collsynth import cli


# -- bench --launcher ----------------------------------------------------------------------------


@pytest.mark.parametrize("launcher, why", [
    (" ", "an empty command"),
    ("", "an empty command"),
    ("mpirun -np {rank}", "unknown placeholder {rank}; the only one is {ranks}"),
    ("mpirun 'x", "No closing quotation"),
])
def test_a_launcher_that_cannot_start_the_ranks_is_a_usage_error(ring_allgather_path, tmp_path,
                                                                  capsys, launcher, why):
    """``--runtime msccl-executor --launcher ' '`` passed the "needs a launcher" check and wrote
    scripts that ran one process on ONE GPU (-g 1, no launcher): a 1-rank measurement of a
    4-rank program. ``{rank}`` went into the script as it was, for mpirun to fail on later."""
    folder = tmp_path / "bench"
    code = cli.main(["bench", str(ring_allgather_path), "--ranks", "4", "--runtime",
                     "msccl-executor", "--dry-run", "--launcher", launcher, "-o", str(folder)])
    err = capsys.readouterr().err
    assert code == cli.EXIT_USAGE, err
    [line] = err.splitlines()
    assert "argument --launcher" in line and why in line, line
    assert not folder.exists()


@pytest.mark.parametrize("launcher", ["mpirun -np {ranks}", "srun",
                                      "mpirun -np {ranks} -x LEVEL=${LEVEL}"])
def test_a_launcher_with_ranks_or_a_shell_variable_is_taken(ring_allgather_path, tmp_path,
                                                            capsys, launcher):
    folder = tmp_path / "bench"
    assert cli.main(["bench", str(ring_allgather_path), "--ranks", "4", "--runtime",
                     "msccl-executor", "--dry-run", "--launcher", launcher,
                     "-o", str(folder)]) == cli.EXIT_OK, capsys.readouterr().err
    assert (folder / "run_xml.sh").is_file()


# -- time: an empty table names why -------------------------------------------------------------


def test_nothing_priced_says_why_on_the_error_line(capsys):
    """``time --topology ring:4`` (no physical figures) ended with "time: nothing priced" on
    stderr, the reason only in the table's notes on stdout; the error line now names it."""
    code = cli.main(["time", "--collective", "allgather", "--topology", "ring:4",
                     "--sizes", "1KB"])
    err = capsys.readouterr().err
    assert code == cli.EXIT_ERROR
    [line] = err.splitlines()
    assert "nothing priced" in line and "nccl-ring" in line and "unit_gbps" in line, line
