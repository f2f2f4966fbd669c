"""The simulator's fake CUDA runtime, cuBLAS and cuBLASLt at the C level.

No torch needed: the snippets call the fakes through ctypes in a subprocess
started under the simulator (gpumem.sim.run_snippet), so the names resolve
to the preloaded fakes exactly as they would for PyTorch. Checked here: the
semantics PyTorch relies on (thread-local device, last error and launch
configuration; cudaErrorMemoryAllocation not sticky; NotReady recorded as an
error; real copies; pointer attributes; stream priorities; driver entry
points) and the "not supported, logged once" behaviour of the stubs.
"""

from __future__ import annotations

import textwrap

from sim_helpers import needs_cc, run_sim

pytestmark = needs_cc

PRELUDE = r'''
import ctypes as C, threading
rt = C.CDLL("libcudart.so.13")
cu = C.CDLL("libcuda.so.1")
vp, sz = C.c_void_p, C.c_size_t
rt.cudaGetErrorName.restype = C.c_char_p
rt.cudaGetErrorString.restype = C.c_char_p
rt.__cudaRegisterFatBinary.restype = vp
rt.__cudaRegisterFatBinary.argtypes = [vp]
rt.__cudaInitModule.restype = C.c_char
class dim3(C.Structure):
    _fields_ = [("x", C.c_uint), ("y", C.c_uint), ("z", C.c_uint)]
def malloc(n):
    p = vp()
    err = rt.cudaMalloc(C.byref(p), sz(n))
    return err, p.value
def last():
    return rt.cudaGetLastError()
o = {}
'''


