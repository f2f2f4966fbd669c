"""Trace replay: op-list building (pure Python) and the replay through gpumem._C."""

from __future__ import annotations

from array import array
from pathlib import Path

import pytest

import gpumem.snapshots.replay as replay_mod
from gpumem._conf import parse_conf
from gpumem.snapshots.unpickle import SnapshotError, load_snapshot
from gpumem.snapshots.replay import (NO_TRACE_NOTE, OP_ALLOC, OP_FREE, OP_RELEASE, build_ops,
                                     recorded_conf, replay_file, replay_snapshot, round_size,
                                     traced_devices)

MiB, GiB = 1 << 20, 1 << 30
SNAPSHOTS = Path(__file__).parent.parent.parent / "shared" / "snapshots"
REAL = sorted(SNAPSHOTS.glob("*.pickle")) if SNAPSHOTS.is_dir() else []
needs_real = pytest.mark.skipif(not REAL, reason=f"real snapshots not found at {SNAPSHOTS}")


def _c_module():
    try:
        from gpumem import _C
    except ImportError as e:
        pytest.skip(f"gpumem._C cannot be imported ({e}); build it with 'pip install -e .'")
    return _C


# --------------------------------------------------------------- trace helpers

def alloc(addr, size, stream=0):
    return {"action": "alloc", "addr": addr, "size": size, "stream": stream}


def freq(addr, size, stream=0):
    return {"action": "free_requested", "addr": addr, "size": size, "stream": stream}


def fdone(addr, size, stream=0):
    return {"action": "free_completed", "addr": addr, "size": size, "stream": stream}


def seg(action, addr, size):
    return {"action": action, "addr": addr, "size": size, "stream": 0}


def segment(device, address, blocks, stream=0):
    """blocks: (size, state, requested_size) tuples, in address order."""
    return {"device": device, "address": address, "stream": stream,
            "total_size": sum(b[0] for b in blocks),
            "blocks": [{"size": s, "state": st, "requested_size": r} for s, st, r in blocks]}


def snapshot(traces, segments=()):
    return {"segments": list(segments), "device_traces": traces}


def F(addr):
    return (OP_FREE, addr, 0, 0)


def A(addr, size, stream=0):
    return (OP_ALLOC, addr, size, stream)


# ------------------------------------------------------------ op-list building

def test_round_size():
    assert [round_size(n) for n in (0, 1, 511, 512, 513, 1000, 1024, 1025)] == \
        [512, 512, 512, 512, 1024, 1024, 1024, 1536]


def test_alloc_free_and_address_reuse():
    trace = [alloc(0xA000, 1000), alloc(0xB000, 600, stream=7),
             freq(0xA000, 1000), fdone(0xA000, 1000),
             alloc(0xA000, 2000), alloc(0xC000, 100)]
    ops = build_ops(snapshot([trace]), 0)
    assert ops.ops == [A(0xA000, 1000), A(0xB000, 600, 7), F(0xA000), A(0xA000, 2000),
                       A(0xC000, 100)]
    assert ops.events == 6
    # live: 1024 + 1024 -> 1024 -> 1024 + 2048 -> + 512
    assert ops.peak_allocated_trace == 1024 + 2048 + 512
    assert (ops.live_from_start_frees, ops.live_from_start_blocks) == (0, 0)
    assert (ops.stray_frees, ops.implicit_frees, ops.trace_ooms) == (0, 0, 0)


def test_block_is_freed_at_free_completed_not_at_request():
    trace = [alloc(0xA000, 4096), freq(0xA000, 4096), alloc(0xB000, 4096),
             fdone(0xA000, 4096), alloc(0xC000, 4096)]
    ops = build_ops(snapshot([trace]), 0)
    assert ops.ops == [A(0xA000, 4096), A(0xB000, 4096), F(0xA000), A(0xC000, 4096)]
    assert ops.peak_allocated_trace == 2 * 4096  # A still counted while B is allocated


