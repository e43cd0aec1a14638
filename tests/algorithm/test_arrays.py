"""SendBlock: sends as arrays, and the transforms that keep them as arrays."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collsynth.algorithm import (Algorithm, Send, SendBlock, Step, as_send_block, invert_dual,
                                 refine, sends_as_arrays, sequence)
from collsynth.collective import allgather, allreduce, reduce_scatter
from collsynth.collective.duality import non_combining_dual
from collsynth.errors import InvalidInstanceError
from collsynth.topology import get_topology

SENDS = (Send(0, 0, 1), Send(2, 1, 3, True), Send(1, 3, 0), Send(0, 2, 1, True))

sends_lists = st.lists(st.builds(Send, st.integers(0, 2**40), st.integers(0, 2**31 - 1),
                                 st.integers(0, 2**31 - 1), st.booleans()), max_size=30)


def block() -> SendBlock:
    return SendBlock.from_sends(SENDS)


# -- construction ----------------------------------------------------------------------------


def test_arrays_are_copied_read_only_and_typed():
    chunk = np.array([0, 2, 1, 0])
    src = [0, 1, 3, 2]
    b = SendBlock(chunk, src, np.array([1, 3, 0, 1], dtype=np.int64),
                  np.array([False, True, False, True]))
    chunk[0] = 9
    assert b.chunk.tolist() == [0, 2, 1, 0]
    assert b.chunk.dtype == np.int64 and b.src.dtype == np.int32 and b.dst.dtype == np.int32
    assert b.reduce.dtype == bool
    for array in (b.chunk, b.src, b.dst, b.reduce):
        assert not array.flags.writeable
        with pytest.raises(ValueError):
            array[0] = 1
    assert b == SENDS


def test_int32_chunks_are_kept_and_reduce_defaults_to_copies():
    b = SendBlock(np.array([3, 4], dtype=np.int32), [0, 1], [1, 0])
    assert b.chunk.dtype == np.int32
    assert b.reduce.tolist() == [False, False]


@pytest.mark.parametrize("args, message", [
    (([[0, 1]], [0], [1]), "chunk must be a 1-D array"),
    (([0.5], [0], [1]), "chunk must hold integers"),
    (([0], ["a"], [1]), "src must hold integers"),
    (([0, 1], [0], [1, 2]), "equal lengths"),
    (([0], [0], [1], [1]), "reduce must hold booleans"),
    (([0], [0], [1], [[True]]), "reduce must be a 1-D array"),
    (([0], [2**31], [1]), "outside the int32 range"),
    (([0], [0], [-2**31 - 1]), "outside the int32 range"),
])
def test_bad_arrays_are_refused(args, message):
    with pytest.raises(InvalidInstanceError, match=message):
        SendBlock(*args)


def test_from_sends_refuses_other_items():
    with pytest.raises(InvalidInstanceError, match="item 1 is tuple"):
        SendBlock.from_sends([Send(0, 0, 1), (0, 1, 2)])


# -- sequence protocol -----------------------------------------------------------------------


def test_indexing_gives_sends_with_python_values():
    b = block()
    assert len(b) == 4
    assert b[1] == Send(2, 1, 3, True) and b[-1] == SENDS[-1]
    assert b[np.int64(2)] == SENDS[2]
    first = b[0]
    assert type(first.chunk) is int and type(first.src) is int and type(first.reduce) is bool
    with pytest.raises(IndexError):
        b[4]
    with pytest.raises(TypeError):
        b["0"]


def test_slices_are_blocks():
    b = block()
    assert isinstance(b[1:3], SendBlock)
    assert b[1:3] == SENDS[1:3]
    assert b[::-2] == SENDS[::-2]
    assert len(b[5:]) == 0 and b[5:] == ()


def test_iteration_and_sequence_mixins():
    b = block()
    assert list(b) == list(SENDS)
    assert SENDS[2] in b and Send(9, 9, 9) not in b
    assert b.index(SENDS[3]) == 3
    assert list(reversed(b)) == list(reversed(SENDS))
    assert sorted(b) == sorted(SENDS)


@settings(max_examples=60, deadline=None)
@given(sends_lists, st.integers(-35, 35), st.integers(-35, 35), st.sampled_from([1, 2, -1, 3]))
def test_round_trip_and_slicing_match_tuples(sends, start, stop, stride):
    b = SendBlock.from_sends(sends)
    assert tuple(b) == tuple(sends)
    assert b == tuple(sends) and b == list(sends)
    assert b[start:stop:stride] == tuple(sends)[start:stop:stride]
    assert list(b[start:stop:stride]) == list(sends)[start:stop:stride]
    chunk, src, dst, red = sends_as_arrays(tuple(sends))
    assert SendBlock(chunk, src, dst, red) == b


# -- equality and hashing --------------------------------------------------------------------


def test_equality():
    b = block()
    assert b == block() and not (b != block())
    assert b == SENDS and SENDS == b and b == list(SENDS)
    assert b != SENDS[:3] and b != SENDS[::-1]
    assert b != (1, 2, 3, 4)
    assert b != SendBlock.from_sends(SENDS[:3] + (Send(0, 2, 1, False),))
    assert (b == 5) is False
    assert SendBlock(np.array([0], dtype=np.int32), [0], [1]) == SendBlock([0], [0], [1])


def test_hash_follows_array_contents():
    b = block()
    same = SendBlock(b.chunk.astype(np.int32), b.src, b.dst, b.reduce)
    assert hash(b) == hash(same) == hash(block())
    assert hash(b) != hash(b[:3])
    assert len({b, same, b[:3]}) == 2


def test_steps_and_algorithms_compare_across_representations():
    ring = get_topology("fully-connected:4")
    as_tuple = Step(2, SENDS)
    as_block = Step(2, block())
    assert as_block == as_tuple and as_tuple == as_block
    assert as_block != Step(3, block())
    assert hash(as_block) == hash(Step(2, block()))
    a = Algorithm("a", ring, allgather(4), (as_tuple,))
    b = Algorithm("a", ring, allgather(4), (as_block,))
    assert a == b and b.num_sends == 4


def test_repr_is_short():
    big = SendBlock(np.zeros(10**5, dtype=np.int64), np.zeros(10**5, dtype=np.int32),
                    np.ones(10**5, dtype=np.int32))
    assert repr(big) == "SendBlock(<100000 sends>)"


def test_pickle_round_trip_keeps_arrays_read_only():
    b = block()
    copy = pickle.loads(pickle.dumps(b))
    assert copy == b and hash(copy) == hash(b)
    assert not copy.chunk.flags.writeable


# -- helpers ---------------------------------------------------------------------------------


def test_concat_and_as_send_block():
    b = block()
    joined = SendBlock.concat([b[:2], SENDS[2:], SendBlock([], [], [])])
    assert joined == b
    assert SendBlock.concat([]) == ()
    assert as_send_block(b) is b
    assert as_send_block(list(SENDS)) == b


def test_sends_as_arrays_does_not_copy_blocks():
    b = block()
    chunk, src, dst, red = sends_as_arrays(b)
    assert chunk is b.chunk and src is b.src and dst is b.dst and red is b.reduce
    chunk, src, dst, red = sends_as_arrays(SENDS)
    assert chunk.tolist() == [0, 2, 1, 0] and src.tolist() == [0, 1, 3, 2]
    assert dst.tolist() == [1, 3, 0, 1] and red.tolist() == [False, True, False, True]
    assert [len(a) for a in sends_as_arrays(())] == [0, 0, 0, 0]


# -- transforms on blocks --------------------------------------------------------------------


@pytest.fixture
def no_send_objects(monkeypatch):
    """Make building Send objects out of a block fail, to prove nothing does."""

    def refuse(*args, **kwargs):
        raise AssertionError("a SendBlock was turned into Send objects")

    monkeypatch.setattr(SendBlock, "__iter__", refuse)
    monkeypatch.setattr(SendBlock, "__getitem__", refuse)


def direct(n: int, combining: bool):
    """Direct allgather (chunk c from c to all) or reduce-scatter (all into c), as tuples."""
    if combining:
        return tuple(Send(c, r, c, True) for c in range(n) for r in range(n) if r != c)
    return tuple(Send(c, c, r) for c in range(n) for r in range(n) if r != c)


def as_blocks(algorithm: Algorithm) -> Algorithm:
    return Algorithm(algorithm.name, algorithm.topology, algorithm.collective,
                     tuple(Step(s.rounds, SendBlock.from_sends(s.sends)) for s in algorithm.steps))


def test_invert_dual_on_blocks_matches_tuples(no_send_objects):
    fc = get_topology("fully-connected:4")
    rs = reduce_scatter(4)
    # A two-step tree broadcast of each chunk in the dual: c -> c+1, then both -> the others.
    first = tuple(Send(c, c, (c + 1) % 4) for c in range(4))
    second = tuple(Send(c, src, (c + k) % 4) for c in range(4)
                   for src, k in ((c, 2), ((c + 1) % 4, 3)))
    dual = Algorithm("dual", fc.reversed(), non_combining_dual(rs),
                     (Step(1, first), Step(2, second)))
    from_tuples = invert_dual(dual, fc, rs)
    from_blocks = invert_dual(as_blocks(dual), fc, rs)
    assert all(isinstance(s.sends, tuple) for s in from_tuples.steps)
    assert all(isinstance(s.sends, SendBlock) for s in from_blocks.steps)
    assert from_blocks.steps == from_tuples.steps
    assert all(s.reduce.all() for s in (step.sends for step in from_blocks.steps))


def test_refine_on_blocks_matches_tuples(no_send_objects):
    fc = get_topology("fully-connected:4")
    ag = Algorithm("ag", fc, allgather(4), (Step(1, direct(4, False)),))
    for factor in (1, 3):
        from_tuples = refine(ag, factor)
        from_blocks = refine(as_blocks(ag), factor)
        assert isinstance(from_blocks.steps[0].sends, SendBlock)
        assert isinstance(from_tuples.steps[0].sends, tuple)
        assert from_blocks.steps == from_tuples.steps
        assert from_blocks.collective == from_tuples.collective


def test_sequence_keeps_blocks(no_send_objects):
    fc = get_topology("fully-connected:4")
    rs = Algorithm("rs", fc, reduce_scatter(4), (Step(1, SendBlock.from_sends(direct(4, True))),))
    ag = Algorithm("ag", fc, allgather(4), (Step(1, direct(4, False)),))
    ar = sequence(rs, ag, allreduce(4).split(4), name="ar")
    assert isinstance(ar.steps[0].sends, SendBlock) and isinstance(ar.steps[1].sends, tuple)
    assert ar.num_sends == 24
