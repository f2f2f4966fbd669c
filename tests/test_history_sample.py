"""The always-on sampled mode (Note [Sampled recording] in
csrc/history/sample.c, gpumem/_sampling.py): which allocations carry a
stack, that events and peaks stay exact, that the per-site estimates are
unbiased, and that reports mark them.

Drives gpumem._C.Allocator on the virtual device (no torch); the torch
side (an OOM in a Transformer step, gpumem simulate --sample) is in
test_history_sample_torch.py.
"""

from __future__ import annotations

import collections
import pickle

import pytest

import gpumem
from gpumem import _sampling
from gpumem._conf import ConfError
from gpumem.recording import history, oom
from gpumem.recording.history import HistoryConfigError
from gpumem.snapshots.summary import diff, summarize

KiB, MiB = 1 << 10, 1 << 20


@pytest.fixture(autouse=True)
def _reset_history(monkeypatch):
    monkeypatch.delenv(_sampling.ENV_SAMPLE, raising=False)
    history.record_memory_history(None)
    yield
    history.record_memory_history(None)


def small_site(a, n):
    return a.malloc(n)


def mixed_site(a, n):
    return a.malloc(n)


def large_site(a, n):
    return a.malloc(n)


def workload(a, n=6000):
    """Allocations from three sites, half of them freed again; returns the
    true (count, bytes) live per site at the end."""
    live = {"small_site": [], "mixed_site": [], "large_site": []}
    for i in range(n):
        live["small_site"].append((small_site(a, 4 * KiB), 4 * KiB))
        if i % 3 == 0:
            n = (8 * KiB, 200 * KiB)[i % 2]
            live["mixed_site"].append((mixed_site(a, n), n))
        if i % 50 == 0:
            live["large_site"].append((large_site(a, 3 * MiB), 3 * MiB))
        if i % 2:   # free the oldest small one: the trace has frees too
            p, _ = live["small_site"].pop(0)
            a.free(p)
    return {k: (len(v), sum(n for _, n in v)) for k, v in live.items()}, live


def free_all(a, live):
    for v in live.values():
        for p, _ in v:
            a.free(p)


def sites(rows):
    return {r["site"].rsplit(":", 1)[-1]: r for r in rows}


def test_parse_sample_forms_and_one_line_errors():
    d = {"mean_bytes": _sampling.DEFAULT_MEAN, "threshold_bytes": _sampling.DEFAULT_THRESHOLD,
         "seed": None}
    assert _sampling.parse_sample(True) == d
    assert _sampling.parse_sample("on") == d
    for off in (None, False, "", "off", "0"):
        assert _sampling.parse_sample(off) is None
    assert _sampling.parse_sample(4096)["mean_bytes"] == 4096
    assert _sampling.parse_sample("256KiB")["mean_bytes"] == 256 * KiB
    assert _sampling.parse_sample("mean:64KiB, threshold:2MiB,seed:7") == {
        "mean_bytes": 64 * KiB, "threshold_bytes": 2 * MiB, "seed": 7}
    for bad in ("12XB", "mean:0", "threshold:-1", "seed:x", "speed:3", 0, -5, 2.5):
        with pytest.raises(_sampling.SampleError) as e:
            _sampling.parse_sample(bad)
        assert "\n" not in str(e.value)
    with pytest.raises(HistoryConfigError):
        history.record_memory_history("all", sample="mean:nope")
    with pytest.raises(ValueError):
        gpumem.record("x.pickle", sample="bogus")


