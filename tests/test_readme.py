"""The README's commands run as written, in a fresh copy of the repository.

Every fenced ``sh`` block of README.md is read line by line: the Quickstart's install commands
are checked against ``.ci/run`` (they install packages, so they are not run here), the test
commands name markers the suite registers, and every other line is run verbatim with ``bash``,
in order, in a copy of the repository's tracked files (what a clone holds), with this
interpreter's ``collsynth`` first on ``PATH``; the ``python`` block runs in the same kind of
copy. Running them takes tens of seconds, so those tests are ``slow`` (the whole suite runs
them; the quick subset checks the blocks' shape and that every file they read is shipped).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
#: Lines that start these are not run: the Quickstart installs packages, and the test commands
#: would run this suite inside itself.
INSTALL = "python3 -m venv .venv && "
TESTS = ".venv/bin/python -m pytest"
#: Lines that take tens of seconds (the training run and what reads its trace).
SLOW = ("torchrun", "trace/")
#: Seconds any one line may take.
LINE_TIMEOUT_S = 300


def _blocks(language: str) -> list[str]:
    text = README.read_text(encoding="utf-8")
    return re.findall(rf"^```{language}\n(.*?)^```$", text, re.M | re.S)


def _lines(block: str) -> list[str]:
    """The commands of a shell block: continuation lines joined, blank lines dropped."""
    return [line for line in block.replace("\\\n", " ").splitlines() if line.strip()]


def commands() -> list[str]:
    return [line for block in _blocks("sh") for line in _lines(block)]


def tour() -> list[str]:
    return [c for c in commands() if not c.startswith((INSTALL, TESTS))]


def _copy_of_the_repository(target: Path) -> Path:
    """The tracked files of the work tree (as they are now) copied into ``target``."""
    if not (ROOT / ".git").exists() or shutil.which("git") is None:
        pytest.skip("not a git checkout: no list of the repository's files")
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                            check=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        source = ROOT / name
        if source.is_file():  # a file deleted in the work tree is not there
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    return target


def _environment(tmp_path: Path, clone: Path) -> dict[str, str]:
    """``collsynth`` is this interpreter running the copy's package; the interpreter's own
    scripts (``torchrun``) come next on PATH; caches stay inside ``tmp_path``."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "collsynth"
    shim.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -m collsynth "$@"\n')
    shim.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("COLLSYNTH_")}
    env.update(PATH=os.pathsep.join([str(bin_dir), str(Path(sys.executable).parent),
                                     env.get("PATH", "")]),
               PYTHONPATH=str(clone), XDG_CACHE_HOME=str(tmp_path / "cache"),
               MPLBACKEND="Agg")
    return env


def _run_verbatim(lines: list[str], tmp_path: Path) -> None:
    clone = _copy_of_the_repository(tmp_path / "clone")
    env = _environment(tmp_path, clone)
    for line in lines:
        try:
            done = subprocess.run(["bash", "-c", line], cwd=clone, env=env, text=True,
                                  capture_output=True, timeout=LINE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"README line ran over {LINE_TIMEOUT_S} s: {line}")
        assert done.returncode == 0, (f"README line exited {done.returncode}: {line}\n"
                                      f"{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
        for output in re.findall(r"(?:-o|>)\s+(\S+)", line.split("#")[0]):
            assert (clone / output).exists(), f"{line}: wrote no {output}"


def test_the_readme_has_a_quickstart_a_tour_and_a_quick_subset():
    assert len(README.read_text(encoding="utf-8").splitlines()) <= 200
    quickstart = _lines(_blocks("sh")[0])
    assert len(quickstart) == 2 and all(c.startswith(INSTALL) for c in quickstart)
    assert 10 <= len(tour()) <= 15
    assert any(c.startswith(TESTS) and "not slow" in c for c in commands())


def test_the_quickstart_is_what_ci_runs():
    """The Quickstart's second line is .ci/run's command, word for word; the first installs the
    package alone and runs the command the README shows the output of."""
    first, second = _lines(_blocks("sh")[0])
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert second in ci
    assert first == (f"{INSTALL}.venv/bin/pip install -q . && "
                     ".venv/bin/collsynth solve pareto dgx1 allgather")


def test_the_test_commands_name_registered_markers(pytestconfig):
    registered = {line.split(":")[0].strip() for line in pytestconfig.getini("markers")}
    for command in commands():
        if command.startswith(TESTS):
            expression = re.search(r'-m "([^"]+)"', command)
            assert expression, command
            named = set(re.findall(r"\w+", expression.group(1))) - {"not", "and", "or"}
            assert named <= registered, (command, registered)


def test_the_tour_names_only_shipped_files():
    """Every path a tour line reads exists in the repository (the lines that write them come
    first)."""
    written: set[str] = set()
    for line in tour():
        words = shlex.split(line, comments=True)
        for index, word in enumerate(words):
            if index > 0 and words[index - 1] in ("-o", ">"):
                written.add(word.rstrip("/"))
            elif re.search(r"\.(json|xml|txt|csv|py)$", word) and "*" not in word:
                assert word in written or (ROOT / word).is_file(), f"{line}: no {word}"


@pytest.mark.slow  # a dozen fresh processes: about 20 s on an idle 2-core machine
def test_the_tour_runs_verbatim(tmp_path):
    _run_verbatim([c for c in tour() if not any(word in c for word in SLOW)], tmp_path)


@pytest.mark.slow
def test_the_trace_lines_run_verbatim(tmp_path):
    pytest.importorskip("torch")
    if shutil.which("torchrun", path=str(Path(sys.executable).parent)) is None:
        pytest.skip("no torchrun beside this interpreter")
    _run_verbatim([c for c in tour() if any(word in c for word in SLOW)], tmp_path)


@pytest.mark.slow
def test_the_python_example_runs(tmp_path):
    (block,) = _blocks("python")
    clone = _copy_of_the_repository(tmp_path / "clone")
    env = _environment(tmp_path, clone)
    done = subprocess.run([sys.executable, "-c", block], cwd=clone, env=env, text=True,
                          capture_output=True, timeout=LINE_TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "steps=3 rounds=7 chunks=6 7/6" in done.stdout  # the front's bandwidth-optimal end
    assert (clone / "ag-3.json").is_file()
    # The whole DGX-1 allgather front takes seconds, so the 60 s limit never cuts it: complete.
    assert "\nTrue None\n" in done.stdout, done.stdout
