"""NCCL's tuning model on collsynth topologies, against numbers worked out by hand.

DGX-1: 6 directed NVLink rings of one 25 GB/s unit each, so a bus bandwidth of 150 GB/s.
"""

from __future__ import annotations

import dataclasses
from fractions import Fraction

import pytest

from collsynth.errors import CollsynthError, InvalidInstanceError, UnknownNameError
from collsynth.timing.model import crossover
from collsynth.collective.kinds import busbw_factor
from collsynth.timing.metrics import algbw_gbps, busbw_gbps
from collsynth.timing.rings import ring_channels
from collsynth.timing.tuning_model import NcclChoice, best_choice, nccl_choices, nccl_setup
from collsynth.timing.tuning_model import ring_steps
from collsynth.topology import Topology, get_topology
from collsynth.topology.compose import compose_nodes
from collsynth.topology.families import fully_connected, hub, ring, star


def by_name(choices):
    return {c.name: c for c in choices}


@pytest.fixture(scope="module")
def dgx1_setup():
    return nccl_setup(get_topology("dgx1"))


def test_dgx1_channels(dgx1_setup):
    assert len(dgx1_setup.rings) == 6 and dgx1_setup.bus_gbps == 150.0
    dgx1 = get_topology("dgx1")
    used = [[0] * 8 for _ in range(8)]
    for r in dgx1_setup.rings:
        assert sorted(r) == list(range(8))  # through every rank once
        for a, b in zip(r, r[1:] + r[:1]):
            used[a][b] += 1
    assert all(used[a][b] <= dgx1.links[a][b] for a in range(8) for b in range(8))


def test_dgx1_allgather_by_hand(dgx1_setup):
    choices = by_name(nccl_choices(dgx1_setup, "allgather"))
    assert set(choices) == {"ring/LL", "ring/LL128", "ring/Simple"}  # no tree for allgather
    # latency = base + (n - 1) hops; algbw = 150 x factor x 8/7.
    assert choices["ring/LL"].latency_us == Fraction("10.8")          # 6.6 + 7 x 0.6
    assert choices["ring/LL128"].latency_us == Fraction("27.3")       # 14 + 7 x 1.9
    assert choices["ring/Simple"].latency_us == Fraction("32.2")      # 8.4 + 7 x 3.4
    assert choices["ring/LL"].algbw_gbps == Fraction(600, 7)          # 150 x 0.5 x 8/7
    assert choices["ring/LL128"].algbw_gbps == Fraction(1104, 7)      # 150 x 0.92 x 8/7
    assert choices["ring/Simple"].algbw_gbps == Fraction(1200, 7)     # 150 x 8/7
    # 1 GB with Simple: 32.2 + 10**9 / (1000 x 1200/7) = 32.2 + 5833.33 us.
    assert choices["ring/Simple"].time_us(10**9) == pytest.approx(32.2 + 7e6 / 1200)
    assert choices["ring/LL"].time_us(1000) == pytest.approx(10.8 + 7 / 600)


def test_dgx1_allgather_best_per_size(dgx1_setup):
    choices = nccl_choices(dgx1_setup, "allgather")
    assert best_choice(choices, 10**3).name == "ring/LL"
    assert best_choice(choices, 10**6).name == "ring/LL"        # 22.47 < 33.64 < 38.03 us
    assert best_choice(choices, 10**9).name == "ring/Simple"    # 5865.5 < 6367.9 < 11677 us
    # LL and LL128 meet where 10.8 + 7 s / 600000 = 27.3 + 7 s / 1104000.
    c = by_name(choices)
    expected = Fraction("16.5") / (Fraction(7, 600000) - Fraction(7, 1104000))
    assert crossover(c["ring/LL"], c["ring/LL128"]) == expected


