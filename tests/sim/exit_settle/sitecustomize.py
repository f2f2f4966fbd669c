"""First on PYTHONPATH in the ranks that tests/sim/test_distributed.py
launches (torch's allocator and gpumem simulate alike; gpumem simulate's own
sitecustomize chains to this one): a pause of 0.2 s as the interpreter
starts to exit, after every other atexit handler.

torch's autograd device threads may still hold their last GraphTask when a
script returns right after its last step; if a thread drops it while the
interpreter finalizes, the process aborts ("terminate called without an
active exception", simgpu/README.md, Limitations). On the simulated GPU,
whose kernels take no time, on a loaded machine, the window is wide: one
rank of examples/fsdp2_fit.py aborted that way, after printing its result,
in a full-suite run. The pause lets the threads finish first.
"""

import atexit
import time

atexit.register(time.sleep, 0.2)   # registered first: runs last
