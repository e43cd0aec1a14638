"""Replay an algorithm and prove it implements its collective on its topology.

The replay tracks, for every (rank, chunk), the *set of contributions* the rank's buffer holds:
for a non-combining chunk the single token of the whole chunk; for a combining chunk the ranks
whose contributions have been added in. It checks, step by step:

* every step lasts a whole number of rounds >= 1;
* every send uses a link that exists, from a rank that holds a value of that chunk;
* per link, at most ``bandwidth * rounds`` sends; per bandwidth group, at most ``limit * rounds``;
* a reduce only on a combining collective, and never adds a contribution the receiver already
  has (no contribution is counted twice), also among several reduces arriving in one step;
* a copy is the only send into that (rank, chunk) in its step;
* optionally, at most ``extra_memory`` scratch chunks per rank at any time;

and at the end, that every rank in a chunk's postcondition holds its complete value, each
contribution exactly once. Nothing a solver returns leaves collsynth without passing this.
"""

from __future__ import annotations

from collections import Counter, defaultdict

from collsynth.algorithm.model import Algorithm
from collsynth.errors import VerificationError

__all__ = ["find_problems", "verify"]

#: The value of a whole non-combining chunk.
_WHOLE = frozenset({-1})
#: How many problems a VerificationError message lists before "and N more".
_SHOWN = 5


def find_problems(algorithm: Algorithm, *, extra_memory: int | None = None,
                  limit: int = 100) -> list[str]:
    """Every way ``algorithm`` fails (at most ``limit`` of them); an empty list means correct."""
    topology, collective = algorithm.topology, algorithm.collective
    n, num_chunks = topology.num_ranks, collective.num_chunks
    problems: list[str] = []

    def report(message: str) -> bool:
        problems.append(message)
        return len(problems) >= limit

    if collective.num_ranks != n:
        return [f"collective has {collective.num_ranks} ranks but topology {topology.name!r} "
                f"has {n}"]

    full = [frozenset(pre) if collective.combining else _WHOLE for pre in collective.precondition]
    # value[c][r]: contributions rank r holds for chunk c (missing key: nothing).
    value: list[dict[int, frozenset[int]]] = [
        {r: (frozenset({r}) if collective.combining else _WHOLE) for r in pre}
        for pre in collective.precondition
    ]
    if extra_memory is not None and _scratch_peak(collective, value) > extra_memory:
        report(f"the precondition already exceeds extra_memory={extra_memory}")

    for t, step in enumerate(algorithm.steps):
        where = f"step {t}"
        if not isinstance(step.rounds, int) or step.rounds < 1:
            if report(f"{where}: rounds = {step.rounds!r}; every step lasts at least one round"):
                return problems
            continue
        per_link: Counter[tuple[int, int]] = Counter()
        incoming: dict[tuple[int, int], list] = defaultdict(list)
        for send in step.sends:
            c, s, d = send.chunk, send.src, send.dst
            if not (0 <= c < num_chunks and 0 <= s < n and 0 <= d < n):
                if report(f"{where}: send {send} names a chunk or rank out of range"):
                    return problems
                continue
            if topology.links[s][d] == 0:
                if report(f"{where}: rank {s} sends chunk {c} to rank {d} but there is no link "
                          f"{s}->{d}"):
                    return problems
            per_link[(s, d)] += 1
            if s not in value[c]:
                if report(f"{where}: rank {s} sends chunk {c} it does not hold"):
                    return problems
                continue
            if send.reduce and not collective.combining:
                if report(f"{where}: rank {s} reduces chunk {c} into rank {d}, but "
                          f"{collective.name} is not a combining collective"):
                    return problems
            incoming[(d, c)].append(send)
        for (s, d), count in per_link.items():
            capacity = topology.links[s][d] * step.rounds
            if capacity and count > capacity:
                if report(f"{where}: link {s}->{d} carries {count} chunks but its bandwidth "
                          f"{topology.links[s][d]} x {step.rounds} rounds allows {capacity}"):
                    return problems
        for group, covered in topology.effective_groups:
            used = sum(per_link.get(link, 0) for link in covered)
            if used > group.limit * step.rounds:
                label = group.name or "bandwidth group"
                if report(f"{where}: {label} carries {used} chunks but its limit {group.limit} x "
                          f"{step.rounds} rounds allows {group.limit * step.rounds}"):
                    return problems
        # Apply all sends at once, each reading the values from the end of the previous step.
        updates: list[tuple[int, int, frozenset[int]]] = []
        for (d, c), sends in incoming.items():
            copies = [x for x in sends if not x.reduce]
            if copies and len(sends) > 1:
                if report(f"{where}: rank {d} receives chunk {c} {len(sends)} times and at least "
                          "one is a copy, so the result depends on their order"):
                    return problems
                continue
            if copies:
                updates.append((d, c, value[c][copies[0].src]))
                continue
            accumulated = value[c].get(d, frozenset())
            for x in sends:
                incoming_value = value[c][x.src]
                twice = accumulated & incoming_value
                if twice:
                    if report(f"{where}: rank {x.src} reduces chunk {c} into rank {d}, which would "
                              f"count the contribution(s) of rank(s) {sorted(twice)} twice"):
                        return problems
                accumulated = accumulated | incoming_value
            updates.append((d, c, accumulated))
        for d, c, new in updates:
            value[c][d] = new
        if extra_memory is not None:
            peak = _scratch_peak(collective, value)
            if peak > extra_memory:
                if report(f"{where}: a rank holds {peak} scratch chunks, more than "
                          f"extra_memory={extra_memory}"):
                    return problems

    for c, post in enumerate(collective.postcondition):
        for r in sorted(post):
            held = value[c].get(r)
            if held is None:
                message = f"rank {r} never receives chunk {c}"
            elif held != full[c]:
                missing = sorted(full[c] - held)
                message = (f"rank {r} ends with an incomplete chunk {c}: missing the contribution(s)"
                           f" of rank(s) {missing}")
            else:
                continue
            if report(message):
                return problems
    return problems


