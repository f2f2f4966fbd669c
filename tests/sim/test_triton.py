"""The fake driver's modules, functions, launches, limits and tensor maps
(simgpu/driver/fakecuda_module.c, _image.c, _ptx.c, _func.c, _launch.c,
_limit.c, _tensormap.c), through ctypes against real cubins: PTX written
here and compiled by the ptxas that ships in Triton's wheel, and a kernel
compiled by Triton itself. NVIDIA's cuobjdump (in the same wheel) is the
oracle for registers and shared memory. The slow tests at the end run
torch.compile under the simulator (sim_helpers.run_sim)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from driver_helpers import fcbuild, run_json

try:
    import triton
    TRITON_BIN = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
except ImportError:  # pragma: no cover - torch's CUDA wheel brings triton
    TRITON_BIN = None

PTXAS = TRITON_BIN / "ptxas" if TRITON_BIN else None
CUOBJDUMP = TRITON_BIN / "cuobjdump" if TRITON_BIN else None
FATBINARY = shutil.which("fatbinary") or "/usr/local/cuda/bin/fatbinary"

needs_ptxas = pytest.mark.skipif(PTXAS is None or not PTXAS.exists(),
                                 reason="ptxas (Triton's wheel) not found")

# Two kernels: `small` has .maxntid 256 and 4 KiB of static shared memory;
# `plain` has no directives.
PTX = r"""
.version 8.0
.target TARGET
.address_size 64

.visible .entry small(.param .u64 p0, .param .u32 p1)
.maxntid 256, 1, 1
{
	.reg .b64 %rd<4>;
	.reg .b32 %r<4>;
	.shared .align 4 .b8 buf[4096];
	ld.param.u64 %rd1, [p0];
	ld.param.u32 %r1, [p1];
	mov.u32 %r2, %tid.x;
	shl.b32 %r3, %r2, 2;
	cvt.u64.u32 %rd2, %r3;
	mov.u64 %rd3, buf;
	add.s64 %rd3, %rd3, %rd2;
	st.shared.u32 [%rd3], %r1;
	bar.sync 0;
	ld.shared.u32 %r3, [buf+4];
	st.global.u32 [%rd1], %r3;
	ret;
}

