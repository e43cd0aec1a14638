"""Check an MSCCL++ execution plan: the executor's static rules, then a symbolic execution of
every rank at one message size, then the collective's postcondition.

Values are multisets of (rank, input cell) contributions; the pre- and postconditions and the
buffer layouts (in place and out of place) are collsynth's own (:mod:`collsynth.collective`,
:mod:`collsynth.export.layout`). What is checked and why: ``docs/mscclpp.md``, section "What
collsynth checks".
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from math import gcd
from typing import Callable

from collsynth.collective import allgather, allreduce, alltoall, reduce_scatter
from collsynth.collective.model import Collective
from collsynth.errors import CollsynthError, ExportError, InputTooLargeError
from collsynth.export.check import CheckReport, Problem
from collsynth.export.layout import Layout, collective_layout
from collsynth.export.mscclpp.geometry import Geometry, default_chunk_bytes, geometry
from collsynth.export.mscclpp.limits import MSCCLPP
from collsynth.export.mscclpp.loader import LoadedPlan, load_plan
from collsynth.export.mscclpp.machine import GARBAGE, SHOWN_PER_KIND, Cells, Machine
from collsynth.export.mscclpp.model import Plan
from collsynth.export.mscclpp.steps import Step, count_steps, expand

__all__ = ["PROBLEM_KINDS", "WARNING_KINDS", "MAX_CHECKED_CELLS", "MAX_CHECKED_STEPS",
           "PlanReport", "check_plan",
           "plan_collective", "run_plan", "refuse_unless_correct", "LAYOUT_DIALECT"]

#: Every ``Problem.kind`` a plan check reports, and what it means.
PROBLEM_KINDS: dict[str, str] = {
    "structure": "the executor refuses the plan or cannot run it as written: a missing or "
                 "unknown table entry, operands of the wrong kind, ids out of order",
    "limit": "a value beyond the executor's fixed sizes (64 operations, 16 channels per "
             "threadblock, 8 per operation, 1024 threads, 32-bit offsets) or message range",
    "connection": "channels that cannot connect: a memory channel across nodes, a port "
                  "transfer on a channel to another peer, a switch group without its twins",
    "bounds": "an access outside the buffer the executor allocates",
    "signal": "signals nobody waits for (they would release the next call's waits)",
    "semaphore": "a semaphore that does not end at its initial value",
    "deadlock": "threadblocks that wait forever (a wait without a signal, a semaphore, a "
                "barrier, packets never written)",
    "race": "two accesses to one byte range, one a write, with nothing ordering them",
    "uninitialised": "a read of memory nothing wrote",
    "format": "LL packets read as plain data",
    "completion": "a write into a rank's buffers that the rank does not know is done when "
                  "its kernel ends",
    "async-read": "a port transfer that may still read a rank's buffer after its kernel ends",
    "send-buffer-write": "an out-of-place plan writes the caller's input buffer",
    "postcondition": "the output is not what the collective requires (or was not checked)",
}
#: Problems that leave the result right but break the API contract; warnings unless strict.
WARNING_KINDS = frozenset({"send-buffer-write", "async-read"})
#: Cell accesses above which a plan is not executed (a symbolic run costs about 1 us each).
MAX_CHECKED_CELLS = 5_000_000
#: Operations (pipeline iterations unrolled) above which a plan is not executed.
MAX_CHECKED_STEPS = 1_000_000
#: The XML runtime whose buffer conventions (sizes, in-place aliasing) MSCCL++ shares; only
#: :func:`collsynth.export.layout.collective_layout` reads it.
LAYOUT_DIALECT = "msccl-executor"

_BUILDERS = {"allgather": allgather, "allreduce": allreduce, "reducescatter": reduce_scatter,
             "alltoall": alltoall}


@dataclass(frozen=True)
class PlanReport(CheckReport):
    """A :class:`~collsynth.export.check.CheckReport` with the sizes the plan was run at."""

    chunk_bytes: int | None = None
    cell_bytes: int | None = None


def plan_collective(plan: Plan) -> tuple[Collective | None, list[Problem]]:
    """The collsynth collective ``plan`` implements (split into its chunks), or ``None`` for
    ``sendrecv`` and unknown collectives; and the problems of its chunk counts."""
    n = plan.num_ranks
    name = plan.collective
    problems: list[Problem] = []
    builder = _BUILDERS.get(name)
    if builder is None:
        return None, problems
    ins = {g.input_chunks for g in plan.gpus}
    outs = {g.output_chunks for g in plan.gpus}
    if len(ins) > 1 or len(outs) > 1:
        problems.append(Problem("structure", f"ranks declare different chunk counts (input "
                                             f"{sorted(ins)}, output {sorted(outs)})"))
        return None, problems
    i, o = ins.pop(), outs.pop()
    want = {"allgather": (i, n * i), "allreduce": (i, i), "reducescatter": (n * o, o),
            "alltoall": (i, i)}[name]
    if (i, o) != want or (name == "alltoall" and i % n) or min(i, o) == 0:
        problems.append(Problem("structure", f"{name} on {n} ranks with input_chunks={i} and "
                                             f"output_chunks={o}: its buffers need input:output "
                                             f"= {want[0] // max(min(want), 1)}:"
                                             f"{want[1] // max(min(want), 1)} chunks (the executor "
                                             "sizes a chunk from each and refuses 'Size per "
                                             "chunks inconsistent')"))
        return None, problems
    split = {"allgather": i, "allreduce": i, "reducescatter": o, "alltoall": i // n}[name]
    return builder(n).split(split), problems


def _aliasing(plan: Plan, layout: Layout | None, geo: Geometry
              ) -> Callable[[int, str], tuple[str, int]]:
    """(physical buffer, byte shift) of a logical buffer; in place the input and the output
    overlap as the collective's in-place call lays them out."""
    if not plan.inplace:
        return lambda rank, buffer: (buffer, 0)
    cs = geo.chunk_bytes
    if layout is None:   # same-size buffers: one memory
        return lambda rank, buffer: ("i", 0) if buffer in ("i", "o") else (buffer, 0)

    def alias(rank: int, buffer: str) -> tuple[str, int]:
        if buffer == "s":
            return "s", 0
        name, index = layout.in_place_slot(rank, (buffer, 0))
        return name, index * cs

    return alias


