"""The tuner CSV that NCCL's example tuner plugin and RCCL's built-in CSV tuner read.

:class:`TunerRule` is one line; :func:`render_tuner_config` / :func:`write_tuner_config` write
rules so that each runtime reads them back unchanged; :func:`parse_as_nccl_example` and
:func:`parse_as_rccl` read text exactly as the two runtimes' parsers do, quirks included;
:func:`match` and :func:`runtime_outcome` pick the rule a call gets as the runtimes do (first
match, inclusive byte range). The format, each parser's quirks and what the writer does about
them: docs/tuner-config.md.
"""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass, fields
from os import PathLike
from pathlib import Path
from typing import Container, Iterable, Sequence

from collsynth.errors import ExportError, InvalidInstanceError, UnknownNameError
from collsynth.runtimes import PROTOCOLS, TUNER_CONFIG, runtime_names

__all__ = ["COLLECTIVES", "ALGORITHMS", "CONFIG_PROTOCOLS", "RUNTIMES", "SIZE_MAX",
           "MAX_LINE_BYTES",
           "FIELDS", "TunerRule", "ParseNote", "ParsedConfig", "RuntimeOutcome", "format_rule",
           "render_tuner_config", "write_tuner_config", "parse_as_nccl_example",
           "parse_as_rccl", "parse_tuner_config", "match", "runtime_outcome",
           "keep_channels"]

#: The names the runtimes compare with ``strcmp`` (case-sensitive), in NCCL's own order
#: (``ncclFunc_t``, ``NCCL_ALGO_*``, ``NCCL_PROTO_*``).
COLLECTIVES = ("broadcast", "reduce", "allgather", "reducescatter", "allreduce")
ALGORITHMS = ("tree", "ring", "collnet_direct", "collnet_chain", "nvls", "nvls_tree", "pat")
#: The protocols as a config spells them: NCCL's, lower-case.
CONFIG_PROTOCOLS = tuple(p.lower() for p in PROTOCOLS)
#: The runtimes that load a tuner config (the registry's): ``nccl``, NCCL's example tuner
#: plugin; ``rccl``, RCCL's built-in CSV tuner (2.28.3 and later).
RUNTIMES = runtime_names(TUNER_CONFIG)
#: ``max_bytes`` of a range without an upper end (``SIZE_MAX`` on 64-bit Linux).
SIZE_MAX = 2**64 - 1
#: Longest line (bytes, without its newline) the writer emits. Both parsers read a line into a
#: 256-byte buffer: 255 bytes of text at most, the rest comes back as another line. Keeping the
#: newline inside the buffer too leaves 254.
MAX_LINE_BYTES = 254
#: The columns, in order.
FIELDS = ("collective_type", "min_bytes", "max_bytes", "algorithm", "protocol", "channels",
          "nNodes", "nRanks", "numPipeOps", "regBuff")

_INT_MIN, _INT_MAX = -2**31, 2**31 - 1
#: Most channels a rule may force: MAXCHANNELS, 64 in NCCL (src/include/device.h), 128 in RCCL.
_MAX_CHANNELS = {"nccl": 64, "rccl": 128}
_CHUNK = 255             # bytes fgets (or RCCL's line reader) returns at most per call
_MAX_FIELDS = 10
_MIN_FIELDS = 8
_C_SPACE = b" \t\n\v\f\r"  # isspace() in the C locale: what strtoull/strtol skip
_RUNTIME_TEXT = {
    "nccl": "NCCL's example tuner plugin (plugins/tuner/example, NCCL_TUNER_PLUGIN)",
    "rccl": "RCCL's built-in CSV tuner (RCCL 2.28.3 and later)",
}