.visible .entry plain(.param .u64 q0)
{
	.reg .b64 %rd<2>;
	ld.param.u64 %rd1, [q0];
	st.global.u32 [%rd1], 7;
	ret;
}
"""

# One Triton kernel, compiled ahead of time (TRITON_KERNEL) and launched by
# Triton under the simulator (TRITON_LAUNCH).
ADD_KERNEL = r'''
@triton.jit
def add(x, y, o, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(o + offs, tl.load(x + offs, mask=m) + tl.load(y + offs, mask=m), mask=m)
'''

TRITON_KERNEL = r'''
import sys, json, triton, triton.language as tl
from triton.backends.compiler import GPUTarget
''' + ADD_KERNEL + r'''src = triton.compiler.ASTSource(fn=add, signature={"x": "*fp32", "y": "*fp32", "o": "*fp32",
                                "n": "i32"}, constexprs={"BLOCK": 1024})
k = triton.compile(src, target=GPUTarget("cuda", 90, 32))
open(sys.argv[1], "wb").write(k.asm["cubin"])
print(json.dumps({"name": k.metadata.name, "num_warps": k.metadata.num_warps}))
'''


@pytest.fixture(scope="module")
def lib(fakecuda):
    return fakecuda("auto")


def res_usage(cubin: Path) -> dict:
    """{kernel: {"REG": n, "SHARED": n, ...}} as NVIDIA's cuobjdump reports."""
    out = subprocess.run([str(CUOBJDUMP), "-res-usage", str(cubin)], capture_output=True,
                         text=True, check=True).stdout
    usage, fn = {}, None
    for line in out.splitlines():
        m = re.match(r"\s*Function (\S+):", line)
        if m:
            fn = m.group(1)
        elif fn and "REG:" in line:
            usage[fn] = {k: int(v) for k, v in re.findall(r"(\w+(?:\[\d\])?):(\d+)", line)}
    return usage


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    """Cubins for sm_80, sm_90, sm_90a, the PTX texts, and Triton's cubin."""
    if PTXAS is None or not PTXAS.exists():
        pytest.skip("ptxas (Triton's wheel) not found")
    d = tmp_path_factory.mktemp("images")
    smem = {}
    for arch in ("sm_80", "sm_90", "sm_90a"):
        (d / f"{arch}.ptx").write_text(PTX.replace("TARGET", arch))
        out = subprocess.run([str(PTXAS), "-v", f"-arch={arch}", str(d / f"{arch}.ptx"), "-o",
                              str(d / f"{arch}.cubin")], check=True, capture_output=True,
                             text=True).stderr
        smem[arch] = {}
        fn = None
        for line in out.splitlines():   # ptxas -v: "Used N registers, ..., M bytes smem"
            m = re.search(r"Function properties for (\w+)", line)
            fn = m.group(1) if m else fn
            m = re.search(r"(\d+) bytes smem", line)
            if m and fn:
                smem[arch][fn] = int(m.group(1))
    (d / "sm_100.ptx").write_text(PTX.replace("TARGET", "sm_100"))
    (d / "isa99.ptx").write_text(PTX.replace("8.0", "9.9").replace("TARGET", "sm_90"))
    (d / "tk.py").write_text(TRITON_KERNEL)   # @triton.jit needs a source file
    proc = subprocess.run([sys.executable, str(d / "tk.py"), str(d / "triton.cubin")],
                          capture_output=True, text=True, env={"TRITON_CACHE_DIR": str(d / "tc"),
                                                               "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr
    meta = json.loads(proc.stdout.strip().splitlines()[-1])
    fat = Path(FATBINARY)
    if fat.exists():
        subprocess.run([str(fat), f"--create={d / 'both.fatbin'}",
                        f"--image3=kind=elf,sm=80,file={d / 'sm_80.cubin'}",
                        f"--image3=kind=elf,sm=90,file={d / 'sm_90.cubin'}"], check=True)
    return {"dir": d, "triton": meta, "smem": smem}


# What the scenarios add to driver_helpers' prelude.
MODULES = r'''
IMG = os.environ["IMG_DIR"]
INVALID_IMAGE, NO_BINARY, INVALID_PTX, UNSUPPORTED_PTX = 200, 209, 218, 222
FILE_NOT_FOUND, NOT_FOUND, OUT_OF_RESOURCES = 301, 500, 701
COOP_TOO_LARGE, INVALID_CLUSTER = 720, 912
A_MAX_THREADS, A_SHARED, A_CONST, A_LOCAL, A_REGS, A_PTX, A_BINARY = 0, 1, 2, 3, 4, 5, 6
A_MAX_DYN, A_CARVEOUT = 8, 9

class LaunchAttr(C.Structure):
    _fields_ = [("id", ci), ("pad", C.c_char * 4), ("value", C.c_uint * 16)]

class LaunchConfig(C.Structure):
    _fields_ = [("grid", cu * 3), ("block", cu * 3), ("smem", cu), ("stream", vp),
                ("attrs", P(LaunchAttr)), ("numAttrs", cu)]

for _n, _a in {
    "cuModuleLoadData": [P(vp), C.c_char_p], "cuModuleLoadDataEx": [P(vp), C.c_char_p, cu, vp, vp],
    "cuModuleLoad": [P(vp), C.c_char_p], "cuModuleUnload": [vp],
    "cuModuleGetFunction": [P(vp), vp, C.c_char_p], "cuFuncGetName": [P(C.c_char_p), vp],
    "cuFuncGetAttribute": [P(ci), ci, vp], "cuFuncSetAttribute": [vp, ci, ci],
    "cuFuncSetCacheConfig": [vp, ci],
    "cuLaunchKernel": [vp, cu, cu, cu, cu, cu, cu, cu, vp, vp, vp],
    "cuLaunchCooperativeKernel": [vp, cu, cu, cu, cu, cu, cu, cu, vp, vp],
    "cuLaunchKernelEx": [P(LaunchConfig), vp, vp, vp],
    "cuOccupancyMaxActiveBlocksPerMultiprocessor": [P(ci), vp, ci, sz],
    "cuOccupancyMaxActiveClusters": [P(ci), vp, P(LaunchConfig)],
    "cuCtxSetLimit": [ci, sz], "cuCtxGetLimit": [P(sz), ci],
    "cuTensorMapEncodeTiled": [vp, ci, cu, u64, P(u64), P(u64), P(cu), P(cu), ci, ci, ci, ci],
    "cuTensorMapEncodeIm2col": [vp, ci, cu, u64, P(u64), P(u64), P(ci), P(ci), cu, cu, P(cu),
                                ci, ci, ci, ci],
    "cuEventElapsedTime_v2": [P(C.c_float), vp, vp],
}.items():
    globals()[_n] = _proto(_n, *_a)

def image(name):
    return open(os.path.join(IMG, name), "rb").read() + (b"\0" if name.endswith(".ptx") else b"")

def load(name):
    m = vp()
    ok(cuModuleLoadData(C.byref(m), image(name)), what=name)
    return m

def func(m, name):
    f = vp()
    ok(cuModuleGetFunction(C.byref(f), m, name.encode()), what=name)
    return f

def attr(f, a):
    v = ci(-1)
    ok(cuFuncGetAttribute(C.byref(v), a, f), what=f"attr {a}")
    return v.value

def launch(f, grid=(1, 1, 1), block=(32, 1, 1), smem=0, s=None, params=True, extra=None):
    arg = C.c_uint64(0)
    kp = (vp * 1)(C.cast(C.byref(arg), vp)) if params else None
    return cuLaunchKernel(f, *grid, *block, smem, s, kp, extra)

def launch_ex(f, grid, block, attrs=(), smem=0):
    arr = (LaunchAttr * max(1, len(attrs)))()
    for i, (aid, vals) in enumerate(attrs):
        arr[i].id = aid
        for j, v in enumerate(vals):
            arr[i].value[j] = v
    cfg = LaunchConfig((cu * 3)(*grid), (cu * 3)(*block), smem, None, arr, len(attrs))
    return cuLaunchKernelEx(C.byref(cfg), f, None, None)
'''


def scenario(lib, images, body: str):
    return run_json(lib, MODULES + textwrap.dedent(body), {"IMG_DIR": str(images["dir"])})


def test_cubin_attributes_match_cuobjdump(lib, images):
    o = scenario(lib, images, """
        init(); m = load("sm_90.cubin")
        out = {}
        for n in ("small", "plain"):
            f = func(m, n)
            out[n] = {k: attr(f, a) for k, a in (("threads", A_MAX_THREADS), ("shared", A_SHARED),
                      ("const", A_CONST), ("local", A_LOCAL), ("regs", A_REGS), ("ptx", A_PTX),
                      ("binary", A_BINARY), ("dyn", A_MAX_DYN), ("carveout", A_CARVEOUT))}
            name = C.c_char_p(); ok(cuFuncGetName(C.byref(name), f)); out[n]["name"] = name.value.decode()
        print(json.dumps(out))
    """)
    usage = res_usage(images["dir"] / "sm_90.cubin")
    smem = images["smem"]["sm_90"]
    for n in ("small", "plain"):
        assert o[n]["name"] == n
        assert o[n]["regs"] == usage[n]["REG"]
        assert o[n]["shared"] == smem.get(n, 0)        # ptxas -v's static shared memory
        assert o[n]["local"] == usage[n]["LOCAL"]
        assert o[n]["binary"] == 90 and o[n]["ptx"] == 90
        assert o[n]["dyn"] == 49152 - o[n]["shared"]   # cuda.h's documented default
        assert o[n]["carveout"] == -1
    assert o["small"]["shared"] == 4096
    assert o["small"]["threads"] == 256               # .maxntid 256
    assert o["plain"]["threads"] == 1024


def test_triton_cubin(lib, images):
    o = scenario(lib, images, f"""
        init(); m = load("triton.cubin"); f = func(m, {images["triton"]["name"]!r})
        print(json.dumps({{"regs": attr(f, A_REGS), "threads": attr(f, A_MAX_THREADS),
                          "local": attr(f, A_LOCAL), "ok": launch(f, block=(128, 1, 1)),
                          "other": launch(f, block=(256, 1, 1))}}))
    """)
    usage = res_usage(images["dir"] / "triton.cubin")[images["triton"]["name"]]
    assert o["regs"] == usage["REG"] and o["local"] == usage["LOCAL"]
    warps = images["triton"]["num_warps"]
    assert o["threads"] == warps * 32                  # Triton's .reqntid
    assert o["ok"] == 0 and o["other"] == 1            # a block of another size: INVALID_VALUE


def test_ptx_and_file_and_fatbin_images(lib, images):
    o = scenario(lib, images, """
        init(); out = {}
        m = load("sm_80.ptx"); f = func(m, "small")
        out["ptx"] = [attr(f, A_MAX_THREADS), attr(f, A_SHARED), attr(f, A_PTX), attr(f, A_BINARY)]
        m2 = vp(); ok(cuModuleLoad(C.byref(m2), os.path.join(IMG, "sm_90.cubin").encode()))
        out["file"] = attr(func(m2, "plain"), A_REGS)
        out["missing_file"] = cuModuleLoad(C.byref(m2), b"/nonexistent/x.cubin")
        out["ex"] = cuModuleLoadDataEx(C.byref(m2), image("sm_90.cubin"), 0, None, None)
        if os.path.exists(os.path.join(IMG, "both.fatbin")):
            m3 = load("both.fatbin"); out["fatbin"] = attr(func(m3, "plain"), A_BINARY)
        print(json.dumps(out))
    """)
    assert o["ptx"] == [256, 4096, 80, 90]   # directives read; the JIT builds for the device
    assert o["missing_file"] == 301 and o["ex"] == 0
    assert o["file"] == res_usage(images["dir"] / "sm_90.cubin")["plain"]["REG"]
    if (images["dir"] / "both.fatbin").exists():
        assert o["fatbin"] == 90                        # the sm_90 cubin, not the sm_80 one


def test_module_rejections(lib, images):
    o = scenario(lib, images, """
        m = vp(); f = vp(); out = {}
        out["before_init"] = cuModuleLoadData(C.byref(m), image("sm_90.cubin"))
        init(); ok(cuCtxSetCurrent(None))
        out["no_context"] = cuModuleLoadData(C.byref(m), image("sm_90.cubin"))
        init()
        out["null_image"] = cuModuleLoadData(C.byref(m), None)
        out["null_out"] = cuModuleLoadData(None, image("sm_90.cubin"))
        out["garbage"] = cuModuleLoadData(C.byref(m), b"hello, world" * 8)
        out["sm_80_cubin"] = cuModuleLoadData(C.byref(m), image("sm_80.cubin"))
        out["sm_100_ptx"] = cuModuleLoadData(C.byref(m), image("sm_100.ptx"))
        out["isa_9_9"] = cuModuleLoadData(C.byref(m), image("isa99.ptx"))
        bad = bytearray(image("sm_90.cubin")); bad[18] = 62   # e_machine x86-64
        out["not_cuda_elf"] = cuModuleLoadData(C.byref(m), bytes(bad))
        m = load("sm_90a.cubin"); f = func(m, "plain")
        out["missing_fn"] = cuModuleGetFunction(C.byref(vp()), m, b"nope")
        ok(cuModuleUnload(m))
        v = ci()
        out["after_unload"] = [cuModuleGetFunction(C.byref(vp()), m, b"plain"),
                               cuFuncGetAttribute(C.byref(v), A_REGS, f), launch(f),
                               cuModuleUnload(m)]
        out["null_fn"] = [cuFuncGetAttribute(C.byref(v), A_REGS, None), launch(None)]
        m = load("sm_90.cubin"); f = func(m, "plain")
        ok(cuDevicePrimaryCtxReset_v2(0)); init()
        out["after_reset"] = cuFuncGetAttribute(C.byref(v), A_REGS, f)
        print(json.dumps(out))
    """)
    assert o == {"before_init": 3, "no_context": 201, "null_image": 1, "null_out": 1,
                 "garbage": 200, "sm_80_cubin": 209, "sm_100_ptx": 218, "isa_9_9": 222,
                 "not_cuda_elf": 200, "missing_fn": 500, "after_unload": [400, 400, 400, 400],
                 "null_fn": [400, 400], "after_reset": 400}


def test_function_attributes_set(lib, images):
    o = scenario(lib, images, """
        init(); m = load("sm_90.cubin"); f = func(m, "small")
        optin, shared = ci(), attr(f, A_SHARED)
        ok(cuDeviceGetAttribute(C.byref(optin), 97, 0))   # MAX_SHARED_MEMORY_PER_BLOCK_OPTIN
        out = {"optin": optin.value, "shared": shared,
               "max": cuFuncSetAttribute(f, A_MAX_DYN, optin.value - shared),
               "read": attr(f, A_MAX_DYN),
               "above": cuFuncSetAttribute(f, A_MAX_DYN, optin.value - shared + 1),
               "kept": attr(f, A_MAX_DYN),
               "mode17": cuFuncSetAttribute(f, 17, 1),       # Triton probes it; 13.0 has no 17
               "regs_readonly": cuFuncSetAttribute(f, A_REGS, 8),
               "carveout": [cuFuncSetAttribute(f, A_CARVEOUT, 50), attr(f, A_CARVEOUT),
                            cuFuncSetAttribute(f, A_CARVEOUT, 101)],
               "cache": [cuFuncSetCacheConfig(f, 1), cuFuncSetCacheConfig(f, 4)]}
        print(json.dumps(out))
    """)
    assert o["optin"] > 49152
    assert o["max"] == 0 and o["read"] == o["optin"] - o["shared"]
    assert o["above"] == 1 and o["kept"] == o["read"]
    assert o["mode17"] == 1 and o["regs_readonly"] == 1
    assert o["carveout"] == [0, 50, 1] and o["cache"] == [0, 1]


def test_launches_are_checked_and_take_device_time(lib, images):
    o = scenario(lib, images, """
        init(); m = load("sm_90.cubin"); small = func(m, "small"); plain = func(m, "plain")
        s = stream(1); a = event(0); b = event(0)
        ok(cuEventRecord(a, s))
        ok(launch(plain, grid=(1000, 1, 1), block=(1024, 1, 1), s=s))
        ok(launch(small, block=(256, 1, 1), s=s))
        ok(cuEventRecord(b, s)); ok(cuEventSynchronize(b))
        ms = C.c_float(); ok(cuEventElapsedTime_v2(C.byref(ms), a, b))
        big = ci(); ok(cuFuncSetAttribute(plain, A_MAX_DYN, 100000))
        out = {"ms": ms.value,
               "block_1025": launch(plain, block=(1025, 1, 1)),
               "grid_0": launch(plain, grid=(0, 1, 1)),
               "grid_y": launch(plain, grid=(1, 65536, 1)),
               "over_maxntid": launch(small, block=(512, 1, 1)),
               "smem_default_limit": launch(small, smem=49152),
               "smem_opted_in": launch(plain, smem=100000),
               "params_and_extra": launch(plain, extra=(vp * 1)(None)),
               "bad_stream": launch(plain, s=vp(12345)),
               "cluster_ok": launch_ex(plain, (4, 2, 1), (128, 1, 1), [(4, (2, 1, 1))]),
               "cluster_not_dividing": launch_ex(plain, (3, 1, 1), (128, 1, 1), [(4, (2, 1, 1))]),
               "cluster_too_big": launch_ex(plain, (16, 1, 1), (128, 1, 1), [(4, (16, 1, 1))]),
               "coop_ok": launch_ex(plain, (132, 1, 1), (1024, 1, 1), [(2, (1,))]),
               "coop_too_large": cuLaunchCooperativeKernel(plain, 100000, 1, 1, 1024, 1, 1, 0,
                                                           None, None),
               "launches": fakecuda_query(b"calls.cuLaunchKernel", -1)}
        print(json.dumps(out))
    """)
    assert 0.010 <= o["ms"] < 0.015                    # two kernels of 5 us, plus host calls
    assert o["block_1025"] == 1 and o["grid_0"] == 1 and o["grid_y"] == 1
    assert o["over_maxntid"] == 701
    assert o["smem_default_limit"] == 1 and o["smem_opted_in"] == 0
    assert o["params_and_extra"] == 1 and o["bad_stream"] == 400
    assert o["cluster_ok"] == 0
    assert o["cluster_not_dividing"] == 912 and o["cluster_too_big"] == 912
    assert o["coop_ok"] == 0 and o["coop_too_large"] == 720


def test_occupancy(lib, images):
    o = scenario(lib, images, """
        init(); m = load("sm_90.cubin"); small = func(m, "small"); plain = func(m, "plain")
        def occ(f, threads, smem=0):
            n = ci(-1); ok(cuOccupancyMaxActiveBlocksPerMultiprocessor(C.byref(n), f, threads, smem))
            return n.value
        cfg = LaunchConfig((cu * 3)(8, 1, 1), (cu * 3)(128, 1, 1), 0, None, None, 0)
        attrs = (LaunchAttr * 1)(); attrs[0].id = 4; attrs[0].value[0] = 2
        attrs[0].value[1] = attrs[0].value[2] = 1
        cfg.attrs = attrs; cfg.numAttrs = 1
        nc = ci(-1); ok(cuOccupancyMaxActiveClusters(C.byref(nc), plain, C.byref(cfg)))
        print(json.dumps({"plain_1024": occ(plain, 1024), "plain_64": occ(plain, 64),
                          "small_256": occ(small, 256), "small_big_smem": occ(small, 256, 40000),
                          "small_too_many_threads": occ(small, 512), "clusters": nc.value,
                          "sm": fakecuda_query(b"devices", -1)}))
    """)
    assert o["plain_1024"] == 2                        # 2048 threads per SM
    assert o["plain_64"] == 32                         # 32 blocks per SM
    assert o["small_too_many_threads"] == 0
    assert o["small_big_smem"] < o["small_256"] <= 8
    assert o["clusters"] == 16 * 132 // 2              # 16 blocks of 128 per SM, in pairs


def test_limits(lib, images):
    o = scenario(lib, images, """
        init(); v = sz()
        def get(l):
            r = cuCtxGetLimit(C.byref(v), l); return v.value if r == 0 else -r
        out = {"fifo": get(1), "heap": get(2), "stack": get(0),
               "set_fifo": cuCtxSetLimit(1, 4 << 20), "fifo_after": get(1),
               "set_cig": cuCtxSetLimit(8, 1), "set_bad": cuCtxSetLimit(99, 1),
               "l2_fetch_200": cuCtxSetLimit(5, 200)}
        ok(cuCtxSetCurrent(None)); out["no_ctx"] = cuCtxSetLimit(1, 1 << 20)
        print(json.dumps(out))
    """)
    assert o == {"fifo": 1 << 20, "heap": 8 << 20, "stack": 1024, "set_fifo": 0,
                 "fifo_after": 4 << 20, "set_cig": 1, "set_bad": 1, "l2_fetch_200": 1,
                 "no_ctx": 201}


def test_tensor_maps(lib, images):
    o = scenario(lib, images, """
        init(); ptr = alloc(1 << 20)
        buf = C.create_string_buffer(128 + 64)
        tm = (C.addressof(buf) + 63) // 64 * 64
        U64, U32 = u64 * 5, cu * 5
        def tiled(addr=ptr, rank=2, dims=(64, 64), strides=(256,), box=(32, 32), es=(1, 1),
                  dt=7, interleave=0, swizzle=0, oob=0, at=None):
            return cuTensorMapEncodeTiled(at if at is not None else tm, dt, rank, addr, U64(*dims),
                                          U64(*strides), U32(*box), U32(*es), interleave,
                                          swizzle, 0, oob)
        out = {"ok": tiled()}
        first = C.string_at(tm, 128); ok(tiled()); out["deterministic"] = first == C.string_at(tm, 128)
        out["nonzero"] = any(first)
        out.update({"addr_8": tiled(addr=ptr + 8), "stride_8": tiled(strides=(264,)),
                    "box_257": tiled(box=(32, 257)), "box_inner_8b": tiled(box=(2, 32)),
                    "rank_0": tiled(rank=0), "rank_6": tiled(rank=6),
                    "dim_0": tiled(dims=(0, 64)), "estride_9": tiled(es=(1, 9)),
                    "swizzle_32_box_128b": tiled(swizzle=1), "swizzle_128": tiled(swizzle=3),
                    "map_unaligned": tiled(at=tm + 8), "bad_type": tiled(dt=16),
                    "nan_fill_int": tiled(dt=0, box=(32, 32), oob=1),
                    "interleave_rank2": tiled(interleave=1)})
        lo, hi = (ci * 3)(-1, -1, 0), (ci * 3)(0, 0, 0)
        out["im2col"] = cuTensorMapEncodeIm2col(tm, 7, 4, ptr, U64(16, 8, 8, 2), U64(64, 512, 4096),
                                                lo, hi, 16, 32, U32(1, 1, 1, 1), 0, 0, 0, 0)
        out["im2col_swizzle"] = cuTensorMapEncodeIm2col(tm, 7, 4, ptr, U64(16, 8, 8, 2),
                                                        U64(64, 512, 4096), lo, hi, 16, 32,
                                                        U32(1, 1, 1, 1), 0, 1, 0, 0)  # 64 B > 32 B
        out["im2col_rank2"] = cuTensorMapEncodeIm2col(tm, 7, 2, ptr, U64(16, 8), U64(64), lo, hi,
                                                      16, 32, U32(1, 1), 0, 0, 0, 0)
        print(json.dumps(out))
    """)
    assert o.pop("ok") == 0 and o.pop("deterministic") and o.pop("nonzero")
    assert o.pop("swizzle_128") == 0 and o.pop("im2col") == 0
    assert all(v == 1 for v in o.values()), o


# ---- torch.compile under the simulator (slow: starts torch) ----

COMPILE_SMALL = r'''
import ctypes, json, os, time, torch
t0 = time.time()
def f(x, y):
    return torch.relu(x) * y + x.sum()
x = torch.randn(1000, device="cuda"); y = torch.randn(1000, device="cuda")
eager = f(x, y)
out = torch.compile(f)(x, y)
torch.cuda.synchronize()
L = ctypes.CDLL(os.environ["GPUMEM_LIBCUDA"]); L.fakecuda_query.restype = ctypes.c_longlong
q = lambda k: L.fakecuda_query(k.encode(), -1)
print(json.dumps({"shape": list(out.shape), "eager_shape": list(eager.shape),
                  "device": str(out.device), "dtype": str(out.dtype),
                  "modules": q("calls.cuModuleLoad") + q("calls.cuModuleLoadData")
                             + q("calls.cuModuleLoadDataEx"),
                  "launches": q("calls.cuLaunchKernel") + q("calls.cuLaunchKernelEx"),
                  "seconds": time.time() - t0}))
'''

TRAIN_STEP = r'''
import ctypes, json, math, os, time, torch, torch.nn as nn
INSTALL
t0 = time.time()
torch.manual_seed(0)
model = nn.Sequential(nn.TransformerEncoderLayer(d_model=32, nhead=2, dim_feedforward=64,
                                                 dropout=0.0, batch_first=True),
                      nn.Linear(32, 8)).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
cm = torch.compile(model)
x = torch.randn(4, 16, 32, device="cuda"); y = torch.randint(0, 8, (4, 16), device="cuda")
losses = []
for step in range(2):
    loss = nn.functional.cross_entropy(cm(x).reshape(-1, 8), y.reshape(-1))
    loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
    losses.append(loss.item())
torch.cuda.synchronize()
L = ctypes.CDLL(os.environ["GPUMEM_LIBCUDA"]); L.fakecuda_query.restype = ctypes.c_longlong
params = sum(p.numel() * p.element_size() for p in model.parameters())
print(json.dumps({"losses": losses, "finite": all(math.isfinite(v) for v in losses),
                  "allocated": torch.cuda.memory_allocated(),
                  "reserved": torch.cuda.memory_reserved(),
                  "peak": torch.cuda.max_memory_allocated(), "params": params,
                  "launches": L.fakecuda_query(b"calls.cuLaunchKernel", -1)
                              + L.fakecuda_query(b"calls.cuLaunchKernelEx", -1),
                  "seconds": time.time() - t0}), flush=True)
os._exit(0)
'''

AUTOTUNE = r'''
import json, os, re, time, torch
t0 = time.time()
def f(a, b):
    return torch.relu(a @ b)
cf = torch.compile(f, mode=os.environ["MODE"])
a = torch.randn(64, 64, device="cuda"); b = torch.randn(64, 64, device="cuda")
out = cf(a, b); torch.cuda.synchronize()
print(json.dumps({"shape": list(out.shape), "seconds": time.time() - t0}), flush=True)
os._exit(0)
'''


def _cubins(caches) -> set:
    return {p.name for p in Path(caches["TRITON_CACHE_DIR"]).rglob("*.cubin")}


def _run(code: str, caches, extra=None, timeout=900):
    from gpumem.sim import run_snippet
    env = dict(caches, **(extra or {}))
    rc, out, err = run_snippet(code, env=env, timeout=timeout)
    assert rc == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1]), err


