"""Import the GPU matrix that ``nvidia-smi topo -m`` (or ``topo -mp``) prints.

The matrix has one column per device (``GPU0..``, then NICs named ``NIC0..`` or ``mlx5_0..``) and
trailing ``CPU Affinity`` / ``NUMA Affinity`` / ``GPU NUMA ID`` columns. Cells are ``X`` (self),
``NV#`` (NVLink) or a PCIe path type (``PIX``, ``PXB``, ``PHB``, ``NODE``, ``SYS``, or ``SOC`` in
old drivers). Columns may be TAB separated or space aligned, lines may end in CRLF, and lines
before and after the matrix (a shell prompt, the legend, the ``NIC Legend:`` block) are ignored;
a second matrix (several hosts' output in one file) is refused.

The details: ``docs/topologies.md``, section "The nvidia-smi matrix".
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from typing import Sequence

from collsynth._parse import shown
from collsynth.errors import FileFormatError
from collsynth.topology.importers._common import (
    MAX_LINKS_PER_GPU,
    MAX_NVLINKS_PER_GPU,
    check_gpu_count,
    check_input_size,
    components,
    nvlink_gbps_for_model,
    pcie_topology,
    switch_groups,
)
from collsynth.topology.model import Topology

__all__ = ["import_nvidia_smi", "looks_like_nvidia_smi"]

# [0-9], not \d: \d also matches other scripts' digits (NV٣, NV２), which no tool prints.
_GPU_LABEL = re.compile(r"^GPU([0-9]+)$")
_NV_CELL = re.compile(r"^NV([0-9]+)$")
_PATH_CELLS = ("PIX", "PXB", "PHB", "NODE", "SYS", "SOC")
#: PCIe path types from nearest to farthest; PIX and PXB do not cross the CPU's host bridge.
_NEAR_PATHS = ("PIX", "PXB")
#: ``NV#`` values that are a whole GPU's link count on NVSwitch baseboards.
_SWITCH_LINK_COUNTS = (8, 12, 18)
_NIC_LEGEND = re.compile(r"^\s*(NIC[0-9]+)\s*:\s*(\S+)\s*$")
_NV_LEGEND = re.compile(r"^\s*NV#\s*=")


@dataclass(frozen=True)
class _Matrix:
    """The parsed text: device columns, cells of the GPU rows, and what surrounds the matrix."""

    columns: tuple[str, ...]
    gpus: tuple[str, ...]
    cells: dict[str, tuple[str, ...]]  # GPU label -> one cell per column
    affinity: dict[str, dict[str, str | None]]  # GPU label -> trailing column -> value
    legend_found: bool
    nv_legend_found: bool
    nic_names: dict[str, str]  # NIC0 -> mlx5_0


def _is_header(tokens: Sequence[str]) -> bool:
    return bool(tokens) and tokens[0] == "GPU0" and (len(tokens) == 1 or tokens[1] != "X")


def looks_like_nvidia_smi(text: str) -> bool:
    """True when ``text`` has a ``nvidia-smi topo -m`` header row (first field ``GPU0``).

    >>> looks_like_nvidia_smi("\\tGPU0\\tGPU1\\tCPU Affinity\\nGPU0\\t X \\tNV4\\t0-7\\n")
    True
    """
    return any(_is_header(line.split()) for line in text.splitlines())


def _fields(line: str) -> list[str]:
    """Split a matrix line: on TABs when it has any (keeps empty cells), else on whitespace."""
    if "\t" in line:
        return [f.strip() for f in line.split("\t")]
    return line.split()


def _trailing_names(tokens: Sequence[str]) -> list[str]:
    """Group the header's trailing words into column names (``CPU Affinity``...)."""
    names: list[str] = []
    i = 0
    while i < len(tokens):
        if tokens[i] in ("CPU", "NUMA") and i + 1 < len(tokens) and tokens[i + 1] == "Affinity":
            names.append(f"{tokens[i]} Affinity")
            i += 2
        elif tokens[i:i + 3] == ["GPU", "NUMA", "ID"]:
            names.append("GPU NUMA ID")
            i += 3
        else:
            names.append(tokens[i])
            i += 1
    return names


def _trailing_start(tokens: Sequence[str]) -> int:
    for i, tok in enumerate(tokens):
        if tok in ("CPU", "NUMA") or (tok == "GPU" and tokens[i + 1:i + 2] == ["NUMA"]):
            return i
    return len(tokens)


