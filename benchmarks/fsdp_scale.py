"""An FSDP2 training step of a 8B-parameter Transformer on 8 simulated 80 GB
GPUs, on a machine with far less memory than the model.

    python benchmarks/fsdp_scale.py [--ranks 8] [--layers 32] [--dim 4096]
                                    [--seq 512] [--batch 1] [--steps 1]
                                    [--compare-layers 2 (0: none)] [--with-gpumem]

The model has LLaMA-3-8B's shapes (dim 4096, 32 layers, 32 query heads and
8 key/value heads, SwiGLU MLP of 14336, vocabulary 128256, RMSNorm; no
rotary embedding, which holds no parameters), fp32 parameters. It is built
on the meta device, every block and then the root is ``fully_shard``-ed,
``to_empty(device="cuda")`` materialises the shards on the simulated GPUs and
the parameters are re-initialised; then ``--steps`` steps of forward,
backward and AdamW. The ranks run under

    python -m gpumem.sim --no-host-memory --devices N -- \\
        python -m torch.distributed.run --standalone --nproc-per-node N ...

so device memory holds no data (docs/simulation.md, "Models larger than
this machine"). Each rank reports its peak host RSS (VmHWM) and
torch.cuda's memory figures, and checks them against the sharding
arithmetic: FSDP2 gives each rank ceil(dim0 / N) rows of every parameter
(padded), so its parameter bytes are sum(ceil(dim0 / N) * rest * 4), its
gradients the same, and AdamW's exp_avg and exp_avg_sq twice that. The
first optimizer step's own peak (the peak statistics are reset just before
it; the run's peak reported is the larger of the parts) is checked too:
the foreach AdamW holds sqrt(exp_avg_sq) for every shard at once, so five
times the shard bytes, plus the two cuBLAS workspaces (forward's thread and
autograd's backward thread), plus the caching allocator's rounding (a block
over 1 MiB keeps the rest of its segment when that rest is 1 MiB or less).
At the default sizes that step is also the run's peak; with few layers
(the embedding and output weights, gathered whole, then dominate), later
steps, or activations several times the shard bytes, the run peaks in
backward, which this arithmetic does not cover.

With --compare-layers L (default 2), the same step on a smaller model (L
layers of --compare-dim 1024 on --compare-ranks 2) runs twice more, with
and without --no-host-memory, to show what the mode saves in host memory
(without it, every byte that copies put on a device is host memory, so
that run must be small). With --with-gpumem the main model runs once more
under ``gpumem simulate --nproc-per-node N`` (gpumem installed and recording
in every rank), and its per-rank figures are compared with torch's
allocator's. Prints a JSON object for the main run, then one for each
comparison.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VOCAB, HEADS, KV_HEADS = 128256, 32, 8
# torch's default cuBLAS workspace on Hopper (CUBLAS_WORKSPACE_CONFIG unset)
CUBLAS_WORKSPACE = 32 << 20


def ffn_dim(dim: int) -> int:
    return 14336 * dim // 4096


def param_shapes(layers: int, dim: int, heads: int = HEADS, ffn: int = 0):
    """Every parameter's shape, in the model's order (the arithmetic's input);
    ffn: the SwiGLU hidden size (default ffn_dim(dim))."""
    kv = dim * KV_HEADS // heads
    ffn = ffn or ffn_dim(dim)
    block = [(dim, dim), (kv, dim), (kv, dim), (dim, dim),          # wq wk wv wo
             (ffn, dim), (ffn, dim), (dim, ffn),                     # w1 w3 w2
             (dim,), (dim,)]                                         # two RMSNorms
    return [(VOCAB, dim)] + block * layers + [(dim,), (VOCAB, dim)]


def shard_bytes(shapes, ranks: int, elem: int = 4) -> int:
    return sum(math.ceil(s[0] / ranks) * math.prod(s[1:]) * elem for s in shapes)


# ----------------------------------------------------------------------
# one rank

def unique_bytes(tensors) -> int:
    """Bytes of the distinct storages behind tensors (FSDP2's gradients are
    views of one reduce-scatter output per group)."""
    seen = {}
    for t in tensors:
        st = t.untyped_storage()
        seen[st.data_ptr()] = st.nbytes()
    return sum(seen.values())


def tensor_parallel(model, world: int, tp: int):
    """torchtitan's tensor parallel plan with sequence parallel and a sharded
    loss, over the inner dimension of a (world // tp, tp) mesh: the embedding
    row-wise into sequence shards, RMSNorms sequence-parallel, attention's
    and the MLP's inputs gathered once each (PrepareModuleInput), wq/wk/wv
    and w1/w3 column-wise, wo and w2 row-wise back into sequence shards, the
    output column-wise with its logits left sharded for loss_parallel.
    Returns the data-parallel mesh that FSDP2 shards over and loss_parallel
    (the context the loss and backward run in)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput,
                                                   RowwiseParallel, SequenceParallel,
                                                   loss_parallel, parallelize_module)
    if world % tp:
        raise SystemExit(f"fsdp_scale: --tp {tp} does not divide the world size {world}")
    mesh = init_device_mesh("cuda", (world // tp, tp), mesh_dim_names=("dp", "tp"))
    parallelize_module(model, mesh["tp"], {
        "emb": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        "norm": SequenceParallel(),
        "out": ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1),
                               use_local_output=False)})
    gather = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
    for blk in model.blocks:
        parallelize_module(blk, mesh["tp"], {
            "n1": SequenceParallel(), "attn": gather,
            "attn.wq": ColwiseParallel(), "attn.wk": ColwiseParallel(),
            "attn.wv": ColwiseParallel(), "attn.wo": RowwiseParallel(output_layouts=Shard(1)),
            "n2": SequenceParallel(), "ffn": gather,
            "ffn.w1": ColwiseParallel(), "ffn.w3": ColwiseParallel(),
            "ffn.w2": RowwiseParallel(output_layouts=Shard(1))})
    return mesh["dp"], loss_parallel


def worker(args) -> None:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    from torch.utils.checkpoint import checkpoint

    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    dist.init_process_group("nccl")
    world = dist.get_world_size()
    dim, heads = args.dim, args.heads
    kv = dim * KV_HEADS // heads
    ffn, head_dim = args.ffn or ffn_dim(dim), dim // heads

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.wq, self.wk = nn.Linear(dim, dim, bias=False), nn.Linear(dim, kv, bias=False)
            self.wv, self.wo = nn.Linear(dim, kv, bias=False), nn.Linear(dim, dim, bias=False)

        def forward(self, h):
            # -1 heads: under tensor parallel each rank holds heads / tp of them
            b, s, _ = h.shape
            q = self.wq(h).view(b, s, -1, head_dim).transpose(1, 2)
            k = self.wk(h).view(b, s, -1, head_dim).transpose(1, 2)
            v = self.wv(h).view(b, s, -1, head_dim).transpose(1, 2)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            return self.wo(a.transpose(1, 2).reshape(b, s, -1))

    class FeedForward(nn.Module):
        def __init__(self):
            super().__init__()
            self.w1 = nn.Linear(dim, ffn, bias=False)
            self.w3 = nn.Linear(dim, ffn, bias=False)
            self.w2 = nn.Linear(ffn, dim, bias=False)

        def forward(self, h):
            return self.w2(F.silu(self.w1(h)) * self.w3(h))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.attn, self.ffn = Attention(), FeedForward()
            self.n1, self.n2 = nn.RMSNorm(dim), nn.RMSNorm(dim)

        def forward(self, x):
            x = x + self.attn(self.n1(x))
            return x + self.ffn(self.n2(x))

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(VOCAB, dim)
            self.blocks = nn.ModuleList(Block() for _ in range(args.layers))
            self.norm = nn.RMSNorm(dim)
            self.out = nn.Linear(dim, VOCAB, bias=False)

        def forward(self, tokens):
            x = self.emb(tokens)
            for i, blk in enumerate(self.blocks):
                # --ac full: every block recomputed in backward; selective: every
                # other block (torchtitan's layer-selective checkpointing, ac_freq 2)
                if args.ac == "full" or (args.ac == "selective" and i % 2 == 0):
                    x = checkpoint(blk, x, use_reentrant=False)
                else:
                    x = blk(x)
            return self.out(self.norm(x))

    with torch.device("meta"):
        model = Model()
    shapes = [tuple(p.shape) for p in model.parameters()]
    assert shapes == param_shapes(args.layers, dim, heads, ffn), "the arithmetic's shapes are stale"
    nparams = sum(p.numel() for p in model.parameters())
    mp = {}
    if args.bf16:   # torchtitan's default: bf16 compute, fp32 gradient reduction and master copy
        from torch.distributed.fsdp import MixedPrecisionPolicy
        mp = {"mp_policy": MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                                reduce_dtype=torch.float32)}
    loss_ctx = contextlib.nullcontext
    if args.tp > 1:
        mp["mesh"], loss_ctx = tensor_parallel(model, world, args.tp)
    for blk in model.blocks:
        fully_shard(blk, **mp)
    fully_shard(model, **mp)
    model.to_empty(device="cuda")
    torch.cuda.synchronize()
    after_to_empty = torch.cuda.memory_allocated()
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, (nn.Linear, nn.Embedding, nn.RMSNorm)):
                m.reset_parameters()
    torch.cuda.synchronize()
    after_init = torch.cuda.memory_allocated()
    local_bytes = unique_bytes(p.to_local() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    out = {"rank": dist.get_rank(), "params": nparams, "after_to_empty": after_to_empty,
           "after_init": after_init, "param_storage": local_bytes}
    tokens = torch.randint(0, VOCAB, (args.batch, args.seq), device="cuda")
    for step in range(args.steps):
        with loss_ctx():
            loss = F.cross_entropy(model(tokens).flatten(0, 1), tokens.flatten())
            loss.backward()
        if step == 0:
            out["grad_bytes"] = unique_bytes(p.grad.to_local() for p in model.parameters())
            out["after_backward"] = torch.cuda.memory_allocated()
            # the first optimizer step's own peak, which the arithmetic
            # describes at any size; the run's peak is the larger of the two
            peak_before = (torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved())
            torch.cuda.reset_peak_memory_stats()
            opt.step()
            out["step0_optimizer_peak_allocated"] = torch.cuda.max_memory_allocated()
        else:
            opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        out[f"after_step{step}"] = torch.cuda.memory_allocated()
    out["adamw_state"] = unique_bytes(t.to_local() for s in opt.state.values()
                                      for k, t in s.items() if k in ("exp_avg", "exp_avg_sq"))
    out["peak_allocated"] = max(peak_before[0], torch.cuda.max_memory_allocated())
    out["reserved"] = torch.cuda.memory_reserved()
    out["peak_reserved"] = max(peak_before[1], torch.cuda.max_memory_reserved())
    status = open("/proc/self/status").read()
    out["host_rss_peak"] = int(re.search(r"VmHWM:\s+(\d+) kB", status).group(1)) * 1024
    out["host_rss"] = int(re.search(r"VmRSS:\s+(\d+) kB", status).group(1)) * 1024
    # one file per rank: eight ranks' printed lines can interleave
    with open(os.path.join(args.results, f"rank{out['rank']}.json"), "w") as f:
        json.dump(out, f)
    dist.barrier()
    dist.destroy_process_group()


# ----------------------------------------------------------------------
# the launcher

def run_ranks(args, layers: int, no_host: bool, ranks: int = 0, dim: int = 0,
              gpumem: bool = False, started: str = "") -> dict:
    """gpumem: run under `gpumem simulate --nproc-per-node` (gpumem installed and
    recording in every rank; its no-host-memory default) instead of torch's
    allocator under gpumem.sim.  started: start only these ranks of the job
    (``--nnodes 1 --nproc-per-node N --ranks started``: gpumem/sim/world.py)."""
    ranks, dim = ranks or args.ranks, dim or args.dim
    worker = [str(Path(__file__).resolve()), "--worker", "--layers", str(layers), "--dim",
              str(dim), "--heads", str(args.heads), "--ac", args.ac, "--seq", str(args.seq),
              "--batch", str(args.batch), "--steps",
              str(args.steps)] + (["--bf16"] if args.bf16 else [])
    out_dir = tempfile.mkdtemp(prefix="fsdp-scale-")
    results = os.path.join(out_dir, "results")
    os.mkdir(results)
    worker += ["--results", results]
    subset = ["--nnodes", "1", "--nproc-per-node", str(ranks), "--ranks", started]
    expect_rows = ((2 if ranks > 1 else 1) if started == "auto" else
                   len(started.split(",")) if started else ranks)
    if gpumem:
        cmd = [sys.executable, "-m", "gpumem.sim.command", "--nproc-per-node", str(ranks),
               "--memory", "80GiB", "--no-view", "--out", out_dir] + \
            (subset[:2] + subset[4:] if started else []) + ["--"] + worker
    elif started:
        cmd = [sys.executable, "-m", "gpumem.sim", "--devices", str(ranks), "--memory", "80GiB",
               "--no-host-memory", "--", sys.executable, "-m", "gpumem.sim.world", *subset,
               "--"] + worker
    else:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        cmd = [sys.executable, "-m", "gpumem.sim", "--devices", str(ranks), "--memory", "80GiB"]
        if no_host:
            cmd.append("--no-host-memory")
        cmd += ["--", sys.executable, "-m", "torch.distributed.run", "--nproc-per-node",
                str(ranks), "--master-port", str(port)] + worker
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.pop("GPUMEM_FAKECUDA_NO_HOST_MEMORY", None)
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=args.timeout)
    wall = time.monotonic() - t0
    rows = []
    for name in sorted(os.listdir(results)):
        with open(os.path.join(results, name)) as f:
            rows.append(json.load(f))
    shutil.rmtree(out_dir, ignore_errors=True)
    if proc.returncode != 0 or len(rows) != expect_rows:
        sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-6000:])
        return {"layers": layers, "ranks": ranks, "dim": dim, "no_host_memory": no_host,
                "allocator": "gpumem" if gpumem else "torch", "failed": f"exit status {proc.returncode}", "wall_s": round(wall, 1)}
    rows.sort(key=lambda r: r["rank"])
    shapes = param_shapes(layers, dim, args.heads)
    expect = shard_bytes(shapes, ranks)
    for r in rows:
        r["matches"] = {
            "params": r["param_storage"] == expect,
            "grads": r["grad_bytes"] == expect,
            "adamw_state": r["adamw_state"] == 2 * expect,
        }
        # what torch's allocator adds to the shards: a large block keeps the
        # rest of its 2 MiB-rounded segment when under 1 MiB (0 when every
        # shard is a multiple of 2 MiB or leaves more than 1 MiB)
        r["after_to_empty_minus_arithmetic"] = r["after_to_empty"] - expect
        r["after_step_minus_params_and_state"] = r[f"after_step{args.steps - 1}"] - 3 * expect
        # the first optimizer step: params + grads + exp_avg + exp_avg_sq +
        # AdamW's sqrt temporary, and the two workspaces; what is left is
        # block rounding. (The run's own peak may lie in backward instead.)
        arithmetic = 5 * expect + 2 * CUBLAS_WORKSPACE
        r["step0_optimizer_peak_minus_arithmetic"] = r["step0_optimizer_peak_allocated"] - arithmetic
        r["matches"]["step0_optimizer_peak"] = (
            0 <= r["step0_optimizer_peak_minus_arithmetic"] < 0.005 * arithmetic)
    gib = 1 << 30
    return {
        "layers": layers, "ranks": ranks, "dim": dim, "no_host_memory": no_host,
        "allocator": "gpumem" if gpumem else "torch", "wall_s": round(wall, 1),
        "started": started or "all", "parameters": rows[0]["params"],
        "arithmetic": {"params_per_rank": expect, "grads_per_rank": expect,
                       "adamw_state_per_rank": 2 * expect,
                       "step0_optimizer_peak_per_rank": 5 * expect + 2 * CUBLAS_WORKSPACE,
                       "sum_gib": round(4 * expect / gib, 3)},
        "all_match": all(all(r["matches"].values()) for r in rows),
        "host_rss_peak_gib": [round(r["host_rss_peak"] / gib, 3) for r in rows],
        "peak_allocated_gib": [round(r["peak_allocated"] / gib, 3) for r in rows],
        "ranks": rows,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--dim", type=int, default=4096)
    ap.add_argument("--heads", type=int, default=HEADS, help="query heads (8 key/value heads)")
    ap.add_argument("--ac", choices=("none", "selective", "full"), default="none",
                    help="activation checkpointing: none, every other block, every block")
    ap.add_argument("--bf16", action="store_true",
                    help="FSDP2 mixed precision: bf16 parameters in compute, fp32 reduction")
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--steps", type=int, default=1)
    ap.add_argument("--compare-layers", type=int, default=2,
                    help="also run L layers with and without --no-host-memory (0: skip)")
    ap.add_argument("--compare-ranks", type=int, default=2)
    ap.add_argument("--compare-dim", type=int, default=1024)
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--with-gpumem", action="store_true",
                    help="also run the main model under gpumem simulate --nproc-per-node "
                         "(gpumem installed and recording in every rank) and compare")
    ap.add_argument("--started", default="", metavar="LIST",
                    help="also run the main model with only these ranks started (e.g. 0,7; "
                         "gpumem simulate --ranks) under torch's allocator and gpumem, and "
                         "compare each started rank's peaks with the full run's")
    # the worker's tensor parallel degree and SwiGLU size (benchmarks/cluster_scale.py)
    ap.add_argument("--tp", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--ffn", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--results", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.steps < 1:
        print(f"fsdp_scale: --steps must be at least 1, not {args.steps}", file=sys.stderr)
        return 2
    if args.worker:
        worker(args)
        return 0
    result = {"command": " ".join([Path(sys.executable).name] + sys.argv),
              "config": {k: getattr(args, k) for k in ("ranks", "layers", "dim", "seq", "batch",
                                                      "steps")},
              "dtype": "float32", "main": run_ranks(args, args.layers, True)}
    print(json.dumps(result, indent=1), flush=True)
    ok = result["main"].get("all_match", False)
    if args.with_gpumem:
        g, t = run_ranks(args, args.layers, True, gpumem=True), result["main"]
        side = {"gpumem": g}
        if "failed" not in g and "failed" not in t:
            side["peak_allocated_equal"] = [a["peak_allocated"] == b["peak_allocated"]
                                            for a, b in zip(g["ranks"], t["ranks"])]
            side["reserved_equal"] = [a["reserved"] == b["reserved"]
                                      for a, b in zip(g["ranks"], t["ranks"])]
            side["host_rss_peak_ratio_gpumem_over_torch"] = round(
                max(g["host_rss_peak_gib"]) / max(t["host_rss_peak_gib"]), 3)
        ok = ok and g.get("all_match", False) and all(side.get("peak_allocated_equal", [False]))
        print(json.dumps({"with_gpumem": side}, indent=1), flush=True)
    if args.started:
        full = {"torch": result["main"]}
        if args.with_gpumem:
            full["gpumem"] = g
        same = {}
        for name, f in full.items():
            part = run_ranks(args, args.layers, True, gpumem=name == "gpumem",
                             started=args.started)
            if "failed" in part or "failed" in f:
                same[name] = {"failed": part.get("failed") or f.get("failed")}
                ok = False
                continue
            by_rank = {r["rank"]: r for r in f["ranks"]}
            rows = [{"rank": r["rank"], "peak_allocated": r["peak_allocated"],
                     "full_peak_allocated": by_rank[r["rank"]]["peak_allocated"],
                     "peak_reserved": r["peak_reserved"],
                     "full_peak_reserved": by_rank[r["rank"]]["peak_reserved"],
                     "host_rss_peak_gib": round(r["host_rss_peak"] / (1 << 30), 3)}
                    for r in part["ranks"]]
            equal = all(x["peak_allocated"] == x["full_peak_allocated"] and
                        x["peak_reserved"] == x["full_peak_reserved"] for x in rows)
            ok = ok and equal
            same[name] = {"equal_to_full_run": equal, "ranks": rows,
                          "wall_s": part["wall_s"], "full_wall_s": f["wall_s"],
                          "host_rss_peak_sum_gib": round(sum(
                              r["host_rss_peak"] for r in part["ranks"]) / (1 << 30), 3),
                          "full_host_rss_peak_sum_gib": round(sum(
                              r["host_rss_peak"] for r in f["ranks"]) / (1 << 30), 3)}
        print(json.dumps({"started": args.started, "subset": same}, indent=1), flush=True)
    if args.compare_layers:
        # without the mode every rank's device memory that copies touch is
        # host memory: keep this run small (the default is 2 ranks, dim 1024)
        compare = {mode: run_ranks(args, args.compare_layers, mode == "on", args.compare_ranks,
                                   args.compare_dim) for mode in ("on", "off")}
        if "failed" not in compare["on"] and "failed" not in compare["off"]:
            on, off = (compare[m]["host_rss_peak_gib"] for m in ("on", "off"))
            compare["rss_ratio_off_over_on"] = round(max(off) / max(on), 2)
        print(json.dumps({"compare": compare}, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
