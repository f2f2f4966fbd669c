"""The simulator's no-host-memory mode (GPUMEM_FAKECUDA_NO_HOST_MEMORY=1,
``python -m gpumem.sim --no-host-memory``; Note [No host memory] in
simgpu/driver/fakecuda_nohost.c).

Copies and memsets of more than 64 KiB into device memory store nothing and
reading such a range back yields zeros, so device memory costs no host
memory; smaller pieces keep their data; every memory figure is the same as
without the mode. Each test runs its code on the simulator in a subprocess
and compares the mode with the default.
"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap

import pytest

from sim_helpers import needs_cc, needs_torch, run_sim

pytestmark = needs_cc

ON = {"GPUMEM_FAKECUDA_NO_HOST_MEMORY": "1"}
OFF = {"GPUMEM_FAKECUDA_NO_HOST_MEMORY": "0"}

RSS = r'''
import re as _re
def rss_mib():
    text = open("/proc/self/status").read()
    return int(_re.search(r"VmRSS:\s+(\d+) kB", text).group(1)) / 1024
'''

# Runtime-level copies through ctypes: no torch needed.
COPIES = RSS + r'''
import ctypes as C
rt = C.CDLL("libcudart.so.13")
cu = C.CDLL("libcuda.so.1")
cu.fakecuda_query.restype = C.c_longlong
vp, sz = C.c_void_p, C.c_size_t
H2D, D2H, D2D, DEFAULT = 1, 2, 3, 4
def dmalloc(n):
    p = vp(); assert rt.cudaMalloc(C.byref(p), sz(n)) == 0; return p.value
def pattern(n):
    return (C.c_ubyte * n).from_buffer_copy(bytes(i % 251 + 1 for i in range(n)))
o = {}
for name, n in (("small", 4096), ("limit", 64 << 10), ("large", (64 << 10) + 1)):
    src, back = pattern(n), (C.c_ubyte * n)()
    d = dmalloc(n)
    assert rt.cudaMemcpy(vp(d), src, sz(n), H2D) == 0
    assert rt.cudaMemcpy(back, vp(d), sz(n), D2H) == 0
    o[name + "_h2d"] = bytes(back) == bytes(src)
    o[name + "_zero"] = not any(back)
    # device to device, then back through an async copy on the default kind
    d2 = dmalloc(n)
    assert rt.cudaMemcpy(vp(d2), vp(d), sz(n), D2D) == 0
    back2 = (C.c_ubyte * n)()
    assert rt.cudaMemcpyAsync(back2, vp(d2), sz(n), DEFAULT, None) == 0
    assert rt.cudaStreamSynchronize(None) == 0
    o[name + "_d2d"] = bytes(back2) == bytes(src)
    assert rt.cudaMemset(vp(d2), 7, sz(n)) == 0
    assert rt.cudaMemcpy(back2, vp(d2), sz(n), D2H) == 0
    o[name + "_memset"] = bytes(back2) == b"\x07" * n
# cuBLAS's host<->device vector copies follow the same rule
blas = C.CDLL("libcublas.so.13")
for name, n in (("blas_small", 1024), ("blas_large", 32 << 10)):   # floats: 4 KiB, 128 KiB
    src = (C.c_float * n)(*range(1, n + 1))
    back = (C.c_float * n)()
    d = dmalloc(4 * n)
    assert blas.cublasSetVector(n, 4, src, 1, vp(d), 1) == 0
    assert blas.cublasGetVector(n, 4, vp(d), 1, back, 1) == 0
    o[name] = list(back[:3])
# pinned host memory is host memory: it keeps its data in both modes
n = 1 << 20
h1, h2 = vp(), vp()
assert rt.cudaHostAlloc(C.byref(h1), sz(n), 0) == 0 and rt.cudaHostAlloc(C.byref(h2), sz(n), 0) == 0
C.memset(h1, 5, n)
assert rt.cudaMemcpyAsync(h2, h1, sz(n), DEFAULT, None) == 0 and rt.cudaStreamSynchronize(None) == 0
o["pinned"] = C.string_at(h2, n) == b"\x05" * n
# 1 GiB set and read back: host memory only without the mode
big = 1 << 30
d = dmalloc(big)
free0, total = sz(), sz()
before = rss_mib()
assert rt.cudaMemset(vp(d), 1, sz(big)) == 0
dst = vp(); assert rt.cudaHostAlloc(C.byref(dst), sz(64 << 20), 0) == 0
for off in range(0, big, 64 << 20):
    assert rt.cudaMemcpy(dst, vp(d + off), sz(64 << 20), D2H) == 0
o["memset_rss_mib"] = rss_mib() - before
o["mode"] = cu.fakecuda_query(b"no_host_memory", -1)
rt.cudaMemGetInfo(C.byref(free0), C.byref(total))
o["used"] = total.value - free0.value
emit(o)
'''


def test_copies_and_memsets_with_and_without_the_mode():
    off = run_sim(COPIES, env=OFF)
    on = run_sim(COPIES, env=ON)
    assert off["mode"] == 0 and on["mode"] == 1
    for name in ("small", "limit", "large"):
        for what in ("h2d", "d2d", "memset"):
            assert off[f"{name}_{what}"], (name, what, off)
    # at most 64 KiB: the data is kept; above it: nothing is stored
    for name in ("small", "limit"):
        for what in ("h2d", "d2d", "memset"):
            assert on[f"{name}_{what}"], (name, what, on)
    assert not on["large_h2d"] and on["large_zero"]
    assert not on["large_d2d"] and not on["large_memset"]
    assert on["pinned"] and off["pinned"]
    assert off["blas_small"] == off["blas_large"] == on["blas_small"] == [1.0, 2.0, 3.0]
    assert on["blas_large"] == [0.0, 0.0, 0.0]
    # the device's accounting does not depend on the mode
    assert on["used"] == off["used"] > 1 << 30
    # a 1 GiB memset and its read-back: ~1 GiB of host memory, or none
    assert off["memset_rss_mib"] > 900, off
    assert on["memset_rss_mib"] < 100, on


def test_a_bad_value_is_refused_with_one_line():
    out = run_sim(textwrap.dedent(r'''
        import ctypes as C
        cu = C.CDLL("libcuda.so.1")
        emit({"init": cu.cuInit(0)})
    '''), env={"GPUMEM_FAKECUDA_NO_HOST_MEMORY": "yes"})
    assert out["init"] != 0


def test_the_launcher_sets_the_variable():
    proc = subprocess.run([sys.executable, "-m", "gpumem.sim", "--no-host-memory", "--print-env"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "export GPUMEM_FAKECUDA_NO_HOST_MEMORY=1" in proc.stdout.splitlines()
    proc = subprocess.run([sys.executable, "-m", "gpumem.sim", "--print-env"],
                          capture_output=True, text=True, timeout=120,
                          env={k: v for k, v in __import__("os").environ.items()
                               if k != "GPUMEM_FAKECUDA_NO_HOST_MEMORY"})
    assert "NO_HOST_MEMORY" not in proc.stdout


TORCH_RSS = RSS + r'''
import torch
d = torch.empty(512 << 20, dtype=torch.float32, device="cuda")   # 2 GiB
src = torch.ones(16 << 20, dtype=torch.float32)                   # 64 MiB on the host
torch.cuda.synchronize()
before = rss_mib()
for i in range(32):
    d[i * (16 << 20):(i + 1) * (16 << 20)].copy_(src)
torch.cuda.synchronize()
grew = rss_mib() - before
small = torch.tensor([0.0, 1.0, 2.0, 3.0], device="cuda")  # an H2D copy of 16 bytes
emit({"grew": grew, "first": d[:4].tolist(), "small": small.tolist()[:3],
      "allocated": torch.cuda.memory_allocated()})
'''


@pytest.mark.slow  # fast tier: one test of this kind is enough (README, Test)
@needs_torch
def test_filling_2gib_from_the_host_costs_no_host_memory():
    off = run_sim(TORCH_RSS, env=OFF)
    on = run_sim(TORCH_RSS, no_host_memory=True)
    assert off["allocated"] == on["allocated"] == (2 << 30) + 512
    assert off["first"] == [1.0] * 4 and on["first"] == [0.0] * 4
    assert off["small"] == on["small"] == [0.0, 1.0, 2.0]
    assert off["grew"] > 1900, off
    assert on["grew"] < 100, on
    assert off["grew"] > 20 * max(on["grew"], 1.0)


STEP = r'''
import torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.GELU(),
                            torch.nn.Linear(2048, 512)).cuda()
opt = torch.optim.AdamW(model.parameters())
marks = {"params": torch.cuda.memory_allocated()}
for step in range(2):
    x = torch.randn(64, 512, device="cuda")
    loss = model(x).pow(2).mean()
    marks[f"fwd{step}"] = torch.cuda.memory_allocated()
    loss.backward()
    marks[f"bwd{step}"] = torch.cuda.memory_allocated()
    opt.step()
    marks[f"step{step}"] = torch.cuda.memory_allocated()
    opt.zero_grad()
torch.cuda.synchronize()
free, total = torch.cuda.mem_get_info()
marks.update(peak=torch.cuda.max_memory_allocated(), reserved=torch.cuda.memory_reserved(),
             used=total - free, loss=loss.item())
emit(marks)
'''


@pytest.mark.slow  # fast tier: one test of this kind is enough (README, Test)
@needs_torch
def test_memory_figures_of_a_training_step_are_unchanged():
    off = run_sim(STEP, env=OFF)
    on = run_sim(STEP, env=ON)
    assert off == on
    assert on["peak"] > on["params"] > 0


GRAPH = RSS + r'''
import torch
src = torch.empty(64 << 20, device="cuda")      # 256 MiB, never written
dst = torch.empty_like(src)
small_src = torch.tensor([4.0, 5.0], device="cuda")
small_dst = torch.zeros_like(small_src)
g = torch.cuda.CUDAGraph()
s = torch.cuda.Stream()
s.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(s):
    with torch.cuda.graph(g):                   # captured, not run
        dst.copy_(src)
        small_dst.copy_(small_src)
torch.cuda.current_stream().wait_stream(s)
torch.cuda.synchronize()
captured = small_dst.tolist()
before = rss_mib()
g.replay()                                      # the copies run here
torch.cuda.synchronize()
emit({"grew": rss_mib() - before, "captured": captured, "small": small_dst.tolist()})
'''


@pytest.mark.slow  # fast tier: one test of this kind is enough (README, Test)
@needs_torch
def test_graph_replays_follow_the_rule():
    off = run_sim(GRAPH, env=OFF)
    on = run_sim(GRAPH, env=ON)
    for out in (off, on):
        assert out["captured"] == [0.0, 0.0] and out["small"] == [4.0, 5.0], out
    # the replayed 256 MiB copy writes its destination only without the mode
    assert off["grew"] > 200, off
    assert on["grew"] < 20, on


META = r'''
import torch
with torch.device("meta"):
    model = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(8)])
nbytes = sum(p.numel() * p.element_size() for p in model.parameters())
model.to_empty(device="cuda")
for m in model:
    m.reset_parameters()
after = torch.cuda.memory_allocated()
opt = torch.optim.AdamW(model.parameters())
model(torch.randn(4, 1024, device="cuda")).sum().backward()
opt.step()
torch.cuda.synchronize()
emit({"nbytes": nbytes, "after_to_empty": after, "device": str(next(model.parameters()).device),
      "state": sum(s["exp_avg"].numel() * 4 * 2 for s in opt.state.values()),
      "allocated": torch.cuda.memory_allocated()})
'''


@pytest.mark.slow  # fast tier: one test of this kind is enough (README, Test)
@needs_torch
def test_a_meta_model_materialised_with_to_empty():
    out = run_sim(META, env=ON)
    assert out["device"] == "cuda:0"
    assert out["after_to_empty"] == out["nbytes"] == 8 * (1024 * 1024 + 1024) * 4
    # parameters, gradients and AdamW's two moments
    assert out["allocated"] >= out["nbytes"] * 2 + out["state"]
    assert out["state"] == 2 * out["nbytes"]


DDP = r'''
import os, torch, torch.distributed as dist
local = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local)
dist.init_process_group("nccl")
# DDP all-gathers every rank's parameter shapes and compares them with its
# own: a small tensor read back, which keeps its data in the mode
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(1024, 1024).cuda(),
                                                  device_ids=[local])
model(torch.randn(8, 1024, device="cuda")).sum().backward()
torch.cuda.synchronize()
print(f"DDP_OK {dist.get_rank()}", flush=True)
dist.destroy_process_group()
'''


@pytest.mark.slow
@needs_torch
def test_ddp_runs_in_the_mode(tmp_path):
    import socket
    from gpumem import sim
    script = tmp_path / "ddp.py"
    script.write_text(DDP)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "gpumem.sim", "--no-host-memory", "--devices", "2", "--",
           sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
           "--master-port", str(port), str(script)]
    sim.lib_dir()
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=420)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    # the ranks share stdout: one's line may end after the other's text
    assert sorted(re.findall(r"DDP_OK (\d+)", proc.stdout)) == ["0", "1"]