def verify(algorithm: Algorithm, *, extra_memory: int | None = None) -> Algorithm:
    """Raise :class:`VerificationError` unless ``algorithm`` implements its collective; return it.

    >>> from collsynth.algorithm import Algorithm, Send, Step
    >>> from collsynth.collective import broadcast
    >>> from collsynth.topology import get_topology
    >>> ring = get_topology("ring:3")
    >>> good = Algorithm("bcast", ring, broadcast(3, 0),
    ...                  (Step(1, (Send(0, 0, 1), Send(0, 0, 2))),))
    >>> verify(good).num_steps
    1
    >>> bad = Algorithm("bcast", ring, broadcast(3, 0), (Step(1, (Send(0, 0, 1),)),))
    >>> verify(bad)
    Traceback (most recent call last):
    ...
    collsynth.errors.VerificationError: algorithm 'bcast' is not a correct broadcast(n=3, root=0) on ring:3: rank 2 never receives chunk 0
    """
    problems = find_problems(algorithm, extra_memory=extra_memory)
    if problems:
        shown = "; ".join(problems[:_SHOWN])
        more = f"; and {len(problems) - _SHOWN} more" if len(problems) > _SHOWN else ""
        raise VerificationError(
            f"algorithm {algorithm.name!r} is not a correct {algorithm.collective.describe()} on "
            f"{algorithm.topology.name}: {shown}{more}"
        )
    return algorithm


def _scratch_peak(collective, value) -> int:
    """Most chunks any rank holds outside its pre- and postcondition."""
    counts: Counter[int] = Counter()
    for c, holders in enumerate(value):
        keep = collective.precondition[c] | collective.postcondition[c]
        for r in holders:
            if r not in keep:
                counts[r] += 1
    return max(counts.values(), default=0)
