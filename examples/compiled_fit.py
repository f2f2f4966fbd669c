"""Will my compiled run fit? A small GPT's training step (forward, backward,
AdamW), run eagerly or under ``torch.compile``, with its peak memory.

    gpumem simulate -- python examples/compiled_fit.py --mode default
    gpumem simulate --gpu L4 -- python examples/compiled_fit.py --mode reduce-overhead --layers 12
    python examples/compiled_fit.py --mode max-autotune     # on a machine with a GPU

A compiled step allocates differently from the eager one: Inductor fuses
elementwise work (fewer intermediate tensors), chooses what the backward
pass saves and what it recomputes, and its generated code frees buffers as
soon as their last reader is done. ``reduce-overhead`` also captures the
step into CUDA graphs, whose memory lives in a private pool that is kept
between steps. Only running the compiled step tells you its peak: this
script does, and ``gpumem simulate`` runs it on a simulated GPU of the
model you name, so the answer needs no GPU (Inductor's and Triton's
compilers run on the CPU; the simulated GPU loads and launches the kernels
they produce, which compute nothing).

The last line is the peak of the steps after the first (the first one
compiles, and warms up CUDA graphs), as ``key=value`` pairs.
"""

import argparse
import sys

import torch
import torch.nn.functional as F
from torch import nn

from bf16_attention import Block  # the same pre-norm attention block, beside this file

MODES = ("eager", "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


class GPT(nn.Module):
    def __init__(self, vocab, width, heads, layers, context):
        super().__init__()
        self.tok = nn.Embedding(vocab, width)
        self.pos = nn.Embedding(context, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.tok.weight

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


def train_step(model, optimizer, idx, targets):
    logits = model(idx)
    loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.detach()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", choices=MODES, default="default",
                    help="eager, or a torch.compile mode (default: default)")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=4)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("compiled_fit.py needs a GPU: run it under `gpumem simulate -- python ...`")
    if args.width % args.heads:
        sys.exit(f"--width {args.width} is not a multiple of --heads {args.heads}; pick values that divide")
    if args.steps < 2:
        sys.exit("--steps must be at least 2: the first step compiles and is not measured")

    torch.manual_seed(0)
    model = GPT(args.vocab, args.width, args.heads, args.layers, args.context).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    step = train_step
    if args.mode != "eager":
        step = torch.compile(train_step, mode=None if args.mode == "default" else args.mode)
    shape = (args.batch, args.context)
    for i in range(1, args.steps + 1):
        idx = torch.randint(0, args.vocab, shape, device="cuda")
        targets = torch.randint(0, args.vocab, shape, device="cuda")
        if args.mode == "reduce-overhead":
            torch.compiler.cudagraph_mark_step_begin()
        loss = step(model, optimizer, idx, targets)
        torch.cuda.synchronize()
        if i == 1:
            torch.cuda.reset_peak_memory_stats()
        print(f"step {i}: loss {loss.item():.3f}, allocated {torch.cuda.memory_allocated() / 2**20:.1f} MiB, "
              f"reserved {torch.cuda.memory_reserved() / 2**20:.1f} MiB", flush=True)
    stats = torch.cuda.memory_stats()
    print(f"mode={args.mode} peak_allocated={stats['allocated_bytes.all.peak']} "
          f"peak_reserved={stats['reserved_bytes.all.peak']} "
          f"allocations={stats['allocation.all.allocated']}", flush=True)


if __name__ == "__main__":
    main()
