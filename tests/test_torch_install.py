"""gpumem.install(): idempotence, reversible patching, and the mistakes users
make (install after a CUDA tensor exists, bad GPUMEM_ALLOC_CONF, no torch),
each with a clear error."""

from __future__ import annotations

import pytest

from torch_helpers import ROOT, TORCH_REASON, last_json, run_gm, run_py

needs_torch = pytest.mark.skipif(TORCH_REASON is not None, reason=TORCH_REASON or "")


def test_install_twice_and_patches_reverse():
    o = run_gm('''
        import torch.cuda.memory as tmem
        before = tmem._get_current_allocator().allocator()
        gpumem.install()                        # harmless
        gpumem.install(device=0)                # sets device 0 up now
        routed = [torch.cuda.memory_stats is gpumem.memory_stats,
                  tmem.memory_stats is gpumem.memory_stats,
                  tmem._snapshot is gpumem._snapshot,
                  tmem._record_memory_history is gpumem._record_memory_history,
                  torch.cuda.memory_summary is gpumem.memory_summary]
        gpumem.uninstall_patches()
        restored = [f.__module__ for f in (torch.cuda.memory_stats, tmem.memory_stats,
                                           tmem._snapshot, tmem._dump_snapshot,
                                           torch.cuda.memory_summary, torch.cuda.empty_cache)]
        keep = torch.ones(1000, device="cuda")
        native = tmem._snapshot()               # torch's own, through the C++ interface
        native_snapshot = {"segments": len(native["segments"]),
                           "c_entry": torch._C._cuda_memorySnapshot.__module__}
        gpumem.install()                        # patches again
        again = torch.cuda.memory_stats is gpumem.memory_stats
        try:
            gpumem.install(device=5)
            bad_device = None
        except RuntimeError as e:
            bad_device = str(e)
        x = torch.ones(10, device="cuda")
        emit({"routed": routed, "restored": restored, "again": again,
              "installed": gpumem.is_installed(), "bad_device": bad_device,
              "native_snapshot": native_snapshot, "name": type(before).__name__,
              "allocated": torch.cuda.memory_allocated()})
    ''')
    assert all(o["routed"]), o["routed"]
    assert set(o["restored"]) == {"torch.cuda.memory"}, o["restored"]
    assert o["again"] and o["installed"]
    assert "device 5 does not exist" in o["bad_device"], o["bad_device"]
    # torch's own _snapshot, unpatched, still sees gpumem's segments (through
    # the allocator's C++ snapshot interface: no frames, no traces)
    assert o["native_snapshot"]["segments"] >= 1, o["native_snapshot"]
    assert o["native_snapshot"]["c_entry"] == "torch._C", o["native_snapshot"]
    assert o["allocated"] > 0


@pytest.mark.slow  # fast tier: one test of this kind is enough (README, Test)
def test_memory_functions_refuse_a_device_that_does_not_exist():
    """Issue 16.12: memory_stats(7) on a one-device run gave zeros; torch
    raises "Invalid device argument", and so does gpumem now."""
    o = run_gm('''
        x = torch.ones(4, device="cuda")
        out = {}
        for name in ("memory_stats", "memory_allocated", "max_memory_reserved",
                     "reset_peak_memory_stats", "reset_accumulated_memory_stats",
                     "memory_summary"):
            for dev in (7, 1, -2, "cuda:3"):
                try:
                    getattr(torch.cuda, name)(dev)
                    out[f"{name}({dev})"] = "no error"
                except RuntimeError as e:
                    out[f"{name}({dev})"] = str(e)
        emit({"errors": out, "ok": torch.cuda.memory_stats(0)["allocated_bytes.all.current"],
              "current": torch.cuda.memory_allocated()})
    ''')
    for call, err in o["errors"].items():
        assert err.startswith("Invalid device argument "), (call, err)
        assert err.split()[3].rstrip(":") in ("7", "1", "-2", "3"), (call, err)
    assert o["ok"] == o["current"] == 512


