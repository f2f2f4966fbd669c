"""Capture on OOM: a snapshot of the moment an allocation fails, written for you.

    gpumem simulate --memory 24GiB -- python examples/oom_capture.py
    gpumem view oom_capture_oom.pickle      # the failing allocation and what filled the GPU

(or plain ``python examples/oom_capture.py`` on a machine with a GPU).

The script doubles the batch size until the training step runs out of
memory.  Inside ``gpumem.record(...)`` (dump_on_oom=True is the default)
the snapshot is written before the exception reaches Python: it holds the
'oom' event and every live allocation with its stack, and the exception
message gains a line naming the file.  The script's own
``except torch.cuda.OutOfMemoryError`` still catches the error.

Without changing code, the same for every OOM of a process:
    GPUMEM_OOM_SNAPSHOT=/tmp/oom python train.py     # with gpumem.install() in train.py
"""

import argparse
import sys

import torch

import gpumem

gpumem.install()  # before the first CUDA tensor


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="oom_capture.pickle")
    p.add_argument("--batch", type=int, default=8, help="first batch size (doubled each step)")
    p.add_argument("--max-batch", type=int, default=1 << 16)
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("needs a GPU, or run it with: gpumem simulate -- python examples/oom_capture.py",
              file=sys.stderr)
        return 2

    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(2048, 8192),
                                                      torch.nn.GELU(),
                                                      torch.nn.Linear(8192, 2048))
                                  for _ in range(4)]).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    batch, fitted = args.batch, None
    with gpumem.record(args.out) as rec:
        try:
            while batch <= args.max_batch:
                x = torch.randn(batch, 256, 2048, device="cuda")
                loss = model(x).pow(2).mean()
                loss.backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                print(f"batch {batch}: fits, peak {torch.cuda.max_memory_allocated() / 2**30:.2f} "
                      "GiB")
                fitted, batch = batch, batch * 2
                del x, loss
                rec.step()
        except torch.cuda.OutOfMemoryError as e:
            print(f"batch {batch}: out of memory")
            print("  " + str(e).splitlines()[-1])   # gpumem: memory snapshot at this OOM ...
    print(f"largest batch that fits: {fitted}")
    if rec.oom_snapshots:
        print(f"look at the failure: gpumem view {rec.oom_snapshots[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
