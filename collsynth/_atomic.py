"""Atomic file writes: a reader (or an interrupted run) never sees a half-written file.

Kept for the modules that import it; the policy and the writers live in :mod:`collsynth._output`.
"""

from __future__ import annotations

from collsynth._output import open_atomic, write_bytes_atomic, write_text_atomic

__all__ = ["write_text_atomic", "write_bytes_atomic", "open_atomic"]
