"""What is the largest batch that fits? A small Transformer language model
trained with AdamW for a few steps; the batch size is a command-line flag,
which ``gpumem fit`` varies.

    gpumem fit --memory 2GiB --vary --batch-size=1..64 -- python examples/batch_fit.py --batch-size 8
    gpumem simulate --memory 2GiB -- python examples/batch_fit.py --batch-size 8
    python examples/batch_fit.py --batch-size 8                 # on a GPU

The memory a step needs grows with the batch: the activations kept for the
backward pass (each layer's attention scores are batch x heads x seq x seq)
and the logits (batch x seq x vocabulary).  Parameters, gradients and
AdamW's two moments do not.  Kernels do not run on the simulator: the loss
it prints is meaningless.
"""

import argparse
import sys

import torch
import torch.nn.functional as F
from torch import nn


def language_model(vocab: int, layers: int, dim: int, heads: int) -> nn.Module:
    """Embedding, a causal Transformer encoder stack, and the output head."""
    block = nn.TransformerEncoderLayer(dim, heads, 4 * dim, dropout=0.0, batch_first=True,
                                       norm_first=True)
    return nn.ModuleDict({"embed": nn.Embedding(vocab, dim),
                          "stack": nn.TransformerEncoder(block, layers, enable_nested_tensor=False),
                          "head": nn.Linear(dim, vocab, bias=False)})


def logits(model: nn.ModuleDict, ids: torch.Tensor) -> torch.Tensor:
    causal = nn.Transformer.generate_square_subsequent_mask(ids.shape[1], device=ids.device)
    return model["head"](model["stack"](model["embed"](ids), mask=causal, is_causal=True))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch-size", type=int, default=8, help="sequences per step")
    p.add_argument("--seq", type=int, default=256, help="tokens per sequence")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--steps", type=int, default=2)
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("needs a GPU, or run it with: gpumem simulate --memory 2GiB -- python "
              "examples/batch_fit.py", file=sys.stderr)
        return 2
    torch.manual_seed(0)
    model = language_model(args.vocab, args.layers, args.dim, args.heads).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for _ in range(args.steps):
        ids = torch.randint(args.vocab, (args.batch_size, args.seq), device="cuda")
        loss = F.cross_entropy(logits(model, ids).flatten(0, 1), ids.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    print(f"batch {args.batch_size}: peak allocated "
          f"{torch.cuda.max_memory_allocated() / (1 << 30):.3f} GiB, peak reserved "
          f"{torch.cuda.max_memory_reserved() / (1 << 30):.3f} GiB", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
