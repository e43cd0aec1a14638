"""The collsynth topology file format (JSON), version 1.

The details: ``docs/topologies.md``, section "Topology files".
"""

from __future__ import annotations

import copy
import json
import os
from types import MappingProxyType
from typing import Any, Mapping

from collsynth._parse import (
    MAX_GBPS,
    MAX_LINK_UNITS,
    MAX_TIME_US,
    MIN_GBPS,
    MIN_LATENCY_US,
    bounded_float,
    bounded_int,
    clean_name,
    clean_text,
    format_version_is,
    free_form,
    read_json,
    shown,
)
from collsynth.errors import CollsynthError, FileFormatError, InputTooLargeError
from collsynth.topology.compose import check_nic_layout
from collsynth.topology.machine import machine_metadata_problem
from collsynth.topology.model import MAX_RANKS, BandwidthGroup, Topology

__all__ = ["FORMAT_NAME", "FORMAT_VERSION", "MAX_FILE_BYTES", "read_json_file", "load_topology",
           "topology_from_json", "topology_to_json", "save_topology", "FIGURE_RANGES",
           "figure_range_text"]

FORMAT_NAME = "collsynth-topology"
FORMAT_VERSION = 1
#: Each physical figure's accepted range ``(low, high, unit, in words)``, the same in a topology
#: file, a name (``NAME,alpha_us=US``) and the options (``--unit-gbps``, ``--alpha-us``): from
#: 1 kB/s to 1 PB/s per bandwidth unit (:data:`~collsynth._parse.MIN_GBPS` to
#: :data:`~collsynth._parse.MAX_GBPS`), from 1 ps to an hour per step
#: (:data:`~collsynth._parse.MIN_LATENCY_US` to :data:`~collsynth._parse.MAX_TIME_US`).
FIGURE_RANGES: Mapping[str, tuple[float, float, str, str]] = MappingProxyType({
    "unit_gbps": (MIN_GBPS, MAX_GBPS, "GB/s", "1 kB/s to 1 PB/s"),
    "alpha_us": (MIN_LATENCY_US, MAX_TIME_US, "us", "1 ps to an hour")})


def figure_range_text(name: str) -> str:
    """How a message states the range of figure ``name``.

    >>> figure_range_text("alpha_us")
    'from 1e-06 to 3.6e+09 us (1 ps to an hour)'
    """
    low, high, unit, words = FIGURE_RANGES[name]
    return f"from {low:g} to {high:g} {unit} ({words})"


#: Largest JSON or XML file collsynth reads (bytes).
MAX_FILE_BYTES = 64 * 1024 * 1024



def max_groups(ranks: int) -> int:
    """The most bandwidth groups a topology file of ``ranks`` ranks may give: 8 per rank and 64
    (composed machines have 4 to 6 per rank: a GPU's NVSwitch ports and its NIC's each way, and
    a rail fabric's oversubscribed leaves). 80000
    groups on 8 ranks ran a solve past 150 s and 2.8 GB in its bounds' LP.

    >>> max_groups(8), max_groups(1024)
    (128, 8256)
    """
    return 8 * ranks + 64

def read_json_file(path: str | os.PathLike[str], *, max_bytes: int = MAX_FILE_BYTES) -> Any:
    """Read and parse a JSON file, refusing files larger than ``max_bytes``, ``NaN`` and
    ``Infinity``, and numbers too long to be meant (see :func:`collsynth._parse.parse_json`).

    Raises :class:`FileFormatError` (naming the file, and the line and column for bad JSON).
    """
    return read_json(path, max_bytes=max_bytes)


#: The fields of a topology file and of one of its groups (docs/topologies.md).
_TOP_FIELDS = frozenset({"format", "version", "name", "description", "links", "groups",
                         "unit_gbps", "alpha_us", "metadata"})
_GROUP_FIELDS = frozenset({"name", "sources", "destinations", "limit"})


def _field(obj: dict, key: str, kind: type | tuple, source: str, *, required: bool = True,
           default: Any = None) -> Any:
    if key not in obj:
        if required:
            raise FileFormatError(source, f"missing field {key!r}")
        return default
    value = obj[key]
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise FileFormatError(source, f"field {key!r} is {type(value).__name__}, expected {names}")
    return value


def _rank_list(value: Any, source: str, where: str) -> frozenset[int]:
    if not isinstance(value, list) or not all(isinstance(r, int) and not isinstance(r, bool)
                                              for r in value):
        raise FileFormatError(source, f"{where} must be a list of rank numbers")
    return frozenset(value)


def _check_nic(nic: Any, source: str) -> None:
    """The figures of ``metadata.nic`` that composing nodes computes with, bounded here so a
    hostile file is refused naming its field (the layout: :func:`check_nic_layout`)."""
    if not isinstance(nic, dict):
        return  # absent, or refused with its reason when composing
    if nic.get("gbps") is not None:
        bounded_float(nic["gbps"], "metadata.nic.gbps", source=source, lo=MIN_GBPS, hi=MAX_GBPS)
    if nic.get("count") is not None:
        bounded_int(nic["count"], "metadata.nic.count", source=source, lo=1, hi=MAX_RANKS)


