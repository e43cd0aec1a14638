"""The host's work per call (issue 21's T1): one thread launching several GPUs in turn.

Expected values are hand counts: a call takes the larger of the host's work (GPUs driven x
(``host_us`` + ``channel_us`` x channels)) and the device's (base + simulated makespan, the
doctest's ring of 4 on 10 GB/s links with 2 us hops), and a planted curve's constants are what
a fit must find again.
"""

from __future__ import annotations

import json

import pytest

from collsynth.cli import main
from collsynth.errors import InvalidInstanceError
from collsynth.runtimes import get_runtime
from collsynth.runtimes.constants import (DEFAULT_HOST_US, NCCL_DEFAULTS, constants_from_dict,
                                         constants_to_dict)
from collsynth.timing.logs import load_log, parse_log
from collsynth.timing.pricing import RuntimeAlgorithm
from collsynth.timing.program_model import ProgramModel, chosen_algorithms
from collsynth.timing.runtime_baselines import ring_program
from collsynth.timing.runtime_fit import FittedConstant, fit_runtime
from collsynth.timing.runtime_model import SimulationOptions, simulate_program
from collsynth.topology import get_topology
from collsynth.topology.builtins import with_figures

from tests.timing.test_calibration_targets import ROOT

KiB, MiB = 1 << 10, 1 << 20
NCCL = get_runtime("nccl")


@pytest.fixture(scope="module")
def ring4():
    return with_figures(get_topology("ring:4"), unit_gbps=10.0, alpha_us=2.0)


def test_a_call_takes_the_slower_of_the_host_and_the_device(ring4):
    two = ring_program("allgather", [(0, 1, 2, 3), (0, 1, 2, 3)], protocol="Simple")
    c = NCCL_DEFAULTS.replace(host_us=10.0, channel_us=1.0)
    device = simulate_program(two, ring4, 4000, NCCL_DEFAULTS).time_us
    # one GPU per thread: 10 + 2 channels x 1 = 12 us of host work, under the device's time
    assert device > 12
    assert simulate_program(two, ring4, 4000, c).time_us == pytest.approx(device)
    # 8 GPUs per thread: 8 x 12 = 96 us, above it: the host sets the pace
    eight = SimulationOptions(gpus_per_thread=8)
    assert device < 96
    t = simulate_program(two, ring4, 4000, c, options=eight)
    assert t.time_us == pytest.approx(96.0) and t.breakdown["host_us"] == pytest.approx(96.0)
    # a size whose device time is above 96 us: the device's time again
    big = simulate_program(two, ring4, 4_000_000, NCCL_DEFAULTS).time_us
    assert big > 96
    assert simulate_program(two, ring4, 4_000_000, c, options=eight).time_us == \
        pytest.approx(big)


def test_the_documented_defaults_launch_each_gpu_a_thread_drives():
    """Uncalibrated, a thread driving 8 GPUs launches 8 kernels a call: 8 x 4.2 = 33.6 us for
    a one-channel 1 KiB ring (the superbench A100 fit, 35 us measured there), while a process
    per GPU pays the device's time, which is above one launch."""
    a100 = get_topology("DGX-A100")
    ring = RuntimeAlgorithm(NCCL, "ring", "allreduce", a100)
    one = ProgramModel(NCCL_DEFAULTS, runtime=NCCL).price(ring, [KiB])[0]
    eight = ProgramModel(NCCL_DEFAULTS, runtime=NCCL,
                         options=SimulationOptions(gpus_per_thread=8)).price(ring, [KiB])[0]
    assert one.channels == eight.channels == 1
    assert 4.2 < one.time_us < 33.6
    assert eight.time_us == pytest.approx(33.6)


def test_the_host_pays_per_channel_the_runtime_runs():
    a100 = get_topology("DGX-A100")
    ring = RuntimeAlgorithm(NCCL, "ring", "allreduce", a100)
    c = NCCL_DEFAULTS.replace(host_us=4.0, channel_us=0.25)
    model = ProgramModel(c, runtime=NCCL, options=SimulationOptions(gpus_per_thread=8))
    small, mid = model.price(ring, [KiB, MiB])
    # NCCL runs 1 channel at 1 KiB and all 24 at 1 MiB (LL: one per 32 KiB on 8 ranks):
    # 8 x (4 + 0.25) = 34 us and 8 x (4 + 24 x 0.25) = 80 us, above the device's time
    assert (small.channels, mid.channels) == (1, 24)
    assert small.time_us == pytest.approx(34.0) and mid.time_us == pytest.approx(80.0)


@pytest.mark.parametrize("bad", [0, 73, True, 2.0])
def test_gpus_per_thread_is_a_whole_number_within_a_node(bad):
    with pytest.raises(InvalidInstanceError, match="gpus_per_thread"):
        SimulationOptions(gpus_per_thread=bad)


def test_host_constants_are_bounded_and_round_trip():
    c = NCCL_DEFAULTS.replace(host_us=4.2, channel_us=0.2)
    assert constants_from_dict(constants_to_dict(c), base=NCCL_DEFAULTS) == c
    old = {k: v for k, v in constants_to_dict(NCCL_DEFAULTS).items()
           if k not in ("host_us", "channel_us")}
    loaded = constants_from_dict(old, base=NCCL_DEFAULTS)  # a file from before host work
    assert (loaded.host_us, loaded.channel_us) == (DEFAULT_HOST_US, 0.0)
    with pytest.raises(InvalidInstanceError, match="channel_us"):
        NCCL_DEFAULTS.replace(channel_us=5.0)
    with pytest.raises(InvalidInstanceError, match="host_us"):
        NCCL_DEFAULTS.replace(host_us=-1.0)


