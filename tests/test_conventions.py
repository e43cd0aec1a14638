"""Each convention has one definition, and the models agree where they must coincide.

(a) The source is read with ``ast``: every name below is defined (``def``, ``class`` or a
module-level assignment) exactly once in the package, so two copies cannot drift apart again.
(b) A table of uniform cases (a ring algorithm on a ring of single-unit links; chunks that fit
one slice; no reductions charged) where the closed form and the program model, both through the
pricing interface, describe the same schedule: their times differ exactly by the program model's
base latency. The expected values are worked out by hand in the table,
``k x (alpha + chunk x beta)``.
(c) The bus bandwidth of each collective agrees among the kinds registry, both models' prices,
the log reader and :func:`collsynth.timing.metrics.busbw_gbps`.
"""

from __future__ import annotations

import ast
from fractions import Fraction
from pathlib import Path

import pytest

from collsynth.algorithm import Algorithm, Send, Step, verify
from collsynth.collective import allgather, allreduce, reduce_scatter
from collsynth.collective.kinds import busbw_factor
from collsynth.runtimes import PROTOCOLS, get_runtime
from collsynth.timing.closed_form import ClosedForm
from collsynth.timing.logs import parse_log
from collsynth.timing.metrics import busbw_gbps
from collsynth.timing.program_model import ProgramModel
from collsynth.timing.runtime_baselines import ring_program
from collsynth.topology import get_topology
from collsynth.topology.builtins import with_figures

ROOT = Path(__file__).resolve().parents[1]

#: Names that must be defined exactly once in collsynth/ (conventions and the values that carry
#: them). A second ``def busbw_factor`` anywhere fails this test, whatever it returns.
ONE_DEFINITION = (
    "busbw_factor", "buffer_chunks", "base_chunk_bytes", "canonical_name",   # collective kinds
    "ring_steps",                                                            # the runtime's ring
    "algbw_gbps", "busbw_gbps", "gmae",                                      # reported figures
    "PROTOCOLS", "check_protocol", "PROTOCOL_EFFICIENCY", "NCCL_STEPS",      # protocols
    "NCCL_BASE_LATENCY_US", "NCCL_HOP_LATENCY_US", "RCCL_BASE_LATENCY_US",   # runtime latencies
    "RCCL_HOP_LATENCY_US",
    "runtime_names", "get_runtime", "Runtime", "RuntimeConstants", "XmlDialect",  # registry
    "check_channels",
    "exact_fraction", "as_fraction", "sympy_rational", "fraction_text",      # exact numbers
    "Deadline",                                                              # time limits
    "crossover", "lower_envelope", "price_table",                            # one pricing
    "Price", "PricingModel", "RuntimeAlgorithm", "runtime_algorithms",
    "fastest_runtime_algorithm", "ring_channels", "nccl_choices",
)


#: Methods that share a convention's name but are another thing (module.Class.method: why).
OTHER_MEANINGS = {
    "collsynth.export.layout.Layout.buffer_chunks": "a rank's XML buffer in program chunks",
    "collsynth.timing.calibration.CalibrationEntry.busbw_gbps": "the fitted bandwidth, a figure",
}

_DEFS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def definitions(root: Path) -> dict[str, list[str]]:
    """Name -> where it is defined: functions, classes and module-level assignments
    (``PROTOCOLS = ...``, ``X: T = ...``) of every module, and methods of its classes unless
    they only delegate (their body uses the name they carry, as a ``busbw_factor`` property
    calling :func:`~collsynth.collective.kinds.busbw_factor` does)."""
    found: dict[str, list[str]] = {}
    for path in sorted((root / "collsynth").rglob("*.py")):
        module = ".".join(path.relative_to(root).with_suffix("").parts)
        tree = ast.parse(path.read_text(encoding="utf-8"))
        places: list[tuple[str, str]] = []

        def visit(body: list[ast.stmt], prefix: str, in_class: bool) -> None:
            for node in body:
                if isinstance(node, _DEFS):
                    where = f"{prefix}.{node.name}"
                    uses = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
                    delegates = in_class and not isinstance(node, ast.ClassDef) and \
                        node.name in uses
                    if not delegates and where not in OTHER_MEANINGS:
                        places.append((node.name, where if in_class else module))
                    visit(node.body, where, isinstance(node, ast.ClassDef))
                elif prefix == module and isinstance(node, ast.Assign):
                    places.extend((t.id, module) for t in node.targets if isinstance(t, ast.Name))
                elif prefix == module and isinstance(node, ast.AnnAssign) and \
                        isinstance(node.target, ast.Name):
                    places.append((node.target.id, module))

        visit(tree.body, module, False)
        for name, where in places:
            found.setdefault(name, []).append(where)
    return found


