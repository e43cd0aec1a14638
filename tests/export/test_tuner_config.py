"""The tuner CSV: each runtime's parser, quirk by quirk, the writer, and matching a call.

Expected values come from reading the runtimes' C code (NCCL 2.30 ``plugins/tuner/example/
plugin.c``: ``fgets`` into 256 bytes, ``strtok``, ``strcmp`` with defaults, ``strtoull``/``atoi``;
RCCL ``src/plugin/tuner/csv_tuner.cc``: the same plus rejections), worked out by hand per row.
"""

from __future__ import annotations

import random

import pytest

from collsynth.errors import CollsynthError, ExportError, InvalidInstanceError, OutputPathError
from collsynth.export.tuner.config import (ALGORITHMS, COLLECTIVES, CONFIG_PROTOCOLS,
                                           MAX_LINE_BYTES, SIZE_MAX, TunerRule, format_rule, match,
                                           parse_as_nccl_example, parse_as_rccl,
                                           render_tuner_config, runtime_outcome,
                                           write_tuner_config)

GOOD = "allreduce,0,1023,ring,ll,8,1,8"
R = TunerRule  # short


def kinds(parsed) -> set[str]:
    return {note.kind for note in parsed.notes}


# -- quirks, one row each: (text, what NCCL's example reads, what RCCL reads) -------------------

QUIRKS = {
    "a misspelt algorithm is ring in NCCL, rejected by RCCL": (
        "allreduce,0,1023,rnig,ll,8,1,8\n",
        [R("allreduce", 0, 1023, "ring", "ll", 8, 1, 8)], []),
    "names are case-sensitive: Tree is ring, LL is simple in NCCL": (
        "allreduce,0,1023,Tree,LL,8,1,8\n",
        [R("allreduce", 0, 1023, "ring", "simple", 8, 1, 8)], []),
    "an unknown collective is allreduce in NCCL": (
        "all_gather,0,1023,ring,ll,8,1,8\n",
        [R("allreduce", 0, 1023, "ring", "ll", 8, 1, 8)], []),
    "spaces and tabs around fields are trimmed": (
        " allgather\t, 0 ,1023, ring ,ll\t,8,1,8\n",
        [R("allgather", 0, 1023, "ring", "ll", 8, 1, 8)],
        [R("allgather", 0, 1023, "ring", "ll", 8, 1, 8)]),
    "an empty field collapses (strtok, both): the rest moves left": (
        "allreduce,0,1023,ring,ll,,1,8,-1,-1\n",   # channels left empty
        [R("allreduce", 0, 1023, "ring", "ll", 1, 8, -1, -1)],
        [R("allreduce", 0, 1023, "ring", "ll", 1, 8, -1, -1)]),
    "a field of spaces: NCCL reads 0, RCCL rejects the line": (
        "allreduce,0,1023,ring,ll, ,1,8\n",
        [R("allreduce", 0, 1023, "ring", "ll", 0, 1, 8)], []),
    "a space before # is no comment in NCCL: the commented-out rule runs": (
        " # allgather,0,10,tree,ll,1,1,8\n",
        [R("allreduce", 0, 10, "tree", "ll", 1, 1, 8)], []),
    "# in the first column is a comment in both": (
        "#allreduce,0,10,tree,ll,1,1,8\n", [], []),
    "a tab before # is a comment in RCCL only": (
        "\t#allreduce,0,10,tree,ll,1,1,8\n",
        [R("allreduce", 0, 10, "tree", "ll", 1, 1, 8)], []),
    "fewer than 8 fields: ignored": (
        "allreduce,0,1023,ring,ll,8,1\n", [], []),
    "more than 10 fields: the extra are ignored": (
        "allreduce,0,1023,ring,ll,8,1,8,2,1,spx,4\n",
        [R("allreduce", 0, 1023, "ring", "ll", 8, 1, 8, 2, 1)],
        [R("allreduce", 0, 1023, "ring", "ll", 8, 1, 8, 2, 1)]),
    "-1 as max_bytes is SIZE_MAX; as min_bytes too (matches nothing)": (
        "allreduce,-1,-1,ring,ll,8,1,8\n",
        [R("allreduce", SIZE_MAX, SIZE_MAX, "ring", "ll", 8, 1, 8)],
        [R("allreduce", SIZE_MAX, SIZE_MAX, "ring", "ll", 8, 1, 8)]),
    "a byte count past 2**64 saturates at SIZE_MAX": (
        "allreduce,0,99999999999999999999,ring,ll,8,1,8\n",
        [R("allreduce", 0, SIZE_MAX, "ring", "ll", 8, 1, 8)],
        [R("allreduce", 0, SIZE_MAX, "ring", "ll", 8, 1, 8)]),
    "atoi keeps the low 32 bits: 4294967304 ranks is 8": (
        "allreduce,0,1023,ring,ll,8,1,4294967304\n",
        [R("allreduce", 0, 1023, "ring", "ll", 8, 1, 8)],
        [R("allreduce", 0, 1023, "ring", "ll", 8, 1, 8)]),
    "a huge rank count saturates to -1 after the cast: it matches ANY": (
        "allreduce,0,1023,ring,ll,8,1,99999999999999999999\n",
        [R("allreduce", 0, 1023, "ring", "ll", 8, 1, -1)],
        [R("allreduce", 0, 1023, "ring", "ll", 8, 1, -1)]),
    "text where a number belongs is 0; hex stops at x; + is a sign": (
        "allreduce,0x10,eight,ring,ll,+8,1,8\n",
        [R("allreduce", 0, 0, "ring", "ll", 8, 1, 8)],
        [R("allreduce", 0, 0, "ring", "ll", 8, 1, 8)]),
    "CRLF: NCCL keeps the CR on the last field (atoi ignores it), RCCL drops it": (
        "allreduce,0,1023,ring,ll,8,1,8\r\n",
        [R("allreduce", 0, 1023, "ring", "ll", 8, 1, 8)],
        [R("allreduce", 0, 1023, "ring", "ll", 8, 1, 8)]),
    "a NUL ends the line in NCCL, the whole text in RCCL": (
        "allreduce,0,1023,ring,ll,8,1,8\x00junk\nallgather,0,1,ring,ll,8,1,8\n",
        [R("allreduce", 0, 1023, "ring", "ll", 8, 1, 8),
         R("allgather", 0, 1, "ring", "ll", 8, 1, 8)],
        [R("allreduce", 0, 1023, "ring", "ll", 8, 1, 8)]),
    "a whitespace-only line and an empty line are no rule": (
        "   \n\n\t\n", [], []),
    "a last line without a newline is read": (
        "allreduce,0,1023,ring,ll,8,1,8",
        [R("allreduce", 0, 1023, "ring", "ll", 8, 1, 8)],
        [R("allreduce", 0, 1023, "ring", "ll", 8, 1, 8)]),
}


