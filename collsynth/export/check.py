"""Check an MSCCL program: the runtimes' rules, then a symbolic execution of every rank.

The details: ``docs/export.md``, section "Checking a program".
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Any

import numpy as np

from collsynth.errors import InputTooLargeError, InvalidCollectiveError
from collsynth.export.program import (
    BUFFERS,
    FUSED_OPS,
    RECV_OPS,
    SEND_OPS,
    GpuProgram,
    Program,
    ThreadBlock,
)
from collsynth.runtimes import PROTOCOLS, Runtime, XmlDialect, xml_dialect
from collsynth.export.semantics import (
    MAX_REDUCE_FUSION,
    OPERANDS,
    Event,
    LoadedThreadblock,
    Scheduler,
    cnt_mismatch,
    load_threadblock,
    step_name,
)

__all__ = [
    "PROBLEM_KINDS",
    "COLLECTIVES",
    "ROOTED_COLLECTIVES",
    "MAX_CHECKED_THREADBLOCKS",
    "MAX_CHECKED_CHUNKS",
    "MAX_CHECKED_CONTRIBUTIONS",
    "MAX_CHECKED_CLOCK_ENTRIES",
    "MAX_CHECKED_RANKS",
    "UNVERIFIED_PREFIX",
    "is_unverified",
    "Problem",
    "RankStats",
    "CheckReport",
    "buffer_sizes",
    "layouts",
    "static_problems",
    "check_program",
]

#: Every ``Problem.kind``, with what it means (§N: sections of ``docs/msccl-xml.md``; §16.2 there
#: lists every kind with the rules it stands for).
PROBLEM_KINDS: dict[str, str] = {
    "lexical": "the runtimes' hand-written XML reader misreads or refuses the text (§2)",
    "structure": "a required attribute or element is missing, a name or id is unknown, "
                 "duplicated or out of range: the runtime refuses the file or cannot run it",
    "limit": "a value outside the range or above a limit the runtime accepts (§6, §7, §14.1)",
    "connection": "a (peer, channel, direction) used by two thread blocks, a connection declared "
                  "on one side only, or chan >= nchannels (§6.2, §11.1)",
    "dependency": "a depid/deps naming nothing or a flag that is never published, or a broken "
                  "nop rule (§9)",
    "unsupported-op": "a step type the runtime reads but cannot execute (ra anywhere; rcs, rrs, "
                      "rrc, rrcs on rccl)",
    "bounds": "an operand range outside the declared or the real buffer (§7.3, §8.1)",
    "message": "sends and receives that do not pair up: different cnt, or messages never "
               "received (§11.1)",
    "deadlock": "thread blocks that wait forever: a dependency cycle, a receive without a send",
    "race": "two accesses of one rank to one chunk from different thread blocks, at least one a "
            "write, with no dependency or message path between them (§12.6)",
    "uninitialised": "a step reads a chunk that neither the input nor an earlier step provides",
    "send-buffer-write": "an out-of-place program writes the caller's input buffer (§8.2)",
    "postcondition": "the output is not what the collective requires, or was not checked "
                     "(§12.7)",
}

#: Collective names ``check_program(collective=...)`` accepts (both spellings of reduce-scatter).
COLLECTIVES = ("allreduce", "allgather", "reduce_scatter", "reducescatter", "alltoall",
               "broadcast", "reduce", "gather", "scatter")
#: Collectives with a root.
ROOTED_COLLECTIVES = frozenset({"broadcast", "reduce", "gather", "scatter"})

#: Thread blocks (all ranks together) above which a program is not executed symbolically.
MAX_CHECKED_THREADBLOCKS = 16384
#: Chunks (all buffers of all ranks together) above which a program is not executed.
MAX_CHECKED_CHUNKS = 4_000_000
#: Contributions the symbolic execution may move and compare above which a program is not
#: executed: each step moves ``cnt`` chunks whose values list up to ``ngpus`` contributions in a
#: combining collective, and the postcondition compares every output chunk's. About 0.3 us
#: each on a 2-core machine (a 128-rank ring allreduce: 12.5M, 3.7 s), so 5 * 10^7 answer within
#: 20 s; a 1024-rank allreduce needs billions.
MAX_CHECKED_CONTRIBUTIONS = 50_000_000
#: Vector-clock entries the execution updates (steps x thread blocks, one int32 each per step)
#: above which a program is not executed: 2 * 10^9 take about 20 s.
MAX_CHECKED_CLOCK_ENTRIES = 2_000_000_000

# Reader and loader figures of §2 and §14.1 that the runtimes' XmlDialect does not carry.
_MAX_NODES = 4096           # nodes the reader stores for the loading rank, inclusive (§2.5)
_SHOWN_MISSING = 8          # ranks without a <gpu> named one by one; the rest counted
_MAX_SUBS = 1024            # children of one node
#: Most ranks (``ngpus``) of a program: the reader keeps 1024 children per element (MAX_SUBS),
#: so a file for more ranks cannot hold a <gpu> per rank; such a program is refused (a limit
#: problem) before any per-rank state is built (ngpus="100000" ran for minutes).
MAX_CHECKED_RANKS = _MAX_SUBS
#: How a problem that says the postcondition could not be checked (coll="custom" without a
#: collective, a collective without a postcondition here, several roots that fit) begins: the
#: program may be correct; consumers that only need a readable program accept it.
UNVERIFIED_PREFIX = "postcondition not checked"
_MAX_DEPID = 127            # depid is stored in an int8
_OFFSET_RANGE = (-32768, 32767)  # offsets are stored in an int16

#: Which operands the parsers bound-check (§7.3).
_PARSER_CHECKED = {"s": ("src",), "r": ("dst",), "rcs": ("dst",), "rrs": ("src",), "rrc": (),
                   "rrcs": ("src", "dst"), "cpy": ("src", "dst"), "re": ("src", "dst"),
                   "ra": ("src", "dst"), "nop": ()}
_CANONICAL = {"reducescatter": "reduce_scatter"}
# How many problems of one kind one execution reports before summarising the rest.
_SHOWN_PER_KIND = 12


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a program.

    ``kind`` is a key of :data:`PROBLEM_KINDS`; ``line`` the source line it is about (``None``
    for a program that was not read from a file, or for the ``<algo>`` element).
    """

    kind: str
    message: str
    line: int | None = None

    def __str__(self) -> str:
        where = f"line {self.line}: " if self.line is not None else ""
        return f"{where}{self.kind}: {self.message}"


