"""Pictures of schedules (:mod:`collsynth.draw`) and ``collsynth draw``.

Expected panels, arrows and heat-map sums are counted here from the algorithms' own sends (built
by hand in this file), never from the drawing code: one arrow per (source, destination) pair used
in a step, a matrix cell per link holding the chunks sent over it.
"""

from __future__ import annotations

import os
import re
import xml.etree.ElementTree as ElementTree
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

matplotlib = pytest.importorskip("matplotlib")
from matplotlib.patches import FancyArrowPatch  # noqa: E402 (after the skip)

from collsynth.algorithm.fileformat import save_algorithm  # noqa: E402
from collsynth.algorithm.model import Algorithm, Send, Step  # noqa: E402
from collsynth.algorithm.verify import verify  # noqa: E402
from collsynth.cli import main  # noqa: E402
from collsynth.collective.standard import standard_collective  # noqa: E402
from collsynth.draw import (DrawError, DrawOptions, draw_algorithm, draw_file,  # noqa: E402
                            layout_of, program_traffic, save_drawing)
from collsynth.export.lower import lower  # noqa: E402
from collsynth.export.xml_reader import read_program  # noqa: E402
from collsynth.export.xml_writer import write_program  # noqa: E402
from collsynth.topology.builtins import get_topology  # noqa: E402
from collsynth.errors import CollsynthError  # noqa: E402
from collsynth.topology.compose import compose_nodes  # noqa: E402
from collsynth.topology.families import hub, line, ring  # noqa: E402


# -- algorithms built by hand -----------------------------------------------------------------


def ring4_allgather(second_rounds: int = 1) -> Algorithm:
    """ring:4 allgather, 2 pieces per chunk (piece ``2b + i`` of base chunk ``b``).

    Step 0 (2 rounds): every rank sends both pieces of its chunk to both neighbours: 8 links,
    2 pieces each, one base chunk per link; each link full (1 unit x 2 rounds).
    Step 1: rank ``s`` sends piece ``2(s+1)`` to ``s-1`` and piece ``2(s-1)+1`` to ``s+1``:
    8 links, 1 piece each; full with 1 round, half used with 2.
    """
    n = 4
    first = tuple(Send(2 * r + i, r, (r + d) % n) for r in range(n) for d in (1, n - 1)
                  for i in (0, 1))
    second = tuple(send for s in range(n) for send in (
        Send(2 * ((s + 1) % n), s, (s - 1) % n), Send(2 * ((s - 1) % n) + 1, s, (s + 1) % n)))
    algorithm = Algorithm("ring4-by-hand", ring(n), standard_collective("allgather", n).split(2),
                          (Step(2, first), Step(second_rounds, second)))
    return verify(algorithm)


def ring_pipeline(n: int) -> Algorithm:
    """ring:n allgather one way round: in step ``t`` rank ``r`` passes chunk ``r - t`` on."""
    steps = tuple(Step(1, tuple(Send((r - t) % n, r, (r + 1) % n) for r in range(n)))
                  for t in range(n - 1))
    return verify(Algorithm(f"ring{n}-pipeline", ring(n), standard_collective("allgather", n),
                            steps))


def pairs_by_step(algorithm: Algorithm) -> list[set[tuple[int, int]]]:
    return [{(s.src, s.dst) for s in step.sends} for step in algorithm.steps]


def arrows(axes) -> list[FancyArrowPatch]:
    return [p for p in axes.patches if isinstance(p, FancyArrowPatch)]


def arrow_pairs(axes) -> list[tuple[int, int]]:
    """(src, dst) of each arrow, from its gid ``send SRC->DST``."""
    result = []
    for arrow in arrows(axes):
        src, dst = arrow.get_gid().removeprefix("send ").split("->")
        result.append((int(src), int(dst)))
    return result


def is_solid(arrow: FancyArrowPatch) -> bool:
    return arrow.get_linestyle() in ("-", "solid")


def heatmap(axes) -> np.ndarray:
    (image,) = axes.images
    return np.ma.filled(image.get_array(), 0)


# -- arrows ---------------------------------------------------------------------------------------


