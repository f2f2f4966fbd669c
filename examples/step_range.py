"""Step-range scheduling: record only steps [start, stop) of a long run.

    gpumem simulate -- python examples/step_range.py
    gpumem summary step_range.pickle        # the recorded steps, one row each

(or plain ``python examples/step_range.py`` on a machine with a GPU).

``gpumem.record(path, start_step=10, stop_step=13)`` records nothing during
warm-up; recording starts when step 10 begins, and when step 13 would begin
the snapshot is written and recording stops, while training goes on.
``rec.step()`` ends a step (call it once per iteration).
"""

import argparse
import sys

import torch

import gpumem

gpumem.install()  # before the first CUDA tensor


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--start", type=int, default=10)
    p.add_argument("--stop", type=int, default=13)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--out", default="step_range.pickle")
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("needs a GPU, or run it with: gpumem simulate -- python examples/step_range.py",
              file=sys.stderr)
        return 2

    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(d_model=256, nhead=4, dim_feedforward=1024,
                                             batch_first=True)
    model = torch.nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    with gpumem.record(args.out, start_step=args.start, stop_step=args.stop) as rec:
        for step in range(args.steps):
            x = torch.randn(8, 64, 256, device="cuda")
            model(x).pow(2).mean().backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            rec.step()
            if rec.written and step + 1 == args.stop:
                print(f"step {step}: recorded steps {args.start}..{args.stop - 1}, "
                      f"wrote {rec.written[-1]}; training goes on")
    print(f"see the recorded steps: gpumem summary {rec.written[-1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
