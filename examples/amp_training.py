"""Mixed-precision training (autocast to fp16, GradScaler, Adam) of one
linear layer: where every fp16 copy, fp32 gradient and optimizer buffer
comes from.

    gpumem simulate -- python examples/amp_training.py     # writes amp_training.pickle
    gpumem view amp_training.pickle                        # the timeline, step by step

(or plain ``python examples/amp_training.py`` on a machine with a GPU).

The case study of "PyTorch Memory Snapshot: A Guide to GPU Usage Analysis".
In each step autocast casts the fp32 weight and the fp32 input to fp16 (two
allocations the fp32 model does not make), the forward pass makes an fp16
output, and backward makes the fp16 weight gradient and then the fp32
``.grad`` the optimizer reads. Adam's two moment buffers (2 x the fp32
weight) are made by the first optimizer step that is not skipped.

On a GPU the first steps usually overflow at GradScaler's initial scale of
65536, so ``scaler.step`` skips them and Adam's buffers appear a step or
more later. On the simulated GPU kernels compute nothing, the overflow
check finds nothing, and no step is skipped: the buffers appear in step 1.
Every allocation's size is the same as on a GPU; only this data-dependent
decision differs.
"""

import argparse
import os
import sys

import torch


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--features", type=int, default=3072)
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--out", default=".", help="where the snapshot goes (default: here)")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("amp_training.py needs a GPU: run it under `gpumem simulate -- python ...`")

    torch.cuda.memory._record_memory_history(max_entries=100000)
    model = torch.nn.Linear(args.features, args.features, bias=False, device="cuda")
    optimizer = torch.optim.Adam(model.parameters())
    scaler = torch.amp.GradScaler("cuda")
    for step in range(1, args.steps + 1):
        data = torch.randn(args.batch, args.features, device="cuda")
        with torch.autocast("cuda", dtype=torch.float16):
            output = model(data)
            loss = output.float().pow(2).mean()
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        print(f"step {step}: allocated {torch.cuda.memory_allocated() / 2**20:.1f} MiB, "
              f"Adam state for {len(optimizer.state)} parameter(s)")
    path = os.path.join(args.out, "amp_training.pickle")
    torch.cuda.memory._dump_snapshot(path)
    torch.cuda.memory._record_memory_history(enabled=None)
    print(f"snapshot: {path}")


if __name__ == "__main__":
    main()
