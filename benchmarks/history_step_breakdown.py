"""Where the sampled mode's cost goes in a training step, part by part.

    python benchmarks/history_step_breakdown.py [--json] [--blocks 200] [--modes ...]

The training step of benchmarks/history_overhead.py (a Transformer, 2
layers, d_model 64, + AdamW; about 166 allocations a step, all under 1 MiB)
under gpumem.sim with gpumem installed, timed with recording off and in
each mode below; each mode in --blocks pairs of 2-step blocks against
recording off (ABBA order, each block after one untimed step in its mode,
CPU time of the process: all its threads), and the figure is the median of
the pairs' differences per allocation of the step, in microseconds:

    cb        recording off, only the record_function annotation callback on
              (thread-local, USER_SCOPE: what recording registers; Note
              [Annotations] in csrc/torch/gm_torch_record_function.cpp)
    ev        context=None: every event, no stack
    dec       the sampled mode with a mean interval and threshold of 2**61
              bytes: every event and the sampling decision of every
              allocation, no stack captured
    smp       the sampled mode (sample=True): as dec, plus the stacks of
              the allocations it samples
    MODE-nocb the same with the annotation callback removed after the
              recording starts (an experiment: the snapshot then lacks
              external_annotations)

So dec - ev is the sampler's decision, smp - dec the sampled stacks, and
MODE - MODE-nocb the annotation callback. The step's figures move by about
+-0.15 us per allocation between runs on a loaded 2-core machine: run it
several times and compare within one run.
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

MODES = ("cb", "ev", "ev-nocb", "dec", "dec-nocb", "smp", "smp-nocb")

SNIPPET = r'''
import json, statistics, sys, time
import torch, gpumem
gpumem.install()
from gpumem.recording import history
tests_dir, blocks, modes = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(",")
sys.path.insert(0, tests_dir)
from torch_helpers import TRANSFORMER   # make_model(), train_step()
exec(TRANSFORMER)
mem = torch.cuda.memory
model, opt = make_model()
x = torch.randn(8, 16, 64, device="cuda")

def train(n):
    return timed_steps(model, opt, x, n)   # TRANSFORMER's, as history_overhead's

NEVER = {"mean_bytes": 1 << 61, "threshold_bytes": 1 << 61}
mem._record_memory_history("all", context="all", stacks="python")   # builds the module
rf = history._record_function(True)

def set_mode(m):
    mem._record_memory_history(None)
    if m == "off":
        return
    if m == "cb":
        rf.set_annotations(True, False)
        return
    base, _, variant = m.partition("-")
    sample = {"smp": True, "dec": NEVER}.get(base)
    mem._record_memory_history("all", context=None if base == "ev" else "all",
                               stacks="python", sample=sample)
    if variant == "nocb":
        rf.set_annotations(False, False)

set_mode("off")
train(3)
n0 = torch.cuda.memory_stats()["allocation.all.allocated"]
train(1)
allocs = torch.cuda.memory_stats()["allocation.all.allocated"] - n0
diffs = {m: [] for m in modes}
for r in range(blocks + 1):
    for m in modes:
        t = {}
        for c in (("off", m) if r % 2 else (m, "off")):
            set_mode(c)
            train(1)
            t[c] = train(2)
        if r:                     # round 0 warms up
            diffs[m].append(t[m] - t["off"])
set_mode("off")
print(json.dumps({"allocs_per_step": allocs, "blocks": blocks,
                  "us_per_alloc": {m: statistics.median(v) / allocs for m, v in diffs.items()}}))
'''


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--blocks", type=int, default=200, help="pairs of 2-step blocks per mode")
    ap.add_argument("--modes", default=",".join(MODES),
                    help=f"comma-separated, of {', '.join(MODES)}")
    args = ap.parse_args(argv)
    modes = args.modes.split(",")
    bad = [m for m in modes if m not in MODES]
    if bad or args.blocks < 1:
        print(f"history_step_breakdown: unknown mode {bad[0]!r} (choose from {', '.join(MODES)})"
              if bad else "history_step_breakdown: --blocks must be at least 1", file=sys.stderr)
        return 2
    from gpumem.pytorch import shim_build
    shim_build.build()
    rc, out, err = sim.run_snippet(textwrap.dedent(SNIPPET),
                                   args=[str(ROOT / "tests"), str(args.blocks), ",".join(modes)],
                                   timeout=3600)
    if rc != 0:
        print(f"history_step_breakdown: the run failed (exit {rc}):\n{err[-4000:]}",
              file=sys.stderr)
        return 1
    result = json.loads(out.strip().splitlines()[-1])
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    print(f"{result['allocs_per_step']} allocations a step, {result['blocks']} block pairs a mode")
    for m, v in result["us_per_alloc"].items():
        print(f"{m:<10}{v:>8.3f} us per allocation over recording off")
    return 0


if __name__ == "__main__":
    sys.exit(main())
