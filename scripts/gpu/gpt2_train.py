"""A GPT-2-small training loop (transformers, bf16 autocast, AdamW) on fixed synthetic data.

Deterministic in its inputs (seeded model and tokens), so two runs can be compared by their loss.
Prints the loss every 5 steps, then `gpt2 steps S loss L seconds T steps_per_s R peak_reserved_mib M`.
    python3 gpt2_train.py [--steps 30] [--batch 4] [--seq 512]
"""
import argparse, time

import torch
from transformers import GPT2Config, GPT2LMHeadModel

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=30)
p.add_argument("--batch", type=int, default=4)
p.add_argument("--seq", type=int, default=512)
a = p.parse_args()

torch.manual_seed(0)
model = GPT2LMHeadModel(GPT2Config()).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
g = torch.Generator(device="cpu").manual_seed(1)
data = torch.randint(0, 50257, (a.steps, a.batch, a.seq), generator=g)
torch.cuda.synchronize()
t0 = time.time()
loss = None
for step in range(a.steps):
    x = data[step].cuda()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(input_ids=x, labels=x).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    if step % 5 == 4:
        print(f"step {step + 1} loss {loss.item():.4f}", flush=True)
torch.cuda.synchronize()
dt = time.time() - t0
print(f"gpt2 steps {a.steps} loss {loss.item():.4f} seconds {dt:.2f} steps_per_s {a.steps / dt:.2f} "
      f"peak_reserved_mib {torch.cuda.max_memory_reserved() >> 20}", flush=True)
