"""Blind spots found by hand mutation testing (round 5: the tuning model's chunking of PAT, NVLS,
NVLS-tree and the trees, the runtime's PAT and send/recv programs, the user's runtime version, the
synthesis cache, the MSCCL++ checker's plan rules, the export's replay against the postcondition):
each test pins one rule that a small, plausible bug could break without any other test noticing.
Expected values are worked out by hand in the comments, from the runtime's source rules (quoted)
and the docstrings, not from the code's output.
"""

from __future__ import annotations

import dataclasses

import pytest

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30


def _nccl(**changes):
    from tests.timing.test_tuning_model import nccl

    return nccl(**changes)


# -- the tuning model's chunking (calcCollChunking, src/enqueue.cc) --------------------------------


def test_the_ll128_tree_chunk_follows_nccls_two_loops():
    from collsynth.timing.tuning_model import call_shape
    from tests.timing.test_tuning_model import H100_2N

    # NCCL (calcCollChunking): nstepsLL128 = 1 + log2i(nNodes) + 0.1 * ppn, then
    #   while (nBytes / (nChannels*chunkSize) < nstepsLL128*64/ppn && chunkSize > 131072) /= 2
    #   while (nBytes / (nChannels*chunkSize) < nstepsLL128*16/ppn && chunkSize > 32768) /= 2
    # Two H100 nodes of 8: depth 1 + 1 + 0.8 = 2.8, thresholds 22.4 and 5.6 chunks a channel; the
    # LL128 step carries 576_000 data bytes; the chunk is then cut to whole 1920-byte grains.
    # 16 channels (the precondition).
    # 4 MiB: 262_144 B a channel: 576000 (0.46) -> 288000 -> 144000 (1.8) -> 72000 (3.6; not
    #   above 131072: the first loop ends); 3.6 < 5.6 -> 36000 (7.3): 36000 // 1920 = 18 grains =
    #   34_560.
    # 56 MiB: 3_670_016 B a channel: 576000 (6.4) -> 288000 (12.7) -> 144000 (25.5 >= 22.4):
    #   144_000 = 75 grains.
    # 64 MiB: 4 MiB a channel: -> 144000 (29.1): 144_000.
    shapes = [call_shape(H100_2N, "allreduce", "tree", "LL128", s) for s in
              (4 * MiB, 56 * MiB, 64 * MiB)]
    assert {s.channels for s in shapes} == {16}
    assert [s.chunk_bytes for s in shapes] == [34_560, 144_000, 144_000]


def test_rccls_tree_chunk_keeps_64_kib_with_eight_chunks_a_channel():
    from collsynth.timing.tuning_model import call_shape
    from tests.timing.test_tuning_model import rccl

    # RCCL's tree Simple rule: 512 KiB halved while a channel has fewer chunks than depth x 8
    # (down to 128 KiB), x 4 (64 KiB), x 1 (32 KiB). Two MI300X-like nodes of 8: depth
    # 8 - 1 + log2 2 = 8. 24 MiB over 32 channels is 768 KiB a channel:
    # x8 stage: 768K // 512K = 1 < 64 -> 256K (3) -> 128K (floor); x4: 768K // 128K = 6 < 32 ->
    # 64K (floor); x1: 768K // 64K = 12, not < 8: 64 KiB stays (a x2 last stage would give 32K).
    # Steps: one chunk per step, ceil(768K / 64K) = 12.
    shape = call_shape(rccl("gfx942", ranks=16, nodes=2), "allreduce", "tree", "Simple", 24 * MiB)
    assert shape.channels == 32  # the precondition of the hand count
    assert (shape.chunk_bytes, shape.steps) == (64 * KiB, 12)


