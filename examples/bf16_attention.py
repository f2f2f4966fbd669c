"""A bf16 Transformer block trained with F.scaled_dot_product_attention: what
attention keeps for backward.

    gpumem simulate -- python examples/bf16_attention.py     # writes bf16_attention.pickle
    gpumem summary bf16_attention.pickle

(or plain ``python examples/bf16_attention.py`` on a machine with a GPU).

The model and its inputs are bf16 (no autocast), with AdamW. On an H100
torch 2.14 picks cuDNN's fused attention kernel for this call, which never
materialises the seq x seq score matrix: per layer it saves only the output
and one fp32 log-sum-exp value per row and head (batch x heads x seq x 4
bytes) for backward. Compare ``--math``, which forces the unfused math
backend and stores the batch x heads x seq x seq softmax for every layer.
"""

import argparse
import contextlib
import os
import sys

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel


class Block(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.mlp(self.norm2(x))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--dim", type=int, default=1024)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--math", action="store_true", help="use the unfused math attention")
    ap.add_argument("--out", default=".", help="where the snapshot goes (default: here)")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("bf16_attention.py needs a GPU: run it under `gpumem simulate -- python ...`")

    model = nn.Sequential(*[Block(args.dim, args.heads) for _ in range(args.layers)])
    model = model.to(device="cuda", dtype=torch.bfloat16)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    attention = sdpa_kernel(SDPBackend.MATH) if args.math else contextlib.nullcontext()
    torch.cuda.memory._record_memory_history(max_entries=100000)
    with attention:
        for _ in range(args.steps):
            x = torch.randn(args.batch, args.seq, args.dim, device="cuda", dtype=torch.bfloat16)
            model(x).float().pow(2).mean().backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    name = "bf16_attention_math" if args.math else "bf16_attention"
    path = os.path.join(args.out, name + ".pickle")
    torch.cuda.memory._dump_snapshot(path)
    torch.cuda.memory._record_memory_history(enabled=None)
    print(f"snapshot: {path}  (peak allocated {torch.cuda.max_memory_allocated() / 2**20:.1f} MiB)")


if __name__ == "__main__":
    main()
