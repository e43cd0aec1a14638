"""Hostile input, round 6: what the seventh session's hunt found, fixed in the eighth.

Each case failed on the code before its fix (an internal error, a minute of work, or a file
written with constants no machine has).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from collsynth import cli
from collsynth.errors import FileFormatError, InvalidInstanceError
from collsynth.export import check as check_module
from collsynth.export.xml_reader import read_program
from collsynth.timing.logs import load_log
from collsynth.timing.runtime_fit import fit_runtime, read_curve

ROOT = Path(__file__).resolve().parents[1]
RING = ROOT / "data" / "msccl-xml" / "generated" / "allgather_ring_8g_1ch_1i.xml"
NCV4 = ROOT / "data" / "msccl-xml" / "generated" / "allreduce_a100_ncv4.xml"
A100_ALLREDUCE = ROOT / "data" / "nccl-tests" / "A100-8gpu_all_reduce_superbench.txt"


def _first_step_waits(tmp_path, depid: str) -> Path:
    text = RING.read_text()
    path = tmp_path / f"dep_{depid or 'empty'}.xml"
    path.write_text(text.replace('depid="-1" deps="-1"', f'depid="{depid}" deps="-1"', 1))
    return path


@pytest.mark.parametrize("depid", ["0", "abc", ""])
def test_a_wait_with_deps_minus_one_is_a_problem_not_an_internal_error(tmp_path, capsys,
                                                                       depid):
    path = _first_step_waits(tmp_path, depid)
    assert cli.main(["check", str(path), "--runtime", "msccl"]) == 1
    captured = capsys.readouterr()
    assert "internal error" not in captured.err
    # The runtimes' flag test passes only after a publish of this iteration, as with deps=0:
    # tb 0's only published flag is none at all here, so the wait never ends.
    assert re.search(r"depid=0 with deps=-1: the runtimes wait for tb 0's first flag",
                     captured.out)
    assert "deadlock" in captured.out


def test_time_and_draw_on_that_program_give_an_error_line(tmp_path, capsys):
    path = _first_step_waits(tmp_path, "0")
    assert cli.main(["time", str(path), "--topology", "dgx1", "-q"]) == 1
    assert cli.main(["draw", str(path), "--topology", "dgx1", "-o",
                     str(tmp_path / "x.svg")]) == 1
    err = capsys.readouterr().err
    assert "internal error" not in err and "collsynth" in err
    assert not (tmp_path / "x.svg").exists()


def test_only_the_shown_postcondition_failures_are_described(monkeypatch):
    # An allreduce whose buffers hold 2 of 2000 chunks: 4 x 1998 wrong outputs per layout.
    program = read_program(NCV4.read_bytes().replace(b'nchunksperloop="2"',
                                                     b'nchunksperloop="2000"'), runtime="rccl")
    described = []
    real = check_module._mismatch
    monkeypatch.setattr(check_module, "_mismatch",
                        lambda *a: described.append(a) or real(*a))
    report = check_module.check_program(program, runtime="rccl")
    shown = [p for p in report.problems if p.kind == "postcondition"]
    assert shown[-1].message.startswith("... and ")
    assert int(shown[-1].message.split()[2]) > 1000
    assert len(described) <= check_module._SHOWN_PER_KIND * len(report.layouts_checked)


def test_a_measured_curve_gives_each_size_once(tmp_path):
    path = tmp_path / "curve.csv"
    path.write_text("size_bytes,time_us\n1024,10\n1048576,50\n# again\n1048576,5000\n")
    with pytest.raises(FileFormatError, match=r"line 5: size_bytes = 1048576 again \(first at "
                                              r"line 3\)"):
        read_curve(path)
    with pytest.raises(FileFormatError, match=r"line 5: size_bytes 1048576 \(out-of-place\) "
                                              r"again, first at line 3"):
        load_log(path, collective="allreduce", ranks=8)


def test_a_program_calibration_counts_distinct_sizes():
    from collsynth.resolve import resolve_topology
    topology = resolve_topology("dgx1")
    with pytest.raises(InvalidInstanceError, match="at least 2 distinct"):
        fit_runtime([(1024, 10.0), (1024, 11.0)], topology, "allgather")
    with pytest.raises(InvalidInstanceError, match="one time per size"):
        fit_runtime([(1024, 10.0), (1024, 11.0), (4096, 12.0)], topology, "allgather")


def test_nccl_tests_repeats_that_disagree_are_refused(tmp_path):
    lines = A100_ALLREDUCE.read_text().splitlines()
    at = next(i for i, line in enumerate(lines) if line.split()[:1] == ["1048576"])
    cells = lines[at].split()
    assert cells[4] == "74.78"  # out-of-place time, the column the repeat changes
    repeat = lines[at].replace("74.78", "224.3", 1)  # 3x the first run's time
    path = tmp_path / "twice.txt"
    path.write_text("\n".join(lines[:at + 1] + [repeat] + lines[at + 1:]) + "\n")
    with pytest.raises(FileFormatError, match=rf"lines {at + 1} and {at + 2}: 1048576 bytes "
                                              r"\(out-of-place\) took 74.78 and 224.3 us"):
        load_log(path)
    close = lines[at].replace("74.78", "80.02", 1)  # a second dtype or run: within 2x, kept
    path.write_text("\n".join(lines[:at + 1] + [close] + lines[at + 1:]) + "\n")
    assert len(load_log(path).rows) == len(load_log(A100_ALLREDUCE).rows) + 2


def test_a_curve_faster_than_the_machine_is_not_written(tmp_path, capsys):
    path = tmp_path / "falls.csv"
    path.write_text("size_bytes,time_us\n1024,100\n1048576,50\n16777216,30\n1073741824,20\n")
    out = tmp_path / "c.json"
    assert cli.main(["calibrate", str(path), "--topology", "dgx-a100", "--collective",
                     "allreduce", "--ranks", "8", "-o", str(out)]) == 1
    err = capsys.readouterr().err
    # A100: 12 NVLinks at NCCL's 20 GB/s = 240 GB/s; x2 for in-switch reduction, x1.25 for the
    # runtime's per-link figure being 80% of the link's 25 GB/s: 600 GB/s.
    assert "outside 0 to 600 GB/s" in err
    assert "1024 bytes: 100 us, 1048576 bytes: 50 us" in err
    assert not out.exists()


def test_a_curve_of_an_unknown_machine_is_bounded_by_2026_s_fastest(tmp_path, capsys):
    path = tmp_path / "falls.csv"
    path.write_text("size_bytes,time_us\n1024,100\n1048576,50\n16777216,30\n1073741824,20\n")
    assert cli.main(["calibrate", str(path), "--topology", "my-box", "--collective",
                     "allreduce", "--ranks", "8", "-o", str(tmp_path / "c.json")]) == 1
    assert "outside 0 to 1800 GB/s" in capsys.readouterr().err


def test_a_curve_that_misses_its_log_warns(tmp_path, capsys):
    path = tmp_path / "mixed.csv"
    path.write_text("size_bytes,time_us\n1024,10\n1048576,50\n1048577,5000\n1073741824,6000\n")
    assert cli.main(["calibrate", str(path), "--topology", "dgx-a100", "--collective",
                     "allreduce", "--ranks", "8", "-o", str(tmp_path / "c.json")]) == 0
    assert re.search(r"warning: .*mixed.csv: the piecewise fit misses the log by \d+%",
                     capsys.readouterr().out)


@pytest.mark.parametrize("log", sorted((ROOT / "data" / "nccl-tests").glob("*.txt")),
                         ids=lambda p: p.name)
def test_every_public_log_calibrates_without_warning(tmp_path, capsys, log):
    assert cli.main(["calibrate", str(log), "--topology", "dgx-h100", "-o",
                     str(tmp_path / "c.json")]) == 0
    assert "warning" not in capsys.readouterr().out


# -- topology imports -------------------------------------------------------------------------

TOPOS = ROOT / "data" / "machine-topologies"
DGX1_SMI = TOPOS / "nvidia_smi" / "dgx1_v100_msccl_tools.txt"
DGX1_XML = TOPOS / "nccl_xml" / "dgx1_v100_nvlink_p2p_ucb_blinkplus.xml"
MI210_ROCM = TOPOS / "rocm_smi" / "amd_4xMI210_showtopo_archer2.txt"


@pytest.mark.parametrize("digit", ["\u0663", "\uff12"])  # ARABIC-INDIC THREE, FULLWIDTH TWO
def test_other_scripts_digits_are_not_link_counts(tmp_path, digit):
    from collsynth.resolve import resolve_topology
    lines = DGX1_SMI.read_text().splitlines()
    lines[2] = lines[2].replace("NV1", f"NV{digit}", 1)
    path = tmp_path / "smi.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(FileFormatError, match=r"row GPU0, column GPU1: unknown cell"):
        resolve_topology(str(path))


@pytest.mark.parametrize("old, new, field", [
    ('sm="70"', 'sm="\u0667\u0660"', "sm"),
    ('count="1"', 'count="\u0661"', "count"),
])
def test_nccl_xml_numbers_are_ascii(tmp_path, old, new, field):
    from collsynth.resolve import resolve_topology
    path = tmp_path / "topo.xml"
    path.write_text(DGX1_XML.read_text().replace(old, new, 1), encoding="utf-8")
    with pytest.raises(FileFormatError, match=rf"{field}=.*expected a whole number"):
        resolve_topology(str(path))


def test_rocm_smi_weights_are_ascii(tmp_path):
    from collsynth.resolve import resolve_topology
    path = tmp_path / "rocm.txt"
    path.write_text(MI210_ROCM.read_text().replace("GPU0   0            15",
                                                   "GPU0   0            \u0661\u0665", 1))
    with pytest.raises(FileFormatError, match=r"column GPU1 is '\u0661\u0665', expected a whole"):
        resolve_topology(str(path))


def _xml_with_link_to_nothing(tmp_path) -> Path:
    path = tmp_path / "topo.xml"
    path.write_text(DGX1_XML.read_text().replace('nvlink target="0000:07:00.0"',
                                                 'nvlink target="gpu-seven"', 1))
    return path


def test_a_dropped_nvlink_is_said_on_the_command_line(tmp_path, capsys):
    path = _xml_with_link_to_nothing(tmp_path)
    assert cli.main(["bounds", str(path), "allgather"]) == 0
    err = capsys.readouterr().err
    assert re.search(r"collsynth: warning: .*topo.xml: rank 0 \(0000:06:00.0\): <nvlink "
                     r"target=gpu-seven count=1 .*ignored", err)
    assert "disagree on their link count" in err


@pytest.mark.filterwarnings("ignore:.*disagree on their link count")  # the file's other note
def test_a_dropped_nvlink_is_a_python_warning(tmp_path):
    from collsynth.errors import InputWarning
    from collsynth.resolve import resolve_topology
    with pytest.warns(InputWarning, match="target=gpu-seven"):
        resolve_topology(str(_xml_with_link_to_nothing(tmp_path)))


@pytest.mark.parametrize("source", [DGX1_XML, DGX1_SMI, MI210_ROCM, RING])
def test_utf16_files_get_the_iconv_hint(tmp_path, source):
    path = tmp_path / source.name
    path.write_bytes(source.read_text(encoding="utf-8").encode("utf-16"))
    command = (["check", str(path)] if source == RING else ["bounds", str(path), "allgather"])
    with pytest.raises(FileFormatError, match=r"UTF-16 text .*iconv -f UTF-16 -t UTF-8"):
        if source == RING:
            from collsynth.export.xml_reader import read_text
            read_text(path)
        else:
            from collsynth.resolve import resolve_topology
            resolve_topology(str(path))
    assert cli.main(command) == 1


def test_an_unknown_topology_file_names_no_python_function(tmp_path, capsys):
    path = tmp_path / "x.txt"
    path.write_text("hello\n")
    assert cli.main(["bounds", str(path), "allgather"]) == 1
    err = capsys.readouterr().err
    assert "load_topology" not in err and "collsynth topology file (.json" in err


# -- check and export options ---------------------------------------------------------------

PLAN = ROOT / "data" / "mscclpp-plans" / "mn_allgather_2x4.json"


@pytest.mark.parametrize("content, message", [
    (b"", "empty: expected JSON"),
    (b"\xef\xbb\xbf", "empty: expected JSON"),
    (b"[]", "expected a JSON object"),
    (b"null", "expected a JSON object"),
])
def test_a_json_file_is_read_as_json(tmp_path, capsys, content, message):
    path = tmp_path / "plan.json"
    path.write_bytes(content)
    assert cli.main(["check", str(path)]) == 1
    err = capsys.readouterr().err
    assert message in err and "XML" not in err


@pytest.mark.parametrize("per_node", ["3", "16", str(10 ** 20)])
def test_ranks_per_node_divides_the_plan(capsys, per_node):
    assert cli.main(["check", str(PLAN), "--ranks-per-node", per_node]) == 2
    assert "has 8 ranks; nodes of equal size divide it (1, 2, 4, 8)" in capsys.readouterr().err


def test_ranks_per_node_that_divides_is_checked(capsys):
    assert cli.main(["check", str(PLAN), "--ranks-per-node", "4"]) == 0


def test_an_xml_runtime_on_a_plan_is_a_usage_error(capsys):
    assert cli.main(["check", str(PLAN), "--runtime", "msccl"]) == 2
    assert "--runtime msccl checks MSCCL XML" in capsys.readouterr().err


@pytest.fixture(scope="module")
def allgather_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("alg") / "ag.json"
    assert cli.main(["solve", "least-steps", "dgx1", "allgather", "-o", str(path)]) == 0
    return path


def test_a_plan_protocol_mscclpp_lacks_names_proto(tmp_path, capsys, allgather_file):
    out = tmp_path / "p.json"
    assert cli.main(["export", str(allgather_file), "--runtime", "mscclpp", "--proto", "LL128",
                     "-o", str(out)]) == 2
    assert "--proto LL128: MSCCL++ plans use Simple or LL" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize("runtime", ["mscclpp", "msccl"])
def test_a_blank_name_is_refused_for_every_format(tmp_path, capsys, allgather_file, runtime):
    out = tmp_path / "p.out"
    assert cli.main(["export", str(allgather_file), "--runtime", runtime, "--name", " ",
                     "-o", str(out)]) == 2
    assert "--name: a blank name" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize("text, where", [
    ('{"a": "NaN",\n "b": [1, NaN]}', "line 2 column 11"),
    ('{"x\\"NaN": 1e999}', "line 1 column 12"),
    ("[\n\n -Infinity]", "line 3 column 2"),
])
def test_a_refused_json_number_names_its_line(text, where):
    from collsynth._parse import parse_json
    with pytest.raises(FileFormatError, match=rf"x.json: {where}: "):
        parse_json(text, "x.json")


def _slow_check(monkeypatch):
    from collsynth.cli import check as check_cli
    import time as time_module
    real = check_cli.check_program
    monkeypatch.setattr(check_cli, "PROGRESS_INTERVAL_S", 0.05)
    monkeypatch.setattr(check_cli, "check_program",
                        lambda *a, **k: time_module.sleep(0.3) or real(*a, **k))


def test_check_says_which_runtime_it_is_on_while_it_runs_long(monkeypatch, capsys):
    # A 3 KB allreduce with nchunksperloop=490000 checked for 2 minutes without a word.
    _slow_check(monkeypatch)
    assert cli.main(["check", str(RING), "--runtime", "rccl"]) in (0, 1)
    captured = capsys.readouterr()
    assert re.search(r"  check: checking .*allgather_ring_8g_1ch_1i.xml by rccl's rules, "
                     r"0 s so far", captured.err)
    assert "so far" not in captured.out


def test_check_quiet_prints_no_progress(monkeypatch, capsys):
    _slow_check(monkeypatch)
    cli.main(["check", str(RING), "--runtime", "rccl", "-q"])
    assert "so far" not in capsys.readouterr().err


# -- a blind spot a mutation found ----------------------------------------------------------


def _custom_broadcast(root_output_from_peer: bool):
    """A 2-rank msccl-tools custom broadcast from rank 0: rank 1 receives x(0,0). With
    ``root_output_from_peer``, rank 0 also writes its output, with rank 1's x(1,0)."""
    from collsynth.export.program import GpuProgram, Program, ThreadBlock, XmlStep
    root_tbs = [ThreadBlock(0, 1, -1, 0, (XmlStep(0, "s", "i", 0, "o", 0, 1),))]
    peer_tbs = [ThreadBlock(0, -1, 0, 0, (XmlStep(0, "r", "i", 0, "o", 0, 1),))]
    if root_output_from_peer:
        root_tbs.append(ThreadBlock(1, -1, 1, 1, (XmlStep(0, "r", "i", 0, "o", 0, 1),)))
        peer_tbs.append(ThreadBlock(1, 0, -1, 1, (XmlStep(0, "s", "i", 0, "o", 0, 1),)))
    gpus = (GpuProgram(0, 1, 1, 0, tuple(root_tbs)), GpuProgram(1, 1, 1, 0, tuple(peer_tbs)))
    return Program("bcast", "Simple", 2, 1, 2, "custom", 0, gpus, outofplace=1)


