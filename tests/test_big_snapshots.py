"""Big snapshots: the streaming generator (tests/snapshot_gen.py) and the
native snapshot reader (gpumem._C.read_snapshot_pickle, Note [Compact trace
entries]) against the reference, Python's unpickler."""

from __future__ import annotations

import pickle

import pytest

from snapshot_gen import synthetic_dict, write_snapshot


@pytest.mark.parametrize("events", [0, 1, 250, 3001])
def test_the_generator_writes_the_dict_it_describes(tmp_path, events):
    path = tmp_path / "big.pickle"
    size = write_snapshot(path, events)
    assert size == path.stat().st_size
    snap = pickle.loads(path.read_bytes())
    assert snap == synthetic_dict(events)
    assert len(snap["device_traces"][0]) == events


# ------------------------------------------------------------ the native reader

import io  # noqa: E402
import random  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import sanitized_ext  # noqa: E402
from gpumem import _C  # noqa: E402
from gpumem.snapshots import unpickle  # noqa: E402
from gpumem.snapshots.unpickle import SnapshotError, loads_snapshot  # noqa: E402

SNAPSHOTS = Path(__file__).parent.parent.parent / "shared" / "snapshots"
REAL = sorted(SNAPSHOTS.glob("*.pickle")) if SNAPSHOTS.is_dir() else []
needs_real = pytest.mark.skipif(not REAL, reason=f"real snapshots not found at {SNAPSHOTS}")


def reference(data: bytes, name: str = "snap") -> dict:
    """The snapshot as loads_snapshot loads it with the reference reader
    (Python's unpickler) in place of the native one."""
    native = unpickle._read_native
    unpickle._read_native = lambda data, name: unpickle._UNSUPPORTED
    try:
        return loads_snapshot(data, name)
    finally:
        unpickle._read_native = native


def outcome(load, data: bytes):
    try:
        return "ok", load(data, "snap")
    except SnapshotError as e:
        return "refused", str(e)


@pytest.mark.slow
def test_a_generated_trace_becomes_records_equal_to_the_reference(tmp_path):
    path = tmp_path / "big.pickle"
    write_snapshot(path, 20_000)
    data = path.read_bytes()
    snap = loads_snapshot(data)
    trace = snap["device_traces"][0]
    assert isinstance(trace, _C.TraceColumns) and len(trace) == 20_000
    ref = reference(data)
    assert snap == ref
    assert [trace[i] for i in (0, 1, 19_999, -1)] == [ref["device_traces"][0][i]
                                                    for i in (0, 1, 19_999, -1)]
    with pytest.raises(IndexError):
        trace[20_000]


@needs_real
@pytest.mark.parametrize("path", REAL, ids=[p.name[:40] for p in REAL])
def test_every_real_snapshot_loads_equal_to_the_reference(path):
    data = path.read_bytes()
    snap = loads_snapshot(data)
    assert snap == reference(data)
    assert all(isinstance(t, _C.TraceColumns) for t in snap["device_traces"] if len(t))


def _entry(**kw):
    e = {"action": "alloc", "addr": 4096, "size": 512, "stream": 0}
    e.update(kw)
    return e


@pytest.mark.parametrize("trace", [
    [_entry(), 7],                                   # a non-dict after records
    [_entry(), _entry(size=-1)],                     # a negative size
    [_entry(), _entry(addr=1 << 64)],                # past 64 bits
    [_entry(), _entry(size=True)],                   # a bool is not an int here
    [_entry(), {"action": "oom", "size": 1}],        # an oom without device_free
    [_entry(), _entry(a=1, b=2, c=3, d=4)],          # more values than a record holds
    [_entry(), {**_entry(), 5: 1}],                  # a key that is not a str
], ids=["non-dict", "negative", "too-big", "bool", "oom", "extra-keys", "int-key"])
def test_entries_that_cannot_be_records_leave_the_list_as_the_reference_reads_it(trace):
    data = pickle.dumps({"segments": [], "device_traces": [trace]}, protocol=4)
    native, ref = outcome(loads_snapshot, data), outcome(lambda d, n: reference(d, n), data)
    assert native == ref
    if native[0] == "ok":
        assert isinstance(native[1]["device_traces"][0], list)


def test_shared_lists_and_entries_keep_their_meaning():
    e = _entry(frames=[{"filename": "a.py", "line": 1, "name": "f"}])
    trace = [e, _entry(addr=8192), e]                 # one entry twice: stays dicts
    other = [_entry(addr=1), _entry(addr=2)]
    snap = {"segments": [], "device_traces": [other, trace, other],  # a trace twice
            "extra": [other]}                                     # and named elsewhere
    data = pickle.dumps(snap, protocol=4)
    got = loads_snapshot(data)
    assert got == reference(data)
    assert isinstance(got["device_traces"][1], list)
    assert isinstance(got["extra"][0], list) and got["extra"][0] == other


