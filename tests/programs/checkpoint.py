"""A 2-rank DDP program that saves a checkpoint and loads it back (CPU, gloo), for ups-doctor's
tests: rank 0 saves the DDP-wrapped model's `state_dict()` (every name prefixed `module.`), and
then every rank loads it into the bare model, as a fine-tuning or evaluation script that builds
the model without DDP does. PyTorch refuses it on every rank: `Error(s) in loading state_dict`.
`--path FILE`: where the checkpoint goes."""

import argparse

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

parser = argparse.ArgumentParser()
parser.add_argument("--path", required=True)
args = parser.parse_args()

dist.init_process_group("gloo")
torch.manual_seed(0)


def build():
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))


model = DistributedDataParallel(build())
model(torch.randn(4, 8)).sum().backward()
if dist.get_rank() == 0:
    torch.save(model.state_dict(), args.path)
dist.barrier()
fresh = build()
fresh.load_state_dict(torch.load(args.path))
dist.destroy_process_group()
print("training finished", flush=True)
