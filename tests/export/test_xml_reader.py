"""Tests of the MSCCL XML reader: safe parsing into the IR, and the runtimes' reader rules.

A small correct program (the spec's appendix: a 2-rank out-of-place allgather, in the msccl and
the rccl dialect) is edited one rule at a time; each edit must produce exactly the problem the
rule describes (kind and a precise message fragment). Every shared XML must be free of lexical
problems (the full check of those files is in test_check.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from collsynth.errors import FileFormatError, InputTooLargeError
from collsynth.export import xml_reader
from collsynth.export.check import PROBLEM_KINDS, check_program, static_problems
from collsynth.export.program import GpuProgram, Program, ThreadBlock, XmlStep
from collsynth.export.xml_reader import (
    MAX_ATTRIBUTES,
    lexical_problems,
    read_checked,
    read_program,
    read_text,
    reader_problems,
    text_problems,
)

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT / "data" / "msccl-xml"
STEP = ('<step s="{s}" type="{t}" srcbuf="{sb}" srcoff="{so}" dstbuf="{db}" dstoff="{do}" '
        'cnt="1" depid="-1" deps="-1" hasdep="0"/>')


def ag2(*, rccl: bool = False) -> str:
    """The spec's appendix program: a correct 2-rank out-of-place allgather."""
    extra = ' outofplace="1" minBytes="0" maxBytes="0"' if rccl else ""
    lines = [f'<algo name="ag2" proto="Simple" nchannels="1" nchunksperloop="2" ngpus="2" '
             f'coll="allgather" inplace="0"{extra}>']
    for r in (0, 1):
        peer = 1 - r
        lines += [
            f'  <gpu id="{r}" i_chunks="1" o_chunks="2" s_chunks="0">',
            f'    <tb id="0" send="{peer}" recv="{peer}" chan="0">',
            "      " + STEP.format(s=0, t="s", sb="i", so=0, db="o", do=r),
            "      " + STEP.format(s=1, t="r", sb="i", so=0, db="o", do=peer),
            "    </tb>",
            '    <tb id="1" send="-1" recv="-1" chan="0">',
            "      " + STEP.format(s=0, t="cpy", sb="i", so=0, db="o", do=r),
            "    </tb>",
            "  </gpu>",
        ]
    return "\n".join(lines + ["</algo>", ""])


MSCCL, RCCL = ag2(), ag2(rccl=True)
BASE = {"msccl": MSCCL, "rccl": RCCL, "msccl-executor": RCCL}


def edit(text: str, old: str, new: str, count: int = 1) -> str:
    assert old in text, old
    return text.replace(old, new, count)


def all_problems(text: str, runtime: str) -> list:
    """Reader problems plus the checker's, as `collsynth check` reports them."""
    program, found = read_checked(text, runtime)
    if program is not None:
        found += check_program(program, runtime=runtime).problems
    return found


# -- reading into the IR ---------------------------------------------------------------------------


def test_base_programs_are_correct() -> None:
    for runtime, text in BASE.items():
        assert all_problems(text, runtime) == [], runtime


def test_read_program_from_text_bytes_and_path(tmp_path) -> None:
    path = tmp_path / "ag2.xml"
    path.write_text(MSCCL)
    for source in (MSCCL, MSCCL.encode(), path, str(path)):
        program = read_program(source)
        assert (program.ngpus, program.nchunksperloop, program.coll) == (2, 2, "allgather")
    assert program.gpus[1].line == 11
    assert program.gpus[1].threadblocks[0].steps[1].line == 14
    assert program.gpus[1].threadblocks[0].steps[1].dstoff == 0
    assert program.outofplace is None and program.max_bytes is None


def test_read_rccl_attributes_and_extras() -> None:
    assert SHARED.is_dir(), f"{SHARED} is missing: the XML corpus ships with the repository"
    program = read_program(SHARED / "rccl" / "all-reduce-ring-ll.xml")
    assert (program.inplace, program.outofplace, program.min_bytes, program.max_bytes) == \
        (1, 1, 0, 12287)
    assert dict(program.extra) == {"maxcount": "1", "nthreadblocks": "24"}
    assert program.gpus[0].line == 4   # two comment lines before <algo>


def test_integers_strict_or_as_the_runtime_reads_them() -> None:
    text = edit(MSCCL, 'srcoff="0" dstbuf="o" dstoff="1"', 'srcoff="0" dstbuf="o" dstoff="01"')
    with pytest.raises(FileFormatError, match=r'line 5: <step> dstoff="01" has a leading 0'):
        read_program(text)
    assert read_program(text, runtime="msccl").gpus[0].threadblocks[0].steps[1].dstoff == 1
    octal = edit(MSCCL, 'nchunksperloop="2"', 'nchunksperloop="010"')
    assert read_program(octal, runtime="rccl").nchunksperloop == 8


