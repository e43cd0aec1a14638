"""Fewer pipeline stages for export: delay sends so that those of several waves travel together.

A chunk's *wave* is how many steps later than its earliest possible step its first send is (a
pipelined schedule sends stage ``p`` in wave ``p``). :func:`coarsen` merges consecutive waves
into one, :func:`sort_pieces` numbers the pieces sent together consecutively, and
:func:`join_pieces` makes pieces always sent together one piece, so the lowering merges their
messages into ``cnt > 1`` steps; :func:`restage` does all three. The rules, and why they keep
the schedule correct and free of cycles, are in docs/export.md ("Restaging").
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from collsynth.algorithm.arrays import SendBlock
from collsynth.algorithm.model import Algorithm, Step
from collsynth.algorithm.verify import verify
from collsynth.errors import ExportError
from collsynth.topology.capacity import link_capacity

__all__ = ["waves", "coarsen", "sort_pieces", "join_pieces", "restage", "stage_choices"]


def waves(algorithm: Algorithm) -> int:
    """The number of waves of ``algorithm``: one more than the largest delay of a send past its
    earliest possible step (1 for a schedule that sends everything as early as it can; ``P`` for a
    ``P``-stage pipeline).

    >>> from collsynth.algorithm import Algorithm, Send, Step
    >>> from collsynth.collective import broadcast
    >>> from collsynth.topology import get_topology
    >>> chain = get_topology("line:3")
    >>> piped = Algorithm("b", chain, broadcast(3, 0).split(2),   # two pieces down 0 -> 1 -> 2
    ...                   (Step(1, (Send(0, 0, 1),)), Step(1, (Send(1, 0, 1), Send(0, 1, 2))),
    ...                    Step(1, (Send(1, 1, 2),))))
    >>> waves(piped)
    2
    """
    graph = _Graph.of(algorithm)
    if graph is None:
        return 1
    return int(graph.chunk_wave(graph.earliest()).max()) + 1


def stage_choices(algorithm: Algorithm) -> tuple[int, ...]:
    """The stage counts the export tries, most first: the algorithm's waves ``W``, then
    ``ceil(W / 2)``, ``ceil(W / 4)``, ..., 1.

    >>> from collsynth.algorithm import Algorithm, Send, Step
    >>> from collsynth.collective import broadcast
    >>> from collsynth.topology import get_topology
    >>> n, P = 4, 6   # six pieces pipelined down a chain of four ranks
    >>> steps = tuple(Step(1, tuple(Send(p, t - p, t - p + 1) for p in range(P)
    ...                             if 0 <= t - p < n - 1)) for t in range(P + n - 2))
    >>> stage_choices(Algorithm("b", get_topology(f"line:{n}"), broadcast(n, 0).split(P), steps))
    (6, 3, 2, 1)
    """
    count = waves(algorithm)
    choices = [count]
    while choices[-1] > 1:
        per_stage = 2 * -(-count // choices[-1])
        choices.append(-(-count // per_stage))
    return tuple(dict.fromkeys(choices))


def restage(algorithm: Algorithm, stages: int) -> Algorithm:
    """``algorithm`` made ready to lower in ``stages`` stages: :func:`coarsen`, then
    :func:`sort_pieces`, then :func:`join_pieces`; each result is verified. With ``stages`` at
    least :func:`waves`, the schedule keeps its timing and only its pieces are renumbered and
    joined."""
    return join_pieces(sort_pieces(coarsen(algorithm, stages)))


def coarsen(algorithm: Algorithm, stages: int) -> Algorithm:
    """``algorithm`` with its waves merged into ``stages`` groups of consecutive waves, verified.

    Sends on one connection, at the same earliest step and in waves of one group, are given one
    step: the latest step any of them had, or later where what they depend on was delayed. So
    the lowering sends them as one message (when their slots are consecutive). Nothing is
    reordered: every send still reads the value it read, and every reduction adds what it added.
    With ``stages >= waves(algorithm)`` the algorithm is returned unchanged.

    Raises
    ------
    ExportError
        ``stages`` is not a whole number >= 1.
    VerificationError
        Never for a correct ``algorithm`` (the result is verified before it is returned).

    Examples
    --------
    Two pieces pipelined down a chain, coarsened to one stage: both pieces cross each link
    together.

    >>> from collsynth.algorithm import Algorithm, Send, Step
    >>> from collsynth.collective import broadcast
    >>> from collsynth.topology import get_topology
    >>> piped = Algorithm("b", get_topology("line:3"), broadcast(3, 0).split(2),
    ...                   (Step(1, (Send(0, 0, 1),)), Step(1, (Send(1, 0, 1), Send(0, 1, 2))),
    ...                    Step(1, (Send(1, 1, 2),))))
    >>> one = coarsen(piped, 1)
    >>> [[(s.chunk, s.src, s.dst) for s in step.sends] for step in one.steps]
    [[(0, 0, 1), (1, 0, 1)], [(0, 1, 2), (1, 1, 2)]]
    >>> [step.rounds for step in one.steps]
    [2, 2]
    """
    if not isinstance(stages, int) or isinstance(stages, bool) or stages < 1:
        raise ExportError(f"stages = {stages!r}; expected a whole number >= 1")
    graph = _Graph.of(algorithm)
    if graph is None:
        return algorithm
    earliest = graph.earliest()
    wave = graph.chunk_wave(earliest)
    count = int(wave.max()) + 1
    if stages >= count:
        return algorithm
    per_stage = -(-count // stages)
    stage = wave // per_stage
    n = algorithm.topology.num_ranks
    top = int(earliest.max()) + 1
    key = ((graph.src * n + graph.dst) * top + earliest) * stages + stage
    _, node = np.unique(key, return_inverse=True)
    step = graph.delayed(node, stage + earliest)
    order = np.lexsort((np.arange(len(step)), step))
    step = step[order]
    bounds = np.flatnonzero(np.r_[True, step[1:] != step[:-1], True])
    capacity = link_capacity(algorithm.topology)
    steps = []
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        picked = order[lo:hi]
        src, dst = graph.src[picked], graph.dst[picked]
        steps.append(Step(capacity.rounds(src, dst),
                          SendBlock(graph.chunk[picked], src, dst, graph.reduce[picked])))
    provenance = {**dict(algorithm.provenance), "coarsened": {"waves": count, "stages": stages}}
    return verify(Algorithm(algorithm.name, algorithm.topology, algorithm.collective,
                            tuple(steps), provenance=provenance))


def sort_pieces(algorithm: Algorithm) -> Algorithm:
    """``algorithm`` with the pieces of every base chunk renumbered so that pieces sent together
    (by the same sends, in the same steps) are consecutive, verified.

    The pieces of one base chunk start and end on the same ranks, so any renumbering of them is
    the same collective; consecutive pieces sit in consecutive buffer slots, and only messages of
    consecutive slots merge into one ``cnt > 1`` step. Pieces are ordered by their sends (step,
    sender, receiver), then by their old number; a base chunk whose pieces differ in their
    conditions is left as it is. Returns ``algorithm`` itself when nothing moves.

    >>> from collsynth.algorithm import Algorithm, Send, Step
    >>> from collsynth.collective import broadcast
    >>> from collsynth.topology import get_topology
    >>> split = Algorithm("b", get_topology("line:3"), broadcast(3, 1).split(3),
    ...                   (Step(2, (Send(0, 1, 0), Send(1, 1, 2), Send(2, 1, 0))),
    ...                    Step(2, (Send(0, 1, 2), Send(1, 1, 0), Send(2, 1, 2)))))
    >>> [[(s.chunk, s.src, s.dst) for s in step.sends] for step in sort_pieces(split).steps]
    [[(0, 1, 0), (2, 1, 2), (1, 1, 0)], [(0, 1, 2), (2, 1, 0), (1, 1, 2)]]
    """
    graph = _Graph.of(algorithm)
    collective = algorithm.collective
    factor = collective.chunk_factor
    if graph is None or factor == 1:
        return algorithm
    order = np.lexsort((graph.dst, graph.src, graph.t, graph.chunk))
    columns = np.stack((graph.t[order], graph.src[order], graph.dst[order]), axis=1)
    signature_bytes = columns.astype(">i8")
    bounds = np.searchsorted(graph.chunk[order], np.arange(collective.num_chunks + 1))
    mapping = np.arange(collective.num_chunks, dtype=np.int64)
    for base in range(collective.num_chunks // factor):
        pieces = range(base * factor, (base + 1) * factor)
        first = pieces[0]
        if any(collective.precondition[c] != collective.precondition[first]
               or collective.postcondition[c] != collective.postcondition[first]
               for c in pieces):
            continue
        ranked = sorted(pieces, key=lambda c: (signature_bytes[bounds[c]:bounds[c + 1]]
                                               .tobytes(), c))
        mapping[ranked] = np.arange(first, first + factor)
    if np.array_equal(mapping, np.arange(collective.num_chunks)):
        return algorithm
    steps = []
    for step in algorithm.steps:
        chunk, src, dst, red = _columns(step.sends)
        steps.append(Step(step.rounds, SendBlock(mapping[chunk], src, dst, red)))
    provenance = {**dict(algorithm.provenance), "pieces_sorted": True}
    return verify(Algorithm(algorithm.name, algorithm.topology, collective, tuple(steps),
                            provenance=provenance))


def join_pieces(algorithm: Algorithm) -> Algorithm:
    """``algorithm`` on fewer, larger pieces: the largest ``g`` dividing the chunk factor such
    that every ``g`` consecutive pieces of a base chunk (``g``-aligned) are sent by the same sends
    in the same steps becomes one piece, verified. Returns ``algorithm`` itself when ``g = 1``.

    Fewer pieces mean fewer chunks per loop (``nchunksperloop``: the runtimes select a program
    only for buffers of a multiple of it) and fewer steps where messages were longer than one step
    may carry. Step rounds are recomputed for the larger pieces.

    >>> from collsynth.algorithm import Algorithm, Send, Step
    >>> from collsynth.collective import broadcast
    >>> from collsynth.topology import get_topology
    >>> twice = Algorithm("b", get_topology("line:3"), broadcast(3, 0).split(2),
    ...                   (Step(2, (Send(0, 0, 1), Send(1, 0, 1))),
    ...                    Step(2, (Send(0, 1, 2), Send(1, 1, 2)))))
    >>> joined = join_pieces(twice)
    >>> joined.collective.chunk_factor, [[(s.chunk, s.src, s.dst) for s in step.sends]
    ...                                  for step in joined.steps]
    (1, [[(0, 0, 1)], [(0, 1, 2)]])
    """
    graph = _Graph.of(algorithm)
    collective = algorithm.collective
    factor = collective.chunk_factor
    if graph is None or factor == 1:
        return algorithm
    order = np.lexsort((graph.reduce, graph.dst, graph.src, graph.t, graph.chunk))
    columns = np.stack((graph.t[order], graph.src[order], graph.dst[order],
                        graph.reduce[order].astype(np.int64)), axis=1).astype(">i8")
    bounds = np.searchsorted(graph.chunk[order], np.arange(collective.num_chunks + 1))
    ids: dict[tuple, int] = {}
    signature = np.array([ids.setdefault((columns[bounds[c]:bounds[c + 1]].tobytes(),
                                          collective.precondition[c],
                                          collective.postcondition[c]), len(ids))
                          for c in range(collective.num_chunks)], np.int64)
    joined = 1
    for g in sorted((g for g in range(2, factor + 1) if factor % g == 0), reverse=True):
        blocks = signature.reshape(-1, g)
        if (blocks == blocks[:, :1]).all():
            joined = g
            break
    if joined == 1:
        return algorithm
    base = type(collective)(
        name=collective.name, num_ranks=collective.num_ranks,
        precondition=collective.precondition[::joined],
        postcondition=collective.postcondition[::joined], combining=collective.combining,
        chunk_factor=factor // joined, roots=collective.roots, metadata=collective.metadata)
    capacity = link_capacity(algorithm.topology)
    steps = []
    for step in algorithm.steps:
        chunk, src, dst, red = _columns(step.sends)
        kept = chunk % joined == 0
        if kept.any():
            steps.append(Step(capacity.rounds(src[kept], dst[kept]),
                              SendBlock(chunk[kept] // joined, src[kept], dst[kept], red[kept])))
    provenance = {**dict(algorithm.provenance), "pieces_joined": joined}
    return verify(Algorithm(algorithm.name, algorithm.topology, base, tuple(steps),
                            provenance=provenance))


# -- the order the sends must keep -------------------------------------------------------------


def _columns(sends) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    if isinstance(sends, SendBlock):
        return (sends.chunk.astype(np.int64), sends.src.astype(np.int64),
                sends.dst.astype(np.int64), sends.reduce.astype(bool))
    rows = [(x.chunk, x.src, x.dst, bool(x.reduce)) for x in sends]
    if not rows:
        empty = np.zeros(0, np.int64)
        return empty, empty, empty, np.zeros(0, bool)
    chunk, src, dst, red = zip(*rows)
    return (np.array(chunk, np.int64), np.array(src, np.int64), np.array(dst, np.int64),
            np.array(red, bool))


@dataclass(frozen=True)
class _Scan:
    """'The largest value, over the events of one class that come strictly earlier at the same
    (rank, chunk)', for every event, as array operations over the events sorted once."""

    starts: np.ndarray      # first event of every (rank, chunk, time) group, sorted order
    group_of: np.ndarray    # per event (sorted order): its group
    same_key: np.ndarray    # per group: the previous group is of the same (rank, chunk)
    offset: np.ndarray      # per group: its (rank, chunk) segment times a large number
    big: int

    def earlier_max(self, values: np.ndarray) -> np.ndarray:
        """``values`` per event (sorted order, -1 where the event is not of the class): per
        event, the largest value of a strictly earlier group of its (rank, chunk), or -1."""
        per_group = np.maximum.reduceat(values, self.starts)
        shifted = np.full(len(per_group), -1, np.int64)
        shifted[1:] = per_group[:-1]
        shifted[~self.same_key] = -1
        running = np.maximum.accumulate(shifted + 1 + self.offset) - self.offset - 1
        return running[self.group_of]


