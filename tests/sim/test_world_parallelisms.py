"""Representative ranks are exact for the parallelisms torchtitan
configures (test_world_exact.py's PAR_TRAIN on a small Llama-like model):
HSDP, tensor parallel with sequence parallel, context parallel, FSDP2 x CP
and CP x TP, on 4 ranks with ranks 1 and 3 started, and the 3-D meshes
HSDP x TP (2 x 2 x 2) and FSDP2 x CP x TP (2 x 2 x 2) on 8 ranks with ranks
0 and 5 started, under gpumem (``gpumem simulate``). Each started rank's peak allocated and reserved
equal the full run's. Under torch's allocator the same jobs gave the same
figures when these cases were written (README's parallelism table); the
suite checks torch's side on the DDP, FSDP2 and TP cases of
test_world_exact.py, which share the launcher. A case takes 55 to 80 s on 2
busy cores (the 8-rank ones 90 to 110 s): slow tier.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from sim_helpers import needs_torch, sim_lib_dir
from test_world_exact import check_started_ranks, script
from torch_helpers import _env, built_shim

pytestmark = [pytest.mark.slow, needs_torch]


@pytest.mark.parametrize("mode", ["hsdp", "sp", "cp", "fsdp_cp", "tp_cp"])
def test_started_ranks_peak_as_in_the_full_run(tmp_path, mode):
    check_started_ranks(tmp_path, mode, 4, "simulate")


@pytest.mark.parametrize("mode", ["hsdp_tp", "fsdp_tp_cp"])
def test_three_dimensional_meshes_on_eight_ranks(tmp_path, mode):
    check_started_ranks(tmp_path, mode, 8, "simulate")


def test_auto_on_a_context_parallel_mesh_names_the_ranks_to_start(tmp_path):
    """--ranks auto starts ranks 0 and 3 of a 4-rank context-parallel job;
    the ranks noted the mesh they built, and the report names the list that
    covers every place in the ring (each peaks differently)."""
    sim_lib_dir()
    built_shim()
    (tmp_path / "train.py").write_text(script("cp"))
    proc = subprocess.run([sys.executable, "-m", "gpumem.sim.command", "--nnodes", "1",
                           "--nproc-per-node", "4", "--ranks", "auto", "--out", "sim",
                           "--no-view", "--", "train.py", "cp"], cwd=tmp_path,
                          env=_env({"USE_GPUMEM": "0"}), capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((tmp_path / "sim" / "summary.json").read_text())
    assert report["world"]["ranks"] == [0, 3]
    advice = report["world"]["advice"]
    assert "(cp 4) has a cp dimension of 4" in advice and advice.endswith("--ranks 0-3")
    assert advice in proc.stdout
