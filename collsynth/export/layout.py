"""Where every chunk of a collective starts and ends in MSCCL's buffers.

The details (formats, conventions, rules) are in docs/export.md; section numbers (§) refer to
docs/msccl-xml.md.

Examples
--------
>>> from collsynth.collective import allgather
>>> layout = collective_layout(allgather(4).split(2), "msccl")
>>> layout.coll, layout.nchunksperloop, layout.source(3, 7), layout.target(0, 7)
('allgather', 8, ('i', 1), ('o', 7))
>>> collective_layout(allgather(4), "msccl", inplace=True).source(3, 3)
('o', 3)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from collsynth.collective.model import Collective
from collsynth.collective.standard import MULTIROOT_COLLECTIVES, check_standard_conditions
from collsynth.errors import ExportError, InvalidCollectiveError
from collsynth.runtimes import xml_dialect

__all__ = ["Loc", "Layout", "collective_layout", "standard_kind"]

#: A buffer slot: ``("i" | "o" | "s", index)``.
Loc = tuple[str, int]


@dataclass(frozen=True)
class Layout:
    """The buffer layout of one collective for one runtime, in or out of place.

    Attributes
    ----------
    kind:
        ``allgather``, ``alltoall``, ..., ``gather``/``scatter`` (rccl's), ``custom_gather``/
        ``custom_scatter`` (msccl's custom versions) or ``custom``.
    coll:
        The ``coll`` attribute (the runtime's spelling).
    inplace:
        Whether slots are named for an in-place call.
    nchunksperloop:
        Chunks of the reference buffer.
    num_ranks:
        Ranks.
    sources, targets:
        Per rank, chunk -> slot where the chunk starts / must end.
    """

    kind: str
    coll: str
    inplace: bool
    nchunksperloop: int
    num_ranks: int
    sources: tuple[dict[int, Loc], ...]
    targets: tuple[dict[int, Loc], ...]
    _sizes: tuple[tuple[int, int], ...]  # per rank: real (input, output) chunks
    _alias: Callable[[int, Loc], Loc]

    def source(self, rank: int, chunk: int) -> Loc | None:
        """Slot where ``chunk`` starts on ``rank`` (``None``: it does not start there)."""
        return self.sources[rank].get(chunk)

    def target(self, rank: int, chunk: int) -> Loc | None:
        """Slot where ``chunk`` must end on ``rank`` (``None``: the rank does not need it)."""
        return self.targets[rank].get(chunk)

    def buffer_chunks(self, rank: int, buffer: str) -> int:
        """Real size in chunks of ``rank``'s input (``"i"``) or output (``"o"``) buffer.

        In place, the buffer that is not used to name slots has size 0 here (it is the same
        memory under the other name).
        """
        size_in, size_out = self._sizes[rank]
        if not self.inplace:
            return size_in if buffer == "i" else size_out
        canonical = self._alias(rank, ("o", 0))[0]
        if buffer != canonical:
            return 0
        return max(size_in, size_out)

    def in_place_slot(self, rank: int, loc: Loc) -> Loc:
        """The slot ``loc`` (named out of place) is in an in-place call (§8.2);
        scratch slots are unchanged."""
        if loc[0] == "s":
            return loc
        return self._alias(rank, loc)


def standard_kind(collective: Collective) -> str | None:
    """The standard collective ``collective`` is (split ``chunk_factor`` ways), or ``None``.

    A collective whose name is standard but whose pre/postconditions differ from the standard
    one raises :class:`ExportError`: the runtimes would run it as the standard collective (the
    check is :func:`~collsynth.collective.standard.check_standard_conditions`, which every
    collective read from a file has passed already). Only the canonical spelling of a name
    (``reduce_scatter``) counts as standard here; another spelling is exported as custom.
    """
    try:
        kind = check_standard_conditions(collective)
    except InvalidCollectiveError as exc:
        raise ExportError(str(exc)) from exc
    if kind != collective.name or kind in MULTIROOT_COLLECTIVES:
        return None
    return kind


def collective_layout(collective: Collective, runtime: str, *, inplace: bool = False) -> Layout:
    """The layout of ``collective`` (split, as in an algorithm) for ``runtime``.

    Raises
    ------
    ExportError
        When the runtime cannot express the collective (rccl: custom collectives; msccl:
        in-place alltoall), or a standard name has non-standard conditions.
    """
    rt = xml_dialect(runtime)
    n, C = collective.num_ranks, collective.chunk_factor
    kind = standard_kind(collective)
    if kind is None:
        if rt.coll_name("custom") is None:
            raise ExportError(f"{rt.name} has no custom collective: cannot export "
                              f"{collective.describe()} (export it for msccl)")
        kind = "custom"
    elif rt.coll_name(kind) is None:
        if kind in ("gather", "scatter") and rt.coll_name("custom") is not None:
            kind = f"custom_{kind}"
        else:
            raise ExportError(f"{rt.name} cannot express {kind}")
    if kind == "alltoall" and inplace and rt.name == "msccl":
        raise ExportError("msccl runs alltoall out of place only (its API rejects in-place "
                          "alltoall); export it out of place")
    coll = rt.coll_name("custom" if kind.startswith("custom") else kind)
    roots = collective.roots
    root = roots[0] if roots else -1
    sources: list[dict[int, Loc]] = [{} for _ in range(n)]
    targets: list[dict[int, Loc]] = [{} for _ in range(n)]

    def start(chunk: int, rank: int, loc: Loc) -> None:
        sources[rank][chunk] = loc

    def end(chunk: int, rank: int, loc: Loc) -> None:
        targets[rank][chunk] = loc

    if kind == "custom":
        N = collective.num_chunks
        sizes = [(N, N)] * n
        for c in range(N):
            for r in collective.precondition[c]:
                start(c, r, ("i", c))
            for r in collective.postcondition[c]:
                end(c, r, ("o", c))
    else:
        N, sizes = _sizes(kind, n, C)
        for c in range(collective.num_chunks):
            b, p = divmod(c, C)
            if kind == "allgather":
                start(c, b, ("i", p))
                for r in range(n):
                    end(c, r, ("o", c))
            elif kind == "alltoall":
                src, dst = divmod(b, n)
                start(c, src, ("i", dst * C + p))
                end(c, dst, ("o", src * C + p))
            elif kind in ("allreduce", "reduce"):
                for r in range(n):
                    start(c, r, ("i", c))
                for r in (range(n) if kind == "allreduce" else (root,)):
                    end(c, r, ("o", c))
            elif kind == "reduce_scatter":
                for r in range(n):
                    start(c, r, ("i", c))
                end(c, b, ("o", p))
            elif kind == "broadcast":
                start(c, root, ("i", c))
                for r in range(n):
                    end(c, r, ("o", c))
            elif kind in ("gather", "custom_gather"):
                start(c, b, ("i", p))
                end(c, root, ("o", c))
            elif kind in ("scatter", "custom_scatter"):
                start(c, root, ("i", c))
                end(c, b, ("o", p))
            else:  # pragma: no cover - every kind is handled above
                raise ExportError(f"no layout for {kind}")
    alias = _alias_function(kind, C)
    if inplace:
        sources = [{c: alias(r, loc) for c, loc in per.items()} for r, per in enumerate(sources)]
        targets = [{c: alias(r, loc) for c, loc in per.items()} for r, per in enumerate(targets)]
    return Layout(kind, coll, inplace, N, n, tuple(sources), tuple(targets), tuple(sizes), alias)


def _sizes(kind: str, n: int, C: int) -> tuple[int, list[tuple[int, int]]]:
    """nchunksperloop and per-rank real (input, output) sizes (§8.1)."""
    if kind in ("allreduce", "broadcast", "reduce"):
        return C, [(C, C)] * n
    if kind == "allgather":
        return n * C, [(C, n * C)] * n
    if kind == "reduce_scatter":
        return n * C, [(n * C, C)] * n
    if kind == "alltoall":
        return n * C, [(n * C, n * C)] * n
    if kind == "gather":  # rccl: mult 1, the root's output is n times the input
        return C, [(C, n * C)] * n
    if kind == "scatter":
        return C, [(n * C, C)] * n
    # msccl custom gather/scatter: count semantics of ncclCustomCollective (mult 1), both
    # buffers nchunksperloop = n*C chunks; only the first C of the small side are used.
    return n * C, [(n * C, n * C)] * n


def _alias_function(kind: str, C: int) -> Callable[[int, Loc], Loc]:
    """Map a slot named out of place to its in-place name (§8.2)."""
    if kind in ("allgather", "gather"):
        def alias(rank: int, loc: Loc) -> Loc:
            return ("o", rank * C + loc[1]) if loc[0] == "i" else loc
    elif kind in ("reduce_scatter", "scatter"):
        def alias(rank: int, loc: Loc) -> Loc:
            return ("i", rank * C + loc[1]) if loc[0] == "o" else loc
    else:  # same sizes: i[k] is o[k]; named i, as msccl-tools does
        def alias(rank: int, loc: Loc) -> Loc:
            return ("i", loc[1]) if loc[0] == "o" else loc
    return alias
