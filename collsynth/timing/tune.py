"""Tune an algorithm's export: the fastest predicted layout per size range, as MSCCL programs.

:func:`tune_export` lowers every layout the runtime's limits allow (channels and their policy,
instances, protocol) exactly as ``collsynth export`` does, checks each, prices each with the
program model at every requested size, and keeps per size range the fastest, written as programs
with ``minBytes``/``maxBytes`` (:func:`write_tuned`). Details: docs/runtime-model.md, "Tuning".
"""

from __future__ import annotations

import logging
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Mapping, Sequence

import numpy as np

from collsynth.errors import ExportError, InvalidInstanceError
from collsynth.export.limits import estimate_limits, limit_error
from collsynth.export.lower import lower
from collsynth.export.pipeline import AUTO_CHANNELS, check_exported, check_text
from collsynth.export.selection import MSCCL_DEFAULT_MAX_BYTES
from collsynth.export.xml_writer import write_program
from collsynth.runtimes import Runtime, RuntimeConstants, get_runtime, xml_dialect
from collsynth.timing.runtime_model import (PreparedProgram, SimulationOptions, prepare_program,
                                            simulate_program, simulate_sizes)

if TYPE_CHECKING:  # pragma: no cover - for annotations only
    from collsynth.algorithm.model import Algorithm
    from collsynth.export.program import Program
    from collsynth.topology.model import Topology

__all__ = ["Variant", "TunedRow", "TunedRange", "TunedExport", "tune_export", "write_tuned",
           "tuned_file_name", "tune_sizes", "TUNE_INSTANCES", "MSCCL_MAX_NUM_ALGOS",
           "runtime_protocols"]

_log = logging.getLogger(__name__)

#: Instance counts tried. The search is bounded here because every instance multiplies the
#: program (nchunksperloop, steps and thread blocks grow K-fold, and lowering, checking and
#: simulating with them) while, on a program that already has one connection per link, it only
#: adds connections on the same links: 4 is enough to lift a per-connection ceiling on the
#: links a layout already uses, and channels (up to 32, :data:`AUTO_CHANNELS`) spread the rest.
TUNE_INSTANCES = (1, 2, 4)
#: msccl loads at most this many algorithms (docs/msccl-xml.md §13.1): a tuned msccl export
#: keeps at most that many ranges.
MSCCL_MAX_NUM_ALGOS = 4
#: Bisection steps that place a boundary between two sampled sizes (log scale): 12 halvings of
#: a x4 gap put it within 0.02% of the size where the two winners cross.
_BOUNDARY_STEPS = 12
#: Relative difference below which two predicted times are a tie (floating-point rounding).
_TIE = 1e-9


def runtime_protocols(runtime: "str | Runtime") -> tuple[str, ...]:
    """The protocols a tuned export tries for ``runtime``: Simple (the untuned export's, which
    ties keep) first, then the others the runtime runs by default
    (:attr:`~collsynth.runtimes.Runtime.protocols`: RCCL leaves LL128 off on most AMD GPUs).

    >>> runtime_protocols("rccl"), runtime_protocols("msccl")
    (('Simple', 'LL'), ('Simple', 'LL', 'LL128'))
    """
    rt = get_runtime(runtime)
    return ("Simple",) + tuple(p for p in rt.protocols if p != "Simple")


def tune_sizes(min_bytes: int = 1024, max_bytes: int = 1 << 30, factor: int = 4
               ) -> tuple[int, ...]:
    """``min_bytes``, ``min_bytes x factor``, ... up to ``max_bytes`` (the default 1 KiB .. 1 GiB
    in x4 steps: 11 sizes).

    >>> tune_sizes(1024, 1 << 20)
    (1024, 4096, 16384, 65536, 262144, 1048576)
    """
    if min_bytes < 1 or max_bytes < min_bytes or factor < 2:
        raise InvalidInstanceError(f"tune sizes {min_bytes}..{max_bytes} x{factor}: expected "
                                   "1 <= min <= max and a factor >= 2")
    sizes, size = [], min_bytes
    while size <= max_bytes:
        sizes.append(size)
        size *= factor
    return tuple(sizes)


