"""A 2-rank DDP program (CPU, gloo, a tiny linear model, no ups-doctor markers) started the ways
users start DDP, for the tests of ups-doctor's rank discovery (tests/launchers.rs). `--launcher`:

- `env`: the ranks read `RANK` from their environment (torchrun, `accelerate launch`);
- `spawn`: `torch.multiprocessing.spawn(work, nprocs=2)`: the rank is only `work`'s argument;
- `lightning`: `Trainer(accelerator="cpu", devices=2, strategy="ddp")`, run as `python
  launchers.py`: Lightning runs rank 0 in this process and starts rank 1 with `LOCAL_RANK`.

`--segv-rank R --segv-step S`: rank R reads address 0 (a real SIGSEGV) at step S.
`--hang-rank R --hang-step S`: rank R skips step S's gradient all-reduce and waits in
`dist.barrier()`; the other rank waits in the all-reduce: both hang.
Rank 0 prints `training finished` at the end.
"""

import argparse
import ctypes
import os

import torch
import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--launcher", required=True, choices=["env", "spawn", "lightning"])
parser.add_argument("--steps", type=int, default=6)
parser.add_argument("--segv-rank", type=int, default=-1)
parser.add_argument("--segv-step", type=int, default=-1)
parser.add_argument("--hang-rank", type=int, default=-1)
parser.add_argument("--hang-step", type=int, default=-1)
parser.add_argument("--local_rank", type=int, default=-1, help="set by the deepspeed launcher (RANK is set too)")
args = parser.parse_args()


def faults(rank, step):
    if rank == args.segv_rank and step == args.segv_step:
        print(f"rank {rank}: segfaulting at step {step}", flush=True)
        ctypes.string_at(0)
    if rank == args.hang_rank and step == args.hang_step:
        print(f"rank {rank}: skipping the all-reduce of step {step}", flush=True)
        dist.barrier()


def train(rank):
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    generator = torch.Generator().manual_seed(rank)
    for step in range(args.steps):
        faults(rank, step)
        x = torch.randn(16, 8, generator=generator)
        loss = torch.nn.functional.mse_loss(model(x), x.sum(dim=1, keepdim=True))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"rank {rank} step {step} loss {loss.item():.4f}", flush=True)
    dist.destroy_process_group()
    if rank == 0:
        print("training finished", flush=True)


def work(rank, port):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = port
    dist.init_process_group("gloo", rank=rank, world_size=2)
    train(rank)


def lightning_main():
    import lightning as L

    class Model(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(8, 1)

        def training_step(self, batch, step):
            faults(self.global_rank, step)
            (x,) = batch
            loss = torch.nn.functional.mse_loss(self.layer(x), x.sum(dim=1, keepdim=True))
            print(f"rank {self.global_rank} step {step} loss {loss.item():.4f}", flush=True)
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.05)

    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(64, 8)), batch_size=4)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_steps=args.steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=os.environ.get("TMPDIR", "/tmp"),
    )
    trainer.fit(Model(), data)
    if trainer.global_rank == 0:
        print("training finished", flush=True)


if __name__ == "__main__":
    if args.launcher == "env":
        dist.init_process_group("gloo")
        train(int(os.environ["RANK"]))
    elif args.launcher == "spawn":
        torch.multiprocessing.spawn(work, args=(os.environ.get("PET_MASTER_PORT", "29500"),), nprocs=2)
    else:
        lightning_main()
