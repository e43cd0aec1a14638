"""The exception tree of collsynth.

Outcomes of a search (satisfiable, unsatisfiable, timed out, unknown) are *statuses*, not
exceptions: see :class:`collsynth.synthesis.Status`. Exceptions are for input that cannot be used
and for internal failures. Every exception collsynth raises on purpose derives from
:class:`CollsynthError`, so a caller (the CLI among them) can catch one type.
"""

from __future__ import annotations

__all__ = [
    "CollsynthError",
    "InvalidTopologyError",
    "InvalidCollectiveError",
    "InvalidInstanceError",
    "NoRingError",
    "NoTreeError",
    "UnknownNameError",
    "InputTooLargeError",
    "FileFormatError",
    "VerificationError",
    "UnimplementableError",
    "SolverError",
    "ExportError",
    "OutputPathError",
    "WrongTypeError",
    "expect_type",
    "expect_path",
    "shown_path",
    "printable",
    "InputWarning",
]


class CollsynthError(Exception):
    """Root of every error collsynth raises on purpose."""


class InvalidTopologyError(CollsynthError, ValueError):
    """A topology that breaks a rule (shape, sign, self-link, group naming a missing rank...)."""


class InvalidCollectiveError(CollsynthError, ValueError):
    """A collective that breaks a rule (empty postcondition, rank out of range...)."""


class InvalidInstanceError(CollsynthError, ValueError):
    """Synthesis parameters that cannot describe an algorithm (rounds < steps, chunks < 1...)."""


class NoRingError(InvalidInstanceError):
    """The topology has no directed ring through every rank: the runtime's ring (and the tree
    built on its channels) cannot run there."""


class NoTreeError(InvalidInstanceError):
    """The topology lacks a link the runtime's tree needs (each chain link both ways, head to
    head between nodes)."""


class UnknownNameError(CollsynthError, KeyError):
    """A name (topology, collective, backend) that is not known; the message lists valid ones."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class InputTooLargeError(CollsynthError, ValueError):
    """Input refused before any work because its size is beyond what collsynth accepts."""


class FileFormatError(CollsynthError, ValueError):
    """A file that cannot be read: names the file, the field (or line) and what was expected.

    A value quoted from a hostile file can be megabytes long: words of the message longer than
    100 characters are shortened, and the message to at most 600 characters.
    """

    def __init__(self, path: object, message: str) -> None:
        self.path = str(path)
        self.detail = _shorten(str(message))
        super().__init__(f"{shown_path(self.path)}: {self.detail}")


def _shorten(text: str, word: int = 100, total: int = 600) -> str:
    """``text`` with every run of more than ``word`` non-blank characters cut in its middle, then
    cut to ``total`` characters (keeping its end, which says what was expected)."""
    if len(text) <= word:
        return text
    parts = text.split(" ")
    text = " ".join(p if len(p) <= word else f"{p[:50]}...[{len(p)} characters]...{p[-10:]}"
                    for p in parts)
    if len(text) > total:
        text = f"{text[:total - 150]} ... {text[-140:]}"
    return text


class VerificationError(CollsynthError):
    """An algorithm that does not implement its collective on its topology."""


class UnimplementableError(CollsynthError):
    """A collective no algorithm can implement on a topology (a rank can never get a chunk).

    Attributes ``rank`` and ``chunk`` name one witness.
    """

    def __init__(self, message: str, *, rank: int, chunk: int) -> None:
        self.rank = rank
        self.chunk = chunk
        super().__init__(message)


class SolverError(CollsynthError):
    """A solver backend crashed or is not installed (not: unsatisfiable, timeout)."""


class ExportError(CollsynthError):
    """An algorithm that cannot be written in the requested format or within a runtime's limits.

    ``violations`` lists the exceeded limits (:class:`collsynth.export.limits.LimitViolation`),
    if any.
    """

    violations: tuple = ()


class OutputPathError(CollsynthError, ValueError):
    """An output path collsynth will not write: not a regular file (a link, FIFO, device,
    folder), in a missing or unwritable folder, or a write that failed (naming the path)."""


class WrongTypeError(CollsynthError, TypeError):
    """A library function given a value of another type than it takes (a name where a
    :class:`~collsynth.topology.Topology` goes): said at the entry, not as an AttributeError
    deep inside."""


def expect_type(value: object, kind: type | tuple[type, ...], what: str) -> None:
    """Raise :class:`WrongTypeError` unless ``value`` is a ``kind``.

    >>> expect_type("dgx1", int, "topology")
    Traceback (most recent call last):
    ...
    collsynth.errors.WrongTypeError: topology: expected int, got str 'dgx1'
    """
    if not isinstance(value, kind):
        names = " or ".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
        shown = repr(value)
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        raise WrongTypeError(f"{what}: expected {names}, got {type(value).__name__} {shown}")


def expect_path(value: object, what: str = "path") -> str:
    """``value`` (a ``str`` or a path-like object of one) as text; :class:`WrongTypeError`
    for anything else (``None``, a number, bytes), said where a file is named rather than as
    a TypeError from deep inside ``os`` or ``pathlib``.

    >>> expect_path(None)
    Traceback (most recent call last):
    ...
    collsynth.errors.WrongTypeError: path: expected str or PathLike, got NoneType None
    """
    import os

    expect_type(value, (str, os.PathLike), what)
    text = os.fspath(value)  # type: ignore[arg-type]
    expect_type(text, str, what)
    return text


def shown_path(path: object) -> str:
    """A user's path as messages echo it: as it is when every character is printable, else
    quoted with its newlines, terminal escapes and other control or format characters escaped
    (Python's ``repr``), so a name cannot split a line or drive the terminal.

    >>> shown_path("out/plan.json")
    'out/plan.json'
    >>> print(shown_path("a\\nb\\x1b[31m.json"))
    'a\\nb\\x1b[31m.json'
    """
    import os

    text = os.fspath(path) if isinstance(path, os.PathLike) else path
    if isinstance(text, bytes):
        return repr(text)
    text = str(text)
    return text if text.isprintable() else repr(text)


def printable(text: str) -> str:
    """``text`` with each control, format or surrogate character but newline and TAB written as
    its escape (``\\x1b``, ``\\u202e``): what the command line prints, so nothing echoed from a
    user (a path, a name) reaches the terminal as an escape sequence.

    >>> printable("wrote \\x1b[2J.json")
    'wrote \\\\x1b[2J.json'
    """
    if text.replace("\n", "").replace("\t", "").isprintable():
        return text
    return "".join(ch if ch in "\n\t" or ch.isprintable() else repr(ch)[1:-1] for ch in text)


class InputWarning(UserWarning):
    """Input that was read, with something dropped or assumed on the way (an imported topology's
    link to nothing the file names). Issued with :func:`warnings.warn`; the CLI prints each as
    one ``collsynth: warning:`` line."""
