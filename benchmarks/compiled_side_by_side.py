"""Compiled training under PyTorch's caching allocator and under gpumem, side by side,
on the simulated GPU.

    python benchmarks/compiled_side_by_side.py [--modes eager,default,reduce-overhead] [--layers 2]

Each (mode, allocator) pair runs examples/compiled_fit.py (a small GPT's
forward, backward and AdamW step, eager or under torch.compile) in its own
process under gpumem.sim; "gpumem" is the same script after
gpumem.install(). The figures are the peaks of the steps after the first
(the first compiles and, for reduce-overhead, records the CUDA graphs).
Triton's and Inductor's caches are shared by all runs (a temporary folder),
and one unmeasured run per mode fills them first, so every measured run
compiles from a warm cache, as the second run of a training script does.

Ratios are gpumem / torch; the target is <= 1.0 for peak reserved.
Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

EXAMPLE = ROOT / "examples" / "compiled_fit.py"
RUNNER = '''
import os, runpy, sys
if sys.argv[1] == "gpumem":
    import gpumem
    gpumem.install()
script = sys.argv[2]
sys.argv = [script] + sys.argv[3:]
sys.path.insert(0, os.path.dirname(script))   # as `python script` does
runpy.run_path(script, run_name="__main__")
'''


def run(allocator: str, mode: str, extra: list[str], env: dict) -> dict:
    cmd = [sys.executable, "-m", "gpumem.sim", "--", sys.executable, "-c", RUNNER, allocator,
           str(EXAMPLE), "--mode", mode, *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=1800)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("mode=")]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"{allocator} {mode} failed (exit status {proc.returncode}):\n"
                         f"{proc.stderr[-3000:]}")
    fields = dict(kv.split("=", 1) for kv in lines[-1].split())
    return {k: int(v) for k, v in fields.items() if k != "mode"}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--modes", default="eager,default,reduce-overhead",
                    help="comma-separated compiled_fit.py modes")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--width", type=int, default=256)
    args = ap.parse_args(argv)
    extra = ["--layers", str(args.layers), "--width", str(args.width)]
    results = {}
    with tempfile.TemporaryDirectory(prefix="gpumem-compile-") as tmp:
        env = dict(os.environ)
        env.update({"TRITON_CACHE_DIR": os.path.join(tmp, "triton"),
                    "TORCHINDUCTOR_CACHE_DIR": os.path.join(tmp, "inductor"),
                    "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT),
                                                                os.environ.get("PYTHONPATH")]))})
        for mode in args.modes.split(","):
            if mode != "eager":
                run("torch", mode, extra, env)            # fills the caches, not measured
            t, g = run("torch", mode, extra, env), run("gpumem", mode, extra, env)
            results[mode] = {
                "torch": t, "gpumem": g,
                "peak_allocated_ratio": round(g["peak_allocated"] / t["peak_allocated"], 4),
                "peak_reserved_ratio": round(g["peak_reserved"] / t["peak_reserved"], 4),
            }
    print(json.dumps({"benchmark": "compiled_side_by_side", "layers": args.layers,
                      "width": args.width, "results": results}, indent=1))


if __name__ == "__main__":
    main()
