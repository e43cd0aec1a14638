"""Where collsynth writes: one policy for every output path, files and folders alike.

* A file output must be a regular file or a new name. A symbolic link, FIFO, device, socket or
  folder there is refused, never replaced; so is a read-only file.
* Its folder must exist and be writable; collsynth never creates missing parent folders. A
  folder output (``-o DIR/``, ``--xml DIR``) is created when missing, one level only, and only
  with its files: :func:`staged_folder` builds it aside and moves it into place on success.
* Names made from user data (a collective's name) go through :func:`safe_file_name` and
  :func:`path_in`: letters, digits, ``._-`` only, so they stay in the output folder.
* Writes are atomic (:func:`open_atomic`): a temporary file in the same folder, renamed over
  the target; the temporary file is removed on any failure and errors name the user's path.

Commands check their outputs before any work, so a refused path costs nothing; the writers
check again just before writing. docs/cli.md, section "Output files and folders".
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import re
import shutil
import stat
import tempfile
from pathlib import Path
from typing import IO, Iterator, Sequence

from collsynth.errors import OutputPathError, expect_path, shown_path

__all__ = ["check_output_file", "check_output_dir", "check_folder_writable", "safe_file_name",
           "path_in", "open_atomic", "write_text_atomic", "write_bytes_atomic",
           "write_all_atomic", "staged_folder", "shown_as", "user_path"]

#: Longest file name :func:`safe_file_name` makes (file systems allow 255 bytes; room is left
#: for the suffixes commands add and for the atomic writer's temporary names).
MAX_NAME_CHARS = 160

#: The staging folders being written in the current context, each with the user's path it
#: becomes, innermost last (:func:`shown_as`).
_STAGED: contextvars.ContextVar[tuple[tuple[Path, Path], ...]] = contextvars.ContextVar(
    "collsynth_staged_folders", default=())


@contextlib.contextmanager
def shown_as(staging: str | os.PathLike[str], target: str | os.PathLike[str]) -> Iterator[None]:
    """Within the block, a file written under the hidden folder ``staging`` is named in errors
    by its place under ``target``, the user's path that the folder becomes: a full disk while
    writing ``.out.x1y2.tmp/xml/a.xml`` reads ``out/xml/a.xml: cannot write: No space left on
    device``. :func:`staged_folder` sets it; a writer that stages a folder of its own should."""
    token = _STAGED.set(_STAGED.get() + ((Path(staging), Path(target)),))
    try:
        yield
    finally:
        _STAGED.reset(token)


def user_path(path: str | os.PathLike[str]) -> Path:
    """``path`` as the user knows it: under a staging folder of :func:`shown_as`, the same
    place under its target; else ``path`` itself.

    >>> with shown_as("/tmp/.out.x1y2.tmp", "out"):
    ...     str(user_path("/tmp/.out.x1y2.tmp/xml/a.xml"))
    'out/xml/a.xml'
    """
    given = Path(path)
    for staging, target in reversed(_STAGED.get()):
        if given == staging or staging in given.parents:
            return target / given.relative_to(staging)
    return given


_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISDIR, "a folder"), (stat.S_ISLNK, "a symbolic link"), (stat.S_ISREG, "a file"))


def _kind(mode: int) -> str:
    return next((text for test, text in _KINDS if test(mode)), "not a regular file")


def _lstat(path: Path, label: str) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except FileNotFoundError:
        return None
    except NotADirectoryError as exc:
        raise OutputPathError(f"{label}: a parent of it is a file, not a folder") from exc
    except (OSError, ValueError) as exc:  # ValueError: a NUL in the path
        raise OutputPathError(f"{label}: cannot be checked: "
                              f"{getattr(exc, 'strerror', None) or exc}") from exc


def _check_target(target: Path, label: str) -> os.stat_result | None:
    """What is at ``target`` now (``None``: nothing), refusing all but a writable regular
    file."""
    info = _lstat(target, label)
    if info is not None:
        if not stat.S_ISREG(info.st_mode):
            raise OutputPathError(f"{label}: is {_kind(info.st_mode)}; expected a regular file "
                                  "or a new name (collsynth does not replace it)")
        # The mode bits too: root passes os.access on a read-only file.
        if not os.access(target, os.W_OK) or not info.st_mode & 0o222:
            raise OutputPathError(f"{label}: is read-only; expected a writable file")
    return info


def check_folder_writable(folder: Path, label: str) -> None:
    """Check that ``folder`` (where a new entry will be made) exists, is a folder (or a link
    to one) and takes new files; ``label`` names the output in messages.

    Raises
    ------
    OutputPathError
        Saying which folder is missing, not a folder, or not writable.
    """
    shown = shown_path(folder)
    try:
        info = os.stat(folder)  # a link to a folder is a folder here
    except FileNotFoundError as exc:
        raise OutputPathError(f"{label}: folder {shown} does not exist; create it first "
                              "(collsynth does not create parent folders)") from exc
    except (OSError, ValueError) as exc:
        raise OutputPathError(f"{label}: folder {shown} cannot be used: "
                              f"{getattr(exc, 'strerror', None) or exc}") from exc
    if not stat.S_ISDIR(info.st_mode):
        raise OutputPathError(f"{label}: {shown} is {_kind(info.st_mode)}, expected a folder")
    # Try it rather than trust os.access: root passes access() on read-only mounts and /sys.
    try:
        fd, probe = tempfile.mkstemp(prefix=".collsynth-probe-", dir=folder)
    except OSError as exc:
        raise OutputPathError(f"{label}: folder {shown} is not writable: "
                              f"{exc.strerror or exc}") from exc
    try:  # an interrupt here must not leave the probe behind
        os.close(fd)
    finally:
        os.unlink(probe)


def check_output_file(path: str | os.PathLike[str], *, label: str | None = None,
                      inputs: Sequence[str | os.PathLike[str]] = (),
                      outputs: Sequence[tuple[str, str | os.PathLike[str]]] = ()) -> Path:
    """Check that a file can be written at ``path`` without replacing anything but a regular
    file that is none of the command's ``inputs``; return it as a :class:`Path`. ``label``
    names it in messages (default: the path). ``outputs`` are the command's other output
    files, as ``(label, path)``: ``path`` must be none of them.

    Raises
    ------
    OutputPathError
        A path ending in ``/``; an existing link, FIFO, device, socket, folder or read-only
        file; one of ``inputs`` (writing would destroy what the command reads) or of
        ``outputs`` (one file would replace the other); a missing or unwritable folder.
    """
    text = expect_path(path)
    label = label or shown_path(text)
    if not text or text.endswith(("/", os.sep)) or (os.altsep and text.endswith(os.altsep)):
        raise OutputPathError(f"{label}: names a folder; expected a file name")
    target = Path(text)
    for other_label, other in outputs:
        if os.path.realpath(target) == os.path.realpath(other) or _same_file(target, other):
            raise OutputPathError(f"{label}: is also {other_label}; one would replace the other "
                                  "(choose two names)")
    for source in inputs:
        try:
            same = os.path.samefile(target, source)
        except OSError:  # either is missing or unreadable: not the same existing file
            same = False
        if same:
            raise OutputPathError(f"{label}: is the input {os.fspath(source)}; writing there "
                                  "would replace it (choose another output file)")
    _check_target(target, label)
    check_folder_writable(target.parent, label)
    return target


def _same_file(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:  # either is missing or unreadable: not the same existing file
        return False


def check_output_dir(path: str | os.PathLike[str], *, label: str | None = None,
                     create: bool = True) -> Path:
    """Check that files can be written into the folder ``path``; with ``create``, make it when
    missing (one level: its parent must exist). Return it as a :class:`Path`.

    Raises
    ------
    OutputPathError
        An existing link, file or other non-folder at ``path``; a missing or unwritable parent
        folder; a folder that does not take new files.
    """
    text = expect_path(path)
    label = label or shown_path(text)
    if not text:
        raise OutputPathError("an empty path; expected a folder")
    folder = Path(text)
    info = _lstat(folder, label)
    if info is None:
        check_folder_writable(folder.parent, label)
        if create:
            try:
                folder.mkdir()
            except FileExistsError:  # made meanwhile: check what it is
                return check_output_dir(path, label=label, create=False)
            except OSError as exc:
                raise OutputPathError(f"{label}: cannot create the folder: "
                                      f"{exc.strerror or exc}") from exc
        return folder
    if not stat.S_ISDIR(info.st_mode):
        raise OutputPathError(f"{label}: is {_kind(info.st_mode)}; expected a folder or a new "
                              "name")
    check_folder_writable(folder, label)
    return folder


def safe_file_name(text: str, *, default: str = "output") -> str:
    """``text`` as a file name: every character but letters, digits and ``._-`` becomes ``_``,
    leading and trailing dots and underscores go, and it is cut to :data:`MAX_NAME_CHARS`.

    >>> safe_file_name("../../ESCAPED-DGX1"), safe_file_name("a b/c"), safe_file_name("..")
    ('ESCAPED-DGX1', 'a_b_c', 'output')
    """
    name = re.sub(r"[^A-Za-z0-9._-]", "_", text)[:MAX_NAME_CHARS].strip("._")
    return name or default


def path_in(folder: str | os.PathLike[str], name: str, *, suffix: str = "",
            default: str = "output") -> Path:
    """``folder / (safe_file_name(name, default=default) + suffix)``: a file that cannot leave
    ``folder``.

    >>> path_in("xml", "../../x", suffix=".msccl.xml").as_posix()
    'xml/x.msccl.xml'
    """
    path = Path(folder) / (safe_file_name(name, default=default) + suffix)
    if path.parent != Path(folder):  # cannot happen with a safe name; refuse rather than trust
        raise OutputPathError(f"{name!r}: does not make a file name inside {folder}")
    return path


def _umask() -> int:
    """The process's umask (read, not set: setting it would race other threads)."""
    try:
        with open("/proc/self/status", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o022


def _new_file_mode() -> int:
    """The mode ``open()`` would give a new file (0666 less the umask); mkstemp's is 0600."""
    return 0o666 & ~_umask()


@contextlib.contextmanager
def open_atomic(path: str | os.PathLike[str], *, binary: bool = False,
                label: str | None = None) -> Iterator[IO]:
    """Open a temporary file next to ``path`` for writing; on a clean exit, rename it over
    ``path``. On any failure the temporary file is removed and ``path`` is left as it was.

    The path is checked with :func:`check_output_file` first, and again just before the rename
    (a FIFO or link put there meanwhile is refused, not replaced).

    Raises
    ------
    OutputPathError
        A path the policy refuses, or an OS error while writing (the message names ``path``,
        not the temporary file).
    """
    label = label or shown_path(user_path(expect_path(path)))
    target = check_output_file(path, label=label)
    existing = _check_target(target, label)
    mode = stat.S_IMODE(existing.st_mode) if existing is not None else _new_file_mode()
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name[:MAX_NAME_CHARS]}.", suffix=".tmp",
                                   dir=target.parent)
    except OSError as exc:
        raise OutputPathError(f"{label}: cannot write: {exc.strerror or exc}") from exc
    try:
        try:
            with os.fdopen(fd, "wb" if binary else "w",
                           **({} if binary else {"encoding": "utf-8"})) as handle:
                yield handle
            os.chmod(tmp, mode)
            _check_target(target, label)
            os.replace(tmp, target)
        except OSError as exc:
            raise OutputPathError(f"{label}: cannot write: {exc.strerror or exc}") from exc
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_text_atomic(path: str | os.PathLike[str], text: str, *,
                      label: str | None = None) -> None:
    """Write ``text`` (UTF-8) to ``path`` through :func:`open_atomic`."""
    with open_atomic(path, label=label) as handle:
        handle.write(text)


