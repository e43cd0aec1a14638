"""Hostile input, round 16: what this session's hunt found, fixed here.

Each case failed on the code before its fix.
"""

from __future__ import annotations

import pytest

from collsynth import cli


# -- time: the closed form ignores the program model's options ----------------------------------


@pytest.mark.parametrize("option", [["--runtime", "rccl"], ["--gpus-per-thread", "2"],
                                    ["--layout", "in-place"], ["--nodes", "2"],
                                    ["--model", "closed-form", "--channels", "2"]])
def test_the_closed_form_refuses_the_program_models_options(ring_allgather_path, capsys, option):
    """``time ALGO.json --runtime rccl`` priced the closed form against NCCL's own lines, its
    header saying "NCCL's own tuning model": --runtime, --gpus-per-thread and --layout were
    dropped without a word (--nodes and --channels were refused, with exit status 1)."""
    code = cli.main(["time", str(ring_allgather_path), "--sizes", "1MB", "--unit-gbps", "10",
                     "--alpha-us", "1", *option])
    err = capsys.readouterr().err
    assert code == cli.EXIT_USAGE, err
    [line] = err.splitlines()
    assert line.startswith("collsynth time: error: " + option[-2]), line
    assert "program model" in line, line


def test_the_program_model_takes_them(ring_allgather_path, capsys):
    assert cli.main(["time", str(ring_allgather_path), "--sizes", "1MB", "--unit-gbps", "10",
                     "--alpha-us", "1", "--runtime", "rccl", "--model", "program"]) == cli.EXIT_OK
    assert "rccl-ring" in capsys.readouterr().out


# -- tracing: the ranks-per-node variables ------------------------------------------------------


ARABIC_EIGHT = "\u0668"


@pytest.mark.parametrize("text, why", [(ARABIC_EIGHT, "is not ASCII"), ("1_0", "no '_'"),
                                       ("99999999999999999999999", "from 1 to 1048576")])
def test_the_trace_runners_ranks_per_node_takes_ascii_digits_within_a_traces_range(
        tmp_path, capsys, text, why):
    """``COLLSYNTH_TRACE_RANKS_PER_NODE=٨`` was read as 8 and ``1_0`` as 10 (``int()``), and a
    figure above what a trace file may say was taken: the whole traced run then wrote files
    ``collsynth trace`` and ``plan`` refuse."""
    from collsynth.trace.run import main, options_from_env

    env = {"COLLSYNTH_TRACE_DIR": str(tmp_path / "t"), "COLLSYNTH_TRACE_RANKS_PER_NODE": text}
    with pytest.raises(ValueError, match="COLLSYNTH_TRACE_RANKS_PER_NODE = .*" + why):
        options_from_env(env)
    script = tmp_path / "train.py"
    script.write_text("raise SystemExit(5)\n")
    assert main([str(script)], env=env) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("collsynth.trace.run: error: COLLSYNTH_TRACE_RANKS_PER_NODE"), line
    assert options_from_env({**env, "COLLSYNTH_TRACE_RANKS_PER_NODE": " 8 "})[
        "ranks_per_node"] == 8


def test_local_world_size_takes_ascii_digits_within_a_traces_range(tmp_path, monkeypatch):
    pytest.importorskip("torch.distributed")
    from collsynth.trace import tracing

    for text in (ARABIC_EIGHT, "1_0", str(2**21)):
        monkeypatch.setenv("LOCAL_WORLD_SIZE", text)
        with pytest.raises(ValueError, match="LOCAL_WORLD_SIZE = .* from 1 to 1048576"):
            with tracing(tmp_path, cross_node_only=True):
                pass  # pragma: no cover
    with pytest.raises(ValueError, match="ranks_per_node = 2097152; expected an integer from 1"):
        with tracing(tmp_path, ranks_per_node=2**21):
            pass  # pragma: no cover


# -- plan: the default cache ---------------------------------------------------------------------


def test_a_relative_xdg_cache_home_is_ignored(tmp_path, monkeypatch):
    """``XDG_CACHE_HOME=relative/x collsynth plan ...`` made ``relative/x/collsynth`` in the
    folder the command ran in; the XDG Base Directory specification says a relative path there
    is invalid and is ignored."""
    from collsynth.plan.cache import default_cache_directory

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/x")
    assert default_cache_directory() == tmp_path / "home" / ".cache" / "collsynth"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_directory() == tmp_path / "xdg" / "collsynth"


# -- nvidia-smi topo -m: a row the header does not name ------------------------------------------


def test_a_matrix_ended_by_a_mislabelled_row_names_that_line(tmp_path, capsys):
    """A row label the header does not name (``GPU1`` typed ``GPU 1`` or pasted with a no-break
    space) ended the matrix there, and the error blamed a truncated output for every row after
    it, though they were all in the file."""
    header = "\tGPU0\tGPU1\tGPU2\tCPU Affinity\tNUMA Affinity\n"
    rows = ["GPU0\t X \tNV4\tNV4\t0-7\t0\n", "GPU\u00a01\tNV4\t X \tNV4\t0-7\t0\n",
            "GPU2\tNV4\tNV4\t X \t0-7\t0\n"]
    path = tmp_path / "topo.txt"
    path.write_text(header + "".join(rows), encoding="utf-8")
    assert cli.main(["bounds", str(path), "allgather"]) == cli.EXIT_ERROR
    [line] = capsys.readouterr().err.splitlines()
    assert "no row for GPU1, GPU2" in line, line
    assert "line 3 ends it: its first field 'GPU\\xa01' is not a column of the header" in line
    assert "truncated" not in line


