"""Simulate one training step of a model under a parallel strategy on a topology.

The details (formats, conventions, rules) are in docs/training.md.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Iterable, Iterator, Mapping, Sequence

from collsynth.errors import InvalidInstanceError
from collsynth.timing.kernels import DTYPE_BYTES, Device, get_device
from collsynth.training.comm import CommModel, NcclComm
from collsynth.training.model import Gemm, Layer
from collsynth.training.strategy import ParallelStrategy, partition_stages, tensor_roles

if TYPE_CHECKING:  # pragma: no cover - imported for annotations only
    from collsynth.topology.model import Topology

__all__ = [
    "CATEGORIES",
    "STREAMS",
    "Event",
    "SimulationResult",
    "simulate",
    "single_device_time_us",
    "candidate_strategies",
    "grid_search",
]

_log = logging.getLogger(__name__)

#: Event categories.
CATEGORIES = ("compute", "comm", "idle")
#: Per-device streams, in display order.
STREAMS = ("compute", "send", "recv", "gradients")


@dataclass(frozen=True)
class Event:
    """One interval on one device's timeline.

    ``device`` is the topology rank; ``category`` one of :data:`CATEGORIES`; ``stream`` one of
    :data:`STREAMS`; times in microseconds from the start of the step.
    """

    device: int
    name: str
    category: str
    start_us: float
    duration_us: float
    stream: str = "compute"

    @property
    def end_us(self) -> float:
        return self.start_us + self.duration_us


@dataclass(frozen=True)
class SimulationResult:
    """One simulated training step.

    Attributes
    ----------
    step_time_us:
        When the last device finishes (us).
    batch_size:
        Samples per step (global batch).
    single_device_us:
        Compute time of the same model and batch on one device (:func:`single_device_time_us`).
    strategy:
        The strategy simulated.
    devices:
        Topology rank of each device index (:meth:`ParallelStrategy.device_index`).
    stages:
        ``(first, end)`` layer range of each pipeline stage.
    events:
        Every device's timeline, sorted by device, stream, start (empty with
        ``timelines=False``).
    comm_time_us, compute_time_us:
        Per device: time its compute stream spent in blocking collectives, and in GEMMs.
    """

    step_time_us: float
    batch_size: int
    single_device_us: float
    strategy: ParallelStrategy
    devices: tuple[int, ...]
    stages: tuple[tuple[int, int], ...]
    events: tuple[Event, ...] = ()
    compute_time_us: Mapping[int, float] = field(default_factory=dict)
    comm_time_us: Mapping[int, float] = field(default_factory=dict)

    @property
    def throughput(self) -> float:
        """Samples per second: ``batch_size / step_time``."""
        return self.batch_size / (self.step_time_us * 1e-6)

    @property
    def speedup(self) -> float:
        """Single-device compute time over the step time."""
        return self.single_device_us / self.step_time_us

    @property
    def num_devices(self) -> int:
        return len(self.devices)

    @property
    def efficiency(self) -> float:
        """Speedup per device."""
        return self.speedup / self.num_devices

    def coordinates(self, device: int) -> tuple[int, int, int]:
        """``(stage, replica, tensor_rank)`` of a topology rank used by the step."""
        if device not in self.devices:
            raise InvalidInstanceError(f"rank {device} takes no part in this step "
                                       f"(devices {self.devices})")
        return self.strategy.coordinates(self.devices.index(device))

    def timeline(self, device: int) -> tuple[Event, ...]:
        """The events of one device (a topology rank), sorted by stream then start."""
        return tuple(e for e in self.events if e.device == device)

    @property
    def timelines(self) -> Mapping[int, tuple[Event, ...]]:
        """``{device: events}`` for every device of the step."""
        result: dict[int, list[Event]] = {d: [] for d in self.devices}
        for e in self.events:
            result[e.device].append(e)
        return MappingProxyType({d: tuple(v) for d, v in result.items()})

    def summary(self) -> str:
        """One line: strategy, step time, throughput, speedup."""
        return (f"{self.strategy.label()} on {self.num_devices} device(s): step "
                f"{self.step_time_us / 1e3:.3f} ms, {self.throughput:,.0f} samples/s, speedup "
                f"{self.speedup:.2f}x")


def single_device_time_us(layers: Sequence[Layer], batch_size: int, *,
                          device: "str | Device" = "a100", dtype: str = "fp16") -> float:
    """Forward + backward GEMM time of every layer at ``batch_size`` samples on one device.

    >>> from collsynth.training.model import Linear
    >>> from collsynth.timing.kernels import gemm_time_us
    >>> t = single_device_time_us([Linear(512, 256)], 64)
    >>> t == sum(gemm_time_us(*s, "a100") for s in [(64, 256, 512), (64, 512, 256), (512, 256, 64)])
    True
    """
    _check_layers(layers)
    _positive(batch_size, "batch_size")
    return sum(layer.compute_time_us(batch_size, 1, device, dtype=dtype) for layer in layers)


def _positive(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidInstanceError(f"{name} = {value!r}; expected an integer >= 1")
    return value


def _check_layers(layers: Sequence[Layer]) -> tuple[Layer, ...]:
    layers = tuple(layers)
    if not layers:
        raise InvalidInstanceError("the model has no layers")
    for i, layer in enumerate(layers):
        if not isinstance(layer, Layer):
            raise InvalidInstanceError(f"layer {i} is {type(layer).__name__}, not a "
                                       "collsynth.training Layer (Linear, TransformerBlock...)")
    return layers


class _Timeline:
    """Mutable per-device state of one simulation: events and busy times."""

    def __init__(self, record: bool) -> None:
        self.record = record
        self.events: list[Event] = []
        self.compute: dict[int, float] = {}
        self.comm: dict[int, float] = {}

    def event(self, device: int, name: str, category: str, start: float, duration: float,
              stream: str = "compute") -> None:
        """Record an event (busy times are the caller's to add)."""
        if self.record:
            self.events.append(Event(device, name, category, start, duration, stream))

    def add(self, device: int, name: str, category: str, start: float, duration: float,
            stream: str = "compute") -> None:
        """Record an event and, on the compute stream, add it to the device's busy time."""
        if stream == "compute":
            bucket = self.compute if category == "compute" else self.comm
            bucket[device] = bucket.get(device, 0.0) + duration
        self.event(device, name, category, start, duration, stream)


def simulate(layers: Sequence[Layer], batch_size: int, strategy: ParallelStrategy,
             topology: "Topology", comm: CommModel | None = None, *,
             device: "str | Device" = "a100", dtype: str = "fp16",
             ranks: Sequence[int] | None = None, timelines: bool = True) -> SimulationResult:
    """Simulate one training step (docs/training.md).

    Parameters
    ----------
    layers:
        The model, first layer first.
    batch_size:
        Global batch (samples; sequences for transformer blocks).
    strategy:
        Degrees, microbatches, placement order, gradient overlap.
    topology:
        Where the devices are; needs ``alpha_us`` and ``unit_gbps`` when anything communicates.
    comm:
        Prices collectives and sends (default :class:`~collsynth.training.comm.NcclComm`).
    device, dtype:
        The GPU model (:func:`~collsynth.timing.kernels.get_device`) and element type.
    ranks:
        Topology rank of each device index (default ``0 .. d*t*p - 1``).
    timelines:
        Record the events (``False`` is faster: only the times).

    Raises
    ------
    InvalidInstanceError
        For degrees that do not fit: more devices than ranks, a pipeline deeper than the model,
        a batch not divisible by ``d * m``, a tensor degree not dividing the split dimensions,
        bad ``ranks``.
    UnknownNameError
        For an unknown device or dtype.

    Examples
    --------
    A 4-layer 1024-wide MLP on 2 GPUs of a DGX A100, data parallel: a batch of 4096 keeps each
    GPU busy long enough to gain from the second one despite the gradient allreduce:

    >>> from collsynth.topology import get_topology
    >>> from collsynth.training import ParallelStrategy, mlp
    >>> result = simulate(mlp(4, 1024), 4096, ParallelStrategy(data=2), get_topology("dgx-a100"))
    >>> result.devices
    (0, 1)
    >>> print(result.summary())
    d2 t1 p1 m1 on 2 device(s): step 0.256 ms, 15,977,963 samples/s, speedup 1.48x
    >>> sorted({e.category for e in result.events})
    ['comm', 'compute']

    An 8-layer MLP in 4 pipeline stages, two layers each:

    >>> r = simulate(mlp(8, 2048), 512, ParallelStrategy(pipeline=4, microbatches=8),
    ...              get_topology("dgx-a100"))
    >>> r.stages
    ((0, 2), (2, 4), (4, 6), (6, 8))
    """
    layers = _check_layers(layers)
    _positive(batch_size, "batch_size")
    if not isinstance(strategy, ParallelStrategy):
        raise InvalidInstanceError(f"strategy is {type(strategy).__name__}, expected a "
                                   "ParallelStrategy")
    gpu = get_device(device)
    if dtype not in DTYPE_BYTES:
        raise InvalidInstanceError(f"dtype {dtype!r}; known: {', '.join(DTYPE_BYTES)}")
    gpu.tflops(dtype)  # raises for a dtype the device has no figure for
    elem = DTYPE_BYTES[dtype]
    d, t, p, m = strategy.data, strategy.tensor, strategy.pipeline, strategy.microbatches
    used = _placement(topology, strategy, ranks)
    if p > len(layers):
        raise InvalidInstanceError(f"pipeline degree {p} is larger than the {len(layers)} "
                                   "layer(s) of the model")
    if batch_size % (d * m):
        raise InvalidInstanceError(f"batch_size {batch_size} is not divisible by data degree x "
                                   f"microbatches = {d} x {m} = {d * m}")
    for layer in layers:
        layer.check_tensor(t)
    if comm is None:
        comm = NcclComm(topology)
    micro = batch_size // (d * m)

    gemm_cache: dict[Gemm, float] = {}

    def gemm_us(op: Gemm) -> float:
        if op not in gemm_cache:
            gemm_cache[op] = op.time_us(gpu, dtype=dtype)
        return gemm_cache[op]

    comm_cache: dict[tuple, float] = {}

    def comm_us(collective: str, group: tuple[int, ...], nbytes: int) -> float:
        key = (collective, group, nbytes)
        if key not in comm_cache:
            comm_cache[key] = float(comm.time_us(collective, group, nbytes))
        return comm_cache[key]

    ops_cache: dict[tuple, tuple] = {}

    def ops(layer: Layer, role: str, forward: bool) -> tuple:
        key = (_shape_key(layer), role, forward)
        if key not in ops_cache:
            ops_cache[key] = (layer.forward_ops(micro, t, role) if forward
                              else layer.backward_ops(micro, t, role))
        return ops_cache[key]

    costs = [sum(gemm_us(op) for op in ops(layer, "column", True) + ops(layer, "column", False)
                 if isinstance(op, Gemm)) for layer in layers]
    stages = partition_stages(costs, p)
    roles = tensor_roles(layers, stages)

    def segments_of(stage: int, forward: bool) -> list[tuple[int, str, list[tuple]]]:
        """Per layer: runs of GEMMs ``("gemms", total_us, ((name, us), ...))`` and collectives
        ``("comm", name, collective, bytes)``, in order."""
        first, end = stages[stage]
        order = range(first, end) if forward else range(end - 1, first - 1, -1)
        result = []
        for i in order:
            layer = layers[i]
            segments: list[tuple] = []
            run_of: list[tuple[str, float]] = []
            for op in ops(layer, _linear_role(roles[i]), forward):
                if isinstance(op, Gemm):
                    run_of.append((op.name, gemm_us(op)))
                    continue
                if run_of:
                    segments.append(("gemms", sum(us for _, us in run_of), tuple(run_of)))
                    run_of = []
                if t > 1:
                    segments.append(("comm", op.name, op.collective, op.elements * elem))
            if run_of:
                segments.append(("gemms", sum(us for _, us in run_of), tuple(run_of)))
            result.append((i, layer.name, segments))
        return result

    fwd_ops = [segments_of(s, True) for s in range(p)]
    bwd_ops = [segments_of(s, False) for s in range(p)]
    if not timelines:  # nothing to name: merge GEMM runs across layers
        fwd_fast = [_fused(ops) for ops in fwd_ops]
        bwd_fast = [_fused(ops) for ops in bwd_ops]
    else:
        fwd_fast, bwd_fast = fwd_ops, bwd_ops
    table = {(s, r, j): used[strategy.device_index(s, r, j)]
             for s in range(p) for r in range(d) for j in range(t)}

    def dev(stage: int, replica: int, rank: int) -> int:
        return table[stage, replica, rank]

    tensor_groups = {(s, r): [dev(s, r, j) for j in range(t)] for s in range(p) for r in range(d)}
    tl = _Timeline(timelines)
    free = {r: 0.0 for r in used}        # compute stream
    send_free = {r: 0.0 for r in used}   # one device's sends, one after the other
    grad_free = {r: 0.0 for r in used}   # overlapped gradient allreduces
    arrival: dict[tuple, float] = {}
    layer_done: dict[tuple, float] = {}

    def run(stage: int, replica: int, label: str, layer_ops: list, ready: dict[int, float],
            record_layers: bool) -> None:
        members = tensor_groups[stage, replica]
        group = tuple(sorted(members))
        now = {g: max(free[g], ready.get(g, 0.0)) for g in members}
        busy_compute = busy_comm = 0.0
        for index, layer_name, segments in layer_ops:
            for segment in segments:
                if segment[0] == "gemms":
                    _, total, gemms = segment
                    busy_compute += total
                    for g in members:
                        if timelines:
                            at = now[g]
                            for name, duration in gemms:
                                tl.event(g, f"{label} {layer_name} {name}", "compute", at,
                                         duration)
                                at += duration
                        now[g] += total
                else:
                    _, name, collective, nbytes = segment
                    start = max(now.values())
                    duration = comm_us(collective, group, nbytes)
                    busy_comm += duration
                    for g in members:
                        if timelines:
                            tl.event(g, f"{label} {layer_name} {name}", "comm", start, duration)
                        now[g] = start + duration
            if record_layers:
                for j, g in enumerate(members):
                    layer_done[(stage, replica, j, index)] = now[g]
        for g in members:
            tl.compute[g] = tl.compute.get(g, 0.0) + busy_compute
            tl.comm[g] = tl.comm.get(g, 0.0) + busy_comm
        free.update(now)

    def send(stage: int, replica: int, to_stage: int, label: str, nbytes: int, key: tuple
             ) -> None:
        for j in range(t):
            src, dst = dev(stage, replica, j), dev(to_stage, replica, j)
            start = max(free[src], send_free[src])
            duration = comm_us("send", (src, dst), nbytes)
            send_free[src] = start + duration
            arrival[key + (j,)] = start + duration
            tl.add(src, f"send {label} to stage {to_stage}", "comm", start, duration, "send")
            tl.add(dst, f"recv {label} from stage {stage}", "comm", start, duration, "recv")

    def ready_from(stage: int, replica: int, key: tuple) -> dict[int, float]:
        return {dev(stage, replica, j): arrival[key + (j,)] for j in range(t)}

    # Forward passes, microbatch by microbatch, stage by stage.
    for i in range(m):
        for s in range(p):
            for r in range(d):
                ready = ready_from(s, r, ("fwd", s, r, i)) if s > 0 else {}
                run(s, r, f"F{i}", fwd_fast[s], ready, False)
                if s < p - 1:
                    nbytes = layers[stages[s][1] - 1].output_elements(micro) * elem
                    send(s, r, s + 1, f"activation F{i}", nbytes, ("fwd", s + 1, r, i))
    # Backward passes, last microbatch first, last stage first.
    for i in reversed(range(m)):
        for s in reversed(range(p)):
            for r in range(d):
                ready = ready_from(s, r, ("bwd", s, r, i)) if s < p - 1 else {}
                record = i == 0 and d > 1 and strategy.overlap_gradients
                run(s, r, f"B{i}", bwd_ops[s] if record else bwd_fast[s], ready, record)
                if s > 0:
                    nbytes = layers[stages[s][0]].input_elements(micro) * elem
                    send(s, r, s - 1, f"gradient B{i}", nbytes, ("bwd", s - 1, r, i))
            if d > 1 and strategy.overlap_gradients and i == 0:
                first, end = stages[s]
                for j in range(t):
                    group_devs = [dev(s, r, j) for r in range(d)]
                    group = tuple(sorted(group_devs))
                    for li in range(end - 1, first - 1, -1):
                        layer = layers[li]
                        done = max(layer_done[(s, r, j, li)] for r in range(d))
                        start = max([done] + [grad_free[g] for g in group_devs])
                        duration = comm_us("allreduce", group, layer.weight_elements(t) * elem)
                        for g in group_devs:
                            tl.add(g, f"allreduce gradients {layer.name}", "comm", start,
                                   duration, "gradients")
                            grad_free[g] = start + duration
    # Fused, blocking gradient allreduce per stage.
    if d > 1 and not strategy.overlap_gradients:
        for s in range(p):
            first, end = stages[s]
            nbytes = sum(layers[li].weight_elements(t) for li in range(first, end)) * elem
            for j in range(t):
                group_devs = [dev(s, r, j) for r in range(d)]
                start = max(free[g] for g in group_devs)
                duration = comm_us("allreduce", tuple(sorted(group_devs)), nbytes)
                for g in group_devs:
                    tl.add(g, f"allreduce gradients stage {s}", "comm", start, duration)
                    free[g] = start + duration

    step = max(itertools.chain(free.values(), send_free.values(), grad_free.values()))
    events: tuple[Event, ...] = ()
    if timelines:
        events = _with_idle(tl.events, used, step)
    return SimulationResult(
        step_time_us=step,
        batch_size=batch_size,
        single_device_us=single_device_time_us(layers, batch_size, device=gpu, dtype=dtype),
        strategy=strategy,
        devices=used,
        stages=stages,
        events=events,
        compute_time_us=MappingProxyType({r: tl.compute.get(r, 0.0) for r in used}),
        comm_time_us=MappingProxyType({r: tl.comm.get(r, 0.0) for r in used}),
    )


def _fused(layer_ops: list) -> list:
    """The segments of all layers as one, consecutive GEMM runs merged (no names kept)."""
    merged: list[tuple] = []
    for _, _, segments in layer_ops:
        for segment in segments:
            if segment[0] == "gemms" and merged and merged[-1][0] == "gemms":
                merged[-1] = ("gemms", merged[-1][1] + segment[1], ())
            elif segment[0] == "gemms":
                merged.append(("gemms", segment[1], ()))
            else:
                merged.append(segment)
    return [(-1, "", merged)]


def _shape_key(layer: Layer) -> object:
    """What a layer's operations depend on: its fields but its name (layers of an MLP share)."""
    if dataclasses.is_dataclass(layer):
        return type(layer), tuple(getattr(layer, f.name) for f in dataclasses.fields(layer)
                                  if f.name != "name")
    return layer


def _linear_role(role: str) -> str:
    return "column" if role == "block" else role


def _placement(topology: "Topology", strategy: ParallelStrategy,
               ranks: Sequence[int] | None) -> tuple[int, ...]:
    n = topology.num_ranks
    needed = strategy.devices
    if ranks is None:
        if needed > n:
            raise InvalidInstanceError(
                f"strategy {strategy.label()} needs d x t x p = {strategy.data} x "
                f"{strategy.tensor} x {strategy.pipeline} = {needed} devices; topology "
                f"{topology.name!r} has {n}")
        return tuple(range(needed))
    chosen = tuple(ranks)
    for r in chosen:
        if isinstance(r, bool) or not isinstance(r, int) or not 0 <= r < n:
            raise InvalidInstanceError(f"ranks: {r!r} is not a rank of {topology.name!r} "
                                       f"(0..{n - 1})")
    if len(set(chosen)) != len(chosen):
        raise InvalidInstanceError(f"ranks {chosen}: a rank is repeated")
    if len(chosen) < needed:
        raise InvalidInstanceError(f"strategy {strategy.label()} needs {needed} devices; ranks "
                                   f"lists {len(chosen)}")
    return chosen[:needed]


def _with_idle(events: list[Event], devices: Sequence[int], step: float) -> tuple[Event, ...]:
    """The events plus ``idle`` events filling each device's compute-stream gaps up to ``step``."""
    stream_rank = {s: i for i, s in enumerate(STREAMS)}
    by_device: dict[int, list[Event]] = {r: [] for r in devices}
    for e in events:
        by_device[e.device].append(e)
    result: list[Event] = []
    for r in devices:
        compute = sorted((e for e in by_device[r] if e.stream == "compute"),
                         key=lambda e: e.start_us)
        cursor, idle = 0.0, []
        for e in compute:
            if e.start_us > cursor + 1e-9:
                idle.append(Event(r, "idle", "idle", cursor, e.start_us - cursor))
            cursor = max(cursor, e.end_us)
        if step > cursor + 1e-9:
            idle.append(Event(r, "idle", "idle", cursor, step - cursor))
        result.extend(sorted(by_device[r] + idle,
                             key=lambda e: (stream_rank[e.stream], e.start_us)))
    return tuple(result)


def candidate_strategies(num_devices: int, *, microbatches: Iterable[int] = (1, 2, 4, 8, 16, 32),
                         degrees: Iterable[int] | None = None, exact: bool = False,
                         order: tuple[str, str, str] | None = None
                         ) -> Iterator[ParallelStrategy]:
    """Every ``(d, t, p, m)`` with degrees from ``degrees`` (default the powers of two up to
    ``num_devices``) and ``d * t * p <= num_devices`` (``== num_devices`` with ``exact``).

    >>> [s.label() for s in candidate_strategies(2, microbatches=(1,))]
    ['d1 t1 p1 m1', 'd1 t1 p2 m1', 'd1 t2 p1 m1', 'd2 t1 p1 m1']
    """
    _positive(num_devices, "num_devices")
    if degrees is None:
        degrees = [2 ** k for k in range(num_devices.bit_length()) if 2 ** k <= num_devices]
    degrees = sorted(set(degrees))
    micro = sorted(set(microbatches))
    for value in list(degrees) + micro:
        _positive(value, "degree or microbatch count")
    extra = {} if order is None else {"order": order}
    for d, t, p in itertools.product(degrees, repeat=3):
        total = d * t * p
        if total > num_devices or (exact and total != num_devices):
            continue
        for m in micro:
            yield ParallelStrategy(data=d, tensor=t, pipeline=p, microbatches=m, **extra)


def grid_search(layers: Sequence[Layer], batch_size: int, topology: "Topology",
                comm: CommModel | None = None, *,
                strategies: Iterable[ParallelStrategy] | None = None,
                device: "str | Device" = "a100", dtype: str = "fp16") -> list[SimulationResult]:
    """Simulate every strategy (default :func:`candidate_strategies` on all ranks) and return
    the feasible ones, highest throughput first (ties: fewer devices first).

    Strategies the model or topology cannot take (:class:`InvalidInstanceError`: a batch not
    divisible, more stages than layers...) are skipped. Timelines are not recorded; simulate
    the winner again for its trace.

    >>> from collsynth.topology import get_topology
    >>> from collsynth.training.model import mlp
    >>> best = grid_search(mlp(4, 1024), 64, get_topology("dgx-a100"),
    ...                    strategies=candidate_strategies(2, microbatches=(1, 2)))[0]
    >>> best.num_devices <= 2 and best.throughput > 0
    True
    """
    _check_layers(layers)
    if comm is None:
        comm = NcclComm(topology)
    if strategies is None:
        strategies = candidate_strategies(topology.num_ranks)
    results = []
    for strategy in strategies:
        try:
            results.append(simulate(layers, batch_size, strategy, topology, comm, device=device,
                                    dtype=dtype, timelines=False))
        except InvalidInstanceError as exc:
            _log.debug("skipping %s: %s", strategy.label(), exc)
    results.sort(key=lambda res: (-res.throughput, res.num_devices))
    return results
