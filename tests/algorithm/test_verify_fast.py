"""The vectorised verifier against the reference replay, and at scale.

The two implementations must apply the same rules: on random small topologies, collectives and
schedules (many wrong, some right) and on mutated synthesized algorithms they must agree on
pass/fail, and -- since both word their messages alike -- report the same problems.
"""

from __future__ import annotations

import importlib
import math
import random
from collections import Counter

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from collsynth.algorithm import Algorithm, Send, SendBlock, Step, find_problems, verify
from collsynth.collective import allgather, allreduce, standard_collective
from collsynth.errors import InvalidInstanceError, VerificationError
from collsynth.topology import BandwidthGroup, Topology, compose_nodes, get_topology

COLLECTIVES = ["allgather", "broadcast", "alltoall", "reduce_scatter", "allreduce", "reduce"]
ROOTED = {"broadcast", "reduce"}
UNLIMITED = 10**9


def both(algorithm: Algorithm) -> tuple[list[str], list[str]]:
    """(reference, vectorised) problems, without a limit."""
    return (find_problems(algorithm, method="replay", limit=UNLIMITED),
            find_problems(algorithm, method="vectorised", limit=UNLIMITED))


def assert_agree(algorithm: Algorithm) -> list[str]:
    slow, fast = both(algorithm)
    assert bool(slow) == bool(fast), (slow, fast)
    assert Counter(slow) == Counter(fast)
    # The same answers with the default limit, and with blocks instead of tuples.
    assert bool(find_problems(algorithm, method="vectorised")) == bool(slow)
    blocks = Algorithm(algorithm.name, algorithm.topology, algorithm.collective,
                       tuple(Step(s.rounds, SendBlock.from_sends(s.sends))
                             for s in algorithm.steps))
    assert Counter(find_problems(blocks, limit=UNLIMITED)) == Counter(slow)
    return slow


# -- random cases ----------------------------------------------------------------------------


def loads_rounds(topology: Topology, sends) -> int:
    """The fewest rounds that carry ``sends`` within every link and group limit."""
    per_link = Counter((s.src, s.dst) for s in sends)
    rounds = 1
    for (s, d), count in per_link.items():
        bw = topology.links[s][d]
        if bw:
            rounds = max(rounds, math.ceil(count / bw))
    for group, covered in topology.effective_groups:
        used = sum(per_link.get(link, 0) for link in covered)
        rounds = max(rounds, math.ceil(used / group.limit))
    return rounds


def greedy_steps(topology: Topology, collective, rng: random.Random, max_steps: int):
    """A plausible schedule: copies from holders to ranks that need a chunk, and for combining
    collectives reduces of disjoint partial values until some rank is complete, then copies of
    the complete value. Often correct, sometimes incomplete."""
    n = topology.num_ranks
    value = [{r: (frozenset({r}) if collective.combining else frozenset({-1})) for r in pre}
             for pre in collective.precondition]
    full = [frozenset(pre) if collective.combining else frozenset({-1})
            for pre in collective.precondition]
    steps = []
    for _ in range(max_steps):
        sends, updates = [], []
        for c in range(collective.num_chunks):
            complete = [r for r, v in value[c].items() if v == full[c]]
            if complete:
                for d in range(n):
                    if d in collective.postcondition[c] and value[c].get(d) != full[c]:
                        senders = [s for s in complete if topology.links[s][d]]
                        if senders and rng.random() < 0.8:
                            s = rng.choice(senders)
                            sends.append(Send(c, s, d))
                            updates.append((c, d, full[c]))
                continue
            for d in rng.sample(range(n), n):
                acc = value[c].get(d, frozenset())
                got = False
                for s in rng.sample(range(n), n):
                    v = value[c].get(s)
                    if v and topology.links[s][d] and not (v & acc) and rng.random() < 0.5:
                        sends.append(Send(c, s, d, True))
                        acc = acc | v
                        got = True
                if got:
                    updates.append((c, d, acc))
        for c, d, v in updates:
            value[c][d] = v
        if sends:
            rng.shuffle(sends)
            steps.append(Step(loads_rounds(topology, sends), tuple(sends)))
    return steps


def random_sends(n: int, num_chunks: int, combining: bool, rng: random.Random, count: int):
    """Sends drawn at random; a few name a chunk or rank out of range."""
    sends = []
    for _ in range(count):
        low = -1 if rng.random() < 0.05 else 0
        chunk = rng.randrange(low, num_chunks + (rng.random() < 0.05))
        sends.append(Send(chunk, rng.randrange(n), rng.randrange(n + (rng.random() < 0.03)),
                          rng.random() < (0.6 if combining else 0.05)))
    return sends


