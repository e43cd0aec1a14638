"""NCCL's and RCCL's own tuning model: what each estimates, picks and runs for one call.

A port of NCCL 2.30's cost model (``ncclTopoTuneModel``, ``ncclTopoGetAlgoTime``), its choice
and per-call channel and thread count (``topoGetAlgoInfo``, the cell scheduler of
``scheduleCollTasksToPlan``) and chunking (``calcCollChunking``), with the version differences
that matter for public logs of NCCL 2.18-2.29, and RCCL's tables for gfx90a, gfx942 and gfx950.
Pure functions over plain values (:class:`TuningSetup`); nothing is fitted or measured here.
The graph figures NCCL's topology search would find are approximated by :func:`setup_from_facts`
from a machine's facts. Sources, approximations and what is left out: docs/runtime-tuning.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from fractions import Fraction
from numbers import Real
from types import MappingProxyType
from typing import TYPE_CHECKING, Iterable, Mapping, Sequence

import sympy

from collsynth.collective.kinds import canonical_name
from collsynth.errors import (InvalidInstanceError, InvalidTopologyError, NoRingError,
                              UnknownNameError)
from collsynth.exact import exact_fraction
from collsynth.runtimes.constants import (NCCL_BASE_LATENCY_US, NCCL_HOP_LATENCY_US,
                                          RCCL_BASE_LATENCY_US, RCCL_HOP_LATENCY_US)
from collsynth.runtimes.protocols import PROTOCOL_EFFICIENCY, PROTOCOLS, STEP_BYTES
from collsynth.runtimes.settings import RuntimeSettings
from collsynth.timing.model import SIZE, CostModel, as_cost_model
from collsynth.timing.rings import ring_channels

if TYPE_CHECKING:  # pragma: no cover - imported for annotations only
    from collsynth.topology.machine import MachineFacts
    from collsynth.topology.model import Topology

__all__ = [
    "ALGORITHMS", "PROTOCOLS", "COLLECTIVES", "ring_steps", "DEFAULT_VERSION", "RCCL_DEFAULT_VERSION",
    "OLDEST_VERSION", "version_note",
    "GraphFigures", "TuningSetup", "Estimate", "CallShape", "RuntimeChoice",
    "bandwidth_gbps", "latency_us", "enabled", "algo_time_us", "estimates", "fastest", "choose",
    "call_shape", "max_channels", "cell_channels", "scheduled_channels", "setup_from_facts",
    "tuning_setup",
    "gpu_bandwidth_gbps", "node_links", "nvls_efficiency", "offered_protocols", "SETUP_FAILURES",
    "LINEAR_ALGORITHMS", "BANDWIDTH_FACTOR", "NcclSetup", "NcclChoice", "nccl_setup",
    "nccl_choices", "best_choice", "algorithm_choice", "connection_gbps", "call_cap_gbps",
    "NVLS_ALGORITHMS", "kind_channels", "NVLS_CHUNK_BYTES", "nvls_chunk_bytes",
    "nvls_tree_chunk_bytes", "pat_chunk_bytes", "NVLS_MAX_HEADS", "nvls_heads",
]

#: NCCL's algorithms and protocols, in its own order (``ncclAlgoStr``, ``ncclProtoStr``): the
#: choice scans them in this order and keeps the first of equal times.
ALGORITHMS = ("tree", "ring", "collnet_direct", "collnet_chain", "nvls", "nvls_tree", "pat")
COLLECTIVES = ("broadcast", "reduce", "allgather", "reduce_scatter", "allreduce")
#: The algorithms that run through NVLink SHARP, on the NVLS channels.
NVLS_ALGORITHMS = ("nvls", "nvls_tree")
DEFAULT_VERSION = (2, 30)
RCCL_DEFAULT_VERSION = (2, 28)
#: The oldest versions whose differences are modelled (docs/runtime-tuning.md, "Versions"): an
#: older one is priced by the rules of this one.
OLDEST_VERSION = {"nccl": (2, 18), "rccl": (2, 21)}
_RUNTIMES = ("nccl", "rccl")

# -- NCCL 2.30.7 constants (src/graph/tuning.cc ncclTunerConstantsDefaults) ---------------------
# baseLat and hwLat: NCCL_BASE_LATENCY_US and NCCL_HOP_LATENCY_US (collsynth.runtimes.constants).

# [compute-capability index: Volta, Ampere, Hopper, Blackwell][1 node, 2 nodes, >= 3 nodes]
_LL_MAX_BWS = ((39.0, 39.0, 20.4), (87.7, 22.5, 19.0), (141.0, 45.0, 35.0), (282.0, 90.0, 70.0))
_PER_CH_RING_LL128 = ((20, 20, 20), (20, 20, 20), (36.7, 36.7, 36.7), (40.0, 40.0, 40.0))
_PER_CH_TREE_LL128 = ((20, 20, 20), (20, 20, 20), (36.7, 36.7, 29.0), (55.6, 31.67, 20.0))
_PER_CH_TREE = ((26.5, 18.5, 10.0), (24.0, 23.6, 17.8), (38.7, 41.4, 36.0), (70.0, 42.8, 24.0))
_PER_CH_NVLS_TREE = ((26.5, 18.5, 10.0), (24.0, 23.6, 17.8), (0.0, 57.7, 45.5), (0.0, 96.0, 80.0))
_NVLS_EFFICIENCY = (0.0, 0.0, 0.85, 0.74)
_TREE_CORRECTION = {
    "LL": (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0,
           1.0, 1.0, 1.0, 1.0),
    "LL128": (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9,
              .9, .9, 1.0, 1.0, 1.0),
    "Simple": (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7,
               .8, .9, .9, .9),
}
_MAX_DEV_WORK_BATCH_COLLS = 8  # 1024 / sizeof(ncclDevWorkColl) = 1024 / 128
# RCCL's communicator channels on several nodes, per architecture: (from RCCL 2.30.4, before).
_RCCL_MULTI_NODE_CHANNELS = {"gfx942": (64, 64), "gfx950": (48, 64)}
_MAX_CHANNELS = 64             # MAXCHANNELS (NCCL); the search keeps at most half
_MIN_TRAFFIC_PER_CHANNEL = 32 * 1024
# Buffers (bytes per connection) and the data a step of each carries; grain of a chunk.
_NCCL_STEP_BYTES = STEP_BYTES
_NCCL_STEP_DATA = {p: int(STEP_BYTES[p] * PROTOCOL_EFFICIENCY[p]) for p in PROTOCOLS}
_RCCL_STEP_BYTES = {"LL": 32768, "LL128": 57344, "Simple": 524288}
_RCCL_STEP_DATA = {"LL": 16384, "LL128": 50176, "Simple": 524288}
_GRAIN = {"LL": 16, "LL128": 1920, "Simple": 512}
_RCCL_GRAIN = {"LL": 16, "LL128": 448, "Simple": 512}

# The speeds (GB/s per channel) NCCL's graph search tries, largest first (src/graph/search.cc).
_SPEEDS_INTRA = {0: (40, 30, 20, 18, 15, 12, 10, 9, 7, 6, 5, 4, 3),
                 90: (60, 50, 40, 30, 24, 20, 15, 12, 11, 6, 3),
                 100: (90, 80, 70, 60, 50, 45, 40, 30, 24, 20, 19, 18)}
_SPEEDS_INTER = {0: (48, 30, 28, 24, 20, 18, 15, 12, 10, 9, 7, 6, 5, 4, 3, 2.4, 1.2, 0.24, 0.12),
                 90: (48, 45, 42, 40, 30, 24, 22, 20, 17.5, 15, 12, 6, 3, 2.4, 1.2, 0.24, 0.12),
                 100: (96, 86, 80, 48, 45.1, 42, 40, 30, 24, 22, 20, 17.5, 15, 12, 6, 3, 2.4,
                       1.2, 0.24, 0.12)}
#: GB/s NCCL counts per NVLink (src/graph/topo.h), by compute capability; PCI_BW for PCIe Gen3.
_NVLINK_GBPS = {60: 18.0, 70: 20.0, 80: 20.0, 86: 12.0, 90: 20.6, 100: 40.1}
_PCI_GBPS = 12.0

# -- RCCL (ROCm/rocm-systems projects/rccl src/graph/tuning.cc, 2.28-2.31) ----------------------

# baseLat per protocol (tree, ring, CollNet; NVLS and PAT 0): RCCL_BASE_LATENCY_US; hwLat per
# tuning model: RCCL_HOP_LATENCY_US (collsynth.runtimes.constants).
# model -> bwRatio {<=2 nodes, >2 nodes}: {tree, ring}
_RCCL_MODELS = {
    0: {**RCCL_HOP_LATENCY_US[0],
        "ratio": ({"tree": (.04, .22, .91), "ring": (.04, .34, 1.00)},
                  {"tree": (.04, .22, .95), "ring": (.04, .34, 1.00)})},
    5: {**RCCL_HOP_LATENCY_US[5],
        "ratio": ({"tree": (.06, .06, .11), "ring": (.08, .08, 1.00)},
                  {"tree": (.06, .06, .59), "ring": (.08, .08, 1.00)})},
}
_RCCL_MODEL_OF_ARCH = {"gfx90a": 0, "gfx908": 0, "gfx906": 0, "gfx942": 5, "gfx950": 6}
# llProtoRanges: model -> collective -> ((LL min, max], (LL128 min, max]), bytes per rank.
_RCCL_PROTO_RANGES = {
    5: {"reduce_scatter": ((0, 655360), (131072, 3211264)),
        "allgather": ((0, 98304), (98304, 5046272)),
        "allreduce": ((0, 524288), (524288, 4415057)),
        "reduce": ((0, 4096), (4096, 16777216)), "broadcast": ((0, 8192), (8192, 33554432))},
    6: {"reduce_scatter": ((0, 65536), (65536, 8388608)),
        "allgather": ((0, 65536), (65536, 8388608)),
        "allreduce": ((0, 262144), (262144, 70640910)),
        "reduce": ((0, 16383), (16383, 16777216)), "broadcast": ((0, 2048), (2048, 16777216))},
}
# Multi-node RS/AG thread thresholds of models 5 and 6 (per rank; 0 = RCCL_LL_LIMITS_UNDEFINED,
# the default threshold stays): LL 16, LL128 64. llProtoRanges holds LL and LL128 only, so for
# Simple rcclUpdateThreadThreshold reads the next collective's LL entry: reduce-scatter ->
# allgather's 16, allgather -> allreduce's 0 (see the docs).
_RCCL_THREAD_THRESHOLD = {"reduce_scatter": {"LL": 16, "LL128": 64, "Simple": 16},
                          "allgather": {"LL": 16, "LL128": 64, "Simple": 0}}
# Model 6 (gfx950) multi-node channel thresholds: ((min, max], channels) on bytes per rank.
_K = 1024
_RCCL_CHANNELS_950 = {
    "reduce_scatter": ((512, _K, 2), (_K, 2 * _K, 4), (2 * _K, 4 * _K, 8), (4 * _K, 64 * _K, 16),
                       (64 * _K, 256 * _K, 32), (256 * _K, 512 * _K, 40),
                       (512 * _K, _K * _K, 48), (_K * _K, 2 * _K * _K, 56),
                       (2 * _K * _K, 256 * _K * _K, 64)),
    "allgather": ((2 * _K, 4 * _K, 2), (4 * _K, 8 * _K, 4), (8 * _K, 16 * _K, 8),
                  (16 * _K, 256 * _K, 16), (256 * _K, 512 * _K, 32), (512 * _K, _K * _K, 40),
                  (_K * _K, 4 * _K * _K, 56), (4 * _K * _K, 256 * _K * _K, 64)),
}
_RCCL_THREADS = 256


@dataclass(frozen=True)
class GraphFigures:
    """One topology graph as the cost model reads it (``graphs[a]`` in ``ncclTopoTuneModel``).

    ``channels`` is the graph's ``nChannels`` after ``ncclTopoDupChannels``; ``bw_intra_gbps``
    and ``bw_inter_gbps`` its per-channel GB/s inside a node and over the network; ``nvlink``
    whether its intra-node type is NVLink (the NVLINK hop row; otherwise PCI); ``latency_inter_us``
    the network device's latency property (0 for NCCL's built-in IB and sockets);
    ``same_channels`` whether every channel is the same ring (broadcast/reduce latency).
    """

    channels: int
    bw_intra_gbps: float
    bw_inter_gbps: float
    nvlink: bool = True
    latency_inter_us: float = 0.0
    same_channels: bool = True


@dataclass(frozen=True)
class TuningSetup:
    """What the runtime knows at init: the inputs of its cost model and channel choice.

    Parameters
    ----------
    runtime, version:
        ``"nccl"`` or ``"rccl"``, and ``(major, minor)`` (see docs/runtime-tuning.md for what each
        version changes).
    ranks, nodes:
        ``ranks`` divisible by ``nodes``.
    compute_capability, arch:
        NCCL's ``minCompCap`` (70, 80, 90, 100) or ``None`` (AMD); the architecture name.
    cpu_vendor:
        ``"intel"``, ``"amd"``, ``"arm"``, ``"power"`` or ``None`` (treated as Intel).
    ring, tree:
        The ring and tree graphs; ``nvls`` and ``collnet`` the NVLS and CollNet graphs, ``None``
        when the machine or the configuration has none.
    comm_channels:
        ``comm->nChannels`` after ``ncclTopoPostset``: where the per-call choice starts.
    nvls_channels:
        ``comm->nvlsChannels`` (16 on Hopper, 24/32 on Blackwell).
    pat, ll128:
        Whether PAT and LL128 are enabled (auto rules, see :func:`setup_from_facts`).
    balanced_tree:
        ``False`` when the tree graph's pattern is NCCL_TOPO_PATTERN_TREE (bandwidth x 0.85).
    net_overhead_us:
        ``getNetOverhead``: 1 us (Intel, Arm, POWER), 2 us (AMD), or ``NCCL_NET_OVERHEAD``.
    settings:
        The job's NCCL_ALGO / NCCL_PROTO / NCCL_NVLS_ENABLE (:func:`enabled` applies them).
    """

    runtime: str
    version: tuple[int, int]
    ranks: int
    nodes: int
    compute_capability: int | None
    arch: str | None
    cpu_vendor: str | None
    ring: GraphFigures
    tree: GraphFigures
    comm_channels: int
    nvls: GraphFigures | None = None
    collnet: GraphFigures | None = None
    nvls_channels: int = 0
    pat: bool = False
    ll128: bool = True
    balanced_tree: bool = True
    net_overhead_us: float = 1.0
    settings: RuntimeSettings = RuntimeSettings()

    def __post_init__(self) -> None:
        if self.runtime not in _RUNTIMES:
            raise UnknownNameError(f"runtime {self.runtime!r}; expected nccl or rccl")
        for name in ("ranks", "nodes", "comm_channels"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidInstanceError(f"TuningSetup: {name} = {value!r}; expected a whole "
                                           "number >= 1")
        if self.ranks % self.nodes:
            raise InvalidInstanceError(f"TuningSetup: {self.ranks} ranks on {self.nodes} nodes: "
                                       "expected the same number of ranks on every node")
        for graph in (self.ring, self.tree, self.nvls, self.collnet):
            if graph is not None and (graph.channels < 1 or graph.bw_intra_gbps < 0
                                      or graph.bw_inter_gbps < 0):
                raise InvalidInstanceError(f"TuningSetup: {graph}: expected channels >= 1 and "
                                           "bandwidths >= 0")

    @property
    def ranks_per_node(self) -> int:
        return self.ranks // self.nodes


@dataclass(frozen=True)
class Estimate:
    """The runtime's own estimate for one (algorithm, protocol): ``time_us = latency_us x calls +
    size / (1000 x algbw_gbps)`` (``algbw_gbps`` after the tree correction factor)."""

    algorithm: str
    protocol: str
    latency_us: float
    algbw_gbps: float
    time_us: float


@dataclass(frozen=True)
class CallShape:
    """How one call runs: ``max_channels`` (``nMaxChannels``), ``channels`` it actually uses (the
    cell scheduler), ``threads`` per channel, the chunk and slice in bytes of data, and the
    network proxy's steps per channel."""

    max_channels: int
    channels: int
    threads: int
    chunk_bytes: int
    slice_bytes: int
    steps: int


