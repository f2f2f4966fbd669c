"""The snapshot: its schema (keys and types of the dict, segments, blocks,
trace entries, allocator_settings), the functions that produce it (the
Python names and the C entry points under them), _dump_snapshot's file,
record_function annotations, _allocation_traceback and _annotate_tensor."""

import os
import pickle
import tempfile
import time

from harness import MiB, at_least, blocks, empty, needs, recording, settle, torch_mod, trace

SEGMENT_KEYS = {"device", "address", "total_size", "allocated_size", "active_size",
                "requested_size", "stream", "segment_type", "segment_pool_id", "is_expandable",
                "frames", "blocks"}
BLOCK_KEYS = {"address", "size", "requested_size", "state", "frames"}
# Each release's keys: the ones every supported release has, then the
# release that added each of the others (torch/csrc/cuda's snapshot of that
# release; seen in the snapshots of 2.6.0, 2.10.0, 2.11.0 and 2.14.1).
TOP_KEYS = {"segments", "device_traces", "allocator_settings", "external_annotations"}
TOP_KEYS_SINCE = {"host_segments": "2.14", "host_traces": "2.14"}
EVENT_KEYS = {"action", "addr", "size", "stream", "time_us"}
EVENT_KEYS_SINCE = {"compile_context": "2.8", "user_metadata": "2.10", "pool_id": "2.12"}
SETTINGS_TYPES = {"PYTORCH_CUDA_ALLOC_CONF": str, "max_split_size": int,
                  "garbage_collection_threshold": float, "expandable_segments": bool,
                  "pinned_num_register_threads": int, "release_lock_on_cudamalloc": bool,
                  "pinned_use_cuda_host_register": bool, "roundup_power2_divisions": dict}
SETTINGS_TYPES_SINCE = {"graph_capture_record_stream_reuse": (bool, "2.9"),
                        "max_round_threshold": (int, "2.13"), "max_cached_size": (int, "2.13")}
# torch._C._cuda_record_memory_history's arguments, in order, and the
# release that added each group (torch/cuda/memory.py of each release).
C_HISTORY_ARGS = ((("enabled", "all"), ("context", "all"), ("stacks", "python"),
                   ("max_entries", 100)),
                  "2.8", (("clear_history", False), ("compile_context", False),
                          ("global_record_annotations", False)),
                  "2.11", (("skip_actions", []),),
                  "2.14", (("record_pinned_host_memory", False), ("record_cuda", True)))


def _with_release(keys: set, since: dict) -> set:
    return keys | {k for k, release in since.items() if at_least(release)}


def _c_history_args(**given) -> list:
    """This release's positional arguments of _cuda_record_memory_history."""
    out: list = []
    for part in C_HISTORY_ARGS:
        if isinstance(part, str):
            if not at_least(part):
                break
            continue
        out.extend(given.get(name, default) for name, default in part)
    return out


def _recorded_snapshot(**kw):
    torch = torch_mod()
    settle()
    with recording(**kw):
        a = torch.ones(1000, device="cuda")
        b = empty(30 * MiB)
        del b
        torch.cuda.empty_cache()
        snap = torch.cuda.memory._snapshot()
    return snap, a


def check_top_level_keys():
    snap, a = _recorded_snapshot()
    assert set(snap) == _with_release(TOP_KEYS, TOP_KEYS_SINCE), sorted(snap)
    if at_least("2.14"):
        assert snap["host_segments"] == [] and snap["host_traces"] == []
    torch = torch_mod()
    assert len(snap["device_traces"]) == torch.cuda.device_count()
    del a


def check_segment_and_block_schema():
    snap, a = _recorded_snapshot()
    assert snap["segments"]
    for seg in snap["segments"]:
        assert set(seg) == SEGMENT_KEYS, sorted(seg)
        assert type(seg["device"]) is int and seg["segment_type"] in ("small", "large")
        assert seg["segment_pool_id"] == (0, 0) and isinstance(seg["segment_pool_id"], tuple)
        assert sum(b["size"] for b in seg["blocks"]) == seg["total_size"]
        addr = seg["address"]
        for b in seg["blocks"]:
            assert set(b) == BLOCK_KEYS, sorted(b)
            assert b["address"] == addr
            addr += b["size"]
            assert b["state"] in ("active_allocated", "active_pending_free", "inactive")
        active = [b for b in seg["blocks"] if b["state"] != "inactive"]
        assert seg["allocated_size"] == sum(b["size"] for b in seg["blocks"]
                                            if b["state"] == "active_allocated")
        assert seg["active_size"] == sum(b["size"] for b in active)
        assert seg["requested_size"] == sum(b["requested_size"] for b in active)
    del a


def check_trace_entry_schema():
    snap, a = _recorded_snapshot(context=None)
    evs = trace(snap)
    assert {e["action"] for e in evs} >= {"alloc", "free_requested", "free_completed",
                                          "segment_alloc", "segment_free"}
    now = time.time() * 1e6
    keys = _with_release(EVENT_KEYS, EVENT_KEYS_SINCE)
    for e in evs:
        assert set(e) == keys, sorted(e)
        assert e.get("pool_id", (0, 0)) == (0, 0) and e.get("compile_context", "N/A") == "N/A"
        assert e.get("user_metadata", "") == "" and e["stream"] == 0
        assert now - 600e6 < e["time_us"] <= now + 1e6
    sizes = {(e["action"], e["size"]) for e in evs}
    assert ("alloc", 4000) in sizes and ("segment_alloc", 30 * MiB) in sizes
    del a


