"""gpumem and torch's caching allocator side by side on this GPU: figures, not assertions.

One child per allocator measures, in this order:
  empty_del_us          one torch.empty + del, sizes cycling 512 B .. 64 MiB, all cached
  train_step_ms         median step of a small Transformer with AdamW (TRANSFORMER,
                        d_model 256), synchronised
  peak_reserved_bytes   torch.cuda.max_memory_reserved() over those steps
  recording_overhead_ms the same step's median with memory history on
                        (_record_memory_history, Python stacks) minus train_step_ms
  dump_s, snapshot_bytes _dump_snapshot of that history (median of 3), and the file's size
The test prints one JSON line, ``gpu side by side: {...}``, with both
allocators' figures and the ratios gpumem / torch (below 1: gpumem is
smaller or faster), and writes it to $GPUMEM_GPU_RESULTS when that is set.
Timings on the simulated GPU measure host overhead only (kernels do nothing).
"""

from __future__ import annotations

import json
import os

from gpu_helpers import run_torch
from torch_helpers import TRANSFORMER

METRICS = ("empty_del_us", "train_step_ms", "peak_reserved_bytes", "recording_overhead_ms",
           "dump_s", "snapshot_bytes")

MEASURE = '''
import statistics
sizes = [512, 4 << 10, 64 << 10, 1 << 20, 3 << 20, 16 << 20, 64 << 20]

def empty_del(seq):
    for n in seq:
        t = torch.empty(n, dtype=torch.uint8, device="cuda")
        del t

empty_del(sizes)                            # every size cached once
t0 = time.perf_counter()
empty_del(sizes * 1000)
o = {"empty_del_us": (time.perf_counter() - t0) / (len(sizes) * 1000) * 1e6}

model, opt = make_model(d_model=256)
x = torch.randn(16, 64, 256, device="cuda")
torch.cuda.empty_cache()
torch.cuda.reset_peak_memory_stats()

def step_ms(n):
    times = []
    for _ in range(n):
        t = time.perf_counter()
        train_step(model, opt, x)
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)

step_ms(3)
o["train_step_ms"] = step_ms(15)
o["peak_reserved_bytes"] = torch.cuda.max_memory_reserved()
torch.cuda.memory._record_memory_history(max_entries=100000, stacks="python")
step_ms(3)
o["recording_overhead_ms"] = step_ms(15) - o["train_step_ms"]
dumps = []
for _ in range(3):
    t = time.perf_counter()
    torch.cuda.memory._dump_snapshot(sys.argv[2])
    dumps.append(time.perf_counter() - t)
o["dump_s"] = statistics.median(dumps)
o["snapshot_bytes"] = os.path.getsize(sys.argv[2])
torch.cuda.memory._record_memory_history(enabled=None)
o["device"] = torch.cuda.get_device_name(0)
emit(o)
time.sleep(0.05)    # simgpu/README.md: torch's exit race after backward
'''


def figure(v):
    """Byte counts as they are; times to 4 significant digits."""
    return v if isinstance(v, int) else float(f"{v:.4g}")


def test_side_by_side_figures(gpu, capsys, tmp_path):
    runs = {a: run_torch(MEASURE, a, prelude=TRANSFORMER, args=(tmp_path / f"{a}.pickle",))
            for a in ("torch", "gpumem")}
    result = {"device": runs["torch"]["device"], "simulated": gpu["simulated"]}
    for m in METRICS:
        t, g = runs["torch"][m], runs["gpumem"][m]
        result[m] = {"torch": figure(t), "gpumem": figure(g),
                     "ratio": round(g / t, 3) if t > 0 else None}
    line = json.dumps(result)
    with capsys.disabled():
        print(f"\ngpu side by side: {line}")
    if os.environ.get("GPUMEM_GPU_RESULTS"):
        with open(os.environ["GPUMEM_GPU_RESULTS"], "w", encoding="utf-8") as f:
            f.write(line + "\n")
    for m in ("empty_del_us", "train_step_ms", "peak_reserved_bytes", "dump_s",
              "snapshot_bytes"):
        assert runs["torch"][m] > 0 and runs["gpumem"][m] > 0, (m, runs)
