"""timm: a model built by timm.create_model (random weights), timm's optimizer factory,
bf16 autocast training steps on synthetic images.

    python timm_step.py [--model vit_tiny_patch16_224] [--steps N]
"""

import argparse

import timm
import timm.optim
import torch

ap = argparse.ArgumentParser()
ap.add_argument("--model", default="vit_tiny_patch16_224")
ap.add_argument("--image", type=int, default=224)
ap.add_argument("--batch", type=int, default=16)
ap.add_argument("--steps", type=int, default=3)
args = ap.parse_args()

torch.manual_seed(0)
model = timm.create_model(args.model, pretrained=False, num_classes=100).cuda()
opt = timm.optim.create_optimizer_v2(model, opt="adamw", lr=1e-3, weight_decay=0.05)
loss_fn = torch.nn.CrossEntropyLoss()
for _ in range(args.steps):
    x = torch.randn(args.batch, 3, args.image, args.image, device="cuda")
    y = torch.randint(0, 100, (args.batch,), device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = loss_fn(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
torch.cuda.synchronize()