@dataclass(frozen=True, order=True)
class Variant:
    """One way to lower an algorithm: ``channels`` spread by ``channel_by`` (``"chunk"`` or
    ``"peer"``, :func:`collsynth.export.lower.lower`), ``instances`` and ``protocol``."""

    channels: int
    channel_by: str
    instances: int
    protocol: str

    @property
    def label(self) -> str:
        """``"2ch/peer x1 LL"``: channels/policy, instances, protocol."""
        return f"{self.channels}ch/{self.channel_by} x{self.instances} {self.protocol}"

    def as_dict(self) -> dict[str, object]:
        return {"channels": self.channels, "channel_by": self.channel_by,
                "instances": self.instances, "protocol": self.protocol}


@dataclass(frozen=True)
class TunedRow:
    """One requested size: the ``variant`` the tuned export runs there and its predicted
    ``time_us`` / ``algbw_gbps``, beside the untuned export's (the default export options)."""

    size_bytes: int
    variant: Variant
    time_us: float
    algbw_gbps: float
    untuned_time_us: float
    untuned_algbw_gbps: float

    @property
    def speedup(self) -> float:
        """Untuned time over tuned time (>= 1 when the range's variant is the size's fastest)."""
        return self.untuned_time_us / self.time_us if self.time_us > 0 else 1.0

    def as_dict(self) -> dict[str, object]:
        return {"size_bytes": self.size_bytes, "variant": self.variant.label,
                **self.variant.as_dict(), "time_us": self.time_us,
                "algbw_gbps": self.algbw_gbps, "untuned_time_us": self.untuned_time_us,
                "untuned_algbw_gbps": self.untuned_algbw_gbps, "speedup": self.speedup}


@dataclass(frozen=True)
class TunedRange:
    """Sizes ``min_bytes..max_bytes`` (both inclusive; ``max_bytes`` ``None``: unbounded) run
    by ``variant``; ``program`` is its checked program with that range written in
    ``minBytes``/``maxBytes``, ``text`` its XML (with ``render=False``: the variant's checked
    layout, ``Simple`` and no byte range, and no text). ``prepared`` is the layout as the
    program model prepared it (time it with ``protocol=variant.protocol``)."""

    min_bytes: int
    max_bytes: int | None
    variant: Variant
    program: "Program" = field(repr=False, compare=False)
    text: str = field(repr=False, compare=False)
    prepared: PreparedProgram | None = field(default=None, repr=False, compare=False)

    def contains(self, size_bytes: int) -> bool:
        return self.min_bytes <= size_bytes and (self.max_bytes is None
                                                 or size_bytes <= self.max_bytes)


@dataclass(frozen=True)
class TunedExport:
    """What :func:`tune_export` found.

    ``rows``: one per requested size (ascending). ``ranges``: contiguous, non-overlapping,
    from 0 up, the last unbounded except on msccl (which cannot say "unlimited": it ends at the
    largest requested size or msccl's 128 MiB default, whichever is larger). ``untuned``: the
    variant ``collsynth export`` writes by default. ``tried``: every variant priced;
    ``skipped``: layouts not priced and why (a limit exceeded, or the same program as an
    earlier layout).
    """

    algorithm: str
    runtime: str
    constants: RuntimeConstants = field(repr=False)
    untuned: Variant
    rows: tuple[TunedRow, ...]
    ranges: tuple[TunedRange, ...]
    tried: tuple[Variant, ...]
    skipped: Mapping[str, str] = field(default_factory=dict)

    def range_of(self, size_bytes: int) -> TunedRange:
        """The range holding ``size_bytes``.

        Raises
        ------
        InvalidInstanceError
            For a size no range holds (above an msccl export's last ``maxBytes``).
        """
        for r in self.ranges:
            if r.contains(size_bytes):
                return r
        raise InvalidInstanceError(f"{size_bytes} bytes: no tuned range holds it (the last "
                                   f"ends at {self.ranges[-1].max_bytes})")


@dataclass
class _Layout:
    """One lowered, checked, prepared layout (protocol-independent)."""

    channels: int
    channel_by: str
    instances: int
    prepared: PreparedProgram


