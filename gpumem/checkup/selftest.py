"""The driver backend's self-test: gpumem's allocator on a GPU, checked against the driver.

``run(device)`` drives ``gpumem._C.Allocator(backend='cuda')`` (the core on
csrc/device/cuda_backend.c) through six steps, each on allocators of its
own, and checks every figure twice: against what PyTorch's caching rules
say the allocator must hold (sizes, splits, reuse), and against what the
driver itself reports through cuMemGetInfo, read by gpumem.checkup.cudadriver (a
path that shares nothing with the backend).  Each step ends by destroying
its allocators and checking that the device is back where it started.

  allocate      a 64 MiB block: one 64 MiB segment, the driver's use grows by
                that much, and bytes written to both ends read back
  free          the block is cached, not returned; the same size gets the
                same address; empty_cache returns it to the driver
  split         two 8 MiB blocks share one 20 MiB segment; a 1000 B block
                takes a 2 MiB small segment; freed blocks merge again
  expandable    (VMM devices) three 64 MiB blocks in one growing segment,
                contiguous; empty_cache unmaps the freed tail granules
  cross-stream  a block used on a second, busy stream and freed is not
                reused until the stream's event completes, then is
  oom           a request above the free memory succeeds once the cache is
                released (one retry); one above the device's real limit
                raises OutOfMemoryError naming the driver's total, leaving
                nothing behind

Note [Self-test tolerance]
Rationale: the driver's figure must agree with the allocator's, but on a
  real GPU other processes, the context's own allocations and page-table
  memory move cuMemGetInfo by a few MiB.
Approach: on the simulated driver the figures must be equal; on a GPU they
  may differ by REAL_TOLERANCE (32 MiB), half the 64 MiB blocks most steps
  move, so a 64 MiB segment gpumem lost or leaked is still seen.
Limitations: another process allocating during the test can fail a step
  (the message says so); on a GPU, discrepancies below the tolerance (the
  split step's 20 MiB and 2 MiB segments) go unseen: only the simulator
  checks them exactly.

Must not: leave memory on the device (every step destroys its allocators),
or replace a context the calling thread has current (a thread with none
gets the device's primary context, as the CUDA runtime would do).
"""

from __future__ import annotations

import gc
import os
import time
from typing import Any, Callable, Optional

from gpumem import _C
from gpumem.checkup.cudadriver import Driver, DriverError
from gpumem._format import format_bytes

__all__ = ["run", "STEPS", "REAL_TOLERANCE", "StepFailed"]

MiB = 1 << 20
REAL_TOLERANCE = 32 * MiB
#: How long the cross-stream step keeps a real GPU's stream busy.
HOLD_SECONDS = 0.5


class StepFailed(AssertionError):
    """A self-test step found the allocator or the driver not as it must be."""


def _round_up(n: int, to: int) -> int:
    return (n + to - 1) // to * to


class _Step:
    """One step's allocators and its checks against the driver."""

    def __init__(self, drv: Driver, device: int, tolerance: int,
                 make_allocator: Callable[..., Any]):
        self.drv, self.device, self.tol = drv, device, tolerance
        self.make_allocator = make_allocator
        self.allocators: list[Any] = []
        self.base = drv.used(device)

    def allocator(self, expandable: bool = False) -> Any:
        a = self.make_allocator(backend="cuda", device=self.device,
                                settings={"expandable_segments": expandable})
        self.allocators.append(a)
        return a

    def expect(self, cond: bool, message: str) -> None:
        if not cond:
            raise StepFailed(message)

    def reserved(self) -> int:
        return sum(a.stats()["reserved_bytes.all.current"] for a in self.allocators)

    def driver_agrees(self, when: str) -> int:
        """The driver's use since the step began equals what gpumem reserved."""
        held, delta = self.reserved(), self.drv.used(self.device) - self.base
        if abs(delta - held) > self.tol:
            raise StepFailed(
                f"{when}: cuMemGetInfo shows {format_bytes(delta)} more in use than at the "
                f"start, but gpumem reserved {format_bytes(held)} (a difference of "
                f"{format_bytes(abs(delta - held))})"
                + (f" (more than the {format_bytes(self.tol)} allowed for other processes "
                   "on the GPU)" if self.tol else ""))
        for a in self.allocators:
            bad, first = a.check()
            self.expect(bad == 0, f"{when}: the allocator's invariant check failed: {first}")
        return delta

    def stat(self, a: Any, key: str) -> int:
        return a.stats()[key]

    def finish(self) -> None:
        """Destroy the allocators; the device must be back where the step began."""
        self.allocators.clear()
        gc.collect()
        delta = self.drv.used(self.device) - self.base
        if abs(delta) > self.tol:
            raise StepFailed(f"after the allocators were destroyed, cuMemGetInfo still shows "
                             f"{format_bytes(delta)} more in use than at the start")