def test_devices_errors_memory_and_copies(tmp_path):
    log = tmp_path / "sim.log"
    out = run_sim(PRELUDE + textwrap.dedent(r'''
        v = C.c_int()
        rt.cudaRuntimeGetVersion(C.byref(v)); o["runtime"] = v.value
        rt.cudaDriverGetVersion(C.byref(v)); o["driver"] = v.value
        rt.cudaGetDeviceCount(C.byref(v)); o["count"] = v.value
        o["bad_device"] = [rt.cudaSetDevice(7), last(), last()]
        rt.cudaDeviceGetAttribute(C.byref(v), 75, 0); major = v.value
        rt.cudaDeviceGetAttribute(C.byref(v), 76, 0); o["cc"] = [major, v.value]
        prop = C.create_string_buffer(4096)
        rt.cudaGetDeviceProperties(prop, 0)
        o["name"] = prop.raw[:256].split(b"\0")[0].decode()
        o["total"] = C.c_size_t.from_buffer_copy(prop.raw[288:296]).value
        bus = C.create_string_buffer(32); rt.cudaDeviceGetPCIBusId(bus, 32, 1)
        o["bus"] = bus.value.decode()

        # current device and last error are per thread
        rt.cudaSetDevice(1)
        seen = {}
        def worker():
            d = C.c_int(); rt.cudaGetDevice(C.byref(d)); seen["dev"] = d.value
            seen["set"] = rt.cudaSetDevice(99)
        th = threading.Thread(target=worker); th.start(); th.join()
        rt.cudaGetDevice(C.byref(v))
        o["threads"] = [seen["dev"], seen["set"], v.value, last()]
        rt.cudaSetDevice(0)

        # capacity, accounting, OOM (not sticky)
        free0, total = C.c_size_t(), C.c_size_t()
        rt.cudaMemGetInfo(C.byref(free0), C.byref(total))
        err, p = malloc(1 << 20)
        free1 = C.c_size_t(); rt.cudaMemGetInfo(C.byref(free1), C.byref(total))
        o["mem"] = [err, total.value, free0.value - free1.value]
        o["oom"] = [malloc(2 << 30)[0], rt.cudaPeekAtLastError(), last(), last()]
        o["zero"] = malloc(0)
        o["free"] = [rt.cudaFree(vp(p)), rt.cudaFree(vp(p)), last(), rt.cudaFree(None)]

        # copies really copy: H2D, D2D, D2H, default kind, memset, 2D
        err, a = malloc(4096); err, b = malloc(4096)
        src = (C.c_ubyte * 4096)(*[i % 251 for i in range(4096)])
        dst = (C.c_ubyte * 4096)()
        rt.cudaMemcpy(vp(a), src, sz(4096), 1)
        rt.cudaMemcpy(vp(b), vp(a), sz(4096), 3)
        rt.cudaMemcpy(dst, vp(b), sz(4096), 2)
        o["copy"] = bytes(dst) == bytes(src)
        rt.cudaMemset(vp(b), 7, sz(100)); rt.cudaMemcpy(dst, vp(b), sz(200), 4)
        o["memset"] = [dst[0], dst[99], dst[100]]
        err, c = malloc(4096)  # fresh memory reads as zeros
        rt.cudaMemcpy2D(vp(c), sz(64), src, sz(16), sz(16), sz(4), 1)
        rt.cudaMemcpy(dst, vp(c), sz(256), 2)
        o["copy2d"] = [bytes(dst[64:80]) == bytes(src[16:32]), dst[16], rt.cudaFree(vp(c))]
        o["bad_kind"] = [rt.cudaMemcpy(vp(b), vp(a), sz(4), 9), last()]
        o["out_of_range"] = [rt.cudaMemcpy(dst, vp(a + 4000), sz(200), 2), last()]

        # pointer attributes: device, pinned host, plain host
        attr = C.create_string_buffer(128)
        rt.cudaPointerGetAttributes(attr, vp(a + 10))
        kind, dev = C.c_int.from_buffer_copy(attr.raw[0:4]).value, C.c_int.from_buffer_copy(attr.raw[4:8]).value
        h = vp(); rt.cudaHostAlloc(C.byref(h), sz(1000), 0)
        rt.cudaPointerGetAttributes(attr, h); hkind = C.c_int.from_buffer_copy(attr.raw[0:4]).value
        rt.cudaPointerGetAttributes(attr, C.addressof(dst)); ukind = C.c_int.from_buffer_copy(attr.raw[0:4]).value
        o["attrs"] = [kind, dev, hkind, ukind, rt.cudaFreeHost(h)]

        # error names
        o["names"] = [rt.cudaGetErrorName(2).decode(), rt.cudaGetErrorString(2).decode(),
                      rt.cudaGetErrorName(600).decode(), rt.cudaGetErrorString(12345).decode()]

        # an unimplemented call: "not supported", recorded, logged once
        g = vp()
        o["unsupported"] = [rt.cudaGraphAddEmptyNode(C.byref(g), None, None, 0), last(), rt.cudaGraphAddEmptyNode(C.byref(g), None, None, 0), last()]
        r = report()
        o["stubs_hit"] = r["stubs_hit"]
        o["device0"] = r["driver"]["devices"][0]["bytes_used"]
        o["context0"] = r["driver"]["devices"][0]["bytes_context"]
        emit(o)
    '''), devices=2, memory="1GiB", env={"GPUMEM_SIM_LOG": str(log)})
    assert out["runtime"] == 13000 and out["driver"] == 13000
    assert out["count"] == 2
    assert out["bad_device"] == [101, 101, 0]
    assert out["cc"] == [9, 0]
    assert out["name"] == "NVIDIA H100 80GB HBM3" and out["total"] == 1 << 30
    assert out["bus"] == "00000000:19:00.0"
    assert out["threads"] == [0, 101, 1, 0]  # the worker's error stayed in the worker
    assert out["mem"] == [0, 1 << 30, 1 << 20]
    assert out["oom"] == [2, 2, 2, 0]  # cudaErrorMemoryAllocation, then cleared
    assert out["zero"] == [0, None]
    assert out["free"] == [0, 1, 1, 0]
    assert out["copy"] is True
    assert out["memset"] == [7, 7, 100]  # byte 100 still holds the copied data
    assert out["copy2d"] == [True, 0, 0]  # rows land at the destination pitch
    assert out["bad_kind"] == [21, 21]
    assert out["out_of_range"] == [1, 1]
    assert out["attrs"] == [2, 0, 1, 0, 0]
    assert out["names"] == ["cudaErrorMemoryAllocation", "out of memory", "cudaErrorNotReady",
                            "unrecognized error code"]
    assert out["unsupported"] == [801, 801, 801, 801]
    assert out["stubs_hit"] == ["cudaGraphAddEmptyNode"]
    # the primary context holds the default model's context memory (H100: 514 MiB)
    assert out["context0"] == 514 << 20
    assert out["device0"] == 2 * 4096 + out["context0"]
    lines = log.read_text().splitlines()
    assert [line for line in lines if "cudaGraphAddEmptyNode" in line] == [
        "gpumem-sim: libcudart.so.13: cudaGraphAddEmptyNode is not implemented by the simulator; "
        "it returned \"not supported\""]


