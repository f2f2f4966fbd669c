"""Out of memory and record_stream through gpumem's torch allocator, on the
simulated GPU: torch.cuda.OutOfMemoryError with torch's message, word for
word (never a NULL data pointer), the allocator usable afterwards, the
memory fraction, OOM observers; and a block freed while a side stream's
event is pending is not handed out again until the event completes."""

from __future__ import annotations

import re

import pytest

from torch_helpers import run_gm

pytestmark = pytest.mark.slow  # left out of the fast tier (see pyproject.toml)

OOM_RE = re.compile(
    r"^CUDA out of memory\. Tried to allocate (?P<want>[\d.]+ [KMG]iB)\. GPU 0 has a total "
    r"capacity of (?P<total>[\d.]+ [KMG]iB) of which (?P<free>[\d.]+ [KMG]iB|\d+ bytes) is free\. "
    r"(?P<proc>(?:(?:Including non-PyTorch memory, this process|Process \d+) has (?:[\d.]+ "
    r"[KMG]iB|\d+ bytes) memory in use\. )*)(?P<allowed>[\d.]+ [KMG]iB allowed; )?Of the allocated memory (?P<alloc>[\d.]+ [KMG]iB|\d+ "
    r"bytes) is allocated by PyTorch, and (?P<unalloc>[\d.]+ [KMG]iB|\d+ bytes) is reserved by "
    r"PyTorch but unallocated\. If reserved but unallocated memory is large try setting "
    r"PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation\.  See "
    r"documentation for Memory Management  \(https://docs\.pytorch\.org/docs/stable/notes/"
    r"cuda\.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf\)$")

OOM_SNIPPET = '''
def oom(n):
    try:
        torch.empty(n, dtype=torch.uint8, device="cuda")
    except Exception as e:
        return {"type": type(e).__name__, "is_oom": isinstance(e, torch.cuda.OutOfMemoryError),
                "is_torch_oom": isinstance(e, torch.OutOfMemoryError),
                "is_runtime": isinstance(e, RuntimeError), "msg": str(e).split("\\n")[0]}
    return None
'''


def test_oom_raises_torch_oom_and_allocator_recovers():
    o = run_gm('''
        seen = []
        torch._C._cuda_attach_out_of_memory_observer(
            lambda dev, size, total, free: seen.append([dev, size, total, free]))
        torch.cuda.memory._record_memory_history(max_entries=1000)
        keep = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")      # 1 GiB in use
        cached = torch.empty(300 << 20, dtype=torch.uint8, device="cuda")
        del cached                                                          # 300 MiB cached
        first = oom(5 << 30)
        after = torch.empty(2 << 30, dtype=torch.uint8, device="cuda")     # still works
        x = torch.ones(1000, device="cuda")
        st = gpumem.memory_stats()
        trace = torch.cuda.memory._snapshot()["device_traces"][0]
        torch.cuda.set_per_process_memory_fraction(0.5)
        del after
        limited = oom(5 << 29)                                              # > 2 GiB allowed
        fraction = torch.cuda.get_per_process_memory_fraction()
        small = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
        emit({"first": first, "limited": limited, "after_ok": x.data_ptr() != 0,
              "num_ooms": st["num_ooms"], "observers": seen, "fraction": fraction,
              "oom_events": [e for e in trace if e["action"] == "oom"],
              "final_ooms": gpumem.memory_stats()["num_ooms"], "small_ok": small.data_ptr() != 0})
    ''', prelude=OOM_SNIPPET, memory="4GiB")
    first = o["first"]
    assert first and first["type"] == "OutOfMemoryError", o
    assert first["is_oom"] and first["is_torch_oom"] and first["is_runtime"]
    m = OOM_RE.match(first["msg"])
    assert m, first["msg"]
    assert m["want"] == "5.00 GiB" and m["total"] == "4.00 GiB" and m["allowed"] is None
    assert m["alloc"] == "1024.00 MiB"  # c10 format_size: boundaries are inclusive
    # NVML's sentence: this process holds the 1 GiB and its context
    assert m["proc"].startswith("Including non-PyTorch memory, this process has 1."), first["msg"]
    # gpumem released its 300 MiB cache and retried before giving up
    assert m["unalloc"] == "0 bytes", first["msg"]
    assert o["after_ok"] and o["small_ok"]
    assert o["num_ooms"] == 1 and o["final_ooms"] == 2
    limited = o["limited"]
    assert limited and limited["is_oom"], o
    m2 = OOM_RE.match(limited["msg"])
    assert m2 and m2["allowed"] == "2.00 GiB allowed; ", limited["msg"]
    assert abs(o["fraction"] - 0.5) < 1e-9
    # the observers saw (device, size, limit or total, free), as torch calls them
    assert [ob[:3] for ob in o["observers"]] == [[0, 5 << 30, 4 << 30], [0, 5 << 29, 2 << 30]]
    assert o["oom_events"] and o["oom_events"][0]["size"] == 5 << 30
    assert "device_free" in o["oom_events"][0]


def test_oom_under_expandable_segments_names_the_setting():
    o = run_gm('''
        a = torch.empty(3 << 30, dtype=torch.uint8, device="cuda")
        emit({"oom": oom(2 << 30), "expandable": torch.cuda.memory._snapshot()
              ["allocator_settings"]["expandable_segments"]})
    ''', prelude=OOM_SNIPPET, memory="4GiB", env={"GPUMEM_ALLOC_CONF": "expandable_segments:True"})
    assert o["expandable"] is True
    assert o["oom"] and o["oom"]["is_oom"] and OOM_RE.match(o["oom"]["msg"]), o


RECORD_STREAM = '''
def reuse(record, n=4 << 20):
    side = torch.cuda.Stream()
    x = torch.empty(n, dtype=torch.uint8, device="cuda")
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        x.add_(1)                      # x is used on the side stream
    if record:
        x.record_stream(side)
    ptr = x.data_ptr()
    del x                              # freed while the side stream's event is pending
    states = {b["state"] for s in gpumem.snapshot()["segments"] for b in s["blocks"]
              if b["address"] == ptr}
    y = torch.empty(n, dtype=torch.uint8, device="cuda")
    reused_early = y.data_ptr() == ptr
    side.synchronize()                 # the event completes
    z = torch.empty(n, dtype=torch.uint8, device="cuda")
    return {"reused_early": reused_early, "reused_after": z.data_ptr() == ptr,
            "states": sorted(states)}
'''


def test_record_stream_delays_reuse_until_the_event_completes():
    o = run_gm('''
        emit({"recorded": reuse(True), "plain": reuse(False)})
    ''', prelude=RECORD_STREAM, events="never")
    rec, plain = o["recorded"], o["plain"]
    assert rec["states"] == ["active_pending_free"], rec
    assert not rec["reused_early"] and rec["reused_after"], rec
    # without record_stream the block is reused at once (the caller's responsibility)
    assert plain["reused_early"], plain


def test_record_stream_with_polled_events():
    # after:3: the event answers "not ready" to three polls, then completes
    o = run_gm('''
        side = torch.cuda.Stream()
        x = torch.empty(1 << 20, dtype=torch.uint8, device="cuda")
        with torch.cuda.stream(side):
            x.add_(1)
        x.record_stream(side)
        ptr = x.data_ptr()
        del x
        ptrs = []
        for _ in range(6):
            t = torch.empty(1 << 20, dtype=torch.uint8, device="cuda")
            ptrs.append(t.data_ptr())
            del t
        emit({"hits": [p == ptr for p in ptrs]})
    ''', events="after:3")
    hits = o["hits"]
    assert not hits[0] and any(hits), hits