class _Global:
    pass


def _refusals():
    out = {}
    for proto in (2, 3, 4, 5):
        out[f"global-p{proto}"] = pickle.dumps({"segments": [_Global]}, protocol=proto)
    out["reduce"] = pickle.dumps(io.BytesIO(b"x"), protocol=4)

    class P(pickle.Pickler):
        def persistent_id(self, obj):
            return "pid-1" if obj == "secret" else None
    buf = io.BytesIO()
    P(buf, protocol=4).dump({"segments": [], "x": "secret"})
    out["binpersid"] = buf.getvalue()
    out["persid"] = b"\x80\x02Ppid-1\n."
    good = pickle.dumps({"segments": [], "device_traces": [[_entry()] * 3]}, protocol=4)
    out["truncated"] = good[:-5]
    out["memo-bomb"] = b"\x80\x04N" + b"r" + (1 << 29).to_bytes(4, "little") + b"."
    for op in b"Rbo\x81\x92\x82\x83\x84\x97\x98Q":
        out[f"op-{op:02x}"] = b"\x80\x04N" + bytes([op]) + b"\x00\x00\x00\x00."
    out["bad-key"] = b"\x80\x04\xff."
    out["underflow"] = b"\x80\x04a."
    out["unhashable"] = b"\x80\x04}](u."[:-2] + b"]N" + b"u."
    return out


@pytest.mark.parametrize("name,data", list(_refusals().items()), ids=list(_refusals()))
def test_refused_as_the_reference_refuses(name, data):
    native = outcome(loads_snapshot, data)
    ref = outcome(lambda d, n: reference(d, n), data)
    assert native[0] == ref[0] == "refused", (native, ref)
    if name.startswith(("global", "persid", "truncated", "memo")):
        assert native == ref


def _mutants(seed: int, count: int):
    rng = random.Random(seed)
    frames = [{"filename": "/u/train.py", "line": 3, "name": "step"}]
    base = pickle.dumps({"segments": [{"device": 0, "address": 1 << 32, "total_size": 1 << 21,
                                       "stream": 0, "blocks": [{"size": 1 << 21,
                                                                "state": "inactive"}]}],
                         "device_traces": [[_entry(addr=4096 * i, frames=frames, time_us=i)
                                            for i in range(6)]]}, protocol=4)
    for _ in range(count):
        data = bytearray(base)
        for _ in range(rng.randrange(1, 4)):
            kind = rng.randrange(3)
            i = rng.randrange(2, len(data))
            if kind == 0:
                data[i] = rng.randrange(256)
            elif kind == 1:
                del data[i:i + rng.randrange(1, 8)]
            else:
                data[i:i] = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 6)))
        yield bytes(data)


@pytest.mark.slow
def test_mutated_snapshots_load_or_are_refused_as_the_reference_does():
    differ = []
    for data in _mutants(seed=34, count=3000):
        native = outcome(loads_snapshot, data)
        ref = outcome(lambda d, n: reference(d, n), data)
        if native[0] != ref[0] or (native[0] == "ok" and native[1] != ref[1]):
            differ.append((data, native, ref))
    assert not differ, differ[:3]


_FUZZ = """
import pickle, random, sys
sys.path.insert(0, {tests!r})
from test_big_snapshots import _mutants, _refusals, _ODD_WAYS
from gpumem import _C
n = 0
odd = [b"\\x80\\x04" + ops + b"." for ops in _ODD_WAYS.values()]
for data in list(_mutants(seed=7, count=4000)) + list(_refusals().values()) + odd:
    for compact in (True, False):
        try:
            obj = _C.read_snapshot_pickle(data, compact)
            if isinstance(obj, dict):
                for t in obj.get("device_traces") or []:
                    list(t) if isinstance(t, _C.TraceColumns) else None
            n += 1
        except (ValueError, MemoryError):
            n += 1
print("fuzzed", n)
"""


@pytest.mark.slow
@pytest.mark.skipif(sanitized_ext.find_cc() is None, reason="no C compiler found")
def test_the_reader_under_asan_on_mutated_and_refused_inputs(tmp_path_factory):
    lib, env = sanitized_ext.built(tmp_path_factory)
    p = subprocess.run([sys.executable, "-c", _FUZZ.format(tests=str(Path(__file__).parent))],
                       cwd=lib, env=env, capture_output=True, text=True, timeout=900)
    out = p.stdout + p.stderr
    sanitized_ext.assert_clean(out, "the snapshot reader's fuzz run")
    assert p.returncode == 0 and "fuzzed 8" in out, out[-3000:]


