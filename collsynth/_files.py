"""Opening untrusted input files: regular files only, size-bounded, one-line errors naming them.

Every reader opens its input through :func:`open_input` (or :func:`read_bytes_bounded`,
:func:`read_head`, :func:`list_inputs`), which refuses a FIFO, device, socket or folder
*before* reading: a FIFO would block forever, ``/dev/zero`` never ends. The path is stat'ed
first, then opened with ``O_NONBLOCK`` (so opening a FIFO put there meanwhile cannot block) and
fstat'ed again, so what is read is what was checked. No command reads standard input. The
rules: docs/file-formats.md, section "Input files".
"""

from __future__ import annotations

import errno
import os
import re
import stat
from pathlib import Path
from typing import BinaryIO

from collsynth.errors import FileFormatError, InputTooLargeError, expect_path, shown_path

__all__ = ["check_input_file", "open_input", "read_bytes_bounded", "read_head", "list_inputs"]

_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISDIR, "a directory"))


def _refuse_kind(name: str, mode: int) -> None:
    if stat.S_ISREG(mode):
        return
    kind = next((text for test, text in _KINDS if test(mode)), "not a regular file")
    raise FileFormatError(name, f"is {kind}, expected a regular file (collsynth reads only "
                                "regular files)")


def _os_error(name: str, exc: OSError | ValueError) -> FileFormatError:
    if isinstance(exc, OSError) and exc.errno == errno.ELOOP:
        return FileFormatError(name, "cannot read: a loop of symbolic links (each points on to "
                                     "the next, never to a file or folder)")
    if isinstance(exc, FileNotFoundError):
        if isinstance(exc.filename, (str, bytes, os.PathLike)) and os.path.islink(exc.filename):
            return FileFormatError(name, "cannot read: a symbolic link to a missing file")
        return FileFormatError(name, "no such file")
    if isinstance(exc, NotADirectoryError):
        return FileFormatError(name, "a parent of it is a file, not a directory")
    if isinstance(exc, ValueError):  # a NUL in the path
        return FileFormatError(name, f"cannot be opened: {exc}")
    return FileFormatError(name, f"cannot read: {exc.strerror or exc}")


def check_input_file(path: str | os.PathLike[str], *, label: str | None = None) -> os.stat_result:
    """Check, without opening it, that ``path`` is (a link to) a regular file; return its stat.

    Raises
    ------
    FileFormatError
        Missing, a FIFO, device, socket or directory, or an OS error; names the file.
    """
    name = label or expect_path(path)
    try:
        info = os.stat(path)
    except (OSError, ValueError) as exc:
        raise _os_error(name, exc) from exc
    _refuse_kind(name, info.st_mode)
    return info


def open_input(path: str | os.PathLike[str], *, label: str | None = None) -> BinaryIO:
    """Open ``path`` for reading in binary mode if it is (a link to) a regular file.

    Checked with ``stat`` first, then opened without blocking (``O_NONBLOCK``) and checked again
    on the open descriptor, so a FIFO swapped in between is refused too, never waited on.

    Raises
    ------
    FileFormatError
        As :func:`check_input_file`.
    """
    name = label or expect_path(path)
    check_input_file(path, label=name)
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0) \
        | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_BINARY", 0)
    try:
        fd = os.open(path, flags)
    except (OSError, ValueError) as exc:
        raise _os_error(name, exc) from exc
    try:
        _refuse_kind(name, os.fstat(fd).st_mode)
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_bytes_bounded(path: str | os.PathLike[str], max_bytes: int, *, what: str = "a file",
                       label: str | None = None) -> bytes:
    """The bytes of the regular file ``path``, refusing more than ``max_bytes`` before reading
    them (and again after, in case the file grew). ``what`` completes "N bytes is more than the
    M ..." (e.g. ``"an MSCCL XML file may have"``); ``label`` names the file in messages
    (default: the path).

    Raises
    ------
    FileFormatError
        Missing file, not a regular file (:func:`open_input`), or an OS error.
    InputTooLargeError
        Larger than ``max_bytes``.
    """
    name = label or expect_path(path)

    def refuse(size: int) -> None:
        if size > max_bytes:
            raise InputTooLargeError(f"{shown_path(name)}: {size} bytes is more than the "
                                     f"{max_bytes} {what}")

    with open_input(path, label=name) as handle:
        try:
            size = os.fstat(handle.fileno()).st_size
            refuse(size)
            # read(max_bytes + 1) would allocate max_bytes at once (1 GiB for an algorithm
            # file), which a memory ceiling refuses: read what stat says, then more only if the
            # file grew meanwhile.
            blocks = [handle.read(min(size, max_bytes) + 1)]
            total = len(blocks[0])
            while blocks[-1] and size < total <= max_bytes:
                blocks.append(handle.read(min(1 << 20, max_bytes + 1 - total)))
                total += len(blocks[-1])
        except OSError as exc:
            raise _os_error(name, exc) from exc
    data = b"".join(blocks)
    refuse(len(data))
    return data


def read_head(path: str | os.PathLike[str], max_bytes: int, *,
              label: str | None = None) -> bytes:
    """The first ``max_bytes`` bytes of the regular file ``path`` (to sniff its format).

    Raises
    ------
    FileFormatError
        As :func:`open_input`.
    """
    name = label or expect_path(path)
    with open_input(path, label=name) as handle:
        try:
            return handle.read(max_bytes)
        except OSError as exc:
            raise _os_error(name, exc) from exc


def list_inputs(directory: str | os.PathLike[str], pattern: str | re.Pattern[str], *,
                what: str = "an input file") -> list[Path]:
    """The entries of ``directory`` whose names match ``pattern`` in full, sorted by name; each
    must be (a link to) a regular file. Other names are ignored.

    Raises
    ------
    FileFormatError
        ``directory`` missing or not a directory; a matching entry that is not a regular file
        (a FIFO named like a trace file is refused, never opened).
    """
    folder = Path(directory)
    regex = re.compile(pattern) if isinstance(pattern, str) else pattern
    try:
        info = os.stat(folder)
    except (OSError, ValueError) as exc:
        if isinstance(exc, FileNotFoundError) and not folder.is_symlink():
            raise FileFormatError(folder, "no such directory") from exc
        raise _os_error(str(folder), exc) from exc  # a link's loop or missing target too
    if not stat.S_ISDIR(info.st_mode):
        raise FileFormatError(folder, "is not a directory")
    try:
        names = sorted(entry.name for entry in os.scandir(folder) if regex.fullmatch(entry.name))
    except OSError as exc:
        raise FileFormatError(folder, f"cannot list: {exc.strerror or exc}") from exc
    paths = [folder / name for name in names]
    for path in paths:
        try:
            mode = os.stat(path).st_mode
        except (OSError, ValueError) as exc:
            raise _os_error(str(path), exc) from exc
        if not stat.S_ISREG(mode):
            kind = next((text for test, text in _KINDS if test(mode)), "not a regular file")
            raise FileFormatError(path, f"is {kind}, expected a regular file ({what} by its "
                                        "name; collsynth reads only regular files)")
    return paths
