"""Resource limits: the memory ceiling, and requests refused up front with the figure.

Expected figures are hand counts (sends of a schedule, chunks of a program), never taken from
the code under test; no wall-clock assertion (benchmarks/time_limits.py measures).
"""

from __future__ import annotations

import resource

import numpy as np
import pytest

from collsynth import cli
from collsynth.algorithm.fileformat import load_algorithm, save_algorithm
from collsynth.algorithm.model import Instance
from collsynth.collective import standard_collective
from collsynth.errors import FileFormatError, InputTooLargeError
from collsynth.export.check import check_program
from collsynth.export.xml_reader import read_program
from collsynth.limits import (
    MEMORY_LIMIT_ENV,
    ResourceLimitError,
    TimeLimitReached,
    check_memory,
    memory_ceiling,
    memory_limit_bytes,
    parse_bytes,
)
from collsynth.synthesis import solve_instance
from collsynth.synthesis.bandwidth_optimal.engine import (
    check_request_fits,
    solve_bandwidth_optimal,
)
from collsynth.timing.fit import _binned
from collsynth.topology import get_topology

# A 2-rank allgather (the MSCCL spec's appendix), as collsynth exports it.
_AG2 = """<algo name="ag2" proto="Simple" nchannels="1" nchunksperloop="{big}" ngpus="{n}" coll="allgather" inplace="0">
  <gpu id="0" i_chunks="1" o_chunks="2" s_chunks="0">
    <tb id="0" send="-1" recv="-1" chan="0">
      <step s="0" type="cpy" srcbuf="i" srcoff="0" dstbuf="o" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="0"/>
    </tb>
    <tb id="1" send="1" recv="1" chan="0">
      <step s="0" type="s" srcbuf="i" srcoff="0" dstbuf="i" dstoff="0" cnt="{cnt}" depid="-1" deps="-1" hasdep="0"/>
      <step s="1" type="r" srcbuf="o" srcoff="1" dstbuf="o" dstoff="1" cnt="1" depid="-1" deps="-1" hasdep="0"/>
    </tb>
  </gpu>
  <gpu id="1" i_chunks="1" o_chunks="2" s_chunks="0">
    <tb id="0" send="-1" recv="-1" chan="0">
      <step s="0" type="cpy" srcbuf="i" srcoff="0" dstbuf="o" dstoff="1" cnt="1" depid="-1" deps="-1" hasdep="0"/>
    </tb>
    <tb id="1" send="0" recv="0" chan="0">
      <step s="0" type="s" srcbuf="i" srcoff="0" dstbuf="i" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="1" type="r" srcbuf="o" srcoff="0" dstbuf="o" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="0"/>
    </tb>
  </gpu>
</algo>
"""


# -- the ceiling ----------------------------------------------------------------------------------


@pytest.mark.parametrize("text, expected", [
    ("4096", 4096), ("8GiB", 8 * 2**30), ("1.5 GB", 1_500_000_000), ("64MiB", 64 * 2**20)])
def test_parse_bytes(text, expected):
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("text", ["", "lots", "8G", "-1", "0", "1e99"])
def test_parse_bytes_refuses_in_one_line(text):
    with pytest.raises(InputTooLargeError, match=MEMORY_LIMIT_ENV):
        parse_bytes(text)


# One spelling table for both places a person types a size: the variable (library) and the
# options (CLI). Each row is accepted by both, with the same bytes, or refused by both.
_SPELLINGS = [("4096", 4096), ("8GiB", 8 * 2**30), ("1.5 GB", 1_500_000_000), ("1kB", 1000),
              (".5KiB", 512), (" 64 MiB ", 64 * 2**20), ("1TiB", 2**40),
              ("", None), ("lots", None), ("8G", None), ("1 mb", None), ("1Gb", None),
              ("-1", None), ("+1", None), ("0", None), ("0.4", None), ("1.5B", None),
              ("1e9", None), ("1_000", None), ("\u0668GiB", None), ("2PiB", None),
              ("1" * 101, None), ("1XB", None), ("KB", None)]


