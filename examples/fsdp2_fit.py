"""Will my FSDP2 run fit? A Transformer language model sharded with
``fully_shard`` (FSDP2) and trained with AdamW; each rank prints its peak.

    gpumem simulate --devices 4 -- torchrun --nproc-per-node 4 examples/fsdp2_fit.py
    python -m gpumem.sim --devices 8 -- torchrun --nproc-per-node 8 \\
        examples/fsdp2_fit.py --layers 32 --dim 4096 --heads 32 --meta --dtype bf16
    torchrun --nproc-per-node 8 examples/fsdp2_fit.py ...        # on 8 GPUs

Each encoder layer is its own FSDP2 unit and the root holds the embedding
and the output head. Every parameter is split on dim 0 into world-size
chunks (the last ones padded), so a rank keeps about 1/N of the parameters
and, after the first step, of AdamW's two moments; a layer's full
parameters exist only while it runs (all-gathered, then freed again).

--meta builds the model on the meta device (no memory anywhere), shards
it, then allocates only this rank's shards on the GPU with
``model.to_empty(device="cuda")`` and initialises them again: how a model
larger than the host's memory is built, and how the simulator runs one.
Started without torchrun it forms a group of one rank itself. Kernels do
not run on the simulator: the loss it prints is meaningless.
"""

import argparse
import os
import socket
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.fsdp import fully_shard

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
VOCAB = 32000


class LM(nn.Module):
    def __init__(self, layers, dim, heads, seq):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, dim)
        self.pos = nn.Embedding(seq, dim)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(dim, heads, 4 * dim, dropout=0.0, batch_first=True,
                                       norm_first=True) for _ in range(layers))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, VOCAB, bias=False)

    def forward(self, ids):
        x = self.tok(ids) + self.pos(torch.arange(ids.shape[1], device=ids.device))
        mask = nn.Transformer.generate_square_subsequent_mask(ids.shape[1], device=ids.device,
                                                              dtype=x.dtype)
        for layer in self.layers:
            x = layer(x, src_mask=mask, is_causal=True)
        return self.head(self.norm(x))


def init_group() -> None:
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:   # started by torchrun
        dist.init_process_group("nccl")
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=0,
                            world_size=1)


def reinit(model: nn.Module) -> None:
    """Initialise the parameters again, as each module's constructor does."""
    for m in model.modules():
        if isinstance(m, nn.MultiheadAttention):
            m._reset_parameters()
        elif hasattr(m, "reset_parameters"):
            m.reset_parameters()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--batch", type=int, default=4, help="sequences per rank and step")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--meta", action="store_true",
                   help="build on the meta device, shard, then allocate only the shards")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="fp32",
                   help="parameters, gradients and AdamW state in this type")
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("needs a GPU, or run it with: gpumem simulate --devices N -- torchrun "
              "--nproc-per-node N examples/fsdp2_fit.py", file=sys.stderr)
        return 2
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)) % torch.cuda.device_count())
    init_group()
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)

    dtype = DTYPES[args.dtype]
    with torch.device("meta" if args.meta else "cpu"):
        model = LM(args.layers, args.dim, args.heads, args.seq).to(dtype)
    n_params = sum(p.numel() for p in model.parameters())
    for layer in model.layers:
        fully_shard(layer)
    fully_shard(model)  # on the host: moves each shard to this rank's GPU
    if args.meta:
        model.to_empty(device="cuda")
        reinit(model)
    sharded = torch.cuda.memory_allocated()

    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for step in range(args.steps):
        ids = torch.randint(VOCAB, (args.batch, args.seq), device="cuda")
        loss = F.cross_entropy(model(ids).flatten(0, 1).float(), ids.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    gib = 1 << 30
    print(f"rank {rank}/{world}: {n_params / 1e6:.1f} M parameters ({args.dtype}), "
          f"shards {sharded / gib:.3f} GiB, peak allocated "
          f"{torch.cuda.max_memory_allocated() / gib:.3f} GiB, peak reserved "
          f"{torch.cuda.max_memory_reserved() / gib:.3f} GiB", flush=True)
    print(f"rank={rank} world={world} params={n_params} sharded={sharded} "
          f"peak_allocated={torch.cuda.max_memory_allocated()} "
          f"peak_reserved={torch.cuda.max_memory_reserved()}", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
