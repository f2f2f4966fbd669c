/* gpumem view: allocated memory stacked by category (snapshots recorded with
 * categories=True; gpumem/snapshots/view.py embeds D.categories = {names, series, at_peak,
 * at_end}, series[k][j] being category k's bytes at timeline sample j).
 *
 * Written for gpumem, plain JavaScript and <canvas>.  Runs after viewer.js and
 * uses its helpers through window.gpumemView; draws nothing and leaves the
 * section hidden when the snapshot has no categories.  window.gpumemCategories
 * exposes read-only hooks for tests.
 */
(function () {
  "use strict";
  var V = window.gpumemView, D = V.data, C = D.categories, TL = D.timeline;
  if (!C || !TL || !C.names.length) return;
  var $ = function (id) { return document.getElementById(id); };
  var DPR = window.devicePixelRatio || 1;
  var section = $("categories-section"), canvas = $("categories-canvas");
  section.hidden = false;
  var S = TL.ev.length, K = C.names.length;
  var tops = [];   // tops[k][j]: top of category k's band at sample j (stacked in order)
  var run = new Array(S).fill(0), yMax = 1;
  for (var k = 0; k < K; k++) {
    var t = new Array(S);
    for (var j = 0; j < S; j++) { run[j] += C.series[k][j]; t[j] = run[j]; }
    tops.push(t);
  }
  for (j = 0; j < S; j++) yMax = Math.max(yMax, run[j]);
  yMax *= 1.08;

  function geom() {
    var r = canvas.getBoundingClientRect();
    return { L: 70, T: 8, W: Math.max(10, r.width - 80), H: Math.max(10, r.height - 30) };
  }
  function xOf(g, j) { return g.L + j / Math.max(1, S) * g.W; }
  function yOf(g, v) { return g.T + g.H - v / yMax * g.H; }
  function rgbOf(hex) {   // "#rrggbb"
    return [1, 3, 5].map(function (i) { return parseInt(hex.slice(i, i + 2), 16); });
  }

  function draw() {
    var r = canvas.getBoundingClientRect();
    canvas.width = Math.round(r.width * DPR); canvas.height = Math.round(r.height * DPR);
    var ctx = canvas.getContext("2d"), g = geom();
    ctx.setTransform(DPR, 0, 0, DPR, 0, 0);
    ctx.clearRect(0, 0, r.width, r.height);
    // Each band from 0 to its top, later ones covering, painted pixel by pixel
    // (gpumemView.paintSteps: Note [Pixel columns] in viewer.js).
    var x0 = Math.round(g.L * DPR), y0 = Math.round(g.T * DPR);
    var w = Math.round((g.L + g.W) * DPR) - x0, h = Math.round((g.T + g.H) * DPR) - y0;
    if (w > 0 && h > 0) {
      var img = ctx.createImageData(w, h), xs = new Float64Array(S + 1);
      var ya = new Float64Array(S), yb = new Float64Array(S).fill(yOf(g, 0) * DPR - y0);
      for (var j = 0; j <= S; j++) xs[j] = xOf(g, j) * DPR - x0;
      for (var k = K - 1; k >= 0; k--) {
        for (j = 0; j < S; j++) ya[j] = yOf(g, tops[k][j]) * DPR - y0;
        V.paintSteps(img, S, xs, ya, yb, rgbOf(V.categoryColor(C.names[k])));
      }
      ctx.putImageData(img, x0, y0);
    }
    ctx.strokeStyle = "#9aa5b1"; ctx.fillStyle = "#5d6673"; ctx.font = "11px system-ui, sans-serif";
    ctx.beginPath(); ctx.moveTo(g.L, g.T); ctx.lineTo(g.L, g.T + g.H); ctx.lineTo(g.L + g.W, g.T + g.H); ctx.stroke();
    for (var i = 0; i <= 4; i++) {
      var v = yMax / 1.08 * i / 4, y = yOf(g, v);
      ctx.fillText(V.fmtBytes(v), 4, y + 4);
    }
    ctx.fillText("trace event \u2192", g.L + g.W - 90, g.T + g.H + 18);
  }

  function sampleAt(px) {
    var g = geom(), j = Math.floor((px - g.L) / g.W * S);
    return j >= 0 && j < S ? j : -1;
  }
  function figuresAt(j) {
    var out = {};
    for (var k = 0; k < K; k++) out[C.names[k]] = C.series[k][j];
    return out;
  }
  canvas.addEventListener("mousemove", function (e) {
    var rect = canvas.getBoundingClientRect(), j = sampleAt(e.clientX - rect.left);
    if (j < 0) { V.hideTip(); return; }
    var f = figuresAt(j), lines = [];
    for (var k = K - 1; k >= 0; k--) lines.push(C.names[k] + ": " + V.fmtBytes(f[C.names[k]]));
    V.showTip(e, "event " + TL.ev[j] + ": " + V.fmtBytes(run[j]) + " allocated", lines);
  });
  canvas.addEventListener("mouseleave", function () { V.hideTip(); });

  var legend = $("categories-legend");
  C.names.forEach(function (n) {
    var s = document.createElement("span"), i = document.createElement("i");
    i.style.background = V.categoryColor(n);
    s.appendChild(i); s.appendChild(document.createTextNode(n));
    legend.appendChild(s);
  });
  var table = $("categories-table"), head = table.insertRow();
  ["category", "at peak", "at the end"].forEach(function (h) {
    var th = document.createElement("th"); th.textContent = h; head.appendChild(th);
  });
  C.names.concat(["total"]).forEach(function (n) {
    var tr = table.insertRow(), sum = function (o) {
      return Object.keys(o).reduce(function (a, x) { return a + o[x]; }, 0);
    };
    tr.insertCell().textContent = n;
    tr.insertCell().textContent = V.fmtBytes(n === "total" ? sum(C.at_peak) : C.at_peak[n]);
    tr.insertCell().textContent = V.fmtBytes(n === "total" ? sum(C.at_end) : C.at_end[n]);
  });
  draw();
  var timer = null;
  window.addEventListener("resize", function () { clearTimeout(timer); timer = setTimeout(draw, 100); });

  window.gpumemCategories = {
    names: C.names,
    figuresAt: figuresAt,
    // Client coordinates of the middle of category n's band at sample j.
    bandPoint: function (n, j) {
      var k = C.names.indexOf(n), g = geom(), rect = canvas.getBoundingClientRect();
      if (k < 0) return null;
      var lo = k ? tops[k - 1][j] : 0;
      return { x: rect.left + (xOf(g, j) + xOf(g, j + 1)) / 2,
               y: rect.top + yOf(g, (lo + tops[k][j]) / 2) };
    },
    peakSample: function () { return TL.ev.indexOf(TL.peak[0]); }
  };
})();
