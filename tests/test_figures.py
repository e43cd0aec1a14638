"""Every figure the project writes is readable at the size it is stored.

Each figure is rendered as it is saved (same dpi) while the text it draws is recorded: every
piece of text is at least 9 pt, and the dpi at least 72, so no text is under 9 pixels in the
stored picture; no text runs off the figure. Drawings of schedules also have no two pieces of
text overlapping (chunk numbers, rank numbers, titles, legend). Vertical marker lines
(crossovers, knees, traced sizes) are named in their plot's legend. The notebooks' own plotting
code is read for the sizes and dpi it asks for (their figures are re-drawn by the notebook
tests).
"""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import pytest

matplotlib = pytest.importorskip("matplotlib")
from matplotlib.figure import Figure  # noqa: E402 (after the skip)
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.text import Text  # noqa: E402

from collsynth.algorithm import Algorithm, Send, Step, verify  # noqa: E402
from collsynth.algorithm.fileformat import save_algorithm  # noqa: E402
from collsynth.collective import standard_collective  # noqa: E402
from collsynth.draw import DrawOptions, draw_algorithm, draw_program  # noqa: E402
from collsynth.export.lower import lower  # noqa: E402
from collsynth.topology import get_topology  # noqa: E402
from collsynth.topology.families import fully_connected, ring  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
#: The smallest text, in points, and the lowest resolution a figure may be stored at: 9 pt at
#: 72 dpi or more is 9 pixels or more.
MIN_POINTS = 9
MIN_DPI = 72


# -- rendering and measuring ----------------------------------------------------------------------


def _drawn_texts(figure: Figure, dpi: float) -> list[tuple[Text, object]]:
    """The texts (non-empty, visible) drawn when ``figure`` is rendered at ``dpi``, each with
    its extent in the picture's pixels."""
    drawn: dict[int, tuple[Text, object]] = {}  # a layout pass draws once before the picture
    original = Text.draw

    def draw(self, renderer):
        result = original(self, renderer)
        if self.get_visible() and self.get_text().strip():
            drawn[id(self)] = (self, self.get_window_extent(renderer))
        return result

    with mock.patch.object(Text, "draw", draw):
        figure.savefig(io.BytesIO(), format="png", dpi=dpi)
    return list(drawn.values())


def _problems(figure: Figure, dpi: float, *, no_overlap: bool) -> list[str]:
    boxes = _drawn_texts(figure, dpi)
    assert boxes, "the figure draws no text"
    width, height = figure.get_size_inches() * dpi
    found = []
    if dpi < MIN_DPI:
        found.append(f"stored at {dpi} dpi")
    for text, box in boxes:
        if text.get_fontsize() < MIN_POINTS:
            found.append(f"{text.get_text()!r} at {text.get_fontsize()} pt")
        if box.x0 < -1 or box.y0 < -1 or box.x1 > width + 1 or box.y1 > height + 1:
            found.append(f"{text.get_text()!r} runs off the figure")
    if no_overlap:
        for i, (first, a) in enumerate(boxes):
            for second, b in boxes[i + 1:]:
                if a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1:
                    found.append(f"{first.get_text()!r} overlaps {second.get_text()!r}")
    return found


class _Saved:
    """Every figure saved while active, with the dpi it was saved at."""

    def __init__(self):
        self.figures: list[tuple[Figure, float]] = []

    def __enter__(self):
        original = Figure.savefig
        saved = self.figures

        def savefig(figure, *args, **kwargs):
            dpi = kwargs.get("dpi", matplotlib.rcParams["savefig.dpi"])
            saved.append((figure, figure.dpi if dpi in (None, "figure") else float(dpi)))
            return original(figure, *args, **kwargs)

        self._patch = mock.patch.object(Figure, "savefig", savefig)
        self._patch.start()
        return self

    def __exit__(self, *exc):
        self._patch.stop()


def _vertical_lines(axes) -> list[Line2D]:
    """The lines ``axvline`` drew (constant x, spanning the axes)."""
    return [line for line in axes.lines
            if line.get_transform() == axes.get_xaxis_transform()
            and len(set(line.get_xdata())) == 1]


def _assert_vertical_lines_in_legend(figure: Figure) -> int:
    """Every axes with vertical marker lines names them in its legend; returns how many axes
    had some."""
    marked = 0
    for axes in figure.axes:
        lines = _vertical_lines(axes)
        if not lines:
            continue
        marked += 1
        legend = axes.get_legend()
        assert legend is not None, f"{axes.get_title()!r}: vertical lines and no legend"
        entries = {t.get_text() for t in legend.get_texts()}
        named = {line.get_label() for line in lines} & entries
        assert named, f"{axes.get_title()!r}: its vertical lines are not in the legend {entries}"
    return marked


# -- drawings of schedules --------------------------------------------------------------------------


