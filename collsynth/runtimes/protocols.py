"""The protocols NCCL-family runtimes move data with, and their buffer geometry.

One definition of the protocol names (the XML ``proto`` attribute spells them the same way) and
of what each protocol's FIFO holds; sources in docs/runtime-model.md, "Constants".
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Mapping

from collsynth.errors import UnknownNameError

__all__ = ["PROTOCOLS", "PROTOCOL_EFFICIENCY", "NCCL_STEPS", "BUFFER_BYTES", "STEP_BYTES",
           "LL_FORWARD_BYTES", "check_protocol"]

#: NCCL's protocols in its own order (``ncclProtoStr``): the runtimes' choice scans them so.
PROTOCOLS: tuple[str, ...] = ("LL", "LL128", "Simple")
#: Data bytes per wire byte: LL lines carry 8 bytes of data and 8 of flags, LL128 lines 120 of
#: 128 bytes (NCCL ``src/include/device.h``), Simple only data.
PROTOCOL_EFFICIENCY: Mapping[str, float] = MappingProxyType(
    {"LL": 0.5, "LL128": 120 / 128, "Simple": 1.0})
#: FIFO slots per connection (``NCCL_STEPS``, NCCL ``src/include/device.h``; RCCL the same).
NCCL_STEPS = 8
#: Wire bytes of the per-connection FIFO per protocol (NCCL defaults, RCCL the same): Simple
#: NCCL_BUFFSIZE = 4 MiB; LL NCCL_LL_LINES_PER_THREAD (8) x NCCL_LL_MAX_NTHREADS (512) x
#: NCCL_STEPS x 16-byte lines = 512 KiB; LL128 NCCL_LL128_ELEMS_PER_THREAD (120) x
#: NCCL_LL128_MAX_NTHREADS (640) x NCCL_STEPS x 8 bytes.
BUFFER_BYTES: Mapping[str, int] = MappingProxyType(
    {"LL": 8 * 512 * NCCL_STEPS * 16, "LL128": 120 * 640 * NCCL_STEPS * 8,
     "Simple": 4 * 1024 * 1024})
#: Wire bytes of one FIFO slot (a step) per protocol, BUFFER_BYTES / NCCL_STEPS: 64 KiB in LL,
#: 600 KiB in LL128, 512 KiB in Simple (NCCL's Simple step is also its tree and PAT chunk).
STEP_BYTES: Mapping[str, int] = MappingProxyType(
    {p: BUFFER_BYTES[p] // NCCL_STEPS for p in PROTOCOLS})
#: Data bytes an LL forwarding step receives inside a node before it passes data on: one line
#: per thread, NCCL_LL_MAX_NTHREADS x 8 data bytes (NCCL 512 threads; RCCL 256, its
#: NCCL_MAX_NTHREADS). Each thread polls its own 16-byte line's flag and writes the line on at
#: once (``prims_ll.h``), so LL hops cut through a slot line by line instead of storing and
#: forwarding it (LL128 and Simple wait for their slices). Across nodes the network proxy sends
#: a step once all its lines are in: a whole slot.
LL_FORWARD_BYTES: Mapping[str, int] = MappingProxyType({"nccl": 512 * 8, "rccl": 256 * 8})


def check_protocol(name: object, what: str = "protocol") -> str:
    """``name`` when it is one of :data:`PROTOCOLS` (case sensitive, as the runtimes read it).

    Raises
    ------
    UnknownNameError
        Any other value, with the valid names.

    >>> check_protocol("LL128")
    'LL128'
    >>> check_protocol("simple")
    Traceback (most recent call last):
    ...
    collsynth.errors.UnknownNameError: protocol 'simple'; expected one of LL, LL128, Simple
    """
    if not isinstance(name, str) or name not in PROTOCOLS:
        raise UnknownNameError(f"{what} {name!r}; expected one of {', '.join(PROTOCOLS)}")
    return name
