"""Memory history costs, torch's native recorder and gpumem's side by side.

    python benchmarks/history_overhead.py [--json] [--processes 1] [--repeats 7]
                                          [--depth 30] [--iters 20000] [--events 100000]

Every configuration runs in its own process under gpumem.sim (torch's
CUDA build over the fake CUDA libraries): "torch" is torch's caching
allocator with torch.cuda.memory._record_memory_history(context='all',
stacks='python'); "gpumem" is the same script after gpumem.install(), where
that same call (patched by gpumem) turns on gpumem's recorder.

record_overhead_us_per_alloc: the extra time of one allocation (a
    torch.empty + del pair, sizes cycling through 512 B ... 16 MiB, all
    cached) with recording on over the same pair with recording off. The
    loop runs at the bottom of a --depth deep Python recursion, so every
    captured stack has depth + 3 frames (33); with context='all' both the
    allocation and the free capture one. In each of --repeats rounds
    (after one warm-up round) every mode runs in 4 parts, each next to an
    equal part with recording off (ABBA order), and the round's overhead
    is the median of the 4 differences; the figure is the median over the
    rounds, so a process that runs slow throughout is slow on both sides
    of each difference. off_us / on_us: medians of the rounds' means.
    Breakdown, measured in the same rounds: overhead_events_only_us
    (context=None: the three trace entries of a pair, no stack) and
    overhead_alloc_stack_us (context='state': plus the allocation's stack).
capture_us_at_depth / capture_ns_per_frame: one stack capture on its own,
    called from Python with the GIL held at the bottom of 0 and --depth
    frames: torch's gather_traceback (what its recorder calls per event)
    or gpumem's _C._hist_capture, minus the same call returning at once.
    gpumem's process also times the floor under its capture:
    api_walk_us_at_depth (hist_walk_only, in the test-only extension
    tests/ext: the public frame-API calls of a walk and nothing else),
    gil_round_trip_us (PyGILState_Ensure + Release, paid per capture
    because torch releases the GIL around both the allocation and the
    free) and floor_us_per_alloc = 2 x (walk + GIL round trip).
categories (gpumem's process only): categories_overhead_us_per_alloc, the
    same pairs with record_memory_history(..., categories=True) over
    context='all' without (nothing is added to the allocation path, so this
    is noise around 0); train_step_*: a Transformer (2 layers, d_model 64)
    + AdamW step, recording with and without categories, where the hooks
    run (a few per step: forward start, backward entry and exit, optimizer
    step), and that difference per allocation of the step
    (categories_us_per_alloc_in_training); steps are timed in CPU time of
    the process in blocks of 2 steps (each after one untimed step), each
    mode in --train-blocks (150) pairs of blocks against the mode it is
    compared with (off for 'all' and sampled, 'all' for categories), the
    two in ABBA order, and the added time per step is the median of the
    pairs' differences.
sampled (gpumem's sampled mode, sample=True: stacks for every allocation
    of 1 MiB or more, sampled by bytes below, mean interval 2 MiB):
    overhead_us_per_alloc on the pairs above (half of their sizes are at
    or above the threshold, so half are captured), its ratio to torch's
    record_overhead_us_per_alloc (target <= 0.10) and to gpumem's full
    mode; train_us_per_alloc: the Transformer step's time with recording
    over the step with recording off (the median difference of paired
    blocks, as for categories), per allocation of the step, in both
    processes (torch and gpumem context='all', gpumem sampled).
snapshot_dump_s / snapshot_bytes: torch.cuda.memory._dump_snapshot() of a
    history holding --events trace entries (max_entries=--events, filled
    past the bound by a workload with several call sites at the same depth
    and a sliding window of live tensors), and the size of the file. The
    time is the median of --repeats dumps of the same history;
    first_dump_s is the first of them (torch symbolizes its frames then).

With --clock thread the pairs are timed in the thread's CPU time instead
of wall-clock time (on a machine other processes load). With --processes N
each configuration runs N times (alternately) and the
figures are medians over processes. Targets (issue 6): gpumem's overhead
<= 0.33 x torch's, dump time <= 0.5 x torch's, file size <= torch's.
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

SNIPPET = r'''
import functools, json, os, pickle, statistics, sys, tempfile, time
import torch
which, depth, iters, events, repeats = sys.argv[1], *map(int, sys.argv[2:6])
tests_dir = sys.argv[6]  # tests/: testext, the test-only extension (built by main())
# --clock thread: the pairs are timed in this thread's CPU time, which
# preemption by other processes on a shared machine does not inflate
pair_clock = time.thread_time if sys.argv[7] == "thread" else time.perf_counter
if which == "gpumem":
    import gpumem
    gpumem.install()
mem = torch.cuda.memory
if which == "gpumem":
    assert mem._record_memory_history is gpumem._record_memory_history

def at_depth(n, fn):
    """fn() called n Python frames below this one."""
    return fn() if n <= 0 else at_depth(n - 1, fn)

SIZES = [512, 4 << 10, 64 << 10, 1 << 20, 3 << 20, 16 << 20]
seq = [SIZES[i % len(SIZES)] for i in range(iters)]

def pairs(part=seq):
    t0 = pair_clock()
    for n in part:
        t = torch.empty(n, dtype=torch.uint8, device="cuda")
        del t
    return (pair_clock() - t0) / len(part) * 1e6

def record(context, max_entries=events):
    """context: False (recording off), or torch's context= value; "categories":
    context='all' with gpumem's categories on; "sampled": context='all' in
    gpumem's sampled mode (sample=True: its defaults)."""
    mem._record_memory_history(None)
    if context == "sampled":
        mem._record_memory_history("all", context="all", stacks="python",
                                   max_entries=max_entries, sample=True)
    elif context == "categories":
        gpumem.recording.history.record_memory_history("all", "all", "python", max_entries,
                                             categories=True)
    elif context is not False:
        mem._record_memory_history("all", context=context, stacks="python",
                                   max_entries=max_entries)

