"""What every ``collsynth`` command shares: exit codes, the one-line parser and the errors that
reach :func:`collsynth.cli.main`, the TOPOLOGY COLLECTIVE arguments, one set of rules for numbers,
durations and sizes, and the output helpers (``out``, ``err``, ``table``, ``format_size``).

The argument types raise :class:`argparse.ArgumentTypeError` with a one-line message; the parsers
turn it into a usage error (exit 2).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from fractions import Fraction
from typing import TYPE_CHECKING, NoReturn, Sequence

from collsynth._parse import (BINARY_UNITS, DECIMAL_UNITS, MAX_SIZE_BYTES, NumberTextError,
                              number_text, size_from_text)
from collsynth.errors import CollsynthError, printable

if TYPE_CHECKING:
    from collsynth.collective.model import Collective
    from collsynth.runtimes.settings import RuntimeSettings
    from collsynth.topology.model import Topology

__all__ = ["positive_int", "path_argument", "gpus_per_thread", "runtime_setting",
           "add_settings_argument", "runtime_settings", "job_settings", "non_negative_int", "seconds",
           "positive_number", "parse_size", "comma_entries", "memory_limit", "check_unsplit",
           "MIN_MEMORY_LIMIT_BYTES",
           "channels_or_auto", "add_figure_arguments", "add_fabric_arguments", "oversubscription",
           "node_count", "each_file_once",
           "MAX_SIZE_BYTES", "DECIMAL_UNITS", "BINARY_UNITS", "format_size", "table", "out", "err",
           "one_line", "problem_parser", "problem_from_args", "Parser", "UsageError",
           "Interrupted", "DetailedError", "PROG", "EXIT_CODES"]

PROG = "collsynth"

#: Success: the command did what was asked (for ``solve``: an algorithm was found).
EXIT_OK = 0
#: An error: bad input (unknown name, malformed file, ...), a wrong algorithm, an unwritable path.
EXIT_ERROR = 1
#: Bad command-line usage (unknown flag, missing argument, malformed value).
EXIT_USAGE = 2
#: No algorithm exists: the solver proved the instance unsatisfiable, or the collective cannot be
#: implemented on the topology at all.
EXIT_UNSATISFIABLE = 3
#: The time limit was reached before anything was found, or Ctrl-C stopped a search (what it
#: found is printed and written; exit 0 instead when the result was already complete).
EXIT_TIMEOUT = 4
#: Ctrl-C outside a search.
EXIT_INTERRUPTED = 130

EXIT_CODES: dict[int, str] = {
    EXIT_OK: "ok / algorithm found",
    EXIT_ERROR: "error (bad input, wrong algorithm, unwritable output)",
    EXIT_USAGE: "usage error",
    EXIT_UNSATISFIABLE: "no algorithm exists (unsatisfiable or unimplementable)",
    EXIT_TIMEOUT: "time limit reached with nothing found, or search interrupted",
    EXIT_INTERRUPTED: "interrupted outside a search",
}


class UsageError(Exception):
    """A command line that cannot be run; ``prog`` is the (sub)command it was given to."""

    def __init__(self, message: str, *, prog: str = PROG) -> None:
        self.prog = prog
        super().__init__(message)

    @classmethod
    def of(cls, command: str, message: str) -> "UsageError":
        """The error ``collsynth COMMAND``'s parser would give for ``message``."""
        prog = f"{PROG} {command}"
        return cls(f"{message} (see '{prog} --help')", prog=prog)


def check_gpus_per_thread(gpus: int, topology: "Topology | None", command: str) -> None:
    """A thread drives GPUs of its own node: at most the node's ranks, and a whole share of
    them (nccl-tests runs processes x threads x G GPUs, so G divides a node's GPUs)."""
    if topology is None:
        return
    layout = topology.layout
    per_node = layout.ranks_per_node if layout is not None and layout.multi_node else \
        topology.num_ranks
    if gpus > per_node:
        raise UsageError.of(command, f"--gpus-per-thread {gpus}: a thread drives the GPUs of "
                                     f"one node, and {topology.name} has {per_node} a node")
    if per_node % gpus:
        raise UsageError.of(command, f"--gpus-per-thread {gpus}: threads of {gpus} GPUs cannot "
                                     f"share a node of {per_node} ({topology.name}); expected "
                                     f"a divisor of {per_node}")


class Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line and reach :func:`main` as an exception."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see '{self.prog} --help')", prog=self.prog)

    def parse_known_args(self, args=None, namespace=None):  # type: ignore[override]
        namespace, extras = super().parse_known_args(args, namespace)
        if extras and self._subparsers is None:
            # a command's own parser: what it does not know is its error, pointing at its
            # --help (argparse leaves it to the top parser, which points at 'collsynth --help')
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return namespace, extras


class Interrupted(KeyboardInterrupt):
    """Ctrl-C, with what the command leaves behind (``main`` prints
    ``collsynth: interrupted: MESSAGE``, exit 130)."""


class DetailedError(CollsynthError):
    """An error that takes several lines to explain: ``main`` prints the message, then each of
    ``details``, each as an error line (exit 1)."""

    def __init__(self, message: str, details: Sequence[str] = ()) -> None:
        self.details = tuple(details)
        super().__init__(message)


# -- output -------------------------------------------------------------------------------------


def out(text: str = "") -> None:
    """A line of a command's result, on stdout (control characters escaped: :func:`printable`)."""
    print(printable(text), file=sys.stdout, flush=True)


def err(text: str) -> None:
    """A line of progress or of an error, on stderr (control characters escaped)."""
    print(printable(text), file=sys.stderr, flush=True)


#: Problem lines a check prints before it sums up the rest (``--json`` lists every one): a
#: hostile plan can hold 100,000 problems, which no one reads on a terminal.
MAX_PROBLEM_LINES = 50


def problem_lines(lines: "list[str]", most: int = MAX_PROBLEM_LINES) -> "list[str]":
    """The first ``most`` of ``lines``, then one line saying how many more there are.

    >>> problem_lines(["a", "b", "c"], most=2)
    ['a', 'b', '... and 1 more problem (--json lists every one)']
    """
    if len(lines) <= most:
        return list(lines)
    rest = len(lines) - most
    return lines[:most] + [f"... and {rest} more problem{'s' if rest != 1 else ''} "
                           "(--json lists every one)"]


def one_line(text: str) -> str:
    """``text`` with every run of white space (newlines too) made one space."""
    return " ".join(str(text).split())


# -- arguments ----------------------------------------------------------------------------------


def why_not(exc: ValueError) -> str:
    """``": REASON"`` for a number's text :func:`~collsynth._parse.number_text` refused (a
    non-ASCII digit, a ``_``), else nothing: what ends a message ``expected ..., got 'TEXT'``."""
    return f": {exc}" if isinstance(exc, NumberTextError) else ""


def _ranks(text: str) -> list[int]:
    try:
        ranks = [int(number_text(part)) for part in text.split(",")]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(
            f"expected a rank or ranks separated by commas (0 or 0,4), got {text!r}"
            f"{why_not(exc)}") from None
    if any(r < 0 for r in ranks):
        raise argparse.ArgumentTypeError(f"ranks are >= 0, got {text!r}")
    return ranks


def problem_parser() -> Parser:
    """The parent parser of the commands that take ``TOPOLOGY COLLECTIVE`` (read back with
    :func:`problem_from_args`)."""
    problem = Parser(add_help=False)
    problem.add_argument("topology", metavar="TOPOLOGY",
                         help="built-in name (dgx1, ring:8, ...) or topology file (JSON, NCCL XML, "
                              "nvidia-smi/rocm-smi output)")
    problem.add_argument("collective", metavar="COLLECTIVE",
                         help="standard collective (allgather, reduce_scatter, broadcast, ...) "
                              "or a custom collective JSON file")
    problem.add_argument("--root", type=_ranks, metavar="R",
                         help="root rank of a rooted collective; several (0,4) for multiroot_*")
    problem.add_argument("--nodes", type=node_count, metavar="K",
                         help="K copies of the topology joined by their NICs")
    problem.add_argument("--nic-units", type=positive_int, metavar="U",
                         help="with --nodes: NIC bandwidth in the topology's units (for topologies "
                              "whose file does not describe their NICs)")
    add_fabric_arguments(problem)
    add_figure_arguments(problem)
    return problem


