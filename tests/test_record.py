"""gpumem.record() without torch: the recorder's rules on gpumem.Allocator objects.

The pytest process never imports torch (see torch_helpers), so here
gpumem.pytorch.installer.install is replaced by one that reports "no CUDA torch", which
is the documented path where record() records gpumem.Allocator objects.
Everything torch-specific (auto-install, torch's allocator already in use,
OOM through the shim, ranks in subprocesses) is in test_record_torch.py and
test_oom_dump.py, on the simulated GPU.  The OOM hook and GPUMEM_OOM_SNAPSHOT
(gpumem.recording.oom) are called here directly, as the shim and install() would.
"""

from __future__ import annotations

import logging
import os
import pickle
import sys
import threading

import pytest

import gpumem
from gpumem.recording import oom as _oom, history
from gpumem.pytorch import installer as _torch

_C = pytest.importorskip("gpumem._C")
R = sys.modules["gpumem.recording.recorder"]   # gpumem.record is the function

MiB = 1 << 20


@pytest.fixture(autouse=True)
def _no_torch(monkeypatch):
    def install(*a, **k):
        raise _torch.TorchMissingError("no torch in this test")

    monkeypatch.setattr(_torch, "install", install)
    monkeypatch.setattr(_torch, "is_installed", lambda: False)
    for var in ("RANK", "LOCAL_RANK", R.ENV_OOM_SNAPSHOT, R.ENV_OOM_RECORDING):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(_oom, "_env_dir", None)
    monkeypatch.setattr(_oom, "_env_fallback_only", False)
    monkeypatch.setattr(_oom, "_oom_count", 0)
    monkeypatch.setattr(_oom, "_oom_written", [])
    history.record_memory_history(None)
    yield
    active = R.active_recorder()
    if active is not None:
        active._close()
    history.record_memory_history(None)


def load(path):
    with open(path, "rb") as f:
        return pickle.load(f)


def actions(snap, device=0):
    return [e["action"] for e in snap["device_traces"][device]]


def alloc_sizes(snap, device=0):
    return [e["size"] for e in snap["device_traces"][device] if e["action"] == "alloc"]


def test_snapshot_is_written_when_the_block_raises(tmp_path):
    a = _C.Allocator(capacity=1 << 30)
    path = tmp_path / "mem.pickle"
    with pytest.raises(ValueError, match="boom"):
        with gpumem.record(path) as rec:
            assert rec.recording and R.active_recorder() is rec
            p = a.malloc(3 * MiB)
            raise ValueError("boom")
    assert rec.written == [str(path)] and not rec.recording
    snap = load(path)
    assert 3 * MiB in alloc_sizes(snap)
    assert history.recording_config()["enabled"] is None   # it was off before
    assert R.active_recorder() is None
    a.free(p)


def test_entry_clears_history_and_exit_restores_the_previous_recording(tmp_path):
    a = _C.Allocator(capacity=1 << 30)
    history.record_memory_history("all", context="alloc", max_entries=777)
    p = a.malloc(5 * MiB)          # before the block: not in the block's file
    with gpumem.record(tmp_path / "m.pickle", context="all", max_entries=1000):
        assert history.recording_config()["max_entries"] == 1000
        q = a.malloc(7 * MiB)
    cfg = history.recording_config()
    assert (cfg["enabled"], cfg["context"], cfg["max_entries"]) == ("all", "alloc", 777)
    assert alloc_sizes(load(tmp_path / "m.pickle")) == [7 * MiB]
    a.free(p)
    a.free(q)


def test_nested_and_concurrent_use_is_refused(tmp_path):
    outer = gpumem.record(tmp_path / "outer.pickle")
    errors = []
    with outer:
        with pytest.raises(gpumem.RecordError, match="already recording to .*outer.pickle"):
            with gpumem.record(tmp_path / "inner.pickle"):
                pass
        with pytest.raises(gpumem.RecordError, match="already active"):
            outer.start()

        def other_thread():
            try:
                with gpumem.record(tmp_path / "thread.pickle"):
                    pass
            except gpumem.RecordError as e:
                errors.append(str(e))

        t = threading.Thread(target=other_thread)
        t.start()
        t.join()
        extra = outer.dump(tmp_path / "extra.pickle")   # the documented alternative
    assert len(errors) == 1 and "nested or run at the same time" in errors[0]
    assert "test_record.py" in errors[0]               # names where the first was entered
    assert not (tmp_path / "inner.pickle").exists() and not (tmp_path / "thread.pickle").exists()
    assert extra == str(tmp_path / "extra.pickle") and os.path.exists(extra)
    # one after the other is fine, and a recorder can be used again
    with gpumem.record(tmp_path / "after.pickle"):
        pass
    with outer:
        pass
    assert outer.written[-1] == str(tmp_path / "outer.pickle")


