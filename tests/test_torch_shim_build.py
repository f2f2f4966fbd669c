"""The torch shim's cache: keyed by torch/CUDA/ABI/Python, validated against a
build record before it is imported, rebuilt or refused when it was built for
anything else, and never needed by gpumem._C itself."""

from __future__ import annotations

import json
import importlib.metadata
import shutil

import pytest

from torch_helpers import built_shim, last_json, run_py

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
    info = json.loads(meta.read_text())
    info[field] = value
    meta.write_text(json.dumps(info))
    # building not allowed: refused with the reason, and nothing is imported
    o = last_json(run_py(CHECK, env={"GPUMEM_CACHE_DIR": str(root)}).stdout)
    assert o["check"][0] is False and label in o["check"][1], o
    assert "error" in o and label in o["error"] and "GPUMEM_SHIM_BUILD=0" in o["error"], o
    assert not o["imported"]
    # building allowed (install()'s default): rebuilt, recorded, then loaded
    proc = run_py(CHECK, env={"GPUMEM_CACHE_DIR": str(root), "GPUMEM_SHIM_BUILD": "1"},
                  timeout=900)
    o = last_json(proc.stdout)
    assert o.get("loaded") and o["imported"], o
    # one progress line, naming the cache
    said = [line for line in proc.stderr.splitlines() if line.startswith("gpumem: building")]
    assert len(said) == 1 and f"into {d} (GPUMEM_CACHE_DIR moves the cache)" in said[0], proc.stderr
    assert json.loads(meta.read_text())[field] != value


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
