"""The tuned export: the fastest predicted layout per size range, each range a checked program.

Expected values come from hand counts on a 4-rank ring (docs/runtime-model.md: base latency
once, a hop latency per transfer, bytes over the connection's rate) and from a brute-force
pricing of every variant at every size (the tuner prices only the contenders).
"""

from __future__ import annotations

import math
import re

import pytest

from collsynth.algorithm import Algorithm, Send, Step, verify
from collsynth.collective import allgather
from collsynth.errors import InvalidInstanceError, OutputPathError
from collsynth.export.check import check_program
from collsynth.export.lower import lower
from collsynth.export.pipeline import export_programs
from collsynth.export.xml_reader import read_program, text_problems
from collsynth.runtimes import PROTOCOLS, get_runtime
from collsynth.timing.runtime_model import prepare_program, simulate_program
from collsynth.timing.tune import Variant, tune_export, write_tuned
from collsynth.topology import get_topology
from collsynth.topology.builtins import with_figures

SIZES = [1024, 64 * 1024, 4 << 20, 256 << 20, 1 << 30]
#: A small search (one or two channels by chunk, one or two instances) keeps the tests fast.
SMALL = {"layouts": ((1, "chunk"), (2, "chunk")), "instances": (1, 2)}


@pytest.fixture(scope="module")
def ring_allgather() -> Algorithm:
    """The 3-step ring allgather on ``ring:4`` (10 GB/s links), one chunk per rank."""
    ring = with_figures(get_topology("ring:4"), unit_gbps=10.0, alpha_us=1.0)
    steps = tuple(Step(1, tuple(Send((r - t) % 4, r, (r + 1) % 4) for r in range(4)))
                  for t in range(3))
    return verify(Algorithm("ring4-allgather", ring, allgather(4), steps))


def ceilinged(gbps: dict[str, float]):
    """NCCL's defaults with a per-connection data ceiling per protocol (GB/s)."""
    c = get_runtime("msccl").defaults
    return c.replace(ceiling_gbps={k: {p: gbps[p] for p in PROTOCOLS}
                                   for k in ("intra", "network")})


@pytest.fixture(scope="module")
def tuned_msccl(ring_allgather):
    return tune_export(ring_allgather, "msccl", sizes=SIZES, **SMALL)


@pytest.fixture(scope="module")
def tuned_rccl(ring_allgather):
    return tune_export(ring_allgather, "rccl", sizes=SIZES, **SMALL)


def test_never_slower_than_the_untuned_export_which_is_searched(ring_allgather, tuned_msccl):
    assert tuned_msccl.untuned == Variant(1, "chunk", 1, "Simple")
    assert tuned_msccl.untuned in tuned_msccl.tried
    # The untuned column is the default export, priced on its own path.
    default = export_programs(ring_allgather, ["msccl"], subject="ring")["msccl"].program
    prepared = prepare_program(default, ring_allgather.topology)
    constants = get_runtime("msccl").defaults
    for row in tuned_msccl.rows:
        alone = simulate_program(prepared, None, row.size_bytes, constants).time_us
        assert row.untuned_time_us == pytest.approx(alone, rel=1e-9)
        assert row.time_us <= row.untuned_time_us * (1 + 1e-12)
        assert row.algbw_gbps == pytest.approx(row.size_bytes / (row.time_us * 1e3))


def test_the_choice_is_the_fastest_of_every_variant_priced_exactly(ring_allgather, tuned_rccl):
    constants = get_runtime("rccl").defaults
    prepared = {}
    for row in tuned_rccl.rows:
        times = {}
        for v in tuned_rccl.tried:
            key = (v.channels, v.channel_by, v.instances)
            if key not in prepared:
                prepared[key] = prepare_program(lower(
                    ring_allgather, runtime="rccl", channels=v.channels,
                    channel_by=v.channel_by, instances=v.instances), ring_allgather.topology)
            times[v] = simulate_program(prepared[key], None, row.size_bytes, constants,
                                        protocol=v.protocol).time_us
        assert row.time_us == pytest.approx(min(times.values()), rel=1e-9)
        assert times[row.variant] == pytest.approx(row.time_us, rel=1e-9)
    assert {v.protocol for v in tuned_rccl.tried} == {"Simple", "LL"}   # no LL128 on rccl


