"""tests/gpu, the suite for a GPU, from the main suite: without a GPU every
test there is skipped with the reason, and under the simulator
(``gpumem simulate -- python -m pytest tests/gpu``) all of it passes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from sim_helpers import ROOT, needs_torch, sim_lib_dir


def no_driver_env() -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("GPUMEM_SIM", "GPUMEM_FAKECUDA", "GPUMEM_LIBCUDA", "LD_PRELOAD"))}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in [env.get("PYTHONPATH")] if p])
    return env


@pytest.mark.slow  # a pytest run of tests/gpu (2 s)
def test_without_a_gpu_every_test_is_skipped_with_the_reason():
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
                           "tests/gpu"], capture_output=True, text=True, cwd=ROOT,
                          env=no_driver_env(), timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:]
    summary = proc.stdout.strip().splitlines()[-1]
    assert "skipped" in summary and "passed" not in summary and "failed" not in summary, summary
    reasons = [l for l in proc.stdout.splitlines() if l.startswith("SKIPPED")]
    assert reasons and all("needs a GPU: no NVIDIA driver: cannot load the CUDA driver library "
                           "libcuda.so.1" in l and "gpumem simulate -- python -m pytest tests/gpu"
                           in l for l in reasons), reasons


@pytest.mark.slow  # fast tier: one test of this kind is enough (README, Test)
def test_the_fake_driver_alone_is_not_a_gpu():
    env = no_driver_env()
    env["GPUMEM_LIBCUDA"] = str(sim_lib_dir() / "libcuda.so.1")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
                           "tests/gpu/test_gpu_backend.py"], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:]
    reasons = [l for l in proc.stdout.splitlines() if l.startswith("SKIPPED")]
    assert reasons and all("the driver is gpumem's fake one" in l for l in reasons), reasons


@pytest.mark.slow
@needs_torch
def test_the_gpu_suite_passes_under_gpumem_simulate(tmp_path):
    results = tmp_path / "side_by_side.json"
    env = no_driver_env()
    env["GPUMEM_GPU_RESULTS"] = str(results)
    proc = subprocess.run([sys.executable, "-m", "gpumem", "simulate", "--no-view", "--out",
                           str(tmp_path / "out"), "--", sys.executable, "-m", "pytest", "-q",
                           "-rs", "-p", "no:cacheprovider", "tests/gpu"],
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    summary = next(l for l in lines if " passed" in l and " in " in l)
    assert "failed" not in summary and "error" not in summary, summary
    # the only skip: the test that needs two GPUs
    skips = [l for l in lines if l.startswith("SKIPPED")]
    assert len(skips) <= 1 and all("needs 2 GPUs" in l for l in skips), skips
    printed = next(l for l in lines if l.startswith("gpu side by side: "))
    figures = json.loads(printed.split(": ", 1)[1])
    assert figures == json.loads(results.read_text())
    assert figures["simulated"] is True and figures["device"] == "NVIDIA H100 80GB HBM3"
    for m in ("empty_del_us", "train_step_ms", "peak_reserved_bytes", "recording_overhead_ms",
              "dump_s", "snapshot_bytes"):
        assert set(figures[m]) == {"torch", "gpumem", "ratio"}, figures[m]
