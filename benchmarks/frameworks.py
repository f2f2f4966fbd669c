"""Real training stacks under torch's allocator and under gpumem, on the simulated GPU.

    python benchmarks/frameworks.py [--only NAME,...] [--no-warmup]

Runs the matrix of tests/frameworks (tests/frameworks/conftest.py, STACKS):
torchtitan's llama3 debug model through its own launcher on 1 and 2 GPUs
(CUDA graphs and expandable segments on, its defaults), Hugging Face
Trainer (plain, gradient checkpointing, PEFT LoRA, torch.compile),
Lightning bf16-mixed, timm and diffusers training steps; and, only when
named in --only, torchtitan_8b_8gpu (Llama 3.1 8B, --config llama3_8b, on
8 simulated GPUs; too heavy for the test matrix: about 3 minutes and 8 x
1.1 GB of host memory per allocator, device memory holding no data).  Each stack runs
once with torch's allocator (python -m gpumem.sim) and once under
gpumem simulate, in a temporary folder; the figures are what every process
that used the device read from torch.cuda.memory_stats(), kept across
resets (the test probe), the highest over ranks; host RSS is the largest
peak RSS of those processes; wall time is the whole command's.

Triton's and Inductor's caches are one temporary folder for the whole run;
a stack that compiles (torchtitan's flex attention, torch.compile) gets one
unmeasured run first (the runner's warm_up), so both measured runs compile
from a warm cache (--no-warmup leaves it out: the torch run then pays the
cold compile, whose peak includes Inductor's benchmarking).
Ratios are gpumem / torch; the bar is 1.0 for allocated and <= 1.0 for
reserved.  A run that failed is reported with its exit status, its first
exception line and the peaks it reached, and the stack gets no ratios.  Prints one JSON object.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _runner():
    spec = importlib.util.spec_from_file_location(
        "frameworks_runner", ROOT / "tests" / "frameworks" / "conftest.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod   # its dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def _figures(run) -> dict:
    peaks = run.peaks()
    out = {"exit_status": run.returncode, "seconds": round(run.seconds, 1),
           "peak_allocated": max((v["allocated"] for v in peaks.values()), default=None),
           "peak_reserved": max((v["reserved"] for v in peaks.values()), default=None),
           "host_rss": max((p["rss"] for p in run.procs), default=None),
           "per_rank": {f"{r}:{d}": v for (r, d), v in sorted(peaks.items(), key=str)}}
    if run.returncode != 0:   # the first exception line names the cause
        lines = [ln.strip() for ln in run.stderr.splitlines() if "Error: " in ln]
        out["error"] = lines[0] if lines else run.stderr.strip()[-300:]
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="", help="comma-separated stack names (default: all)")
    ap.add_argument("--no-warmup", action="store_true",
                    help="no unmeasured run first for the stacks that compile")
    args = ap.parse_args(argv)
    runner = _runner()
    default = list(runner.STACKS)
    runner.STACKS.update(_heavy_stacks(runner))
    names = [n for n in args.only.split(",") if n] or default
    unknown = sorted(set(names) - set(runner.STACKS))
    if unknown:
        ap.error(f"unknown stack(s) {', '.join(unknown)}; known: {', '.join(runner.STACKS)}")
    runner.sim_lib_dir()
    runner.built_shim()
    result = {"machine": {"python": platform.python_version(), "cpus": _cpus(),
                          "load_average_at_start": _load()}, "stacks": {}}
    with tempfile.TemporaryDirectory(prefix="gpumem-frameworks-") as tmp:
        work = Path(tmp)
        caches = {"TRITON_CACHE_DIR": str(work / "triton"),
                  "TORCHINDUCTOR_CACHE_DIR": str(work / "inductor")}
        probe = runner.write_probe(work / "probe_site")
        warmed: set = set()
        for name in names:
            stack = runner.STACKS[name]
            why = runner.missing(stack)
            if why:
                result["stacks"][name] = {"skipped": why}
                continue
            row = {}
            warm = None if args.no_warmup else runner.warm_up(name, work, caches, probe, warmed)
            if warm is not None:
                row["warmup_seconds"] = round(warm.seconds, 1)
            t0 = time.time()
            for alloc in runner.ALLOCATORS:
                row[alloc] = _figures(runner.run_stack(name, alloc, work, caches, probe))
            a, b = row["torch"], row["gpumem"]
            if a["exit_status"] == 0 and b["exit_status"] == 0:   # a failed run's peak is partial
                row["ratio_allocated"] = round(b["peak_allocated"] / a["peak_allocated"], 4)
                row["ratio_reserved"] = round(b["peak_reserved"] / a["peak_reserved"], 4)
            row["seconds_both"] = round(time.time() - t0, 1)
            result["stacks"][name] = row
            print(f"{name}: done", file=sys.stderr, flush=True)
    result["machine"]["load_average_at_end"] = _load()
    print(json.dumps(result, indent=1))


def _heavy_stacks(runner) -> dict:
    """Stacks run only when --only names them.  torchtitan_8b_8gpu: the
    1-GPU debug model's launcher and defaults with --config llama3_8b and the
    debug config's tokenizer and c4_test data, on 8 ranks, without host
    memory behind the simulated devices (GPUMEM_FAKECUDA_NO_HOST_MEMORY=1)."""
    base = runner._torchtitan(8)
    argv = ["llama3_8b" if a == "llama3_debugmodel" else a for a in base.argv]
    argv += ["--hf_assets_path", "./tests/assets/tokenizer", "--dataloader.dataset", "c4_test",
             "--profiler.no-enable-profiling", "--metrics.no-enable-tensorboard"]
    return {"torchtitan_8b_8gpu": runner.Stack(
        argv=argv, needs=base.needs, devices=8, compiles="torchtitan_8b", setup=base.setup,
        env=dict(base.env, GPUMEM_FAKECUDA_NO_HOST_MEMORY="1"), timeout=3000)}


def _cpus() -> int:
    return len(os.sched_getaffinity(0))


def _load() -> list:
    return [round(x, 2) for x in os.getloadavg()]


if __name__ == "__main__":
    main()
