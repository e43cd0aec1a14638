"""The runtime's own algorithms as MSCCL programs, so one simulator prices both sides.

NCCL and RCCL run allgather, reduce-scatter and allreduce on rings, one ring per channel; the same
schedule written as an MSCCL program runs through
:func:`collsynth.timing.runtime_model.simulate_program` with the same constants as any
synthesized program ("one yardstick"). The programs' steps are in docs/runtime-model.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

from collsynth.collective.kinds import canonical_name
from collsynth.errors import InvalidInstanceError, UnknownNameError
from collsynth.export.program import GpuProgram, Program, ThreadBlock, XmlStep

if TYPE_CHECKING:  # pragma: no cover
    from collsynth.timing.runtime_constants import RuntimeConstants
    from collsynth.topology.model import Topology

__all__ = ["RING_COLLECTIVES", "ring_program", "runtime_rings", "baseline_name", "TimedRow",
           "baseline_rows", "program_rows"]

RING_COLLECTIVES = ("allgather", "reduce_scatter", "allreduce")


def baseline_name(runtime: str) -> str:
    """The row name of a runtime's ring: ``nccl-ring``, ``rccl-ring`` (msccl runs NCCL's)."""
    return "rccl-ring" if runtime == "rccl" else "nccl-ring"


def runtime_rings(topology: "Topology", channels: int | None = None
                  ) -> tuple[tuple[int, ...], ...]:
    """The rings the runtime would use: :func:`collsynth.timing.nccl.ring_channels`, the first
    ``channels`` of them (reused in turn when fewer were found), or all.

    Raises
    ------
    InvalidInstanceError
        No ring through every rank, or ``channels`` < 1.
    """
    from collsynth.timing.nccl import ring_channels

    rings = ring_channels(topology)
    if not rings:
        raise InvalidInstanceError(f"topology {topology.name!r} has no directed ring through all "
                                   f"{topology.num_ranks} ranks; the runtime's ring cannot run")
    if channels is None:
        return rings
    if isinstance(channels, bool) or not isinstance(channels, int) or channels < 1:
        raise InvalidInstanceError(f"channels = {channels!r}; expected a whole number >= 1")
    return tuple(rings[i % len(rings)] for i in range(channels))


def ring_program(collective: str, rings: Sequence[Sequence[int]], *, protocol: str = "Simple",
                 name: str | None = None) -> Program:
    """The ring algorithm of ``collective`` over ``rings`` (one per channel) as a Program.

    Raises
    ------
    UnknownNameError
        A collective without a ring here (allgather, reduce_scatter, allreduce have one).
    InvalidInstanceError
        No ring, or a ring that is not a permutation of the same ranks as the first.

    >>> p = ring_program("allgather", [(0, 1, 2, 3)])
    >>> [st.type for st in p.gpus[0].threadblocks[0].steps]
    ['s', 'rcs', 'rcs', 'r', 'cpy']
    """
    key = canonical_name(collective)
    if key not in RING_COLLECTIVES:
        raise UnknownNameError(f"no ring program for {collective!r}; there is one for "
                               f"{', '.join(RING_COLLECTIVES)}")
    rings = [tuple(int(r) for r in ring) for ring in rings]
    if not rings:
        raise InvalidInstanceError("ring_program: give at least one ring")
    n = len(rings[0])
    for ring in rings:
        if sorted(ring) != list(range(n)):
            raise InvalidInstanceError(f"ring {ring} is not a permutation of ranks 0..{n - 1}")
    channels = len(rings)
    total = n * channels

    def chunk(owner: int, c: int) -> int:   # the slot of rank ``owner``'s part on channel c
        return owner * channels + c

    gpus = []
    for rank in range(n):
        tbs = []
        for c, ring in enumerate(rings):
            p = ring.index(rank)
            nxt, prv = ring[(p + 1) % n], ring[(p - 1) % n]

            def at(k: int) -> int:   # the rank k places before this one on the ring
                return ring[(p - k) % n]

            steps: list[tuple[str, str, int, str, int]] = []
            if n == 1:
                pass
            elif key == "allgather":
                steps.append(("s", "i", c, "o", chunk(rank, c)))
                steps += [("rcs", "o", chunk(at(k), c), "o", chunk(at(k), c))
                          for k in range(1, n - 1)]
                steps.append(("r", "o", chunk(at(n - 1), c), "o", chunk(at(n - 1), c)))
            else:
                steps.append(("s", "i", chunk(at(1), c), "i", chunk(at(1), c)))
                steps += [("rrs", "i", chunk(at(k + 1), c), "i", chunk(at(k + 1), c))
                          for k in range(1, n - 1)]
                if key == "reduce_scatter":
                    steps.append(("rrc", "i", chunk(rank, c), "o", c))
                else:
                    steps.append(("rrcs", "i", chunk(rank, c), "o", chunk(rank, c)))
                    steps += [("rcs", "o", chunk(at(k), c), "o", chunk(at(k), c))
                              for k in range(1, n - 1)]
                    steps.append(("r", "o", chunk(at(n - 1), c), "o", chunk(at(n - 1), c)))
            if key == "allgather":
                steps.append(("cpy", "i", c, "o", chunk(rank, c)))
            xml = tuple(XmlStep(s, op, sb, so, db, do, 1) for s, (op, sb, so, db, do)
                        in enumerate(steps))
            tbs.append(ThreadBlock(c, nxt if n > 1 else -1, prv if n > 1 else -1, c, xml))
        i_chunks, o_chunks = {"allgather": (channels, total),
                              "reduce_scatter": (total, channels),
                              "allreduce": (total, total)}[key]
        gpus.append(GpuProgram(rank, i_chunks, o_chunks, 0, tuple(tbs)))
    return Program(name=name or f"ring-{key}", proto=protocol, nchannels=channels,
                   nchunksperloop=total, ngpus=n, coll=key, inplace=0, gpus=tuple(gpus),
                   outofplace=1, min_bytes=0)


# -- pricing programs and the runtime's ring together ----------------------------------------------


@dataclass(frozen=True)
class TimedRow:
    """One (program or baseline, size): ``name``, nccl-tests ``size_bytes``, ``time_us``,
    ``algbw_gbps``, ``busbw_gbps``; ``kind`` is ``"program"`` or ``"baseline"``; ``protocol``
    the protocol it ran with."""

    name: str
    size_bytes: int
    time_us: float
    algbw_gbps: float
    busbw_gbps: float
    kind: str
    protocol: str

    def as_dict(self) -> dict:
        return {"name": self.name, "size_bytes": self.size_bytes, "time_us": self.time_us,
                "algbw_gbps": self.algbw_gbps, "busbw_gbps": self.busbw_gbps,
                "kind": self.kind, "protocol": self.protocol}


def _protocols_of(runtime: str) -> tuple[str, ...]:
    # RCCL leaves LL128 off by default on most AMD GPUs; NCCL offers all three.
    return ("LL", "Simple") if runtime == "rccl" else ("LL", "LL128", "Simple")


def baseline_rows(collective: str, topology: "Topology", sizes: Sequence[int],
                  constants: "RuntimeConstants", *, channels: int | None = None,
                  cache: dict | None = None) -> list[TimedRow]:
    """The runtime's own ring of ``collective`` at each size, simulated with ``constants``:
    its rings (``channels``, else the constants', else all found), its protocol at each size
    (``constants.default_protocols``, else the fastest predicted). ``cache``: a dictionary the
    caller keeps between calls with the same collective, topology and channels, so the ring
    programs are prepared once."""
    from collsynth.timing.runtime_model import prepare_program, simulate_program

    rings = runtime_rings(topology, channels if channels is not None else constants.channels)
    name = baseline_name(constants.runtime)
    prepared: dict = cache if cache is not None else {}

    def timed(protocol: str, size: int):
        if protocol not in prepared:
            prepared[protocol] = prepare_program(
                ring_program(collective, rings, protocol=protocol, name=name), topology)
        return simulate_program(prepared[protocol], None, size, constants)

    rows = []
    for size in sizes:
        chosen = constants.default_protocol(size)
        options = (chosen,) if chosen is not None else _protocols_of(constants.runtime)
        best = min((timed(p, size) for p in options), key=lambda t: t.time_us)
        rows.append(TimedRow(name, int(size), best.time_us, best.algbw_gbps, best.busbw_gbps,
                             "baseline", best.breakdown["protocol"]))
    return rows


def program_rows(name: str, program: Program, topology: "Topology", sizes: Sequence[int],
                 constants: "RuntimeConstants") -> list[TimedRow]:
    """``program`` simulated at each size (prepared once)."""
    from collsynth.timing.runtime_model import prepare_program, simulate_program

    prepared = prepare_program(program, topology)
    rows = []
    for size in sizes:
        t = simulate_program(prepared, None, size, constants)
        rows.append(TimedRow(name, int(size), t.time_us, t.algbw_gbps, t.busbw_gbps,
                             "program", t.breakdown["protocol"]))
    return rows
