"""What the conformance checks share: the run they are part of, and helpers.

Imported twice: by pytest (test_conformance.py lists the checks of every
group; nothing here imports torch at module level) and inside the group's
subprocess on the simulated GPU (runner.py), where MODE says whose allocator
is under test: "torch" (torch's own CUDACachingAllocator) or "gpumem"
(gpumem.install() ran first).

A check is a function named check_* in a cf_*.py group module.  It states
torch's documented behaviour with plain asserts and runs unchanged under
both allocators.  Two decorators mark the exceptions:

  @differs(anchor)  gpumem deliberately behaves otherwise; the check asserts
                    torch's behaviour under torch and gpumem's (documented
                    in docs/compatibility.md#anchor) under gpumem.
  @gpumem_only      a gpumem feature with no torch counterpart (skipped
                    under torch).
  @sim_limit(why)   torch's behaviour that the simulated GPU cannot show
                    (it fails under both allocators for that reason); the
                    test is an expected failure until the simulator can.
  @needs(*names)    the torch interfaces (dotted names under torch) the
                    check exercises that an older supported release lacks:
                    on a release without one the check is skipped, naming
                    it and the release; where they exist it runs unchanged.
  @since(release, what)  a behaviour torch gained in `release` ("2.8") that
                    no interface name shows (a keyword, a settings key):
                    skipped on older releases, saying what they lack.

A check restores what it changes (settings, fraction, recording), as
PyTorch's own tests do; runner.py also turns recording off and empties the
cache after each check.
"""

from __future__ import annotations

import contextlib
import gc
import os
from typing import Any, Callable, Iterator

MiB = 1 << 20
GiB = 1 << 30

#: "torch" or "gpumem" inside a run; None in the pytest process.
MODE: str | None = os.environ.get("GPUMEM_CONFORMANCE_MODE")
#: The exception gpumem.install() raised in this run, if any (groups that
#: test configuration errors look at it; others fail if it is set), and the
#: warnings it issued.
INSTALL_ERROR: BaseException | None = None
INSTALL_WARNINGS: list[str] = []


class Skip(Exception):
    """Raised by a check that does not apply to this run."""


def differs(anchor: str) -> Callable:
    """Mark a deliberate difference, documented in docs/compatibility.md#anchor."""
    def mark(fn: Callable) -> Callable:
        fn.differs = anchor
        return fn
    return mark


def sim_limit(reason: str) -> Callable:
    """Mark a check that fails on the simulated GPU under either allocator."""
    def mark(fn: Callable) -> Callable:
        fn.sim_limit = reason
        return fn
    return mark


def needs(*names: str) -> Callable:
    """Mark a check of torch interfaces some supported releases lack
    ("cuda.caching_allocator_disabled" for torch.cuda.caching_allocator_disabled)."""
    def mark(fn: Callable) -> Callable:
        fn.needs = names
        return fn
    return mark


def since(release: str, what: str) -> Callable:
    """Mark a check of a behaviour torch gained in release ("2.8")."""
    def mark(fn: Callable) -> Callable:
        fn.since = (release, what)
        return fn
    return mark


def torch_release() -> tuple[int, int]:
    """(major, minor) of the torch imported."""
    major, minor = torch_mod().__version__.split(".")[:2]
    return int(major), int(minor)


def at_least(release: str) -> bool:
    """True when the torch imported is release ("2.8") or newer."""
    return torch_release() >= tuple(int(p) for p in release.split("."))


def older_than(release: str, what: str, version: str | None = None) -> str | None:
    """Why this torch lacks what (it is older than release), or None;
    version: the torch release to judge instead of the one imported."""
    want = tuple(int(p) for p in release.split("."))
    version = version or torch_mod().__version__
    if tuple(int(p) for p in version.split(".")[:2]) < want:
        return f"torch {version} has no {what} (since {release})"
    return None


def settings_error() -> type:
    """What torch raises for a bad settings string: ValueError from its
    device-generic parser (2.10 on; read on 2.10.0 and 2.14.1), RuntimeError
    before (2.6.0, 2.9.1: 2.9's CUDA allocator still parses every key)."""
    return ValueError if torch_release() >= (2, 10) else RuntimeError


def missing_interface(fn: Callable) -> str | None:
    """Why fn cannot run on this torch (an interface it needs is absent, or
    it is older than the release a behaviour came in), or None."""
    if getattr(fn, "since", None):
        why = older_than(*fn.since)
        if why:
            return why
    names = getattr(fn, "needs", ())
    if not names:
        return None
    torch = torch_mod()
    for name in names:
        obj = torch
        for part in name.split("."):
            if not hasattr(obj, part):
                return f"torch {torch.__version__} has no torch.{name}"
            obj = getattr(obj, part)
    return None


def gpumem_only(fn: Callable) -> Callable:
    """Mark a check of a gpumem feature torch does not have."""
    fn.gpumem_only = True
    return fn


def gpumem() -> bool:
    """True when gpumem's allocator is the one under test."""
    return MODE == "gpumem"


