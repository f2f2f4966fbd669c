"""The simulator's NVML: the compute processes it lists (Note [Running
processes] in simgpu/nvml/nvml.c), with nvml.h's error codes and entry
layouts, and what torch's out-of-memory message makes of them under torch's
allocator and gpumem's (Note [Process lines from NVML] in
csrc/torch/gm_torch_nvml.cpp).

The ctypes snippets run under the simulator, so "libnvidia-ml.so.1" is the
preloaded fake, as for torch.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
import textwrap

import pytest

from sim_helpers import TORCH_REASON, needs_cc, run_sim

pytestmark = needs_cc

PRELUDE = r'''
import ctypes as C, os
cu = C.CDLL("libcuda.so.1")
nv = C.CDLL("libnvidia-ml.so.1")
cu.fakecuda_query.restype = C.c_longlong
class V1(C.Structure):
    _fields_ = [("pid", C.c_uint), ("used", C.c_ulonglong)]
class V2(C.Structure):
    _fields_ = [("pid", C.c_uint), ("used", C.c_ulonglong), ("gi", C.c_uint), ("ci", C.c_uint)]
def handle(i):
    h = C.c_void_p()
    assert nv.nvmlDeviceGetHandleByIndex_v2(i, C.byref(h)) == 0
    return h
def procs(fn, h, room, cls=V1, infos=True):
    buf = (cls * max(room, 1))()
    C.memset(buf, 0xAB, C.sizeof(buf))
    n = C.c_uint(room)
    r = fn(h, C.byref(n), buf if infos else None)
    return [r, n.value, [[e.pid, e.used] + ([e.gi, e.ci] if cls is V2 else []) for e in buf],
            bytes(buf)]
o = {}
'''


def test_processes_error_codes_sizes_and_layouts():
    out = run_sim(PRELUDE + textwrap.dedent(r'''
        get, get2, get3 = (nv.nvmlDeviceGetComputeRunningProcesses,
                           nv.nvmlDeviceGetComputeRunningProcesses_v2,
                           nv.nvmlDeviceGetComputeRunningProcesses_v3)
        n = C.c_uint(0)
        o["uninit"] = get(C.c_void_p(1), C.byref(n), None)
        nv.nvmlInit_v2()
        h0, h1 = handle(0), handle(1)
        o["idle"] = procs(get, h0, 0, infos=False)[:2]          # no context yet: none running
        ctx, p = C.c_void_p(), C.c_ulonglong()           # device 0: context + 3 MiB
        assert cu.cuDevicePrimaryCtxRetain(C.byref(ctx), 0) == 0 and cu.cuCtxSetCurrent(ctx) == 0
        assert cu.cuMemAlloc_v2(C.byref(p), C.c_size_t(3 << 20)) == 0
        free, total = C.c_size_t(), C.c_size_t()
        assert cu.cuMemGetInfo_v2(C.byref(free), C.byref(total)) == 0
        o["driver_used"] = [total.value - free.value, cu.fakecuda_query(b"bytes_used", 0)]
        o["count"] = procs(get, h0, 0, infos=False)[:2]         # *infoCount = 0 asks the count
        o["null_infos"] = procs(get, h0, 4, infos=False)[:2]
        o["bad_handle"] = get(C.c_void_p(12345), C.byref(n), None)
        o["null_count"] = get(h0, None, None)
        o["other_device"] = procs(get, h1, 4)[:2]
        v1 = procs(get, h0, 2)
        o["v1"] = v1[:3]
        o["v1_second_untouched"] = v1[3][16:] == b"\xab" * 16
        o["v2"] = procs(get2, h0, 1, V2)[:3]
        o["v3"] = procs(get3, h0, 1, V2)[:3]
        o["pid"] = os.getpid()
        os.environ["GPUMEM_SIM_NVML_PROCESSES"] = "unsupported"
        o["unsupported"] = procs(get, h0, 4)[:2]
        del os.environ["GPUMEM_SIM_NVML_PROCESSES"]
        nv.nvmlShutdown()
        o["after_shutdown"] = get(h0, C.byref(n), None)
        emit(o)
    '''), devices=2, memory="1GiB")
    used, pid = out["driver_used"][0], out["pid"]
    assert out["driver_used"] == [used, used] and used == (3 << 20) + (514 << 20)  # H100 context
    assert out["uninit"] == 1                   # NVML_ERROR_UNINITIALIZED
    assert out["idle"] == [0, 0]                # SUCCESS, nothing running
    assert out["count"] == [7, 1]               # INSUFFICIENT_SIZE, one needed
    assert out["null_infos"] == [2, 4]          # INVALID_ARGUMENT, count untouched
    assert out["bad_handle"] == 2 and out["null_count"] == 2
    assert out["other_device"] == [0, 0]        # no context on device 1
    assert out["v1"] == [0, 1, [[pid, used], [0xABABABAB, 0xABABABABABABABAB]]]
    assert out["v1_second_untouched"]           # 16-byte entries: nothing past the first
    assert out["v2"] == out["v3"] == [0, 1, [[pid, used, 0xFFFFFFFF, 0xFFFFFFFF]]]
    assert out["unsupported"] == [3, 4]         # NOT_SUPPORTED, as on Tegra/Jetson
    assert out["after_shutdown"] == 1


OOM = r'''
import json, sys, warnings, torch
warnings.simplefilter("always")
if sys.argv[1] == "gpumem":
    import gpumem
    gpumem.install()
keep = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    texts = []
    for _ in range(2):
        try:
            torch.empty(5 << 30, dtype=torch.uint8, device="cuda")
        except torch.OutOfMemoryError as e:
            texts.append(str(e))
# the text, without torch's "(Triggered internally at <file>:<line>.)"
print(json.dumps({"texts": texts, "warnings": [str(w.message).split(" (Triggered")[0]
                                               for w in seen if "nvml" in str(w.message)]}))
'''


def _oom(mode: str, *, nvml: str) -> dict:
    """Two out-of-memory errors under `mode`'s allocator with 1 GiB held,
    NVML as given: "listed", "unsupported" or "absent" (not preloaded)."""
    from gpumem import sim
    env = sim.sim_env(memory="4GiB", base=dict(os.environ))
    if nvml == "unsupported":
        env["GPUMEM_SIM_NVML_PROCESSES"] = "unsupported"
    if nvml == "absent":
        env["LD_PRELOAD"] = ":".join(p for p in env["LD_PRELOAD"].split(":")
                                     if "libnvidia-ml" not in p)
    proc = subprocess.run([sys.executable, "-c", OOM, mode],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.splitlines()[-1])


SENTENCE = "is free. Including non-PyTorch memory, this process has 1.50 GiB memory in use. Of the"


def _torch_release() -> tuple:
    try:
        return tuple(int(x) for x in importlib.metadata.version("torch").split(".")[:2])
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return (0, 0)


@pytest.mark.slow
@pytest.mark.skipif(TORCH_REASON is not None, reason=TORCH_REASON or "")
@pytest.mark.parametrize("nvml", ["listed", "unsupported", "absent"])
def test_oom_message_process_sentence_torch_and_gpumem(nvml):
    if nvml == "unsupported" and _torch_release() < (2, 14):
        pytest.skip("torch before 2.14 raises an INTERNAL ASSERT error when NVML's query fails")
    from torch_helpers import built_shim
    built_shim()
    got = {mode: _oom(mode, nvml=nvml) for mode in ("torch", "gpumem")}
    for mode, r in got.items():
        assert len(r["texts"]) == 2, (mode, r)
        for text in r["texts"]:
            # 1 GiB held and the H100 preset's 514 MiB context
            assert (SENTENCE in text) == (nvml == "listed"), (mode, text)
            assert ("this process" in text) == (nvml == "listed"), (mode, text)
    assert got["gpumem"]["texts"] == got["torch"]["texts"]
    # torch 2.14 warns once when the query fails, and so does gpumem there
    assert len(got["torch"]["warnings"]) == (nvml == "unsupported"), got["torch"]
    assert got["gpumem"]["warnings"] == got["torch"]["warnings"]