def recursive_doubling_allgather() -> Algorithm:
    """fully-connected:8 allgather by recursive doubling: in step k rank r sends the 2^k chunks
    it holds (those of its block of 2^k ranks) to r xor 2^k, in 2^k rounds. Every arrow of
    steps 1 and 2 carries several chunks, and the four diameters of step 2 all cross the
    centre: their chunk numbers cannot all sit at the arrows' midpoints."""
    n = 8
    steps = []
    for k in range(3):
        size = 1 << k
        sends = tuple(Send(c, r, r ^ size) for r in range(n)
                      for c in range(r & ~(size - 1), (r & ~(size - 1)) + size))
        steps.append(Step(size, sends))
    return verify(Algorithm("doubling", fully_connected(8), standard_collective("allgather", 8),
                            tuple(steps)))


def ring_both_ways() -> Algorithm:
    """ring:8 allgather: every chunk goes both ways round, one hop a step (4 steps); in step t
    rank r passes on chunks r - t (clockwise) and r + t (counter-clockwise), 1 round each."""
    n = 8
    steps = []
    for t in range(4):
        sends = [Send((r - t) % n, r, (r + 1) % n) for r in range(n)]
        if t < 3:
            sends += [Send((r + t) % n, r, (r - 1) % n) for r in range(n)]
        steps.append(Step(1, tuple(sends)))
    return verify(Algorithm("both-ways", ring(8), standard_collective("allgather", 8),
                            tuple(steps)))


def test_the_doubling_allgather_is_what_its_docstring_says():
    algorithm = recursive_doubling_allgather()
    assert [len(step.sends) for step in algorithm.steps] == [8, 16, 32]
    assert sorted({(s.src, s.dst) for s in algorithm.steps[2].sends}) == \
        sorted((r, r ^ 4) for r in range(8))


@pytest.mark.parametrize("make", [recursive_doubling_allgather, ring_both_ways])
@pytest.mark.parametrize("dpi", [72, 100])
def test_arrow_drawings_are_legible(make, dpi):
    figure = draw_algorithm(make())
    assert _problems(figure, dpi, no_overlap=True) == []


def test_chunk_numbers_stay_where_there_is_room():
    """Step 2 of the doubling allgather: 8 arrows of 4 chunks each, 4 of them through the
    centre; some numbers are drawn, and none overlaps another (checked above)."""
    figure = draw_algorithm(recursive_doubling_allgather(), options=DrawOptions(steps=(2, 2)))
    labels = [t for t in figure.axes[0].texts if "," in t.get_text()]
    assert 1 <= len(labels) <= 8
    assert _problems(figure, 100, no_overlap=True) == []


def test_dgx1_drawing_is_legible():
    """A DGX-1 schedule (the solver's 2-step allgather, lowered to an MSCCL program) on the two
    quads with their long arcs."""
    dgx1 = get_topology("dgx1")
    figure = draw_program(lower(_dgx1_allgather(dgx1), runtime="msccl"), dgx1)
    assert _problems(figure, 100, no_overlap=True) == []


def _dgx1_allgather(dgx1) -> Algorithm:
    from collsynth.synthesis import SolveOptions, solve_instance
    from collsynth.synthesis.instance import Instance

    result = solve_instance(dgx1, standard_collective("allgather", 8),
                            Instance(steps=2, rounds=3, chunks=2),
                            options=SolveOptions(time_limit=60))
    assert result.algorithm is not None
    return result.algorithm


def test_heat_maps_are_legible():
    from collsynth.resolve import resolve_topology
    from collsynth.synthesis.bandwidth_optimal import solve_bandwidth_optimal

    cluster = resolve_topology("dgx-a100", nodes=4)
    trees = solve_bandwidth_optimal(cluster, standard_collective("allgather", 32)).algorithm
    for options in (DrawOptions(style="heatmap", aggregate=True),
                    DrawOptions(style="heatmap", steps=(0, 1))):
        assert _problems(draw_algorithm(trees, options=options), 100, no_overlap=True) == []


def test_the_cli_draws_at_a_legible_size(tmp_path):
    from collsynth.cli import main

    path = tmp_path / "ring.json"
    save_algorithm(ring_both_ways(), path)
    with _Saved() as saved:
        assert main(["draw", str(path), "-o", str(tmp_path / "ring.png")]) == 0
    (figure, dpi), = saved.figures
    assert _problems(figure, dpi, no_overlap=True) == []


# -- plots ------------------------------------------------------------------------------------------


