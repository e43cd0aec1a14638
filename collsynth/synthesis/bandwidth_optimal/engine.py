"""``solve_bandwidth_optimal``: the tree engine end to end, for systems of any size.

1. The optimal throughput, exactly (:func:`~.throughput.optimal_throughput`, cuts of the fabric).
2. Trees per root that reach it (:func:`~.packing.pack_trees`), with integer multiplicities.
3. A pipelined step schedule along them (:func:`~.pipeline.pipelined_algorithm`).
4. Verification by the same replay as every other algorithm (vectorised for large ones).

Reduce-scatter and reduce are built as the allgather / broadcast of the reversed topology, read
backwards (:func:`collsynth.algorithm.transform.invert_dual`); allreduce as reduce-scatter then
allgather.
"""

from __future__ import annotations

import logging
import math
import time
from fractions import Fraction
from typing import Callable

from collsynth.algorithm.transform import invert_dual, refine, sequence
from collsynth.algorithm.verify import verify
from collsynth.collective.duality import has_non_combining_dual, non_combining_dual
from collsynth.collective.model import Collective
from collsynth.collective.standard import allgather, reduce_scatter
from collsynth.errors import (InvalidCollectiveError, InvalidInstanceError, UnknownNameError,
                              expect_type)
from collsynth.collective.standard import is_standard_allreduce
from collsynth.graph.fabric import UnsupportedFabricError
from collsynth.limits import ResourceLimitError, TimeLimitReached, check_memory
from collsynth.synthesis.bandwidth_optimal.packing import PackingOptions, pack_trees
from collsynth.synthesis.bandwidth_optimal.pipeline import (
    default_stages,
    pipelined_algorithm,
    stages_for_size,
)
from collsynth.bounds.throughput import optimal_throughput, roots_of
from collsynth.synthesis.result import ScheduleResult
from collsynth.topology.model import Topology

__all__ = ["solve_bandwidth_optimal", "check_request_fits"]

_log = logging.getLogger(__name__)

#: Peak memory per send of building and verifying a schedule, rounded up: 16.8M sends (2048
#: ranks) peaked at 2.0 GB of which about 0.3 GB is the process before any work.
BYTES_PER_SEND = 128
#: Seconds per send of building and verifying a schedule: 16.8M sends took 16.3 s + 7.3 s on a
#: 2-core machine; a request whose fewest sends cannot be built in its time limit at half that
#: rate is refused up front.
SECONDS_PER_SEND = 0.7e-6

#: Largest topology on which the linear-program bound of collsynth.bounds is also computed when
#: the fabric's cut bound does not meet the packing (shared NICs): it is tighter, and exact.
_LP_BOUND_MAX_RANKS = 32


