"""The chooser on hand-made prices: ranges, bisected boundaries, the threshold, and the rules.

Every expected boundary below is worked out by hand from the price functions (solving one
inequality each), not read from the code.
"""

from __future__ import annotations

import random

import pytest

from collsynth.errors import InvalidInstanceError
from collsynth.export.tuner.choose import (ALWAYS_AVAILABLE, Choice, tune_runtime,
                                           tuning_rules)
from collsynth.export.tuner.config import SIZE_MAX, TunerRule, runtime_outcome

LL8 = Choice("ring", "ll", 8)
SIMPLE8 = Choice("ring", "simple", 8)
OWN = Choice("ring", "simple")


def spans(tuning):
    return [(r.min_bytes, r.max_bytes, r.choice, r.keep) for r in tuning.ranges]


def test_two_lines_cross_where_solved_by_hand():
    # A = 10 + s/100, B = 30 + s/1000: A < B iff 9s/1000 < 20 iff s < 2222.2, so B from 2223.
    # B x 1.03 < 40 + s/500 for every s >= 0; A x 1.03 < 40 + s/500 iff s < 3578.3 (so at all
    # s <= 2222): every sampled size forces a choice.
    def price(c, s):
        return 10 + s / 100 if c == LL8 else 30 + s / 1000

    def default(s):
        return OWN, 40 + s / 500

    t = tune_runtime([LL8, SIMPLE8], [1000, 4000, 16000], price, default)
    assert spans(t) == [(0, 999, OWN, True), (1000, 2222, LL8, False),
                        (2223, 16000, SIMPLE8, False), (16001, SIZE_MAX, OWN, True)]
    assert t.exact
    assert [(row.size_bytes, row.time_us, row.default_time_us) for row in t.rows] == \
        [(1000, 20.0, 42.0), (4000, 34.0, 48.0), (16000, 46.0, 72.0)]
    assert [round(row.speedup, 6) for row in t.rows] == [2.1, round(48 / 34, 6),
                                                          round(72 / 46, 6)]


def test_the_threshold_keeps_the_runtime_choice_where_the_gain_is_small():
    # A costs 20 everywhere, the default 10 + s/100. With threshold 0.25, A is forced iff
    # 25 < 10 + s/100 iff s > 1500: from 1501 (at 1500 the two sides are equal, 25 = 25).
    def price(c, s):
        return 20.0

    t = tune_runtime([LL8], [100, 10000], price, lambda s: (OWN, 10 + s / 100),
                     threshold=0.25)
    assert spans(t) == [(0, 1500, OWN, True), (1501, 10000, LL8, False),
                        (10001, SIZE_MAX, OWN, True)]
    # With no threshold the gain starts where 20 < 10 + s/100: s > 1000.
    t = tune_runtime([LL8], [100, 10000], price, lambda s: (OWN, 10 + s / 100), threshold=0)
    assert spans(t)[1][:2] == (1001, 10000)


def test_a_change_of_the_runtime_own_choice_is_a_boundary_too():
    # No candidate: the runtime keeps its own, which switches from LL to Simple at 5000.
    def default(s):
        return (Choice("ring", "ll") if s < 5000 else OWN), 1.0

    t = tune_runtime([], [1000, 100000], lambda c, s: None, default)
    assert spans(t) == [(0, 4999, Choice("ring", "ll"), True), (5000, SIZE_MAX, OWN, True)]


def test_a_third_choice_between_two_samples_becomes_its_own_range():
    # A wins only on [2000, 3000), B from 3000; the geometric middle of 1000 and 8000 (2828)
    # falls in A's window, so the bisection finds both of its ends.
    a, b = Choice("tree", "ll", 2), Choice("ring", "simple", 4)

    def price(c, s):
        if c == a:
            return 1.0 if 2000 <= s < 3000 else 100.0
        return 5.0 if s >= 3000 else 100.0

    t = tune_runtime([a, b], [1000, 8000], price, lambda s: (OWN, 50.0))
    assert spans(t) == [(0, 1999, OWN, True), (2000, 2999, a, False), (3000, 8000, b, False),
                        (8001, SIZE_MAX, OWN, True)]
    window = t.ranges[1]
    assert window.rows and not any(row.sampled for row in window.rows)   # found, not sampled
    assert [row.size_bytes for row in t.rows] == [1000, 8000]


def test_ties_go_to_the_earlier_candidate_and_none_means_cannot_run():
    first, second = Choice("ring", "ll", 2), Choice("ring", "ll", 4)
    t = tune_runtime([Choice("nvls", "simple"), first, second], [64],
                     lambda c, s: None if c.algorithm == "nvls" else 1.0,
                     lambda s: (OWN, 10.0))
    assert t.range_of(64).choice == first
    # The runtime's own choice among the candidates never beats itself: it is kept.
    t = tune_runtime([OWN], [64], lambda c, s: 3.0, lambda s: (OWN, 3.0))
    assert all(r.keep for r in t.ranges)


