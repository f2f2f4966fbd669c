"""The loss-history leak: a logged loss that keeps its whole forward pass alive.

    gpumem simulate -- python examples/loss_history_leak.py            # the bug
    gpumem diff loss_leak_before.pickle loss_leak_after.pickle         # what grew, by line
    gpumem summary loss_leak_after.pickle                              # per-step growth
    gpumem simulate -- python examples/loss_history_leak.py --fixed    # nothing grows

(or plain ``python examples/loss_history_leak.py`` on a machine with a GPU).

Each step logs a validation loss into ``loss_history``.  Computed with
autograd on and kept as a tensor, that loss holds its graph, and the graph
holds every activation its forward pass saved: memory climbs every step.
The fix is ``loss_history.append(val_loss.item())`` (and torch.no_grad()).
"""

import argparse
import sys

import torch

import gpumem

gpumem.install()  # before the first CUDA tensor


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--fixed", action="store_true", help="log loss.item() instead of the tensor")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--prefix", default="loss_leak", help="snapshots: PREFIX_before/after.pickle")
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("needs a GPU, or run it with: gpumem simulate -- python "
              "examples/loss_history_leak.py", file=sys.stderr)
        return 2

    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(d_model=512, nhead=8, dim_feedforward=2048,
                                             batch_first=True)
    model = torch.nn.TransformerEncoder(layer, num_layers=4, enable_nested_tensor=False).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(16, 128, 512, device="cuda")
    x_val = torch.randn(16, 128, 512, device="cuda")
    loss_history = []

    with gpumem.record(f"{args.prefix}_after.pickle") as rec:
        for step in range(args.steps):
            loss = model(x).pow(2).mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            val_loss = model(x_val).pow(2).mean()
            if args.fixed:
                loss_history.append(val_loss.item())
            else:
                loss_history.append(val_loss)  # BUG: keeps val_loss's graph and activations
            print(f"step {step}: allocated {torch.cuda.memory_allocated() / 2**20:.1f} MiB")
            rec.step()
            if step == 1:  # after warm-up: the optimizer state exists from here on
                rec.dump(f"{args.prefix}_before.pickle")
    print("wrote " + " and ".join(rec.written))
    print(f"find the leak: gpumem diff {rec.written[0]} {rec.written[-1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
