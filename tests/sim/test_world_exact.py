"""Representative ranks are exact: a job run with only some of its ranks
started (``--nnodes 1 --nproc-per-node W --ranks LIST``, gpumem/sim/world.py)
gives each started rank the same peak allocated and peak reserved as the
same rank of the full W-rank run (torchrun), under torch's allocator
(python -m gpumem.sim) and under gpumem (gpumem simulate).

The jobs: tests/sim/test_distributed.py's TRAIN script (a small
Transformer, DDP or FSDP2, AdamW, three steps), whose head of 30 rows pads
differently on 4 ranks; and TP_TRAIN, tensor parallel alone and FSDP2 x TP
on a 2-D DeviceMesh, whose uneven split gives ranks different shapes.
Each run takes 5 to 20 s on 2 cores: slow tier.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from sim_helpers import needs_torch, sim_lib_dir
from torch_helpers import _env, built_shim
from test_distributed import DDP_ENV, TRAIN, ddp_bucket, finished, launch

pytestmark = [pytest.mark.slow, needs_torch]

SUBSETS = {2: [1], 4: [1, 3]}

# Tensor parallel over a DeviceMesh: tp (one dimension of all ranks) or fsdp_tp
# ((world // 2) x 2: FSDP2 over dp, Colwise/Rowwise TP over tp); under fsdp_tp
# FSDP splits 125 rows unevenly, so ranks 1 and 3 of 4 hold different shapes.
TP_TRAIN = r'''
import json, os, sys, time
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

mode = sys.argv[1]   # tp: one mesh dimension; fsdp_tp: (world // 2) x 2, FSDP over dp, TP over tp
local = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local)
dist.init_process_group("nccl")
world = dist.get_world_size()
if mode == "tp":
    mesh = init_device_mesh("cuda", (world,), mesh_dim_names=("tp",))
    tp = mesh
else:
    mesh = init_device_mesh("cuda", (world // 2, 2), mesh_dim_names=("dp", "tp"))
    tp = mesh["tp"]


# fsdp_tp: 250 rows, 125 per TP rank, split unevenly by FSDP; tp: 252 rows, even
# (250 rows over a TP group of 4 fails in the full torchrun run too, with a shape
# error in the second Linear: "a and b must have same reduction dim"; not investigated)
HIDDEN = 250 if mode == "fsdp_tp" else 252


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.w1 = nn.Linear(64, HIDDEN)
        self.w2 = nn.Linear(HIDDEN, 64)

    def forward(self, x):
        return self.w2(torch.relu(self.w1(x)))


with torch.device("cuda"):
    model = nn.Sequential(MLP(), MLP())
for m in model:
    parallelize_module(m, tp, {"w1": ColwiseParallel(), "w2": RowwiseParallel()})
if mode == "fsdp_tp":
    for m in model:
        fully_shard(m, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
for step in range(3):
    model(torch.randn(8, 16, 64, device="cuda")).sum().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
torch.cuda.synchronize()
rank = dist.get_rank()
with open(f"result_rank{rank}.json", "w") as f:
    json.dump({"rank": rank, "world": world, "device": torch.cuda.current_device(),
               "peak": torch.cuda.max_memory_allocated(),
               "stats": {"reserved_bytes.all.peak": torch.cuda.max_memory_reserved()},
               "shapes": [list(p.to_local().shape) for p in model.parameters()]}, f)
dist.destroy_process_group()
time.sleep(0.05)
'''


def subset(cwd: Path, world: int, ranks: list, how: str, mode: str) -> subprocess.CompletedProcess:
    """Only `ranks` of a one-node job of `world` ranks: under torch's allocator
    (python -m gpumem.sim ... python -m gpumem.sim.world) or gpumem simulate."""
    sim_lib_dir()
    built_shim()
    cwd.mkdir(parents=True, exist_ok=True)
    (cwd / "train.py").write_text(TRAIN if mode in ("ddp", "fsdp") else TP_TRAIN)
    spec = ["--nnodes", "1", "--nproc-per-node", str(world), "--ranks", ",".join(map(str, ranks))]
    if how == "simulate":
        cmd = [sys.executable, "-m", "gpumem.sim.command", *spec, "--out", "sim", "--no-view",
               "--host-memory", "--", "train.py", mode]
    else:
        cmd = [sys.executable, "-m", "gpumem.sim", "--devices", str(world), "--",
               sys.executable, "-m", "gpumem.sim.world", *spec, "--", "train.py", mode]
    e = _env(dict(DDP_ENV if mode == "ddp" else {}, USE_GPUMEM="0"))
    return subprocess.run(cmd, cwd=cwd, env=e, capture_output=True, text=True, timeout=600)


def peaks(cwd: Path, ranks: list) -> dict:
    out = {}
    for r in ranks:
        row = json.loads((cwd / f"result_rank{r}.json").read_text())
        out[r] = (row["peak"], row["stats"]["reserved_bytes.all.peak"], row["world"],
                  row["device"])
    return out


@pytest.mark.parametrize("mode, world", [("fsdp", 2), ("fsdp", 4), ("ddp", 2), ("ddp", 4),
                                         ("tp", 2), ("tp", 4), ("fsdp_tp", 4)])
@pytest.mark.parametrize("how", ["torch", "simulate"])
def test_started_ranks_peak_as_in_the_full_run(tmp_path, mode, world, how):
    ranks = SUBSETS[world]
    full = tmp_path / "full"
    full.mkdir()
    (full / "train.py").write_text(TRAIN if mode in ("ddp", "fsdp") else TP_TRAIN)
    finished(launch(full, world, how, [full / "train.py", mode],
                    env=DDP_ENV if mode == "ddp" else None))
    part = tmp_path / "part"
    finished(subset(part, world, ranks, how, mode))
    assert sorted(p.name for p in part.glob("result_rank*.json")) == \
        [f"result_rank{r}.json" for r in ranks]   # the others were never started
    want, got = peaks(full, ranks), peaks(part, ranks)
    for r in ranks:
        assert got[r][2:] == (world, r % world), got[r]   # full world size, own device
    if mode == "ddp":
        # DDP's first bucket is freed when ProcessGroupNCCL's watchdog thread drops the
        # first allreduce (real-time polling): test_distributed.py's note on DDP; one
        # bucket either way, in full runs too
        for r in ranks:
            assert got[r][1] == want[r][1], (r, got[r], want[r])
            bucket = ddp_bucket([json.loads((full / f"result_rank{r}.json").read_text())])
            assert got[r][0] - want[r][0] in (-bucket, 0, bucket), (r, got[r], want[r])
    else:
        assert got == want
    if how == "simulate":
        report = json.loads((part / "sim" / "summary.json").read_text())
        assert report["world"]["world_size"] == world and report["world"]["ranks"] == ranks
        rows = {row["rank"]: row for row in report["per_rank"]}
        assert sorted(rows) == ranks
        for r in ranks:
            assert rows[r]["stands_for"] == {"ranks": str(r), "count": 1, "why": "user list"}
            assert (rows[r]["peak_allocated"], rows[r]["peak_reserved"]) == want[r][:2] or \
                mode == "ddp"


def test_gloo_is_refused_with_one_line(tmp_path):
    """gloo connects to every peer: with ranks absent the rank ends at once, status 2."""
    sim_lib_dir()
    (tmp_path / "g.py").write_text("import torch.distributed as dist\n"
                                   "dist.init_process_group('gloo')\nprint('NOT REFUSED')\n")
    proc = subprocess.run([sys.executable, "-m", "gpumem.sim", "--devices", "2", "--",
                           sys.executable, "-m", "gpumem.sim.world", "--nnodes", "4",
                           "--nproc-per-node", "2", "--ranks", "5", "--", "g.py"],
                          cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "NOT REFUSED" not in proc.stdout, proc.stderr[-3000:]
    lines = [x for x in proc.stderr.splitlines() if x.strip()]
    assert lines[-1].startswith("gpumem simulate --ranks: the backend gloo connects to every "
                                "peer"), proc.stderr[-3000:]
