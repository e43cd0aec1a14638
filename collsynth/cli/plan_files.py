"""``collsynth export --runtime mscclpp`` and ``collsynth check PLAN.json``: MSCCL++ plans.

The handlers the ``export`` and ``check`` commands hand MSCCL++ execution plans to: lower and
write (checked first, atomically), or read and check (``docs/mscclpp.md``).
"""

from __future__ import annotations

import argparse
import json

from collsynth._output import check_output_file, write_text_atomic
from collsynth.algorithm.fileformat import load_algorithm
from collsynth.cli.common import EXIT_ERROR, EXIT_OK, UsageError, err, out, problem_lines
from collsynth.errors import shown_path
from collsynth.export.mscclpp.checker import PlanReport, check_plan
from collsynth.export.mscclpp.limits import PLAN_PROTOCOLS
from collsynth.export.mscclpp.lower import lower_to_plan
from collsynth.export.mscclpp.reader import read_plan
from collsynth.export.mscclpp.writer import plan_to_json
from collsynth.runtimes import MSCCLPP_PLAN, runtime_names

__all__ = ["export_plan", "check_plan_file", "MSCCLPP_RUNTIME"]

#: The ``--runtime`` value of MSCCL++ execution plans.
MSCCLPP_RUNTIME = runtime_names(MSCCLPP_PLAN)[0]

# export options that mean something for MSCCL XML only.
_XML_ONLY = (("channels", "--channels"), ("channel_by", "--channel-by"),
             ("instances", "--instances"), ("tune", "--tune"), ("sizes", "--sizes"),
             ("runtime_constants", "--runtime-constants"), ("stages", "--stages"),
             ("json", "--json"))


def export_plan(args: argparse.Namespace) -> int:
    """``collsynth export ALGO --runtime mscclpp -o PLAN.json``."""
    given = [flag for attr, flag in _XML_ONLY if getattr(args, attr, None)]
    if given:
        raise UsageError.of("export", f"{', '.join(given)}: not an option of MSCCL++ plans")
    if args.proto is not None and args.proto not in PLAN_PROTOCOLS:
        raise UsageError.of("export", f"--proto {args.proto}: MSCCL++ plans use "
                                      f"{' or '.join(PLAN_PROTOCOLS)}")
    if args.inplace and args.outofplace:
        raise UsageError.of("export", "an MSCCL++ plan is for in-place or out-of-place calls, "
                                      "not both: export two plans")
    if args.min_bytes is not None and args.max_bytes is not None and \
            args.max_bytes < args.min_bytes:
        raise UsageError.of("export", f"--max-bytes {args.max_bytes} is below --min-bytes "
                                      f"{args.min_bytes}")
    path = check_output_file(args.output, label=f"-o {shown_path(args.output)}", inputs=[args.file])
    algorithm = load_algorithm(args.file)
    plan = lower_to_plan(algorithm, protocol=args.proto or "Simple", inplace=bool(args.inplace),
                         min_message_size=args.min_bytes or 0, max_message_size=args.max_bytes,
                         name=args.name)
    text = plan_to_json(plan)
    write_text_atomic(path, text)
    tbs = max(len(g.threadblocks) for g in plan.gpus)
    out(f"wrote {shown_path(path)} (mscclpp, {plan.protocol}, {plan.num_ranks} ranks, "
        f"{plan.collective}, "
        f"{'in place' if plan.inplace else 'out of place'}, up to {tbs} threadblock(s) per rank; "
        "checked)")
    return EXIT_OK


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def check_plan_file(args: argparse.Namespace) -> int:
    """``collsynth check PLAN.json [--runtime mscclpp]``: 0 when correct, 1 with problems."""
    if getattr(args, "coll", None) or getattr(args, "root", None) is not None:
        raise UsageError.of("check", "--coll and --root are for MSCCL XML; a plan names its "
                                     "collective")
    plan = read_plan(args.file)
    per_node = args.ranks_per_node
    if per_node is not None and plan.num_ranks % per_node:
        raise UsageError.of("check", f"--ranks-per-node {per_node}: {shown_path(args.file)} has "
                                     f"{plan.num_ranks} ranks; nodes of equal size divide it "
                                     f"({', '.join(map(str, _divisors(plan.num_ranks)))})")
    report = check_plan(plan, ranks_per_node=args.ranks_per_node, chunk_bytes=args.chunk_bytes,
                        strict=args.strict)
    if args.json:
        out(json.dumps(_as_json(args.file, report), indent=1))
        return EXIT_OK if report.ok else EXIT_ERROR
    for w in report.warnings:
        out(f"{shown_path(args.file)}: warning: {w.kind}: {w.message}")
    if report.ok:
        out(f"{shown_path(args.file)}: correct {report.collective} for mscclpp (layouts: "
            f"{', '.join(report.layouts_checked)}; run at {report.chunk_bytes}-byte chunks)")
        return EXIT_OK
    for line in problem_lines([f"{shown_path(args.file)}: {p.kind}: {p.message}"
                               for p in report.problems]):
        out(line)
    err(f"{shown_path(args.file)}"
        f": {len(report.problems)} problem{'s' if len(report.problems) != 1 else ''} "
        "for mscclpp")
    return EXIT_ERROR


def _as_json(path: str, report: PlanReport) -> dict:
    return {"file": path, "runtime": MSCCLPP_RUNTIME, "correct": report.ok,
            "collective": report.collective, "layouts_checked": list(report.layouts_checked),
            "chunk_bytes": report.chunk_bytes, "cell_bytes": report.cell_bytes,
            "problems": [{"kind": p.kind, "message": p.message} for p in report.problems],
            "warnings": [{"kind": p.kind, "message": p.message} for p in report.warnings]}