def solve_bandwidth_optimal(topology: Topology, collective: Collective, *,
                            stages: int | None = None, size_bytes: int | None = None,
                            time_limit: float = 600.0,
                            progress: Callable[[str], None] | None = None,
                            compact: bool | None = None) -> ScheduleResult:
    """A verified, pipelined tree schedule with the optimal throughput.

    Returns a :class:`~collsynth.synthesis.result.ScheduleResult` of engine ``"trees"`` whose
    ``details`` hold ``stages``, ``pieces_per_root`` and ``depth``; ``timings`` split its time
    (bound, packing, schedule, verify).

    Parameters
    ----------
    collective:
        Allgather, broadcast (one or several roots), reduce-scatter, reduce or allreduce,
        unsplit (``chunk_factor == 1``).
    stages:
        Pipeline stages; default :func:`~.pipeline.stages_for_size` when ``size_bytes`` is given
        and the topology has ``alpha_us`` and ``unit_gbps``, else :func:`~.pipeline.default_stages`
        (more stages: closer to the steady state, more steps).
    size_bytes:
        The buffer size (nccl-tests convention) to choose the stages for.
    time_limit:
        Seconds for the tree packing's column generation; on expiry the best packing found is
        used (``optimal`` then says whether it still reached the bound).
    progress:
        Called with one line per phase.
    compact:
        Keep the schedule compact (``ScheduleResult.compact``: node 0's template and the node
        shift, verified through the symmetry; ``algorithm`` ``None`` until
        :meth:`~collsynth.synthesis.result.ScheduleResult.expanded`). ``None`` (default): above
        :data:`COMPACT_ABOVE_RANKS` ranks, for allgather, reduce-scatter and allreduce on a
        composed system whose node shift is a symmetry; ``True``: whenever that applies
        (else :class:`~collsynth.errors.VerificationError`); ``False``: never.

    Raises
    ------
    InvalidCollectiveError
        For other collectives (alltoall: :mod:`collsynth.synthesis.alltoall_scale`).

    Examples
    --------
    >>> from collsynth.topology import compose_nodes, get_topology
    >>> from collsynth.collective import standard_collective
    >>> system = compose_nodes(get_topology("fully-connected:4"), 2, nic_units=1)
    >>> result = solve_bandwidth_optimal(system, standard_collective("allgather", 8), stages=2)
    >>> result.lower_bound, result.steady_state_rounds_per_chunk, result.optimal
    (Fraction(7, 4), Fraction(7, 4), True)
    """
    started = time.perf_counter()
    expect_type(topology, Topology, "solve_bandwidth_optimal: topology")
    expect_type(collective, Collective, "solve_bandwidth_optimal: collective")
    if collective.chunk_factor != 1:
        raise InvalidInstanceError(f"{collective.describe()}: pass the unsplit collective; the "
                                   "engine chooses the pieces")
    if stages is not None and (not isinstance(stages, int) or stages < 1):
        raise InvalidInstanceError(f"stages = {stages!r}; expected a positive integer")
    # Not > 0: the inner calls pass what is left, and none left is the time limit reached.
    if isinstance(time_limit, bool) or not isinstance(time_limit, (int, float)) or \
            math.isnan(time_limit):
        raise InvalidInstanceError(f"time_limit = {time_limit!r}; expected a number of seconds")
    deadline = started + time_limit
    n = topology.num_ranks
    if _wants_compact(topology, collective, compact):
        return _compact_result(topology, collective, stages, time_limit, progress, started,
                               required=compact is True)
    # Every chunk reaches the other n - 1 ranks once per piece: refuse before any work what
    # cannot fit (allreduce builds two such halves).
    chunks = 2 * n if is_standard_allreduce(collective) else collective.num_chunks
    # Against the whole limit, not the clock: whether a request is refused up front must not
    # depend on how busy the machine was while it was being parsed.
    _check_fits(chunks * (n - 1) * (stages or 1), time_limit, time_limit,
                f"{collective.describe()} on {topology.name}"
                + (f" with {stages} stages" if stages else ""))
    say = progress or (lambda line: None)
    timings: dict[str, float] = {}
    if is_standard_allreduce(collective):
        return _allreduce(topology, collective, stages, size_bytes, time_limit, say, started)
    if collective.combining:
        if not has_non_combining_dual(collective):
            raise InvalidCollectiveError(f"{collective.describe()}: the tree engine handles "
                                         "allgather, broadcast, reduce-scatter, reduce, allreduce")
        say("building the dual on the reversed topology")
        dual = solve_bandwidth_optimal(topology.reversed(), non_combining_dual(collective),
                                       stages=stages, size_bytes=size_bytes,
                                       time_limit=time_limit - (time.perf_counter() - started),
                                       progress=progress)
        tick = time.perf_counter()
        algorithm = invert_dual(dual.algorithm, topology, collective.split(dual.algorithm.chunks))
        timings = dict(dual.timings, invert=time.perf_counter() - tick)
        return _result(algorithm, dual.steady_state_rounds_per_chunk, dual.lower_bound,
                       started, timings, dual.details, dual.stopped_by)

    roots = roots_of(collective)
    tick = time.perf_counter()
    try:
        bound = optimal_throughput(topology, collective).rounds_per_chunk
    except UnsupportedFabricError as exc:
        _log.info("fabric cut bound unavailable (%s); using the linear program", exc)
        from collsynth.bounds import rounds_per_chunk_lower_bound
        bound = rounds_per_chunk_lower_bound(topology, collective)
    timings["bound"] = time.perf_counter() - tick
    say(f"optimal throughput: {bound} rounds per chunk ({timings['bound']:.2f} s)")
    _check_time(deadline, time_limit, "computing the optimal throughput")

    tick = time.perf_counter()
    packing = pack_trees(topology, sorted(roots), target=bound,
                         options=PackingOptions(time_limit=max(0.0, deadline - tick),
                                                progress=progress))
    timings["packing"] = time.perf_counter() - tick
    steady = packing.steady_state_rounds_per_chunk
    say(f"trees: {steady} rounds per chunk in the steady state, {packing.pieces_per_root} "
        f"pieces per root, depth {packing.depth} ({timings['packing']:.2f} s)")
    if steady > bound and topology.num_ranks <= _LP_BOUND_MAX_RANKS:
        from collsynth.bounds import rounds_per_chunk_lower_bound
        tick = time.perf_counter()
        bound = max(bound, rounds_per_chunk_lower_bound(topology, collective))
        timings["lp_bound"] = time.perf_counter() - tick

    tick = time.perf_counter()
    count = stages or _stages(topology, collective, packing, len(roots), size_bytes)
    _check_fits(count * packing.pieces_per_root * collective.num_chunks
                * (topology.num_ranks - 1), deadline - time.perf_counter(), time_limit,
                f"the schedule of {collective.describe()} on {topology.name} ({count} stages of "
                f"{packing.pieces_per_root} pieces per root)")
    algorithm = pipelined_algorithm(topology, collective, packing, count)
    timings["schedule"] = time.perf_counter() - tick
    say(f"schedule: {algorithm.num_steps} steps, {algorithm.num_sends} sends "
        f"({timings['schedule']:.2f} s)")
    _check_time(deadline, time_limit, "building the schedule")
    tick = time.perf_counter()
    verify(algorithm)
    timings["verify"] = time.perf_counter() - tick
    say(f"verified ({timings['verify']:.2f} s)")
    return _result(algorithm, steady, bound, started, timings,
                   {"stages": count, "pieces_per_root": packing.pieces_per_root,
                    "depth": packing.depth}, _cut_short(packing, steady, bound))


