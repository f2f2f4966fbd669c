"""PyTorch on the GPU, with its own caching allocator and with gpumem installed.

The workloads of the simulator tests (tests/sim/test_torch.py, test_torch_*.py):
tensors, copies, statistics, empty_cache, out of memory, expandable
segments, record_stream across a busy stream, a training loop whose peaks
repeat, and a snapshot of it opened by torch.cuda._memory_viz.  Each runs in
a child process per allocator, and checks its figures against the driver's
(torch.cuda.mem_get_info).  gpumem must give the figures torch gives.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from gpu_helpers import ROOT, child_env, run_torch, tolerance
from torch_helpers import TRANSFORMER

MiB = 1 << 20
ALLOCATORS = ["torch", "gpumem"]


def conf(expandable: bool) -> dict:
    text = f"expandable_segments:{expandable}"
    return {"PYTORCH_CUDA_ALLOC_CONF": text, "GPUMEM_ALLOC_CONF": text}


@pytest.mark.parametrize("expandable", [False, True])
@pytest.mark.parametrize("allocator", ALLOCATORS)
def test_tensors_stats_empty_cache_and_oom(gpu, allocator, expandable):
    if expandable and not gpu["gpus"][0]["vmm"]:
        pytest.skip("GPU 0 has no virtual memory management (expandable segments)")
    o = run_torch('''
        o = {}
        base = driver_used()
        a = torch.empty(MiB, dtype=torch.uint8, device="cuda")
        b = torch.empty(30 * MiB, dtype=torch.uint8, device="cuda")
        o["allocated"] = torch.cuda.memory_allocated()
        o["reserved"] = [torch.cuda.memory_reserved(), driver_used() - base]
        src = torch.arange(1 << 16, dtype=torch.float32)
        o["roundtrip"] = torch.equal(src.cuda().cpu(), src)
        del b
        o["after_del"] = torch.cuda.memory_allocated()
        torch.cuda.empty_cache()
        o["after_empty_cache"] = [torch.cuda.memory_reserved(), driver_used() - base]
        free, total = torch.cuda.mem_get_info()
        try:
            torch.empty(total + (1 << 30), dtype=torch.uint8, device="cuda")
        except torch.cuda.OutOfMemoryError as e:
            o["oom"] = str(e)
        o["num_ooms"] = torch.cuda.memory_stats()["num_ooms"]
        c = torch.empty(8 * MiB, dtype=torch.uint8, device="cuda")   # still works
        torch.cuda.synchronize()
        o["end"] = [torch.cuda.memory_reserved(), driver_used() - base]
        emit(o)
    ''', allocator, env=conf(expandable))
    tol = tolerance(gpu)
    assert o["allocated"] == 31 * MiB
    for reserved, driver in (o["reserved"], o["after_empty_cache"], o["end"]):
        assert abs(reserved - driver) <= tol, o      # what the allocator holds, the driver lent
    if not expandable:   # a 2 MiB small segment and a 30 MiB one, as torch's rules say
        assert o["reserved"][0] == 32 * MiB and o["after_empty_cache"][0] == 2 * MiB, o
    assert o["roundtrip"] and o["after_del"] == MiB
    assert o["oom"].startswith("CUDA out of memory. Tried to allocate "), o["oom"]
    assert o["num_ooms"] == 1


@pytest.mark.parametrize("allocator", ALLOCATORS)
def test_record_stream_waits_for_a_busy_stream(gpu, allocator):
    o = run_torch('''
        from gpumem.checkup.cudadriver import Driver
        drv = Driver(); drv.init()
        side = torch.cuda.Stream()
        x = torch.empty(4 * MiB, dtype=torch.uint8, device="cuda")
        first = x.data_ptr()
        how = drv.hold_stream(0, side.cuda_stream, 0.5)    # side is busy from now on
        x.record_stream(side)
        del x
        y = torch.empty(4 * MiB, dtype=torch.uint8, device="cuda")
        busy = not side.query()
        while_busy = y.data_ptr() == first
        side.synchronize()
        drv.release_hold(0)
        del y
        z = torch.empty(4 * MiB, dtype=torch.uint8, device="cuda")
        emit({"busy": busy, "while_busy": while_busy, "after": z.data_ptr() == first,
              "how": how})
    ''', allocator)
    if gpu["simulated"]:
        assert o["busy"], o                     # the simulated hold is deterministic
    if o["busy"]:
        assert not o["while_busy"], o
    assert o["after"], o


@pytest.mark.parametrize("allocator", ALLOCATORS)
def test_training_peaks_repeat_and_the_snapshot_opens_in_memory_viz(gpu, allocator, tmp_path):
    path = tmp_path / f"{allocator}.pickle"
    o = run_torch('''
        import pickle
        import torch.cuda._memory_viz as memory_viz
        model, opt = make_model()
        x = torch.randn(8, 16, 64, device="cuda")
        torch.cuda.memory._record_memory_history(max_entries=100000, stacks="python")
        steps = measured_steps(model, opt, x, 4)
        torch.cuda.memory._dump_snapshot(sys.argv[2])
        torch.cuda.memory._record_memory_history(enabled=None)
        with open(sys.argv[2], "rb") as f:
            snap = pickle.load(f)
        html = memory_viz.trace_plot(snap) + memory_viz.segment_plot(snap)
        funcs = {fr["name"] for t in snap["device_traces"] for e in t for fr in e.get("frames", [])}
        emit({"peaks": steps["peaks"], "reserved": steps["reserved"],
              "segments": sum(s["total_size"] for s in snap["segments"]),
              "segsum": memory_viz.segsum(snap).splitlines()[0],
              "trace_lines": len(memory_viz.trace(snap).splitlines()), "html": len(html),
              "train_step_seen": "train_step" in funcs,
              "gpumem": ALLOCATOR == "gpumem" and gpumem.is_installed()})
        time.sleep(0.05)    # simgpu/README.md: torch's exit race after backward
    ''', allocator, prelude=TRANSFORMER, args=(path,))
    peaks, reserved = o["peaks"], o["reserved"]
    assert peaks[1] == peaks[2] == peaks[3] > 0, peaks   # AdamW's state appears in step 1
    assert reserved[1] == reserved[2] == reserved[3] >= peaks[1], reserved
    assert o["segments"] == reserved[-1]
    assert o["segsum"].startswith("Summary of segments")
    assert o["trace_lines"] > 50 and o["html"] > 1000 and o["train_step_seen"]
    assert o["gpumem"] == (allocator == "gpumem")
    summary = subprocess.run([sys.executable, "-m", "gpumem", "summary", str(path)],
                             capture_output=True, text=True, cwd=ROOT, env=child_env(),
                             timeout=300)
    assert summary.returncode == 0 and "peak reserved" in summary.stdout, summary.stderr
