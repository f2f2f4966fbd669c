"""Recording's cost in a training step while another Python thread is busy.

    python benchmarks/history_busy_thread.py [--json] [--rounds 12] [--processes 1]

The training step of benchmarks/history_overhead.py (a Transformer, 2
layers, d_model 64, + AdamW) under gpumem.sim, with a Python thread that
runs pure Python code throughout (it holds the GIL except when the
interpreter hands it over, every switch interval), as a checkpointing,
logging or data thread does. In each of --rounds rounds every mode runs
one untimed step, then 3 timed steps (wall-clock time); the figure is the
median of a mode's steps, and `added_ms` its difference to recording off
in the same process:

    off   recording off
    all   _record_memory_history(context='all', stacks='python')
    smp   gpumem's sampled mode (sample=True), gpumem's process only

"torch" runs torch's caching allocator and recorder, "gpumem" the same
script after gpumem.install(). Autograd runs backward on its own device
thread, which holds no GIL; a recorder that takes the GIL there for every
event's stack waits for the busy thread each time (Note [Capture and the
GIL] in csrc/python/hist_capture.c). With --processes N each allocator runs
N times, alternately, and the figures are medians over processes.
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
import json, statistics, sys, threading, time
import torch, gpumem
alloc, tests_dir, rounds, pause = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
if alloc == "gpumem":
    gpumem.install()
sys.path.insert(0, tests_dir)
from torch_helpers import TRANSFORMER   # make_model(), timed_steps()
exec(TRANSFORMER)
mem = torch.cuda.memory
model, opt = make_model()
x = torch.randn(8, 16, 64, device="cuda")
timed_steps(model, opt, x, 5)

def set_mode(m):
    mem._record_memory_history(None)
    if m == "all":
        mem._record_memory_history("all", context="all", stacks="python")
    elif m == "smp":
        mem._record_memory_history("all", context="all", stacks="python", sample=True)

stop = threading.Event()
def busy():
    n = 0
    while not stop.is_set():
        for _ in range(1000):
            n += 1
        if pause:
            time.sleep(pause)

modes = ["off", "all"] + (["smp"] if alloc == "gpumem" else [])
steps = {m: [] for m in modes}
th = threading.Thread(target=busy, daemon=True)
th.start()
try:
    for _ in range(rounds):
        for m in modes:
            set_mode(m)
            timed_steps(model, opt, x, 1)
            for _ in range(3):
                t = time.perf_counter()
                timed_steps(model, opt, x, 1)
                steps[m].append((time.perf_counter() - t) * 1e3)
finally:
    stop.set()
    th.join()
    set_mode("off")
print(json.dumps({m: statistics.median(v) for m, v in steps.items()}))
'''


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--rounds", type=int, default=12, help="rounds of 3 timed steps per mode")
    ap.add_argument("--processes", type=int, default=1, help="processes per allocator")
    ap.add_argument("--pause-us", type=float, default=0.0,
                    help="the busy thread sleeps this long after each 1,000 loop iterations "
                         "(0: never; it then gives up the GIL only when asked)")
    args = ap.parse_args(argv)
    if args.rounds < 1 or args.processes < 1 or not 0 <= args.pause_us <= 1e6:
        print("history_busy_thread: --rounds and --processes must be at least 1, "
              "--pause-us between 0 and 1e6",
              file=sys.stderr)
        return 2
    from gpumem.pytorch import shim_build
    shim_build.build()
    runs: dict[str, list[dict]] = {"torch": [], "gpumem": []}
    for _ in range(args.processes):
        for alloc in runs:
            rc, out, err = sim.run_snippet(textwrap.dedent(SNIPPET),
                                           args=[alloc, str(ROOT / "tests"), str(args.rounds),
                                                 str(args.pause_us / 1e6)],
                                           timeout=3600)
            if rc != 0:
                print(f"history_busy_thread: the {alloc} run failed (exit {rc}):\n{err[-4000:]}",
                      file=sys.stderr)
                return 1
            runs[alloc].append(json.loads(out.strip().splitlines()[-1]))
    result: dict = {"rounds": args.rounds, "processes": args.processes, "pause_us": args.pause_us}
    for alloc, rows in runs.items():
        step = {m: statistics.median(r[m] for r in rows) for m in rows[0]}
        result[alloc] = {"step_ms": step,
                         "added_ms": {m: statistics.median(r[m] - r["off"] for r in rows)
                                      for m in rows[0] if m != "off"}}
    t_all = result["torch"]["added_ms"]["all"]
    result["all_added_ratio"] = result["gpumem"]["added_ms"]["all"] / t_all if t_all > 0 else None
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    print(f"a training step with a busy Python thread, median ms ({args.rounds} rounds, "
          f"{args.processes} process(es) each)")
    for alloc in runs:
        step, added = result[alloc]["step_ms"], result[alloc]["added_ms"]
        print(f"{alloc:<8}" + "  ".join(
            f"{m} {step[m]:.1f}" + (f" (+{added[m]:.1f})" if m in added else "") for m in step))
    return 0


if __name__ == "__main__":
    sys.exit(main())
