"""Replay an algorithm and prove it implements its collective on its topology.

The details (formats, conventions, rules) are in docs/verification.md.
"""

from __future__ import annotations

import logging
from collections import Counter, defaultdict
from typing import Iterator

import numpy as np

from collsynth.algorithm.arrays import SendBlock, sends_as_arrays
from collsynth.algorithm.model import Algorithm, Send
from collsynth.errors import InvalidInstanceError, VerificationError, expect_type
from collsynth.topology.capacity import link_capacity

__all__ = ["find_problems", "verify"]

_log = logging.getLogger(__name__)

#: The value of a whole non-combining chunk.
_WHOLE = frozenset({-1})
#: How many problems a VerificationError message lists before "and N more".
_SHOWN = 5
#: Longest list of ranks a message spells out in full.
_RANKS_SHOWN = 16
#: Above this many sends (or with any SendBlock step) "auto" uses the vectorised replay.
_LARGE_SENDS = 20_000
#: The ways :func:`find_problems` can check.
_METHODS = ("auto", "replay", "vectorised")
#: Bytes of (chunk, rank) state the vectorised replay keeps at once (it batches chunks to fit).
_STATE_BYTES = 64 << 20
#: Bytes of per-send temporaries the vectorised replay allocates at once.
_PIECE_BYTES = 64 << 20
#: Sends whose link indices are computed at once.
_SLICE = 1 << 22
#: Largest ``ranks ** 2`` for which per-link loads are counted in a dense vector.
_DENSE_LINKS = 1 << 22


def find_problems(algorithm: Algorithm, *, extra_memory: int | None = None,
                  limit: int = 100, method: str = "auto") -> list[str]:
    """Every way ``algorithm`` fails (at most ``limit`` of them); an empty list means correct.

    Parameters
    ----------
    algorithm:
        The algorithm to check against its collective and topology.
    extra_memory:
        Most scratch chunks a rank may hold at once, or ``None`` for no limit.
    limit:
        Stop after this many problems.
    method:
        ``"auto"`` (default): the vectorised replay for large algorithms (more than 20,000 sends
        or any :class:`~collsynth.algorithm.arrays.SendBlock` step) when ``extra_memory`` is
        ``None``, the reference replay otherwise. ``"replay"`` or ``"vectorised"`` force one
        (both apply the same rules; the messages of the vectorised one are less detailed and come
        grouped by kind rather than in send order).

    Raises
    ------
    InvalidInstanceError
        For an unknown ``method``, or ``method="vectorised"`` with ``extra_memory`` (only the
        reference replay tracks scratch memory).

    Examples
    --------
    >>> from collsynth.algorithm import Algorithm, Send, SendBlock, Step
    >>> from collsynth.collective import allgather
    >>> from collsynth.topology import get_topology
    >>> fc = get_topology("fully-connected:3")
    >>> block = SendBlock([0, 0, 1, 1, 2], [0, 0, 1, 1, 2], [1, 2, 0, 2, 0])
    >>> find_problems(Algorithm("ag", fc, allgather(3), (Step(1, block),)))
    ['rank 1 never receives chunk 2']
    """
    expect_type(algorithm, Algorithm, "find_problems: algorithm")
    if method not in _METHODS:
        raise InvalidInstanceError(
            f"method = {method!r}; expected one of {', '.join(map(repr, _METHODS))}"
        )
    topology, collective = algorithm.topology, algorithm.collective
    if collective.num_ranks != topology.num_ranks:
        return [f"collective has {collective.num_ranks} ranks but topology {topology.name!r} "
                f"has {topology.num_ranks}"]
    if method == "vectorised" and extra_memory is not None:
        raise InvalidInstanceError(
            "the vectorised verifier does not check extra_memory; use method='replay' or 'auto'"
        )
    if method == "vectorised" or (method == "auto" and extra_memory is None
                                  and _is_large(algorithm)):
        return _vectorised_problems(algorithm, limit)
    return _replay_problems(algorithm, extra_memory, limit)