@pytest.mark.parametrize("declaration", [
    '<!DOCTYPE algo [<!ENTITY a "aaaaaaaaaa"><!ENTITY b "&a;&a;&a;&a;&a;&a;&a;&a;">]>\n',
    '<!DOCTYPE algo SYSTEM "file:///etc/passwd">\n',
])
def test_dtd_and_entities_are_refused(declaration: str) -> None:
    with pytest.raises(FileFormatError, match="DOCTYPE declaration: refused without expanding"):
        read_program(declaration + MSCCL)
    assert any(p.kind == "lexical" and "DOCTYPE" in p.message
               for p in text_problems(declaration + MSCCL, "msccl"))


def test_malformed_xml_and_wrong_root() -> None:
    with pytest.raises(FileFormatError, match=r"line \d+: malformed XML"):
        read_program(MSCCL.replace("</tb>", "", 1))
    with pytest.raises(FileFormatError, match=r"the first element is <msccl_algos>"):
        read_program("<msccl_algos>" + MSCCL + "</msccl_algos>")
    found = text_problems("<msccl_algos>" + MSCCL + "</msccl_algos>", "rccl")
    assert [p.kind for p in found] == ["structure"]


def test_missing_attribute_the_ir_needs() -> None:
    text = edit(MSCCL, ' cnt="1" depid="-1"', ' depid="-1"')
    with pytest.raises(FileFormatError, match=r"line 4: <step> has no cnt attribute"):
        read_program(text)
    program, found = read_checked(text, "msccl")
    assert program is None
    assert [(p.kind, p.line) for p in found] == [("structure", 4)]


def test_size_is_bounded_before_reading(tmp_path, monkeypatch) -> None:
    path = tmp_path / "big.xml"
    path.write_text(MSCCL)
    monkeypatch.setattr(xml_reader, "MAX_XML_BYTES", 100)
    with pytest.raises(InputTooLargeError):
        read_program(path)
    with pytest.raises(InputTooLargeError):
        read_text(MSCCL)
    with pytest.raises(FileFormatError, match="no such file"):
        read_program(tmp_path / "missing.xml")


def test_shared_files_have_no_lexical_problems() -> None:
    assert SHARED.is_dir(), f"{SHARED} is missing: the XML corpus ships with the repository"
    files = sorted(SHARED.glob("*/*.xml"))
    assert len(files) >= 55
    for path in files:
        assert lexical_problems(path.read_text()) == [], path.name


# -- the runtimes' reader rules --------------------------------------------------------------------

ATTRS_16 = " ".join(f'x{i}="{i}"' for i in range(8))