def problem_from_args(args: argparse.Namespace) -> tuple["Topology", "Collective"]:
    """The topology and collective a command names (``TOPOLOGY COLLECTIVE [--root R]``)."""
    from collsynth.resolve import resolve_collective, resolve_topology

    check_fabric_arguments(args)
    topology = resolve_topology(args.topology, nodes=args.nodes, nic_units=args.nic_units,
                                oversubscription=getattr(args, "oversubscription", 1),
                                fabric=getattr(args, "fabric", "switch"),
                                nodes_per_leaf=getattr(args, "nodes_per_leaf", None),
                                unit_gbps=args.unit_gbps, alpha_us=args.alpha_us)
    root = roots = None
    if args.root is not None:
        n = topology.num_ranks
        outside = [r for r in args.root if not 0 <= r < n]
        if outside:  # a usage error, as --root -1 (the parser's) and check's and run's are
            prog = " ".join(filter(None, (PROG, args.command, getattr(args, "mode", None))))
            raise UsageError(f"--root {outside[0]} is not a rank 0..{n - 1} of {topology.name} "
                              f"(see '{prog} --help')", prog=prog)
        if len(args.root) == 1:
            root = args.root[0]
        else:
            roots = args.root
    collective = resolve_collective(args.collective, topology.num_ranks, root=root, roots=roots)
    return topology, collective


def check_unsplit(collective: "Collective", spec: str) -> None:
    """Synthesis splits a collective into pieces itself (``--chunks``, the sweep): a custom
    collective file already split (``chunk_factor`` above 1) is refused naming the field (the
    solver split it again and said "chunk factor 4 but the instance asks for 2 chunks")."""
    from collsynth.errors import FileFormatError

    if collective.chunk_factor != 1:
        raise FileFormatError(spec, f"chunk_factor = {collective.chunk_factor}: solve splits a "
                                    "collective into pieces itself (--chunks, or the sweep's "
                                    "chunk counts); give it unsplit, with chunk_factor 1")


def _whole(text: str, minimum: int) -> int:
    try:
        value = int(number_text(text))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(
            f"expected a whole number >= {minimum}, got {text!r}{why_not(exc)}") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"expected a whole number >= {minimum}, got {text!r}")
    return value


def path_argument(text: str) -> str:
    """A file or folder an option names: any text but the empty one, which names nothing (an
    unset shell variable, ``-o "$OUT"``), which a handler would take for the option left out,
    and ``-``, which by the Unix habit means stdout (or stdin) but would silently be a file
    named ``-`` in the working folder (``./-`` names that file)."""
    if not text:
        raise argparse.ArgumentTypeError("an empty path; expected a file or folder name")
    if text == "-":
        raise argparse.ArgumentTypeError("'-': collsynth does not write to stdout or read "
                                         "from stdin here; expected a file or folder name "
                                         "(./- for one named '-')")
    return text


def positive_int(text: str) -> int:
    """A whole number >= 1."""
    return _whole(text, 1)


def node_count(text: str) -> int:
    """A number of nodes (``--nodes K``): a whole number from 1 to
    :data:`~collsynth.topology.model.MAX_RANKS`, since every node has a rank or more (a larger
    count is refused here, a usage error, rather than when the nodes are composed)."""
    from collsynth.topology.model import MAX_RANKS

    value = positive_int(text)
    if value > MAX_RANKS:
        raise argparse.ArgumentTypeError(f"{value} nodes is more than the {MAX_RANKS} ranks "
                                         "collsynth accepts (every node has a rank or more)")
    return value


