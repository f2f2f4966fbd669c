"""The test-only extension (tests/ext, imported as testext) and the line it
draws: test controls and timing loops live there and nowhere in the shipped
gpumem._C.

Covered here: the names that must not come back into gpumem._C; the build
(no warnings, cached on its digest, rebuilt when a source or a flag
changes, safe when two processes build at once); VirtualDevice driving
gpumem._C.Allocator through device_backend= (failure injection, counters,
event modes, lifetime); bench_pairs. The hist_* helpers are exercised by
tests/test_history*.py.
"""

from __future__ import annotations

import gc
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

import gpumem
from gpumem import _C

import testext

MiB = 1 << 20
TESTS = os.path.dirname(os.path.abspath(__file__))
build = testext.build

# Entry points that exist only for tests and benchmarks.
MODULE_TEST_ONLY = ("_hist_c_thread_alloc", "_hist_capture_in_c_thread",
                    "_hist_capture_without_gil", "_hist_walk_only", "_hist_capture_time",
                    "_hist_chain")
ALLOCATOR_TEST_ONLY = ("bench_pairs", "set_failure", "sim_counters", "complete_events",
                       "set_event_mode")


# ------------------------------------------------ what gpumem._C must not have

def test_shipped_module_has_no_test_only_entry_points():
    assert not [n for n in MODULE_TEST_ONLY if hasattr(_C, n)]
    assert not [n for n in ALLOCATOR_TEST_ONLY if hasattr(_C.Allocator, n)]
    for kw in ({"event_mode": "never"}, {"event_after_n": 2}):
        with pytest.raises(TypeError):
            _C.Allocator(**kw)


def test_the_build_never_compiles_tests_ext():
    from csrc_layers import layers
    srcs = layers.sources(*layers.EXTENSION_LAYERS)
    assert srcs and not [s for s in srcs if os.path.commonpath([s, TESTS]) == TESTS]


def test_testext_has_the_entry_points():
    for name in ("VirtualDevice", "bench_pairs", "hist_c_thread_alloc", "hist_capture_in_c_thread",
                 "hist_capture_without_gil", "hist_walk_only", "hist_capture_time",
                 "hist_chain"):
        assert callable(getattr(testext, name)), name
    for name in ("set_failure", "counters", "complete_events", "set_event_mode"):
        assert callable(getattr(testext.VirtualDevice, name)), name


# ------------------------------------------------------------------ the build

def test_build_has_no_warnings_and_is_cached():
    path = build.build()
    assert path == build.build()
    assert str(path) == testext.module.__file__
    assert path.with_name(path.name + ".log").read_text() == ""
    mtime = path.stat().st_mtime_ns
    assert build.build() == path and path.stat().st_mtime_ns == mtime  # not compiled again


@pytest.mark.slow
def test_build_follows_sources_and_flags(tmp_path):
    src = tmp_path / "src"
    shutil.copytree(build.HERE, src, ignore=shutil.ignore_patterns("build", "__pycache__"))
    out = tmp_path / "out"
    first = build.build(out, ext_dir=src)
    assert build.build(out, ext_dir=src) == first
    with open(src / "bench.c", "a") as f:
        f.write("/* changed */\n")
    second = build.build(out, ext_dir=src)
    assert second != first and second.is_file()
    third = build.build(out, ["-O1"], ext_dir=src)
    assert third not in (first, second) and third.is_file()
    assert build.build(out, ["-O1"], ext_dir=src) == third
    with pytest.raises(build.BuildError, match="building _testext failed"):
        (src / "broken.c").write_text("this is not C\n")
        build.build(out, ext_dir=src)


