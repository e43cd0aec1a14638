"""Mutation round 11: the runtime's ring folded by node (collsynth.timing.ring_fold), the fold's
orbits and weights (collsynth.timing.symmetry), the ring the program model and the ring fit
prepare (collsynth.timing.runtime_programs), the NVLS port's default share
(collsynth.timing.switch_graphs.nvls_port_efficiency), and the text of sizes and lists
(collsynth._parse.size_from_text, format_version_is; collsynth.cli.common.comma_entries).

Each test kills a mutant the earlier suites let live. Every expected figure is worked out by
hand in the comment next to it, or comes from another formulation of the same thing (the whole
ring program prepared by ``prepare_program`` against the folded one), never from the output of
the code under test.
"""

from __future__ import annotations

import argparse

import pytest

from collsynth.runtimes import get_runtime
from collsynth.timing.ring_fold import folded_ring, node_periodic
from collsynth.timing.runtime_baselines import ring_program, runtime_rings
from collsynth.timing.runtime_model import prepare_program, simulate_program
from collsynth.timing.symmetry import folded_members, rotate_nodes
from collsynth.topology import get_topology
from collsynth.topology.compose import compose_nodes

SIZES = (1024, 3 << 20, 256 << 20)


def _constants():
    # a reduction and copy cost (NCCL's documented gamma is 0), so the copies count
    return get_runtime("nccl").defaults.replace(gamma_us_per_byte=2e-6)


def _times(prepared, protocol=None):
    return [simulate_program(prepared, None, s, _constants(), protocol=protocol).time_us
            for s in SIZES]


# -- node_periodic: the rule the fold rests on ----------------------------------------------------


def test_a_ring_whose_length_is_no_multiple_of_the_node_is_not_periodic():
    # (0, 1, 2) with 2 ranks a node: position p + 2 mod 3 holds ring[p] + 2 mod 3 at every
    # position (p=0: ring[2]=2=0+2; p=1: ring[0]=0=3 mod 3; p=2: ring[1]=1=4 mod 3), but 3
    # ranks are not nodes of 2, so the ring does not go through nodes in turn.
    assert not node_periodic((0, 1, 2), 2)
    assert node_periodic((0, 1, 2, 3), 2)


def test_periodicity_is_checked_past_the_first_node():
    # Three nodes of 2: node 0 -> node 1 repeats (ring[2] = 2, ring[3] = 3), but node 2 holds
    # (5, 4) where the rule asks ring[4] = ring[2] + 2 = 4. Checking node 0's positions alone
    # (enough on two nodes, where the third condition is the first's mirror) misses it.
    assert not node_periodic((0, 1, 2, 3, 5, 4), 2)
    assert node_periodic((0, 1, 2, 3, 4, 5), 2)
    # ... and a machine of three such nodes does not fold that ring: its third node's hop
    # 5 -> 4 has no image on node 0.
    three = compose_nodes(get_topology("dgx-h100"), 3)
    shuffled = tuple(range(16)) + (17, 16) + tuple(range(18, 24))
    assert not node_periodic(shuffled, 8)
    assert folded_ring("allreduce", [shuffled], three) is None


# -- folded_ring: what it refuses ------------------------------------------------------------------


def test_a_ring_that_is_no_permutation_is_not_folded():
    # (0, .., 6, 1, 8, .., 14, 9) repeats from node to node (ring[p + 8] = ring[p] + 8) and
    # every hop has a direct link (6 -> 1 and 14 -> 9 over NVSwitch, 1 -> 8 and 9 -> 0 over
    # the NICs), but it visits ranks 1 and 9 twice and 7 and 15 never; the fold declines it,
    # and the whole ring_program refuses it by name.
    from collsynth.errors import InvalidInstanceError

    two = compose_nodes(get_topology("dgx-h100"), 2)
    bad = tuple(range(7)) + (1,) + tuple(range(8, 15)) + (9,)
    assert node_periodic(bad, 8)
    assert folded_ring("allgather", [bad], two) is None
    with pytest.raises(InvalidInstanceError, match="not a permutation"):
        ring_program("allgather", [bad])


def test_a_hop_without_a_direct_link_is_not_folded():
    # DGX-1's hybrid cube mesh has no NVLink between GPUs 3 and 4 (its links' row 3 is
    # 1 2 2 0 0 0 0 1): the ring 0..15 on two DGX-1 repeats by node but hop 3 -> 4 goes through
    # the host. folded_ring's docstring: None for "a send with no direct link"; the caller then
    # prepares the whole ring, 16 ranks x (16 + 1) allgather steps.
    from collsynth.timing.runtime_programs import prepared_ring

    two = compose_nodes(get_topology("dgx1"), 2)
    ring = tuple(range(16))
    assert get_topology("dgx1").links[3][4] == 0
    assert folded_ring("allgather", [ring], two) is None
    assert prepared_ring("allgather", [ring], two).num_transfers == 16 * 17


