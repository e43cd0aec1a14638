"""Restaging for export (collsynth.export.coarsen) and the default export that uses it: expected
schedules written out by hand from the definitions in docs/export.md ("Restaging"), every result
verified, and every program lowered from one checked."""

from __future__ import annotations

import pytest

from collsynth.algorithm import Algorithm, Send, Step, save_algorithm, verify
from collsynth.cli import main
from collsynth.collective import allreduce, broadcast, reduce
from collsynth.errors import ExportError
from collsynth.export.coarsen import (coarsen, join_pieces, restage, sort_pieces, stage_choices,
                                      waves)
from collsynth.export.layout import collective_layout
from collsynth.export.lower import lower
from collsynth.export.pipeline import check_exported, export_programs
from collsynth.topology import get_topology

RUNTIMES = ["msccl", "rccl", "msccl-executor"]


def _chain(pieces: int, *, reducing: bool = False) -> Algorithm:
    """Pieces pipelined along line:3: broadcast from 0 (piece p crosses 0 -> 1 in step p and
    1 -> 2 in step p + 1), or its time reversal, a reduce to 2."""
    steps = tuple(tuple(Send(p, h, h + 1, reducing) for h in (0, 1) for p in range(pieces)
                        if p + h == t) for t in range(pieces + 1))
    collective = reduce(3, 2) if reducing else broadcast(3, 0)
    return verify(Algorithm("chain", get_topology("line:3"), collective.split(pieces),
                            tuple(Step(1, sends) for sends in steps)))


def _sends(algorithm: Algorithm) -> list[list[tuple[int, int, int]]]:
    return [[(s.chunk, s.src, s.dst) for s in step.sends] for step in algorithm.steps]


def test_waves_and_stage_choices_of_a_pipeline():
    assert waves(_chain(4)) == 4 and waves(_chain(4, reducing=True)) == 4
    assert stage_choices(_chain(4)) == (4, 2, 1)
    assert stage_choices(_chain(6)) == (6, 3, 2, 1)
    # A schedule that sends everything as early as it can has one wave.
    assert waves(_chain(1)) == 1 and stage_choices(_chain(1)) == (1,)


def _two_trees(stages: int, *, reverse: bool) -> Algorithm:
    """Broadcast from 0 on fully-connected:3 down two trees, one piece each per stage: tree A
    0 -> 1 -> 2 (stage s in steps s, s + 1), tree B 0 -> 1, 0 -> 2 (step s). With ``reverse``,
    its time reversal: a reduce to 0, where tree B's one-hop pieces go in the *last* step of
    their stage, one step after tree A's first hop."""
    forward: list[list[tuple[int, int, int]]] = [[] for _ in range(stages + 1)]
    for s in range(stages):
        forward[s] += [(2 * s, 0, 1), (2 * s + 1, 0, 1), (2 * s + 1, 0, 2)]
        forward[s + 1].append((2 * s, 1, 2))
    if reverse:
        steps = [tuple(Send(c, v, u, True) for c, u, v in sends) for sends in forward[::-1]]
        collective = reduce(3, 0)
    else:
        steps = [tuple(Send(c, u, v) for c, u, v in sends) for sends in forward]
        collective = broadcast(3, 0)
    return verify(Algorithm("trees", get_topology("fully-connected:3"),
                            collective.split(2 * stages), tuple(Step(2, x) for x in steps)))


def test_waves_line_up_routes_of_different_lengths():
    """A piece's wave is measured against the other pieces of its route, so the reversed
    pipeline's one-hop pieces (late by one step) share their stage's wave: 4 waves, not 5, and
    restaged to 2 stages each (stage pair, tree) class of 2 pieces joins into one piece."""
    for reverse in (False, True):
        trees = _two_trees(4, reverse=reverse)
        assert waves(trees) == 4 and stage_choices(trees) == (4, 2, 1)
        assert restage(trees, 2).collective.chunk_factor == 4


def test_coarsen_pairs_the_stages_of_a_pipeline():
    """Waves {0, 1} and {2, 3} become two stages: each pair crosses a link in one step, the
    second pair one step behind the first (stage + earliest step)."""
    halved = coarsen(_chain(4), 2)
    assert _sends(halved) == [[(0, 0, 1), (1, 0, 1)],
                              [(0, 1, 2), (2, 0, 1), (1, 1, 2), (3, 0, 1)],
                              [(2, 1, 2), (3, 1, 2)]]
    assert [step.rounds for step in halved.steps] == [2, 2, 2]   # two sends per link
    assert halved.provenance["coarsened"] == {"waves": 4, "stages": 2}
    chain = _chain(4)
    assert coarsen(chain, 4) is chain and coarsen(chain, 9) is chain