def _cut_short(packing, steady: Fraction, bound: Fraction) -> str | None:
    """Why the packing is not proven the best (a limit ended its search before it reached the
    bound), or ``None``."""
    return None if steady <= bound else packing.stats.get("stopped_by")


#: Above this many ranks the tree engine keeps symmetric schedules compact by default: the
#: expanded schedule outgrows the 16M-send cap that would force fewer pipeline stages (4096
#: GPUs: 536M sends, 1.78x the bound in one stage; compact: 131k template sends, 1.049x).
COMPACT_ABOVE_RANKS = 1024
_COMPACT_KINDS = ("allgather", "reduce_scatter", "allreduce")


def _wants_compact(topology: Topology, collective: Collective, compact: bool | None) -> bool:
    if compact is False:
        return False
    # By name only (comparing with the standard collective costs ranks squared); the compact
    # schedule's verification checks the collective itself.
    shaped = collective.name in _COMPACT_KINDS and collective.chunk_factor == 1
    if compact is True:
        if not shaped:
            raise InvalidCollectiveError(f"{collective.describe()}: compact schedules exist for "
                                         "the standard allgather, reduce-scatter and allreduce")
        return True
    layout = topology.layout
    return shaped and topology.num_ranks > COMPACT_ABOVE_RANKS and layout is not None \
        and layout.multi_node


def _compact_result(topology, collective, stages, time_limit, progress, started, *,
                    required: bool) -> ScheduleResult | None:
    from collsynth.errors import VerificationError
    from collsynth.synthesis.bandwidth_optimal.symmetric import solve_symmetric

    try:
        schedule = solve_symmetric(topology, collective, stages=stages, time_limit=time_limit,
                                   progress=progress)
    except VerificationError:
        if required:
            raise
        _log.info("no node symmetry on %s: the schedule is built in full", topology.name)
        return solve_bandwidth_optimal(topology, collective, stages=stages,
                                       time_limit=time_limit - (time.perf_counter() - started),
                                       progress=progress, compact=False)
    facts = schedule.provenance
    stopped = facts.get("stopped_by")
    return ScheduleResult(None, "trees", schedule.rounds_per_chunk,
                          Fraction(facts["steady_state_rounds_per_chunk"]),
                          Fraction(facts["lower_bound"]), time.perf_counter() - started,
                          facts.get("timings", {}),
                          {"stages": facts.get("stages"), "template_sends":
                           schedule.template_sends, "images": schedule.shift.nodes},
                          compact=schedule, complete=stopped is None, stopped_by=stopped)


def _result(algorithm, steady, bound, started, timings, details,
            stopped_by: str | None = None) -> ScheduleResult:
    return ScheduleResult(algorithm, "trees", algorithm.rounds_per_chunk, steady, bound,
                          time.perf_counter() - started, timings, details,
                          complete=stopped_by is None, stopped_by=stopped_by)


