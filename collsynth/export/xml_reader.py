"""Read MSCCL XML into the program IR, and find what the runtimes' own reader would trip on.

Two readers look at an MSCCL XML file, and they disagree (docs/msccl-xml.md §2):
:func:`read_program` parses it safely with lxml into a :class:`~collsynth.export.program.Program`;
the runtimes use NCCL's hand-written topology reader, whose quirks :func:`lexical_problems`,
:func:`text_problems` and :func:`reader_problems` find on the raw text (docs/export.md).
"""

from __future__ import annotations

import bisect
import os
import re
from pathlib import Path

from lxml import etree

from collsynth._files import read_bytes_bounded
from collsynth._parse import decode_text
from collsynth.errors import FileFormatError, InputTooLargeError, expect_path
from collsynth.export.check import (MAX_CHECKED_RANKS, PROBLEM_KINDS, Problem, is_unverified,
                                    static_problems)
from collsynth.export.program import GpuProgram, Program, ThreadBlock, XmlStep
from collsynth.runtimes import XmlDialect, xml_dialect

__all__ = [
    "MAX_XML_BYTES",
    "MAX_XML_ELEMENTS",
    "MAX_ATTRIBUTES",
    "MAX_NAME_CHARS",
    "PROBLEM_KINDS",
    "Problem",
    "read_text",
    "read_program",
    "lexical_problems",
    "text_problems",
    "read_checked",
    "reader_problems",
    "infer_runtime",
    "load_program",
]

#: Largest XML file read (bytes). RCCL's largest shipped algorithm is about 1.5 MiB; an optimal
#: 64-GPU allgather exported by collsynth is about 19 MB, 1024-GPU schedules far more.
MAX_XML_BYTES = 256 * 1024 * 1024
#: Most elements (start tags) of a file read, counted on the raw bytes before parsing. The
#: reader and the checks cost about 50 us per element on a 2-core machine, so 2^19 read in
#: under half a minute; an optimal 64-GPU allgather has about 190,000, and a program the
#: runtimes load keeps at most 4096 nodes per rank. (200,000 <gpu> elements in 11 MB took
#: 13 s and 450 MB before anything said that 8 were expected.)
MAX_XML_ELEMENTS = 1 << 19
#: Attributes per element the runtimes' reader keeps (``MAX_ATTR_COUNT``).
MAX_ATTRIBUTES = 16
#: Longest name or value the runtimes' reader holds (``MAX_STR_LEN`` = 255 with the terminator).
MAX_NAME_CHARS = 254

_ALGO_INTS = ("nchannels", "nchunksperloop", "ngpus", "inplace", "outofplace", "minBytes",
              "maxBytes", "nthreads")
_ALGO_KNOWN = ("name", "proto", "coll") + _ALGO_INTS
#: Attributes without which no IR can be built (the runtimes require them too).
_IR_REQUIRED = {
    "algo": ("proto", "nchannels", "nchunksperloop", "ngpus", "coll", "inplace"),
    "gpu": ("id", "i_chunks", "o_chunks", "s_chunks"),
    "tb": ("id", "send", "recv", "chan"),
    "step": ("s", "type", "srcbuf", "srcoff", "dstbuf", "dstoff", "cnt"),
}
#: Attributes a runtime requires although the IR has a default for them.
_STEP_DEFAULTED = ("depid", "deps", "hasdep")
#: Everything some runtime requires (for the "attributes dropped" message).
_ANY_REQUIRED = {
    "algo": _IR_REQUIRED["algo"] + ("name", "outofplace", "minBytes", "maxBytes"),
    "gpu": _IR_REQUIRED["gpu"],
    "tb": _IR_REQUIRED["tb"],
    "step": _IR_REQUIRED["step"] + _STEP_DEFAULTED,
}

_DECIMAL = re.compile(r"-?(?:0|[1-9][0-9]*)")
#: 2^63: the runtimes read integers with strtol into a 64-bit long.
_LONG_LIMIT = 1 << 63
_DECLARATION = re.compile(r"<!\s*(DOCTYPE|ENTITY)", re.IGNORECASE)
_POSITION_SUFFIX = re.compile(r",\s*line \d+, column \d+\s*$")
# One token of the raw text: a comment, a processing instruction, a <!...> declaration, a tag
# (quotes respected), character data, or a stray '<'.
_TOKEN = re.compile(r"""<!--.*?(?:-->|\Z)|<\?.*?(?:\?>|\Z)|<![^>]*(?:>|\Z)"""
                    r"""|<(?:[^<>"']|"[^"]*"|'[^']*')*(?:>|\Z)|[^<]+|<""", re.S)
