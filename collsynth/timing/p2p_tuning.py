"""How NCCL runs grouped send/recv (alltoall): channels per peer, parts and protocol per call.

NCCL's p2p operations skip its cost model: their channels come from the topology at init
(``ncclTopoComputeP2pChannels`` in ``src/graph/paths.cc``) and their split and protocol from
the call's bytes per peer (``src/enqueue.cc``). docs/runtime-model.md, "Grouped send/recv".
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


def peer_channels(topology: "Topology") -> int:
    """NCCL's channels to one intra-node peer, the fewest over the node's GPU pairs
    (``ncclTopoGetNchannels``): twice the NVLinks (xGMI links) between the pair, 2 where a pair
    has no direct link (PCIe)."""
    rows, _ = node_links(topology)
    fewest = min((row[b] for a, row in enumerate(rows) for b in range(len(rows)) if a != b),
                 default=0)
    return 2 * max(1, int(fewest)) if fewest > 0 else 2


def p2p_channel_count(setup: TuningSetup) -> int:
    """``p2pnChannels``: the communicator's channels rounded up to a power of two, at most
    MAXCHANNELS (32; 64 from NCCL 2.25).

    >>> from collsynth.timing.tuning_model import tuning_setup
    >>> from collsynth.topology import get_topology
    >>> p2p_channel_count(tuning_setup(get_topology("dgx-a100")))  # 24 channels
    32
    """
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
    per_peer = intra_peer_channels
    if nodes > 1:
        if setup.version >= (2, 29):
            net = max(1, math.ceil((nic_gbps or 0.0) / _NET_GBPS_PER_CHANNEL))
        else:
            net = 2
            while net > 1 and net * ranks > channels * 4:
                net //= 2
        per_peer = min(per_peer, net)
    per_peer = _pow2_up(per_peer)
    if nodes > 1 and setup.version >= (2, 29):
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
    ll_limit = (parts if setup.version >= (2, 29) else per_peer) * P2P_LL_THRESHOLD
    protocol = "LL" if nodes == 1 and per_op <= ll_limit else "Simple"
    return P2pShape(protocol, parts, channels, per_peer)
