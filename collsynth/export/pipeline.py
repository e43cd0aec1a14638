"""The export pipeline: estimate the limits, restage and lower on the first layout that fits, check,
render.

Nothing leaves it unchecked: :func:`check_exported` runs the checker on every lowered program and
:func:`check_text` the reader's rules on its text (docs/msccl-xml.md §16). The command line
(``collsynth export``) and the planner both call it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Iterator, Sequence

from collsynth._output import write_text_atomic
from collsynth.algorithm.model import Algorithm
from collsynth.errors import ExportError, InputTooLargeError
from collsynth.export.check import check_program
from collsynth.export.coarsen import restage, stage_choices, waves
from collsynth.export.layout import collective_layout
from collsynth.export.limits import estimate_all, limit_error
from collsynth.export.lower import lower
from collsynth.export.program import Program
from collsynth.runtimes import xml_dialect
from collsynth.export.xml_reader import text_problems
from collsynth.export.xml_writer import write_program

__all__ = ["AUTO_CHANNELS", "FIT_CHANNELS", "Exported", "check_exported", "check_text",
           "check_instances", "export_algorithm", "export_programs", "fit_layouts"]

#: (channels, policy) pairs a plan tunes over, fewest channels first (collsynth.plan): more
#: channels spread a rank's steps (policy "chunk") or its peers (policy "peer") over more
#: threadblocks, so per-threadblock and per-channel limits are met by the first that fits.
AUTO_CHANNELS = ((1, "chunk"),) + tuple((c, by) for c in (2, 4, 8, 16, 32)
                                         for by in ("chunk", "peer"))
_MORE_CHANNELS = (2, 4, 8, 16, 32)
#: With ``stages="auto"``, fewer stages are tried before more channels than this (every channel
#: adds a threadblock, one GPU multiprocessor, per peer).
PREFERRED_CHANNELS = 8
#: (channels, policy) pairs ``collsynth export`` tries by default (``--channels auto``), fewest
#: channels first: policy "block" keeps merged messages whole, "chunk" spreads single pieces,
#: "peer" spreads a rank's peers.
FIT_CHANNELS = ((1, "chunk"),) + tuple((c, by) for c in _MORE_CHANNELS
                                        for by in ("block", "chunk", "peer"))
#: Problems shown in an ExportError when the check fails.
_SHOWN = 5
_NOT_CHECKED = "postcondition not checked"


def check_exported(program: Program, runtime: str, algorithm: Algorithm) -> None:
    """Raise :class:`ExportError` with the checker's first problems unless ``program`` passes
    :func:`collsynth.export.check.check_program` for ``runtime``.

    The postcondition checked is the algorithm's collective (with its root). A custom
    collective has no postcondition the checker knows; every other rule is still checked, and
    the algorithm itself was verified before lowering.
    """
    layout = collective_layout(algorithm.collective, runtime,
                               inplace=bool(program.inplace) and not program.outofplace)
    kind = layout.kind.removeprefix("custom_")
    collective = None if kind == "custom" else kind
    roots = algorithm.collective.roots
    root = roots[0] if roots and collective is not None else None
    try:
        report = check_program(program, runtime=runtime, collective=collective, root=root,
                               strict=True)
    except InputTooLargeError as exc:
        raise ExportError(f"the {runtime} program is too large to check ({exc}); not written")\
            from exc
    problems = [p for p in report.problems
                if not (collective is None and p.kind == "postcondition"
                        and p.message.startswith(_NOT_CHECKED))]
    if problems:
        shown = "; ".join(str(p) for p in problems[:_SHOWN])
        more = f"; and {len(problems) - _SHOWN} more" if len(problems) > _SHOWN else ""
        raise ExportError(f"the {runtime} program fails the check: {shown}{more}")


def check_text(text: str, runtime: str) -> None:
    """Raise :class:`ExportError` if the runtimes' reader would trip on ``text`` (lexical rules
    and required attributes, :func:`collsynth.export.xml_reader.text_problems`)."""
    problems = text_problems(text, runtime)
    if problems:
        shown = "; ".join(str(p) for p in problems[:_SHOWN])
        raise ExportError(f"the {runtime} XML text fails the reader's rules: {shown}")


def check_instances(instances: int, runtimes: Sequence[str]) -> None:
    """Refuse, before any work, more instances than a runtime has channels (every instance
    takes at least one channel of its own)."""
    over = {r: xml_dialect(r).max_channels for r in runtimes
            if xml_dialect(r).max_channels < instances}
    if over:
        limits = ", ".join(f"{r} {limit}" for r, limit in over.items())
        raise ExportError(f"--instances {instances}: each instance needs a channel of its own, "
                          f"more than the channels the runtime allows (MAXCHANNELS: {limits}); "
                          "nothing written")


def export_algorithm(algorithm: Algorithm, path: str | os.PathLike[str], *, runtime: str,
                     proto: str = "Simple", channels: int = 1, instances: int = 1,
                     inplace: bool = False, outofplace: bool = True,
                     min_bytes: int | None = None, max_bytes: int | None = None,
                     name: str | None = None) -> Program:
    """Lower ``algorithm`` for ``runtime``, check it and write it to ``path``; return the program.

    Options are those of :func:`collsynth.export.lower.lower`. Nothing is written when the
    program fails the check.

    Raises
    ------
    ExportError
        The runtime cannot express the algorithm, limits are exceeded (all of them are
        named, with the worst place and by how much, and listed in the error's
        ``violations`` attribute; those certain from the sends are found before lowering), or
        the check fails.
    OutputPathError
        ``path`` cannot be written.
    """
    program = lower(algorithm, runtime=runtime, proto=proto, channels=channels,
                    instances=instances, inplace=inplace, outofplace=outofplace,
                    min_bytes=min_bytes, max_bytes=max_bytes, name=name)
    check_exported(program, runtime, algorithm)
    text = write_program(program, runtime)
    check_text(text, runtime)
    write_text_atomic(path, text)
    return program


@dataclass(frozen=True)
class Exported:
    """One runtime's checked program, its XML text, the (channels, policy) it was laid out with,
    and the stages it was restaged to (``None``: the algorithm as it is,
    :func:`~collsynth.export.coarsen.restage`)."""

    program: Program
    text: str
    channels: int
    channel_by: str
    stages: int | None = None


def _lower_checked(algorithm: Algorithm, runtime: str, *, channels: int, channel_by: str,
                   proto: str, instances: int, inplace: bool, outofplace: bool,
                   min_bytes: int | None, max_bytes: int | None, name: str | None
                   ) -> tuple[Program | None, list]:
    """``(program, [])`` lowered and checked, or ``(None, violations)`` when limits are over."""
    try:
        program = lower(algorithm, runtime=runtime, proto=proto, channels=channels,
                        channel_by=channel_by, instances=instances, inplace=inplace,
                        outofplace=outofplace, min_bytes=min_bytes, max_bytes=max_bytes,
                        name=name)
    except ExportError as exc:
        violations = getattr(exc, "violations", None)
        if violations:
            return None, list(violations)
        raise ExportError(f"{runtime}: {exc}") from exc
    check_exported(program, runtime, algorithm)
    return program, []


def fit_layouts(channels: int | str, channel_by: str | None) -> tuple[tuple[int, str], ...]:
    """The (channels, policy) pairs an export tries, in order: ``channels`` with ``channel_by``
    (default ``"chunk"``), or for ``channels="auto"`` :data:`FIT_CHANNELS` (only policy
    ``channel_by`` beyond one channel when it is given).

    >>> fit_layouts(2, None), fit_layouts("auto", "peer")[:3]
    (((2, 'chunk'),), ((1, 'chunk'), (2, 'peer'), (4, 'peer')))
    """
    if channels != "auto":
        return ((int(channels), channel_by or "chunk"),)
    if channel_by is None:
        return FIT_CHANNELS
    return ((1, "chunk"),) + tuple((c, channel_by) for c in _MORE_CHANNELS)


def export_programs(algorithm: Algorithm, runtimes: Sequence[str], *, subject: str,
                    channels: int | str = 1, channel_by: str | None = None,
                    stages: int | str | None = None, proto: str = "Simple",
                    instances: int = 1, inplace: bool = False, outofplace: bool = True,
                    min_bytes: int | None = None, max_bytes: int | None = None,
                    name: str | None = None) -> dict[str, Exported]:
    """Every runtime's checked program and text, nothing written.

    ``channels="auto"`` tries the layouts of :func:`fit_layouts`, fewest channels first.
    ``stages`` restages the algorithm first (:func:`~collsynth.export.coarsen.restage`):
    ``None`` keeps it as it is; a number restages it to that many stages; ``"auto"`` tries the
    algorithm as it is on the first layout (one channel for ``channels="auto"``), then
    :func:`~collsynth.export.coarsen.stage_choices` (most stages first), each on the layouts of
    up to :data:`PREFERRED_CHANNELS` channels in order, then each on the layouts of more
    channels. Each runtime gets the first choice that
    meets its limits: a choice that certainly exceeds one (estimated from the sends) is not
    lowered, and a restaged one predicted to exceed one (``estimate_all(..., predict=True)``)
    only after every other. ``subject`` names the algorithm in errors.

    Raises
    ------
    ExportError
        With every exceeded limit of the last choice tried in its ``violations`` (all runtimes'
        together) when no choice fits, or the first check that failed.
    """
    check_instances(instances, runtimes)
    layouts = fit_layouts(channels, channel_by)
    if stages == "auto":
        counts = stage_choices(algorithm)
        few = tuple(x for x in layouts if x[0] <= PREFERRED_CHANNELS)
        many = tuple(x for x in layouts if x[0] > PREFERRED_CHANNELS)
        choices: list[tuple[int | None, tuple[tuple[int, str], ...]]] = [(None, layouts[:1])]
        choices += [(count, few) for count in counts]
        choices += [(count, many) for count in counts if many]
    else:
        # More stages than the schedule has waves leave it as it is: say the stages it has
        # (100000 asked of a 2-wave schedule was reported as "100000 stage(s)").
        choices = [(stages if stages is None else min(int(stages), waves(algorithm)), layouts)]
    restaged: dict[int | None, Algorithm] = {}
    estimated: dict[tuple, dict] = {}

    def variant(count: int | None) -> Algorithm:
        if count not in restaged:
            restaged[count] = algorithm if count is None else restage(algorithm, count)
        return restaged[count]

    def estimate(count: int | None, layout: tuple[int, str], predict: bool = False) -> dict:
        key = (count, layout, predict)
        if key not in estimated:
            estimated[key] = estimate_all(
                variant(count), runtimes, channels=layout[0], channel_by=layout[1],
                instances=instances, inplace=inplace, outofplace=outofplace, predict=predict)
        return estimated[key]

    def candidates(runtime: str, failed: list) -> Iterator[tuple[int | None, tuple[int, str]]]:
        """The choices worth lowering for ``runtime``, in order: those within the estimate's
        bounds, the restaged ones predicted over a limit last. ``failed`` is set to the
        violations of the last choice bounded out."""
        deferred = []
        for count, tried in choices:
            for layout in tried:
                bound = estimate(count, layout)[runtime]
                if bound:
                    failed[:] = bound
                elif count is not None and estimate(count, layout, predict=True)[runtime]:
                    deferred.append((count, layout))
                else:
                    yield count, layout
        yield from deferred

    exported: dict[str, Exported] = {}
    exceeded: list = []
    for runtime in runtimes:
        failed: list = []
        for count, layout in candidates(runtime, failed):
            program, violations = _lower_checked(
                variant(count), runtime, channels=layout[0], channel_by=layout[1],
                proto=proto, instances=instances, inplace=inplace, outofplace=outofplace,
                min_bytes=min_bytes, max_bytes=max_bytes, name=name)
            if program is not None:
                text = write_program(program, runtime)
                check_text(text, runtime)
                exported[runtime] = Exported(program, text, *layout, count)
                break
            failed[:] = violations
        else:
            exceeded.extend(failed)
    if exceeded:
        raise limit_error(exceeded, subject, before_lowering=all(
            all(estimate(count, layout)[r] for count, tried in choices for layout in tried)
            for r in runtimes if r not in exported))
    return exported
