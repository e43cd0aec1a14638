"""Tune NCCL's or RCCL's own choices on one machine: candidates, prices, default, rules.

:func:`tune_machine` takes the runtime's :class:`~collsynth.timing.tuning_model.TuningSetup`
(the machine as NCCL or RCCL sees it), offers every (algorithm, protocol) the runtime enables
there on its own channel count and on powers of two up to the communicator's, prices them and
the runtime's own choice with one ``price`` (:class:`ProgramModelPrice`: the program model, through
:mod:`collsynth.timing.pricing`), runs :func:`~collsynth.export.tuner.choose.tune_runtime` per
collective and builds the rules. What the predictions mean: docs/tuner-config.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Sequence

from collsynth.errors import InvalidInstanceError, UnknownNameError
from collsynth.export.tuner.choose import (ALWAYS_AVAILABLE, DEFAULT_THRESHOLD, Choice,
                                           RuntimeTuning, TunedRange, tune_runtime,
                                           tuning_rules)
from collsynth.export.tuner.config import COLLECTIVES, SIZE_MAX, TunerRule
import collsynth.timing.tuning_model as tm

if TYPE_CHECKING:  # pragma: no cover - for annotations only
    from collsynth.runtimes import RuntimeConstants
    from collsynth.timing.pricing import RuntimeAlgorithm
    from collsynth.timing.program_model import ProgramModel
    from collsynth.timing.tuning_model import TuningSetup
    from collsynth.topology.model import Topology

__all__ = ["CollectiveTuning", "MachineTuning", "tune_machine", "candidate_choices",
           "channel_counts", "config_collective", "PriceFunction", "ProgramModelPrice",
           "forced_channels", "runtime_estimate"]

#: ``price(setup, collective, choice, size_bytes) -> time in us | None``; collective spelt as
#: in the tuner config.
PriceFunction = Callable[["TuningSetup", str, Choice, int], "float | None"]

#: Bisection steps between two sampled sizes: the program model's prices are not smooth in the
#: size (its chunks and slices), so to the byte its decisions flip thousands of times; 4 steps
#: place a boundary between x2 samples to within 1/16 of the size (and keep tune-runtime fast).
BISECTION_DEPTH = 4

#: Candidates priced within 1% of the fastest are tied and the earliest wins (the runtime's own
#: channel count, then the fewest channels): the simulated prices of neighbouring channel counts
#: differ by rounding where the links, not the channels, limit a call.
TIE = 0.01

_MODEL_COLLECTIVE = {"broadcast": "broadcast", "reduce": "reduce", "allgather": "allgather",
                     "reducescatter": "reduce_scatter", "allreduce": "allreduce"}
_MODEL_PROTOCOL = {"ll": "LL", "ll128": "LL128", "simple": "Simple"}
_CONFIG_PROTOCOL = {v: k for k, v in _MODEL_PROTOCOL.items()}


def config_collective(name: str) -> str:
    """A collective's tuner-config spelling (``reducescatter``) from any collsynth spelling
    (``reduce_scatter``, ``reduce-scatter``, ``ReduceScatter``, ``bcast``...).

    Raises
    ------
    UnknownNameError
        A collective the runtimes' tuners do not cover (alltoall, send/recv...).
    """
    from collsynth.collective.kinds import canonical_name
    from collsynth.errors import CollsynthError

    try:
        key = canonical_name(name)
    except (CollsynthError, KeyError, ValueError, TypeError) as exc:  # one message for both
        raise UnknownNameError(f"collective {name!r}: a tuner config covers "
                               f"{', '.join(COLLECTIVES)}") from exc
    for config, model in _MODEL_COLLECTIVE.items():
        if model == key:
            return config
    raise UnknownNameError(f"collective {name!r}: a tuner config covers {', '.join(COLLECTIVES)}")


def channel_counts(maximum: int) -> tuple[int, ...]:
    """Channel counts worth forcing: powers of two up to ``maximum``, and ``maximum``.

    >>> channel_counts(24)
    (1, 2, 4, 8, 16, 24)
    """
    counts = [1 << k for k in range(max(0, maximum).bit_length()) if 1 << k <= maximum]
    if maximum >= 1 and maximum not in counts:
        counts.append(maximum)
    return tuple(counts)


def candidate_choices(setup: "TuningSetup", collective: str) -> tuple[Choice, ...]:
    """Every pair the runtime enables for ``collective`` on ``setup`` (with a bandwidth),
    each on the runtime's own channel count first, then on :func:`channel_counts`, in NCCL's
    order (algorithm, then protocol): earlier candidates win ties."""
    model = _MODEL_COLLECTIVE[collective]
    found = []
    for algorithm in tm.ALGORITHMS:
        for protocol in tm.PROTOCOLS:
            if not tm.enabled(setup, model, algorithm, protocol) \
                    or tm.bandwidth_gbps(setup, model, algorithm, protocol) <= 0:
                continue
            proto = _CONFIG_PROTOCOL[protocol]
            found.append(Choice(algorithm, proto))
            found.extend(Choice(algorithm, proto, c)
                         for c in channel_counts(tm.kind_channels(setup, algorithm)))
    return tuple(found)


def forced_channels(setup: "TuningSetup", collective: str, choice: Choice,
                    size_bytes: int) -> int:
    """The channels a call of ``size_bytes`` runs ``choice`` on: the runtime's own per-call count
    (``tuning_model.call_shape``) when ``choice.channels`` is ``None``; otherwise what the
    runtime's scheduler of its version (``tuning_model.scheduled_channels``: the cell scheduler
    from NCCL 2.22, the channel-by-data alignment in 2.20-2.21, the count itself before) makes of
    the forced count, at most the communicator's (the NVLS channels for NVLS)."""
    model, algorithm = _MODEL_COLLECTIVE[collective], choice.algorithm
    protocol = _MODEL_PROTOCOL[choice.protocol]
    shape = tm.call_shape(setup, model, algorithm, protocol, size_bytes)
    if choice.channels is None:
        return shape.channels
    forced = max(1, min(choice.channels, tm.kind_channels(setup, algorithm)))
    return tm.scheduled_channels(setup, model, algorithm, protocol, size_bytes, forced,
                                 threads=shape.threads)


