"""How MSCCL++'s executor sets a plan up, and the static rules it depends on.

Channels are numbered per type in the order a GPU lists them; the k-th channel of a type from
rank ``a`` to rank ``b`` is connected to the k-th one from ``b`` to ``a`` (the executor's
per-peer connection tags; a side with fewer gets unusable stubs). A threadblock's ``channels``
and ``remote_buffer_refs`` give the tables its operations index. :func:`load_plan` resolves
all of it and collects the rules a plan breaks before running (``docs/mscclpp.md``, section
"What collsynth checks").
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from collsynth.export.check import Problem
from collsynth.export.mscclpp.limits import MSCCLPP, PLAN_PROTOCOLS
from collsynth.export.mscclpp.model import BufferRef, GpuPlan, Operation, Plan, Threadblock

__all__ = ["SwitchGroup", "LoadedThreadblock", "LoadedPlan", "load_plan", "op_name",
           "PACKET_READS", "REMOTE_WRITERS"]

#: Operations whose every ``src_buff`` after the first (or the only one) is read as packets
#: from the scratch buffer.
PACKET_READS = frozenset({"rppkt", "respkt", "repkt", "recpkt", "recspkt", "upkt", "gstorepkt"})
#: Operations that write remote buffers through a channel.
REMOTE_WRITERS = frozenset({"put", "pws", "pwsf", "res", "rres", "ppkt", "rppkt", "respkt",
                            "recspkt"})
_SIGNALS = frozenset({"signal", "rlxsignal"})
_WAITS = frozenset({"wait", "rlxwait"})

# Per operation: the kinds of its src_buff and dst_buff entries by position (L local, R remote,
# S switch; a trailing "*" repeats the last kind any number of times, including none).
_SHAPES: dict[str, tuple[str, str]] = {
    "put": ("L*", "R*"), "pws": ("L*", "R*"), "pwsf": ("L*", "R*"), "get": ("R*", "L*"),
    "copy": ("L", "L"), "re": ("L*", "L"), "res": ("L*", "LR*"), "rre": ("LR*", "L"),
    "rres": ("LR*", "LR*"), "ppkt": ("L*", "R*"), "rppkt": ("L", "R*"), "respkt": ("L*", "LR*"),
    "repkt": ("L*", "L"), "recpkt": ("L*", "LL"), "recspkt": ("L*", "LLR*"), "upkt": ("L", "L"),
    "cpkt": ("L", "L"), "glres": ("S", "S"), "gstore": ("L", "S"), "gstorepkt": ("L", "S"),
}
_KIND_LETTER = {"local": "L", "remote": "R", "switch": "S"}
_KIND_WORD = {"L": "a local buffer ('type')", "R": "a remote buffer ('buffer_id')",
              "S": "a switch channel ('switch_channel_id')"}


def op_name(rank: int, tb: int, path: str) -> str:
    """``rank R tb T op P`` (``P`` is ``5`` or ``5.2`` inside a pipeline)."""
    return f"rank {rank} tb {tb} op {path}"


@dataclass(frozen=True)
class SwitchGroup:
    """One switch channel of a rank: a multicast over ``buffer_type`` of ``ranks``."""

    buffer_type: str
    ranks: tuple[int, ...]


@dataclass
class LoadedThreadblock:
    """A threadblock with its tables: channel type -> the rank's channel per local position;
    access channel type -> remote buffer id per local position; switch group per position."""

    rank: int
    tb: Threadblock
    channels: dict[str, list[int]] = field(default_factory=dict)
    remote: dict[str, list[int]] = field(default_factory=dict)

    @property
    def id(self) -> int:
        return self.tb.id


@dataclass
class LoadedPlan:
    """A plan as the executor sets it up, and the static problems found on the way.

    ``peers[(rank, type)]`` lists the peer of each channel of that type; ``paired[(rank, type,
    k)]`` is the peer's channel (its index) connected to channel ``k``, or ``None`` for a stub;
    ``switch[rank]`` the switch channels. ``executable`` is false when the plan is too broken
    to run at all.
    """

    plan: Plan
    threadblocks: dict[int, list[LoadedThreadblock]]
    peers: dict[tuple[int, str], list[int]]
    paired: dict[tuple[int, str, int], int | None]
    switch: dict[int, list[SwitchGroup]]
    problems: list[Problem]
    executable: bool = True

    @property
    def n(self) -> int:
        return len(self.plan.gpus)


def load_plan(plan: Plan, *, ranks_per_node: int | None = None) -> LoadedPlan:
    """Resolve ``plan``'s tables and check its static rules (no execution).

    ``ranks_per_node``, when known, adds the rules that need it: memory and switch channels
    stay within a node.
    """
    loaded = LoadedPlan(plan, {}, {}, {}, {}, [])
    _Rules(loaded, ranks_per_node).run()
    return loaded


class _Rules:
    def __init__(self, loaded: LoadedPlan, ranks_per_node: int | None) -> None:
        self.loaded = loaded
        self.plan = loaded.plan
        self.rpn = ranks_per_node

    def add(self, kind: str, message: str, *, fatal: bool = False) -> None:
        self.loaded.problems.append(Problem(kind, message))
        if fatal:
            self.loaded.executable = False

    def run(self) -> None:
        plan = self.plan
        if plan.protocol not in PLAN_PROTOCOLS:
            self.add("structure", f"protocol={plan.protocol!r} is not one of "
                                  f"{', '.join(PLAN_PROTOCOLS)} (the parser reads it as Simple; the "
                                  "DSL never writes it)")
        if plan.num_threads_per_block > MSCCLPP.max_threads_per_block:
            self.add("limit", f"num_threads_per_block={plan.num_threads_per_block}: the kernel "
                              f"launches at most {MSCCLPP.max_threads_per_block} threads per "
                              "block", fatal=True)
        if plan.min_message_size > plan.max_message_size:
            self.add("limit", f"min_message_size={plan.min_message_size} > max_message_size="
                              f"{plan.max_message_size}: no message size selects the plan")
        for r, gpu in enumerate(plan.gpus):
            if gpu.id != r:
                self.add("structure", f"gpus[{r}] has id {gpu.id}: the executor reads gpus[rank] "
                                      "and refuses it ('GPU rank does not match')", fatal=True)
        if not self.loaded.executable:
            return
        for gpu in plan.gpus:
            self.gpu(gpu)
        self.pair_channels()
        self.switch_groups()

    # -- one GPU ---------------------------------------------------------------------------

    def gpu(self, gpu: GpuPlan) -> None:
        r = gpu.id
        if gpu.input_chunks == 0 and gpu.output_chunks == 0:
            self.add("structure", f"rank {r}: input_chunks=0 and output_chunks=0: the executor "
                                  "cannot size a chunk ('Output or Input chunks must be greater "
                                  "than 0')", fatal=True)
        for t in ("memory", "port"):
            self.loaded.peers[(r, t)] = []
        self.loaded.switch[r] = []
        for k, ch in enumerate(gpu.channels):
            if ch.channel_type == "switch":
                for group in ch.rank_groups:
                    if r not in group.ranks:
                        self.add("connection", f"rank {r}: switch channel {k} is over ranks "
                                               f"{list(group.ranks)}, which do not include it")
                    self.loaded.switch[r].append(SwitchGroup(ch.buffer_type or "i", group.ranks))
            elif ch.channel_type in ("memory", "port"):
                for p in ch.connected_to:
                    if p == r:
                        self.add("connection", f"rank {r}: a {ch.channel_type} channel to "
                                               "itself", fatal=True)
                    elif (self.rpn and ch.channel_type == "memory"
                          and p // self.rpn != r // self.rpn):
                        self.add("connection", f"rank {r}: a memory channel to rank {p} on "
                                               f"another node ({self.rpn} ranks per node): "
                                               "memory channels need peer-to-peer memory; use "
                                               "a port channel")
                    self.loaded.peers[(r, ch.channel_type)].append(p)
        for k, rb in enumerate(gpu.remote_buffers):
            if rb.rank == r:
                self.add("structure", f"rank {r}: remote_buffers[{k}] is its own buffer; the "
                                      "executor would send its memory to itself", fatal=True)
            bad = [t for t in rb.access_channel_types if t not in ("memory", "port")]
            if bad or not rb.access_channel_types:
                self.add("structure", f"rank {r}: remote_buffers[{k}] has access channel types "
                                      f"{list(rb.access_channel_types)}; expected memory and/or "
                                      "port", fatal=True)
        tbs = []
        for position, tb in enumerate(gpu.threadblocks):
            if tb.id != position:
                self.add("structure", f"rank {r}: threadblocks[{position}] has id {tb.id}: the "
                                      "executor runs threadblocks in list order but binds "
                                      "channels by id, so ids must be 0, 1, ... in order",
                         fatal=True)
            tbs.append(self.threadblock(gpu, tb))
        self.loaded.threadblocks[r] = tbs

    def threadblock(self, gpu: GpuPlan, tb: Threadblock) -> LoadedThreadblock:
        r = gpu.id
        lt = LoadedThreadblock(r, tb, {"memory": [], "port": [], "switch": []},
                               {"memory": [], "port": []})
        counts = {"memory": len(self.loaded.peers[(r, "memory")]),
                  "port": len(self.loaded.peers[(r, "port")]),
                  "switch": len(self.loaded.switch[r])}
        where = f"rank {r} tb {tb.id}"
        for group in tb.channels:
            if group.channel_type == "none":
                continue
            for cid in group.channel_ids:
                if cid >= counts[group.channel_type]:
                    self.add("structure", f"{where}: {group.channel_type} channel {cid} does "
                                          f"not exist (rank {r} has "
                                          f"{counts[group.channel_type]})", fatal=True)
                lt.channels[group.channel_type].append(cid)
        for t, ids in lt.channels.items():
            if len(ids) > MSCCLPP.max_channels_per_threadblock:
                self.add("limit", f"{where}: {len(ids)} {t} channels; a threadblock holds at "
                                  f"most {MSCCLPP.max_channels_per_threadblock} per type",
                         fatal=True)
        for refs in tb.remote_buffer_refs:
            t = refs.access_channel_type
            if t not in ("memory", "port"):
                self.add("structure", f"{where}: remote_buffer_refs for access channel type "
                                      f"{t!r}; only memory and port reach remote buffers",
                         fatal=True)
                continue
            for bid in refs.remote_buffer_ids:
                if bid >= len(gpu.remote_buffers):
                    self.add("structure", f"{where}: remote buffer {bid} does not exist (rank "
                                          f"{r} has {len(gpu.remote_buffers)})", fatal=True)
                elif t not in gpu.remote_buffers[bid].access_channel_types:
                    self.add("structure", f"{where}: remote buffer {bid} is referenced for {t} "
                                          "access but its access_channel_types are "
                                          f"{list(gpu.remote_buffers[bid].access_channel_types)}"
                                          ": the executor would address another buffer",
                             fatal=True)
                lt.remote[t].append(bid)
        for t, ids in lt.remote.items():
            if len(ids) > MSCCLPP.max_remote_buffers_per_threadblock:
                self.add("limit", f"{where}: {len(ids)} remote buffers for {t} access; a "
                                  "threadblock holds at most "
                                  f"{MSCCLPP.max_remote_buffers_per_threadblock}", fatal=True)
        flat = sum(1 + len(op.ops) for op in tb.ops)
        if flat > MSCCLPP.max_operations_per_threadblock:
            self.add("limit", f"{where}: {flat} operations (pipeline bodies included); the "
                              f"executor holds at most {MSCCLPP.max_operations_per_threadblock} "
                              "per threadblock ('exceeding device execution plan support')",
                     fatal=True)
        for pos, op in enumerate(tb.ops):
            self.operation(gpu, lt, op, str(pos))
            for k, inner in enumerate(op.ops):
                self.operation(gpu, lt, inner, f"{pos}.{k}")
        return lt

    # -- one operation ------------------------------------------------------------------------

    def operation(self, gpu: GpuPlan, lt: LoadedThreadblock, op: Operation, path: str) -> None:
        r = gpu.id
        where = self._where = op_name(r, lt.id, path) + f" ({op.name})"
        fail = lambda message: self.add("structure", f"{where}: {message}", fatal=True)  # noqa
        name = op.name
        if len(op.channel_ids) > MSCCLPP.max_channels_per_operation:
            self.add("limit", f"{where}: {len(op.channel_ids)} channel ids; an operation holds "
                              f"at most {MSCCLPP.max_channels_per_operation}", fatal=True)
        for what, refs in (("src_buff", op.src), ("dst_buff", op.dst)):
            if len(refs) > MSCCLPP.max_buffers_per_operation:
                self.add("limit", f"{where}: {len(refs)} {what} entries; an operation holds at "
                                  f"most {MSCCLPP.max_buffers_per_operation}", fatal=True)
        if name in _SIGNALS | _WAITS or name == "flush":
            if op.channel_type not in (("port",) if name == "flush" else ("memory", "port")):
                fail(f"channel_type={op.channel_type!r}; expected "
                     + ("port" if name == "flush" else "memory or port"))
                return
            if not op.channel_ids:
                fail("no channel_ids: the operation does nothing")
            for cid in op.channel_ids:
                if cid >= len(lt.channels[op.channel_type]):
                    fail(f"channel id {cid} is not one of the threadblock's "
                         f"{len(lt.channels[op.channel_type])} {op.channel_type} channels")
            table = lt.channels[op.channel_type]
            resolved = [table[c] for c in op.channel_ids if c < len(table)]
            if name in _WAITS and len(set(resolved)) < len(resolved):
                fail("waits twice on one channel in one operation: two threads poll one "
                     "semaphore and can both pass on one signal")
            return
        if name == "barrier":
            if op.barrier_id is None or op.num_threadblocks is None:
                fail("needs barrier_id and num_threadblocks")
            elif op.barrier_id >= MSCCLPP.max_barriers:
                self.add("limit", f"{where}: barrier_id={op.barrier_id}; the executor has "
                                  f"{MSCCLPP.max_barriers} barriers", fatal=True)
            elif op.num_threadblocks > len(gpu.threadblocks):
                fail(f"num_threadblocks={op.num_threadblocks} but rank {r} has "
                     f"{len(gpu.threadblocks)} threadblocks: the barrier never completes")
            return
        if name in ("sem_acquire", "sem_release"):
            if not op.semaphore_ids:
                fail("no semaphore_ids: the operation does nothing")
            if len(op.semaphore_ids) > MSCCLPP.max_semaphores_per_operation:
                self.add("limit", f"{where}: {len(op.semaphore_ids)} semaphores; an operation "
                                  f"holds at most {MSCCLPP.max_semaphores_per_operation}",
                         fatal=True)
            for sid in op.semaphore_ids:
                if sid >= len(gpu.semaphores):
                    fail(f"semaphore {sid} does not exist (rank {r} has {len(gpu.semaphores)})")
            return
        if name == "pipeline":
            if not op.ops:
                fail("an empty pipeline")
            return
        if name == "nop":
            return
        if name not in _SHAPES:
            fail("not an operation the executor runs")
            return
        self.operands(gpu, lt, op, fail)

    def operands(self, gpu: GpuPlan, lt: LoadedThreadblock, op: Operation, fail) -> None:
        for what, refs, shape in (("src_buff", op.src, _SHAPES[op.name][0]),
                                  ("dst_buff", op.dst, _SHAPES[op.name][1])):
            repeat = shape.endswith("*")
            fixed = shape.rstrip("*")
            least = len(fixed) - (1 if repeat and len(fixed) > 1 else 0)
            if len(refs) < max(least, 1):
                fail(f"{what} has {len(refs)} entries; expected at least {max(least, 1)}")
                return
            for k, ref in enumerate(refs):
                if k < len(fixed):
                    allowed = fixed[k]
                elif repeat:
                    allowed = fixed[-1]
                else:
                    fail(f"{what}[{k}]: the operation reads only {len(fixed)} entr"
                         f"{'y' if len(fixed) == 1 else 'ies'} (the executor ignores the rest)")
                    return
                letter = _KIND_LETTER[ref.kind]
                if letter != allowed:
                    fail(f"{what}[{k}] is {_KIND_WORD[letter]}; expected {_KIND_WORD[allowed]}")
                    return
                self.reference(op, lt, ref, f"{what}[{k}]", fail)
        remote = [ref for ref in op.src + op.dst if ref.kind == "remote"]
        if remote and op.channel_type not in ("memory", "port"):
            fail(f"reaches remote buffers but channel_type={op.channel_type!r}")
        if op.channel_type == "port" and op.name not in ("put", "pws", "pwsf", "ppkt", "rppkt"):
            fail("only put, pws, pwsf, ppkt and rppkt run on port channels")
        if op.name in ("put", "pws", "pwsf", "ppkt") and len(op.src) != len(op.dst):
            fail(f"{len(op.src)} src_buff and {len(op.dst)} dst_buff entries; the executor pairs "
                 "them one to one")
        if op.name == "get" and len(op.src) != len(op.dst):
            fail(f"{len(op.src)} src_buff and {len(op.dst)} dst_buff entries; the executor pairs "
                 "them one to one")
        if op.channel_type == "port" and op.name != "rppkt" and len(op.channel_ids) < len(op.dst):
            fail(f"{len(op.dst)} destinations over port channels but {len(op.channel_ids)} "
                 "channel_ids; each destination needs its channel")
        if op.channel_type == "port" and op.name == "rppkt" and len(op.channel_ids) < len(op.dst):
            fail(f"{len(op.dst)} destinations over port channels but {len(op.channel_ids)} "
                 "channel_ids; each destination needs its channel")
        for cid in op.channel_ids:
            if op.channel_type in ("memory", "port") and cid >= len(lt.channels[op.channel_type]):
                fail(f"channel id {cid} is not one of the threadblock's "
                     f"{len(lt.channels[op.channel_type])} {op.channel_type} channels")
        if op.name in ("rppkt", "upkt") and op.src[0].type != "s":
            fail(f"src_buff[0] is buffer {op.src[0].type!r}, but the kernel reads packets from "
                 "the scratch buffer whatever the type says")
        if op.name in ("respkt", "repkt", "recpkt", "recspkt", "gstorepkt"):
            for k, ref in enumerate(op.src[1:], 1):
                if ref.type != "s":
                    fail(f"src_buff[{k}] is buffer {ref.type!r}, but the kernel reads packets "
                         "from the scratch buffer whatever the type says")

    def reference(self, op: Operation, lt: LoadedThreadblock, ref: BufferRef, what: str,
                  fail) -> None:
        if ref.kind == "remote":
            t = op.channel_type if op.channel_type in ("memory", "port") else None
            table = lt.remote.get(t or "", [])
            if t is not None and ref.buffer_id >= len(table):
                fail(f"{what}: buffer_id {ref.buffer_id} is not one of the threadblock's "
                     f"{len(table)} remote buffers for {t} access")
        elif ref.kind == "switch":
            if ref.switch_channel_id >= len(lt.channels["switch"]):
                fail(f"{what}: switch_channel_id {ref.switch_channel_id} is not one of the "
                     f"threadblock's {len(lt.channels['switch'])} switch channels")
        if ref.size == 0:   # harmless to the executor, surely not what was meant
            self.add("structure", f"{self._where}: {what} has size 0: the operation moves "
                                  "nothing")

    # -- across GPUs --------------------------------------------------------------------------

    def pair_channels(self) -> None:
        """Connect channels as the executor's per-peer tags do."""
        by_peer: dict[tuple[int, str, int], list[int]] = defaultdict(list)
        for (r, t), peers in self.loaded.peers.items():
            for k, p in enumerate(peers):
                by_peer[(r, t, p)].append(k)
        for (r, t, p), mine in by_peer.items():
            theirs = by_peer.get((p, t, r), [])
            for ordinal, k in enumerate(mine):
                self.loaded.paired[(r, t, k)] = theirs[ordinal] if ordinal < len(theirs) \
                    else None

    def switch_groups(self) -> None:
        n = len(self.plan.gpus)
        for r in range(n):
            for k, group in enumerate(self.loaded.switch.get(r, [])):
                if self.rpn and len({q // self.rpn for q in group.ranks}) > 1:
                    self.add("connection", f"rank {r}: switch channel {k} spans nodes "
                                           f"({self.rpn} ranks per node); multicast stays in "
                                           "one NVLink domain")
                for q in group.ranks:
                    if q == r:
                        continue
                    other = self.loaded.switch.get(q, [])
                    if k >= len(other) or other[k].ranks != group.ranks or \
                            other[k].buffer_type != group.buffer_type:
                        self.add("connection", f"rank {r}: switch channel {k} (ranks "
                                               f"{list(group.ranks)}, buffer "
                                               f"{group.buffer_type!r}) has no twin as rank "
                                               f"{q}'s switch channel {k}: the multicast setup, "
                                               "collective over the group, never completes",
                                 fatal=True)
                        return