def test_a_repeated_trace_list_is_refused_before_it_is_walked(tmp_path):
    trace = [_entry(addr=4096 * (i + 1)) for i in range(1000)]
    data = pickle.dumps({"segments": [], "device_traces": [trace] * 2000}, protocol=4)
    t0 = time.perf_counter()
    with pytest.raises(SnapshotError, match="repeat the same objects"):
        loads_snapshot(data)
    assert time.perf_counter() - t0 < 2.0


def _reports(snap: dict, name: str) -> dict:
    from gpumem.snapshots import summary, view
    return {"summary": summary.summarize(snap, name, top=10),
            "diff": summary.diff(snap, snap, (name, name)),
            "view": view.build_payload(snap, name)}


@pytest.mark.slow
def test_summary_diff_and_view_of_records_equal_the_reference_on_a_generated_snapshot(
        tmp_path):
    path = tmp_path / "g.pickle"
    write_snapshot(path, 3000)
    data = path.read_bytes()
    snap = loads_snapshot(data)
    assert isinstance(snap["device_traces"][0], _C.TraceColumns)
    assert _reports(snap, "g") == _reports(reference(data), "g")


@pytest.mark.slow
@needs_real
@pytest.mark.parametrize("path", REAL, ids=[p.name[:40] for p in REAL])
def test_summary_diff_and_view_of_records_equal_the_reference_on_real_snapshots(path):
    data = path.read_bytes()
    assert _reports(loads_snapshot(data), path.name) == _reports(reference(data), path.name)


# ------------------------------------ entries read without their dict (staged)
# Note [Staged trace entries]: a trace entry's SETITEMS keeps its pairs aside
# and the dict stays empty until APPENDS takes it as a record; every other way
# off the stack must give the dict its pairs first. Hand-built protocol-4
# pickles take each of those ways; the reader must build what pickle.loads does.

def _s(text: str) -> bytes:
    raw = text.encode()
    return b"\x8c" + bytes([len(raw)]) + raw


def _pairs(addr: int = 4096, extra: bytes = b"") -> bytes:
    return (b"(" + _s("action") + _s("alloc") + _s("addr") + b"J" + addr.to_bytes(4, "little")
            + _s("size") + b"K\x08" + _s("stream") + b"K\x00" + extra + b"u")


def _entry_ops(slot: int, addr: int = 4096, extra: bytes = b"") -> bytes:
    return b"}q" + bytes([slot]) + _pairs(addr, extra)  # EMPTY_DICT, BINPUT, its SETITEMS


_ODD_WAYS = {  # each leaves one list on the stack
    "dup": b"](" + _entry_ops(1) + b"2e",
    "memo-get-before-appends": b"](" + _entry_ops(1) + b"h\x01e",
    "memo-get-after-appends": b"](" + _entry_ops(1) + _entry_ops(2, 8192) + b"eh\x01a",
    "pop": b"](" + _entry_ops(1) + b"0" + _entry_ops(2, 8192) + b"e",
    "pop-mark": b"](" + _entry_ops(1) + _entry_ops(2, 8192) + b"1(" + _entry_ops(3) + b"e",
    "into-a-tuple": b"](" + _entry_ops(1) + b"\x85" + _entry_ops(2, 8192) + b"e",
    "list-from-mark": b"](" + _entry_ops(1) + b"(" + _entry_ops(2) + b"le",
    "second-setitems": b"](" + _entry_ops(1) + b"(" + _s("frames") + b"]u" + _entry_ops(2) + b"e",
    "value-of-another": b"](" + _entry_ops(1) + _entry_ops(2) + b"(" + _s("of") + b"h\x01ue",
    "as-a-value": b"](" + _entry_ops(1) + b"}(" + _s("x") + b"h\x01ue",
    "repeated-key": b"](" + _entry_ops(1, extra=_s("size") + b"K\x09" + _s("addr")
                                        + b"K\x07") + _entry_ops(2) + b"e",
    "after-a-non-entry": b"](K\x07" + _entry_ops(1) + b"e",
    "bad-size": b"](" + _entry_ops(1) + b"}q\x02(" + _s("action") + _s("alloc") + _s("addr")
                + b"K\x01" + _s("size") + b"\x8a\x01\xffu" + b"e",
    "append-one": b"]" + _entry_ops(1) + b"a" + _entry_ops(2, 8192) + b"a",
    "two-lists": b"](" + _entry_ops(1) + b"](" + _entry_ops(2) + b"e" + _entry_ops(3) + b"e",
}


# As a real snapshot has them after its first entry: keys and action names as
# memo GETs, so each entry is staged straight from the data, its ints never
# made (gm_pk_stage_direct); the prefix memoizes them and pops them.
_MEMO_STRS = ("action", "alloc", "addr", "size", "stream", "frames", "x", "of")