def _allocate(s: _Step) -> str:
    a = s.allocator()
    p = a.malloc(64 * MiB)
    s.expect(s.stat(a, "allocated_bytes.all.current") == 64 * MiB,
             "a 64 MiB block is not counted as 64 MiB allocated")
    s.expect(s.stat(a, "reserved_bytes.all.current") == 64 * MiB,
             f"a 64 MiB block reserved {format_bytes(s.reserved())}, not one 64 MiB segment")
    delta = s.driver_agrees("after a 64 MiB allocation")
    pattern = os.urandom(4096)
    for at in (p, p + 64 * MiB - len(pattern)):
        s.drv.copy_in(s.device, at, pattern)
        s.expect(s.drv.copy_out(s.device, at, len(pattern)) == pattern,
                 f"bytes copied to the block at {at:#x} did not read back")
    a.free(p)
    a.empty_cache()
    s.driver_agrees("after free and empty_cache")
    return f"64 MiB block, driver use +{format_bytes(delta)}; both ends written and read back"


def _free(s: _Step) -> str:
    a = s.allocator()
    p = a.malloc(64 * MiB)
    a.free(p)
    s.expect(s.stat(a, "allocated_bytes.all.current") == 0, "a freed block is still allocated")
    s.expect(s.reserved() == 64 * MiB, "a freed block was not kept in the cache")
    s.driver_agrees("after a free (the block stays cached)")
    made = s.stat(a, "num_device_alloc")
    q = a.malloc(64 * MiB)
    s.expect(q == p, f"the cached block was not reused ({q:#x} instead of {p:#x})")
    s.expect(s.stat(a, "num_device_alloc") == made, "a cached size asked the driver again")
    a.free(q)
    a.empty_cache()
    s.expect(s.reserved() == 0, "empty_cache kept memory")
    s.driver_agrees("after empty_cache")
    return "freed block cached and reused at the same address; empty_cache gave it back"


def _split(s: _Step) -> str:
    a = s.allocator()
    p1, p2 = a.malloc(8 * MiB), a.malloc(8 * MiB)
    s.expect(p2 == p1 + 8 * MiB, "the second 8 MiB block was not split from the first's "
                                 "20 MiB segment")
    small = a.malloc(1000)
    s.expect(s.reserved() == 22 * MiB, f"two 8 MiB blocks and a 1000 B block reserved "
                                       f"{format_bytes(s.reserved())}, not 20 MiB + 2 MiB")
    s.driver_agrees("after two split blocks and a small one")
    for p in (p1, p2, small):
        a.free(p)
    blocks = sorted(len(seg["blocks"]) for seg in a.segments())
    s.expect(blocks == [1, 1], f"freed blocks did not merge back (blocks per segment: {blocks})")
    a.empty_cache()
    s.driver_agrees("after empty_cache")
    return "two 8 MiB blocks from one 20 MiB segment, 1000 B from a 2 MiB one; merged on free"


def _expandable(s: _Step) -> Optional[str]:
    if not s.drv.device(s.device)["vmm"]:
        return None
    a = s.allocator(expandable=True)
    s.expect(bool(a.expandable_active()), "expandable segments did not turn on although the "
                                          "device supports virtual memory management")
    ps = [a.malloc(64 * MiB) for _ in range(3)]
    s.expect(ps == [ps[0] + i * 64 * MiB for i in range(3)],
             "three 64 MiB blocks of an expandable segment are not contiguous")
    s.expect(s.reserved() == 192 * MiB, f"the segment mapped {format_bytes(s.reserved())} for "
                                        "192 MiB of blocks")
    grown = s.driver_agrees("after growing the segment to 192 MiB")
    a.free(ps[1])
    a.free(ps[2])
    a.empty_cache()
    s.expect(s.reserved() == 64 * MiB, f"empty_cache left {format_bytes(s.reserved())} mapped "
                                       "instead of 64 MiB")
    shrunk = s.driver_agrees("after shrinking the segment to 64 MiB")
    a.free(ps[0])
    a.empty_cache()
    s.driver_agrees("after unmapping everything")
    return (f"grew to 192 MiB in one segment (driver +{format_bytes(grown)}), shrank to "
            f"64 MiB (driver +{format_bytes(shrunk)}), then to nothing")