def test_nvls_tree_chunk_drops_to_32_kib_only_under_one_chunk_a_head():
    from collsynth.timing.tuning_model import call_shape
    from tests.timing.test_tuning_model import H100_NVLS

    # NVLS-tree on 2 nodes: chunk 128 KiB, then for (factor, size) in (32, 256K), (16, 128K),
    # (4, 64K), (1, 32K): nBytes < factor x heads x chunk and chunk > size -> size. 8 heads,
    # 16 channels. 12 MiB: 768 KiB a channel: 4 x 8 x 128K = 4 MiB -> 64K; 1 x 8 x 64K = 512 KiB,
    # 768K is not under it: 64 KiB. 8 MiB (512 KiB a channel, not under 512 KiB): 64 KiB too.
    setup = dataclasses.replace(H100_NVLS, ranks=16, nodes=2)
    shapes = [call_shape(setup, "allreduce", "nvls_tree", "Simple", s) for s in
              (12 * MiB, 8 * MiB)]
    assert {s.channels for s in shapes} == {16}
    assert [s.chunk_bytes for s in shapes] == [64 * KiB, 64 * KiB]


def test_an_nvls_loop_moves_one_chunk_per_head():
    from collsynth.timing.tuning_model import call_shape
    from tests.timing.test_tuning_model import H100_NVLS

    # calcCollChunking, NVLS: nstepsPerLoop = 1, nchunksPerLoop = nvls.nHeads. 1 GiB over 16
    # channels is 64 MiB a channel, in 128 KiB chunks; a loop moves 8 heads x 128 KiB = 1 MiB:
    # 64 loops of one step (one chunk per head: 512 steps if a loop moved a single chunk).
    shape = call_shape(H100_NVLS, "allreduce", "nvls", "Simple", GiB)
    assert shape.channels == 16  # the precondition
    assert (shape.chunk_bytes, shape.steps) == (128 * KiB, 64)


def test_nvls_across_nodes_under_150_gbps_moves_32_kib_chunks():
    from collsynth.timing.tuning_model import bandwidth_gbps, call_shape
    from tests.timing.test_tuning_model import H100_NVLS

    # calcCollChunking, NVLS: "if (comm->nNodes > 1 && comm->bandwidths[AllReduce][NVLS][Simple]
    # < 150) maxChunkSize = 32768". Two H100 nodes without CollNet (NVLS's allreduce bandwidth
    # below 150 GB/s): 1 GiB over 16 channels is 64 MiB a channel, not under 64 x 8 heads x
    # 32 KiB = 16 MiB, so 32 KiB chunks; a loop moves 8 x 32 KiB: 64 MiB / 256 KiB = 256 steps.
    # One node keeps NCCL_NVLS_CHUNKSIZE, 128 KiB (64 steps).
    two = dataclasses.replace(H100_NVLS, ranks=16, nodes=2)
    assert bandwidth_gbps(two, "allreduce", "nvls", "Simple") < 150  # the precondition
    shape = call_shape(two, "allreduce", "nvls", "Simple", GiB)
    assert shape.channels == 16
    assert (shape.chunk_bytes, shape.steps) == (32 * KiB, 256)
    assert call_shape(H100_NVLS, "allreduce", "nvls", "Simple", GiB).chunk_bytes == 128 * KiB


def test_the_pat_chunk_counts_chunks_per_channel():
    from collsynth.timing.tuning_model import call_shape

    # NCCL (calcCollChunking): allgather PAT
    #   while (chunkSize*nChannels*32 > nBytes && chunkSize > 65536) chunkSize /= 2;
    # On 16 channels, 64 MiB: 512K x 16 x 32 = 256 MiB > 64 MiB -> 256K (128 MiB) -> 128K
    # (64 MiB, not above): 128 KiB. 256 MiB: 512K x 16 x 32 = 256 MiB, not above: 512 KiB.
    # (Counting the whole call as one channel's would keep 512 KiB at 64 MiB.)
    setup = _nccl(pat=True, ranks=16, nodes=16, channels=8, comm=16)
    shapes = [call_shape(setup, "allgather", "pat", "Simple", s) for s in (64 * MiB, 256 * MiB)]
    assert {s.channels for s in shapes} == {16}
    assert [s.chunk_bytes for s in shapes] == [128 * KiB, 512 * KiB]


# -- the runtime's programs ----------------------------------------------------------------------


