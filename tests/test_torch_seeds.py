"""The example scripts of the articles users learn memory debugging from
(../shared/seeds), run unchanged except for `gpumem.install()` at the top,
on the simulated GPU. (The ResNet-50 script of seed 000 runs in
tests/sim/test_cudnn.py, which covers the simulator's cuDNN; its recording
calls are the ones seed 001 uses.)"""

from __future__ import annotations

import pickle

import pytest

from torch_helpers import run_gm, run_py

pytestmark = pytest.mark.slow  # left out of the fast tier (see pyproject.toml)


def test_seed_001_visualize_linear_layer(tmp_path):
    # "Visualize and understand GPU memory in PyTorch" (seed 001)
    o = run_gm(f'''
        import os
        from torch import nn
        os.chdir({str(tmp_path)!r})
        # Start recording memory snapshot history
        torch.cuda.memory._record_memory_history(max_entries=100000)
        model = nn.Linear(10000, 50000, device='cuda')
        for _ in range(3):
            inputs = torch.randn(5000, 10000, device='cuda')
            outputs = model(inputs)
        # Dump memory snapshot history to a file and stop recording
        torch.cuda.memory._dump_snapshot('profile.pkl')
        torch.cuda.memory._record_memory_history(enabled=None)
        emit({{"allocated": torch.cuda.memory_allocated()}})
    ''')
    with open(tmp_path / "profile.pkl", "rb") as f:
        snap = pickle.load(f)
    sizes = [e["size"] for e in snap["device_traces"][0] if e["action"] == "alloc"]
    # weights 2 GB, bias, 3 inputs of 200 MB and outputs of 1 GB, as the article explains
    assert 10000 * 50000 * 4 in sizes and sizes.count(5000 * 10000 * 4) == 3
    assert sizes.count(5000 * 50000 * 4) == 3
    # the model, one live input and one live output (the article's steps 1-9)
    assert o["allocated"] >= (10000 * 50000 + 5000 * 10000 + 5000 * 50000) * 4
    proc = run_py(f'''
        import runpy, sys
        sys.argv = ["_memory_viz", "trace_plot", {str(tmp_path / "profile.pkl")!r}, "-o",
                    {str(tmp_path / "profile.html")!r}]
        runpy.run_module("torch.cuda._memory_viz", run_name="__main__")
    ''')
    assert (tmp_path / "profile.html").stat().st_size > 1000, proc.stderr


LEAK = """
# Detecting a Memory Leak (seed 002)
torch.cuda.memory._record_memory_history(max_entries=100_000)
model = torch.nn.TransformerEncoder(
    torch.nn.TransformerEncoderLayer(d_model=512, nhead=8, batch_first=True),
    num_layers=6,
).cuda()
optimizer = torch.optim.AdamW(model.parameters())
loss_history = []
climb = []
for step in range(6):
    x = torch.randn(32, 128, 512, device="cuda")
    loss = model(x).mean()
    loss_history.append(loss)  # leaks: retains the full graph each step
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    print(f"step {step:02d} | allocated: {torch.cuda.memory_allocated() / 1e6:.1f} MB")
    st = torch.cuda.memory_stats()
    climb.append([st["requested_bytes.all.current"], st["requested_bytes.all.peak"],
                  torch.cuda.memory_allocated(), torch.cuda.max_memory_allocated()])
"""


def test_seed_002_memory_numbers_match_torchs_own_allocator():
    # The same script under torch's caching allocator and under gpumem: the
    # bytes the program asked for agree exactly, step by step. The rounded
    # block sizes (memory_allocated) may differ by a block or two: between
    # equally good free blocks both allocators take the lowest address, and
    # the simulator's cudaMalloc (torch) and cuMemAlloc (gpumem) hand out
    # addresses in different orders.
    # os._exit: with graphs kept alive in loss_history, torch's autograd device
    # thread may drop its last GraphTask during interpreter shutdown and abort
    # ("terminate called without an active exception"); seen on the simulator
    # in about half the runs with torch's own allocator, without gpumem.
    end = 'emit({"climb": climb}); import os, sys; sys.stdout.flush(); os._exit(0)'
    native = run_gm(end, prelude=LEAK, install=False)["climb"]
    ours = run_gm(end, prelude=LEAK)["climb"]
    assert [s[:2] for s in ours] == [s[:2] for s in native]
    slack = 8 << 20  # a few blocks whose unsplit remainder (< 1 MiB each way) differs
    for a, b in zip(ours, native):
        assert abs(a[2] - b[2]) <= slack and abs(a[3] - b[3]) <= slack, (ours, native)