def test_free_requested_without_completion_frees_at_the_request():
    trace = [alloc(0xA000, 8192), alloc(0xB000, 512), freq(0xA000, 8192),
             alloc(0xC000, 8192)]
    ops = build_ops(snapshot([trace]), 0)
    assert ops.ops == [A(0xA000, 8192), A(0xB000, 512), F(0xA000), A(0xC000, 8192)]
    assert ops.peak_allocated_trace == 8192 + 512


def test_mid_run_frees_were_live_from_the_start():
    trace = [freq(0x9000, 3000, stream=5), alloc(0xA000, 1024), fdone(0x9000, 3000, stream=5),
             fdone(0x5000, 700), freq(0x7000, 100)]  # 0x7000 never completes
    ops = build_ops(snapshot([trace]), 0)
    assert ops.live_from_start_frees == 3
    assert ops.ops == [
        A(0x5000, 700), A(0x7000, 100), A(0x9000, 3000, 5),  # address order, first
        A(0xA000, 1024), F(0x9000), F(0x5000), F(0x7000),
    ]
    assert ops.peak_allocated_trace == 1024 + 512 + 3072 + 1024


def test_active_segment_blocks_without_a_trace_alloc_are_live_from_the_start():
    base = 0x10_0000
    segs = [
        segment(0, base, [(2048, "inactive", 7), (1024, "active_allocated", 1000),
                          (512, "active_pending_free", 0), (4096, "active_allocated", 4000)],
                stream=3),
        segment(1, 0x90_0000, [(1024, "active_allocated", 1024)]),  # another device
    ]
    # The trace allocates the last block of the segment and never frees it.
    trace = [alloc(base + 3584, 4000, stream=3), alloc(0x20_0000, 512)]
    ops = build_ops(snapshot([trace, []], segs), 0)
    assert ops.live_from_start_blocks == 2
    assert ops.live_from_start_frees == 0
    assert ops.ops == [A(base + 2048, 1000, 3), A(base + 3072, 512, 3),
                       A(base + 3584, 4000, 3), A(0x20_0000, 512)]
    assert ops.torch_reserved_end == 2048 + 1024 + 512 + 4096


def test_segment_blocks_at_addresses_the_trace_uses_are_not_added():
    base = 0x10_0000
    segs = [segment(0, base, [(1024, "active_allocated", 1000), (1024, "active_allocated", 900)])]
    # base: freed mid-run and never allocated again; base+1024: pending free.
    trace = [fdone(base, 1000), alloc(base + 1024, 900), freq(base + 1024, 900)]
    ops = build_ops(snapshot([trace], segs), 0)
    assert ops.live_from_start_blocks == 0
    assert ops.live_from_start_frees == 1
    assert ops.ops == [A(base, 1000), F(base), A(base + 1024, 900), F(base + 1024)]


def test_stray_and_repeated_frees_and_double_allocs():
    trace = [alloc(0xA000, 512), freq(0xA000, 512), freq(0xA000, 512), fdone(0xA000, 512),
             fdone(0xA000, 512), alloc(0xB000, 512), alloc(0xB000, 1024),
             {"action": "free", "addr": 0xB000, "size": 1024, "stream": 0}]
    ops = build_ops(snapshot([trace]), 0)
    assert ops.stray_frees == 2  # the second free_requested and second free_completed
    assert ops.implicit_frees == 1
    assert ops.ops == [A(0xA000, 512), F(0xA000), A(0xB000, 512), F(0xB000),
                       A(0xB000, 1024), F(0xB000)]


def test_oom_snapshot_and_unknown_actions_are_skipped():
    trace = [alloc(0xA000, 512), {"action": "oom", "device_free": 0, "size": 1 << 30},
             {"action": "snapshot", "addr": 0, "size": 512, "stream": 0},
             {"action": "user_defined", "addr": 0, "size": 0, "stream": 0},
             fdone(0xA000, 512)]
    ops = build_ops(snapshot([trace]), 0)
    assert ops.ops == [A(0xA000, 512), F(0xA000)]
    assert ops.trace_ooms == 1
    assert ops.skipped_events == 2
    assert ops.events == 5