def test_step_range_records_only_its_steps_then_stops_on_its_own(tmp_path):
    a = _C.Allocator(capacity=1 << 30)
    path = tmp_path / "steps.pickle"
    seen = []
    with gpumem.record(path, start_step=2, stop_step=4) as rec:
        for step in range(7):
            p = a.malloc((step + 1) * MiB)      # step k allocates (k+1) MiB
            a.free(p)
            rec.step()
            seen.append((rec.step_index, rec.recording, len(rec.written)))
            if step == 3:
                assert path.exists()            # written when step 4 would begin
    assert seen[:5] == [(1, False, 0), (2, True, 0), (3, True, 0), (4, False, 1), (5, False, 1)]
    assert rec.written == [str(path)]           # nothing more at exit
    snap = load(path)
    assert alloc_sizes(snap) == [3 * MiB, 4 * MiB]
    marks = [(m["name"], m["stage"], m["device"]) for m in snap["external_annotations"]]
    assert marks == [("step 2", "START", 0), ("step 3", "START", 0)]
    times = [e["time_us"] for e in snap["device_traces"][0]]
    assert snap["external_annotations"][0]["time_us"] <= times[0]
    assert history.recording_config()["enabled"] is None


def test_block_that_ends_before_start_step_still_writes_a_file(tmp_path, caplog):
    a = _C.Allocator(capacity=1 << 30)
    p = a.malloc(2 * MiB)
    with caplog.at_level(logging.WARNING, logger="gpumem"):
        with gpumem.record(tmp_path / "early.pickle", start_step=10) as rec:
            rec.step()
    assert "before start_step=10" in caplog.text
    snap = load(tmp_path / "early.pickle")
    assert snap["device_traces"][0] == [] or "alloc" not in actions(snap)
    assert any(b["state"] == "active_allocated" for s in snap["segments"] for b in s["blocks"])
    a.free(p)


def test_rank_goes_into_every_file_name(tmp_path, monkeypatch):
    assert R.rank_path("/x/memory.pickle") == "/x/memory.pickle"
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert R.current_rank() == 1
    monkeypatch.setenv("RANK", "²")             # not a number: ignored, not a ValueError
    assert R.current_rank() == 1
    monkeypatch.setenv("RANK", "3")             # the global rank wins
    assert R.rank_path("/x/memory.pickle") == "/x/memory_rank3.pickle"
    assert R.rank_path("/x/memory") == "/x/memory_rank3"
    with gpumem.record(tmp_path / "m.pickle") as rec:
        rec.dump(tmp_path / "extra.pickle")
    assert rec.written == [str(tmp_path / "extra_rank3.pickle"), str(tmp_path / "m_rank3.pickle")]
    assert not (tmp_path / "m.pickle").exists()


def test_arguments_are_checked():
    with pytest.raises(ValueError, match="stop_step"):
        gpumem.record(start_step=3, stop_step=3)
    with pytest.raises(ValueError, match="start_step"):
        gpumem.record(start_step=-1)
    with pytest.raises(ValueError, match="context"):
        gpumem.record(context="everything")
    with pytest.raises(ValueError, match="stacks"):
        gpumem.record(stacks="cpp")
    with pytest.raises(ValueError, match="max_entries"):
        gpumem.record(max_entries=0)
    with pytest.raises(TypeError):
        gpumem.record(3.5)
    rec = gpumem.record()
    with pytest.raises(gpumem.RecordError, match="outside its with block"):
        rec.step()


MSG = "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 1 GiB"


def test_oom_hook_writes_the_snapshot_with_the_oom_event(tmp_path, caplog):
    a = _C.Allocator(capacity=1 << 30)
    keep = a.malloc(100 * MiB)
    with gpumem.record(tmp_path / "m.pickle") as rec:
        with pytest.raises(gpumem.OutOfMemoryError):
            a.malloc(2 << 30)
        free = a.stats()["reserved_bytes.all.current"]
        with caplog.at_level(logging.INFO, logger="gpumem"):   # said once: in the message;
            line = _oom._on_oom(0, 2 << 30, 2 << 30, free, 1 << 30, 0, MSG)   # logged at info
        assert all(r.levelno < logging.WARNING for r in caplog.records)
        line2 = _oom._on_oom(0, 2 << 30, 2 << 30, free, 1 << 30, 0, MSG)
    oom1, oom2 = str(tmp_path / "m_oom.pickle"), str(tmp_path / "m_oom2.pickle")
    assert line == f"gpumem: memory snapshot at this OOM written to {oom1}"
    assert line2.endswith(oom2) and "\n" not in line
    assert rec.oom_snapshots == [oom1, oom2] and R.oom_snapshots_written() == [oom1, oom2]
    assert oom1 in caplog.text and "Tried to allocate 2.00 GiB on device 0" in caplog.text
    snap = load(oom1)
    ooms = [e for e in snap["device_traces"][0] if e["action"] == "oom"]
    assert len(ooms) == 1 and ooms[0]["size"] == 2 << 30   # the recorded one, not a copy
    assert any(b["size"] == 100 * MiB and b["state"] == "active_allocated"
               for s in snap["segments"] for b in s["blocks"])
    a.free(keep)


