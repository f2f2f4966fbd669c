"""CUDA graphs with gpumem installed, side by side with torch's allocator on
the simulated GPU: private pool checkpoints (torch's getCheckpointState /
setCheckpointPoolState, which the CUDA graph trees of
torch.compile(mode="reduce-overhead") use when a tree branches), a
hand-captured torch.cuda.graph step, torch.cuda.make_graphed_callables on a
small MLP's training step, and reduce-overhead training of a small MLP
whose tree gets a second path.

Each snippet runs under torch's allocator and under gpumem; memory figures
must agree, and gpumem's peak reserved must not exceed torch's. Kernels
compute nothing on the simulated GPU: these tests check memory, not values
(tests/test_torch_pools.py checks what replayed copies show).
"""

from __future__ import annotations

import pytest

from torch_helpers import run_gm
from test_torch_pools import STATS, assert_same

pytestmark = pytest.mark.slow  # left out of the fast tier (see pyproject.toml)

MLP = '''
import os
def make_mlp():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(),
                                torch.nn.Linear(64, 8)).cuda()
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)

def peaks():
    return {"peak_allocated": torch.cuda.max_memory_allocated(),
            "peak_reserved": torch.cuda.max_memory_reserved(),
            "allocated": torch.cuda.memory_allocated(),
            "reserved": torch.cuda.memory_reserved()}
'''


def both(code: str, **kw):
    """The snippet's result under torch's allocator and under gpumem."""
    prelude = STATS + MLP
    return (run_gm(code, prelude=prelude, install=False, **kw),
            run_gm(code, prelude=prelude, **kw))


def assert_peaks(t: dict, g: dict):
    assert g["peak_allocated"] == t["peak_allocated"], (t, g)
    assert g["peak_reserved"] <= t["peak_reserved"], (t, g)
    print(f"\npeak allocated / reserved: torch {t['peak_allocated']} / {t['peak_reserved']}, "
          f"gpumem {g['peak_allocated']} / {g['peak_reserved']}")


def test_checkpoint_restore_matches_torch():
    """What cudagraph trees do before recording on a new branch: the pool
    is put back as it was checkpointed, the tensors allocated since lose
    their memory to it (stale storages), and storages rebuilt from the
    checkpoint's live pointers take ownership (torch compares deleters with
    raw_deleter() on both sides)."""
    t, g = both('''
        out = {}
        pool = torch.cuda.MemPool()
        u8 = dict(dtype=torch.uint8, device="cuda")
        with torch.cuda.use_mem_pool(pool):
            a = torch.empty(1000, **u8)
            b = torch.empty(3 * MiB, **u8)
            c = torch.empty(2000, **u8)
        del c
        state = torch._C._cuda_getCheckpointState(0, pool.id)
        out["at_checkpoint"] = stats()
        out["segs_at_checkpoint"] = segs(pool.snapshot())
        with torch.cuda.use_mem_pool(pool):
            d = torch.empty(5000, **u8)
            e = torch.empty(2 * MiB, **u8)
        out["standard_deleter"] = [torch._C._has_Standard_Deleter(t.untyped_storage()._cdata)
                                   for t in (a, b, d, e)]
        pa, pb = a.data_ptr(), b.data_ptr()
        na = torch._C._construct_storage_from_data_pointer(pa, a.device, 1000)
        nb = torch._C._construct_storage_from_data_pointer(pb, b.device, 3 * MiB)
        stale = [t.untyped_storage()._cdata for t in (a, b, d, e)]
        torch._C._cuda_setCheckpointPoolState(0, state, stale, [na._cdata, nb._cdata])
        out["restored"] = stats()
        out["segs_restored"] = segs(pool.snapshot())
        out["owners"] = [torch._C._has_Standard_Deleter(s._cdata) for s in (na, nb)]
        del a, b, d, e  # they own nothing now
        out["stale_gone"] = stats()
        del na
        out["na_gone"] = stats()
        with torch.cuda.use_mem_pool(pool):
            f = torch.empty(1000, **u8)
        out["f_reuses_a"] = f.data_ptr() == pa
        del nb, f, pool
        torch.cuda.empty_cache()
        out["end"] = stats()
        emit(out)
    ''')
    assert_same(t, g)
    assert g["standard_deleter"] == [True] * 4 and g["owners"] == [True, True], g
    assert g["segs_restored"] == g["segs_at_checkpoint"], g
    assert g["restored"]["allocated_bytes.all.current"] == \
        g["at_checkpoint"]["allocated_bytes.all.current"]
    assert g["stale_gone"] == g["restored"] and g["f_reuses_a"]
    assert g["end"]["reserved_bytes.all.current"] == 0


def test_checkpoint_of_an_unknown_pool_is_refused_like_torch():
    t, g = both('''
        out = {}
        x = torch.ones(1, device="cuda")  # torch's allocator crashes on a device it has not set up
        try:
            torch._C._cuda_getCheckpointState(0, (0, 999))
        except RuntimeError as e:
            out["unknown"] = str(e).splitlines()[0]
        emit(out)
    ''')
    assert t["unknown"] == g["unknown"] == "Could not find pool of id", (t, g)