def test_one_leaf_holding_every_node_folds_by_node():
    # leaf-spine with both nodes under one leaf: no route crosses the spine, so moving every
    # node one on is a symmetry and the graph holds node 0's 8 positions (half the ring); the
    # leaf period (2 nodes, the whole machine) is no fold at all. Times as the whole ring.
    one_leaf = compose_nodes(get_topology("dgx-h100"), 2, fabric="leaf-spine", nodes_per_leaf=2,
                             oversubscription=2)
    rings = runtime_rings(one_leaf, 2)
    whole = prepare_program(ring_program("allgather", rings), one_leaf)
    folded = folded_ring("allgather", rings, one_leaf)
    assert folded is not None
    assert folded.num_transfers == 8 * 2 * 17 and whole.num_transfers == 16 * 2 * 17
    assert _times(folded, "Simple") == pytest.approx(_times(whole, "Simple"), rel=1e-9)


# -- folded_ring: the graph it builds is the whole ring's, a node's share ---------------------------


@pytest.mark.parametrize("collective", ["allgather", "reduce_scatter", "allreduce"])
def test_the_fold_receives_where_the_whole_ring_does(collective):
    # In the whole ring program a step receives (match >= 0) iff it takes what the rank before
    # sent at the previous step; allgather's final local copy (NCCL's out-of-place "cpy")
    # receives nothing. The folded graph holds one node's share of every kind of transfer, so
    # its receives x nodes are the whole ring's, and its copies receive nothing.
    nodes = 2
    two = compose_nodes(get_topology("dgx-h100"), nodes)
    rings = runtime_rings(two, 2)
    whole = prepare_program(ring_program(collective, rings), two)
    folded = folded_ring(collective, rings, two)
    receives = sum(1 for m in folded.match if m >= 0)
    assert receives * nodes == sum(1 for m in whole.match if m >= 0)
    for kind in set(whole.kind):
        assert sum(1 for k in folded.kind if k == kind) * nodes == \
            sum(1 for k in whole.kind if k == kind)
        assert sum(1 for k, m in zip(folded.kind, folded.match) if k == kind and m >= 0) \
            * nodes == sum(1 for k, m in zip(whole.kind, whole.match) if k == kind and m >= 0)


@pytest.mark.parametrize("collective", ["allgather", "reduce_scatter", "allreduce"])
def test_the_fold_keeps_the_whole_rings_bus_factor_and_protocol(collective):
    # The bus bandwidth factor is the whole ring's (n - 1) / n (allreduce 2 (n - 1) / n) of all
    # 16 ranks, not of a node's 8; the program keeps the protocol asked for, so simulating it
    # with no protocol override runs LL as the whole LL ring does.
    two = compose_nodes(get_topology("dgx-h100"), 2)
    rings = runtime_rings(two, 2)
    whole = prepare_program(ring_program(collective, rings, protocol="LL"), two)
    folded = folded_ring(collective, rings, two, protocol="LL")
    factor = {"allgather": 15 / 16, "reduce_scatter": 15 / 16, "allreduce": 30 / 16}[collective]
    assert folded.busbw_factor == pytest.approx(factor)
    assert folded.busbw_factor == pytest.approx(whole.busbw_factor)
    assert folded.program.proto == "LL"
    assert _times(folded) == pytest.approx(_times(whole), rel=1e-9)


# -- folded_members: orbits and weights by hand ---------------------------------------------------


def _ports(spec):
    # resource index = the ranks the spec names, in order (a port per rank)
    return tuple(spec[1:])


def test_two_resources_of_one_orbit_count_twice():
    # Two GPUs turned (one node of 2): shard 0's route 0 -> 1 crosses port 0 and port 1, one
    # orbit {0, 1}. The whole graph has shard 0 (0 -> 1) and shard 1 (1 -> 0), each crossing
    # both ports: port 0 carries 2 transfers per unit of rate, so the one row weighs
    # copies x (2 / orbit of 2) x 2 resources of the orbit = 2 (3 channels: 6).
    members, weights = folded_members([[("route", 0, 1)]], [3], _ports, [10.0, 10.0], 2)
    assert members.tolist() == [[0, 0]]
    assert weights.tolist() == [6.0]


def test_an_orbit_is_named_by_its_least_resource():
    # The docstring: "each resource is replaced by the least index of its orbit". Shard 0 holds
    # rank 1's port only; turning maps 1 -> 0 -> 1, the orbit {0, 1}, named 0 (not 1, the one
    # met first). Weight: 1 x (2 / 2) x 1.
    members, weights = folded_members([[("up", 1)]], [1], _ports, [10.0, 10.0], 2)
    assert members.tolist() == [[0, 0]]
    assert weights.tolist() == [1.0]


