"""Write a simulated step as a Chrome trace (``chrome://tracing``, https://ui.perfetto.dev).

The events, processes and threads written are described in docs/training.md.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from collsynth._atomic import write_text_atomic
from collsynth.training.simulate import STREAMS, SimulationResult

__all__ = ["chrome_trace", "write_chrome_trace"]


def chrome_trace(result: SimulationResult) -> dict[str, Any]:
    """The trace as a JSON-ready dict (docs/training.md).

    >>> from collsynth.topology import get_topology
    >>> from collsynth.training import ParallelStrategy, mlp, simulate
    >>> result = simulate(mlp(2, 256), 8, ParallelStrategy(pipeline=2), get_topology("dgx-a100"))
    >>> trace = chrome_trace(result)
    >>> sorted({e["ph"] for e in trace["traceEvents"]})
    ['M', 'X']
    >>> {e["pid"] for e in trace["traceEvents"]}
    {0, 1}
    """
    events: list[dict[str, Any]] = []
    tids = {name: i for i, name in enumerate(STREAMS)}
    for index, rank in enumerate(result.devices):
        stage, replica, tensor = result.strategy.coordinates(index)
        events.append({"name": "process_name", "ph": "M", "pid": rank, "tid": 0,
                       "args": {"name": f"device {rank} (stage {stage}, replica {replica}, "
                                        f"tensor {tensor})"}})
        events.append({"name": "process_sort_index", "ph": "M", "pid": rank, "tid": 0,
                       "args": {"sort_index": index}})
        for name, tid in tids.items():
            events.append({"name": "thread_name", "ph": "M", "pid": rank, "tid": tid,
                           "args": {"name": name}})
    for e in result.events:
        events.append({"name": e.name, "cat": e.category, "ph": "X", "pid": e.device,
                       "tid": tids[e.stream], "ts": e.start_us, "dur": e.duration_us})
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {
            "strategy": result.strategy.label(),
            "step_time_us": result.step_time_us,
            "throughput_samples_per_s": result.throughput,
            "speedup": result.speedup,
            "batch_size": result.batch_size,
        },
    }


def write_chrome_trace(result: SimulationResult, path: str | os.PathLike[str]) -> Path:
    """Write :func:`chrome_trace` to ``path`` as JSON, atomically; returns the path.

    A result simulated with ``timelines=False`` has no events: only the metadata is written.
    """
    target = Path(path)
    write_text_atomic(target, json.dumps(chrome_trace(result), separators=(",", ":")))
    return target
