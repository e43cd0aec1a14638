"""The environment variables each runtime needs to load a plan's XML files.

The details: ``docs/plan.md``, section "The runtime's environment".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

__all__ = ["EnvVar", "runtime_environment", "SPEC", "EXECUTOR_SOURCE"]

#: Where the msccl and rccl statements are documented (cited as ``f"{SPEC} §13.1"``).
SPEC = "docs/msccl-xml.md"
#: Where the msccl-executor statements come from.
EXECUTOR_SOURCE = ("Azure/msccl-executor-nccl src/misc/msccl/msccl_lifecycle.cc "
                   "(mscclInternalSchedulerInit, mscclInit) and its README")


@dataclass(frozen=True)
class EnvVar:
    """One variable to set (``value``), why, and where that is stated."""

    name: str
    value: str
    why: str
    source: str


def runtime_environment(runtime: str, *, xml_dir: str, xml_paths: Sequence[str],
                        collectives: Iterable[str]) -> tuple[tuple[EnvVar, ...], tuple[str, ...]]:
    """The variables to set for ``runtime`` and notes (conditions the runtime puts on its use).

    ``xml_dir`` is the plan's ``xml/`` directory, ``xml_paths`` its files (absolute), and
    ``collectives`` the collectives those files implement.

    >>> env, notes = runtime_environment("msccl", xml_dir="/p/xml",
    ...                                  xml_paths=["/p/xml/a.xml", "/p/xml/b.xml"],
    ...                                  collectives=["allreduce"])
    >>> [(v.name, v.value) for v in env]
    [('MSCCL_XML_FILES', '/p/xml/a.xml:/p/xml/b.xml'), ('NCCL_ALGO', 'MSCCL,RING,TREE')]
    >>> [v.name for v in runtime_environment("msccl-executor", xml_dir="/p/xml", xml_paths=[],
    ...                                      collectives=[])[0]]
    ['MSCCL_ALGO_DIR', 'NCCL_MSCCL_ENABLE']
    """
    collectives = set(collectives)
    if runtime == "msccl":
        env = [EnvVar("MSCCL_XML_FILES", ":".join(xml_paths),
                      "the algorithm files to load, colon-separated (at most 4: "
                      "MSCCL_MAX_NUM_ALGOS); a file that fails to parse is skipped with a warning",
                      f"{SPEC} §13.1")]
        if "allreduce" in collectives:
            env.append(EnvVar("NCCL_ALGO", "MSCCL,RING,TREE",
                              "msccl runs an allreduce XML only when NCCL_ALGO lists MSCCL (other "
                              "collectives are eligible by default)", f"{SPEC} §13.1"))
        notes = (
            "NCCL_PROTO, if set, must leave the programs' protocol (Simple) enabled "
            f"({SPEC} §13.1).",
            "msccl never runs an XML for ncclAvg or custom reduction operators, for one rank, or "
            f"for a collective inside an ncclGroupStart/End group of several operations "
            f"({SPEC} §13.1).",
            "Each XML is selected only for calls whose element count is a multiple of its "
            f"nchunksperloop; other calls run NCCL's own algorithms ({SPEC} §13.1).",
        )
        return tuple(env), notes
    if runtime == "rccl":
        env = [
            EnvVar("MSCCL_ALGO_DIR", xml_dir,
                   "every regular file of this directory is parsed as an algorithm (no "
                   "extension filter): keep only the plan's XML files there", f"{SPEC} §13.2"),
            EnvVar("RCCL_MSCCL_ENABLE", "1", "MSCCL on (the default)", f"{SPEC} §13.2"),
            EnvVar("RCCL_MSCCL_FORCE_ENABLE", "1",
                   "RCCL enables MSCCL only on the machine models that declare it (two built-in "
                   "ones) unless forced", f"{SPEC} §13.2"),
        ]
        notes = (
            "MSCCL_SCHEDULER must not name a loadable scheduler, and libmsccl-scheduler.so must "
            f"not be loadable: an external scheduler replaces the directory scan ({SPEC} §13.2).",
            "RCCL_MSCCL_ENABLE_SINGLE_PROCESS=0 disables MSCCL when several ranks share a process "
            f"({SPEC} §13.2).",
            "Calls with ncclAvg or custom operators, and calls whose element count is not a "
            f"multiple of the program's nchunksperloop, run RCCL's own algorithms ({SPEC} §13.2).",
        )
        return tuple(env), notes
    if runtime == "msccl-executor":
        env = [
            EnvVar("MSCCL_ALGO_DIR", xml_dir,
                   "the internal scheduler parses every regular file or symlink of this "
                   "directory: keep only the plan's XML files there", EXECUTOR_SOURCE),
            EnvVar("NCCL_MSCCL_ENABLE", "1",
                   "MSCCL on (the default; NCCL_PARAM(MscclEnabled, \"MSCCL_ENABLE\", 1))",
                   EXECUTOR_SOURCE),
        ]
        notes = (
            "One GPU per process: mscclInit turns MSCCL off when a process drives several GPUs "
            f"({EXECUTOR_SOURCE}).",
            "MSCCL_SCHEDULER must not name a loadable scheduler, and libmsccl-scheduler.so must "
            f"not be loadable: an external scheduler replaces the directory scan "
            f"({EXECUTOR_SOURCE}).",
            "Some revisions of the executor (e.g. commit 01ddfdb) run the internal scheduler only "
            "when NCCL's topology hint mscclEnabled is set, as RCCL does "
            f"({EXECUTOR_SOURCE}).",
            "Calls with ncclAvg, and calls whose count argument is not a multiple of the "
            "program's nchunksperloop, run NCCL's own algorithms "
            f"(mscclInternalSchedulerSelectAlgo, {EXECUTOR_SOURCE}).",
        )
        return tuple(env), notes
    from collsynth.export.runtimes import get_runtime

    get_runtime(runtime)  # raises UnknownNameError with the valid names
    return (), ()