@pytest.mark.parametrize("text, expected", _SPELLINGS)
def test_the_variable_and_the_options_read_sizes_alike(text, expected):
    import argparse

    from collsynth.cli.common import parse_size

    if expected is None:
        with pytest.raises(InputTooLargeError, match=f"^{MEMORY_LIMIT_ENV}=.*expected bytes"):
            parse_bytes(text)
        with pytest.raises(argparse.ArgumentTypeError, match="^size "):
            parse_size(text)
    else:
        assert parse_bytes(text) == parse_size(text) == expected


def test_the_ceiling_comes_from_the_block_else_the_environment(monkeypatch):
    monkeypatch.delenv(MEMORY_LIMIT_ENV, raising=False)
    assert memory_limit_bytes() is None
    monkeypatch.setenv(MEMORY_LIMIT_ENV, "2GB")
    assert memory_limit_bytes() == 2 * 10**9
    soft_before = resource.getrlimit(resource.RLIMIT_DATA)
    with memory_ceiling(10**6):
        assert memory_limit_bytes() == 10**6
        assert resource.getrlimit(resource.RLIMIT_DATA)[0] != resource.RLIM_INFINITY
        with pytest.raises(ResourceLimitError, match=r"needs about 5\.0 MB .* is 1\.0 MB"):
            check_memory(5 * 10**6, "a test request")
        check_memory(10**5, "a small request")
    assert memory_limit_bytes() == 2 * 10**9
    assert resource.getrlimit(resource.RLIMIT_DATA) == soft_before


def test_files_are_read_within_a_tight_ceiling(tmp_path):
    # The reader once asked for its whole bound (1 GiB for an algorithm file) at once.
    result = solve_instance(get_topology("ring:4"), standard_collective("allgather", 4),
                            Instance(steps=2, rounds=3, chunks=2))
    path = tmp_path / "a.json"
    save_algorithm(result.algorithm, path)
    with memory_ceiling(64 * 10**6):
        assert load_algorithm(path).num_steps == 2


def test_cli_memory_limit_refuses_a_schedule_up_front(capsys):
    # DGX-1 allgather: 8 chunks x 7 other ranks per stage, 100000 stages = 5.6M sends.
    code = cli.main(["--memory-limit", "256MiB", "solve", "bandwidth-optimal", "dgx1", "allgather",
                     "--engine", "trees", "--stages", "100000", "-q"])
    err = capsys.readouterr().err
    assert code == cli.EXIT_ERROR
    [line] = err.splitlines()
    assert "5600000 sends needs about" in line and "is 268 MB" in line


def test_cli_memory_limit_must_be_a_size(capsys):
    assert cli.main(["--memory-limit", "lots", "topologies"]) == cli.EXIT_USAGE


@pytest.mark.parametrize("value", ["1", "10MiB", "255MiB"])
def test_a_memory_limit_too_small_to_load_the_libraries_is_a_usage_error(capsys, monkeypatch,
                                                                         value):
    # 10 MiB hung in matplotlib's import (draw), 50 MiB aborted CP-SAT's thread start (solve).
    assert cli.main(["--memory-limit", value, "topologies"]) == cli.EXIT_USAGE
    assert "below the 256 MiB a command needs" in capsys.readouterr().err
    monkeypatch.setenv(MEMORY_LIMIT_ENV, value)
    assert cli.main(["topologies"]) == cli.EXIT_USAGE
    assert f"{MEMORY_LIMIT_ENV}={value!r}" in capsys.readouterr().err
    monkeypatch.setenv(MEMORY_LIMIT_ENV, "256MiB")
    assert cli.main(["topologies"]) == cli.EXIT_OK


# -- requests that cannot fit ---------------------------------------------------------------------


def test_a_thousand_node_system_is_refused_before_it_is_built():
    # 8192 ranks: every one of 8192 chunks to 8191 other ranks = 67100672 sends.
    with pytest.raises(ResourceLimitError, match="67100672 sends"):
        check_request_fits(8192, "allgather", stages=None, time_limit=10)