def test_dgx1_allreduce_ring_and_tree(dgx1_setup):
    c = by_name(nccl_choices(dgx1_setup, "all-reduce"))
    assert c["ring/LL"].latency_us == Fraction(15)                    # 6.6 + 14 x 0.6
    assert c["ring/LL"].algbw_gbps == Fraction(300, 7)                # 150 x 0.5 x 8/14
    assert c["ring/Simple"].algbw_gbps == Fraction(600, 7)            # 150 x 8/14
    assert c["tree/LL"].latency_us == Fraction("15.2")                # 6.8 + 2 x 7 x 0.6
    assert c["tree/Simple"].latency_us == Fraction("64.4")            # 8.4 + 2 x 7 x 4
    assert c["tree/Simple"].algbw_gbps == Fraction(69)                # 150 x 0.92 x 0.5
    assert c["tree/LL"].algbw_gbps == Fraction(150) * Fraction("0.92") / Fraction("3.8") / 2
    assert c["tree/LL128"].algbw_gbps == Fraction(150) * Fraction("0.92") * Fraction(7, 9) / 2


def test_dgx1_broadcast(dgx1_setup):
    c = by_name(nccl_choices(dgx1_setup, "broadcast"))
    assert c["ring/LL"].latency_us == Fraction("11.4")                # 6.6 + 8 x 0.6
    assert c["ring/Simple"].latency_us == Fraction("40.4")            # 8.4 + 8 x 4.0 (tree hop)
    assert c["ring/Simple"].algbw_gbps == 150                         # ratio n / n


def test_two_nodes_latency():
    # Two bidirectional 4-rings (1 us, 10 GB/s) joined by NICs; 2 channels of 10 GB/s forced.
    node = Topology("r4", ring(4).links, unit_gbps=10.0, alpha_us=1.0)
    setup = nccl_setup(compose_nodes(node, 2, nic_units=1), channels=2, channel_gbps=10)
    assert (setup.nodes, setup.bus_gbps) == (2, 20.0)
    c = by_name(nccl_choices(setup, "allreduce"))
    # ring: 6.6 + (14 - 2) x 0.6 + 2 x 2.7 network hops.
    assert c["ring/LL"].latency_us == Fraction("19.2")
    # tree: 6.8 + 2 x ((4 - 1) x 0.6 + log2(2) x 5.0).
    assert c["tree/LL"].latency_us == Fraction("20.4")
    assert c["tree/LL128"].algbw_gbps == 20 * Fraction("0.92") * Fraction(120, 128) / 2


def test_ring_channels_on_families():
    assert len(ring_channels(ring(8))) == 2
    assert len(ring_channels(fully_connected(8))) == 7
    assert len(ring_channels(hub(8))) == 1          # 1 unit out of each rank (its group)
    assert ring_channels(star(4)) == ()


def test_no_ring_is_an_error_unless_overridden():
    topology = dataclasses.replace(star(4), unit_gbps=10.0, alpha_us=1.0)
    with pytest.raises(CollsynthError, match="no directed ring"):
        nccl_setup(topology)
    assert nccl_setup(topology, channels=1, channel_gbps=10).bus_gbps == 10.0


def test_collectives_without_an_nccl_model(dgx1_setup):
    assert nccl_choices(dgx1_setup, "alltoall") == ()
    assert nccl_choices(dgx1_setup, "gather") == ()


def test_restricted_protocols(dgx1_setup):
    names = [c.name for c in nccl_choices(dgx1_setup, "allreduce", protocols=("Simple",),
                                          algorithms=("tree",))]
    assert names == ["tree/Simple"]
    with pytest.raises(UnknownNameError, match="protocol"):
        nccl_choices(dgx1_setup, "allreduce", protocols=("LL256",))


def test_ring_steps():
    assert [ring_steps(c, 8) for c in ("allreduce", "allgather", "reduce_scatter", "broadcast",
                                       "reduce")] == [14, 7, 7, 8, 8]
    with pytest.raises(UnknownNameError):
        ring_steps("alltoall", 8)


# -- nccl-tests definitions -----------------------------------------------------------------------


def test_busbw_factors():
    assert busbw_factor("allreduce", 8) == Fraction(7, 4)
    for name in ("reduce_scatter", "allgather", "alltoall"):
        assert busbw_factor(name, 8) == Fraction(7, 8)
    assert busbw_factor("broadcast", 8) == busbw_factor("reduce", 8) == 1
    with pytest.raises(UnknownNameError):
        busbw_factor("custom", 8)


