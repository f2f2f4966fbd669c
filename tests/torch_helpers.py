"""Shared helpers of the torch drop-in tests (tests/test_torch_*.py); no tests here.

Every test runs its code in a subprocess: under the simulated GPU
(gpumem.sim.run_snippet) when it needs CUDA, as plain Python otherwise, so
the pytest process never imports torch or loads a fake CUDA library.

The torch shim is built once per session into one cache directory
(GPUMEM_TEST_SHIM_CACHE, default build/test-shim-cache in the checkout),
which every subprocess then uses with GPUMEM_SHIM_BUILD=0: a shim that is
stale or built for another torch makes the test fail instead of being
rebuilt behind its back. The tests skip, with the reason, only when a build
is impossible here (no torch with CUDA 13, no C/C++ compiler, no ninja, no
CUDA runtime headers); a build that fails is a test failure.
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

import pytest

from sim_helpers import HAVE_CC, REPORT, TORCH_REASON

ROOT = Path(__file__).resolve().parents[1]
SHIM_CACHE = Path(os.environ.get("GPUMEM_TEST_SHIM_CACHE") or ROOT / "build" / "test-shim-cache")


@functools.lru_cache(maxsize=None)
def _skip_reason(torch_reason: Optional[str] = TORCH_REASON) -> Optional[str]:
    if torch_reason:
        return torch_reason
    if not HAVE_CC:
        return "no C compiler (the simulator's libraries need one)"
    proc = subprocess.run([sys.executable, "-m", "gpumem.pytorch.shim_build", "--prerequisites"],
                          capture_output=True, text=True, cwd=ROOT, env=_env())
    if proc.returncode == 3:
        return "the torch shim cannot be built here: " + proc.stdout.strip()
    assert proc.returncode == 0, proc.stderr[-3000:]
    return None


def _env(extra: Optional[dict] = None) -> dict:
    env = dict(os.environ)
    env["GPUMEM_CACHE_DIR"] = str(SHIM_CACHE)
    env["GPUMEM_SHIM_BUILD"] = "0"
    for k in ("GPUMEM_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"):
        env.pop(k, None)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in
                                                        [env.get("PYTHONPATH", "")] if p])
    if extra:
        env.update(extra)
    return env


@functools.lru_cache(maxsize=None)
def built_shim(torch_reason: Optional[str] = TORCH_REASON) -> Path:
    """Build the shim (once per session) and return the cache root.

    torch_reason: why torch cannot be used, or None (default: the
    simulator's TORCH_REASON; tests/gpu pass GPU_TORCH_REASON)."""
    why = _skip_reason(torch_reason)
    if why:
        pytest.skip(why)
    _build_shim_once()
    return SHIM_CACHE


@functools.lru_cache(maxsize=None)
def _build_shim_once() -> None:
    """Build (or check) the shim and its record_function module in SHIM_CACHE,
    once per test process: the check alone imports torch (about 3.5 s), and
    nothing in the suite removes the cache."""
    env = _env({"GPUMEM_SHIM_BUILD": "1"})
    proc = subprocess.run([sys.executable, "-m", "gpumem.pytorch.shim_build"], capture_output=True,
                          text=True, cwd=ROOT, env=env, timeout=900)
    assert proc.returncode == 0, f"building the torch shim failed:\n{proc.stderr[-6000:]}"


def run_py(code: str, *, env: Optional[dict] = None, timeout: float = 300,
           expect_rc: Optional[int] = 0) -> subprocess.CompletedProcess:
    """Run code with plain Python (no simulator) in the shim's environment."""
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, cwd=ROOT, env=_env(env), timeout=timeout)
    if expect_rc is not None:
        assert proc.returncode == expect_rc, (
            f"exit status {proc.returncode}\n--- stdout\n{proc.stdout[-3000:]}\n"
            f"--- stderr\n{proc.stderr[-6000:]}")
    return proc


def last_json(out: str) -> Any:
    lines = [line for line in out.splitlines() if line.strip()]
    assert lines, "no output"
    return json.loads(lines[-1])


# Ends every snippet: torch's autograd device thread may drop its last
# GraphTask while the interpreter finalizes and abort the process ("terminate
# called without an active exception", simgpu/README.md, Limitations) when it
# exits right after backward(); a short pause lets the thread finish first.
# Seen in a loaded full-suite run (test_torch_expandable.py, after its result
# was printed).
SETTLE = "\nimport time as _settle_time\n_settle_time.sleep(0.1)\n"


def run_gm(code: str, *, prelude: str = "", install: bool = True, events: Optional[str] = None,
           memory: str = "80GiB", devices: int = 1, env: Optional[dict] = None,
           timeout: float = 300, expect_rc: int = 0) -> Any:
    """Run code on the simulated GPU after `import torch, gpumem` (and
    gpumem.install() unless install=False); returns the JSON of the last
    stdout line (the snippet calls emit(obj)). report() gives the fake
    runtime's report (see sim_helpers.REPORT). prelude (unindented
    code, e.g. TRANSFORMER) goes after the install."""
    built_shim()
    from gpumem import sim
    head = "import torch, gpumem\n" + ("gpumem.install()\n" if install else "")
    body = REPORT + head + prelude + textwrap.dedent(code) + SETTLE
    rc, out, err = sim.run_snippet(body, memory=memory, devices=devices, events=events,
                                   env=_env(env), timeout=timeout)
    assert rc == expect_rc, (f"exit status {rc}\n--- stdout\n{out[-3000:]}\n"
                             f"--- stderr\n{err[-6000:]}")
    return last_json(out)


# A small Transformer with AdamW (shared by the tests and the benchmark's idea).
TRANSFORMER = '''
def make_model(d_model=64, layers=2):
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(d_model=d_model, nhead=4,
                                             dim_feedforward=2 * d_model, batch_first=True)
    model = torch.nn.Sequential(torch.nn.TransformerEncoder(layer, num_layers=layers),
                                torch.nn.Linear(d_model, 10)).cuda()
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)

def train_step(model, opt, x):
    loss = model(x).float().pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss

def measured_steps(model, opt, x, n):
    """n steps; each one's peak allocated, and allocated and reserved at its end."""
    out = {"peaks": [], "allocated": [], "reserved": []}
    for _ in range(n):
        torch.cuda.reset_peak_memory_stats()
        train_step(model, opt, x)
        torch.cuda.synchronize()
        out["peaks"].append(torch.cuda.max_memory_allocated())
        out["allocated"].append(torch.cuda.memory_allocated())
        out["reserved"].append(torch.cuda.memory_reserved())
    return out

def timed_steps(model, opt, x, n):
    """n steps; microseconds of this process's CPU time (all its threads:
    autograd's too) per step, which other processes on a shared machine
    disturb less than wall time; on the simulated GPU a step is all CPU
    work."""
    import time
    torch.cuda.synchronize()
    t0 = time.process_time()
    for _ in range(n):
        train_step(model, opt, x)
    torch.cuda.synchronize()
    return (time.process_time() - t0) / n * 1e6
'''
