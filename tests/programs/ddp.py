"""A 2-rank DDP program for ups-doctor's tests: CPU, gloo, a tiny MLP, markers through
python/ups_doctor.py. `--segv-rank R --segv-step S` makes rank R read address 0 (a real SIGSEGV)
at the beginning of step S's forward. `--skip-rank R --skip-step S` makes rank R skip step S's
backward (its gradient all-reduce) and wait in `dist.barrier()` while the other rank waits in that
all-reduce: both hang. Prints `training finished` on rank 0 at the end."""

import argparse
import ctypes
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import ups_doctor

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=10)
parser.add_argument("--segv-rank", type=int, default=-1)
parser.add_argument("--segv-step", type=int, default=-1)
parser.add_argument("--skip-rank", type=int, default=-1)
parser.add_argument("--skip-step", type=int, default=-1)
args = parser.parse_args()

rank = int(os.environ["RANK"])
with ups_doctor.phase("dist.init"):
    dist.init_process_group("gloo")
torch.manual_seed(0)
with ups_doctor.phase("model.build"):
    model = DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    )
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
generator = torch.Generator().manual_seed(rank)
for step in range(args.steps):
    ups_doctor.mark("data.next", step)
    x = torch.randn(32, 16, generator=generator)
    y = x.sum(dim=1, keepdim=True)
    ups_doctor.mark("forward", step)
    if rank == args.segv_rank and step == args.segv_step:
        ctypes.string_at(0)
    loss = torch.nn.functional.mse_loss(model(x), y)
    if rank == args.skip_rank and step == args.skip_step:
        ups_doctor.mark("barrier", step)
        dist.barrier()
        continue
    ups_doctor.mark("backward", step)
    optimizer.zero_grad()
    loss.backward()
    ups_doctor.mark("optimizer", step)
    optimizer.step()
    ups_doctor.step(step, loss=loss.item(), samples=len(x))
dist.destroy_process_group()
ups_doctor.done()
if rank == 0:
    print("training finished", flush=True)
