"""The simulator's fake cuDNN (simgpu/cudnn, libcudnn.so.9).

Fast tests drive the library directly through ctypes in a subprocess (no
torch): the backend descriptor model rejects what cuDNN rejects, sizes
follow simgpu/README.md's "cuDNN" section, destroyed descriptors leave
nothing behind, several threads share the registry; and the project's
declarations (cudnn_api.h) agree with NVIDIA's headers where the
nvidia-cudnn wheel is installed. The slow tests run PyTorch on the simulated
GPU with cuDNN enabled: convolutions (default and benchmark), batch norm,
cuDNN attention and the ResNet-50 of seed 000, under torch's allocator and
with gpumem installed.

The torch snippets end with os._exit(0) once they printed their result:
a process that exits right after backward() may abort in PyTorch's exit
race ("terminate called without an active exception", simgpu/README.md,
Limitations), with or without cuDNN.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from sim_helpers import HAVE_CC, ROOT, needs_torch, run_sim, sim_lib_dir
from torch_helpers import run_gm

CUDNN = ROOT / "simgpu" / "cudnn"
EXIT = "\nimport sys as _sys, os as _os\n_sys.stdout.flush(); _os._exit(0)\n"

# ctypes bindings of the calls the fast tests make (prepended to their code)
CT = r'''
import ctypes as C, json, sys, threading
L = C.CDLL(sys.argv[1])
vp, i64 = C.c_void_p, C.c_int64
for name in ("cudnnBackendCreateDescriptor", "cudnnBackendSetAttribute", "cudnnBackendGetAttribute",
             "cudnnBackendFinalize", "cudnnBackendDestroyDescriptor", "cudnnBackendExecute"):
    getattr(L, name).restype = C.c_int
L.cudnnGetErrorString.restype = C.c_char_p
L.cudnnGetVersion.restype = C.c_size_t
L.cudnnBackendSetAttribute.argtypes = [vp, C.c_int, C.c_int, i64, vp]
L.cudnnBackendGetAttribute.argtypes = [vp, C.c_int, C.c_int, i64, C.POINTER(i64), vp]
L.cudnnBackendFinalize.argtypes = L.cudnnBackendDestroyDescriptor.argtypes = [vp]
L.cudnnBackendExecute.argtypes = [vp, vp, vp]
TENSOR, CONV, OPGRAPH, HEUR, CFG, ENGINE, PLAN, PACK, FWD = 17, 1, 15, 4, 3, 2, 5, 16, 10
T_HANDLE, T_DTYPE, T_BOOL, T_INT64, T_FLOAT = 0, 1, 2, 3, 4
T_PTR, T_MODE, T_HEUR, T_DESC = 6, 7, 8, 15

def create(kind):
    d = vp()
    assert L.cudnnBackendCreateDescriptor(kind, C.byref(d)) == 0
    return d

def setattr_(d, name, typ, values):
    ctype = {T_INT64: i64, T_DTYPE: C.c_int, T_MODE: C.c_int, T_HEUR: C.c_int, T_FLOAT: C.c_float,
             T_BOOL: C.c_bool, T_DESC: vp, T_PTR: vp, T_HANDLE: vp}[typ]
    arr = (ctype * max(len(values), 1))(*values)
    return L.cudnnBackendSetAttribute(d, name, typ, len(values), arr)

def tensor(uid, dims, dtype=0):
    t = create(TENSOR)
    strides = [1] * len(dims)
    for i in range(len(dims) - 2, -1, -1):
        strides[i] = strides[i + 1] * dims[i + 1]
    for name, typ, vals in ((901, T_DTYPE, [dtype]), (902, T_INT64, dims), (903, T_INT64, strides),
                            (906, T_INT64, [uid]), (900, T_INT64, [16])):
        assert setattr_(t, name, typ, vals) == 0, name
    return t

def conv_desc(pad=1, stride=1):
    c = create(CONV)
    for name, typ, vals in ((100, T_DTYPE, [0]), (101, T_MODE, [1]), (106, T_INT64, [2]),
                            (102, T_INT64, [1, 1]), (103, T_INT64, [stride, stride]),
                            (105, T_INT64, [pad, pad]), (104, T_INT64, [pad, pad])):
        assert setattr_(c, name, typ, vals) == 0, name
    assert L.cudnnBackendFinalize(c) == 0
    return c

def conv_op(x, w, y, c):
    op = create(FWD)
    for name, d in ((704, x), (703, w), (705, y), (702, c)):
        assert setattr_(op, name, T_DESC, [d.value]) == 0
    for name in (700, 701):
        assert setattr_(op, name, T_FLOAT, [1.0]) == 0
    return op

def get_int(d, name, typ=T_INT64):
    v, n = i64(-1), i64(0)
    st = L.cudnnBackendGetAttribute(d, name, typ, 1, C.byref(n), C.byref(v))
    return st, v.value

def report():
    buf = C.create_string_buffer(1 << 16)
    L.gpumem_sim_cudnn_report_json(buf, len(buf))
    return json.loads(buf.value)
'''


def run_ct(code: str) -> dict:
    """Run CT + code with the built libcudnn.so.9; the JSON its last line prints."""
    lib = sim_lib_dir() / "libcudnn.so.9"
    proc = subprocess.run([sys.executable, "-c", CT + textwrap.dedent(code), str(lib)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.splitlines()[-1])


needs_cc = pytest.mark.skipif(not HAVE_CC, reason="no C compiler")


@needs_cc
def test_backend_conv_graph_engines_workspaces_and_execute():
    out = run_ct('''
        h = vp()
        assert L.cudnnCreate(C.byref(h)) == 0
        x, w, y = tensor(1, [4, 3, 64, 64]), tensor(2, [16, 3, 3, 3]), tensor(3, [4, 16, 64, 64])
        for t in (x, w, y):
            assert L.cudnnBackendFinalize(t) == 0
        c = conv_desc()
        op = conv_op(x, w, y, c)
        assert L.cudnnBackendFinalize(op) == 0
        # the frontend destroys its descriptors once they are set: the graph keeps copies
        for d in (x, w, y, c):
            assert L.cudnnBackendDestroyDescriptor(d) == 0
        g = create(OPGRAPH)
        assert setattr_(g, 801, T_DESC, [op.value]) == 0
        assert setattr_(g, 800, T_HANDLE, [h.value]) == 0
        assert L.cudnnBackendFinalize(g) == 0
        assert L.cudnnBackendDestroyDescriptor(op) == 0
        res = {"global_count": get_int(g, 802)}
        for mode in (0, 2):   # INSTANT, FALLBACK
            heur = create(HEUR)
            assert setattr_(heur, 201, T_DESC, [g.value]) == 0
            assert setattr_(heur, 200, T_HEUR, [mode]) == 0
            assert L.cudnnBackendFinalize(heur) == 0
            n = i64(0)
            assert L.cudnnBackendGetAttribute(heur, 202, T_DESC, 0, C.byref(n), None) == 0
            cfgs = [create(CFG) for _ in range(n.value)]
            arr = (vp * n.value)(*[d.value for d in cfgs])
            got = i64(0)
            assert L.cudnnBackendGetAttribute(heur, 202, T_DESC, n.value, C.byref(got), arr) == 0
            rows = []
            for cfg in cfgs:
                eng = create(ENGINE)
                one = (vp * 1)(eng.value)
                assert L.cudnnBackendGetAttribute(cfg, 300, T_DESC, 1, C.byref(n), one) == 0
                notes = (C.c_int * 10)()
                nn = i64(0)
                assert L.cudnnBackendGetAttribute(eng, 1303, 11, 10, C.byref(nn), notes) == 0
                plan = create(PLAN)
                assert setattr_(plan, 401, T_DESC, [cfg.value]) == 0
                assert L.cudnnBackendFinalize(plan) == 0
                rows.append([get_int(eng, 1301)[1], get_int(plan, 402)[1], list(notes[:nn.value])])
                if mode == 0:
                    plans = res.setdefault("plans", [])
                    plans.append(plan)
                else:
                    L.cudnnBackendDestroyDescriptor(plan)
                L.cudnnBackendDestroyDescriptor(eng)
                L.cudnnBackendDestroyDescriptor(cfg)
            res["mode%d" % mode] = rows
            L.cudnnBackendDestroyDescriptor(heur)
        # execute the largest-workspace plan: every tensor bound, then the workspace
        plan = res.pop("plans")
        big = plan[2]
        buf = (C.c_char * 64)()
        def pack(uids, ws):
            p = create(PACK)
            assert setattr_(p, 1000, T_INT64, uids) == 0
            assert setattr_(p, 1001, T_PTR, [C.addressof(buf)] * len(uids)) == 0
            assert setattr_(p, 1003, T_PTR, [ws]) == 0
            assert L.cudnnBackendFinalize(p) == 0
            return p
        res["missing_tensor"] = L.cudnnBackendExecute(h, big, pack([1, 2], C.addressof(buf)))
        res["missing_workspace"] = L.cudnnBackendExecute(h, big, pack([1, 2, 3], None))
        res["ok"] = L.cudnnBackendExecute(h, big, pack([1, 2, 3], C.addressof(buf)))
        full = pack([1, 2, 3], C.addressof(buf))
        res["exec_null_handle"] = L.cudnnBackendExecute(None, big, full)
        res["executions"] = report()["executions"]
        print(json.dumps(res))
    ''')
    assert out["global_count"] == [0, 3]
    # Note [cuDNN workspace sizes]: x [4,3,64,64], w [16,3,3,3], y [4,16,64,64], float
    implicit, precomp, gemm = 0, 4 * 64 * 64 * 9, 4 * 4 * 3 * 9 * 64 * 64
    assert out["mode0"] == [[1, precomp, []], [0, implicit, []], [2, gemm, []]]
    assert out["mode2"] == [[0, implicit, []]]
    assert out["missing_tensor"] == 2000 and out["missing_workspace"] == 2002
    assert out["ok"] == 0 and out["exec_null_handle"] == 2002 and out["executions"] == 1


@needs_cc
def test_backend_rejects_what_cudnn_rejects():
    out = run_ct('''
        r = {}
        r["create_null"] = L.cudnnBackendCreateDescriptor(TENSOR, None)
        r["set_null_desc"] = setattr_(vp(), 901, T_DTYPE, [0])
        t = create(TENSOR)
        r["wrong_type"] = setattr_(t, 901, T_INT64, [0])            # DATA_TYPE given as INT64
        r["wrong_owner"] = setattr_(t, 100, T_DTYPE, [0])           # a convolution's attribute
        r["read_only"] = setattr_(create(PLAN), 402, T_INT64, [0])  # the plan's workspace size
        r["too_many_dims"] = setattr_(t, 902, T_INT64, [1] * 9)
        r["get_unfinalized"] = get_int(t, 906)[0]
        r["missing_attrs"] = L.cudnnBackendFinalize(t)              # only created
        x = tensor(1, [1, 3, 32, 32])
        r["tensor_ok"] = L.cudnnBackendFinalize(x)
        r["set_after_finalize"] = setattr_(x, 906, T_INT64, [7])
        r["get_uid"] = get_int(x, 906)
        r["get_wrong_type"] = get_int(x, 906, T_FLOAT)[0]
        w, c = tensor(2, [8, 3, 3, 3]), conv_desc(pad=0)
        L.cudnnBackendFinalize(w)
        y_bad = tensor(3, [1, 8, 32, 32])                             # 30x30 without padding
        L.cudnnBackendFinalize(y_bad)
        r["conv_shape"] = L.cudnnBackendFinalize(conv_op(x, w, y_bad, c))
        w_bad = tensor(4, [8, 2, 3, 3])                               # 3 channels in, 2 per group
        L.cudnnBackendFinalize(w_bad)
        y = tensor(5, [1, 8, 30, 30])
        L.cudnnBackendFinalize(y)
        r["conv_groups"] = L.cudnnBackendFinalize(conv_op(x, w_bad, y, c))
        r["conv_ok"] = L.cudnnBackendFinalize(conv_op(x, w, y, c))
        heur = create(HEUR)
        setattr_(heur, 200, T_HEUR, [0])
        r["unfinalized_ref"] = [setattr_(heur, 201, T_DESC, [create(OPGRAPH).value]),
                                L.cudnnBackendFinalize(heur)]
        g = create(OPGRAPH)
        setattr_(g, 801, T_DESC, [x.value])                           # a tensor is no operation
        r["graph_of_tensor"] = L.cudnnBackendFinalize(g)
        r["destroy_twice"] = [L.cudnnBackendDestroyDescriptor(y) for _ in range(2)]
        r["error_string"] = L.cudnnGetErrorString(2010).decode()
        r["stub"] = L.cudnnRNNForward(None)                          # not simulated
        msg = C.create_string_buffer(256)
        L.cudnnGetLastErrorString(msg, 256)
        r["stub_message"] = msg.value.decode()
        h = vp()
        r["set_stream_null"] = L.cudnnSetStream(None, None)
        r["version"] = L.cudnnGetVersion()
        print(json.dumps(r))
    ''')
    assert out["create_null"] == 2002 and out["set_null_desc"] == 2002
    assert out["wrong_type"] == 2010                                  # BAD_PARAM_ATTRIBUTE_TYPE
    assert out["wrong_owner"] == 2000 and out["too_many_dims"] == 2005
    assert out["read_only"] == 2000
    assert out["get_unfinalized"] == 2004                             # BAD_PARAM_NOT_FINALIZED
    assert out["missing_attrs"] == 2000 and out["tensor_ok"] == 0
    assert out["set_after_finalize"] == 1001               # NOT_INITIALIZED, as documented
    assert out["get_uid"] == [0, 1] and out["get_wrong_type"] == 2010
    assert out["conv_shape"] == 2008 and out["conv_groups"] == 2008   # BAD_PARAM_SHAPE_MISMATCH
    assert out["conv_ok"] == 0
    # an unfinalized graph is accepted (copied) when set and refused when used
    assert out["unfinalized_ref"] == [0, 2004]
    assert out["graph_of_tensor"] == 2000
    assert out["destroy_twice"] == [0, 2000]
    assert out["error_string"] == "CUDNN_STATUS_BAD_PARAM_ATTRIBUTE_TYPE"
    assert out["stub"] == 3000 and "not implemented by the simulator" in out["stub_message"]
    assert out["set_stream_null"] // 1000 * 1000 == 2000
    assert out["version"] == 92400


@needs_cc
def test_legacy_convolution_api():
    out = run_ct('''
        class Perf(C.Structure):
            _fields_ = [("algo", C.c_int), ("status", C.c_int), ("time", C.c_float),
                        ("memory", C.c_size_t), ("determinism", C.c_int), ("mathType", C.c_int),
                        ("reserved", C.c_int * 3)]
        ints = lambda *v: (C.c_int * len(v))(*v)
        h, x, w, c, y, y_bad = vp(), vp(), vp(), vp(), vp(), vp()
        assert L.cudnnCreate(C.byref(h)) == 0
        for d in (x, y, y_bad):
            assert L.cudnnCreateTensorDescriptor(C.byref(d)) == 0
        assert L.cudnnCreateFilterDescriptor(C.byref(w)) == 0
        assert L.cudnnCreateConvolutionDescriptor(C.byref(c)) == 0
        assert L.cudnnSetTensor4dDescriptor(x, 0, 0, 4, 3, 64, 64) == 0          # NCHW float
        assert L.cudnnSetFilterNdDescriptor(w, 0, 0, 4, ints(16, 3, 3, 3)) == 0
        one_one = ints(1, 1)
        assert L.cudnnSetConvolutionNdDescriptor(c, 2, one_one, one_one, one_one, 1, 0) == 0
        dims = ints(0, 0, 0, 0)
        assert L.cudnnGetConvolutionNdForwardOutputDim(c, x, w, 4, dims) == 0
        assert L.cudnnSetTensor4dDescriptor(y, 0, 0, *dims) == 0
        assert L.cudnnSetTensor4dDescriptor(y_bad, 0, 0, 4, 16, 62, 62) == 0
        perf, n = (Perf * 8)(), C.c_int(0)
        r = {"dims": list(dims)}
        r["v7"] = L.cudnnGetConvolutionForwardAlgorithm_v7(h, x, w, c, y, 8, C.byref(n), perf)
        r["algos"] = [[perf[i].algo, perf[i].memory, perf[i].status] for i in range(n.value)]
        r["v7_bad_y"] = L.cudnnGetConvolutionForwardAlgorithm_v7(h, x, w, c, y_bad, 8, C.byref(n),
                                                                  perf)
        size = C.c_size_t(0)
        r["ws_gemm"] = [L.cudnnGetConvolutionForwardWorkspaceSize(h, x, w, c, y, 2, C.byref(size)),
                        size.value]
        r["ws_fft"] = L.cudnnGetConvolutionForwardWorkspaceSize(h, x, w, c, y, 4, C.byref(size))
        buf = (C.c_char * 64)()
        one = C.c_float(1.0)
        r["find"] = L.cudnnFindConvolutionForwardAlgorithmEx(h, x, buf, w, buf, c, y, buf, 8,
                                                              C.byref(n), perf, buf,
                                                              C.c_size_t(4096))
        r["find_status"] = [[perf[i].algo, perf[i].status] for i in range(n.value)]
        ws = (C.c_char * size.value)()
        r["run_small_ws"] = L.cudnnConvolutionForward(h, C.byref(one), x, buf, w, buf, c, 2, ws,
                                                       C.c_size_t(64), C.byref(one), y, buf)
        r["run"] = L.cudnnConvolutionForward(h, C.byref(one), x, buf, w, buf, c, 2, ws, size,
                                              C.byref(one), y, buf)
        r["run_bad_y"] = L.cudnnConvolutionForward(h, C.byref(one), x, buf, w, buf, c, 0, None,
                                                    C.c_size_t(0), C.byref(one), y_bad, buf)
        for d in (x, y, y_bad):
            assert L.cudnnDestroyTensorDescriptor(d) == 0
        assert L.cudnnDestroyFilterDescriptor(w) == 0
        assert L.cudnnDestroyConvolutionDescriptor(c) == 0
        r["unset_after_destroy"] = L.cudnnSetTensor4dDescriptor(x, 0, 0, 1, 1, 1, 1)
        r["live"] = report()["descriptors_live"]
        print(json.dumps(r))
    ''')
    precomp, gemm = 4 * 64 * 64 * 9, 4 * 4 * 3 * 9 * 64 * 64
    assert out["dims"] == [4, 16, 64, 64] and out["v7"] == 0
    assert out["algos"] == [[1, precomp, 0], [0, 0, 0], [2, gemm, 0]]
    assert out["v7_bad_y"] == 2008 and out["ws_gemm"] == [0, gemm] and out["ws_fft"] == 3000
    # a search with a 4 KiB workspace: the algorithms needing more fail
    assert out["find"] == 0 and out["find_status"] == [[1, 4004], [0, 0], [2, 4004]]
    assert out["run_small_ws"] == 2006 and out["run"] == 0 and out["run_bad_y"] == 2008
    assert out["unset_after_destroy"] == 2000
    assert out["live"] == {"backend": 0, "tensor": 0, "filter": 0, "convolution": 0}


@needs_cc
def test_descriptors_are_freed_and_the_registry_is_thread_safe():
    out = run_ct('''
        def work(k):
            for i in range(200):
                h = vp()
                assert L.cudnnCreate(C.byref(h)) == 0
                x = tensor(1, [2, 3, 8, 8]); L.cudnnBackendFinalize(x)
                w = tensor(2, [4, 3, 3, 3]); L.cudnnBackendFinalize(w)
                y = tensor(3, [2, 4, 8, 8]); L.cudnnBackendFinalize(y)
                c = conv_desc()
                op = conv_op(x, w, y, c)
                assert L.cudnnBackendFinalize(op) == 0
                g = create(OPGRAPH)
                assert setattr_(g, 801, T_DESC, [op.value]) == 0
                assert L.cudnnBackendFinalize(g) == 0
                for d in (x, w, y, c, op, g):
                    assert L.cudnnBackendDestroyDescriptor(d) == 0
                assert L.cudnnDestroy(h) == 0
        ts = [threading.Thread(target=work, args=(k,)) for k in range(4)]
        for t in ts: t.start()
        for t in ts: t.join()
        r = report()
        print(json.dumps({"live": r["descriptors_live"], "handles": r["handles"]}))
    ''')
    assert out["live"] == {"backend": 0, "tensor": 0, "filter": 0, "convolution": 0}
    assert out["handles"] == {"created": 800, "live": 0}


# --------------------------------------------------------------------------
# cudnn_api.h against NVIDIA's headers

def _nvidia_cudnn_include():
    for entry in sys.path:
        inc = Path(entry) / "nvidia" / "cudnn" / "include"
        if (inc / "cudnn.h").is_file():
            return inc
    return None


NV = _nvidia_cudnn_include()
# What cudnn.h needs of the CUDA runtime's headers (which need the toolkit's
# crt/ headers): the three types it names.
CUDA_STAND_INS = {
    "cuda_runtime_api.h": "typedef struct CUstream_st *cudaStream_t;\n"
                          "typedef struct CUgraph_st *cudaGraph_t;\n",
    "library_types.h": "typedef enum libraryPropertyType_t { MAJOR_VERSION, MINOR_VERSION,"
                       " PATCH_LEVEL } libraryPropertyType;\n",
}
needs_headers = pytest.mark.skipif(NV is None or not HAVE_CC,
                                   reason="NVIDIA's cudnn.h (nvidia-cudnn wheel) or a C compiler "
                                          "is missing")


def _api_text():
    return (CUDNN / "cudnn_api.h").read_text()


@needs_headers
def test_declarations_match_nvidias_headers(tmp_path):
    text = _api_text()
    names = sorted(set(re.findall(r"\b(CUDNN_[A-Z0-9_x]+)\s*=", text)) - {"CUDNN_DIM_MAX"})
    types = ("cudnnConvolutionFwdAlgoPerf_t", "cudnnConvolutionBwdDataAlgoPerf_t",
             "cudnnConvolutionBwdFilterAlgoPerf_t")
    fields = ("algo", "status", "time", "memory", "determinism", "mathType", "reserved")
    lines = ["#include <stdio.h>", "#include <stddef.h>", "#ifdef NV", "#include <cudnn.h>",
             "#define V(x) x", "#else", '#include "cudnn_api.h"', "#define V(x) SIM_##x", "#endif",
             "int main(void) {"]
    lines += [f'printf("{n} %lld\\n", (long long){n});' for n in names]
    lines += [f'printf("{t} %zu\\n", sizeof({t}));' for t in types]
    lines += [f'printf("{t}.{f} %zu\\n", offsetof({t}, {f}));' for t in types for f in fields]
    lines += ['printf("version %d.%d.%d\\n", V(CUDNN_MAJOR), V(CUDNN_MINOR), V(CUDNN_PATCHLEVEL));',
              "return 0; }"]
    (tmp_path / "decls.c").write_text("\n".join(lines) + "\n")
    for name, text in CUDA_STAND_INS.items():
        (tmp_path / name).write_text(text)
    outs = []
    for name, flags in (("ours", ["-I", str(CUDNN), "-I", str(ROOT / "simgpu/cuda13"),
                                  "-I", str(ROOT / "simgpu/driver")]),
                        ("nvidia", ["-DNV", "-I", str(NV), "-I", str(tmp_path)])):
        exe = tmp_path / name
        proc = subprocess.run([os.environ.get("CC", "cc"), *flags, str(tmp_path / "decls.c"), "-o",
                               str(exe)], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr[-3000:]
        outs.append(subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout)
    assert len(names) > 100
    assert outs[0] == outs[1]


def _prototypes(text):
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    text = re.sub(r"\b(CUDNNWINAPI|CUDNN_DEPRECATED)\b", "", text)
    out = {}
    for ret, name, args in re.findall(r"(cudnnStatus_t|size_t|const char\s*\*|void)\s*(cudnn\w+)\s*"
                                      r"\(([^;{]*?)\)\s*;", text, re.S):
        params = [re.sub(r"\s*(\w+)(\[\])?$", r"\2", " ".join(p.split()))
                  for p in args.split(",")]
        out[name] = ("".join(ret.split()), [p.replace(" *", "*").replace("* ", "*")
                                             for p in params])
    return out


@needs_headers
def test_every_declared_function_has_nvidias_prototype():
    ours = _prototypes(_api_text())
    theirs = {}
    for h in ("cudnn_graph.h", "cudnn_ops.h", "cudnn_cnn.h"):
        theirs.update(_prototypes((NV / h).read_text()))
    assert len(ours) > 60
    for name, proto in ours.items():
        assert theirs.get(name) == proto, (name, proto, theirs.get(name))


# --------------------------------------------------------------------------
# PyTorch on the simulated GPU

CUDNN_REPORT = r'''
def cudnn_report():
    lib = _ct.CDLL("libcudnn.so.9")
    buf = _ct.create_string_buffer(1 << 20)
    lib.gpumem_sim_cudnn_report_json(buf, len(buf))
    return _json.loads(buf.value)
'''

# conv2d forward and backward twice with the same shapes; the workspaces
# allocated by torch (the snapshot's alloc events) and the plans finalized
CONV = CUDNN_REPORT + r'''
import torch
torch.backends.cudnn.benchmark = BENCHMARK
assert torch.backends.cudnn.is_acceptable(torch.empty(1, device="cuda"))
m = torch.nn.Conv2d(3, 16, 3, padding=1).cuda()
x = torch.randn(4, 3, 64, 64, device="cuda", requires_grad=True)
torch.cuda.memory._record_memory_history(max_entries=100000)
plans = []
for _ in range(2):
    y = m(x)
    y.sum().backward()
    torch.cuda.synchronize()
    plans.append(cudnn_report()["plans_finalized"])
snap = torch.cuda.memory._snapshot()
sizes = sorted({e["size"] for t in snap["device_traces"] for e in t if e["action"] == "alloc"})
r = cudnn_report()
emit({"plans": plans, "sizes": sizes, "executions": r["executions"], "stubs": r["stubs_hit"],
      "version": torch.backends.cudnn.version(), "peak": torch.cuda.max_memory_allocated(),
      "y": list(y.shape), "grad": list(x.grad.shape)})
''' + EXIT

GEMM_WS = 4 * 4 * 3 * 9 * 64 * 64     # engine 2 of the forward conv (Note [cuDNN workspace sizes])


def _conv(benchmark, allocator):
    code = CONV.replace("BENCHMARK", str(benchmark))
    if allocator == "gpumem":
        return run_gm(code)
    return run_sim(code)


@needs_torch
@pytest.mark.slow
@pytest.mark.parametrize("allocator", ["torch", "gpumem"])
@pytest.mark.parametrize("cudnn_benchmark", [False, True], ids=["default", "benchmark"])
def test_conv2d_forward_backward(cudnn_benchmark, allocator):
    out = _conv(cudnn_benchmark, allocator)
    assert out["version"] == 92400 and out["stubs"] == []
    assert out["y"] == [4, 16, 64, 64] and out["grad"] == [4, 3, 64, 64]
    # forward, backward data, backward filter; the second iteration reuses torch's cached plans
    assert out["plans"][0] > 0 and out["plans"][1] == out["plans"][0]
    if cudnn_benchmark:
        # the search allocates the largest candidate's workspace through the allocator
        assert GEMM_WS in out["sizes"], out["sizes"]
        assert out["executions"] > 6            # every candidate plan was timed
    else:
        assert GEMM_WS not in out["sizes"]
        assert out["executions"] == 6           # 3 convolutions x 2 iterations


@needs_torch
@pytest.mark.slow
def test_batch_norm_training_and_eval():
    out = run_sim(CUDNN_REPORT + textwrap.dedent(r'''
        import torch
        bn = torch.nn.BatchNorm2d(16).cuda()
        x = torch.randn(8, 16, 32, 32, device="cuda", requires_grad=True)
        y = bn(x)
        y.sum().backward()
        bn.eval()
        with torch.no_grad():
            z = bn(x)
        torch.cuda.synchronize()
        r = cudnn_report()
        calls = {k: v for k, v in r["calls"].items() if "BatchNorm" in k}
        emit({"calls": calls, "stubs": r["stubs_hit"], "shapes": [list(y.shape), list(z.shape),
              list(x.grad.shape), list(bn.weight.grad.shape)]})
    ''') + EXIT)
    assert out["stubs"] == []
    assert out["calls"]["cudnnBatchNormalizationForwardTrainingEx"] == 1
    assert out["calls"]["cudnnBatchNormalizationBackwardEx"] == 1
    assert out["calls"]["cudnnBatchNormalizationForwardInference"] == 1
    assert out["calls"]["cudnnGetBatchNormalizationTrainingExReserveSpaceSize"] >= 1
    assert out["shapes"] == [[8, 16, 32, 32]] * 3 + [[16]]


@needs_torch
@pytest.mark.slow
def test_bf16_attention_on_the_cudnn_backend():
    out = run_sim(CUDNN_REPORT + textwrap.dedent(r'''
        import torch, torch.nn.functional as F
        from torch.nn.attention import sdpa_kernel, SDPBackend
        q, k, v = (torch.randn(2, 8, 128, 64, device="cuda", dtype=torch.bfloat16,
                               requires_grad=True) for _ in range(3))
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            o.sum().backward()
        torch.cuda.synchronize()
        fwd_bwd = cudnn_report()["executions"]
        default = F.scaled_dot_product_attention(q, k, v)   # no backend forced
        r = cudnn_report()
        emit({"fn": type(o.grad_fn).__name__, "default_fn": type(default.grad_fn).__name__,
              "executions": [fwd_bwd, r["executions"]], "stubs": r["stubs_hit"],
              "grads": [list(t.grad.shape) for t in (q, k, v)]})
    ''') + EXIT)
    assert out["fn"] == "ScaledDotProductCudnnAttentionBackward0"
    assert out["executions"] == [2, 3] and out["stubs"] == []
    assert out["grads"] == [[2, 8, 128, 64]] * 3
    # torch 2.14.1 prefers cuDNN attention for bf16 on an H100 (sm_90)
    assert out["default_fn"] == "ScaledDotProductCudnnAttentionBackward0"


# seed 000's ResNet-50 scripts (appendices A and B, verbatim, both allocators):
# tests/test_seed_scripts.py