def _affinity(values: list[str], names: list[str], tabbed: bool) -> dict[str, str | None]:
    """Map a GPU row's trailing cells to the trailing column names.

    With a ``GPU NUMA ID`` column, TAB rows carry one empty cell more than the header names
    (``...\\t0\\t\\tN/A``); that cell is dropped. Space-aligned rows lose empty cells, so they
    are mapped only when the count matches.
    """
    if tabbed:
        if len(values) == len(names) + 1 and names and names[-1] == "GPU NUMA ID" and values[-2] == "":
            values = values[:-2] + values[-1:]
        while len(values) > len(names) and values[-1] == "":
            values = values[:-1]
    if len(values) != len(names):
        return {"raw": " ".join(v for v in values if v) or None}
    return {name: (value or None) for name, value in zip(names, values)}


def _parse(text: str, source: str) -> _Matrix:
    lines = text.splitlines()
    header_at = next((i for i, line in enumerate(lines) if _is_header(line.split())), None)
    if header_at is None:
        raise FileFormatError(
            source, "no nvidia-smi topo -m header row found (a line whose first field is GPU0, "
                    "followed by GPU1.., NIC columns and CPU Affinity)")
    tokens = lines[header_at].split()
    start = _trailing_start(tokens)
    columns = tuple(tokens[:start])
    names = _trailing_names(list(tokens[start:]))
    where = f"line {header_at + 1}"
    duplicates = sorted(c for c, k in Counter(columns).items() if k > 1)
    if duplicates:
        raise FileFormatError(source, f"{where} (header): column(s) {', '.join(duplicates)} "
                                     "appear twice")
    gpus = tuple(c for c in columns if _GPU_LABEL.match(c))
    column_set, gpu_set = set(columns), set(gpus)
    width = len(columns)

    cells: dict[str, tuple[str, ...]] = {}
    affinity: dict[str, dict[str, str | None]] = {}
    seen: set[str] = set()
    end = len(lines)
    for index in range(header_at + 1, len(lines)):
        line = lines[index]
        fields = _fields(line)
        if not line.strip() or not fields or fields[0] not in column_set:
            end = index
            break
        label = fields[0]
        if label in seen:
            raise FileFormatError(source, f"line {index + 1}: a second row for {label}")
        seen.add(label)
        if label not in gpu_set:
            continue  # NIC rows repeat what the GPU rows say about NICs
        row = fields[1:1 + width]
        if len(row) < width or any(cell == "" for cell in row):
            got = sum(1 for cell in row if cell)
            raise FileFormatError(
                source, f"line {index + 1}: row {label} has {got} cells, expected {width} (one per "
                        f"column {columns[0]}..{columns[-1]}); the matrix looks truncated")
        for column, cell in zip(columns, row):
            if cell != "X" and cell not in _PATH_CELLS and not _NV_CELL.match(cell):
                raise FileFormatError(
                    source, f"line {index + 1}: row {label}, column {column}: unknown cell "
                            f"{shown(cell)}; expected X, NV#, {', '.join(_PATH_CELLS)}")
        cells[label] = tuple(row)
        affinity[label] = _affinity(fields[1 + width:], names, "\t" in line)
    missing = [g for g in gpus if g not in cells]
    if missing:
        stop = lines[end] if end < len(lines) else ""
        # A line that is not blank ended the matrix: its label is the fault, not a truncation.
        why = (f"line {end + 1} ends it: its first field {shown(_fields(stop)[0])} is not a "
               "column of the header" if stop.strip() and _fields(stop) else
               "the output looks truncated")
        raise FileFormatError(
            source, f"the matrix is incomplete: the header ({where}) names {len(gpus)} GPUs "
                    f"({gpus[0]}..{gpus[-1]}) but no row for {', '.join(missing)} follows; "
                    f"{why}")

    rest = lines[end:]
    second = next((end + i for i, line in enumerate(rest) if _is_header(line.split())), None)
    if second is not None:  # e.g. the output of several hosts: which one is meant?
        raise FileFormatError(source, f"line {second + 1}: a second matrix (the first's header is "
                                      f"{where}); a file describes one machine: keep one")
    legend_found = any(line.strip() == "Legend:" for line in rest)
    nv_legend_found = any(_NV_LEGEND.match(line) for line in rest)
    nic_names = {m.group(1): m.group(2) for m in map(_NIC_LEGEND.match, rest) if m}
    return _Matrix(columns, gpus, cells, affinity, legend_found, nv_legend_found, nic_names)


