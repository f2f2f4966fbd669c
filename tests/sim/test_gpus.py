"""Named GPU models on the simulator (gpumem.sim.gpus, --gpu MODEL).

The presets reach torch through the fake driver, and sizes torch derives
from the device (the staging buffer of a reduction follows the SM count and
the threads per SM) change with the model.
"""

from __future__ import annotations

import json
import sys
import textwrap

import pytest

from gpumem.sim import gpus as sim_gpus
from sim_helpers import needs_torch, run_sim

PROPS = textwrap.dedent('''
    import json, torch
    p = torch.cuda.get_device_properties(0)
    print(json.dumps({"name": p.name, "sm": p.multi_processor_count, "memory": p.total_memory,
                      "cc": f"{p.major}.{p.minor}", "l2": p.L2_cache_size,
                      "threads_per_sm": p.max_threads_per_multi_processor,
                      "smem_per_sm": p.shared_memory_per_multiprocessor,
                      "smem_per_block_optin": p.shared_memory_per_block_optin,
                      "regs_per_sm": p.regs_per_multiprocessor}))
''')


def expected(model):
    return {k: model[k] for k in ("name", "sm", "memory", "cc", "l2", "threads_per_sm",
                                  "smem_per_sm", "smem_per_block_optin", "regs_per_sm")}


def test_lookup_ignores_case_and_separators():
    assert sim_gpus.lookup("h100_sxm_80gb").key == "H100-SXM-80GB"
    assert sim_gpus.lookup("RTX 4090").key == "RTX-4090"
    with pytest.raises(ValueError, match="unknown GPU model 'H300'.*H100-SXM-80GB.*RTX-4090"):
        sim_gpus.lookup("H300")


def test_every_preset_names_a_distinct_device():
    assert len({m["name"] for m in sim_gpus.MODELS.values()}) == len(sim_gpus.MODELS)
    for m in sim_gpus.MODELS.values():
        assert m["smem_per_block_optin"] < m["smem_per_sm"]
        # nominal capacities are whole GiB; the H200's is a real one's reading
        assert (m["memory"] % (1 << 30) == 0) != (m.key == "H200-141GB")
    assert sim_gpus.MODELS["H100-SXM-80GB"]["sm"] == 132
    assert sim_gpus.MODELS["H100-SXM-80GB"]["memory"] == 80 << 30


@pytest.mark.slow  # fast tier: one test of this kind is enough (README, Test)
@needs_torch
def test_the_default_device_is_the_h100_preset():
    """Without --gpu the fake driver's own properties are the preset's."""
    out = run_sim(PROPS, memory="80GiB")
    assert out == expected(sim_gpus.MODELS[sim_gpus.DEFAULT])


@pytest.mark.slow
@needs_torch
@pytest.mark.parametrize("key", [k for k in sim_gpus.MODELS if k != sim_gpus.DEFAULT])
def test_each_preset_reaches_torch(key):
    out = run_sim(PROPS, memory=None, gpu=key)
    assert out == expected(sim_gpus.MODELS[key])


@pytest.mark.slow  # fast tier: one test of this kind is enough (README, Test)
@needs_torch
def test_the_reduction_staging_buffer_follows_the_model():
    """torch sizes a full reduction's grid by SMs x threads per SM, and
    allocates a staging buffer per block: the same x.sum() allocates
    different sizes on different GPUs."""
    code = textwrap.dedent('''
        import json, torch
        x = torch.ones(2**24, device="cuda")
        torch.cuda.memory._record_memory_history()
        s = x.sum()
        t = torch.cuda.memory._snapshot()["device_traces"][0]
        print(json.dumps(sorted({e["size"] for e in t if e["action"] == "alloc"})))
    ''')
    sizes = {}
    for key in ("H100-SXM-80GB", "A100-SXM-80GB", "L4"):
        m = sim_gpus.MODELS[key]
        sizes[key] = set(run_sim(code, memory=None, gpu=key))
        staging = m["sm"] * m["threads_per_sm"] // 128
        assert staging in sizes[key], (key, staging, sizes[key])
    assert sizes["H100-SXM-80GB"] != sizes["L4"] != sizes["A100-SXM-80GB"]
    assert 2112 in sizes["H100-SXM-80GB"] and 696 in sizes["L4"]


@pytest.mark.slow
@needs_torch
def test_the_h200_preset_answers_what_a_real_h200_answered():
    """One H200 (driver 580.159.04, torch 2.11.0+cu130; docs/benchmarks.md,
    "On a GPU") gave these figures once CUDA initialised; the simulator
    with --gpu H200-141GB and no --memory gives the same, on any torch."""
    out = run_sim(textwrap.dedent('''
        import json, torch
        torch.cuda.init()
        free, total = torch.cuda.mem_get_info()
        p = torch.cuda.get_device_properties(0)
        print(json.dumps([free, total, p.total_memory, p.L2_cache_size, p.name]))
    '''), memory=None, gpu="H200-141GB")
    assert out == [149_557_477_376, 150_109_880_320, 150_109_880_320, 60 << 20, "NVIDIA H200"]


@pytest.mark.slow   # fast tier: 120 s of CPU at most (README, Test)
@needs_torch
def test_a_bad_gpu_spec_fails_cuinit_with_one_line():
    from gpumem import sim
    rc, out, err = sim.run_snippet("import torch; print(torch.cuda.is_available())",
                                   env={"GPUMEM_SIM_GPU": "name=X;sm=many"})
    assert out.strip() == "False", (out, err)
    assert "fakecuda: GPUMEM_SIM_GPU is invalid: bad value for 'sm'" in err, err


@pytest.mark.slow
@needs_torch
def test_simulate_takes_a_model(tmp_path):
    import subprocess
    proc = subprocess.run([sys.executable, "-m", "gpumem", "simulate", "--gpu", "l4", "--json",
                           "--no-view", "--out", str(tmp_path / "out"), "--", sys.executable,
                           "-c", "import torch; x = torch.zeros(1024, device='cuda'); "
                           "print(torch.cuda.get_device_name())"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.startswith("NVIDIA L4\n"), proc.stdout[:200]
    report = json.loads(proc.stdout.split("\n", 1)[1])
    assert report["memory"] == 24 << 30 and report["gpu"]["model"] == "L4"
    assert report["gpu"]["sm_count"] == 58
    bad = subprocess.run([sys.executable, "-m", "gpumem", "simulate", "--gpu", "H300", "--",
                          sys.executable, "-c", "pass"], capture_output=True, text=True,
                         timeout=60)
    assert bad.returncode == 2 and len(bad.stderr.splitlines()) == 1, bad.stderr
    assert "unknown GPU model 'H300'" in bad.stderr and "A10G" in bad.stderr
