"""Which CUDA major version the torch a command will import was built for.

The simulator's fake libraries carry one CUDA major version's names
(``libcudart.so.12`` for PyTorch's CUDA 12 builds, torch 2.6 to 2.10 on
PyPI; ``libcudart.so.13`` for its CUDA 13 ones), so the launcher must
preload the set the command's torch links. It finds that torch without
importing it (importing torch in the launcher costs seconds and memory):

1. the Python interpreter the command runs: the command itself when it is
   one (``python``, ``python3.11``, a path to either), else the
   interpreter named by its script's ``#!`` line (``torchrun``, ``pytest``
   and ``gpumem`` of a virtual environment); ``run_snippet`` and a command
   that is neither use the launcher's own interpreter;
2. where that interpreter's ``torch`` package is
   (``importlib.util.find_spec``: no torch code runs), asked in-process
   when it is the launcher's own interpreter, else by running it once
   (about 20 ms);
3. the ``cuda = '12.8'`` line of ``torch/version.py`` there.

$GPUMEM_SIM_CUDA (12 or 13) overrides all of it. When no torch with a
CUDA version is found (a CPU-only build, no torch at all), the answer is
None and the launcher uses the newest major version it has.

Imports nothing of gpumem's.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from typing import Mapping, Optional, Sequence

__all__ = ["command_python", "torch_cuda_version", "torch_cuda_major", "ENV"]

ENV = "GPUMEM_SIM_CUDA"

_PYTHON_NAME = re.compile(r"python(\d+(\.\d+)?)?")
_CUDA_LINE = re.compile(r"^cuda\s*(?::[^=\n]*)?=\s*['\"]([0-9][0-9.]*)['\"]", re.M)
_FIND_TORCH = ("import importlib.util as u; s = u.find_spec('torch'); "
               "print(s.submodule_search_locations[0] if s and s.submodule_search_locations else '')")


def _which(name: str, env: Mapping[str, str]) -> Optional[str]:
    if os.sep in name:
        return os.path.abspath(name) if os.path.isfile(name) else None
    return shutil.which(name, path=env.get("PATH", os.defpath))


def _shebang(path: str) -> Optional[Sequence[str]]:
    try:
        with open(path, "rb") as f:
            first = f.readline(512)
    except OSError:
        return None
    if not first.startswith(b"#!"):
        return None
    return first[2:].decode("utf-8", "replace").split()


def command_python(cmd: Sequence[str], env: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """The Python interpreter cmd runs (a path), or None when it is not one
    nor a script with a Python #! line."""
    if not cmd:
        return None
    env = os.environ if env is None else env
    exe = _which(cmd[0], env)
    if exe is None:
        return None
    if _PYTHON_NAME.fullmatch(os.path.basename(exe)):
        return exe
    words = _shebang(exe)
    if not words:
        return None
    if os.path.basename(words[0]) == "env":
        words = [w for w in words[1:] if not w.startswith("-")]
        if not words:
            return None
        interp = _which(words[0], env)
    else:
        interp = words[0]
    if interp and _PYTHON_NAME.fullmatch(os.path.basename(interp)):
        return interp
    return None


def _torch_dir(python: Optional[str]) -> Optional[str]:
    if python is None or os.path.abspath(python) == os.path.abspath(sys.executable):
        try:
            spec = importlib.util.find_spec("torch")
        except (ImportError, ValueError):
            return None
        locs = spec.submodule_search_locations if spec else None
        return locs[0] if locs else None
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    try:
        proc = subprocess.run([python, "-c", _FIND_TORCH], capture_output=True, text=True,
                              timeout=60, env=env)
    except (OSError, subprocess.SubprocessError):
        return None
    out = proc.stdout.strip()
    return out if proc.returncode == 0 and out else None


def torch_cuda_version(python: Optional[str] = None) -> Optional[str]:
    """torch.version.cuda ('12.8') of the torch that interpreter (None: the
    running one) imports, read from its torch/version.py; None when there
    is no torch or it is not a CUDA build."""
    where = _torch_dir(python)
    if not where:
        return None
    try:
        with open(os.path.join(where, "version.py"), encoding="utf-8") as f:
            text = f.read()
    except OSError:
        return None
    m = _CUDA_LINE.search(text)
    return m.group(1) if m else None


def torch_cuda_major(cmd: Optional[Sequence[str]] = None,
                     env: Optional[Mapping[str, str]] = None) -> Optional[int]:
    """The CUDA major version of the torch cmd will import (None for cmd:
    the running interpreter's torch), $GPUMEM_SIM_CUDA if set; None when
    unknown."""
    env = os.environ if env is None else env
    forced = env.get(ENV, "").strip()
    if forced:
        m = re.fullmatch(r"(\d+)(\.\d+)?", forced)
        if not m:
            raise ValueError(f"{ENV}={forced!r}: give a CUDA major version such as 12 or 13")
        return int(m.group(1))
    python = command_python(cmd, env) if cmd else None
    version = torch_cuda_version(python)
    return int(version.split(".")[0]) if version else None