def runtime_setting(text: str) -> str:
    """argparse type of one ``--env NAME=VALUE``: checked alone here, with the others in
    :func:`runtime_settings`."""
    from collsynth.runtimes.settings import settings_from_text

    try:
        settings_from_text([text])
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def add_settings_argument(parser: argparse.ArgumentParser, effect: str) -> None:
    """``--env NAME=VALUE`` (repeatable): the job's NCCL_ALGO / NCCL_PROTO / NCCL_NVLS_ENABLE;
    ``effect`` says what they do in this command."""
    parser.add_argument("--env", type=runtime_setting, action="append", metavar="NAME=VALUE",
                        help="a variable of the job, as the runtime reads it: NCCL_ALGO "
                             "(Ring,Tree; ^NVLS), NCCL_PROTO (Simple; ^LL128) or "
                             f"NCCL_NVLS_ENABLE (0); {effect}; repeatable")


def runtime_settings(texts: "Sequence[str] | None", command: str) -> "RuntimeSettings":
    """The settings of every ``--env`` of ``collsynth COMMAND`` (a name given twice is a usage
    error)."""
    from collsynth.runtimes.settings import settings_from_text

    try:
        return settings_from_text(texts or ())
    except ValueError as exc:
        raise UsageError.of(command, f"--env {exc}") from None


def job_settings(given: "RuntimeSettings", calibration: object, path: "str | None"
                 ) -> "tuple[RuntimeSettings, str]":
    """The settings to price under and where they come from: ``--env``'s when given, else a
    runtime calibration's (the job its curve was measured under, ``calibrate --env``), else
    none (``""``)."""
    from collsynth.runtimes.settings import settings_from_text

    if given.text:
        return given, "--env"
    recorded = getattr(calibration, "settings", ())
    if recorded:
        return settings_from_text(recorded), f"the calibration {path}"
    return given, ""


def gpus_per_thread(text: str) -> int:
    """GPUs one thread drives: a whole number from 1 to
    :data:`~collsynth.timing.runtime_model.MAX_GPUS_PER_THREAD`."""
    from collsynth.timing.runtime_model import MAX_GPUS_PER_THREAD

    value = positive_int(text)
    if value > MAX_GPUS_PER_THREAD:
        raise argparse.ArgumentTypeError(f"{value}: at most {MAX_GPUS_PER_THREAD} GPUs per thread")
    return value


def non_negative_int(text: str) -> int:
    """A whole number >= 0."""
    return _whole(text, 0)


def _positive(text: str, what: str) -> float:
    try:
        value = float(number_text(text))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected {what} > 0, got {text!r}{why_not(exc)}") \
            from None
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"expected {what} > 0, got {text!r}")
    return value


#: Seconds between two heartbeat lines while a step of a command runs long (none for shorter
#: steps): check, plan and time.
PROGRESS_INTERVAL_S = 5.0


def progress_line(line: str) -> None:
    """Print a progress line on stderr, indented under the command's own lines."""
    err(f"  {line}")


def input_files(*values: object) -> list[str]:
    """Those of ``values`` (a TOPOLOGY, a COLLECTIVE, a --calibration...) that name existing
    files: what ``-o`` must not overwrite."""
    return [v for v in values if isinstance(v, str) and os.path.isfile(v)]


#: Longest time limit a command takes, seconds: a week. Longer is a typo (1e9 s is 31 years),
#: and torch's process-group timeout overflows (1e300 s) or never fires.
MAX_SECONDS = 7 * 24 * 3600.0


def seconds(text: str) -> float:
    """A number of seconds > 0, at most :data:`MAX_SECONDS` (a week)."""
    value = _positive(text, "seconds")
    if value > MAX_SECONDS:
        raise argparse.ArgumentTypeError(f"{text!r} seconds: more than a week "
                                         f"({MAX_SECONDS:.0f} s); expected seconds from 0 to "
                                         f"{MAX_SECONDS:.0f}")
    return value


def positive_number(text: str) -> float:
    """A finite number > 0."""
    return _positive(text, "a number")


