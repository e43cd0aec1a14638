"""The job's NCCL_ALGO / NCCL_PROTO / NCCL_NVLS_ENABLE (collsynth.runtimes.settings) and what
they do to the runtime's own choices (tuning_model.enabled, pricing.runtime_algorithms, the
program model's tuning, ``collsynth time --env``).

Expected behaviour is NCCL's own, read from its source: ``parseList`` and the enable rules of
``ncclTopoTuneModel`` in src/graph/tuning.cc at v2.21.5-1 (``git -C
/work/.mirror/NVIDIA+nccl/repo show v2.21.5-1:src/graph/tuning.cc``, lines 34-54 and 268-330):
a list enables only its names, case-insensitively; ``^`` first enables all but them; a pair
either list disables gets bandwidth 0; a function left with no pair gets the ring back with
every protocol; naming LL128 sets protoEnable to 1, which skips the auto rule that turns it off.
"""

from __future__ import annotations

import dataclasses

import pytest

from collsynth import cli
from collsynth.runtimes import get_runtime
from collsynth.runtimes.settings import RuntimeSettings, settings_from_text
from collsynth.timing.pricing import runtime_algorithms
from collsynth.timing.tuning_model import GraphFigures, choose, enabled, offered_protocols
from collsynth.topology import get_topology
from collsynth.topology.compose import compose_nodes
from tests.timing.test_tuning_model import H100, H100_NVLS, nccl

# -- parsing, as parseList ---------------------------------------------------------------------


def test_a_list_enables_only_its_names_without_case():
    s = settings_from_text(["NCCL_ALGO=rInG,TREE", "NCCL_PROTO=simple"])
    assert s.algorithms == {"ring", "tree"} and s.protocols == {"Simple"}
    assert s.allows("ring", "Simple") and s.allows("tree", "Simple")
    assert not s.allows("ring", "LL") and not s.allows("nvls", "Simple")


def test_a_caret_enables_all_but_its_names():
    s = settings_from_text(["NCCL_ALGO=^NVLS,NVLSTree", "NCCL_PROTO=^LL128"])
    assert s.algorithms == {"tree", "ring", "collnet_direct", "collnet_chain", "pat"}
    assert s.protocols == {"LL", "Simple"}
    assert not s.ll128_listed  # ^LL128 names it to turn it off, not on


def test_empty_entries_are_skipped_as_strtok_skips_them():
    assert settings_from_text(["NCCL_ALGO=Ring,,Tree,"]).algorithms == {"ring", "tree"}


def test_naming_ll128_is_recorded_as_forcing_it():
    assert settings_from_text(["NCCL_PROTO=LL128,Simple"]).ll128_listed
    assert not settings_from_text(["NCCL_PROTO=Simple"]).ll128_listed


def test_nvls_enable_zero_turns_both_nvls_algorithms_off():
    s = settings_from_text(["NCCL_NVLS_ENABLE=0"])
    assert not s.allows("nvls", "Simple") and not s.allows("nvls_tree", "Simple")
    assert s.allows("ring", "LL")
    assert settings_from_text(["NCCL_NVLS_ENABLE=1"]).default


@pytest.mark.parametrize("items, why", [
    (["NCCL_ALGO"], "expected NAME=VALUE"),
    (["NCCL_ALGO=Rings"], "unknown name 'Rings'"),
    (["NCCL_PROTO=LL,Simple;allreduce:^LL"], "per-collective"),
    (["NCCL_ALGO=allreduce:tree"], "per-collective"),
    (["NCCL_ALGO=Ring", "NCCL_ALGO=Tree"], "given twice"),
    (["NCCL_NVLS_ENABLE=yes"], "expected 0"),
    (["NCCL_MIN_NCHANNELS=4"], "not a setting collsynth models"),
    (["NCCL_ALGO="], "expected a value"),
    (["NCCL_ALGO=" + "Ring," * 100], "expected a value of 1 to"),
    (["NCCL_ALGO=Ring, Tree"], "blanks around it"),
    (["NCCL_PROTO= Simple"], "blanks around it"),
])
def test_refusals_name_the_cause(items, why):
    with pytest.raises(ValueError, match=why):
        settings_from_text(items)