@pytest.mark.parametrize("name", list(QUIRKS))
def test_each_quirk_reads_as_the_runtimes_read_it(name):
    text, nccl, rccl = QUIRKS[name]
    assert list(parse_as_nccl_example(text).rules) == nccl
    assert list(parse_as_rccl(text).rules) == rccl


def test_quirks_are_noted():
    assert "defaulted" in kinds(parse_as_nccl_example("allreduce,0,1,rnig,ll,8,1,8\n"))
    assert "unknown-name" in kinds(parse_as_rccl("allreduce,0,1,rnig,ll,8,1,8\n"))
    assert "collapsed" in kinds(parse_as_rccl("allreduce,0,1,ring,ll,,1,8\n"))
    assert "empty-field" in kinds(parse_as_rccl("allreduce,0,1,ring,ll, ,1,8\n"))
    assert "not-comment" in kinds(parse_as_nccl_example(" # a,b\n"))
    assert "few-fields" in kinds(parse_as_nccl_example("allreduce,0,1\n"))
    assert "extra-fields" in kinds(parse_as_nccl_example(GOOD + ",1,1,1\n"))
    assert "number" in kinds(parse_as_nccl_example("allreduce,-1,1,ring,ll,8,1,8\n"))
    assert "nul" in kinds(parse_as_rccl(GOOD + "\x00\n"))
    assert not parse_as_nccl_example(GOOD + "\n").notes
    assert not parse_as_rccl(GOOD + "\n").notes