def test_coarsen_keeps_every_reduction_in_order():
    """The reduce chain coarsened to one stage: all of rank 0's pieces reach rank 1 before rank 1
    forwards any partial sum (verified: a partial sent early would miss rank 0's part)."""
    one = coarsen(_chain(4, reducing=True), 1)
    assert _sends(one) == [[(p, 0, 1) for p in range(4)], [(p, 1, 2) for p in range(4)]]


def test_coarsen_keeps_an_exchange_in_one_step():
    """Both ranks of line:2 exchange piece p in step p and add what they receive (an allreduce).
    A rank's send of a piece and its receipt of the same piece must stay in one step: the send
    reads the value before the receipt is added. Coarsened, every exchange lands in one step."""
    steps = tuple(Step(1, (Send(p, 0, 1, True), Send(p, 1, 0, True))) for p in range(4))
    exchange = verify(Algorithm("x", get_topology("line:2"), allreduce(2).split(4), steps))
    assert waves(exchange) == 4
    one = coarsen(exchange, 1)
    assert len(one.steps) == 1 and sorted(_sends(one)[0]) == sorted(
        (p, s, 1 - s) for p in range(4) for s in (0, 1))


def _delayed_copy(first: list[tuple], pieces: int = 2) -> list[tuple[Send, ...]]:
    """``first`` (per step, (src, dst, reduce) sends of piece 0) for ``pieces`` pieces, piece p
    ``p`` steps behind piece 0."""
    steps: list[list[Send]] = [[] for _ in range(len(first) + pieces - 1)]
    for p in range(pieces):
        for t, sends in enumerate(first):
            steps[t + p] += [Send(p, s, d, red) for s, d, red in sends]
    return [tuple(x) for x in steps]


def test_coarsen_keeps_a_late_contribution_after_the_partial_sum_it_must_miss():
    """reduce to 0 on fully-connected:4, two pieces a step apart: rank 1 adds rank 3's part,
    sends its partial sum to 0, and only then receives rank 2's part (which rank 2 also sends
    to 0 itself). Coarsened to one stage, rank 2's part may reach rank 1 in the step rank 1
    sends, never before (the root would count it twice)."""
    first = [[(3, 1, True)], [(1, 0, True)], [(2, 1, True), (2, 0, True)]]
    algorithm = verify(Algorithm("late", get_topology("fully-connected:4"),
                                 reduce(4, 0).split(2),
                                 tuple(Step(1, x) for x in _delayed_copy(first))))
    one = coarsen(algorithm, 1)
    step_of = {(s.chunk, s.src, s.dst): t for t, step in enumerate(one.steps)
               for s in step.sends}
    for piece in (0, 1):
        assert step_of[(piece, 2, 1)] >= step_of[(piece, 1, 0)] > step_of[(piece, 3, 1)]


def test_coarsen_keeps_a_chunk_that_crosses_a_link_twice_in_two_steps():
    """A ring allreduce on ring:3 (reduce-scatter then allgather), two pieces a step apart:
    piece 0 of chunk c crosses c+1 -> c+2 reducing in step 0 and again, as the result, in
    step 3. Merged by connection alone the two crossings would wait for each other; they are
    told apart by their earliest step, and the coarsened ring still verifies."""
    n = 3
    first = [[(c + 1, c + 2, True) for c in range(n)], [(c + 2, c, True) for c in range(n)],
             [(c, c + 1, False) for c in range(n)], [(c + 1, c + 2, False) for c in range(n)]]
    first = [[(s % n, d % n, red) for s, d, red in sends] for sends in first]
    steps: list[list[Send]] = [[] for _ in range(len(first) + 1)]
    for p in range(2):
        for t, sends in enumerate(first):
            steps[t + p] += [Send(2 * c + p, s, d, red) for c, (s, d, red) in enumerate(sends)]
    ring = verify(Algorithm("ring", get_topology("ring:3"), allreduce(3).split(6),
                            tuple(Step(2, tuple(x)) for x in steps)))
    one = coarsen(ring, 1)
    assert len(one.steps) == 4
    crossings = [t for t, step in enumerate(one.steps) for x in step.sends
                 if (x.chunk, x.src, x.dst) == (0, 1, 2)]
    assert crossings == [0, 3]


def test_coarsen_refuses_a_bad_stage_count():
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ExportError, match="stages"):
            coarsen(_chain(4), bad)


