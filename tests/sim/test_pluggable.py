"""gpumem's allocator inside PyTorch, on the simulated GPU, through
torch.cuda.memory.CUDAPluggableAllocator.

A minimal entry point (the full drop-in is another issue): the C file below
is compiled with gpumem's core (csrc/core) and CUDA driver backend
(csrc/device/cuda_backend.c, cuda_vmm.c) into one shared library whose
gm_test_alloc / gm_test_free serve PyTorch's allocations from a gm_alloc_t
per device. Under the simulator the backend talks to the fake libcuda.so.1
(GPUMEM_LIBCUDA), the same library the fake runtime uses, so the fake's
accounting shows who allocated: gpumem's cuMemAlloc/cuMemCreate, never
torch's cudaMalloc.
"""

from __future__ import annotations

import subprocess
import textwrap

import pytest

from csrc_layers import layers
from sim_helpers import CC, ROOT, needs_torch, run_sim

pytestmark = [needs_torch, pytest.mark.slow]  # slow: left out of the fast tier (see pyproject.toml)

PLUGGABLE_C = r'''
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/gm_alloc.h"
#include "device/cuda_backend.h"

#define MAXDEV 16
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static gm_cuda_t *cuda;
static gm_alloc_t *allocs[MAXDEV];
static char open_error[256];

/* The device's allocator, created on first use on gpumem's CUDA backend.
 * GM_TEST_EXPANDABLE=1 turns on expandable segments. */
static gm_alloc_t *get(int device)
{
    if (device < 0 || device >= MAXDEV)
        return NULL;
    pthread_mutex_lock(&mu);
    if (!cuda && gm_cuda_open(NULL, &cuda, open_error, sizeof open_error) != 0)
        cuda = NULL;
    if (cuda && !allocs[device]) {
        gm_settings_t s;
        gm_settings_default(&s);
        const char *e = getenv("GM_TEST_EXPANDABLE");
        s.expandable_segments = e && strcmp(e, "1") == 0;
        if (gm_alloc_create(gm_cuda_backend(cuda), device, &s, &allocs[device]) != 0)
            allocs[device] = NULL;
    }
    gm_alloc_t *a = allocs[device];
    pthread_mutex_unlock(&mu);
    return a;
}

void *gm_test_alloc(size_t size, int device, void *stream)
{
    gm_alloc_t *a = get(device);
    uintptr_t p = 0;
    if (!a || gm_alloc_malloc(a, size, (uintptr_t)stream, 0, &p, NULL) != 0)
        return NULL;
    return (void *)p;
}

void gm_test_free(void *ptr, size_t size, int device, void *stream)
{
    (void)size, (void)stream;
    gm_alloc_t *a = get(device);
    if (a)
        gm_alloc_free(a, (uintptr_t)ptr, 0);
}

/* 1 if ptr is the start of a live gpumem block. */
int gm_test_owns(void *ptr, int device)
{
    gm_alloc_t *a = get(device);
    size_t size, req;
    uintptr_t stream;
    return a && gm_alloc_block_size(a, (uintptr_t)ptr, &size, &req, &stream) == 0;
}

/* 0: allocated bytes, 1: reserved bytes, 2: device allocations made,
 * 3: expandable segments in use. */
long long gm_test_stat(int device, int which)
{
    gm_alloc_t *a = get(device);
    gm_stats_t st;
    if (!a)
        return -1;
    gm_alloc_get_stats(a, &st);
    switch (which) {
    case 0: return st.allocated_bytes[GM_STAT_ALL].current;
    case 1: return st.reserved_bytes[GM_STAT_ALL].current;
    case 2: return st.num_device_alloc;
    case 3: return gm_alloc_expandable_active(a);
    default: return -1;
    }
}

const char *gm_test_open_error(void) { return open_error; }
'''