def test_a_custom_broadcast_may_leave_the_root_s_output_but_not_spoil_it():
    # msccl-tools' custom broadcasts leave the root's output alone: unwritten is fine.
    fine = check_module.check_program(_custom_broadcast(False), runtime="msccl",
                                      collective="broadcast", root=0)
    assert fine.ok, fine.problems
    # Written with another rank's data, it is wrong: x(1,0) where x(0,0) belongs.
    spoilt = check_module.check_program(_custom_broadcast(True), runtime="msccl",
                                        collective="broadcast", root=0)
    assert not spoilt.ok
    assert any(p.kind == "postcondition" and "rank 0 o[0] holds x(1,0), expected x(0,0)"
               in p.message for p in spoilt.problems), spoilt.problems


# -- round 7 of the hunt (this session) ------------------------------------------------------


@pytest.mark.parametrize("value", ["1e9", "1e300"])
def test_a_time_limit_above_a_week_is_a_usage_error(capsys, allgather_file, value):
    # --timeout 1e300 leaked torch's OverflowError; 1e9 never started the collective.
    assert cli.main(["run", str(allgather_file), "--timeout", value, "--iters", "0"]) == 2
    assert f"argument --timeout: '{value}' seconds: more than a week" in capsys.readouterr().err


@pytest.mark.parametrize("command", [
    ["solve", "least-steps", "@", "allgather", "-o", "@"],
    ["solve", "bandwidth-optimal", "@", "allgather", "-o", "@"],
    ["tune-runtime", "--topology", "@", "--runtime", "nccl", "-o", "@"],
])
def test_output_never_replaces_the_input_topology(tmp_path, capsys, command):
    path = tmp_path / "dgx1.json"
    original = (ROOT / "topologies" / "dgx1.json").read_text()
    path.write_text(original)
    assert cli.main([str(path) if part == "@" else part for part in command]) == 1
    assert f"is the input {path}" in capsys.readouterr().err
    assert path.read_text() == original


