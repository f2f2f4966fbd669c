"""The torch shim's cache: keyed by torch/CUDA/ABI/Python, validated against a
build record before it is imported, rebuilt or refused when it was built for
anything else, and never needed by gpumem._C itself. Its second module, the
record_function callbacks, is left out of the shim's build and built when
memory history first needs it, with the same checks."""

from __future__ import annotations

import json
import importlib.metadata
import shutil
import subprocess

import pytest

from torch_helpers import built_shim, last_json, run_gm, run_py

pytestmark = pytest.mark.slow  # left out of the fast tier (see pyproject.toml)


@pytest.fixture
def shim_copy(tmp_path):
    """A private copy of the session's built shim cache (safe to tamper with)."""
    src = built_shim()
    dst = tmp_path / "cache"
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns(".gpumem-build.lock"))
    # the cache may also hold shims of other torch releases (.ci/torch26 builds
    # 2.6.0's into it): this interpreter's torch is the one under test
    mine = f"shim-{importlib.metadata.version('torch')}"
    [d] = [p for p in dst.iterdir() if p.name.split("+")[0].split("-cu")[0] == mine]
    return dst, d


CHECK = '''
    import json, sys
    from gpumem.pytorch import shim_build as b
    out = {"dir": str(b.cache_dir()), "check": b.check()}
    try:
        m = b.load()
        out["loaded"] = m.build_info()["torch_version"]
    except b.ShimBuildError as e:
        out["error"] = str(e)
    out["imported"] = b.MODULE_NAME in sys.modules
    print(json.dumps(out))
'''


def test_cache_dir_names_what_the_shim_is_for(shim_copy):
    root, d = shim_copy
    o = last_json(run_py(CHECK, env={"GPUMEM_CACHE_DIR": str(root)}).stdout)
    assert o["dir"] == str(d)
    assert o["check"] == [True, ""] and o["loaded"] and o["imported"]
    import re
    assert re.fullmatch(r"shim-\d+\.\d+\.\d+.*-cu\d+\.\d+-abi[01]-cpython-\d+", d.name), d.name
    info = json.loads((d / "gpumem_torch_shim.json").read_text())
    assert {"torch_version", "torch_git", "cuda", "cxx11_abi", "python", "core_api",
            "sources_sha256"} <= set(info)


@pytest.mark.parametrize("field,value,label", [
    ("torch_version", "2.0.0+cu118", "torch version"),
    ("sources_sha256", "0" * 64, "shim sources"),
    ("cxx11_abi", False, "C++ ABI flag"),
])
def test_shim_built_for_something_else_is_refused_then_rebuilt(shim_copy, field, value, label):
    root, d = shim_copy
    meta = d / "gpumem_torch_shim.json"
    original = json.loads(meta.read_text())
    info = dict(original, **{field: value})
    meta.write_text(json.dumps(info))
    # building not allowed: refused with the reason, and nothing is imported
    o = last_json(run_py(CHECK, env={"GPUMEM_CACHE_DIR": str(root)}).stdout)
    assert o["check"][0] is False and label in o["check"][1], o
    assert "error" in o and label in o["error"] and "GPUMEM_SHIM_BUILD=0" in o["error"], o
    assert not o["imported"]
    if field != "sources_sha256":
        return   # one rebuild (below) shows the whole record rewritten: ~20 s of CI each
    # building allowed (install()'s default): rebuilt, recorded, then loaded
    proc = run_py(CHECK, env={"GPUMEM_CACHE_DIR": str(root), "GPUMEM_SHIM_BUILD": "1"},
                  timeout=900)
    o = last_json(proc.stdout)
    assert o.get("loaded") and o["imported"], o
    # one progress line, naming the cache
    said = [line for line in proc.stderr.splitlines() if line.startswith("gpumem: building")]
    assert len(said) == 1 and f"into {d} (GPUMEM_CACHE_DIR moves the cache)" in said[0], proc.stderr
    rebuilt = json.loads(meta.read_text())
    assert rebuilt[field] != value
    # the other fields the refusals above test are recorded as they were
    assert all(rebuilt[k] == original[k] for k in ("torch_version", "cxx11_abi")), rebuilt


def test_unreadable_build_record_is_not_trusted(shim_copy):
    root, d = shim_copy
    (d / "gpumem_torch_shim.json").write_text("{not json")
    o = last_json(run_py(CHECK, env={"GPUMEM_CACHE_DIR": str(root)}).stdout)
    assert o["check"][0] is False and "unreadable" in o["check"][1]
    assert not o["imported"]


def test_install_without_a_shim_and_without_building_says_how(tmp_path):
    built_shim()  # skips where no shim can be built at all
    proc = run_py('''
        import gpumem
        try:
            gpumem.install()
        except gpumem.InstallError as e:
            print("ERR", e)
    ''', env={"GPUMEM_CACHE_DIR": str(tmp_path / "empty")})
    assert "ERR gpumem.install(): no shim has been built" in proc.stdout, proc.stdout
    assert "gpumem.pytorch.shim_build.build()" in proc.stdout


# The record_function module (memory history's annotations and torch.compile
# regions) is a second module with a cache folder of its own, built when
# recording first needs it: the shim's own build leaves ATen/record_function.h out.

def _rf_dir(d):
    return d.parent / d.name.replace("shim-", "record_function-", 1)


def _headers(d):
    """gpumem's headers ninja recorded for the unit compiled in d (`ninja -t
    deps`; torch's, included as system headers, are not recorded)."""
    proc = subprocess.run([shutil.which("ninja") or "ninja", "-C", str(d), "-t", "deps"],
                          capture_output=True, text=True, check=True)
    return [line.strip() for line in proc.stdout.splitlines() if line.startswith(" ")]


