"""No allocation's site is gpumem's own code (Note [gpumem's own frames] in
csrc/python/hist_capture.c; issue 30): before, a nanoGPT run's gradients
(16 GiB) had ``gpumem/_torch.py:358:wrapper`` as their site, the wrapper
that stores the backward context, instead of the script's
``loss.backward()`` line.  Torch's own recorder, side by side: it records
no Python frames for allocations made on autograd's threads, and for the
one allocation backward makes on the calling thread (the seed gradient)
it records torch's frames down to the ``loss.backward()`` line; gpumem
attributes the backward allocations to that same stack (Note [Backward
context]), so their frames are the outer part of torch's."""

from __future__ import annotations

import os

import pytest

import gpumem
from sim_helpers import needs_torch
from torch_helpers import run_gm

OWN = os.path.dirname(os.path.abspath(gpumem.__file__)) + os.sep

STEP = '''
from gpumem.snapshots import summary as analysis
mode = {mode!r}
if mode == "torch":
    torch.cuda.memory._record_memory_history(stacks="python")
else:
    gpumem.install(patch_torch=mode != "no-patch")
    gpumem.recording.history.record_memory_history("all", "all", "python", 100000,
                                         categories=mode == "categories")
m = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8)).cuda()
opt = torch.optim.AdamW(m.parameters())
loss = m(torch.randn(32, 256, device="cuda")).sum()
loss.backward()   # BACKWARD
opt.step()
snap = torch.cuda.memory._snapshot() if mode == "torch" else gpumem.recording.history.snapshot()
frames = [[(f["filename"], f["line"], f["name"]) for f in e.get("frames") or []]
          for e in snap["device_traces"][0] if e["action"] == "alloc"]
sites = [d["site"] for d in analysis.summarize(snap, "x", top=50)["devices"][0]["top_live_at_peak"]]
emit({{"frames": frames, "sites": sites}})
'''


def _run(mode):
    return run_gm(STEP.format(mode=mode), install=False, timeout=240)


@needs_torch
@pytest.mark.slow
def test_no_site_is_gpumem_code_and_backward_is_the_callers_line():
    torch_run = _run("torch")
    # torch's seed gradient: torch/autograd frames, then the loss.backward() line
    (seed,) = [f for f in torch_run["frames"] if any(n == "_make_grads" for _, _, n in f)]
    user = [i for i, (fn, _, _) in enumerate(seed) if fn == "<string>"]
    assert user, seed
    seed_line = seed[user[0]][1]
    assert not [f for f in torch_run["frames"] for fn, _, _ in f if fn.startswith(OWN)]
    for mode in ("patch", "categories", "no-patch"):
        out = _run(mode)
        own = [(fn, line, name) for f in out["frames"] for fn, line, name in f
               if fn.startswith(OWN)]
        assert own == [], (mode, own[:5])
        assert not [s for s in out["sites"] if OWN in s or "gpumem/" in s], (mode, out["sites"])
        backward = [f for f in out["frames"] if f and f[0][2] == "backward"]
        if mode == "no-patch":
            continue   # no backward context without the patches: torch's empty stacks
        assert backward, mode
        for f in backward:
            first_user = next(x for x in f if x[0] == "<string>")
            assert first_user[1] == seed_line, (mode, f, seed)
            assert f == seed[len(seed) - len(f):], (mode, f, seed)   # the outer part of torch's