def test_tune_runtime_names_the_option_of_an_unknown_collective(tmp_path, capsys):
    out = tmp_path / "t.conf"
    assert cli.main(["tune-runtime", "--topology", "dgx1", "--runtime", "nccl",
                     "--collectives", "allreduce,alltoall", "-o", str(out)]) == 2
    assert "--collectives: collective 'alltoall'" in capsys.readouterr().err
    assert not out.exists()


@pytest.fixture(scope="module")
def curve_calibration(tmp_path_factory):
    path = tmp_path_factory.mktemp("cal") / "cal.json"
    assert cli.main(["calibrate", str(A100_ALLREDUCE), "--topology", "dgx-a100",
                     "-o", str(path)]) == 0
    return json.loads(path.read_text())


@pytest.mark.parametrize("edit, message", [
    (lambda c: c["entries"][0].update(collective="frobnicate"),
     "entries[0].collective: 'frobnicate'; expected one of allgather"),
    (lambda c: c["entries"][0].update(ranks=10 ** 9),
     "entries[0].ranks: 1000000000; expected a whole number from 2 to 1048576"),
    (lambda c: c.update(nodes=10 ** 9), "nodes: 1000000000; expected a whole number from 1"),
])
def test_a_calibration_entry_names_its_field(tmp_path, curve_calibration, edit, message):
    from collsynth.timing.calibration import load_calibration
    data = json.loads(json.dumps(curve_calibration))
    edit(data)
    path = tmp_path / "c.json"
    path.write_text(json.dumps(data))
    with pytest.raises(FileFormatError, match=re.escape(message)):
        load_calibration(path)