def verify(algorithm: Algorithm, *, extra_memory: int | None = None,
           method: str = "auto") -> Algorithm:
    """Raise :class:`VerificationError` unless ``algorithm`` implements its collective; return it.

    ``method`` chooses the implementation as in :func:`find_problems`.

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
    expect_type(algorithm, Algorithm, "verify: algorithm")
    problems = find_problems(algorithm, extra_memory=extra_memory, method=method)
    if problems:
        shown = "; ".join(problems[:_SHOWN])
        more = f"; and {len(problems) - _SHOWN} more" if len(problems) > _SHOWN else ""
        raise VerificationError(
            f"algorithm {algorithm.name!r} is not a correct {algorithm.collective.describe()} on "
            f"{algorithm.topology.name}: {shown}{more}"
        )
    return algorithm


def _is_large(algorithm: Algorithm) -> bool:
    """True when the vectorised replay is the better choice."""
    return (any(isinstance(step.sends, SendBlock) for step in algorithm.steps)
            or algorithm.num_sends > _LARGE_SENDS)


# -- the reference replay ---------------------------------------------------------------------


def _replay_problems(algorithm: Algorithm, extra_memory: int | None, limit: int) -> list[str]:
    """The reference replay: one send at a time, contribution sets as frozensets."""
    topology, collective = algorithm.topology, algorithm.collective
    n, num_chunks = topology.num_ranks, collective.num_chunks
    problems: list[str] = []

    def report(message: str) -> bool:
        problems.append(message)
        return len(problems) >= limit

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
                              f"count the contribution(s) of rank(s) {_ranks_text(twice)} twice"):
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
                missing = _ranks_text(full[c] - held)
                message = (f"rank {r} ends with an incomplete chunk {c}: missing the contribution(s)"
                           f" of rank(s) {missing}")
            else:
                continue
            if report(message):
                return problems
    return problems


def _ranks_text(ranks) -> str:
    """``[1, 4, 6]``; past :data:`_RANKS_SHOWN` ranks, the first ones and how many more.

    >>> _ranks_text({3, 1}), _ranks_text(range(100))
    ('[1, 3]', '[0, 1, 2, 3, 4, 5, 6, 7, ... and 92 more]')
    """
    ranks = sorted(ranks)
    if len(ranks) <= _RANKS_SHOWN:
        return str(ranks)
    head = ", ".join(map(str, ranks[:_RANKS_SHOWN // 2]))
    return f"[{head}, ... and {len(ranks) - _RANKS_SHOWN // 2} more]"


def _scratch_peak(collective, value) -> int:
    """Most chunks any rank holds outside its pre- and postcondition."""
    counts: Counter[int] = Counter()
    for c, holders in enumerate(value):
        keep = collective.precondition[c] | collective.postcondition[c]
        for r in holders:
            if r not in keep:
                counts[r] += 1
    return max(counts.values(), default=0)


# -- the vectorised replay --------------------------------------------------------------------


class _Enough(Exception):
    """Raised inside the vectorised replay once ``limit`` problems are found."""


class _Report:
    """Collects problem messages; raises :class:`_Enough` at the limit."""

    def __init__(self, limit: int) -> None:
        self.problems: list[str] = []
        self.limit = limit

    def __call__(self, message: str) -> None:
        self.problems.append(message)
        if len(self.problems) >= self.limit:
            raise _Enough

    def room(self) -> int:
        """How many more messages are worth building (at least 1)."""
        return max(1, self.limit - len(self.problems))


def _popcount_rows(words: np.ndarray) -> np.ndarray:
    """Set bits per row of a 2-D ``uint64`` array, as ``int64``."""
    if hasattr(np, "bitwise_count"):
        return np.bitwise_count(words).sum(axis=1, dtype=np.int64)
    table = np.array([bin(i).count("1") for i in range(256)], dtype=np.uint8)
    as_bytes = np.ascontiguousarray(words).view(np.uint8).reshape(len(words), -1)
    return table[as_bytes].sum(axis=1, dtype=np.int64)


def _bits_to_ranks(words: np.ndarray) -> list[int]:
    """The ranks whose bits are set in one bitset row."""
    bits = np.unpackbits(np.ascontiguousarray(words, dtype="<u8").view(np.uint8),
                         bitorder="little")
    return np.flatnonzero(bits).tolist()


class _RankArrays:
    """Sorted ``int64`` arrays of the rank sets of a collective or topology, built once per set
    object (split collectives and composed topologies share their frozensets)."""

    def __init__(self) -> None:
        self._memo: dict[int, tuple[frozenset, np.ndarray]] = {}

    def __call__(self, ranks: frozenset) -> np.ndarray:
        hit = self._memo.get(id(ranks))
        if hit is None or hit[0] is not ranks:
            array = np.sort(np.fromiter(ranks, dtype=np.int64, count=len(ranks)))
            hit = (ranks, array)
            self._memo[id(ranks)] = hit
        return hit[1]


def _group_incidence(topology):
    """The binding bandwidth groups as a sparse (groups x links) 0/1 matrix (CSC), with their
    limits and labels; ``None`` when no group can bind (see
    :func:`collsynth.topology.capacity.link_capacity`). Link ``s -> d`` is column ``s * n + d``.
    """
    capacity = link_capacity(topology)
    if capacity.groups is None:
        return None
    return capacity.groups.tocsc(), capacity.limits, list(capacity.labels)


def _vectorised_problems(algorithm: Algorithm, limit: int) -> list[str]:
    """The vectorised replay (same rules as :func:`_replay_problems`)."""
    report = _Report(limit)
    try:
        _VectorisedReplay(algorithm, report).run()
    except _Enough:
        pass
    return report.problems


class _VectorisedReplay:
    """One run of the vectorised replay; see docs/verification.md for the method."""

    def __init__(self, algorithm: Algorithm, report: _Report) -> None:
        self.algorithm = algorithm
        self.topology = algorithm.topology
        self.collective = algorithm.collective
        self.report = report
        self.n = self.topology.num_ranks
        self.num_chunks = self.collective.num_chunks
        self.combining = self.collective.combining
        self.words = (self.n + 63) // 64 if self.combining else 0
        self.rank_arrays = _RankArrays()

    # -- global checks: rounds, ranges, links, loads -----------------------------------------

    def run(self) -> None:
        links = self.topology.link_array.reshape(-1)
        groups = _group_incidence(self.topology)
        steps = []
        for t, step in enumerate(self.algorithm.steps):
            arrays = self._check_step(t, step, links, groups)
            if arrays is not None and len(arrays[0]):
                steps.append((t, *arrays))
        _log.debug("vectorised verify of %r: %d steps, %d sends, %s groups",
                   self.algorithm.name, len(self.algorithm.steps),
                   sum(len(s[1]) for s in steps), 0 if groups is None else len(groups[1]))
        self._replay(steps)

    def _check_step(self, t: int, step, links: np.ndarray, groups):
        report, n = self.report, self.n
        where = f"step {t}"
        rounds = step.rounds
        if not isinstance(rounds, int) or rounds < 1:
            report(f"{where}: rounds = {rounds!r}; every step lasts at least one round")
            return None
        try:
            chunk, src, dst, red = sends_as_arrays(step.sends)
        except (OverflowError, TypeError, ValueError):
            # A value beyond int64 (or not a number): out of range, like the replay says.
            representable = []
            for send in step.sends:
                try:
                    np.array([send.chunk, send.src, send.dst], dtype=np.int64)
                    representable.append(send)
                except (OverflowError, TypeError, ValueError):
                    report(f"{where}: send {send} names a chunk or rank out of range")
            chunk, src, dst, red = sends_as_arrays(tuple(representable))
        if not len(chunk):
            return chunk, src, dst, red
        ok = ((chunk >= 0) & (chunk < self.num_chunks) & (src >= 0) & (src < n)
              & (dst >= 0) & (dst < n))
        if not ok.all():
            for i in np.flatnonzero(~ok)[:report.room()]:
                send = Send(int(chunk[i]), int(src[i]), int(dst[i]), bool(red[i]))
                report(f"{where}: send {send} names a chunk or rank out of range")
            chunk, src, dst, red = chunk[ok], src[ok], dst[ok], red[ok]
            if not len(chunk):
                return chunk, src, dst, red
        # Per-link loads, a slice of sends at a time to bound the temporaries: in a dense vector
        # over all n * n links when the step is big, else as sorted (link, count) pairs.
        dense = None
        if n * n <= _DENSE_LINKS and 4 * len(chunk) >= n * n:
            dense = np.zeros(n * n, dtype=np.int64)
        parts = []
        for lo in range(0, len(chunk), _SLICE):
            link = src[lo:lo + _SLICE].astype(np.int64)
            link *= n
            link += dst[lo:lo + _SLICE]
            missing = links[link] == 0
            if missing.any():
                for i in lo + np.flatnonzero(missing)[:report.room()]:
                    s, d = int(src[i]), int(dst[i])
                    report(f"{where}: rank {s} sends chunk {int(chunk[i])} to rank {d} but "
                           f"there is no link {s}->{d}")
            if dense is not None:
                dense += np.bincount(link, minlength=n * n)
            else:
                parts.append(np.unique(link, return_counts=True))
            del link, missing
        if dense is not None:
            used = np.flatnonzero(dense)
            count = dense[used]
        elif len(parts) == 1:
            used, count = parts[0]
        else:
            used, inverse = np.unique(np.concatenate([u for u, _ in parts]), return_inverse=True)
            count = np.bincount(inverse, weights=np.concatenate([c for _, c in parts]))
            count = count.astype(np.int64)
        capacity = links[used] * rounds
        over = (capacity > 0) & (count > capacity)
        for i in np.flatnonzero(over)[:report.room()]:
            s, d = divmod(int(used[i]), n)
            report(f"{where}: link {s}->{d} carries {int(count[i])} chunks but its bandwidth "
                   f"{int(links[used[i]])} x {rounds} rounds allows {int(capacity[i])}")
        # Per-group loads: one sparse product over the per-link loads.
        if groups is not None:
            matrix, limits, labels = groups
            load = matrix @ dense if dense is not None else matrix[:, used] @ count
            load = np.asarray(load).reshape(-1)
            allowed = limits * rounds
            for g in np.flatnonzero(load > allowed)[:report.room()]:
                report(f"{where}: {labels[g]} carries {int(load[g])} chunks but its limit "
                       f"{int(limits[g])} x {rounds} rounds allows {int(allowed[g])}")
        return chunk, src, dst, red

    # -- replay of the (chunk, rank) state, a batch of chunks at a time -----------------------

    def _replay(self, steps: list) -> None:
        """Replay the state of each batch of chunks through every step, then check it."""
        n, words = self.n, self.words
        batch = max(1, _STATE_BYTES // (n * (1 + 8 * words)))
        piece = max(1, _PIECE_BYTES // (64 + 24 * words))
        largest = max((len(s[1]) for s in steps), default=0)
        if largest > piece:  # smaller batches: about a piece of sends per batch and step
            batch = min(batch, max(1, self.num_chunks * piece // largest))
        batches = -(-self.num_chunks // batch)
        steps = [self._by_batch(s, batch, batches) for s in steps]
        for b in range(batches):
            c0, c1 = b * batch, min(self.num_chunks, (b + 1) * batch)
            holds, value = self._initial_state(c0, c1)
            for t, arrays, order, bounds in steps:
                if bounds is not None:
                    lo, hi = int(bounds[b]), int(bounds[b + 1])
                    if lo == hi:
                        continue
                    where = slice(lo, hi) if order is None else order[lo:hi]
                    arrays = tuple(a[where] for a in arrays)
                chunk, src, dst, red = _sorted_by_chunk(*arrays, unless_within=piece)
                for lo, hi in _pieces(chunk, piece):
                    self._apply(t, c0, chunk[lo:hi], src[lo:hi], dst[lo:hi], red[lo:hi],
                                holds, value)
            self._check_final(c0, c1, holds, value)

    @staticmethod
    def _by_batch(step, batch: int, batches: int):
        """``(t, arrays, order, bounds)``: the sends of batch ``b`` are ``arrays[...][order]``
        (or the arrays themselves when ``order`` is None) between ``bounds[b]`` and
        ``bounds[b + 1]``; ``bounds`` is None with a single batch. Grouping by batch is a stable
        counting sort, and only a permutation is stored: no copy of the sends."""
        t, *arrays = step
        chunk = arrays[0]
        if batches == 1:
            return t, arrays, None, None
        starts = np.arange(batches + 1, dtype=np.int64) * batch
        if _is_sorted(chunk):
            return t, arrays, None, np.searchsorted(chunk, starts)
        which = chunk // batch
        if batches < 1 << 16:
            which = which.astype(np.uint16)  # numpy sorts 16-bit keys by radix
        order = np.argsort(which, kind="stable")
        if len(order) < 1 << 31:
            order = order.astype(np.int32)
        bounds = np.concatenate(([0], np.cumsum(np.bincount(which, minlength=batches))))
        return t, arrays, order, bounds

    def _initial_state(self, c0: int, c1: int):
        """``holds[(c - c0) * n + r]`` and, when combining, ``value[...]`` (bitsets of
        contributions) for chunks ``c0 .. c1 - 1`` before the first step."""
        n = self.n
        pre = [self.rank_arrays(self.collective.precondition[c]) for c in range(c0, c1)]
        ranks = np.concatenate(pre)
        rows = np.repeat(np.arange(c1 - c0, dtype=np.int64) * n, [len(p) for p in pre]) + ranks
        holds = np.zeros((c1 - c0) * n, dtype=bool)
        holds[rows] = True
        value = None
        if self.combining:
            value = np.zeros(((c1 - c0) * n, self.words), dtype=np.uint64)
            value[rows, ranks >> 6] = np.left_shift(np.uint64(1), (ranks & 63).astype(np.uint64))
        return holds, value

    def _apply(self, t: int, c0: int, chunk, src, dst, red, holds, value) -> None:
        """Apply the sends of step ``t`` for some chunks of the batch starting at ``c0``."""
        report, n = self.report, self.n
        where = f"step {t}"
        base = (chunk.astype(np.int64) - c0) * n
        src_key = base + src
        held = holds[src_key]
        if not held.all():
            for i in np.flatnonzero(~held)[:report.room()]:
                report(f"{where}: rank {int(src[i])} sends chunk {int(chunk[i])} it does not hold")
            src_key, base, red = src_key[held], base[held], red[held]
            dst = dst[held]
            if not len(src_key):
                return
        if not self.combining and red.any():
            for i in np.flatnonzero(red)[:report.room()]:
                report(f"{where}: rank {int(src_key[i] % n)} reduces chunk "
                       f"{c0 + int(base[i] // n)} into rank {int(dst[i])}, but "
                       f"{self.collective.name} is not a combining collective")
        dst_key = base + dst
        del base, dst
        # Group the sends by receiver (chunk, rank), keeping their order within a receiver.
        if len(dst_key) > 1 and not (dst_key[1:] >= dst_key[:-1]).all():
            order = np.argsort(dst_key, kind="stable")
            dst_key, src_key, red = dst_key[order], src_key[order], red[order]
        first = np.ones(len(dst_key), dtype=bool)
        np.not_equal(dst_key[1:], dst_key[:-1], out=first[1:])
        starts = np.flatnonzero(first)
        counts = np.diff(np.append(starts, len(dst_key)))
        keys = dst_key[starts]
        if len(starts) == len(dst_key):
            copies = (~red).astype(np.int64)
        else:
            copies = np.add.reduceat((~red).astype(np.int64), starts)
        conflict = (copies > 0) & (counts > 1)
        if conflict.any():
            for g in np.flatnonzero(conflict)[:report.room()]:
                c, d = divmod(int(keys[g]), n)
                report(f"{where}: rank {d} receives chunk {c0 + c} {int(counts[g])} times and "
                       "at least one is a copy, so the result depends on their order")
        single = (copies > 0) & (counts == 1)
        reduced = copies == 0
        copy_keys = keys[single]
        reduce_keys = keys[reduced]
        if value is None:
            if len(reduce_keys):  # already reported as not combining; word it as the replay does
                twice = counts[reduced] - 1 + holds[reduce_keys]
                for g in np.flatnonzero(twice)[:report.room()]:
                    c, d = divmod(int(reduce_keys[g]), n)
                    start = int(starts[reduced][g])
                    for j in range(start + 1 - int(holds[reduce_keys[g]]),
                                   start + int(counts[reduced][g])):
                        report(f"{where}: rank {int(src_key[j] % n)} reduces chunk {c0 + c} "
                               f"into rank {d}, which would count the contribution(s) of "
                               f"rank(s) {_ranks_text(_WHOLE)} twice")
            holds[copy_keys] = True
            holds[reduce_keys] = True
            return
        copy_values = value[src_key[starts[single]]]
        union = None
        if len(reduce_keys):
            members = np.repeat(reduced, counts)
            incoming = value[src_key[members]]
            group_starts = np.concatenate(([0], np.cumsum(counts[reduced])[:-1]))
            before = value[reduce_keys]
            union = np.bitwise_or.reduceat(incoming, group_starts, axis=0)
            union |= before
            total = _popcount_rows(before)
            total += np.add.reduceat(_popcount_rows(incoming), group_starts)
            twice = _popcount_rows(union) < total
            if twice.any():
                sources = src_key[members]
                for g in np.flatnonzero(twice)[:report.room()]:
                    self._report_twice(where, c0, int(reduce_keys[g]), before[g],
                                       incoming, sources, int(group_starts[g]),
                                       int(counts[reduced][g]))
        holds[copy_keys] = True
        value[copy_keys] = copy_values
        if union is not None:
            holds[reduce_keys] = True
            value[reduce_keys] = union

    def _report_twice(self, where, c0, key, before, incoming, sources, start, count) -> None:
        """Messages for the reduces into one (chunk, rank) that count a contribution twice, as
        the reference replay words them (reduces applied in send order)."""
        c, d = divmod(key, self.n)
        accumulated = before.copy()
        for j in range(start, start + count):
            twice = accumulated & incoming[j]
            if twice.any():
                self.report(f"{where}: rank {int(sources[j]) % self.n} reduces chunk {c0 + c} "
                            f"into rank {d}, which would count the contribution(s) of rank(s) "
                            f"{_ranks_text(_bits_to_ranks(twice))} twice")
            accumulated |= incoming[j]

    def _check_final(self, c0: int, c1: int, holds, value) -> None:
        """Every rank of each chunk's postcondition holds the complete value."""
        n, report = self.n, self.report
        post = [self.rank_arrays(self.collective.postcondition[c]) for c in range(c0, c1)]
        rows = (np.repeat(np.arange(c1 - c0, dtype=np.int64) * n, [len(p) for p in post])
                + np.concatenate(post))
        complete = holds[rows]
        if value is not None:
            sizes = np.array([len(self.collective.precondition[c]) for c in range(c0, c1)],
                             dtype=np.int64)
            # A held value only ever has bits of the precondition: complete iff all are set.
            complete &= _popcount_rows(value[rows]) == sizes[rows // n]
        for i in np.flatnonzero(~complete)[:report.room()]:
            c, r = divmod(int(rows[i]), n)
            if not holds[rows[i]]:
                report(f"rank {r} never receives chunk {c0 + c}")
            else:
                have = set(_bits_to_ranks(value[rows[i]]))
                missing = _ranks_text(self.collective.precondition[c0 + c] - have)
                report(f"rank {r} ends with an incomplete chunk {c0 + c}: missing the "
                       f"contribution(s) of rank(s) {missing}")


def _is_sorted(values: np.ndarray) -> bool:
    return len(values) < 2 or bool((values[1:] >= values[:-1]).all())


def _sorted_by_chunk(chunk, src, dst, red, *, unless_within: int):
    """The sends in stable chunk order, unless there are at most ``unless_within`` of them (they
    then form a single piece and need no order)."""
    if len(chunk) <= unless_within or _is_sorted(chunk):
        return chunk, src, dst, red
    order = np.argsort(chunk, kind="stable")
    return chunk[order], src[order], dst[order], red[order]


def _pieces(chunk: np.ndarray, size: int) -> Iterator[tuple[int, int]]:
    """Split the sends into ranges of about ``size`` that never split a chunk (``chunk`` is
    sorted whenever there are more than ``size`` sends)."""
    start, end_all = 0, len(chunk)
    while start < end_all:
        end = end_all if end_all - start <= size else start + size
        if end < end_all:
            boundary = start + int(np.searchsorted(chunk[start:], chunk[end], side="left"))
            if boundary == start:  # one chunk bigger than a piece: take it whole
                boundary = start + int(np.searchsorted(chunk[start:], chunk[start], side="right"))
            end = boundary
        yield start, end
        start = end
