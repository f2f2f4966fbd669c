"""gpumem's own side of the settings: GPUMEM_ALLOC_CONF overrides the torch
variables, and a key gpumem does not honour gets a one-line warning (at
install for the environment, through torch's warning at run time).  Under
torch the same strings must simply be accepted (torch has no
GPUMEM_ALLOC_CONF, and these keys are its own)."""

import os
import warnings

import harness
from harness import (MiB, empty, gpumem_only, set_settings, settings_in_force, settle, stat,
                     torch_mod)

INSTALL_MAY_FAIL = True
IGNORED = "release_lock_on_cudamalloc:True,graph_capture_record_stream_reuse:True"
# graph_capture_record_stream_reuse is a key from torch 2.9 on: before, torch
# refuses it as an unknown key (and gpumem with it, in torch's words).
STREAM_REUSE = ("2.9", "graph_capture_record_stream_reuse in the settings string")

VARIANTS = {
    "override": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True,max_split_size_mb:100",
                 "GPUMEM_ALLOC_CONF": "max_split_size_mb:64"},
    "ignored-keys": {"PYTORCH_CUDA_ALLOC_CONF": IGNORED + ",max_split_size_mb:64"},
    "bad-override": {"GPUMEM_ALLOC_CONF": "foo:1"},
}
VARIANT_SINCE = {"ignored-keys": STREAM_REUSE}


def _ignored() -> tuple[str, str]:
    """The ignored keys this release takes, set and then cleared."""
    if harness.at_least(STREAM_REUSE[0]):
        return IGNORED, "release_lock_on_cudamalloc:False,graph_capture_record_stream_reuse:False"
    return "release_lock_on_cudamalloc:True", "release_lock_on_cudamalloc:False"


def _variant_expects_error() -> bool:
    return os.environ.get("GPUMEM_ALLOC_CONF") == "foo:1"


def _installed():
    if harness.INSTALL_ERROR is not None and not _variant_expects_error():
        raise AssertionError("gpumem.install() failed") from harness.INSTALL_ERROR
    if _variant_expects_error():
        raise harness.Skip("this variant is about the refusal")


@gpumem_only
def check_gpumem_alloc_conf_overrides_torchs_variable():
    _installed()
    torch = torch_mod()
    if "GPUMEM_ALLOC_CONF" not in os.environ:
        raise harness.Skip("no GPUMEM_ALLOC_CONF in this variant")
    settle()
    x = empty(30 * MiB)
    snap = torch.cuda.memory._snapshot()
    assert stat("max_split_size") == 64 * MiB
    assert snap["allocator_settings"]["expandable_segments"] is False
    assert [s["is_expandable"] for s in snap["segments"]] == [False]
    assert snap["allocator_settings"]["PYTORCH_CUDA_ALLOC_CONF"] == "max_split_size_mb:64"
    del x


@gpumem_only
def check_bad_gpumem_alloc_conf_is_refused():
    err = harness.INSTALL_ERROR
    if not _variant_expects_error():
        raise harness.Skip("GPUMEM_ALLOC_CONF is valid in this variant")
    assert isinstance(err, ValueError), repr(err)
    assert "GPUMEM_ALLOC_CONF='foo:1' is invalid" in str(err) and "'foo'" in str(err), str(err)


@gpumem_only
def check_ignored_keys_are_named_at_install():
    _installed()
    warned = [w for w in harness.INSTALL_WARNINGS if w.startswith("gpumem ignores")]
    if "release_lock" not in os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""):
        assert warned == [], warned
        return
    assert len(warned) == 2, warned
    assert all("\n" not in w and "PYTORCH_CUDA_ALLOC_CONF" in w for w in warned)
    assert "release_lock_on_cudamalloc:True" in warned[0]
    assert "graph_capture_record_stream_reuse:True" in warned[1]


@gpumem_only
def check_ignored_keys_are_named_at_run_time():
    _installed()
    before = settings_in_force()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        set_settings("release_lock_on_cudamalloc:True")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        set_settings(before)
    lines = [str(w.message) for w in caught if "gpumem ignores" in str(w.message)]
    assert len(lines) == 1 and "release_lock_on_cudamalloc:True" in lines[0], lines


def check_the_settings_are_accepted():
    # torch accepts these keys; the honoured ones still take effect
    _installed()
    torch = torch_mod()
    x = torch.ones(1, device="cuda")
    if os.environ.get("GPUMEM_ALLOC_CONF") is None:
        assert stat("max_split_size") == 64 * MiB
    on, off = _ignored()
    set_settings(on)
    set_settings(off)
    del x
