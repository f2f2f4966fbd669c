"""Memory-history recording cost by context and stacks, per allocation and
on a GPT training step, torch's recorder and gpumem's side by side, on the
simulated GPU (kernels do nothing, so a step's time is its CPU time).

    python benchmarks/history_stacks.py [--base DIR] [--repeats 5] [--json]

Runs under the interpreter that runs it (run it once per Python version).
Each process is one allocator: "torch" (torch's caching allocator and its
recorder), "gpumem" (this tree, gpumem.install()) and, with --base DIR,
"base" (gpumem from another source tree with its extension built in place
for this Python, e.g. the main branch before a change).

pairs: us per torch.empty + del pair (sizes 512 B ... 16 MiB, cached) at the
    bottom of a 30-frame Python recursion, timed in the thread's CPU time;
    overhead = recording on minus off, for context all/alloc/state and
    stacks python/all. Configurations alternate within a process; the
    median of --repeats rounds (after one warm-up round).
step: benchmarks/real_gpu_peaks.py's gpt_bf16 step (12 layers, d_model
    1024, batch 8 x 1024, bf16 autocast, AdamW), CPU time of the process
    per step (all its threads: autograd's included) with recording off and
    with torch.cuda.memory._record_memory_history(max_entries=1000000) in
    each configuration; alternating blocks of 2 steps, median of --repeats;
    us_per_alloc = (on - off) / allocations of a step.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gpumem import sim  # noqa: E402

COMMON = r'''
import json, statistics, sys, time
import torch
which, repeats, what = sys.argv[1], int(sys.argv[2]), sys.argv[3]
if which != "torch":
    import gpumem
    gpumem.install()
mem = torch.cuda.memory
def setrec(cfg):
    mem._record_memory_history(None)
    if cfg != "off":
        c, s = cfg.split("/")
        mem._record_memory_history("all", context=c, stacks=s, max_entries=1000000)
'''

PAIRS = r'''
CONFIGS = ["off", "all/python", "all/all", "alloc/python", "alloc/all", "state/python"]
SIZES = [512, 4 << 10, 64 << 10, 1 << 20, 3 << 20, 16 << 20]
seq = [SIZES[i % len(SIZES)] for i in range(5000)]
def at_depth(n, fn):
    return fn() if n <= 0 else at_depth(n - 1, fn)
def pairs():
    t0 = time.thread_time()
    for n in seq:
        t = torch.empty(n, dtype=torch.uint8, device="cuda")
        del t
    return (time.thread_time() - t0) / len(seq) * 1e6
for n in SIZES:
    t = torch.empty(n, dtype=torch.uint8, device="cuda"); del t
runs = {c: [] for c in CONFIGS}
for r in range(repeats + 1):
    for c in CONFIGS:
        setrec(c)
        v = at_depth(30, pairs)
        if r:
            runs[c].append(v)
setrec("off")
med = {c: statistics.median(v) for c, v in runs.items()}
out = {"pair_us": {c: round(v, 3) for c, v in med.items()},
       "overhead_us": {c: round(med[c] - med["off"], 3) for c in CONFIGS if c != "off"}}
'''

# The gpt_bf16 workload of real_gpu_peaks.py: GPT, model, opt, x and step().
_spec = importlib.util.spec_from_file_location("real_gpu_peaks", ROOT / "benchmarks" /
                                               "real_gpu_peaks.py")
_peaks = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_peaks)

STEP = _peaks.GPT + r'''
CONFIGS = ["off", "all/all", "all/python", "alloc/python"]
for _ in range(2):
    step()
torch.cuda.synchronize()
n0 = torch.cuda.memory_stats()["allocation.all.allocated"]
step(); torch.cuda.synchronize()
nalloc = torch.cuda.memory_stats()["allocation.all.allocated"] - n0
runs = {c: [] for c in CONFIGS}
for r in range(repeats):
    for c in CONFIGS:
        setrec(c)
        step(); torch.cuda.synchronize()
        t0 = time.process_time()
        for _ in range(2):
            step()
        torch.cuda.synchronize()
        runs[c].append((time.process_time() - t0) * 1e3 / 2)
setrec("off")
med = {c: statistics.median(v) for c, v in runs.items()}
out = {"allocs_per_step": nalloc, "step_cpu_ms": {c: round(v, 2) for c, v in med.items()},
       "us_per_alloc": {c: round((med[c] - med["off"]) * 1e3 / nalloc, 2)
                        for c in CONFIGS if c != "off"}}
'''

TAIL = r'''
print("RESULT " + json.dumps(out), flush=True)
'''


def run(which: str, what: str, repeats: int, tree: Path) -> dict:
    code = COMMON + (PAIRS if what == "pairs" else STEP) + TAIL
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(tree)] + [p for p in [env.get("PYTHONPATH")] if p])
    env = sim.sim_env(gpu="H200-141GB", no_host_memory=True, base=env)
    p = subprocess.run([sys.executable, "-c", code, which, str(repeats), what], env=env,
                       cwd=str(tree), capture_output=True, text=True, timeout=1200)
    for line in reversed(p.stdout.splitlines()):
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    return {"error": (p.stderr or p.stdout)[-800:]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", help="another gpumem source tree, built in place, to compare")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--only", choices=("pairs", "step"), help="one of the two measurements")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args()
    trees = {"torch": ROOT, "gpumem": ROOT}
    if args.base:
        trees["base"] = Path(args.base).resolve()
    out = {"python": sys.version.split()[0]}
    for what in ("pairs", "step"):
        if args.only and what != args.only:
            continue
        out[what] = {}
        for which, tree in trees.items():
            out[what][which] = r = run(which, what, args.repeats, tree)
            if not args.json:
                print(what, which, json.dumps(r), flush=True)
    if args.json:
        print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
