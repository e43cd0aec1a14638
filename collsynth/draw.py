"""Pictures of schedules: one panel per step on the topology's layout, or link-load heat maps.

:func:`draw_algorithm` draws an algorithm, :func:`draw_program` an MSCCL XML program on a topology
(one panel per level of its global schedule, :func:`collsynth.executor.schedule`), and
:func:`draw_file` either kind of file. Each returns a matplotlib ``Figure`` on the Agg canvas (no
pyplot, no display, no global state); :func:`save_drawing` writes it as PNG or SVG atomically.

In an arrow panel each arrow is one link used in that step: its colour is the base chunk it
carries (grey when it carries several, with their numbers beside it), its width grows with the
number of chunks, and it is solid when the link (or a bandwidth group it belongs to, such as a
switch port) is used at its capacity in that step, dashed when capacity is left; its gid (an
element id in SVG) is ``"send SRC->DST"``. Algorithms with more than :data:`MAX_ARROW_RANKS`
ranks or :data:`MAX_ARROW_SENDS` sends are drawn as heat maps: row = source rank, column =
destination rank, colour = chunks sent over that link.
"""

from __future__ import annotations

import io
import math
import os
import re
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Sequence

import numpy as np

from collsynth._files import read_head
from collsynth._parse import NumberTextError, number_text
from collsynth.algorithm.arrays import sends_as_arrays
from collsynth.algorithm.model import Algorithm
from collsynth.errors import (CollsynthError, FileFormatError, InputTooLargeError, expect_path,
                              shown_path)
from collsynth._output import check_output_file, write_bytes_atomic
from collsynth.topology.model import Topology

if TYPE_CHECKING:  # pragma: no cover - typing only
    from matplotlib.figure import Figure

    from collsynth.export.program import Program

__all__ = [
    "DrawError",
    "StepRangeError",
    "DrawOptions",
    "Layout",
    "StepTraffic",
    "MAX_ARROW_RANKS",
    "MAX_ARROW_SENDS",
    "FIGURE_SUFFIXES",
    "layout_of",
    "algorithm_traffic",
    "program_traffic",
    "draw_algorithm",
    "draw_program",
    "draw_file",
    "file_kind",
    "check_output_path",
    "save_drawing",
    "render_png",
    "parse_step_range",
]

#: Above this many ranks, ``style="auto"`` draws heat maps.
MAX_ARROW_RANKS = 32
#: Above this many sends (in the steps drawn), ``style="auto"`` draws heat maps.
MAX_ARROW_SENDS = 2000
#: Suffixes :func:`save_drawing` writes.
FIGURE_SUFFIXES = (".png", ".svg")
#: Most ranks and sends drawn as arrows even when asked for (beyond, the picture is unreadable
#: and slow to build).
_MAX_ARROW_RANKS_FORCED = 256
_MAX_ARROW_SENDS_FORCED = 50_000
#: Largest ``max_panels``.
_MAX_PANELS = 64
#: Heat-map matrices are at most this many cells a side (ranks are binned above it), so that a
#: cell covers at least two pixels of a panel (smaller cells alias into moire patterns).
_MAX_MATRIX_SIDE = 128
#: Colour of an arrow that carries several base chunks.
_SEVERAL = "#555555"
#: Distinct colours for up to this many base chunks; a continuous colour map above.
_QUALITATIVE = 18
#: Text sizes (points). Nothing is smaller than ``_TEXT_PT``: 9 pt is 9 pixels or more in a PNG
#: written at 72 dpi or more (``save_drawing`` writes 100 dpi by default).
_TEXT_PT = 9
_TITLE_PT = 10
#: Widest figure (inches) the arrow panels are laid out in; fewer columns beyond.
_MAX_FIGURE_WIDTH_IN = 16.0


class DrawError(CollsynthError, ValueError):
    """A drawing request that cannot be met (steps out of range, a program on the wrong
    topology, an XML program without a topology, an unsupported output format)."""


class StepRangeError(DrawError):
    """Steps asked for that the schedule does not have (``steps=(5, 9)`` of a 2-step one): the
    request is wrong, not the file (the command line makes it a usage error naming --steps)."""


@dataclass(frozen=True)
class DrawOptions:
    """How to draw.

    Parameters
    ----------
    steps:
        ``(first, last)``, both included, counting from 0 (as ``collsynth show`` numbers steps);
        ``None`` for every step.
    style:
        ``"arrows"``, ``"heatmap"``, or ``"auto"``: heat maps above :data:`MAX_ARROW_RANKS` ranks
        or :data:`MAX_ARROW_SENDS` sends in the steps drawn.
    aggregate:
        Heat maps only: ``True`` sums the steps into one matrix, ``False`` draws one per step,
        ``None`` aggregates when there are more steps than ``max_panels``.
    max_panels:
        Most panels in one figure; more arrow panels are refused (choose ``steps``).
    """

    steps: tuple[int, int] | None = None
    style: Literal["auto", "arrows", "heatmap"] = "auto"
    aggregate: bool | None = None
    max_panels: int = 16

    def __post_init__(self) -> None:
        if self.style not in ("auto", "arrows", "heatmap"):
            raise DrawError(f"style {self.style!r}: expected 'auto', 'arrows' or 'heatmap'")
        if self.steps is not None and not (
                isinstance(self.steps, (tuple, list)) and len(self.steps) == 2
                and _is_int(self.steps[0]) and _is_int(self.steps[1])
                and 0 <= self.steps[0] <= self.steps[1]):
            raise DrawError(f"steps {self.steps!r}: expected (first, last) with "
                            "0 <= first <= last")
        if not _is_int(self.max_panels) or not 1 <= self.max_panels <= _MAX_PANELS:
            raise DrawError(f"max_panels {self.max_panels!r}: expected an integer from 1 to "
                            f"{_MAX_PANELS}")