def _two_ring_algorithms(tmp_path) -> list[str]:
    """Two ring:8 allgathers whose times cross: the both-ways one (4 steps, 4 rounds per chunk)
    and one that sends half of every chunk each way round all the way (7 steps of 1 round,
    2 pieces per chunk: 7/2 rounds per chunk), faster for large sizes."""
    n = 8
    halves = verify(Algorithm(
        "halves", ring(n), standard_collective("allgather", n).split(2),
        tuple(Step(1, tuple(send for r in range(n) for send in (
            Send(2 * ((r - t) % n), r, (r + 1) % n),
            Send(2 * ((r + t) % n) + 1, r, (r - 1) % n)))) for t in range(n - 1))))
    files = []
    for algorithm in (halves, ring_both_ways()):
        path = tmp_path / f"{algorithm.name}.json"
        save_algorithm(algorithm, path)
        files.append(str(path))
    return files


def test_time_plot_is_legible_and_names_its_crossovers(tmp_path):
    from collsynth.cli import main

    files = _two_ring_algorithms(tmp_path)
    with _Saved() as saved:
        assert main(["plot", *files, "--unit-gbps", "25", "--alpha-us", "5",
                     "-o", str(tmp_path / "p.png")]) == 0
    (figure, dpi), = saved.figures
    assert _problems(figure, dpi, no_overlap=False) == []
    assert _assert_vertical_lines_in_legend(figure) == 1


def test_fit_plot_is_legible_and_names_its_knees():
    from collsynth.timing.fit import fit_log, plot_fits, save_figure
    from collsynth.timing.logs import load_log

    log = load_log(ROOT / "data" / "nccl-tests" / "A100-8gpu_all_gather_superbench.txt")
    with _Saved() as saved:
        save_figure(plot_fits(fit_log(log)), io.BytesIO(), format="png")
    (figure, dpi), = saved.figures
    assert _problems(figure, dpi, no_overlap=False) == []
    assert _assert_vertical_lines_in_legend(figure) == 2


def test_bench_plot_is_legible():
    from collsynth.plan.bench import plot_bench

    sizes = [1 << k for k in range(10, 31, 2)]
    rows = tuple(SimpleNamespace(size_bytes=s, default_us=5 + s / 2e4, xml_us=4 + s / 2.2e4)
                 for s in sizes)
    setup = SimpleNamespace(program=SimpleNamespace(name="allgather-ring", collective="allgather",
                                                    ranks=8),
                            options=SimpleNamespace(runtime="rccl"))
    from collsynth.plan.bench import BenchPrediction
    from collsynth.timing.pricing import Price

    def prices(name, times):
        return tuple(Price(name, s, t, s / t / 1e3, s / t / 1e3, "program-model")
                     for s, t in zip(sizes, times))

    result = SimpleNamespace(sizes=rows, predicted=BenchPrediction(
        "program-model", "rccl constants (documented)",
        prices("allgather-ring", [6 + s / 2.1e4 for s in sizes]),
        prices("rccl-ring", [7 + s / 2.0e4 for s in sizes])))
    figure = plot_bench(setup, result)
    assert _problems(figure, 100, no_overlap=False) == []


def test_plan_plots_are_legible_and_name_their_lines(tmp_path):
    from collsynth.plan import FrontCache, PlanOptions, SynthOptions, make_plan, write_plan
    from collsynth.resolve import resolve_topology

    topology = resolve_topology(str(ROOT / "tests" / "plan" / "data" / "fc4-fast.json"))
    options = PlanOptions(synth=SynthOptions(time_limit=20, max_chunks=2),
                          cache=FrontCache(tmp_path / "cache"))
    plan = make_plan(ROOT / "tests" / "fixtures" / "traces" / "fc4-mixed", topology,
                     options=options)
    with _Saved() as saved:
        write_plan(plan, tmp_path / "plan")
    assert saved.figures
    marked = 0
    for figure, dpi in saved.figures:
        assert _problems(figure, dpi, no_overlap=False) == []
        marked += _assert_vertical_lines_in_legend(figure)
    assert marked >= 1


# -- notebooks --------------------------------------------------------------------------------------

_NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
_SIZE = re.compile(r"\b(?:fontsize|labelsize|title_fontsize)\s*=\s*(\d+(?:\.\d+)?)")
_DPI = re.compile(r"\bdpi\s*=\s*(\d+)")


def _code(path: Path) -> str:
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    return "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")


@pytest.mark.parametrize("path", _NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_figures_ask_for_legible_text(path):
    code = _code(path)
    small = [m.group(0) for m in _SIZE.finditer(code) if float(m.group(1)) < MIN_POINTS]
    assert not small, f"{path.name}: text under {MIN_POINTS} pt: {small}"
    low = [m.group(0) for m in _DPI.finditer(code) if int(m.group(1)) < MIN_DPI]
    assert not low, f"{path.name}: figures stored under {MIN_DPI} dpi: {low}"
    for call in re.finditer(r"\baxvline\((.*?)\)\s*$", code, re.M | re.S):
        assert "label=" in call.group(1), f"{path.name}: a vertical line with no legend entry"
