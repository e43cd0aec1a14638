"""Mutation round 14: the job's NCCL_ALGO / NCCL_PROTO / NCCL_NVLS_ENABLE
(collsynth.runtimes.settings, the enable rules in collsynth.timing.tuning_model, the filter at the
end of collsynth.timing.pricing.runtime_algorithms, the one-protocol path of
collsynth.timing.runtime_fit.fit_runtime) and the note ``collsynth time`` writes where the
runtime's own pick has no row (collsynth.cli.time).

Each test kills a mutant the earlier suites let live. Expected values come from NCCL's source at
the tag named (``git -C /work/.mirror/NVIDIA+nccl/repo show v2.21.5-1:src/graph/tuning.cc``:
``parseList`` at lines 34-54, the enable rules at 268-330), from a rule the code documents
(the refusal's own "1 to 200 characters", ``protocol_split``'s largest drop) worked by hand in
the comment, or from another reading of the same output (the rows an unrefused run marks as
the runtime's pick); never from the output of the code under test.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

KiB, MiB = 1 << 10, 1 << 20


def _settings(*items):
    from collsynth.runtimes.settings import settings_from_text

    return settings_from_text(items)


# -- parsing --------------------------------------------------------------------------------------


def test_nvls_enable_two_is_the_default_and_leaves_nvls_on():
    # NCCL v2.21.5-1 src/transport/nvls.cc:231 NCCL_PARAM(NvlsEnable, "NVLS_ENABLE", 2): 2 is
    # the default (on where the machine has NVLink SHARP); only 0 turns NVLS off (line 241,
    # `if (!ncclParamNvlsEnable() ...) return`). So NCCL_NVLS_ENABLE=2 restricts nothing.
    two = _settings("NCCL_NVLS_ENABLE=2")
    assert two.nvls and two.default
    assert two.allows("nvls", "Simple") and two.allows("nvls_tree", "Simple")


def test_a_value_of_two_hundred_characters_is_taken_and_one_more_refused():
    from collsynth.runtimes.settings import settings_from_text

    # The refusal says "expected a value of 1 to 200 characters": 200 is taken. "LL128," x 33
    # is 198 characters, + "LL" = 200: LL128 and LL named, Simple not.
    value = "LL128," * 33 + "LL"
    assert len(value) == 200
    s = settings_from_text([f"NCCL_PROTO={value}"])
    assert s.protocols == {"LL", "LL128"}
    with pytest.raises(ValueError, match="expected a value of 1 to 200"):
        settings_from_text([f"NCCL_PROTO={value},"])


# -- the enable rules: a collective left with nothing -----------------------------------------------


def test_a_protocol_list_without_simple_leaves_the_ring_its_listed_protocol_only():
    from collsynth.timing.tuning_model import offered_protocols
    from tests.timing.test_tuning_model import H100

    # NCCL_PROTO=LL: parseList enables LL alone (tuning.cc:34-54); ring/LL keeps its bandwidth,
    # so the allgather has a pair left (tuning.cc:320-330 "available") and the ring is NOT given
    # back its other protocols: ring/LL128 and ring/Simple stay at bandwidth 0.
    setup = dataclasses.replace(H100, settings=_settings("NCCL_PROTO=LL"))
    assert offered_protocols(setup, "allgather", "ring") == ("LL",)
    assert offered_protocols(setup, "allreduce", "ring") == ("LL",)


def test_nvls_tree_alone_on_two_nodes_is_not_nothing_left():
    from collsynth.timing.tuning_model import offered_protocols, tuning_setup
    from collsynth.topology import compose_nodes, get_topology

    # NCCL_ALGO=NVLSTree on two DGX H100 (NVLink SHARP in each node, two nodes: NVLS-tree is
    # enabled, tuning.cc:285 disables it only on one node). The allreduce keeps nvls_tree/Simple,
    # so NCCL does not set the ring back (tuning.cc:320-330): the ring offers nothing.
    two = compose_nodes(get_topology("DGX-H100"), 2)
    setup = tuning_setup(two, runtime="nccl", settings=_settings("NCCL_ALGO=NVLSTree"))
    assert offered_protocols(setup, "allreduce", "nvls_tree") == ("Simple",)
    assert offered_protocols(setup, "allreduce", "ring") == ()
    assert offered_protocols(setup, "allreduce", "tree") == ()


# -- runtime_algorithms: NCCL_ALGO does not touch send/recv ----------------------------------------


def test_an_algorithm_list_leaves_the_alltoalls_send_recv():
    from collsynth.runtimes import get_runtime
    from collsynth.timing.pricing import runtime_algorithms
    from collsynth.topology import get_topology

    # NCCL runs alltoall as grouped ncclSend/ncclRecv: p2p operations, which NCCL_ALGO (a list
    # of collective algorithms, ncclAlgoStr) does not name, so NCCL_ALGO=Ring leaves them.
    nccl = get_runtime("nccl").with_settings(_settings("NCCL_ALGO=Ring"))
    found = runtime_algorithms(nccl, "alltoall", get_topology("DGX-H100"))
    assert [a.algorithm for a in found] == ["p2p"]


# -- fit_runtime on a ring without a tuning: NCCL_PROTO of two protocols ---------------------------


def test_a_ring_fit_under_two_allowed_protocols_still_splits_the_curve():
    from collsynth.resolve import resolve_topology
    from collsynth.timing.runtime_fit import fit_runtime

    # fit_runtime's docs: only an NCCL_PROTO of ONE protocol is the protocol of every size; with
    # LL and Simple both allowed the curve's own split decides (protocol_split: LL up to the
    # largest drop of the time, Simple from it). Times 18, 19, 20, 40, 31, 61 us: the only drop
    # is 40 -> 31 at the fifth size (31 < 40 / 1.05, and not within 10% of 20 two sizes
    # before), so LL for the first four sizes and Simple for the last two.
    rows = [(1024, 18.0), (4096, 19.0), (16384, 20.0), (65536, 40.0), (262144, 31.0),
            (1048576, 61.0)]
    fit = fit_runtime(rows, resolve_topology("ring:4,unit_gbps=25"), "allgather",
                      runtime="nccl", held_out=False,
                      settings=_settings("NCCL_PROTO=LL,Simple"))
    assert fit.protocols == ("LL",) * 4 + ("Simple",) * 2


# -- collsynth time: the note where the runtime's own pick has no row -------------------------------

_TWO_H100 = ["time", "--collective", "allreduce", "--topology", "DGX-H100", "--nodes", "2"]


def _refusing(monkeypatch, refused):
    from collsynth.timing.pricing import RuntimeAlgorithm
    from collsynth.timing.program_model import ProgramModel

    original = ProgramModel.why_not

    def why_not(self, subject):
        if isinstance(subject, RuntimeAlgorithm) and refused(subject.algorithm):
            return "refused for this test"
        return original(self, subject)

    monkeypatch.setattr(ProgramModel, "why_not", why_not)


def test_every_size_whose_pick_has_no_row_is_named_in_one_note(monkeypatch, capsys):
    from collsynth import cli

    # Unrefused, the rows of NCCL's pick carry it (runtime_pick): the sizes at which the pick is
    # the tree are read from there. With the tree refused, the one note for that pick must name
    # every one of those sizes, in order, not only the last.
    code = cli.main([*_TWO_H100, "--sizes", "1MB,2MB", "-q", "--json"])
    assert code == cli.EXIT_OK
    rows = json.loads(capsys.readouterr().out)
    tree_at = [r["size_bytes"] for r in rows if r.get("runtime_pick")
               and r["runtime_pick"].split("/")[0] == "tree"]
    pick = {r["runtime_pick"] for r in rows if r.get("runtime_pick")
            and r["runtime_pick"].startswith("tree/")}
    assert tree_at == [1_000_000, 2_000_000] and len(pick) == 1
    _refusing(monkeypatch, lambda algorithm: algorithm == "tree")
    code = cli.main([*_TWO_H100, "--sizes", "1MB,2MB", "-q"])
    out = capsys.readouterr().out
    assert code == cli.EXIT_OK
    assert f"nccl's own pick at 1 MB, 2 MB is {pick.pop()}, which has no row here" in out


def test_no_pick_note_where_nothing_at_all_was_priced(monkeypatch, capsys):
    from collsynth import cli

    # With every runtime algorithm refused there is no 'fastest priced' for the note to warn
    # against: the table says nothing was priced (exit 1) and no "has no row here" line.
    _refusing(monkeypatch, lambda algorithm: True)
    code = cli.main([*_TWO_H100, "--sizes", "1MB", "-q"])
    captured = capsys.readouterr()
    assert code == cli.EXIT_ERROR
    assert "nothing priced" in captured.out + captured.err
    assert "has no row here" not in captured.out


def test_the_pick_is_marked_on_the_row_of_its_own_algorithm(capsys):
    from collsynth import cli

    # NCCL's pick names an algorithm; its mark goes on that algorithm's row, not on one whose
    # name is part of it (nvls_tree's pick is not the tree's row). At 1 GB on two DGX H100 the
    # pick is NVLS-tree (the largest sizes: round 13's two-H100 fit runs nvls_tree from 64 MiB).
    code = cli.main([*_TWO_H100, "--sizes", "1GB", "-q", "--json"])
    assert code == cli.EXIT_OK
    rows = json.loads(capsys.readouterr().out)
    marked = [r for r in rows if r.get("runtime_pick")]
    assert [r["runtime_pick"] for r in marked] == ["nvls_tree/Simple"]
    assert marked[0]["name"] == "nccl-nvls_tree"


# -- the tuner's machine: forced channel counts -----------------------------------------------------


def test_a_forced_count_runs_on_at_most_the_communicators_channels():
    from collsynth.export.tuner.choose import Choice
    from collsynth.export.tuner.machine import forced_channels
    from collsynth.timing.tuning_model import kind_channels, tuning_setup
    from collsynth.topology import get_topology

    # forced_channels' docs: what the scheduler makes of the forced count, "at most the
    # communicator's". A tuner forcing 1000 ring channels on one DGX H100 gets what forcing the
    # communicator's own count gives, at a size (1 GiB) large enough to fill every channel.
    setup = tuning_setup(get_topology("DGX-H100"), runtime="nccl")
    most = kind_channels(setup, "ring")
    at_most = forced_channels(setup, "allreduce", Choice("ring", "simple", most), 1 << 30)
    assert forced_channels(setup, "allreduce", Choice("ring", "simple", 1000), 1 << 30) == \
        at_most <= most


def test_no_channel_count_is_worth_forcing_where_there_are_none():
    from collsynth.export.tuner.machine import channel_counts

    # powers of two up to the maximum, and the maximum: with a maximum of 0 no power of two
    # (1 and up) fits and 0 channels are no count a call can run on.
    assert channel_counts(0) == ()
    assert channel_counts(1) == (1,)


# -- the runtime's programs: slices and send/recv channels -------------------------------------------


@pytest.mark.parametrize("collective", ["broadcast", "reduce"])
def test_a_broadcast_and_a_reduce_ring_move_one_step_a_slice_in_simple(collective):
    from collsynth.timing.runtime_programs import runtime_program
    from collsynth.topology import get_topology

    # NCCL v2.21.5-1 src/include/collectives.h:19-21: BROADCAST_SLICESTEPS 1 and
    # REDUCE_SLICESTEPS 1 (the other rings NCCL_STEPS / 4): one step a slice, NCCL_BUFFSIZE /
    # NCCL_STEPS = 4 MiB / 8 = 512 KiB of data.
    built = runtime_program("ring", collective, get_topology("DGX-H100"), 2, protocol="Simple")
    assert built.slice_bytes == 512 * KiB


def test_only_simple_is_cut_to_one_step_a_slice():
    from collsynth.export.program import Program
    from collsynth.timing.runtime_programs import runtime_program
    from collsynth.topology import compose_nodes, get_topology

    # The tree runs ProtoSimple<1, 1> in Simple only; in LL128 (ProtoLL128) it keeps the
    # constants' slices: the program comes back unprepared, as in LL.
    two = compose_nodes(get_topology("DGX-H100"), 2)
    assert isinstance(runtime_program("tree", "allreduce", two, 2, protocol="LL128"), Program)
    assert isinstance(runtime_program("ring", "broadcast", get_topology("DGX-H100"), 2,
                                      protocol="LL128"), Program)


@pytest.mark.parametrize("parts, channels", [(1, 8), (2, 16)])
def test_send_recv_without_a_spread_runs_on_the_fewest_powers_of_two_that_hold_them(parts,
                                                                                     channels):
    from collsynth.timing.runtime_programs import runtime_program
    from collsynth.topology import get_topology

    # p2p_program's docs: channels "the fewest powers of two that hold ranks x parts". One DGX
    # H100, 8 ranks: 8 x 1 = 8 (a power of two already, not 16); 8 x 2 = 16.
    built = runtime_program("p2p", "alltoall", get_topology("DGX-H100"), parts, protocol="LL")
    assert built.nchannels == channels