# -- the tuning: enable rules ------------------------------------------------------------------


def _under(setup, *items):
    return dataclasses.replace(setup, settings=settings_from_text(items))


def test_a_disabled_pair_is_not_offered():
    setup = _under(H100_NVLS, "NCCL_PROTO=Simple")
    assert offered_protocols(setup, "allreduce", "ring") == ("Simple",)
    assert offered_protocols(setup, "allreduce", "tree") == ("Simple",)
    assert offered_protocols(H100_NVLS, "allreduce", "ring") == ("LL", "LL128", "Simple")


def test_the_choice_obeys_the_protocol_list():
    # 8 B on one H100 node: NCCL's own pick is LL (the least latency); with NCCL_PROTO=Simple
    # it can only be Simple
    assert choose(H100_NVLS, "allreduce", 8).protocol == "LL"
    assert choose(_under(H100_NVLS, "NCCL_PROTO=Simple"), "allreduce", 8).protocol == "Simple"


def test_nvls_off_leaves_the_ring_and_tree():
    setup = _under(H100_NVLS, "NCCL_NVLS_ENABLE=0")
    assert not enabled(setup, "allreduce", "nvls", "Simple")
    assert enabled(H100_NVLS, "allreduce", "nvls", "Simple")
    assert choose(setup, "allreduce", 1 << 30).algorithm in ("ring", "tree")
    assert choose(H100_NVLS, "allreduce", 1 << 30).algorithm == "nvls"


def test_a_function_left_with_nothing_gets_the_ring_back_from_2_19_to_2_23():
    # NCCL_ALGO=Tree: allgather has no tree. v2.21.5-1 tuning.cc 322-332: "at least set ring
    # algo available", its own bandwidths (ringbdw), all three protocols
    setup = _under(dataclasses.replace(H100, version=(2, 21)), "NCCL_ALGO=Tree")
    assert offered_protocols(setup, "allgather", "ring") == ("LL", "LL128", "Simple")
    assert offered_protocols(setup, "allreduce", "ring") == ()
    assert offered_protocols(setup, "allreduce", "tree") != ()


def test_from_2_24_a_function_left_with_nothing_has_nothing():
    # v2.24.3-1: the fallback is gone; enqueue.cc 1656 fails the call ("no algorithm/protocol
    # available ... NCCL_ALGO was set to")
    from collsynth.errors import InvalidInstanceError

    for version in ((2, 24), (2, 30)):
        setup = _under(dataclasses.replace(H100, version=version), "NCCL_ALGO=Tree")
        assert offered_protocols(setup, "allgather", "ring") == ()
        with pytest.raises(InvalidInstanceError, match="no algorithm available"):
            choose(setup, "allgather", 1 << 20)


def test_before_2_19_the_ring_of_other_collectives_stays():
    # v2.18.5-1 tuning.cc: "Never disable ring for non-allreduce operations" (NCCL_PROTO still
    # applies to it)
    setup = _under(dataclasses.replace(H100, version=(2, 18)), "NCCL_ALGO=Tree",
                   "NCCL_PROTO=Simple")
    assert offered_protocols(setup, "allgather", "ring") == ("Simple",)
    assert offered_protocols(setup, "allreduce", "ring") == ()


def test_the_ring_comes_back_with_every_protocol_even_against_the_protocol_list():
    # NCCL_ALGO=Tree NCCL_PROTO=LL128 for allgather at 2.21: nothing left; the ring comes back
    # with its own bandwidths (saved before NCCL_PROTO was applied), every protocol
    setup = _under(dataclasses.replace(H100, version=(2, 21)), "NCCL_ALGO=Tree",
                   "NCCL_PROTO=LL128")
    assert offered_protocols(setup, "allgather", "ring") == ("LL", "LL128", "Simple")


