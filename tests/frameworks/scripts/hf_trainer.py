"""Hugging Face Trainer on a small Llama-style model, random weights, synthetic tokens.

    python hf_trainer.py [--gradient-checkpointing] [--lora] [--compile] [--steps N]

What a user writes: LlamaForCausalLM from a LlamaConfig, TrainingArguments
with bf16, Trainer(...).train(); --lora wraps the model with PEFT's LoRA
first, --compile sets TrainingArguments(torch_compile=True).  Nothing is
downloaded; outputs go to ./hf_out (the test's temporary folder).
"""

import argparse

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

ap = argparse.ArgumentParser()
ap.add_argument("--gradient-checkpointing", action="store_true")
ap.add_argument("--lora", action="store_true")
ap.add_argument("--compile", action="store_true")
ap.add_argument("--steps", type=int, default=3)
args = ap.parse_args()

VOCAB, SEQ = 2048, 128
config = LlamaConfig(vocab_size=VOCAB, hidden_size=256, intermediate_size=688,
                     num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=4,
                     max_position_embeddings=SEQ)
torch.manual_seed(0)
model = LlamaForCausalLM(config)
if args.lora:
    from peft import LoraConfig, get_peft_model
    model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, task_type="CAUSAL_LM",
                                             target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]))


class Tokens(torch.utils.data.Dataset):
    def __init__(self, n):
        self.ids = torch.randint(0, VOCAB, (n, SEQ))

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


training = TrainingArguments(
    output_dir="hf_out", max_steps=args.steps, per_device_train_batch_size=8, bf16=True,
    gradient_checkpointing=args.gradient_checkpointing, torch_compile=args.compile,
    learning_rate=1e-4, logging_steps=1, save_strategy="no", report_to="none",
    dataloader_num_workers=0, disable_tqdm=True)
Trainer(model=model, args=training, train_dataset=Tokens(8 * args.steps)).train()
