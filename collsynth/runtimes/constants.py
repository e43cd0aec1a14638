"""The constants of a runtime that the program model prices with, and their documented values.

:class:`RuntimeConstants` holds one runtime's figures (validated against plausible ranges); the
tables of NCCL's and RCCL's own latencies (``baseLat``, ``hwLat``) live here once, for the
defaults of :mod:`collsynth.runtimes.registry` and for :mod:`collsynth.timing.tuning_model`.
Sources: docs/runtime-model.md, "Constants".
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, Mapping

from collsynth._parse import (MAX_GBPS, MAX_SIZE_BYTES, MIN_GBPS, MIN_LATENCY_US, clean_name,
                              clean_text, shown)
from collsynth.errors import FileFormatError, InputTooLargeError, InvalidInstanceError, UnknownNameError
from collsynth.runtimes.dialect import DIALECTS
from collsynth.topology.machine import NETWORK_CLASSES  # the networks machine facts name
from collsynth.runtimes.protocols import (BUFFER_BYTES, LL_FORWARD_BYTES, NCCL_STEPS,
                                         PROTOCOL_EFFICIENCY, PROTOCOLS, check_protocol)

__all__ = ["LINK_CLASSES", "MAX_CHANNELS", "FAMILY_MAX_CHANNELS", "MAX_FIFO_SLOTS",
           "MAX_SLOT_BYTES", "MIN_LATENCY_US",
           "MAX_LATENCY_US", "MAX_GAMMA_US_PER_BYTE", "FIELDS", "check_channels",
           "RuntimeConstants", "NCCL_BASE_LATENCY_US", "NCCL_HOP_LATENCY_US",
           "RCCL_BASE_LATENCY_US", "RCCL_HOP_LATENCY_US", "NCCL_DEFAULTS", "RCCL_DEFAULTS",
           "constants_to_dict", "constants_from_dict", "CLASS_LATENCY_US", "NETWORK_CLASSES",
           "DEVICE_MEMORY_GBPS", "gamma_range", "HOP_SCALE_RANGE", "CHANNEL_US_RANGE",
           "HOST_US_RANGE", "DEFAULT_HOST_US", "NVLS_PORT_EFFICIENCY"]

#: Link classes of the program model: inside a node, and between nodes.
LINK_CLASSES = ("intra", "network")

# Plausible ranges of the constants (docs/runtime-model.md, "Constants"); a figure outside is a
# unit mistake or a hostile file, refused with the figure rather than priced.
#: Most channels of a runtime: rccl's MAXCHANNELS (128; NCCL's and msccl's is 32). Every
#: channel is a ring of the runtime's own algorithm that the program model builds and
#: simulates, so the count sizes the work; a channel beyond MAXCHANNELS does not exist.
MAX_CHANNELS = max(d.max_channels for d in DIALECTS.values())
#: MAXCHANNELS of each runtime family's own algorithms: 64 in stock NCCL (src/include/device.h;
#: msccl and msccl-executor run NCCL's), 128 in RCCL. More channels than these do not exist.
FAMILY_MAX_CHANNELS: Mapping[str, int] = MappingProxyType({"nccl": 64, "rccl": 128})
#: Most FIFO slots per connection (and slots per iteration or slice): NCCL_STEPS is 8 in every
#: NCCL and RCCL release; 1024 leaves room for a rebuilt runtime and none for a typo of 10^9.
MAX_FIFO_SLOTS = 1024
#: Largest FIFO slot, wire bytes: NCCL_BUFFSIZE / NCCL_STEPS is 512 KiB by default; a slot of
#: 1 GiB makes an 8 GiB buffer per connection and channel, more than a GPU gives NCCL.
MAX_SLOT_BYTES = 1 << 30
# MIN_LATENCY_US, the smallest latency that is not 0 (1 ps), is _parse's: a topology's alpha_us
# has the same floor, and the topology layer is below this one.
#: Largest latency, us: one second, 10^4 times NCCL's slowest documented hop (14 us over the
#: network); a larger one is milliseconds taken for microseconds, or worse.
MAX_LATENCY_US = 1e6
#: Slowest reduction, us per byte: one byte per millisecond (1 kB/s, _parse.MIN_GBPS).
MAX_GAMMA_US_PER_BYTE = 1 / (MIN_GBPS * 1e3)
#: The most entries of ``default_protocols`` (one per protocol switch; 3 protocols).
_MAX_PROTOCOL_SWITCHES = 64
#: The fields of :func:`constants_to_dict`.
FIELDS = frozenset({"runtime", "base_latency_us", "hop_latency_us",
                    "ceiling_gbps", "slot_bytes", "chunk_slots", "slice_slots", "fifo_slots",
                    "gamma_us_per_byte", "default_protocols", "channels", "source",
                    "network_class", "network_base_us", "nvls_efficiency",
                    "nvls_channel_gbps", "channel_us", "host_us"})
#: Plausible NVLink SHARP efficiencies: the share of a GPU's NVLink bandwidth its NVLS port
#: carries (NCCL's tuning: 0.85 Hopper, 0.74 Blackwell; a measured H100 curve gives 0.69).
NVLS_EFFICIENCY_RANGE = (0.3, 1.0)
#: Per architecture, the share of a GPU's NVLink bandwidth its NVLS port carries in the program
#: model where no calibration says. Hopper 0.67: the mean of the fits of three public NVLS
#: allreduce curves of 8 GPUs (H100 p5 0.661, H100 Azure ND v5 0.680, H200 Azure ND v5 0.683;
#: each within 3% of the mean of the other two). NCCL's own figure, 0.85, is its cost model's
#: and stays there, where it decides what NCCL runs. Other architectures take NCCL's figure
#: (0.74 on Blackwell): the one public Blackwell curve (GB200 NVL72, one rack) fits 0.45, too
#: few to set a default on. docs/runtime-model.md, "NVLS".
NVLS_PORT_EFFICIENCY: Mapping[str, float] = MappingProxyType({"sm90": 0.67})
#: Per link class: the hop latency per protocol (LL, LL128, Simple), us (what a network's plugin
#: and proxy add is paid per message, so it is in the hops, not per call). Inside a node: NCCL's hwLat ring
#: rows (NVLINK, PCI; NCCL 2.30.7 src/graph/tuning.cc) and RCCL's tuning model 5 NVLINK ring
#: row for xGMI (gfx942). Between nodes: NCCL's NET ring row (2.7, 4.0, 14.0), which is
#: InfiniBand's (NCCL's built-in IB reports latency 0), plus for the other networks the extra
#: per network hop of a public small call over two nodes against one node, less NET LL hops,
#: over the network hops the call crossed (NCCL's tree on two nodes: 2; two ranks: 1): EFA 25
#: (H100 p5: (69 - 13 - 5.4) / 2), RoCE 5 (B200 a4, one GPU per node: 14 - 6.6 - 2.7),
#: Slingshot 2.8 (GH200 Alps: (19 - 8 - 5.4) / 2), TCP 7.5 (H200 over one TCP interface:
#: (33 - 13 - 5.4) / 2). docs/runtime-model.md, "Link classes".
_NET_HOPS = (2.7, 4.0, 14.0)


def _plus(extra: float) -> tuple[float, float, float]:
    return tuple(round(h + extra, 6) for h in _NET_HOPS)  # type: ignore[return-value]


CLASS_LATENCY_US: Mapping[str, tuple[float, float, float]] = MappingProxyType({
    "nvlink": (0.6, 1.9, 3.4), "xgmi": (0.8, 0.8, 2.1), "pcie": (1.0, 2.5, 5.7),
    "neuronlink": (0.6, 1.9, 3.4), "ib": _NET_HOPS, "roce": _plus(5.0), "efa": _plus(25.0),
    "slingshot": _plus(2.8), "tcp": _plus(7.5),
})
#: Device memory (HBM) GB/s by architecture, from the vendors' datasheets: V100 900, A100
#: 1555 (40 GB; 2039 for 80 GB), H100 SXM 3350, B200 8000, MI250X 1638 per GCD (3277 per
#: package), MI300X 5300, MI355X 8000. A reduction reads two inputs and writes one, so a byte
#: reduced costs at least 3 / that (gamma_range).
DEVICE_MEMORY_GBPS: Mapping[str, float] = MappingProxyType({
    "sm70": 900.0, "sm80": 1555.0, "sm90": 3350.0, "sm100": 8000.0, "gfx90a": 1638.0,
    "gfx942": 5300.0, "gfx950": 8000.0})
#: Plausible host time per channel of a call and GPU driven, us: none, to 2 us (several thousand
#: instructions of work setup per channel; the largest fitted on a public curve is 0.23).
CHANNEL_US_RANGE = (0.0, 2.0)
#: Plausible host time per call and GPU driven, us: none, to 100 us (a kernel launch takes
#: 2 to 10 us; fitted on public curves of 8 GPUs from one thread: 4.2 on A100, 6.0 on V100).
HOST_US_RANGE = (0.0, 100.0)
#: The host's work per call and GPU driven where no curve that one thread drove several GPUs
#: on was fitted, us: the superbench A100 curve's fit (NCCL, 8 GPUs from one thread; the
#: konnase V100 curve gives 6.0). A kernel cannot start before it is launched, so 0 would price
#: one thread driving 8 GPUs as if it cost nothing (docs/runtime-model.md, "The host's work").
DEFAULT_HOST_US = 4.2
#: The range a calibration may scale the documented hop latencies by (1/8 to 8 times).
HOP_SCALE_RANGE = (0.125, 8.0)


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
runtime has (rccl's MAXCHANNELS; NCCL's is 64)
    """
    if isinstance(channels, bool) or not isinstance(channels, int) or channels < 1:
        raise InvalidInstanceError(f"{what} = {shown(channels)}; expected a whole number >= 1")
    if channels > MAX_CHANNELS:
        raise InputTooLargeError(f"{what} = {shown(channels)}: more than the {MAX_CHANNELS} "
                                 "channels any runtime has (rccl's MAXCHANNELS; NCCL's is 64)")
    return channels


