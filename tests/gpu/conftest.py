"""tests/gpu: the suite that needs a GPU, real or simulated.

Every test here is skipped, with the reason, unless the CUDA driver of this
process reports a device: on a machine with an NVIDIA GPU, or under
gpumem's simulator (``gpumem simulate -- python -m pytest tests/gpu``).
gpumem's fake driver named by GPUMEM_LIBCUDA alone, outside the simulator,
is not a GPU: torch cannot use it.
Whether there is one is asked once per session, in a fresh process
(``python -m gpumem.checkup.cudadriver``), so nothing an earlier test loaded into
the pytest process (a fake libcuda.so.1, say) can pass for a GPU.

Fixtures: ``gpu`` (what the probe found: gpumem.checkup.cudadriver.probe()),
``driver`` (a gpumem.checkup.cudadriver.Driver on it, initialised).
"""

from __future__ import annotations

import os

import pytest

from gpu_helpers import gpu_probe

HERE = os.path.dirname(os.path.abspath(__file__))


def pytest_collection_modifyitems(config, items):
    mine = [i for i in items if str(i.fspath).startswith(HERE + os.sep)]
    if not mine:
        return
    found = gpu_probe()
    if found["present"] and (found["launcher"] or not found["simulated"]):
        return
    why = found["reason"] or (f"the driver is gpumem's fake one ({found['path']}) outside the "
                              "simulator, where torch cannot use it")
    skip = pytest.mark.skip(reason=f"needs a GPU: {why} (on a machine without one: "
                                   "gpumem simulate -- python -m pytest tests/gpu)")
    for item in mine:
        item.add_marker(skip)


@pytest.fixture(scope="session")
def gpu():
    return gpu_probe()


@pytest.fixture(scope="session")
def driver(gpu):
    from gpumem.checkup.cudadriver import Driver
    drv = Driver()
    drv.init()
    yield drv
    drv.close()
