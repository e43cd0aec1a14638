"""The constants of a runtime (NCCL, RCCL, MSCCL) that the program model needs, and their file.

:class:`RuntimeConstants` holds them per runtime; the defaults and their sources are in
:data:`DEFAULTS` and docs/runtime-model.md, which also describes the file
(``collsynth calibrate-runtime -o rt.json``) that :func:`load_runtime_constants` and
:func:`save_runtime_constants` read and write.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field, replace
from typing import Any, Mapping

from collsynth._files import read_bytes_bounded
from collsynth._parse import (MAX_GBPS, MAX_SIZE_BYTES, MIN_GBPS, clean_name, clean_text,
                              parse_json, shown)
from collsynth.errors import (CollsynthError, FileFormatError, InputTooLargeError,
                              InvalidInstanceError, UnknownNameError)
from collsynth.export.runtimes import RUNTIMES

__all__ = ["PROTOCOLS", "LINK_CLASSES", "PROTOCOL_EFFICIENCY", "NCCL_STEPS", "FORMAT",
           "MAX_CHANNELS", "MAX_FIFO_SLOTS", "MAX_SLOT_BYTES", "MIN_LATENCY_US",
           "MAX_LATENCY_US", "MAX_GAMMA_US_PER_BYTE", "check_channels",
           "RuntimeConstants", "DEFAULTS", "default_constants", "runtime_names",
           "constants_to_dict", "constants_from_dict", "load_runtime_constants",
           "save_runtime_constants", "is_runtime_constants_file"]

PROTOCOLS = ("LL", "LL128", "Simple")
LINK_CLASSES = ("intra", "network")
#: Data bytes per wire byte: LL lines carry 8 bytes of data and 8 of flags, LL128 lines 120 of
#: 128 bytes (NCCL ``src/include/device.h``), Simple only data.
PROTOCOL_EFFICIENCY = {"LL": 0.5, "LL128": 120 / 128, "Simple": 1.0}
#: FIFO slots per connection (``NCCL_STEPS``, NCCL ``src/include/device.h``; RCCL the same).
NCCL_STEPS = 8
FORMAT = "collsynth-runtime-constants"
_VERSION = 1
_MAX_FILE_BYTES = 1024 * 1024

# Plausible ranges of the constants (docs/runtime-model.md, "Constants"); a figure outside is a
# unit mistake or a hostile file, refused with the figure rather than priced.
#: Most channels of a runtime: rccl's MAXCHANNELS (128; NCCL's and msccl's is 32). Every
#: channel is a ring of the runtime's own algorithm that the program model builds and
#: simulates, so the count sizes the work; a channel beyond MAXCHANNELS does not exist.
MAX_CHANNELS = max(rt.max_channels for rt in RUNTIMES.values())
#: Most FIFO slots per connection (and slots per iteration or slice): NCCL_STEPS is 8 in every
#: NCCL and RCCL release; 1024 leaves room for a rebuilt runtime and none for a typo of 10^9.
MAX_FIFO_SLOTS = 1024
#: Largest FIFO slot, wire bytes: NCCL_BUFFSIZE / NCCL_STEPS is 512 KiB by default; a slot of
#: 1 GiB makes an 8 GiB buffer per connection and channel, more than a GPU gives NCCL.
MAX_SLOT_BYTES = 1 << 30
#: Smallest latency that is not 0, us: one picosecond (light crosses 0.3 mm). A smaller one is
#: a unit mistake or a denormal (1e-320), whose reciprocals overflow the simulator's floats.
MIN_LATENCY_US = 1e-6
#: Largest latency, us: one second, 10^4 times NCCL's slowest documented hop (14 us over the
#: network); a larger one is milliseconds taken for microseconds, or worse.
MAX_LATENCY_US = 1e6
#: Slowest reduction, us per byte: one byte per millisecond (1 kB/s, _parse.MIN_GBPS).
MAX_GAMMA_US_PER_BYTE = 1 / (MIN_GBPS * 1e3)
#: The most entries of ``default_protocols`` (one per protocol switch; 3 protocols).
_MAX_PROTOCOL_SWITCHES = 64
_FIELDS = frozenset({"format", "version", "runtime", "base_latency_us", "hop_latency_us",
                     "ceiling_gbps", "slot_bytes", "chunk_slots", "slice_slots", "fifo_slots",
                     "gamma_us_per_byte", "default_protocols", "channels", "source"})


def check_channels(channels: object, what: str = "channels") -> int:
    """``channels`` when it is a whole number from 1 to :data:`MAX_CHANNELS`.

    Raises
    ------
    InvalidInstanceError
        Not a whole number >= 1.
    InputTooLargeError
        Above :data:`MAX_CHANNELS` (no runtime has more; each one is a ring to simulate).

    >>> check_channels(100000)
    Traceback (most recent call last):
    ...
    collsynth.errors.InputTooLargeError: channels = 100000: more than the 128 channels any \