# A tag the runtimes read without trouble (the common case, checked fast).
_CLEAN_START = re.compile(r'<[A-Za-z_][\w.:-]*(?: [A-Za-z_][\w.:-]*="[^"&<>\t\n\r]*")*(?: ?/)?>')
_CLEAN_END = re.compile(r"</[^\s/>=]+>")
_WHITESPACE = frozenset(" \n\r")
_QUOTED = re.compile(r'"[^"]*"')


# -- reading ---------------------------------------------------------------------------------------


def _source_bytes(source: str | bytes | os.PathLike, name: str | None) -> tuple[bytes, str]:
    if isinstance(source, bytes):
        data, label = source, name or "<bytes>"
    elif isinstance(source, str) and "<" in source:
        data, label = source.encode("utf-8"), name or "<text>"
    else:
        path = Path(expect_path(source, "source"))
        label = name or str(path)
        data = read_bytes_bounded(path, MAX_XML_BYTES, what="an MSCCL XML file may have",
                                  label=label)
    if len(data) > MAX_XML_BYTES:
        raise InputTooLargeError(f"{label}: {len(data)} bytes is more than the {MAX_XML_BYTES} "
                                 "an MSCCL XML file may have")
    elements = data.count(b"<") - data.count(b"</") - data.count(b"<!") - data.count(b"<?")
    if elements > MAX_XML_ELEMENTS:
        raise InputTooLargeError(f"{label}: {elements} elements is more than the "
                                 f"{MAX_XML_ELEMENTS} an MSCCL XML file may have")
    return data, label


def read_text(source: str | bytes | os.PathLike, *, name: str | None = None) -> str:
    """The text of an MSCCL XML file (a path) or of XML given as bytes or a string with ``<``.

    Raises
    ------
    FileFormatError
        A missing or unreadable file, or bytes that are not UTF-8.
    InputTooLargeError
        More than :data:`MAX_XML_BYTES` bytes (refused before reading).
    """
    data, label = _source_bytes(source, name)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        decode_text(data, label)  # UTF-16 or UTF-32: the message says how to convert it
        line = data.count(b"\n", 0, exc.start) + 1
        raise FileFormatError(label, f"line {line}: not UTF-8 text (MSCCL XML is ASCII)") from exc


class _Unreadable(Exception):
    def __init__(self, message: str, line: int | None) -> None:
        self.message, self.line = message, line
        super().__init__(message)


def _parse(data: bytes) -> etree._Element:
    match = _DECLARATION.search(data.decode("utf-8", "replace"))
    if match:
        line = data.count(b"\n", 0, match.start()) + 1
        raise _Unreadable(f"a <!{match.group(1).upper()} declaration: refused without expanding "
                          "it (the runtimes' reader cannot read one either)", line)
    parser = etree.XMLParser(resolve_entities=False, no_network=True, load_dtd=False,
                             huge_tree=False, dtd_validation=False, remove_blank_text=False)
    try:
        root = etree.fromstring(data, parser)
    except etree.XMLSyntaxError as exc:
        line = exc.position[0] if exc.position else exc.lineno
        reason = _POSITION_SUFFIX.sub("", str(exc.msg or exc))
        raise _Unreadable(f"malformed XML: {reason}", line) from exc
    except (ValueError, etree.LxmlError) as exc:
        raise _Unreadable(f"unreadable XML: {exc}", None) from exc
    if root is None:
        raise _Unreadable("no element in the file", None)
    if root.tag != "algo":
        raise _Unreadable(f"the first element is <{root.tag}>, expected <algo> (rccl reads the "
                          "algorithm from the first element whatever its name)", root.sourceline)
    return root