@dataclass(frozen=True)
class RankStats:
    """What one rank's program contains, as the runtime loads it."""

    rank: int
    threadblocks: int
    steps: int          # <step> elements, nop included
    transfers: int      # after folding nops and fusing re chains
    sends: int          # send-type steps
    receives: int       # receive-type steps
    scratch_chunks: int


@dataclass(frozen=True)
class CheckReport:
    """The verdict of :func:`check_program`.

    ``ok`` is true when there is no problem; ``warnings`` are problems of the kinds in
    :data:`WARNING_KINDS`, reported apart unless the check was strict. ``layouts_checked`` names the buffer layouts
    executed (``"in-place"``, ``"out-of-place"``); ``collective`` is the postcondition used
    (``None`` when none could be) and ``root`` its root, given or inferred.
    """

    ok: bool
    problems: tuple[Problem, ...]
    layouts_checked: tuple[str, ...]
    runtime: str
    collective: str | None
    root: int | None
    rank_stats: tuple[RankStats, ...] = ()
    warnings: tuple[Problem, ...] = ()


# -- sizes and layouts -----------------------------------------------------------------------------


def _canonical(coll: str) -> str:
    return _CANONICAL.get(coll, coll)


def buffer_sizes(coll: str, ngpus: int, nchunksperloop: int) -> tuple[int, int]:
    """Real sizes ``(input, output)`` in chunks of one rank's buffers (§8.1).

    >>> buffer_sizes("allgather", 4, 8)
    (2, 8)
    >>> buffer_sizes("reduce_scatter", 4, 8)
    (8, 2)
    """
    n, big = max(ngpus, 1), nchunksperloop
    key = _canonical(coll)
    if key == "allgather":
        return big // n, big
    if key == "reduce_scatter":
        return big, big // n
    if key == "gather":
        return big, n * big
    if key == "scatter":
        return n * big, big
    return big, big


def layouts(program: Program, runtime: str | Runtime) -> tuple[str, ...]:
    """The buffer layouts ``runtime`` may run ``program`` in (§12.8).

    msccl: the one ``inplace`` says (alltoall: always out-of-place); rccl and msccl-executor:
    in-place if ``inplace``, out-of-place if ``outofplace``.
    """
    rt = xml_dialect(runtime)
    if not rt.requires_range_attributes:
        if _canonical(program.coll) == "alltoall" or not program.inplace:
            return ("out-of-place",)
        return ("in-place",)
    found = []
    if program.inplace:
        found.append("in-place")
    if program.outofplace:
        found.append("out-of-place")
    return tuple(found)


# -- static rules ----------------------------------------------------------------------------------


def _at(line: int | None) -> str:
    return f" (line {line})" if line is not None else ""


@dataclass
class _Static:
    problems: list[Problem]
    loaded: dict[int, dict[int, LoadedThreadblock]]   # rank -> tb id -> loaded tb
    tbs: dict[int, dict[int, ThreadBlock]]    # rank -> tb id -> tb
    gpus: dict[int, GpuProgram]
    executable: bool                          # False: too broken to execute


def static_problems(program: Program, runtime: str | Runtime) -> list[Problem]:
    """Every static rule ``program`` breaks on ``runtime`` (no execution).

    Covers the checks the runtimes' loaders make (§14.2) and the static conditions of §12.1-§12.4
    that they do not: connection uniqueness and symmetry, ``chan < nchannels``, operand ranges
    against declared and real sizes, dependencies naming existing steps that publish a flag.
    """
    rt = xml_dialect(runtime)
    return _static(program, rt).problems


def _static(program: Program, rt: XmlDialect) -> _Static:  # noqa: C901 - one rule after another
    problems: list[Problem] = []
    executable = True

    def add(kind: str, message: str, line: int | None = None) -> None:
        problems.append(Problem(kind, message, line))

    n, big, coll = program.ngpus, program.nchunksperloop, program.coll
    key = _canonical(coll)

    # <algo>
    if program.proto not in PROTOCOLS:
        add("structure", f"proto={program.proto!r} is not one of {', '.join(PROTOCOLS)} (case "
                         f"sensitive); {rt.name} refuses the file")
    spellings = set(rt.collectives.values())
    if coll not in spellings:
        hint = ""
        other = {"reducescatter": "reduce_scatter", "reduce_scatter": "reducescatter"}.get(coll)
        if other in spellings:
            hint = f"; {rt.name} spells it {other!r}"
        elif coll == "custom":
            hint = "; custom collectives exist only in msccl"
        add("structure", f"coll={coll!r} is not a collective {rt.name} knows "
                         f"({', '.join(sorted(spellings))}){hint}")
    if program.nchannels < 1 or program.nchannels > rt.max_channels:
        add("limit", f"nchannels={program.nchannels} is outside 1..{rt.max_channels} "
                     f"({rt.name}'s MAXCHANNELS)")
    if big < 1:
        add("limit", f"nchunksperloop={big} must be >= 1")
        executable = False
    if n < 1:
        add("limit", f"ngpus={n} must be >= 1")
        executable = False
    if n > MAX_CHECKED_RANKS:
        add("limit", f"ngpus={n}: more than the {MAX_CHECKED_RANKS} ranks a file can describe "
                     f"(the runtimes' reader keeps {_MAX_SUBS} <gpu> children of <algo>)")
        executable = False
    if rt.requires_range_attributes:
        for attr, value in (("outofplace", program.outofplace), ("minBytes", program.min_bytes),
                            ("maxBytes", program.max_bytes)):
            if value is None:
                add("structure", f"<algo> has no {attr} attribute; {rt.name} requires it "
                                 f"('Attribute {attr} of node algo not found')")
        if not program.inplace and not program.outofplace:
            add("structure", f"inplace=0 and outofplace=0: {rt.name} never selects this "
                             "algorithm")
    else:
        if program.nthreads is not None and (program.nthreads <= 0 or program.nthreads % 32):
            add("limit", f"nthreads={program.nthreads} must be a positive multiple of 32")
        lo, hi = program.min_bytes, program.max_bytes
        if (lo is not None and lo < 0) or (hi is not None and hi < 0):
            add("limit", "minBytes and maxBytes must be >= 0")
        elif lo is not None and hi is not None and hi != 0 and lo > hi:
            add("limit", f"minBytes={lo} > maxBytes={hi}")
        if hi == 0:
            add("limit", "maxBytes=0: msccl's upper bound is exclusive, so it never selects this "
                         "algorithm (0 means unlimited only for rccl); omit maxBytes for the "
                         "128 MiB default")
        if key == "alltoall" and program.name == "2D":
            add("structure", "an alltoall named '2D' makes msccl run its hard-coded 2-D alltoall "
                             "instead of this program; rename it")
    if n >= 1 and key in ("allgather", "reduce_scatter") and big % n:
        add("limit", f"nchunksperloop={big} is not a multiple of ngpus={n}: a rank's share of "
                     f"an {key} is nchunksperloop/ngpus chunks")
    if len(program.gpus) > _MAX_SUBS:
        add("limit", f"{len(program.gpus)} <gpu> elements; the reader keeps at most {_MAX_SUBS} "
                     "children per element")

    # <gpu>
    gpus: dict[int, GpuProgram] = {}
    for gpu in program.gpus:
        if not 0 <= gpu.id < max(n, 0):
            add("structure", f"<gpu id={gpu.id}> is not a rank of ngpus={n}", gpu.line)
            continue
        if gpu.id in gpus:
            add("structure", f"a second <gpu id={gpu.id}> (first at line {gpus[gpu.id].line}): "
                             "the runtime loads both, later tbs overwrite earlier ones", gpu.line)
            executable = False
            continue
        gpus[gpu.id] = gpu
    # ngpus comes from the file: count the missing ranks instead of walking range(ngpus), which
    # a hostile ngpus (2**63) would make endless; name the first few.
    missing = max(n, 0) - len(gpus)
    if missing:
        first = [r for r in range(min(max(n, 0), len(gpus) + _SHOWN_MISSING)) if r not in gpus]
        for r in first[:_SHOWN_MISSING]:
            add("structure", f"rank {r} has no <gpu> element: it would run an empty program")
        if missing > _SHOWN_MISSING:
            add("structure", f"{missing - _SHOWN_MISSING} more of the ngpus={n} ranks have no "
                             "<gpu> element")

    real_in, real_out = buffer_sizes(coll, n, big) if n >= 1 and big >= 1 else (0, 0)
    tbs: dict[int, dict[int, ThreadBlock]] = {}
    loaded: dict[int, dict[int, LoadedThreadblock]] = {}
    for r, gpu in sorted(gpus.items()):
        ok, tb_map = _gpu_rules(program, rt, gpu, real_in, real_out, add)
        executable &= ok
        tbs[r] = tb_map
        loaded[r] = {tid: load_threadblock(tb) for tid, tb in tb_map.items()}
        _dependency_rules(r, tb_map, loaded[r], add)
    _connection_rules(program, gpus, add)
    if not rt.fused_ops:
        fused = [(gpu.id, tb.id, pos, st) for gpu in program.gpus for tb in gpu.threadblocks
                 for pos, st in enumerate(tb.steps) if st.type in FUSED_OPS]
        if fused:
            r, tid, pos, st = fused[0]
            kinds = Counter(f[3].type for f in fused)
            add("unsupported-op", f"{rt.name} refuses to launch algorithms with rcs, rrs, rrc or "
                                  "rrcs steps (built without the full ops); this one has "
                                  + ", ".join(f"{c} {k}" for k, c in sorted(kinds.items()))
                                  + f" (first: {step_name(r, tid, pos)})", st.line)
    return _Static(_capped(problems), loaded, tbs, gpus, executable)