@pytest.mark.slow  # fast tier: one test of this kind is enough (README, Test)
def test_install_after_a_cuda_tensor_exists():
    o = run_gm('''
        x = torch.ones(4, device="cuda")
        try:
            gpumem.install()
            err = None
        except gpumem.InstallError as e:
            err = str(e)
        y = x + 1                                # torch's own allocator still works
        emit({"err": err, "installed": gpumem.is_installed(),
              "stats_torch": torch.cuda.memory_allocated() > 0,
              "native": torch.cuda.memory._get_current_allocator().allocator() is not None})
    ''', install=False)
    assert o["err"] and "before any CUDA allocation" in o["err"], o
    assert "already initialised" in o["err"]
    assert not o["installed"] and o["stats_torch"]


@pytest.mark.slow
@needs_torch
@pytest.mark.parametrize("conf,names", [
    ("expandable_segments:Maybe", ["expandable_segments", "Maybe"]),
    ("max_split_size_mb:10", ["max_split_size_mb", "10"]),
    ("garbage_collection_threshold:1.5", ["garbage_collection_threshold"]),
    ("roundup_power2_divisions:3", ["roundup_power2_divisions"]),
    ("max_split_size_mb:19", ["max_split_size_mb", "at least 20"]),  # gpumem checks first
    ("foo:1", ["'foo'"]),
])
def test_bad_gpumem_alloc_conf_is_refused_at_install(conf, names):
    proc = run_py('''
        import json, torch, gpumem
        try:
            gpumem.install()
            out = {"err": None}
        except ValueError as e:
            out = {"err": str(e), "type": type(e).__name__,
                   "install_error": isinstance(e, gpumem.InstallError)}
        out["cuda_initialized"] = torch.cuda.is_initialized()
        out["installed"] = gpumem.is_installed()
        print(json.dumps(out))
    ''', env={"GPUMEM_ALLOC_CONF": conf})
    o = last_json(proc.stdout)
    assert o["err"] and o["install_error"], o
    assert o["err"].startswith("GPUMEM_ALLOC_CONF="), o["err"]
    for n in names:
        assert n in o["err"], o["err"]
    assert not o["cuda_initialized"] and not o["installed"]


@pytest.mark.slow
@needs_torch
def test_numbers_too_large_to_store_are_clamped_or_refused_at_install():
    """Issue 16.9 and 34: max_split_size_mb:2**43 raised OverflowError at
    install() and 2**40 divisions were read as 0 (no rounding).  torch clamps
    max_split_size_mb itself (to 2**44 - 1 MiB), and gpumem stores every
    value of 2**43 MiB or more as 2**43 - 1 MiB, as gpumem simulate's parser
    does (no limit for any device); division counts gpumem cannot store (above 2**31) are refused
    before torch's parser sees them, and 2**31 rounds every request under
    1 TiB to 512 bytes."""
    o = run_gm('''
        x = torch.empty(84 * 2**20 + 1, dtype=torch.uint8, device="cuda")
        from gpumem.pytorch.installer import settings_in_effect
        s, source = settings_in_effect()
        try:
            torch.cuda.memory._set_allocator_settings("roundup_power2_divisions:1099511627776")
            refused = None
        except ValueError as e:
            refused = str(e)
        emit({"divs": s["roundup_power2_divisions"], "split": s["max_split_size"],
              "source": source, "refused": refused,
              "still": settings_in_effect()[0]["roundup_power2_divisions"],
              "reserved": torch.cuda.memory_reserved()})
    ''', env={"GPUMEM_ALLOC_CONF": "max_split_size_mb:8796093022208,"
                                    "roundup_power2_divisions:2147483648"})
    assert o["divs"] == [1 << 31] * 16 == o["still"], o
    assert o["split"] == ((1 << 43) - 1) * 2**20, o  # parse_conf's "no limit" value
    assert o["source"] == "GPUMEM_ALLOC_CONF"
    assert "'roundup_power2_divisions'" in o["refused"] and "2**31" in o["refused"], o
    # 84 MiB + 1 byte, rounded to 512 bytes (divisions as large as this round
    # like none), in one 86 MiB segment (requests above 10 MiB round to 2 MiB)
    assert o["reserved"] == 86 * 2**20, o