def _strtol(text: str) -> int:
    """C's ``strtol(text, NULL, 0)`` for a 64-bit ``long``: what the runtimes read. Like C, a
    value beyond the range reads as ``LONG_MAX`` (``LONG_MIN`` when negative)."""
    m = re.match(r"\s*([+-]?)(0[xX](?=[0-9a-fA-F])|0)?", text)
    sign, prefix = m.group(1), m.group(2) or ""
    rest = text[m.end():]
    if prefix.lower() == "0x":
        base, digits = 16, re.match(r"[0-9a-fA-F]*", rest).group(0)
    elif prefix == "0":
        base, digits = 8, re.match(r"[0-7]*", rest).group(0)
    else:
        base, digits = 10, re.match(r"[0-9]*", rest).group(0)
    digits = digits.lstrip("0")
    # 22 octal digits exceed 2^63 already: a longer string saturates without an int() of it.
    value = int(digits, base) if digits and len(digits) <= 22 else (0 if not digits else 1 << 64)
    if sign == "-":
        return max(-value, -_LONG_LIMIT)
    return min(value, _LONG_LIMIT - 1)


def _int_problem(raw: str, value: int) -> str:
    if _DECIMAL.fullmatch(raw):
        return (f"is beyond the 64-bit range of the runtimes' reader (strtol reads it as "
                f"{value}); write a number from {-_LONG_LIMIT} to {_LONG_LIMIT - 1}")
    if re.fullmatch(r"\s*[+-]?0[0-9]+", raw):
        return (f"has a leading 0: the runtimes' reader (strtol base 0) reads it as octal "
                f"{value}; write plain decimal")
    if re.fullmatch(r"\s*[+-]?0[xX][0-9a-fA-F]+", raw):
        return f"is hexadecimal (read as {value}); write plain decimal"
    if re.match(r"\s*[+-]?[0-9]", raw):
        return (f"is read as {value} by the runtimes' reader, which ignores trailing characters "
                "and leading spaces or '+'; write plain decimal")
    return "is not a number: the runtimes' reader silently reads it as 0"


class _Builder:
    """Builds the IR from the lxml tree, noting attribute problems as it goes.

    ``runtime`` None: strict (every integer plain decimal, else an error). A runtime: integers
    read as that runtime reads them, and its required attributes reported when missing.
    """

    def __init__(self, runtime: XmlDialect | None) -> None:
        self.runtime = runtime
        self.problems: list[Problem] = []
        self.fatal: tuple[str, int | None] | None = None

    def _fail(self, message: str, line: int | None) -> None:
        if self.fatal is None:
            self.fatal = (message, line)

    def missing(self, el: etree._Element, attr: str, *, needed: bool) -> None:
        message = f"<{el.tag}> has no {attr} attribute ('Attribute {attr} of node {el.tag} not " \
                  "found')"
        self.problems.append(Problem("structure", message, el.sourceline))
        if needed:
            self._fail(message, el.sourceline)

    def integer(self, el: etree._Element, attr: str, default: int | None = None) -> int | None:
        raw = el.get(attr)
        if raw is None:
            return default
        # At most 20 characters before int(): no conversion of thousands of digits.
        if _DECIMAL.fullmatch(raw) and len(raw) <= 20 and -_LONG_LIMIT <= int(raw) < _LONG_LIMIT:
            return int(raw)
        value = _strtol(raw)
        written = raw if len(raw) <= 40 else f"{raw[:30]}...({len(raw)} characters)"
        message = f'<{el.tag}> {attr}="{written}" {_int_problem(raw, value)}'
        if self.runtime is None:
            self._fail(message, el.sourceline)
        else:
            self.problems.append(Problem("lexical", message, el.sourceline))
        return value

    def required(self, el: etree._Element) -> bool:
        """Report missing attributes; False when one the IR needs is missing."""
        tag = el.tag
        complete = True
        for attr in _IR_REQUIRED[tag]:
            if el.get(attr) is None:
                self.missing(el, attr, needed=True)
                complete = False
        if self.runtime is not None:
            extra: tuple[str, ...] = ()
            if tag == "step":
                extra = _STEP_DEFAULTED
            elif tag == "algo" and not self.runtime.requires_range_attributes:
                extra = ("name",)  # rccl's outofplace/minBytes/maxBytes: see static_problems
            for attr in extra:
                if el.get(attr) is None:
                    self.missing(el, attr, needed=False)
        return complete

    def build(self, root: etree._Element) -> Program | None:
        if not self.required(root):
            return None
        ints = {attr: self.integer(root, attr) for attr in _ALGO_INTS}
        children = _children(root, "gpu")
        if len(children) > MAX_CHECKED_RANKS:
            # Refused before a GpuProgram is built for each (200,000 took 7 s and 450 MB).
            message = (f"{len(children)} <gpu> elements; the reader keeps at most "
                       f"{MAX_CHECKED_RANKS} children per element")
            self.problems.append(Problem("limit", message, children[MAX_CHECKED_RANKS].sourceline))
            self._fail(message, children[MAX_CHECKED_RANKS].sourceline)
            return None
        gpus = []
        for gpu_el in children:
            gpu = self._gpu(gpu_el)
            if gpu is not None:
                gpus.append(gpu)
        if self.fatal is not None:
            return None
        extra = tuple((str(k), str(v)) for k, v in root.attrib.items() if k not in _ALGO_KNOWN)
        return Program(name=root.get("name", ""), proto=root.get("proto"),
                       nchannels=ints["nchannels"], nchunksperloop=ints["nchunksperloop"],
                       ngpus=ints["ngpus"], coll=root.get("coll"), inplace=ints["inplace"],
                       gpus=tuple(gpus), outofplace=ints["outofplace"],
                       min_bytes=ints["minBytes"], max_bytes=ints["maxBytes"],
                       nthreads=ints["nthreads"], extra=extra)

    def _gpu(self, el: etree._Element) -> GpuProgram | None:
        complete = self.required(el)
        tbs = [tb for tb in (self._tb(tb_el) for tb_el in _children(el, "tb")) if tb is not None]
        if not complete:
            return None
        v = {attr: self.integer(el, attr) for attr in _IR_REQUIRED["gpu"]}
        return GpuProgram(v["id"], v["i_chunks"], v["o_chunks"], v["s_chunks"], tuple(tbs),
                          line=el.sourceline)

    def _tb(self, el: etree._Element) -> ThreadBlock | None:
        complete = self.required(el)
        steps = [st for st in (self._step(st_el) for st_el in _children(el, "step"))
                 if st is not None]
        if not complete:
            return None
        v = {attr: self.integer(el, attr) for attr in _IR_REQUIRED["tb"]}
        return ThreadBlock(v["id"], v["send"], v["recv"], v["chan"], tuple(steps),
                           line=el.sourceline)

    def _step(self, el: etree._Element) -> XmlStep | None:
        if not self.required(el):
            return None
        i = self.integer
        return XmlStep(s=i(el, "s"), type=el.get("type"), srcbuf=el.get("srcbuf"),
                       srcoff=i(el, "srcoff"), dstbuf=el.get("dstbuf"), dstoff=i(el, "dstoff"),
                       cnt=i(el, "cnt"), depid=i(el, "depid", -1), deps=i(el, "deps", -1),
                       hasdep=i(el, "hasdep", 0), line=el.sourceline)