def mutate(steps: list[Step], n: int, num_chunks: int, combining: bool, rng: random.Random):
    """One random change that may or may not break the schedule."""
    steps = list(steps)
    if not steps:
        return [Step(1, tuple(random_sends(n, num_chunks, combining, rng, 3)))]
    t = rng.randrange(len(steps))
    rounds, sends = steps[t].rounds, list(steps[t].sends)
    kind = rng.randrange(8)
    if kind == 0 and sends:                               # drop a send
        sends.pop(rng.randrange(len(sends)))
    elif kind == 1:                                       # add a random send
        sends += random_sends(n, num_chunks, combining, rng, 1)
    elif kind == 2 and sends:                             # duplicate a send (copy or reduce)
        sends.append(rng.choice(sends))
    elif kind == 3 and sends:                             # flip copy <-> reduce
        i = rng.randrange(len(sends))
        x = sends[i]
        sends[i] = Send(x.chunk, x.src, x.dst, not x.reduce)
    elif kind == 4 and sends:                             # redirect a send
        i = rng.randrange(len(sends))
        x = sends[i]
        sends[i] = Send(x.chunk, x.src, rng.randrange(n), x.reduce)
    elif kind == 5:                                       # fewer rounds
        rounds = rounds - 1
    elif kind == 6 and len(steps) > 1:                    # swap two steps
        u = rng.randrange(len(steps))
        steps[t], steps[u] = steps[u], steps[t]
        return steps
    else:                                                 # drop a step
        steps.pop(t)
        return steps
    steps[t] = Step(rounds, tuple(sends))
    return steps


@st.composite
def cases(draw):
    n = draw(st.integers(3, 7))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = random.Random(seed)
    links = [[0 if s == d else rng.choice((0, 0, 1, 1, 2)) for d in range(n)] for s in range(n)]
    for s in range(n):  # keep a ring so that most collectives are implementable
        links[s][(s + 1) % n] = links[s][(s + 1) % n] or 1
    groups = []
    for i in range(draw(st.integers(0, 3))):
        groups.append(BandwidthGroup(frozenset(rng.sample(range(n), rng.randint(1, n))),
                                     frozenset(rng.sample(range(n), rng.randint(1, n))),
                                     rng.randint(1, 3), rng.choice(("", f"g{i}"))))
    topology = Topology(f"random{n}", tuple(map(tuple, links)), tuple(groups))
    name = draw(st.sampled_from(COLLECTIVES))
    root = rng.randrange(n) if name in ROOTED else None
    collective = standard_collective(name, n, root=root).split(draw(st.integers(1, 2)))
    mode = draw(st.sampled_from(["greedy", "greedy", "mutated", "mutated", "random"]))
    if mode == "random":
        steps = [Step(rng.choice((0, 1, 1, 2, 3)),
                      tuple(random_sends(n, collective.num_chunks, collective.combining, rng,
                                         rng.randint(0, 3 * n))))
                 for _ in range(rng.randint(1, 4))]
    else:
        steps = greedy_steps(topology, collective, rng, rng.randint(1, 6))
        if mode == "mutated":
            for _ in range(rng.randint(1, 3)):
                steps = mutate(steps, n, collective.num_chunks, collective.combining, rng)
    return Algorithm("random", topology, collective, tuple(steps))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_vectorised_agrees_with_replay_on_random_cases(algorithm):
    assert_agree(algorithm)


def test_random_cases_cover_passes_and_failures():
    """The generator above is worth something only if it makes both kinds of algorithm."""
    outcomes = Counter()
    rng = random.Random(1)
    for seed in range(40):
        n = rng.randint(3, 6)
        topology = get_topology(f"fully-connected:{n}")
        collective = standard_collective(rng.choice(COLLECTIVES[:5]), n)
        steps = greedy_steps(topology, collective, random.Random(seed), 6)
        outcomes[not find_problems(Algorithm("g", topology, collective, tuple(steps)),
                                   method="vectorised")] += 1
    assert outcomes[True] and outcomes[False]


# -- synthesized algorithms, mutated ---------------------------------------------------------


@pytest.fixture(scope="module")
def synthesized():
    from collsynth.synthesis import pareto_front

    found = []
    for topology_name, collective_name, max_steps in [
            ("ring:4", "allgather", 3), ("dgx1", "allgather", 2), ("ring:4", "allreduce", 3),
            ("ring:4", "reduce_scatter", 3), ("fully-connected:4", "allreduce", 3),
            ("hub:4", "allgather", 3)]:
        topology = get_topology(topology_name)
        collective = standard_collective(collective_name, topology.num_ranks)
        found += [r.algorithm for r in pareto_front(topology, collective, max_steps=max_steps)
                  if r.algorithm is not None]
    assert len(found) >= 6
    return found


def test_synthesized_algorithms_pass_both(synthesized):
    for algorithm in synthesized:
        assert both(algorithm) == ([], [])