def topology_from_json(obj: Any, *, source: str = "<topology>") -> Topology:
    """Build a :class:`Topology` from the parsed JSON object of a topology file."""
    if not isinstance(obj, dict):
        raise FileFormatError(source, "expected a JSON object at the top level")
    fmt = obj.get("format", FORMAT_NAME)
    if fmt != FORMAT_NAME:
        raise FileFormatError(source, f"field 'format' is {shown(fmt)}, expected {FORMAT_NAME!r}")
    version = obj.get("version", FORMAT_VERSION)
    if not format_version_is(version, FORMAT_VERSION):
        raise FileFormatError(source, f"unknown version {shown(version)}; this collsynth reads "
                                      f"version {FORMAT_VERSION}")
    unknown = sorted(set(obj) - _TOP_FIELDS, key=str)
    if unknown:  # a misspelt "unit_gpbs" would leave the machine without figures, silently
        raise FileFormatError(source, f"unknown field {shown(unknown[0])}; expected fields: "
                                      f"{', '.join(sorted(_TOP_FIELDS))}")
    name = clean_name(_field(obj, "name", str, source), "name", source=source)
    links = _field(obj, "links", list, source)
    if len(links) > MAX_RANKS:
        raise InputTooLargeError(f"{source}: {len(links)} ranks is more than the {MAX_RANKS} "
                                 "collsynth accepts")
    for i, row in enumerate(links):
        if not isinstance(row, list):
            raise FileFormatError(source, f"links[{i}] is {type(row).__name__}, expected a list")
        for j, bw in enumerate(row):
            if not isinstance(bw, int) or isinstance(bw, bool):
                raise FileFormatError(source, f"links[{i}][{j}] = {shown(bw)}; expected an integer "
                                              "number of bandwidth units")
            if bw > MAX_LINK_UNITS:  # negative ones are refused by Topology, with their reason
                bounded_int(bw, f"links[{i}][{j}]", source=source, hi=MAX_LINK_UNITS,
                            why="bandwidth units per link")
    groups = []
    listed = _field(obj, "groups", list, source, required=False, default=[])
    most = max_groups(len(links))
    if len(listed) > most:
        raise FileFormatError(source, f"groups: {len(listed)} bandwidth groups on {len(links)} "
                                      f"ranks; expected at most {most} (8 per rank and 64; a "
                                      "machine composed of nodes has 4 to 6 per rank)")
    for k, g in enumerate(listed):
        if not isinstance(g, dict):
            raise FileFormatError(source, f"groups[{k}] must be an object")
        extra = sorted(set(g) - _GROUP_FIELDS, key=str)
        if extra:
            raise FileFormatError(source, f"groups[{k}]: unknown field {shown(extra[0])}; "
                                          f"expected {', '.join(sorted(_GROUP_FIELDS))}")
        limit = g.get("limit")
        if not isinstance(limit, int) or isinstance(limit, bool):
            raise FileFormatError(source, f"groups[{k}].limit = {shown(limit)}; expected an "
                                          "integer")
        # A group can at most carry what all of its links carry together.
        bounded_int(limit, f"groups[{k}].limit", source=source, lo=None,
                    hi=MAX_LINK_UNITS * MAX_RANKS, why="bandwidth units per group")
        group = BandwidthGroup(
            _rank_list(g.get("sources"), source, f"groups[{k}].sources"),
            _rank_list(g.get("destinations"), source, f"groups[{k}].destinations"),
            limit, clean_name(g.get("name", ""), f"groups[{k}].name", source=source, empty=True))
        groups.append(group)
    unit = _field(obj, "unit_gbps", (int, float), source, required=False)
    if unit is not None:
        unit = bounded_float(unit, "unit_gbps", source=source, lo=MIN_GBPS, hi=MAX_GBPS,
                             why="GB/s: " + FIGURE_RANGES["unit_gbps"][3])
    alpha = _field(obj, "alpha_us", (int, float), source, required=False)
    if alpha is not None:
        alpha = bounded_float(alpha, "alpha_us", source=source, lo=MIN_LATENCY_US,
                              hi=MAX_TIME_US, why="us: " + FIGURE_RANGES["alpha_us"][3])
    metadata = free_form(_field(obj, "metadata", dict, source, required=False, default={}),
                         "metadata", source=source)
    _check_nic(metadata.get("nic"), source)
    problem = machine_metadata_problem(metadata.get("machine"))
    if problem is not None:
        raise FileFormatError(source, problem)
    description = clean_text(obj.get("description", ""), "description", source=source)
    try:
        topology = Topology(name=name, links=tuple(tuple(row) for row in links),
                            groups=tuple(groups), unit_gbps=unit, alpha_us=alpha,
                            description=description, metadata=metadata)
        topology.layout  # read metadata['network'] now, so its errors name this file
        check_nic_layout(topology)  # and metadata['nic'], which composing reads
    except CollsynthError as exc:
        raise FileFormatError(source, str(exc)) from exc
    return topology


def topology_to_json(topology: Topology) -> dict[str, Any]:
    """The JSON object for ``topology`` (inverse of :func:`topology_from_json`)."""
    obj: dict[str, Any] = {
        "format": FORMAT_NAME,
        "version": FORMAT_VERSION,
        "name": topology.name,
        "description": topology.description,
        "links": [list(row) for row in topology.links],
        "groups": [
            {"name": g.name, "sources": sorted(g.sources), "destinations": sorted(g.destinations),
             "limit": g.limit}
            for g in topology.groups
        ],
    }
    if topology.unit_gbps is not None:
        obj["unit_gbps"] = topology.unit_gbps
    if topology.alpha_us is not None:
        obj["alpha_us"] = topology.alpha_us
    if topology.metadata:
        # A deep copy: a caller editing the object must not edit the (cached) topology.
        obj["metadata"] = copy.deepcopy(dict(topology.metadata))
    return obj


def load_topology(path: str | os.PathLike[str]) -> Topology:
    """Read a topology JSON file."""
    return topology_from_json(read_json_file(path), source=str(path))


def save_topology(topology: Topology, path: str | os.PathLike[str]) -> None:
    """Write ``topology`` as a JSON file (atomically: a temporary file renamed into place)."""
    from collsynth._atomic import write_text_atomic

    write_text_atomic(path, json.dumps(topology_to_json(topology), indent=1) + "\n")