@dataclass(frozen=True)
class RuntimeChoice:
    """The runtime's choice for one call: ``algorithm``/``protocol`` with its own estimated
    ``time_us``; ``estimates`` every enabled pair; ``rule`` names an RCCL override that replaced
    the cost model's pick (``None`` when the cost model decided)."""

    collective: str
    size_bytes: int
    algorithm: str
    protocol: str
    time_us: float
    shape: CallShape
    estimates: tuple[Estimate, ...] = field(repr=False)
    rule: str | None = None


# -- helpers -----------------------------------------------------------------------------------


def _log2i(value: int) -> int:
    """floor(log2(value)) for value >= 1; -1 for 0."""
    return value.bit_length() - 1 if value > 0 else -1


def _collective(name: str) -> str:
    key = canonical_name(name)
    if key not in COLLECTIVES:
        raise UnknownNameError(f"collective {name!r}: the runtime's tuning covers "
                               f"{', '.join(COLLECTIVES)}")
    return key


def _check_pair(algorithm: str, protocol: str) -> None:
    if algorithm not in ALGORITHMS:
        raise UnknownNameError(f"algorithm {algorithm!r}; expected one of {', '.join(ALGORITHMS)}")
    if protocol not in PROTOCOLS:
        raise UnknownNameError(f"protocol {protocol!r}; expected one of {', '.join(PROTOCOLS)}")


def _cc_index(cc: int | None) -> int:
    cc = cc or 0
    return 3 if cc >= 100 else 2 if cc >= 90 else 1 if cc >= 80 else 0


def _nodes_index(nodes: int) -> int:
    return nodes - 1 if nodes <= 2 else 2


def _cap(table: tuple, setup: TuningSetup) -> float:
    """A per-architecture cap of NCCL's tables, with the Blackwell rows of older versions."""
    index, column = _cc_index(setup.compute_capability), _nodes_index(setup.nodes)
    if index == 3 and setup.version < (2, 28):
        return 2 * table[2][column]  # 2.25-2.27: twice the Hopper rows
    value = table[index][column]
    if index == 3 and table is _PER_CH_RING_LL128 and setup.version < (2, 29):
        return 73.4
    if index == 3 and table is _PER_CH_NVLS_TREE and column == 2 and setup.version < (2, 30):
        return 43.1 if setup.version < (2, 29) else 43.8
    return value


def _ll_max_bw(setup: TuningSetup) -> float:
    if setup.nodes == 1:
        row = _cc_index(setup.compute_capability)
        return _cap(_LL_MAX_BWS, setup) if row == 3 else _LL_MAX_BWS[row][0]
    row = 1 if setup.cpu_vendor == "amd" else 0  # "Intel" row for Intel, Arm, POWER
    return _LL_MAX_BWS[row][_nodes_index(setup.nodes)]


def ring_steps(collective: str, ranks: int) -> int:
    """Steps of the runtime's ring (``nsteps`` in ``ncclTopoTuneModel``): ``2(n-1)`` for allreduce,
    ``n-1`` for allgather and reduce-scatter, ``n`` for broadcast and reduce (NCCL counts one
    step per rank of the pipelined chain). The latency of a ring pays a hop per step.

    >>> ring_steps("allreduce", 8), ring_steps("allgather", 8), ring_steps("broadcast", 8)
    (14, 7, 8)

    Raises
    ------
    UnknownNameError
        A collective NCCL runs without its ring (alltoall, gather, scatter: send/recv).
    """
    key = _collective(collective)
    return {"allreduce": 2 * (ranks - 1), "allgather": ranks - 1,
            "reduce_scatter": ranks - 1}.get(key, ranks)


def _graph(setup: TuningSetup, algorithm: str) -> GraphFigures | None:
    return {"tree": setup.tree, "ring": setup.ring, "collnet_direct": setup.collnet,
            "collnet_chain": setup.collnet, "nvls": setup.nvls, "nvls_tree": setup.nvls,
            "pat": setup.tree}[algorithm]


# -- which (algorithm, protocol) exists --------------------------------------------------------

_EXISTS = {
    "broadcast": {"ring": PROTOCOLS}, "reduce": {"ring": PROTOCOLS},
    "allgather": {"ring": PROTOCOLS, "collnet_direct": ("Simple",), "nvls": ("Simple",),
                  "pat": ("Simple",)},
    "reduce_scatter": {"ring": PROTOCOLS, "collnet_direct": ("Simple",), "nvls": ("Simple",),
                       "pat": ("Simple",)},
    "allreduce": {"tree": PROTOCOLS, "ring": PROTOCOLS, "collnet_direct": ("Simple",),
                  "collnet_chain": ("Simple",), "nvls": ("Simple",), "nvls_tree": ("Simple",)},
}


def enabled(setup: TuningSetup, collective: str, algorithm: str, protocol: str) -> bool:
    """Whether the runtime offers ``(algorithm, protocol)`` for ``collective`` on ``setup``
    (``ncclTopoTuneModel``'s table and enable rules, ``updateCollCostTable``'s per-call rules for a
    float sum; RCCL's own rules). A pair can be enabled and still have no bandwidth (e.g. NVLS on
    a graph of one channel): :func:`bandwidth_gbps` is 0 then.

    >>> s = setup_from_facts(_h100_facts(), gpu_gbps=370.8, path_gbps=370.8)
    >>> enabled(s, "allreduce", "nvls", "Simple"), enabled(s, "allreduce", "nvls_tree", "Simple")
    (True, False)
    """
    collective = _collective(collective)
    _check_pair(algorithm, protocol)
    if setup.settings.default:
        return _machine_enabled(setup, collective, algorithm, protocol)
    if _user_enabled(setup, collective, algorithm, protocol):
        return _machine_enabled(setup, collective, algorithm, protocol)
    # 2.19-2.23: a collective left with nothing gets the ring's own bandwidths back, every
    # protocol (ringbdw, saved before NCCL_PROTO and the LL128 rule were applied)
    return algorithm == "ring" and setup.settings.ring_fallback(setup.version) \
        and protocol in _EXISTS[collective].get("ring", ()) and _nothing_left(setup, collective)


def _user_enabled(setup: TuningSetup, collective: str, algorithm: str, protocol: str) -> bool:
    """Whether the job's settings leave the pair enabled, as the setup's version applies them
    (:meth:`~collsynth.runtimes.settings.RuntimeSettings.enabled_algorithms`)."""
    settings = setup.settings
    return settings.allows(algorithm, protocol, algorithms=settings.enabled_algorithms(
        setup.version, collective, nodes=setup.nodes, collnet=setup.collnet is not None))


def _nothing_left(setup: TuningSetup, collective: str) -> bool:
    """Whether the job's settings leave ``collective`` no pair the machine offers (a sketch of
    NCCL's test that does not look at each pair's bandwidth)."""
    return not any(_user_enabled(setup, collective, a, p)
                   and _machine_enabled(setup, collective, a, p)
                   for a in ALGORITHMS for p in PROTOCOLS)