@dataclass(frozen=True)
class _Graph:
    """The sends of an algorithm and the order between them that any retiming must keep.

    At every (rank, chunk), events are the rank's sends of the chunk (reads, at ``2t``) and its
    receipts (writes, at ``2t + 1``). A send comes at least one step after every earlier
    receipt (it forwards what arrived); a receipt comes no earlier than every send before it (it
    must not change what they read); a copy receipt and any other receipt keep their order (the
    copy overwrites). Time ``t`` itself satisfies all three.
    """

    t: np.ndarray
    chunk: np.ndarray
    src: np.ndarray
    dst: np.ndarray
    reduce: np.ndarray
    scan: _Scan
    sorted_send: np.ndarray   # per event, sorted order: its send
    is_read: np.ndarray       # per event: a send event (else a receipt)
    is_copy: np.ndarray       # per event: a copy receipt
    read_event: np.ndarray    # per send: its send event's position in sorted order
    write_event: np.ndarray   # per send: its receipt event's position

    @staticmethod
    def of(algorithm: Algorithm) -> "_Graph | None":
        parts = [(_columns(step.sends), t) for t, step in enumerate(algorithm.steps)]
        if not any(len(columns[0]) for columns, _ in parts):
            return None
        chunk, src, dst, red = (np.concatenate([columns[i] for columns, _ in parts])
                                for i in range(4))
        t = np.concatenate([np.full(len(columns[0]), t, np.int64) for columns, t in parts])
        count = len(t)
        num_chunks = algorithm.collective.num_chunks
        key = np.concatenate((src * num_chunks + chunk, dst * num_chunks + chunk))
        position = np.concatenate((2 * t, 2 * t + 1))
        order = np.lexsort((position, key))
        key, position = key[order], position[order]
        new_group = np.r_[True, (key[1:] != key[:-1]) | (position[1:] != position[:-1])]
        starts = np.flatnonzero(new_group)
        group_of = np.cumsum(new_group) - 1
        group_key = key[starts]
        same_key = np.r_[False, group_key[1:] == group_key[:-1]]
        segment = np.cumsum(~same_key) - 1
        big = 1 << 31
        sends = np.arange(count)
        event_send = np.concatenate((sends, sends))[order]
        is_read = order < count
        inverse = np.empty(2 * count, np.int64)
        inverse[order] = np.arange(2 * count)
        return _Graph(t, chunk, src, dst, red,
                      _Scan(starts, group_of, same_key, segment * big, big), event_send,
                      is_read, ~is_read & ~red[event_send], inverse[:count], inverse[count:])

    def bounds(self, value: np.ndarray) -> np.ndarray:
        """Per send, the least step the order allows given ``value`` (a step per send)."""
        at = value[self.sorted_send]
        receipts = np.where(self.is_read, -1, at)
        after_receipt = self.scan.earlier_max(receipts) + 1        # sends and copy receipts
        after_send = self.scan.earlier_max(np.where(self.is_read, at, -1))
        after_copy = self.scan.earlier_max(np.where(self.is_copy, at, -1)) + 1
        write_bound = np.maximum(after_send, after_copy)
        write_bound = np.where(self.is_copy, np.maximum(write_bound, after_receipt), write_bound)
        return np.maximum(after_receipt[self.read_event], write_bound[self.write_event])

    def chunk_wave(self, earliest: np.ndarray) -> np.ndarray:
        """Per send, the wave of its chunk: the least delay of one of the chunk's sends past
        its earliest step, less the least such delay among the chunks of its *route* (the same
        sends, sender, receiver and earliest step, at any time). A pipeline sends its stage
        ``p`` in wave ``p`` whatever the route, also where a route is late by a fixed number of
        steps (a reversed pipeline's one-hop pieces)."""
        chunks = int(self.chunk.max()) + 1
        least = np.full(chunks, np.iinfo(np.int64).max, np.int64)
        np.minimum.at(least, self.chunk, self.t - earliest)
        order = np.lexsort((earliest, self.dst, self.src, self.chunk))
        routes = np.stack((self.src[order], self.dst[order], earliest[order]), axis=1)
        bounds = np.searchsorted(self.chunk[order], np.arange(chunks + 1))
        ids: dict[bytes, int] = {}
        route = np.array([ids.setdefault(routes[bounds[c]:bounds[c + 1]].tobytes(), len(ids))
                          for c in range(chunks)], np.int64)
        first = np.full(len(ids), np.iinfo(np.int64).max, np.int64)
        sent = bounds[1:] > bounds[:-1]
        np.minimum.at(first, route[sent], least[sent])
        return (least - first[route])[self.chunk]

    def earliest(self) -> np.ndarray:
        """Per send, its earliest step under the order (every send as early as it can go)."""
        value = np.zeros(len(self.t), np.int64)
        for _ in range(int(self.t.max()) + 2):
            new = np.maximum(value, self.bounds(value))
            if np.array_equal(new, value):
                return value
            value = new
        raise ExportError("internal: the algorithm's sends are not in a consistent order")

    def delayed(self, node: np.ndarray, wanted: np.ndarray) -> np.ndarray:
        """Per send, the step of its group (``node``): the latest step ``wanted`` by a member,
        or later where the order requires it."""
        step = np.zeros(int(node.max()) + 1, np.int64)
        np.maximum.at(step, node, wanted)
        for _ in range(4 * (int(self.t.max()) + 2) + len(step)):
            value = step[node]
            new = step.copy()
            np.maximum.at(new, node, self.bounds(value))
            if np.array_equal(new, step):
                return value
            step = new
        raise ExportError("internal: merged sends would wait for each other")