def runtime_estimate(setup: "TuningSetup", collective: str, choice: Choice,
                     size_bytes: int) -> float | None:
    """The runtime's own estimate of ``choice`` (``tuning_model.algo_time_us``, on all its
    channels): what it picks by, used only for the collectives a config covers without tuning
    them (NCCL's one-channel rule); ``None`` where it cannot run the pair."""
    estimate = tm.algo_time_us(setup, _MODEL_COLLECTIVE[collective], choice.algorithm,
                               _MODEL_PROTOCOL[choice.protocol], size_bytes)
    return None if estimate is None or estimate.algbw_gbps <= 0 else estimate.time_us


class ProgramModelPrice:
    """A :data:`PriceFunction`: the program model's price of a choice as the runtime runs it.

    Each (algorithm, protocol, channels) is a
    :class:`~collsynth.timing.pricing.RuntimeAlgorithm` with its protocol pinned and its
    channels pinned to what the call runs on (:func:`forced_channels`), priced by one
    :class:`~collsynth.timing.program_model.ProgramModel` on ``topology`` with ``constants``
    (default: the runtime's documented ones). The runtime's own choice is priced the same way,
    so a gain compares like with like. ``None``: the model has no program for the pair there
    (:attr:`refused` keeps why). Prices are kept per (collective, pair, channels, size).
    """

    def __init__(self, topology: "Topology", *, constants: "RuntimeConstants | None" = None,
                 source: str = "") -> None:
        self.topology = topology
        self.constants = constants
        self.source = source
        self.refused: dict[str, str] = {}
        self._models: dict[str, "ProgramModel"] = {}
        self._subjects: dict[tuple, "RuntimeAlgorithm | None"] = {}
        self._times: dict[tuple, float] = {}

    def model(self, runtime: str) -> "ProgramModel":
        """The program model pricing ``runtime``'s (``nccl`` or ``rccl``) own algorithms."""
        from collsynth.runtimes import get_runtime
        from collsynth.timing.program_model import ProgramModel

        found = self._models.get(runtime)
        if found is None:
            rt = get_runtime(runtime)
            found = self._models[runtime] = ProgramModel(
                self.constants or rt.defaults, runtime=rt, source=self.source)
        return found

    def provenance(self, runtime: str) -> str:
        """Where the prices come from, for the config's header."""
        return f"the program model with {self.model(runtime).provenance}"

    def _subject(self, setup: "TuningSetup", collective: str, choice: Choice,
                 channels: int) -> "RuntimeAlgorithm | None":
        from collsynth.runtimes import get_runtime
        from collsynth.timing.pricing import RuntimeAlgorithm

        key = (setup.runtime, collective, choice.algorithm, choice.protocol, channels)
        if key not in self._subjects:
            subject = RuntimeAlgorithm(get_runtime(setup.runtime), choice.algorithm,
                                       _MODEL_COLLECTIVE[collective], self.topology,
                                       channels=channels,
                                       protocol=_MODEL_PROTOCOL[choice.protocol])
            why = self.model(setup.runtime).why_not(subject)
            if why is not None:
                self.refused[subject.name] = why
                subject = None
            self._subjects[key] = subject
        return self._subjects[key]

    def __call__(self, setup: "TuningSetup", collective: str, choice: Choice,
                 size_bytes: int) -> float | None:
        channels = forced_channels(setup, collective, choice, size_bytes)
        if choice.channels is not None and choice.algorithm in tm.NVLS_ALGORITHMS \
                and channels < forced_channels(setup, collective,
                                               Choice(choice.algorithm, choice.protocol),
                                               size_bytes):
            # Fewer NVLS channels than the runtime's own are not offered: the model knows no
            # rate of one NVLS channel that a curve identified (NCCL's own count ran on every
            # public curve, with the switch's ports binding), so it would price 2 channels as
            # fast as 16, where NCCL's maintainers say NVLS needs 16 SMs for its peak (4 with
            # registered buffers): docs/tuner-config.md, "NVLS channels".
            return None
        subject = self._subject(setup, collective, choice, channels)
        if subject is None:
            return None
        key = (setup.runtime, collective, choice.algorithm, choice.protocol, channels, size_bytes)
        found = self._times.get(key)
        if found is None:
            price, = self.model(setup.runtime).price(subject, [size_bytes])
            found = self._times[key] = price.time_us
        return found


