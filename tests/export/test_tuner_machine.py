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
from collsynth.export.tuner.machine import (ProgramModelPrice, candidate_choices,
                                            channel_counts, config_collective, forced_channels,
                                            tune_machine)
from collsynth.runtimes import get_runtime
from collsynth.timing.pricing import RuntimeAlgorithm
from collsynth.timing.program_model import ProgramModel
from collsynth.resolve import resolve_topology
from collsynth.timing import tuning_model as tm

SIZES = [64 << (3 * k) for k in range(10)]   # 64 B .. 8 GiB in x8 steps
MACHINES = [("dgx-a100", 1, "nccl"), ("dgx-h100", 2, "nccl"), ("mi300x", 1, "rccl")]


@pytest.fixture(scope="module", params=MACHINES, ids=lambda m: f"{m[0]}x{m[1]}")
def tuned(request):
    name, nodes, runtime = request.param
    topology = resolve_topology(name, nodes=nodes)
    setup = tm.tuning_setup(topology)
    assert setup.runtime == runtime
    # simulations of 16 ranks or 44 channels are slow: allgather only there (the CI budget)
    collectives = ["allreduce", "allgather"] if name == "dgx-a100" else ["allgather"]
    return name, setup, tune_machine(setup, collectives, SIZES,
                                     price=ProgramModelPrice(topology))


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
    assert "program model" in machine.prices
    assert any("program model" in line for line in machine.summary_lines(name))


def test_the_program_model_prices_candidate_and_default_alike():
    """Each price is the program model's for the runtime's algorithm pinned to the protocol and
    to the channels the call runs on, built here directly. DGX A100, allgather ring/Simple at
    16 MiB: NCCL runs it on several channels by itself (tuning_model.call_shape), on 1 when 1
    is forced, and the model prices the two differently. One DGX H100, allreduce at
    1 GiB: NCCL's own choice (tuning_model.choose) is NVLS/Simple, priced the same way."""
    def direct(topology, algorithm, collective, protocol, channels, size):
        subject = RuntimeAlgorithm(get_runtime("nccl"), algorithm, collective, topology,
                                   channels=channels, protocol=protocol)
        return ProgramModel(get_runtime("nccl").defaults).price(subject, [size])[0].time_us

    a100 = resolve_topology("dgx-a100")
    setup = tm.tuning_setup(a100)
    price = ProgramModelPrice(a100)
    size = 1 << 24
    own = tm.call_shape(setup, "allgather", "ring", "Simple", size).channels
    assert own > 1
    assert forced_channels(setup, "allgather", Choice("ring", "simple"), size) == own
    assert forced_channels(setup, "allgather", Choice("ring", "simple", 1), size) == 1
    by_own = price(setup, "allgather", Choice("ring", "simple"), size)
    by_one = price(setup, "allgather", Choice("ring", "simple", 1), size)
    assert by_own == pytest.approx(direct(a100, "ring", "allgather", "Simple", own, size))
    assert by_one == pytest.approx(direct(a100, "ring", "allgather", "Simple", 1, size))
    assert by_one != pytest.approx(by_own)
    # no program of tree for allgather: not a candidate there
    assert price(setup, "allgather", Choice("tree", "ll"), 4096) is None

    h100 = resolve_topology("dgx-h100")
    setup = tm.tuning_setup(h100)
    chosen = tm.choose(setup, "allreduce", 1 << 30)
    assert (chosen.algorithm, chosen.protocol) == ("nvls", "Simple")
    machine = tune_machine(setup, ["allreduce"], [1 << 30], price=ProgramModelPrice(h100))
    row, = machine.collectives[0].tuning.rows
    assert row.default == Choice("nvls", "simple")
    assert row.default_time_us == pytest.approx(
        direct(h100, "nvls", "allreduce", "Simple", chosen.shape.channels, 1 << 30))


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
    argv = ["tune-runtime", "--topology", topology, "--nodes", str(nodes), "--runtime", runtime,
            "--sizes", "1MiB:8MiB", "--collectives", "allgather", "-o", str(out_file)]
    code, out, err = run(capsys, *argv)
    assert code == 0, err
    assert "allgather:" in out and "allreduce:" not in out and "gain" in out
    assert "program model" in out and f"wrote {out_file}" in out
    parsed = parse_tuner_config(out_file.read_bytes(), runtime=runtime)
    assert parsed.rules and not parsed.notes
    code, text, err = run(capsys, *argv, "--json")
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
    (["--topology", "dgx-a100", "--runtime", "nccl", "--calibration", "x.json"], 1,
     "x.json"),
    (["--topology", "dgx-a100", "--runtime", "nccl", "--collectives", "alltoall"], 2,
     "--collectives: collective 'alltoall'"),
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


