"""Before / after: two snapshots bracketing the steps that leak, for ``gpumem diff``.

    gpumem simulate -- python examples/before_after.py
    gpumem diff before.pickle after.pickle      # what grew, grouped by allocation site
    gpumem simulate -- python examples/before_after.py --fixed     # nothing grows

(or plain ``python examples/before_after.py`` on a machine with a GPU).

The first snapshot is taken after warm-up, so one-time allocations (the
optimizer state, cuBLAS workspaces) do not show up as growth.  The "bug":
predictions kept on the GPU for an end-of-epoch metric (``preds.append(
out.detach())``); the fix moves them to the CPU.
"""

import argparse
import sys

import torch

import gpumem

gpumem.install()  # before the first CUDA tensor


def train_step(model, optimizer, x, y):
    out = model(x)
    loss = torch.nn.functional.mse_loss(out, y)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--fixed", action="store_true", help="keep the predictions on the CPU")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--before", default="before.pickle")
    p.add_argument("--after", default="after.pickle")
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("needs a GPU, or run it with: gpumem simulate -- python examples/before_after.py",
              file=sys.stderr)
        return 2

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(2048, 2048), torch.nn.ReLU(),
                                torch.nn.Linear(2048, 2048)).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(256, 2048, device="cuda")
    y = torch.randn(256, 2048, device="cuda")
    preds = []

    with gpumem.record(args.after) as rec:     # the after snapshot is written on exit
        for _ in range(args.warmup):
            train_step(model, optimizer, x, y)
        torch.cuda.empty_cache()
        before = rec.dump(args.before)          # baseline, after warm-up
        for _ in range(args.steps):
            out = train_step(model, optimizer, x, y)
            preds.append(out.cpu() if args.fixed else out.detach())  # BUG unless --fixed
            rec.step()
    print(f"wrote {before} and {rec.written[-1]}")
    print(f"what grew: gpumem diff {before} {rec.written[-1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
