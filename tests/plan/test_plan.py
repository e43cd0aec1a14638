"""Plans made from fixture traces and in-memory traces: what they choose, what they write."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from collsynth.cli import main as collsynth_main
from collsynth.errors import ExportError, InvalidTopologyError
from collsynth.export.xml_reader import read_checked, read_text
from collsynth.plan import NCCL, load_calls, make_plan, plan_calls, write_plan
from collsynth.export.selection import count_fits as _selectable
from collsynth.plan.report import format_us
from collsynth.resolve import resolve_topology

TRACES = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "traces"


def _xml_ranges(directory: Path, runtime: str) -> list[tuple[str, int, int, int | None]]:
    """(coll, ngpus, minBytes, inclusive max or None) of every XML file, as the runtime reads
    them."""
    result = []
    for path in sorted((directory / "xml").iterdir()):
        program, problems = read_checked(read_text(path), runtime)
        assert program is not None and not problems, (path, problems)
        hi = program.max_bytes
        if runtime == "msccl":
            hi = None if hi is None else hi - 1          # exclusive there
        elif hi == 0:
            hi = None                                    # 0 is unlimited for rccl/executor
        result.append((program.coll, program.ngpus, program.min_bytes or 0, hi))
    return result


def _check_plan_invariants(plan, directory: Path) -> None:
    """What every written plan must satisfy."""
    # Each entry's ranges cover every size once.
    for entry in plan.entries:
        assert entry.ranges[0].min_bytes == 0 and entry.ranges[-1].max_bytes is None
        for before, after in zip(entry.ranges, entry.ranges[1:]):
            assert after.min_bytes == before.max_bytes + 1
    # The XML files of one collective and rank count never overlap (the runtime cannot tell
    # the groups apart), and each passes `collsynth check` for the plan's runtime.
    ranges = _xml_ranges(directory, plan.runtime)
    by_key: dict[tuple[str, int], list[tuple[int, int | None]]] = {}
    for coll, ngpus, lo, hi in ranges:
        by_key.setdefault((coll, ngpus), []).append((lo, hi))
    for spans in by_key.values():
        spans.sort()
        for (lo1, hi1), (lo2, _) in zip(spans, spans[1:]):
            assert hi1 is not None and hi1 < lo2
    for path in (directory / "xml").iterdir():
        assert collsynth_main(["check", "--runtime", plan.runtime, "--strict", str(path)]) == 0
    # plan.json names exactly the files written, and agrees with the report.
    obj = json.loads((directory / "plan.json").read_text())
    assert sorted(f["file"] for f in obj["files"]) == \
        sorted(f"xml/{p.name}" for p in (directory / "xml").iterdir())
    named = {r["file"] for e in obj["entries"] for r in e["ranges"] if r["file"]}
    assert named == {f["file"] for f in obj["files"]}
    report = (directory / "report.md").read_text()
    totals = obj["totals"]
    row = (f"| {totals['calls']} | {format_us(totals['nccl_us'])} | "
           f"{format_us(totals['plan_us'])} | {format_us(totals['saving_us'])} |")
    assert row in report
    for name in named:
        assert name in report
    for var in obj["environment"]:
        assert f"export {var['name']}=" in report
    for entry in obj["entries"]:
        for bucket in entry["buckets"]:
            assert bucket["plan_us"] is None or bucket["plan_us"] <= bucket["nccl_us"] + 1e-9


def test_fc4_plan_is_consistent(fc4_plan):
    plan, directory = fc4_plan
    _check_plan_invariants(plan, directory)
    assert plan.xml_files, "the fast topology should beat NCCL somewhere"
    assert sorted(p.name for p in (directory / "plots").iterdir()) == \
        sorted({f"{e.collective}.png" for e in plan.entries if e.candidates and e.buckets})
    assert (directory / "plots" / "allreduce.png").read_bytes()[:4] == b"\x89PNG"


def test_fc4_plan_picks_the_fastest_selectable_candidate(fc4_plan):
    plan, _ = fc4_plan
    entries = {(e.collective, e.group, e.root): e for e in plan.entries}
    checked = 0
    for call in load_calls(TRACES / "fc4-mixed").calls[0]:
        entry = entries.get((call.kind, call.group, call.root))
        if entry is None or entry.status != "planned":
            continue
        usable = [c for c in entry.candidates if c.source != NCCL
                  and c.name not in entry.excluded
                  and _selectable(call.size_bytes, call.element_size, entry.nchunks[c.name],
                                  runtime=plan.runtime, collective=call.kind, ranks=4)]
        nccl, planned, choice, _ = entry.predict(call.size_bytes, call.element_size)
        best = min(c.time_at(call.size_bytes) for c in usable)
        if best < nccl:  # the trace's calls all fall in ranges with XML files
            assert choice != NCCL and planned == best
        else:
            assert choice == NCCL and planned == nccl
        checked += 1
    assert checked


def test_fc4_cases_kept_on_nccl(fc4_plan):
    plan, _ = fc4_plan
    broadcasts = [e for e in plan.entries if e.collective == "broadcast"]
    assert len(broadcasts) == 2 and all(e.status == "nccl" for e in broadcasts)
    assert all("different roots" in e.reason for e in broadcasts)
    reasons = {(n.kind, n.group): n.reason for n in plan.not_planned}
    assert "avg" in reasons[("allreduce", (0, 1, 2, 3))]
    assert "uneven" in reasons[("alltoall", (0, 1, 2, 3))]
    assert "grouped send/recv" in reasons[("gather", (0, 1, 2, 3))]
    assert all(("allreduce", (r,)) in reasons for r in range(4))  # one-rank groups


def test_nccl_keeps_everything_when_it_is_faster(tmp_path, slow, options):
    """The closed form on 100 us per step: NCCL's base latency is cheaper than any step."""
    plan = make_plan(TRACES / "fc4-mixed", slow, options=options(model="closed-form"))
    assert not plan.xml_files
    compared = 0
    for entry in plan.entries:
        assert entry.status == "nccl"
        for bucket in entry.buckets:
            assert bucket.plan_us == bucket.nccl_us
            for c in entry.candidates:
                if c.source != NCCL and entry.nccl_us(bucket.bucket[0]) is not None:
                    assert c.line.at(bucket.bucket[0]) > entry.nccl_us(bucket.bucket[0])
                    compared += 1
    assert compared  # synthesized candidates existed and lost
    target = write_plan(plan, tmp_path / "plan", plots=False)
    assert not any((target / "xml").iterdir())
    assert "The plan has no XML file" in (target / "report.md").read_text()


