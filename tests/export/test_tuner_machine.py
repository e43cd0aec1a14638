"""Tuner configs for real machines (DGX A100, DGX H100 x2, MI300X), and ``collsynth
tune-runtime`` end to end: what is written reads back, under each runtime's own parse rules, to
the intended rules, and every call then runs what the tuning decided."""

from __future__ import annotations

import json

import pytest

from collsynth import cli
from collsynth.export.tuner.choose import ALWAYS_AVAILABLE, Choice
from collsynth.export.tuner.config import (COLLECTIVES, MAX_LINE_BYTES, SIZE_MAX,
                                           parse_as_nccl_example, parse_as_rccl,
                                           parse_tuner_config, runtime_outcome,
                                           write_tuner_config)
from collsynth.export.tuner.machine import (_price_with_tuning_model, candidate_choices,
                                            channel_counts, config_collective, tune_machine)
from collsynth.resolve import resolve_topology
from collsynth.timing import tuning_model as tm

SIZES = [64 << (2 * k) for k in range(14)]   # 64 B .. 4 GiB in x4 steps
MACHINES = [("dgx-a100", 1, "nccl"), ("dgx-h100", 2, "nccl"), ("mi300x", 1, "rccl")]


@pytest.fixture(scope="module", params=MACHINES, ids=lambda m: f"{m[0]}x{m[1]}")
def tuned(request):
    name, nodes, runtime = request.param
    setup = tm.tuning_setup(resolve_topology(name, nodes=nodes))
    assert setup.runtime == runtime
    return name, setup, tune_machine(setup, ["allreduce", "allgather", "reducescatter"], SIZES)


