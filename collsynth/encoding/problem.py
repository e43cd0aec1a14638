"""The synthesis problem for a non-combining collective, described independently of any solver.

The details (formats, conventions, rules) are in docs/encoding.md.
"""

from __future__ import annotations

from collections import defaultdict, deque
from dataclasses import dataclass

from collsynth.algorithm.model import Algorithm, Instance, Send, Step
from collsynth.collective.model import Collective
from collsynth.errors import InputTooLargeError, InvalidInstanceError
from collsynth.topology.model import Topology

__all__ = ["CandidateSend", "SchedulingProblem", "build_problem", "check_encoding_size", "decode",
           "MAX_CANDIDATES", "MAX_EXACT_STEPS"]

#: Refuse to build encodings with more candidate sends than this (before any solver work).
MAX_CANDIDATES = 3_000_000
#: The most synchronous steps an exact encoding takes. The solver's work grows with the steps
#: whatever the sends (ring:4 allgather, measured: 500 steps 5.5 s and 0.25 GB, 2000 steps 30 s
#: and 0.6 GB, 20000 steps 77 s and 4.3 GB, 100000 over 10 GB), and no schedule of a few ranks
#: needs more: a step costs an alpha, and rounds within a step carry the bandwidth.
MAX_EXACT_STEPS = 1024

_UNREACHABLE = 1 << 30


@dataclass(frozen=True)
class CandidateSend:
    """A send the solver may choose: ``chunk`` over ``src -> dst`` in ``step`` (1-based)."""

    chunk: int
    src: int
    dst: int
    step: int


@dataclass(frozen=True)
class SchedulingProblem:
    """Everything a backend needs, as plain tuples of indices into ``sends``.

    Attributes
    ----------
    sends:
        The candidate sends (decision variables).
    max_rounds_per_step:
        Upper bound of each ``rounds[t]`` (``R - S + 1``); lower bound is 1.
    arrivals:
        One entry per (chunk, rank) that can receive: ``arrivals[h][t - 1]`` are the sends that
        deliver the chunk to the rank in step ``t``. Backends define ``holds[h][t]``, "received by
        the end of step ``t``", as the running sum (at most one of them is chosen).
    hold_before_send:
        ``(i, h, t)``: send ``i`` may be chosen only if ``holds[h][t]`` (the sender received the
        chunk by the end of step ``t >= 1``). Sends from a rank in the precondition do not appear;
        ``h == -1`` means the sender can never hold the chunk in time (send ``i`` is 0).
    receive_exactly_once / receive_at_most_once:
        Tuples of send-index groups (all sends of one chunk into one rank).
    link_capacity:
        ``(bandwidth, (i, ...))`` per (link, step) with more candidates than one round carries;
        the step is ``sends[i].step``. Constraint: ``count <= bandwidth * rounds[step]``.
    group_capacity:
        ``(limit, step, (i, ...))`` per binding (group, step).
    arrival_cuts:
        ``(count, first_step, capacity)``: ``count <= capacity * sum(rounds[first_step..S])``.
    symmetric_pairs:
        ``((i...), (j...))`` receive groups at one rank of two interchangeable chunks; the solver
        adds ``arrival_step(first) <= arrival_step(second)``.
    memory:
        ``(step, rank, (i, ...), limit)`` when a memory limit is set: the scratch chunks rank
        holds at the end of ``step`` (sends into it up to that step) are at most ``limit``.
    min_sends:
        ``(count, (i, ...))``: at least ``count`` of the chunk's candidate sends are chosen.
    orbit_ties, orbit_zero:
        Only for a symmetric search: ``(i, j)`` pairs that must be equal, and sends that must be
        0 because their image under the automorphism is not a candidate.
    """

    topology: Topology
    collective: Collective
    instance: Instance
    sends: tuple[CandidateSend, ...]
    max_rounds_per_step: int
    arrivals: tuple[tuple[tuple[int, ...], ...], ...]
    hold_before_send: tuple[tuple[int, int, int], ...]
    receive_exactly_once: tuple[tuple[int, ...], ...]
    receive_at_most_once: tuple[tuple[int, ...], ...]
    link_capacity: tuple[tuple[int, tuple[int, ...]], ...]
    group_capacity: tuple[tuple[int, int, tuple[int, ...]], ...]
    arrival_cuts: tuple[tuple[int, int, int], ...]
    symmetric_pairs: tuple[tuple[tuple[int, ...], tuple[int, ...]], ...]
    memory: tuple[tuple[int, int, tuple[int, ...], int], ...]
    min_sends: tuple[tuple[int, tuple[int, ...]], ...] = ()
    orbit_ties: tuple[tuple[int, int], ...] = ()
    orbit_zero: tuple[int, ...] = ()
    trivially_infeasible: str | None = None

    @property
    def num_steps(self) -> int:
        return self.instance.steps

    @property
    def total_rounds(self) -> int:
        return self.instance.total_rounds


