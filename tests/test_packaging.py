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


def test_a_non_editable_install_finds_the_builtin_topologies(tmp_path):
    """Build and install the package (no dependencies) into a folder and list the built-ins
    from a fresh interpreter whose working directory is not the checkout."""
    import subprocess
    import sys

    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                    "--target", str(target), str(ROOT)], check=True, capture_output=True)
    script = ("from collsynth.topology import list_topologies, get_topology; "
              "print(len([r for r in list_topologies() if r[1]]), get_topology('dgx1').num_ranks)")
    out = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, check=True,
                         capture_output=True, text=True, env={"PYTHONPATH": str(target)}).stdout
    files = len(list((ROOT / "topologies").glob("*.json")))
    assert out.split() == [str(files), "8"]
