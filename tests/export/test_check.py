"""Tests of the MSCCL XML checker: every XML of data/msccl-xml, and corruptions of them.

Every file under ``data/msccl-xml/{generated,rccl,msccl-scheduler}`` is checked for the
runtime it targets (generated/ -> msccl, rccl/ -> rccl, msccl-scheduler/ -> msccl-executor). :data:`EXPECTED` holds the exceptions: custom
collectives need their collective and root, and a few files break a rule the spec states
explicitly (each row says which section). Corruptions are small text edits of those files,
each rejected with its kind and a precise fragment of the message.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from collsynth import cli
from collsynth.cli.check import infer_runtime, run_check
from collsynth.export.check import PROBLEM_KINDS, CheckReport, Problem, check_program, layouts
from collsynth.export.program import GpuProgram, Program, ThreadBlock, XmlStep
from collsynth.export.xml_reader import read_checked, read_program

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT / "data" / "msccl-xml"
FOLDER_RUNTIME = {"generated": "msccl", "rccl": "rccl", "msccl-scheduler": "msccl-executor"}
SEND_BUFFER = ("send-buffer-write",)

#: file -> (runtime, check_program keywords, the only problem kinds expected).
#: Files not listed: their folder's runtime, no keywords, no problem at all.
EXPECTED: dict[str, tuple[str, dict, tuple[str, ...]]] = {
    # msccl-tools' MSCCLang custom-collective example (CollEx): rank 0 sends its chunk to the
    # output of ranks 1 and 2 -- a broadcast from 0 that leaves the root's output alone.
    "generated/custom_collective_ex1.xml": ("msccl", {"collective": "broadcast", "root": 0}, ()),
    "generated/custom_collective_ex2.xml": ("msccl", {"collective": "broadcast", "root": 0}, ()),
    # msccl ncclize of "Broadcast(n=8,root=0)" (its name says so).
    "generated/synth_dgx1_bcast.xml": ("msccl", {"collective": "broadcast", "root": 0}, ()),
    # Out-of-place reduce-scatters that reduce in the input buffer: the spec (8.2, 14) says
    # exactly these generators write the send buffer of out-of-place calls. Correct otherwise.
    "generated/prog_reduce_scatter_ring_4g_oop.xml": ("msccl", {}, SEND_BUFFER),
    "generated/prog_reduce_scatter_ring_8g_oop_i2.xml": ("msccl", {}, SEND_BUFFER),
    "generated/synth_ring4_rs_s3.xml": ("msccl", {}, SEND_BUFFER),
    # RCCL's shipped ring allreduces use rcs/rrs/rrcs, which this RCCL refuses to launch (spec
    # 7.2, 13.2); they are correct for msccl-executor (see test_rccl_rings_on_msccl_executor).
    "rccl/all-reduce-ring-ll.xml": ("rccl", {}, ("unsupported-op",)),
    "rccl/all-reduce-ring-ll128.xml": ("rccl", {}, ("unsupported-op",)),
    "rccl/all-reduce-ring-simple.xml": ("rccl", {}, ("unsupported-op",)),
}


def _shared_files() -> list[str]:
    if not SHARED.is_dir():
        return []
    return sorted(f"{folder}/{p.name}" for folder in FOLDER_RUNTIME
                  for p in (SHARED / folder).glob("*.xml"))


def _need_shared() -> None:
    if not SHARED.is_dir():
        pytest.fail(f"{SHARED} is missing: the XML corpus ships with the repository (data/)")


def _text(relative: str) -> str:
    _need_shared()
    return (SHARED / relative).read_text()


def problems(text: str, runtime: str, **keywords) -> list[Problem]:
    """Everything wrong with ``text`` for ``runtime``: reader problems, then the checker's."""
    program, found = read_checked(text, runtime)
    if program is not None:
        report = check_program(program, runtime=runtime, **keywords)
        found += report.problems + report.warnings
        assert all(w.kind in SEND_BUFFER for w in report.warnings)
    for p in found:
        assert p.kind in PROBLEM_KINDS, p
    return found


