"""A kernel's output read back on the simulator is not what an earlier tensor
left in its block (Note [Blocks handed out] in
simgpu/driver/fakecuda_handout.c; issue 30).  Kernels compute nothing, so a
loss's `.item()` reads the bytes its block held: torchtitan, which stops at a
loss that is not finite, read NaN and -inf left by earlier copies in reused
blocks and failed now and then on 2 simulated GPUs.  gpumem tells the
simulator's driver when it hands a block out, and a small block then reads
zeros, as fresh device memory does; torch's allocator does not, and reads
the stale bytes, shown side by side."""

from __future__ import annotations

import pytest

from sim_helpers import needs_torch
from torch_helpers import run_gm

# Small blocks that held NaN and -inf, freed; then kernel outputs (a sum, a
# mean) in blocks of the same size, read back the way a training loop reads
# its loss.  Values copied to the device and read back stay as copied.
STALE = '''
import math
xs = [torch.full((128,), v).cuda() for v in (float("nan"), float("-inf")) * 8]
del xs
x = torch.ones(128).cuda()
losses = []
for _ in range(16):
    losses.append(x.sum().item())
    losses.append(x.mean().item())
copied = torch.tensor([3.5]).cuda()
emit({"finite": [math.isfinite(v) for v in losses], "losses": [repr(v) for v in losses],
      "copied": copied.item(), "x": x[:4].tolist()})
'''


@needs_torch
@pytest.mark.slow  # two torch runs (about 17 s each); the fast tier stays under its bar
@pytest.mark.parametrize("install", [False, True], ids=["torch", "gpumem"])
def test_a_kernels_output_in_a_reused_block_reads_zeros_under_gpumem(install):
    out = run_gm(STALE, install=install, timeout=120)
    assert out["copied"] == 3.5 and out["x"] == [1.0] * 4
    if install:
        assert all(out["finite"]), out["losses"]
        assert set(out["losses"]) == {"0.0"}, out["losses"]
    else:
        # torch's allocator hands out the blocks the NaN and -inf were in
        assert not all(out["finite"]), out["losses"]
