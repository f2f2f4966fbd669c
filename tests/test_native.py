"""Compile and run the C tests of the allocator core (tests/c).

Four builds, each into tests/c/build/<build>/ (git-ignored):
  normal    -O2 -DGM_DEBUG=1
  sanitize  ASan + UBSan (-O1 -g), leak detection on, UBSan fatal
  debug3    -O2 -DGM_DEBUG=3 (the core checks itself after every operation)
  tsan      ThreadSanitizer (-O1 -g; it cannot be combined with ASan): only
            the threaded unit tests (TSAN_TESTS), on both backends
The first three run the unit tests and the stress test in several modes, on two
backends (tests/c/testdev.h):
  virtual  the virtual device (csrc/device/vdev*.c)
  cuda  the CUDA driver backend (csrc/device/cuda_backend.c, cuda_vmm.c) over
        the fake libcuda.so.1 of simgpu/driver, built per build into
        tests/c/build/fakecuda-<build>/ (with the same sanitizer flags for
        the sanitize build) and passed as GPUMEM_LIBCUDA
and the unit tests once with expandable segments off and once on
(--expandable: every test that does not pin a mode follows it). A run
fails when the binary exits non-zero, when its closing "N passed, M failed"
line is missing or reports failures, when a sanitizer reports anything, or
when the tests it skipped are not exactly the expected ones (SKIPS).
The C binaries link csrc/core and csrc/device directly (not the Python
module).

The last test builds the extension with GM_SANITIZE=1 and imports it under
LD_PRELOAD=libasan in a subprocess, together with the test-only extension
(tests/ext) built with the same sanitizers, which drives it through
device_backend= and the core API capsule.

Only a missing C compiler skips these tests.
"""

import concurrent.futures
import glob
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time

import pytest

import sanitized_ext
from csrc_layers import layers
from sanitized_ext import SANITIZER_MARKERS, find_cc

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CSRC = os.path.join(ROOT, "csrc")
TESTS_C = os.path.join(ROOT, "tests", "c")
BUILD_ROOT = os.path.join(TESTS_C, "build")

COMMON_FLAGS = [
    "-std=c11",
    "-D_GNU_SOURCE",
    "-Wall",
    "-Wextra",
    "-Wno-unused-parameter",
    "-I" + CSRC,
    "-I" + TESTS_C,
]
SANITIZE = [
    "-fsanitize=address,undefined",
    "-fno-sanitize-recover=undefined",
    "-fno-omit-frame-pointer",
]
TSAN = ["-fsanitize=thread", "-fno-omit-frame-pointer"]
BUILDS = {
    "normal": {"cflags": ["-O2", "-DGM_DEBUG=1"], "ldflags": []},
    "sanitize": {"cflags": SANITIZE + ["-O1", "-g", "-DGM_DEBUG=1"], "ldflags": SANITIZE},
    "debug3": {"cflags": ["-O2", "-DGM_DEBUG=3"], "ldflags": []},
    "tsan": {"cflags": TSAN + ["-O1", "-g", "-DGM_DEBUG=1"], "ldflags": TSAN},
}
#: The builds that run the whole unit and stress matrix.
MATRIX_BUILDS = ("normal", "sanitize", "debug3")
#: The unit tests with threads, which the tsan build runs (a name substring).
TSAN_TESTS = "threads"
TSAN_ENV = {"TSAN_OPTIONS": "halt_on_error=1:second_deadlock_stack=1"}
SAN_ENV = {
    "ASAN_OPTIONS": "detect_leaks=1:abort_on_error=0",
    "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1",
}
CLOSING_LINE = re.compile(r"^(\d+) passed, (\d+) failed$", re.M)
RUN_TIMEOUT = 900
BACKENDS = ("virtual", "cuda")
MODES = {"plain": [], "expandable": ["--expandable"]}

# Unit tests that cannot apply to a (backend, mode), with the reason the
# binary prints. Anything else skipped, or one of these not skipped, fails.
SKIPS = {
    ("cuda", "expandable"): {
        # fail_above refuses one device allocation above a size; the CUDA
        # backend maps expandable segments one granule (one cuMemCreate) at a
        # time, so no driver call is ever that large.
        "failure_injection_at_run_time",
    },
}
SKIP_LINE = re.compile(r"^skip (\w+): ", re.M)
HEADER_LINE = re.compile(r"^# backend=(\w+) expandable=(\d)$", re.M)
TOTAL_LINE = re.compile(r"^# (\d+) tests in ", re.M)

