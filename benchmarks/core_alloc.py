"""Core allocator speed: malloc+free pairs on a warm pool, and trace replay.

    python benchmarks/core_alloc.py [--json] [--snapshots DIR] [--baseline REV]

malloc_free_pair_ns_p50: the median over batches of the cost of one
malloc+free pair that hits the cache (one thread, warm pool, 4 KiB and
other sizes), timed in C by benchmarks/c/pairs.c, which is compiled against
this tree's csrc/ with the extension's optimisation flags (so Python's call
overhead is not counted).

replay_events_per_s: trace entries of the largest snapshot in
../shared/snapshots consumed per second by the C replay loop
(gpumem._C.replay), and replay_ops_per_s the alloc/free operations it
performed per second (a free_requested + free_completed pair is one free
op). The time excludes loading the pickle; replay_end_to_end_s gives
load + build + replay.

--baseline REV measures another revision of this repository in the same
run: REV is exported with `git archive` into a temporary folder, its core is
compiled into its own pairs binary and its extension built in place, and
the two trees are measured in alternating rounds: pairs at 4 KiB, one
process per round and tree; replay of the largest snapshot with both
extensions loaded in one process and fed the same operations, alternately
(median of 40 replays per round). The result's "baseline" part gives both
trees' figures and the ratios this tree / REV.
Targets: <= 60 ns per pair, >= 5 M replayed events per second; against a
baseline, pair p50 within 5% and replay throughput at least as high.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_SNAPSHOTS = ROOT.parent / "shared" / "snapshots"
PAIRS_C = ROOT / "benchmarks" / "c" / "pairs.c"
# The extension's optimisation flags (setup.py), so the figures are the core's as shipped.
CFLAGS = ["-std=c11", "-O2", "-D_GNU_SOURCE", "-fvisibility=hidden", "-w"]
SIZES = {"4KiB": 4096, "512B": 512, "1MiB": 1 << 20, "8MiB": 8 << 20, "64MiB": 64 << 20}

# Runs in a subprocess with one tree's gpumem first on sys.path; prints JSON.
REPLAY_SNIPPET = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
try:
    from gpumem.snapshots import replay as r
    from gpumem.snapshots.unpickle import load_snapshot
except ImportError:   # a baseline tree from before the package was grouped (issue 28)
    from gpumem import replay as r
    from gpumem._unpickle import load_snapshot
t0 = time.perf_counter()
snap = load_snapshot(sys.argv[2])
ops = [r.build_ops(snap, d) for d in r.traced_devices(snap)]
best = None
for _ in range(int(sys.argv[3])):
    events = n = ns = 0
    for dev_ops in ops:
        row = r.replay_device(dev_ops, r.default_conf())
        events += dev_ops.events; n += row["ops"]; ns += row["elapsed_ns"]
    if best is None or ns < best[2]:
        best = (events, n, ns)
events, n, ns = best
print(json.dumps({"trace_events": events, "replay_ops": n,
                  "replay_events_per_s": events / (ns / 1e9), "replay_ops_per_s": n / (ns / 1e9),
                  "replay_end_to_end_s": time.perf_counter() - t0}))
"""


def build_pairs(tree: Path, out_dir: Path) -> Path:
    """Compile tree's own pairs.c against tree/csrc (whatever of base/, device/, core/
    it has): the device's names are the tree's (main before issue 28 had gm_sim_*)."""
    csrc = tree / "csrc"
    pairs_c = tree / "benchmarks" / "c" / "pairs.c"
    if not pairs_c.is_file():
        pairs_c = PAIRS_C
    sources = [str(p) for layer in ("base", "device", "core")
               for p in sorted((csrc / layer).glob("*.c"))]
    exe = out_dir / "pairs"
    cc = os.environ.get("CC", "cc").split()
    subprocess.run(cc + CFLAGS + ["-I", str(csrc), str(pairs_c), *sources, "-o", str(exe),
                                  "-lpthread", "-ldl"], check=True)
    return exe


def run_pairs(exe: Path, size: int, batches: int, per_batch: int) -> list[float]:
    out = subprocess.run([str(exe), str(size), str(batches), str(per_batch)], check=True,
                         capture_output=True, text=True).stdout
    return [float(line) for line in out.split()]


