"""The device model replayed in C (_C.trace_model, Note [Native trace replay])
and the passes over its columns (_C.model_*) against the Python replay of
the same trace as a list of dicts: equal models, and equal summary, view
payload and diff, on generated traces, on hand-built ones with every rule
of timeline.py's replay, and on the real snapshots in ../shared/snapshots."""

from __future__ import annotations

import os
import pickle
import random
from pathlib import Path

import pytest

from gpumem import _C
from gpumem.snapshots.summary import diff, summarize
from gpumem.snapshots.timeline import build_device, devices_of
from gpumem.snapshots.unpickle import load_snapshot, loads_snapshot
from gpumem.snapshots.view import build_payload
from snapshot_gen import write_snapshot

SNAPSHOTS = Path(os.environ.get("GPUMEM_SNAPSHOTS")
                 or Path(__file__).parent.parent.parent / "shared" / "snapshots")
REAL = sorted(SNAPSHOTS.glob("*.pickle")) if SNAPSHOTS.is_dir() else []
SMALL_CAPS = {"samples": 40, "bands": 12, "blocks": 30, "band_budget": 200, "stacks": 9}


def as_lists(snap: dict) -> dict:
    """The snapshot with each TraceColumns made a list of its dicts: the
    Python replay's input."""
    out = dict(snap)
    out["device_traces"] = [list(t) if isinstance(t, _C.TraceColumns) else t
                            for t in snap["device_traces"]]
    return out


def loaded(snap: dict) -> dict:
    """snap pickled and read back by the loader (traces as TraceColumns)."""
    return loads_snapshot(pickle.dumps(snap, protocol=4), "snap")


FIELDS = ("n_events", "a_start", "a_end", "a_size", "a_addr", "a_stack", "allocated",
          "reserved", "reserved_end", "baseline", "ooms", "markers", "marker_source",
          "peak_index", "peak", "inconsistencies")


def model_fields(m) -> dict:
    out = {k: getattr(m, k) for k in FIELDS}
    out = {k: list(v) if v is not None and not isinstance(v, (int, str, list)) else v
           for k, v in out.items()}
    out["times"] = list(m.times)
    out["stacks"] = m.stacks.stacks
    out["sites"] = m.stacks.sites
    return out


def assert_same(snap: dict, columnar: bool = True, caps: dict | None = None) -> None:
    """The native and the Python replay of snap agree, and so does every report."""
    ref = as_lists(snap)
    for dev in devices_of(snap):
        m, r = build_device(snap, dev), build_device(ref, dev)
        trace = snap["device_traces"][dev] if dev < len(snap["device_traces"]) else []
        assert m.columnar == (columnar and isinstance(trace, _C.TraceColumns))
        assert not r.columnar
        assert model_fields(m) == model_fields(r)
        assert build_payload(snap, "s", dev) == build_payload(ref, "s", dev)
        if caps:
            assert build_payload(snap, "s", dev, caps) == build_payload(ref, "s", dev, caps)
    assert summarize(snap, "s", top=50) == summarize(ref, "s", top=50)
    assert diff(snap, snap, ("a", "b"), top=50) == diff(ref, ref, ("a", "b"), top=50)


def frames(i: int) -> list[dict]:
    """Stack i: stacks i and i + 4 have one site (the user's line), so sites
    merge stacks and their largest allocations tie."""
    return [{"filename": "/venv/site-packages/torch/nn/x.py", "line": i, "name": "f"},
            {"filename": f"/home/u/model_{i % 2}.py", "line": 10 + i % 4, "name": "layer"}]


def entry(action: str, addr: int, size: int, t: int | None, stack: int | None, **extra) -> dict:
    e = {"action": action, "addr": addr, "size": size, "stream": 0}
    if t is not None:
        e["time_us"] = t
    if stack is not None:
        e["frames"] = frames(stack)
    e.update(extra)
    return e


