"""The runtimes collsynth targets, one value each: what they load, run and cost.

"Runtime" means one thing in collsynth: a target runtime (NCCL, RCCL, MSCCL, msccl-executor,
MSCCL++). A name given on the command line becomes its :class:`Runtime` once, at the edge
(:func:`get_runtime`); the library takes the value. Facts and sources: docs/msccl-xml.md §13
and docs/mscclpp.md.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Mapping

from collsynth.errors import UnknownNameError
from collsynth.runtimes.constants import NCCL_DEFAULTS, RCCL_DEFAULTS, RuntimeConstants
from collsynth.runtimes.dialect import MSCCL, MSCCL_EXECUTOR, RCCL, XmlDialect
from collsynth.runtimes.protocols import PROTOCOLS
from collsynth.runtimes.settings import RuntimeSettings

__all__ = ["Artifact", "EnvVar", "Environment", "Runtime", "RUNTIMES", "get_runtime",
           "runtime_family", "runtime_names", "xml_dialect", "parse_version", "MSCCL_XML", "MSCCLPP_PLAN",
           "TUNER_CONFIG", "SPEC", "EXECUTOR_SOURCE"]

#: Artifact kinds: an MSCCL XML program, an MSCCL++ JSON execution plan, a tuner config (a CSV
#: of rules re-ranking the runtime's own algorithms, docs/tuner-config.md).
MSCCL_XML = "msccl-xml"
MSCCLPP_PLAN = "mscclpp-plan"
TUNER_CONFIG = "tuner-csv"
#: Where the msccl and rccl loading rules are documented (cited as ``f"{SPEC} §13.1"``).
SPEC = "docs/msccl-xml.md"
#: Where the msccl-executor loading rules come from.
EXECUTOR_SOURCE = ("Azure/msccl-executor-nccl src/misc/msccl/msccl_lifecycle.cc "
                   "(mscclInternalSchedulerInit, mscclInit) and its README")


@dataclass(frozen=True, kw_only=True)
class Artifact:
    """One kind of file a runtime loads: ``kind`` (:data:`MSCCL_XML`, :data:`MSCCLPP_PLAN`),
    ``versions`` that load it, and ``how`` PyTorch reaches the runtime (one line)."""

    kind: str
    versions: str
    how: str


@dataclass(frozen=True, kw_only=True)
class EnvVar:
    """One environment variable a runtime needs to load a plan's files.

    ``value`` is a template: ``{xml_dir}`` (the plan's XML folder) and ``{xml_paths}`` (its
    files, colon-separated) are filled in by :func:`collsynth.plan.environment.runtime_environment`.
    ``collectives``: set only when the plan has one of these (empty: always).
    """

    name: str
    value: str
    why: str
    source: str
    collectives: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class Environment:
    """What a runtime needs from its environment to load a plan: variables and notes."""

    variables: tuple[EnvVar, ...] = ()
    notes: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class Runtime:
    """One target runtime.

    Parameters
    ----------
    name:
        ``"nccl"``, ``"msccl"``, ``"msccl-executor"``, ``"rccl"``, ``"mscclpp"``.
    family:
        Whose own algorithms it runs when no custom program applies: ``"nccl"`` or ``"rccl"``.
    protocols:
        The protocols it runs by default (RCCL leaves LL128 off on most AMD GPUs).
    own_algorithms:
        Its own algorithms collsynth models, by NCCL's names (``("ring", "tree", "p2p")``, the
        last its grouped send/recv for alltoall; NCCL 2.23+ adds ``"nvls"``, ``"nvls_tree"``,
        ``"pat"``).
    defaults:
        Its documented constants (:class:`~collsynth.runtimes.constants.RuntimeConstants`).
    dialect:
        Its MSCCL XML rules, or ``None`` when it loads no MSCCL XML.
    artifacts:
        The files it loads.
    environment:
        The variables and notes a plan's user needs to set.
    version:
        ``(major, minor)`` of the release whose own choices (algorithms, protocols, channels)
        the timing models follow; ``None``: the newest modelled (:meth:`at_version`).
    settings:
        The job's NCCL_ALGO / NCCL_PROTO / NCCL_NVLS_ENABLE (:meth:`with_settings`), which
        narrow the runtime's own choices; the default narrows nothing.
    """

    name: str
    family: str
    protocols: tuple[str, ...]
    own_algorithms: tuple[str, ...]
    defaults: RuntimeConstants
    dialect: XmlDialect | None = None
    artifacts: tuple[Artifact, ...] = ()
    environment: Environment = Environment()
    version: tuple[int, int] | None = None
    settings: RuntimeSettings = RuntimeSettings()

    def loads(self, kind: str) -> bool:
        """Whether it loads artifacts of ``kind``."""
        return any(a.kind == kind for a in self.artifacts)

    def at_version(self, version: "str | tuple[int, int] | None") -> "Runtime":
        """This runtime at ``version`` (``"2.18.5+cuda12.2"``, ``(2, 18)``; ``None``: the
        newest modelled). Raises ValueError for a text that names no version.

        >>> get_runtime("nccl").at_version("2.18.5+cuda12.2").version
        (2, 18)
        """
        if isinstance(version, str):
            version = parse_version(version)
        return replace(self, version=version)

    def with_settings(self, settings: RuntimeSettings) -> "Runtime":
        """This runtime under a job's ``settings`` (:func:`~collsynth.runtimes.settings.
        settings_from_text`): its own algorithms and protocols narrowed as NCCL narrows them.

        >>> from collsynth.runtimes.settings import settings_from_text
        >>> nccl = get_runtime("nccl").with_settings(settings_from_text(["NCCL_PROTO=Simple"]))
        >>> nccl.protocols
        ('Simple',)
        """
        protocols = self.protocols if settings.protocols is None else \
            tuple(p for p in PROTOCOLS if p in settings.protocols
                  and (p in self.protocols or settings.ll128_listed and p == "LL128"))
        return replace(self, settings=settings, protocols=protocols or self.protocols)


_VERSION = re.compile(r"^\s*v?([0-9]+)\.([0-9]+)(?:[.+~-].*)?$", re.ASCII | re.DOTALL)


def parse_version(text: str) -> tuple[int, int]:
    """``(major, minor)`` of a runtime's version as logs and users write it: ``"2.18.5"``,
    ``"2.18.5+cuda12.2"``, ``"2.22.3-"``, ``"v2.27"``.

    Raises
    ------
    ValueError
        The text is not a version.
    """
    match = _VERSION.match(text)
    if match is None:
        raise ValueError(f"{text!r} is not a runtime version; expected MAJOR.MINOR[.PATCH], "
                         "like 2.18 or 2.18.5")
    return int(match.group(1)), int(match.group(2))


_GIVEN_VERSION = re.compile(
    r"^v?([0-9]{1,6})\.([0-9]{1,6})(?:\.[0-9]{1,6})?(?:\+[0-9A-Za-z.]{1,64})?$", re.ASCII)


def parse_given_version(text: str) -> tuple[int, int]:
    """``(major, minor)`` of a runtime version a user names (an option, a field they write):
    strictly ``MAJOR.MINOR`` or ``MAJOR.MINOR.PATCH``, an optional leading ``v`` and an optional
    ``+BUILD`` (``"2.18"``, ``"2.18.5"``, ``"2.18.5+cuda12.2"``). Unlike :func:`parse_version`
    (which reads the banners logs print, ``"2.22.3-"``), a fourth part, an empty, negative or
    non-numeric part is refused rather than read as its first two.

    Raises
    ------
    ValueError
        The text is not such a version.

    >>> parse_given_version("2.18.5")
    (2, 18)
    """
    match = _GIVEN_VERSION.match(text.strip()) if isinstance(text, str) else None
    if match is None:
        shown = text if not isinstance(text, str) or len(text) <= 64 else text[:64] + "..."
        raise ValueError(f"{shown!r} is not a runtime version; expected MAJOR.MINOR or "
                         "MAJOR.MINOR.PATCH of whole numbers, like 2.18 or 2.18.5")
    return int(match.group(1)), int(match.group(2))


_XML_HOW = "replace libnccl with the runtime's build; torch's backend='nccl' uses it unchanged"

_MSCCL_ENV = Environment(
    variables=(
        EnvVar(name="MSCCL_XML_FILES", value="{xml_paths}",
               why="the algorithm files to load, colon-separated (at most 4: "
                   "MSCCL_MAX_NUM_ALGOS); a file that fails to parse is skipped with a warning",
               source=f"{SPEC} §13.1"),
        EnvVar(name="NCCL_ALGO", value="MSCCL,RING,TREE",
               why="msccl runs an allreduce XML only when NCCL_ALGO lists MSCCL (other "
                   "collectives are eligible by default)",
               source=f"{SPEC} §13.1", collectives=("allreduce",)),
    ),
    notes=(
        "NCCL_PROTO, if set, must leave the programs' protocol (Simple) enabled "
        f"({SPEC} §13.1).",
        "msccl never runs an XML for ncclAvg or custom reduction operators, for one rank, or "
        f"for a collective inside an ncclGroupStart/End group of several operations "
        f"({SPEC} §13.1).",
        "Each XML is selected only for calls whose element count is a multiple of its "
        f"nchunksperloop; other calls run NCCL's own algorithms ({SPEC} §13.1).",
    ))

_RCCL_ENV = Environment(
    variables=(
        EnvVar(name="MSCCL_ALGO_DIR", value="{xml_dir}",
               why="every regular file of this directory is parsed as an algorithm (no "
                   "extension filter): keep only the plan's XML files there",
               source=f"{SPEC} §13.2"),
        EnvVar(name="RCCL_MSCCL_ENABLE", value="1", why="MSCCL on (the default)",
               source=f"{SPEC} §13.2"),
        EnvVar(name="RCCL_MSCCL_FORCE_ENABLE", value="1",
               why="RCCL enables MSCCL only on the machine models that declare it (two built-in "
                   "ones) unless forced",
               source=f"{SPEC} §13.2"),
    ),
    notes=(
        "MSCCL_SCHEDULER must not name a loadable scheduler, and libmsccl-scheduler.so must "
        f"not be loadable: an external scheduler replaces the directory scan ({SPEC} §13.2).",
        "RCCL_MSCCL_ENABLE_SINGLE_PROCESS=0 disables MSCCL when several ranks share a process "
        f"({SPEC} §13.2).",
        "Calls with ncclAvg or custom operators, and calls whose element count is not a "
        f"multiple of the program's nchunksperloop, run RCCL's own algorithms ({SPEC} §13.2).",
    ))

_EXECUTOR_ENV = Environment(
    variables=(
        EnvVar(name="MSCCL_ALGO_DIR", value="{xml_dir}",
               why="the internal scheduler parses every regular file or symlink of this "
                   "directory: keep only the plan's XML files there",
               source=EXECUTOR_SOURCE),
        EnvVar(name="NCCL_MSCCL_ENABLE", value="1",
               why="MSCCL on (the default; NCCL_PARAM(MscclEnabled, \"MSCCL_ENABLE\", 1))",
               source=EXECUTOR_SOURCE),
    ),
    notes=(
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
    ))

#: Own algorithms: NCCL 2.12 (msccl's base) and RCCL run rings and trees; NCCL 2.23 and later
#: (nccl, msccl-executor's base) also NVLS, NVLS-tree, PAT and CollNet, each where the machine
#: and the tuning allow (collsynth.timing.tuning_model.offered_protocols; CollNet needs a
#: network whose facts say sharp).
_OWN = ("ring", "tree", "p2p")
_OWN_NCCL = ("ring", "tree", "nvls", "nvls_tree", "pat", "collnet_direct", "collnet_chain", "p2p")

#: Every runtime by name, in this order.
RUNTIMES: Mapping[str, Runtime] = MappingProxyType({rt.name: rt for rt in (
    Runtime(name="nccl", family="nccl", protocols=PROTOCOLS, own_algorithms=_OWN_NCCL,
            defaults=NCCL_DEFAULTS,
            artifacts=(Artifact(kind=TUNER_CONFIG,
                                versions="NCCL 2.28 and later with the example tuner plugin built "
                                         "from NCCL 2.30.3 or newer",
                                how="NCCL_TUNER_PLUGIN=libnccl-tuner-example.so and "
                                    "NCCL_TUNER_CONFIG_FILE; torch's backend='nccl' unchanged"),)),
    Runtime(name="msccl", family="nccl", protocols=PROTOCOLS, own_algorithms=_OWN,
            defaults=NCCL_DEFAULTS.replace(runtime="msccl"), dialect=MSCCL,
            artifacts=(Artifact(kind=MSCCL_XML, versions="microsoft/msccl (NCCL 2.12.12 fork)",
                                how=_XML_HOW),),
            environment=_MSCCL_ENV),
    Runtime(name="msccl-executor", family="nccl", protocols=PROTOCOLS,
            own_algorithms=_OWN_NCCL,
            defaults=NCCL_DEFAULTS.replace(runtime="msccl-executor"), dialect=MSCCL_EXECUTOR,
            artifacts=(Artifact(kind=MSCCL_XML,
                                versions="Azure/msccl-executor-nccl (NCCL 2.23.4 fork)",
                                how=_XML_HOW),),
            environment=_EXECUTOR_ENV),
    Runtime(name="rccl", family="rccl", protocols=("LL", "Simple"), own_algorithms=_OWN,
            defaults=RCCL_DEFAULTS, dialect=RCCL,
            artifacts=(Artifact(kind=MSCCL_XML,
                                versions="RCCL <= 2.27.7 (ROCm <= 7.2); RCCL >= 2.28.3 removed "
                                         "MSCCL XML support",
                                how="built into RCCL; torch's backend='nccl' on ROCm uses it"),
                       Artifact(kind=TUNER_CONFIG,
                                versions="RCCL 2.28.3 and later (ROCm 7.13): the built-in CSV "
                                         "tuner",
                                how="NCCL_TUNER_CONFIG_FILE; torch's backend='nccl' on ROCm")),
            environment=_RCCL_ENV),
    Runtime(name="mscclpp", family="nccl", protocols=("LL", "Simple"), own_algorithms=(),
            defaults=NCCL_DEFAULTS.replace(runtime="mscclpp"),
            artifacts=(Artifact(kind=MSCCLPP_PLAN,
                                versions="MSCCL++ 0.9 and later (plans as its DSL writes them)",
                                how="the NCCL-compatible shim libmscclpp_nccl.so (LD_PRELOAD) "
                                    "under torch's backend='nccl'"),)),
)})


def runtime_names(artifact: str | None = None) -> tuple[str, ...]:
    """The runtimes' names, in :data:`RUNTIMES` order; with ``artifact``, those that load that
    kind of file.

    >>> runtime_names()
    ('nccl', 'msccl', 'msccl-executor', 'rccl', 'mscclpp')
    >>> runtime_names(MSCCL_XML)
    ('msccl', 'msccl-executor', 'rccl')
    """
    return tuple(name for name, rt in RUNTIMES.items()
                 if artifact is None or rt.loads(artifact))


def runtime_family(name: str) -> str | None:
    """Whose kernels the runtime called ``name`` runs (``"nccl"``: nccl, msccl, msccl-executor,
    mscclpp's fallback; ``"rccl"``), ``None`` for a name collsynth does not know (a constants
    file may name any runtime).

    >>> runtime_family("msccl-executor"), runtime_family("rccl"), runtime_family("hccl")
    ('nccl', 'rccl', None)
    """
    return RUNTIMES[name].family if name in RUNTIMES else None


def get_runtime(name: "str | Runtime") -> Runtime:
    """The runtime called ``name`` (case-insensitive); a :class:`Runtime` is returned as is.

    Raises
    ------
    UnknownNameError
        Another name, with the valid ones.

    >>> get_runtime("RCCL").dialect.max_steps_per_tb
    64
    """
    if isinstance(name, Runtime):
        return name
    key = name.strip().lower() if isinstance(name, str) else name
    if key not in RUNTIMES:
        raise UnknownNameError(f"unknown runtime {name!r}; valid: {', '.join(runtime_names())}")
    return RUNTIMES[key]


def xml_dialect(runtime: "str | Runtime | XmlDialect") -> XmlDialect:
    """The MSCCL XML rules of ``runtime`` (a dialect is returned as is).

    Raises
    ------
    UnknownNameError
        An unknown runtime, or one that loads no MSCCL XML (with those that do).

    >>> xml_dialect("msccl").max_channels
    32
    """
    if isinstance(runtime, XmlDialect):
        return runtime
    rt = get_runtime(runtime)
    if rt.dialect is None:
        raise UnknownNameError(f"runtime {rt.name!r} loads no MSCCL XML; these do: "
                               f"{', '.join(runtime_names(MSCCL_XML))}")
    return rt.dialect