def summary(samples: list[float]) -> dict:
    s = sorted(samples)
    return {"p50": statistics.median(s), "p10": s[len(s) // 10], "p90": s[len(s) * 9 // 10]}


def run_replay(tree: Path, snapshot: Path, repeats: int) -> dict:
    out = subprocess.run([sys.executable, "-c", REPLAY_SNIPPET, str(tree), str(snapshot),
                          str(repeats)], check=True, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(tree)}).stdout
    return json.loads(out.splitlines()[-1])


# Both trees' extensions in one process, the same ops fed to each, in
# alternating order; prints the median replay time of each (JSON).
REPLAY_AB_SNIPPET = r"""
import importlib.machinery, importlib.util, json, statistics, sys
sys.path.insert(0, sys.argv[1])
try:
    from gpumem.snapshots import replay as r
    from gpumem.snapshots.unpickle import load_snapshot
except ImportError:   # a baseline tree from before the package was grouped (issue 28)
    from gpumem import replay as r
    from gpumem._unpickle import load_snapshot

def load(path, name):
    loader = importlib.machinery.ExtensionFileLoader(name, path)
    mod = importlib.util.module_from_spec(importlib.util.spec_from_file_location(name, path, loader=loader))
    loader.exec_module(mod)
    return mod

mods = {"this": load(sys.argv[2], "this_tree._C"), "baseline": load(sys.argv[3], "baseline_tree._C")}
snap = load_snapshot(sys.argv[4])
ops = [r.build_ops(snap, d) for d in r.traced_devices(snap)]
args = [(o.events, o.arrays(), max(r.DEFAULT_CAPACITY, 4 * o.peak_allocated_trace)) for o in ops]
ns = {k: [] for k in mods}
for i in range(int(sys.argv[5])):
    for name in (["this", "baseline"] if i % 2 == 0 else ["baseline", "this"]):
        total = 0
        for _events, arrays, capacity in args:
            total += mods[name].replay(*arrays, capacity=capacity,
                                       settings=r.default_conf())["elapsed_ns"]
        ns[name].append(total)
events = sum(e for e, _, _ in args)
print(json.dumps({k: events / (statistics.median(v) / 1e9) for k, v in ns.items()}))
"""


def extension_of(tree: Path) -> Path:
    found = sorted((tree / "gpumem").glob("_C.*.so"))
    if not found:
        raise SystemExit(f"core_alloc.py: no built gpumem/_C in {tree}; build it with "
                         "'python setup.py build_ext --inplace'")
    return found[0]


def replay_ab(base: Path, snapshot: Path, repeats: int) -> dict:
    out = subprocess.run([sys.executable, "-c", REPLAY_AB_SNIPPET, str(ROOT),
                          str(extension_of(ROOT)), str(extension_of(base)), str(snapshot),
                          str(repeats)], check=True, capture_output=True, text=True).stdout
    return json.loads(out.splitlines()[-1])


def export_tree(rev: str, dest: Path) -> Path:
    """REV of this repository, unpacked into dest, with its extension built in place."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", rev],
                             check=True, capture_output=True).stdout
    dest.mkdir(parents=True, exist_ok=True)
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=dest,
                   check=True, capture_output=True)
    return dest


def compare(rev: str, snapshot: Path | None, rounds: int) -> dict:
    """This tree against REV, alternating rounds."""
    work = Path(tempfile.mkdtemp(prefix="gpumem-baseline-"))
    try:
        base = export_tree(rev, work / "tree")
        trees = {"this": ROOT, "baseline": base}
        exes = {}
        for name, tree in trees.items():
            (work / name).mkdir()
            exes[name] = build_pairs(tree, work / name)
        pairs = {name: [] for name in trees}
        for _ in range(rounds):
            for name in trees:
                pairs[name] += run_pairs(exes[name], 4096, 20, 20000)
        res = {"rev": rev, "rounds": rounds}
        replay = replay_ab(base, snapshot, 40 * rounds) if snapshot else {}
        for name in trees:
            res[f"{name}_pair_ns_p50"] = round(summary(pairs[name])["p50"], 2)
            if snapshot:
                res[f"{name}_replay_events_per_s"] = round(replay[name])
        res["pair_p50_ratio"] = round(res["this_pair_ns_p50"] / res["baseline_pair_ns_p50"], 4)
        if snapshot:
            res["replay_ratio"] = round(res["this_replay_events_per_s"]
                                        / res["baseline_replay_events_per_s"], 4)
        return res
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print JSON")
    ap.add_argument("--snapshots", default=str(DEFAULT_SNAPSHOTS), help="snapshot folder")
    ap.add_argument("--baseline", metavar="REV", help="also measure this git revision, same run")
    ap.add_argument("--rounds", type=int, default=7, help="alternating rounds with --baseline")
    args = ap.parse_args(argv)

    snaps = Path(args.snapshots)
    pickles = sorted(snaps.glob("*.pickle"), key=lambda p: p.stat().st_size) if snaps.is_dir() else []
    largest = pickles[-1] if pickles else None

    out: dict = {}
    with tempfile.TemporaryDirectory(prefix="gpumem-pairs-") as tmp:
        exe = build_pairs(ROOT, Path(tmp))
        for name, size in SIZES.items():
            r = summary(run_pairs(exe, size, 200, 20000))
            out[f"malloc_free_pair_ns_p50_{name}"] = round(r["p50"], 1)
            if name == "4KiB":
                out["malloc_free_pair_ns_p50"] = round(r["p50"], 1)
                out["malloc_free_pair_ns_p10"] = round(r["p10"], 1)
                out["malloc_free_pair_ns_p90"] = round(r["p90"], 1)
    if largest:
        out["snapshot"] = largest.name
        out.update(run_replay(ROOT, largest, 5))
    else:
        out["replay_events_per_s"] = None
        out["replay_note"] = f"no snapshots at {snaps}"
    if args.baseline:
        out["baseline"] = compare(args.baseline, largest, args.rounds)
    out["targets"] = {"malloc_free_pair_ns_p50": "<= 60", "replay_events_per_s": ">= 5e6",
                      "baseline.pair_p50_ratio": "<= 1.05", "baseline.replay_ratio": ">= 1.0"}
    out["cpu_count"] = os.cpu_count()

    if args.json:
        print(json.dumps(out, indent=2))
    else:
        for k, v in out.items():
            print(f"{k:40s} {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
