"""A streaming writer of big synthetic training snapshots, for tests and benchmarks.

write_snapshot(path, events) writes a pickle of the shape torch's
_dump_snapshot writes ({'segments': [...], 'device_traces': [[entry, ...]]},
frames lists shared through the memo, every dict, list and str memoized
as Python's pickler does) without building it in memory first: a
5,000,000-event file is written in about a minute with a few MB of memory,
where pickle.dump of the dict would need about 3 GB.  The opcodes are those
pickle.dumps(obj, protocol=4) writes for the same object, less the optional
FRAME opcodes; tests/test_big_snapshots.py checks that pickle.loads of the
file equals the dict built by synthetic_dict() with the same arguments.

The workload follows tests/test_view_scale.py's synthetic snapshot: 200
parameters, then steps of 200-400 activations with short-lived temporaries
in between, a 256 KiB leak every fourth step and a 'snapshot' entry ending
each step; every allocation in its own 64 MiB slot of one segment.
"""

from __future__ import annotations

import io
import random
import struct
from typing import Iterator

MiB = 1 << 20
SLOT = 64 * MiB
BASE = 1 << 40
T0 = 1_700_000_000_000_000
_STACKS = 48


def _stacks() -> list[list[dict]]:
    out = []
    for i in range(_STACKS):
        user = {"filename": f"/home/u/proj/model_{i % 6}.py", "line": 10 + i, "name": f"layer{i}"}
        lib = {"filename": "/venv/lib/python3.11/site-packages/torch/nn/modules/linear.py",
               "line": 125, "name": "forward"}
        top = {"filename": "/home/u/proj/train.py", "line": 88, "name": "<module>"}
        out.append([lib, user, top])
    out.append([{"filename": "/home/u/proj/train.py", "line": 77, "name": "train_step"},
                {"filename": "/home/u/proj/train.py", "line": 88, "name": "<module>"}])
    return out


LEAK = _STACKS  # index of the leak's stack


def events(n: int, seed: int = 0) -> Iterator[tuple[str, int, int, int, int]]:
    """(action, addr, size, time_us, stack index) of the first n trace entries."""
    rng = random.Random(seed)
    free_slots: list[int] = []
    live: dict[int, tuple[int, int]] = {}
    state = {"next": 0, "t": T0, "n": 0}

    def take() -> int:
        if free_slots:
            return free_slots.pop()
        state["next"] += 1
        return state["next"] - 1

    def alloc(size: int, stack: int):
        slot = take()
        state["t"] += 3
        live[slot] = (size, stack)
        return slot, ("alloc", BASE + slot * SLOT, size, state["t"], stack)

    def free(slot: int):
        size, stack = live.pop(slot)
        free_slots.append(slot)
        for action in ("free_requested", "free_completed"):
            state["t"] += 1
            yield action, BASE + slot * SLOT, size, state["t"], stack

    made = 0
    for i in range(200):
        if made == n:
            return
        _, e = alloc(rng.choice((1, 2, 4, 16)) * MiB, i % _STACKS)
        yield e
        made += 1
    step = 0
    while True:
        acts = []
        for _ in range(rng.randrange(200, 400)):
            slot, e = alloc(rng.choice((4096, 65536, 512 * 1024, 2 * MiB, 8 * MiB, 32 * MiB)),
                            rng.randrange(_STACKS))
            acts.append(slot)
            if made == n:
                return
            yield e
            made += 1
        for _ in range(rng.randrange(50, 150)):
            slot, e = alloc(rng.randrange(512, 1 << 20), rng.randrange(_STACKS))
            for x in (e, *free(slot)):
                if made == n:
                    return
                yield x
                made += 1
        if step % 4 == 0:
            _, e = alloc(256 * 1024, LEAK)
            if made == n:
                return
            yield e
            made += 1
        for slot in reversed(acts):
            for x in free(slot):
                if made == n:
                    return
                yield x
                made += 1
        if made == n:
            return
        yield "snapshot", 0, 0, state["t"], -1
        made += 1
        step += 1


def _end_blocks(n: int, seed: int) -> tuple[int, list[tuple[int, int, int]]]:
    """(slots used, [(slot, requested size, stack)] live at the end)."""
    live: dict[int, tuple[int, int]] = {}
    top = -1
    for action, addr, size, _t, stack in events(n, seed):
        if action == "snapshot":
            continue
        slot = (addr - BASE) // SLOT
        top = max(top, slot)
        if action == "alloc":
            live[slot] = (size, stack)
        elif action == "free_completed":
            live.pop(slot, None)
    return top + 1, sorted((s, size, st) for s, (size, st) in live.items())


def synthetic_dict(n: int, seed: int = 0) -> dict:
    """The snapshot write_snapshot writes, as a dict (for small n: tests)."""
    stacks = _stacks()
    trace = []
    for action, addr, size, t, stack in events(n, seed):
        e = {"action": action, "addr": addr, "size": size, "stream": 0, "time_us": t}
        if stack >= 0:
            e["frames"] = stacks[stack]
        trace.append(e)
    slots, live = _end_blocks(n, seed)
    by_slot = {s: (size, st) for s, size, st in live}
    blocks = []
    for slot in range(slots):
        if slot in by_slot:
            size, st = by_slot[slot]
            blocks.append({"address": BASE + slot * SLOT, "size": SLOT, "requested_size": size,
                           "state": "active_allocated", "frames": stacks[st]})
        else:
            blocks.append({"address": BASE + slot * SLOT, "size": SLOT, "requested_size": 0,
                           "state": "inactive", "frames": []})
    seg = {"device": 0, "address": BASE, "total_size": slots * SLOT, "stream": 0,
           "segment_type": "large", "is_expandable": True, "frames": [], "blocks": blocks}
    return {"segments": [seg], "device_traces": [trace]}


