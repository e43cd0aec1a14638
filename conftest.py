"""Import collsynth before pytest collects anything.

With ``--import-mode=importlib`` (pyproject.toml), a module given for its doctests
(``pytest collsynth/topology/model.py tests/...``) is imported by pytest from its file: pytest
first imports the parent package, whose ``__init__`` already imports that module, then
executes the file a second time as a new module and puts it in ``sys.modules``. The package
keeps the first copy's classes and later imports get the second's, so ``isinstance`` fails
between them. With collsynth (and so every subpackage and what their ``__init__`` imports)
already in ``sys.modules``, pytest takes the module from there instead.
"""

import collsynth  # noqa: F401
