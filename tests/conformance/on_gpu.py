"""Run every conformance group on this machine's own GPU, under torch's
allocator and under gpumem, and compare.

    python tests/conformance/on_gpu.py [--jobs 8] [--out results.json] [GROUP ...]

test_conformance.py runs the groups on the simulated GPU; this runs the
same runner.py processes with no simulator, so the checks meet a real
driver (run it on a machine with an NVIDIA GPU and torch's CUDA build;
`gpumem build-shim` first, so the processes do not all build the shim).
The bar is the suite's: a check that passes under torch's allocator passes
under gpumem. Printed: one line per check where the two differ, then the
counts. Checks marked @sim_limit (the simulator cannot show them) are
expected to pass here under both. A check that fails under both in a group
that sets MEMORY (made for a simulated device of that size: its sizes,
messages and kernel times are the simulator's) is counted apart, as "both
fail, sized for the simulator", with the group's device size in its line;
on a real GPU of another size those checks say nothing about gpumem.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(HERE))

import runner  # noqa: E402


def _variants(group: str) -> dict:
    import importlib
    return getattr(importlib.import_module(group), "VARIANTS", {"": {}})


def _sim_memory(group: str):
    """The simulated device size the group was made for (its MEMORY), or None."""
    import importlib
    return getattr(importlib.import_module(group), "MEMORY", None)


def _run(group: str, variant: str, extra: dict, mode: str, timeout: int) -> dict:
    env = dict(os.environ)
    for k in ("GPUMEM_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"):
        env.pop(k, None)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in [env.get("PYTHONPATH")] if p])
    env["GPUMEM_SHIM_BUILD"] = "0"
    env["PYTHONWARNINGS"] = "ignore::FutureWarning"
    env.update(extra)
    t0 = time.monotonic()
    try:
        proc = subprocess.run([sys.executable, str(HERE / "runner.py"), group, mode, variant],
                              capture_output=True, text=True, cwd=str(HERE), env=env,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"__run__": {"status": "fail", "detail": f"timed out after {timeout} s"}}
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(runner.RESULTS_MARKER):
            res = json.loads(line[len(runner.RESULTS_MARKER):])
            res["__seconds__"] = round(time.monotonic() - t0, 1)
            return res
    return {"__run__": {"status": "fail", "detail": f"exit {proc.returncode}: {proc.stderr[-3000:]}"}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("groups", nargs="*")
    ap.add_argument("--jobs", type=int, default=4)
    ap.add_argument("--timeout", type=int, default=600)
    ap.add_argument("--out")
    args = ap.parse_args()
    groups = args.groups or sorted(p.stem for p in HERE.glob("cf_*.py"))
    jobs = [(g, v, extra, m) for g in groups for v, extra in _variants(g).items()
            for m in ("torch", "gpumem")]
    results: dict = {}
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        futs = {pool.submit(_run, g, v, extra, m, args.timeout): (g, v, m) for g, v, extra, m in jobs}
        for fut in concurrent.futures.as_completed(futs):
            g, v, m = futs[fut]
            results.setdefault(f"{g}[{v}]", {})[m] = fut.result()
    counts = {"both pass": 0, "torch pass, gpumem fail": 0, "torch fail, gpumem pass": 0,
              "both fail": 0, "both fail, sized for the simulator": 0, "skipped": 0}
    lines = []
    for key in sorted(results):
        t, gm = results[key].get("torch", {}), results[key].get("gpumem", {})
        for check in sorted(set(t) | set(gm)):
            if check.startswith("__s"):
                continue
            a = t.get(check, {}).get("status", "missing")
            b = gm.get(check, {}).get("status", "missing")
            if "skip" in (a, b):
                counts["skipped"] += 1
                continue
            tag = {("pass", "pass"): "both pass", ("pass", "fail"): "torch pass, gpumem fail",
                   ("fail", "pass"): "torch fail, gpumem pass"}.get((a, b), "both fail")
            sized = _sim_memory(key.split("[")[0]) if tag == "both fail" else None
            if sized:
                tag = "both fail, sized for the simulator"
            counts[tag] += 1
            if sized:
                tag += f" ({sized})"
            if tag != "both pass":
                detail = (gm if b == "fail" else t).get(check, {}).get("detail", "")
                last = [x for x in detail.strip().splitlines() if x.strip()][-1:] or [""]
                lines.append(f"{tag}: {key} {check}: {last[0][:300]}")
    for line in lines:
        print(line)
    print(json.dumps({"counts": counts}))
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
