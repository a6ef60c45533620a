"""A PyTorch program whose DataLoader workers crash natively (SIGSEGV, as a bad native decoder
gives) only once a batch holds `--crash-from` samples or more, for `ups-doctor bisect -- CMD`.

The main process then fails with PyTorch's own `RuntimeError: DataLoader worker (pid(s) N) exited
unexpectedly` (or `... is killed by signal: Segmentation fault.`), exit status 1. Cut too far it
fails for unrelated reasons with the same exit status: `--batch-size 0` is refused by PyTorch
(`ValueError: batch_size should be a positive integer value, but got batch_size=0`), and with
`--num-workers 0` the batch is made in the main process, which then dies of the SIGSEGV itself.
`--samples`, `--depth` and `--epochs` only change the (tiny) work done; `--epochs 0` or fewer
samples than `--crash-from` never make a batch big enough and pass."""

import argparse
import ctypes

import torch
from torch.utils.data import DataLoader, Dataset

p = argparse.ArgumentParser()
p.add_argument("--num-workers", type=int, default=0)
p.add_argument("--batch-size", type=int, default=8)
p.add_argument("--samples", type=int, default=64)
p.add_argument("--depth", type=int, default=1)
p.add_argument("--epochs", type=int, default=1)
p.add_argument("--crash-from", type=int, default=16, help="the batch size at which a worker crashes")
a = p.parse_args()


class Samples(Dataset):
    def __len__(self):
        return a.samples

    def __getitem__(self, i):
        return torch.full((4,), float(i))


def collate(items):
    if len(items) >= a.crash_from:
        ctypes.string_at(0)  # a native crash: in a worker, or in the main process without workers
    return torch.stack(items)


model = torch.nn.Sequential(*[torch.nn.Linear(4, 4) for _ in range(a.depth)])
loader = DataLoader(Samples(), batch_size=a.batch_size, num_workers=a.num_workers, collate_fn=collate)
for _ in range(a.epochs):
    for batch in loader:
        with torch.no_grad():
            model(batch)
print("training finished", flush=True)