@pytest.mark.slow
@needs_torch
def test_one_settings_check_at_every_torch_entry_point():
    """Issue 34: install() (GPUMEM_ALLOC_CONF) and the setter torch code
    calls (torch.cuda.memory._set_allocator_settings, over
    torch._C._accelerator_setAllocatorSettings) give the line gpumem's
    check gives, where torch's own parser, side by side, answers IndexError,
    a bare 'stoull', an internal assert or nothing at all (applying -5 as no
    limit); a string gpumem accepts means to gpumem what it means to torch."""
    from gpumem._conf import parse_conf
    from test_conf import ISSUE_34_REFUSED
    refused = [text for text, _key, _fragment in ISSUE_34_REFUSED]
    accepted = ["max_split_size_mb:8796093022208", "garbage_collection_threshold:.5",
                "roundup_power2_divisions:[1:2,>:4]", "roundup_power2_divisions:[65536:2],",
                "max_split_size_mb:0020,expandable_segments:True",
                "per_process_memory_fraction:0.5,backend:native"]
    torch_side = last_json(run_py(f'''
        import json, torch
        out = {{}}
        for text in {refused + accepted!r}:
            try:
                torch._C._accelerator_setAllocatorSettings(text)
                out[text] = "accepted"
            except Exception as e:
                out[text] = type(e).__name__ + ": " + str(e).splitlines()[0]
        print(json.dumps(out))
    ''').stdout)
    # what torch itself does with them (why gpumem checks first)
    assert torch_side["max_split_size_mb:-5"] == "accepted"
    assert torch_side["max_split_size_mb:" + "9" * 40] == "IndexError: stoull"
    assert torch_side["garbage_collection_threshold:1e-400"] == "IndexError: stod"
    assert "INTERNAL ASSERT" in torch_side["roundup_power2_divisions:[1:2,"]
    assert all(torch_side[t] == "accepted" for t in accepted), torch_side
    o = run_gm(f'''
        import os, warnings
        warnings.simplefilter("ignore")
        out = {{"install": {{}}, "setter": {{}}, "values": {{}}}}
        for text in {refused!r}:
            os.environ["GPUMEM_ALLOC_CONF"] = text
            try:
                gpumem.install()
                out["install"][text] = None
            except Exception as e:
                out["install"][text] = [type(e).__name__, str(e)]
        del os.environ["GPUMEM_ALLOC_CONF"]
        gpumem.install()
        from gpumem.pytorch.installer import settings_in_effect
        for text in {refused + accepted!r}:
            try:
                torch.cuda.memory._set_allocator_settings(text)
                out["setter"][text] = None
                out["values"][text] = settings_in_effect()[0]
            except Exception as e:
                out["setter"][text] = [type(e).__name__, str(e)]
        emit(out)
    ''', install=False)
    for text in refused:
        try:
            parse_conf(text)
            raise AssertionError(f"{{text!r}} was accepted")
        except ValueError as e:
            line = str(e)
        kind, msg = o["install"][text]
        assert kind == "AllocConfError" and msg.endswith(line) and "\n" not in msg, (text, msg)
        kind, msg = o["setter"][text]
        assert kind == "ConfError" and msg == line, (text, kind, msg)
    for text in accepted:
        assert o["setter"][text] is None, (text, o["setter"][text])
        # the values gpumem simulate's parser gives for the keys the string names
        # (2**43 MiB: the one "no limit" value 2**43 - 1 MiB in both, where
        # torch clamps to 2**44 - 1 MiB; torch keeps expandable_segments when
        # a later string does not name it)
        want = parse_conf(text)
        for key, field in (("expandable_segments", "expandable_segments"),
                           ("max_split_size_mb", "max_split_size"),
                           ("garbage_collection_threshold", "garbage_collection_threshold"),
                           ("roundup_power2_divisions", "roundup_power2_divisions")):
            if key in text:
                assert o["values"][text][field] == want[field], (text, o["values"][text])


