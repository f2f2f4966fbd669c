"""Bad settings in the environment: torch refuses them with a ValueError at
the first CUDA allocation; under gpumem the refusal comes at install() (it
reads the settings then), with torch's own text.  One process per variant;
CF_MATCH is the text the error must contain."""

import os

import harness
from harness import torch_mod

INSTALL_MAY_FAIL = True


def _variant(conf: str, match: str, before_2_9: str | None = None) -> dict:
    return {"PYTORCH_CUDA_ALLOC_CONF": conf, "CF_MATCH": match,
            "CF_MATCH_BEFORE_2_9": before_2_9 or match}


VARIANTS = {
    "fraction-negative": _variant("per_process_memory_fraction:-0.1",
                                  "per_process_memory_fraction is invalid"),
    "fraction-above-one": _variant("per_process_memory_fraction:1.1",
                                   "per_process_memory_fraction is invalid"),
    "unknown-key": _variant("foo:1", "Unrecognized key 'foo'",
                            "Unrecognized CachingAllocator option: foo"),
    "max-split-19": _variant("max_split_size_mb:19", "max_split_size_mb too small, must be >= 20",
                             "max_split_size_mb too small, must be > 20"),
    "gc-above-one": _variant("garbage_collection_threshold:1.2",
                             "garbage_collect_threshold is invalid",
                             "garbage_collect_threshold too big, set it 0.0~1.0"),
    "not-a-bool": _variant("expandable_segments:yes", "Expected 'True' or 'False'",
                           "Expected a single True/False argument for expandable_segments"),
}
_FRACTION = ("2.10", "per_process_memory_fraction in PYTORCH_CUDA_ALLOC_CONF")
VARIANT_SINCE = {"fraction-negative": _FRACTION, "fraction-above-one": _FRACTION}


def _expected() -> tuple[type, str]:
    """The error torch raises for the variant's setting, and text it contains
    (2.6.0's parser has words of its own, read in its libc10_cuda.so)."""
    exc = harness.settings_error()
    return exc, os.environ["CF_MATCH" if exc is ValueError else "CF_MATCH_BEFORE_2_9"]


def check_refused_with_value_error():
    torch = torch_mod()
    err = harness.INSTALL_ERROR
    if err is None:
        try:
            torch.ones(1, device="cuda")
        except Exception as e:
            err = e
    assert err is not None, "the bad setting was accepted"
    exc, match = _expected()
    assert isinstance(err, exc), f"{type(err).__name__}: {err}"
    assert match in str(err), str(err)