#: name -> (runtime, old, new, kind, message fragment, line or None)
RULES = {
    "XML declaration": (
        "msccl", "<algo ", '<?xml version="1.0"?>\n<algo ', "lexical",
        "an XML declaration; the runtimes' reader fails on it ('expected >, got ?')", 1),
    "start tag split over lines": (
        "msccl", '<tb id="1" send="-1"', '<tb id="1"\n send="-1"', "lexical",
        "the start tag of <tb> spans lines 7-8", 7),
    "TAB indentation": (
        "msccl", '\n    <tb id="1"', '\n\t<tb id="1"', "lexical", "a TAB character (at line 7)", 7),
    "CDATA": (
        "msccl", "  </gpu>", "  <![CDATA[x]]>\n  </gpu>", "lexical",
        "the runtimes' reader cannot read <! constructs other than comments", 10),
    "TAB between attributes": (
        "rccl", 'id="1" send="-1"', 'id="1"\tsend="-1"', "lexical", "a TAB character", 7),
    "17 attributes drop required ones": (
        "rccl", 'proto="Simple"', f'proto="Simple" {ATTRS_16}', "lexical",
        "keeps the first 16 and silently drops minBytes, maxBytes (required: minBytes, "
        "maxBytes)", 1),
    "repeated spaces count as attribute slots": (
        "msccl", 'depid="-1" deps="-1" hasdep="0"/>',
        'depid="-1"' + " " * 8 + 'deps="-1" hasdep="0"/>', "lexical",
        "<step> has 17 attributes (counting empty slots of repeated spaces)", 4),
    "long value": (
        "msccl", 'name="ag2"', f'name="{"a" * 300}"', "lexical",
        "its name or value is longer than the 254 characters the reader holds", 1),
    "space before =": (
        "msccl", 'name="ag2"', 'name ="ag2"', "lexical", "a space between name and '='", 1),
    "space after =": (
        "msccl", 'name="ag2"', 'name= "ag2"', "lexical",
        "name= is not followed by a double-quoted value (no spaces around '=')", 1),
    "single quotes": (
        "msccl", 'name="ag2"', "name='ag2'", "lexical",
        "name='ag2' is single-quoted; the runtimes' reader ends a value only at a double "
        "quote", 1),
    "character data": (
        "msccl", "  </gpu>", "  done\n  </gpu>", "lexical",
        "character data 'done' between elements", 10),
    "byte-order mark": (
        "msccl", "<algo ", "\ufeff<algo ", "lexical", "a byte-order mark between elements", 1),
    "closing tag with a space": (
        "msccl", "</tb>", "</tb >", "lexical", "the closing tag '</tb >' must be exactly", 6),
    "entity reference": (
        "msccl", 'name="ag2"', 'name="a&amp;b"', "lexical",
        "an entity or character reference in <algo>", 1),
    "octal": (
        "msccl", 'srcoff="0" dstbuf="o" dstoff="1"', 'srcoff="0" dstbuf="o" dstoff="010"',
        "lexical", '<step> dstoff="010" has a leading 0: the runtimes\' reader (strtol base 0) '
                   "reads it as octal 8", 5),
    "hexadecimal": (
        "msccl", 'nchannels="1"', 'nchannels="0x1"', "lexical",
        'nchannels="0x1" is hexadecimal (read as 1)', 1),
    "trailing characters": (
        "msccl", 'cnt="1"', 'cnt="1 chunk"', "lexical",
        'cnt="1 chunk" is read as 1 by the runtimes\' reader, which ignores trailing', 4),
    "not a number": (
        "msccl", 'hasdep="0"', 'hasdep="no"', "lexical",
        'hasdep="no" is not a number: the runtimes\' reader silently reads it as 0', 4),
    # required attributes, per runtime
    "rccl needs maxBytes": (
        "rccl", ' maxBytes="0"', "", "structure",
        "<algo> has no maxBytes attribute; rccl requires it", None),
    "msccl needs name": (
        "msccl", 'name="ag2" ', "", "structure", "<algo> has no name attribute", 1),
    "every step needs hasdep": (
        "msccl", ' hasdep="0"/>', "/>", "structure", "<step> has no hasdep attribute", 4),
    # names and spellings
    "unknown proto": (
        "msccl", 'proto="Simple"', 'proto="simple"', "structure",
        "proto='simple' is not one of LL, LL128, Simple", None),
    "msccl refuses reducescatter": (
        "msccl", 'coll="allgather"', 'coll="reducescatter"', "structure",
        "coll='reducescatter' is not a collective msccl knows", None),
    "rccl refuses reduce_scatter": (
        "rccl", 'coll="allgather"', 'coll="reduce_scatter"', "structure",
        "rccl spells it 'reducescatter'", None),
    "rccl refuses custom": (
        "rccl", 'coll="allgather"', 'coll="custom"', "structure",
        "custom collectives exist only in msccl", None),
    "unknown buffer": (
        "msccl", 'type="cpy" srcbuf="i"', 'type="cpy" srcbuf="input"', "structure",
        "srcbuf='input' is not i, o or s", 8),
    "ra on msccl": (
        "msccl", 'type="cpy"', 'type="ra"', "unsupported-op",
        "type 'ra' is parsed by msccl but its interpreter has no implementation", 8),
    "ra on rccl": (
        "rccl", 'type="cpy"', 'type="ra"', "structure", "unknown step type 'ra'", 8),
    "rccl refuses rrc": (
        "rccl", 'type="r" ', 'type="rrc" ', "unsupported-op",
        "rccl refuses to launch algorithms with rcs, rrs, rrc or rrcs steps", 5),
    # ids, peers, channels, limits
    "tb id gap": (
        "msccl", '<tb id="1" send="-1"', '<tb id="2" send="-1"', "structure",
        "rank 0: threadblock 1 is missing", 2),
    "duplicate tb id": (
        "msccl", '<tb id="1" send="-1"', '<tb id="0" send="-1"', "structure",
        "rank 0: duplicate tb id 0 (first at line 3)", 7),
    "send to own rank": (
        "msccl", '<tb id="1" send="-1" recv="-1"', '<tb id="1" send="0" recv="-1"', "structure",
        "rank 0 tb 1: send=0 is this tb's own rank", 7),
    "peer beyond ngpus": (
        "rccl", '<tb id="1" send="-1" recv="-1"', '<tb id="1" send="5" recv="-1"', "structure",
        "rank 0 tb 1: send=5 is not -1 or a rank of ngpus=2", 7),
    "chan >= nchannels": (
        "msccl", '<tb id="1" send="-1" recv="-1" chan="0"', '<tb id="1" send="-1" recv="-1" '
        'chan="3"', "connection", "rank 0 tb 1: chan=3 but nchannels=1", 7),
    "cnt 72": (
        "msccl", 'type="cpy" srcbuf="i" srcoff="0" dstbuf="o" dstoff="0" cnt="1"',
        'type="cpy" srcbuf="i" srcoff="0" dstbuf="o" dstoff="0" cnt="72"', "limit",
        "cnt=72 is outside 0..71", 8),
    "cnt 0": (
        "msccl", 'type="cpy" srcbuf="i" srcoff="0" dstbuf="o" dstoff="0" cnt="1"',
        'type="cpy" srcbuf="i" srcoff="0" dstbuf="o" dstoff="0" cnt="0"', "limit",
        "cnt=0 moves nothing", 8),
    "hasdep 2": (
        "msccl", 'type="cpy" srcbuf="i" srcoff="0" dstbuf="o" dstoff="0" cnt="1" depid="-1" '
        'deps="-1" hasdep="0"', 'type="cpy" srcbuf="i" srcoff="0" dstbuf="o" dstoff="0" cnt="1" '
        'depid="-1" deps="-1" hasdep="2"', "limit", "hasdep=2 must be 0 or 1", 8),
    "s beyond rccl's 64 steps": (
        "rccl", '<step s="1" type="r"', '<step s="64" type="r"', "limit",
        "s=64 is outside 0..63", 5),
    "msccl i_chunks vs nchunksperloop": (
        "msccl", 'i_chunks="1" o_chunks="2"', 'i_chunks="2" o_chunks="2"', "limit",
        "rank 0: i_chunks=2 but msccl requires 0 or 1 for allgather", 2),
    "negative s_chunks": (
        "rccl", 's_chunks="0"', 's_chunks="-1"', "limit", "rank 0: s_chunks=-1 must be >= 0", 2),
    "declared beyond the real buffer": (
        "rccl", 'i_chunks="1" o_chunks="2"', 'i_chunks="2" o_chunks="2"', "bounds",
        "rank 0: i_chunks=2 but the input buffer of allgather with ngpus=2, nchunksperloop=2 "
        "holds 1 chunks", 2),
    "offset beyond the declared buffer": (
        "msccl", 'type="cpy" srcbuf="i" srcoff="0"', 'type="cpy" srcbuf="i" srcoff="1"',
        "bounds", "rank 0 tb 1 step 0: srcoff=1 is outside i_chunks=1; the runtime's reader "
                  "refuses it", 8),
    "msccl maxBytes=0 never selects": (
        "msccl", 'inplace="0"', 'inplace="0" maxBytes="0"', "limit",
        "maxBytes=0: msccl's upper bound is exclusive", None),
    "nthreads not a multiple of 32": (
        "msccl", 'inplace="0"', 'inplace="0" nthreads="100"', "limit",
        "nthreads=100 must be a positive multiple of 32", None),
    "rccl selects for nothing": (
        "rccl", 'outofplace="1"', 'outofplace="0"', "structure",
        "inplace=0 and outofplace=0: rccl never selects this algorithm", None),
    "duplicate gpu": (
        "msccl", '<gpu id="1"', '<gpu id="0"', "structure", "a second <gpu id=0>", 11),
    # connections
    "two tbs on one connection": (
        "msccl", '<tb id="1" send="-1" recv="-1" chan="0">', '<tb id="1" send="1" recv="-1" '
        'chan="0">', "connection", "rank 0: tbs 0, 1 all send to rank 1 on channel 0", 7),
    "two tbs receiving on one connection": (
        "msccl", '<tb id="1" send="-1" recv="-1" chan="0">', '<tb id="1" send="-1" recv="1" '
        'chan="0">', "connection", "rank 0: tbs 0, 1 all receive from rank 1 on channel 0", 7),
    # dependencies
    "depid names no tb": (
        "msccl", 'cnt="1" depid="-1" deps="-1" hasdep="0"/>\n    </tb>\n    <tb id="1"',
        'cnt="1" depid="5" deps="0" hasdep="0"/>\n    </tb>\n    <tb id="1"', "dependency",
        "rank 0 tb 0 step 1: depid=5 names no tb of rank 0 (it has 2)", 5),
    "waits for a flag never published": (
        "msccl", 'cnt="1" depid="-1" deps="-1" hasdep="0"/>\n    </tb>\n    <tb id="1"',
        'cnt="1" depid="1" deps="0" hasdep="0"/>\n    </tb>\n    <tb id="1"', "dependency",
        "waits for tb 1 step 0, but tb 1 publishes no flag at or after that step", 5),
    "nop chain rule": (
        "msccl", '<step s="0" type="cpy"', '<step s="0" type="nop" srcbuf="i" srcoff="-1" '
        'dstbuf="o" dstoff="-1" cnt="0" depid="0" deps="1" hasdep="0"/>\n      <step s="1" '
        'type="cpy"', "dependency",
        "rank 0 tb 1 step 1: nop steps before it carry dependencies, so it must have its own "
        "depid >= 0", 9),
    "trailing nop": (
        "msccl", '</tb>\n  </gpu>', '  <step s="1" type="nop" srcbuf="i" srcoff="-1" dstbuf="o" '
        'dstoff="-1" cnt="0" depid="0" deps="1" hasdep="0"/>\n    </tb>\n  </gpu>', "dependency",
        "a trailing nop waits for tb 0 step 1, but no real step follows it", 9),
}


