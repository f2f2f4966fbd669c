"""Settings from the environment (PYTORCH_CUDA_ALLOC_CONF, PYTORCH_ALLOC_CONF),
read once per process: each variant is one process with one setting, and
states what it expects in CF_EXPECT (JSON)."""

import json
import os

from harness import GiB, MiB, empty, raises, settle, stat, torch_mod

MEMORY = "8GiB"


def _variant(conf: str, var: str = "PYTORCH_CUDA_ALLOC_CONF", **expect) -> dict:
    return {var: conf, "CF_EXPECT": json.dumps(expect)}


VARIANTS = {
    "fraction-half": _variant("per_process_memory_fraction:0.5", fraction=0.5),
    "fraction-zero": _variant("per_process_memory_fraction:0.0", fraction=0.0),
    "fraction-one": _variant("per_process_memory_fraction:1.0", fraction=1.0),
    "max-split-20": _variant("max_split_size_mb:20", max_split=20 * MiB),
    "roundup-4": _variant("roundup_power2_divisions:4", rounded=96 * MiB),
    "roundup-list": _variant("roundup_power2_divisions:[64:8,128:2,>:1]", rounded=88 * MiB),
    "expandable": _variant("expandable_segments:True,max_split_size_mb:64", expandable=True,
                           max_split=64 * MiB),
    "generic-var": _variant("expandable_segments:True", var="PYTORCH_ALLOC_CONF",
                            expandable=True),
    "spaces": _variant(" expandable_segments : True , roundup_power2_divisions : 4 ",
                       expandable=True, rounded=96 * MiB),
    "pinned-keys": _variant("pinned_use_cuda_host_register:True,pinned_num_register_threads:8"),
    "gc": _variant("garbage_collection_threshold:0.6", gc=0.6),
}
#: per_process_memory_fraction is a settings key from torch 2.10 on. 2.6.0 reads only
#: PYTORCH_CUDA_ALLOC_CONF and refuses max_split_size_mb:20 ("must be > 20"); 2.10.0
#: reads PYTORCH_ALLOC_CONF too and takes 20 ("must be >= 20"): both came with the
#: device-generic settings parser, 2.10 (2.9.1 is as 2.6.0).
_FRACTION = ("2.10", "per_process_memory_fraction in PYTORCH_CUDA_ALLOC_CONF")
VARIANT_SINCE = {"fraction-half": _FRACTION, "fraction-zero": _FRACTION,
                 "fraction-one": _FRACTION,
                 "max-split-20": ("2.10", "max_split_size_mb:20 (it needs more than 20)"),
                 "generic-var": ("2.10", "PYTORCH_ALLOC_CONF (it reads PYTORCH_CUDA_ALLOC_CONF)")}


def _expect() -> dict:
    return json.loads(os.environ.get("CF_EXPECT", "{}"))


def check_fraction_from_the_environment():
    torch = torch_mod()
    want = _expect().get("fraction", 1.0)
    assert torch.cuda.get_per_process_memory_fraction() == want
    total = torch.cuda.get_device_properties(0).total_memory
    if want < 0.6:
        e = raises(torch.OutOfMemoryError, lambda: empty(int(total * 0.6)))
        assert f"{'0 bytes' if want == 0 else f'{want * total / GiB:.2f} GiB'} allowed; " in str(e)
    else:
        x = empty(int(total * 0.6))
        del x
    torch.cuda.set_per_process_memory_fraction(1.0)
    y = empty(int(total * 0.6))
    del y
    settle()


def check_max_split_size_from_the_environment():
    torch = torch_mod()
    x = torch.ones(1, device="cuda")
    assert stat("max_split_size") == _expect().get("max_split", -1)
    del x


def check_rounding_from_the_environment():
    settle()
    before = stat("active_bytes.all.allocated")
    x = empty(84 * MiB)
    got = stat("active_bytes.all.allocated") - before
    assert got == _expect().get("rounded", 84 * MiB), got
    del x


def check_expandable_segments_from_the_environment():
    torch = torch_mod()
    settle()
    x = empty(30 * MiB)
    snap = torch.cuda.memory._snapshot()
    want = _expect().get("expandable", False)
    assert snap["allocator_settings"]["expandable_segments"] is want
    assert [s["is_expandable"] for s in snap["segments"]] == [want]
    del x


def check_settings_dict_in_the_snapshot():
    torch = torch_mod()
    x = torch.ones(1, device="cuda")
    s = torch.cuda.memory._snapshot()["allocator_settings"]
    conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF") or os.environ.get("PYTORCH_ALLOC_CONF")
    assert s["PYTORCH_CUDA_ALLOC_CONF"] == conf
    assert s["max_split_size"] == _expect().get("max_split", -1)
    assert s["garbage_collection_threshold"] == _expect().get("gc", 0.0)
    del x


def check_pinned_memory_still_works():
    torch = torch_mod()
    t = torch.ones(1 << 20).pin_memory()
    assert t.is_pinned()
    g = t.to("cuda", non_blocking=True)
    torch.cuda.synchronize()
    assert g.device.type == "cuda"
