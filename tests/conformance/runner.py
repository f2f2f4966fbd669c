"""Run one conformance group in this process and print its results as JSON.

    python tests/conformance/runner.py GROUP MODE [VARIANT]

started by test_conformance.py on the simulated GPU, once per group, variant
and mode.  MODE "torch" leaves torch's own CUDA caching allocator in place;
"gpumem" calls gpumem.install() first (an exception from it is kept in
harness.INSTALL_ERROR, its warnings in harness.INSTALL_WARNINGS: a group
about configuration checks them; in any other group a check fails when
install() failed).  Every check_* of the group runs in the order it
is written; a failure is recorded with its traceback and the next check
runs.  Between checks recording is turned off and the cache emptied.

The last stdout line is RESULTS_MARKER + JSON {check: {"status": "pass" |
"fail" | "skip", "detail": str, "seconds": float}}; the process then leaves
with os._exit(0), so nothing torch does at interpreter exit can lose it.
"""

from __future__ import annotations

import importlib
import inspect
import json
import os
import sys
import time
import traceback

RESULTS_MARKER = "CONFORMANCE-RESULTS "


def checks_of(module) -> list:
    """The check_* functions of a group module, in the order they are written."""
    fns = [f for n, f in vars(module).items()
           if n.startswith("check_") and inspect.isfunction(f) and f.__module__ == module.__name__]
    return sorted(fns, key=lambda f: f.__code__.co_firstlineno)


def _detail(exc: BaseException) -> str:
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return text[-4000:]


def _tidy() -> None:
    import torch
    try:
        torch.cuda.memory._record_memory_history(None)
    except Exception:
        pass
    try:
        import gc
        gc.collect()
        torch.cuda.empty_cache()
    except Exception:
        pass


def run(group: str, mode: str, variant: str = "") -> dict:
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, here)
    os.environ["GPUMEM_CONFORMANCE_MODE"] = mode
    import harness
    harness.MODE = mode
    import torch  # noqa: F401  (before gpumem, as a user's script does)
    module = importlib.import_module(group)
    # A variant whose settings an older release lacks: every check skips,
    # before install() or torch reads them.
    gate = getattr(module, "VARIANT_SINCE", {}).get(variant)
    lacking = harness.older_than(*gate) if gate else None
    if lacking:
        return {fn.__name__: {"status": "skip", "detail": lacking, "seconds": 0}
                for fn in checks_of(module)}
    if mode == "gpumem":
        import warnings
        import gpumem
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                gpumem.install()
            except BaseException as e:  # kept for the checks to inspect
                harness.INSTALL_ERROR = e
        harness.INSTALL_WARNINGS = [str(w.message) for w in caught]
    results = {}
    for fn in checks_of(module):
        t0 = time.monotonic()
        try:
            if harness.INSTALL_ERROR is not None and not getattr(module, "INSTALL_MAY_FAIL", False):
                raise AssertionError("gpumem.install() failed") from harness.INSTALL_ERROR
            if getattr(fn, "gpumem_only", False) and mode != "gpumem":
                raise harness.Skip("a gpumem feature; torch has no counterpart")
            lacking = harness.missing_interface(fn)
            if lacking:
                raise harness.Skip(lacking)
            fn()
            res = {"status": "pass", "detail": ""}
        except harness.Skip as e:
            res = {"status": "skip", "detail": str(e)}
        except BaseException as e:
            res = {"status": "fail", "detail": _detail(e)}
        res["seconds"] = round(time.monotonic() - t0, 3)
        results[fn.__name__] = res
        _tidy()
    return results


def main() -> None:
    group, mode = sys.argv[1], sys.argv[2]
    variant = sys.argv[3] if len(sys.argv) > 3 else ""
    try:
        results = run(group, mode, variant)
    except BaseException as e:
        results = {"__run__": {"status": "fail", "detail": _detail(e), "seconds": 0}}
    sys.stdout.write("\n" + RESULTS_MARKER + json.dumps(results) + "\n")
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
