"""A plan's report: markdown tables and plots (PNG, matplotlib's Agg canvas).

:func:`render_report` writes ``report.md``: the summary (predicted time of the traced calls under
NCCL and under the plan), the environment variables the runtime needs, one section per
(collective, group) with its candidates (and the yardstick that priced them), its size ranges and
its calls per size bucket (predicted time per call, NCCL vs plan, and the saving), the predicted
time per training step of each rank, and the calls that are not planned with the reason.
:func:`draw_plot` draws one entry's candidates against the size on log-log axes, the ranges that
run an XML shaded.
"""

from __future__ import annotations

import math
import re
import textwrap
from pathlib import Path
from typing import Any, Sequence

from collsynth.plan.buckets import bucket_label
from collsynth.plan.choose import NCCL
from collsynth.timing.closed_form import ClosedForm
from collsynth.timing.program_model import ProgramModel
from collsynth.plan.environment import EnvVar
from collsynth.plan.planner import Plan, PlanEntry

__all__ = ["render_report", "draw_plot", "plot_name", "format_us", "format_bytes"]

#: Most ranks listed one by one in the per-step table (the busiest rank is always listed).
_MAX_RANK_ROWS = 16


def format_us(value: float | None) -> str:
    """Microseconds for a table: ``n/a`` when not modelled.

    >>> format_us(1234.5678), format_us(0.01234), format_us(None)
    ('1234.6', '0.0123', 'n/a')
    """
    if value is None:
        return "n/a"
    if value == 0:
        return "0"
    if abs(value) >= 100:
        return f"{value:.1f}"
    return f"{value:.3g}"


def format_bytes(value: int | None) -> str:
    """Bytes for a table: exact, with a binary unit when it divides.

    >>> format_bytes(1048576), format_bytes(1000), format_bytes(None)
    ('1 MiB', '1000 B', 'unbounded')
    """
    if value is None:
        return "unbounded"
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if value >= scale and value % scale == 0:
            return f"{value // scale} {unit}"
    return f"{value} B"


def _percent(saving: float | None, base: float | None) -> str:
    if saving is None or not base:
        return "n/a"
    return f"{100 * saving / base:.1f}%"


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
    return lines


def _group_label(group: Sequence[int]) -> str:
    ordered = list(group)
    if len(ordered) > 2 and ordered == list(range(ordered[0], ordered[0] + len(ordered))):
        return f"ranks {ordered[0]}-{ordered[-1]}"
    return "ranks " + ",".join(map(str, ordered))