def test_tiny_sizes_take_ll_on_the_fewest_channels(tuned_msccl):
    # 1 KiB: the time is latency. LL's base (6.6 us) and hop (0.6 us) are below Simple's (8.4,
    # 3.4): LL wins. On a ring each link carries one chunk per step, so more channels or
    # instances shorten nothing, and a tie keeps the fewest.
    small = tuned_msccl.rows[0]
    assert small.variant == Variant(1, "chunk", 1, "LL")
    # Hand count: base + 3 steps of (hop + 256 data bytes at LL's half of 10 GB/s); the local
    # copy is free (gamma 0) and runs beside them.
    assert small.time_us == pytest.approx(6.6 + 3 * (0.6 + 256 / 5e3), rel=1e-6)


def test_huge_sizes_take_more_connections_when_one_connection_caps(ring_allgather):
    # One connection carries at most 1 GB/s (Simple; LL 0.5) of a 10 GB/s link. K instances
    # put K connections on every link, so the ring's 3 steps of 256 MiB per link take
    # 3 x 256 MiB / (K GB/s): with K = 4, algbw = 1 GiB / that = 16/3 GB/s; untuned 4/3 GB/s.
    tuned = tune_export(ring_allgather, "msccl", sizes=[1 << 30], layouts=((1, "chunk"),),
                        instances=(1, 2, 4),
                        constants=ceilinged({"Simple": 1.0, "LL": 0.5, "LL128": 0.9}))
    row = tuned.rows[0]
    assert row.variant == Variant(1, "chunk", 4, "Simple")
    assert row.algbw_gbps == pytest.approx(16 / 3, rel=0.02)
    assert row.untuned_algbw_gbps == pytest.approx(4 / 3, rel=0.02)


@pytest.mark.parametrize("which", ["tuned_msccl", "tuned_rccl"])
def test_ranges_are_contiguous_and_cover_every_size(which, request):
    tuned = request.getfixturevalue(which)
    ranges = tuned.ranges
    assert ranges[0].min_bytes == 0
    for a, b in zip(ranges, ranges[1:]):
        assert a.max_bytes is not None and b.min_bytes == a.max_bytes + 1
        assert a.variant != b.variant          # same winners are merged
    if tuned.runtime == "rccl":
        assert ranges[-1].max_bytes is None
    else:   # msccl cannot say "unlimited": the last range reaches at least the largest size
        assert ranges[-1].max_bytes >= SIZES[-1]
    for row in tuned.rows:
        holding = [r for r in ranges if r.contains(row.size_bytes)]
        assert len(holding) == 1 and holding[0].variant == row.variant
    assert len(ranges) >= 2    # LL for small sizes, Simple for large ones


@pytest.mark.parametrize("which", ["tuned_msccl", "tuned_rccl"])
def test_written_programs_pass_the_checker_with_their_byte_range(which, request, tmp_path):
    tuned = request.getfixturevalue(which)
    paths = write_tuned(tuned, tmp_path / "tuned")
    assert len(paths) == len(tuned.ranges)
    for path, r in zip(paths, tuned.ranges):
        text = path.read_text()
        assert not text_problems(text, tuned.runtime)
        program = read_program(text, runtime=tuned.runtime)
        report = check_program(program, runtime=tuned.runtime, collective="allgather",
                               strict=True)
        assert not report.problems, report.problems[:3]
        assert program.proto == r.variant.protocol
        low = int(re.search(r'minBytes="(\d+)"', text).group(1))
        high = int(re.search(r'maxBytes="(\d+)"', text).group(1))
        assert low == r.min_bytes
        if tuned.runtime == "msccl":        # exclusive bound
            assert high == r.max_bytes + 1
        else:                               # inclusive; 0 = no limit
            assert high == (r.max_bytes or 0)


def test_ranges_are_capped_for_msccl_and_on_request(ring_allgather):
    one = tune_export(ring_allgather, "rccl", sizes=SIZES, max_ranges=1, **SMALL)
    assert len(one.ranges) == 1 and one.ranges[0].max_bytes is None
    assert {row.variant for row in one.rows} == {one.ranges[0].variant}
    # The merged range runs the variant with the least summed relative slowdown; the untuned
    # variant is priced at every size, so the slowdown is finite.
    assert all(math.isfinite(row.time_us) for row in one.rows)


