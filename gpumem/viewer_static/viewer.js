/* gpumem view: draws the data gpumem/snapshots/view.py embeds in #gpumem-data.
 *
 * Written for gpumem, plain JavaScript and <canvas>, no libraries and no network.
 * Three views share one tooltip: the allocated-memory timeline (bands stacked in
 * allocation order, the small ones folded into one grey band by view.py), the
 * segment map (reserved memory laid out byte-proportionally, block by block) and
 * the table of allocation sites.  window.gpumemView exposes a few read-only
 * hooks (band positions, counts) for tests.
 */
(function () {
  "use strict";
  var D = JSON.parse(document.getElementById("gpumem-data").textContent);
  var $ = function (id) { return document.getElementById(id); };
  var tooltip = $("tooltip");
  var DPR = window.devicePixelRatio || 1;

  // ------------------------------------------------------------ formatting
  var UNITS = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
  function fmtBytes(n) {
    if (n === null || n === undefined) return "unknown";
    var neg = n < 0, v = Math.abs(n), u = 0;
    while (v >= 1024 && u < UNITS.length - 1) { v /= 1024; u++; }
    var s = u === 0 ? String(Math.round(v)) + " B" : v.toFixed(v < 10 ? 2 : v < 100 ? 1 : 0) + " " + UNITS[u];
    return (neg ? "-" : "") + s;
  }
  function fmtCount(n) { return String(n).replace(/\B(?=(\d{3})+(?!\d))/g, ","); }
  function fmtMs(ms) {
    if (ms === null || ms === undefined) return "";
    return Math.abs(ms) >= 1000 ? "+" + (ms / 1000).toFixed(3) + " s" : "+" + ms.toFixed(1) + " ms";
  }
  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  }
  // Snapshots recorded with categories: every view colours an allocation by its
  // category, the colours of the category chart (viewer_categories.js), so one
  // allocation has one colour wherever it appears; otherwise by source line.
  var CATEGORY_COLORS = { parameter: "#2f855a", optimizer_state: "#d69e2e", gradient: "#dd6b20",
                          activation: "#c53030", input: "#1d232b", temporary: "#9f7aea",
                          autograd_detail: "#3182ce", unknown: "#b8c0cc", workspace: "#718096" };
  var CAT_NAMES = D.categories ? D.categories.all_names || null : null;
  function categoryColor(name) { return CATEGORY_COLORS[name] || "#718096"; }
  function allocColor(stack, cat) {
    if (CAT_NAMES && cat !== undefined && cat >= 0 && cat < CAT_NAMES.length)
      return categoryColor(CAT_NAMES[cat]);
    return siteColor(stackSite(stack));
  }
  function siteColor(site) {
    if (site < 0) return "#b8c0cc";
    var h = (site * 137.508) % 360;
    return "hsl(" + h.toFixed(1) + ",58%," + (site % 2 ? 60 : 68) + "%)";
  }
  // Stack ids: >= 0 an embedded stack, -1 none, <= -2 only the site (-2 - site).
  function stackSite(stack) {
    if (stack >= 0) return D.stack_site[stack];
    if (stack <= -2) return -2 - stack;
    return -1;
  }
  function siteLabel(site) { return site >= 0 ? D.sites[site][0] : "(no stack recorded)"; }
  var TIP_FRAMES = 14;
  function isPython(line) { return /\.pyw?:\d+:|^<[^>]*>:\d+:/.test(line); }
  // The whole stack (short=false), or for a tooltip its Python frames (else its first
  // frames), at most TIP_FRAMES of them, saying what was left out.
  function stackText(stack, short) {
    if (stack >= 0) {
      var lines = D.stacks[stack].map(function (f) { return D.frames[f]; });
      if (!lines.length) return "(no stack recorded)";
      if (!short) return lines.join("\n");
      var py = lines.filter(isPython), shown = py.length ? py : lines, more = [];
      if (py.length && py.length < lines.length) more.push((lines.length - py.length) + " C++ frames");
      if (shown.length > TIP_FRAMES) {
        more.push((shown.length - TIP_FRAMES) + " more frames");
        shown = shown.slice(0, TIP_FRAMES);
      }
      return shown.join("\n") + (more.length ? "\n(" + more.join(", ") + " not shown; click for the full stack)" : "");
    }
    if (stack <= -2) return "(stack not embedded, to keep the page small)";
    return "(no stack recorded: allocated before recording, or recorded without context)";
  }

  // ------------------------------------------------------------ tooltip
  function showTip(ev, title, lines, stack) {
    tooltip.textContent = "";
    tooltip.appendChild(el("div", "tt-title", title));
    lines.forEach(function (l) { if (l) tooltip.appendChild(el("div", "tt-line", l)); });
    if (stack !== undefined) tooltip.appendChild(el("pre", "tt-stack", stackText(stack, true)));
    tooltip.hidden = false;
    var w = tooltip.offsetWidth, h = tooltip.offsetHeight;
    var x = ev.clientX + 14, y = ev.clientY + 14;
    if (x + w > window.innerWidth - 4) x = Math.max(4, ev.clientX - w - 14);
    if (y + h > window.innerHeight - 4) y = Math.max(4, ev.clientY - h - 14);
    tooltip.style.left = x + "px";
    tooltip.style.top = y + "px";
  }
  function hideTip() { tooltip.hidden = true; tooltip.removeAttribute("data-band"); }

  // ------------------------------------------------------------ header
  function stat(box, value, label, cls) {
    var s = el("div", "stat" + (cls ? " " + cls : ""));
    s.appendChild(el("b", null, value));
    s.appendChild(el("span", null, label));
    box.appendChild(s);
  }
  function renderHeader() {
    var h = D.header;
    $("title").textContent = D.file + " \u2014 device " + D.device;
    var box = $("stats");
    var traced = h.peak_index !== null && h.peak_index !== undefined;
    stat(box, fmtBytes(h.peak_allocated), traced ? "peak allocated (event " + fmtCount(h.peak_index) + ")" : "allocated (no trace)");
    stat(box, fmtBytes(h.peak_reserved), traced && h.reserved_known ? "peak reserved" : "reserved (at the snapshot)");
    if (h.frag_at_peak !== null && h.frag_at_peak !== undefined) {
      var pct = h.reserved_at_peak ? 100 * h.frag_at_peak / h.reserved_at_peak : 0;
      stat(box, fmtBytes(h.frag_at_peak) + " (" + pct.toFixed(1) + "%)",
           traced ? "reserved but unallocated at peak" : "reserved but unallocated at the snapshot (no trace)",
           pct > 30 ? "warn" : "");
    }
    stat(box, fmtCount(h.events), "trace events");
    stat(box, fmtCount(h.allocations), "allocations in the trace");
    stat(box, fmtCount(h.segments), "segments at the snapshot");
    if (h.ooms) stat(box, String(h.ooms), "out-of-memory events", "bad");
    if (D.devices.length > 1) {
      var others = D.devices.filter(function (d) { return d.device !== D.device; })
        .map(function (d) { return d.device + " (" + fmtCount(d.events) + " events, " + fmtBytes(d.reserved) + " reserved)"; });
      D.notes.push("Other devices in this snapshot: " + others.join(", ") + "; open them with gpumem view --device N.");
    }
    D.notes.forEach(function (n) { $("notes").appendChild(el("li", null, n)); });
  }

  // ------------------------------------------------------------ timeline
  var TL = D.timeline, tl = null;
  function niceStep(range, target) {
    var raw = range / target, p = Math.pow(2, Math.floor(Math.log2(Math.max(raw, 1))));
    var steps = [1, 2, 4, 8];
    for (var i = 0; i < steps.length; i++) if (p * steps[i] >= raw) return p * steps[i];
    return p * 16;
  }
  function niceDec(range, target) {
    var raw = range / target, p = Math.pow(10, Math.floor(Math.log10(Math.max(raw, 1e-9))));
    var m = [1, 2, 5, 10];
    for (var i = 0; i < m.length; i++) if (p * m[i] >= raw) return p * m[i];
    return p * 10;
  }
  function initTimeline() {
    if (!TL) {
      $("timeline-wrap").hidden = true;
      var box = $("timeline-empty");
      box.hidden = false;
      box.textContent = "This snapshot has no allocation trace for device " + D.device +
        " (it was taken with enabled='state', with memory_snapshot(), or before any allocation), " +
        "so there is no timeline. The segment view and the table below show its state. " +
        "Record with gpumem.record(...) or torch.cuda.memory._record_memory_history() to get one.";
      return;
    }
    // Bands stack in allocation order from 0; the folded small allocations ride on top.
    // A band's offset is kept only where it changes: (sample, offset) pairs.
    var S = TL.ev.length, B = TL.bands, nb = B.length;
    var cj = new Array(nb), cv = new Array(nb), last = new Float64Array(nb), active = [];
    var byStart = new Array(S), big = new Float64Array(S);
    for (var b = 0; b < nb; b++) {
      cj[b] = []; cv[b] = []; last[b] = -1;
      (byStart[B[b][0]] = byStart[B[b][0]] || []).push(b);
    }
    var yMax = 1;
    for (var j = 0; j < S; j++) {
      var starting = byStart[j];
      if (starting) for (var q = 0; q < starting.length; q++) active.push(starting[q]);
      var y = 0, kept = 0;
      for (var k = 0; k < active.length; k++) {   // in place: the bands still live, in order
        var bb = active[k];
        if (B[bb][1] < j) continue;
        active[kept++] = bb;
        if (y !== last[bb]) { cj[bb].push(j); cv[bb].push(y); last[bb] = y; }
        y += B[bb][2];
      }
      active.length = kept;
      big[j] = y;
      yMax = Math.max(yMax, y + TL.small[j], TL.reserved ? TL.reserved[j] : 0);
    }
    for (b = 0; b < nb; b++) { cj[b] = Int32Array.from(cj[b]); cv[b] = Float64Array.from(cv[b]); }
    tl = { cj: cj, cv: cv, big: big, lo: TL.ev[0], hi: TL.n_events, yMax: yMax * 1.06, hover: -1,
           drag: null, canvas: $("timeline-canvas"), overlay: $("timeline-overlay"), drawn: 0 };
    var ov = tl.overlay;
    ov.addEventListener("mousemove", onTimelineMove);
    ov.addEventListener("mouseleave", function () { tl.drag = null; setHover(-1); hideTip(); });
    ov.addEventListener("mousedown", function (e) { tl.drag = { x: e.clientX, lo: tl.lo, hi: tl.hi, moved: false }; });
    window.addEventListener("mouseup", function () { if (tl.drag) setTimeout(function () { tl.drag = null; }, 0); });
    ov.addEventListener("click", onTimelineClick);
    ov.addEventListener("dblclick", function () { tl.lo = TL.ev[0]; tl.hi = TL.n_events; drawTimeline(); });
    ov.addEventListener("wheel", onTimelineWheel, { passive: false });
  }
  function geom() {
    var c = tl.canvas, w = c.clientWidth, h = c.clientHeight;
    return { w: w, h: h, L: 78, R: 16, T: 18, B: 44, W: w - 94, H: h - 62 };
  }
  function xOf(g, e) { return g.L + (e - tl.lo) / (tl.hi - tl.lo) * g.W; }
  function yOf(g, v) { return g.T + g.H - v / tl.yMax * g.H; }
  function evEnd(j) { return j + 1 < TL.ev.length ? TL.ev[j + 1] : TL.n_events; }
  function sizeCanvas(c) {
    var w = c.clientWidth, h = c.clientHeight;
    if (c.width !== Math.round(w * DPR) || c.height !== Math.round(h * DPR)) {
      c.width = Math.round(w * DPR); c.height = Math.round(h * DPR);
    }
    var ctx = c.getContext("2d");
    ctx.setTransform(DPR, 0, 0, DPR, 0, 0);
    ctx.clearRect(0, 0, w, h);
    return ctx;
  }
  function visibleRange() {
    var ev = TL.ev, lo = 0, hi = ev.length - 1;
    while (lo < hi && evEnd(lo) <= tl.lo) lo++;
    while (hi > lo && ev[hi] > tl.hi) hi--;
    return [lo, hi];
  }
  // Index of the last offset change of band b at or before sample j.
  function changeAt(b, j) {
    var a = tl.cj[b], lo = 0, hi = a.length - 1;
    while (lo < hi) { var mid = (lo + hi + 1) >> 1; if (a[mid] <= j) lo = mid; else hi = mid - 1; }
    return lo;
  }
  function offAt(b, j) { return tl.cv[b][changeAt(b, j)]; }
  // A band's outline as steps: its level holds from ev[j] until the next sample.
  function bandPath(ctx, g, b, r) {
    var band = TL.bands[b], size = band[2], cj = tl.cj[b], cv = tl.cv[b];
    var j0 = Math.max(band[0], r[0]), j1 = Math.min(band[1], r[1]);
    if (j0 > j1) return false;
    var k0 = changeAt(b, j0), k1 = changeAt(b, j1), k, x;
    ctx.moveTo(xOf(g, TL.ev[j0]), yOf(g, cv[k0] + size));
    for (k = k0 + 1; k <= k1; k++) {
      x = xOf(g, TL.ev[cj[k]]);
      ctx.lineTo(x, yOf(g, cv[k - 1] + size));
      ctx.lineTo(x, yOf(g, cv[k] + size));
    }
    x = xOf(g, evEnd(j1));
    ctx.lineTo(x, yOf(g, cv[k1] + size));
    ctx.lineTo(x, yOf(g, cv[k1]));
    for (k = k1; k > k0; k--) {
      x = xOf(g, TL.ev[cj[k]]);
      ctx.lineTo(x, yOf(g, cv[k]));
      ctx.lineTo(x, yOf(g, cv[k - 1]));
    }
    ctx.lineTo(xOf(g, TL.ev[j0]), yOf(g, cv[k0]));
    ctx.closePath();
    return true;
  }
  function stepLine(ctx, g, value, r) {   // value(j): the level from ev[j] to the next sample
    ctx.moveTo(xOf(g, TL.ev[r[0]]), yOf(g, value(r[0])));
    for (var j = r[0]; j <= r[1]; j++) {
      ctx.lineTo(xOf(g, TL.ev[j]), yOf(g, value(j)));
      ctx.lineTo(xOf(g, evEnd(j)), yOf(g, value(j)));
    }
  }
  // Note [Pixel columns]
  // Rationale: zoomed out, a 1,000,000-event trace has ten thousand samples for about
  // thirteen hundred pixels; the grey small-allocations band, drawn as one path of four
  // vertices a sample, kept the browser's rasteriser busy for most of a second after the
  // script had drawn (the category chart's bands are such paths too).
  // Approach: those bands are painted a device-pixel column at a time into an ImageData
  // (paintSteps): each pixel gets the share of its area the band covers, the coverage the
  // rasteriser's anti-aliasing gave the path, so the picture is the same (within a few
  // levels of 255) at a cost that grows with the pixels and the samples.
  // Limitations: the allocations' own bands and the reserved line are still paths (each
  // band's anti-aliased edges against its neighbours are part of the picture); the
  // ImageData is put before anything else is drawn, so only the first layer can be painted.
  // Paints, source-over onto img (an ImageData: unpremultiplied RGBA, device pixels), the
  // region between ya[i] and yb[i] (rows, ya[i] <= yb[i]) over steps i = 0..n-1, step i
  // spanning columns xs[i] to xs[i + 1] (xs increasing; all fractional).  Each pixel gets
  // the share of its area the region covers, what a rasteriser's anti-aliasing gives the
  // step outline as a path, a column at a time: the cost grows with the pixels and the
  // steps, not with a path of two vertices a step (Note [Pixel columns]).
  function paintSteps(img, n, xs, ya, yb, rgb) {
    var w = img.width, h = img.height, px = img.data, i, s = 0;
    var part = new Float64Array(h + 1), full = new Float64Array(h + 1);
    for (var c = 0; c < w; c++) {
      while (s < n && xs[s + 1] <= c) s++;
      if (s >= n) break;
      if (xs[s] >= c + 1) continue;
      part.fill(0); full.fill(0);
      for (i = s; i < n && xs[i] < c + 1; i++) {
        var ox = Math.min(xs[i + 1], c + 1) - Math.max(xs[i], c);
        var a = Math.max(0, ya[i]), b = Math.min(h, yb[i]);
        if (ox <= 0 || b <= a) continue;
        var ra = Math.floor(a), rb = Math.floor(b);
        if (ra === rb) { part[ra] += ox * (b - a); continue; }
        part[ra] += ox * (ra + 1 - a); full[ra + 1] += ox; full[rb] -= ox;
        part[rb] += ox * (b - rb);
      }
      for (var row = 0, acc = 0; row < h; row++) {
        acc += full[row];
        var v = Math.min(1, acc + part[row]);
        if (v <= 1e-3) continue;
        var at = (row * w + c) * 4, under = px[at + 3] / 255 * (1 - v), out = v + under;
        if (under === 0) {
          px[at] = rgb[0]; px[at + 1] = rgb[1]; px[at + 2] = rgb[2];
        } else {
          for (var k = 0; k < 3; k++) px[at + k] = Math.round((rgb[k] * v + px[at + k] * under) / out);
        }
        px[at + 3] = Math.round(out * 255);
      }
    }
  }
  // The small allocations' band, painted into the plot area of the freshly cleared canvas.
  var SMALL_RGB = [0xc9, 0xce, 0xd6];   // #c9ced6
  function paintSmall(ctx, g, r) {
    var x0 = Math.round(g.L * DPR), y0 = Math.round((g.T - 2) * DPR);
    var w = Math.round((g.L + g.W) * DPR) - x0, h = Math.round((g.T + g.H) * DPR) - y0;
    if (w <= 0 || h <= 0) return;
    var n = r[1] - r[0] + 1, xs = new Float64Array(n + 1), ya = new Float64Array(n), yb = new Float64Array(n);
    for (var i = 0; i < n; i++) {
      var j = r[0] + i;
      xs[i] = xOf(g, TL.ev[j]) * DPR - x0;
      ya[i] = yOf(g, tl.big[j] + TL.small[j]) * DPR - y0;
      yb[i] = yOf(g, tl.big[j]) * DPR - y0;
    }
    xs[n] = xOf(g, evEnd(r[1])) * DPR - x0;
    var img = ctx.createImageData(w, h);
    paintSteps(img, n, xs, ya, yb, SMALL_RGB);
    ctx.putImageData(img, x0, y0);
  }
  function reservedAt(j) { return TL.reserved[j]; }
  function drawTimeline() {
    if (!tl) return;
    var c = tl.canvas, ctx = sizeCanvas(c), g = geom();
    sizeCanvas(tl.overlay);
    var r = visibleRange(), j;
    var vmax = 1;
    for (j = r[0]; j <= r[1]; j++) vmax = Math.max(vmax, TL.total[j], TL.reserved ? TL.reserved[j] : 0);
    tl.yMax = vmax * 1.08;
    paintSmall(ctx, g, r);   // small allocations, folded into one band on top of the others
    ctx.save();
    ctx.beginPath(); ctx.rect(g.L, g.T - 2, g.W, g.H + 2); ctx.clip();
    var drawn = 0;
    for (var b = 0; b < TL.bands.length; b++) {
      ctx.beginPath();
      if (!bandPath(ctx, g, b, r)) continue;
      ctx.fillStyle = allocColor(TL.bands[b][3], TL.bands[b][7]);
      ctx.fill();
      drawn++;
    }
    if (TL.reserved) {
      ctx.beginPath(); stepLine(ctx, g, reservedAt, r);
      ctx.strokeStyle = "#1d232b"; ctx.lineWidth = 1.2; ctx.setLineDash([]); ctx.stroke();
    }
    ctx.setLineDash([4, 3]); ctx.lineWidth = 1;
    ctx.strokeStyle = "#c53030";
    ctx.beginPath(); ctx.moveTo(g.L, yOf(g, TL.peak[1])); ctx.lineTo(g.L + g.W, yOf(g, TL.peak[1])); ctx.stroke();
    ctx.setLineDash([]);
    ctx.font = "11px system-ui, sans-serif";
    var lastLabel = -1e9, dense = TL.markers.length > g.W / 6;
    TL.markers.forEach(function (m) {
      var x = xOf(g, m[0]);
      if (x < g.L || x > g.L + g.W) return;
      ctx.strokeStyle = "rgba(43,108,176," + (dense ? "0.9" : "0.45") + ")";
      ctx.beginPath(); ctx.moveTo(x, g.T); ctx.lineTo(x, dense ? g.T + 6 : g.T + g.H); ctx.stroke();
      var label = String(m[1]);
      if (x > lastLabel) {
        ctx.fillStyle = "#2b6cb0"; ctx.fillText(label, x + 3, g.T + 10);
        lastLabel = x + ctx.measureText(label).width + 10;
      }
    });
    TL.ooms.forEach(function (o) {
      var x = xOf(g, o[0]);
      ctx.strokeStyle = "#c53030"; ctx.lineWidth = 2; ctx.beginPath(); ctx.moveTo(x, g.T); ctx.lineTo(x, g.T + g.H); ctx.stroke();
      ctx.fillStyle = "#c53030"; ctx.fillText("OOM", x + 3, g.T + 22);
    });
    ctx.restore();
    // axes
    ctx.strokeStyle = "#9aa5b1"; ctx.lineWidth = 1; ctx.fillStyle = "#5d6673"; ctx.font = "11px system-ui, sans-serif";
    ctx.beginPath(); ctx.moveTo(g.L, g.T); ctx.lineTo(g.L, g.T + g.H); ctx.lineTo(g.L + g.W, g.T + g.H); ctx.stroke();
    var step = niceStep(tl.yMax, 6);
    ctx.textAlign = "right"; ctx.textBaseline = "middle";
    for (var v = 0; v <= tl.yMax; v += step) {
      var y = yOf(g, v);
      ctx.fillText(fmtBytes(v), g.L - 6, y);
      ctx.strokeStyle = "rgba(0,0,0,0.06)"; ctx.beginPath(); ctx.moveTo(g.L, y); ctx.lineTo(g.L + g.W, y); ctx.stroke();
    }
    var xs = niceDec(tl.hi - tl.lo, 8);
    ctx.textAlign = "center"; ctx.textBaseline = "top";
    for (var e = Math.ceil(tl.lo / xs) * xs; e <= tl.hi; e += xs) ctx.fillText(fmtCount(Math.round(e)), xOf(g, e), g.T + g.H + 5);
    ctx.fillText("trace events" + (TL.t ? " (hover for times)" : ""), g.L + g.W / 2, g.T + g.H + 24);
    ctx.textAlign = "left"; ctx.fillStyle = "#c53030"; ctx.textBaseline = "bottom";
    ctx.fillText("peak " + fmtBytes(TL.peak[1]), g.L + 4, yOf(g, TL.peak[1]) - 2);
    tl.drawn = drawn;
    c.setAttribute("data-bands", String(TL.bands.length));
    c.setAttribute("data-drawn", String(drawn));
    setHover(tl.hover);
  }
  function hitTimeline(px, py) {
    var g = geom();
    if (px < g.L || px > g.L + g.W || py < g.T || py > g.T + g.H) return null;
    var e = tl.lo + (px - g.L) / g.W * (tl.hi - tl.lo), ev = TL.ev;
    var lo = 0, hi = ev.length - 1;
    if (e < ev[0]) return null;
    while (lo < hi) { var mid = (lo + hi + 1) >> 1; if (ev[mid] <= e) lo = mid; else hi = mid - 1; }
    var j = lo, v = (g.T + g.H - py) / g.H * tl.yMax;
    if (v < 0) return null;
    if (v >= tl.big[j]) {
      if (v < tl.big[j] + TL.small[j]) return { kind: "small", j: j };
    } else {
      for (var b = 0; b < TL.bands.length; b++) {
        var band = TL.bands[b];
        if (band[0] > j || band[1] < j) continue;
        var off = offAt(b, j);
        if (v >= off && v < off + band[2]) return { kind: "band", b: b, j: j };
      }
    }
    if (TL.reserved && v <= TL.reserved[j]) return { kind: "free", j: j };
    return { kind: "empty", j: j };
  }
  function setHover(b) {
    if (!tl) return;
    tl.hover = b;
    var ctx = sizeCanvas(tl.overlay);
    if (b < 0) return;
    var g = geom();
    ctx.save(); ctx.beginPath(); ctx.rect(g.L, g.T - 2, g.W, g.H + 2); ctx.clip();
    ctx.beginPath();
    if (bandPath(ctx, g, b, visibleRange())) {
      ctx.fillStyle = "rgba(255,255,255,0.25)"; ctx.fill();
      ctx.strokeStyle = "#1d232b"; ctx.lineWidth = 1.5; ctx.stroke();
    }
    ctx.restore();
  }
  function when(ev) {
    var j = Math.max(0, Math.min(TL.ev.length - 1, sampleAt(ev)));
    return "event " + fmtCount(ev) + (TL.t && TL.t[j] !== null ? " (" + fmtMs(TL.t[j]) + ")" : "");
  }
  function sampleAt(ev) {
    var a = TL.ev, lo = 0, hi = a.length - 1;
    while (lo < hi) { var mid = (lo + hi + 1) >> 1; if (a[mid] <= ev) lo = mid; else hi = mid - 1; }
    return lo;
  }
  function bandInfo(b) {
    var band = TL.bands[b], site = stackSite(band[3]);
    var life = band[4] < 0 ? "allocated before the trace began" : "allocated at " + when(band[4]);
    life += band[5] < 0 ? "; still allocated when the snapshot was taken" : "; freed at " + when(band[5]);
    return { title: fmtBytes(band[2]) + " \u00b7 " + siteLabel(site),
             lines: [fmtCount(band[2]) + " bytes at " + band[6], life], stack: band[3] };
  }
  function onTimelineMove(e) {
    var rect = tl.overlay.getBoundingClientRect(), px = e.clientX - rect.left, py = e.clientY - rect.top;
    if (tl.drag) {
      var dx = e.clientX - tl.drag.x;
      if (Math.abs(dx) > 3) tl.drag.moved = true;
      if (tl.drag.moved) {
        var span = tl.drag.hi - tl.drag.lo, de = -dx / geom().W * span;
        tl.lo = tl.drag.lo + de; tl.hi = tl.drag.hi + de;
        hideTip(); scheduleDraw(); return;
      }
    }
    var hit = hitTimeline(px, py);
    if (!hit || hit.kind === "empty") { setHover(-1); hideTip(); return; }
    var j = hit.j, at = when(TL.ev[j]);
    if (hit.kind === "band") {
      if (tl.hover !== hit.b) setHover(hit.b);
      var info = bandInfo(hit.b);
      showTip(e, info.title, info.lines, info.stack);
      tooltip.setAttribute("data-band", String(hit.b));
      return;
    }
    setHover(-1);
    if (hit.kind === "small") {
      showTip(e, "small allocations: " + fmtBytes(TL.small[j]),
              ["at " + at + ": allocations too small or too many to draw one by one, folded together",
               "total allocated there: " + fmtBytes(TL.total[j])]);
    } else {
      showTip(e, "reserved but unallocated: " + fmtBytes(TL.reserved[j] - TL.total[j]),
              ["at " + at + ": reserved " + fmtBytes(TL.reserved[j]) + ", allocated " + fmtBytes(TL.total[j])]);
    }
  }
  function onTimelineClick(e) {
    if (tl.drag && tl.drag.moved) return;
    var rect = tl.overlay.getBoundingClientRect();
    var hit = hitTimeline(e.clientX - rect.left, e.clientY - rect.top), box = $("timeline-detail");
    if (!hit || hit.kind !== "band") { box.hidden = true; return; }
    var info = bandInfo(hit.b);
    box.hidden = false;
    box.textContent = info.title + "\n" + info.lines.join("\n") + "\n\n" + stackText(info.stack);
  }
  function onTimelineWheel(e) {
    e.preventDefault();
    var g = geom(), rect = tl.overlay.getBoundingClientRect();
    var f = Math.min(1, Math.max(0, (e.clientX - rect.left - g.L) / g.W));
    var at = tl.lo + f * (tl.hi - tl.lo), k = e.deltaY > 0 ? 1.25 : 0.8;
    var span = Math.max(4, (tl.hi - tl.lo) * k);
    tl.lo = at - f * span; tl.hi = tl.lo + span;
    scheduleDraw();
  }
  var pending = false;
  function scheduleDraw() {
    if (pending) return;
    pending = true;
    requestAnimationFrame(function () { pending = false; drawTimeline(); });
  }

  // ------------------------------------------------------------ segments
  var SG = D.segments, sg = null;
  var STATE_NAMES = ["allocated", "pending free (in use on another stream)", "free (reserved but unallocated)", "merged small blocks"];
  var STATE_COLORS = [null, "#ed8936", "#e6e9ee", "#8fa3b8"];
  var PENDING_CSS = "repeating-linear-gradient(45deg,#c53030 0 3px,#fff 3px 6px)";
  function pendingPattern(ctx) {   // red and white stripes: awaiting a free on another stream
    var c = document.createElement("canvas");
    c.width = c.height = 6;
    var p = c.getContext("2d");
    p.fillStyle = "#fff"; p.fillRect(0, 0, 6, 6);
    p.strokeStyle = "#c53030"; p.lineWidth = 2;
    p.beginPath(); p.moveTo(-1, 7); p.lineTo(7, -1); p.stroke();
    return ctx.createPattern(c, "repeat");
  }
  function renderSegmentStats() {
    var s = SG.stats, box = $("segment-stats");
    stat(box, fmtBytes(s.reserved), "reserved in " + fmtCount(s.segments) + " segments");
    stat(box, fmtBytes(s.allocated), "allocated");
    if (s.pending_free) stat(box, fmtBytes(s.pending_free), "pending free", "warn");
    var pct = s.reserved ? 100 * s.free / s.reserved : 0;
    stat(box, fmtBytes(s.free) + " (" + pct.toFixed(1) + "%)", "reserved but unallocated", pct > 30 ? "warn" : "");
    stat(box, fmtBytes(s.largest_free_block), "largest free block");
    stat(box, fmtBytes(s.free_in_used_segments), "free inside segments in use (fragments)");
    var leg = $("segments-legend");
    [[CAT_NAMES ? "allocated (coloured by category, as in the chart above)"
                : "allocated (coloured by source line)",
      "linear-gradient(90deg,#7fb3d5,#e59866,#82c99a)"],
     ["pending free", PENDING_CSS], ["reserved but unallocated", STATE_COLORS[2]],
     ["merged small blocks", STATE_COLORS[3]], ["segment start", "#1d232b"]].forEach(function (x) {
      var span = el("span"), sw = el("i");
      sw.style.background = x[1]; span.appendChild(sw); span.appendChild(document.createTextNode(x[0]));
      leg.appendChild(span);
    });
  }
  function initSegments() {
    renderSegmentStats();
    var segs = SG.segs, bl = SG.blocks;
    if (!segs.length) {
      $("segments-wrap").hidden = true;
      var box = $("segments-empty"); box.hidden = false;
      box.textContent = "No segments are reserved on device " + D.device + " at the snapshot.";
      return;
    }
    var n = bl.size.length, starts = new Float64Array(n + 1), segStart = new Float64Array(segs.length + 1);
    var pos = 0;
    for (var s = 0; s < segs.length; s++) {
      segStart[s] = pos;
      var b0 = segs[s][5], nb = segs[s][6], used = 0;
      for (var b = b0; b < b0 + nb; b++) { starts[b] = pos; pos += bl.size[b]; used += bl.size[b]; }
      if (used < segs[s][1]) pos += segs[s][1] - used;   // blocks short of total_size
    }
    starts[n] = pos; segStart[segs.length] = pos;
    sg = { starts: starts, segStart: segStart, total: Math.max(1, pos), canvas: $("segments-canvas") };
    sg.canvas.addEventListener("mousemove", onSegmentsMove);
    sg.canvas.addEventListener("mouseleave", hideTip);
    renderSegmentList();
  }
  function segGeom() {
    var w = sg.canvas.clientWidth, rows = Math.max(4, Math.min(40, Math.ceil(SG.blocks.size.length / 40)));
    var rowH = 16, gap = 3;
    return { w: w, rows: rows, rowH: rowH, gap: gap, W: w - 2, bpp: sg.total / (rows * (w - 2)) };
  }
  function drawSegments() {
    if (!sg) return;
    var c = sg.canvas, g0 = segGeom();
    c.style.height = (g0.rows * (g0.rowH + g0.gap)) + "px";
    var ctx = sizeCanvas(c), g = segGeom(), bl = SG.blocks, pending = pendingPattern(ctx);
    function span(a, z, color, full) {
      var p0 = a / g.bpp, p1 = Math.max(z / g.bpp, p0 + (full ? 0 : 0.35));
      while (p0 < p1 - 1e-9) {
        var row = Math.floor(p0 / g.W), x0 = p0 - row * g.W, x1 = Math.min(p1, (row + 1) * g.W) - row * g.W;
        if (row >= g.rows) break;
        ctx.fillStyle = color;
        ctx.fillRect(1 + x0, row * (g.rowH + g.gap), Math.max(x1 - x0, 0.35), g.rowH);
        p0 = (row + 1) * g.W;
      }
    }
    span(0, sg.total, STATE_COLORS[2], true);
    var drawn = 0;
    for (var b = 0; b < bl.size.length; b++) {
      var st = bl.state[b];
      if (st === 2) continue;
      span(sg.starts[b], sg.starts[b] + bl.size[b],
           st === 0 ? allocColor(bl.stack[b], bl.cat ? bl.cat[b] : -1) : st === 1 ? pending : STATE_COLORS[st], false);
      drawn++;
    }
    for (var s = 0; s < SG.segs.length; s++) {
      var p = sg.segStart[s] / g.bpp, row = Math.floor(p / g.W);
      ctx.fillStyle = "#1d232b";
      ctx.fillRect(1 + p - row * g.W, row * (g.rowH + g.gap) - 1, 1.5, g.rowH + 2);
    }
    c.setAttribute("data-blocks", String(bl.size.length));
    c.setAttribute("data-drawn", String(drawn));
  }
  function onSegmentsMove(e) {
    var rect = sg.canvas.getBoundingClientRect(), g = segGeom();
    var px = e.clientX - rect.left - 1, py = e.clientY - rect.top;
    var row = Math.floor(py / (g.rowH + g.gap));
    if (px < 0 || px > g.W || row < 0 || row >= g.rows || py - row * (g.rowH + g.gap) > g.rowH) { hideTip(); return; }
    var at = (row * g.W + px) * g.bpp;
    if (at >= sg.total) { hideTip(); return; }
    var b = upper(sg.starts, at), s = upper(sg.segStart, at), seg = SG.segs[s], bl = SG.blocks;
    var segLine = "segment " + seg[0] + ": " + fmtBytes(seg[1]) + ", " + (seg[3] || "?") + " pool, stream " + seg[2] +
      (seg[4] ? ", expandable" : "") + ", " + seg[6] + " blocks";
    if (b >= seg[5] + seg[6] || b < seg[5]) { showTip(e, "segment tail not covered by blocks", [segLine]); return; }
    var st = bl.state[b];
    if (st === 3) {
      showTip(e, bl.count[b] + " small blocks merged: " + fmtBytes(bl.size[b]),
              [fmtBytes(bl.req[b]) + " of it allocated", segLine]);
      return;
    }
    var title = fmtBytes(bl.size[b]) + " \u00b7 " + STATE_NAMES[st];
    if (st < 2) title += " \u00b7 " + siteLabel(stackSite(bl.stack[b]));
    showTip(e, title, [st < 2 ? "requested " + fmtCount(bl.req[b]) + " bytes" : "", segLine], st < 2 ? bl.stack[b] : undefined);
  }
  function upper(arr, v) {   // last index i with arr[i] <= v
    var lo = 0, hi = arr.length - 2;
    while (lo < hi) { var mid = (lo + hi + 1) >> 1; if (arr[mid] <= v) lo = mid; else hi = mid - 1; }
    return lo;
  }
  function renderSegmentList() {
    var t = $("segment-list"), bl = SG.blocks;
    var rows = SG.segs.map(function (seg) {
      var free = 0, alloc = 0, largest = 0;
      for (var b = seg[5]; b < seg[5] + seg[6]; b++) {
        if (bl.state[b] === 2) { free += bl.size[b]; largest = Math.max(largest, bl.size[b]); }
        else if (bl.state[b] === 3) { alloc += bl.req[b]; free += bl.size[b] - bl.req[b]; }
        else alloc += bl.size[b];
      }
      return [seg[0], seg[1], alloc, free, largest, seg[6], seg[3], seg[2]];
    }).sort(function (a, b) { return b[3] - a[3]; }).slice(0, 25);
    var head = t.createTHead().insertRow();
    ["segment", "size", "allocated", "free", "largest free block", "blocks", "pool", "stream"].forEach(function (h) {
      head.appendChild(el("th", null, h));
    });
    var body = t.createTBody();
    rows.forEach(function (r) {
      var tr = body.insertRow();
      [r[0], fmtBytes(r[1]), fmtBytes(r[2]), fmtBytes(r[3]), fmtBytes(r[4]), String(r[5]), r[6] || "", String(r[7])]
        .forEach(function (v) { tr.insertCell().textContent = v; });
    });
  }

  // ------------------------------------------------------------ table
  var TB = D.table;
  var COLS = [
    { name: "Source line", key: 0, text: true },
    { name: "Live at peak", key: 2, bytes: true, trace: true },
    { name: "# at peak", key: 1, trace: true },
    { name: "Live at snapshot", key: 4, bytes: true },
    { name: "# at snapshot", key: 3 },
    { name: "Allocated in trace", key: 6, bytes: true, trace: true },
    { name: "# allocations", key: 5, trace: true },
    { name: "Largest", key: 7, bytes: true }
  ];
  var sortState = { key: TB.has_trace ? 2 : 4, desc: true }, filterText = "";
  function renderTable() {
    var cols = COLS.filter(function (c) { return TB.has_trace || !c.trace; });
    var thead = $("sites-table").tHead, tbody = $("sites-table").tBodies[0];
    thead.textContent = "";
    var hr = thead.insertRow();
    cols.forEach(function (c) {
      var th = el("th", null, c.name);
      if (c.key === sortState.key) th.setAttribute("aria-sort", sortState.desc ? "descending" : "ascending");
      th.addEventListener("click", function () {
        sortState = { key: c.key, desc: c.key === sortState.key ? !sortState.desc : !c.text };
        renderTable();
      });
      hr.appendChild(th);
    });
    var rows = TB.rows.slice();
    if (filterText) rows = rows.filter(function (r) { return siteLabel(r[0]).toLowerCase().indexOf(filterText) >= 0; });
    var k = sortState.key, sign = sortState.desc ? -1 : 1;
    rows.sort(function (a, b) {
      var x = k === 0 ? siteLabel(a[0]) : a[k], y = k === 0 ? siteLabel(b[0]) : b[k];
      return x < y ? -sign : x > y ? sign : 0;
    });
    tbody.textContent = "";
    rows.slice(0, 300).forEach(function (r) {
      var tr = tbody.insertRow();
      tr.setAttribute("data-site", String(r[0]));
      cols.forEach(function (c) {
        var td = tr.insertCell();
        if (c.key === 0) {
          var sw = el("span", "swatch"); sw.style.background = siteColor(r[0]);
          if (!CAT_NAMES) td.appendChild(sw);   // bands are coloured by category then td.appendChild(document.createTextNode(siteLabel(r[0])));
        } else {
          td.textContent = c.bytes ? fmtBytes(r[c.key]) : fmtCount(r[c.key]);
        }
      });
      tr.addEventListener("mousemove", function (e) {
        showTip(e, siteLabel(r[0]), ["stack of its largest allocation (" + fmtBytes(r[7]) + "):"], r[8]);
      });
      tr.addEventListener("mouseleave", hideTip);
      tr.addEventListener("click", function () {
        var next = tr.nextSibling;
        if (next && next.className === "stack-row") { next.remove(); return; }
        var row = tbody.insertBefore(document.createElement("tr"), next);
        row.className = "stack-row";
        var td = row.insertCell(); td.colSpan = cols.length; td.textContent = stackText(r[8]);
      });
    });
    $("sites-table").setAttribute("data-rows", String(rows.length));
  }
  $("table-filter").addEventListener("input", function (e) { filterText = e.target.value.toLowerCase(); renderTable(); });

  // ------------------------------------------------------------ start
  renderHeader();
  initTimeline();
  initSegments();
  renderTable();
  drawTimeline();
  drawSegments();
  var resizeTimer = 0;
  window.addEventListener("resize", function () {
    clearTimeout(resizeTimer);
    resizeTimer = setTimeout(function () { drawTimeline(); drawSegments(); }, 100);
  });

  // Read-only hooks for tests and for the curious (console).
  window.gpumemView = {
    data: D,
    fmtBytes: fmtBytes,   // shared with viewer_categories.js
    categoryColor: categoryColor,
    paintSteps: paintSteps,   // viewer_categories.js paints its stacked bands with it
    showTip: showTip,
    hideTip: hideTip,
    // Milliseconds to draw both canvases again (the cost of a zoom or a resize).
    redraw: function () {
      var t = performance.now();
      drawTimeline(); drawSegments();
      return performance.now() - t;
    },
    bandCount: function () { return TL ? TL.bands.length : 0; },
    // Client coordinates of the middle of band b at its middle sample, and its size there.
    bandPoint: function (b) {
      if (!tl) return null;
      var band = TL.bands[b], g = geom(), rect = tl.overlay.getBoundingClientRect();
      var j = (band[0] + band[1]) >> 1, off = offAt(b, j);
      var x = (xOf(g, TL.ev[j]) + xOf(g, evEnd(j))) / 2, y = yOf(g, off + band[2] / 2);
      return { x: rect.left + x, y: rect.top + y, height: yOf(g, off) - yOf(g, off + band[2]),
               width: xOf(g, evEnd(j)) - xOf(g, TL.ev[j]) };
    },
    largestBand: function () {   // the largest allocation drawn, the longest-lived on ties
      if (!TL || !TL.bands.length) return -1;
      var best = 0, B = TL.bands;
      for (var b = 1; b < B.length; b++) {
        if (B[b][2] > B[best][2] || (B[b][2] === B[best][2] && B[b][1] - B[b][0] > B[best][1] - B[best][0])) best = b;
      }
      return best;
    }
  };
  window.gpumemView.readyMs = performance.now();
  document.body.setAttribute("data-ready", "1");
})();
