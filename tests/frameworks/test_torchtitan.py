"""torchtitan's llama3 debug model, trained as torchtitan's run_train.sh trains it,
on 1 and 2 simulated GPUs, under torch's allocator and under gpumem.

What is emulated (conftest._torchtitan): run_train.sh with NGPU=1 or 2 and
its defaults, MODULE=llama3 CONFIG=llama3_debugmodel LOG_RANK=0, so
PYTORCH_ALLOC_CONF=expandable_segments:True and torchrun --nproc_per_node=NGPU
--rdzv_backend c10d --rdzv_endpoint=localhost:0 --local-ranks-filter 0
--role rank --tee 3 -m torchtitan.train --module llama3 --config
llama3_debugmodel, plus --training.steps 3.  Everything else is the config's
default: flex attention (compiled, max-autotune), selective activation
checkpointing, FSDP over the ranks, and the forward+backward captured as a
CUDA graph (training.disable_cuda_graphs is False), recorded at step 2 and
replayed at step 3.  The tokenizer and the c4_test data the config reads
from torchtitan's source tree are made up in the working directory
(scripts/titan_assets.py).  With expandable segments off the debug model's
trunc_normal_ init can spin forever on the simulator (kernels compute
nothing); the defaults keep them on, and a run that hangs is killed at its
timeout and fails.
"""

import pytest

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("ngpu", [1, 2])
def test_torchtitan_debugmodel_default_launcher(stack, ngpu):
    runs, peaks = stack(f"torchtitan_{ngpu}gpu")
    for run in runs.values():
        # the defaults did what they say: three steps, the graph recorded
        assert "Recorded CUDA graph" in run.stdout + run.stderr, run.tail()
        assert "step:  3" in run.stdout + run.stderr, run.tail()
    assert len(peaks["torch"]) == ngpu, peaks
