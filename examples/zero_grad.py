"""The missing zero_grad: gradients that stay allocated between training steps.

    gpumem simulate -- python examples/zero_grad.py                   # writes zero_grad.pickle
    gpumem simulate -- python examples/zero_grad.py --no-zero-grad    # writes no_zero_grad.pickle
    gpumem diff zero_grad.pickle no_zero_grad.pickle    # what the bug keeps alive, by site
    gpumem summary no_zero_grad.pickle                  # per-step peaks: step 1 is higher

(or plain ``python examples/zero_grad.py`` on a machine with a GPU).

Without ``optimizer.zero_grad(set_to_none=True)`` every parameter's .grad
stays allocated from one step's backward to the next, so each step's forward
pass runs on top of a full set of gradients: the peak rises from the second
step on, and the snapshot at the end still holds them.
"""

import argparse
import os
import sys

import torch

import gpumem

gpumem.install()  # before the first CUDA tensor


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--no-zero-grad", action="store_true", help="leave out optimizer.zero_grad()")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--out", default=None, help="snapshot file (default: [no_]zero_grad.pickle)")
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("needs a GPU, or run it with: gpumem simulate -- python examples/zero_grad.py",
              file=sys.stderr)
        return 2
    out = args.out or ("no_zero_grad.pickle" if args.no_zero_grad else "zero_grad.pickle")

    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(d_model=512, nhead=8, dim_feedforward=2048,
                                             batch_first=True)
    model = torch.nn.Sequential(
        torch.nn.TransformerEncoder(layer, num_layers=4, enable_nested_tensor=False),
        torch.nn.Linear(512, 512)).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(16, 128, 512, device="cuda")

    with gpumem.record(out) as rec:
        for step in range(args.steps):
            loss = model(x).pow(2).mean()
            loss.backward()
            optimizer.step()
            if not args.no_zero_grad:
                optimizer.zero_grad(set_to_none=True)   # the line the bug leaves out
            print(f"step {step}: peak {torch.cuda.max_memory_allocated() / 2**20:.1f} MiB, "
                  f"allocated after the step {torch.cuda.memory_allocated() / 2**20:.1f} MiB")
            torch.cuda.reset_peak_memory_stats()
            rec.step()
    print(f"wrote {rec.written[-1]}")
    other = "zero_grad.pickle" if args.no_zero_grad else "no_zero_grad.pickle"
    if os.path.exists(other):
        print(f"compare: gpumem diff zero_grad.pickle no_zero_grad.pickle")
    return 0


if __name__ == "__main__":
    sys.exit(main())
