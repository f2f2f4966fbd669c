"""PyTorch's caching allocator and gpumem side by side, on the simulated GPU.

    python benchmarks/torch_side_by_side.py [--json] [--repeats 3] [--iters 20000]

Every configuration runs in its own process under gpumem.sim (torch's CUDA
build over the fake CUDA libraries; kernels do nothing, so the figures are
allocator and framework overhead, not GPU work). "torch" is torch's native
caching allocator; "gpumem" is the same script after gpumem.install().

empty_del_us: one torch.empty + del, averaged over --iters pairs whose
    sizes cycle through 512 B, 4 KiB, 64 KiB, 1 MiB, 3 MiB, 16 MiB and
    64 MiB (after one warm-up pass, so every size is cached).
train_step_ms: median time of one forward/backward/AdamW step of a small
    Transformer encoder (2 layers, d_model 256, batch 16 x 64 tokens), after
    3 warm-up steps, synchronised.
peak_reserved_bytes: torch.cuda.max_memory_reserved() over those steps.

Each figure is the median of --repeats processes per allocator, run
alternately. Ratios are gpumem / torch (targets: <= 1.0 for all three).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gpumem import sim  # noqa: E402

SNIPPET = '''
import json, statistics, sys, time
import torch
if sys.argv[1] == "gpumem":
    import gpumem
    gpumem.install()
iters = int(sys.argv[2])

# --- empty_del_us
sizes = [512, 4 << 10, 64 << 10, 1 << 20, 3 << 20, 16 << 20, 64 << 20]
for n in sizes:                       # warm-up: every size cached once
    t = torch.empty(n, dtype=torch.uint8, device="cuda")
    del t
torch.cuda.synchronize()
seq = [sizes[i % len(sizes)] for i in range(iters)]
t0 = time.perf_counter()
for n in seq:
    t = torch.empty(n, dtype=torch.uint8, device="cuda")
    del t
empty_del_us = (time.perf_counter() - t0) / iters * 1e6

# --- train_step_ms, peak_reserved_bytes
torch.manual_seed(0)
layer = torch.nn.TransformerEncoderLayer(d_model=256, nhead=4, dim_feedforward=1024,
                                         batch_first=True)
model = torch.nn.Sequential(torch.nn.TransformerEncoder(layer, num_layers=2),
                            torch.nn.Linear(256, 256)).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
x = torch.randn(16, 64, 256, device="cuda")
torch.cuda.empty_cache()
torch.cuda.reset_peak_memory_stats()
def step():
    loss = model(x).float().pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
for _ in range(3):
    step()
torch.cuda.synchronize()
times = []
for _ in range(15):
    t0 = time.perf_counter()
    step()
    torch.cuda.synchronize()
    times.append(time.perf_counter() - t0)
print(json.dumps({"empty_del_us": empty_del_us,
                  "train_step_ms": statistics.median(times) * 1e3,
                  "peak_reserved_bytes": torch.cuda.max_memory_reserved()}))
import os; sys.stdout.flush(); os._exit(0)   # skip interpreter teardown
'''

METRICS = ("empty_del_us", "train_step_ms", "peak_reserved_bytes")


def run_one(allocator: str, iters: int) -> dict:
    rc, out, err = sim.run_snippet(textwrap.dedent(SNIPPET), args=[allocator, str(iters)],
                                   timeout=600)
    if rc != 0:
        raise SystemExit(f"{allocator} run failed (exit {rc}):\n{err[-4000:]}")
    return json.loads(out.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--repeats", type=int, default=3, help="processes per allocator")
    ap.add_argument("--iters", type=int, default=20000, help="empty+del pairs per process")
    args = ap.parse_args(argv)
    # Build the shim (and the fake libraries) before anything is timed.
    from gpumem.pytorch import shim_build as _shim_build
    _shim_build.build()
    runs = {"torch": [], "gpumem": []}
    for _ in range(args.repeats):
        for name in runs:
            runs[name].append(run_one(name, args.iters))
    result = {"device": "simulated GPU (gpumem.sim), 80 GiB", "repeats": args.repeats,
              "iters": args.iters}
    for m in METRICS:
        t = statistics.median(r[m] for r in runs["torch"])
        g = statistics.median(r[m] for r in runs["gpumem"])
        result[m] = {"torch": t, "gpumem": g, "ratio": g / t if t else None}
    result["runs"] = runs
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        print(f"{'metric':<22}{'torch':>16}{'gpumem':>16}{'ratio':>8}")
        for m in METRICS:
            r = result[m]
            print(f"{m:<22}{r['torch']:>16.4g}{r['gpumem']:>16.4g}{r['ratio']:>8.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