def test_torch_reserved_timeline_from_segment_events():
    segs = [segment(0, 0x1000_0000, [(20 * MiB, "inactive", 0)]),
            segment(0, 0x2000_0000, [(40 * MiB, "inactive", 0)]),
            segment(1, 0x3000_0000, [(2 * MiB, "inactive", 0)])]
    trace = [seg("segment_alloc", 0x2000_0000, 20 * MiB),
             seg("segment_alloc", 0x4000_0000, 40 * MiB),
             seg("segment_free", 0x4000_0000, 40 * MiB),
             seg("segment_map", 0x5000_0000, 2 * MiB),
             seg("segment_unmap", 0x5000_0000, 2 * MiB)]
    ops = build_ops(snapshot([trace, []], segs), 0)
    assert ops.torch_reserved_end == 60 * MiB
    # net change +20 MiB, so torch started at 40 MiB: 60, 100, 60, 62, 60
    assert ops.torch_reserved_start == 40 * MiB
    assert ops.torch_peak_reserved == 100 * MiB
    assert ops.segment_events == 5
    # one release op for the frees and unmaps with no alloc or free between them
    assert ops.ops == [(OP_RELEASE, 0, 0, 0)] and ops.releases == 1


def test_torch_peak_can_be_the_starting_value():
    segs = [segment(0, 0x1000_0000, [(20 * MiB, "inactive", 0)])]
    trace = [seg("segment_free", 0x2000_0000, 40 * MiB)]
    ops = build_ops(snapshot([trace], segs), 0)
    assert ops.torch_reserved_start == 60 * MiB
    assert ops.torch_peak_reserved == 60 * MiB


def test_no_segment_events_means_unknown_torch_peak():
    segs = [segment(0, 0x1000_0000, [(20 * MiB, "active_allocated", 20 * MiB)])]
    ops = build_ops(snapshot([[alloc(0xA000, 512)]], segs), 0)
    assert ops.torch_peak_reserved is None
    assert ops.torch_reserved_end == 20 * MiB


def test_several_devices():
    segs = [segment(0, 0x100000, [(512, "active_allocated", 512)]),
            segment(2, 0x200000, [(1024, "active_allocated", 1000)]),
            segment(2, 0x300000, [(2048, "inactive", 0)])]
    traces = [[alloc(0xA000, 512)], [], [alloc(0xB000, 2048), fdone(0xB000, 2048)]]
    snap = snapshot(traces, segs)
    assert traced_devices(snap) == [0, 2]
    d0, d2 = build_ops(snap, 0), build_ops(snap, 2)
    assert d0.ops == [A(0x100000, 512), A(0xA000, 512)]
    assert d2.ops == [A(0x200000, 1000), A(0xB000, 2048), F(0xB000)]
    assert (d0.torch_reserved_end, d2.torch_reserved_end) == (512, 3072)
    assert d2.peak_allocated_trace == 1024 + 2048


def test_arrays_for_the_c_replayer():
    trace = [alloc(0xA000, 1000, stream=-1), fdone(0xA000, 1000)]
    actions, addrs, sizes, streams = build_ops(snapshot([trace]), 0).arrays()
    assert actions == bytes([0, 1])
    assert addrs == array("Q", [0xA000, 0xA000])
    assert sizes == array("Q", [1000, 0])
    assert streams == array("Q", [(1 << 64) - 1, 0])  # int64 stream handles, as unsigned


# ------------------------------------------ the report, with a stand-in for _C

