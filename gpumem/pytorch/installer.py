"""gpumem.install(): gpumem's allocator as PyTorch's CUDA allocator.

    import torch, gpumem
    gpumem.install()          # before the first CUDA tensor

From then on every CUDA tensor's memory comes from gpumem's C core, through
the torch shim (csrc/torch, built on first use by gpumem.pytorch.shim_build).  The
shim's allocator is a C++ ``CUDAPluggableAllocator`` of torch's, swapped in by
the call ``torch.cuda.memory.change_current_allocator`` makes; unlike a plain
pluggable allocator it
raises torch.OutOfMemoryError, honours record_stream, and answers
torch.cuda.memory_stats() itself.  With ``patch_torch=True`` (the default)
torch.cuda's memory functions and torch.cuda.memory._record_memory_history /
_snapshot / _dump_snapshot are routed to gpumem (see PATCHED);
``uninstall_patches()`` puts torch's own back.

Settings are torch's own: torch parses PYTORCH_CUDA_ALLOC_CONF /
PYTORCH_ALLOC_CONF (and every later torch.cuda.memory._set_allocator_settings
string) and gpumem follows what it parsed (expandable_segments,
max_split_size_mb, garbage_collection_threshold, roundup_power2_divisions,
per_process_memory_fraction; Note [One parser: torch's] in
csrc/torch/gm_torch_config.cpp).  GPUMEM_ALLOC_CONF, in the same syntax,
replaces the torch variables' device settings when it is set.  Every string
gets gpumem's one settings check first (Note [One settings check] in
gpumem._conf): a bad one is refused at install() (AllocConfError, a
ValueError) and by the patched setter (ConfError) in one line, before
torch's parser sees it; a key gpumem does not honour gets a one-line warning.
PYTORCH_NO_CUDA_MEMORY_CACHING=1 turns caching off, as it does for torch.

install() also sets the shim's OOM hook (gpumem.recording.oom, for gpumem.record): with
GPUMEM_OOM_SNAPSHOT=/dir set, every out-of-memory error of the process
writes a snapshot into /dir before the exception reaches Python, and
recording starts (if it is off) so that the snapshot has a history.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
from typing import Any, Mapping, Optional

from gpumem.recording import oom as _oom
from gpumem.pytorch import release as _release
from gpumem.pytorch import shim_state as _shim_state
from gpumem._conf import ConfError, TORCH_ONLY_KEYS as _TORCH_KEY_KINDS, parse_conf
from gpumem.pytorch.shim_state import is_installed, shim

__all__ = ["InstallError", "TorchMissingError", "install", "is_installed", "uninstall_patches",
           "patches_applied", "settings_in_effect", "check_environment", "shim", "PATCHED",
           "C_PATCHED"]


class InstallError(RuntimeError):
    """gpumem.install() could not put gpumem's allocator under torch."""


class TorchMissingError(InstallError, ImportError):
    """PyTorch (with CUDA) is not importable."""


class AllocConfError(InstallError, ValueError):
    """GPUMEM_ALLOC_CONF (or the torch variable it falls back to), or
    GPUMEM_OOM_RECORDING when GPUMEM_OOM_SNAPSHOT is set, is invalid."""


_lock = threading.RLock()   # protects install() and the patches; the shim is in _shim_state
_originals: dict[tuple[Any, str], Any] = {}   # (module, name) -> torch's function
_replacements: dict[tuple[Any, str], Any] = {}


def _import_torch():
    try:
        import torch
    except ImportError as e:
        raise TorchMissingError(
            f"gpumem.install() needs PyTorch, but `import torch` failed ({e}). Install a CUDA "
            "build of PyTorch first; without torch, use gpumem.Allocator directly") from None
    if not getattr(torch.version, "cuda", None) or getattr(torch.version, "hip", None):
        raise TorchMissingError(
            f"gpumem.install() needs a CUDA build of PyTorch; this torch ({torch.__version__}) "
            "has no CUDA support")
    return torch


#: torch 2.14's allocator keys that gpumem does not implement: torch parses
#: them at install() (gpumem honours per_process_memory_fraction and names
#: the rest it ignores); gpumem's check (gpumem._conf.parse_conf) checks
#: their values' kind and leaves them to torch.
TORCH_ONLY_KEYS = frozenset(_TORCH_KEY_KINDS)

#: The variables whose settings strings torch's parser reads at install():
#: torch reads both of its own (PYTORCH_CUDA_ALLOC_CONF last), then gpumem
#: hands it GPUMEM_ALLOC_CONF.
_CONF_VARS = ("GPUMEM_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")


