"""Per-rank snapshots under torch.distributed: one file per rank, never overwritten.

    gpumem simulate -- python examples/per_rank.py              # one process, gloo
    torchrun --nproc-per-node 4 examples/per_rank.py --backend nccl   # on 4 GPUs

Under torch.distributed (or with RANK / LOCAL_RANK set) gpumem.record("per_rank.pickle")
writes per_rank_rank<N>.pickle, and so does the OOM snapshot of each rank;
compare the ranks with ``gpumem diff per_rank_rank0.pickle per_rank_rank1.pickle``.
Started without torchrun it initialises a single-process group itself.
"""

import argparse
import os
import socket
import sys

import torch
import torch.distributed as dist

import gpumem

gpumem.install()  # before the first CUDA tensor


def init(backend: str) -> None:
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:   # started by torchrun
        dist.init_process_group(backend)
        return
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=0,
                            world_size=1)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", default="gloo", help="gloo (default; CPU or GPU) or nccl")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--out", default="per_rank.pickle",
                   help="the snapshot; each rank writes OUT's stem + _rank<N>.pickle (default "
                        "per_rank.pickle, in the current folder)")
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("needs a GPU, or run it with: gpumem simulate -- python examples/per_rank.py",
              file=sys.stderr)
        return 2
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    torch.cuda.set_device(local_rank % torch.cuda.device_count())
    init(args.backend)
    rank = dist.get_rank()

    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(),
                            torch.nn.Linear(4096, 1024)).cuda())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    with gpumem.record(args.out) as rec:
        for _ in range(args.steps):
            x = torch.randn(64, 1024, device="cuda")
            model(x).pow(2).mean().backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            rec.step()
    print(f"rank {rank}: wrote {rec.written[-1]}")
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
