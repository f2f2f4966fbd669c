"""Safe snapshot loading: gpumem._unpickle."""

from __future__ import annotations

import collections
import os
import pickle
import pickletools
import random
from pathlib import Path

import pytest

import gpumem._unpickle as unpickle_mod
from gpumem._unpickle import SnapshotError, load_snapshot, loads_snapshot, normalize_snapshot

SNAPSHOTS = Path(__file__).parent.parent.parent / "shared" / "snapshots"
REAL = sorted(SNAPSHOTS.glob("*.pickle")) if SNAPSHOTS.is_dir() else []
needs_real = pytest.mark.skipif(not REAL, reason=f"real snapshots not found at {SNAPSHOTS}")


def _snapshot() -> dict:
    frames = [{"filename": "train.py", "line": 12, "name": "step"}]
    return {
        "segments": [{
            "device": 0, "address": 1 << 32, "total_size": 2 << 20, "allocated_size": 1024,
            "active_size": 1024, "requested_size": 1000, "stream": 0, "segment_type": "small",
            "segment_pool_id": (0, 0), "is_expandable": False, "frames": frames,
            "blocks": [
                {"address": 1 << 32, "size": 1024, "requested_size": 1000,
                 "state": "active_allocated", "frames": frames},
                {"address": (1 << 32) + 1024, "size": (2 << 20) - 1024, "requested_size": 0,
                 "state": "inactive", "frames": []},
            ],
        }],
        "device_traces": [[
            {"action": "segment_alloc", "addr": 1 << 32, "size": 2 << 20, "stream": 0},
            {"action": "alloc", "addr": 1 << 32, "size": 1000, "stream": 0, "frames": frames,
             "time_us": 1_700_000_000_000_000},
            {"action": "oom", "device_free": 12345, "size": 20 << 20, "stream": 0},
        ]],
        "allocator_settings": {"expandable_segments": False, "max_split_size": -1},
    }


def _message(excinfo) -> str:
    msg = str(excinfo.value)
    assert "\n" not in msg, "error messages must be one line"
    return msg


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
def test_protocols_round_trip(tmp_path, protocol):
    snap = _snapshot()
    path = tmp_path / "snap.pickle"
    path.write_bytes(pickle.dumps(snap, protocol=protocol))
    loaded = load_snapshot(path)
    assert loaded == snap
    assert loaded["segments"][0]["segment_pool_id"] == (0, 0)
    assert loads_snapshot(pickle.dumps(snap, protocol=protocol)) == snap


def test_bare_list_becomes_segments(tmp_path):
    segs = _snapshot()["segments"]
    path = tmp_path / "segments.pkl"
    path.write_bytes(pickle.dumps(segs, protocol=4))
    assert load_snapshot(path) == {"segments": segs, "device_traces": []}


def test_legacy_traces_key_is_read_as_device_traces():
    snap = _snapshot()
    legacy = {"segments": snap["segments"], "traces": snap["device_traces"]}
    loaded = loads_snapshot(pickle.dumps(legacy, protocol=2))
    assert loaded["device_traces"] == snap["device_traces"]


def test_missing_keys_default_to_empty_lists():
    loaded = loads_snapshot(pickle.dumps({"device_traces": [[]]}))
    assert loaded == {"segments": [], "device_traces": [[]]}
    loaded = loads_snapshot(pickle.dumps({"segments": []}))
    assert loaded == {"segments": [], "device_traces": []}


def test_missing_file(tmp_path):
    path = tmp_path / "snapshot.pickle"
    with pytest.raises(SnapshotError) as ei:
        load_snapshot(path)
    assert _message(ei) == f"{path}: file not found"


def test_directory(tmp_path):
    with pytest.raises(SnapshotError) as ei:
        load_snapshot(tmp_path)
    assert _message(ei).startswith(f"{tmp_path} is a directory")


