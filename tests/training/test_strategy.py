"""Strategies: placement, stage partition, tensor roles."""

from __future__ import annotations

import itertools
import random

import pytest

from collsynth.errors import InvalidInstanceError
from collsynth.training.model import Linear, TransformerBlock, mlp
from collsynth.training.strategy import ParallelStrategy, partition_stages, tensor_roles


def test_default_placement_is_tensor_innermost():
    s = ParallelStrategy(data=2, tensor=4, pipeline=3)
    assert s.devices == 24
    # index = tensor + t * (replica + d * stage)
    assert s.device_index(stage=2, replica=1, tensor_rank=3) == 3 + 4 * (1 + 2 * 2)
    seen = sorted(s.device_index(p, d, t) for p in range(3) for d in range(2) for t in range(4))
    assert seen == list(range(24))
    for index in range(24):
        assert s.device_index(*s.coordinates(index)) == index


def test_other_order():
    s = ParallelStrategy(data=2, tensor=2, pipeline=2, order=("pipeline", "tensor", "data"))
    # index = stage + p * (tensor + t * replica)
    assert s.device_index(stage=1, replica=0, tensor_rank=0) == 1
    assert s.device_index(stage=0, replica=0, tensor_rank=1) == 2
    assert s.device_index(stage=0, replica=1, tensor_rank=0) == 4


@pytest.mark.parametrize("kwargs, match", [
    ({"data": 0}, "data"), ({"tensor": 1.5}, "tensor"), ({"pipeline": True}, "pipeline"),
    ({"microbatches": -2}, "microbatches"), ({"order": ("tensor", "data", "data")}, "order"),
    ({"overlap_gradients": "yes"}, "overlap"),
])
def test_bad_strategies(kwargs, match):
    with pytest.raises(InvalidInstanceError, match=match):
        ParallelStrategy(**kwargs)


def brute_force(costs, stages):
    n = len(costs)
    best = None
    for cuts in itertools.combinations(range(1, n), stages - 1):
        bounds = (0,) + cuts + (n,)
        worst = max(sum(costs[a:b]) for a, b in zip(bounds, bounds[1:]))
        best = worst if best is None else min(best, worst)
    return best


def test_partition_matches_brute_force():
    rng = random.Random(7)
    for _ in range(60):
        n = rng.randint(1, 8)
        costs = [rng.choice([0.5, 1.0, 2.0, 3.0, 7.0]) for _ in range(n)]
        stages = rng.randint(1, n)
        parts = partition_stages(costs, stages)
        assert len(parts) == stages and parts[0][0] == 0 and parts[-1][1] == n
        assert all(a < b for a, b in parts) and all(
            parts[i][1] == parts[i + 1][0] for i in range(stages - 1))
        worst = max(sum(costs[a:b]) for a, b in parts)
        assert worst == pytest.approx(brute_force(costs, stages))


def test_partition_equal_layers_is_even():
    assert partition_stages([1.0] * 64, 8) == tuple((8 * i, 8 * i + 8) for i in range(8))
    with pytest.raises(InvalidInstanceError, match="cannot fill"):
        partition_stages([1.0, 1.0], 3)


def test_tensor_roles_pair_linear_layers_within_stages():
    layers = list(mlp(3, 8)) + [TransformerBlock(8, 2, 4)] + [Linear(8, 8)] * 2
    roles = tensor_roles(layers, ((0, 2), (2, 6)))
    assert roles == ("column", "row", "column+gather", "block", "column", "row")