# (test id, arguments, minimum number of passed steps)
STRESS_RUNS = {
    "normal": [
        ("segments", [], 1_000_000),
        ("expandable", ["--expandable"], 1_000_000),
        ("host", ["--host", "--ops", "300000"], 300_000),
        ("host-expandable", ["--host", "--expandable", "--ops", "300000"], 300_000),
        ("seed-2", ["--seed", "2"], 1_000_000),
        ("seed-2-expandable", ["--seed", "2", "--expandable"], 1_000_000),
        ("check-every-step", ["--check-every", "1", "--ops", "200000", "--seed", "7"], 200_000),
        ("check-every-step-expandable",
         ["--check-every", "1", "--ops", "200000", "--seed", "7", "--expandable"], 200_000),
        ("max-split-gc", ["--max-split", "48", "--gc", "0.7", "--seed", "3"], 1_000_000),
        ("max-split-gc-expandable",
         ["--max-split", "48", "--gc", "0.7", "--seed", "3", "--expandable"], 1_000_000),
        ("pools", ["--pools", "--ops", "500000"], 500_000),
        ("pools-expandable", ["--pools", "--expandable", "--ops", "500000", "--seed", "2"], 500_000),
        ("pools-max-split-gc",
         ["--pools", "--max-split", "48", "--gc", "0.7", "--seed", "3", "--ops", "300000"],
         300_000),
    ],
    "sanitize": [
        ("pools", ["--pools", "--ops", "200000"], 200_000),
        ("segments", [], 1_000_000),
        ("expandable", ["--expandable"], 1_000_000),
        ("host", ["--host", "--ops", "200000"], 200_000),
        ("host-expandable", ["--host", "--expandable", "--ops", "200000"], 200_000),
        ("max-split-gc", ["--max-split", "48", "--gc", "0.7", "--seed", "3", "--ops", "300000"],
         300_000),
    ],
    "debug3": [
        ("segments", ["--ops", "100000", "--seed", "11"], 100_000),
        ("expandable", ["--ops", "100000", "--seed", "11", "--expandable"], 100_000),
        ("pools", ["--pools", "--ops", "50000", "--seed", "5"], 50_000),
    ],
}
# The same on the CUDA backend over the fake driver. Its memory is real host
# memory, so --host (pattern checks) applies as it does on the simulator.
STRESS_RUNS_CUDA = {
    "normal": [
        ("segments", [], 1_000_000),
        ("expandable", ["--expandable"], 1_000_000),
        ("host", ["--host", "--ops", "300000"], 300_000),
        ("host-expandable", ["--host", "--expandable", "--ops", "300000"], 300_000),
        ("check-every-step-expandable",
         ["--check-every", "1", "--ops", "100000", "--seed", "7", "--expandable"], 100_000),
        ("max-split-gc", ["--max-split", "48", "--gc", "0.7", "--seed", "3", "--ops", "300000"],
         300_000),
        ("max-split-gc-expandable",
         ["--max-split", "48", "--gc", "0.7", "--seed", "3", "--expandable", "--ops", "300000"],
         300_000),
        ("pools-host-expandable",
         ["--pools", "--host", "--expandable", "--ops", "200000", "--seed", "4"], 200_000),
    ],
    "sanitize": [
        ("segments", ["--ops", "200000"], 200_000),
        ("expandable", ["--expandable", "--ops", "200000"], 200_000),
        ("host-expandable", ["--host", "--expandable", "--ops", "100000", "--seed", "5"],
         100_000),
    ],
    "debug3": [
        ("segments", ["--ops", "100000", "--seed", "11"], 100_000),
        ("expandable", ["--ops", "100000", "--seed", "11", "--expandable"], 100_000),
    ],
}
# The thread test takes tens of seconds when the core checks itself after
# every operation; the other two builds run it.
UNIT_ARGS = {"normal": [], "sanitize": [], "debug3": ["--skip=threads"]}

