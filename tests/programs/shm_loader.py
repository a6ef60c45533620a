"""A DataLoader program for ups-doctor's tests: each rank iterates a DataLoader with 2 workers
(fork). Rank `--big-rank` gets samples of `--sample-mib` MiB from its second batch on, so its
worker 1 (which builds batches 1, 3, …) needs `batch × sample` MiB of /dev/shm for one batch;
in a 16 MiB /dev/shm that allocation fails (PyTorch 2.11: `unable to allocate shared memory(shm)
for file </torch_…>` in the worker, re-raised by the rank; older versions: SIGBUS). Other ranks
and batch 0 stay small, so the failure is worker 1 of rank `--big-rank`, deterministically."""

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))

import torch
from torch.utils.data import DataLoader, Dataset

import ups_doctor

parser = argparse.ArgumentParser()
parser.add_argument("--big-rank", type=int, default=0)
parser.add_argument("--sample-mib", type=int, default=4)
parser.add_argument("--batch", type=int, default=4)
parser.add_argument("--workers", type=int, default=2)
args = parser.parse_args()
rank = int(os.environ.get("RANK", "0"))


class Samples(Dataset):
    def __len__(self):
        return args.batch * 6

    def __getitem__(self, index):
        big = rank == args.big_rank and index >= args.batch
        numel = (args.sample_mib << 20) // 4 if big else 16
        return torch.full((numel,), float(index))


loader = DataLoader(Samples(), batch_size=args.batch, num_workers=args.workers,
                    worker_init_fn=ups_doctor.worker_init_fn)
total = 0.0
for step, batch in enumerate(loader):
    ups_doctor.mark("data.next", step)
    total += float(batch[:, 0].sum())
    ups_doctor.step(step, samples=len(batch))
ups_doctor.done()
print(f"rank {rank}: read every batch, checksum {total}", flush=True)
