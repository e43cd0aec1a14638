"""Each runtime's documented limits on one MSCCL program, and which of them a program exceeds.

The details (formats, conventions, rules) are in docs/export.md; section numbers (§) refer to
docs/msccl-xml.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import numpy as np

from collsynth.errors import ExportError
from collsynth.runtimes import MSCCL_XML, XmlDialect, runtime_names, xml_dialect
from collsynth.runtimes.dialect import DIALECTS
from collsynth.export.stats import LimitFigures, Peak, ProgramStats, program_stats

from collsynth.export.program import Program

if TYPE_CHECKING:  # pragma: no cover - imported for annotations only
    from collsynth.algorithm.model import Algorithm

__all__ = ["Limit", "LIMITS", "runtime_limits", "get_limit", "Peak", "LimitFigures",
           "LimitViolation", "find_limit_violations", "estimate_figures", "estimate_limits",
           "estimate_all", "limit_error", "STEPS", "THREADBLOCKS", "PER_CHANNEL", "CHANNELS",
           "COUNT", "NODES", "SUBS", "OFFSET", "DEPID", "FUSION"]

# Names of the limits find_limit_violations evaluates.
STEPS = "MSCCL_MAX_NUM_STEPS"
THREADBLOCKS = "MSCCL_MAX_NUM_THREAD_BLOCKS"
PER_CHANNEL = "MSCCL_MAX_NUM_THREAD_BLOCKS_PER_CHANNEL"
CHANNELS = "MAXCHANNELS"
COUNT = "MSCCL_MAX_COUNT"
NODES = "MAX_NODES"
SUBS = "MAX_SUBS"
OFFSET = "OFFSET_INT16"
DEPID = "DEPID_INT8"
FUSION = "MSCCL_MAX_REDUCE_FUSION"


@dataclass(frozen=True)
class Limit:
    """One documented limit of one runtime.

    ``allowed`` is the largest accepted value (inclusive; ``cnt < 72`` is ``allowed = 71``).
    ``checked`` is False for limits that are not a property of one program (they depend on the
    call or on the set of loaded files) or that the writer already enforces; they are listed
    for reference and never reported.
    """

    name: str
    what: str
    allowed: int
    source: str
    checked: bool = True


def _table(rt: str, *, steps: int, threadblocks: int, channels: int, algos: int) -> tuple[
        Limit, ...]:
    """The limits of one runtime; the figures that differ between runtimes are parameters."""
    parser = {"msccl": "msccl src/graph/xml.cc + topo.cc",
              "rccl": "rccl src/misc/msccl/msccl_parser.cc",
              "msccl-executor": "msccl-executor-nccl parser (rccl's)"}[rt]
    table = [
        Limit(STEPS, "steps per threadblock", steps,
              f"{parser}: step s must be < {steps}, so a <tb> holds at most {steps} steps "
              "(§7.1, §14.1)"),
        Limit(THREADBLOCKS, "threadblocks per rank", threadblocks,
              f"{parser}: <tb> ids 0..{threadblocks - 1} per rank (§6.1, §14.1)"),
        Limit(PER_CHANNEL, "sending (receiving) threadblocks per channel", 32,
              "at most 32 tbs with a send (recv) peer per channel of a rank, an error when a "
              "send/recv step is parsed (§6.2, §14.1)"),
        Limit(CHANNELS, "channels", channels,
              f"MAXCHANNELS = {channels}: connections and chan ids only exist for that many "
              "channels (§11.2, §14.1)"),
        Limit(COUNT, "chunks per step (cnt < 72)", 71,
              "MSCCL_MAX_COUNT = 72: cnt >= 72 is a parse error (§7.1, §14.1)"),
        Limit(NODES, "XML elements per rank (<algo>, all <gpu>s, its <tb>s and <step>s)", 4096,
              "MAX_NODES: the reader keeps 4096 nodes for the loading rank (§2.5)"),
        Limit(SUBS, "child elements per element", 1024,
              "MAX_SUBS: 1024 children per node, not bounds-checked (memory corruption beyond; "
              "§2.5): at most 1024 <gpu>s, i.e. ranks"),
        Limit(OFFSET, "as srcoff/dstoff (int16)", 32767,
              "offsets are stored as int16 (§7.1, §14.1)"),
        Limit(DEPID, "as depid (int8)", 127,
              "depid is stored as int8: a dependency on threadblock 128 or above overflows "
              "(§7.1, §14.1)"),
        Limit(FUSION, "sources in one fused reduction", 16,
              "MSCCL_MAX_REDUCE_FUSION = 16: consecutive fusable 're' steps beyond 16 overflow "
              "the interpreter's source array (§10; counted conservatively, ignoring the "
              "once-per-tb cap)"),
        Limit("MSCCL_MAX_NUM_ALGOS", "algorithm files loaded at once", algos,
              "loader table size (§13.1, §13.2); a property of the installation, not of one "
              "program", checked=False),
        Limit("MSCCL_MAX_ITER", "pipeline iterations per call", 65536,
              "flags carry the iteration (§8.3); depends on the message size of the call",
              checked=False),
        Limit("MAX_ATTR_COUNT", "attributes per element", 16,
              "further attributes are silently dropped (§2.3); enforced by the writer",
              checked=False),
        Limit("MAX_STR_LEN", "characters per name or value", 254,
              "255-byte buffers with the terminator (§2.3); enforced by the writer",
              checked=False),
    ]
    if rt == "msccl":
        table.append(Limit("MSCCL_MAX_ALGO_NAME", "characters of the name attribute", 63,
                           "msccl truncates longer names (§4.2); lower() truncates them",
                           checked=False))
    return tuple(table)


#: runtime name -> its documented limits (§14.1; msccl-executor: rccl's parser with its own
#: defaults, 64 steps per tb and 32 x MAXCHANNELS threadblocks).
LIMITS: dict[str, tuple[Limit, ...]] = {
    d.name: _table(d.name, steps=d.max_steps_per_tb, threadblocks=d.max_threadblocks,
                   channels=d.max_channels, algos=d.max_algorithms)
    for d in DIALECTS.values()}


def runtime_limits(runtime: str) -> tuple[Limit, ...]:
    """The documented limits of ``runtime`` (``msccl``, ``rccl``, ``msccl-executor``).

    >>> [(x.name, x.allowed) for x in runtime_limits("rccl")][:3]
    [('MSCCL_MAX_NUM_STEPS', 64), ('MSCCL_MAX_NUM_THREAD_BLOCKS', 64), \
('MSCCL_MAX_NUM_THREAD_BLOCKS_PER_CHANNEL', 32)]
    """
    return LIMITS[xml_dialect(runtime).name]


def get_limit(runtime: str, name: str) -> Limit:
    """One limit of ``runtime`` by its name (``MSCCL_MAX_NUM_STEPS``, ...)."""
    for limit in runtime_limits(runtime):
        if limit.name == name:
            return limit
    raise KeyError(name)


# -- figures --------------------------------------------------------------------------------


@dataclass(frozen=True)
class LimitViolation:
    """One limit of one runtime that a program (or, estimated, an algorithm) exceeds.

    ``actual`` is the worst value, at ``where``; ``places`` of ``scopes`` (ranks, usually)
    exceed the limit. With ``lower_bound`` the actual value is ``actual`` or more (an estimate
    made before lowering).

    >>> v = LimitViolation("msccl", "MSCCL_MAX_NUM_STEPS", "steps per threadblock", 256, 4096,
    ...                    "threadblock 3 of rank 17", 12, 32)
    >>> v.excess, v.ratio
    (3840, 16.0)
    >>> print(v)
    MSCCL_MAX_NUM_STEPS: msccl allows 256 steps per threadblock; threadblock 3 of rank 17 needs \
