"""Every function and method of gpumem._C called with hostile arguments.

    python tests/c_api_fuzz.py [--testext PATH_TO__testext.so]

Wrong types, out-of-range numbers (negative, 2**63, 2**64, 2**100, NaN),
0 and unknown pointers, pointers inside blocks and already freed, buffers of
the wrong length, settings dicts with bad values, and the calls in an order
that makes no sense (free twice, record_stream after free, exit a backward
context never entered).  Each call must return or raise an ordinary
exception: never crash, never SystemError (a C function that returned NULL
without an exception, or the reverse), and every allocator must pass its
invariant check afterwards.

Run by tests/test_c_api_misuse.py in a subprocess on the normal build and,
in the slow tier, on the ASan+UBSan build of the extension (a crash or a
sanitizer report fails the test).  The script lists what it called; a
function or method of _C that it does not know makes it fail, so a new
entry point cannot escape the fuzzing.  Prints "FUZZ OK <calls>" at the end.
"""

from __future__ import annotations

import array
import gc
import itertools
import os
import random
import sys

import gpumem._C as C

MiB = 1 << 20
BAD = [None, "x", "", b"x", 1.5, float("nan"), float("inf"), -1, 0, 1, 3, 2**31, 2**32,
       2**62 + 1, 2**63 - 1, 2**63, 2**64 - 1, 2**64, 2**100, -2**31, -2**63, -2**63 - 1,
       -2**100, True, [], {}, (), [1] * 16, object()]
# Names that are not entry points to call.
NOT_CALLED = {"OutOfMemoryError", "_core_api", "_hist_api"}
calls = 0


def call(fn, *args, **kwargs):
    """fn(*args, **kwargs); an ordinary exception is an answer, SystemError is a bug."""
    global calls
    calls += 1
    try:
        return fn(*args, **kwargs)
    except SystemError:
        raise
    except Exception:  # noqa: BLE001 - any ordinary exception is a fine answer
        return None


def check(a, what):
    bad, msg = a.check()
    assert bad == 0, f"{what}: invariant check failed: {msg}"


def arg_lists(arity, rng, n_random=200):
    """Every BAD value alone, every pair for arity >= 2, then random tuples up to arity + 1."""
    out = [()] + [(v,) for v in BAD]
    if arity >= 2:
        out += list(itertools.product(BAD, repeat=2))
    for _ in range(n_random):
        out.append(tuple(rng.choice(BAD) for _ in range(rng.randint(0, arity + 1))))
    return out


# ----------------------------------------------------------- module functions

def fuzz_size_policy(rng):
    for name in ("round_size", "is_small", "segment_size", "format_size", "default_settings",
                 "cuda_last_result"):
        for args in arg_lists(2, rng):
            call(getattr(C, name), *args)
    for settings in settings_variants():
        for size in (0, 1, 511, MiB, 2**40, 2**62, 2**63, 2**64 - 1, 2**64, -1):
            call(C.round_size, size, settings)
            call(C.round_size, size=size, settings=settings)


def settings_variants():
    good = C.default_settings()
    out = [None, good, {}, [], "expandable_segments:True", {"nope": 1}]
    for key in good:
        for v in BAD:
            s = dict(good)
            s[key] = v
            out.append(s)
    for v in BAD:
        out.append({"roundup_power2_divisions": [v] * 16})
        out.append({"roundup_power2_divisions": [v]})
    out.append({"max_split_size": 2**63 + MiB})
    out.append({"roundup_power2_divisions": [2**40] * 16})
    return out