def check_allocator_settings_schema():
    snap, a = _recorded_snapshot()
    s = snap["allocator_settings"]
    types = dict(SETTINGS_TYPES, **{k: t for k, (t, release) in SETTINGS_TYPES_SINCE.items()
                                    if at_least(release)})
    assert set(s) == set(types), sorted(s)
    for k, t in types.items():
        assert type(s[k]) is t, (k, s[k])
    assert s["max_split_size"] == -1
    assert s.get("max_round_threshold", -1) == -1 and s.get("max_cached_size", -1) == -1
    assert list(s["roundup_power2_divisions"]) == [str(1 << i) for i in range(16)]
    del a


def check_public_memory_snapshot():
    torch = torch_mod()
    x = empty(3 * MiB)
    segs = torch.cuda.memory_snapshot()
    assert segs == torch.cuda.memory._snapshot()["segments"]
    if at_least("2.11"):
        assert segs == torch.cuda.memory_snapshot(include_traces=False)
    if at_least("2.8"):
        assert torch.cuda.memory_snapshot(mempool_id=(0, 0)) == segs
    del x


def check_memory_snapshot_arguments_of_the_release():
    # a keyword the release's memory_snapshot lacks is refused, as torch does
    torch = torch_mod()
    for name, value, release in (("mempool_id", (0, 0), "2.8"), ("include_traces", False, "2.11")):
        try:
            torch.cuda.memory_snapshot(**{name: value})
            took = True
        except TypeError:
            took = False
        assert took == at_least(release), (name, took)


def check_c_entry_points():
    # what torch.cuda.memory calls underneath, called directly, with the
    # arguments of the release imported
    torch = torch_mod()
    settle()
    torch._C._cuda_record_memory_history(*_c_history_args())
    try:
        x = empty(5000)
        snap = torch._C._cuda_memorySnapshot(*([None] if at_least("2.8") else []))
        allocs = [e for e in trace(snap) if e["action"] == "alloc"]
        assert allocs and allocs[-1]["size"] == 5000 and allocs[-1]["frames"]
        if at_least("2.11"):
            segs = torch._C._cuda_memorySnapshot((0, 0, False))["segments"]
            assert any(b["requested_size"] == 5000 for s in segs for b in s["blocks"])
    finally:
        torch._C._cuda_record_memory_history(*_c_history_args(enabled=None, context=None,
                                                              max_entries=1))
    assert trace(torch._C._cuda_memorySnapshot(*([None] if at_least("2.8") else []))) == []
    del x


def check_c_entry_points_take_the_release_arguments_only():
    # another release's argument list is refused with a TypeError, as
    # torch's pybind11 entry point refuses it
    torch = torch_mod()
    n = len(_c_history_args())
    for k in (4, 7, 8, 10):
        if k == n:
            continue
        args = ["all", "all", "python", 100, False, False, False, [], False, True][:k]
        try:
            torch._C._cuda_record_memory_history(*args)
            took = True
        except TypeError as e:
            took = False
            assert "incompatible function arguments" in str(e), str(e)
        finally:
            torch._C._cuda_record_memory_history(*_c_history_args(enabled=None, context=None))
        assert not took, (k, n)
    for args in [()] if at_least("2.8") else [(None,), ((0, 0),)]:
        try:
            torch._C._cuda_memorySnapshot(*args)
            raise AssertionError(f"_cuda_memorySnapshot{args} was taken")
        except TypeError:
            pass


def check_dump_snapshot_round_trip():
    torch = torch_mod()
    settle()
    with recording():
        x = empty(5000)
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "snap.pickle")
            torch.cuda.memory._dump_snapshot(path)
            with open(path, "rb") as f:
                data = f.read()
            loaded = pickle.loads(data)
    assert data[:2] in (b"\x80\x02", b"\x80\x03", b"\x80\x04", b"\x80\x05")
    assert set(loaded) >= {"segments", "device_traces", "allocator_settings"}
    assert any(e["action"] == "alloc" and e["size"] == 5000 for e in trace(loaded))
    del x


def check_record_function_annotations():
    torch = torch_mod()
    settle()
    with recording():
        with torch.profiler.record_function("my_scope"):
            x = empty(5000)
        snap = torch.cuda.memory._snapshot()
    ann = snap["external_annotations"]
    assert [(a["name"], a["stage"]) for a in ann] == [("my_scope", "START"), ("my_scope", "END")]
    assert all(a["device"] == 0 and isinstance(a["time_us"], int) for a in ann)
    del x


@needs("cuda.memory._allocation_traceback")
def check_allocation_traceback():
    torch = torch_mod()
    settle()
    with recording(context="all", stacks="python"):
        def the_allocator():
            return torch.ones(1000, device="cuda")
        x = the_allocator()
        frames = torch.cuda.memory._allocation_traceback(x.untyped_storage().data_ptr())
        assert frames and "the_allocator" in [f["name"] for f in frames], frames
        assert torch.cuda.memory._allocation_traceback(12345) is None
    del x


@needs("cuda.memory._annotate_tensor")
def check_annotate_tensor():
    torch = torch_mod()
    settle()
    with recording():
        x = torch.ones(100, device="cuda")
        torch.cuda.memory._annotate_tensor(x, "hello")
        evs = [e for e in trace(torch.cuda.memory._snapshot()) if e["action"] == "annotate"]
    assert len(evs) == 1, evs
    assert evs[0]["addr"] == x.untyped_storage().data_ptr() and evs[0]["size"] == 400
    assert evs[0]["user_metadata"] == "hello"
    del x


def check_active_blocks_match_live_tensors():
    torch = torch_mod()
    settle()
    xs = [empty(n) for n in (1000, 3 * MiB, 25 * MiB)]
    snap = torch.cuda.memory._snapshot()
    live = {b["address"]: b["requested_size"] for b in blocks(snap)
            if b["state"] == "active_allocated"}
    for x in xs:
        assert live[x.data_ptr()] == x.numel()
    del xs
