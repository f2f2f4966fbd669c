"""Memory history: _record_memory_history with every context and stacks
value, which events and blocks carry which stack, and the recording
controls (max_entries, clear_history, skip_actions, enabled='state', the
legacy form, metadata)."""

import json

from harness import (at_least, blocks, empty, frame_names, needs, recording, settle, since,
                     torch_mod, trace)

CONTEXTS = (None, "state", "alloc", "all")


def _run_recorded(context, stacks):
    """Allocated in thealloc(), freed in thefree(), its segment released in
    the_release(); a second tensor stays."""
    torch = torch_mod()
    settle()
    torch.cuda.memory._record_memory_history("all", context=context, stacks=stacks)
    holder = {}

    def thealloc():
        holder["x"] = torch.rand(3, 1024, 1024, device="cuda")   # a segment of its own
        holder["keep"] = torch.rand(311, 411, device="cuda")

    def thefree():
        del holder["x"]

    def the_release():
        torch.cuda.empty_cache()

    thealloc()
    thefree()
    the_release()
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(None)
    return snap, holder


def _names_in(frames) -> set:
    return set(frame_names(frames or []))


def check_which_events_carry_which_stack():
    for context in CONTEXTS:
        snap, holder = _run_recorded(context, "python")
        by_action = {}
        for ev in trace(snap):
            by_action.setdefault(ev["action"], []).append(_names_in(ev.get("frames")))
        want_alloc = context in ("alloc", "all")
        for action in ("alloc", "segment_alloc"):
            got = any("thealloc" in n for n in by_action[action])
            assert got == want_alloc, (context, action, by_action[action])
        freed = by_action["free_requested"] + by_action["free_completed"]
        assert any("thefree" in n for n in freed) == (context == "all"), (context, freed)
        # at 'alloc' a free carries the allocation's stack
        assert any("thealloc" in n for n in freed) == (context == "alloc"), (context, freed)
        released = by_action.get("segment_free", [])
        assert any("the_release" in n for n in released) == (context == "all"), context
        if context not in ("alloc", "all"):
            assert all("frames" not in ev for ev in trace(snap)), context
        live = [b for b in blocks(snap) if b["requested_size"] == 311 * 411 * 4
                and b["state"] == "active_allocated"]
        assert len(live) == 1
        assert ("thealloc" in _names_in(live[0]["frames"])) == (context is not None), context
        del holder


def check_segments_carry_no_stack():
    for context in CONTEXTS:
        snap, holder = _run_recorded(context, "python")
        assert all(s["frames"] == [] for s in snap["segments"]), context
        del holder


def check_inactive_blocks_have_no_stack():
    for context in CONTEXTS:
        snap, holder = _run_recorded(context, "python")
        for b in blocks(snap):
            if b["state"] == "inactive":
                assert b["frames"] == [], (context, b)
        del holder


def check_stacks_python_and_all():
    torch = torch_mod()
    for context, stacks in (("all", "all"), ("all", "python"), (None, "python")):
        settle()
        with recording(enabled="all", context=context, stacks=stacks):

            def run():
                x = torch.rand(128, 128, device="cuda")
                return x * x + x * x
            y = run()
            text = json.dumps(torch.cuda.memory._snapshot())
        assert ("run" in set(_names(json.loads(text)))) == (context is not None), (context, stacks)
        assert ("::rand" in text) == (stacks == "all" and context is not None), (context, stacks)
        assert str(128 * 128 * 4) in text
        del y