class _Pickle:
    """The opcodes of protocol 4 for plain data, with Python's memo numbering."""

    def __init__(self, out: io.BufferedWriter) -> None:
        self.out = out
        self.memo = 0
        self.strs: dict[str, int] = {}

    def put(self) -> int:
        self.out.write(b"\x94")
        self.memo += 1
        return self.memo - 1

    def get(self, index: int) -> bytes:
        return b"h" + bytes([index]) if index < 256 else b"j" + struct.pack("<I", index)

    def str_(self, s: str) -> bytes:
        index = self.strs.get(s)
        if index is not None:
            return self.get(index)
        raw = s.encode()
        self.strs[s] = self.memo
        self.memo += 1
        head = b"\x8c" + bytes([len(raw)]) if len(raw) < 256 else b"X" + struct.pack("<I", len(raw))
        return head + raw + b"\x94"

    @staticmethod
    def int_(v: int) -> bytes:
        if 0 <= v < 256:
            return b"K" + bytes([v])
        if 0 <= v < 65536:
            return b"M" + struct.pack("<H", v)
        if -(1 << 31) <= v < (1 << 31):
            return b"J" + struct.pack("<i", v)
        raw = v.to_bytes((v.bit_length() + 8) // 8, "little", signed=True)
        return b"\x8a" + bytes([len(raw)]) + raw

    def value(self, v) -> bytes:
        """A str, int or bool (True/False) or None as bytes (no memo for ints)."""
        if isinstance(v, bool):
            return b"\x88" if v else b"\x89"
        if isinstance(v, int):
            return self.int_(v)
        if v is None:
            return b"N"
        return self.str_(v)

    def small_dict(self, d: dict) -> None:
        w = self.out.write
        w(b"}")
        self.put()
        if d:
            w(b"(" + b"".join(self.str_(k) + self.value(v) for k, v in d.items()) + b"u")


def write_snapshot(path, n: int, seed: int = 0) -> int:
    """Write the n-event snapshot to path; returns its size in bytes."""
    stacks = _stacks()
    with open(path, "wb", buffering=1 << 20) as f:
        p = _Pickle(f)
        w = f.write
        w(b"\x80\x04}")
        p.put()
        w(b"(" + p.str_("segments") + b"]")
        p.put()
        # the one segment, its frames and blocks written after the trace's
        # stacks are memoized would change the order: Python writes the
        # segments first, so the stacks are memoized inside the blocks.
        slots, live = _end_blocks(n, seed)
        by_slot = {s: (size, st) for s, size, st in live}
        stack_memo: dict[int, int] = {}

        def frames(st: int) -> bytes:
            if st in stack_memo:
                return p.get(stack_memo[st])
            w(b"]")
            stack_memo[st] = p.put()
            w(b"(")
            for fr in stacks[st]:
                p.small_dict(fr)
            w(b"e")
            return b""

        w(b"}")
        p.put()
        w(b"(")
        for k, v in (("device", 0), ("address", BASE), ("total_size", slots * SLOT),
                     ("stream", 0), ("segment_type", "large"), ("is_expandable", True)):
            w(p.str_(k) + p.value(v))
        w(p.str_("frames") + b"]")
        p.put()
        w(p.str_("blocks") + b"]")
        p.put()
        if slots:
            w(b"(")
            for k, slot in enumerate(range(slots)):
                w(b"}")
                p.put()
                w(b"(")
                active = slot in by_slot
                size, st = by_slot.get(slot, (0, -1))
                for key, v in (("address", BASE + slot * SLOT), ("size", SLOT),
                               ("requested_size", size),
                               ("state", "active_allocated" if active else "inactive")):
                    w(p.str_(key) + p.value(v))
                w(p.str_("frames"))
                if active:
                    w(frames(st))
                else:
                    w(b"]")
                    p.put()
                w(b"u")
                if k % 1000 == 999 and k + 1 < slots:
                    w(b"e(")
            w(b"e")
        w(b"ua")  # the segment's SETITEMS, APPEND to 'segments'
        w(p.str_("device_traces") + b"]")
        p.put()
        w(b"]")
        p.put()
        count = 0
        for action, addr, size, t, st in events(n, seed):
            if count % 1000 == 0:
                w(b"(" if count == 0 else b"e(")
            w(b"}")
            p.put()
            parts = [b"(", p.str_("action"), p.str_(action), p.str_("addr"), p.int_(addr),
                     p.str_("size"), p.int_(size), p.str_("stream"), p.int_(0),
                     p.str_("time_us"), p.int_(t)]
            if st >= 0:
                parts.append(p.str_("frames"))
                w(b"".join(parts))
                w(frames(st))
            else:
                w(b"".join(parts))
            w(b"u")
            count += 1
        if count:
            w(b"e")
        w(b"au.")  # APPEND the trace to device_traces; SETITEMS of the top dict
        return f.tell()
