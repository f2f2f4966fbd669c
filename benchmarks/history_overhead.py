"""Memory history costs: recording overhead per allocation, snapshot dump time and size.

    python benchmarks/history_overhead.py [--json] [--depth 30] [--events 100000]

record_overhead_us_per_alloc: extra time of one malloc+free pair with
recording on (context='all', stacks='python': both the malloc and the free
capture a stack) over the same pair with recording off, called from Python
at a stack depth of about --depth frames. gpumem drives _C.Allocator on the
simulated device.

snapshot_dump_s / snapshot_bytes: dump_snapshot() of a history holding
--events trace entries (each with a stack of about --depth frames), and the
size of the file written.

The torch columns run torch's native recorder with the same loop on
torch.cuda tensors; they need a CUDA device (a real one or the fake CUDA
runtime) and are reported as unavailable otherwise. Targets (issue 6):
gpumem overhead <= 0.33 x torch's, dump time <= 0.5 x torch's, file size
<= torch's.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gpumem import _C, history  # noqa: E402


def at_depth(depth: int, fn):
    """Call fn() with about `depth` extra Python frames below this one."""
    def down(n):
        return fn() if n <= 0 else down(n - 1)
    return down(depth)


def best_of(repeats: int, fn) -> float:
    return min(fn() for _ in range(repeats))


def pair_loop(malloc, free, n: int):
    def run() -> float:
        t0 = time.perf_counter()
        for _ in range(n):
            free(malloc())
        return (time.perf_counter() - t0) / n
    return run


def gpumem_overhead(depth: int, n: int = 100_000) -> dict:
    a = _C.Allocator()
    run = pair_loop(lambda: a.malloc(4096), a.free, n)
    history.record_memory_history(None)
    off = best_of(5, lambda: at_depth(depth, run))
    history.record_memory_history("all", context="all", stacks="python")
    on = best_of(5, lambda: at_depth(depth, run))
    history.record_memory_history(None)
    return {"off_us": off * 1e6, "on_us": on * 1e6, "overhead_us": (on - off) * 1e6}


def gpumem_dump(depth: int, events: int) -> dict:
    a = _C.Allocator()
    history.record_memory_history("all", context="all", stacks="python", max_entries=events)

    def fill():
        live = []
        for i in range(events // 3 + 100):  # ~3 events per alloc+free
            live.append(a.malloc(512 * (1 + i % 64)))
            if len(live) > 64:
                a.free(live.pop(0))
    at_depth(depth, fill)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "snap.pickle")
        t0 = time.perf_counter()
        history.dump_snapshot(path)
        dt = time.perf_counter() - t0
        size = os.path.getsize(path)
    n = len(history.snapshot()["device_traces"][0])
    held = history.history_overhead_bytes()
    history.record_memory_history(None)
    return {"dump_s": dt, "bytes": size, "events": n, "overhead_bytes": held}


def torch_side(depth: int, events: int, n: int = 20_000) -> dict:
    try:
        import torch
    except ImportError as e:
        return {"unavailable": f"torch not importable ({e})"}
    if not torch.cuda.is_available():
        return {"unavailable": "torch.cuda is not available (no GPU and no fake CUDA runtime)"}
    mem = torch.cuda.memory
    run = pair_loop(lambda: torch.empty(1024, device="cuda"), lambda t: None, n)
    mem._record_memory_history(None)
    off = best_of(3, lambda: at_depth(depth, run))
    mem._record_memory_history("all", context="all", stacks="python")
    on = best_of(3, lambda: at_depth(depth, run))
    mem._record_memory_history(None)
    mem._record_memory_history("all", context="all", stacks="python", max_entries=events)

    def fill():
        live = []
        for i in range(events // 3 + 100):
            live.append(torch.empty(128 * (1 + i % 64), device="cuda"))
            if len(live) > 64:
                live.pop(0)
    at_depth(depth, fill)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "snap.pickle")
        t0 = time.perf_counter()
        mem._dump_snapshot(path)
        dt = time.perf_counter() - t0
        size = os.path.getsize(path)
    mem._record_memory_history(None)
    return {"overhead_us": (on - off) * 1e6, "dump_s": dt, "bytes": size}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true")
    p.add_argument("--depth", type=int, default=30)
    p.add_argument("--events", type=int, default=100_000)
    p.add_argument("--no-torch", action="store_true")
    args = p.parse_args(argv)
    ov = gpumem_overhead(args.depth)
    dump = gpumem_dump(args.depth, args.events)
    result = {
        "record_overhead_us_per_alloc": ov["overhead_us"],
        "alloc_free_pair_us_off": ov["off_us"],
        "snapshot_dump_s": dump["dump_s"],
        "snapshot_bytes": dump["bytes"],
        "snapshot_events": dump["events"],
        "history_overhead_bytes": dump["overhead_bytes"],
        "torch": {"unavailable": "skipped"} if args.no_torch else torch_side(args.depth,
                                                                               args.events),
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"record_overhead_us_per_alloc  {result['record_overhead_us_per_alloc']:.3f} us "
          f"(pair with recording off: {result['alloc_free_pair_us_off']:.3f} us, "
          f"depth {args.depth})")
    print(f"snapshot_dump_s               {result['snapshot_dump_s']:.3f} s "
          f"({result['snapshot_events']} events)")
    print(f"snapshot_bytes                {result['snapshot_bytes']}")
    print(f"history_overhead_bytes        {result['history_overhead_bytes']}")
    t = result["torch"]
    if "unavailable" in t:
        print(f"torch                         unavailable: {t['unavailable']}")
    else:
        print(f"torch overhead / dump / bytes  {t['overhead_us']:.3f} us  {t['dump_s']:.3f} s  "
              f"{t['bytes']}")
        print(f"ratios (gpumem / torch)        overhead {ov['overhead_us'] / t['overhead_us']:.2f}"
              f"  dump {dump['dump_s'] / t['dump_s']:.2f}  bytes "
              f"{dump['bytes'] / t['bytes']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