def channel_count(text: str) -> int:
    """A channel count from 1 to ``MAX_CHANNELS`` (128, rccl's MAXCHANNELS: no runtime has
    more, and each channel is a ring or a set of thread blocks the command builds)."""
    from collsynth.runtimes.constants import MAX_CHANNELS

    value = positive_int(text)
    if value > MAX_CHANNELS:
        raise argparse.ArgumentTypeError(
            f"{value} channels: more than the {MAX_CHANNELS} any runtime has (rccl's "
            "MAXCHANNELS; NCCL's is 64)")
    return value


def channels_or_auto(text: str) -> int | str:
    """A channel count (:func:`channel_count`), or ``auto``."""
    return "auto" if text == "auto" else channel_count(text)


def _figure(name: str):
    """The argument type of a physical figure (``unit_gbps``, ``alpha_us``): a number within
    the range a topology file gives it (:data:`~collsynth.topology.fileformat.FIGURE_RANGES`)."""

    def parse(text: str) -> float:
        from collsynth.topology.fileformat import FIGURE_RANGES, figure_range_text

        try:
            value = float(number_text(text))
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"expected a number {figure_range_text(name)}, "
                                             f"got {text!r}{why_not(exc)}") from None
        low, high, _, _ = FIGURE_RANGES[name]
        if not (math.isfinite(value) and low <= value <= high):
            raise argparse.ArgumentTypeError(f"expected a number {figure_range_text(name)}, "
                                             f"got {text!r}")
        return value

    parse.__name__ = name  # what argparse calls the type in its messages
    return parse


def add_figure_arguments(parser: argparse.ArgumentParser) -> None:
    """``--unit-gbps`` and ``--alpha-us``, for every command that takes a topology: the physical
    figures the timing model needs, which families (``ring:8``, ``torus:4x4``) do not have.
    Handlers pass ``args.unit_gbps`` and ``args.alpha_us`` to ``resolve_topology``."""
    parser.add_argument("--unit-gbps", type=_figure("unit_gbps"), metavar="GBPS",
                        help="GB/s of one bandwidth unit of the topology (of one node with "
                             "--nodes); replaces the topology's own (also: NAME,unit_gbps=GBPS)")
    parser.add_argument("--alpha-us", type=_figure("alpha_us"), metavar="US",
                        help="latency of one step in microseconds; replaces the topology's own "
                             "(also: NAME,alpha_us=US)")


def oversubscription(text: str):
    """A ratio >= 1 (``2``, ``1.5``, ``3/2``) or ratios per tier (``leaf=2,node=1``)."""
    from collsynth.errors import InvalidTopologyError
    from collsynth.topology.tiers import parse_oversubscription

    try:
        return parse_oversubscription(text)
    except InvalidTopologyError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def check_fabric_arguments(args: argparse.Namespace) -> None:
    """Refuse, as usage errors naming the options, the multi-node options without ``--nodes K``
    (K > 1) and a leaf size without the leaf-spine fabric (or the fabric without one)."""
    nodes = getattr(args, "nodes", None) or 1
    fabric = getattr(args, "fabric", "switch")
    per_leaf = getattr(args, "nodes_per_leaf", None)
    given = [flag for flag, on in (
        ("--fabric", fabric != "switch"), ("--nodes-per-leaf", per_leaf is not None),
        ("--oversubscription", getattr(args, "oversubscription", 1) != 1),
        ("--nic-units", getattr(args, "nic_units", None) is not None)) if on]
    problem = None
    if nodes <= 1 and given:
        problem = f"{', '.join(given)}: only with --nodes K (K > 1 nodes to join)"
    elif per_leaf is not None and fabric != "leaf-spine":
        problem = f"--nodes-per-leaf goes with --fabric leaf-spine (not {fabric})"
    elif fabric == "leaf-spine" and per_leaf is None:
        problem = "--fabric leaf-spine needs --nodes-per-leaf P (a divisor of --nodes)"
    if problem is not None:
        prog = " ".join(filter(None, (PROG, getattr(args, "command", None),
                                      getattr(args, "mode", None))))
        raise UsageError(f"{problem} (see '{prog} --help')", prog=prog)