def _machine_enabled(setup: TuningSetup, collective: str, algorithm: str, protocol: str
                     ) -> bool:
    """:func:`enabled` before the job's settings: the runtime's own rules on the machine."""
    if protocol not in _EXISTS[collective].get(algorithm, ()):
        return False
    if protocol == "LL128" and not setup.ll128 and not setup.settings.ll128_listed:
        return False  # NCCL_PROTO naming LL128 forces it on (protoEnable 1, not the auto 2)
    ppn = setup.ranks_per_node
    if algorithm in NVLS_ALGORITHMS:
        if setup.nvls is None or setup.runtime == "rccl":
            return False
        if algorithm == "nvls_tree" and setup.nodes == 1:
            return False
        if algorithm == "nvls" and setup.nodes > 1 and setup.collnet is None:
            return False  # multi-node NVLS needs CollNet (SHARP) support
        if collective != "allreduce" and (ppn > 32 or setup.version < (2, 19)):
            return False  # NCCL_MAX_NVLS_ARITY; NVLS allgather / reduce-scatter from 2.19
        return True
    if algorithm in ("collnet_direct", "collnet_chain"):
        return setup.collnet is not None and ppn <= 8 and setup.runtime == "nccl"
    if algorithm == "pat":
        return setup.pat and setup.version >= (2, 23)
    if algorithm == "tree" and protocol == "Simple" and setup.runtime == "rccl" \
            and setup.nodes == 1 and setup.arch in ("gfx942", "gfx950"):
        return False
    return True


#: What :func:`tuning_setup` and :func:`choose` raise when a machine's facts cannot set the
#: runtime's tuning up (no NICs on several nodes, a malformed ``metadata.machine``, a runtime
#: the facts cannot tell): callers that can do without the tuning catch these.
SETUP_FAILURES = (InvalidInstanceError, InvalidTopologyError, UnknownNameError)


def offered_protocols(setup: TuningSetup, collective: str, algorithm: str) -> tuple[str, ...]:
    """The protocols the runtime would run ``algorithm`` with for ``collective`` on ``setup``:
    those :func:`enabled` with a bandwidth above 0 (NVLS on a graph of one channel has none),
    in NCCL's order; ``()`` when it would not run it at all. The one home of the rules that
    decide which of its own algorithms a runtime considers (collsynth.timing.pricing).

    >>> s = setup_from_facts(_h100_facts(), gpu_gbps=370.8, path_gbps=370.8)
    >>> offered_protocols(s, "allreduce", "nvls"), offered_protocols(s, "allgather", "pat")
    (('Simple',), ())
    """
    collective = _collective(collective)
    return tuple(p for p in PROTOCOLS
                 if enabled(setup, collective, algorithm, p)
                 and bandwidth_gbps(setup, collective, algorithm, p) > 0)


def nvls_efficiency(compute_capability: int | None) -> float:
    """NCCL's ``nvlsEfficiency`` (2.28 and later): the share of a GPU's NVLink bandwidth NVLS
    moves through the switch, 0.85 on Hopper, 0.74 on Blackwell, 0 before Hopper.

    >>> nvls_efficiency(90), nvls_efficiency(100), nvls_efficiency(80)
    (0.85, 0.74, 0.0)
    """
    return _NVLS_EFFICIENCY[_cc_index(compute_capability)]


# -- the cost model: bandwidth and latency ---------------------------------------------------


def _rccl_model(setup: TuningSetup) -> dict:
    model = _RCCL_MODEL_OF_ARCH.get(setup.arch or "", 0)
    return _RCCL_MODELS[5 if model == 6 else model]


def bandwidth_gbps(setup: TuningSetup, collective: str, algorithm: str, protocol: str) -> float:
    """The algorithm bandwidth (GB/s) the cost model assigns (``comm->bandwidths``), 0 when the
    pair is not available. ``size / (1000 x this)`` is the bandwidth term of the time in us.

    >>> s = setup_from_facts(_h100_facts(), gpu_gbps=370.8, path_gbps=370.8)
    >>> round(bandwidth_gbps(s, "allreduce", "ring", "Simple"), 3)  # 12 ch x 30 x 8/14
    205.714
    """
    collective = _collective(collective)
    if not enabled(setup, collective, algorithm, protocol):
        return 0.0
    graph = _graph(setup, algorithm)
    if graph is None:
        return 0.0
    p = PROTOCOLS.index(protocol)
    nodes, ranks, ppn = setup.nodes, setup.ranks, setup.ranks_per_node
    collnet = algorithm in ("collnet_direct", "collnet_chain")
    bw = graph.bw_intra_gbps if (nodes <= 2 or collnet) else graph.bw_inter_gbps
    if setup.runtime == "rccl":
        ratio = _rccl_model(setup)["ratio"][0 if nodes <= 2 else 1]
        row = ratio.get(algorithm)
        if row is None:
            return 0.0  # RCCL's PAT (off by default) and CollNet are not modelled
        bus = graph.channels * bw * row[p]
    else:
        if algorithm in NVLS_ALGORITHMS:
            if graph.channels < 2 and setup.version >= (2, 28):
                return 0.0  # 2.28's x (nChannels - 1) / nChannels: nothing on one channel
            bw = _nvls_bw(setup, collective, algorithm, graph)
        bus = graph.channels * bw
        bus = _nccl_protocol_caps(setup, collective, algorithm, protocol, graph, bus)
        if bus == 0.0:
            return 0.0
    if not (algorithm != "ring" and collective in ("allgather", "reduce_scatter")):
        bus *= _bus_to_algorithm(setup, collective, algorithm)
    return bus


def _bus_to_algorithm(setup: TuningSetup, collective: str, algorithm: str) -> float:
    """The cost model's bus-to-algorithm bandwidth ratio: a ring's ranks / steps; NVLS and
    NVLS-tree the same from NCCL 2.28 (RCCL: always), 5/6 before, and NVLS-tree
    0.7 x nodes / (2 (nodes - 1)) before 2.19; 0.5 for the others."""
    if algorithm == "ring" or (algorithm in NVLS_ALGORITHMS and
                               (setup.runtime == "rccl" or setup.version >= (2, 28))):
        return setup.ranks / ring_steps(collective, setup.ranks)
    if algorithm == "nvls_tree" and setup.version < (2, 19):
        return 0.7 * setup.nodes / (2 * (setup.nodes - 1))
    if algorithm in NVLS_ALGORITHMS:
        return 5 / 6
    return 0.5


def _nvls_bw(setup: TuningSetup, collective: str, algorithm: str, graph: GraphFigures) -> float:
    ppn, nodes = setup.ranks_per_node, setup.nodes
    intra, inter = graph.bw_intra_gbps, graph.bw_inter_gbps
    if setup.version >= (2, 28):
        efficiency = _NVLS_EFFICIENCY[_cc_index(setup.compute_capability)]
        intra_bw = intra * efficiency * (graph.channels - 1) / graph.channels
        intra_bw *= 2 if collective == "allreduce" else (ppn - 1) / ppn
        inter_bw = inter * (2 if (nodes <= 2 and algorithm == "nvls_tree") else 1)
        cap = _cap(_PER_CH_NVLS_TREE, setup) if algorithm == "nvls_tree" else math.inf
        return min(intra_bw, inter_bw, cap)
    if setup.version >= (2, 19):
        # v2.19.4-v2.27.7 tuning.cc: NVLS-tree min(bwIntra, bwInter, halved beyond 2 nodes);
        # NVLS allgather / reduce-scatter min(bwIntra x (ppn-1)/ppn, 0.9 x bwInter) from 2.27
        if algorithm == "nvls_tree":
            return min(intra, inter if nodes <= 2 else inter / 2)
        if collective != "allreduce" and setup.version >= (2, 27):
            return min(intra * (ppn - 1) / ppn, inter * 0.9)
        return min(intra, inter)
    return intra if nodes <= 2 else inter  # 2.18: the figure every algorithm takes


def _nccl_protocol_caps(setup: TuningSetup, collective: str, algorithm: str, protocol: str,
                        graph: GraphFigures, bus: float) -> float:
    channels, ppn, nodes = graph.channels, setup.ranks_per_node, setup.nodes
    if algorithm == "ring" and protocol == "LL":
        bus = min(_ll_max_bw(setup), 0.5 * bus)
    if algorithm == "ring" and protocol == "LL128":
        factor = (0.7 if ppn < 2 else 0.92) if setup.version < (2, 23) else 0.92
        bus = min(factor * bus, channels * _cap(_PER_CH_RING_LL128, setup))
    if algorithm == "tree" and collective == "allreduce":
        bus = min(0.92 * bus, channels * _cap(_PER_CH_TREE, setup))
    if algorithm == "tree" and protocol == "LL":
        bus = min(bus / 3.8, _ll_max_bw(setup))
    if algorithm == "tree" and protocol == "LL128":
        bus = min(bus * (7 / 9 if nodes == 1 else 120 / 128),
                  channels * _cap(_PER_CH_TREE_LL128, setup))
    if algorithm == "tree" and not setup.balanced_tree:
        bus *= 0.85
    if algorithm == "pat":
        bus *= 0.85 if setup.version < (2, 25) else 0.75
    if algorithm in ("collnet_direct", "collnet_chain") and protocol != "Simple":
        return 0.0
    if algorithm == "collnet_direct":
        if collective in ("allgather", "reduce_scatter"):
            bus = ppn * min(graph.bw_intra_gbps, 0.9 * graph.bw_inter_gbps)
        else:
            factor = ppn / channels
            factor -= (factor - 1) / 2
            bus /= factor
            if (setup.compute_capability or 0) >= 90:
                bus *= 0.85
    if algorithm in ("nvls", "collnet_direct") and collective in ("allgather", "reduce_scatter") \
            and nodes > 1:
        return 0.0  # needs the CollNet plugin's iallgather / ireducescatter: not modelled
    return bus


def _hw_lat(setup: TuningSetup, hw: str, algorithm: str, protocol: str) -> float:
    p = PROTOCOLS.index(protocol)
    if setup.runtime == "rccl":
        table = _rccl_model(setup)[hw]
        return table.get(algorithm, (0, 0, 0))[p]
    if algorithm == "tree" and protocol == "Simple" and setup.version < (2, 23):
        return 28.0
    if algorithm == "pat" and setup.version < (2, 28):
        return 0.0
    if hw == "net" and algorithm == "nvls_tree" and protocol == "Simple" \
            and setup.version < (2, 29):
        return 14.0
    return float(NCCL_HOP_LATENCY_US[hw][algorithm][p])


def _base_lat(setup: TuningSetup, algorithm: str, protocol: str) -> float:
    p = PROTOCOLS.index(protocol)
    if setup.runtime == "rccl":
        return RCCL_BASE_LATENCY_US[p] if algorithm in ("tree", "ring", "collnet_direct",
                                                  "collnet_chain") else 0.0
    if algorithm == "tree" and protocol == "Simple" and setup.version < (2, 23):
        return 0.0
    if algorithm == "pat" and setup.version < (2, 28):
        return 0.0
    return float(NCCL_BASE_LATENCY_US[algorithm][p])


#: NCCL 2.18's network hop latency (us) of its NVLS algorithms (``hwLat[NCCL_HW_NET]``); its
#: ``baseLat`` was 23 us for both and its NVLink row 0 (2.19 moved the 23 to the NVLink row).
_NVLS_NET_LAT_2_18 = {"nvls": 18.0, "nvls_tree": 19.0}


