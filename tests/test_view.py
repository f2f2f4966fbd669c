"""``gpumem view``: the page is self-contained and its data is right.

The browser side (rendering, hover, console errors) is tests/test_view_browser.py.
"""

from __future__ import annotations

import json
import os
import pickle
import re

import pytest

from gpumem.snapshots import timeline, view
from gpumem.snapshots.summary import summarize
from gpumem import cli
from gpumem.snapshots.unpickle import load_snapshot

from test_summary_diff import (LOSS_LINE, REAL_NAMES, HERE as SCENARIO_FILE, needs_c,
                               record_run)

MiB = 1 << 20


def page_data(path) -> dict:
    text = open(path, encoding="utf-8").read()
    m = re.search(r'<script type="application/json" id="gpumem-data">(.*?)</script>', text, re.S)
    assert m, "no embedded data"
    return json.loads(m.group(1))


def check_self_contained(text: str) -> None:
    lowered = text.lower()
    assert "<link" not in lowered and "@import" not in lowered and "url(" not in lowered
    assert not re.search(r"<script[^>]*\bsrc\s*=", lowered)
    assert not re.search(r"\b(src|href)\s*=", lowered)
    assert "import(" not in text and "fetch(" not in text and "XMLHttpRequest" not in text
    assert "default-src 'none'" in text  # the page's CSP forbids loading anything


def check_timeline(data: dict) -> None:
    """Bands plus the small band add up to the total at every sample; the peak is exact."""
    tl = data["timeline"]
    S = len(tl["ev"])
    assert S and len(tl["small"]) == S == len(tl["total"])
    assert tl["ev"] == sorted(set(tl["ev"]))
    stacked = list(tl["small"])
    for s0, s1, size, *_ in tl["bands"]:
        assert 0 <= s0 <= s1 < S
        for j in range(s0, s1 + 1):
            stacked[j] += size
    assert stacked == tl["total"]
    assert max(tl["total"]) == tl["peak"][1] == data["header"]["peak_allocated"]
    starts = [b[4] for b in tl["bands"]]
    assert starts == sorted(starts)  # stacked in allocation order


def run(capsys, *argv):
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


@needs_c
def test_view_of_a_gpumem_snapshot(tmp_path, capsys):
    _before, after = record_run(tmp_path, leak=True, warmup=0, steps=4, marker="metadata")
    out_html = tmp_path / "leak.html"
    code, out, err = run(capsys, "view", after, "-o", out_html)
    assert code == 0 and err == ""
    assert f"wrote {out_html}" in out and "works offline" in out
    text = out_html.read_text(encoding="utf-8")
    check_self_contained(text)
    assert "http://" not in text and "https://" not in text
    data = page_data(out_html)
    check_timeline(data)
    summary = summarize(load_snapshot(str(after)), str(after))
    assert data["header"]["peak_allocated"] == summary["devices"][0]["peak_allocated"]
    # The leaked losses are still allocated at the end and carry their stack.
    loss = f"{SCENARIO_FILE}:{LOSS_LINE}:compute_loss"
    stacks = [(b, "\n".join(data["frames"][f] for f in data["stacks"][b[3]]))
              for b in data["timeline"]["bands"] if b[3] >= 0]
    leaked = [b for b, text in stacks if text.startswith(loss)]
    assert len(leaked) == 4 and all(b[5] == -1 for b in leaked)
    rows = {data["sites"][r[0]][0]: r for r in data["table"]["rows"]}
    assert rows[loss][3] == 4 and rows[loss][4] == 4 * 64 * 1024  # live at the snapshot
    assert [m[1] for m in data["timeline"]["markers"]][:3] == ["(no metadata)", "step 0", "step 1"]


def test_default_output_name(tmp_path, capsys):
    snap = tmp_path / "run.pickle"
    snap.write_bytes(pickle.dumps(segments_only(), protocol=4))
    code, out, _ = run(capsys, "view", snap)
    assert code == 0 and (tmp_path / "run.html").exists()
    assert view.default_output("a/b.pkl") == "a/b.html"
    assert view.default_output("snap") == "snap.html"


def segments_only(device=0):
    frames = [{"filename": "/u/train.py", "line": 7, "name": "step"}]
    return {"segments": [{"device": device, "address": 1 << 30, "total_size": 4 * MiB,
                          "stream": 0, "segment_type": "large",
                          "blocks": [{"size": MiB, "requested_size": MiB, "frames": frames,
                                      "state": "active_allocated"},
                                     {"size": MiB, "state": "active_pending_free"},
                                     {"size": 2 * MiB, "state": "inactive"}]}],
            "device_traces": []}


def test_segments_only_snapshot(tmp_path, capsys):
    snap = tmp_path / "segs.pickle"
    snap.write_bytes(pickle.dumps(segments_only(device=1), protocol=4))
    code, out, err = run(capsys, "view", snap, "-o", tmp_path / "s.html")
    assert code == 0 and err == ""
    data = page_data(tmp_path / "s.html")
    assert data["timeline"] is None and data["device"] == 1
    assert data["segments"]["stats"]["free"] == 2 * MiB
    assert data["segments"]["blocks"]["state"] == [0, 1, 2]
    (row,) = data["table"]["rows"]
    assert data["sites"][row[0]][0] == "/u/train.py:7:step" and row[3:5] == [1, MiB]