def test_dgx1_plan(dgx1_plan):
    plan, directory = dgx1_plan
    _check_plan_invariants(plan, directory)
    tp = {e.group: e for e in plan.entries if e.collective == "allreduce" and len(e.group) == 4}
    assert set(tp) == {(0, 1, 2, 3), (4, 5, 6, 7)}
    # The two halves have the same links: one plan, one set of files.
    assert tp[(0, 1, 2, 3)].ranges == tp[(4, 5, 6, 7)].ranges
    assert tp[(0, 1, 2, 3)].status == tp[(4, 5, 6, 7)].status
    steps = {r.rank: r.structure for r in plan.ranks}
    assert all((s.setup, s.period, s.steps) == (2, 9, 3) for s in steps.values())
    not_planned = {n.kind for n in plan.not_planned}
    assert {"barrier", "broadcast_object_list", "isend", "irecv"} <= not_planned
    # alltoall: NCCL runs it as grouped send/recv, priced by the program model as its p2p
    # program, against which the synthesized alltoall is weighed on the same yardstick
    alltoall = next(e for e in plan.entries if e.collective == "alltoall")
    assert alltoall.yardstick == "program-model"
    assert [c.name for c in alltoall.candidates if c.source == NCCL] == ["nccl-p2p"]
    assert any(c.source != NCCL for c in alltoall.candidates)
    obj = json.loads((directory / "plan.json").read_text())
    assert obj["environment"][0]["name"] == "MSCCL_ALGO_DIR"
    assert obj["environment"][0]["value"] == str(directory / "xml")


