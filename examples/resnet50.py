"""ResNet-50 training steps: a snapshot of every allocation, or the profiler's
memory timeline by category.

    gpumem simulate -- python examples/resnet50.py               # writes resnet50.pickle
    gpumem simulate -- python examples/resnet50.py --profile     # also resnet50_timeline.html
    gpumem summary resnet50.pickle                               # per-iteration peaks

(or plain ``python examples/resnet50.py`` on a machine with a GPU).

The scenario of "Understanding GPU Memory 1": five iterations of ResNet-50
with SGD and momentum, batch size 1. The first iteration builds the
optimizer's momentum buffers (one per parameter, 97.5 MiB in all), which is
why the second iteration's peak is higher than the first; from then on
every iteration looks the same. Gradients are freed by
``zero_grad(set_to_none=True)`` at the end of each iteration. Convolutions
and batch norm run through cuDNN, as on a GPU.

``--profile`` records the same loop with torch.profiler
(``profile_memory=True``) and writes the Memory Profiler's timeline, where
each allocation is coloured by what it holds (parameter, gradient, optimizer
state, activation, ...). It needs matplotlib.
"""

import argparse
import os
import sys

import torch
from torch.autograd.profiler import record_function
from torchvision import models


def train(model, inputs, labels, optimizer, iterations, prof=None):
    loss_fn = torch.nn.CrossEntropyLoss()
    for _ in range(iterations):
        if prof is not None:
            prof.step()
        with record_function("## forward ##"):
            pred = model(inputs)
        with record_function("## backward ##"):
            loss_fn(pred, labels).backward()
        with record_function("## optimizer ##"):
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iterations", type=int, default=5)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--profile", action="store_true",
                    help="also record with torch.profiler and write the memory timeline")
    ap.add_argument("--out", default=".", help="where the files go (default: here)")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("resnet50.py needs a GPU: run it under `gpumem simulate -- python ...`")

    model = models.resnet50().to(device="cuda")
    inputs = torch.randn(args.batch, 3, 224, 224, device="cuda")
    labels = torch.rand_like(model(inputs))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9)

    torch.cuda.memory._record_memory_history(max_entries=100000)
    if args.profile:
        with torch.profiler.profile(
                activities=[torch.profiler.ProfilerActivity.CPU,
                            torch.profiler.ProfilerActivity.CUDA],
                record_shapes=True, profile_memory=True, with_stack=True) as prof:
            train(model, inputs, labels, optimizer, args.iterations, prof)
        timeline = os.path.join(args.out, "resnet50_timeline.html")
        prof.export_memory_timeline(timeline, device="cuda:0")
        print(f"memory timeline: {timeline}")
    else:
        train(model, inputs, labels, optimizer, args.iterations)
    path = os.path.join(args.out, "resnet50.pickle")
    torch.cuda.memory._dump_snapshot(path)
    torch.cuda.memory._record_memory_history(enabled=None)
    print(f"snapshot: {path}  (peak allocated {torch.cuda.max_memory_allocated() / 2**20:.1f} MiB)")


if __name__ == "__main__":
    main()