def torch_mod():
    import torch
    return torch


def stats() -> dict:
    return torch_mod().cuda.memory_stats()


def stat(key: str) -> int:
    return stats()[key]


def delta(fn: Callable[[], Any], key: str) -> tuple[Any, int]:
    """(fn(), change of memory_stats()[key] across it)."""
    before = stat(key)
    out = fn()
    return out, stat(key) - before


def empty(nbytes: int, stream: Any = None):
    """An uninitialised uint8 CUDA tensor of nbytes bytes."""
    torch = torch_mod()
    if stream is None:
        return torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    with torch.cuda.stream(stream):
        return torch.empty(nbytes, dtype=torch.uint8, device="cuda")


def settle() -> None:
    """Free what the previous steps left behind: garbage, then the cache."""
    torch = torch_mod()
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


def raises(exc: type, fn: Callable[[], Any], match: str | None = None) -> BaseException:
    """fn() must raise exc (and its text contain match); returns the exception."""
    try:
        fn()
    except exc as e:
        if match is not None:
            assert match in str(e), f"{type(e).__name__}: {str(e)[:500]!r} lacks {match!r}"
        return e
    raise AssertionError(f"{getattr(fn, '__name__', fn)} did not raise {exc.__name__}")


@contextlib.contextmanager
def fraction(value: float, device: int = 0) -> Iterator[None]:
    """set_per_process_memory_fraction(value) for the block, restored after."""
    torch = torch_mod()
    orig = torch.cuda.get_per_process_memory_fraction(device)
    torch.cuda.set_per_process_memory_fraction(value, device)
    try:
        yield
    finally:
        torch.cuda.set_per_process_memory_fraction(orig, device)


# The last settings string set through set_settings, on a release with no
# getter for it (before torch 2.9); None until one is set.
_last_settings: str | None = None


def set_settings(text: str) -> None:
    """torch.cuda.memory._set_allocator_settings, without its deprecation
    warning (torch 2.9 on; before, it is that function, with no warning)."""
    global _last_settings
    torch = torch_mod()
    setter = getattr(torch._C, "_accelerator_setAllocatorSettings", None)
    if setter is not None:
        setter(text)
        return
    torch.cuda.memory._set_allocator_settings(text)
    _last_settings = text


def last_settings() -> str:
    """The last settings string in force: torch keeps it from 2.9 on; before,
    the one set_settings last set, else PYTORCH_CUDA_ALLOC_CONF."""
    torch = torch_mod()
    getter = getattr(torch._C, "_accelerator_getAllocatorSettings", None)
    if getter is not None:
        return getter()
    if _last_settings is not None:
        return _last_settings
    return os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")


def settings_in_force() -> str:
    """A settings string that puts back the settings in force now.

    The last string set, with expandable_segments added: a new string
    resets max_split_size_mb, roundup_power2_divisions and
    garbage_collection_threshold to their defaults, but not
    expandable_segments.
    """
    torch = torch_mod()
    last = last_settings()
    if "expandable_segments" in last:
        return last
    on = torch.cuda.memory._snapshot()["allocator_settings"]["expandable_segments"]
    return ",".join(p for p in (f"expandable_segments:{on}", last) if p)


@contextlib.contextmanager
def settings(text: str) -> Iterator[None]:
    """Allocator settings for the block; the ones in force before, after it."""
    before = settings_in_force()
    set_settings(text)
    try:
        yield
    finally:
        set_settings(before)


@contextlib.contextmanager
def recording(**kw: Any) -> Iterator[None]:
    """torch.cuda.memory._record_memory_history(**kw) for the block, off after."""
    torch = torch_mod()
    torch.cuda.memory._record_memory_history(**kw)
    try:
        yield
    finally:
        torch.cuda.memory._record_memory_history(None)


def blocks(snapshot: dict) -> Iterator[dict]:
    """Every block of a snapshot, each with its segment as block['_segment']."""
    for seg in snapshot["segments"]:
        for b in seg["blocks"]:
            yield dict(b, _segment=seg)


def frame_names(frames: list) -> list[str]:
    return [f["name"] for f in frames]


def trace(snapshot: dict, device: int = 0) -> list[dict]:
    return snapshot["device_traces"][device]


def format_size(nbytes: int) -> str:
    """A size as torch's messages print it (c10's format_size: each unit up
    to and including 1024 of the one below)."""
    for limit, unit in ((1 << 10, None), (1 << 20, "KiB"), (1 << 30, "MiB")):
        if nbytes <= limit:
            return f"{nbytes} bytes" if unit is None else f"{nbytes / (limit >> 10):.2f} {unit}"
    return f"{nbytes / GiB:.2f} GiB"


def this_process_uses(nbytes: int) -> str:
    """The OOM message's sentence for this process's own device memory, as
    NVML reports it (the simulator's NVML lists this process alone)."""
    return f"Including non-PyTorch memory, this process has {format_size(nbytes)} memory in use. "