def _cross_stream(s: _Step) -> str:
    a = s.allocator()
    drv, dev = s.drv, s.device
    stream = drv.stream_create(dev)
    try:
        how = drv.hold_stream(dev, stream, HOLD_SECONDS)
        try:
            p = a.malloc(32 * MiB)
            a.record_stream(p, stream)
            a.free(p)
            q = a.malloc(32 * MiB)
            busy = drv.stream_busy(dev, stream)
            if busy:
                s.expect(q != p, "a block freed while its stream was busy was reused at once")
                s.expect(s.reserved() == 64 * MiB, "the allocation made while the freed block "
                                                   "waited did not take a new segment")
                s.driver_agrees("while the freed block waits for its stream")
            drv.stream_synchronize(dev, stream)
        finally:
            drv.release_hold(dev)
        a.free(q)
        a.process_events()
        states = [b["state"] for seg in a.segments() for b in seg["blocks"]]
        s.expect("active_pending_free" not in states, "a block still waits for an event after "
                                                      "its stream was synchronized")
        r = a.malloc(32 * MiB)
        s.expect(r in (p, q), "a freed 32 MiB block was not reused after its stream finished")
        a.free(r)
        a.empty_cache()
        s.driver_agrees("after the stream finished and empty_cache")
    finally:
        drv.stream_destroy(dev, stream)
    if busy:
        return f"not reused while the stream was busy ({how}), reused after it finished"
    return (f"reused after the stream finished; the stream was no longer busy when checked "
            f"({how}), so waiting was not observed")


def _oom(s: _Step) -> str:
    a = s.allocator()
    c = a.malloc(1024 * MiB)
    a.free(c)                                   # 1 GiB cached
    free, total = s.drv.mem_get_info(s.device)
    # Half of the cache's worth of headroom: a GPU's driver may not hand out
    # every last free byte in one allocation.
    want = _round_up(free + 512 * MiB, 2 * MiB)
    retries = s.stat(a, "num_alloc_retries")
    try:
        big = a.malloc(want)                    # fits only once the cache is released
    except _C.OutOfMemoryError as e:
        raise StepFailed(f"{format_bytes(want)} with {format_bytes(free)} free and 1 GiB "
                         f"cached did not fit after the cache was released: {e}") from None
    s.expect(s.stat(a, "num_alloc_retries") == retries + 1,
             "an allocation above the free memory succeeded without releasing the cache first")
    s.driver_agrees(f"after {format_bytes(want)} (above the {format_bytes(free)} free)")
    a.free(big)
    a.empty_cache()
    free, total = s.drv.mem_get_info(s.device)
    ask = _round_up(free + 256 * MiB, 2 * MiB)
    try:
        a.malloc(ask)
        raise StepFailed(f"{format_bytes(ask)} was allocated with {format_bytes(free)} free")
    except _C.OutOfMemoryError as e:
        s.expect(e.device_total == total, f"the error says the device has "
                 f"{format_bytes(e.device_total)}, the driver says {format_bytes(total)}")
    s.expect(s.stat(a, "num_ooms") == 1, "the out-of-memory error was not counted")
    s.driver_agrees("after the out-of-memory error")
    p = a.malloc(64 * MiB)
    a.free(p)
    a.empty_cache()
    return (f"{format_bytes(want)} after releasing the cache (one retry); "
            f"{format_bytes(ask)} of {format_bytes(total)} raised OutOfMemoryError")


STEPS: list[tuple[str, Callable[[_Step], Optional[str]]]] = [
    ("allocate", _allocate), ("free", _free), ("split", _split), ("expandable", _expandable),
    ("cross-stream", _cross_stream), ("oom", _oom)]


def run(device: int = 0, *, driver: Optional[Driver] = None,
        make_allocator: Optional[Callable[..., Any]] = None) -> dict[str, Any]:
    """Run every step on `device`; never raises for a failing step.

    driver: the gpumem.checkup.cudadriver.Driver to check against (default: a new
    one, initialised).  make_allocator: what creates the allocators
    (default gpumem._C.Allocator; called with backend, device and settings).
    Returns {"device", "ok", "seconds", "tolerance", "steps"}, where each
    step is {"name", "status": "ok" | "fail" | "skipped", "detail",
    "seconds"}.
    """
    drv = driver or Driver()
    if driver is None:
        drv.init()
    make = make_allocator or _C.Allocator
    tol = 0 if drv.simulated else REAL_TOLERANCE
    steps = []
    t_all = time.monotonic()
    for name, fn in STEPS:
        t0 = time.monotonic()
        status, detail = "ok", ""
        step = None
        try:
            step = _Step(drv, device, tol, make)
            detail = fn(step)
            if detail is None:
                status, detail = "skipped", ("the device has no virtual memory management; "
                                             "expandable_segments falls back to plain segments")
            else:
                step.finish()
        except StepFailed as e:
            status, detail = "fail", str(e)
        except (RuntimeError, MemoryError, ValueError, DriverError) as e:
            status, detail = "fail", f"{type(e).__name__}: {e}"
        finally:
            if step is not None:
                step.allocators.clear()
                gc.collect()
        steps.append({"name": name, "status": status, "detail": " ".join(str(detail).split()),
                      "seconds": round(time.monotonic() - t0, 3)})
    return {"device": device, "ok": all(s["status"] != "fail" for s in steps),
            "seconds": round(time.monotonic() - t_all, 3), "tolerance": tol, "steps": steps}
