"""gpumem's memory categories against torch's Memory Profiler, on the same run.

    python benchmarks/categories_vs_torch.py [--json] [--steps 3] [--model transformer|resnet50]

One process on the simulated GPU (gpumem.sim), gpumem installed: a training
loop (a Transformer encoder + AdamW, or torchvision's ResNet50 + AdamW, its
convolutions and batch norm through the simulator's cuDNN) runs under torch.profiler.profile(profile_memory=True,
record_shapes=True, with_stack=True) while gpumem records with
categories=True.  Both see the same allocations: gpumem's allocator reports
each block to the profiler (c10::reportMemoryUsageToProfiler, with the
block's rounded size), and its own history records the same events.

Printed, per category: torch's figure and gpumem's, each at its own peak
(torch: the most bytes live across its memory timeline, from
prof._memory_profile().timeline and its categories; gpumem: the most
bytes live across its trace).  Sizes: torch's timeline counts each tensor's
storage bytes (its size map), gpumem the requested size of each allocation;
they are the same bytes (the rounded block size the allocator reports to the
profiler is not what its timeline uses).
Also the bytes on which the two agree at their peaks (sum over categories of
the smaller figure) over the larger peak ("agreement"), the same without
'unknown' over torch's peak ("agreement_known": memory torch never sees as a
tensor, such as cuBLAS's workspaces, is in gpumem's peak only), and the
peaks themselves.

torch's categories: PARAMETER, OPTIMIZER_STATE, INPUT, TEMPORARY, ACTIVATION,
GRADIENT, AUTOGRAD_DETAIL, and None (unknown); gpumem's names map one to one,
and gpumem's workspace (cuBLAS's, found with C++ stacks) is not in torch's
timeline at all.
"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gpumem import sim  # noqa: E402

SNIPPET = r'''
import json, sys
import torch, gpumem
gpumem.install()
from gpumem.categories import report as cr
from gpumem.recording import history
from gpumem.snapshots.timeline import build_device
model_name, steps, tests_dir = sys.argv[1], int(sys.argv[2]), sys.argv[3]

if model_name == "resnet50":
    import torchvision
    model = torchvision.models.resnet50().cuda()
    x = torch.randn(8, 3, 224, 224, device="cuda")
    def loss_of(out): return out.float().pow(2).mean()
else:
    sys.path.insert(0, tests_dir)
    from torch_helpers import TRANSFORMER   # make_model(): AdamW on a small encoder
    exec(TRANSFORMER)
    model, _opt = make_model(d_model=256, layers=4)
    x = torch.randn(32, 128, 256, device="cuda")
    def loss_of(out): return out.float().pow(2).mean()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

def step():
    loss_of(model(x)).backward()
    opt.step()
    opt.zero_grad(set_to_none=True)

step()   # warm-up: optimizer state and cuBLAS workspaces exist before either recorder
torch.cuda.synchronize()
history.record_memory_history("all", max_entries=10_000_000, categories=True,
                              clear_history=True)
from torch.profiler import profile, ProfilerActivity
with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True,
             with_stack=True) as prof:
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
snap = history.snapshot()
history.record_memory_history(None)

# torch: walk its timeline in order (as its own _coalesce_timeline does), bytes
# per category, at the most bytes live; "no tensor id": allocations the
# profiler could not tie to a tensor (their key is not a TensorKey), which it
# leaves uncategorised
from torch.profiler._memory_profiler import Action, TensorKey
mp = prof._memory_profile()
dev = torch.device("cuda", 0)
cur = {}
best, best_at = -1, {}
def name_of(key, version):
    if not isinstance(key, TensorKey):
        return "no tensor id"
    c = mp._categories.get(key, version)
    return "unknown" if c is None else c.name.lower()
def add(n, nbytes):
    cur[n] = cur.get(n, 0) + nbytes
for t, action, (key, version), nbytes in mp.timeline:
    if key.device != dev:
        continue
    if action in (Action.PREEXISTING, Action.CREATE):
        add(name_of(key, version), nbytes)
    elif action == Action.INCREMENT_VERSION:
        add(name_of(key, version), -nbytes)
        add(name_of(key, version + 1), nbytes)
    elif action == Action.DESTROY:
        add(name_of(key, version), -nbytes)
    total = sum(cur.values())
    if total > best:
        best, best_at = total, dict(cur)
torch_cats = best_at

# gpumem: its trace (requested sizes)
m = build_device(snap, 0)
cats = cr.allocation_categories(snap, m)
n = m.n_events
curves = cr.category_curves(m, cats, list(range(n)))
totals = [sum(curves[c][i] for c in curves) for i in range(n)]
peak_i = max(range(n), key=totals.__getitem__)
gm_cats = {c: curves[c][peak_i] for c in curves}
param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
no_id = torch_cats.pop("no tensor id", 0)
torch_cats["unknown"] = torch_cats.get("unknown", 0) + no_id
print(json.dumps({"torch_no_tensor_id_at_peak": no_id, "torch": torch_cats, "gpumem": gm_cats, "torch_peak": best,
                  "gpumem_peak": totals[peak_i], "param_bytes": param_bytes,
                  "gpumem_phase_at_peak": cr.PHASES[snap["gpumem_categories"]["trace_phases"][0][peak_i]] if n else None}))
'''

NAMES = ("parameter", "optimizer_state", "gradient", "activation", "input", "temporary",
         "autograd_detail", "unknown", "workspace")   # torch has no workspace: always 0 there


def run(model: str, steps: int) -> dict:
    rc, out, err = sim.run_snippet(textwrap.dedent(SNIPPET),
                                   args=[model, str(steps), str(ROOT / "tests")], timeout=1800)
    if rc != 0:
        raise SystemExit(f"the run failed (exit {rc}):\n{err[-4000:]}")
    r = json.loads(out.strip().splitlines()[-1])
    t, g = r["torch"], r["gpumem"]
    rows = {c: {"torch": t.get(c, 0), "gpumem": g.get(c, 0)} for c in NAMES}
    agree = sum(min(v["torch"], v["gpumem"]) for v in rows.values())
    return {"model": model, "steps": steps, "device": "simulated GPU (gpumem.sim)",
            "param_bytes": r["param_bytes"], "torch_peak": r["torch_peak"],
            "gpumem_peak": r["gpumem_peak"], "by_category": rows,
            "agreement": agree / max(r["torch_peak"], r["gpumem_peak"], 1),
            "gpumem_phase_at_peak": r["gpumem_phase_at_peak"],
            "torch_unknown_without_tensor_id": r["torch_no_tensor_id_at_peak"],
            "agreement_known": sum(min(v["torch"], v["gpumem"]) for c, v in rows.items()
                                   if c != "unknown") / max(r["torch_peak"], 1)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--steps", type=int, default=3, help="profiled training steps")
    ap.add_argument("--model", choices=("transformer", "resnet50"), default="transformer")
    args = ap.parse_args(argv)
    from gpumem.pytorch import shim_build as _shim_build
    _shim_build.build()
    r = run(args.model, args.steps)
    if args.json:
        print(json.dumps(r, indent=1))
        return 0
    print(f"{r['model']}: peaks torch {r['torch_peak']:,} B, gpumem {r['gpumem_peak']:,} B; "
          f"agreement {100 * r['agreement']:.1f}%")
    for c, v in r["by_category"].items():
        print(f"  {c:<16} {v['torch']:>14,} {v['gpumem']:>14,}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