def test_msccl_keeps_at_most_four_algorithms(tmp_path, fast, options, run_of, traced):
    group = (0, 1, 2, 3)
    calls = [traced(kind, size, g) for kind in ("allreduce", "allgather", "reduce_scatter")
             for g in (group, (0, 1), (1, 2, 3)) for size in (4096, 1 << 20)]
    plan = plan_calls(run_of(4, calls), fast, options=options(runtime="msccl"))
    executor = plan_calls(run_of(4, calls), fast, options=options())
    assert len(executor.xml_files) > 4  # the test needs more than msccl can load
    assert len(plan.xml_files) == 4
    dropped = [r for e in plan.entries for r in e.ranges if "MSCCL_MAX_NUM_ALGOS" in r.note]
    assert dropped and all(r.choice == NCCL and r.xml is None for r in dropped)
    target = write_plan(plan, tmp_path / "plan", plots=False)
    _check_plan_invariants(plan, target)
    files = json.loads((target / "plan.json").read_text())["environment"][0]["value"]
    assert len(files.split(":")) == 4


def test_calls_the_runtime_would_not_select_fall_back(fast, options, run_of, traced):
    group = (0, 1, 2, 3)
    odd = 4 * 4 * 4097  # 4097 elements per rank: not a multiple of the program's 4 chunks
    calls = [traced("allgather", 1 << 16, group), traced("allgather", 1 << 16, group),
             traced("allgather", odd, group)]
    plan = plan_calls(run_of(4, calls), fast, options=options())
    (entry,) = plan.entries
    r = next(r for r in entry.ranges if r.contains(odd))
    assert r.xml is not None and r.contains(1 << 16) and entry.nchunks[r.choice] == 4
    nccl, planned, choice, fallback = entry.predict(odd, 4)
    assert fallback and choice == NCCL and planned == nccl
    (bucket,) = entry.buckets
    assert bucket.fallback == 1 and bucket.calls == 3


def test_groups_with_other_links_share_the_xml(dgx1_plan, options, run_of, traced):
    dgx1 = resolve_topology("dgx1")
    a, b = (0, 1, 2, 3), (0, 1, 4, 5)
    assert dgx1.links[2][3] != dgx1.links[4][5] or dgx1.links[0][2] != dgx1.links[0][4]
    calls = [traced("allreduce", 1 << 14, a), traced("allreduce", 1 << 14, a),
             traced("allreduce", 1 << 14, b)]
    plan = plan_calls(run_of(8, calls), dgx1, options=options())
    entries = {e.group: e for e in plan.entries}
    assert entries[a].status == "planned"
    assert entries[b].status == "shared" and str(list(a)) in entries[b].reason
    assert all(r.xml is None for r in entries[b].ranges)
    assert all(b_.plan_us == b_.nccl_us for b_ in entries[b].buckets)


def test_trace_larger_than_topology(fast, options):
    with pytest.raises(InvalidTopologyError, match="8 ranks but topology"):
        make_plan(TRACES / "dgx1-dp", fast, options=options())


# -- writing ----------------------------------------------------------------------------------


def test_a_failed_check_writes_nothing(tmp_path, fc4_plan, monkeypatch):
    plan, _ = fc4_plan
    import collsynth.plan.writer as writer

    def refuse(path, **kwargs):
        raise ExportError(f"{path}: refused by the test")

    monkeypatch.setattr(writer, "check_xml_file", refuse)
    with pytest.raises(ExportError, match="refused by the test"):
        write_plan(plan, tmp_path / "plan", plots=False)
    assert list(tmp_path.iterdir()) == []  # no plan, no staging directory left behind


def test_replacing_plans(tmp_path, fc4_plan):
    plan, _ = fc4_plan
    target = tmp_path / "plan"
    write_plan(plan, target, plots=False)
    # A file the earlier plan listed in its manifest is its own: replaced, not merged.
    manifest = json.loads((target / "manifest.json").read_text())
    (target / "xml" / "stale.xml").write_text("<algo/>")
    manifest["files"].append("xml/stale.xml")
    (target / "manifest.json").write_text(json.dumps(manifest))
    write_plan(plan, target, plots=False)
    assert not (target / "xml" / "stale.xml").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["plan"]
    # A file no plan listed is never deleted: the plan is refused and the folder untouched.
    (target / "xml" / "mine.xml").write_text("<algo/>")
    before = sorted(p.relative_to(target) for p in target.rglob("*"))
    with pytest.raises(ExportError, match=r"holds xml/mine.xml, which the earlier plan"):
        write_plan(plan, target, plots=False)
    assert sorted(p.relative_to(target) for p in target.rglob("*")) == before
    other = tmp_path / "notes"
    other.mkdir()
    (other / "keep.txt").write_text("mine")
    with pytest.raises(ExportError, match="refusing to replace"):
        write_plan(plan, other, plots=False)
    assert (other / "keep.txt").read_text() == "mine"


