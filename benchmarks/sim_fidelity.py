"""How close the simulated GPU's allocations are to a real GPU's, on workloads
whose real allocations follow from arithmetic alone.

    python benchmarks/sim_fidelity.py [--json] [--only NAME]

Each workload runs under the simulator (gpumem.sim) with torch 2.14.1's own
caching allocator, records torch's memory history, and is compared with
what a real GPU must allocate, computed here from the shapes and dtypes
(never from a simulated run):

  seed001_linear  the "Visualize and understand GPU memory" article's
                  nn.Linear(10000, 50000) and three inputs of 5000 x 10000:
                  the article's 12 steps, allocation by allocation, in order
                  (plus cuBLAS's workspace: 32 MiB on compute capability 9.x,
                  8 MiB + 128 KiB before, torch's default)
  mlp_adamw       a 4-layer MLP trained with AdamW: memory_allocated() after
                  the model, after backward (+ gradients), after the step
                  (+ exp_avg, exp_avg_sq) and after zero_grad(set_to_none)
  conv_stack      five Conv2d layers (strides, padding, dilation, groups)
                  forward without autograd: every output's size is
                  N x C_out x H_out x W_out x 4 with
                  H_out = floor((H + 2p - d(k - 1) - 1) / s) + 1; cuDNN's
                  workspaces are listed apart (their sizes are the fake
                  cuDNN's choice, simgpu/README.md)
  reduce_staging  x.sum() over 2**24 floats on each GPU model: torch's
                  reduction allocates its 4-byte result, a 4-byte staging
                  slot per block, with SMs x max threads per SM / 512 blocks
                  (NVIDIA's published SM counts and threads per SM), and a
                  4-byte semaphore

Sizes are requested bytes (the trace's sizes and requested_bytes.*): torch's
allocator then rounds them the same way on any device.

Reported per workload: expected and simulated bytes, their ratio, and the
allocations that differ (none, when the simulator is exact).
"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
from pathlib import Path
from typing import Callable, Dict, List, Tuple

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gpumem import sim
from gpumem.sim import gpus as sim_gpus  # noqa: E402

MiB = 1 << 20


def cublas_workspace(cc_major: int) -> int:
    # torch's default cuBLAS workspace (CUBLAS_WORKSPACE_CONFIG unset):
    # ":4096:8" (32 MiB) on compute capability 9.x and later,
    # ":4096:2:16:8" (8 MiB + 128 KiB) before
    return 4096 * 1024 * 8 if cc_major >= 9 else 4096 * 1024 * 2 + 16 * 1024 * 8


TRACE = '''
import json, torch
def trace():
    snap = torch.cuda.memory._snapshot()
    return [(e["action"], e["size"]) for e in snap["device_traces"][0]
            if e["action"] in ("alloc", "free_completed")]
'''

SNIPPETS = {
    "seed001_linear": TRACE + '''
from torch import nn
torch.cuda.memory._record_memory_history(max_entries=100000)
model = nn.Linear(10000, 50000, device="cuda")
for _ in range(3):
    inputs = torch.randn(5000, 10000, device="cuda")
    outputs = model(inputs)
del inputs, outputs, model
print(json.dumps({"trace": trace(),
                  "peak": torch.cuda.memory_stats()["requested_bytes.all.peak"]}))
''',
    "mlp_adamw": TRACE + '''
dims = [1024, 4096, 4096, 1024, 10]
layers = []
for a, b in zip(dims, dims[1:]):
    layers += [torch.nn.Linear(a, b), torch.nn.ReLU()]
model = torch.nn.Sequential(*layers[:-1]).cuda()
opt = torch.optim.AdamW(model.parameters())
def requested():
    return torch.cuda.memory_stats()["requested_bytes.all.current"]
marks = {"model": requested()}
for step in range(2):
    x = torch.randn(256, dims[0], device="cuda")
    model(x).square().mean().backward()
    del x
    marks[f"backward{step}"] = requested()
    opt.step()
    marks[f"step{step}"] = requested()
    opt.zero_grad(set_to_none=True)
    marks[f"zero_grad{step}"] = requested()
print(json.dumps({"marks": marks}))
''',
    "conv_stack": TRACE + '''
import torch.nn as nn
torch.backends.cudnn.benchmark = False
convs = [nn.Conv2d(3, 64, 7, stride=2, padding=3), nn.Conv2d(64, 128, 3, padding=1),
         nn.Conv2d(128, 128, 3, stride=2, padding=2, dilation=2),
         nn.Conv2d(128, 256, 3, padding=1, groups=4), nn.Conv2d(256, 512, 1, stride=2)]
model = nn.Sequential(*convs).cuda()
x = torch.randn(8, 3, 224, 224, device="cuda")
torch.cuda.memory._record_memory_history(max_entries=100000)
with torch.no_grad():
    y = model(x)
print(json.dumps({"trace": trace(), "out": list(y.shape)}))
''',
    "reduce_staging": TRACE + '''
x = torch.empty(1 << 24, device="cuda")
torch.cuda.memory._record_memory_history(max_entries=100000)
s = x.sum()
p = torch.cuda.get_device_properties(0)
print(json.dumps({"trace": trace(), "sm": p.multi_processor_count,
                  "threads": p.max_threads_per_multi_processor}))
''',
}


def _run(name: str, gpu: str = "H100-SXM-80GB") -> dict:
    rc, out, err = sim.run_snippet(SNIPPETS[name], memory=None, gpu=gpu,
                                   env={"PYTHONWARNINGS": "ignore"}, timeout=600)
    if rc != 0:
        raise SystemExit(f"sim_fidelity: {name} on {gpu} failed (status {rc}):\n{err[-3000:]}")
    return json.loads(out.strip().splitlines()[-1])


def _multiset_diff(expected: List[int], got: List[int]) -> Dict[str, List[int]]:
    left, extra = list(got), []
    missing = []
    for size in expected:
        if size in left:
            left.remove(size)
        else:
            missing.append(size)
    extra = left
    return {"missing": missing, "extra": extra}


def seed001_linear() -> dict:
    w, b = 10000 * 50000 * 4, 50000 * 4
    inp, out = 5000 * 10000 * 4, 5000 * 50000 * 4
    ws = cublas_workspace(9)
    # requested bytes (what the trace and requested_bytes count; the blocks
    # are then rounded by torch's allocator, the same on any device);
    # the article's steps: model, then per iteration a new input and a new
    # output while the previous ones live; assigning `outputs` frees the old
    # output's graph (its saved input) and then the old output
    expected = [("alloc", w), ("alloc", b), ("alloc", inp), ("alloc", out), ("alloc", ws)]
    for _ in range(2):
        expected += [("alloc", inp), ("alloc", out), ("free_completed", inp),
                     ("free_completed", out)]
    expected += [("free_completed", inp), ("free_completed", out), ("free_completed", w),
                 ("free_completed", b)]
    r = _run("seed001_linear")
    got = [tuple(e) for e in r["trace"]]
    peak = w + b + 2 * inp + 2 * out + ws  # the second and third iterations
    return {"expected_bytes": peak, "simulated_bytes": r["peak"],
            "ratio": r["peak"] / peak, "events_expected": len(expected), "events": len(got),
            "same_sequence": got == expected,
            "differences": [] if got == expected else [list(e) for e in got if e not in expected]}


def mlp_adamw() -> dict:
    dims = [1024, 4096, 4096, 1024, 10]
    params = sum(a * b * 4 + b * 4 for a, b in zip(dims, dims[1:]))
    # cuBLAS handles are per thread and each (handle, stream) gets its own
    # workspace: one for the forward GEMMs on the main thread, one for the
    # backward GEMMs on autograd's device thread, both kept
    ws = 2 * cublas_workspace(9)
    expected = {"model": params}
    for step in range(2):
        # gradients add one copy of the parameters; AdamW's first step adds
        # exp_avg and exp_avg_sq (its step counters stay on the host)
        state = 0 if step == 0 else 2 * params
        expected[f"backward{step}"] = 2 * params + ws + state
        expected[f"step{step}"] = 4 * params + ws
        expected[f"zero_grad{step}"] = 3 * params + ws
    got = _run("mlp_adamw")["marks"]
    diffs = {k: got[k] - v for k, v in expected.items() if got[k] != v}
    return {"expected_bytes": sum(expected.values()), "simulated_bytes": sum(got.values()),
            "ratio": sum(got.values()) / sum(expected.values()), "points": len(expected),
            "differences": diffs}


def conv_stack() -> dict:
    n, c, h, w = 8, 3, 224, 224
    layers = [(64, 7, 2, 3, 1), (128, 3, 1, 1, 1), (128, 3, 2, 2, 2), (256, 3, 1, 1, 1),
              (512, 1, 2, 0, 1)]
    outputs = []
    for c_out, k, s, p, d in layers:
        h = (h + 2 * p - d * (k - 1) - 1) // s + 1
        w = (w + 2 * p - d * (k - 1) - 1) // s + 1
        outputs.append(n * c_out * h * w * 4)
    r = _run("conv_stack")
    allocs = [size for action, size in r["trace"] if action == "alloc"]
    diff = _multiset_diff(outputs, allocs)
    workspaces = diff.pop("extra")
    return {"expected_bytes": sum(outputs), "simulated_bytes": sum(outputs) - sum(diff["missing"]),
            "ratio": (sum(outputs) - sum(diff["missing"])) / sum(outputs),
            "output_shape_ok": r["out"] == [n, 512, h, w], "differences": diff["missing"],
            "cudnn_workspaces": workspaces}


def reduce_staging() -> dict:
    rows, exp_total, got_total = {}, 0, 0
    for key, model in sim_gpus.MODELS.items():
        blocks = model["sm"] * model["threads_per_sm"] // 512
        # the 4-byte result, the staging slots, one 4-byte semaphore per output
        expected = [4, 4 * blocks, 4]
        r = _run("reduce_staging", gpu=key)
        got = [size for action, size in r["trace"] if action == "alloc"]
        rows[key] = {"expected": expected, "simulated": got}
        exp_total += sum(expected)
        got_total += sum(got)
    diffs = {k: v for k, v in rows.items() if v["simulated"] != v["expected"]}
    return {"expected_bytes": exp_total, "simulated_bytes": got_total,
            "ratio": got_total / exp_total, "per_model": rows, "differences": diffs}


WORKLOADS: Dict[str, Callable[[], dict]] = {
    "seed001_linear": seed001_linear, "mlp_adamw": mlp_adamw, "conv_stack": conv_stack,
    "reduce_staging": reduce_staging,
}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print only the JSON result")
    ap.add_argument("--only", choices=sorted(WORKLOADS), action="append")
    args = ap.parse_args(argv)
    results = {name: fn() for name, fn in WORKLOADS.items() if not args.only or name in args.only}
    if not args.json:
        for name, r in results.items():
            exact = "exact" if not r["differences"] else f"differs: {r['differences']}"
            print(f"{name:16s} expected {r['expected_bytes']:>14,} simulated "
                  f"{r['simulated_bytes']:>14,} ratio {r['ratio']:.4f}  {exact}", file=sys.stderr)
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