def fuzz_replay(rng):
    def u64(values):
        return array.array("Q", values).tobytes()
    n = 4
    good = (bytes([0, 0, 1, 1]), u64([4096, 8192, 4096, 8192]), u64([100, 2**20, 0, 0]),
            u64([0] * n))
    call(C.replay, *good)
    for args in arg_lists(4, rng):
        call(C.replay, *args)
    for i in range(4):
        for v in BAD + [b"", b"\x02" * n, b"\x00" * (8 * n - 1), u64([2**64 - 1] * n)]:
            args = list(good)
            args[i] = v
            call(C.replay, *args)
    specials = [0, 1, 511, 2**62, 2**62 + 1, 2**63, 2**64 - 1]
    for addr, size in itertools.product(specials, specials):
        call(C.replay, bytes([0, 0, 1]), u64([addr, addr, addr]), u64([size, size, 0]),
             u64([0, 0, 0]))
    for kw in ("capacity", "granularity", "settings"):
        for v in BAD:
            call(C.replay, *good, **{kw: v})
    for cap, gran in itertools.product([0, 1, 512, 2**21, 2**40, 2**63, 2**64 - 1],
                                       [0, 1, 3, 4096, 2**21, 2**40, 2**63]):
        call(C.replay, *good, capacity=cap, granularity=gran)


def fuzz_history(rng, a):
    for args in arg_lists(6, rng):
        call(C._hist_configure, *args)
    for enabled, context in itertools.product([-1, 0, 1, 2, 3, 2**31], [-1, 0, 1, 2, 3, 4]):
        for max_entries in (0, 1, 3, 2**63, 2**64 - 1):
            call(C._hist_configure, enabled, context, rng.random() < 0.5, max_entries,
                 rng.random() < 0.5, rng.choice([0, 1, 2**31, 2**32 - 1]))
            p = call(a.malloc, 4096)
            if p:
                call(a.free, p)
    C._hist_configure(2, 3, True, 1000)
    for name in ("_hist_capture", "_hist_traceback", "_hist_set_metadata",
                 "_hist_backward_exit", "_hist_backward_enter", "_hist_get_metadata",
                 "_hist_config", "_hist_counts", "_hist_overhead_bytes", "_hist_snapshot",
                 "_hist_seq"):
        for args in arg_lists(2, rng, 50):
            call(getattr(C, name), *args)
            if name == "_hist_backward_exit":  # whatever context it left, allocations work
                p = call(a.malloc, 512)
                if p:
                    call(a.free, p)
    for tb in (0, 1, 2, 7, 2**31, 2**32 - 1, 2**32, -1):
        call(C._hist_traceback, tb)
        call(C._hist_backward_exit, tb)
        p = call(a.malloc, 1000)
        call(C._hist_snapshot)
        call(C._hist_snapshot, clamp=True)
        call(C._hist_snapshot, clamp=True, seqs=True)
        call(C._hist_seq, tb)
        if p:
            call(a.free, p)
    call(C._hist_set_metadata, "m" * (1 << 20))
    call(C._hist_set_metadata, "\udcff")
    call(C._hist_backward_exit, 0)
    C._hist_configure(0, 0)
    check(a, "history")


# ----------------------------------------------------------- the Allocator

CTOR_KW = ["capacity", "granularity", "mode", "settings", "device", "num_devices",
           "backend", "libcuda", "device_backend"]


def fuzz_constructor(rng):
    for args in arg_lists(3, rng):
        a = call(C.Allocator, *args)
        if a is not None:
            exercise(a, "Allocator%r" % (args,))
    for kw in CTOR_KW:
        for v in BAD:
            a = call(C.Allocator, **{kw: v})
            if a is not None:
                exercise(a, f"Allocator({kw}={v!r})")
    for settings in settings_variants():
        a = call(C.Allocator, capacity=256 * MiB, settings=settings)
        if a is not None:
            exercise(a, f"Allocator(settings={settings!r})")
    for cap, gran in itertools.product([0, 1, 4096, 64 * MiB, 2**40, 2**63, 2**64 - 1],
                                       [0, 1, 3, 4096, 2 * MiB, 2**40, 2**63]):
        for exp in (False, True):
            a = call(C.Allocator, capacity=cap, granularity=gran,
                     settings={"expandable_segments": exp})
            if a is not None:
                exercise(a, f"Allocator(capacity={cap}, granularity={gran}, exp={exp})")
    for mode, dev, ndev in itertools.product(["virtual", "host", "x"], [-1, 0, 1, 63, 64, 2**31],
                                             [-1, 0, 1, 2, 65, 2**31]):
        a = call(C.Allocator, capacity=64 * MiB, mode=mode, device=dev, num_devices=ndev)
        if a is not None:
            exercise(a, f"Allocator(mode={mode}, device={dev}, num_devices={ndev})")
    # Used before __init__, and __init__ twice.
    raw = C.Allocator.__new__(C.Allocator)
    for name in methods():
        call(getattr(raw, name))
        call(getattr(raw, name), 0)
    a = C.Allocator(capacity=64 * MiB)
    call(a.__init__, capacity=32 * MiB)
    exercise(a, "re-initialised")


