"""Training on several simulated GPUs: torchrun ranks with the nccl backend
under the simulator (python -m gpumem.sim --devices N -- torchrun ...) with
torch's own allocator, with gpumem installed by the script, and with gpumem
installed in every rank by ``gpumem simulate --devices N -- torchrun ...``.

DDP and FSDP2 (fully_shard) train a small Transformer with AdamW on 2 and 4
ranks; each rank writes its statistics to result_rank<N>.json. The fake NCCL
never moves data between ranks (simgpu/README.md, "NCCL"), so what is
checked is memory: every rank's peak, the same under both allocators, and
FSDP2's shards and AdamW state against the sharding arithmetic. Also: the
seed article's distributed snippet as printed, one rank running out of
memory, and examples/fsdp2_fit.py. The fake NCCL's own checks are in
tests/sim/test_nccl.py.
"""

from __future__ import annotations

import json
import math
import os
import re
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gpumem.snapshots import unpickle as _unpickle
from sim_helpers import ROOT, needs_torch, sim_lib_dir
from torch_helpers import _env, built_shim

pytestmark = [pytest.mark.slow, needs_torch]  # each torchrun takes 5 to 20 s on 2 cores

MIB = 1 << 20
SETTLE = Path(__file__).resolve().parent / "exit_settle"   # its sitecustomize.py
# Note [NCCL buffer memory] (simgpu/nccl/nccl_mem.c): 16 channels x 2
# connections x (NCCL_BUFFSIZE + NCCL_LL_BUFFSIZE + NCCL_LL128_BUFFSIZE)
NCCL_COMM_BYTES = 16 * 2 * (4 * MIB + 8 * 512 * 8 * 16 + 120 * 640 * 8 * 8)


