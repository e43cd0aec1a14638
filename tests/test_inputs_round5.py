"""Hostile input, round 5: what the seventh session's hunt found.

Each case failed on the code before its fix: a trace call of 10 bytes of float32, or with
``raw.element_size`` 2 for a float32 tensor, was read and planned with an element count no
runtime would see.
"""

from __future__ import annotations

import json

import pytest

from collsynth import cli
from collsynth.errors import FileFormatError
from collsynth.trace import read_trace

_HEADER = {"type": "header", "format": "collsynth-trace", "version": 1, "rank": 0,
           "world_size": 1, "backend": "gloo", "byte_convention": "nccl-tests",
           "hostname": "h", "pid": 1, "torch_version": "2.13.0", "started_unix": 0.0,
           "record_durations": False, "cross_node_only": False, "ranks_per_node": 1}


def _trace(tmp_path, **fields):
    call = {"type": "call", "seq": 0, "kind": "allreduce", "function": "all_reduce",
            "bytes": 64, "dtype": "float32", "op": "sum", "group": [0], "group_size": 1,
            "root": None, "peer": None, "async_op": False, "site": None, "duration_us": None,
            "cross_node": None, "batch": None, "error": None, "raw": {}}
    call.update(fields)
    folder = tmp_path / "trace"
    folder.mkdir(exist_ok=True)
    (folder / "rank-00000.jsonl").write_text(json.dumps(_HEADER) + "\n" + json.dumps(call) + "\n")
    return folder


@pytest.mark.parametrize("fields, message", [
    ({"bytes": 10}, r"line 2: field 'bytes': 10 is not a whole number of 4-byte elements \(float32\)"),
    ({"raw": {"element_size": 2}}, "field 'raw.element_size': 2, but dtype float32 has 4 bytes"),
    ({"dtype": "bfloat16", "bytes": 65, "raw": {}}, "65 is not a whole number of 2-byte"),
    ({"dtype": None, "bytes": 66, "raw": {"element_size": 4}}, "66 is not a whole number of 4-byte"),
])
def test_a_trace_call_is_a_whole_number_of_its_dtype_s_elements(tmp_path, fields, message):
    with pytest.raises(FileFormatError, match=message) as caught:
        read_trace(_trace(tmp_path, **fields))
    assert "rank-00000.jsonl" in str(caught.value)


@pytest.mark.parametrize("fields", [
    {"bytes": 64, "raw": {"element_size": 4}},
    {"dtype": "torch.float16", "bytes": 6, "raw": {"element_size": 2}},
    {"dtype": "float8_e7m0fnu", "bytes": 9, "raw": {"element_size": 3}},  # a dtype not in the table
    {"dtype": None, "bytes": 7, "raw": {}},  # nothing says how wide an element is
])
def test_consistent_or_unknown_widths_are_read(tmp_path, fields):
    assert read_trace(_trace(tmp_path, **fields)).rank(0).calls[0].bytes == fields["bytes"]


def test_plan_names_the_trace_field_and_writes_nothing(tmp_path, capsys):
    folder = _trace(tmp_path, raw={"element_size": 8})
    out = tmp_path / "plan"
    assert cli.main(["plan", str(folder), "--topology", "dgx1", "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert "field 'raw.element_size': 8, but dtype float32 has 4 bytes per element" in err
    assert "Traceback" not in err and not out.exists()


def _slow_pricing(monkeypatch):
    """Pricing that takes 0.2 s per subject, and heartbeats every 10 ms."""
    import time

    from collsynth.cli import time as time_cli
    from collsynth.timing.program_model import ProgramModel

    price = ProgramModel.price

    def slow(self, subject, sizes):
        time.sleep(0.2)
        return price(self, subject, sizes)

    monkeypatch.setattr(ProgramModel, "price", slow)
    monkeypatch.setattr(time_cli, "PROGRESS_INTERVAL_S", 0.01)


def test_time_says_what_it_prices_while_it_runs_long(monkeypatch, capsys):
    # 512 ranks used to price for 30 s to a minute without a word.
    _slow_pricing(monkeypatch)
    assert cli.main(["time", "--collective", "allgather", "--topology", "dgx1",
                     "--sizes", "1MB"]) == 0
    captured = capsys.readouterr()
    assert "  time: pricing nccl-ring on 8 ranks, 0 s so far" in captured.err
    assert "nccl-ring" in captured.out and "so far" not in captured.out


def test_time_quiet_prints_no_progress(monkeypatch, capsys):
    _slow_pricing(monkeypatch)
    assert cli.main(["time", "--collective", "allgather", "--topology", "dgx1",
                     "--sizes", "1MB", "-q"]) == 0
    assert "so far" not in capsys.readouterr().err


def test_a_runtime_algorithm_that_fails_at_one_size_is_an_error_not_a_crash():
    # GB200 NVL72 x2: NCCL's ring passed the model's check on its default channels, then at
    # 512 MiB its 32 channels came to 1.3 million steps; `time` failed as a whole after 20 s.
    from collsynth.errors import InputTooLargeError
    from collsynth.runtimes import get_runtime
    from collsynth.timing.closed_form import ClosedForm
    from collsynth.timing.pricing import price_table, runtime_algorithms
    from collsynth.topology import get_topology

    class FailsOnRings(ClosedForm):
        def price(self, subject, sizes):
            if subject.algorithm == "ring":
                raise InputTooLargeError("the ring has too many steps")
            return super().price(subject, sizes)

    subjects = runtime_algorithms(get_runtime("nccl"), "allreduce", get_topology("dgx1"))
    table = price_table(subjects, [1000, 10**9], FailsOnRings())
    assert table.errors == {"nccl-ring": "the ring has too many steps"}
    assert table.subjects == ("nccl-tree",)
    assert {p.subject for p in table.prices} == {"nccl-tree"}