def test_the_ring_comes_back_with_ll128_where_the_auto_rule_turns_it_off():
    # ringbdw is saved before the LL128 rule (v2.21.5-1 tuning.cc 223 against 296-334)
    setup = _under(nccl(ll128=False, version=(2, 21)), "NCCL_ALGO=Tree")
    assert offered_protocols(setup, "allgather", "ring") == ("LL", "LL128", "Simple")


def test_a_collnet_only_list_without_collnet_gets_the_ring_and_tree_back_before_2_24():
    # v2.21.5-1 tuning.cc 286-296: no CollNet support and ring, tree, NVLS, NVLS-tree all off:
    # "ignoring NCCL_ALGO=COLLNET", ring and tree on again, NCCL_PROTO still applied
    setup = _under(dataclasses.replace(H100, version=(2, 21)), "NCCL_ALGO=CollNetDirect",
                   "NCCL_PROTO=Simple")
    assert offered_protocols(setup, "allreduce", "ring") == ("Simple",)
    assert offered_protocols(setup, "allreduce", "tree") == ("Simple",)
    newer = _under(H100, "NCCL_ALGO=CollNetDirect", "NCCL_PROTO=Simple")  # 2.30: not so
    assert offered_protocols(newer, "allreduce", "ring") == ()


def test_naming_ll128_forces_it_where_the_auto_rule_turns_it_off():
    off = nccl(ll128=False)
    assert "LL128" not in offered_protocols(off, "allreduce", "ring")
    assert "LL128" in offered_protocols(_under(off, "NCCL_PROTO=LL128,Simple"), "allreduce",
                                        "ring")
    assert "LL128" not in offered_protocols(_under(off, "NCCL_PROTO=^LL"), "allreduce", "ring")


# -- the runtime's own algorithms and the program model ------------------------------------------


def _names(runtime, collective, topology):
    return [a.algorithm for a in runtime_algorithms(runtime, collective, topology)]


def test_runtime_algorithms_follow_the_settings():
    h100 = get_topology("DGX-H100")
    nccl_rt = get_runtime("nccl")
    assert _names(nccl_rt, "allreduce", h100) == ["ring", "tree", "nvls"]
    off = nccl_rt.with_settings(settings_from_text(["NCCL_NVLS_ENABLE=0"]))
    assert _names(off, "allreduce", h100) == ["ring", "tree"]
    tree = nccl_rt.with_settings(settings_from_text(["NCCL_ALGO=Tree"]))
    assert _names(tree, "allreduce", h100) == ["tree"]
    assert _names(tree, "allgather", h100) == []  # nothing left: from 2.24 the call fails
    assert _names(tree.at_version((2, 21)), "allgather", h100) == ["ring"]  # the ring back
    # a machine without a tuning: the lists alone, by the same version rules
    bare = get_topology("ring:4,unit_gbps=25")
    assert _names(tree, "allgather", bare) == []
    assert _names(tree.at_version((2, 21)), "allgather", bare) == ["ring"]
    assert _names(tree.at_version((2, 18)), "allgather", bare) == ["ring"]


def test_with_settings_narrows_the_runtime_protocols():
    nccl_rt = get_runtime("nccl").with_settings(settings_from_text(["NCCL_PROTO=^LL"]))
    assert nccl_rt.protocols == ("LL128", "Simple")
    # RCCL leaves LL128 off by default; naming it forces it on there too (rocm-6.2.2
    # src/graph/tuning.cc: the same protoEnable rule)
    rccl = get_runtime("rccl").with_settings(settings_from_text(["NCCL_PROTO=LL128"]))
    assert rccl.protocols == ("LL128",)
    rccl = get_runtime("rccl").with_settings(settings_from_text(["NCCL_PROTO=^LL,Simple"]))
    assert rccl.protocols == ("LL", "Simple")  # nothing it runs is left: as it was