def _split_ways() -> Algorithm:
    """Broadcast from the middle of line:3, four pieces: even pieces go left first, odd ones
    right first, then each to the other side."""
    first = tuple(Send(p, 1, 0 if p % 2 == 0 else 2) for p in range(4))
    second = tuple(Send(p, 1, 2 if p % 2 == 0 else 0) for p in range(4))
    return verify(Algorithm("ways", get_topology("line:3"), broadcast(3, 1).split(4),
                            (Step(2, first), Step(2, second))))


def test_sort_pieces_numbers_pieces_sent_together_consecutively():
    """Pieces 0 and 2 travel together, and 1 and 3: renumbered 0, 1 and 2, 3 (ties in the old
    order), so each message of the lowered program carries two consecutive pieces."""
    sorted_ = sort_pieces(_split_ways())
    assert _sends(sorted_) == [[(0, 1, 0), (2, 1, 2), (1, 1, 0), (3, 1, 2)],
                               [(0, 1, 2), (2, 1, 0), (1, 1, 2), (3, 1, 0)]]
    before = lower(_split_ways(), runtime="msccl").gpus[1].threadblocks
    after = lower(sorted_, runtime="msccl").gpus[1].threadblocks
    # Rank 1: local copies, then a threadblock per neighbour: 4 single-piece sends before, 2
    # two-piece sends after.
    assert [len(tb.steps) for tb in before[1:]] == [4, 4]
    assert [[s.cnt for s in tb.steps] for tb in after[1:]] == [[2, 2], [2, 2]]


def test_join_pieces_joins_pieces_that_always_travel_together():
    one = coarsen(_chain(4), 1)
    joined = join_pieces(one)
    assert joined.collective.chunk_factor == 1 and _sends(joined) == [[(0, 0, 1)], [(0, 1, 2)]]
    # Pieces sent in different steps, or to different ranks, stay apart.
    chain = _chain(4)
    assert join_pieces(chain) is chain
    ways = sort_pieces(_split_ways())
    assert join_pieces(ways).collective.chunk_factor == 2   # pieces {0, 1} and {2, 3}


def test_restage_then_lower_passes_the_checker_for_every_case(algorithms):
    """Every test algorithm, restaged to every stage count it offers, verifies (inside restage)
    and lowers to a program every runtime that can express it accepts."""
    checked = 0
    for name, algorithm in algorithms.items():
        for count in stage_choices(algorithm):
            staged = restage(algorithm, count)
            for runtime in RUNTIMES:
                try:
                    collective_layout(staged.collective, runtime)
                    program = lower(staged, runtime=runtime)
                except ExportError:
                    continue  # not expressible, or over a limit
                check_exported(program, runtime, staged)
                checked += 1
    assert checked >= 25


def test_default_export_spreads_or_restages_what_does_not_fit():
    """40 pieces down a chain: rank 1's threadblock holds 40 receives and 40 sends, more than
    rccl's 64 steps. The default keeps the 40 stages and spreads the pieces over 2 channels by
    chunk (20 + 20 per threadblock; by block all 40 pieces are in one block of 71); with one
    channel it halves the stages (20 two-piece messages each way)."""
    chain = _chain(40)
    spread = export_programs(chain, ["rccl"], subject="chain", channels="auto",
                             stages="auto")["rccl"]
    assert (spread.stages, spread.channels, spread.channel_by) == (40, 2, "chunk")
    halved = export_programs(chain, ["rccl"], subject="chain", channels=1,
                             stages="auto")["rccl"]
    assert (halved.stages, halved.channels) == (20, 1)
    assert max(len(tb.steps) for tb in halved.program.gpus[1].threadblocks) == 40
    with pytest.raises(ExportError, match="MSCCL_MAX_NUM_STEPS"):
        export_programs(chain, ["rccl"], subject="chain", channels=1, stages=None)


def test_cli_export_restages_by_default(tmp_path, capsys):
    path = tmp_path / "chain.json"
    save_algorithm(_chain(40), path)
    out = tmp_path / "chain.xml"
    assert main(["export", str(path), "-o", str(out), "--runtime", "rccl", "--channels", "1"]) == 0
    assert "20 stage(s)" in capsys.readouterr().out
    assert main(["check", str(out), "--runtime", "rccl", "--strict"]) == 0
    capsys.readouterr()
    out.unlink()
    assert main(["export", str(path), "-o", str(out), "--runtime", "rccl", "--channels", "1",
                 "--stages", "keep"]) == 1
    assert "MSCCL_MAX_NUM_STEPS" in capsys.readouterr().err and not out.exists()
    assert main(["export", str(path), "-o", str(out), "--runtime", "rccl", "--stages", "0"]) == 2
