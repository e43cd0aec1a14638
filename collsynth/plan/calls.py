"""The traced calls a plan is made from: one adapter over :mod:`collsynth.trace`.

:func:`load_calls` is the one place that reads a trace directory
(:func:`collsynth.trace.read_trace`, which checks every field); what the planner keeps of each
call is in docs/plan.md.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Mapping

from collsynth.trace.records import dtype_bytes

__all__ = ["TracedCall", "TracedRun", "load_calls", "dtype_bytes"]

@dataclass(frozen=True)
class TracedCall:
    """One call as the planner sees it.

    ``rank`` is the global rank whose file it came from; ``group`` the global ranks of its
    process group, in group order (group rank ``i`` is ``group[i]``); ``root`` a *global* rank
    (``None`` for unrooted calls); ``size_bytes`` the nccl-tests size; ``element_size`` bytes per
    element (from the trace's ``raw.element_size``, else the dtype; ``None`` when unknown).
    ``uneven`` marks an alltoall with unequal split sizes (an alltoallv); ``error`` a call that
    raised.
    """

    rank: int
    seq: int
    kind: str
    size_bytes: int
    group: tuple[int, ...]
    function: str = ""
    dtype: str | None = None
    element_size: int | None = None
    op: str | None = None
    root: int | None = None
    peer: int | None = None
    uneven: bool = False
    duration_us: float | None = None
    error: str | None = None

    @property
    def signature(self) -> tuple[Any, ...]:
        """What identifies a call across iterations: kind, size, group, root."""
        return (self.kind, self.size_bytes, self.group, self.root)


@dataclass(frozen=True)
class TracedRun:
    """The calls of every traced rank: ``calls[rank]`` in the order the rank made them."""

    directory: str
    world_size: int
    calls: Mapping[int, tuple[TracedCall, ...]] = field(hash=False)
    backend: str | None = None

    @property
    def ranks(self) -> tuple[int, ...]:
        """The ranks with a trace file, in order."""
        return tuple(sorted(self.calls))


def load_calls(trace_dir: str | os.PathLike[str]) -> TracedRun:
    """Read the calls of the trace in ``trace_dir``.

    Raises
    ------
    FileFormatError
        A missing directory, a directory without ``rank-NNNNN.jsonl`` files, or a malformed
        file (the message names the file, the line and the field).
    InputTooLargeError
        A trace beyond :data:`collsynth.trace.records.MAX_TRACE_BYTES`.

    Examples
    --------
    >>> import json, pathlib, tempfile
    >>> header = {"type": "header", "format": "collsynth-trace", "version": 1, "rank": 0,
    ...           "world_size": 1, "backend": "nccl", "byte_convention": "nccl-tests",
    ...           "hostname": "h", "pid": 1, "torch_version": "2.13.0", "started_unix": 0.0,
    ...           "record_durations": False, "cross_node_only": False, "ranks_per_node": None}
    >>> call = {"type": "call", "seq": 0, "kind": "allreduce", "function": "all_reduce",
    ...         "bytes": 4096, "dtype": "float32", "op": "sum", "group": [0], "group_size": 1,
    ...         "root": None, "peer": None, "async_op": False, "site": None, "duration_us": None,
    ...         "cross_node": None, "batch": None, "error": None,
    ...         "raw": {"element_size": 4, "numel": {"tensor": 1024}}}
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> text = json.dumps(header) + "\\n" + json.dumps(call) + "\\n"
    >>> _ = (folder / "rank-00000.jsonl").write_text(text)
    >>> run = load_calls(folder)
    >>> run.world_size, run.ranks, run.calls[0][0].kind, run.calls[0][0].size_bytes
    (1, (0,), 'allreduce', 4096)
    """
    return _load_calls(trace_dir)


def _load_calls(trace_dir: str | os.PathLike[str]) -> TracedRun:
    """The one place that reads traces."""
    from collsynth.trace import read_trace

    trace = read_trace(trace_dir)
    calls = {entry.rank: tuple(_call(record) for record in entry.calls)
             for entry in trace.ranks}
    run = TracedRun(trace.directory, trace.world_size, calls, trace.ranks[0].header.backend)
    _check_agreement(run)
    return run


#: Collectives whose every rank passes the same byte count (nccl-tests' convention); an
#: alltoall's blocks may differ per rank (all_to_all_single's split sizes).
_SAME_BYTES = frozenset({"allreduce", "broadcast", "reduce", "allgather", "reduce_scatter"})


def _check_agreement(run: TracedRun) -> None:
    """Refuse a trace whose ranks disagree on a collective they issued together: its n-th call
    on a group must be the same kind (and root, reduction op, dtype, and bytes where every rank
    passes the same) on every traced rank of the group, which lists the group's ranks in the
    same order, as the runtimes require, and each traced rank of the group
    issues as many calls on it; a plan from one rank's view would deploy another collective
    than the others ran.

    Raises
    ------
    FileFormatError
        Naming both ranks' files, the calls' ``seq`` and the field that differs, or the rank
        that issued fewer calls on a group and how many each issued.
    """
    from collsynth.errors import FileFormatError

    first: dict[tuple[int, ...], tuple[int, list[TracedCall]]] = {}
    counts: dict[tuple[int, ...], dict[int, int]] = {}  # group -> traced rank -> its calls on it
    for rank in run.ranks:
        on_group: dict[tuple[int, ...], list[TracedCall]] = {}
        for call in run.calls[rank]:
            if call.peer is None and len(call.group) > 1:
                # by its members: a rank listing the group in another order is told as such,
                # not matched against another call of its own
                on_group.setdefault(tuple(sorted(call.group)), []).append(call)
        for group, mine in on_group.items():
            counts.setdefault(group, {})[rank] = len(mine)
        for group, mine in on_group.items():
            seen = first.setdefault(group, (rank, mine))
            if seen[0] == rank:
                continue
            for theirs, ours in zip(seen[1], mine):
                fields = [("group", list(theirs.group), list(ours.group)),
                          ("kind", theirs.kind, ours.kind)]
                if ours.kind == theirs.kind and ours.kind in _SAME_BYTES:
                    fields.append(("bytes", theirs.size_bytes, ours.size_bytes))
                if ours.kind == theirs.kind:
                    fields += [("root", theirs.root, ours.root), ("op", theirs.op, ours.op),
                               ("dtype", theirs.dtype, ours.dtype)]
                for name, a, b in fields:
                    if a != b:
                        raise FileFormatError(
                            os.path.join(run.directory, f"rank-{rank:05d}.jsonl"),
                            f"call seq {ours.seq} on group {list(group)}: field {name!r} is "
                            f"{b!r}, but rank {seen[0]}'s matching call (seq {theirs.seq}, "
                            f"rank-{seen[0]:05d}.jsonl) has {a!r}; the ranks of a group issue "
                            "the same collectives in the same order")
    # zip above stops at the shorter list: a rank file cut short (its process killed, its disk
    # full) would pass, and the plan would count only the calls of the ranks that went on
    for group, by_rank in counts.items():
        issued = {rank: by_rank.get(rank, 0) for rank in run.ranks if rank in group}
        most = max(issued, key=lambda r: (issued[r], -r))
        fewest = min(issued, key=lambda r: (issued[r], r))
        if issued[fewest] != issued[most]:
            raise FileFormatError(
                os.path.join(run.directory, f"rank-{fewest:05d}.jsonl"),
                f"{issued[fewest]} call(s) on group {list(group)}, but rank {most} "
                f"(rank-{most:05d}.jsonl) issued {issued[most]}; the ranks of a group issue "
                "the same collectives (was this file cut short, its process stopped early?)")


def _call(record: Any) -> TracedCall:
    raw = record.raw if isinstance(record.raw, Mapping) else {}
    # read_trace checked both: an element_size is a whole number >= 1 that agrees with the dtype
    width = raw.get("element_size") or dtype_bytes(record.dtype)
    return TracedCall(
        rank=record.rank, seq=record.seq, kind=record.kind, size_bytes=record.bytes,
        group=tuple(record.group), function=record.function, dtype=record.dtype,
        element_size=width, op=record.op, root=record.root, peer=record.peer,
        uneven=record.kind == "alltoall" and _uneven(raw), duration_us=record.duration_us,
        error=record.error)


def _uneven(raw: Mapping[str, Any]) -> bool:
    """An alltoall whose blocks differ: unequal ``*_split_sizes`` (all_to_all_single) or list
    arguments of different shapes (all_to_all).

    >>> _uneven({"input_split_sizes": [4, 3], "output_split_sizes": None})
    True
    >>> _uneven({"input_split_sizes": [2, 2], "shapes": {"input_tensor_list": [[2], [2]]}})
    False
    >>> _uneven({"shapes": {"input_tensor_list": [[2], [3]]}})
    True
    """
    for key in ("input_split_sizes", "output_split_sizes"):
        sizes = raw.get(key)
        if isinstance(sizes, list) and len(set(map(repr, sizes))) > 1:
            return True
    shapes = raw.get("shapes")
    if isinstance(shapes, Mapping):
        for value in shapes.values():
            if isinstance(value, list) and value and all(isinstance(s, list) for s in value) \
                    and len({repr(s) for s in value}) > 1:
                return True
    return False
