"""The native layers of gpumem and the rule that connects them.

One source of truth for the build (setup.py), the C tests (tests/test_native.py
and friends) and the layer check (tests/test_layers.py). Loaded by path, so it
imports nothing of gpumem's and needs nothing but the standard library.

A layer may include its own headers and those of the layers listed for it
(directly or not); nothing else of gpumem's. Arrows point down only:

    torch -> python -> history -> core -> device -> base

csrc/ holds exactly these layers (and this file and README.md; a test checks
it). The simulated GPU's fake NVIDIA libraries are a second product in the
top-level folder simgpu/: they include none of these layers and are never
linked into gpumem._C.
"""

import glob
import os

HERE = os.path.dirname(os.path.abspath(__file__))

#: layer -> the layers it may include, lowest last. The order of this dict is
#: bottom-up, so a build lists base's sources first.
LAYERS = {
    "base": (),
    "device": ("base",),
    "core": ("device", "base"),
    "history": ("core", "device", "base"),
    "python": ("history", "core", "device", "base"),
    "torch": ("python", "history", "core", "device", "base"),
}

#: The layers compiled into the extension gpumem._C (torch is built per
#: torch version by gpumem/pytorch/shim_build.py).
EXTENSION_LAYERS = ("base", "device", "core", "history", "python")


def sources(*layers, root=HERE, ext=".c"):
    """The source files of the given layers, bottom-up and sorted, as absolute paths."""
    unknown = [layer for layer in layers if layer not in LAYERS]
    if unknown:
        raise ValueError(f"unknown layer(s) {unknown}; known: {list(LAYERS)}")
    out = []
    for layer in LAYERS:
        if layer in layers:
            out += sorted(glob.glob(os.path.join(root, layer, "*" + ext)))
    return out
