"""Core allocator speed: malloc+free pairs on a warm pool, and trace replay.

    python benchmarks/core_alloc.py [--json] [--snapshots DIR]

malloc_free_pair_ns_p50: the median over batches of the cost of one
malloc+free pair that hits the cache (one thread, warm pool, 4 KiB and
other sizes), timed inside C so Python's call overhead is not counted
(bench_pairs of the test-only extension, tests/ext, built on first use).

replay_events_per_s: trace entries of the largest snapshot in
../shared/snapshots consumed per second by the C replay loop, and
replay_ops_per_s the alloc/free operations it performed per second (a
free_requested + free_completed pair is one free op). The time excludes
loading the pickle; replay_end_to_end_s gives load + build + replay.
Targets (issue 2): <= 60 ns per pair, >= 5 M replayed events per second.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(1, str(ROOT / "tests"))

import gpumem  # noqa: E402
from gpumem import replay as replay_mod  # noqa: E402
from gpumem._unpickle import load_snapshot  # noqa: E402

import testext  # noqa: E402 - tests/testext.py: the timing loop lives in the test-only extension

DEFAULT_SNAPSHOTS = ROOT.parent / "shared" / "snapshots"


def pair_ns(size: int, batches: int = 200, per_batch: int = 20000) -> dict:
    a = gpumem.Allocator(capacity=8 << 30)
    testext.bench_pairs(a, size, 10000)  # warm the pool: the segment is cached
    samples = [testext.bench_pairs(a, size, per_batch) / per_batch for _ in range(batches)]
    return {
        "p50": statistics.median(samples),
        "p10": sorted(samples)[len(samples) // 10],
        "p90": sorted(samples)[len(samples) * 9 // 10],
    }


def replay_speed(path: Path, repeats: int = 5) -> dict:
    t0 = time.perf_counter()
    snap = load_snapshot(path)
    devices = replay_mod.traced_devices(snap)
    all_ops = [replay_mod.build_ops(snap, d) for d in devices]
    best = None
    for _ in range(repeats):
        events = ops = ns = 0
        for dev_ops in all_ops:
            row = replay_mod.replay_device(dev_ops, replay_mod.default_conf())
            events += dev_ops.events
            ops += row["ops"]
            ns += row["elapsed_ns"]
        if best is None or ns < best[2]:
            best = (events, ops, ns)
    end_to_end = time.perf_counter() - t0
    events, ops, ns = best
    return {
        "snapshot": path.name,
        "trace_events": events,
        "replay_ops": ops,
        "replay_events_per_s": events / (ns / 1e9),
        "replay_ops_per_s": ops / (ns / 1e9),
        "replay_end_to_end_s": end_to_end,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print JSON")
    ap.add_argument("--snapshots", default=str(DEFAULT_SNAPSHOTS), help="snapshot folder")
    args = ap.parse_args(argv)

    out = {}
    sizes = {"4KiB": 4096, "512B": 512, "1MiB": 1 << 20, "8MiB": 8 << 20, "64MiB": 64 << 20}
    for name, size in sizes.items():
        r = pair_ns(size)
        out[f"malloc_free_pair_ns_p50_{name}"] = round(r["p50"], 1)
        if name == "4KiB":
            out["malloc_free_pair_ns_p50"] = round(r["p50"], 1)
            out["malloc_free_pair_ns_p10"] = round(r["p10"], 1)
            out["malloc_free_pair_ns_p90"] = round(r["p90"], 1)

    snaps = Path(args.snapshots)
    pickles = sorted(snaps.glob("*.pickle"), key=lambda p: p.stat().st_size) if snaps.is_dir() else []
    if pickles:
        out.update(replay_speed(pickles[-1]))
    else:
        out["replay_events_per_s"] = None
        out["replay_note"] = f"no snapshots at {snaps}"
    out["targets"] = {"malloc_free_pair_ns_p50": "<= 60", "replay_events_per_s": ">= 5e6"}
    out["cpu_count"] = os.cpu_count()

    if args.json:
        print(json.dumps(out, indent=2))
    else:
        for k, v in out.items():
            print(f"{k:40s} {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