def corrupted(name: str) -> str:
    """The text of corruption ``name`` of :data:`CORRUPTIONS`."""
    relative, _, old, new, _, _ = CORRUPTIONS[name]
    return corrupt(relative, old, new)


def corrupt(relative: str, old: str, new: str) -> str:
    text = _text(relative)
    assert old in text, f"{old!r} not in {relative}"
    return text.replace(old, new, 1)


# -- every shared file -----------------------------------------------------------------------------


@pytest.mark.parametrize("relative", _shared_files())
def test_shared_xml_is_accepted(relative: str) -> None:
    runtime, keywords, allowed = EXPECTED.get(
        relative, (FOLDER_RUNTIME[relative.split("/")[0]], {}, ()))
    found = problems(_text(relative), runtime, **keywords)
    unexpected = [str(p) for p in found if p.kind not in allowed]
    assert not unexpected, "\n".join(unexpected[:10])
    if allowed:   # the documented exception really shows
        assert {p.kind for p in found} == set(allowed)


def test_every_shared_file_was_found() -> None:
    _need_shared()
    files = _shared_files()
    assert len([f for f in files if f.startswith("generated/")]) >= 40
    assert len([f for f in files if f.startswith("rccl/")]) >= 15
    assert len([f for f in files if f.startswith("msccl-scheduler/")]) == 12
    assert set(EXPECTED) <= set(files)


@pytest.mark.parametrize("relative", [f for f in EXPECTED if f.startswith("rccl/all-reduce-ring")])
def test_rccl_rings_on_msccl_executor(relative: str) -> None:
    """Same dialect as rccl (required outofplace/minBytes/maxBytes), with the full ops."""
    program = read_program(_text(relative), runtime="msccl-executor")
    report = check_program(program, runtime="msccl-executor")
    assert report.ok, report.problems[:5]
    assert report.layouts_checked == ("in-place", "out-of-place")
    assert report.collective == "allreduce"


def test_custom_without_collective_is_not_checked() -> None:
    found = problems(_text("generated/synth_dgx1_bcast.xml"), "msccl")
    assert [p.kind for p in found] == ["postcondition"]
    assert "postcondition not checked: pass --coll for custom collectives" in found[0].message


def test_root_is_inferred_when_unambiguous() -> None:
    program = read_program(_text("generated/prog_broadcast_chain_4g_root1.xml"))
    report = check_program(program, runtime="msccl")
    assert report.ok and report.root == 1 and report.collective == "broadcast"
    custom = read_program(_text("generated/synth_dgx1_bcast.xml"))
    assert check_program(custom, runtime="msccl", collective="broadcast").root == 0


def test_wrong_root_fails_the_postcondition() -> None:
    program = read_program(_text("generated/prog_broadcast_chain_4g_root1.xml"))
    report = check_program(program, runtime="msccl", root=2)
    assert not report.ok
    assert any(p.kind == "postcondition" and "expected x(2,0)" in p.message
               for p in report.problems)


def test_layouts_per_runtime() -> None:
    text = _text("rccl/allreduce-allpairs-8n-ll-32tb.xml")   # in-place only, uses i
    program = read_program(text)
    assert layouts(program, "rccl") == ("in-place",)
    assert layouts(program, "msccl") == ("in-place",)
    # Declared for out-of-place calls too: o is never written there.
    both = corrupt("rccl/allreduce-allpairs-8n-ll-32tb.xml", 'outofplace="0"', 'outofplace="1"')
    found = problems(both, "rccl")
    post = [p for p in found if p.kind == "postcondition"]
    assert post and all(p.message.endswith("[out-of-place layout]") for p in post)
    assert "rank 0 o[0] holds garbage" in post[0].message
    alltoall = read_program(_text("generated/alltoall_allpairs_4g_3i.xml"))
    assert layouts(alltoall, "msccl") == ("out-of-place",)


# -- corruptions -----------------------------------------------------------------------------------

