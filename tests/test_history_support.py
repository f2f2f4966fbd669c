"""Checks shared by the history tests, and tests that the checks catch breakage.

check_snapshot() asserts what PyTorch's viewers rely on: blocks tile their
segments, the segment sums match the blocks, segments do not overlap, and
replaying each device's trace backwards from the final segments (as
MemoryViz's "Allocator State History" does) never needs a block or segment
that is not there, and never leaves a block outside every segment.
"""

from __future__ import annotations

import copy

import pytest

ACTIVE = ("active_allocated", "active_pending_free")
STATES = ("inactive",) + ACTIVE


def check_tiling(snap: dict) -> None:
    by_device: dict = {}
    for i, seg in enumerate(snap["segments"]):
        where = f"segments[{i}]"
        addr = seg["address"]
        total = alloc = active = requested = 0
        for j, b in enumerate(seg["blocks"]):
            assert b["state"] in STATES, f"{where}.blocks[{j}] has state {b['state']!r}"
            assert b["address"] == addr, f"{where}.blocks[{j}] does not start where the last ended"
            assert b["size"] > 0, f"{where}.blocks[{j}] is empty"
            assert isinstance(b["frames"], list)
            addr += b["size"]
            total += b["size"]
            if b["state"] == "active_allocated":
                alloc += b["size"]
            if b["state"] in ACTIVE:
                active += b["size"]
                requested += b["requested_size"]
                assert 0 < b["requested_size"] <= b["size"]
        assert total == seg["total_size"], f"{where}: blocks sum to {total}, not total_size"
        assert alloc == seg["allocated_size"], f"{where}: allocated_size disagrees"
        assert active == seg["active_size"], f"{where}: active_size disagrees"
        assert requested == seg["requested_size"], f"{where}: requested_size disagrees"
        by_device.setdefault(seg["device"], []).append((seg["address"], seg["total_size"]))
    for dev, spans in by_device.items():
        spans.sort()
        for (a0, s0), (a1, _) in zip(spans, spans[1:]):
            assert a0 + s0 <= a1, f"device {dev}: segments at {a0:#x} and {a1:#x} overlap"


def fold_frees(trace: list) -> list:
    """MemoryViz's annotate_snapshot: free_requested + free_completed -> free."""
    out = []
    for e in trace:
        e = dict(e)
        if (e["action"] == "free_completed" and out and out[-1]["action"] == "free_requested"
                and out[-1]["addr"] == e["addr"]):
            out[-1]["action"] = "free"
            continue
        out.append(e)
    return out


def _find(segments: list, addr: int, size: int = 1):
    for s in segments:
        if s["addr"] <= addr and addr + size <= s["addr"] + s["size"]:
            return s
    return None


def replay_backwards(snap: dict, device: int, check_every: int = 1) -> int:
    """Undo the trace of ``device`` from the last event to the first.

    Returns the number of events undone; raises AssertionError where
    MemoryViz would dereference a missing block or segment.
    """
    segments = [{"addr": s["address"], "size": s["total_size"], "stream": s["stream"]}
                for s in snap["segments"] if s["device"] == device]
    blocks = {}
    for s in snap["segments"]:
        if s["device"] != device:
            continue
        for b in s["blocks"]:
            if b["state"] in ACTIVE:
                blocks[b["address"]] = {"size": b["size"], "pending": b["state"] != ACTIVE[0]}
    trace = fold_frees(snap["device_traces"][device]) if device < len(snap["device_traces"]) else []

    def map_segment(merge: bool, addr: int, size: int, stream: int) -> None:
        for s in segments:
            assert not (s["addr"] < addr + size and addr < s["addr"] + s["size"]), (
                f"undoing a segment release at {addr:#x} overlaps a live segment")
        seg = {"addr": addr, "size": size, "stream": stream}
        segments.append(seg)
        segments.sort(key=lambda s: s["addr"])
        if merge:
            i = segments.index(seg)
            if i + 1 < len(segments):
                nxt = segments[i + 1]
                if seg["addr"] + seg["size"] == nxt["addr"] and seg["stream"] == nxt["stream"]:
                    seg["size"] += nxt["size"]
                    segments.pop(i + 1)
            if i > 0:
                prv = segments[i - 1]
                if prv["addr"] + prv["size"] == seg["addr"] and prv["stream"] == seg["stream"]:
                    prv["size"] += seg["size"]
                    segments.pop(i)

    def unmap_segment(merge: bool, addr: int, size: int) -> None:
        if not merge:
            hits = [s for s in segments if s["addr"] == addr]
            assert hits, f"undoing segment_alloc at {addr:#x}: no such segment"
            assert hits[0]["size"] == size, f"segment at {addr:#x} has another size"
            segments.remove(hits[0])
            return
        s = _find(segments, addr, size)
        assert s is not None, f"undoing segment_map at {addr:#x}: no segment contains it"
        end, s_end = addr + size, s["addr"] + s["size"]
        if s["addr"] == addr:
            s["addr"] += size
            s["size"] -= size
            if s["size"] == 0:
                segments.remove(s)
        elif s_end == end:
            s["size"] -= size
        else:
            s["size"] = addr - s["addr"]
            segments.append({"addr": end, "size": s_end - end, "stream": s["stream"]})
            segments.sort(key=lambda x: x["addr"])

    for n, e in enumerate(reversed(trace)):
        act = e["action"]
        if act == "free":
            assert e["addr"] not in blocks, f"undoing free at {e['addr']:#x}: block still live"
            blocks[e["addr"]] = {"size": e["size"], "pending": False}
        elif act == "free_requested":
            assert e["addr"] in blocks, f"undoing free_requested at {e['addr']:#x}: no block"
            blocks[e["addr"]]["pending"] = False
        elif act == "free_completed":
            blocks[e["addr"]] = {"size": e["size"], "pending": True}
        elif act == "alloc":
            assert e["addr"] in blocks, f"undoing alloc at {e['addr']:#x}: no block"
            del blocks[e["addr"]]
        elif act in ("segment_free", "segment_unmap"):
            map_segment(act == "segment_unmap", e["addr"], e["size"], e["stream"])
        elif act in ("segment_alloc", "segment_map"):
            unmap_segment(act == "segment_map", e["addr"], e["size"])
        else:
            assert act in ("oom", "snapshot"), f"unexpected action {act!r}"
        if n % check_every == 0 or n == len(trace) - 1:
            for addr, b in blocks.items():
                assert _find(segments, addr, b["size"]) is not None, (
                    f"after undoing event -{n + 1} ({act}), block {addr:#x} lies in no segment")
    return len(trace)