def exercise(a, what):
    """A few ordinary operations on an allocator the fuzzing built."""
    ptrs = [call(a.malloc, n) for n in (1, 4096, 3 * MiB)]
    for p in ptrs:
        if p:
            call(a.record_stream, p, 5)
            call(a.free, p)
    call(a.empty_cache)
    call(a.stats)
    call(a.segments)
    check(a, what)


def methods():
    return sorted(m for m in dir(C.Allocator) if not m.startswith("__"))


POINTER_METHODS = {"free", "block_size", "record_stream"}


def fuzz_methods(rng, a, dev=None):
    live = [a.malloc(n) for n in (512, 4096, MiB + 1, 12 * MiB)]
    freed = a.malloc(8192)
    a.free(freed)
    pointers = [0, 1, 0x1234, 2**64 - 1, -1, 2**64, freed, freed + 512] + [
        p + off for p in live for off in (0, 1, 512, -512)]
    for name in methods():
        m = getattr(a, name)
        if name in ("free",):
            continue  # below, once the rest has had the live blocks
        for args in arg_lists(2, rng, 100):
            call(m, *args)
        check(a, name)
        if name in POINTER_METHODS:
            for p in pointers:
                for s in (0, 1, 5, 2**64 - 1, -1):
                    call(m, p, s) if name == "record_stream" else call(m, p)
            check(a, name + " on pointers")
    for kw, vals in (("size", BAD), ("stream", BAD), ("ctx", BAD)):
        for v in vals:
            args = {"size": 4096, kw: v}
            p = call(a.malloc, **args)
            if p:
                call(a.free, p, ctx=v if kw == "ctx" else 0)
    for p in pointers:
        for v in (None, "x", -1, 0, 2**32, 2**64):
            call(a.free, p, ctx=v)
            call(a.free, ptr=p, ctx=v)
        call(a.free, p)
    for p in live:
        call(a.free, p)
        call(a.free, p)             # a second free
        call(a.record_stream, p, 3)  # after free
        call(a.block_size, p)
    for frac in (-1.0, 0.0, 0.5, 1.0, 1.5, float("nan"), float("inf"), "x", None, 2**70):
        call(a.set_memory_fraction, frac)
        p = call(a.malloc, 3 * MiB)
        if p:
            call(a.free, p)
    call(a.set_memory_fraction, 1.0)
    for lim in (0, 1, 512, 2**63, 2**64 - 1, -1, 2**64):
        call(a.set_memory_limit, lim)
        p = call(a.malloc, 3 * MiB)
        if p:
            call(a.free, p)
    call(a.set_memory_limit, 0)
    for settings in settings_variants():
        call(a.set_settings, settings)
        p = call(a.malloc, 25 * MiB)
        if p:
            call(a.free, p)
    call(a.set_settings, C.default_settings())
    if dev is not None:  # events that never complete, then complete
        p = a.malloc(4096)
        a.record_stream(p, 9)
        a.free(p)
        call(a.process_events)
        dev.complete_events()
        call(a.process_events)
    call(a.empty_cache)
    check(a, "methods")


