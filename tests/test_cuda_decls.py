"""csrc/device/cuda_decls.h agrees with NVIDIA's cuda.h.

Without the CUDA toolkit the driver backend takes its types from
cuda_decls.h; with it, from cuda.h. The two must give the same enumerator
values, type sizes and struct layouts, or the backend built on a machine
without the toolkit would pass the driver garbage. A program printing all of
them is compiled against each header and the outputs compared. Skipped
where cuda.h is not installed.
"""

import glob
import os
import re
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DECLS = os.path.join(ROOT, "csrc", "device", "cuda_decls.h")
CC = shutil.which(os.environ.get("CC", "cc").split()[0])


def _cuda_include():
    roots = [os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "include")]
    roots += sorted(glob.glob("/usr/local/cuda-*/include"), reverse=True)
    return next((r for r in roots if os.path.isfile(os.path.join(r, "cuda.h"))), None)


CUDA_INCLUDE = _cuda_include()
pytestmark = [pytest.mark.skipif(CC is None, reason="no C compiler"),
              pytest.mark.skipif(CUDA_INCLUDE is None, reason="cuda.h is not installed")]

TYPES = ("CUresult", "CUdevice", "CUdeviceptr", "CUmemGenericAllocationHandle", "CUcontext",
         "CUstream", "CUevent", "CUdevice_attribute", "CUmemAllocationType",
         "CUmemAllocationHandleType", "CUmemLocationType", "CUmemAccess_flags",
         "CUmemAllocationGranularity_flags", "CUmemLocation", "CUmemAllocationProp",
         "CUmemAccessDesc", "CUstreamCaptureMode")
FIELDS = (("CUmemLocation", "type"), ("CUmemLocation", "id"),
          ("CUmemAllocationProp", "type"), ("CUmemAllocationProp", "requestedHandleTypes"),
          ("CUmemAllocationProp", "location"), ("CUmemAllocationProp", "win32HandleMetaData"),
          ("CUmemAllocationProp", "allocFlags"),
          ("CUmemAllocationProp", "allocFlags.compressionType"),
          ("CUmemAllocationProp", "allocFlags.gpuDirectRDMACapable"),
          ("CUmemAllocationProp", "allocFlags.usage"),
          ("CUmemAccessDesc", "location"), ("CUmemAccessDesc", "flags"))


def _enumerators():
    with open(DECLS, encoding="utf-8") as f:
        return re.findall(r"\b((?:CUDA|CU)_[A-Z0-9_]+)\s*=", f.read())


def _run(tmp_path, name, defs):
    lines = ["#include <stdio.h>", "#include <stddef.h>", "#ifdef USE_CUDA_H",
             "#include <cuda.h>", "#else", '#include "device/cuda_decls.h"', "#endif",
             "int main(void) {"]
    lines += [f'printf("{n} %lld\\n", (long long){n});' for n in _enumerators()]
    lines += [f'printf("sizeof {t} %zu\\n", sizeof({t}));' for t in TYPES]
    lines += [f'printf("offsetof {t}.{f} %zu\\n", offsetof({t}, {f}));' for t, f in FIELDS]
    lines += ["return 0; }"]
    src = tmp_path / "layout.c"
    src.write_text("\n".join(lines) + "\n")
    exe = tmp_path / name
    proc = subprocess.run([CC, "-Wall", "-I", os.path.join(ROOT, "csrc"), *defs, str(src), "-o",
                           str(exe)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout


def test_fallback_declarations_match_cuda_h(tmp_path):
    assert len(_enumerators()) >= 20
    ours = _run(tmp_path, "ours", [])
    nvidia = _run(tmp_path, "nvidia", ["-DUSE_CUDA_H", "-I", CUDA_INCLUDE])
    assert ours == nvidia


def test_every_declared_function_is_in_cuda_h():
    with open(DECLS, encoding="utf-8") as f:
        ours = re.findall(r"^CUresult (cu\w+)\(", f.read(), re.M)
    with open(os.path.join(CUDA_INCLUDE, "cuda.h"), encoding="utf-8", errors="replace") as f:
        nvidia = f.read()
    assert len(ours) >= 25
    missing = [n for n in ours if not re.search(r"\b%s\b" % n, nvidia)]
    assert not missing, f"not declared by cuda.h: {missing}"