def test_oom_outside_the_recorded_range_gets_a_synthesized_event(tmp_path):
    a = _C.Allocator(capacity=1 << 30)
    with gpumem.record(tmp_path / "m.pickle", start_step=5) as rec:
        line = _oom._on_oom(0, 3 << 30, 3 << 30, 1000, 1 << 30, 7, MSG)
    assert line and rec.oom_snapshots == [str(tmp_path / "m_oom.pickle")]
    (oom,) = [e for e in load(rec.oom_snapshots[0])["device_traces"][0] if e["action"] == "oom"]
    assert (oom["size"], oom["device_free"], oom["stream"]) == (3 << 30, 1000, 7)
    assert oom["frames"][0]["name"] == test_oom_outside_the_recorded_range_gets_a_synthesized_event \
        .__name__
    del a


def test_oom_hook_without_targets_and_with_dump_on_oom_false(tmp_path):
    assert _oom._on_oom(0, 1, 1, 0, 1, 0, MSG) is None
    with gpumem.record(tmp_path / "m.pickle", dump_on_oom=False):
        assert _oom._on_oom(0, 1, 1, 0, 1, 0, MSG) is None
    assert not (tmp_path / "m_oom.pickle").exists()


def test_env_directory_and_the_per_process_cap(tmp_path, monkeypatch):
    a = _C.Allocator(capacity=1 << 30)
    monkeypatch.setenv(R.ENV_OOM_SNAPSHOT, str(tmp_path / "ooms"))
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setattr(_oom, "MAX_OOM_SNAPSHOTS", 2)
    _oom._arm_env()                                # what gpumem.install() does
    assert history.recording_config()["enabled"] == "all"   # a history for the snapshots
    lines = [_oom._on_oom(0, 5, 512, 0, 1, 0, MSG) for _ in range(3)]
    files = sorted(os.listdir(tmp_path / "ooms"))
    assert len(files) == 2 and lines[2] is None
    assert all(f.startswith("oom_") and f.endswith(f"_{i + 1}_rank2.pickle")
               for i, f in enumerate(files))
    assert lines[0].endswith(files[0])
    del a


def test_env_recording_settings_are_applied(tmp_path, monkeypatch):
    monkeypatch.setenv(R.ENV_OOM_SNAPSHOT, str(tmp_path / "ooms"))
    monkeypatch.setenv(R.ENV_OOM_RECORDING, " context:alloc, stacks:all ,max_entries:321")
    _oom._arm_env()
    cfg = history.recording_config()
    assert (cfg["enabled"], cfg["context"], cfg["stacks"], cfg["max_entries"]) == \
        ("all", "alloc", "all", 321)


def test_env_recording_defaults_and_keeps_a_recording_already_on(tmp_path, monkeypatch):
    assert R.parse_oom_recording(None) == _oom.ENV_RECORDING
    assert R.parse_oom_recording("context:None")["context"] is None
    monkeypatch.setenv(R.ENV_OOM_SNAPSHOT, str(tmp_path / "ooms"))
    monkeypatch.setenv(R.ENV_OOM_RECORDING, "max_entries:50")
    history.record_memory_history("all", context="state", max_entries=777)
    _oom._arm_env()                       # the user's own recording wins
    assert history.recording_config()["max_entries"] == 777


@pytest.mark.parametrize("text, words", [
    ("context:everything", "bad value 'everything' for context"),
    ("stacks:cpp", "bad value 'cpp' for stacks"),
    ("max_entries:0", "bad value '0' for max_entries"),
    ("max_entries:many", "bad value 'many' for max_entries"),
    # issue 16.10: str.isdigit() accepted these, then int() raised ValueError
    ("max_entries:²", "bad value '²' for max_entries"),
    ("max_entries:٣", "bad value '٣' for max_entries"),
    pytest.param("max_entries:" + "9" * 5000, "bad value '99999", id="max_entries:9x5000"),
    ("depth:3", "unknown entry 'depth:3'"),
])
def test_env_recording_rejects_bad_settings_in_one_line(text, words, tmp_path, monkeypatch):
    with pytest.raises(ValueError) as e:
        R.parse_oom_recording(text)
    msg = str(e.value)
    assert words in msg and R.ENV_OOM_RECORDING in msg and "\n" not in msg
    # install() refuses it before swapping anything in
    monkeypatch.setenv(R.ENV_OOM_SNAPSHOT, str(tmp_path / "ooms"))
    monkeypatch.setenv(R.ENV_OOM_RECORDING, text)
    with pytest.raises(_torch.AllocConfError, match=words):
        _torch._check_oom_recording()
