"""csrc/layers.py (the native layers and their sources), loaded by path for
the tests: it is not part of the gpumem package. No tests here."""

import importlib.util
import os

_PATH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "csrc",
                     "layers.py")
_spec = importlib.util.spec_from_file_location("gpumem_csrc_layers", _PATH)
layers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(layers)