def test_a_calibration_of_another_machine_warns(tmp_path, capsys, curve_calibration):
    data = dict(curve_calibration, topology="mi300x")
    path = tmp_path / "c.json"
    path.write_text(json.dumps(data))
    algorithm = tmp_path / "ar.json"
    assert cli.main(["solve", "least-steps", "dgx-a100", "allreduce", "-o", str(algorithm)]) == 0
    capsys.readouterr()
    assert cli.main(["time", str(algorithm), "--calibration", str(path), "--sizes", "1GB",
                     "-q"]) == 0
    assert ("collsynth: warning: --calibration " in capsys.readouterr().err)
    path.write_text(json.dumps(curve_calibration))  # dgx-a100 for DGX-A100: no warning
    assert cli.main(["time", str(algorithm), "--calibration", str(path), "--sizes", "1GB",
                     "-q"]) == 0
    assert "warning" not in capsys.readouterr().err


def test_a_rounds_bound_of_thousands_of_orbits_is_refused(capsys):
    # line:3000 ran past two minutes and 950 MB with no word (1500 maximum flows).
    assert cli.main(["bounds", "line:3000", "allgather"]) == 1
    assert "needs a maximum flow over its 3000 ranks for each of 1500 rank orbits" in \
        capsys.readouterr().err


