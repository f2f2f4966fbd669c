"""Lightning Trainer.fit with precision="bf16-mixed" on a small Transformer, synthetic data.

    python lightning_fit.py [--steps N]

A LightningModule (embedding, two TransformerEncoderLayers, a head; AdamW)
and Trainer(accelerator="gpu", devices=1, precision="bf16-mixed").fit(),
with no logger, checkpoint or progress bar: nothing is written.
"""

import argparse

import lightning as L
import torch

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=3)
args = ap.parse_args()

VOCAB, SEQ, DIM = 1024, 128, 256


class LM(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(VOCAB, DIM)
        layer = torch.nn.TransformerEncoderLayer(DIM, 8, 4 * DIM, batch_first=True)
        self.enc = torch.nn.TransformerEncoder(layer, 2)
        self.head = torch.nn.Linear(DIM, VOCAB)

    def training_step(self, batch, batch_idx):
        x, y = batch
        logits = self.head(self.enc(self.emb(x)))
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten())

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-4)


torch.manual_seed(0)
ids = torch.randint(0, VOCAB, (8 * args.steps, SEQ + 1))
data = torch.utils.data.TensorDataset(ids[:, :-1], ids[:, 1:])
trainer = L.Trainer(accelerator="gpu", devices=1, precision="bf16-mixed", max_steps=args.steps,
                    logger=False, enable_checkpointing=False, enable_progress_bar=False,
                    enable_model_summary=False)
trainer.fit(LM(), torch.utils.data.DataLoader(data, batch_size=8))
