"""A bounded concurrency soak of gpumem under PyTorch on the simulated GPU.

Worker threads allocate and drop tensors on two streams, hand some to the
other stream with record_stream, while one thread loops over snapshots
(torch.cuda.memory._snapshot, routed to gpumem) and empty_cache, with
memory history recording Python stacks or Python and C stacks, and
expandable segments off and on.  Every so often the main thread pauses the
workers and compares a snapshot with torch.cuda.memory_stats(); at the end
memory_allocated() must be back to 0.  A deadlock is caught by a watchdog
(faulthandler prints every thread's stack and exits) and by the run's
timeout.  Slow tier: four runs of a few seconds of churn each.
"""

from __future__ import annotations

import pytest

from torch_helpers import run_gm

pytestmark = pytest.mark.slow  # left out of the fast tier (see pyproject.toml)

SOAK = '''
import faulthandler, random, threading, time
faulthandler.dump_traceback_later(WATCHDOG_S, exit=True)
mem = torch.cuda.memory
mem._record_memory_history("all", context="all", stacks=STACKS, max_entries=20_000)
streams = [torch.cuda.Stream(), torch.cuda.Stream()]
SIZES = [512, 4000, 100 << 10, 900 << 10, 3 << 20, 11 << 20, 25 << 20]
stop = threading.Event()
pause = threading.Event()           # set: every thread but main stops at its next step
paused = threading.Semaphore(0)     # released by each thread that stopped
resume = threading.Event()
errors, counts = [], {"allocs": 0, "snapshots": 0, "empty_cache": 0, "checks": 0}


def worker(i):
    try:
        rng = random.Random(i)
        mine, other = streams[i % 2], streams[1 - i % 2]
        live = []
        while not stop.is_set():
            if pause.is_set():
                paused.release()
                resume.wait()
                continue
            with torch.cuda.stream(mine):
                t = torch.empty(rng.choice(SIZES), dtype=torch.uint8, device="cuda")
                t.fill_(1)
            if rng.random() < 0.4:
                t.record_stream(other)       # its free waits for the other stream
            live.append(t)
            counts["allocs"] += 1
            if len(live) > 6:
                del live[rng.randrange(len(live))]
        live.clear()
    except BaseException as e:  # noqa: BLE001 - reported below
        errors.append(f"worker {i}: {e!r}")


def tiled(snap):
    """The snapshot agrees with itself: blocks tile their segments."""
    for seg in snap["segments"]:
        addr, alloc = seg["address"], 0
        for b in seg["blocks"]:
            assert b["address"] == addr, "a gap or an overlap inside a segment"
            addr += b["size"]
            alloc += b["size"] if b["state"] == "active_allocated" else 0
        assert addr - seg["address"] == seg["total_size"], "blocks do not sum to the segment"
        assert alloc == seg["allocated_size"], "allocated_size disagrees with the blocks"


def snapshotter():
    try:
        while not stop.is_set():
            if pause.is_set():
                paused.release()
                resume.wait()
                continue
            tiled(mem._snapshot())
            counts["snapshots"] += 1
            torch.cuda.empty_cache()
            counts["empty_cache"] += 1
    except BaseException as e:  # noqa: BLE001
        errors.append(f"snapshotter: {e!r}")


def quiet_check():
    """With the workers paused: one snapshot, compared with memory_stats()."""
    snap = mem._snapshot()
    stats = torch.cuda.memory_stats()
    tiled(snap)
    blocks = [b for s in snap["segments"] for b in s["blocks"]]
    alloc = sum(b["size"] for b in blocks if b["state"] == "active_allocated")
    active = sum(b["size"] for b in blocks if b["state"] != "inactive")
    n_alloc = sum(b["state"] == "active_allocated" for b in blocks)
    reserved = sum(s["total_size"] for s in snap["segments"])
    got = (alloc, active, n_alloc, reserved)
    want = (stats["allocated_bytes.all.current"], stats["active_bytes.all.current"],
            stats["allocation.all.current"], stats["reserved_bytes.all.current"])
    assert got == want, f"snapshot {got} != memory_stats {want}"
    counts["checks"] += 1


threads = [threading.Thread(target=worker, args=(i,), name=f"worker {i}")
           for i in range(N_WORKERS)]
threads.append(threading.Thread(target=snapshotter, name="snapshotter"))
for t in threads:
    t.start()
end = time.monotonic() + SOAK_S
while time.monotonic() < end and not errors:
    time.sleep(0.2)
    resume.clear()
    pause.set()
    for _ in range(N_WORKERS + 1):   # the workers and the snapshotter
        paused.acquire()
    try:
        quiet_check()
    except AssertionError as e:
        errors.append(f"check: {e}")
    pause.clear()
    resume.set()
stop.set()
resume.set()
for t in threads:
    t.join(JOIN_S)
stuck = [t.name for t in threads if t.is_alive()]
torch.cuda.synchronize()
allocated = torch.cuda.memory_allocated()
torch.cuda.empty_cache()
mem._record_memory_history(None)
faulthandler.cancel_dump_traceback_later()
emit({"errors": errors, "stuck": stuck, "counts": counts, "allocated_end": allocated,
      "reserved_end": torch.cuda.memory_reserved()})
'''


@pytest.mark.parametrize("expandable", [False, True], ids=["plain", "expandable"])
@pytest.mark.parametrize("stacks", ["python", "all"])
def test_threads_streams_snapshots_and_empty_cache(stacks, expandable):
    consts = (f"STACKS = {stacks!r}\nN_WORKERS = 4\nSOAK_S = 4.0\nWATCHDOG_S = 60\n"
              f"JOIN_S = 30\n")
    env = {"GPUMEM_ALLOC_CONF": "expandable_segments:True"} if expandable else None
    out = run_gm(consts + SOAK, memory="2GiB", env=env, timeout=120)
    assert out["errors"] == [] and out["stuck"] == [], out
    c = out["counts"]
    assert c["allocs"] > 200 and c["snapshots"] > 5 and c["empty_cache"] > 5, c
    assert c["checks"] >= 5, c
    assert out["allocated_end"] == 0 and out["reserved_end"] == 0, out