@pytest.mark.parametrize("name", ONE_DEFINITION)
def test_each_convention_has_one_definition(name):
    where = definitions(ROOT).get(name, [])
    assert len(where) == 1, f"{name} is defined {len(where)} times: {', '.join(where) or 'never'}"


def test_the_check_sees_a_second_definition(tmp_path):
    package = tmp_path / "collsynth"
    package.mkdir()
    (package / "a.py").write_text("def busbw_factor(name, n):\n    return 1\n")
    (package / "b.py").write_text("class C:\n    def busbw_factor(self):\n        return 1.0\n"
                                  "PROTOCOLS = ('Simple', 'LL')\n")
    (package / "c.py").write_text("PROTOCOLS: tuple = ('LL',)\nfrom collsynth.a import busbw_factor\n"
                                  "class D:\n    def busbw_factor(self):\n"
                                  "        return busbw_factor('x', 2)\n")
    found = definitions(tmp_path)
    assert found["busbw_factor"] == ["collsynth.a", "collsynth.b.C.busbw_factor"]  # D delegates
    assert found["PROTOCOLS"] == ["collsynth.b", "collsynth.c"]


# -- (b) the closed form and the program model on uniform cases ---------------------------------


def ring_algorithm(topology, collective: str, ring: tuple[int, ...]) -> Algorithm:
    """The ring algorithm of ``collective`` along ``ring``: one chunk per rank and step, every
    rank sending to the next one (reduce-scatter then allgather for allreduce)."""
    n = len(ring)
    steps = []
    if collective == "allgather":
        coll = allgather(n)
        steps = [Step(1, tuple(Send(ring[(p - t) % n], ring[p], ring[(p + 1) % n])
                               for p in range(n))) for t in range(n - 1)]
    elif collective == "reduce_scatter":
        coll = reduce_scatter(n)
        steps = [Step(1, tuple(Send(ring[(p - t - 1) % n], ring[p], ring[(p + 1) % n], reduce=True)
                               for p in range(n))) for t in range(n - 1)]
    else:
        coll = allreduce(n).split(n)
        steps = [Step(1, tuple(Send((p - t - 1) % n, ring[p], ring[(p + 1) % n], reduce=True)
                               for p in range(n))) for t in range(n - 1)]
        steps += [Step(1, tuple(Send((p - t) % n, ring[p], ring[(p + 1) % n])
                                for p in range(n))) for t in range(n - 1)]
    return verify(Algorithm(f"ring-{collective}", topology, coll, tuple(steps)))


RING4 = with_figures(get_topology("ring:4"), unit_gbps=10.0, alpha_us=2.0)
#: DGX-1's links of one unit form one Hamiltonian cycle (the others have two).
DGX1_SINGLE = (0, 2, 1, 5, 6, 4, 7, 3)

# DGX-1 with its NVLinks at NCCL's sustained 20 GB/s: the program model prices every NVLink at
# that figure whatever the nominal rate (docs/runtime-model.md, "Sustained NVLink"), the closed
# form at the topology's unit_gbps, so the two price the same links only when they are equal.
DGX1_20 = with_figures(get_topology("dgx1"), unit_gbps=20.0, alpha_us=0.7)

# (topology, ring, collective, size_bytes, expected us without the base latency, the last
# receiver's pass). By hand: k steps of alpha plus one base-chunk piece (size / n) over one
# unit: k (alpha + size/n x beta). The program model adds one thing the alpha-beta form does
# not count: in Simple the last receiver (r, rrc) copies its last slice out of its FIFO once it
# is all in, at the link's rate: g x beta, with g the slice. Every chunk here is at most
# 32_768 bytes, Simple's slice floor (1/32 of NCCL's 1 MiB slice), so it moves as one slice
# (g = min(C, max(C / 2, 32_768)) = C) and nothing pipelines: the program model is
# base + k (alpha + C beta) + C beta. (A larger chunk is cut in two slices and a ring's
# forwards pipeline them: in ring:4's 2^18-byte allgather, C = 65_536, each rank's forward
# waits for its own send (C beta = 6.5536 us), by which time the first half of the chunk has
# arrived (3.2768 + 2), so only the last hop shows: 3 C beta + alpha + (C / 2) beta =
# 24.9376 us in the program model against the closed form's 25.6608.)
# ring:4: alpha 2 us, 10 GB/s = 1e4 bytes/us; DGX-1: alpha 0.7 us, 20 GB/s = 2e4 bytes/us.
UNIFORM = [
    (RING4, (0, 1, 2, 3), "allgather", 4000, 3 * (2 + 1000 / 1e4), 1000 / 1e4),     # 6.3 + 0.1
    (RING4, (0, 1, 2, 3), "reduce_scatter", 4000, 3 * (2 + 1000 / 1e4), 1000 / 1e4),
    (RING4, (0, 1, 2, 3), "allreduce", 4000, 6 * (2 + 1000 / 1e4), 1000 / 1e4),     # 12.6 + 0.1
    (RING4, (0, 1, 2, 3), "allgather", 1 << 17, 3 * (2 + 32768 / 1e4),
     32768 / 1e4),                                                           # 15.8304 + 3.2768
    (DGX1_20, DGX1_SINGLE, "allgather", 4000, 7 * (0.7 + 500 / 2e4), 500 / 2e4),  # 5.075 + 0.025
    (DGX1_20, DGX1_SINGLE, "reduce_scatter", 1 << 18, 7 * (0.7 + 32768 / 2e4), 32768 / 2e4),
    (DGX1_20, DGX1_SINGLE, "allreduce", 1 << 18, 14 * (0.7 + 32768 / 2e4), 32768 / 2e4),
]
BASE_US = 5.0


