"""A PyTorch program with the usual training flags whose crash (SIGSEGV, as a bad native
extension gives) needs a particular combination of them, for `ups-doctor bisect -- CMD`:

- `--bug threshold`: `--num-workers` of 3 or more together with `--pin-memory`;
- `--bug product`: `--batch-size` × `--samples` above 1000.

Every other flag only changes the (tiny) work done."""

import argparse
import ctypes

import torch

p = argparse.ArgumentParser()
p.add_argument("--bug", choices=["threshold", "product"], required=True)
p.add_argument("--num-workers", type=int, default=0)
p.add_argument("--batch-size", type=int, default=8)
p.add_argument("--samples", type=int, default=16)
p.add_argument("--depth", type=int, default=1)
p.add_argument("--epochs", type=int, default=1)
p.add_argument("--lr", type=float, default=0.1)
p.add_argument("--pin-memory", action="store_true")
p.add_argument("--amp", default="no")
a = p.parse_args()

model = torch.nn.Sequential(*[torch.nn.Linear(4, 4) for _ in range(a.depth)])
for _ in range(a.epochs):
    with torch.no_grad():
        model(torch.randn(a.batch_size, 4))
if a.bug == "threshold":
    crash = a.num_workers >= 3 and a.pin_memory
else:
    crash = a.batch_size * a.samples > 1000
if crash:
    ctypes.string_at(0)
print("training finished", flush=True)
