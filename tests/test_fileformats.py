"""Tests of the algorithm and collective file formats and of name/file resolution.

Round trips first; then one row per bad input in :data:`BAD_INPUTS`, each with its own fixture
under ``tests/fixtures/bad/`` (or a name), stating the error type, a precise message fragment,
and the CLI's exit code with a one-line message.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from collsynth.algorithm import Algorithm, Send, Step
from collsynth.algorithm.fileformat import (
    algorithm_from_json,
    algorithm_to_json,
    load_algorithm,
    save_algorithm,
)
from collsynth.algorithm.model import Instance
from collsynth.cli import EXIT_ERROR, EXIT_UNSATISFIABLE, main
from collsynth.collective import standard_collective, standard_names
from collsynth.collective.fileformat import (
    collective_from_json,
    collective_to_json,
    load_collective,
    save_collective,
)
from collsynth.collective.model import MAX_CHUNKS
from collsynth.errors import (
    CollsynthError,
    FileFormatError,
    InputTooLargeError,
    InvalidCollectiveError,
    UnimplementableError,
    UnknownNameError,
    VerificationError,
)
from collsynth.resolve import resolve_collective, resolve_topology
from collsynth.synthesis import SolveOptions, solve_instance
from collsynth.topology import get_topology, save_topology
from collsynth.bounds import compute_bounds

ROOT = Path(__file__).resolve().parents[1]
BAD = ROOT / "tests" / "fixtures" / "bad"
EXAMPLE = ROOT / "examples" / "custom_collective_pairs.json"


def _solve(topology: str, collective: str, instance: Instance, **kwargs) -> Algorithm:
    topo = get_topology(topology)
    result = solve_instance(topo, standard_collective(collective, topo.num_ranks, **kwargs),
                            instance, options=SolveOptions())
    assert result.algorithm is not None
    return result.algorithm


# -- round trips ----------------------------------------------------------------------------------


def test_algorithm_round_trip(tmp_path):
    algorithm = _solve("ring:4", "allgather", Instance(steps=2, rounds=3, chunks=2))
    path = tmp_path / "sub" / "ag.json"
    path.parent.mkdir()  # writers never create missing folders (collsynth._output)
    save_algorithm(algorithm, path)
    loaded = load_algorithm(path)
    assert loaded.steps == algorithm.steps
    assert loaded.topology == algorithm.topology
    assert loaded.collective == algorithm.collective
    assert loaded.name == algorithm.name
    assert loaded.provenance["backend"] == algorithm.provenance["backend"]
    data = json.loads(path.read_text())
    assert data["format"] == "collsynth-algorithm" and data["version"] == 1
    assert data["instance"] == {"steps": 2, "rounds": 3, "chunks": 2, "rounds_per_chunk": "3/2"}
    assert all(len(send) == 3 for step in data["steps"] for send in step["sends"])
    assert [p.name for p in path.parent.iterdir()] == ["ag.json"]  # no temporary file left


def test_combining_algorithm_round_trip_marks_reduces(tmp_path):
    algorithm = _solve("ring:4", "reduce_scatter", Instance(steps=2, rounds=2))
    path = tmp_path / "rs.json"
    save_algorithm(algorithm, path)
    data = json.loads(path.read_text())
    assert {len(send) for step in data["steps"] for send in step["sends"]} == {4}
    assert all(send[3] == 1 for step in data["steps"] for send in step["sends"])
    loaded = load_algorithm(path)
    assert loaded.steps == algorithm.steps
    assert loaded.collective.combining


def test_extra_memory_recorded_and_checked(tmp_path):
    algorithm = _solve("fully-connected:4", "allgather", Instance(steps=1, extra_memory=0))
    path = tmp_path / "a.json"
    save_algorithm(algorithm, path, extra_memory=0)
    assert json.loads(path.read_text())["instance"]["extra_memory"] == 0
    assert load_algorithm(path).steps == algorithm.steps


def test_save_refuses_a_wrong_algorithm(tmp_path):
    ring = get_topology("ring:3")
    wrong = Algorithm("bcast", ring, standard_collective("broadcast", 3),
                      (Step(1, (Send(0, 0, 1),)),))
    with pytest.raises(VerificationError, match="rank 2 never receives chunk 0"):
        save_algorithm(wrong, tmp_path / "wrong.json")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name", standard_names())
def test_collective_round_trip(name):
    roots = [0, 2] if name.startswith("multiroot") else None
    collective = standard_collective(name, 4, roots=roots)
    for c in (collective, collective.split(3)):
        assert collective_from_json(json.loads(json.dumps(collective_to_json(c)))) == c


def test_collective_file_round_trip(tmp_path):
    collective = standard_collective("multiroot_scatter", 4, roots=[3, 1]).split(2)
    save_collective(collective, tmp_path / "c.json")
    assert load_collective(tmp_path / "c.json") == collective


def test_example_custom_collective():
    pairs = load_collective(EXAMPLE)
    assert pairs.num_ranks == 8 and pairs.num_chunks == 8
    for i in range(8):
        assert pairs.precondition[i] == {i} and pairs.postcondition[i] == {i ^ 1, i ^ 2}
    assert resolve_collective(str(EXAMPLE), 8) == pairs
    assert compute_bounds(get_topology("dgx1"), pairs).steps == 1


# -- resolution -----------------------------------------------------------------------------------


def test_resolve_topology_names_and_files(tmp_path, monkeypatch):
    assert resolve_topology("DGX1").name == "DGX1"
    assert resolve_topology("Ring:6").num_ranks == 6
    save_topology(get_topology("ring:5"), tmp_path / "mine.json")
    assert resolve_topology(str(tmp_path / "mine.json")).num_ranks == 5
    # A topology JSON without the extension is still recognised by its content.
    (tmp_path / "mine.topo").write_text((tmp_path / "mine.json").read_text())
    assert resolve_topology(str(tmp_path / "mine.topo")).num_ranks == 5
    # A bare name is a built-in even when a file of that name exists; ./name reads the file.
    monkeypatch.chdir(tmp_path)
    (tmp_path / "dgx1").write_text((tmp_path / "mine.json").read_text())
    assert resolve_topology("dgx1").name == "DGX1"
    assert resolve_topology("./dgx1").num_ranks == 5
    # A bare name that is no built-in falls back to a file of that name.
    (tmp_path / "mytopo").write_text((tmp_path / "mine.json").read_text())
    assert resolve_topology("mytopo").num_ranks == 5


def test_resolve_topology_nodes():
    two = resolve_topology("dgx-a100", nodes=2)
    assert two.num_ranks == 16
    assert resolve_topology("dgx-a100", nodes=1) == get_topology("dgx-a100")


def test_resolve_collective_refuses_roots_for_files():
    with pytest.raises(InvalidCollectiveError, match="lists its own roots"):
        resolve_collective(str(EXAMPLE), 8, root=1)


# -- bad input ------------------------------------------------------------------------------------

#: (id, loader, input, error type, message fragment, CLI argv, CLI exit code)
BAD_INPUTS = [
    ("unknown-topology", resolve_topology, "dgx7", UnknownNameError,
     "unknown topology 'dgx7'; valid names: dgx-a100, dgx-b200, dgx-h100, dgx-h200, dgx1",
     ["bounds", "dgx7", "allgather"], EXIT_ERROR),
    ("unknown-collective", lambda spec: resolve_collective(spec, 8), "allgathr", UnknownNameError,
     "unknown collective 'allgathr'; valid names: allgather, allreduce, alltoall",
     ["bounds", "dgx1", "allgathr"], EXIT_ERROR),
    ("non-square", resolve_topology, "topology_non_square.json", FileFormatError,
     "the link matrix is not square: row 1 has 2 entries, expected 3",
     ["bounds", "@", "allgather"], EXIT_ERROR),
    ("negative-link", resolve_topology, "topology_negative_link.json", FileFormatError,
     "links[1][2] = -1 is negative", ["bounds", "@", "allgather"], EXIT_ERROR),
    ("self-link", resolve_topology, "topology_self_link.json", FileFormatError,
     "self-link links[1][1] = 1", ["bounds", "@", "allgather"], EXIT_ERROR),
    ("group-missing-rank", resolve_topology, "topology_group_missing_rank.json", FileFormatError,
     "bandwidth group switch port names missing rank(s) [5] in its destinations",
     ["bounds", "@", "allgather"], EXIT_ERROR),
    ("malformed-json", resolve_topology, "topology_malformed.json", FileFormatError,
     "malformed JSON at line 8 column 2", ["bounds", "@", "allgather"], EXIT_ERROR),
    ("truncated-topology", resolve_topology, "topology_truncated.json", FileFormatError,
     "malformed JSON at line 7", ["bounds", "@", "allgather"], EXIT_ERROR),
    ("truncated-collective", load_collective, "collective_truncated.json", FileFormatError,
     "malformed JSON at line 7", ["bounds", "ring:4", "@"], EXIT_ERROR),
    ("truncated-algorithm", load_algorithm, "algorithm_truncated.json", FileFormatError,
     "malformed JSON at line", ["verify", "@"], EXIT_ERROR),
    ("send-removed", load_algorithm, "algorithm_send_removed.json", VerificationError,
     "is not a correct allgather(n=4) on ring:4: rank 1 never receives chunk 3",
     ["verify", "@"], EXIT_ERROR),
    ("missing-link", load_algorithm, "algorithm_missing_link.json", VerificationError,
     "step 0: rank 0 sends chunk 0 to rank 2 but there is no link 0->2", ["show", "@"],
     EXIT_ERROR),
    ("algorithm-unknown-version", load_algorithm, "algorithm_unknown_version.json",
     FileFormatError, "unknown version 7; this collsynth reads version 1", ["verify", "@"],
     EXIT_ERROR),
    ("bad-send", load_algorithm, "algorithm_bad_send.json", FileFormatError,
     "steps[1].sends[2]: expected [chunk, src, dst] with integers", ["verify", "@"], EXIT_ERROR),
    ("send-out-of-range", load_algorithm, "algorithm_send_rank_out_of_range.json",
     FileFormatError, "steps[0].sends[1]: dst 7 is not a rank 0..3", ["verify", "@"], EXIT_ERROR),
    ("instance-mismatch", load_algorithm, "algorithm_instance_mismatch.json", FileFormatError,
     "instance.rounds = 3 but the steps add up to 2 rounds", ["verify", "@"], EXIT_ERROR),
    ("collective-size-mismatch", load_algorithm, "algorithm_collective_size_mismatch.json",
     FileFormatError, "collective.num_ranks = 5 but the topology 'ring:4' has 4 ranks",
     ["verify", "@"], EXIT_ERROR),
    ("not-an-algorithm", load_algorithm, "algorithm_is_a_topology.json", FileFormatError,
     "field 'format' is \"collsynth-topology\", expected 'collsynth-algorithm'",
     ["verify", "@"], EXIT_ERROR),
    ("collective-unknown-version", load_collective, "collective_unknown_version.json",
     FileFormatError, "unknown version 7; this collsynth reads version 1",
     ["bounds", "ring:4", "@"], EXIT_ERROR),
    ("collective-huge", load_collective, "collective_huge_num_ranks.json", InputTooLargeError,
     "num_ranks = 1000000 is more than the 65536 ranks collsynth accepts",
     ["bounds", "ring:4", "@"], EXIT_ERROR),
    ("collective-rank-out-of-range", load_collective, "collective_rank_out_of_range.json",
     FileFormatError, "chunks[1].post[1]: rank 9 is not a rank 0..3",
     ["bounds", "ring:4", "@"], EXIT_ERROR),
    ("collective-empty-pre", load_collective, "collective_empty_pre.json", FileFormatError,
     "chunks[1].pre: empty; at least one rank must start with the chunk",
     ["bounds", "ring:4", "@"], EXIT_ERROR),
    ("collective-misspelt-field", load_collective, "collective_misspelt_field.json",
     FileFormatError, "chunks[1]: unknown field 'pots'; expected 'pre' and 'post'",
     ["bounds", "ring:4", "@"], EXIT_ERROR),
    ("collective-ranks-differ", lambda spec: resolve_collective(spec, 8),
     "collective_four_ranks.json", InvalidCollectiveError,
     "custom collective 'neighbours4' has num_ranks = 4 but the topology has 8 ranks",
     ["bounds", "dgx1", "@"], EXIT_ERROR),
    ("ring-too-large", resolve_topology, "ring:1000000", InputTooLargeError,
     "ring:1000000: more than the 8192 ranks", ["bounds", "ring:1000000", "allgather"],
     EXIT_ERROR),
    # Hostile numbers and names (issue 12): one-line errors naming the file and the field.
    ("link-beyond-64-bits", resolve_topology, "topology_link_beyond_64_bits.json",
     FileFormatError, "links[0][1] = 9223372036854775808: expected a whole number from 0 to "
     "1048576", ["bounds", "@", "allgather"], EXIT_ERROR),
    ("topology-5000-digits", resolve_topology, "topology_5000_digit_number.json", FileFormatError,
     "line 8 column 4: a number of more than 100 digits", ["bounds", "@", "allgather"],
     EXIT_ERROR),
    ("unit-gbps-infinity", resolve_topology, "topology_unit_gbps_infinity.json", FileFormatError,
     "Infinity is not a number JSON allows", ["bounds", "@", "allgather"], EXIT_ERROR),
    ("alpha-1e308", resolve_topology, "topology_alpha_1e308.json", FileFormatError,
     "alpha_us = 1e+308: expected a finite number >= 1e-06 and <= 3.6e+09 (us: 1 ps to an hour)",
     ["bounds", "@", "allgather"], EXIT_ERROR),
    ("topology-nul-in-name", resolve_topology, "topology_nul_in_name.json", FileFormatError,
     "name = 'dgx\\x001': a control character (NUL) at position 3",
     ["bounds", "@", "allgather"], EXIT_ERROR),
    ("chunk-factor-1e30", load_collective, "collective_chunk_factor_1e30.json", FileFormatError,
     "field 'chunk_factor': expected an integer from 1 to 4194304, got "
     "1000000000000000000000000000000", ["bounds", "ring:4", "@"], EXIT_ERROR),
    ("collective-5000-digits", load_collective, "collective_5000_digit_rank.json",
     FileFormatError, "line 13 column 5: a number of more than 100 digits",
     ["bounds", "ring:4", "@"], EXIT_ERROR),
    ("rounds-beyond-64-bits", load_algorithm, "algorithm_rounds_beyond_64_bits.json",
     FileFormatError, "steps[0].rounds = 9223372036854775808: more than the 4194304 rounds",
     ["verify", "@"], EXIT_ERROR),
    ("algorithm-nul-in-name", load_algorithm, "algorithm_nul_in_name.json", FileFormatError,
     "field 'name' = 'allgather\\x00ring': a control character (NUL)", ["show", "@"],
     EXIT_ERROR),
    ("algorithm-nan", load_algorithm, "algorithm_topology_unit_nan.json", FileFormatError,
     "NaN is not a number JSON allows", ["verify", "@"], EXIT_ERROR),
    ("provenance-too-deep", load_algorithm, "algorithm_provenance_too_deep.json",
     FileFormatError, "provenance: nested more than 64 levels deep", ["verify", "@"], EXIT_ERROR),
    ("one-way-chain", lambda spec: compute_bounds(resolve_topology(spec),
                                                  standard_collective("allgather", 4)),
     "topology_one_way_chain.json", UnimplementableError,
     "rank 0 can never receive chunk 1: no path from any of ranks [1]",
     ["solve", "least-steps", "@", "allgather"], EXIT_UNSATISFIABLE),
]


def _arg(value: str) -> str:
    """A fixture name as a path under tests/fixtures/bad; a built-in name as is."""
    return str(BAD / value) if value.endswith(".json") else value


@pytest.mark.parametrize("case", BAD_INPUTS, ids=[row[0] for row in BAD_INPUTS])
def test_bad_input(case, capsys):
    _, loader, spec, error, fragment, argv, exit_code = case
    if spec.endswith(".json"):
        assert (BAD / spec).is_file(), f"missing fixture {spec}"
    started = time.perf_counter()
    with pytest.raises(error) as caught:
        loader(_arg(spec))
    # Generous: only a loader that does the refused work first (minutes) trips it.
    assert time.perf_counter() - started < 60, "refused, but not before doing work"
    message = str(caught.value)
    assert fragment in message
    if spec.endswith(".json") and error is not UnimplementableError:
        assert spec in message, "the message names the file"
    assert isinstance(caught.value, CollsynthError)

    code = main([_arg(spec) if a == "@" else a for a in argv])
    _, err = capsys.readouterr()
    assert code == exit_code
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("collsynth: error: "), err
    assert fragment in lines[0]


def test_too_many_chunks_refused_before_reading_them():
    obj = {"name": "many", "num_ranks": 2, "chunks": [None] * (MAX_CHUNKS + 1)}
    started = time.perf_counter()
    with pytest.raises(InputTooLargeError, match=f"{MAX_CHUNKS + 1} chunks is more than"):
        collective_from_json(obj, source="many.json")
    assert time.perf_counter() - started < 30   # generous: catches reading the chunks first


def test_algorithm_from_json_checks_fields():
    algorithm = _solve("ring:4", "allgather", Instance(steps=2, rounds=2))
    good = algorithm_to_json(algorithm)
    cases = [
        ({**good, "steps": [{"rounds": 0, "sends": []}]}, "steps[0].rounds: expected a positive "
                                                           "integer, got 0"),
        ({**good, "steps": "many"}, "field 'steps': expected a list of steps"),
        ({k: v for k, v in good.items() if k != "topology"}, "missing field 'topology'"),
        ({**good, "extra": 1}, "unknown field 'extra'"),
        ({**good, "instance": {**good["instance"], "rounds_per_chunk": "5/2"}},
         "instance.rounds_per_chunk = 5/2 but rounds / chunks = 2"),
        ({**good, "topology": {**good["topology"], "links": "x"}},
         "<algorithm>: topology: field 'links' is str, expected list"),
    ]
    for obj, fragment in cases:
        with pytest.raises(FileFormatError) as caught:
            algorithm_from_json(obj)
        assert fragment in str(caught.value)


def test_every_bad_fixture_of_ours_has_a_case():
    ours = {p.name for p in BAD.iterdir()
            if p.name.startswith(("algorithm_", "collective_", "topology_"))}
    assert ours == {row[2] for row in BAD_INPUTS if row[2].endswith(".json")}


def test_large_steps_round_trip_through_arrays(tmp_path):
    """Steps of more than 10000 sends are written from and read into arrays (SendBlock); a bad
    send in such a step still gets the precise per-send error."""
    import json

    from collsynth.algorithm.arrays import SendBlock
    from collsynth.algorithm.fileformat import load_algorithm, save_algorithm
    from collsynth.collective import standard_collective
    from collsynth.errors import FileFormatError
    from collsynth.resolve import resolve_topology
    from collsynth.synthesis.bandwidth_optimal import solve_bandwidth_optimal

    topology = resolve_topology("dgx-a100", nodes=2)
    result = solve_bandwidth_optimal(topology, standard_collective("reduce_scatter", 16), stages=1)
    path = tmp_path / "rs.json"
    save_algorithm(result.algorithm, path)
    loaded = load_algorithm(path)
    assert loaded.steps == result.algorithm.steps
    assert any(isinstance(step.sends, SendBlock) and len(step.sends) > 10_000
               for step in loaded.steps)
    obj = json.loads(path.read_text())
    big = max(range(len(obj["steps"])), key=lambda i: len(obj["steps"][i]["sends"]))
    obj["steps"][big]["sends"][5] = [0, 0, 99]
    path.write_text(json.dumps(obj))
    with pytest.raises(FileFormatError, match=rf"steps\[{big}\]\.sends\[5\]: dst 99 is not a rank"):
        load_algorithm(path)