RING4_AG = "generated/synth_ring4_ag_s3.xml"
RING4_AR = "generated/simple_allreduce_ring_4g.xml"
AG_OOP = "generated/prog_allgather_ring_4g_oop.xml"
AR_1STEP = "generated/allreduce_1step_4g.xml"
A2A_RCCL = "rccl/alltoall-8n-0-9kb.xml"
STEP_R01 = ('<step s="2" type="r" srcbuf="i" srcoff="0" dstbuf="o" dstoff="1" cnt="1" '
            'depid="-1" deps="-1" hasdep="0"/>')

#: name -> (file, runtime, old text, new text, kind, message fragment)
CORRUPTIONS = {
    "dropped receive": (
        RING4_AG, "msccl", f"      {STEP_R01}\n", "", "message",
        "1 message(s) from rank 1 to rank 0 on channel 0 are never received"),
    "swapped offset": (
        RING4_AG, "msccl", 'type="r" srcbuf="o" srcoff="2" dstbuf="o" dstoff="2"',
        'type="r" srcbuf="o" srcoff="2" dstbuf="o" dstoff="1"', "postcondition",
        "rank 0 o[2] holds garbage"),
    "wrong peer": (
        RING4_AR, "msccl", '<tb id="0" send="1" recv="3" chan="0">',
        '<tb id="0" send="2" recv="3" chan="0">', "connection",
        "rank 0 tb 0 sends to rank 2 on channel 0, but rank 2 has no tb receiving from rank 0"),
    "mismatched cnt": (
        RING4_AR, "msccl", 'type="s" srcbuf="i" srcoff="0" dstbuf="i" dstoff="0" cnt="1"',
        'type="s" srcbuf="i" srcoff="0" dstbuf="i" dstoff="0" cnt="2"', "message",
        "rank 1 tb 0 step 1 (line 16) receives cnt=1 but the matching send, rank 0 tb 0 step 0 "
        "(line 4), has cnt=2"),
    "removed dependency (race)": (
        AG_OOP, "msccl", 'dstoff="0" cnt="1" depid="0" deps="0"',
        'dstoff="0" cnt="1" depid="-1" deps="-1"', "race",
        "rank 0: tb 0 step 0 (line 4) writes o[0] and tb 2 step 0 (line 10) reads it, with no "
        "dependency or message ordering them"),
    "removed nop dependency (race)": (
        AR_1STEP, "msccl",
        'type="nop" srcbuf="i" srcoff="-1" dstbuf="o" dstoff="-1" cnt="0" depid="2" deps="1"',
        'type="nop" srcbuf="i" srcoff="-1" dstbuf="o" dstoff="-1" cnt="0" depid="-1" deps="-1"',
        "race", "rank 0: tb 2 step 1 (line 24) writes s[4] and tb 0 step 5 (line 9) reads it"),
    "dependency cycle": (
        AG_OOP, "msccl", 'dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="1"/>',
        'dstoff="0" cnt="1" depid="2" deps="0" hasdep="1"/>', "deadlock",
        "a cycle of waits: rank 0 tb 0 step 0 (line 4) waits for tb 2 to publish step 0"),
    "duplicated contribution": (
        RING4_AR, "msccl", '<step s="6" type="r" srcbuf="i" srcoff="2"',
        '<step s="6" type="rrc" srcbuf="i" srcoff="2"', "postcondition",
        "contribution x(0,2) counted twice at rank 0 o[2]"),
    "uninitialised read": (
        RING4_AG, "msccl", 'type="s" srcbuf="i" srcoff="0" dstbuf="o" dstoff="0"',
        'type="s" srcbuf="o" srcoff="2" dstbuf="o" dstoff="0"', "uninitialised",
        "rank 0 tb 1 step 0 reads o[2] (sent) before anything was written there"),
    "write into i out of place": (
        AG_OOP, "msccl", 'type="r" srcbuf="o" srcoff="1" dstbuf="o" dstoff="1"',
        'type="r" srcbuf="o" srcoff="1" dstbuf="i" dstoff="0"', "send-buffer-write",
        "rank 0 tb 1 step 0 writes i[0]: an out-of-place call must not change"),
    "rccl refuses rrc": (
        A2A_RCCL, "rccl", 'type="r" ', 'type="rrc" ', "unsupported-op",
        "rccl refuses to launch algorithms with rcs, rrs, rrc or rrcs steps"),
    "msccl refuses reducescatter": (
        "generated/prog_reduce_scatter_ring_4g_inplace.xml", "msccl", 'coll="reduce_scatter"',
        'coll="reducescatter"', "structure",
        "coll='reducescatter' is not a collective msccl knows"),
    "rccl refuses reduce_scatter": (
        "generated/prog_reduce_scatter_ring_4g_inplace.xml", "rccl", 'coll="reduce_scatter"',
        'coll="reduce_scatter" outofplace="0" minBytes="0" maxBytes="0"', "structure",
        "rccl spells it 'reducescatter'"),
    "nop chain without own dependency": (
        AR_1STEP, "msccl", 'dstoff="0" cnt="1" depid="1" deps="1" hasdep="0"',
        'dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="0"', "dependency",
        "rank 0 tb 0 step 4: nop steps before it carry dependencies, so it must have its own "
        "depid >= 0"),
    "dependency on a missing tb": (
        AG_OOP, "msccl", 'dstoff="0" cnt="1" depid="0" deps="0"',
        'dstoff="0" cnt="1" depid="7" deps="0"', "dependency",
        "rank 0 tb 2 step 0: depid=7 names no tb of rank 0"),
    "wait for a flag never published": (
        AG_OOP, "msccl", 'dstoff="0" cnt="1" depid="0" deps="0"',
        'dstoff="0" cnt="1" depid="1" deps="0"', "dependency",
        "waits for tb 1 step 0, but tb 1 publishes no flag at or after that step"),
    "operand out of bounds": (
        RING4_AG, "msccl", 'type="r" srcbuf="o" srcoff="2" dstbuf="o" dstoff="2" cnt="1"',
        'type="r" srcbuf="o" srcoff="2" dstbuf="o" dstoff="2" cnt="3"', "bounds",
        "rank 0 tb 1 step 1: dst o[2..5) is outside o[0..4)"),
    "chan >= nchannels": (
        "generated/custom_collective_ex1.xml", "msccl", 'nchannels="2"', 'nchannels="1"',
        "connection", "rank 0 tb 1: chan=1 but nchannels=1"),
    "cnt at the limit": (
        A2A_RCCL, "rccl", 'cnt="1"', 'cnt="72"', "limit", "cnt=72 is outside 0..71"),
    "XML declaration": (
        RING4_AR, "msccl", "<algo ", '<?xml version="1.0"?>\n<algo ', "lexical",
        "an XML declaration; the runtimes' reader fails on it ('expected >, got ?')"),
    "start tag over two lines": (
        RING4_AR, "msccl", '<tb id="0" send="1" recv="3" chan="0">',
        '<tb id="0" send="1"\n recv="3" chan="0">', "lexical",
        "the start tag of <tb> spans lines 3-4"),
    "TAB": (
        RING4_AR, "msccl", '\n    <tb id="0" send="1"', '\n\t<tb id="0" send="1"', "lexical",
        "a TAB character (at line 3)"),
    "17 attributes": (
        A2A_RCCL, "rccl", 'proto="LL"',
        'proto="LL" ' + " ".join(f'note{i}="{i}"' for i in range(8)), "lexical",
        "silently drops minBytes, maxBytes (required: minBytes, maxBytes)"),
    "octal number": (
        "generated/allreduce_a100_ring_8g_4ch_2i.xml", "msccl", 'srcoff="10"', 'srcoff="010"',
        "lexical", 'srcoff="010" has a leading 0: the runtimes\' reader (strtol base 0) reads it '
        "as octal 8"),
}