def _snapshot(folder: Path) -> list:
    return sorted((str(p.relative_to(folder)), p.is_symlink() or p.is_dir() or p.read_bytes())
                  for p in folder.rglob("*"))


def test_a_foreign_plan_json_does_not_make_a_folder_ours(tmp_path, capsys):
    """Issue 19: a folder holding any plan.json was replaced whole, deleting the user's files."""
    target = tmp_path / "plan"
    target.mkdir()
    (target / "plan.json").write_text("{}")
    (target / "important.txt").write_text("keep")
    before = _snapshot(target)
    code = _run_plan_cli([str(TRACES / "fc4-mixed"), "--topology",
                          "fully-connected:4,unit_gbps=50,alpha_us=1", "-o", str(target),
                          "--no-cache", "-q"])
    err = capsys.readouterr().err
    assert code == 1 and len(err.strip().splitlines()) == 1
    assert "holds no plan manifest" in err and str(target) in err
    assert _snapshot(target) == before


def test_a_plan_replaces_only_what_its_manifest_lists(tmp_path, fc4_plan):
    plan, _ = fc4_plan
    target = tmp_path / "plan"
    write_plan(plan, target, plots=False)
    manifest = json.loads((target / "manifest.json").read_text())
    written = sorted(str(p.relative_to(target)) for p in target.rglob("*") if p.is_file())
    assert sorted(manifest["files"] + ["manifest.json"]) == written
    assert manifest["folders"] == ["plots", "xml"]
    # A link where a listed file was: refused, and the file it points to untouched.
    outside = tmp_path / "outside.md"
    outside.write_text("mine")
    (target / "report.md").unlink()
    (target / "report.md").symlink_to(outside)
    with pytest.raises(ExportError, match="holds report.md, which the earlier plan"):
        write_plan(plan, target, plots=False)
    assert outside.read_text() == "mine" and (target / "report.md").is_symlink()
    (target / "report.md").unlink()
    # A manifest naming a path outside the folder is not ours: refused, nothing removed.
    manifest["files"].append("../outside.md")
    (target / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ExportError, match="holds no plan manifest"):
        write_plan(plan, target, plots=False)
    assert outside.read_text() == "mine"
    # A plan written before manifests: its plan.json names what it wrote.
    (target / "manifest.json").unlink()
    write_plan(plan, target, plots=False)
    assert (target / "manifest.json").is_file() and outside.read_text() == "mine"
    assert [p.name for p in sorted(tmp_path.iterdir())] == ["outside.md", "plan"]


def test_files_that_appear_while_planning_are_never_deleted(tmp_path, fc4_plan, monkeypatch):
    import collsynth.plan.writer as writer

    plan, _ = fc4_plan
    target = tmp_path / "plan"
    write_plan(plan, target, plots=False)
    real_manifest, real_owned = writer._write_manifest, writer._owned

    def user_writes_meanwhile(staging):  # after the first check, before the swap
        real_manifest(staging)
        (target / "notes.txt").write_text("written while planning")

    monkeypatch.setattr(writer, "_write_manifest", user_writes_meanwhile)
    with pytest.raises(ExportError, match="holds notes.txt"):
        write_plan(plan, target, plots=False)
    assert (target / "notes.txt").read_text() == "written while planning"
    assert (target / "manifest.json").is_file()  # the earlier plan is back in place
    assert [p.name for p in tmp_path.iterdir()] == ["plan"]
    (target / "notes.txt").unlink()
    monkeypatch.setattr(writer, "_write_manifest", real_manifest)

    def arrives_after_the_second_check(folder):
        owned = real_owned(folder)
        if folder != target:  # the old plan, moved aside: a file lands just after its check
            (folder / "late.txt").write_text("late")
        return owned

    monkeypatch.setattr(writer, "_owned", arrives_after_the_second_check)
    write_plan(plan, target, plots=False)
    kept = [p for p in tmp_path.iterdir() if p.name != "plan"]
    assert len(kept) == 1 and [f.name for f in kept[0].iterdir()] == ["late.txt"]


# -- command line -----------------------------------------------------------------------------


def _run_plan_cli(argv):
    return collsynth_main(["plan", *argv])


