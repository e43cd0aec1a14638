"""Human-readable rendering of an algorithm, step by step."""

from __future__ import annotations

from collections import defaultdict

from collsynth.algorithm.model import Algorithm
from collsynth.errors import expect_type

__all__ = ["format_algorithm"]


def format_algorithm(algorithm: Algorithm, *, max_sends_per_step: int | None = None) -> str:
    """Text listing of ``algorithm``: a header line, then one block per step.

    Each step lists its sends grouped by link, ``src->dst: chunk, chunk+`` where ``+`` marks a
    reduce (the receiver adds the chunk into its own).
    """
    expect_type(algorithm, Algorithm, "format_algorithm: algorithm")
    a = algorithm
    lines = [
        f"{a.name}: {a.collective.describe()} on {a.topology.name} ({a.topology.num_ranks} ranks)",
        f"steps={a.num_steps} rounds={a.num_rounds} chunks={a.chunks} "
        f"rounds_per_chunk={a.rounds_per_chunk} sends={a.num_sends}",
    ]
    for t, step in enumerate(a.steps):
        by_link: dict[tuple[int, int], list[str]] = defaultdict(list)
        for send in step.sends:
            by_link[(send.src, send.dst)].append(f"{send.chunk}{'+' if send.reduce else ''}")
        lines.append(f"step {t} (rounds={step.rounds}, sends={len(step.sends)}):")
        items = sorted(by_link.items())
        shown = items if max_sends_per_step is None else items[:max_sends_per_step]
        for (src, dst), chunks in shown:
            lines.append(f"  {src}->{dst}: {', '.join(chunks)}")
        if len(shown) < len(items):
            lines.append(f"  ... {len(items) - len(shown)} more links")
    return "\n".join(lines)
