"""PyTorch's official CUDA build on the simulated GPU (simgpu/, gpumem.sim).

Each test runs a snippet in a subprocess under the simulator
(gpumem.sim.run_snippet: the fake libcuda/libcudart/libcublas[Lt]/libcudnn are
LD_PRELOADed) and checks the JSON it prints. Skipped, with the reason, when
torch (CUDA 13 build) is not importable or there is no C compiler.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from sim_helpers import ROOT, needs_torch, run_sim, sim_lib_dir

pytestmark = needs_torch


def test_tensors_streams_events_and_copies():
    out = run_sim(textwrap.dedent('''
        import torch
        o = {"available": torch.cuda.is_available(), "count": torch.cuda.device_count()}
        p = torch.cuda.get_device_properties(0)
        o["props"] = [p.name, p.total_memory, p.major, p.minor, p.multi_processor_count]
        a = torch.empty(1000, device="cuda")
        z = torch.zeros(10, device="cuda")
        o["devices"] = [str(a.device), str(z.device)]
        del a, z
        src = torch.arange(1000, dtype=torch.float32)
        d = src.to("cuda")
        o["roundtrip"] = torch.equal(d.cpu(), src)
        i64 = torch.arange(-5, 5, dtype=torch.int64)
        o["int64"] = torch.equal(i64.cuda().cpu(), i64)
        o["clone_d2d"] = torch.equal(d.clone().cpu(), src)
        pinned = torch.arange(100, dtype=torch.float32).pin_memory()
        g = pinned.to("cuda", non_blocking=True)
        torch.cuda.synchronize()
        o["pinned"] = torch.equal(g.cpu(), pinned)
        s, s2 = torch.cuda.Stream(), torch.cuda.Stream(priority=-1)
        o["streams"] = [s.cuda_stream != s2.cuda_stream, s.cuda_stream != 0, s2.priority]
        e1, e2 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(s):
            e1.record()
            t = torch.empty(4096, device="cuda")
            e2.record()
        e2.synchronize()
        o["events"] = [e2.query(), e1.elapsed_time(e2) >= 0.0]
        s.wait_stream(torch.cuda.current_stream())
        t.record_stream(torch.cuda.current_stream())
        del t
        s.synchronize()
        torch.cuda.synchronize()
        r = report()
        o["stubs_hit"] = r["stubs_hit"]
        o["launches"] = r["kernels"]["launches"]
        o["registered_functions"] = r["kernels"]["functions"]
        emit(o)
    '''))
    assert out["available"] is True and out["count"] == 1
    assert out["props"] == ["NVIDIA H100 80GB HBM3", 80 << 30, 9, 0, 132]
    assert out["devices"] == ["cuda:0", "cuda:0"]
    assert out["roundtrip"] and out["int64"] and out["clone_d2d"] and out["pinned"]
    assert out["streams"] == [True, True, -1]
    assert out["events"] == [True, True]
    assert out["stubs_hit"] == []  # nothing unimplemented was called
    assert out["launches"] >= 1  # zeros() launched a (no-op) kernel
    assert out["registered_functions"] > 10000  # libtorch_cuda's kernels registered at import


@pytest.mark.slow
def test_two_devices_and_peer_copies():
    out = run_sim(textwrap.dedent('''
        import torch
        a = torch.arange(10.0).to("cuda:1")  # a copy; arange on the device would be a no-op kernel
        b = a.to("cuda:0")
        with torch.cuda.device(1):
            x = torch.empty(1 << 20, dtype=torch.uint8, device="cuda")
        emit({"count": torch.cuda.device_count(), "copy": torch.equal(b.cpu(), torch.arange(10.0)),
              "where": [a.device.index, b.device.index, x.device.index],
              "free_total_1": list(torch.cuda.mem_get_info(1)),
              "allocated": [torch.cuda.memory_allocated(0), torch.cuda.memory_allocated(1)],
              "stubs_hit": report()["stubs_hit"]})
    '''), devices=2, memory="2GiB")
    assert out["count"] == 2
    assert out["copy"] is True
    assert out["where"] == [1, 0, 1]
    free, total = out["free_total_1"]
    assert total == 2 << 30 and 0 < free < total
    assert out["allocated"] == [512, 512 + (1 << 20)]
    assert out["stubs_hit"] == []


@pytest.mark.slow
def test_device_count_before_cuda_init_comes_from_the_fake_nvml():
    # torch.cuda.device_count() asks NVML first; on a machine with real GPUs
    # the real NVML would count those.
    out = run_sim(textwrap.dedent('''
        import torch
        before = torch.cuda.device_count()
        initialized = torch.cuda.is_initialized()
        emit({"before": before, "initialized": initialized, "runtime": torch._C._cuda_getDeviceCount()})
    '''), devices=3)
    assert out == {"before": 3, "initialized": False, "runtime": 3}


@pytest.mark.slow
def test_caching_allocator_with_expandable_segments():
    out = run_sim(textwrap.dedent('''
        import torch
        MiB = 1 << 20
        torch.cuda.memory._record_memory_history(max_entries=10000)
        a = torch.empty(3 * MiB, dtype=torch.uint8, device="cuda")
        b = torch.empty(50 * MiB, dtype=torch.uint8, device="cuda")
        reserved = torch.cuda.memory_reserved()
        del b
        torch.cuda.empty_cache()
        snap = torch.cuda.memory._snapshot()
        r = report()
        emit({"reserved": reserved, "after": torch.cuda.memory_reserved(),
              "actions": sorted({e["action"] for t in snap["device_traces"] for e in t}),
              "runtime_malloc": r["calls"].get("cudaMalloc", 0),
              "driver": [r["driver"]["calls"]["cuMemCreate"], r["driver"]["calls"]["cuMemMap"]],
              "mapped": r["driver"]["devices"][0]["bytes_mapped"]})
    '''), env={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"})
    MiB = 1 << 20
    assert out["reserved"] >= 53 * MiB and out["after"] < out["reserved"]
    assert {"segment_map", "segment_unmap"} <= set(out["actions"])
    assert out["runtime_malloc"] == 0  # all through the driver's VMM calls
    assert out["driver"][0] > 0 and out["driver"][1] > 0
    assert out["mapped"] == out["after"]


@pytest.mark.slow
def test_caching_allocator_stats_snapshot_and_oom():
    out = run_sim(textwrap.dedent('''
        import torch
        MiB = 1 << 20
        torch.cuda.memory._record_memory_history(max_entries=100000)
        a = torch.empty(MiB, dtype=torch.uint8, device="cuda")
        b = torch.empty(30 * MiB, dtype=torch.uint8, device="cuda")
        st = torch.cuda.memory_stats()
        o = {"allocated": torch.cuda.memory_allocated(), "reserved": torch.cuda.memory_reserved(),
             "segments": st["segment.all.current"], "allocations": st["allocation.all.current"]}
        del b
        o["after_del"] = [torch.cuda.memory_allocated(), torch.cuda.memory_reserved()]
        torch.cuda.empty_cache()
        o["after_empty_cache"] = torch.cuda.memory_reserved()
        try:
            torch.empty(5 << 30, dtype=torch.uint8, device="cuda")
        except torch.cuda.OutOfMemoryError as e:
            o["oom"] = str(e)
            o["oom_class"] = [type(e).__name__, isinstance(e, RuntimeError)]
        c = torch.empty(MiB, dtype=torch.uint8, device="cuda")  # the device still works
        snap = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(enabled=None)
        o["actions"] = sorted({e["action"] for t in snap["device_traces"] for e in t})
        o["snapshot_segments"] = sorted(s["total_size"] for s in snap["segments"])
        o["num_ooms"] = torch.cuda.memory_stats()["num_ooms"]
        dev = report()["driver"]["devices"][0]
        ctx = dev["bytes_context"]  # the CUDA context's share, held since CUDA initialised
        o["driver"] = [dev["capacity"], dev["bytes_used"] - ctx, dev["peak_bytes_used"] - ctx]
        emit(o)
    '''), memory="4GiB")
    MiB = 1 << 20
    assert out["allocated"] == 31 * MiB
    assert out["reserved"] == 2 * MiB + 30 * MiB  # a 2 MiB small-pool segment, one 30 MiB segment
    assert out["segments"] == 2 and out["allocations"] == 2
    assert out["after_del"] == [MiB, 32 * MiB]
    assert out["after_empty_cache"] == 2 * MiB
    assert out["oom"].startswith("CUDA out of memory. Tried to allocate 5.00 GiB. GPU 0 has a total "
                                 "capacity of 4.00 GiB of which ")
    assert "is allocated by PyTorch" in out["oom"]
    assert out["oom_class"] == ["OutOfMemoryError", True]
    assert out["num_ooms"] == 1
    assert {"alloc", "free_requested", "free_completed", "segment_alloc", "segment_free",
            "oom"} <= set(out["actions"])
    assert out["snapshot_segments"] == [2 * MiB]  # both 1 MiB blocks share the small segment
    assert out["driver"][0] == 4 << 30
    assert out["driver"][1] == 2 * MiB  # what the fake device holds is what torch reserved
    assert out["driver"][2] == 32 * MiB


@pytest.mark.slow
@pytest.mark.parametrize("mode,expected", [
    ("immediate", [True, True, True, True, True]),
    ("never", [False, False, False, False, True]),   # reusable only after a synchronize
    ("after:2", [False, False, True, True, True]),    # after two polls of the event
])
def test_record_stream_reuse_waits_for_the_event(mode, expected):
    out = run_sim(textwrap.dedent('''
        import torch
        n = 4 << 20
        side = torch.cuda.Stream()
        x = torch.empty(n, dtype=torch.uint8, device="cuda")
        first = x.data_ptr()
        x.record_stream(side)          # the block is in use on `side` until its event completes
        del x
        reuse = []
        for _ in range(4):
            y = torch.empty(n, dtype=torch.uint8, device="cuda")
            reuse.append(y.data_ptr() == first)
            del y
        torch.cuda.synchronize()
        z = torch.empty(n, dtype=torch.uint8, device="cuda")
        reuse.append(z.data_ptr() == first)
        emit({"reuse": reuse, "pending": report()["driver"]["devices"][0]["events_pending"]})
    '''), events=mode)
    assert out["reuse"] == expected
    assert out["pending"] == 0


@pytest.mark.slow
def test_training_loop_runs_unchanged_and_peaks_repeat():
    out = run_sim(textwrap.dedent('''
        import pickle
        import torch
        import torch.cuda._memory_viz as memory_viz
        torch.manual_seed(0)
        model = torch.nn.Transformer(d_model=64, nhead=4, num_encoder_layers=2, num_decoder_layers=2,
                                     dim_feedforward=256, batch_first=True).cuda()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        src = torch.randn(8, 32, 64, device="cuda")
        tgt = torch.randn(8, 32, 64, device="cuda")
        torch.cuda.memory._record_memory_history(max_entries=200000)
        peaks, reserved, allocated = [], [], []
        for _ in range(4):
            torch.cuda.reset_peak_memory_stats()
            loss = model(src, tgt).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            torch.cuda.synchronize()
            st = torch.cuda.memory_stats()
            peaks.append(st["allocated_bytes.all.peak"])
            reserved.append(st["reserved_bytes.all.current"])
            allocated.append(st["allocated_bytes.all.current"])
        snap = pickle.loads(pickle.dumps(torch.cuda.memory._snapshot()))
        torch.cuda.memory._record_memory_history(enabled=None)
        stats, trace = memory_viz.segsum(snap), memory_viz.trace(snap)
        html = memory_viz.trace_plot(snap) + memory_viz.segment_plot(snap)
        r = report()
        emit({"peaks": peaks, "reserved": reserved, "allocated": allocated,
              "loss_is_tensor": isinstance(loss.item(), float),
              "stats": stats.splitlines()[:1], "trace_lines": len(trace.splitlines()),
              "html": len(html), "state": len(opt.state),
              "stubs_hit": r["stubs_hit"] + r["cublas"]["stubs_hit"] + r["cublasLt"]["stubs_hit"],
              "gemms": [r["cublas"]["calls"].get("cublasSgemm_v2", 0), r["cublasLt"]["matmuls"]]})
    '''))
    peaks, reserved, allocated = out["peaks"], out["reserved"], out["allocated"]
    # The first step creates AdamW's state; from then on every iteration is the same.
    assert peaks[1] == peaks[2] == peaks[3] > 0
    assert reserved[1] == reserved[2] == reserved[3] >= peaks[1]
    assert allocated[1] == allocated[2] == allocated[3] > allocated[0] - 1
    assert out["loss_is_tensor"] and out["state"] > 0
    assert out["stats"] and out["stats"][0].startswith("Summary of segments")
    assert out["trace_lines"] > 100 and out["html"] > 1000
    # cuBLAS GEMMs ran as no-ops (the only "stub" the loop hits); nothing else is missing.
    assert set(out["stubs_hit"]) <= {"cublasSgemm_v2", "cublasGemmEx", "cublasSgemmStridedBatched",
                                     "cublasGemmStridedBatchedEx"}, out["stubs_hit"]
    assert sum(out["gemms"]) > 0


@pytest.mark.slow   # fast tier: 120 s of CPU at most (README, Test)
def test_nothing_is_faked_without_the_launcher():
    libdir = sim_lib_dir()
    code = textwrap.dedent('''
        import json, os
        import gpumem, gpumem.sim, torch
        maps = open("/proc/self/maps").read()
        paths = sorted({l.split()[-1] for l in maps.splitlines() if "/" in l.split()[-1]})
        print(json.dumps({"paths": paths, "preload": os.environ.get("LD_PRELOAD", "")}))
    ''')
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUMEM_SIM", "LD_PRELOAD"))}
    env.pop("GPUMEM_LIBCUDA", None)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.splitlines()[-1])
    sim_dirs = (str(libdir), str(ROOT / "gpumem" / "sim" / "_lib"), str(ROOT / "build" / "sim"))
    faked = [p for p in out["paths"] if p.startswith(sim_dirs)]
    assert faked == [] and out["preload"] == ""
    # torch's CUDA libraries that did load are NVIDIA's own
    assert any(p.endswith("libcudart.so.13") for p in out["paths"])


@pytest.mark.slow
def test_launcher_runs_a_command_and_writes_a_report(tmp_path):
    report_path = tmp_path / "report.json"
    code = ("import torch; x = torch.empty(3 << 20, dtype=torch.uint8, device='cuda:1'); "
            "print(torch.cuda.device_count(), torch.cuda.mem_get_info(1)[1])")
    proc = subprocess.run([sys.executable, "-m", "gpumem.sim", "--memory", "1GiB", "--devices", "2",
                           "--report", str(report_path), "--", sys.executable, "-c", code],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["2", str(1 << 30)]
    rep = json.loads(report_path.read_text())
    devs = rep["driver"]["devices"]
    assert [d["capacity"] for d in devs] == [1 << 30, 1 << 30]
    # torch's 20 MiB segment for a 3 MiB tensor, beside the H100's 514 MiB context
    assert devs[1]["peak_bytes_used"] == (20 << 20) + (514 << 20)
    assert rep["calls"]["cudaMalloc"] == 1


@needs_torch
@pytest.mark.slow
def test_launcher_report_of_a_torchrun_job_has_every_rank(tmp_path):
    """Before, each process wrote the same file and the launcher's (no device
    used, exiting last) was what remained."""
    import socket
    sim_lib_dir()
    report_path = tmp_path / "report.json"
    (tmp_path / "rank.py").write_text(
        "import os, torch\nr = int(os.environ['RANK'])\n"
        "torch.cuda.set_device(r)\nx = torch.empty((3 + r) << 20, dtype=torch.uint8, "
        "device='cuda')\n")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.run([sys.executable, "-m", "gpumem.sim", "--devices", "2", "--memory",
                           "1GiB", "--report", str(report_path), "--", sys.executable, "-m",
                           "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
                           str(port), str(tmp_path / "rank.py")],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rep = json.loads(report_path.read_text())
    procs = rep["processes"]
    assert [p["rank"] for p in procs] == [0, 1] and rep["rank"] == 0
    assert all(p["driver"]["initialized"] for p in procs)
    # each rank's 20 MiB segment on its own device, beside the H100's 514 MiB context
    for p in procs:
        devs = p["driver"]["devices"]
        r = p["rank"]
        assert devs[r]["peak_bytes_used"] == (20 << 20) + (514 << 20), (r, devs)
        assert devs[1 - r]["peak_bytes_used"] == 0
    assert not list(tmp_path.glob("report.json.*"))   # no temporary file left


@pytest.mark.slow
def test_launcher_errors_and_exit_status(tmp_path):
    bad = subprocess.run([sys.executable, "-m", "gpumem.sim", "--memory", "lots", "--", "true"],
                         capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert bad.returncode == 2 and "bad memory size 'lots'" in bad.stderr
    status = subprocess.run([sys.executable, "-m", "gpumem.sim", "--", sys.executable, "-c",
                             "raise SystemExit(7)"], capture_output=True, text=True, timeout=120)
    assert status.returncode == 7
    env = subprocess.run([sys.executable, "-m", "gpumem.sim", "--events", "after:3", "--print-env"],
                         capture_output=True, text=True, timeout=120)
    assert env.returncode == 0
    assert "export GPUMEM_SIM_EVENTS=after:3" in env.stdout
    assert "libcudart.so.13" in env.stdout and "export LD_PRELOAD=" in env.stdout


@pytest.mark.slow
@pytest.mark.parametrize("config,want", [(None, 32 << 20),          # sm90's default, :4096:8
                                         (":16:8", 128 << 10),
                                         (":4096:2:16:8", (8 << 20) + (128 << 10))])
def test_cublas_workspace_follows_cublas_workspace_config(config, want):
    # torch parses CUBLAS_WORKSPACE_CONFIG once, at the first cuBLAS handle, and
    # allocates the workspace through its allocator; the fake cuBLAS only keeps
    # the pointer cublasSetWorkspace_v2 gives it
    env = {"CUBLAS_WORKSPACE_CONFIG": config} if config else {}
    o = run_sim(textwrap.dedent('''
        import torch
        a = torch.ones(64, 64, device="cuda")
        before = torch.cuda.memory_allocated()
        c = a @ a
        emit({"workspace": torch.cuda.memory_allocated() - before - c.numel() * 4})
    '''), env=env)
    assert o == {"workspace": want}