@pytest.mark.parametrize("parse", [parse_as_nccl_example, parse_as_rccl])
def test_a_line_over_255_bytes_is_split_and_its_rest_read_as_a_line(parse):
    # A comment of 300 bytes whose bytes 255.. hold a rule: the rule is read (both runtimes).
    hidden = "allgather,0,10,tree,ll,1,1,8"
    comment = "#" + "x" * 254 + hidden + "\n"
    assert len(comment.encode()) - 1 == 255 + len(hidden)
    parsed = parse(comment)
    assert list(parsed.rules) == [R("allgather", 0, 10, "tree", "ll", 1, 1, 8)]
    assert "split" in kinds(parsed)
    # A rule padded past 255 bytes loses the fields beyond: numPipeOps 7 never arrives.
    padded = "allreduce,0,1023,ring,ll,8,1,8" + " " * 240 + ",7\n"
    parsed = parse(padded)
    assert list(parsed.rules) == [R("allreduce", 0, 1023, "ring", "ll", 8, 1, 8)]
    # 255 bytes of text and its newline: read whole (the newline comes back alone, skipped).
    exact = "allreduce,0,1023,ring,ll,8,1,8,-1," + "0" * 220 + "1"
    assert len(exact) == 255
    assert parse(exact + "\n").rules == (R("allreduce", 0, 1023, "ring", "ll", 8, 1, 8, -1, 1),)


def test_rule_lines_of_the_parser_are_physical_lines():
    parsed = parse_as_nccl_example("# c\n\n" + GOOD + "\n#x\n" + GOOD + "\n")
    assert parsed.lines == (3, 5)


# -- hostile input never crashes ---------------------------------------------------------------


def _junk(rnd: random.Random) -> bytes:
    alphabet = b",#\t \r\n\x00\x0b\x0c0123456789-+x" + b"".join(
        n.encode() for n in COLLECTIVES + ALGORITHMS + CONFIG_PROTOCOLS)
    size = rnd.choice([0, 1, 10, 254, 255, 256, 600, 3000])
    return bytes(rnd.choice(alphabet) for _ in range(size))


@pytest.mark.parametrize("parse", [parse_as_nccl_example, parse_as_rccl])
def test_hostile_input_never_crashes(parse):
    rnd = random.Random(22)
    cases = [_junk(rnd) for _ in range(300)]
    cases += [b"", b"\n" * 1000, b"," * 5000, b"\xff\xfe" * 300, "\ud800,é,\U0001f600".encode(
        "utf-8", "surrogatepass"), ("allreduce," * 40).encode(), b"allreduce,0,1," + b"9" * 400,
        b"\x00" * 10]
    for data in cases:
        for given in (data, data.decode("latin-1")):
            parsed = parse(given)
            assert len(parsed.rules) == len(parsed.lines)
            for rule in parsed.rules:   # every rule is a valid value of the runtime's types
                assert isinstance(rule, TunerRule)
                assert rule.collective in COLLECTIVES and 0 <= rule.max_bytes <= SIZE_MAX


def test_a_huge_text_parses():
    text = (GOOD + "\n") * 20000 + "#" * 1_000_000
    assert len(parse_as_rccl(text).rules) == 20000
    assert len(parse_as_nccl_example(text).rules) == 20000


def test_parsers_refuse_what_is_not_text():
    with pytest.raises(InvalidInstanceError):
        parse_as_nccl_example(12)  # type: ignore[arg-type]


# -- matching a call ---------------------------------------------------------------------------


RULES = [R("allreduce", 0, 1024, "tree", "ll", 4, 1, 8),
         R("allreduce", 1024, 4096, "ring", "ll128", 0, 1, 8),
         R("allreduce", 0, SIZE_MAX, "ring", "simple", -1, -1, -1),
         R("allgather", 100, 200, "nvls", "simple", 16, 1, 8)]