def _cell_bytes(steps: dict[int, list[list[Step]]], geo: Geometry) -> tuple[int, int]:
    """The largest cell every access is whole cells of, and the cell accesses a run makes."""
    size, work = geo.chunk_bytes, 0
    accesses = []
    for per_tb in steps.values():
        for tb_steps in per_tb:
            for step in tb_steps:
                transfers = list(step.transfers) + [p.transfer for p in step.posts if p.transfer]
                for t in transfers:
                    accesses.extend(t.srcs)
                    accesses.extend(t.dsts)
                accesses.extend(step.needs)
    for acc in accesses:
        size = gcd(gcd(size, acc.offset), acc.length)
    size = size or geo.chunk_bytes
    for acc in accesses:
        work += acc.length * (2 if acc.packet else 1) // size
    return size, work


def _describe(value) -> str:
    if value is None or value is GARBAGE:
        return "garbage"
    if len(value) > 3:
        return f"{len(value)} contributions"
    return "+".join(f"x({q},{j})" for q, j in value)


def _mismatch(where: str, value, expected: tuple) -> str:
    if value is None or value is GARBAGE:
        return f"{where} holds garbage (never written, or written from garbage); expected " \
               f"{_describe(expected)}"
    have, want = Counter(value), Counter(expected)
    parts = [f"contribution x({c[0]},{c[1]}) counted {n} times at {where}"
             for c, n in sorted(have.items()) if n > 1 and want[c] <= 1]
    missing = sorted((want - have).elements())
    extra = sorted((have - want).elements())
    if missing:
        parts.append(f"{where} lacks {_describe(tuple(missing))}")
    if extra and not parts:
        parts.append(f"{where} holds {_describe(value)}, expected {_describe(expected)}")
    return "; ".join(parts) or f"{where} holds {_describe(value)}, expected {_describe(expected)}"