@pytest.mark.slow  # fast tier: one test of this kind is enough (README, Test)
def test_two_processes_building_at_once(tmp_path):
    out = tmp_path / "out"
    script = textwrap.dedent("""
        import importlib.util, sys
        spec = importlib.util.spec_from_file_location("b", sys.argv[1])
        b = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(b)
        mod = b.import_from(b.build(sys.argv[2]))
        dev = mod.VirtualDevice()
        print(mod.__file__)
    """)
    argv = [sys.executable, "-c", script, str(build.HERE / "build.py"), str(out)]
    procs = [subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    results = [p.communicate(timeout=300) + (p.returncode,) for p in procs]
    assert [r[2] for r in results] == [0, 0], [r[1][-2000:] for r in results]
    paths = {r[0].strip() for r in results}
    assert len(paths) == 1
    name = os.path.basename(paths.pop())
    # One library and its log; no temporary file left behind.
    assert sorted(os.listdir(out)) == [name, name + ".log"]


# ----------------------------------------------- VirtualDevice and device_backend

def test_allocator_on_a_virtual_device_counts_device_calls():
    dev = testext.VirtualDevice(capacity=64 * MiB)
    a = _C.Allocator(device_backend=dev)
    assert a.backend() == "virtual"
    p = a.malloc(1000)
    c = dev.counters()
    assert c["calls"]["seg_alloc"] == 1 and c["live_segments"] == 1
    assert c["bytes_allocated"] == 2 * MiB == a.stats()["reserved_bytes.all.current"]
    a.free(p)
    a.empty_cache()
    c = dev.counters()
    assert c["calls"]["seg_free"] == 1 and c["live_segments"] == 0 and c["peak_used"] == 2 * MiB
    assert a.check() == (0, "")


def test_failure_injection():
    dev = testext.VirtualDevice(capacity=1024 * MiB)
    a = _C.Allocator(device_backend=dev)
    dev.set_failure(fail_above=4 * MiB)
    a.free(a.malloc(1000))  # a 2 MiB segment
    with pytest.raises(gpumem.OutOfMemoryError):
        a.malloc(8 * MiB)  # a 20 MiB segment
    dev.set_failure()  # off
    a.free(a.malloc(8 * MiB))
    dev.set_failure("seg_alloc", nth=2, code=-7)  # GM_EDEVICE, on the second call from now
    a.free(a.malloc(30 * MiB))
    before = dev.counters()["calls"]["seg_alloc"]
    with pytest.raises(RuntimeError):
        a.malloc(50 * MiB)  # a device error is not retried
    assert dev.counters()["calls"]["seg_alloc"] == before + 1
    with pytest.raises(ValueError, match="unknown simulated function name"):
        dev.set_failure("cuMemAlloc")
    assert a.check() == (0, "")


def test_event_modes():
    dev = testext.VirtualDevice(event_mode="never")
    a = _C.Allocator(device_backend=dev)
    p = a.malloc(5000)
    a.record_stream(p, 3)
    a.free(p)
    assert a.stats()["active_bytes.all.current"] == 5120  # waits for its event
    a.process_events()
    assert a.stats()["active_bytes.all.current"] == 5120
    dev.complete_events()
    a.process_events()
    assert a.stats()["active_bytes.all.current"] == 0
    dev.set_event_mode("after_n", 2)
    q = a.malloc(5000)
    a.record_stream(q, 3)
    a.free(q)
    a.process_events()
    a.process_events()
    assert a.stats()["active_bytes.all.current"] == 5120
    a.process_events()
    assert a.stats()["active_bytes.all.current"] == 0
    with pytest.raises(ValueError, match="event_mode must be"):
        dev.set_event_mode("sometimes")


def test_allocator_keeps_its_device_alive():
    dev = testext.VirtualDevice(capacity=64 * MiB)
    before = sys.getrefcount(dev)
    a = _C.Allocator(device_backend=dev)
    assert sys.getrefcount(dev) == before + 1
    del a
    gc.collect()
    assert sys.getrefcount(dev) == before
    # The only reference to the device is the Allocator's.
    a = _C.Allocator(device_backend=testext.VirtualDevice(capacity=64 * MiB))
    gc.collect()
    for _ in range(3):
        a.free(a.malloc(3 * MiB))
        a.empty_cache()
    assert a.check() == (0, "")


def test_device_backend_is_checked():
    with pytest.raises(TypeError, match="gm_backend attribute"):
        _C.Allocator(device_backend=object())

    class WrongCapsule:
        gm_backend = _C._core_api

    with pytest.raises(TypeError, match="'gpumem.backend' capsule"):
        _C.Allocator(device_backend=WrongCapsule())
    dev = testext.VirtualDevice()
    for kw in ({"capacity": MiB}, {"backend": "cuda"}, {"num_devices": 2}):
        with pytest.raises(TypeError, match="does not apply with device_backend="):
            _C.Allocator(device_backend=dev, **kw)
    with pytest.raises(ValueError):
        _C.Allocator(device_backend=dev, device=-1)
    a = _C.Allocator(device_backend=dev, device=1, settings={"expandable_segments": True})
    assert a.expandable_active()


def test_allocator_backend_is_virtual_and_sim_still_works():
    """backend="virtual" names the Allocator's own device (an address space
    without memory); "sim", its name before the word came to mean the
    simulated GPU, is still accepted for existing code."""
    for kw in ({}, {"backend": "virtual"}, {"backend": "sim"}):
        a = _C.Allocator(capacity=64 * MiB, **kw)
        assert a.backend() == "virtual", kw
        a.free(a.malloc(1000))
        assert a.stats()["reserved_bytes.all.current"] == 2 * MiB, kw
    with pytest.raises(ValueError, match="backend must be 'virtual' or 'cuda'"):
        _C.Allocator(backend="simgpu")


def test_trace_recorder_is_in_the_test_extension_not_the_shipped_module():
    """record_trace/take_trace served only tests; the event buffer is now
    testext.TraceRecorder, chained behind memory history, and gpumem._C has
    neither name."""
    a = _C.Allocator(capacity=64 * MiB)
    for obj in (_C, a, _C.Allocator):
        assert not hasattr(obj, "take_trace") and not hasattr(obj, "record_trace"), obj
    with pytest.raises(TypeError, match="record_trace"):
        _C.Allocator(record_trace=True)
    rec = testext.TraceRecorder(a)
    p = a.malloc(1000)
    a.free(p)
    ev = rec.take()
    assert [e["action"] for e in ev] == ["segment_alloc", "alloc", "free_requested",
                                         "free_completed"], ev
    assert ev[1]["addr"] == p and ev[1]["size"] == 1000
    assert rec.take() == [] and not rec.overflow
    with pytest.raises(TypeError, match="gpumem._C.Allocator"):
        testext.TraceRecorder(object())


def test_virtual_device_configuration_is_checked():
    with pytest.raises(ValueError, match="bad virtual device configuration"):
        testext.VirtualDevice(granularity=3 * MiB)
    with pytest.raises(ValueError, match="mode must be"):
        testext.VirtualDevice(mode="disk")


# --------------------------------------------------------------- bench_pairs

def test_bench_pairs():
    a = _C.Allocator(capacity=1024 * MiB)
    ns = testext.bench_pairs(a, 4096, 1000)
    assert isinstance(ns, int) and ns > 0
    assert a.stats()["allocation.all.allocated"] == 1000
    assert a.stats()["allocated_bytes.all.current"] == 0
    with pytest.raises(ValueError, match="n and size must be positive"):
        testext.bench_pairs(a, 4096, 0)
    with pytest.raises(TypeError, match="expected a gpumem._C.Allocator"):
        testext.bench_pairs(object(), 4096, 10)
    with pytest.raises(gpumem.OutOfMemoryError):
        testext.bench_pairs(_C.Allocator(capacity=4 * MiB), 64 * MiB, 1)