def _check_sizes(sizes: Sequence[int]) -> list[int]:
    if isinstance(sizes, (str, bytes)) or not len(sizes):
        raise InvalidInstanceError("tune: give at least one size in bytes")
    result = []
    for size in sizes:
        if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 1:
            raise InvalidInstanceError(f"tune: size {size!r}; expected whole bytes >= 1")
        result.append(int(size))
    return sorted(set(result))


def _same_program_key(program: "Program") -> tuple:
    """What makes two layouts the same program (names, protocol and byte range aside)."""
    return (program.nchannels, program.nchunksperloop, program.gpus)


def tune_export(algorithm: "Algorithm", runtime: str, topology: "Topology | None" = None,
                sizes: Sequence[int] = tune_sizes(), *,
                constants: RuntimeConstants | None = None,
                protocols: Sequence[str] | None = None,
                layouts: Sequence[tuple[int, str]] = AUTO_CHANNELS,
                instances: Sequence[int] = TUNE_INSTANCES,
                max_ranges: int | None = None, inplace: bool = False, outofplace: bool = True,
                name: str | None = None, refine: bool = True, render: bool = True,
                options: SimulationOptions = SimulationOptions(),
                progress: Callable[[str], None] | None = None) -> TunedExport:
    """Search the layouts of ``algorithm`` for ``runtime`` and keep the fastest per size range.

    Parameters
    ----------
    algorithm:
        A verified algorithm.
    runtime:
        ``msccl``, ``rccl`` or ``msccl-executor``: the lowering's rules and limits.
    topology:
        The machine the program is priced on (ranks in order; it needs ``unit_gbps``); default
        the algorithm's own.
    sizes:
        Message sizes in bytes (nccl-tests convention) the search prices; default 1 KiB ..
        1 GiB in x4 steps.
    constants:
        The runtime's constants (a calibration); default its documented defaults.
    protocols:
        Protocols tried (default :func:`runtime_protocols`).
    layouts, instances:
        (channels, channel policy) pairs and instance counts tried (default
        :data:`AUTO_CHANNELS` and :data:`TUNE_INSTANCES`); a layout over the runtime's
        limits (channels x instances above ``MAXCHANNELS``, steps, thread blocks...) is
        skipped, with the reason in ``skipped``.
    max_ranges:
        At most this many ranges (programs); default 4 on msccl (``MSCCL_MAX_NUM_ALGOS``),
        else unbounded. Extra ranges are merged where merging costs the least predicted time.
    inplace, outofplace, name:
        As for :func:`collsynth.export.lower.lower`.
    refine:
        Place each boundary between two sampled sizes where the two winners cross (a
        bisection on log size); otherwise at the geometric midpoint.
    render:
        Lower, check and write each range's program with its byte range (default). ``False``
        skips that (for a caller that lowers the ranges it keeps itself, ``collsynth plan``):
        each range then holds its variant's checked layout and no text.
    progress:
        Called with one line per layout priced.

    Returns
    -------
    TunedExport
        The table per size (the chosen variant and the untuned export's times) and one checked
        program per range. The untuned variant is always among those priced, so no size's
        fastest is slower than it.

    Examples
    --------
    >>> from collsynth.algorithm import Algorithm, Send, Step, verify
    >>> from collsynth.collective import allgather
    >>> from collsynth.topology import get_topology
    >>> from collsynth.topology.builtins import with_figures
    >>> ring = with_figures(get_topology("ring:4"), unit_gbps=10.0, alpha_us=1.0)
    >>> steps = tuple(Step(1, tuple(Send((r - t) % 4, r, (r + 1) % 4) for r in range(4)))
    ...               for t in range(3))
    >>> algo = verify(Algorithm("ring", ring, allgather(4), steps))
    >>> tuned = tune_export(algo, "msccl", sizes=[1024, 1 << 30])
    >>> [(r.variant.protocol, r.time_us <= r.untuned_time_us) for r in tuned.rows]
    [('LL', True), ('Simple', True)]

    Raises
    ------
    ExportError
        No layout meets the runtime's limits (every exceeded limit named), or the runtime
        cannot express the collective.
    InvalidInstanceError
        Bad sizes, or a topology whose ranks differ from the algorithm's.
    InvalidTopologyError
        A topology without ``unit_gbps``.
    """
    say = progress or (lambda line: None)
    rt = xml_dialect(runtime)
    requested = _check_sizes(sizes)
    where = topology if topology is not None else algorithm.topology
    if where.num_ranks != algorithm.topology.num_ranks:
        raise InvalidInstanceError(f"tune: the algorithm has {algorithm.topology.num_ranks} "
                                   f"ranks but topology {where.name!r} has {where.num_ranks}")
    constants = constants if constants is not None else get_runtime(rt.name).defaults
    protos = tuple(protocols) if protocols is not None else runtime_protocols(rt.name)
    if not protos or "Simple" not in protos:
        raise InvalidInstanceError("tune: the protocols must include Simple (the untuned "
                                   "export's)")
    if max_ranges is None and rt.name == "msccl":
        max_ranges = MSCCL_MAX_NUM_ALGOS
    if max_ranges is not None and max_ranges < 1:
        raise InvalidInstanceError(f"tune: max_ranges = {max_ranges!r}; expected >= 1")
    instance_counts = sorted({int(k) for k in instances} | {1})
    candidates = [(c, by, k) for k in instance_counts for c, by in layouts]
    # The untuned export first (ties keep it): one channel, by chunk, one instance, Simple; or,
    # where one channel is over a limit, the fewest channels that fit (``--channels auto``).
    candidates.sort(key=lambda x: (x[2] != 1, AUTO_CHANNELS.index(x[:2])
                                   if x[:2] in AUTO_CHANNELS else len(AUTO_CHANNELS)))
    if (1, "chunk", 1) not in candidates:
        candidates.insert(0, (1, "chunk", 1))
    built: list[_Layout] = []
    skipped: dict[str, str] = {}
    seen: dict[tuple, str] = {}
    violations: list = []
    for channels, channel_by, k in candidates:
        label = f"{channels}ch/{channel_by} x{k}"
        if channels * k > rt.max_channels:
            skipped[label] = (f"{channels * k} channels: more than {rt.name}'s MAXCHANNELS "
                              f"({rt.max_channels})")
            continue
        over = estimate_limits(algorithm, rt.name, channels=channels, instances=k,
                               inplace=inplace, outofplace=outofplace, channel_by=channel_by)
        if over:
            skipped[label] = "; ".join(str(v) for v in over[:2])
            violations = over
            continue
        try:
            program = lower(algorithm, runtime=rt.name, proto="Simple", channels=channels,
                            channel_by=channel_by, instances=k, inplace=inplace,
                            outofplace=outofplace, name=name)
        except ExportError as exc:
            if getattr(exc, "violations", None):
                skipped[label] = str(exc)
                violations = list(exc.violations)  # type: ignore[attr-defined]
                continue
            raise
        key = _same_program_key(program)
        if key in seen:
            skipped[label] = f"the same program as {seen[key]}"
            continue
        seen[key] = label
        check_exported(program, rt.name, algorithm)   # nothing unchecked may be chosen
        built.append(_Layout(channels, channel_by, k, prepare_program(program, where)))
        say(f"lowered and checked {label} ({program.nchannels} channel(s) used)")
    if not built:
        raise limit_error(violations, f"the {rt.name} program of {algorithm.name!r} on every "
                          "layout tried") if violations else ExportError(
            f"no layout of {algorithm.name!r} could be lowered for {rt.name}")
    untuned_layout = built[0]
    variants = [Variant(layout.channels, layout.channel_by, layout.instances, proto)
                for layout in built for proto in protos]
    prepared = [layout.prepared for layout in built for _ in protos]
    untuned = variants.index(Variant(untuned_layout.channels, untuned_layout.channel_by,
                                     untuned_layout.instances, "Simple"))
    table = _price_all(variants, prepared, requested, constants, options, untuned)
    say(f"priced {len(variants)} variant(s) of {len(built)} layout(s) at {len(requested)} "
        "size(s)")
    # The first variant within rounding of the fastest: ties keep the untuned export, then the
    # fewest channels and instances (the search order).
    fastest = table.min(axis=0) * (1 + _TIE)
    best = [int(np.flatnonzero(table[:, j] <= fastest[j])[0]) for j in range(len(requested))]
    groups = _group(best)
    if max_ranges is not None:
        groups = _merge(groups, table, max_ranges)

    def price(v: int, size: int) -> float:
        return simulate_program(prepared[v], None, size, constants,
                                protocol=variants[v].protocol, options=options).time_us

    bounds = [0]
    for (a, ia), (b, ib) in zip(groups, groups[1:]):
        lo, hi = requested[ia[-1]], requested[ib[0]]
        bounds.append(_boundary(lo, hi, lambda s: price(b, s) < price(a, s)) if refine
                      else max(lo + 1, math.isqrt(lo * hi)))
    last_max: int | None = None
    if not rt.max_bytes_zero_is_unlimited:  # msccl: no "unlimited"; it sizes scratch by it
        last_max = max(requested[-1], MSCCL_DEFAULT_MAX_BYTES - 1)
    ranges = []
    for index, (v, _) in enumerate(groups):
        lo = bounds[index]
        hi = bounds[index + 1] - 1 if index + 1 < len(groups) else last_max
        variant = variants[v]
        if not render:
            ranges.append(TunedRange(lo, hi, variant, prepared[v].program, "", prepared[v]))
            continue
        program = lower(algorithm, runtime=rt.name, proto=variant.protocol,
                        channels=variant.channels, channel_by=variant.channel_by,
                        instances=variant.instances, inplace=inplace, outofplace=outofplace,
                        min_bytes=lo, max_bytes=hi, name=name)
        check_exported(program, rt.name, algorithm)
        text = write_program(program, rt.name)
        check_text(text, rt.name)
        ranges.append(TunedRange(lo, hi, variant, program, text, prepared[v]))
    rows = []
    for j, size in enumerate(requested):
        v = next(g for g, members in groups if j in members)
        t, u = float(table[v, j]), float(table[untuned, j])
        rows.append(TunedRow(size, variants[v], t, size / (t * 1e3), u, size / (u * 1e3)))
    return TunedExport(algorithm.name, rt.name, constants, variants[untuned], tuple(rows),
                       tuple(ranges), tuple(variants), skipped)


