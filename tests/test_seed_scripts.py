"""The ResNet-50 scripts of "Understanding GPU Memory 1" (../shared/seeds/000,
appendices A and B), run verbatim on the simulated GPU, with cuDNN enabled:
under torch's own allocator (python -m gpumem.sim) and with gpumem installed
by ``gpumem simulate``. The scripts are read from the seed article at test
time (they are the article's, not the project's) and the tests skip when
../shared/seeds is absent.
"""

from __future__ import annotations

import glob
import gzip
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from gpumem.snapshots import unpickle as _unpickle
from sim_helpers import sim_lib_dir
from torch_helpers import ROOT, _env, built_shim, run_py

pytestmark = pytest.mark.slow  # left out of the fast tier (see pyproject.toml)

SEED = "000_74f0659cfc5d84e6.txt"
MiB = 1 << 20
# torchvision's resnet50(): 25,557,032 fp32 parameters
RESNET50_PARAMS = 25_557_032


def seed_script(appendix: str) -> str:
    """The code block of the seed article's appendix, exactly as printed."""
    path = Path(os.environ.get("GPUMEM_SEEDS") or ROOT.parent / "shared" / "seeds") / SEED
    if not path.is_file():
        pytest.skip(f"no seed article at {path} (set GPUMEM_SEEDS)")
    text = path.read_text()
    start = text.index(f"### Appendix {appendix}")
    begin = text.index("```", start) + 3
    return text[begin:text.index("```", begin)].lstrip("\n")


def _run(appendix: str, allocator: str, tmp: Path):
    cwd = tmp / f"{appendix}_{allocator}"
    cwd.mkdir()
    script = cwd / "seed.py"
    script.write_text(seed_script(appendix))
    if allocator == "torch":
        cmd = [sys.executable, "-m", "gpumem.sim", "--", sys.executable, str(script)]
    else:
        cmd = [sys.executable, "-m", "gpumem.sim.command", "--out", "sim", "--no-view", "--",
               sys.executable, str(script)]
    # GPUMEM_SIM_LOG: the fakes log every call they refuse
    env = _env({"MPLBACKEND": "Agg", "GPUMEM_SIM_LOG": "-"})
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, env=env, timeout=900)
    return cwd, proc


RUNS = [("A", "torch"), ("A", "gpumem"), ("B", "torch"), ("B", "gpumem")]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    for appendix in "AB":
        seed_script(appendix)  # skip before building anything
    built_shim()
    sim_lib_dir()
    tmp = tmp_path_factory.mktemp("seeds")
    with ThreadPoolExecutor(2) as pool:
        done = list(pool.map(lambda r: _run(*r, tmp), RUNS))
    return dict(zip(RUNS, done))


def finished(runs, appendix, allocator):
    cwd, proc = runs[(appendix, allocator)]
    assert proc.returncode == 0, f"{proc.stdout[-2000:]}\n{proc.stderr[-6000:]}"
    assert "cuDNN error" not in proc.stderr and "libcudnn.so.9: status" not in proc.stderr
    if allocator == "gpumem":
        assert "fits in 80 GiB: yes" in proc.stdout
    return cwd


def peak_allocated(snapshot) -> int:
    """The highest total of live blocks over the recorded trace, counted from
    the blocks live when recording began."""
    (trace,) = snapshot["device_traces"][:1]
    live = sum(b["size"] for seg in snapshot["segments"] for b in seg["blocks"]
               if b["state"] == "active_allocated")
    # walk back from the end to the start of recording, then forward again
    for e in reversed(trace):
        if e["action"] == "alloc":
            live -= e["size"]
        elif e["action"] == "free_completed":
            live += e["size"]
    peak = live
    for e in trace:
        if e["action"] == "alloc":
            live += e["size"]
            peak = max(peak, live)
        elif e["action"] == "free_completed":
            live -= e["size"]
    return peak


@pytest.mark.parametrize("allocator", ["torch", "gpumem"])
def test_appendix_a_snapshot(runs, allocator):
    cwd = finished(runs, "A", allocator)
    (pickle_path,) = glob.glob(str(cwd / "*.pickle"))  # {host}_{time}.pickle, as the script names it
    snap = _unpickle.load_snapshot(pickle_path)
    sizes = [e["size"] for e in snap["device_traces"][0] if e["action"] == "alloc"]
    # five iterations; SGD's momentum buffers (one per parameter) appear in the
    # first and stay: the live blocks at the end hold the parameters and the
    # momentum, twice the parameters' bytes at least
    live = sum(b["size"] for seg in snap["segments"] for b in seg["blocks"]
               if b["state"] == "active_allocated")
    assert live >= 2 * 4 * RESNET50_PARAMS, live
    # the first convolution's output, batch 1: 64 x 112 x 112 fp32
    assert sizes.count(64 * 112 * 112 * 4) >= 5
    # the peak is the second iteration's backward, above parameters and momentum
    assert peak_allocated(snap) > 2 * 4 * RESNET50_PARAMS
    # opens in gpumem view and in torch's _memory_viz
    out = cwd / "viz.html"
    proc = subprocess.run([sys.executable, "-m", "gpumem", "view", pickle_path, "-o", str(out)],
                          capture_output=True, text=True, env=_env(), timeout=300)
    assert proc.returncode == 0 and out.stat().st_size > 10_000, proc.stderr
    run_py(f'''
        import runpy, sys
        sys.argv = ["_memory_viz", "trace_plot", {pickle_path!r}, "-o", {str(cwd / "torch.html")!r}]
        runpy.run_module("torch.cuda._memory_viz", run_name="__main__")
    ''')
    assert (cwd / "torch.html").stat().st_size > 10_000


def test_appendix_a_same_peak_under_both_allocators(runs):
    peaks = {}
    for allocator in ("torch", "gpumem"):
        (path,) = glob.glob(str(finished(runs, "A", allocator) / "*.pickle"))
        peaks[allocator] = peak_allocated(_unpickle.load_snapshot(path))
    # the same blocks are allocated; block rounding is torch's in both
    assert abs(peaks["gpumem"] - peaks["torch"]) <= 0.01 * peaks["torch"], peaks


@pytest.mark.parametrize("allocator", ["torch", "gpumem"])
def test_appendix_b_memory_timeline(runs, allocator):
    cwd = finished(runs, "B", allocator)
    # run_resnet50() twice, each writing a chrome trace and a memory timeline
    traces = sorted(glob.glob(str(cwd / "*.json.gz")))
    pages = sorted(glob.glob(str(cwd / "*.html")))
    assert len(traces) >= 1 and len(pages) >= 1, os.listdir(cwd)
    for page in pages:
        html = Path(page).read_text()
        assert "data:image/png;base64," in html  # the Memory Profiler's plot
    with gzip.open(traces[-1], "rt") as f:
        events = json.load(f)["traceEvents"]
    mem = [e["args"] for e in events if e.get("name") == "[memory]"
           and e["args"].get("Device Type") == 1]
    assert mem, "no device memory events in the profiler's trace"
    # the profiler saw the model and its momentum buffers on the device
    assert max(a["Total Allocated"] for a in mem) > 2 * 4 * RESNET50_PARAMS