def test_send_recv_channels_are_the_next_power_of_two_of_the_parts():
    from collsynth.timing.runtime_programs import RUNTIME_PROGRAMS
    from collsynth.topology import get_topology

    # 3 ranks, 2 parts per peer: 6 parts take the fewest powers of two that hold them, 8
    # channels (p2p_program's default). Part k of round d runs on channel bitreverse3(d) + k:
    # d = 1 -> 0b100 = 4, d = 2 -> 0b010 = 2; with the copy's channel 0, rank 0 uses
    # {0, 4, 5, 2, 3}. (Six channels are not a power of two: refused.)
    built = RUNTIME_PROGRAMS["p2p"].build("alltoall", get_topology("fully-connected:3"), 2, "LL")
    assert sorted({tb.chan for tb in built.gpus[0].threadblocks}) == [0, 2, 3, 4, 5]


def test_pat_runs_on_the_communicators_channels_by_default():
    from collsynth.timing.runtime_programs import runtime_program
    from collsynth.topology import get_topology

    # PAT's default channel count is the communicator's, the same as the runtime's rings (one
    # ring per channel), not one channel.
    h100 = get_topology("dgx-h100")
    rings = runtime_program("ring", "allgather", h100, protocol="LL").nchannels
    assert rings > 1
    assert runtime_program("pat", "allgather", h100).program.nchannels == rings


# -- a runtime version a user names (parse_given_version) ---------------------------------------


@pytest.mark.parametrize("text", ["2.1234567", "2.18.1234567", "2.18+", "2.18+a b", "v2"])
def test_a_given_version_refuses_long_parts_and_an_empty_build(text):
    from collsynth.runtimes import parse_given_version

    # MAJOR.MINOR[.PATCH] of at most six digits each, and a +BUILD of 1 to 64 letters, digits
    # and dots: a seven-digit minor or patch, a bare '+' or a build with a space is no version.
    with pytest.raises(ValueError, match="not a runtime version"):
        parse_given_version(text)


def test_a_given_version_ignores_surrounding_blanks():
    from collsynth.runtimes import parse_given_version

    # what a user types into a field may carry blanks (a JSON value, a quoted option)
    assert parse_given_version("  2.19.3\n") == (2, 19)
    assert parse_given_version("\tv2.21+rocm6.2 ") == (2, 21)


def test_a_long_bad_version_is_echoed_cut_to_64_characters():
    from collsynth.runtimes import parse_given_version

    # 100 characters: the message shows the first 64 and '...', not the whole text.
    text = "9" * 100
    with pytest.raises(ValueError) as caught:
        parse_given_version(text)
    assert repr("9" * 64 + "...") in str(caught.value)
    assert "9" * 65 not in str(caught.value)
    # exactly 64 characters are shown whole
    with pytest.raises(ValueError) as caught:
        parse_given_version("x" * 64)
    assert repr("x" * 64) in str(caught.value) and "..." not in str(caught.value)


# -- the synthesis cache ---------------------------------------------------------------------------


def _ring_front():
    from collsynth.collective import allgather
    from collsynth.plan import SynthOptions, synthesize_front
    from collsynth.topology import get_topology

    ring = get_topology("ring:4")
    return ring, allgather(4), tuple(synthesize_front(ring, allgather(4),
                                                      options=SynthOptions()).algorithms)


def test_a_complete_cached_search_is_final_whatever_time_is_asked(tmp_path):
    from collsynth.plan import FrontCache

    # Only an incomplete search made with less time than asked for is searched again; a
    # complete search found the whole front, so a longer limit finds nothing more.
    ring, coll, front = _ring_front()
    cache = FrontCache(tmp_path)
    cache.put(ring, coll, front, engine="pareto", options={}, complete=True, time_limit=5.0,
              detail="by hand")
    hit = cache.get(ring, coll, engine="pareto", options={}, time_limit=500.0)
    assert hit is not None and hit.complete and hit.time_limit == 5.0
    assert hit.detail == "by hand"


def test_an_incomplete_cached_search_without_a_limit_is_searched_again(tmp_path):
    from collsynth.plan import FrontCache

    # an incomplete search whose time limit is unknown cannot be known to have had as much
    # time as asked for
    ring, coll, front = _ring_front()
    cache = FrontCache(tmp_path)
    cache.put(ring, coll, front, engine="pareto", options={}, complete=False, time_limit=None)
    assert cache.get(ring, coll, engine="pareto", options={}, time_limit=1.0) is None
    assert cache.get(ring, coll, engine="pareto", options={}) is not None  # no limit asked