def segment(addr: int, blocks: list[tuple[int, str, int | None]], device: int = 0) -> dict:
    bl = [{"size": s, "requested_size": s - 1, "state": st,
           "frames": frames(k) if k is not None else []} for s, st, k in blocks]
    return {"device": device, "address": addr, "total_size": sum(s for s, _, _ in blocks),
            "allocated_size": 0, "active_size": 0, "requested_size": 0, "stream": 0,
            "segment_type": "large", "segment_pool_id": (0, 0), "is_expandable": False,
            "frames": [], "blocks": bl}


def every_rule() -> dict:
    """One trace with each rule of the replay: allocations live before the
    trace (a free of an unknown address, end blocks the trace never names),
    pending frees, a double alloc, a free of a freed address, segment
    events, an oom, 'snapshot' and 'user_defined' entries, user_metadata
    runs (str, int, None), entries without a time."""
    M = 1 << 20
    t = [
        entry("segment_alloc", 0, 64 * M, 1, None),
        entry("free_completed", 5 * M, 300, 2, 4),           # allocated before the trace
        entry("alloc", 0, 100, 3, 0, user_metadata="warmup"),
        entry("alloc", 1024, 200, None, 1, user_metadata="warmup"),
        entry("free_requested", 0, 100, 5, 0, user_metadata=7),
        entry("free_completed", 0, 100, 6, 0, user_metadata=None),
        entry("alloc", 1024, 250, 7, 2, user_metadata=7),     # allocated twice
        entry("free_completed", 0, 100, 8, 0),               # freed already
        entry("snapshot", 0, 0, 9, None),
        {"action": "oom", "size": 1 << 40, "device_free": 12, "stream": 0, "time_us": 10,
         "frames": frames(5)},
        entry("user_defined", 0, 0, 11, None, name="region"),
        entry("segment_map", 64 * M, 2 * M, 12, None, user_metadata="step 2"),
        entry("alloc", 4096, 1000, 13, 3),
        entry("free_requested", 6 * M, 50, 14, 6),            # pending at the end
        entry("segment_unmap", 64 * M, 2 * M, 15, None),
        entry("segment_free", 9 * M, 2 * M, 16, None),
    ]
    segs = [segment(0, [(1024, "inactive", None), (512, "active_allocated", 2),
                        (3072, "active_allocated", None), (4096, "active_allocated", 3),
                        (1 << 20, "active_pending_free", 7), (8192, "active_allocated", 8)]),
            segment(1 << 30, [(2048, "active_allocated", 9)], device=1)]
    return {"segments": segs, "device_traces": [t, [entry("alloc", 1 << 30, 2048, 1, 9)]],
            "external_annotations": [], "allocator_settings": {}}


def test_every_rule_of_the_replay_matches_the_python_one():
    snap = loaded(every_rule())
    assert isinstance(snap["device_traces"][0], _C.TraceColumns)
    m = build_device(snap, 0)
    assert m.columnar and m.inconsistencies == 2 and m.reserved is not None
    assert [o["index"] for o in m.ooms] == [9] and m.times[3] is None
    assert_same(snap, caps=SMALL_CAPS)


def test_optimizer_regions_and_gpumem_steps_are_placed_the_same():
    snap = every_rule()
    trace = [{k: v for k, v in e.items() if k != "user_metadata"}
             for e in snap["device_traces"][0] if e["action"] != "user_defined"]
    snap["device_traces"][0] = trace
    snap["external_annotations"] = [
        {"name": "Optimizer.step#SGD.step", "stage": stage, "device": 0, "time_us": t}
        for t, stage in ((4, "START"), (6, "END"), (11, "START"), (13, "END"))]
    got = loaded(snap)
    assert build_device(got, 0).marker_source == "ends of Optimizer.step regions"
    assert_same(got, caps=SMALL_CAPS)
    snap["external_annotations"] = [{"name": f"step {k}", "stage": "START", "device": 0,
                                     "time_us": t} for k, t in enumerate((3, 8, 12))]
    got = loaded(snap)
    assert build_device(got, 0).marker_source == "gpumem.record's steps"
    assert_same(got, caps=SMALL_CAPS)


