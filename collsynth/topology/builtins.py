"""Built-in topologies: the data files in ``topologies/`` and the parametric families.

Names are case-insensitive. A family is named ``FAMILY:N`` (``ring:8``, ``hub:16``) or by its shape
(``torus:4x4``, ``mesh:2x3x4``, ``hypercube:3``). Any name may end with physical figures,
``,unit_gbps=GBPS`` (GB/s of one bandwidth unit) and ``,alpha_us=US`` (latency of one step): they
replace the topology's own, so ``torus:4x4,unit_gbps=50,alpha_us=1`` can be timed and planned.
"""

from __future__ import annotations

import dataclasses
import math
from functools import lru_cache
from pathlib import Path

from collsynth._parse import NumberTextError, number_text, shown
from collsynth.errors import InvalidTopologyError, UnknownNameError, expect_type
from collsynth.topology.families import FAMILIES, SHAPED_FAMILIES
from collsynth.topology.fileformat import FIGURE_RANGES, figure_range_text, load_topology
from collsynth.topology.model import Topology

__all__ = ["data_directory", "builtin_names", "get_topology", "list_topologies", "with_figures",
           "name_figures", "FIGURE_OPTIONS"]

#: The physical figures a name may set (``ring:8,unit_gbps=25,alpha_us=0.7``).
FIGURE_OPTIONS = ("unit_gbps", "alpha_us")


def data_directory() -> Path:
    """Where the built-in topology files are: ``collsynth/topologies/`` inside an installed
    package, or ``topologies/`` at the root of a source checkout (editable installs)."""
    package = Path(__file__).resolve().parents[1]
    installed = package / "topologies"
    if installed.is_dir() and any(installed.glob("*.json")):
        return installed
    return package.parent / "topologies"


@lru_cache(maxsize=1)
def _files() -> dict[str, Path]:
    return {p.stem.lower(): p for p in sorted(data_directory().glob("*.json"))}


def builtin_names() -> list[str]:
    """Names of the built-in topology files (lower case) and the families (``ring:N``...)."""
    return (sorted(_files()) + [f"{family}:N" for family in FAMILIES]
            + [syntax for syntax, _, _ in SHAPED_FAMILIES.values()])


def with_figures(topology: Topology, *, unit_gbps: float | None = None,
                 alpha_us: float | None = None) -> Topology:
    """``topology`` with its physical figures replaced where given (``None`` keeps its own).

    >>> ring = with_figures(get_topology("ring:4"), unit_gbps=25, alpha_us=1)
    >>> ring.unit_gbps, ring.alpha_us
    (25.0, 1.0)

    Raises
    ------
    InvalidTopologyError
        For a figure that is not a finite number within the bounds a topology file has
        (:data:`FIGURE_RANGES`: ``unit_gbps`` from 1 kB/s to 1 PB/s, ``alpha_us`` from 1 ps
        to an hour).
    """
    changes = {}
    for name, value in (("unit_gbps", unit_gbps), ("alpha_us", alpha_us)):
        if value is None:
            continue
        low, high, _, _ = FIGURE_RANGES[name]
        if (isinstance(value, bool) or not isinstance(value, (int, float))
                or not math.isfinite(value) or not low <= value <= high):
            raise InvalidTopologyError(f"topology {topology.name!r}: {name} = {shown(value)}; "
                                       f"expected a finite positive number {figure_range_text(name)}")
        changes[name] = float(value)
    return dataclasses.replace(topology, **changes) if changes else topology


def _figures(name: str, options: list[str]) -> dict[str, float]:
    """Parse ``["unit_gbps=50", "alpha_us=1"]`` from a name's options."""
    figures: dict[str, float] = {}
    for option in options:
        key, sep, value = option.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or key not in FIGURE_OPTIONS:
            raise InvalidTopologyError(
                f"topology {name!r}: option {option.strip()!r} not understood; expected "
                f"{' or '.join(k + '=NUMBER' for k in FIGURE_OPTIONS)}, e.g. "
                "torus:4x4,unit_gbps=50,alpha_us=1")
        if key in figures:
            raise InvalidTopologyError(f"topology {name!r}: {key} given twice; give each figure "
                                       "once")
        why = ""
        try:
            number = float(number_text(value))
        except ValueError as exc:
            number = math.nan
            why = f": {exc}" if isinstance(exc, NumberTextError) else ""
        low, high, _, _ = FIGURE_RANGES[key]
        if not math.isfinite(number) or not low <= number <= high:
            raise InvalidTopologyError(f"topology {name!r}: {key} = {shown(value.strip())}; "
                                       f"expected a finite positive number {figure_range_text(key)}"
                                       f"{why}")
        figures[key] = number
    return figures


@lru_cache(maxsize=64)
def _load_builtin(key: str) -> Topology:
    return load_topology(_files()[key])


def get_topology(name: str) -> Topology:
    """A built-in topology by name.

    >>> get_topology("DGX1").num_ranks
    8
    >>> get_topology("ring:4").bandwidth(0, 3)
    1
    >>> get_topology("torus:4x4,unit_gbps=50,alpha_us=1").unit_gbps
    50.0

    Raises
    ------
    UnknownNameError
        Listing the valid names.
    InvalidTopologyError, InputTooLargeError
        A family of a size it does not have (``torus:4x1``, ``hypercube:20``), or an option that is
        not a known figure with a positive value.
    """
    expect_type(name, str, "get_topology: name")  # a library caller's None, not AttributeError
    key, *options = name.strip().lower().split(",")
    key = key.strip()
    topology = _get_topology(key, name)
    if not options:
        return topology
    return with_figures(topology, **_figures(name, options))


def name_figures(name: str) -> dict[str, float]:
    """The physical figures the name of a built-in or family sets (``{}`` for none).

    >>> name_figures("ring:8,unit_gbps=25"), name_figures("dgx1")
    ({'unit_gbps': 25.0}, {})

    Raises
    ------
    InvalidTopologyError
        An option that is not a known figure, a figure given twice or not a positive number.
    """
    _, *options = name.strip().lower().split(",")
    return _figures(name, options) if options else {}


def _get_topology(key: str, name: str) -> Topology:
    if ":" in key:
        family, _, size = key.partition(":")
        family = {"fc": "fully-connected", "fully_connected": "fully-connected",
                  "fullyconnected": "fully-connected"}.get(family, family)
        if family in FAMILIES:
            try:
                n = int(number_text(size))
            except ValueError as exc:
                why = f": {exc}" if isinstance(exc, NumberTextError) else ""
                raise UnknownNameError(f"topology {name!r}: expected {family}:N with N a whole "
                                       f"number of ranks{why}") from None
            return FAMILIES[family](n)
        if family in SHAPED_FAMILIES:
            return SHAPED_FAMILIES[family][1](size)
    if key in _files():
        return _load_builtin(key)
    raise UnknownNameError(
        f"unknown topology {name!r}; valid names: {', '.join(builtin_names())} "
        "(or a path to a topology JSON file or an NCCL topology XML dump)"
    )


def list_topologies() -> list[tuple[str, int | None, str]]:
    """``(name, ranks, description)`` for every built-in; families have ``ranks = None``."""
    rows: list[tuple[str, int | None, str]] = []
    for key in sorted(_files()):
        topo = _load_builtin(key)
        rows.append((topo.name, topo.num_ranks, topo.description))
    for family, build in FAMILIES.items():
        rows.append((f"{family}:N", None, build(4).description.replace("4 ranks", "N ranks")))
    for syntax, _, description in SHAPED_FAMILIES.values():
        rows.append((syntax, None, description))
    return rows