@pytest.mark.slow
def test_compile_small_function_and_reuse_cache(compile_caches):
    first, _ = _run(COMPILE_SMALL, compile_caches)
    cubins = _cubins(compile_caches)
    assert first["shape"] == first["eager_shape"] == [1000]
    assert first["device"] == "cuda:0" and first["dtype"] == "torch.float32"
    assert first["modules"] >= 1 and first["launches"] >= 1 and cubins
    second, _ = _run(COMPILE_SMALL, compile_caches)      # a new process, warm caches
    assert _cubins(compile_caches) == cubins               # nothing compiled again
    assert second["launches"] >= 1
    print(f"\ntorch.compile small function: cold {first['seconds']:.1f}s, "
          f"warm {second['seconds']:.1f}s")


@pytest.mark.slow
def test_compiled_transformer_training_step(compile_caches):
    """Default mode, forward, backward and AdamW; then the same warm run with
    torch's allocator and with gpumem installed, side by side: the same
    memory statistics."""
    def run(install):
        code = TRAIN_STEP.replace("INSTALL", "import gpumem; gpumem.install()" if install else "")
        o, _ = _run(code, compile_caches)
        assert o["finite"] and len(o["losses"]) == 2
        assert o["launches"] > 0
        # parameters and AdamW's two moments stay allocated after the step
        assert o["allocated"] >= 3 * o["params"]
        assert o["reserved"] >= o["allocated"] and o["peak"] >= o["allocated"]
        return o
    first = run(False)                                  # compiles (cold unless cached)
    torch_warm, gpumem_warm = run(False), run(True)
    stats = ("allocated", "reserved", "peak")
    assert [gpumem_warm[k] for k in stats] == [torch_warm[k] for k in stats]
    print(f"\ncompiled Transformer step: first {first['seconds']:.1f}s (peak {first['peak']} B), "
          f"warm {torch_warm['seconds']:.1f}s with torch's allocator, "
          f"{gpumem_warm['seconds']:.1f}s with gpumem (peak {gpumem_warm['peak']} B)")