def _capped(problems: list[Problem], shown: int = 3 * _SHOWN_PER_KIND) -> list[Problem]:
    """At most ``shown`` problems of each kind, then one line counting the rest."""
    counts: Counter = Counter()
    kept = []
    for p in problems:
        counts[p.kind] += 1
        if counts[p.kind] <= shown:
            kept.append(p)
    for kind, count in counts.items():
        if count > shown:
            kept.append(Problem(kind, f"... and {count - shown} more {kind} problems like the "
                                      "ones above"))
    return kept


def _gpu_rules(program: Program, rt: XmlDialect, gpu: GpuProgram, real_in: int, real_out: int,
               add) -> tuple[bool, dict[int, ThreadBlock]]:
    """The rules of one <gpu>, its tbs and steps; returns (executable, tbs by id)."""
    n, big, r = program.ngpus, program.nchunksperloop, gpu.id
    executable = True
    declared = {"i": gpu.i_chunks, "o": gpu.o_chunks, "s": gpu.s_chunks}
    for buf, attr in (("i", "i_chunks"), ("o", "o_chunks"), ("s", "s_chunks")):
        if declared[buf] < 0:
            add("limit", f"rank {r}: {attr}={declared[buf]} must be >= 0", gpu.line)
    if rt.name == "msccl":
        in_mult = n if program.coll == "allgather" else 1
        out_mult = n if program.coll == "reduce_scatter" else 1
        for attr, value, mult in (("i_chunks", gpu.i_chunks, in_mult),
                                  ("o_chunks", gpu.o_chunks, out_mult)):
            if value > 0 and value * mult != big:
                want = big // mult if big % mult == 0 else f"nchunksperloop/{mult}"
                add("limit", f"rank {r}: {attr}={value} but msccl requires 0 or {want} for "
                             f"{program.coll} with nchunksperloop={big} ('Inconsistency between "
                             "i_chunks/o_chunks and nchunksperloop')", gpu.line)
    for attr, value, real, name in (("i_chunks", gpu.i_chunks, real_in, "input"),
                                    ("o_chunks", gpu.o_chunks, real_out, "output")):
        if value > real:
            add("bounds", f"rank {r}: {attr}={value} but the {name} buffer of {program.coll} "
                          f"with ngpus={n}, nchunksperloop={big} holds {real} chunks",
                gpu.line)

    tb_map: dict[int, ThreadBlock] = {}
    for tb in gpu.threadblocks:
        if tb.id < 0 or tb.id >= rt.max_threadblocks:
            add("limit", f"rank {r}: tb id {tb.id} is outside 0..{rt.max_threadblocks - 1}",
                tb.line)
            executable = False
        elif tb.id in tb_map:
            add("structure", f"rank {r}: duplicate tb id {tb.id} (first at line "
                             f"{tb_map[tb.id].line})", tb.line)
            executable = False
        else:
            tb_map[tb.id] = tb
    if tb_map:
        missing = [i for i in range(max(tb_map) + 1) if i not in tb_map]
        if missing:
            add("structure", f"rank {r}: threadblock {missing[0]} is missing (tb ids must be "
                             f"0..T-1 without gaps)", gpu.line)
            executable = False
    nodes = 1 + len(program.gpus) + len(gpu.threadblocks) + sum(
        len(tb.steps) for tb in gpu.threadblocks)
    if nodes > _MAX_NODES:
        add("limit", f"rank {r}: the reader would store {nodes} nodes (algo, gpus, this rank's "
                     f"tbs and steps); it stores at most {_MAX_NODES}", gpu.line)

    senders: Counter = Counter()
    receivers: Counter = Counter()
    for tb in gpu.threadblocks:
        for peer, what in ((tb.send, "send"), (tb.recv, "recv")):
            if peer < -1 or peer == r or peer >= n:
                reason = ("is this tb's own rank" if peer == r else
                          f"is not -1 or a rank of ngpus={n}")
                add("structure", f"rank {r} tb {tb.id}: {what}={peer} {reason}", tb.line)
                executable = False
        if tb.chan < 0 or tb.chan >= rt.max_channels:
            add("limit", f"rank {r} tb {tb.id}: chan={tb.chan} is outside "
                         f"0..{rt.max_channels - 1} ({rt.name}'s MAXCHANNELS)", tb.line)
        elif tb.chan >= program.nchannels:
            add("connection", f"rank {r} tb {tb.id}: chan={tb.chan} but nchannels="
                              f"{program.nchannels}: the runtime sets up no connection on that "
                              "channel", tb.line)
        if tb.send >= 0:
            senders[tb.chan] += 1
        if tb.recv >= 0:
            receivers[tb.chan] += 1
        if len(tb.steps) > rt.max_steps_per_tb:
            add("limit", f"rank {r} tb {tb.id}: {len(tb.steps)} steps; {rt.name} allows "
                         f"{rt.max_steps_per_tb} per tb", tb.line)
        for pos, st in enumerate(tb.steps):
            executable &= _step_rules(rt, r, tb, pos, st, declared, add)
    for counts, what in ((senders, "sending"), (receivers, "receiving")):
        for chan, count in sorted(counts.items()):
            if count > rt.max_tbs_per_channel:
                add("limit", f"rank {r}: {count} tbs {what} on channel {chan}; at most "
                             f"{rt.max_tbs_per_channel}", gpu.line)
    return executable, tb_map