def fuzz_device_backend(rng, testext):
    for v in BAD + [testext.VirtualDevice(capacity=64 * MiB).gm_backend]:
        call(C.Allocator, device_backend=v)
    dev = testext.VirtualDevice(capacity=1 << 30, event_mode="never")
    for kw in ("capacity", "backend", "mode", "libcuda"):
        call(C.Allocator, device_backend=dev, **{kw: "virtual"})
    for device in (-1, 0, 63, 64, 2**31 - 1):
        a = call(C.Allocator, device_backend=dev, device=device)
        if a is not None:
            exercise(a, f"device_backend, device={device}")
    a = C.Allocator(device_backend=dev)
    rec = testext.TraceRecorder(a)
    fuzz_methods(rng, a, dev)
    rec.take()
    fns = ("seg_alloc", "seg_free", "event_create", "event_record", "event_query", "map",
           "unmap", "va_reserve")
    for fn, code, exp in itertools.product(fns, (1, 7, -5, -10, -100, 2**31 - 1, -2**31),
                                           (False, True)):
        d = testext.VirtualDevice(capacity=256 * MiB, event_mode="after_n", event_after_n=1)
        b = C.Allocator(device_backend=d, settings={"expandable_segments": exp})
        for nth in (1, 2, 3):
            d.set_failure(fn, nth=nth, code=code)
            for _ in range(2):
                p = call(b.malloc, 4096)
                q = call(b.malloc, 3 * MiB)
                for x in (p, q):
                    if x:
                        call(b.record_stream, x, 7)
                        call(b.free, x)
                call(b.process_events)
                call(b.empty_cache)
            check(b, f"backend {fn} returning {code}")
    for args in arg_lists(4, rng, 50):
        call(dev.set_failure, *args)
    del dev  # the Allocator keeps its device alive
    exercise(a, "device_backend after del")


def fuzz_snapshot_reader(rng):
    """read_snapshot_pickle on wrong types and on a snapshot cut and flipped
    at random; TraceColumns (made only by the reader) indexed out of range."""
    import pickle
    entries = [{"action": a, "addr": 1 << 40, "size": 512, "stream": 0, "time_us": t,
                "frames": [{"filename": "f.py", "line": 3, "name": "g"}]}
               for t, a in enumerate(["alloc", "free_completed"] * 3)]
    snap = {"segments": [], "device_traces": [entries]}
    data = pickle.dumps(snap, protocol=4)
    for args in arg_lists(2, rng, 50):
        call(C.read_snapshot_pickle, *args)
    call(C.TraceColumns)
    for _ in range(300):
        b = bytearray(data[:rng.randrange(len(data) + 1)])
        for _ in range(rng.randrange(4)):
            if b:
                b[rng.randrange(len(b))] = rng.randrange(256)
        call(C.read_snapshot_pickle, bytes(b), compact=rng.random() < 0.5)
    trace = C.read_snapshot_pickle(data)["device_traces"][0]
    assert type(trace).__name__ == "TraceColumns" and len(trace) == 6, trace
    for v in BAD:
        call(trace.__getitem__, v)
    call(list, trace)