def latency_us(setup: TuningSetup, collective: str, algorithm: str, protocol: str) -> float:
    """The latency (us) the cost model assigns (``comm->latencies``); NaN when the pair has no
    graph. Ring allreduce on one 8-GPU NVLink node: LL 6.6 + 14 x 0.6 = 15.0 us.

    >>> s = setup_from_facts(_h100_facts(), gpu_gbps=370.8, path_gbps=370.8)
    >>> [round(latency_us(s, "allreduce", "ring", p), 2) for p in PROTOCOLS]
    [15.0, 40.6, 56.0]
    """
    collective = _collective(collective)
    _check_pair(algorithm, protocol)
    graph = _graph(setup, algorithm)
    if graph is None:
        return math.nan
    nodes, ranks, ppn = setup.nodes, setup.ranks, setup.ranks_per_node
    lat = _base_lat(setup, algorithm, protocol)
    intra_hw = "nvlink" if graph.nvlink else "pci"
    hw = intra_hw if nodes == 1 else "net"
    intra = _hw_lat(setup, intra_hw, algorithm, protocol)
    inter = (_hw_lat(setup, "net", "tree", protocol) if ppn == 1
             else _hw_lat(setup, "net", algorithm, protocol)) + graph.latency_inter_us
    if protocol == "Simple":
        inter += graph.latency_inter_us
    nsteps = ring_steps(collective, ranks)
    if algorithm == "ring":
        if collective in ("broadcast", "reduce"):
            if graph.same_channels:
                return lat + _hw_lat(setup, hw, "ring", protocol)
            hop = (_hw_lat(setup, hw, "tree", "Simple") if protocol == "Simple"
                   else _hw_lat(setup, hw, "ring", protocol))
            return lat + nsteps * hop
        overhead = 0.0 if nodes == 1 else \
            setup.net_overhead_us * (3 if protocol == "Simple" else 1)
        intra = max(intra, overhead)
        inter_steps = 0 if nodes == 1 else \
            (2 * (nodes - 1) if collective == "allreduce" else nodes - 1)
        return lat + (nsteps - inter_steps) * intra + inter_steps * inter
    if algorithm == "tree":
        return lat + 2 * ((ppn - 1) * intra + _log2i(nodes) * inter)
    if algorithm == "collnet_direct":
        return lat + 2 * (min(1, ppn - 1) * intra + (ppn - 1) * 0.4) + inter
    if algorithm == "collnet_chain":
        return lat + 2 * (ppn - 1) * intra + inter
    if algorithm in NVLS_ALGORITHMS and setup.runtime == "nccl" and setup.version < (2, 19):
        # 2.18: a base of 23 us and the network's hops only (18 NVLS, 19 NVLS-tree per node)
        net = _NVLS_NET_LAT_2_18[algorithm]
        return 23.0 + (net if algorithm == "nvls" and nodes > 1 else 0.0) + \
            (2 * (nodes - 1) * net if algorithm == "nvls_tree" else 0.0)
    if algorithm == "nvls":
        if setup.runtime == "rccl":
            return lat + intra + (_hw_lat(setup, "net", "nvls", protocol) if nodes > 1 else 0)
        return intra + (inter if nodes > 1 else 0.0)
    if algorithm == "nvls_tree":
        return lat + intra + 2 * _log2i(nodes) * inter
    return lat + _log2i(nodes) * inter / 3.5 + ranks * 2.8  # pat


def bandwidth_correction(setup: TuningSetup, collective: str, algorithm: str, protocol: str,
                         size_bytes: int) -> float:
    """The factor NCCL's model scales an algorithm's bandwidth by at ``size_bytes``: its tree
    correction (``treeCorrectionFactor``, indexed by ``log2(size / 64)``: the tree's measured
    efficiency, lowest at mid sizes) for allreduce by tree, and by NVLS-tree on Blackwell with
    an x86 host; 1 elsewhere, and for RCCL (its tables steer its choice rather than describe
    an efficiency: docs/runtime-model.md, "The runtime's own choices").

    >>> s = setup_from_facts(_h100_facts(), gpu_gbps=370.8, path_gbps=370.8)
    >>> bandwidth_correction(s, "allreduce", "tree", "Simple", 1 << 20)  # log2(16384) = 14
    0.5
    """
    collective = _collective(collective)
    if setup.runtime != "nccl" or collective != "allreduce":
        return 1.0
    log_size = _log2i(int(size_bytes) >> 6)
    if algorithm == "tree" and 0 <= log_size < 23:
        return _TREE_CORRECTION[protocol][log_size]
    if algorithm == "nvls_tree" and 0 <= log_size < 24 \
            and (setup.compute_capability or 0) >= 100 \
            and setup.cpu_vendor in ("intel", "amd", None):
        return _TREE_CORRECTION[protocol][log_size]
    return 1.0


def algo_time_us(setup: TuningSetup, collective: str, algorithm: str, protocol: str,
                 size_bytes: int, *, num_pipe_ops: int = 1) -> Estimate | None:
    """``ncclTopoGetAlgoTime``: the runtime's estimate for one pair at ``size_bytes`` (the
    nccl-tests size), or ``None`` when the pair is not available.

    >>> s = setup_from_facts(_h100_facts(), gpu_gbps=370.8, path_gbps=370.8)
    >>> round(algo_time_us(s, "allreduce", "ring", "LL", 8).time_us, 4)
    15.0001
    """
    collective = _collective(collective)
    bw = bandwidth_gbps(setup, collective, algorithm, protocol)
    if bw <= 0:
        return None
    lat = latency_us(setup, collective, algorithm, protocol)
    bw *= bandwidth_correction(setup, collective, algorithm, protocol, size_bytes)
    if algorithm == "ring" and protocol == "Simple" and setup.nodes > 1 \
            and collective == "allreduce" \
            and size_bytes / (setup.comm_channels * setup.ranks) >= 64:
        lat *= 1.9 if (setup.compute_capability or 80) < 80 else 1.4
    calls = num_pipe_ops if algorithm == "ring" else \
        math.ceil(num_pipe_ops / _MAX_DEV_WORK_BATCH_COLLS)
    return Estimate(algorithm, protocol, lat, bw, lat * calls + size_bytes / (1000 * bw))


def estimates(setup: TuningSetup, collective: str, size_bytes: int, *,
              num_pipe_ops: int = 1) -> tuple[Estimate, ...]:
    """Every available pair's estimate, in NCCL's scan order (algorithm, then protocol)."""
    found = []
    for algorithm in ALGORITHMS:
        for protocol in PROTOCOLS:
            estimate = algo_time_us(setup, collective, algorithm, protocol, size_bytes,
                                    num_pipe_ops=num_pipe_ops)
            if estimate is not None:
                found.append(estimate)
    return tuple(found)


# -- the choice ----------------------------------------------------------------------------------


def fastest(found: "tuple[Estimate, ...] | list[Estimate]") -> Estimate:
    """The estimate of least time; of equal times the first (NCCL scans algorithms, then
    protocols, in their own order and keeps a new one only when it is strictly faster)."""
    best = found[0]
    for estimate in found[1:]:
        if estimate.time_us < best.time_us:
            best = estimate
    return best


def _size_per_rank(collective: str, size_bytes: int, ranks: int) -> int:
    return size_bytes if collective == "allreduce" else size_bytes // ranks


def _rccl_rule(setup: TuningSetup, collective: str, size_bytes: int, algorithm: str,
               protocol: str) -> tuple[str, str, str | None]:
    """RCCL's size-based overrides of the cost model's pick (2.28 and later)."""
    if setup.version < (2, 28) or algorithm == "pat":
        return algorithm, protocol, None
    per_rank = _size_per_rank(collective, size_bytes, setup.ranks)
    arch = setup.arch
    if setup.nodes == 1:
        if arch == "gfx950" and collective == "allreduce" and 64 <= per_rank <= 262144:
            return "tree", "LL", "gfx950 one-node allreduce of 64 B - 256 KiB: tree/LL"
        limits = {("gfx950", "allgather"): 88448, ("gfx950", "reduce_scatter"): 1048576,
                  ("gfx942", "reduce_scatter"): 352128}
        limit = limits.get((arch or "", collective))
        if limit is not None and per_rank <= limit:
            return (algorithm, "LL",
                    f"{arch} one-node {collective} of at most {limit} B per rank: LL")
        return algorithm, protocol, None
    model = _RCCL_MODEL_OF_ARCH.get(arch or "")
    ranges = _RCCL_PROTO_RANGES.get(model or -1, {}).get(collective)
    if ranges is None:
        return algorithm, protocol, None
    (ll_min, ll_max), (ll128_min, ll128_max) = ranges
    if collective == "allreduce" and setup.nodes > 2:
        ll128_max = int(ll128_max * 3.8)
    chosen = "Simple"
    if ll_min < per_rank <= ll_max:
        chosen = "LL"
    if setup.ll128 and ll128_min < per_rank <= ll128_max:
        chosen = "LL128"
    if not enabled(setup, collective, algorithm, chosen):
        return algorithm, protocol, None
    return algorithm, chosen, f"RCCL llProtoRanges (model {model}): {chosen}"


def choose(setup: TuningSetup, collective: str, size_bytes: int, *,
           num_pipe_ops: int = 1) -> RuntimeChoice:
    """The runtime's choice for one call of ``size_bytes`` (the nccl-tests size): the fastest
    estimate (ties: the earlier algorithm, then protocol), then RCCL's size rules, and the call's
    channels, threads and chunks (:func:`call_shape`).

    >>> s = setup_from_facts(_h100_facts(), gpu_gbps=370.8, path_gbps=370.8)
    >>> c = choose(s, "allreduce", 1 << 30)
    >>> c.algorithm, c.protocol, c.shape.channels
    ('nvls', 'Simple', 16)

    Raises
    ------
    InvalidInstanceError
        When no pair is available (cannot happen for the five collectives NCCL tunes: ring is
        always there).
    """
    collective = _collective(collective)
    if isinstance(size_bytes, bool) or not isinstance(size_bytes, int) or size_bytes < 0:
        raise InvalidInstanceError(f"size_bytes = {size_bytes!r}: expected a whole number >= 0")
    found = estimates(setup, collective, size_bytes, num_pipe_ops=num_pipe_ops)
    if not found:
        under = "" if setup.settings.default else (
            f" under {setup.settings.describe()}: {setup.runtime} "
            f"{setup.version[0]}.{setup.version[1]} fails such a call (\"no algorithm/protocol "
            "available\"; docs/runtime-tuning.md, \"Settings\")")
        raise InvalidInstanceError(f"no algorithm available for {collective} on {setup.ranks} "
                                   f"ranks{under}")
    best = fastest(found)
    algorithm, protocol, rule = best.algorithm, best.protocol, None
    if setup.runtime == "rccl":
        algorithm, protocol, rule = _rccl_rule(setup, collective, size_bytes, algorithm, protocol)
    time_us = best.time_us
    if rule is not None:
        chosen = algo_time_us(setup, collective, algorithm, protocol, size_bytes,
                              num_pipe_ops=num_pipe_ops)
        time_us = chosen.time_us if chosen is not None else math.nan
    shape = call_shape(setup, collective, algorithm, protocol, size_bytes)
    return RuntimeChoice(collective, size_bytes, algorithm, protocol, time_us, shape, found, rule)


def algorithm_choice(setup: TuningSetup, collective: str, algorithm: str, size_bytes: int,
                     protocols: Sequence[str] | None = None) -> tuple[str, CallShape] | None:
    """The protocol and call shape the runtime runs ``algorithm`` with at ``size_bytes``: the
    fastest of its own estimates among the protocols it offers for that algorithm (and
    ``protocols``, when given), then RCCL's size rules where they keep the algorithm; ``None``
    when it would not run the algorithm at all. What the program model prices a runtime's own
    algorithm with (docs/runtime-model.md, "The runtime's own choices").

    >>> s = setup_from_facts(_h100_facts(), gpu_gbps=370.8, path_gbps=370.8)
    >>> [(p, c.channels) for p, c in (algorithm_choice(s, "allreduce", "ring", n)
    ...                               for n in (1 << 10, 1 << 20, 1 << 30))]
    [('LL', 1), ('LL', 24), ('Simple', 24)]
    """
    collective = _collective(collective)
    found = [e for e in (algo_time_us(setup, collective, algorithm, p, size_bytes)
                         for p in offered_protocols(setup, collective, algorithm)
                         if protocols is None or p in protocols) if e is not None]
    if not found:
        return None
    protocol = fastest(found).protocol
    if setup.runtime == "rccl":
        _, ruled, rule = _rccl_rule(setup, collective, size_bytes, algorithm, protocol)
        if rule is not None and (protocols is None or ruled in protocols):
            protocol = ruled
    return protocol, call_shape(setup, collective, algorithm, protocol, size_bytes)


