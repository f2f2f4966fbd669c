"""Building, caching and validating gpumem's torch shim (csrc/torch, C++).

The shim is compiled against the installed torch's headers with
``torch.utils.cpp_extension`` (ninja) into a per-torch cache directory:

    $GPUMEM_CACHE_DIR (else $XDG_CACHE_HOME/gpumem, else ~/.cache/gpumem)
        /shim-<torch version>-cu<CUDA version>-abi<0|1>-<python cache tag>/
            gpumem_torch_shim.so
            gpumem_torch_shim.json   <- what it was built for
        /record_function-<the same>/
            gpumem_torch_record_function.so, .json

The second module (RECORD_FUNCTION: memory history's record_function
callbacks, csrc/torch/gm_torch_record_function.cpp) is kept out of the
shim's build, whose compile time ATen/record_function.h would be about 40 %
of: gpumem.recording.history loads it, building it if needed, when history
is first recorded.  ``gpumem build-shim`` builds both.  Everything below
applies to each module alike (``module=`` picks one; the shim by default).

The JSON file records the torch version and git revision, the CUDA
version, the C++ ABI flag, the Python tag, gpumem's core API version and a
SHA-256 of the shim's sources.  ``load()`` compares every field with the
running process before importing the library: a shim built for anything
else is rebuilt (or, with ``GPUMEM_SHIM_BUILD=0``, refused with a message
naming the difference).  It is never imported blindly.

``build(verbose=False, force=False)`` is the explicit command.  Concurrent
builds (several ranks starting at once) are serialised by a file lock; the
ones that wait then find the finished build and load it.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.machinery
import importlib.util
import io
import json
import os
import shutil
import sys
import sysconfig
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, NamedTuple

__all__ = ["ShimBuildError", "MODULE_NAME", "Module", "SHIM", "RECORD_FUNCTION", "MODULES",
           "SUPPORTED_TORCH", "check_torch_release", "cache_dir", "expected_info", "check", "build",
           "load", "loaded", "source_dir", "missing_prerequisite", "prerequisites", "CLI_COMMAND"]



class Module(NamedTuple):
    """One C++ extension module built against torch: its name, what messages
    call it (after "gpumem's ") and what it is for, its cache folder's
    prefix, its sources (under csrc/), the libraries it links beyond
    cpp_extension's, whether it uses gpumem._C's
    core API, and the "about N s" its first build announces (measured:
    README.md, "The torch shim")."""
    name: str
    what: str
    purpose: str
    prefix: str
    sources: tuple[str, ...]
    ldflags: tuple[str, ...]
    uses_core: bool
    seconds: int


SHIM = Module(
    "gpumem_torch_shim", "torch shim", "gpumem as torch's CUDA allocator", "shim",
    ("torch/gm_torch.h", "torch/gm_torch_compat.h", "torch/gm_torch_pycall.h",
     "torch/gm_torch_alloc.cpp", "torch/gm_torch_config.cpp",
     "torch/gm_torch_history.cpp", "torch/gm_torch_module.cpp", "torch/gm_torch_nvml.cpp",
     "torch/gm_torch_oom.cpp", "torch/gm_torch_oom_hook.cpp",
     "torch/gm_torch_pools.cpp", "torch/gm_torch_snapshot.cpp", "torch/gm_torch_stats.cpp",
     "python/core_api.h", "history/hist.h", "core/gm_alloc.h", "base/errors.h", "base/format.h",
     "device/backend.h"),
    ("-ltorch_cuda", "-lc10_cuda", "-ldl"), True, 10)
RECORD_FUNCTION = Module(
    "gpumem_torch_record_function",
    "record_function module", "memory history's annotations and torch.compile regions",
    "record_function",
    ("torch/gm_torch_compat.h", "torch/gm_torch_pycall.h", "torch/gm_torch_record_function.h",
     "torch/gm_torch_record_function.cpp", "torch/gm_torch_rf_module.cpp"),
    ("-lc10_cuda",), False, 10)
MODULES = (SHIM, RECORD_FUNCTION)
MODULE_NAME = SHIM.name
#: Bumped when the build recipe below changes in a way the sources do not show.
_RECIPE = 5
_load_lock = threading.Lock()  # one load() at a time in this process (the file lock: across)
# Fields that must match for a cached shim to be loaded, with their names in messages.
_MUST_MATCH = (("torch_version", "torch version"), ("torch_git", "torch git revision"),
               ("cuda", "torch CUDA version"), ("cxx11_abi", "C++ ABI flag"),
               ("python", "Python"), ("core_api", "gpumem core API version"),
               ("sources_sha256", "shim sources"))


#: The torch releases (major, minor) the shim is written for, oldest and
#: newest: csrc/torch/gm_torch_compat.h names where their interfaces differ.
SUPPORTED_TORCH = ((2, 6), (2, 14))


class ShimBuildError(RuntimeError):
    """The torch shim cannot be built or loaded; the message says why and what to do."""


def _supported_text() -> str:
    (a, b), (c, d) = SUPPORTED_TORCH
    return f"{a}.{b} to {c}.{d}"


def check_torch_release(version: str) -> None:
    """Raise ShimBuildError (one line: what was found, what is supported,
    what to do) unless torch ``version`` is a release gpumem supports."""
    import re
    m = re.match(r"(\d+)\.(\d+)", str(version))
    found = (int(m.group(1)), int(m.group(2))) if m else None
    if found is not None and SUPPORTED_TORCH[0] <= found <= SUPPORTED_TORCH[1]:
        return
    (lo_major, lo_minor), (hi_major, hi_minor) = SUPPORTED_TORCH
    raise ShimBuildError(
        f"gpumem supports torch {_supported_text()}, and this is torch {version}: install a "
        f"supported release (pip install 'torch>={lo_major}.{lo_minor},<{hi_major}.{hi_minor + 1}')"
        + (", or a gpumem that supports this one" if found and found > SUPPORTED_TORCH[1] else ""))


def source_dir() -> Path:
    """csrc/ holding the shim's sources (a source checkout or an editable install)."""
    env = os.environ.get("GPUMEM_SHIM_SRC")
    candidates = [Path(env)] if env else []
    pkg = Path(__file__).resolve().parent.parent    # gpumem/
    candidates += [pkg.parent / "csrc", pkg / "_csrc"]
    for c in candidates:
        if all((c / s).is_file() for m in MODULES for s in m.sources):
            return c
    raise ShimBuildError(
        "gpumem's torch shim sources (csrc/torch/*.cpp) are not available next to this gpumem "
        f"installation (looked in {', '.join(str(c) for c in candidates)}); install gpumem from "
        "a source checkout (pip install -e .) or set GPUMEM_SHIM_SRC to its csrc directory")


