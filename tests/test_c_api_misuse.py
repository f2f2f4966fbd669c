"""gpumem._C's raw API misused: pointer 0, unknown pointers, backends that
break their contract, and every entry point fuzzed (tests/c_api_fuzz.py).

Each case runs in a subprocess, so a crash fails the test instead of
killing pytest.  The fuzzing runs on the normal build here and on the
ASan+UBSan build of the extension in the slow tier.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import sanitized_ext
import testext

ROOT = Path(__file__).resolve().parent.parent
FUZZ = ROOT / "tests" / "c_api_fuzz.py"
BACKEND_FNS = ("seg_alloc", "seg_free", "event_create", "event_record", "event_query", "map",
               "unmap", "va_reserve")


def run(code: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "tests"),
                                         env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, (f"exit status {proc.returncode} (negative: killed by that "
                                  f"signal)\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


def test_pointer_zero_is_nobodys_block():
    """Issue 16.1: block_size(0) and record_stream(0, 1) dereferenced an empty
    slot of the pointer map; free(0) is a no-op, as cudaFree(0) and torch's are."""
    out = run("""
        import gpumem
        for exp in (False, True):
            a = gpumem._C.Allocator(capacity=256 << 20, settings={"expandable_segments": exp})
            live = a.malloc(4096)
            for call in (lambda: a.block_size(0), lambda: a.record_stream(0, 1),
                         lambda: a.block_size(live + 512), lambda: a.record_stream(live + 1, 1),
                         lambda: a.block_size(0x1000), lambda: a.record_stream(2**64 - 1, 0)):
                try:
                    call()
                except ValueError as e:
                    assert "not allocated by this allocator" in str(e), e
                else:
                    raise AssertionError("no error")
            assert a.free(0) is None
            assert a.block_size(live)[0] == 4096
            a.free(live)
            assert a.check() == (0, ""), a.check()
            assert a.stats()["allocated_bytes.all.current"] == 0
        print("ok")
    """)
    assert out.stdout.strip() == "ok"


@pytest.mark.parametrize("fn", BACKEND_FNS)
def test_backend_returning_an_unknown_code(fn):
    """Issue 16.2: a backend that returns a positive (or otherwise unknown)
    code made malloc use a block it never got; now the core treats it as a
    device error (RuntimeError carrying the backend's text), its state stays
    consistent, and the next operations work."""
    out = run(f"""
        import gpumem, testext
        seen = set()
        for code in (1, 7, 2**31 - 1, -100):
            for exp in (False, True):
                dev = testext.VirtualDevice(capacity=256 << 20, event_mode="after_n",
                                        event_after_n=1)
                a = gpumem._C.Allocator(device_backend=dev,
                                        settings={{"expandable_segments": exp}})
                dev.set_failure({fn!r}, nth=1, code=code)
                for size in (4096, 3 << 20, 4096, 3 << 20):
                    try:
                        p = a.malloc(size)
                        a.record_stream(p, 7)
                        a.free(p)
                        a.process_events()
                        a.empty_cache()
                    except RuntimeError as e:
                        assert str(e).startswith("device error"), e
                        assert "injected failure" in str(e), e
                        seen.add(str(e))
                    assert a.check() == (0, ""), a.check()
                dev.set_failure()
                p = a.malloc(1 << 20)
                a.free(p)
                a.empty_cache()
                assert a.check() == (0, ""), a.check()
        print(len(seen))
    """)
    int(out.stdout.strip())


def _fuzz(cwd, env, what):
    """The fuzzing script on the gpumem._C found in cwd (and nowhere else)."""
    env = dict(env, PYTHONPATH=str(cwd))
    start = time.monotonic()
    proc = subprocess.run([sys.executable, str(FUZZ), "--testext", env["GM_TESTEXT_SO"]],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=900,
                          stdin=subprocess.DEVNULL)
    out = proc.stdout + proc.stderr
    sanitized_ext.assert_clean(out, what)
    assert proc.returncode == 0 and "FUZZ OK" in proc.stdout, (
        f"{what}: exit status {proc.returncode}\n{out[-6000:]}")
    assert f"gpumem._C from {os.path.realpath(cwd)}" in proc.stdout, proc.stdout[:500]
    calls = int(proc.stdout.split("FUZZ OK")[1].split()[0])
    assert calls > 50_000, calls
    print(f"{what}: {calls} calls in {time.monotonic() - start:.1f} s")


def test_fuzz_every_entry_point():
    env = dict(os.environ, GM_TESTEXT_SO=testext.module.__file__)
    _fuzz(ROOT, env, "the fuzzing on the normal build")


@pytest.mark.slow
@pytest.mark.skipif(sanitized_ext.find_cc() is None, reason="no C compiler found")
def test_fuzz_every_entry_point_under_asan(tmp_path_factory):
    lib, env = sanitized_ext.built(tmp_path_factory)
    _fuzz(lib, env, "the fuzzing on the ASan+UBSan build")
