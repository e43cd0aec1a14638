"""MSCCL++ execution plans: MSCCL++'s own DSL plans are read and proved; corrupted ones are
refused with the rule they break (one table, one row per corruption).

The expected collective and layout of each DSL plan come from the DSL program that wrote it
(data/mscclpp-plans/README.md); each corruption's expected rule comes from what the change does
to the plan, argued in its row.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Callable

import pytest

from collsynth.errors import FileFormatError, InputTooLargeError
from collsynth.export.mscclpp import check_plan, parse_plan, plan_to_json, read_plan
from collsynth.export.mscclpp.checker import PROBLEM_KINDS
from collsynth.export.mscclpp.model import (BufferRef, ChannelGroup, GpuPlan, Operation, Plan,
                                            RemoteBuffer, RemoteBufferRefs, Threadblock)
from collsynth.export.mscclpp.model import Channel as Chan

DATA = Path(__file__).resolve().parents[2] / "data" / "mscclpp-plans"

#: file -> (collective, in place), from the DSL programs (collectives.py: AllGather, ...).
DSL_PLANS = {
    "sn_allgather_2gpu.json": ("allgather", True),
    "sn_allgather_pkt_8gpu.json": ("allgather", True),
    "sn_allgather_pkt_rppkt_8gpu.json": ("allgather", True),
    "sn_allgather_tbg.json": ("allgather", True),
    "sn_allgather_nvls_8gpu.json": ("allgather", True),
    "sn_allreduce_8gpu.json": ("allreduce", True),
    "sn_allreduce_naive_8gpu.json": ("allreduce", True),
    "sn_allreduce_pkt_8gpu.json": ("allreduce", True),
    "sn_allreduce_nvls_8gpu.json": ("allreduce", True),
    "sn_allreduce_pipeline.json": ("allreduce", True),
    "sn_alltoall_8gpu.json": ("alltoall", True),
    "sn_alltoall_pipeline_8gpu.json": ("alltoall", True),
    "sn_alltoall_ring_8gpu.json": ("alltoall", True),
    "sn_alltoall_ring_oop_8gpu.json": ("alltoall", False),
    "mn_allgather_2x4.json": ("allgather", True),
    "mn_allgather_pkt_2x4.json": ("allgather", True),
    "mn_allgather_tbg_16.json": ("allgather", False),
    "mn_reducescatter_2x4.json": ("reducescatter", True),
    "mn_reducescatter_pkt_2x4.json": ("reducescatter", True),
    "mn_send_recv_2x8.json": ("sendrecv", False),
}
#: Plans whose last port put (pws) is never flushed: the proxy may read the input after the
#: kernel ends (the DSL programs end with put_with_signal and no flush).
UNFLUSHED = {"mn_reducescatter_2x4.json", "mn_send_recv_2x8.json"}
#: Ranks per node of the multi-node plans (their DSL arguments).
NODES = {"mn_allgather_2x4.json": 4, "mn_allgather_pkt_2x4.json": 4,
         "mn_allgather_tbg_16.json": 8, "mn_reducescatter_2x4.json": 4,
         "mn_reducescatter_pkt_2x4.json": 4, "mn_send_recv_2x8.json": 8}


def test_the_data_holds_the_twenty_dsl_plans():
    assert sorted(p.name for p in DATA.glob("*.json")) == sorted(DSL_PLANS)


@pytest.mark.parametrize("name", sorted(DSL_PLANS))
def test_every_dsl_plan_is_read_and_proved(name):
    plan = read_plan(DATA / name)
    collective, inplace = DSL_PLANS[name]
    assert plan.collective == collective and plan.inplace is inplace
    report = check_plan(plan, ranks_per_node=NODES.get(name))
    assert report.ok, [str(p) for p in report.problems]
    assert report.collective == collective
    assert report.layouts_checked == (("in-place",) if inplace else ("out-of-place",))
    kinds = {w.kind for w in report.warnings}
    assert kinds == ({"async-read"} if name in UNFLUSHED else set())
    if name in UNFLUSHED:
        assert not check_plan(plan, strict=True).ok


@pytest.mark.parametrize("name", sorted(DSL_PLANS))
def test_every_dsl_plan_survives_writing_and_reading_again(name):
    plan = read_plan(DATA / name)
    again = parse_plan(plan_to_json(plan), source="again.json")
    assert again == plan
    # The writer keeps the DSL's keys and order: the same text, byte for byte.
    assert plan_to_json(plan) == (DATA / name).read_text() + "\n"


# -- corruptions ---------------------------------------------------------------------------------


def _ops(d: dict, rank: int, tb: int) -> list:
    return d["gpus"][rank]["threadblocks"][tb]["ops"]


def _at(ops: list, name: str, nth: int = 0) -> int:
    return [i for i, op in enumerate(ops) if op["name"] == name][nth]


def _remove(name: str, rank: int = 0, tb: int = 0) -> Callable[[dict], None]:
    def change(d):
        ops = _ops(d, rank, tb)
        del ops[_at(ops, name)]
    return change


def _duplicate(name: str, rank: int = 0, tb: int = 0, nop: bool = False):
    def change(d):
        ops = _ops(d, rank, tb)
        i = _at(ops, name)
        ops[i + 1:i + 1] = ([{"name": "nop"}] if nop else []) + [copy.deepcopy(ops[i])]
    return change


def _set(path: tuple, value) -> Callable[[dict], None]:
    def change(d):
        target = d
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
    return change


def _put_entry(rank: int, side: str, key: str, value):
    def change(d):
        ops = _ops(d, rank, 0)
        ops[_at(ops, "put")][side][0][key] = value
    return change


def _nop_before_signal(d):
    ops = _ops(d, 0, 0)
    i = _at(ops, "signal")
    assert ops[i - 1]["name"] == "nop"
    del ops[i - 1]


def _nop_after_wait(d):
    ops = _ops(d, 0, 0)
    i = _at(ops, "wait")
    assert ops[i + 1]["name"] == "nop"
    del ops[i + 1]


def _upkt_from_unwritten(d):
    for tb in d["gpus"][0]["threadblocks"]:
        for op in tb["ops"]:
            if op["name"] == "upkt":
                op["src_buff"][0]["index"] = 0   # rank 0's own chunk: nobody sends it packets
                return


def _ports_to_memory(d):
    for gpu in d["gpus"]:
        for ch in gpu["channels"]:
            if ch["channel_type"] == "port":
                ch["channel_type"] = "memory"


# (name, file, change, expected): expected is ("reader", text in the message) or (kind, text);
# ranks_per_node is given for the one node rule.
CORRUPTIONS: list[tuple[str, str, Callable[[dict], None], tuple[str, str]]] = [
    # Rank 1's put is signalled, but rank 0 no longer waits: the signal is left over.
    ("missing wait", "sn_allgather_2gpu.json", _remove("wait"), ("signal", "never waited")),
    # The copy out of scratch runs right after the wait, before the nop that shares it.
    ("missing nop after wait", "sn_alltoall_8gpu.json", _nop_after_wait,
     ("race", "nothing orders them")),
    # The signal no longer covers the put before it: rank 1 reads its scratch unordered.
    ("missing nop before signal", "sn_alltoall_8gpu.json", _nop_before_signal,
     ("race", "rank 1 s[chunk 0]")),
    # Rank 0 puts its chunk into rank 1's chunk 1 (rank 1's own): chunk 0 never arrives.
    ("wrong index", "sn_allgather_2gpu.json", _put_entry(0, "dst_buff", "index", 1),
     ("postcondition", "rank 1 o[chunk 0]")),
    # Two chunks from rank 1's o[1]: o has 2 chunks, so bytes 16..48 leave it.
    ("out-of-bounds size", "sn_allgather_2gpu.json",
     lambda d: [_put_entry(1, side, "size", 2)(d) for side in ("src_buff", "dst_buff")],
     ("bounds", "outside its 32 bytes")),
    # Scratch instead of output: the plan has no scratch at all.
    ("wrong buffer type", "sn_allgather_2gpu.json", _put_entry(0, "src_buff", "type", "s"),
     ("bounds", "s buffer")),
    ("unknown operation", "sn_allgather_2gpu.json",
     lambda d: _ops(d, 0, 0).__setitem__(0, {"name": "frob"}),
     ("reader", "ops[0].name = 'frob': not an operation MSCCL++ knows")),
    # The final reduction twice: the peers' contributions are counted twice.
    ("duplicated reduce", "mn_reducescatter_2x4.json", _duplicate("re", nop=True),
     ("postcondition", "counted 2 times")),
    # Rank 0 signals its channel to rank 2 instead of rank 1: rank 1 waits forever.
    ("mismatched channel", "sn_allreduce_8gpu.json",
     lambda d: _ops(d, 0, 0)[_at(_ops(d, 0, 0), "signal")].__setitem__("channel_ids", [1]),
     ("deadlock", "waits on memory channel 0 for a signal from rank 0")),
    ("extra signal", "sn_allgather_2gpu.json", _duplicate("signal"),
     ("signal", "never waited")),
    ("extra wait", "sn_allgather_2gpu.json", _duplicate("wait"),
     ("deadlock", "waits on memory channel 0")),
    ("index as a string", "sn_allgather_2gpu.json", _put_entry(0, "src_buff", "index", "0"),
     ("reader", "src_buff[0].index = '0': expected a whole number")),
    ("huge chunk count", "sn_allgather_2gpu.json", _set(("gpus", 0, "input_chunks"), 10 ** 20),
     ("reader", "input_chunks = 100000000000000000000")),
    ("inplace missing", "sn_allgather_2gpu.json", lambda d: d.pop("inplace"),
     ("reader", "the key 'inplace' is missing")),
    ("inplace a number", "sn_allgather_2gpu.json", _set(("inplace",), 1),
     ("reader", "inplace = 1: expected true or false")),
    ("threadblock ids out of order", "sn_allgather_tbg.json",
     _set(("gpus", 0, "threadblocks", 1, "id"), 2), ("structure", "ids must be 0, 1")),
    ("gpu id", "sn_allgather_2gpu.json", _set(("gpus", 1, "id"), 0),
     ("structure", "GPU rank does not match")),
    ("65 operations", "sn_allgather_2gpu.json",
     lambda d: _ops(d, 0, 0).extend([{"name": "nop"}] * 55), ("limit", "at most 64")),
    ("channel that does not exist", "sn_allgather_2gpu.json",
     _set(("gpus", 0, "threadblocks", 0, "channels", 0, "channel_ids"), [3]),
     ("structure", "memory channel 3 does not exist")),
    ("remote buffer for another channel type", "sn_allgather_2gpu.json",
     _set(("gpus", 0, "remote_buffers", 0, "access_channel_types"), ["port"]),
     ("structure", "access_channel_types are ['port']")),
    # The glres reads scratch the copy may still be writing.
    ("semaphore acquire removed", "sn_allreduce_pipeline.json",
     lambda d: _ops(d, 0, 1)[0]["ops"].pop(0), ("race", "(glres) reads it")),
    ("semaphore release removed", "sn_allreduce_pipeline.json",
     lambda d: _ops(d, 0, 0)[0]["ops"].pop(6), ("deadlock", "waits for semaphore 0")),
    ("barrier sizes disagree", "sn_allgather_tbg.json",
     lambda d: [op.__setitem__("num_threadblocks", 3) for op in _ops(d, 0, 0)
                if op["name"] == "barrier"], ("structure", "used with 4 and with 3")),
    ("packets never written", "sn_allgather_pkt_8gpu.json", _upkt_from_unwritten,
     ("deadlock", "nothing has written in this launch")),
    # Without LL the scratch is not doubled: packets leave it.
    ("packets in a Simple plan", "sn_allgather_pkt_8gpu.json", _set(("protocol",), "Simple"),
     ("bounds", "(LL packets)")),
    # Out of place, rank 1's input is not inside its output: o[1] is read unwritten.
    ("in-place plan read out of place", "sn_allgather_2gpu.json", _set(("inplace",), False),
     ("uninitialised", "before anything was written")),
    ("memory channel across nodes", "mn_send_recv_2x8.json", _ports_to_memory,
     ("connection", "on another node")),
    ("switch group without its twin", "sn_allreduce_nvls_8gpu.json",
     _set(("gpus", 3, "channels", 1, "rank_groups", 0, "ranks"), [0, 1, 2, 3, 4, 5, 6]),
     ("connection", "has no twin")),
    ("thread block group position", "sn_allgather_tbg.json",
     lambda d: [op.__setitem__("tbg_info", {"tb_id": 5, "tbg_size": 4})
                for op in _ops(d, 0, 1) if "tbg_info" in op],
     ("reader", "tbg_info.tb_id = 5")),
    ("one channel twice in a wait", "sn_allreduce_8gpu.json",
     lambda d: _ops(d, 0, 0)[_at(_ops(d, 0, 0), "wait")].__setitem__("channel_ids", [0, 0]),
     ("structure", "waits twice on one channel")),
    ("output chunks of an allgather", "sn_allgather_2gpu.json",
     lambda d: [g.__setitem__("output_chunks", 3) for g in d["gpus"]],
     ("structure", "Size per chunks inconsistent")),
    ("a multicast reduction removed", "sn_allreduce_nvls_8gpu.json", _remove("glres", 2, 3),
     ("postcondition", "lacks 7 contributions")),
    ("truncated file", "sn_allgather_2gpu.json", None, ("reader", "malformed JSON")),
]


@pytest.mark.parametrize("name,file,change,expected", CORRUPTIONS,
                         ids=[row[0] for row in CORRUPTIONS])
def test_a_corrupted_plan_is_refused_with_the_rule_named(name, file, change, expected):
    text = (DATA / file).read_text()
    if change is None:
        text = text[:500]
    else:
        data = json.loads(text)
        change(data)
        text = json.dumps(data)
    rule, fragment = expected
    if rule == "reader":
        with pytest.raises(FileFormatError) as info:
            parse_plan(text, source=file)
        assert fragment in str(info.value) and str(info.value).startswith(file)
        return
    assert rule in PROBLEM_KINDS
    plan = parse_plan(text, source=file)
    report = check_plan(plan, ranks_per_node=8 if "across nodes" in name else None)
    assert not report.ok
    named = [p.message for p in report.problems if p.kind == rule]
    assert any(fragment in m for m in named), (rule, [str(p) for p in report.problems][:5])


def test_the_table_has_twenty_corruptions_or_more():
    assert len(CORRUPTIONS) >= 20
    assert len({row[3][0] for row in CORRUPTIONS}) >= 10   # many different rules


# -- small plans for single rules ------------------------------------------------------------------


def _one_rank(ops0: tuple, ops1: tuple = ()) -> Plan:
    """An in-place allreduce on one rank of 2 chunks (2 scratch chunks), one or two
    threadblocks."""
    tbs = (Threadblock(0, ops0),) + ((Threadblock(1, ops1),) if ops1 else ())
    return Plan("t", "allreduce", "Simple", True, (GpuPlan(0, 2, 2, 2, tbs),))


def _ref(buf: str, index: int, size: int = 1) -> BufferRef:
    return BufferRef(index, size, type=buf)


def test_a_write_not_computed_from_the_input_it_replaces_races_with_its_read():
    # tb 0 copies i[0] away while tb 1 overwrites i[0] with i[1]: a real write-after-read race
    # (nothing orders them, and the new value does not come from the read).
    read = (Operation("copy", (_ref("i", 0),), (_ref("s", 0),)),)
    write = (Operation("copy", (_ref("i", 1),), (_ref("i", 0),)),)
    report = check_plan(_one_rank(read, write))
    assert any(p.kind == "race" and "i[chunk 0]" in p.message for p in report.problems)


def test_operations_of_one_threadblock_are_ordered_by_a_nop_or_the_same_thread():
    # Copying a range away and back: thread t moves units t, t + threads, ... of the same
    # range both times, so no nop is needed.
    away = Operation("copy", (_ref("i", 0, 2),), (_ref("s", 0, 2),))
    back = Operation("copy", (_ref("s", 0, 2),), (_ref("i", 0, 2),))
    assert check_plan(_one_rank((away, back))).ok
    # Reading s[1] alone starts the threads one chunk later: another thread wrote each unit,
    # so only a nop orders the two operations.
    shifted = Operation("copy", (_ref("s", 1),), (_ref("s", 0),))
    report = check_plan(_one_rank((away, shifted)))
    assert any(p.kind == "race" and "s[chunk 1]" in p.message for p in report.problems)
    assert not any(p.kind == "race" for p in
                   check_plan(_one_rank((away, Operation("nop"), shifted))).problems)


def _two_ranks(op0: tuple, op1: tuple) -> Plan:
    """An out-of-place 2-rank allgather (1 input chunk) over one memory channel each way."""
    gpus = []
    for r, ops in ((0, op0), (1, op1)):
        gpus.append(GpuPlan(r, 1, 2, 1, (Threadblock(0, ops, (ChannelGroup("memory", (0,)),),
                                                     (RemoteBufferRefs("memory", (0,)),)),),
                            (Chan("memory", (1 - r,)),), (RemoteBuffer(1 - r, "o", ("memory",)),)))
    return Plan("ag", "allgather", "Simple", False, tuple(gpus))


def _allgather_ops(r: int, put: str = "put", signal: str = "signal", wait: str = "wait"):
    return (Operation("copy", (_ref("i", 0),), (_ref("o", r),)),
            Operation(put, (_ref("i", 0),), (BufferRef(r, 1, buffer_id=0),),
                      channel_type="memory"),
            Operation("nop"), Operation(signal, channel_type="memory", channel_ids=(0,)),
            Operation(wait, channel_type="memory", channel_ids=(0,)), Operation("nop"),
            # Read what the peer put (into scratch, harmlessly).
            Operation("copy", (_ref("o", 1 - r),), (_ref("s", 0),)))


def test_a_hand_written_allgather_is_correct():
    assert check_plan(_two_ranks(_allgather_ops(0), _allgather_ops(1))).ok


@pytest.mark.parametrize("signal,wait", [("rlxsignal", "rlxwait"), ("rlxsignal", "wait"),
                                         ("signal", "rlxwait")])
def test_relaxed_signals_and_waits_do_not_order_data(signal, wait):
    plan = _two_ranks(_allgather_ops(0, signal=signal, wait=wait),
                      _allgather_ops(1, signal=signal, wait=wait))
    races = [p.message for p in check_plan(plan).problems if p.kind == "race"]
    # The peer's put into o and the copy after the wait are unordered: a relaxed signal
    # publishes nothing and a relaxed wait acquires nothing.
    assert any("(put) writes it" in m and "(copy) reads it" in m for m in races)


def test_a_memory_channel_pws_does_not_signal():
    # The kernel's memory branch of put-with-signal only copies: the explicit signal is gone,
    # so the waits never end.
    def ops(r):
        return tuple(op for op in _allgather_ops(r, put="pws") if op.name != "signal")
    report = check_plan(_two_ranks(ops(0), ops(1)))
    assert any(p.kind == "deadlock" for p in report.problems)


def test_a_plan_too_large_to_execute_is_refused_before_the_work(monkeypatch):
    import collsynth.export.mscclpp.checker as checker

    plan = read_plan(DATA / "sn_alltoall_ring_8gpu.json")
    monkeypatch.setattr(checker, "MAX_CHECKED_CELLS", 1000)
    with pytest.raises(InputTooLargeError, match="cell accesses"):
        check_plan(plan)
