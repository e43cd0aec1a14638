"""Run an unmodified script (or module) under the tracer: ``python -m collsynth.trace.run``.

The details: ``docs/trace.md``, section "Tracing an unmodified script".
"""

from __future__ import annotations

import os
import runpy
import sys
from typing import Mapping, Sequence

from collsynth.trace.tracer import ranks_per_node_from_env, tracing

__all__ = ["main", "options_from_env", "ENV_DIR"]

#: The environment variable naming the trace directory.
ENV_DIR = "COLLSYNTH_TRACE_DIR"
_USAGE = ("usage: COLLSYNTH_TRACE_DIR=DIR python -m collsynth.trace.run "
          "(SCRIPT.py | -m MODULE) [ARGS...]")


def _flag(env: Mapping[str, str], name: str, default: bool) -> bool:
    text = env.get(name, "").strip().lower()
    if not text:
        return default
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{name} = {text!r}; expected 1 or 0")


def options_from_env(env: Mapping[str, str]) -> dict[str, object]:
    """The :func:`~collsynth.trace.tracing` arguments the environment ``env`` asks for.

    >>> options = options_from_env({"COLLSYNTH_TRACE_DIR": "t",
    ...                              "COLLSYNTH_TRACE_RANKS_PER_NODE": "8"})
    >>> options["directory"], options["ranks_per_node"], options["record_durations"]
    ('t', 8, False)

    Raises
    ------
    ValueError
        A missing ``COLLSYNTH_TRACE_DIR`` or a malformed value.
    """
    directory = env.get(ENV_DIR, "").strip()
    if not directory:
        raise ValueError(f"{ENV_DIR} is not set; set it to the directory for the trace files")
    ranks_per_node = ranks_per_node_from_env("COLLSYNTH_TRACE_RANKS_PER_NODE", env)
    return {"directory": directory,
            "record_durations": _flag(env, "COLLSYNTH_TRACE_DURATIONS", False),
            "cross_node_only": _flag(env, "COLLSYNTH_TRACE_CROSS_NODE_ONLY", False),
            "ranks_per_node": ranks_per_node,
            "ddp": _flag(env, "COLLSYNTH_TRACE_DDP", True)}


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    """Run the script or module of ``argv`` (default ``sys.argv[1:]``) under the tracer; return
    its exit status (2 for a bad command line or environment)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "--":
        args = args[1:]
    if args and args[0] in ("-h", "--help"):
        print(__doc__, file=sys.stdout)
        return 0
    if not args or (args[0] == "-m" and len(args) < 2):
        print(_USAGE, file=sys.stderr)
        return 2
    try:
        options = options_from_env(os.environ if env is None else env)
    except ValueError as exc:
        print(f"collsynth.trace.run: error: {exc}", file=sys.stderr)
        return 2
    module = args[0] == "-m"
    target = args[1] if module else args[0]
    if not module and not os.path.isfile(target):
        print(f"collsynth.trace.run: error: no such script: {target}", file=sys.stderr)
        return 2
    directory = options.pop("directory")
    saved_argv, saved_path = sys.argv[:], sys.path[:]
    sys.argv = args[1:] if module else args
    if not module:
        sys.path.insert(0, os.path.dirname(os.path.abspath(target)))
    code: int = 0
    global _RAN
    _RAN = True
    try:
        with tracing(directory, **options):  # type: ignore[arg-type]
            try:
                if module:
                    runpy.run_module(target, run_name="__main__", alter_sys=True)
                else:
                    runpy.run_path(target, run_name="__main__")
            except SystemExit as exc:
                if exc.code is None or isinstance(exc.code, int):
                    code = exc.code or 0
                else:
                    print(exc.code, file=sys.stderr)
                    code = 1
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
    return code


#: Whether :func:`main` ran a script (set before it returns).
_RAN = False


def _exit(code: int) -> None:
    """Exit with ``code``. After a run that used torch.distributed, exit handlers run and the
    streams are flushed as at any exit, but the interpreter's teardown is skipped: there
    torch's C++ objects (gloo's threads) can abort a process whose work is done ("terminate
    called without an active exception"), and the launcher then reports a failed rank."""
    if not _RAN or "torch.distributed" not in sys.modules:
        sys.exit(code)
    import atexit

    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed or broken stream: nothing left to write
            pass
    os._exit(code)


if __name__ == "__main__":
    _exit(main())
