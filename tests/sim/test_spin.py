"""Loops that wait on a kernel's result end on the simulator (Note [Reads that
wait on kernels] in simgpu/driver/fakecuda_spin.c; issue 30): torch's
nn.init.trunc_normal_ redraws until ``mask.any()`` is false, and on the
simulator, whose kernels compute nothing, that byte was whatever an earlier
copy left in a reused block: torchtitan's model init spun forever.  Small
values a program copied and reads back are still read as copied."""

from __future__ import annotations

import pytest

from sim_helpers import needs_torch
from torch_helpers import run_gm

# Small blocks holding non-zero bytes, which the one-byte results of
# `.any()` then reuse: before the fix, trunc_normal_ never returned.
TRUNC_NORMAL = '''
import time
xs = [torch.tensor([255] * 8, dtype=torch.uint8).cuda() for _ in range(64)]
del xs
t = time.monotonic()
for _ in range(3):
    torch.nn.init.trunc_normal_(torch.empty(1000, device="cuda"))
emit({"seconds": time.monotonic() - t})
'''


@needs_torch
@pytest.mark.slow  # two torch runs (2.4 s each)
@pytest.mark.parametrize("install", [False, True],
                         ids=["torch", "gpumem"])
def test_trunc_normal_finishes_under_both_allocators(install):
    out = run_gm(TRUNC_NORMAL, install=install, timeout=120)
    assert out["seconds"] < 30


@needs_torch
@pytest.mark.slow  # fast tier: one test of this kind is enough (README, Test)
def test_values_copied_to_the_device_still_read_back_and_a_spin_reads_zeros():
    out = run_gm('''
        x = torch.tensor([7], dtype=torch.int64).cuda()
        plain = [x.item() for _ in range(200)]          # no kernel between: a value, not a wait
        y = torch.empty(1, dtype=torch.int64, device="cuda")
        rewritten = []
        for _ in range(200):                            # kernels between, but rewritten each time
            y.copy_(torch.tensor([9]))
            torch.empty(16, device="cuda").normal_()
            rewritten.append(y.item())
        flag = torch.tensor([1], dtype=torch.uint8).cuda()
        spun = []
        for _ in range(100):                            # a loop waiting for a kernel to clear it
            torch.empty(16, device="cuda").normal_()
            spun.append(flag.item())
        emit({"plain": plain, "rewritten": rewritten, "spun": spun})
    ''', install=False, timeout=120)
    assert set(out["plain"]) == {7} and set(out["rewritten"]) == {9}
    # 64 reads give the copied byte (63 of them repeats); from then on, zeros
    assert out["spun"] == [1] * 64 + [0] * 36
