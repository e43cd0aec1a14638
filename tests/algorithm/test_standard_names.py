"""A standard collective's name means its standard conditions, in every command.

An algorithm file carries its collective; a file whose ``allgather`` was tampered with (every
postcondition emptied to the precondition, a rank dropped, renamed ``allreduce``) must be
refused where the file is read, so ``verify``, ``show``, ``time``, ``export`` and ``run`` all
refuse it with exit 1 and one line naming the file.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from collsynth.algorithm import Algorithm, Send, Step
from collsynth.algorithm.fileformat import algorithm_to_json, load_algorithm
from collsynth.cli import EXIT_ERROR, EXIT_OK, main
from collsynth.collective import Collective, allgather, standard_collective
from collsynth.collective.fileformat import collective_to_json
from collsynth.collective.standard import check_standard_conditions
from collsynth.errors import FileFormatError, InvalidCollectiveError
from collsynth.resolve import resolve_collective
from collsynth.topology import get_topology


def _ring4_allgather() -> dict:
    """Allgather on ring:4 by hand: chunk r goes to both neighbours, then one hop further."""
    first = tuple(Send(r, r, (r + d) % 4) for r in range(4) for d in (1, 3))
    second = tuple(Send(r, (r + 1) % 4, (r + 2) % 4) for r in range(4))
    algorithm = Algorithm("ag", get_topology("ring:4"), allgather(4),
                          (Step(1, first), Step(1, second)))
    return algorithm_to_json(algorithm)


def _post_is_pre(obj: dict) -> dict:
    for chunk in obj["collective"]["chunks"]:
        chunk["post"] = list(chunk["pre"])
    for step in obj["steps"]:
        step["sends"] = []
    return obj


def _drop_rank_3(obj: dict) -> dict:
    for chunk in obj["collective"]["chunks"]:
        chunk["post"] = [r for r in chunk["post"] if r != 3]
    return obj


def _renamed(obj: dict) -> dict:
    obj["collective"]["name"] = "allreduce"
    return obj


def _capitalised(obj: dict) -> dict:  # a spelling of a standard name is that name
    obj = _drop_rank_3(obj)
    obj["collective"]["name"] = "All-Gather"
    return obj


def _swapped(obj: dict) -> dict:  # same sizes, other ranks: chunk 0 starts on rank 1
    chunks = obj["collective"]["chunks"]
    chunks[0]["pre"], chunks[1]["pre"] = chunks[1]["pre"], chunks[0]["pre"]
    return obj


TAMPERINGS = {"post-is-pre": _post_is_pre, "rank-dropped": _drop_rank_3,
              "renamed-allreduce": _renamed, "capitalised": _capitalised, "swapped": _swapped}


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    good = _ring4_allgather()
    out = {"good": tmp_path / "good.json"}
    out["good"].write_text(json.dumps(good))
    for name, tamper in TAMPERINGS.items():
        out[name] = tmp_path / f"{name}.json"
        out[name].write_text(json.dumps(tamper(copy.deepcopy(good))))
    return out


def test_the_untampered_file_is_correct(files, capsys):
    assert main(["verify", str(files["good"])]) == EXIT_OK
    assert "correct allgather(n=4)" in capsys.readouterr().out


@pytest.mark.parametrize("tampering", sorted(TAMPERINGS))
def test_loading_a_tampered_standard_collective_fails(files, tampering):
    with pytest.raises(FileFormatError, match="a standard name means the standard collective"):
        load_algorithm(files[tampering])


@pytest.mark.parametrize("command", [["verify"], ["show"], ["time"],
                                     ["export", "-o", "{tmp}/out.xml"], ["run", "--iters", "0"]])
@pytest.mark.parametrize("tampering", sorted(TAMPERINGS))
def test_every_command_refuses_a_tampered_file_with_exit_1(files, tampering, command, capsys,
                                                          tmp_path):
    argv = [command[0], str(files[tampering])] + [a.format(tmp=tmp_path) for a in command[1:]]
    assert main(argv) == EXIT_ERROR
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == 1 and str(files[tampering]) in lines[0], err
    assert "pre/postconditions" in lines[0]
    assert "correct" not in out
    assert not (tmp_path / "out.xml").exists()


def test_a_custom_collective_file_with_a_standard_name_needs_its_conditions(tmp_path):
    # A "broadcast" whose chunk reaches only rank 1 is not a broadcast.
    odd = Collective("broadcast", 4, (frozenset({0}),), (frozenset({1}),), roots=(0,))
    path = tmp_path / "odd.json"
    path.write_text(json.dumps(collective_to_json(odd)))
    with pytest.raises(FileFormatError, match=r"chunk 0 post is \[1\], expected \[0, 1, 2, 3\]"):
        resolve_collective(str(path), 4)
    assert main(["bounds", "ring:4", str(path)]) == EXIT_ERROR


@pytest.mark.parametrize("name,roots", [("allgather", None), ("alltoall", None),
                                        ("reduce_scatter", None), ("allreduce", None),
                                        ("broadcast", [2]), ("reduce", [3]), ("gather", [1]),
                                        ("scatter", [0]), ("multiroot_broadcast", [3, 1]),
                                        ("multiroot_scatter", [0, 2]),
                                        ("multiroot_gather", [2, 1])])
@pytest.mark.parametrize("chunks", [1, 3])
def test_every_standard_collective_passes_split_and_rooted(name, roots, chunks):
    multi = name.startswith("multiroot")
    collective = standard_collective(name, 4, root=None if multi or roots is None else roots[0],
                                     roots=roots if multi else None).split(chunks)
    assert check_standard_conditions(collective) == name


def test_wrong_roots_and_a_plain_custom_name():
    with pytest.raises(InvalidCollectiveError, match="exactly one root"):
        check_standard_conditions(Collective("gather", 2, (frozenset({0}), frozenset({1})),
                                             (frozenset({0}), frozenset({0}))))
    # The roots of a multi-root collective fix its chunk order: swapped roots are another one.
    swapped = standard_collective("multiroot_broadcast", 4, roots=[0, 1])
    swapped = Collective(swapped.name, 4, swapped.precondition, swapped.postcondition,
                         roots=(1, 0))
    with pytest.raises(InvalidCollectiveError, match="chunk 0 pre is"):
        check_standard_conditions(swapped)
    pairs = Collective("pairs", 2, (frozenset({0}),), (frozenset({1}),))
    assert check_standard_conditions(pairs) is None


def test_run_blames_the_file_not_the_command_line(tmp_path, monkeypatch, capsys):
    # An algorithm built in Python (not read from a file) with a tampered "allgather": run
    # still says it is an error in the input (exit 1), not a usage error (exit 2).
    good = tmp_path / "good.json"
    good.write_text(json.dumps(_ring4_allgather()))
    odd = Collective("allgather", 4, tuple(frozenset({r}) for r in range(4)),
                     tuple(frozenset({r}) for r in range(4)))
    tampered = Algorithm("odd", get_topology("ring:4"), odd, (Step(1, ()),))
    monkeypatch.setattr("collsynth.algorithm.fileformat.load_algorithm", lambda path: tampered)
    assert main(["run", str(good), "--iters", "0"]) == EXIT_ERROR
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "pre/postconditions" in err[0] and "--help" not in err[0]
