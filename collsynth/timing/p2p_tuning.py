"""How NCCL and RCCL run grouped send/recv (alltoall): channels per peer, parts and protocol.

Their p2p operations skip the cost model: the channels come from the topology at init
(``ncclTopoComputeP2pChannels`` in ``src/graph/paths.cc``) and the split and protocol from
the call's bytes per peer (``src/enqueue.cc``); RCCL changes a few of NCCL's figures.
docs/runtime-model.md, "Grouped send/recv".
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from collsynth.timing.tuning_model import TuningSetup, node_links

if TYPE_CHECKING:  # pragma: no cover - imported for annotations only
    from collsynth.topology.model import Topology

__all__ = ["P2P_LL_THRESHOLD", "P2P_CHUNK_BYTES", "P2pShape", "peer_channels", "p2p_shape",
           "p2p_channel_count"]

#: ``NCCL_P2P_LL_THRESHOLD``: bytes per channel of a p2p operation up to which it runs LL.
P2P_LL_THRESHOLD = 16384
#: ``NCCL_P2P_NVL_CHUNKSIZE`` (all peers NVLink on one node) and ``NCCL_P2P_NET_CHUNKSIZE``
#: (several nodes: every peer, NVLink ones too), bytes.
P2P_CHUNK_BYTES = {"nvl": 1 << 19, "net": 1 << 17}
#: ``NCCL_P2P_PER_CHANNEL_NET_BW`` (NCCL 2.29+): GB/s of a network peer per channel.
_NET_GBPS_PER_CHANNEL = 14.0
#: ``NCCL_MAX_DEV_WORK_P2P_PER_BATCH``: peers one channel's batch holds.
_PEERS_PER_BATCH = 8
#: RCCL: architectures that get 4 channels per xGMI link to a peer (2 elsewhere) and twice the
#: channels per peer on one node (``ncclTopoGetNchannels``, ``ncclTopoComputeP2pChannels``).
_RCCL_WIDE_P2P_ARCHS = ("gfx942", "gfx950")
#: RCCL: ``p2pnChannels`` is at most 4 x ``CHANNEL_LIMIT`` (16).
_RCCL_P2P_CHANNELS = 64


@dataclass(frozen=True)
class P2pShape:
    """One grouped send/recv call: ``protocol``, ``parts`` (channels each peer's operation is
    split over), ``channels`` (``p2pnChannels``, a power of two) and ``per_peer``
    (``p2pnChannelsPerPeer``)."""

    protocol: str
    parts: int
    channels: int
    per_peer: int


def _pow2_up(value: int) -> int:
    return 1 << max(0, int(value) - 1).bit_length()


def peer_channels(topology: "Topology", setup: TuningSetup | None = None) -> int:
    """The runtime's channels to one intra-node peer, the fewest over the node's GPU pairs
    (``ncclTopoGetNchannels``): twice the NVLinks (xGMI links) between the pair, 2 where a pair
    has no direct link (PCIe). RCCL (``setup.runtime``) on gfx942/gfx950: four per xGMI link.

    >>> from collsynth.topology import get_topology
    >>> from collsynth.timing.tuning_model import tuning_setup
    >>> mi300x = get_topology("mi300x")  # one xGMI link per pair
    >>> peer_channels(mi300x), peer_channels(mi300x, tuning_setup(mi300x, runtime="rccl"))
    (2, 4)
    """
    rows, _ = node_links(topology)
    fewest = min((row[b] for a, row in enumerate(rows) for b in range(len(rows)) if a != b),
                 default=0)
    if fewest <= 0:
        return 2
    per_link = 4 if _rccl_wide(setup) else 2
    return per_link * max(1, int(fewest))


def _rccl_wide(setup: TuningSetup | None) -> bool:
    return setup is not None and setup.runtime == "rccl" and setup.arch in _RCCL_WIDE_P2P_ARCHS


def p2p_channel_count(setup: TuningSetup) -> int:
    """``p2pnChannels``: the communicator's channels rounded up to a power of two, at most
    MAXCHANNELS (32; 64 from NCCL 2.25; RCCL: 64).

    >>> from collsynth.timing.tuning_model import tuning_setup
    >>> from collsynth.topology import get_topology
    >>> p2p_channel_count(tuning_setup(get_topology("dgx-a100")))  # 24 channels
    32
    """
    if setup.runtime == "rccl":
        return min(_pow2_up(setup.comm_channels), _RCCL_P2P_CHANNELS)
    limit = 64 if setup.version >= (2, 25) else 32
    return min(_pow2_up(min(setup.comm_channels, limit)), limit)


def p2p_shape(setup: TuningSetup, size_bytes: int, *, intra_peer_channels: int,
              nic_gbps: float | None = None) -> P2pShape:
    """How the runtime runs an alltoall of ``size_bytes`` (nccl-tests' size: every rank's whole
    buffer, ``size / ranks`` to each peer) on ``setup``'s machine; ``intra_peer_channels`` from
    :func:`peer_channels`, ``nic_gbps`` one NIC's GB/s on several nodes.

    >>> from collsynth.timing.tuning_model import tuning_setup
    >>> from collsynth.topology import get_topology
    >>> a100 = get_topology("dgx-a100")
    >>> s = tuning_setup(a100)
    >>> [(x.protocol, x.parts) for x in (p2p_shape(s, n, intra_peer_channels=24)
    ...                                  for n in (8 << 10, 8 << 20, 8 << 30))]
    [('LL', 1), ('Simple', 4), ('Simple', 32)]
    """
    nodes, ranks = setup.nodes, setup.ranks
    channels = p2p_channel_count(setup)
    rccl = setup.runtime == "rccl"
    per_peer = intra_peer_channels
    if nodes > 1:
        if setup.version >= (2, 29) and not rccl:
            # divUp((int)netBw, 14): the NIC's GB/s truncated to a whole number first
            net = max(1, -(-int(nic_gbps or 0.0) // int(_NET_GBPS_PER_CHANNEL)))
        else:
            net = 2
            while net > 1 and net * ranks > channels * 4:
                net //= 2
        # RCCL: at least the NICs the GPU's bandwidth needs (getLocalNetCountByBw; one here)
        per_peer = min(per_peer, net)
    per_peer = _pow2_up(per_peer)
    if rccl and nodes == 1 and _rccl_wide(setup):
        per_peer *= 2  # "Doubling P2P channels per peer on single node"
    if nodes > 1 and setup.version >= (2, 29) and not rccl:
        while per_peer > 1 and per_peer * math.ceil(ranks / _PEERS_PER_BATCH) > channels:
            per_peer //= 2
    per_peer = min(per_peer, channels)
    fewest = per_peer
    while fewest > 1 and fewest * ranks > channels:
        fewest //= 2
    chunk = P2P_CHUNK_BYTES["net" if nodes > 1 else "nvl"]
    least, most = (chunk // 8, chunk * 32) if nodes == 1 else (chunk // 2, chunk)
    per_op = max(1, size_bytes // ranks)
    parts = min(fewest, -(-per_op // least))
    while per_op / parts > most and parts * 2 <= per_peer:
        parts *= 2
    # LL rides the intra-node connections only (network p2p has no LL buffers by default)
    # RCCL compares each part's bytes with the threshold, as NCCL does from 2.29
    ll_limit = (parts if setup.version >= (2, 29) or rccl else per_peer) * P2P_LL_THRESHOLD
    protocol = "LL" if nodes == 1 and per_op <= ll_limit else "Simple"
    return P2pShape(protocol, parts, channels, per_peer)
