"""Hostile input, round 18: the known findings given to this round.

Each case failed on the code before its fix.
"""

from __future__ import annotations

import json

import pytest

from collsynth import cli
from collsynth.errors import FileFormatError, InvalidTopologyError
from tests.test_inputs_round17 import one_usage_line  # one usage-error line, nothing on stdout

DENORMAL = "1e-320"


def one_error_line(capsys, code: int) -> str:
    captured = capsys.readouterr()
    assert code == cli.EXIT_ERROR, captured.err
    [line] = captured.err.splitlines()
    assert captured.out == ""
    return line


# -- a latency of one step below a picosecond ----------------------------------------------------


ALPHA_RANGE = "from 1e-06 to 3.6e+09 us (1 ps to an hour)"
GBPS_RANGE = "from 1e-06 to 1e+06 GB/s (1 kB/s to 1 PB/s)"


@pytest.mark.parametrize("option, value, expected", [
    ("--alpha-us", DENORMAL, ALPHA_RANGE), ("--alpha-us", "1e-7", ALPHA_RANGE),
    ("--alpha-us", "4e9", ALPHA_RANGE), ("--unit-gbps", "1e-300", GBPS_RANGE),
    ("--unit-gbps", "2e6", GBPS_RANGE)])
def test_a_figure_option_out_of_range_is_a_usage_error(ring_allgather_path, capsys, option,
                                                        value, expected):
    """``--alpha-us 1e-320`` was taken (any number above 0): ``time`` then printed crossover
    sizes as fractions of 600 digits. ``--unit-gbps 1e-300`` was refused, but as an error
    (exit 1) naming the topology's field, not the option."""
    figures = {"--alpha-us": "1", "--unit-gbps": "10", option: value}
    code = cli.main(["time", str(ring_allgather_path), "--sizes", "1MB",
                     *(part for item in figures.items() for part in item)])
    line = one_usage_line(capsys, code, "collsynth time")
    assert f"argument {option}: expected a number {expected}, got {value!r}" in line, line


@pytest.mark.parametrize("command", [["bounds", "ring:4", "allgather"],
                                     ["time", "--topology", "ring:4", "--collective",
                                      "allgather"]])
def test_alpha_option_floor_in_every_command(command, capsys):
    code = cli.main([*command, "--alpha-us", DENORMAL, "--unit-gbps", "10"])
    assert "argument --alpha-us" in one_usage_line(capsys, code, f"collsynth {command[0]}")


def test_alpha_in_a_name_below_a_picosecond_is_refused(capsys):
    spec = f"ring:4,unit_gbps=25,alpha_us={DENORMAL}"
    code = cli.main(["time", "--topology", spec, "--collective", "allgather", "--sizes", "1MB"])
    line = one_error_line(capsys, code)
    assert f"topology {spec!r}: alpha_us = {DENORMAL!r}; expected a finite positive number " \
           f"{ALPHA_RANGE}" in line, line


def test_alpha_in_a_name_or_with_figures_below_the_floor_is_refused():
    from collsynth.topology import get_topology
    from collsynth.topology.builtins import with_figures

    with pytest.raises(InvalidTopologyError, match="alpha_us = '1e-7'"):
        get_topology("ring:4,alpha_us=1e-7")
    with pytest.raises(InvalidTopologyError, match=r"alpha_us = 1e-320; .*1 ps to an hour"):
        with_figures(get_topology("ring:4"), alpha_us=1e-320)
    # the floor itself is taken, in the name, the option's function and the file
    assert get_topology("ring:4,alpha_us=1e-6").alpha_us == 1e-6