def _check_conf(var: str, text: str) -> dict:
    """gpumem's one settings check (Note [One settings check] in gpumem._conf)
    of ``text`` from ``var``: its settings dict, or AllocConfError (its
    ``variable`` attribute names var)."""
    try:
        return parse_conf(text)
    except ConfError as e:
        why = ("" if var == "GPUMEM_ALLOC_CONF" else
               " for gpumem, which takes its settings from it when GPUMEM_ALLOC_CONF "
               "is not set")
        err = AllocConfError(f"{var}={_short(text)!r} is invalid{why}: {e}")
        err.variable = var
        raise err from None


def _settings_refusal() -> Optional[AllocConfError]:
    """gpumem's settings check of the variables install() reads, before
    torch's parser sees them: the refusal, or None."""
    try:
        _read_settings()
    except AllocConfError as e:
        return e
    return None


def _torch_words_first(mod, refused: AllocConfError) -> bool:
    """Whether torch's parser is asked before gpumem's refusal is raised:
    on a release whose allocator settings have no device-generic parser
    (before 2.10), a torch variable that torch refuses is refused in that
    release's words, as its own allocator refuses it; gpumem's variable
    (GPUMEM_ALLOC_CONF) always gets gpumem's."""
    return (getattr(refused, "variable", "") != "GPUMEM_ALLOC_CONF"
            and not _release.interfaces(mod)["accel_config"])


