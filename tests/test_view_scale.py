"""``gpumem view`` on a 1,000,000-event snapshot: time and page size.

The snapshot is synthetic but shaped like a training run: parameters live
throughout, each step allocates activations of many sizes from a few dozen
stacks and frees them in reverse, a few allocations leak every step, and the
final segments hold exactly the allocations still live at the end.
"""

from __future__ import annotations

import json
import os
import pickle
import random
import re
import time

import pytest

from gpumem import cli
from gpumem.snapshots import view

pytestmark = pytest.mark.slow  # left out of the fast tier (see pyproject.toml)

MiB = 1 << 20
SLOT = 64 * MiB          # every allocation sits in its own 64 MiB slot of one segment
BASE = 1 << 40


def synthetic_snapshot(events: int = 1_000_000, seed: int = 0) -> dict:
    rng = random.Random(seed)
    stacks = []
    for i in range(48):
        user = {"filename": f"/home/u/proj/model_{i % 6}.py", "line": 10 + i, "name": f"layer{i}"}
        lib = {"filename": "/venv/lib/python3.11/site-packages/torch/nn/modules/linear.py",
               "line": 125, "name": "forward"}
        top = {"filename": "/home/u/proj/train.py", "line": 88, "name": "<module>"}
        stacks.append([lib, user, top])
    leak_stack = [{"filename": "/home/u/proj/train.py", "line": 77, "name": "train_step"},
                  {"filename": "/home/u/proj/train.py", "line": 88, "name": "<module>"}]
    trace: list[dict] = []
    free_slots: list[int] = []
    next_slot = 0
    live: dict[int, tuple[int, list]] = {}   # slot -> (size, frames)
    t = 1_700_000_000_000_000

    def take() -> int:
        nonlocal next_slot
        if free_slots:
            return free_slots.pop()
        next_slot += 1
        return next_slot - 1

    def alloc(size: int, frames: list) -> int:
        nonlocal t
        slot = take()
        t += 3
        trace.append({"action": "alloc", "addr": BASE + slot * SLOT, "size": size, "stream": 0,
                      "time_us": t, "frames": frames})
        live[slot] = (size, frames)
        return slot

    def free(slot: int) -> None:
        nonlocal t
        size, frames = live.pop(slot)
        for action in ("free_requested", "free_completed"):
            t += 1
            trace.append({"action": action, "addr": BASE + slot * SLOT, "size": size,
                          "stream": 0, "time_us": t, "frames": frames})
        free_slots.append(slot)

    for i in range(200):  # parameters
        alloc(rng.choice((1, 2, 4, 16)) * MiB, stacks[i % 48])
    step = 0
    while len(trace) < events - 400:
        acts = [alloc(rng.choice((4096, 65536, 512 * 1024, 2 * MiB, 8 * MiB, 32 * MiB)),
                      stacks[rng.randrange(48)]) for _ in range(rng.randrange(200, 400))]
        for _ in range(rng.randrange(50, 150)):  # short-lived temporaries
            free(alloc(rng.randrange(512, 1 << 20), stacks[rng.randrange(48)]))
        if step % 4 == 0:
            alloc(256 * 1024, leak_stack)  # the leak
        for s in reversed(acts):
            free(s)
        trace.append({"action": "snapshot", "addr": 0, "size": 0, "stream": 0, "time_us": t})
        step += 1
    trace = trace[:events]
    live_end = {}
    for e in trace:  # recompute what is live after the cut
        slot = (e["addr"] - BASE) // SLOT
        if e["action"] == "alloc":
            live_end[slot] = (e["size"], e["frames"])
        elif e["action"] == "free_completed":
            live_end.pop(slot, None)
    blocks = []
    for slot in range(next_slot):
        if slot in live_end:
            size, frames = live_end[slot]
            blocks.append({"address": BASE + slot * SLOT, "size": SLOT, "requested_size": size,
                           "state": "active_allocated", "frames": frames})
        else:
            blocks.append({"address": BASE + slot * SLOT, "size": SLOT, "requested_size": 0,
                           "state": "inactive", "frames": []})
    seg = {"device": 0, "address": BASE, "total_size": next_slot * SLOT, "stream": 0,
           "segment_type": "large", "segment_pool_id": (0, 0), "is_expandable": True,
           "frames": [], "blocks": blocks}
    return {"segments": [seg], "device_traces": [trace]}


@pytest.fixture(scope="module")
def big_snapshot(tmp_path_factory):
    t0 = time.perf_counter()
    snap = synthetic_snapshot()
    path = tmp_path_factory.mktemp("scale") / "big.pickle"
    with open(path, "wb") as f:
        pickle.dump(snap, f, protocol=4)
    return path, len(snap["device_traces"][0]), time.perf_counter() - t0


def test_view_of_a_million_events(big_snapshot, capsys):
    path, events, made_s = big_snapshot
    assert events == 1_000_000
    out = path.with_suffix(".html")
    t0 = time.perf_counter()
    assert cli.main(["view", str(path), "-o", str(out)]) == 0
    took = time.perf_counter() - t0
    size = out.stat().st_size
    text = out.read_text(encoding="utf-8")
    data = json.loads(re.search(r'<script type="application/json" id="gpumem-data">(.*?)</script>',
                                text, re.S).group(1))
    tl = data["timeline"]
    with capsys.disabled():
        print(f"\n[scale] {events} events, pickle {os.path.getsize(path) / MiB:.1f} MiB "
              f"(made in {made_s:.1f} s): gpumem view {took:.1f} s, HTML {size / MiB:.2f} MiB, "
              f"{len(tl['ev'])} samples, {len(tl['bands'])} bands of {tl['visible']} visible "
              f"allocations, {len(data['stacks'])} stacks")
    assert took < 60, f"gpumem view took {took:.1f} s"
    assert size < 20 * MiB
    assert len(tl["ev"]) <= view.MAX_SAMPLES + 1
    assert 0 < len(tl["bands"]) <= view.MAX_BANDS
    assert tl["peak"][0] in tl["ev"]  # the peak itself is a sample
    assert any("folded" in n for n in data["notes"]) and any("sampled" in n for n in data["notes"])
    labels = [row[0] for row in data["table"]["rows"]]
    assert any(data["sites"][s][0] == "/home/u/proj/train.py:77:train_step" for s in labels)
