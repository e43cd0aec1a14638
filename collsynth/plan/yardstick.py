"""One yardstick for a plan: the runtime's own algorithms and the synthesized ones priced by
one model (:mod:`collsynth.timing.pricing`), as exact lines (a linear model) or at sampled
sizes (the program model, synthesized programs after tuned lowering).

The details: ``docs/plan.md``, section "Pricing".
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Callable, Iterable, Sequence

from collsynth.errors import ExportError, InputTooLargeError, InvalidInstanceError
from collsynth.export.pipeline import AUTO_CHANNELS
from collsynth.plan.choose import NCCL, Candidate, Line, Sample, algorithm_detail
from collsynth.timing.pricing import (LinearPricingModel, PricingModel, RuntimeAlgorithm,
                                      fastest_runtime_algorithm, pinned_protocols,
                                      runtime_algorithms)
from collsynth.timing.program_model import ProgramModel, TuneOptions
from collsynth.timing.tune import TunedExport, tune_sizes

if TYPE_CHECKING:  # pragma: no cover - for annotations only
    from collsynth.algorithm.model import Algorithm
    from collsynth.runtimes import Runtime
    from collsynth.topology.model import Topology

__all__ = ["PLAN_SAMPLE_SIZES", "PLAN_BOUNDARY_STEPS", "PLAN_TUNE_LAYOUTS", "PLAN_TUNE_INSTANCES",
           "PLAN_TUNE_MAX_SENDS", "sample_sizes", "plan_layouts", "runtime_candidates",
           "line_candidates", "measured_candidate", "tuned_candidate", "sampled_price",
           "TUNE_ERRORS"]

#: Sizes every program-model plan samples besides the traced ones (every traced size is
#: sampled): 1 KiB .. 1 GiB in x16 steps; the boundaries between them are bisected.
PLAN_SAMPLE_SIZES = tune_sizes(1024, 1 << 30, 16)
#: Bisection steps that place a boundary between two sampled sizes: a x16 gap to within 5%.
PLAN_BOUNDARY_STEPS = 6
#: Layouts (channels, policy) a plan tunes per algorithm: the fewest channels that fit and the
#: next ones of ``AUTO_CHANNELS``. ``collsynth export --tune`` searches them all; a plan tunes
#: every synthesized algorithm of every planned collective, so it keeps the search short.
PLAN_TUNE_LAYOUTS = 3
#: Above this many sends an algorithm is tuned on one layout (the fewest channels that fit),
#: protocols only: lowering, checking and preparing a layout of a large program takes seconds.
PLAN_TUNE_MAX_SENDS = 4096
#: Instance counts a plan tunes: one. Instances multiply ``nchunksperloop``, so they would change
#: which traced calls the runtime gives the program.
PLAN_TUNE_INSTANCES = (1,)


def sample_sizes(traced: Iterable[int]) -> tuple[int, ...]:
    """:data:`PLAN_SAMPLE_SIZES` and every traced size of at least one byte, ascending.

    >>> sample_sizes([3000, 0, 1024])[:3]
    (1024, 3000, 16384)
    """
    return tuple(sorted(set(PLAN_SAMPLE_SIZES) | {int(s) for s in traced if s >= 1}))


def plan_layouts(channels: int, channel_by: str, sends: int = 0
                 ) -> tuple[tuple[int, str], ...]:
    """The layouts a plan tunes for a program of ``sends`` sends: ``(channels, channel_by)``
    (the fewest that fit) and the next ones of ``AUTO_CHANNELS``, :data:`PLAN_TUNE_LAYOUTS` in
    all; that one alone above :data:`PLAN_TUNE_MAX_SENDS` sends.

    >>> plan_layouts(1, "chunk"), plan_layouts(2, "peer", sends=10**5)
    (((1, 'chunk'), (2, 'chunk'), (2, 'peer')), ((2, 'peer'),))
    """
    key = (channels, channel_by)
    if key not in AUTO_CHANNELS:
        return (key,)
    start = AUTO_CHANNELS.index(key)
    count = 1 if sends > PLAN_TUNE_MAX_SENDS else PLAN_TUNE_LAYOUTS
    return AUTO_CHANNELS[start:start + count]


def _line(expr: object) -> Line:
    return Line.from_expr(expr)


def line_candidates(model: LinearPricingModel, subjects: Sequence["Algorithm"]
                    ) -> list[Candidate]:
    """A candidate per synthesized algorithm, its exact line by ``model``."""
    return [Candidate(a.name, "collsynth", _line(model.line(a)), a, algorithm_detail(a),
                      yardstick=model.name) for a in subjects]


def runtime_candidates(model: PricingModel, runtime: "Runtime", collective: str,
                       topology: "Topology", sizes: Sequence[int]
                       ) -> tuple[list[Candidate], list[str]]:
    """NCCL's candidates by ``model`` and why the model could not price the others.

    Each of :func:`~collsynth.timing.pricing.runtime_algorithms` the model prices is one
    candidate: with a linear model one line per protocol (``"nccl-ring/LL"``...: the runtime picks
    the fastest, and :func:`~collsynth.plan.choose.choose_ranges` takes the envelope), otherwise
    its samples at ``sizes`` (the runtime's protocol by size).
    """
    candidates: list[Candidate] = []
    why_not: list[str] = []
    for subject in runtime_algorithms(runtime, collective, topology):
        why = model.why_not(subject)
        if why is not None:
            why_not.append(why)
            continue
        if isinstance(model, LinearPricingModel):
            for pinned in pinned_protocols(subject, model):
                candidates.append(Candidate(pinned.name, NCCL, _line(model.line(pinned)),
                                            detail=f"{runtime.family.upper()} "
                                                   f"{subject.algorithm}/{pinned.protocol}",
                                            yardstick=model.name))
            continue
        prices = model.price(subject, sizes)
        channels = prices[0].channels if prices else None
        candidates.append(Candidate(
            subject.name, NCCL, None,
            detail=f"the runtime's {subject.algorithm}, {channels} channel(s), its protocol by "
                   "size",
            samples=tuple(Sample(p.size_bytes, p.time_us, p.protocol or "") for p in prices),
            yardstick=model.name))
    return candidates, why_not


def measured_candidate(model: LinearPricingModel, subject: RuntimeAlgorithm) -> Candidate:
    """NCCL as a calibration measured it: one line."""
    return Candidate(subject.name, NCCL, _line(model.line(subject)),
                     detail="NCCL as measured (calibration fit)", yardstick=model.name)


def tuned_candidate(model: ProgramModel, algorithm: "Algorithm", sizes: Sequence[int], *,
                    layouts: Sequence[tuple[int, str]], inplace: bool, outofplace: bool
                    ) -> tuple[Candidate, TunedExport]:
    """``algorithm`` tuned by ``model`` (over ``layouts``, one instance, every protocol) and
    priced at ``sizes``: each sample is the time of the layout its tuned range runs.

    Raises
    ------
    ExportError, InvalidInstanceError
        What :func:`~collsynth.timing.tune.tune_export` raises (no layout fits, a program the
        model refuses).
    """
    tuned = model.tuned_export(algorithm, sizes, TuneOptions(
        layouts=tuple(layouts), instances=PLAN_TUNE_INSTANCES, inplace=inplace,
        outofplace=outofplace))
    samples = tuple(Sample(p.size_bytes, p.time_us, p.protocol or "",
                           p.note.removeprefix("tuned: "))
                    for p in model.price(algorithm, sizes))
    return (Candidate(algorithm.name, "collsynth", None, algorithm, algorithm_detail(algorithm),
                      samples=samples, yardstick=model.name), tuned)


def sampled_price(model: PricingModel, runtime: "Runtime", collective: str,
                  topology: "Topology", algorithms: dict[str, "Algorithm"]
                  ) -> Callable[[str, int], float]:
    """``price(name, size_bytes)``: a candidate's time by ``model`` at any size (the boundaries
    between sampled ranges): :data:`~collsynth.plan.choose.NCCL` is the fastest of the runtime's
    algorithms the model prices; another name the algorithm of that name."""

    def price(name: str, size_bytes: int) -> float:
        if name == NCCL:
            found = fastest_runtime_algorithm(runtime, collective, topology, [size_bytes], model)
            return found[0].time_us if found else math.inf
        (p,) = model.price(algorithms[name], [size_bytes])
        return p.time_us

    return price


#: Errors a plan expects when a synthesized algorithm cannot be tuned: it is then left out.
TUNE_ERRORS = (ExportError, InvalidInstanceError, InputTooLargeError)
