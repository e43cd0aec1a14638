"""A parallel strategy: data, tensor and pipeline degrees, microbatches, and device placement.

:class:`ParallelStrategy` holds the degrees and the placement order, :func:`partition_stages`
splits the layers into pipeline stages and :func:`tensor_roles` gives each Linear layer its
Megatron role; docs/training.md explains the degrees, the placement and the stages.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Sequence

from collsynth.errors import InvalidInstanceError

__all__ = ["AXES", "ParallelStrategy", "partition_stages", "tensor_roles"]

#: The axes of a placement order.
AXES = ("tensor", "data", "pipeline")


@dataclass(frozen=True)
class ParallelStrategy:
    """How one training step is spread over devices.

    Parameters
    ----------
    data:
        Data-parallel degree ``d`` (replicas).
    tensor:
        Tensor (horizontal, Megatron-style) degree ``t``.
    pipeline:
        Pipeline degree ``p`` (stages).
    microbatches:
        Microbatches ``m`` per replica per step (GPipe).
    order:
        The placement axis order, innermost first (docs/training.md); a permutation of
        ``("tensor", "data", "pipeline")``.
    overlap_gradients:
        ``False`` (default): each stage allreduces its gradients over its data group after its
        last backward, as one fused buffer, blocking. ``True``: one allreduce per layer, issued
        on a separate stream as soon as the layer's last backward is done, overlapping the rest
        of the backward pass.

    Raises
    ------
    InvalidInstanceError
        For a degree that is not a positive integer or a bad ``order``.

    Examples
    --------
    >>> s = ParallelStrategy(data=2, tensor=2, pipeline=2, microbatches=4)
    >>> s.devices, s.device_index(stage=1, replica=0, tensor_rank=1)
    (8, 5)
    >>> s.coordinates(5)
    (1, 0, 1)
    """

    data: int = 1
    tensor: int = 1
    pipeline: int = 1
    microbatches: int = 1
    order: tuple[str, str, str] = AXES
    overlap_gradients: bool = False

    def __post_init__(self) -> None:
        for attr in ("data", "tensor", "pipeline", "microbatches"):
            value = getattr(self, attr)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidInstanceError(f"strategy: {attr} = {value!r}; expected an integer "
                                           ">= 1")
        order = tuple(self.order)
        if sorted(order) != sorted(AXES):
            raise InvalidInstanceError(f"strategy: order = {self.order!r}; expected a permutation "
                                       f"of {AXES}")
        object.__setattr__(self, "order", order)
        if not isinstance(self.overlap_gradients, bool):
            raise InvalidInstanceError(f"strategy: overlap_gradients = {self.overlap_gradients!r}"
                                       "; expected True or False")

    @property
    def devices(self) -> int:
        """``d * t * p``."""
        return self.data * self.tensor * self.pipeline

    def _sizes(self) -> dict[str, int]:
        return {"tensor": self.tensor, "data": self.data, "pipeline": self.pipeline}

    def device_index(self, stage: int, replica: int, tensor_rank: int) -> int:
        """The index (0 .. devices-1) of the device at these coordinates."""
        coords = {"tensor": tensor_rank, "data": replica, "pipeline": stage}
        sizes = self._sizes()
        index, scale = 0, 1
        for axis in self.order:
            if not 0 <= coords[axis] < sizes[axis]:
                raise InvalidInstanceError(f"strategy: {axis} coordinate {coords[axis]} out of "
                                           f"range 0..{sizes[axis] - 1}")
            index += coords[axis] * scale
            scale *= sizes[axis]
        return index

    def coordinates(self, index: int) -> tuple[int, int, int]:
        """``(stage, replica, tensor_rank)`` of device ``index``."""
        if not 0 <= index < self.devices:
            raise InvalidInstanceError(f"strategy: device index {index} out of range "
                                       f"0..{self.devices - 1}")
        coords, sizes = {}, self._sizes()
        for axis in self.order:
            coords[axis], index = index % sizes[axis], index // sizes[axis]
        return coords["pipeline"], coords["data"], coords["tensor"]

    def label(self) -> str:
        """``"d2 t2 p2 m4"`` (plus ``" overlap"`` when gradients overlap)."""
        text = f"d{self.data} t{self.tensor} p{self.pipeline} m{self.microbatches}"
        return text + (" overlap" if self.overlap_gradients else "")


def partition_stages(costs: Sequence[float], stages: int) -> tuple[tuple[int, int], ...]:
    """Split layers with these costs into ``stages`` contiguous, non-empty stages, minimising
    the largest stage cost.

    Returns ``(first, end)`` layer ranges (``end`` exclusive). Exact dynamic programme: the best
    split of the first ``j`` layers into ``k`` stages is the best over the last stage's start
    ``i`` of ``max(best(i, k - 1), cost(i..j))``; the first term grows with ``i`` and the second
    shrinks, so ``i`` is found by bisection (``O(stages * n log n)``). Among equally good splits
    the one with the latest stage boundaries is kept.

    Raises
    ------
    InvalidInstanceError
        When there are fewer layers than stages, or a cost is negative.

    >>> partition_stages([1, 1, 1, 1], 2)
    ((0, 2), (2, 4))
    >>> partition_stages([3, 1, 1, 1], 2)
    ((0, 1), (1, 4))
    """
    n = len(costs)
    if isinstance(stages, bool) or not isinstance(stages, int) or stages < 1:
        raise InvalidInstanceError(f"stages = {stages!r}; expected an integer >= 1")
    if n < stages:
        raise InvalidInstanceError(f"{n} layer(s) cannot fill {stages} pipeline stages; use a "
                                   f"pipeline degree of at most {n}")
    if any(not c >= 0 for c in costs):
        raise InvalidInstanceError("layer costs must be >= 0")
    prefix = [0.0]
    for c in costs:
        prefix.append(prefix[-1] + float(c))
    inf = float("inf")
    # best[k][j]: the least largest-stage cost of the first j layers in k stages.
    best = [[inf] * (n + 1) for _ in range(stages + 1)]
    start = [[0] * (n + 1) for _ in range(stages + 1)]
    for j in range(1, n + 1):
        best[1][j] = prefix[j]
    for k in range(2, stages + 1):
        previous = best[k - 1]
        for j in range(k, n + 1):
            lo, hi = k - 1, j - 1  # the last stage is layers i .. j-1
            # The first i in [lo, hi] with previous[i] >= prefix[j] - prefix[i].
            keys = range(lo, hi + 1)
            pos = bisect.bisect_left(keys, True,
                                     key=lambda i: previous[i] >= prefix[j] - prefix[i])
            value, where = inf, lo
            for i in (lo + pos - 1, lo + pos):
                if lo <= i <= hi:
                    v = max(previous[i], prefix[j] - prefix[i])
                    if v <= value:
                        value, where = v, i
            best[k][j], start[k][j] = value, where
    bounds, j = [], n
    for k in range(stages, 1, -1):
        i = start[k][j]
        bounds.append((i, j))
        j = i
    bounds.append((0, j))
    return tuple(reversed(bounds))


def tensor_roles(layers: Sequence[object], stages: Sequence[tuple[int, int]]) -> tuple[str, ...]:
    """The Megatron role of every layer under tensor parallelism.

    Within each stage, consecutive :class:`~collsynth.training.model.Linear` layers are paired
    ``column``, ``row``; a Linear layer left without a partner (the last of an odd run, or one
    next to a block or a stage boundary) is ``column+gather``. Other layers get ``"block"``.

    >>> from collsynth.training.model import mlp
    >>> tensor_roles(mlp(5, 8), ((0, 3), (3, 5)))
    ('column', 'row', 'column+gather', 'column', 'row')
    """
    from collsynth.training.model import Linear

    roles = ["block"] * len(layers)
    for first, end in stages:
        i = first
        while i < end:
            if not isinstance(layers[i], Linear):
                i += 1
                continue
            if i + 1 < end and isinstance(layers[i + 1], Linear):
                roles[i], roles[i + 1] = "column", "row"
                i += 2
            else:
                roles[i] = "column+gather"
                i += 1
    return tuple(roles)
