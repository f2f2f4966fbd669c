"""The ``gpumem view`` page in headless Chromium, offline.

Debian's ``chromium`` runs with --headless --no-sandbox --disable-gpu, every
proxy pointed at a closed port and every host name unresolvable, so any
attempt to reach the network fails (and is recorded: none may happen).  It
is driven over the DevTools protocol on --remote-debugging-pipe (file
descriptors 3 and 4, NUL-separated JSON), with a small client written here
on the standard library.

Asserted: the timeline, the segment map and the table render (elements with
content, canvases with drawn pixels), the console and the page report no
error, hovering a band of the timeline (a real mouse event through DevTools'
Input domain, and a synthetic one from JavaScript) shows its stack in the
tooltip, the segment map's tooltip names a block, the table sorts.  A
screenshot of each page is saved in the test's tmp dir.
"""

from __future__ import annotations

import base64
import fcntl
import io
import json
import os
import pickle
import select
import shutil
import subprocess
import tempfile
import time
from contextlib import redirect_stderr, redirect_stdout

import pytest

from gpumem import cli

from test_summary_diff import LOSS_LINE, PARAM_LINE, REAL_NAMES, needs_c, record_run
from test_view import segments_only

CHROMIUM = shutil.which("chromium")
pytestmark = [pytest.mark.slow,  # left out of the fast tier (see pyproject.toml)
              pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed "
                                                          "(apt-get install chromium)")]
WIDTH, HEIGHT = 1400, 1000