def test_streams_events_launches_and_entry_points():
    out = run_sim(PRELUDE + textwrap.dedent(r'''
        lo, hi = C.c_int(), C.c_int()
        rt.cudaDeviceGetStreamPriorityRange(C.byref(lo), C.byref(hi))
        s1, s2 = vp(), vp()
        rt.cudaStreamCreateWithPriority(C.byref(s1), 1, -10)
        rt.cudaStreamCreateWithFlags(C.byref(s2), 0)
        pr, fl = C.c_int(), C.c_uint()
        rt.cudaStreamGetPriority(s1, C.byref(pr)); rt.cudaStreamGetFlags(s1, C.byref(fl))
        cap = C.c_int(9); rt.cudaStreamIsCapturing(s1, C.byref(cap))
        o["streams"] = [lo.value, hi.value, pr.value, fl.value, s1.value != s2.value, cap.value]
        o["dead_stream"] = [rt.cudaStreamDestroy(s2), rt.cudaStreamQuery(s2), last()]

        # events under GPUMEM_SIM_EVENTS=never: pending until synchronized;
        # NotReady is recorded as the thread's last error, like the real runtime
        e1, e2, e3 = vp(), vp(), vp()
        rt.cudaEventCreate(C.byref(e1)); rt.cudaEventCreate(C.byref(e2))
        rt.cudaEventCreateWithFlags(C.byref(e3), 2)
        rt.cudaEventRecord(e1, s1); rt.cudaEventRecord(e2, s1); rt.cudaEventRecord(e3, None)
        o["pending"] = [rt.cudaEventQuery(e2), last(), rt.cudaStreamQuery(s1), last()]
        ms = C.c_float(-1)
        o["elapsed_pending"] = rt.cudaEventElapsedTime(C.byref(ms), e1, e2)
        rt.cudaStreamSynchronize(s1)
        o["done"] = [rt.cudaEventQuery(e2), rt.cudaEventElapsedTime(C.byref(ms), e1, e2), ms.value >= 0,
                     rt.cudaEventElapsedTime(C.byref(ms), e1, e3), last()]
        o["device_sync"] = [rt.cudaDeviceSynchronize(), rt.cudaEventQuery(e3)]

        # launch configuration: a per-thread stack that hands back what was pushed
        rt.__cudaPushCallConfiguration.argtypes = [dim3, dim3, sz, vp]
        rt.__cudaPopCallConfiguration.argtypes = [vp, vp, vp, vp]
        def pop():
            g, b, sm, st = dim3(), dim3(), sz(), vp()
            err = rt.__cudaPopCallConfiguration(C.byref(g), C.byref(b), C.byref(sm), C.byref(st))
            return [err, [g.x, g.y, g.z], [b.x, b.y, b.z], sm.value, st.value == s1.value]
        rt.__cudaPushCallConfiguration(dim3(2, 3, 4), dim3(32, 1, 1), 128, s1)
        rt.__cudaPushCallConfiguration(dim3(9, 1, 1), dim3(64, 2, 1), 0, None)
        other = {}
        def worker():
            other["pop"] = rt.__cudaPopCallConfiguration(None, None, None, None)
        th = threading.Thread(target=worker); th.start(); th.join()
        o["config"] = [pop(), pop(), other["pop"], rt.__cudaPopCallConfiguration(None, None, None, None)]
        last()

        # registration and launches
        blob = C.create_string_buffer(16)
        h1 = rt.__cudaRegisterFatBinary(C.addressof(blob)); h2 = rt.__cudaRegisterFatBinary(C.addressof(blob))
        o["fatbin"] = [bool(h1), h1 != h2, ord(rt.__cudaInitModule(vp(h1)))]
        rt.cudaLaunchKernel.argtypes = [vp, dim3, dim3, vp, sz, vp]
        fn = C.cast(rt.cudaGetDeviceCount, vp)
        o["launch"] = [rt.cudaLaunchKernel(fn, dim3(1, 1, 1), dim3(256, 1, 1), None, 0, s1),
                       rt.cudaLaunchKernel(fn, dim3(1, 1, 1), dim3(2048, 1, 1), None, 0, s1), last(),
                       rt.cudaLaunchKernel(fn, dim3(1, 1, 1), dim3(32, 1, 1), None, 0, s2), last()]

        # driver entry points resolve to the fake driver's newest ABI
        f, st = vp(), C.c_int(-1)
        rt.cudaGetDriverEntryPointByVersion(b"cuMemAlloc", C.byref(f), 13000, 0, C.byref(st))
        want = C.cast(cu.cuMemAlloc_v2, vp).value
        g2, st2 = vp(1), C.c_int(-1)
        err = rt.cudaGetDriverEntryPointByVersion(b"cuNoSuchThing", C.byref(g2), 13000, 0, C.byref(st2))
        o["entry"] = [f.value == want, st.value, err, g2.value, st2.value]
        emit(o)
    '''), events="never")
    assert out["streams"] == [0, -5, -5, 1, True, 0]
    assert out["dead_stream"] == [0, 400, 400]
    assert out["pending"] == [600, 600, 600, 600]
    assert out["elapsed_pending"] == 600
    assert out["done"] == [0, 0, True, 400, 400]  # e3 has no timing
    assert out["device_sync"] == [0, 0]
    assert out["config"] == [[0, [9, 1, 1], [64, 2, 1], 0, False],
                             [0, [2, 3, 4], [32, 1, 1], 128, True], 52, 52]
    assert out["fatbin"] == [True, True, 1]
    assert out["launch"] == [0, 9, 9, 400, 400]
    assert out["entry"] == [True, 0, 0, None, 1]