@pytest.mark.parametrize("name", sorted(CORRUPTIONS))
def test_corruption_is_rejected(name: str) -> None:
    relative, runtime, old, new, kind, fragment = CORRUPTIONS[name]
    keywords = EXPECTED.get(relative, (runtime, {}, ()))[1]
    found = problems(corrupted(name), runtime, **keywords)
    matching = [p for p in found if p.kind == kind and fragment in p.message]
    assert matching, f"no {kind} problem with {fragment!r} among:\n" + "\n".join(
        str(p) for p in found[:12])


def test_corruption_lines_point_at_the_step() -> None:
    found = problems(corrupted("mismatched cnt"), "msccl")
    assert any(p.kind == "message" and p.line == 16 for p in found)
    found = problems(corrupted("duplicated contribution"), "msccl")
    assert [p.line for p in found if p.kind == "postcondition"] == [10]


def test_cycle_through_messages_is_a_deadlock() -> None:
    """Rank 0 waits for rank 1's message before sending, and rank 1 likewise: no hang."""
    def gpu(r: int) -> GpuProgram:
        peer = 1 - r
        tb = ThreadBlock(0, peer, peer, 0, (XmlStep(0, "r", "i", 0, "o", peer, 1),
                                            XmlStep(1, "s", "i", 0, "o", r, 1)))
        local = ThreadBlock(1, -1, -1, 0, (XmlStep(0, "cpy", "i", 0, "o", r, 1),))
        return GpuProgram(r, 1, 2, 0, (tb, local))

    report = check_program(Program("ag", "Simple", 1, 2, 2, "allgather", 0, (gpu(0), gpu(1))),
                           runtime="msccl")
    deadlocks = [p for p in report.problems if p.kind == "deadlock"]
    assert deadlocks and "a cycle of waits: rank 0 tb 0 step 0 waits for a message from rank 1 " \
                         "on channel 0; rank 1 tb 0 step 0 waits for a message from rank 0" \
                         in deadlocks[0].message