def _probes(r):
    """Sizes to try in a range: its ends, and a size in the middle."""
    top = min(r.max_bytes, 1 << 50)
    return sorted({r.min_bytes, top, (r.min_bytes + top) // 2})


def test_the_config_reads_back_to_the_intended_rules(tuned, tmp_path):
    name, setup, machine = tuned
    path = write_tuner_config(machine.rules, tmp_path / "tuner.conf", runtime=setup.runtime,
                              header=machine.summary_lines(name))
    data = path.read_bytes()
    parsed = parse_tuner_config(data, runtime=setup.runtime)
    assert parsed.rules == machine.rules and not parsed.notes
    # The other runtime's rules read it the same way (the file has none of the quirks).
    other = parse_as_rccl if setup.runtime == "nccl" else parse_as_nccl_example
    assert other(data).rules == machine.rules
    for line in data.decode("ascii").split("\n")[:-1]:
        assert line and not line[0].isspace() and len(line.encode()) <= MAX_LINE_BYTES
    assert f"nNodes={setup.nodes} nRanks={setup.ranks}" in data.decode()
    assert all(r.n_nodes == setup.nodes and r.n_ranks == setup.ranks for r in parsed.rules)


def test_every_call_runs_what_the_tuning_decided(tuned):
    name, setup, machine = tuned
    rules = parse_tuner_config(
        "\n".join(",".join(map(str, r.values())) for r in machine.rules) + "\n",
        runtime=setup.runtime).rules
    covered = {c.collective for c in machine.collectives}
    if setup.runtime == "nccl":
        assert covered == set(COLLECTIVES)   # nothing falls through to one channel
    for c in machine.collectives:
        for r in c.tuning.ranges:
            for size in _probes(r):
                got = runtime_outcome(rules, setup.runtime, c.collective, size, setup.nodes,
                                      setup.ranks)
                if not r.keep:
                    assert (got.algorithm, got.protocol, got.channels) == \
                        (r.choice.algorithm, r.choice.protocol, r.choice.channels)
                elif setup.runtime == "rccl":
                    assert got.rule is None       # RCCL keeps its own choice
                else:
                    assert (got.algorithm, got.protocol, got.channels) == \
                        (r.choice.algorithm, r.choice.protocol, None)
                if setup.runtime == "nccl":       # even where the forced pair is IGNORE
                    fallback = runtime_outcome(rules, "nccl", c.collective, size, setup.nodes,
                                               setup.ranks, available=ALWAYS_AVAILABLE)
                    assert fallback.rule is not None
                    assert fallback.channels != 1 or r.choice.channels == 1
        # Another communicator size matches no row.
        assert runtime_outcome(rules, setup.runtime, c.collective, 4096, setup.nodes,
                               setup.ranks + 1).rule is None


def test_a_forced_range_is_predicted_faster_by_the_threshold(tuned):
    _, setup, machine = tuned
    for c in machine.collectives:
        for r in c.tuning.gains:
            for row in r.rows:
                assert row.time_us * (1 + machine.threshold) < row.default_time_us


def test_the_figures_of_the_three_machines(tuned):
    name, setup, machine = tuned
    assert sum(len(c.tuning.gains) for c in machine.collectives) > 0
    if setup.runtime == "nccl":
        # From 64 MiB every call of NCCL's own choice runs on all its channels, where the price
        # is NCCL's own estimate and NCCL's choice is the least estimate: nothing can beat it.
        for c in machine.collectives:
            for r in c.tuning.gains:
                assert r.max_bytes < 64 << 20, (c.collective, r)


def test_the_placeholder_price_by_hand():
    """dgx-h100, one node, allreduce ring/LL at 64 KiB: NCCL's nMaxChannels is 2 (it drops
    channels while 65536 < nc x 512 threads x 64 B), the cell scheduler would use 16 (LL traffic
    64 KiB x 2 x 4 = 512 KiB over 32 KiB cells): the bandwidth term of NCCL's estimate is
    scaled by 24/2 on its own and by 24/16 when 16 channels are forced; at 1 GiB the call uses
    every channel and the price is NCCL's estimate."""
    setup = tm.tuning_setup(resolve_topology("dgx-h100"))
    assert setup.comm_channels == 24
    estimate = tm.algo_time_us(setup, "allreduce", "ring", "LL", 65536)
    bandwidth = 65536 / (1000 * estimate.algbw_gbps)
    latency = estimate.time_us - bandwidth
    own = _price_with_tuning_model(setup, "allreduce", Choice("ring", "ll"), 65536)
    forced = _price_with_tuning_model(setup, "allreduce", Choice("ring", "ll", 16), 65536)
    assert own == pytest.approx(latency + bandwidth * 24 / 2)
    assert forced == pytest.approx(latency + bandwidth * 24 / 16)
    big = tm.algo_time_us(setup, "allreduce", "nvls", "Simple", 1 << 30)
    assert _price_with_tuning_model(setup, "allreduce", Choice("nvls", "simple"), 1 << 30) == \
        pytest.approx(big.time_us)
    assert _price_with_tuning_model(setup, "allgather", Choice("tree", "ll"), 4096) is None


def test_candidates_are_the_enabled_pairs_on_each_channel_count():
    setup = tm.tuning_setup(resolve_topology("dgx-h100"))
    found = candidate_choices(setup, "allreduce")
    pairs = sorted({(c.algorithm, c.protocol) for c in found})
    # one DGX H100: tree and ring with the three protocols, NVLS Simple (no NVLS tree on one
    # node, no CollNet without SHARP, no PAT with 8 GPUs per node)
    assert pairs == sorted([("tree", p) for p in ("ll", "ll128", "simple")]
                           + [("ring", p) for p in ("ll", "ll128", "simple")]
                           + [("nvls", "simple")])
    assert {c.channels for c in found if c.algorithm == "nvls"} == {None, 1, 2, 4, 8, 16}
    assert {c.channels for c in found if c.algorithm == "ring"} == {None, 1, 2, 4, 8, 16, 24}
    assert channel_counts(1) == (1,) and channel_counts(32) == (1, 2, 4, 8, 16, 32)


@pytest.mark.parametrize("given, expected", [("reduce_scatter", "reducescatter"),
                                             ("ReduceScatter", "reducescatter"),
                                             ("all-gather", "allgather"), ("bcast", "broadcast")])
def test_collective_names_become_the_config_spelling(given, expected):
    assert config_collective(given) == expected


def test_a_collective_no_tuner_covers_is_refused():
    with pytest.raises(Exception, match="alltoall"):
        config_collective("alltoall")


# -- the command line ---------------------------------------------------------------------------


def run(capsys, *argv):
    code = cli.main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize("topology, nodes, runtime", MACHINES)
def test_tune_runtime_end_to_end(capsys, tmp_path, topology, nodes, runtime):
    out_file = tmp_path / "tuner.conf"
    code, out, err = run(capsys, "tune-runtime", "--topology", topology, "--nodes", str(nodes),
                         "--runtime", runtime, "--sizes", "64B:1GiB", "-o", str(out_file))
    assert code == 0, err
    assert "allreduce:" in out and "reducescatter:" in out and "gain" in out
    assert f"wrote {out_file}" in out
    parsed = parse_tuner_config(out_file.read_bytes(), runtime=runtime)
    assert parsed.rules and not parsed.notes
    code, text, err = run(capsys, "tune-runtime", "--topology", topology, "--nodes", str(nodes),
                          "--runtime", runtime, "--sizes", "64B:1GiB", "-o", str(out_file),
                          "--json")
    assert code == 0, err
    summary = json.loads(text)
    assert summary["rules"] == [",".join(map(str, r.values())) for r in parsed.rules]
    assert summary["nodes"] == nodes and summary["runtime"] == runtime
    gains = [r for c in summary["collectives"] for r in c["ranges"] if not r["keep"]]
    assert gains and all(row["speedup"] > 1.03 for r in gains for row in r["rows"])


def test_tune_runtime_one_collective_and_a_threshold(capsys, tmp_path):
    out_file = tmp_path / "t.csv"
    code, out, err = run(capsys, "tune-runtime", "--topology", "mi300x", "--runtime", "rccl",
                         "--collectives", "reduce_scatter", "--threshold", "1000%", "-o",
                         str(out_file))
    assert code == 0, err
    assert "reducescatter:" in out and "allreduce:" not in out
    assert "the file holds no rule" in out
    assert parse_as_rccl(out_file.read_text()).rules == ()


@pytest.mark.parametrize("argv, code, fragment", [
    (["--topology", "dgx-a100", "--runtime", "rccl"], 2, "run nccl"),
    (["--topology", "ring:8", "--runtime", "nccl"], 1, "architecture"),
    (["--topology", "dgx-a100", "--runtime", "nccl", "--calibration", "x.json"], 2,
     "--calibration"),
    (["--topology", "dgx-a100", "--runtime", "nccl", "--collectives", "alltoall"], 1,
     "alltoall"),
    (["--topology", "dgx-a100", "--runtime", "nccl", "--collectives", ","], 2, "--collectives"),
    (["--topology", "dgx-a100", "--runtime", "nccl", "--sizes", "1GiB:1KiB"], 2, "FROM"),
    (["--topology", "dgx-a100", "--runtime", "nccl", "--threshold", "-1"], 2, "fraction"),
    (["--topology", "no-such-machine", "--runtime", "nccl"], 1, "no-such-machine"),
])
def test_tune_runtime_refuses_bad_input(capsys, tmp_path, argv, code, fragment):
    out_file = tmp_path / "t.conf"
    got, out, err = run(capsys, "tune-runtime", *argv, "-o", str(out_file))
    assert got == code, err
    assert fragment in err and len(err.strip().splitlines()) == 1
    assert not out_file.exists()


def test_tune_runtime_checks_the_output_first(capsys, tmp_path):
    got, _, err = run(capsys, "tune-runtime", "--topology", "dgx-a100", "--runtime", "nccl",
                      "-o", str(tmp_path / "missing" / "t.conf"))
    assert got == 1 and "does not exist" in err