@dataclass(frozen=True)
class CollectiveTuning:
    """One collective: its ``tuning``, its ``rules``, and whether it was asked for
    (``requested`` false: NCCL coverage only, see :func:`tune_machine`)."""

    collective: str
    tuning: RuntimeTuning
    rules: tuple[TunerRule, ...]
    requested: bool


@dataclass(frozen=True)
class MachineTuning:
    """What :func:`tune_machine` found for one machine and runtime."""

    runtime: str
    version: tuple[int, int]
    n_nodes: int
    n_ranks: int
    threshold: float
    collectives: tuple[CollectiveTuning, ...]
    prices: str = ""

    @property
    def rules(self) -> tuple[TunerRule, ...]:
        """Every rule, in file order."""
        return tuple(rule for c in self.collectives for rule in c.rules)

    def summary_lines(self, machine: str) -> list[str]:
        """What the file header says: the machine, the model, and the predicted gains."""
        name = {"nccl": "NCCL", "rccl": "RCCL"}[self.runtime]
        version = ".".join(str(v) for v in self.version)
        lines = [f"Machine: {machine} ({self.n_nodes} node(s), {self.n_ranks} ranks); rules match "
                 f"nNodes={self.n_nodes} nRanks={self.n_ranks} only.",
                 f"Prices: {self.prices or 'as given'}; {name} {version}'s own choice from its "
                 "tuning model, priced the same way (predictions, not measurements; measure "
                 "before and after).",
                 f"A rule forces a choice only where it is predicted more than "
                 f"{self.threshold:.0%} faster than {name}'s own choice:"]
        gains = [(c.collective, r) for c in self.collectives for r in c.tuning.gains]
        for collective, r in gains:
            top = "max" if r.max_bytes == SIZE_MAX else str(r.max_bytes)
            lines.append(f"  {collective} {r.min_bytes}..{top} B: {r.choice.label}, {r.gain} "
                         f"faster than {name}'s own ({r.rows[0].default.label} at "
                         f"{r.rows[0].size_bytes} B)")
        if not gains:
            lines.append("  (none: no range gains that much)")
        if self.runtime == "nccl":
            lines += ["The other rows force NCCL's own choice as the model predicts it, channels 0 "
                      "(NCCL's own count): the example plugin runs any call no row matches on ONE "
                      "channel. A ring row after a row NCCL may not run for a call (IGNORE) keeps "
                      "such calls off one channel too."]
        return lines