def random_snapshot(seed: int, n: int) -> dict:
    """A random trace over a few addresses, sizes and stacks: every action
    in any order, times and frames sometimes missing."""
    rng = random.Random(seed)
    actions = ["alloc"] * 6 + ["free_completed"] * 3 + ["free_requested", "free",
               "segment_alloc", "segment_free", "snapshot", "oom", "user_defined"]
    addrs = [k * 4096 for k in range(12)]
    trace = []
    for i in range(n):
        a = rng.choice(actions)
        t = None if rng.random() < 0.1 else 1000 + i * rng.choice((1, 1, 2))
        st = None if rng.random() < 0.15 else rng.randrange(8)
        if a == "oom":
            e = {"action": "oom", "size": rng.randrange(1, 1 << 30),
                 "device_free": rng.randrange(1 << 20)}
            trace.append(e if t is None else dict(e, time_us=t))
            continue
        e = entry(a, rng.choice(addrs), rng.choice((512, 4096, 1 << 20, 3 << 20)), t, st)
        if rng.random() < 0.05:
            e["user_metadata"] = rng.choice(("a", "b", 3, None))
        trace.append(e)
    blocks = [(4096, rng.choice(("active_allocated", "inactive", "active_pending_free")),
               rng.choice((None, 1, 2))) for _ in range(12)]
    return {"segments": [segment(0, blocks)], "device_traces": [trace]}


def test_categories_are_the_same_on_both_replays():
    """A snapshot recorded with categories: the view's category curves, bands'
    and blocks' categories and summary's breakdowns from either model."""
    from gpumem.categories.classify import CATEGORIES, PHASES, TABLE_KEY
    from gpumem.categories.report import equation_terms, allocation_categories
    snap = random_snapshot(5, 700)
    n, rng = len(snap["device_traces"][0]), random.Random(5)
    snap[TABLE_KEY] = {
        "version": 1, "categories": list(CATEGORIES),
        "device_traces": [[rng.randrange(len(CATEGORIES)) for _ in range(n)]],
        "trace_phases": [[rng.randrange(len(PHASES)) for _ in range(n)]],
        "segments": [[rng.randrange(len(CATEGORIES)) for _ in snap["segments"][0]["blocks"]]]}
    got = loaded(snap)
    assert_same(got, caps=SMALL_CAPS)
    m, r = build_device(got, 0), build_device(as_lists(got), 0)
    assert m.columnar and not r.columnar
    cats = allocation_categories(got, m)
    assert cats == allocation_categories(got, r) and len(set(cats)) > 3
    assert equation_terms(got, m, cats) == equation_terms(got, r, cats)


@pytest.mark.parametrize("seed", range(8))
def test_random_traces_replay_the_same(seed):
    snap = loaded(random_snapshot(seed, 400 + 60 * seed))
    assert isinstance(snap["device_traces"][0], _C.TraceColumns)
    assert_same(snap, caps=SMALL_CAPS)


def test_sampled_snapshots_take_the_python_grouping_on_columns():
    snap = random_snapshot(3, 500)
    snap["gpumem_sampling"] = {"mean_bytes": 1 << 16, "threshold_bytes": 1 << 21, "seed": 1}
    assert_same(loaded(snap), caps=SMALL_CAPS)


def test_values_past_64_bits_are_replayed_in_python():
    """Sums past 2**63 leave the int64 columns: _C.trace_model declines and
    the Python replay runs on the records, with the same result."""
    snap = {"segments": [], "device_traces": [[entry("alloc", 4096 * k, (1 << 63) + k, k, 0)
                                               for k in range(3)]]}
    got = loaded(snap)
    assert isinstance(got["device_traces"][0], _C.TraceColumns)
    assert _C.trace_model(got["device_traces"][0], [], 0) is None
    assert not build_device(got, 0).columnar
    assert_same(got, columnar=False)