def _children(el: etree._Element, tag: str) -> list[etree._Element]:
    """Child elements named ``tag`` (the runtimes skip unknown elements, comments and PIs)."""
    return [child for child in el if child.tag == tag]


def _build(data: bytes, runtime: XmlDialect | None) -> tuple[Program | None, _Builder]:
    builder = _Builder(runtime)
    program = builder.build(_parse(data))
    return program, builder


def read_program(source: str | bytes | os.PathLike, *, runtime: str | None = None,
                 name: str | None = None) -> Program:
    """Read an MSCCL XML program into the IR.

    Parameters
    ----------
    source:
        A path (``os.PathLike``, or a ``str`` without ``<``), or the XML itself (``bytes``, or a
        ``str`` containing ``<``). Files above :data:`MAX_XML_BYTES` are refused before reading.
    runtime:
        ``None``: every integer must be plain decimal. A runtime name: integers are read as that
        runtime reads them (``010`` is 8), so the IR is what it would execute; use
        :func:`text_problems` to hear about such misreadings.
    name:
        What to call the source in error messages (default: the path, or ``<text>``).

    Returns
    -------
    Program
        With ``line`` set on every gpu, tb and step. Unknown elements are skipped, as the
        runtimes do; attributes the runtimes ignore are kept in ``Program.extra``.

    Raises
    ------
    FileFormatError
        Unreadable or malformed XML, a DOCTYPE or ENTITY declaration (refused outright), a root
        element other than ``<algo>``, a missing attribute the IR needs, or (without
        ``runtime``) an integer that is not plain decimal.
    InputTooLargeError
        A file above :data:`MAX_XML_BYTES`.

    >>> text = ('<algo name="a" proto="Simple" nchannels="1" nchunksperloop="1" ngpus="2" '
    ...         'coll="allreduce" inplace="1">\\n</algo>\\n')
    >>> read_program(text).ngpus
    2
    """
    rt = xml_dialect(runtime) if runtime is not None else None
    data, label = _source_bytes(source, name)
    try:
        program, builder = _build(data, rt)
    except _Unreadable as exc:
        raise FileFormatError(label, f"line {exc.line}: {exc.message}" if exc.line else
                              exc.message) from exc
    if program is None:
        message, line = builder.fatal or ("no program", None)
        raise FileFormatError(label, f"line {line}: {message}" if line else message)
    return program