def write_bytes_atomic(path: str | os.PathLike[str], data: bytes, *,
                       label: str | None = None) -> None:
    """Write ``data`` to ``path`` through :func:`open_atomic`."""
    with open_atomic(path, binary=True, label=label) as handle:
        handle.write(data)


def _new_folder_mode() -> int:
    """The mode ``mkdir`` would give a new folder (0777 less the umask); mkdtemp's is 0700."""
    return 0o777 & ~_umask()


def write_all_atomic(files: "dict[Path, str | bytes]", *, label: str | None = None) -> None:
    """Write several files all or nothing: each to a temporary file next to its target first;
    only when every one is written (and every target passes :func:`check_output_file`) are they
    renamed into place. On any failure the temporary files are removed and no target changes.

    Raises
    ------
    OutputPathError
        A target the policy refuses, or an OS error while writing.
    """
    temporaries: list[tuple[str, Path, int]] = []
    try:
        for target, data in files.items():
            shown = label or shown_path(user_path(target))
            check_output_file(target, label=shown)
            existing = _check_target(Path(target), shown)
            mode = stat.S_IMODE(existing.st_mode) if existing is not None else _new_file_mode()
            try:
                fd, tmp = tempfile.mkstemp(prefix=f".{Path(target).name[:MAX_NAME_CHARS]}.",
                                           suffix=".tmp", dir=Path(target).parent)
            except OSError as exc:
                raise OutputPathError(f"{shown}: cannot write: {exc.strerror or exc}") from exc
            temporaries.append((tmp, Path(target), mode))
            try:
                with os.fdopen(fd, "wb") as handle:
                    handle.write(data.encode("utf-8") if isinstance(data, str) else data)
                os.chmod(tmp, mode)
            except OSError as exc:
                raise OutputPathError(f"{shown}: cannot write: {exc.strerror or exc}") from exc
        for _, target, _ in temporaries:  # all written: check every target again, then rename
            _check_target(target, label or shown_path(user_path(target)))
        for tmp, target, _ in temporaries:
            try:
                os.replace(tmp, target)
            except OSError as exc:
                raise OutputPathError(f"{label or shown_path(user_path(target))}: cannot write: "
                                      f"{exc.strerror or exc}") from exc
    except BaseException:
        for tmp, _, _ in temporaries:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        raise


