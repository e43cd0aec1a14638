"""Sends stored as arrays: :class:`SendBlock`, for algorithms with millions of sends.

The details: ``docs/verification.md``, section "Sends as arrays".
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, overload

import numpy as np

from collsynth.algorithm.send import Send
from collsynth.errors import InvalidInstanceError

__all__ = ["SendBlock", "as_send_block", "sends_as_arrays"]

_INT32 = np.iinfo(np.int32)


def _integer_array(values: Any, name: str, dtype: type) -> np.ndarray:
    """A read-only 1-D copy of ``values`` as ``dtype``; InvalidInstanceError if not integers."""
    array = np.asarray(values)
    if array.size == 0 and array.dtype.kind == "f":  # np.asarray([]) is float64
        array = array.astype(dtype)
    if array.ndim != 1:
        raise InvalidInstanceError(
            f"SendBlock: {name} must be a 1-D array, got shape {array.shape}"
        )
    if array.dtype.kind not in "iu":
        raise InvalidInstanceError(
            f"SendBlock: {name} must hold integers, got dtype {array.dtype}"
        )
    if dtype is np.int32 and array.dtype != np.int32 and array.size:
        low, high = int(array.min()), int(array.max())
        if low < _INT32.min or high > _INT32.max:
            raise InvalidInstanceError(
                f"SendBlock: {name} holds {low if low < _INT32.min else high}, outside the int32 "
                "range of rank numbers"
            )
    if array.dtype.kind == "u" and array.size and int(array.max()) > np.iinfo(np.int64).max:
        raise InvalidInstanceError(f"SendBlock: {name} holds values beyond int64")
    result = np.array(array, dtype=dtype, copy=True)
    result.flags.writeable = False
    return result


class SendBlock(Sequence):
    """An immutable sequence of :class:`Send` backed by four numpy arrays.

    Parameters
    ----------
    chunk, src, dst:
        Integer arrays (or sequences) of equal length: chunk index, sending rank, receiving rank.
        ``chunk`` is stored as ``int64`` (``int32`` when given as ``int32``), ranks as ``int32``.
    reduce:
        Booleans of the same length (``True``: the receiver adds the chunk into its own), or
        ``None`` for all copies.

    The arrays are copied and made read-only. Ranks and chunks are not range-checked here: the
    verifier reports sends that name a missing rank or chunk.

    Raises
    ------
    InvalidInstanceError
        When an array is not 1-D, not integer (``reduce``: not boolean), or the lengths differ.

    Examples
    --------
    >>> block = SendBlock([0, 0], [0, 0], [1, 2])
    >>> len(block), block[1]
    (2, Send(chunk=0, src=0, dst=2, reduce=False))
    >>> block == (Send(0, 0, 1), Send(0, 0, 2))
    True
    >>> block[::-1].dst.tolist()
    [2, 1]
    """

    __slots__ = ("_chunk", "_src", "_dst", "_reduce", "_hash")

    def __init__(self, chunk: Any, src: Any, dst: Any, reduce: Any = None) -> None:
        chunk_dtype = np.int32 if getattr(chunk, "dtype", None) == np.int32 else np.int64
        self._chunk = _integer_array(chunk, "chunk", chunk_dtype)
        self._src = _integer_array(src, "src", np.int32)
        self._dst = _integer_array(dst, "dst", np.int32)
        length = len(self._chunk)
        if reduce is None:
            flags = np.zeros(length, dtype=bool)
        else:
            flags = np.asarray(reduce)
            if flags.size == 0 and flags.dtype.kind == "f":
                flags = flags.astype(bool)
            if flags.ndim != 1:
                raise InvalidInstanceError(
                    f"SendBlock: reduce must be a 1-D array, got shape {flags.shape}"
                )
            if flags.dtype != bool:
                raise InvalidInstanceError(
                    f"SendBlock: reduce must hold booleans, got dtype {flags.dtype}"
                )
            flags = flags.copy()
        flags.flags.writeable = False
        self._reduce = flags
        lengths = {"chunk": length, "src": len(self._src), "dst": len(self._dst),
                   "reduce": len(self._reduce)}
        if len(set(lengths.values())) != 1:
            raise InvalidInstanceError(
                "SendBlock: chunk, src, dst and reduce must have equal lengths, got "
                + ", ".join(f"{k}={v}" for k, v in lengths.items())
            )
        self._hash: int | None = None

    # -- constructors -------------------------------------------------------------------------

    @classmethod
    def from_sends(cls, sends: Iterable[Send]) -> "SendBlock":
        """The block holding ``sends`` in order.

        >>> SendBlock.from_sends([Send(3, 1, 2, True)]).reduce.tolist()
        [True]
        """
        sends = list(sends)
        for index, send in enumerate(sends):
            if not isinstance(send, Send):
                raise InvalidInstanceError(
                    f"SendBlock.from_sends: item {index} is {type(send).__name__}, not a Send"
                )
        count = len(sends)
        return cls(np.fromiter((s.chunk for s in sends), dtype=np.int64, count=count),
                   np.fromiter((s.src for s in sends), dtype=np.int64, count=count),
                   np.fromiter((s.dst for s in sends), dtype=np.int64, count=count),
                   np.fromiter((bool(s.reduce) for s in sends), dtype=bool, count=count))

    @classmethod
    def concat(cls, blocks: Iterable["SendBlock | Sequence[Send]"]) -> "SendBlock":
        """One block holding the sends of ``blocks`` (blocks or tuples of sends) in order.

        >>> len(SendBlock.concat([SendBlock([0], [0], [1]), (Send(1, 1, 0),)]))
        2
        """
        parts = [as_send_block(b) for b in blocks]
        if not parts:
            return cls([], [], [])
        chunk_dtype = np.int32 if all(p._chunk.dtype == np.int32 for p in parts) else np.int64
        return cls(np.concatenate([p._chunk.astype(chunk_dtype, copy=False) for p in parts]),
                   np.concatenate([p._src for p in parts]),
                   np.concatenate([p._dst for p in parts]),
                   np.concatenate([p._reduce for p in parts]))

    # -- arrays -------------------------------------------------------------------------------

    @property
    def chunk(self) -> np.ndarray:
        """Chunk of each send (read-only)."""
        return self._chunk

    @property
    def src(self) -> np.ndarray:
        """Sending rank of each send (read-only ``int32``)."""
        return self._src

    @property
    def dst(self) -> np.ndarray:
        """Receiving rank of each send (read-only ``int32``)."""
        return self._dst

    @property
    def reduce(self) -> np.ndarray:
        """``True`` where the send is a reduce (read-only ``bool``)."""
        return self._reduce

    # -- sequence protocol --------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._chunk)

    @overload
    def __getitem__(self, index: int) -> Send: ...

    @overload
    def __getitem__(self, index: slice) -> "SendBlock": ...

    def __getitem__(self, index):
        if isinstance(index, slice):
            return SendBlock(self._chunk[index], self._src[index], self._dst[index],
                             self._reduce[index])
        try:
            i = index.__index__()
        except AttributeError:
            raise TypeError(f"SendBlock indices must be integers or slices, not "
                            f"{type(index).__name__}") from None
        return Send(int(self._chunk[i]), int(self._src[i]), int(self._dst[i]),
                    bool(self._reduce[i]))

    def __iter__(self) -> Iterator[Send]:
        for c, s, d, r in zip(self._chunk.tolist(), self._src.tolist(), self._dst.tolist(),
                              self._reduce.tolist()):
            yield Send(c, s, d, r)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, SendBlock):
            if other is self:
                return True
            return (len(self) == len(other)
                    and np.array_equal(self._chunk, other._chunk)
                    and np.array_equal(self._src, other._src)
                    and np.array_equal(self._dst, other._dst)
                    and np.array_equal(self._reduce, other._reduce))
        if isinstance(other, (tuple, list)):
            if len(other) != len(self):
                return False
            if not all(isinstance(s, Send) for s in other):
                return False
            return self == SendBlock.from_sends(other)
        return NotImplemented

    def __hash__(self) -> int:
        if self._hash is None:
            digest = hashlib.blake2b(digest_size=8)
            for array in (self._chunk.astype(np.int64, copy=False), self._src, self._dst,
                          self._reduce):
                digest.update(np.ascontiguousarray(array).tobytes())
            self._hash = int.from_bytes(digest.digest(), "little", signed=True)
        return self._hash

    def __repr__(self) -> str:
        return f"SendBlock(<{len(self)} sends>)"

    def __reduce__(self):
        return (SendBlock, (self._chunk, self._src, self._dst, self._reduce))


def as_send_block(sends: "SendBlock | Iterable[Send]") -> SendBlock:
    """``sends`` as a :class:`SendBlock` (a block is returned as it is).

    >>> as_send_block((Send(0, 0, 1),)) == (Send(0, 0, 1),)
    True
    """
    if isinstance(sends, SendBlock):
        return sends
    return SendBlock.from_sends(sends)


def sends_as_arrays(sends: "SendBlock | Sequence[Send]"
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(chunk, src, dst, reduce)`` arrays of a step's sends, either representation.

    A :class:`SendBlock` returns its own (read-only) arrays without copying. A tuple of
    :class:`Send` is converted (``int64`` chunks and ranks, so that no value is truncated).

    >>> chunk, src, dst, red = sends_as_arrays((Send(2, 0, 1), Send(2, 1, 0, True)))
    >>> chunk.tolist(), src.tolist(), dst.tolist(), red.tolist()
    ([2, 2], [0, 1], [1, 0], [False, True])
    """
    if isinstance(sends, SendBlock):
        return sends.chunk, sends.src, sends.dst, sends.reduce
    count = len(sends)
    return (np.fromiter((s.chunk for s in sends), dtype=np.int64, count=count),
            np.fromiter((s.src for s in sends), dtype=np.int64, count=count),
            np.fromiter((s.dst for s in sends), dtype=np.int64, count=count),
            np.fromiter((bool(s.reduce) for s in sends), dtype=bool, count=count))
