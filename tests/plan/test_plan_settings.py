"""`plan --env`: the job's NCCL_ALGO / NCCL_PROTO / NCCL_NVLS_ENABLE narrow the runtime's own
algorithms a plan compares its programs with and the tuner config it writes; settings under which
the plan's own files could not run are refused before any planning."""

from __future__ import annotations

from pathlib import Path

from collsynth import cli
from collsynth.export.tuner.config import parse_as_nccl_example
from collsynth.plan import make_plan
from collsynth.plan.deploy import tuner_deployment
from collsynth.resolve import resolve_topology
from collsynth.runtimes import get_runtime
from collsynth.runtimes.settings import settings_from_text

TRACES = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "traces"


def test_the_tuner_config_names_no_pair_the_job_disables(dgx1_plan):
    # the DGX-1's own tuner config uses LL at small traced sizes; under NCCL_PROTO=Simple the
    # runtime never runs LL, so no rule may name it (NCCL passes a tuner the enabled pairs only)
    plan, _ = dgx1_plan
    dgx1 = resolve_topology("dgx1")
    plain = tuner_deployment(plan, dgx1, get_runtime("nccl"))
    protocols = {r.protocol for r in parse_as_nccl_example(plain.text.encode()).rules}
    assert "ll" in protocols
    simple = get_runtime("nccl").with_settings(settings_from_text(["NCCL_PROTO=Simple"]))
    narrowed = tuner_deployment(plan, dgx1, simple)
    rules = parse_as_nccl_example(narrowed.text.encode()).rules
    assert rules and {r.protocol for r in rules} == {"simple"}


def test_the_plan_says_the_settings_it_was_priced_under(slow, options):
    # the closed form on 100 us per step, NCCL's own lines narrowed to Simple
    settings = settings_from_text(["NCCL_PROTO=Simple"])
    plan = make_plan(TRACES / "fc4-mixed", slow,
                     options=options(model="closed-form", runtime_settings=settings))
    assert any("narrowed by the job's NCCL_PROTO=Simple" in note for note in plan.notes)
    plain = make_plan(TRACES / "fc4-mixed", slow, options=options(model="closed-form"))
    assert not any("narrowed by the job's" in note for note in plain.notes)
    # NCCL without LL and LL128 is never faster, and slower at the small traced sizes
    narrowed_us = [b.nccl_us for e in plan.entries for b in e.buckets if b.nccl_us is not None]
    plain_us = [b.nccl_us for e in plain.entries for b in e.buckets if b.nccl_us is not None]
    assert narrowed_us and len(narrowed_us) == len(plain_us)
    assert all(a >= b * (1 - 1e-9) for a, b in zip(narrowed_us, plain_us))
    assert any(a > 1.1 * b for a, b in zip(narrowed_us, plain_us))


def _plan(tmp_path, *more):
    return cli.main(["plan", str(TRACES / "fc4-mixed"), "--topology",
                     "fully-connected:4,unit_gbps=50,alpha_us=1", "-o", str(tmp_path / "p"),
                     "--no-cache", "-q", *more])


def test_settings_the_plans_programs_cannot_run_under_are_refused(tmp_path, capsys):
    # its XML programs run Simple: a job that disables Simple could not run them
    code = _plan(tmp_path, "--env", "NCCL_PROTO=LL,LL128")
    assert code == cli.EXIT_USAGE
    assert "run the Simple protocol, which it disables" in capsys.readouterr().err
    assert not (tmp_path / "p").exists()
    # msccl runs them only where NCCL_ALGO lists MSCCL, which the plan's environment sets
    code = _plan(tmp_path, "--runtime", "msccl", "--env", "NCCL_ALGO=Ring,Tree")
    assert code == cli.EXIT_USAGE
    assert "NCCL_ALGO with msccl" in capsys.readouterr().err