def _postcondition(machine: Machine, collective: Collective, layout: Layout,
                   chunk_cells: int) -> list[Problem]:
    """Every output cell the collective defines holds its contributions."""
    found: list[Problem] = []
    bad = 0
    for d in range(collective.num_ranks):
        for c, (buf, k) in sorted(layout.targets[d].items()):
            holders = sorted(collective.precondition[c])
            if not collective.combining:
                holders = holders[:1]
            sources = [(q, layout.sources[q][c][1]) for q in holders]
            for u in range(chunk_cells):
                want = tuple(sorted((q, idx * chunk_cells + u) for q, idx in sources))
                got = machine.value(d, buf, k * chunk_cells + u)
                if got == want:
                    continue
                bad += 1
                if bad <= SHOWN_PER_KIND:
                    where = f"rank {d} {buf}[chunk {k}]" + (f" cell {u}" if chunk_cells > 1
                                                              else "")
                    writer = machine.writer_of(d, buf, k * chunk_cells + u)
                    by = f" (last written by {writer})" if writer else ""
                    found.append(Problem("postcondition", _mismatch(where, got, want) + by))
    if bad > SHOWN_PER_KIND:
        found.append(Problem("postcondition", f"... and {bad - SHOWN_PER_KIND} more wrong "
                                              "output cells"))
    return found


def _sendrecv(machine: Machine, plan: Plan, cells_of: Callable[[int, str], int]
              ) -> list[Problem]:
    """sendrecv: every rank's output is the whole input of one other rank, each input going
    to one rank."""
    found, sources = [], {}
    for d in range(plan.num_ranks):
        count = cells_of(d, "o")
        first = machine.value(d, "o", 0) if count else None
        q = first[0][0] if isinstance(first, tuple) and len(first) == 1 else None
        ok = q is not None and q != d and cells_of(q, "i") == count and all(
            machine.value(d, "o", k) == ((q, k),) for k in range(count))
        if not ok:
            found.append(Problem("postcondition", f"rank {d}'s output is not the input of "
                                                  "another rank"))
        else:
            sources.setdefault(q, []).append(d)
    for q, targets in sorted(sources.items()):
        if len(targets) > 1:
            found.append(Problem("postcondition", f"rank {q}'s input reaches ranks "
                                                  f"{targets}; a sendrecv sends it to one"))
    return found


def run_plan(plan: Plan, *, chunk_bytes: int | None = None, ranks_per_node: int | None = None,
             loaded: LoadedPlan | None = None) -> tuple[Machine | None, Geometry | None,
                                                        list[Problem], Layout | None,
                                                        Collective | None]:
    """Load and execute ``plan`` at ``chunk_bytes`` (default: :func:`default_chunk_bytes`).

    Returns the machine after the run (``None`` when the plan cannot be run), its geometry,
    every problem found, and the collective and layout of the postcondition (``None`` when
    collsynth has none).

    Raises
    ------
    InputTooLargeError
        A run that would make more than :data:`MAX_CHECKED_CELLS` cell accesses or run more
        than :data:`MAX_CHECKED_STEPS` operations.
    """
    loaded = loaded or load_plan(plan, ranks_per_node=ranks_per_node)
    problems = list(loaded.problems)
    collective, coll_problems = plan_collective(plan)
    problems += coll_problems
    layout = None
    if collective is not None:
        layout = collective_layout(collective, LAYOUT_DIALECT, inplace=False)
    if not loaded.executable or coll_problems:
        return None, None, problems, layout, collective
    cs = chunk_bytes if chunk_bytes is not None else default_chunk_bytes(plan)
    if cs is None:
        problems.append(Problem("limit", f"no message size in [{plan.min_message_size}, "
                                         f"{plan.max_message_size}] gives whole chunks of "
                                         f"{plan.buffer_alignment}-byte units"))
        return None, None, problems, layout, collective
    if cs < 1 or cs % plan.buffer_alignment:
        problems.append(Problem("limit", f"a chunk of {cs} bytes is not a multiple of "
                                         f"buffer_alignment={plan.buffer_alignment} (the executor "
                                         "refuses such sizes)"))
        return None, None, problems, layout, collective
    geo = geometry(plan, cs)
    count = count_steps(loaded, geo)
    if count > MAX_CHECKED_STEPS:
        raise InputTooLargeError(f"plan {plan.name!r} at {cs}-byte chunks runs {count} "
                                 f"operations (pipelines unrolled); the checker runs at most "
                                 f"{MAX_CHECKED_STEPS}")
    steps, step_problems = expand(loaded, geo)
    problems += step_problems
    cell, work = _cell_bytes(steps, geo)
    inputs = sum(g.input_chunks for g in plan.gpus) * cs // cell
    if work + inputs > MAX_CHECKED_CELLS:
        raise InputTooLargeError(f"plan {plan.name!r} at {cs}-byte chunks needs {work + inputs} "
                                 f"cell accesses of {cell} bytes; the checker makes at most "
                                 f"{MAX_CHECKED_CELLS}")
    cells = Cells(cell, _aliasing(plan, layout, geo),
                  lambda rank, buffer: geo.capacity(plan, rank, buffer))
    machine = Machine(loaded, steps, geo, cells, lambda rank, k: ((rank, k),))
    machine.run()
    problems += machine.problems
    if not plan.inplace:
        for (rank, buffer), written in sorted(machine.writer.items()):
            if buffer == "i" and written:
                where = next(iter(written.values()))[2]
                problems.append(Problem("send-buffer-write", f"{where} writes rank {rank}'s "
                                                             "input buffer: an out-of-place call "
                                                             "must leave it unchanged"))
    return machine, geo, problems, layout, collective


