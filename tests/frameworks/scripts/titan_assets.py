"""What torchtitan's llama3_debugmodel config reads from its source tree, made up here.

    python titan_assets.py DIR

The config names ./tests/assets/tokenizer (hf_assets_path) and the dataset
c4_test at tests/assets/c4_test, relative to the working directory; both
are files of torchtitan's repository, not of its wheel.  This writes, under
DIR, synthetic text in the dataset's layout (JSON lines with a "text" field)
and a byte-level BPE tokenizer (Hugging Face tokenizers, 512 tokens, with
the begin/end-of-text tokens the config file names) trained on that text.
The debug model's vocabulary (2048) is larger, so every id is in range.
"""

import json
import os
import random
import sys

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

root = sys.argv[1]
rng = random.Random(0)
words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 8)))
         for _ in range(300)]
texts = [" ".join(rng.choice(words) for _ in range(400)) for _ in range(200)]
data = os.path.join(root, "tests", "assets", "c4_test")
os.makedirs(data, exist_ok=True)
with open(os.path.join(data, "data.json"), "w") as f:
    for text in texts:
        f.write(json.dumps({"text": text}) + "\n")

special = ["<|begin_of_text|>", "<|end_of_text|>"]
tok = Tokenizer(models.BPE())
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
tok.train_from_iterator(texts, trainers.BpeTrainer(
    vocab_size=512, special_tokens=special, show_progress=False,
    initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
assets = os.path.join(root, "tests", "assets", "tokenizer")
os.makedirs(assets, exist_ok=True)
tok.save(os.path.join(assets, "tokenizer.json"))
with open(os.path.join(assets, "tokenizer_config.json"), "w") as f:
    json.dump({"bos_token": special[0], "eos_token": special[1]}, f)
