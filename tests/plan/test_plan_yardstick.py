"""One yardstick: with physical figures, a plan prices both sides with the program model.

Expected values come from the simulator run separately: the runtime's ring through
the program model's price of it called here, the synthesized side by reading the written XML back from disk
and simulating it, so a plan that priced anything else (the closed form, another layout than
the one it wrote, other constants) fails.
"""

from __future__ import annotations

import json

import pytest

from collsynth.export.xml_reader import read_checked, read_text
from collsynth.plan import NCCL, plan_calls, write_plan
from collsynth.plan.groups import topology_for_group
from collsynth.runtimes import PROTOCOLS, get_runtime
from collsynth.timing.closed_form import ClosedForm
from collsynth.timing.pricing import RuntimeAlgorithm
from collsynth.timing.program_model import ProgramModel
from collsynth.timing.runtime_model import prepare_program, simulate_program
from collsynth.topology import get_topology

GROUP = (0, 1, 2, 3)
CLOSED_FORM, PROGRAM_MODEL = ClosedForm.name, ProgramModel.name


def baseline_rows(collective, topology, sizes, constants, algorithm="ring"):
    """The runtime's own ``algorithm`` by the program model, with ``constants``."""
    subject = RuntimeAlgorithm(get_runtime(constants.runtime), algorithm, collective, topology)
    return ProgramModel(constants).price(subject, sizes)
SIZES = {"allgather": (4096, 1 << 20, 16 << 20), "allreduce": (4096, 1 << 20),
         "reduce_scatter": (1 << 16,)}


@pytest.fixture(scope="module")
def yard_plan(tmp_path_factory, fast, options, run_of, traced):
    calls = [traced(kind, size, GROUP) for kind, sizes in SIZES.items() for size in sizes]
    calls += [traced("alltoall", 4096, GROUP), traced("broadcast", 4096, GROUP, root=0)]
    plan = plan_calls(run_of(4, calls), fast, options=options())
    target = write_plan(plan, tmp_path_factory.mktemp("plans") / "yard", plots=False)
    return plan, target, fast


def _entries(plan):
    return {e.collective: e for e in plan.entries}


def test_ring_collectives_are_priced_by_the_program_model(yard_plan):
    plan, target, _ = yard_plan
    entries = _entries(plan)
    for kind in SIZES:
        assert entries[kind].yardstick == PROGRAM_MODEL
        assert all(c.yardstick == PROGRAM_MODEL for c in entries[kind].candidates
                   if c.name not in entries[kind].excluded)
    # alltoall: NCCL's grouped send/recv is a program the model prices (nccl-p2p)
    assert entries["alltoall"].yardstick == PROGRAM_MODEL
    assert [c.name for c in entries["alltoall"].candidates if c.source == NCCL] == ["nccl-p2p"]
    # broadcast: NCCL's chain along its ring is a program the model prices too (nccl-ring)
    assert entries["broadcast"].yardstick == PROGRAM_MODEL
    assert [c.name for c in entries["broadcast"].candidates if c.source == NCCL] == ["nccl-ring"]
    obj = json.loads((target / "plan.json").read_text())
    yardsticks = {e["collective"]: e["yardstick"] for e in obj["entries"]}
    assert yardsticks == {"allgather": PROGRAM_MODEL, "allreduce": PROGRAM_MODEL,
                          "reduce_scatter": PROGRAM_MODEL, "alltoall": PROGRAM_MODEL,
                          "broadcast": PROGRAM_MODEL}
    report = (target / "report.md").read_text()
    assert "Priced by: program-model." in report and "Priced by: closed-form (" not in report


def test_the_nccl_row_is_the_runtime_ring_simulated(yard_plan):
    plan, _, fast = yard_plan
    constants = get_runtime(plan.runtime).defaults
    group_topology = topology_for_group(fast, GROUP)
    for kind, sizes in SIZES.items():
        entry = _entries(plan)[kind]
        expected = [r.time_us for r in baseline_rows(kind, group_topology, sizes, constants)]
        if kind == "allreduce":   # NCCL runs the faster of its ring and its tree at each size
            trees = baseline_rows(kind, group_topology, sizes, constants, algorithm="tree")
            expected = [min(ring, tree.time_us) for ring, tree in zip(expected, trees)]
        names = sorted(c.name for c in entry.candidates if c.source == NCCL)
        assert names == (["nccl-ring", "nccl-tree"] if kind == "allreduce" else ["nccl-ring"])
        for size, time_us in zip(sizes, expected):
            assert entry.nccl_us(size) == time_us
            assert entry.predict(size, 4)[0] == time_us


