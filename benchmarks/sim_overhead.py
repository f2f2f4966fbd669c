"""One training step of a small Transformer on the simulated GPU.

    python benchmarks/sim_overhead.py [--json] [--steps 5] [--memory 80GiB]
                                      [--events MODE] [--baseline LIBDIR] [--repeats N]

Runs PyTorch's official CUDA build under the simulator (gpumem.sim: fake
libcuda/libcudart/libcublas[Lt], kernels and GEMMs are no-ops, memory is
host memory) in a subprocess and reports, for PyTorch's own caching
allocator:

  step_wall_s          median wall time of one training step (forward, loss,
                       backward, AdamW step, zero_grad) after the first
  first_step_wall_s    the first step (creates the optimizer state, cuBLAS
                       handles and workspaces)
  peak_reserved_bytes  torch.cuda.max_memory_reserved() over all steps
  peak_allocated_bytes torch.cuda.max_memory_allocated()
  device_peak_bytes    the fake device's own peak (what cudaMalloc took)
  process_wall_s       the whole subprocess: Python start, import torch,
                       CUDA init (kernel registration), model build, steps
  runtime_calls_per_step, kernel_launches_per_step  CUDA runtime calls and
                       (no-op) launches one steady-state step makes

With --baseline LIBDIR the same step also runs on another build of the
fakes (e.g. main's: build simgpu/ of that checkout with its build.py into
LIBDIR), in alternating processes (--repeats N of each); the result adds
"baseline" and "ratio" (step_wall_s of this build / the baseline's,
medians): the simulator's own cost per training step, measured in one run.

The model: nn.Transformer(d_model=256, nhead=8, 2+2 layers, ff 1024),
batch 16, sequence 64, fp32, AdamW. The "gpumem" column (gpumem's allocator
as torch's allocator) is added by the drop-in issue.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gpumem import sim  # noqa: E402

STEP_SNIPPET = textwrap.dedent('''
    import ctypes, json, statistics, sys, time
    import torch
    steps = int(sys.argv[1])
    cfg = json.loads(sys.argv[2])

    def report():
        lib = ctypes.CDLL("libcudart.so.13")
        n = lib.gpumem_sim_cudart_report_json(None, 0)
        buf = ctypes.create_string_buffer(n + 1)
        lib.gpumem_sim_cudart_report_json(buf, n + 1)
        return json.loads(buf.value)

    torch.manual_seed(0)
    model = torch.nn.Transformer(d_model=cfg["d_model"], nhead=cfg["nhead"],
                                 num_encoder_layers=cfg["layers"], num_decoder_layers=cfg["layers"],
                                 dim_feedforward=cfg["ff"], batch_first=True).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    src = torch.randn(cfg["batch"], cfg["seq"], cfg["d_model"]).cuda()
    tgt = torch.randn(cfg["batch"], cfg["seq"], cfg["d_model"]).cuda()

    def step():
        loss = model(src, tgt).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()

    times = []
    calls = []
    for i in range(steps):
        before = report()
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
        after = report()
        calls.append((sum(after["calls"].values()) - sum(before["calls"].values()),
                      after["kernels"]["launches"] - before["kernels"]["launches"]))
    r = report()
    print(json.dumps({
        "first_step_wall_s": times[0],
        "step_wall_s": statistics.median(times[1:]) if len(times) > 1 else times[0],
        "peak_reserved_bytes": torch.cuda.max_memory_reserved(),
        "peak_allocated_bytes": torch.cuda.max_memory_allocated(),
        "device_peak_bytes": r["driver"]["devices"][0]["peak_bytes_used"],
        # the report calls themselves are not CUDA calls; counts are exact
        "runtime_calls_per_step": calls[-1][0],
        "kernel_launches_per_step": calls[-1][1],
        "parameters": sum(p.numel() for p in model.parameters()),
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(0),
    }))
''')

CONFIG = {"d_model": 256, "nhead": 8, "layers": 2, "ff": 1024, "batch": 16, "seq": 64}


def run(steps: int, memory: str, events=None, lib_dir=None) -> dict:
    env = None
    saved = os.environ.get("GPUMEM_SIM_LIB_DIR")
    if lib_dir is not None:  # another build of the fakes; the model by a key any build knows
        os.environ["GPUMEM_SIM_LIB_DIR"] = str(lib_dir)
        env = {"GPUMEM_SIM_GPU": "name=NVIDIA H100 80GB HBM3"}
    try:
        t0 = time.perf_counter()
        rc, out, err = sim.run_snippet(STEP_SNIPPET, memory=memory, events=events, env=env,
                                       args=[str(steps), json.dumps(CONFIG)], timeout=900)
        wall = time.perf_counter() - t0
    finally:
        if lib_dir is not None:
            if saved is None:
                os.environ.pop("GPUMEM_SIM_LIB_DIR", None)
            else:
                os.environ["GPUMEM_SIM_LIB_DIR"] = saved
    # PyTorch's exit race (simgpu/README.md, Limitations) can abort the
    # process after it printed its row; the row is complete, so it counts
    race = rc == -6 and "terminate called without an active exception" in err
    if rc != 0 and not (race and out.strip().startswith("{")):
        raise SystemExit(f"the simulated run failed (exit {rc}):\n{err[-4000:]}")
    row = json.loads(out.splitlines()[-1])
    row["process_wall_s"] = wall
    row["allocator"] = "torch"
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--steps", type=int, default=5, help="training steps to time (default 5)")
    ap.add_argument("--memory", default="80GiB", help="simulated device capacity (default 80GiB)")
    ap.add_argument("--events", default=None, help="the simulator's event mode (default: its own)")
    ap.add_argument("--baseline", default=None, metavar="LIBDIR",
                    help="another build of the fakes to compare with, in the same run")
    ap.add_argument("--repeats", type=int, default=1, help="processes per build (default 1)")
    args = ap.parse_args(argv)
    sim.lib_dir()  # build the fakes first, outside the timing
    steps = max(2, args.steps)
    rows, base_rows = [], []
    for _ in range(max(1, args.repeats)):  # alternate, so that drift hits both alike
        rows.append(run(steps, args.memory, args.events))
        if args.baseline:
            base_rows.append(run(steps, args.memory, args.events, lib_dir=args.baseline))
    row = _median_row(rows)
    result = {"benchmark": "sim_overhead", "model": CONFIG, "steps": steps,
              "memory": args.memory, "events": args.events, "repeats": len(rows),
              "results": {"torch": row}}
    if args.baseline:
        base = _median_row(base_rows)
        result["baseline"] = {"lib_dir": args.baseline, "torch": base}
        result["ratio"] = {k: row[k] / base[k] for k in
                           ("step_wall_s", "first_step_wall_s", "process_wall_s") if base[k]}
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    mib = 1 << 20
    print(f"{row['device']} ({args.memory}), torch {row['torch']}, "
          f"{row['parameters'] / 1e6:.1f} M parameters, batch {CONFIG['batch']} x seq {CONFIG['seq']}")
    print(f"  torch allocator: step {row['step_wall_s'] * 1e3:.1f} ms "
          f"(first {row['first_step_wall_s'] * 1e3:.1f} ms), "
          f"peak reserved {row['peak_reserved_bytes'] / mib:.1f} MiB, "
          f"peak allocated {row['peak_allocated_bytes'] / mib:.1f} MiB, "
          f"{row['runtime_calls_per_step']} runtime calls and "
          f"{row['kernel_launches_per_step']} launches per step, "
          f"whole process {row['process_wall_s']:.1f} s")
    if args.baseline:
        print(f"  baseline ({args.baseline}): step "
              f"{result['baseline']['torch']['step_wall_s'] * 1e3:.2f} ms; ratio "
              f"{result['ratio']['step_wall_s']:.3f} per step")
    return 0


def _median_row(rows: list) -> dict:
    """The first row with each timing replaced by its median over rows."""
    out = dict(rows[0])
    for k in ("step_wall_s", "first_step_wall_s", "process_wall_s"):
        out[k] = statistics.median(r[k] for r in rows)
    return out


if __name__ == "__main__":
    sys.exit(main())