class _FakeC:
    def __init__(self):
        self.calls = []

    def replay(self, actions, addrs, sizes, streams, *, capacity, settings, **kw):
        self.calls.append((actions, addrs, sizes, streams, capacity, settings, kw))
        return {"ops": len(actions), "elapsed_ns": 2_000_000, "peak_allocated": 3072,
                "peak_reserved": 4 * MiB, "peak_active": 3072, "num_device_alloc": 2,
                "num_device_free": 0, "num_alloc_retries": 0, "num_ooms": 0,
                "unknown_frees": 0, "reserved_end": 4 * MiB, "allocated_end": 0}


def test_report_fields_with_a_stand_in_replayer(monkeypatch):
    fake = _FakeC()
    monkeypatch.setattr(replay_mod, "_import_c", lambda: fake)
    segs = [segment(0, 0x1000_0000, [(8 * MiB, "inactive", 0)])]
    trace = [seg("segment_alloc", 0x1000_0000, 8 * MiB), alloc(0xA000, 1000),
             alloc(0xB000, 2000), fdone(0xA000, 1000), fdone(0xB000, 2000)]
    report = replay_snapshot(snapshot([trace], segs), "expandable_segments:True", file="t.pkl")
    assert report["file"] == "t.pkl"
    assert report["conf"] == "expandable_segments:True"
    [row] = report["devices"]
    actions, addrs, sizes, streams, capacity, settings, kw = fake.calls[0]
    assert actions == bytes([0, 0, 1, 1])
    assert list(addrs) == [0xA000, 0xB000, 0xA000, 0xB000]
    assert list(sizes) == [1000, 2000, 0, 0]
    assert capacity == 80 * GiB and kw == {}
    assert settings == parse_conf("expandable_segments:True")
    assert row["peak_allocated_trace"] == 1024 + 2048
    assert row["torch_peak_reserved"] == 8 * MiB
    assert row["ratio"] == 4 * MiB / 3072
    assert row["ratio_vs_torch"] == 0.5
    assert row["events"] == 5 and row["ops"] == 4
    assert row["events_per_s"] == 4 / 0.002
    for key in ("device", "gpumem_peak_reserved", "num_device_alloc", "live_from_start_frees",
                "live_from_start_blocks", "trace_ooms", "replay_ooms", "unknown_frees",
                "torch_reserved_end"):
        assert key in row


def test_capacity_grows_with_the_trace(monkeypatch):
    fake = _FakeC()
    monkeypatch.setattr(replay_mod, "_import_c", lambda: fake)
    replay_snapshot(snapshot([[alloc(0xA000, 30 * GiB)]]))
    assert fake.calls[-1][4] == 120 * GiB
    replay_snapshot(snapshot([[alloc(0xA000, 30 * GiB)]]), capacity=1 * GiB, granularity=4096)
    assert fake.calls[-1][4] == 1 * GiB and fake.calls[-1][6] == {"granularity": 4096}


def test_capacity_stays_within_what_the_simulated_device_can_be(monkeypatch):
    fake = _FakeC()
    monkeypatch.setattr(replay_mod, "_import_c", lambda: fake)
    trace = [alloc(0x1000 + i * (1 << 40), 1 << 62) for i in range(8)]  # a peak of 2**65
    replay_snapshot(snapshot([trace]))
    assert fake.calls[-1][4] == replay_mod.MAX_CAPACITY


def test_requests_no_allocator_serves_are_refused_as_corrupt():
    """Issue 16.8: a trace size of 2**63 made replay exit 1 (the core's
    EINVAL); it is bad input, refused with one sentence naming the entry."""
    _c_module()
    for size in ((1 << 62) + 1, 1 << 63, (1 << 64) - 1):
        for trace in ([alloc(0xA000, size)], [fdone(0xA000, size)],
                      [alloc(0xB000, 512), freq(0xA000, size)]):
            with pytest.raises(SnapshotError, match=r"t\.pkl: device_traces\[0\]\[\d\] asks "
                                                    r"for \d+ bytes, more than any allocator"):
                replay_snapshot(snapshot([trace]), file="t.pkl")
        segs = [segment(0, 0x1000, [(size, "active_allocated", 0)])]
        with pytest.raises(SnapshotError, match="a block at 0x1000 of device 0's segments"):
            replay_snapshot(snapshot([[alloc(0xA000, 512)]], segs))
    row = replay_snapshot(snapshot([[alloc(0xA000, 1 << 62)]]))["devices"][0]
    assert row["replay_ooms"] == 1  # the largest request there is: replayed, and OOM