def test_mutated_synthesized_algorithms_agree(synthesized):
    rng = random.Random(7)
    failures = 0
    for algorithm in synthesized:
        for _ in range(25):
            steps = mutate(list(algorithm.steps), algorithm.topology.num_ranks,
                           algorithm.collective.num_chunks, algorithm.collective.combining, rng)
            failures += bool(assert_agree(Algorithm(algorithm.name, algorithm.topology,
                                                    algorithm.collective, tuple(steps))))
    assert failures > 0


def test_named_mutations_of_a_synthesized_allreduce(synthesized):
    algorithm = next(a for a in synthesized if a.collective.name == "allreduce"
                     and a.topology.name == "ring:4")
    steps = list(algorithm.steps)
    first = list(steps[0].sends)
    reduce_send = next(s for s in first if s.reduce)
    missing_link = next((s, d) for s in range(4) for d in range(4)
                        if s != d and not algorithm.topology.links[s][d])

    def with_first(sends):
        return Algorithm("m", algorithm.topology, algorithm.collective,
                         (Step(steps[0].rounds, tuple(sends)), *steps[1:]))

    dropped = assert_agree(with_first(first[1:]))
    moved = assert_agree(with_first(
        [Send(reduce_send.chunk, missing_link[0], missing_link[1], True) if s == reduce_send
         else s for s in first]))
    duplicated = assert_agree(with_first(first + [reduce_send]))
    assert dropped and any(f"no link {missing_link[0]}->{missing_link[1]}" in p for p in moved)
    assert any("twice" in p for p in duplicated)


# -- choice of method ------------------------------------------------------------------------


def test_auto_uses_the_replay_for_extra_memory_and_vectorised_refuses_it():
    line = get_topology("line:3")
    from collsynth.collective import gather

    block = SendBlock([0, 1], [0, 1], [1, 2])
    a = Algorithm("g", line, gather(3, 2), (Step(1, block), Step(1, (Send(0, 1, 2),))))
    assert find_problems(a) == []
    assert any("scratch" in p for p in find_problems(a, extra_memory=0))
    with pytest.raises(InvalidInstanceError, match="extra_memory"):
        find_problems(a, extra_memory=0, method="vectorised")
    with pytest.raises(InvalidInstanceError, match="method"):
        find_problems(a, method="fast")


def test_vectorised_respects_limit():
    fc = get_topology("fully-connected:4")
    a = Algorithm("empty", fc, allgather(4), (Step(1, SendBlock([], [], [])),))
    assert len(find_problems(a, method="vectorised")) == 12
    assert len(find_problems(a, method="vectorised", limit=3)) == 3
    with pytest.raises(VerificationError, match="and 7 more"):
        verify(a)


def test_groups_match_effective_groups():
    """Groups that cannot bind are dropped by both; a binding one is reported by both."""
    t = Topology("g", ((0, 1, 1), (0, 0, 0), (0, 0, 0)),
                 (BandwidthGroup(frozenset({0}), frozenset({1, 2}), 2, "loose"),
                  BandwidthGroup(frozenset({0}), frozenset({1, 2}), 1, "nic")))
    a = Algorithm("b", t, standard_collective("broadcast", 3, root=0),
                  (Step(1, SendBlock([0, 0], [0, 0], [1, 2])),))
    slow, fast = both(a)
    assert slow == fast == ["step 0: nic carries 2 chunks but its limit 1 x 1 rounds allows 1"]


# -- scale -----------------------------------------------------------------------------------