def test_a_rotation_of_larger_order_than_turned_is_refused():
    # turned = 2 but the rotation moves 0 -> 1 -> 2 -> 0 (order 3): specs ("a", 0) and ("a", 2)
    # give the images 0 -> 1, 1 -> 2, 2 -> 0, one orbit of 3, longer than the 2 images the graph
    # stands for (it would weigh 2 // 3 = 0). Not a symmetry of order 2: refused.
    def rotate(spec, i):
        return (spec[0], (spec[1] + i) % 3)

    assert folded_members([[("a", 0)], [("a", 2)]], [1, 1], _ports, [10.0] * 3, 3, 2,
                          rotate=rotate) is None
    # the same rotation with turned = 3 is one: the orbit of 3 weighs 3 / 3 per transfer
    members, weights = folded_members([[("a", 0)], [("a", 2)]], [1, 1], _ports, [10.0] * 3, 3,
                                      3, rotate=rotate)
    assert members.tolist() == [[0, 0], [1, 0]]
    assert weights.tolist() == [1.0, 1.0]
    # rotate_nodes is of order `nodes`: 3 nodes of 2 come back after 3 moves
    assert rotate_nodes(("a", 1), 3, 2, 3) == ("a", 1)


# -- runtime_programs: the ring's early refusal and what the ring fit prepares ------------------------


def test_the_early_refusal_counts_one_channel_folded_by_node(monkeypatch):
    # _ring refuses before the ring search at one ring, a node's share where the ring folds:
    # allgather on two DGX-H100 (16 ranks) has 16 + 1 steps a rank, so one channel folded is
    # 8 x 1 x 17 = 136 steps (the fold's own count, m x channels x steps), the whole ring 272,
    # two channels folded 272. With the simulator's limit at 136 the one-channel ring is priced,
    # one step less and it is refused, naming the fold.
    from collsynth.errors import InputTooLargeError
    from collsynth.timing import runtime_model
    from collsynth.timing.runtime_programs import runtime_program

    two = compose_nodes(get_topology("dgx-h100"), 2)
    monkeypatch.setattr(runtime_model, "MAX_SIMULATED_STEPS", 136)
    assert runtime_program("ring", "allgather", two, 1).num_transfers == 136
    monkeypatch.setattr(runtime_model, "MAX_SIMULATED_STEPS", 135)
    with pytest.raises(InputTooLargeError, match="folded by node"):
        runtime_program("ring", "allgather", two, 1)


# -- comma_entries: the place of an empty entry ---------------------------------------------------


@pytest.mark.parametrize("text,place", [("1MB,,2MB", "entry 2 of 3"), (",1MB,", "entry 1 of 3"),
                                        ("1MB, ", "entry 2 of 2"), ("1MB,2MB,,", "entry 3 of 4")])
def test_an_empty_entry_is_named_by_its_first_place(text, place):
    # The docstring: "an empty entry is refused naming its place", counted from 1 over every
    # comma-separated entry: "1MB,,2MB" splits into 3 entries, the 2nd empty; ",1MB," into 3,
    # the 1st and 3rd empty (the first is named); a blank entry is empty once stripped.
    from collsynth.cli.common import comma_entries

    with pytest.raises(argparse.ArgumentTypeError) as caught:
        comma_entries(text, "sizes")
    assert str(caught.value) == (f"sizes {text!r}: {place} is empty; expected sizes separated "
                                 "by single commas")


@pytest.mark.parametrize("text", ["", " ", " , ,"])
def test_no_entry_at_all_asks_for_a_list(text):
    # Nothing but blanks and commas: no place to name, the list itself is missing.
    from collsynth.cli.common import comma_entries

    with pytest.raises(argparse.ArgumentTypeError) as caught:
        comma_entries(text, "sizes")
    assert str(caught.value) == f"sizes {text!r}: expected sizes separated by commas"


# -- format_version_is and size_from_text ---------------------------------------------------------


def test_every_accepted_version_is_accepted():
    # calibration files accept versions 1 and 2 (format_version_is(version, 1, FORMAT_VERSION)).
    from collsynth._parse import format_version_is

    assert format_version_is(2, 1, 2) and format_version_is(1, 1, 2)
    assert not format_version_is(3, 1, 2) and not format_version_is(2.0, 1, 2)


