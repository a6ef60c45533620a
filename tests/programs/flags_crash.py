"""A PyTorch program with the usual training flags whose crash (SIGSEGV, as a bad native
extension gives) needs a particular combination of them, for `ups-doctor bisect -- CMD`:

- `--bug threshold`: `--num-workers` of 3 or more together with `--pin-memory`;
- `--bug product`: `--batch-size` × `--samples` above 1000;
- `--bug env`: `TRAIN_KERNEL=fused` in the environment together with two or more `--depths`;
- `--bug node`: `--num-workers` of 2 or more on a rank of torchrun's second node or later
  (`GROUP_RANK`, the node's rank, of 1 or more): the same ranks on one node pass;
- `--bug flaky`: `--num-workers` of 2 or more, and then only in about half of the runs (each
  run's coin is the next of a fixed sequence when `FLAKY_COINS` names a counter file, so a test
  sees the same flips every time; else a random one).

Every other flag only changes the (tiny) work done (`--gpus 0 1`, a list in separate words, none:
this program runs on the CPU)."""

import argparse
import ctypes
import fcntl
import os
import random

import torch

p = argparse.ArgumentParser()
p.add_argument("--bug", choices=["threshold", "product", "env", "node", "flaky"], required=True)
p.add_argument("--num-workers", type=int, default=0)
p.add_argument("--batch-size", type=int, default=8)
p.add_argument("--samples", type=int, default=16)
p.add_argument("--depth", type=int, default=1)
p.add_argument("--epochs", type=int, default=1)
p.add_argument("--lr", type=float, default=0.1)
p.add_argument("--pin-memory", action="store_true")
p.add_argument("--amp", default="no")
p.add_argument("--depths", default="1")
p.add_argument("--gpus", type=int, nargs="+", default=[0])  # a list written as separate words
a = p.parse_args()

model = torch.nn.Sequential(*[torch.nn.Linear(4, 4) for _ in range(a.depth)])
for _ in range(a.epochs):
    with torch.no_grad():
        model(torch.randn(a.batch_size, 4))
depths = [int(d) for d in a.depths.split(",") if d]


def coin():
    """Heads in about half of the runs: the next of a fixed sequence, or a random one."""
    path = os.environ.get("FLAKY_COINS")
    if not path:
        return random.random() < 0.5
    with open(path, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.seek(0)
        n = int(f.read() or 0)
        f.seek(0)
        f.truncate()
        f.write(str(n + 1))
    return random.Random(n).random() < 0.5


if a.bug == "threshold":
    crash = a.num_workers >= 3 and a.pin_memory
elif a.bug == "product":
    crash = a.batch_size * a.samples > 1000
elif a.bug == "env":
    crash = os.environ.get("TRAIN_KERNEL") == "fused" and len(depths) >= 2
elif a.bug == "node":
    crash = a.num_workers >= 2 and int(os.environ.get("GROUP_RANK", "0")) >= 1
else:
    crash = a.num_workers >= 2 and coin()
if crash:
    ctypes.string_at(0)
print("training finished", flush=True)