for n in SIZES:                        # every size cached once
    t = torch.empty(n, dtype=torch.uint8, device="cuda")
    del t
torch.cuda.synchronize()
# None records the events only; 'state' adds the allocation's stack; 'all'
# (the figure) also captures the stack of every free. Each mode is timed
# against recording off next to it: in every round, each mode's pairs
# run in CHUNKS parts, each right after (or, every other part, right
# before) an equal part with recording off, and the round's overhead is
# the median of the parts' differences. A process that runs slow (a busy
# sibling core, the other process's cache) is slow in both halves of a
# difference; the figure is the median over rounds (round 0 warms up).
MODES = {"off": False, "events_only": None, "alloc_stack": "state", "all": "all"}
if which == "gpumem":
    MODES["categories"] = "categories"
    MODES["sampled"] = "sampled"
CHUNKS = 4
parts = [seq[i * iters // CHUNKS:(i + 1) * iters // CHUNKS] for i in range(CHUNKS)]
runs = {m: [] for m in MODES}      # us per pair, one per round
diffs = {m: [] for m in MODES}     # overhead over off, one per round
for r in range(repeats + 1):
    for m, context in MODES.items():
        if m == "off":
            continue
        t_off, t_on = [], []
        for k, part in enumerate(parts):
            for c in ((False, context) if k % 2 == 0 else (context, False)):
                record(c)
                (t_on if c is context else t_off).append(at_depth(depth, functools.partial(pairs, part)))
        if r:
            runs["off"].append(statistics.mean(t_off))
            runs[m].append(statistics.mean(t_on))
            diffs[m].append(statistics.median(b - a for a, b in zip(t_off, t_on)))
record(False)
off, on = runs["off"], runs["all"]
overhead = {m: statistics.median(v) for m, v in diffs.items() if v}
breakdown = {m: overhead[m]
             for m in ("events_only", "alloc_stack") + (("sampled",) if which == "gpumem" else ())}

# --- a small Transformer (2 layers, d_model 64) + AdamW training step, in
# both processes: recording off, context='all', and in gpumem's process
# also with categories and in the sampled mode; the per-allocation cost of
# each mode in training is its step time over off's, per allocation of the
# step. The categories figures compare categories with 'all' (where the
# hooks run: a few per step).
sys.path.insert(0, tests_dir)
from torch_helpers import TRANSFORMER   # make_model(): 2 layers, d_model 64, AdamW
exec(TRANSFORMER)
model, opt = make_model()
x = torch.randn(8, 16, 64, device="cuda")
def train(n):
    return timed_steps(model, opt, x, n)   # TRANSFORMER's, CPU time per step
# A step costs milliseconds and a mode adds tenths of a microsecond per
# allocation (a few hundredths of the step), so each mode is timed in
# TRAIN_BLOCKS pairs of short blocks (TRAIN_STEPS steps) against the mode
# it is compared with, the two alternating in ABBA order; the figure is
# the median of the pairs' differences (and each mode's step time the
# median of its blocks). Each block follows one untimed step in its mode:
# starting to record allocates the ring's first chunk, which an always-on
# recorder does once.
TRAIN_BLOCKS, TRAIN_STEPS = int(sys.argv[8]), 2
COMPARED = [("off", "all")]
if which == "gpumem":
    COMPARED += [("off", "sampled"), ("all", "categories")]
step_runs = {m: [] for pair in COMPARED for m in pair}
step_diffs = {pair: [] for pair in COMPARED}
record("all")
train(3)
n0 = torch.cuda.memory_stats()["allocation.all.allocated"]
train(1)
allocs_per_step = torch.cuda.memory_stats()["allocation.all.allocated"] - n0
for r in range(TRAIN_BLOCKS + 1):
    for base, m in COMPARED:
        t = {}
        for c in ((base, m) if r % 2 else (m, base)):
            record(False if c == "off" else c)
            train(1)                   # untimed: the ring's first chunk, the sampler's seed
            t[c] = train(TRAIN_STEPS)
        if r:                          # round 0 warms up
            step_runs[base].append(t[base])
            step_runs[m].append(t[m])
            step_diffs[(base, m)].append(t[m] - t[base])
record(False)
# The model, its optimizer state and its cached blocks go before the
# dump below, so both processes dump the same history and segments.
del model, opt, x
torch.cuda.empty_cache()
med = {m: statistics.median(v) for m, v in step_runs.items()}
added = {m: statistics.median(v) for (_, m), v in step_diffs.items()}
training = {"train_allocs_per_step": allocs_per_step, "train_step_us_off": med["off"],
            "train_step_us_recording": med["all"],
            "train_us_per_alloc_all": added["all"] / allocs_per_step,
            "train_blocks": TRAIN_BLOCKS, "train_steps_per_block": TRAIN_STEPS}
categories = {}
if which == "gpumem":
    training.update(train_step_us_sampled=med["sampled"],
                    train_us_per_alloc_sampled=added["sampled"] / allocs_per_step)
    categories = {
        "categories_overhead_us_per_alloc":
            overhead["categories"] - overhead["all"],
        "categories_pair_ratio": (statistics.median(off) + overhead["categories"])
                                 / (statistics.median(off) + overhead["all"]),
        "train_step_us_recording": med["all"], "train_step_us_categories": med["categories"],
        "train_step_ratio": (med["all"] + added["categories"]) / med["all"],
        "train_allocs_per_step": allocs_per_step,
        "categories_us_per_alloc_in_training": added["categories"] / allocs_per_step,
    }

# --- one stack capture on its own, called from Python (GIL held, no
# allocation, no trace entry), at the bottom of 0 and `depth` frames: torch's
# gather (the call its recorder makes per event) or gpumem's capture, minus
# the same call when it returns at once. gpumem's process also times one
# GIL round trip through PyGILState_Ensure/Release, which a capture pays when
# torch has released the GIL around the allocation.
CALLS = 100_000

def per_call(fn, *args):
    """us per call of fn(*args); functools.partial adds no Python frame."""
    call = functools.partial(fn, *args)
    t0 = time.perf_counter()
    for _ in range(CALLS):
        call()
    return (time.perf_counter() - t0) / CALLS * 1e6

if which == "gpumem":
    from gpumem import _C
    sys.path.insert(0, tests_dir)
    import testext
    def capture_costs():
        cap, noop = per_call(_C._hist_capture, 3), per_call(_C._hist_capture, 0)
        cap_ng = per_call(testext.hist_capture_without_gil, 3)
        noop_ng = per_call(testext.hist_capture_without_gil, 0)
        # The bare public-API walk of this stack, CALLS walks in one call.
        t0 = time.perf_counter()
        testext.hist_walk_only(CALLS)
        walk = (time.perf_counter() - t0) / CALLS * 1e6
        return cap - noop, (cap_ng - noop_ng) - (cap - noop), walk
else:
    gather = torch._C._profiler.gather_traceback
    def capture_costs():
        full = per_call(gather, True, False, False)
        empty = per_call(gather, False, False, False)
        return full - empty, 0.0, 0.0

record("all")
cap_runs = {0: [], depth: []}
walk_runs = {0: [], depth: []}
gil_runs = []
for r in range(repeats):
    for d in cap_runs:
        c, g, w = at_depth(d, capture_costs)
        cap_runs[d].append(c)
        walk_runs[d].append(w)
        gil_runs.append(g)
record(False)
cap0, capd = (statistics.median(cap_runs[d]) for d in (0, depth))
walk0, walkd = (statistics.median(walk_runs[d]) for d in (0, depth))
gil = statistics.median(gil_runs)

# --- a history of `events` entries, then dumps of it
def layer_a(live, i):
    live.append(torch.empty(SIZES[i % 6] + 128 * (i % 7), dtype=torch.uint8, device="cuda"))

def layer_b(live, i):
    live.append(torch.empty((1 + i % 5) * 3000, dtype=torch.float32, device="cuda"))

def layer_c(live, i):
    x = torch.empty(1 << 16, dtype=torch.uint8, device="cuda")
    live.append(x)

def drop(live):
    del live[0]

def fill():
    live = []
    for i in range(events // 3 + 2000):   # ~3 events per allocation and free
        (layer_a, layer_b, layer_c)[i % 3](live, i)
        if len(live) > 48:
            drop(live)
    return live

record("all")
keep = at_depth(depth, fill)
torch.cuda.synchronize()
d = tempfile.mkdtemp(prefix="hist_bench_")
path = os.path.join(d, "snap.pickle")
dumps = []
for r in range(repeats):
    t0 = time.perf_counter()
    mem._dump_snapshot(path)
    dumps.append(time.perf_counter() - t0)
size = os.path.getsize(path)
with open(path, "rb") as f:
    snap = pickle.load(f)
n_events = len(snap["device_traces"][0])
n_frames = sum(1 for e in snap["device_traces"][0] for _ in e.get("frames", ()))
os.unlink(path)
os.rmdir(d)
record(False)
print(json.dumps({
    "off_us": statistics.median(off), "on_us": statistics.median(on),
    "record_overhead_us_per_alloc": overhead["all"], "overhead_runs_us": diffs["all"],
    "off_runs_us": off, "on_runs_us": on,
    "overhead_events_only_us": breakdown["events_only"],
    "overhead_alloc_stack_us": breakdown["alloc_stack"],
    **({"sampled_overhead_us_per_alloc": breakdown["sampled"],
        "sampled_runs_us": runs["sampled"], "sampled_overhead_runs_us": diffs["sampled"]}
       if which == "gpumem" else {}),
    "capture_us_at_depth": capd, "capture_us_at_depth0": cap0,
    "capture_ns_per_frame": (capd - cap0) / depth * 1e3 if depth else None,
    "gil_round_trip_us": gil,
    "api_walk_us_at_depth": walkd,
    "api_walk_ns_per_frame": (walkd - walk0) / depth * 1e3 if depth else None,
    # What a pair cannot go below: two walks of the stack through the public
    # API and two GIL round trips (torch releases the GIL around both).
    "floor_us_per_alloc": 2 * (walkd + gil),
    "snapshot_dump_s": statistics.median(dumps), "dump_runs_s": dumps,
    "first_dump_s": dumps[0],
    "snapshot_bytes": size, "snapshot_events": n_events,
    "frames_per_event": n_frames / max(n_events, 1), **training, **categories}))
sys.stdout.flush()
os._exit(0)   # skip interpreter teardown
'''

CATEGORY_METRICS = ("categories_overhead_us_per_alloc", "categories_pair_ratio",
                    "train_step_us_recording", "train_step_us_categories", "train_step_ratio",
                    "train_allocs_per_step", "categories_us_per_alloc_in_training")
METRICS = ("record_overhead_us_per_alloc", "snapshot_dump_s", "snapshot_bytes")
TARGETS = {"record_overhead_us_per_alloc": 0.33, "snapshot_dump_s": 0.5, "snapshot_bytes": 1.0}
SAMPLED_TARGET = 0.10   # issue 32: the sampled mode per allocation, x torch's recorder


def run_one(which: str, args) -> dict:
    rc, out, err = sim.run_snippet(
        textwrap.dedent(SNIPPET),
        args=[which, str(args.depth), str(args.iters), str(args.events), str(args.repeats),
              str(ROOT / "tests"), args.clock, str(args.train_blocks)],
        timeout=900)
    if rc != 0:
        raise SystemExit(f"{which} run failed (exit {rc}):\n{err[-4000:]}")
    return json.loads(out.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--processes", type=int, default=1, help="processes per configuration")
    ap.add_argument("--repeats", type=int, default=7, help="timed runs per process")
    ap.add_argument("--depth", type=int, default=30, help="Python frames below the loop")
    ap.add_argument("--iters", type=int, default=20000, help="allocations per timed run")
    ap.add_argument("--events", type=int, default=100_000, help="trace entries dumped")
    ap.add_argument("--clock", choices=("wall", "thread"), default="wall",
                    help="time the pairs in wall-clock time (default) or in the thread's CPU "
                         "time (for a loaded machine)")
    ap.add_argument("--train-blocks", type=int, default=150,
                    help="pairs of 2-step blocks per compared mode in the training step")
    args = ap.parse_args(argv)
    # Build the shim, the fake libraries and the test-only extension before
    # anything is timed.
    from gpumem.pytorch import shim_build as _shim_build
    _shim_build.build()
    sim.lib_dir()
    sys.path.insert(1, str(ROOT / "tests"))
    import testext  # noqa: F401 - compiles tests/ext once, for every run_one

    runs: dict = {"torch": [], "gpumem": []}
    for _ in range(args.processes):
        for which in runs:
            runs[which].append(run_one(which, args))
    result: dict = {"device": "simulated GPU (gpumem.sim)", "depth": args.depth,
                    "iters": args.iters, "events": args.events, "repeats": args.repeats,
                    "processes": args.processes}
    for m in METRICS + ("first_dump_s", "off_us", "on_us", "overhead_events_only_us",
                        "overhead_alloc_stack_us", "capture_us_at_depth", "capture_us_at_depth0",
                        "capture_ns_per_frame", "gil_round_trip_us", "api_walk_us_at_depth",
                        "api_walk_ns_per_frame", "floor_us_per_alloc", "snapshot_events",
                        "frames_per_event"):
        t = statistics.median(r[m] for r in runs["torch"])
        g = statistics.median(r[m] for r in runs["gpumem"])
        entry = {"torch": t, "gpumem": g, "ratio": g / t if t and t > 0 else None}
        if m in TARGETS:
            entry["target_ratio"] = TARGETS[m]
            entry["met"] = entry["ratio"] is not None and entry["ratio"] <= TARGETS[m]
        result[m] = entry
    result["categories"] = {m: statistics.median(r[m] for r in runs["gpumem"])
                            for m in CATEGORY_METRICS}
    # The sampled mode (gpumem only) against torch's recorder (context='all')
    # and gpumem's full mode, on the pairs and per allocation of a step.
    t_all = result["record_overhead_us_per_alloc"]["torch"]
    g_smp = statistics.median(r["sampled_overhead_us_per_alloc"] for r in runs["gpumem"])
    t_train = statistics.median(r["train_us_per_alloc_all"] for r in runs["torch"])
    g_train = statistics.median(r["train_us_per_alloc_all"] for r in runs["gpumem"])
    g_train_smp = statistics.median(r["train_us_per_alloc_sampled"] for r in runs["gpumem"])
    result["sampled"] = {
        "overhead_us_per_alloc": g_smp, "ratio_to_torch": g_smp / t_all if t_all > 0 else None,
        "ratio_to_gpumem_full": (g_smp / result["record_overhead_us_per_alloc"]["gpumem"]
                                 if result["record_overhead_us_per_alloc"]["gpumem"] > 0
                                 else None),
        "target_ratio": SAMPLED_TARGET,
        "train_allocs_per_step": statistics.median(r["train_allocs_per_step"]
                                                   for r in runs["gpumem"]),
        "train_us_per_alloc": {"torch_all": t_train, "gpumem_all": g_train,
                               "gpumem_sampled": g_train_smp},
        "train_ratio_to_torch": g_train_smp / t_train if t_train > 0 else None,
    }
    result["sampled"]["met"] = (result["sampled"]["ratio_to_torch"] is not None
                                and result["sampled"]["ratio_to_torch"] <= SAMPLED_TARGET)
    result["runs"] = runs
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    print(f"{'figure':<30}{'torch':>14}{'gpumem':>14}{'ratio':>8}{'target':>8}")
    for m in METRICS + ("first_dump_s", "off_us", "on_us", "overhead_events_only_us",
                        "overhead_alloc_stack_us", "capture_us_at_depth", "capture_ns_per_frame",
                        "gil_round_trip_us", "api_walk_us_at_depth", "floor_us_per_alloc",
                        "snapshot_events"):
        r = result[m]
        target = f"<={r['target_ratio']}" if "target_ratio" in r else ""
        ratio = f"{r['ratio']:>8.3f}" if r["ratio"] is not None else f"{'':>8}"
        print(f"{m:<30}{r['torch']:>14.4g}{r['gpumem']:>14.4g}{ratio}{target:>8}")
    smp = result["sampled"]
    print(f"{'sampled_overhead_us_per_alloc':<30}{'':>14}{smp['overhead_us_per_alloc']:>14.4g}"
          f"{smp['ratio_to_torch']:>8.3f}{'<=' + str(SAMPLED_TARGET):>8}")
    tr = smp["train_us_per_alloc"]
    print(f"{'train_us_per_alloc (all)':<30}{tr['torch_all']:>14.4g}{tr['gpumem_all']:>14.4g}")
    print(f"{'train_us_per_alloc (sampled)':<30}{'':>14}{tr['gpumem_sampled']:>14.4g}"
          f"{smp['train_ratio_to_torch']:>8.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
