"""Calibration files: one format for every calibration collsynth writes, with a ``kind``.

A :class:`CurveCalibration` (``kind: "curve"``, ``collsynth calibrate``) holds, for one machine,
one entry per fitted log and model: the closed form's measured figures and the runtime's
measured lines. A :class:`RuntimeCalibration` (``kind: "runtime-constants"``,
``collsynth calibrate --model program``) holds a runtime's fitted constants for the program
model. :func:`load_calibration` reads either (and the files of earlier versions).

The details: ``docs/timing.md``, section "Calibration files (collsynth.timing.calibration)".
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
from dataclasses import dataclass, field
from typing import Any, ClassVar, Mapping, Sequence, Union

from collsynth._atomic import write_text_atomic
from collsynth._files import read_bytes_bounded
from collsynth._parse import (
    MAX_GBPS,
    MAX_SIZE_BYTES,
    MAX_TIME_US,
    MIN_GBPS,
    MIN_TIME_US,
    clean_name,
    clean_text,
    format_version_is,
    parse_json,
    shown,
)
from collsynth.errors import (
    FileFormatError,
    InvalidInstanceError,
    InvalidTopologyError,
    UnknownNameError,
)
from collsynth.runtimes import RuntimeConstants, get_runtime, parse_given_version, runtime_names
from collsynth.runtimes.constants import (MIN_LATENCY_US, constants_from_dict,
                                         constants_to_dict)
from collsynth.timing.alphabeta import AlphaBeta
from collsynth.timing.fit import (CENTER_MARGIN_DOUBLINGS, LATENCY_EXPONENT_MAX, MODELS,
                                  STEEPNESS_BOUNDS, LogFits)
from collsynth.collective.kinds import busbw_factor
from collsynth.timing.logs import LOGGED_COLLECTIVES, canonical_collective
from collsynth.timing.tuning_model import ring_steps
from collsynth.topology.model import Topology

__all__ = [
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "KINDS",
    "MAX_CALIBRATION_BYTES",
    "CalibrationEntry",
    "CurveCalibration",
    "RuntimeCalibration",
    "Calibration",
    "calibration_from_fits",
    "runtime_constants",
    "calibration_to_json",
    "calibration_from_json",
    "save_calibration",
    "load_calibration",
    "egress_units",
    "calibration_steps",
]

_log = logging.getLogger(__name__)

FORMAT_NAME = "collsynth-calibration"
FORMAT_VERSION = 2
#: The kinds of calibration a file holds.
KINDS = ("curve", "runtime-constants")
#: The format of runtime-constants files before version 2 (still read).
_LEGACY_RUNTIME_FORMAT = "collsynth-runtime-constants"
#: Largest calibration file read (bytes).
MAX_CALIBRATION_BYTES = 16 * 1024 * 1024
#: The most entries a calibration file may have.
_MAX_ENTRIES = 100_000

# Figures of each model: name -> (required, kind).
# Kinds: "pos" > 0, "bytes" a whole number >= 1, "us" a call's time (1 ps to an hour),
# "us_per_byte" the time of a byte at 1 kB/s to 1 PB/s (MIN_GBPS to MAX_GBPS), "gbps" a
# bandwidth in that range, and the ranges of _RANGES: the piecewise fit's own bounds
# (collsynth.timing.fit) and an error (GMAE) from 0 to MAX_GMAE. A calibration writes none
# outside them; a hand-edited 0 priced a 1 GiB allreduce at 35 us and 1e300 printed a 300-digit
# time (docs/file-formats.md, "Counts that size work", lists the ranges).
_PARAMS: dict[str, dict[str, tuple[bool, str]]] = {
    "alpha-beta": {
        "alpha_us": (True, "us"), "beta_us_per_byte": (True, "us_per_byte"),
        "busbw_gbps": (True, "gbps"), "algbw_gbps": (False, "gbps"),
        "latency_max_bytes": (False, "bytes"), "bandwidth_min_bytes": (False, "bytes"),
    },
    "piecewise": {
        "alpha_us": (True, "us"), "busbw_gbps": (True, "gbps"), "knee_bytes": (True, "bytes"),
        "saturation_bytes": (True, "bytes"), "center_bytes": (True, "center"),
        "steepness": (True, "steepness"), "min_bytes": (False, "bytes"),
        "latency_exponent": (False, "exponent"),
        # Written before the curve was made continuous; read and ignored.
        "sigmoid_low_gbps": (False, "pos"), "sigmoid_high_gbps": (False, "pos"),
    },
}
#: The largest error (GMAE, a fraction) an entry may record: a fit off by the ratio of the longest
#: call a log may hold to the shortest (an hour to a nanosecond, 3.6e12); beyond it a hand edit,
#: which tables print as a number of hundreds of digits.
MAX_GMAE = MAX_TIME_US / MIN_TIME_US
#: Ranges of the figures of the piecewise fit and of the errors: kind -> (low, high, unit). The
#: fit writes nothing outside the first three (its own bounds).
_RANGES: dict[str, tuple[float, float, str]] = {
    "steepness": (*STEEPNESS_BOUNDS, "per doubling of the size"),
    "exponent": (0.0, LATENCY_EXPONENT_MAX, "(the latency piece grows at most 19% a doubling)"),
    "center": (2.0 ** -CENTER_MARGIN_DOUBLINGS,
               2.0 ** (MAX_SIZE_BYTES.bit_length() - 1 + CENTER_MARGIN_DOUBLINGS),
               f"bytes (within {CENTER_MARGIN_DOUBLINGS} doublings of 1 B to 2^50 B)"),
    "gmae": (0.0, MAX_GMAE, "(a fraction: 0.1 is 10%)"),
}
_ENTRY_KEYS = ("file", "collective", "ranks", "model", "gmae", "gmae_rows", "gmae_heldout",
               "runtime", "runtime_version", "channels")
#: The most channels an entry may record (NCCL and RCCL have at most 64 today).
_MAX_CHANNELS = 1024


@dataclass(frozen=True)
class CalibrationEntry:
    """The figures of one model fitted to one log.

    Parameters
    ----------
    file:
        The log the figures were fitted to.
    collective:
        collsynth's name of its collective (other spellings are normalised: ``all_reduce``).
    ranks:
        Its number of ranks.
    model:
        ``"alpha-beta"`` or ``"piecewise"`` (:data:`collsynth.timing.fit.MODELS`).
    params:
        The model's figures (see docs/timing.md), e.g. ``alpha_us``, ``busbw_gbps``.
    gmae, gmae_rows, gmae_heldout:
        The fit's error over the sweep, over every row, and on the sizes a fit to every other
        size did not see, as fractions (``gmae_rows`` and ``gmae_heldout`` optional).
    runtime, runtime_version, channels:
        What the log was measured with (``"rccl"``, ``"2.18.3"``, 2), when known.
    """

    file: str
    collective: str
    ranks: int
    model: str
    params: Mapping[str, float] = field(hash=False)
    gmae: float = 0.0
    gmae_rows: float | None = None
    gmae_heldout: float | None = None
    runtime: str | None = None
    runtime_version: str | None = None
    channels: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.collective, str) or not isinstance(self.params, Mapping):
            raise InvalidInstanceError("calibration entry: collective must be a string and "
                                       "params a mapping")
        object.__setattr__(self, "collective", canonical_collective(self.collective))
        object.__setattr__(self, "params", dict(self.params))
        problem = _entry_problem(self)
        if problem is not None:
            raise InvalidInstanceError(f"calibration entry {problem[0]}: {problem[1]}")

    @property
    def alpha_us(self) -> float:
        """The small-message time of the collective (latency regime, or constant overhead)."""
        return float(self.params["alpha_us"])

    @property
    def busbw_gbps(self) -> float:
        """The large-message bus bandwidth (bandwidth regime, or peak)."""
        return float(self.params["busbw_gbps"])

    @property
    def beta_us_per_byte(self) -> float:
        """Microseconds per byte of the whole collective at large sizes (``1 / algbw``)."""
        if "beta_us_per_byte" in self.params:
            return float(self.params["beta_us_per_byte"])
        try:
            factor = float(busbw_factor(self.collective, self.ranks))
        except UnknownNameError:  # no nccl-tests convention: busbw is algbw
            factor = 1.0
        return factor / (self.busbw_gbps * 1e3)

    def to_json(self) -> dict[str, object]:
        """The entry as stored in a calibration file."""
        obj: dict[str, object] = {"file": self.file, "collective": self.collective,
                               "ranks": self.ranks, "model": self.model}
        for key in ("runtime", "runtime_version", "channels"):
            if getattr(self, key) is not None:
                obj[key] = getattr(self, key)
        obj.update(self.params)
        obj["gmae"] = self.gmae
        for key in ("gmae_rows", "gmae_heldout"):
            if getattr(self, key) is not None:
                obj[key] = getattr(self, key)
        return obj


@dataclass(frozen=True)
class CurveCalibration:
    """Fitted figures of one machine (``kind`` ``"curve"``): see docs/timing.md.

    Parameters
    ----------
    topology:
        The machine's name (a built-in topology name, a topology file, or free text).
    entries:
        One per fitted log and model.
    nodes:
        How many such machines the logs were measured on (``--nodes``), 1 by default.

    Examples
    --------
    >>> from collsynth.topology import get_topology
    >>> entry = CalibrationEntry("ar.txt", "allreduce", 8, "alpha-beta",
    ...                          {"alpha_us": 35.0, "beta_us_per_byte": 7.5e-06,
    ...                           "busbw_gbps": 240.0}, gmae=0.1)
    >>> calibration = CurveCalibration("dgx1", (entry,))
    >>> calibration.alpha_beta_for("all_reduce")
    AlphaBeta(alpha_us=35.0, beta_us_per_byte=7.5e-06)
    >>> dgx1 = calibration.apply(get_topology("dgx1"))
    >>> dgx1.unit_gbps, dgx1.alpha_us  # 240 GB/s over 6 NVLinks; 35 us over 14 ring steps
    (40.0, 2.5)
    """

    topology: str
    entries: tuple[CalibrationEntry, ...]
    nodes: int = 1
    kind: ClassVar[str] = "curve"

    def __post_init__(self) -> None:
        if not isinstance(self.entries, tuple):
            object.__setattr__(self, "entries", tuple(self.entries))
        if isinstance(self.nodes, bool) or not isinstance(self.nodes, int) or self.nodes < 1:
            raise InvalidInstanceError(f"calibration nodes = {self.nodes!r}: expected a whole "
                                       "number >= 1")

    def collectives(self) -> tuple[str, ...]:
        """The collectives with at least one entry, in file order."""
        return tuple(dict.fromkeys(e.collective for e in self.entries))

    def entries_for(self, collective: str, *, ranks: int | None = None,
                    model: str | None = None) -> tuple[CalibrationEntry, ...]:
        """The entries of a collective (any spelling), optionally of one rank count and model."""
        name = canonical_collective(collective)
        return tuple(e for e in self.entries
                     if e.collective == name and (ranks is None or e.ranks == ranks)
                     and (model is None or e.model == model))

    def alpha_beta_for(self, collective: str, *, ranks: int | None = None) -> AlphaBeta:
        """The fitted line of ``collective`` as measured: ``time_us = alpha_us + size_bytes *
        beta_us_per_byte`` for the whole collective, ``size_bytes`` in the nccl-tests
        convention (see docs/timing.md; this is not a per-step model).

        Uses the alpha-beta entry, else the piecewise one (its overhead and ``1 / algbw`` at the
        peak). ``ranks`` chooses between entries of several rank counts.

        Raises
        ------
        UnknownNameError
            When no entry is for ``collective`` (and ``ranks``), or when entries of several rank
            counts match and ``ranks`` is not given.
        """
        entries = self.entries_for(collective, ranks=ranks)
        if not entries:
            known = ", ".join(f"{e.collective} ({e.ranks} ranks)" for e in self._distinct())
            raise UnknownNameError(
                f"calibration for {self.topology!r} has no fit for {collective!r}"
                + (f" on {ranks} ranks" if ranks is not None else "")
                + f"; it has: {known or 'no entries'}")
        counts = sorted({e.ranks for e in entries})
        if len(counts) > 1:
            raise UnknownNameError(
                f"calibration for {self.topology!r} has {canonical_collective(collective)} fits "
                f"for {', '.join(map(str, counts))} ranks; say which (ranks=...)")
        entry = _preferred(entries)
        return AlphaBeta(alpha_us=entry.alpha_us, beta_us_per_byte=entry.beta_us_per_byte)

    def applied_entry(self, topology: Topology) -> CalibrationEntry:
        """The entry :meth:`apply` takes its figures from for ``topology``: of its rank count,
        the allreduce one first (its bus bandwidth is the usual yardstick), the alpha-beta fit
        before the piecewise one.

        Raises
        ------
        InvalidTopologyError
            When no entry has the topology's rank count.
        """
        n = topology.num_ranks
        candidates = [e for e in self.entries if e.ranks == n]
        if not candidates:
            counts = sorted({e.ranks for e in self.entries})
            raise InvalidTopologyError(
                f"calibration for {self.topology!r} has fits for "
                f"{', '.join(map(str, counts)) or 'no'} ranks; topology {topology.name!r} has "
                f"{n}: calibrate with logs measured on {n} ranks")
        allreduce = [e for e in candidates if e.collective == "allreduce"]
        first = (allreduce or candidates)[0].collective
        return _preferred([e for e in candidates if e.collective == first])

    def apply(self, topology: Topology) -> Topology:
        """``topology`` with ``alpha_us`` and ``unit_gbps`` from the fit of
        :meth:`applied_entry` (see docs/timing.md for the mapping: bus bandwidth over the
        egress units, alpha over :func:`calibration_steps`).

        Raises
        ------
        InvalidTopologyError
            When no entry has the topology's rank count, or no rank of the topology can send.
        """
        entry = self.applied_entry(topology)
        unit_gbps = entry.busbw_gbps / egress_units(topology)
        alpha_us = entry.alpha_us / calibration_steps(entry.collective, entry.ranks)
        if self.topology.strip().lower() != topology.name.strip().lower():
            _log.info("applying the calibration for %r to topology %r", self.topology,
                      topology.name)
        return dataclasses.replace(topology, unit_gbps=unit_gbps, alpha_us=alpha_us)

    def _distinct(self) -> list[CalibrationEntry]:
        seen: dict[tuple[str, int], CalibrationEntry] = {}
        for e in self.entries:
            seen.setdefault((e.collective, e.ranks), e)
        return list(seen.values())


def _preferred(entries: Sequence[CalibrationEntry]) -> CalibrationEntry:
    """The alpha-beta entry if there is one, else the first."""
    for entry in entries:
        if entry.model == "alpha-beta":
            return entry
    return entries[0]


def calibration_steps(collective: str, ranks: int) -> int:
    """The steps a fitted collective's whole-call alpha is spread over (at least 1): those of
    the runtime's ring (:func:`collsynth.timing.tuning_model.ring_steps`: ``2(n-1)`` allreduce,
    ``n-1`` allgather and reduce-scatter, ``n`` broadcast and reduce), and ``n-1`` for a
    collective the runtime runs as send/recv (alltoall, gather, scatter: one message per peer).

    >>> calibration_steps("allreduce", 8), calibration_steps("broadcast", 8)
    (14, 8)
    >>> calibration_steps("alltoall", 8), calibration_steps("allgather", 1)
    (7, 1)
    """
    try:
        return max(ring_steps(collective, ranks), 1)
    except UnknownNameError:
        return max(ranks - 1, 1)


def egress_units(topology: Topology) -> int:
    """The bandwidth units the slowest-sending rank can send per round: for each rank, its
    outgoing link units, capped by every bandwidth group whose only source is that rank (the cap
    covers the group's destinations; links to other ranks add to it); the least over the ranks
    that have any outgoing link.

    >>> from collsynth.topology import get_topology
    >>> egress_units(get_topology("dgx1")), egress_units(get_topology("ring:4"))
    (6, 2)

    Raises
    ------
    InvalidTopologyError
        When no rank has an outgoing link.
    """
    best: int | None = None
    for rank, row in enumerate(topology.links):
        out = sum(row)
        if out == 0:
            continue
        for group in topology.groups:
            if group.sources == frozenset({rank}):
                outside = sum(b for dst, b in enumerate(row) if dst not in group.destinations)
                out = min(out, group.limit + outside)
        best = out if best is None else min(best, out)
    if best is None or best < 1:
        raise InvalidTopologyError(f"topology {topology.name!r}: no rank can send")
    return best



@dataclass(frozen=True)
class RuntimeCalibration:
    """A runtime's constants fitted to its measured curve (``kind`` ``"runtime-constants"``,
    :func:`collsynth.timing.runtime_fit.fit_runtime`): what the program model prices with.

    >>> from collsynth.runtimes import get_runtime
    >>> RuntimeCalibration(get_runtime("rccl").defaults).constants.runtime
    'rccl'
    """

    constants: RuntimeConstants
    #: ``(major, minor)`` of the runtime the curve was measured with (its log's banner), whose
    #: own choices the fit priced; ``None`` when the curve did not say.
    runtime_version: tuple[int, int] | None = None
    #: The measured job's NCCL_ALGO / NCCL_PROTO / NCCL_NVLS_ENABLE as ``NAME=VALUE`` texts
    #: (``calibrate --env``), which the fit priced under; ``()`` when none were given.
    settings: tuple[str, ...] = ()
    kind: ClassVar[str] = "runtime-constants"

    def __post_init__(self) -> None:
        from collsynth.runtimes.settings import settings_from_text

        if not isinstance(self.constants, RuntimeConstants):
            raise InvalidInstanceError("runtime calibration: expected RuntimeConstants")
        if not isinstance(self.settings, tuple) or \
                not all(isinstance(t, str) for t in self.settings):
            raise InvalidInstanceError(f"runtime calibration: settings {self.settings!r}; "
                                       "expected NAME=VALUE texts")
        try:
            settings_from_text(self.settings)
        except ValueError as exc:
            raise InvalidInstanceError(f"runtime calibration: settings: {exc}") from None
        v = self.runtime_version
        if v is not None and not (isinstance(v, tuple) and len(v) == 2
                                  and all(type(x) is int and x >= 0 for x in v)):
            raise InvalidInstanceError(f"runtime calibration: runtime_version {v!r}; expected "
                                       "(major, minor)")


#: Any calibration a file holds (``kind`` tells them apart).
Calibration = Union[CurveCalibration, RuntimeCalibration]


def calibration_from_fits(topology: str, results: Sequence[LogFits], *,
                          nodes: int = 1) -> CurveCalibration:
    """A calibration with both fits of every log, in order (alpha-beta, then piecewise), and
    what each log was measured with."""
    entries = []
    for item in results:
        log = item.log
        for fit in item.fits:
            entries.append(CalibrationEntry(fit.file, fit.collective, fit.ranks, fit.model,
                                            fit.params(), gmae=fit.gmae,
                                            gmae_rows=fit.gmae_rows,
                                            gmae_heldout=fit.gmae_heldout,
                                            runtime=log.runtime,
                                            runtime_version=log.runtime_version,
                                            channels=log.channels))
    return CurveCalibration(topology, tuple(entries), nodes=nodes)


# -- the file format ------------------------------------------------------------------------------


def calibration_to_json(calibration: Calibration) -> dict[str, object]:
    """The JSON object of a calibration file (version 2, with its ``kind``)."""
    head = {"format": FORMAT_NAME, "version": FORMAT_VERSION, "kind": calibration.kind}
    if isinstance(calibration, RuntimeCalibration):
        found = {**head, **constants_to_dict(calibration.constants)}
        if calibration.runtime_version is not None:
            found["runtime_version"] = "%d.%d" % calibration.runtime_version
        if calibration.settings:
            found["settings"] = list(calibration.settings)
        return found
    return {**head, "topology": calibration.topology, "nodes": calibration.nodes,
            "entries": [e.to_json() for e in calibration.entries]}


def calibration_from_json(obj: object, *, source: str = "<calibration>") -> Calibration:
    """Check and read the JSON object of a calibration file of any kind: version 2, version 1
    (curves), or the ``collsynth-runtime-constants`` files of earlier versions.

    Raises
    ------
    FileFormatError
        Naming ``source`` and the field at fault.
    """
    if not isinstance(obj, dict):
        raise FileFormatError(source, "expected a JSON object")
    if obj.get("format") == _LEGACY_RUNTIME_FORMAT:
        return _runtime_from_json(obj, source, legacy=True)
    if obj.get("format") != FORMAT_NAME:
        raise FileFormatError(source, f"format: {shown(obj.get('format'))}; expected "
                                      f"{FORMAT_NAME!r} "
                                      "(is this a calibration file?)")
    version = obj.get("version")
    if not format_version_is(version, 1, FORMAT_VERSION):
        raise FileFormatError(source, f"version: {shown(version)}; this collsynth reads versions "
                                      f"1 and {FORMAT_VERSION}")
    kind = obj.get("kind", "curve") if version == FORMAT_VERSION else "curve"
    if version == FORMAT_VERSION and "kind" not in obj:
        raise FileFormatError(source, f"kind: missing; expected one of {', '.join(KINDS)}")
    if kind not in KINDS:
        raise FileFormatError(source, f"kind: {shown(kind)}; expected one of {', '.join(KINDS)}")
    if kind == "runtime-constants":
        return _runtime_from_json(obj, source, legacy=False)
    return _curve_from_json(obj, source, version)


def _runtime_from_json(obj: dict, source: str, *, legacy: bool) -> RuntimeCalibration:
    if legacy:
        version = obj.get("version")
        if not format_version_is(version, 1):
            raise FileFormatError(source, "missing field 'version'" if version is None else
                                  f"version = {shown(version)}: unknown; this collsynth reads "
                                  "version 1 of collsynth-runtime-constants files")
    fields = {k: v for k, v in obj.items()
              if k not in ("format", "version", "kind", "runtime_version", "settings")}
    settings = _settings_from_json(obj.get("settings", []), source)
    runtime_version = None
    if "runtime_version" in obj:
        given = obj["runtime_version"]
        try:
            runtime_version = parse_given_version(given) if isinstance(given, str) and \
                len(given) <= 64 else None
        except ValueError:
            pass
        if runtime_version is None:
            raise FileFormatError(source, f"runtime_version: {shown(given)}; expected a "
                                          "version like \"2.18\" (MAJOR.MINOR[.PATCH])")
    runtime = fields.get("runtime")
    known = runtime in runtime_names()
    constants = constants_from_dict(fields, base=get_runtime(runtime if known else "nccl")
                                    .defaults, label=source)  # says what is malformed
    if not known:  # well formed, but figures of a runtime collsynth does not model
        raise FileFormatError(source, f"runtime = {shown(runtime)}: expected one of "
                                      f"{', '.join(runtime_names())}")
    return RuntimeCalibration(constants, runtime_version=runtime_version, settings=settings)


def _settings_from_json(given: object, source: str) -> tuple[str, ...]:
    """A runtime calibration's ``settings``: a list of at most one ``NAME=VALUE`` text per
    variable collsynth models, each read as ``--env`` reads it."""
    from collsynth.runtimes.settings import SETTING_NAMES, settings_from_text

    if not isinstance(given, list) or len(given) > len(SETTING_NAMES) or \
            not all(isinstance(t, str) and len(t) <= 256 for t in given):
        raise FileFormatError(source, f"settings: {shown(given)}; expected a list of at most "
                                      f"{len(SETTING_NAMES)} texts like \"NCCL_PROTO=Simple\"")
    try:
        settings_from_text(given)
    except ValueError as exc:
        raise FileFormatError(source, f"settings: {exc}") from None
    return tuple(given)


def _curve_from_json(obj: dict, source: str, version: int) -> CurveCalibration:
    fields = {"format", "version", "topology", "nodes", "entries"} | (
        {"kind"} if version == FORMAT_VERSION else set())
    unknown = sorted(set(obj) - fields)
    if unknown:
        raise FileFormatError(source, f"unknown field(s) {', '.join(map(repr, unknown))}")
    topology = obj.get("topology")
    if not isinstance(topology, str) or not topology.strip():
        raise FileFormatError(source, f"topology: {shown(topology)}; expected a name")
    clean_name(topology, "topology", source=source)
    nodes = obj.get("nodes", 1)
    if isinstance(nodes, bool) or not isinstance(nodes, int) or not 1 <= nodes <= 1 << 20:
        raise FileFormatError(source, f"nodes: {nodes!r}; expected a whole number from 1 to "
                                      f"{1 << 20}")
    raw = obj.get("entries")
    if not isinstance(raw, list):
        raise FileFormatError(source, "entries: expected a list")
    if len(raw) > _MAX_ENTRIES:
        raise FileFormatError(source, f"entries: {len(raw)} is more than the {_MAX_ENTRIES} "
                                      "accepted")
    entries = []
    for index, item in enumerate(raw):
        where = f"entries[{index}]"
        if not isinstance(item, dict):
            raise FileFormatError(source, f"{where}: expected an object")
        model = item.get("model")
        if model not in MODELS:
            raise FileFormatError(source, f"{where}.model: {shown(model)}; expected one of "
                                          f"{', '.join(map(repr, MODELS))}")
        unknown = sorted(set(item) - set(_ENTRY_KEYS) - set(_PARAMS[model]))
        if unknown:
            raise FileFormatError(source, f"{where}: unknown field(s) "
                                          f"{', '.join(map(repr, unknown))} for model {model!r}")
        params = {k: v for k, v in item.items() if k in _PARAMS[model]}
        entry = _Unchecked(item.get("file"), item.get("collective"), item.get("ranks"), model,
                           params, item.get("gmae"), item.get("gmae_rows"),
                           item.get("gmae_heldout"), item.get("runtime"),
                           item.get("runtime_version"), item.get("channels"))
        problem = _entry_problem(entry)
        if problem is not None:
            raise FileFormatError(source, f"{where}{problem[0]}: {problem[1]}")
        clean_text(entry.file, f"{where}.file", source=source)
        clean_name(entry.collective, f"{where}.collective", source=source)
        for key, value in params.items():  # what a log can have measured (see logs.py)
            limit = MAX_TIME_US if key.endswith("_us") else \
                MAX_SIZE_BYTES if key.endswith("_bytes") and key != "center_bytes" else \
                MAX_GBPS if key.endswith("_gbps") else None
            if limit is not None and value > limit:
                raise FileFormatError(source, f"{where}.{key}: {value!r}; expected at most "
                                              f"{limit:g}")
            # Below these, the figures derived from them (alpha per step, GB/s per unit) round
            # to 0 or overflow: the runtime constants' least latency (1 ps), 1 kB/s.
            if key.endswith("_us") and 0 < value < MIN_LATENCY_US:
                raise FileFormatError(source, f"{where}.{key}: {value!r}; expected 0 or at least "
                                              f"{MIN_LATENCY_US:g} (1 ps)")
            if key.endswith("_gbps") and value < MIN_GBPS:
                raise FileFormatError(source, f"{where}.{key}: {value!r}; expected at least "
                                              f"{MIN_GBPS:g} (1 kB/s)")
        order = _order_problem(model, params)
        if order is not None:
            raise FileFormatError(source, f"{where}{order[0]}: {order[1]}")
        entries.append(CalibrationEntry(entry.file, entry.collective, entry.ranks, model,
                                        params, gmae=entry.gmae, gmae_rows=entry.gmae_rows,
                                        gmae_heldout=entry.gmae_heldout, runtime=entry.runtime,
                                        runtime_version=entry.runtime_version,
                                        channels=entry.channels))
    return CurveCalibration(topology, tuple(entries), nodes=nodes)


@dataclass(frozen=True)
class _Unchecked:
    """The fields of an entry as read, before they are checked."""

    file: Any
    collective: Any
    ranks: Any
    model: Any
    params: dict[str, Any]
    gmae: Any
    gmae_rows: Any
    gmae_heldout: Any = None
    runtime: Any = None
    runtime_version: Any = None
    channels: Any = None


def _entry_problem(entry: CalibrationEntry | _Unchecked) -> tuple[str, str] | None:
    """``(".field", what is wrong)`` for the first problem of an entry, or ``None``."""
    for key in ("file", "collective"):
        value = getattr(entry, key)
        if not isinstance(value, str) or not value.strip():
            return f".{key}", f"{value!r}; expected a non-empty string"
    # An entry of a collective nothing prices would be skipped without a word.
    if entry.collective.isprintable() and \
            canonical_collective(entry.collective) not in LOGGED_COLLECTIVES:
        return ".collective", (f"{entry.collective!r}; expected one of "
                               f"{', '.join(LOGGED_COLLECTIVES)}")
    ranks = entry.ranks
    if isinstance(ranks, bool) or not isinstance(ranks, int) or not 1 <= ranks <= 1 << 20:
        return ".ranks", f"{ranks!r}; expected a whole number from 2 to {1 << 20}"
    if ranks == 1:  # it would be read and never applied: no topology of 1 rank is priced
        return ".ranks", ("1; a collective on one rank moves nothing, and a fit is applied only "
                          f"to a topology of its rank count; expected 2 to {1 << 20}")
    if entry.model not in MODELS:
        return ".model", f"{entry.model!r}; expected one of {', '.join(map(repr, MODELS))}"
    spec = _PARAMS[entry.model]
    for key, value in entry.params.items():
        if key not in spec:
            return "", f"unknown field {key!r} for model {entry.model!r}"
        problem = _number_problem(value, spec[key][1])
        if problem:
            return f".{key}", problem
    missing = [k for k, (required, _) in spec.items() if required and k not in entry.params]
    if missing:
        return "", f"missing field(s) {', '.join(map(repr, missing))} of model {entry.model!r}"
    if "algbw_gbps" in entry.params:  # the same figure twice: they must agree
        from_beta = 1e-3 / entry.params["beta_us_per_byte"]
        if abs(entry.params["algbw_gbps"] / from_beta - 1) > 0.01:
            return ".algbw_gbps", (f"{entry.params['algbw_gbps']!r}; expected 1 / "
                                   f"beta_us_per_byte = {from_beta:.6g} GB/s (within 1%)")
    problem = _number_problem(entry.gmae, "gmae")
    if problem:
        return ".gmae", problem
    for key in ("gmae_rows", "gmae_heldout"):
        if getattr(entry, key) is not None:
            problem = _number_problem(getattr(entry, key), "gmae")
            if problem:
                return f".{key}", problem
    for key in ("runtime", "runtime_version"):
        value = getattr(entry, key)
        if value is not None and (not isinstance(value, str) or not value.strip()
                                  or len(value) > 200):
            return f".{key}", f"{value!r}; expected a non-empty string (at most 200 characters)"
    channels = entry.channels
    if channels is not None and (isinstance(channels, bool) or not isinstance(channels, int)
                                 or not 1 <= channels <= _MAX_CHANNELS):
        return ".channels", f"{channels!r}; expected a whole number from 1 to {_MAX_CHANNELS}"
    return None


def _order_problem(model: str, params: dict[str, Any]) -> tuple[str, str] | None:
    """``(".field", why)`` where an entry's sizes contradict one another as no fit writes them:
    the alpha-beta latency regime ends below where its bandwidth regime starts; the piecewise
    curve's first size, knee and saturation come in that order (collsynth.timing.fit)."""
    if model == "alpha-beta":
        end, start = params.get("latency_max_bytes"), params.get("bandwidth_min_bytes")
        if end is not None and start is not None and not end < start:
            return ".bandwidth_min_bytes", (f"{start!r}; expected above latency_max_bytes = "
                                            f"{end!r} (the bandwidth regime starts where the "
                                            "latency regime has ended)")
        return None
    first, knee, saturation = params.get("min_bytes", 1), params["knee_bytes"], \
        params["saturation_bytes"]
    if not first <= knee:
        return ".knee_bytes", f"{knee!r}; expected at least min_bytes = {first!r}"
    if not knee <= saturation:
        return ".saturation_bytes", f"{saturation!r}; expected at least knee_bytes = {knee!r}"
    return None


