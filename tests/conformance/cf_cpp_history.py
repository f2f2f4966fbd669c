"""torch's C++ memory-history entry points, torch::cuda::_record_memory_history
and torch::cuda::_memory_snapshot_pickled, called from a C++ extension built
with torch.utils.cpp_extension.load_inline (as torch's own
test_cpp_memory_snapshot_pickle does): the bytes are a pickle, and with
context on each block carries C++, TorchScript and Python frames.

The extension is compiled once into build/conformance-cpp-ext/ (tens of
seconds); the group is in the slow tier.
"""

import os
import pickle

from harness import settle, torch_mod

FAST = ()

_SOURCE = r"""
#include <torch/csrc/cuda/memory_snapshot.h>
py::object do_snapshot() {
    std::string data = torch::cuda::_memory_snapshot_pickled();
    return py::bytes(data);
}
void record(bool e, bool ctx) {
    torch::cuda::_record_memory_history(e, ctx, 10, ctx, ctx);
}
"""

_ext = None


def _extension():
    global _ext
    if _ext is None:
        from torch.utils.cpp_extension import load_inline
        here = os.path.dirname(os.path.abspath(__file__))
        # one build per torch: an extension built against another release
        # does not load (undefined symbols)
        build = os.path.join(here, "..", "..", "build",
                             f"conformance-cpp-ext-{torch_mod().__version__}")
        os.makedirs(build, exist_ok=True)
        # the history entry points live in libtorch_cuda: linked by name,
        # since with_cuda would also ask for the CUDA toolkit's libcudart
        _ext = load_inline("gm_conformance_cpp_history", cpp_sources=[_SOURCE],
                           functions=["do_snapshot", "record"], build_directory=build,
                           extra_ldflags=["-ltorch_cuda", "-lc10_cuda"])
    return _ext


def _snapshot_after_a_script_alloc(ctx: bool):
    torch = torch_mod()
    m = _extension()
    settle()
    m.record(True, ctx)
    try:
        @torch.jit.script
        def the_script_fn():
            return torch.rand(311, 411, device="cuda")

        t = the_script_fn()
        raw = m.do_snapshot()
    finally:
        m.record(False, False)
    del t
    return pickle.loads(raw)                   # bytes that pickle reads


def _the_block(mem):
    found = [b for s in mem["segments"] for b in s["blocks"]
             if b["state"] == "active_allocated" and b["requested_size"] == 311 * 411 * 4]
    assert len(found) == 1, [(b["state"], b["requested_size"])
                             for s in mem["segments"] for b in s["blocks"]]
    return found[0]


def _last_alloc_is_the_tensor(mem):
    last = mem["device_traces"][0][-1]
    assert last["action"] == "alloc", last
    assert last["size"] == 311 * 411 * 4, last


def check_cpp_snapshot_without_context():
    mem = _snapshot_after_a_script_alloc(ctx=False)
    assert _the_block(mem)["frames"] == []
    _last_alloc_is_the_tensor(mem)
    assert mem["device_traces"][0][-1].get("frames", []) == []
    settings = mem["allocator_settings"]
    assert settings["pinned_num_register_threads"] >= 1, settings
    assert settings["release_lock_on_cudamalloc"] is False, settings


def check_cpp_snapshot_frames_with_context():
    mem = _snapshot_after_a_script_alloc(ctx=True)
    text = str(_the_block(mem)["frames"])
    assert "::rand" in text                    # a C++ frame
    assert "the_script_fn" in text             # a TorchScript frame
    assert "cf_cpp_history.py" in text         # a Python frame
    _last_alloc_is_the_tensor(mem)
    assert "::rand" in str(mem["device_traces"][0][-1]["frames"])