def _nv_counts(matrix: _Matrix, source: str) -> list[list[int]]:
    """``counts[a][b]``: the ``NV#`` number between GPU ranks a and b (0: no NVLink)."""
    position = {c: i for i, c in enumerate(matrix.columns)}
    n = len(matrix.gpus)
    counts = [[0] * n for _ in range(n)]
    for a, ga in enumerate(matrix.gpus):
        for b, gb in enumerate(matrix.gpus):
            cell = matrix.cells[ga][position[gb]]
            if (cell == "X") != (a == b):
                expected = "X (self)" if a == b else "a link type, not X"
                raise FileFormatError(
                    source, f"row {ga}, column {gb}: cell {shown(cell)}, expected {expected}")
            match = _NV_CELL.match(cell)
            if match:
                # Compared as text first: no int() of thousands of digits.
                digits = match.group(1).lstrip("0") or "0"
                count = int(digits) if len(digits) <= 20 else MAX_LINKS_PER_GPU + 1
                if count < 1:
                    raise FileFormatError(source, f"row {ga}, column {gb}: {cell} names no link")
                if count > MAX_LINKS_PER_GPU:
                    raise FileFormatError(
                        source, f"row {ga}, column {gb}: {shown(cell)} is more than the "
                                f"{MAX_LINKS_PER_GPU} links an import accepts between two GPUs "
                                f"(a GPU has at most {MAX_NVLINKS_PER_GPU})")
                counts[a][b] = count
    for a in range(n):
        for b in range(a):
            if counts[a][b] != counts[b][a]:
                raise FileFormatError(
                    source, f"the NVLink counts are not symmetric: row {matrix.gpus[a]} says "
                            f"{_cell(counts[a][b])} to {matrix.gpus[b]} but row {matrix.gpus[b]} "
                            f"says {_cell(counts[b][a])} to {matrix.gpus[a]}")
    return counts


def _cell(count: int) -> str:
    return f"NV{count}" if count else "no NVLink"


def _nic_metadata(matrix: _Matrix) -> list[dict[str, object]]:
    position = {c: i for i, c in enumerate(matrix.columns)}
    nics = []
    gpu_set = set(matrix.gpus)
    for column in matrix.columns:
        if column in gpu_set:
            continue
        paths = [matrix.cells[g][position[column]] for g in matrix.gpus]
        nics.append({
            "column": column,
            "device": matrix.nic_names.get(column, column),
            "paths": paths,
            "near_ranks": [r for r, p in enumerate(paths) if p in _NEAR_PATHS],
        })
    return nics


