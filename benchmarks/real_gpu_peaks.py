"""Workloads on a real GPU under torch's allocator and gpumem, and the same
workloads on the simulated GPU: does the simulator say what the GPU says?

    python benchmarks/real_gpu_peaks.py --out real.json            # on a machine with a GPU
    python benchmarks/real_gpu_peaks.py --simulate --gpu H200-141GB \
        --compare real.json --out sim.json                         # anywhere: the simulator

Each workload runs in its own process per allocator ("torch": torch's own
caching allocator; "gpumem": gpumem.install() first). Each prints one JSON
line: peak allocated and reserved bytes, reserved at the end, the
allocator's retry/OOM counters, the device's total memory and the free
memory cuMemGetInfo reports after CUDA initialised, and (on a GPU) the
median step time of the timed steps.

Workloads:
  transformer_step   the 2-layer Transformer AdamW step of tests/test_train_step_peaks.py
  gpt_bf16           a 12-layer GPT-style decoder (d_model 1024, batch 8 x 1024 tokens),
                     bf16 autocast, AdamW: 2 warm-up steps, 6 timed
  gpt_bf16_expandable   the same with expandable_segments:True
  graph_expandable   a training step captured as one CUDA graph (torch.cuda.graph,
                     capturable AdamW) under expandable_segments:True, replayed 5 times
  history            gpt_bf16 with memory history recorded (torch's
                     _record_memory_history, routed to gpumem under gpumem): step time,
                     snapshot dump time and size
  oom                1 GiB tensors until out of memory: how many fit, reserved at the
                     OOM, the message's first line; under gpumem with GPUMEM_OOM_SNAPSHOT set

--simulate runs each under ``python -m gpumem.sim`` (--gpu, --no-host-memory)
with the context memory the real GPU showed (from --compare: total minus
free after initialisation), and with --compare prints, per workload and
allocator, simulated / real for every memory figure. Step times are only
meaningful on a GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PRELUDE = '''
import json, os, statistics, sys, time
import torch
MODE = sys.argv[1]
if MODE == "gpumem":
    import gpumem
    gpumem.install()
torch.cuda.init()
_free, _total = torch.cuda.mem_get_info()
OUT = {"mode": MODE, "torch": torch.__version__, "device": torch.cuda.get_device_name(),
       "total_memory": _total, "free_after_init": _free}

def stats_out():
    s = torch.cuda.memory_stats()
    OUT.update(peak_allocated=s.get("allocated_bytes.all.peak", 0),
               peak_reserved=s.get("reserved_bytes.all.peak", 0),
               reserved_end=s.get("reserved_bytes.all.current", 0),
               num_alloc_retries=s.get("num_alloc_retries", 0), num_ooms=s.get("num_ooms", 0))

def finish():
    stats_out()
    print("RESULT " + json.dumps(OUT), flush=True)
'''

GPT = '''
torch.manual_seed(0)
D, L, V, B, T = 1024, 12, 32000, 8, 1024
class GPT(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(V, D)
        layer = torch.nn.TransformerEncoderLayer(D, 16, 4 * D, dropout=0.0, batch_first=True,
                                                 norm_first=True)
        self.blocks = torch.nn.TransformerEncoder(layer, L, enable_nested_tensor=False)
        self.head = torch.nn.Linear(D, V, bias=False)
    def forward(self, x):
        mask = torch.nn.Transformer.generate_square_subsequent_mask(x.shape[1], device=x.device)
        return self.head(self.blocks(self.emb(x), mask=mask, is_causal=True))
model = GPT().cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
x = torch.randint(0, V, (B, T), device="cuda")
def step():
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1).float(), x.flatten())
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
def timed(warm, n):
    for _ in range(warm):
        step()
    torch.cuda.synchronize()
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    OUT["step_ms"] = round(statistics.median(times), 3)
'''

WORKLOADS = {
    "transformer_step": ({}, '''
torch.manual_seed(0)
layer = torch.nn.TransformerEncoderLayer(d_model=256, nhead=4, dim_feedforward=1024, batch_first=True)
model = torch.nn.Sequential(torch.nn.Embedding(1000, 256), torch.nn.TransformerEncoder(layer, 2),
                            torch.nn.Linear(256, 1000)).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
x = torch.randint(0, 1000, (8, 128), device="cuda")
for _ in range(2):
    loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), x.flatten())
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
torch.cuda.synchronize()
finish()
'''),
    "gpt_bf16": ({}, GPT + '''
timed(2, 6)
finish()
'''),
    "gpt_bf16_expandable": ({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}, GPT + '''
timed(2, 6)
finish()
'''),
    "graph_expandable": ({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}, '''
torch.manual_seed(0)
D = 1024
model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(D, 4 * D), torch.nn.GELU(),
                                                  torch.nn.Linear(4 * D, D)) for _ in range(8)]).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, capturable=True)
x = torch.randn(64, 512, D, device="cuda")
def step():
    loss = model(x).float().pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=False)
s = torch.cuda.Stream()
s.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(s):
    for _ in range(3):
        step()
torch.cuda.current_stream().wait_stream(s)
g = torch.cuda.CUDAGraph()
with torch.cuda.graph(g):
    step()
times = []
for _ in range(5):
    t0 = time.perf_counter()
    g.replay()
    torch.cuda.synchronize()
    times.append((time.perf_counter() - t0) * 1e3)
OUT["step_ms"] = round(statistics.median(times), 3)
finish()
'''),
    "history": ({}, GPT + '''
torch.cuda.memory._record_memory_history(max_entries=1000000)
timed(2, 6)
import tempfile
path = os.path.join(tempfile.mkdtemp(), "snap.pickle")
t0 = time.perf_counter()
torch.cuda.memory._dump_snapshot(path)
OUT["dump_s"] = round(time.perf_counter() - t0, 4)
OUT["snapshot_bytes"] = os.path.getsize(path)
torch.cuda.memory._record_memory_history(None)
finish()
'''),
    "oom": ({}, '''
import tempfile
held = []
msg = ""
try:
    while True:
        held.append(torch.empty(1 << 30, dtype=torch.uint8, device="cuda"))
except torch.OutOfMemoryError as e:
    msg = str(e).splitlines()[0][:300]
OUT["gib_tensors_held"] = len(held)
OUT["oom_message"] = msg
stats_out()
OUT["reserved_at_oom"] = torch.cuda.memory_reserved()
d = os.environ.get("GPUMEM_OOM_SNAPSHOT")
OUT["oom_snapshots"] = sorted(os.listdir(d)) if d and os.path.isdir(d) else []
del held
torch.cuda.empty_cache()
finish()
'''),
}

MEMORY_FIGURES = ("peak_allocated", "peak_reserved", "reserved_end", "num_alloc_retries",
                  "num_ooms", "gib_tensors_held", "reserved_at_oom")


def run_one(name: str, mode: str, *, simulate: bool, gpu: str, context: int | None,
            timeout: int) -> dict:
    extra, body = WORKLOADS[name]
    env = dict(os.environ)
    for k in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "GPUMEM_ALLOC_CONF"):
        env.pop(k, None)
    env.update(extra)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in [env.get("PYTHONPATH")] if p])
    if name == "oom" and mode == "gpumem":
        import tempfile
        env["GPUMEM_OOM_SNAPSHOT"] = tempfile.mkdtemp(prefix="gpumem_oom_")
    code = textwrap.dedent(PRELUDE) + textwrap.dedent(body)
    argv = [sys.executable, "-c", code, mode]
    if simulate:
        from gpumem import sim
        if context is not None:
            env["GPUMEM_SIM_CONTEXT_MEMORY"] = str(context)
        env = sim.sim_env(gpu=gpu, no_host_memory=True, base=env)
    try:
        proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"mode": mode, "error": f"timed out after {timeout} s"}
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    return {"mode": mode, "error": f"exit {proc.returncode}: " + (proc.stderr or proc.stdout)[-1500:]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="write the results as JSON here")
    ap.add_argument("--only", help="comma-separated workloads (default: all)")
    ap.add_argument("--simulate", action="store_true", help="run on the simulated GPU")
    ap.add_argument("--gpu", default="H200-141GB", help="the simulated GPU model")
    ap.add_argument("--compare", help="a real GPU's results (--out of a run on it)")
    ap.add_argument("--timeout", type=int, default=300)
    args = ap.parse_args()
    names = args.only.split(",") if args.only else list(WORKLOADS)
    real = json.loads(Path(args.compare).read_text()) if args.compare else {}
    results = {}
    for name in names:
        results[name] = {}
        for mode in ("torch", "gpumem"):
            ref = real.get(name, {}).get(mode, {})
            context = (ref["total_memory"] - ref["free_after_init"]) if "free_after_init" in ref else None
            r = run_one(name, mode, simulate=args.simulate, gpu=args.gpu, context=context,
                        timeout=args.timeout)
            results[name][mode] = r
            print(json.dumps({"workload": name, **r}), flush=True)
    if real:
        cmp = {}
        for name in names:
            for mode in ("torch", "gpumem"):
                a, b = results[name].get(mode, {}), real.get(name, {}).get(mode, {})
                cmp[f"{name}/{mode}"] = {k: [a.get(k), b.get(k)] for k in MEMORY_FIGURES
                                         if k in a or k in b}
        print(json.dumps({"simulated_vs_real": cmp}, indent=1))
        results["simulated_vs_real"] = cmp
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