def _price_all(variants: Sequence[Variant], prepared: Sequence[PreparedProgram],
               sizes: Sequence[int], constants: RuntimeConstants, options: SimulationOptions,
               untuned: int) -> np.ndarray:
    """Predicted time (us) of every variant at every size, exact where it can matter.

    Without link sharing a connection runs at its own cap, which sharing only lowers, and a
    transfer's finish only grows with its duration: so the unshared time (one pass of the
    simulator) is a lower bound of the shared one. Each size prices the untuned variant and
    then the others in the order of their bounds, exactly, until the next bound is worse than
    the fastest exact time found (a tie is priced: the search order breaks it); the rest keep
    ``inf`` (they cannot win). This keeps the answer exact and runs each variant's fixed point
    only where it is a contender.
    """
    loose = SimulationOptions(share_links=False, max_passes=1, tolerance=options.tolerance)
    bound = np.array([[t.time_us for t in simulate_sizes(p, None, sizes, constants,
                                                         protocol=v.protocol, options=loose)]
                      for v, p in zip(variants, prepared)])
    if not options.share_links:
        return bound
    table = np.full(bound.shape, np.inf)
    table[untuned] = [t.time_us for t in simulate_sizes(
        prepared[untuned], None, sizes, constants, protocol=variants[untuned].protocol,
        options=options)]
    for j, size in enumerate(sizes):
        for v in np.argsort(bound[:, j], kind="stable"):
            if bound[v, j] > table[:, j].min() * (1 + _TIE):   # ties are priced too
                break
            if np.isinf(table[v, j]):
                table[v, j] = simulate_program(prepared[v], None, size, constants,
                                               protocol=variants[v].protocol,
                                               options=options).time_us
    return table


