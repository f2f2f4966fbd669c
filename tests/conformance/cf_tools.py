"""The tools built on the snapshot and on the profiler's memory events:
torch.cuda._memory_viz (trace_plot, segment_plot, profile_plot, the text
summaries) and torch.profiler.profile(profile_memory=True), including the
Memory Profiler's timeline."""

import json

from harness import MiB, at_least, recording, settle, torch_mod


def _snapshot_of_a_run(context="all", stacks="python"):
    torch = torch_mod()
    settle()
    with recording(context=context, stacks=stacks):
        def run():
            x = torch.rand(128, 128, device="cuda")
            return x * x + x * x
        y = run()
        z = torch.empty(30 * MiB, dtype=torch.uint8, device="cuda")
        del z
        snap = torch.cuda.memory._snapshot()
    return snap, y


def check_plots_render():
    from torch.cuda._memory_viz import segment_plot, trace_plot
    for context in ("all", None):
        snap, y = _snapshot_of_a_run(context)
        plots = [trace_plot(snap), segment_plot(snap)]
        if at_least("2.10"):  # trace_plot's filter_freed (not in 2.9.1's _memory_viz)
            plots.append(trace_plot(snap, filter_freed=True))
        for html in plots:
            assert html.startswith("<!DOCTYPE html>") or "<html" in html[:200]
            assert "MemoryViz.js" in html
        text = json.dumps(snap)
        assert ("run" in text) == (context is not None)
        assert str(128 * 128 * 4) in text
        del y


def check_text_summaries():
    from torch.cuda import _memory_viz as mv
    snap, y = _snapshot_of_a_run()
    summary = mv.segsum(snap)
    assert "Summary of segments" in summary and "Legend" in summary
    events = mv.trace(snap)
    assert "alloc" in events and str(128 * 128 * 4) in events
    del y


def check_profiler_sees_device_memory():
    torch = torch_mod()
    settle()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                profile_memory=True, record_shapes=True) as prof:
        x = torch.rand(128, 128, device="cuda")
        y = x * x + x * x
    rows = {e.key: e for e in prof.key_averages()}
    assert rows["aten::rand"].device_memory_usage == 128 * 128 * 4, rows["aten::rand"]
    assert rows["aten::empty"].device_memory_usage >= 128 * 128 * 4
    assert rows["aten::mul"].device_memory_usage == 2 * 128 * 128 * 4
    del x, y


def _profiled(work):
    """A memory profile (with stacks) of work()."""
    torch = torch_mod()
    settle()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                with_stack=True, profile_memory=True,
                                record_shapes=True) as prof:
        work()
    return prof


def check_profile_to_snapshot():
    from torch.cuda._memory_viz import _profile_to_snapshot, profile_plot
    torch = torch_mod()

    def work():
        x = torch.rand(128, 128, device="cuda")
        return x * x + x * x
    prof = _profiled(work)
    snap = _profile_to_snapshot(prof)
    text = json.dumps(snap)
    assert "cf_tools.py" in text and "check_profile_to_snapshot" in text
    assert "category" in text
    allocs = [e for e in snap["device_traces"][0] if e["action"] == "alloc"]
    assert any(e["size"] == 128 * 128 * 4 for e in allocs), allocs[:5]
    assert "MemoryViz.js" in profile_plot(prof)


def check_memory_profile_timeline():
    from torch.profiler._memory_profiler import Action
    torch = torch_mod()
    prof = _profiled(lambda: torch.rand(128, 128, device="cuda"))
    timeline = prof._memory_profile().timeline
    cuda = [(t, a, k, size) for t, a, (k, _), size in timeline if k.device.type == "cuda"]
    assert any(a == Action.CREATE and size == 128 * 128 * 4 for _, a, _, size in cuda), cuda[:5]
    assert any(a == Action.DESTROY for _, a, _, _ in cuda)
