"""Shared fixtures of the simulated GPU's tests (simgpu/, tests/sim/).

fakecuda: build(variant="fallback") -> the fake driver libcuda.so.1, built
    into build/test-fakecuda/<variant> (git-ignored) when its sources or
    flags changed, so a warm run compiles nothing: "fallback" compiles it against
    simgpu/driver/cuda_min.h, "cuda_h" against NVIDIA's cuda.h (skips where
    that is not installed), "auto" takes cuda.h where there is one.

The helpers these tests share with the rest of the suite are modules beside
them: tests/sim_helpers.py (run_sim, needs_torch, the fake libraries'
directory), tests/torch_helpers.py (the torch shim, run_gm) and
tests/sim/driver_helpers.py (the fake driver's build and scenario runner).
"""

import pytest

from driver_helpers import CUDA_INCLUDE, fcbuild
from sim_helpers import ROOT


@pytest.fixture(scope="session")
def fakecuda():
    root = ROOT / "build" / "test-fakecuda"
    built = {}

    def build(variant="fallback"):
        if variant == "auto":
            variant = "fallback" if CUDA_INCLUDE is None else "cuda_h"
        if variant == "cuda_h" and CUDA_INCLUDE is None:
            pytest.skip("cuda.h not installed")
        if variant not in built:
            include = CUDA_INCLUDE if variant == "cuda_h" else None
            built[variant] = fcbuild.build_fakecuda(root / variant, cuda_include=include)
        return built[variant]

    return build