@pytest.mark.slow
@needs_torch
def test_settings_fall_back_to_torchs_variable():
    proc = run_py('''
        import json, gpumem.pytorch.installer as t
        print(json.dumps(t.settings_in_effect()))
    ''', env={"PYTORCH_CUDA_ALLOC_CONF":
              "backend:native,expandable_segments:True,pinned_use_cuda_host_register:True,"
              "roundup_power2_divisions:[256:1,>:4]"})
    conf, source = last_json(proc.stdout)
    assert source == "PYTORCH_CUDA_ALLOC_CONF"
    assert conf["expandable_segments"] is True and conf["roundup_power2_divisions"][-1] == 4
    proc = run_py('''
        import json, gpumem.pytorch.installer as t
        print(json.dumps(t.settings_in_effect()))
    ''', env={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
              "GPUMEM_ALLOC_CONF": "max_split_size_mb:64"})
    conf, source = last_json(proc.stdout)
    assert source == "GPUMEM_ALLOC_CONF"
    assert conf["expandable_segments"] is False and conf["max_split_size"] == 64 << 20


@pytest.mark.slow
def test_torch_missing_entirely():
    # No torch (the import is blocked): gpumem and gpumem._C still import and
    # work; install() says what is missing.
    proc = run_py('''
        import json, sys
        sys.modules["torch"] = None              # `import torch` now raises ImportError
        import gpumem
        a = gpumem.Allocator(capacity=1 << 30)
        p = a.malloc(1 << 20)
        a.free(p)
        out = {"allocator": a.stats()["allocation.all.allocated"]}
        try:
            gpumem.install()
        except gpumem.TorchMissingError as e:
            out.update(err=str(e), import_error=isinstance(e, ImportError),
                       install_error=isinstance(e, gpumem.InstallError))
        try:
            gpumem.memory_stats()
        except RuntimeError as e:
            out["stats_err"] = str(e)
        out["torch_loaded"] = sys.modules.get("torch") is not None
        print(json.dumps(out))
    ''')
    o = last_json(proc.stdout)
    assert o["allocator"] == 1
    assert "needs PyTorch" in o["err"] and o["import_error"] and o["install_error"], o
    assert "call gpumem.install()" in o["stats_err"]
    assert not o["torch_loaded"]


@pytest.mark.slow
def test_torch_shadowed_by_a_broken_package(tmp_path):
    # A PYTHONPATH entry whose `torch` fails to import (a half-installed wheel).
    shadow = tmp_path / "torch"
    shadow.mkdir()
    (shadow / "__init__.py").write_text("raise ImportError('libtorch_cpu.so: cannot open "
                                        "shared object file')\n")
    proc = run_py('''
        import gpumem
        try:
            gpumem.install()
        except gpumem.TorchMissingError as e:
            print("ERR", e)
    ''', env={"PYTHONPATH": f"{tmp_path}:{ROOT}"})
    assert "ERR gpumem.install() needs PyTorch" in proc.stdout, proc.stdout
    assert "libtorch_cpu.so" in proc.stdout


@pytest.mark.slow
def test_two_devices_and_raw_allocations():
    o = run_gm('''
        a = torch.empty(10 << 20, dtype=torch.uint8, device="cuda:0")
        b = torch.empty(30 << 20, dtype=torch.uint8, device="cuda:1")
        with torch.cuda.device(1):
            c = torch.ones(1000, device="cuda")            # current device 1
        per_dev = [gpumem.memory_allocated(0), gpumem.memory_allocated(1)]
        agree = [dict(torch.cuda.memory_stats(d)) == dict(gpumem.memory_stats(d)) for d in (0, 1)]
        gpumem.uninstall_patches()
        native = [dict(torch.cuda.memory_stats(d)) == dict(gpumem.memory_stats(d)) for d in (0, 1)]
        devs = sorted({s["device"] for s in gpumem.snapshot()["segments"]})
        del b, c                                          # freed by device 1's core
        after = gpumem.memory_allocated(1)
        raw = torch.cuda.caching_allocator_alloc(1 << 20, device=1)   # raw_alloc / raw_delete
        raw_alloc = gpumem.memory_allocated(1)
        torch.cuda.caching_allocator_delete(raw)
        emit({"per_dev": per_dev, "agree": agree, "native": native, "devs": devs,
              "after": after, "raw_alloc": raw_alloc, "raw_after": gpumem.memory_allocated(1)})
    ''', devices=2)
    assert o["per_dev"][0] == 10 << 20 and o["per_dev"][1] == (30 << 20) + 4096
    assert all(o["agree"]) and all(o["native"])
    assert o["devs"] == [0, 1]
    assert o["after"] == 0 and o["raw_alloc"] == 1 << 20 and o["raw_after"] == 0