@pytest.mark.slow
def test_a_generated_training_snapshot(tmp_path):
    """30,000 events: more than the view's 10,000 samples, so the sampled
    timeline and the band choice run in C too."""
    path = tmp_path / "big.pickle"
    write_snapshot(path, 30_000)
    snap = load_snapshot(str(path))
    assert build_device(snap, 0).columnar
    assert_same(snap)


@pytest.mark.slow
@pytest.mark.skipif(not REAL, reason=f"real snapshots not found at {SNAPSHOTS}")
@pytest.mark.parametrize("path", REAL, ids=[p.name[:40] for p in REAL])
def test_real_snapshots(path):
    assert_same(load_snapshot(str(path)), caps=SMALL_CAPS)


@pytest.mark.parametrize("seed", range(4))
def test_band_choice_matches_the_python_one_past_the_sorted_head(seed):
    """_C.model_bands sorts only a selected head of the candidates (4 x
    max_bands) and the rest when the budget's skips walk past it: the same
    bands as view._bands' full sort, ties in size and life included."""
    from array import array
    from bisect import bisect_left
    from types import SimpleNamespace
    from gpumem.snapshots.view import _bands
    rng = random.Random(seed)
    n, events = 3000, 20_000
    starts = [rng.randrange(-1, events) for _ in range(n)]
    ends = [min(events, s + 1 + rng.choice((1, 10, 300, 5000))) for s in starts]
    sizes = [rng.choice((512, 4096, 1 << 20)) for _ in range(n)]
    samples = sorted(rng.sample(range(events), 200))
    cols = SimpleNamespace(columnar=True, a_start=array("q", starts), a_end=array("q", ends),
                           a_size=array("Q", sizes))
    lists = SimpleNamespace(columnar=False, a_start=starts, a_end=ends, a_size=sizes)
    for max_bands, budget in ((10, 10**9), (10, 60), (25, 400), (40, 2), (5000, 10**9)):
        got = _bands(cols, samples, max_bands, budget)
        assert got == _bands(lists, samples, max_bands, budget), (max_bands, budget)
    # budget 2 takes only the shortest-lived, late in the order: past the head of 160
    order = sorted((-sizes[a], -(bisect_left(samples, e) - 1 - bisect_left(samples, s)), a)
                   for a, (s, e) in enumerate(zip(starts, ends))
                   if bisect_left(samples, s) < bisect_left(samples, e))
    rank = {c[2]: k for k, c in enumerate(order)}
    assert max(rank[a] for a, _, _ in _bands(cols, samples, 40, 2)[1]) >= 4 * 40


def test_band_choice_with_no_or_a_negative_band_limit_is_empty():
    """A max_bands of 0 or below chooses no band (a negative one made a
    negative head for the selection and crashed the process)."""
    from array import array
    s, e, sz = array("q", [0, 1, 2] * 20), array("q", [5, 6, 7] * 20), array("q", [512] * 60)
    for max_bands in (0, -1, -(1 << 40)):
        assert _C.model_bands(s, e, sz, [1, 3, 4], max_bands, 5) == (60, [])
    assert len(_C.model_bands(s, e, sz, [1, 3, 4], 2, 100)[1]) == 2


def test_column_passes_refuse_bad_columns():
    from array import array
    with pytest.raises(TypeError):
        _C.model_live([0, 1], [1, 2], 0)
    with pytest.raises(ValueError, match="different lengths"):
        _C.model_live(array("q", [0]), array("q", [1, 2]), 0)
    with pytest.raises(ValueError, match="outside the table"):
        _C.model_remap(array("q", [0, 5]), [1, 2])
    with pytest.raises(ValueError, match="outside the trace"):
        _C.model_ranges(array("q", [0]), array("Q", [1]), array("q", [0, 1]), [(1, 5)])
    with pytest.raises(TypeError):
        _C.trace_model([], [], 0)