def _step_rules(rt: XmlDialect, r: int, tb: ThreadBlock, pos: int, st, declared: dict[str, int],
                add) -> bool:
    """The rules of one step; returns False when the step cannot be executed at all."""
    where, line = step_name(r, tb.id, pos), st.line
    executable = True
    if st.type == "ra":
        if rt.name == "msccl":
            add("unsupported-op", f"{where}: type 'ra' is parsed by msccl but its interpreter has "
                                  "no implementation: the thread block returns early", line)
        else:
            add("structure", f"{where}: unknown step type 'ra' ({rt.name} refuses the file)",
                line)
    elif st.type not in OPERANDS:
        add("structure", f"{where}: unknown step type {st.type!r} ('type of transfer is not "
                         "supported')", line)
    for attr, buf in (("srcbuf", st.srcbuf), ("dstbuf", st.dstbuf)):
        if buf not in BUFFERS:
            add("structure", f"{where}: {attr}={buf!r} is not i, o or s ('type of buffer is not "
                             "supported'; checked even for unused operands)", line)
            executable = False
    if not 0 <= st.s < rt.max_steps_per_tb:
        add("limit", f"{where}: s={st.s} is outside 0..{rt.max_steps_per_tb - 1}", line)
    if st.type == "nop" or st.type not in OPERANDS:
        return executable
    if not 0 <= st.cnt < rt.max_count:
        add("limit", f"{where}: cnt={st.cnt} is outside 0..{rt.max_count - 1}", line)
        executable = False  # the runtime refuses it; executing cnt=10**23 chunks would not end
    elif st.cnt == 0:
        add("limit", f"{where}: cnt=0 moves nothing (and msccl writes before an array for "
                     "send/recv steps); use cnt >= 1", line)
    if st.hasdep not in (0, 1):
        add("limit", f"{where}: hasdep={st.hasdep} must be 0 or 1", line)
    if st.type in SEND_OPS and tb.send < 0:
        add("structure", f"{where}: a {st.type!r} step sends, but tb {tb.id} has send=-1", line)
        executable = False
    if st.type in RECV_OPS and tb.recv < 0:
        add("structure", f"{where}: a {st.type!r} step receives, but tb {tb.id} has recv=-1",
            line)
        executable = False
    lo, hi = _OFFSET_RANGE
    for attr, off in (("srcoff", st.srcoff), ("dstoff", st.dstoff)):
        if not lo <= off <= hi:
            add("limit", f"{where}: {attr}={off} does not fit the runtime's int16 offset", line)
    if st.depid > _MAX_DEPID:
        add("limit", f"{where}: depid={st.depid} does not fit the runtime's int8 tb index", line)
    for operand in OPERANDS[st.type]:
        buf, off = (st.srcbuf, st.srcoff) if operand == "src" else (st.dstbuf, st.dstoff)
        if buf not in declared:
            continue
        size = declared[buf]
        attr = f"{operand}off"
        if operand in _PARSER_CHECKED[st.type] and not -1 <= off < size:
            add("bounds", f"{where}: {attr}={off} is outside {buf}_chunks={size}; the runtime's "
                          "reader refuses it ('Incorrect offset set')", line)
        elif off < 0 or off + st.cnt > size:
            add("bounds", f"{where}: {operand} {buf}[{off}..{off + st.cnt}) is outside "
                          f"{buf}[0..{size}) ({buf}_chunks={size})", line)
    return executable


def _dependency_rules(r: int, tb_map: dict[int, ThreadBlock],
                      loaded: dict[int, LoadedThreadblock], add) -> None:
    published = {tid: [t.counter for t in lt.transfers if t.hasdep == 1]
                 for tid, lt in loaded.items()}
    for tid, lt in sorted(loaded.items()):
        steps = tb_map[tid].steps
        for pos in lt.chain_errors:
            add("dependency", f"{step_name(r, tid, pos)}: nop steps before it carry "
                              "dependencies, so it must have its own depid >= 0 (the runtimes "
                              "refuse: 'when there is a chain of dependences, the last reduction "
                              "must be a part of the first immediate instruction')",
                steps[pos].line)
        for depid, deps, pos in lt.ignored:
            add("dependency", f"{step_name(r, tid, pos)}: a trailing nop waits for tb {depid} "
                              f"step {deps}, but no real step follows it: the runtimes ignore "
                              "that dependency", steps[pos].line)
        for t in lt.transfers:
            if len(t.srcoffs) > MAX_REDUCE_FUSION:
                add("limit", f"{step_name(r, tid, t.positions[0])}: {len(t.srcoffs)} re steps "
                             f"fuse into one reduction; the interpreter holds "
                             f"{MAX_REDUCE_FUSION} sources", t.lines[0])
            for depid, deps, pos in t.deps:
                where, line = step_name(r, tid, pos), steps[pos].line
                if depid not in tb_map:
                    add("dependency", f"{where}: depid={depid} names no tb of rank {r} "
                                      f"(it has {len(tb_map)})", line)
                    continue
                if steps[pos].deps < 0:
                    add("dependency", f"{where}: depid={depid} with deps={steps[pos].deps}: the "
                                      f"runtimes wait for tb {depid}'s first flag of the "
                                      "iteration, as for deps=0; write the awaited step's "
                                      "position", line)
                target = published[depid]
                if not target or target[-1] < deps:
                    add("dependency", f"{where}: waits for tb {depid} step {deps}, but tb "
                                      f"{depid} publishes no flag at or after that step (no "
                                      f"hasdep=1 there): the wait never ends", line)