def _is_int(value: object) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def parse_step_range(text: str) -> tuple[int, int]:
    """``"A-B"`` or ``"A"`` as ``(A, B)`` (both included, from 0).

    >>> parse_step_range("0-2"), parse_step_range("3")
    ((0, 2), (3, 3))
    """
    try:
        number_text(text)  # '١' is a digit to \d (any script's digits): ASCII ones only
    except NumberTextError as exc:
        raise DrawError(f"steps {text!r}: {exc}") from None
    match = re.fullmatch(r"\s*([0-9]{1,9})\s*(?:-\s*([0-9]{1,9})\s*)?", text)
    if not match:
        raise DrawError(f"steps {text!r}: expected A-B or A (step numbers from 0)")
    first = int(match.group(1))
    last = int(match.group(2)) if match.group(2) is not None else first
    if last < first:
        raise DrawError(f"steps {text!r}: the last step is before the first")
    return first, last


# -- what each panel shows --------------------------------------------------------------------------


@dataclass(frozen=True)
class StepTraffic:
    """The sends of one step (or one level of an XML program's schedule), as arrays.

    ``src[i] -> dst[i]`` carries chunk ``colour[i]`` (the base chunk for an algorithm; the chunk
    of the receiving buffer for an XML program). ``rounds`` is the step's length; ``None`` for an
    XML level, whose length is the fewest rounds its loads need (:attr:`effective_rounds`).
    """

    index: int
    rounds: int | None
    src: np.ndarray
    dst: np.ndarray
    colour: np.ndarray
    label: str = "step"

    @property
    def num_sends(self) -> int:
        return int(self.src.size)


