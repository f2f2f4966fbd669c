"""A cluster-sized FSDP2 job with only its representative ranks started:
``gpumem simulate --nnodes N --nproc-per-node G --ranks LIST`` (gpumem/sim/world.py).

    python benchmarks/cluster_scale.py [--nnodes 8] [--nproc-per-node 8] [--ranks 0]
                                       [--layers 80] [--dim 8192] [--heads 64]
                                       [--seq 8192] [--batch 8] [--ac selective] [--steps 1]
                                       [--tp 1] [--ffn 0] [--model 70b|405b]

The defaults are Llama 3 70B's shapes (dim 8192, 80 layers, 64 query and 8
key/value heads, SwiGLU MLP of 28672, vocabulary 128256) with torchtitan's
published llama3_70b local batch size (8) and sequence length (8192), on 64
ranks (8 nodes of 8) of 80 GB H100s, FSDP2 over all 64, activation
checkpointing of every other block (--ac selective), FSDP2 mixed precision
(bf16 compute, fp32 reduction; --fp32 turns it off).  The model and step are
benchmarks/fsdp_scale.py's worker (fp32 sharded parameters, AdamW, no
rotary embedding).  --tp T adds tensor parallel over groups of T ranks with
sequence parallel and a sharded loss (torchtitan's plan; fsdp_scale.py's
tensor_parallel), FSDP2 then sharding over the world / T groups.  --model
405b sets Llama 3.1 405B's shapes (dim 16384, 126 layers, 128 query heads,
SwiGLU 53248) and torchtitan's llama3_405b job: 128 ranks, FSDP 16 x TP 8,
local batch 2, sequence 8192, every block checkpointed.  Only --ranks are started, each on its own
simulated GPU with --no-host-memory; the rest of the world is stood in for
(Note [The stand-in store]).  Prints one JSON object: wall time, each started
rank's peaks (from gpumem simulate's summary.json) and peak host RSS (its
VmHWM), and the largest peak RSS of any process of the run
(getrusage(RUSAGE_CHILDREN)).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GIB = 1 << 30


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nnodes", type=int, default=8)
    ap.add_argument("--nproc-per-node", type=int, default=8)
    ap.add_argument("--ranks", default="0")
    ap.add_argument("--layers", type=int, default=80)
    ap.add_argument("--dim", type=int, default=8192)
    ap.add_argument("--heads", type=int, default=64)
    ap.add_argument("--seq", type=int, default=8192)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--ac", choices=("none", "selective", "full"), default="selective")
    ap.add_argument("--steps", type=int, default=1)
    ap.add_argument("--fp32", action="store_true",
                    help="compute in fp32 (default: FSDP2 mixed precision, bf16 compute and "
                         "fp32 reduction, as torchtitan trains)")
    ap.add_argument("--tp", type=int, default=1, help="tensor parallel degree")
    ap.add_argument("--ffn", type=int, default=0, help="SwiGLU size (default 14336 * dim / 4096)")
    ap.add_argument("--model", choices=("70b", "405b"), default="70b",
                    help="405b: Llama 3.1 405B's shapes and torchtitan's job for it (sets "
                         "--nnodes 16 --layers 126 --dim 16384 --heads 128 --ffn 53248 "
                         "--tp 8 --batch 2 --ac full)")
    ap.add_argument("--gpu", default="H100-SXM-80GB")
    ap.add_argument("--timeout", type=float, default=1800)
    args = ap.parse_args(argv)
    if args.model == "405b":
        args.nnodes, args.nproc_per_node, args.layers, args.dim = 16, 8, 126, 16384
        args.heads, args.ffn, args.tp, args.batch, args.ac = 128, 53248, 8, 2, "full"
    out = tempfile.mkdtemp(prefix="cluster-scale-")
    results = os.path.join(out, "results")
    os.mkdir(results)
    worker = [str(ROOT / "benchmarks" / "fsdp_scale.py"), "--worker", "--layers",
              str(args.layers), "--dim", str(args.dim), "--heads", str(args.heads), "--ac",
              args.ac, "--seq", str(args.seq), "--batch", str(args.batch), "--steps",
              str(args.steps), "--tp", str(args.tp), "--ffn", str(args.ffn), "--results",
              results] + ([] if args.fp32 else ["--bf16"])
    cmd = [sys.executable, "-m", "gpumem.sim.command", "--gpu", args.gpu, "--nnodes",
           str(args.nnodes), "--nproc-per-node", str(args.nproc_per_node), "--ranks", args.ranks,
           "--no-host-memory", "--no-view", "--out", out, "--json", "--"] + worker
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=args.timeout)
    wall = time.monotonic() - t0
    largest = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    try:
        with open(os.path.join(out, "summary.json"), encoding="utf-8") as f:
            summary = json.load(f)
    except (OSError, ValueError):
        summary = {}
    workers = {}
    for name in os.listdir(results):
        with open(os.path.join(results, name), encoding="utf-8") as f:
            w = json.load(f)
        workers[w["rank"]] = w
    rows = []
    for row in summary.get("per_rank") or []:
        w = workers.get(row["rank"], {})
        rows.append({"rank": row["rank"], "stands_for": row.get("stands_for"),
                     "peak_allocated": row["peak_allocated"],
                     "peak_reserved": row["peak_reserved"],
                     "peak_allocated_gib": row["peak_allocated"] and
                     round(row["peak_allocated"] / GIB, 3),
                     "peak_reserved_gib": row["peak_reserved"] and
                     round(row["peak_reserved"] / GIB, 3),
                     "device_peak_gib": row.get("device_peak") and
                     round(row["device_peak"] / GIB, 3),
                     "num_ooms": row["num_ooms"], "fits": row["fits"],
                     "host_rss_peak_gib": w.get("host_rss_peak") and
                     round(w["host_rss_peak"] / GIB, 3)})
    result = {"command": " ".join(cmd[:cmd.index("--")]), "exit_status": proc.returncode,
              "config": {k: getattr(args, k) for k in ("nnodes", "nproc_per_node", "ranks",
                                                      "layers", "dim", "heads", "seq", "batch",
                                                      "ac", "steps", "gpu", "fp32", "tp",
                                                      "ffn", "model")},
              "world_size": args.nnodes * args.nproc_per_node,
              "parameters": next(iter(workers.values()), {}).get("params"),
              "wall_s": round(wall, 1), "largest_process_rss_gib": round(largest / GIB, 3),
              "verdict": summary.get("verdict"), "per_rank": rows,
              "load_average": os.getloadavg()}
    if proc.returncode != 0:
        result["stderr_tail"] = proc.stderr[-2000:]
    print(json.dumps(result, indent=1))
    return 0 if rows else 1


if __name__ == "__main__":
    sys.exit(main())