# -- the runtimes' reader, emulated on the raw text ------------------------------------------------


class _Lines:
    """Line numbers of character offsets."""

    def __init__(self, text: str) -> None:
        self._starts = [m.end() for m in re.finditer("\n", text)]

    def __call__(self, offset: int) -> int:
        return bisect.bisect_right(self._starts, offset) + 1


def lexical_problems(text: str) -> list[Problem]:
    """What the runtimes' hand-written reader misreads or refuses in ``text`` (§2).

    Finds: an XML declaration or other processing instruction, character data between elements
    (a byte-order mark included), TAB characters, start tags split over lines, more than
    :data:`MAX_ATTRIBUTES` attributes (the rest are dropped silently), names or values longer
    than :data:`MAX_NAME_CHARS`, spaces around ``=``, values not in double quotes, entity
    references (never decoded), malformed closing tags and unterminated comments or tags.
    Integers and required attributes are :func:`text_problems`' business.

    >>> text = ('<algo name="a" proto="Simple" nchannels="1" nchunksperloop="1" ngpus="2" '
    ...         'coll="allreduce" inplace="1">\\n</algo>\\n')
    >>> [str(p) for p in lexical_problems('<?xml version="1.0"?>\\n' + text)]
    ["line 1: lexical: an XML declaration; the runtimes' reader fails on it ('expected >, got ?')"]
    """
    problems: list[Problem] = []
    line_of = _Lines(text)
    tabs: list[int] = []
    for m in _TOKEN.finditer(text):
        token, start = m.group(0), m.start()
        if token.startswith("<!--"):
            if not token.endswith("-->"):
                problems.append(Problem("lexical", "an unterminated comment", line_of(start)))
            continue
        if "\t" in token:
            # A TAB inside a quoted value is just a character to the reader.
            bare = _QUOTED.sub(lambda q: " " * len(q.group(0)), token) if token[0] == "<" \
                else token
            if "\t" in bare:
                tabs.append(start + bare.index("\t"))
        if token[0] != "<":
            stray = "".join(ch for ch in token if ch not in _WHITESPACE and ch != "\t")
            if stray:
                offset = start + next(i for i, ch in enumerate(token)
                                      if ch not in _WHITESPACE and ch != "\t")
                what = ("a byte-order mark" if stray.startswith("\ufeff")
                        else f"character data {stray[:20]!r}")
                problems.append(Problem("lexical", f"{what} between elements; the runtimes' "
                                                   "reader expects '<' after whitespace",
                                        line_of(offset)))
            continue
        if token.startswith("<?"):
            if token.startswith("<?xml"):
                message = ("an XML declaration; the runtimes' reader fails on it "
                           "('expected >, got ?')")
            else:
                message = "a processing instruction; the runtimes' reader fails on it"
            problems.append(Problem("lexical", message, line_of(start)))
            continue
        if token.startswith("<!"):
            if not _DECLARATION.match(token):   # DOCTYPE/ENTITY: refused by _parse
                problems.append(Problem("lexical", f"{token[:12]!r}...: the runtimes' reader "
                                                   "cannot read <! constructs other than "
                                                   "comments", line_of(start)))
            continue
        if not token.endswith(">"):
            problems.append(Problem("lexical", f"an unterminated tag {token[:30]!r}",
                                    line_of(start)))
            continue
        if token.startswith("</"):
            if not _CLEAN_END.fullmatch(token):
                problems.append(Problem("lexical", f"the closing tag {token!r} must be exactly "
                                                   "</name> (no spaces)", line_of(start)))
            continue
        if _CLEAN_START.fullmatch(token) and len(token) <= MAX_NAME_CHARS and \
                token.count('="') + token.endswith(" />") <= MAX_ATTRIBUTES:
            continue
        problems += _start_tag_problems(token, line_of(start), line_of(start + len(token) - 1))
    if tabs:
        lines = sorted({line_of(t) for t in tabs})
        where = f"on {len(lines)} lines, first" if len(lines) > 1 else "at"
        problems.append(Problem("lexical", f"a TAB character ({where} line {lines[0]}); the "
                                           "runtimes' reader accepts only space, LF and CR as "
                                           "whitespace ('expecting <' / 'expected >, got \\t')",
                                lines[0]))
    problems.sort(key=lambda p: p.line or 0)
    return problems


