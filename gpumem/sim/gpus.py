"""The GPU models the simulator can be: ``gpumem simulate --gpu MODEL``.

Each preset holds the properties NVIDIA publishes for the model (the
product pages and data sheets, and the CUDA programming guide's table of
per-compute-capability limits for threads, blocks, registers and shared
memory per SM).  They reach torch through the fake driver's
cuDeviceGetAttribute / cuDeviceGetName (GPUMEM_SIM_GPU, parsed by
simgpu/driver/fakecuda_gpu.c), so ``torch.cuda.get_device_properties()``
and every size torch derives from them (the staging buffers of its
reductions follow the SM count, cuBLAS's workspace the architecture) are
those of the model.

Memory is the model's nominal capacity taken in GiB (80 GB -> 80 GiB); a
real driver reports a little less (ECC and the driver's own reservations),
and ``--memory`` overrides it.  Where a real GPU of the model has been
read (the H200: benchmarks/real_gpu_peaks.py, docs/benchmarks.md), its
cuMemGetInfo total and context memory replace the nominal figure and the
estimate.  The default model, H100-SXM-80GB, is what
the fake driver reports when GPUMEM_SIM_GPU is not set.

Bandwidths (``mem_bw_gbs``: device memory; ``pcie_gbs``: the host link, one
direction) are the data sheets' figures; they set how long copies and
memsets take on the simulator's device timeline.

Context memory (``context_memory``, bytes): what the primary context holds once
CUDA is initialised, which cudaMemGetInfo reports as used and no
allocation can have.  NVIDIA publishes no figure; it is estimated as
``CONTEXT_BASE_MIB`` plus the local memory the driver reserves for the
default 1 KiB stack (cudaLimitStackSize) of every thread the GPU can hold
at once (SMs x threads per SM), rounded up to 2 MiB: 514 MiB on an H100
SXM, 466 MiB on an A100, 338 MiB on an L4.  Sources and rationale are in
simgpu/driver/README.md ("Context memory"); GPUMEM_SIM_CONTEXT_MEMORY
overrides it.
"""

from __future__ import annotations

from typing import Any, Dict

__all__ = ["GpuModel", "MODELS", "DEFAULT", "lookup", "spec", "describe", "names_line"]

GiB = 1 << 30


class GpuModel(dict):
    """One preset: name, memory (bytes) and the driver's attributes."""

    @property
    def key(self) -> str:
        return self["key"]


# The fixed part of a context (driver heaps, the runtime's and PyTorch's
# lazily loaded modules, cuBLAS handles' code): chosen so that a mid-size
# GPU lands near the ~300 MiB PyTorch's maintainers quote for CUDA 11.7+
# with lazy module loading (pytorch/pytorch#107667).
CONTEXT_BASE_MIB = 250


def context_mib(sm: int, threads_per_sm: int) -> int:
    """Estimated context memory: the base plus 1 KiB of stack per resident
    thread, rounded up to 2 MiB."""
    mib = CONTEXT_BASE_MIB + (sm * threads_per_sm * 1024 + (1 << 20) - 1) // (1 << 20)
    return (mib + 1) // 2 * 2


def _model(key: str, name: str, memory_gib: int, sm: int, cc: str, *, threads_per_sm: int,
           blocks_per_sm: int, smem_per_sm_kib: int, l2_mib: int, clock_mhz: int,
           mem_clock_mhz: int, bus_bits: int, mem_bw_gbs: int, pcie_gbs: int,
           measured_memory: int = 0, measured_context: int = 0) -> GpuModel:
    """measured_memory / measured_context: bytes read on a real GPU of this
    model (cuMemGetInfo's total; total minus free once CUDA initialised),
    which replace the nominal capacity and the estimate."""
    return GpuModel(key=key, name=name, memory=measured_memory or memory_gib * GiB, sm=sm, cc=cc,
                    threads_per_sm=threads_per_sm, blocks_per_sm=blocks_per_sm,
                    smem_per_sm=smem_per_sm_kib * 1024,
                    # the opt-in per-block limit is the SM's less 1 KiB the
                    # system reserves per block
                    smem_per_block_optin=(smem_per_sm_kib - 1) * 1024,
                    l2=l2_mib << 20, regs_per_sm=65536, clock_khz=clock_mhz * 1000,
                    mem_clock_khz=mem_clock_mhz * 1000, bus_bits=bus_bits,
                    mem_bw_gbs=mem_bw_gbs, pcie_gbs=pcie_gbs,
                    context_memory=measured_context or context_mib(sm, threads_per_sm) << 20)