def _record_function_calls(lib):
    """The record_function entry points of torch that library `lib` calls."""
    nm = shutil.which("nm")
    if not nm:
        pytest.skip("no nm (binutils) to list the modules' symbols")
    proc = subprocess.run([nm, "-D", "-C", "--undefined-only", str(lib)], capture_output=True,
                          text=True, check=True)
    return sorted(line.split(" U ")[-1].strip() for line in proc.stdout.splitlines()
                  if "Callback" in line or "RecordFunction" in line)


def test_the_shims_build_leaves_record_function_out(shim_copy):
    root, d = shim_copy
    rf_dir = _rf_dir(d)
    shim, rf = _headers(d), _headers(rf_dir)
    assert any(h.endswith("csrc/torch/gm_torch.h") for h in shim), shim
    assert not [h for h in shim if "gm_torch_record_function" in h], shim
    assert any(h.endswith("csrc/torch/gm_torch_record_function.h") for h in rf), rf
    assert not [h for h in rf if h.endswith("csrc/torch/gm_torch.h")], rf
    # the shim registers no record_function callback; the second module does
    assert _record_function_calls(d / "gpumem_torch_shim.so") == []
    rf_calls = _record_function_calls(rf_dir / "gpumem_torch_record_function.so")
    assert "at::addGlobalCallback(at::RecordFunctionCallback)" in rf_calls, rf_calls
    assert "at::addThreadLocalCallback(at::RecordFunctionCallback)" in rf_calls, rf_calls
    assert (rf_dir / "gpumem_torch_record_function.json").is_file()


RECORD = '''
    import contextlib, io, sys
    from gpumem.pytorch import shim_build as b
    from gpumem.recording.history import recording_config
    out = {"after_install": b.RECORD_FUNCTION.name in sys.modules}
    x = torch.ones(1 << 20, device="cuda")
    out["after_alloc"] = b.RECORD_FUNCTION.name in sys.modules
    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said):
            torch.cuda.memory._record_memory_history(max_entries=1000)
    except b.ShimBuildError as e:
        out["error"] = str(e)
    else:
        with torch.profiler.record_function("gm_region"):
            y = torch.ones(1 << 20, device="cuda")
        snap = torch.cuda.memory._snapshot()
        out["annotations"] = [[a["name"], a["stage"]] for a in snap["external_annotations"]]
    out["said"] = said.getvalue()
    out["loaded"] = b.RECORD_FUNCTION.name in sys.modules
    out["recording"] = recording_config()["enabled"]
    emit(out)
'''


def test_recording_builds_the_record_function_module_at_first_need(shim_copy):
    root, d = shim_copy
    shutil.rmtree(_rf_dir(d))
    # not allowed to build: recording refuses, saying why, and is left off
    o = run_gm(RECORD, env={"GPUMEM_CACHE_DIR": str(root)})
    assert not o["after_install"] and not o["after_alloc"] and not o["loaded"], o
    assert "no module gpumem_torch_record_function has been built" in o["error"], o
    assert "GPUMEM_SHIM_BUILD=0" in o["error"] and "gpumem build-shim" in o["error"], o
    assert o["recording"] is None and "annotations" not in o, o
    # allowed: built (one progress line naming its folder), loaded, and the
    # record_function range is in the snapshot
    o = run_gm(RECORD, env={"GPUMEM_CACHE_DIR": str(root), "GPUMEM_SHIM_BUILD": "1"},
               timeout=900)
    assert not o["after_install"] and not o["after_alloc"] and o["loaded"], o
    said = [line for line in o["said"].splitlines() if line.startswith("gpumem: building")]
    assert len(said) == 1 and "record_function module" in said[0], o["said"]
    assert f"into {_rf_dir(d)} " in said[0], said
    assert o["annotations"] == [["gm_region", "START"], ["gm_region", "END"]], o
    assert o["recording"] == "all", o


RF_CHECK = '''
    import json, sys
    from gpumem.pytorch import shim_build as b
    m = b.RECORD_FUNCTION
    out = {"dir": str(b.cache_dir(module=m)), "check": b.check(module=m)}
    try:
        out["loaded"] = b.load(module=m).build_info()["torch_version"]
    except b.ShimBuildError as e:
        out["error"] = str(e)
    out["imported"] = m.name in sys.modules
    out["shim_imported"] = b.MODULE_NAME in sys.modules
    print(json.dumps(out))
'''


def test_record_function_module_built_for_another_torch_is_refused_then_rebuilt(shim_copy):
    root, d = shim_copy
    meta = _rf_dir(d) / "gpumem_torch_record_function.json"
    info = json.loads(meta.read_text())
    info["torch_version"] = "2.0.0+cu118"
    meta.write_text(json.dumps(info))
    o = last_json(run_py(RF_CHECK, env={"GPUMEM_CACHE_DIR": str(root)}).stdout)
    assert o["dir"] == str(_rf_dir(d)), o
    assert o["check"][0] is False and "torch version" in o["check"][1], o
    assert "GPUMEM_SHIM_BUILD=0" in o["error"] and not o["imported"], o
    proc = run_py(RF_CHECK, env={"GPUMEM_CACHE_DIR": str(root), "GPUMEM_SHIM_BUILD": "1"},
                  timeout=900)
    o = last_json(proc.stdout)
    assert o.get("loaded") and o["imported"] and not o["shim_imported"], o
    assert json.loads(meta.read_text())["torch_version"] != "2.0.0+cu118"
