"""The runtime's own choices in the program model, link classes, and honest calibration
(issue 21, parts A and B).

Expected values are hand counts from NCCL's own rules (docs/runtime-tuning.md, the figures of
NCCL 2.30.7 quoted there) and from the machines' datasheets, not read back from the code:
- DGX-A100: NCCL's search finds 12 rings of 20 GB/s (12 NVLinks x 25 GB/s = 300 GB/s per GPU,
  speed 20 keeps 12 channels; 20 < 25 so no duplication); the communicator doubles them to 24.
  So one channel carries 12 x 20 / 24 = 10 GB/s (Simple), half for LL, min(0.92 x 10, 20 x
  12 / 24) = 9.2 for LL128.
- NCCL's channel loop: ring Simple drops a channel while size < channels x 512 threads x 64 B.
"""

from __future__ import annotations

import json
import math

import pytest

from collsynth.cli import main
from collsynth.runtimes import get_runtime
from collsynth.runtimes.constants import (CLASS_LATENCY_US, NCCL_DEFAULTS, constants_from_dict,
                                          constants_to_dict, gamma_range)
from collsynth.timing.pricing import RuntimeAlgorithm
from collsynth.timing.program_model import ProgramModel
from collsynth.timing.runtime_fit import (FittedConstant, RuntimeFit, fit_runtime,
                                          protocol_split)
from collsynth.timing.tuning_model import (algorithm_choice, call_cap_gbps, connection_gbps,
                                           tuning_setup)
from collsynth.topology import get_topology
from collsynth.topology.compose import compose_nodes
from collsynth.topology.machine import with_machine

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
NCCL = get_runtime("nccl")


@pytest.fixture(scope="module")
def a100():
    return get_topology("DGX-A100")


def test_per_channel_ceilings_come_from_the_runtimes_graph(a100):
    setup = tuning_setup(a100, runtime="nccl")
    assert (setup.ring.channels, setup.ring.bw_intra_gbps, setup.comm_channels) == (12, 20.0, 24)
    got = [connection_gbps(setup, "ring", p) for p in ("LL", "LL128", "Simple")]
    assert got == pytest.approx([5.0, 9.2, 10.0])
    # LL's cap on a whole call: llMaxBws, Ampere on one node: 87.7 GB/s
    assert call_cap_gbps(setup, "ring", "LL") == 87.7


def test_protocol_and_channels_grow_with_the_size(a100):
    setup = tuning_setup(a100, runtime="nccl")
    # 1 KiB: NCCL's estimates are LL 6.6 + 14 x 0.6 = 15 us, LL128 14 + 14 x 1.9 = 40.6,
    # Simple 8.4 + 14 x 3.4 = 56 (plus bytes / bandwidth, negligible): LL on 1 channel
    # (1024 < 1 x 512 x 64 x 8 ranks keeps shrinking to 1).
    protocol, shape = algorithm_choice(setup, "allreduce", "ring", KiB)
    assert (protocol, shape.channels) == ("LL", 1)
    # Simple pinned at 64 KiB: 65536 < nc x 32768 while nc > 2, so 2 channels.
    protocol, shape = algorithm_choice(setup, "allreduce", "ring", 64 * KiB, ("Simple",))
    assert (protocol, shape.channels) == ("Simple", 2)
    # 1 GiB: Simple on every one of the communicator's 24 channels.
    protocol, shape = algorithm_choice(setup, "allreduce", "ring", GiB)
    assert (protocol, shape.channels) == ("Simple", 24)


def test_channels_are_the_machines_never_the_calibrations(a100):
    # A calibration measured on 3 channels does not make the runtime run 3 on this machine.
    model = ProgramModel(NCCL_DEFAULTS.replace(channels=3), runtime=NCCL)
    ring = RuntimeAlgorithm(NCCL, "ring", "allreduce", a100)
    big, small = model.price(ring, [GiB, KiB])
    assert (big.protocol, big.channels) == ("Simple", 24)
    assert (small.protocol, small.channels) == ("LL", 1)
    # Pinned channels win.
    pinned = RuntimeAlgorithm(NCCL, "ring", "allreduce", a100, channels=4)
    assert model.price(pinned, [GiB])[0].channels == 4