# Per compute capability (CUDA C++ Programming Guide, "Technical
# Specifications per Compute Capability"): 9.0 and 8.0: 2048 threads, 32
# blocks, 228 / 164 KiB shared memory per SM; 8.6: 1536 threads, 16 blocks,
# 100 KiB; 8.9: 1536 threads, 24 blocks, 100 KiB.
_H = dict(threads_per_sm=2048, blocks_per_sm=32, smem_per_sm_kib=228)
_A = dict(threads_per_sm=2048, blocks_per_sm=32, smem_per_sm_kib=164)
_GA10X = dict(threads_per_sm=1536, blocks_per_sm=16, smem_per_sm_kib=100)
_ADA = dict(threads_per_sm=1536, blocks_per_sm=24, smem_per_sm_kib=100)

MODELS: Dict[str, GpuModel] = {m.key: m for m in (
    _model("H100-SXM-80GB", "NVIDIA H100 80GB HBM3", 80, 132, "9.0", l2_mib=50,
           clock_mhz=1980, mem_clock_mhz=2619, bus_bits=5120, mem_bw_gbs=3350, pcie_gbs=64,
           **_H),
    _model("H100-PCIe-80GB", "NVIDIA H100 PCIe", 80, 114, "9.0", l2_mib=50,
           clock_mhz=1755, mem_clock_mhz=1593, bus_bits=5120, mem_bw_gbs=2000, pcie_gbs=64,
           **_H),
    # Measured on one H200 (driver 580.159.04, torch 2.11.0+cu130): cuMemGetInfo
    # total 150,109,880,320 B (139.80 GiB), 552,402,944 B used once CUDA
    # initialised, L2 60 MiB (torch's L2_cache_size).
    _model("H200-141GB", "NVIDIA H200", 141, 132, "9.0", l2_mib=60,
           clock_mhz=1980, mem_clock_mhz=3201, bus_bits=6144, mem_bw_gbs=4800, pcie_gbs=64,
           measured_memory=150_109_880_320, measured_context=552_402_944, **_H),
    _model("A100-SXM-80GB", "NVIDIA A100-SXM4-80GB", 80, 108, "8.0", l2_mib=40,
           clock_mhz=1410, mem_clock_mhz=1593, bus_bits=5120, mem_bw_gbs=2039, pcie_gbs=32,
           **_A),
    _model("A100-SXM-40GB", "NVIDIA A100-SXM4-40GB", 40, 108, "8.0", l2_mib=40,
           clock_mhz=1410, mem_clock_mhz=1215, bus_bits=5120, mem_bw_gbs=1555, pcie_gbs=32,
           **_A),
    _model("L4", "NVIDIA L4", 24, 58, "8.9", l2_mib=48,
           clock_mhz=2040, mem_clock_mhz=6251, bus_bits=192, mem_bw_gbs=300, pcie_gbs=32,
           **_ADA),
    _model("A10G", "NVIDIA A10G", 24, 80, "8.6", l2_mib=6,
           clock_mhz=1710, mem_clock_mhz=6251, bus_bits=384, mem_bw_gbs=600, pcie_gbs=32,
           **_GA10X),
    _model("RTX-4090", "NVIDIA GeForce RTX 4090", 24, 128, "8.9", l2_mib=72,
           clock_mhz=2520, mem_clock_mhz=10501, bus_bits=384, mem_bw_gbs=1008, pcie_gbs=32,
           **_ADA),
)}

DEFAULT = "H100-SXM-80GB"

_SPEC_KEYS = ("name", "sm", "cc", "threads_per_sm", "blocks_per_sm", "smem_per_sm",
              "smem_per_block_optin", "l2", "regs_per_sm", "clock_khz", "mem_clock_khz",
              "bus_bits", "mem_bw_gbs", "pcie_gbs")


def _fold(text: str) -> str:
    return "".join(ch for ch in text.lower() if ch.isalnum())


def names_line() -> str:
    return ", ".join(MODELS)


def lookup(name: str) -> GpuModel:
    """The preset called ``name`` (case, '-', '_' and spaces ignored:
    'h100-sxm-80gb', 'H100_SXM_80GB'); ValueError naming the presets."""
    want = _fold(str(name))
    for key, model in MODELS.items():
        if _fold(key) == want:
            return model
    raise ValueError(f"unknown GPU model {str(name)[:60]!r}; the simulator knows "
                     f"{names_line()}")


def spec(model: GpuModel) -> str:
    """The GPUMEM_SIM_GPU value the fake driver reads for ``model``."""
    return ";".join([f"{k}={model[k]}" for k in _SPEC_KEYS]
                    + [f"context_kib={model['context_memory'] >> 10}"])


def describe(model: GpuModel) -> Dict[str, Any]:
    """What a report shows of the model."""
    return {"model": model.key, "name": model["name"], "sm_count": model["sm"],
            "compute_capability": model["cc"], "memory": model["memory"],
            "context_memory": model["context_memory"]}
