"""The extension gpumem._C built with ASan + UBSan, and how to run Python on it.

    lib, env = sanitized_ext.built(tmp_path_factory)   # built once per session
    subprocess.run([sys.executable, script], cwd=lib, env=env, ...)
    sanitized_ext.assert_clean(output, "what ran")

build() compiles the extension with GM_SANITIZE=1 into ``tmp_dir/lib``
beside a copy of the package's Python files (so ``import gpumem._C`` in a
process started there finds this build and nothing else) and the test-only
extension (tests/ext) with the same sanitizers; the environment preloads
the compiler's libasan, turns leak detection off (CPython's own allocations
at exit are not ours), lets malloc return NULL for absurd sizes as glibc's
does (instead of aborting: the code under test must handle that) and makes
UBSan fatal, and GM_TESTEXT_SO names the
test extension. Used by tests/test_native.py (the smoke run) and
tests/test_c_api_misuse.py (the fuzzing). No tests here.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT = 900
SANITIZER_MARKERS = (
    "ERROR: AddressSanitizer",
    "ERROR: LeakSanitizer",
    "WARNING: AddressSanitizer",
    "runtime error:",
    "SUMMARY: UndefinedBehaviorSanitizer",
    "WARNING: ThreadSanitizer",
)

_spec = importlib.util.spec_from_file_location("gpumem_tests_ext_build",
                                               ROOT / "tests" / "ext" / "build.py")
testext_build = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(testext_build)


def find_cc() -> list[str] | None:
    """The C compiler as an argv prefix: $CC (which may carry flags), else cc, gcc or clang."""
    env_cc = os.environ.get("CC", "").strip()
    candidates = [shlex.split(env_cc)] if env_cc else []
    candidates += [["cc"], ["gcc"], ["clang"]]
    for argv in candidates:
        path = shutil.which(argv[0])
        if path:
            return [path] + argv[1:]
    return None


_built: dict[str, tuple[Path, dict]] = {}


def built(tmp_path_factory) -> tuple[Path, dict]:
    """build() once per session, into a directory of pytest's tmp_path_factory."""
    if "asan" not in _built:
        _built["asan"] = build(tmp_path_factory.mktemp("asan-ext"), find_cc())
    return _built["asan"]


def build(tmp: Path, cc: list[str]) -> tuple[Path, dict]:
    """(directory to run in, environment) for Python on the sanitized extension."""
    lib = tmp / "lib"
    env = dict(os.environ, GM_SANITIZE="1")
    env.pop("GM_DEBUG", None)
    p = subprocess.run(
        [sys.executable, "setup.py", "-q", "build_ext", "--build-lib", str(lib),
         "--build-temp", str(tmp / "tmp")],
        cwd=ROOT, capture_output=True, text=True, env=env, timeout=TIMEOUT,
        stdin=subprocess.DEVNULL)
    assert p.returncode == 0, f"sanitized extension build failed:\n{p.stdout}{p.stderr[-6000:]}"
    assert glob.glob(str(lib / "gpumem" / "_C*.so")), f"no gpumem/_C*.so under {lib}"
    for py in (ROOT / "gpumem").rglob("*.py"):
        dest = lib / py.relative_to(ROOT)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(py, dest)
    testext_so = testext_build.build(tmp / "testext", testext_build.SANITIZE, cc=cc)
    libasan = subprocess.run(cc + ["-print-file-name=libasan.so"], capture_output=True,
                             text=True).stdout.strip()
    assert os.path.isabs(libasan) and os.path.exists(libasan), (
        f"the compiler does not know where libasan.so is: {libasan!r}")
    run_env = dict(os.environ)
    run_env.pop("PYTHONPATH", None)
    run_env.update(GM_TESTEXT_SO=str(testext_so), LD_PRELOAD=libasan,
                   ASAN_OPTIONS="detect_leaks=0:allocator_may_return_null=1",
                   UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1")
    return lib, run_env


# What allocator_may_return_null=1 prints when it does just that: not a report.
BENIGN = "AddressSanitizer failed to allocate"


def assert_clean(out: str, what: str) -> None:
    """No sanitizer report in a run's output."""
    text = "\n".join(line for line in out.splitlines() if BENIGN not in line)
    for marker in SANITIZER_MARKERS:
        assert marker not in text, f"sanitizer report in {what}:\n{text[-8000:]}"
