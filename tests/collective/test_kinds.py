"""The registry of collective kinds: one answer to 'what is this name' for every module."""

from __future__ import annotations

from fractions import Fraction

import pytest

from collsynth.collective.kinds import (KINDS, base_chunk_bytes, buffer_chunks, busbw_factor,
                                        canonical_name)
from collsynth.collective.standard import standard_collective, standard_name
from collsynth.errors import UnknownNameError
from collsynth.timing import logs
from collsynth.training.comm import _collective_key

SPELLINGS = {
    "allreduce": ["allreduce", "All-Reduce", "all_reduce", "all_reduce_perf", "ALL_REDUCE"],
    "allgather": ["AllGather", "all-gather", "all_gather_base", "all_gather_perf_mpi"],
    "reduce_scatter": ["reducescatter", "Reduce-Scatter", "reduce_scatter_perf"],
    "alltoall": ["all_to_all", "all-to-all", "alltoall_perf"],
}


@pytest.mark.parametrize("kind", sorted(SPELLINGS))
def test_every_module_reads_every_spelling_alike(kind):
    for spelling in SPELLINGS[kind]:
        assert canonical_name(spelling) == kind
        assert logs.canonical_collective(spelling) == kind
        assert standard_name(spelling) == kind
        assert standard_collective(spelling, 4) == standard_collective(kind, 4)


def test_bus_bandwidth_factors_by_hand():
    # nccl-tests: allreduce moves 2(n-1)/n of the buffer over each rank's links; the
    # allgather-like ones (n-1)/n; rooted broadcast/reduce the whole buffer once.
    n = 8
    hand = {"allreduce": Fraction(14, 8), "allgather": Fraction(7, 8),
            "reduce_scatter": Fraction(7, 8), "alltoall": Fraction(7, 8),
            "broadcast": Fraction(1), "reduce": Fraction(1)}
    for name, factor in hand.items():
        assert busbw_factor(name, n) == factor


def test_buffer_chunks_by_hand():
    # allgather's size is its output (8 inputs); allreduce's the buffer itself.
    assert buffer_chunks("allgather", 8) == 8 and buffer_chunks("allreduce", 8) == 1
    assert base_chunk_bytes("Reduce-Scatter", 4, 4096) == 1024


def test_unknown_names():
    with pytest.raises(UnknownNameError):
        busbw_factor("pairs", 4)
    assert canonical_name("pairs") == "pairs"
    assert _collective_key("p2p") == "send"


def test_names_are_unique():
    seen: dict[str, str] = {}
    for kind in KINDS:
        for spelling in (kind.name, *kind.spellings):
            assert spelling not in seen, f"{spelling} names {seen.get(spelling)} and {kind.name}"
            seen[spelling] = kind.name