@pytest.fixture(scope="module")
def pluggable_lib(tmp_path_factory):
    d = tmp_path_factory.mktemp("pluggable")
    src = d / "gm_pluggable.c"
    src.write_text(PLUGGABLE_C)
    lib = d / "libgm_pluggable.so"
    sources = layers.sources("base", "core") + [
        ROOT / "csrc" / "device" / name for name in ("cuda_backend.c", "cuda_call.c", "cuda_vmm.c")]
    cmd = CC + ["-shared", "-fPIC", "-std=gnu11", "-O1", "-g", "-D_GNU_SOURCE",
                "-I", str(ROOT / "csrc"), str(src), *map(str, sources), "-o", str(lib),
                "-lpthread", "-ldl"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return lib


@pytest.mark.parametrize("expandable", [False, True], ids=["segments", "expandable"])
def test_pluggable_allocator_serves_torch_from_gpumem(pluggable_lib, expandable):
    code = textwrap.dedent('''
        import ctypes, sys
        import torch
        path = sys.argv[1]
        alloc = torch.cuda.memory.CUDAPluggableAllocator(path, "gm_test_alloc", "gm_test_free")
        torch.cuda.memory.change_current_allocator(alloc)   # before the first CUDA tensor
        gm = ctypes.CDLL(path)
        gm.gm_test_stat.restype = ctypes.c_longlong
        owns = lambda t: gm.gm_test_owns(ctypes.c_void_p(t.data_ptr()), t.device.index) == 1

        model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(),
                                    torch.nn.Linear(512, 10)).cuda()
        opt = torch.optim.AdamW(model.parameters())
        x = torch.arange(64 * 256, dtype=torch.float32).reshape(64, 256).to("cuda")
        for _ in range(3):
            loss = model(x).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=False)
        torch.cuda.synchronize()
        tensors = [x] + list(model.parameters()) + [p.grad for p in model.parameters()]
        tensors += [v for s in opt.state.values() for v in s.values() if v.is_cuda]
        o = {"owned": all(owns(t) for t in tensors), "n": len(tensors),
             "roundtrip": torch.equal(x.cpu(), torch.arange(64 * 256, dtype=torch.float32).reshape(64, 256)),
             "gm_allocated": gm.gm_test_stat(0, 0), "gm_device_allocs": gm.gm_test_stat(0, 2),
             "expandable": gm.gm_test_stat(0, 3)}
        del tensors, x, model, opt, loss
        import gc; gc.collect()
        o["gm_allocated_after"] = gm.gm_test_stat(0, 0)
        r = report()
        calls, dcalls = r["calls"], r["driver"]["calls"]
        o["runtime_malloc"] = [calls.get("cudaMalloc", 0), calls.get("cudaFree", 0)]
        o["driver"] = [dcalls["cuMemAlloc_v2"], dcalls["cuMemCreate"]]
        dev = r["driver"]["devices"][0]
        o["driver_used"] = dev["bytes_used"] - dev["bytes_context"]  # less the CUDA context
        o["gm_reserved"] = gm.gm_test_stat(0, 1)
        emit(o)
    ''')
    from gpumem import sim
    from sim_helpers import REPORT
    import json
    env = {"GM_TEST_EXPANDABLE": "1" if expandable else "0"}
    rc, out, err = sim.run_snippet(REPORT + code, env=env, args=[str(pluggable_lib)], timeout=300)
    assert rc == 0, err[-4000:]
    o = json.loads(out.splitlines()[-1])
    assert o["owned"] and o["n"] > 10, o
    assert o["roundtrip"]
    assert o["gm_allocated"] > 0 and o["gm_device_allocs"] > 0
    assert o["expandable"] == int(expandable)
    # torch's own cudaMalloc was never called; every byte came from gpumem's
    # driver-level allocations
    assert o["runtime_malloc"] == [0, 0]
    mem_alloc, mem_create = o["driver"]
    assert (mem_create > 0 and mem_alloc == 0) if expandable else (mem_alloc > 0 and mem_create == 0)
    assert o["driver_used"] == o["gm_reserved"]
    # only cuBLAS's workspace (kept by torch per handle and stream) is still allocated
    assert 0 <= o["gm_allocated_after"] <= 64 << 20
