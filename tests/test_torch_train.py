"""gpumem.install() under PyTorch's CUDA build on the simulated GPU: a training
loop's memory comes from gpumem, torch.cuda's statistics agree with gpumem's,
memory_summary works, and torch's memory-history names produce snapshots
that torch.cuda._memory_viz reads."""

from __future__ import annotations

import pickle

import pytest

from torch_helpers import TRANSFORMER, run_gm, run_py

pytestmark = pytest.mark.slow  # left out of the fast tier (see pyproject.toml)


def test_training_loop_memory_comes_from_gpumem():
    o = run_gm('''
        model, opt = make_model()
        x = torch.randn(8, 16, 64, device="cuda")
        steps = measured_steps(model, opt, x, 5)
        peaks, allocated = steps["peaks"], steps["allocated"]
        # every parameter, gradient-free optimizer state and input lives in a gpumem block
        tensors = [x] + list(model.parameters())
        tensors += [v for s in opt.state.values() for v in s.values() if v.is_cuda]
        live = {b["address"] for s in gpumem.snapshot()["segments"] for b in s["blocks"]
                if b["state"] == "active_allocated"}
        owned = all(t.untyped_storage().data_ptr() in live for t in tensors)
        r = report()
        emit({"peaks": peaks, "allocated": allocated, "owned": owned, "n": len(tensors),
              "runtime": [r["calls"].get("cudaMalloc", 0), r["calls"].get("cudaFree", 0)],
              "driver_alloc": r["driver"]["calls"]["cuMemAlloc_v2"],
              # what the fake device holds, less the CUDA context's share
              "driver_used": r["driver"]["devices"][0]["bytes_used"]
              - r["driver"]["devices"][0]["bytes_context"],
              "gm": dict(gpumem.memory_stats()),
              "name": torch.cuda.memory._get_current_allocator().allocator().__class__.__name__,
              "installed": gpumem.is_installed()})
    ''', prelude=TRANSFORMER)
    assert o["installed"]
    assert o["owned"] and o["n"] > 20, o
    # torch's caching allocator never asked the runtime for memory: gpumem did, from the driver
    assert o["runtime"] == [0, 0], o["runtime"]
    assert o["driver_alloc"] == o["gm"]["num_device_alloc"] > 0
    assert o["driver_used"] == o["gm"]["reserved_bytes.all.current"]
    # the optimizer's state appears in step 1; from then on every step looks the same
    peaks = o["peaks"]
    assert peaks[0] > 0 and len(set(peaks[1:])) == 1, peaks
    assert len(set(o["allocated"][1:])) == 1, o["allocated"]


