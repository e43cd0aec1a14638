"""The output-path policy (collsynth._output) and every command that writes.

An output that is a FIFO, a symbolic link, a character device or a folder is refused, never
replaced; a missing parent folder is named, not created; the refusal comes before any work
(the work functions are replaced by ones that fail the test); names made from user data stay
in the output folder; writes are atomic and their errors name the user's path.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import pytest

from collsynth._output import (
    check_output_dir,
    check_output_file,
    open_atomic,
    path_in,
    safe_file_name,
    write_text_atomic,
)
from collsynth.algorithm import Algorithm, Send, Step, save_algorithm
from collsynth.cli import EXIT_ERROR, EXIT_USAGE, main
from collsynth.collective import allgather
from collsynth.errors import OutputPathError
from collsynth.topology import get_topology

ROOT = Path(__file__).resolve().parents[1]
LOG = ROOT / "tests" / "fixtures" / "logs" / "nccl_tests_srun_allgather.txt"
TRACE = ROOT / "tests" / "fixtures" / "traces" / "fc4-mixed"

needs_fifo = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")


# -- what sits at the output path -----------------------------------------------------------------


def _fifo(folder: Path, name: str = "out.fifo") -> Path:
    path = folder / name
    os.mkfifo(path)
    return path


def _link(folder: Path, name: str = "out.link") -> Path:
    (folder / "real.txt").write_text("keep me")
    path = folder / name
    path.symlink_to(folder / "real.txt")
    return path


def _dangling(folder: Path, name: str = "out.dangling") -> Path:
    path = folder / name
    path.symlink_to(folder / "nowhere")
    return path


def _folder(folder: Path, name: str = "out.dir") -> Path:
    path = folder / name
    path.mkdir()
    return path


BLOCKERS = {"fifo": (_fifo, "a FIFO"), "symlink": (_link, "a symbolic link"),
            "dangling-symlink": (_dangling, "a symbolic link"), "folder": (_folder, "a folder")}


def _unchanged(path: Path, kind: str) -> bool:
    info = os.lstat(path)
    if kind == "fifo":
        return stat.S_ISFIFO(info.st_mode)
    if kind == "symlink":
        return stat.S_ISLNK(info.st_mode) and (path.parent / "real.txt").read_text() == "keep me"
    if kind == "dangling-symlink":
        return stat.S_ISLNK(info.st_mode) and not (path.parent / "nowhere").exists()
    return stat.S_ISDIR(info.st_mode) and not any(path.iterdir())


@needs_fifo
@pytest.mark.parametrize("kind", sorted(BLOCKERS))
def test_a_file_output_refuses_what_is_not_a_regular_file(tmp_path, kind):
    make, words = BLOCKERS[kind]
    path = make(tmp_path)
    with pytest.raises(OutputPathError, match=f"{path}: is {words}; expected a regular file"):
        check_output_file(path)
    with pytest.raises(OutputPathError):
        write_text_atomic(path, "text")
    assert _unchanged(path, kind)
    assert not list(tmp_path.glob(".*.tmp"))


def test_a_character_device_is_refused():
    if not Path("/dev/null").is_char_device():
        pytest.skip("no /dev/null")
    with pytest.raises(OutputPathError, match="/dev/null: is a character device"):
        write_text_atomic("/dev/null", "text")
    assert Path("/dev/null").is_char_device()


def test_missing_parent_folders_are_named_not_created(tmp_path):
    path = tmp_path / "a" / "b" / "out.json"
    with pytest.raises(OutputPathError, match=f"folder {tmp_path / 'a' / 'b'} does not exist"):
        write_text_atomic(path, "text")
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "file").write_text("x")
    with pytest.raises(OutputPathError, match="a parent of it is a file"):
        check_output_file(tmp_path / "file" / "out.json")
    with pytest.raises(OutputPathError, match="names a folder; expected a file name"):
        check_output_file(f"{tmp_path}/new/")


def test_read_only_file_and_unwritable_folder(tmp_path):
    path = tmp_path / "ro.json"
    path.write_text("old")
    path.chmod(0o444)
    with pytest.raises(OutputPathError, match="is read-only"):
        write_text_atomic(path, "new")
    assert path.read_text() == "old"
    if sys.platform.startswith("linux"):  # /proc takes no new files, even from root
        with pytest.raises(OutputPathError, match="folder /proc is not writable"):
            check_output_file("/proc/collsynth-test.json")


def test_a_regular_file_or_a_new_name_is_written_with_the_usual_mode(tmp_path):
    new = tmp_path / "new.json"
    write_text_atomic(new, "one")
    umask = os.umask(0)
    os.umask(umask)
    assert new.read_text() == "one" and stat.S_IMODE(new.stat().st_mode) == 0o666 & ~umask
    new.chmod(0o640)
    write_text_atomic(new, "two")  # replaced, keeping its mode
    assert new.read_text() == "two" and stat.S_IMODE(new.stat().st_mode) == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["new.json"]


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "keep.json"
    path.write_text("old")
    with pytest.raises(RuntimeError):
        with open_atomic(path) as handle:
            handle.write("half")
            raise RuntimeError("interrupted")
    assert path.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.json"]


def test_an_os_error_names_the_users_path_not_the_temporary(tmp_path, monkeypatch):
    path = tmp_path / "out.json"

    def fail(src, dst):
        raise OSError(28, "No space left on device", str(src))

    monkeypatch.setattr("collsynth._output.os.replace", fail)
    with pytest.raises(OutputPathError) as caught:
        write_text_atomic(path, "text")
    assert str(caught.value) == f"{path}: cannot write: No space left on device"
    assert list(tmp_path.iterdir()) == []


@needs_fifo
def test_a_fifo_put_there_while_writing_is_not_replaced(tmp_path):
    path = tmp_path / "out.json"
    with pytest.raises(OutputPathError, match="is a FIFO"):
        with open_atomic(path) as handle:
            handle.write("text")
            os.mkfifo(path)
    assert stat.S_ISFIFO(os.lstat(path).st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json"]


@needs_fifo
def test_a_folder_output_is_a_folder_or_a_new_name_in_an_existing_folder(tmp_path):
    made = check_output_dir(tmp_path / "new")
    assert made.is_dir()
    assert check_output_dir(made) == made  # existing: fine
    with pytest.raises(OutputPathError, match="does not exist"):
        check_output_dir(tmp_path / "a" / "b")
    assert not (tmp_path / "a").exists()
    for make, words in ((_fifo, "a FIFO"), (_link, "a symbolic link")):
        path = make(tmp_path)
        with pytest.raises(OutputPathError, match=f"is {words}; expected a folder"):
            check_output_dir(path)
    (tmp_path / "file").write_text("x")
    with pytest.raises(OutputPathError, match="file: is a file; expected a folder"):
        check_output_dir(tmp_path / "file")


@pytest.mark.parametrize("name", ["../../ESCAPED", "/etc/passwd", "a/../../b", "..", "",
                                  "nul\0byte", "x" * 1000, "ok-name_1.2"])
def test_names_from_user_data_stay_in_the_folder(tmp_path, name):
    path = path_in(tmp_path, name, suffix=".xml")
    assert path.parent == tmp_path
    assert len(path.name) <= 200 and "/" not in path.name and "\0" not in path.name
    assert not path.name.startswith(".")
    assert safe_file_name("ok-name_1.2") == "ok-name_1.2"


# -- every command that writes --------------------------------------------------------------------


def _algorithm_file(folder: Path) -> Path:
    """Allgather on ring:4 by hand (chunk r to both neighbours, then one hop further)."""
    first = tuple(Send(r, r, (r + d) % 4) for r in range(4) for d in (1, 3))
    second = tuple(Send(r, (r + 1) % 4, (r + 2) % 4) for r in range(4))
    path = folder / "ag.json"
    save_algorithm(Algorithm("ag", get_topology("ring:4"), allgather(4),
                             (Step(1, first), Step(1, second))), path)
    return path


def _forbid(monkeypatch, *targets: str) -> None:
    """Make the work functions fail the test: a refused output must be found before them."""
    def work(*args, **kwargs):
        raise AssertionError("the output was not checked before the work")

    for target in targets:
        monkeypatch.setattr(target, work)


# (argv with OUT for the output path, work functions that must not run)
COMMANDS = {
    "export": (["export", "{algo}", "-o", "OUT"], ["collsynth.cli.export.load_algorithm"]),
    "export-all": (["export", "{algo}", "--runtime", "all", "-o", "OUT"],
                   ["collsynth.cli.export.load_algorithm"]),
    "calibrate": (["calibrate", str(LOG), "--topology", "dgx1", "-o", "OUT"],
                  ["collsynth.cli.calibrate.load_log"]),
    "calibrate-plot": (["calibrate", str(LOG), "--topology", "dgx1", "-o", "{tmp}/c.json",
                        "--plot", "OUT"], ["collsynth.cli.calibrate.load_log"]),
    "bandwidth-optimal": (["solve", "bandwidth-optimal", "ring:4", "allgather", "-o", "OUT"],
                          ["collsynth.synthesis.large.solve_large"]),
    "solve-instance": (["solve", "instance", "ring:4", "allgather", "--steps", "2", "-o", "OUT"],
                       ["collsynth.cli.solve.solve_instance"]),
    "solve-xml": (["solve", "instance", "ring:4", "allgather", "--steps", "2", "--xml", "OUT"],
                  ["collsynth.cli.solve.solve_instance"]),
    "pareto-dir": (["solve", "pareto", "ring:4", "allgather", "-o", "OUT"],
                   ["collsynth.cli.solve.pareto_front"]),
    "plot": (["plot", "{algo}", "-o", "OUT"], ["collsynth.cli.time._algorithms"]),
    "plan": (["plan", str(TRACE), "--topology", "fully-connected:4", "--no-cache", "-o", "OUT"],
             ["collsynth.plan.make_plan", "collsynth.resolve.resolve_topology"]),
    "bench": (["bench", "{algo}", "--ranks", "4", "--runtime", "rccl", "--dry-run", "-o", "OUT"],
              ["collsynth.plan.bench.prepare_bench"]),
    "tune-runtime": (["tune-runtime", "--topology", "dgx-a100", "--runtime", "nccl", "-o", "OUT"],
                     ["collsynth.resolve.resolve_topology",
                      "collsynth.export.tuner.machine.tune_machine"]),
}
#: The -o argument each command is given, and where the blocker goes (with --runtime all,
#: -o out.xml writes out.msccl.xml, ...).
OUT_NAMES = {"export": ("out.xml", "out.xml"), "export-all": ("out.xml", "out.msccl.xml"),
             "calibrate": ("out.json", "out.json"), "calibrate-plot": ("out.svg", "out.svg"),
             "bandwidth-optimal": ("out.json", "out.json"),
             "solve-instance": ("out.json", "out.json"), "solve-xml": ("out", "out"),
             "pareto-dir": ("out", "out"), "plot": ("out.png", "out.png"),
             "plan": ("out", "out"), "bench": ("out", "out"),
             "tune-runtime": ("out.conf", "out.conf")}
SUFFIX = {command: Path(names[0]).suffix for command, names in OUT_NAMES.items()
          if Path(names[0]).suffix}


def _argv(command: str, out: str, tmp_path: Path, algo: Path | None) -> list[str]:
    argv, _ = COMMANDS[command]
    return [out if a == "OUT" else a.format(tmp=tmp_path, algo=algo) for a in argv]


def _one_error_line(err: str, fragment: str) -> None:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and ": error: " in lines[0], err
    assert fragment in lines[0], err
    assert ".tmp" not in lines[0], err


@needs_fifo
@pytest.mark.parametrize("kind", ["fifo", "symlink"])
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_writer_refuses_a_fifo_or_a_symlink_before_any_work(command, kind, tmp_path,
                                                                  monkeypatch, capsys):
    algo = _algorithm_file(tmp_path)
    make, words = BLOCKERS[kind]
    argument, blocker = OUT_NAMES[command]
    out = make(tmp_path, blocker)
    _forbid(monkeypatch, *COMMANDS[command][1])
    code = main(_argv(command, str(tmp_path / argument), tmp_path, algo))
    assert code == EXIT_ERROR
    _one_error_line(capsys.readouterr().err, f"{out}: is {words}")
    assert _unchanged(out, kind)


@pytest.mark.parametrize("command", sorted(SUFFIX))
def test_every_file_writer_refuses_a_character_device_and_a_missing_folder(
        command, tmp_path, monkeypatch, capsys):
    if not Path("/dev/null").is_char_device():
        pytest.skip("no /dev/null")
    algo = _algorithm_file(tmp_path)
    _forbid(monkeypatch, *COMMANDS[command][1])
    if command not in ("export-all", "plot", "calibrate-plot"):  # these need a suffix
        assert main(_argv(command, "/dev/null", tmp_path, algo)) == EXIT_ERROR
        _one_error_line(capsys.readouterr().err, "/dev/null: is a character device")
    missing = tmp_path / "no" / "such" / f"out{SUFFIX[command]}"
    assert main(_argv(command, str(missing), tmp_path, algo)) == EXIT_ERROR
    _one_error_line(capsys.readouterr().err, f"folder {missing.parent} does not exist")
    assert not (tmp_path / "no").exists()


def test_plan_refuses_an_existing_file_before_planning(tmp_path, monkeypatch, capsys):
    _forbid(monkeypatch, *COMMANDS["plan"][1])
    (tmp_path / "plan").write_text("not a folder")
    code = main(_argv("plan", str(tmp_path / "plan"), tmp_path, None))
    assert code == EXIT_ERROR
    _one_error_line(capsys.readouterr().err, "plan: is a file; expected a folder")
    assert (tmp_path / "plan").read_text() == "not a folder"


def test_xml_names_from_a_custom_collective_stay_in_the_folder(tmp_path, capsys):
    work = tmp_path / "a" / "b"
    work.mkdir(parents=True)
    collective = tmp_path / "escape.json"
    collective.write_text(json.dumps({"name": "../../ESCAPED", "num_ranks": 2,
                                      "chunks": [{"pre": [0], "post": [1]}]}))
    xml_dir, json_dir = work / "xml", work / "json"
    code = main(["solve", "instance", "ring:2", str(collective), "--steps", "1", "-q",
                 "--xml", str(xml_dir), "-o", f"{json_dir}/"])
    assert code == 0, capsys.readouterr().err
    written = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*ESCAPED*"))
    assert written == ["a/b/json/ESCAPED-ring_2-s1-r1-c1.json",
                       "a/b/xml/ESCAPED-ring_2-s1-r1-c1.msccl.xml"]


# -- small command-line fixes ----------------------------------------------------------------------


def test_a_one_rank_topology_has_nothing_to_search_for(tmp_path, capsys):
    topology = tmp_path / "one.json"
    topology.write_text(json.dumps({"format": "collsynth-topology", "version": 1,
                                    "name": "one", "links": [[0]]}))
    for mode in ("least-steps", "pareto", "bandwidth-optimal"):
        assert main(["solve", mode, str(topology), "allgather", "-q"]) == EXIT_ERROR
        out, err = capsys.readouterr()
        _one_error_line(err, "nothing to communicate (a 1-rank topology)")
        assert "steps = 0" not in err


def test_export_with_absurd_instances_says_so_in_one_line(tmp_path, capsys):
    algo = _algorithm_file(tmp_path)
    assert main(["export", str(algo), "-o", str(tmp_path / "x.xml"),
                 "--instances", "100000"]) == EXIT_ERROR
    _one_error_line(capsys.readouterr().err, "--instances 100000: each instance needs a channel")
    assert not (tmp_path / "x.xml").exists()


@pytest.mark.parametrize("root", ["99", "-1"])
def test_a_root_outside_the_topology_is_a_usage_error_either_way(root, capsys):
    assert main(["bounds", "ring:4", "broadcast", "--root", root]) == EXIT_USAGE
    _one_error_line(capsys.readouterr().err, "--root")


def _disk_full_on_write(monkeypatch):
    """Every file opened for writing through ``os.fdopen`` (the atomic writers) fails as a
    full disk does (ENOSPC); reads are untouched."""
    import errno

    real = os.fdopen

    class Full:
        def __init__(self, handle):
            self.handle = handle

        def write(self, data):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.handle.close()

    def fdopen(fd, mode="r", *args, **kwargs):
        handle = real(fd, mode, *args, **kwargs)
        return Full(handle) if "w" in mode else handle

    monkeypatch.setattr(os, "fdopen", fdopen)


@pytest.mark.parametrize("existing", [False, True])
def test_a_full_disk_names_the_users_folder_not_the_staging_one(tmp_path, monkeypatch, capsys,
                                                                ring_allgather_path, existing):
    """``bench -o DIR`` on a full disk read ``DIR/../.DIR.x1y2.tmp/xml/a.xml: cannot write``:
    a hidden path the user never named, gone by the time they look."""
    folder = tmp_path / "bench-out"
    if existing:
        folder.mkdir()
    _disk_full_on_write(monkeypatch)
    code = main(["bench", str(ring_allgather_path), "--ranks", "4", "--runtime", "msccl",
                 "--dry-run", "-o", str(folder)])
    err = capsys.readouterr().err
    assert code == EXIT_ERROR
    assert f"error: {folder}/xml/" in err and "No space left on device" in err, err
    assert ".tmp" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == \
        sorted(["ag.json"] + (["bench-out"] if existing else []))
    assert not existing or not any(folder.iterdir())


def test_a_plan_on_a_full_disk_names_the_users_folder_not_the_staging_one(tmp_path,
                                                                          monkeypatch, capsys):
    """``plan -o DIR`` stages its own folder (plan/writer.py): a full disk read
    ``.DIR.6859.x1y2.tmp/xml/...: cannot write``, a hidden path the user never named."""
    folder = tmp_path / "plan-out"
    _disk_full_on_write(monkeypatch)
    code = main(["plan", str(TRACE), "--topology", "fully-connected:4,unit_gbps=25,alpha_us=1",
                 "--no-cache", "-o", str(folder)])
    err = capsys.readouterr().err
    assert code == EXIT_ERROR
    assert f"error: {folder}/" in err and "No space left on device" in err, err
    assert ".tmp" not in err
    assert list(tmp_path.iterdir()) == []
