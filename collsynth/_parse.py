"""Bounds on the numbers, names and nesting of untrusted input, shared by every reader.

Every file reader (topology, collective, algorithm and calibration JSON; the nvidia-smi, rocm-smi
and NCCL XML importers; MSCCL XML; benchmark logs; traces) passes what it reads through these
helpers before using it, so a hostile or broken file gets a one-line
:class:`~collsynth.errors.FileFormatError` naming the file and the field, never an
``OverflowError``, a ``ValueError`` from ``int()`` (more than 4300 digits), an infinity or NaN, or
a NUL in a name. The plausible ranges are named below, each with the reason for its figure.
"""

from __future__ import annotations

import json
import math
import os
import re
import unicodedata
from fractions import Fraction
from pathlib import Path
from typing import Any

from collsynth._files import read_bytes_bounded
from collsynth.errors import FileFormatError

__all__ = [
    "format_version_is",
    "fraction_from_text",
    "MAX_NUMBER_CHARS",
    "MAX_INT64",
    "MAX_NAME_CHARS",
    "MAX_JSON_DEPTH",
    "MAX_LINK_UNITS",
    "MAX_TIME_US",
    "MIN_TIME_US",
    "MIN_LATENCY_US",
    "MAX_SIZE_BYTES",
    "MAX_GBPS",
    "MIN_GBPS",
    "shown",
    "decode_text",
    "parse_json",
    "read_json",
    "bounded_int",
    "bounded_float",
    "int_from_text",
    "float_from_text",
    "NumberTextError",
    "number_text",
    "DECIMAL_UNITS",
    "BINARY_UNITS",
    "SIZE_UNITS",
    "size_from_text",
    "clean_name",
    "clean_text",
    "free_form",
]

#: Longest number literal read anywhere (JSON number, XML attribute, log cell), in characters.
#: A 64-bit integer has 20 characters and a float written by ``repr`` at most 24; Python's
#: ``int()`` refuses more than 4300 digits with a bare ``ValueError`` and converting a long one
#: takes time quadratic in its length, so a longer literal is refused before conversion.
MAX_NUMBER_CHARS = 100
#: Largest integer a reader passes on: the signed 64-bit range that numpy arrays, CP-SAT
#: coefficients and the runtimes' ``strtol`` hold. Fields have tighter bounds of their own.
MAX_INT64 = (1 << 63) - 1
#: Longest name (topology, collective, algorithm, GPU, NIC): names end up in file names, whose
#: components hold 255 bytes on common file systems.
MAX_NAME_CHARS = 255
#: Deepest nesting of the free-form parts of a file (``metadata``, ``provenance``). Real files
#: nest 4 levels; writing a structure back (``json.dumps``) fails near Python's recursion limit.
MAX_JSON_DEPTH = 64
#: Most bandwidth units of one link in a topology. Units are relative (one NVLink, one NIC, the
#: slowest link); no machine spans a factor of 10^6 between its fastest and slowest link, and
#: with 8192 ranks sums of units stay far inside the 64-bit integers of the solvers.
MAX_LINK_UNITS = 1 << 20
#: Longest time one collective call may take, in microseconds: one hour. A measured call that
#: took longer is a hang or a typo (1e308 us would give an alpha of 1e154 us), not a figure to fit.
MAX_TIME_US = 3600.0 * 1e6
#: Shortest time one collective call may take, in microseconds: one nanosecond (a kernel launch
#: alone takes microseconds). Less is a unit mistake, e.g. seconds in a microseconds column, and
#: near 1e-308 the fits divide by zero.
MIN_TIME_US = 1e-3
#: Smallest latency that is not 0, us: one picosecond (light crosses 0.3 mm). A smaller one is
#: a unit mistake or a denormal (1e-320), whose reciprocals overflow the simulator's floats and
#: whose exact value is a fraction of 600 digits (a crossover size printed with them). The floor
#: of a topology's ``alpha_us`` (file, ``NAME,alpha_us=``, ``--alpha-us``) and of the runtime
#: constants' latencies (:mod:`collsynth.runtimes.constants`).
MIN_LATENCY_US = 1e-6
#: Largest message or buffer, in bytes: 2^50 (1 PiB), thousands of times the memory of any GPU
#: (288 GB for a B300); sums and products of such sizes stay inside 64-bit byte counts.
MAX_SIZE_BYTES = 1 << 50
#: Fastest bandwidth of one link or bandwidth unit, in GB/s: 10^6 (1 PB/s), a thousand times an
#: NVLink 5 GPU's 900 GB/s. Beyond it the alpha-beta models lose every digit of beta.
MAX_GBPS = 1e6
#: Slowest bandwidth of one unit, in GB/s: 1 kB/s; slower figures are unit mistakes.
MIN_GBPS = 1e-6