def test_the_top_address_is_an_address_like_any_other():
    """2**64 - 1 was the one trace address the replayer's map could not hold
    (its key wrapped to the map's empty key): 'out of host memory'."""
    _c_module()
    top = (1 << 64) - 1
    trace = [alloc(top, 4096, stream=-(1 << 63)), fdone(top, 4096), alloc(top, 8192),
             alloc(top, 512), fdone(top, 512)]
    row = replay_snapshot(snapshot([trace]))["devices"][0]
    assert row["unknown_frees"] == 0 and row["allocated_end"] == 0, row
    assert row["ops"] == 6 and row["implicit_frees"] == 1


def test_snapshot_without_trace_is_a_note_not_an_error(monkeypatch):
    monkeypatch.setattr(replay_mod, "_import_c", lambda: pytest.fail("nothing to replay"))
    segs = [segment(0, 0x1000, [(512, "active_allocated", 512)])]
    for snap in (snapshot([], segs), snapshot([[], []], segs), segs):
        report = replay_snapshot(snap)
        assert report["devices"] == [] and report["note"] == NO_TRACE_NOTE


def test_bad_snapshot_and_conf_are_reported():
    with pytest.raises(SnapshotError):
        replay_snapshot({"device_traces": [[{"action": "alloc", "size": 5}]]})
    with pytest.raises(ValueError, match="unknown allocator setting"):
        replay_snapshot(snapshot([[]]), "colour:blue")


# ----------------------------------------------------- through the real gpumem._C

CONFS = ["", "expandable_segments:True"]


def _allocated_bound(ops) -> int:
    """Peak live bytes if every large block kept an unsplit tail of up to 1 MiB.

    With expandable segments off, torch (and gpumem) split a large-pool block
    only when more than 1 MiB would remain, and allocated_bytes counts the
    whole block; so the replayed peak lies between peak_allocated_trace and
    this bound.  With expandable segments on, blocks split whenever 512 bytes
    remain, so the replayed peak equals peak_allocated_trace.
    """
    sizes, current, peak = {}, 0, 0
    for action, addr, size, _stream in ops:
        if action == OP_ALLOC:
            n = round_size(size)
            sizes[addr] = n + (MiB if n > MiB else 0)
            current += sizes[addr]
            peak = max(peak, current)
        else:
            current -= sizes.pop(addr)
    return peak


def _hand_built_trace():
    base = 0x10_0000
    segs = [segment(0, base, [(2 * MiB, "active_allocated", 2 * MiB - 100)])]
    trace = [alloc(0xA000, 1000), alloc(0xB000, 3 * MiB), freq(0xA000, 1000),
             alloc(0xC000, 25 * MiB, stream=9), fdone(0xA000, 1000), fdone(0xB000, 3 * MiB),
             alloc(0xA000, 5000), freq(0xC000, 25 * MiB)]
    return snapshot([trace], segs)


def test_c_replay_hand_built_default():
    _c_module()
    [row] = replay_snapshot(_hand_built_trace())["devices"]
    assert row["ops"] == 8  # 1 live-from-start block, 5 allocs, 2 frees
    assert row["peak_allocated_trace"] == 2 * MiB + 1024 + 3 * MiB + 25 * MiB
    # The 25 MiB request gets a 26 MiB segment; the 1 MiB tail is not split
    # off (a large block splits only if more than 1 MiB remains), so the
    # block counts 26 MiB.
    assert row["peak_allocated"] == 2 * MiB + 1024 + 3 * MiB + 26 * MiB
    # Segments: 20 MiB (the 2 MiB block, then the 3 MiB one), 2 MiB (small
    # pool, the 1000-byte block), 26 MiB (the 25 MiB block).
    assert row["num_device_alloc"] == 3
    assert row["gpumem_peak_reserved"] == 48 * MiB
    assert row["unknown_frees"] == 0 and row["replay_ooms"] == 0