def add_fabric_arguments(parser: argparse.ArgumentParser) -> None:
    """``--oversubscription``, ``--fabric`` and ``--nodes-per-leaf``, for every command that
    takes ``--nodes``: how the nodes' NICs are joined (:mod:`collsynth.topology.tiers`).
    Handlers pass ``args.oversubscription``, ``args.fabric`` and ``args.nodes_per_leaf`` to
    ``resolve_topology``."""
    parser.add_argument("--fabric", choices=("switch", "leaf-spine", "rail"), default="switch",
                        help="with --nodes: how the NICs are joined: one non-blocking switch "
                             "(default), leaf switches under spines (with --nodes-per-leaf), or "
                             "rails (NIC i of every node on rail switch i, rails joined above)")
    parser.add_argument("--nodes-per-leaf", type=positive_int, metavar="P",
                        help="with --fabric leaf-spine: nodes under each leaf switch (a divisor "
                             "of --nodes)")
    parser.add_argument("--oversubscription", type=oversubscription, default=1, metavar="X",
                        help="with --nodes: bandwidth into a tier / bandwidth up from it (2 = "
                             "2:1; default 1: non-blocking) for the fabric's main tier (switch: "
                             "node, leaf-spine: leaf, rail: rail), or per tier: "
                             "TIER=X[,TIER=X] (tiers: node, leaf, rail)")


def parse_size(text: str) -> int:
    """Bytes in ``text`` (``"1KB"`` = 1000, ``"1KiB"`` = 1024, ``"512"`` = 512), by the one rule
    for sizes, :func:`collsynth._parse.size_from_text`.

    Raises
    ------
    argparse.ArgumentTypeError
        ``size 'TEXT': why`` for what that rule refuses (ambiguous or unknown units, a size below
        one byte, beyond 1 PiB or not a whole number of bytes, other scripts' digits, ``1_000``).

    >>> parse_size("1KB"), parse_size("1 KiB"), parse_size("1.5MB"), parse_size("64")
    (1000, 1024, 1500000, 64)
    """
    try:
        return size_from_text(text)
    except NumberTextError as exc:
        raise argparse.ArgumentTypeError(f"size {text!r}: {exc}") from None


#: Most sizes one ``--sizes`` may list: each is priced (simulated) once per program and
#: baseline; an nccl-tests sweep from 1 B to 16 GiB has 35, every power of two up to 1 PB 51.
MAX_SIZES = 256


#: The smallest --memory-limit taken: the ceiling counts what a command allocates after it
#: starts, and loading matplotlib, OpenBLAS's per-thread buffers and CP-SAT's threads alone
#: take tens of MB (10 MiB hung in matplotlib's import, 50 MiB aborted CP-SAT's thread start).
MIN_MEMORY_LIMIT_BYTES = 256 * 2**20


def memory_limit(text: str) -> int:
    """A ``--memory-limit`` (or ``COLLSYNTH_MEMORY_LIMIT``): a size, at least
    :data:`MIN_MEMORY_LIMIT_BYTES`.

    >>> memory_limit("8GiB")
    8589934592
    """
    value = parse_size(text)
    if value < MIN_MEMORY_LIMIT_BYTES:
        raise argparse.ArgumentTypeError(
            f"{text!r}: below the {MIN_MEMORY_LIMIT_BYTES >> 20} MiB a command needs to load its "
            f"libraries; expected {MIN_MEMORY_LIMIT_BYTES >> 20}MiB or more (e.g. 8GiB)")
    return value


def comma_entries(text: str, what: str) -> list[str]:
    """The entries of an option's comma-separated list, stripped. An empty entry (``1MB,,2MB``,
    a comma at either end) is refused naming its place: a value was meant there, and skipping
    it would run the command on fewer than were typed.

    >>> comma_entries(" 1KB, 1MB", "sizes")
    ['1KB', '1MB']
    """
    parts = [p.strip() for p in text.split(",")]
    if not any(parts):
        raise argparse.ArgumentTypeError(f"{what} {text!r}: expected {what} separated by commas")
    empty = [i for i, p in enumerate(parts, 1) if not p]
    if empty:
        raise argparse.ArgumentTypeError(f"{what} {text!r}: entry {empty[0]} of {len(parts)} is "
                                         f"empty; expected {what} separated by single commas")
    return parts