def _group_trace(tmp_path, per_rank):
    """A 4-rank trace of one call on the whole group, ``per_rank(r)`` its fields on rank r."""
    header = {"type": "header", "format": "collsynth-trace", "version": 1, "world_size": 4,
              "backend": "nccl", "byte_convention": "nccl-tests", "hostname": "n", "pid": 1,
              "torch_version": "2.13.0", "started_unix": 0.0, "record_durations": False,
              "cross_node_only": False, "ranks_per_node": None}
    call = {"type": "call", "seq": 0, "kind": "broadcast", "function": "broadcast",
            "bytes": 65536, "dtype": "float32", "op": None, "group": [0, 1, 2, 3],
            "group_size": 4, "root": 0, "peer": None, "async_op": False, "site": None,
            "duration_us": None, "cross_node": None, "batch": None, "error": None,
            "raw": {"element_size": 4}}
    folder = tmp_path / "trace"
    folder.mkdir()
    for r in range(4):
        (folder / f"rank-{r:05d}.jsonl").write_text(
            json.dumps(dict(header, rank=r)) + "\n" + json.dumps(dict(call, **per_rank(r))) + "\n")
    return folder


@pytest.mark.parametrize("per_rank, field, theirs, ours", [
    (lambda r: {"root": r}, "root", 0, 1),  # every rank the root of "the same" broadcast
    (lambda r: {"kind": "allreduce", "function": "all_reduce", "op": "sum", "root": None,
                "bytes": 65536 if r % 2 == 0 else 4096}, "bytes", 65536, 4096),
    (lambda r: {} if r != 2 else {"kind": "reduce", "function": "reduce", "op": "sum"},
     "kind", "'broadcast'", "'reduce'"),
])
def test_plan_refuses_ranks_that_disagree_on_one_call(tmp_path, capsys, per_rank, field,
                                                      theirs, ours):
    folder = _group_trace(tmp_path, per_rank)
    out = tmp_path / "plan"
    assert cli.main(["plan", str(folder), "--topology", "dgx1", "-o", str(out), "-q"]) == 1
    err = capsys.readouterr().err
    assert f"call seq 0 on group [0, 1, 2, 3]: field '{field}' is {ours}, but rank 0's " \
           f"matching call (seq 0, rank-00000.jsonl) has {theirs}" in err
    assert not out.exists()


