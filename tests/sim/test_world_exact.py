"""Representative ranks are exact: a job run with only some of its ranks
started (``--nnodes 1 --nproc-per-node W --ranks LIST``, gpumem/sim/world.py)
gives each started rank the same peak allocated and peak reserved as the
same rank of the full W-rank run (torchrun), under torch's allocator
(python -m gpumem.sim) and under gpumem (gpumem simulate).

The job is tests/sim/test_distributed.py's TRAIN script (a small
Transformer, DDP or FSDP2, AdamW, three steps), whose head of 30 rows pads
differently on 4 ranks, so the last rank's shard differs from the others'.
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

SUBSETS = {2: [1], 4: [0, 3]}


def subset(cwd: Path, world: int, ranks: list, how: str, mode: str) -> subprocess.CompletedProcess:
    """Only `ranks` of a one-node job of `world` ranks: under torch's allocator
    (python -m gpumem.sim ... python -m gpumem.sim.world) or gpumem simulate."""
    sim_lib_dir()
    built_shim()
    cwd.mkdir(parents=True, exist_ok=True)
    (cwd / "train.py").write_text(TRAIN)
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


@pytest.mark.parametrize("mode", ["fsdp", "ddp"])
@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("how", ["torch", "simulate"])
def test_started_ranks_peak_as_in_the_full_run(tmp_path, mode, world, how):
    ranks = SUBSETS[world]
    full = tmp_path / "full"
    full.mkdir()
    (full / "train.py").write_text(TRAIN)
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
