"""Safe snapshot loading: gpumem.snapshots.unpickle."""

from __future__ import annotations

import collections
import os
import pickle
import pickletools
import random
from pathlib import Path

import pytest

import gpumem.snapshots.unpickle as unpickle_mod
from gpumem.snapshots.unpickle import (Limits, SnapshotError, load_snapshot, loads_snapshot,
                                       normalize_snapshot)

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
    with pytest.raises(SnapshotError, match="negative 'addr' \\(-1\\)"):
        normalize_snapshot({"segments": [], "device_traces": [[oom]]})


# ------------------------------------------- hostile files (Note [Hostile snapshots])

def test_only_regular_files_are_read(tmp_path):
    """Issue 16.7: a FIFO with no writer hung in open(), /dev/zero grew
    without bound.  Both are refused before they are opened."""
    fifo = tmp_path / "fifo.pickle"
    os.mkfifo(fifo)
    with pytest.raises(SnapshotError) as ei:
        load_snapshot(fifo)
    assert _message(ei) == (f"{fifo} is a FIFO, not a regular file; gpumem reads snapshots "
                            f"only from regular files (copy the data into one)")
    for dev in ("/dev/zero", "/dev/null"):
        with pytest.raises(SnapshotError, match="is a character device, not a regular file"):
            load_snapshot(dev)
    link = tmp_path / "link.pickle"
    os.symlink(fifo, link)
    with pytest.raises(SnapshotError, match="is a FIFO"):
        load_snapshot(link)


def test_files_are_read_with_a_size_bound(tmp_path):
    path = tmp_path / "s.pickle"
    path.write_bytes(pickle.dumps(_snapshot(), protocol=4))
    size = path.stat().st_size
    assert load_snapshot(path, Limits(max_bytes=size)) == _snapshot()
    with pytest.raises(SnapshotError) as ei:
        load_snapshot(path, Limits(max_bytes=size - 1))
    assert _message(ei) == (f"{path} is larger than {size - 1} bytes, the most gpumem reads; "
                            f"if it is a genuine snapshot, raise the limit with --max-bytes")
    sparse = tmp_path / "sparse.pickle"
    with open(sparse, "wb") as f:
        f.truncate(unpickle_mod.MAX_BYTES + 1)
    with pytest.raises(SnapshotError, match="is larger than 2147483648 bytes"):
        load_snapshot(sparse)  # refused from its size: nothing is read
    with pytest.raises(SnapshotError, match="not a pickle file"):
        load_snapshot("/proc/self/status")  # regular, size 0, and read to its end


def test_memo_index_bombs_are_refused_before_unpickling():
    """Issue 16.6: 9 bytes that store to memo index 2**29 made the C
    unpickler allocate 8 GB before failing."""
    bomb = b"\x80\x02Nr" + (1 << 29).to_bytes(4, "little") + b"."
    assert len(bomb) == 9
    with pytest.raises(SnapshotError) as ei:
        loads_snapshot(bomb, name="m.pickle")
    assert _message(ei) == (
        "m.pickle is corrupt: at byte 3 it stores to memo entry 536870912 after only 0 stores "
        "(no pickler numbers them so; unpickling it would allocate memory for every entry in "
        "between); re-dump the snapshot")
    for data in (b"\x80\x02Np1000000000000\n.", b"\x80\x02Np1_000_000_000\n.",
                 b"\x80\x02Nr\xff\xff\xff\xff."):
        with pytest.raises(SnapshotError, match="stores to memo entry"):
            loads_snapshot(data)
    good = pickle.dumps(_snapshot(), protocol=2)  # BINPUT/LONG_BINPUT, numbered from 0
    assert loads_snapshot(good) == _snapshot()
    assert loads_snapshot(pickletools.optimize(good)) == _snapshot()
    with pytest.raises(SnapshotError, match="at byte 3 it stores to memo entry 1073741824"):
        loads_snapshot(good[:2] + b"Nr" + (1 << 30).to_bytes(4, "little") + b"0" + good[2:])


def test_the_memo_scan_agrees_with_every_pickler():
    from gpumem.snapshots.pickle_scan import refusal
    objs = [_snapshot(), {"s": ["x%d" % (i % 300) for i in range(5000)],
                          "l": [[i] * 3 for i in range(3000)], "f": 1.5, "b": b"\x00" * 300,
                          "t": (1, (2, 3)), "big": 1 << 3000, "neg": -(1 << 70)}]
    for obj in objs:
        for protocol in (2, 3, 4, 5):
            data = pickle.dumps(obj, protocol=protocol)
            assert refusal(data) is None and refusal(pickletools.optimize(data)) is None


def test_an_argument_longer_than_the_data_is_refused_before_unpickling():
    """A length prefix naming more bytes than follow is a truncated file,
    refused before the unpickler allocates that length (1 TiB here: on
    CPython 3.9 and 3.10 the failed BYTEARRAY8 allocation also leaks a
    buffer export)."""
    from gpumem.snapshots.pickle_scan import refusal
    tail = b"x" * 100
    for op in (b"\x96", b"\x8e"):  # BYTEARRAY8, BYTES8
        data = b"\x80\x05" + op + (1 << 40).to_bytes(8, "little") + tail
        assert refusal(data) == ("overlong", 2, 1 << 40, len(tail))
        with pytest.raises(SnapshotError) as ei:
            loads_snapshot(data)
        assert _message(ei) == "snapshot data is truncated (pickle data ended early); re-dump the snapshot"
    exact = b"\x80\x05\x96" + (3).to_bytes(8, "little") + b"abc."
    assert refusal(exact) is None