def test_program_model_prices_each_runtime_under_its_own_settings():
    # one ProgramModel, one topology, two runtimes: the tuning it keeps per topology must not
    # hand one runtime's settings to the other
    from collsynth.timing.program_model import ProgramModel

    topology = compose_nodes(get_topology("DGX-H100"), 2)
    plain = get_runtime("nccl")
    simple = plain.with_settings(settings_from_text(["NCCL_PROTO=Simple"]))
    model = ProgramModel(plain.defaults, runtime=plain)
    ring_plain = runtime_algorithms(plain, "allreduce", topology)[0]
    ring_simple = runtime_algorithms(simple, "allreduce", topology)[0]
    assert model.price(ring_plain, [8])[0].protocol == "LL"
    assert model.price(ring_simple, [8])[0].protocol == "Simple"
    assert model.price(ring_plain, [8])[0].protocol == "LL"


def test_default_settings_change_nothing():
    assert RuntimeSettings().default
    assert get_runtime("nccl").with_settings(RuntimeSettings()) == \
        dataclasses.replace(get_runtime("nccl"), settings=RuntimeSettings())


# -- collsynth time --env -----------------------------------------------------------------------


def test_time_env_narrows_the_rows(capsys):
    code = cli.main(["time", "--collective", "allreduce", "--topology", "DGX-H100", "--nodes",
                     "2", "--sizes", "8,1GB", "--env", "NCCL_ALGO=Ring,Tree", "--env",
                     "NCCL_PROTO=Simple", "-q", "--json"])
    assert code == cli.EXIT_OK
    import json

    rows = json.loads(capsys.readouterr().out)
    text = json.dumps(rows)
    assert "nvls" not in text and '"LL"' not in text and '"LL128"' not in text
    assert "nccl-tree" in text and "nccl-ring" in text


def test_time_env_is_said_under_the_table(capsys):
    code = cli.main(["time", "--collective", "allreduce", "--topology", "DGX-H100", "--sizes",
                     "1MB", "--env", "NCCL_NVLS_ENABLE=0", "-q"])
    out = capsys.readouterr().out
    assert code == cli.EXIT_OK
    assert "under NCCL_NVLS_ENABLE=0" in out and "nccl-nvls" not in out


def test_time_env_given_twice_is_a_usage_error(capsys):
    code = cli.main(["time", "--collective", "allreduce", "--topology", "DGX-H100", "--env",
                     "NCCL_PROTO=LL", "--env", "NCCL_PROTO=Simple"])
    assert code == cli.EXIT_USAGE
    assert "NCCL_PROTO given twice" in capsys.readouterr().err


def test_time_env_goes_with_the_program_model(tmp_path, capsys):
    algo = tmp_path / "a.json"
    assert cli.main(["solve", "instance", "ring:4,unit_gbps=25,alpha_us=1", "allgather",
                     "--steps", "3", "--rounds", "3", "-o", str(algo), "-q"]) == cli.EXIT_OK
    capsys.readouterr()
    code = cli.main(["time", "--model", "closed-form", "--env", "NCCL_PROTO=Simple", str(algo)])
    assert code == cli.EXIT_USAGE
    assert "--env goes with the program model" in capsys.readouterr().err


# -- collsynth calibrate --model program --env ----------------------------------------------------

# Six sizes of an allreduce on one node, all below NCCL's LL -> Simple switch on an H100.
_CURVE = "size_bytes,time_us\n1024,18\n4096,19\n16384,20\n65536,22\n262144,31\n1048576,61\n"