def test_a_cache_manifest_naming_a_path_is_ignored(tmp_path):
    import json

    from collsynth.plan import FrontCache

    # the manifest lists file names inside the entry's folder; a name with a folder in it
    # ('sub/algorithm-0.json') is a damaged or foreign entry, even when that file is there
    ring, coll, front = _ring_front()
    cache = FrontCache(tmp_path)
    cache.put(ring, coll, front[:1], engine="pareto", options={}, complete=True, time_limit=None)
    folder = cache.entry_directory(ring, coll, engine="pareto", options={})
    (folder / "sub").mkdir()
    (folder / "sub" / "algorithm-0.json").write_text((folder / "algorithm-0.json").read_text())
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["files"] = ["sub/algorithm-0.json"]
    (folder / "manifest.json").write_text(json.dumps(manifest))
    assert cache.get(ring, coll, engine="pareto", options={}) is None


def test_a_cached_algorithm_on_other_links_is_ignored(tmp_path):
    from collsynth.algorithm.fileformat import save_algorithm
    from collsynth.plan import FrontCache
    from collsynth.topology import get_topology

    # An entry's algorithms are on the key's links. One stored on a fully connected 4 (a
    # superset of the ring's links) is not the ring's, though its steps would verify there.
    ring, coll, front = _ring_front()
    cache = FrontCache(tmp_path)
    cache.put(ring, coll, front[:1], engine="pareto", options={}, complete=True, time_limit=None)
    folder = cache.entry_directory(ring, coll, engine="pareto", options={})
    save_algorithm(dataclasses.replace(front[0], topology=get_topology("fully-connected:4")),
                   folder / "algorithm-0.json")
    assert cache.get(ring, coll, engine="pareto", options={}) is None


def test_an_empty_xdg_cache_home_means_the_home_cache(monkeypatch, tmp_path):
    from pathlib import Path

    from collsynth.plan.cache import default_cache_directory

    # XDG: an empty $XDG_CACHE_HOME is as if unset: ~/.cache
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("XDG_CACHE_HOME", "")
    assert default_cache_directory() == Path(tmp_path) / ".cache" / "collsynth"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_directory() == tmp_path / "xdg" / "collsynth"


# -- the MSCCL++ checker: a sendrecv delivers each rank another rank's input ---------------------


def _self_copy_sendrecv(ranks: int):
    """A sendrecv plan in which every rank copies its own input to its own output (no channel:
    nothing else for the checker to refuse)."""
    import json

    from collsynth.export.mscclpp import parse_plan

    copy = {"name": "copy", "src_buff": [{"type": "i", "index": 0, "size": 1}],
            "dst_buff": [{"type": "o", "index": 0, "size": 1}]}
    gpus = [{"id": r, "input_chunks": 1, "output_chunks": 1, "scratch_chunks": 0, "channels": [],
             "remote_buffers": [], "semaphores": [],
             "threadblocks": [{"id": 0, "ops": [copy], "channels": [],
                               "remote_buffer_refs": []}]} for r in range(ranks)]
    plan = {"name": "self", "collective": "sendrecv", "protocol": "Simple", "inplace": False,
            "reuse_resources": False, "num_threads_per_block": 1024,
            "use_double_scratch_buffer": False, "buffer_alignment": 16, "min_message_size": 0,
            "max_message_size": 2 ** 64 - 1, "gpus": gpus}
    return parse_plan(json.dumps(plan), source="self.json")


def test_a_sendrecv_that_keeps_each_input_at_home_is_wrong():
    from collsynth.export.mscclpp import check_plan

    # Each output holds its own rank's input, whole and in order: a copy, not a send to
    # another rank. Both ranks' outputs are wrong.
    report = check_plan(_self_copy_sendrecv(2))
    assert not report.ok
    assert [p.message for p in report.problems if p.kind == "postcondition"] == [
        "rank 0's output is not the input of another rank",
        "rank 1's output is not the input of another rank"]