def test_the_evaluation_cap_leaves_contiguous_ranges():
    t = tune_runtime([LL8], [1, 2**40], lambda c, s: 1.0 if s > 12345 else 9.0,
                     lambda s: (OWN, 5.0), max_evaluations=5)
    assert not t.exact and t.evaluations == 5
    assert t.ranges[0].min_bytes == 0 and t.ranges[-1].max_bytes == SIZE_MAX
    for left, right in zip(t.ranges, t.ranges[1:]):
        assert left.max_bytes + 1 == right.min_bytes
    exact = tune_runtime([LL8], [1, 2**40], lambda c, s: 1.0 if s > 12345 else 9.0,
                         lambda s: (OWN, 5.0))
    assert exact.exact and exact.ranges[1].min_bytes == 12346


def _decision(candidates, price, default, threshold, size):
    """The definition, evaluated directly: the first fastest candidate if it beats the default
    by the threshold, else the default's own choice."""
    own, own_time = default(size)
    timed = [(price(c, size), i, c) for i, c in enumerate(candidates)]
    timed = [x for x in timed if x[0] is not None]
    if timed:
        best_time, _, best = min(timed, key=lambda x: (x[0], x[1]))
        if best_time * (1 + threshold) < own_time:
            return best, False
    return own, True


@pytest.mark.parametrize("seed", range(12))
def test_random_step_prices_against_the_definition(seed):
    rnd = random.Random(seed)
    candidates = [Choice("ring", p, c) for p in ("ll", "simple") for c in (None, 2, 8)]
    steps = {c: sorted(rnd.sample(range(1, 5000), 4)) for c in candidates}
    levels = {c: [rnd.choice([1.0, 2.0, 3.0, 4.0, None]) for _ in range(5)] for c in candidates}

    def price(c, s):
        return levels[c][sum(s >= x for x in steps[c])]

    def default(s):
        return (Choice("tree", "ll") if s < 777 else OWN), 2.5

    sizes = sorted(rnd.sample(range(1, 6000), 5))
    t = tune_runtime(candidates, sizes, price, default, threshold=0.1)
    assert t.exact
    assert t.ranges[0].min_bytes == 0 and t.ranges[-1].max_bytes == SIZE_MAX
    for left, right in zip(t.ranges, t.ranges[1:]):
        assert left.max_bytes + 1 == right.min_bytes
        assert (left.choice, left.keep) != (right.choice, right.keep)
    for size in sizes:   # every sampled size runs its own decision
        r = t.range_of(size)
        assert (r.choice, r.keep) == _decision(candidates, price, default, 0.1, size)
    for left, right in zip(t.ranges, t.ranges[1:]):   # boundaries inside the span are exact
        b = right.min_bytes
        if sizes[0] < b <= sizes[-1]:
            assert (left.choice, left.keep) == _decision(candidates, price, default, 0.1, b - 1)
            assert (right.choice, right.keep) == _decision(candidates, price, default, 0.1, b)


@pytest.mark.parametrize("kwargs, fragment", [
    ({"sizes": []}, "at least one size"),
    ({"sizes": [0]}, "size 0"),
    ({"sizes": [True]}, "size True"),
    ({"sizes": [2**64]}, "size"),
    ({"threshold": -0.1}, "threshold"),
    ({"price": lambda c, s: float("nan")}, "price"),
    ({"price": lambda c, s: -1.0}, "price"),
    ({"default": lambda s: ("ring", 1.0)}, "default"),
    ({"default": lambda s: (OWN, float("inf"))}, "default"),
    ({"choices": ["ring/ll"]}, "candidate"),
])
def test_bad_arguments_are_refused(kwargs, fragment):
    args = {"choices": [LL8], "sizes": [64], "price": lambda c, s: 1.0,
            "default": lambda s: (OWN, 2.0)}
    args.update(kwargs)
    with pytest.raises(InvalidInstanceError, match=fragment):
        tune_runtime(args["choices"], args["sizes"], args["price"], args["default"],
                     **{k: v for k, v in kwargs.items() if k == "threshold"})


def test_a_choice_is_validated():
    with pytest.raises(InvalidInstanceError):
        Choice("Ring", "ll")
    with pytest.raises(InvalidInstanceError):
        Choice("ring", "ll", 0)
    assert Choice("ring", "ll", 16).label == "ring/ll/16ch" and OWN.label == "ring/simple"


# -- from ranges to rules ------------------------------------------------------------------------


NVLS = Choice("nvls", "simple", 16)


def _tuning():
    # NVLS is forced on [4096, 1 MiB], ring/ll on 8 channels below: worked out like the first
    # test: NVLS = 50, ring/ll 8ch = 5 + s/100, default (tree/ll, own) = 20 + s/50.
    def price(c, s):
        return 50.0 if c == NVLS else 5 + s / 100

    return tune_runtime([LL8, NVLS], [1024, 4096, 1 << 20], price,
                        lambda s: (Choice("tree", "ll"), 20 + s / 50))


def test_the_tuning_worked_by_hand():
    # ring/ll 8ch vs NVLS: 5 + s/100 < 50 iff s < 4500; at 4500 they tie and the earlier
    # candidate (ring/ll) keeps it, so NVLS from 4501. Both beat 20 + s/50 by 3% from 1024
    # (ring/ll 8ch at 1024: 15.24 x 1.03 < 40.48).
    assert spans(_tuning()) == [(0, 1023, Choice("tree", "ll"), True),
                                (1024, 4500, LL8, False), (4501, 1 << 20, NVLS, False),
                                ((1 << 20) + 1, SIZE_MAX, Choice("tree", "ll"), True)]