def test_the_ll_call_cap_is_shared_by_the_calls_channels(a100):
    model = ProgramModel(NCCL_DEFAULTS, runtime=NCCL)
    ring = RuntimeAlgorithm(NCCL, "ring", "allreduce", a100)
    base = model.constants_on(a100, ring)
    assert base.ceiling("intra", "LL") == pytest.approx(5.0)
    # 24 channels share 87.7 GB/s: 3.654 each, below the 5 GB/s of one channel
    capped = model._call_constants(base, ring, "LL", 24)
    assert capped.ceiling("intra", "LL") == pytest.approx(87.7 / 24)
    # one channel: its own 5 GB/s binds
    assert model._call_constants(base, ring, "LL", 1).ceiling("intra", "LL") == \
        pytest.approx(5.0)


def test_the_network_class_sets_hops_and_the_base_per_call():
    two = with_machine(compose_nodes(get_topology("DGX-H100"), 2), network_class="efa")
    model = ProgramModel(NCCL_DEFAULTS, runtime=NCCL)
    on = model.constants_on(two)
    # EFA: NCCL's NET hops plus 25 us per network hop (the p5 two-node small call's extra,
    # (69 - 13 - 2 x 2.7) / 2 hops of NCCL's tree), nothing per call
    assert on.base_latency("Simple") == pytest.approx(8.4)
    assert [on.hop_latency("network", p) for p in ("LL", "LL128", "Simple")] == \
        pytest.approx([2.7 + 25, 4.0 + 25, 14.0 + 25])
    assert CLASS_LATENCY_US["ib"] == (2.7, 4.0, 14.0)
    # Constants fitted on that network keep their own figures.
    fitted = NCCL_DEFAULTS.replace(network_class="efa", network_base_us=7.0,
                                   hop_latency_us={"intra": dict(NCCL_DEFAULTS.hop_latency_us
                                                                 ["intra"]),
                                                   "network": {"LL": 1.0, "LL128": 2.0,
                                                               "Simple": 3.0}})
    on = ProgramModel(fitted, runtime=NCCL).constants_on(two)
    assert on.base_latency("LL") == pytest.approx(6.6 + 7.0)
    assert on.hop_latency("network", "Simple") == 3.0
    # One node: no network figures at all.
    one = ProgramModel(NCCL_DEFAULTS, runtime=NCCL).constants_on(get_topology("DGX-H100"))
    assert one.base_latency("Simple") == 8.4


def test_constants_file_round_trips_the_network_fields_and_old_files_load():
    c = NCCL_DEFAULTS.replace(network_class="roce", network_base_us=4.5)
    assert constants_from_dict(constants_to_dict(c), base=NCCL_DEFAULTS) == c
    old = {k: v for k, v in constants_to_dict(NCCL_DEFAULTS).items()
           if k not in ("network_class", "network_base_us")}
    assert constants_from_dict(old, base=NCCL_DEFAULTS).network_class is None


def test_gamma_is_bounded_by_device_memory():
    # A100 (sm80): 1555 GB/s HBM; a reduced byte moves 3 bytes: 3 / 1.555e6 us per byte.
    low, high = gamma_range("sm80")
    assert low == pytest.approx(3 / 1.555e6) and high == pytest.approx(20 * 3 / 1.555e6)


def test_a_spike_or_a_tiny_size_drop_is_not_a_protocol_switch():
    # The H100 p5 log: 13 us at 16 B, a 22 us spike at 32 B, 14 us at 64 B.
    sizes = [8, 16, 32, 64, 128, 256]
    times = [12.9, 13.0, 22.0, 14.0, 15.0, 16.0]
    assert set(protocol_split(times, sizes=sizes)) == {"Simple"}
    # The same spike at larger sizes: back to within 10% of the time two sizes before.
    assert set(protocol_split([40, 42, 70, 43, 45, 48], sizes=[8 * KiB << i for i in range(6)])
               ) == {"Simple"}
    # A drop at 1 KiB where another algorithm takes over (RCCL's MSCCL on MI300X): not one.
    assert set(protocol_split([19, 23, 23, 14, 14, 15], sizes=[128, 256, 512, 1024, 2048,
                                                                4096])) == {"Simple"}
    # A drop that holds, above 4 KiB: the switch.
    assert protocol_split([40, 60, 90, 70, 80, 100], sizes=[16 * KiB << i for i in range(6)]) \
        == ["LL"] * 3 + ["Simple"] * 3