class Chromium:
    """Headless Chromium over --remote-debugging-pipe (fd 3: commands in, fd 4: out)."""

    def __init__(self) -> None:
        self.profile = tempfile.mkdtemp(prefix="gpumem-chromium-")
        to_chrome_r, self._w = os.pipe()
        self._r, from_chrome_w = os.pipe()

        def child() -> None:  # runs in the child before exec: put the pipe ends at 3 and 4
            a = fcntl.fcntl(to_chrome_r, fcntl.F_DUPFD, 10)
            b = fcntl.fcntl(from_chrome_w, fcntl.F_DUPFD, 10)
            os.dup2(a, 3)
            os.dup2(b, 4)
            os.set_inheritable(3, True)
            os.set_inheritable(4, True)

        args = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
                "--remote-debugging-pipe", "--proxy-server=127.0.0.1:9",
                "--proxy-bypass-list=<-loopback>", "--host-resolver-rules=MAP * ~NOTFOUND",
                "--no-first-run", "--no-default-browser-check", "--disable-extensions",
                "--disable-background-networking", "--disable-sync", "--disable-dev-shm-usage",
                "--disable-component-update", f"--user-data-dir={self.profile}",
                f"--window-size={WIDTH},{HEIGHT}", "about:blank"]
        self.proc = subprocess.Popen(args, preexec_fn=child, close_fds=False,
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE)
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self._buf = b""
        self._id = 0
        self.events: list[dict] = []

    def send(self, method: str, params: dict | None = None, session: str | None = None,
             timeout: float = 60) -> dict:
        self._id += 1
        msg = {"id": self._id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._w, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            reply = self._read(deadline)
            if reply.get("id") == self._id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def _read(self, deadline: float) -> dict:
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("chromium did not answer in time")
            ready, _, _ = select.select([self._r], [], [], left)
            if ready:
                chunk = os.read(self._r, 1 << 20)
                if not chunk:
                    err = self.proc.stderr.read().decode(errors="replace")[-2000:]
                    raise RuntimeError(f"chromium closed the pipe: {err}")
                self._buf += chunk
        raw, self._buf = self._buf.split(b"\0", 1)
        return json.loads(raw)

    def close(self) -> None:
        try:
            self.send("Browser.close", timeout=10)
        except Exception:  # noqa: BLE001 - it may already be gone
            pass
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc.stderr.close()
        os.close(self._w)
        os.close(self._r)
        shutil.rmtree(self.profile, ignore_errors=True)


class Page:
    def __init__(self, browser: Chromium, path) -> None:
        self.b = browser
        target = browser.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = browser.send("Target.attachToTarget",
                                    {"targetId": target, "flatten": True})["sessionId"]
        self.first_event = len(browser.events)
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.cmd(f"{domain}.enable")
        self.cmd("Emulation.setDeviceMetricsOverride",
                 {"width": WIDTH, "height": HEIGHT, "deviceScaleFactor": 1, "mobile": False})
        self.url = f"file://{os.path.abspath(path)}"
        self.cmd("Page.navigate", {"url": self.url})
        deadline = time.monotonic() + 60
        while self.js("document.body && document.body.getAttribute('data-ready')") != "1":
            if self.js("window.gpumemErrors && window.gpumemErrors.length"):
                break
            assert time.monotonic() < deadline, "the page never finished drawing"
            time.sleep(0.05)

    def cmd(self, method: str, params: dict | None = None) -> dict:
        return self.b.send(method, params, session=self.session)

    def js(self, expression: str):
        r = self.cmd("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                          "awaitPromise": True})
        if "exceptionDetails" in r:
            raise AssertionError(f"{expression}: {r['exceptionDetails']}")
        return r["result"].get("value")

    def events(self, method: str) -> list[dict]:
        return [e for e in self.b.events[self.first_event:]
                if e.get("method") == method and e.get("sessionId") == self.session]

    def problems(self) -> list[str]:
        out = [json.dumps(e["params"])[:300] for e in self.events("Runtime.exceptionThrown")]
        out += [json.dumps(e["params"])[:300] for e in self.events("Runtime.consoleAPICalled")
                if e["params"].get("type") in ("error", "assert", "warning")]
        out += [json.dumps(e["params"])[:300] for e in self.events("Log.entryAdded")
                if e["params"]["entry"].get("level") in ("error", "warning")]
        out += list(self.js("window.gpumemErrors") or [])
        return out

    def requests(self) -> list[str]:
        return [e["params"]["request"]["url"] for e in self.events("Network.requestWillBeSent")]

    def screenshot(self, path) -> bytes:
        self.js("document.getElementById('tooltip').hidden = true")
        height = self.js("document.documentElement.scrollHeight")
        self.cmd("Emulation.setDeviceMetricsOverride",
                 {"width": WIDTH, "height": min(int(height), 5000), "deviceScaleFactor": 1,
                  "mobile": False})
        self.js("gpumemView.redraw()")
        data = base64.b64decode(self.cmd("Page.captureScreenshot", {"format": "png"})["data"])
        with open(path, "wb") as f:
            f.write(data)
        self.cmd("Emulation.setDeviceMetricsOverride",
                 {"width": WIDTH, "height": HEIGHT, "deviceScaleFactor": 1, "mobile": False})
        self.js("gpumemView.redraw()")
        return data

    def mouse(self, x: float, y: float) -> None:
        self.cmd("Input.dispatchMouseEvent", {"type": "mouseMoved", "x": x, "y": y})


@pytest.fixture(scope="module")
def browser():
    b = Chromium()
    yield b
    b.close()


# Painted pixels in the plot area (not background) of a canvas, counted in the page.
PAINTED = """(function (id) {
  var c = document.getElementById(id), d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
  var n = 0;
  for (var i = 0; i < d.length; i += 4) if (d[i + 3] > 0 && (d[i] < 240 || d[i + 1] < 240 || d[i + 2] < 240)) n++;
  return n;
})(%r)"""


# The first band whose innermost frame contains a text.
BAND_OF = """(function (text) {
  var D = gpumemView.data, B = D.timeline.bands;
  for (var b = 0; b < B.length; b++)
    if (B[b][3] >= 0 && D.frames[D.stacks[B[b][3]][0]].indexOf(text) >= 0) return b;
  return -1; })(%r)"""


def check_clean(page: Page) -> None:
    assert page.problems() == []
    assert page.requests() == [page.url], page.requests()  # nothing but the page itself


def check_rendered(page: Page, *, timeline: bool) -> None:
    assert page.js("document.getElementById('title').textContent").startswith(
        page.js("gpumemView.data.file"))
    assert page.js("document.querySelectorAll('#stats .stat').length") >= 4
    if timeline:
        assert page.js("document.getElementById('timeline-wrap').hidden") is False
        assert int(page.js("document.getElementById('timeline-canvas').dataset.drawn")) > 0
        assert page.js(PAINTED % "timeline-canvas") > 5000
    else:
        assert page.js("document.getElementById('timeline-wrap').hidden") is True
        assert "no allocation trace" in page.js(
            "document.getElementById('timeline-empty').textContent")
    assert int(page.js("document.getElementById('segments-canvas').dataset.drawn")) > 0
    assert page.js(PAINTED % "segments-canvas") > 500
    assert page.js("document.querySelectorAll('#segment-stats .stat').length") >= 4
    assert page.js("document.querySelectorAll('#sites-table tbody tr').length") > 0
    assert page.js("document.querySelectorAll('#sites-table thead th').length") >= 4


@needs_c
def test_gpumem_snapshot_renders_and_hovers(browser, tmp_path, capsys):
    _before, after = record_run(tmp_path, leak=True, warmup=0, steps=4, marker="metadata")
    html = tmp_path / "leak.html"
    assert cli.main(["view", str(after), "-o", str(html)]) == 0
    capsys.readouterr()
    page = Page(browser, html)
    check_rendered(page, timeline=True)

    # A real mouse move over a parameter's band: its stack shows in the tooltip.
    band = page.js(BAND_OF % f":{PARAM_LINE}:make_params")
    point = page.js(f"gpumemView.bandPoint({band})")
    assert point["height"] > 10 and point["width"] > 1
    page.mouse(point["x"], point["y"])
    assert page.js("document.getElementById('tooltip').hidden") is False
    assert page.js("document.getElementById('tooltip').dataset.band") == str(band)
    text = page.js("document.getElementById('tooltip').textContent")
    assert f"test_summary_diff.py:{PARAM_LINE}:make_params" in text, text
    assert "16.0 MiB" in text and "still allocated when the snapshot was taken" in text

    # A synthetic event from JavaScript on a leaked loss: the loss line shows.
    loss = page.js(BAND_OF % f":{LOSS_LINE}:compute_loss")
    assert loss >= 0
    text = page.js(f"""(function () {{
      var p = gpumemView.bandPoint({loss}), ov = document.getElementById('timeline-overlay');
      ov.dispatchEvent(new MouseEvent('mousemove', {{clientX: p.x, clientY: p.y, bubbles: true}}));
      return document.getElementById('tooltip').textContent; }})()""")
    # The loss band is thin (64 KiB among MiBs): it or its neighbour is hit; check the hit band.
    hit = int(page.js("document.getElementById('tooltip').dataset.band"))
    stack0 = page.js(f"gpumemView.data.frames[gpumemView.data.stacks["
                     f"gpumemView.data.timeline.bands[{hit}][3]][0]]")
    assert stack0 in text

    # Clicking keeps the stack below the chart.
    page.cmd("Input.dispatchMouseEvent", {"type": "mousePressed", "x": point["x"],
                                          "y": point["y"], "button": "left", "clickCount": 1})
    page.cmd("Input.dispatchMouseEvent", {"type": "mouseReleased", "x": point["x"],
                                          "y": point["y"], "button": "left", "clickCount": 1})
    assert "make_params" in page.js("document.getElementById('timeline-detail').textContent")

    # The segment map: hover the first allocated block.
    seg_text = page.js("""(function () {
      var c = document.getElementById('segments-canvas'), r = c.getBoundingClientRect();
      c.dispatchEvent(new MouseEvent('mousemove', {clientX: r.left + 3, clientY: r.top + 8, bubbles: true}));
      return document.getElementById('tooltip').textContent; })()""")
    assert "segment 0x" in seg_text and ("allocated" in seg_text or "free" in seg_text)

    # The table sorts when a header is clicked.
    page.js("document.querySelectorAll('#sites-table thead th')[7].click()")
    assert page.js("document.querySelectorAll('#sites-table thead th')[7]"
                   ".getAttribute('aria-sort')") == "descending"
    sizes = page.js("Array.from(document.querySelectorAll('#sites-table tbody tr'))"
                    ".map(function (r) { return r.cells[7].textContent; })")
    assert sizes[0] == "24.0 MiB"  # the backward workspace

    # Zooming redraws without errors.
    page.cmd("Input.dispatchMouseEvent", {"type": "mouseWheel", "x": point["x"],
                                          "y": point["y"], "deltaX": 0, "deltaY": -300})
    assert page.js("gpumemView.redraw()") >= 0
    png = page.screenshot(tmp_path / "gpumem-view.png")
    assert png.startswith(b"\x89PNG") and len(png) > 20_000
    check_clean(page)


def test_segments_only_page(browser, tmp_path, capsys):
    snap = tmp_path / "segs.pickle"
    snap.write_bytes(pickle.dumps(segments_only(), protocol=4))
    html = tmp_path / "segs.html"
    assert cli.main(["view", str(snap), "-o", str(html)]) == 0
    capsys.readouterr()
    page = Page(browser, html)
    check_rendered(page, timeline=False)
    text = page.js("""(function () {
      var c = document.getElementById('segments-canvas'), r = c.getBoundingClientRect();
      c.dispatchEvent(new MouseEvent('mousemove', {clientX: r.left + 5, clientY: r.top + 8, bubbles: true}));
      return document.getElementById('tooltip').textContent; })()""")
    assert "/u/train.py:7:step" in text and "allocated" in text
    header = page.js("document.getElementById('stats').textContent")
    assert "reserved but unallocated at the snapshot (no trace)" in header, header
    assert "at peak" not in header and "peak reserved" not in header, header
    notes = page.js("document.getElementById('notes').textContent")
    assert "No allocation trace" in notes, notes
    page.screenshot(tmp_path / "segments-only.png")
    check_clean(page)


REAL = "JasperSolt__snapshot__6720e249.pickle"


def test_real_snapshot_page(browser, shared_snapshots, tmp_path, capsys):
    path = os.path.join(shared_snapshots, REAL)
    if not os.path.exists(path):
        pytest.skip(f"{REAL} is not in {shared_snapshots}")
    html = tmp_path / "real.html"
    assert cli.main(["view", path, "-o", str(html)]) == 0
    capsys.readouterr()
    page = Page(browser, html)
    check_rendered(page, timeline=True)
    band = page.js("""(function () {   // the largest band with a Python stack
      var D = gpumemView.data, B = D.timeline.bands, best = -1;
      for (var b = 0; b < B.length; b++) {
        var s = B[b][3];
        if (s < 0 || !D.stacks[s].some(function (f) { return D.frames[f].indexOf('.py:') >= 0; }))
          continue;
        if (best < 0 || B[b][2] > B[best][2]) best = b;
      }
      return best; })()""")
    point = page.js(f"gpumemView.bandPoint({band})")
    page.mouse(point["x"], point["y"])
    assert page.js("document.getElementById('tooltip').dataset.band") == str(band)
    text = page.js("document.getElementById('tooltip').textContent")
    site = page.js(f"gpumemView.data.sites[gpumemView.data.stack_site["
                   f"gpumemView.data.timeline.bands[{band}][3]]][0]")
    assert "bytes at 0x" in text and site in text and "C++ frames" in text, text
    assert text.count(".py:") >= 2  # the Python frames are what the tooltip shows
    page.screenshot(tmp_path / "real.png")
    check_clean(page)


@pytest.mark.parametrize("name", REAL_NAMES)
def test_every_real_snapshot_renders_cleanly(browser, shared_snapshots, tmp_path, capsys, name):
    path = os.path.join(shared_snapshots, name)
    if not os.path.exists(path):
        pytest.skip(f"{name} is not in {shared_snapshots}")
    html = tmp_path / "page.html"
    assert cli.main(["view", path, "-o", str(html)]) == 0
    capsys.readouterr()
    page = Page(browser, html)
    assert page.js("document.body.getAttribute('data-ready')") == "1"
    assert page.js("document.querySelectorAll('#stats .stat').length") >= 4
    has_trace = page.js("gpumemView.data.timeline !== null")
    assert page.js("document.getElementById('timeline-wrap').hidden") is (not has_trace)
    if page.js("gpumemView.bandCount()"):
        band = page.js("gpumemView.largestBand()")
        point = page.js(f"gpumemView.bandPoint({band})")
        page.mouse(point["x"], point["y"])
        if point["height"] >= 3 and point["width"] >= 1:  # else too thin to aim at
            assert page.js("document.getElementById('tooltip').dataset.band") == str(band)
    check_clean(page)


def test_tolerated_odd_values_render_cleanly(browser, tmp_path):
    """Snapshots with odd but accepted values (see test_cli_fuzz) draw without errors."""
    from test_cli_fuzz import VARIANTS
    names = [n for n, (kind, _data, expected) in VARIANTS.items()
             if expected == 0 and kind == "bytes" and n.startswith(("number-", "type-"))]
    assert len(names) >= 40
    for name in names[::3]:  # a third of them keeps this under ten seconds
        src = tmp_path / f"{name}.pickle"
        src.write_bytes(VARIANTS[name][1])
        html = tmp_path / f"{name}.html"
        out, err = io.StringIO(), io.StringIO()
        with redirect_stdout(out), redirect_stderr(err):
            assert cli.main(["view", str(src), "-o", str(html)]) == 0, err.getvalue()
        page = Page(browser, html)
        assert page.js("document.body.getAttribute('data-ready')") == "1", name
        assert page.problems() == [], name
        page.cmd("Page.close")


# Draws the region between ya and yb over 400 random steps of 0.7 px with
# gpumemView.paintSteps and as a path filled by the browser (what the timeline
# did before): [largest alpha difference, mean difference, pixels painted].
PAINT_VS_PATH = """(function () {
  var w = 300, h = 120, n = 400, xs = new Float64Array(n + 1), ya = new Float64Array(n),
      yb = new Float64Array(n), seed = 7, i;
  function rnd() { seed = (seed * 1103515245 + 12345) % 2147483648; return seed / 2147483648; }
  for (i = 0; i <= n; i++) xs[i] = 10.3 + i * (w - 20) / n;
  for (i = 0; i < n; i++) {
    var a = 5 + rnd() * 100, b = 5 + rnd() * 100;
    ya[i] = Math.min(a, b); yb[i] = Math.max(a, b);
  }
  var c1 = document.createElement("canvas"); c1.width = w; c1.height = h;
  var img = c1.getContext("2d").createImageData(w, h);
  gpumemView.paintSteps(img, n, xs, ya, yb, [0, 0, 0]);
  var c2 = document.createElement("canvas"); c2.width = w; c2.height = h;
  var x2 = c2.getContext("2d");
  x2.beginPath(); x2.moveTo(xs[0], ya[0]);
  for (i = 0; i < n; i++) { x2.lineTo(xs[i], ya[i]); x2.lineTo(xs[i + 1], ya[i]); }
  for (i = n - 1; i >= 0; i--) { x2.lineTo(xs[i + 1], yb[i]); x2.lineTo(xs[i], yb[i]); }
  x2.closePath(); x2.fillStyle = "#000"; x2.fill();
  var d = x2.getImageData(0, 0, w, h).data, p = img.data, worst = 0, sum = 0, painted = 0;
  for (i = 3; i < d.length; i += 4) {
    var e = Math.abs(d[i] - p[i]); worst = Math.max(worst, e); sum += e;
    if (p[i] > 128) painted++;
  }
  return [worst, sum / (w * h), painted]; })()"""

# lineTo calls while the page draws both canvases again.
LINE_TOS = """(function () {
  var P = CanvasRenderingContext2D.prototype, orig = P.lineTo, n = 0;
  P.lineTo = function (x, y) { n++; return orig.call(this, x, y); };
  try { gpumemView.redraw(); } finally { P.lineTo = orig; }
  return n; })()"""


def test_a_dense_timeline_is_drawn_a_pixel_column_at_a_time(browser, tmp_path):
    """Note [Pixel columns] in viewer.js: with 10,000 samples for about 1,300
    pixels, the small-allocations band is painted pixel by pixel, as the
    browser's anti-aliasing painted its path; that path, of four vertices a
    sample, kept the rasteriser busy for most of a second on the 1M-event
    page."""
    from test_view_scale import synthetic_snapshot
    src = tmp_path / "dense.pickle"
    src.write_bytes(pickle.dumps(synthetic_snapshot(60_000), protocol=4))
    html = tmp_path / "dense.html"
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        assert cli.main(["view", str(src), "-o", str(html)]) == 0, err.getvalue()
    page = Page(browser, html)
    check_rendered(page, timeline=True)
    worst, mean, painted = page.js(PAINT_VS_PATH)
    assert painted > 5000 and worst <= 48 and mean <= 2, (worst, mean, painted)
    samples = page.js("gpumemView.data.timeline.ev.length")
    width = page.js("document.getElementById('timeline-canvas').width")
    assert samples == 10_000 and width < 2_000
    # The small band's path alone had 4 vertices a sample (40,000 here; main's
    # page made 55,059 calls in all); the bands' own outlines are about 15,000.
    assert page.js(LINE_TOS) < 2 * samples
    check_clean(page)