def _calibrated(tmp_path, capsys, topology: str, collective: str, *env: str) -> dict:
    import json

    curve = tmp_path / "curve.csv"
    curve.write_text(_CURVE)
    more = [x for e in env for x in ("--env", e)]
    code = cli.main(["calibrate", "--model", "program", "--topology", topology,
                     "--collective", collective, "-o", str(tmp_path / "c.json"), "-q", "--json",
                     *more, str(curve)])
    assert code in (cli.EXIT_OK, cli.EXIT_ERROR), capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def test_calibrate_fits_what_the_job_let_the_runtime_run(tmp_path, capsys):
    # unconstrained, NCCL runs these sizes with its ring on LL; under NCCL_PROTO=Simple it can
    # not, and under NVLS off as well only the ring and tree on Simple are left
    plain = _calibrated(tmp_path, capsys, "DGX-H100", "allreduce")
    assert {r["protocol"] for r in plain["rows"]} == {"LL"} and plain["settings"] == []
    simple = _calibrated(tmp_path, capsys, "DGX-H100", "allreduce", "NCCL_PROTO=Simple")
    assert {r["protocol"] for r in simple["rows"]} == {"Simple"}
    assert simple["settings"] == ["NCCL_PROTO=Simple"]
    narrow = _calibrated(tmp_path, capsys, "DGX-H100", "allreduce", "NCCL_PROTO=Simple",
                         "NCCL_NVLS_ENABLE=0")
    assert all(r["ran"].split("/")[0] in ("ring", "tree") for r in narrow["rows"])
    assert {r["protocol"] for r in narrow["rows"]} == {"Simple"}


def test_calibrate_on_a_ring_takes_the_one_protocol_the_job_allows(tmp_path, capsys):
    # no tuning on ring:4: the protocol split of the curve says Simple throughout; a job with
    # NCCL_PROTO=LL ran LL throughout
    plain = _calibrated(tmp_path, capsys, "ring:4,unit_gbps=25", "allgather")
    assert {r["protocol"] for r in plain["rows"]} == {"Simple"}
    ll = _calibrated(tmp_path, capsys, "ring:4,unit_gbps=25", "allgather", "NCCL_PROTO=LL")
    assert {r["protocol"] for r in ll["rows"]} == {"LL"}


def test_calibrate_env_goes_with_the_program_model(tmp_path, capsys):
    curve = tmp_path / "curve.csv"
    curve.write_text(_CURVE)
    code = cli.main(["calibrate", "--topology", "ring:4", "--collective", "allgather", "-o",
                     str(tmp_path / "c.json"), "--env", "NCCL_PROTO=LL", str(curve)])
    assert code == cli.EXIT_USAGE
    assert "--env goes with --model program" in capsys.readouterr().err


# -- collsynth tune-runtime --env ------------------------------------------------------------------


def _rules(tmp_path, capsys, *env: str) -> list[str]:
    import json

    more = [x for e in env for x in ("--env", e)]
    code = cli.main(["tune-runtime", "--topology", "DGX-H100", "--runtime", "nccl",
                     "--collectives", "allreduce", "--sizes", "1KB:64MB", "-o",
                     str(tmp_path / "t.conf"), "-q", "--json", *more])
    assert code == cli.EXIT_OK, capsys.readouterr().err
    summary = json.loads(capsys.readouterr().out)
    assert summary["settings"] == list(env)
    return summary["rules"]


def test_tune_runtime_writes_no_rule_the_job_disables(tmp_path, capsys):
    # A tuner's pick of a pair NCCL_PROTO / NVLS disable is ignored by the runtime. Unnarrowed,
    # the config of one H100 node uses LL at small sizes and NVLS at large ones.
    fields = [r.split(",") for r in _rules(tmp_path, capsys)]
    assert any(f[4] == "ll" for f in fields) and any(f[3] == "nvls" for f in fields)
    narrowed = [r.split(",") for r in _rules(tmp_path, capsys, "NCCL_PROTO=Simple",
                                             "NCCL_NVLS_ENABLE=0")]
    assert narrowed and all(f[4] == "simple" and f[3] in ("ring", "tree") for f in narrowed)