def parse_sizes(text: str) -> list[int]:
    """Comma-separated sizes (at most :data:`MAX_SIZES`), sorted, duplicates removed.

    >>> parse_sizes("1GB,1KB,1MB")
    [1000, 1000000, 1000000000]
    """
    parts = comma_entries(text, "sizes")
    ranged = next((p for p in parts if ":" in p), None)
    if ranged is not None:  # tune-runtime's --sizes is FROM:TO; this one is a list
        raise argparse.ArgumentTypeError(f"size {ranged!r}: expected a list of sizes, like "
                                         "1KB,1MB,1GB, not a FROM:TO range")
    if len(parts) > MAX_SIZES:
        raise argparse.ArgumentTypeError(f"{len(parts)} sizes: at most {MAX_SIZES} (each is "
                                         "priced once per program)")
    return sorted({parse_size(p) for p in parts})


def parse_size_range(text: str) -> tuple[int, int]:
    """``"FROM:TO"`` as two sizes in bytes, FROM < TO.

    >>> parse_size_range("1KB:1GB")
    (1000, 1000000000)
    """
    parts = text.split(":")
    if len(parts) != 2:
        raise argparse.ArgumentTypeError(f"size range {text!r}: expected FROM:TO, like 1KB:1GB")
    lo, hi = parse_size(parts[0]), parse_size(parts[1])
    if not lo < hi:
        raise argparse.ArgumentTypeError(f"size range {text!r}: FROM must be below TO")
    return lo, hi


def format_size(size: Fraction | int | float) -> str:
    """A size in the largest unit that divides it exactly (decimal first), else in bytes.

    >>> format_size(1000), format_size(1048576), format_size(420000), format_size(1500)
    ('1 KB', '1 MiB', '420 KB', '1.5 KB')
    """
    exact = Fraction(size) if not isinstance(size, float) else Fraction(repr(size))
    if exact.denominator != 1:
        return f"{float(exact):.6g} B"
    value = int(exact)
    for unit, scale in sorted(BINARY_UNITS.items(), key=lambda kv: -kv[1]):
        if value >= scale and value % scale == 0:
            return f"{value // scale} {unit}"
    for unit in ("TB", "GB", "MB", "KB"):
        scale = DECIMAL_UNITS[unit]
        if value >= scale and (value * 1000) % scale == 0:
            shown = Fraction(value, scale)
            text = str(shown.numerator) if shown.denominator == 1 else f"{float(shown):g}"
            return f"{text} {unit}"
    return f"{value} B"


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], *, left: Sequence[int] = (),
          separator: str = " | ", rule: bool = True) -> list[str]:
    """Columns separated by ``separator``, numbers right-aligned, columns in ``left``
    left-aligned; a rule under the headers if ``rule`` (drawn for the default separator).

    >>> print("\\n".join(table(("name", "ranks"), [("ring", "4")], left=(0,))))
    name | ranks
    -----+------
    ring |     4
    """
    widths = [max([len(h)] + [len(row[i]) for row in rows]) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        return separator.join(c.ljust(w) if i in left else c.rjust(w)
                              for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    ruler = ["-+-".join("-" * w for w in widths)] if rule else []
    return [line(headers)] + ruler + [line(r) for r in rows]


def each_file_once(paths: Sequence[str], command: str) -> None:
    """Refuse, as a usage error naming both, two paths of one file (``ag.json ./ag.json``, a
    link and its target): it would be read twice (priced twice by ``time``, fitted twice into
    two entries by ``calibrate``), as ``--collectives allreduce,all_reduce`` would be tuned
    twice."""
    from collsynth.errors import shown_path

    seen: dict[str, str] = {}
    for path in paths:
        key = os.path.realpath(path)
        if key in seen:
            given = f"{shown_path(path)} is given twice" if seen[key] == path else \
                f"{shown_path(seen[key])} and {shown_path(path)} name one file"
            raise UsageError.of(command, f"{given}; give each file once")
        seen[key] = path