def _torch():
    try:
        import torch
    except ImportError as e:
        raise ShimBuildError(f"gpumem's torch shim needs PyTorch, which cannot be imported ({e}); "
                             "install torch with CUDA support first") from None
    check_torch_release(torch.__version__)
    return torch


def _sources_sha256(src: Path, module: Module) -> str:
    h = hashlib.sha256(f"recipe {_RECIPE}\n".encode())
    for rel in module.sources:
        h.update(rel.encode() + b"\0")
        h.update((src / rel).read_bytes())
        h.update(b"\0")
    return h.hexdigest()


def _core_api_version() -> int:
    from gpumem import _C
    return int(_C.CORE_API_VERSION)


def expected_info(src: Path | None = None, module: Module = SHIM) -> dict[str, Any]:
    """What a shim (or ``module``) for this process must have been built for."""
    torch = _torch()
    src = src or source_dir()
    return {
        "torch_version": torch.__version__,
        "torch_git": getattr(torch.version, "git_version", "") or "",
        "cuda": torch.version.cuda or "",
        "cxx11_abi": bool(torch._C._GLIBCXX_USE_CXX11_ABI),
        "python": f"{sys.implementation.cache_tag}-{sysconfig.get_platform()}",
        "core_api": _core_api_version(),
        "sources_sha256": _sources_sha256(src, module),
    }


def cache_dir(info: dict[str, Any] | None = None, module: Module = SHIM) -> Path:
    """The directory the shim (or ``module``) for this torch is built into (not created here)."""
    torch = _torch()
    root = os.environ.get("GPUMEM_CACHE_DIR")
    if not root:
        xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        root = os.path.join(xdg, "gpumem")
    abi = int(bool(torch._C._GLIBCXX_USE_CXX11_ABI))
    name = (f"{module.prefix}-{torch.__version__}-cu{torch.version.cuda or 'none'}-abi{abi}-"
            f"{sys.implementation.cache_tag}")
    return Path(root) / name.replace(os.sep, "_")


def _library(d: Path, module: Module = SHIM) -> Path:
    return d / (module.name + ".so")


