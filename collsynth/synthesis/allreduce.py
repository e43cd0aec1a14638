"""Allreduce fronts: reduce-scatter followed by allgather, and direct synthesis.

**Composition.** A reduce-scatter algorithm at ``(S1, R1, C1)`` and an allgather algorithm at
``(S2, R2, C2)`` on ``n`` ranks, both refined to ``L = lcm(C1, C2)`` chunks per part, run one after
the other, form an allreduce with ``n * L`` chunks, ``S1 + S2`` steps and
``(R1/C1 + R2/C2) / n`` rounds per chunk (one allreduce chunk is a whole buffer; one part chunk is
``1/n`` of it). The reduce-scatter front is the allgather front of the reversed topology, read
backwards (:func:`collsynth.collective.non_combining_dual`).

**Direct.** The combining encoding (:mod:`collsynth.encoding.combining`) searches allreduce
schedules that forward partial sums, which can beat any composition in steps (DGX-1: 2 steps).
"""

from __future__ import annotations

import math

from collsynth.algorithm.transform import refine, sequence
from collsynth.collective.model import Collective
from collsynth.collective.standard import allgather, reduce_scatter
from collsynth.synthesis.result import SolveOptions, SynthesisResult
from collsynth.topology.model import Topology

__all__ = ["composed_allreduce_front"]


def composed_allreduce_front(topology: Topology, collective: Collective, *, max_chunks: int,
                             max_steps: int | None, options: SolveOptions,
                             log) -> list[SynthesisResult]:
    """The Pareto front of reduce-scatter + allgather compositions with at most ``max_chunks``
    allreduce chunks (verified algorithms)."""
    from collsynth.algorithm.model import Instance
    from collsynth.encoding.backend import Status
    from collsynth.synthesis.strategies import SweepLog, pareto_front, prune_dominated

    n = topology.num_ranks
    part_chunks = max_chunks // n
    if part_chunks < 1:
        return []
    part_steps = None if max_steps is None else max_steps - 1
    rs_log, ag_log = SweepLog(), SweepLog()
    rs = list(pareto_front(topology, reduce_scatter(n), max_chunks=part_chunks,
                           max_steps=part_steps, options=options, log=rs_log))
    ag = [] if rs_log.interrupted else list(pareto_front(
        topology, allgather(n), max_chunks=part_chunks, max_steps=part_steps, options=options,
        log=ag_log))
    log.attempts.extend(rs_log.attempts + ag_log.attempts)
    log.complete = log.complete and rs_log.complete and ag_log.complete
    if rs_log.interrupted or ag_log.interrupted:  # Ctrl-C: the caller stops too
        log.complete, log.interrupted, log.stopped_by = False, True, "interrupted"
    combined: list[SynthesisResult] = []
    for first in rs:
        for second in ag:
            a, b = first.algorithm, second.algorithm
            common = math.lcm(a.chunks, b.chunks)
            if n * common > max_chunks:
                continue
            steps = a.num_steps + b.num_steps
            if max_steps is not None and steps > max_steps:
                continue
            whole = collective.split(n * common)
            algorithm = sequence(refine(a, common // a.chunks), refine(b, common // b.chunks), whole,
                                 name=f"allreduce-{topology.name}-rs{a.num_steps}+ag{b.num_steps}"
                                      f"-c{n * common}")
            instance = Instance(steps=algorithm.num_steps, rounds=algorithm.num_rounds,
                                chunks=algorithm.chunks)
            combined.append(SynthesisResult(instance, Status.SAT, algorithm,
                                            first.seconds + second.seconds, first.backend,
                                            "reduce-scatter + allgather"))
    return prune_dominated(combined)
