"""NCCL's NVLS and NVLS-tree algorithms as timing graphs through a switch vertex.

NVLink SHARP (NVLS) reduces and multicasts inside the NVSwitch: a GPU's load-reduce of a
multicast address makes the switch read a shard from every GPU and return the sum, and a
multicast store writes one copy into every GPU. No rank does the reduction, so this is not an
MSCCL program; the graph is built here transfer by transfer for the program model's simulator
(:func:`collsynth.timing.runtime_model.simulate_program`), priced with the same constants as
every program. Each node gets a switch vertex whose ports carry a GPU's NVLink bandwidth times
NCCL's NVLS efficiency. The transfers and the bytes per port: docs/runtime-model.md, "NVLS" and
"NVLS-tree".
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np

from collsynth.collective.kinds import busbw_factor, canonical_name
from collsynth.errors import InvalidInstanceError, InvalidTopologyError, UnknownNameError
from collsynth.export.program import Program
from collsynth.runtimes import check_channels
from collsynth.runtimes.protocols import STEP_BYTES
from collsynth.timing.paths import INTRA, NETWORK, Fabric
from collsynth.timing.runtime_model import (BY_CONNECTION, BY_NVLS_CHANNEL, BY_SWITCH, FORWARD,
                                            RECEIVE, SEND, PreparedProgram,
                                            check_simulated_steps)
from collsynth.timing.runtime_baselines import double_binary_tree
from collsynth.timing.symmetry import Spec, folded_members
from collsynth.timing.tuning_model import (  # the one home of NCCL's chunk rules
    nvls_chunk_bytes, nvls_heads, nvls_tree_chunk_bytes)

if TYPE_CHECKING:  # pragma: no cover - imported for annotations only
    from collsynth.topology.machine import MachineFacts
    from collsynth.topology.model import Topology

__all__ = ["NVLS_COLLECTIVES", "NVLS_TREE_COLLECTIVES", "SHARP_COLLECTIVES", "nvls_graph",
           "nvls_tree_graph", "sharp_graph",
           "switch_ports", "nvls_port_efficiency"]

#: Collectives NCCL runs with NVLS on one node (``ncclTopoTuneModel``: Simple only).
NVLS_COLLECTIVES = ("allreduce", "allgather", "reduce_scatter")
#: Collectives NCCL runs with NVLS-tree (allreduce only).
NVLS_TREE_COLLECTIVES = ("allreduce",)


class _Graph:
    """Transfers appended in a causal order (every transfer after those it waits for).

    Each transfer names where its resources come from (:data:`~collsynth.timing.symmetry.Spec`:
    ``("up", a)``, ``("down", a)``, ``("route", a, b)``, ``("nic_out", a)``, ``("nic_in", a)``)
    and how many identical channels it stands for (``copies``, set by the builder)."""

    def __init__(self, nvls: bool = True) -> None:
        self.nvls = nvls   # NVLS's transfers are the switch's or a channel's SM, not connections
        self.kind: list[int] = []
        self.match: list[int] = []
        self.inputs: list[tuple[int, ...]] = []
        self.link_class: list[int] = []
        self.work: list[float] = []
        self.specs: list[tuple[Spec, ...]] = []
        self.copy_counts: list[int] = []
        self.role: list[int] = []
        self.copies = 1

    def _add(self, kind: int, match: int, inputs: Sequence[int], specs: Sequence[Spec],
             link_class: int, work: float, free: bool = False) -> int:
        index = len(self.kind)
        # An intra-node transfer of a switch graph is the switch's (free) or a head's, one SM
        # per channel; a network leg is the proxy's connection.
        self.role.append(BY_SWITCH if free else BY_NVLS_CHANNEL if link_class == INTRA
                         else BY_CONNECTION)
        self.kind.append(kind)
        self.match.append(match)
        self.inputs.append(tuple(inputs))
        self.link_class.append(link_class)
        self.work.append(float(work))
        self.specs.append(tuple(specs))
        self.copy_counts.append(self.copies)
        return index

    def send(self, specs: Sequence[Spec], link_class: int, *, free: bool = False) -> int:
        """A GPU sends one chunk of its input (``free``: read by the switch, so no connection's
        or channel's own rate applies, only the ports)."""
        return self._add(SEND, -1, (), specs, link_class, 0.0, free)

    def forward(self, match: int, specs: Sequence[Spec], link_class: int, *,
                inputs: Sequence[int] = (), work: float = 0.0, free: bool = False) -> int:
        """Takes ``match`` (and every ``inputs``) as it arrives, reduced with ``work`` passes,
        and sends it on (``free``: written by the switch, not by a GPU's channel)."""
        return self._add(FORWARD, match, inputs, specs, link_class, work, free)

    def receive(self, match: int) -> int:
        """A GPU stores a chunk into its output."""
        return self._add(RECEIVE, match, (), (), -1, 0.0)

    def prepared(self, topology: "Topology", fabric: Fabric, program: Program,
                 resolve: Callable[[Spec], Sequence[int]], ports: Sequence[int] = (),
                 slice_bytes: "float | Callable[[float], float] | None" = None
                 ) -> PreparedProgram:
        """The timing graph, every transfer on the resources its specs name (weighted by its
        channel ``copies`` where one stands for several)."""
        members = np.array([(t, r) for t, specs in enumerate(self.specs) for spec in specs
                            for r in resolve(spec)], dtype=np.int64).reshape(-1, 2)
        weights = None
        if any(c != 1 for c in self.copy_counts):
            weights = np.array(self.copy_counts, dtype=float)[members[:, 0]]
        return self._timing_graph(topology, fabric, program, members, weights, ports,
                                  slice_bytes)

    def folded(self, topology: "Topology", fabric: Fabric, program: Program,
               resolve: Callable[[Spec], Sequence[int]], ports: Sequence[int],
               slice_bytes: "float | Callable[[float], float] | None", per_node: int,
               turned: int) -> PreparedProgram | None:
        """The timing graph of a graph that holds shard 0 of the rotation of the first
        ``turned`` of every node's ``per_node`` GPUs
        (:func:`~collsynth.timing.symmetry.folded_members`); ``None`` where that rotation is
        not a symmetry of the machine."""
        found = folded_members(self.specs, self.copy_counts, resolve, fabric.capacity_gbps,
                               per_node, turned)
        if found is None:
            return None
        members, weights = found
        return self._timing_graph(topology, fabric, program, members, weights, ports,
                                  slice_bytes)

    def _timing_graph(self, topology: "Topology", fabric: Fabric, program: Program,
                      members: np.ndarray, weights: np.ndarray | None, ports: Sequence[int],
                      slice_bytes: "float | Callable[[float], float] | None"
                      ) -> PreparedProgram:
        from collsynth.topology.machine import machine_facts

        total = len(self.kind)
        kinds = np.array(self.kind)
        return PreparedProgram(
            program=program, topology=topology, kind=self.kind, cnt=[1] * total,
            prev=[-1] * total, deps=[()] * total, match=self.match,
            sends=(kinds == SEND) | (kinds == FORWARD),
            link_class=np.array(self.link_class, dtype=np.int8),
            work=np.array(self.work), members=members,
            capacity_gbps=np.array(fabric.capacity_gbps, dtype=float),
            resource_names=fabric.names, buffer_chunks=program.nchunksperloop,
            busbw_factor=float(busbw_factor(program.coll, program.ngpus)), inputs=self.inputs,
            slice_bytes=slice_bytes, switch_resources=tuple(ports),
            switch_role=np.array(self.role, dtype=np.int8) if self.nvls else None,
            switch_efficiency=nvls_port_efficiency(machine_facts(topology)),
            weights=weights)


def _resolver(fabric: Fabric, up: Sequence[int] | None = None,
              down: Sequence[int] | None = None,
              nic_out: Sequence[Sequence[int]] | None = None,
              nic_in: Sequence[Sequence[int]] | None = None
              ) -> Callable[[Spec], tuple[int, ...]]:
    """Resource indices of a :data:`~collsynth.timing.symmetry.Spec`."""
    table = {"up": up, "down": down, "nic_out": nic_out, "nic_in": nic_in}

    def resolve(spec: Spec) -> tuple[int, ...]:
        name, *ranks = spec
        if name == "route":
            return fabric.route(ranks[0], ranks[1]).resources
        found = table[name][ranks[0]]  # type: ignore[index]
        return (found,) if isinstance(found, (int, np.integer)) else tuple(found)
    return resolve


def nvls_port_efficiency(facts: "MachineFacts") -> float:
    """The share of a GPU's NVLink bandwidth its NVLS port carries where no calibration says:
    the measured default of its architecture
    (:data:`~collsynth.runtimes.constants.NVLS_PORT_EFFICIENCY`: 0.67 Hopper), else NCCL's
    ``nvlsEfficiency`` (:func:`collsynth.timing.tuning_model.nvls_efficiency`: 0.74 Blackwell;
    0 before Hopper).

    >>> from collsynth.topology import get_topology
    >>> from collsynth.topology.machine import machine_facts
    >>> [nvls_port_efficiency(machine_facts(get_topology(t))) for t in ("dgx-h100", "dgx-a100")]
    [0.67, 0.0]
    """
    from collsynth.runtimes.constants import NVLS_PORT_EFFICIENCY
    from collsynth.timing.tuning_model import nvls_efficiency

    efficiency = nvls_efficiency(facts.compute_capability)
    return NVLS_PORT_EFFICIENCY.get(facts.arch or "", efficiency) if efficiency > 0 else 0.0


def switch_ports(topology: "Topology") -> tuple[tuple[float, float], ...]:
    """Per rank, ``(to the switch, from the switch)`` GB/s its NVLS port carries: the GPU's
    NVLink bandwidth inside its node (the units of its links to the node's other ranks, capped
    by its egress or ingress group, times ``unit_gbps``) times the port's efficiency
    (:func:`nvls_port_efficiency`: 0.67 Hopper, 0.74 Blackwell).

    >>> from collsynth.topology import get_topology
    >>> switch_ports(get_topology("dgx-h100"))[0]  # 18 NVLinks x 25 GB/s x 0.67
    (301.5, 301.5)

    Raises
    ------
    InvalidInstanceError
        The machine has no NVLink SHARP (its facts say ``nvls`` false) or no ``unit_gbps``.
    """
    from collsynth.topology.machine import machine_facts

    facts = machine_facts(topology)
    efficiency = nvls_port_efficiency(facts)
    if not facts.nvls or efficiency <= 0:
        raise InvalidInstanceError(
            f"topology {topology.name!r} has no NVLink SHARP (its machine facts: nvls "
            f"{facts.nvls}, arch {facts.arch}); NVLS needs an NVSwitch with multicast, sm90 or "
            "later")
    if topology.unit_gbps is None:
        raise InvalidTopologyError(f"topology {topology.name!r} has no unit_gbps; the program "
                                   "model needs it")
    n = topology.num_ranks
    per = facts.ranks_per_node
    unit = float(topology.unit_gbps)
    out = [0.0] * n
    into = [0.0] * n
    blocks = []
    for start in range(0, n, per):
        block = topology.link_block(start, start + per)  # the node's links, [src, dst]
        blocks.append(block)
        out[start:start + per] = block.sum(axis=1).astype(float).tolist()
        into[start:start + per] = block.sum(axis=0).astype(float).tolist()
    for group in topology.binding_groups:
        if len(group.sources) == 1:
            (a,) = group.sources
            if _bounds_port(topology, a, group.destinations, per, blocks[a // per],
                            outgoing=True):
                out[a] = min(out[a], float(group.limit))
        if len(group.destinations) == 1:
            (a,) = group.destinations
            if _bounds_port(topology, a, group.sources, per, blocks[a // per],
                            outgoing=False):
                into[a] = min(into[a], float(group.limit))
    return tuple((out[a] * unit * efficiency, into[a] * unit * efficiency) for a in range(n))


def _bounds_port(topology: "Topology", a: int, far: frozenset[int], per: int,
                 block: np.ndarray, *, outgoing: bool) -> bool:
    """Whether a group with rank ``a`` alone on one side bounds ``a``'s whole NVLS port that
    way: every link it covers (``a -> far``, or ``far -> a``) is inside ``a``'s node, and it
    covers each of ``a``'s links there. A NIC's group (links to other nodes) or one over some
    of the node's links only (a single link's cap) bounds those links, not the port.
    ``block``: the links of ``a``'s node, ``[src, dst]`` (its links inside the node are read
    there, not one by one: 7344 GPUs have 14688 such groups)."""
    home = a // per
    start = home * per
    for b in far:
        if b // per != home and (topology.bandwidth(a, b) if outgoing
                                 else topology.bandwidth(b, a)):
            return False  # (stops at a NIC group's first rank of another node)
    linked = np.flatnonzero(block[a - start] if outgoing else block[:, a - start])
    return all(start + int(j) in far for j in linked if start + int(j) != a)


def _check(topology: "Topology", channels: int, protocol: str, collective: str,
           allowed: tuple[str, ...], what: str) -> str:
    key = canonical_name(collective)
    if key not in allowed:
        raise UnknownNameError(f"no {what} for {collective!r}; NCCL runs {what} for "
                               f"{', '.join(allowed)}")
    check_channels(channels)
    if protocol != "Simple":
        raise InvalidInstanceError(f"{what} runs with the Simple protocol only, not {protocol!r}")
    return key


def _ports(topology: "Topology", fabric: Fabric) -> tuple[list[int], list[int]]:
    """Resource indices of every rank's NVLS port, to and from its node's switch."""
    up, down = [], []
    for a, (to, back) in enumerate(switch_ports(topology)):
        node = fabric.node_of(a)
        up.append(fabric.resource(("nvls", a, "up"), f"NVLS port of rank {a} to switch {node}",
                                  to))
        down.append(fabric.resource(("nvls", a, "down"),
                                    f"NVLS port of rank {a} from switch {node}", back))
    return up, down


def nvls_graph(collective: str, topology: "Topology", channels: int, protocol: str = "Simple",
               *, name: str | None = None, fold: bool = True) -> PreparedProgram:
    """NCCL's NVLS ``collective`` on one node of ``topology`` over ``channels`` channels, as a
    timing graph through the node's switch.

    Each channel carries ``1 / channels`` of the buffer, cut into one shard per GPU (GPU ``k``
    owns shard ``k``), or for the allreduce one per head (GPUs ``0 .. h - 1``, ``h`` =
    :func:`~collsynth.timing.tuning_model.nvls_heads`: 32 at most):

    * allreduce: every GPU sends each shard to the switch; the switch reduces shard ``k`` as
      the streams arrive and returns the sum to head ``k`` (the load-reduce), which stores it
      back (the multicast store); the switch writes a copy into every GPU. Per GPU and
      direction its port carries the buffer, a head's ``1 / h`` more.
    * allgather: GPU ``k`` stores its shard once; the switch writes it into every GPU (a port
      carries ``1 / n`` of the output up and all of it down).
    * reduce-scatter: every GPU sends each shard; the switch returns the sum of shard ``k`` to
      GPU ``k`` (all of the input up, ``1 / n`` of it down).

    Every leg (GPU to switch, switch to GPU) is one hop of the intra-node class. With ``fold``
    (the default) the graph holds one channel and shard 0, standing for the others
    (:mod:`collsynth.timing.symmetry`), where the node's ports are alike; the times are those of
    the whole graph (``fold=False``).

    Raises
    ------
    InvalidInstanceError
        Several nodes (NVLS across nodes needs CollNet/SHARP: NCCL runs NVLS-tree there), no
        NVLink SHARP, a protocol other than Simple, or bad channels.
    UnknownNameError
        A collective NVLS does not run.

    >>> from collsynth.topology import get_topology
    >>> h100 = get_topology("dgx-h100")
    >>> nvls_graph("allreduce", h100, 1, fold=False).num_transfers  # per shard: 8 sends,
    ... # 1 reduce, 1 store, 8 copies, 8 receives
    208
    >>> nvls_graph("allreduce", h100, 16).num_transfers  # shard 0 of one channel
    26
    """
    key = _check(topology, channels, protocol, collective, NVLS_COLLECTIVES, "NVLS")
    layout = topology.layout
    if layout is not None and layout.multi_node:
        raise InvalidInstanceError(
            f"NVLS across the {layout.nodes} nodes of {topology.name!r} needs CollNet (SHARP) "
            "in the network, which no collsynth machine has; NCCL runs NVLS-tree there")
    n = topology.num_ranks
    heads = nvls_heads(n)
    shards = heads if key == "allreduce" else n
    fabric = Fabric(topology)
    up, down = _ports(topology, fabric)
    resolve = _resolver(fabric, up, down)
    program = Program(name=name or f"nvls-{key}", proto=protocol, nchannels=channels,
                      nchunksperloop=channels * shards, ngpus=n, coll=key, inplace=0, gpus=(),
                      outofplace=1, min_bytes=0)

    def chunk(size: float) -> float:
        return nvls_chunk_bytes(size, channels, heads)

    if fold:
        graph = _nvls_shards(key, n, [(channels, [0])])
        folded = graph.folded(topology, fabric, program, resolve, up + down, chunk,
                              per_node=n, turned=shards)
        if folded is not None:
            return folded
    per_shard = {"allreduce": 3 * n + 2, "allgather": 2 * n + 1, "reduce_scatter": n + 2}[key]
    check_simulated_steps(channels * shards * per_shard, f"NVLS {key} of {n} ranks on "
                                                         f"{channels} channel(s)")
    graph = _nvls_shards(key, n, [(1, list(range(shards)))] * channels)
    return graph.prepared(topology, fabric, program, resolve, up + down, chunk)


def _nvls_shards(key: str, n: int, channels: Sequence[tuple[int, Sequence[int]]]) -> _Graph:
    """NVLS's transfers on one node of ``n`` GPUs: per channel ``(copies, shards)``, the
    channel standing for ``copies`` channels, the shards it holds."""
    graph = _Graph()
    for copies, shards in channels:
        graph.copies = copies
        for k in shards:
            if key == "allgather":
                store = graph.send([("up", k)], INTRA)
                for j in range(n):
                    graph.receive(graph.forward(store, [("down", j)], INTRA, free=True))
                continue
            scatter = [graph.send([("up", g)], INTRA, free=True) for g in range(n)]
            reduced = graph.forward(scatter[0], [("down", k)], INTRA, inputs=scatter[1:])
            if key == "reduce_scatter":
                graph.receive(reduced)
                continue
            store = graph.forward(reduced, [("up", k)], INTRA)
            for j in range(n):
                graph.receive(graph.forward(store, [("down", j)], INTRA, free=True))
    return graph


def nvls_tree_graph(collective: str, topology: "Topology", channels: int,
                    protocol: str = "Simple", *, name: str | None = None,
                    fold: bool = True) -> PreparedProgram:
    """NCCL's NVLS-tree allreduce on ``topology`` (nodes of ``m`` GPUs) over ``channels``
    channels: NVLS inside each node, a tree over the network between nodes.

    Each channel carries ``1 / channels`` of the buffer, cut into one shard per head (``h`` =
    :func:`~collsynth.timing.tuning_model.nvls_heads`: ``m``, 32 at most); GPU ``k`` of every
    node is the head of shard ``k``. Inside node ``v`` the switch reduces shard ``k`` and
    returns it to its head; the heads of shard ``k`` reduce up NCCL's double binary tree over the
    nodes (:func:`~collsynth.timing.runtime_baselines.double_binary_tree`, the first tree on
    even channels, the second on odd ones: each head adds its children's sums to its node's as
    they arrive and sends on to its parent); the root's sum comes back down the tree, and each
    head stores it into its switch, which writes a copy into every GPU of the node. Network legs
    take the topology's links and NICs; each leg is one hop of its class. With ``fold`` (the
    default) the graph holds an even and an odd channel and shard 0, standing for the others
    (:mod:`collsynth.timing.symmetry`), where turning every node's GPUs maps the machine onto
    itself; the times are those of the whole graph (``fold=False``).

    Raises
    ------
    InvalidInstanceError
        No NVLink SHARP, a protocol other than Simple, or bad channels.
    UnknownNameError
        A collective other than allreduce.

    >>> from collsynth.topology import get_topology
    >>> from collsynth.topology.compose import compose_nodes
    >>> two = compose_nodes(get_topology("dgx-h100"), 2)
    >>> nvls_tree_graph("allreduce", two, 1, fold=False).num_transfers
    ... # 8 shards x (2 nodes x (8 + 1 + 1 + 8 + 8) + one leg up, one down)
    432
    >>> nvls_tree_graph("allreduce", two, 16).num_transfers  # shard 0 of 2 channels
    108
    """
    key = _check(topology, channels, protocol, collective, NVLS_TREE_COLLECTIVES, "NVLS-tree")
    layout = topology.layout
    nodes, m = (layout.nodes, layout.ranks_per_node) if layout is not None else \
        (1, topology.num_ranks)
    n = nodes * m
    heads = nvls_heads(m)
    fabric = Fabric(topology)
    up, down = _ports(topology, fabric)
    resolve = _resolver(fabric, up, down)
    program = Program(name=name or f"nvls_tree-{key}", proto=protocol, nchannels=channels,
                      nchunksperloop=channels * heads, ngpus=n, coll=key, inplace=0, gpus=(),
                      outofplace=1, min_bytes=0)

    def chunk(size: float) -> float:
        return nvls_tree_chunk_bytes(size, channels, heads, nodes)

    if fold:
        parities = [(channels - c + 1) // 2 for c in range(min(channels, 2))]
        check_simulated_steps(len(parities) * nodes * (3 * m + 4),
                              f"NVLS-tree allreduce of {n} ranks, folded")
        graph = _nvls_tree_shards(fabric, nodes, m, [(copies, [0]) for copies in parities])
        folded = graph.folded(topology, fabric, program, resolve, up + down, chunk,
                              per_node=m, turned=heads)
        if folded is not None:
            return folded
    check_simulated_steps(channels * heads * nodes * (3 * m + 4),
                          f"NVLS-tree allreduce of {n} ranks on {channels} channel(s)")
    graph = _nvls_tree_shards(fabric, nodes, m, [(1, list(range(heads)))] * channels)
    return graph.prepared(topology, fabric, program, resolve, up + down, chunk)


def _nvls_tree_shards(fabric: Fabric, nodes: int, m: int,
                      channels: Sequence[tuple[int, Sequence[int]]]) -> _Graph:
    """NVLS-tree's transfers over ``nodes`` nodes of ``m`` GPUs: per channel ``(copies,
    shards)`` in channel order (even channels take the first tree, odd ones the second)."""
    trees = double_binary_tree(nodes)
    graph = _Graph()
    for c, (copies, shards) in enumerate(channels):
        graph.copies = copies
        tree = trees[c % 2]
        root = next(v for v, (parent, _) in enumerate(tree) if parent == -1)
        order: list[int] = []      # pre-order from the root: parents before children
        stack = [root]
        while stack:
            v = stack.pop()
            order.append(v)
            stack.extend(reversed(tree[v][1]))
        for k in shards:
            def head(v: int) -> int:
                return v * m + k
            scatter = [[graph.send([("up", v * m + g)], INTRA, free=True) for g in range(m)]
                       for v in range(nodes)]
            reduced = [graph.forward(scatter[v][0], [("down", head(v))], INTRA,
                                     inputs=scatter[v][1:]) for v in range(nodes)]
            partial: dict[int, int] = {}
            for v in reversed(order):  # children before parents
                parent, children = tree[v]
                if parent == -1:
                    continue
                partial[v] = graph.forward(reduced[v], [("route", head(v), head(parent))],
                                           fabric.route(head(v), head(parent)).link_class,
                                           inputs=[partial[x] for x in children],
                                           work=len(children))
            total: dict[int, tuple[int, tuple[int, ...], float]] = {}
            for v in order:  # the sum, down from the root
                parent, children = tree[v]
                if parent == -1:
                    total[v] = (reduced[v], tuple(partial[x] for x in children), len(children))
                source, extra, work = total[v]
                for child in children:
                    total[child] = (graph.forward(source, [("route", head(v), head(child))],
                                                  fabric.route(head(v), head(child)).link_class,
                                                  inputs=extra, work=work), (), 0.0)
                store = graph.forward(source, [("up", head(v))], INTRA, inputs=extra, work=work)
                for j in range(m):
                    graph.receive(graph.forward(store, [("down", v * m + j)], INTRA, free=True))
    return graph


#: NCCL's algorithms that reduce in the network's switches (SHARP): allreduce only.
SHARP_COLLECTIVES = ("allreduce",)


def _halved(chunk: int, ratio: "Callable[[int], float]", rules: Sequence[tuple[float, int]]
            ) -> int:
    """NCCL's chunk for a call: ``chunk`` halved while ``ratio(chunk)`` (the call's chunks per
    channel and head) is below a rule's bound and the chunk above its floor, rule by rule."""
    for bound, floor in rules:
        while ratio(chunk) < bound and chunk > floor:
            chunk //= 2
    return chunk


def collnet_chunk_bytes(algorithm: str, size: float, channels: int, heads: int, depth: int
                        ) -> int:
    """Data bytes of NCCL's CollNet chunk for a call of ``size`` bytes (``computeColl``): chain
    256 KiB and direct 512 KiB (a Simple step), halved while the call has too few chunks per
    channel (and head) for the pipeline's ``depth``."""
    if algorithm == "collnet_chain":
        return _halved(256 * 1024, lambda c: size // (channels * c),
                       ((depth * 64, 131072), (depth * 8, 65536), (depth, 32768)))
    return _halved(STEP_BYTES["Simple"], lambda c: size // (channels * heads * c),
                   ((depth * 64, 131072), (depth * 8, 65536), (depth * 8, 32768)))


def _nic_ports(topology: "Topology", fabric: Fabric, per: int
               ) -> tuple[list[list[int]], list[list[int]]]:
    """Per rank, the resources of its NICs toward the network and back: the bandwidth groups of
    the composed topology from some ranks of its node (its NIC's) to every rank of the other
    nodes, and back (a group into another node's NIC is not this rank's)."""
    n = topology.num_ranks
    out: list[list[int]] = [[] for _ in range(n)]
    into: list[list[int]] = [[] for _ in range(n)]
    unit = float(topology.unit_gbps or 0.0)
    nodes = n // per
    others: dict[tuple[int, int], bool] = {}  # (far side's id, home): every other node's ranks
    for g, group in enumerate(topology.binding_groups):
        sources, destinations = group.sources, group.destinations
        for side, far, found in ((sources, destinations, out), (destinations, sources, into)):
            home = next(iter(side)) // per
            if nodes < 2 or any(a // per != home for a in side):  # one home node (stops early)
                continue
            key = (id(far), home)
            if key not in others:  # the groups of a node's NICs share one far side
                ranks = n - len(range(home * per, min(n, (home + 1) * per)))
                others[key] = len(far) == ranks and all(r // per != home for r in far)
            if not others[key]:
                continue
            index = fabric.resource(("group", g), f"group {group.name or g!r}",
                                    group.limit * unit)
            for a in side:
                found[a].append(index)
    for a in range(n):
        # No group: a rank whose one link to another node is its NIC (two one-GPU nodes).
        if not out[a]:
            peers = [b for b in range(n) if b // per != a // per and topology.bandwidth(a, b)]
            if len(peers) == 1:
                out[a] = list(fabric.route(a, peers[0]).resources)
        if not into[a]:
            peers = [b for b in range(n) if b // per != a // per and topology.bandwidth(b, a)]
            if len(peers) == 1:
                into[a] = list(fabric.route(peers[0], a).resources)
    missing = [a for a in range(n) if not out[a] or not into[a]]
    if missing:
        raise InvalidTopologyError(f"topology {topology.name!r}: rank {missing[0]} has no NIC "
                                   "group toward the network; SHARP needs the NICs described")
    return out, into


def sharp_graph(algorithm: str, collective: str, topology: "Topology", channels: int,
                protocol: str = "Simple", *, name: str | None = None) -> PreparedProgram:
    """NCCL's allreduce with the reduction across nodes done by the network's switches (SHARP),
    over ``channels`` channels of ``topology`` (nodes of ``m`` GPUs whose facts say ``sharp``):

    * ``"collnet_chain"``: a channel's share of the buffer is reduced down a chain of the
      node's GPUs to its head (local GPU ``channel mod m``), which sends it to the switch; the
      switch sums the heads' streams in line and returns the total to every head, which passes
      it back along the chain;
    * ``"collnet_direct"``: a channel's share is cut into ``m`` shards; every GPU sends shard
      ``k`` to local GPU ``k`` over NVLink, which adds them (``gamma``) and sends the node's sum
      to the switch; the total comes back to GPU ``k``, which sends it to every local GPU;
    * ``"nvls"`` (NVLS across nodes): as ``collnet_direct``, with the node's sums made and the
      totals spread by NVLink SHARP (:func:`nvls_graph`'s ports).

    A leg to or from the network switch takes the head's NIC (its bandwidth groups) and one hop
    of the network class; the switch itself adds no hop and no gamma.

    Raises
    ------
    InvalidInstanceError
        One node, a network without SHARP, a protocol other than Simple, or bad channels.
    UnknownNameError
        An algorithm other than those three, or a collective other than allreduce.

    >>> from collsynth.topology.compose import compose_nodes
    >>> from collsynth.topology import get_topology
    >>> from collsynth.topology.machine import with_machine
    >>> two = with_machine(compose_nodes(get_topology("dgx-h100"), 2), sharp=True)
    >>> # per node: 7 hops up the chain, a leg up, a leg down, 7 hops back and 8 receives
    >>> sharp_graph("collnet_chain", "allreduce", two, 1).num_transfers
    48
    """
    from collsynth.topology.machine import machine_facts

    if algorithm not in ("collnet_chain", "collnet_direct", "nvls"):
        raise UnknownNameError(f"no SHARP graph of {algorithm!r}; there is one of "
                               "collnet_chain, collnet_direct, nvls")
    what = {"nvls": "NVLS across nodes", "collnet_chain": "CollNet chain",
            "collnet_direct": "CollNet direct"}[algorithm]
    key = _check(topology, channels, protocol, collective, SHARP_COLLECTIVES, what)
    layout = topology.layout
    facts = machine_facts(topology)
    if layout is None or not layout.multi_node or not facts.sharp:
        raise InvalidInstanceError(
            f"{what} needs several nodes on a network whose switches reduce (SHARP); "
            f"{topology.name!r} has {layout.nodes if layout else 1} node(s), sharp "
            f"{facts.sharp}")
    nodes, m = layout.nodes, layout.ranks_per_node
    n = nodes * m
    check_simulated_steps(channels * nodes * m * (3 * m + 4),
                          f"{what} allreduce of {n} ranks on {channels} channel(s)")
    fabric = Fabric(topology)
    nic_out, nic_in = _nic_ports(topology, fabric, m)
    up = down = None
    if algorithm == "nvls":
        up, down = _ports(topology, fabric)
    graph = _Graph(nvls=algorithm == "nvls")

    def through_switch(sums: list[list[int]], heads: list[int], work: list[float]) -> list[int]:
        """Each head sends its node's sum up its NIC (taking the transfers ``sums[v]`` as they
        arrive and adding them to its own with ``work[v]`` passes; none: its own data alone);
        the switch returns the total to every head."""
        sent = [graph.forward(sums[v][0], [("nic_out", heads[v])], NETWORK,
                              inputs=sums[v][1:], work=work[v])
                if sums[v] else graph.send([("nic_out", heads[v])], NETWORK)
                for v in range(nodes)]
        return [graph.forward(sent[0], [("nic_in", heads[v])], NETWORK, inputs=sent[1:])
                for v in range(nodes)]

    pieces = 1 if algorithm == "collnet_chain" else m
    for c in range(channels):
        if algorithm == "collnet_chain":
            k = c % m
            heads = [v * m + k for v in range(nodes)]
            sums: list[list[int]] = []
            work: list[float] = []
            for v in range(nodes):
                chain = [v * m + (k + 1 + i) % m for i in range(m - 1)] + [heads[v]]
                last = -1
                for a, b in zip(chain, chain[1:]):
                    last = graph.send([("route", a, b)], INTRA) if last < 0 else \
                        graph.forward(last, [("route", a, b)], INTRA, work=1)
                sums.append([last] if last >= 0 else [])
                work.append(1.0 if m > 1 else 0.0)
            totals = through_switch(sums, heads, work)
            for v in range(nodes):
                chain = [heads[v]] + [v * m + (k - 1 - i) % m for i in range(m - 1)]
                graph.receive(totals[v])
                last = totals[v]
                for a, b in zip(chain, chain[1:]):
                    last = graph.forward(last, [("route", a, b)], INTRA)
                    graph.receive(last)
            continue
        for k in range(m):
            heads = [v * m + k for v in range(nodes)]
            sums, work = [], []
            for v in range(nodes):
                if algorithm == "nvls":
                    scatter = [graph.send([("up", v * m + g)], INTRA, free=True)
                               for g in range(m)]
                    sums.append([graph.forward(scatter[0], [("down", heads[v])], INTRA,
                                               inputs=scatter[1:])])
                    work.append(0.0)
                    continue
                # the others' shards, which the head adds to its own as they arrive
                sums.append([graph.send([("route", v * m + g, heads[v])], INTRA)
                             for g in range(m) if v * m + g != heads[v]])
                work.append(float(m - 1))
            totals = through_switch(sums, heads, work)
            for v in range(nodes):
                if algorithm == "nvls":
                    store = graph.forward(totals[v], [("up", heads[v])], INTRA)
                    for j in range(m):
                        graph.receive(graph.forward(store, [("down", v * m + j)], INTRA,
                                                    free=True))
                    continue
                graph.receive(totals[v])
                for j in range(m):
                    if v * m + j != heads[v]:
                        graph.receive(graph.forward(
                            totals[v], [("route", heads[v], v * m + j)], INTRA))
    program = Program(name=name or f"{algorithm}-sharp-{key}", proto=protocol,
                      nchannels=channels, nchunksperloop=channels * pieces, ngpus=n, coll=key,
                      inplace=0, gpus=(), outofplace=1, min_bytes=0)
    ports = (up + down) if up is not None else ()
    if algorithm == "nvls":
        def chunk(size: float) -> float:
            return nvls_chunk_bytes(size, channels, m)
    else:   # chain: its depth is the node's chain; direct: heads with peers up and down
        depth = m if algorithm == "collnet_chain" else 2

        def chunk(size: float) -> float:
            return collnet_chunk_bytes(algorithm, size, channels, m, depth)
    return graph.prepared(topology, fabric, program, _resolver(fabric, up, down, nic_out, nic_in),
                          ports, slice_bytes=chunk)