def test_the_tree_engine_reports_its_time_limit():
    hub = get_topology("hub:16")  # 16 x 15 = 240 sends fit; the bound alone takes longer
    with pytest.raises(TimeLimitReached, match="time limit"):
        solve_bandwidth_optimal(hub, standard_collective("allgather", 16), time_limit=1e-3)


def test_a_slow_machine_gets_the_time_limit_not_a_refusal(monkeypatch):
    # CI once spent the whole 1 ms limit before the up-front size check, which then refused
    # "240 sends take about 0 s; the time limit leaves 0 s". A clock that jumps 10 ms per reading
    # stands in for that machine: the answer must still be the time limit, never the refusal.
    import collsynth.synthesis.bandwidth_optimal.engine as engine

    ticks = iter(range(10**6))
    monkeypatch.setattr(engine.time, "perf_counter", lambda: next(ticks) * 0.01)
    with pytest.raises(TimeLimitReached, match="time limit"):
        solve_bandwidth_optimal(get_topology("hub:16"), standard_collective("allgather", 16),
                                time_limit=1e-3)


def test_cli_time_limit_reached_exit_4(capsys):
    code = cli.main(["solve", "bandwidth-optimal", "hub:16", "allgather", "--engine", "trees",
                     "--time-limit", "0.001", "-q"])
    assert code == cli.EXIT_TIMEOUT
    assert "time limit" in capsys.readouterr().err


def test_check_refuses_a_program_claiming_100000_gpus():
    # More ranks than a file can describe (1024 <gpu> children): a limit problem, and the
    # program is not executed (ngpus x (1 input + 100000 output chunks) = 10000100000 chunks).
    program = read_program(_AG2.format(n=100000, big=100000, cnt=1))
    report = check_program(program, runtime="msccl")
    assert not report.ok and report.layouts_checked == ()
    assert any(p.kind == "limit" and "ngpus=100000: more than the 1024 ranks" in p.message
               for p in report.problems)
    # At 1024 ranks the execution's size is what is refused: 1024 x (4 + 4096) chunks.
    program = read_program(_AG2.format(n=1024, big=4096, cnt=1))
    with pytest.raises(InputTooLargeError, match=f"{1024 * 4100} chunks"):
        check_program(program, runtime="msccl")


def test_check_does_not_execute_a_count_beyond_the_runtime():
    # Within 64 bits but far above the runtime's cnt limit: reported, never executed.
    program = read_program(_AG2.format(n=2, big=2, cnt=10**12))
    report = check_program(program, runtime="msccl")
    assert not report.ok
    assert any(p.kind == "limit" and f"cnt={10**12}" in p.message for p in report.problems)
    # Beyond 64 bits the reader refuses it before anything is built.
    with pytest.raises(FileFormatError, match="beyond the 64-bit range"):
        read_program(_AG2.format(n=2, big=2, cnt=10**23))


def test_run_refuses_buffers_beyond_the_ceiling(capsys, tmp_path):
    pytest.importorskip("torch")
    result = solve_instance(get_topology("ring:4"), standard_collective("allgather", 4),
                            Instance(steps=2))
    path = tmp_path / "a.json"
    save_algorithm(result.algorithm, path)
    code = cli.main(["--memory-limit", "256MiB", "run", str(path), "--size", "256MiB"])
    err = capsys.readouterr().err
    assert code == cli.EXIT_ERROR
    [line] = err.splitlines()
    assert "a run of 4 ranks" in line and "needs about" in line and "is 268 MB" in line


# -- calibrate ------------------------------------------------------------------------------------


def test_binned_means_per_equal_width_bin():
    x = np.array([0.0, 1.0, 2.0, 3.0, 10.0])
    y = np.array([1.0, 3.0, 5.0, 7.0, 9.0])
    bx, by = _binned(x, y, 2)  # bins [0, 5) and [5, 10]
    assert bx.tolist() == [1.5, 10.0] and by.tolist() == [4.0, 9.0]
    same_x, same_y = _binned(x, y, 5)
    assert same_x is x and same_y is y
