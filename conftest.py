"""Import the collsynth modules named on the command line before pytest collects them.

With ``--import-mode=importlib`` (pyproject.toml), a module given for its doctests
(``pytest collsynth/topology/model.py tests/...``) is imported by pytest from its file: pytest
first imports the parent package, whose ``__init__`` may already import that module, then
executes the file a second time as a new module and puts it in ``sys.modules``. The package
keeps the first copy's classes and later imports get the second's, so ``isinstance`` fails
between them. Imported first by their names, such modules are in ``sys.modules`` and pytest
takes them from there.
"""

from __future__ import annotations

import importlib
from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent / "collsynth"


def pytest_configure(config) -> None:
    for arg in config.args:
        path = Path(config.invocation_params.dir, str(arg).split("::")[0]).resolve()
        if path.suffix != ".py" or _PACKAGE not in path.parents:
            continue
        parts = path.relative_to(_PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - pytest's own collection reports the error
            pass