def test_tune_runtime_prices_with_the_calibration(capsys, tmp_path):
    """A runtime-constants calibration replaces the documented constants: with every base
    latency 100 us higher, NCCL's own choice at 1 MiB is priced 100 us slower (the base latency
    is paid once per call); another runtime's calibration is refused."""
    from collsynth.timing.calibration import RuntimeCalibration, save_calibration

    nccl = get_runtime("nccl").defaults
    slow = nccl.replace(base_latency_us={p: v + 100 for p, v in nccl.base_latency_us.items()})
    save_calibration(RuntimeCalibration(slow), tmp_path / "slow.json")
    save_calibration(RuntimeCalibration(get_runtime("rccl").defaults), tmp_path / "rccl.json")
    argv = ["tune-runtime", "--topology", "dgx-a100", "--runtime", "nccl", "--collectives",
            "allgather", "--sizes", "1MiB:2MiB", "-o", str(tmp_path / "t.conf"), "--json"]
    times = []
    for extra in ([], ["--calibration", str(tmp_path / "slow.json")]):
        code, text, err = run(capsys, *argv, *extra)
        assert code == 0, err
        ranges = json.loads(text)["collectives"][0]["ranges"]
        row, = [row for r in ranges for row in r["rows"] if row["size_bytes"] == 1 << 20]
        times.append(row["default_time_us"])
    assert times[1] == pytest.approx(times[0] + 100)
    code, _, err = run(capsys, *argv, "--calibration", str(tmp_path / "rccl.json"))
    assert code == 2 and "--calibration" in err and "rccl" in err


def test_the_table_and_the_files_header_give_each_rule_one_gain(capsys, tmp_path):
    """The H100 NVLS allgather row read 1.2-1.28x in the table (sampled sizes only) and
    1.05-1.28x in the file's header (the range's ends too): the rule covers its ends, so both
    now give the figure over every size priced in the range."""
    import re

    out_file = tmp_path / "tuner.conf"
    code, out, err = run(capsys, "tune-runtime", "--topology", "DGX-H100", "--runtime", "nccl",
                         "--collectives", "allgather", "-o", str(out_file))
    assert code == 0, err
    table = {cells[0]: cells[-1] for line in out.splitlines()
             if (cells := [c.strip() for c in line.split("|")])[-1].endswith("x")}
    header = dict(re.findall(r"#   allgather (\d+\.\.\S+) B: \S+, (\S+x) faster",
                             out_file.read_text()))
    assert header and table == header


def test_nvls_is_never_forced_on_fewer_channels_than_the_runtimes_own():
    # With no rate of one NVLS channel that any curve identified, the model priced NVLS-tree
    # on 2 channels as fast as on 16 at 128 MiB (the ports bind either way), and the H100 x2
    # config forced 2 channels at 64-184 MiB for a predicted 1.03-1.12x. NCCL's maintainers
    # say NVLS needs 16 SMs for its peak (4 with registered buffers): fewer NVLS channels
    # than NCCL's own are not candidates; more, and the other algorithms' counts, still are.
    h100 = resolve_topology("dgx-h100")
    setup = tm.tuning_setup(h100)
    price = ProgramModelPrice(h100)
    size = 128 << 20
    own = forced_channels(setup, "allreduce", Choice("nvls", "simple"), size)
    assert own == 16
    assert price(setup, "allreduce", Choice("nvls", "simple"), size) is not None
    assert price(setup, "allreduce", Choice("nvls", "simple", 16), size) is not None
    for fewer in (1, 2, 8):
        assert price(setup, "allreduce", Choice("nvls", "simple", fewer), size) is None
    assert price(setup, "allreduce", Choice("ring", "simple", 2), size) is not None
    # A small call runs NVLS on fewer channels by NCCL's own scheduler: forcing that count,
    # or one between it and 16, is allowed.
    small = 64 << 10
    few = forced_channels(setup, "allreduce", Choice("nvls", "simple"), small)
    assert few < 16
    assert price(setup, "allreduce", Choice("nvls", "simple", few), small) is not None
    assert price(setup, "allreduce", Choice("nvls", "simple", 16), small) is not None