def test_a_report_flags_constants_at_a_bound():
    c = FittedConstant("ceiling_LL", 240.0, 0.5, 240.0, "to the link")
    assert c.at_bound and c.within
    assert not FittedConstant("hop_scale", 1.0, 0.125, 8.0, "x").at_bound
    fit = RuntimeFit(NCCL_DEFAULTS, {}, (1,), (1.0,), (1.2,), ("LL",), 0.2, 0.05,
                     report=(c,))
    assert len(fit.warnings) == 2 and "in-sample GMAE 20.0%" in fit.warnings[0]


def test_calibrate_strict_fails_on_an_implausible_curve(tmp_path, capsys):
    # Four sizes measured at 1 us on a DGX-A100: no plausible constants reproduce them (NCCL
    # pays its hops), so the fit warns; --strict exits 1, and the file is still written.
    curve = tmp_path / "curve.csv"
    curve.write_text("size_bytes,time_us\n1024,1\n2048,1\n4096,1\n8192,1\n")
    out = tmp_path / "cal.json"
    args = ["calibrate", "--model", "program", str(curve), "--topology", "DGX-A100",
            "--runtime", "nccl", "--collective", "allreduce", "-o", str(out), "--json"]
    assert main(args + ["--strict"]) == 1
    summary = json.loads(capsys.readouterr().out)
    assert summary["warnings"] and out.exists()
    names = [c["name"] for c in summary["report"]]
    assert names[:2] == ["base_latency_us", "hop_scale"] and "gamma_us_per_byte" in names
    assert all(c["low"] <= c["value"] <= c["high"] for c in summary["report"])
    assert main(args) == 0


def test_a_program_sees_the_nvlink_rate_nccls_ring_is_priced_with():
    """One yardstick: on NVLink, a program's links carry NCCL's per-link figure (20 GB/s on
    sm70), not the nominal 25 GB/s, as NCCL's own ring does. A one-channel ring allgather on
    DGX-1 whose slowest hop is one NVLink moves 7/8 of the buffer over it: 7/8 x 1 GiB at
    20 GB/s, by hand (at 25 GB/s it would be 20% faster than anything NCCL can run)."""
    from collsynth.runtimes import get_runtime
    from collsynth.timing.program_model import ProgramModel
    from collsynth.timing.runtime_baselines import ring_program
    from collsynth.topology import get_topology

    dgx1 = get_topology("dgx1")
    ring = [0, 1, 2, 3, 7, 6, 5, 4]
    assert min(dgx1.links[a][b] for a, b in zip(ring, ring[1:] + ring[:1])) == 1
    nccl = get_runtime("nccl")
    model = ProgramModel(nccl.defaults, runtime=nccl, topology=dgx1)
    size = 1 << 30
    (price,) = model.price(ring_program("allgather", [ring]), [size])
    by_hand_us = 7 / 8 * size / 20e3
    assert price.time_us == pytest.approx(by_hand_us, rel=0.01)


