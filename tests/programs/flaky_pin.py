"""A program for bisect over params: it fails only when DataLoader workers are used
(`--workers` > 0) AND `--pin-memory true`, like a pin-memory thread that breaks with worker
processes. On a CPU-only machine pinning has no effect, so the failure is the program's own,
deterministic RuntimeError mimicking that bug; every other combination trains and finishes.
Flags: --workers N --pin-memory true|false --depths 2,2 --steps N."""

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))

import torch
from torch.utils.data import DataLoader, TensorDataset

import ups_doctor

parser = argparse.ArgumentParser()
parser.add_argument("--workers", type=int, default=0)
parser.add_argument("--pin-memory", choices=["true", "false"], default="false")
parser.add_argument("--depths", default="1")
parser.add_argument("--steps", type=int, default=4)
args = parser.parse_args()
pin = args.pin_memory == "true"
depths = [int(d) for d in args.depths.split(",") if d]

torch.manual_seed(0)
data = TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
loader = DataLoader(data, batch_size=8, num_workers=args.workers)
layers = [torch.nn.Linear(8, 16)] + [torch.nn.Linear(16, 16) for _ in range(sum(depths))] + [torch.nn.Linear(16, 1)]
model = torch.nn.Sequential(*layers)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for step, (x, y) in zip(range(args.steps), loader):
    ups_doctor.mark("data.next", step)
    if pin and args.workers > 0:
        raise RuntimeError("Caught an error in pin memory thread for device 0: "
                           "pinned batch from a worker process has a stale storage (mimicked bug)")
    ups_doctor.mark("forward", step)
    loss = torch.nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    ups_doctor.step(step, loss=loss.item(), samples=len(x))
ups_doctor.done()
print("training finished", flush=True)
