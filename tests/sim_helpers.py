"""Shared helpers of the simulated-GPU tests (tests/test_sim*.py); no tests here.

Every test that needs the simulator runs its code in a subprocess started by
gpumem.sim.run_snippet (the fakes are LD_PRELOADed there, never in the
pytest process), and the snippet prints one JSON line last, which the
helpers return parsed.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import shlex
import shutil
from pathlib import Path
from typing import Any, Optional

import pytest

ROOT = Path(__file__).resolve().parents[1]
CC = shlex.split(os.environ.get("CC", "cc"))
HAVE_CC = shutil.which(CC[0]) is not None


def _torch_reason(simulator: bool = True) -> Optional[str]:
    """Why the torch tests cannot run here, or None.

    simulator=False: for a real GPU, where any CUDA build of torch will do."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.origin:
        return "torch is not importable"
    from gpumem import sim
    from gpumem.sim import torch_cuda
    version = torch_cuda.torch_cuda_version()
    if not version:
        return "torch is not a CUDA build"
    major = int(version.split(".")[0])
    if simulator and major not in sim.CUDA_MAJORS:
        return (f"torch is built for CUDA {major}; the simulator supports CUDA "
                + " and ".join(map(str, sim.CUDA_MAJORS)))
    return None


TORCH_REASON = _torch_reason()
GPU_TORCH_REASON = _torch_reason(simulator=False)
needs_cc = pytest.mark.skipif(not HAVE_CC, reason="no C compiler")
needs_torch = pytest.mark.skipif(TORCH_REASON is not None or not HAVE_CC,
                                 reason=TORCH_REASON or "no C compiler")


@functools.lru_cache(maxsize=None)
def sim_lib_dir(cuda_major: int = 13) -> Path:
    """Build (once per session) and return the directory of one CUDA major
    version's fake libraries."""
    from gpumem import sim
    return sim.lib_dir(cuda_major)


# Prepended to snippets: report() returns the fake runtime's JSON report
# (calls, kernels, the fake driver's accounting, the cuBLAS fakes').
REPORT = r'''
import ctypes as _ct, json as _json
def report():
    lib = _ct.CDLL("libcudart.so.13")
    n = lib.gpumem_sim_cudart_report_json(None, 0)
    buf = _ct.create_string_buffer(n + 1)
    lib.gpumem_sim_cudart_report_json(buf, n + 1)
    return _json.loads(buf.value)
def emit(obj):
    print(_json.dumps(obj))
'''


def run_sim(code: str, *, timeout: float = 300, expect_rc: int = 0, **kw: Any) -> Any:
    """Run code under the simulator; return the JSON its last stdout line holds.

    kw goes to gpumem.sim.run_snippet (memory, devices, events, env).
    """
    from gpumem import sim
    sim_lib_dir()
    rc, out, err = sim.run_snippet(REPORT + code, timeout=timeout, **kw)
    assert rc == expect_rc, f"exit status {rc}\n--- stdout\n{out[-3000:]}\n--- stderr\n{err[-6000:]}"
    # glibc complains like this when a fake lacks the version node a binary asks for
    assert "no version information available" not in err, err[-3000:]
    lines = [line for line in out.splitlines() if line.strip()]
    assert lines, f"no output\n--- stderr\n{err[-3000:]}"
    return json.loads(lines[-1])