def test_one_panel_per_step_and_one_arrow_per_link_used():
    algorithm = ring4_allgather()
    figure = draw_algorithm(algorithm)
    expected = pairs_by_step(algorithm)
    assert len(figure.axes) == len(expected) == 2
    for axes, pairs in zip(figure.axes, expected):
        drawn = arrow_pairs(axes)
        assert len(drawn) == len(pairs) == 8
        assert set(drawn) == pairs


def test_colour_by_base_chunk_and_width_by_chunk_count():
    algorithm = ring4_allgather()
    figure = draw_algorithm(algorithm)
    for axes, step in zip(figure.axes, algorithm.steps):
        pieces: dict[tuple[int, int], list[int]] = {}
        for send in step.sends:
            pieces.setdefault((send.src, send.dst), []).append(send.chunk)
        colour_of_base: dict[int, tuple] = {}
        for arrow, pair in zip(arrows(axes), arrow_pairs(axes)):
            (base,) = {chunk // 2 for chunk in pieces[pair]}  # one base chunk per link here
            colour = tuple(arrow.get_edgecolor())
            assert colour_of_base.setdefault(base, colour) == colour
        assert len(set(colour_of_base.values())) == len(colour_of_base)  # distinct per base
    two = [a.get_linewidth() for a in arrows(figure.axes[0])]   # 2 pieces per link
    one = [a.get_linewidth() for a in arrows(figure.axes[1])]   # 1 piece per link
    assert min(two) > max(one)


def test_links_at_capacity_are_solid_and_others_dashed():
    full = draw_algorithm(ring4_allgather(second_rounds=1))
    assert all(is_solid(a) for axes in full.axes for a in arrows(axes))
    # With 2 rounds the second step's 1-piece links have room for another piece.
    slack = draw_algorithm(ring4_allgather(second_rounds=2))
    assert all(is_solid(a) for a in arrows(slack.axes[0]))
    assert not any(is_solid(a) for a in arrows(slack.axes[1]))


def test_a_switch_port_at_its_limit_makes_its_links_full():
    """hub:4 sends at most one chunk out of (and into) each rank per round. In step 1 (2 rounds)
    rank r sends chunk r-1 to r+1 and to r+2: each link carries 1 chunk where it could carry
    2, but rank r's port carries 2 = its limit x 2 rounds, so every link is full."""
    n = 4
    first = tuple(Send(r, r, (r + 1) % n) for r in range(n))
    second = tuple(Send((r - 1) % n, r, (r + d) % n) for r in range(n) for d in (1, 2))
    algorithm = verify(Algorithm("hub4", hub(n), standard_collective("allgather", n),
                                 (Step(1, first), Step(2, second))))
    figure = draw_algorithm(algorithm)
    assert sorted(arrow_pairs(figure.axes[1])) == sorted(pairs_by_step(algorithm)[1])
    assert len(arrows(figure.axes[1])) == 8
    assert all(is_solid(a) for a in arrows(figure.axes[1]))


def test_steps_option_selects_panels():
    algorithm = ring_pipeline(5)
    figure = draw_algorithm(algorithm, options=DrawOptions(steps=(1, 2)))
    expected = pairs_by_step(algorithm)[1:3]
    assert len(figure.axes) == 2
    for axes, pairs in zip(figure.axes, expected):
        assert sorted(arrow_pairs(axes)) == sorted(pairs)
        assert axes.get_title().startswith(f"step {1 + figure.axes.index(axes)}:")


def test_steps_out_of_range_is_refused():
    with pytest.raises(DrawError, match="there are 2 steps, numbered 0-1"):
        draw_algorithm(ring4_allgather(), options=DrawOptions(steps=(1, 2)))


# -- layouts --------------------------------------------------------------------------------------


@pytest.mark.parametrize("name, kind", [
    ("dgx1", "cube-mesh"), ("ndv2", "cube-mesh"), ("dgx-a100", "switch"), ("dgx-h100", "switch"),
    ("dgx2", "switch"), ("mi300x", "circle"),
])
def test_layout_kind_of_builtins(name, kind):
    layout = layout_of(get_topology(name))
    assert layout.kind == kind
    n = get_topology(name).num_ranks
    assert layout.positions.shape == (n, 2)
    gaps = np.linalg.norm(layout.positions[:, None] - layout.positions[None], axis=-1)
    assert gaps[~np.eye(n, dtype=bool)].min() > 2 * layout.node_radius  # no two ranks overlap
    if kind == "switch":
        assert len(layout.switches) == 1 and set(layout.switch_of) == {0}


def test_line_and_composed_layouts():
    assert layout_of(line(3)).positions.tolist() == [[0, 0], [1, 0], [2, 0]]
    composed = compose_nodes(get_topology("dgx-a100"), 3)
    layout = layout_of(composed)
    assert layout.kind == "nodes" and len(layout.node_boxes) == 3 and len(layout.switches) == 3
    # Node k's ranks all lie to the right of node k-1's.
    xs = layout.positions[:, 0].reshape(3, 8)
    assert (xs[1].min() > xs[0].max()) and (xs[2].min() > xs[1].max())


def test_cube_mesh_long_links_arc_around_the_ranks_in_their_way():
    """DGX-1: 1-5 and 3-7 would run straight through 0 and 4 (2 and 6): their arrows bend far
    more than the others, and both directions of each bend the same way."""
    dgx1 = get_topology("dgx1")
    # One step of an allgather: every rank sends its chunk over every link. (Drawing does not
    # need a complete algorithm; this one stops after the first step.)
    step = Step(1, tuple(Send(r, r, d) for r in range(8) for d in dgx1.destinations[r]))
    partial = Algorithm("dgx1-first-step", dgx1, standard_collective("allgather", 8), (step,))
    figure = draw_algorithm(partial)
    rads = {pair: arrow.get_connectionstyle().rad
            for arrow, pair in zip(arrows(figure.axes[0]), arrow_pairs(figure.axes[0]))}
    assert set(rads) == {(s.src, s.dst) for s in step.sends}
    layout = layout_of(dgx1)
    pos, r = layout.positions, layout.node_radius

    def curve(a, b, rad):
        # matplotlib's arc3: a quadratic Bezier whose control point sits rad x |ab| from the
        # middle of ab, on the side of (dy, -dx).
        d = pos[b] - pos[a]
        control = (pos[a] + pos[b]) / 2 + rad * np.array([d[1], -d[0]])
        t = np.linspace(0, 1, 201)[:, None]
        return (1 - t) ** 2 * pos[a] + 2 * (1 - t) * t * control + t ** 2 * pos[b]

    def clearance(a, b, rad):
        points = curve(a, b, rad)
        return min(np.linalg.norm(points - pos[k], axis=1).min() for k in range(8)
                   if k not in (a, b))

    for a, b in [(1, 5), (5, 1), (3, 7), (7, 3)]:
        assert clearance(a, b, 0.0) < r          # a straight arrow would cross a rank
        assert clearance(a, b, rads[a, b]) > r   # the arc goes round them
    # arc3's bulge flips with the direction of travel: the same side means opposite signs.
    assert rads[1, 5] * rads[5, 1] < 0 and rads[3, 7] * rads[7, 3] < 0


# -- heat maps ------------------------------------------------------------------------------------


def test_large_algorithm_is_a_heat_map_with_chunks_per_link():
    algorithm = ring_pipeline(40)  # 40 ranks > 32: heat maps
    figure = draw_algorithm(algorithm, options=DrawOptions(steps=(0, 2)))
    assert len(figure.axes) == 4  # three panels and the colour bar
    assert not any(arrows(axes) for axes in figure.axes)
    for axes, step in zip(figure.axes[:3], algorithm.steps[:3]):
        expected = np.zeros((40, 40), dtype=int)
        for (src, dst), count in Counter((s.src, s.dst) for s in step.sends).items():
            expected[src, dst] = count
        assert np.array_equal(heatmap(axes), expected)


def test_many_steps_are_summed_into_one_heat_map():
    algorithm = ring_pipeline(40)  # 39 steps: more than the 16 panels of one figure
    figure = draw_algorithm(algorithm)
    matrix = heatmap(figure.axes[0])
    expected = np.zeros((40, 40), dtype=int)
    for step in algorithm.steps:
        for send in step.sends:
            expected[send.src, send.dst] += 1
    assert np.array_equal(matrix, expected)
    assert matrix.sum() == algorithm.num_sends == 40 * 39


def test_many_sends_on_few_ranks_is_a_heat_map():
    n, pieces = 4, 300  # 2 steps of 2400 and 1200 sends on ring:4
    base = standard_collective("allgather", n).split(pieces)
    first = tuple(Send(pieces * r + i, r, (r + d) % n) for r in range(n) for d in (1, n - 1)
                  for i in range(pieces))
    second = tuple(Send(pieces * ((s + 1) % n) + i, s, (s - 1) % n)
                   for s in range(n) for i in range(pieces))
    algorithm = verify(Algorithm("ring4-many", ring(n), base,
                                 (Step(pieces, first), Step(pieces, second))))
    figure = draw_algorithm(algorithm)
    assert [heatmap(axes).sum() for axes in figure.axes[:2]] == [2400, 1200]
    assert heatmap(figure.axes[0])[0, 1] == pieces and heatmap(figure.axes[1])[0, 3] == pieces


def test_above_128_ranks_the_heat_map_bins_ranks():
    # ring:130: one step of the pipeline (drawing does not need a complete algorithm).
    n = 130
    step = Step(1, tuple(Send(r, r, (r + 1) % n) for r in range(n)))
    partial = Algorithm("ring130-first-step", ring(n), standard_collective("allgather", n),
                        (step,))
    axes = draw_algorithm(partial).axes[0]
    expected = np.zeros((65, 65), dtype=int)  # bins of 2 ranks: 130 / 2 = 65 a side
    for r in range(n):
        expected[r // 2, ((r + 1) % n) // 2] += 1
    assert np.array_equal(heatmap(axes), expected)
    assert "bins of 2" in axes.get_xlabel()
    with pytest.raises(DrawError, match="too many to draw as arrows"):
        draw_algorithm(Algorithm("ring300", ring(300), standard_collective("allgather", 300),
                                 (Step(1, (Send(0, 0, 1),)),)),
                       options=DrawOptions(style="arrows"))


@pytest.mark.parametrize("options, message", [
    (dict(steps=(2, 1)), "0 <= first <= last"),
    (dict(steps=(0, 1, 2)), "expected (first, last)"),
    (dict(style="pie"), "expected 'auto', 'arrows' or 'heatmap'"),
    (dict(max_panels=0), "max_panels 0"),
])
def test_bad_options_are_refused(options, message):
    with pytest.raises(DrawError, match=re.escape(message)):
        DrawOptions(**options)


# -- XML programs ---------------------------------------------------------------------------------


@pytest.fixture
def ring4_xml(tmp_path: Path) -> tuple[Algorithm, Path]:
    algorithm = ring4_allgather()
    path = tmp_path / "ring4.xml"
    path.write_text(write_program(lower(algorithm, runtime="msccl"), "msccl"))
    return algorithm, path


def test_xml_program_panels_and_arrows(ring4_xml):
    algorithm, path = ring4_xml
    figure = draw_file(path, topology=ring(4))
    # Each step's sends depend only on the step before, so the program's levels are the steps.
    expected = pairs_by_step(algorithm)
    assert len(figure.axes) == len(expected)
    for axes, pairs in zip(figure.axes, expected):
        assert sorted(arrow_pairs(axes)) == sorted(pairs)
        assert axes.get_title().startswith("level ")
    # The chunks the arrows carry add up to the chunks the XML's sends move.
    root = ElementTree.parse(path).getroot()
    cnts = [int(step.get("cnt")) for step in root.iter("step") if step.get("type") == "s"]
    assert sum(cnts) == algorithm.num_sends and max(cnts) > 1  # some messages carry 2 chunks
    traffic = program_traffic(read_program(path))
    assert sum(step.num_sends for step in traffic) == sum(cnts)


def test_xml_needs_a_topology_with_its_links(ring4_xml):
    _, path = ring4_xml
    with pytest.raises(DrawError, match="does not say its topology"):
        draw_file(path)
    with pytest.raises(DrawError, match="has ngpus=4 but topology 'ring:5' has 5 ranks"):
        draw_file(path, topology=ring(5))
    with pytest.raises(DrawError, match="sends from rank 0 to rank 3, but topology 'line:4'"):
        draw_file(path, topology=line(4))


# -- files and the command line -------------------------------------------------------------------


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def ring4_file(tmp_path: Path) -> Path:
    path = tmp_path / "ring4.json"
    save_algorithm(ring4_allgather(), path)
    return path


def test_cli_writes_png_and_svg(capsys, tmp_path, ring4_file):
    for suffix in (".png", ".svg"):
        out = tmp_path / "pictures" / f"ring4{suffix}"
        out.parent.mkdir(exist_ok=True)
        code, stdout, err = run_cli(capsys, "draw", ring4_file, "-o", out, "--steps", "1")
        assert (code, err) == (0, "")
        assert stdout.strip() == f"wrote {out}"
    assert (tmp_path / "pictures" / "ring4.png").read_bytes().startswith(b"\x89PNG")
    svg = ElementTree.parse(tmp_path / "pictures" / "ring4.svg").getroot()
    ids = {el.get("id") for el in svg.iter() if (el.get("id") or "").startswith("send ")}
    assert ids == {f"send {a}->{b}" for a, b in pairs_by_step(ring4_allgather())[1]}
    assert sorted(os.listdir(tmp_path / "pictures")) == ["ring4.png", "ring4.svg"]


def test_cli_draws_an_xml_on_a_topology(capsys, tmp_path, ring4_xml):
    _, path = ring4_xml
    out = tmp_path / "xml.png"
    code, _, err = run_cli(capsys, "draw", path, "--topology", "ring:4", "-o", out)
    assert (code, err) == (0, "") and out.stat().st_size > 0


@pytest.mark.parametrize("args, code, message", [
    (["missing.json", "-o", "out.png"], 1, "missing.json: no such file"),
    (["ring4.xml", "-o", "out.png"], 2, "does not say its topology: give --topology"),
    (["ring4.json", "-o", "out.png", "--steps", "1-2"], 2, "there are 2 steps, numbered 0-1"),
    (["ring4.json", "-o", "out.png", "--steps", "2-1"], 2, "the last step is before the first"),
    (["ring4.json", "-o", "out.gif"], 2, "expected a .png or .svg file"),
    (["ring4.json", "-o", "no/such/folder/out.png"], 1, "does not exist"),
    (["ring4.json", "-o", "out.png", "--topology", "ring:4"], 2, "carries its topology"),
    (["ring4.xml", "-o", "out.png", "--topology", "ring:5"], 1, "ngpus=4"),
])
def test_cli_bad_input_is_one_line_and_writes_nothing(capsys, tmp_path, monkeypatch, ring4_file,
                                                      ring4_xml, args, code, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "out.png").write_bytes(b"before")
    before = sorted(os.listdir(tmp_path))
    got, out, err = run_cli(capsys, "draw", *args)
    assert got == code
    assert out == "" and err.count("\n") == 1 and message in err, err
    assert sorted(os.listdir(tmp_path)) == before
    assert (tmp_path / "out.png").read_bytes() == b"before"


def test_cli_refuses_to_replace_what_is_not_a_regular_file(capsys, tmp_path, ring4_file):
    fifo = tmp_path / "pipe.png"
    os.mkfifo(fifo)
    code, _, err = run_cli(capsys, "draw", ring4_file, "-o", fifo)
    assert code == 1 and "is a FIFO; expected a regular file" in err
    assert fifo.is_fifo()


def test_save_leaves_nothing_when_writing_fails(tmp_path, monkeypatch):
    target = tmp_path / "picture.png"
    target.write_bytes(b"before")
    figure = draw_algorithm(ring4_allgather(), options=DrawOptions(steps=(0, 0)))

    def fail(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(CollsynthError, match="picture.png: cannot write: No space left"):
        save_drawing(figure, target)
    assert os.listdir(tmp_path) == ["picture.png"]
    assert target.read_bytes() == b"before"