def test_the_program_row_is_the_written_xml_simulated(yard_plan):
    plan, target, fast = yard_plan
    constants = get_runtime(plan.runtime).defaults
    group_topology = topology_for_group(fast, GROUP)
    checked = 0
    for kind, sizes in SIZES.items():
        entry = _entries(plan)[kind]
        for size in sizes:
            _, planned, choice, fallback = entry.predict(size, 4)
            if choice == NCCL:
                continue
            assert not fallback
            r = next(r for r in entry.ranges if r.contains(size))
            program, problems = read_checked(read_text(target / "xml" / r.xml), plan.runtime)
            assert program is not None and not problems
            # The file runs the tuned layout the range names, at the protocol it names.
            channels, _, _, protocol = r.variant.replace("ch/", " ").split()
            assert program.proto == protocol and program.nchannels <= int(channels)
            simulated = simulate_program(prepare_program(program, group_topology), None, size,
                                         constants)
            assert planned == pytest.approx(simulated.time_us, rel=1e-9)
            checked += 1
    assert checked >= 3  # the fast topology gives synthesized programs some traced sizes


def test_no_prediction_below_the_runtime_base_latency(yard_plan):
    plan, _, _ = yard_plan
    constants = get_runtime(plan.runtime).defaults
    floor = min(constants.base_latency(p) for p in PROTOCOLS)
    for kind, sizes in SIZES.items():
        entry = _entries(plan)[kind]
        for c in entry.candidates:
            for s in c.samples:
                assert s.time_us >= constants.base_latency(s.protocol)
        for size in sizes:
            nccl, planned, _, _ = entry.predict(size, 4)
            assert nccl >= floor and planned >= floor
        for bucket in entry.buckets:
            assert bucket.plan_us >= floor * bucket.calls


def test_no_program_slower_than_nccl_is_picked(yard_plan):
    # NCCL runs the faster of its candidates (ring, and for allreduce its tree) at each size.
    plan, _, _ = yard_plan
    for kind in SIZES:
        entry = _entries(plan)[kind]
        runtime = [c for c in entry.candidates if c.source == NCCL]
        assert len(runtime) == (2 if kind == "allreduce" else 1)

        def nccl_at(size):
            return min(c.time_at(size) for c in runtime)

        picked = 0
        for c in entry.candidates:
            if c.source == NCCL or c.name in entry.excluded:
                continue
            for s in c.samples:
                r = next(r for r in entry.ranges if r.contains(s.size_bytes))
                if r.winner == c.name:
                    assert s.time_us < nccl_at(s.size_bytes)
                    picked += 1
                if s.time_us >= nccl_at(s.size_bytes):
                    assert r.winner != c.name and r.choice != c.name
        for size in SIZES[kind]:
            nccl_us, planned, _, _ = entry.predict(size, 4)
            assert planned <= nccl_us
            # The fastest selectable candidate at a traced size is the one that runs.
            best = min(float(c.time_at(size)) for c in entry.candidates
                       if c.name not in entry.excluded)
            assert planned == best
        assert picked or entry.status == "nccl"


def test_runtime_constants_price_both_sides(fast, options, run_of, traced):
    """A runtime-constants calibration (here: a 40 us base latency, 3x the hop latencies)
    prices the ring and the programs alike."""
    base = get_runtime("msccl-executor").defaults
    slow = base.replace(
        base_latency_us={p: 40.0 for p in PROTOCOLS},
        hop_latency_us={k: {p: 3 * v for p, v in row.items()}
                        for k, row in base.hop_latency_us.items()})
    calls = [traced("allgather", size, GROUP) for size in (4096, 1 << 20)]
    plan = plan_calls(run_of(4, calls), fast, options=options(runtime_constants=slow,
                                                               runtime_constants_file="rt.json"))
    (entry,) = plan.entries
    group_topology = topology_for_group(fast, GROUP)
    for size, row in zip((4096, 1 << 20), baseline_rows("allgather", group_topology,
                                                        (4096, 1 << 20), slow)):
        nccl, planned, _, _ = entry.predict(size, 4)
        assert nccl == row.time_us and planned >= 40.0
    assert all(s.time_us >= 40.0 for c in entry.candidates for s in c.samples)
    assert any("rt.json" in note for note in plan.notes)


def test_a_calibrations_runtime_version_prices_the_runtime(fast, options, run_of, traced,
                                                           monkeypatch):
    """The version a runtime-constants calibration was fitted at reaches the runtime the plan
    prices (its own algorithms' choices) and is named in the notes."""
    from collsynth.timing import program_model

    seen = []
    real = program_model.ProgramModel.__init__

    def spy(self, constants, **kwargs):
        seen.append(kwargs.get("runtime"))
        real(self, constants, **kwargs)

    monkeypatch.setattr(program_model.ProgramModel, "__init__", spy)
    calls = [traced("allgather", 1 << 20, GROUP)]
    base = get_runtime("msccl-executor").defaults
    plan = plan_calls(run_of(4, calls), fast, options=options(
        runtime_constants=base, runtime_constants_file="rt.json", runtime_version=(2, 19)))
    assert any("nccl 2.19 runs them" in note for note in plan.notes)
    assert seen and all(r.version == (2, 19) for r in seen if r is not None)