def test_threshold_respected_frees_without_stacks_and_events_exact():
    a = gpumem.Allocator(backend="virtual")
    history.record_memory_history("all", "all")
    _, live = workload(a, 2000)
    full = history.snapshot()
    free_all(a, live)
    history.record_memory_history(None)
    a = gpumem.Allocator(backend="virtual")
    history.record_memory_history("all", "all", sample="mean:64KiB,threshold:1MiB,seed:1")
    assert history.recording_config()["context"] == "alloc"   # frees capture nothing
    _, live = workload(a, 2000)
    sampled = history.snapshot()
    free_all(a, live)
    assert sampled[_sampling.SNAPSHOT_KEY] == {"mean_bytes": 64 * KiB,
                                               "threshold_bytes": MiB, "seed": 1}
    assert _sampling.SNAPSHOT_KEY not in full
    ft, st = full["device_traces"][0], sampled["device_traces"][0]
    # every event is there, in the same order, with the same sizes
    assert [(e["action"], e["size"]) for e in ft] == [(e["action"], e["size"]) for e in st]
    allocs = [e for e in st if e["action"] == "alloc"]
    assert all(e.get("frames") for e in allocs if e["size"] >= MiB)
    small = [e for e in allocs if e["size"] < MiB]
    with_stack = sum(1 for e in small if e.get("frames"))
    assert 0 < with_stack < len(small) / 4
    # a free captures nothing: it carries its allocation's stack, if that had one
    at = {}
    for e in st:
        if e["action"] == "alloc":
            at[e["addr"]] = e.get("frames")
        elif e["action"].startswith("free"):
            assert e.get("frames") == at[e["addr"]]
    rf, rs = summarize(full, "f")["devices"][0], summarize(sampled, "s")["devices"][0]
    for k in ("peak_allocated", "peak_index", "allocations", "at_snapshot"):
        assert rf[k] == rs[k], k


def test_estimates_are_unbiased():
    """Counts and bytes per site, scaled by 1 / p(size), land within 10% of
    the truth (about 3 standard deviations for the small site); unscaled,
    the small site would read about 22% of it."""
    a = gpumem.Allocator(backend="virtual")
    history.record_memory_history("all", "state", sample="mean:16KiB,threshold:1MiB,seed:11")
    truth, live = workload(a)
    snap = history.snapshot()
    free_all(a, live)
    dev = summarize(snap, "s", top=20)["devices"][0]
    got = sites(dev["top_live_at_snapshot"])
    for name, (count, nbytes) in truth.items():
        row = got[name]
        assert abs(row["count"] - count) <= 0.10 * count, (name, row["count"], count)
        assert abs(row["bytes"] - nbytes) <= 0.10 * nbytes, (name, row["bytes"], nbytes)
        assert row.get("estimated", False) == (name != "large_site")
    # the small site's allocations were mostly left without a stack
    blocks = [b for s in snap["segments"] for b in s["blocks"]
              if b["state"] == "active_allocated" and b["requested_size"] == 4 * KiB]
    assert sum(1 for b in blocks if b.get("frames")) < 0.3 * truth["small_site"][0]
    # and unsampled ones are not reported as a "no stack" site
    assert "<no stack recorded>" not in {r["site"] for r in dev["top_live_at_snapshot"]}


def test_each_seed_repeats_and_rates_follow_the_size():
    def sampled_ids(seed):
        a = gpumem.Allocator(backend="virtual")
        history.record_memory_history("all", "alloc", sample=f"mean:32KiB,seed:{seed}")
        ps = [small_site(a, 8 * KiB) for _ in range(3000)]
        t = history.snapshot()["device_traces"][0]
        for p in ps:
            a.free(p)
        history.record_memory_history(None)
        return [i for i, e in enumerate(e for e in t if e["action"] == "alloc") if e.get("frames")]
    one, again, other = sampled_ids(3), sampled_ids(3), sampled_ids(4)
    assert one == again and one != other
    p = 1 - 2.718281828459045 ** (-8 / 32)   # 0.221
    assert abs(len(one) / 3000 - p) < 0.04