def test_a_ring_fit_splits_between_the_protocols_the_job_allows(tmp_path, capsys):
    # The curve drops by 23% at 256 KiB (40 -> 31 us): protocol_split's switch. Unnarrowed it
    # is LL -> Simple; NCCL_PROTO=^LL allows LL128 and Simple, so LL128 -> Simple; LL,LL128
    # allows no Simple, so LL -> LL128 (round 14 found the split ignoring both)
    import json

    curve = tmp_path / "drop.csv"
    curve.write_text("size_bytes,time_us\n1024,18\n4096,19\n16384,20\n65536,40\n262144,31\n"
                     "1048576,61\n")

    def fitted(*env):
        more = [x for e in env for x in ("--env", e)]
        code = cli.main(["calibrate", "--model", "program", "--topology", "ring:4,unit_gbps=25",
                         "--collective", "allgather", "-o", str(tmp_path / "c.json"), "-q",
                         "--json", *more, str(curve)])
        assert code in (cli.EXIT_OK, cli.EXIT_ERROR), capsys.readouterr().err
        return [r["protocol"] for r in json.loads(capsys.readouterr().out)["rows"]]

    assert fitted() == ["LL"] * 4 + ["Simple"] * 2
    assert fitted("NCCL_PROTO=^LL") == ["LL128"] * 4 + ["Simple"] * 2
    assert fitted("NCCL_PROTO=LL,LL128") == ["LL"] * 4 + ["LL128"] * 2


def test_tune_runtime_writes_no_row_for_a_collective_the_job_leaves_nothing(tmp_path, capsys):
    # NCCL_ALGO=Tree at 2.30: allreduce runs its tree; broadcast, reduce, allgather and
    # reduce-scatter have no tree and, from 2.24, no ring back: NCCL fails those calls, so no
    # row is written for them; asked for, allgather is an error that says why
    out = tmp_path / "t.conf"
    code = cli.main(["tune-runtime", "--topology", "DGX-H100", "--runtime", "nccl",
                     "--collectives", "allreduce", "--sizes", "1KB:1MB", "-o", str(out), "-q",
                     "--env", "NCCL_ALGO=Tree"])
    assert code == cli.EXIT_OK, capsys.readouterr().err
    rows = [r for r in out.read_text().splitlines() if r and not r.startswith("#")]
    assert rows and {r.split(",")[0] for r in rows} == {"allreduce"}
    assert "no row for broadcast, reduce, allgather, reducescatter" in capsys.readouterr().out
    code = cli.main(["tune-runtime", "--topology", "DGX-H100", "--runtime", "nccl",
                     "--collectives", "allgather", "--sizes", "1KB:1MB", "-o", str(out), "-q",
                     "--env", "NCCL_ALGO=Tree"])
    assert code == cli.EXIT_ERROR
    assert "fails such a call" in capsys.readouterr().err


def test_time_says_when_the_settings_leave_a_collective_nothing(capsys):
    code = cli.main(["time", "--collective", "allgather", "--topology", "DGX-H100", "--sizes",
                     "1MB", "-q", "--env", "NCCL_ALGO=Tree"])
    out = capsys.readouterr().out
    assert code == cli.EXIT_ERROR  # nothing priced
    assert "NCCL_ALGO=Tree leaves nccl no algorithm for allgather" in out
    assert "outside its own algorithms" not in out


# -- a calibration records the settings it was fitted under -------------------------------------


def _calibration_with(tmp_path, *settings: str, runtime: str = "nccl"):
    from collsynth.timing.calibration import RuntimeCalibration, save_calibration

    path = tmp_path / "rt.json"
    save_calibration(RuntimeCalibration(get_runtime(runtime).defaults, settings=settings), path)
    return path