def _staged_allgather(wait_for_the_send: bool) -> Program:
    """A 2-rank out-of-place allgather where rank 0 stages its chunk in o[1] before sending it:
    tb 0 copies i[0] to o[1] (step 0), sends o[1] to rank 1 (step 1) and copies i[0] to o[0]
    (step 2); tb 1 receives rank 1's chunk into o[1], after tb 0's step 0 -- or, with
    ``wait_for_the_send``, after its step 1. Rank 1 sends i[0] and receives into o[0]."""
    deps = 1 if wait_for_the_send else 0
    staged = ThreadBlock(0, 1, -1, 0, (
        XmlStep(0, "cpy", "i", 0, "o", 1, 1, hasdep=int(not wait_for_the_send)),
        XmlStep(1, "s", "o", 1, "o", 0, 1, hasdep=int(wait_for_the_send)),
        XmlStep(2, "cpy", "i", 0, "o", 0, 1)))
    receive = ThreadBlock(1, -1, 1, 0, (XmlStep(0, "r", "i", 0, "o", 1, 1, depid=0, deps=deps),))
    rank0 = GpuProgram(0, 1, 2, 0, (staged, receive))
    rank1 = GpuProgram(1, 1, 2, 0, (
        ThreadBlock(0, 0, -1, 0, (XmlStep(0, "s", "i", 0, "o", 1, 1),
                                  XmlStep(1, "cpy", "i", 0, "o", 1, 1))),
        ThreadBlock(1, -1, 0, 0, (XmlStep(0, "r", "i", 0, "o", 0, 1),))))
    return Program("staged", "Simple", 1, 2, 2, "allgather", 0, (rank0, rank1))


def test_a_write_after_an_unordered_read_is_a_race() -> None:
    """Write-after-read: tb 1 of rank 0 overwrites o[1] while nothing orders it after tb 0's
    send of o[1]. Run in the order the checker explores, the send reads first and every rank
    ends with the right chunks, so only the race check can tell: run the other way, rank 1
    would receive its own chunk back. Waiting for the send (step 1) instead of the copy
    (step 0) removes the race."""
    report = check_program(_staged_allgather(wait_for_the_send=False), runtime="msccl")
    assert [(p.kind, p.message) for p in report.problems] == [
        ("race", "rank 0: tb 0 step 1 reads o[1] and tb 1 step 0 writes it, with no dependency "
                 "or message ordering them")]
    fixed = check_program(_staged_allgather(wait_for_the_send=True), runtime="msccl")
    assert fixed.ok and not fixed.problems and not fixed.warnings