def test_match_is_first_match_with_inclusive_bounds():
    assert match(RULES, "allreduce", 0, 1, 8) is RULES[0]
    assert match(RULES, "allreduce", 1024, 1, 8) is RULES[0]      # both rules hold 1024
    assert match(RULES, "allreduce", 1025, 1, 8) is RULES[1]
    assert match(RULES, "allreduce", 4096, 1, 8) is RULES[1]
    assert match(RULES, "allreduce", 4097, 1, 8) is RULES[2]
    assert match(RULES, "allreduce", 10, 2, 16) is RULES[2]       # -1 matches any
    assert match(RULES, "allgather", 99, 1, 8) is None
    assert match(RULES, "allgather", 200, 1, 8) is RULES[3]
    assert match(RULES, "allgather", 150, 1, 16) is None          # nRanks exact


def test_match_passes_over_a_pair_the_call_cannot_run():
    assert match(RULES, "allgather", 150, 1, 8, available={("ring", "ll")}) is None
    assert match(RULES, "allreduce", 10, 1, 8,
                 available={("ring", "simple")}) is RULES[2]


def test_num_pipe_ops_and_reg_buff_match_exactly_or_any():
    rules = [R("allreduce", 0, 10, "tree", "ll", 1, 1, 8, 2, 1)]
    assert match(rules, "allreduce", 5, 1, 8, num_pipe_ops=2, reg_buff=1) is rules[0]
    assert match(rules, "allreduce", 5, 1, 8, num_pipe_ops=1, reg_buff=1) is None
    assert match(rules, "allreduce", 5, 1, 8, num_pipe_ops=2, reg_buff=0) is None


def test_channels_mean_different_things_to_the_two_runtimes():
    one = [R("allreduce", 0, 10, "ring", "ll", -1, 1, 8)]
    zero = [R("allreduce", 0, 10, "ring", "ll", 0, 1, 8)]
    eight = [R("allreduce", 0, 10, "ring", "ll", 8, 1, 8)]
    # NCCL's example plugin: -1 is ONE channel, 0 is NCCL's own, no match is ONE channel.
    assert runtime_outcome(one, "nccl", "allreduce", 5, 1, 8).channels == 1
    assert runtime_outcome(zero, "nccl", "allreduce", 5, 1, 8).channels is None
    assert runtime_outcome(eight, "nccl", "allreduce", 5, 1, 8).channels == 8
    assert runtime_outcome(eight, "nccl", "allreduce", 11, 1, 8) == \
        runtime_outcome([], "nccl", "allreduce", 11, 1, 8)
    assert runtime_outcome([], "nccl", "allreduce", 11, 1, 8).channels == 1
    # RCCL: -1 (and 0, warned) keep RCCL's own; no match keeps everything its own.
    assert runtime_outcome(one, "rccl", "allreduce", 5, 1, 8).channels is None
    assert runtime_outcome(zero, "rccl", "allreduce", 5, 1, 8).channels is None
    assert runtime_outcome(eight, "rccl", "allreduce", 5, 1, 8).channels == 8
    outcome = runtime_outcome([], "rccl", "allreduce", 5, 1, 8)
    assert (outcome.rule, outcome.algorithm, outcome.channels) == (None, None, None)


# -- the writer --------------------------------------------------------------------------------


def test_written_text_reads_back_under_both_parsers(tmp_path):
    rules = [R("allreduce", 0, 4096, "tree", "ll", 0, 2, 16),
             R("allreduce", 4097, SIZE_MAX, "nvls_tree", "simple", 16, 2, 16),
             R("reducescatter", 0, SIZE_MAX, "pat", "simple", 32, 2, 2, 1, 0)]
    path = write_tuner_config(rules, tmp_path / "nccl_tuner.conf", runtime="nccl",
                              header="machine: a test\nsecond line")
    data = path.read_bytes()
    assert parse_as_nccl_example(data).rules == tuple(rules)
    assert parse_as_rccl(data).rules == tuple(rules)
    assert not parse_as_nccl_example(data).notes and not parse_as_rccl(data).notes
    text = data.decode("ascii")
    assert "\r" not in text and text.endswith("\n")
    for line in text.splitlines():
        assert line and line[0] in "#" + "".join(c[0] for c in COLLECTIVES), line
        assert len(line.encode()) <= MAX_LINE_BYTES
        assert ",," not in line and not line.startswith(" ")
    assert format_rule(rules[2]) in text.splitlines()