@contextlib.contextmanager
def staged_folder(path: str | os.PathLike[str], *, label: str | None = None) -> Iterator[Path]:
    """A command's output folder, all or nothing: yield an empty staging folder to write the
    files in; on a clean exit they are moved into ``path``, on any failure the staging folder
    is removed and ``path`` is left as it was (a missing folder stays missing).

    A missing ``path`` (its parent must exist) is staged next to it and renamed into place in
    one step. Into an existing folder the files are staged in a hidden folder inside it, every
    target is checked (a regular file or a new name, as :func:`check_output_file`; a folder
    where the staging has one), and only then are they renamed over the old ones. Files of the
    folder that the command does not write are kept.

    Raises
    ------
    OutputPathError
        ``path`` refused by :func:`check_output_dir`; a target refused at the end (nothing is
        moved then); an OS error.
    """
    label = label or shown_path(expect_path(path))
    target = check_output_dir(path, label=label, create=False)
    existed = _lstat(target, label) is not None
    home = target if existed else target.parent
    try:
        staging = Path(tempfile.mkdtemp(prefix=f".{safe_file_name(target.name)}.",
                                        suffix=".tmp", dir=home))
        os.chmod(staging, _new_folder_mode())
    except OSError as exc:
        raise OutputPathError(f"{label}: cannot write: {exc.strerror or exc}") from exc
    try:
        with shown_as(staging, expect_path(path)):
            yield staging
        if not existed and _lstat(target, label) is None:
            try:
                os.rename(staging, target)
                return
            except OSError as exc:
                raise OutputPathError(f"{label}: cannot create the folder: "
                                      f"{exc.strerror or exc}") from exc
        _merge(staging, check_output_dir(target, label=label, create=False), label)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    shutil.rmtree(staging, ignore_errors=True)


def _merge(staging: Path, target: Path, label: str) -> None:
    """Move the tree ``staging`` into the folder ``target``: every destination checked first,
    then the files renamed over (keeping an old file's mode)."""
    folders, files = [], []
    for root, dirs, names in os.walk(staging):
        dirs.sort()
        rel = Path(root).relative_to(staging)
        folders += [rel / d for d in dirs]
        files += [rel / n for n in sorted(names)]
    for rel in folders:
        info = _lstat(target / rel, f"{label}: {rel}")
        if info is not None and not stat.S_ISDIR(info.st_mode):
            raise OutputPathError(f"{label}: {rel} is {_kind(info.st_mode)}; expected a folder "
                                  "(collsynth does not replace it)")
    modes = {rel: _check_target(target / rel, f"{label}: {rel}") for rel in files}
    try:
        for rel in folders:
            (target / rel).mkdir(exist_ok=True)
        for rel in files:
            if modes[rel] is not None:
                os.chmod(staging / rel, stat.S_IMODE(modes[rel].st_mode))
            os.replace(staging / rel, target / rel)
    except OSError as exc:
        raise OutputPathError(f"{label}: cannot write: {exc.strerror or exc}") from exc