def test_a_sendrecv_input_delivered_to_two_ranks_is_wrong():
    from collsynth.export.mscclpp.checker import _sendrecv
    from collsynth.export.mscclpp.model import Plan

    # The sendrecv rule itself, on a finished run: 3 ranks, rank 0's input in the outputs of
    # ranks 1 and 2, rank 1's in rank 0's. Every output is another rank's input, but a
    # sendrecv sends each input to one rank: rank 0's reaches two.
    class Run:
        outputs = {0: ((1, 0),), 1: ((0, 0),), 2: ((0, 0),)}

        def value(self, rank, buffer, cell):
            assert (buffer, cell) == ("o", 0)
            return self.outputs[rank]

    plan = _self_copy_sendrecv(3)
    assert isinstance(plan, Plan) and plan.num_ranks == 3
    found = _sendrecv(Run(), plan, lambda rank, buffer: 1)
    assert [p.message for p in found] == [
        "rank 0's input reaches ranks [1, 2]; a sendrecv sends it to one"]


def test_an_alltoall_plan_needs_a_whole_number_of_chunks_per_peer():
    import json
    from pathlib import Path

    from collsynth.export.mscclpp import check_plan, parse_plan

    # An alltoall's input is one block per peer: 4 chunks cannot be split among 8 ranks,
    # though input and output agree (4 and 4). The plan is refused on its chunk counts.
    data = Path(__file__).resolve().parents[1] / "data" / "mscclpp-plans" / "sn_alltoall_8gpu.json"
    plan = json.loads(data.read_text())
    for gpu in plan["gpus"]:
        gpu["input_chunks"] = gpu["output_chunks"] = 4
    report = check_plan(parse_plan(json.dumps(plan), source="alltoall-4.json"))
    assert not report.ok
    assert [p.kind for p in report.problems] == ["structure"]
    assert "alltoall on 8 ranks with input_chunks=4 and output_chunks=4" in \
        report.problems[0].message


# -- export: a lowering whose only fault is a wrong output is refused ----------------------------


def test_an_export_whose_only_fault_is_the_postcondition_is_refused(monkeypatch, tmp_path):
    import importlib

    from collsynth.export.check import check_program
    from tests.export.test_export_refuses_wrong_lowering import RUNTIMES, ring_allgather

    # The ring allgather's last step is rank 3's receive of chunk 0 into o[0]. Landing it in
    # o[1] instead leaves a well-formed program with nothing racing and nothing stuck (o[1] is
    # written by the step before, in the same thread block): only the output is wrong (o[0]
    # never written, o[1] holding chunk 0). The export must replay the program against the
    # allgather's postcondition and refuse it, writing nothing.
    real = importlib.import_module("collsynth.export.lower").lower

    def wrong(algorithm, **options):
        program = real(algorithm, **options)
        *gpus, gpu = program.gpus
        *tbs, tb = gpu.threadblocks
        last = tb.steps[-1]
        assert (last.type, last.dstbuf, last.dstoff) == ("r", "o", 0)
        tb = dataclasses.replace(tb, steps=tb.steps[:-1] + (dataclasses.replace(last, dstoff=1),))
        return dataclasses.replace(program, gpus=(*gpus, dataclasses.replace(
            gpu, threadblocks=(*tbs, tb))))

    for runtime in RUNTIMES:
        report = check_program(wrong(ring_allgather(), runtime=runtime), runtime=runtime,
                               strict=True)
        assert {p.kind for p in report.problems} == {"postcondition"}, runtime  # precondition
    _exports_refuse(monkeypatch, tmp_path, wrong, "fails the check: postcondition")


# -- fixed with this round: the tuning model counts chunks a channel as NCCL does ----------------