def test_header_text_cannot_break_the_file(tmp_path):
    header = ["x" * 1000 + " " + "word " * 300, " indented", "\r\n#,,allreduce\x00\té",
              "allreduce,0,10,tree,ll,1,1,8", "日本語" * 200]
    rules = [R("allgather", 0, 10, "ring", "ll", 2, 1, 8)]
    for runtime in ("nccl", "rccl"):
        text = render_tuner_config(rules, runtime=runtime, header=header)
        for line in text.split("\n")[:-1]:
            assert len(line.encode()) <= MAX_LINE_BYTES
            assert line.startswith("#") or line == format_rule(rules[0]), repr(line)
        assert parse_as_nccl_example(text).rules == tuple(rules)
        assert parse_as_rccl(text).rules == tuple(rules)
        assert text.isascii()


@pytest.mark.parametrize("runtime, rule, fragment", [
    ("nccl", R("allreduce", 0, 10, "ring", "ll", -1, 1, 8), "ONE channel"),
    ("nccl", R("allreduce", 0, 10, "ring", "ll", -2, 1, 8), "ONE channel"),
    ("nccl", R("allreduce", 0, 10, "ring", "ll", 65, 1, 8), "more than nccl"),
    ("rccl", R("allreduce", 0, 10, "ring", "ll", 0, 1, 8), "ignores it"),
    ("rccl", R("allreduce", 0, 10, "ring", "ll", -5, 1, 8), "ignores it"),
    ("rccl", R("allreduce", 11, 10, "ring", "ll", 1, 1, 8), "never match"),
    ("rccl", R("allreduce", 0, 10, "ring", "ll", 1, 0, 8), "n_nodes"),
    ("nccl", R("allreduce", 0, 10, "ring", "ll", 1, 1, -3), "n_ranks"),
    ("nccl", R("allreduce", 0, 10, "ring", "ll", 1, 1, 8, 0), "num_pipe_ops"),
    ("nccl", R("allreduce", 0, 10, "ring", "ll", 1, 1, 8, -1, 2), "reg_buff"),
])
def test_the_writer_refuses_what_the_runtime_reads_otherwise(tmp_path, runtime, rule, fragment):
    target = tmp_path / "t.conf"
    with pytest.raises(ExportError, match=fragment):
        write_tuner_config([rule], target, runtime=runtime)
    assert not target.exists()


@pytest.mark.parametrize("fields, fragment", [
    (("all_reduce", 0, 1, "ring", "ll", 1, 1, 8), "collective"),
    (("allreduce", 0, 1, "Ring", "ll", 1, 1, 8), "algorithm"),
    (("allreduce", 0, 1, "ring", "LL", 1, 1, 8), "protocol"),
    (("allreduce", -1, 1, "ring", "ll", 1, 1, 8), "min_bytes"),
    (("allreduce", 0, 2**64, "ring", "ll", 1, 1, 8), "max_bytes"),
    (("allreduce", 0, 1, "ring", "ll", 2**31, 1, 8), "channels"),
    (("allreduce", 0, 1, "ring", "ll", True, 1, 8), "channels"),
    (("allreduce", 0, 1.0, "ring", "ll", 1, 1, 8), "max_bytes"),
])
def test_a_rule_holds_only_what_the_runtimes_store(fields, fragment):
    with pytest.raises(CollsynthError, match=fragment):
        TunerRule(*fields)


def test_the_writer_is_atomic_and_keeps_to_the_output_policy(tmp_path):
    rules = [R("allgather", 0, 10, "ring", "ll", 2, 1, 8)]
    with pytest.raises(OutputPathError):
        write_tuner_config(rules, tmp_path / "missing" / "t.conf", runtime="rccl")
    link = tmp_path / "link.conf"
    link.symlink_to(tmp_path / "elsewhere.conf")
    with pytest.raises(OutputPathError):
        write_tuner_config(rules, link, runtime="rccl")
    assert not (tmp_path / "elsewhere.conf").exists()
    target = tmp_path / "t.conf"
    target.write_text("old")
    with pytest.raises(ExportError):
        write_tuner_config(rules + [R("allgather", 5, 1, "ring", "ll", 2, 1, 8)], target,
                           runtime="rccl")
    assert target.read_text() == "old"
    write_tuner_config(rules, target, runtime="rccl")
    assert parse_as_rccl(target.read_text()).rules == tuple(rules)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