def test_device_choice(tmp_path, capsys):
    snap = segments_only(device=0)
    snap["segments"] += segments_only(device=2)["segments"]
    snap["segments"][1]["address"] = 1 << 31
    snap["device_traces"] = [[], [], [{"action": "alloc", "addr": 1 << 31, "size": 10,
                                        "stream": 0}]]
    path = tmp_path / "two.pickle"
    path.write_bytes(pickle.dumps(snap, protocol=4))
    assert run(capsys, "view", path, "-o", tmp_path / "d.html")[0] == 0
    assert page_data(tmp_path / "d.html")["device"] == 2  # the one with a trace
    assert run(capsys, "view", path, "-o", tmp_path / "d.html", "--device", "0")[0] == 0
    data = page_data(tmp_path / "d.html")
    assert data["device"] == 0 and [d["device"] for d in data["devices"]] == [0, 2]
    code, out, err = run(capsys, "view", path, "--device", "1")
    assert code == 2 and "no data for device 1 (devices with data: 0, 2)" in err


def test_script_in_names_cannot_escape(tmp_path, capsys):
    snap = segments_only()
    evil = "</script><script>document.title='pwned'</script><!--"
    snap["segments"][0]["blocks"][0]["frames"] = [{"filename": evil, "line": 1, "name": evil}]
    path = tmp_path / "evil.pickle"
    path.write_bytes(pickle.dumps(snap, protocol=4))
    assert run(capsys, "view", path, "-o", tmp_path / "e.html")[0] == 0
    text = (tmp_path / "e.html").read_text(encoding="utf-8")
    assert "<script>document.title" not in text and "<!--" not in text
    data = page_data(tmp_path / "e.html")
    assert data["frames"][0].startswith(evil)


def test_caps_fold_and_merge():
    blocks = [{"size": 4096 * (1 + i % 5), "requested_size": 1000 + i,
               "state": "active_allocated" if i % 3 else "inactive"} for i in range(300)]
    total = sum(b["size"] for b in blocks)
    trace = []
    for i in range(400):
        trace.append({"action": "alloc", "addr": (1 << 40) + i * MiB, "size": 1000 + i,
                      "stream": 0, "frames": [{"filename": f"/u/f{i % 7}.py", "line": i,
                                               "name": "g"}]})
        if i % 2:
            trace.append({"action": "free_completed", "addr": (1 << 40) + i * MiB,
                          "size": 1000 + i, "stream": 0})
    snap = {"segments": [{"device": 0, "address": 1 << 30, "total_size": total, "stream": 0,
                          "blocks": blocks}], "device_traces": [trace]}
    caps = {"samples": 100, "bands": 20, "blocks": 40, "band_budget": 10_000, "stacks": 10}
    data = json.loads(view._dumps(view.build_payload(snap, "x", None, caps)))
    check_timeline(data)
    tl = data["timeline"]
    assert len(tl["bands"]) == 20 and len(tl["ev"]) <= 101
    # The bands are the largest allocations that are live at some sample.
    m = timeline.build_device(snap, 0)
    visible = sorted((size for size, s, e in zip(m.a_size, m.a_start, m.a_end)
                      if any(s <= x < e for x in tl["ev"])), reverse=True)
    assert sorted((b[2] for b in tl["bands"]), reverse=True) == visible[:20]
    assert tl["visible"] == len(visible) > 20
    seg = data["segments"]
    assert len(seg["blocks"]["size"]) <= 40 + 40 and seg["merged"] > 0
    assert sum(seg["blocks"]["size"]) == total
    assert len(data["stacks"]) == 10
    notes = " ".join(data["notes"])
    assert "folded" in notes and "sampled" in notes and "merges" in notes and "10 distinct" in notes


@pytest.mark.slow
@pytest.mark.parametrize("name", REAL_NAMES)
def test_view_of_real_snapshots(shared_snapshots, tmp_path, capsys, name):
    path = os.path.join(shared_snapshots, name)
    if not os.path.exists(path):
        pytest.skip(f"{name} is not in {shared_snapshots}")
    out_html = tmp_path / "real.html"
    code, out, err = run(capsys, "view", path, "-o", out_html)
    assert code == 0 and err == "", err
    text = out_html.read_text(encoding="utf-8")
    check_self_contained(text)
    assert len(text.encode()) < 8 * MiB
    data = page_data(out_html)
    snap = load_snapshot(path)
    if not data["devices"]:  # an empty snapshot still gives a page
        assert data["timeline"] is None and data["segments"]["segs"] == []
        return
    report = summarize(snap, path, device=data["device"])
    dev = report["devices"][0]
    assert data["header"]["peak_allocated"] == dev["peak_allocated"]
    if data["timeline"] is not None:
        check_timeline(data)
    else:
        assert dev["source"] == "segments"
    assert data["segments"]["stats"] == dev["at_snapshot"]


def test_a_page_without_a_trace_says_why():
    empty = view.build_payload({"segments": [], "device_traces": []}, "empty.pickle")
    assert empty["timeline"] is None
    assert any(n.startswith("This snapshot is empty") and "enabled=None" in n
               for n in empty["notes"]), empty["notes"]
    state = view.build_payload(segments_only(), "segs.pickle")
    assert any(n.startswith("No allocation trace") for n in state["notes"]), state["notes"]
    traced = view.build_payload({"segments": [], "device_traces": [[
        {"action": "alloc", "addr": 4096, "size": 512, "stream": 0}]]}, "t.pickle")
    assert not any("No allocation trace" in n or "is empty" in n for n in traced["notes"])
