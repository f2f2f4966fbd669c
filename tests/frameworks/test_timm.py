"""timm: a ViT from timm.create_model, timm's AdamW, bf16 autocast training steps
(scripts/timm_step.py), under torch's allocator and under gpumem."""

import pytest

pytestmark = pytest.mark.slow


def test_timm_vit_training_steps(stack):
    stack("timm_vit")
