"""Every notebook in notebooks/ runs from top to bottom without an error.

The notebooks assert their own claims (bounds, fronts, the crossover size), so running them is a
test of both the notebook and the library. Deselect with ``pytest -m "not notebook"``.

The kernel is this test's own interpreter: :class:`_ThisInterpreterKernel` hands nbclient an
in-memory kernel spec running ``sys.executable -m ipykernel_launcher``, so the result does not
depend on which ``python3`` kernel spec Jupyter would find (a user-level one may point at another
Python without collsynth). ``kernel_manager_class`` is a documented nbclient option
(nbclient 0.11, jupyter_client 8). Each notebook runs in a temporary working directory, so
anything it writes stays out of the repository.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")
from jupyter_client.kernelspec import KernelSpec  # noqa: E402 (after the skips)
from jupyter_client.manager import AsyncKernelManager  # noqa: E402

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))
#: Seconds any one cell may run.
CELL_TIMEOUT_S = 300


class _ThisInterpreterKernel(AsyncKernelManager):
    """A kernel manager whose kernel is an IPython kernel on ``sys.executable``."""

    @property
    def kernel_spec(self) -> KernelSpec:
        return KernelSpec(
            argv=[sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            display_name=f"Python {sys.version_info.major}.{sys.version_info.minor} (tests)",
            language="python",
        )


def test_there_are_notebooks():
    assert NOTEBOOKS, "notebooks/ has no .ipynb file"


@pytest.mark.notebook
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs(path: Path):
    """Run the notebook as Jupyter would: from its own folder (notebooks find ``data/``
    relative to the repository, and write no files)."""
    notebook = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(
        notebook,
        timeout=CELL_TIMEOUT_S,
        kernel_name="python3",
        kernel_manager_class=_ThisInterpreterKernel,
        resources={"metadata": {"path": str(path.parent)}},
    )
    client.execute()  # raises CellExecutionError, with the failing cell and traceback
    errors = [output for cell in notebook.cells if cell.cell_type == "code"
              for output in cell.get("outputs", []) if output.get("output_type") == "error"]
    assert not errors
