"""Readers for collective benchmark logs: nccl-tests (text and JSON), PARAM comms, plain CSV and
two-column bus-bandwidth tables.

Every reader returns a :class:`BenchmarkLog`: the collective, the number of ranks and one
:class:`BenchmarkRow` per measured (size, half) pair, in file order. Nothing is fitted here (see
:mod:`collsynth.timing.fit`); the rows are what the log says, in the log's own units.

The details: ``docs/timing.md``, section "Benchmark log formats (collsynth.timing.logs)".
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from collsynth.collective.kinds import KINDS, busbw_factor, canonical_name
from collsynth._files import read_bytes_bounded
from collsynth._parse import (
    MAX_GBPS,
    MAX_SIZE_BYTES,
    MAX_TIME_US,
    MIN_TIME_US,
    NumberTextError,
    bounded_float,
    bounded_int,
    clean_name,
    decode_text,
    int_from_text,
    number_text,
    parse_json,
    shown,
)
from collsynth.errors import FileFormatError, UnknownNameError

__all__ = [
    "BenchmarkRow",
    "BenchmarkLog",
    "MAX_LOG_BYTES",
    "LOG_FORMATS",
    "MAX_CSV_LINE_CHARS",
    "LOGGED_COLLECTIVES",
    "load_log",
    "split_runtime",
    "parse_log",
    "csv_rows",
    "csv_header",
    "canonical_collective",
]

#: Largest benchmark log read (bytes). Real logs are < 1 MiB; NCCL_DEBUG=INFO runs reach a few MiB.
MAX_LOG_BYTES = 64 * 1024 * 1024
#: The most ranks a log may claim (a sanity bound on header and JSON values).
_MAX_RANKS = 1 << 20
#: Values of :attr:`BenchmarkLog.source`.
LOG_FORMATS = ("nccl-tests", "nccl-tests-json", "param-comms", "csv", "busbw-table")

# Kinds a benchmark log may measure (collsynth.collective.kinds), their spellings in benchmark
# names and file names, and nccl-tests' bus-bandwidth factors (busbw = algbw * factor).
_LOGGED = {k.name: k for k in KINDS if k.roots != "many" and k.name != "send"}
_COLLECTIVE_NAMES = {s: k.name for k in _LOGGED.values() for s in (k.name, *k.spellings)}
_BUSBW_FACTORS = {name: kind.busbw for name, kind in _LOGGED.items()}
#: The collectives a benchmark log may measure (collsynth's names).
LOGGED_COLLECTIVES = tuple(sorted(_LOGGED))
# Longest spelling first, so "reduce_scatter" wins over "reduce" and "all_reduce" over "reduce".
_NAME_IN_FILE = re.compile(
    r"(?<![a-z0-9])(" + "|".join(sorted(map(re.escape, _COLLECTIVE_NAMES), key=len, reverse=True))
    + r")(?![a-z0-9])")


@dataclass(frozen=True)
class BenchmarkRow:
    """One measurement: a collective call on ``size_bytes`` bytes took ``time_us`` microseconds.

    Parameters
    ----------
    size_bytes:
        The buffer size as the benchmark prints it (nccl-tests convention, see
        :func:`collsynth.timing.alphabeta.base_chunk_bytes`).
    count:
        Elements (nccl-tests: of the buffer; PARAM: per rank), or ``None`` when not printed.
    dtype, op, root:
        Data type (``"float"``), reduction (``"sum"``) and root rank (nccl-tests prints ``-1`` for
        rootless collectives), each ``None`` when the log has no such cell.
    time_us:
        Microseconds per call (nccl-tests: mean; PARAM: the p50 latency across ranks; a busbw
        table: derived from its bus bandwidth, see docs/timing.md).
    algbw_gbps, busbw_gbps:
        The benchmark's own algorithm and bus bandwidths in GB/s (``None`` for ``N/A`` or absent);
        printed with two decimals, so use ``time_us`` for fitting.
    in_place:
        Whether the call was in place (nccl-tests prints both halves of each row).
    errors:
        nccl-tests' error column (``#wrong`` count, or the max error in old versions), ``None``
        for ``N/A`` (no data check) or when absent.
    line:
        1-based line number in the file (for JSON input: the line of the results entry when known,
        else 0).
    """

    size_bytes: int
    count: int | None
    dtype: str | None
    op: str | None
    root: int | None
    time_us: float
    algbw_gbps: float | None
    busbw_gbps: float | None
    in_place: bool
    errors: float | None
    line: int


@dataclass(frozen=True)
class BenchmarkLog:
    """The rows of one benchmark log.

    Parameters
    ----------
    path:
        The file read (or the name given to :func:`parse_log`).
    collective:
        collsynth's name of the collective (``"allreduce"``, ``"allgather"``,
        ``"reduce_scatter"``, ``"alltoall"``, ...): see :func:`canonical_collective`.
    ranks:
        Number of ranks that took part.
    rows:
        One row per (size, half), size-0 rows left out, in file order.
    source:
        Which reader read it: one of :data:`LOG_FORMATS`.
    zero_size_lines:
        Result lines of size 0 that were skipped.
    runtime, runtime_version:
        The runtime the log was measured with, lower case (``"nccl"``, ``"rccl"``, or what the
        caller said: ``"msccl"``...), and its version (``"2.18.3+hip6.0"``), each ``None`` when
        the log does not say (see docs/timing.md).
    channels:
        The runtime's channel count for the run, ``None`` when the log does not say.
    gpus_per_thread:
        How many GPUs each thread of the run drove (nccl-tests' ``nGpus``, its ``-g``), ``None``
        when the log does not say (usually one: a process per GPU).
    """

    path: str
    collective: str
    ranks: int
    rows: tuple[BenchmarkRow, ...]
    source: str
    zero_size_lines: int = 0
    runtime: str | None = None
    runtime_version: str | None = None
    channels: int | None = None
    gpus_per_thread: int | None = None

    @property
    def sizes(self) -> tuple[int, ...]:
        """The distinct sizes measured, ascending."""
        return tuple(sorted({row.size_bytes for row in self.rows}))

    @property
    def busbw_per_algbw(self) -> float:
        """nccl-tests' ``busbw / algbw`` for this collective and rank count
        (:func:`collsynth.collective.kinds.busbw_factor`); 1 for a collective nccl-tests has no
        bus-bandwidth convention for (busbw is then algbw)."""
        try:
            return float(busbw_factor(self.collective, self.ranks))
        except UnknownNameError:
            return 1.0


def canonical_collective(name: str) -> str:
    """collsynth's name of a collective spelt as nccl-tests, PARAM or a user writes it.

    Case-insensitive, ``-`` and ``_`` alike, a ``_perf`` suffix ignored. Unknown names come back
    lower-cased with ``_`` for ``-``.

    >>> canonical_collective("all_reduce_perf"), canonical_collective("AllGather")
    ('allreduce', 'allgather')
    >>> canonical_collective("all_to_all"), canonical_collective("reduce-scatter")
    ('alltoall', 'reduce_scatter')
    """
    return canonical_name(name)



# -- entry points -------------------------------------------------------------------------------


def load_log(path: str | os.PathLike[str], *, collective: str | None = None,
             ranks: int | None = None, runtime: str | None = None,
             channels: int | None = None, max_bytes: int = MAX_LOG_BYTES) -> BenchmarkLog:
    """Read a benchmark log file, detecting its format (see docs/timing.md).

    Parameters
    ----------
    path:
        The log: nccl-tests text or JSON output, PARAM comms output, or a plain CSV.
    collective, ranks:
        What the log does not say about the collective and the rank count (a log that
        names another collective, or lists another number of ranks, is refused).
    runtime, channels:
        Override what the log says (or does not say) about the runtime it was measured with
        (``"rccl"``, ``"nccl 2.18.3"``, ``"rccl-2.18.3"``: a name and an optional version) and
        its channel count.
    max_bytes:
        Refuse larger files before reading them.

    Raises
    ------
    FileFormatError
        A missing or unreadable file, text that is not UTF-8, a result line that cannot be read
        (the message names the line), no results at all, or a collective or rank count that the
        log does not tell (pass ``collective=`` / ``ranks=``).
    InputTooLargeError
        A file larger than ``max_bytes``.
    """
    data = read_bytes_bounded(path, max_bytes, what="a benchmark log may have")
    text = decode_text(data, str(path))
    return parse_log(text, name=str(path), collective=collective, ranks=ranks, runtime=runtime,
                     channels=channels)


def parse_log(text: str, *, name: str = "<log>", collective: str | None = None,
              ranks: int | None = None, runtime: str | None = None,
              channels: int | None = None) -> BenchmarkLog:
    """Read the text of a benchmark log (see :func:`load_log`); ``name`` names it in errors and
    is searched for the collective's name as a last resort.

    Examples
    --------
    >>> text = '''# nThread 1 nGpus 4 minBytes 8 maxBytes 1024 step: 2(factor)
    ... #  Rank  0 Group  0 Pid 1 on host device  0 [0x01] GPU
    ... #  Rank  3 Group  0 Pid 1 on host device  3 [0x04] GPU
    ... #       size   count  type  redop  root   time  algbw  busbw #wrong   time  algbw  busbw #wrong
    ...            8       2 float    sum    -1  10.00   0.00   0.00      0  10.00   0.00   0.00      0
    ...         1024     256 float    sum    -1  12.00   0.09   0.13      0  11.00   0.09   0.14      0
    ... '''
    >>> log = parse_log(text, name="all_reduce_perf.txt")
    >>> log.collective, log.ranks, len(log.rows), log.source
    ('allreduce', 4, 4, 'nccl-tests')
    >>> log.rows[2]
    BenchmarkRow(size_bytes=1024, count=256, dtype='float', op='sum', root=-1, time_us=12.0,
                 algbw_gbps=0.09, busbw_gbps=0.13, in_place=False, errors=0.0, line=6)
    """
    if ranks is not None and (isinstance(ranks, bool) or not isinstance(ranks, int)
                              or not 1 <= ranks <= _MAX_RANKS):
        raise FileFormatError(name, f"ranks = {ranks!r}: expected a whole number >= 1")
    given = _given_runtime(name, runtime, channels)
    if not text.strip():
        raise FileFormatError(name, "the file is empty")
    if "\0" in text:
        line = text.count("\n", 0, text.index("\0")) + 1
        raise FileFormatError(name, f"line {line}: a NUL character; a benchmark log is text")
    if text.lstrip().startswith("{"):
        log = _parse_json(text, name, collective, ranks)
    elif "COMMS-RES" in text:
        log = _parse_param(text, name, collective, ranks)
    elif _is_csv(text, name):
        log = _parse_csv(text, name, collective, ranks)
    elif _busbw_table_header(text) is not None and not _has_table_rows(text):
        log = _parse_busbw_table(text, name, collective, ranks)
    else:
        log = _parse_nccl_tests(text, name, collective, ranks)
    return _with_runtime(log, text, given)


# -- shared helpers ----------------------------------------------------------------------------

# A launcher's tag before a line: Open MPI --tag-output "[1,0]<stdout>:" or srun --label "0: ".
_LAUNCHER_TAG = re.compile(r"^(?:\[\d+,\d+\]<std(?:out|err|diag)>:|\s*\d+:(?=\s|$))", re.ASCII)
_INT = re.compile(r"^[+-]?[0-9]+$")  # ASCII: \d would take any script's digits (so re.ASCII
# on every pattern here with \d)
_NA = ("n/a", "na", "-", "nan")


def _strip_tags(line: str) -> str:
    for _ in range(3):
        stripped = _LAUNCHER_TAG.sub("", line, count=1)
        if stripped == line:
            break
        line = stripped
    return line


def _number(cell: str, what: str, name: str, line: int, *, optional: bool = False,
            hi: float | None = None) -> float | None:
    """A finite float from a cell, at most ``hi``; ``None`` for N/A when ``optional``."""
    if optional and cell.strip().lower() in _NA:
        return None
    try:
        value = float(number_text(cell))  # float() alone reads '1_0' and any script's digits
    except ValueError as exc:
        why = f": {exc}" if isinstance(exc, NumberTextError) else ""
        raise FileFormatError(name, f"line {line}: {what} {shown(cell)} is not a number"
                                    f"{why}") from None
    if not math.isfinite(value):
        raise FileFormatError(name, f"line {line}: {what} {shown(cell)} is not a finite number")
    if hi is not None:
        bounded_float(value, f"line {line}: {what}", source=name, hi=hi)
    return value


def _time(cell: str, name: str, line: int) -> float:
    value = _number(cell, "time", name, line)
    if value is None or value <= 0:
        raise FileFormatError(name, f"line {line}: time {shown(cell)}: expected microseconds > 0")
    return bounded_float(value, f"line {line}: time", source=name, lo=MIN_TIME_US,
                         hi=MAX_TIME_US, why="microseconds: a call takes from 1 ns to an hour; "
                                             "outside that, a unit mistake or a hang")


def _size(cell: str, name: str, line: int, what: str = "size") -> int:
    if not _INT.match(cell) or cell.startswith("-"):
        raise FileFormatError(name, f"line {line}: {what} {shown(cell)}: expected a whole number "
                                    "of bytes >= 0" if what == "size" else
                              f"line {line}: {what} {shown(cell)}: expected a whole number >= 0")
    return int_from_text(cell, f"line {line}: {what}", source=name, hi=MAX_SIZE_BYTES,
                         why="more than 1 PiB in one call")


def _count(text: str, what: str, name: str, line: int, hi: int) -> int:
    """A whole number of a header line (ranks, threads, GPUs), from 0 to ``hi``."""
    return int_from_text(text, f"line {line}: {what}", source=name, hi=hi)


def _collective_from_name(name: str) -> str | None:
    match = _NAME_IN_FILE.search(Path(name).name.lower())
    return _COLLECTIVE_NAMES[match.group(1)] if match else None


def _given_ranks(name: str, given: int | None, said: int | None) -> int | None:
    """The rank count: what the log says, else the one given (for logs that do not say); a
    log that says another count than the one given is refused."""
    if given is not None and said is not None and given != said:
        raise FileFormatError(name, f"the log measures {said} ranks, not {given} (the rank "
                                    "count given, for logs that do not say theirs)")
    return said if said is not None else given


def _resolve_collective(name: str, override: str | None, found: str | None) -> str:
    if override and found and canonical_collective(override) in _LOGGED and \
            canonical_collective(found) != canonical_collective(override):
        # the collective given is for logs that do not say: one that says another is not it
        raise FileFormatError(name, f"the log measures {shown(found)}, not "
                                    f"{shown(canonical_collective(override))} (the collective "
                                    "given, for logs that do not say theirs)")
    for candidate, said_by_file in ((override, False), (found, True),
                                    (_collective_from_name(name), True)):
        if candidate:
            canonical = canonical_collective(candidate)
            if canonical not in _LOGGED:
                listed = ", ".join(LOGGED_COLLECTIVES)
                if not said_by_file:
                    raise UnknownNameError(f"unknown collective {shown(candidate)}; a benchmark "
                                           f"log measures one of: {listed}")
                raise FileFormatError(name, f"collective {shown(candidate)}: not one a "
                                            f"benchmark log measures ({listed})")
            return clean_name(canonical, "the collective", source=name)
    raise FileFormatError(name, "cannot tell which collective was measured: the log names no "
                                "NAME_perf binary or collective and neither does the file name; "
                                "pass the collective (e.g. --collective allreduce)")


def _ranks_from_ratio(collective: str, rows: Sequence[BenchmarkRow]) -> int | None:
    """The rank count whose bus-bandwidth factor explains ``busbw / algbw`` in every row with
    readable figures, or ``None`` when no single count does (e.g. broadcast, or all 0.00)."""
    factor = _BUSBW_FACTORS.get(collective)
    usable = [(r.algbw_gbps, r.busbw_gbps) for r in rows
              if r.algbw_gbps is not None and r.busbw_gbps is not None and r.algbw_gbps >= 1.0]
    if factor is None or factor(4) == factor(8) or not usable:
        return None
    best_alg, best_bus = max(usable)
    ratio = best_bus / best_alg
    # Two-decimal printing: each figure is off by at most 0.005.
    tolerance = 0.0051 * (1 + ratio) / best_alg

    def fits(n: int) -> bool:
        return abs(factor(n) - ratio) <= tolerance

    matches = [n for n in range(2, 4097) if fits(n)]
    if len(matches) != 1:
        return None
    n = matches[0]
    for alg, bus in usable:  # every row must agree
        if abs(alg * factor(n) - bus) > 0.0051 * (1 + factor(n)) + 1e-9:
            return None
    return n


def _finish(name: str, source: str, collective: str, ranks: int | None,
            rows: list[BenchmarkRow], zero: int, fallback_ranks: int | None,
            what_rows: str, gpus_per_thread: int | None = None) -> BenchmarkLog:
    if not rows:
        extra = f" ({zero} of size 0, skipped)" if zero else ""
        raise FileFormatError(name, f"no {what_rows} found{extra}")
    if ranks is None:
        ranks = _ranks_from_ratio(collective, rows) or fallback_ranks
    if ranks is None:
        if collective in _BUSBW_FACTORS and _BUSBW_FACTORS[collective](4) == 1.0:
            ranks = 1  # rank-independent bus bandwidth; the count is unknown and unused
        else:
            raise FileFormatError(name, "cannot tell the number of ranks: no '#  Rank N' device "
                                        "lines, no world size, and busbw/algbw does not say; "
                                        "pass the rank count (e.g. --ranks 8)")
    if not 1 <= ranks <= _MAX_RANKS:
        raise FileFormatError(name, f"{ranks} ranks: expected 1 to {_MAX_RANKS}")
    _check_repeats(name, source, rows)
    return BenchmarkLog(path=name, collective=collective, ranks=ranks, rows=tuple(rows),
                        source=source, zero_size_lines=zero, gpus_per_thread=gpus_per_thread)


#: Times of one size and half (several dtypes or ops, or sweeps run twice) further apart than
#: this factor contradict each other: a fit through their mean fits neither.
MAX_REPEAT_RATIO = 2.0


def _check_repeats(name: str, source: str, rows: Sequence[BenchmarkRow]) -> None:
    """Refuse a size measured twice in a CSV (one row per size and half), or, in any log, two
    times of one size and half more than :data:`MAX_REPEAT_RATIO` apart; both lines named."""
    first: dict[tuple[int, bool], BenchmarkRow] = {}
    for row in rows:
        key = (row.size_bytes, row.in_place)
        seen = first.setdefault(key, row)
        if seen is row:
            continue
        half = "in-place" if row.in_place else "out-of-place"
        if source == "csv":
            raise FileFormatError(name, f"line {row.line}: size_bytes {row.size_bytes} "
                                        f"({half}) again, first at line {seen.line}; a CSV has "
                                        "one row per size (and in_place)")
        slow, fast = max(seen.time_us, row.time_us), min(seen.time_us, row.time_us)
        if slow > MAX_REPEAT_RATIO * fast:
            raise FileFormatError(name, f"lines {seen.line} and {row.line}: {row.size_bytes} "
                                        f"bytes ({half}) took {seen.time_us:g} and "
                                        f"{row.time_us:g} us, more than {MAX_REPEAT_RATIO:g}x "
                                        "apart; measurements that disagree this much cannot be "
                                        "fitted: keep one run")


# -- nccl-tests text ----------------------------------------------------------------------------

_NTHREAD = re.compile(r"#\s*nThreads?\s+(\d+)\s+nGpus\s+(\d+)", re.ASCII)
_RANK_LINE = re.compile(r"#\s*Rank\s+(\d+)\b", re.ASCII)
_STARTING = re.compile(r"#\s*Collective test starting:\s*(\S+)")
# The look-behinds let a match start only where a word does: without them every letter of a long
# word starts a scan to its end, quadratic time on a line of one long word.
_PERF_NAME = re.compile(r"(?<![A-Za-z0-9_])([A-Za-z][A-Za-z0-9_]*?)_perf(?:_mpi)?\b")
_TIMESTAMP = re.compile(r"^\d{4}-\d{2}-\d{2}$", re.ASCII)
_TIME_HEADERS = ("time", "cputime")


@dataclass(frozen=True)
class _Layout:
    """Cells of an nccl-tests table: ``size count type`` + ``optional`` + 2 halves of ``width``."""

    optional: tuple[str, ...] = ("redop", "root")
    width: int = 4

    @staticmethod
    def from_header(tokens: Sequence[str]) -> "_Layout | None":
        names = [t.lower() for t in tokens if t.lower() != "timestamp"]
        times = [i for i, t in enumerate(names) if t in _TIME_HEADERS]
        if len(names) < 4 or names[:3] != ["size", "count", "type"] or not times:
            return None
        width = times[1] - times[0] if len(times) > 1 else len(names) - times[0]
        if width < 3:
            return None
        return _Layout(tuple(names[3:times[0]]), width)

    def describe(self) -> str:
        half = "time algbw busbw error" + (" ..." if self.width > 4 else "")
        return " ".join(("size count type", *self.optional, f"+ 2 x ({half})"))


def _parse_nccl_tests(text: str, name: str, collective: str | None,
                      ranks: int | None) -> BenchmarkLog:
    layout = _Layout()
    rows: list[BenchmarkRow] = []
    zero = 0
    rank_ids: set[int] = set()
    per_process: int | None = None
    per_thread: int | None = None
    found_collective: str | None = None
    found_line = 0
    starting: str | None = None
    starting_line = 0
    # (line, rank ids) of each run in the file: runs appended to one log must agree on ranks
    runs: list[tuple[int, set[int]]] = [(1, set())]
    for number, raw in enumerate(text.splitlines(), start=1):
        line = _strip_tags(raw).strip()
        if not line:
            continue
        if line.startswith("#"):
            body = line.lstrip("#").strip()
            if (m := _NTHREAD.match(line)) is not None:
                per_thread = _count(m.group(2), "nGpus", name, number, _MAX_RANKS)
                per_process = _count(m.group(1), "nThread", name, number, _MAX_RANKS) * per_thread
                # every nccl-tests version prints this header once per run (older ones print
                # no "Collective test starting" line, which otherwise began this run)
                if runs[-1][1]:
                    runs.append((number, set()))
            elif (m := _RANK_LINE.match(line)) is not None:
                rank = _count(m.group(1), "Rank", name, number, _MAX_RANKS - 1)
                rank_ids.add(rank)
                runs[-1][1].add(rank)
            elif (m := _STARTING.match(line)) is not None:
                if starting is not None and \
                        canonical_collective(m.group(1)) != canonical_collective(starting):
                    raise FileFormatError(name, f"line {number}: a test of {shown(m.group(1))} "
                                                f"after one of {shown(starting)} (line "
                                                f"{starting_line}); a log measures one "
                                                "collective: split the file")
                if starting is None:
                    starting, starting_line = m.group(1), number
                runs.append((number, set()))
            elif (header := _Layout.from_header(body.split())) is not None:
                layout = header
        if "NCCL INFO" in line or "NCCL WARN" in line:
            continue
        for m in _PERF_NAME.finditer(line):
            if canonical_collective(m.group(1)) not in _BUSBW_FACTORS:
                continue
            if found_collective is None:
                found_collective, found_line = m.group(1), number
            elif starting is None and (rows or zero) and \
                    canonical_collective(m.group(1)) != canonical_collective(found_collective):
                # older nccl-tests print no "Collective test starting" line (newer ones are
                # checked by it, above): a second binary named after results is a second run
                raise FileFormatError(name, f"line {number}: {shown(m.group(1) + '_perf')} "
                                            "after results of "
                                            f"{shown(found_collective + '_perf')} (named at "
                                            f"line {found_line}); a log measures one "
                                            "collective: split the file")
            break
        if line.startswith("#"):
            continue
        cells = line.split()
        if len(cells) < 2 or not (_INT.match(cells[0]) and _INT.match(cells[1])):
            continue  # noise: banners, command lines, "some output truncated"...
        parsed = _nccl_row(cells, layout, name, number)
        if parsed is None:
            zero += 1
        else:
            rows.extend(parsed)
    counts = [(line, max(ids) + 1) for line, ids in runs if ids]
    if any(count != counts[0][1] for _, count in counts):
        line, count = next((line, count) for line, count in counts if count != counts[0][1])
        raise FileFormatError(name, f"line {line}: a run on {count} ranks after one on "
                                    f"{counts[0][1]} (line {counts[0][0]}); a log measures one "
                                    "rank count: split the file")
    coll = _resolve_collective(name, collective, starting or found_collective)
    ranks = _given_ranks(name, ranks, max(rank_ids) + 1 if rank_ids else None)
    return _finish(name, "nccl-tests", coll, ranks, rows, zero, per_process,
                   "nccl-tests result rows (lines like '1048576  262144  float  sum  -1  "
                   "89.27  11.75  20.56  0  88.45  11.85  20.75  0')", per_thread)


def _nccl_row(cells: list[str], layout: _Layout, name: str, number: int
              ) -> list[BenchmarkRow] | None:
    """The rows of one table line (out-of-place, then in-place), or ``None`` for size 0."""
    if len(cells) >= 2 and _TIMESTAMP.match(cells[-2]):
        cells = cells[:-2]
    size = _size(cells[0], name, number)
    count = _size(cells[1], name, number, "count")
    halves = 2
    if not 0 <= len(cells) - 3 - halves * layout.width <= len(layout.optional):
        raise FileFormatError(name, f"line {number}: a result row with {len(cells)} cells; "
                                    f"expected {3 + 2 * layout.width + len(layout.optional)} "
                                    f"({layout.describe()})")
    if size == 0:
        return None
    dtype = cells[2]
    middle = cells[3:len(cells) - halves * layout.width]
    op: str | None = None
    root: int | None = None
    if len(middle) == len(layout.optional):
        named = dict(zip(layout.optional, middle))
    else:  # an empty cell: a whole number is the root, anything else the reduction
        named = {("root" if _INT.match(cell) else "redop"): cell for cell in middle}
    if "redop" in named and named["redop"].lower() not in ("", "none"):
        op = named["redop"]
    if "root" in named:
        if not _INT.match(named["root"]):
            raise FileFormatError(name, f"line {number}: root {shown(named['root'])} is not a rank")
        root = int_from_text(named["root"], f"line {number}: root", source=name, lo=-1,
                             hi=_MAX_RANKS - 1)
    result = []
    start = len(cells) - halves * layout.width
    for half in range(halves):
        base = start + half * layout.width
        time_us = _time(cells[base], name, number)
        algbw = _number(cells[base + 1], "algbw", name, number, optional=True, hi=MAX_GBPS)
        busbw = _number(cells[base + 2], "busbw", name, number, optional=True, hi=MAX_GBPS)
        errors = (_number(cells[base + 3], "error", name, number, optional=True)
                  if layout.width > 3 else None)  # a table without an error column
        result.append(BenchmarkRow(size, count, dtype, op, root, time_us, algbw, busbw,
                                   half == 1, errors, number))
    return result


# -- nccl-tests JSON ----------------------------------------------------------------------------

_JSON_VERSIONS = (1, 2)


def _parse_json(text: str, name: str, collective: str | None, ranks: int | None) -> BenchmarkLog:
    doc = parse_json(text, name)
    if not isinstance(doc, dict) or "results" not in doc:
        raise FileFormatError(name, "JSON without a 'results' list: not nccl-tests JSON output")
    version = doc.get("version")
    if isinstance(version, bool) or version not in _JSON_VERSIONS:
        raise FileFormatError(name, f"version: nccl-tests JSON version {shown(version)}; this "
                                    f"reader "
                                    f"knows versions {', '.join(map(str, _JSON_VERSIONS))}")
    results = doc["results"]
    if not isinstance(results, list):
        raise FileFormatError(name, "results: expected a list")
    lines = _json_entry_lines(text, len(results))
    rows: list[BenchmarkRow] = []
    zero = 0
    for index, entry in enumerate(results):
        where = f"results[{index}]"
        line = lines[index] if index < len(lines) else 0
        at = f"line {line}: {where}" if line else where
        if not isinstance(entry, dict):
            raise FileFormatError(name, f"{at}: expected an object")
        size = _json_int(entry, "size", name, at)
        count = _json_int(entry, "count", name, at, optional=True)
        dtype = _json_str(entry, "type", name, at)
        op = _json_str(entry, "redop", name, at)
        raw_root = entry.get("root")
        root_text = (str(raw_root) if isinstance(raw_root, int) and not isinstance(raw_root, bool)
                     else _json_str(entry, "root", name, at))
        root = None
        if root_text is not None and root_text.strip():
            if not _INT.match(root_text.strip()):
                raise FileFormatError(name, f"{at}.root: {shown(root_text)} is not a rank")
            root = int_from_text(root_text, f"{at}.root", source=name, lo=-1, hi=_MAX_RANKS - 1)
        if op is not None and op.strip().lower() in ("", "none"):
            op = None
        halves = [(key, entry.get(key)) for key in ("out_of_place", "in_place")]
        if all(value is None for _, value in halves):
            raise FileFormatError(name, f"{at}: neither out_of_place nor in_place results")
        if size == 0:
            zero += 1
            continue
        for key, half in halves:
            if half is None:
                continue
            if not isinstance(half, dict):
                raise FileFormatError(name, f"{at}.{key}: expected an object or null")
            time_key = "time" if "time" in half else "cpu_time"
            time_us = _json_float(half, time_key, name, f"{at}.{key}")
            if time_us is None or time_us <= 0:
                raise FileFormatError(name, f"{at}.{key}.{time_key}: expected microseconds > 0")
            bounded_float(time_us, f"{at}.{key}.{time_key}", source=name, lo=MIN_TIME_US,
                          hi=MAX_TIME_US,
                          why="microseconds: a call takes from 1 ns to an hour")
            algbw = _json_float(half, "alg_bw", name, f"{at}.{key}", optional=True, hi=MAX_GBPS)
            busbw = _json_float(half, "bus_bw", name, f"{at}.{key}", optional=True, hi=MAX_GBPS)
            errors = _json_float(half, "nwrong", name, f"{at}.{key}", optional=True)
            rows.append(BenchmarkRow(size, count, dtype, op, root, time_us, algbw, busbw,
                                     key == "in_place", errors, line))
    code = doc.get("nccl_version")
    if code is not None and (isinstance(code, bool) or not isinstance(code, int)
                             or _nccl_version(code) is None):
        raise FileFormatError(name, f"nccl_version: {shown(code)} is not an NCCL version code "
                                    "(ncclGetVersion's: major * 10000 + minor * 100 + patch "
                                    "from 2.9, like 22703 for 2.27.3; major * 1000 + minor * "
                                    "100 + patch before, like 2804 for 2.8.4)")
    found = None
    args = doc.get("args")
    if isinstance(args, list) and args and isinstance(args[0], str):
        m = _PERF_NAME.search(Path(args[0]).name)
        found = m.group(1) if m else None
    coll = _resolve_collective(name, collective, found)
    config = doc.get("config")
    ranks = _given_ranks(name, ranks, _json_ranks(config))
    gpus = config.get("ngpus") if isinstance(config, dict) else None
    per_thread = gpus if isinstance(gpus, int) and not isinstance(gpus, bool) \
        and 1 <= gpus <= _MAX_RANKS else None
    return _finish(name, "nccl-tests-json", coll, ranks, rows, zero, None,
                   "results with a size above 0", per_thread)


def _json_entry_lines(text: str, count: int) -> list[int]:
    """Best-effort line numbers of the objects of the top-level "results" list."""
    start = text.find('"results"')
    if start < 0:
        return []
    lines = []
    for m in re.finditer(r'\{\s*"size"', text[start:]):
        lines.append(text.count("\n", 0, start + m.start()) + 1)
        if len(lines) == count:
            break
    return lines if len(lines) == count else []


def _json_int(obj: dict, key: str, name: str, at: str, *, optional: bool = False) -> int | None:
    value = obj.get(key)
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise FileFormatError(name, f"{at}.{key}: {shown(value)}: expected a whole number >= 0")
    return bounded_int(value, f"{at}.{key}", source=name, hi=MAX_SIZE_BYTES,
                       why="more than 1 PiB in one call")


def _json_str(obj: dict, key: str, name: str, at: str) -> str | None:
    value = obj.get(key)
    if value is not None and not isinstance(value, str):
        raise FileFormatError(name, f"{at}.{key}: {shown(value)}: expected a string")
    return value


def _json_float(obj: dict, key: str, name: str, at: str, *, optional: bool = False,
                hi: float | None = None) -> float | None:
    value = obj.get(key)
    if value is None or (isinstance(value, str) and value.lower() in _NA):
        if optional:
            return None
        raise FileFormatError(name, f"{at}.{key}: missing; expected a number")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise FileFormatError(name, f"{at}.{key}: {shown(value)}: expected a finite number")
    return bounded_float(value, f"{at}.{key}", source=name, hi=hi)


def _json_ranks(config: Any) -> int | None:
    if not isinstance(config, dict):
        return None
    threads, gpus, devices = config.get("nthreads"), config.get("ngpus"), config.get("devices")
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in (threads, gpus)):
        return None
    processes = len(devices) if isinstance(devices, list) and devices else 1
    return threads * gpus * processes


# -- PARAM comms ----------------------------------------------------------------------------------

_PARAM_ROW = re.compile(r"(?<![\w.-])COMMS-RES(?:-(?P<tag>[A-Za-z][\w.-]*?))?(?=\s)(?P<rest>.*)$")
_PARAM_LABEL = re.compile(r"total-pair-size \(B\)|total-size \(B\)|size \(B\)|\S+")
_WORLD_SIZE = re.compile(r"world_size['\"]?\s*[:=]\s*(\d+)", re.ASCII)
_COLLECTIVE_ARG = re.compile(r"(?:--collectives?[=\s]+|\bcollective\s*=\s*)([A-Za-z_]+)")
# Header label -> field; labels not listed are kept as unnamed columns.
_PARAM_FIELDS = (
    (re.compile(r"^(total-(pair-)?)?size \(B\)$", re.I), "size"),
    (re.compile(r"^(nElementsPerRank|num-elements)$", re.I), "count"),
    (re.compile(r"^Latency\(us\):p50$", re.I), "p50"),
    (re.compile(r"^AlgBW\(GB/s\)$", re.I), "algbw"),
    (re.compile(r"^BusBW\(GB/s\)$", re.I), "busbw"),
)
_HEADERLESS = {
    6: ("size", "count", "p50", "p75", "p95", "algbw"),
    7: ("size", "count", "p50", "p75", "p95", "algbw", "busbw"),
    9: ("size", "count", "p50", "p75", "p95", "min", "max", "algbw", "busbw"),
}


def _param_header(rest: str) -> tuple[str, ...]:
    labels = _PARAM_LABEL.findall(rest)
    fields = []
    for label in labels:
        for pattern, field in _PARAM_FIELDS:
            if pattern.match(label):
                fields.append(field)
                break
        else:
            fields.append(label.lower())
    return tuple(fields)


def _parse_param(text: str, name: str, collective: str | None, ranks: int | None) -> BenchmarkLog:
    columns: tuple[str, ...] | None = None
    rows: list[BenchmarkRow] = []
    zero = 0
    world: int | None = None
    found: str | None = None
    world_line = found_line = 0

    def collective_is(candidate: str, number: int) -> None:
        # Runs appended to one log: one curve of one collective, or a refusal naming the line.
        nonlocal found, found_line
        if found is None:
            found, found_line = candidate, number
        elif canonical_collective(candidate) != canonical_collective(found):
            raise FileFormatError(name, f"line {number}: {shown(candidate)} after "
                                        f"{shown(found)} (line {found_line}); a log measures "
                                        "one collective: split the file")

    for number, raw in enumerate(text.splitlines(), start=1):
        line = _strip_tags(raw)
        if (m := _WORLD_SIZE.search(line)) is not None:
            size = _count(m.group(1), "world_size", name, number, _MAX_RANKS)
            if world is None:
                world, world_line = size, number
            elif size != world:
                raise FileFormatError(name, f"line {number}: world_size {size} after {world} "
                                            f"(line {world_line}); a log measures one rank "
                                            "count: split the file")
        if (m := _COLLECTIVE_ARG.search(line)) is not None:
            collective_is(m.group(1), number)
        m = _PARAM_ROW.search(line)
        if m is None:
            continue
        tag, rest = m.group("tag") or "", m.group("rest")
        if tag.upper().startswith("QUANT") or "pingLatency" in rest or tag == "pt2pt":
            continue  # quantized or point-to-point results: not a collective sweep
        cells = rest.split()
        if not cells:
            continue
        if not _INT.match(cells[0]):
            header = _param_header(rest)
            if "size" in header and "p50" in header:
                columns = header
            continue
        if tag:
            collective_is(tag.split("-", 1)[0], number)
        layout = columns if columns is not None else _HEADERLESS.get(len(cells))
        if layout is None:
            raise FileFormatError(name, f"line {number}: a COMMS-RES row with {len(cells)} cells "
                                        "and no COMMS-RES header line before it to say what they "
                                        "are")
        if len(cells) != len(layout):
            raise FileFormatError(name, f"line {number}: a COMMS-RES row with {len(cells)} cells; "
                                        f"the header has {len(layout)} ({' '.join(layout)})")
        named = dict(zip(layout, cells))
        size = _size(named["size"], name, number)
        if size == 0:
            zero += 1
            continue
        count = _size(named["count"], name, number, "count") if "count" in named else None
        dtype = tag.split("-", 1)[1] if "-" in tag else None
        time_us = _time(named["p50"], name, number)
        algbw = (_number(named["algbw"], "algBW", name, number, optional=True, hi=MAX_GBPS)
                 if "algbw" in named else None)
        busbw = (_number(named["busbw"], "busBW", name, number, optional=True, hi=MAX_GBPS)
                 if "busbw" in named else None)
        rows.append(BenchmarkRow(size, count, dtype, None, None, time_us, algbw, busbw, False,
                                 None, number))
    coll = _resolve_collective(name, collective, found)
    ranks = _given_ranks(name, ranks, world)
    return _finish(name, "param-comms", coll, ranks, rows, zero, None,
                   "COMMS-RES result rows")




# -- plain CSV ------------------------------------------------------------------------------------

_CSV_REQUIRED = ("size_bytes", "time_us")
_TRUE, _FALSE = ("true", "yes", "1", "in-place", "in_place"), ("false", "no", "0", "out-of-place",
                                                              "out_of_place", "")


def _content_lines(text: str) -> list[tuple[int, str]]:
    """``(line number, line)`` of the lines that are neither blank nor ``#`` comments."""
    return [(number, line) for number, line in enumerate(text.splitlines(), start=1)
            if line.strip() and not line.lstrip().startswith("#")]


#: Longest line of a CSV log, in characters. A row holds a handful of numbers and short names
#: (under 200 characters in practice); a longer line is not a measurement, and Python's csv
#: module stops at 128 KiB per field with an error of its own.
MAX_CSV_LINE_CHARS = 64 * 1024


def csv_rows(text: str, name: str) -> list[tuple[int, list[str]]]:
    r"""``(line number, cells)`` of each CSV line of ``text`` that is neither blank nor a ``#``
    comment (the header first), cells stripped of surrounding blanks; a quoted cell does not
    span lines. The one CSV tokenizer of the measurement readers.

    Raises
    ------
    FileFormatError
        A line longer than :data:`MAX_CSV_LINE_CHARS`, or one the csv module cannot split
        (naming the file and line).

    >>> csv_rows('size_bytes, time_us\n# note\n1024,"3.5"\n', "a.csv")
    [(1, ['size_bytes', 'time_us']), (3, ['1024', '3.5'])]
    """
    import csv

    rows = []
    for number, line in _content_lines(text):
        if len(line) > MAX_CSV_LINE_CHARS:
            raise FileFormatError(name, f"line {number}: {len(line)} characters, more than the "
                                        f"{MAX_CSV_LINE_CHARS} a CSV line may have")
        try:
            cells = next(csv.reader([line]))
        except csv.Error as exc:
            raise FileFormatError(name, f"line {number}: not a CSV row ({exc})") from exc
        rows.append((number, [cell.strip() for cell in cells]))
    return rows


def csv_header(lines: list[tuple[int, list[str]]], name: str) -> list[str]:
    """The lower-cased column names of the header (the first of :func:`csv_rows`' lines; none
    when there are no lines).

    Raises
    ------
    FileFormatError
        A column named twice (which of the two to read would be a guess).
    """
    if not lines:
        return []
    number, cells = lines[0]
    header = [cell.lower() for cell in cells]
    for at, label in enumerate(header):
        if label and label in header[:at]:
            raise FileFormatError(name, f"line {number}: the column {label!r} twice in the "
                                        "header; a CSV names each column once")
    return header


def _is_csv(text: str, name: str) -> bool:
    lines = _content_lines(text)
    if not lines or "," not in lines[0][1]:
        return False
    return name.lower().endswith(".csv") or "size_bytes" in lines[0][1].lower()


def _parse_csv(text: str, name: str, collective: str | None, ranks: int | None) -> BenchmarkLog:
    lines = csv_rows(text, name)
    header_line = lines[0][0]
    header = csv_header(lines, name)
    missing = [column for column in _CSV_REQUIRED if column not in header]
    if missing:
        raise FileFormatError(name, f"line {header_line}: a CSV without the column(s) "
                                    f"{', '.join(missing)}; expected a header naming "
                                    f"{' and '.join(_CSV_REQUIRED)} (others are ignored)")
    column = {label: index for index, label in reversed(list(enumerate(header)))}
    rows: list[BenchmarkRow] = []
    zero = 0
    said: dict[str, str] = {}
    for number, cells in lines[1:]:
        if len(cells) != len(header):
            raise FileFormatError(name, f"line {number}: {len(cells)} cells; the header has "
                                        f"{len(header)} ({', '.join(header)})")
        named = dict(zip(header, cells))
        for key in ("collective", "ranks"):
            if key in column and named[key]:
                if said.setdefault(key, named[key]) != named[key]:
                    raise FileFormatError(name, f"line {number}: {key} {named[key]!r}, but "
                                                f"earlier rows say {said[key]!r}: one log, one "
                                                f"{key}")
        size = _size(named["size_bytes"], name, number)
        if size == 0:
            zero += 1
            continue
        count = _size(named["count"], name, number) if named.get("count") else None
        time_us = _time(named["time_us"], name, number)
        algbw = (_number(named["algbw_gbps"], "algbw_gbps", name, number, optional=True)
                 if named.get("algbw_gbps") else None)
        busbw = (_number(named["busbw_gbps"], "busbw_gbps", name, number, optional=True)
                 if named.get("busbw_gbps") else None)
        in_place = named.get("in_place", "").lower()
        if in_place not in _TRUE + _FALSE:
            raise FileFormatError(name, f"line {number}: in_place {named['in_place']!r}: "
                                        "expected true or false")
        rows.append(BenchmarkRow(size, count, None, None, None, time_us, algbw, busbw,
                                 in_place in _TRUE, None, number))
    if "ranks" in said:
        if not _INT.match(said["ranks"]) or int(said["ranks"]) < 1:
            raise FileFormatError(name, f"ranks {said['ranks']!r}: expected a whole number >= 1")
        ranks = _given_ranks(name, ranks, int(said["ranks"]))
    coll = _resolve_collective(name, collective, said.get("collective"))
    return _finish(name, "csv", coll, ranks, rows, zero, None,
                   "CSV rows (lines like '1048576,546.3' under 'size_bytes,time_us')")


# -- two-column bus-bandwidth tables ------------------------------------------------------------

# A Markdown table "| Message Size (Bytes) | ND H100 V5 (GB/s) |": a size and a GB/s column.
_BUSBW_HEADER = re.compile(r"^\|([^|]*\bsize\b[^|]*)\|([^|]*GB/s[^|]*)\|$", re.I)
_TABLE_RULE = re.compile(r"^\|(?:\s*:?-+:?\s*\|)+$")
_SIZE_LABEL = re.compile(r"^(\d{1,15})\s*([KMGT]?)(?:i?B)?$", re.I | re.ASCII)
_DECLARED_RANKS = re.compile(r"^##\s*ranks\s*:\s*(.*?)\s*$", re.I)
_LABEL_POWERS = {"": 0, "K": 1, "M": 2, "G": 3, "T": 4}
#: How far (relative) a size label like "65K" may be from the power of two it rounds.
_LABEL_TOLERANCE = 0.05


def _busbw_table_header(text: str) -> int | None:
    """The 0-based index of the first line of a busbw table's header row, or ``None``."""
    for index, raw in enumerate(text.splitlines()):
        if "|" in raw and _BUSBW_HEADER.match(raw.strip()):
            return index
    return None


def _has_table_rows(text: str) -> bool:
    """Whether the text has nccl-tests result rows (two whole numbers first): a raw table wins
    over a busbw table in the same file."""
    for raw in text.splitlines():
        cells = _strip_tags(raw).split()
        if len(cells) >= 8 and _INT.match(cells[0]) and _INT.match(cells[1]):
            return True
    return False


def _size_label(cell: str, name: str, line: int) -> int:
    """Bytes of a size cell: ``1024`` exactly, ``1K``/``65K``/``536M`` the nearest power of two."""
    m = _SIZE_LABEL.match(cell.strip())
    if m is None:
        raise FileFormatError(name, f"line {line}: size {shown(cell.strip())}: expected bytes "
                                    "(1024) or a label like 1K, 65K, 2M, 8G")
    number, suffix = int(m.group(1)), m.group(2).upper()
    if not suffix:
        return _size(m.group(1), name, line)
    binary = number * 1024 ** _LABEL_POWERS[suffix]
    power = 1 << max(0, round(math.log2(binary))) if binary else 0
    decimal = number * 1000 ** _LABEL_POWERS[suffix]
    if not power or min(abs(binary - power), abs(decimal - power)) > _LABEL_TOLERANCE * power:
        raise FileFormatError(name, f"line {line}: size {shown(cell.strip())} is not a power of "
                                    "two within 5%; a busbw table lists a factor-2 sweep (write "
                                    "other sizes in bytes)")
    return bounded_int(power, f"line {line}: size", source=name, hi=MAX_SIZE_BYTES,
                       why="more than 1 PiB in one call")


def _parse_busbw_table(text: str, name: str, collective: str | None,
                       ranks: int | None) -> BenchmarkLog:
    lines = text.splitlines()
    start = _busbw_table_header(text)
    if start is None:
        raise FileFormatError(name, "no busbw table header ('| Message Size (Bytes) | ... "
                                    "(GB/s) |') found")
    declared: int | None = None
    found: str | None = None
    for number, raw in enumerate(lines, start=1):
        if (number <= start and declared is None
                and (m := _DECLARED_RANKS.match(raw.strip())) is not None):
            value = m.group(1)
            if not _INT.match(value) or value.startswith("-"):
                raise FileFormatError(name, f"line {number}: ranks {shown(value)}: expected a "
                                            "whole number >= 1")
            declared = _count(value, "ranks", name, number, _MAX_RANKS)
        if found is None and (m := _PERF_NAME.search(raw)) is not None:
            found = m.group(1) if canonical_collective(m.group(1)) in _BUSBW_FACTORS else None
    coll = _resolve_collective(name, collective, found)
    ranks = _given_ranks(name, ranks, declared)
    factor = _BUSBW_FACTORS.get(coll)
    if ranks is None and factor is not None and factor(4) != factor(8):
        raise FileFormatError(name, "cannot tell the number of ranks: a busbw table does not say "
                                    "it; add a line '## ranks: N' or pass the rank count "
                                    "(e.g. --ranks 8)")
    bus_factor = float(busbw_factor(coll, ranks or 1)) if coll in _BUSBW_FACTORS else 1.0
    if bus_factor == 0:
        raise FileFormatError(name, f"a {coll} busbw table of one rank: nccl-tests' bus bandwidth "
                                    "is 0 there, so no time derives from it")
    rows: list[BenchmarkRow] = []
    for number in range(start + 2, len(lines) + 1):
        line = lines[number - 1].strip()
        if not line.startswith("|"):
            break
        if _TABLE_RULE.match(line):
            continue
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        if len(cells) != 2:
            raise FileFormatError(name, f"line {number}: a table row with {len(cells)} cells; "
                                        "expected 2 (size, busbw in GB/s)")
        size = _size_label(cells[0], name, number)
        busbw = _number(cells[1], "busbw", name, number, hi=MAX_GBPS)
        if busbw is None or busbw <= 0 or size == 0:
            raise FileFormatError(name, f"line {number}: busbw {shown(cells[1])} for size "
                                        f"{shown(cells[0])}: a time is derived from a busbw > 0 "
                                        "and a size > 0")
        time_us = bounded_float(size * bus_factor / (busbw * 1e3), f"line {number}: time",
                                source=name, hi=MAX_TIME_US,
                                why="microseconds: one call of more than an hour is not a "
                                    "measurement")
        rows.append(BenchmarkRow(size, None, None, None, None, time_us, None, busbw, True, None,
                                 number))
    return _finish(name, "busbw-table", coll, ranks, rows, 0, None,
                   "busbw table rows (lines like '| 1M | 43.70 |' under '| Message Size "
                   "(Bytes) | ... (GB/s) |')")


# -- the runtime a log was measured with ----------------------------------------------------------

_RUNTIME_BANNER = re.compile(r"(?<![\w-])(NCCL|RCCL) version\s*:?\s*v?(\d+\.\d+[\w.+~-]*)",
                             re.ASCII)
# A Markdown specification row "| NCCL | 2.18.5 |" (the busbw tables' "System Specifications").
_RUNTIME_SPEC_ROW = re.compile(r"^\|\s*(NCCL|RCCL)\s*\|\s*v?(\d+\.\d+[\w.+~-]*)\s*\|",
                               re.M | re.ASCII)
_JSON_NCCL_VERSION = re.compile(r'"nccl_version"\s*:\s*(\d+)', re.ASCII)
_RING_LINE = re.compile(r"\bChannel\s+\d+/(\d+)\s*:\s+\d", re.ASCII)
_COLL_CHANNELS = re.compile(r"\b(\d+) coll channels\b", re.ASCII)
_N_CHANNELS = re.compile(r"\bnChannels\s*[=:]?\s*(\d+)", re.ASCII)
_MAX_CHANNELS = re.compile(r"\bNCCL_MAX_N?CHANNELS(?:\s*=\s*|\s+set by environment to\s+)(\d+)",
                           re.ASCII)
_RUNTIME_OPTION = re.compile(r"^([A-Za-z][A-Za-z_-]*?)(?:[\s@/=-]*(\d[\w.+~-]*))?$", re.ASCII)
#: The most channels a log or a caller may claim (NCCL and RCCL have at most 64 today).
_MAX_CHANNELS_CLAIMED = 1024


def _nccl_version(code: int) -> str | None:
    """The version an ``NCCL_VERSION_CODE`` (what ``ncclGetVersion`` gives, nccl-tests' JSON
    ``nccl_version``) encodes: ``major * 10000 + minor * 100 + patch`` from 2.9 (20900 on),
    ``major * 1000 + minor * 100 + patch`` for 2.0 to 2.8 (src/nccl.h.in's ``NCCL_VERSION``);
    ``None`` for a number that is neither.

    >>> _nccl_version(22703), _nccl_version(20900), _nccl_version(2804), _nccl_version(1234)
    ('2.27.3', '2.9.0', '2.8.4', None)
    """
    if code >= 20900:
        return f"{code // 10000}.{code // 100 % 100}.{code % 100}"
    if 2000 <= code < 2900:
        return f"{code // 1000}.{code // 100 % 10}.{code % 100}"
    return None


def split_runtime(text: str) -> tuple[str, str | None]:
    """A runtime as users write it, with an optional version (``"rccl"``, ``"nccl 2.18.3"``,
    ``"rccl-2.18.3"``): its lower-case name and its version text (``None``: not given).

    Raises
    ------
    ValueError
        Not a name with an optional version.

    >>> split_runtime("NCCL-2.18.3")
    ('nccl', '2.18.3')
    """
    match = _RUNTIME_OPTION.match(text.strip()) if isinstance(text, str) else None
    if match is None:
        raise ValueError(f"runtime = {text!r}: expected a name and an optional version, like "
                         "rccl, nccl 2.18.3 or rccl-2.18.3")
    return match.group(1).lower(), match.group(2)


def _given_runtime(name: str, runtime: str | None, channels: int | None
                   ) -> tuple[str | None, str | None, int | None]:
    """The caller's ``runtime`` (split into a name and a version) and ``channels``, checked."""
    runtime_name = version = None
    if runtime is not None:
        try:
            runtime_name, version = split_runtime(runtime)
        except ValueError as exc:
            raise FileFormatError(name, str(exc)) from None
    if channels is not None and (isinstance(channels, bool) or not isinstance(channels, int)
                                 or not 1 <= channels <= _MAX_CHANNELS_CLAIMED):
        raise FileFormatError(name, f"channels = {channels!r}: expected a whole number from 1 "
                                    f"to {_MAX_CHANNELS_CLAIMED}")
    return runtime_name, version, channels


def _with_runtime(log: BenchmarkLog, text: str,
                  given: tuple[str | None, str | None, int | None]) -> BenchmarkLog:
    """``log`` with the runtime and channel count the text says, overridden by ``given``."""
    import dataclasses

    runtime = version = None
    if (m := _RUNTIME_BANNER.search(text)) is not None:
        runtime, version = m.group(1).lower(), m.group(2)
    elif (m := _RUNTIME_SPEC_ROW.search(text)) is not None:
        runtime, version = m.group(1).lower(), m.group(2)
    elif (m := _JSON_NCCL_VERSION.search(text)) is not None and \
            (version := _nccl_version(int(m.group(1)))) is not None:
        runtime = "nccl"
    channels = None
    for pattern in (_RING_LINE, _COLL_CHANNELS, _N_CHANNELS, _MAX_CHANNELS):
        found = [int(m.group(1)) for m in pattern.finditer(text)
                 if pattern is not _RING_LINE or "->" not in m.string[m.end():m.end() + 200]
                 .split("\n", 1)[0]]
        found = [n for n in found if 1 <= n <= _MAX_CHANNELS_CLAIMED]
        if found:
            channels = max(found)
            break
    given_name, given_version, given_channels = given
    if given_name is not None:
        runtime, version = given_name, given_version
    if given_channels is not None:
        channels = given_channels
    return dataclasses.replace(log, runtime=runtime, runtime_version=version, channels=channels)
