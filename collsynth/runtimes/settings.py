"""The runtime's environment variables that change its own choices (NCCL_ALGO, NCCL_PROTO,
NCCL_NVLS_ENABLE), read as NCCL reads them; docs/runtime-tuning.md, "Settings"."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

__all__ = ["RuntimeSettings", "settings_from_text", "SETTING_NAMES"]

#: NCCL_ALGO's names (``ncclAlgoStr``, compared without case) -> collsynth's names of them.
_ALGORITHM_NAMES = {"Tree": "tree", "Ring": "ring", "CollNetDirect": "collnet_direct",
                    "CollNetChain": "collnet_chain", "NVLS": "nvls", "NVLSTree": "nvls_tree",
                    "PAT": "pat"}
#: NCCL_PROTO's names (``ncclProtoStr``, compared without case).
_PROTOCOL_NAMES = {"LL": "LL", "LL128": "LL128", "Simple": "Simple"}
#: The variables a setting may name.
SETTING_NAMES = ("NCCL_ALGO", "NCCL_PROTO", "NCCL_NVLS_ENABLE")
#: Longest value taken (NCCL's own lists are a few dozen characters).
_MAX_VALUE_CHARS = 200


@dataclass(frozen=True)
class RuntimeSettings:
    """What a job's environment allows the runtime to choose from; the default allows all.

    ``algorithms``/``protocols``: the sets NCCL_ALGO/NCCL_PROTO leave enabled (collsynth's
    names: ``"nvls_tree"``, ``"LL128"``), ``None`` when unset. ``nvls``: NCCL_NVLS_ENABLE
    (``False`` turns NVLS and NVLS-tree off). ``ll128_listed``: NCCL_PROTO names LL128 without
    ``^``, which NCCL takes as forcing it on where its own rule would leave it off.
    ``text``: the ``NAME=VALUE`` settings as given, for reports.
    """

    algorithms: frozenset[str] | None = None
    protocols: frozenset[str] | None = None
    nvls: bool = True
    ll128_listed: bool = False
    text: tuple[str, ...] = ()

    def allows(self, algorithm: str, protocol: str, *,
               algorithms: frozenset[str] | None = None) -> bool:
        """Whether these settings leave ``(algorithm, protocol)`` enabled; ``algorithms``: the
        NCCL_ALGO list as a version applies it (:meth:`enabled_algorithms`), default as given."""
        if algorithm in ("nvls", "nvls_tree") and not self.nvls:
            return False
        algorithms = self.algorithms if algorithms is None else algorithms
        return (algorithms is None or algorithm in algorithms) and \
            (self.protocols is None or protocol in self.protocols)

    def enabled_algorithms(self, version: tuple[int, int], collective: str, *, nodes: int,
                           collnet: bool) -> frozenset[str] | None:
        """NCCL_ALGO as NCCL ``version`` applies it to ``collective`` (``None``: unset), by
        ``ncclTopoTuneModel`` in src/graph/tuning.cc:

        * before 2.24, without CollNet support: a list that leaves none of ring, tree, NVLS
          (one node, or with CollNet) and NVLS-tree (several nodes) enabled gets the ring and
          the tree back ("ignoring NCCL_ALGO=COLLNET");
        * before 2.19: the ring is never disabled for a collective other than allreduce.
        """
        algorithms = self.algorithms
        if algorithms is None:
            return None
        if version < (2, 24) and not collnet:
            live = algorithms & {"ring", "tree"}
            if nodes == 1 and "nvls" in algorithms or nodes > 1 and "nvls_tree" in algorithms:
                live = live | {"nvls"}
            if not live:
                algorithms = algorithms | {"ring", "tree"}
        if version < (2, 19) and collective != "allreduce":
            algorithms = algorithms | {"ring"}
        return algorithms

    @staticmethod
    def ring_fallback(version: tuple[int, int]) -> bool:
        """Whether NCCL ``version`` gives a collective the settings leave with nothing its ring
        back, with every protocol (2.19-2.23: "at least set ring algo available"); from 2.24 the
        call fails ("no algorithm/protocol available"), and before 2.19 the ring is kept."""
        return (2, 19) <= version < (2, 24)

    @property
    def default(self) -> bool:
        """Whether nothing is restricted."""
        return self.algorithms is None and self.protocols is None and self.nvls

    def describe(self) -> str:
        """``NCCL_ALGO=Ring,Tree NCCL_PROTO=Simple``, or ``"defaults"``."""
        return " ".join(self.text) if self.text else "defaults"


def _parse_list(name: str, value: str, names: dict[str, str]) -> tuple[frozenset[str], bool]:
    """NCCL's ``parseList`` for one list: comma-separated names without case, ``^`` first to
    enable all but those; (the enabled set, whether the list was an inclusion)."""
    if ";" in value or ":" in value:
        raise ValueError(f"{name}={value}: per-collective lists ('allreduce:tree') are not "
                         "modelled; give one list for every collective")
    exclude = value.startswith("^")
    # NCCL splits on commas with strtok (empty tokens skipped) and compares each token whole:
    # ' Tree' is no name of its (ignored before 2.24, an error after), so it is refused here
    tokens = [t for t in (value[1:] if exclude else value).split(",") if t]
    folded = {key.lower(): ours for key, ours in names.items()}
    chosen = set()
    for token in tokens:
        if token != token.strip():
            raise ValueError(f"{name}={value}: {token!r} has blanks around it, which the "
                             "runtime does not strip (it would not match a name); remove them")
        if token.lower() not in folded:
            raise ValueError(f"{name}={value}: unknown name {token!r}; expected names from "
                             f"{', '.join(names)}")
        chosen.add(folded[token.lower()])
    enabled = frozenset(names.values()) - chosen if exclude else frozenset(chosen)
    return enabled, not exclude


def settings_from_text(items: Iterable[str]) -> RuntimeSettings:
    """Settings from ``NAME=VALUE`` texts (``["NCCL_ALGO=Ring,Tree", "NCCL_PROTO=Simple"]``).

    Raises
    ------
    ValueError
        A text without ``=``, a name outside :data:`SETTING_NAMES`, a name given twice, an
        unknown algorithm or protocol, a per-collective list, NCCL_NVLS_ENABLE not 0, 1 or 2.

    >>> s = settings_from_text(["NCCL_ALGO=^nvls,NVLSTree", "NCCL_PROTO=simple"])
    >>> sorted(s.algorithms), sorted(s.protocols), s.allows("ring", "LL")
    (['collnet_chain', 'collnet_direct', 'pat', 'ring', 'tree'], ['Simple'], False)
    """
    algorithms = protocols = None
    nvls, ll128_listed, seen, text = True, False, set(), []
    for item in items:
        name, sep, value = item.partition("=")
        name = name.strip()  # (the value is kept whole: the runtime reads it as given)
        if not sep:
            raise ValueError(f"{item[:60]!r}: expected NAME=VALUE, like NCCL_PROTO=Simple")
        if name not in SETTING_NAMES:
            raise ValueError(f"{name[:60]!r}: not a setting collsynth models; expected one of "
                             f"{', '.join(SETTING_NAMES)}")
        if name in seen:
            raise ValueError(f"{name} given twice")
        if not value or len(value) > _MAX_VALUE_CHARS:
            raise ValueError(f"{name}: expected a value of 1 to {_MAX_VALUE_CHARS} characters")
        seen.add(name)
        if name == "NCCL_ALGO":
            algorithms, _ = _parse_list(name, value, _ALGORITHM_NAMES)
        elif name == "NCCL_PROTO":
            protocols, included = _parse_list(name, value, _PROTOCOL_NAMES)
            ll128_listed = included and "LL128" in protocols
        else:
            if value not in ("0", "1", "2"):
                raise ValueError(f"NCCL_NVLS_ENABLE={value}: expected 0 (off), 1 or 2 (on "
                                 "where the machine has NVLink SHARP)")
            nvls = value != "0"
        text.append(f"{name}={value}")
    return RuntimeSettings(algorithms, protocols, nvls, ll128_listed, tuple(text))