def test_rccl_rules_are_the_forced_ranges_only():
    rules = tuning_rules(_tuning(), "allreduce", runtime="rccl", n_nodes=1, n_ranks=8)
    assert rules == (TunerRule("allreduce", 1024, 4500, "ring", "ll", 8, 1, 8),
                     TunerRule("allreduce", 4501, 1 << 20, "nvls", "simple", 16, 1, 8))
    assert runtime_outcome(rules, "rccl", "allreduce", 100, 1, 8).rule is None


def test_nccl_rules_cover_every_size_and_fall_back_off_one_channel():
    rules = tuning_rules(_tuning(), "allreduce", runtime="nccl", n_nodes=1, n_ranks=8)
    assert rules == (
        TunerRule("allreduce", 0, 1023, "tree", "ll", 0, 1, 8),
        TunerRule("allreduce", 0, 1023, "ring", "simple", 0, 1, 8),
        TunerRule("allreduce", 1024, 4500, "ring", "ll", 8, 1, 8),
        TunerRule("allreduce", 4501, 1 << 20, "nvls", "simple", 16, 1, 8),
        TunerRule("allreduce", 4501, 1 << 20, "ring", "simple", 0, 1, 8),
        TunerRule("allreduce", (1 << 20) + 1, SIZE_MAX, "tree", "ll", 0, 1, 8),
        TunerRule("allreduce", (1 << 20) + 1, SIZE_MAX, "ring", "simple", 0, 1, 8))
    for size in (0, 1023, 1024, 4500, 4501, 1 << 20, SIZE_MAX):
        outcome = runtime_outcome(rules, "nccl", "allreduce", size, 1, 8)
        assert outcome.channels != 1    # never the example plugin's one channel
        cannot = runtime_outcome(rules, "nccl", "allreduce", size, 1, 8,
                                 available=ALWAYS_AVAILABLE)
        assert cannot.rule is not None and cannot.channels != 1
    assert runtime_outcome(rules, "nccl", "allreduce", 5000, 1, 8).algorithm == "nvls"


def test_a_fallback_that_may_be_unavailable_is_refused():
    with pytest.raises(InvalidInstanceError, match="fallback"):
        tuning_rules(_tuning(), "allreduce", runtime="nccl", n_nodes=1, n_ranks=8,
                     fallback=lambda r: Choice("tree", "simple"))


def test_near_ties_go_to_the_earlier_candidate_and_the_depth_bounds_the_bisection():
    """Two candidates 0.5% apart flip the decision at every size when the later is ahead by
    a hair; with tie=0.01 the earlier always wins (one forced range). Between 1000 and 2000 B
    a boundary at 1500 B is found to the byte unbounded, and within 1000 / 2**3 B at depth 3."""
    a, b = Choice("ring", "ll", 1), Choice("ring", "ll", 2)
    wobble = lambda c, s: 10.0 if c == a else 10.0 * (0.995 if s % 3 else 1.005)
    own = lambda s: (Choice("ring", "simple"), 20.0)
    sizes = list(range(100, 200))
    flips = tune_runtime([a, b], sizes, wobble, own)
    assert len(flips.gains) > 10
    tied = tune_runtime([a, b], sizes, wobble, own, tie=0.01)
    assert [r.choice for r in tied.gains] == [a]
    step = lambda c, s: 1.0 if s >= 1500 else 100.0
    exact = tune_runtime([a], [1000, 2000], step, own)
    assert exact.exact and exact.gains[0].min_bytes == 1500
    coarse = tune_runtime([a], [1000, 2000], step, own, max_depth=3)
    assert not coarse.exact and 1500 <= coarse.gains[0].min_bytes <= 1500 + 1000 // 8
    assert coarse.evaluations == 2 + 3


def test_bisection_among_the_endpoints_fastest_prices_only_those():
    """With bisect_all=False the sizes the bisection tries price only the fastest candidates
    of the two sampled sizes around the boundary: a third candidate is priced at the samples
    only, and the boundary is the same as with every candidate priced."""
    a, b, c = Choice("ring", "ll", 1), Choice("ring", "ll", 2), Choice("ring", "ll", 4)
    priced = []

    def price(choice, size):
        priced.append((choice, size))
        return {a: 1.0 if size < 1500 else 9.0, b: 9.0 if size < 1500 else 1.0, c: 5.0}[choice]

    own = lambda s: (Choice("ring", "simple"), 20.0)
    full = tune_runtime([a, b, c], [1000, 2000], price, own)
    priced.clear()
    lean = tune_runtime([a, b, c], [1000, 2000], price, own, bisect_all=False)
    assert [(r.min_bytes, r.choice) for r in lean.gains] == \
        [(r.min_bytes, r.choice) for r in full.gains] and lean.gains[1].min_bytes == 1500
    assert {s for ch, s in priced if ch == c} == {1000, 2000}
