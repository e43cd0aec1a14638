"""The collsynth collective file format (JSON), version 1: custom collectives, and the collective
stored inside every algorithm file.

A collective is a list of chunks; each chunk says which ranks hold it at the start (``pre``) and
which ranks must hold it at the end (``post``). See :mod:`collsynth.collective.model` for what that
means for a combining collective (``pre`` are the contributors, ``post`` need the sum).

The details: ``docs/file-formats.md``, section "Collective files
(collsynth.collective.fileformat)".
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

from collsynth._parse import clean_name, clean_text, format_version_is, free_form, shown
from collsynth.collective.model import MAX_CHUNKS, Collective
from collsynth.collective.standard import check_standard_conditions
from collsynth.errors import CollsynthError, FileFormatError, InputTooLargeError
from collsynth.topology.fileformat import read_json_file
from collsynth.topology.model import MAX_RANKS

__all__ = ["FORMAT_NAME", "FORMAT_VERSION", "collective_to_json", "collective_from_json",
           "load_collective", "save_collective"]

FORMAT_NAME = "collsynth-collective"
FORMAT_VERSION = 1

_TOP_FIELDS = frozenset({"format", "version", "name", "description", "num_ranks", "combining",
                         "chunk_factor", "roots", "chunks", "metadata"})
_CHUNK_FIELDS = frozenset({"pre", "post"})


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _type_name(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean",
            type(None): "null", int: "an integer", float: "a number"}.get(type(value),
                                                                          type(value).__name__)


def got(value: Any) -> str:
    """How an unexpected JSON value reads in an error message: as written when short, else by
    kind (``a list``) or shortened."""
    try:
        text = json.dumps(value)
    except (TypeError, ValueError, RecursionError):
        text = shown(value)
    if len(text) <= 40:
        return text
    return _type_name(value) if isinstance(value, (list, dict)) else text[:37] + "..."


def jsonable(value: Any) -> Any:
    """``value`` as plain JSON data (dicts, lists, strings, numbers); anything else as a string."""
    return json.loads(json.dumps(value, default=str))


def dumps_readable(obj: Any) -> str:
    """``obj`` as indented JSON (ending in a newline) with every list of numbers on one line and
    every chunk ``{"pre": [...], "post": [...]}`` on one line, so files read as tables.

    Only what the indentation split over several lines is joined; a JSON string never holds a
    raw newline, so no string value is changed.

    >>> print(dumps_readable({"chunks": [{"pre": [0], "post": [1, 2]}], "s": "[1,2]"}), end="")
    {
     "chunks": [
      {"pre": [0], "post": [1, 2]}
     ],
     "s": "[1,2]"
    }
    """
    text = json.dumps(obj, indent=1)
    text = _NUMBER_LIST.sub(lambda m: "[" + ", ".join(x.strip() for x in m.group(1).split(","))
                            + "]", text)
    return _CHUNK_OBJECT.sub(r'{"pre": \1, "post": \2}', text) + "\n"


_NUMBER_LIST = re.compile(r"\[\n\s*(-?\d+(?:,\n\s*-?\d+)*)\n\s*\]")
_CHUNK_OBJECT = re.compile(r'\{\n\s*"pre": (\[[^\]\n]*\]),\n\s*"post": (\[[^\]\n]*\])\n\s*\}')


def collective_to_json(collective: Collective) -> dict[str, Any]:
    """The JSON object for ``collective`` (inverse of :func:`collective_from_json`).

    Every chunk is written explicitly, so a split collective (``chunk_factor > 1``) is stored as
    it is, piece by piece.
    """
    obj: dict[str, Any] = {
        "format": FORMAT_NAME,
        "version": FORMAT_VERSION,
        "name": collective.name,
        "num_ranks": collective.num_ranks,
        "combining": collective.combining,
        "chunk_factor": collective.chunk_factor,
        "roots": list(collective.roots),
        "chunks": [{"pre": sorted(pre), "post": sorted(post)}
                   for pre, post in zip(collective.precondition, collective.postcondition)],
    }
    if collective.metadata:
        obj["metadata"] = jsonable(dict(collective.metadata))
    return obj


def _ranks(value: Any, source: str, where: str, num_ranks: int) -> frozenset[int]:
    """A list of distinct ranks ``0..num_ranks-1``."""
    if not isinstance(value, list):
        raise FileFormatError(source, f"{where}: expected a list of ranks, got {_type_name(value)}")
    seen: set[int] = set()
    for i, rank in enumerate(value):
        if not _is_int(rank):
            raise FileFormatError(source, f"{where}[{i}]: expected a rank (an integer), got "
                                          f"{got(rank)}")
        if not 0 <= rank < num_ranks:
            raise FileFormatError(source, f"{where}[{i}]: rank {rank} is not a rank "
                                          f"0..{num_ranks - 1}")
        if rank in seen:
            raise FileFormatError(source, f"{where}[{i}]: rank {rank} is listed twice")
        seen.add(rank)
    return frozenset(seen)


def collective_from_json(obj: Any, *, source: str = "<collective>",
                         check_standard: bool = True) -> Collective:
    """Build a :class:`Collective` from the parsed JSON object of a collective file.

    ``source`` names the input in error messages (a file path, or ``"x.json: collective"`` for
    the collective inside an algorithm file). A standard name must come with the standard
    conditions (:func:`~collsynth.collective.standard.check_standard_conditions`); a caller
    that checks sizes first passes ``check_standard=False`` and runs that check itself.

    Raises
    ------
    FileFormatError
        On a wrong format or version, a missing field, a field of the wrong type, or a collective
        that breaks a rule (an empty ``pre``, a rank out of range...), naming the field.
    InputTooLargeError
        When ``num_ranks`` exceeds ``MAX_RANKS`` or the chunk list ``MAX_CHUNKS`` (refused before
        the chunks are read).

    Examples
    --------
    >>> from collsynth.collective import broadcast
    >>> obj = collective_to_json(broadcast(4, root=2))
    >>> obj["num_ranks"], obj["roots"], obj["chunks"]
    (4, [2], [{'pre': [2], 'post': [0, 1, 2, 3]}])
    >>> collective_from_json(obj) == broadcast(4, root=2)
    True
    """
    if not isinstance(obj, dict):
        raise FileFormatError(source, f"expected a JSON object at the top level, got "
                                      f"{_type_name(obj)}")
    fmt = obj.get("format", FORMAT_NAME)
    if fmt != FORMAT_NAME:
        raise FileFormatError(source, f"field 'format' is {shown(fmt)}, expected {FORMAT_NAME!r}")
    version = obj.get("version", FORMAT_VERSION)
    if not format_version_is(version, FORMAT_VERSION):
        raise FileFormatError(source, f"unknown version {shown(version)}; this collsynth reads "
                                      f"version {FORMAT_VERSION}")
    unknown = sorted(set(obj) - _TOP_FIELDS)
    if unknown:
        raise FileFormatError(source, f"unknown field {unknown[0]!r}; expected fields: "
                                      f"{', '.join(sorted(_TOP_FIELDS))}")

    def field(key: str, check, expected: str, default: Any = ...) -> Any:
        if key not in obj:
            if default is ...:
                raise FileFormatError(source, f"missing field {key!r}")
            return default
        value = obj[key]
        if not check(value):
            raise FileFormatError(source, f"field {key!r}: expected {expected}, got {got(value)}")
        return value

    name = clean_name(field("name", lambda v: isinstance(v, str) and v.strip() != "",
                            "a non-empty string"), "field 'name'", source=source)
    num_ranks = field("num_ranks", lambda v: _is_int(v) and v >= 1, "a positive integer")
    if num_ranks > MAX_RANKS:
        raise InputTooLargeError(f"{source}: num_ranks = {num_ranks} is more than the {MAX_RANKS} "
                                 "ranks collsynth accepts")
    combining = field("combining", lambda v: isinstance(v, bool), "true or false", False)
    # Each chunk of the file is one piece: there are at least chunk_factor of them.
    chunk_factor = field("chunk_factor", lambda v: _is_int(v) and 1 <= v <= MAX_CHUNKS,
                         f"an integer from 1 to {MAX_CHUNKS}", 1)
    roots_raw = field("roots", lambda v: isinstance(v, list), "a list of ranks", [])
    _ranks(roots_raw, source, "roots", num_ranks)  # order matters (multi-root chunk numbering)
    metadata = free_form(field("metadata", lambda v: isinstance(v, dict), "an object", {}),
                         "metadata", source=source)
    description = clean_text(field("description", lambda v: isinstance(v, str), "a string", ""),
                             "field 'description'", source=source)
    chunks = field("chunks", lambda v: isinstance(v, list), "a list of {\"pre\": [...], "
                   "\"post\": [...]} objects")
    if len(chunks) > MAX_CHUNKS:
        raise InputTooLargeError(f"{source}: {len(chunks)} chunks is more than the {MAX_CHUNKS} "
                                 "collsynth accepts")
    if not chunks:
        raise FileFormatError(source, "field 'chunks' is empty; a collective has at least one "
                                      "chunk")

    pre: list[frozenset[int]] = []
    post: list[frozenset[int]] = []
    for c, chunk in enumerate(chunks):
        where = f"chunks[{c}]"
        if not isinstance(chunk, dict):
            raise FileFormatError(source, f"{where}: expected an object {{\"pre\": [ranks], "
                                          f"\"post\": [ranks]}}, got {_type_name(chunk)}")
        extra = sorted(set(chunk) - _CHUNK_FIELDS)
        if extra:
            raise FileFormatError(source, f"{where}: unknown field {extra[0]!r}; expected 'pre' "
                                          "and 'post'")
        for key in ("pre", "post"):
            if key not in chunk:
                raise FileFormatError(source, f"{where}: missing field {key!r}")
        chunk_pre = _ranks(chunk["pre"], source, f"{where}.pre", num_ranks)
        if not chunk_pre:
            raise FileFormatError(source, f"{where}.pre: empty; at least one rank must start with "
                                          "the chunk")
        pre.append(chunk_pre)
        post.append(_ranks(chunk["post"], source, f"{where}.post", num_ranks))

    if description:
        metadata = {**metadata, "description": description}
    try:
        collective = Collective(name=name, num_ranks=num_ranks, precondition=tuple(pre),
                                postcondition=tuple(post), combining=combining,
                                chunk_factor=chunk_factor, roots=tuple(roots_raw),
                                metadata=metadata)
        if check_standard:
            check_standard_conditions(collective)
    except CollsynthError as exc:  # anything the field checks above did not already catch
        raise FileFormatError(source, str(exc)) from exc
    return collective


def load_collective(path: str | os.PathLike[str]) -> Collective:
    """Read a custom collective JSON file (see docs/file-formats.md for the format).

    Raises
    ------
    FileFormatError
        A missing, unreadable or malformed file, or a field that breaks a rule (naming it).
    InputTooLargeError
        A file above 64 MiB, or sizes beyond ``MAX_RANKS`` / ``MAX_CHUNKS``.
    """
    return collective_from_json(read_json_file(path), source=str(path))


def save_collective(collective: Collective, path: str | os.PathLike[str]) -> None:
    """Write ``collective`` as a JSON file (atomically: a temporary file renamed into place)."""
    from collsynth._atomic import write_text_atomic

    write_text_atomic(path, dumps_readable(collective_to_json(collective)))