def _short(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else f"{text[:limit - 3]}..."


def _read_settings(environ: Optional[Mapping[str, str]] = None) -> tuple[dict, str]:
    """(settings dict for gpumem._C, where they came from) in ``environ``
    (default os.environ), read without torch: a preview of what install()
    gets from torch's own parser.  Every variable torch's parser will read
    is checked, as install() checks them."""
    environ = os.environ if environ is None else environ
    found: Optional[tuple[dict, str]] = None
    for var in _CONF_VARS:
        text = environ.get(var)
        if text is None:
            continue
        conf = _check_conf(var, text)
        if found is None and (text or var == "GPUMEM_ALLOC_CONF"):
            found = (conf, var)
    return found if found is not None else (parse_conf(None), "")


def _device_index(device: Any) -> int:
    """An explicit device index, without initialising CUDA."""
    if isinstance(device, bool):
        raise TypeError(f"device must be an int, 'cuda:N' or a torch.device, not {device!r}")
    if isinstance(device, int):
        index = device
    else:
        torch = _import_torch()
        try:
            dev = torch.device(device)
        except (RuntimeError, TypeError) as e:
            raise ValueError(f"bad device {device!r}: {e}") from None
        if dev.type != "cuda":
            raise ValueError(f"gpumem serves CUDA devices; {device!r} is a {dev.type} device")
        index = dev.index if dev.index is not None else 0
    if index < 0:
        raise ValueError(f"device index must be >= 0, not {index}")
    return index


def _conf_source() -> str:
    """The variable the settings string torch parsed came from, or ''."""
    for var in ("GPUMEM_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"):
        if os.environ.get(var) is not None:
            return var
    return ""


def _torch_settings(mod) -> tuple[dict, str]:
    """The settings torch parsed (GPUMEM_ALLOC_CONF applied), and their source;
    one warning per key gpumem does not honour."""
    source = _conf_source()
    override = os.environ.get("GPUMEM_ALLOC_CONF")
    try:
        info = mod.torch_settings(override)
    except ValueError as e:
        text = os.environ.get(source, "") if source else ""
        raise AllocConfError(f"{source}={text!r} is invalid: {e}") from None
    import warnings
    for line in mod.ignored_entries(info["conf"], source or "the allocator settings"):
        warnings.warn(line, UserWarning, stacklevel=3)
    return info["settings"], source


def _check_oom_recording(environ: Optional[Mapping[str, str]] = None) -> None:
    try:
        _oom.check_env(environ)
    except ConfError as e:
        raise AllocConfError(str(e)) from None


def check_environment(environ: Optional[Mapping[str, str]] = None) -> None:
    """Raise AllocConfError if the variables install() reads (GPUMEM_ALLOC_CONF
    or its torch fallbacks, GPUMEM_OOM_RECORDING with GPUMEM_OOM_SNAPSHOT)
    are invalid in ``environ`` (default os.environ); install() would refuse
    them.  Neither imports torch nor builds anything."""
    _read_settings(environ)
    _check_oom_recording(environ)


def _not_initialised_error() -> InstallError:
    return InstallError(
        "gpumem.install() must be called before any CUDA allocation: torch's CUDA caching "
        "allocator is already initialised in this process (a CUDA tensor exists, or torch.cuda "
        "was initialised). Call gpumem.install() right after `import torch`, before any "
        ".cuda(), .to('cuda'), torch.cuda.* call or model construction on the GPU")


def _follow_settings_setter(torch, mod) -> None:
    """torch releases before 2.10 have no hook that a new allocator settings
    string passes through: their setter is wrapped instead, so that
    torch.cuda.memory._set_allocator_settings reaches gpumem as it reaches
    torch's allocator (the allocator stays wrapped: it is never uninstalled)."""
    name = "_cuda_cudaCachingAllocator_set_allocator_settings"
    setter = getattr(torch._C, name, None)
    if setter is None:
        return

    @functools.wraps(setter)
    def set_allocator_settings(env):
        setter(env)
        mod.settings_changed(env)

    setattr(torch._C, name, set_allocator_settings)


def install(device: Any = None, patch_torch: bool = True) -> None:
    """Make gpumem's allocator PyTorch's CUDA allocator (call before any CUDA tensor).

    device: None to create each device's allocator on its first use (as
        torch does); an index, 'cuda:N' or torch.device to also check that
        device and set its allocator up now.
    patch_torch: route torch.cuda's memory functions and the memory-history
        functions to gpumem (see PATCHED); undo with uninstall_patches().

    Calling it again is harmless.  Raises TorchMissingError without a CUDA
    build of torch, AllocConfError for bad settings, and InstallError once
    torch's own CUDA allocator is in use.  The first call may build the
    torch shim (gpumem.pytorch.shim_build) into the per-torch cache.
    """
    with _lock:
        if _shim_state.loaded() is None:
            torch = _import_torch()
            _check_oom_recording()  # refused before anything is swapped in
            refused = _settings_refusal()
            from gpumem.pytorch import shim_build as _shim_build
            loaded = sys.modules.get(_shim_build.MODULE_NAME)
            if torch.cuda.is_initialized() and not (loaded and loaded.is_current()):
                raise _not_initialised_error()  # before spending time on the shim
            try:
                mod = _shim_build.load()
            except _shim_build.ShimBuildError as e:
                raise InstallError(f"gpumem.install(): {e}") from e
            if refused is not None and not _torch_words_first(mod, refused):
                raise refused
            settings, source = _torch_settings(mod)
            if refused is not None:
                raise refused  # what torch's parser takes and gpumem cannot
            if not mod.is_current():
                if torch.cuda.is_initialized():
                    raise _not_initialised_error()
                mod.create(settings)
                if not mod.follow_torch_settings():
                    _follow_settings_setter(torch, mod)
                try:
                    mod.make_current()  # torch.cuda.memory.change_current_allocator's C++ call
                except RuntimeError as e:
                    if "initialized" in str(e):
                        raise _not_initialised_error() from e
                    raise
            _shim_state.set_loaded(mod, settings, source)
        _oom.install_hook(shim())  # OOM snapshots: gpumem.record and GPUMEM_OOM_SNAPSHOT
        if device is not None:
            shim().ensure_device(_device_index(device))
        if patch_torch:
            _apply_patches()


def settings_in_effect() -> tuple[dict, str]:
    """(the allocator settings dict, the variable they came from or '').

    After install(), the settings in force (changed at run time too);
    before, a preview read from the variables without torch.
    """
    state = _shim_state.settings()
    if state is None:
        return _read_settings()
    return shim().settings(), state[1]


# ------------------------------------------------------------- patching

def _patch_table() -> dict[str, Any]:
    from gpumem.recording import history
    from gpumem.pytorch import stats
    return {
        "memory_stats": stats.memory_stats,
        "memory_allocated": stats.memory_allocated,
        "max_memory_allocated": stats.max_memory_allocated,
        "memory_reserved": stats.memory_reserved,
        "max_memory_reserved": stats.max_memory_reserved,
        "reset_peak_memory_stats": stats.reset_peak_memory_stats,
        "reset_accumulated_memory_stats": stats.reset_accumulated_memory_stats,
        "memory_summary": stats.memory_summary,
        "empty_cache": stats.empty_cache,
        "mem_get_info": stats.mem_get_info,
        "set_per_process_memory_fraction": stats.set_per_process_memory_fraction,
        "get_per_process_memory_fraction": stats.get_per_process_memory_fraction,
        "memory_snapshot": stats.memory_snapshot,
        "_record_memory_history": history._record_memory_history,
        "_snapshot": history._snapshot,
        "_dump_snapshot": history._dump_snapshot,
        "_set_memory_metadata": history._set_memory_metadata,
        "_get_memory_metadata": history._get_memory_metadata,
        "_memory_metadata_supported": stats._memory_metadata_supported,
        "_allocation_traceback": history._allocation_traceback,
        # torch._C's entry points (C_PATCHED)
        "_cuda_record_memory_history": history._cuda_record_memory_history,
        "_cuda_record_memory_history_legacy": history._cuda_record_memory_history_legacy,
        "_cuda_memorySnapshot": history._cuda_memory_snapshot,
        "_cuda_allocationTraceback": history._allocation_traceback,
        "_accelerator_setAllocatorSettings": _set_allocator_settings,
    }


_torch_setter: Any = None   # torch._C._accelerator_setAllocatorSettings, once patched


def _set_allocator_settings(env: Any) -> Any:
    """torch._C._accelerator_setAllocatorSettings (and so
    torch.cuda.memory._set_allocator_settings) after gpumem's settings check:
    a string it refuses raises ConfError (a ValueError) in one line, and
    torch's parser, which would apply the entries before the bad one, never
    sees it (Note [One settings check] in gpumem._conf)."""
    if isinstance(env, str):
        parse_conf(env)
    return _torch_setter(env)


#: The torch.cuda.memory functions patch_torch=True routes to gpumem (the
#: same names in torch.cuda are patched where torch re-exports them).
PATCHED = ("memory_stats", "memory_allocated", "max_memory_allocated", "memory_reserved",
           "max_memory_reserved", "reset_peak_memory_stats", "reset_accumulated_memory_stats",
           "memory_summary", "empty_cache", "mem_get_info", "set_per_process_memory_fraction",
           "get_per_process_memory_fraction", "memory_snapshot", "_record_memory_history",
           "_snapshot", "_dump_snapshot", "_set_memory_metadata", "_get_memory_metadata",
           "_memory_metadata_supported", "_allocation_traceback")

#: The torch._C entry points under them, routed too: torch's own tests and
#: some frameworks call them directly (torch._C._cuda_memorySnapshot(None)),
#: and the settings setter gets gpumem's settings check first.
C_PATCHED = ("_cuda_record_memory_history", "_cuda_record_memory_history_legacy",
             "_cuda_memorySnapshot", "_cuda_allocationTraceback",
             "_accelerator_setAllocatorSettings")


def _apply_patches() -> None:
    global _torch_setter
    import torch
    import torch.cuda.memory as tmem
    table = _patch_table()
    for name in PATCHED:
        new = table[name]
        original = getattr(tmem, name, None)
        if original is None:
            continue
        for mod in (tmem, torch.cuda):
            cur = getattr(mod, name, None)
            key = (mod, name)
            if key in _replacements and cur is _replacements[key]:
                continue  # already ours
            if mod is torch.cuda and cur is not original:
                continue  # torch.cuda does not re-export it, or someone else patched it
            _originals[key] = cur
            _replacements[key] = new
            setattr(mod, name, new)
    for name in C_PATCHED:
        cur = getattr(torch._C, name, None)
        key = (torch._C, name)
        if cur is None or (key in _replacements and cur is _replacements[key]):
            continue
        _originals[key] = cur
        if name == "_accelerator_setAllocatorSettings":
            _torch_setter = cur
        _replacements[key] = table[name]
        setattr(torch._C, name, table[name])
    _apply_autograd_patches()


def _with_backward_context(fn):
    """fn (torch.autograd.backward or grad), attributing the allocations that
    autograd's threads make meanwhile to the caller's line (Note [Backward
    context] in csrc/python/hist_capture.c).

    While Dynamo traces (torch.compiler.is_compiling(), which it folds to a
    constant) the wrapper is only fn: Dynamo cannot trace gpumem._C and
    would warn about it; it treats fn as it does without gpumem (backward is
    a graph break, run eagerly, where the context is taken as usual)."""
    from gpumem import _C
    import torch

    is_compiling = torch.compiler.is_compiling

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if is_compiling():
            return fn(*args, **kwargs)
        prev = _C._hist_backward_enter()
        try:
            return fn(*args, **kwargs)
        finally:
            _C._hist_backward_exit(prev)

    return wrapper


def _apply_autograd_patches() -> None:
    import torch.autograd as ag
    for name in ("backward", "grad"):
        key = (ag, name)
        cur = getattr(ag, name)
        if key in _replacements and cur is _replacements[key]:
            continue
        _originals[key] = cur
        _replacements[key] = _with_backward_context(cur)
        setattr(ag, name, _replacements[key])


def patches_applied() -> bool:
    """True while torch.cuda's memory functions are routed to gpumem."""
    return any(getattr(mod, name, None) is new for (mod, name), new in _replacements.items())


def uninstall_patches() -> None:
    """Give torch.cuda its own memory functions back (the allocator stays gpumem's).

    A function someone else replaced after install() is left alone.
    """
    with _lock:
        for key, new in list(_replacements.items()):
            mod, name = key
            if getattr(mod, name, None) is new:
                setattr(mod, name, _originals[key])
            del _replacements[key]
            _originals.pop(key, None)
