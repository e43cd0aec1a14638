"""Mutation round 13: the tree's channels in the program model
(collsynth.timing.program_model: ``_builder_channels`` and its two callers in
``ProgramModel._runtime_choice``, the tree's pipeline in ``ProgramModel._pipeline``), the NVLS
ports (collsynth.timing.switch_graphs.switch_ports and ``_bounds_port``), and the starting guesses
of the fit of the runtime's own choices (collsynth.timing.runtime_fit.fit_runtime_choice).

Each test kills a mutant the earlier suites let live. Every expected figure is worked out by
hand in the comment next to it: from NCCL's source at the tag named (``git -C
/work/.mirror/NVIDIA+nccl/repo show v2.26.2-1:src/enqueue.cc``), from the rule the docs state
(docs/runtime-model.md: "--channels N ... for the tree, too, in NCCL's channels: N / 2 chains,
rounded up"; "a group bounds a rank's NVLS port only when it covers every link of that rank inside
its node"), or from the fit's documented starting rule applied to the curve by hand; never from
the output of the code under test.

The starting guesses are read through the fit's time limit: a fit whose limit has passed before
it starts keeps the best point it evaluated, the first, which is its start (the start is
otherwise washed out by the search, which is how round 11's NV09 mutant of the NVLS share's start
lived).
"""

from __future__ import annotations

import pytest

from tests.test_mutation_round12 import HOPPER, NODE3, _group

KiB, MiB = 1 << 10, 1 << 20


def _nccl():
    from collsynth.runtimes import get_runtime

    return get_runtime("nccl")


# -- the tree pinned to N of NCCL's channels: ceil(N / 2) chains of two trees ---------------------


@pytest.mark.parametrize("channels, runs_on", [(3, 4), (5, 6)])
def test_a_tree_pinned_to_an_odd_count_rounds_its_chains_up(channels, runs_on):
    from collsynth.resolve import resolve_topology
    from collsynth.timing.pricing import RuntimeAlgorithm
    from collsynth.timing.program_model import ProgramModel

    # docs/runtime-model.md: a tree pinned to N channels is N / 2 chains, rounded up, each chain
    # two of NCCL's channels (one tree each). 3 channels: ceil(3 / 2) = 2 chains = 4 channels
    # (rounded down: 1 chain, 2 channels); 5: 3 chains = 6 (rounded down: 4).
    nccl = _nccl()
    tree = RuntimeAlgorithm(nccl, "tree", "allreduce", resolve_topology("dgx-h100", nodes=2),
                            channels=channels)
    (price,) = ProgramModel(nccl.defaults, runtime=nccl).price(tree, [1 << 20])
    assert price.channels == runs_on


def _bare(n=4):
    """``n`` ranks, every pair linked 2 units each way, no machine facts: no tuning setup."""
    from collsynth.topology import Topology

    links = tuple(tuple(0 if a == b else 2 for b in range(n)) for a in range(n))
    return Topology("bare", links, unit_gbps=10.0, alpha_us=1.0)


