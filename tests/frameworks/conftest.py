"""The shared runner of the framework tests (tests/frameworks/test_*.py) and of
benchmarks/frameworks.py: real training stacks, run as their users run them,
under torch's allocator and under gpumem on the simulated GPU.

Each entry of STACKS is one command: a script of scripts/ that drives a
framework through its own API (Hugging Face Trainer, Lightning, timm,
diffusers), or torchtitan's own launcher.  side_by_side() runs it twice in
a temporary folder, which is the working directory (everything a framework
writes lands there, never in the checkout):
- "torch": ``python -m gpumem.sim --devices N -- CMD``, torch's own allocator;
- "gpumem": ``python -m gpumem.sim.command --devices N --out sim -- CMD``, what
  a user types (``gpumem simulate``), which installs gpumem in every process.

Every Python process of both runs also loads PROBE (a sitecustomize on
PYTHONPATH; under gpumem simulate, whose own sitecustomize chains to it):
once torch is imported it keeps each device's peaks across
torch.cuda.reset_peak_memory_stats() (torchtitan resets them every step),
and at exit a process that initialised CUDA writes its peaks, read with
torch's public API, and its host peak RSS.  The same measurement under
both allocators is what is compared.

A run that outlives its timeout has its whole process group killed (a hang
fails instead of blocking the suite).  Nothing is downloaded: the Hugging
Face libraries run offline, models are built from configs with random
weights, data is synthetic.  Triton's and Inductor's caches are the
session's (tests/conftest.py, compile_caches); a stack that compiles gets
one unmeasured run first (warm_up), so both measured runs compile from a
warm cache.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from sim_helpers import sim_lib_dir  # noqa: E402  (tests/)
from torch_helpers import _env, built_shim  # noqa: E402

SCRIPTS = HERE / "scripts"
ENV_PROBE = "GPUMEM_TEST_PROBE_DIR"

PROBE = '''\
# Written by tests/frameworks/conftest.py: this process's memory peaks, for the test.
import atexit as _atexit, json as _json, os as _os, sys as _sys

_peaks = {}


def _note(torch):
    for d in range(torch.cuda.device_count()):
        stats = torch.cuda.memory_stats(d)
        seen = _peaks.setdefault(d, {"allocated": 0, "reserved": 0})
        seen["allocated"] = max(seen["allocated"], stats.get("allocated_bytes.all.peak", 0))
        seen["reserved"] = max(seen["reserved"], stats.get("reserved_bytes.all.peak", 0))


def _keep_peaks(torch):
    for module in (torch.cuda, torch.cuda.memory):
        reset = module.reset_peak_memory_stats

        def reset_peak_memory_stats(device=None, _reset=reset):
            _note(torch)
            return _reset(device)

        module.reset_peak_memory_stats = reset_peak_memory_stats


class _AfterTorch:
    """Runs _keep_peaks once torch's module has executed (after gpumem's own hook)."""
    finding = False

    def find_spec(self, name, path=None, target=None):
        if name != "torch" or self.finding:
            return None
        import importlib.util
        self.finding = True
        try:
            spec = importlib.util.find_spec("torch")
        finally:
            self.finding = False
        if spec is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            if self in _sys.meta_path:
                _sys.meta_path.remove(self)
            run(module)
            _keep_peaks(module)

        spec.loader.exec_module = exec_module
        return spec


def _finish():
    import resource
    torch = _sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return
    _note(torch)
    out = {"pid": _os.getpid(), "rank": _os.environ.get("RANK"), "argv": _sys.argv[:6],
           "gpumem": "gpumem" in _sys.modules and _sys.modules["gpumem"].is_installed(),
           "rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
           "devices": {str(d): p for d, p in _peaks.items() if p["reserved"]}}
    with open(_os.path.join(_os.environ["%s"], "%%d.json" %% _os.getpid()), "w") as f:
        _json.dump(out, f)


if _os.environ.get("%s"):
    _sys.meta_path.insert(0, _AfterTorch())
    _atexit.register(_finish)
''' % (ENV_PROBE, ENV_PROBE)


@dataclass
class Stack:
    """One command of the matrix.  argv: after the Python interpreter;
    setup: run in the working directory first (same interpreter);
    needs: modules that must be importable; devices: simulated GPUs;
    compiles: the Inductor kernels it compiles, named (stacks that name the
    same compile the same kernels), or "" if it compiles nothing;
    env: extra variables; timeout: seconds per run."""
    argv: list
    needs: tuple
    devices: int = 1
    compiles: str = ""
    setup: Optional[list] = None
    env: dict = field(default_factory=dict)
    timeout: float = 600


def _script(name: str, *args: str) -> list:
    return [str(SCRIPTS / name), *args]


def _torchtitan(ngpu: int) -> Stack:
    """torchtitan's run_train.sh with NGPU=ngpu and its defaults (MODULE=llama3,
    CONFIG=llama3_debugmodel, LOG_RANK=0): PYTORCH_ALLOC_CONF=expandable_segments:True,
    TORCHFT_LIGHTHOUSE=http://localhost:29510 and
    torchrun --nproc_per_node=NGPU --rdzv_backend c10d --rdzv_endpoint=localhost:0
    --local-ranks-filter 0 --role rank --tee 3 -m torchtitan.train --module llama3
    --config llama3_debugmodel ARGS, with ARGS = --training.steps 3 (step 1 runs
    eagerly, step 2 captures forward+backward as a CUDA graph, step 3 replays it).
    torchrun is ``python -m torch.distributed.run``, its entry point."""
    return Stack(
        argv=["-m", "torch.distributed.run", f"--nproc_per_node={ngpu}", "--rdzv_backend", "c10d",
              "--rdzv_endpoint=localhost:0", "--local-ranks-filter", "0", "--role", "rank",
              "--tee", "3", "-m", "torchtitan.train", "--module", "llama3", "--config",
              "llama3_debugmodel", "--training.steps", "3"],
        needs=("torchtitan", "tokenizers", "datasets"), devices=ngpu,
        compiles="torchtitan_debugmodel",
        setup=_script("titan_assets.py", "."),
        # torchtitan stops at a loss that is not finite, and the loss it reads
        # back is bytes no kernel wrote: whatever the reused block held (-inf and
        # NaN once each, under gpumem on 2 GPUs, in full-suite runs). gpumem now
        # has the simulator zero the small blocks it hands out (Note [Blocks
        # handed out]); torch's allocator does not. GPUMEM_FAKECUDA_NO_HOST_MEMORY
        # keeps large copies out of host memory; memory figures are the same.
        env={"PYTORCH_ALLOC_CONF": "expandable_segments:True", "LOG_RANK": "0",
             "TORCHFT_LIGHTHOUSE": "http://localhost:29510",
             "GPUMEM_FAKECUDA_NO_HOST_MEMORY": "1"})


HF = ("transformers", "accelerate")
STACKS = {
    "torchtitan_1gpu": _torchtitan(1),
    "torchtitan_2gpu": _torchtitan(2),
    "hf_trainer": Stack(_script("hf_trainer.py"), HF),
    "hf_trainer_checkpointing": Stack(_script("hf_trainer.py", "--gradient-checkpointing"), HF),
    "hf_trainer_lora": Stack(_script("hf_trainer.py", "--lora"), HF + ("peft",)),
    "hf_trainer_compile": Stack(_script("hf_trainer.py", "--compile"), HF,
                                compiles="hf_trainer"),
    "lightning_bf16": Stack(_script("lightning_fit.py"), ("lightning",)),
    "timm_vit": Stack(_script("timm_step.py"), ("timm",)),
    "diffusers_unet": Stack(_script("diffusers_step.py"), ("diffusers",)),
}

ALLOCATORS = ("torch", "gpumem")


def missing(stack: Stack) -> Optional[str]:
    """Why the stack cannot run here (a framework not importable), or None."""
    absent = [m for m in stack.needs if importlib.util.find_spec(m) is None]
    if absent:
        return (f"{', '.join(absent)} not importable: install the test extra "
                f"(python -m pip install -e '.[test]')")
    return None


@dataclass
class Run:
    allocator: str
    cwd: Path
    returncode: Optional[int]   # None: killed at the timeout
    stdout: str
    stderr: str
    seconds: float
    procs: list                 # the probe's row of every process that used CUDA
    summary: Optional[dict]     # gpumem simulate's summary.json

    def tail(self) -> str:
        return (f"{self.allocator} run in {self.cwd}: exit status {self.returncode}\n--- stdout\n"
                f"{self.stdout[-3000:]}\n--- stderr\n{self.stderr[-6000:]}")

    def peaks(self) -> dict:
        """{(rank, device): {"allocated", "reserved"}} over every process that used CUDA."""
        out = {}
        for p in self.procs:
            for d, v in p["devices"].items():
                out[(p["rank"], int(d))] = v
        return out


def _communicate(cmd: list, cwd: Path, env: dict, timeout: float):
    """(returncode or None, stdout, stderr, seconds): the whole process group is
    killed at the timeout (torchrun's ranks included)."""
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
        rc = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        rc, err = None, err + f"\n[killed: still running after {timeout:.0f} s]"
    return rc, out, err, time.monotonic() - t0


def run_stack(name: str, allocator: str, workdir: Path, caches: dict,
              probe_dir: Path) -> Run:
    """One run of STACKS[name] under one allocator, in workdir/<name>_<allocator>."""
    stack = STACKS[name]
    cwd = workdir / f"{name}_{allocator}"
    probes = cwd / "probe"
    probes.mkdir(parents=True)
    env = _env({**caches, **stack.env, ENV_PROBE: str(probes), "HF_HOME": str(workdir / "hf"),
                "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                "TOKENIZERS_PARALLELISM": "false", "WANDB_MODE": "disabled",
                "MPLCONFIGDIR": str(workdir / "mpl")})
    env["PYTHONPATH"] = os.pathsep.join([str(probe_dir), env["PYTHONPATH"]])
    if stack.setup:
        subprocess.run([sys.executable, *stack.setup], cwd=cwd, env=env, check=True,
                       capture_output=True, timeout=300)
    n = str(stack.devices)
    if allocator == "torch":
        pre = [sys.executable, "-m", "gpumem.sim", "--devices", n, "--"]
    else:
        pre = [sys.executable, "-m", "gpumem.sim.command", "--devices", n, "--out", "sim",
               "--no-view", "--"]
    rc, out, err, secs = _communicate(pre + [sys.executable, *stack.argv], cwd, env,
                                      stack.timeout)
    procs = [json.loads(p.read_text()) for p in sorted(probes.glob("*.json"))]
    summary = cwd / "sim" / "summary.json"
    return Run(allocator, cwd, rc, out, err, secs, procs,
               json.loads(summary.read_text()) if summary.exists() else None)


def write_probe(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(PROBE)
    return folder


def warm_up(name: str, workdir: Path, caches: dict, probe: Path, warmed: set) -> Optional[Run]:
    """An unmeasured run (torch's allocator) of a stack that compiles, unless
    its kernels are in the caches already: a cold compile allocates on the
    device (Inductor benchmarks its candidates), a warm one does not, so both
    measured runs must find the caches in the same state."""
    group = STACKS[name].compiles
    if not group or group in warmed:
        return None
    warmed.add(group)
    return run_stack(name, "torch", workdir / "warmup", caches, probe)


def side_by_side(name: str, workdir: Path, caches: dict, warmed: set) -> dict:
    """{"torch": Run, "gpumem": Run} for STACKS[name], both from warm compile
    caches (warm_up)."""
    why = missing(STACKS[name])
    if why:
        pytest.skip(why)
    sim_lib_dir()
    built_shim()
    probe = write_probe(workdir / "probe_site")
    warm_up(name, workdir, caches, probe, warmed)
    return {a: run_stack(name, a, workdir, caches, probe) for a in ALLOCATORS}


SMALL_BLOCK = 512  # torch's (and gpumem's) smallest block


def check_side_by_side(runs: dict) -> dict:
    """The bar of issue 30: both runs succeeded; per rank and device, peak
    allocated equal and peak reserved under gpumem at most torch's; gpumem
    simulate's own report agrees with torch's figures.  Returns the peaks."""
    torch_run, ours = runs["torch"], runs["gpumem"]
    for run in (torch_run, ours):
        assert run.returncode == 0, run.tail()
        assert run.procs, "no process used the simulated GPU\n" + run.tail()
        assert all(p["gpumem"] == (run is ours) for p in run.procs), (run.procs, run.tail())
    assert ours.summary and ours.summary["exit_status"] == 0, (ours.summary, ours.tail())
    theirs, mine = torch_run.peaks(), ours.peaks()
    assert sorted(theirs) == sorted(mine), (theirs, mine)
    ranks = len({rank for rank, _dev in theirs})
    for key in theirs:
        # Note [One small block between ranks]: in one of two 2-rank
        # torchtitan runs, torch's own allocator gave rank 1 a peak 512 B
        # below rank 0's and below gpumem's (gpumem: both ranks equal, in both
        # runs); the other run was equal throughout. So a multi-rank run may
        # differ by one 512-byte block, never more; a one-rank run is exact.
        slack = SMALL_BLOCK if ranks > 1 else 0
        diff = abs(mine[key]["allocated"] - theirs[key]["allocated"])
        assert diff <= slack, (key, theirs, mine)
        assert mine[key]["reserved"] <= theirs[key]["reserved"], (key, theirs, mine)
    reported = {(str(r["rank"]) if r["rank"] is not None else None, r["device"]):
                (r["peak_allocated"], r["peak_reserved"]) for r in ours.summary["per_device"]}
    assert reported == {k: (v["allocated"], v["reserved"]) for k, v in mine.items()}, (
        reported, mine)
    return {"torch": theirs, "gpumem": mine}


@pytest.fixture(scope="session")
def stack(tmp_path_factory, compile_caches) -> Callable[[str], tuple]:
    """stack(name) -> (runs, peaks): STACKS[name] side by side (run once per
    session), checked by check_side_by_side; skips if a framework is absent."""
    workdir = tmp_path_factory.mktemp("stacks")
    done: dict = {}
    warmed: set = set()

    def run(name: str) -> tuple:
        if name not in done:
            done[name] = side_by_side(name, workdir, compile_caches, warmed)
        return done[name], check_side_by_side(done[name])
    return run
