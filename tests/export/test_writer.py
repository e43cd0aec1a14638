"""The XML writer's dialect (what the runtimes' hand-written reader accepts), the round trip
through the reader, and ``collsynth export`` in process."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

from collsynth.algorithm import save_algorithm
from collsynth.cli import main
from collsynth.export.pipeline import export_algorithm
from collsynth.errors import ExportError
from collsynth.export.check import check_program
from collsynth.export.lower import lower
from collsynth.export.xml_reader import lexical_problems, read_program, text_problems
from collsynth.export.xml_writer import MAX_ATTRIBUTES, save_xml, write_program

RUNTIMES = ["msccl", "rccl", "msccl-executor"]
_ATTRIBUTE = re.compile(r' ([A-Za-z_]+)="([^"\t<>&]*)"')
_LINE = re.compile(r'^(?P<indent> *)<(?P<tag>algo|gpu|tb|step)(?P<attrs>( [A-Za-z_]+="[^"]*")*)'
                   r'(?P<close>/?)>$')
_INTEGER = re.compile(r"-?(0|[1-9][0-9]*)")
_TEXT_ATTRIBUTES = {"name", "proto", "coll", "type", "srcbuf", "dstbuf"}
_DEPTH = {"algo": 0, "gpu": 1, "tb": 2, "step": 3}


def assert_dialect(text: str) -> None:
    """Line by line: what NCCL's topology reader (spec section 2) needs."""
    assert "\t" not in text and "\r" not in text
    assert text.endswith("\n")
    lines = text.splitlines()
    assert lines[0].startswith("<algo "), "no declaration, <algo> first"
    for number, line in enumerate(lines, 1):
        if line.lstrip().startswith("</"):
            tag = line.strip()[2:-1]
            assert line == "  " * _DEPTH[tag] + f"</{tag}>", f"line {number}: {line!r}"
            continue
        match = _LINE.match(line)
        assert match, f"line {number} is not one start tag on one line: {line!r}"
        tag = match["tag"]
        assert len(match["indent"]) == 2 * _DEPTH[tag], f"line {number}: indentation"
        assert (match["close"] == "/") == (tag == "step"), f"line {number}: <step .../> only"
        attributes = _ATTRIBUTE.findall(match["attrs"])
        assert "".join(f' {k}="{v}"' for k, v in attributes) == match["attrs"], \
            f"line {number}: attributes separated by single spaces"
        assert len(attributes) <= MAX_ATTRIBUTES, f"line {number}: > 16 attributes"
        for key, value in attributes:
            if key not in _TEXT_ATTRIBUTES:
                assert _INTEGER.fullmatch(value), f"line {number}: {key}={value!r} not decimal"
    assert lines[-1] == "</algo>"


@pytest.mark.parametrize("instances", [1, 2])
@pytest.mark.parametrize("runtime", RUNTIMES)
def test_writer_dialect_and_round_trip(algorithms, case, runtime, instances):
    algorithm = algorithms[case]
    try:
        program = lower(algorithm, runtime=runtime, instances=instances)
    except ExportError as exc:
        assert "no custom collective" in str(exc)
        return
    text = write_program(program, runtime)
    assert_dialect(text)
    assert lexical_problems(text) == []
    assert text_problems(text, runtime) == []
    back = read_program(text)
    assert back == program
    assert write_program(back, runtime) == text


def test_attribute_order_is_msccl_tools():
    from collsynth.export.program import GpuProgram, Program, ThreadBlock, XmlStep

    step = XmlStep(0, "cpy", "i", 0, "o", 0, 1)
    gpu = GpuProgram(0, 1, 1, 0, (ThreadBlock(0, -1, -1, 0, (step,)),))
    program = Program("x", "LL", 1, 1, 1, "allreduce", 1, (gpu,), outofplace=0, min_bytes=0,
                      max_bytes=0)
    lines = write_program(program, "rccl").splitlines()
    assert lines[0] == ('<algo name="x" proto="LL" nchannels="1" nchunksperloop="1" ngpus="1" '
                        'coll="allreduce" inplace="1" outofplace="0" minBytes="0" maxBytes="0">')
    assert lines[1] == '  <gpu id="0" i_chunks="1" o_chunks="1" s_chunks="0">'
    assert lines[2] == '    <tb id="0" send="-1" recv="-1" chan="0">'
    assert lines[3] == ('      <step s="0" type="cpy" srcbuf="i" srcoff="0" dstbuf="o" dstoff="0" '
                        'cnt="1" depid="-1" deps="-1" hasdep="0"/>')