def _names(obj):
    """Every frame name anywhere in a snapshot."""
    if isinstance(obj, dict):
        if "name" in obj and "filename" in obj and "line" in obj:
            yield obj["name"]
        for v in obj.values():
            yield from _names(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from _names(v)


def check_cpp_frames_are_demangled():
    torch = torch_mod()
    settle()
    with recording(enabled="state", stacks="all"):
        x = torch.rand(311, 411, device="cuda")
        snap = torch.cuda.memory._snapshot()
    found = [b for b in blocks(snap) if b["requested_size"] == 311 * 411 * 4]
    assert len(found) == 1
    names = frame_names(found[0]["frames"])
    assert any("::rand" in n for n in names), names[:20]
    assert not any(n.startswith("_Z") for n in names), [n for n in names if n.startswith("_Z")]
    assert all(isinstance(f["line"], int) and isinstance(f["filename"], str)
               for f in found[0]["frames"])
    del x


def check_history_context_can_change():
    torch = torch_mod()
    settle()
    holder = {}

    def should_capture1():
        holder["x"] = torch.rand(4, 4, device="cuda")

    def should_not_capture():
        holder["x"] = torch.rand(3, 4, device="cuda")

    def should_capture2():
        holder["x"] = torch.rand(4, 4, device="cuda")

    try:
        torch.cuda.memory._record_memory_history(context="all", stacks="python")
        should_capture1()
        torch.cuda.memory._record_memory_history(context=None)
        should_not_capture()
        torch.cuda.memory._record_memory_history(context="all", stacks="python")
        should_capture2()
        text = json.dumps(torch.cuda.memory._snapshot())
    finally:
        torch.cuda.memory._record_memory_history(None)
    assert "should_capture1" in text and "should_capture2" in text
    assert "should_not_capture" not in text


def check_snapshot_trace_and_markers():
    torch = torch_mod()
    settle()
    with recording(enabled="all", context="state", stacks="python"):
        torch.rand(2 * 311, 411, device="cuda")
        unused = torch.rand(310, 410, device="cuda")
        x = torch.rand(311, 411, device="cuda")
        tensors = [torch.rand(128, device="cuda") for _ in range(100)]
        del tensors
        first = torch.cuda.memory._snapshot()
        hit = [b for b in blocks(first) if b["requested_size"] == 311 * 411 * 4]
        assert len(hit) == 1 and hit[0]["address"] == x.untyped_storage().data_ptr()
        assert hit[0]["frames"][0]["filename"].endswith("cf_history.py")
        assert "snapshot" not in {e["action"] for e in trace(first)}   # not its own marker
        del unused, x
        torch.cuda.empty_cache()
        second = torch.cuda.memory._snapshot()
    actions = [e["action"] for e in trace(second)]
    assert actions[-1] == "segment_free", actions[-5:]
    marks = [e for e in trace(second) if e["action"] == "snapshot"]
    assert len(marks) == 1 and marks[0]["addr"] == 0 and marks[0]["stream"] == 0


def check_max_entries_keeps_the_newest():
    torch = torch_mod()
    settle()
    with recording(max_entries=5):
        xs = [empty(1000 + i) for i in range(20)]
        snap = torch.cuda.memory._snapshot()
    evs = trace(snap)
    assert len(evs) == 5
    assert [e["size"] for e in evs] == [1015, 1016, 1017, 1018, 1019]
    del xs


def check_enabled_state_keeps_one_event():
    torch = torch_mod()
    settle()
    with recording(enabled="state"):
        xs = [empty(1000 + i) for i in range(10)]
        snap = torch.cuda.memory._snapshot()
    assert len(trace(snap)) <= 1
    assert sum(1 for b in blocks(snap) if b["state"] == "active_allocated") >= 10
    del xs


def check_disabling_clears_the_history():
    torch = torch_mod()
    settle()
    torch.cuda.memory._record_memory_history()
    x = empty(1000)
    torch.cuda.memory._record_memory_history(None)
    assert trace(torch.cuda.memory._snapshot()) == []
    torch.cuda.memory._record_memory_history()
    assert trace(torch.cuda.memory._snapshot()) == []
    torch.cuda.memory._record_memory_history(None)
    del x


@since("2.8", "_record_memory_history(clear_history=...)")
def check_clear_history():
    torch = torch_mod()
    settle()
    torch.cuda.memory._record_memory_history()
    x = empty(1000)
    torch.cuda.memory._record_memory_history(clear_history=True)
    y = empty(2000)
    evs = trace(torch.cuda.memory._snapshot())
    torch.cuda.memory._record_memory_history(None)
    assert [e["size"] for e in evs if e["action"] == "alloc"] == [2000], evs
    del x, y


@since("2.11", "_record_memory_history(skip_actions=...)")
def check_skip_actions():
    torch = torch_mod()
    for skip in (["free_requested"], ["free_requested", "free_completed"], ["alloc"],
                 ["segment_alloc", "segment_free"], [], None):
        settle()
        with recording(context="all", stacks="python", skip_actions=skip):
            x = torch.rand(128, 128, device="cuda")
            del x
            torch.cuda.synchronize()
            evs = trace(torch.cuda.memory._snapshot())
        assert evs
        seen = {e["action"] for e in evs}
        assert not seen & set(skip or []), (skip, seen)
        assert seen - set(skip or []), skip
    try:
        torch.cuda.memory._record_memory_history(skip_actions=["not_an_action"])
        raise AssertionError("an unknown action was accepted")
    except RuntimeError:
        pass
    finally:
        torch.cuda.memory._record_memory_history(None)


# _record_memory_history's keywords and the release that added each
# (torch/cuda/memory.py of 2.6.0, 2.8.0, 2.11.0 and 2.14.1).
KEYWORDS_SINCE = {"clear_history": (False, "2.8"), "compile_context": (False, "2.8"),
                  "global_record_annotations": (False, "2.8"), "skip_actions": ([], "2.11"),
                  "record_cuda": (True, "2.14")}


def check_keywords_of_the_release():
    # a keyword the release has is taken; one it lacks is a TypeError, as for torch's
    torch = torch_mod()
    for name, (value, release) in KEYWORDS_SINCE.items():
        try:
            torch.cuda.memory._record_memory_history("all", **{name: value})
            took = True
        except TypeError as e:
            took = False
            assert name in str(e), str(e)
        finally:
            torch.cuda.memory._record_memory_history(None)
        assert took == at_least(release), (name, took)


def check_bad_arguments():
    torch = torch_mod()
    for kw in ({"enabled": "yes"}, {"context": "some"}, {"stacks": "cpp"}):
        try:
            torch.cuda.memory._record_memory_history(**kw)
            raise AssertionError(f"{kw} was accepted")
        except RuntimeError:
            pass
    torch.cuda.memory._record_memory_history(None)


def check_legacy_form():
    torch = torch_mod()
    settle()
    torch.cuda.memory._record_memory_history(True, trace_alloc_max_entries=3,
                                             trace_alloc_record_context=True)
    xs = [empty(1000 + i) for i in range(6)]
    evs = trace(torch.cuda.memory._snapshot())
    torch.cuda.memory._record_memory_history(False)
    assert len(evs) == 3 and all("frames" in e for e in evs), evs
    assert trace(torch.cuda.memory._snapshot()) == []
    del xs


@needs("cuda.memory._memory_metadata_supported")
def check_metadata_on_every_event():
    torch = torch_mod()
    assert torch.cuda.memory._memory_metadata_supported() is True
    for context in ("alloc", "all", "state"):
        torch._C._cuda_clearCublasWorkspaces()
        settle()
        torch.cuda.memory._set_memory_metadata("metadata test")
        assert torch.cuda.memory._get_memory_metadata() == "metadata test"
        with recording(context=context):
            x = torch.rand(3, 4, device="cuda")
            del x
            torch.cuda.empty_cache()
            torch.cuda.memory._set_memory_metadata("")
            evs = trace(torch.cuda.memory._snapshot())
        assert evs and all(e["user_metadata"] == "metadata test" for e in evs), context
    assert torch.cuda.memory._get_memory_metadata() == ""


def check_torchscript_frames():
    torch = torch_mod()
    settle()
    with recording(enabled="state", stacks="python"):
        @torch.jit.script
        def foo():
            return torch.rand(311, 411, device="cuda")

        x = foo()
        snap = torch.cuda.memory._snapshot()
    found = [b for b in blocks(snap) if b["requested_size"] == 311 * 411 * 4]
    assert len(found) == 1
    assert found[0]["frames"][0]["name"] == "foo", found[0]["frames"][:3]
    del x


def check_inactive_block_keeps_its_last_request():
    torch = torch_mod()
    settle()
    a = empty(4000)
    b = empty(5000)
    pa = a.data_ptr()
    del a
    snap = torch.cuda.memory._snapshot()
    found = [blk for blk in blocks(snap) if blk["address"] == pa]
    assert found and found[0]["state"] == "inactive"
    assert found[0]["requested_size"] == 4000, found[0]
    del b