class _Refused(Exception):
    """Raised inside ``json.loads`` hooks; turned into a FileFormatError naming the file.
    ``token`` is the refused text, to find its line (the hooks are not told where they are)."""

    def __init__(self, message: str, token: str) -> None:
        super().__init__(message)
        self.token = token


def _outside_strings(text: str, token: str) -> int:
    """Offset of the first ``token`` in ``text`` that is not inside a JSON string, or -1."""
    i, n = 0, len(text)
    while i < n:
        at = text.find(token, i)
        quote = text.find('"', i)
        if at < 0 or quote < 0 or at < quote:
            return at
        i = quote + 1  # skip the string: to its closing quote, past escapes
        while i < n and text[i] != '"':
            i += 2 if text[i] == "\\" else 1
        i += 1
    return -1


def shown(value: Any, limit: int = 40) -> str:
    """``value`` as it reads in an error message, kept short (a 5000-digit integer has no
    ``repr`` in Python: it reads as ``an integer of about 5000 digits``).

    >>> shown(10 ** 30), shown(10 ** 5000)
    ('1000000000000000000000000000000', 'an integer of about 5000 digits')
    >>> shown("a" * 100)
    "'aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa..."
    """
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 128:
        return f"an integer of about {round(value.bit_length() * math.log10(2))} digits"
    if isinstance(value, (list, dict)):
        return f"a list of {len(value)}" if isinstance(value, list) else "an object"
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _where(data: bytes, offset: int) -> str:
    line = data.count(b"\n", 0, offset) + 1
    column = offset - (data.rfind(b"\n", 0, offset) + 1) + 1
    return f"line {line} column {column}"


# Every digit maps to "0", so a run of digits is a run of "0"s that bytes.find sees at C speed
# (a regex scan costs 5x more on a 1 GB algorithm file).
_DIGITS_TO_ZERO = bytes.maketrans(b"123456789", b"000000000")
_TOO_MANY_DIGITS = b"0" * (MAX_NUMBER_CHARS + 1)


