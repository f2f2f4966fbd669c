"""The torch shim that gpumem.install() loaded, and the settings it was created with.

One home for that state, below everything that reads it: gpumem.pytorch.installer
sets it (once, under its lock); gpumem.pytorch.stats and gpumem.sim.command read it.
Nothing here imports torch or the shim.
"""

from __future__ import annotations

from typing import Any

__all__ = ["shim", "loaded", "is_installed", "settings", "set_loaded"]

_shim: Any = None                   # the shim module once installed
_settings: dict | None = None       # the settings dict it was created with
_conf_source = ""                   # the variable they came from, or ''


def set_loaded(module: Any, settings_: dict, source: str) -> None:
    """Record the shim install() loaded (called by gpumem.pytorch.installer under its lock)."""
    global _shim, _settings, _conf_source
    _shim, _settings, _conf_source = module, settings_, source


def loaded() -> Any:
    """The loaded shim module, or None before install()."""
    return _shim


def shim() -> Any:
    """The loaded torch shim module (internal); raises if install() has not run."""
    if _shim is None:
        raise RuntimeError("gpumem is not installed in torch; call gpumem.install() before the "
                           "first CUDA tensor")
    return _shim


def is_installed() -> bool:
    """True once install() has made gpumem torch's CUDA allocator."""
    return _shim is not None and bool(_shim.is_current())


def settings() -> tuple[dict, str] | None:
    """(a copy of the settings dict, the variable it came from), or None before install()."""
    if _settings is None:
        return None
    return dict(_settings), _conf_source
