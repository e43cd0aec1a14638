"""A directory cache of synthesized fronts, keyed by topology and collective.

The details: ``docs/plan.md``, section "The synthesis cache".
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any, Mapping, Sequence

from collsynth._atomic import write_text_atomic
from collsynth._output import check_folder_writable
from collsynth._parse import read_json
from collsynth.algorithm.fileformat import load_algorithm, save_algorithm
from collsynth.algorithm.model import Algorithm
from collsynth.algorithm.verify import verify
from collsynth.collective.model import Collective
from collsynth.errors import (FileFormatError, InputTooLargeError, OutputPathError,
                              VerificationError)
from collsynth.plan.groups import topology_fingerprint
from collsynth.topology.model import Topology

__all__ = ["FrontCache", "CachedFront", "check_cache_directory", "default_cache_directory"]

_log = logging.getLogger(__name__)

_FORMAT = "collsynth-front-cache"
_VERSION = 1
#: Largest cache manifest read (a list of file names and a few figures).
_MAX_MANIFEST_BYTES = 1 << 20


def default_cache_directory() -> Path:
    """``$XDG_CACHE_HOME/collsynth`` when that variable is an absolute path, else
    ``~/.cache/collsynth``: the XDG Base Directory specification calls a relative path there
    invalid, to be ignored (it would put a cache in whatever folder the command ran in)."""
    base = os.environ.get("XDG_CACHE_HOME")
    return (Path(base) if base and os.path.isabs(base) else Path.home() / ".cache") / "collsynth"


def check_cache_directory(directory: str | os.PathLike[str], label: str) -> Path:
    """Check that ``directory`` can hold a cache before any entry is written (each write of a
    file's or an unwritable folder's entry would fail on its own): it is a writable folder,
    or a new name whose nearest existing ancestor is one (the cache makes its own folders).
    ``label`` names it in messages. Return it as a :class:`Path`.

    Raises
    ------
    OutputPathError
        Naming the path, what it is and that a folder was expected.
    """
    folder = Path(directory)
    existing = folder
    while not os.path.lexists(existing) and existing.parent != existing:
        existing = existing.parent
    check_folder_writable(existing, label if existing == folder else
                          f"{label} (to be made inside {existing})")
    return folder


@dataclasses.dataclass(frozen=True)
class CachedFront:
    """What the cache holds for one key: the algorithms (on the caller's topology), whether the
    search that found them was complete, and the time limit it had (seconds)."""

    algorithms: tuple[Algorithm, ...]
    complete: bool
    time_limit: float | None
    detail: str = ""


class FrontCache:
    """Fronts on disk under ``directory`` (``None``: a cache that stores nothing).

    >>> import tempfile
    >>> from collsynth.topology import get_topology
    >>> from collsynth.collective import allgather
    >>> from collsynth.synthesis import pareto_front
    >>> ring = get_topology("ring:4")
    >>> front = tuple(r.algorithm for r in pareto_front(ring, allgather(4)))
    >>> cache = FrontCache(tempfile.mkdtemp())
    >>> cache.get(ring, allgather(4), engine="pareto", options={}) is None
    True
    >>> cache.put(ring, allgather(4), front, engine="pareto", options={}, complete=True,
    ...           time_limit=30.0)
    >>> hit = cache.get(ring, allgather(4), engine="pareto", options={})
    >>> [a.num_steps for a in hit.algorithms], hit.complete
    ([2], True)
    """

    def __init__(self, directory: str | os.PathLike[str] | None) -> None:
        self.directory = None if directory is None else Path(directory)

    def entry_directory(self, topology: Topology, collective: Collective, *, engine: str,
                        options: Mapping[str, Any]) -> Path | None:
        """The folder of one key (``None`` for a disabled cache)."""
        if self.directory is None:
            return None
        roots = "-root" + ",".join(map(str, collective.roots)) if collective.roots else ""
        options_text = json.dumps({k: options[k] for k in sorted(options)}, sort_keys=True,
                                  default=str)
        digest = hashlib.sha256(options_text.encode("utf-8")).hexdigest()[:12]
        leaf = f"{collective.name}-n{collective.num_ranks}{roots}-{engine}-{digest}"
        return self.directory / "fronts" / topology_fingerprint(topology)[:32] / leaf

    def get(self, topology: Topology, collective: Collective, *, engine: str,
            options: Mapping[str, Any], time_limit: float | None = None) -> CachedFront | None:
        """The cached front of this key re-homed on ``topology`` (verified), or ``None`` on a
        miss: nothing stored, an unreadable entry, or an incomplete search made with less time
        than ``time_limit``."""
        folder = self.entry_directory(topology, collective, engine=engine, options=options)
        if folder is None:
            return None
        manifest_path = folder / "manifest.json"
        if not manifest_path.is_file():
            return None
        try:
            manifest = read_json(manifest_path, max_bytes=_MAX_MANIFEST_BYTES)
            if not isinstance(manifest, dict):
                raise ValueError("the manifest is not a JSON object")
            if manifest.get("format") != _FORMAT or manifest.get("version") != _VERSION:
                raise ValueError("unknown manifest format")
            complete = bool(manifest["complete"])
            stored_limit = manifest.get("time_limit_s")
            if not complete and time_limit is not None and (
                    stored_limit is None or float(stored_limit) < time_limit):
                _log.info("cache %s: incomplete search with %s s; searching again with %s s",
                          folder, stored_limit, time_limit)
                return None
            algorithms = []
            for name in manifest["files"]:
                if not isinstance(name, str) or "/" in name or "\\" in name:
                    raise ValueError(f"bad file name {name!r}")
                algorithms.append(self._rehome(load_algorithm(folder / name), topology,
                                               collective))
        except (OSError, ValueError, KeyError, TypeError, FileFormatError, InputTooLargeError,
                VerificationError) as exc:   # a damaged or foreign entry: search again
            _log.warning("ignoring the cache entry %s: %s", folder, exc)
            return None
        return CachedFront(tuple(algorithms), complete,
                           None if stored_limit is None else float(stored_limit),
                           str(manifest.get("detail", "")))

    def put(self, topology: Topology, collective: Collective, algorithms: Sequence[Algorithm],
            *, engine: str, options: Mapping[str, Any], complete: bool,
            time_limit: float | None, detail: str = "") -> None:
        """Store a front (each algorithm verified before it is written). Failures to write are
        logged, not raised: a cache is an optimisation."""
        folder = self.entry_directory(topology, collective, engine=engine, options=options)
        if folder is None:
            return
        try:
            folder.mkdir(parents=True, exist_ok=True)  # a cache makes its own folders
            files = []
            for index, algorithm in enumerate(algorithms):
                name = f"algorithm-{index}.json"
                save_algorithm(algorithm, folder / name)
                files.append(name)
            manifest = {"format": _FORMAT, "version": _VERSION,
                        "fingerprint": topology_fingerprint(topology),
                        "topology": topology.name, "collective": collective.describe(),
                        "engine": engine, "options": dict(options), "complete": complete,
                        "time_limit_s": time_limit, "detail": detail, "files": files}
            write_text_atomic(folder / "manifest.json",
                              json.dumps(manifest, indent=1, default=str) + "\n")
        except (OSError, OutputPathError) as exc:   # a cache is an optimisation
            _log.warning("could not write the cache entry %s: %s", folder, exc)

    @staticmethod
    def _rehome(algorithm: Algorithm, topology: Topology, collective: Collective) -> Algorithm:
        """``algorithm`` on ``topology`` (same links), verified; ValueError when it does not fit."""
        coll = algorithm.collective
        if (coll.name, coll.num_ranks, tuple(coll.roots)) != (
                collective.name, collective.num_ranks, tuple(collective.roots)):
            raise ValueError(f"holds {coll.describe()}, expected {collective.describe()}")
        if topology_fingerprint(algorithm.topology) != topology_fingerprint(topology):
            raise ValueError("its topology's links differ from the fingerprint's")
        return verify(dataclasses.replace(algorithm, topology=topology))
