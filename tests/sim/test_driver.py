"""Tests of the fake CUDA driver in tests/sim/fakecuda (libcuda.so.1).

The fake reads its configuration once, at cuInit, and keeps process-wide
state, so every scenario runs in a fresh Python subprocess that loads the
library with ctypes (see ``run``). Each test runs twice: with the library
compiled against NVIDIA's cuda.h (when installed) and against the fallback
cuda_min.h. Skipped only when there is no C compiler.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from driver_helpers import (CC, CUDA_INCLUDE, DRIVER_DIR, FAKE_DIR, fcbuild, needs_cc, run,
                            run_json)

pytestmark = needs_cc

CONTROL_FUNCS = {
    "fakecuda_report_json",
    "fakecuda_complete_events",
    "fakecuda_set_event_mode",
    "fakecuda_set_fail",
    "fakecuda_reset_counters",
    "fakecuda_device_memory",
    "fakecuda_configure",
    "fakecuda_query",
    "fakecuda_launch",
    "fakecuda_block_handed_out",
}


def _fc_funcs() -> list[str]:
    text = (DRIVER_DIR / "fakecuda_internal.h").read_text()
    block = re.search(r"#define FC_FUNCS\(X\)(.*?)\n\n", text, re.S).group(1)
    return re.findall(r"X\((\w+)\)", block)


CU_FUNCS = _fc_funcs()

# What the library must export: the brief's list, spelled out independently
# of FC_FUNCS so that a name dropped from both still fails the test.
EXPECTED_CU = {
    "cuInit", "cuDriverGetVersion", "cuDeviceGetCount", "cuDeviceGet", "cuDeviceGetName",
    "cuDeviceGetAttribute", "cuDeviceTotalMem_v2", "cuDeviceGetUuid", "cuDeviceGetUuid_v2",
    "cuDevicePrimaryCtxRetain", "cuDevicePrimaryCtxRelease", "cuDevicePrimaryCtxRelease_v2",
    "cuDevicePrimaryCtxGetState", "cuDevicePrimaryCtxReset", "cuDevicePrimaryCtxReset_v2",
    "cuCtxGetCurrent", "cuCtxSetCurrent", "cuCtxPushCurrent", "cuCtxPushCurrent_v2",
    "cuCtxPopCurrent", "cuCtxPopCurrent_v2", "cuCtxGetDevice", "cuCtxSynchronize",
    "cuMemAlloc_v2", "cuMemFree_v2", "cuMemGetInfo_v2", "cuMemcpyHtoD_v2", "cuMemcpyDtoH_v2",
    "cuMemsetD8_v2", "cuStreamCreate", "cuStreamDestroy", "cuStreamDestroy_v2",
    "cuStreamSynchronize", "cuStreamQuery", "cuEventCreate", "cuEventDestroy",
    "cuEventDestroy_v2", "cuEventRecord", "cuEventQuery", "cuEventSynchronize",
    "cuMemAddressReserve", "cuMemAddressFree", "cuMemCreate", "cuMemRelease", "cuMemMap",
    "cuMemUnmap", "cuMemSetAccess", "cuMemGetAllocationGranularity", "cuGetErrorName",
    "cuGetErrorString",
    # what the simulator's fake CUDA runtime builds on (simgpu/cudart)
    "cuMemcpy", "cuMemcpyAsync", "cuMemcpyDtoD_v2", "cuMemcpyHtoDAsync_v2",
    "cuMemcpyDtoHAsync_v2", "cuMemcpyDtoDAsync_v2", "cuMemcpyPeer", "cuMemcpyPeerAsync",
    "cuMemsetD8Async", "cuMemsetD32_v2", "cuMemsetD32Async", "cuPointerGetAttribute",
    "cuMemGetAddressRange_v2", "cuStreamWriteValue32_v2", "cuStreamWriteValue32",
    "cuMemGetAllocationPropertiesFromHandle",
    "cuCtxGetStreamPriorityRange", "cuStreamCreateWithPriority", "cuStreamGetPriority",
    "cuStreamGetFlags", "cuStreamGetId", "cuStreamGetDevice", "cuStreamWaitEvent",
    "cuEventRecordWithFlags", "cuEventElapsedTime_v2",
    # imported by torch/lib/libcaffe2_nvrtc.so (must exist for it to load;
    # simulated in fakecuda_module.c, _func.c, _launch.c, _tensormap.c)
    "cuModuleLoad", "cuModuleLoadData", "cuModuleLoadDataEx", "cuModuleUnload",
    "cuModuleGetFunction", "cuLaunchKernel", "cuLaunchCooperativeKernel", "cuLinkCreate_v2",
    "cuLinkAddData_v2", "cuLinkComplete", "cuFuncGetAttribute", "cuFuncSetAttribute",
    "cuFuncSetCacheConfig", "cuOccupancyMaxActiveBlocksPerMultiprocessor",
    "cuTensorMapEncodeTiled",
    # Triton's launcher (triton/backends/nvidia/driver.c) and Inductor
    "cuFuncGetName", "cuCtxSetLimit", "cuCtxGetLimit", "cuLaunchKernelEx",
    "cuOccupancyMaxActiveClusters", "cuTensorMapEncodeIm2col",
    # in torch's DriverAPI list of required driver functions
    "cuMemExportToShareableHandle", "cuMemImportFromShareableHandle",
    "cuMemRetainAllocationHandle",
    # stream capture and CUDA graphs (torch.cuda.graph, cudagraph trees)
    "cuStreamBeginCapture_v2", "cuStreamEndCapture", "cuStreamIsCapturing",
    "cuStreamGetCaptureInfo_v2", "cuStreamGetCaptureInfo_v3", "cuThreadExchangeStreamCaptureMode",
    "cuLaunchHostFunc", "cuGraphCreate", "cuGraphDestroy", "cuGraphGetNodes",
    "cuGraphNodeGetDependencies_v2", "cuGraphInstantiateWithFlags", "cuGraphInstantiateWithParams",
    "cuGraphUpload", "cuGraphLaunch", "cuGraphExecDestroy", "cuGraphExecUpdate_v2",
    "cuGraphDebugDotPrint",
}

VARIANTS = ["cuda_h", "fallback"]


# The fast tier builds the driver once, against gpumem's own declarations;
# the full tier also against NVIDIA's cuda.h.
@pytest.fixture(params=[pytest.param(v, marks=[pytest.mark.slow] if v == "cuda_h" else [])
                        for v in VARIANTS])
def lib(request, fakecuda) -> Path:
    return fakecuda(request.param)


# --------------------------------------------------------------------------
# build, exports and loader hygiene


@pytest.mark.slow
def test_build_has_no_warnings(lib):
    info = json.loads((lib.parent / (lib.name + ".buildinfo")).read_text())
    assert info["warnings"].strip() == "", info["warnings"]


@pytest.mark.slow
def test_build_is_cached_and_rebuilt_on_change(tmp_path):
    src = tmp_path / "src"
    shutil.copytree(DRIVER_DIR, src)
    build_libcuda = fcbuild._sim.build_libcuda
    out = tmp_path / "out"
    lib = build_libcuda(out, cuda_include=None, src_dir=src)
    first = lib.stat().st_mtime_ns
    assert build_libcuda(out, cuda_include=None, src_dir=src).stat().st_mtime_ns == first
    (src / "fakecuda_sync.c").write_text((src / "fakecuda_sync.c").read_text() + "\n/* x */\n")
    os.utime(lib, ns=(first - 10**9, first - 10**9))
    assert build_libcuda(out, cuda_include=None, src_dir=src).stat().st_mtime_ns != first - 10**9
    # a compile error is reported with the compiler's output
    (src / "fakecuda_sync.c").write_text("this is not C\n")
    with pytest.raises(fcbuild.BuildError, match="building libcuda.so.1 failed"):
        build_libcuda(out, cuda_include=None, src_dir=src)


@pytest.mark.slow
def test_build_cli(tmp_path):
    proc = subprocess.run([sys.executable, str(FAKE_DIR / "build.py"), str(tmp_path), "--no-cuda-h"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert Path(proc.stdout.strip()) == tmp_path / "libcuda.so.1"
    assert (tmp_path / "libcuda.so.1").is_file()


def _dynsyms(lib: Path, *flags: str) -> set[str]:
    if shutil.which("nm") is None:
        pytest.skip("nm not installed")
    out = subprocess.run(["nm", "-D", *flags, str(lib)], capture_output=True, text=True, check=True)
    return {line.split()[-1] for line in out.stdout.splitlines() if line.strip()}


@pytest.mark.slow  # fast tier: one test of this kind is enough (README, Test)
def test_exports_exactly_the_driver_subset(lib):
    defined = _dynsyms(lib, "--defined-only")
    assert defined == EXPECTED_CU | CONTROL_FUNCS
    assert set(CU_FUNCS) == EXPECTED_CU  # the report's function table matches too
    assert not {s for s in defined if s.startswith(("cuGetProcAddress", "cuGetExportTable"))}
    assert all(s.startswith(("cu", "fakecuda_")) for s in defined)
    # The 32-bit-ABI legacy names (cuMemAlloc etc. take unsigned int sizes) are
    # not exported, and neither is anything outside the list.
    assert not defined & {"cuMemAlloc", "cuMemFree", "cuMemGetInfo", "cuDeviceTotalMem",
                          "cuMemcpyHtoD", "cuMemcpyDtoH", "cuMemsetD8", "cuCtxCreate_v2"}
    map_names = set(re.findall(r"^\s+(\w+);", (DRIVER_DIR / "libcuda.map").read_text(), re.M))
    assert map_names == defined


def test_soname_and_no_version_definitions(lib):
    if shutil.which("readelf") is None:
        pytest.skip("readelf not installed")
    dyn = subprocess.run(["readelf", "-d", str(lib)], capture_output=True, text=True, check=True).stdout
    assert re.search(r"\(SONAME\)\s+Library soname: \[libcuda\.so\.1\]", dyn)
    needed = set(re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", dyn))
    assert needed <= {"libc.so.6", "ld-linux-x86-64.so.2", "libpthread.so.0", "ld-linux-aarch64.so.1"}
    sections = subprocess.run(["readelf", "-S", "-W", str(lib)], capture_output=True, text=True,
                              check=True).stdout
    assert ".gnu.version_d" not in sections  # no version node, see libcuda.map


def _compile_smoke(lib: Path, out: Path, extra: list[str], use_cuda_h: bool) -> Path:
    hdr = ["-DUSE_CUDA_H", "-I", str(CUDA_INCLUDE)] if use_cuda_h else ["-I", str(DRIVER_DIR)]
    cmd = CC + ["-Wall", "-Wextra", "-Werror", *hdr, *extra, str(FAKE_DIR / "smoke.c"), "-o", str(out),
                "-L", str(lib.parent), "-l:libcuda.so.1", "-pthread"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return out


def test_c_program_links_and_runs_without_loader_warnings(lib, tmp_path):
    """A CUDA program written with the un-suffixed names (cuMemAlloc -> the
    _v2 symbol through cuda.h's macros) links and runs silently."""
    use_cuda_h = lib.parent.name == "cuda_h"
    exe = _compile_smoke(lib, tmp_path / "smoke", [], use_cuda_h)
    env = dict(os.environ, LD_LIBRARY_PATH=str(lib.parent))
    env = {k: v for k, v in env.items() if not k.startswith("GPUMEM_FAKECUDA_")}
    proc = subprocess.run([str(exe)], capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    assert proc.stdout.strip() == "smoke ok"


def test_dlopen_prints_nothing(lib, tmp_path):
    src = tmp_path / "dl.c"
    src.write_text(textwrap.dedent("""
        #include <dlfcn.h>
        #include <stdio.h>
        int main(void) {
            void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
            if (!h) { fprintf(stderr, "%s\\n", dlerror()); return 1; }
            int (*init)(unsigned) = (int (*)(unsigned))dlsym(h, "cuInit");
            void *gpa = dlsym(h, "cuGetProcAddress_v2");
            void *get = dlsym(h, "cuGetExportTable");
            if (!init || gpa || get || init(0) != 0) return 2;
            return dlclose(h);
        }
    """))
    exe = tmp_path / "dl"
    proc = subprocess.run(CC + [str(src), "-o", str(exe), "-ldl"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUMEM_FAKECUDA_")}
    env["LD_LIBRARY_PATH"] = str(lib.parent)
    proc = subprocess.run([str(exe)], capture_output=True, text=True, env=env)
    assert (proc.returncode, proc.stderr) == (0, "")


@pytest.mark.skipif(CUDA_INCLUDE is None, reason="cuda.h not installed")
def test_fallback_header_matches_cuda_h(tmp_path):
    """cuda_min.h must agree with NVIDIA's cuda.h on every enumerator it
    defines, on struct layouts and typedef sizes, and on every prototype."""
    min_h = (DRIVER_DIR / "cuda_min.h").read_text()
    enums = [n for n in re.findall(r"^\s+(CUDA_\w+|CU_\w+)\s*=", min_h, re.M)
             if n != "CU_DEVICE_ATTRIBUTE_MAX"]
    assert len(enums) > 150
    lines = ['#include <stdio.h>', '#include <stddef.h>', '#ifdef USE_CUDA_H', '#include <cuda.h>',
             '#else', '#include "cuda_min.h"', '#endif',
             '#define V(x) printf("%s %lld\\n", #x, (long long)(x));',
             '#define S(t) printf("sizeof %s %zu signed %d\\n", #t, sizeof(t), (t)-1 < (t)0);',
             '#define O(t, f) printf("offsetof %s.%s %zu\\n", #t, #f, offsetof(t, f));',
             'int main(void) {']
    lines += [f"V({n})" for n in enums]
    lines += [f"V((long long)(uintptr_t){n})" for n in ("CU_STREAM_LEGACY", "CU_STREAM_PER_THREAD")]
    lines += [f"V(CUDA_VERSION >= 13000)"]
    for t in ("CUdeviceptr", "CUdevice", "CUmemGenericAllocationHandle", "CUresult",
              "CUdevice_attribute", "CUmemAllocationGranularity_flags", "cuuint64_t"):
        lines.append(f"S({t})")
    for t in ("CUcontext", "CUstream", "CUevent"):
        lines.append(f'printf("sizeof {t} %zu\\n", sizeof({t}));')
    lines += ['printf("sizeof CUuuid %zu\\n", sizeof(CUuuid));',
              'printf("sizeof CUmemAllocationProp %zu\\n", sizeof(CUmemAllocationProp));',
              'printf("sizeof CUmemAccessDesc %zu\\n", sizeof(CUmemAccessDesc));',
              'printf("sizeof CUmemLocation %zu\\n", sizeof(CUmemLocation));']
    for f in ("type", "requestedHandleTypes", "location", "location.id", "win32HandleMetaData",
              "allocFlags", "allocFlags.compressionType", "allocFlags.gpuDirectRDMACapable",
              "allocFlags.usage", "allocFlags.reserved"):
        lines.append(f"O(CUmemAllocationProp, {f})")
    lines += ["O(CUmemAccessDesc, location)", "O(CUmemAccessDesc, location.id)",
              "O(CUmemAccessDesc, flags)", "O(CUmemLocation, id)", "O(CUuuid, bytes)",
              "return 0; }"]
    src = tmp_path / "layout.c"
    src.write_text("\n".join(lines) + "\n")
    outputs = []
    for defs in (["-DUSE_CUDA_H", "-I", str(CUDA_INCLUDE)], ["-I", str(DRIVER_DIR)]):
        exe = tmp_path / ("layout" + str(len(outputs)))
        proc = subprocess.run(CC + ["-Wall", *defs, str(src), "-o", str(exe)], capture_output=True,
                              text=True)
        assert proc.returncode == 0, proc.stderr
        outputs.append(subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout)
    assert outputs[0] == outputs[1]

    # Prototypes: redeclaring a function with a different type is an error.
    protos = re.findall(r"^CUresult CUDAAPI \w+\(.*?\);", min_h, re.M | re.S)
    # all but the 8 legacy aliases and cuStreamGetCaptureInfo_v2, which cuda.h
    # declares only for the driver's own build (fakecuda_internal.h has it)
    assert len(protos) == len(EXPECTED_CU) - 9
    decl = tmp_path / "protos.c"
    decl.write_text("#include <cuda.h>\n" + "\n".join(protos) + "\n")
    proc = subprocess.run(CC + ["-c", "-Werror", "-I", str(CUDA_INCLUDE), str(decl), "-o",
                                str(tmp_path / "p.o")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    # The legacy aliases, against the legacy prototypes cuda.h declares for
    # the driver's own build (__CUDA_API_VERSION_INTERNAL).
    internal = (DRIVER_DIR / "fakecuda_internal.h").read_text()
    legacy = re.findall(r"^CUresult CUDAAPI (?:cuDeviceGetUuid|cuDevicePrimaryCtx\w+|cuCtx\w+Current|"
                        r"cuStreamDestroy|cuEventDestroy|cuStreamWriteValue32)\(.*?\);", internal, re.M | re.S)
    assert len(legacy) == 8
    decl.write_text("#define __CUDA_API_VERSION_INTERNAL 1\n#include <cuda.h>\n" + "\n".join(legacy) + "\n")
    proc = subprocess.run(CC + ["-c", "-I", str(CUDA_INCLUDE), str(decl), "-o", str(tmp_path / "p.o")],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.slow
def test_sanitizer_build_runs_clean(tmp_path):
    flags = ["-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer"]
    probe = tmp_path / "probe.c"
    probe.write_text("int main(void){return 0;}\n")
    if subprocess.run(CC + flags + [str(probe), "-o", str(tmp_path / "probe")],
                      capture_output=True).returncode != 0:
        pytest.skip("compiler has no ASan/UBSan")
    lib = fcbuild.build_fakecuda(tmp_path / "asan", flags, cuda_include=None)
    exe = _compile_smoke(lib, tmp_path / "smoke_asan", flags, use_cuda_h=False)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUMEM_FAKECUDA_")}
    env.update(LD_LIBRARY_PATH=str(lib.parent), ASAN_OPTIONS="detect_leaks=1")
    proc = subprocess.run([str(exe)], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "smoke ok" in proc.stdout


# --------------------------------------------------------------------------
# initialisation and configuration


def test_calls_before_cuinit_fail(lib):
    run(lib, """
        ok(cuDeviceGetCount(C.byref(ci())), NOT_INITIALIZED)
        ok(cuDeviceGet(C.byref(ci()), 0), NOT_INITIALIZED)
        ok(cuDevicePrimaryCtxGetState(0, C.byref(cu()), C.byref(ci())), NOT_INITIALIZED)
        ok(cuCtxSetCurrent(None), NOT_INITIALIZED)
        ok(cuMemAlloc_v2(C.byref(u64()), 16), NOT_INITIALIZED)
        ok(cuEventQuery(vp(0x1234)), NOT_INITIALIZED)
        # documented to work before cuInit
        v = ci(); ok(cuDriverGetVersion(C.byref(v))); assert v.value == 13000
        s = C.c_char_p(); ok(cuGetErrorString(2, C.byref(s))); assert s.value == b"out of memory"
        assert report()["initialized"] is False
        ok(cuInit(1), INVALID_VALUE)
        ok(cuDeviceGetCount(C.byref(ci())), NOT_INITIALIZED)
        ok(cuInit(0)); ok(cuInit(0))
        n = ci(); ok(cuDeviceGetCount(C.byref(n))); assert n.value == 1
        assert report()["initialized"] is True
    """)


def test_control_functions_work_before_cuinit(lib):
    run(lib, """
        r = report()
        assert r["initialized"] is False and r["devices"] == [] and r["leaks"]["total"] == 0
        L.fakecuda_set_event_mode(b"never")
        assert fakecuda_set_fail(b"cuStreamCreate:1") == 0
        init()
        ok(cuStreamCreate(C.byref(vp()), 0), UNKNOWN)
        e = event(); ok(cuEventRecord(e, None)); ok(cuEventQuery(e), NOT_READY)
        assert report()["config"]["events"] == "never"
    """)


def test_zero_devices_is_no_device(lib):
    run(lib, """
        ok(cuInit(0), NO_DEVICE)
        ok(cuDeviceGetCount(C.byref(ci())), NOT_INITIALIZED)
    """, env={"GPUMEM_FAKECUDA_DEVICES": "0"})


@pytest.mark.parametrize("var,value", [
    ("GPUMEM_FAKECUDA_DEVICES", "two"),
    ("GPUMEM_FAKECUDA_DEVICES", "17"),
    ("GPUMEM_FAKECUDA_MEMORY", "lots"),
    ("GPUMEM_FAKECUDA_MEMORY", "0"),
    ("GPUMEM_FAKECUDA_MEMORY", "1.5GiB"),
    ("GPUMEM_FAKECUDA_GRANULARITY", "3MiB"),
    ("GPUMEM_FAKECUDA_GRANULARITY", "100"),
    ("GPUMEM_FAKECUDA_EVENTS", "sometimes"),
    ("GPUMEM_FAKECUDA_EVENTS", "after:x"),
    ("GPUMEM_FAKECUDA_FAIL", "cuMemAlloc_v2"),
    ("GPUMEM_FAKECUDA_FAIL", "cuMemAlloc:1"),
    ("GPUMEM_FAKECUDA_FAIL", "cuMemAlloc_v2:0"),
    ("GPUMEM_FAKECUDA_FAIL", "cuMemAlloc_v2:1:zero"),
    ("GPUMEM_FAKECUDA_FAIL", "cuGetProcAddress:1"),
    ("GPUMEM_FAKECUDA_FAIL_ABOVE", "big"),
])
def test_bad_configuration_fails_cuinit_with_one_line(lib, var, value):
    proc = run(lib, """
        ok(cuInit(0), INVALID_VALUE)
        ok(cuDeviceGetCount(C.byref(ci())), NOT_INITIALIZED)
    """, env={var: value})
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert var in lines[0] and value in lines[0]


@pytest.mark.parametrize("value,expected", [
    ("512MiB", 512 << 20), ("1GiB", 1 << 30), ("80GiB", 80 << 30), ("1048576", 1 << 20),
    ("2GB", 2_000_000_000), ("64 MiB", 64 << 20), ("1t", 1 << 40),
])
def test_memory_sizes(lib, value, expected):
    run(lib, f"""
        ok(cuInit(0))
        t = sz(); ok(cuDeviceTotalMem_v2(C.byref(t), 0)); assert t.value == {expected}, t.value
        assert report()["config"]["memory"] == {expected}
    """, env={"GPUMEM_FAKECUDA_MEMORY": value})


def test_context_memory_is_charged_while_the_context_is_active(lib):
    # Note [Context memory]: an active primary context holds device memory
    run(lib, """
        ok(cuInit(0))
        assert dev0()["bytes_context"] == 0
        ctx = init()
        f, t = sz(), sz(); ok(cuMemGetInfo_v2(C.byref(f), C.byref(t)))
        assert (f.value, t.value) == (64 * MiB - 24 * MiB, 64 * MiB)
        d = dev0(); assert (d["bytes_context"], d["bytes_used"]) == (24 * MiB, 24 * MiB)
        p = alloc(40 * MiB)                              # exactly what is left
        q = u64(); ok(cuMemAlloc_v2(C.byref(q), 1), OOM)  # the context's share is not free
        c2 = vp(); ok(cuDevicePrimaryCtxRetain(C.byref(c2), 0))   # charged once
        assert dev0()["bytes_context"] == 24 * MiB
        ok(cuMemFree_v2(p))
        ok(cuDevicePrimaryCtxRelease(0)); ok(cuDevicePrimaryCtxRelease(0))
        assert dev0()["bytes_context"] == 0 and dev0()["peak_bytes_used"] == 64 * MiB
        ok(cuDevicePrimaryCtxRetain(C.byref(c2), 0))     # active again: charged again
        assert fakecuda_query(b"bytes_context", 0) == 24 * MiB
    """, env={"GPUMEM_FAKECUDA_MEMORY": "64MiB", "GPUMEM_SIM_CONTEXT_MEMORY": "24MiB"})
    # a device too small for its context refuses it, as the driver does
    run(lib, """
        ok(cuInit(0)); c = vp()
        ok(cuDevicePrimaryCtxRetain(C.byref(c), 0), OOM)
        assert dev0()["primary_ctx_refcount"] == 0
    """, env={"GPUMEM_FAKECUDA_MEMORY": "16MiB", "GPUMEM_FAKECUDA_CONTEXT_MEMORY": "24MiB"})
    proc = run(lib, "assert cuInit(0) == INVALID_VALUE",
               env={"GPUMEM_FAKECUDA_CONTEXT_MEMORY": "lots"})
    assert "GPUMEM_FAKECUDA_CONTEXT_MEMORY='lots' is invalid" in proc.stderr, proc.stderr


def test_devices_and_attributes(lib):
    run(lib, """
        ok(cuInit(0))
        n = ci(); ok(cuDeviceGetCount(C.byref(n))); assert n.value == 3
        d = ci(); ok(cuDeviceGet(C.byref(d), 2)); assert d.value == 2
        ok(cuDeviceGet(C.byref(d), 3), INVALID_DEVICE)
        ok(cuDeviceGet(C.byref(d), -1), INVALID_DEVICE)
        ok(cuDeviceGet(None, 0), INVALID_VALUE)
        buf = C.create_string_buffer(64)
        ok(cuDeviceGetName(buf, 64, 0)); assert buf.value == b"NVIDIA H100 80GB HBM3"
        small = C.create_string_buffer(8)
        ok(cuDeviceGetName(small, 7, 0)); assert small.value == b"NVIDIA"
        ok(cuDeviceGetName(buf, 0, 0), INVALID_VALUE)
        ok(cuDeviceGetName(buf, 64, 3), INVALID_DEVICE)
        def attr(a, dev=0):
            v = ci(-7); ok(cuDeviceGetAttribute(C.byref(v), a, dev)); return v.value
        assert attr(102) == 1          # VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED
        assert (attr(75), attr(76)) == (9, 0)
        assert attr(16) == 132         # MULTIPROCESSOR_COUNT
        assert attr(10) == 32 and attr(1) == 1024 and attr(41) == 1
        assert attr(18) == 0           # INTEGRATED: a sensible 0
        assert attr(115) == 0          # MEMORY_POOLS_SUPPORTED: not provided
        assert attr(128) == 0          # HANDLE_TYPE_FABRIC_SUPPORTED
        assert attr(147) == 0          # the last attribute of CUDA 13.0
        v = ci()
        ok(cuDeviceGetAttribute(C.byref(v), 0, 0), INVALID_VALUE)
        ok(cuDeviceGetAttribute(C.byref(v), 148, 0), INVALID_VALUE)
        ok(cuDeviceGetAttribute(C.byref(v), 16, 5), INVALID_DEVICE)
        ok(cuDeviceGetAttribute(None, 16, 0), INVALID_VALUE)
        t = sz(); ok(cuDeviceTotalMem_v2(C.byref(t), 1)); assert t.value == 80 * GiB
        ok(cuDeviceTotalMem_v2(C.byref(t), 9), INVALID_DEVICE)
        uu = [uuid(i) for i in range(3)]
        assert uuid(1, cuDeviceGetUuid) == uu[1]      # legacy name, same answer
        assert len(set(uu)) == 3 and all(len(u) == 16 for u in uu)
        ok(cuDeviceGetUuid_v2(None, 0), INVALID_VALUE)
        ok(cuDeviceGetUuid_v2(C.byref(Uuid()), 3), INVALID_DEVICE)
    """, env={"GPUMEM_FAKECUDA_DEVICES": "3"})


def test_uuid_is_deterministic(lib):
    body = """
        ok(cuInit(0)); print(json.dumps(uuid(0).hex()))
    """
    assert run_json(lib, body) == run_json(lib, body)


def test_vmm_attribute_follows_granularity(lib):
    run(lib, """
        ok(cuInit(0))
        v = ci(); ok(cuDeviceGetAttribute(C.byref(v), 102, 0)); assert v.value == 0
        ok(cuDeviceGetAttribute(C.byref(v), 103, 0)); assert v.value == 0
    """, env={"GPUMEM_FAKECUDA_GRANULARITY": "0"})


# --------------------------------------------------------------------------
# contexts


def test_context_rules(lib):
    run(lib, """
        ok(cuInit(0))
        cur = vp(1); ok(cuCtxGetCurrent(C.byref(cur))); assert cur.value is None
        ok(cuCtxGetCurrent(None), INVALID_VALUE)
        ok(cuMemAlloc_v2(C.byref(u64()), 16), INVALID_CONTEXT)
        ok(cuMemGetInfo_v2(C.byref(sz()), C.byref(sz())), INVALID_CONTEXT)
        ok(cuCtxSynchronize(), INVALID_CONTEXT)
        ok(cuStreamCreate(C.byref(vp()), 0), INVALID_CONTEXT)
        ok(cuCtxGetDevice(C.byref(ci())), INVALID_CONTEXT)
        flags, active = cu(7), ci(7)
        ok(cuDevicePrimaryCtxGetState(0, C.byref(flags), C.byref(active)))
        assert (flags.value, active.value) == (0, 0)
        ok(cuDevicePrimaryCtxGetState(0, None, C.byref(active)), INVALID_VALUE)
        ok(cuDevicePrimaryCtxGetState(4, C.byref(flags), C.byref(active)), INVALID_DEVICE)
        ok(cuDevicePrimaryCtxRelease_v2(0), INVALID_CONTEXT)   # not retained
        ok(cuCtxSetCurrent(vp(0x1000)), INVALID_CONTEXT)       # not a context
        ok(cuCtxPushCurrent_v2(vp(0x1000)), INVALID_CONTEXT)
        ok(cuCtxPushCurrent_v2(None), INVALID_VALUE)
        ok(cuCtxPopCurrent_v2(C.byref(vp())), INVALID_CONTEXT)  # empty stack

        a, b = vp(), vp()
        ok(cuDevicePrimaryCtxRetain(C.byref(a), 0)); ok(cuDevicePrimaryCtxRetain(C.byref(b), 0))
        assert a.value == b.value and a.value
        ok(cuDevicePrimaryCtxRetain(None, 0), INVALID_VALUE)
        ok(cuDevicePrimaryCtxRetain(C.byref(b), 2), INVALID_DEVICE)
        ok(cuDevicePrimaryCtxGetState(0, C.byref(flags), C.byref(active))); assert active.value == 1
        assert dev0()["primary_ctx_refcount"] == 2
        ok(cuCtxSetCurrent(a))
        d = ci(); ok(cuCtxGetDevice(C.byref(d))); assert d.value == 0
        p = alloc(100)

        # the current context is per thread
        def other():
            c = vp(1); ok(cuCtxGetCurrent(C.byref(c))); assert c.value is None
            ok(cuMemAlloc_v2(C.byref(u64()), 16), INVALID_CONTEXT)
            ok(cuMemFree_v2(p), INVALID_CONTEXT)
            ok(cuCtxSetCurrent(a)); q = alloc(10); ok(cuMemFree_v2(q))
        in_thread(other)
        c = vp(); ok(cuCtxGetCurrent(C.byref(c))); assert c.value == a.value

        # release to zero: the context and what was made in it are destroyed
        ok(cuDevicePrimaryCtxRelease_v2(0))
        ok(cuMemGetInfo_v2(C.byref(sz()), C.byref(sz())))
        ok(cuDevicePrimaryCtxRelease(0))            # legacy name, same behaviour
        ok(cuDevicePrimaryCtxGetState(0, C.byref(flags), C.byref(active))); assert active.value == 0
        ok(cuMemAlloc_v2(C.byref(u64()), 16), CONTEXT_IS_DESTROYED)
        ok(cuMemFree_v2(p), CONTEXT_IS_DESTROYED)
        ok(cuCtxSynchronize(), CONTEXT_IS_DESTROYED)
        ok(cuCtxGetDevice(C.byref(d)), CONTEXT_IS_DESTROYED)
        ok(cuCtxSetCurrent(a), INVALID_CONTEXT)
        ok(cuCtxPushCurrent_v2(a), INVALID_CONTEXT)
        ok(cuDevicePrimaryCtxRelease_v2(0), INVALID_CONTEXT)
        r = report()
        assert r["reclaimed_by_ctx_reset"] == {"allocations": 1, "bytes": 100, "streams": 0, "events": 0}
        assert r["leaks"]["allocations"] == 0
        # retained again, it works again (the old allocation is gone)
        ok(cuDevicePrimaryCtxRetain(C.byref(b), 0)); assert b.value == a.value
        ok(cuMemFree_v2(p), INVALID_VALUE)
        ok(cuCtxSetCurrent(None))
        ok(cuCtxGetCurrent(C.byref(c))); assert c.value is None
        ok(cuCtxSetCurrent(None))                    # no-op on an empty stack
        ok(cuDevicePrimaryCtxRelease_v2(0))
    """, env={"GPUMEM_FAKECUDA_DEVICES": "2"})


def test_context_stack(lib):
    run(lib, """
        ok(cuInit(0))
        c0, c1 = vp(), vp()
        ok(cuDevicePrimaryCtxRetain(C.byref(c0), 0)); ok(cuDevicePrimaryCtxRetain(C.byref(c1), 1))
        assert c0.value != c1.value
        def cur():
            c = vp(); ok(cuCtxGetCurrent(C.byref(c))); return c.value
        def dev():
            d = ci(); ok(cuCtxGetDevice(C.byref(d))); return d.value
        ok(cuCtxPushCurrent_v2(c0)); assert dev() == 0
        ok(cuCtxPushCurrent(c1)); assert dev() == 1     # legacy alias
        ok(cuCtxSetCurrent(c0)); assert dev() == 0      # replaces the top
        popped = vp(); ok(cuCtxPopCurrent(C.byref(popped))); assert popped.value == c0.value
        assert cur() == c0.value                        # the pushed one below
        ok(cuCtxPopCurrent_v2(None))                    # NULL out-pointer is fine
        assert cur() is None
        ok(cuCtxPopCurrent_v2(C.byref(popped)), INVALID_CONTEXT)
        # memory and info follow the current device
        ok(cuCtxSetCurrent(c1)); p1 = alloc(5 * MiB)
        ok(cuCtxSetCurrent(c0)); p0 = alloc(3 * MiB)
        r = report()["devices"]
        assert (r[0]["bytes_allocated"], r[1]["bytes_allocated"]) == (3 * MiB, 5 * MiB)
        f, t = sz(), sz(); ok(cuMemGetInfo_v2(C.byref(f), C.byref(t)))
        assert t.value - f.value == 3 * MiB
        ok(cuMemFree_v2(p1))   # any context frees any device's memory (UVA)
        ok(cuMemFree_v2(p0))
        ok(cuDevicePrimaryCtxReset_v2(0))   # reset keeps the retain
        f2, a2 = cu(), ci(); ok(cuDevicePrimaryCtxGetState(0, C.byref(f2), C.byref(a2))); assert a2.value == 1
        ok(cuDevicePrimaryCtxReset(5), INVALID_DEVICE)
    """, env={"GPUMEM_FAKECUDA_DEVICES": "2"})


def test_reset_destroys_context_objects(lib):
    run(lib, """
        ctx = init()
        p = alloc(1000); s = stream(); e = event()
        ok(cuDevicePrimaryCtxReset_v2(0))
        ok(cuMemFree_v2(p), INVALID_VALUE)
        ok(cuStreamQuery(s), INVALID_HANDLE)
        ok(cuEventQuery(e), INVALID_HANDLE)
        r = report()
        assert r["reclaimed_by_ctx_reset"] == {"allocations": 1, "bytes": 1000, "streams": 1, "events": 1}
        assert r["leaks"]["total"] == 0
        q = alloc(10); ok(cuMemFree_v2(q))      # still retained, still usable
    """)


# --------------------------------------------------------------------------
# cuMemAlloc


def test_alloc_free_and_misuse(lib):
    run(lib, """
        init()
        ok(cuMemAlloc_v2(C.byref(u64()), 0), INVALID_VALUE)
        ok(cuMemAlloc_v2(None, 16), INVALID_VALUE)
        ptrs = [alloc(n) for n in (1, 255, 256, 4097, 3 * MiB)]
        assert all(p % 256 == 0 for p in ptrs) and len(set(ptrs)) == len(ptrs)
        d = dev0()
        assert d["allocations"] == 5 and d["bytes_allocated"] == 1 + 255 + 256 + 4097 + 3 * MiB
        ok(cuMemFree_v2(ptrs[3] + 8), INVALID_VALUE)   # interior pointer
        ok(cuMemFree_v2(0), INVALID_VALUE)
        ok(cuMemFree_v2(0xdead000), INVALID_VALUE)     # unknown
        for p in ptrs:
            ok(cuMemFree_v2(p))
        ok(cuMemFree_v2(ptrs[0]), INVALID_VALUE)        # double free
        d = dev0()
        assert d["allocations"] == 0 and d["bytes_allocated"] == 0
        assert d["peak_bytes_used"] == 1 + 255 + 256 + 4097 + 3 * MiB
        assert report()["calls"]["cuMemFree_v2"] == 9
    """)


def test_oom_at_capacity_and_mem_get_info(lib):
    run(lib, """
        init()
        f, t = sz(), sz()
        ok(cuMemGetInfo_v2(C.byref(f), C.byref(t))); assert (f.value, t.value) == (64 * MiB, 64 * MiB)
        ok(cuMemGetInfo_v2(None, C.byref(t)), INVALID_VALUE)
        a = alloc(40 * MiB)
        ok(cuMemAlloc_v2(C.byref(u64()), 24 * MiB + 1), OOM)
        b = alloc(24 * MiB)                          # exactly fills the device
        ok(cuMemAlloc_v2(C.byref(u64()), 1), OOM)
        ok(cuMemGetInfo_v2(C.byref(f), C.byref(t))); assert f.value == 0
        ok(cuMemFree_v2(a))
        ok(cuMemGetInfo_v2(C.byref(f), C.byref(t))); assert f.value == 40 * MiB
        c = alloc(40 * MiB)
        ok(cuMemFree_v2(b)); ok(cuMemFree_v2(c))
        assert dev0()["peak_bytes_used"] == 64 * MiB
    """, env={"GPUMEM_FAKECUDA_MEMORY": "64MiB"})


def test_large_capacity_costs_nothing(lib):
    """80 GiB of device memory on a smaller host: MAP_NORESERVE, pages untouched."""
    run(lib, """
        init()
        ps = [alloc(20 * GiB) for _ in range(4)]
        ok(cuMemAlloc_v2(C.byref(u64()), 1), OOM)
        put(ps[3] + 20 * GiB - 4, b"tail")
        assert get(ps[3] + 20 * GiB - 4, 4) == b"tail"
        for p in ps:
            ok(cuMemFree_v2(p))
    """)


def test_copy_and_memset(lib):
    run(lib, """
        init()
        p = alloc(1000)
        data = bytes(range(256)) * 3
        put(p, data)
        assert get(p, len(data)) == data
        assert C.string_at(p, 4) == data[:4]        # device memory is host memory
        ok(cuMemsetD8_v2(p + 10, 0xee, 20))
        got = get(p, 40)
        assert got[:10] == data[:10] and got[10:30] == b"\\xee" * 20 and got[30:] == data[30:40]
        ok(cuMemcpyHtoD_v2(p + 999, b"ab", 2), INVALID_VALUE)   # past the end
        ok(cuMemcpyDtoH_v2(C.create_string_buffer(8), p - 8, 8), INVALID_VALUE)
        ok(cuMemsetD8_v2(p, 0, 1001), INVALID_VALUE)
        ok(cuMemcpyHtoD_v2(p, None, 4), INVALID_VALUE)
        ok(cuMemcpyHtoD_v2(p, None, 0))                           # empty copy
        ok(cuMemFree_v2(p))
        ok(cuMemcpyHtoD_v2(p, b"x", 1), INVALID_VALUE)            # freed
    """)


# --------------------------------------------------------------------------
# VMM


def test_vmm_full_cycle(lib):
    run(lib, """
        init()
        g = granularity(); assert g == 2 * MiB
        gr = sz(); ok(cuMemGetAllocationGranularity(C.byref(gr), C.byref(prop()), 1)); assert gr.value == g
        va = reserve(8 * g, 1 * GiB)
        assert va % GiB == 0
        h1, h2 = create(2 * g), create(g)
        d = dev0()
        assert (d["handles"], d["bytes_created"], d["reservations"], d["bytes_reserved"]) == (2, 3 * g, 1, 8 * g)
        f, t = sz(), sz(); ok(cuMemGetInfo_v2(C.byref(f), C.byref(t))); assert t.value - f.value == 3 * g
        ok(cuMemMap(va, 2 * g, 0, h1, 0))
        ok(cuMemMap(va + 2 * g, g, 0, h2, 0))
        assert dev0()["bytes_mapped"] == 3 * g and dev0()["mappings"] == 2
        ok(cuMemcpyHtoD_v2(va, b"x", 1), INVALID_VALUE)     # not accessible before SetAccess
        ok(set_rw(va, 3 * g))                               # both mappings at once
        payload = os.urandom(4096)
        put(va + 2 * g - 2048, payload)                     # straddles the two mappings
        assert get(va + 2 * g - 2048, 4096) == payload
        C.memmove(va + 5, b"direct", 6)                     # plain host access works
        assert get(va + 5, 6) == b"direct"
        ok(cuMemsetD8_v2(va, 7, 3 * g))
        ok(cuMemUnmap(va, 3 * g))                           # two whole mappings in one call
        assert dev0()["mappings"] == 0 and dev0()["bytes_mapped"] == 0
        # the handle keeps its contents; map it elsewhere in the reservation
        ok(cuMemMap(va + 4 * g, 2 * g, 0, h1, 0)); ok(set_rw(va + 4 * g, 2 * g))
        assert get(va + 4 * g, 16) == b"\\x07" * 16
        ok(cuMemUnmap(va + 4 * g, 2 * g))
        ok(cuMemRelease(h1)); ok(cuMemRelease(h2))
        ok(cuMemAddressFree(va, 8 * g))
        r = report()
        assert r["leaks"]["total"] == 0 and r["devices"][0]["bytes_created"] == 0
        assert r["devices"][0]["peak_bytes_used"] == 3 * g
        assert {fn: r["calls"][fn] for fn in ("cuMemMap", "cuMemUnmap", "cuMemCreate", "cuMemRelease")} \
            == {"cuMemMap": 3, "cuMemUnmap": 2, "cuMemCreate": 2, "cuMemRelease": 2}
    """)


def test_vmm_release_while_mapped(lib):
    run(lib, """
        init()
        g = granularity(); va = reserve(2 * g); h = create(g)
        ok(cuMemMap(va, g, 0, h, 0)); ok(set_rw(va, g))
        put(va, b"still here")
        ok(cuMemRelease(h))                         # allowed while mapped
        ok(cuMemRelease(h), INVALID_VALUE)          # but only once
        ok(cuMemMap(va + g, g, 0, h, 0), INVALID_VALUE)   # a released handle maps no more
        d = dev0()
        assert (d["handles"], d["handles_released_but_mapped"], d["bytes_created"]) == (0, 1, g)
        assert get(va, 10) == b"still here"         # memory lives until unmapped
        f, t = sz(), sz(); ok(cuMemGetInfo_v2(C.byref(f), C.byref(t))); assert t.value - f.value == g
        leaks = report()["leaks"]
        assert leaks["mappings"] == 1 and leaks["handles"] == 0
        assert [x["kind"] for x in leaks["details"]] == ["mapping", "reservation"]
        assert leaks["details"][0]["handle_released"] is True
        ok(cuMemUnmap(va, g))                       # now it is freed
        assert dev0()["bytes_created"] == 0
        ok(cuMemGetInfo_v2(C.byref(f), C.byref(t))); assert f.value == t.value
        ok(cuMemAddressFree(va, 2 * g))
        assert report()["leaks"]["total"] == 0
    """)


def test_vmm_misuse_is_rejected(lib):
    run(lib, """
        init()
        g = granularity()
        # granularity query: prop checks
        gr = sz()
        ok(cuMemGetAllocationGranularity(C.byref(gr), C.byref(prop(type=2)), 0), INVALID_VALUE)
        ok(cuMemGetAllocationGranularity(C.byref(gr), C.byref(prop(loc_type=0)), 0), INVALID_VALUE)
        ok(cuMemGetAllocationGranularity(C.byref(gr), C.byref(prop(dev=1)), 0), INVALID_VALUE)
        ok(cuMemGetAllocationGranularity(C.byref(gr), C.byref(prop()), 2), INVALID_VALUE)
        ok(cuMemGetAllocationGranularity(None, C.byref(prop()), 0), INVALID_VALUE)
        ok(cuMemGetAllocationGranularity(C.byref(gr), None, 0), INVALID_VALUE)
        # reserve
        p = u64()
        ok(cuMemAddressReserve(C.byref(p), g + 4096, 0, 0, 0), INVALID_VALUE)   # not a granule multiple
        ok(cuMemAddressReserve(C.byref(p), 0, 0, 0, 0), INVALID_VALUE)
        ok(cuMemAddressReserve(C.byref(p), g, 3 * MiB, 0, 0), INVALID_VALUE)   # alignment not a power of 2
        ok(cuMemAddressReserve(C.byref(p), g, 0, 0, 1), INVALID_VALUE)         # flags
        ok(cuMemAddressReserve(None, g, 0, 0, 0), INVALID_VALUE)
        # create
        h = u64()
        ok(cuMemCreate(C.byref(h), g + 4096, C.byref(prop()), 0), INVALID_VALUE)
        ok(cuMemCreate(C.byref(h), 0, C.byref(prop()), 0), INVALID_VALUE)
        ok(cuMemCreate(C.byref(h), g, C.byref(prop()), 1), INVALID_VALUE)
        ok(cuMemCreate(C.byref(h), g, C.byref(prop(dev=1)), 0), INVALID_DEVICE)
        ok(cuMemCreate(C.byref(h), g, C.byref(prop(type=0)), 0), INVALID_VALUE)
        ok(cuMemCreate(C.byref(h), g, C.byref(prop(requestedHandleTypes=8)), 0), NOT_SUPPORTED)  # fabric
        ok(cuMemCreate(C.byref(h), g, C.byref(prop(requestedHandleTypes=16)), 0), INVALID_VALUE)
        ok(cuMemCreate(C.byref(h), g, C.byref(prop(gpuDirectRDMACapable=1)), 0), NOT_SUPPORTED)
        ok(cuMemCreate(C.byref(h), g, C.byref(prop(loc_type=2)), 0), NOT_SUPPORTED)      # host memory
        ok(cuMemCreate(C.byref(h), g, C.byref(prop(win32HandleMetaData=8)), 0), INVALID_VALUE)
        ok(cuMemCreate(C.byref(h), g, C.byref(prop(requestedHandleTypes=1)), 0))          # POSIX fd is fine
        ok(cuMemRelease(h.value))
        ok(cuMemCreate(C.byref(h), 64 * MiB + g, C.byref(prop()), 0), OOM)              # over capacity
        assert dev0()["handles"] == 0
        # map
        va = reserve(4 * g); h1 = create(g); h2 = create(2 * g)
        ok(cuMemMap(va + 4096, g, 0, h1, 0), INVALID_VALUE)      # unaligned address
        ok(cuMemMap(va, g // 2, 0, h1, 0), INVALID_VALUE)        # size not a granule multiple
        ok(cuMemMap(va, 2 * g, 0, h1, 0), INVALID_VALUE)         # bigger than the handle
        ok(cuMemMap(va, g, g, h2, 0), INVALID_VALUE)             # offset must be 0
        ok(cuMemMap(va, g, 0, h1, 1), INVALID_VALUE)             # flags
        ok(cuMemMap(va, g, 0, 12345, 0), INVALID_VALUE)          # unknown handle
        ok(cuMemMap(va + 3 * g, 2 * g, 0, h2, 0), INVALID_VALUE) # runs past the reservation
        ok(cuMemMap(va - 4 * g, g, 0, h1, 0), INVALID_VALUE)     # not reserved
        ok(cuMemMap(va + g, 2 * g, 0, h2, 0))
        ok(cuMemMap(va + 2 * g, g, 0, h1, 0), INVALID_VALUE)     # already mapped
        ok(cuMemMap(va, 2 * g, 0, h2, 0), INVALID_VALUE)         # overlaps the start
        ok(cuMemMap(va, g, 0, h1, 0))
        # set access
        a = Access(loc_type=1, loc_id=0, flags=3)
        ok(cuMemSetAccess(va, 3 * g, None, 1), INVALID_VALUE)
        ok(cuMemSetAccess(va, 3 * g, C.byref(a), 0), INVALID_VALUE)
        ok(set_rw(va, 3 * g, dev=1), INVALID_DEVICE)
        ok(set_rw(va, 3 * g, flags=2), INVALID_VALUE)
        ok(cuMemSetAccess(va, 3 * g, C.byref(Access(loc_type=2, loc_id=0, flags=3)), 1), INVALID_VALUE)
        ok(set_rw(va, 4 * g), INVALID_VALUE)                     # includes an unmapped granule
        ok(set_rw(va, 2 * g), INVALID_VALUE)                     # ends inside a mapping
        ok(set_rw(va, 3 * g, flags=1))                           # read-only
        ok(cuMemcpyHtoD_v2(va, b"x", 1), INVALID_VALUE)
        get(va, 4)
        ok(set_rw(va, 3 * g, flags=0))
        ok(cuMemcpyDtoH_v2(C.create_string_buffer(4), va, 4), INVALID_VALUE)
        # unmap
        ok(cuMemUnmap(va + g, g), INVALID_VALUE)                 # part of a mapping
        ok(cuMemUnmap(va, 4 * g), INVALID_VALUE)                 # past the mapped range
        ok(cuMemUnmap(va + 3 * g, g), INVALID_VALUE)             # nothing mapped there
        ok(cuMemUnmap(va, 0), INVALID_VALUE)
        # free
        ok(cuMemAddressFree(va, 4 * g), INVALID_VALUE)           # still mapped
        ok(cuMemAddressFree(va, 2 * g), INVALID_VALUE)           # wrong size
        ok(cuMemAddressFree(va + g, 3 * g), INVALID_VALUE)       # not the start
        ok(cuMemUnmap(va, g)); ok(cuMemUnmap(va + g, 2 * g))
        ok(cuMemUnmap(va, g), INVALID_VALUE)                     # twice
        ok(cuMemRelease(h1)); ok(cuMemRelease(h2))
        ok(cuMemRelease(h2), INVALID_VALUE)
        ok(cuMemRelease(0), INVALID_VALUE)
        ok(cuMemAddressFree(va, 4 * g))
        ok(cuMemAddressFree(va, 4 * g), INVALID_VALUE)           # twice
        assert report()["leaks"]["total"] == 0
    """, env={"GPUMEM_FAKECUDA_MEMORY": "64MiB"})


def test_vmm_memory_is_protected_until_set_access(lib):
    """Touching a mapping before cuMemSetAccess faults, as on a GPU (and the
    test proves it can fail)."""
    base = """
        init(); g = granularity(); va = reserve(g); h = create(g)
        ok(cuMemMap(va, g, 0, h, 0))
        {}
        print("read", C.string_at(va, 1), flush=True)
    """
    good = run(lib, base.format("ok(set_rw(va, g))"))
    assert "read b'\\x00'" in good.stdout
    crash = run(lib, base.format("pass"), expect_rc=None)
    assert crash.returncode < 0 and "read" not in crash.stdout


def test_vmm_not_supported_without_granularity(lib):
    run(lib, """
        init()
        for r in (cuMemGetAllocationGranularity(C.byref(sz()), C.byref(prop()), 0),
                  cuMemAddressReserve(C.byref(u64()), 2 * MiB, 0, 0, 0),
                  cuMemAddressFree(0x200000, 2 * MiB),
                  cuMemCreate(C.byref(u64()), 2 * MiB, C.byref(prop()), 0),
                  cuMemRelease(1), cuMemMap(0x200000, 2 * MiB, 0, 1, 0),
                  cuMemUnmap(0x200000, 2 * MiB), set_rw(0x200000, 2 * MiB)):
            ok(r, NOT_SUPPORTED)
        p = alloc(100); ok(cuMemFree_v2(p))   # plain allocations still work
    """, env={"GPUMEM_FAKECUDA_GRANULARITY": "0"})


def test_vmm_needs_context_and_custom_granularity(lib):
    run(lib, """
        ok(cuInit(0))
        ok(cuMemAddressReserve(C.byref(u64()), 64 * 1024, 0, 0, 0), INVALID_CONTEXT)
        ok(cuMemCreate(C.byref(u64()), 64 * 1024, C.byref(prop()), 0), INVALID_CONTEXT)
        gr = sz(); ok(cuMemGetAllocationGranularity(C.byref(gr), C.byref(prop()), 0))
        assert gr.value == 64 * 1024
        init()
        va = reserve(3 * 64 * 1024); assert va % (64 * 1024) == 0
        h = create(64 * 1024); ok(cuMemMap(va + 64 * 1024, 64 * 1024, 0, h, 0))
        ok(cuMemUnmap(va + 64 * 1024, 64 * 1024)); ok(cuMemRelease(h)); ok(cuMemAddressFree(va, 3 * 64 * 1024))
    """, env={"GPUMEM_FAKECUDA_GRANULARITY": "64KiB"})


def test_vmm_and_alloc_share_capacity(lib):
    run(lib, """
        init()
        g = granularity()
        p = alloc(30 * MiB)
        ok(cuMemCreate(C.byref(u64()), 20 * MiB, C.byref(prop()), 0), OOM)   # 30 + 20 > 48
        h = create(16 * MiB)
        ok(cuMemAlloc_v2(C.byref(u64()), 2 * MiB + 1), OOM)
        q = alloc(2 * MiB)
        d = dev0(); assert d["bytes_used"] == 48 * MiB and d["bytes_free"] == 0
        ok(cuMemRelease(h)); ok(cuMemFree_v2(p)); ok(cuMemFree_v2(q))
    """, env={"GPUMEM_FAKECUDA_MEMORY": "48MiB"})


# --------------------------------------------------------------------------
# streams and events


def test_streams(lib):
    run(lib, """
        init()
        ss = [stream(), stream(1)]
        assert len({s.value for s in ss}) == 2 and all(s.value not in (None, 1, 2) for s in ss)
        ok(cuStreamCreate(C.byref(vp()), 2), INVALID_VALUE)
        ok(cuStreamCreate(None, 0), INVALID_VALUE)
        for s in (None, vp(LEGACY), vp(PER_THREAD), ss[0]):
            ok(cuStreamQuery(s)); ok(cuStreamSynchronize(s))
        e = event()
        for s in (None, vp(LEGACY), vp(PER_THREAD), ss[1]):
            ok(cuEventRecord(e, s))
        assert dev0()["streams"] == 2
        ok(cuStreamDestroy_v2(ss[0])); ok(cuStreamDestroy(ss[1]))      # legacy alias too
        for bad in (ss[0], ss[1], vp(0x12345678)):
            ok(cuStreamQuery(bad), INVALID_HANDLE)
            ok(cuStreamSynchronize(bad), INVALID_HANDLE)
            ok(cuEventRecord(e, bad), INVALID_HANDLE)
            ok(cuStreamDestroy_v2(bad), INVALID_HANDLE)
        for special in (None, vp(LEGACY), vp(PER_THREAD)):
            ok(cuStreamDestroy_v2(special), INVALID_HANDLE)
        s3 = stream(); assert s3.value not in {s.value for s in ss}   # handles are never reused
        ok(cuStreamDestroy_v2(s3)); ok(cuEventDestroy_v2(e))
        assert report()["leaks"]["total"] == 0
    """)


def test_event_basics(lib):
    run(lib, """
        init()
        evs = [event(f) for f in (0, 1, 2, 3, 6)]
        assert len({e.value for e in evs}) == 5
        ok(cuEventCreate(C.byref(vp()), 4), INVALID_VALUE)   # INTERPROCESS needs DISABLE_TIMING
        ok(cuEventCreate(C.byref(vp()), 8), INVALID_VALUE)
        ok(cuEventCreate(None, 0), INVALID_VALUE)
        for e in evs:
            ok(cuEventQuery(e))                              # never recorded: complete
            ok(cuEventSynchronize(e))
        ok(cuEventDestroy_v2(evs[0])); ok(cuEventDestroy(evs[1]))
        for bad in (evs[0], evs[1], vp(0xabc0)):
            ok(cuEventQuery(bad), INVALID_HANDLE)
            ok(cuEventRecord(bad, None), INVALID_HANDLE)
            ok(cuEventSynchronize(bad), INVALID_HANDLE)
            ok(cuEventDestroy_v2(bad), INVALID_HANDLE)
        assert dev0()["events"] == 3
        # cuEventQuery needs no current context (the header lists no
        # INVALID_CONTEXT for it); the others do
        e = evs[2]
        def no_ctx():
            ok(cuEventQuery(e))
            ok(cuEventRecord(e, None), INVALID_CONTEXT)
            ok(cuEventSynchronize(e), INVALID_CONTEXT)
            ok(cuEventDestroy_v2(e), INVALID_CONTEXT)
            ok(cuStreamQuery(None), INVALID_CONTEXT)
            ok(cuStreamSynchronize(None), INVALID_CONTEXT)
            ok(cuEventCreate(C.byref(vp()), 0), INVALID_CONTEXT)
        in_thread(no_ctx)
    """)


def test_events_immediate(lib):
    run(lib, """
        L.fakecuda_set_event_mode(b"immediate")
        init(); s = stream(); e = event()
        ok(cuEventRecord(e, s)); ok(cuEventQuery(e)); ok(cuStreamQuery(s))
        assert dev0()["events_pending"] == 0
    """)


def test_events_never(lib):
    run(lib, """
        init(); s1, s2 = stream(), stream(); a, b, c = event(), event(), event()
        ok(cuEventRecord(a, s1)); ok(cuEventRecord(b, s2)); ok(cuEventRecord(c, None))
        for _ in range(5):
            ok(cuEventQuery(a), NOT_READY)
        ok(cuStreamQuery(s1), NOT_READY)
        assert dev0()["events_pending"] == 3
        assert {x["pending"] for x in report()["leaks"]["details"] if x["kind"] == "event"} == {True}
        ok(cuStreamSynchronize(s1))                 # completes only s1's events
        ok(cuEventQuery(a)); ok(cuStreamQuery(s1))
        ok(cuEventQuery(b), NOT_READY); ok(cuEventQuery(c), NOT_READY)
        ok(cuEventSynchronize(b))                   # the host waits, the fake GPU finishes
        ok(cuEventQuery(b))
        ok(cuStreamQuery(None), NOT_READY)
        ok(cuCtxSynchronize())                      # everything in the context
        ok(cuEventQuery(c)); ok(cuStreamQuery(None))
        ok(cuEventRecord(a, s2)); ok(cuEventQuery(a), NOT_READY)   # re-record starts over
        L.fakecuda_complete_events()
        ok(cuEventQuery(a))
        # a pending event can be destroyed
        ok(cuEventRecord(a, s2)); ok(cuEventDestroy_v2(a)); ok(cuStreamDestroy_v2(s2))
    """, env={"GPUMEM_FAKECUDA_EVENTS": "never"})


def test_events_after_n(lib):
    run(lib, """
        init(); s = stream(); e = event()
        ok(cuEventRecord(e, s))
        for _ in range(3):
            ok(cuEventQuery(e), NOT_READY)
        ok(cuEventQuery(e)); ok(cuEventQuery(e))
        ok(cuEventRecord(e, s))
        ok(cuStreamQuery(s), NOT_READY)             # stream polls count too
        ok(cuEventQuery(e), NOT_READY)
        ok(cuStreamQuery(s), NOT_READY)
        ok(cuStreamQuery(s))
        ok(cuEventQuery(e))
    """, env={"GPUMEM_FAKECUDA_EVENTS": "after:3"})


def test_event_mode_set_at_run_time(lib):
    run(lib, """
        init(); e = event()
        L.fakecuda_set_event_mode(b"after:1")
        ok(cuEventRecord(e, None)); ok(cuEventQuery(e), NOT_READY); ok(cuEventQuery(e))
        L.fakecuda_set_event_mode(b"never")
        ok(cuEventRecord(e, None)); ok(cuEventQuery(e), NOT_READY)
        L.fakecuda_set_event_mode(b"immediate")     # applies to later records only
        ok(cuEventQuery(e), NOT_READY)
        ok(cuEventRecord(e, None)); ok(cuEventQuery(e))
        assert report()["config"]["events"] == "immediate"
        L.fakecuda_set_event_mode(b"after:0")
        ok(cuEventRecord(e, None)); ok(cuEventQuery(e))
        L.fakecuda_set_event_mode(b"bogus")         # ignored with a warning
        assert report()["config"]["events"] == "after:0"
    """)


def test_per_thread_stream_is_per_thread(lib):
    run(lib, """
        ctx = init(); e = event()
        def record():
            ok(cuCtxSetCurrent(ctx)); ok(cuEventRecord(e, vp(PER_THREAD)))
        in_thread(record)
        ok(cuEventQuery(e), NOT_READY)
        ok(cuStreamSynchronize(vp(PER_THREAD)))     # this thread's stream: not that one
        ok(cuEventQuery(e), NOT_READY)
        ok(cuStreamSynchronize(vp(LEGACY)))
        ok(cuEventQuery(e), NOT_READY)
        ok(cuCtxSynchronize()); ok(cuEventQuery(e))
    """, env={"GPUMEM_FAKECUDA_EVENTS": "never"})


def test_event_and_stream_must_share_a_context(lib):
    run(lib, """
        ok(cuInit(0))
        c0, c1 = vp(), vp()
        ok(cuDevicePrimaryCtxRetain(C.byref(c0), 0)); ok(cuDevicePrimaryCtxRetain(C.byref(c1), 1))
        ok(cuCtxSetCurrent(c0)); e0 = event(); s0 = stream()
        ok(cuCtxSetCurrent(c1)); s1 = stream()
        ok(cuEventRecord(e0, s1), INVALID_HANDLE)
        ok(cuEventRecord(e0, None), INVALID_HANDLE)   # the null stream of device 1
        ok(cuEventRecord(e0, s0))                     # fine from any current context
        d = report()["devices"]
        assert (d[0]["events"], d[0]["streams"], d[1]["streams"]) == (1, 1, 1)
        ok(cuEventRecord(e0, s0))
        ok(cuCtxSynchronize())                         # device 1's: e0 stays pending
        ok(cuEventQuery(e0), NOT_READY)
    """, env={"GPUMEM_FAKECUDA_DEVICES": "2", "GPUMEM_FAKECUDA_EVENTS": "never"})


# --------------------------------------------------------------------------
# failure injection


def test_fail_nth_call_from_env(lib):
    run(lib, """
        init()
        a = alloc(10); b = alloc(10)
        ok(cuMemAlloc_v2(C.byref(u64()), 10), OOM)      # the 3rd call
        c = alloc(10)                                   # the 4th works again
        ok(cuEventQuery(vp(1)), INVALID_HANDLE)
        ok(cuEventQuery(vp(1)), UNKNOWN)               # default code for non-allocating calls
        ok(cuEventQuery(vp(1)), INVALID_HANDLE)
        s = stream(); ok(cuStreamQuery(s), 42)
        for p in (a, b, c):
            ok(cuMemFree_v2(p))
        r = report()
        assert r["calls"]["cuMemAlloc_v2"] == 4 and r["calls"]["cuEventQuery"] == 3
        assert r["config"]["fail"] == "cuMemAlloc_v2:3, cuEventQuery:2,cuStreamQuery:1:42"
    """, env={"GPUMEM_FAKECUDA_FAIL": "cuMemAlloc_v2:3, cuEventQuery:2,cuStreamQuery:1:42"})


def test_fail_at_run_time_and_persistent(lib):
    run(lib, """
        init()
        assert fakecuda_set_fail(b"cuMemCreate:2+:0x2") == 0
        h1 = create(2 * MiB)
        for _ in range(3):
            ok(cuMemCreate(C.byref(u64()), 2 * MiB, C.byref(prop()), 0), OOM)
        assert fakecuda_set_fail(b"cuMemCreate:1") == 0        # counters restart
        ok(cuMemCreate(C.byref(u64()), 2 * MiB, C.byref(prop()), 0), OOM)
        h2 = create(2 * MiB)
        assert fakecuda_set_fail(b"") == 0                      # clears
        h3 = create(2 * MiB)
        assert fakecuda_set_fail(b"cuNoSuchThing:1") == -1      # rejected, rules kept
        assert fakecuda_set_fail(b"cuMemFree_v2:x") == -1
        assert fakecuda_set_fail(None) == 0
        for h in (h1, h2, h3):
            ok(cuMemRelease(h))
        assert fakecuda_set_fail(b"cuMemRelease:1:709") == 0
        ok(cuMemRelease(12345), CONTEXT_IS_DESTROYED)
        r = report(); assert r["leaks"]["total"] == 0 and r["devices"][0]["bytes_created"] == 0
    """)


def test_fail_cuinit_itself(lib):
    run(lib, """
        ok(cuInit(0), UNKNOWN)
        ok(cuDeviceGetCount(C.byref(ci())), NOT_INITIALIZED)
        ok(cuInit(0))
    """, env={"GPUMEM_FAKECUDA_FAIL": "cuInit:1"})


def test_fail_above(lib):
    run(lib, """
        init()
        ok(cuMemAlloc_v2(C.byref(u64()), 1 * MiB + 1), OOM)
        p = alloc(1 * MiB)
        ok(cuMemCreate(C.byref(u64()), 2 * MiB, C.byref(prop()), 0), OOM)
        ok(cuMemFree_v2(p))
        assert report()["config"]["fail_above"] == MiB
    """, env={"GPUMEM_FAKECUDA_FAIL_ABOVE": "1MiB"})


def test_injected_failures_have_no_side_effects(lib):
    """Fail every entry point in turn once during a full workload: no crash,
    and the workload's cleanup still leaves nothing behind."""
    body = """
        init()
        assert fakecuda_set_fail(os.environ["SPEC"].encode()) == 0
        def attempt(f, *a):   # the result does not matter: one call fails
            f(*a)
        p = u64(); attempt(cuMemAlloc_v2, C.byref(p), 4096)
        g = sz(); attempt(cuMemGetAllocationGranularity, C.byref(g), C.byref(prop()), 0)
        va = u64(); attempt(cuMemAddressReserve, C.byref(va), 4 * MiB, 0, 0, 0)
        h = u64(); attempt(cuMemCreate, C.byref(h), 2 * MiB, C.byref(prop()), 0)
        attempt(cuMemMap, va.value, 2 * MiB, 0, h.value, 0)
        attempt(set_rw, va.value, 2 * MiB)
        s = vp(); attempt(cuStreamCreate, C.byref(s), 0)
        e = vp(); attempt(cuEventCreate, C.byref(e), 2)
        attempt(cuEventRecord, e, s); attempt(cuEventQuery, e); attempt(cuStreamSynchronize, s)
        assert fakecuda_set_fail(b"") == 0
        # cleanup of whatever was created
        if e.value: cuEventDestroy_v2(e)
        if s.value: cuStreamDestroy_v2(s)
        if va.value: cuMemUnmap(va.value, 2 * MiB)
        if h.value: cuMemRelease(h.value)
        if va.value: ok(cuMemAddressFree(va.value, 4 * MiB))
        if p.value: ok(cuMemFree_v2(p.value))
        r = report()
        assert r["leaks"]["total"] == 0, r["leaks"]
    """
    for fn in ("cuMemAlloc_v2", "cuMemGetAllocationGranularity", "cuMemAddressReserve", "cuMemCreate",
               "cuMemMap", "cuMemSetAccess", "cuStreamCreate", "cuEventCreate", "cuEventRecord",
               "cuEventQuery", "cuStreamSynchronize"):
        run(lib, body, env={"SPEC": f"{fn}:1"})


# --------------------------------------------------------------------------
# report, errors, threads


def test_report_contents_and_leak_details(lib):
    data = run_json(lib, """
        init()
        p = alloc(123); s = stream(); e = event()
        g = granularity(); va = reserve(2 * g); h = create(g); ok(cuMemMap(va, g, 0, h, 0))
        r = report()
        r["_expect"] = {"p": p, "va": va, "h": h, "s": s.value, "e": e.value}
        print(json.dumps(r))
    """)
    exp = data.pop("_expect")
    assert data["version"] == 1 and data["initialized"] is True
    assert data["config"] == {"devices": 1, "memory": 80 << 30, "granularity": 2 << 20,
                              "events": "timeline", "fail": "", "fail_above": 0,
                              "no_host_memory": False, "report": None}
    assert set(data["calls"]) == EXPECTED_CU
    assert data["total_calls"] == sum(data["calls"].values())
    dev = data["devices"][0]
    for key, want in {"allocations": 1, "bytes_allocated": 123, "handles": 1, "bytes_created": 2 << 20,
                      "bytes_mapped": 2 << 20, "reservations": 1, "bytes_reserved": 4 << 20,
                      "mappings": 1, "events": 1, "streams": 1, "primary_ctx_refcount": 1,
                      "bytes_used": 123 + (2 << 20), "peak_bytes_used": 123 + (2 << 20)}.items():
        assert dev[key] == want, key
    leaks = data["leaks"]
    assert leaks["total"] == 6 and leaks["primary_ctx_refs"] == 1
    by_kind = {d["kind"]: d for d in leaks["details"]}
    assert by_kind["allocation"] == {"kind": "allocation", "device": 0, "ptr": exp["p"], "size": 123}
    assert by_kind["handle"]["handle"] == exp["h"] and by_kind["handle"]["mappings"] == 1
    assert by_kind["mapping"]["ptr"] == exp["va"] and by_kind["mapping"]["handle_released"] is False
    assert by_kind["reservation"]["ptr"] == exp["va"] and by_kind["reservation"]["size"] == 4 << 20
    assert by_kind["stream"]["handle"] == exp["s"] and by_kind["event"]["handle"] == exp["e"]
    assert leaks["details_truncated"] is False


def test_report_truncates_details_and_snprintf_semantics(lib):
    run(lib, """
        init()
        ps = [alloc(16) for _ in range(150)]
        r = report()
        assert len(r["leaks"]["details"]) == 100 and r["leaks"]["details_truncated"] is True
        assert r["leaks"]["allocations"] == 150
        n = fakecuda_report_json(None, 0)
        full = C.create_string_buffer(n + 1); fakecuda_report_json(full, n + 1)
        small = C.create_string_buffer(11)
        assert fakecuda_report_json(small, 11) == n          # like snprintf
        assert small.value == full.value[:10]
        L.fakecuda_reset_counters()
        r = report()
        assert r["total_calls"] == 0 and r["devices"][0]["peak_bytes_used"] == 150 * 16
    """)


# --------------------------------------------------------------------------
# run-time configuration and queries (fakecuda_configure, fakecuda_query)


def test_configure_before_cuinit_wins_over_the_environment(lib):
    proc = run(lib, """
        assert fakecuda_configure(b"memory=64MiB,granularity=0,events=never") == 0
        ok(cuInit(0))
        t = sz(); ok(cuDeviceTotalMem_v2(C.byref(t), 0)); assert t.value == 64 * MiB
        v = ci(); ok(cuDeviceGetAttribute(C.byref(v), 102, 0)); assert v.value == 0
        c = report()["config"]
        assert (c["memory"], c["granularity"], c["events"]) == (64 * MiB, 0, "never")
        assert c["devices"] == 2          # what configure does not name comes from the env
        assert fakecuda_query(b"devices", -1) == 2
    """, env={"GPUMEM_FAKECUDA_MEMORY": "1GiB", "GPUMEM_FAKECUDA_DEVICES": "2",
              "GPUMEM_FAKECUDA_EVENTS": "after:2"})
    assert proc.stderr == ""


def test_configure_at_run_time(lib):
    proc = run(lib, """
        init()
        assert fakecuda_configure(b"memory=64MiB; granularity=4MiB") == 0
        t = sz(); ok(cuDeviceTotalMem_v2(C.byref(t), 0)); assert t.value == 64 * MiB
        f, tot = sz(), sz(); ok(cuMemGetInfo_v2(C.byref(f), C.byref(tot)))
        assert (f.value, tot.value) == (64 * MiB, 64 * MiB)
        assert granularity() == 4 * MiB
        ok(cuMemAlloc_v2(C.byref(u64()), 65 * MiB), OOM)
        p = alloc(1 * MiB)
        # memory and granularity wait until nothing is allocated ...
        assert fakecuda_configure(b"memory=1GiB") == -1
        assert fakecuda_configure(b"granularity=2MiB") == -1
        assert fakecuda_query(b"capacity", 0) == 64 * MiB and granularity() == 4 * MiB
        # ... the other keys apply at any time; a fail list may hold commas
        assert fakecuda_configure(
            b"events=after:1,fail=cuMemAlloc_v2:1,cuEventQuery:2:42,fail_above=2MiB") == 0
        c = report()["config"]
        assert (c["events"], c["fail"], c["fail_above"]) == (
            "after:1", "cuMemAlloc_v2:1,cuEventQuery:2:42", 2 * MiB)
        ok(cuMemAlloc_v2(C.byref(u64()), 16), OOM)          # the injected failure
        ok(cuMemAlloc_v2(C.byref(u64()), 3 * MiB), OOM)     # above fail_above
        e = event(); ok(cuEventRecord(e, None))
        ok(cuEventQuery(e), NOT_READY); ok(cuEventQuery(e), 42)
        assert fakecuda_configure(b"fail=,fail_above=0,events=immediate") == 0
        assert report()["config"]["fail"] == ""
        q = alloc(3 * MiB)
        for x in (p, q):
            ok(cuMemFree_v2(x))
        ok(cuEventDestroy_v2(e))
        # a VMM reservation alone also holds memory and granularity back
        va = reserve(4 * MiB)
        assert fakecuda_configure(b"granularity=2MiB") == -1
        ok(cuMemAddressFree(va, 4 * MiB))
        assert fakecuda_configure(b"memory=1GiB,granularity=2MiB") == 0
        assert granularity() == 2 * MiB and fakecuda_query(b"capacity", 0) == GiB
        assert fakecuda_configure(b"granularity=0") == 0
        ok(cuMemGetAllocationGranularity(C.byref(sz()), C.byref(prop()), 0), NOT_SUPPORTED)
        assert fakecuda_configure(None) == 0 and fakecuda_configure(b"") == 0   # no change
        assert report()["config"]["granularity"] == 0
    """)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 3 and all("fakecuda_configure" in l and "rejected" in l for l in lines), \
        proc.stderr


@pytest.mark.parametrize("spec", [
    "memory=64MiB,bogus=1",          # unknown key: nothing applies
    "memory=64MiB,granularity=3MiB",
    "memory=0",
    "memory=64MiB,events=sometimes",
    "memory=64MiB,fail=cuNoSuch:1",
    "memory=64MiB,fail_above=lots",
    "memory=64MiB,cuMemAlloc_v2:1",  # a bare item that does not follow fail=
    "memory",
])
def test_configure_rejects_bad_specs_all_or_nothing(lib, spec):
    proc = run(lib, f"""
        init()
        assert fakecuda_configure({spec!r}.encode()) == -1
        c = report()["config"]
        assert (c["memory"], c["granularity"], c["events"], c["fail"]) == (
            80 * GiB, 2 * MiB, "timeline", "")
    """)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "fakecuda_configure" in lines[0], proc.stderr


def test_query_matches_the_report(lib):
    run(lib, """
        init()
        p = alloc(123); s = stream(); e = event()
        ok(cuEventRecord(e, s))
        g = granularity(); va = reserve(2 * g); h = create(g); ok(cuMemMap(va, g, 0, h, 0))
        h2 = create(g); ok(cuMemMap(va + g, g, 0, h2, 0)); ok(cuMemRelease(h2))
        r = report()
        for key, want in r["devices"][0].items():
            if key in ("ordinal", "primary_ctx_active"):
                continue
            assert fakecuda_query(key.encode(), 0) == want, key
        for name, n in r["calls"].items():
            assert fakecuda_query(b"calls." + name.encode(), -1) == n, name
        assert fakecuda_query(b"total_calls", -1) == r["total_calls"]
        assert fakecuda_query(b"leaks", -1) == r["leaks"]["total"] == 7
        assert fakecuda_query(b"handles_released_but_mapped", 0) == 1
        for k in ("allocations", "bytes", "streams", "events"):
            assert fakecuda_query(b"reclaimed." + k.encode(), -1) == 0
        for key, want in (("devices", 1), ("memory", 80 * GiB), ("granularity", 2 * MiB),
                          ("fail_above", 0), ("initialized", 1), ("no_host_memory", 0),
                          ("no_host_memory_keep", 64 * 1024)):
            assert fakecuda_query(key.encode(), -1) == want, key
        # unknown keys and devices
        assert fakecuda_query(b"allocations", 1) == -1
        assert fakecuda_query(b"allocations", -1) == -1
        assert fakecuda_query(b"calls.cuNoSuchThing", -1) == -1
        assert fakecuda_query(b"no_such_key", 0) == -1
        assert fakecuda_query(None, 0) == -1
        ok(cuMemUnmap(va, 2 * g)); ok(cuMemRelease(h)); ok(cuMemAddressFree(va, 2 * g))
        ok(cuMemFree_v2(p)); ok(cuEventDestroy_v2(e)); ok(cuStreamDestroy_v2(s))
        assert fakecuda_query(b"leaks", -1) == 0
        # a context reset reclaims what was made in it, and says so
        ok(cuMemAlloc_v2(C.byref(u64()), 4096))
        ok(cuDevicePrimaryCtxReset_v2(0))
        assert fakecuda_query(b"reclaimed.allocations", -1) == 1
        assert fakecuda_query(b"reclaimed.bytes", -1) == 4096
    """)


def test_query_before_cuinit(lib):
    run(lib, """
        assert fakecuda_query(b"initialized", -1) == 0
        assert fakecuda_query(b"calls.cuInit", -1) == 0
        assert fakecuda_query(b"capacity", 0) == -1     # no configuration yet
        ok(cuInit(0))
        assert fakecuda_query(b"capacity", 0) == 80 * GiB
        assert fakecuda_query(b"calls.cuInit", -1) == 1
    """)


def test_report_written_at_exit(lib, tmp_path):
    path = tmp_path / "sub" / "report.json"
    path.parent.mkdir()
    run(lib, """
        init(); alloc(4096); e = event()
    """, env={"GPUMEM_FAKECUDA_REPORT": str(path)})
    data = json.loads(path.read_text())
    assert data["leaks"]["allocations"] == 1 and data["leaks"]["events"] == 1
    assert data["config"]["report"] == str(path)
    assert sorted(p.name for p in path.parent.iterdir()) == ["report.json"]  # no temp file left
    # also when nothing leaked, and overwritten atomically
    run(lib, """
        init(); p = alloc(8); ok(cuMemFree_v2(p))
    """, env={"GPUMEM_FAKECUDA_REPORT": str(path)})
    assert json.loads(path.read_text())["leaks"]["total"] == 0
    # a relative path is taken relative to the directory at cuInit
    run(lib, """
        init(); os.chdir("/")
    """, env={"GPUMEM_FAKECUDA_REPORT": "rel.json"}, cwd=tmp_path)
    written = json.loads((tmp_path / "rel.json").read_text())["config"]["report"]
    assert Path(written).resolve() == (tmp_path / "rel.json").resolve()


def test_forked_child_does_not_write_the_report(lib, tmp_path):
    path = tmp_path / "report.json"
    run(lib, """
        init(); p = alloc(64)
        pid = os.fork()
        if pid == 0:
            ok(cuMemFree_v2(p))        # the child's copy of the driver works ...
            sys.exit(0)                # ... and exits normally, running destructors
        _, status = os.waitpid(pid, 0)
        assert status == 0
        assert not os.path.exists(os.environ["GPUMEM_FAKECUDA_REPORT"])
        os._exit(0)                    # the parent skips its own report
    """, env={"GPUMEM_FAKECUDA_REPORT": str(path)})
    assert not path.exists()


@pytest.mark.parametrize("code,name,text", [
    (0, "CUDA_SUCCESS", "no error"),
    (1, "CUDA_ERROR_INVALID_VALUE", "invalid argument"),
    (2, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"),
    (3, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"),
    (100, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"),
    (101, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"),
    (201, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"),
    (400, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"),
    (600, "CUDA_ERROR_NOT_READY", "device not ready"),
    (709, "CUDA_ERROR_CONTEXT_IS_DESTROYED", "context is destroyed"),
    (801, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"),
    (999, "CUDA_ERROR_UNKNOWN", "unknown error"),
])
def test_error_strings(lib, code, name, text):
    run(lib, f"""
        s = C.c_char_p()
        ok(cuGetErrorName({code}, C.byref(s))); assert s.value == {name.encode()!r}, s.value
        ok(cuGetErrorString({code}, C.byref(s))); assert s.value == {text.encode()!r}, s.value
    """)


def test_error_strings_cover_every_cuda_h_code_and_reject_unknown(lib):
    run(lib, """
        s = C.c_char_p(b"x")
        ok(cuGetErrorString(12345, C.byref(s)), INVALID_VALUE); assert s.value is None
        s = C.c_char_p(b"x")
        ok(cuGetErrorName(-1, C.byref(s)), INVALID_VALUE); assert s.value is None
        ok(cuGetErrorName(0, None), INVALID_VALUE)
        ok(cuGetErrorString(0, None), INVALID_VALUE)
        codes = [0, 1, 2, 3, 4, 5, 6, 7, 8, 34, 36, 46, 100, 101, 102, 200, 201, 202] + \
                list(range(205, 227)) + list(range(300, 305)) + [400, 401, 402, 500, 600] + \
                list(range(700, 706)) + list(range(708, 722)) + list(range(800, 813)) + \
                list(range(900, 917)) + [999]
        for c in codes:
            s = C.c_char_p(); ok(cuGetErrorName(c, C.byref(s)), what=str(c)); assert s.value.startswith(b"CUDA_")
            t = C.c_char_p(); ok(cuGetErrorString(c, C.byref(t)), what=str(c)); assert t.value
        for c in (9, 35, 203, 204, 706, 707, 1000):
            ok(cuGetErrorName(c, C.byref(C.c_char_p())), INVALID_VALUE)
    """)


def test_threads_share_state_safely(lib):
    run(lib, """
        ctx = init()
        errors = []
        def worker(k):
            try:
                ok(cuCtxSetCurrent(ctx))
                for i in range(300):
                    p = alloc(4096 + i)
                    put(p, b"%d" % i)
                    s = stream(); e = event()
                    ok(cuEventRecord(e, s)); ok(cuEventQuery(e))
                    ok(cuEventDestroy_v2(e)); ok(cuStreamDestroy_v2(s))
                    ok(cuMemFree_v2(p))
            except BaseException as exc:
                errors.append(exc)
        ts = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
        for t in ts: t.start()
        for t in ts: t.join()
        assert not errors, errors
        r = report()
        assert r["leaks"]["total"] == 0
        assert r["calls"]["cuMemAlloc_v2"] == 2400 and r["calls"]["cuEventDestroy_v2"] == 2400
    """)