@pytest.mark.parametrize("name", sorted(RULES))
def test_rule(name: str) -> None:
    runtime, old, new, kind, fragment, line = RULES[name]
    text = edit(BASE[runtime], old, new)
    found = reader_problems(text, runtime)
    if not any(p.kind == kind for p in found):   # rules only the execution sees
        found = all_problems(text, runtime)
    for p in found:
        assert p.kind in PROBLEM_KINDS
    matching = [p for p in found if p.kind == kind and fragment in p.message]
    assert matching, f"no {kind} problem with {fragment!r} among:\n" + "\n".join(
        str(p) for p in found)
    assert matching[0].line == line


def test_tab_inside_a_value_and_in_comments_is_harmless() -> None:
    text = edit(MSCCL, 'name="ag2"', 'name="a\tb"')
    assert lexical_problems("<!--\tnote\t-->\n" + text) == []


def test_problem_str_and_lexical_order() -> None:
    text = '<?xml version="1.0"?>\n' + edit(MSCCL, '\n    <tb id="1"', '\n\t<tb id="1"')
    found = lexical_problems(text)
    assert [p.line for p in found] == [1, 8]
    assert str(found[0]).startswith("line 1: lexical: an XML declaration")


def test_max_attributes_is_the_runtime_limit() -> None:
    sixteen = " ".join(f'x{i}="{i}"' for i in range(MAX_ATTRIBUTES))
    assert lexical_problems(f"<algo {sixteen}>\n</algo>\n") == []
    seventeen = sixteen + ' last="1"'
    (problem,) = lexical_problems(f"<algo {seventeen}>\n</algo>\n")
    assert problem.message.endswith("silently drops last")


