"""``gpumem view``'s memory-by-category chart (gpumem/snapshots/view.py's categories
payload, gpumem/viewer_static/viewer_categories.js): the payload on hand-built
snapshots, and the page in headless Chromium (slow, like test_view_browser)."""

from __future__ import annotations

import pickle

import pytest

from gpumem import cli
from gpumem.snapshots import view

from test_categories import _snapshot


def test_payload_has_the_categories_at_every_sample():
    p = view.build_payload(_snapshot(), "s.pickle")
    c = p["categories"]
    assert c["names"] == ["parameter", "optimizer_state", "gradient", "activation"]
    totals = [sum(s[j] for s in c["series"]) for j in range(len(p["timeline"]["ev"]))]
    assert totals == p["timeline"]["total"]
    assert c["at_peak"]["gradient"] == 300 and c["at_end"]["optimizer_state"] == 60


def test_each_allocation_carries_its_category_for_one_colour_everywhere():
    """The timeline's bands and the segment view's blocks are coloured by the
    category the chart below gives them, so one allocation has one colour."""
    from gpumem.categories.classify import CATEGORIES
    p = view.build_payload(_snapshot(), "s.pickle")
    names = p["categories"]["all_names"]
    assert names == list(CATEGORIES)
    by_addr = {b[6]: names[b[7]] for b in p["timeline"]["bands"]}
    assert by_addr == {"0x1000": "parameter", "0x2000": "activation", "0x3000": "gradient", "0x4000": "optimizer_state"}
    blocks = p["segments"]["blocks"]
    live = [names[c] for c, st in zip(blocks["cat"], blocks["state"]) if st == 0]
    assert live == ["parameter", "gradient", "optimizer_state"], blocks


def test_payload_without_categories_is_none():
    assert view.build_payload(_snapshot(table=False), "s.pickle")["categories"] is None


@pytest.mark.slow
def test_category_chart_renders_and_hovers(tmp_path, capsys):
    from test_view_browser import CHROMIUM, PAINTED, Chromium, Page, check_clean
    if CHROMIUM is None:
        pytest.skip("Debian's chromium is not installed (apt-get install chromium)")
    pages = {}
    for name, snap in (("cat", _snapshot()), ("plain", _snapshot(table=False))):
        path = tmp_path / f"{name}.pickle"
        path.write_bytes(pickle.dumps(snap, protocol=4))
        pages[name] = tmp_path / f"{name}.html"
        assert cli.main(["view", str(path), "-o", str(pages[name])]) == 0
    capsys.readouterr()
    b = Chromium()
    try:
        page = Page(b, pages["cat"])
        assert page.js("document.getElementById('categories-section').hidden") is False
        assert page.js(PAINTED % "categories-canvas") > 2000
        assert page.js("document.querySelectorAll('#categories-legend span').length") == 4
        rows = page.js("Array.from(document.querySelectorAll('#categories-table tr'))"
                       ".map(function (r) { return r.textContent; })")
        assert "gradient300 B300 B" in rows and "total450 B410 B" in rows, rows
        j = page.js("gpumemCategories.peakSample()")
        pt = page.js(f"gpumemCategories.bandPoint('gradient', {j})")
        page.cmd("Input.dispatchMouseEvent", {"type": "mouseMoved", "x": pt["x"], "y": pt["y"]})
        text = page.js("document.getElementById('tooltip').textContent")
        assert "450 B allocated" in text and "gradient: 300 B" in text, text
        page.screenshot(tmp_path / "categories.png")
        check_clean(page)
        # (read back after check_clean: reading pixels draws a Canvas2D warning)
        # one colour per allocation: the gradient's band above has the chart's gradient colour
        pixel = ("(function (id, p) { var c = document.getElementById(id), r = "
                 "c.getBoundingClientRect(), k = c.width / r.width; return Array.from("
                 "c.getContext('2d').getImageData(Math.round((p.x - r.left) * k), "
                 "Math.round((p.y - r.top) * k), 1, 1).data).slice(0, 3); })")
        b_grad = [b[6] for b in page.js("gpumemView.data.timeline.bands")].index("0x3000")
        above = page.js(f"{pixel}('timeline-canvas', gpumemView.bandPoint({b_grad}))")
        below = page.js(f"{pixel}('categories-canvas', gpumemCategories.bandPoint('gradient', "
                        f"{j}))")
        assert above == below, (above, below)
        plain = Page(b, pages["plain"])
        assert plain.js("document.getElementById('categories-section').hidden") is True
        assert plain.js("window.gpumemCategories === undefined") is True
        check_clean(plain)
    finally:
        b.close()
