"""The sampled mode under torch on the simulated GPU: an out-of-memory in a
Transformer training step dumps a snapshot in which at least 99% of the
live bytes have a stack, and ``gpumem simulate --sample`` records sampled.
(The mode itself, on gpumem.Allocator, is tested in test_history_sample.py.)
"""

from __future__ import annotations

import pickle
import subprocess
import sys
import textwrap

import pytest

from sim_helpers import sim_lib_dir
from torch_helpers import _env, built_shim, run_gm

pytestmark = pytest.mark.slow  # torch on the simulator: seconds per test

MiB = 1 << 20

TRAIN_TO_OOM = '''
import os
torch.manual_seed(0)
oom = None
# recording from the start, as an always-on mode runs (the parameters too)
with gpumem.record(os.environ["SNAP"], sample=os.environ["SAMPLE"]) as rec:
    layer = torch.nn.TransformerEncoderLayer(d_model=512, nhead=8, dim_feedforward=2048,
                                             batch_first=True)
    model = torch.nn.Sequential(torch.nn.TransformerEncoder(layer, num_layers=4),
                                torch.nn.Linear(512, 1000)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    try:
        for batch in (4, 8, 16, 32, 64, 128, 256):     # grows until it does not fit
            x = torch.randn(batch, 256, 512, device="cuda")
            model(x).float().pow(2).mean().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            rec.step()
    except torch.cuda.OutOfMemoryError:
        oom = batch
emit({"oom_batch": oom, "oom_snapshots": rec.oom_snapshots})
'''


def live_coverage(snap):
    """(live bytes, live bytes whose block has a stack) of the snapshot."""
    total = with_stack = 0
    for seg in snap["segments"]:
        for b in seg["blocks"]:
            if b["state"] == "active_allocated":
                total += b["requested_size"]
                with_stack += b["requested_size"] if b.get("frames") else 0
    return total, with_stack


def test_oom_snapshot_of_a_training_step_has_stacks_for_99_percent_of_live_bytes(tmp_path):
    built_shim()
    o = run_gm(TRAIN_TO_OOM, memory="3GiB",
               env={"SNAP": str(tmp_path / "m.pickle"), "SAMPLE": "seed:1"}, timeout=600)
    assert o["oom_batch"] and o["oom_snapshots"], o
    with open(o["oom_snapshots"][0], "rb") as f:
        snap = pickle.load(f)
    assert snap["gpumem_sampling"]["threshold_bytes"] == MiB
    trace = snap["device_traces"][0]
    assert trace[-1]["action"] == "oom"
    allocs = [e for e in trace if e["action"] == "alloc"]
    small = [e for e in allocs if e["size"] < MiB]
    assert small and sum(1 for e in small if e.get("frames")) < 0.5 * len(small)
    total, with_stack = live_coverage(snap)
    print(f"live bytes at the OOM: {total}, with a stack: {with_stack} "
          f"({100 * with_stack / total:.2f}%)")
    assert total > 100 * MiB and with_stack >= 0.99 * total, (with_stack, total)


def test_simulate_sample_flag(tmp_path):
    built_shim()
    sim_lib_dir()
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent('''
        import torch
        xs = [torch.empty(n, device="cuda") for n in (100, 2000, 300_000, 1 << 20)]
    '''))
    proc = subprocess.run([sys.executable, "-m", "gpumem.sim.command", "--out",
                           str(tmp_path / "out"), "--no-view", "--sample=mean:64KiB,seed:3",
                           "--", sys.executable, str(script)],
                          capture_output=True, text=True, cwd=tmp_path, env=_env(), timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    with open(tmp_path / "out" / "snapshot.pickle", "rb") as f:
        snap = pickle.load(f)
    assert snap["gpumem_sampling"] == {"mean_bytes": 64 << 10, "threshold_bytes": MiB, "seed": 3}
    bad = subprocess.run([sys.executable, "-m", "gpumem.sim.command", "--out",
                          str(tmp_path / "out2"), "--sample=often", "--", sys.executable,
                          str(script)], capture_output=True, text=True, cwd=tmp_path,
                         env=_env(), timeout=300)
    assert bad.returncode == 2 and "GPUMEM_RECORD_SAMPLE" in bad.stderr, bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1, bad.stderr
