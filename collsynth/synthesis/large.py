"""The strategy layer for systems of any size: pick an engine by size and collective.

``engine="auto"`` (:func:`choose_engine`) gives ``exact`` (the SMT Pareto front's bandwidth-best
point) up to :data:`EXACT_MAX_RANKS` ranks and to the collectives no other engine handles,
``trees`` (:mod:`collsynth.synthesis.bandwidth_optimal`) to larger allgather, reduce-scatter,
broadcast, reduce and allreduce, ``alltoall`` (:mod:`collsynth.synthesis.alltoall_scale`) to larger
alltoall; ``hierarchical`` (:mod:`collsynth.synthesis.hierarchical`) runs only when named. Every
engine returns a verified algorithm in a :class:`~collsynth.synthesis.result.ScheduleResult`;
:func:`solve_large` passes it on, adding the lower bound where the engine computes none.
"""

from __future__ import annotations

import time
from fractions import Fraction
from typing import Callable

from collsynth.collective.model import Collective
from collsynth.errors import (InvalidCollectiveError, SolverError, UnimplementableError,
                              UnknownNameError, expect_type)
from collsynth.synthesis.bandwidth_optimal.engine import solve_bandwidth_optimal
from collsynth.bounds.throughput import broadcast_shape
from collsynth.limits import Deadline
from collsynth.synthesis.result import ScheduleResult
from collsynth.topology.model import Topology

__all__ = ["ENGINES", "EXACT_MAX_RANKS", "choose_engine", "solve_large"]

ENGINES = ("auto", "exact", "trees", "alltoall", "hierarchical")
#: Largest system the automatic choice gives to the exact SMT engine.
EXACT_MAX_RANKS = 8


def _tree_shaped(collective: Collective) -> bool:
    from collsynth.collective.duality import has_non_combining_dual, non_combining_dual
    from collsynth.collective.standard import is_standard_allreduce

    if is_standard_allreduce(collective):
        return True
    if collective.combining:
        return has_non_combining_dual(collective) and \
            broadcast_shape(non_combining_dual(collective)) is not None
    return broadcast_shape(collective) is not None


def choose_engine(topology: Topology, collective: Collective) -> str:
    """The engine ``engine="auto"`` uses (see the module docstring).

    >>> from collsynth.topology import get_topology
    >>> from collsynth.collective import standard_collective
    >>> choose_engine(get_topology("dgx1"), standard_collective("allgather", 8))
    'exact'
    >>> choose_engine(get_topology("hub:16"), standard_collective("allreduce", 16))
    'trees'
    """
    if topology.num_ranks <= EXACT_MAX_RANKS:
        return "exact"
    if _tree_shaped(collective):
        return "trees"
    if collective.name == "alltoall":
        return "alltoall"
    return "exact"


def solve_large(topology: Topology, collective: Collective, *, engine: str = "auto",
                stages: int | None = None, size_bytes: int | None = None,
                time_limit: float = 600.0,
                progress: Callable[[str], None] | None = None,
                compact: bool | None = None) -> ScheduleResult:
    """A verified algorithm from ``engine`` (``"auto"``: :func:`choose_engine`).

    ``compact`` goes to the tree engine (:func:`solve_bandwidth_optimal`): whether a symmetric
    schedule is kept as its template and node shift (default: above 1024 ranks).

    ``stages`` and ``size_bytes`` (the buffer the pipeline is tuned for) go to the tree engine.
    ``time_limit`` (seconds) bounds the whole call for every engine; each engine documents what
    it returns or raises when it runs out (typically the best verified schedule found so far,
    else :class:`~collsynth.limits.TimeLimitReached` or, for a schedule that cannot be built and
    verified in the time left, :class:`~collsynth.limits.ResourceLimitError`).

    Raises
    ------
    UnknownNameError
        For an unknown engine.
    """
    expect_type(topology, Topology, "solve_large: topology")
    expect_type(collective, Collective, "solve_large: collective")
    if engine not in ENGINES:
        raise UnknownNameError(f"unknown engine {engine!r}; valid: {', '.join(ENGINES)}")
    chosen = choose_engine(topology, collective) if engine == "auto" else engine
    say = progress or (lambda line: None)
    say(f"engine: {chosen}")
    started = time.perf_counter()
    if chosen == "trees":
        return solve_bandwidth_optimal(topology, collective, stages=stages, size_bytes=size_bytes,
                                       time_limit=time_limit, progress=progress, compact=compact)
    if chosen == "exact":
        from collsynth.bounds import compute_bounds
        from collsynth.synthesis import SolveOptions, pareto_front

        sweep = pareto_front(topology, collective, options=SolveOptions(time_limit=time_limit))
        front = list(sweep)
        if not front:
            from collsynth.errors import SolverError

            raise SolverError(f"the exact engine found no algorithm for {collective.describe()} "
                              f"on {topology.name} in {time_limit:g} s")
        algorithm = front[-1].algorithm
        tick = time.perf_counter()
        bounds = compute_bounds(topology, collective)
        bound = bounds.composed_rounds_per_chunk or bounds.rounds_per_chunk
        rpc = algorithm.rounds_per_chunk
        now = time.perf_counter()
        stopped = None if sweep.complete or rpc <= bound else sweep.stopped_by
        return ScheduleResult(algorithm, "exact", rpc, rpc, bound, now - started,
                              {"pareto": tick - started, "bound": now - tick},
                              {"pareto_points": len(front)}, complete=stopped is None,
                              stopped_by=stopped)
    if chosen == "alltoall":
        from collsynth.synthesis.alltoall_scale import solve_alltoall_at_scale

        return solve_alltoall_at_scale(topology, time_limit=time_limit,
                                       deadline=Deadline(time_limit, started))
    from collsynth.synthesis.hierarchical import hierarchical_algorithm

    root = collective.roots[0] if collective.roots else None
    result = hierarchical_algorithm(topology, collective.name, root=root,
                                    time_limit=min(time_limit, 60.0),
                                    deadline=Deadline(time_limit, started))
    tick = time.perf_counter()
    bound = _lower_bound(topology, collective)
    return result.with_lower_bound(bound, time.perf_counter() - tick)


def _lower_bound(topology: Topology, collective: Collective) -> Fraction:
    from collsynth.bounds.throughput import optimal_throughput

    try:
        return optimal_throughput(topology, collective).rounds_per_chunk
    except (InvalidCollectiveError, SolverError, UnimplementableError):
        # no fabric bound for this shape: the exact LP (small systems)
        from collsynth.bounds import rounds_per_chunk_lower_bound

        return rounds_per_chunk_lower_bound(topology, collective)