_fcb_spec = importlib.util.spec_from_file_location(
    "gpumem_tests_fakecuda_build", os.path.join(ROOT, "tests", "sim", "fakecuda", "build.py"))
fakecuda_build = importlib.util.module_from_spec(_fcb_spec)
_fcb_spec.loader.exec_module(fakecuda_build)


CC = find_cc()
needs_cc = pytest.mark.skipif(CC is None, reason="no C compiler found (set CC or install cc)")


def _sources():
    native = layers.sources("base", "device", "core")
    common = [os.path.join(TESTS_C, "gmtest.c"), os.path.join(TESTS_C, "testdev.c")]
    unit = (
        [os.path.join(TESTS_C, "helpers.c"), os.path.join(TESTS_C, "unit_main.c")]
        + sorted(glob.glob(os.path.join(TESTS_C, "test_*.c")))
    )
    stress = [os.path.join(TESTS_C, "stress.c")]
    return native + common, unit, stress


def _obj_name(src):
    rel = os.path.splitext(os.path.relpath(src, ROOT))[0]
    return rel.replace(os.sep, "__") + ".o"


def _run_cc(args):
    p = subprocess.run(CC + args, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if p.returncode != 0:
        raise RuntimeError("compiler failed:\n%s\n%s%s" % (" ".join(CC + args), p.stdout, p.stderr))
    return p.stdout + p.stderr


_built = {}


def build(name):
    """Compile the C tests for one build; returns {'unit': path, 'stress': path}."""
    if name in _built:
        return _built[name]
    cfg = BUILDS[name]
    out = os.path.join(BUILD_ROOT, name)
    objdir = os.path.join(out, "obj")
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(objdir)
    shared, unit, stress = _sources()
    assert any("core" in s for s in shared), "no csrc/core/*.c sources found"
    jobs = {}
    warnings = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        for src in shared + unit + stress:
            obj = os.path.join(objdir, _obj_name(src))
            args = COMMON_FLAGS + cfg["cflags"] + ["-c", src, "-o", obj]
            jobs[src] = (obj, pool.submit(_run_cc, args))
        for src, (obj, fut) in jobs.items():
            text = fut.result()
            if text.strip():
                warnings.append(text)
    objs = {src: obj for src, (obj, _) in jobs.items()}
    bins = {}
    for binname, srcs in (("unit", shared + unit), ("stress", shared + stress)):
        path = os.path.join(out, binname)
        _run_cc(cfg["ldflags"] + [objs[s] for s in srcs] + ["-o", path, "-lpthread", "-ldl"])
        bins[binname] = path
    if warnings:
        with open(os.path.join(out, "warnings.txt"), "w") as f:
            f.write("\n".join(warnings))
    _built[name] = bins
    return bins


_fakes = {}


def build_fake(name):
    """The fake libcuda.so.1 for one build (the sanitize build's with the same
    sanitizer flags, so ASan sees the driver's memory too)."""
    if name not in _fakes:
        flags = {"sanitize": SANITIZE, "tsan": TSAN}.get(name, [])
        _fakes[name] = str(fakecuda_build.build_fakecuda(
            os.path.join(BUILD_ROOT, "fakecuda-" + name), flags))
    return _fakes[name]


def backend_env(build_name, backend):
    """The environment of a run: the backend, and for cuda the fake driver
    with none of the caller's GPUMEM_FAKECUDA_* settings."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("GPUMEM_FAKECUDA_", "GPUMEM_SIM_", "GPUMEM_LIBCUDA"))}
    env["GM_TEST_BACKEND"] = backend
    if backend == "cuda":
        env["GPUMEM_LIBCUDA"] = build_fake(build_name)
    return env


def run_checked(build_name, argv, min_passed=1, env=None):
    env = dict(os.environ if env is None else env)
    if build_name == "sanitize":
        env.update(SAN_ENV)
    elif build_name == "tsan":
        env.update(TSAN_ENV)
    start = time.monotonic()
    p = subprocess.run(argv, capture_output=True, text=True, timeout=RUN_TIMEOUT, env=env,
                       stdin=subprocess.DEVNULL)
    elapsed = time.monotonic() - start
    out = p.stdout + p.stderr
    lines = out.splitlines()
    # The failures themselves (they may be far from the end), then the tail.
    failures = [l for l in lines[:-60] if l.startswith("FAIL ") or "] failed: " in l][:40]
    tail = "\n".join((failures + ["..."] if failures else []) + lines[-60:])
    where = "%s (%s build, %.1f s)" % (" ".join(os.path.relpath(a, ROOT) if a.startswith(ROOT)
                                                 else a for a in argv), build_name, elapsed)
    for marker in SANITIZER_MARKERS:
        assert marker not in out, "%s: sanitizer report (%r):\n%s" % (where, marker, tail)
    assert p.returncode == 0, "%s exited with %d:\n%s" % (where, p.returncode, tail)
    found = CLOSING_LINE.findall(p.stdout)
    assert found, "%s printed no 'N passed, M failed' line:\n%s" % (where, tail)
    passed, failed = (int(x) for x in found[-1])
    assert failed == 0, "%s: %d failed:\n%s" % (where, failed, tail)
    assert passed >= min_passed, "%s: only %d passed, expected >= %d:\n%s" % (
        where, passed, min_passed, tail)
    print("%s: %d passed" % (where, passed))
    return out


# The fast tier runs the unit tests once on each backend and one stress run;
# the sanitizer and GM_DEBUG=3 builds and the other modes are marked slow.
FAST_UNIT = {("normal", "virtual", "plain"), ("normal", "cuda", "expandable")}
FAST_STRESS = {"normal-segments"}


def _speed(fast):
    return () if fast else pytest.mark.slow


@needs_cc
@pytest.mark.parametrize(
    "build_name,backend,mode",
    [pytest.param(b, be, m, id="%s-%s-%s" % (b, be, m), marks=_speed((b, be, m) in FAST_UNIT))
     for b in MATRIX_BUILDS for be in BACKENDS for m in MODES],
)
def test_c_unit(build_name, backend, mode):
    bins = build(build_name)
    argv = [bins["unit"], "--backend=" + backend] + MODES[mode] + UNIT_ARGS[build_name]
    out = run_checked(build_name, argv, min_passed=30, env=backend_env(build_name, backend))
    header = HEADER_LINE.findall(out)
    assert header == [(backend, "1" if mode == "expandable" else "0")], header
    skipped = set(SKIP_LINE.findall(out))
    expected = SKIPS.get((backend, mode), set())
    assert skipped == expected, "skipped %s, expected exactly %s" % (sorted(skipped),
                                                                      sorted(expected))
    total = int(TOTAL_LINE.findall(out)[-1])
    passed = int(CLOSING_LINE.findall(out)[-1][0])
    assert passed == total - len(expected), (passed, total)


@needs_cc
@pytest.mark.parametrize(
    "build_name,backend,args,min_passed",
    [pytest.param(b, "virtual", args, n, id="%s-%s" % (b, rid),
                  marks=_speed("%s-%s" % (b, rid) in FAST_STRESS))
     for b in MATRIX_BUILDS for rid, args, n in STRESS_RUNS[b]]
    + [pytest.param(b, "cuda", args, n, id="%s-cuda-%s" % (b, rid), marks=pytest.mark.slow)
       for b in MATRIX_BUILDS for rid, args, n in STRESS_RUNS_CUDA[b]],
)
def test_c_stress(build_name, backend, args, min_passed):
    bins = build(build_name)
    out = run_checked(build_name, [bins["stress"], "--backend=" + backend] + args,
                      min_passed=min_passed, env=backend_env(build_name, backend))
    assert "stress: backend=%s " % backend in out


@needs_cc
@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_c_threads_under_tsan(backend):
    """The core's threaded unit tests (workers on their own streams, a
    checker walking the invariants meanwhile, empty_cache from one of them)
    under ThreadSanitizer: any data race or lock-order inversion it reports
    fails the run (halt_on_error)."""
    bins = build("tsan")
    argv = [bins["unit"], "--backend=" + backend, TSAN_TESTS]
    out = run_checked("tsan", argv, min_passed=2, env=backend_env("tsan", backend))
    assert "ok   threads_random_malloc_free_expandable" in out, out[-2000:]


# ---- the extension under AddressSanitizer ----

SMOKE = textwrap.dedent(
    r"""
    import os, sys
    import gpumem._C as C
    here = os.path.realpath(os.getcwd())
    assert os.path.realpath(C.__file__).startswith(here), C.__file__
    print("imported", C.__file__)
    if hasattr(C, "format_size"):
        print(C.format_size(20 << 20))
    if hasattr(C, "Allocator"):
        a = C.Allocator()
        ptrs = [a.malloc(n) for n in (1, 1000, 1 << 20, 5 << 20, 30 << 20)]
        for p in ptrs[::2]:
            a.free(p)
        for name in ("stats", "segments", "check"):
            if hasattr(a, name):
                getattr(a, name)()
        for p in ptrs[1::2]:
            a.free(p)
        if hasattr(a, "empty_cache"):
            a.empty_cache()
        if hasattr(a, "check"):
            print("check:", a.check())
        del a
    if os.environ.get("GM_TESTEXT_SO"):
        # The test-only extension (sanitized too) on the sanitized module.
        import importlib.machinery, importlib.util
        so = os.environ["GM_TESTEXT_SO"]
        loader = importlib.machinery.ExtensionFileLoader("_testext", so)
        t = importlib.util.module_from_spec(
            importlib.util.spec_from_file_location("_testext", so, loader=loader))
        dev = t.VirtualDevice(capacity=1 << 30, event_mode="never")
        a = C.Allocator(device_backend=dev)
        rec = t.TraceRecorder(a)
        p = a.malloc(5000)
        a.record_stream(p, 3)
        a.free(p)
        dev.complete_events()
        a.process_events()
        dev.set_failure(fail_above=4 << 20)
        try:
            a.malloc(8 << 20)
        except MemoryError:
            pass
        dev.set_failure()
        print("counters:", dev.counters()["calls"])
        print("bench_pairs:", t.bench_pairs(a, 4096, 1000))
        kept, blocked = t.hist_c_thread_alloc(a, 4096, 10, keep=2)
        for q in kept:
            a.free(q)
        t.hist_capture_in_c_thread(1)
        t.hist_capture_without_gil(1)
        t.hist_walk_only(3)
        # the cached C unwinder, sanitized (ASan's backtrace() interceptor
        # adds its own frame at the top of backtrace()'s list)
        cached, bt = t.cunwind_walks()
        assert cached is None or cached[1:] == bt[len(bt) - len(cached) + 1:], (cached, bt)
        C._hist_configure(2, 3, True, 1000, True, 0)  # context 'all', stacks 'all'
        assert C._hist_capture(1) and C._hist_capture(1)
        # a thread with a thread state and no frames (autograd's), the GIL held here
        tb, blocked = t.hist_capture_in_c_thread(1, 5.0, True)
        assert tb and not blocked, (tb, blocked)
        # a repeated stack without the GIL (Note [Predicted chain]) and the check itself
        assert all(t.hist_capture_without_gil(1) for _ in range(4))
        if t.hist_chain(0, True):
            assert [t.hist_chain(0, r) for r in (True, False)] == [True, True]
        C._hist_configure(0, 0, False, 1000, True, 0)
        rec.take()
        print("check:", a.check())
        del dev  # the Allocator keeps it alive
        a.free(a.malloc(3 << 20))
        a.empty_cache()
        del rec, a
        print("TESTEXT OK")
    print("SMOKE OK")
    """
)


def _have_python_sources():
    return bool(glob.glob(os.path.join(CSRC, "python", "*.c")))


@needs_cc
@pytest.mark.slow
@pytest.mark.skipif(not _have_python_sources(), reason="csrc/python has no sources yet")
def test_extension_under_asan(tmp_path_factory):
    try:
        import setuptools  # noqa: F401
    except ImportError:
        pytest.skip("setuptools is not installed in this interpreter")
    lib, run_env = sanitized_ext.built(tmp_path_factory)
    p = subprocess.run([sys.executable, "-c", SMOKE], cwd=str(lib), capture_output=True,
                       text=True, env=run_env, timeout=RUN_TIMEOUT, stdin=subprocess.DEVNULL)
    out = p.stdout + p.stderr
    sanitized_ext.assert_clean(out, "the extension smoke run")
    assert p.returncode == 0 and "TESTEXT OK" in p.stdout and "SMOKE OK" in p.stdout, (
        "extension smoke run failed (%d):\n%s" % (p.returncode, out[-8000:]))
