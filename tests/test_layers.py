"""The package's layers point down only: no import cycle, and no library module imports the CLI.

Imports are read from the source (``ast``), those inside functions and under ``TYPE_CHECKING``
too: an import that only runs later still ties the two modules together.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def import_graph(root: Path) -> dict[str, set[str]]:
    """Module -> the package's modules it imports, for the ``collsynth`` package under ``root``."""
    modules = {}
    for path in (root / "collsynth").rglob("*.py"):
        parts = path.relative_to(root).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(parts + ([base] if base else []))
                targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
            elif isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                continue
            # A package and its own submodules may import each other (re-exports); every other
            # import between the package's modules counts.
            found.update(t for t in targets if t in modules and t != name
                         and not name.startswith(t + ".") and not t.startswith(name + "."))
        graph[name] = found
    return graph


def cycles(graph: dict[str, set[str]]) -> list[tuple[str, ...]]:
    reach: dict[str, set[str]] = {}
    for start in graph:
        seen, todo = set(), [start]
        while todo:
            for nxt in graph[todo.pop()]:
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        reach[start] = seen
    return sorted({tuple(sorted(m for m in reach[a] if a in reach[m])) for a in graph
                   if a in reach[a]})


def is_cli(name: str) -> bool:
    """The command line: the package ``collsynth.cli`` and ``python -m collsynth``."""
    return name in ("collsynth.cli", "collsynth.__main__") or name.startswith("collsynth.cli.")


def cli_imports(graph: dict[str, set[str]]) -> list[str]:
    return sorted(f"{name} imports {target}" for name, targets in graph.items()
                  if not is_cli(name) for target in targets if is_cli(target))


def test_no_import_cycle():
    found = cycles(import_graph(ROOT))
    assert not found, "import cycles: " + "; ".join(" <-> ".join(c) for c in found)


def test_no_library_module_imports_the_cli():
    offenders = cli_imports(import_graph(ROOT))
    assert not offenders, "; ".join(offenders)


def test_the_checks_catch_a_cycle_and_a_cli_import(tmp_path):
    package = tmp_path / "collsynth"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from collsynth import b\n")
    (package / "b.py").write_text("def f():\n    from collsynth.a import x\n")
    (package / "c.py").write_text("from collsynth.cli.export import run\n")
    (package / "d.py").write_text("def f():\n    import collsynth.cli\n")
    (package / "cli").mkdir()
    (package / "cli" / "__init__.py").write_text("from collsynth.cli import export\n")
    (package / "cli" / "export.py").write_text("from collsynth import c\n")
    graph = import_graph(tmp_path)
    assert ("collsynth.a", "collsynth.b") in cycles(graph)
    assert cli_imports(graph) == ["collsynth.c imports collsynth.cli.export",
                                  "collsynth.d imports collsynth.cli"]


#: What the runtime registry may import: it is plain data below export, executor and timing
#: (and above topology: the machine facts name the network classes its constants are kept by).
RUNTIMES_MAY_IMPORT = ("collsynth.errors", "collsynth._parse", "collsynth.collective",
                       "collsynth.runtimes", "collsynth.topology.machine")


def test_the_runtime_registry_sits_below_export_executor_and_timing():
    graph = import_graph(ROOT)
    above = sorted(f"{name} imports {target}" for name, targets in graph.items()
                   if name == "collsynth.runtimes" or name.startswith("collsynth.runtimes.")
                   for target in targets
                   if not any(target == allowed or target.startswith(allowed + ".")
                              for allowed in RUNTIMES_MAY_IMPORT))
    assert not above, "; ".join(above)
    # and the layers above use it, not a copy of their own
    users = {name.split(".")[1] for name, targets in graph.items()
             if any(t == "collsynth.runtimes" or t.startswith("collsynth.runtimes.")
                    for t in targets)}
    assert {"export", "timing", "plan", "cli"} <= users