def test_c_replay_hand_built_expandable():
    _c_module()
    [row] = replay_snapshot(_hand_built_trace(), "expandable_segments:True")["devices"]
    assert row["ops"] == 8
    assert row["peak_allocated"] == row["peak_allocated_trace"]
    # One expandable segment per stream and pool, mapped in 2 MiB granules:
    # stream 0 large 2 + 3 MiB -> 6 MiB, stream 9 large 25 MiB -> 26 MiB,
    # small pool 2 MiB.
    assert row["gpumem_peak_reserved"] == 34 * MiB
    assert row["unknown_frees"] == 0 and row["replay_ooms"] == 0


def test_c_replay_reports_ooms_on_a_small_device():
    _c_module()
    trace = [alloc(0xA000, 64 * MiB), alloc(0xB000, 64 * MiB), fdone(0xB000, 64 * MiB),
             fdone(0xA000, 64 * MiB)]
    report = replay_snapshot(snapshot([trace]), capacity=100 * MiB)
    [row] = report["devices"]
    assert row["replay_ooms"] == 1
    assert row["unknown_frees"] == 0  # the free of the failed block is skipped too
    assert row["peak_allocated"] == 64 * MiB


@needs_real
@pytest.mark.parametrize("conf", CONFS, ids=["default", "expandable"])
# The fast tier replays the first real snapshot; the full tier every one.
@pytest.mark.parametrize("path", [pytest.param(p, id=p.name, marks=[pytest.mark.slow] if i else [])
                                  for i, p in enumerate(REAL)])
def test_c_replay_real_snapshots(path, conf):
    _c_module()
    snap = load_snapshot(path)
    report = replay_file(path, conf)
    assert report["file"] == str(path)
    assert report["conf"] == conf
    devices = traced_devices(snap)
    assert [row["device"] for row in report["devices"]] == devices
    if not devices:
        assert report["note"] == NO_TRACE_NOTE
    for row in report["devices"]:
        ops = build_ops(snap, row["device"])
        assert row["ops"] == len(ops.ops)
        assert row["unknown_frees"] == 0
        assert row["replay_ooms"] == 0
        assert row["peak_allocated_trace"] == ops.peak_allocated_trace
        if conf:
            assert row["peak_allocated"] == ops.peak_allocated_trace
        else:
            assert ops.peak_allocated_trace <= row["peak_allocated"] <= _allocated_bound(ops.ops)
        assert row["gpumem_peak_reserved"] >= row["peak_allocated"]
        if ops.ops:
            assert row["num_device_alloc"] >= 1


# ------------------------------------------- pressure: releases, capacity, settings

def _released_then_grown():
    """torch cached a 40 MiB segment, gave it back (empty_cache), then grew a
    60 MiB one: its peak reserved is 60 MiB, not 100."""
    return [seg("segment_alloc", 0x1000_0000, 40 * MiB), alloc(0x1000_0000, 40 * MiB),
            freq(0x1000_0000, 40 * MiB), fdone(0x1000_0000, 40 * MiB),
            seg("segment_free", 0x1000_0000, 40 * MiB),
            seg("segment_alloc", 0x2000_0000, 60 * MiB), alloc(0x2000_0000, 60 * MiB),
            freq(0x2000_0000, 60 * MiB), fdone(0x2000_0000, 60 * MiB),
            seg("segment_free", 0x2000_0000, 60 * MiB)]


def test_segment_frees_become_release_ops():
    ops = build_ops(snapshot([_released_then_grown()]), 0)
    assert ops.ops == [A(0x1000_0000, 40 * MiB), F(0x1000_0000), (OP_RELEASE, 0, 0, 0),
                       A(0x2000_0000, 60 * MiB), F(0x2000_0000), (OP_RELEASE, 0, 0, 0)]
    assert ops.releases == 2 and ops.torch_peak_reserved == 60 * MiB


