"""benchmarks/sim_fidelity.py: the simulated GPU allocates exactly what
arithmetic says a real GPU allocates, on the workloads where that is known
(the seed article's Linear layer, event by event; an MLP with AdamW; conv
output sizes; the reduction's staging buffer on every GPU model)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from sim_helpers import needs_torch, sim_lib_dir
from torch_helpers import ROOT, _env

pytestmark = [pytest.mark.slow, needs_torch]


def test_every_workload_is_exact():
    sim_lib_dir()
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "sim_fidelity.py"), "--json"],
                          capture_output=True, text=True, env=_env(), timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(results) == {"seed001_linear", "mlp_adamw", "conv_stack", "reduce_staging"}
    for name, r in results.items():
        assert r["differences"] in ([], {}), (name, r["differences"])
        assert r["ratio"] == 1.0, (name, r)
    assert results["seed001_linear"]["same_sequence"]
    assert results["conv_stack"]["output_shape_ok"]
    # the H100's 132 SMs and the L4's 58 give different staging buffers
    per = results["reduce_staging"]["per_model"]
    assert per["H100-SXM-80GB"]["simulated"][1] == 2112 and per["L4"]["simulated"][1] == 696
