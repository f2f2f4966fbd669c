"""Build script for gpumem's C extension, gpumem._C.

Project metadata lives in pyproject.toml; this file only describes the
extension. It compiles every .c file of the layers csrc/layers.py names for
the extension (base, device, core, history, python; globbed, so new files are
picked up). No CUDA toolkit and no
torch are needed: the CUDA backend loads the driver at run time.

Build knobs (environment variables):
  GM_DEBUG=0..3   compile with -DGM_DEBUG=N (1: cheap asserts, 3: check
                  every structure after every operation)
  GM_SANITIZE=1   AddressSanitizer + UndefinedBehaviorSanitizer build; load
                  it with LD_PRELOAD=$(cc -print-file-name=libasan.so)
"""

import glob
import importlib.util
import os
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))


def _relative_glob(pattern):
    # setuptools wants source paths relative to the project root.
    return sorted(
        os.path.relpath(p, HERE).replace(os.sep, "/")
        for p in glob.glob(os.path.join(HERE, pattern), recursive=True)
    )


def _env_int(name, lo, hi):
    raw = os.environ.get(name, "").strip()
    if not raw:
        return None
    try:
        value = int(raw)
    except ValueError:
        value = None
    if value is None or not lo <= value <= hi:
        sys.exit(f"setup.py: {name}={raw!r} is invalid; use an integer from {lo} to {hi}.")
    return value


def _cuda_include():
    """The CUDA toolkit's include dir if it has cuda.h, else None.

    With it, the driver backend takes its types and prototypes from NVIDIA's
    cuda.h; without it, from csrc/device/cuda_decls.h. GM_CUDA_INCLUDE=DIR
    picks a directory; GM_CUDA_INCLUDE=none forces the project's own
    declarations.
    """
    raw = os.environ.get("GM_CUDA_INCLUDE", "").strip()
    if raw.lower() == "none":
        return None
    candidates = [raw] if raw else []
    candidates += [os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "include")]
    candidates += sorted(glob.glob("/usr/local/cuda-*/include"), reverse=True)
    for inc in candidates:
        if inc and os.path.isfile(os.path.join(inc, "cuda.h")):
            return inc
    if raw:
        sys.exit(f"setup.py: GM_CUDA_INCLUDE={raw!r} has no cuda.h; fix the path or use 'none'.")
    return None


def _load_by_path(name, path):
    spec = importlib.util.spec_from_file_location(name, os.path.join(HERE, path))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _extension():
    layers = _load_by_path("gpumem_layers", "csrc/layers.py")
    rel = lambda paths: [os.path.relpath(p, HERE).replace(os.sep, "/") for p in paths]
    sources = rel(layers.sources(*layers.EXTENSION_LAYERS))
    headers = rel(layers.sources(*layers.EXTENSION_LAYERS, ext=".h"))

    compile_args = [
        "-std=c11",
        "-O2",
        "-fvisibility=hidden",
        "-Wall",
        "-Wextra",
        "-Wno-unused-parameter",
    ]
    link_args = []
    macros = [("_GNU_SOURCE", None)]

    include_dirs = ["csrc"]
    cuda_inc = _cuda_include()
    if cuda_inc:
        macros.append(("GM_HAVE_CUDA_H", None))
        # -idirafter: the toolkit's headers never shadow the system's.
        compile_args += ["-idirafter", cuda_inc]

    debug = _env_int("GM_DEBUG", 0, 3)
    if debug is not None:
        macros.append(("GM_DEBUG", str(debug)))

    if _env_int("GM_SANITIZE", 0, 1):
        san = [
            "-fsanitize=address,undefined",
            "-fno-omit-frame-pointer",
            "-fno-sanitize-recover=undefined",
        ]
        # Placed after -O2 so that -O1 wins.
        compile_args += san + ["-O1", "-g"]
        link_args += san

    return Extension(
        "gpumem._C",
        sources=sources,
        depends=headers,
        include_dirs=include_dirs,
        define_macros=macros,
        extra_compile_args=compile_args,
        extra_link_args=link_args,
        libraries=["pthread", "dl", "m"],
    )


def _load_sim_build():
    return _load_by_path("gpumem_sim_build", "simgpu/build.py")


class BuildWithSimulator(build_ext):
    """build_ext, then the simulated GPU's fake CUDA libraries (simgpu/),
    and (for wheels) the torch shim's sources; see run()."""

    def _ship_shim_sources(self, dest):
        """A wheel has no csrc/: the torch shim, built on the user's machine
        against their torch at the first gpumem.install(), needs its C++
        sources and the C headers it includes (gpumem/pytorch/shim_build.py)."""
        import shutil
        files = _relative_glob("csrc/torch/*.cpp") + _relative_glob("csrc/**/*.h")
        for rel in files:
            target = os.path.join(dest, os.path.relpath(rel, "csrc"))
            os.makedirs(os.path.dirname(target), exist_ok=True)
            shutil.copyfile(os.path.join(HERE, rel), target)

    """build_ext, then the simulated GPU's fake CUDA libraries (simgpu/).

    They are separate shared libraries with NVIDIA's sonames, loaded only by
    gpumem.sim; they land in gpumem/sim/_lib/cuda12/ and _lib/cuda13/, one
    folder per CUDA major version PyTorch is built for (in the source tree
    for editable and in-place builds, in build_lib for wheels). gpumem works without
    them, so a failure warns instead of failing the install.
    """

    def run(self):
        super().run()
        pkg = os.path.join(HERE, "gpumem") if self.inplace else os.path.join(self.build_lib, "gpumem")
        if not self.inplace:
            self._ship_shim_sources(os.path.join(pkg, "_csrc"))
        out = os.path.join(pkg, "sim", "_lib")
        work = os.path.join(self.build_temp, "gpumem_sim")
        try:
            _load_sim_build().build_sim_tree(out, work_dir=work)
        except Exception as e:  # noqa: BLE001 - optional component
            print(f"setup.py: warning: the simulated GPU was not built ({e}); "
                  "gpumem works without it, but gpumem.sim will build it on first use.",
                  file=sys.stderr)


setup(ext_modules=[_extension()], cmdclass={"build_ext": BuildWithSimulator})