def _ring_allgather(n: int, *, nop_without_dependency: bool = False) -> Program:
    """An n-rank out-of-place ring allgather: cpy own chunk, then receive-copy-send n-1 times."""
    gpus = []
    for r in range(n):
        local = ThreadBlock(1, -1, -1, 0, (XmlStep(0, "cpy", "i", 0, "o", r, 1, hasdep=1),))
        steps = [XmlStep(0, "s", "o", r, "o", r, 1, depid=1, deps=0)]
        for k in range(1, n - 1):
            steps.append(XmlStep(k, "rcs", "o", 0, "o", (r - k) % n, 1))
        steps.append(XmlStep(n - 1, "r", "o", 0, "o", (r - n + 1) % n, 1))
        ring = ThreadBlock(0, (r + 1) % n, (r - 1) % n, 0, tuple(steps))
        gpus.append(GpuProgram(r, 1, n, 0, (ring, local)))
    return Program(f"ring{n}", "Simple", 1, n, n, "allgather", 0, tuple(gpus))


def test_64_rank_program_is_checked() -> None:
    """Its speed is measured by benchmarks/check_speed.py, not here."""
    program = _ring_allgather(64)
    report = check_program(program, runtime="msccl")
    assert report.ok, report.problems[:3]
    assert len(report.rank_stats) == 64 and report.rank_stats[0].sends == 63


def test_nop_without_dependency_shifts_the_published_step() -> None:
    """Spec 9.3: a dependency-less nop is not counted, so tb 1 publishes 0, not 1."""
    waits = ThreadBlock(0, -1, -1, 0, (XmlStep(0, "cpy", "o", 0, "o", 1, 1, depid=1, deps=1),))
    publishes = ThreadBlock(1, -1, -1, 0, (XmlStep(0, "nop", "i", -1, "o", -1, 0),
                                           XmlStep(1, "cpy", "i", 0, "o", 0, 1, hasdep=1)))
    gpu = GpuProgram(0, 1, 1, 0, (waits, publishes))
    report = check_program(Program("p", "Simple", 1, 1, 1, "allreduce", 0, (gpu,)),
                           runtime="msccl")
    assert any(p.kind == "deadlock" and "waits for tb 1 to publish step 1 (it has published 0)"
               in p.message for p in report.problems)


def test_fused_reductions_publish_their_last_position() -> None:
    """Spec 10: consecutive re steps into one chunk fuse; the chain publishes the position of
    its last step, so a wait for that position is released (no deadlock)."""
    waits = ThreadBlock(0, -1, -1, 0, (XmlStep(0, "cpy", "s", 0, "o", 0, 1, depid=1, deps=2),))
    fused = ThreadBlock(1, -1, -1, 0, (XmlStep(0, "cpy", "i", 0, "s", 0, 1),
                                       XmlStep(1, "re", "s", 1, "s", 0, 1),
                                       XmlStep(2, "re", "s", 2, "s", 0, 1, hasdep=1)))
    gpu = GpuProgram(0, 1, 1, 3, (waits, fused))
    report = check_program(Program("p", "Simple", 1, 1, 1, "allreduce", 0, (gpu,)),
                           runtime="msccl")
    assert report.rank_stats[0].transfers == 3 and report.rank_stats[0].steps == 4
    assert not any(p.kind == "deadlock" for p in report.problems)
    assert any(p.kind == "uninitialised" and "reads s[1] (reduced)" in p.message
               for p in report.problems)


