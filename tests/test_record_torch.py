"""gpumem.record() with torch on the simulated GPU: ranks in file names (two
processes at once, one under a gloo process group), and the fallback to
torch's own recorder when torch's caching allocator is already in use.
(record() installing gpumem by itself is covered by test_oom_dump.py.)
"""

from __future__ import annotations

import pickle
from concurrent.futures import ThreadPoolExecutor

import pytest

from sim_helpers import sim_lib_dir
from torch_helpers import built_shim, run_gm

pytestmark = pytest.mark.slow  # left out of the fast tier (see pyproject.toml)

MiB = 1 << 20

RANKED = '''
import os, socket, time
if os.environ.get("USE_GLOO"):
    import torch.distributed as dist
    s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
mine = int(os.environ.get("RANK", "0")) + 1
with gpumem.record(os.environ["SNAP"]) as rec:
    x = torch.empty(mine * 10 << 20, dtype=torch.uint8, device="cuda")
    time.sleep(0.3)          # both processes write at about the same time
from gpumem.recording.recorder import current_rank
emit({"written": rec.written, "rank": current_rank()})
'''


def test_ranks_never_overwrite_each_other(tmp_path):
    built_shim()
    sim_lib_dir()   # build the simulator once, before two threads ask for it
    snap = str(tmp_path / "memory.pickle")
    jobs = [{"RANK": "0", "SNAP": snap, "USE_GLOO": "1"}, {"RANK": "1", "SNAP": snap}]
    with ThreadPoolExecutor(2) as pool:
        outs = list(pool.map(lambda env: run_gm(RANKED, env=env, memory="1GiB"), jobs))
    assert [o["rank"] for o in outs] == [0, 1]
    for rank, o in enumerate(outs):
        path = str(tmp_path / f"memory_rank{rank}.pickle")
        assert o["written"] == [path]
        with open(path, "rb") as f:
            s = pickle.load(f)
        sizes = [e["size"] for e in s["device_traces"][0] if e["action"] == "alloc"]
        assert sizes == [(rank + 1) * 10 * MiB], sizes   # each file holds its own process
    assert not (tmp_path / "memory.pickle").exists()


def test_torch_allocator_in_use_falls_back_to_torchs_recorder(tmp_path):
    # install=False and a CUDA tensor first: torch's allocator owns the device
    o = run_gm(f'''
        import logging, pickle
        logs = []
        class _Keep(logging.Handler):
            def emit(self, r):
                logs.append(r.getMessage())
        logging.getLogger("gpumem").addHandler(_Keep())
        early = torch.ones(1, device="cuda")
        with gpumem.record({str(tmp_path / "t.pickle")!r}) as rec:
            a = torch.empty(3 << 20, dtype=torch.uint8, device="cuda")
            try:
                torch.empty(8 << 30, dtype=torch.uint8, device="cuda")
                msg = None
            except torch.cuda.OutOfMemoryError as e:
                msg = str(e)
        snaps = []
        for p in rec.written:
            with open(p, "rb") as f:
                s = pickle.load(f)
            snaps.append({{"actions": [e["action"] for e in s["device_traces"][0]],
                          "sizes": [e["size"] for e in s["device_traces"][0]]}})
        emit({{"installed": gpumem.is_installed(), "written": rec.written, "oom": rec.oom_snapshots,
              "msg": msg, "logs": logs, "snaps": snaps,
              "history_on": torch._C._cuda_isHistoryEnabled()}})
    ''', install=False, memory="4GiB")
    assert not o["installed"]
    assert any("torch's CUDA allocator is already in use" in m for m in o["logs"]), o["logs"]
    oom, end = str(tmp_path / "t_oom.pickle"), str(tmp_path / "t.pickle")
    assert o["written"] == [oom, end] and o["oom"] == [oom]
    assert o["msg"] and "gpumem" not in o["msg"]   # torch's message: no line can be added
    assert any(oom in m for m in o["logs"])        # but the log names the file
    at_oom, at_end = o["snaps"]
    assert "oom" in at_oom["actions"] and 3 * MiB in at_end["sizes"]
    assert not o["history_on"]                      # torch's recording was off before