def call_cap_gbps(setup: TuningSetup, algorithm: str, protocol: str) -> float:
    """The most data GB/s one rank sends in a call of ``(algorithm, protocol)`` whatever its
    channels, by the runtime's own tables: NCCL's ``llMaxBws`` for LL (its cap on a whole LL
    call's bus bandwidth, which on a ring is each rank's send rate); ``math.inf`` otherwise and
    for RCCL (which compiles the cap out).

    >>> s = setup_from_facts(_h100_facts(), gpu_gbps=370.8, path_gbps=370.8)
    >>> call_cap_gbps(s, "ring", "LL"), call_cap_gbps(s, "ring", "Simple")
    (141.0, inf)
    """
    if setup.runtime != "nccl" or protocol != "LL" or algorithm not in ("ring", "tree"):
        return math.inf
    return _ll_max_bw(setup)


def connection_gbps(setup: TuningSetup, algorithm: str, protocol: str, network: bool = False
                    ) -> float:
    """Data GB/s one channel's connection carries at most by the runtime's own tables: the
    graph's per-channel bandwidth spread over the communicator's channels (Simple), half of it
    for LL, ``min(0.92 x bw, perChMaxRingLL128Bw)`` for LL128 (``ncclTopoTuneModel``);
    ``network``: the graph's inter-node figure. The default ceiling of a connection in the
    program model.

    >>> s = setup_from_facts(_h100_facts(), gpu_gbps=370.8, path_gbps=370.8)
    >>> [round(connection_gbps(s, "ring", p), 2) for p in PROTOCOLS]
    [7.5, 13.8, 15.0]
    """
    graph = setup.tree if algorithm == "tree" else setup.ring
    per_graph = graph.bw_inter_gbps if network else graph.bw_intra_gbps
    spread = graph.channels / max(1, setup.comm_channels)
    bw = per_graph * spread
    if protocol == "LL":
        return 0.5 * bw
    if protocol == "LL128":
        if setup.runtime == "nccl":
            return min(0.92 * bw, _cap(_PER_CH_RING_LL128, setup) * spread)
        return 0.92 * bw
    return bw


# -- channels, threads and chunks of one call ----------------------------------------------------


def _max_threads(setup: TuningSetup, algorithm: str, protocol: str) -> int:
    if setup.runtime == "rccl":
        return _RCCL_THREADS
    if algorithm in ("collnet_direct", "collnet_chain", "nvls", "nvls_tree"):
        return 640
    if algorithm == "pat":
        return 0
    if protocol == "LL128":
        return 640
    if algorithm == "ring" and protocol == "Simple" \
            and setup.ring.bw_intra_gbps * setup.ring.channels <= _PCI_GBPS:
        return 256
    return 512


def _threshold(setup: TuningSetup, algorithm: str, protocol: str) -> int:
    if algorithm in ("collnet_direct", "collnet_chain"):
        return 512
    base = {"LL": 8, "LL128": 8, "Simple": 64}[protocol]
    if algorithm == "ring" and protocol == "LL":
        return base * setup.ranks
    return base


def max_channels(setup: TuningSetup, collective: str, algorithm: str, protocol: str,
                 size_bytes: int) -> tuple[int, int]:
    """``(nMaxChannels, threads)`` of ``topoGetAlgoInfo`` (NCCL 2.30; RCCL's one-step variant).

    NCCL drops a channel while ``size < channels x threads x threshold`` (threshold = bytes per
    thread: 64 for Simple, 8 x ranks for ring LL), then halves the threads the same way.

    >>> s = setup_from_facts(_h100_facts(), gpu_gbps=370.8, path_gbps=370.8)
    >>> max_channels(s, "allreduce", "ring", "Simple", 1 << 16)  # 64 KiB / (512 x 64 B) = 2
    (2, 544)
    """
    collective = _collective(collective)
    nbytes = size_bytes
    nc = setup.comm_channels
    nt = _max_threads(setup, algorithm, protocol)
    thr = _threshold(setup, algorithm, protocol)
    if setup.runtime == "rccl":
        return _rccl_channels(setup, collective, algorithm, protocol, nbytes, nc, nt, thr), nt
    if algorithm == "collnet_direct":
        heads = setup.ranks_per_node
        switch, flag = 16, True
        while switch >= 1 and flag:
            while True:
                flag = nbytes < nc * nt * heads * thr
                if not (flag and nc > switch):
                    break
                if nc == switch + switch // 2:
                    thr //= 2
                nc -= 1
            switch //= 2
    elif algorithm in NVLS_ALGORITHMS:
        nc = min(setup.nvls_channels, setup.comm_channels) \
            if (setup.nodes > 1 and algorithm == "nvls") else setup.nvls_channels
    else:
        while nbytes < nc * nt * thr and nc >= 2:
            nc -= 1
    if algorithm not in ("nvls", "nvls_tree", "collnet_direct"):
        while nbytes < nc * nt * thr and nt % 128 == 0:
            nt //= 2
    if protocol == "Simple":
        nt += {"ring": 32, "tree": 128}.get(algorithm, 0)
    if nt // 32 < 3:
        nt = 96
    if algorithm in ("tree", "pat"):
        nt = 640
    return max(1, nc), nt


