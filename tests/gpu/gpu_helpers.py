"""Helpers of tests/gpu (no tests here).

gpu_probe(): whether this process's CUDA driver reports a GPU, asked in a
    fresh process (gpumem.checkup.cudadriver's probe), once per session.
child_env(): the environment of a child process that runs torch on the GPU
    with the allocator it chooses itself: the shim cache of the tests
    (tests/torch_helpers.py), and none of the variables by which
    ``gpumem simulate`` would install gpumem and record in every process.
run_torch(code, allocator): ``code`` in a child after PRELUDE, which imports
    torch and, for allocator "gpumem", calls gpumem.install(); the child
    prints one JSON line last (emit), which is returned parsed.
tolerance(gpu): how far the driver's figure may be from the allocator's
    (Note [Self-test tolerance] in gpumem/checkup/selftest.py).
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, Optional

from sim_helpers import GPU_TORCH_REASON
from torch_helpers import _env, built_shim, last_json

ROOT = Path(__file__).resolve().parents[2]

PRELUDE = '''
import json, os, sys, time
import torch
ALLOCATOR = sys.argv[1]
if ALLOCATOR == "gpumem":
    import gpumem
    gpumem.install()
MiB = 1 << 20

def emit(obj):
    print(json.dumps(obj), flush=True)

def driver_used(device=0):
    """Bytes in use on the device, as the driver says (cudaMemGetInfo)."""
    free, total = torch.cuda.mem_get_info(device)
    return total - free
'''


@functools.lru_cache(maxsize=None)
def gpu_probe() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in [env.get("PYTHONPATH")] if p])
    proc = subprocess.run([sys.executable, "-m", "gpumem.checkup.cudadriver"], capture_output=True,
                          text=True, cwd=ROOT, env=env, timeout=120)
    try:
        return json.loads(proc.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        return {"present": False, "simulated": False, "gpus": [],
                "reason": f"the GPU probe failed (exit {proc.returncode}): "
                          f"{proc.stderr.strip()[-500:]}"}


def tolerance(gpu: dict) -> int:
    from gpumem.checkup.selftest import REAL_TOLERANCE
    return 0 if gpu["simulated"] else REAL_TOLERANCE


def child_env(extra: Optional[dict] = None) -> dict:
    env = _env(extra)
    for k in [k for k in env if k.startswith("GPUMEM_SIMULATE_")]:
        del env[k]
    if os.environ.get("GPUMEM_SIMULATE_OUT"):
        env.pop("GPUMEM_OOM_SNAPSHOT", None)   # gpumem simulate's: not for these children
    return env


def shim_ready() -> Path:
    """The tests' shim cache, built once (skips the test if a build is impossible here)."""
    return built_shim(GPU_TORCH_REASON)


def run_torch(code: str, allocator: str, *, prelude: str = "", args: tuple = (),
              env: Optional[dict] = None, timeout: float = 600) -> Any:
    """prelude (unindented code, e.g. TRANSFORMER) goes between PRELUDE and code."""
    shim_ready()
    body = PRELUDE + prelude + textwrap.dedent(code)
    proc = subprocess.run([sys.executable, "-c", body, allocator,
                           *map(str, args)], capture_output=True, text=True, cwd=ROOT,
                          env=child_env(env), timeout=timeout)
    assert proc.returncode == 0, (f"{allocator}: exit status {proc.returncode}\n--- stdout\n"
                                  f"{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-6000:]}")
    return last_json(proc.stdout)