4096 (16x the limit, 3840 over; 12 of 32 ranks)
    """

    runtime: str
    limit: str
    what: str
    allowed: int
    actual: int
    where: str
    places: int = 1
    scopes: int = 1
    lower_bound: bool = False

    @property
    def excess(self) -> int:
        """How much ``actual`` is above ``allowed``."""
        return self.actual - self.allowed

    @property
    def ratio(self) -> float:
        """``actual / allowed``."""
        return self.actual / self.allowed

    def __str__(self) -> str:
        ratio = self.ratio
        if ratio >= 10:
            times = f"{ratio:.0f}x"
        elif ratio >= 1.1:
            times = f"{math.floor(ratio * 10) / 10:.1f}x"
        else:  # just over: enough digits not to read 1.0x
            times = f"{math.floor(ratio * 100) / 100:.2f}x"
        needs = f"needs {self.actual} or more" if self.lower_bound else f"needs {self.actual}"
        times = f"at least {times}" if self.lower_bound else times
        spread = f"; {self.places} of {self.scopes} ranks" if self.scopes > 1 else ""
        allows = (f"allows values up to {self.allowed} {self.what}" if self.what.startswith("as ")
                  else f"allows {self.allowed} {self.what}")
        return (f"{self.limit}: {self.runtime} {allows}; {self.where} {needs} ({times} the "
                f"limit, {self.excess} over{spread})")


def _checks(figures: LimitFigures) -> dict[str, list[tuple[str | None, tuple[Peak, ...] | None]]]:
    """limit name -> [(what, overriding the table's; peaks)]."""
    return {
        STEPS: [(None, figures.steps)],
        THREADBLOCKS: [(None, figures.threadblocks)],
        PER_CHANNEL: [("sending threadblocks per channel", figures.send_tbs_per_channel),
                      ("receiving threadblocks per channel", figures.recv_tbs_per_channel)],
        CHANNELS: [(None, (Peak(figures.nchannels, "the program"),))],
        COUNT: [(None, figures.cnt)],
        NODES: [(None, figures.nodes)],
        SUBS: [("child elements per element", (Peak(figures.ngpus, "the <algo> element (one "
                                                                "<gpu> per rank)"),)),
               (None, figures.children)],
        OFFSET: [(None, figures.offset)],
        DEPID: [(None, figures.depid)],
        FUSION: [(None, figures.fusion)],
    }


def _figures_of(subject: object) -> LimitFigures:
    if isinstance(subject, LimitFigures):
        return subject
    figures = getattr(subject, "figures", None)
    if isinstance(figures, LimitFigures):  # ProgramStats
        return figures

    if isinstance(subject, Program):
        return program_stats(subject).figures
    raise TypeError(f"expected a Program, ProgramStats or LimitFigures, got "
                    f"{type(subject).__name__}")


def find_limit_violations(program_or_stats: Program | ProgramStats | LimitFigures,
                          runtime: str) -> list[LimitViolation]:
    """Every limit of ``runtime`` that a program exceeds: one :class:`LimitViolation` per
    limit (per direction for the per-channel one), naming its worst place.

    Parameters
    ----------
    program_or_stats:
        A :class:`~collsynth.export.program.Program`, its
        :func:`~collsynth.export.stats.program_stats`, or :class:`LimitFigures` (for example
        from :func:`estimate_figures`).
    runtime:
        ``msccl``, ``rccl`` or ``msccl-executor``.

    Returns
    -------
    list of LimitViolation
        In the order of :data:`LIMITS`; empty when the program fits.
    """
    figures = _figures_of(program_or_stats)
    rt = xml_dialect(runtime)
    checks = _checks(figures)
    found: list[LimitViolation] = []
    for limit in LIMITS[rt.name]:
        if not limit.checked:
            continue
        for what, peaks in checks[limit.name]:
            if not peaks:
                continue
            over = [peak for peak in peaks if peak.value > limit.allowed]
            if over:
                worst = max(over, key=lambda peak: peak.value)  # the first of the worst
                found.append(LimitViolation(rt.name, limit.name, what or limit.what,
                                            limit.allowed, worst.value, worst.where, len(over),
                                            len(peaks), worst.at_least))
    return found


def limit_error(violations: Sequence[LimitViolation], subject: str, *,
                before_lowering: bool = False) -> ExportError:
    """One :class:`ExportError` listing ``violations`` (its ``violations`` attribute keeps
    them, for a caller that shows one per line). ``subject`` says what exceeds them;
    ``before_lowering`` that they were found from the algorithm's sends.

    >>> v = LimitViolation("rccl", "MAXCHANNELS", "channels", 128, 130, "the program")
    >>> error = limit_error([v], "ring.json")
    >>> print(error)
    ring.json exceeds 1 rccl limit: MAXCHANNELS: rccl allows 128 channels; the program needs \
130 (1.01x the limit, 2 over)
    >>> error.violations == (v,)
    True
    """
    runtimes = list(dict.fromkeys(v.runtime for v in violations))
    count = len(violations)
    estimated = " (found from the sends, before lowering)" if before_lowering else ""
    head = (f"{subject} exceeds {count} {'/'.join(runtimes)} limit{'s' if count > 1 else ''}"
            f"{estimated}")
    body = "; ".join(f"{v.runtime}: {v}" if len(runtimes) > 1 else str(v) for v in violations)
    error = ExportError(f"{head}: {body}")
    error.violations = tuple(violations)  # type: ignore[attr-defined]
    return error


# -- estimates before lowering -----------------------------------------------------------------


def _columns(sends: object) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(chunk, src, dst, reduce) arrays of one step's sends: the arrays of an array-backed
    sequence when it has them, else read send by send."""
    for names in (("chunk", "src", "dst", "reduce"), ("chunks", "srcs", "dsts", "reduces")):
        cols = [getattr(sends, name, None) for name in names]
        if all(isinstance(col, np.ndarray) for col in cols):
            return (cols[0].astype(np.int64, copy=False), cols[1].astype(np.int64, copy=False),
                    cols[2].astype(np.int64, copy=False), cols[3].astype(bool, copy=False))
    count = len(sends)  # type: ignore[arg-type]
    return (np.fromiter((x.chunk for x in sends), np.int64, count),  # type: ignore[attr-defined]
            np.fromiter((x.src for x in sends), np.int64, count),  # type: ignore[attr-defined]
            np.fromiter((x.dst for x in sends), np.int64, count),  # type: ignore[attr-defined]
            np.fromiter((bool(x.reduce) for x in sends), bool, count))  # type: ignore




@dataclass(frozen=True)
class _Sends:
    t: np.ndarray
    chunk: np.ndarray
    src: np.ndarray
    dst: np.ndarray
    reduce: np.ndarray


def _send_table(algorithm: Algorithm) -> _Sends | None:
    """All sends as arrays, or ``None`` when some send names a rank or chunk out of range or
    sends to itself (the verifier reports that)."""
    parts: list[list[np.ndarray]] = [[], [], [], [], []]
    for t, step in enumerate(algorithm.steps):
        columns = _columns(step.sends)
        parts[0].append(np.full(len(columns[0]), t, np.int64))
        for i, column in enumerate(columns):
            parts[i + 1].append(column)
    if not parts[0] or not sum(len(p) for p in parts[0]):
        empty = np.zeros(0, np.int64)
        return _Sends(empty, empty, empty, empty, np.zeros(0, bool))
    t, chunk, src, dst, red = (np.concatenate(p) for p in parts)
    n = algorithm.topology.num_ranks
    if (min(src.min(), dst.min(), chunk.min()) < 0 or max(src.max(), dst.max()) >= n
            or chunk.max() >= algorithm.collective.num_chunks or bool((src == dst).any())):
        return None
    return _Sends(t, chunk, src, dst, red.astype(bool, copy=False))


def _unique_inverse(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(keys, return_inverse=True)`` by one sort (several times faster on millions
    of keys than numpy's hashing version)."""
    order = np.argsort(keys, kind="stable")
    ordered = keys[order]
    start = np.ones(len(keys), bool)
    np.not_equal(ordered[1:], ordered[:-1], out=start[1:])
    inverse = np.empty(len(keys), np.int64)
    inverse[order] = np.cumsum(start) - 1
    return ordered[start], inverse


def _within_group(keys: np.ndarray) -> np.ndarray:
    """For sorted ``keys``: the index of each element within its run of equal keys."""
    index = np.arange(len(keys))
    if not len(keys):
        return index
    start = np.r_[True, keys[1:] != keys[:-1]]
    return index - np.maximum.accumulate(np.where(start, index, 0))


def _pairs_in(keys: np.ndarray, table: np.ndarray) -> np.ndarray:
    """Which of ``keys`` occur in the sorted array ``table``."""
    if not len(table):
        return np.zeros(len(keys), bool)
    pos = np.minimum(np.searchsorted(table, keys), len(table) - 1)
    return table[pos] == keys


def _has_value(algorithm: Algorithm, sends: _Sends) -> np.ndarray:
    """Per send: does the receiver hold a value of the chunk before the step (in the
    precondition, or received in an earlier step)? Only computed for reductions."""
    num_chunks = algorithm.collective.num_chunks
    key = sends.dst * num_chunks + sends.chunk
    unique, inverse = _unique_inverse(key)
    first = np.full(len(unique), np.iinfo(np.int64).max, np.int64)
    np.minimum.at(first, inverse, sends.t)
    result = first[inverse] < sends.t
    selected = np.flatnonzero(sends.reduce)
    wanted, back = _unique_inverse(key[selected])
    pre = algorithm.collective.precondition
    initially = np.fromiter((int(k) // num_chunks in pre[int(k) % num_chunks] for k in wanted),
                            bool, len(wanted))
    result[selected] |= initially[back]
    return result


def _local_copies(algorithm: Algorithm, sends: _Sends) -> np.ndarray:
    """Per rank, the local copies an out-of-place lowering makes: one per chunk the rank
    holds at the start, needs at the end and never receives (input slot -> output slot)."""
    collective = algorithm.collective
    n, num_chunks = collective.num_ranks, collective.num_chunks
    kept = [q * num_chunks + c for c, (pre, post) in
            enumerate(zip(collective.precondition, collective.postcondition)) for q in pre & post]
    kept_keys = np.asarray(kept, np.int64)
    received = np.sort(sends.dst * num_chunks + sends.chunk)
    copied = kept_keys[~_pairs_in(kept_keys, received)]
    return np.bincount(copied // num_chunks, minlength=n)[:n]


def estimate_figures(algorithm: Algorithm, runtime: str, *, channels: int = 1,
                     instances: int = 1, inplace: bool = False, outofplace: bool = True,
                     channel_by: str = "chunk", predict: bool = False) -> LimitFigures | None:
    """Figures of ``lower(algorithm, runtime=..., channels=..., instances=..., inplace=...,
    outofplace=...)`` computed from the sends without lowering: exact or lower bounds.

    Exact: the channels; per rank and channel the sending and receiving threadblocks (one per
    peer); threadblocks per rank (``max(#send peers, #receive peers)`` per channel, plus one
    for local copies, times ``instances``; for in-place exports the local one is not
    counted). Lower bounds (``Peak.at_least``): steps per threadblock, from the messages of
    each connection in each algorithm step (at most 71 merged into one step when ``instances
    == 1``; a reduction received on a runtime without fused ops takes two steps, and such
    messages merge only among themselves) and the local copies (merged likewise), paired into
    threadblocks as lowering pairs them, without ``nop`` steps; elements per rank. ``cnt``,
    offsets and dependencies are not estimated.

    With ``predict`` the steps count the runs of consecutive chunks of each connection and
    step instead (what the lowering merges: consecutive slots are almost always consecutive
    chunks): close to the lowered program, but not a bound (an alltoall's consecutive slots may
    hold chunks that are not), so the export uses it only to choose what to lower first.

    Returns ``None`` when a send names a rank or chunk out of range (the verifier says which).
    """
    sends = _send_table(algorithm)
    if sends is None:
        return None
    return _estimate(algorithm, sends, xml_dialect(runtime), channels, instances, inplace,
                     outofplace, channel_by, predict)


#: How a send's channel is chosen: ``"chunk"`` (chunk ``c`` on channel ``c % channels``: the
#: pieces of a message spread over channels), ``"block"`` (chunks in blocks of as many as one step
#: may carry, 71, block ``b`` on channel ``b % channels``: messages merged into ``cnt > 1`` steps
#: stay whole, and the merged steps spread over channels) or ``"peer"`` (the pair ``s -> d`` on
#: channel ``((d - s) mod n) % channels``: a rank's peers spread over channels, for schedules whose
#: ranks talk to more peers than one channel's 32 threadblocks).
CHANNEL_POLICIES = ("chunk", "block", "peer")


def channel_of(chunk, src, dst, num_ranks: int, channels: int, by: str = "chunk",
               block: int = 1):
    """The channel of sends ``chunk: src -> dst`` (ints or numpy arrays) under policy ``by``;
    ``block`` is the block size of policy ``"block"`` (the runtime's largest ``cnt``).

    >>> channel_of(5, 0, 3, 8, 4), channel_of(5, 0, 3, 8, 4, by="peer")
    (1, 3)
    >>> [channel_of(c, 0, 1, 2, 2, by="block", block=2) for c in range(6)]
    [0, 0, 1, 1, 0, 0]
    """
    if by == "peer":
        return ((dst - src) % num_ranks) % channels
    if by == "block":
        return (chunk // block) % channels
    return chunk % channels


def _runs(group: np.ndarray, chunk: np.ndarray, split: np.ndarray, groups: int, cap: int
          ) -> tuple[np.ndarray, np.ndarray]:
    """Per group of messages (one connection in one step): the steps its plain and its split
    messages take when runs of consecutive chunks merge, ``cap`` chunks at most per step."""
    order = np.lexsort((chunk, split, group))
    g, c, x = group[order], chunk[order], split[order]
    new = np.r_[True, (g[1:] != g[:-1]) | (x[1:] != x[:-1]) | (c[1:] != c[:-1] + 1)]
    starts = np.flatnonzero(new)
    lengths = np.diff(np.r_[starts, len(c)])
    steps = -(-lengths // cap)
    plain = np.bincount(g[starts], weights=np.where(x[starts], 0, steps), minlength=groups)
    split_steps = np.bincount(g[starts], weights=np.where(x[starts], steps, 0), minlength=groups)
    return plain, split_steps


def _estimate(algorithm: Algorithm, sends: _Sends, rt: XmlDialect, channels: int, instances: int,
              inplace: bool, outofplace: bool, channel_by: str = "chunk",
              predict: bool = False) -> LimitFigures:
    n = algorithm.topology.num_ranks
    C, K = max(1, channels), max(1, instances)
    T = max(1, algorithm.num_steps)
    merge_cap = rt.max_count - 1 if K == 1 else 1
    ch = channel_of(sends.chunk, sends.src, sends.dst, n, C, channel_by, rt.max_count - 1)
    if not rt.fused_ops and sends.reduce.any():
        split = sends.reduce & _has_value(algorithm, sends)
    else:
        split = np.zeros(len(ch), bool)
    # Messages per (connection, algorithm step): mergeable ones, and split ones (r + re).
    conn = (sends.src * n + sends.dst) * C + ch
    per_step, inverse = _unique_inverse(conn * T + sends.t)
    if predict:  # runs of consecutive chunks, each split at the cnt limit
        merged, splits = _runs(inverse, sends.chunk, split, len(per_step), merge_cap)
    else:
        splits = np.bincount(inverse, weights=split, minlength=len(per_step))
        merged = np.ceil((np.bincount(inverse, minlength=len(per_step)) - splits) / merge_cap)
        splits = np.ceil(splits / merge_cap)   # split messages merge among themselves
    conns, cinv = _unique_inverse(per_step // T)
    send_steps = np.rint(np.bincount(cinv, weights=merged + splits,
                                     minlength=len(conns))).astype(np.int64)
    recv_steps = np.rint(np.bincount(cinv, weights=merged + 2 * splits,
                                     minlength=len(conns))).astype(np.int64)
    src, dst, chan = conns // (n * C), (conns // C) % n, conns % C
    used = np.flatnonzero(np.bincount(chan, minlength=C))
    nchannels = K * max(1, len(used))
    compact = np.searchsorted(used, np.arange(C))

    # Threadblocks per rank and channel: one per send peer, shared with a receive peer.
    out_count = np.bincount(src * C + chan, minlength=n * C).reshape(n, C)
    in_count = np.bincount(dst * C + chan, minlength=n * C).reshape(n, C)
    paired = np.maximum(out_count, in_count).sum(axis=1)
    exact_local = outofplace and not inplace
    copies = _local_copies(algorithm, sends) if exact_local else np.zeros(n, np.int64)
    local = (copies > 0).astype(np.int64)
    copies = -(-copies // merge_cap)        # consecutive local copies merge too
    tbs = np.where(paired > 0, K * (paired + local), np.maximum(1, K * local))

    # Pair connections into threadblocks as lowering does: to and from one peer share one;
    # the others pair up in peer order. Keys (send peer, recv peer, channel) of instance 0.
    reverse = (dst * n + src) * C + chan
    both = np.flatnonzero(_pairs_in(reverse, conns))
    rev_index = np.searchsorted(conns, reverse[both])
    ranks_, steps_, sends_, recvs_, chans_ = ([src[both]], [send_steps[both] + recv_steps[
        rev_index]], [dst[both]], [dst[both]], [chan[both]])
    alone = np.setdiff1d(np.arange(len(conns)), both, assume_unique=True)
    if len(alone):
        o = alone[np.lexsort((dst[alone], chan[alone], src[alone]))]
        i = alone[np.lexsort((src[alone], chan[alone], dst[alone]))]
        o_key = (src[o] * C + chan[o]) * n + _within_group(src[o] * C + chan[o])
        i_key = (dst[i] * C + chan[i]) * n + _within_group(dst[i] * C + chan[i])
        keys, kinv = _unique_inverse(np.concatenate((o_key, i_key)))
        steps_.append(np.bincount(kinv, weights=np.concatenate((send_steps[o], recv_steps[i])),
                                  minlength=len(keys)).astype(np.int64))
        send_peer = np.full(len(keys), -1, np.int64)
        recv_peer = np.full(len(keys), -1, np.int64)
        send_peer[kinv[:len(o)]] = dst[o]
        recv_peer[kinv[len(o):]] = src[i]
        ranks_.append(keys // (n * C))
        sends_.append(send_peer)
        recvs_.append(recv_peer)
        chans_.append((keys // n) % C)
    tb_rank, tb_steps, tb_send, tb_recv, tb_chan = (np.concatenate(x) for x in (
        ranks_, steps_, sends_, recvs_, chans_))
    tb_chan = compact[tb_chan]
    # Per rank, the threadblock with most steps (the first in numbering order among equals)
    # and its number: local copies come first, then (send, recv, channel) order over all
    # instances (instance k on channels k * len(used) + ...).
    order = np.lexsort((tb_chan, tb_recv, tb_send, -tb_steps, tb_rank))
    first = np.r_[True, tb_rank[order][1:] != tb_rank[order][:-1]] if len(order) else order
    best = np.full(n, -1, np.int64)
    best[tb_rank[order][first]] = order[first]
    numbered = np.lexsort((tb_chan, tb_recv, tb_send, tb_rank))
    within_rank = _within_group(tb_rank[numbered])
    same_peers = (tb_rank[numbered] * n + tb_send[numbered] + 1) * (n + 1) + tb_recv[numbered] + 1
    within_peers = _within_group(same_peers)
    position = np.empty(len(numbered), np.int64)   # number minus the local threadblocks
    position[numbered] = K * (within_rank - within_peers) + within_peers
    total = (np.bincount(src, weights=send_steps, minlength=n)
             + np.bincount(dst, weights=recv_steps, minlength=n)).astype(np.int64) + copies

    def tb_where(q: int, index: int) -> str:
        if exact_local:
            return f"threadblock {int(K * local[q] + position[index])} of rank {q}"
        peers = []
        if tb_send[index] >= 0:
            peers.append(f"sends to {tb_send[index]}")
        if tb_recv[index] >= 0:
            peers.append(f"receives from {tb_recv[index]}")
        return (f"the threadblock of rank {q} that {' and '.join(peers)} on channel "
                f"{tb_chan[index]}")

    steps, children, threadblocks, nodes, send_peaks, recv_peaks = [], [], [], [], [], []
    for q in range(n):
        index = int(best[q])
        most, where = (int(tb_steps[index]), tb_where(q, index)) if index >= 0 else (0, "")
        if copies[q] > most:
            most, where = int(copies[q]), f"threadblock 0 of rank {q} (its local copies)"
        steps.append(Peak(most, where, True))
        threadblocks.append(Peak(int(tbs[q]), f"rank {q}", not exact_local and paired[q] > 0))
        nodes.append(Peak(1 + n + int(tbs[q]) + K * int(total[q]), f"rank {q}", True))
        children.append(Peak(int(tbs[q]), f"the <gpu> of rank {q}", True)
                        if tbs[q] >= most else Peak(most, where, True))
        c_out, c_in = int(out_count[q].argmax()), int(in_count[q].argmax())
        send_peaks.append(Peak(int(out_count[q, c_out]), f"rank {q} on channel {compact[c_out]}"))
        recv_peaks.append(Peak(int(in_count[q, c_in]), f"rank {q} on channel {compact[c_in]}"))
    return LimitFigures(
        ngpus=n, nchannels=nchannels, threadblocks=tuple(threadblocks), steps=tuple(steps),
        send_tbs_per_channel=tuple(send_peaks), recv_tbs_per_channel=tuple(recv_peaks),
        nodes=tuple(nodes), children=tuple(children))


def estimate_limits(algorithm: Algorithm, runtime: str, *, channels: int = 1,
                    instances: int = 1, inplace: bool = False, outofplace: bool = True,
                    channel_by: str = "chunk") -> list[LimitViolation]:
    """The limits of ``runtime`` that ``lower(algorithm, runtime=runtime, ...)`` will certainly
    exceed, from :func:`estimate_figures`; empty when none is certain (the lowered program is
    then checked exactly).

    A direct allgather on 40 fully connected ranks needs a threadblock per peer, 39 of them sending
    on the one channel all its chunks use:

    >>> from collsynth.algorithm import Algorithm, Send, Step
    >>> from collsynth.collective import allgather
    >>> from collsynth.topology import get_topology
    >>> n = 40
    >>> direct = Algorithm("direct", get_topology(f"fully-connected:{n}"), allgather(n),
    ...                    (Step(n, tuple(Send(r, r, d) for r in range(n) for d in range(n)
    ...                                   if d != r)),))
    >>> for violation in estimate_limits(direct, "rccl"):
    ...     print(violation)  # doctest: +NORMALIZE_WHITESPACE
    MSCCL_MAX_NUM_THREAD_BLOCKS_PER_CHANNEL: rccl allows 32 sending threadblocks per channel;
      rank 0 on channel 0 needs 39 (1.2x the limit, 7 over; 40 of 40 ranks)
    MSCCL_MAX_NUM_THREAD_BLOCKS_PER_CHANNEL: rccl allows 32 receiving threadblocks per channel;
      rank 0 on channel 0 needs 39 (1.2x the limit, 7 over; 40 of 40 ranks)
    >>> [v.limit for v in estimate_limits(direct, "rccl", channels=2)]
    ['MSCCL_MAX_NUM_THREAD_BLOCKS_PER_CHANNEL']
    """
    figures = estimate_figures(algorithm, runtime, channels=channels, instances=instances,
                               inplace=inplace, outofplace=outofplace, channel_by=channel_by)
    return [] if figures is None else find_limit_violations(figures, runtime)


def estimate_all(algorithm: Algorithm, runtimes: Sequence[str] | None = None, *,
                 channels: int = 1, instances: int = 1, inplace: bool = False,
                 outofplace: bool = True, channel_by: str = "chunk", predict: bool = False
                 ) -> dict[str, list[LimitViolation]]:
    """:func:`estimate_limits` for several runtimes (default: all), reading the sends once and
    computing the figures once per distinct (fused ops when there are reductions, ``cnt``
    limit) pair. With ``predict``, the limits the predicted figures exceed
    (:func:`estimate_figures`)."""
    names = [xml_dialect(runtime).name for runtime in (runtimes or runtime_names(MSCCL_XML))]
    sends = _send_table(algorithm)
    if sends is None:
        return {name: [] for name in names}
    reductions = bool(sends.reduce.any())
    cache: dict[tuple[bool, int], LimitFigures] = {}
    result: dict[str, list[LimitViolation]] = {}
    for name in names:
        rt = xml_dialect(name)
        key = (rt.fused_ops or not reductions, rt.max_count)
        if key not in cache:
            cache[key] = _estimate(algorithm, sends, rt, channels, instances, inplace,
                                   outofplace, channel_by, predict)
        result[name] = find_limit_violations(cache[key], name)
    return result
