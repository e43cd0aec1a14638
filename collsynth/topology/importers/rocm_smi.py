"""Import the tables that ``rocm-smi --showtopo`` prints.

The output has up to four blocks, each under a ``=== title ===`` banner: ``Weight between two
GPUs``, ``Hops between two GPUs``, ``Link Type between two GPUs`` (``XGMI`` or ``PCIE``) and
``Numa Nodes``. Tables are space aligned with ``GPU0..`` headers and a ``0`` diagonal. Both the
newer layout (``GPU[0]<TAB><TAB>: (Topology) Numa Node: 0``) and the older one (``GPU 0    : ...``)
are read; other lines (a shell prompt, a ``WARNING:`` line, the log banners) are ignored.

The details: ``docs/topologies.md``, section "The rocm-smi matrix".
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from collsynth._parse import shown
from collsynth.errors import FileFormatError
from collsynth.topology.importers._common import (
    check_gpu_count,
    check_input_size,
    components,
    pcie_topology,
)
from collsynth.topology.model import Topology

__all__ = ["import_rocm_smi", "looks_like_rocm_smi"]

_GPU_LABEL = re.compile(r"^GPU([0-9]+)$")  # [0-9]: \d matches any script's digits
# Each optional bracket takes the blanks after it, so no two \s* meet: a regex whose \s* runs can
# split a long blank run in many ways takes quadratic time on it.
_NUMA_LINE = re.compile(
    r"^\s*GPU\s*(?:\[\s*)?([0-9]+)\s*(?:\]\s*)?:\s*\(Topology\)\s*Numa\s+(Node|Affinity)\s*:\s*(\S*)\s*$")
_TABLES = {
    "Weight between two GPUs": "weight",
    "Hops between two GPUs": "hops",
    "Link Type between two GPUs": "link_type",
}
#: rocm-smi's weight of one XGMI hop.
XGMI_HOP_WEIGHT = 15


def _banner(line: str) -> str | None:
    """The title of a banner line ``=== Title ===`` (3 or more ``=`` each side), else None.

    Written without a regex: the obvious one backtracks in cubic time on a line of thousands of
    ``=``.

    >>> _banner("====== Weight between two GPUs ======"), _banner("== x =="), _banner("=" * 6)
    ('Weight between two GPUs', None, '')
    """
    text = line.strip()
    if not text.startswith("===") or not text.endswith("==="):
        return None
    if not text.strip("="):
        return "" if len(text) >= 6 else None
    head = len(text) - len(text.lstrip("="))
    tail = len(text) - len(text.rstrip("="))
    return text[head:len(text) - tail].strip()


def looks_like_rocm_smi(text: str) -> bool:
    """True when ``text`` has a rocm-smi ``Weight``, ``Hops`` or ``Link Type between two GPUs``
    banner.

    >>> looks_like_rocm_smi("==== Link Type between two GPUs ====\\n")
    True
    """
    return any(_banner(line) in _TABLES for line in text.splitlines())


@dataclass
class _Table:
    title: str
    line: int  # 1-based line of the banner
    columns: tuple[str, ...] = ()
    rows: list[list[str]] = field(default_factory=list)


def _read_tables(lines: list[str], source: str) -> dict[str, _Table]:
    tables: dict[str, _Table] = {}
    current: _Table | None = None
    for index, line in enumerate(lines):
        banner = _banner(line)
        if banner is not None:
            key = _TABLES.get(banner)
            current = None
            if key is not None:
                if key in tables:
                    raise FileFormatError(
                        source, f"line {index + 1}: a second {banner!r} table")
                current = tables[key] = _Table(banner, index + 1)
            continue
        if current is None:
            continue
        tokens = line.split()
        if not tokens:
            if current.columns:
                current = None  # a blank line ends the table
            continue
        if not current.columns:
            if not all(_GPU_LABEL.match(t) for t in tokens):
                raise FileFormatError(
                    source, f"line {index + 1}: expected the {current.title!r} header (GPU0 GPU1 "
                            f"...), found {shown(line.strip())}")
            current.columns = tuple(tokens)
            continue
        if not _GPU_LABEL.match(tokens[0]):
            current = None
            continue
        done = len(current.rows)
        expected_label = current.columns[done] if done < len(current.columns) else None
        if tokens[0] != expected_label:
            raise FileFormatError(
                source, f"line {index + 1}: row {tokens[0]} in the {current.title!r} table; "
                        f"expected {expected_label or 'no more rows'} (rows follow the columns)")
        if len(tokens) - 1 != len(current.columns):
            raise FileFormatError(
                source, f"line {index + 1}: row {tokens[0]} of the {current.title!r} table has "
                        f"{len(tokens) - 1} cells, expected {len(current.columns)}")
        current.rows.append(tokens[1:])
    for table in tables.values():
        if not table.columns:
            raise FileFormatError(source, f"line {table.line}: the {table.title!r} table is empty")
        if len(table.rows) != len(table.columns):
            raise FileFormatError(
                source, f"the {table.title!r} table (line {table.line}) has {len(table.rows)} rows "
                        f"for {len(table.columns)} columns; the output looks truncated")
    return tables


def _numbers(table: _Table, source: str) -> list[list[int]]:
    result = []
    for a, row in enumerate(table.rows):
        values = []
        for b, cell in enumerate(row):
            try:
                # weights and hops are small (no int() of 5000 digits), in ASCII digits
                if len(cell) > 10 or not cell.isascii():
                    raise ValueError(cell)
                values.append(int(cell))
            except ValueError:
                raise FileFormatError(
                    source, f"the {table.title!r} table (line {table.line}): row {table.columns[a]}, "
                            f"column {table.columns[b]} is {shown(cell)}, expected a whole "
                            "number") from None
        result.append(values)
    return result


def _numa(lines: list[str], n: int) -> tuple[list[str | None], list[str | None]]:
    node: list[str | None] = [None] * n
    affinity: list[str | None] = [None] * n
    for line in lines:
        match = _NUMA_LINE.match(line)
        if match and len(match.group(1)) <= 10 and int(match.group(1)) < n:
            target = node if match.group(2) == "Node" else affinity
            target[int(match.group(1))] = match.group(3) or None
    return node, affinity


def import_rocm_smi(text: str, *, name: str | None = None,
                    source: str = "<rocm-smi --showtopo>") -> Topology:
    """Build a :class:`Topology` of the GPUs in ``rocm-smi --showtopo`` output.

    Parameters
    ----------
    text:
        The command's output.
    name:
        The topology name (default ``"rocm-smi"``).
    source:
        Where the text came from (a path), for error messages and ``metadata["source"]``.

    Returns
    -------
    Topology
        Rank ``i`` is column ``GPUi``; see docs/topologies.md for the link model.

    Raises
    ------
    FileFormatError
        No Link Type and no Weight table, tables of different sizes, a malformed or truncated
        table, a non-zero diagonal, an asymmetric link, or one GPU only.
    InputTooLargeError
        Text above 16 MiB, or more than 1024 GPUs.

    Examples
    --------
    >>> rows = "".join(f"GPU{a}   " + "   ".join("0" if a == b else "XGMI" for b in range(3)) + "\\n"
    ...                for a in range(3))
    >>> t = import_rocm_smi("=== Link Type between two GPUs ===\\n   GPU0   GPU1   GPU2\\n" + rows)
    >>> t.metadata["interconnect"], t.links[0]
    ('xgmi', (0, 1, 1))
    """
    check_input_size(len(text), source)
    lines = text.splitlines()
    tables = _read_tables(lines, source)
    if "link_type" not in tables and "weight" not in tables:
        raise FileFormatError(
            source, "no 'Link Type between two GPUs' or 'Weight between two GPUs' table found "
                    "(expected rocm-smi --showtopo output)")
    first = tables.get("link_type") or tables["weight"]
    columns = first.columns
    for table in tables.values():
        if table.columns != columns:
            raise FileFormatError(
                source, f"the {table.title!r} table (line {table.line}) has columns "
                        f"{' '.join(table.columns)}, but the {first.title!r} table has "
                        f"{' '.join(columns)}")
    n = len(columns)
    check_gpu_count(n, source, ", ".join(columns))
    weight = _numbers(tables["weight"], source) if "weight" in tables else None
    hops = _numbers(tables["hops"], source) if "hops" in tables else None
    kinds = ([[cell.upper() for cell in row] for row in tables["link_type"].rows]
             if "link_type" in tables else None)

    for key, table in tables.items():
        for a in range(n):
            if table.rows[a][a] != "0":
                raise FileFormatError(
                    source, f"the {table.title!r} table (line {table.line}): diagonal cell "
                            f"{columns[a]},{columns[a]} is {shown(table.rows[a][a])}, expected 0")

    def direct(a: int, b: int) -> bool:
        xgmi = kinds[a][b] == "XGMI" if kinds is not None else weight[a][b] == XGMI_HOP_WEIGHT
        if not xgmi:
            return False
        if weight is not None:
            return weight[a][b] == XGMI_HOP_WEIGHT
        return hops is None or hops[a][b] == 1

    linked = [[a != b and direct(a, b) for b in range(n)] for a in range(n)]
    for a in range(n):
        for b in range(a):
            if linked[a][b] != linked[b][a]:
                raise FileFormatError(
                    source, f"the link between {columns[a]} and {columns[b]} is not symmetric: "
                            f"{columns[a]}->{columns[b]} is {'' if linked[a][b] else 'not '}a direct "
                            f"XGMI link but {columns[b]}->{columns[a]} is "
                            f"{'' if linked[b][a] else 'not '}")
    numa_node, numa_affinity = _numa(lines, n)
    topo_name = name or "rocm-smi"
    metadata: dict[str, object] = {
        "source": source,
        "format": "rocm-smi --showtopo",
        "gpus": list(columns),
        "link_type": kinds,
        "weight": weight,
        "hops": hops,
        "numa_node": numa_node,
        "numa_affinity": numa_affinity,
    }
    warnings: list[str] = []
    if not any(any(row) for row in linked):
        metadata.update(interconnect="pcie", warnings=warnings,
                        unit="one GPU's PCIe port (x16 assumed) in one direction",
                        link_model="no direct XGMI pair: PCIe only, every pair 1 unit, per-GPU "
                                   "egress/ingress limit 1")
        return pcie_topology(topo_name, n, metadata=metadata,
                             description=f"{n} GPUs, PCIe only (from rocm-smi --showtopo)")
    links = tuple(tuple(1 if linked[a][b] else 0 for b in range(n)) for a in range(n))
    parts = components(links)
    if len(parts) > 1:
        warnings.append(f"the XGMI graph is disconnected (components {parts}); pairs without "
                        "XGMI talk over PCIe, which this model leaves out")
    degree = [sum(row) for row in links]
    metadata.update(interconnect="xgmi", warnings=warnings,
                    unit="one XGMI link in one direction (the link count per pair is not shown: 1 "
                         "assumed)",
                    link_model="a pair is linked when its link type is XGMI and its weight is "
                               f"{XGMI_HOP_WEIGHT} (one hop); 1 unit per direction")
    shape = ("fully connected" if all(d == n - 1 for d in degree)
             else f"{min(degree)}-{max(degree)} peers per GPU")
    return Topology(topo_name, links, metadata=metadata,
                    description=f"{n} GPUs, XGMI point-to-point, {shape} (from rocm-smi --showtopo)")
