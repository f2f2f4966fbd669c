"""diffusers: a UNet2DModel from a config (random weights) trained for a few DDPM steps
on synthetic images: noise from DDPMScheduler.add_noise, MSE on the predicted noise.

    python diffusers_step.py [--steps N]
"""

import argparse

import torch
from diffusers import DDPMScheduler, UNet2DModel

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=3)
args = ap.parse_args()

torch.manual_seed(0)
model = UNet2DModel(sample_size=64, in_channels=3, out_channels=3, layers_per_block=1,
                    block_out_channels=(32, 64, 64),
                    down_block_types=("DownBlock2D", "AttnDownBlock2D", "DownBlock2D"),
                    up_block_types=("UpBlock2D", "AttnUpBlock2D", "UpBlock2D")).cuda()
scheduler = DDPMScheduler(num_train_timesteps=1000)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
for _ in range(args.steps):
    clean = torch.randn(8, 3, 64, 64, device="cuda")
    noise = torch.randn_like(clean)
    t = torch.randint(0, scheduler.config.num_train_timesteps, (8,), device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        pred = model(scheduler.add_noise(clean, noise, t), t).sample
    torch.nn.functional.mse_loss(pred.float(), noise).backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
torch.cuda.synchronize()