runtime has (rccl's MAXCHANNELS; NCCL's is 32)
    """
    if isinstance(channels, bool) or not isinstance(channels, int) or channels < 1:
        raise InvalidInstanceError(f"{what} = {shown(channels)}; expected a whole number >= 1")
    if channels > MAX_CHANNELS:
        raise InputTooLargeError(f"{what} = {shown(channels)}: more than the {MAX_CHANNELS} "
                                 "channels any runtime has (rccl's MAXCHANNELS; NCCL's is 32)")
    return channels

# Wire bytes of the per-connection FIFO per protocol (NCCL defaults, RCCL the same):
# Simple NCCL_BUFFSIZE = 4 MiB; LL NCCL_LL_LINES_PER_THREAD (8) x NCCL_LL_MAX_NTHREADS (512) x
# NCCL_STEPS x 16-byte lines = 512 KiB; LL128 NCCL_LL128_ELEMS_PER_THREAD (120) x
# NCCL_LL128_MAX_NTHREADS (640) x NCCL_STEPS x 8 bytes.
_BUFFER_BYTES = {"LL": 8 * 512 * NCCL_STEPS * 16, "LL128": 120 * 640 * NCCL_STEPS * 8,
                 "Simple": 4 * 1024 * 1024}


def _table(**rows: tuple[float | None, float | None, float | None]
           ) -> dict[str, dict[str, float | None]]:
    return {name: dict(zip(PROTOCOLS, values)) for name, values in rows.items()}


@dataclass(frozen=True)
class RuntimeConstants:
    """What a runtime costs, for :func:`collsynth.timing.runtime_model.simulate_program`.

    Parameters
    ----------
    runtime:
        ``"nccl"``, ``"rccl"``, ``"msccl"``, ``"msccl-executor"`` (or any name).
    base_latency_us:
        Per protocol, microseconds every call pays once (kernel launch, proxy, the runtime's
        ``baseLat``); the runtime's own ring pays the same.
    hop_latency_us:
        ``[link class][protocol]``: microseconds from a slice leaving a rank to its arrival at the
        peer (NCCL's ``hwLat``), paid once per transfer on a path, pipelined with the data.
    ceiling_gbps:
        ``[link class][protocol]``: data GB/s one connection (peer pair x channel) can carry at
        most; ``None``: only the links limit it.
    slot_bytes:
        Per protocol, wire bytes of one of the ``fifo_slots`` FIFO slots.
    chunk_slots, slice_slots:
        Per protocol, slots per loop iteration of the interpreter (``MSCCL_CHUNKSTEPS`` = 4
        for Simple, 1 otherwise) and per pipelined slice (``MSCCL_SLICESTEPS`` = 2 for Simple).
    fifo_slots:
        Slots per connection (``NCCL_STEPS`` = 8): a sender has at most that many in flight.
    gamma_us_per_byte:
        Microseconds one rank takes to reduce (or copy) one byte.
    default_protocols:
        The protocol the runtime's own algorithms use, by size: ``((max_bytes, protocol), ...)``
        ascending, the last ``max_bytes`` may be ``None`` (no limit). Empty: the fastest
        predicted.
    channels:
        How many channels (rings) the runtime's own algorithms use on the machine measured
        (``None``: as many as :func:`collsynth.timing.nccl.ring_channels` finds).
    source:
        Where the figures come from (free text, kept in the file).
    """

    runtime: str
    base_latency_us: Mapping[str, float]
    hop_latency_us: Mapping[str, Mapping[str, float]]
    ceiling_gbps: Mapping[str, Mapping[str, float | None]]
    slot_bytes: Mapping[str, int] = field(default_factory=lambda: {
        p: _BUFFER_BYTES[p] // NCCL_STEPS for p in PROTOCOLS})
    chunk_slots: Mapping[str, int] = field(default_factory=lambda: {
        "LL": 1, "LL128": 1, "Simple": 4})
    slice_slots: Mapping[str, int] = field(default_factory=lambda: {
        "LL": 1, "LL128": 1, "Simple": 2})
    fifo_slots: int = NCCL_STEPS
    gamma_us_per_byte: float = 0.0
    default_protocols: tuple[tuple[int | None, str], ...] = ()
    channels: int | None = None
    source: str = ""

    def __post_init__(self) -> None:
        _validate(self)

    def base_latency(self, protocol: str) -> float:
        return float(self.base_latency_us[_protocol(protocol)])

    def hop_latency(self, link_class: str, protocol: str) -> float:
        return float(self.hop_latency_us[_link_class(link_class)][_protocol(protocol)])

    def ceiling(self, link_class: str, protocol: str) -> float:
        """Data GB/s of one connection at most (``math.inf`` when unlimited)."""
        value = self.ceiling_gbps[_link_class(link_class)][_protocol(protocol)]
        return math.inf if value is None else float(value)

    def slot_data_bytes(self, protocol: str) -> float:
        """Data bytes one FIFO slot holds."""
        p = _protocol(protocol)
        return self.slot_bytes[p] * PROTOCOL_EFFICIENCY[p]

    def iteration_bytes(self, protocol: str) -> float:
        """Data bytes of one chunk the interpreter moves per loop iteration."""
        return self.chunk_slots[_protocol(protocol)] * self.slot_data_bytes(protocol)

    def slice_bytes(self, protocol: str) -> float:
        """Data bytes a forwarding step must receive before it can pass them on."""
        return self.slice_slots[_protocol(protocol)] * self.slot_data_bytes(protocol)

    def window_bytes(self, protocol: str) -> float:
        """Data bytes a sender may have in flight on one connection."""
        return self.fifo_slots * self.slot_data_bytes(protocol)

    def default_protocol(self, size_bytes: float) -> str | None:
        """The runtime's own protocol at ``size_bytes`` (``None``: not recorded)."""
        for limit, protocol in self.default_protocols:
            if limit is None or size_bytes <= limit:
                return protocol
        return None

    def replace(self, **changes: Any) -> "RuntimeConstants":
        return replace(self, **changes)


def _protocol(name: str) -> str:
    if name not in PROTOCOLS:
        raise UnknownNameError(f"protocol {name!r}; expected one of {', '.join(PROTOCOLS)}")
    return name


def _link_class(name: str) -> str:
    if name not in LINK_CLASSES:
        raise UnknownNameError(f"link class {name!r}; expected one of {', '.join(LINK_CLASSES)}")
    return name


def _number(value: Any, where: str, *, allow_none: bool = False, positive: bool = False,
            lo: float | None = None, hi: float | None = None, why: str = "") -> None:
    """``value`` is a finite number >= 0 (> 0 with ``positive``; ``None`` with ``allow_none``)
    and, unless it is 0, within ``[lo, hi]``; ``why`` says where the range comes from."""
    if value is None and allow_none:
        return
    kind = "a positive number" if positive else "a number >= 0"
    if lo is not None or hi is not None:
        kind = ("a number" if positive or lo is None else "0 or a number") + \
            f" from {lo if lo is not None else 0:g} to {hi if hi is not None else math.inf:g}"
    bad = isinstance(value, bool) or not isinstance(value, (int, float)) or \
        not math.isfinite(value) or value < 0 or (positive and value <= 0)
    if not bad and value != 0:
        bad = (lo is not None and value < lo) or (hi is not None and value > hi)
    if bad:
        raise InvalidInstanceError(f"runtime constants: {where} = {shown(value)}; expected {kind}"
                                   + (" or null" if allow_none else "")
                                   + (f" ({why})" if why and not isinstance(value, bool)
                                      and isinstance(value, (int, float)) else ""))


def _whole(value: Any, where: str, hi: int, why: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= hi:
        raise InvalidInstanceError(f"runtime constants: {where} = {shown(value)}; expected a "
                                   f"whole number from 1 to {hi} ({why})")


_LATENCY_WHY = "latencies are 0, or from 1 ps to 1 s"


def _validate(c: RuntimeConstants) -> None:
    if not isinstance(c.runtime, str) or not c.runtime:
        raise InvalidInstanceError("runtime constants: runtime must be a non-empty name")
    for name in ("base_latency_us", "slot_bytes", "chunk_slots", "slice_slots"):
        _known_keys(getattr(c, name), name, PROTOCOLS)
    for name in ("hop_latency_us", "ceiling_gbps"):
        table = getattr(c, name)
        _known_keys(table, name, LINK_CLASSES)
        for k in table:
            _known_keys(table[k], f"{name}[{k!r}]", PROTOCOLS)
    for p in PROTOCOLS:
        _number(c.base_latency_us.get(p), f"base_latency_us[{p!r}]", lo=MIN_LATENCY_US,
                hi=MAX_LATENCY_US, why=_LATENCY_WHY)
        for k in LINK_CLASSES:
            _number(c.hop_latency_us.get(k, {}).get(p), f"hop_latency_us[{k!r}][{p!r}]",
                    lo=MIN_LATENCY_US, hi=MAX_LATENCY_US, why=_LATENCY_WHY)
            _number(c.ceiling_gbps.get(k, {}).get(p, 0), f"ceiling_gbps[{k!r}][{p!r}]",
                    allow_none=True, positive=True, lo=MIN_GBPS, hi=MAX_GBPS,
                    why="1 kB/s to 1 PB/s per connection")
        _whole(c.slot_bytes.get(p), f"slot_bytes[{p!r}]", MAX_SLOT_BYTES,
               "NCCL's Simple slot is 512 KiB; 1 GiB at most")
        for name in ("chunk_slots", "slice_slots"):
            _whole(getattr(c, name).get(p), f"{name}[{p!r}]", MAX_FIFO_SLOTS,
                   f"NCCL_STEPS is 8; {MAX_FIFO_SLOTS} at most")
    _whole(c.fifo_slots, "fifo_slots", MAX_FIFO_SLOTS, f"NCCL_STEPS is 8; {MAX_FIFO_SLOTS} at most")
    _number(c.gamma_us_per_byte, "gamma_us_per_byte", hi=MAX_GAMMA_US_PER_BYTE,
            why="a reduction of at least 1 kB/s")
    if c.channels is not None:
        _whole(c.channels, "channels", MAX_CHANNELS, "or null; rccl's MAXCHANNELS, the most "
               "any runtime has")
    if not isinstance(c.source, str) or len(c.source) > 4096:
        raise InvalidInstanceError(f"runtime constants: source = {shown(c.source)}; expected a "
                                   "text of at most 4096 characters")
    if not isinstance(c.default_protocols, tuple) or \
            len(c.default_protocols) > _MAX_PROTOCOL_SWITCHES:
        raise InvalidInstanceError(f"runtime constants: default_protocols = "
                                   f"{shown(c.default_protocols)}; expected at most "
                                   f"{_MAX_PROTOCOL_SWITCHES} entries")
    previous = -1
    for index, entry in enumerate(c.default_protocols):
        if not (isinstance(entry, tuple) and len(entry) == 2) or entry[1] not in PROTOCOLS or not (
                entry[0] is None or (isinstance(entry[0], int) and not isinstance(entry[0], bool)
                                     and previous < entry[0] <= MAX_SIZE_BYTES)):
            raise InvalidInstanceError(
                f"runtime constants: default_protocols[{index}] = {shown(entry)}; expected "
                f"[max_bytes (ascending, at most {MAX_SIZE_BYTES}, or null last), protocol]")
        previous = entry[0] if entry[0] is not None else math.inf


def _known_keys(table: Any, where: str, known: tuple[str, ...]) -> None:
    if not isinstance(table, Mapping):
        raise InvalidInstanceError(f"runtime constants: {where} = {shown(table)}; expected an "
                                   "object")
    unknown = [k for k in table if k not in known]
    if unknown:
        raise InvalidInstanceError(f"runtime constants: {where} has {shown(unknown[0])}; "
                                   f"expected {', '.join(known)}")


#: Documented defaults per runtime (docs/runtime-model.md lists the sources).
DEFAULTS: Mapping[str, RuntimeConstants] = {}

_NCCL = RuntimeConstants(
    runtime="nccl",
    # NCCL src/graph/tuning.cc (2.19+): baseLat for the ring; hwLat NVLink and NET for the ring.
    base_latency_us={"LL": 6.6, "LL128": 14.0, "Simple": 8.4},
    hop_latency_us=_table(intra=(0.6, 1.9, 3.4), network=(2.7, 4.0, 14.0)),
    ceiling_gbps=_table(intra=(None, None, None), network=(None, None, None)),
    source="NCCL src/graph/tuning.cc (2.19+): ring baseLat and hwLat (NVLink inside a node, NET "
           "between nodes); FIFO: NCCL_BUFFSIZE 4 MiB, LL and LL128 buffers, NCCL_STEPS 8, "
           "MSCCL_CHUNKSTEPS 4 and MSCCL_SLICESTEPS 2; no per-connection ceiling",
)
_RCCL = RuntimeConstants(
    runtime="rccl",
    # ROCm/rccl src/graph/tuning.cc @9e22c79d: baseLat (ring) and tuning_model_0 hwLat (ring).
    base_latency_us={"LL": 12.0, "LL128": 12.0, "Simple": 17.0},
    hop_latency_us=_table(intra=(0.8, 2.2, 3.6), network=(9.5, 19.8, 15.1)),
    ceiling_gbps=_table(intra=(None, None, None), network=(None, None, None)),
    source="ROCm/rccl src/graph/tuning.cc @9e22c79d: ring baseLat and tuning_model_0 hwLat "
           "(NVLINK class, used for xGMI, inside a node; NET between nodes); FIFO as NCCL's "
           "(NCCL_BUFFSIZE 4 MiB, NCCL_STEPS 8); no per-connection ceiling",
)
DEFAULTS = {"nccl": _NCCL, "msccl": _NCCL.replace(runtime="msccl"),
            "msccl-executor": _NCCL.replace(runtime="msccl-executor"), "rccl": _RCCL}


def runtime_names() -> tuple[str, ...]:
    return tuple(DEFAULTS)


def default_constants(runtime: str) -> RuntimeConstants:
    """The documented defaults of ``runtime`` (``nccl``, ``msccl``, ``msccl-executor``, ``rccl``).

    Raises
    ------
    UnknownNameError
        For another name.

    >>> c = default_constants("nccl")
    >>> c.hop_latency("network", "Simple"), c.slot_bytes["Simple"]
    (14.0, 524288)
    """
    try:
        return DEFAULTS[runtime]
    except KeyError:
        raise UnknownNameError(f"runtime {runtime!r}; expected one of "
                               f"{', '.join(DEFAULTS)}") from None


# -- the file --------------------------------------------------------------------------------------


def constants_to_dict(c: RuntimeConstants) -> dict[str, Any]:
    """A JSON-ready dictionary (the file's content)."""
    return {
        "format": FORMAT, "version": _VERSION, "runtime": c.runtime,
        "base_latency_us": dict(c.base_latency_us),
        "hop_latency_us": {k: dict(v) for k, v in c.hop_latency_us.items()},
        "ceiling_gbps": {k: dict(v) for k, v in c.ceiling_gbps.items()},
        "slot_bytes": dict(c.slot_bytes), "chunk_slots": dict(c.chunk_slots),
        "slice_slots": dict(c.slice_slots), "fifo_slots": c.fifo_slots,
        "gamma_us_per_byte": c.gamma_us_per_byte,
        "default_protocols": [list(entry) for entry in c.default_protocols],
        "channels": c.channels, "source": c.source,
    }


def constants_from_dict(data: Any, *, label: str = "runtime constants") -> RuntimeConstants:
    """The constants a dictionary describes (fields missing from it keep the runtime's
    defaults, or NCCL's for an unknown runtime).

    Raises
    ------
    FileFormatError
        A wrong ``format``, a missing ``runtime`` or a field of the wrong shape.

    >>> c = default_constants("nccl")
    >>> constants_from_dict(constants_to_dict(c)) == c
    True
    """
    if not isinstance(data, Mapping) or data.get("format") != FORMAT:
        raise FileFormatError(label, f"expected a JSON object with \"format\": \"{FORMAT}\"")
    version = data.get("version")
    if isinstance(version, bool) or version != _VERSION:
        raise FileFormatError(label, "missing field 'version'" if version is None else
                              f"version = {shown(version)}: unknown; this collsynth reads "
                              f"version {_VERSION}")
    unknown = sorted(str(k) for k in data if k not in _FIELDS)
    if unknown:
        raise FileFormatError(label, f"unknown field {shown(unknown[0])}; the fields are "
                                     f"{', '.join(sorted(_FIELDS))}")
    runtime = data.get("runtime")
    if not isinstance(runtime, str) or not runtime:
        raise FileFormatError(label, "field 'runtime': expected a runtime name")
    clean_name(runtime, "runtime", source=label)
    if "source" in data:
        clean_text(data["source"], "source", source=label)
    protocols = data.get("default_protocols", [])
    if not isinstance(protocols, list) or len(protocols) > _MAX_PROTOCOL_SWITCHES or any(
            not isinstance(e, list) for e in protocols):
        raise FileFormatError(label, f"default_protocols = {shown(protocols)}: expected a list "
                                     f"of at most {_MAX_PROTOCOL_SWITCHES} [max_bytes, protocol]")
    base = DEFAULTS.get(runtime, _NCCL)
    changes: dict[str, Any] = {"runtime": runtime}
    try:
        for key in ("base_latency_us", "slot_bytes", "chunk_slots", "slice_slots"):
            if key in data:
                changes[key] = {**getattr(base, key), **dict(data[key])}
        for key in ("hop_latency_us", "ceiling_gbps"):
            if key in data:
                merged = {k: dict(v) for k, v in getattr(base, key).items()}
                for k, v in dict(data[key]).items():
                    merged.setdefault(k, {}).update(dict(v))
                changes[key] = merged
        for key in ("fifo_slots", "gamma_us_per_byte", "channels", "source"):
            if key in data:
                changes[key] = data[key]
        if "default_protocols" in data:
            changes["default_protocols"] = tuple(tuple(e) for e in data["default_protocols"])
        return base.replace(**changes)
    except (TypeError, ValueError, AttributeError) as exc:
        raise FileFormatError(label, " ".join(str(exc).split())) from exc


def is_runtime_constants_file(path: str | os.PathLike[str]) -> bool:
    """True when ``path`` is a JSON file with this module's ``format`` (False for other
    content).

    Raises
    ------
    FileFormatError, InputTooLargeError
        A file that cannot be read at all (missing, not a regular file, too large): said as
        such, not taken for a file of another format.
    """
    raw = read_bytes_bounded(path, _MAX_FILE_BYTES, what="a calibration file may have")
    try:
        data = parse_json(raw, str(path))
    except CollsynthError:
        return False
    return isinstance(data, Mapping) and data.get("format") == FORMAT


def load_runtime_constants(path: str | os.PathLike[str]) -> RuntimeConstants:
    """Read a runtime-constants file.

    Raises
    ------
    FileFormatError
        Unreadable, not JSON, or not such a file.
    """
    raw = read_bytes_bounded(path, _MAX_FILE_BYTES, what="a runtime-constants file may have")
    data = parse_json(raw, str(path))   # NaN, Infinity, 1e999, deep nesting: refused
    return constants_from_dict(data, label=str(path))


def save_runtime_constants(c: RuntimeConstants, path: str | os.PathLike[str]) -> None:
    """Write ``c`` to ``path`` (atomically)."""
    from collsynth._output import write_text_atomic

    write_text_atomic(path, json.dumps(constants_to_dict(c), indent=1) + "\n")