def _whole(value: object, name: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidInstanceError(f"TunerRule.{name} = {value!r}: expected a whole number in "
                                   f"{low}..{high}")
    return value


@dataclass(frozen=True)
class TunerRule:
    """One line of the tuner CSV, with the names and numbers as the runtimes store them.

    ``collective`` / ``algorithm`` / ``protocol`` are spelt as in the file (:data:`COLLECTIVES`,
    :data:`ALGORITHMS`, :data:`CONFIG_PROTOCOLS`). ``min_bytes``..``max_bytes`` is an inclusive
    range of NCCL's ``nBytes`` (the nccl-tests size: the whole buffer for allgather and reduce-scatter),
    ``SIZE_MAX`` for no upper end. ``channels`` is the number written: what it means differs
    (:func:`runtime_outcome`): NCCL's example plugin takes ``-1`` as ONE channel and ``0`` as
    NCCL's own count; RCCL takes ``-1`` as its own count. ``n_nodes``, ``n_ranks``,
    ``num_pipe_ops`` and ``reg_buff`` match exactly, ``-1`` matches any.

    Raises
    ------
    UnknownNameError
        A name the runtimes do not know.
    InvalidInstanceError
        A number outside what the runtimes store (``size_t`` for the byte range, ``int`` else).

    >>> TunerRule("allreduce", 0, 65535, "ring", "ll", 0, 1, 8).num_pipe_ops
    -1
    """

    collective: str
    min_bytes: int
    max_bytes: int
    algorithm: str
    protocol: str
    channels: int
    n_nodes: int
    n_ranks: int
    num_pipe_ops: int = -1
    reg_buff: int = -1

    def __post_init__(self) -> None:
        for name, known in (("collective", COLLECTIVES), ("algorithm", ALGORITHMS),
                            ("protocol", CONFIG_PROTOCOLS)):
            value = getattr(self, name)
            if not isinstance(value, str) or value not in known:
                raise UnknownNameError(f"TunerRule.{name} = {value!r}: expected one of "
                                       f"{', '.join(known)}")
        _whole(self.min_bytes, "min_bytes", 0, SIZE_MAX)
        _whole(self.max_bytes, "max_bytes", 0, SIZE_MAX)
        for name in ("channels", "n_nodes", "n_ranks", "num_pipe_ops", "reg_buff"):
            _whole(getattr(self, name), name, _INT_MIN, _INT_MAX)

    def values(self) -> tuple:
        """The ten fields in file order."""
        return tuple(getattr(self, f.name) for f in fields(self))


def format_rule(rule: TunerRule) -> str:
    """The rule as one CSV line (all ten fields, no spaces, no newline).

    >>> format_rule(TunerRule("allgather", 0, 1023, "ring", "ll", 8, 2, 16))
    'allgather,0,1023,ring,ll,8,2,16,-1,-1'
    """
    return ",".join(str(v) for v in rule.values())


def keep_channels(runtime: str) -> int:
    """What to write in ``channels`` to keep the runtime's own per-call count: ``0`` for NCCL's
    example plugin (it passes 0 on, and NCCL keeps its own count when a tuner returns 0; its
    ``-1`` means one channel), ``-1`` for RCCL (its ``0`` is warned about and ignored)."""
    return {"nccl": 0, "rccl": -1}[_runtime(runtime)]


def _runtime(runtime: str) -> str:
    if runtime not in RUNTIMES:
        raise UnknownNameError(f"tuner runtime {runtime!r}: expected one of {', '.join(RUNTIMES)}")
    return runtime


def _check_for(rule: TunerRule, runtime: str, index: int) -> None:
    """Refuse what the runtime would read differently from what the rule means."""
    where = f"tuner rule {index + 1} ({format_rule(rule)})"
    if rule.min_bytes > rule.max_bytes:
        raise ExportError(f"{where}: min_bytes > max_bytes: the rule would never match")
    for name in ("n_nodes", "n_ranks", "num_pipe_ops"):
        value = getattr(rule, name)
        if value != -1 and value < 1:
            raise ExportError(f"{where}: {name} = {value}: expected -1 (any) or >= 1")
    if rule.reg_buff not in (-1, 0, 1):
        raise ExportError(f"{where}: reg_buff = {rule.reg_buff}: expected -1 (any), 0 or 1")
    if rule.channels > _MAX_CHANNELS[runtime]:
        raise ExportError(f"{where}: channels = {rule.channels}: more than {runtime} can run "
                          f"({_MAX_CHANNELS[runtime]})")
    if runtime == "nccl" and rule.channels < 0:
        raise ExportError(f"{where}: channels = {rule.channels}: NCCL's example plugin runs a "
                          "rule with -1 on ONE channel; write 0 to keep NCCL's own count or a "
                          "count >= 1")
    if runtime == "rccl" and rule.channels < 1 and rule.channels != -1:
        raise ExportError(f"{where}: channels = {rule.channels}: RCCL's tuner ignores it with a "
                          "warning; write -1 to keep RCCL's own count or a count >= 1")


def _comment_lines(header: str | Iterable[str]) -> list[str]:
    """``# ``-prefixed comment lines, ASCII, no control characters, each short enough."""
    lines = header.splitlines() if isinstance(header, str) else \
        [part for line in header for part in str(line).splitlines() or [""]]
    out = []
    for line in lines:
        text = line.encode("ascii", "replace").decode("ascii")
        text = re.sub(r"[\x00-\x1f\x7f]", " ", text).rstrip()
        indent = len(text) - len(text.lstrip(" "))
        wrapped = textwrap.wrap(text, width=110, subsequent_indent=" " * min(indent + 2, 40),
                                drop_whitespace=True, break_on_hyphens=False) or [""]
        out.extend(("# " + part).rstrip() for part in wrapped)
    return out


def render_tuner_config(rules: Sequence[TunerRule], *, runtime: str,
                        header: str | Iterable[str] = ()) -> str:
    """The file text: comment lines (what wrote it, then ``header``), the column names, one
    line per rule. LF line endings, ASCII, no leading space anywhere, no empty field, every line
    at most :data:`MAX_LINE_BYTES` bytes.

    Raises
    ------
    ExportError
        A rule the runtime would read as something else (see :func:`write_tuner_config`).
    """
    from collsynth import __version__

    runtime = _runtime(runtime)
    for index, rule in enumerate(rules):
        if not isinstance(rule, TunerRule):
            raise ExportError(f"tuner rule {index + 1}: {rule!r} is not a TunerRule")
        _check_for(rule, runtime, index)
    comments = _comment_lines([f"Tuner config written by collsynth {__version__} for "
                               f"{_RUNTIME_TEXT[runtime]}.", *(
                                   [header] if isinstance(header, str) else header),
                               "Columns: " + ",".join(FIELDS)])
    lines = comments + [format_rule(rule) for rule in rules]
    for number, line in enumerate(lines, 1):
        if len(line.encode("utf-8")) > MAX_LINE_BYTES:  # pragma: no cover - cannot happen
            raise ExportError(f"tuner config line {number}: {len(line)} bytes, more than "
                              f"{MAX_LINE_BYTES}")
    return "\n".join(lines) + "\n"


def write_tuner_config(rules: Sequence[TunerRule], path: str | PathLike[str], *, runtime: str,
                       header: str | Iterable[str] = ()) -> Path:
    """Write ``rules`` for ``runtime`` to ``path`` atomically and return the path.

    The text is read back with the runtime's own rules (:func:`parse_tuner_config`) before it
    is written, and must give ``rules`` exactly. For ``nccl`` a rule's ``channels`` must be
    ``0`` (NCCL's own count) or a count: the example plugin's ``-1`` means ONE channel. For
    ``rccl`` it must be ``-1`` (RCCL's own count) or a count.

    Raises
    ------
    ExportError
        A rule the runtime would read differently (``min_bytes > max_bytes``, a channel value
        with another meaning, ``n_nodes``/``n_ranks`` below 1 other than -1...).
    OutputPathError
        ``path`` cannot be written (nothing is written then).
    """
    from collsynth._output import check_output_file, write_bytes_atomic

    check_output_file(path)
    text = render_tuner_config(rules, runtime=runtime, header=header)
    parsed = parse_tuner_config(text, runtime=runtime)
    if parsed.rules != tuple(rules) or parsed.notes:  # pragma: no cover - a writer bug
        raise ExportError(f"{path}: the {runtime} parser reads the text back differently")
    write_bytes_atomic(path, text.encode("ascii"))
    return Path(path)


# -- the runtimes' parsers ---------------------------------------------------------------------


@dataclass(frozen=True)
class ParseNote:
    """Something a parser did that the text does not say plainly: ``kind`` is one of
    ``split`` (a line over 255 bytes read as two), ``not-comment`` (spaces before ``#``),
    ``collapsed`` (an empty field dropped, the rest shifted left), ``empty-field`` (RCCL:
    line rejected), ``few-fields`` (fewer than 8: ignored), ``extra-fields`` (beyond 10:
    ignored), ``defaulted`` (NCCL: an unknown name read as the default), ``unknown-name``
    (RCCL: line rejected), ``number`` (text not a plain number, read as C reads it),
    ``nul`` (a NUL byte: the rest of the line, or with RCCL of the file, ignored)."""

    line: int
    kind: str
    message: str


@dataclass(frozen=True)
class ParsedConfig:
    """What a runtime reads from a tuner config: its ``rules`` in file order, the physical
    ``lines`` they came from, and ``notes`` on what it did silently or with a warning."""

    runtime: str
    rules: tuple[TunerRule, ...]
    lines: tuple[int, ...]
    notes: tuple[ParseNote, ...]


def _bytes(text: str | bytes) -> bytes:
    if isinstance(text, (bytes, bytearray, memoryview)):
        return bytes(text)
    if not isinstance(text, str):
        raise InvalidInstanceError(f"tuner config: expected text or bytes, got "
                                   f"{type(text).__name__}")
    return text.encode("utf-8", "surrogatepass")


def _shown(token: bytes) -> str:
    text = token.decode("utf-8", "replace")
    return repr(text if len(text) <= 40 else text[:37] + "...")


def _c_digits(token: bytes) -> tuple[bool, int, bool]:
    """``(negative, value, any digits)`` as strtoull/strtol scan ``token`` in base 10: C-locale
    spaces, one sign, then digits up to the first other byte."""
    i, n = 0, len(token)
    while i < n and token[i] in _C_SPACE:
        i += 1
    negative = False
    if i < n and token[i] in b"+-":
        negative = token[i] == ord("-")
        i += 1
    start = i
    while i < n and 48 <= token[i] <= 57:
        i += 1
    return negative, int(token[start:i]) if i > start else 0, i > start


def _strtoull(token: bytes) -> int:
    """``(size_t) strtoull(token, NULL, 10)`` (glibc): overflow gives SIZE_MAX, a minus sign
    negates modulo 2**64, no digits gives 0."""
    negative, value, digits = _c_digits(token)
    if not digits:
        return 0
    if value > SIZE_MAX:
        return SIZE_MAX
    return (-value) % 2**64 if negative else value


def _atoi(token: bytes) -> int:
    """``atoi(token)`` (glibc: ``(int) strtol(token, NULL, 10)``): strtol saturates at the
    64-bit limits, the cast keeps the low 32 bits."""
    negative, value, digits = _c_digits(token)
    if not digits:
        return 0
    value = -value if negative else value
    value = max(-2**63, min(2**63 - 1, value))
    value &= 0xFFFFFFFF
    return value - 2**32 if value >= 2**31 else value


def _plain(token: bytes) -> bool:
    return re.fullmatch(rb"-?[0-9]+", token) is not None


def _strtok(line: bytes) -> list[bytes]:
    """Every token ``strtok(line, ",")`` returns: the non-empty runs between commas."""
    return [part for part in line.split(b",") if part]


def _line_tokens(line: bytes, number: int, continued: bool, notes: list[ParseNote]
                 ) -> list[bytes]:
    """``line``'s fields as both plugins split them (``strtok`` on commas), with the notes
    they share: a continued (over-long) line, and the fields' own problems; ``[]`` when the
    line has no field (both skip it)."""
    tokens = _strtok(line)
    if continued and tokens:
        notes.append(ParseNote(number, "split", "the line is longer than 255 bytes: its rest "
                               "is read as a line of its own"))
    if tokens:
        _notes_for_fields(line, number, notes)
    return tokens


def _notes_for_fields(line: bytes, number: int, notes: list[ParseNote]) -> None:
    if re.search(rb"^,|,,|,$", line.rstrip(b"\r")):
        notes.append(ParseNote(number, "collapsed", "an empty field (',,' or a comma at an end) "
                               "is dropped by strtok: the fields after it move left"))


_NUMBER_FIELDS = ("min_bytes", "max_bytes", "channels", "nNodes", "nRanks", "numPipeOps",
                  "regBuff")


def _numbers(tokens: list[bytes], number: int, notes: list[ParseNote]) -> tuple[int, ...]:
    """min, max, channels, nNodes, nRanks[, numPipeOps[, regBuff]] as the runtimes read them
    (``strtoull`` for the byte range, ``atoi`` for the rest)."""
    values = []
    for name, token in zip(_NUMBER_FIELDS, tokens):
        read = _strtoull(token) if name.endswith("_bytes") else _atoi(token)
        if not _plain(token) or int(token) != read:
            notes.append(ParseNote(number, "number", f"{name} {_shown(token)} is read as "
                                   f"{read}"))
        values.append(read)
    return tuple(values)


def _build(tokens: list[bytes], names: tuple[str, str, str], number: int,
           notes: list[ParseNote]) -> TunerRule:
    numbers = _numbers([tokens[1], tokens[2]] + tokens[5:], number, notes)
    extra = list(numbers[5:]) + [-1] * (7 - len(numbers))
    return TunerRule(names[0], numbers[0], numbers[1], names[1], names[2], numbers[2],
                     numbers[3], numbers[4], extra[0], extra[1])


def _lines_fgets(data: bytes):
    """``(physical line, chunk, is a continuation)`` as ``fgets(buf, 256, file)`` returns them:
    at most 255 bytes, up to and including a newline."""
    pos, line, continued = 0, 1, False
    while pos < len(data):
        end = data.find(b"\n", pos, pos + _CHUNK)
        if end != -1:
            yield line, data[pos:end + 1], continued
            pos, line, continued = end + 1, line + 1, False
        else:
            chunk = data[pos:pos + _CHUNK]
            yield line, chunk, continued
            pos += len(chunk)
            continued = True


def parse_as_nccl_example(text: str | bytes) -> ParsedConfig:
    """Read a tuner config exactly as NCCL's example plugin does (``loadConfig`` in
    ``plugins/tuner/example/plugin.c``, NCCL 2.27.7-2.30; never raises on any input).

    Lines are read 255 bytes at a time (a longer line becomes two); a line is a comment only if
    its FIRST byte is ``#``; fields are split with ``strtok`` (``,,`` collapses and shifts the
    rest left) and trimmed of spaces and tabs; 8 to 10 fields make a rule (fewer: ignored; more:
    the extra ignored); an unknown collective becomes ``allreduce``, algorithm ``ring``, protocol
    ``simple``, silently; numbers are read with ``strtoull``/``atoi``.

    >>> p = parse_as_nccl_example("allreduce,0,1023,rnig,ll,8,1,8\\n")
    >>> p.rules[0].algorithm, p.notes[0].kind
    ('ring', 'defaulted')
    """
    data = _bytes(text)
    rules, lines, notes = [], [], []
    for number, chunk, continued in _lines_fgets(data):
        line = chunk.split(b"\0", 1)[0]
        if b"\0" in chunk:
            notes.append(ParseNote(number, "nul", "a NUL byte ends the line for the parser"))
        if line[:1] in (b"#", b"\n"):
            continue
        content = line.split(b"\n", 1)[0]
        if content.lstrip(b" \t\r\v\f")[:1] == b"#":
            notes.append(ParseNote(number, "not-comment", "only a '#' in the first column starts "
                                   "a comment: this line is read as fields"))
        all_tokens = _line_tokens(content, number, continued, notes)
        if not all_tokens:
            continue
        tokens = [t.strip(b" \t") for t in all_tokens[:_MAX_FIELDS]]
        if len(tokens) < _MIN_FIELDS:
            notes.append(ParseNote(number, "few-fields", f"{len(tokens)} field(s): fewer than 8, "
                                   "the line is ignored"))
            continue
        if len(all_tokens) > _MAX_FIELDS:
            notes.append(ParseNote(number, "extra-fields", f"{len(all_tokens)} fields: those "
                                   "after the 10th are ignored"))
        names = []
        for token, known, default, what in ((tokens[0], COLLECTIVES, "allreduce", "collective"),
                                            (tokens[3], ALGORITHMS, "ring", "algorithm"),
                                            (tokens[4], CONFIG_PROTOCOLS, "simple", "protocol")):
            name = token.decode("latin-1")
            if name not in known:
                notes.append(ParseNote(number, "defaulted", f"unknown {what} {_shown(token)} "
                                       f"is read as {default!r}"))
                name = default
            names.append(name)
        rules.append(_build(tokens, tuple(names), number, notes))
        lines.append(number)
    return ParsedConfig("nccl", tuple(rules), tuple(lines), tuple(notes))


def _lines_rccl(data: bytes):
    """``(physical line, line, is a continuation, was cut)`` as RCCL's ``nextConfigLine``
    returns them: text up to a newline, at most 255 bytes (the rest is the next line), one
    trailing CR dropped."""
    pos, line, continued = 0, 1, False
    while pos < len(data):
        end = data.find(b"\n", pos)
        length = (end if end != -1 else len(data)) - pos
        cut = length >= _CHUNK
        if cut:
            length, nxt = _CHUNK, pos + _CHUNK
        else:
            nxt = end + 1 if end != -1 else pos + length
        text = data[pos:pos + length]
        if text.endswith(b"\r"):
            text = text[:-1]
        yield line, text, continued, cut
        if cut:
            continued = True
        else:
            line, continued = line + 1, False
        pos = nxt


def parse_as_rccl(text: str | bytes) -> ParsedConfig:
    """Read a tuner config exactly as RCCL's built-in CSV tuner does (``loadConfigFromBuffer``
    in ``src/plugin/tuner/csv_tuner.cc``, rocm-systems 2026; never raises on any input).

    As NCCL's example (255-byte lines, ``strtok`` collapsing ``,,``, 8 to 10 fields, C
    numbers), except: the text ends at its first NUL byte; one CR before a newline is dropped;
    comments and blank lines may start with spaces or tabs; a field that is empty after trimming
    (``, ,``) rejects the line; an unknown collective, algorithm or protocol rejects the line
    (RCCL warns), nothing is defaulted.

    >>> p = parse_as_rccl("allreduce,0,1023,rnig,ll,8,1,8\\n")
    >>> p.rules, p.notes[0].kind
    ((), 'unknown-name')
    """
    data = _bytes(text)
    rules, lines, notes = [], [], []
    if b"\0" in data:
        cut = data.index(b"\0")
        notes.append(ParseNote(data.count(b"\n", 0, cut) + 1, "nul",
                               "a NUL byte: RCCL reads the file as a C string and ignores the "
                               "rest"))
        data = data[:cut]
    for number, line, continued, _ in _lines_rccl(data):
        stripped = line.lstrip(b" \t")
        if stripped[:1] == b"#" or not stripped:
            continue
        all_tokens = _line_tokens(line, number, continued, notes)
        if not all_tokens:
            continue
        tokens = [t.strip(b" \t") for t in all_tokens[:_MAX_FIELDS]]
        if any(not t for t in tokens):
            notes.append(ParseNote(number, "empty-field", "a field holds only spaces: RCCL "
                                   "rejects the line"))
            continue
        if len(tokens) < _MIN_FIELDS:
            notes.append(ParseNote(number, "few-fields", f"{len(tokens)} field(s): fewer than 8, "
                                   "the line is ignored"))
            continue
        if len(all_tokens) > _MAX_FIELDS:
            notes.append(ParseNote(number, "extra-fields", f"{len(all_tokens)} fields: those "
                                   "after the 10th are ignored"))
        names, unknown = [], []
        for token, known, what in ((tokens[0], COLLECTIVES, "collective"),
                                   (tokens[3], ALGORITHMS, "algorithm"),
                                   (tokens[4], CONFIG_PROTOCOLS, "protocol")):
            name = token.decode("latin-1")
            if name not in known:
                unknown.append(f"{what} {_shown(token)}")
            names.append(name)
        if unknown:
            notes.append(ParseNote(number, "unknown-name", f"unknown {', '.join(unknown)}: RCCL "
                                   "rejects the line"))
            continue
        rules.append(_build(tokens, tuple(names), number, notes))
        lines.append(number)
    return ParsedConfig("rccl", tuple(rules), tuple(lines), tuple(notes))


def parse_tuner_config(text: str | bytes, *, runtime: str) -> ParsedConfig:
    """:func:`parse_as_nccl_example` or :func:`parse_as_rccl`, by ``runtime``."""
    return {"nccl": parse_as_nccl_example, "rccl": parse_as_rccl}[_runtime(runtime)](text)


# -- matching a call ---------------------------------------------------------------------------


def match(rules: Sequence[TunerRule], collective: str, nbytes: int, n_nodes: int, n_ranks: int,
          *, num_pipe_ops: int = 1, reg_buff: int = 0,
          available: Container[tuple[str, str]] | None = None) -> TunerRule | None:
    """The rule a call gets, as both runtimes pick it: the first in file order whose
    collective is equal, ``min_bytes <= nbytes <= max_bytes`` (both inclusive), and whose
    ``n_nodes``, ``n_ranks``, ``num_pipe_ops`` and ``reg_buff`` are equal or -1. A matching rule
    whose (algorithm, protocol) the call cannot run (not in ``available``; the runtime's cost
    table holds IGNORE there) is passed over and the search goes on. ``None``: no rule.

    >>> rules = [TunerRule("allreduce", 0, 1024, "tree", "ll", 0, 1, 8),
    ...          TunerRule("allreduce", 1024, 4096, "ring", "ll", 0, 1, 8)]
    >>> match(rules, "allreduce", 1024, 1, 8).algorithm   # inclusive: the first rule
    'tree'
    >>> match(rules, "allreduce", 1024, 1, 8, available={("ring", "ll")}).algorithm
    'ring'
    """
    for rule in rules:
        if rule.collective == collective and rule.min_bytes <= nbytes <= rule.max_bytes \
                and rule.n_nodes in (-1, n_nodes) and rule.n_ranks in (-1, n_ranks) \
                and rule.num_pipe_ops in (-1, num_pipe_ops) and rule.reg_buff in (-1, reg_buff):
            if available is not None and (rule.algorithm, rule.protocol) not in available:
                continue
            return rule
    return None


@dataclass(frozen=True)
class RuntimeOutcome:
    """What a call runs under a tuner config: the matched ``rule`` (``None``: none), the
    ``algorithm``/``protocol`` it forces (``None``: the runtime's own choice) and the channel
    count it forces (``None``: the runtime's own per-call count)."""

    rule: TunerRule | None
    algorithm: str | None
    protocol: str | None
    channels: int | None


def runtime_outcome(rules: Sequence[TunerRule], runtime: str, collective: str, nbytes: int,
                    n_nodes: int, n_ranks: int, *, num_pipe_ops: int = 1, reg_buff: int = 0,
                    available: Container[tuple[str, str]] | None = None) -> RuntimeOutcome:
    """The effect of the rules on one call (:func:`match`, then each runtime's channel rule).

    NCCL's example plugin starts from ONE channel: with no matching rule, or a rule with
    ``channels = -1``, NCCL runs the call on one channel; ``0`` keeps NCCL's own count. RCCL's
    tuner starts from 0 (its own count) and takes only counts >= 1.

    >>> runtime_outcome([], "nccl", "allreduce", 4096, 1, 8).channels
    1
    >>> runtime_outcome([], "rccl", "allreduce", 4096, 1, 8).channels is None
    True
    """
    runtime = _runtime(runtime)
    rule = match(rules, collective, nbytes, n_nodes, n_ranks, num_pipe_ops=num_pipe_ops,
                 reg_buff=reg_buff, available=available)
    if runtime == "nccl":
        channels: int | None = 1
        if rule is not None and rule.channels != -1:
            channels = rule.channels if rule.channels != 0 else None
    else:
        channels = rule.channels if rule is not None and rule.channels >= 1 else None
    if rule is None:
        return RuntimeOutcome(None, None, None, channels)
    return RuntimeOutcome(rule, rule.algorithm, rule.protocol, channels)