def test_plan_reads_ranks_that_agree(tmp_path):
    from collsynth.plan.calls import load_calls
    run = load_calls(_group_trace(tmp_path, lambda r: {}))
    assert [run.calls[r][0].root for r in run.ranks] == [0, 0, 0, 0]


def test_plan_says_what_it_is_on_while_a_step_runs_long(monkeypatch, tmp_path, capsys):
    # 20000 traced sizes priced for minutes after the last "tuning ..." line without a word.
    import time as time_module

    import collsynth.plan as plan_package
    from collsynth.cli import plan as plan_cli
    real = plan_package.make_plan

    def slow(*args, progress=None, **kwargs):
        progress("tuning something slow")
        time_module.sleep(0.3)
        return real(*args, progress=progress, **kwargs)
    monkeypatch.setattr(plan_package, "make_plan", slow)
    monkeypatch.setattr(plan_cli, "PROGRESS_INTERVAL_S", 0.05)
    trace = ROOT / "tests" / "fixtures" / "traces" / "dgx1-dp"
    assert cli.main(["plan", str(trace), "--topology", "dgx1", "-o", str(tmp_path / "p"),
                     "--no-cache"]) == 0
    assert "  plan: tuning something slow, 0 s so far" in capsys.readouterr().err


@pytest.mark.parametrize("options, message", [
    (["--oversubscription", "2", "--nic-units", "4"],
     "--oversubscription, --nic-units: only with --nodes K"),
    (["--fabric", "rail"], "--fabric: only with --nodes K"),
    (["--nodes-per-leaf", "4"], "--nodes-per-leaf: only with --nodes K"),
    (["--nodes", "4", "--fabric", "leaf-spine"], "--fabric leaf-spine needs --nodes-per-leaf P"),
    (["--nodes", "4", "--nodes-per-leaf", "2"], "--nodes-per-leaf goes with --fabric leaf-spine"),
])
def test_multi_node_options_without_their_partners_are_usage_errors(capsys, options, message):
    # They were ignored (exit 0) or refused with exit 1 naming Python parameters.
    assert cli.main(["bounds", "dgx1", "allgather", *options]) == 2
    assert message in capsys.readouterr().err


def test_a_node_without_nics_names_the_option(capsys):
    assert cli.main(["bounds", "ring:4", "allgather", "--nodes", "2"]) == 1
    assert "(--nic-units U)" in capsys.readouterr().err
