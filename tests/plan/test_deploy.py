"""`plan` deploys per runtime: a tuner config for stock NCCL/RCCL next to the XML, written in the
all-or-nothing plan directory, read back with the runtime's own parse rules, named in the
manifest, plan.json and report.md with the versions that load it."""

from __future__ import annotations

import json
import os

import pytest

from collsynth.cli.common import UsageError
from collsynth.cli.plan import _runtimes
from collsynth.errors import CollsynthError, ExportError, InvalidTopologyError
from collsynth.export.tuner.config import parse_as_nccl_example, runtime_outcome
from collsynth.plan.deploy import TUNED_COLLECTIVES, Deployment, tuner_deployment
from collsynth.plan.writer import write_plan
from collsynth.resolve import resolve_topology
from collsynth.runtimes import get_runtime


@pytest.fixture(scope="module")
def nccl_deployment(dgx1_plan):
    plan, _ = dgx1_plan
    return tuner_deployment(plan, resolve_topology("dgx1"), get_runtime("nccl"))


def test_the_tuner_config_is_written_checked_and_named(dgx1_plan, nccl_deployment, tmp_path):
    plan, _ = dgx1_plan
    target = write_plan(plan, tmp_path / "p", plots=False, deployments=[nccl_deployment])
    conf = target / "tuner" / "nccl_tuner.conf"
    parsed = parse_as_nccl_example(conf.read_bytes())
    assert parsed.rules and not parsed.notes
    assert all(r.n_nodes == 1 and r.n_ranks == 8 for r in parsed.rules)
    # Every traced size of a whole-communicator collective matches a row (none runs on one
    # channel, the example plugin's default).
    traced = [(e.collective.replace("_", ""), s) for e in plan.entries
              if len(e.group) == plan.world_size and e.collective in TUNED_COLLECTIVES
              for b in e.buckets if b.calls for s in b.bucket]
    assert traced
    for collective, size in traced:
        assert runtime_outcome(parsed.rules, "nccl", collective, size, 1, 8).rule is not None
    manifest = json.loads((target / "manifest.json").read_text())
    assert "tuner/nccl_tuner.conf" in manifest["files"] and "tuner" in manifest["folders"]
    deployed, = json.loads((target / "plan.json").read_text())["deployments"]
    assert deployed["file"] == "tuner/nccl_tuner.conf" and deployed["runtime"] == "nccl"
    env = {v["name"]: v["value"] for v in deployed["environment"]}
    assert env["NCCL_TUNER_CONFIG_FILE"] == str(conf)
    assert "NCCL_TUNER_PLUGIN" in env
    report = (target / "report.md").read_text()
    assert "## For nccl: `tuner/nccl_tuner.conf`" in report
    assert "NCCL 2.28 and later" in report and "2.30.3" in report
    assert f"export NCCL_TUNER_CONFIG_FILE={conf}" in report


def test_a_machine_of_the_other_vendor_is_refused(dgx1_plan):
    plan, _ = dgx1_plan
    with pytest.raises(InvalidTopologyError, match="rccl"):
        tuner_deployment(plan, resolve_topology("dgx1"), get_runtime("rccl"))
    with pytest.raises(ExportError, match="no tuner config"):
        tuner_deployment(plan, resolve_topology("dgx1"), get_runtime("msccl"))


def test_a_failed_deployment_leaves_nothing(dgx1_plan, nccl_deployment, tmp_path):
    plan, _ = dgx1_plan
    bad = Deployment("nccl", "../escape.conf", "x\n", "tuner-csv", "", "", (), ())
    with pytest.raises(ExportError, match="escape"):
        write_plan(plan, tmp_path / "p", plots=False, deployments=[nccl_deployment, bad])
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("text, xml, tuners", [
    ("msccl-executor", "msccl-executor", ()),
    ("nccl", "msccl-executor", ("nccl",)),
    ("rccl", "rccl", ()),
    ("rccl,rccl-tuner", "rccl", ("rccl",)),
    ("msccl, nccl-tuner, nccl", "msccl", ("nccl",)),
    ("mscclpp,rccl", "rccl", ()),
])
def test_runtime_lists(text, xml, tuners):
    assert _runtimes(text) == (xml, tuners, "mscclpp" in text)


@pytest.mark.parametrize("text, fragment", [
    ("msccl,rccl", "at most one"), ("nosuch", "unknown runtime"), (",", "expected"),
    ("msccl-tuner", "loads no tuner config"), ("mscclpp-tuner", "loads no tuner config")])
def test_bad_runtime_lists(text, fragment):
    with pytest.raises((UsageError, CollsynthError), match=fragment):
        _runtimes(text)


def test_mscclpp_plans_of_the_chosen_algorithms(dgx1_plan, tmp_path):
    """One MSCCL++ plan per XML file, for the same algorithm and size range; each reads back
    and the plan checker proves it implements the entry's collective; named in the report."""
    from collsynth.export.mscclpp.checker import check_plan
    from collsynth.export.mscclpp.reader import read_plan
    from collsynth.plan.deploy import mscclpp_deployments

    plan, _ = dgx1_plan
    deployed = mscclpp_deployments(plan)
    assert len(deployed) == len(plan.xml_files) >= 1
    target = write_plan(plan, tmp_path / "p", plots=False, deployments=deployed)
    for d, xml in zip(deployed, plan.xml_files):
        assert d.path == "mscclpp/" + xml.name[:-len(".xml")] + ".json"
        read = read_plan(target / d.path)
        assert read.collective.replace("_", "") == xml.collective.replace("_", "")
        assert check_plan(read, strict=True).ok
        assert f"## For mscclpp: `{d.path}`" in (target / "report.md").read_text()
    report = (target / "report.md").read_text()
    assert "MSCCL++ 0.9 and later" in report and "libmscclpp_nccl.so" in report


def test_a_tuner_for_the_other_vendor_is_refused_before_planning(tmp_path, capsys):
    """The machine check comes before any synthesis: a trace directory that does not exist is
    never read."""
    from collsynth import cli

    code = cli.main(["plan", str(tmp_path / "no-trace"), "--topology", "dgx1", "--runtime",
                     "rccl-tuner", "-o", str(tmp_path / "p"), "-q"])
    err = capsys.readouterr().err
    assert code == 1 and "rccl tuner config" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "p").exists()