def _distances_from(sources: frozenset[int], adjacency: tuple[tuple[int, ...], ...], n: int) -> list[int]:
    dist = [_UNREACHABLE] * n
    queue = deque()
    for s in sources:
        dist[s] = 0
        queue.append(s)
    while queue:
        u = queue.popleft()
        for v in adjacency[u]:
            if dist[v] == _UNREACHABLE:
                dist[v] = dist[u] + 1
                queue.append(v)
    return dist


def all_pairs_hops(topology: Topology) -> list[list[int]]:
    """``hops[a][b]``: fewest links from ``a`` to ``b`` (a large number when unreachable)."""
    n = topology.num_ranks
    return [_distances_from(frozenset({a}), topology.destinations, n) for a in range(n)]


def in_capacity(topology: Topology) -> list[int]:
    """Most chunks each rank can receive per round: its incoming link bandwidth, capped by any
    bandwidth group that covers all of its incoming links."""
    n = topology.num_ranks
    caps = [sum(topology.links[s][d] for s in range(n)) for d in range(n)]
    for group, covered in topology.effective_groups:
        for d in group.destinations:
            incoming = {(s, d) for s in topology.sources[d]}
            if incoming and incoming <= set(covered):
                caps[d] = min(caps[d], group.limit)
    return caps


def check_encoding_size(topology: Topology, collective: Collective, steps: int,
                        split_into: int = 1) -> None:
    """Refuse, before any work on the topology (its links, hops or symmetries, all quadratic in
    its ranks), an encoding that must have more than ``4 * MAX_CANDIDATES`` send variables:
    every rank has a link in, so there are at least ``chunks x ranks x steps`` of them
    (allgather on 8192 ranks in 2 steps: 134M; the exact engine spent minutes looking for a
    symmetry first), or more than :data:`MAX_EXACT_STEPS` steps. ``split_into``: the pieces
    each of the collective's chunks will be split into (checked before the split is made).

    Raises
    ------
    InputTooLargeError
        With the figure.
    """
    if steps > MAX_EXACT_STEPS:
        raise InputTooLargeError(
            f"{steps} steps: the exact encoding takes at most {MAX_EXACT_STEPS} (its solver's "
            "memory and time grow with the steps); fewer steps with more rounds each carry the "
            "same bandwidth")
    least = collective.num_chunks * split_into * topology.num_ranks * steps
    if least > MAX_CANDIDATES * 4:
        split = f" in {split_into} pieces per chunk" if split_into > 1 else ""
        raise InputTooLargeError(
            f"the encoding of {collective.describe()}{split} on {topology.name} with {steps} "
            f"steps would have at least {least} send variables; more than the "
            f"{MAX_CANDIDATES * 4} collsynth builds (use an engine for large systems: solve "
            "bandwidth-optimal)")