def test_cli_writes_a_plan(tmp_path, capsys, front_cache):
    code = _run_plan_cli([str(TRACES / "fc4-mixed"), "--topology",
                          str(Path(__file__).parent / "data" / "fc4-fast.json"), "-o",
                          str(tmp_path / "plan"), "--cache", str(front_cache.directory),
                          "--synth-time-limit", "20", "--runtime", "rccl", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["plan_dir"] == str(tmp_path / "plan")
    assert out["files"] and all((tmp_path / "plan" / f["file"]).is_file() for f in out["files"])
    text = (tmp_path / "plan" / "report.md").read_text()
    assert "export MSCCL_ALGO_DIR=" in text and "RCCL_MSCCL_FORCE_ENABLE" in text


@pytest.mark.parametrize("argv, message", [
    (["{traces}/no-such-trace", "--topology", "dgx1"], "no such directory"),
    (["{traces}/dgx1-dp", "--topology", "no-such-machine"], "unknown topology"),
    (["{traces}/dgx1-dp", "--topology", "ring:4,unit_gbps=10,alpha_us=1"], "8 ranks but topology"),
    (["{traces}/dgx1-dp", "--topology", "dgx1", "--calibration", "{traces}/none.json"],
     "no such file"),
])
def test_cli_errors(tmp_path, capsys, argv, message):
    argv = [a.format(traces=TRACES) for a in argv]
    code = _run_plan_cli([*argv, "-o", str(tmp_path / "plan"), "--no-cache"])
    err = capsys.readouterr().err
    assert code == 1
    assert err.startswith("collsynth: error:") and message in err and "Traceback" not in err
    assert not (tmp_path / "plan").exists()


def test_report_sections(fc4_plan):
    _, directory = fc4_plan
    report = (directory / "report.md").read_text()
    for heading in ("## Summary", "## Loading the plan", "## Collectives", "## Per step",
                    "## Not planned"):
        assert heading in report
    obj = json.loads((directory / "plan.json").read_text())
    for entry in obj["entries"]:
        assert f"### {entry['collective']} on " in report
        if entry["plot"]:
            assert (directory / entry["plot"]).is_file()
    # Every per-call time in the report's bucket rows matches plan.json.
    for entry in obj["entries"]:
        for b in entry["buckets"]:
            if b["nccl_us"] is None:
                continue
            per_call = format_us(b["nccl_us"] / b["calls"])
            assert re.search(rf"\| {b['calls']} \| {b['bytes']} \| {re.escape(per_call)} \|",
                             report)


def test_a_calibration_sets_the_figures_and_the_nccl_baseline(fast, options, run_of, traced):
    from collsynth.timing.calibration import CurveCalibration, CalibrationEntry

    measured = CalibrationEntry("ar.txt", "allreduce", 4, "alpha-beta",
                                {"alpha_us": 30.0, "beta_us_per_byte": 5e-05,
                                 "busbw_gbps": 30.0}, gmae=0.1)
    calibration = CurveCalibration("fc4", (measured,))
    group = (0, 1, 2, 3)
    calls = [traced("allreduce", 1 << 16, group), traced("allgather", 1 << 16, group)]
    plan = plan_calls(run_of(4, calls), fast, options=options(
        calibration=calibration, calibration_file="cal.json", model="closed-form"))
    entries = {e.collective: e for e in plan.entries}
    (nccl,) = [c for c in entries["allreduce"].candidates if c.source == NCCL]
    assert nccl.name == "nccl-measured"
    assert float(nccl.line.at(1 << 16)) == pytest.approx(30.0 + 5e-05 * (1 << 16))
    # No measured allgather: NCCL's model, on the calibrated figures.
    assert {c.name for c in entries["allgather"].candidates if c.source == NCCL} == \
        {"nccl-ring/LL", "nccl-ring/LL128", "nccl-ring/Simple"}
    # 30 us over NCCL's 6 ring steps: 5 us per step instead of the file's 1 us.
    assert any("calibrated: 5 us per step" in note for note in plan.notes)
    (ag,) = [c for c in entries["allgather"].candidates if c.source != NCCL]
    assert ag.line.intercept_us == 5 * ag.algorithm.num_steps


def test_a_trace_with_missing_rank_files(tmp_path, fast, options):
    import shutil

    trace = tmp_path / "trace"
    shutil.copytree(TRACES / "fc4-mixed", trace)
    (trace / "rank-00000.jsonl").unlink()
    plan = make_plan(trace, fast, options=options())
    assert any("1 rank(s) have no trace file (0)" in note for note in plan.notes)
    full = make_plan(TRACES / "fc4-mixed", fast, options=options())
    # The 4-rank groups are counted once, now on rank 1: the same calls and predictions.
    assert [(e.collective, e.buckets) for e in plan.entries] == \
        [(e.collective, e.buckets) for e in full.entries]


def test_a_multi_node_trace_is_planned_with_the_tree_engine(tmp_path):
    """32 GPUs (4 x DGX A100), 64 MiB allgathers: the group is above max_group_ranks, so the
    tree engine plans it; its XML needs more than one channel for msccl-executor's 64 steps per
    threadblock, and the planner finds them. Every written XML passes the strict check."""
    import json

    from collsynth.plan import PlanOptions, make_plan, write_plan
    from collsynth.plan.choose import SynthOptions
    from collsynth.plan.writer import check_xml_file
    from collsynth.resolve import resolve_topology

    world, size = 32, 64 << 20
    trace = tmp_path / "trace"
    trace.mkdir()
    for rank in range(world):
        header = {"type": "header", "format": "collsynth-trace", "version": 1, "rank": rank,
                  "world_size": world, "backend": "nccl", "byte_convention": "nccl-tests",
                  "hostname": f"node{rank // 8}", "pid": 100 + rank, "torch_version": "2.13.0",
                  "started_unix": 1700000000.0, "record_durations": False,
                  "cross_node_only": False, "ranks_per_node": 8}
        calls = [{"type": "call", "seq": i, "kind": "allgather",
                  "function": "all_gather_into_tensor", "bytes": size, "dtype": "float32",
                  "op": None, "group": list(range(world)), "group_size": world, "root": None,
                  "peer": None, "async_op": False, "site": "train.py:1 step",
                  "duration_us": None, "cross_node": True, "batch": None, "error": None,
                  "raw": {"element_size": 4, "numel": {"tensor": size // 4 // world}}}
                 for i in range(2)]
        lines = [json.dumps(header)] + [json.dumps(c) for c in calls]
        (trace / f"rank-{rank:05d}.jsonl").write_text("\n".join(lines) + "\n")
    system = resolve_topology("dgx-a100", nodes=4)
    options = PlanOptions(runtime="msccl-executor", synth=SynthOptions(max_group_ranks=8))
    plan = make_plan(trace, system, options=options)
    out = write_plan(plan, tmp_path / "plan", plots=False)
    assert plan.xml_files, [e for e in json.loads((out / "plan.json").read_text())["entries"]]
    for xml_file in plan.xml_files:
        check_xml_file(out / "xml" / xml_file.name, runtime="msccl-executor",
                       collective=xml_file.collective, root=xml_file.root)
    assert plan.totals()["plan_us"] < plan.totals()["nccl_us"]


def test_cli_runtime_constants_and_model(tmp_path, capsys, front_cache):
    """``--calibration`` with a runtime-constants file prices with those constants (the plan
    names the file); ``--model closed-form`` prices every entry with the closed form."""
    from collsynth.runtimes import get_runtime
    from collsynth.timing.calibration import RuntimeCalibration, save_calibration

    constants_file = tmp_path / "rccl-constants.json"
    save_calibration(RuntimeCalibration(get_runtime("rccl").defaults.replace(
        source="test constants")), constants_file)
    common = [str(TRACES / "fc4-mixed"), "--topology",
              str(Path(__file__).parent / "data" / "fc4-fast.json"), "--cache",
              str(front_cache.directory), "--synth-time-limit", "20", "--runtime", "rccl"]
    assert _run_plan_cli([*common, "-o", str(tmp_path / "a"), "--calibration",
                          str(constants_file)]) == 0
    program = json.loads((tmp_path / "a" / "plan.json").read_text())
    assert str(constants_file) in json.dumps(program)
    assert "program-model" in {e["yardstick"] for e in program["entries"]}
    assert _run_plan_cli([*common, "-o", str(tmp_path / "b"), "--model", "closed-form"]) == 0
    closed = json.loads((tmp_path / "b" / "plan.json").read_text())
    assert {e["yardstick"] for e in closed["entries"]} == {"closed-form"}
    capsys.readouterr()