@pytest.mark.parametrize("channels", [2, 4, 6])
def test_a_tree_pinned_on_a_machine_without_facts_runs_on_the_channels_asked_for(channels):
    from collsynth.timing.pricing import RuntimeAlgorithm
    from collsynth.timing.program_model import ProgramModel

    # Without machine facts there is no tuning setup, so no algorithm_choice: the pinned count
    # goes the other way through _runtime_choice, and is NCCL's channels there too. N channels
    # are N / 2 chains for every protocol priced, N channels in all (taken as chains: 2N).
    nccl = _nccl()
    topology = _bare()
    model = ProgramModel(nccl.defaults, runtime=nccl)
    assert model.tuning(topology, nccl) is None
    tree = RuntimeAlgorithm(nccl, "tree", "allreduce", topology, channels=channels)
    assert {ch for _, ch in model.runtime_choice(tree, 1 << 20)} == {channels // 2}
    (price,) = model.price(tree, [1 << 20])
    assert price.channels == channels


def test_the_trees_pipeline_counts_two_trees_a_chain():
    from collsynth.resolve import resolve_topology
    from collsynth.timing.pricing import RuntimeAlgorithm
    from collsynth.timing.program_model import ProgramModel

    # NCCL v2.26.2-1 enqueue.cc:1859-1863: stepSize = buffSizes[LL] / NCCL_STEPS, chunkSteps 1 for
    # the tree, and LL halves it: DEFAULT_LL_BUFFSIZE (init.cc:606) = 8 lines x 512 threads x 8
    # steps x 16 B = 512 KiB, / 8 = 64 KiB a step, 32 KiB of data a chunk. A 1 MiB allreduce on 4
    # channels (2 chains of two trees) moves 1 MiB / 4 = 256 KiB a tree: 8 chunks a tree, a power
    # of two within tree_pipeline's 4..32 (as one tree a chain: 1 MiB / 2 / 32 KiB = 16).
    nccl = _nccl()
    tree = RuntimeAlgorithm(nccl, "tree", "allreduce", resolve_topology("dgx-h100", nodes=2),
                            channels=4, protocol="LL")
    model = ProgramModel(nccl.defaults, runtime=nccl)
    [(protocol, chains)] = model.runtime_choice(tree, 1 << 20)
    assert (protocol, chains) == ("LL", 2)
    assert model._pipeline(tree, protocol, chains, 1 << 20) == 8


# -- NVLS ports: a group bounds a rank's port only over all its links inside the node -------------


def test_a_group_reaching_another_node_bounds_no_port_though_it_covers_the_node():
    from collsynth.timing.switch_graphs import switch_ports
    from collsynth.topology import Topology, compose_nodes

    # Two NODE3 nodes composed with 1-unit links between them (rank 0 -> rank 3 among them).
    # {0} -> {1, 2, 3} covers every link of rank 0 inside its node (0 -> 1: 4, 0 -> 2: 2) and one
    # to another node (0 -> 3): a NIC-side group, not rank 0's port. Its limit 5 is under its 4 +
    # 2 + 1 = 7 units (it binds), yet rank 0's port out keeps its 6 units (x 10 GB/s x 0.67 =
    # 40.2 GB/s); taking it for the port would give 5 (33.5).
    node = Topology("h3", NODE3, unit_gbps=10.0, alpha_us=1.0, metadata={"machine": HOPPER})
    two = compose_nodes(node, 2, nic_units=1)
    assert two.bandwidth(0, 3) == 1
    dense = Topology("h3x2", two.links, (_group({0}, {1, 2, 3}, 5, "0 out"),),
                     unit_gbps=10.0, alpha_us=1.0, metadata=two.metadata)
    assert [g.name for g in dense.binding_groups] == ["0 out"]
    assert switch_ports(dense)[0][0] == pytest.approx(6 * 6.7)


def test_a_single_links_group_bounds_both_ports_where_it_is_each_ranks_only_link():
    from collsynth.timing.switch_graphs import switch_ports
    from collsynth.topology import Topology

    # Two ranks, 4 units each way; {0} -> {1} of limit 3 covers every link of rank 0 out (its one
    # peer) and every link of rank 1 in: it bounds rank 0's port out and rank 1's port in, both
    # 3 units; the other way stays 4. x 10 GB/s x 0.67: (20.1, 26.8), (26.8, 20.1).
    pair = Topology("h2", ((0, 4), (4, 0)), (_group({0}, {1}, 3),), unit_gbps=10.0,
                    alpha_us=1.0, metadata={"machine": HOPPER})
    expected = ((3, 4), (4, 3))
    ports = [gbps for port in switch_ports(pair) for gbps in port]
    assert ports == pytest.approx([6.7 * units for port in expected for units in port])


# -- the fit of the runtime's own choices: where each constant's search starts --------------------

#: A curve on two DGX H100 (16 ranks). What NCCL runs at each size is its tuning's, not the
#: times': the tree in LL at 8 KiB on 1 channel, in LL128 at 1 MiB on 8, NVLS-tree from 64 MiB
#: (the fit's ``algorithms`` say so, checked below).
TWO_H100_CURVE = ((8 * KiB, 30.0), (1 * MiB, 40.0), (64 * MiB, 400.0), (256 * MiB, 1200.0))


def _started(rows, topology, **options):
    """The fit's constants at its start: its time limit passed before its first step."""
    from collsynth.timing.runtime_fit import fit_runtime_choice

    fit = fit_runtime_choice(list(rows), topology, "allreduce", time_limit_s=1e-9, starts=1,
                             **options)
    assert fit.stopped.startswith("time limit of 1e-09 s reached")
    return fit, {r.name: r for r in fit.report}


@pytest.fixture(scope="module")
def two_h100():
    from collsynth.topology import compose_nodes, get_topology

    return compose_nodes(get_topology("dgx-h100"), 2)


@pytest.fixture(scope="module")
def two_h100_start(two_h100):
    return _started(TWO_H100_CURVE, two_h100)


def test_the_fit_prices_what_nccl_runs_on_two_h100(two_h100_start):
    fit, _ = two_h100_start
    assert fit.algorithms == ("tree/LL/1ch", "tree/LL128/8ch", "nvls_tree/Simple/16ch",
                              "nvls_tree/Simple/16ch")


def test_a_connections_ceiling_starts_at_its_traffic_over_the_curves_slope(two_h100_start):
    # fit_runtime_choice: a protocol's ceiling starts at the traffic a channel carries at its
    # largest size (2 (n - 1) / n of the size for an allreduce, over the call's channels) over the
    # time the curve's slope gives that size (at least 5% of its time), in GB/s. n = 16:
    # LL, largest at 8 KiB, the first size (slope 0): 1.875 x 8192 / 1 channel = 15360 B over
    # max(0, 0.05 x 30 us) = 1.5 us: 10.24 GB/s (a floor of 50%: 15 us, 1.024; (n - 1) / n:
    # 5.12). LL128 at 1 MiB on 8 channels: 1.875 x 1048576 / 8 = 245760 B; slope (40 - 30) /
    # (1048576 - 8192) us a byte, x 1048576 = 10.0787 us: 24.384 GB/s (on 1 channel: 8 times it).
    _, report = two_h100_start
    assert report["ceiling_LL"].value == pytest.approx(15360 / 1.5 / 1e3)
    span = 10 * 1048576 / (1048576 - 8192)
    assert report["ceiling_LL128"].value == pytest.approx(245760 / span / 1e3)


def test_ceilings_across_nodes_reach_at_most_the_nic_and_the_nvls_channel_the_nvlink(
        two_h100_start):
    # The bounds the report states: a connection's ceiling up to the link it crosses, across
    # nodes one NIC (a DGX H100's 400 Gb/s NDR per GPU: 50 GB/s); an NVLS channel's up to the
    # GPU's whole NVLink, 18 links x NCCL's SM90_NVLINK_BW 20.6 GB/s (v2.26.2-1
    # src/graph/topo.h:17) = 370.8 GB/s, not the NIC.
    _, report = two_h100_start
    assert report["ceiling_LL"].high == report["ceiling_LL128"].high == 50.0
    assert report["nvls_channel_gbps"].high == pytest.approx(18 * 20.6)


def test_the_nvls_share_starts_at_the_program_models_hopper_default(two_h100_start):
    # constants.NVLS_PORT_EFFICIENCY: Hopper's port share is 0.67 in the program model (NCCL's
    # own 0.85 is its cost model's); the fit starts there, within NVLS_EFFICIENCY_RANGE 0.3..1.
    _, report = two_h100_start
    assert report["nvls_efficiency"].value == pytest.approx(0.67)
    assert (report["nvls_efficiency"].low, report["nvls_efficiency"].high) == (0.3, 1.0)


def test_a_reduction_starts_at_half_the_hbm_rate(two_h100_start):
    # gamma: 3 bytes of device memory traffic a byte reduced; H100's HBM3 at 3350 GB/s: 3 /
    # 3350e3 us a byte at the full rate (the bound), the start twice it (half the rate).
    _, report = two_h100_start
    assert report["gamma_us_per_byte"].low == pytest.approx(3 / 3350e3)
    assert report["gamma_us_per_byte"].value == pytest.approx(2 * 3 / 3350e3)


def test_the_constants_own_nvls_figures_are_where_the_fit_starts(two_h100):
    from collsynth.runtimes import get_runtime

    # A calibration handed in (constants=) starts the NVLS share and channel rate at its own
    # figures, not at the defaults (0.67, and the runtime's 22.5 GB/s a channel).
    base = get_runtime("nccl").defaults.replace(nvls_efficiency=0.5, nvls_channel_gbps=40.0)
    _, report = _started(TWO_H100_CURVE, two_h100, constants=base)
    assert report["nvls_efficiency"].value == pytest.approx(0.5)
    assert report["nvls_channel_gbps"].value == pytest.approx(40.0)


def test_host_work_starts_at_nine_tenths_of_the_fastest_call_per_gpu_driven():
    from collsynth.topology import get_topology

    # gpus_per_thread 2 (a size of 64 KiB or less, so host work is fitted): host_us starts at
    # 0.9 x the least time (30 us) / 2 GPUs = 13.5 us, channel_us at 0.05 us; the base is then
    # not fitted but NCCL's least documented one, the ring's LL baseLat 6.6 us (v2.26.2-1
    # src/graph/tuning.cc:121, {6.6, 14.0, 8.4}), not the least time.
    rows = ((8 * KiB, 30.0), (1 * MiB, 60.0), (64 * MiB, 400.0))
    _, report = _started(rows, get_topology("dgx-h100"), gpus_per_thread=2)
    assert report["host_us"].value == pytest.approx(13.5)
    assert report["channel_us"].value == pytest.approx(0.05)
    assert report["base_latency_us"].value == pytest.approx(6.6)


@pytest.mark.parametrize("smallest, fitted", [(64 * KiB, True), (128 * KiB, False)])
def test_the_base_is_fitted_from_a_size_of_64_kib_or_less(smallest, fitted):
    from collsynth.topology import get_topology

    # The report says "not fitted: no size of 64 KiB or less": a curve from 64 KiB fits its
    # base, one from 128 KiB keeps NCCL's ring LL baseLat, 6.6 us (tuning.cc:121).
    rows = ((smallest, 30.0), (1 * MiB, 40.0), (64 * MiB, 400.0))
    _, report = _started(rows, get_topology("dgx-h100"))
    assert ("not fitted" not in report["base_latency_us"].why) == fitted
    if not fitted:
        assert report["base_latency_us"].value == pytest.approx(6.6)


def test_a_curve_nccl_runs_without_nvls_fits_no_nvls_figure():
    from collsynth.topology import get_topology

    # The NVLS share and channel rate are fitted only where an NVLS algorithm ran. On one DGX
    # H100, an allreduce of 8 KiB and 1 MiB is NCCL's ring in LL (NVLS from larger sizes):
    # nothing of the switch to fit, so neither figure is in the report.
    fit, report = _started(((8 * KiB, 30.0), (1 * MiB, 60.0)), get_topology("dgx-h100"))
    assert all(a.startswith("ring/") for a in fit.algorithms)
    assert "nvls_efficiency" not in report and "nvls_channel_gbps" not in report


# -- nccl-tests logs: the ranks of one process, threads x GPUs a thread ---------------------------


def test_a_log_without_rank_lines_runs_threads_times_gpus_ranks_a_process():
    from collsynth.timing.logs import parse_log

    # nccl-tests: -t threads per process, -g GPUs per thread, each GPU a rank; its header "#
    # nThread 2 nGpus 4" is 2 x 4 = 8 ranks in the process. A broadcast's busbw is its algbw at
    # every rank count (the ratio says nothing), and no "#  Rank N" lines: the header is all
    # there is to count by (taking nThread alone: 2).
    text = (
        "# nThread 2 nGpus 4 minBytes 1048576 maxBytes 2097152 step: 2(factor) warmup iters: 5 "
        "iters: 20 agg iters: 1 validation: 1 graph: 0\n"
        "#       size         count      type   redop    root     time   algbw   busbw #wrong "
        "    time   algbw   busbw #wrong\n"
        "     1048576        262144     float    none       0    100.0   10.49   10.49      0 "
        "   100.0   10.49   10.49      0\n"
        "     2097152        524288     float    none       0    150.0   13.98   13.98      0 "
        "   150.0   13.98   13.98      0\n")
    log = parse_log(text, name="broadcast_perf.txt")
    assert (log.collective, log.ranks, log.gpus_per_thread) == ("broadcast", 8, 4)