def _info_file(d: Path, module: Module) -> Path:
    return d / (module.name + ".json")


def _noun(module: Module) -> str:
    return "shim" if module is SHIM else "module " + module.name


def check(d: Path | None = None, module: Module = SHIM) -> tuple[bool, str]:
    """(True, '') if the cached shim (or ``module``) matches this process, else (False, why)."""
    info = expected_info(module=module)
    d = d or cache_dir(info, module)
    lib, meta = _library(d, module), _info_file(d, module)
    noun = _noun(module)
    if not lib.is_file() or not meta.is_file():
        return False, f"no {noun} has been built in {d} yet"
    try:
        built = json.loads(meta.read_text())
    except (OSError, ValueError) as e:
        return False, f"the {noun}'s build record {meta} is unreadable ({e})"
    diffs = [f"{label}: built for {built.get(key)!r}, running {info[key]!r}"
             for key, label in _MUST_MATCH if built.get(key) != info[key]]
    if diffs:
        return False, f"the {noun} in {d} was built for a different setup ({'; '.join(diffs)})"
    return True, ""


def _cuda_include() -> str:
    """A directory with cuda_runtime_api.h (torch's CUDA headers include it)."""
    torch = _torch()
    cands = [os.environ.get("GPUMEM_CUDA_INCLUDE", "")]
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")):
        if home:
            cands.append(os.path.join(home, "include"))
    cands += ["/usr/local/cuda/include"]
    major = (torch.version.cuda or "").split(".")[0]
    for pkg, subdirs in (("nvidia", (f"cu{major}/include", "cuda_runtime/include")),
                         ("triton", ("backends/nvidia/include",))):
        spec = importlib.util.find_spec(pkg)
        for base in (spec.submodule_search_locations or []) if spec else []:
            cands += [os.path.join(base, sub) for sub in subdirs]
    for c in cands:
        # crt/host_defines.h too: some wheels ship cuda_runtime_api.h without it.
        if c and all(os.path.isfile(os.path.join(c, f))
                     for f in ("cuda_runtime_api.h", os.path.join("crt", "host_defines.h"))):
            return c
    raise ShimBuildError(
        "building gpumem's torch shim needs the CUDA runtime headers (cuda_runtime_api.h), "
        "which torch's CUDA headers include; none were found (install the CUDA toolkit, or the "
        f"nvidia-cuda-runtime wheel matching CUDA {torch.version.cuda}, or set "
        "GPUMEM_CUDA_INCLUDE to a directory holding cuda_runtime_api.h)")


def _cpp_extension():
    import logging
    # Its import logs a warning about CUDA_HOME that does not concern a C++-only build.
    log = logging.getLogger("torch.utils.cpp_extension")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        # torch before 2.8 prints it instead ("No CUDA runtime is found").
        with contextlib.redirect_stderr(io.StringIO()):
            from torch.utils import cpp_extension
    finally:
        log.setLevel(level)
    return cpp_extension


def _find_cxx() -> str:
    cxx = os.environ.get("CXX", "c++")
    path = shutil.which(cxx.split()[0])
    if not path:
        raise ShimBuildError(f"building gpumem's torch shim needs a C++ compiler; {cxx!r} was "
                             "not found (install g++, or set CXX)")
    return path


def _find_ninja() -> str:
    path = shutil.which("ninja")
    if not path or not _cpp_extension().is_ninja_available():
        raise ShimBuildError("building gpumem's torch shim needs ninja, which was not found "
                             "(pip install ninja)")
    return path


def _check_tools() -> None:
    _find_cxx()
    _find_ninja()


@contextmanager
def _locked(d: Path) -> Iterator[None]:
    try:
        d.mkdir(parents=True, exist_ok=True)
        f = open(d / ".gpumem-build.lock", "a+")
    except OSError as e:
        raise ShimBuildError(f"cannot use {d} for gpumem's torch shim ({e.strerror}); set "
                             "GPUMEM_CACHE_DIR to a writable directory") from None
    with f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _write_json(path: Path, data: dict) -> None:
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", dir=str(path.parent))
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=1, sort_keys=True)
    os.replace(tmp, path)


