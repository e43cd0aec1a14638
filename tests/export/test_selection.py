"""Which MSCCL program a runtime runs on a call (docs/msccl-xml.md §4.2, §13): the size range
as each runtime reads ``maxBytes``, the layout flags, the collective's spelling, the count rule.
Expected values are read off the spec's attribute table, not the code."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from collsynth.export.program import Program
from collsynth.export.selection import (byte_range, in_size_range, layouts, runs_on_call,
                                        selected_program)
from collsynth.export.xml_reader import load_program

SCHEDULER = Path(__file__).resolve().parents[2] / "data" / "msccl-xml" / "msccl-scheduler"


def _program(**fields) -> Program:
    base = Program(name="p", proto="LL", nchannels=1, nchunksperloop=8, ngpus=8,
                   coll="allreduce", inplace=1, gpus=(), outofplace=1, min_bytes=1024,
                   max_bytes=4096)
    return dataclasses.replace(base, **fields)


@pytest.mark.parametrize("runtime, size, inside", [
    # msccl: maxBytes is exclusive; rccl and msccl-executor: inclusive.
    ("msccl", 1023, False), ("msccl", 1024, True), ("msccl", 4095, True), ("msccl", 4096, False),
    ("rccl", 4096, True), ("msccl-executor", 4096, True), ("msccl-executor", 4097, False),
])
def test_size_range_per_runtime(runtime, size, inside):
    assert in_size_range(_program(), size, runtime) is inside


def test_max_bytes_zero_and_absent():
    # 0: no limit for rccl and msccl-executor, never for msccl; absent: 128 MiB for msccl.
    zero = _program(max_bytes=0, min_bytes=0)
    assert in_size_range(zero, 1 << 40, "rccl") and in_size_range(zero, 1 << 40, "msccl-executor")
    assert not in_size_range(zero, 1, "msccl")
    absent = _program(max_bytes=None, min_bytes=None)
    assert in_size_range(absent, (128 << 20) - 1, "msccl")
    assert not in_size_range(absent, 128 << 20, "msccl")


def test_layout_flags_per_runtime():
    # msccl: inplace=1 is for in-place calls ONLY; the others read each layout's own flag.
    both = _program(inplace=1, outofplace=1)
    assert runs_on_call(both, 2048, runtime="msccl-executor", collective="allreduce",
                        in_place=False)
    assert not runs_on_call(both, 2048, runtime="msccl", collective="allreduce",
                            in_place=False)
    # ... except an alltoall, whose layout msccl does not compare (§13.1)
    a2a = _program(coll="alltoall", inplace=1)
    assert runs_on_call(a2a, 2048, runtime="msccl", collective="alltoall", in_place=False)
    only_out = _program(inplace=0, outofplace=1)
    assert runs_on_call(only_out, 2048, runtime="msccl", collective="allreduce", in_place=False)
    assert not runs_on_call(only_out, 2048, runtime="rccl", collective="allreduce",
                            in_place=True)


def test_collective_spelling_and_count():
    rs = _program(coll="reducescatter")
    assert runs_on_call(rs, 2048, runtime="rccl", collective="reduce_scatter", in_place=True)
    assert not runs_on_call(rs, 2048, runtime="msccl", collective="reduce_scatter",
                            in_place=True)  # msccl spells it reduce_scatter
    # msccl-executor counts the API's count: an allgather of 2048 B in 2-byte elements on 8
    # ranks has count 128, a multiple of 8 chunks; 2064 B gives 129, which is not.
    ag = _program(coll="allgather", min_bytes=0, max_bytes=0)
    assert runs_on_call(ag, 2048, runtime="msccl-executor", collective="allgather",
                        in_place=True, element_size=2)
    assert not runs_on_call(ag, 2064, runtime="msccl-executor", collective="allgather",
                            in_place=True, element_size=2)


def test_the_schedulers_allreduce_set_picks_by_range():
    """Azure's ND H100 v5 set: all-pairs up to 260 KB, the LL ring to 2 MB, the LL128 ring to
    20 MB (their minBytes/maxBytes), NCCL above; out-of-place calls never (inplace only)."""
    programs = [load_program(p, runtime="msccl-executor")
                for p in sorted(SCHEDULER.glob("*.xml")) if not p.name.startswith("ag-")]

    def pick(size, in_place=True):
        p = selected_program(programs, size, runtime="msccl-executor", collective="allreduce",
                             in_place=in_place, element_size=2)
        return None if p is None else (p.proto, p.nchannels, p.nchunksperloop)

    assert pick(1024) == ("LL", 4, 32)            # ap-1pass: 0 - 32768
    assert pick(256 << 10) == ("LL", 4, 256)      # ap4ll: 40960 - 266239
    assert pick(1 << 20) == ("LL", 32, 64)        # r48ll: 266240 - 2078719
    assert pick(16 << 20) == ("LL128", 32, 64)    # r48ll128: 2078720 - 20971520
    assert pick(32 << 20) is None
    assert pick(1024, in_place=False) is None
    # 32770 B lies in ap2ll's range (32769 - 40959) but is 16385 halves, not a multiple of its
    # 128 chunks: NCCL runs it.
    assert pick(32770) is None


def test_layouts_and_byte_ranges_as_bench_writes_them():
    # a file declaring both layouts: rccl and msccl-executor run it for both; msccl reads
    # inplace=1 as in-place only
    both = _program(inplace=1, outofplace=1)
    assert layouts(both, "rccl", "allreduce") == ("out-of-place", "in-place")
    assert layouts(both, "msccl", "allreduce") == ("in-place",)
    assert byte_range(both, "msccl") == (1024, 4096, False)
    assert byte_range(_program(max_bytes=0), "msccl-executor") == (1024, None, True)

