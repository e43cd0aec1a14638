"""The runtime-constants file: :class:`~collsynth.runtimes.RuntimeConstants` as JSON.

The constants themselves and the runtimes' documented values are in :mod:`collsynth.runtimes`;
docs/runtime-model.md describes the file (``collsynth calibrate-runtime -o rt.json``) that
:func:`load_runtime_constants` and :func:`save_runtime_constants` read and write.
"""

from __future__ import annotations

import json
import os
from typing import Any, Mapping

from collsynth._files import read_bytes_bounded
from collsynth._parse import parse_json, shown
from collsynth.errors import CollsynthError, FileFormatError, UnknownNameError
from collsynth.runtimes import RuntimeConstants, get_runtime
from collsynth.runtimes.constants import constants_from_dict, constants_to_dict

__all__ = ["FORMAT", "load_runtime_constants", "save_runtime_constants",
           "is_runtime_constants_file", "runtime_constants_to_json", "runtime_constants_from_json"]

FORMAT = "collsynth-runtime-constants"
_VERSION = 1
_MAX_FILE_BYTES = 1024 * 1024


def runtime_constants_to_json(c: RuntimeConstants) -> dict[str, Any]:
    """The file's content: ``format``, ``version`` and the constants' fields."""
    return {"format": FORMAT, "version": _VERSION, **constants_to_dict(c)}


def runtime_constants_from_json(data: Any, *, label: str = "runtime constants"
                                ) -> RuntimeConstants:
    """The constants a file's content describes (fields missing from it keep the runtime's
    documented defaults, or NCCL's for a runtime collsynth does not know).

    Raises
    ------
    FileFormatError
        A wrong ``format`` or ``version``, or a field of the wrong shape.
    """
    if not isinstance(data, Mapping) or data.get("format") != FORMAT:
        raise FileFormatError(label, f"expected a JSON object with \"format\": \"{FORMAT}\"")
    version = data.get("version")
    if isinstance(version, bool) or version != _VERSION:
        raise FileFormatError(label, "missing field 'version'" if version is None else
                              f"version = {shown(version)}: unknown; this collsynth reads "
                              f"version {_VERSION}")
    fields = {k: v for k, v in data.items() if k not in ("format", "version")}
    runtime = fields.get("runtime")
    try:
        base = get_runtime(runtime).defaults if isinstance(runtime, str) else \
            get_runtime("nccl").defaults
    except UnknownNameError:
        base = get_runtime("nccl").defaults
    return constants_from_dict(fields, base=base, label=label)


def is_runtime_constants_file(path: str | os.PathLike[str]) -> bool:
    """True when ``path`` is a JSON file with this module's ``format`` (False for other
    content).

    Raises
    ------
    FileFormatError, InputTooLargeError
        A file that cannot be read at all (missing, not a regular file, too large): said as
        such, not taken for a file of another format.
    """
    raw = read_bytes_bounded(path, _MAX_FILE_BYTES, what="a calibration file may have")
    try:
        data = parse_json(raw, str(path))
    except CollsynthError:
        return False
    return isinstance(data, Mapping) and data.get("format") == FORMAT


def load_runtime_constants(path: str | os.PathLike[str]) -> RuntimeConstants:
    """Read a runtime-constants file.

    Raises
    ------
    FileFormatError
        Unreadable, not JSON, or not such a file.
    """
    raw = read_bytes_bounded(path, _MAX_FILE_BYTES, what="a runtime-constants file may have")
    data = parse_json(raw, str(path))   # NaN, Infinity, 1e999, deep nesting: refused
    return runtime_constants_from_json(data, label=str(path))


def save_runtime_constants(c: RuntimeConstants, path: str | os.PathLike[str]) -> None:
    """Write ``c`` to ``path`` (atomically)."""
    from collsynth._output import write_text_atomic

    write_text_atomic(path, json.dumps(runtime_constants_to_json(c), indent=1) + "\n")
