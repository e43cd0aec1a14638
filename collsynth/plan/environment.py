"""The environment variables each runtime needs to load a plan's XML files.

The details: ``docs/plan.md``, section "The runtime's environment".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

from collsynth.runtimes import Runtime
from collsynth.runtimes.registry import EXECUTOR_SOURCE, SPEC

__all__ = ["EnvVar", "runtime_environment", "SPEC", "EXECUTOR_SOURCE"]


@dataclass(frozen=True)
class EnvVar:
    """One variable to set (``value``), why, and where that is stated."""

    name: str
    value: str
    why: str
    source: str


def runtime_environment(runtime: Runtime, *, xml_dir: str, xml_paths: Sequence[str],
                        collectives: Iterable[str]) -> tuple[tuple[EnvVar, ...], tuple[str, ...]]:
    """The variables to set for ``runtime`` and notes (conditions the runtime puts on its use),
    from the runtime's :attr:`~collsynth.runtimes.Runtime.environment`.

    ``xml_dir`` is the plan's ``xml/`` directory, ``xml_paths`` its files (absolute), and
    ``collectives`` the collectives those files implement.

    >>> from collsynth.runtimes import get_runtime
    >>> env, notes = runtime_environment(get_runtime("msccl"), xml_dir="/p/xml",
    ...                                  xml_paths=["/p/xml/a.xml", "/p/xml/b.xml"],
    ...                                  collectives=["allreduce"])
    >>> [(v.name, v.value) for v in env]
    [('MSCCL_XML_FILES', '/p/xml/a.xml:/p/xml/b.xml'), ('NCCL_ALGO', 'MSCCL,RING,TREE')]
    >>> [v.name for v in runtime_environment(get_runtime("msccl-executor"), xml_dir="/p/xml",
    ...                                      xml_paths=[], collectives=[])[0]]
    ['MSCCL_ALGO_DIR', 'NCCL_MSCCL_ENABLE']
    """
    planned = set(collectives)
    fill = {"xml_dir": xml_dir, "xml_paths": ":".join(xml_paths)}
    env = tuple(EnvVar(v.name, v.value.format(**fill), v.why, v.source)
                for v in runtime.environment.variables
                if not v.collectives or planned.intersection(v.collectives))
    return env, runtime.environment.notes
