"""A small DDP program of the kind ups-doctor's observer is for (CPU, gloo): it knows nothing of
ups-doctor. Each step reads a batch from a DataLoader, runs DDP's forward and backward, steps the
optimizer and gathers the loss from every rank with `dist.all_gather` (a metric, as many training
scripts do; `--no-gather`: DDP's own gradient reductions are its only collectives). `--timeout-s`
is the process group's timeout, as training configurations expose it. `--times FILE`: rank 0
appends `STEP SECONDS` (CLOCK_MONOTONIC, shared by every process of the machine) every 10 steps,
for a benchmark that compares two runs going at once (bench/observer_side_by_side.py).
`--step-per-group`: weights and biases are two parameter groups, and each training step steps the
optimizer once per group, the other group's parameters set aside meanwhile, as DeepSpeed's
ZeRO-1/2 optimizer steps the optimizer it wraps (`_optimizer_step` in
deepspeed/runtime/zero/stage_1_and_2.py, 0.18.2). Run it under torchrun or one copy per rank with
torchrun's variables."""

import argparse
import datetime
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--no-gather", action="store_true")
    parser.add_argument("--timeout-s", type=float)
    parser.add_argument("--times")
    parser.add_argument("--step-per-group", action="store_true")
    args = parser.parse_args()
    timeout = {"timeout": datetime.timedelta(seconds=args.timeout_s)} if args.timeout_s else {}
    dist.init_process_group("gloo", **timeout)
    rank = dist.get_rank()
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(64 * args.steps, 16), torch.randn(64 * args.steps, 1))
    loader = DataLoader(data, batch_size=32, sampler=DistributedSampler(data, shuffle=False))
    model = DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(16, args.hidden), torch.nn.ReLU(), torch.nn.Linear(args.hidden, 1))
    )
    if args.step_per_group:
        named = list(model.named_parameters())
        groups = [{"params": [p for n, p in named if not n.endswith("bias")]},
                  {"params": [p for n, p in named if n.endswith("bias")], "weight_decay": 0.0}]
        optimizer = torch.optim.SGD(groups, lr=0.01, weight_decay=0.01)
    else:
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    world = dist.get_world_size()
    times = open(args.times, "a", buffering=1) if args.times and rank == 0 else None
    for step, (x, y) in enumerate(loader):
        if step == args.steps:
            break
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        if args.step_per_group:
            step_per_group(optimizer)
        else:
            optimizer.step()
        losses = [loss.detach().reshape(1)] * world
        if not args.no_gather:
            losses = [torch.zeros(1) for _ in range(world)]
            dist.all_gather(losses, loss.detach().reshape(1))
        if times is not None and step % 10 == 0:
            times.write(f"{step} {time.monotonic()}\n")
        if rank == 0 and step % 10 == 0:
            print(f"step {step} loss {sum(l.item() for l in losses) / world:.4f}", flush=True)
    dist.barrier()
    if rank == 0:
        print("training finished", flush=True)
    dist.destroy_process_group()


# Below `main`: tests read the line of main's own optimizer step as the first such line in the file.
def step_per_group(optimizer):
    kept = [group["params"] for group in optimizer.param_groups]
    for i in range(len(kept)):
        for j, group in enumerate(optimizer.param_groups):
            group["params"] = kept[j] if j == i else []
        optimizer.step()
    for group, params in zip(optimizer.param_groups, kept):
        group["params"] = params


if __name__ == "__main__":
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    main()
