"""Packaging: every subpackage ships, and the built-in topology files ship inside the package."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_subpackage_is_listed_in_pyproject():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {
        ".".join(path.parent.relative_to(ROOT).parts)
        for path in (ROOT / "collsynth").rglob("__init__.py")
    }
    assert found <= listed, f"add to pyproject.toml [tool.setuptools] packages: {sorted(found - listed)}"
    assert "collsynth.topologies" in listed


def test_builtin_topology_files_are_found():
    from collsynth.topology.builtins import data_directory

    assert sorted(p.name for p in data_directory().glob("*.json")) == \
        sorted(p.name for p in (ROOT / "topologies").glob("*.json"))