def build_problem(topology: Topology, collective: Collective, instance: Instance, *,
                  automorphism: tuple[int, ...] | None = None) -> SchedulingProblem:
    """Build the pruned time-expanded encoding of ``collective`` (already split into
    ``instance.chunks`` pieces per base chunk) on ``topology``.

    Raises
    ------
    InvalidInstanceError
        If the collective is combining (use its dual) or its chunk factor differs from the
        instance's chunks.
    InputTooLargeError
        If the encoding would exceed :data:`MAX_CANDIDATES` candidate sends.
    """
    if collective.combining:
        raise InvalidInstanceError(
            f"{collective.describe()} is combining; synthesize its non-combining dual instead")
    if collective.chunk_factor != instance.chunks:
        raise InvalidInstanceError(
            f"collective has chunk factor {collective.chunk_factor} but the instance asks for "
            f"{instance.chunks} chunks")
    n, S = topology.num_ranks, instance.steps
    R = instance.total_rounds
    check_encoding_size(topology, collective, S)
    hops = all_pairs_hops(topology)
    edges = [(s, d, bw) for s, d, bw in topology.edges]
    estimate = collective.num_chunks * len(edges) * S
    if estimate > MAX_CANDIDATES * 4:
        raise InputTooLargeError(
            f"the encoding of {collective.describe()} on {topology.name} with {S} steps would have "
            f"up to {estimate} send variables; more than collsynth builds (use an engine for large "
            "systems)")

    sends: list[CandidateSend] = []
    index: dict[tuple[int, int, int, int], int] = {}
    need: list[frozenset[int]] = []
    dist_per_chunk: list[list[int]] = []
    infeasible: str | None = None
    for c in range(collective.num_chunks):
        pre, post = collective.precondition[c], collective.postcondition[c]
        needing = post - pre
        need.append(needing)
        dist = _distances_from(pre, topology.destinations, n)
        dist_per_chunk.append(dist)
        for d in needing:
            if dist[d] > S and infeasible is None:
                infeasible = (f"rank {d} is {dist[d]} hops from chunk {c}'s sources but only {S} "
                              "steps are allowed")
        # slack[r]: how many steps before the end rank r must hold c to still serve a needing rank.
        # r is useful in step t iff r needs c, or some needing rank is within S - t hops of r.
        reach_needing = [min((hops[r][v] for v in needing), default=_UNREACHABLE) for r in range(n)]
        for t in range(1, S + 1):
            for s, d, _ in edges:
                if d in pre or dist[s] > t - 1:
                    continue
                if d not in needing and reach_needing[d] > S - t:
                    continue
                index[(c, s, d, t)] = len(sends)
                sends.append(CandidateSend(c, s, d, t))
        if len(sends) > MAX_CANDIDATES:
            raise InputTooLargeError(
                f"the encoding of {collective.describe()} on {topology.name} with {S} steps has more "
                f"than {MAX_CANDIDATES} candidate sends; use an engine for large systems")

    into: dict[tuple[int, int], list[int]] = defaultdict(list)  # (chunk, rank) -> sends into it
    for i, x in enumerate(sends):
        into[(x.chunk, x.dst)].append(i)

    holder_index: dict[tuple[int, int], int] = {}
    arrivals = []
    for key, group in into.items():
        by_step: list[list[int]] = [[] for _ in range(S)]
        for j in group:
            by_step[sends[j].step - 1].append(j)
        holder_index[key] = len(arrivals)
        arrivals.append(tuple(tuple(g) for g in by_step))
    hold_before_send = []
    for i, x in enumerate(sends):
        if x.src in collective.precondition[x.chunk]:
            continue
        h = holder_index.get((x.chunk, x.src), -1)
        if x.step == 1:
            h = -1
        hold_before_send.append((i, h, x.step - 1))

    exactly, at_most = [], []
    for c in range(collective.num_chunks):
        for d in need[c]:
            group = tuple(into.get((c, d), ()))
            if not group and infeasible is None:
                infeasible = f"no candidate send can deliver chunk {c} to rank {d} in {S} steps"
            exactly.append(group)
    for (c, d), group in into.items():
        if d not in need[c] and len(group) > 1:
            at_most.append(tuple(group))

    per_link_step: dict[tuple[int, int, int], list[int]] = defaultdict(list)
    for i, x in enumerate(sends):
        per_link_step[(x.src, x.dst, x.step)].append(i)
    max_rounds = R - S + 1
    link_capacity = []
    for (s, d, t), group in per_link_step.items():
        bw = topology.links[s][d]
        if len(group) > bw:  # otherwise it can never bind
            link_capacity.append((bw, tuple(group)))
    group_capacity = []
    for group, covered in topology.effective_groups:
        for t in range(1, S + 1):
            members = tuple(i for link in covered for i in per_link_step.get((*link, t), ()))
            if len(members) > group.limit:
                group_capacity.append((group.limit, t, members))

    cap = in_capacity(topology)
    arrival_cuts = []
    for d in range(n):
        far = defaultdict(int)
        for c in range(collective.num_chunks):
            if d in need[c]:
                far[dist_per_chunk[c][d]] += 1
        for k in range(2, S + 1):
            count = sum(v for key, v in far.items() if key >= k)
            if count and cap[d]:
                arrival_cuts.append((count, k, cap[d]))
        total = sum(far.values())
        if total and cap[d] * R < total and infeasible is None:
            infeasible = (f"rank {d} needs {total} chunks but can receive at most {cap[d]} per "
                          f"round x {R} rounds")

    symmetric_pairs = []
    by_signature: dict[tuple, list[int]] = defaultdict(list)
    for c in range(collective.num_chunks):
        by_signature[(collective.base_chunk(c), collective.precondition[c],
                      collective.postcondition[c])].append(c)
    for chunks in by_signature.values():
        if len(chunks) < 2:
            continue
        needing = sorted(need[chunks[0]])
        if not needing:
            continue
        anchor = needing[0]
        for c1, c2 in zip(chunks, chunks[1:]):
            symmetric_pairs.append((tuple(into.get((c1, anchor), ())),
                                    tuple(into.get((c2, anchor), ()))))

    per_chunk: dict[int, list[int]] = defaultdict(list)
    for i, x in enumerate(sends):
        per_chunk[x.chunk].append(i)
    min_sends = []
    for c in range(collective.num_chunks):
        if need[c]:
            count = max(len(need[c]), max(dist_per_chunk[c][d] for d in need[c]))
            if count > 1:
                min_sends.append((count, tuple(per_chunk.get(c, ()))))

    orbit_ties: list[tuple[int, int]] = []
    orbit_zero: list[int] = []
    if automorphism is not None:
        chunk_image = _chunk_permutation(collective, automorphism)
        for i, x in enumerate(sends):
            j = index.get((chunk_image[x.chunk], automorphism[x.src], automorphism[x.dst], x.step))
            if j is None:
                orbit_zero.append(i)
            elif j != i:
                orbit_ties.append((i, j))

    memory = []
    if instance.extra_memory is not None:
        for r in range(n):
            scratch = [i for i, x in enumerate(sends) if x.dst == r
                       and r not in collective.postcondition[x.chunk]]
            for t in range(1, S + 1):
                upto = tuple(i for i in scratch if sends[i].step <= t)
                if len(upto) > instance.extra_memory:
                    memory.append((t, r, upto, instance.extra_memory))

    return SchedulingProblem(
        topology=topology,
        collective=collective,
        instance=instance,
        sends=tuple(sends),
        max_rounds_per_step=max_rounds,
        arrivals=tuple(arrivals),
        hold_before_send=tuple(hold_before_send),
        receive_exactly_once=tuple(exactly),
        receive_at_most_once=tuple(at_most),
        link_capacity=tuple(link_capacity),
        group_capacity=tuple(group_capacity),
        arrival_cuts=tuple(arrival_cuts),
        symmetric_pairs=tuple(symmetric_pairs),
        memory=tuple(memory),
        min_sends=tuple(min_sends),
        orbit_ties=tuple(orbit_ties),
        orbit_zero=tuple(orbit_zero),
        trivially_infeasible=infeasible,
    )