def check_request_fits(num_ranks: int, collective: str, *, stages: int | None,
                       time_limit: float) -> None:
    """Refuse, before the topology and collective are even built (both grow as ranks squared),
    a request whose fewest sends cannot fit in memory or be built in ``time_limit``.

    Raises
    ------
    ResourceLimitError
        With the figures.
    """
    chunks = {"broadcast": 1, "reduce": 1, "allreduce": 2 * num_ranks}.get(collective, num_ranks)
    _check_fits(chunks * (num_ranks - 1) * (stages or 1), time_limit, time_limit,
                f"{collective} on {num_ranks} ranks" + (f" with {stages} stages" if stages else ""))


def _check_fits(sends: int, seconds_left: float, time_limit: float, what: str) -> None:
    """Refuse a schedule of ``sends`` sends that cannot fit in memory or be built in
    ``seconds_left`` seconds (:data:`BYTES_PER_SEND`, :data:`SECONDS_PER_SEND`).

    Raises
    ------
    ResourceLimitError
        The schedule is too large for the memory or for the seconds left.
    TimeLimitReached
        No time is left at all (``time_limit`` seconds, the caller's whole limit, are spent).
    """
    check_memory(sends * BYTES_PER_SEND, f"{what}: {sends} sends")
    if seconds_left <= 0:
        raise TimeLimitReached(f"time limit of {time_limit:g} s reached before {what} was "
                               "built; nothing found (raise --time-limit)")
    needed = sends * SECONDS_PER_SEND
    if needed > seconds_left:
        raise ResourceLimitError(
            f"{what}: {sends} sends take about {needed:.3g} s or more to build and verify; the "
            f"time limit leaves {seconds_left:.3g} s")


def _check_time(deadline: float, time_limit: float, doing: str) -> None:
    if time.perf_counter() > deadline:
        raise TimeLimitReached(f"time limit of {time_limit:g} s reached while {doing}; "
                               "nothing found (raise --time-limit)")


def _stages(topology, collective, packing, num_roots, size_bytes) -> int:
    if size_bytes is None or topology.alpha_us is None or topology.unit_gbps is None:
        return default_stages(packing, topology.num_ranks, num_roots)
    from collsynth.collective.kinds import base_chunk_bytes
    from collsynth.timing.alphabeta import from_topology

    model = from_topology(topology)
    name = collective.name
    try:
        chunk = float(base_chunk_bytes(name, topology.num_ranks, size_bytes))
    except UnknownNameError:  # no buffer convention (multi-root broadcast): one per root
        chunk = float(size_bytes) / max(1, num_roots)
    return stages_for_size(packing, topology.num_ranks, num_roots, chunk_bytes=chunk,
                           alpha_us=model.alpha_us, beta_us_per_byte=model.beta_us_per_byte)


def _allreduce(topology, collective, stages, size_bytes, time_limit, say,
               started) -> ScheduleResult:
    n = topology.num_ranks
    say("allreduce = reduce-scatter + allgather")
    # Each half moves the whole buffer in n parts: sized as a reduce-scatter / allgather of it.
    # The halves share the time limit: the second gets what the first leaves.
    rs = solve_bandwidth_optimal(topology, reduce_scatter(n), stages=stages, size_bytes=size_bytes,
                                 time_limit=time_limit / 2, progress=say)
    ag = solve_bandwidth_optimal(topology, allgather(n), stages=stages, size_bytes=size_bytes,
                                 time_limit=time_limit - (time.perf_counter() - started),
                                 progress=say)
    tick = time.perf_counter()
    a, b = rs.algorithm, ag.algorithm
    common = math.lcm(a.chunks, b.chunks)
    whole = collective.split(n * common)
    algorithm = sequence(refine(a, common // a.chunks), refine(b, common // b.chunks), whole,
                         name=f"allreduce-{topology.name}-trees-rs{a.num_steps}+ag{b.num_steps}"
                              f"-c{n * common}")
    timings = {f"reduce_scatter_{k}": v for k, v in rs.timings.items()}
    timings.update({f"allgather_{k}": v for k, v in ag.timings.items()})
    timings["compose"] = time.perf_counter() - tick
    steady = (rs.steady_state_rounds_per_chunk + ag.steady_state_rounds_per_chunk) / n
    bound = (rs.lower_bound + ag.lower_bound) / n
    return _result(algorithm, steady, bound, started, timings,
                   {key: max(rs.details[key], ag.details[key])
                    for key in ("stages", "pieces_per_root", "depth")},
                   None if steady <= bound else rs.stopped_by or ag.stopped_by)