def _connection_rules(program: Program, gpus: dict[int, GpuProgram], add) -> None:
    n = program.ngpus
    sends: dict[tuple[int, int, int], list[ThreadBlock]] = defaultdict(list)
    recvs: dict[tuple[int, int, int], list[ThreadBlock]] = defaultdict(list)
    for r, gpu in sorted(gpus.items()):
        for tb in gpu.threadblocks:
            if 0 <= tb.send < n and tb.send != r:
                sends[(r, tb.send, tb.chan)].append(tb)
            if 0 <= tb.recv < n and tb.recv != r:
                recvs[(tb.recv, r, tb.chan)].append(tb)
    for table, what, rank_of in ((sends, "send to", 0), (recvs, "receive from", 1)):
        for conn, users in table.items():
            if len(users) > 1:
                r, peer = conn[rank_of], conn[1 - rank_of]
                ids = ", ".join(str(tb.id) for tb in users)
                add("connection", f"rank {r}: tbs {ids} all {what} rank {peer} on channel "
                                  f"{conn[2]}; a (peer, channel, direction) is one connection, "
                                  "one FIFO, for one tb", users[1].line)
    for (a, b, c), users in sends.items():
        if (a, b, c) not in recvs:
            add("connection", f"rank {a} tb {users[0].id} sends to rank {b} on channel {c}, but "
                              f"rank {b} has no tb receiving from rank {a} on channel {c}",
                users[0].line)
    for (a, b, c), users in recvs.items():
        if (a, b, c) not in sends:
            add("connection", f"rank {b} tb {users[0].id} receives from rank {a} on channel "
                              f"{c}, but rank {a} has no tb sending to rank {b} on channel {c}",
                users[0].line)


# -- symbolic execution ----------------------------------------------------------------------------

_OOB = object()   # the value read outside a buffer (reported statically as a bounds problem)


def _add(a: tuple | None, b: tuple | None) -> tuple | None:
    """The reduction of two contribution multisets (sorted tuples); garbage stays garbage."""
    if a is None or b is None or a is _OOB or b is _OOB:
        return None
    return tuple(sorted(a + b))


