"""``notebooks/execute.py`` saves a notebook's outputs in place, and leaves a failing one as it was.

Deselect with ``pytest -m "not notebook"`` (it starts kernels).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")
from nbformat.v4 import new_code_cell, new_notebook  # noqa: E402 (after the skips)

SCRIPT = Path(__file__).resolve().parents[1] / "notebooks" / "execute.py"


def load_script():
    spec = importlib.util.spec_from_file_location("notebook_execute", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.notebook
def test_execute_saves_outputs_and_keeps_failing_notebooks(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", "")  # the script puts the repository first itself
    good = tmp_path / "good.ipynb"
    nbformat.write(new_notebook(cells=[new_code_cell(
        "import collsynth\nprint(6 * 7)\nprint(collsynth.__file__)")]), good)
    bad = tmp_path / "bad.ipynb"
    nbformat.write(new_notebook(cells=[new_code_cell("print('before')"),
                                       new_code_cell("raise RuntimeError('broken on purpose')")]),
                   bad)
    before_bad = bad.read_bytes()

    code = load_script().main([str(good), str(bad)])
    out, err = capsys.readouterr()

    assert code == 1
    assert "bad.ipynb: FAILED" in err and "broken on purpose" in err
    assert bad.read_bytes() == before_bad
    cell = nbformat.read(good, as_version=4).cells[0]
    texts = "".join(o.get("text", "") for o in cell.outputs)
    answer, imported = texts.splitlines()
    assert answer == "42"
    assert Path(imported).resolve().is_relative_to(SCRIPT.parents[1])  # this checkout's
    assert "execution" not in cell.metadata  # no timestamps: re-running changes nothing else
    assert "good.ipynb: executed" in out
