"""diffusers: DDPM training steps of a UNet2DModel built from a config
(scripts/diffusers_step.py), under torch's allocator and under gpumem."""

import pytest

pytestmark = pytest.mark.slow


def test_diffusers_unet_training_steps(stack):
    stack("diffusers_unet")