def test_hand_captured_inference_step_matches_torch():
    """A training-free step (an MLP's forward) captured by hand and
    replayed on new inputs copied into its static input."""
    t, g = both('''
        model, _ = make_mlp()
        static_x = torch.zeros(64, 32, device="cuda")
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.no_grad(), torch.cuda.stream(s):  # warm-up, as torch's docs do
            for _ in range(3):
                model(static_x)
        torch.cuda.current_stream().wait_stream(s)
        torch.cuda.reset_peak_memory_stats()
        graph = torch.cuda.CUDAGraph()
        with torch.no_grad(), torch.cuda.graph(graph):
            static_y = model(static_x)
        out = {"captured": stats()}
        for i in range(5):
            static_x.copy_(torch.full((64, 32), float(i)))
            graph.replay()
        torch.cuda.synchronize()
        out.update(peaks())
        out["replayed"] = stats()
        out["y_in_graph_pool"] = pool_of(static_y)[0] != 0
        del graph, static_y
        torch.cuda.empty_cache()
        out["graph_gone"] = stats()
        emit(out)
    ''')
    assert_same(t, g)
    assert_peaks(t, g)
    assert g["y_in_graph_pool"] and g["captured"] == g["replayed"], g


def test_make_graphed_callables_mlp_training_matches_torch():
    t, g = both('''
        model, opt = make_mlp()
        x = torch.randn(16, 32, device="cuda")
        torch.cuda.reset_peak_memory_stats()
        graphed = torch.cuda.make_graphed_callables(model, (x,))
        out = {"after_capture": stats()}
        for _ in range(4):
            loss = graphed(x).float().pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        out.update(peaks())
        out["trained"] = stats()
        emit(out)
        import sys; sys.stdout.flush(); os._exit(0)
    ''')
    assert_same(t, g)
    assert_peaks(t, g)
    # AdamW's state (two moments per parameter) stayed allocated
    assert g["trained"]["allocated_bytes.all.current"] > \
        g["after_capture"]["allocated_bytes.all.current"]


REDUCE_OVERHEAD = '''
    from torch._dynamo.utils import counters
    from torch._inductor import config, cudagraph_trees
    # cudagraph trees then check, after every recording and restore, that the
    # pool's live blocks are exactly the live outputs, with torch's deleter
    config.triton.slow_path_cudagraph_asserts = True
    model, opt = make_mlp()
    compiled = torch.compile(model, mode="reduce-overhead")
    def step(x):
        loss = compiled(x).float().pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    torch.cuda.reset_peak_memory_stats()
    for _ in range(4):
        step(torch.randn(16, 32, device="cuda"))
    for _ in range(3):  # another shape: the tree records a second path
        step(torch.randn(24, 32, device="cuda"))
    with torch.no_grad():  # inference: another graph again
        for _ in range(3):
            compiled(torch.randn(16, 32, device="cuda"))
    torch.cuda.synchronize()
    out = peaks()
    manager = cudagraph_trees.get_container(0).tree_manager
    out["checkpoints_restored"] = manager.debug_checkpointing_counter
    out["skips"] = counters["inductor"]["cudagraph_skips"]
    out["recorded"] = counters["inductor"]["cudagraph_recorded_non_static_inputs"]
    emit(out)
    import sys; sys.stdout.flush(); os._exit(0)
'''


def test_reduce_overhead_training_matches_torch(compile_caches):
    """torch.compile(mode="reduce-overhead") training (forward, backward,
    AdamW) whose CUDA graph tree branches, so that cudagraph trees restore
    private pool checkpoints; the first run (torch's allocator) fills the
    compile caches, the next two are compared."""
    prelude = STATS + MLP
    run_gm(REDUCE_OVERHEAD, prelude=prelude, install=False, env=compile_caches, timeout=900)
    t = run_gm(REDUCE_OVERHEAD, prelude=prelude, install=False, env=compile_caches, timeout=900)
    g = run_gm(REDUCE_OVERHEAD, prelude=prelude, env=compile_caches, timeout=900)
    assert g["skips"] == t["skips"] == 0, (t, g)  # every graph ran as a CUDA graph
    assert g["checkpoints_restored"] == t["checkpoints_restored"] >= 1, (t, g)
    assert g["recorded"] == t["recorded"] > 0, (t, g)
    assert_same(t, g)
    assert_peaks(t, g)


def test_capture_growing_an_expandable_segment_past_free_granules_matches_torch():
    """torchtitan's failure, reduced: with expandable segments, a capture
    frees a tensor of its private pool (leaving wholly free granules between
    live blocks) and then needs the segment to grow. gpumem used to unmap
    those granules first, and the unmap's stream synchronize killed the
    capture (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED). A tensor used on a side
    stream and freed during the capture, and an empty_cache inside it, take
    the other paths a capture forbids. Both allocators must capture and
    replay; their figures must agree (reserved: gpumem's at most torch's)."""
    t, g = both('''
        u8 = dict(dtype=torch.uint8, device="cuda")
        x = torch.zeros(1024, device="cuda")
        side = torch.cuda.Stream()
        held = [torch.empty(n * MiB, **u8) for n in (6, 10, 6, 30)]
        del held[1], held[2]  # free granules in the default pool too
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            a = torch.empty(24 * MiB, **u8)
            b = torch.empty(24 * MiB, **u8)
            s = torch.empty(4 * MiB, **u8)
            with torch.cuda.stream(side):
                s.fill_(1)
            s.record_stream(side)
            del a, s
            torch.cuda.empty_cache()
            c = torch.empty(48 * MiB, **u8)
            y = x * 2
        during = peaks()
        for _ in range(2):
            graph.replay()
        torch.cuda.synchronize()
        out = {"during": during, "after": peaks()}
        del b, c, y, graph
        torch.cuda.empty_cache()
        out["end"] = peaks()
        emit(out)
    ''', env={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"})
    for k in ("during", "after", "end"):
        assert g[k]["allocated"] == t[k]["allocated"], (k, t, g)
        assert g[k]["reserved"] <= t[k]["reserved"], (k, t, g)
    assert_peaks(t["after"], g["after"])