def plot_name(entry: PlanEntry) -> str:
    """The PNG file (under ``plots/``) that shows ``entry``: one per collective."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", entry.collective) + ".png"


def _title(entry: PlanEntry) -> str:
    root = "" if entry.root is None else f", root {entry.root}"
    return f"{entry.collective} on {_group_label(entry.group)}{root}"


def _deployments_section(deployments: Sequence[dict]) -> list[str]:
    """One subsection per runtime the plan also deploys for (plan.json's ``deployments``)."""
    out: list[str] = []
    for d in deployments:
        out += ["", f"## For {d['runtime']}: `{d['file']}`", "",
                f"- loaded by: {d['versions']}", f"- under PyTorch: {d['how']}"]
        out += [f"- {line}" for line in d["summary"]]
        out += ["", "```sh"] + [f"export {v['name']}={_shell(v['value'])}"
                                for v in d["environment"]] + ["```"]
    return out


def render_report(plan: Plan, *, environment: Sequence[EnvVar], environment_notes: Sequence[str],
                  plots: dict[str, str], deployments: Sequence[dict] = ()) -> str:
    """The markdown report of ``plan``; ``plots`` maps an entry's :func:`plot_name` to its PNG
    path relative to the report."""
    out: list[str] = ["# collsynth plan", ""]
    totals = plan.totals()
    nodes = f" x {plan.nodes} nodes" if plan.nodes and plan.nodes > 1 else ""
    out += [f"- trace: `{plan.trace_dir}` ({plan.world_size} ranks)",
            f"- topology: {plan.topology}{nodes}",
            f"- runtime: {plan.runtime}",
            "- timing: " + _timing_line(plan),
            f"- synthesis: at most {plan.synth_time_limit:g} s per problem",
            f"- XML files: {len(plan.xml_files)} (each passed `collsynth check` for "
            f"{plan.runtime})", ""]
    out += ["## Summary", "",
            "Predicted time of the traced calls of the planned collectives, each call counted "
            "once (on its group's lowest traced rank):", ""]
    out += _table(["calls", "NCCL (us)", "plan (us)", "saving (us)", "saving"],
                  [[str(totals["calls"]), format_us(totals["nccl_us"]),
                    format_us(totals["plan_us"]), format_us(totals["saving_us"]),
                    _percent(totals["saving_us"], totals["nccl_us"])]])
    busiest = max(plan.ranks, key=lambda r: r.nccl_us_per_step, default=None)
    if busiest is not None:
        out += ["", f"Per training step on rank {busiest.rank} (the busiest): NCCL "
                    f"{format_us(busiest.nccl_us_per_step)} us, plan "
                    f"{format_us(busiest.plan_us_per_step)} us, saving "
                    f"{format_us(busiest.saving_us_per_step)} us "
                    f"({_percent(busiest.saving_us_per_step, busiest.nccl_us_per_step)}); "
                    f"{busiest.structure.describe()}."]
    out += ["", "## Loading the plan", "",
            f"Set these for every rank's process ({plan.runtime}):", ""]
    if environment:
        out += ["```sh"] + [f"export {v.name}={_shell(v.value)}" for v in environment] + ["```",
                                                                                          ""]
        out += _table(["variable", "why", "source"],
                      [[f"`{v.name}`", v.why, v.source] for v in environment])
    if not plan.xml_files:
        out += ["", "The plan has no XML file: NCCL keeps every call, nothing needs to be set."]
    if environment_notes:
        out += [""] + [f"- {note}" for note in environment_notes]
    out += _deployments_section(deployments)
    out += ["", "## Collectives", ""]
    for entry in plan.entries:
        out += _entry_section(entry, plots.get(plot_name(entry)))
    out += ["## Per step", ""]
    out += _steps_section(plan)
    out += ["", "## Not planned", ""]
    if plan.not_planned:
        out += ["These calls stay on NCCL whatever the plan:", ""]
        out += _table(["kind", "group", "calls", "bytes", "reason"],
                      [[n.kind, _group_label(n.group), str(n.calls), str(n.bytes), n.reason]
                       for n in plan.not_planned])
    else:
        out += ["Every traced call is of a planned collective."]
    if plan.notes:
        out += ["", "## Notes", ""] + [f"- {note}" for note in plan.notes]
    return "\n".join(out) + "\n"


def _timing_line(plan: Plan) -> str:
    """Which yardsticks priced the plan's entries."""
    used = {e.yardstick for e in plan.entries if e.candidates}
    parts = []
    if ProgramModel.name in used:
        parts.append("program model (synthesized algorithms after tuned lowering and the "
                     "runtime's own algorithms, simulated with the same constants"
                     + (f" from `{plan.runtime_constants_file}`" if plan.runtime_constants_file
                        else ": the runtime's documented defaults") + ")")
    if ClosedForm.name in used or not parts:
        parts.append("closed-form alpha-beta model"
                     + (" where the program model does not apply" if parts else ""))
    line = "; ".join(parts)
    line += f"; calibrated by `{plan.calibration_file}`" if plan.calibration_file else ""
    line += f"; reductions charged for {plan.device}" if plan.device else ""
    return line + " (predictions, not measurements)"


def _shell(value: str) -> str:
    return value if re.fullmatch(r"[A-Za-z0-9_./:,=+-]*", value) else "'" + value.replace(
        "'", "'\\''") + "'"


def _entry_section(entry: PlanEntry, plot: str | None) -> list[str]:
    out = [f"### {_title(entry)}: {entry.status}", "",
           f"Topology: {entry.topology}. {entry.synthesis}. {entry.nccl_note}."]
    out += ["", f"Priced by: {entry.yardstick}"
            + (f" ({entry.yardstick_note})" if entry.yardstick_note else "") + "."]
    if entry.reason:
        out += ["", f"Reason: {entry.reason}."]
    lines = [c for c in entry.candidates if c.line is not None]
    sampled = [c for c in entry.candidates if c.line is None]
    if lines:
        out += ["", "Candidates (time = intercept + slope x size):", ""]
        out += _table(["candidate", "what", "priced by", "intercept (us)", "us per MB",
                       "left out"],
                      [[c.name, c.detail, c.yardstick, format_us(float(c.line.intercept_us)),
                        format_us(float(c.line.slope_us_per_byte) * 1e6),
                        entry.excluded.get(c.name, "")] for c in lines if c.line is not None])
    if sampled:
        out += ["", "Candidates priced by the program model (predicted us per call; a "
                    "synthesized program in its tuned layout at each size):", ""]
        out += _table(["candidate", "what", "left out"],
                      [[c.name, c.detail, entry.excluded.get(c.name, "")] for c in sampled])
        sizes = sorted({s.size_bytes for c in sampled for s in c.samples})
        rows = []
        for size in sizes:
            row = [format_bytes(size)]
            for c in sampled:
                hit = [s for s in c.samples if s.size_bytes == size]
                row.append("-" if not hit else f"{format_us(hit[0].time_us)} "
                           f"({hit[0].variant or hit[0].protocol})")
            rows.append(row)
        out += ["", *_table(["size"] + [c.name for c in sampled], rows)]
    out += ["", "Size ranges (bytes, inclusive):", ""]
    out += _table(["from", "to", "fastest", "runs", "layout", "XML file"],
                  [[str(r.min_bytes), "unbounded" if r.max_bytes is None else str(r.max_bytes),
                    r.winner, r.choice if not r.note else f"{r.choice} ({r.note})",
                    r.variant or "-", f"`xml/{r.xml}`" if r.xml else "-"]
                   for r in entry.ranges])
    out += ["", "Traced calls by size:", ""]
    rows = []
    for b in entry.buckets:
        per_nccl = None if b.nccl_us is None else b.nccl_us / b.calls
        per_plan = None if b.plan_us is None else b.plan_us / b.calls
        saving = None if b.saving_us is None else b.saving_us / b.calls
        runs = ", ".join(b.choices) + (f" ({b.fallback} fall back)" if b.fallback else "")
        measured = "n/a" if b.measured_us is None else format_us(b.measured_us / b.calls)
        rows.append([bucket_label(b.bucket), str(b.calls), str(b.bytes), format_us(per_nccl),
                     format_us(per_plan), format_us(saving), _percent(saving, per_nccl),
                     measured, runs])
    out += _table(["size bucket", "calls", "bytes", "NCCL us/call", "plan us/call",
                   "saving us/call", "saving", "measured us/call", "runs"], rows)
    if plot:
        out += ["", f"Plot: [{plot}]({plot})"]
    return out + [""]


def _steps_section(plan: Plan) -> list[str]:
    if not plan.ranks:
        return ["No rank file."]
    rows = list(plan.ranks)
    busiest = max(rows, key=lambda r: r.nccl_us_per_step)
    shown = rows[:_MAX_RANK_ROWS]
    if busiest not in shown:
        shown.append(busiest)
    out = ["Predicted communication time per step of each rank (modelled calls only; a step is "
           "one repetition of the rank's calls, see \"steps\"):", ""]
    out += _table(["rank", "steps", "calls/step", "NCCL us/step", "plan us/step",
                   "saving us/step", "saving", "measured us/step", "not modelled calls/step"],
                  [[str(r.rank), r.structure.describe(), f"{r.calls_per_step:g}",
                    format_us(r.nccl_us_per_step), format_us(r.plan_us_per_step),
                    format_us(r.saving_us_per_step),
                    _percent(r.saving_us_per_step, r.nccl_us_per_step),
                    format_us(r.measured_us_per_step), f"{r.unmodelled_per_step:g}"]
                   for r in shown])
    if len(rows) > len(shown):
        out += ["", f"({len(rows) - len(shown)} more ranks in plan.json)"]
    return out


#: Most panels in one collective's figure (the entries with the most traced bytes first).
MAX_PANELS = 6


def draw_plot(entries: Sequence[PlanEntry], path: str | Path) -> None:
    """Draw one collective's entries, a panel each (predicted us vs bytes, log-log): NCCL's best
    choice, every synthesized candidate, the ranges that run an XML shaded and the traced sizes
    dashed (both in the legend). Entries that share one plan (same candidates and ranges: groups
    the runtime cannot tell apart) share a panel. Writes a PNG to ``path`` with matplotlib's Agg canvas (no
    display, no change to the global backend)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    panels: list[tuple[PlanEntry, list[PlanEntry]]] = []
    for entry in sorted(entries, key=lambda e: -sum(b.bytes for b in e.buckets)):
        if not entry.candidates:
            continue
        for first, members in panels:
            if first.ranges == entry.ranges and first.candidates == entry.candidates:
                members.append(entry)
                break
        else:
            panels.append((entry, [entry]))
    panels = panels[:MAX_PANELS]
    figure = Figure(figsize=(7.5, 3.6 * max(1, len(panels))), layout="constrained")
    FigureCanvasAgg(figure)
    for index, (entry, members) in enumerate(panels):
        axes = figure.add_subplot(len(panels), 1, index + 1)
        _panel(axes, entry, members)
    figure.savefig(str(path), format="png", dpi=90)


def _panel(axes: Any, entry: PlanEntry, members: Sequence[PlanEntry]) -> None:
    from matplotlib.ticker import LogLocator, NullLocator

    sizes = [s for m in members for b in m.buckets for s in b.bucket]
    lo = max(1.0, min(sizes, default=1) / 16)
    hi = max(lo * 1e4, max(sizes, default=1 << 30) * 16)
    points = 120
    xs = [lo * (hi / lo) ** (i / (points - 1)) for i in range(points)]
    nccl = [c for c in entry.candidates if c.source == NCCL]
    if nccl:
        axes.plot(xs, [min(float(c.time_at(int(x))) for c in nccl) for x in xs], color="black",
                  linewidth=2, label="NCCL (best choice)" if len(nccl) > 1 else nccl[0].name)
    for c in entry.candidates:
        if c.source != NCCL:
            style = ":" if c.name in entry.excluded else "-"
            axes.plot(xs, [float(c.time_at(int(x))) for x in xs], linewidth=1.2,
                      linestyle=style, label=c.name + (" (not selectable)"
                                                       if c.name in entry.excluded else ""))
    shaded = False
    for r in entry.ranges:
        if r.xml is None:
            continue
        right = hi if r.max_bytes is None else min(hi, max(float(r.max_bytes), lo))
        axes.axvspan(max(lo, float(max(r.min_bytes, 1))), right, alpha=0.15, color="tab:green",
                     label=None if shaded else "sizes the plan's XML takes")
        shaded = True
    for index, bucket in enumerate(sorted({b.bucket for m in members for b in m.buckets})):
        axes.axvline(math.sqrt(max(bucket[0], 1) * bucket[1]), color="grey", linewidth=0.6,
                     linestyle="--", label=None if index else "traced sizes")
    axes.set_xscale("log")
    axes.set_yscale("log")
    for axis in (axes.xaxis, axes.yaxis):  # minor log ticks cost most of the drawing time
        axis.set_major_locator(LogLocator(base=10, numticks=8))
        axis.set_minor_locator(NullLocator())
    axes.set_xlabel("size (bytes, nccl-tests convention)", fontsize=9)
    axes.set_ylabel(f"predicted time (us, {entry.yardstick})", fontsize=9)
    groups = "; ".join(_group_label(m.group) for m in members[:3]) + (
        f" and {len(members) - 3} more" if len(members) > 3 else "")
    root = "" if entry.root is None else f", root {entry.root}"
    axes.set_title(textwrap.fill(f"{entry.collective} on {groups}{root}", 90), fontsize=10)
    axes.legend(fontsize=9, loc="upper left")
    axes.grid(True, which="major", linewidth=0.3)