def check_snapshot(snap: dict, check_every: int = 1) -> int:
    """All the checks; returns the number of events replayed."""
    assert set(snap) >= {"segments", "device_traces", "allocator_settings",
                         "external_annotations"}
    check_tiling(snap)
    devices = {s["device"] for s in snap["segments"]}
    assert all(d < len(snap["device_traces"]) for d in devices), "device_traces too short"
    return sum(replay_backwards(snap, d, check_every) for d in range(len(snap["device_traces"])))


# ------------------------------------------------- the checks can fail

def _good() -> dict:
    blk = {"address": 0x1000, "size": 512, "requested_size": 100, "state": "active_allocated",
           "frames": []}
    free = {"address": 0x1200, "size": 1536, "requested_size": 0, "state": "inactive",
            "frames": []}
    seg = {"device": 0, "address": 0x1000, "total_size": 2048, "allocated_size": 512,
           "active_size": 512, "requested_size": 100, "stream": 0, "segment_type": "small",
           "segment_pool_id": (0, 0), "is_expandable": False, "frames": [], "blocks": [blk, free]}
    trace = [
        {"action": "segment_alloc", "addr": 0x1000, "size": 2048, "stream": 0},
        {"action": "alloc", "addr": 0x1200, "size": 10, "stream": 0},
        {"action": "alloc", "addr": 0x1000, "size": 100, "stream": 0},
        {"action": "free_requested", "addr": 0x1200, "size": 10, "stream": 0},
        {"action": "free_completed", "addr": 0x1200, "size": 10, "stream": 0},
    ]
    return {"segments": [seg], "device_traces": [trace], "allocator_settings": {},
            "external_annotations": []}


def test_checker_accepts_a_consistent_snapshot():
    assert check_snapshot(_good()) == 4  # the free pair is folded


@pytest.mark.parametrize("breakage", [
    "gap", "sum", "state", "alloc_of_missing_block", "segment_missing", "block_outside"])
def test_checker_rejects_broken_snapshots(breakage):
    s = copy.deepcopy(_good())
    seg = s["segments"][0]
    trace = s["device_traces"][0]
    if breakage == "gap":
        seg["blocks"][1]["address"] += 512
    elif breakage == "sum":
        seg["total_size"] += 512
    elif breakage == "state":
        seg["blocks"][0]["state"] = "active_awaiting_free"
    elif breakage == "alloc_of_missing_block":
        trace.append({"action": "alloc", "addr": 0x5000, "size": 10, "stream": 0})
    elif breakage == "segment_missing":
        trace.append({"action": "segment_alloc", "addr": 0x9000, "size": 2048, "stream": 0})
    elif breakage == "block_outside":
        trace.insert(1, {"action": "free_requested", "addr": 0x1000, "size": 100, "stream": 0})
        trace.insert(2, {"action": "free_completed", "addr": 0x1000, "size": 100, "stream": 0})
        trace[0], trace[1], trace[2] = trace[1], trace[2], trace[0]
    with pytest.raises(AssertionError):
        check_snapshot(s)
