"""gpumem.pytorch.release: the shapes of each torch release's memory-history
interface, from the switches a shim reports (csrc/torch/gm_torch_compat.h).
No torch needed: a stand-in shim reports the switches of a release; the
conformance checks (tests/conformance/cf_snapshot.py, cf_history.py) compare
the same shapes with torch's own allocator on the releases installed."""

import pytest

from gpumem.pytorch import release

# The switches as gm_torch_compat.h sets them on each release.
SWITCHES = {
    "2.6": dict(accel_config=False, mempool_api=False, history_clear=False,
                compile_context=False, user_metadata=False, skip_actions=False,
                trace_pool_id=False, host_history=False),
    "2.10": dict(accel_config=True, mempool_api=True, history_clear=True, compile_context=True,
                 user_metadata=True, skip_actions=False, trace_pool_id=False,
                 host_history=False),
    "2.11": dict(accel_config=True, mempool_api=True, history_clear=True, compile_context=True,
                 user_metadata=True, skip_actions=True, trace_pool_id=False,
                 host_history=False),
    "2.14": dict(accel_config=True, mempool_api=True, history_clear=True, compile_context=True,
                 user_metadata=True, skip_actions=True, trace_pool_id=True, host_history=True),
}


class _Shim:
    def __init__(self, switches):
        self._switches = switches

    def interfaces(self):
        return dict(self._switches)


def _snapshot():
    entry = {"action": "alloc", "addr": 1, "size": 2, "stream": 0, "time_us": 3,
             "compile_context": "N/A", "user_metadata": "", "pool_id": (0, 0)}
    return {"segments": [], "device_traces": [[entry, dict(entry)]],
            "allocator_settings": {}, "external_annotations": [], "host_segments": [],
            "host_traces": []}


@pytest.mark.parametrize("name,arity,last", [("2.6", 4, "device"), ("2.10", 7,
                                              "global_record_annotations"),
                                             ("2.11", 8, "skip_actions"),
                                             ("2.14", 10, "record_cuda")])
def test_arguments_per_release(name, arity, last):
    shim = _Shim(SWITCHES[name])
    have = release.interfaces(shim)
    assert have == SWITCHES[name]
    from gpumem.pytorch import shim_state
    shim_state.set_loaded(shim, {}, "")
    try:
        assert release.c_record_history_arity() == arity
        assert release.record_history_params()[-1] == last
        args = ("all", "all", "python", 100, False, False, False, [], False, True)
        release.check_c_record_history_call(args[:arity])
        for k in {4, 7, 8, 10} - {arity}:
            with pytest.raises(TypeError, match="incompatible function arguments"):
                release.check_c_record_history_call(args[:k])
        params = release.record_history_params()
        release.check_call("f", params, (), {"max_entries": 1, "categories": True},
                           extra=("categories",))
        if "skip_actions" not in params:
            with pytest.raises(TypeError, match="unexpected keyword argument 'skip_actions'"):
                release.check_call("f", params, (), {"skip_actions": []})
        with pytest.raises(TypeError, match=f"takes from 0 to {len(params)} positional"):
            release.check_call("f", params, (None,) * (len(params) + 1), {})
        snap = release.shape_snapshot(_snapshot())
        keys = set(snap["device_traces"][0][1])
        assert ("pool_id" in keys) == SWITCHES[name]["trace_pool_id"]
        assert ("user_metadata" in keys) == SWITCHES[name]["user_metadata"]
        assert ("compile_context" in keys) == SWITCHES[name]["compile_context"]
        assert ("host_segments" in snap) == ("host_traces" in snap) == (name == "2.14")
        mem_params = release.memory_snapshot_params()
        assert mem_params == {"2.6": (), "2.10": ("mempool_id",),
                              "2.11": ("mempool_id", "include_traces"),
                              "2.14": ("mempool_id", "include_traces")}[name]
        if not mem_params:
            with pytest.raises(TypeError, match="takes 0 positional arguments but 1 was given"):
                release.check_call("memory_snapshot", mem_params, (None,), {})
            with pytest.raises(TypeError, match="takes no arguments"):
                release.check_c_snapshot_call((None,))
        else:
            with pytest.raises(TypeError, match="exactly one argument"):
                release.check_c_snapshot_call(())
    finally:
        shim_state.set_loaded(None, None, "")


def test_without_a_shim_the_newest_shapes():
    from gpumem.pytorch import shim_state
    assert shim_state.loaded() is None
    assert all(release.interfaces().values())
    assert release.c_record_history_arity() == 10
    snap = _snapshot()
    assert release.shape_snapshot(snap) == _snapshot()