def check_plan(plan: Plan, *, collective: Collective | None = None,
               ranks_per_node: int | None = None, chunk_bytes: int | None = None,
               strict: bool = False) -> PlanReport:
    """Check ``plan``: static rules, a symbolic run of every rank, the postcondition.

    Parameters
    ----------
    plan:
        From :func:`~collsynth.export.mscclpp.reader.read_plan` or the exporter.
    collective:
        The collective the plan must implement (default: the one its ``collective`` names,
        split into its chunks); given by the exporter to check against the algorithm's.
    ranks_per_node:
        Ranks per node, when known: memory and switch channels must stay inside a node.
    chunk_bytes:
        The chunk size to run at (default: :func:`~collsynth.export.mscclpp.geometry.
        default_chunk_bytes`).
    strict:
        Count :data:`WARNING_KINDS` as problems.

    Returns
    -------
    PlanReport
        ``ok`` only when there is no problem, the postcondition included.

    Raises
    ------
    InputTooLargeError
        A plan too large to execute symbolically (:data:`MAX_CHECKED_CELLS`).
    """
    machine, geo, problems, layout, own = run_plan(plan, chunk_bytes=chunk_bytes,
                                                   ranks_per_node=ranks_per_node)
    wanted = own
    if collective is not None:
        if own is not None and (collective.num_ranks, collective.num_chunks,
                                collective.combining) != (own.num_ranks, own.num_chunks,
                                                          own.combining):
            problems.append(Problem("postcondition", f"the plan is a {plan.collective} of "
                                                     f"{own.describe()}, not the "
                                                     f"{collective.describe()} asked for"))
            wanted = None
        elif own is None:
            wanted = collective
            layout = collective_layout(collective, LAYOUT_DIALECT, inplace=False)
        else:
            wanted = collective
    cell = None
    if machine is not None:
        cell = machine.A
        chunk_cells = geo.chunk_bytes // cell
        if wanted is not None and layout is not None:
            problems += _postcondition(machine, wanted, layout, chunk_cells)
        elif plan.collective == "sendrecv":
            problems += _sendrecv(machine, plan, lambda r, b: geo.capacity(plan, r, b) // cell)
        else:
            problems.append(Problem("postcondition", f"postcondition not checked: collsynth "
                                                     f"knows none for {plan.collective!r}"))
    warnings = [] if strict else [p for p in problems if p.kind in WARNING_KINDS]
    problems = [p for p in problems if p not in warnings]
    name = plan.collective if (wanted is not None or plan.collective == "sendrecv") else None
    return PlanReport(ok=not problems and machine is not None, problems=tuple(problems),
                      layouts_checked=("in-place",) if plan.inplace else ("out-of-place",),
                      runtime=MSCCLPP.name, collective=name, root=None,
                      warnings=tuple(warnings), chunk_bytes=geo.chunk_bytes if geo else None,
                      cell_bytes=cell)


def refuse_unless_correct(report: PlanReport, what: str, *,
                          error: type[CollsynthError] = ExportError) -> None:
    """Raise ``error`` naming the first problems when ``report`` is not ok."""
    if report.ok:
        return
    shown = "; ".join(f"{p.kind}: {p.message}" for p in report.problems[:3])
    more = f" (and {len(report.problems) - 3} more)" if len(report.problems) > 3 else ""
    raise error(f"{what} fails the MSCCL++ plan check: {shown or 'it could not be run'}{more}")