def test_summary_and_diff_mark_estimates(tmp_path, capsys):
    from gpumem import cli
    a = gpumem.Allocator(backend="virtual")
    history.record_memory_history("all", "alloc", sample="mean:64KiB,seed:2")
    ps = [small_site(a, 16 * KiB) for _ in range(500)]
    before = tmp_path / "before.pickle"
    history.dump_snapshot(before)
    ps += [mixed_site(a, 32 * KiB) for _ in range(500)] + [large_site(a, 2 * MiB)]
    after = tmp_path / "after.pickle"
    history.dump_snapshot(after)
    for p in ps:
        a.free(p)
    assert cli.main(["summary", str(after)]) == 0
    out = capsys.readouterr().out
    assert "sampled recording: every allocation of 1.00 MiB or more" in out
    rows = [line for line in out.splitlines() if "mixed_site" in line]
    assert rows and all("~" in line for line in rows), out
    assert not any("~" in line for line in out.splitlines() if "large_site" in line), out
    assert cli.main(["diff", str(before), str(after)]) == 0
    out = capsys.readouterr().out
    assert any("~" in line and "mixed_site" in line for line in out.splitlines()), out
    with open(after, "rb") as f:
        snap = pickle.load(f)
    rep = diff(pickle.loads(before.read_bytes()), snap, ("b", "a"))
    assert rep["sampling"]["after"]["mean_bytes"] == 64 * KiB
    grew = sites(rep["grew"])
    assert grew["mixed_site"]["estimated"] and "estimated" not in grew["large_site"]


def test_environment_variable(monkeypatch):
    monkeypatch.setenv(_sampling.ENV_SAMPLE, "mean:128KiB,threshold:4MiB,seed:9")
    history.record_memory_history("all", "all")           # no sample=: the variable's
    assert history.recording_config()["sample"] == {"mean_bytes": 128 * KiB,
                                                    "threshold_bytes": 4 * MiB, "seed": 9}
    history.record_memory_history("all", "all", sample=False)   # explicit: every stack
    assert history.recording_config()["sample"] is False
    assert history.recording_config()["context"] == "all"
    oom.check_env()
    monkeypatch.setenv(_sampling.ENV_SAMPLE, "sometimes")
    with pytest.raises(ConfError) as e:
        oom.check_env()
    assert _sampling.ENV_SAMPLE in str(e.value) and "\n" not in str(e.value)


def test_recorder_restores_the_mode(tmp_path, monkeypatch):
    from gpumem.pytorch import installer

    def no_cuda_torch(*a, **k):   # record gpumem.Allocator objects (as test_record.py does)
        raise installer.TorchMissingError("no CUDA torch in this test")
    monkeypatch.setattr(installer, "install", no_cuda_torch)
    monkeypatch.setattr(installer, "is_installed", lambda: False)
    a = gpumem.Allocator(backend="virtual")
    history.record_memory_history("all", "all")
    with gpumem.record(tmp_path / "m.pickle", sample="mean:64KiB,seed:5"):
        assert history.recording_config()["sample"]["seed"] == 5
        p = large_site(a, 2 * MiB)
    a.free(p)
    assert history.recording_config()["sample"] is False
    snap = pickle.loads((tmp_path / "m.pickle").read_bytes())
    assert snap[_sampling.SNAPSHOT_KEY]["seed"] == 5


def test_threads_sample_on_their_own_counters():
    """Each thread counts down its own bytes (no lock on the allocation path):
    four threads together are sampled at the single-thread rate."""
    import threading
    a = gpumem.Allocator(backend="virtual")
    history.record_memory_history("all", "alloc", sample="mean:32KiB,seed:6")
    ptrs: list[list[int]] = [[] for _ in range(4)]

    def work(k):
        for _ in range(1500):
            ptrs[k].append(small_site(a, 8 * KiB))
    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    allocs = [e for e in history.snapshot()["device_traces"][0] if e["action"] == "alloc"]
    for p in (p for ps in ptrs for p in ps):
        a.free(p)
    assert len(allocs) == 6000
    p = 1 - 2.718281828459045 ** (-8 / 32)   # 0.221
    assert abs(sum(1 for e in allocs if e.get("frames")) / 6000 - p) < 0.04