@pytest.mark.parametrize("topology, ring, collective, size, expected, last_pass", UNIFORM,
                         ids=[f"{c[0].name}-{c[2]}-{c[3]}" for c in UNIFORM])
def test_closed_form_and_program_model_agree_on_uniform_cases(topology, ring, collective, size,
                                                              expected, last_pass):
    algorithm = ring_algorithm(topology, collective, ring)
    (closed,) = ClosedForm().price(algorithm, [size])
    constants = get_runtime("nccl").defaults.replace(
        base_latency_us={p: BASE_US for p in PROTOCOLS},
        hop_latency_us={k: {p: topology.alpha_us for p in PROTOCOLS}
                        for k in ("intra", "network")})
    model = ProgramModel(constants, topology=topology)
    (program,) = model.price(ring_program(collective, [ring]), [size])
    assert closed.time_us == pytest.approx(expected, rel=1e-12)
    # The program model: the closed form plus the base, plus the last receiver's copy of its
    # last slice out of its FIFO (which the alpha-beta form does not count).
    assert program.time_us == pytest.approx(BASE_US + expected + last_pass, rel=1e-12)
    # nccl-tests' bus bandwidth of each: algbw x the kind's factor.
    factor = float(busbw_factor(collective, len(ring)))
    for price in (closed, program):
        assert price.algbw_gbps == pytest.approx(size / price.time_us / 1e3)
        assert price.busbw_gbps == pytest.approx(price.algbw_gbps * factor)


# -- (c) bus bandwidth agrees everywhere -------------------------------------------------------

BUSBW = [("allreduce", 8, Fraction(7, 4)), ("allgather", 8, Fraction(7, 8)),
         ("reduce_scatter", 4, Fraction(3, 4)), ("alltoall", 8, Fraction(7, 8)),
         ("broadcast", 8, Fraction(1)), ("reduce", 8, Fraction(1)), ("sendrecv", 2, Fraction(1))]


@pytest.mark.parametrize("collective, n, factor", BUSBW, ids=[b[0] for b in BUSBW])
def test_bus_bandwidth_agrees_among_kinds_metrics_and_the_log_reader(collective, n, factor):
    # nccl-tests: allreduce 2(n-1)/n, the allgather-like (n-1)/n, rooted ones and sendrecv 1.
    assert busbw_factor(collective, n) == factor
    assert busbw_gbps(collective, n, 10**9, 10**4) == pytest.approx(100.0 * float(factor))
    if collective != "sendrecv":  # a log of a collective collsynth reads
        half = "{t:8.1f} {alg:6.2f} {bus:6.2f} 0"
        text = "".join(f"{s:>12} {s // 4:>12} float sum -1 " + " ".join(
                           [half.format(t=t, alg=s / t / 1e3, bus=s / t / 1e3 * float(factor))] * 2)
                       + "\n" for s, t in ((1 << 20, 100.0), (1 << 22, 300.0)))
        log = parse_log(text, name=f"{collective}_perf.txt", collective=collective, ranks=n)
        assert log.busbw_per_algbw == pytest.approx(float(factor))


@pytest.mark.parametrize("collective, n", [("allgather", 4), ("reduce_scatter", 4),
                                           ("allreduce", 4)])
def test_bus_bandwidth_of_the_program_model_is_the_kinds(collective, n):
    from collsynth.timing.runtime_model import simulate_program

    topology = with_figures(get_topology("ring:4"), unit_gbps=10.0, alpha_us=2.0)
    t = simulate_program(ring_program(collective, [tuple(range(n))]), topology, 1 << 20,
                         get_runtime("nccl").defaults)
    assert t.busbw_gbps == pytest.approx(t.algbw_gbps * float(busbw_factor(collective, n)))