def test_reader_problems_of_unreadable_text() -> None:
    found = reader_problems(MSCCL.replace("</tb>", "", 1), "msccl")
    assert [p.kind for p in found] == ["lexical"]
    assert "malformed XML" in found[0].message


def test_limits_of_a_big_rank() -> None:
    """33 tbs sending on one channel; 64 tbs of 64 steps (>= 4096 reader nodes, rccl: 64 steps)."""
    nop = XmlStep(0, "nop", "i", -1, "o", -1, 0)
    senders = tuple(ThreadBlock(t, 1 + t, -1, 0, ()) for t in range(33))
    wide = Program("w", "Simple", 1, 1, 34, "allreduce", 1,
                   (GpuProgram(0, 1, 0, 0, senders),))
    found = [str(p) for p in static_problems(wide, "msccl")]
    assert "limit: rank 0: 33 tbs sending on channel 0; at most 32" in found
    long = tuple(ThreadBlock(t, -1, -1, 0, (nop,) * 65) for t in range(64))
    big = Program("b", "Simple", 1, 1, 1, "allreduce", 1, (GpuProgram(0, 1, 0, 0, long),))
    messages = [p.message for p in static_problems(big, "rccl")]
    assert "rank 0 tb 0: 65 steps; rccl allows 64 per tb" in messages
    assert any("the reader would store 4226 nodes" in m for m in messages)
    assert not any("65 steps" in p.message for p in static_problems(big, "msccl"))