# -- solve: --xml beside -o ----------------------------------------------------------------------


def test_solve_refuses_one_path_for_the_algorithm_and_the_xml_folder(tmp_path, capsys):
    """``solve ... -o same.json --xml same.json`` solved, made the folder ``same.json`` for
    the XML files and then refused -o as a folder: an error after the search, and an empty folder
    left behind."""
    path = tmp_path / "same.json"
    code = cli.main(["solve", "least-steps", "ring:4", "allgather", "-q", "-o", str(path),
                     "--xml", str(path)])
    err = capsys.readouterr().err
    assert code == cli.EXIT_USAGE, err
    [line] = err.splitlines()
    assert "name one path" in line, line
    assert not path.exists()


def test_solve_xml_runtime_without_xml_is_a_usage_error(tmp_path, capsys):
    """``--xml-runtime rccl`` without ``--xml`` was dropped without a word."""
    code = cli.main(["solve", "least-steps", "ring:4", "allgather", "-q", "--xml-runtime", "rccl"])
    err = capsys.readouterr().err
    assert code == cli.EXIT_USAGE, err
    [line] = err.splitlines()
    assert "--xml-runtime rccl goes with --xml DIR" in line, line
    folder = tmp_path / "out"
    assert cli.main(["solve", "least-steps", "ring:4", "allgather", "-q", "-o", str(folder),
                     "--xml", str(folder), "--xml-runtime", "rccl"]) == cli.EXIT_OK
    assert [p.name for p in sorted(folder.iterdir())] == [
        "allgather-ring_4-s2-r2-c1.json", "allgather-ring_4-s2-r2-c1.rccl.xml"]
    capsys.readouterr()


# -- a topology file's NIC layout is checked when the file is read --------------------------------


@pytest.mark.parametrize("nic, why", [
    ({"count": 2, "gbps": 25.0, "gpus": [[0, 1], [1, 2, 3]]}, "exactly once"),
    ({"count": 3, "gbps": 25.0}, "cannot be shared evenly"),
    ({"count": 1, "gbps": 25.0, "gpus": [[0, 1], [2, 3]]}, "'count' = 1 but 'gpus' lists 2"),
])
def test_a_nic_layout_no_composition_can_use_is_refused_naming_the_file(tmp_path, nic, why):
    """``metadata.nic.gpus`` naming a rank twice (or counts that disagree) was read, and
    refused only on ``--nodes``, in a message naming the topology, not its file."""
    from collsynth.errors import FileFormatError
    from collsynth.topology.fileformat import load_topology, save_topology
    from collsynth.topology.families import ring

    path = tmp_path / "four.json"
    four = ring(4)
    save_topology(type(four)(name="four", links=four.links, groups=four.groups, unit_gbps=25.0,
                             metadata={"nic": nic}), path)
    with pytest.raises(FileFormatError, match=why) as info:
        load_topology(path)
    assert info.value.path == str(path)


def test_a_node_without_nics_is_still_read():
    from collsynth.topology.fileformat import topology_from_json, topology_to_json
    from collsynth.topology.families import ring

    assert topology_from_json(topology_to_json(ring(4))).num_ranks == 4


# -- tune-runtime: a collective named twice ------------------------------------------------------


@pytest.mark.parametrize("names", ["allreduce,allreduce", "allreduce,all_reduce",
                                   "reduce_scatter,ReduceScatter"])
def test_a_collective_named_twice_for_tune_runtime_is_a_usage_error(tmp_path, capsys, names):
    """``--collectives allreduce,allreduce`` tuned it twice and wrote its rules twice."""
    out = tmp_path / "tuner.csv"
    code = cli.main(["tune-runtime", "--topology", "dgx-a100", "--runtime", "nccl",
                     "--collectives", names, "-o", str(out)])
    err = capsys.readouterr().err
    assert code == cli.EXIT_USAGE, err
    [line] = err.splitlines()
    assert "--collectives" in line and "give each once" in line, line
    assert not out.exists()


# -- a file's version is a whole number ---------------------------------------------------------


def test_a_version_written_as_a_fraction_is_refused(tmp_path, ring_allgather_path):
    """``"version": 1.0`` was read as version 1 (1.0 == 1 in Python); no writer puts a
    fraction there. One rule, ``_parse.format_version_is``, for every file format."""
    import json

    from collsynth.algorithm.fileformat import algorithm_from_json
    from collsynth.errors import FileFormatError
    from collsynth.topology.families import ring
    from collsynth.topology.fileformat import topology_from_json, topology_to_json

    topology = topology_to_json(ring(4))
    assert topology_from_json(dict(topology)).num_ranks == 4
    with pytest.raises(FileFormatError, match="unknown version 1.0"):
        topology_from_json({**topology, "version": 1.0})
    with pytest.raises(FileFormatError, match="version"):
        topology_from_json({**topology, "version": True})
    algorithm = json.loads(ring_allgather_path.read_text())
    assert algorithm_from_json(dict(algorithm)).num_steps >= 1
    with pytest.raises(FileFormatError, match="version"):
        algorithm_from_json({**algorithm, "version": float(algorithm["version"])})
    from collsynth.timing.calibration import load_calibration

    path = tmp_path / "c.json"
    path.write_text(json.dumps({"format": "collsynth-calibration", "version": 1.0,
                                "topology": "dgx1", "entries": []}))
    with pytest.raises(FileFormatError, match="version"):
        load_calibration(path)