@pytest.mark.parametrize("nodes, ring_hops, tree_hops", [(2, 4, 2), (4, 8, 4)])
def test_a_networks_extra_latency_is_paid_per_network_hop(nodes, ring_hops, tree_hops):
    """EFA against InfiniBand: 25 us more per network hop on the small call's critical path.
    Hand counts: a ring allreduce is 2(n - 1) consecutive transfers around a ring that crosses
    the network once per node, so on 2 nodes (16 ranks, 2 network edges) its longest chain of
    30 crosses 4 network edges, on 4 nodes (32 ranks, 4 edges) its chain of 62 crosses 8; the
    tree goes up and down its depth across nodes (1 on 2 nodes, 2 on 4)."""
    times = {}
    for net in ("ib", "efa"):
        topo = with_machine(compose_nodes(get_topology("DGX-H100"), nodes), network_class=net)
        model = ProgramModel(NCCL_DEFAULTS, runtime=NCCL)
        for algorithm, channels in (("ring", 1), ("tree", 2)):
            subject = RuntimeAlgorithm(NCCL, algorithm, "allreduce", topo, channels=channels,
                                       protocol="LL")
            times[net, algorithm] = model.price(subject, [8])[0].time_us
    assert times["efa", "ring"] - times["ib", "ring"] == pytest.approx(25.0 * ring_hops, abs=0.01)
    assert times["efa", "tree"] - times["ib", "tree"] == pytest.approx(25.0 * tree_hops, abs=0.01)


def test_nccls_tree_correction_slows_its_tree_at_the_sizes_its_table_names(monkeypatch):
    """NCCL's treeCorrectionFactor (src/graph/tuning.cc) for Simple is .9 at index
    log2(256 MiB / 64) = 22 and has no entry at 23 (512 MiB): NCCL's tree allreduce on 2
    DGX-H100 nodes, priced with the table and again with every factor 1, should take 1 / 0.9
    times as long at 256 MiB (its bandwidth-bound part scaled; the hop latencies are not, hence
    the 2% margin) and exactly as long at 512 MiB. RCCL applies none of its factors (they are
    choice fudges: docs/runtime-model.md), so its tree is unchanged at both."""
    import collsynth.timing.tuning_model as tuning

    def times(runtime, constants, topology, sizes):
        model = ProgramModel(constants, runtime=runtime)
        tree = RuntimeAlgorithm(runtime, "tree", "allreduce", topology, channels=8,
                                protocol="Simple")
        return [p.time_us for p in model.price(tree, sizes)]

    rccl = get_runtime("rccl")
    nccl_topo = with_machine(compose_nodes(get_topology("DGX-H100"), 2), network_class="ib")
    amd = with_machine(compose_nodes(get_topology("MI300X"), 2), network_class="roce")
    sizes = [256 * MiB, 512 * MiB]
    nccl = times(NCCL, NCCL_DEFAULTS, nccl_topo, sizes)
    amd_times = times(rccl, rccl.defaults, amd, sizes)
    monkeypatch.setattr(tuning, "bandwidth_correction", lambda *args, **kwargs: 1.0)
    plain = times(NCCL, NCCL_DEFAULTS, nccl_topo, sizes)
    assert nccl[0] / plain[0] == pytest.approx(1 / 0.9, rel=0.02)
    assert nccl[1] == pytest.approx(plain[1], rel=1e-12)
    assert times(rccl, rccl.defaults, amd, sizes) == pytest.approx(amd_times, rel=1e-12)


def test_time_says_where_nccls_tree_correction_applied(capsys):
    """`collsynth time` names the factor it priced NCCL's tree at: 1 MiB on two DGX-H100 nodes
    runs the tree in LL128, whose entry at log2(1 MiB / 64) = 14 in NCCL's table is 0.6; at
    1 GiB (index 24, past the table) nothing is scaled, so nothing is said."""
    assert main(["time", "--collective", "allreduce", "--topology", "dgx-h100", "--nodes", "2",
                 "--sizes", "1MiB", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    (tree,) = [r for r in rows if r["name"] == "nccl-tree"]
    assert (tree["protocol"], tree["note"]) == ("LL128", "NCCL's tree correction x0.6")
    assert main(["time", "--collective", "allreduce", "--topology", "dgx-h100", "--nodes", "2",
                 "--sizes", "1MiB"]) == 0
    assert "nccl-tree: bandwidth at NCCL's tree correction for each size (x0.6 here" in \
        capsys.readouterr().out
    assert main(["time", "--collective", "allreduce", "--topology", "dgx-h100", "--nodes", "2",
                 "--sizes", "1GiB"]) == 0
    assert "tree correction" not in capsys.readouterr().out