def _shared(n_lists: int, per_list: int) -> bytes:
    entry = {"action": "alloc", "addr": 4096, "size": 512, "stream": 0}
    return pickle.dumps({"segments": [], "device_traces": [[entry] * per_list] * n_lists},
                        protocol=4)


def test_shared_reference_bombs_are_refused_from_list_lengths():
    """Issue 16.5: a 202 KB pickle holding 10**8 trace entries ran past 60 s;
    100 segments sharing 100,000 blocks reached 1.4 GB."""
    import time
    bomb = _shared(1000, 100_000)
    assert len(bomb) < 250_000
    start = time.monotonic()
    with pytest.raises(SnapshotError) as ei:
        loads_snapshot(bomb, name="b.pickle")
    assert time.monotonic() - start < 2
    assert _message(ei).startswith(
        f"b.pickle holds more than 250,000 segments, blocks and trace entries (counting each "
        f"reference to a shared list), more than a recorder writes into {len(bomb):,} bytes "
        f"(one per 8 bytes, at least 250,000): its lists repeat the same objects; if the file is "
        f"genuine, raise the limit with --max-records")
    block = {"size": 512, "state": "inactive"}
    seg = {"device": 0, "address": 0, "total_size": 512 * 100_000, "blocks": [block] * 100_000}
    with pytest.raises(SnapshotError, match="holds more than 250,000"):
        loads_snapshot(pickle.dumps([seg] * 100, protocol=4))


def test_the_records_limit_follows_the_file_and_can_be_raised():
    under = _shared(1, 200_000)  # under the floor: loaded (each shared entry checked once)
    assert len(loads_snapshot(under)["device_traces"][0]) == 200_000
    over = _shared(1, 300_000)
    assert unpickle_mod.records_limit(len(over)) == 250_000
    with pytest.raises(SnapshotError, match="holds more than 250,000"):
        loads_snapshot(over)
    assert len(loads_snapshot(over, limits=Limits(max_records=300_000))["device_traces"][0]) \
        == 300_000
    with pytest.raises(SnapshotError) as ei:
        loads_snapshot(pickle.dumps(_snapshot()), name="s", limits=Limits(max_records=3))
    assert _message(ei) == ("s holds more than 3 segments, blocks and trace entries (counting "
                            "each reference to a shared list), the limit set by --max-records")
    assert unpickle_mod.records_limit(80 << 20) == 10 << 20  # one per 8 bytes
    # a dict built in memory is not a file: no records limit
    big = {"device_traces": [[{"action": "free", "addr": 1, "size": 1}] * 300_000]}
    assert normalize_snapshot(big)["device_traces"] == big["device_traces"]


@pytest.mark.parametrize("value", [10 ** 5000, -(10 ** 5000), 1 << 64, -(1 << 64)],
                         ids=["5000-digits", "minus-5000-digits", "2^64", "minus-2^64"])
@pytest.mark.parametrize("where", [("segments", 0, "address"), ("segments", 0, "stream"),
                                   ("segments", 0, "blocks", 0, "size"),
                                   ("device_traces", 0, 1, "size"),
                                   ("device_traces", 0, 2, "device_free")])
def test_integers_that_do_not_fit_in_64_bits_are_one_sentence(where, value):
    """Issue 16.8: a 5000-digit integer made the error path's str() raise."""
    snap = _snapshot()
    obj = snap
    for k in where[:-1]:
        obj = obj[k]
    obj[where[-1]] = value
    with pytest.raises(SnapshotError) as ei:
        loads_snapshot(pickle.dumps(snap), name="n.pickle")
    msg = _message(ei)
    assert len(msg) < 300 and (("does not fit in 64 bits" in msg) or "negative" in msg), msg
    if abs(value) > 1 << 80:
        assert "an integer of about 5001 digits" in msg, msg


def test_short_int():
    assert unpickle_mod.short_int(12345) == "12345"
    assert unpickle_mod.short_int(-(1 << 64)) == str(-(1 << 64))
    assert unpickle_mod.short_int(10 ** 5000) == "(an integer of about 5001 digits)"
    assert unpickle_mod.short_int(-(10 ** 5000)) == "-(an integer of about 5001 digits)"


def test_a_persistent_id_is_named_without_its_repr():
    value = ["x"] * 10
    for _ in range(9):
        value = [value] * 10  # repr(value) would be 10**10 characters

    class P(pickle.Pickler):
        def persistent_id(self, obj):
            return value if obj == "marker" else None
    buf = __import__("io").BytesIO()
    P(buf, protocol=2).dump({"segments": ["marker"]})
    with pytest.raises(SnapshotError, match=r"persistent id <list>\)"):
        loads_snapshot(buf.getvalue())