def test_torch_stats_agree_with_gpumem_patched_and_not():
    o = run_gm('''
        model, opt = make_model()
        x = torch.randn(4, 16, 64, device="cuda")
        for _ in range(3):
            train_step(model, opt, x)
        big = torch.empty(100 << 20, dtype=torch.uint8, device="cuda")
        del x, big
        torch.cuda.empty_cache()   # the 100 MiB segment goes back to the device
        gm = dict(gpumem.memory_stats())
        patched = dict(torch.cuda.memory_stats())
        routed = torch.cuda.memory_stats is gpumem.memory_stats
        funcs = [torch.cuda.memory_allocated(), torch.cuda.max_memory_allocated(),
                 torch.cuda.memory_reserved(), torch.cuda.max_memory_reserved()]
        gm_funcs = [gpumem.memory_allocated(), gpumem.max_memory_allocated(),
                    gpumem.memory_reserved(), gpumem.max_memory_reserved()]
        summary_gm = gpumem.memory_summary()
        summary_patched = torch.cuda.memory_summary()
        gpumem.uninstall_patches()
        restored = torch.cuda.memory_stats is not gpumem.memory_stats
        # torch's own functions: answered by the shim's C++ overrides
        native = dict(torch.cuda.memory_stats())
        summary_native = torch.cuda.memory_summary()
        nested = torch.cuda.memory_stats_as_nested_dict()
        torch.cuda.reset_peak_memory_stats()
        after_reset = gpumem.memory_stats()
        emit({"gm": gm, "patched": patched, "native": native, "routed": routed,
              "restored": restored, "funcs": funcs, "gm_funcs": gm_funcs,
              "summaries": [summary_gm, summary_patched, summary_native],
              "nested_alloc": nested["allocated_bytes"]["all"]["current"],
              "peak_after_reset": after_reset["allocated_bytes.all.peak"],
              "current_after_reset": after_reset["allocated_bytes.all.current"]})
    ''', prelude=TRANSFORMER)
    assert o["routed"] and o["restored"]
    gm = o["gm"]
    assert o["patched"] == gm
    assert o["native"] == gm
    assert gm["allocation.all.current"] > 0 and gm["num_device_free"] > 0  # empty_cache freed
    assert {"num_oom_rejections", "max_split_size", "oversize_segments.peak",
            "requested_bytes.small_pool.freed",
            "inactive_split_bytes.large_pool.current"} <= set(gm)
    assert gm["max_split_size"] == -1
    assert o["funcs"] == o["gm_funcs"] == [gm["allocated_bytes.all.current"],
                                            gm["allocated_bytes.all.peak"],
                                            gm["reserved_bytes.all.current"],
                                            gm["reserved_bytes.all.peak"]]
    s_gm, s_patched, s_native = o["summaries"]
    assert s_gm == s_patched == s_native
    assert "PyTorch CUDA memory summary, device ID 0" in s_gm and "from small pool" in s_gm
    assert o["nested_alloc"] == gm["allocated_bytes.all.current"]
    assert o["peak_after_reset"] == o["current_after_reset"]


def test_history_through_torch_names_is_readable_by_memory_viz(tmp_path):
    dump = tmp_path / "snap.pickle"
    o = run_gm(f'''
        from torch.cuda import _memory_viz
        torch.cuda.memory._record_memory_history(max_entries=100000)
        model, opt = make_model()
        x = torch.randn(4, 16, 64, device="cuda")
        for _ in range(3):
            train_step(model, opt, x)
        snap = torch.cuda.memory._snapshot()
        torch.cuda.memory._dump_snapshot({str(dump)!r})
        torch.cuda.memory._record_memory_history(enabled=None)
        stats_text = _memory_viz.segsum(snap)
        trace_text = _memory_viz.trace(snap)
        html = _memory_viz.trace_plot(snap)
        seg_flame = _memory_viz.segments(snap, format_flamegraph=lambda lines: lines)
        mem_flame = _memory_viz.memory(snap, format_flamegraph=lambda lines: lines)
        actions = sorted({{e["action"] for e in snap["device_traces"][0]}})
        files = {{f["filename"] for e in snap["device_traces"][0] for f in e.get("frames", [])}}
        emit({{"actions": actions, "n_events": len(snap["device_traces"][0]),
              "segments": len(snap["segments"]), "stats": stats_text[:2000],
              "trace_len": len(trace_text), "html": len(html),
              "flame": [len(seg_flame), len(mem_flame)], "has_frames": "<string>" in files,
              "settings": snap["allocator_settings"]["expandable_segments"]}})
    ''', prelude=TRANSFORMER, env={"GPUMEM_ALLOC_CONF": "expandable_segments:True"})
    assert {"alloc", "free_requested", "free_completed", "segment_map"} <= set(o["actions"]), o
    assert o["n_events"] > 50 and o["segments"] > 0
    assert "total_allocated" in o["stats"], o["stats"]
    assert o["trace_len"] > 0 and o["html"] > 1000 and min(o["flame"]) > 0
    assert o["has_frames"]  # the Python frames of the snippet were captured
    assert o["settings"] is True
    with open(dump, "rb") as f:
        data = pickle.load(f)
    assert data["device_traces"][0] and data["segments"]
    # the command line the tutorials show reads the dump
    for cmd, expect in (("stats", "total_allocated"), ("trace", "# free completed for")):
        cli = run_py(f'''
            import runpy, sys
            sys.argv = ["_memory_viz", "{cmd}", {str(dump)!r}]
            runpy.run_module("torch.cuda._memory_viz", run_name="__main__")
        ''')
        assert expect in cli.stdout, cli.stdout[:2000]
