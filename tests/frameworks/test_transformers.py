"""Hugging Face transformers: Trainer on a small Llama-style model (bf16), with
gradient checkpointing, with PEFT's LoRA, and under torch.compile
(TrainingArguments(torch_compile=True)); scripts/hf_trainer.py, under torch's
allocator and under gpumem."""

import pytest

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("name", ["hf_trainer", "hf_trainer_checkpointing", "hf_trainer_lora",
                                  "hf_trainer_compile"])
def test_hf_trainer(stack, name):
    stack(name)


def test_hf_trainer_options_take_effect(stack):
    """Gradient checkpointing and LoRA each lower the plain run's peak, under
    both allocators: the options reached the model."""
    _, plain = stack("hf_trainer")
    for name in ("hf_trainer_checkpointing", "hf_trainer_lora"):
        _, other = stack(name)
        for alloc in ("torch", "gpumem"):
            (key,) = plain[alloc]
            assert other[alloc][key]["allocated"] < plain[alloc][key]["allocated"], (
                name, alloc, plain, other)