def test_calibrate_env_is_recorded_and_read_back(tmp_path, capsys):
    import json

    from collsynth.timing.calibration import load_calibration

    curve = tmp_path / "curve.csv"
    curve.write_text(_CURVE)
    out = tmp_path / "c.json"
    code = cli.main(["calibrate", "--model", "program", "--topology", "DGX-H100",
                     "--collective", "allreduce", "-o", str(out), "-q", "--env",
                     "NCCL_PROTO=Simple", str(curve)])
    assert code in (cli.EXIT_OK, cli.EXIT_ERROR), capsys.readouterr().err
    assert json.loads(out.read_text())["settings"] == ["NCCL_PROTO=Simple"]
    assert load_calibration(out).settings == ("NCCL_PROTO=Simple",)


def test_time_prices_under_the_calibrations_settings_unless_env_says_otherwise(tmp_path, capsys):
    path = _calibration_with(tmp_path, "NCCL_PROTO=Simple")
    base = ["time", "--collective", "allreduce", "--topology", "DGX-H100", "--calibration",
            str(path), "--sizes", "1KB", "-q", "--json"]
    import json

    assert cli.main(base) == cli.EXIT_OK
    rows = json.loads(capsys.readouterr().out)
    assert {r["protocol"] for r in rows if r.get("kind") == "baseline"} == {"Simple"}
    assert cli.main(base + ["--env", "NCCL_NVLS_ENABLE=1"]) == cli.EXIT_OK  # replaces them
    rows = json.loads(capsys.readouterr().out)
    assert "LL" in {r["protocol"] for r in rows if r.get("kind") == "baseline"}
    assert cli.main(base[:-1]) == cli.EXIT_OK
    assert f"NCCL_PROTO=Simple (the calibration {path})" in capsys.readouterr().out


@pytest.mark.parametrize("settings, why", [
    ('["NCCL_ALGO=Rings"]', "settings: NCCL_ALGO=Rings: unknown name"),
    ('"NCCL_PROTO=Simple"', "settings: 'NCCL_PROTO=Simple'; expected a list"),
    ('["NCCL_PROTO=LL", "NCCL_PROTO=Simple"]', "settings: NCCL_PROTO given twice"),
    ('[1]', "settings: a list of 1; expected a list"),
])
def test_a_calibrations_settings_are_checked(tmp_path, capsys, settings, why):
    import json

    path = _calibration_with(tmp_path)
    obj = json.loads(path.read_text())
    path.write_text(json.dumps(obj)[:-1] + f', "settings": {settings}}}')
    code = cli.main(["time", "--collective", "allreduce", "--topology", "DGX-H100",
                     "--calibration", str(path), "--sizes", "1KB", "-q"])
    err = capsys.readouterr().err
    assert code == cli.EXIT_ERROR and str(path) in err and why in err, err


def test_tune_runtime_takes_the_calibrations_settings(tmp_path, capsys):
    path = _calibration_with(tmp_path, "NCCL_PROTO=Simple", "NCCL_NVLS_ENABLE=0")
    out = tmp_path / "t.conf"
    code = cli.main(["tune-runtime", "--topology", "DGX-H100", "--runtime", "nccl",
                     "--collectives", "allreduce", "--sizes", "1KB:64MB", "-o", str(out), "-q",
                     "--calibration", str(path)])
    assert code == cli.EXIT_OK, capsys.readouterr().err
    fields = [r.split(",") for r in out.read_text().splitlines() if r and r[0] != "#"]
    assert fields and all(f[4] == "simple" and f[3] in ("ring", "tree") for f in fields)


def test_plan_refuses_a_calibrations_settings_its_programs_cannot_run_under(tmp_path, capsys):
    from pathlib import Path

    path = _calibration_with(tmp_path, "NCCL_PROTO=LL")
    traces = Path(__file__).resolve().parents[1] / "fixtures" / "traces" / "fc4-mixed"
    code = cli.main(["plan", str(traces), "--topology", "fully-connected:4,unit_gbps=50,"
                     "alpha_us=1", "-o", str(tmp_path / "p"), "--no-cache", "-q",
                     "--calibration", str(path)])
    assert code == cli.EXIT_USAGE
    assert f"the calibration {path}: NCCL_PROTO=LL" in capsys.readouterr().err