def test_the_closed_form_is_the_quick_path(fast, options, run_of, traced):
    """model="closed-form" prices as before: lines, and the synthesized side charged its
    steps only (below NCCL's base latency on this 1 us-per-step topology)."""
    calls = [traced("allgather", 4096, GROUP)]
    plan = plan_calls(run_of(4, calls), fast, options=options(model="closed-form"))
    (entry,) = plan.entries
    assert entry.yardstick == CLOSED_FORM and "asked for" in entry.yardstick_note
    assert all(c.line is not None and not c.samples for c in entry.candidates)
    _, planned, choice, _ = entry.predict(4096, 4)
    assert choice != NCCL and planned < min(get_runtime("nccl").defaults.base_latency(p)
                                            for p in PROTOCOLS)


# -- NCCL is the faster of its ring and its tree ------------------------------------------------


def _eight_nodes():
    """8 nodes of one GPU on a switch (10 GB/s NICs): NCCL's tree crosses the network
    2 x 3 times (a double binary tree of depth 3, up and down), its ring 2 x 7 times, so at
    small sizes the tree is much the faster."""
    from collsynth.topology import compose_nodes
    from collsynth.topology.model import Topology

    gpu = Topology("gpu", ((0,),), unit_gbps=10.0, alpha_us=1.0)
    return compose_nodes(gpu, 8, nic_units=1)


def _plan_with(monkeypatch, options, run_of, traced, topology, algorithm, sizes):
    """A plan of allreduce calls at ``sizes`` on ``topology`` whose only synthesized
    candidate is ``algorithm`` (the search is replaced: the choice is what is tested)."""
    import dataclasses

    import collsynth.plan.planner as planner
    from collsynth.plan.choose import FrontOutcome

    algorithm = dataclasses.replace(algorithm, name="candidate")
    monkeypatch.setattr(planner, "synthesize_front", lambda *a, **k: FrontOutcome(
        (algorithm,), "pareto", True, False, "given by the test"))
    group = tuple(range(topology.num_ranks))
    calls = [traced("allreduce", size, group) for size in sizes]
    (entry,) = plan_calls(run_of(topology.num_ranks, calls), topology,
                          options=options()).entries
    return entry


def test_a_program_between_the_tree_and_the_ring_is_not_chosen(monkeypatch, options, run_of,
                                                               traced):
    """A 7-step allreduce (a line's: partial sums along 0..7 and back) pays 7 network hops:
    at 1 KiB and 4 KiB it is faster than NCCL's ring (14 hops) but slower than its tree
    (6 hops). NCCL runs its tree there, so the program must not be chosen."""
    from collsynth.collective import allreduce
    from collsynth.synthesis import solve_least_steps

    topology = _eight_nodes()
    line = solve_least_steps(get_topology("line:8"), allreduce(8)).algorithm
    assert line.num_steps == 7
    sizes = (1024, 4096)
    entry = _plan_with(monkeypatch, options, run_of, traced, topology, line, sizes)
    by_name = {c.name: c for c in entry.candidates}
    assert set(by_name) == {"nccl-ring", "nccl-tree", "candidate"}
    for size in sizes:
        ring, tree, ours = (float(by_name[n].time_at(size))
                            for n in ("nccl-ring", "nccl-tree", "candidate"))
        assert tree < ours < ring  # the case this test is about
        nccl_us, planned, choice, _ = entry.predict(size, 4)
        assert choice == NCCL and planned == nccl_us == tree
        assert next(r for r in entry.ranges if r.contains(size)).winner == NCCL


def test_a_program_faster_than_the_tree_and_the_ring_is_chosen(monkeypatch, options, run_of,
                                                               traced):
    """A 1-step allreduce (every rank sends its buffer to every other) pays one network hop:
    faster than both of NCCL's algorithms at 1 KiB, so it is chosen."""
    from collsynth.collective import allreduce
    from collsynth.synthesis import solve_least_steps

    topology = _eight_nodes()
    direct = solve_least_steps(get_topology("fully-connected:8"), allreduce(8)).algorithm
    assert direct.num_steps == 1
    entry = _plan_with(monkeypatch, options, run_of, traced, topology, direct, (1024,))
    by_name = {c.name: c for c in entry.candidates}
    ours = float(by_name["candidate"].time_at(1024))
    assert ours < min(float(by_name[n].time_at(1024)) for n in ("nccl-ring", "nccl-tree"))
    _, planned, choice, _ = entry.predict(1024, 4)
    assert choice == "candidate" and planned == ours


def test_the_price_of_nccl_between_samples_is_the_faster_of_ring_and_tree():
    """The boundaries between ranges are placed with NCCL's price at unsampled sizes: the
    faster of its ring and its tree once the tree is one of its candidates."""
    from collsynth.plan.yardstick import sampled_price

    topology = _eight_nodes()
    constants = get_runtime("nccl").defaults
    ring = baseline_rows("allreduce", topology, [1500], constants)[0].time_us
    tree = baseline_rows("allreduce", topology, [1500], constants, algorithm="tree")[0].time_us
    assert tree < ring
    price = sampled_price(ProgramModel(constants), get_runtime("nccl"), "allreduce", topology, {})
    assert price(NCCL, 1500) == tree