def test_report_is_a_value() -> None:
    report = check_program(_ring_allgather(3), runtime="rccl")
    assert isinstance(report, CheckReport)
    assert not report.ok   # rccl needs outofplace/minBytes/maxBytes, refuses rcs
    kinds = {p.kind for p in report.problems}
    assert kinds == {"structure", "unsupported-op"}
    with pytest.raises(AttributeError):
        report.ok = True  # type: ignore[misc]


# -- the command line ------------------------------------------------------------------------------


def _cli(argv: list[str], capsys) -> tuple[int, str, str]:
    code = cli.main(["check", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_cli_correct_file(capsys) -> None:
    _need_shared()
    path = str(SHARED / "generated" / "simple_allreduce_ring_4g.xml")
    code, out, _ = _cli([path], capsys)
    assert code == 0
    assert out.startswith(f"{path}: correct allreduce for msccl (runtime msccl inferred")
    assert "layouts: in-place" in out
    code, out, _ = _cli([path, "--runtime", "msccl"], capsys)
    assert out == f"{path}: correct allreduce for msccl (layouts: in-place)\n"


def test_cli_rooted_and_custom(capsys) -> None:
    _need_shared()
    path = str(SHARED / "generated" / "synth_dgx1_bcast.xml")
    code, out, _ = _cli([path, "--coll", "broadcast", "--runtime", "msccl"], capsys)
    assert code == 0 and "correct broadcast (root 0) for msccl" in out
    code, out, _ = _cli([path], capsys)
    assert code == 1 and f"{path}:1: postcondition: postcondition not checked" in out


def test_cli_problems_one_per_line(tmp_path, capsys) -> None:
    bad = tmp_path / "bad.xml"
    bad.write_text(corrupted("mismatched cnt"))
    code, out, err = _cli([str(bad)], capsys)
    assert code == 1
    assert f"{bad}:16: message: rank 1 tb 0 step 1 (line 16) receives cnt=1" in out
    assert all(line.startswith(f"{bad}:") for line in out.splitlines())
    assert "for msccl (runtime msccl inferred" in err


def test_cli_json_and_rccl_inference(capsys) -> None:
    _need_shared()
    path = str(SHARED / "rccl" / "alltoall-8n-0-9kb.xml")
    code, out, _ = _cli([path, "--json"], capsys)
    data = json.loads(out)
    assert code == 0 and data["correct"] and data["runtime"] == "rccl"
    assert "inferred" in data["runtime_inferred"]
    assert data["layouts_checked"] == ["out-of-place"] and len(data["ranks"]) == 8


def test_cli_usage_and_missing_file(tmp_path, capsys) -> None:
    _need_shared()
    path = str(SHARED / "generated" / "prog_broadcast_chain_4g_root1.xml")
    code, _, err = _cli([path, "--root", "9"], capsys)
    assert code == 2 and "root 9 is not a rank" in err
    code, _, err = _cli([str(tmp_path / "nope.xml")], capsys)
    assert code == 1 and "no such file" in err
    code, _, err = _cli([path, "--runtime", "nccl"], capsys)
    assert code == 2 and "invalid choice" in err


def test_runtime_inference() -> None:
    # minBytes/maxBytes are msccl attributes too (a tuned msccl file has them); only rccl's
    # required outofplace and its own spellings say rccl.
    assert infer_runtime('<algo name="a" coll="allreduce" minBytes="0">')[0] == "msccl"
    assert infer_runtime('<algo name="a" coll="allreduce" outofplace="1">')[0] == "rccl"
    assert infer_runtime('<algo name="a" coll="reducescatter">')[0] == "rccl"
    assert infer_runtime('<algo name="a" coll="reduce_scatter">')[0] == "msccl"
    assert run_check is not None


def test_send_buffer_writes_are_warnings_unless_strict():
    """msccl-tools' out-of-place reduce-scatters write the caller's send buffer: the result is
    right, the API contract is not. Reported as a warning by default, a problem when strict."""
    program = read_program(_text("generated/synth_ring4_rs_s3.xml"))
    lenient = check_program(program, runtime="msccl")
    assert lenient.ok and {w.kind for w in lenient.warnings} == {"send-buffer-write"}
    strict = check_program(program, runtime="msccl", strict=True)
    assert not strict.ok and {p.kind for p in strict.problems} == {"send-buffer-write"}


def test_ngpus_from_the_file_does_not_drive_a_loop() -> None:
    """A file claiming 2**62 ranks (one <gpu> given) is refused in moments: the missing ranks
    are counted, not walked one by one (which never ended before), and a program of more ranks
    than a file can describe (1024 <gpu> children) is not executed at all."""
    import signal

    from collsynth.errors import InputTooLargeError

    big = 2 ** 62
    text = (f'<algo name="x" proto="Simple" nchannels="1" nchunksperloop="{big}" ngpus="{big}" '
            'coll="allgather" inplace="0"><gpu id="0" i_chunks="1" o_chunks="1" s_chunks="0">'
            '<tb id="0" send="1" recv="-1" chan="0"><step s="0" type="s" srcbuf="i" srcoff="0" '
            'dstbuf="o" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="0"/></tb></gpu></algo>')

    def expire(signum, frame):
        raise TimeoutError("check_program walked the claimed ranks")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, 20)
    try:
        report = check_program(read_checked(text, "msccl")[0], runtime="msccl")
        assert not report.ok and report.layouts_checked == ()
        assert any(p.kind == "limit" and f"ngpus={big}: more than the 1024 ranks" in p.message
                   for p in report.problems)
        # At the limit the size of the execution is what is refused.
        with pytest.raises(InputTooLargeError, match="chunks"):
            check_program(read_checked(text.replace(f'ngpus="{big}"', 'ngpus="1024"'),
                                       "msccl")[0], runtime="msccl")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def test_missing_ranks_are_named_then_counted() -> None:
    """Ranks without a <gpu>: the first few by number, the rest as a count (hand count: 12
    claimed, 2 given, so 10 missing: 8 named and '2 more')."""
    text = ('<algo name="x" proto="Simple" nchannels="1" nchunksperloop="12" ngpus="12" '
            'coll="allgather" inplace="0">'
            + "".join(f'<gpu id="{g}" i_chunks="1" o_chunks="12" s_chunks="0"></gpu>'
                      for g in (0, 5)) + '</algo>')
    report = check_program(read_checked(text, "msccl")[0], runtime="msccl")
    named = [p.message for p in report.problems if "has no <gpu> element" in p.message]
    assert [m.split()[1] for m in named] == ["1", "2", "3", "4", "6", "7", "8", "9"]
    assert any(p.message.startswith("2 more of the ngpus=12 ranks") for p in report.problems)


@pytest.mark.parametrize("steps, over", [(4077, False), (4078, True)])
def test_reader_node_limit_is_inclusive(steps: int, over: bool) -> None:
    """The reader keeps at most 4096 nodes for the loading rank (docs/msccl-xml.md §2.5): with
    2 <gpu>s and 16 tbs, 1 + 2 + 16 + 4077 = 4096 fits and one more step does not (hand count)."""
    per_tb = [255] * 15 + [steps - 255 * 15]
    tbs = "".join(
        f'<tb id="{t}" send="-1" recv="-1" chan="0">'
        + "".join(f'<step s="{s}" type="nop" srcbuf="i" srcoff="0" dstbuf="i" dstoff="0" cnt="0" '
                  'depid="-1" deps="-1" hasdep="0"/>' for s in range(count))
        + "</tb>" for t, count in enumerate(per_tb))
    text = ('<algo name="x" proto="Simple" nchannels="1" nchunksperloop="2" ngpus="2" '
            'coll="allgather" inplace="0">'
            f'<gpu id="0" i_chunks="1" o_chunks="2" s_chunks="0">{tbs}</gpu>'
            '<gpu id="1" i_chunks="1" o_chunks="2" s_chunks="0"></gpu></algo>')
    report = check_program(read_checked(text, "msccl")[0], runtime="msccl")
    assert any("the reader would store" in p.message for p in report.problems) == over