def test_alpha_in_a_topology_file_below_a_picosecond_is_refused(tmp_path, capsys):
    from collsynth.topology import get_topology
    from collsynth.topology.fileformat import load_topology, topology_to_json

    obj = topology_to_json(get_topology("ring:4,unit_gbps=25,alpha_us=1"))
    path = tmp_path / "t.json"
    for alpha, taken in ((1e-320, False), (1e-7, False), (1e-6, True)):
        obj["alpha_us"] = alpha
        path.write_text(json.dumps(obj))
        if taken:
            assert load_topology(path).alpha_us == alpha
            continue
        with pytest.raises(FileFormatError, match=r"alpha_us = [0-9.e-]+: expected a finite "
                                                  r"number >= 1e-06 and <= 3.6e\+09 \(us: 1 ps"):
            load_topology(path)
    obj["alpha_us"] = 1e-320
    path.write_text(json.dumps(obj))
    code = cli.main(["bounds", str(path), "allgather"])
    line = one_error_line(capsys, code)
    assert line.startswith(f"collsynth: error: {path}: alpha_us = 1e-320"), line


def test_one_definition_of_the_latency_floor():
    """``MIN_LATENCY_US`` is _parse's; the runtime constants take that one."""
    from collsynth import _parse
    from collsynth.runtimes import constants
    from collsynth.topology.fileformat import FIGURE_RANGES

    assert constants.MIN_LATENCY_US is _parse.MIN_LATENCY_US == 1e-6
    assert FIGURE_RANGES["alpha_us"][0] is _parse.MIN_LATENCY_US


# -- --nodes beyond the ranks collsynth accepts --------------------------------------------------


NODES_TEXT = "argument --nodes: 99999999999 nodes is more than the 65536 ranks collsynth accepts"


@pytest.mark.parametrize("command", [
    ["bounds", "ring:4", "allgather"],
    ["solve", "least-steps", "ring:4", "allgather"],
    ["time", "--topology", "ring:4", "--collective", "allgather"],
    ["tune-runtime", "--topology", "ring:4", "--runtime", "nccl", "-o", "{tmp}/t.csv"],
    ["plan", "{tmp}", "--topology", "ring:4", "-o", "{tmp}/plan"],
    ["draw", "{tmp}/a.xml", "--topology", "ring:4", "-o", "{tmp}/a.svg"],
    ["calibrate", "{tmp}/log.csv", "--topology", "ring:4", "-o", "{tmp}/c.json"],
    ["bench", "{tmp}/a.xml", "-o", "{tmp}/b"],
])
def test_nodes_beyond_the_rank_limit_is_a_usage_error(command, tmp_path, capsys):
    """``bounds ring:4 allgather --nodes 99999999999`` exited 1 when the nodes were composed;
    it is an option's value out of range, a usage error in every command that has ``--nodes``."""
    argv = [part.replace("{tmp}", str(tmp_path)) for part in command]
    code = cli.main([*argv, "--nodes", "99999999999"])
    prog = "collsynth " + " ".join(command[:2] if command[0] == "solve" else command[:1])
    assert NODES_TEXT in one_usage_line(capsys, code, prog)
    assert list(tmp_path.iterdir()) == []


def test_nodes_at_the_limit_reach_the_composition(capsys):
    """65536 nodes pass the option; 65536 x 4 ranks are refused where they are composed (exit 1,
    as before: a control, not a finding)."""
    code = cli.main(["bounds", "ring:4", "allgather", "--nodes", "65536"])
    assert "262144 ranks is more than the 65536" in one_error_line(capsys, code)


def test_a_topology_built_in_python_keeps_the_readers_alpha_floor():
    # A Topology took any alpha_us above 0, so one built with 1e-320 saved a file its own reader
    # refuses; it now has the reader's floor, 1 ps (MIN_LATENCY_US).
    from collsynth.topology.model import Topology

    with pytest.raises(InvalidTopologyError, match=r"alpha_us = 1e-320; expected a positive "
                                                   r"number from 1e-06"):
        Topology("pair", ((0, 1), (1, 0)), alpha_us=1e-320)
    assert Topology("pair", ((0, 1), (1, 0)), alpha_us=1e-6).alpha_us == 1e-6