def _rccl_channels(setup: TuningSetup, collective: str, algorithm: str, protocol: str,
                   nbytes: int, nc: int, nt: int, thr: int) -> int:
    model = _RCCL_MODEL_OF_ARCH.get(setup.arch or "")
    if algorithm == "pat":
        return 1 if nbytes <= 32768 else 2 if nbytes <= 65536 else 4 if nbytes <= 1 << 20 else nc
    if setup.nodes > 1 and collective in _RCCL_THREAD_THRESHOLD and model in (5, 6) \
            and _RCCL_THREAD_THRESHOLD[collective][protocol]:
        thr = _RCCL_THREAD_THRESHOLD[collective][protocol] * setup.ranks
    if nbytes < nc * nt * thr:
        nc = max(1, nbytes // (nt * thr))
    if setup.nodes > 1 and model == 6 and collective in _RCCL_CHANNELS_950:
        per_rank = -(-nbytes // setup.ranks)
        for low, high, channels in _RCCL_CHANNELS_950[collective]:
            if low < per_rank <= high:
                nc = channels
                break
    return nc


def cell_channels(collective: str, size_bytes: int, ranks: int, protocol: str,
                  max_channels: int, *, version: tuple[int, int] | None = None) -> int:
    """The channels NCCL's cell scheduler (2.22 and later) spreads one call over, at most
    ``max_channels``: ``scheduleCollTasksToPlan`` in ``src/enqueue.cc`` for a call alone in its
    launch. Traffic is 2 x size for allreduce and the whole buffer for allgather / reduce-scatter
    (x 4 with LL from 2.26); the call is cut into cells of at least the minimum traffic per
    channel, and a channel takes its share of the traffic, whole cells, at least one:

    * 2.22: minimum 512 B of traffic a channel, cells of 16 B, the first channel's cells
      rounded down;
    * 2.23-2.28: minimum 16 KiB, cells of 16 KiB of traffic;
    * 2.29 and later (and ``version=None``): minimum 32 KiB, the share rounded up to 16 B.

    >>> [cell_channels("allreduce", 65536, 8, p, 24) for p in ("Simple", "LL")]
    [4, 16]
    >>> [cell_channels("allreduce", 65536, 8, "Simple", 16, version=v) for v in ((2, 22), (2, 28))]
    [16, 8]
    """
    collective = _collective(collective)
    version = version or DEFAULT_VERSION
    per_byte = {"allreduce": 2, "allgather": ranks, "reduce_scatter": ranks}.get(collective, 1)
    if protocol == "LL" and version >= (2, 26):
        per_byte *= 4
    user_bytes = size_bytes // ranks if collective in ("allgather", "reduce_scatter") \
        else size_bytes
    if user_bytes <= 0:
        return 1
    traffic = user_bytes * per_byte
    if version < (2, 23):
        per_channel = max(512, traffic // max_channels)
        cell = 16
    elif version < (2, 29):
        least = 16 * 1024
        per_channel = max(least, max(least, traffic) // max_channels)
        cell = _roundup(-(-least // per_byte), 16)
    else:
        per_channel = _roundup(max(_MIN_TRAFFIC_PER_CHANNEL, traffic) // max_channels, 16)
        cell = _roundup(-(-_MIN_TRAFFIC_PER_CHANNEL // per_byte), 16)
    cells = -(-user_bytes // cell)
    cell_traffic = cell * per_byte
    per_channel_cells = min(cells, -(-per_channel // cell_traffic))
    if max_channels == 1:
        return 1
    first = min(cells, per_channel // cell_traffic if version < (2, 23)
                else -(-per_channel // cell_traffic))
    middle, last = divmod(cells - first, per_channel_cells)
    used = (first != 0) + middle + (last != 0)
    return min(used, max_channels)


def _cbd_channels(size_bytes: int, collective: str, ranks: int, protocol: str, channels: int,
                  threads: int) -> int:
    """The channels NCCL 2.20-2.21's channel-by-data scheduler (``addCBDCollToPlan``) gives a
    call alone in its launch: ``channels`` shares of the user buffer, each rounded up to 16 B and
    then to the protocol's alignment (Simple 4096 B, LL 8 B x threads, LL128 480 B x warps)."""
    user_bytes = size_bytes // ranks if collective in ("allgather", "reduce_scatter") \
        else size_bytes
    if user_bytes <= 0:
        return 1
    align = {"Simple": 4096, "LL": 8 * threads, "LL128": 480 * (threads // 32)}[protocol]
    share = _roundup(_roundup(-(-user_bytes // channels), 16), align)
    return max(1, min(channels, -(-user_bytes // share)))


def _roundup(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def scheduled_channels(setup: TuningSetup, collective: str, algorithm: str, protocol: str,
                       size_bytes: int, channels: int, *, threads: int) -> int:
    """The channels a call alone in its launch runs on when it may take ``channels``
    (``nMaxChannels``, at most the communicator's) with ``threads`` per channel: NCCL before
    2.20 and its CollNet kinds (CollNet, NVLS across nodes) take them all; 2.20-2.21's
    channel-by-data scheduler rounds each channel's share up to the protocol's alignment;
    2.22 and later spread the call by :func:`cell_channels`. RCCL takes the cell scheduler of
    its ``enqueue.cc`` of 2026 (NCCL 2.23-2.28's 16 KiB rule, LL x 4) at every version.

    >>> s = setup_from_facts(_h100_facts(), gpu_gbps=370.8, path_gbps=370.8, version=(2, 21))
    >>> scheduled_channels(s, "allreduce", "nvls", "Simple", 32768, 16, threads=640)
    8
    """
    collective = _collective(collective)
    if setup.runtime == "rccl":
        # projects/rccl/src/enqueue.cc of ROCm/rocm-systems (2026): MinTrafficPerChannel =
        # 16 << 10, max(16 KiB, traffic / channels), LL x 4: NCCL 2.23-2.28's text. RCCL 2.21
        # runs the CBD scheduler with AMD's alignments (not modelled); 2.22-2.27 are unread.
        return cell_channels(collective, size_bytes, setup.ranks, protocol, channels,
                             version=(2, 28))
    if algorithm in ("collnet_direct", "collnet_chain") \
            or (algorithm == "nvls" and setup.nodes > 1) or setup.version < (2, 20):
        return channels
    if setup.version < (2, 22):
        return _cbd_channels(size_bytes, collective, setup.ranks, protocol, channels, threads)
    return cell_channels(collective, size_bytes, setup.ranks, protocol, channels,
                         version=setup.version)


def kind_channels(setup: TuningSetup, algorithm: str) -> int:
    """Most channels a call of ``algorithm`` can get: NVLS calls run on the NVLS channels, the
    others (CollNet and PAT included) on the communicator's."""
    return setup.nvls_channels if algorithm in NVLS_ALGORITHMS else setup.comm_channels


def call_shape(setup: TuningSetup, collective: str, algorithm: str, protocol: str,
               size_bytes: int) -> CallShape:
    """Channels, threads and chunking of one call running ``(algorithm, protocol)``."""
    collective = _collective(collective)
    _check_pair(algorithm, protocol)
    nmax, threads = max_channels(setup, collective, algorithm, protocol, size_bytes)
    kind_max = kind_channels(setup, algorithm)
    used = scheduled_channels(setup, collective, algorithm, protocol, size_bytes,
                              max(1, min(nmax, kind_max)), threads=threads)
    chunk, slice_, steps = _chunking(setup, collective, algorithm, protocol, size_bytes, used)
    return CallShape(nmax, used, threads, chunk, slice_, steps)


#: ``NCCL_MAX_NVLS_ARITY`` (NCCL 2.21-2.30; 8 before): NVLS's heads in one NVLink domain at most.
NVLS_MAX_HEADS = 32


def nvls_heads(ranks_per_node: int) -> int:
    """NCCL's NVLS heads on nodes (NVLink domains) of ``ranks_per_node`` GPUs: one per GPU, at
    most :data:`NVLS_MAX_HEADS` (the NVLS graph search's ``maxChannels``, ``src/graph/
    search.cc``; a GB200 NVL72 rack has 32 heads for its 72 GPUs).

    >>> nvls_heads(8), nvls_heads(72)
    (8, 32)
    """
    return min(ranks_per_node, NVLS_MAX_HEADS)


#: Data bytes NCCL's NVLS kernels move per step of a channel's pipeline (``NCCL_NVLS_CHUNKSIZE``,
#: default 128 KiB, src/transport/nvls.cc; NVLS-tree uses at most the same): the grain at which
#: the switch's reduce, the store and the copies overlap, much finer than the Simple slice of the
#: proxy-driven algorithms (1 MiB).
NVLS_CHUNK_BYTES = 128 * 1024


def nvls_chunk_bytes(size: float, channels: int, heads: int, *,
                     largest: int = NVLS_CHUNK_BYTES) -> int:
    """Data bytes NCCL's NVLS kernels move per step for a call of ``size`` bytes over
    ``channels`` channels of ``heads`` heads: ``largest`` (:data:`NVLS_CHUNK_BYTES`), then
    64, 32 or 16 KiB while the call has fewer than 64, 8 or 2 chunks per channel and head
    (``calcCollChunking``, ``src/enqueue.cc``, NCCL 2.30).

    >>> [nvls_chunk_bytes(s << 20, 16, 8) for s in (1024, 768, 32, 4)]
    [131072, 65536, 32768, 16384]
    """
    chunk, ops = largest, channels * heads
    for times, smaller in ((64, 65536), (8, 32768), (2, 16384)):
        if size < times * ops * chunk and chunk > smaller:
            chunk = smaller
    return chunk


def nvls_tree_chunk_bytes(size: float, channels: int, heads: int, nodes: int, *,
                          largest: int = NVLS_CHUNK_BYTES) -> int:
    """Data bytes NCCL's NVLS-tree kernels move per step for a call of ``size`` bytes over
    ``channels`` channels of ``heads`` heads on ``nodes`` nodes: ``largest``
    (``NCCL_NVLS_CHUNKSIZE``), 64 KiB from 4 nodes (``NCCL_NVLSTREE_MAX_CHUNKSIZE``'s default),
    then 256, 128, 64 or 32 KiB while the call has fewer than 32, 16, 4 or 1 chunks per channel
    and head (``calcCollChunking``, ``src/enqueue.cc``, NCCL 2.20 to 2.30).

    >>> [nvls_tree_chunk_bytes(s << 20, 16, 8, 2) for s in (1024, 32, 4)]
    [131072, 65536, 32768]
    >>> nvls_tree_chunk_bytes(1 << 30, 16, 8, 4)
    65536
    """
    chunk, ops = min(largest, 65536) if nodes >= 4 else largest, channels * heads
    for times, smaller in ((32, 262144), (16, 131072), (4, 65536), (1, 32768)):
        if size < times * ops * chunk and chunk > smaller:
            chunk = smaller
    return chunk


def pat_chunk_bytes(size: float, channels: int, collective: str, *,
                    largest: int = _NCCL_STEP_DATA["Simple"]) -> int:
    """Data bytes of NCCL's PAT chunk for a call of ``size`` bytes (the nccl-tests size) over
    ``channels`` channels: ``largest`` (one Simple step, 512 KiB), halved while the call has
    fewer than 32 (allgather) or 16 (reduce-scatter) chunks per channel, down to 64 KiB
    (``calcCollChunking``, ``src/enqueue.cc``). PAT's kernels move one slice per chunk
    (``ProtoSimple<1, 1>``), so this is its pipelining grain too.

    >>> [pat_chunk_bytes(s << 20, 2, "allgather") for s in (64, 8, 1)]
    [524288, 131072, 65536]
    """
    factor = 32 if collective == "allgather" else 16
    chunk = largest
    while chunk * max(1, channels) * factor > size and chunk > 65536:
        chunk //= 2
    return chunk


def _chunking(setup: TuningSetup, collective: str, algorithm: str, protocol: str,
              size_bytes: int, channels: int) -> tuple[int, int, int]:
    """``(chunk, slice, proxy steps)`` of one channel's share (``calcCollChunking`` with one
    channel, 2.22+), in bytes of data."""
    rccl = setup.runtime == "rccl"
    step = (_RCCL_STEP_DATA if rccl else _NCCL_STEP_DATA)[protocol]
    grain = (_RCCL_GRAIN if rccl else _GRAIN)[protocol]
    ring_simple = algorithm == "ring" and protocol == "Simple"
    chunk_steps, slice_steps = ((4, 2) if collective in ("allreduce", "allgather",
                                                         "reduce_scatter") else (1, 1)) \
        if ring_simple else (1, 1)
    chunk, slice_ = step * chunk_steps, step * slice_steps
    nbytes = -(-size_bytes // max(1, channels))  # one channel's share
    ppn, nodes = setup.ranks_per_node, setup.nodes
    heads = nvls_heads(ppn)
    if algorithm == "nvls":
        largest = min(NVLS_CHUNK_BYTES, chunk)
        if nodes > 1 and bandwidth_gbps(setup, "allreduce", "nvls", "Simple") < 150:
            largest = 32768
        chunk = nvls_chunk_bytes(nbytes, 1, heads, largest=largest)
    elif algorithm == "nvls_tree":
        chunk = nvls_tree_chunk_bytes(nbytes, 1, heads, nodes, largest=min(NVLS_CHUNK_BYTES,
                                                                            chunk))
    elif algorithm == "tree" and protocol == "Simple" and (rccl or setup.version < (2, 20)):
        # NCCL <= 2.19 and every RCCL (computeColl, then calcCollChunking: RCCL 2.21 and the
        # rccl of ROCm/rocm-systems in 2026 alike): fewer chunks per channel than the tree's
        # depth x 8, x 4, x 1 halve the chunk, down to 128, 64, 32 KiB
        depth = ppn - 1 + _log2i(nodes)
        for times, floor in ((8, 131072), (4, 65536), (1, 32768)):
            while size_bytes // (max(1, channels) * chunk) < depth * times and chunk > floor:
                chunk //= 2
    elif algorithm == "tree" and protocol == "LL128":
        depth = 1 + _log2i(nodes) + 0.1 * ppn
        # NCCL counts whole chunks a channel (an integer division: "we are OK with the
        # division on the left side of the < operand being integer") against a fractional
        # threshold (2.8 x 64 / 8 = 22.4 on two nodes of 8)
        while size_bytes // (max(1, channels) * chunk) < depth * 64 / ppn and chunk > 131072:
            chunk //= 2
        while size_bytes // (max(1, channels) * chunk) < depth * 16 / ppn and chunk > 32768:
            chunk //= 2
    elif algorithm == "pat":
        # chunkSize * nChannels * 32 > nBytes, as the program model's PAT slice
        chunk = pat_chunk_bytes(size_bytes, channels, collective, largest=chunk)
    chunk = max(grain, chunk // grain * grain)
    slice_ = min(slice_, chunk) if not ring_simple else slice_
    if algorithm == "ring":
        n = setup.ranks
        per_loop, chunks_per_loop = ((2 * (n - 1), n) if collective == "allreduce"
                                     else (n - 1, n) if collective in ("allgather",
                                                                       "reduce_scatter")
                                     else (1, 1))
    elif algorithm == "nvls":
        per_loop, chunks_per_loop = 1, heads
    elif algorithm == "collnet_direct":
        per_loop, chunks_per_loop = 1, ppn
    else:
        per_loop, chunks_per_loop = 1, 1
    loops = max(1, -(-nbytes // (chunks_per_loop * chunk)))
    return chunk, slice_, per_loop * loops * chunk_steps


# -- the graph figures NCCL's search would find (an approximation) -------------------------------


def _speeds(table: dict, cc: int | None) -> tuple:
    cc = cc or 0
    return table[100] if cc >= 100 else table[90] if cc >= 90 else table[0]


def _best_speed(speeds: tuple, limit: float, channels_at) -> tuple[float, int]:
    """The speed (and channel count) maximising channels x speed, the fastest of equals, among
    the speeds at most ``limit``; the slowest speed and 1 channel when none fits."""
    best: tuple[float, int] | None = None
    for speed in speeds:
        if speed > limit + 1e-9:
            continue
        count = min(_MAX_CHANNELS // 2, channels_at(speed))
        if count < 1:
            continue
        if best is None or count * speed > best[0] * best[1] + 1e-9:
            best = (float(speed), count)
    return best if best is not None else (float(speeds[-1]), 1)


def _tree_intra_speed(speeds: tuple, bw_intra: float, bw_inter: float, channels: int, *,
                      gpu_gbps: float, path_gbps: float) -> float:
    """The tree graph's intra-node speed after the search's second pass: NCCL raises a tree's
    ``bwIntra`` one speed at a time, keeping its channels, while it is below twice ``bwInter``
    and the GPUs' links still hold every channel ("increase bwIntra for trees (2 nodes or
    collnet)", ``ncclTopoCompute`` in ``src/graph/search.cc``)."""
    for speed in sorted(speeds):
        if speed <= bw_intra + 1e-9:
            continue
        if bw_intra >= 2 * bw_inter - 1e-9 or speed > path_gbps + 1e-9 \
                or channels * speed > gpu_gbps + 1e-9:
            break
        bw_intra = float(speed)
    return bw_intra


def _dup(channels: int, bw: float, cc: int | None) -> tuple[int, float]:
    """``ncclTopoDupChannels`` (not for the NVLS graph)."""
    cc = cc or 0
    if bw < 25 or (cc > 80 and bw < 50 and channels > 4):
        return channels, bw
    dup = min(2 * channels, _MAX_CHANNELS // 2)  # the ring's maxChannels (src/init.cc)
    return dup, bw / -(-dup // channels)  # DIVUP(dup, channels): 1 where nothing was added


def nvlink_gbps(facts: "MachineFacts") -> float | None:
    """GB/s one NVLink carries per direction in the runtime's own terms (NCCL's per-link figure:
    18 sm60, 20 sm70/sm80, 20.6 sm90, 40.1 sm100), below the link's nominal rate; ``None`` when
    the machine's GPUs are not linked by NVLink or its architecture is unknown."""
    if facts.intra_class != "nvlink" or facts.compute_capability is None:
        return None
    return _NVLINK_GBPS.get(facts.compute_capability,
                            20.6 if facts.compute_capability >= 90 else 20.0)


def node_links(topology: "Topology") -> tuple[list[tuple[float, ...]], tuple]:
    """``(links, groups)`` of one node of ``topology``: its link rows (``links[src][dst]``, in
    the topology's units) among the node's own ranks, and the node's bandwidth groups (none for
    a multi-node topology that is not a composition, whose node is not kept)."""
    composition = getattr(topology.links, "composition", None)
    if composition is not None:
        node = composition.node
        return [tuple(row) for row in node.links], node.groups
    if topology.layout is not None and topology.layout.nodes > 1:
        per = topology.layout.ranks_per_node
        return [tuple(topology.links[r][:per]) for r in range(per)], ()
    return [tuple(row) for row in topology.links], topology.groups


def gpu_bandwidth_gbps(topology: "Topology", facts: "MachineFacts") -> tuple[float, float]:
    """``(total, largest pair)`` GB/s a GPU of ``topology``'s node reaches its peers with, in the
    runtime's own terms: NVLinks x NCCL's per-link figure (20 for sm70/sm80, 20.6 for sm90, 40.1
    for sm100); otherwise the topology's units x its unit GB/s (PCIe: 12 GB/s when unknown)."""
    composition = getattr(topology.links, "composition", None)
    rows, groups = node_links(topology)
    totals, pairs = [], []
    for rank, row in enumerate(rows):
        total = sum(row)
        for group in groups:
            if group.sources == frozenset({rank}):
                total = min(total, group.limit)
        totals.append(total)
        pairs.append(min(max(row, default=0), total))
    units, pair_units = min(totals, default=0), min(pairs, default=0)
    per_link = nvlink_gbps(facts)
    if per_link is not None:
        return units * per_link, pair_units * per_link
    unit = topology.unit_gbps if topology.unit_gbps is not None else _PCI_GBPS
    if composition is not None:
        unit = composition.node.unit_gbps or _PCI_GBPS
    return units * unit, pair_units * unit


def setup_from_facts(facts: "MachineFacts", *, gpu_gbps: float, path_gbps: float,
                     runtime: str | None = None, version: tuple[int, int] | None = None,
                     collnet: bool = False, latency_inter_us: float = 0.0,
                     net_overhead_us: float | None = None) -> TuningSetup:
    """The :class:`TuningSetup` NCCL (or RCCL) would build on a machine, its graph figures
    approximated from ``facts`` and the GPU's bandwidth (see docs/runtime-tuning.md, "Graph
    figures"): ``gpu_gbps`` a GPU's total intra-node GB/s, ``path_gbps`` the most between two
    GPUs (the NVSwitch port: the total). ``collnet=True`` enables CollNet (SHARP) on the ring's
    figures.

    Raises
    ------
    InvalidInstanceError
        A multi-node machine without NIC figures, or a runtime the facts cannot tell.
    """
    runtime = runtime or facts.runtime
    if runtime not in _RUNTIMES:
        raise InvalidInstanceError(f"machine {facts.arch!r}: no NCCL/RCCL tuning applies; pass "
                                   "runtime='nccl' or 'rccl' to use one anyway")
    version = version or (RCCL_DEFAULT_VERSION if runtime == "rccl" else DEFAULT_VERSION)
    cc = facts.compute_capability if runtime == "nccl" else None
    nodes, ppn = facts.nodes, facts.ranks_per_node
    nvlink = facts.intra_class in ("nvlink", "xgmi", None)
    if nodes > 1 and (facts.nics_per_node is None or facts.nic_gbps is None):
        raise InvalidInstanceError(f"{nodes} nodes of {facts.arch or 'unknown'} GPUs: the NICs "
                                   "per node and their GB/s are needed (metadata.nic)")
    nics, nic_gbps = facts.nics_per_node or ppn, facts.nic_gbps or 0.0
    inf = math.inf

    def intra_count(speed: float) -> int:
        return math.floor(gpu_gbps / speed + 1e-9) if ppn > 1 else _MAX_CHANNELS

    if nodes == 1:
        speed, channels = _best_speed(_speeds(_SPEEDS_INTRA, cc), path_gbps, intra_count)
        bw_intra = bw_inter = speed
    else:
        limit = min(path_gbps if ppn > 1 else inf, nic_gbps)
        speed, channels = _best_speed(
            _speeds(_SPEEDS_INTER, cc), limit,
            lambda s: min(intra_count(s), nics * math.floor(nic_gbps / s + 1e-9)))
        bw_intra = bw_inter = speed
    channels, bw = _dup(channels, bw_intra, cc)
    ring = GraphFigures(channels, bw, bw * (bw_inter / bw_intra), nvlink,
                        latency_inter_us=latency_inter_us)
    tree = ring
    if runtime == "nccl" and nodes == 2 and ppn > 1:
        tree = replace(ring, bw_intra_gbps=_tree_intra_speed(
            _speeds(_SPEEDS_INTER, cc), ring.bw_intra_gbps, ring.bw_inter_gbps, ring.channels,
            gpu_gbps=gpu_gbps, path_gbps=path_gbps))
    comm = min(2 * channels, _MAX_CHANNELS)
    if cc is not None and cc >= 90 and nodes > 1 and ring.bw_intra_gbps > 45 and comm < 16:
        comm *= 2
    if runtime == "rccl" and nodes > 1 and facts.arch in _RCCL_MULTI_NODE_CHANNELS:
        comm = _rccl_multi_node_channels(facts.arch, version)
    nvls = None
    nvls_channels = 0
    if runtime == "nccl" and facts.nvls and (cc or 0) >= 90 and ppn >= 2:
        heads = nvls_heads(ppn)
        # Each NVLS channel takes 2 x speed on its head GPU's links and 1 x on the others'.
        s_intra, _ = _best_speed(_speeds(_SPEEDS_INTRA, cc), path_gbps,
                                 lambda s: heads if (heads + 1) * s <= gpu_gbps + 1e-9 else 0)
        if nodes == 1:
            s_inter = 2 * s_intra  # no network: pass 2 raises it to twice the intra speed
        else:
            share = nic_gbps * nics / heads
            s_inter, _ = _best_speed(_speeds(_SPEEDS_INTER, cc), min(share, 2 * s_intra),
                                     lambda s: 1)
        nvls = GraphFigures(heads, s_intra, s_inter, True, latency_inter_us=latency_inter_us)
        if cc >= 100 and version >= (2, 25):
            nvls_channels = 24 if (nodes == 1 and version >= (2, 27)) else 32
        else:
            nvls_channels = 16
    pat = runtime == "nccl" and ppn == 1 and nodes > 1 and (cc or 0) >= 60
    ll128 = _ll128_enabled(runtime, version, cc, facts.arch, nodes, nvlink, facts.nic_path)
    overhead = net_overhead_us if net_overhead_us is not None else \
        (2.0 if facts.cpu_vendor == "amd" else 1.0)
    return TuningSetup(runtime=runtime, version=version, ranks=facts.num_ranks, nodes=nodes,
                       compute_capability=cc, arch=facts.arch, cpu_vendor=facts.cpu_vendor,
                       ring=ring, tree=tree, comm_channels=comm, nvls=nvls,
                       collnet=ring if collnet else None, nvls_channels=nvls_channels, pat=pat,
                       ll128=ll128, net_overhead_us=overhead)


def _rccl_multi_node_channels(arch: str, version: tuple[int, int]) -> int:
    """RCCL's channels on several nodes of MI300-class GPUs: 64, the multi-node ceiling (the
    MI300X rome model with NICs lists 64 rings, ``rome_model_81`` in ``src/graph/rome_models.cc``
    of RCCL 2.21); MI350X/MI355X drop to 48 from RCCL 2.30.4 (ROCm 7.14; RCCL's "usage tips",
    "RCCL channel tuning for multi-node MI350X"). Versions here are (major, minor), so 2.30 counts
    as 48."""
    since_2_30, before = _RCCL_MULTI_NODE_CHANNELS[arch]
    return since_2_30 if version >= (2, 30) else before


def version_note(runtime: str, version: tuple[int, int] | None) -> str | None:
    """What pricing ``runtime`` (``"nccl"``, ``"rccl"``) at ``version`` cannot follow: ``None``
    within the modelled range, else which version's rules it is priced by."""
    if version is None:
        return None
    oldest = OLDEST_VERSION[runtime]
    newest = RCCL_DEFAULT_VERSION if runtime == "rccl" else DEFAULT_VERSION
    if version < oldest:
        return (f"{runtime} {version[0]}.{version[1]} is older than the oldest version modelled "
                f"({oldest[0]}.{oldest[1]}): priced by {oldest[0]}.{oldest[1]}'s rules")
    if version > newest:
        return (f"{runtime} {version[0]}.{version[1]} is newer than the newest version modelled "
                f"({newest[0]}.{newest[1]}): priced by {newest[0]}.{newest[1]}'s rules")
    return None


def _ll128_enabled(runtime: str, version: tuple[int, int], cc: int | None, arch: str | None,
                   nodes: int, nvlink: bool, nic_path: str | None = None) -> bool:
    if runtime == "rccl":
        archs = ("gfx90a",) if version < (2, 28) else ("gfx90a", "gfx942", "gfx950")
        return arch in archs and nvlink
    if cc is None or cc < 70 or not nvlink:
        return False
    # Across nodes the graph's GPU-NIC path must be PXB or better (PXN on sm90+): a path
    # through the CPU is PHB, which fails; NVLink-C2C to the CPU is PHB too before 2.27 and
    # its own P2C from 2.27, which LL128 accepts on sm90+ (NCCL_LL128_C2C=1).
    if nodes > 1 and (nic_path == "cpu" or (nic_path == "c2c" and version < (2, 27))):
        return False
    if version < (2, 27):
        allowed = (70, 80, 90) + ((100, 120) if version >= (2, 25) else ())
        return cc in allowed
    return True


def tuning_setup(topology: "Topology", *, runtime: str | None = None,
                 version: tuple[int, int] | None = None, collnet: bool | None = None,
                 latency_inter_us: float = 0.0,
                 settings: RuntimeSettings = RuntimeSettings()) -> TuningSetup:
    """:func:`setup_from_facts` on ``topology``'s machine facts and GPU bandwidth; CollNet is on
    where the facts say the network has SHARP on several nodes (``collnet=None``); the job's
    ``settings`` narrow the runtime's choices.

    >>> from collsynth.topology.builtins import get_topology
    >>> s = tuning_setup(get_topology("dgx-h100"))
    >>> s.ring.channels, s.ring.bw_intra_gbps, s.comm_channels, s.nvls.channels
    (12, 30.0, 24, 8)
    """
    from collsynth.topology.machine import machine_facts

    facts = machine_facts(topology)
    total, pair = gpu_bandwidth_gbps(topology, facts)
    if collnet is None:
        collnet = facts.sharp and facts.nodes > 1
    setup = setup_from_facts(facts, gpu_gbps=total, path_gbps=pair, runtime=runtime,
                             version=version, collnet=collnet, latency_inter_us=latency_inter_us)
    return setup if settings.default else \
        replace(setup, settings=settings)


# -- NCCL's ring and tree as exact lines: what the closed form prices ----------------------------
# The same baseLat, hwLat and bandwidth factors as above, without the per-architecture caps
# (LL's ceiling, LL128's and the tree's per-channel caps), the tree correction factors and the
# multi-node overheads, so that each (algorithm, protocol) is a line in the size with exact
# coefficients and its crossovers with a synthesized algorithm are exact. Channels and their
# GB/s come from the rings found on the topology itself (collsynth.timing.rings).

#: NCCL's own algorithms the exact lines cover.
LINEAR_ALGORITHMS = ("ring", "tree")


def _exact(value: object) -> Fraction:
    return Fraction(value) if isinstance(value, (Fraction, str)) else exact_fraction(value)


def _per_protocol(**rows: tuple) -> Mapping[str, Mapping[str, Fraction]]:
    """``{row: {protocol: Fraction}}`` from one (LL, LL128, Simple) tuple per row, read-only."""
    return MappingProxyType({name: MappingProxyType(dict(zip(PROTOCOLS, map(_exact, values))))
                             for name, values in rows.items()})


_EXACT_BASE = _per_protocol(**{a: NCCL_BASE_LATENCY_US[a] for a in LINEAR_ALGORITHMS})
_EXACT_HOP: Mapping[str, Mapping[str, Mapping[str, Fraction]]] = MappingProxyType({
    hw: _per_protocol(**{a: table[a] for a in LINEAR_ALGORITHMS})
    for hw, table in NCCL_HOP_LATENCY_US.items()})

#: ``BANDWIDTH_FACTOR[algorithm][protocol]`` on the bus bandwidth, one node (the tree's LL128
#: factor on several nodes is :data:`TREE_LL128_MULTINODE`).
BANDWIDTH_FACTOR = _per_protocol(
    ring=(Fraction(1, 2), "0.92", 1),
    tree=(Fraction("0.92") / Fraction("3.8"), Fraction("0.92") * Fraction(7, 9), "0.92"),
)

#: Tree LL128 factor on several nodes: 0.92 x 120/128.
TREE_LL128_MULTINODE = Fraction("0.92") * Fraction(120, 128)

#: Collectives NCCL runs with its ring (and, for allreduce, tree) algorithms.
_RING_COLLECTIVES = ("allreduce", "allgather", "reduce_scatter", "broadcast", "reduce")

@dataclass(frozen=True)
class NcclSetup:
    """What NCCL's graph search finds on a topology, as far as its cost model needs.

    Parameters
    ----------
    num_ranks, nodes:
        Ranks and nodes (ranks per node = ``num_ranks // nodes``).
    rings:
        The channels: each a directed ring, ranks in order.
    channel_gbps:
        GB/s of each channel (one unit of its slowest hop).
    hardware:
        ``"nvlink"`` or ``"pci"``: which per-hop latencies apply inside a node.
    """

    num_ranks: int
    nodes: int
    rings: tuple[tuple[int, ...], ...]
    channel_gbps: tuple[Fraction, ...]
    hardware: str = "nvlink"

    def __post_init__(self) -> None:
        if self.hardware not in ("nvlink", "pci"):
            raise UnknownNameError(f"hardware {self.hardware!r}; expected 'nvlink' or 'pci'")
        if len(self.rings) != len(self.channel_gbps):
            raise InvalidInstanceError("NcclSetup: one channel_gbps per ring")
        if self.nodes < 1 or self.num_ranks % self.nodes:
            raise InvalidInstanceError(f"NcclSetup: {self.num_ranks} ranks on {self.nodes} nodes")

    @property
    def bus_gbps(self) -> float:
        """The bus bandwidth of all channels together (GB/s)."""
        return float(self.bus_gbps_exact)

    @property
    def bus_gbps_exact(self) -> Fraction:
        return sum(self.channel_gbps, Fraction(0))


@dataclass(frozen=True)
class NcclChoice:
    """One (algorithm, protocol) of NCCL for one collective: ``latency_us + size / (1000 algbw)``.

    ``latency_us`` and ``algbw_gbps`` are exact (NCCL's decimal constants as Fractions), so
    crossovers with synthesized algorithms are exact (:func:`collsynth.timing.model.crossover`).
    """

    algorithm: str
    protocol: str
    collective: str
    num_ranks: int
    latency_us: Fraction
    algbw_gbps: Fraction

    @property
    def name(self) -> str:
        """``"ring/LL"``, ``"tree/Simple"``..."""
        return f"{self.algorithm}/{self.protocol}"

    def time_us(self, size_bytes: Real) -> float:
        """Microseconds for a ``size_bytes`` buffer (nccl-tests convention)."""
        return float(self.latency_us) + float(size_bytes) / (1000 * float(self.algbw_gbps))

    def symbolic_time(self) -> sympy.Expr:
        """The time as a sympy expression in ``size_bytes`` with exact coefficients."""
        lat = sympy.Rational(self.latency_us.numerator, self.latency_us.denominator)
        bw = sympy.Rational(self.algbw_gbps.numerator, self.algbw_gbps.denominator)
        return lat + SIZE / (1000 * bw)


def nccl_setup(topology: "Topology", *, model: "CostModel | None" = None,
               hardware: str = "nvlink", channels: int | None = None,
               channel_gbps: Real | None = None) -> NcclSetup:
    """The channels NCCL would use on ``topology`` and their bandwidth.

    Parameters
    ----------
    topology:
        Needs ``unit_gbps`` (unless ``channel_gbps`` is given). A composed topology
        (``metadata["network"]``) counts its nodes.
    model:
        The link figures (default: :func:`~collsynth.timing.model.cost_model` of the topology);
        a channel's GB/s is one unit of its slowest hop: ``1 / (1000 * beta)``.
    hardware:
        ``"nvlink"`` (default) or ``"pci"``: NCCL's per-hop latency class inside a node.
    channels, channel_gbps:
        Override what the search finds: ``channels`` rings (the rings found are reused, cycling
        if needed, for their names only) each of ``channel_gbps`` GB/s.

    Raises
    ------
    NoRingError
        When the topology has no directed ring through every rank and ``channels`` is not given.
    InvalidTopologyError
        When the topology lacks ``unit_gbps`` (and ``channel_gbps`` is not given).
    """
    n = topology.num_ranks
    nodes = topology.layout.nodes if topology.layout is not None else 1
    rings = ring_channels(topology)
    if channels is not None:
        if not isinstance(channels, int) or channels < 1:
            raise InvalidInstanceError(f"channels = {channels!r}; expected an integer >= 1")
        base = rings or (tuple(range(n)),)
        rings = tuple(base[i % len(base)] for i in range(channels))
    if not rings:
        raise NoRingError(
            f"topology {topology.name!r} has no directed ring through all {n} ranks, so NCCL's "
            "ring and tree have no channel here; pass channels= and channel_gbps=")
    if channel_gbps is not None:
        per = exact_fraction(channel_gbps, "channel_gbps")
        gbps = tuple(per for _ in rings)
    else:
        cm = as_cost_model(model if model is not None else topology)
        gbps = tuple(min(1 / (1000 * exact_fraction(cm.figures(a, b).beta_us_per_byte, "beta"))
                         for a, b in zip(ring, ring[1:] + ring[:1]))
                     for ring in rings)
    return NcclSetup(n, nodes, rings, gbps, hardware)



def nccl_choices(setup: "NcclSetup | Topology", collective: str, *,
                 protocols: Sequence[str] = PROTOCOLS,
                 algorithms: Sequence[str] = LINEAR_ALGORITHMS) -> tuple[NcclChoice, ...]:
    """Every (algorithm, protocol) NCCL would consider for ``collective`` (docs/timing.md).

    Ring for allreduce, allgather, reduce-scatter, broadcast and reduce; tree for allreduce only.
    Other collectives (alltoall, gather, scatter: grouped point-to-point in NCCL, outside its
    tuning model) get ``()``.

    >>> from collsynth.topology import get_topology
    >>> [c.name for c in nccl_choices(get_topology("dgx1"), "allreduce")]
    ['ring/LL', 'ring/LL128', 'ring/Simple', 'tree/LL', 'tree/LL128', 'tree/Simple']

    Examples
    --------
    On the DGX-1 (6 directed NVLink rings of 25 GB/s = 150 GB/s bus bandwidth), an 8-rank allgather
    with ring/Simple: latency ``8.4 + 7 * 3.4 = 32.2`` us, ``algbw = 150 * 8 / 7`` GB/s:

    >>> from collsynth.topology import get_topology
    >>> setup = nccl_setup(get_topology("dgx1"))
    >>> len(setup.rings), setup.bus_gbps
    (6, 150.0)
    >>> simple = [c for c in nccl_choices(setup, "allgather") if c.name == "ring/Simple"][0]
    >>> float(simple.latency_us), round(float(simple.algbw_gbps), 3)
    (32.2, 171.429)
    >>> best_choice(nccl_choices(setup, "allgather"), 1000).name
    'ring/LL'
    """
    if not isinstance(setup, NcclSetup):
        setup = nccl_setup(setup)
    for p in protocols:
        if p not in PROTOCOLS:
            raise UnknownNameError(f"protocol {p!r}; expected one of {', '.join(PROTOCOLS)}")
    for a in algorithms:
        if a not in LINEAR_ALGORITHMS:
            raise UnknownNameError(f"algorithm {a!r}; expected one of "
                                   f"{', '.join(LINEAR_ALGORITHMS)}")
    key = canonical_name(collective)
    if key not in _RING_COLLECTIVES:
        return ()
    n, nodes = setup.num_ranks, setup.nodes
    intra = _EXACT_HOP[setup.hardware]
    net = _EXACT_HOP["net"]
    bus = setup.bus_gbps_exact
    choices = []
    if "ring" in algorithms:
        nsteps = ring_steps(key, n)
        inter_steps = ring_steps(key, nodes) if nodes > 1 else 0
        for p in protocols:
            latency = _EXACT_BASE["ring"][p]
            if key in ("broadcast", "reduce"):
                hop_table = intra if nodes == 1 else net
                hop = hop_table["tree" if p == "Simple" else "ring"][p]
                latency += nsteps * hop
            else:
                latency += (nsteps - inter_steps) * intra["ring"][p] + inter_steps * net["ring"][p]
            algbw = bus * BANDWIDTH_FACTOR["ring"][p] * Fraction(n, nsteps)
            choices.append(NcclChoice("ring", p, key, n, latency, algbw))
    if "tree" in algorithms and key == "allreduce":
        for p in protocols:
            latency = _EXACT_BASE["tree"][p] + 2 * (
                (n // nodes - 1) * intra["tree"][p] + _log2i(nodes) * net["tree"][p])
            factor = BANDWIDTH_FACTOR["tree"][p]
            if p == "LL128" and nodes > 1:
                factor = TREE_LL128_MULTINODE
            choices.append(NcclChoice("tree", p, key, n, latency, bus * factor / 2))
    return tuple(choices)


def best_choice(choices: Iterable[NcclChoice], size_bytes: Real) -> NcclChoice:
    """The fastest choice at ``size_bytes``, as NCCL picks (ties: the first given).

    Raises
    ------
    InvalidInstanceError
        When ``choices`` is empty.
    """
    choices = tuple(choices)
    if not choices:
        raise InvalidInstanceError("no NCCL choice to pick from")
    size = exact_fraction(size_bytes, "size_bytes")
    return min(choices, key=lambda c: c.latency_us + size / (1000 * c.algbw_gbps))


def _h100_facts() -> "MachineFacts":
    """One DGX H100 node's facts (for the examples)."""
    from collsynth.topology.machine import MachineFacts

    return MachineFacts(arch="sm90", compute_capability=90, intra_class="nvlink", nvls=True,
                        network_class="ib", nodes=1, ranks_per_node=8, nics_per_node=8,
                        nic_gbps=50.0, cpu_vendor="intel", nvswitch=True)