def test_none_is_not_a_bound_for_host_work():
    assert not FittedConstant("channel_us", 0.0, 0.0, 2.0, "x", open_low=True).at_bound
    assert FittedConstant("channel_us", 2.0, 0.0, 2.0, "x", open_low=True).at_bound
    assert FittedConstant("base_latency_us", 0.0, 0.0, 30.0, "x").at_bound


def test_logs_say_how_many_gpus_a_thread_drove():
    superbench = load_log(ROOT / "data/nccl-tests/A100-8gpu_all_reduce_superbench.txt")
    assert superbench.gpus_per_thread == 8  # '# nThread 1 nGpus 8'
    p4d = load_log(ROOT / "data/nccl-tests/A100-16gpu-2node-p4d_all_reduce_awsdocs.txt")
    assert p4d.gpus_per_thread == 1
    text = json.dumps({"version": 1, "config": {"nthreads": 2, "ngpus": 4},
                       "args": ["all_reduce_perf"],
                       "results": [{"size": 1024, "count": 256, "type": "float",
                                    "redop": "sum", "root": -1,
                                    "out_of_place": {"time": 10.0, "alg_bw": 0.1,
                                                     "bus_bw": 0.2, "nwrong": 0}}]})
    assert parse_log(text, name="x.json", collective="allreduce").gpus_per_thread == 4


def test_a_fit_finds_the_planted_host_work_again():
    """A curve priced by the model with host work planted (8 GPUs per thread, as nccl-tests -g 8)
    must give that host work back; told one GPU per thread, the fit has none to find."""
    a100 = get_topology("DGX-A100")
    planted = NCCL_DEFAULTS.replace(host_us=4.0, channel_us=0.2)
    eight = SimulationOptions(gpus_per_thread=8)
    model = ProgramModel(planted, runtime=NCCL, options=eight)
    sizes = [1 << k for k in range(3, 31, 3)] + [MiB, 2 * MiB]
    sizes = sorted(set(sizes))
    chosen = chosen_algorithms(model, NCCL, "allreduce", a100, sizes)
    rows = [(s, model.price(a, [s])[0].time_us) for a, s in zip(chosen, sizes)]
    fit = fit_runtime(rows, a100, "allreduce", runtime="nccl", gpus_per_thread=8,
                      held_out=False)
    assert fit.parameters["host_us"] == pytest.approx(4.0, rel=0.1)
    assert fit.parameters["channel_us"] == pytest.approx(0.2, rel=0.2)
    assert fit.gmae < 0.05
    single = fit_runtime(rows, a100, "allreduce", runtime="nccl", held_out=False)
    assert "host_us" not in single.parameters
    assert (single.constants.host_us, single.constants.channel_us) == (DEFAULT_HOST_US, 0.0)


def test_time_prices_a_thread_driving_several_gpus(tmp_path, capsys):
    from collsynth.timing.calibration import RuntimeCalibration, save_calibration

    cal = tmp_path / "cal.json"
    save_calibration(RuntimeCalibration(NCCL_DEFAULTS.replace(host_us=4.0, channel_us=0.25)),
                     cal)
    args = ["time", "--collective", "allreduce", "--topology", "DGX-A100", "--sizes", "1KiB",
            "--calibration", str(cal), "--json"]
    assert main(args + ["--gpus-per-thread", "8"]) == 0
    found = json.loads(capsys.readouterr().out)
    rows = [r for r in found if r["name"] == "nccl-ring"]
    # 8 x (4 + 1 channel x 0.25) us: NCCL's ring runs one LL channel at 1 KiB
    assert rows and rows[0]["time_us"] == pytest.approx(34.0)
    assert main(args + ["--gpus-per-thread", "100"]) == 2
    assert "at most 72 GPUs per thread" in capsys.readouterr().err


def test_calibrate_reads_how_many_gpus_a_thread_drove(tmp_path, capsys):
    from collsynth.cli.calibrate import _curve_rows

    log = ROOT / "data/nccl-tests/A100-8gpu_all_reduce_superbench.txt"
    rows, collective, drove, _, version = _curve_rows(str(log), None)
    assert (collective, drove, len(rows), version) == ("allreduce", 8, 32, None)
    p4d = ROOT / "data/nccl-tests/A100-16gpu-2node-p4d_all_reduce_awsdocs.txt"
    assert _curve_rows(str(p4d), None)[3:] == ("nccl", "2.7.8+cuda11.0")  # its banner
    csv = tmp_path / "curve.csv"
    csv.write_text("size_bytes,time_us\n1024,10\n2048,11\n")
    assert _curve_rows(str(csv), None)[2] is None
    # more GPUs than one thread can drive: a usage error before any fit
    args = ["calibrate", "--model", "program", str(csv), "--topology", "DGX-A100", "--runtime",
            "nccl", "--collective", "allreduce", "-o", str(tmp_path / "cal.json"),
            "--gpus-per-thread", "100"]
    assert main(args) == 2
    assert "at most 72" in capsys.readouterr().err
    assert not (tmp_path / "cal.json").exists()