class _Execution:
    """One symbolic execution of a program in one buffer layout."""

    def __init__(self, program: Program, static: _Static, layout: str) -> None:
        self.program, self.layout = program, layout
        n, big = program.ngpus, program.nchunksperloop
        self.n = n
        self.key = _canonical(program.coll)
        real_in, real_out = buffer_sizes(program.coll, n, big)
        in_place = layout == "in-place"
        self.problems: list[Problem] = []
        self._kind_counts: Counter = Counter()
        self._reported: set = set()

        # Thread blocks as the runtime loads them, numbered globally by the scheduler.
        self.sched = Scheduler(static.tbs, static.loaded)
        self.where, total = self.sched.where, self.sched.total

        # Memory: per rank one flat list; buffers map to (offset, size) in it (§8.2).
        self.maps: dict[int, dict[str, tuple[int, int]]] = {}
        self.mem: dict[int, list] = {}
        self.writer: dict[int, list] = {}      # last write: (gid, epoch, pos, line)
        self.readers: dict[int, list] = {}     # reads since: {gid: (epoch, pos, line)}
        for r in range(n):
            gpu = static.gpus.get(r)
            scratch = max(gpu.s_chunks, 0) if gpu is not None else 0
            if in_place:
                i_off, o_off, shared = _aliasing(self.key, r, n, big, real_in, real_out)
            else:
                i_off, o_off, shared = 0, real_in, real_in + real_out
            self.maps[r] = {"i": (i_off, real_in), "o": (o_off, real_out), "s": (shared, scratch)}
            size = shared + scratch
            memory = [None] * size
            for k in range(real_in):
                memory[i_off + k] = ((r, k),)
            self.mem[r] = memory
            self.writer[r] = [None] * size
            self.readers[r] = [None] * size

        # Happens-before: one vector clock per running tb, a snapshot per published flag.
        self.clock: list[np.ndarray | None] = [None] * total
        self.pub_clock: dict[int, np.ndarray] = {}   # event index -> clock
        self.total = total

    # -- problems ----------------------------------------------------------------------------------

    def report(self, kind: str, message: str, line: int | None, *, once=None) -> None:
        if once is not None:
            if once in self._reported:
                return
            self._reported.add(once)
        self._kind_counts[kind] += 1
        if self._kind_counts[kind] <= _SHOWN_PER_KIND:
            self.problems.append(Problem(kind, message, line))

    def summarise(self) -> None:
        for kind, count in self._kind_counts.items():
            if count > _SHOWN_PER_KIND:
                self.problems.append(Problem(kind, f"... and {count - _SHOWN_PER_KIND} more "
                                                   f"{kind} problems like the ones above"))

    # -- memory with race tracking -----------------------------------------------------------------

    def _access(self, g: int, epoch: int, clk: np.ndarray, buf: str, k: int, write: bool,
                pos: int, line: int | None) -> int | None:
        """Record one access for the race check; return the physical index (None outside)."""
        r = self.where[g][0]
        offset, size = self.maps[r][buf]
        if not 0 <= k < size:
            return None
        p = offset + k
        last = self.writer[r][p]
        verb = "writes" if write else "reads"
        if last is not None and last[0] != g and clk[last[0]] < last[1]:
            self._race(g, pos, line, verb, last, "writes", r, buf, k)
        readers = self.readers[r][p]
        if write:
            if readers:
                for h, (e, hpos, hline) in readers.items():
                    if h != g and clk[h] < e:
                        self._race(g, pos, line, verb, (h, e, hpos, hline), "reads", r, buf, k)
            self.readers[r][p] = None
            self.writer[r][p] = (g, epoch, pos, line)
        else:
            if readers is None:
                readers = self.readers[r][p] = {}
            readers[g] = (epoch, pos, line)
        return p

    def _race(self, g: int, pos: int, line: int | None, verb: str, other, other_verb: str,
              r: int, buf: str, k: int) -> None:
        h, _, hpos, hline = other
        key = ("race", min((g, pos), (h, hpos)), max((g, pos), (h, hpos)))
        self.report("race", f"rank {r}: tb {self.where[h][1]} step {hpos}{_at(hline)} "
                            f"{other_verb} {buf}[{k}] and tb {self.where[g][1]} step {pos}"
                            f"{_at(line)} {verb} it, with no dependency or message ordering "
                            "them", hline if hline is not None else line, once=key)

    def _read(self, g: int, epoch: int, clk, buf: str, k: int, pos: int, line, what: str):
        p = self._access(g, epoch, clk, buf, k, False, pos, line)
        r, tid = self.where[g]
        if p is None:
            return _OOB
        value = self.mem[r][p]
        if value is None:
            self.report("uninitialised", f"{step_name(r, tid, pos)} reads {buf}[{k}] ({what}) "
                                         "before anything was written there", line,
                        once=("uninit", g, pos))
        return value

    def _write(self, g: int, epoch: int, clk, buf: str, k: int, value, pos: int, line) -> None:
        r, tid = self.where[g]
        if buf == "i" and self.layout == "out-of-place":
            self.report("send-buffer-write", f"{step_name(r, tid, pos)} writes i[{k}]: an "
                                             "out-of-place call must not change the caller's "
                                             "input buffer", line, once=("sbw", g, pos))
        p = self._access(g, epoch, clk, buf, k, True, pos, line)
        if p is not None:
            self.mem[r][p] = None if value is _OOB else value

    # -- execution -------------------------------------------------------------------------------

    def run(self) -> None:
        self.sched.run(self._execute)

    def _execute(self, event: Event, message: tuple | None) -> tuple[list, np.ndarray] | None:
        """Run one transfer on symbolic values; ``message`` and the result are what it receives
        and sends: (values, the sender's clock)."""
        g, t = event.gid, event.transfer
        clk = self.clock[g]
        if clk is None:
            clk = self.clock[g] = np.zeros(self.total, dtype=np.int32)
        for e in event.after_deps:
            np.maximum(clk, self.pub_clock[e], out=clk)
        if message is not None:
            np.maximum(clk, message[1], out=clk)
        clk[g] += 1
        epoch = int(clk[g])
        cnt = t.cnt
        incoming = None
        if message is not None:
            sent = event.received.transfer.cnt
            if sent != cnt:
                self.report("message", cnt_mismatch(event), t.lines[0])
            incoming = [message[0][c] if c < sent else None for c in range(cnt)]

        def read(buf: str, off: int, what: str, at: int = 0) -> list:
            p, ln = t.positions[at], t.lines[at]
            return [self._read(g, epoch, clk, buf, off + c, p, ln, what) for c in range(cnt)]

        def write(buf: str, off: int, values: list, at: int = 0) -> None:
            p, ln = t.positions[at], t.lines[at]
            for c in range(cnt):
                self._write(g, epoch, clk, buf, off + c, values[c], p, ln)

        out = None
        kind = t.type
        src, dst = (t.srcbuf, t.srcoffs[0]), (t.dstbuf, t.dstoff)
        if kind == "s":
            out = read(*src, "sent")
        elif kind == "r":
            write(*dst, incoming)
        elif kind == "rcs":
            write(*dst, incoming)
            out = incoming
        elif kind in ("rrs", "rrc", "rrcs"):
            local = read(*src, "the local operand of the reduction")
            combined = [_add(a, b) for a, b in zip(incoming, local)]
            if kind != "rrs":
                write(*dst, combined)
            if kind != "rrc":
                out = combined
        elif kind == "cpy":
            write(*dst, read(*src, "copied"))
        elif kind == "re":
            # A fused chain (§10): DST <- DST + SRC_1 + ... + SRC_k in one pass, with the
            # cnt of its last step; each source read is its own step's.
            acc = read(*dst, "the destination of the reduction")
            for at, off in enumerate(t.srcoffs):
                acc = [_add(a, b) for a, b in zip(acc, read(t.srcbuf, off, "reduced", at))]
            write(*dst, acc, len(t.srcoffs) - 1)
        if t.hasdep == 1:
            self.pub_clock[event.index] = clk.copy()
        if event.position == len(self.sched.transfers[g]) - 1:
            self.clock[g] = None   # no longer needed: snapshots hold what others use
        return (out, clk.copy()) if out is not None else None

    def finish(self) -> None:
        """Report deadlocked thread blocks and messages nobody received."""
        for message, line in self.sched.explain_deadlock():
            self.report("deadlock", message, line)
        for message, line in self.sched.unreceived():
            self.report("message", message, line)

    def output(self, r: int, k: int):
        offset, size = self.maps[r]["o"]
        return self.mem[r][offset + k] if 0 <= k < size else None

    def output_line(self, r: int, k: int) -> int | None:
        offset, size = self.maps[r]["o"]
        last = self.writer[r][offset + k] if 0 <= k < size else None
        return last[3] if last is not None else None