@dataclass(frozen=True)
class RuntimeConstants:
    """What a runtime costs, for the program model (:mod:`collsynth.timing.runtime_model`).

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
        How many channels the log measured had, when known (kept for the record: the program
        model derives the channels of the runtime's own algorithms from the machine and the
        size, never from here).
    source:
        Where the figures come from (free text, kept in the file).
    network_class, network_base_us:
        The network (``ib``, ``roce``, ``efa``, ``slingshot``, ``tcp``) the ``network`` hop
        latencies and ``network_base_us`` (us added once per call that crosses nodes) were
        fitted on; ``None``: not fitted, so a machine's network takes its class's documented
        figures (:data:`CLASS_LATENCY_US`).
    nvls_efficiency:
        The share of a GPU's NVLink bandwidth its NVLS (NVLink SHARP) port carries, fitted on a
        curve where the runtime ran NVLS; ``None``: NCCL's tuning figure for the GPU
        (:func:`collsynth.timing.tuning_model.nvls_efficiency`). Range
        :data:`NVLS_EFFICIENCY_RANGE`.
    nvls_channel_gbps:
        Data GB/s one NVLS channel's head load-reduces or stores at most (one SM's multimem
        rate), fitted with ``nvls_efficiency``; ``None``: no bound but the ports.
    host_us, channel_us:
        The host's work per call, us, for each GPU the calling thread drives (one with a process
        per GPU; nccl-tests' ``-g 8`` drives eight): ``host_us`` per call (the launch) plus
        ``channel_us`` per channel the call runs (NCCL's per-channel work elements and proxy
        operations). Back-to-back calls overlap one call's host work with the previous call on
        the device, so a call takes the larger of the two. Defaults: :data:`DEFAULT_HOST_US`
        per call and no host work per channel (its cost depends on the runtime's version).
        Ranges :data:`HOST_US_RANGE`, :data:`CHANNEL_US_RANGE`; docs/runtime-model.md, "The
        host's work".
    """

    runtime: str
    base_latency_us: Mapping[str, float]
    hop_latency_us: Mapping[str, Mapping[str, float]]
    ceiling_gbps: Mapping[str, Mapping[str, float | None]]
    slot_bytes: Mapping[str, int] = field(default_factory=lambda: {
        p: BUFFER_BYTES[p] // NCCL_STEPS for p in PROTOCOLS})
    chunk_slots: Mapping[str, int] = field(default_factory=lambda: {
        "LL": 1, "LL128": 1, "Simple": 4})
    slice_slots: Mapping[str, int] = field(default_factory=lambda: {
        "LL": 1, "LL128": 1, "Simple": 2})
    fifo_slots: int = NCCL_STEPS
    gamma_us_per_byte: float = 0.0
    default_protocols: tuple[tuple[int | None, str], ...] = ()
    channels: int | None = None
    source: str = ""
    network_class: str | None = None
    network_base_us: float = 0.0
    nvls_efficiency: float | None = None
    nvls_channel_gbps: float | None = None
    channel_us: float = 0.0
    host_us: float = DEFAULT_HOST_US

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

    def slice_bytes(self, protocol: str, network: bool = False) -> float:
        """Data bytes a forwarding step must receive before it can pass them on: the slice, and
        for LL inside a node at most one line per thread (``protocols.LL_FORWARD_BYTES``, RCCL's
        for RCCL's constants, NCCL's for the others); across nodes (``network``) the slice."""
        data = self.slice_slots[_protocol(protocol)] * self.slot_data_bytes(protocol)
        if protocol != "LL" or network:
            return data
        return min(data, LL_FORWARD_BYTES["rccl" if self.runtime == "rccl" else "nccl"])

    def slices_per_chunk(self, protocol: str) -> int:
        """Slices one call of the runtime's primitives is cut into (``SlicePerChunk``:
        ``chunk_slots / slice_slots``; 2 for NCCL's and msccl's Simple, 1 for LL and LL128)."""
        p = _protocol(protocol)
        return max(1, self.chunk_slots[p] // self.slice_slots[p])

    def window_bytes(self, protocol: str) -> float:
        """Data bytes a sender may have in flight on one connection."""
        return self.fifo_slots * self.slot_data_bytes(protocol)

    def default_protocol(self, size_bytes: float) -> str | None:
        """The runtime's own protocol at ``size_bytes`` (``None``: not recorded)."""
        for limit, protocol in self.default_protocols:
            if limit is None or size_bytes <= limit:
                return protocol
        return None

    def replace(self, **changes: object) -> "RuntimeConstants":
        return replace(self, **changes)


def _protocol(name: str) -> str:
    return check_protocol(name)


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
    for p in PROTOCOLS:
        # The runtimes' own rules (NCCL: SLICESTEPS <= CHUNKSTEPS <= NCCL_STEPS, a chunk's
        # slices a whole number): a slice above its chunk runs no slice at all there, and a
        # chunk above the FIFO never fits a connection's buffer.
        chunk, piece = c.chunk_slots[p], c.slice_slots[p]
        if chunk > c.fifo_slots:
            raise InvalidInstanceError(
                f"runtime constants: chunk_slots[{p!r}] = {chunk} is above fifo_slots = "
                f"{c.fifo_slots}; expected a chunk that fits the FIFO (NCCL: CHUNKSTEPS <= "
                "NCCL_STEPS)")
        if chunk % piece:
            raise InvalidInstanceError(
                f"runtime constants: slice_slots[{p!r}] = {piece} does not divide "
                f"chunk_slots[{p!r}] = {chunk}; expected a chunk of whole slices (NCCL: "
                "SLICESTEPS divides CHUNKSTEPS)")
    _number(c.gamma_us_per_byte, "gamma_us_per_byte", hi=MAX_GAMMA_US_PER_BYTE,
            why="a reduction of at least 1 kB/s")
    if c.network_class is not None and c.network_class not in NETWORK_CLASSES:
        raise InvalidInstanceError(f"runtime constants: network_class = "
                                   f"{shown(c.network_class)}; expected null or one of "
                                   f"{', '.join(NETWORK_CLASSES)}")
    _number(c.network_base_us, "network_base_us", lo=MIN_LATENCY_US, hi=MAX_LATENCY_US,
            why=_LATENCY_WHY)
    _number(c.nvls_efficiency, "nvls_efficiency", allow_none=True, positive=True,
            lo=NVLS_EFFICIENCY_RANGE[0], hi=NVLS_EFFICIENCY_RANGE[1],
            why="the share of NVLink bandwidth an NVLS port carries")
    _number(c.nvls_channel_gbps, "nvls_channel_gbps", allow_none=True, positive=True,
            lo=MIN_GBPS, hi=MAX_GBPS, why="1 kB/s to 1 PB/s per channel")
    _number(c.channel_us, "channel_us", hi=CHANNEL_US_RANGE[1],
            why="host time per channel of a call and GPU driven")
    _number(c.host_us, "host_us", hi=HOST_US_RANGE[1], why="host time per call and GPU driven")
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


# -- the runtimes' own latency tables (one home) ------------------------------------------------


def _rows(**rows: tuple[float, float, float]) -> Mapping[str, tuple[float, float, float]]:
    return MappingProxyType(dict(rows))


#: NCCL's ``baseLat[algorithm]``, us per protocol (LL, LL128, Simple): NCCL 2.30.7
#: ``src/graph/tuning.cc`` (``ncclTunerConstantsDefaults``); the ring and tree rows are those of
#: every release since 2.19.
NCCL_BASE_LATENCY_US = _rows(
    tree=(6.8, 14.0, 8.4), ring=(6.6, 14.0, 8.4), collnet_direct=(0, 0, 0),
    collnet_chain=(0, 0, 0), nvls=(0, 0, 0), nvls_tree=(0, 0, 0), pat=(8.0, 8.0, 8.0))
#: NCCL's ``hwLat[hardware][algorithm]``, us per hop per protocol (same source).
NCCL_HOP_LATENCY_US: Mapping[str, Mapping[str, tuple[float, float, float]]] = MappingProxyType({
    "nvlink": _rows(tree=(0.6, 1.25, 4.0), ring=(0.6, 1.9, 3.4), collnet_direct=(0, 0, 3.7),
                    collnet_chain=(0, 0, 2.8), nvls=(0, 0, 25), nvls_tree=(0, 0, 25),
                    pat=(0, 0, 4.0)),
    "pci": _rows(tree=(1.0, 1.9, 4.0), ring=(1.0, 2.5, 5.7), collnet_direct=(0, 0, 3.7),
                 collnet_chain=(0, 0, 2.8), nvls=(0, 0, 0), nvls_tree=(0, 0, 0),
                 pat=(0, 0, 4.0)),
    "net": _rows(tree=(5.0, 8.5, 14), ring=(2.7, 4.0, 14.0), collnet_direct=(0, 0, 31),
                 collnet_chain=(0, 0, 30), nvls=(0, 0, 18), nvls_tree=(0, 0, 20.9),
                 pat=(0, 0, 14)),
})
#: RCCL's ``baseLat`` per protocol (tree, ring and CollNet alike; NVLS and PAT 0): ROCm RCCL
#: ``src/graph/tuning.cc`` (2.28-2.31).
RCCL_BASE_LATENCY_US = (12.0, 12.0, 17.0)
#: RCCL's ``hwLat`` per tuning model (0: gfx90a and older; 5: gfx942, and gfx950's model 6
#: uses it), ``[hardware][algorithm]`` per protocol (same source).
RCCL_HOP_LATENCY_US: Mapping[int, Mapping[str, Mapping[str, tuple[float, float, float]]]] = \
    MappingProxyType({
        0: MappingProxyType({"nvlink": _rows(tree=(0.8, 1.4, 2.5), ring=(0.8, 2.2, 3.6)),
                             "pci": _rows(tree=(2.2, 2.2, 5.7), ring=(2.2, 2.2, 5.7)),
                             "net": _rows(tree=(11.8, 18.2, 20.8), ring=(9.5, 19.8, 15.1))}),
        5: MappingProxyType({"nvlink": _rows(tree=(0.9, 0.9, 2.3), ring=(0.8, 0.8, 2.1)),
                             "pci": _rows(tree=(2.2, 2.2, 5.7), ring=(2.2, 2.2, 5.7)),
                             "net": _rows(tree=(10.5, 10.5, 25.0), ring=(9.5, 9.5, 320.0))}),
    })


def _per_protocol(values: tuple[float, float, float]) -> dict[str, float]:
    return dict(zip(PROTOCOLS, (float(v) for v in values)))


def _table(**rows: tuple[float | None, float | None, float | None]
           ) -> dict[str, dict[str, float | None]]:
    return {name: dict(zip(PROTOCOLS, values)) for name, values in rows.items()}


#: NCCL's documented constants: its ring's ``baseLat``, ``hwLat`` over NVLink inside a node and
#: over the network between nodes, NCCL's FIFO geometry; no per-connection ceiling.
NCCL_DEFAULTS = RuntimeConstants(
    runtime="nccl",
    base_latency_us=_per_protocol(NCCL_BASE_LATENCY_US["ring"]),
    hop_latency_us={"intra": _per_protocol(NCCL_HOP_LATENCY_US["nvlink"]["ring"]),
                    "network": _per_protocol(NCCL_HOP_LATENCY_US["net"]["ring"])},
    ceiling_gbps=_table(intra=(None, None, None), network=(None, None, None)),
    source="NCCL src/graph/tuning.cc (2.19+): ring baseLat and hwLat (NVLink inside a node, NET "
           "between nodes); FIFO: NCCL_BUFFSIZE 4 MiB, LL and LL128 buffers, NCCL_STEPS 8, "
           "MSCCL_CHUNKSTEPS 4 and MSCCL_SLICESTEPS 2; no per-connection ceiling",
)
#: RCCL's documented constants: its ring's ``baseLat`` and tuning model 0's ``hwLat``.
RCCL_DEFAULTS = RuntimeConstants(
    runtime="rccl",
    base_latency_us=_per_protocol(RCCL_BASE_LATENCY_US),
    hop_latency_us={"intra": _per_protocol(RCCL_HOP_LATENCY_US[0]["nvlink"]["ring"]),
                    "network": _per_protocol(RCCL_HOP_LATENCY_US[0]["net"]["ring"])},
    ceiling_gbps=_table(intra=(None, None, None), network=(None, None, None)),
    source="ROCm/rccl src/graph/tuning.cc @9e22c79d: ring baseLat and tuning_model_0 hwLat "
           "(NVLINK class, used for xGMI, inside a node; NET between nodes); FIFO as NCCL's "
           "(NCCL_BUFFSIZE 4 MiB, NCCL_STEPS 8); no per-connection ceiling",
)


def gamma_range(arch: str | None) -> tuple[float, float]:
    """The plausible reduction cost of a device, us per byte: at least 3 bytes of device memory
    traffic per byte reduced at its HBM rate, at most 20 times that (a reduction kernel at 5%
    of the memory's rate); ``(0, MAX_GAMMA_US_PER_BYTE)`` for an unknown device.

    >>> [f"{g:.3g}" for g in gamma_range("sm80")]
    ['1.93e-06', '3.86e-05']
    """
    hbm = DEVICE_MEMORY_GBPS.get(arch or "")
    if hbm is None:
        return 0.0, MAX_GAMMA_US_PER_BYTE
    low = 3 / (hbm * 1e3)
    return low, 20 * low


# -- as a dictionary --------------------------------------------------------------------------------


def constants_to_dict(c: RuntimeConstants) -> dict[str, Any]:
    """The fields of ``c`` as a JSON-ready dictionary (what a calibration file stores).

    >>> sorted(constants_to_dict(NCCL_DEFAULTS)) == sorted(FIELDS)
    True
    """
    return {
        "runtime": c.runtime,
        "base_latency_us": dict(c.base_latency_us),
        "hop_latency_us": {k: dict(v) for k, v in c.hop_latency_us.items()},
        "ceiling_gbps": {k: dict(v) for k, v in c.ceiling_gbps.items()},
        "slot_bytes": dict(c.slot_bytes), "chunk_slots": dict(c.chunk_slots),
        "slice_slots": dict(c.slice_slots), "fifo_slots": c.fifo_slots,
        "gamma_us_per_byte": c.gamma_us_per_byte,
        "default_protocols": [list(entry) for entry in c.default_protocols],
        "channels": c.channels, "source": c.source,
        "network_class": c.network_class, "network_base_us": c.network_base_us,
        "nvls_efficiency": c.nvls_efficiency, "nvls_channel_gbps": c.nvls_channel_gbps,
        "channel_us": c.channel_us, "host_us": c.host_us,
    }


def _check_mapping(value: Any, key: str, label: str, nested: bool) -> None:
    """Refuse a per-protocol field that is not an object of numbers (``nested``: an object of
    such objects, by link class), naming the field; the figures' ranges are checked later."""
    inner = "{LL, LL128, Simple: number}"
    expected = f"{{link class: {inner}}}" if nested else inner
    if not isinstance(value, Mapping):
        raise FileFormatError(label, f"{key} = {shown(value)}: expected an object {expected}")
    for name, item in value.items():
        if nested and not isinstance(item, Mapping):
            raise FileFormatError(label, f"{key}.{name} = {shown(item)}: expected an object "
                                         f"{inner}")


def constants_from_dict(data: Mapping[str, Any], *, base: RuntimeConstants,
                        label: str = "runtime constants") -> RuntimeConstants:
    """The constants ``data`` describes; fields missing from it keep ``base``'s (the runtime's
    documented defaults, :func:`collsynth.runtimes.get_runtime`).

    Raises
    ------
    FileFormatError
        An unknown field, a missing ``runtime`` or a field of the wrong shape (``label`` names
        the file).
    InvalidInstanceError, InputTooLargeError
        A figure outside its plausible range.

    >>> constants_from_dict(constants_to_dict(NCCL_DEFAULTS), base=NCCL_DEFAULTS) == NCCL_DEFAULTS
    True
    """
    if not isinstance(data, Mapping):
        raise FileFormatError(label, "expected a JSON object of runtime constants")
    unknown = sorted(str(k) for k in data if k not in FIELDS)
    if unknown:
        raise FileFormatError(label, f"unknown field {shown(unknown[0])}; the fields are "
                                     f"{', '.join(sorted(FIELDS))}")
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
    changes: dict[str, Any] = {"runtime": runtime}
    for key, nested in (("base_latency_us", False), ("slot_bytes", False),
                        ("chunk_slots", False), ("slice_slots", False),
                        ("hop_latency_us", True), ("ceiling_gbps", True)):
        if key in data:
            _check_mapping(data[key], key, label, nested)
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
        for key in ("fifo_slots", "gamma_us_per_byte", "channels", "source", "network_class",
                    "network_base_us", "nvls_efficiency", "nvls_channel_gbps", "channel_us",
                    "host_us"):
            if key in data:
                changes[key] = data[key]
        if "default_protocols" in data:
            changes["default_protocols"] = tuple(tuple(e) for e in data["default_protocols"])
        return base.replace(**changes)
    except (TypeError, ValueError, AttributeError) as exc:
        raise FileFormatError(label, " ".join(str(exc).split())) from exc