@pytest.mark.parametrize("text,size", [
    ("512", 512),                  # no unit: bytes
    ("1", 1),                      # the least size, one byte
    (".5KB", 500),                 # a number may start at its point
    ("1.KB", 1000),                # ... or end at it (as float() reads "1.")
    ("1.1MB", 1_100_000),          # 11/10 x 10**6, exactly (a float 1.1 is not 11/10)
    ("0.5KiB", 512),               # half of 2**10
    ("1kB", 1000),                 # SI's kB is a decimal unit too
    ("1024TiB", 1 << 50),          # 2**10 x 2**40: MAX_SIZE_BYTES itself
])
def test_sizes_by_hand(text, size):
    from collsynth._parse import size_from_text

    assert size_from_text(text) == size


@pytest.mark.parametrize("text,why", [
    ("1.5B", "not a whole number of bytes"),
    ("0.4B", "not a whole number of bytes"),
    ("1025TiB", "more than 1 PiB"),
    ("1t", "ambiguous unit 't': write TB (10**12 bytes) or TiB (2**40 bytes)"),
    ("1b", "ambiguous unit 'b': bytes or bits?"),
    ("1_000KB", "numbers take no '_' separators"),
])
def test_sizes_refused_by_hand(text, why):
    from collsynth._parse import NumberTextError, size_from_text

    with pytest.raises(NumberTextError) as caught:
        size_from_text(text)
    assert str(caught.value).startswith(why)


@pytest.mark.parametrize("collective", ["broadcast", "reduce"])
def test_rooted_rings_move_one_step_per_slice_in_simple(collective):
    # NCCL's BROADCAST_SLICESTEPS and REDUCE_SLICESTEPS are 1 (src/device/common.h): in Simple
    # their chains move one FIFO step per slice, NCCL_BUFFSIZE 4 MiB / NCCL_STEPS 8 = 512 KiB of
    # data. Both the program model's ring (runtime_program) and the ring fit's (prepared_ring)
    # prepare it so, on one node and on two (where rooted rings do not fold).
    from collsynth.timing.runtime_model import PreparedProgram
    from collsynth.timing.runtime_programs import prepared_ring, runtime_program

    for machine in (get_topology("dgx-h100"), compose_nodes(get_topology("dgx-h100"), 2)):
        built = runtime_program("ring", collective, machine, 2, "Simple")
        assert isinstance(built, PreparedProgram) and built.slice_bytes == 512 * 1024
        fitted = prepared_ring(collective, runtime_rings(machine, 2), machine, "Simple")
        assert fitted.slice_bytes == 512 * 1024
        assert fitted.program.proto == "Simple"


# -- the NVLS port's default share ----------------------------------------------------------------


@pytest.mark.parametrize("topology,share", [("dgx-h100", 0.67), ("gb200-nvl72", 0.74)])
def test_a_calibrated_port_share_equal_to_the_default_changes_nothing(topology, share):
    # The graph's ports are built at the default share (NVLS_PORT_EFFICIENCY: 0.67 Hopper; NCCL's
    # nvlsEfficiency 0.74 Blackwell) and a calibration's nvls_efficiency rescales them by
    # calibrated / default: calibrating to the default itself is a factor of 1, the same times
    # as no calibration; half the default halves the ports, so a large allgather (port-bound)
    # takes longer.
    from collsynth.timing.switch_graphs import nvls_graph

    machine = get_topology(topology)
    graph = nvls_graph("allgather", machine, 2)
    plain = get_runtime("nccl").defaults
    assert graph.switch_efficiency == pytest.approx(share)
    for size in (1 << 20, 1 << 30):
        alone = simulate_program(graph, None, size, plain).time_us
        same = simulate_program(graph, None, size, plain.replace(nvls_efficiency=share)).time_us
        assert same == pytest.approx(alone, rel=1e-12)
    half = plain.replace(nvls_efficiency=share / 2)
    assert simulate_program(graph, None, 1 << 30, half).time_us > \
        1.5 * simulate_program(graph, None, 1 << 30, plain).time_us


@pytest.mark.parametrize("collective", ["allgather", "broadcast"])
def test_the_ring_fit_prepares_the_protocol_asked_for(collective):
    # prepared_ring(..., "LL") is the LL ring, folded (allgather) or whole (broadcast): its
    # program says LL, and simulated with no protocol override it times as the whole LL ring
    # prepared by prepare_program (broadcast in LL is not cut into one-step slices: that is
    # Simple's). Without a protocol, prepared_ring prepares Simple (its signature's default).
    from collsynth.timing.runtime_programs import prepared_ring

    two = compose_nodes(get_topology("dgx-h100"), 2)
    rings = runtime_rings(two, 2)
    fitted = prepared_ring(collective, rings, two, "LL")
    whole = prepare_program(ring_program(collective, rings, protocol="LL"), two)
    assert fitted.program.proto == "LL"
    assert _times(fitted) == pytest.approx(_times(whole), rel=1e-9)
    assert prepared_ring(collective, rings, two).program.proto == "Simple"
