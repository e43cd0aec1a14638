"""Compact symmetric schedules: one node's template and the node shift, verified through it.

On ``K`` identical nodes (:func:`~collsynth.graph.symmetry.node_shift`) or a torus / hypercube
(:func:`~collsynth.graph.translations.grid_translations`) the tree engine's allgather is the same
on every node, moved: the sends of node 0's roots' chunks (the *template*) and their ``K``
images are the whole schedule. A :class:`SymmetricSchedule` stores the template (``1/K`` of the
sends), :func:`verify_symmetric` proves the whole through the symmetry, and :func:`expand`
makes the full :class:`~collsynth.algorithm.model.Algorithm` when it is needed (export, run).
Allgather, reduce-scatter (the allgather of the reversed topology read backwards) and allreduce
(both halves), every rank the owner of one part.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction

import numpy as np
import scipy.sparse as sp

from collsynth.algorithm.arrays import SendBlock, sends_as_arrays
from collsynth.algorithm.model import Algorithm, Step
from collsynth.algorithm.verify import find_problems
from collsynth.collective.model import Collective
from collsynth.errors import VerificationError
from collsynth.graph.arborescence import depths
from collsynth.graph.symmetry import NodeShift
from collsynth.synthesis.bandwidth_optimal.packing import TreePacking
from collsynth.topology.capacity import link_capacity
from collsynth.topology.model import Topology

__all__ = ["SymmetricSchedule", "solve_symmetric", "symmetric_pipelined_schedule",
           "symmetric_problems", "verify_symmetric", "expand"]


@dataclass(frozen=True)
class SymmetricSchedule:
    """A schedule given by its template and a node shift (see the module docstring).

    Attributes
    ----------
    topology, collective:
        The system and the *unsplit* allgather, reduce-scatter or allreduce.
    shift:
        The node shift; image ``g`` (``0 <= g < shift.nodes``) moves every rank by ``g`` nodes.
    pieces:
        Pieces per chunk: the full schedule implements ``collective.split(pieces)``.
    steps:
        The template's steps: their rounds are the *full* schedule's (every image at once);
        their sends, the template's, name chunks of ``collective.split(pieces)`` whose roots
        lie in node 0.
    """

    topology: Topology
    collective: Collective
    shift: NodeShift
    pieces: int
    steps: tuple[Step, ...]
    provenance: dict = field(default_factory=dict, compare=False)

    @property
    def num_steps(self) -> int:
        return len(self.steps)

    @property
    def num_rounds(self) -> int:
        return sum(step.rounds for step in self.steps)

    @property
    def rounds_per_chunk(self) -> Fraction:
        return Fraction(self.num_rounds, self.pieces)

    @property
    def template_sends(self) -> int:
        return sum(len(step.sends) for step in self.steps)

    @property
    def num_sends(self) -> int:
        """Sends of the expanded schedule."""
        return self.template_sends * self.shift.nodes

    def expanded(self, *, name: str | None = None) -> Algorithm:
        """:func:`expand`: every image of the template, as one algorithm."""
        return expand(self, name=name)


# -- the symmetry's classes of links ----------------------------------------------------------


@dataclass(frozen=True)
class _Owners:
    """Who owns each chunk of ``collective.split(pieces)``: allgather, the rank holding it first;
    reduce-scatter, the rank it ends on; allreduce (split ``n q`` ways), the rank whose part it
    is (chunk ``g q + j`` is piece ``j`` of rank ``g``'s part). Owner ``o``'s chunks are
    ``block[o] * q + j``, ``0 <= j < q``; a shift moves them to the owner's image's."""

    kind: str
    block: np.ndarray
    owner: np.ndarray
    q: int

    def of(self, chunk: np.ndarray) -> np.ndarray:
        return self.owner[chunk // self.q]

    def chunk(self, owner: np.ndarray, piece: np.ndarray) -> np.ndarray:
        return self.block[owner] * self.q + piece

    def template(self, n: int, owners: int, name: str) -> Collective:
        """The collective of the chunks of owners ``0 .. owners - 1`` alone, owner ``i``'s
        chunks numbered ``i * q + j``."""
        everyone = frozenset(range(n))
        mine = [frozenset({i}) for i in range(owners) for _ in range(self.q)]
        whole = [everyone] * (owners * self.q)
        pre, post = {"allgather": (mine, whole), "reduce_scatter": (whole, mine),
                     "allreduce": (whole, whole)}[self.kind]
        return Collective(f"{name}-template", n, tuple(pre), tuple(post),
                          combining=self.kind != "allgather", chunk_factor=self.q)


def _owners(collective: Collective, pieces: int) -> _Owners:
    """The owners of ``collective.split(pieces)``'s chunks; refuses any other collective than
    an unsplit allgather, reduce-scatter or allreduce shape (see :class:`_Owners`)."""
    n = collective.num_ranks
    pre, post = collective.precondition, collective.postcondition
    if collective.chunk_factor == 1:
        if collective.combining and collective.num_chunks == 1 and len(pre[0]) == n \
                and len(post[0]) == n and pieces % n == 0:
            every = np.arange(n, dtype=np.int64)
            return _Owners("allreduce", every, every, pieces // n)
        kind, single, full = (("reduce_scatter", post, pre) if collective.combining
                              else ("allgather", pre, post))
        if collective.num_chunks == n and all(len(s) == 1 for s in single) \
                and all(len(f) == n for f in full):
            owner = np.fromiter((next(iter(s)) for s in single), np.int64, count=n)
            if sorted(owner.tolist()) == list(range(n)):
                block = np.empty(n, dtype=np.int64)
                block[owner] = np.arange(n)
                return _Owners(kind, block, owner, pieces)
    raise VerificationError(f"{collective.describe()}: a symmetric schedule needs an unsplit "
                            "allgather, reduce-scatter or allreduce (every rank the owner of one "
                            "chunk; for allreduce, pieces a multiple of the ranks)")


def _link_class(shift: NodeShift, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """The class of link ``src -> dst``: ``local * n + d`` where the shift taking ``src`` into
    node 0 (as local rank ``local``) takes ``dst`` to ``d``."""
    per, n = shift.ranks_per_node, shift.num_ranks
    src = np.asarray(src, dtype=np.int64)
    return (src % per) * n + shift.shift(np.asarray(dst, dtype=np.int64), -(src // per))


class _ClassLoads:
    """The topology's link bandwidths and groups seen through the link classes: the load of a
    step from its template's class counts."""

    def __init__(self, topology: Topology, shift: NodeShift) -> None:
        n, per = topology.num_ranks, shift.ranks_per_node
        self.size = per * n
        capacity = link_capacity(topology)
        flat = np.flatnonzero(capacity.links)
        self.link_class = _link_class(shift, flat // n, flat % n)
        bandwidth = np.zeros(self.size, dtype=np.int64)
        bandwidth[self.link_class] = capacity.links[flat]
        self.bandwidth = bandwidth
        self.limits, self.labels = capacity.limits, capacity.labels
        self.groups = None
        if capacity.groups is not None:
            # groups x classes: how many links of each class a group covers
            where = np.full(n * n, -1, dtype=np.int64)
            where[flat] = self.link_class
            coo = capacity.groups.tocoo()
            keep = where[coo.col] >= 0
            self.groups = sp.csr_matrix((coo.data[keep], (coo.row[keep], where[coo.col[keep]])),
                                        shape=(coo.shape[0], self.size))

    def counts(self, shift: NodeShift, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
        return np.bincount(_link_class(shift, src, dst), minlength=self.size)

    def rounds(self, counts: np.ndarray) -> int:
        """The fewest whole rounds (at least 1) in which loads ``counts`` per class fit."""
        used = np.flatnonzero(counts)
        need = 1
        if len(used):
            if (self.bandwidth[used] == 0).any():
                return -1  # a send over a missing link: reported by the caller
            need = max(need, int((-(-counts[used] // self.bandwidth[used])).max()))
        if self.groups is not None:
            load = self.groups @ counts
            need = max(need, int((-(-load // self.limits)).max(initial=1)))
        return need


# -- building ----------------------------------------------------------------------------------


def symmetric_pipelined_schedule(topology: Topology, collective: Collective,
                                 packing: TreePacking, stages: int) -> SymmetricSchedule:
    """The template of :func:`~.pipeline.pipelined_algorithm`'s schedule for a packing made with
    a shift (``packing.shift``): the same pipeline, sends of node 0's roots only, each step
    priced for all the images at once. Not verified here (:func:`verify_symmetric`)."""
    shift = packing.shift
    if shift is None:
        raise VerificationError("a symmetric schedule needs a packing made with a node shift")
    k = packing.pieces_per_root
    factor = int(stages * k)
    owners = _owners(collective, factor)
    if owners.kind != "allgather":
        raise VerificationError(f"{collective.describe()}: the pipelined template is built for "
                                "allgather (reduce-scatter and allreduce: solve_symmetric)")
    stage_index = np.arange(stages, dtype=np.int64)
    parts = []
    for root, trees in packing.trees.items():
        expanded = [parent for parent, m in trees for _ in range(m)]
        for i, parent in enumerate(expanded):
            children = np.flatnonzero(parent >= 0)
            level = depths(parent)[children]
            shape = (stages, len(children))
            chunk = np.broadcast_to(owners.chunk(root, stage_index * k + i)[:, None], shape)
            step = stage_index[:, None] + level[None, :] - 1
            parts.append((chunk.ravel(), np.broadcast_to(parent[children], shape).ravel(),
                          np.broadcast_to(children, shape).ravel(), step.ravel()))
    chunk, src, dst, step = (np.concatenate([p[j] for p in parts]) for j in range(4))
    order = np.argsort(step, kind="stable")
    chunk, src, dst, step = chunk[order], src[order], dst[order], step[order]
    bounds = np.searchsorted(step, np.arange(int(step.max()) + 2))
    loads = _ClassLoads(topology, shift)
    steps = []
    for t in range(int(step.max()) + 1):
        lo, hi = bounds[t], bounds[t + 1]
        rounds = loads.rounds(loads.counts(shift, src[lo:hi], dst[lo:hi]))
        if rounds < 1:
            raise VerificationError(f"internal error: template step {t} uses a missing link")
        steps.append(Step(rounds, SendBlock(chunk[lo:hi], src[lo:hi].astype(np.int32),
                                            dst[lo:hi].astype(np.int32))))
    return SymmetricSchedule(topology, collective, shift, factor, tuple(steps), {
        "engine": "bandwidth-optimal trees (symmetric)",
        "pieces_per_root_per_stage": k, "stages": stages,
        "rounds_per_stage": packing.rounds_per_stage,
        "steady_state_rounds_per_chunk": str(Fraction(packing.rounds_per_stage, k))})


def _reduce_scatter_of(dual: SymmetricSchedule, topology: Topology) -> SymmetricSchedule:
    """The reduce-scatter on ``topology`` that is the allgather ``dual`` (on the reversed
    topology) read backwards: steps in reverse order, every send turned round into a reduce."""
    from collsynth.collective.standard import reduce_scatter

    steps = []
    for step in reversed(dual.steps):
        chunk, src, dst, _ = sends_as_arrays(step.sends)
        steps.append(Step(step.rounds, SendBlock(chunk, dst, src, np.ones(len(chunk), bool))))
    return SymmetricSchedule(topology, reduce_scatter(topology.num_ranks), dual.shift,
                             dual.pieces, tuple(steps), dict(dual.provenance))


def _refined(schedule: SymmetricSchedule, factor: int) -> tuple[Step, ...]:
    """The template's steps with every piece cut into ``factor`` (chunk ``b q + j`` becomes
    ``b q f + j f + s``), each step re-priced for its images."""
    if factor == 1:
        return schedule.steps
    q = _owners(schedule.collective, schedule.pieces).q
    loads = _ClassLoads(schedule.topology, schedule.shift)
    sub = np.arange(factor, dtype=np.int64)
    steps = []
    for step in schedule.steps:
        chunk, src, dst, red = sends_as_arrays(step.sends)
        chunk = np.asarray(chunk, dtype=np.int64)
        chunk = ((chunk // q * q * factor + chunk % q * factor)[:, None] + sub[None, :]).ravel()
        src, dst = np.repeat(src, factor), np.repeat(dst, factor)
        rounds = loads.rounds(loads.counts(schedule.shift, src, dst))
        steps.append(Step(rounds, SendBlock(chunk, src, dst, np.repeat(red, factor))))
    return tuple(steps)


def _allreduce_of(rs: SymmetricSchedule, ag: SymmetricSchedule) -> SymmetricSchedule:
    """Reduce-scatter then allgather, their pieces brought to a common count: allreduce chunk
    ``g q + j`` is piece ``j`` of rank ``g``'s part in both halves."""
    import math

    from collsynth.collective.standard import allreduce

    if rs.shift != ag.shift:
        raise VerificationError("the reduce-scatter and allgather halves use different shifts")
    common = math.lcm(rs.pieces, ag.pieces)
    n = rs.topology.num_ranks
    steps = _refined(rs, common // rs.pieces) + _refined(ag, common // ag.pieces)
    return SymmetricSchedule(rs.topology, allreduce(n), rs.shift, n * common, steps,
                             {"engine": "bandwidth-optimal trees (symmetric)",
                              "reduce_scatter": dict(rs.provenance),
                              "allgather": dict(ag.provenance)})


# -- verifying through the symmetry ------------------------------------------------------------


def _shift_problems(topology: Topology, shift: NodeShift) -> list[str]:
    """Why the shift is not an automorphism of ``topology`` (empty when it is)."""
    if shift.num_ranks != topology.num_ranks:
        return [f"the shift moves {shift.num_ranks} ranks; {topology.name} has "
                f"{topology.num_ranks}"]
    links = topology.link_array
    keys = {(g.sources, g.destinations, g.limit) for g in topology.groups}
    problems = []
    for by in shift.generators:
        perm = shift.permutation(by)
        if sorted(perm.tolist()) != list(range(topology.num_ranks)):
            return [f"shifting by {by} is not a permutation of the ranks"]
        inverse = np.argsort(perm)
        if not np.array_equal(links[np.ix_(inverse, inverse)], links):
            problems.append(f"shifting by {by} does not map the links of {topology.name} to "
                            "links of the same bandwidth")
            continue
        for group in topology.groups:
            moved = (frozenset(int(perm[s]) for s in group.sources),
                     frozenset(int(perm[d]) for d in group.destinations), group.limit)
            if moved not in keys:
                problems.append(f"shifting by {by} does not map {group.name or 'a group'} to a "
                                "group")
                break
    return problems


def symmetric_problems(schedule: SymmetricSchedule) -> list[str]:
    """Every reason ``schedule`` (expanded) would not implement its collective on its topology;
    empty when it does. Checking these makes the whole verified:

    1. the shift maps links to links of the same bandwidth and groups to groups (each generator
       checked on the topology), and the collective to itself (every rank is the root of exactly
       one chunk that every rank needs, so any rank permutation permutes the chunks);
    2. the template alone is replayed (:func:`~collsynth.algorithm.verify.find_problems` on the
       template's chunks): every template chunk reaches every rank, sent only by ranks holding
       it; an image of the template moves the image chunks the same way over existing links;
    3. the full load of every link in a step is the number of template sends in its *class* (its
       orbit under the shifts, which act freely on links): every class and every group (through
       the classes of its links) must fit the step's rounds.
    """
    topology, shift, factor = schedule.topology, schedule.shift, schedule.pieces
    try:
        owners = _owners(schedule.collective, factor)
    except VerificationError as exc:
        return [str(exc)]
    problems = _shift_problems(topology, shift)
    if problems:
        return problems
    per = shift.ranks_per_node
    q, total = owners.q, schedule.topology.num_ranks * owners.q
    # Template chunk numbering: owner i of node 0, piece j -> i * q + j.
    local_steps = []
    loads = _ClassLoads(topology, shift)
    for t, step in enumerate(schedule.steps):
        chunk, src, dst, red = sends_as_arrays(step.sends)
        chunk = np.asarray(chunk, dtype=np.int64)
        if len(chunk) and ((chunk < 0).any() or (chunk >= total).any()):
            return [f"template step {t}: a send names a chunk outside 0..{total - 1}"]
        root = owners.of(chunk) if len(chunk) else chunk
        if len(chunk) and (root >= per).any():
            c = int(chunk[np.flatnonzero(root >= per)[0]])
            problems.append(f"template step {t}: chunk {c} is not a piece of a root in node 0")
            continue
        src = np.asarray(src, dtype=np.int64)
        dst = np.asarray(dst, dtype=np.int64)
        if len(src) and ((src < 0) | (src >= topology.num_ranks) | (dst < 0)
                         | (dst >= topology.num_ranks)).any():
            problems.append(f"template step {t}: a send names a rank outside the topology")
            continue
        local_steps.append(Step(step.rounds, SendBlock(root * q + chunk % q, src, dst, red)))
        needed = loads.rounds(loads.counts(shift, src, dst))
        if needed < 0:
            problems.append(f"template step {t}: a send uses a link {topology.name} does not have")
        elif needed > step.rounds:
            problems.append(f"template step {t}: its images together need {needed} rounds, the "
                            f"step lasts {step.rounds}")
    if problems:
        return problems
    template = owners.template(topology.num_ranks, per, schedule.collective.name)
    replay = Algorithm("template", topology, template, tuple(local_steps))
    return [f"template: {p}" for p in find_problems(replay)]


def verify_symmetric(schedule: SymmetricSchedule) -> SymmetricSchedule:
    """``schedule`` if :func:`symmetric_problems` finds nothing.

    Raises
    ------
    VerificationError
        With the first problems found.
    """
    problems = symmetric_problems(schedule)
    if problems:
        more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
        raise VerificationError(f"symmetric schedule on {schedule.topology.name}: "
                                + "; ".join(problems[:3]) + more)
    return schedule


def expand(schedule: SymmetricSchedule, *, name: str | None = None) -> Algorithm:
    """The full algorithm: the template and its ``shift.nodes`` images, on
    ``collective.split(pieces)``. Not verified here (verify it, or trust
    :func:`verify_symmetric`, which proves the same)."""
    shift, factor = schedule.shift, schedule.pieces
    owners = _owners(schedule.collective, factor)
    images = np.arange(shift.nodes, dtype=np.int64)[:, None]
    steps = []
    for step in schedule.steps:
        chunk, src, dst, red = sends_as_arrays(step.sends)
        chunk = np.asarray(chunk, dtype=np.int64)
        moved_root = shift.shift(owners.of(chunk)[None, :], images)
        moved_chunk = owners.chunk(moved_root, (chunk % owners.q)[None, :])
        moved_src = shift.shift(np.asarray(src, np.int64)[None, :], images)
        moved_dst = shift.shift(np.asarray(dst, np.int64)[None, :], images)
        steps.append(Step(step.rounds, SendBlock(moved_chunk.ravel(),
                                                 moved_src.ravel().astype(np.int32),
                                                 moved_dst.ravel().astype(np.int32),
                                                 np.tile(np.asarray(red, bool), shift.nodes))))
    collective = schedule.collective.split(factor)
    label = name or (f"{collective.name}-{schedule.topology.name}-trees-s{len(steps)}"
                     f"-r{schedule.num_rounds}-c{factor}")
    return Algorithm(label, schedule.topology, collective, tuple(steps),
                     provenance=dict(schedule.provenance))


# -- end to end --------------------------------------------------------------------------------


def solve_symmetric(topology: Topology, collective: Collective, *, stages: int | None = None,
                    time_limit: float = 600.0, progress=None) -> SymmetricSchedule:
    """The tree engine's allgather as a compact, verified :class:`SymmetricSchedule`: the
    optimal throughput, trees for node 0's roots, the template of the pipelined schedule, and
    :func:`verify_symmetric`. Without expanded sends the pipeline can have as many stages as
    the template allows (``MAX_SENDS`` template sends), so it gets close to its steady state
    at thousands of ranks.

    ``provenance`` records the ``lower_bound``, the ``steady_state_rounds_per_chunk``,
    ``optimal`` and the ``timings`` (seconds per phase).

    Raises
    ------
    VerificationError
        When the topology has no node shift or translations (:func:`~.packing.pack_trees`
        found none) or the collective is not allgather-shaped.
    """
    import time

    from collsynth.bounds.throughput import optimal_throughput
    from collsynth.graph.translations import node_translations
    from collsynth.synthesis.bandwidth_optimal.packing import PackingOptions, pack_trees
    from collsynth.synthesis.bandwidth_optimal.pipeline import MAX_SENDS

    say = progress or (lambda line: None)
    started = time.perf_counter()
    kind = _owners(collective, collective.num_ranks).kind
    if kind != "allgather":
        from collsynth.collective.standard import allgather, reduce_scatter

        n = topology.num_ranks
        if kind == "reduce_scatter":
            say("reduce-scatter: the allgather of the reversed topology, read backwards")
            dual = solve_symmetric(topology.reversed(), allgather(n), stages=stages,
                                   time_limit=time_limit, progress=progress)
            schedule = verify_symmetric(_reduce_scatter_of(dual, topology))
            schedule.provenance["timings"] = dict(dual.provenance["timings"],
                                                  total=time.perf_counter() - started)
            schedule.provenance["stopped_by"] = dual.provenance.get("stopped_by")
            return schedule
        say("allreduce = reduce-scatter + allgather")
        rs = solve_symmetric(topology, reduce_scatter(n), stages=stages,
                             time_limit=time_limit / 2, progress=progress)
        ag = solve_symmetric(topology, allgather(n), stages=stages,
                             time_limit=time_limit - (time.perf_counter() - started),
                             progress=progress)
        tick = time.perf_counter()
        schedule = verify_symmetric(_allreduce_of(rs, ag))
        bound = (Fraction(rs.provenance["lower_bound"])
                 + Fraction(ag.provenance["lower_bound"])) / n
        steady = (Fraction(rs.provenance["steady_state_rounds_per_chunk"])
                  + Fraction(ag.provenance["steady_state_rounds_per_chunk"])) / n
        schedule.provenance.update(
            lower_bound=str(bound), steady_state_rounds_per_chunk=str(steady),
            optimal=steady == bound,
            stopped_by=None if steady <= bound else (rs.provenance.get("stopped_by")
                                                     or ag.provenance.get("stopped_by")),
            timings={"reduce_scatter": rs.provenance["timings"]["total"],
                     "allgather": ag.provenance["timings"]["total"],
                     "compose_and_verify": time.perf_counter() - tick,
                     "total": time.perf_counter() - started})
        return schedule
    timings = {}
    tick = time.perf_counter()
    bound = optimal_throughput(topology, collective).rounds_per_chunk
    timings["bound"] = time.perf_counter() - tick
    say(f"optimal throughput: {bound} rounds per chunk ({timings['bound']:.2f} s)")
    tick = time.perf_counter()
    # Ranks alike within their nodes: one root stands for all (the template is one rank's).
    symmetry = node_translations(topology, deadline=started + time_limit)
    timings["symmetry"] = time.perf_counter() - tick
    tick = time.perf_counter()
    # Only the template is stored: a stage may have as many pieces per root as keep one
    # stage's template within MAX_SENDS (an exact optimum may need 19 where 16 was the cap).
    layout = topology.layout
    per = layout.ranks_per_node if layout is not None and layout.multi_node and \
        symmetry is None else 1
    most = max(16, min(4096, MAX_SENDS // (per * max(1, topology.num_ranks - 1))))
    packing = pack_trees(topology, list(range(topology.num_ranks)), target=bound,
                         options=PackingOptions(time_limit=max(0.0, time_limit - tick + started),
                                                max_trees_per_root=most, symmetry=symmetry,
                                                progress=progress))
    timings["packing"] = time.perf_counter() - tick
    if packing.shift is None:
        raise VerificationError(f"{topology.name}: no node shift or translations, so no "
                                "symmetric schedule")
    steady = packing.steady_state_rounds_per_chunk
    say(f"trees: {steady} rounds per chunk in the steady state, {packing.pieces_per_root} pieces "
        f"per root, depth {packing.depth} ({timings['packing']:.2f} s)")
    if stages is None:
        per_stage = packing.pieces_per_root * packing.shift.ranks_per_node \
            * (topology.num_ranks - 1)
        stages = max(1, min(16 * (packing.depth - 1), MAX_SENDS // max(per_stage, 1)))
    tick = time.perf_counter()
    schedule = symmetric_pipelined_schedule(topology, collective, packing, stages)
    timings["schedule"] = time.perf_counter() - tick
    say(f"template: {schedule.num_steps} steps, {schedule.template_sends} sends of "
        f"{schedule.num_sends} ({timings['schedule']:.2f} s)")
    tick = time.perf_counter()
    verify_symmetric(schedule)
    timings["verify"] = time.perf_counter() - tick
    say(f"verified through the symmetry ({timings['verify']:.2f} s)")
    timings["total"] = time.perf_counter() - started
    schedule.provenance.update(lower_bound=str(bound), steady_state_rounds_per_chunk=str(steady),
                               optimal=steady == bound, timings=timings,
                               stopped_by=None if steady <= bound
                               else packing.stats.get("stopped_by"))
    return schedule
