"""A DDP program (gloo, CPU) whose dataset is slow to decode: each sample costs `--decode-ms` of
CPU in `__getitem__`, as JPEG decoding or augmentation does. For `ups-doctor sweep` over ranks
and `--num-workers`: it knows nothing of ups-doctor (its steps and data waits are the
observer's). Runs as one plain process too (no torchrun: world of 1)."""

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

parser = argparse.ArgumentParser()
parser.add_argument("--num-workers", type=int, default=0)
parser.add_argument("--decode-ms", type=float, default=4.0)
parser.add_argument("--batch-size", type=int, default=8)
parser.add_argument("--steps", type=int, default=30)
args = parser.parse_args()


class SlowDecode(Dataset):
    def __len__(self):
        return 100_000

    def __getitem__(self, i):
        end = time.perf_counter() + args.decode_ms / 1000.0
        x = 0
        while time.perf_counter() < end:  # CPU work, as a decoder's
            x += 1
        g = torch.Generator().manual_seed(i)
        return torch.randn(32, generator=g), torch.randn(1, generator=g)


distributed = "RANK" in os.environ
if distributed:
    dist.init_process_group("gloo")
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
if distributed:
    model = torch.nn.parallel.DistributedDataParallel(model)
data = SlowDecode()
sampler = DistributedSampler(data, shuffle=False) if distributed else None
loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler, num_workers=args.num_workers)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step, (x, y) in enumerate(loader):
    loss = torch.nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    if step + 1 >= args.steps:
        break
if distributed:
    dist.destroy_process_group()
print("training finished", flush=True)