def test_the_boundary_lies_where_the_two_winners_cross(ring_allgather, tuned_rccl):
    # Here each variant's time is affine in the size between the sampled sizes, so two
    # winners cross once: the next range's variant wins from its first byte on, and the
    # previous one still wins just below (the bisection brackets the crossing within 0.1%).
    constants = get_runtime("rccl").defaults

    def time(variant, size):
        program = lower(ring_allgather, runtime="rccl", channels=variant.channels,
                        channel_by=variant.channel_by, instances=variant.instances)
        return simulate_program(program, ring_allgather.topology, size, constants,
                                protocol=variant.protocol).time_us

    for a, b in zip(tuned_rccl.ranges, tuned_rccl.ranges[1:]):
        edge = b.min_bytes
        assert time(b.variant, edge) < time(a.variant, edge)
        below = math.floor(edge / 1.002)
        assert time(a.variant, below) <= time(b.variant, below)


def test_bad_input_is_refused(ring_allgather, tmp_path):
    with pytest.raises(InvalidInstanceError, match="at least one size"):
        tune_export(ring_allgather, "msccl", sizes=[])
    with pytest.raises(InvalidInstanceError, match="size 0"):
        tune_export(ring_allgather, "msccl", sizes=[0, 1024])
    with pytest.raises(InvalidInstanceError, match="ranks"):
        tune_export(ring_allgather, "msccl", get_topology("ring:8"), sizes=[1024])
    tuned = tune_export(ring_allgather, "rccl", sizes=[1024], layouts=((1, "chunk"),),
                        instances=(1,))
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(OutputPathError):
        write_tuned(tuned, blocker)


# -- collsynth export --tune ----------------------------------------------------------------------


def test_cli_export_tune_writes_checked_programs_per_range(ring_allgather, tmp_path, capsys):
    """At 1 KB the latency decides (LL's 0.6 us hops against Simple's 3.4 us: LL), at 1 GB the
    bandwidth (LL carries half the bytes per line: Simple): two ranges, each its own program,
    each passing ``collsynth check``."""
    from collsynth.algorithm.fileformat import save_algorithm
    from collsynth.cli import main

    algo_file = tmp_path / "ring.json"
    save_algorithm(ring_allgather, algo_file)
    out_dir = tmp_path / "tuned"
    code = main(["export", str(algo_file), "--tune", "--sizes", "1KB,1GB", "-o", str(out_dir),
                 "--json"])
    assert code == 0
    import json

    report = json.loads(capsys.readouterr().out)
    assert report["prediction"] is True
    assert [row["protocol"] for row in report["rows"]] == ["LL", "Simple"]
    files = sorted(out_dir.iterdir())
    assert len(files) == len(report["files"]) == 2
    for entry in report["files"]:
        text = open(entry["path"]).read()
        assert re.search(r'minBytes="\d+"', text) and re.search(r'maxBytes="\d+"', text)
        assert main(["check", entry["path"], "--runtime", "msccl"]) == 0
    capsys.readouterr()


@pytest.mark.parametrize("extra, message", [
    (["--channels", "2"], "--channels: --tune chooses these itself"),
    (["--runtime", "all"], "one runtime at a time"),
])
def test_cli_export_tune_refuses_what_it_chooses(ring_allgather, tmp_path, capsys, extra, message):
    from collsynth.algorithm.fileformat import save_algorithm
    from collsynth.cli import main

    algo_file = tmp_path / "ring.json"
    save_algorithm(ring_allgather, algo_file)
    assert main(["export", str(algo_file), "--tune", "-o", str(tmp_path / "t"), *extra]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "t").exists() or not any((tmp_path / "t").iterdir())


def test_cli_sizes_without_tune_is_a_usage_error(ring_allgather, tmp_path, capsys):
    from collsynth.algorithm.fileformat import save_algorithm
    from collsynth.cli import main

    algo_file = tmp_path / "ring.json"
    save_algorithm(ring_allgather, algo_file)
    assert main(["export", str(algo_file), "--sizes", "1KB", "-o", str(tmp_path / "x.xml")]) == 2
    assert "--sizes goes with --tune" in capsys.readouterr().err