def fuzz_trace_model(rng):
    """trace_model on wrong types and hostile end blocks; the column passes
    (model_*) on wrong types, wrong lengths and ids and indexes out of range."""
    import pickle
    entries = [{"action": a, "addr": 4096 * (t % 3), "size": 512 + t, "stream": 0,
                "time_us": t, "frames": [{"filename": "f.py", "line": t, "name": "g"}],
                "device_free": 2}
               for t, a in enumerate(["alloc", "free_completed", "oom", "segment_alloc"] * 3)]
    entries[2] = {"action": "oom", "size": 1, "device_free": 2}
    trace = C.read_snapshot_pickle(pickle.dumps({"segments": [], "device_traces": [entries]}))
    trace = trace["device_traces"][0]
    for args in arg_lists(3, rng, 100):
        call(C.trace_model, *args)
    ends = [[], [(0, 1)], [(2**64 - 1, 1)], [(2**64, 1)], [(-1, 5)], [(1, 2**64)], [(1,)],
            [None], [(4096, 1), (8192, 2**63)], [("x", 1)]]
    for e in ends:
        for reserved in (0, -1, 2**63 - 1, 2**63, 2**100, -2**100, True):
            call(C.trace_model, trace, e, reserved)
    m = C.trace_model(trace, [(12288, 7)], 1 << 20)
    cols = {k: array.array("q", m[k]) for k in ("a_start", "a_end", "a_size", "a_stack",
                                                 "allocated")}
    n = len(cols["a_start"])
    weird = [array.array("q", [-1, 2**63 - 1, -2**63, 0]), array.array("q"),
             array.array("d", [1.0] * n), array.array("i", [0] * n), b"\x00" * 8 * n,
             bytearray(8 * n + 3), memoryview(array.array("q", [5] * n)), [0] * n]
    fns = [(C.model_live, 3), (C.model_group, 5), (C.model_samples, 3), (C.model_bands, 6),
           (C.model_ranges, 4), (C.model_remap, 2)]
    for fn, arity in fns:
        for args in arg_lists(arity, rng, 100):
            call(fn, *args)
        for _ in range(200):
            args = [rng.choice(list(cols.values()) + weird + BAD) for _ in range(arity)]
            call(fn, *args)
    s, e, sz, st, al = (cols[k] for k in ("a_start", "a_end", "a_size", "a_stack", "allocated"))
    for index in (-2**63, -1, 0, 3, 2**63 - 1, None):
        call(C.model_live, s, e, index)
        call(C.model_group, sz, st, s, e, index)
        call(C.model_group, sz, array.array("q", [2**62] * n), s, e, index)
        call(C.model_group, sz, array.array("q", [-5] * n), s, e, index)
    for samples in ([], [0], [5, 1, 3], list(range(20)), [2**62], [-3, 2**40], ["x"]):
        for max_bands, budget in ((0, 0), (-1, 5), (3, 2**62), (2**62, -1)):
            call(C.model_bands, s, e, sz, samples, max_bands, budget)
    for mx in (-5, 0, 1, 2, 3, 2**62):
        for peak in (-1, 0, len(al), 2**62):
            call(C.model_samples, al, mx, peak)
    for ranges in ([], [(0, 1)], [(0, len(al))], [(3, 2)], [(-1, 2)], [(0, 2**40)], [(0,)],
                   [None]):
        call(C.model_ranges, s, sz, al, ranges)
        call(C.model_ranges, array.array("q", [2**40] * n), sz, al, ranges)
    for ids in ([], [0], list(range(50)), ["x"] * 50, [2**63] * 50):
        call(C.model_remap, array.array("q", st), ids)
        call(C.model_remap, array.array("q", [-1, 2**63 - 1]), ids)


def main(argv):
    rng = random.Random(16)
    print(f"gpumem._C from {os.path.realpath(C.__file__)}", flush=True)
    testext = None
    if "--testext" in argv:
        import importlib.machinery
        import importlib.util
        so = argv[argv.index("--testext") + 1]
        loader = importlib.machinery.ExtensionFileLoader("_testext", so)
        spec = importlib.util.spec_from_file_location("_testext", so, loader=loader)
        testext = importlib.util.module_from_spec(spec)
        loader.exec_module(testext)
    known = {"Allocator", "replay", "round_size", "is_small", "segment_size", "format_size",
             "default_settings", "cuda_last_result", "cuda_open", "_hist_configure",
             "_hist_config", "_hist_snapshot", "_hist_traceback", "_hist_set_metadata",
             "_hist_get_metadata", "_hist_overhead_bytes", "_hist_counts",
             "_hist_backward_enter", "_hist_backward_exit", "_hist_capture", "_hist_seq",
             "read_snapshot_pickle", "TraceColumns", "trace_model", "model_live",
             "model_group", "model_samples", "model_bands", "model_ranges", "model_remap"}
    entry_points = {n for n in dir(C) if callable(getattr(C, n)) and not n.startswith("__")}
    unknown = entry_points - known - NOT_CALLED
    assert not unknown, f"gpumem._C entry points the fuzzer does not call: {sorted(unknown)}"
    fuzz_size_policy(rng)
    fuzz_replay(rng)
    fuzz_snapshot_reader(rng)
    fuzz_trace_model(rng)
    fuzz_constructor(rng)
    a = C.Allocator(capacity=1 << 30)
    fuzz_history(rng, a)
    fuzz_methods(rng, a)
    a2 = C.Allocator(capacity=1 << 30, settings={"expandable_segments": True})
    fuzz_methods(rng, a2)
    if testext is not None:
        fuzz_device_backend(rng, testext)
    for args in arg_lists(1, rng, 20):  # last: the driver handle is opened once per process
        call(C.cuda_open, *args)
    call(C.cuda_open, path="/nonexistent/libcuda.so.1")
    del a, a2
    gc.collect()
    print(f"FUZZ OK {calls}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
