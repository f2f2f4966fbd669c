"""``gpumem doctor`` and the driver backend's self-test on the GPU.

The self-test runs in this process, one test per step, each checked by the
self-test against cuMemGetInfo; ``gpumem doctor --json`` runs in a child and
must pass and recognise the GPU (real or simulated) the probe found.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from gpu_helpers import ROOT, child_env, shim_ready

STEPS = ["allocate", "free", "split", "expandable", "cross-stream", "oom"]


@pytest.fixture(scope="module")
def selftest(driver):
    from gpumem.checkup import selftest as _selftest
    return _selftest.run(0, driver=driver)


@pytest.mark.parametrize("step", STEPS)
def test_selftest_step(selftest, gpu, step):
    found = {s["name"]: s for s in selftest["steps"]}
    s = found[step]
    if step == "expandable" and not gpu["gpus"][0]["vmm"]:
        assert s["status"] == "skipped", s
        pytest.skip("GPU 0 has no virtual memory management")
    assert s["status"] == "ok", s["detail"]
    if step == "cross-stream" and gpu["simulated"]:
        # the simulated driver holds the stream deterministically
        assert s["detail"].startswith("not reused while the stream was busy"), s["detail"]


def test_doctor_passes_and_recognises_the_gpu(gpu):
    shim_ready()
    proc = subprocess.run([sys.executable, "-m", "gpumem", "doctor", "--json"],
                          capture_output=True, text=True, cwd=ROOT, env=child_env(),
                          timeout=300)
    rep = json.loads(proc.stdout)
    failed = [f for f in rep["findings"] if f["status"] == "fail"]
    assert proc.returncode == 0 and rep["exit_status"] == 0, (failed, proc.stderr[-3000:])
    assert rep["simulated"] == gpu["simulated"]
    assert [g["name"] for g in rep["driver"]["gpus"]] == [g["name"] for g in gpu["gpus"]]
    assert [s["name"] for s in rep["selftest"]["steps"]] == STEPS
    assert rep["shim"]["built"] is True
    text = " ".join(f["text"] for f in rep["findings"] if f["topic"] == "driver")
    assert ("simulated GPU" in text) == (gpu["launcher"] is not None)
    assert rep["verdict"].startswith("OK")
    if gpu["simulated"]:
        assert "simulated GPU, not real hardware" in rep["verdict"]
