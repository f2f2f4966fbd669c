"""The viewer's first render on a 1,000,000-event snapshot, in headless Chromium.

    python benchmarks/viewer_render.py [--baseline REV [--baseline-ext SO]] [--rounds N]
                                       [--no-compile] [--json]

Builds the synthetic 1,000,000-event training snapshot of
tests/test_view_scale.py and, each round, times what a user waits for: the
``gpumem view`` command (a new process: load the pickle, analyse, write the
page), then the page opened in Debian's headless chromium (driven over
DevTools as tests/test_view_browser.py does, offline) until it marks itself
drawn (body[data-ready=1]: header, timeline, segments and table rendered)
and answers (the poll waits while the page is still painting).
The figure is the median over the rounds of the sum, "first render"; the
``gpumem view`` process's CPU seconds (user + system) are given too, since
on a shared machine they move less than its wall seconds.  With
--baseline REV, gpumem REV's viewer (its gpumem/ package from git, with the
working tree's built gpumem._C beside it, or with --baseline-ext SO REV's own
build) is measured in the same rounds, alternately, in the same browser, so
the two figures come from one run (benchmarks/gpumem_trees.py).  Each
viewer runs from a scratch copy of its package, byte-compiled first as an
installed gpumem is (--no-compile leaves that out: every module is then
compiled on each run when PYTHONDONTWRITEBYTECODE is set).
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from gpumem_trees import byte_compile, copy_working_tree, revision_tree  # noqa: E402


def write_page(snapshot: Path, out: Path, package_root: Path) -> tuple[float, float]:
    """``gpumem view`` in a new process, with the gpumem package under
    package_root: seconds taken, and the CPU seconds (user + system) it used."""
    env = dict(os.environ, PYTHONPATH=str(package_root))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "gpumem", "view", str(snapshot), "-o", str(out)],
                   env=env, check=True, capture_output=True, text=True, cwd=str(package_root))
    took = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return took, (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)


def first_render_ms(browser, page_path: Path) -> tuple[float, float]:
    """Navigate a fresh tab to the page: ms until it marks itself drawn, and
    the page's own performance.now() when its script marked it."""
    from test_view_browser import Page
    t0 = time.perf_counter()
    page = Page(browser, page_path)   # returns once body[data-ready=1] (polls every 50 ms)
    took = (time.perf_counter() - t0) * 1000
    errors = page.problems()
    if errors:
        raise RuntimeError(f"the page reported errors: {errors[:3]}")
    script_ms = page.js("window.gpumemView.readyMs")
    page.b.send("Target.closeTarget", {"targetId": page.cmd("Target.getTargetInfo")
                                       ["targetInfo"]["targetId"]})
    return took, script_ms


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", metavar="REV", help="also measure gpumem REV's viewer")
    parser.add_argument("--baseline-ext", metavar="SO",
                        help="REV's built gpumem._C extension (default: the working tree's)")
    parser.add_argument("--no-compile", action="store_true",
                        help="do not byte-compile the packages first")
    parser.add_argument("--rounds", type=int, default=5, help="page loads per viewer (default 5)")
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--json", action="store_true", help="print JSON instead of lines")
    args = parser.parse_args(argv)
    if shutil.which("chromium") is None:
        print("viewer_render: error: Debian's chromium is not installed (./setup.sh installs it)",
              file=sys.stderr)
        return 2
    from test_view_browser import Chromium
    from test_view_scale import synthetic_snapshot

    tmp = Path(tempfile.mkdtemp(prefix="gpumem-viewer-bench-"))
    try:
        snap = tmp / "big.pickle"
        with open(snap, "wb") as f:
            pickle.dump(synthetic_snapshot(args.events), f, protocol=4)
        trees = {"current": copy_working_tree(tmp / "current")}
        if args.baseline:
            trees["baseline"] = revision_tree(
                args.baseline, tmp / "baseline",
                Path(args.baseline_ext) if args.baseline_ext else None)
        if not args.no_compile:
            for tree in trees.values():
                byte_compile(tree)
        pages = {name: tmp / f"{name}.html" for name in trees}
        view_ms: dict[str, list[float]] = {name: [] for name in trees}
        draw_ms: dict[str, list[float]] = {name: [] for name in trees}
        script_ms: dict[str, list[float]] = {name: [] for name in trees}
        view_cpu_ms: dict[str, list[float]] = {name: [] for name in trees}
        load_before = os.getloadavg()
        browser = Chromium()
        try:
            for name, tree in trees.items():   # warm the browser and caches up, not counted
                write_page(snap, pages[name], tree)
                first_render_ms(browser, pages[name])
            for _ in range(args.rounds):
                for name, tree in trees.items():
                    took, cpu = write_page(snap, pages[name], tree)
                    view_ms[name].append(took * 1000)
                    view_cpu_ms[name].append(cpu * 1000)
                    took, in_page = first_render_ms(browser, pages[name])
                    draw_ms[name].append(took)
                    script_ms[name].append(in_page)
        finally:
            browser.close()
        result = {"events": args.events, "rounds": args.rounds, "compiled": not args.no_compile,
                  "load_avg_before": [round(x, 2) for x in load_before],
                  "load_avg_after": [round(x, 2) for x in os.getloadavg()], "viewers": {}}
        for name in trees:
            total = [v + d for v, d in zip(view_ms[name], draw_ms[name])]
            result["viewers"][name] = {
                "revision": args.baseline if name == "baseline" else "working tree",
                "first_render_ms_median": round(statistics.median(total), 1),
                "first_render_ms": [round(t, 1) for t in total],
                "gpumem_view_ms_median": round(statistics.median(view_ms[name]), 1),
                "gpumem_view_cpu_ms_median": round(statistics.median(view_cpu_ms[name]), 1),
                "browser_draw_ms_median": round(statistics.median(draw_ms[name]), 1),
                "page_script_ms_median": round(statistics.median(script_ms[name]), 1),
                "page_bytes": pages[name].stat().st_size}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"load average {result['load_avg_before'][0]} before, "
              f"{result['load_avg_after'][0]} after")
        for name, v in result["viewers"].items():
            print(f"{name} ({v['revision']}): first render {v['first_render_ms_median']} ms "
                  f"(median of {args.rounds}: gpumem view {v['gpumem_view_ms_median']} ms, "
                  f"{v['gpumem_view_cpu_ms_median']} CPU ms, "
                  f"browser {v['browser_draw_ms_median']} ms), page "
                  f"{v['page_bytes'] / 2**20:.2f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