def test_c_replay_releases_where_torch_released():
    _c_module()
    [row] = replay_snapshot(snapshot([_released_then_grown()]))["devices"]
    assert row["torch_peak_reserved"] == 60 * MiB
    assert row["gpumem_peak_reserved"] == 60 * MiB  # 100 MiB when the cache is kept
    assert row["releases"] == 2 and row["gpumem_reserved_end"] == 0


def test_capacity_comes_from_the_traces_oom_entries():
    _c_module()
    trace = [seg("segment_alloc", 0x1000_0000, 64 * MiB), alloc(0x1000_0000, 64 * MiB),
             {"action": "oom", "device_free": 36 * MiB, "size": 80 * MiB, "stream": 0},
             {"action": "oom", "device_free": 30 * MiB, "size": 80 * MiB, "stream": 0}]
    segs = [segment(0, 0x1000_0000, [(64 * MiB, "active_allocated", 64 * MiB)])]
    ops = build_ops(snapshot([trace], segs), 0)
    assert ops.trace_capacity == 100 * MiB and ops.trace_ooms == 2
    [row] = replay_snapshot(snapshot([trace], segs))["devices"]
    assert (row["capacity"], row["capacity_source"]) == (100 * MiB, "trace")
    [row] = replay_snapshot(snapshot([trace], segs), capacity=GiB)["devices"]
    assert (row["capacity"], row["capacity_source"]) == (GiB, "given")


def test_recorded_settings():
    base = snapshot([[alloc(0xA000, 512)]])
    conf, source = recorded_conf(base)
    assert conf == parse_conf("") and source == "the snapshot records no settings"
    settings = {"PYTORCH_CUDA_ALLOC_CONF": "x", "expandable_segments": True,
                "max_split_size": 256 * MiB, "garbage_collection_threshold": 0.5,
                "release_lock_on_cudamalloc": False,
                "roundup_power2_divisions": {str(1 << i): (4 if i < 3 else 0) for i in range(16)}}
    conf, source = recorded_conf(dict(base, allocator_settings=settings))
    assert conf == parse_conf("expandable_segments:True,max_split_size_mb:256,"
                              "garbage_collection_threshold:0.5,roundup_power2_divisions:[4:4]")
    assert source == "from the snapshot's allocator_settings"
    default = dict(settings, expandable_segments=False, max_split_size=-1,
                   garbage_collection_threshold=0.0, roundup_power2_divisions={})
    assert recorded_conf(dict(base, allocator_settings=default))[0] == parse_conf("")
    exp = snapshot([[alloc(0xA000, 512)]], [dict(segment(0, 0x1000, [(2 * MiB, "inactive", 0)]),
                                                  is_expandable=True)])
    conf, source = recorded_conf(exp)
    assert conf == parse_conf("expandable_segments:True") and "expandable" in source
    bad = dict(base, allocator_settings=dict(settings, garbage_collection_threshold=7.0))
    conf, source = recorded_conf(bad)
    assert conf == parse_conf("") and "garbage_collection_threshold" in source


def test_replay_uses_the_recorded_settings_unless_given(tmp_path):
    _c_module()
    import pickle
    snap = dict(snapshot([[alloc(0xA000, 3 * MiB), fdone(0xA000, 3 * MiB)]]),
                allocator_settings={"expandable_segments": True})
    path = tmp_path / "exp.pickle"
    path.write_bytes(pickle.dumps(snap, protocol=4))
    report = replay_file(path)
    assert report["conf"] == "expandable_segments:True"
    assert report["conf_source"] == "from the snapshot's allocator_settings"
    assert report["devices"][0]["expandable_active"] is True
    report = replay_file(path, "")
    assert (report["conf"], report["conf_source"]) == ("", "given")