def test_seed_002_before_after_and_inspection(tmp_path):
    # "Modern Memory Snapshot in PyTorch" (seed 002): before/after snapshots,
    # then inspecting the snapshot directly
    o = run_gm(f'''
        import gc, os, pickle
        os.chdir({str(tmp_path)!r})
        torch.cuda.memory._record_memory_history(max_entries=100_000)
        def save_snapshot(path):
            with open(path, "wb") as f:
                pickle.dump(torch.cuda.memory._snapshot(), f)
        model = torch.nn.Linear(2048, 2048).cuda()
        optimizer = torch.optim.Adam(model.parameters())
        # warm-up: let one-time allocations settle
        for _ in range(3):
            model(torch.randn(32, 2048, device="cuda")).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
        gc.collect()
        torch.cuda.empty_cache()
        save_snapshot("snap_before.pkl") # baseline
        for step in range(10):
            model(torch.randn(32, 2048, device="cuda")).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
        save_snapshot("snap_after.pkl") # measurement point
        torch.cuda.memory._record_memory_history(enabled=None)
        # Inspecting the Snapshot Directly
        with open("snap_after.pkl", "rb") as f:
            snapshot = pickle.load(f)
        blocks = [b for seg in snapshot["segments"] for b in seg["blocks"]
                  if b["state"] == "active_allocated"]
        blocks.sort(key=lambda b: b["size"], reverse=True)
        locs = []
        for b in blocks[:5]:
            frames = b.get("frames", [])
            loc = f"{{frames[0]['filename']}}:{{frames[0]['line']}}" if frames else "unknown"
            locs.append(loc)
        # blocks allocated from Python (not by the autograd thread) carry this script's frames
        py_frames = [b for b in blocks[:5] if any(f["filename"] == "<string>" for f in b["frames"])]
        emit({{"locs": locs, "py_frames": len(py_frames)}})
    ''')
    assert len(o["locs"]) == 5 and "unknown" not in o["locs"], o
    assert o["py_frames"] > 0
    for name in ("snap_before", "snap_after"):
        run_py(f'''
            import runpy, sys
            sys.argv = ["_memory_viz", "trace_plot", {str(tmp_path / (name + ".pkl"))!r}, "-o",
                        {str(tmp_path / (name + ".html"))!r}]
            runpy.run_module("torch.cuda._memory_viz", run_name="__main__")
        ''')
        assert (tmp_path / (name + ".html")).stat().st_size > 1000


def test_seed_002_oom_capture_and_step_range(tmp_path):
    # "Capturing on OOM" and "Step-Range Scheduling" (seed 002), on a 1 GiB device
    o = run_gm(f'''
        import os, pickle
        os.chdir({str(tmp_path)!r})
        torch.cuda.memory._record_memory_history(max_entries=100_000)
        saved = False
        try:
            model = torch.nn.Linear(4096, 4096).cuda()
            keep = []
            for step in range(1000):
                x = torch.randn(512, 4096, device="cuda")
                keep.append(model(x))          # made to run out of memory
                keep[-1].sum().backward()
        except torch.cuda.OutOfMemoryError:
            snapshot = torch.cuda.memory._snapshot()
            with open("oom_snapshot.pkl", "wb") as f:
                pickle.dump(snapshot, f)
            saved = True
        finally:
            torch.cuda.memory._record_memory_history(enabled=None)
        del keep
        optimizer = torch.optim.SGD(model.parameters())
        PROFILE_START, PROFILE_END = 3, 6
        for step in range(20):
            x = torch.randn(64, 4096, device="cuda")
            model(x).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
            if step == PROFILE_START:
                torch.cuda.memory._record_memory_history(max_entries=100_000)
            if step == PROFILE_END:
                snapshot = torch.cuda.memory._snapshot()
                with open(f"snapshot_step{{step}}.pkl", "wb") as f:
                    pickle.dump(snapshot, f)
                torch.cuda.memory._record_memory_history(enabled=None)
                break
        emit({{"saved": saved, "ooms": torch.cuda.memory_stats()["num_ooms"]}})
    ''', memory="1GiB")
    assert o["saved"] and o["ooms"] == 1
    with open(tmp_path / "oom_snapshot.pkl", "rb") as f:
        snap = pickle.load(f)
    assert any(e["action"] == "oom" for e in snap["device_traces"][0])
    with open(tmp_path / "snapshot_step6.pkl", "rb") as f:
        step = pickle.load(f)
    assert step["device_traces"][0] and step["segments"]