def _group(best: Sequence[int]) -> list[tuple[int, list[int]]]:
    """Runs of consecutive sizes with the same winner: ``[(variant, [size indices])]``."""
    groups: list[tuple[int, list[int]]] = []
    for j, v in enumerate(best):
        if groups and groups[-1][0] == v:
            groups[-1][1].append(j)
        else:
            groups.append((v, [j]))
    return groups


def _merge(groups: list[tuple[int, list[int]]], table: np.ndarray, limit: int
           ) -> list[tuple[int, list[int]]]:
    """Merge neighbouring ranges until at most ``limit`` remain, each time the pair whose
    merged range (run by the variant best over both) loses the least: the sum over its sizes
    of log(time / the size's fastest time), i.e. relative slowdowns, so small and large sizes
    weigh alike."""
    loss = np.log(table / table.min(axis=0))
    groups = [(v, list(m)) for v, m in groups]
    while len(groups) > limit:
        choice = None
        for i in range(len(groups) - 1):
            members = groups[i][1] + groups[i + 1][1]
            cost = loss[:, members].sum(axis=1)
            v = int(np.argmin(cost))
            extra = cost[v] - loss[groups[i][0], groups[i][1]].sum() \
                - loss[groups[i + 1][0], groups[i + 1][1]].sum()
            if choice is None or extra < choice[0]:
                choice = (extra, i, v, members)
        _, i, v, members = choice
        groups[i:i + 2] = [(v, members)]
        # Neighbours that now share a variant are one range.
        merged: list[tuple[int, list[int]]] = []
        for g in groups:
            if merged and merged[-1][0] == g[0]:
                merged[-1] = (g[0], merged[-1][1] + g[1])
            else:
                merged.append(g)
        groups = merged
    return groups


