"""Hostile input, round 7: what the eighth session left open and the ninth session's hunt
found, fixed in the ninth.

Each case failed on the code before its fix.
"""

from __future__ import annotations

import warnings

import pytest

from collsynth.cli.time import _warn_other_machine
from collsynth.errors import InputWarning


@pytest.mark.parametrize("measured_on, timed, warns", [
    ("a100", "DGX-A100", True),          # a part of a name is another machine
    ("dgx", "DGX-A100", True),
    ("dgx-a100", "DGX-A100", False),     # case, '-' and '_' do not count
    ("DGX_A100", "dgx-a100", False),
    ("dgx-a100", "DGX-A100x2", False),   # the node of a composed machine
    ("dgx-a100", "DGX-A100x16", False),
    ("dgx-a100x2", "DGX-A100", True),    # two nodes' figures on one
    ("mi300x", "MI300Xx4", False),
    ("mi300x", "DGX-A100", True),
])
def test_another_machine_is_told_by_the_whole_name(measured_on, timed, warns):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _warn_other_machine(measured_on, timed, "c.json")
    assert any(issubclass(w.category, InputWarning) for w in caught) == warns