def test_algbw_and_busbw():
    # 1 GB in 10 ms: 100 GB/s algbw; allreduce of 8 ranks: x 7/4 = 175 GB/s busbw.
    assert algbw_gbps(10**9, 10_000) == pytest.approx(100.0)
    assert busbw_gbps("allreduce", 8, 10**9, 10_000) == pytest.approx(175.0)
    assert busbw_gbps("allgather", 8, 10**9, 10_000) == pytest.approx(87.5)
    with pytest.raises(InvalidInstanceError):
        algbw_gbps(10**9, 0)


def test_ring_simple_busbw_is_the_channels(dgx1_setup):
    # At large sizes ring/Simple's busbw tends to the 150 GB/s of the channels.
    choice = by_name(nccl_choices(dgx1_setup, "allreduce"))["ring/Simple"]
    size = 10**12
    assert busbw_gbps("allreduce", 8, size, choice.time_us(size)) == pytest.approx(150, rel=1e-4)


def test_choice_symbolic_time():
    choice = NcclChoice("ring", "LL", "allgather", 8, Fraction(10), Fraction(100))
    expr = choice.symbolic_time()
    from collsynth.timing.model import SIZE

    assert expr.subs(SIZE, 10**5) == 11  # 10 + 10**5 / (1000 x 100)


def test_composed_rings_cross_each_node_once():
    # Two DGX-1s, 4 EDR NICs per node (12.5 GB/s, one per GPU pair): 4 rings, 50 GB/s of bus
    # bandwidth; every ring leaves and enters a node once, within every link and group limit.
    topology = compose_nodes(get_topology("dgx1"), 2)
    setup = nccl_setup(topology)
    assert (len(setup.rings), setup.bus_gbps, setup.nodes) == (4, 50.0, 2)
    used: dict[tuple[int, int], int] = {}
    for r in setup.rings:
        assert sorted(r) == list(range(16))
        crossings = sum(1 for a, b in zip(r, r[1:] + r[:1]) if a // 8 != b // 8)
        assert crossings == 2
        for a, b in zip(r, r[1:] + r[:1]):
            used[a, b] = used.get((a, b), 0) + 1
    assert all(count <= topology.links[a][b] for (a, b), count in used.items())
    for group, covered in topology.effective_groups:
        assert sum(used.get(link, 0) for link in covered) <= group.limit


def test_the_ring_search_on_a_composed_machine_reads_links_as_it_reaches_them(monkeypatch):
    """On thousands of ranks the NIC groups cover millions of links (4096 ranks: over 6 GB as
    dense tables, found by the hostile-input hunt through `plan`): the search must not build
    the effective groups or copy the link matrix. Two DGX-H100 nodes: each ring crosses both
    nodes once, through one NIC each way (ring_channels' docstring)."""
    from collsynth.timing.rings import ring_channels
    from collsynth.topology import get_topology
    from collsynth.topology.compose import compose_nodes
    from collsynth.topology.model import Topology

    system = compose_nodes(get_topology("dgx-h100"), 2)

    def refused(self):
        raise AssertionError("effective_groups built")

    monkeypatch.setattr(Topology, "effective_groups", property(refused))
    rings = ring_channels(system)
    assert rings
    for ring in rings:
        assert sorted(ring) == list(range(16))
        crossings = sum((a < 8) != (b < 8) for a, b in zip(ring, ring[1:] + ring[:1]))
        assert crossings == 2


@pytest.mark.parametrize("node, count, options", [
    ("GB200-NVL72", 3, {}), ("MI300X", 4, {}), ("dgx1", 2, {"nic_units": 1}),
    ("DGX-A100", 8, {"fabric": "rail"}),
    ("DGX-A100", 8, {"fabric": "leaf-spine", "nodes_per_leaf": 2}),
    ("DGX-H100", 6, {"oversubscription": 2})])
def test_composed_rings_track_one_node_inside_as_all_of_them(node, count, options):
    # compose_nodes makes every node alike, so the search may track node 0's links inside a
    # node for all of them; the full search over every node (alike=False) is the other
    # formulation, and both find the same rings
    from collsynth.timing.rings import _composed_rings
    from collsynth.topology import get_topology
    from collsynth.topology.compose import compose_nodes

    topology = compose_nodes(get_topology(node), count, **options)
    per = topology.layout.ranks_per_node
    every = _composed_rings(topology, per, count, 64, 200_000, alike=False)
    assert every and _composed_rings(topology, per, count, 64, 200_000) == every