# -- (d) typed interfaces, public names -------------------------------------------------------


def public_signatures_typed_any(root: Path) -> list[str]:
    """``module:line name: annotation`` for each parameter or return of a public function or
    method of ``collsynth/timing`` annotated with ``Any``."""
    found = []
    for path in sorted((root / "collsynth" / "timing").glob("*.py")):
        if path.name.startswith("_") and path.name != "__init__.py":
            continue

        def visit(body: list[ast.stmt], prefix: str) -> None:
            for node in body:
                if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                    visit(node.body, f"{prefix}{node.name}.")
                elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and \
                        not node.name.startswith("_"):
                    args = node.args
                    annotations = [a.annotation for a in (*args.posonlyargs, *args.args,
                                                          *args.kwonlyargs, args.vararg,
                                                          args.kwarg) if a is not None]
                    for annotation in [*annotations, node.returns]:
                        text = "" if annotation is None else ast.unparse(annotation)
                        if "Any" in text.replace("'", " ").replace('"', " ").replace(
                                "[", " ").replace("]", " ").replace("|", " ").replace(
                                ",", " ").split():
                            found.append(f"{path.name}:{node.lineno} {prefix}{node.name}: "
                                         f"{text}")

        visit(ast.parse(path.read_text(encoding="utf-8")).body, "")
    return found


def test_no_public_timing_signature_is_typed_any():
    found = public_signatures_typed_any(ROOT)
    assert not found, "; ".join(found)


def private_imports(root: Path) -> list[str]:
    """``module imports other._name`` for each private name imported from another module of
    the package (private modules such as ``collsynth._parse`` are the package's own layer and
    may be imported; their names without ``_`` are their interface)."""
    found = []
    for path in sorted((root / "collsynth").rglob("*.py")):
        module = ".".join(path.relative_to(root).with_suffix("").parts)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and \
                    node.module.startswith("collsynth") and node.module != module:
                found += [f"{module} imports {node.module}.{alias.name}" for alias in node.names
                          if alias.name.startswith("_") and not alias.name.startswith("__")]
    return found


def test_no_private_name_is_imported_across_modules():
    found = private_imports(ROOT)
    assert not found, "; ".join(found)


def test_the_type_and_import_checks_see_offenders(tmp_path):
    timing = tmp_path / "collsynth" / "timing"
    timing.mkdir(parents=True)
    (timing / "m.py").write_text("from typing import Any\n"
                                 "def f(x: Any) -> int:\n    return 1\n"
                                 "def _g(x: Any) -> Any:\n    return x\n"
                                 "class C:\n    def h(self) -> dict[str, Any]:\n        return {}\n")
    (timing / "n.py").write_text("from collsynth.timing.m import _g, f\n")
    assert [f.split(" ")[1] for f in public_signatures_typed_any(tmp_path)] == ["f:", "C.h:"]
    assert private_imports(tmp_path) == ["collsynth.timing.n imports collsynth.timing.m._g"]


#: Where catching every CollsynthError is the point: the CLI's one map from errors to exit
#: codes.
CATCH_ALL_ALLOWED = ("collsynth.cli.__init__",)


def broad_catches(root: Path) -> list[str]:
    """``module:line`` of each ``except CollsynthError`` (alone or in a tuple) whose handler
    does not raise: a default returned for any error at all, a bug read as 'no result'."""
    found = []
    for path in sorted((root / "collsynth").rglob("*.py")):
        module = ".".join(path.relative_to(root).with_suffix("").parts)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.ExceptHandler) or node.type is None:
                continue
            names = node.type.elts if isinstance(node.type, ast.Tuple) else [node.type]
            broad = any(isinstance(n, ast.Name) and n.id == "CollsynthError" for n in names)
            raises = any(isinstance(n, ast.Raise) for stmt in node.body for n in ast.walk(stmt))
            if broad and not raises and module not in CATCH_ALL_ALLOWED:
                found.append(f"{module}:{node.lineno}")
    return found


def test_no_catch_all_returns_a_default():
    found = broad_catches(ROOT)
    assert not found, "except CollsynthError without a raise: " + ", ".join(found)


def test_the_catch_all_check_sees_one(tmp_path):
    package = tmp_path / "collsynth"
    package.mkdir()
    (package / "a.py").write_text(
        "def f():\n    try:\n        g()\n    except CollsynthError:\n        return []\n"
        "def h():\n    try:\n        g()\n    except (ValueError, CollsynthError) as e:\n"
        "        raise KeyError from e\n")
    assert broad_catches(tmp_path) == ["collsynth.a:4"]