def test_permission_denied(tmp_path, monkeypatch):
    path = tmp_path / "locked.pickle"
    path.write_bytes(pickle.dumps(_snapshot()))

    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied", str(path))

    # The loader opens through its module global; running as root makes chmod useless.
    monkeypatch.setattr(unpickle_mod, "open", refuse, raising=False)
    with pytest.raises(SnapshotError) as ei:
        load_snapshot(path)
    assert "permission denied" in _message(ei)


def test_invalid_file_name():
    with pytest.raises(SnapshotError, match="not a valid file name"):
        load_snapshot("snap\0shot.pickle")


def test_text_file(tmp_path):
    path = tmp_path / "x.txt"
    path.write_text("segments: none\n")
    with pytest.raises(SnapshotError) as ei:
        load_snapshot(path)
    assert _message(ei) == (
        f"{path} is not a pickle file (it does not start with a pickle protocol header); "
        f"pass a file written by torch.cuda.memory._dump_snapshot")


def test_empty_file(tmp_path):
    path = tmp_path / "empty.pickle"
    path.write_bytes(b"")
    with pytest.raises(SnapshotError, match="is empty"):
        load_snapshot(path)


def test_protocol_0_and_1_have_no_header():
    for protocol in (0, 1):
        with pytest.raises(SnapshotError, match="not a pickle file"):
            loads_snapshot(pickle.dumps(_snapshot(), protocol=protocol))


def test_unknown_protocol():
    with pytest.raises(SnapshotError, match="pickle protocol 9"):
        loads_snapshot(b"\x80\x09}.")


def test_truncated_hand_built(tmp_path):
    data = pickle.dumps(_snapshot(), protocol=4)
    path = tmp_path / "x.pickle"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(SnapshotError) as ei:
        load_snapshot(path)
    assert _message(ei) == f"{path} is truncated (pickle data ended early); re-dump the snapshot"


@needs_real
def test_truncated_real_snapshot(tmp_path):
    real = max(REAL, key=lambda p: p.stat().st_size)
    data = real.read_bytes()
    path = tmp_path / "half.pickle"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(SnapshotError) as ei:
        load_snapshot(path)
    assert "truncated" in _message(ei)


class _Boom:
    """Pickles as a call to os.mkdir: loading it unsafely would create a directory."""

    def __init__(self, target: str) -> None:
        self.target = target

    def __reduce__(self):
        return (os.mkdir, (self.target,))


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_global_reference_is_refused_without_running(tmp_path, protocol):
    target = tmp_path / "pwned"
    data = pickle.dumps({"segments": [], "device_traces": [], "x": _Boom(str(target))},
                        protocol=protocol)
    path = tmp_path / "evil.pickle"
    path.write_bytes(data)
    with pytest.raises(SnapshotError) as ei:
        load_snapshot(path)
    msg = _message(ei)
    assert f"refers to Python global '{os.mkdir.__module__}.mkdir'" in msg
    assert "refuses pickles that reference globals" in msg
    assert not target.exists(), "the pickle's code ran"
    # The plain unpickler really would have run it: the test can fail.
    pickle.loads(data)
    assert target.exists()


def test_os_system_reference_is_named():
    data = b"\x80\x02cos\nsystem\nX\x04\x00\x00\x00trueq\x00\x85R."
    with pytest.raises(SnapshotError) as ei:
        loads_snapshot(data, name="x.pickle")
    assert _message(ei) == ("x.pickle refers to Python global 'os.system'; gpumem refuses "
                            "pickles that reference globals because loading them would run code")


def test_class_instance_is_refused():
    data = pickle.dumps({"segments": collections.OrderedDict()}, protocol=4)
    with pytest.raises(SnapshotError, match="'collections.OrderedDict'"):
        loads_snapshot(data)


def test_persistent_id_is_refused():
    with pytest.raises(SnapshotError, match="persistent id"):
        loads_snapshot(b"\x80\x02K\x01Q.")


