"""gpumem summary, diff and view on a big snapshot: seconds and peak memory.

    python benchmarks/big_snapshots.py [--events N] [--baseline REV [--baseline-ext SO]]
                                       [--limit-case] [--commands summary,diff,view]
                                       [--mem-cap GiB] [--keep PATH]

Writes the synthetic training snapshot of tests/snapshot_gen.py with
--events trace entries (default 5,000,000) and runs each command on it in
a new process, as a user does: ``gpumem summary FILE --json``, ``gpumem
diff FILE FILE --json`` (the file against itself: two loads) and ``gpumem
view FILE -o PAGE``.  Per command: wall seconds and the child's peak RSS
(ru_maxrss from wait4), its CPU seconds (user + system, from wait4: on a
loaded machine they move less than the wall seconds), and that peak against
the issue's bound, 4 x the file + 200 MB.  With --baseline REV, gpumem REV's package (from git)
runs the same commands on the same file in the same run, with the working
tree's built extension put beside it, or with --baseline-ext SO, REV's own
build of gpumem._C (its snapshot reader and analyses are native code).
--keep PATH writes the snapshot there once and reuses it on later runs.

--limit-case writes a snapshot just under the loader's default 2 GiB file
limit instead (about 37,000,000 events) and runs the working tree only,
unless --baseline is given too.  --mem-cap caps each child's address space
(RLIMIT_AS, default 20 GiB) so that a command that would need more fails
with exit status and "memory" in its row instead of taking the machine.
Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

sys.path.insert(0, str(ROOT / "benchmarks"))

from gpumem_trees import revision_tree  # noqa: E402
from snapshot_gen import write_snapshot  # noqa: E402

#: events per byte of the generated file, measured: about 56.5 bytes an event
LIMIT_EVENTS = 37_000_000


def run_child(argv: list[str], package_root: Path, cap: int) -> dict:
    """argv in a new process with gpumem from package_root: seconds, peak RSS, status."""
    env = dict(os.environ, PYTHONPATH=str(package_root))

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))

    t0 = time.perf_counter()
    p = subprocess.Popen(argv, env=env, cwd=str(package_root), stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, preexec_fn=limit)
    err = p.stderr.read().decode(errors="replace")
    _pid, status, usage = os.wait4(p.pid, 0)
    took = time.perf_counter() - t0
    p.returncode = os.waitstatus_to_exitcode(status)
    row = {"seconds": round(took, 2), "cpu_s": round(usage.ru_utime + usage.ru_stime, 2),
           "peak_rss_mb": round(usage.ru_maxrss / 1024, 1), "exit": p.returncode}
    if p.returncode:
        row["error"] = (err.strip().splitlines() or ["(no output)"])[-1][:200]
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=5_000_000)
    parser.add_argument("--baseline", metavar="REV", help="also run gpumem REV's commands")
    parser.add_argument("--limit-case", action="store_true",
                        help=f"a file just under 2 GiB ({LIMIT_EVENTS:,} events)")
    parser.add_argument("--commands", default="summary,diff,view")
    parser.add_argument("--mem-cap", type=float, default=20.0, help="GiB per child (RLIMIT_AS)")
    parser.add_argument("--baseline-ext", metavar="SO",
                        help="REV's built gpumem._C extension (default: the working tree's)")
    parser.add_argument("--keep", metavar="PATH", help="write the snapshot here and keep it")
    args = parser.parse_args(argv)
    events = LIMIT_EVENTS if args.limit_case else args.events
    tmp = Path(tempfile.mkdtemp(prefix="gpumem-big-"))
    try:
        snap = Path(args.keep) if args.keep else tmp / "big.pickle"
        t0 = time.perf_counter()
        if not snap.exists() or not args.keep:
            write_snapshot(snap, events)
        made = time.perf_counter() - t0
        size = snap.stat().st_size
        trees = {"current": ROOT}
        if args.baseline:
            trees["baseline"] = revision_tree(
                args.baseline, tmp / "baseline",
                Path(args.baseline_ext) if args.baseline_ext else None)
        commands = {
            "summary": ["summary", str(snap), "--json"],
            "diff": ["diff", str(snap), str(snap), "--json"],
            "view": ["view", str(snap), "-o", str(tmp / "page.html")],
        }
        bound_mb = 4 * size / 2**20 + 200
        result = {"events": events, "file_mb": round(size / 2**20, 1),
                  "generated_s": round(made, 1), "bound_mb": round(bound_mb, 1),
                  "cpus": os.cpu_count(), "load_avg": [round(x, 2) for x in os.getloadavg()],
                  "trees": {}}
        cap = int(args.mem_cap * 2**30)
        for name, tree in trees.items():
            rows = {}
            for cmd in args.commands.split(","):
                row = run_child([sys.executable, "-m", "gpumem", *commands[cmd]], tree, cap)
                row["within_bound"] = row["exit"] == 0 and row["peak_rss_mb"] <= bound_mb
                rows[cmd] = row
            result["trees"][name] = {"revision": args.baseline if name == "baseline"
                                     else "working tree", "commands": rows}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