def _number_problem(value: Any, kind: str) -> str | None:
    if kind == "bytes":
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            return f"{value!r}; expected a whole number of bytes >= 1"
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return f"{value!r}; expected a finite number"
    ranges = {"us": (MIN_LATENCY_US, MAX_TIME_US, "us"),
              "us_per_byte": (1e-3 / MAX_GBPS, 1e-3 / MIN_GBPS, "us per byte"),
              "gbps": (MIN_GBPS, MAX_GBPS, "GB/s"), **_RANGES}
    if kind in ranges:
        low, high, unit = ranges[kind]
        if not low <= value <= high:
            return f"{value!r}; expected {low:g} to {high:g} {unit}"
        if value == 0 and math.copysign(1.0, value) < 0:  # no fit writes it; tables print -0.0%
            return f"{value!r}: a negative zero; expected 0 or more (write 0)"
        return None
    if kind == "pos" and value <= 0:
        return f"{value!r}; expected a number > 0"
    return None


def runtime_constants(calibration: Calibration, source: str) -> RuntimeConstants:
    """The constants of a runtime-constants calibration (read from ``source``).

    Raises
    ------
    FileFormatError
        A curve calibration: it gives the closed form figures, not the program model constants.
    """
    if isinstance(calibration, RuntimeCalibration):
        return calibration.constants
    raise FileFormatError(source, "a curve calibration ('collsynth calibrate'): it gives the "
                                  "closed form its measured figures; the program model reads a "
                                  "runtime-constants one ('collsynth calibrate --model program')")


def save_calibration(calibration: Calibration, path: str | os.PathLike[str]) -> None:
    """Write ``calibration`` (either kind) to ``path`` as JSON (atomically: never a
    half-written file)."""
    write_text_atomic(path, json.dumps(calibration_to_json(calibration), indent=1) + "\n")


def load_calibration(path: str | os.PathLike[str]) -> Calibration:
    """Read a calibration file of any kind (a :class:`CurveCalibration` or a
    :class:`RuntimeCalibration`; ``kind`` says which), of this version or an earlier one.

    Raises
    ------
    FileFormatError
        A missing or unreadable file, malformed JSON (with its line and column), or a field that
        breaks the format (named).
    InputTooLargeError
        A file larger than :data:`MAX_CALIBRATION_BYTES`.
    """
    data = read_bytes_bounded(path, MAX_CALIBRATION_BYTES, what="a calibration file may have")
    return calibration_from_json(parse_json(data, str(path)), source=str(path))
