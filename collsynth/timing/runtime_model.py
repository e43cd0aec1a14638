"""How long a runtime takes to run an MSCCL program: a program-level simulation.

Where :mod:`collsynth.timing.model` prices an algorithm's steps in closed form, this module
runs the *program* the runtime executes (an XML file, or an algorithm after lowering) the way
the runtime does; docs/runtime-model.md gives the model and its sources.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from numbers import Real
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import numpy as np

from collsynth.collective.kinds import busbw_factor
from collsynth.errors import (InputTooLargeError, InvalidInstanceError, InvalidTopologyError,
                              UnknownNameError)
from collsynth.export.program import Program
from collsynth.export.semantics import Scheduler
from collsynth.runtimes import RuntimeConstants
from collsynth.runtimes.protocols import PROTOCOL_EFFICIENCY
from collsynth.timing.paths import Fabric

if TYPE_CHECKING:  # pragma: no cover - imported for annotations only
    from collsynth.topology.model import Topology

__all__ = ["ProgramTime", "PreparedProgram", "prepare_program", "simulate_program", "indirect_note",
           "SEND", "RECEIVE", "FORWARD", "LOCAL",
           "simulate_sizes", "SimulationOptions", "MAX_SIMULATED_STEPS", "check_simulated_steps",
           "BY_CONNECTION", "BY_SWITCH", "BY_NVLS_CHANNEL", "host_work_us", "MAX_GPUS_PER_THREAD"]

#: How a transfer of a switch graph is bounded (PreparedProgram.switch_role): by its
#: connection's ceiling, by nothing but the resources it crosses (the switch moves it), or by
#: the runtime's rate per NVLS channel.
BY_CONNECTION, BY_SWITCH, BY_NVLS_CHANNEL = 0, 1, 2

#: Most steps (all ranks' thread blocks together) a program may have to be simulated. Preparing
#: costs about 20 us per step on a 2-core machine and each size about 10 us more, so 2^20 steps
#: answer in under a minute; that is 16 times the steps of a ring allreduce of 128 ranks on 32
#: channels, and the 16384 thread blocks the checker executes at 64 steps each.
MAX_SIMULATED_STEPS = 1 << 20
#: Most GPUs one thread drives: nccl-tests' ``-g`` takes a node's GPUs (at most 8 in every
#: machine sold, 72 in an NVL72 rack if one thread drove them all).
MAX_GPUS_PER_THREAD = 72

#: Transfer kinds of a :class:`PreparedProgram` (what a step does with its bytes): it sends,
#: receives, receives and sends on (forwards), or works on local data.
SEND, RECEIVE, FORWARD, LOCAL = 0, 1, 2, 3
#: The kind of each MSCCL step type, and the step types that reduce (a graph built without the
#: scheduler, :mod:`collsynth.timing.ring_fold`, reads the same table).
STEP_KIND = {"s": SEND, "r": RECEIVE, "rrc": RECEIVE, "rcs": FORWARD, "rrs": FORWARD,
             "rrcs": FORWARD, "cpy": LOCAL, "re": LOCAL}
REDUCING_STEPS = frozenset({"rrc", "rrs", "rrcs", "re"})


@dataclass(frozen=True)
class SimulationOptions:
    """Knobs of the simulation itself (not of the runtime).

    ``share_links``: charge fair shares of links and groups (``False`` gives every connection
    the whole of every resource it crosses: for experiments only). ``max_passes`` and
    ``tolerance``: the fixed point's limits (passes; relative change of any rate).
    ``gpus_per_thread``: how many GPUs the calling thread drives (1 with a process per GPU,
    8 for nccl-tests' ``-g 8``); the host's work per call (the constants' ``host_us`` and
    ``channel_us``) is done for each.
    """

    share_links: bool = True
    max_passes: int = 12
    tolerance: float = 1e-4
    gpus_per_thread: int = 1

    def __post_init__(self) -> None:
        if isinstance(self.gpus_per_thread, bool) or not isinstance(self.gpus_per_thread, int) \
                or not 1 <= self.gpus_per_thread <= MAX_GPUS_PER_THREAD:
            raise InvalidInstanceError(f"gpus_per_thread = {self.gpus_per_thread!r}; expected a "
                                       f"whole number from 1 to {MAX_GPUS_PER_THREAD}")


@dataclass(frozen=True)
class ProgramTime:
    """One simulated call: ``time_us`` (base latency included), nccl-tests ``algbw_gbps`` and
    ``busbw_gbps``, and a ``breakdown`` (``base_us``, ``host_us``, ``makespan_us``, ``protocol``,
    ``iterations``, ``passes``, ``busiest`` resource and its ``busiest_utilization``)."""

    size_bytes: float
    time_us: float
    algbw_gbps: float
    busbw_gbps: float
    breakdown: Mapping[str, float | int | str] = field(default_factory=dict)


@dataclass
class PreparedProgram:
    """A program executed once on a topology: the size-independent timing graph.

    Per transfer (index = the scheduler's event order, a topological order): ``kind``, ``cnt``,
    ``prev`` (the thread block's previous transfer or -1), ``deps`` (transfers whose publishes
    it waited for), ``match`` (the send a receive takes, or -1), ``sends`` (True for send-type
    steps), ``link_class`` (0 inside a node, 1 between nodes; -1 when it sends nothing),
    ``work`` (data passes over its bytes a reduction or copy makes; 0 for none). ``members``
    pairs (transfer, resource) for every link or group a send crosses; ``capacity_gbps`` and
    ``resource_names`` describe the resources. ``inputs`` (``None``, or per transfer the further
    sends a receive takes at once, as a switch reducing several streams in-line:
    :mod:`collsynth.timing.switch_graphs`); ``indirect`` the sends between ranks with no direct
    link, priced over the runtime's own path: ``(sender, receiver, via, sends)`` per pair
    (:func:`collsynth.timing.paths.runtime_path`, :func:`indirect_note`). ``slice_bytes``: data
    bytes a forwarding transfer must receive before passing them on when the runtime pipelines
    this graph with its own slice (NVLS: ``NCCL_NVLS_CHUNKSIZE``), or a function of the call's
    size giving them (the runtime shrinks its chunk for small calls); ``None``: the constants'
    :meth:`~collsynth.runtimes.RuntimeConstants.slice_bytes`. ``switch_resources``: the NVLS
    ports among the resources, whose ``capacity_gbps`` include ``switch_efficiency`` (NCCL's
    figure); constants with their own ``nvls_efficiency`` rescale them. ``switch_role``: per
    transfer, :data:`BY_CONNECTION` (the constants' ceiling of its class applies),
    :data:`BY_SWITCH` (the switch moves it: NVLS's reads and copies; only the resources it
    crosses bound it) or :data:`BY_NVLS_CHANNEL` (a head's load-reduce or store, one SM per
    channel: the constants' ``nvls_channel_gbps``); ``None``: every transfer by connection.
    ``weights``: per row of ``members``, how many transfers of the whole graph the row stands
    for on that resource, in a graph folded by its symmetries (:mod:`collsynth.timing.symmetry`;
    the row's transfer then stands for them all, at their common times); ``None``: 1 each.
    """

    program: Program
    topology: "Topology"
    kind: list[int]
    cnt: list[int]
    prev: list[int]
    deps: list[tuple[int, ...]]
    match: list[int]
    sends: np.ndarray
    link_class: np.ndarray
    work: np.ndarray
    members: np.ndarray           # shape (M, 2): transfer, resource
    capacity_gbps: np.ndarray
    resource_names: list[str]
    buffer_chunks: int
    busbw_factor: float
    inputs: list[tuple[int, ...]] | None = None
    indirect: tuple[tuple[int, int, str, int], ...] = ()
    slice_bytes: "float | Callable[[float], float] | None" = None
    switch_resources: tuple[int, ...] = ()
    switch_efficiency: float = 1.0
    switch_role: np.ndarray | None = None
    weights: np.ndarray | None = None
    #: :func:`_levels` of this graph, built at its first simulation.
    schedule: "_Schedule | None" = field(default=None, repr=False, compare=False)

    @property
    def num_transfers(self) -> int:
        return len(self.kind)


def indirect_note(prepared: PreparedProgram, *, most: int = 6) -> str:
    """One line naming the sends of ``prepared`` priced over the runtime's own path (no direct
    link), ``""`` when there are none: the pairs, the path and the sends of each, ``most``
    pairs at most.

    A ring over two ranks linked one way only: the way back goes through the host (a topology
    without machine facts: PCIe at NCCL's PCI_BW).

    >>> from collsynth.timing.runtime_baselines import ring_program
    >>> from collsynth.topology.model import Topology
    >>> one_way = Topology("one-way", ((0, 1), (0, 0)), unit_gbps=10.0)
    >>> indirect_note(prepare_program(ring_program("allgather", [(0, 1)]), one_way))
    "1 send between ranks with no direct link in topology 'one-way', priced over the \
runtime's own path: 1->0 via PCIe through the host, 12 GB/s (1 send)"
    """
    if not prepared.indirect:
        return ""
    sends = sum(count for *_, count in prepared.indirect)
    shown = [f"{a}->{b} via {via} ({count} send{'s' if count > 1 else ''})"
             for a, b, via, count in prepared.indirect[:most]]
    more = len(prepared.indirect) - most
    if more > 0:
        shown.append(f"and {more} more pair{'s' if more > 1 else ''}")
    return (f"{sends} send{'s' if sends > 1 else ''} between ranks with no direct link in "
            f"topology {prepared.topology.name!r}, priced over the runtime's own path: "
            + "; ".join(shown))


def check_simulated_steps(steps: int, what: str) -> None:
    """Refuse ``what`` of ``steps`` steps above :data:`MAX_SIMULATED_STEPS`, with the figure.

    >>> check_simulated_steps(2 ** 30, "the ring of 8192 ranks on 16 channels")
    Traceback (most recent call last):
    ...
    collsynth.errors.InputTooLargeError: the ring of 8192 ranks on 16 channels has 1073741824 \
steps; the program model simulates at most 1048576
    """
    if steps > MAX_SIMULATED_STEPS:
        raise InputTooLargeError(f"{what} has {steps} steps; the program model simulates at "
                                 f"most {MAX_SIMULATED_STEPS}")


def program_buffer_chunks(program: Program) -> int:
    """Chunks of the buffer the nccl-tests size counts (the larger of input and output)."""
    from collsynth.export.check import buffer_sizes

    return max(buffer_sizes(program.coll, program.ngpus, program.nchunksperloop))


def program_busbw_factor(coll: str, n: int) -> float:
    """nccl-tests' factor of the program's collective; 1 (busbw = algbw) for a custom one."""
    try:
        return float(busbw_factor(coll, n))
    except UnknownNameError:
        return 1.0


def prepare_program(program: Program, topology: "Topology") -> PreparedProgram:
    """Execute ``program`` once on ``topology`` and keep its timing graph.

    Ranks of the program are the topology's ranks, in order.

    Raises
    ------
    InvalidInstanceError
        The program's rank count differs from the topology's, a rank sends to a rank outside
        it, or the program deadlocks (the first reason is named).

    A send between ranks with no direct link is priced over the path the runtime takes
    (:func:`collsynth.timing.paths.runtime_path`) and listed in ``indirect``.
    InvalidTopologyError
        The topology has no ``unit_gbps``.
    """
    n = topology.num_ranks
    if program.ngpus != n:
        raise InvalidInstanceError(
            f"program {program.name!r} has {program.ngpus} ranks but topology "
            f"{topology.name!r} has {n}; its ranks map to the topology's in order")
    if topology.unit_gbps is None:
        raise InvalidTopologyError(
            f"topology {topology.name!r} has no unit_gbps (GB/s per bandwidth unit); the "
            "program model needs it (name the topology with it, e.g. ring:8,unit_gbps=25, or "
            "set it in the topology file)")
    if program.nchunksperloop < 1:
        raise InvalidInstanceError(f"program {program.name!r}: nchunksperloop must be >= 1")
    check_simulated_steps(sum(len(tb.steps) for g in program.gpus for tb in g.threadblocks),
                          f"program {program.name!r}")
    tbs = {g.id: {tb.id: tb for tb in g.threadblocks} for g in program.gpus}
    events: list = []
    scheduler = Scheduler(tbs)
    scheduler.run(lambda event, _payload: events.append(event))
    if scheduler.blocked():
        reasons = scheduler.explain_deadlock()
        detail = reasons[0][0] if reasons else "some thread blocks never finish"
        raise InvalidInstanceError(f"program {program.name!r} deadlocks: {detail}")
    fabric = Fabric(topology)
    total = len(events)
    kind = [0] * total
    cnt = [0] * total
    prev = [-1] * total
    deps: list[tuple[int, ...]] = [()] * total
    match = [-1] * total
    sends = np.zeros(total, dtype=bool)
    link_class = np.full(total, -1, dtype=np.int8)
    work = np.zeros(total)
    members: list[tuple[int, int]] = []
    indirect: dict[tuple[int, int], list] = {}
    for e in events:
        i = e.index
        t = e.transfer
        op = t.type
        kind[i] = STEP_KIND[op]
        cnt[i] = t.cnt
        prev[i] = -1 if e.previous is None else e.previous
        deps[i] = e.after_deps
        if e.received is not None:
            match[i] = e.received.index
        if op in REDUCING_STEPS:
            work[i] = len(t.srcoffs) if op == "re" else 1.0
        elif op == "cpy":
            work[i] = 1.0
        if kind[i] in (SEND, FORWARD):
            a, b = e.rank, e.send
            sends[i] = True
            if not 0 <= b < n:
                raise InvalidInstanceError(
                    f"{e.name()} sends to rank {b}, but topology {topology.name!r} has ranks "
                    f"0..{n - 1}")
            route = fabric.route(a, b)
            if route.via is not None:  # a foreign program (docs: "Foreign programs")
                indirect.setdefault((a, b), [a, b, route.via, 0])[3] += 1
            link_class[i] = route.link_class
            members.extend((i, r) for r in route.resources)
    return PreparedProgram(
        program=program, topology=topology, kind=kind, cnt=cnt, prev=prev, deps=deps,
        match=match, sends=sends, link_class=link_class, work=work,
        members=np.array(members, dtype=np.int64).reshape(-1, 2),
        capacity_gbps=np.array(fabric.capacity_gbps, dtype=float),
        resource_names=fabric.names, buffer_chunks=program_buffer_chunks(program),
        busbw_factor=program_busbw_factor(program.coll, n),
        indirect=tuple(tuple(v) for v in indirect.values()))  # type: ignore[misc]


@dataclass(frozen=True)
class _Schedule:
    """A timing graph cut into levels: every transfer's predecessors (its thread block's
    previous transfer, the transfers it waited for, the sends it receives) lie in earlier
    levels, so one level is timed at once. Per level: the transfers, and two flattened lists of
    predecessors with the first position of each transfer's run (``numpy.maximum.reduceat``):
    those whose finish it waits for, and the sends it receives (match and inputs). Every run
    ends with the sentinel index (the transfer count), whose finish and arrival are 0 and whose
    finish plus hop latency is minus infinity, so no run is empty and a sentinel never wins.
    Also the graph's per-transfer lists as arrays (converted once, not at every size): ``cnt``
    (floats), ``match`` and whether each transfer is a plain receive."""

    levels: tuple[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray], ...]
    cnt: np.ndarray
    match: np.ndarray
    plain_receive: np.ndarray


def _levels(prep: PreparedProgram) -> _Schedule:
    """The :class:`_Schedule` of ``prep`` (built once, then kept on it)."""
    if prep.schedule is not None:
        return prep.schedule
    total = prep.num_transfers
    prev, deps, match, inputs = prep.prev, prep.deps, prep.match, prep.inputs
    level = [0] * total
    waits: list[list[int]] = [[] for _ in range(total)]
    takes: list[list[int]] = [[] for _ in range(total)]
    for i in range(total):
        w = waits[i]
        if prev[i] >= 0:
            w.append(prev[i])
        w.extend(deps[i])
        t = takes[i]
        if match[i] >= 0:
            if inputs is not None:
                t.extend(inputs[i])
            t.append(match[i])
        depth = 0
        for j in w:
            if level[j] >= depth:
                depth = level[j] + 1
        for j in t:
            if level[j] >= depth:
                depth = level[j] + 1
        level[i] = depth
    by_level: dict[int, list[int]] = {}
    for i, depth in enumerate(level):
        by_level.setdefault(depth, []).append(i)
    built = []
    for depth in sorted(by_level):
        members = by_level[depth]
        wait_flat: list[int] = []
        wait_at: list[int] = []
        take_flat: list[int] = []
        take_at: list[int] = []
        for i in members:
            wait_at.append(len(wait_flat))
            wait_flat.extend(waits[i])
            wait_flat.append(total)
            take_at.append(len(take_flat))
            take_flat.extend(takes[i])
            take_flat.append(total)
        built.append((np.array(members, dtype=np.int64), np.array(wait_flat, dtype=np.int64),
                      np.array(wait_at, dtype=np.int64), np.array(take_flat, dtype=np.int64),
                      np.array(take_at, dtype=np.int64)))
    prep.schedule = _Schedule(tuple(built), np.array(prep.cnt, dtype=float),
                              np.array(prep.match, dtype=np.int64),
                              np.array(prep.kind) == RECEIVE)
    return prep.schedule


def _pass(prep: PreparedProgram, own: np.ndarray, tail: np.ndarray, first: np.ndarray,
          alpha: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One timing pass, a level of the graph at a time (:func:`_levels`): start and finish
    (us) of every transfer. A transfer starts when its thread block's previous transfer and
    every transfer it waited for have finished and, for a receive, when the first slice of each
    send it takes has arrived; it ends ``own`` later, and a receive no earlier than the last
    slice of each of those sends (their finish, their hop, then its ``tail``). The same
    arithmetic, in the same order, as the transfer-by-transfer reference in
    tests/timing/test_runtime_model.py."""
    total = len(own)
    finish = np.zeros(total + 1)
    arrive = np.zeros(total + 1)
    start = np.zeros(total + 1)
    landed = np.full(total + 1, -np.inf)    # finish + hop latency; the sentinel's never wins
    for members, wait_flat, wait_at, take_flat, take_at in _levels(prep).levels:
        s = np.maximum.reduceat(finish[wait_flat], wait_at)
        s = np.maximum(s, np.maximum.reduceat(arrive[take_flat], take_at))
        f = s + own[members]
        f = np.maximum(f, np.maximum.reduceat(landed[take_flat], take_at) + tail[members])
        start[members] = s
        finish[members] = f
        a = alpha[members]
        sending = a >= 0.0
        arrive[members] = np.where(sending, s + first[members] + a, 0.0)
        landed[members] = f + a
    return start[:total], finish[:total]


def _loads(starts: np.ndarray, finishes: np.ndarray, rates: np.ndarray, members: np.ndarray,
           n_resources: int, weights: np.ndarray | None = None) -> np.ndarray:
    """Per membership (transfer, resource): the resource's mean load (bytes/us) over the
    transfer's lifetime, every transfer counted at its mean rate (times its membership's
    weight) while it runs."""
    e, q = members[:, 0], members[:, 1]
    s, f, rho = starts[e], finishes[e], rates[e]
    if weights is not None:
        rho = rho * weights
    m = len(e)
    times = np.concatenate([s, f])
    groups = np.concatenate([q, q])
    delta = np.concatenate([rho, -rho])
    # np.lexsort((times, groups)), in two stable passes: by time, then by resource with the
    # radix sort numpy uses for 16-bit integers (the same order, ties included; 1.7x faster).
    by_time = np.argsort(times, kind="stable")
    small = groups.astype(np.int16) if n_resources <= np.iinfo(np.int16).max else groups
    order = by_time[np.argsort(small[by_time], kind="stable")]
    t_sorted, g_sorted, d_sorted = times[order], groups[order], delta[order]
    level = np.cumsum(d_sorted)                     # load after each point (0 between groups)
    dt = np.diff(t_sorted, append=t_sorted[-1] if m else 0.0)
    dt[np.append(g_sorted[1:] != g_sorted[:-1], True)] = 0.0
    integral = np.concatenate([[0.0], np.cumsum(level * dt)])[:-1]
    position = np.empty(2 * m, dtype=np.int64)
    position[order] = np.arange(2 * m)
    span = f - s
    with np.errstate(divide="ignore", invalid="ignore"):
        load = (integral[position[m:]] - integral[position[:m]]) / span
    return np.where(span > 0, load, 0.0)


def simulate_program(program: "Program | PreparedProgram", topology: "Topology | None",
                     size_bytes: Real, constants: RuntimeConstants, *,
                     protocol: str | None = None,
                     options: SimulationOptions = SimulationOptions(),
                     bandwidth_factor: float = 1.0) -> ProgramTime:
    """Simulate one call of ``program`` on ``topology`` for a ``size_bytes`` buffer.

    Parameters
    ----------
    program:
        A :class:`~collsynth.export.program.Program` or the :class:`PreparedProgram` of one
        (reuse it across sizes; ``topology`` is then ignored).
    size_bytes:
        nccl-tests convention (the allgather's output buffer, the allreduce's buffer...).
    constants:
        The runtime's constants (:mod:`collsynth.timing.runtime_constants`).
    protocol:
        Override the program's ``proto``.
    bandwidth_factor:
        The share (0 to 1] of every connection's and resource's rate the call reaches: the
        runtime's own per-size efficiency of an algorithm (NCCL's tree correction,
        :func:`~collsynth.timing.tuning_model.bandwidth_correction`); 1 for programs.

    Raises
    ------
    InvalidInstanceError
        A negative size, an unknown protocol, or what :func:`prepare_program` refuses.

    On a uniform case it is the alpha-beta closed form plus the last receive's pass: a k-step
    ring program in Simple whose chunks are at most the slice floor (32 KiB: one slice each)
    costs ``base + k (alpha + chunk * beta) + chunk * beta`` (docs/runtime-model.md).

    >>> from collsynth.timing.runtime_baselines import ring_program
    >>> from collsynth.runtimes import get_runtime
    >>> from collsynth.topology import get_topology
    >>> from collsynth.topology.builtins import with_figures
    >>> ring4 = with_figures(get_topology("ring:4"), unit_gbps=10.0, alpha_us=2.0)
    >>> program = ring_program("allgather", [(0, 1, 2, 3)], protocol="Simple")
    >>> c = get_runtime("nccl").defaults
    >>> t = simulate_program(program, ring4, 4000, c)
    >>> round(t.time_us - c.base_latency("Simple"), 6)  # 3 x (3.4 + 0.1) + 0.1
    10.6
    """
    prep = program if isinstance(program, PreparedProgram) else prepare_program(program,
                                                                                  topology)
    size = float(size_bytes)
    if not size >= 0 or not math.isfinite(size):
        raise InvalidInstanceError(f"size_bytes = {size_bytes!r}; expected a number >= 0")
    proto = protocol or prep.program.proto
    if proto not in PROTOCOL_EFFICIENCY:
        raise InvalidInstanceError(f"program {prep.program.name!r}: protocol {proto!r}; "
                                   f"expected one of {', '.join(PROTOCOL_EFFICIENCY)}")
    base = constants.base_latency(proto)
    # The host's work for the call overlaps the device's work of the call before, so the
    # slower of the two sets the pace.
    host = host_work_us(constants.host_us, constants.channel_us, prep.program.nchannels,
                        options.gpus_per_thread)
    if not 0 < bandwidth_factor <= 1:
        raise InvalidInstanceError(f"bandwidth_factor = {bandwidth_factor!r}; expected a "
                                   "number in (0, 1]")
    makespan, breakdown = _simulate(prep, size, constants, proto, options, bandwidth_factor)
    time = max(host, base + makespan)
    algbw = size / (time * 1e3) if time > 0 else 0.0
    breakdown = {"base_us": base, "host_us": host, "makespan_us": makespan,
                 "protocol": proto, **breakdown}
    return ProgramTime(size, time, algbw, algbw * prep.busbw_factor, breakdown)


def host_work_us(host_us: float, channel_us: float, channels: int,
                 gpus_per_thread: int) -> float:
    """The host's work for one call, us: ``host_us`` plus ``channel_us`` per channel, done by
    one thread for each of the ``gpus_per_thread`` GPUs it drives in turn.

    >>> host_work_us(4.0, 0.25, 24, 8)  # 8 x (4 + 24 x 0.25)
    80.0
    """
    return gpus_per_thread * (host_us + channel_us * channels)


def simulate_sizes(program: "Program | PreparedProgram", topology: "Topology | None",
                   sizes: Sequence[Real], constants: RuntimeConstants, *,
                   protocol: str | None = None,
                   options: SimulationOptions = SimulationOptions()) -> list[ProgramTime]:
    """:func:`simulate_program` at every size, preparing the program once."""
    prep = program if isinstance(program, PreparedProgram) else prepare_program(program,
                                                                                  topology)
    return [simulate_program(prep, None, s, constants, protocol=protocol, options=options)
            for s in sizes]


def _simulate(prep: PreparedProgram, size: float, c: RuntimeConstants, proto: str,
              options: SimulationOptions, bandwidth_factor: float = 1.0
              ) -> tuple[float, dict[str, Any]]:
    total = prep.num_transfers
    if total == 0:
        return 0.0, {"iterations": 0, "passes": 0, "busiest": "", "busiest_utilization": 0.0}
    chunk = size / prep.buffer_chunks
    iteration = min(chunk, c.iteration_bytes(proto)) if chunk > 0 else 0.0
    iterations = math.ceil(chunk / iteration) if iteration > 0 else 0
    efficiency = PROTOCOL_EFFICIENCY[proto]
    schedule = _levels(prep)
    cnt = schedule.cnt
    data = cnt * chunk                                   # data bytes per transfer
    sends = prep.sends
    cls = prep.link_class
    call = cnt * iteration                               # data bytes of one step's call
    if prep.slice_bytes is None:  # the constants' slice; LL's differs inside and across nodes
        piece = c.slice_bytes(proto)
        if proto == "LL":
            piece = np.where(cls == 1, c.slice_bytes(proto, network=True), piece)
        elif proto == "Simple":
            # prims_simple.h cuts every call into SlicePerChunk slices (no smaller than 1/32
            # of a full slice), however small the call: a 256 KiB step moves in two 128 KiB
            # slices, not one.
            piece = np.minimum(piece, np.maximum(call / c.slices_per_chunk(proto), piece / 32))
    else:
        piece = prep.slice_bytes(size) if callable(prep.slice_bytes) else prep.slice_bytes
    grain = np.minimum(call, piece)  # the pipelining slice
    gamma = c.gamma_us_per_byte
    hop = np.array([c.hop_latency("intra", proto), c.hop_latency("network", proto)])
    ceiling = np.array([c.ceiling("intra", proto), c.ceiling("network", proto)]) * 1e3
    alpha = np.where(sends, hop[np.maximum(cls, 0)], -1.0)
    # A connection's own cap (bytes/us): its ceiling, and its FIFO window over a round trip.
    cap = np.where(sends, ceiling[np.maximum(cls, 0)], np.inf)
    with np.errstate(divide="ignore"):
        window = np.where(sends & (alpha > 0), c.window_bytes(proto) / (2 * alpha), np.inf)
    cap = np.minimum(cap, window) * bandwidth_factor
    if prep.switch_role is not None:
        channel = c.nvls_channel_gbps * 1e3 if c.nvls_channel_gbps is not None else np.inf
        cap = np.where(prep.switch_role == BY_SWITCH, np.inf,
                       np.where(prep.switch_role == BY_NVLS_CHANNEL, channel, cap))
    members = prep.members
    resource_cap = prep.capacity_gbps * 1e3 * efficiency * bandwidth_factor  # data bytes/us
    if prep.switch_resources and c.nvls_efficiency is not None:
        resource_cap[list(prep.switch_resources)] *= c.nvls_efficiency / prep.switch_efficiency
    if len(members):
        own_cap = np.full(total, np.inf)
        np.minimum.at(own_cap, members[:, 0], resource_cap[members[:, 1]])
        cap = np.minimum(cap, own_cap)
    rate = np.where(sends, cap, np.inf)
    reduce_work = prep.work * gamma
    match = schedule.match
    receives = match >= 0
    matched = np.where(receives, match, 0)
    # In Simple a receive takes a slice out of the connection's FIFO only once the whole slice
    # is in (prims_simple.h waits for the step's tail), so its last slice costs a pass after it
    # lands, at the rate the connection moved it, as a forward's does; LL and LL128 take each
    # line as it arrives.
    copies_last = receives & schedule.plain_receive & (proto == "Simple")
    if prep.switch_role is not None:  # an NVLS load-reduce writes its sum where it goes
        copies_last &= prep.switch_role[matched] != BY_NVLS_CHANNEL
    # The copy is the receiving thread block's own work. Inside a node the thread block that
    # wrote the slice moved it at about that rate; across nodes the NIC's share set the
    # connection's rate, and where the constants say what one connection inside a node moves,
    # the copy runs no slower than that.
    intra = c.ceiling("intra", proto) * 1e3
    copy_floor = np.where(cls[matched] == 1, intra if math.isfinite(intra) else 0.0, 0.0)
    passes = 0
    start = finish = None
    previous_makespan: float | None = None
    while True:
        passes += 1
        with np.errstate(divide="ignore", invalid="ignore"):
            send_time = np.where(sends, data / rate, 0.0)
            send_tail = np.where(sends, grain / rate, 0.0)
            copy_last = np.where(copies_last, grain / np.maximum(rate[matched], copy_floor),
                                 0.0)
        own = np.maximum(send_time, reduce_work * data)
        tail = np.where(receives, send_tail + np.maximum(copy_last, reduce_work * grain), 0.0)
        first = np.where(sends, send_tail, 0.0)
        start, finish = _pass(prep, own, tail, first, alpha)
        if not options.share_links or not len(members) or passes >= options.max_passes:
            break
        span = finish - start
        with np.errstate(divide="ignore", invalid="ignore"):
            mean_rate = np.where(sends & (span > 0), data / span, 0.0)
        load = _loads(start, finish, mean_rate, members, len(resource_cap), prep.weights)
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(load > 0, resource_cap[members[:, 1]] / load, np.inf)
        factor = np.full(total, np.inf)
        np.minimum.at(factor, members[:, 0], ratio)
        # Scale toward the fair share: down where a resource is overloaded, back up (never
        # beyond the connection's own cap) where the load left room.
        new_rate = np.where(sends & np.isfinite(factor), np.minimum(cap, rate * factor), rate)
        old = rate[sends]
        change = np.abs(new_rate[sends] - old) / np.where(old > 0, old, 1.0)
        rate = new_rate
        # Done when no rate moves, or when the makespan no longer does (rates of transfers
        # off the critical path may keep drifting without changing the answer).
        span_now = float(finish.max())
        if not np.any(change > options.tolerance) or (
                previous_makespan is not None
                and abs(span_now - previous_makespan) <= options.tolerance * span_now):
            break
        previous_makespan = span_now
    makespan = float(finish.max()) if total else 0.0
    busiest, utilization = "", 0.0
    if len(members) and makespan > 0:
        wire = np.zeros(len(resource_cap))
        carried = data[members[:, 0]]
        np.add.at(wire, members[:, 1],
                  carried if prep.weights is None else carried * prep.weights)
        used = wire / (resource_cap * makespan)
        top = int(np.argmax(used))
        busiest, utilization = prep.resource_names[top], float(used[top])
    return makespan, {"iterations": iterations, "passes": passes, "busiest": busiest,
                      "busiest_utilization": utilization}
