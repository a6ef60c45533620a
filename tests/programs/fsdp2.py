"""A 2-rank FSDP program (FSDP2's `fully_shard`, CPU, gloo) for ups-doctor's tests: a tiny MLP
whose every linear layer is sharded, so each forward all-gathers its parameters and each backward
reduces its gradients. It knows nothing of ups-doctor. `--skip-rank R --skip-step S`: rank R skips
step S's forward and backward (so it never issues that step's all-gathers) and waits in
`dist.barrier()`, as a rank whose data ran out a step early would. Prints `training finished` on
rank 0 at the end."""

import argparse

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=6)
parser.add_argument("--skip-rank", type=int, default=-1)
parser.add_argument("--skip-step", type=int, default=-1)
args = parser.parse_args()

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
for layer in model:
    if isinstance(layer, torch.nn.Linear):
        fully_shard(layer)
fully_shard(model)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
generator = torch.Generator().manual_seed(rank)
for step in range(args.steps):
    if rank == args.skip_rank and step == args.skip_step:
        dist.barrier()
        continue
    loss = model(torch.randn(4, 8, generator=generator)).sum()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
dist.destroy_process_group()
if rank == 0:
    print("training finished", flush=True)