def test_writer_refuses_what_a_runtime_cannot_read(ring_allgather):
    algorithm = ring_allgather(4)
    msccl = lower(algorithm, runtime="msccl")
    with pytest.raises(ExportError, match="requires the <algo> attribute"):
        write_program(replace(msccl, coll="allgather"), "rccl")  # no outofplace/min/maxBytes
    with pytest.raises(ExportError, match="does not know coll='reduce_scatter'"):
        write_program(replace(msccl, coll="reduce_scatter"), "rccl")
    with pytest.raises(ExportError, match="17 attributes"):
        write_program(replace(msccl, extra=tuple((f"x{i}", "1") for i in range(10))), "msccl")
    with pytest.raises(ExportError, match="misread"):
        write_program(replace(msccl, name='two words'), "msccl")
    with pytest.raises(ExportError, match="misread"):
        write_program(replace(msccl, name='a"b'), "msccl")
    rs = lower(ring_allgather(4), runtime="msccl")
    gpu = rs.gpus[0]
    tb = gpu.threadblocks[0]
    fused = replace(tb, steps=(replace(tb.steps[0], type="rrc"),) + tb.steps[1:])
    bad = replace(rs, gpus=(replace(gpu, threadblocks=(fused,) + gpu.threadblocks[1:]),)
                  + rs.gpus[1:], outofplace=1, min_bytes=0, max_bytes=0)
    with pytest.raises(ExportError, match="rccl refuses to run 'rrc'"):
        write_program(bad, "rccl")


def test_save_xml_writes_the_text(tmp_path, ring_allgather):
    program = lower(ring_allgather(4), runtime="rccl")
    path = tmp_path / "sub" / "ag.xml"
    path.parent.mkdir()  # writers never create missing folders (collsynth._output)
    save_xml(program, path, "rccl")
    assert path.read_text() == write_program(program, "rccl")
    assert [p.name for p in path.parent.iterdir()] == ["ag.xml"]  # no temporary left


# -- the library entry point and the command line -----------------------------------------------


def test_export_algorithm_checks_then_writes(tmp_path, algorithms):
    path = tmp_path / "rs.xml"
    program = export_algorithm(algorithms["ring4-reduce_scatter"], path, runtime="rccl",
                               instances=2, inplace=True)
    assert read_program(path) == program
    assert check_program(program, runtime="rccl", collective="reduce_scatter").ok
    with pytest.raises(ExportError, match="rccl has no custom collective"):
        export_algorithm(algorithms["ring4-custom-shift2"], tmp_path / "c.xml", runtime="rccl")
    assert not (tmp_path / "c.xml").exists()


def _run(argv: list[str]) -> int:
    return main(argv)


@pytest.fixture()
def algorithm_file(tmp_path, algorithms):
    path = tmp_path / "ag.json"
    save_algorithm(algorithms["dgx1-allgather-3-7-6"], path)
    return path


def test_cli_export_one_runtime(tmp_path, algorithm_file, capsys):
    out = tmp_path / "ag.xml"
    code = _run(["export", str(algorithm_file), "-o", str(out), "--runtime", "rccl",
                 "--instances", "2", "--channels", "2", "--proto", "LL", "--max-bytes", "65536"])
    assert code == 0
    assert "wrote" in capsys.readouterr().out
    program = read_program(out)
    assert (program.proto, program.max_bytes, program.min_bytes) == ("LL", 65536, 0)
    assert program.nchannels == 4 and program.coll == "allgather"
    assert_dialect(out.read_text())


def test_cli_export_all_runtimes(tmp_path, algorithm_file):
    assert _run(["export", str(algorithm_file), "-o", str(tmp_path / "out.xml"),
                 "--runtime", "all", "--inplace"]) == 0
    names = sorted(p.name for p in tmp_path.glob("out.*.xml"))
    assert names == ["out.msccl-executor.xml", "out.msccl.xml", "out.rccl.xml"]
    assert read_program(tmp_path / "out.msccl.xml").inplace == 1
    folder = tmp_path / "xml"
    folder.mkdir()
    assert _run(["export", str(algorithm_file), "-o", str(folder), "--runtime", "all"]) == 0
    assert sorted(p.name for p in folder.iterdir()) == [
        "ag.msccl-executor.xml", "ag.msccl.xml", "ag.rccl.xml"]


def test_cli_export_errors(tmp_path, algorithm_file, algorithms, capsys):
    path = tmp_path / "custom.json"
    save_algorithm(algorithms["ring4-custom-shift2"], path)
    assert _run(["export", str(path), "-o", str(tmp_path / "c.xml"), "--runtime", "rccl"]) == 1
    assert "rccl has no custom collective" in capsys.readouterr().err
    assert not (tmp_path / "c.xml").exists()
    # msccl cannot declare both layouts (a usage error); with --runtime all nothing is written
    assert _run(["export", str(algorithm_file), "-o", str(tmp_path / "b.xml"), "--runtime", "all",
                 "--inplace", "--outofplace"]) == 2
    assert "msccl selects an algorithm for one layout only" in capsys.readouterr().err
    assert not list(tmp_path.glob("b.*"))
    assert _run(["export", str(tmp_path / "missing.json"), "-o", str(tmp_path / "m.xml")]) == 1
    assert _run(["export", str(algorithm_file), "-o", str(tmp_path / "u.xml"), "--min-bytes",
                 "10", "--max-bytes", "5"]) == 2  # usage
    assert _run(["export", str(algorithm_file), "-o", str(tmp_path / "u.xml"), "--instances",
                 "0"]) == 2