def _chunk_permutation(collective: Collective, perm: tuple[int, ...]) -> list[int]:
    """The chunk permutation a rank permutation induces: chunk ``c`` (piece ``i`` of its base chunk)
    maps to the chunk with the permuted pre/postcondition and the same piece index."""
    lookup: dict[tuple, int] = {}
    k = collective.chunk_factor
    for c in range(collective.num_chunks):
        lookup[(collective.precondition[c], collective.postcondition[c], c % k)] = c
    image = []
    for c in range(collective.num_chunks):
        key = (frozenset(perm[r] for r in collective.precondition[c]),
               frozenset(perm[r] for r in collective.postcondition[c]), c % k)
        if key not in lookup:
            raise InvalidInstanceError("the rank permutation is not an automorphism of the collective")
        image.append(lookup[key])
    return image


def decode(problem: SchedulingProblem, chosen: list[int] | tuple[int, ...], rounds: list[int],
           *, name: str, provenance: dict[str, object]) -> Algorithm:
    """The :class:`Algorithm` made of the chosen candidate sends and the rounds of each step.

    Not verified here: the caller verifies (solvers are not trusted).
    """
    per_step: list[list[Send]] = [[] for _ in range(problem.num_steps)]
    for i in chosen:
        x = problem.sends[i]
        per_step[x.step - 1].append(Send(x.chunk, x.src, x.dst))
    steps = tuple(Step(int(r), tuple(sorted(sends))) for r, sends in zip(rounds, per_step))
    return Algorithm(name=name, topology=problem.topology, collective=problem.collective,
                     steps=steps, provenance=provenance)