def test_cublas_and_cublaslt():
    out = run_sim(PRELUDE + textwrap.dedent(r'''
        bl = C.CDLL("libcublas.so.13")
        lt = C.CDLL("libcublasLt.so.13")
        bl.cublasGetStatusString.restype = C.c_char_p
        lt.cublasLtGetVersion.restype = C.c_size_t
        h = vp()
        o["create"] = bl.cublasCreate_v2(C.byref(h))
        s = vp(); rt.cudaStreamCreate(C.byref(s))
        got = vp(); mode = C.c_int()
        o["settings"] = [bl.cublasSetStream_v2(h, s), bl.cublasGetStream_v2(h, C.byref(got)),
                         got.value == s.value, bl.cublasSetMathMode(h, 3),
                         bl.cublasGetMathMode(h, C.byref(mode)), mode.value]
        err, ws = malloc(1 << 20)
        o["workspace"] = bl.cublasSetWorkspace_v2(h, vp(ws), sz(1 << 20))
        # GEMM: a no-op that checks its handle
        o["gemm"] = [bl.cublasSgemm_v2(h, 0, 0, 4, 4, 4, None, None, 4, None, 4, None, None, 4),
                     bl.cublasSgemm_v2(vp(12345), 0, 0, 4, 4, 4, None, None, 4, None, 4, None, None, 4)]
        xt = vp()
        o["unsupported"] = [bl.cublasXtCreate(C.byref(xt)), bl.cublasGetStatusString(15).decode()]
        # vector copies really copy
        src = (C.c_float * 8)(*range(8)); dst = (C.c_float * 8)()
        err, d = malloc(64)
        bl.cublasSetVector(4, 4, src, 2, vp(d), 1); bl.cublasGetVector(4, 4, vp(d), 1, dst, 1)
        o["vector"] = list(dst)[:4]
        # cuBLASLt: heuristics offer one algorithm that fits the workspace limit
        lh, md, la, pref = vp(), vp(), vp(), vp()
        o["lt_create"] = [lt.cublasLtCreate(C.byref(lh)), lt.cublasLtMatmulDescCreate(C.byref(md), 68, 0),
                          lt.cublasLtMatrixLayoutCreate(C.byref(la), 0, C.c_uint64(4), C.c_uint64(4), C.c_int64(4)),
                          lt.cublasLtMatmulPreferenceCreate(C.byref(pref))]
        limit = C.c_uint64(0)
        lt.cublasLtMatmulPreferenceSetAttribute(pref, 1, C.byref(limit), sz(8))
        res = C.create_string_buffer(96 * 2); n = C.c_int(-1)
        st = lt.cublasLtMatmulAlgoGetHeuristic(h, md, la, la, la, la, pref, 2, res, C.byref(n))
        ws_size = C.c_size_t.from_buffer_copy(res.raw[64:72]).value
        state = C.c_int.from_buffer_copy(res.raw[72:76]).value
        got = C.c_uint64(); written = C.c_size_t()
        lt.cublasLtMatmulPreferenceGetAttribute(pref, 1, C.byref(got), sz(8), C.byref(written))
        o["heuristic"] = [st, n.value, ws_size, state, got.value, written.value]
        o["lt_matmul"] = [lt.cublasLtMatmul(lh, md, None, None, la, None, la, None, None, la, None, la,
                                            None, None, sz(0), None),
                          lt.cublasLtMatmul(vp(777), md, None, None, la, None, la, None, None, la, None, la,
                                            None, None, sz(0), None)]
        o["lt_version"] = lt.cublasLtGetVersion()
        o["destroy"] = [bl.cublasDestroy_v2(h), bl.cublasDestroy_v2(h), lt.cublasLtDestroy(lh)]
        r = report()
        o["stubs"] = [r["cublas"]["stubs_hit"], r["cublasLt"]["stubs_hit"]]
        emit(o)
    '''))
    assert out["create"] == 0
    assert out["settings"] == [0, 0, True, 0, 0, 3]
    assert out["workspace"] == 0
    assert out["gemm"] == [0, 1]  # success; CUBLAS_STATUS_NOT_INITIALIZED for a bad handle
    assert out["unsupported"] == [15, "the functionality requested is not supported"]
    assert out["vector"] == [0.0, 2.0, 4.0, 6.0]
    assert out["lt_create"] == [0, 0, 0, 0]
    assert out["heuristic"] == [0, 1, 0, 0, 0, 8]
    assert out["lt_matmul"] == [0, 1]
    assert out["lt_version"] == 130101
    assert out["destroy"] == [0, 1, 0]
    assert out["stubs"] == [["cublasSgemm_v2", "cublasXtCreate"], []]