def direct_allgather(topology: Topology) -> Algorithm:
    """Every rank sends its chunk straight to every other rank in one step, with the fewest
    rounds that fit the links and groups."""
    n = topology.num_ranks
    src = np.repeat(np.arange(n), n)
    dst = np.tile(np.arange(n), n)
    keep = src != dst
    src, dst = src[keep], dst[keep]
    links = np.asarray(topology.links)
    load = np.zeros((n, n), dtype=np.int64)
    load[src, dst] = 1
    rounds = int(np.max(np.ceil(load / np.where(links > 0, links, 1))))
    for group, covered in topology.effective_groups:
        s = np.fromiter(group.sources, dtype=np.int64)
        d = np.fromiter(group.destinations, dtype=np.int64)
        used = int(load[np.ix_(s, d)][links[np.ix_(s, d)] > 0].sum())
        rounds = max(rounds, -(-used // group.limit))
    return Algorithm("direct", topology, allgather(n), (Step(rounds, SendBlock(src, src, dst)),))


@pytest.fixture(scope="module")
def a100x32():
    return compose_nodes(get_topology("dgx-a100"), 32)


def test_256_rank_direct_allgather_verifies(a100x32):
    algorithm = direct_allgather(a100x32)
    assert algorithm.num_sends == 256 * 255
    assert verify(algorithm) is algorithm
    # One round fewer breaks some bandwidth group (the NICs), and is reported.
    step = algorithm.steps[0]
    tight = Algorithm("tight", a100x32, algorithm.collective, (Step(step.rounds - 1, step.sends),))
    assert any("carries" in p and "rounds allows" in p for p in find_problems(tight))


def test_256_rank_broken_allgathers_are_rejected(a100x32):
    algorithm = direct_allgather(a100x32)
    block = algorithm.steps[0].sends
    # Drop the sends into rank 77: it never receives the other ranks' chunks.
    keep = block.dst != 77
    dropped = Algorithm("d", a100x32, algorithm.collective,
                        (Step(algorithm.steps[0].rounds,
                              SendBlock(block.chunk[keep], block.src[keep], block.dst[keep])),))
    problems = find_problems(dropped)
    assert problems and all("rank 77 never receives chunk" in p for p in problems)
    # Rank 5 forwards chunk 3 in the same step it receives it: it does not hold it yet.
    relayed = Algorithm("r", a100x32, algorithm.collective,
                        (Step(algorithm.steps[0].rounds,
                              SendBlock.concat([block, SendBlock([3], [5], [6])])),))
    assert any("rank 5 sends chunk 3 it does not hold" in p for p in find_problems(relayed))


def test_allreduce_over_several_chunk_batches_and_bit_words(monkeypatch):
    """Direct reduce-scatter then allgather on 130 ranks (three 64-bit words per bitset), with
    the state and piece budgets forced down so that chunks are replayed in many batches and
    steps in many pieces."""
    impl = importlib.import_module("collsynth.algorithm.verify")
    n = 130
    topology = get_topology(f"fully-connected:{n}")
    c, r = np.divmod(np.arange(n * n), n)
    keep = c != r
    c, r = c[keep], r[keep]
    collective = allreduce(n).split(n)
    good = Algorithm("ar", topology, collective,
                     (Step(1, SendBlock(c, r, c, np.ones(len(c), dtype=bool))),
                      Step(1, SendBlock(c, c, r))))
    monkeypatch.setattr(impl, "_STATE_BYTES", 7 * n * (1 + 8 * 3))
    monkeypatch.setattr(impl, "_PIECE_BYTES", 5000)
    assert find_problems(good) == []
    twice = Algorithm("ar", topology, collective,
                      (good.steps[0], Step(1, SendBlock([129], [128], [129], [True])),
                       good.steps[1]))
    assert find_problems(twice) == [
        "step 1: rank 128 reduces chunk 129 into rank 129, which would count the "
        "contribution(s) of rank(s) [128] twice"]
    # Rank 3's contribution to chunk 100 never arrives.
    block = good.steps[0].sends
    keep = ~((block.chunk == 100) & (block.src == 3))
    short = Algorithm("ar", topology, collective,
                      (Step(1, SendBlock(block.chunk[keep], block.src[keep], block.dst[keep],
                                         block.reduce[keep])),
                       good.steps[1]))
    problems = find_problems(short, limit=UNLIMITED)
    assert len(problems) == n
    assert ("rank 100 ends with an incomplete chunk 100: missing the contribution(s) of "
            "rank(s) [3]") in problems
    # Nothing reduced into chunk 7: its owner misses 129 contributions, listed in short.
    keep = block.chunk != 7
    lonely = Algorithm("ar", topology, collective,
                       (Step(1, SendBlock(block.chunk[keep], block.src[keep], block.dst[keep],
                                          block.reduce[keep])),))
    slow, fast = both(lonely)
    assert slow == fast
    assert ("rank 7 ends with an incomplete chunk 7: missing the contribution(s) of rank(s) "
            "[0, 1, 2, 3, 4, 5, 6, 8, ... and 121 more]") in fast


def test_values_beyond_int64_are_out_of_range_in_both():
    ring = get_topology("ring:3")
    a = Algorithm("b", ring, standard_collective("broadcast", 3, root=0),
                  (Step(1, (Send(0, 0, 1), Send(0, 2**70, 2), Send(0, 0, 2))),))
    slow, fast = both(a)
    assert slow == fast and len(fast) == 1 and "names a chunk or rank out of range" in fast[0]


def test_a_step_of_only_out_of_range_sends():
    ring = get_topology("ring:3")
    a = Algorithm("b", ring, standard_collective("broadcast", 3, root=0),
                  (Step(1, (Send(0, 0, 1), Send(0, 0, 2))), Step(1, (Send(0, 2, 3),))))
    slow, fast = both(a)
    assert slow == fast == ["step 1: send Send(chunk=0, src=2, dst=3, reduce=False) names a chunk "
                            "or rank out of range"]