def algorithm_traffic(algorithm: Algorithm) -> list[StepTraffic]:
    """One :class:`StepTraffic` per step of ``algorithm``, coloured by base chunk.

    >>> from collsynth.algorithm.model import Send, Step
    >>> t = algorithm_traffic(_ring4_allgather())
    >>> [(s.index, s.rounds, s.num_sends) for s in t]
    [(0, 1, 8), (1, 1, 4)]
    """
    factor = algorithm.collective.chunk_factor
    result = []
    for index, step in enumerate(algorithm.steps):
        chunk, src, dst, _ = sends_as_arrays(step.sends)
        result.append(StepTraffic(index, step.rounds, np.asarray(src, dtype=np.int64),
                                  np.asarray(dst, dtype=np.int64),
                                  np.asarray(chunk, dtype=np.int64) // factor))
    return result


def program_traffic(program: "Program") -> list[StepTraffic]:
    """One :class:`StepTraffic` per level of ``program``'s global schedule that sends a message.

    A message of ``cnt`` chunks counts as ``cnt`` sends, coloured by the block of the receiving
    buffer each lands in: ``nchunksperloop / ngpus`` chunks a block when that divides (so an
    allgather's colour is the rank the chunk comes from, as for an algorithm), else one chunk.

    Raises
    ------
    UnrunnableProgramError
        When the program deadlocks or its messages do not match (no schedule exists).
    """
    from collsynth.executor.program import schedule

    sched = schedule(program)
    n, loop = program.ngpus, program.nchunksperloop
    block = loop // n if n > 0 and loop > n and loop % n == 0 else 1
    by_level: dict[int, tuple[list[int], list[int], list[int]]] = {}
    for op in sched.ops:   # every message, seen from its receive
        sent = op.step.received
        if sent is None:
            continue
        sender = sched.ops[sent.index]
        cnt, dstoff = sent.transfer.cnt, op.step.transfer.dstoff
        src, dst, colour = by_level.setdefault(sender.send_level, ([], [], []))
        src.extend([sent.rank] * cnt)
        dst.extend([op.step.rank] * cnt)
        colour.extend(k // block for k in range(dstoff, dstoff + cnt))
    levels = sorted(by_level)
    return [StepTraffic(position, None, np.asarray(by_level[level][0], dtype=np.int64),
                        np.asarray(by_level[level][1], dtype=np.int64),
                        np.asarray(by_level[level][2], dtype=np.int64), label="level")
            for position, level in enumerate(levels)]


def _loads(traffic: StepTraffic, n: int) -> np.ndarray:
    """Chunks per link: ``loads[src, dst]``."""
    return np.bincount(traffic.src * n + traffic.dst, minlength=n * n).reshape(n, n)


class _Capacity:
    """A topology's link bandwidths and bandwidth groups as arrays, built once per drawing."""

    def __init__(self, topology: Topology) -> None:
        self.links = topology.link_array
        # Each group that can bind: its limit and the flat indices src * n + dst of its links.
        n = topology.num_ranks
        self.groups = [(group.limit, np.fromiter((a * n + b for a, b in covered), dtype=np.int64,
                                                 count=len(covered)))
                       for group, covered in topology.effective_groups]

    def check(self, traffic: StepTraffic, loads: np.ndarray) -> tuple[int, np.ndarray]:
        """The step's rounds and which used links are full: at ``bandwidth x rounds``, or in
        a bandwidth group (switch port, NIC) at ``limit x rounds``. An XML level's rounds are
        the fewest that carry its loads."""
        flat = loads.ravel()
        totals = [(limit, int(flat[index].sum()), index) for limit, index in self.groups]
        rounds = traffic.rounds
        if rounds is None:
            used = loads > 0
            need = int(np.ceil(loads[used] / np.maximum(self.links[used], 1)).max(initial=1))
            for limit, total, _ in totals:
                need = max(need, -(-total // limit))
            rounds = max(1, need)
        full = (loads > 0) & (loads >= self.links * rounds)
        marks = full.ravel()
        for limit, total, index in totals:
            if total >= limit * rounds:
                marks[index[flat[index] > 0]] = True
        return rounds, marks.reshape(loads.shape)


# -- layouts ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Layout:
    """Where each rank sits in a panel.

    ``positions[r]`` is rank ``r``'s centre; ``switches`` are drawn as boxes, each rank joined
    by a spoke to ``switch_of[r]`` (``-1``: none); ``node_boxes`` frame the ranks of one node,
    ``(first, last, label)``. ``kind`` names the layout (``circle``, ``line``, ``star``,
    ``cube-mesh``, ``switch``, ``nodes``).
    """

    kind: str
    positions: np.ndarray
    node_radius: float
    switches: tuple[tuple[float, float], ...] = ()
    switch_of: tuple[int, ...] = ()
    node_boxes: tuple[tuple[int, int, str], ...] = ()
    #: Links drawn as the topology's background (``(a, b)`` with ``a < b``).
    links: tuple[tuple[int, int], ...] = field(default=())


def _circle(n: int, radius: float = 1.0, centre: tuple[float, float] = (0.0, 0.0)) -> np.ndarray:
    """Rank 0 at the top, then clockwise."""
    angles = math.pi / 2 - 2 * math.pi * np.arange(n) / n
    return np.column_stack([centre[0] + radius * np.cos(angles),
                            centre[1] + radius * np.sin(angles)])


def _key(name: str) -> str:
    return re.sub(r"[^a-z0-9:]", "", name.lower())


#: DGX-1 hybrid cube-mesh (also NDv2): the two sockets' quads side by side, mirrored so that the
#: double inter-socket links 0-4 and 2-6 are short; 1-5 and 3-7 arc around the outside.
_CUBE_MESH = np.array([(1.0, 1.0), (0.0, 1.0), (1.0, 0.0), (0.0, 0.0),
                       (2.0, 1.0), (3.0, 1.0), (2.0, 0.0), (3.0, 0.0)])
_CUBE_MESH_NAMES = ("dgx1", "ndv2")


def _is_switch(links: Sequence[Sequence[int]], groups: Sequence[Any], n: int) -> bool:
    """Every rank linked to every other, with per-rank port groups: one switch."""
    if n < 3 or any(links[a][b] == 0 for a in range(n) for b in range(n) if a != b):
        return False
    ports = {min(g.sources) for g in groups if len(g.sources) == 1 and len(g.destinations) == n - 1}
    return len(ports) == n


def _node_layout(name: str, links: Sequence[Sequence[int]], groups: Sequence[Any], n: int
                 ) -> tuple[str, np.ndarray, bool]:
    """Kind, positions and whether there is a central switch, for one node (or a whole
    single-node topology)."""
    key = _key(name)
    family = key.split(":", 1)[0] if ":" in key else ""
    if key in _CUBE_MESH_NAMES and n == 8:
        return "cube-mesh", _CUBE_MESH.copy(), False
    if family == "line":
        return "line", np.column_stack([np.arange(n, dtype=float), np.zeros(n)]), False
    if family == "star" or (n >= 3 and all(links[0][r] and links[r][0] for r in range(1, n))
                            and not any(links[a][b] for a in range(1, n)
                                        for b in range(1, n) if a != b)):
        positions = np.vstack([[0.0, 0.0], _circle(n - 1)])
        return "star", positions, False
    if family == "hub" or _is_switch(links, groups, n):
        return "switch", _circle(n), True
    return "circle", _circle(n), False


def layout_of(topology: Topology) -> Layout:
    """A layout for ``topology``: rings and fully connected ones on a circle, lines on a line,
    a star around its centre, switch-based nodes (DGX A100/H100, DGX-2, hub:N) on a circle
    around their switch, the DGX-1 cube-mesh as two quads, and composed systems (``--nodes K``)
    as their nodes side by side.

    >>> from collsynth.topology.families import ring, line
    >>> layout_of(ring(4)).kind, layout_of(line(3)).positions.tolist()
    ('circle', [[0.0, 0.0], [1.0, 0.0], [2.0, 0.0]])
    """
    n = topology.num_ranks
    layout = topology.layout
    if layout is not None and layout.multi_node:
        return _nodes_layout(topology, layout.composed_from, layout.ranks_per_node,
                             layout.nodes)
    kind, positions, switch = _node_layout(topology.name, topology.links, topology.groups, n)
    centre = positions.mean(axis=0)
    return Layout(kind, positions, _node_radius(positions),
                  switches=((float(centre[0]), float(centre[1])),) if switch else (),
                  switch_of=tuple([0] * n) if switch else (),
                  links=() if switch else _undirected(topology.links, range(n)))


def _nodes_layout(topology: Topology, node_name: str, per_node: int, nodes: int) -> Layout:
    block = [row[:per_node] for row in topology.links[:per_node]]
    local_groups = [g for g in topology.groups if max(g.sources | g.destinations) < per_node]
    kind, local, switch = _node_layout(node_name, block, local_groups, per_node)
    span = local.max(axis=0) - local.min(axis=0)
    gap = max(span[0], 1.0) * 0.3 + 6 * _node_radius(local)  # room for both nodes' frames
    columns = nodes if nodes <= 4 else math.ceil(math.sqrt(nodes))
    positions = np.zeros((per_node * nodes, 2))
    switches, switch_of, boxes = [], [], []
    for k in range(nodes):
        offset = np.array([(k % columns) * (span[0] + gap),
                           -(k // columns) * (span[1] + gap)]) - local.min(axis=0)
        positions[k * per_node:(k + 1) * per_node] = local + offset
        if switch:
            centre = local.mean(axis=0) + offset
            switches.append((float(centre[0]), float(centre[1])))
            switch_of.extend([k] * per_node)
        boxes.append((k * per_node, (k + 1) * per_node - 1, f"node {k}"))
    links = () if switch else tuple(
        pair for k in range(nodes)
        for pair in _undirected(topology.links, range(k * per_node, (k + 1) * per_node)))
    return Layout("nodes", positions, _node_radius(local), tuple(switches), tuple(switch_of),
                  tuple(boxes), links)


def _undirected(links: Sequence[Sequence[int]], ranks: range) -> tuple[tuple[int, int], ...]:
    return tuple((a, b) for a in ranks for b in ranks
                 if a < b and (links[a][b] or links[b][a]))


def _node_radius(positions: np.ndarray) -> float:
    if len(positions) < 2:
        return 0.15
    gaps = np.linalg.norm(positions[:, None, :] - positions[None, :, :], axis=-1)
    np.fill_diagonal(gaps, np.inf)
    return float(min(0.16, 0.3 * gaps.min()))


def _bend(layout: Layout, a: int, b: int) -> float:
    """The ``arc3`` curvature of the arrow ``a -> b``: a slight curve so that the two
    directions of a link part, and a wide arc, away from the ranks in its way, when the
    straight line would run through another rank."""
    p, q = layout.positions[a], layout.positions[b]
    d = q - p
    length = float(np.hypot(*d))
    if length == 0:
        return 0.0
    normal = np.array([d[1], -d[0]]) / length  # arc3 with rad > 0 bulges towards +normal
    rel = layout.positions - p
    along = rel @ d / length
    across = rel @ normal
    r = layout.node_radius
    blocked = (along > r) & (along < length - r) & (np.abs(across) < 1.6 * r)
    blocked[[a, b]] = False
    if not blocked.any():
        return 0.12
    side = -np.sign(across[blocked].sum())
    if abs(across[blocked].sum()) < 1e-9:  # ranks right on the line: bulge away from the centre
        side = -np.sign((layout.positions.mean(axis=0) - (p + q) / 2) @ normal) or 1.0
    depth = float(np.abs(across[blocked]).max()) + 2.2 * r
    # The two directions bulge the same way, a little apart (arc3 flips with the direction).
    rad = min(0.7, max(0.2, 2 * depth / length)) + (0.0 if a < b else 0.08)
    return float(side * rad)


# -- drawing -------------------------------------------------------------------------------------


def _select(traffic: list[StepTraffic], options: DrawOptions) -> list[StepTraffic]:
    if not traffic:
        raise DrawError("nothing to draw: the schedule has no sends")
    if options.steps is None:
        return traffic
    first, last = options.steps
    noun = traffic[0].label
    if last >= len(traffic):
        raise StepRangeError(f"{noun}s {first}-{last}: there are {len(traffic)} {noun}s, "
                             f"numbered 0-{len(traffic) - 1}")
    return traffic[first:last + 1]


def _colours(keys: np.ndarray) -> tuple[Any, dict[int, Any]]:
    """A colour per key (base chunk): distinct colours for few keys (no greys: grey means
    several chunks), a colour map for many."""
    from matplotlib import colormaps

    distinct = np.unique(keys)
    if distinct.size <= _QUALITATIVE:
        palette = [c for i, c in enumerate(colormaps["tab10"].colors) if i != 7]
        if distinct.size > len(palette):
            palette = [c for i, c in enumerate(colormaps["tab20"].colors) if i not in (14, 15)]
        return None, {int(k): palette[i] for i, k in enumerate(distinct)}
    cmap = colormaps["turbo"]
    top = max(int(distinct.max()), 1)
    return cmap, {int(k): cmap(int(k) / top) for k in distinct}


def draw_algorithm(algorithm: Algorithm, *, options: DrawOptions | None = None) -> "Figure":
    """Draw ``algorithm`` step by step on its topology's layout (or as heat maps when large).

    Returns a matplotlib ``Figure`` (Agg canvas): save it with :func:`save_drawing`, show it in a
    notebook, or read its axes (one per panel).

    Raises
    ------
    DrawError
        ``options.steps`` beyond the algorithm's steps, or more arrow panels than
        ``options.max_panels``.

    >>> fig = draw_algorithm(_ring4_allgather())
    >>> len(fig.axes)
    2
    """
    options = options or DrawOptions()
    title = (f"{algorithm.name}: {algorithm.collective.describe()} on {algorithm.topology.name}, "
             f"{algorithm.num_steps} steps, {algorithm.num_rounds} rounds, "
             f"{algorithm.chunks} chunk(s)")
    return _draw(algorithm.topology, algorithm_traffic(algorithm), options, title,
                 "colour: base chunk")


def draw_program(program: "Program", topology: Topology, *,
                 options: DrawOptions | None = None) -> "Figure":
    """Draw an MSCCL XML program on ``topology`` (its ranks in the program's order), one panel
    per level of the program's global schedule (:func:`collsynth.executor.schedule`).

    Raises
    ------
    DrawError
        The program has a different number of ranks than the topology, or sends over a link the
        topology does not have; ``options.steps`` beyond its levels.
    UnrunnableProgramError
        The program has no schedule (it deadlocks or its messages do not match).
    """
    options = options or DrawOptions()
    if program.ngpus != topology.num_ranks:
        raise DrawError(f"program {program.name!r} has ngpus={program.ngpus} but topology "
                        f"{topology.name!r} has {topology.num_ranks} ranks")
    traffic = program_traffic(program)
    n = topology.num_ranks
    pairs = np.unique(np.concatenate([step.src * n + step.dst for step in traffic]
                                     or [np.zeros(0, dtype=np.int64)]))
    for pair in pairs.tolist():
        src, dst = divmod(pair, n)
        if not topology.links[src][dst]:
            raise DrawError(f"program {program.name!r} sends from rank {src} to rank {dst}, but "
                            f"topology {topology.name!r} has no such link (are its ranks in the "
                            "program's order?)")
    title = (f"{program.name}: MSCCL {program.coll} program on {topology.name}, "
             f"{len(traffic)} levels, {program.nchunksperloop} chunks per loop")
    return _draw(topology, traffic, options, title, "colour: block of the receiving buffer")


def draw_file(path: str | os.PathLike[str], *, topology: Topology | None = None,
              options: DrawOptions | None = None) -> "Figure":
    """Draw an algorithm file (JSON, verified on loading) or an MSCCL XML program.

    An XML program does not say its topology: pass ``topology``, its ranks in the program's
    order. An algorithm file carries its own, so ``topology`` must then be ``None``.

    Raises
    ------
    FileFormatError
        Missing or unreadable file, or a file that is neither kind (a JSON file that is not an
        algorithm file, such as an MSCCL++ plan, is named as what it is, whether or not
        ``topology`` is given).
    DrawError
        An XML program without ``topology``, or an algorithm file with one; an XML program on a
        topology of another rank count or without a link it sends over (naming the file).
    """
    kind = file_kind(path)
    if kind == "xml":
        from collsynth.export.xml_reader import load_program

        if topology is None:
            raise DrawError(f"{path}: an MSCCL XML program does not say its topology; give one "
                            "(--topology), its ranks in the program's order")
        program = load_program(Path(path))
        try:
            return draw_program(program, topology, options=options)
        except StepRangeError:  # of --steps, not of the file: the command says so
            raise
        except DrawError as exc:  # the program on the wrong topology: name its file
            raise DrawError(f"{shown_path(path)}: {exc}") from None
    from collsynth.algorithm.fileformat import load_algorithm

    algorithm = load_algorithm(path)  # first: it says what another JSON file is (an MSCCL++ plan)
    if topology is not None:
        raise DrawError(f"{path}: an algorithm file carries its topology; a topology is only "
                        "given for an MSCCL XML program")
    return draw_algorithm(algorithm, options=options)


def file_kind(path: str | os.PathLike[str]) -> str:
    """``"xml"`` (an MSCCL XML program) or ``"json"`` (an algorithm file), by the first
    non-blank byte.

    Raises
    ------
    FileFormatError
        A missing or unreadable file, or one that starts with neither.
    """
    p = Path(expect_path(path))
    head = read_head(p, 4096)
    start = head.lstrip(b"\xef\xbb\xbf \t\r\n")[:1]
    if start == b"<" or head[:4] in (b"\xff\xfe<\x00", b"\xfe\xff\x00<"):
        return "xml"   # UTF-16 XML too: the reader refuses it by name ("not UTF-8 text")
    if start == b"{":
        return "json"
    # as the other readers say of a file of nothing but white space (all of it read here)
    empty = "empty: " if not start and len(head) < 4096 else ""
    raise FileFormatError(p, f"{empty}expected an algorithm file (JSON) or an MSCCL XML program")


def _draw(topology: Topology, traffic: list[StepTraffic], options: DrawOptions, title: str,
          colour_note: str) -> "Figure":
    chosen = _select(traffic, options)
    n = topology.num_ranks
    sends = sum(step.num_sends for step in chosen)
    style = options.style
    if style == "auto":
        style = "heatmap" if n > MAX_ARROW_RANKS or sends > MAX_ARROW_SENDS else "arrows"
    if style == "heatmap":
        aggregate = options.aggregate
        if aggregate is None:
            aggregate = len(chosen) > options.max_panels
        if not aggregate and len(chosen) > options.max_panels:
            raise DrawError(f"{len(chosen)} heat maps are more than max_panels="
                            f"{options.max_panels}; aggregate them or choose fewer steps")
        return _heatmaps(topology, chosen, aggregate, title, options)
    if n > _MAX_ARROW_RANKS_FORCED or sends > _MAX_ARROW_SENDS_FORCED:
        raise DrawError(f"{n} ranks and {sends} sends are too many to draw as arrows (at most "
                        f"{_MAX_ARROW_RANKS_FORCED} ranks and {_MAX_ARROW_SENDS_FORCED} sends); "
                        "draw heat maps")
    if len(chosen) > options.max_panels:
        noun = chosen[0].label
        raise DrawError(f"{len(chosen)} {noun}s are more than the {options.max_panels} panels of "
                        f"one figure; choose some (--steps A-B) or draw heat maps")
    return _arrows(topology, chosen, title, colour_note)


def _new_figure(width_in: float, height_in: float, title: str) -> "Figure":
    """An Agg figure with constrained layout and ``title`` wrapped to its width."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width_in, height_in), layout="constrained")
    figure.get_layout_engine().set(h_pad=0.1)  # suptitle clear of two-line panel titles
    FigureCanvasAgg(figure)
    figure.suptitle(textwrap.fill(title, width=max(40, int(width_in * 12))), fontsize=_TITLE_PT)
    return figure


def _grid(panels: int, aspect: float) -> tuple[int, int, float]:
    """Columns, rows and the width of a panel (inches): wide layouts get fewer, wider columns."""
    if aspect > 3:
        columns, width = 1, 9.0
    elif aspect > 1.25:
        columns, width = 2, 5.0
    else:
        columns, width = (4 if aspect > 0.8 else 5), 3.6
    columns = min(panels, columns)
    return columns, math.ceil(panels / columns), width


def _arrows(topology: Topology, chosen: list[StepTraffic], title: str, colour_note: str
            ) -> "Figure":
    from matplotlib.lines import Line2D
    from matplotlib.patches import Circle, FancyArrowPatch, FancyBboxPatch, Rectangle

    layout = layout_of(topology)
    n = topology.num_ranks
    pos = layout.positions
    r = layout.node_radius
    pad = 0.5 if layout.kind in ("cube-mesh", "line") else 0.35
    low, high = pos.min(axis=0) - pad, pos.max(axis=0) + pad
    # Room for the arcs that bulge out of the layout (the same for every panel).
    pairs = {(int(a), int(b)) for step in chosen for a, b in zip(step.src, step.dst)}
    for a, b in pairs:
        mid = _arc_midpoint(pos[a], pos[b], _bend(layout, a, b))
        low, high = np.minimum(low, mid - 2 * r), np.maximum(high, mid + 2 * r)
    span = high - low
    aspect = span[0] / span[1]
    columns, rows, panel_w = _grid(len(chosen), aspect)
    # Wide enough that a rank's number (9 or 10 pt) fits in its circle; fewer columns when
    # that makes the figure too wide.
    rank_pt = _TEXT_PT + 1 if n <= 16 else _TEXT_PT
    digits = len(str(n - 1))
    panel_w = max(panel_w, (0.6 * digits * rank_pt / 2 + 3) / 72 * span[0] / r)
    columns = max(1, min(columns, int(_MAX_FIGURE_WIDTH_IN // panel_w)))
    rows = math.ceil(len(chosen) / columns)
    panel_h = panel_w / aspect + 0.45  # and two lines of title
    cmap, colours = _colours(np.concatenate([s.colour for s in chosen]))
    # The legend: its entries, as many a row as fit the figure's width (a line sample and the
    # text), its title wrapped to that width; the figure is made tall enough to hold it.
    several = any(_carries_several(step) for step in chosen)
    labels = ["link at capacity", "capacity left"]
    if cmap is None:
        noun = "chunk" if chosen[0].label == "step" else "block"
        labels += [f"{noun} {k}" for k in colours]
    if several:
        labels.append("several chunks")
    width_in = max(panel_w * columns, 6.0)
    entry_pt = max(0.6 * _TEXT_PT * len(text) + 40 for text in labels)
    per_row = max(1, min(len(labels), int(width_in * 72 * 0.95 // entry_pt)))
    legend_title = textwrap.fill(
        f"{colour_note}; width: chunks on the link" + (
            "; several chunks: numbered beside the arrow where there is room" if several else ""),
        width=max(40, int(width_in * 12)))
    legend_lines = math.ceil(len(labels) / per_row) + legend_title.count("\n") + 1
    height_in = panel_h * rows + 0.5 + legend_lines * 1.5 * _TEXT_PT / 72 + (
        0.6 if cmap is not None else 0.0)
    figure = _new_figure(width_in, height_in, title)
    # Points per data unit, on the safe side (the axes are a little smaller than the panel).
    scale_pt = 0.85 * 72 * min(panel_w, width_in / columns) / span[0]
    max_count = 1
    panels = []
    capacity = _Capacity(topology)
    for step in chosen:
        loads = _loads(step, n)
        rounds, full = capacity.check(step, loads)
        panels.append((step, loads, rounds, full))
        max_count = max(max_count, int(loads.max()))
    label_size = _TEXT_PT
    for index, (step, loads, rounds, full) in enumerate(panels):
        ax = figure.add_subplot(rows, columns, index + 1)
        ax.set_xlim(low[0], high[0])
        ax.set_ylim(low[1], high[1])
        ax.set_aspect("equal")
        ax.axis("off")
        for first, last, text in layout.node_boxes:
            corner = pos[first:last + 1].min(axis=0) - 2 * r
            size = pos[first:last + 1].max(axis=0) + 2 * r - corner
            ax.add_patch(Rectangle(corner, size[0], size[1], fill=False, linestyle=":",
                                   edgecolor="#999999", linewidth=0.8))
            ax.text(corner[0], corner[1] + size[1], text, fontsize=label_size, color="#777777",
                    va="bottom")
        for a, b in layout.links:
            ax.plot(*zip(pos[a], pos[b]), color="#dddddd", linewidth=1.0, zorder=0)
        for k, (x, y) in enumerate(layout.switches):
            for rank in range(n):
                if layout.switch_of[rank] == k:
                    ax.plot([x, pos[rank][0]], [y, pos[rank][1]], color="#e4e4e4",
                            linewidth=1.0, zorder=0)
            half = max(1.4 * r, (0.6 * 6 * label_size / 2 + 3) / scale_pt)  # "switch" fits
            ax.add_patch(FancyBboxPatch((x - half, y - 0.9 * r), 2 * half, 1.8 * r,
                                        boxstyle="round,pad=0.02", facecolor="#eeeeee",
                                        edgecolor="#aaaaaa", zorder=1))
            ax.text(x, y, "switch", ha="center", va="center", fontsize=label_size,
                    color="#777777", zorder=2)
        for rank in range(n):
            ax.add_patch(Circle(pos[rank], r, facecolor="white", edgecolor="black",
                                linewidth=1.0, zorder=4))
            ax.text(*pos[rank], str(rank), ha="center", va="center", fontsize=rank_pt,
                    zorder=5)
        order = np.lexsort((step.colour, step.dst, step.src))
        src, dst, key = step.src[order], step.dst[order], step.colour[order]
        starts = np.flatnonzero(np.r_[True, (src[1:] != src[:-1]) | (dst[1:] != dst[:-1])])
        # Chunk numbers beside the arrows only where they stay legible, and each only where
        # it overlaps no rank and no other number (see _LabelPlacer).
        label_arrows = n <= 12 and starts.size <= 64
        placer = _LabelPlacer(pos, r, scale_pt, label_size)
        for begin, end in zip(starts, np.r_[starts[1:], src.size]):
            a, b = int(src[begin]), int(dst[begin])
            keys = np.unique(key[begin:end])
            count = int(end - begin)
            colour = colours[int(keys[0])] if keys.size == 1 else _SEVERAL
            width = 0.8 + 3.2 * (count - 1) / max(1, max_count - 1) if max_count > 1 else 1.4
            rad = _bend(layout, a, b)
            start, end = _rim_points(pos[a], pos[b], rad, r * 1.08)
            arrow = FancyArrowPatch(
                posA=tuple(start), posB=tuple(end), shrinkA=0, shrinkB=0,
                arrowstyle="-|>", mutation_scale=7 + 2 * width, linewidth=width, color=colour,
                linestyle="-" if full[a, b] else (0, (3, 2)),
                connectionstyle=f"arc3,rad={rad:.3f}", zorder=3)
            arrow.set_gid(f"send {a}->{b}")  # names the link (an element id in SVG)
            ax.add_patch(arrow)
            if keys.size > 1 and label_arrows:
                text = ",".join(str(int(k)) for k in keys[:4]) + ("..." if keys.size > 4 else "")
                spot = placer.place(pos[a], pos[b], rad, text)
                if spot is not None:
                    ax.text(*spot, text, fontsize=label_size, ha="center", va="center",
                            color=_SEVERAL, zorder=6,
                            bbox=dict(boxstyle="round,pad=0.1", facecolor="white",
                                      edgecolor="none", alpha=0.8))
        used = int((loads > 0).sum())
        rounds_text = f"{rounds} round{'s' if rounds != 1 else ''}" + (
            "" if step.rounds is not None else " (fewest)")
        ax.set_title(f"{step.label} {step.index}: {rounds_text}, {step.num_sends} chunks,\n"
                     f"{int(full.sum())} of {used} links used at capacity", fontsize=_TEXT_PT)
    handles = [Line2D([], [], color="black", linewidth=1.4, label=labels[0]),
               Line2D([], [], color="black", linewidth=1.4, linestyle=(0, (3, 2)),
                      label=labels[1])]
    if cmap is None:
        handles += [Line2D([], [], color=c, linewidth=3, label=text)
                    for c, text in zip(colours.values(), labels[2:])]
    if several:
        handles.append(Line2D([], [], color=_SEVERAL, linewidth=3, label=labels[-1]))
    figure.legend(handles=handles, loc="outside lower center", ncol=per_row,
                  fontsize=_TEXT_PT, frameon=False, title=legend_title, title_fontsize=_TEXT_PT)
    if cmap is not None:
        from matplotlib.cm import ScalarMappable
        from matplotlib.colors import Normalize

        bar = figure.colorbar(ScalarMappable(Normalize(0, max(max(colours), 1)), cmap),
                              ax=figure.axes, orientation="horizontal", fraction=0.03,
                              aspect=60, pad=0.02)
        bar.set_label("chunk", fontsize=_TEXT_PT)
        bar.ax.tick_params(labelsize=_TEXT_PT)
    return figure


class _LabelPlacer:
    """Where the chunk numbers of an arrow panel go: beside the arrow's midpoint, on the side its
    arc bulges to (so the two directions of a link label opposite sides), else a little along
    it; a label that would overlap a rank or an earlier label is left out. Boxes are estimated
    in data units from the text's length and size (``scale_pt`` points per data unit)."""

    def __init__(self, positions: np.ndarray, radius: float, scale_pt: float, size_pt: float):
        self._positions = positions
        self._radius = radius
        self._scale = scale_pt
        self._size = size_pt
        self._boxes: list[tuple[float, float, float, float]] = []  # centre x, y, half w, half h

    def place(self, p: np.ndarray, q: np.ndarray, rad: float, text: str
              ) -> tuple[float, float] | None:
        half_w = (0.62 * len(text) * self._size / 2 + 2) / self._scale
        half_h = (0.7 * self._size + 1) / self._scale
        d = q - p
        length = max(float(np.hypot(*d)), 1e-12)
        along = d / length
        side = np.array([d[1], -d[0]]) / length * (1.0 if rad >= 0 else -1.0)
        mid = _arc_midpoint(p, q, rad)
        # Far enough out that the box clears the arc, whatever the arrow's direction.
        clear = abs(float(side[0])) * half_w + abs(float(side[1])) * half_h + 1.5 / self._scale
        for spot in (mid + side * clear, mid + side * clear + along * 2.2 * half_w,
                     mid + side * clear - along * 2.2 * half_w):
            if self._free(spot, half_w, half_h):
                self._boxes.append((float(spot[0]), float(spot[1]), half_w, half_h))
                return float(spot[0]), float(spot[1])
        return None

    def _free(self, spot: np.ndarray, half_w: float, half_h: float) -> bool:
        x, y = float(spot[0]), float(spot[1])
        for bx, by, bw, bh in self._boxes:
            if abs(x - bx) < half_w + bw and abs(y - by) < half_h + bh:
                return False
        # Distance from each rank's centre to the box, against the rank's circle.
        dx = np.maximum(np.abs(self._positions[:, 0] - x) - half_w, 0.0)
        dy = np.maximum(np.abs(self._positions[:, 1] - y) - half_h, 0.0)
        return bool((np.hypot(dx, dy) > self._radius * 1.1).all())


def _carries_several(step: StepTraffic) -> bool:
    """Whether some link of ``step`` carries pieces of more than one base chunk."""
    if step.src.size == 0:
        return False
    triples = np.unique(np.stack([step.src, step.dst, step.colour]), axis=1)
    pairs = np.unique(triples[:2], axis=1)
    return pairs.shape[1] < triples.shape[1]


def _rim_points(p: np.ndarray, q: np.ndarray, rad: float, radius: float
                ) -> tuple[np.ndarray, np.ndarray]:
    """Where the ``arc3`` curve from ``p`` to ``q`` leaves the circle of ``radius`` around ``p``
    and enters the one around ``q``, along its tangents. Clipping to the rank's circle patch
    (``patchA``/``patchB``) gives the same picture but costs a Bezier intersection per arrow
    per draw, which made drawing ten times slower."""
    d = q - p
    control = (p + q) / 2 + rad * np.array([d[1], -d[0]])
    out = control - p
    into = control - q
    return (p + radius * out / max(float(np.hypot(*out)), 1e-12),
            q + radius * into / max(float(np.hypot(*into)), 1e-12))


def _arc_midpoint(p: np.ndarray, q: np.ndarray, rad: float) -> np.ndarray:
    """The midpoint of matplotlib's ``arc3`` curve from ``p`` to ``q`` (a quadratic Bezier whose
    control point is the chord's midpoint moved by ``rad`` times the chord, sideways)."""
    d = q - p
    control = (p + q) / 2 + rad * np.array([d[1], -d[0]])
    return 0.25 * p + 0.5 * control + 0.25 * q


def _heatmaps(topology: Topology, chosen: list[StepTraffic], aggregate: bool, title: str,
              options: DrawOptions) -> "Figure":
    n = topology.num_ranks
    binned = math.ceil(n / _MAX_MATRIX_SIDE)
    side = math.ceil(n / binned)
    matrices, titles = [], []
    if aggregate:
        total = np.zeros((side, side), dtype=np.int64)
        for step in chosen:
            total += _binned_loads(step, n, binned, side)
        matrices.append(total)
        noun = chosen[0].label
        span = (f"{noun} {chosen[0].index}" if len(chosen) == 1 else
                f"{noun}s {chosen[0].index}-{chosen[-1].index}")
        titles.append(f"{span}, all together: {sum(s.num_sends for s in chosen)} chunks")
    else:
        capacity = _Capacity(topology) if binned == 1 else None
        for step in chosen:
            matrices.append(_binned_loads(step, n, binned, side))
            detail = ""
            if capacity is not None:
                rounds, full = capacity.check(step, matrices[-1])
                detail = f"\n{rounds} round(s), {int(full.sum())} links at capacity"
            titles.append(f"{step.label} {step.index}: {step.num_sends} chunks{detail}")
    columns, rows, _ = _grid(len(matrices), 1.0)
    size = 3.4 if len(matrices) > 1 else 5.0
    figure = _new_figure(size * columns + 0.8, size * rows + 0.8, title)
    from matplotlib import colormaps
    from matplotlib.colors import LogNorm, Normalize

    cmap = colormaps["viridis"].with_extremes(bad="white")
    top = max(1, max(int(m.max()) for m in matrices))
    smallest = min((int(m[m > 0].min()) for m in matrices if m.any()), default=1)
    # A log scale when loads differ by much (a NIC link next to NVLinks), else linear.
    norm = LogNorm(vmin=smallest, vmax=top) if top >= 20 * smallest else Normalize(0, top)
    per_node = topology.layout.ranks_per_node if topology.layout is not None else None
    image = None
    for index, (matrix, text) in enumerate(zip(matrices, titles)):
        ax = figure.add_subplot(rows, columns, index + 1)
        image = ax.imshow(np.ma.masked_equal(matrix, 0), cmap=cmap, norm=norm,
                          interpolation="nearest", origin="upper")
        if _is_int(per_node) and 1 < per_node < n and binned == 1:
            for edge in range(per_node, n, per_node):
                ax.axhline(edge - 0.5, color="#cccccc", linewidth=0.4)
                ax.axvline(edge - 0.5, color="#cccccc", linewidth=0.4)
        if binned == 1:
            what = "rank"
        elif binned == per_node:
            what = "node"
        else:
            what = f"rank (bins of {binned})"
        ax.set_xlabel(f"destination {what}", fontsize=_TEXT_PT)
        ax.set_ylabel(f"source {what}", fontsize=_TEXT_PT)
        ax.tick_params(labelsize=_TEXT_PT)
        ax.set_title(text, fontsize=_TEXT_PT)
    bar = figure.colorbar(image, ax=figure.axes, fraction=0.04, pad=0.03)
    bar.set_label("chunks sent over the link", fontsize=_TEXT_PT)
    bar.ax.tick_params(labelsize=_TEXT_PT)
    return figure


def _binned_loads(step: StepTraffic, n: int, binned: int, side: int) -> np.ndarray:
    if binned == 1:
        return _loads(step, n)
    return np.bincount((step.src // binned) * side + step.dst // binned,
                       minlength=side * side).reshape(side, side)


# -- writing --------------------------------------------------------------------------------------


def check_output_path(path: str | os.PathLike[str]) -> Path:
    """Refuse, before any work, an output that :func:`save_drawing` could not write: a suffix
    other than ``.png``/``.svg``, a missing folder, or an existing path that is not a regular
    file (a folder, a link, a FIFO, a device).

    >>> check_output_path("picture.gif")
    Traceback (most recent call last):
    ...
    collsynth.draw.DrawError: picture.gif: expected a .png or .svg file
    """
    target = Path(path)
    if target.suffix.lower() not in FIGURE_SUFFIXES:
        raise DrawError(f"{target}: expected a .png or .svg file")
    return check_output_file(target)


def render_png(figure: "Figure", *, dpi: int = 100, colours: int | None = 256) -> bytes:
    """``figure`` as PNG bytes; with ``colours``, reduced to a palette of that many (2..256)
    colours, which looks the same for these drawings (flat colours, thin anti-aliased edges)
    and is about three times smaller.

    >>> render_png(draw_algorithm(_ring4_allgather()), dpi=30)[:4]
    b'\\x89PNG'
    """
    _check_dpi(dpi)
    if colours is not None and not (_is_int(colours) and 2 <= colours <= 256):
        raise DrawError(f"colours {colours!r}: expected an integer from 2 to 256, or None")
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=dpi, metadata=_METADATA[".png"])
    if colours is None:
        return buffer.getvalue()
    from PIL import Image  # matplotlib's own dependency

    with Image.open(io.BytesIO(buffer.getvalue())) as image:
        reduced = image.convert("RGB").quantize(colors=colours,
                                                method=Image.Quantize.FASTOCTREE)
    out = io.BytesIO()
    reduced.save(out, format="PNG", optimize=True)
    return out.getvalue()


def _check_dpi(dpi: object) -> None:
    if not _is_int(dpi) or not 20 <= dpi <= 600:
        raise DrawError(f"dpi {dpi!r}: expected an integer from 20 to 600")


def save_drawing(figure: "Figure", path: str | os.PathLike[str], *, dpi: int = 100,
                 colours: int | None = 256) -> Path:
    """Write ``figure`` as PNG or SVG (by the suffix), atomically: rendered in memory, written to
    a temporary file in the same folder and renamed, so nothing is left on an error.

    ``dpi`` is the resolution of a PNG (and of heat maps inside an SVG); ``colours`` the size of
    a PNG's palette (:func:`render_png`; ``None``: full colour).

    Raises
    ------
    DrawError
        Another suffix, a missing folder, a path that exists and is not a regular file, a
        ``dpi`` outside 20..600 or ``colours`` outside 2..256.
    """
    _check_dpi(dpi)
    target = check_output_path(path)
    if target.suffix.lower() == ".png":
        data = render_png(figure, dpi=dpi, colours=colours)
    else:
        buffer = io.BytesIO()
        figure.savefig(buffer, format="svg", dpi=dpi, metadata=_METADATA[".svg"])
        data = buffer.getvalue()
    if len(data) > _MAX_OUTPUT_BYTES:
        raise InputTooLargeError(f"{target}: the drawing is {len(data)} bytes, more than "
                                 f"{_MAX_OUTPUT_BYTES}; draw fewer steps or heat maps")
    write_bytes_atomic(target, data)
    return target


#: No creation dates or software versions in the files, so that a redrawn figure is identical.
_METADATA = {".png": {"Software": None}, ".svg": {"Date": None, "Creator": None}}
#: Largest drawing written.
_MAX_OUTPUT_BYTES = 64 << 20


def _ring4_allgather() -> Algorithm:
    """A verified 2-step allgather on ring:4 (for the doctests)."""
    from collsynth.algorithm.model import Send, Step
    from collsynth.algorithm.verify import verify
    from collsynth.collective.standard import standard_collective
    from collsynth.topology.families import ring

    first = tuple(Send(r, r, (r + d) % 4) for r in range(4) for d in (1, 3))
    second = tuple(Send((s + 1) % 4, s, (s - 1) % 4) for s in range(4))
    algorithm = Algorithm("ring4-allgather", ring(4), standard_collective("allgather", 4),
                          (Step(1, first), Step(1, second)))
    return verify(algorithm)