def _compile(d: Path, info: dict[str, Any], verbose: bool, module: Module = SHIM):
    torch = _torch()
    _check_tools()
    cpp_extension = _cpp_extension()
    src = source_dir()
    lib_dir = os.path.join(os.path.dirname(torch.__file__), "lib")
    t0 = time.monotonic()
    # Once per torch version: the one line a first install() prints.
    print(f"gpumem: building its {module.what} for torch "
          f"{torch.__version__} (once per torch version, about {module.seconds} s) into {d} "
          "(GPUMEM_CACHE_DIR moves the cache)", file=sys.stderr, flush=True)
    # One translation unit that includes every source: torch's headers, most
    # of the work, are compiled once instead of once per file (less than half
    # the CPU time of separate files). -O1: the shim only forwards to the core
    # (gpumem._C, built with -O2), and -O2 cost about 1.5 s more CPU here
    # with no difference in benchmarks/torch_side_by_side.py.
    unity = d / (module.name + "_all.cpp")
    unity.write_text("".join(f'#include "{src / s}"\n' for s in module.sources
                             if s.endswith(".cpp")))
    try:
        loaded = cpp_extension.load(
            name=module.name,
            sources=[str(unity)],
            extra_cflags=["-O1", "-fvisibility=hidden", "-Wall", "-Wno-unused-parameter",
                          # as torch's CUDA builds are compiled: before 2.9,
                          # CUDAAllocatorConfig::expandable_segments() is false without it
                          "-DPYTORCH_C10_DRIVER_API_SUPPORTED",
                          # ninja runs the command through sh: quote for it.
                          "-DGM_TORCH_VERSION='\"" + torch.__version__.replace("'", "") + "\"'"],
            extra_include_paths=[_cuda_include()],
            extra_ldflags=[f"-L{lib_dir}", *module.ldflags],
            build_directory=str(d),
            with_cuda=False,
            verbose=verbose,
        )
    except (RuntimeError, OSError, ImportError) as e:
        raise ShimBuildError(_failed_build(d, torch.__version__, str(e), module)) from e
    record = dict(info)
    record.update(built_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                  build_seconds=round(time.monotonic() - t0, 1),
                  compiler=os.environ.get("CXX", "c++"))
    _write_json(_info_file(d, module), record)
    return loaded


def _failed_build(d: Path, version: str, output: str, module: Module = SHIM) -> str:
    """Keep a failed build's full output in d/build.log; the one line saying so
    (with the compiler's first error, when there is one)."""
    log = d / "build.log"
    try:
        log.write_text(output + "\n")
        where = f"the full log is in {log}"
    except OSError as e:
        where = f"its log could not be written to {log} ({e.strerror})"
    first = next((line.strip() for line in output.splitlines() if "error:" in line), "")
    if len(first) > 200:
        first = first[:197] + "..."
    return (f"building gpumem's {module.what} for torch {version} failed"
            + (f" ({first})" if first else "") + f"; {where}")


def prerequisites() -> list[tuple[str, bool, str]]:
    """What a build of the shim needs, each checked: (what, found, where or why not)."""
    items = []
    for what, find in (("PyTorch", lambda: f"torch {_torch().__version__}"),
                       ("shim sources", lambda: str(source_dir())),
                       ("C++ compiler", _find_cxx), ("ninja", _find_ninja),
                       ("CUDA runtime headers", _cuda_include)):
        try:
            items.append((what, True, find()))
        except ShimBuildError as e:
            items.append((what, False, str(e)))
    return items


def missing_prerequisite() -> str | None:
    """Why the shim cannot be built here (no torch, compiler, ninja, headers,
    sources), or None when everything a build needs is present."""
    return next((why for _, found, why in prerequisites() if not found), None)


def _build_call(module: Module, force: bool = False) -> str:
    """The call that builds ``module``, for messages."""
    args = ([] if module is SHIM else ["module=shim_build.RECORD_FUNCTION"]) + \
        (["force=True"] if force else [])
    return f"gpumem.pytorch.shim_build.build({', '.join(args)})"


def _import(d: Path, module: Module = SHIM):
    mod = sys.modules.get(module.name)
    if mod is not None:
        return mod
    path = str(_library(d, module))
    loader = importlib.machinery.ExtensionFileLoader(module.name, path)
    spec = importlib.util.spec_from_file_location(module.name, path, loader=loader)
    mod = importlib.util.module_from_spec(spec)
    try:
        loader.exec_module(mod)
    except ImportError as e:
        raise ShimBuildError(f"gpumem's {module.what} {path} did not load: {e}; rebuild "
                             f"it with {_build_call(module, force=True)}") from e
    sys.modules[module.name] = mod
    return mod


