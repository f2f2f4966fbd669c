"""Lightning: Trainer.fit with precision="bf16-mixed" (scripts/lightning_fit.py),
under torch's allocator and under gpumem."""

import pytest

pytestmark = pytest.mark.slow


def test_lightning_fit_bf16_mixed(stack):
    stack("lightning_bf16")