def test_the_preview_leaves_torchs_keys_to_torch():
    """gpumem simulate and gpumem doctor check the settings without torch;
    they must not refuse a key torch takes (install() warns that gpumem
    ignores it) and must refuse one torch refuses."""
    from gpumem.pytorch.installer import AllocConfError, check_environment
    check_environment({"GPUMEM_ALLOC_CONF": "release_lock_on_cudamalloc:True,"
                                            "per_process_memory_fraction:0.5,"
                                            "expandable_segments:True"})
    for env in ({"GPUMEM_ALLOC_CONF": "bogus:1"},
                {"GPUMEM_ALLOC_CONF": "release_lock_on_cudamalloc:True,bogus:1"},
                {"PYTORCH_CUDA_ALLOC_CONF": "backend:native,max_split_size_mb:10"}):
        with pytest.raises(AllocConfError):
            check_environment(env)


@pytest.mark.slow  # fast tier: one test of this kind is enough (README, Test)
@needs_torch
def test_torch_knows_every_key_the_preview_leaves_to_it():
    """TORCH_ONLY_KEYS is torch's own list: its parser takes each of them."""
    from gpumem.pytorch.installer import TORCH_ONLY_KEYS
    proc = run_py(f'''
        import json, torch
        unknown = []
        for key in {sorted(TORCH_ONLY_KEYS)!r}:
            try:
                torch._C._accelerator_setAllocatorSettings(key + ":0")
            except Exception as e:
                if "Unrecognized key" in str(e):
                    unknown.append(key)
        try:
            torch._C._accelerator_setAllocatorSettings("bogus:1")
        except Exception as e:
            bogus = str(e)
        print(json.dumps({{"unknown": unknown, "bogus": bogus}}))
    ''')
    o = last_json(proc.stdout)
    assert o["unknown"] == [] and "Unrecognized key 'bogus'" in o["bogus"], o


@pytest.mark.slow
@needs_torch
def test_backward_wrapper_is_invisible_to_dynamo():
    """torch.compile over a step that calls backward: the wrapper install()
    puts on torch.autograd.backward gives Dynamo's graphs and breaks exactly
    as torch's own function does, and no warning about gpumem._C (which
    Dynamo cannot trace).  CPU tensors: no GPU needed."""
    out = run_py('''
        import json, warnings, torch
        from gpumem.pytorch import installer as _torch
        original = torch.autograd.backward
        def explain():
            def step(x):
                torch.autograd.backward((x.sin() * 2).sum())
                return x.grad
            with warnings.catch_warnings(record=True) as w:
                warnings.simplefilter("always")
                e = torch._dynamo.explain(step)(torch.randn(4, requires_grad=True))
            return [e.graph_count, e.graph_break_count, len(e.break_reasons),
                    [str(m.message)[:200] for m in w if "gpumem" in str(m.message)]]
        torch_own = explain()
        torch.autograd.backward = _torch._with_backward_context(original)
        torch._dynamo.reset()
        print(json.dumps({"torch": torch_own, "gpumem": explain()}))
    ''')
    r = last_json(out.stdout)
    assert r["gpumem"][3] == [], r
    assert r["gpumem"][:3] == r["torch"][:3], r