def test_driver_runtime_level_entry_points():
    """The entry points the fake runtime builds on, called on the driver."""
    out = run_sim(PRELUDE + textwrap.dedent(r'''
        rt.cudaSetDevice(0)  # makes the primary context current
        err, a = malloc(8192)
        base, size = C.c_uint64(), C.c_size_t()
        o["range"] = [cu.cuMemGetAddressRange_v2(C.byref(base), C.byref(size), C.c_uint64(a + 100)),
                      base.value == a, size.value]
        dev, mt = C.c_int(-1), C.c_uint()
        cu.cuPointerGetAttribute(C.byref(dev), 9, C.c_uint64(a + 5))
        cu.cuPointerGetAttribute(C.byref(mt), 2, C.c_uint64(a))
        host = (C.c_uint * 8)()
        o["attr"] = [dev.value, mt.value, cu.cuPointerGetAttribute(C.byref(dev), 9, C.c_uint64(C.addressof(host)))]
        cu.cuMemsetD32_v2(C.c_uint64(a), C.c_uint(0xdeadbeef), sz(8))
        cu.cuStreamWriteValue32_v2(None, C.c_uint64(a + 4), C.c_uint(7), 0)
        cu.cuStreamWriteValue32(None, C.c_uint64(a + 8), C.c_uint(9), 0)  # torch 2.6's name
        cu.cuMemcpy(C.c_uint64(C.addressof(host)), C.c_uint64(a), sz(32))
        o["set32"] = list(host)
        o["bad"] = [cu.cuMemcpyDtoD_v2(C.c_uint64(a), C.c_uint64(C.addressof(host)), sz(4)),
                    cu.cuMemsetD32_v2(C.c_uint64(a + 2), C.c_uint(1), sz(1)),
                    cu.cuMemGetAddressRange_v2(None, None, C.c_uint64(C.addressof(host)))]
        s = vp(); cu.cuStreamCreateWithPriority(C.byref(s), 0, 3)
        pr, sid, sdev = C.c_int(), C.c_ulonglong(), C.c_int(-1)
        cu.cuStreamGetPriority(s, C.byref(pr)); cu.cuStreamGetId(s, C.byref(sid)); cu.cuStreamGetDevice(s, C.byref(sdev))
        o["stream"] = [pr.value, sid.value > 0, sdev.value]
        o["torch_only"] = [cu.cuModuleLoadData(C.byref(vp()), None), cu.cuLaunchKernel(*([None] * 11)),
                           cu.cuMemExportToShareableHandle(None, C.c_uint64(0), 1, C.c_uint64(0))]
        emit(o)
    '''))
    assert out["range"] == [0, True, 8192]
    assert out["attr"] == [0, 2, 1]  # device 0, CU_MEMORYTYPE_DEVICE; host memory: INVALID_VALUE
    assert out["set32"] == [0xdeadbeef, 7, 9] + [0xdeadbeef] * 5
    assert out["bad"] == [1, 1, 500]
    assert out["stream"] == [0, True, 0]  # priority 3 clamped into [-5, 0]
    # modules and launches are implemented (Triton's and Inductor's kernels):
    # a NULL image is INVALID_VALUE, a NULL function INVALID_HANDLE; IPC
    # export stays unsupported
    assert out["torch_only"] == [1, 400, 801]


