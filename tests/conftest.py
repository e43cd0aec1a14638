"""Shared pytest configuration for the collsynth test suite."""

from __future__ import annotations


def pytest_configure(config) -> None:
    # Registered here because pyproject.toml is not the tests' to edit; deselect with
    # `pytest -m "not notebook"`.
    config.addinivalue_line(
        "markers", "notebook: executes a notebook in notebooks/ in a fresh kernel (slow)")
    config.addinivalue_line(
        "markers", "slow: takes minutes (a large schedule end to end); deselect with "
                   "`pytest -m \"not slow\"`")
