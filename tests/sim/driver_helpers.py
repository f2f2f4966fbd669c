"""The fake CUDA driver (simgpu/driver, libcuda.so.1) for the tests of
tests/sim/: its build wrapper, and running a scenario against it in a fresh
interpreter (the fake reads its configuration once, at cuInit, and keeps
process-wide state). No tests here; the fixtures are in conftest.py.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

FAKE_DIR = Path(__file__).resolve().parent / "fakecuda"  # build.py wrapper, smoke.c
# The driver's sources ship with gpumem's simulated GPU (simgpu/README.md).
DRIVER_DIR = Path(__file__).resolve().parents[2] / "simgpu" / "driver"

_spec = importlib.util.spec_from_file_location("fakecuda_build", FAKE_DIR / "build.py")
fcbuild = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fcbuild)

CC = shlex.split(os.environ.get("CC", "cc"))
needs_cc = pytest.mark.skipif(shutil.which(CC[0]) is None, reason="no C compiler")

CUDA_INCLUDE = fcbuild.find_cuda_include() if shutil.which(CC[0]) else None

# --------------------------------------------------------------------------
# running scenarios in a subprocess

PRELUDE = r'''
import ctypes as C, json, os, sys, threading
L = C.CDLL(os.environ["FAKECUDA_LIB"])
u64, sz, vp, ci, cu = C.c_ulonglong, C.c_size_t, C.c_void_p, C.c_int, C.c_uint
P = C.POINTER

SUCCESS, INVALID_VALUE, OOM, NOT_INITIALIZED = 0, 1, 2, 3
NO_DEVICE, INVALID_DEVICE, INVALID_CONTEXT = 100, 101, 201
INVALID_HANDLE, NOT_READY, CONTEXT_IS_DESTROYED = 400, 600, 709
NOT_SUPPORTED, UNKNOWN = 801, 999
LEGACY, PER_THREAD = 1, 2
MiB, GiB = 1 << 20, 1 << 30

class Prop(C.Structure):
    _fields_ = [("type", ci), ("requestedHandleTypes", ci), ("loc_type", ci), ("loc_id", ci),
                ("win32HandleMetaData", vp), ("compressionType", C.c_ubyte),
                ("gpuDirectRDMACapable", C.c_ubyte), ("usage", C.c_ushort),
                ("reserved", C.c_ubyte * 4)]

class Access(C.Structure):
    _fields_ = [("loc_type", ci), ("loc_id", ci), ("flags", ci)]

class Uuid(C.Structure):
    _fields_ = [("bytes", C.c_char * 16)]

def _proto(name, *args):
    f = getattr(L, name)
    f.argtypes = list(args)
    f.restype = ci
    return f

for _n, _a in {
    "cuInit": [cu], "cuDriverGetVersion": [P(ci)], "cuDeviceGetCount": [P(ci)],
    "cuDeviceGet": [P(ci), ci], "cuDeviceGetName": [C.c_char_p, ci, ci],
    "cuDeviceGetAttribute": [P(ci), ci, ci], "cuDeviceTotalMem_v2": [P(sz), ci],
    "cuDeviceGetUuid": [P(Uuid), ci], "cuDeviceGetUuid_v2": [P(Uuid), ci],
    "cuDevicePrimaryCtxRetain": [P(vp), ci], "cuDevicePrimaryCtxRelease": [ci],
    "cuDevicePrimaryCtxRelease_v2": [ci], "cuDevicePrimaryCtxGetState": [ci, P(cu), P(ci)],
    "cuDevicePrimaryCtxReset": [ci], "cuDevicePrimaryCtxReset_v2": [ci],
    "cuCtxGetCurrent": [P(vp)], "cuCtxSetCurrent": [vp], "cuCtxPushCurrent": [vp],
    "cuCtxPushCurrent_v2": [vp], "cuCtxPopCurrent": [P(vp)], "cuCtxPopCurrent_v2": [P(vp)],
    "cuCtxGetDevice": [P(ci)], "cuCtxSynchronize": [],
    "cuMemAlloc_v2": [P(u64), sz], "cuMemFree_v2": [u64], "cuMemGetInfo_v2": [P(sz), P(sz)],
    "cuMemcpyHtoD_v2": [u64, vp, sz], "cuMemcpyDtoH_v2": [vp, u64, sz],
    "cuMemsetD8_v2": [u64, C.c_ubyte, sz],
    "cuStreamCreate": [P(vp), cu], "cuStreamDestroy": [vp], "cuStreamDestroy_v2": [vp],
    "cuStreamSynchronize": [vp], "cuStreamQuery": [vp],
    "cuEventCreate": [P(vp), cu], "cuEventDestroy": [vp], "cuEventDestroy_v2": [vp],
    "cuEventRecord": [vp, vp], "cuEventQuery": [vp], "cuEventSynchronize": [vp],
    "cuMemAddressReserve": [P(u64), sz, sz, u64, u64], "cuMemAddressFree": [u64, sz],
    "cuMemCreate": [P(u64), sz, P(Prop), u64], "cuMemRelease": [u64],
    "cuMemMap": [u64, sz, sz, u64, u64], "cuMemUnmap": [u64, sz],
    "cuMemSetAccess": [u64, sz, P(Access), sz],
    "cuMemGetAllocationGranularity": [P(sz), P(Prop), ci],
    "cuGetErrorName": [ci, P(C.c_char_p)], "cuGetErrorString": [ci, P(C.c_char_p)],
    "fakecuda_report_json": [C.c_char_p, sz], "fakecuda_set_fail": [C.c_char_p],
    "fakecuda_configure": [C.c_char_p],
}.items():
    globals()[_n] = _proto(_n, *_a)
fakecuda_query = L.fakecuda_query
fakecuda_query.argtypes = [C.c_char_p, ci]
fakecuda_query.restype = C.c_longlong
L.fakecuda_set_event_mode.argtypes = [C.c_char_p]
L.fakecuda_set_event_mode.restype = None
L.fakecuda_complete_events.restype = None
L.fakecuda_reset_counters.restype = None

def name(r):
    s = C.c_char_p()
    return s.value.decode() if cuGetErrorName(r, C.byref(s)) == 0 else f"code {r}"

def ok(r, want=SUCCESS, what=""):
    if r != want:
        raise AssertionError(f"{what}: got {r} {name(r)}, want {want} {name(want)}")

def report():
    n = fakecuda_report_json(None, 0)
    buf = C.create_string_buffer(n + 1)
    assert fakecuda_report_json(buf, n + 1) == n
    return json.loads(buf.value)

def dev0():
    return report()["devices"][0]

def init(dev=0):
    ok(cuInit(0), what="cuInit")
    ctx = vp()
    ok(cuDevicePrimaryCtxRetain(C.byref(ctx), dev), what="retain")
    ok(cuCtxSetCurrent(ctx), what="set current")
    return ctx

def alloc(n):
    p = u64()
    ok(cuMemAlloc_v2(C.byref(p), n), what=f"cuMemAlloc({n})")
    return p.value

def prop(dev=0, **kw):
    p = Prop(type=1, loc_type=1, loc_id=dev)
    for k, v in kw.items():
        setattr(p, k, v)
    return p

def granularity(dev=0):
    g = sz()
    ok(cuMemGetAllocationGranularity(C.byref(g), C.byref(prop(dev)), 0))
    return g.value

def reserve(size, align=0):
    p = u64()
    ok(cuMemAddressReserve(C.byref(p), size, align, 0, 0), what="reserve")
    return p.value

def create(size, dev=0):
    h = u64()
    ok(cuMemCreate(C.byref(h), size, C.byref(prop(dev)), 0), what="create")
    return h.value

def set_rw(ptr, size, dev=0, flags=3):
    a = Access(loc_type=1, loc_id=dev, flags=flags)
    return cuMemSetAccess(ptr, size, C.byref(a), 1)

def stream(flags=0):
    s = vp()
    ok(cuStreamCreate(C.byref(s), flags), what="cuStreamCreate")
    return s

def event(flags=2):
    e = vp()
    ok(cuEventCreate(C.byref(e), flags), what="cuEventCreate")
    return e

def put(ptr, data):
    ok(cuMemcpyHtoD_v2(ptr, data, len(data)), what="HtoD")

def get(ptr, n):
    b = C.create_string_buffer(n)
    ok(cuMemcpyDtoH_v2(b, ptr, n), what="DtoH")
    return b.raw

def uuid(dev, fn=None):
    u = Uuid()
    ok((fn or cuDeviceGetUuid_v2)(C.byref(u), dev))
    return C.string_at(C.addressof(u), 16)

def in_thread(fn):
    out = {}
    def body():
        try:
            out["value"] = fn()
        except BaseException as exc:  # re-raised in the caller
            out["error"] = exc
    t = threading.Thread(target=body)
    t.start()
    t.join()
    if "error" in out:
        raise out["error"]
    return out.get("value")
'''


def run(lib: Path, body: str, env: dict | None = None, expect_rc: int | None = 0, cwd=None):
    """Run PRELUDE + body in a fresh interpreter; return the CompletedProcess."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("GPUMEM_FAKECUDA_")}
    full_env["FAKECUDA_LIB"] = str(lib)
    full_env.update(env or {})
    # A real file, so that tracebacks show the failing line of the scenario.
    with tempfile.NamedTemporaryFile("w", suffix="_fakecuda_scenario.py", delete=False) as f:
        f.write(PRELUDE + "\n# ---- scenario ----\n" + textwrap.dedent(body))
    try:
        proc = subprocess.run([sys.executable, f.name], capture_output=True, text=True,
                              env=full_env, timeout=120, cwd=cwd)
    finally:
        os.unlink(f.name)
    if expect_rc is not None and proc.returncode != expect_rc:
        raise AssertionError(
            f"scenario exited {proc.returncode} (want {expect_rc})\n"
            f"--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"
        )
    return proc


def run_json(lib: Path, body: str, env: dict | None = None):
    """Run a scenario that prints one JSON document last; return it."""
    proc = run(lib, body, env)
    return json.loads(proc.stdout.strip().splitlines()[-1])
