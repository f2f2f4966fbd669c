"""_testext, gpumem's test-only extension (C sources in tests/ext), built on
first import by tests/ext/build.py and cached there (tests/ext/build/).

    import testext
    dev = testext.VirtualDevice(capacity=64 << 20, event_mode="never")
    a = gpumem._C.Allocator(device_backend=dev)
    dev.set_failure("seg_alloc", nth=1); dev.counters(); dev.complete_events()
    testext.bench_pairs(a, 4096, 10000)
    testext.hist_c_thread_alloc(a, 4096, 50, keep=5)

Everything here exists only for tests and benchmarks, so none of it is in
the shipped gpumem._C (tests/test_testext.py checks both). No tests here.
"""

import importlib.util
import os

TESTS = os.path.dirname(os.path.abspath(__file__))

_spec = importlib.util.spec_from_file_location(
    "gpumem_tests_ext_build", os.path.join(TESTS, "ext", "build.py"))
build = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(build)

module = build.load()
VirtualDevice = module.VirtualDevice
TraceRecorder = module.TraceRecorder
bench_pairs = module.bench_pairs
hist_c_thread_alloc = module.hist_c_thread_alloc
hist_capture_in_c_thread = module.hist_capture_in_c_thread
hist_capture_without_gil = module.hist_capture_without_gil
hist_walk_only = module.hist_walk_only
hist_walks = module.hist_walks
hist_capture_time = module.hist_capture_time
hist_chain = module.hist_chain
cunwind_walks = module.cunwind_walks
cunwind_time = module.cunwind_time
