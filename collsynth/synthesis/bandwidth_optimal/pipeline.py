"""From a tree packing to a k-synchronous schedule: pipelined stages of pieces down the trees.

Each root's chunk is cut into ``stages * k`` pieces (``k`` = the packing's pieces per root). Piece
``p * k + i`` belongs to *stage* ``p`` and travels down tree ``i`` of its root (trees repeated by
their multiplicities); the arc into a rank at depth ``d`` of the tree is sent in step
``p + d - 1``. So step ``t`` carries depth 1 of stage ``t``, depth 2 of stage ``t - 1``, ...: once
the pipeline is full every step carries exactly one stage's load on every link, which the packing
fits in ``rounds_per_stage`` rounds. The schedule has ``stages + depth - 1`` steps; each step
lasts the fewest rounds its own sends need (links and bandwidth groups), so filling and draining
the pipeline costs only what those steps carry. Its rounds per chunk approach the packing's
steady state ``rounds_per_stage / k`` as ``stages`` grows (the overhead is at most
``(depth - 1) / stages`` of it).

Sends are built as numpy arrays (:class:`~collsynth.algorithm.arrays.SendBlock`), a few hundred
bytes per thousand sends, so a 1024-rank allgather of several million sends fits in memory.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np

from collsynth.algorithm.arrays import SendBlock
from collsynth.algorithm.model import Algorithm, Step
from collsynth.collective.model import Collective
from collsynth.graph.arborescence import depths
from collsynth.synthesis.bandwidth_optimal.packing import TreePacking
from collsynth.topology.capacity import link_capacity
from collsynth.topology.model import Topology

__all__ = ["pipelined_algorithm", "default_stages", "stages_for_size", "MAX_SENDS"]

#: Most sends :func:`default_stages` lets a schedule have (memory: ~13 bytes per send).
MAX_SENDS = 1 << 24


def default_stages(packing: TreePacking, num_ranks: int, num_roots: int) -> int:
    """Enough stages that filling and draining the pipeline cost at most 1/16 of a stage per
    depth level (``16 * (depth - 1)`` stages), within :data:`MAX_SENDS` sends; at least 1."""
    depth = packing.depth
    per_stage = packing.pieces_per_root * num_roots * (num_ranks - 1)
    wanted = max(1, 16 * (depth - 1))
    return max(1, min(wanted, MAX_SENDS // max(per_stage, 1)))


def stages_for_size(packing: TreePacking, num_ranks: int, num_roots: int, *, chunk_bytes: float,
                    alpha_us: float, beta_us_per_byte: float) -> int:
    """The number of stages that minimises the alpha-beta time for base chunks of
    ``chunk_bytes``, within :data:`MAX_SENDS` sends.

    With ``P`` stages, depth ``D`` and ``rho`` rounds per stage of ``k`` pieces, the schedule takes
    at most ``P + D - 1`` steps of ``rho`` rounds of ``chunk_bytes / (P k)`` bytes:
    ``(P + D - 1) (alpha + rho chunk_bytes beta / (P k))``, smallest at
    ``P = sqrt((D - 1) rho chunk_bytes beta / (k alpha))``. Small messages get one stage (fewest
    steps), large ones many (closest to the steady state).
    """
    depth = packing.depth
    per_stage = packing.pieces_per_root * num_roots * (num_ranks - 1)
    most = max(1, MAX_SENDS // max(per_stage, 1))
    if depth <= 1:
        return 1
    rho, k = packing.rounds_per_stage, packing.pieces_per_root
    best = ((depth - 1) * rho * chunk_bytes * beta_us_per_byte / (k * alpha_us)) ** 0.5
    candidates = {max(1, min(most, int(best))), max(1, min(most, int(best) + 1))}

    def time_us(p: int) -> float:
        return (p + depth - 1) * (alpha_us + rho * chunk_bytes * beta_us_per_byte / (p * k))

    return min(sorted(candidates), key=time_us)


def pipelined_algorithm(topology: Topology, collective: Collective, packing: TreePacking,
                        stages: int, *, name: str | None = None) -> Algorithm:
    """The pipelined schedule of ``packing`` for ``collective`` (unsplit: every chunk starts on
    one root and must reach every rank). Not verified here: the caller verifies.

    The result's collective is ``collective.split(stages * k)``; chunk ``c`` of the unsplit
    collective becomes pieces ``c * stages * k + j``.
    """
    k = packing.pieces_per_root
    factor = int(stages * k)
    base_of_root = {next(iter(pre)): c for c, pre in enumerate(collective.precondition)}
    chunk_parts, src_parts, dst_parts, step_parts = [], [], [], []
    stage_index = np.arange(stages, dtype=np.int64)
    for root, trees in packing.trees.items():
        expanded = [parent for parent, m in trees for _ in range(m)]
        if packing.shift is not None:
            shifts = np.arange(packing.shift.nodes, dtype=np.int64)
            images = packing.shift.shift(np.int64(root), shifts)
        else:
            shifts = np.zeros(1, dtype=np.int64)
            images = np.array([root], dtype=np.int64)
        bases = np.array([base_of_root[int(r)] for r in images], dtype=np.int64)
        for i, parent in enumerate(expanded):
            children = np.flatnonzero(parent >= 0)
            level = depths(parent)[children]
            u, v = parent[children], children
            if packing.shift is not None:
                u = packing.shift.shift(u[None, :], shifts[:, None])
                v = packing.shift.shift(v[None, :], shifts[:, None])
            else:
                u, v = u[None, :], v[None, :]
            # Axes: (stage, image, arc).
            shape = (stages, len(images), len(children))
            chunk = (bases[None, :, None] * factor + stage_index[:, None, None] * k + i)
            step = stage_index[:, None, None] + level[None, None, :] - 1
            chunk_parts.append(np.broadcast_to(chunk, shape).ravel())
            src_parts.append(np.broadcast_to(u[None], shape).ravel())
            dst_parts.append(np.broadcast_to(v[None], shape).ravel())
            step_parts.append(np.broadcast_to(step, shape).ravel())
    chunk = np.concatenate(chunk_parts)
    src = np.concatenate(src_parts).astype(np.int32)
    dst = np.concatenate(dst_parts).astype(np.int32)
    step = np.concatenate(step_parts)
    order = np.argsort(step, kind="stable")
    chunk, src, dst, step = chunk[order], src[order], dst[order], step[order]
    bounds = np.searchsorted(step, np.arange(int(step.max()) + 2))
    capacity = link_capacity(topology)
    steps = []
    for t in range(int(step.max()) + 1):
        lo, hi = bounds[t], bounds[t + 1]
        rounds = capacity.rounds(src[lo:hi], dst[lo:hi])
        steps.append(Step(rounds, SendBlock(chunk[lo:hi], src[lo:hi], dst[lo:hi])))
    split = collective.split(factor)
    total = sum(s.rounds for s in steps)
    label = name or (f"{collective.name}-{topology.name}-trees-s{len(steps)}-r{total}-c{factor}")
    return Algorithm(label, topology, split, tuple(steps), provenance={
        "engine": "bandwidth-optimal trees",
        "pieces_per_root_per_stage": k,
        "stages": stages,
        "rounds_per_stage": packing.rounds_per_stage,
        "steady_state_rounds_per_chunk": str(Fraction(packing.rounds_per_stage, k)),
    })
