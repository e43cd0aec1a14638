"""Chrome traces of simulated steps: valid JSON with one complete event per timeline event."""

from __future__ import annotations

import json

import pytest

from collsynth.topology import get_topology
from collsynth.training import ParallelStrategy, mlp, simulate, write_chrome_trace

DGX = get_topology("dgx-a100")


@pytest.fixture(scope="module")
def result():
    strategy = ParallelStrategy(data=2, tensor=2, pipeline=2, microbatches=2)
    return simulate(mlp(4, 256), 32, strategy, DGX)


def test_trace_file_is_valid_json_with_the_events(result, tmp_path):
    (tmp_path / "out").mkdir()  # writers never create missing folders
    path = write_chrome_trace(result, tmp_path / "out" / "step.json")
    assert sorted(p.name for p in path.parent.iterdir()) == ["step.json"]  # no temporary left
    trace = json.loads(path.read_text())
    complete = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert len(complete) == len(result.events)
    for event, source in zip(complete, result.events):
        assert event["pid"] == source.device and event["name"] == source.name
        assert event["ts"] == source.start_us and event["dur"] == source.duration_us
        assert event["cat"] in ("compute", "comm", "idle")
        assert 0 <= event["ts"] and event["ts"] + event["dur"] <= result.step_time_us + 1e-6
    assert {e["pid"] for e in complete} == set(range(8))
    names = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"]
             if e["ph"] == "M" and e["name"] == "process_name"}
    assert names[5] == "device 5 (stage 1, replica 0, tensor 1)"
    threads = {e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"}
    assert threads == {"compute", "send", "recv", "gradients"}
    assert trace["otherData"]["step_time_us"] == result.step_time_us


def test_every_device_timeline_covers_the_step(result):
    for device, events in result.timelines.items():
        compute = sorted((e for e in events if e.stream == "compute"), key=lambda e: e.start_us)
        assert compute[0].start_us == 0.0
        assert compute[-1].end_us == pytest.approx(result.step_time_us)
        for a, b in zip(compute, compute[1:]):
            assert b.start_us == pytest.approx(a.end_us)   # no gap, no overlap
    kinds = {(e.category, e.stream) for e in result.events}
    assert {("compute", "compute"), ("comm", "compute"), ("idle", "compute"),
            ("comm", "send"), ("comm", "recv")} <= kinds


def test_trace_without_timelines(tmp_path):
    quiet = simulate(mlp(2, 64), 8, ParallelStrategy(pipeline=2), DGX, timelines=False)
    trace = json.loads(write_chrome_trace(quiet, tmp_path / "q.json").read_text())
    assert not [e for e in trace["traceEvents"] if e["ph"] == "X"]