def test_the_ll128_tree_counts_whole_chunks_a_channel():
    from collsynth.timing.tuning_model import call_shape
    from tests.timing.test_tuning_model import H100_2N

    # NCCL divides in integers: nBytes / (nChannels*chunkSize) < nstepsLL128*64/ppn ("we are
    # OK with the division on the left side of the < operand being integer"). Two H100 nodes
    # of 8 (threshold 2.8 x 64 / 8 = 22.4) on 16 channels, 52_300_800 B: at the 144_000 chunk,
    # 52_300_800 // (16 x 144_000) = 22 (22.7 before rounding) < 22.4 -> 72_000, no longer
    # above 131_072; the second loop: 52_300_800 // (16 x 72_000) = 45, not < 5.6. 72_000 cut
    # to whole 1920-byte grains: 37 x 1920 = 71_040 (a fractional count kept 144_000).
    shape = call_shape(H100_2N, "allreduce", "tree", "LL128", 52_300_800)
    assert shape.channels == 16  # the precondition
    assert shape.chunk_bytes == 71_040


def test_the_pat_chunk_compares_the_whole_call_with_its_channels_chunks():
    from collsynth.timing.tuning_model import call_shape

    # NCCL: while (chunkSize*nChannels*32 > nBytes && chunkSize > 65536) chunkSize /= 2.
    # 16 channels, 64 MiB - 8 B: 128 KiB x 16 x 32 = 64 MiB > 64 MiB - 8 -> 64 KiB (the
    # floor). Rounding a channel's share up to whole bytes first (4 MiB) kept 128 KiB.
    setup = _nccl(pat=True, ranks=16, nodes=16, channels=8, comm=16)
    shape = call_shape(setup, "allgather", "pat", "Simple", 64 * MiB - 8)
    assert shape.channels == 16  # the precondition
    assert shape.chunk_bytes == 64 * KiB


def test_an_export_that_writes_the_callers_input_is_refused(monkeypatch, tmp_path):
    import importlib

    from collsynth.export.check import check_program
    from collsynth.export.program import XmlStep
    from tests.export.test_export_refuses_wrong_lowering import RUNTIMES, ring_allgather

    # Rank 3 of the ring allgather: tb 0 copies i[0] to o[3]; tb 1 sends i[0], then receives
    # into o[2], o[1], o[0]. A wrong lowering appends to tb 0 a copy of o[0] into i[0], after
    # tb 1's last receive (a dependency, so nothing races): every output is right, but an
    # out-of-place call changed its caller's input. The checker calls that a warning unless
    # strict; an export is strict and refuses it.
    real = importlib.import_module("collsynth.export.lower").lower

    def wrong(algorithm, **options):
        program = real(algorithm, **options)
        *gpus, gpu = program.gpus
        tb0, tb1 = gpu.threadblocks
        last = len(tb1.steps) - 1
        tb1 = dataclasses.replace(tb1, steps=tb1.steps[:-1] + (
            dataclasses.replace(tb1.steps[-1], hasdep=1),))
        tb0 = dataclasses.replace(tb0, steps=tb0.steps + (
            XmlStep(len(tb0.steps), "cpy", "o", 0, "i", 0, 1, depid=tb1.id, deps=last),))
        return dataclasses.replace(program, gpus=(*gpus, dataclasses.replace(
            gpu, threadblocks=(tb0, tb1))))

    for runtime in RUNTIMES:
        program = wrong(ring_allgather(), runtime=runtime)
        assert check_program(program, runtime=runtime).ok  # the precondition: a warning only
        assert [p.kind for p in check_program(program, runtime=runtime, strict=True).problems] \
            == ["send-buffer-write"]
    _exports_refuse(monkeypatch, tmp_path, wrong, "send-buffer-write")


def _exports_refuse(monkeypatch, tmp_path, wrong, match: str) -> None:
    """Every MSCCL XML runtime's export, lowering with ``wrong``, raises an ExportError
    matching ``match`` and writes nothing."""
    import importlib

    from collsynth.errors import ExportError
    from tests.export.test_export_refuses_wrong_lowering import RUNTIMES, ring_allgather

    lowering = importlib.import_module("collsynth.export.lower")
    pipeline = importlib.import_module("collsynth.export.pipeline")
    monkeypatch.setattr(lowering, "lower", wrong)
    monkeypatch.setattr(pipeline, "lower", wrong)
    for runtime in RUNTIMES:
        out = tmp_path / f"{runtime}.xml"
        with pytest.raises(ExportError, match=match):
            pipeline.export_algorithm(ring_allgather(), out, runtime=runtime)
        assert not out.exists()