def launch(cwd: Path, world: int, how: str, argv: list, env=None, memory=None):
    """torchrun --nproc-per-node world argv on `world` simulated GPUs.

    how: "torch" (python -m gpumem.sim, torch's allocator), "install" (the
    same, with USE_GPUMEM=1: the script calls gpumem.install()) or
    "simulate" (gpumem simulate installs gpumem in every rank)."""
    sim_lib_dir()
    built_shim()  # the ranks use the session's shim: never several builds at once
    cwd.mkdir(parents=True, exist_ok=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mem = ["--memory", memory] if memory else []
    if how == "simulate":
        pre = [sys.executable, "-m", "gpumem.sim.command", "--devices", str(world), "--out", "sim",
               "--no-view", *mem, "--"]
    else:
        pre = [sys.executable, "-m", "gpumem.sim", "--devices", str(world), *mem, "--"]
    cmd = pre + [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(world),
                 "--master-port", str(port), *map(str, argv)]
    e = _env(dict(env or {}, USE_GPUMEM="1" if how == "install" else "0"))
    e["PYTHONPATH"] = os.pathsep.join([str(SETTLE)] + [p for p in [e.get("PYTHONPATH")] if p])
    return subprocess.run(cmd, cwd=cwd, env=e, capture_output=True, text=True, timeout=600)


def finished(proc):
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    assert "unhandled cuda error" not in proc.stderr
    return proc


# ----------------------------------------------------------------------
# DDP and FSDP2 training, one script

TRAIN = r'''
import json, os, sys, time
import torch
import torch.distributed as dist
if os.environ.get("USE_GPUMEM") == "1":
    import gpumem
    gpumem.install()
from torch.distributed.fsdp import fully_shard

mode = sys.argv[1]
local = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local)
dist.init_process_group("nccl")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        layer = torch.nn.TransformerEncoderLayer(64, 4, 128, batch_first=True)
        self.enc = torch.nn.TransformerEncoder(layer, 2)
        self.head = torch.nn.Linear(64, 30)  # 30 rows: padded to 32 on 4 ranks

    def forward(self, x):
        return self.head(self.enc(x))


points = {}
def point(name):
    points[name] = [torch.cuda.memory_allocated(),
                    torch.cuda.memory_stats()["requested_bytes.all.current"]]


net = Net()  # built on the host: nothing on the device yet
if mode == "ddp":
    model = torch.nn.parallel.DistributedDataParallel(net.cuda(), device_ids=[local])
else:
    for layer in net.enc.layers:
        fully_shard(layer)
    model = fully_shard(net)  # moves each parameter's shard to this rank's device
point("params")
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
for step in range(3):
    model(torch.randn(8, 16, 64, device="cuda")).sum().backward()
    if step == 0:
        point("before_step")
    opt.step()
    if step == 0:
        point("after_step")
    opt.zero_grad(set_to_none=True)
torch.cuda.synchronize()
stats = torch.cuda.memory_stats()
gm = sys.modules.get("gpumem")
shapes = [[list(p.shape), list(p.to_local().shape) if hasattr(p, "to_local") else list(p.shape)]
          for p in model.parameters()]
with open(f"result_rank{rank}.json", "w") as f:
    json.dump({"rank": rank, "world": world, "device": torch.cuda.current_device(),
               "gpumem": bool(gm and gm.is_installed()), "points": points,
               "peak": torch.cuda.max_memory_allocated(), "shapes": shapes,
               "stats": stats}, f)
dist.destroy_process_group()
time.sleep(0.05)  # the autograd thread's exit race (simgpu/README.md, "Limitations")
'''

# By default (TORCH_NCCL_AVOID_RECORD_STREAMS=1) ProcessGroupNCCL keeps a
# collective's tensors alive in the work object ("stashed for allocator
# safety") until wait() or until its watchdog thread, polling in real time,
# sees the work done and drops it; when DDP's gradient buckets are freed
# then depends on the host's scheduling, and the second step's peak moved by
# a bucket in some runs, under either allocator. With record_stream (0) the
# allocator defers each reuse to the NCCL stream's event, in stream order,
# and every run gives the same peak.
DDP_ENV = {"TORCH_NCCL_AVOID_RECORD_STREAMS": "0"}

_runs: dict = {}


def train(tmp_path_factory, mode: str, world: int, how: str) -> list[dict]:
    """Each rank's result_rank<N>.json for one run (run once per module)."""
    key = (mode, world, how)
    if key not in _runs:
        cwd = tmp_path_factory.mktemp(f"{mode}{world}_{how}")
        script = cwd / "train.py"
        script.write_text(TRAIN)
        proc = finished(launch(cwd, world, how, [script, mode],
                               env=DDP_ENV if mode == "ddp" else None))
        rows = [json.loads((cwd / f"result_rank{r}.json").read_text()) for r in range(world)]
        for r in rows:
            assert r["gpumem"] == (how != "torch") and r["device"] == r["rank"], r
        summary = cwd / "sim" / "summary.json"
        _runs[key] = rows, (json.loads(summary.read_text()) if summary.exists() else None), proc
    return _runs[key][0]


def summary(mode, world, how):
    return _runs[(mode, world, how)][1]


def close(a: int, b: int) -> bool:
    """Within 1% (the issue's bar); so far every pair has been equal."""
    return abs(a - b) <= 0.01 * max(a, b)


def ddp_bucket(rows) -> int:
    """The block of DDP's one gradient bucket: all gradients, fp32, flat (the
    model is far below the first bucket's 1 MiB cap); 'params' holds the
    parameters and this bucket, the same bytes again."""
    return block(rows[0]["points"]["params"][1] // 2)


@pytest.mark.parametrize("world", [2, 4])
def test_ddp_transformer_peaks_equal_across_ranks_and_allocators(tmp_path_factory, world):
    native = train(tmp_path_factory, "ddp", world, "torch")
    ours = train(tmp_path_factory, "ddp", world, "simulate")
    bucket = ddp_bucket(native)
    top = max(r["peak"] for r in native + ours)
    # DDP replicates: every rank holds the same model, gradients and bucket.
    # One thing moves with the host's timing, under either allocator: DDP
    # rebuilds its bucket before the second forward and frees the first one,
    # but the first step's allreduce work still refers to it until
    # ProcessGroupNCCL's watchdog thread, polling in real time, drops the work.
    # Usually the old bucket is still alive at the peak; in about 1 rank in 8
    # on 2 busy cores it is already gone and that rank's peak is one bucket lower.
    for r in native + ours:
        assert r["peak"] in (top, top - bucket), (r["rank"], r["peak"], top, bucket)
    for t, g in zip(native, ours):
        assert close(t["peak"], g["peak"]), (t["peak"], g["peak"])
    # gpumem simulate's own report: one line per rank, the peak the rank saw
    per = sorted(summary("ddp", world, "simulate")["per_device"], key=lambda d: d["rank"])
    assert [(d["rank"], d["device"]) for d in per] == [(r, r) for r in range(world)]
    assert [d["peak_allocated"] for d in per] == [r["peak"] for r in ours]
    assert summary("ddp", world, "simulate")["verdict"] == "yes"


# memory_stats keys compared between torch's allocator and gpumem on each rank
STAT_KEYS = ["allocated_bytes.all.peak", "allocated_bytes.all.current",
             "requested_bytes.all.peak", "requested_bytes.all.current",
             "reserved_bytes.all.peak", "active_bytes.all.peak", "allocation.all.peak",
             "allocation.all.current", "segment.all.peak", "num_ooms", "num_alloc_retries"]


@pytest.mark.parametrize("how", ["install", "simulate"])
def test_memory_stats_per_rank_match_torchs_allocator(tmp_path_factory, how):
    """gpumem installed on every rank (by the script, or by gpumem simulate):
    each rank's memory_stats() as torch's allocator gives them."""
    native = train(tmp_path_factory, "ddp", 2, "torch")
    ours = train(tmp_path_factory, "ddp", 2, how)
    bucket = ddp_bucket(native)
    for t, g in zip(native, ours):
        assert t["points"] == g["points"]
        # the same bytes, counts and segments; where the old DDP bucket (above)
        # was dropped on one side only, byte keys may move by that bucket and
        # counts by one. The drop can also come at a moment that moves the
        # count's peak by one while every byte figure stays equal (seen once
        # on a loaded machine), so counts always have that one.
        moved = t["peak"] != g["peak"] or (t["stats"]["allocated_bytes.all.current"] !=
                                           g["stats"]["allocated_bytes.all.current"])
        for k in STAT_KEYS:
            a, b = t["stats"][k], g["stats"][k]
            if moved:
                slack = bucket if "bytes" in k else 1
            else:
                slack = 1 if k.startswith("allocation.") else 0
            assert abs(a - b) <= slack, (t["rank"], k, a, b)


# ----------------------------------------------------------------------
# FSDP2: the shards and AdamW's state against the arithmetic

D, FF, HEAD_ROWS = 64, 128, 30
# Net's parameters as declared in TRAIN, computed here from the layer
# definitions (not read back from the run): per encoder layer the attention's
# in_proj (3D x D, 3D), out_proj (D x D, D), linear1 (FF x D, FF), linear2
# (D x FF, D), two LayerNorms (D, D each); then the head (30 x D, 30).
LAYER = [(3 * D, D), (3 * D,), (D, D), (D,), (FF, D), (FF,), (D, FF), (D,),
         (D,), (D,), (D,), (D,)]
SHAPES = LAYER * 2 + [(HEAD_ROWS, D), (HEAD_ROWS,)]


def block(nbytes: int) -> int:
    """The allocator's block for a request: a multiple of 512 bytes."""
    return -(-nbytes // 512) * 512


def shard_rows(rows: int, world: int, rank: int) -> tuple[int, int]:
    """(padded rows, real rows) of this rank's dim-0 shard: FSDP2 splits dim 0
    into chunks of ceil(rows / world), the last ranks' partly or wholly
    padding, and keeps each rank's shard in a padded tensor of the chunk size."""
    chunk = math.ceil(rows / world)
    return chunk, max(0, min(chunk, rows - rank * chunk))


def fsdp_expected(world: int, rank: int) -> dict:
    """fp32 bytes per rank. Parameters: one padded shard per parameter,
    sum ceil(dim0 / W) x rest x 4. AdamW's first step adds exp_avg and
    exp_avg_sq per parameter, each the size of the rank's real (unpadded)
    local shard: 2 x sum real_rows x rest x 4 (the step counts stay on the host).
    'allocated' rounds each tensor to its 512-byte block; 'requested' does not."""
    out = {"params": [0, 0], "adam": [0, 0]}
    for shape in SHAPES:
        rest = math.prod(shape[1:])
        padded, real = shard_rows(shape[0], world, rank)
        out["params"][0] += block(padded * rest * 4)
        out["params"][1] += padded * rest * 4
        if real:
            out["adam"][0] += 2 * block(real * rest * 4)
            out["adam"][1] += 2 * real * rest * 4
    return out


@pytest.mark.parametrize("world", [2, 4])
def test_fsdp2_shards_and_adamw_state_follow_the_arithmetic(tmp_path_factory, world):
    rows = train(tmp_path_factory, "fsdp", world, "torch")
    full = sum(4 * math.prod(s) for s in SHAPES)  # 137,788 fp32 bytes unsharded
    for r in rows:
        assert [tuple(g) for g, _ in r["shapes"]] == SHAPES  # the model is the one above
        assert [l[0] for _, l in r["shapes"]] == [shard_rows(s[0], world, r["rank"])[1]
                                                  for s in SHAPES]
        want = fsdp_expected(world, r["rank"])
        pts = r["points"]
        # after fully_shard: the rank's padded shards and nothing else
        assert pts["params"] == want["params"], (r["rank"], pts, want)
        # AdamW's first step adds exactly its two moments (temporaries are freed)
        step = [a - b for a, b in zip(pts["after_step"], pts["before_step"])]
        assert step == want["adam"], (r["rank"], step, want)
        # shards shrink with the rank count: about 1/W of the whole
        assert full / world <= want["params"][1] < full / world + 4 * D * world * len(SHAPES)
    if world == 4:
        # the head's 30 rows split 8, 8, 8, 6: the last rank's moments are smaller,
        # its padded parameter shard is not
        adam = [r["points"]["after_step"][1] - r["points"]["before_step"][1] for r in rows]
        assert adam[0] == adam[1] == adam[2] == adam[3] + 2 * 2 * (D + 1) * 4


@pytest.mark.parametrize("world,how", [(2, "install"), (4, "simulate")])
def test_fsdp2_peaks_match_torchs_allocator(tmp_path_factory, world, how):
    native = train(tmp_path_factory, "fsdp", world, "torch")
    ours = train(tmp_path_factory, "fsdp", world, how)
    for t, g in zip(native, ours):
        assert t["points"] == g["points"]
        assert t["peak"] > 0 and close(t["peak"], g["peak"]), (t["rank"], t["peak"], g["peak"])


# ----------------------------------------------------------------------
# The seed article's distributed snippet, as printed

SEED = "002_26d44510ac846a17.txt"


def seed_snippet(first: str, last: str) -> str:
    """Lines first..last of the seed article, whose text lost its indentation:
    a line after one ending in ':' is indented again, nothing else changes."""
    path = Path(os.environ.get("GPUMEM_SEEDS") or ROOT.parent / "shared" / "seeds") / SEED
    if not path.is_file():
        pytest.skip(f"no seed article at {path} (set GPUMEM_SEEDS)")
    lines = path.read_text().splitlines()
    start = lines.index(first)
    end = lines.index(last, start)
    out = []
    for i, line in enumerate(lines[start:end + 1]):
        out.append(("    " if out and out[-1].rstrip().endswith(":") else "") + line)
    return "\n".join(out) + "\n"


@pytest.mark.parametrize("how", ["torch", "simulate"])
def test_seed_distributed_snippet_with_nccl_on_two_ranks(tmp_path, how):
    snippet = seed_snippet("import torch.distributed as dist",
                           "torch.cuda.memory._record_memory_history(enabled=None)")
    assert 'dist.init_process_group("nccl")' in snippet
    # `import torch.distributed as dist` binds only `dist`: the article's
    # earlier `import torch` is needed, as in any script made of its snippets
    (tmp_path / "seed.py").write_text("import torch\n" + snippet)
    proc = finished(launch(tmp_path, 2, how, [tmp_path / "seed.py"]))
    weight = 4096 * 4096 * 4  # DDP's Linear(4096, 4096) weight
    for rank in (0, 1):
        snap = _unpickle.load_snapshot(str(tmp_path / f"snapshot_rank{rank}.pkl"))
        sizes = [b["size"] for s in snap["segments"] for b in s["blocks"]
                 if b["state"] == "active_allocated"]
        assert sizes.count(weight) >= 2, sorted(sizes)[-4:]  # the weight and its gradient
        allocs = [e for e in snap["device_traces"][0] if e["action"] == "alloc"]
        assert sum(e["size"] == 64 * 4096 * 4 for e in allocs) >= 5  # 5 input batches
    if how == "simulate":
        assert "fits in 80 GiB: yes" in proc.stdout


# ----------------------------------------------------------------------
# One rank out of memory

OOM = r'''
import json, os, time
import torch
import torch.distributed as dist
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
dist.init_process_group("nccl")
rank = dist.get_rank()
x = torch.ones(1024, 1024, device="cuda")
dist.all_reduce(x)
if rank == 1:
    huge = torch.empty(4 << 30, dtype=torch.uint8, device="cuda")  # rank 1 only
torch.cuda.synchronize()
with open(f"done_rank{rank}.json", "w") as f:
    json.dump({"rank": rank, "peak": torch.cuda.max_memory_allocated()}, f)
dist.destroy_process_group()
time.sleep(0.05)
'''


def test_one_rank_out_of_memory(tmp_path):
    script = tmp_path / "oom.py"
    script.write_text(OOM)
    line = OOM.splitlines().index(
        '    huge = torch.empty(4 << 30, dtype=torch.uint8, device="cuda")  # rank 1 only') + 1
    proc = launch(tmp_path, 2, "simulate", [script], memory="2GiB")
    out = proc.stdout + proc.stderr
    # torchrun reports the failed rank and exits non-zero
    assert proc.returncode == 1, out[-4000:]
    assert "[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 4.00 GiB" in out
    assert "rank      : 1 (local_rank: 1)" in out and "[rank0]: Traceback" not in out
    rep = json.loads((tmp_path / "sim" / "summary.json").read_text())
    # the free memory in the message: capacity - CUDA context - NCCL's buffers - 20 MiB
    # that the allocator reserved for x
    free = 2 * 1024 * MIB - rep["context_memory"] - NCCL_COMM_BYTES - 20 * MIB
    assert f"of which {free / (1 << 30):.2f} GiB is free" in out
    # gpumem's per-rank OOM snapshot: oom_<host>_<pid>_<n>_rank1.pickle
    (oom,) = rep["oom_snapshots"]
    assert Path(oom).parent == tmp_path / "sim" and oom.endswith("_1_rank1.pickle"), oom
    assert f"gpumem: memory snapshot at this OOM written to {oom}" in out
    snap = _unpickle.load_snapshot(oom)
    (event,) = [e for t in snap["device_traces"] for e in t if e["action"] == "oom"]
    assert event["size"] == 4 << 30
    assert (str(script), line) in [(f["filename"], f["line"]) for f in event["frames"]]
    per = {d["rank"]: d for d in rep["per_device"]}
    assert per[1]["num_ooms"] == 1 and per[0]["num_ooms"] == 0
    # rank 0 never waits for rank 1 (the fake NCCL's ranks never block): it
    # finishes unless torchrun stops it first, and never runs out of memory
    assert not list((tmp_path / "sim").glob("oom_*_rank0.pickle"))


# ----------------------------------------------------------------------
# examples/fsdp2_fit.py

EXAMPLE_ARGS = ["--layers", "2", "--dim", "128", "--heads", "4", "--seq", "32", "--batch", "2",
                "--steps", "2"]


def example_rows(proc) -> list[dict]:
    # ranks share the output, so one's line may end after another's text
    rows = [dict(kv.split("=") for kv in m.group(0).split())
            for m in re.finditer(r"rank=\d+(?: [a-z_]+=-?\d+)*", proc.stdout)]
    return sorted(({k: int(v) for k, v in r.items()} for r in rows), key=lambda r: r["rank"])


def test_fsdp2_example_meta_init_allocates_only_the_shards(tmp_path):
    """Built on the host and sharded, under torch's allocator; built on the meta
    device and materialised with to_empty, under gpumem simulate: the same
    shards, the same peak, on each of 2 ranks."""
    script = ROOT / "examples" / "fsdp2_fit.py"
    host = example_rows(finished(launch(tmp_path / "host", 2, "torch", [script, *EXAMPLE_ARGS])))
    meta = example_rows(finished(launch(tmp_path / "meta", 2, "simulate",
                                        [script, *EXAMPLE_ARGS, "--meta"])))
    assert [r["rank"] for r in host] == [r["rank"] for r in meta] == [0, 1]
    # LM(2 layers, dim 128): embeddings 32000 x 128 and 32 x 128, per layer
    # 12 x 128^2 weights + 13 x 128 biases and norms, final norm, head 32000 x 128
    d = 128
    params = 32000 * d + 32 * d + 2 * (12 * d * d + 13 * d) + 2 * d + 32000 * d
    for h, m in zip(host, meta):
        assert h["params"] == m["params"] == params
        # fp32 shards: about half of the parameters each, plus 512-byte blocks
        assert params * 4 // 2 <= h["sharded"] == m["sharded"] < params * 4 // 2 + 64 * 512
        assert close(h["peak_allocated"], m["peak_allocated"]), (h, m)
    assert (tmp_path / "meta" / "sim" / "snapshot_rank1.pickle").is_file()