@pytest.mark.parametrize("data", [
    b"\x80\x04\xff",  # unknown opcode
    b"\x80\x02.",  # STOP with an empty stack
    b"\x80\x04h\x05.",  # memo entry that does not exist
    b"\x80\x04}(K\x01u.",  # odd number of items for a dict
    b"\x80\x04}(]K\x01u.",  # unhashable dict key
    b"\x80\x02\x82\x01.",  # unregistered extension code
    b"\x80\x05\x97.",  # out-of-band buffer
    b"\x80\x04\x8d" + (1 << 62).to_bytes(8, "little") + b"abc",  # huge string length
])
def test_corrupt_pickles(data):
    with pytest.raises(SnapshotError) as ei:
        loads_snapshot(data, name="bad.pickle")
    assert _message(ei).startswith("bad.pickle ")


def test_every_truncation_and_byte_flip_is_a_snapshot_error():
    data = pickle.dumps(_snapshot(), protocol=4)
    for cut in range(len(data)):
        with pytest.raises(SnapshotError):
            loads_snapshot(data[:cut])
    rng = random.Random(1234)
    for _ in range(1000):
        corrupt = bytearray(data)
        for _ in range(rng.randint(1, 4)):
            corrupt[rng.randrange(2, len(corrupt))] = rng.randrange(256)
        try:
            loads_snapshot(bytes(corrupt))
        except SnapshotError as e:
            assert "\n" not in str(e)


@pytest.mark.parametrize("obj, expected", [
    ([1, 2, 3], "snap.pickle: segments[0] is a int, expected a dict"),
    (42, "snap.pickle holds a int, not a snapshot dict or list of segments"),
    ({"foo": 1}, "snap.pickle holds a dict without 'segments' or 'device_traces'"),
    ({"segments": {}}, "snap.pickle: 'segments' is a dict, expected a list of dicts"),
    ({"device_traces": [{}]}, "snap.pickle: device_traces[0] is a dict, expected a list"),
    ({"device_traces": [[{"addr": 1, "size": 2}]]},
     "snap.pickle: device_traces[0][0] has no 'action'"),
    ({"device_traces": [[{"action": "alloc", "addr": 1}]]},
     "snap.pickle: device_traces[0][0] has no 'size'"),
    ({"device_traces": [[{"action": "alloc", "addr": "0x10", "size": 2}]]},
     "snap.pickle: device_traces[0][0] has 'addr' of type str, expected an int"),
    ({"device_traces": [[{"action": "oom", "addr": 0, "size": 2}]]},
     "snap.pickle: device_traces[0][0] has no 'device_free'"),
    ({"segments": [{"device": 0, "address": 0, "total_size": 512,
                    "blocks": [{"size": 512}]}]},
     "snap.pickle: segments[0]['blocks'][0] has no 'state' string"),
    ({"segments": [{"device": 0, "total_size": 512, "blocks": []}]},
     "snap.pickle: segments[0] has no 'address'"),
])
def test_wrong_shapes(obj, expected):
    with pytest.raises(SnapshotError) as ei:
        loads_snapshot(pickle.dumps(obj, protocol=4), name="snap.pickle")
    assert _message(ei).startswith(expected)


def test_trace_entry_missing_addr_names_the_entry():
    snap = _snapshot()
    trace = snap["device_traces"][0]
    trace += [dict(trace[1]) for _ in range(3)]
    del trace[5]["addr"]
    with pytest.raises(SnapshotError) as ei:
        loads_snapshot(pickle.dumps(snap), name="x.pickle")
    assert _message(ei) == "x.pickle: device_traces[0][5] has no 'addr'"


def test_normalize_accepts_dicts_directly():
    snap = _snapshot()
    assert normalize_snapshot(snap) == snap
    assert normalize_snapshot(snap) is not snap  # the caller's dict is not modified
    with pytest.raises(SnapshotError):
        normalize_snapshot({"device_traces": [[{"action": "free_completed", "size": 1}]]})


