"""Re-execute notebooks in place and save their outputs (figures included), so that they can be
committed with what they show.

    python notebooks/execute.py                       # every notebook in notebooks/
    python notebooks/execute.py notebooks/drawing.ipynb

Each notebook runs from top to bottom in a fresh kernel on this interpreter, from its own folder
(as Jupyter and tests/test_notebooks.py run it), with this checkout's ``collsynth`` first on the
path. A notebook that raises is left untouched and the script exits 1 after trying the others.
No timing metadata is recorded, so re-running unchanged code changes only what the code prints.
Figures are as small as the notebooks make them (they display PNGs at a modest resolution); a
notebook larger than ``--max-kb`` after execution is reported and not written.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import nbclient
import nbformat
from jupyter_client.kernelspec import KernelSpec
from jupyter_client.manager import AsyncKernelManager

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
#: Seconds any one cell may run (as in tests/test_notebooks.py).
CELL_TIMEOUT_S = 300


class _ThisInterpreterKernel(AsyncKernelManager):
    """An IPython kernel on ``sys.executable``, whatever kernel specs Jupyter would find."""

    @property
    def kernel_spec(self) -> KernelSpec:
        return KernelSpec(
            argv=[sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            display_name=f"Python {sys.version_info.major}.{sys.version_info.minor}",
            language="python",
        )


def execute(path: Path) -> nbformat.NotebookNode:
    """The notebook at ``path``, executed (raises ``CellExecutionError`` on an error)."""
    notebook = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(
        notebook,
        timeout=CELL_TIMEOUT_S,
        kernel_name="python3",
        kernel_manager_class=_ThisInterpreterKernel,
        resources={"metadata": {"path": str(path.parent)}},
        record_timing=False,
    )
    client.execute()
    return notebook


def shrink_images(notebook: nbformat.NotebookNode, *, colours: int = 256) -> None:
    """Re-encode every PNG output with a palette of ``colours`` colours: plots are flat colours
    and thin anti-aliased lines, so they look the same at about a third of the size."""
    import base64
    import io

    from PIL import Image  # matplotlib's own dependency

    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            if "image/png" not in data:
                continue
            raw = base64.b64decode(data["image/png"])
            with Image.open(io.BytesIO(raw)) as image:
                reduced = image.convert("RGB").quantize(colors=colours,
                                                        method=Image.Quantize.FASTOCTREE)
            out = io.BytesIO()
            reduced.save(out, format="PNG", optimize=True)
            if out.tell() < len(raw):
                data["image/png"] = base64.b64encode(out.getvalue()).decode("ascii")


def write_atomic(path: Path, notebook: nbformat.NotebookNode) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            nbformat.write(notebook, handle)
        os.chmod(tmp, path.stat().st_mode & 0o777)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("notebooks", nargs="*", type=Path,
                        help="notebooks to execute (default: every notebooks/*.ipynb)")
    parser.add_argument("--max-kb", type=int, default=1024,
                        help="largest notebook written, in KiB (default 1024)")
    args = parser.parse_args(argv)
    paths = args.notebooks or sorted(HERE.glob("*.ipynb"))
    # The kernel imports this checkout's collsynth, not another installed one.
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(REPO)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
    failed = 0
    for path in paths:
        started = time.perf_counter()
        try:
            notebook = execute(path.resolve())
        except Exception as exc:  # a cell failed: say which, keep the file as it was
            failed += 1
            first = str(exc).strip().splitlines()
            print(f"{path}: FAILED: {first[-1] if first else type(exc).__name__}",
                  file=sys.stderr)
            continue
        shrink_images(notebook)
        size_kb = len(nbformat.writes(notebook).encode()) / 1024
        if size_kb > args.max_kb:
            failed += 1
            print(f"{path}: {size_kb:.0f} KiB with outputs, more than --max-kb {args.max_kb}; "
                  "not written (show smaller figures)", file=sys.stderr)
            continue
        write_atomic(path.resolve(), notebook)
        print(f"{path}: executed in {time.perf_counter() - started:.1f} s, {size_kb:.0f} KiB")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