def _with_memo_keys(ops: bytes) -> bytes:
    prefix = b"("
    for i, text in enumerate(_MEMO_STRS):
        prefix += _s(text) + b"q" + bytes([0x40 + i])
        ops = ops.replace(_s(text), b"h" + bytes([0x40 + i]))
    return prefix + b"1" + ops


@pytest.mark.parametrize("name", list(_ODD_WAYS))
@pytest.mark.parametrize("where", ["bare", "device-trace"])
@pytest.mark.parametrize("keys", ["str", "memo"])
def test_staged_entries_leave_the_stack_as_the_reference_reads_them(name, where, keys):
    ops = _ODD_WAYS[name]
    if where == "bare":
        data = ops + b"."
    else:
        data = b"}(" + _s("segments") + b"]" + _s("device_traces") + b"](" + ops + b"eu."
    data = b"\x80\x04" + (_with_memo_keys(data) if keys == "memo" else data)
    ref = pickle.loads(data)
    for compact in (True, False):
        got = _C.read_snapshot_pickle(data, compact)
        trace = got if where == "bare" else got["device_traces"][0]
        want = ref if where == "bare" else ref["device_traces"][0]
        assert got == ref and len(trace) == len(want)
        items = [trace[i] for i in range(len(trace))]
        assert items == want  # each entry whole, not an empty dict
        for i, j in [(i, j) for i in range(len(want)) for j in range(len(want))]:
            # what the reference shares is shared, but for a record the memo
            # names later: that comes back a new dict (Note [Compact trace entries])
            if isinstance(trace, list) and name != "memo-get-after-appends":
                assert (items[i] is items[j]) == (want[i] is want[j])


def test_staged_entries_end_as_the_reference_reads_them():
    for tail in (b".", b"\x85.", b"0e."):  # STOP on it, in a tuple, dropped
        data = b"\x80\x04](" + _entry_ops(1) + tail
        assert _C.read_snapshot_pickle(data) == pickle.loads(data)
    data = b"\x80\x04](" + _entry_ops(1) + b"Q."  # a persistent id: the entry named whole
    with pytest.raises(ValueError) as e:
        _C.read_snapshot_pickle(data)
    assert e.value.args[0] == "persid" and e.value.args[1]["size"] == 8


# Values of every form the direct staging reads (Note [Staged trace entries]):
# ints of each width and sign, into unsigned, signed and other fields, None,
# a memo GET of a list and of an empty dict; and forms it leaves to SETITEMS
# (LONG1 of 9 bytes, LONG4, a bool, a str made in place).
_VALUES = {
    "K": b"K\xfe", "M": b"M\xff\xff", "J-negative": b"J\xfe\xff\xff\xff",
    "J-positive": b"J\x00\x00\x00\x40", "LONG1-empty": b"\x8a\x00",
    "LONG1-8-top-bit": b"\x8a\x08" + bytes(7) + b"\x80",
    "LONG1-8": b"\x8a\x08" + b"\xff" * 7 + b"\x7f",
    "LONG1-3-negative": b"\x8a\x03\x00\x00\x80", "LONG1-9": b"\x8a\x09" + b"\xff" * 8 + b"\x00",
    "LONG4": b"\x8b\x02\x00\x00\x00\x01\x02", "None": b"N", "bool": b"\x88",
    "str": _s("s"), "memo-list": b"h\x30", "memo-empty-dict": b"h\x31",
}


@pytest.mark.parametrize("key", ["addr", "size", "stream", "time_us", "device"])
@pytest.mark.parametrize("value", list(_VALUES))
def test_entries_staged_from_the_data_read_as_the_reference_reads_them(key, value):
    names = ("action", "alloc", "addr", "size", "stream", key)
    prefix = b"(" + b"".join(_s(n) + b"q" + bytes([0x40 + i]) for i, n in enumerate(names))
    prefix += b"]q\x30}q\x31" + b"1"
    get = {n: b"h" + bytes([0x40 + i]) for i, n in enumerate(names)}

    def entry(slot: int, v: bytes) -> bytes:
        pairs = {"action": get["alloc"], "addr": b"K\x10", "size": b"K\x08", "stream": b"K\x00"}
        pairs[key] = v
        return b"}q" + bytes([slot]) + b"(" + b"".join(get[k] + pairs[k] for k in pairs) + b"u"

    ops = b"](" + entry(1, b"K\x01") + entry(2, _VALUES[value]) + entry(3, b"K\x02") + b"e"
    for data in (b"\x80\x04" + prefix + ops + b".",
                 b"\x80\x04" + prefix + b"}(" + _s("device_traces") + b"](" + ops + b"eu."):
        ref = pickle.loads(data)
        got = _C.read_snapshot_pickle(data)
        assert got == ref
        trace = got if isinstance(ref, list) else got["device_traces"][0]
        want = ref if isinstance(ref, list) else ref["device_traces"][0]
        assert [trace[i] for i in range(len(trace))] == want
