"""Record allocation traces with torch's own caching allocator, under pressure.

    python benchmarks/torch_traces.py OUTDIR [--json]

The real snapshots in ../shared/snapshots are single-stream and torch never
released memory in them.  This script records the cases they lack, with
torch 2.14.1's own CUDACachingAllocator (gpumem is not installed) on the
simulated GPU (gpumem.sim): several streams with cross-stream frees
(record_stream), torch.cuda.empty_cache() every few steps, and devices small
enough that torch releases its cache and retries, or runs out of memory, with
and without expandable segments.  Each trace is written to OUTDIR/NAME.pickle
with torch's _dump_snapshot, so its segment events are torch's own;
benchmarks/fragmentation.py then replays them beside the real snapshots.

Every workload is seeded and allocates the same sizes on every run; the
simulated device computes nothing, so only the allocator's decisions matter.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

# name -> (device memory, streams, steps, empty_cache every N steps (0: never), settings)
WORKLOADS = {
    "streams10_empty_cache": ("80GiB", 10, 60, 7, ""),
    "streams10_pressure": ("8GiB", 10, 60, 0, ""),
    "streams10_pressure_expandable": ("8GiB", 10, 60, 0, "expandable_segments:True"),
    "streams4_pressure_expandable": ("6GiB", 4, 60, 0, "expandable_segments:True"),
    "stream1_pressure": ("3GiB", 1, 150, 0, ""),
    "streams2_pressure_max_split": ("4GiB", 2, 80, 0, "max_split_size_mb:128"),
}

_CHILD = r'''
import random, sys, torch
path, nstreams, steps, empty_every = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
torch.cuda.memory._record_memory_history(max_entries=1_000_000)
rng = random.Random(0)
streams = [torch.cuda.Stream() for _ in range(nstreams)]
MiB = 1 << 20
keep = []
for step in range(steps):
    live = []
    for s in streams:
        with torch.cuda.stream(s):
            for _ in range(rng.randrange(3, 12)):
                n = rng.choice([rng.randrange(1, 1 << 20), rng.randrange(1, 32) * MiB,
                                rng.randrange(1, 300) * MiB])
                try:
                    live.append(torch.empty(n, dtype=torch.uint8, device="cuda"))
                except torch.OutOfMemoryError:
                    pass
    rng.shuffle(live)
    for t in live[: len(live) // 2]:
        if rng.random() < 0.2:  # used on another stream: freed once that stream is done
            t.record_stream(streams[rng.randrange(nstreams)])
    del live[: len(live) // 3]
    keep.extend(live[:2])
    if len(keep) > 40:
        del keep[:10]
    del live
    if empty_every and step % empty_every == empty_every - 1:
        torch.cuda.empty_cache()
torch.cuda.synchronize()
torch.cuda.memory._dump_snapshot(path)
'''


def record(name: str, out: Path) -> dict:
    from gpumem import sim
    memory, streams, steps, empty_every, conf = WORKLOADS[name]
    env = sim.sim_env(memory=memory)
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    if conf:
        env["PYTORCH_CUDA_ALLOC_CONF"] = conf
    path = out / f"{name}.pickle"
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(path), str(streams), str(steps),
                           str(empty_every)], env=env, capture_output=True, text=True,
                          timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"{name}: the workload failed ({proc.returncode}): "
                           f"{proc.stderr.strip()[-800:]}")
    return {"name": name, "file": str(path), "memory": memory, "streams": streams,
            "steps": steps, "empty_cache_every": empty_every, "conf": conf,
            "seconds": round(time.perf_counter() - t0, 2)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="folder for the recorded snapshots")
    parser.add_argument("--only", action="append", choices=sorted(WORKLOADS),
                        help="record only this workload (repeatable)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of lines")
    args = parser.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    rows = []
    try:
        for name in args.only or list(WORKLOADS):
            rows.append(record(name, args.out))
            if not args.json:
                r = rows[-1]
                print(f"{r['file']}: {r['streams']} stream(s), {r['memory']} device, "
                      f"settings '{r['conf']}', {r['seconds']} s")
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as e:
        print(f"torch_traces: error: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({"traces": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
