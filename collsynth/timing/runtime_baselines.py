"""The runtime's own algorithms as MSCCL programs, so one simulator prices both sides.

NCCL and RCCL run allgather, reduce-scatter and allreduce on rings, one ring per channel,
broadcast and reduce as chains along those rings, and allreduce also on a double binary tree; the same schedules written as MSCCL programs run through
:func:`collsynth.timing.runtime_model.simulate_program` with the same constants as any
synthesized program ("one yardstick"). The programs' steps are in docs/runtime-model.md.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Sequence

from collsynth.collective.kinds import canonical_name
from collsynth.errors import InvalidInstanceError, NoRingError, NoTreeError, UnknownNameError
from collsynth.export.program import GpuProgram, Program, ThreadBlock, XmlStep

if TYPE_CHECKING:  # pragma: no cover
    from collsynth.topology.model import Topology

__all__ = ["RING_COLLECTIVES", "TREE_COLLECTIVES", "PAT_COLLECTIVES", "ring_program",
           "runtime_rings", "double_binary_tree", "tree_program", "runtime_tree", "pat_steps",
           "pat_program", "tree_pipeline", "TREE_PIPELINE", "TREE_MAX_PIPELINE",
           "P2P_COLLECTIVES", "p2p_program", "p2p_channel"]

#: Collectives whose ring :func:`ring_program` writes (broadcast and reduce: NCCL's chain along
#: the ring from or to the root).
RING_COLLECTIVES = ("allgather", "reduce_scatter", "allreduce", "broadcast", "reduce")
#: Collectives NCCL and RCCL also run on their double binary tree.
TREE_COLLECTIVES = ("allreduce",)
#: Collectives NCCL runs with PAT (one GPU per node, Simple).
PAT_COLLECTIVES = ("allgather", "reduce_scatter")
#: Collectives NCCL and RCCL run as grouped send/recv: one p2p operation per peer.
P2P_COLLECTIVES = ("alltoall",)
#: Pipeline chunks per tree (per half of the buffer) that :func:`tree_program` writes at least.
TREE_PIPELINE = 4
#: The most pipeline chunks per tree :func:`tree_pipeline` asks for (the simulation's cost grows
#: with them; past 32 the pipeline's fill is under 1/32 of the call).
TREE_MAX_PIPELINE = 32


def tree_pipeline(size_bytes: float, trees: int, chunk_bytes: float) -> int:
    """Pipeline chunks per tree for :func:`tree_program` when the runtime moves a
    ``size_bytes`` buffer ``chunk_bytes`` (data bytes) at a time over ``trees`` trees (its
    channels): NCCL pipelines a tree chunk by chunk, so a tree's share of ``s`` bytes is
    ``ceil(s / chunk)`` chunks; here rounded up to a power of two (few distinct programs), at
    least :data:`TREE_PIPELINE` (the simulation pipelines below one chunk less finely than LL's
    lines and Simple's slices do) and at most :data:`TREE_MAX_PIPELINE`.

    >>> tree_pipeline(1 << 28, 8, 1 << 19), tree_pipeline(1 << 25, 8, 1 << 19)
    (32, 8)
    >>> tree_pipeline(1 << 24, 8, 1 << 19), tree_pipeline(0, 8, 1 << 19)
    (4, 4)
    """
    if not chunk_bytes > 0 or trees < 1 or not size_bytes > 0:
        return TREE_PIPELINE
    chunks = math.ceil(size_bytes / (trees * chunk_bytes))
    return min(TREE_MAX_PIPELINE, max(TREE_PIPELINE, 1 << max(0, chunks - 1).bit_length()))



def runtime_rings(topology: "Topology", channels: int | None = None
                  ) -> tuple[tuple[int, ...], ...]:
    """The rings the runtime would use: :func:`collsynth.timing.rings.ring_channels`, the first
    ``channels`` of them (reused in turn when fewer were found), or all.

    Raises
    ------
    InvalidInstanceError
        No ring through every rank, or ``channels`` < 1.
    InputTooLargeError
        ``channels`` above :data:`~collsynth.timing.runtime_constants.MAX_CHANNELS` (refused
        before any ring is searched).
    """
    from collsynth.timing.rings import ring_channels
    from collsynth.runtimes import check_channels

    if channels is not None:
        check_channels(channels)
    rings = ring_channels(topology)
    if not rings:
        raise NoRingError(f"topology {topology.name!r} has no directed ring through all "
                          f"{topology.num_ranks} ranks; the runtime's ring cannot run")
    if channels is None:
        return rings
    return tuple(rings[i % len(rings)] for i in range(channels))


def ring_program(collective: str, rings: Sequence[Sequence[int]], *, protocol: str = "Simple",
                 name: str | None = None, runtime: str | None = None, root: int = 0) -> Program:
    """The ring algorithm of ``collective`` over ``rings`` (one per channel) as a Program.

    Broadcast and reduce are NCCL's chains (``runRing`` of ``broadcast.h`` and ``reduce.h``):
    on each channel the data leaves ``root`` along the ring, each rank passing it on as it
    arrives, the rank before the root only receiving; a reduce runs the other way, from the
    rank after ``root`` to ``root``, each rank adding its own. Each channel carries one chunk.

    ``runtime``: ``None`` for the schedule the runtime's own kernels run (fused steps, what
    the program model prices); a runtime's name for a file that runtime's MSCCL interpreter
    loads (:func:`collsynth.export.retarget.retarget`: its spelling, byte range and, for
    rccl, no fused steps), for every call size.

    Raises
    ------
    UnknownNameError
        A collective without a ring here (see :data:`RING_COLLECTIVES`).
    InvalidInstanceError
        No ring, a ring that is not a permutation of the same ranks as the first, or a root
        that is not one of them.

    >>> p = ring_program("allgather", [(0, 1, 2, 3)])
    >>> [st.type for st in p.gpus[0].threadblocks[0].steps]
    ['s', 'rcs', 'rcs', 'r', 'cpy']
    >>> b = ring_program("broadcast", [(0, 1, 2, 3)], root=1)
    >>> [[st.type for st in g.threadblocks[0].steps] for g in b.gpus]
    [['r'], ['s', 'cpy'], ['rcs'], ['rcs']]
    """
    key = canonical_name(collective)
    if key not in RING_COLLECTIVES:
        raise UnknownNameError(f"no ring program for {collective!r}; there is one for "
                               f"{', '.join(RING_COLLECTIVES)}")
    from collsynth.timing.runtime_model import check_simulated_steps

    if not rings:
        raise InvalidInstanceError("ring_program: give at least one ring")
    n, channels = len(rings[0]), len(rings)
    check_simulated_steps(ring_program_steps(key, n, channels),
                          f"the {key} ring of {n} ranks on {channels} channel(s)")
    rings = [tuple(int(r) for r in ring) for ring in rings]
    for ring in rings:
        if sorted(ring) != list(range(n)):
            raise InvalidInstanceError(f"ring {ring} is not a permutation of ranks 0..{n - 1}")
    if isinstance(root, bool) or not isinstance(root, int) or not 0 <= root < n:
        raise InvalidInstanceError(f"root = {root!r}; expected a rank from 0 to {n - 1}")
    total = n * channels

    def chunk(owner: int, c: int) -> int:   # the slot of rank ``owner``'s part on channel c
        return owner * channels + c

    position = [{r: i for i, r in enumerate(ring)} for ring in rings]
    gpus = []
    for rank in range(n):
        tbs = []
        for c, ring in enumerate(rings):
            p = position[c][rank]
            nxt, prv = ring[(p + 1) % n], ring[(p - 1) % n]

            def at(k: int) -> int:   # the rank k places before this one on the ring
                return ring[(p - k) % n]

            steps: list[tuple[str, str, int, str, int]] = []
            if n == 1:
                pass
            elif key == "broadcast":
                if rank == root:
                    steps += [("s", "i", c, "o", c), ("cpy", "i", c, "o", c)]
                else:
                    steps.append(("r" if nxt == root else "rcs", "o", c, "o", c))
            elif key == "reduce":
                if rank == root:
                    steps.append(("rrc", "i", c, "o", c))
                else:
                    steps.append(("s" if prv == root else "rrs", "i", c, "i", c))
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
                              "allreduce": (total, total),
                              "broadcast": (channels, channels),
                              "reduce": (channels, channels)}[key]
        gpus.append(GpuProgram(rank, i_chunks, o_chunks, 0, tuple(tbs)))
    per_loop = channels if key in ("broadcast", "reduce") else total
    program = Program(name=name or f"ring-{key}", proto=protocol, nchannels=channels,
                      nchunksperloop=per_loop, ngpus=n, coll=key, inplace=0, gpus=tuple(gpus),
                      outofplace=1, min_bytes=0)
    return program if runtime is None else _for_runtime(program, runtime)


def _for_runtime(program: Program, runtime: str) -> Program:
    from collsynth.export.retarget import retarget

    return retarget(program, runtime)


# -- NCCL's allreduce tree ---------------------------------------------------------------------


def _btree(nranks: int, rank: int) -> tuple[int, int, int]:
    """NCCL's binary tree over ``nranks`` (``ncclGetBtree``, src/graph/trees.cc): ``(up, down0,
    down1)`` of ``rank``, -1 for none. Rank 0 is the root, with one child."""
    bit = 1
    while bit < nranks and not bit & rank:
        bit <<= 1
    if rank == 0:
        return -1, (bit >> 1 if nranks > 1 else -1), -1
    up = (rank ^ bit) | (bit << 1)
    if up >= nranks:
        up = rank ^ bit
    lowbit = bit >> 1
    down0 = -1 if lowbit == 0 else rank - lowbit
    down1 = -1 if lowbit == 0 else rank + lowbit
    while down1 >= nranks:
        down1 = -1 if lowbit == 0 else rank + lowbit
        lowbit >>= 1
    return up, down0, down1


def double_binary_tree(nodes: int) -> tuple[tuple[tuple[int, tuple[int, ...]], ...], ...]:
    """NCCL's two complementary binary trees over ``nodes`` (``ncclGetDtree``): per tree, per
    node, ``(parent, children)`` (parent -1 at the root). The second tree mirrors the first
    (``nodes`` even) or shifts it by one (odd), so a node that is a leaf in one is inside the
    other.

    >>> double_binary_tree(4)
    (((-1, (2,)), (2, ()), (0, (1, 3)), (2, ())), ((1, ()), (3, (2, 0)), (1, ()), (-1, (1,))))
    """
    if isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 1:
        raise InvalidInstanceError(f"nodes = {nodes!r}; expected a whole number >= 1")

    def node(up: int, d0: int, d1: int) -> tuple[int, tuple[int, ...]]:
        return up, tuple(d for d in (d0, d1) if d != -1)

    first = tuple(node(*_btree(nodes, k)) for k in range(nodes))
    if nodes % 2:
        def shift(x: int) -> int:
            return -1 if x == -1 else (x + 1) % nodes
        second = tuple(node(*map(shift, _btree(nodes, (k - 1) % nodes))) for k in range(nodes))
    else:
        def mirror(x: int) -> int:
            return -1 if x == -1 else nodes - 1 - x
        second = tuple(node(*map(mirror, _btree(nodes, nodes - 1 - k))) for k in range(nodes))
    return first, second


def ring_step_types(collective: str, ranks: int) -> tuple[str, ...]:
    """The step types of one thread block of :func:`ring_program` for ``collective`` on
    ``ranks`` >= 2 ranks (allgather, reduce-scatter, allreduce: every rank and channel runs
    the same ones; step ``k`` >= 1 receives what the rank before sent at step ``k - 1``).

    >>> ring_step_types("allreduce", 3)
    ('s', 'rrs', 'rrcs', 'rcs', 'r')
    >>> ring_step_types("allgather", 3)
    ('s', 'rcs', 'r', 'cpy')
    """
    n = ranks
    key = canonical_name(collective)
    if key == "allgather":
        return ("s",) + ("rcs",) * (n - 2) + ("r", "cpy")
    if key == "reduce_scatter":
        return ("s",) + ("rrs",) * (n - 2) + ("rrc",)
    if key == "allreduce":
        return ("s",) + ("rrs",) * (n - 2) + ("rrcs",) + ("rcs",) * (n - 2) + ("r",)
    raise UnknownNameError(f"no rank-alike ring for {collective!r}: broadcast and reduce "
                           "start at their root")


def ring_program_steps(collective: str, ranks: int, channels: int) -> int:
    """The steps of :func:`ring_program`'s program (one thread block per rank and channel, of
    ``n + 1`` steps for allgather, ``n`` reduce-scatter, ``2n - 1`` allreduce, at most 2 for
    broadcast and 1 for reduce): what it is refused by before it is built
    (:func:`~collsynth.timing.runtime_model.check_simulated_steps`).

    >>> ring_program_steps("allreduce", 4, 2)  # 4 ranks x 2 channels x 7
    56
    """
    n = ranks
    per_tb = {"allgather": n + 1, "reduce_scatter": n, "allreduce": 2 * n - 1, "broadcast": 2,
              "reduce": 1}[canonical_name(collective)]
    return n * channels * per_tb


def tree_program_min_steps(ranks: int, channels: int, pipeline: int = TREE_PIPELINE) -> int:
    """At least the steps of :func:`tree_program`'s program of ``ranks`` ranks on ``channels``
    channels (two per chain): on each channel every rank but the root takes each chunk up and
    down, a step each at the least (a leaf: send, then receive), the root one (reduce, copy and
    send back); a channel's share of the chunks is as :func:`tree_program` sets it.

    >>> tree_program_min_steps(2, 2, pipeline=1)  # tree_program's example: 3 steps a rank
    6
    """
    step = ranks * channels // math.gcd(ranks, channels)
    share = step * -(-channels * pipeline // step) // channels
    return channels * share * (2 * (ranks - 1) + 1)


def tree_program(nodes: int, chains: Sequence[Sequence[int]], *,
                 pipeline: int = TREE_PIPELINE, protocol: str = "Simple",
                 name: str | None = None, runtime: str | None = None) -> Program:
    """NCCL's allreduce tree on ``nodes`` nodes as a Program.

    Rank ``node * m + local`` (``m`` local ranks). Each chain of ``chains`` (local ranks, the
    head first) gives two channels: inside a node the ranks form that chain; across nodes the
    heads form NCCL's double binary tree (:func:`double_binary_tree`), its first tree on one
    channel and its second on the next. Each of the ``2 x len(chains)`` trees carries an equal
    share of the buffer, ``pipeline`` chunks or more (``nchunksperloop`` is the smallest
    multiple of the ranks and of the trees that gives each that many); each chunk is reduced
    up the tree to the root and broadcast back down, the two directions in separate thread
    blocks so chunks pipeline. The steps are in docs/runtime-model.md. ``runtime``: as for
    :func:`ring_program`.

    Raises
    ------
    InvalidInstanceError
        No chain, a chain that is not a permutation of ``0..m-1``, or ``nodes`` or
        ``pipeline`` < 1.

    >>> p = tree_program(2, [[0]], pipeline=1)
    >>> [[st.type for tb in g.threadblocks for st in tb.steps] for g in p.gpus]
    [['rrcs', 's', 'r'], ['s', 'r', 'rrcs']]
    """
    chains = [tuple(int(r) for r in chain) for chain in chains]
    if not chains:
        raise InvalidInstanceError("tree_program: give at least one chain")
    m = len(chains[0])
    for chain in chains:
        if m < 1 or sorted(chain) != list(range(m)):
            raise InvalidInstanceError(f"chain {chain} is not a permutation of local ranks "
                                       f"0..{max(m - 1, 0)}")
    if isinstance(pipeline, bool) or not isinstance(pipeline, int) or pipeline < 1:
        raise InvalidInstanceError(f"pipeline = {pipeline!r}; expected a whole number >= 1")
    trees = double_binary_tree(nodes)  # refuses nodes < 1
    n = nodes * m
    channels = 2 * len(chains)
    from collsynth.timing.runtime_model import check_simulated_steps

    check_simulated_steps(tree_program_min_steps(n, channels, pipeline),
                          f"the allreduce tree of {n} ranks on {channels} channel(s)")
    step = n * channels // math.gcd(n, channels)
    total = step * -(-channels * pipeline // step)
    share = total // channels

    def links(t: int, rank: int) -> tuple[int, list[int]]:
        """(parent, children) of ``rank`` in the tree of channel ``t``: the chain inside the
        node, the heads in the node tree, a head's chain child first."""
        chain = chains[t // 2]
        k, pos = divmod(rank, m)
        pos = chain.index(pos)
        children = [k * m + chain[pos + 1]] if pos + 1 < m else []
        if pos > 0:
            return k * m + chain[pos - 1], children
        up, downs = trees[t % 2][k]
        return (-1 if up == -1 else up * m + chain[0]), children + [d * m + chain[0]
                                                                     for d in downs]

    gpus = []
    for rank in range(n):
        blocks: list[list] = []   # [send, recv, chan, [(op, sb, so, db, do, depid, deps)]]

        def block(send: int, recv: int, chan: int) -> int:
            blocks.append([send, recv, chan, []])
            return len(blocks) - 1

        for t in range(channels):
            chunks = range(t * share, (t + 1) * share)
            parent, children = links(t, rank)
            # Up: the first child's sum is reduced with the own input into o, the next ones into
            # o, the last one is sent to the parent (rrs), or at the root reduced and sent back
            # down to that child (rrcs).
            last = -1
            if not children:
                if parent == -1:
                    b = block(-1, -1, t)
                    blocks[b][3] = [("cpy", "i", c, "o", c, -1, -1) for c in chunks]
                else:
                    b = block(parent, -1, t)
                    blocks[b][3] = [("s", "i", c, "i", c, -1, -1) for c in chunks]
            for index, child in enumerate(children):
                src = "i" if index == 0 else "o"
                final = index == len(children) - 1
                op = "rrc" if not final else ("rrs" if parent != -1 else "rrcs")
                send = -1 if not final else (parent if parent != -1 else child)
                b = block(send, child, t)
                blocks[b][3] = [(op, src, c, "o", c, last, j if last != -1 else -1)
                                for j, c in enumerate(chunks)]
                last = b
            # Down: receive the sum from the parent and forward it to the first child (rcs),
            # then send it to the others; the root sends what its last rrcs stored.
            if parent != -1:
                b = block(children[0] if children else -1, parent, t)
                blocks[b][3] = [("rcs" if children else "r", "o", c, "o", c, -1, -1)
                                for c in chunks]
                others, source = children[1:], b
            else:
                others, source = children[:-1], last
            for child in others:
                b = block(child, -1, t)
                blocks[b][3] = [("s", "o", c, "o", c, source, j) for j, c in enumerate(chunks)]
        awaited = {(st[5], st[6]) for blk in blocks for st in blk[3] if st[5] != -1}
        tbs = tuple(
            ThreadBlock(b, send, recv, chan, tuple(
                XmlStep(s, op, sb, so, db, do, 1, depid, deps, int((b, s) in awaited))
                for s, (op, sb, so, db, do, depid, deps) in enumerate(steps)))
            for b, (send, recv, chan, steps) in enumerate(blocks))
        gpus.append(GpuProgram(rank, total, total, 0, tbs))
    program = Program(name=name or "tree-allreduce", proto=protocol, nchannels=channels,
                      nchunksperloop=total, ngpus=n, coll="allreduce", inplace=0,
                      gpus=tuple(gpus), outofplace=1, min_bytes=0)
    return program if runtime is None else _for_runtime(program, runtime)


def runtime_tree(topology: "Topology", channels: int | None = None
                 ) -> tuple[int, tuple[tuple[int, ...], ...]]:
    """``(nodes, chains)`` of the runtime's tree on ``topology``, for :func:`tree_program`: one
    chain per ring of :func:`runtime_rings` (``channels`` as there, at most 16 so that the two
    trees of each fit msccl's 32 channels), following the ring's path through a node, its entry
    rank the head (so the chains' heads, and their NICs, differ as the rings' do); one node
    when the topology is not composed of several.

    Raises
    ------
    InvalidInstanceError
        No ring through every rank, or a link the tree needs (each chain link both ways, head
        to head between nodes) is missing.
    """
    rings = runtime_rings(topology, channels)[:16]
    n = topology.num_ranks
    layout = topology.layout
    multi = layout is not None and layout.multi_node
    nodes, m = (layout.nodes, layout.ranks_per_node) if multi else (1, n)
    chains = []
    for ring in rings:
        start = 0
        if multi:
            start = next(i for i in range(n) if ring[i] // m == 0 and ring[i - 1] // m != 0)
        chains.append(tuple(ring[(start + i) % n] % m for i in range(m)))
    links = topology.links
    trees = double_binary_tree(nodes)
    for chain in chains:
        pairs = [(k * m + a, k * m + b) for k in range(nodes) for a, b in zip(chain, chain[1:])]
        pairs += [(k * m + chain[0], d * m + chain[0]) for tree in trees
                  for k, (_, downs) in enumerate(tree) for d in downs]
        for a, b in pairs:
            if not (links[a][b] and links[b][a]):
                raise NoTreeError(
                    f"topology {topology.name!r} has no link both ways between ranks {a} and "
                    f"{b}; the runtime's tree cannot run")
    return nodes, tuple(chains)


# -- NCCL's PAT (allgather and reduce-scatter at one GPU per node) -------------------------------


def pat_steps(ranks: int) -> tuple[tuple[int, int], ...]:
    """``(distance, blocks)`` of each step of the log-step allgather PAT varies (Bruck's): a
    rank holding ``h`` blocks (its own and the next ``h - 1``) sends ``min(h, ranks - h)`` of
    them to the rank ``h`` before it; ``ceil(log2(ranks))`` steps, ``ranks - 1`` blocks sent.

    >>> pat_steps(8), pat_steps(6)
    (((1, 1), (2, 2), (4, 4)), ((1, 1), (2, 2), (4, 2)))
    """
    if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 1:
        raise InvalidInstanceError(f"ranks = {ranks!r}; expected a whole number >= 1")
    steps, held = [], 1
    while held < ranks:
        count = min(held, ranks - held)
        steps.append((held, count))
        held += count
    return tuple(steps)


def pat_program(collective: str, ranks: int, channels: int = 1, *, protocol: str = "Simple",
                name: str | None = None, runtime: str | None = None) -> Program:
    """NCCL's PAT ``collective`` (allgather or reduce-scatter) over ``ranks`` ranks (one GPU
    per node) as a Program: its log-step schedule (:func:`pat_steps`).

    Allgather: at the step of distance ``d`` every rank ``r`` sends the blocks it holds,
    ``r, r + 1, ...`` (its own from its input), to ``r - d`` and receives ``r + d, ...`` from
    ``r + d``; each received block is forwarded at a later step after it arrives (a
    dependency). Reduce-scatter is the same schedule reversed: the steps last to first, each
    partial sum sent back along the way its block came, reduced into the receiver's input, the
    rank's own block last into its output. One thread block per (rank, step, channel); channel
    ``c`` carries chunk ``c`` of every block, one step per block. ``runtime``: as for
    :func:`ring_program`.

    Raises
    ------
    UnknownNameError
        A collective other than allgather and reduce-scatter.
    InvalidInstanceError, InputTooLargeError
        Bad ranks or channels, or more steps than the program model simulates.

    >>> p = pat_program("allgather", 4)
    >>> [[st.type for st in tb.steps] for tb in p.gpus[0].threadblocks]
    [['cpy'], ['s', 'r'], ['s', 's', 'r', 'r']]
    """
    from collsynth.runtimes import check_channels
    from collsynth.timing.runtime_model import check_simulated_steps

    key = canonical_name(collective)
    if key not in PAT_COLLECTIVES:
        raise UnknownNameError(f"no PAT program for {collective!r}; there is one for "
                               f"{', '.join(PAT_COLLECTIVES)}")
    check_channels(channels)
    n = ranks
    if isinstance(n, bool) or not isinstance(n, int) or n < 2:
        raise InvalidInstanceError(f"PAT on {n!r} ranks: expected a whole number >= 2")
    schedule = pat_steps(n)
    check_simulated_steps(n * channels * 2 * n, f"the PAT {key} of {n} ranks on {channels} "
                                                "channel(s)")

    def chunk(block: int, c: int) -> int:   # rank ``block``'s part on channel c
        return block % n * channels + c

    gpus = []
    for rank in range(n):
        blocks: list[ThreadBlock] = []
        for c in range(channels):
            first = len(blocks)
            if key == "allgather":
                tbs = _pat_allgather(rank, n, c, schedule, chunk, first)
            else:
                tbs = _pat_reduce_scatter(rank, n, c, schedule, chunk, first)
            blocks.extend(ThreadBlock(first + t, send, recv, c, steps)
                          for t, (send, recv, steps) in enumerate(tbs))
        i_chunks, o_chunks = (channels, n * channels) if key == "allgather" else \
            (n * channels, channels)
        gpus.append(GpuProgram(rank, i_chunks, o_chunks, 0, tuple(blocks)))
    program = Program(name=name or f"pat-{key}", proto=protocol, nchannels=channels,
                      nchunksperloop=n * channels, ngpus=n, coll=key, inplace=0,
                      gpus=tuple(gpus), outofplace=1, min_bytes=0)
    return program if runtime is None else _for_runtime(program, runtime)


def _pat_allgather(rank: int, n: int, c: int, schedule: Sequence[tuple[int, int]],
                   chunk, first: int) -> list[tuple[int, int, tuple[XmlStep, ...]]]:
    """``(send, recv, steps)`` of the thread blocks of ``rank`` on channel ``c``: the copy of
    its own block, then one per step of the schedule (tb ids from ``first``)."""
    got: dict[int, tuple[int, int]] = {}     # block -> (tb, step) that received it
    raw: list[tuple[int, int, list[list]]] = [(-1, -1, [["cpy", "i", c, "o", chunk(rank, c),
                                                         -1, -1]])]
    for t, (distance, count) in enumerate(schedule, start=1):
        steps: list[list] = []
        for i in range(count):
            block = (rank + i) % n
            if i == 0:
                steps.append(["s", "i", c, "o", chunk(block, c), -1, -1])
            else:
                steps.append(["s", "o", chunk(block, c), "o", chunk(block, c),
                              *_after(got[block], first)])
        for i in range(count):
            block = (rank + distance + i) % n
            got[block] = (t, len(steps))
            steps.append(["r", "o", chunk(block, c), "o", chunk(block, c), -1, -1])
        raw.append(((rank - distance) % n, (rank + distance) % n, steps))
    return _with_hasdep(raw, first)


def _pat_reduce_scatter(rank: int, n: int, c: int, schedule: Sequence[tuple[int, int]],
                        chunk, first: int) -> list[tuple[int, int, tuple[XmlStep, ...]]]:
    """The allgather's schedule reversed: at the step of distance ``d`` (last step first) the
    rank sends its partial sums of blocks ``r + d, ...`` to ``r + d`` and reduces those of
    blocks ``r, r + 1, ...`` from ``r - d`` into its input (its own block, at the last step,
    into its output)."""
    last: dict[int, tuple[int, int]] = {}    # block -> (tb, step) of its latest reduction
    raw: list[tuple[int, int, list[list]]] = []
    for t, (distance, count) in enumerate(reversed(schedule)):
        final = t == len(schedule) - 1
        steps: list[list] = []
        for i in range(count):
            block = (rank + distance + i) % n
            steps.append(["s", "i", chunk(block, c), "i", chunk(block, c),
                          *_after(last.get(block), first)])
        for i in range(count):
            block = (rank + i) % n
            own = final and i == 0
            after = _after(last.get(block), first)
            last[block] = (t, len(steps))
            steps.append(["rrc", "i", chunk(block, c), "o" if own else "i",
                          c if own else chunk(block, c), *after])
        raw.append(((rank + distance) % n, (rank - distance) % n, steps))
    return _with_hasdep(raw, first)


def _after(step: tuple[int, int] | None, first: int) -> tuple[int, int]:
    """``(depid, deps)`` of a dependency on ``(tb, step)`` (tb counted from ``first``)."""
    return (-1, -1) if step is None else (first + step[0], step[1])


def _with_hasdep(raw: Sequence[tuple[int, int, list[list]]], first: int
                 ) -> list[tuple[int, int, tuple[XmlStep, ...]]]:
    """The thread blocks with ``hasdep`` set on every step another one waits for."""
    awaited = {(depid, deps) for _, _, steps in raw for *_, depid, deps in steps if depid >= 0}
    return [(send, recv, tuple(XmlStep(s, op, sb, so, db, do, 1, depid, deps,
                                       int((first + t, s) in awaited))
                               for s, (op, sb, so, db, do, depid, deps) in enumerate(steps)))
            for t, (send, recv, steps) in enumerate(raw)]


# -- NCCL's grouped send/recv (alltoall) -------------------------------------------------------


def p2p_channel(delta: int, part: int, channels: int) -> int:
    """The channel NCCL runs part ``part`` of the p2p operations of round ``delta`` on, out of
    ``channels`` (a power of two): the round's base bit-reversed, plus the part
    (``ncclP2pChannelBaseForRound``, ``ncclP2pChannelForPart``, NCCL 2.28+ on one node).

    >>> [p2p_channel(d, 0, 32) for d in range(4)], p2p_channel(1, 3, 32)
    ([0, 16, 8, 24], 19)
    """
    bits = max(0, channels.bit_length() - 1)
    base = int(format(delta % channels, f"0{bits}b")[::-1], 2) if bits else 0
    return (base + part) % channels


def p2p_program(collective: str, ranks: int, parts: int = 1, *, channels: int | None = None,
                protocol: str = "Simple", name: str | None = None,
                runtime: str | None = None) -> Program:
    """NCCL's ``collective`` run as grouped send/recv (alltoall: nccl-tests' ``alltoall_perf``,
    one ``ncclSend`` and one ``ncclRecv`` per peer) as a Program.

    At round ``d`` (1 .. ranks - 1) every rank ``r`` sends its block for ``r + d`` and receives
    the block of ``r - d``; its own block is copied. Each block is split in ``parts`` parts,
    part ``k`` of round ``d`` on channel :func:`p2p_channel` of ``channels`` (default: the
    fewest powers of two that hold ``ranks x parts``). A send and a receive are separate thread
    blocks (NCCL runs them on separate warps of one work); every round runs at once, as NCCL's
    one batch of at most 8 works per channel does when the rounds fall on distinct channels.
    ``runtime``: as for :func:`ring_program`. docs/runtime-model.md, "Grouped send/recv".

    Raises
    ------
    UnknownNameError
        A collective other than alltoall.
    InvalidInstanceError, InputTooLargeError
        Bad ranks, parts or channels, or more steps than the program model simulates.

    >>> p = p2p_program("alltoall", 4, 2)
    >>> [(tb.send, tb.recv, tb.chan) for tb in p.gpus[0].threadblocks][:3]
    [(-1, -1, 0), (1, -1, 4), (-1, 3, 4)]
    """
    from collsynth.timing.runtime_model import check_simulated_steps

    key = canonical_name(collective)
    if key not in P2P_COLLECTIVES:
        raise UnknownNameError(f"no grouped send/recv program for {collective!r}; there is one "
                               f"for {', '.join(P2P_COLLECTIVES)}")
    n = ranks
    if isinstance(n, bool) or not isinstance(n, int) or n < 2:
        raise InvalidInstanceError(f"grouped send/recv on {n!r} ranks: expected a whole "
                                   "number >= 2")
    if isinstance(parts, bool) or not isinstance(parts, int) or parts < 1:
        raise InvalidInstanceError(f"grouped send/recv in {parts!r} parts per peer: expected a "
                                   "whole number >= 1")
    if channels is None:
        channels = 1 << max(0, (n * parts - 1).bit_length())
    if isinstance(channels, bool) or not isinstance(channels, int) or channels < 1 \
            or channels & (channels - 1):
        raise InvalidInstanceError(f"grouped send/recv on {channels!r} channels: expected a "
                                   "power of two")
    check_simulated_steps(n * (2 * (n - 1) + 1) * parts,
                          f"the grouped send/recv {key} of {n} ranks in {parts} part(s)")

    def chunk(peer: int, k: int) -> int:   # the part k of the block for (or from) ``peer``
        return peer * parts + k

    gpus = []
    for rank in range(n):
        copy = tuple(XmlStep(k, "cpy", "i", chunk(rank, k), "o", chunk(rank, k), 1)
                     for k in range(parts))
        blocks = [ThreadBlock(0, -1, -1, 0, copy)]
        for d in range(1, n):
            to, came = (rank + d) % n, (rank - d) % n
            for k in range(parts):
                ch = p2p_channel(d, k, channels)
                blocks.append(ThreadBlock(len(blocks), to, -1, ch, (
                    XmlStep(0, "s", "i", chunk(to, k), "o", chunk(rank, k), 1),)))
                blocks.append(ThreadBlock(len(blocks), -1, came, ch, (
                    XmlStep(0, "r", "i", chunk(rank, k), "o", chunk(came, k), 1),)))
        gpus.append(GpuProgram(rank, n * parts, n * parts, 0, tuple(blocks)))
    highest = max(tb.chan for g in gpus for tb in g.threadblocks)
    program = Program(name=name or f"p2p-{key}", proto=protocol, nchannels=highest + 1,
                      nchunksperloop=n * parts, ngpus=n, coll=key, inplace=0,
                      gpus=tuple(gpus), outofplace=1, min_bytes=0)
    return program if runtime is None else _for_runtime(program, runtime)