def test_nvml_describes_the_simulated_devices():
    out = run_sim(PRELUDE + textwrap.dedent(r'''
        nv = C.CDLL("libnvidia-ml.so.1")
        nv.nvmlErrorString.restype = C.c_char_p
        n = C.c_uint()
        o["before_init"] = nv.nvmlDeviceGetCount_v2(C.byref(n))
        o["init"] = [nv.nvmlInit_v2(), nv.nvmlInit()]
        nv.nvmlDeviceGetCount_v2(C.byref(n)); o["count"] = n.value
        h, h2 = vp(), vp()
        nv.nvmlDeviceGetHandleByIndex_v2(1, C.byref(h))
        name, uuid = C.create_string_buffer(96), C.create_string_buffer(96)
        nv.nvmlDeviceGetName(h, name, 96); nv.nvmlDeviceGetUUID(h, uuid, 96)
        o["name"] = name.value.decode(); o["uuid"] = uuid.value.decode()
        o["by_uuid"] = [nv.nvmlDeviceGetHandleByUUID(uuid, C.byref(h2)), h2.value == h.value]
        o["by_pci"] = [nv.nvmlDeviceGetHandleByPciBusId_v2(b"00000000:19:00.0", C.byref(h2)), h2.value == h.value,
                       nv.nvmlDeviceGetHandleByPciBusId_v2(b"0000:77:00.0", C.byref(h2))]
        rt.cudaSetDevice(1)
        err, p = malloc(3 << 20)
        mem = (C.c_ulonglong * 3)()
        nv.nvmlDeviceGetMemoryInfo(h, mem)
        o["memory"] = list(mem)
        fabric = (C.c_ubyte * 36)()
        C.c_uint.from_buffer(fabric).value = 36 | (2 << 24)
        o["fabric"] = [nv.nvmlDeviceGetGpuFabricInfoV(h, fabric), fabric[28]]
        cnt = C.c_uint(0)
        o["procs"] = [nv.nvmlDeviceGetComputeRunningProcesses(h, C.byref(cnt), None), cnt.value]
        o["nvlink"] = nv.nvmlDeviceGetNvLinkRemoteDeviceType(h, 0, C.byref(C.c_int()))
        o["strings"] = nv.nvmlErrorString(3).decode()
        o["shutdown"] = [nv.nvmlShutdown(), nv.nvmlShutdown(), nv.nvmlShutdown()]
        emit(o)
    '''), devices=2, memory="1GiB")
    assert out["before_init"] == 1  # NVML_ERROR_UNINITIALIZED
    assert out["init"] == [0, 0] and out["count"] == 2
    assert out["name"] == "NVIDIA H100 80GB HBM3"
    assert out["uuid"] == "GPU-67706d65-6d2d-4641-8b45-435544410001"
    assert out["by_uuid"] == [0, True]
    assert out["by_pci"] == [0, True, 6]
    used = (3 << 20) + (514 << 20)  # 3 MiB allocated, and the H100's context
    assert out["memory"] == [1 << 30, (1 << 30) - used, used]  # total, free, used
    assert out["fabric"] == [0, 0]  # success, state NOT_SUPPORTED
    assert out["procs"] == [7, 1]  # INSUFFICIENT_SIZE: this process, with a context on device 1
    assert out["nvlink"] == 3 and out["strings"] == "Not Supported"
    assert out["shutdown"] == [0, 0, 1]  # reference counted
