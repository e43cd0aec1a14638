"""The collsynth algorithm file format (JSON), version 1.

An algorithm file is self-contained: it carries the topology and the (split) collective the sends
refer to, so it can be verified, shown or exported without anything else.

The details: ``docs/file-formats.md``, section "Algorithm files
(collsynth.algorithm.fileformat)".
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from collsynth._parse import clean_name, format_version_is, fraction_from_text, free_form
from collsynth.algorithm.arrays import SendBlock, sends_as_arrays
from collsynth.algorithm.model import Algorithm, Send, Step
from collsynth.algorithm.verify import verify
from collsynth.collective.fileformat import (
    collective_from_json,
    collective_to_json,
    dumps_readable,
    got,
    jsonable,
)
from collsynth.collective.model import MAX_CHUNKS
from collsynth.collective.standard import check_standard_conditions
from collsynth.errors import FileFormatError, InvalidCollectiveError, VerificationError, expect_type
from collsynth.topology.fileformat import read_json_file, topology_from_json, topology_to_json

__all__ = ["FORMAT_NAME", "FORMAT_VERSION", "algorithm_to_json", "algorithm_from_json",
           "algorithm_text", "save_algorithm", "load_algorithm", "MAX_ALGORITHM_BYTES"]

FORMAT_NAME = "collsynth-algorithm"
FORMAT_VERSION = 1

_TOP_FIELDS = frozenset({"format", "version", "name", "topology", "collective", "instance",
                         "steps", "provenance"})
_INSTANCE_FIELDS = frozenset({"steps", "rounds", "chunks", "rounds_per_chunk", "extra_memory"})


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def algorithm_to_json(algorithm: Algorithm, *, extra_memory: int | None = None) -> dict[str, Any]:
    """The JSON object for ``algorithm`` (inverse of :func:`algorithm_from_json`).

    ``extra_memory``, when given, is recorded in ``instance`` and checked whenever the file is
    loaded. The algorithm is not verified here; :func:`save_algorithm` does that.
    """
    instance: dict[str, Any] = {
        "steps": algorithm.num_steps,
        "rounds": algorithm.num_rounds,
        "chunks": algorithm.chunks,
        "rounds_per_chunk": str(algorithm.rounds_per_chunk),
    }
    if extra_memory is not None:
        instance["extra_memory"] = extra_memory
    return {
        "format": FORMAT_NAME,
        "version": FORMAT_VERSION,
        "name": algorithm.name,
        "topology": topology_to_json(algorithm.topology),
        "collective": collective_to_json(algorithm.collective),
        "instance": instance,
        "steps": [{"rounds": step.rounds, "sends": _sends_json(step.sends)}
                  for step in algorithm.steps],
        "provenance": jsonable(dict(algorithm.provenance)),
    }


def _sends_json(sends) -> list[list[int]]:
    """``[[chunk, src, dst], [chunk, src, dst, 1], ...]`` (1: a reduce), built from arrays so that
    millions of sends take seconds."""
    chunk, src, dst, reduce = sends_as_arrays(sends)
    rows = np.column_stack([chunk, src, dst]).astype(np.int64).tolist()
    for i in np.flatnonzero(reduce).tolist():
        rows[i].append(1)
    return rows


#: Largest algorithm file :func:`load_algorithm` reads (bytes). Schedules for 1024 GPUs hold
#: millions of sends (~33 bytes each in the file): 2M sends make 69 MB.
MAX_ALGORITHM_BYTES = 1 << 30

#: Steps with more sends than this are read into arrays (a SendBlock), not Send objects.
_ARRAY_SENDS = 10_000


def _send_block(sends: list, num_chunks: int, num_ranks: int) -> SendBlock | None:
    """The sends of one step as a SendBlock when they are all well formed, else ``None`` (the
    caller then parses them one by one for a precise error)."""
    try:
        try:
            table = np.array(sends, dtype=np.int64)
        except ValueError:  # ragged: some reduces ([chunk, src, dst, 1])
            table = np.array([row if len(row) == 4 else row + [0] for row in sends],
                             dtype=np.int64)
    except (ValueError, TypeError, OverflowError):
        return None
    if table.ndim != 2 or table.shape[1] not in (3, 4):
        return None
    chunk, src, dst = table[:, 0], table[:, 1], table[:, 2]
    if (chunk.min() < 0 or chunk.max() >= num_chunks or min(src.min(), dst.min()) < 0
            or max(src.max(), dst.max()) >= num_ranks):
        return None
    reduce = None
    if table.shape[1] == 4:
        if not np.isin(table[:, 3], (0, 1)).all():
            return None
        reduce = table[:, 3] == 1
    return SendBlock(chunk, src.astype(np.int32), dst.astype(np.int32), reduce)


def _send(value: Any, source: str, where: str, num_chunks: int, num_ranks: int) -> Send:
    if (not isinstance(value, list) or len(value) not in (3, 4)
            or not all(_is_int(v) for v in value)):
        raise FileFormatError(source, f"{where}: expected [chunk, src, dst] with integers (and a "
                                      f"4th element 1 for a reduce), got {got(value)}")
    chunk, src, dst = value[:3]
    if not 0 <= chunk < num_chunks:
        raise FileFormatError(source, f"{where}: chunk {chunk} is not a chunk 0..{num_chunks - 1}")
    for role, rank in (("src", src), ("dst", dst)):
        if not 0 <= rank < num_ranks:
            raise FileFormatError(source, f"{where}: {role} {rank} is not a rank "
                                          f"0..{num_ranks - 1}")
    reduce = False
    if len(value) == 4:
        if value[3] not in (0, 1):
            raise FileFormatError(source, f"{where}: 4th element {value[3]}; expected 1 (reduce) "
                                          "or 0 (copy)")
        reduce = value[3] == 1
    return Send(chunk, src, dst, reduce)


def algorithm_from_json(obj: Any, *, source: str = "<algorithm>") -> Algorithm:
    """Build an :class:`Algorithm` from the parsed JSON object of an algorithm file, and verify it.

    Raises
    ------
    FileFormatError
        On a wrong format or version, or any field missing, of the wrong type or inconsistent
        (naming the field).
    InputTooLargeError
        When the embedded topology or collective is beyond collsynth's size limits.
    VerificationError
        When the algorithm does not implement its collective on its topology (naming ``source``).

    Examples
    --------
    >>> from collsynth.algorithm import Algorithm, Send, Step
    >>> from collsynth.collective import broadcast
    >>> from collsynth.topology import get_topology
    >>> bcast = Algorithm("bcast", get_topology("ring:3"), broadcast(3, 0),
    ...                   (Step(1, (Send(0, 0, 1), Send(0, 0, 2))),))
    >>> obj = algorithm_to_json(bcast)
    >>> obj["instance"]
    {'steps': 1, 'rounds': 1, 'chunks': 1, 'rounds_per_chunk': '1'}
    >>> obj["steps"]
    [{'rounds': 1, 'sends': [[0, 0, 1], [0, 0, 2]]}]
    >>> algorithm_from_json(obj).steps == bcast.steps
    True
    """
    if not isinstance(obj, dict):
        raise FileFormatError(source, f"expected a JSON object at the top level, got {got(obj)}")
    fmt = obj.get("format")
    if fmt is None and {"gpus", "collective", "protocol"} <= set(obj):
        raise FileFormatError(source, "an MSCCL++ execution plan (it has 'gpus' and no "
                                      "'format'), not an algorithm file; 'collsynth check "
                                      "--runtime mscclpp' reads plans, this command takes the "
                                      "algorithm file the plan was exported from")
    if fmt != FORMAT_NAME:
        raise FileFormatError(source, "missing field 'format'; expected 'collsynth-algorithm'"
                              if fmt is None else
                              f"field 'format' is {got(fmt)}, expected {FORMAT_NAME!r}")
    version = obj.get("version")
    if not format_version_is(version, FORMAT_VERSION):
        raise FileFormatError(source, "missing field 'version'" if version is None else
                              f"unknown version {got(version)}; this collsynth reads version "
                              f"{FORMAT_VERSION}")
    unknown = sorted(set(obj) - _TOP_FIELDS)
    if unknown:
        raise FileFormatError(source, f"unknown field {unknown[0]!r}; expected fields: "
                                      f"{', '.join(sorted(_TOP_FIELDS))}")
    for key in ("name", "topology", "collective", "instance", "steps"):
        if key not in obj:
            raise FileFormatError(source, f"missing field {key!r}")
    name = obj["name"]
    if not isinstance(name, str):
        raise FileFormatError(source, f"field 'name': expected a string, got {got(name)}")
    clean_name(name, "field 'name'", source=source)
    provenance = obj.get("provenance", {})
    if not isinstance(provenance, dict):
        raise FileFormatError(source, f"field 'provenance': expected an object, got "
                                      f"{got(provenance)}")
    free_form(provenance, "provenance", source=source)

    topology = topology_from_json(obj["topology"], source=f"{source}: topology")
    collective = collective_from_json(obj["collective"], source=f"{source}: collective",
                                      check_standard=False)
    n = topology.num_ranks
    if collective.num_ranks != n:
        raise FileFormatError(source, f"collective.num_ranks = {collective.num_ranks} but the "
                                      f"topology {topology.name!r} has {n} ranks")
    # A standard name means the standard conditions, or verify would replay a tampered
    # "allgather" against whatever the file says; show, time, export and run read through here.
    try:
        check_standard_conditions(collective)
    except InvalidCollectiveError as exc:
        raise FileFormatError(f"{source}: collective", str(exc)) from exc

    raw_steps = obj["steps"]
    if not isinstance(raw_steps, list):
        raise FileFormatError(source, f"field 'steps': expected a list of steps, got "
                                      f"{got(raw_steps)}")
    steps = []
    for t, raw in enumerate(raw_steps):
        where = f"steps[{t}]"
        if not isinstance(raw, dict):
            raise FileFormatError(source, f"{where}: expected an object {{\"rounds\": r, "
                                          f"\"sends\": [...]}}, got {got(raw)}")
        extra = sorted(set(raw) - {"rounds", "sends"})
        if extra:
            raise FileFormatError(source, f"{where}: unknown field {extra[0]!r}; expected "
                                          "'rounds' and 'sends'")
        rounds = raw.get("rounds")
        if not _is_int(rounds) or rounds < 1:
            raise FileFormatError(source, f"{where}.rounds: expected a positive integer, got "
                                          f"{got(rounds)}")
        if rounds > MAX_CHUNKS:  # a link carries each chunk at most once a step
            raise FileFormatError(source, f"{where}.rounds = {rounds}: more than the {MAX_CHUNKS} "
                                          "rounds a step of collsynth's largest collective needs")
        sends = raw.get("sends")
        if not isinstance(sends, list):
            raise FileFormatError(source, f"{where}.sends: expected a list of [chunk, src, dst], "
                                          f"got {got(sends)}")
        # Booleans are ints to numpy: only plain int rows take the array path.
        block = _send_block(sends, collective.num_chunks, n) if len(sends) > _ARRAY_SENDS \
            and all(isinstance(row, list) and all(type(v) is int for v in row)
                    for row in sends) else None
        if block is not None:
            steps.append(Step(rounds, block))
            continue
        steps.append(Step(rounds, tuple(_send(s, source, f"{where}.sends[{i}]",
                                              collective.num_chunks, n)
                                        for i, s in enumerate(sends))))
    algorithm = Algorithm(name, topology, collective, tuple(steps), provenance=provenance)
    extra_memory = _check_instance(obj["instance"], algorithm, source)
    try:
        return verify(algorithm, extra_memory=extra_memory)
    except VerificationError as exc:
        raise VerificationError(f"{source}: {exc}") from exc


def _check_instance(raw: Any, algorithm: Algorithm, source: str) -> int | None:
    """Check ``instance`` agrees with the steps and collective; return its ``extra_memory``."""
    if not isinstance(raw, dict):
        raise FileFormatError(source, f"field 'instance': expected an object, got {got(raw)}")
    extra = sorted(set(raw) - _INSTANCE_FIELDS)
    if extra:
        raise FileFormatError(source, f"instance: unknown field {extra[0]!r}")
    actual = {"steps": algorithm.num_steps, "rounds": algorithm.num_rounds,
              "chunks": algorithm.chunks}
    explain = {"steps": "the file has {} steps", "rounds": "the steps add up to {} rounds",
               "chunks": "the collective's chunk_factor is {}"}
    for key, value in actual.items():
        if key not in raw:
            raise FileFormatError(source, f"instance: missing field {key!r}")
        if not _is_int(raw[key]):
            raise FileFormatError(source, f"instance.{key}: expected an integer, got "
                                          f"{got(raw[key])}")
        if raw[key] != value:
            raise FileFormatError(source, f"instance.{key} = {raw[key]} but "
                                          f"{explain[key].format(value)}")
    if "rounds_per_chunk" in raw:
        text = raw["rounds_per_chunk"]
        stated = fraction_from_text(text)
        if stated is None:
            raise FileFormatError(source, f"instance.rounds_per_chunk: expected a fraction such "
                                          f"as \"7/6\", got {got(text)}")
        if stated != algorithm.rounds_per_chunk:
            raise FileFormatError(source, f"instance.rounds_per_chunk = {text} but rounds / chunks "
                                          f"= {algorithm.rounds_per_chunk}")
    extra_memory = raw.get("extra_memory")
    if extra_memory is not None and (not _is_int(extra_memory)
                                     or not 0 <= extra_memory <= MAX_CHUNKS):
        raise FileFormatError(source, f"instance.extra_memory: expected an integer from 0 to "
                                      f"{MAX_CHUNKS} (chunks) or null, got {got(extra_memory)}")
    return extra_memory


def algorithm_text(algorithm: Algorithm, *, extra_memory: int | None = None) -> str:
    """Verify ``algorithm`` and return the text of its JSON file (what
    :func:`save_algorithm` writes).

    Raises
    ------
    VerificationError
        When the algorithm is wrong.
    """
    verify(algorithm, extra_memory=extra_memory)
    return dumps_readable(algorithm_to_json(algorithm, extra_memory=extra_memory))


def save_algorithm(algorithm: Algorithm, path: str | os.PathLike[str], *,
                   extra_memory: int | None = None) -> None:
    """Verify ``algorithm`` and write it as a JSON file (atomically: never half-written).

    Raises
    ------
    VerificationError
        When the algorithm is wrong (nothing is written).
    OSError
        When the file cannot be written.
    """
    expect_type(algorithm, Algorithm, "save_algorithm: algorithm")
    from collsynth._atomic import write_text_atomic

    write_text_atomic(path, algorithm_text(algorithm, extra_memory=extra_memory))


def load_algorithm(path: str | os.PathLike[str]) -> Algorithm:
    """Read an algorithm file and verify it.

    Raises
    ------
    FileFormatError
        A missing, unreadable or malformed file (naming the file and the field).
    InputTooLargeError
        A file above :data:`MAX_ALGORITHM_BYTES`, or an embedded topology or collective beyond the
        size limits.
    VerificationError
        An algorithm that does not implement its collective on its topology (naming the file).
    """
    return algorithm_from_json(read_json_file(path, max_bytes=MAX_ALGORITHM_BYTES),
                               source=str(path))
