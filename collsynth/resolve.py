"""Turn what a user types (a name or a file path) into a topology or a collective.

Used by the CLI, and handy in notebooks: ``resolve_topology("dgx1")``,
``resolve_topology("ring:8")``, ``resolve_topology("machine/topo.xml", nodes=2)``,
``resolve_collective("allgather", 8)``, ``resolve_collective("pairs.json", 8)``.

A spec is read as a *file* when it contains a path separator or has an extension (``./dgx1``,
``topo.xml``, ``my.json``); otherwise as a built-in *name* (case-insensitive), falling back to a
file of that name when no built-in matches. So a file called ``dgx1`` in the current folder never
shadows the built-in DGX1; write ``./dgx1`` to read it.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Mapping, Sequence

from collsynth._files import read_head
from collsynth.collective.fileformat import load_collective
from collsynth.collective.model import Collective
from collsynth.collective.standard import standard_collective, standard_names
from collsynth.errors import (
    FileFormatError,
    InputWarning,
    InvalidCollectiveError,
    InvalidTopologyError,
    UnknownNameError,
)
from collsynth.topology.builtins import get_topology, name_figures, with_figures
from collsynth.topology.compose import compose_nodes
from collsynth.topology.fileformat import load_topology
from collsynth.topology.importers import import_topology_file
from collsynth.topology.model import Topology
from collsynth.topology.tiers import parse_oversubscription

__all__ = ["resolve_topology", "resolve_collective", "looks_like_path"]

#: Bytes read to tell a JSON topology from a tool's text output when the extension does not say.
_SNIFF_BYTES = 4096


def looks_like_path(spec: str) -> bool:
    """True when ``spec`` names a file rather than a built-in: it contains a path separator or
    has an extension.

    >>> looks_like_path("ring:8"), looks_like_path("dgx1"), looks_like_path("./dgx1")
    (False, False, True)
    >>> looks_like_path("topo.xml"), looks_like_path("data/topo")
    (True, True)
    >>> looks_like_path("torus:4x4,unit_gbps=12.5")  # figures after a name are not an extension
    False
    """
    separators = {"/", os.sep} | ({os.altsep} if os.altsep else set())
    if any(sep in spec for sep in separators):
        return True
    base, comma, options = spec.partition(",")
    if comma and "=" in options:
        spec = base
    return Path(spec).suffix != ""


def _names_a_file(text: str) -> bool:
    """A name no built-in has is read as a file when one of that name is in the folder: a
    regular file, or a link, whatever it points at (its reader then says a loop or a dangling
    link cannot be read, where ``is_file()``, False for both, left "unknown topology")."""
    path = Path(text)
    return path.is_file() or path.is_symlink()


def _load_topology_file(path: Path) -> Topology:
    """A topology JSON file (``.json``, or content starting with ``{``), else a machine dump."""
    if path.suffix.lower() == ".json":
        return load_topology(path)
    if path.suffix.lower() != ".xml" and path.is_file():
        head = read_head(path, _SNIFF_BYTES)
        if head.lstrip(b"\xef\xbb\xbf \t\r\n").startswith(b"{"):
            return load_topology(path)
    topology = import_topology_file(path)
    _warn_dropped(path, topology.metadata.get("warnings") or ())
    return topology


#: Import warnings issued one by one; the rest are counted in one more warning.
SHOWN_IMPORT_WARNINGS = 5


def _warn_dropped(path: Path, notes: Sequence[str]) -> None:
    """Issue an imported file's notes (``metadata["warnings"]``: links dropped or changed) as
    :class:`InputWarning`: the topology differs from the file, and the user should hear it."""
    for note in notes[:SHOWN_IMPORT_WARNINGS]:
        warnings.warn(f"{path}: {note}", InputWarning, stacklevel=3)
    if len(notes) > SHOWN_IMPORT_WARNINGS:
        warnings.warn(f"{path}: ... and {len(notes) - SHOWN_IMPORT_WARNINGS} more import "
                      "warnings (the topology's metadata['warnings'] lists them all)",
                      InputWarning, stacklevel=3)


def resolve_topology(spec: str, *, nodes: int | None = None,
                     nic_units: int | None = None,
                     oversubscription: float | str | Mapping[str, float] = 1,
                     fabric: str = "switch", nodes_per_leaf: int | None = None,
                     unit_gbps: float | None = None, alpha_us: float | None = None) -> Topology:
    """The topology a user named: a built-in, a family member, or a file.

    Parameters
    ----------
    spec:
        A built-in name (``dgx1``, ``DGX-A100``; case-insensitive), a family member (``ring:8``,
        ``hub:16``, ``torus:4x4``), optionally with figures (``ring:8,unit_gbps=25,alpha_us=1``),
        or a path: ``.json`` files are collsynth topology files; other files are NCCL/RCCL
        topology XML dumps or ``nvidia-smi topo -m`` / ``rocm-smi --showtopo`` output.
    nodes:
        With ``nodes > 1``, that many copies of the topology joined by their NICs
        (:func:`~collsynth.topology.compose.compose_nodes`).
    oversubscription:
        With ``nodes > 1``: ratio of a node's NIC bandwidth to its share of the network core
        (1, the default, is non-blocking); with another ``fabric``, of its main tier (leaf,
        rail). Per tier: a mapping or text like ``"leaf=2,node=1"``
        (:mod:`collsynth.topology.tiers`).
    fabric, nodes_per_leaf:
        With ``nodes > 1``: ``"switch"`` (default), ``"leaf-spine"`` (``nodes_per_leaf`` nodes
        under each leaf switch) or ``"rail"`` (NIC ``i`` of every node on rail switch ``i``).
    nic_units:
        Passed to ``compose_nodes``: the bandwidth of one NIC in the node's units, for nodes
        whose files do not describe their NICs.
    unit_gbps, alpha_us:
        Physical figures of one node (GB/s of one bandwidth unit, latency of one step in
        microseconds) that replace the topology's own, before composing; ``None`` keeps them.
        Families have none, and the timing model (``time``, ``plan``) needs both.

    Raises
    ------
    UnknownNameError
        An unknown name (the message lists the valid ones).
    FileFormatError
        A missing or malformed file.
    InputTooLargeError
        A topology beyond ``MAX_RANKS`` ranks (``ring:1000000``), refused before it is built.
    InvalidTopologyError
        A topology that breaks a rule, or that cannot be composed; a fabric without
        ``nodes > 1``.

    Examples
    --------
    >>> resolve_topology("Ring:4").num_ranks
    4
    >>> resolve_topology("ring:4", nodes=2, nic_units=1).num_ranks
    8
    >>> resolve_topology("ring:4", unit_gbps=25, alpha_us=1).unit_gbps
    25.0
    """
    text = spec.strip()
    if not text:
        raise UnknownNameError("empty topology name; try 'collsynth topologies' for the list")
    if looks_like_path(text):
        topology = _load_topology_file(Path(text))
    else:
        try:
            topology = get_topology(text)
        except UnknownNameError:
            if not _names_a_file(text):
                raise
            topology = _load_topology_file(Path(text))
        else:
            named = name_figures(text)
            for key, value in (("unit_gbps", unit_gbps), ("alpha_us", alpha_us)):
                if value is not None and key in named:
                    raise InvalidTopologyError(f"topology {spec!r}: {key} given twice (in the "
                                               "name and as an option); give it once")
    topology = with_figures(topology, unit_gbps=unit_gbps, alpha_us=alpha_us)
    if nodes is None or nodes == 1:
        if fabric != "switch" or nodes_per_leaf is not None:
            raise InvalidTopologyError(f"the {fabric!r} fabric joins nodes: give nodes > 1 "
                                       "(--nodes K)")
        return topology
    if isinstance(oversubscription, str):
        oversubscription = parse_oversubscription(oversubscription)
    return compose_nodes(topology, nodes, nic_units=nic_units, oversubscription=oversubscription,
                         fabric=fabric, nodes_per_leaf=nodes_per_leaf)


def resolve_collective(spec: str, num_ranks: int, *, root: int | None = None,
                       roots: Sequence[int] | None = None) -> Collective:
    """The collective a user named: a standard one on ``num_ranks`` ranks, or a custom file.

    Parameters
    ----------
    spec:
        A standard name (``allgather``, ``reduce-scatter``, ``broadcast``...; case-insensitive)
        or a path to a custom collective JSON file (see :mod:`collsynth.collective.fileformat`).
    num_ranks:
        The topology's number of ranks; a custom collective must have exactly this many.
    root, roots:
        The root of a rooted collective (default 0), or the roots of a multi-root one. Not
        accepted with a custom collective file, which lists its own.

    Raises
    ------
    UnknownNameError
        An unknown name (the message lists the valid ones).
    FileFormatError, InputTooLargeError
        A bad custom collective file.
    InvalidCollectiveError
        A custom collective for another number of ranks, a root out of range, a root given to
        a collective that takes none.

    Examples
    --------
    >>> resolve_collective("Broadcast", 4, root=2).describe()
    'broadcast(n=4, root=2)'
    """
    text = spec.strip()
    is_file = looks_like_path(text)
    if not is_file:
        key = text.lower().replace("-", "_")
        is_file = key not in standard_names() and _names_a_file(text)
    if not is_file:
        return standard_collective(text, num_ranks, root=root, roots=roots)
    collective = load_collective(Path(text))
    if root is not None or roots:
        raise InvalidCollectiveError(
            f"{text}: a custom collective file lists its own roots; --root does not apply")
    if collective.num_ranks != num_ranks:
        raise InvalidCollectiveError(
            f"{text}: custom collective {collective.name!r} has num_ranks = "
            f"{collective.num_ranks} but the topology has {num_ranks} ranks")
    return collective