def _aliasing(key: str, r: int, n: int, big: int, real_in: int, real_out: int
              ) -> tuple[int, int, int]:
    """In-place layout: (offset of i, offset of o, size of the shared region) (§8.2)."""
    if key == "allgather":
        return r * (big // n), 0, real_out
    if key == "gather":
        return r * big, 0, real_out
    if key == "reduce_scatter":
        return 0, r * (big // n), real_in
    if key == "scatter":
        return 0, r * big, real_in
    return 0, 0, max(real_in, real_out)


# -- postconditions (§12.7) ------------------------------------------------------------------------


def _expected(key: str, r: int, n: int, big: int, root: int | None, custom: bool
              ) -> list[tuple[int, tuple, bool]]:
    """(output index, expected contributions, may be left unwritten) for rank ``r``."""
    m = big // n if n else 0
    everyone = range(n)
    if key == "allreduce":
        return [(j, tuple((q, j) for q in everyone), False) for j in range(big)]
    if key == "allgather":
        return [(q * m + i, ((q, i),), False) for q in everyone for i in range(m)]
    if key == "reduce_scatter":
        return [(j, tuple((q, r * m + j) for q in everyone), False) for j in range(m)]
    if key == "alltoall":
        return [(q * m + i, ((q, r * m + i),), False) for q in everyone for i in range(m)]
    if key == "broadcast":
        # msccl-tools' custom broadcasts leave the root's output alone (their Check() wants it
        # untouched); a real broadcast writes it too.
        optional = custom and r == root
        return [(j, ((root, j),), optional) for j in range(big)]
    if key == "reduce":
        if r != root:
            return []
        return [(j, tuple((q, j) for q in everyone), False) for j in range(big)]
    per_rank = m if custom else big
    if key == "gather":
        return ([(q * per_rank + i, ((q, i),), False) for q in everyone for i in range(per_rank)]
                if r == root else [])
    if key == "scatter":
        return [(j, ((root, r * per_rank + j),), False) for j in range(per_rank)]
    raise InvalidCollectiveError(f"no postcondition for {key!r}")


def _describe(value: tuple) -> str:
    return "+".join(f"x({q},{j})" for q, j in value)


def _mismatch(r: int, k: int, value, expected: tuple) -> str:
    where = f"rank {r} o[{k}]"
    if value is None or value is _OOB:
        return f"{where} holds garbage (uninitialised or out-of-bounds data); expected " \
               f"{_describe(expected) if len(expected) <= 3 else f'{len(expected)} contributions'}"
    have, want = Counter(value), Counter(expected)
    parts = []
    for c, count in sorted(have.items()):
        if count > 1 and want[c] <= 1:
            times = "twice" if count == 2 else f"{count} times"
            parts.append(f"contribution x({c[0]},{c[1]}) counted {times} at {where}")
    missing = sorted((want - have).elements())
    extra = sorted(c for c in have if c not in want)
    if len(expected) == 1 and not parts:
        return f"{where} holds {_describe(value)}, expected {_describe(expected)}"
    if missing:
        parts.append(f"{where} lacks {_describe(tuple(missing[:6]))}"
                     + (f" (and {len(missing) - 6} more)" if len(missing) > 6 else ""))
    if extra:
        parts.append(f"{where} has unexpected {_describe(tuple(extra[:6]))}"
                     + (f" (and {len(extra) - 6} more)" if len(extra) > 6 else ""))
    if not parts:
        parts.append(f"{where} holds {_describe(value)}, expected {_describe(expected)}")
    return "; ".join(parts)


def _failures(run: _Execution, key: str, root: int | None, custom: bool
              ) -> list[tuple[int, int, Any, tuple]]:
    """(rank, output index, value held, value expected) for every output chunk that breaks
    the postcondition. Messages are left to the caller: a program can break millions of
    chunks, and only a few are described."""
    n, big = run.n, run.program.nchunksperloop
    bad = []
    # An allreduce expects the same at every rank: built once (n*big contributions each time).
    shared = _expected(key, 0, n, big, root, custom) if key == "allreduce" else None
    for r in range(n):
        expected = shared if shared is not None else _expected(key, r, n, big, root, custom)
        for k, want, optional in expected:
            value = run.output(r, k)
            if value == want or (optional and value is None):
                continue
            bad.append((r, k, value, want))
    return bad


# -- the entry point -------------------------------------------------------------------------------


def _rank_stats(static: _Static) -> tuple[RankStats, ...]:
    stats = []
    for r, gpu in sorted(static.gpus.items()):
        steps = [st for tb in gpu.threadblocks for st in tb.steps]
        stats.append(RankStats(
            rank=r, threadblocks=len(gpu.threadblocks), steps=len(steps),
            transfers=sum(len(lt.transfers) for lt in static.loaded.get(r, {}).values()),
            sends=sum(st.type in SEND_OPS for st in steps),
            receives=sum(st.type in RECV_OPS for st in steps),
            scratch_chunks=gpu.s_chunks))
    return tuple(stats)


def _merge(per_layout: dict[str, list[Problem]]) -> list[Problem]:
    """Problems of several layouts: once each, tagged with the layout when not in all."""
    merged: list[Problem] = []
    seen: set[Problem] = set()
    names = list(per_layout)
    for name in names:
        for p in per_layout[name]:
            if p in seen:
                continue
            seen.add(p)
            everywhere = all(p in per_layout[other] for other in names)
            merged.append(p if everywhere or len(names) == 1
                          else Problem(p.kind, f"{p.message} [{name} layout]", p.line))
    return merged


#: Problems that make a program violate the API contract without making its result wrong:
#: writing the caller's send buffer in an out-of-place call (msccl-tools' out-of-place
#: reduce-scatters do; §8.2). Warnings by default, errors with ``strict=True`` (the exporter
#: always checks strictly).
WARNING_KINDS = frozenset({"send-buffer-write"})


def check_program(program: Program, *, runtime: str, collective: str | None = None,
                  root: int | None = None, strict: bool = False) -> CheckReport:
    """Check ``program`` for ``runtime``: static rules, then symbolic execution (§12).

    Parameters
    ----------
    program:
        The program (from :func:`collsynth.export.xml_reader.read_program` or the exporter).
    runtime:
        ``"msccl"``, ``"rccl"`` or ``"msccl-executor"``: whose rules, limits and layouts apply.
    collective:
        The postcondition to check. Needed for ``coll="custom"`` (msccl-tools' conventions: a
        custom gather/scatter moves ``nchunksperloop/ngpus`` chunks per rank, a custom broadcast
        may leave the root's output alone); for other files it must agree with ``coll``.
    root:
        The root of a rooted collective; inferred from the result when exactly one root fits.

    Returns
    -------
    CheckReport
        ``ok`` only when there is no problem, the postcondition included.

    Raises
    ------
    UnknownNameError
        An unknown runtime.
    InvalidCollectiveError
        An unknown ``collective`` name, or a ``root`` that is not a rank.
    InputTooLargeError
        More than :data:`MAX_CHECKED_THREADBLOCKS` thread blocks or :data:`MAX_CHECKED_CHUNKS`
        chunks to execute.

    Examples
    --------
    A 2-rank out-of-place allgather (``docs/msccl-xml.md`` §18):

    >>> from collsynth.export.program import GpuProgram, Program, ThreadBlock, XmlStep
    >>> def gpu(r):
    ...     peer = 1 - r
    ...     ring = ThreadBlock(0, peer, peer, 0, (
    ...         XmlStep(0, "s", "i", 0, "o", r, 1), XmlStep(1, "r", "i", 0, "o", peer, 1)))
    ...     local = ThreadBlock(1, -1, -1, 0, (XmlStep(0, "cpy", "i", 0, "o", r, 1),))
    ...     return GpuProgram(r, 1, 2, 0, (ring, local))
    >>> ag = Program("ag2", "Simple", 1, 2, 2, "allgather", 0, (gpu(0), gpu(1)))
    >>> report = check_program(ag, runtime="msccl")
    >>> report.ok, report.layouts_checked
    (True, ('out-of-place',))
    """
    rt = xml_dialect(runtime)
    static = _static(program, rt)
    problems = list(static.problems)
    key = _canonical(program.coll)
    custom = key == "custom"
    wanted = _canonical(collective) if collective is not None else None
    if wanted is not None and wanted not in COLLECTIVES:
        raise InvalidCollectiveError(f"unknown collective {collective!r}; valid: "
                                     f"{', '.join(COLLECTIVES)}")
    if wanted is not None and not custom and wanted != key:
        problems.append(Problem("postcondition", f"the file says coll={program.coll!r} but the "
                                                 f"{collective} postcondition was asked for"))
    post = key if not custom else wanted
    checkable = post in {_canonical(c) for c in COLLECTIVES}
    if root is not None and not 0 <= root < max(program.ngpus, 0):
        raise InvalidCollectiveError(f"root {root} is not a rank of ngpus={program.ngpus}")
    if root is not None and checkable and post not in ROOTED_COLLECTIVES:
        raise InvalidCollectiveError(f"root {root} was given, but {post} has no root (rooted: "
                                     f"{', '.join(sorted(ROOTED_COLLECTIVES))})")

    names = layouts(program, rt)
    runs: list[_Execution] = []
    if static.executable and names:
        threadblocks = sum(len(t) for t in static.tbs.values())
        real_in, real_out = buffer_sizes(program.coll, program.ngpus, program.nchunksperloop)
        # Every one of the ngpus ranks gets its buffers in the execution, not only those with a
        # <gpu> element: a file claiming 100000 GPUs is refused here, before allocating.
        chunks = program.ngpus * (real_in + real_out) + sum(
            max(g.s_chunks, 0) for g in static.gpus.values())
        if threadblocks > MAX_CHECKED_THREADBLOCKS or chunks > MAX_CHECKED_CHUNKS:
            raise InputTooLargeError(
                f"{threadblocks} thread blocks and {chunks} chunks (ngpus={program.ngpus}, "
                f"nchunksperloop={program.nchunksperloop}); the checker executes at most "
                f"{MAX_CHECKED_THREADBLOCKS} and {MAX_CHECKED_CHUNKS}")
        _check_work(program, static, threadblocks, real_out, post if checkable else None)
        per_layout: dict[str, list[Problem]] = {}
        for name in names:
            run = _Execution(program, static, name)
            run.run()
            run.finish()
            run.summarise()
            runs.append(run)
            per_layout[name] = run.problems
        problems += _merge(per_layout)

    chosen_root = root
    if runs:
        if post is None:
            problems.append(Problem("postcondition", f"{UNVERIFIED_PREFIX}: pass --coll "
                                                     "for custom collectives (coll=\"custom\" "
                                                     "does not say which collective it is)"))
        elif not checkable:
            problems.append(Problem("postcondition", f"{UNVERIFIED_PREFIX}: collsynth "
                                                     f"has none for coll={program.coll!r}"))
        else:
            chosen_root, post_problems = _postcondition(runs, post, root, custom)
            problems += post_problems
    warnings = [] if strict else [p for p in problems if p.kind in WARNING_KINDS]
    problems = [p for p in problems if p not in warnings]
    return CheckReport(ok=not problems, problems=tuple(problems), warnings=tuple(warnings),
                       layouts_checked=tuple(r.layout for r in runs), runtime=rt.name,
                       collective=post if checkable else None,
                       root=chosen_root if post in ROOTED_COLLECTIVES else None,
                       rank_stats=_rank_stats(static))


def _check_work(program: Program, static: _Static, threadblocks: int, real_out: int,
                post: str | None) -> None:
    """Refuse, before executing, a program whose execution would move or compare more than
    :data:`MAX_CHECKED_CONTRIBUTIONS` contributions or update more than
    :data:`MAX_CHECKED_CLOCK_ENTRIES` vector-clock entries (per layout)."""
    n = program.ngpus
    combining = _canonical(program.coll) in _COMBINING or post in _COMBINING
    width = n if combining else 1      # contributions one chunk's value may list
    steps = moved = 0
    for tb_map in static.tbs.values():
        for tb in tb_map.values():
            steps += len(tb.steps)
            moved += sum(max(st.cnt, 0) for st in tb.steps)
    # The postcondition: every rank's output chunks (a rooted collective's: at most that).
    contributions = (moved + n * real_out) * width
    clock = steps * threadblocks
    if contributions > MAX_CHECKED_CONTRIBUTIONS or clock > MAX_CHECKED_CLOCK_ENTRIES:
        raise InputTooLargeError(
            f"executing {steps} steps over {threadblocks} thread blocks (ngpus={n}, "
            f"coll={program.coll!r}) moves and compares about {contributions} contributions and "
            f"{clock} clock entries; the checker executes at most {MAX_CHECKED_CONTRIBUTIONS} "
            f"and {MAX_CHECKED_CLOCK_ENTRIES}")


#: Collectives whose chunks' values list several contributions.
_COMBINING = frozenset({"allreduce", "reduce", "reduce_scatter"})


def is_unverified(problem: Problem) -> bool:
    """True for the problem that says the postcondition could not be checked
    (:data:`UNVERIFIED_PREFIX`): not a fault of the program."""
    return problem.kind == "postcondition" and problem.message.startswith(UNVERIFIED_PREFIX)


def _postcondition(runs: list[_Execution], key: str, root: int | None, custom: bool
                   ) -> tuple[int | None, list[Problem]]:
    n = runs[0].n
    note = ""
    if key in ROOTED_COLLECTIVES and root is None:
        fits = [q for q in range(n)
                if not any(_failures(run, key, q, custom) for run in runs)]
        if len(fits) == 1:
            root = fits[0]
        elif len(fits) > 1:
            return None, [Problem("postcondition", f"{UNVERIFIED_PREFIX} for one root: the "
                                                   f"{key} is correct for roots "
                                                   f"{', '.join(map(str, fits))}: pass --root to "
                                                   "say which one is meant")]
        else:
            counts = [sum(len(_failures(run, key, q, custom)) for run in runs) for q in range(n)]
            root = counts.index(min(counts))
            note = f" (for root {root}, the closest fit; pass --root to choose)"
    per_layout: dict[str, list[Problem]] = {}
    for run in runs:
        found = []
        bad = _failures(run, key, root, custom)
        for r, k, value, want in bad[:_SHOWN_PER_KIND]:
            found.append(Problem("postcondition", _mismatch(r, k, value, want) + note,
                                 run.output_line(r, k)))
        if len(bad) > _SHOWN_PER_KIND:
            found.append(Problem("postcondition", f"... and {len(bad) - _SHOWN_PER_KIND} more "
                                                  "wrong output chunks"))
        per_layout[run.layout] = found
    return root, _merge(per_layout)
