"""Reading untrusted input files: size-bounded, with one-line errors naming the file."""

from __future__ import annotations

import os
from pathlib import Path

from collsynth.errors import FileFormatError, InputTooLargeError

__all__ = ["read_bytes_bounded"]


def read_bytes_bounded(path: str | os.PathLike[str], max_bytes: int, *, what: str = "a file",
                       label: str | None = None) -> bytes:
    """The bytes of ``path``, refusing more than ``max_bytes`` before reading them (and again
    after, in case the file grew). ``what`` completes "N bytes is more than the M ..." (e.g.
    ``"an MSCCL XML file may have"``); ``label`` names the file in messages (default: the path).

    Raises
    ------
    FileFormatError
        Missing file, a directory, or an OS error.
    InputTooLargeError
        Larger than ``max_bytes``.
    """
    p = Path(path)
    name = label or str(p)

    def refuse(size: int) -> None:
        if size > max_bytes:
            raise InputTooLargeError(f"{name}: {size} bytes is more than the {max_bytes} {what}")

    try:
        size = p.stat().st_size
        refuse(size)
        with p.open("rb") as handle:
            # read(max_bytes + 1) would allocate max_bytes at once (1 GiB for an algorithm file),
            # which a memory ceiling refuses: read what stat says, then more only if it grew
            # (or is not a regular file, whose size stat does not know).
            blocks = [handle.read(min(size, max_bytes) + 1)]
            total = len(blocks[0])
            while blocks[-1] and size < total <= max_bytes:
                blocks.append(handle.read(min(1 << 20, max_bytes + 1 - total)))
                total += len(blocks[-1])
            data = b"".join(blocks)
    except FileNotFoundError as exc:
        raise FileFormatError(name, "no such file") from exc
    except IsADirectoryError as exc:
        raise FileFormatError(name, "is a directory, expected a file") from exc
    except OSError as exc:
        raise FileFormatError(name, f"cannot read: {exc.strerror or exc}") from exc
    refuse(len(data))
    return data