def _start_tag_problems(tag: str, line: int, last_line: int) -> list[Problem]:
    """Emulate the reader on one start tag: attribute slots, quoting, lengths."""
    problems: list[Problem] = []

    def add(message: str) -> None:
        problems.append(Problem("lexical", message, line))

    name = re.match(r"<([^ />\n\r]*)", tag).group(1)
    if "\n" in tag or "\r" in tag:
        add(f"the start tag of <{name}> spans lines {line}-{last_line}; the runtimes' reader "
            "needs a start tag on one line (it fails with 'expected >, got \\n')")
        tag = tag.replace("\r\n", " ").replace("\n", " ").replace("\r", " ")
    if len(name) > MAX_NAME_CHARS:
        add(f"an element name of {len(name)} characters; the reader holds {MAX_NAME_CHARS}")
    if "&" in tag:
        add(f"an entity or character reference in <{name}>: the runtimes' reader does not decode "
            "it")
    body = tag[1 + len(name):-1]
    slots: list[str] = []
    i = 0
    while i < len(body) and body[i] == " ":
        i += 1
        j = i
        while j < len(body) and body[j] not in " /\n\r=":
            j += 1
        key = body[i:j]
        if j < len(body) and body[j] == "=":
            quote = body[j + 1:j + 2]
            if quote in ('"', "'"):
                k = body.find(quote, j + 2)
                k = len(body) if k < 0 else k
                value = body[j + 2:k]
                if quote == "'":
                    add(f"{key}='{value}' is single-quoted; the runtimes' reader ends a value "
                        "only at a double quote")
                i = k + 1
            else:
                add(f"{key or 'an attribute'}= is not followed by a double-quoted value (no "
                    "spaces around '='); the runtimes' reader stops here")
                return problems
            if len(key) > MAX_NAME_CHARS or len(value) > MAX_NAME_CHARS:
                add(f"attribute {key[:20]!r} of <{name}>: its name or value is longer than the "
                    f"{MAX_NAME_CHARS} characters the reader holds")
            slots.append(key)
        else:
            if key and body[j:j + 2] == " =":
                add(f"a space between {key} and '=' in <{name}>; the reader needs name=\"value\"")
            elif key:
                add(f"attribute {key} of <{name}> has no value")
            slots.append(key)
            i = j
    rest = body[i:]
    if rest and rest != "/" and not rest.startswith("\t"):
        add(f"unexpected {rest[0]!r} in <{name}>: attributes are separated by one space "
            "('expected >')")
    if len(slots) > MAX_ATTRIBUTES:
        dropped = [s for s in slots[MAX_ATTRIBUTES:] if s]
        required = [s for s in dropped if s in _ANY_REQUIRED.get(name, ())]
        what = ", ".join(dropped) if dropped else "empty attribute slots"
        add(f"<{name}> has {len(slots)} attributes (counting empty slots of repeated spaces); "
            f"the runtimes' reader keeps the first {MAX_ATTRIBUTES} and silently drops {what}"
            + (f" (required: {', '.join(required)})" if required else ""))
    return problems


def read_checked(text: str, runtime: str) -> tuple[Program | None, list[Problem]]:
    """Read ``text`` as ``runtime`` would: the program (None if unreadable) and
    :func:`text_problems`, in one parse."""
    rt = xml_dialect(runtime)
    problems = lexical_problems(text)
    try:
        program, builder = _build(text.encode("utf-8"), rt)
    except _Unreadable as exc:
        kind = "lexical" if "XML" in exc.message or "<!" in exc.message else "structure"
        problems.append(Problem(kind, exc.message, exc.line))
        return None, problems
    return program, problems + builder.problems