def import_nvidia_smi(text: str, *, name: str | None = None, source: str = "<nvidia-smi topo -m>",
                      gpu_model: str | None = None, assume_pcie: bool = False) -> Topology:
    """Build a :class:`Topology` of the GPUs in ``nvidia-smi topo -m`` output.

    Parameters
    ----------
    text:
        The command's output. Lines before the header row and after the matrix are ignored (a
        second matrix is refused).
    name:
        The topology name (default ``"nvidia-smi"``).
    source:
        Where the text came from (a path), used in error messages and ``metadata["source"]``.
    gpu_model:
        The GPU model (``nvidia-smi -L``: ``"NVIDIA H100 80GB HBM3"``), to set ``unit_gbps`` to the
        per-direction GB/s of one NVLink of that generation. The matrix alone does not say.
    assume_pcie:
        Import ``topo -mp`` output (which hides NVLink) as a PCIe-only machine instead of
        refusing it.

    Returns
    -------
    Topology
        Rank ``i`` is the i-th ``GPU`` column. See docs/topologies.md for the three models.

    Raises
    ------
    FileFormatError
        No header row, a truncated or malformed matrix, a second matrix, one GPU only,
        ``topo -mp`` output, or NVLink counts that fit neither model.
    InputTooLargeError
        Text above 16 MiB, or more than 1024 GPUs.

    Examples
    --------
    >>> text = "\\tGPU0\\tGPU1\\tGPU2\\tGPU3\\tCPU Affinity\\n" + "".join(
    ...     f"GPU{a}\\t" + "\\t".join(" X " if a == b else "NV12" for b in range(4)) + "\\t0-7\\n"
    ...     for a in range(4))
    >>> t = import_nvidia_smi(text)
    >>> t.metadata["interconnect"], t.bandwidth(0, 3), sorted({g.limit for g in t.groups})
    ('nvswitch', 12, [12])
    """
    check_input_size(len(text), source)
    matrix = _parse(text, source)
    n = len(matrix.gpus)
    check_gpu_count(n, source, ", ".join(matrix.gpus))
    counts = _nv_counts(matrix, source)
    position = {c: i for i, c in enumerate(matrix.columns)}
    paths = [[matrix.cells[ga][position[gb]] for gb in matrix.gpus] for ga in matrix.gpus]
    topo_name = name or "nvidia-smi"
    view = "nvidia-smi topo -m"
    warnings: list[str] = []
    metadata: dict[str, object] = {
        "source": source,
        "gpus": list(matrix.gpus),
        "paths": paths,
        "gpu_affinity": [matrix.affinity[g] for g in matrix.gpus],
        "nics": _nic_metadata(matrix),
    }
    off_diagonal = {counts[a][b] for a in range(n) for b in range(n) if a != b}

    if off_diagonal == {0}:
        if matrix.legend_found and not matrix.nv_legend_found:
            view = "nvidia-smi topo -mp"
            if not assume_pcie:
                raise FileFormatError(
                    source, "this is nvidia-smi topo -mp output (its legend has no NV# line): it "
                            "shows PCIe paths only and hides NVLink, so the GPU links are unknown; "
                            "use nvidia-smi topo -m, or pass assume_pcie=True to import it as a "
                            "PCIe-only machine")
            warnings.append("topo -mp output hides NVLink; imported as PCIe-only because "
                            "assume_pcie=True")
        metadata.update(format=view, interconnect="pcie", warnings=warnings,
                        unit="one GPU's PCIe port (x16 assumed) in one direction; the PCIe "
                             "tree is not modelled, see 'paths'",
                        nvlink_model="no NV# cell: PCIe only, every pair 1 unit, per-GPU "
                                     "egress/ingress limit 1")
        return pcie_topology(topo_name, n, metadata=metadata,
                             description=f"{n} GPUs, PCIe only (from {view})")

    unit_gbps = nvlink_gbps_for_model(gpu_model)
    if gpu_model is not None:
        metadata["gpu_model"] = gpu_model
        if unit_gbps is None:
            warnings.append(f"GPU model {gpu_model!r} not recognised: unit_gbps left unknown")
    metadata.update(format=view, unit="one NVLink in one direction")
    k = next(iter(off_diagonal))
    if len(off_diagonal) == 1 and n >= 3 and (k * (n - 1) > MAX_NVLINKS_PER_GPU
                                                or k in _SWITCH_LINK_COUNTS):
        links = tuple(tuple(0 if a == b else k for b in range(n)) for a in range(n))
        peers = [[b for b in range(n) if b != a] for a in range(n)]
        metadata.update(
            interconnect="nvswitch", nvlinks_per_gpu=[k] * n, warnings=warnings,
            nvlink_model=f"every pair shows NV{k} and {n} GPUs x NV{k} cannot be point-to-point "
                         f"(NV{k} is the per-GPU total on an NVSwitch baseboard): all pairs "
                         f"linked with {k} units, per-GPU egress/ingress limit {k}")
        return Topology(topo_name, links, switch_groups(peers, [k] * n), unit_gbps=unit_gbps,
                        description=f"{n} GPUs on NVSwitch, {k} NVLinks per GPU (from {view})",
                        metadata=metadata)

    totals = [sum(row) for row in counts]
    for a, total in enumerate(totals):
        if total > MAX_NVLINKS_PER_GPU:
            raise FileFormatError(
                source, f"row {matrix.gpus[a]} adds up to {total} NVLinks, more than the "
                        f"{MAX_NVLINKS_PER_GPU} a GPU has, but its NV# values differ between peers: "
                        "neither point-to-point NVLink nor a uniform NVSwitch fits")
    links = tuple(tuple(row) for row in counts)
    parts = components(links)
    if len(parts) > 1:
        warnings.append(f"the NVLink graph is disconnected (components {parts}); pairs without "
                        "NVLink talk over PCIe, which this model leaves out")
    metadata.update(interconnect="nvlink", nvlinks_per_gpu=totals, warnings=warnings,
                    nvlink_model="point-to-point: links[a][b] = the NV# count between a and b")
    low, high = min(c for c in off_diagonal if c), max(off_diagonal)
    per_pair = f"{low}" if low == high else f"{low}-{high}"
    return Topology(topo_name, links, unit_gbps=unit_gbps, metadata=metadata,
                    description=f"{n} GPUs, point-to-point NVLink ({per_pair} links per linked "
                                f"pair, up to {max(totals)} per GPU; from {view})")