def tune_machine(setup: "TuningSetup", collectives: Sequence[str], sizes: Sequence[int], *,
                 price: PriceFunction, threshold: float = DEFAULT_THRESHOLD,
                 max_depth: int | None = BISECTION_DEPTH) -> MachineTuning:
    """Tune ``setup.runtime``'s own choices for ``collectives`` at ``sizes``.

    Parameters
    ----------
    setup:
        The machine as the runtime sees it (:func:`collsynth.timing.tuning_model.tuning_setup`).
    collectives:
        Collective names (any collsynth spelling).
    sizes:
        Sampled sizes in bytes (NCCL's ``nBytes``).
    price:
        The prices of the candidates and of the runtime's own choice
        (:class:`ProgramModelPrice` of the machine's topology).
    threshold:
        Force a choice only where it is predicted faster than the default by this fraction.
    max_depth:
        Bisection steps between two sampled sizes (:func:`tune_runtime`; ``None``: to the
        byte).

    Returns
    -------
    MachineTuning
        One :class:`CollectiveTuning` per requested collective; for ``nccl`` also one per
        collective not requested, whose rules force NCCL's own choice over every size (the
        example plugin runs a call no rule matches on one channel).

    >>> from collsynth.topology.builtins import get_topology
    >>> h100 = get_topology("dgx-h100")
    >>> t = tune_machine(tm.tuning_setup(h100), ["allreduce"], [1 << 20],
    ...                  price=ProgramModelPrice(h100))
    >>> [c.collective for c in t.collectives]
    ['allreduce', 'broadcast', 'reduce', 'allgather', 'reducescatter']
    """
    if not callable(price):
        raise InvalidInstanceError("tune_machine: price must be a function "
                                   "(ProgramModelPrice(topology))")
    wanted = []
    for name in collectives:
        key = config_collective(name)
        if key not in wanted:
            wanted.append(key)
    if not wanted:
        raise InvalidInstanceError("tune_machine: give at least one collective")
    covered = wanted + ([c for c in COLLECTIVES if c not in wanted]
                        if setup.runtime == "nccl" else [])
    results = []
    for collective in covered:
        model = _MODEL_COLLECTIVE[collective]

        requested = collective in wanted
        if not requested and not any(tm.offered_protocols(setup, model, a)
                                     for a in tm.ALGORITHMS):
            continue  # the job's settings leave it nothing: the runtime fails such calls
        # A collective covered only for NCCL's one-channel rule pins NCCL's own choice, which
        # no price changes: its ranges follow the runtime's own estimate.
        by = price if requested else runtime_estimate

        def priced(choice: Choice, size: int, collective: str = collective,
                   by=by) -> float | None:
            return by(setup, collective, choice, size)

        def default(size: int, model: str = model, priced=priced) -> tuple[Choice, float]:
            own = tm.choose(setup, model, size)
            choice = Choice(own.algorithm, _CONFIG_PROTOCOL[own.protocol])
            time = priced(choice, size)
            if time is None:
                why = "; ".join(getattr(price, "refused", {}).values()) or "no price"
                raise InvalidInstanceError(f"{collective} at {size} B: the runtime's own "
                                           f"choice {choice.label} cannot be priced: {why}")
            return choice, time

        choices = candidate_choices(setup, collective) if requested else ()
        tuning = tune_runtime(choices, sizes, priced, default, threshold=threshold,
                              max_depth=max_depth, tie=TIE, bisect_all=False)

        def fallback(r: TunedRange, priced=priced) -> Choice:
            inside = [row.size_bytes for row in r.rows] or [max(1, min(r.min_bytes, SIZE_MAX))]
            middle = inside[len(inside) // 2]
            options = [Choice(a, p) for a, p in sorted(ALWAYS_AVAILABLE)]
            timed = [(priced(c, middle), i, c) for i, c in enumerate(options)]
            return min((t, i, c) for t, i, c in timed if t is not None and math.isfinite(t))[2]

        rules = tuning_rules(tuning, collective, runtime=setup.runtime, n_nodes=setup.nodes,
                             n_ranks=setup.ranks, fallback=fallback)
        results.append(CollectiveTuning(collective, tuning, rules, requested))
    provenance = getattr(price, "provenance", None)
    prices = provenance(setup.runtime) if callable(provenance) else ""
    return MachineTuning(setup.runtime, setup.version, setup.nodes, setup.ranks,
                         float(threshold), tuple(results), prices)
