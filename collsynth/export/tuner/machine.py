"""Tune NCCL's or RCCL's own choices on one machine: candidates, prices, default, rules.

:func:`tune_machine` takes the runtime's :class:`~collsynth.timing.tuning_model.TuningSetup`
(the machine as NCCL or RCCL sees it), offers every (algorithm, protocol) the runtime enables
there on its own channel count and on powers of two up to the communicator's, prices them with
``price`` (for now :func:`_price_with_tuning_model`: the runtime's own estimate, which the
program model will replace), runs :func:`~collsynth.export.tuner.choose.tune_runtime` per
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
    from collsynth.timing.tuning_model import TuningSetup

__all__ = ["CollectiveTuning", "MachineTuning", "tune_machine", "candidate_choices",
           "channel_counts", "config_collective", "PriceFunction"]

#: ``price(setup, collective, choice, size_bytes) -> time in us | None``; collective spelt as
#: in the tuner config.
PriceFunction = Callable[["TuningSetup", str, Choice, int], "float | None"]

_MODEL_COLLECTIVE = {"broadcast": "broadcast", "reduce": "reduce", "allgather": "allgather",
                     "reducescatter": "reduce_scatter", "allreduce": "allreduce"}
_MODEL_PROTOCOL = {"ll": "LL", "ll128": "LL128", "simple": "Simple"}
_CONFIG_PROTOCOL = {v: k for k, v in _MODEL_PROTOCOL.items()}
_NVLS = ("nvls", "nvls_tree")


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


def _kind_channels(setup: "TuningSetup", algorithm: str) -> int:
    """Most channels a call of ``algorithm`` can get: NVLS calls run on the NVLS channels,
    the others on the communicator's."""
    return setup.nvls_channels if algorithm in _NVLS else setup.comm_channels


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
                         for c in channel_counts(_kind_channels(setup, algorithm)))
    return tuple(found)


def _price_with_tuning_model(setup: "TuningSetup", collective: str, choice: Choice,
                             size_bytes: int) -> float | None:
    """PLACEHOLDER PRICE, to be replaced by the program model's: the runtime's own estimate
    (``tuning_model.algo_time_us``: latency + size / algorithm bandwidth) with its bandwidth
    term scaled by the share of channels the call runs on.

    The estimate assumes every channel of the communicator (the NVLS channels for NVLS); a call
    runs on ``tuning_model.call_shape(...).channels`` of them by itself, or, when a tuner forces
    ``c`` channels, on what NCCL's cell scheduler makes of ``c`` (``cell_channels``). The
    bandwidth term is divided by that share (linear in channels, no per-channel cost: forcing
    more channels looks better than it may be; see docs/tuner-config.md).
    ``None``: the runtime cannot run the pair here.
    """
    model, algorithm = _MODEL_COLLECTIVE[collective], choice.algorithm
    protocol = _MODEL_PROTOCOL[choice.protocol]
    estimate = tm.algo_time_us(setup, model, algorithm, protocol, size_bytes)
    if estimate is None or estimate.algbw_gbps <= 0:
        return None
    most = max(1, _kind_channels(setup, algorithm))
    if choice.channels is None:
        used = tm.call_shape(setup, model, algorithm, protocol, size_bytes).channels
    else:
        used = tm.cell_channels(model, size_bytes, setup.ranks, protocol,
                                max(1, min(choice.channels, most)))
    bandwidth_us = size_bytes / (1000 * estimate.algbw_gbps)
    latency_us = estimate.time_us - bandwidth_us
    return latency_us + bandwidth_us * most / max(1, min(used, most))


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
                 f"Prices: {name} {version}'s own tuning model, with a linear share of channels "
                 "(predictions, not measurements; measure before and after).",
                 f"A rule forces a choice only where it is predicted more than "
                 f"{self.threshold:.0%} faster than {name}'s own choice:"]
        gains = [(c.collective, r) for c in self.collectives for r in c.tuning.gains]
        for collective, r in gains:
            top = "max" if r.max_bytes == SIZE_MAX else str(r.max_bytes)
            speedups = r.speedups or (1.0,)
            low, high = min(speedups), max(speedups)
            shown = f"{low:.2f}x" if round(low, 2) == round(high, 2) else \
                f"{low:.2f}-{high:.2f}x"
            lines.append(f"  {collective} {r.min_bytes}..{top} B: {r.choice.label}, {shown} "
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
                 threshold: float = DEFAULT_THRESHOLD,
                 price: PriceFunction | None = None) -> MachineTuning:
    """Tune ``setup.runtime``'s own choices for ``collectives`` at ``sizes``.

    Parameters
    ----------
    setup:
        The machine as the runtime sees it (:func:`collsynth.timing.tuning_model.tuning_setup`).
    collectives:
        Collective names (any collsynth spelling).
    sizes:
        Sampled sizes in bytes (NCCL's ``nBytes``).
    threshold:
        Force a choice only where it is predicted faster than the default by this fraction.
    price:
        The prices (default :func:`_price_with_tuning_model`).

    Returns
    -------
    MachineTuning
        One :class:`CollectiveTuning` per requested collective; for ``nccl`` also one per
        collective not requested, whose rules force NCCL's own choice over every size (the
        example plugin runs a call no rule matches on one channel).

    >>> from collsynth.topology.builtins import get_topology
    >>> setup = tm.tuning_setup(get_topology("dgx-h100"))
    >>> t = tune_machine(setup, ["allreduce"], [1 << 20])
    >>> [c.collective for c in t.collectives]
    ['allreduce', 'broadcast', 'reduce', 'allgather', 'reducescatter']
    """
    price = price or _price_with_tuning_model
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

        def priced(choice: Choice, size: int, collective: str = collective) -> float | None:
            return price(setup, collective, choice, size)

        def default(size: int, model: str = model, priced=priced) -> tuple[Choice, float]:
            own = tm.choose(setup, model, size)
            choice = Choice(own.algorithm, _CONFIG_PROTOCOL[own.protocol])
            time = priced(choice, size)
            if time is None:  # pragma: no cover - the runtime's choice always runs
                raise InvalidInstanceError(f"{collective} at {size} B: the runtime's own "
                                           f"choice {choice.label} has no price")
            return choice, time

        requested = collective in wanted
        choices = candidate_choices(setup, collective) if requested else ()
        tuning = tune_runtime(choices, sizes, priced, default, threshold=threshold)

        def fallback(r: TunedRange, priced=priced) -> Choice:
            inside = [row.size_bytes for row in r.rows] or [max(1, min(r.min_bytes, SIZE_MAX))]
            middle = inside[len(inside) // 2]
            options = [Choice(a, p) for a, p in sorted(ALWAYS_AVAILABLE)]
            timed = [(priced(c, middle), i, c) for i, c in enumerate(options)]
            return min((t, i, c) for t, i, c in timed if t is not None and math.isfinite(t))[2]

        rules = tuning_rules(tuning, collective, runtime=setup.runtime, n_nodes=setup.nodes,
                             n_ranks=setup.ranks, fallback=fallback)
        results.append(CollectiveTuning(collective, tuning, rules, requested))
    return MachineTuning(setup.runtime, setup.version, setup.nodes, setup.ranks,
                         float(threshold), tuple(results))
