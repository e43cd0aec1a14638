"""Built-in topologies: the data files in ``topologies/`` and the parametric families.

Names are case-insensitive. A family is named ``FAMILY:N`` (``ring:8``, ``hub:16``).
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from collsynth.errors import UnknownNameError
from collsynth.topology.families import FAMILIES
from collsynth.topology.fileformat import load_topology
from collsynth.topology.model import Topology

__all__ = ["data_directory", "builtin_names", "get_topology", "list_topologies"]

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
    return sorted(_files()) + [f"{family}:N" for family in FAMILIES]


@lru_cache(maxsize=64)
def _load_builtin(key: str) -> Topology:
    return load_topology(_files()[key])


def get_topology(name: str) -> Topology:
    """A built-in topology by name.

    >>> get_topology("DGX1").num_ranks
    8
    >>> get_topology("ring:4").bandwidth(0, 3)
    1

    Raises
    ------
    UnknownNameError
        Listing the valid names.
    """
    key = name.strip().lower()
    if ":" in key:
        family, _, size = key.partition(":")
        family = {"fc": "fully-connected", "fully_connected": "fully-connected",
                  "fullyconnected": "fully-connected"}.get(family, family)
        if family in FAMILIES:
            try:
                n = int(size)
            except ValueError:
                raise UnknownNameError(f"topology {name!r}: expected {family}:N with N a whole "
                                       "number of ranks") from None
            return FAMILIES[family](n)
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
    return rows