def _verify(mod, module: Module = SHIM) -> None:
    torch = _torch()
    info = mod.build_info()
    core = _core_api_version() if module.uses_core else None
    if info["torch_version"] != torch.__version__ or info.get("core_api_version") != core:
        raise ShimBuildError(
            f"gpumem's {module.what} reports torch {info['torch_version']} / core API "
            f"{info.get('core_api_version')}, but this process runs torch {torch.__version__} / "
            f"core API {core}; rebuild it with {_build_call(module, force=True)}")


def build(verbose: bool = False, force: bool = False, module: Module = SHIM) -> Path:
    """Build the shim (or ``module``) for the running torch unless an
    up-to-date one is cached.

    Returns the path of the built library.  force=True rebuilds regardless.
    Raises ShimBuildError with the reason when it cannot be built.
    """
    info = expected_info(module=module)
    d = cache_dir(info, module)
    with _locked(d):
        ok, _ = check(d, module)
        if force or not ok:
            if force:
                for p in (_info_file(d, module), _library(d, module)):
                    p.unlink(missing_ok=True)
            mod = _compile(d, info, verbose, module)
            sys.modules.setdefault(module.name, mod)
    return _library(d, module)


def loaded(module: Module = SHIM):
    """The shim (or ``module``) if this process has imported it, else None."""
    return sys.modules.get(module.name)


def load(allow_build: bool | None = None, verbose: bool = False, module: Module = SHIM):
    """Import the shim (or ``module``) for this process, building it first if
    needed and allowed.

    allow_build defaults to True unless GPUMEM_SHIM_BUILD=0.  A cached module
    built for anything else (see check()) is rebuilt, or refused when
    building is not allowed.
    """
    mod = sys.modules.get(module.name)
    if mod is not None:
        return mod
    if allow_build is None:
        allow_build = os.environ.get("GPUMEM_SHIM_BUILD", "1").strip() not in ("0", "false", "no")
    with _load_lock:
        info = expected_info(module=module)
        d = cache_dir(info, module)
        ok, why = check(d, module)
        if not ok:
            if not allow_build:
                who = "install()" if module is SHIM else "recording memory history"
                raise ShimBuildError(f"{why}; gpumem will not load it. Build it with "
                                     f"{_build_call(module)} or gpumem build-shim "
                                     f"(GPUMEM_SHIM_BUILD=0 is set, so {who} does not build it "
                                     "by itself)")
            build(verbose=verbose, module=module)
        mod = _import(d, module)
        _verify(mod, module)
    return mod


def _add_cli_args(p) -> None:
    p.add_argument("--force", action="store_true",
                   help="rebuild even if the cached modules are current")
    p.add_argument("-v", "--verbose", action="store_true", help="show the compiler's output")
    p.add_argument("--check", action="store_true",
                   help="only report whether the cached modules match this torch (exit 1 if not)")


def _run_cli(args) -> int:
    """`python -m gpumem build-shim`: one line of output per module (the
    shim's first), one line per error."""
    try:
        if args.check:
            results = [check(module=m) for m in MODULES]
            for m, (ok, why) in zip(MODULES, results):
                state = "up to date" if ok else "not usable: " + why
                print(f"gpumem: {_noun(m)} in {cache_dir(module=m)} is {state}")
            return 0 if all(ok for ok, _ in results) else 1
        for m in MODULES:
            t0 = time.monotonic()
            path = build(verbose=args.verbose, force=args.force, module=m)
            print(f"{path} ({time.monotonic() - t0:.1f} s; its {m.what}: {m.purpose})")
    except ShimBuildError as e:
        print(f"gpumem: error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    return 0


#: (help, add_arguments, run) for gpumem.cli.COMMANDS["build-shim"].
CLI_COMMAND = ("build gpumem's torch shim and its record_function module (memory history's "
               "annotations) for the installed torch into its cache (reused while torch and the "
               "sources are unchanged)", _add_cli_args, _run_cli)


# python -m gpumem.pytorch.shim_build [-v] [--force] [--check] [--prerequisites]
if __name__ == "__main__":
    if "--prerequisites" in sys.argv:  # exit 3 and say why if a build is impossible here
        why = missing_prerequisite()
        if why:
            print(why)
            sys.exit(3)
        sys.exit(0)
    import argparse
    _parser = argparse.ArgumentParser(prog="python -m gpumem.pytorch.shim_build")
    _add_cli_args(_parser)
    sys.exit(_run_cli(_parser.parse_args()))