@pytest.mark.slow
def test_max_autotune_is_deterministic(tmp_path):
    """Two cold runs benchmark the same choices on the simulated timeline
    and pick the same one."""
    picks = []
    for i in range(2):
        caches = {"TRITON_CACHE_DIR": str(tmp_path / f"t{i}"),
                  "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / f"i{i}")}
        o, err = _run(AUTOTUNE, caches, {"MODE": "max-autotune-no-cudagraphs"})
        assert o["shape"] == [64, 64]
        table = re.findall(r"^\s+(\w+) ([\d.]+) ms", err, re.M)
        assert table, err[-2000:]
        picks.append((table[0][0], [t for _, t in table]))
        print(f"\nmax-autotune run {i}: {o['seconds']:.1f}s, best {table[0][0]}")
    assert picks[0] == picks[1]


def test_launcher_points_triton_at_the_fake_driver():
    from gpumem.sim import sim_env
    env = sim_env(base={"PATH": "/usr/bin"})
    assert (Path(env["TRITON_LIBCUDA_PATH"]) / "libcuda.so.1").is_file()
    assert Path(env["TRITON_LIBCUDA_PATH"]) == Path(env["GPUMEM_LIBCUDA"]).parent
    mine = sim_env(base={"PATH": "/usr/bin", "TRITON_LIBCUDA_PATH": "/opt/mine"})
    assert mine["TRITON_LIBCUDA_PATH"] == "/opt/mine"      # the user's setting wins


TRITON_LAUNCH = r'''
import ctypes, json, os, torch, triton, triton.language as tl
''' + ADD_KERNEL + r'''x = torch.ones(5000, device="cuda"); y = torch.ones(5000, device="cuda"); o = torch.empty_like(x)
add[(triton.cdiv(5000, 1024),)](x, y, o, 5000, BLOCK=1024)
bad = None
try:
    add[(1, 70000)](x, y, o, 5000, BLOCK=1024)   # grid y above 65535: the driver refuses
except Exception as e:
    bad = type(e).__name__ + ": " + str(e).splitlines()[0]
torch.cuda.synchronize()
L = ctypes.CDLL(os.environ["GPUMEM_LIBCUDA"]); L.fakecuda_query.restype = ctypes.c_longlong
print(json.dumps({"ex": L.fakecuda_query(b"calls.cuLaunchKernelEx", -1), "bad": bad}))
'''


@pytest.mark.slow
def test_triton_kernel_launches_through_tritons_launcher(compile_caches, tmp_path):
    """A @triton.jit kernel called directly: Triton builds its launcher
    against the fake libcuda.so.1 and launches with cuLaunchKernelEx."""
    script = tmp_path / "k.py"       # @triton.jit needs a source file
    script.write_text(TRITON_LAUNCH)
    from gpumem.sim import sim_env
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          env=sim_env(base=dict(__import__("os").environ, **compile_caches)),
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    o = json.loads(proc.stdout.strip().splitlines()[-1])
    assert o["ex"] == 2                                   # both reached the driver
    assert o["bad"] == "RuntimeError: Triton Error [CUDA]: invalid argument"


CORRUPT = r'''
import random
rnd = random.Random(1234)
init(); codes = {}
for src in ("sm_90.cubin", "triton.cubin", "sm_90.ptx"):
    good = bytearray(image(src))
    for i in range(int(os.environ.get("ROUNDS", "300"))):
        b = bytearray(good)
        if i % 3 == 0:
            b = b[:rnd.randrange(0, len(b))]                 # truncated
        else:
            for _ in range(rnd.randrange(1, 8)):             # a few bytes changed
                b[rnd.randrange(len(b))] = rnd.randrange(256)
        path = os.path.join(os.environ["WORK"], "x.img")
        open(path, "wb").write(bytes(b))
        m = vp(); r = cuModuleLoad(C.byref(m), path.encode())
        codes[r] = codes.get(r, 0) + 1
        if r == 0:
            for n in (b"small", b"plain", b"add"):
                f = vp()
                if cuModuleGetFunction(C.byref(f), m, n) == 0:
                    v = ci()
                    for a in range(16):
                        cuFuncGetAttribute(C.byref(v), a, f)
            ok(cuModuleUnload(m))
print(json.dumps({str(k): v for k, v in codes.items()}))
'''


def _corrupt_images(lib, images, tmp_path, env=None):
    (images["dir"] / "add.cubin").write_bytes((images["dir"] / "triton.cubin").read_bytes())
    o = run_json(lib, MODULES + CORRUPT,
                 dict({"IMG_DIR": str(images["dir"]), "WORK": str(tmp_path)}, **(env or {})))
    # clean answers only: loaded, not an image, not for this GPU, bad PTX
    assert set(o) <= {"0", "200", "209", "218", "222"}, o
    assert o.get("0", 0) > 0 and o.get("200", 0) > 0
    print("\nanswers to corrupted images:", o)
    return o


def test_corrupt_images_are_rejected_cleanly(lib, images, tmp_path):
    """Truncated and randomly changed cubins and PTX, read from files (so
    their length is known): every answer is a clean error code or a module
    whose attributes can be read; nothing crashes."""
    _corrupt_images(lib, images, tmp_path)


@pytest.mark.slow
def test_corrupt_images_under_asan(images, tmp_path):
    cc = shutil.which("cc") or shutil.which("gcc")
    flags = ["-fsanitize=address,undefined", "-fno-sanitize-recover=all",
             "-fno-omit-frame-pointer"]
    probe = tmp_path / "probe.c"
    probe.write_text("int main(void){return 0;}\n")
    if not cc or subprocess.run([cc, *flags, str(probe), "-o", str(tmp_path / "probe")],
                                capture_output=True).returncode != 0:
        pytest.skip("compiler has no ASan/UBSan")
    asan = subprocess.run([cc, "-print-file-name=libasan.so"], capture_output=True,
                          text=True).stdout.strip()
    lib = fcbuild.build_fakecuda(tmp_path / "asan", flags, cuda_include=None)
    _corrupt_images(lib, images, tmp_path, {"LD_PRELOAD": asan, "ROUNDS": "200",
                                            "ASAN_OPTIONS": "detect_leaks=0"})