def text_problems(text: str, runtime: str) -> list[Problem]:
    """:func:`lexical_problems` plus the attribute problems of reading ``text`` for ``runtime``.

    Adds: malformed XML, a DOCTYPE, a first element other than ``<algo>``, attributes
    ``runtime`` requires that are missing, and integers it would misread (octal, hex, trailing
    characters, non-numbers). The static rules of the program itself are not included: see
    :func:`reader_problems` or :func:`collsynth.export.check.check_program`.
    """
    return read_checked(text, runtime)[1]


def reader_problems(text: str, runtime: str) -> list[Problem]:
    """Every problem of ``text`` for ``runtime`` that shows without executing it.

    :func:`text_problems` plus :func:`collsynth.export.check.static_problems` of the program the
    runtime would read (names, ranges, limits, tb ids, peers and channels, connection uniqueness
    and symmetry, operand bounds, dependencies and the ``nop`` rule, rccl's missing fused ops).
    """
    program, problems = read_checked(text, runtime)
    if program is None:
        return problems   # they say why
    return problems + static_problems(program, runtime)


# -- one way in for every consumer ---------------------------------------------------------------

_ALGO_TAG = re.compile(r"<algo\b[^>]*>", re.S)
_RCCL_ONLY_COLLS = ("reducescatter", "gather", "scatter", "send", "recv", "alltoallv")


def infer_runtime(text: str) -> tuple[str, str]:
    """The runtime an MSCCL XML text most likely targets, and why: ``("rccl" | "msccl",
    reason)``. Only rccl-only attributes and spellings say rccl: ``outofplace`` (rccl and
    msccl-executor require it), ``reducescatter``...; ``minBytes``/``maxBytes`` do not (msccl
    reads them too). ``collsynth check`` tries the other runtimes when the guess fails."""
    match = _ALGO_TAG.search(text)
    tag = match.group(0) if match else ""
    if re.search(r"\soutofplace\s*=", tag):
        return "rccl", "it has outofplace"
    coll = re.search(r"\scoll\s*=\s*[\"']([^\"']*)", tag)
    if coll and coll.group(1) in _RCCL_ONLY_COLLS:
        return "rccl", f"coll={coll.group(1)!r} is rccl's spelling"
    return "msccl", "no outofplace attribute or rccl-only spelling"


def load_program(source: str | bytes | os.PathLike, *, runtime: str | None = None,
                 name: str | None = None, execute: bool = True) -> Program:
    """Read an MSCCL XML program to use it (``time``, ``bench``, ``run``, ``draw``): exactly
    what ``collsynth check`` accepts, and nothing else.

    The file goes through the one bounded reader (:func:`read_text`: at most
    :data:`MAX_XML_BYTES`, UTF-8 only), the runtime's reader rules and the static rules
    (:func:`read_checked`, :func:`collsynth.export.check.static_problems`: ``ngpus``,
    ``nchannels``, ``cnt``, operand ranges, <gpu> counts...) and the symbolic execution of
    :func:`collsynth.export.check.check_program` (the collective ``coll`` names, deadlocks,
    races), whose size is bounded before it starts. A postcondition that cannot be checked
    (``coll="custom"``, several roots that fit) does not refuse the program.

    ``runtime``: whose rules apply (default: :func:`infer_runtime`, as ``check`` infers it).
    ``execute=False`` skips the symbolic execution (``collsynth run``, which executes the
    program itself and reports a wrong result as its answer); every other rule applies.

    Raises
    ------
    FileFormatError
        Unreadable, or a program ``check`` refuses: the first problems, one line.
    InputTooLargeError
        A file or a program beyond the bounds above.
    """
    from collsynth.export.check import check_program

    text = read_text(source, name=name)
    is_path = isinstance(source, os.PathLike) or (isinstance(source, str) and "<" not in source)
    label = name or (str(source) if is_path else "<text>")
    rt = runtime if runtime is not None else infer_runtime(text)[0]
    program, problems = read_checked(text, rt)
    if program is not None:
        if execute:
            try:
                report = check_program(program, runtime=rt)
            except InputTooLargeError as exc:   # the execution's size, refused up front
                raise InputTooLargeError(f"{label}: {exc}") from exc
            problems = problems + [p for p in report.problems if not is_unverified(p)]
        else:
            problems = problems + static_problems(program, rt)
    if program is None or problems:
        first = "; ".join(str(p) for p in problems[:3]) or "unreadable"
        more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
        raise FileFormatError(label, f"not a program {rt} runs correctly ('collsynth check "
                                     f"--runtime {rt}' says why): {first}{more}")
    return program
