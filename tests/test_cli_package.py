"""The shape of the ``collsynth.cli`` package: every command module registers a handler, ``--help``
lists every command, handlers raise and :func:`collsynth.cli.main` alone turns what they raise
into an exit code and one line on stderr.
"""

from __future__ import annotations

import argparse
import ast
from pathlib import Path

import pytest

from collsynth import cli
from collsynth.cli.common import Interrupted, Parser
from collsynth.errors import CollsynthError, UnimplementableError
from collsynth.limits import TimeLimitReached

PACKAGE = Path(cli.__file__).parent

#: The commands the README and docs/cli.md document, written out by hand.
DOCUMENTED = {"topologies", "bounds", "solve", "show", "verify", "export", "check", "time", "plot",
              "calibrate", "bench", "run", "trace", "plan", "draw", "tune-runtime"}


def _leaves(parser: argparse.ArgumentParser, path: str):
    """``(command path, parser)`` of every parser that runs something (no sub-commands)."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield path, parser
        return
    for name, child in subs[0].choices.items():
        yield from _leaves(child, f"{path} {name}")


def _sources():
    return {path.stem: path.read_text(encoding="utf-8") for path in sorted(PACKAGE.glob("*.py"))}


def test_every_command_module_registers_a_handler():
    names = set()
    for module in cli.COMMANDS:
        parser = Parser(prog="collsynth")
        commands = parser.add_subparsers(dest="command")
        module.register(commands)
        assert commands.choices, f"{module.__name__} registers no command"
        names |= set(commands.choices)
        for path, leaf in _leaves(parser, "collsynth"):
            handler = leaf.get_default("handler")
            assert callable(handler), f"{path} ({module.__name__}) sets no handler"
    assert names == DOCUMENTED


def test_every_module_with_a_register_function_is_a_command():
    registering = {f"collsynth.cli.{stem}" for stem, text in _sources().items()
                   if any(isinstance(node, ast.FunctionDef) and node.name == "register"
                          for node in ast.parse(text).body)}
    assert registering == {module.__name__ for module in cli.COMMANDS}


def test_help_lists_every_command(capsys):
    assert cli.main(["--help"]) == cli.EXIT_OK
    text = capsys.readouterr().out
    section = text.split("positional arguments:")[1].split("options:")[0]
    listed = {line.split()[0] for line in section.splitlines() if line.startswith("    ")
              and not line.startswith("     ")}
    assert listed == DOCUMENTED


def test_only_main_exits_or_writes_error_lines():
    """Handlers raise: no module but ``__init__`` calls ``sys.exit`` (or ``exit``, ``os._exit``)
    or spells an ``error:`` line of its own."""
    for stem, text in _sources().items():
        if stem == "__init__":
            continue
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Call):
                func = node.func
                name = func.id if isinstance(func, ast.Name) else \
                    func.attr if isinstance(func, ast.Attribute) else None
                assert name not in ("exit", "_exit", "quit"), \
                    f"collsynth/cli/{stem}.py:{node.lineno} calls {name}()"
            if isinstance(node, ast.Raise) and node.exc is not None:
                raised = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
                assert not (isinstance(raised, ast.Name) and raised.id == "SystemExit"), \
                    f"collsynth/cli/{stem}.py:{node.lineno} raises SystemExit"
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                assert "error:" not in node.value, \
                    f"collsynth/cli/{stem}.py:{node.lineno} writes an error line itself"


# -- main maps what a handler raises ---------------------------------------------------------------


@pytest.mark.parametrize("raised,code,line", [
    (CollsynthError("bad\ninput"), 1, "collsynth: error: bad input"),
    (UnimplementableError("rank 3 cannot get chunk 0", rank=3, chunk=0), 3,
     "collsynth: error: not implementable on this topology: rank 3 cannot get chunk 0"),
    (TimeLimitReached("time limit of 1 s reached"), 4,
     "collsynth: error: time limit of 1 s reached"),
    (FileNotFoundError(2, "No such file or directory", "x.json"), 1,
     "collsynth: error: No such file or directory: x.json"),
    (KeyboardInterrupt(), 130, "collsynth: interrupted"),
    (Interrupted("nothing written"), 130, "collsynth: interrupted: nothing written"),
])
def test_main_maps_a_handler_error_to_its_exit_code(monkeypatch, capsys, raised, code, line):
    def handler(*args, **kwargs):
        raise raised

    monkeypatch.setattr(cli.topologies, "list_topologies", handler)
    assert cli.main(["topologies"]) == code
    out, err = capsys.readouterr()
    assert out == "" and err == line + "\n"


@pytest.fixture(scope="module")
def algorithm_file(tmp_path_factory):
    from collsynth.algorithm import save_algorithm
    from collsynth.collective import standard_collective
    from collsynth.synthesis import solve_least_steps
    from collsynth.topology import get_topology

    path = tmp_path_factory.mktemp("algorithm") / "ag.json"
    save_algorithm(solve_least_steps(get_topology("ring:4"),
                                     standard_collective("allgather", 4)).algorithm, path)
    return path


def _one_error_line(capsys, prefix: str, fragment: str) -> None:
    out, err = capsys.readouterr()
    assert out == ""
    [line] = err.splitlines()
    assert line.startswith(prefix) and fragment in line, err


def test_check_of_a_missing_file_exits_1_in_one_line(tmp_path, capsys):
    assert cli.main(["check", str(tmp_path / "nope.xml")]) == cli.EXIT_ERROR
    _one_error_line(capsys, "collsynth: error: ", "nope.xml")


def test_run_of_a_missing_file_exits_1_in_one_line(tmp_path, capsys):
    assert cli.main(["run", str(tmp_path / "nope.json")]) == cli.EXIT_ERROR
    _one_error_line(capsys, "collsynth: error: ", "nope.json")


@pytest.mark.parametrize("argv,fragment", [
    (["--root", "1"], "--root is for XML programs"),
    (["--ranks", "8"], "is for 4 ranks"),
])
def test_run_arguments_that_do_not_fit_the_file_exit_2_in_one_line(algorithm_file, capsys,
                                                                    argv, fragment):
    assert cli.main(["run", str(algorithm_file), *argv]) == cli.EXIT_USAGE
    _one_error_line(capsys, "collsynth run: error: ", fragment)


def test_export_options_that_contradict_exit_2_in_one_line(algorithm_file, tmp_path, capsys):
    assert cli.main(["export", str(algorithm_file), "-o", str(tmp_path / "ag.xml"),
                     "--min-bytes", "10", "--max-bytes", "5"]) == cli.EXIT_USAGE
    _one_error_line(capsys, "collsynth export: error: ",
                    "--max-bytes 5 is below --min-bytes 10 (see 'collsynth export --help')")
    assert not (tmp_path / "ag.xml").exists()
