"""The export pipeline: estimate the limits, lower on the fewest channels that fit, check, render.

Nothing leaves it unchecked: :func:`check_exported` runs the checker on every lowered program and
:func:`check_text` the reader's rules on its text (docs/msccl-xml.md §16). The command line
(``collsynth export``) and the planner both call it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Sequence

from collsynth._output import write_text_atomic
from collsynth.algorithm.model import Algorithm
from collsynth.errors import ExportError, InputTooLargeError
from collsynth.export.check import check_program
from collsynth.export.layout import collective_layout
from collsynth.export.limits import estimate_all, limit_error
from collsynth.export.lower import lower
from collsynth.export.program import Program
from collsynth.runtimes import xml_dialect
from collsynth.export.xml_reader import text_problems
from collsynth.export.xml_writer import write_program

__all__ = ["AUTO_CHANNELS", "Exported", "check_exported", "check_text", "check_instances",
           "export_algorithm", "export_programs"]

#: (channels, policy) pairs ``--channels auto`` tries, fewest channels first: more channels
#: spread a rank's steps (policy "chunk") or its peers (policy "peer") over more threadblocks, so
#: per-threadblock and per-channel limits are met by the first that fits.
AUTO_CHANNELS = ((1, "chunk"),) + tuple((c, by) for c in (2, 4, 8, 16, 32)
                                         for by in ("chunk", "peer"))
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
    """One runtime's checked program, its XML text, and the (channels, policy) it was laid
    out with."""

    program: Program
    text: str
    channels: int
    channel_by: str


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


def export_programs(algorithm: Algorithm, runtimes: Sequence[str], *, subject: str,
                    channels: int | str = 1, channel_by: str = "chunk", proto: str = "Simple",
                    instances: int = 1, inplace: bool = False, outofplace: bool = True,
                    min_bytes: int | None = None, max_bytes: int | None = None,
                    name: str | None = None) -> dict[str, Exported]:
    """Every runtime's checked program and text, nothing written.

    ``channels="auto"`` gives each runtime the fewest of :data:`AUTO_CHANNELS` that meet its
    limits. Limits every choice certainly exceeds (estimated from the sends) are refused
    before anything is lowered. ``subject`` names the algorithm in errors.

    Raises
    ------
    ExportError
        With every exceeded limit in its ``violations`` (all runtimes' together), or the first
        check that failed.
    """
    check_instances(instances, runtimes)
    choices = AUTO_CHANNELS if channels == "auto" else ((channels, channel_by),)
    estimated = {choice: estimate_all(algorithm, runtimes, channels=choice[0],
                                      channel_by=choice[1], instances=instances,
                                      inplace=inplace, outofplace=outofplace)
                 for choice in choices}
    hopeless = [runtime for runtime in runtimes
                if all(estimated[choice][runtime] for choice in choices)]
    if hopeless:  # refused before lowering anything, with the largest channel count's figures
        raise limit_error([v for runtime in hopeless for v in estimated[choices[-1]][runtime]],
                          subject, before_lowering=True)
    exported: dict[str, Exported] = {}
    exceeded: list = []
    for runtime in runtimes:
        failed: list = []
        for choice in choices:  # each runtime gets the fewest channels that fit it
            if estimated[choice][runtime]:
                failed = estimated[choice][runtime]
                continue
            program, failed = _lower_checked(
                algorithm, runtime, channels=choice[0], channel_by=choice[1], proto=proto,
                instances=instances, inplace=inplace, outofplace=outofplace,
                min_bytes=min_bytes, max_bytes=max_bytes, name=name)
            if program is not None:
                text = write_program(program, runtime)
                check_text(text, runtime)
                exported[runtime] = Exported(program, text, *choice)
                break
        else:
            exceeded.extend(failed)
    if exceeded:
        raise limit_error(exceeded, subject)
    return exported