def _boundary(lo: int, hi: int, second_wins: Callable[[int], bool]) -> int:
    """The first size in ``(lo, hi]`` from which the second of two variants is taken: where
    they cross by bisection on log size (``lo``: the first wins; ``hi``: the second)."""
    for _ in range(_BOUNDARY_STEPS):
        if hi - lo <= 1:
            break
        mid = min(hi - 1, max(lo + 1, math.isqrt(lo * hi)))
        if second_wins(mid):
            hi = mid
        else:
            lo = mid
    return hi


def tuned_file_name(tuned: TunedExport, tuned_range: TunedRange, stem: str | None = None) -> str:
    """``STEM-MINB-MAXB.xml`` (``inf`` for an unbounded range), made safe for a file name."""
    from collsynth._output import safe_file_name

    top = "inf" if tuned_range.max_bytes is None else f"{tuned_range.max_bytes}B"
    base = safe_file_name(stem or tuned.algorithm, default="tuned")
    return safe_file_name(f"{base}-{tuned.runtime}-{tuned_range.min_bytes}B-{top}") + ".xml"


def other_tuned_files(tuned: TunedExport, folder: str | os.PathLike[str], *,
                      stem: str | None = None) -> tuple[Path, ...]:
    """Files in ``folder`` named as :func:`tuned_file_name` names this algorithm's programs for
    this runtime, but for other ranges than ``tuned``'s: an earlier tuning's, which a runtime
    loading the whole folder would take with these (their size ranges may overlap)."""
    from collsynth._output import safe_file_name

    base = safe_file_name(stem or tuned.algorithm, default="tuned")
    prefix = safe_file_name(f"{base}-{tuned.runtime}-")
    pattern = re.compile(re.escape(prefix) + r"[0-9]+B-(?:[0-9]+B|inf)\.xml")
    ours = {tuned_file_name(tuned, r, stem) for r in tuned.ranges}
    try:
        names = sorted(os.listdir(folder))
    except OSError:  # no folder yet: nothing earlier
        return ()
    return tuple(Path(folder) / n for n in names if pattern.fullmatch(n) and n not in ours)


def write_tuned(tuned: TunedExport, folder: str | os.PathLike[str], *,
                stem: str | None = None) -> tuple[Path, ...]:
    """Write every range's program into ``folder`` (created when missing, one level), one file
    per range named by :func:`tuned_file_name`, all or nothing
    (:func:`collsynth._output.staged_folder`); return the paths.

    Raises
    ------
    OutputPathError
        ``folder`` or a file in it cannot be written (nothing is written then).
    """
    from collsynth._output import staged_folder, write_text_atomic

    names = [tuned_file_name(tuned, r, stem) for r in tuned.ranges]
    with staged_folder(folder) as staging:
        for name, r in zip(names, tuned.ranges):
            write_text_atomic(staging / name, r.text)
    return tuple(Path(folder) / name for name in names)
