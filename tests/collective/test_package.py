"""What ``collsynth.collective`` exports: the collective file's reader and writer too."""

from __future__ import annotations

import pytest

import collsynth.collective as package
from collsynth.errors import FileFormatError


def test_the_file_functions_are_exported(tmp_path):
    from collsynth.collective import load_collective, save_collective

    assert {"load_collective", "save_collective", "collective_from_json",
            "collective_to_json"} <= set(package.__all__)
    # A custom collective (rank 0's chunk to ranks 1 and 2) survives the round trip.
    custom = package.from_conditions("fan", 3, 1, [(0, 0)], [(0, 0), (1, 0), (2, 0)])
    path = tmp_path / "fan.json"
    save_collective(custom, path)
    again = load_collective(path)
    assert again == custom and again.postcondition[0] == frozenset({0, 1, 2})
    path.write_text("{}")
    with pytest.raises(FileFormatError, match="fan.json"):
        load_collective(path)