@pytest.mark.slow
@needs_real
@pytest.mark.parametrize("path", REAL, ids=[p.name for p in REAL])
def test_real_snapshot_loads(path):
    snap = load_snapshot(path)
    assert isinstance(snap["segments"], list)
    assert isinstance(snap["device_traces"], list)
    for seg in snap["segments"]:
        assert sum(b["size"] for b in seg["blocks"]) == seg["total_size"]
    # The safe loader sees the same data as the plain one (which is safe to
    # use here only because the stream provably names no global).
    data = path.read_bytes()
    opcodes = {op.name for op, _arg, _pos in pickletools.genops(data)}
    assert not opcodes & {"GLOBAL", "STACK_GLOBAL", "REDUCE", "INST", "OBJ", "NEWOBJ",
                          "NEWOBJ_EX", "BUILD", "PERSID", "BINPERSID", "EXT1", "EXT2", "EXT4"}
    plain = pickle.loads(data)
    if isinstance(plain, list):
        assert snap == {"segments": plain, "device_traces": []}
    else:
        assert snap["segments"] == plain["segments"]
        assert snap["device_traces"] == plain.get("device_traces", plain.get("traces"))


# ------------------------------------------------- large snapshots (gpumem view's speed)

def _big_trace(n):
    frames = [{"filename": "/u/t.py", "line": 1, "name": "f"}]
    trace = []
    for i in range(n // 2):
        trace.append({"action": "alloc", "addr": 4096 * i, "size": 512, "stream": 0,
                      "time_us": i, "frames": frames})
        trace.append({"action": "free_completed", "addr": 4096 * i, "size": 512, "stream": 0,
                      "time_us": i, "frames": frames})
    return trace


def test_loading_runs_no_garbage_collection():
    """A snapshot is plain acyclic data: the collector, which would run hundreds of
    times while a large trace is unpickled (rescanning the older objects each
    time it reaches an older generation), is paused: it was most of the load
    time of a 1,000,000-event snapshot."""
    import gc
    data = pickle.dumps({"segments": [], "device_traces": [_big_trace(200_000)]}, protocol=4)
    runs = []

    def count(phase, info):
        if phase == "start":
            runs.append(info["generation"])
    gc.collect()
    gc.callbacks.append(count)
    try:
        snap = loads_snapshot(data, "big")
    finally:
        gc.callbacks.remove(count)
    assert len(snap["device_traces"][0]) == 200_000
    assert len(runs) <= 1, len(runs)   # at most the one young collection after it resumes
    assert gc.isenabled()


@pytest.mark.parametrize("key,value", [("addr", 1 << 64), ("size", 1 << 70), ("stream", -(1 << 64)),
                                       ("stream", 1 << 64)])
def test_the_loader_rejects_trace_integers_wider_than_64_bits(key, value):
    """One pass over the trace: the loader itself rejects what no allocator writes."""
    trace = _big_trace(10)
    trace[7][key] = value
    data = pickle.dumps({"segments": [], "device_traces": [trace]}, protocol=4)
    with pytest.raises(SnapshotError, match=r"device_traces\[0\]\[7\] has '%s' = .*which does not "
                                            r"fit in 64 bits" % key):
        loads_snapshot(data, "x")


def test_oom_entries_with_an_addr_and_allocs_with_device_free_are_checked_too():
    trace = _big_trace(4)
    trace[1]["device_free"] = 1 << 64
    with pytest.raises(SnapshotError, match="device_free"):
        normalize_snapshot({"segments": [], "device_traces": [trace]})
    oom = {"action": "oom", "device_free": 5, "size": 512, "stream": 0, "addr": -1}
    with pytest.raises(SnapshotError, match="'addr' = -1"):
        normalize_snapshot({"segments": [], "device_traces": [[oom]]})