def _refuse_constant(name: str) -> Any:
    raise _Refused(f"{name} is not a number JSON allows (write a finite number or null)", name)


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An object's members as a dict, refusing a key given twice (Python's ``json`` keeps the
    last silently, other readers the first: the file would mean different things)."""
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _Refused(f"the key {shown(key)} appears twice in one object; a key "
                               "names one value", "")
            seen.add(key)
    return obj


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _Refused(f"the number {text[:30]} is beyond the range of a float", text)
    return value


#: Byte-order marks of the encodings that are not UTF-8, longest first (UTF-32 LE starts
#: with UTF-16 LE's).
_OTHER_BOMS = ((b"\xff\xfe\x00\x00", "UTF-32"), (b"\x00\x00\xfe\xff", "UTF-32"),
               (b"\xff\xfe", "UTF-16"), (b"\xfe\xff", "UTF-16"))


_NEWLINE = b"\n"


def decode_text(data: bytes, source: str, *, prefix: str = "") -> str:
    r"""``data`` decoded as UTF-8, less a leading UTF-8 byte-order mark (Windows editors write
    one). ``prefix`` starts messages (e.g. ``"line 3: "``).

    Raises
    ------
    FileFormatError
        UTF-16 or UTF-32 text (by its byte-order mark; the message says how to convert it), or
        bytes that are not UTF-8 (naming the line and byte).

    >>> decode_text(b"\xef\xbb\xbfsize_bytes,time_us", "a.csv")
    'size_bytes,time_us'
    >>> decode_text("size".encode("utf-16"), "a.csv")
    Traceback (most recent call last):
    ...
    collsynth.errors.FileFormatError: a.csv: UTF-16 text (it starts with a UTF-16 byte-order
    mark); collsynth reads UTF-8: convert it (iconv -f UTF-16 -t UTF-8)
    """
    for bom, encoding in _OTHER_BOMS:
        if data.startswith(bom):
            raise FileFormatError(source, f"{prefix}{encoding} text (it starts with a "
                                          f"{encoding} byte-order mark); collsynth reads UTF-8: "
                                          f"convert it (iconv -f {encoding} -t UTF-8)")
    skip = 3 if data.startswith(b"\xef\xbb\xbf") else 0
    try:
        return data[skip:].decode("utf-8")
    except UnicodeDecodeError as exc:
        at = exc.start + skip
        where = "" if prefix else f"line {data.count(_NEWLINE, 0, at) + 1}: "
        raise FileFormatError(source, f"{prefix}{where}not UTF-8 text ({exc.reason} at byte "
                                      f"{at})") from exc


def parse_json(data: bytes | str, source: str, *, line: int | None = None) -> Any:
    """Parse JSON text of ``source`` refusing what Python's ``json`` lets through: ``NaN`` and
    ``Infinity``, floats that overflow to infinity (``1e999``), numbers of more than
    :data:`MAX_NUMBER_CHARS` digits, a key given twice in one object, and nesting beyond
    Python's recursion limit.

    ``line``, for one line of a JSON-lines file, is that line's number: messages then start
    with ``line N:`` and give the column only.

    Raises
    ------
    FileFormatError
        Not UTF-8, malformed JSON (with line and column), or one of the above.

    >>> parse_json('{"a": [1, 2.5]}', "x.json")
    {'a': [1, 2.5]}
    >>> parse_json('{"a": NaN}', "x.json")
    Traceback (most recent call last):
    ...
    collsynth.errors.FileFormatError: x.json: line 1 column 7: NaN is not a number JSON allows ...
    """
    prefix = "" if line is None else f"line {line}: "
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data
    at = raw.translate(_DIGITS_TO_ZERO).find(_TOO_MANY_DIGITS)
    if at >= 0:
        where = _where(raw, at) if line is None else f"column {at + 1}"
        raise FileFormatError(source, f"{prefix}{where}: a number of more than "
                                      f"{MAX_NUMBER_CHARS} digits; numbers have at most "
                                      f"{MAX_NUMBER_CHARS}")
    if isinstance(data, str):
        text = data.removeprefix("\ufeff")
    else:
        text = decode_text(data, source, prefix=prefix)
    if not text.strip():
        raise FileFormatError(source, f"{prefix}empty: expected JSON")
    try:
        return json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float,
                          object_pairs_hook=_unique_keys)
    except json.JSONDecodeError as exc:
        where = f"column {exc.colno}" if line is not None else \
            f"line {exc.lineno} column {exc.colno}"
        raise FileFormatError(source, f"{prefix}malformed JSON at {where}: {exc.msg}") from exc
    except _Refused as exc:
        at = _outside_strings(text, exc.token) if exc.token else -1
        where = "" if at < 0 else (f"column {at - text.rfind(chr(10), 0, at)}: " if line is not None
                                   else _where(text.encode("utf-8", "surrogatepass"),
                                               len(text[:at].encode("utf-8", "surrogatepass")))
                                   + ": ")
        raise FileFormatError(source, f"{prefix}{where}{exc}") from exc
    except RecursionError as exc:
        raise FileFormatError(source, f"{prefix}JSON nested too deeply") from exc
    except ValueError as exc:  # int() of a long number, should the scan above ever miss one
        raise FileFormatError(source, f"{prefix}unreadable number: {exc}") from exc


def read_json(path: str | os.PathLike[str], *, max_bytes: int, what: str = "accepted") -> Any:
    """Read ``path`` (refused above ``max_bytes`` before reading) and :func:`parse_json` it.

    ``what`` completes the size message: "N bytes is more than the M {what}".
    """
    return parse_json(read_bytes_bounded(path, max_bytes, what=what), str(path))


def _range_text(lo: float | None, hi: float | None) -> str:
    if lo is not None and hi is not None:
        return f"from {lo:g} to {hi:g}" if isinstance(lo, float) or isinstance(hi, float) \
            else f"from {lo} to {hi}"
    if lo is not None:
        return f">= {lo}"
    return f"<= {hi}"


def bounded_int(value: Any, field: str, *, source: str, lo: int | None = 0,
                hi: int | None = MAX_INT64, why: str = "") -> int:
    """``value`` when it is an integer (not a boolean) within ``[lo, hi]`` (``None``: no bound).

    ``why`` is added to the message of a value out of range (e.g. ``"more NVLinks than a GPU
    has"``).

    Raises
    ------
    FileFormatError
        ``source: field = VALUE: expected a whole number from LO to HI``.

    >>> bounded_int(7, "steps", source="a.json", lo=1, hi=10)
    7
    >>> bounded_int(2 ** 63, "links[0][1]", source="t.json", hi=10 ** 6)
    Traceback (most recent call last):
    ...
    collsynth.errors.FileFormatError: t.json: links[0][1] = 9223372036854775808: expected a whole
    number from 0 to 1000000
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise FileFormatError(source, f"{field} = {shown(value)}: expected a whole number "
                                      f"{_range_text(lo, hi)}")
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        raise FileFormatError(source, f"{field} = {shown(value)}: expected a whole number "
                                      f"{_range_text(lo, hi)}" + (f" ({why})" if why else ""))
    return value


def bounded_float(value: Any, field: str, *, source: str, lo: float | None = None,
                  hi: float | None = None, above: float | None = None, why: str = "") -> float:
    """``value`` as a float when it is a finite number (an int or a float, not a boolean) within
    ``[lo, hi]``, and above ``above`` when given (an open lower bound).

    Compared before conversion, so an integer of 400 digits is refused rather than raising
    ``OverflowError``.

    >>> bounded_float(25, "unit_gbps", source="t.json", above=0, hi=1e6)
    25.0
    >>> bounded_float(float("inf"), "alpha_us", source="t.json", above=0, hi=3.6e9)
    Traceback (most recent call last):
    ...
    collsynth.errors.FileFormatError: t.json: alpha_us = inf: expected a finite number > 0 and
    <= 3.6e+09
    """
    parts = ([f"> {above:g}"] if above is not None else []) + \
        ([f">= {lo:g}"] if lo is not None else []) + ([f"<= {hi:g}"] if hi is not None else [])
    expected = "a finite number" + (" " + " and ".join(parts) if parts else "")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or \
            (isinstance(value, float) and not math.isfinite(value)):
        raise FileFormatError(source, f"{field} = {shown(value)}: expected {expected}")
    if (above is not None and not value > above) or (lo is not None and value < lo) or \
            (hi is not None and value > hi):
        raise FileFormatError(source, f"{field} = {shown(value)}: expected {expected}"
                                      + (f" ({why})" if why else ""))
    return float(value)


class NumberTextError(ValueError):
    """A number's text refused by :func:`number_text`; the message says why, to follow
    ``expected ..., got 'TEXT'``."""


def format_version_is(value: object, *accepted: int) -> bool:
    """Whether a file's ``version`` field is one of ``accepted``: a JSON whole number, not
    ``true`` (which Python counts as 1) nor ``1.0`` (equal to 1, but not a version any writer
    puts there).

    >>> format_version_is(1, 1), format_version_is(1.0, 1), format_version_is(True, 1)
    (True, False, False)
    """
    return type(value) is int and value in accepted


def number_text(text: str) -> str:
    """``text`` less blanks at its ends, when it is a number as collsynth reads them everywhere
    (command-line options, topology names, file fields): ASCII characters only, no ``_``, at most
    :data:`MAX_NUMBER_CHARS` characters. Python's ``int()`` and ``float()`` also read any
    script's digits (``'٣'`` is 3, ``'３'`` too), ``_`` between digits (``'1_000'``) and Unicode
    blanks around them; no runtime, benchmark or NCCL variable writes those, so a number that has
    them is a typo or a paste from elsewhere, refused rather than read as something else. Whether
    the rest is a number is left to ``int()`` or ``float()``.

    Raises
    ------
    NumberTextError
        Naming the character refused.

    >>> number_text(" 12 ")
    '12'
    >>> number_text("1_000")
    Traceback (most recent call last):
    ...
    collsynth._parse.NumberTextError: numbers take no '_' separators (write 1000, not 1_000)
    """
    for ch in text:
        if ch == "_":
            raise NumberTextError("numbers take no '_' separators (write 1000, not 1_000)")
        if not ch.isascii():
            what = unicodedata.name(ch, f"U+{ord(ch):04X}")
            raise NumberTextError(f"{ch!r} ({what}) is not ASCII; numbers are written with the "
                                  "digits 0-9")
    stripped = text.strip()
    if len(stripped) > MAX_NUMBER_CHARS:
        raise NumberTextError(f"a number of {len(stripped)} characters; numbers have at most "
                              f"{MAX_NUMBER_CHARS}")
    return stripped


#: Units of a size, case-sensitive: decimal (KB = 1000 bytes) and binary (KiB = 1024 bytes).
DECIMAL_UNITS = {"B": 1, "kB": 10**3, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}
BINARY_UNITS = {"KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}
SIZE_UNITS = {**DECIMAL_UNITS, **BINARY_UNITS}
_SIZE_TEXT = re.compile(r"\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([A-Za-z]*)\s*", re.ASCII)
#: A number written with an exponent (``1e30``, ``2.5E+9``), which sizes do not take.
_EXPONENT = re.compile(r"[0-9.][eE][+-]?[0-9]", re.ASCII)


def size_from_text(text: str) -> int:
    """Bytes written as ``text``: a number and an optional unit of :data:`SIZE_UNITS`
    (``"1KB"`` = 1000, ``"1 KiB"`` = 1024, ``"512"`` = 512), from 1 to :data:`MAX_SIZE_BYTES`.
    The one rule for sizes a person types (``--sizes``, ``--memory-limit``, the
    ``COLLSYNTH_MEMORY_LIMIT`` variable); callers name the option or variable in their error.

    Raises
    ------
    NumberTextError
        Saying why, to follow ``size 'TEXT': ``: what :func:`number_text` refuses, ambiguous
        units (``1K``, ``1m``, ``1mb``: bytes or bits, 1000 or 1024?), unknown ones, an exponent,
        a sign, a size below one byte, beyond :data:`MAX_SIZE_BYTES` or not a whole number of
        bytes.

    >>> size_from_text("1KB"), size_from_text("1 KiB"), size_from_text("1.5MB")
    (1000, 1024, 1500000)
    >>> size_from_text("1K")
    Traceback (most recent call last):
    ...
    collsynth._parse.NumberTextError: ambiguous unit 'K': write KB (10**3 bytes) or KiB (2**10 bytes)
    """
    number_text(text)
    match = _SIZE_TEXT.fullmatch(text)
    if not match:
        if _EXPONENT.search(text):
            raise NumberTextError("an exponent is not a size: write the digits or a unit, "
                                  "like 1000000 or 1MB")
        raise NumberTextError("expected a number and a unit, like 1KB, 64MiB or 512")
    number, unit = match.group(1), match.group(2) or "B"
    if unit not in SIZE_UNITS:
        upper = unit.upper()
        if upper in ("K", "M", "G", "T"):
            power = "KMGT".index(upper) + 1
            raise NumberTextError(f"ambiguous unit {unit!r}: write {upper}B (10**{3 * power} "
                                  f"bytes) or {upper}iB (2**{10 * power} bytes)")
        if upper in ("KB", "MB", "GB", "TB", "KIB", "MIB", "GIB", "TIB", "B"):
            raise NumberTextError(f"ambiguous unit {unit!r}: bytes or bits? units are "
                                  f"case-sensitive: write one of {', '.join(SIZE_UNITS)}")
        raise NumberTextError(f"unknown unit {unit!r}; use one of {', '.join(SIZE_UNITS)}")
    value = Fraction(number) * SIZE_UNITS[unit]
    if value.denominator != 1:
        raise NumberTextError("not a whole number of bytes")
    if value < 1:
        raise NumberTextError("expected at least 1 byte")
    if value > MAX_SIZE_BYTES:
        raise NumberTextError(f"more than 1 PiB ({MAX_SIZE_BYTES} bytes)")
    return int(value)


def _file_number_text(text: str, field: str, source: str) -> str:
    """:func:`number_text` for a file's ``field``: its refusals as :class:`FileFormatError`
    naming ``source`` and the field (a long literal named by its length, not echoed)."""
    if len(text.strip()) > MAX_NUMBER_CHARS:
        raise FileFormatError(source, f"{field}: a number of {len(text.strip())} characters; "
                                      f"numbers have at most {MAX_NUMBER_CHARS}")
    try:
        return number_text(text)
    except NumberTextError as exc:
        raise FileFormatError(source, f"{field} = {shown(text)}: {exc}") from None


def int_from_text(text: str, field: str, *, source: str, lo: int | None = 0,
                  hi: int | None = MAX_INT64, base: int = 10, why: str = "") -> int:
    """The integer written as ``text`` (decimal, or ``base``; surrounding blanks ignored),
    refusing what :func:`number_text` refuses (other scripts' digits, ``_``, a literal longer
    than :data:`MAX_NUMBER_CHARS`) before converting it.

    >>> int_from_text(" 12 ", "count", source="t.xml", hi=18)
    12
    >>> int_from_text("1e20", "count", source="t.xml")
    Traceback (most recent call last):
    ...
    collsynth.errors.FileFormatError: t.xml: count = '1e20': expected a whole number from 0 to ...
    """
    stripped = _file_number_text(text, field, source)
    try:
        value = int(stripped, base)
    except ValueError:
        raise FileFormatError(source, f"{field} = {shown(text)}: expected a whole number "
                                      f"{_range_text(lo, hi)}") from None
    return bounded_int(value, field, source=source, lo=lo, hi=hi, why=why)


def float_from_text(text: str, field: str, *, source: str, lo: float | None = None,
                    hi: float | None = None, above: float | None = None, why: str = "") -> float:
    """The finite number written as ``text``, within the bounds of :func:`bounded_float`,
    refusing what :func:`number_text` refuses.

    >>> float_from_text("1e308", "time", source="log.txt", above=0, hi=MAX_TIME_US)
    Traceback (most recent call last):
    ...
    collsynth.errors.FileFormatError: log.txt: time = 1e+308: expected a finite number > 0 and
    <= 3.6e+09
    """
    stripped = _file_number_text(text, field, source)
    try:
        value = float(stripped)
    except ValueError:
        raise FileFormatError(source, f"{field} = {shown(text)}: expected a number") from None
    return bounded_float(value, field, source=source, lo=lo, hi=hi, above=above, why=why)


def printable_name(text: str, *, max_chars: int = MAX_NAME_CHARS,
                   default: str = "collsynth") -> str:
    """``text`` as a name :func:`clean_name` accepts: control, format and surrogate characters
    replaced by ``_``, blanks at the ends dropped, at most ``max_chars`` characters (``default``
    when nothing is left). For names the user gives a writer, which must not write what its own
    reader refuses.

    >>> printable_name("a\\nb "), printable_name(" "), len(printable_name("x" * 300))
    ('a_b', 'collsynth', 255)
    """
    cleaned = "".join("_" if unicodedata.category(ch) in ("Cc", "Cf", "Cs") else ch
                      for ch in text).strip()
    return cleaned[:max_chars].rstrip() or default


def _bad_character(text: str, allowed: str = "") -> str | None:
    """The first control, format (bidirectional override, zero-width) or surrogate character of
    ``text`` not in ``allowed``, described; else None."""
    for index, ch in enumerate(text):
        if unicodedata.category(ch) in ("Cc", "Cf", "Cs") and ch not in allowed:
            name = "NUL" if ch == "\0" else f"U+{ord(ch):04X}"
            return f"a control character ({name}) at position {index}"
    return None


def clean_name(value: Any, field: str, *, source: str, max_chars: int = MAX_NAME_CHARS,
               empty: bool = False) -> str:
    """``value`` when it is a string of at most ``max_chars`` characters without control,
    format (bidirectional overrides, zero-width) or surrogate characters; not empty unless
    ``empty``.

    >>> clean_name("DGX1", "name", source="t.json")
    'DGX1'
    >>> clean_name("a\\x00b", "name", source="t.json")
    Traceback (most recent call last):
    ...
    collsynth.errors.FileFormatError: t.json: name = 'a\\x00b': a control character (NUL) at
    position 1; names are printable text
    """
    if not isinstance(value, str):
        raise FileFormatError(source, f"{field} = {shown(value)}: expected a string")
    if not empty and not value.strip():
        raise FileFormatError(source, f"{field} is empty; expected a name")
    if len(value) > max_chars:
        raise FileFormatError(source, f"{field}: a name of {len(value)} characters; names have at "
                                      f"most {max_chars}")
    bad = _bad_character(value)
    if bad is not None:
        raise FileFormatError(source, f"{field} = {shown(value)}: {bad}; names are printable "
                                      "text")
    return value


_FRACTION_TEXT = re.compile(r"\s*[0-9]{1,40}(?:\.[0-9]{1,40}|/[0-9]{1,40})?\s*", re.ASCII)


def fraction_from_text(text: Any) -> Fraction | None:
    """A non-negative exact number a file writes as text (``"7/6"``, ``"2"``, ``"1.5"``), or
    ``None`` for anything else: no exponent (``Fraction("1e100000000")`` computes 10^(10^8)
    digit by digit, minutes of CPU) and at most 40 digits a part.

    >>> fraction_from_text("7/6"), fraction_from_text("1e100000000"), fraction_from_text("1/0")
    (Fraction(7, 6), None, None)
    """
    if not isinstance(text, str) or _FRACTION_TEXT.fullmatch(text) is None:
        return None
    try:
        return Fraction(text.strip())
    except ZeroDivisionError:
        return None


def name_from_file(path: str | os.PathLike[str], *, max_chars: int = MAX_NAME_CHARS) -> str:
    """A printable name from a file's name (its stem): control, format and surrogate characters
    become ``?`` and the result is cut to ``max_chars``. A user may name a file anything; the
    name then travels into tables, JSON and XML attributes, so it is made safe, not refused.

    >>> name_from_file("/tmp/node\x1b[2J.topo.txt")
    'node?[2J.topo'
    """
    stem = Path(path).stem
    safe = "".join("?" if unicodedata.category(ch) in ("Cc", "Cf", "Cs") else ch for ch in stem)
    return safe[:max_chars] or "topology"


def clean_text(value: Any, field: str, *, source: str, max_chars: int = 4096) -> str:
    """``value`` when it is a string (a description, a site) of at most ``max_chars``
    characters without NUL or other control characters but TAB and newlines.

    >>> clean_text("8 GPUs\\n(V100)", "description", source="t.json")
    '8 GPUs\\n(V100)'
    """
    if not isinstance(value, str):
        raise FileFormatError(source, f"{field} = {shown(value)}: expected a string")
    if len(value) > max_chars:
        raise FileFormatError(source, f"{field}: a text of {len(value)} characters; at most "
                                      f"{max_chars}")
    bad = _bad_character(value, allowed="\t\n\r")
    if bad is not None:
        raise FileFormatError(source, f"{field} = {shown(value)}: {bad}")
    return value


def free_form(value: Any, field: str, *, source: str, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """``value`` (a free-form part of a file: ``metadata``, ``provenance``) when it nests at
    most ``max_depth`` levels and its strings are valid Unicode (no lone surrogate, which could
    not be written back as UTF-8).

    >>> free_form({"a": [1, {"b": None}]}, "metadata", source="t.json")
    {'a': [1, {'b': None}]}
    """
    stack = [(value, 1, field)]
    while stack:
        item, depth, where = stack.pop()
        if isinstance(item, str):
            if any(0xD800 <= ord(ch) <= 0xDFFF for ch in item):
                raise FileFormatError(source, f"{where}: a string with a lone surrogate "
                                              "(\\udXXX); not valid Unicode")
            continue
        if not isinstance(item, (list, dict)):
            continue
        if depth > max_depth:
            raise FileFormatError(source, f"{field}: nested more than {max_depth} levels deep")
        if isinstance(item, dict):
            for key, child in item.items():
                stack.append((key, depth, where))
                stack.append((child, depth + 1, f"{where}.{key}" if isinstance(key, str)
                              else where))
        else:
            stack.extend((child, depth + 1, f"{where}[{i}]") for i, child in enumerate(item))
    return value
